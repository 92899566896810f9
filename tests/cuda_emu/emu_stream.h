/* emu_stream.h - the emulated device's stream as the libraries on it see it (the cudaStream_t the emulated NCCL is handed): work queued in stream order, run at once or recorded while the step is captured. */
#ifndef ALLOY_EMU_STREAM_H
#define ALLOY_EMU_STREAM_H

#include <stddef.h>
#include <stdint.h>

#define EMU_STREAM_MAGIC 0x656d7573u /* "emus" */

typedef struct emu_stream {
    uint32_t magic; /* EMU_STREAM_MAGIC: what the emulated NCCL checks a stream by */
    /* Queues fn(arg) in stream order: runs it now, or, while the stream is
     * captured, records it (arg's bytes copied) to run at each replay.
     * 0, or -1 when it could not be queued (out of memory). */
    int (*enqueue)(struct emu_stream *s, void (*fn)(void *arg), const void *arg, size_t bytes);
} emu_stream;

#endif
