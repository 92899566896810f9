/* driver_jit_none.c - driver_jit.h in liballoy-runtime: no NVRTC and no kernel cache; the GPU loads a bundle's images only (driver_jit.c is the full library's). */
#include "runtime/cuda/driver_jit.h"

alloy_status drv_jit_open(const al_options *cfg, int nthreads, drv_jit **out, char *err, size_t errlen)
{
    (void)cfg, (void)nthreads, (void)err, (void)errlen;
    *out = NULL;
    return ALLOY_OK;
}

alloy_status drv_jit_compile(drv_jit *j, int sm, int n, const char *const *names, const char *const *sources,
                             drv_jit_image *out, char *err, size_t errlen)
{
    (void)j, (void)sm, (void)n, (void)names, (void)sources, (void)out;
    al_fmt(err, errlen, "liballoy-runtime compiles no kernels (it has no NVRTC): it runs a bundle's cubins and PTX");
    return ALLOY_ERR_UNSUPPORTED;
}

void drv_jit_images_free(drv_jit_image *images, int n) { (void)images, (void)n; }

void drv_jit_describe(const drv_jit *j, char *out, size_t len)
{
    (void)j;
    if (len) out[0] = '\0';
}

void drv_jit_close(drv_jit *j) { (void)j; }
