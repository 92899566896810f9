/* cuda_readback.c - what a CUDA step's run reads back: the state leaves staged before updates written in place, the downloads, and the AMP check words. */
#include <string.h>

#include "runtime/cuda/cuda_exec.h"

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
alloy_status cu_stage_leaves(rt_backend *b, rt_exec *e, const rt_run_args *args, bool *changed)
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
        cu_dev_release(b, e->staging, e->staging_bytes);
        e->staging = 0, e->staging_bytes = 0;
        alloy_status st = cu_dev_alloc(b, bytes, &e->staging);
        if (st) return cu_dev_fail(b, st, "staging the step's counters");
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
alloy_status cu_enqueue_staging(rt_backend *b, rt_exec *e)
{
    cdev *dev = cu_device_of(b);
    alloy_status st = ALLOY_OK;
    for (int i = 0; !st && i < e->nstaged; i++) {
        const ir_node *n = e->g->nodes[e->staged[i]];
        lp_place pl = {LP_LEAF, n->id, 0};
        cdev_ptr src = cu_address(b, e, &pl, (int64_t)ir_nbytes(&n->type), &st);
        if (!st && (st = dev->ops->copy(dev, e->staging + (cdev_ptr)e->staged_at[i], src, ir_nbytes(&n->type))))
            cu_dev_fail(b, st, "staging a counter");
    }
    return st;
}

/* Downloads a value with a padded row stride (sched_pad) at src into dst
 * with its rows dense: the padded block at once, then each row's columns
 * (the padding columns, never written, are left behind). */
static alloy_status download_rows(rt_backend *b, rt_exec *e, int node, cdev_ptr src, void *dst)
{
    cdev *dev = cu_device_of(b);
    const ir_type *t = &e->g->nodes[node]->type;
    size_t size = alloy_dtype_size(t->dtype), c = (size_t)t->dims[t->rank - 1], ld = (size_t)e->s->row_stride[node];
    size_t rows = (size_t)ir_numel(t) / c;
    unsigned char *block = al_malloc(rows * ld * size + 1);
    if (!block) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of memory downloading %zu padded rows", rows);
    alloy_status st = dev->ops->download(dev, block, src, rows * ld * size);
    if (st) cu_dev_fail(b, st, "downloading a value");
    for (size_t r = 0; !st && r < rows; r++) memcpy((unsigned char *)dst + r * c * size, block + r * ld * size, c * size);
    al_free(block);
    return st;
}

/* Copies downloads to the host: staged leaves from the staging buffer
 * when staged is set, other values from where they live; with leaves set,
 * only the state leaves, else (unstaged) only the rest. */
alloy_status cu_run_downloads(rt_backend *b, rt_exec *e, const rt_run_args *args, bool staged, bool leaves)
{
    cdev *dev = cu_device_of(b);
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
        cdev_ptr src = staged && is_state_leaf(n) ? staged_copy(e, d->node) : cu_address(b, e, &pl, (int64_t)bytes, &st);
        if (!st && sched_padded(e->s, d->node)) st = download_rows(b, e, d->node, src, d->dst);
        else if (!st && (st = dev->ops->download(dev, d->dst, src, bytes))) cu_dev_fail(b, st, "downloading a value");
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
    cdev *dev = cu_device_of(b);
    alloy_status st = dev->ops->download(dev, w, e->aux, e->lp.checks_bytes);
    if (st) {
        al_free(w);
        return cu_dev_fail(b, st, "reading the step's checks");
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
 * unless the caller reads them later (cu_read_flags, on a skipped step). */
alloy_status cu_run_checks(rt_backend *b, rt_exec *e, const rt_run_args *args)
{
    unsigned checks = e->prog->checks;
    bool flags = args->nonfinite && (checks & CG_CHECK_FINITE), ranges = args->ranges && (checks & CG_CHECK_RANGE);
    bool flags_now = flags && (!args->flags_later || ranges); /* with the statistics: the same download */
    alloy_status st = read_checks(b, e, flags_now ? args->nonfinite : NULL, ranges ? args->ranges : NULL);
    if (!st && flags && args->nonfinite_done) *args->nonfinite_done = true;
    if (!st && ranges && args->ranges_done) *args->ranges_done = true;
    return st;
}

/* The non-finite flags of the last run, read later (a skipped step: run_checks left them). */
alloy_status cu_read_flags(rt_backend *b, rt_exec *e, uint8_t *nonfinite)
{
    return read_checks(b, e, nonfinite, NULL);
}
