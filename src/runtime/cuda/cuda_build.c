/* cuda_build.c - building a CUDA executable: its kernels emitted and compiled (or a bundle's images loaded), the launch plan, the GEMMs prepared, the arena allocated; and freeing it. */
#include <string.h>

#include "runtime/cuda/cuda_exec.h"
#include "runtime/cuda/cuda_jit.h"

/* Frees e, its modules, GEMMs, graph, events and device memory (NULL: nothing). */
void cu_exec_free(rt_backend *b, rt_exec *e)
{
    if (!e) return;
    cdev *dev = cu_device_of(b);
    if (e->graph) dev->ops->graph_free(dev, e->graph);
    for (int i = 0; e->gemm && i < e->lp.ngemms; i++)
        if (e->gemm[i]) dev->ops->gemm_free(dev, e->gemm[i]);
    for (int i = 0; e->modules && i < e->nmodules; i++)
        if (e->modules[i]) dev->ops->unload(dev, e->modules[i]);
    cu_dev_release(b, e->staging, e->staging_bytes);
    cu_dev_release(b, e->arena, e->lp.arena_bytes);
    cu_dev_release(b, e->aux, e->lp.aux_bytes);
    for (int i = 0; e->events && i < 2 * e->lp.nactions; i++)
        if (e->events[i]) dev->ops->event_free(dev, e->events[i]);
    al_free(e->events);
    cuda_jit_free(&e->jit);
    lp_free(&e->lp);
    al_free(e->modules), al_free(e->fn), al_free(e->gemm), al_free(e->gemm_run_len);
    al_free(e->leaf), al_free(e->captured);
    al_free(e->argval), al_free(e->argv), al_free(e->staged), al_free(e->staged_at);
    al_free(e);
}

/* Loads every module of the bundle's CUDA executable x from its image:
 * on a GPU the one bundle_cuda_pick chooses (cubin, else PTX), on a device
 * with its own image kind (the tests' emulation) that kind; no compiler
 * runs. Then finds each kernel of the table in its module. */
static alloy_status load_images(rt_backend *b, rt_exec *e, const bundle_cuda *x)
{
    cdev *dev = cu_device_of(b);
    if (!dev->ops->load_image)
        return rt_fail(b, ALLOY_ERR_UNSUPPORTED, "cuda: the device %s cannot load a bundle's images", dev->name);
    e->nmodules = (int)x->nmodules;
    e->modules = al_calloc((size_t)e->nmodules + 1, sizeof *e->modules);
    if (!e->modules) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory loading the bundle's modules");
    alloy_status st = ALLOY_OK;
    for (uint32_t m = 0; !st && m < x->nmodules; m++) {
        const bundle_image *im = NULL;
        char why[768];
        if (dev->image_kind) {
            if (!(im = bundle_cuda_image_of_kind(x, m, dev->image_kind))) {
                char targets[512];
                bundle_cuda_targets(x, targets, sizeof targets);
                return rt_fail(b, ALLOY_ERR_UNSUPPORTED, "cuda: %s loads only its own images (kind %u); the bundle has %s",
                               dev->name, dev->image_kind, targets);
            }
        } else if ((st = bundle_cuda_pick(x, m, dev->sm, dev->driver, &im, why, sizeof why))) {
            return rt_fail(b, st, "cuda: %s", why);
        }
        char name[32];
        al_fmt(name, sizeof name, "alloy_m%u", m);
        if ((st = dev->ops->load_image(dev, name, im->kind, im->data, im->size, &e->modules[m])))
            cu_dev_fail(b, st, "loading the bundle's kernels");
    }
    for (int q = 0; !st && q < e->prog->nkernels; q++)
        if ((st = dev->ops->function(dev, e->modules[x->module_of[q]], e->prog->kernels[q].name, &e->fn[q])))
            cu_dev_fail(b, st, "finding a kernel of the bundle");
    return st;
}

/* The pointer-array GEMMs' arrays of matrix addresses, written into the
 * aux block once the arena and aux block are allocated: their addresses
 * stay for the executable's life (a captured graph replays the same). */
static alloy_status upload_pointers(rt_backend *b, rt_exec *e)
{
    cdev *dev = cu_device_of(b);
    for (int i = 0; i < e->lp.ngemms; i++) {
        const lp_gemm *gm = &e->lp.gemms[i];
        if (!gm->pointers) continue;
        alloy_status st = ALLOY_OK;
        uint64_t *ptrs = al_malloc(sizeof *ptrs * (size_t)(3 * gm->batch));
        if (!ptrs) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory for a GEMM's pointer arrays");
        uint64_t pa = cu_address(b, e, &gm->a, 1, &st), pb = cu_address(b, e, &gm->b, 1, &st), pd = cu_address(b, e, &gm->out, 1, &st);
        if (!st) {
            lp_gemm_pointers(&e->lp, gm, pa, pb, pd, ptrs);
            if ((st = dev->ops->upload(dev, e->aux + (cdev_ptr)gm->ptr_at.offset, ptrs, sizeof *ptrs * (size_t)(3 * gm->batch))))
                cu_dev_fail(b, st, "a GEMM's pointer arrays");
        }
        al_free(ptrs);
        if (st) return st;
    }
    return ALLOY_OK;
}

/* GEMM i of e's plan prepared on the device; a pointer-array GEMM for which
 * the library has no algorithm as runs of strided batches instead
 * (lp_gemm_runs: one call per run, for a [b][h] view one per b), else an
 * error naming the matmul, its step and both forms. */
static alloy_status prepare_gemm(rt_backend *b, rt_exec *e, int i)
{
    cdev *dev = cu_device_of(b);
    const lp_gemm *gm = &e->lp.gemms[i];
    int align[3] = {lp_gemm_alignment(&e->lp, gm, 0), lp_gemm_alignment(&e->lp, gm, 1), lp_gemm_alignment(&e->lp, gm, 2)};
    alloy_status st = dev->ops->gemm_prepare(dev, gm, align, &e->gemm[i]);
    char label[64], what[1024 + 192];
    al_fmt(what, sizeof what, "the GEMM of matmul %s (step %d)", ir_node_label(e->g->nodes[gm->node], label, sizeof label),
           gm->step);
    if (st == ALLOY_ERR_UNSUPPORTED && gm->pointers) {
        lp_gemm each;
        int64_t len = lp_gemm_runs(&e->lp, gm, &each);
        char first[sizeof dev->error];
        al_fmt(first, sizeof first, "%s", dev->error);
        if (!(st = dev->ops->gemm_prepare(dev, &each, align, &e->gemm[i]))) {
            e->gemm_run_len[i] = len;
            return ALLOY_OK;
        }
        size_t n = strlen(what);
        al_fmt(what + n, sizeof what - n, ": %s; as %lld strided calls of %lld", first, (long long)(gm->batch / len),
               (long long)len);
    }
    return st ? cu_dev_fail(b, st, what) : ALLOY_OK;
}

/* An executable for schedule s of g with plan p: its kernels emitted and
 * compiled now (x NULL: cuda_jit.h, the full library's) or a bundle's
 * kernel table and images (x, which outlives the executable: no emitter,
 * no compiler); the launch plan built from the kernels (lp_build), the
 * GEMMs prepared, the arena allocated. */
alloy_status cu_build(rt_backend *b, const ir_graph *g, const schedule *s, const mem_plan *p, const bundle_cuda *x,
                      rt_exec **out)
{
    *out = NULL;
    cdev *dev = cu_device_of(b);
    rt_exec *e = al_calloc(1, sizeof *e);
    if (!e) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory compiling graph '%s'", g->name);
    e->g = g, e->s = s, e->p = p;
    e->prog = x ? &x->prog : &e->jit;
    char err[1024];
    alloy_status st = x ? ALLOY_OK : cuda_jit_make_kernels(b, g, s, &e->jit);
    if (!st && (st = lp_build(g, s, p, e->prog, &e->lp, err, sizeof err)))
        rt_fail(b, st, "cuda: graph '%s': %s", g->name, err);
    if (!st) st = cu_collectives_ready(b, e);
    if (!st) {
        e->leaf = al_calloc((size_t)g->nnodes + 1, sizeof *e->leaf);
        e->captured = al_calloc((size_t)g->nnodes + 1, sizeof *e->captured);
        e->gemm = al_calloc((size_t)e->lp.ngemms + 1, sizeof *e->gemm);
        e->gemm_run_len = al_calloc((size_t)e->lp.ngemms + 1, sizeof *e->gemm_run_len);
        e->fn = al_calloc((size_t)e->prog->nkernels + 1, sizeof *e->fn);
        for (int q = 0; q < e->prog->nkernels; q++)
            if (e->prog->kernels[q].nparams > e->maxparams) e->maxparams = e->prog->kernels[q].nparams;
        e->argval = al_calloc((size_t)e->maxparams + 1, sizeof *e->argval);
        e->argv = al_calloc((size_t)e->maxparams + 1, sizeof *e->argv);
        if (!e->leaf || !e->captured || !e->gemm || !e->gemm_run_len || !e->fn || !e->argval || !e->argv)
            st = rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory compiling graph '%s'", g->name);
    }
    if (!st) st = x ? load_images(b, e, x) : cuda_jit_load(b, dev, &e->jit, &e->modules, &e->nmodules, e->fn);
    for (int i = 0; !st && i < e->lp.ngemms; i++) st = prepare_gemm(b, e, i);
    if (!st && e->lp.arena_bytes && (st = cu_dev_alloc(b, e->lp.arena_bytes, &e->arena)))
        cu_dev_fail(b, st, "the step's arena");
    if (!st && e->lp.aux_bytes && (st = cu_dev_alloc(b, e->lp.aux_bytes, &e->aux)))
        cu_dev_fail(b, st, "the step's flags and partial sums");
    if (!st && e->lp.counter_bytes &&
        (st = dev->ops->zero(dev, e->aux + (cdev_ptr)(e->lp.checks_bytes + e->lp.kept_bytes), e->lp.counter_bytes)))
        cu_dev_fail(b, st, "zeroing the reductions' block counters");
    if (!st && e->lp.ptr_bytes) st = upload_pointers(b, e);
    if (st) {
        cu_exec_free(b, e);
        return st;
    }
    *out = e;
    return ALLOY_OK;
}
