/* checksum.h - CRC-32 (zlib's) and the checksum of a set of tensors that alloy writes into its checkpoints. */
#ifndef ALLOY_IO_CHECKSUM_H
#define ALLOY_IO_CHECKSUM_H

#include "base/base.h"

/* The metadata key of a checkpoint's checksum and its value's length:
 * "crc32:" and 8 lowercase hex digits, NUL. */
#define IO_CHECKSUM_KEY "alloy.checksum"
#define IO_CHECKSUM_LEN 15

/* A running CRC-32 (the polynomial of zlib, gzip and PNG: Python's
 * zlib.crc32 gives the same value), eight bytes at a time. */
typedef struct io_crc {
    uint32_t table[8][256];
    uint32_t crc;
} io_crc;

AL_HIDDEN void io_crc_init(io_crc *c);
AL_HIDDEN void io_crc_add(io_crc *c, const void *p, size_t n);
AL_HIDDEN uint32_t io_crc_value(const io_crc *c);

/* The checksum of n tensors as "crc32:xxxxxxxx" into out: the CRC-32 of,
 * for each tensor in the byte order of the names, its name, a NUL byte, its
 * dtype as safetensors spells it ("F32"), a NUL, its dims in decimal joined
 * by "," ("" for a scalar), a NUL, then its data bytes. It depends on names,
 * dtypes, shapes and values only, not on the order or the offsets in a
 * file. ALLOY_ERR_OOM when the name order cannot be allocated. */
AL_HIDDEN alloy_status io_tensors_checksum(const alloy_host_tensor *const *tensors, int n,
                                           char out[IO_CHECKSUM_LEN]);

#endif
