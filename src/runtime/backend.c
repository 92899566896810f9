/* backend.c - the backend registry: which backends this build has, and opening the one the options ask for. */
#include <stdio.h>
#include <string.h>

#include "alloy_config.h"
#include "runtime/backend.h"
#include "runtime/cpu/cpu_backend.h"
/* liballoy-runtime has the CUDA backend too: it runs a bundle's images
 * (its compiler half is cuda_jit_none.c there) */
#if ALLOY_HAVE_CUDA
#define WITH_CUDA 1
#include "runtime/cuda/cuda_backend.h"
#else
#define WITH_CUDA 0
#endif

typedef struct backend_entry {
    const char *name;
    alloy_status (*open)(const al_options *cfg, rt_backend **out, char *err, size_t errlen);
} backend_entry;

#if WITH_CUDA
/* The CUDA backend's opener: the GPU's, unless a test put another device under it. */
static rt_backend_opener cuda_opener = cuda_backend_open;

static alloy_status open_cuda(const al_options *cfg, rt_backend **out, char *err, size_t errlen)
{
    return cuda_opener(cfg, out, err, errlen);
}
#endif

/* In order of preference for device=auto. */
static const backend_entry backends[] = {
#if WITH_CUDA
    {"cuda", open_cuda},
#endif
    {"cpu", cpu_backend_open},
};
enum { NBACKENDS = sizeof backends / sizeof backends[0] };

int rt_backend_count(void) { return NBACKENDS; }

const char *rt_backend_name(int i) { return i >= 0 && i < NBACKENDS ? backends[i].name : NULL; }

alloy_status rt_backend_open_at(int i, const al_options *cfg, rt_backend **out, char *err, size_t errlen)
{
    *out = NULL;
    if (i < 0 || i >= NBACKENDS) {
        al_fmt(err, errlen, "no backend %d", i);
        return ALLOY_ERR_INVALID;
    }
    return backends[i].open(cfg, out, err, errlen);
}

alloy_status rt_backend_open_named(const char *name, const al_options *cfg, rt_backend **out, char *err,
                                   size_t errlen)
{
    *out = NULL;
    for (int i = 0; i < NBACKENDS; i++)
        if (strcmp(name, backends[i].name) == 0) return backends[i].open(cfg, out, err, errlen);
    al_fmt(err, errlen, "device %s: this build of alloy has no %s backend", name, name);
    return ALLOY_ERR_UNSUPPORTED;
}

alloy_status rt_backend_open(const al_options *cfg, rt_backend **out, char *err, size_t errlen)
{
    *out = NULL;
    const char *want = cfg->device == OPT_DEVICE_CUDA ? "cuda" : cfg->device == OPT_DEVICE_CPU ? "cpu" : NULL;
    char skipped[512] = "";
    for (int i = 0; i < NBACKENDS; i++) {
        if (want && strcmp(want, backends[i].name) != 0) continue;
        alloy_status st = backends[i].open(cfg, out, err, errlen);
        if (!st && skipped[0]) al_fmt((*out)->note, sizeof (*out)->note, "%s", skipped);
        if (st != ALLOY_ERR_UNSUPPORTED || want) return st; /* auto: try the next one only when this one cannot run here */
        if (!skipped[0]) al_fmt(skipped, sizeof skipped, "%s unavailable: %s", backends[i].name, err);
    }
    if (want) al_fmt(err, errlen, "device %s: this build of alloy has no %s backend", want, want);
    else al_fmt(err, errlen, "no backend could be opened");
    return ALLOY_ERR_UNSUPPORTED;
}

rt_backend_opener rt_backend_set_cuda_opener(rt_backend_opener opener)
{
#if WITH_CUDA
    rt_backend_opener old = cuda_opener;
    cuda_opener = opener ? opener : cuda_backend_open;
    return old;
#else
    (void)opener;
    return NULL;
#endif
}
