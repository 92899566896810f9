/* cuda_enqueue.c - queuing a CUDA step's launch plan on the device: each action's addresses, arguments and launch, checked one by one under ALLOY_CUDA_SYNC. */
#include <string.h>

#include "runtime/cuda/cuda_exec.h"
#include "runtime/cuda/extents.h"

/* The device address of place pl this run; 0 with an error when a leaf it
 * names is not bound. An empty leaf may be unbound (rt_run_args): its
 * address is 0, which a kernel over no element never reads. */
cdev_ptr cu_address(rt_backend *b, rt_exec *e, const lp_place *pl, int64_t bytes, alloy_status *st)
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

/* "step 3 (row), action 7 of 40: kernel k_row_3 <<<64, 256>>>" for action i of the plan. */
static void describe_action(const rt_exec *e, int i, char *out, size_t len)
{
    const lp_action *a = &e->lp.actions[i];
    rt_profile_row r = cu_profile_row(e, i, 0);
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
    cdev *dev = cu_device_of(b);
    alloy_status st = dev->ops->sync(dev);
    if (!st) return ALLOY_OK;
    char what[256];
    describe_action(e, i, what, sizeof what);
    return rt_fail(b, st, "cuda: %s failed on the device (ALLOY_CUDA_SYNC): %s", what, dev->error);
}

/* On a checking device: the extents action a touches, told to the device before it is queued. */
static void describe_extents(rt_exec *e, cdev *dev, const lp_action *a)
{
    int max = e->maxparams + 6; /* a GEMM: A, B, D, a bias, GELU's input and the pointer arrays */
    cdev_extent *ext = al_malloc(sizeof *ext * (size_t)max);
    int n = ext ? cu_action_extents(e->g, e->s, e->p, &e->lp, e->prog, a, (cu_bases){e->arena, e->aux, e->leaf}, ext, max) : 0;
    dev->ops->describe(dev, ext, n); /* none (out of memory): the device checks the action against nothing */
    al_free(ext);
}

/* Queues actions [from, to) of the launch plan on the device. */
alloy_status cu_enqueue(rt_backend *b, rt_exec *e, int from, int to)
{
    cdev *dev = cu_device_of(b);
    alloy_status st = ALLOY_OK;
    for (int i = from; !st && i < to; i++) {
        const lp_action *a = &e->lp.actions[i];
        if (dev->ops->describe) describe_extents(e, dev, a);
        if (e->timing && (st = dev->ops->event_record(dev, e->events[2 * i]))) return cu_dev_fail(b, st, "profiling");
        switch (a->kind) {
        case LP_KERNEL: {
            const cg_kernel *kn = &e->prog->kernels[a->index];
            const lp_place *args = &e->lp.args[e->lp.first_arg[a->index]];
            for (int p = 0; !st && p < kn->nparams; p++) {
                e->argval[p] = cu_address(b, e, &args[p], 1, &st);
                e->argv[p] = &e->argval[p];
            }
            if (!st && (st = dev->ops->launch(dev, e->fn[a->index], kn->grid, kn->block, e->argv, kn->nparams))) {
                char what[256];
                describe_action(e, i, what, sizeof what);
                cu_dev_fail(b, st, what);
            }
            break;
        }
        case LP_GEMM: {
            const lp_gemm *gm = &e->lp.gemms[a->index];
            /* len: strided runs in place of the pointer arrays (prepare_gemm, cuda_build.c), a call each from the places */
            int64_t len = e->gemm_run_len[a->index], calls = len ? gm->batch / len : 1;
            cdev_ptr pa = cu_address(b, e, &gm->a, 1, &st), pb = cu_address(b, e, &gm->b, 1, &st),
                     pd = cu_address(b, e, &gm->out, 1, &st);
            if (gm->pointers && !len) { /* the arrays of the batch's addresses (upload_pointers, cuda_build.c) */
                cdev_ptr arrays = e->aux + (cdev_ptr)gm->ptr_at.offset, each = (cdev_ptr)(8 * gm->batch);
                pa = arrays, pb = arrays + each, pd = arrays + 2 * each;
            }
            cdev_gemm_extra ex = {.bias = lp_epilogue_bias(gm->epilogue) ? cu_address(b, e, &gm->bias, 1, &st) : 0,
                                  .aux = lp_epilogue_aux(gm->epilogue) ? cu_address(b, e, &gm->aux, 1, &st) : 0};
            for (int64_t r = 0; !st && r < calls; r++) {
                int64_t at[3] = {0, 0, 0};
                if (len) lp_gemm_run_offsets(&e->lp, gm, len, r, at);
                if ((st = dev->ops->gemm(dev, e->gemm[a->index], pa + (cdev_ptr)at[0], pb + (cdev_ptr)at[1],
                                         pd + (cdev_ptr)at[2], ex))) {
                    char label[64], what[160];
                    al_fmt(what, sizeof what, "GEMM of matmul %s (step %d)",
                           ir_node_label(e->g->nodes[gm->node], label, sizeof label), gm->step);
                    cu_dev_fail(b, st, what);
                }
            }
            break;
        }
        case LP_ZERO: {
            cdev_ptr d = cu_address(b, e, &a->dst, a->bytes, &st);
            if (!st && (st = dev->ops->zero(dev, d, (size_t)a->bytes))) cu_dev_fail(b, st, "memset");
            break;
        }
        case LP_COPY: {
            cdev_ptr d = cu_address(b, e, &a->dst, a->bytes, &st), s = cu_address(b, e, &a->src, a->bytes, &st);
            if (!st && d != s && (st = dev->ops->copy(dev, d, s, (size_t)a->bytes))) cu_dev_fail(b, st, "an update's copy");
            break;
        }
        case LP_COLLECTIVE: { /* the operand into the result, reduced there in place over the ranks */
            cdev_ptr d = cu_address(b, e, &a->dst, a->bytes, &st), s = cu_address(b, e, &a->src, a->bytes, &st);
            if (!st && d != s && a->bytes && (st = dev->ops->copy(dev, d, s, (size_t)a->bytes)))
                cu_dev_fail(b, st, "a collective's operand");
            if (st || !e->comm || !a->bytes) break; /* no communicator: one rank, the copy is the result */
            char err[512], where[128];
            void *stream = dev->ops->stream ? dev->ops->stream(dev) : NULL;
            if ((st = cu_coll_enqueue(((cuda_backend *)b)->coll, e->g->nodes[a->index], d, stream, err, sizeof err))) {
                cu_collective_label(e, i, where, sizeof where);
                rt_fail(b, st, "cuda: %s: %s", where, err);
            }
            break;
        }
        }
        if (!st && e->timing && (st = dev->ops->event_record(dev, e->events[2 * i + 1]))) cu_dev_fail(b, st, "profiling");
        if (!st && ((cuda_backend *)b)->sync_each) st = sync_action(b, e, i);
    }
    return st;
}
