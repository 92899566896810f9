/* driver_jit.h - the GPU device's compiler: generated modules compiled by NVRTC through the kernel cache. liballoy has it (driver_jit.c); liballoy-runtime, which loads a bundle's cubins and PTX only, has driver_jit_none.c: no NVRTC is opened or linked. */
#ifndef ALLOY_DRIVER_JIT_H
#define ALLOY_DRIVER_JIT_H

#include <stdbool.h>
#include <stddef.h>

#include "step/options.h"

typedef struct drv_jit drv_jit;

/* One compiled module: a cubin, or PTX (NUL-terminated) for compute_<arch>. */
typedef struct drv_jit_image {
    void *data;
    size_t size;
    bool ptx;
    int arch;
} drv_jit_image;

/* NVRTC (cfg's path, else the default) and the kernel cache (cfg's); *out
 * NULL and ALLOY_OK where this library compiles nothing (liballoy-runtime).
 * ALLOY_ERR_UNSUPPORTED with err when NVRTC is missing. nthreads compile in parallel. */
AL_HIDDEN alloy_status drv_jit_open(const al_options *cfg, int nthreads, drv_jit **out, char *err, size_t errlen);
/* Compiles the n modules (names, sources) for sm_<sm> into out[0..n);
 * an error with err naming the module. */
AL_HIDDEN alloy_status drv_jit_compile(drv_jit *j, int sm, int n, const char *const *names,
                                       const char *const *sources, drv_jit_image *out, char *err, size_t errlen);
AL_HIDDEN void drv_jit_images_free(drv_jit_image *images, int n);
/* " NVRTC 13.0" for the device's name; "" without a compiler. */
AL_HIDDEN void drv_jit_describe(const drv_jit *j, char *out, size_t len);
AL_HIDDEN void drv_jit_close(drv_jit *j);

#endif
