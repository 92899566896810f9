/* remat.c - rematerialization: a softmax's backward recomputes the softmax from the scores instead of reading an f32 softmax the forward stores for it.
 *
 * A softmax_grad(y, dy) reads y = softmax(x) row by row. Under mixed
 * precision x is a chain of casts, causal masks and elementwise ops with
 * scalar constants (the 1/sqrt(d) scale) from a half-precision s (the
 * scores a matmul stores anyway), and y is an f32 tensor as large as the
 * scores that the forward writes only for the backward. Where y is read by
 * the softmax_grad and otherwise only by casts (its cast to f16 for the
 * next matmul), nothing else needs it stored (not an output, update or
 * the loss), and the chain x .. s has y's shape and ends at a value
 * narrower than y or at a GEMM's result (a matmul, or a cast of one, which
 * its GEMM writes whole: a cast is not cloned away from its epilogue), this
 * pass clones the chain and the softmax right before the softmax_grad and
 * makes it read the clone: fuse then puts the clones into the backward's
 * row kernel, which reads s (half the bytes of y when s is f16) and
 * recomputes y with the same ops, and the forward stores no y. No value
 * changes: the clones are the same ops on the same operands.
 *
 * Where it applies (the option `remat`): every match by default for a
 * CUDA compile (device=cuda), and elsewhere only one whose f32 softmax
 * takes at least REMAT_CPU_MIN_BYTES. On the CPU the stored softmax costs
 * little (it is read back from the cache or memory at a few GB/s, inside a
 * step of GEMMs) while the recompute is a second exp per score in the
 * backward's row kernel: char_gpt's bf16 step took longer with it
 * (bench/RESULTS.md), so there it is for memory, at the attention pass's
 * threshold. device=auto compiles for the backend that opened before the
 * passes ran (graph_compile): the GPU where one runs, else the CPU.
 * `remat=always` recomputes every match; disable_passes=remat none.
 *
 * The loss scaler's unscale gets the same treatment: a gradient's
 * x = mul(g, s) (s a scalar: the f32 reciprocal of the scale, grad_scaler.c)
 * that found_inf reads (and the norm's sum_squares) is also read by the
 * optimizer's update. The check's multi group computes x in registers; the
 * update would read it stored. Here the readers other than found_inf and
 * sum_squares read a clone mul(g, s) placed right before the first of
 * them, so fuse puts the clone into the update's group, which multiplies
 * as it reads g, and x is stored only when a run fetches its "grad:"
 * output (schedule.c keeps it then). Same op, same operands: the same
 * bits.
 *
 * On the CPU with remat=auto the backward also casts to f16/bf16 again
 * what the forward cast for a GEMM, where the clone's operands are live
 * anyway (remat_casts.c): the forward's copies then die with the forward.
 * A CUDA compile (and remat=always, which compiles the CUDA choices on any
 * device) keeps them: its kernels, launches and modelled costs stay as
 * they were.
 *
 * After this pass every softmax_grad that matches reads a softmax that has
 * no other reader and directly precedes it, every such unscale is read
 * only by found_inf and sum_squares (and outputs), and (CPU) every cast
 * remat_casts.c clones is read only by the forward; the rest of the graph
 * is as before. Runs after dce (which keeps the clones, they are read) and
 * before fuse; simplify, which would merge the clones back, runs earlier.
 */
#include "passes/pass.h"

enum { REMAT_CHAIN_MAX = 8 };
/* On the CPU, the smallest f32 softmax (bytes) worth recomputing: the
 * attention pass's ATTN_CPU_MIN_BYTES (fuse_attention.c). */
#define REMAT_CPU_MIN_BYTES (64.0 * 1024 * 1024)

/* Whether a match whose softmax is y is recomputed (see the top). */
static bool want_remat(const ir_node *y, const al_options *cfg)
{
    if (cfg->remat_always || cfg->device == OPT_DEVICE_CUDA) return true;
    return (double)ir_numel(&y->type) * 4.0 >= REMAT_CPU_MIN_BYTES;
}

/* Whether operand j of n is on the chain: n is a cast, a causal mask or
 * an elementwise op whose other operands are scalar constants, of shape
 * t; then *j is the operand that carries the row. */
static bool chain_link(const ir_graph *g, const ir_node *n, const ir_type *t, int *j)
{
    if (n->type.rank != t->rank) return false;
    for (int d = 0; d < t->rank; d++)
        if (n->type.dims[d] != t->dims[d]) return false;
    /* a cast of a matmul is its GEMM's epilogue (the product unrounded, stored): the root, not a link */
    if (n->op == IR_OP_cast && n->nin == 1 && g->nodes[n->in[0]]->op == IR_OP_matmul) return false;
    if ((n->op == IR_OP_cast || n->op == IR_OP_causal_mask) && n->nin == 1) {
        *j = 0;
        return true;
    }
    if (!ir_fuse_elementwise(g, n) || n->nin > 3) return false;
    int at = -1;
    for (int k = 0; k < n->nin; k++) {
        const ir_node *o = g->nodes[n->in[k]];
        if (o->op == IR_OP_constant && o->type.rank == 0) continue;
        if (at >= 0) return false; /* a second tensor operand: not a chain */
        at = k;
    }
    *j = at;
    return at >= 0;
}

/* The chain softmax <- link* <- root of softmax y (chain_link), as ids
 * from y outward into chain[0..*len) (root excluded), with the operand
 * index each reads the chain through in via[]: true when the root is
 * narrower than y (a half-precision value to recompute from) or a GEMM's
 * result (a matmul, or its cast the GEMM writes), stored anyway. */
static bool remat_chain(const ir_graph *g, const ir_node *y, int *chain, int *via, int *len, int *root)
{
    int k = 0, x = y->in[0];
    chain[k] = y->id, via[k++] = 0;
    int j = 0;
    while (k < REMAT_CHAIN_MAX && chain_link(g, g->nodes[x], &y->type, &j)) {
        chain[k] = x, via[k++] = j;
        x = g->nodes[x]->in[j];
    }
    const ir_node *r = g->nodes[x];
    bool gemm = r->op == IR_OP_matmul || (r->op == IR_OP_cast && g->nodes[r->in[0]]->op == IR_OP_matmul);
    if (!ir_is_float(r->type.dtype) ||
        (!gemm && alloy_dtype_size(r->type.dtype) >= alloy_dtype_size(y->type.dtype)))
        return false;
    *len = k, *root = x;
    return true;
}

/* Whether node i's value must be stored for a reason other than its readers. */
static bool kept(const ir_graph *g, int i)
{
    for (int o = 0; o < g->noutputs; o++)
        if (g->outputs[o].node == i) return true;
    for (int u = 0; u < g->nupdates; u++)
        if (g->updates[u].node == i) return true;
    return g->loss == i;
}

/* Whether node v has readers besides `except` and all of them are casts
 * (the softmax's cast to f16 for the next matmul, which fuses with it):
 * then v is stored only for `except`. A GEMM reading v needs it stored
 * anyway (an f32 step), and with no other reader the clone would leave v
 * dead. */
static bool read_by_casts(const ir_graph *g, int v, int except)
{
    int casts = 0;
    for (int i = v + 1; i < g->nnodes; i++) {
        if (i == except) continue;
        const ir_node *n = g->nodes[i];
        for (int j = 0; j < n->nin; j++) {
            if (n->in[j] != v) continue;
            if (n->op != IR_OP_cast) return false;
            casts++;
        }
    }
    return casts > 0;
}

/* Whether x is an unscale that found_inf reads: mul(g, s) with s a scalar
 * and g of x's type. */
static bool unscale_of(const ir_graph *g, const ir_node *x)
{
    if (x->op != IR_OP_mul || x->nin != 2) return false;
    const ir_node *a = g->nodes[x->in[0]], *s = g->nodes[x->in[1]];
    return s->type.rank == 0 && a->type.dtype == x->type.dtype && ir_numel(&a->type) == ir_numel(&x->type) &&
           a->type.rank == x->type.rank;
}

static bool checks(const ir_node *n) { return n->op == IR_OP_found_inf || n->op == IR_OP_sum_squares; }

/* The unscale rule (see the top): clones each unscale that found_inf and
 * another node read right before that node's first reader among the
 * nodes [0, n0), recorded in before[]/count[] like the softmax sites
 * (skipping a reader that already has one). Returns how many it made. */
static int remat_unscales(ir_graph *g, int n0, int *before, int *count)
{
    int *first = al_malloc(sizeof(int) * ((size_t)n0 + 1)), *clone = al_malloc(sizeof(int) * ((size_t)n0 + 1));
    int made = 0;
    if (!first || !clone) {
        al_free(first), al_free(clone);
        ir_error(g, ALLOY_ERR_OOM, "remat: out of memory");
        return 0;
    }
    for (int i = 0; i < n0; i++) first[i] = clone[i] = -1;
    for (int i = 0; i < n0; i++) { /* first[x] = -2: an unscale found_inf reads */
        const ir_node *n = g->nodes[i];
        if (n->op != IR_OP_found_inf) continue;
        for (int j = 0; j < n->nin; j++)
            if (unscale_of(g, g->nodes[n->in[j]])) first[n->in[j]] = -2;
    }
    for (int i = 0; i < n0; i++) { /* then its first reader other than the checks */
        const ir_node *n = g->nodes[i];
        if (checks(n)) continue;
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] < n0 && first[n->in[j]] == -2) first[n->in[j]] = i;
    }
    for (int i = 0; i < n0 && !g->status; i++) {
        if (before[i] >= 0) continue; /* a softmax site: its clones must stay consecutive */
        for (int j = 0; j < g->nodes[i]->nin && !g->status; j++) {
            int x = g->nodes[i]->in[j];
            if (x >= n0 || first[x] != i || clone[x] >= 0) continue;
            const ir_node *src = g->nodes[x];
            int ins[2] = {src->in[0], src->in[1]}; /* unscale_of: two operands */
            ir_node *m = ir_add_node(g, src->op, src->nin, ins, src->nattrs, src->attrs, &src->type, NULL);
            if (!m) break;
            m->amp = src->amp, m->flags = src->flags, m->origin = src->origin;
            clone[x] = m->id;
            if (before[i] < 0) before[i] = m->id;
            count[i]++, made++;
        }
    }
    for (int i = 0; i < n0 && made && !g->status; i++) { /* every reader but the checks reads the clone */
        ir_node *n = g->nodes[i];
        if (checks(n)) continue;
        for (int j = 0; j < n->nin; j++) /* (a softmax clone, id n0 or more, is no unscale) */
            if (n->in[j] < n0 && clone[n->in[j]] >= 0) n->in[j] = clone[n->in[j]];
    }
    al_free(first), al_free(clone);
    return made;
}

alloy_status pass_remat(ir_graph **gp, const pass_options *opts)
{
    const al_options *cfg = pass_cfg(opts);
    ir_graph *g = *gp;
    int n0 = g->nnodes, found = 0;
    /* before[i]: the first clone placed right before node i, or -1; clones of one site are consecutive ids */
    int *before = al_malloc(sizeof(int) * ((size_t)n0 + 1)), *count = al_malloc(sizeof(int) * ((size_t)n0 + 1));
    if (!before || !count) {
        al_free(before), al_free(count);
        return ir_error(g, ALLOY_ERR_OOM, "remat: out of memory");
    }
    for (int i = 0; i < n0; i++) before[i] = -1, count[i] = 0;
    for (int i = 0; i < n0 && !g->status; i++) {
        ir_node *sg = g->nodes[i];
        if (sg->op != IR_OP_softmax_grad || sg->nin != 2) continue;
        const ir_node *y = g->nodes[sg->in[0]];
        int chain[REMAT_CHAIN_MAX], via[REMAT_CHAIN_MAX], len = 0, root = -1;
        if (y->op != IR_OP_softmax || !want_remat(y, cfg) || kept(g, y->id) || !read_by_casts(g, y->id, i) ||
            !remat_chain(g, y, chain, via, &len, &root))
            continue;
        int prev = root, first = g->nnodes;
        for (int c = len - 1; c >= 0 && !g->status; c--) { /* from the root outward */
            const ir_node *src = g->nodes[chain[c]];
            int ins[3]; /* chain_link: at most 3 operands */
            for (int j = 0; j < src->nin; j++) ins[j] = j == via[c] ? prev : src->in[j];
            ir_node *m = ir_add_node(g, src->op, src->nin, ins, src->nattrs, src->attrs, &src->type, NULL);
            if (!m) break;
            m->amp = src->amp, m->flags = src->flags;
            m->origin = sg->origin >= 0 ? sg->origin : y->id;
            prev = m->id;
        }
        if (g->status) break;
        g->nodes[i]->in[0] = prev; /* sg may have moved with the node array: index again */
        before[i] = first, count[i] = len;
        found++;
    }
    if (!g->status) found += remat_unscales(g, n0, before, count);
    if (!g->status && cfg->device != OPT_DEVICE_CUDA && !cfg->remat_always) found += remat_casts(g, n0, before, count);
    if (g->status || !found) {
        al_free(before), al_free(count);
        return g->status;
    }
    int *order = al_malloc(sizeof(int) * ((size_t)g->nnodes + 1)), n = 0;
    if (!order) {
        al_free(before), al_free(count);
        return ir_error(g, ALLOY_ERR_OOM, "remat: out of memory");
    }
    for (int i = 0; i < n0; i++) {
        for (int c = 0; c < count[i]; c++) order[n++] = before[i] + c;
        order[n++] = i;
    }
    ir_graph *out = ir_graph_reordered(g, order, n, "remat");
    al_free(order), al_free(before), al_free(count);
    if (!out) return g->status;
    ir_graph_free(g);
    *gp = out;
    return ALLOY_OK;
}
