/* driver_jit.c - the GPU device's compiler in liballoy (driver_jit.h): NVRTC loaded at run time, modules compiled through the kernel cache. */
#include <stdlib.h>
#include <string.h>

#include "codegen/cache.h"
#include "codegen/nvrtc.h"
#include "runtime/cuda/driver_jit.h"

/* Kernels kept in memory by the process's cache (the disk holds the rest). */
#define DRV_MEM_CACHE (64u << 20)
#define DRV_DISK_CACHE (1ull << 30)

struct drv_jit {
    cg_nvrtc *nv;
    cg_cache *cache; /* NULL: no cache */
    char dump_dir[OPT_PATH_MAX + 1];
    int nthreads;
};

void drv_jit_close(drv_jit *j)
{
    if (!j) return;
    if (j->cache) cg_cache_close(j->cache);
    if (j->nv) cg_nvrtc_close(j->nv);
    al_free(j);
}

alloy_status drv_jit_open(const al_options *cfg, int nthreads, drv_jit **out, char *err, size_t errlen)
{
    *out = NULL;
    char dir[OPT_PATH_MAX + 16] = "", msg[512];
    if (cfg->cache) {
        alloy_status st = cg_cache_default_dir(cfg->cache_dir, getenv("XDG_CACHE_HOME"), getenv("HOME"), dir, sizeof dir);
        if (st == ALLOY_ERR_INVALID) {
            al_fmt(err, errlen, "cuda: the kernel cache directory is longer than %zu bytes", sizeof dir - 1);
            return st;
        }
    }
    drv_jit *j = al_calloc(1, sizeof *j);
    if (!j) {
        al_fmt(err, errlen, "out of memory opening NVRTC");
        return ALLOY_ERR_OOM;
    }
    j->nthreads = nthreads;
    al_fmt(j->dump_dir, sizeof j->dump_dir, "%s", cfg->dump_dir);
    alloy_status st = cg_nvrtc_open(cfg->nvrtc[0] ? cfg->nvrtc : NULL, &j->nv, msg, sizeof msg);
    if (st) {
        al_fmt(err, errlen, "NVRTC, which compiles alloy's kernels, is not available: %s", msg);
        drv_jit_close(j);
        return st == ALLOY_ERR_OOM ? st : ALLOY_ERR_UNSUPPORTED;
    }
    if (cfg->cache && (st = cg_cache_open(*dir ? dir : NULL, DRV_MEM_CACHE, DRV_DISK_CACHE, &j->cache, msg, sizeof msg))) {
        al_fmt(err, errlen, "the kernel cache: %s", msg);
        drv_jit_close(j);
        return st;
    }
    *out = j;
    return ALLOY_OK;
}

alloy_status drv_jit_compile(drv_jit *j, int sm, int n, const char *const *names, const char *const *sources,
                             drv_jit_image *out, char *err, size_t errlen)
{
    cg_kernel_src *ks = al_calloc((size_t)n + 1, sizeof *ks);
    cg_binary *bins = al_calloc((size_t)n + 1, sizeof *bins);
    if (!ks || !bins) {
        al_free(ks), al_free(bins);
        al_fmt(err, errlen, "out of memory compiling %d modules", n);
        return ALLOY_ERR_OOM;
    }
    for (int i = 0; i < n; i++) ks[i] = (cg_kernel_src){.name = names[i], .source = sources[i], .sm = sm};
    const char *dump = j->dump_dir[0] ? j->dump_dir : NULL;
    alloy_status st = j->cache ? cg_cache_compile_many(j->cache, j->nv, ks, n, j->nthreads, dump, bins)
                               : cg_nvrtc_compile_many(j->nv, ks, n, j->nthreads, dump, bins);
    for (int i = 0; i < n; i++) {
        if (bins[i].status) {
            if (!st) st = bins[i].status;
            al_fmt(err, errlen, "module %s for sm_%d: %s", names[i], sm, bins[i].message ? bins[i].message : "failed to compile");
            break;
        }
        out[i] = (drv_jit_image){al_malloc(bins[i].size), bins[i].size, bins[i].kind != CG_CUBIN, bins[i].arch};
        if (!out[i].data) {
            al_fmt(err, errlen, "out of memory keeping module %s", names[i]);
            st = ALLOY_ERR_OOM;
            break;
        }
        memcpy(out[i].data, bins[i].data, bins[i].size);
    }
    if (st) drv_jit_images_free(out, n);
    for (int i = 0; i < n; i++) cg_binary_free(&bins[i]);
    al_free(ks), al_free(bins);
    return st;
}

void drv_jit_images_free(drv_jit_image *images, int n)
{
    for (int i = 0; i < n; i++) {
        al_free(images[i].data);
        images[i].data = NULL;
    }
}

void drv_jit_describe(const drv_jit *j, char *out, size_t len)
{
    int major, minor;
    cg_nvrtc_version(j->nv, &major, &minor);
    al_fmt(out, len, ", NVRTC %d.%d", major, minor);
}
