/* cuda_profile.c - the profile of a CUDA step (the profile option): an event before and after each action, and one row per action. */
#include <string.h>

#include "runtime/cuda/cuda_exec.h"

/* The events of a profiled run, made at the first one. */
alloy_status cu_profile_events(rt_backend *b, rt_exec *e)
{
    cdev *dev = cu_device_of(b);
    if (e->events) return ALLOY_OK;
    int n = 2 * e->lp.nactions;
    if (!(e->events = al_calloc((size_t)n + 1, sizeof *e->events)))
        return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory for the profile's events");
    for (int i = 0; i < n; i++) {
        alloy_status st = dev->ops->event_new(dev, &e->events[i]);
        if (st) return cu_dev_fail(b, st, "an event for the profile");
    }
    return ALLOY_OK;
}

/* One row of the profile: action i of the plan, which took us microseconds. */
rt_profile_row cu_profile_row(const rt_exec *e, int i, double us)
{
    const lp_action *a = &e->lp.actions[i];
    rt_profile_row r = {.step = a->step, .us = us};
    r.kind = a->step >= 0 ? sched_kind_name(e->s->steps[a->step].kind) : "update";
    switch (a->kind) {
    case LP_KERNEL: {
        const cg_kernel *kn = &e->prog->kernels[a->index];
        r.action = "kernel", r.bytes = kn->bytes;
        al_fmt(r.name, sizeof r.name, "%s", kn->name);
        break;
    }
    case LP_GEMM: {
        /* the row-major product out[M, N] = a[M, K] b[K, N] is cuBLAS's D[m = N, n = M] */
        const lp_gemm *gm = &e->lp.gemms[a->index];
        int64_t ab = (int64_t)alloy_dtype_size(gm->ab), d = (int64_t)alloy_dtype_size(gm->d);
        r.action = "gemm";
        r.bytes = gm->batch * ((gm->m * gm->k + gm->k * gm->n) * ab + gm->m * gm->n * d);
        if (gm->pointers) r.bytes += 24 * gm->batch; /* the arrays of the matrices' addresses, as the cost model counts */
        r.flops = 2.0 * (double)gm->batch * (double)gm->m * (double)gm->n * (double)gm->k;
        char batch[32] = "";
        if (gm->batch > 1) al_fmt(batch, sizeof batch, "%lldx", (long long)gm->batch);
        al_fmt(r.name, sizeof r.name, "gemm.%s%lldx%lldx%lld.%s", batch, (long long)gm->n, (long long)gm->m,
               (long long)gm->k, alloy_dtype_name(gm->ab));
        break;
    }
    case LP_ZERO:
        r.action = "memset", r.bytes = a->bytes;
        al_fmt(r.name, sizeof r.name, "memset");
        break;
    case LP_COPY:
        r.action = "copy", r.bytes = 2 * a->bytes;
        al_fmt(r.name, sizeof r.name, "copy");
        break;
    case LP_COLLECTIVE:
        r.action = "nccl", r.bytes = 2 * a->bytes;
        al_fmt(r.name, sizeof r.name, "%s %%%d", ir_ops[e->g->nodes[a->index]->op].name, a->index);
        break;
    }
    return r;
}

/* Prints the profile of run `run` from its events (the stream has passed them). */
alloy_status cu_profile_print(rt_backend *b, rt_exec *e, long run, FILE *out)
{
    cdev *dev = cu_device_of(b);
    rt_profile_row *rows = al_calloc((size_t)e->lp.nactions + 1, sizeof *rows);
    if (!rows) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory for the profile");
    alloy_status st = ALLOY_OK;
    for (int i = 0; !st && i < e->lp.nactions; i++) {
        float ms = 0;
        if ((st = dev->ops->event_elapsed(dev, e->events[2 * i], e->events[2 * i + 1], &ms)))
            cu_dev_fail(b, st, "reading the profile's events");
        rows[i] = cu_profile_row(e, i, 1e3 * (double)ms);
    }
    char device[192];
    al_fmt(device, sizeof device, "cuda: %s", dev->name);
    if (!st)
        rt_profile_print(out ? out : stderr, e->g->name, device, "device events around each launch; the step launched directly, not as a CUDA graph",
                         run, rows, e->lp.nactions);
    al_free(rows);
    return st;
}
