/* backend.c - the backend registry: which backends this build has, and opening the one the options ask for. */
#include <stdio.h>
#include <string.h>

#include "runtime/backend.h"

typedef struct backend_entry {
    const char *name;
    alloy_status (*open)(const al_options *cfg, rt_backend **out, char *err, size_t errlen);
} backend_entry;

/* In order of preference for device=auto; the CUDA backend joins first. */
static const backend_entry backends[] = {
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

alloy_status rt_backend_open(const al_options *cfg, rt_backend **out, char *err, size_t errlen)
{
    *out = NULL;
    const char *want = cfg->device == OPT_DEVICE_CUDA ? "cuda" : cfg->device == OPT_DEVICE_CPU ? "cpu" : NULL;
    for (int i = 0; i < NBACKENDS; i++) {
        if (want && strcmp(want, backends[i].name) != 0) continue;
        alloy_status st = backends[i].open(cfg, out, err, errlen);
        if (st != ALLOY_ERR_UNSUPPORTED || want) return st; /* auto: try the next one only when this one cannot run here */
    }
    if (want) al_fmt(err, errlen, "device %s: this build of alloy has no %s backend", want, want);
    else al_fmt(err, errlen, "no backend could be opened");
    return ALLOY_ERR_UNSUPPORTED;
}

void rt_backend_close(rt_backend *b)
{
    if (b) b->ops->close(b);
}

alloy_status rt_fail(rt_backend *b, alloy_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->error, sizeof b->error, fmt, ap);
    va_end(ap);
    return status;
}
