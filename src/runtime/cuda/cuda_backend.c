/* cuda_backend.c - the CUDA backend behind the backend interface: a compiled step is its kernels loaded on a device (emitted and compiled now, or a bundle's images) and its launch plan, replayed each run (captured once and replayed as one graph where the device can). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_collective.h"
#include "runtime/cuda/cuda_jit.h"
#include "runtime/cuda/extents.h"
#include "runtime/profile.h"

struct rt_buffer {
    cdev_ptr ptr;
    size_t bytes;
};

/* The backend: the interface's fields first, then its device. */
typedef struct cuda_backend {
    rt_backend base;
    cdev *dev;
    size_t in_use, peak; /* device bytes allocated through the backend, and the device's own (memory) */
    bool sync_each;      /* ALLOY_CUDA_SYNC=1: every action launched directly and waited for */
    cu_coll *coll;       /* NCCL, loaded by the first step with a collective; its communicator made at its first run */
} cuda_backend;

/* A compiled step: what it runs (not owned), its kernels on the device, its
 * launch plan, its memory, and its captured graph. */
struct rt_exec {
    const ir_graph *g;
    const schedule *s;
    const mem_plan *p;
    const cg_program *prog; /* its kernels: &jit, or a bundle's kernel table */
    cg_program jit;         /* the kernels emitted for it (sources freed once loaded); empty for a bundle's */
    lp_plan lp;
    cdev_module **modules;
    int nmodules;
    cdev_function **fn; /* per kernel */
    cdev_gemm **gemm;   /* per GEMM of the plan */
    int64_t *gemm_run_len; /* per GEMM: 0, or the run length of a pointer-array GEMM called as strided runs (lp_gemm_runs) */
    cdev_ptr arena, aux;
    cdev_ptr *leaf;     /* per node: the address bound to it this run */
    cdev_ptr *captured; /* per node: the address bound when the graph was captured */
    void *graph;
    /* state leaves a run reads back (the step's counters): copied into the
     * staging buffer at the start of the step, before updates written in place change them */
    int *staged;
    int nstaged, staged_cap;
    int64_t *staged_at; /* per staged leaf: its offset in staging */
    cdev_ptr staging;
    size_t staging_bytes;
    uint64_t *argval; /* one kernel's arguments */
    void **argv;
    int maxparams;
    long runs;
    /* the profile option: two events per action (before, after), made at the
     * first profiled run; timing is set while a profiled run queues */
    cdev_event **events;
    bool timing;
    /* data parallel: the collective actions, and the communicator of this run (NULL: one rank, a collective copies) */
    int ncoll, first_coll;
    alloy_comm *comm;
};

static cdev *device_of(rt_backend *b) { return ((cuda_backend *)b)->dev; }

/* Device memory through the backend, counted for memory(). */
static alloy_status dev_alloc(rt_backend *b, size_t bytes, cdev_ptr *out)
{
    cuda_backend *cb = (cuda_backend *)b;
    alloy_status st = cb->dev->ops->alloc(cb->dev, bytes, out);
    if (!st) {
        cb->in_use += bytes;
        if (cb->in_use > cb->peak) cb->peak = cb->in_use;
    }
    return st;
}

static void dev_release(rt_backend *b, cdev_ptr ptr, size_t bytes)
{
    cuda_backend *cb = (cuda_backend *)b;
    if (!ptr) return;
    cb->dev->ops->release(cb->dev, ptr);
    cb->in_use -= bytes;
}

static void memory(const rt_backend *b, size_t *in_use, size_t *peak)
{
    const cuda_backend *cb = (const cuda_backend *)b;
    *in_use = cb->in_use, *peak = cb->peak;
}

static const char *device_name(const rt_backend *b) { return ((const cuda_backend *)b)->dev->name; }

/* The device's last error as the backend's, with status. */
static alloy_status dev_fail(rt_backend *b, alloy_status st, const char *what)
{
    return rt_fail(b, st, "cuda: %s: %s", what, device_of(b)->error);
}

static alloy_status buffer_new(rt_backend *b, size_t bytes, rt_buffer **out)
{
    *out = al_calloc(1, sizeof **out);
    if (!*out) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of host memory for a buffer");
    (*out)->bytes = bytes;
    alloy_status st = bytes ? dev_alloc(b, bytes, &(*out)->ptr) : ALLOY_OK;
    if (st) {
        al_free(*out);
        *out = NULL;
        return dev_fail(b, st, "a buffer");
    }
    return ALLOY_OK;
}

static void buffer_free(rt_backend *b, rt_buffer *buf)
{
    if (!buf) return;
    dev_release(b, buf->ptr, buf->bytes);
    al_free(buf);
}

static alloy_status upload(rt_backend *b, rt_buffer *dst, const void *src, size_t bytes)
{
    if (bytes > dst->bytes)
        return rt_fail(b, ALLOY_ERR_INVALID, "cuda: upload of %zu bytes into a buffer of %zu", bytes, dst->bytes);
    cdev *dev = device_of(b);
    alloy_status st = bytes ? dev->ops->upload(dev, dst->ptr, src, bytes) : ALLOY_OK;
    return st ? dev_fail(b, st, "upload") : ALLOY_OK;
}

static alloy_status download(rt_backend *b, const rt_buffer *src, void *dst, size_t bytes)
{
    if (bytes > src->bytes)
        return rt_fail(b, ALLOY_ERR_INVALID, "cuda: download of %zu bytes from a buffer of %zu", bytes, src->bytes);
    cdev *dev = device_of(b);
    alloy_status st = bytes ? dev->ops->download(dev, dst, src->ptr, bytes) : ALLOY_OK;
    return st ? dev_fail(b, st, "download") : ALLOY_OK;
}

static void exec_free(rt_backend *b, rt_exec *e)
{
    if (!e) return;
    cdev *dev = device_of(b);
    if (e->graph) dev->ops->graph_free(dev, e->graph);
    for (int i = 0; e->gemm && i < e->lp.ngemms; i++)
        if (e->gemm[i]) dev->ops->gemm_free(dev, e->gemm[i]);
    for (int i = 0; e->modules && i < e->nmodules; i++)
        if (e->modules[i]) dev->ops->unload(dev, e->modules[i]);
    dev_release(b, e->staging, e->staging_bytes);
    dev_release(b, e->arena, e->lp.arena_bytes);
    dev_release(b, e->aux, e->lp.aux_bytes);
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
    cdev *dev = device_of(b);
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
            dev_fail(b, st, "loading the bundle's kernels");
    }
    for (int q = 0; !st && q < e->prog->nkernels; q++)
        if ((st = dev->ops->function(dev, e->modules[x->module_of[q]], e->prog->kernels[q].name, &e->fn[q])))
            dev_fail(b, st, "finding a kernel of the bundle");
    return st;
}

/* "step 17 (collective, all_reduce %32)": the step of collective action i. */
static void collective_label(const rt_exec *e, int i, char *out, size_t len)
{
    const lp_action *a = &e->lp.actions[i];
    char label[64];
    const ir_node *n = e->g->nodes[a->index];
    al_fmt(out, len, "step %d (collective, %s %s)", a->step, ir_ops[n->op].name, ir_node_label(n, label, sizeof label));
}

/* The step's collectives counted, and NCCL loaded for them (cfg's nccl)
 * unless the backend has it: a machine or build without NCCL is
 * ALLOY_ERR_UNSUPPORTED naming the first collective's step (device=auto
 * then runs the graph on the CPU, over MPI). */
static alloy_status collectives_ready(rt_backend *b, rt_exec *e)
{
    cuda_backend *cb = (cuda_backend *)b;
    e->first_coll = -1;
    char err[512], where[128];
    for (int i = 0; i < e->lp.nactions; i++) {
        if (e->lp.actions[i].kind != LP_COLLECTIVE) continue;
        if (e->ncoll++ == 0) e->first_coll = i;
        if (!cu_coll_has(e->g->nodes[e->lp.actions[i].index]->op)) { /* ZeRO-1's reduce_scatter, all_gather */
            collective_label(e, i, where, sizeof where);
            return rt_fail(b, ALLOY_ERR_UNSUPPORTED, "cuda: %s: not built on the CUDA backend, whose collectives are "
                           "all_reduce only (ZeRO-1 runs on the CPU backend)", where);
        }
    }
    if (!e->ncoll || cb->coll) return ALLOY_OK;
    collective_label(e, e->first_coll, where, sizeof where);
    alloy_status st = cu_coll_open(b->cfg.nccl, &cb->coll, err, sizeof err);
    return st ? rt_fail(b, st, "cuda: %s: %s", where, err) : ALLOY_OK;
}

static cdev_ptr address(rt_backend *b, rt_exec *e, const lp_place *pl, int64_t bytes, alloy_status *st);

/* The pointer-array GEMMs' arrays of matrix addresses, written into the
 * aux block once the arena and aux block are allocated: their addresses
 * stay for the executable's life (a captured graph replays the same). */
static alloy_status upload_pointers(rt_backend *b, rt_exec *e)
{
    cdev *dev = device_of(b);
    for (int i = 0; i < e->lp.ngemms; i++) {
        const lp_gemm *gm = &e->lp.gemms[i];
        if (!gm->pointers) continue;
        alloy_status st = ALLOY_OK;
        uint64_t *ptrs = al_malloc(sizeof *ptrs * (size_t)(3 * gm->batch));
        if (!ptrs) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory for a GEMM's pointer arrays");
        uint64_t pa = address(b, e, &gm->a, 1, &st), pb = address(b, e, &gm->b, 1, &st), pd = address(b, e, &gm->out, 1, &st);
        if (!st) {
            lp_gemm_pointers(&e->lp, gm, pa, pb, pd, ptrs);
            if ((st = dev->ops->upload(dev, e->aux + (cdev_ptr)gm->ptr_at.offset, ptrs, sizeof *ptrs * (size_t)(3 * gm->batch))))
                dev_fail(b, st, "a GEMM's pointer arrays");
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
    cdev *dev = device_of(b);
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
    return st ? dev_fail(b, st, what) : ALLOY_OK;
}

/* An executable for schedule s of g with plan p: its kernels emitted and
 * compiled now (x NULL: cuda_jit.h, the full library's) or a bundle's
 * kernel table and images (x, which outlives the executable: no emitter,
 * no compiler); the launch plan built from the kernels (lp_build), the
 * GEMMs prepared, the arena allocated. */
static alloy_status build(rt_backend *b, const ir_graph *g, const schedule *s, const mem_plan *p, const bundle_cuda *x,
                          rt_exec **out)
{
    *out = NULL;
    cdev *dev = device_of(b);
    rt_exec *e = al_calloc(1, sizeof *e);
    if (!e) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory compiling graph '%s'", g->name);
    e->g = g, e->s = s, e->p = p;
    e->prog = x ? &x->prog : &e->jit;
    char err[1024];
    alloy_status st = x ? ALLOY_OK : cuda_jit_make_kernels(b, g, s, &e->jit);
    if (!st && (st = lp_build(g, s, p, e->prog, &e->lp, err, sizeof err)))
        rt_fail(b, st, "cuda: graph '%s': %s", g->name, err);
    if (!st) st = collectives_ready(b, e);
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
    if (!st && e->lp.arena_bytes && (st = dev_alloc(b, e->lp.arena_bytes, &e->arena)))
        dev_fail(b, st, "the step's arena");
    if (!st && e->lp.aux_bytes && (st = dev_alloc(b, e->lp.aux_bytes, &e->aux)))
        dev_fail(b, st, "the step's flags and partial sums");
    if (!st && e->lp.counter_bytes &&
        (st = dev->ops->zero(dev, e->aux + (cdev_ptr)(e->lp.checks_bytes + e->lp.kept_bytes), e->lp.counter_bytes)))
        dev_fail(b, st, "zeroing the reductions' block counters");
    if (!st && e->lp.ptr_bytes) st = upload_pointers(b, e);
    if (st) {
        exec_free(b, e);
        return st;
    }
    *out = e;
    return ALLOY_OK;
}

/* The device address of place pl this run; 0 with an error when a leaf it
 * names is not bound. An empty leaf may be unbound (rt_run_args): its
 * address is 0, which a kernel over no element never reads. */
static cdev_ptr address(rt_backend *b, rt_exec *e, const lp_place *pl, int64_t bytes, alloy_status *st)
{
    switch (pl->space) {
    case LP_ARENA: return e->arena + (cdev_ptr)pl->offset;
    case LP_AUX: return e->aux + (cdev_ptr)pl->offset;
    case LP_LEAF:
        if (e->leaf[pl->node] || !bytes || !ir_nbytes(&e->g->nodes[pl->node]->type))
            return e->leaf[pl->node] + (cdev_ptr)pl->offset;
        break;
    }
    char label[64];
    const ir_node *n = e->g->nodes[pl->node];
    *st = rt_fail(b, ALLOY_ERR_NOT_FOUND, "cuda: %s %s has no buffer bound", ir_ops[n->op].name,
                  ir_node_label(n, label, sizeof label));
    return 0;
}

static rt_profile_row profile_row(const rt_exec *e, int i, double us);

/* "step 3 (row), action 7 of 40: kernel k_row_3 <<<64, 256>>>" for action i of the plan. */
static void describe_action(const rt_exec *e, int i, char *out, size_t len)
{
    const lp_action *a = &e->lp.actions[i];
    rt_profile_row r = profile_row(e, i, 0);
    char shape[48] = "";
    if (a->kind == LP_KERNEL) {
        const cg_kernel *kn = &e->prog->kernels[a->index];
        al_fmt(shape, sizeof shape, " <<<%u, %u>>>", kn->grid, kn->block);
    }
    al_fmt(out, len, "step %d (%s), action %d of %d: %s %s%s", r.step, r.kind, i + 1, e->lp.nactions, r.action, r.name,
           shape);
}

/* After action i under ALLOY_CUDA_SYNC: waits for the device, and a fault names the action. */
static alloy_status sync_action(rt_backend *b, rt_exec *e, int i)
{
    cdev *dev = device_of(b);
    alloy_status st = dev->ops->sync(dev);
    if (!st) return ALLOY_OK;
    char what[256];
    describe_action(e, i, what, sizeof what);
    return rt_fail(b, st, "cuda: %s failed on the device (ALLOY_CUDA_SYNC): %s", what, dev->error);
}

/* On a checking device: the extents action a touches, told to the device before it is queued. */
static void describe_extents(rt_exec *e, cdev *dev, const lp_action *a)
{
    int max = e->maxparams + 5; /* a GEMM: A, B, D, a bias and the pointer arrays */
    cdev_extent *ext = al_malloc(sizeof *ext * (size_t)max);
    int n = ext ? cu_action_extents(e->g, e->s, e->p, &e->lp, e->prog, a, (cu_bases){e->arena, e->aux, e->leaf}, ext, max) : 0;
    dev->ops->describe(dev, ext, n); /* none (out of memory): the device checks the action against nothing */
    al_free(ext);
}

/* Queues actions [from, to) of the launch plan on the device. */
static alloy_status enqueue(rt_backend *b, rt_exec *e, int from, int to)
{
    cdev *dev = device_of(b);
    alloy_status st = ALLOY_OK;
    for (int i = from; !st && i < to; i++) {
        const lp_action *a = &e->lp.actions[i];
        if (dev->ops->describe) describe_extents(e, dev, a);
        if (e->timing && (st = dev->ops->event_record(dev, e->events[2 * i]))) return dev_fail(b, st, "profiling");
        switch (a->kind) {
        case LP_KERNEL: {
            const cg_kernel *kn = &e->prog->kernels[a->index];
            const lp_place *args = &e->lp.args[e->lp.first_arg[a->index]];
            for (int p = 0; !st && p < kn->nparams; p++) {
                e->argval[p] = address(b, e, &args[p], 1, &st);
                e->argv[p] = &e->argval[p];
            }
            if (!st && (st = dev->ops->launch(dev, e->fn[a->index], kn->grid, kn->block, e->argv, kn->nparams))) {
                char what[256];
                describe_action(e, i, what, sizeof what);
                dev_fail(b, st, what);
            }
            break;
        }
        case LP_GEMM: {
            const lp_gemm *gm = &e->lp.gemms[a->index];
            /* len: strided runs in place of the pointer arrays (prepare_gemm), a call each from the places */
            int64_t len = e->gemm_run_len[a->index], calls = len ? gm->batch / len : 1;
            cdev_ptr pa = address(b, e, &gm->a, 1, &st), pb = address(b, e, &gm->b, 1, &st),
                     pd = address(b, e, &gm->out, 1, &st);
            if (gm->pointers && !len) { /* the arrays of the batch's addresses (upload_pointers) */
                cdev_ptr arrays = e->aux + (cdev_ptr)gm->ptr_at.offset, each = (cdev_ptr)(8 * gm->batch);
                pa = arrays, pb = arrays + each, pd = arrays + 2 * each;
            }
            cdev_ptr pbias = gm->epilogue == LP_EPILOGUE_BIAS ? address(b, e, &gm->bias, 1, &st) : 0;
            for (int64_t r = 0; !st && r < calls; r++) {
                int64_t at[3] = {0, 0, 0};
                if (len) lp_gemm_run_offsets(&e->lp, gm, len, r, at);
                if ((st = dev->ops->gemm(dev, e->gemm[a->index], pa + (cdev_ptr)at[0], pb + (cdev_ptr)at[1],
                                         pd + (cdev_ptr)at[2], pbias))) {
                    char label[64], what[160];
                    al_fmt(what, sizeof what, "GEMM of matmul %s (step %d)",
                           ir_node_label(e->g->nodes[gm->node], label, sizeof label), gm->step);
                    dev_fail(b, st, what);
                }
            }
            break;
        }
        case LP_ZERO: {
            cdev_ptr d = address(b, e, &a->dst, a->bytes, &st);
            if (!st && (st = dev->ops->zero(dev, d, (size_t)a->bytes))) dev_fail(b, st, "memset");
            break;
        }
        case LP_COPY: {
            cdev_ptr d = address(b, e, &a->dst, a->bytes, &st), s = address(b, e, &a->src, a->bytes, &st);
            if (!st && d != s && (st = dev->ops->copy(dev, d, s, (size_t)a->bytes))) dev_fail(b, st, "an update's copy");
            break;
        }
        case LP_COLLECTIVE: { /* the operand into the result, reduced there in place over the ranks */
            cdev_ptr d = address(b, e, &a->dst, a->bytes, &st), s = address(b, e, &a->src, a->bytes, &st);
            if (!st && d != s && a->bytes && (st = dev->ops->copy(dev, d, s, (size_t)a->bytes)))
                dev_fail(b, st, "a collective's operand");
            if (st || !e->comm || !a->bytes) break; /* no communicator: one rank, the copy is the result */
            char err[512], where[128];
            void *stream = dev->ops->stream ? dev->ops->stream(dev) : NULL;
            if ((st = cu_coll_enqueue(((cuda_backend *)b)->coll, e->g->nodes[a->index], d, stream, err, sizeof err))) {
                collective_label(e, i, where, sizeof where);
                rt_fail(b, st, "cuda: %s: %s", where, err);
            }
            break;
        }
        }
        if (!st && e->timing && (st = dev->ops->event_record(dev, e->events[2 * i + 1]))) dev_fail(b, st, "profiling");
        if (!st && ((cuda_backend *)b)->sync_each) st = sync_action(b, e, i);
    }
    return st;
}

/* The events of a profiled run, made at the first one. */
static alloy_status profile_events(rt_backend *b, rt_exec *e)
{
    cdev *dev = device_of(b);
    if (e->events) return ALLOY_OK;
    int n = 2 * e->lp.nactions;
    if (!(e->events = al_calloc((size_t)n + 1, sizeof *e->events)))
        return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory for the profile's events");
    for (int i = 0; i < n; i++) {
        alloy_status st = dev->ops->event_new(dev, &e->events[i]);
        if (st) return dev_fail(b, st, "an event for the profile");
    }
    return ALLOY_OK;
}

/* One row of the profile: action i of the plan, which took us microseconds. */
static rt_profile_row profile_row(const rt_exec *e, int i, double us)
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
static alloy_status profile_print(rt_backend *b, rt_exec *e, long run, FILE *out)
{
    cdev *dev = device_of(b);
    rt_profile_row *rows = al_calloc((size_t)e->lp.nactions + 1, sizeof *rows);
    if (!rows) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory for the profile");
    alloy_status st = ALLOY_OK;
    for (int i = 0; !st && i < e->lp.nactions; i++) {
        float ms = 0;
        if ((st = dev->ops->event_elapsed(dev, e->events[2 * i], e->events[2 * i + 1], &ms)))
            dev_fail(b, st, "reading the profile's events");
        rows[i] = profile_row(e, i, 1e3 * (double)ms);
    }
    char device[192];
    al_fmt(device, sizeof device, "cuda: %s", dev->name);
    if (!st)
        rt_profile_print(out ? out : stderr, e->g->name, device, "device events around each launch; the step launched directly, not as a CUDA graph",
                         run, rows, e->lp.nactions);
    al_free(rows);
    return st;
}

static bool is_state_leaf(const ir_node *n) { return n->op == IR_OP_param || n->op == IR_OP_state; }

/* Where a staged leaf's value was copied in the step; 0 when node is not staged. */
static cdev_ptr staged_copy(const rt_exec *e, int node)
{
    for (int i = 0; i < e->nstaged; i++)
        if (e->staged[i] == node) return e->staging + (cdev_ptr)e->staged_at[i];
    return 0;
}

/* The downloads' state leaves as this run's staging set: false when they
 * are the set the captured graph stages (nothing to change), true when the
 * set changed (the staging buffer is sized for it). */
static alloy_status stage_leaves(rt_backend *b, rt_exec *e, const rt_run_args *args, bool *changed)
{
    int n = 0;
    size_t bytes = 0;
    bool same = true;
    for (int i = 0; i < args->ndownloads; i++) {
        const ir_node *nd = e->g->nodes[args->downloads[i].node];
        if (!is_state_leaf(nd) || !ir_nbytes(&nd->type)) continue;
        same = same && n < e->nstaged && e->staged[n] == nd->id;
        n++;
        bytes += (ir_nbytes(&nd->type) + LP_AUX_ALIGN - 1) / LP_AUX_ALIGN * LP_AUX_ALIGN;
    }
    *changed = !(same && n == e->nstaged);
    if (!*changed) return ALLOY_OK;
    if (n > e->staged_cap) {
        int *st = al_realloc(e->staged, sizeof(int) * (size_t)n);
        if (st) e->staged = st;
        int64_t *at = al_realloc(e->staged_at, sizeof(int64_t) * (size_t)n);
        if (at) e->staged_at = at;
        if (!st || !at) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory staging the step's counters");
        e->staged_cap = n;
    }
    if (bytes > e->staging_bytes) {
        dev_release(b, e->staging, e->staging_bytes);
        e->staging = 0, e->staging_bytes = 0;
        alloy_status st = dev_alloc(b, bytes, &e->staging);
        if (st) return dev_fail(b, st, "staging the step's counters");
        e->staging_bytes = bytes;
    }
    e->nstaged = 0;
    int64_t at = 0;
    for (int i = 0; i < args->ndownloads; i++) {
        const ir_node *nd = e->g->nodes[args->downloads[i].node];
        if (!is_state_leaf(nd) || !ir_nbytes(&nd->type)) continue;
        e->staged[e->nstaged] = nd->id;
        e->staged_at[e->nstaged++] = at;
        at += (int64_t)((ir_nbytes(&nd->type) + LP_AUX_ALIGN - 1) / LP_AUX_ALIGN * LP_AUX_ALIGN);
    }
    return ALLOY_OK;
}

/* Queues the copies of the staged leaves into the staging buffer. */
static alloy_status enqueue_staging(rt_backend *b, rt_exec *e)
{
    cdev *dev = device_of(b);
    alloy_status st = ALLOY_OK;
    for (int i = 0; !st && i < e->nstaged; i++) {
        const ir_node *n = e->g->nodes[e->staged[i]];
        lp_place pl = {LP_LEAF, n->id, 0};
        cdev_ptr src = address(b, e, &pl, (int64_t)ir_nbytes(&n->type), &st);
        if (!st && (st = dev->ops->copy(dev, e->staging + (cdev_ptr)e->staged_at[i], src, ir_nbytes(&n->type))))
            dev_fail(b, st, "staging a counter");
    }
    return st;
}

/* Downloads a value with a padded row stride (sched_pad) at src into dst
 * with its rows dense: the padded block at once, then each row's columns
 * (the padding columns, never written, are left behind). */
static alloy_status download_rows(rt_backend *b, rt_exec *e, int node, cdev_ptr src, void *dst)
{
    cdev *dev = device_of(b);
    const ir_type *t = &e->g->nodes[node]->type;
    size_t size = alloy_dtype_size(t->dtype), c = (size_t)t->dims[t->rank - 1], ld = (size_t)e->s->row_stride[node];
    size_t rows = (size_t)ir_numel(t) / c;
    unsigned char *block = al_malloc(rows * ld * size + 1);
    if (!block) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory downloading %zu padded rows", rows);
    alloy_status st = dev->ops->download(dev, block, src, rows * ld * size);
    if (st) dev_fail(b, st, "downloading a value");
    for (size_t r = 0; !st && r < rows; r++) memcpy((unsigned char *)dst + r * c * size, block + r * ld * size, c * size);
    al_free(block);
    return st;
}

/* Copies downloads to the host: staged leaves from the staging buffer
 * when staged is set, other values from where they live; with leaves set,
 * only the state leaves, else (unstaged) only the rest. */
static alloy_status run_downloads(rt_backend *b, rt_exec *e, const rt_run_args *args, bool staged, bool leaves)
{
    cdev *dev = device_of(b);
    alloy_status st = ALLOY_OK;
    for (int i = 0; !st && i < args->ndownloads; i++) {
        const rt_download *d = &args->downloads[i];
        const ir_node *n = e->g->nodes[d->node];
        size_t bytes = ir_nbytes(&n->type);
        lp_place pl;
        if (!bytes || (!staged && leaves != is_state_leaf(n))) continue;
        if (!lp_place_of(e->g, e->p, d->node, &pl)) {
            char label[64];
            return rt_fail(b, ALLOY_ERR_INVALID, "cuda: the value of %s %s is not kept by this run", ir_ops[n->op].name,
                           ir_node_label(n, label, sizeof label));
        }
        cdev_ptr src = staged && is_state_leaf(n) ? staged_copy(e, d->node) : address(b, e, &pl, (int64_t)bytes, &st);
        if (!st && sched_padded(e->s, d->node)) st = download_rows(b, e, d->node, src, d->dst);
        else if (!st && (st = dev->ops->download(dev, d->dst, src, bytes))) dev_fail(b, st, "downloading a value");
    }
    return st;
}

/* amp_check and amp_stats after the step: the check words (kernels.h) into
 * nonfinite and ranges (either NULL: not read), for the nodes the kernels
 * checked. One download of 16 bytes per node, after the step's own wait. */
static alloy_status read_checks(rt_backend *b, rt_exec *e, uint8_t *nonfinite, rt_range *ranges)
{
    const cg_program *prog = e->prog;
    if (!e->lp.checks_bytes || !prog->covered || (!nonfinite && !ranges)) return ALLOY_OK;
    const ir_graph *g = e->g;
    uint32_t *w = al_malloc(e->lp.checks_bytes);
    if (!w) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory reading the step's checks");
    cdev *dev = device_of(b);
    alloy_status st = dev->ops->download(dev, w, e->aux, e->lp.checks_bytes);
    if (st) {
        al_free(w);
        return dev_fail(b, st, "reading the step's checks");
    }
    for (int i = 0; i < g->nnodes; i++) {
        const uint32_t *at = w + (size_t)i * CG_CHECK_WORDS;
        if (nonfinite && (prog->covered[i] & CG_CHECK_FINITE))
            nonfinite[i] |= (uint8_t)(at[0] & (NONFINITE_INF | NONFINITE_NAN));
        if (ranges && (prog->covered[i] & CG_CHECK_RANGE)) {
            rt_range *r = &ranges[i];
            uint64_t tiny;
            memcpy(&tiny, at + 2, sizeof tiny);
            if (at[1] > r->max_bits) r->max_bits = at[1];
            if (at[0] & CG_RANGE_NAN) r->nan = 1;
            r->tiny += tiny;
            r->count += (uint64_t)ir_numel(&g->nodes[i]->type);
        }
    }
    al_free(w);
    return ALLOY_OK;
}

/* The run's part: the statistics every run (they add up), the flags now
 * unless the caller reads them later (read_flags, on a skipped step). */
static alloy_status run_checks(rt_backend *b, rt_exec *e, const rt_run_args *args)
{
    unsigned checks = e->prog->checks;
    bool flags = args->nonfinite && (checks & CG_CHECK_FINITE), ranges = args->ranges && (checks & CG_CHECK_RANGE);
    bool flags_now = flags && (!args->flags_later || ranges); /* with the statistics: the same download */
    alloy_status st = read_checks(b, e, flags_now ? args->nonfinite : NULL, ranges ? args->ranges : NULL);
    if (!st && flags && args->nonfinite_done) *args->nonfinite_done = true;
    if (!st && ranges && args->ranges_done) *args->ranges_done = true;
    return st;
}

static alloy_status read_flags(rt_backend *b, rt_exec *e, uint8_t *nonfinite)
{
    return read_checks(b, e, nonfinite, NULL);
}

/* Whether the graph captured earlier still runs this call: every leaf at the address it was captured with. */
static bool capture_current(const rt_exec *e)
{
    return e->graph && memcmp(e->leaf, e->captured, sizeof *e->leaf * (size_t)e->g->nnodes) == 0;
}

/* The communicator of the step's collectives over e->comm, made at the
 * first run (collective: every rank's first run makes it), on this
 * device: NCCL's errors name the first collective's step. */
static alloy_status connect_collectives(rt_backend *b, rt_exec *e)
{
    cdev *dev = device_of(b);
    char err[768], where[128];
    if (dev->ops->stream) dev->ops->stream(dev); /* the device's context current: NCCL makes the communicator there */
    alloy_status st = cu_coll_connect(((cuda_backend *)b)->coll, e->comm, dev->ordinal, err, sizeof err);
    if (!st) return ALLOY_OK;
    collective_label(e, e->first_coll, where, sizeof where);
    return rt_fail(b, st, "cuda: %s: making the NCCL communicator (rank %d of %d): %s", where,
                   alloy_comm_rank(e->comm), alloy_comm_size(e->comm), err);
}

/* A step with collectives captured into a CUDA graph: NCCL requires every
 * rank to capture (and re-capture) together, and to replay or launch
 * directly alike. Each rank's wish, {launch directly, capture now}, is
 * reduced by MAX over the ranks (one small MPI all-reduce per run), so
 * one rank's reason (a leaf moved, profiling, ALLOY_CUDA_SYNC) decides
 * for all. A rank made to launch directly drops its captured graph, so
 * the next replay is a fresh capture everywhere. */
static alloy_status agree_on_graphs(rt_backend *b, rt_exec *e, bool *graphs, bool *capture)
{
    int32_t wish[2] = {!*graphs, *graphs && *capture};
    char err[512];
    alloy_status st = comm_all_reduce(e->comm, wish, 2, ALLOY_I32, COMM_MAX, "the CUDA graph decision", err, sizeof err);
    if (st) return rt_fail(b, st, "cuda: agreeing on the step's CUDA graph: %s", err);
    *graphs = !wish[0];
    *capture = wish[1] != 0;
    if (!*graphs && e->graph) {
        device_of(b)->ops->graph_free(device_of(b), e->graph);
        e->graph = NULL;
    }
    return ALLOY_OK;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static alloy_status check_collectives(rt_backend *b, rt_exec *e);

/* The step's collectives queued (all but the update copies after them):
 * waits for the stream while polling NCCL's asynchronous error, until the
 * communicator's timeout, before anything else waits for the stream with
 * no deadline (a download). A peer's failure, or the deadline passed,
 * aborts the communicator (ncclCommAbort) and names the step's
 * collectives. With no timeout, or a device whose stream is done at once
 * (the emulation), it only reads the asynchronous error. */
static alloy_status wait_for_collectives(rt_backend *b, rt_exec *e)
{
    cdev *dev = device_of(b);
    double timeout = comm_timeout_s(e->comm);
    if (!dev->ops->query || timeout <= 0) return check_collectives(b, e);
    char what[192], err[768];
    collective_label(e, e->first_coll, what, sizeof what);
    if (e->ncoll > 1) al_fmt(what + strlen(what), sizeof what - strlen(what), " and %d more collectives", e->ncoll - 1);
    double deadline = now_s() + timeout;
    for (long spins = 0;; spins++) {
        bool done = false;
        alloy_status st = dev->ops->query(dev, &done);
        if (st) return dev_fail(b, st, "the step");
        if (done) return ALLOY_OK;
        if ((st = cu_coll_check(((cuda_backend *)b)->coll, what, err, sizeof err))) return rt_fail(b, st, "cuda: %s", err);
        if (now_s() > deadline) {
            cu_coll_abort(((cuda_backend *)b)->coll);
            return rt_fail(b, ALLOY_ERR_IO, "cuda: %s: did not finish within %g s on rank %d of %d (a peer died or "
                           "skipped it); the NCCL communicator was aborted", what, timeout, alloy_comm_rank(e->comm),
                           alloy_comm_size(e->comm));
        }
        if (spins > 100) nanosleep(&(struct timespec){0, 50000}, NULL);
    }
}

/* NCCL's asynchronous error after the step, naming its collectives. */
static alloy_status check_collectives(rt_backend *b, rt_exec *e)
{
    char what[192], err[768];
    collective_label(e, e->first_coll, what, sizeof what);
    alloy_status st = cu_coll_check(((cuda_backend *)b)->coll, what, err, sizeof err);
    return st ? rt_fail(b, st, "cuda: %s", err) : ALLOY_OK;
}

static alloy_status run(rt_backend *b, rt_exec *e, const rt_run_args *args)
{
    cdev *dev = device_of(b);
    const ir_graph *g = e->g;
    for (int i = 0; i < g->nnodes; i++) {
        const ir_node *n = g->nodes[i];
        bool leaf = n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state;
        e->leaf[i] = leaf && args->leaf[i] ? args->leaf[i]->ptr : 0;
    }
    alloy_status st = ALLOY_OK;
    if (dev->ops->step_begin) dev->ops->step_begin(dev, (cdev_ptr[]){e->arena, e->aux}, 2); /* nothing written yet */
    /* a profiled run launches directly, with an event before and after each action */
    bool profiling = rt_profile_due(b->cfg.profile, e->runs + 1) && dev->ops->event_record;
    if (profiling && (st = profile_events(b, e))) return st;
    /* the first run launches directly (modules and the library settle); later ones replay one capture */
    bool graphs = !profiling && !((cuda_backend *)b)->sync_each && b->cfg.cuda_graph && dev->ops->capture_begin &&
                  e->runs > 0;
    e->comm = e->ncoll ? args->comm : NULL;
    if (e->comm && (st = connect_collectives(b, e))) return st;
    bool capture = false;
    if (graphs) {
        bool changed;
        if ((st = stage_leaves(b, e, args, &changed))) return st;
        capture = changed || !capture_current(e);
    }
    if (e->comm && (st = agree_on_graphs(b, e, &graphs, &capture))) return st;
    if (graphs) {
        if (capture) {
            if (e->graph) dev->ops->graph_free(dev, e->graph);
            e->graph = NULL;
            if ((st = dev->ops->capture_begin(dev))) return dev_fail(b, st, "capturing the step");
            /* leaves staged as the step finds them: updates written in place change them */
            alloy_status qs = enqueue_staging(b, e);
            if (!qs) qs = enqueue(b, e, 0, e->lp.first_update);
            if (!qs) qs = enqueue(b, e, e->lp.first_update, e->lp.nactions);
            void *graph = NULL;
            st = dev->ops->capture_end(dev, &graph);
            if (qs) {
                if (graph) dev->ops->graph_free(dev, graph);
                return qs;
            }
            if (st) return dev_fail(b, st, "capturing the step");
            e->graph = graph;
            memcpy(e->captured, e->leaf, sizeof *e->leaf * (size_t)g->nnodes);
        }
        if ((st = dev->ops->replay(dev, e->graph))) return dev_fail(b, st, "replaying the step");
        if (e->comm) st = wait_for_collectives(b, e); /* before a download waits for the stream, with no deadline */
        if (!st) st = run_downloads(b, e, args, true, true);
    } else {
        e->timing = profiling;
        st = run_downloads(b, e, args, false, true); /* leaves before updates written in place */
        if (!st) st = enqueue(b, e, 0, e->lp.first_update);
        if (!st && e->comm) st = wait_for_collectives(b, e);
        if (!st) st = run_downloads(b, e, args, false, false);
        if (!st) st = enqueue(b, e, e->lp.first_update, e->lp.nactions);
        e->timing = false;
    }
    if (!st && (st = dev->ops->sync(dev))) dev_fail(b, st, "the step");
    if (!st && e->comm) st = check_collectives(b, e);
    if (!st) st = run_checks(b, e, args);
    if (!st && profiling) st = profile_print(b, e, e->runs + 1, args->profile_to);
    if (!st) e->runs++;
    return st;
}

static alloy_status compile(rt_backend *b, const ir_graph *g, const schedule *s, const mem_plan *p, rt_exec **out)
{
    return build(b, g, s, p, NULL, out);
}

/* A bundle's step: from its kernel table and images when it has them (no
 * emitter, no compiler); else (saved without archs, or before the kernel
 * table) compiled as a graph is, which liballoy-runtime refuses. */
static alloy_status exec_load(rt_backend *b, const ir_graph *g, const schedule *s, const mem_plan *p,
                              const bundle_cuda *x, rt_exec **out)
{
    if (x && x->nimages && x->has_kernels) return build(b, g, s, p, x, out);
    return compile(b, g, s, p, out);
}

static void close_backend(rt_backend *b)
{
    cdev *dev = device_of(b);
    cu_coll_close(((cuda_backend *)b)->coll); /* the communicator before its device */
    if (dev) dev->ops->close(dev);
    al_free(b);
}

static bool device_caps(const rt_backend *b, int *sm, int *driver)
{
    const cdev *dev = ((const cuda_backend *)b)->dev;
    *sm = dev->sm, *driver = dev->driver;
    return dev->sm > 0 && !dev->image_kind; /* an emulated device's images are its own */
}

static const rt_backend_ops cuda_ops_table = {
    .name = "cuda",
    .buffer_new = buffer_new,
    .buffer_free = buffer_free,
    .upload = upload,
    .download = download,
    .compile = compile,
    .run = run,
    .exec_free = exec_free,
    .read_flags = read_flags,
    .exec_load = exec_load,
    .close = close_backend,
    .device_caps = device_caps,
    .memory = memory,
    .device_name = device_name,
};

alloy_status cuda_backend_open_on(const al_options *cfg, cdev *dev, rt_backend **out, char *err, size_t errlen)
{
    cuda_backend *cb = al_calloc(1, sizeof *cb);
    *out = NULL;
    if (!cb) {
        dev->ops->close(dev);
        al_fmt(err, errlen, "cuda: out of memory opening the backend");
        return ALLOY_ERR_OOM;
    }
    if (dev->driver && dev->driver < CUDA_MIN_DRIVER) {
        al_fmt(err, errlen,
               "the NVIDIA driver supports CUDA %d.%d; the CUDA backend needs %d.%d or newer (kernel parameter "
               "lists over 4 KB): update the driver",
               dev->driver / 1000, dev->driver % 1000 / 10, CUDA_MIN_DRIVER / 1000, CUDA_MIN_DRIVER % 1000 / 10);
        dev->ops->close(dev);
        al_free(cb);
        return ALLOY_ERR_UNSUPPORTED;
    }
    const char *sync = getenv("ALLOY_CUDA_SYNC");
    cb->sync_each = sync && *sync && strcmp(sync, "0") != 0;
    cb->base.ops = &cuda_ops_table;
    cb->base.cfg = *cfg;
    cb->dev = dev;
    cb->in_use = cb->peak = dev->reserved;
    *out = &cb->base;
    return ALLOY_OK;
}


