/* remat.c - rematerialization: a softmax's backward recomputes the softmax from its narrower input instead of reading a stored wider output.
 *
 * A softmax_grad(y, dy) reads y = softmax(x) row by row. Under mixed
 * precision x is cast(f32, [causal_mask(]s[)]) of a half-precision s (the
 * scores a matmul stores anyway), and y is an f32 tensor as large as the
 * scores that the forward writes only for the backward. Where y is read by
 * the softmax_grad and by nothing that needs it stored (not an output or
 * the loss), and the chain x .. s is only casts and causal masks of y's
 * shape ending at a value narrower than y, this pass clones the chain and
 * the softmax right before the softmax_grad and makes it read the clone:
 * fuse then puts the clones into the backward's row kernel, which reads s
 * (half the bytes of y) and recomputes y with the same ops, and the
 * forward stores only what its other readers need. No value changes: the
 * clones are the same ops on the same operands.
 *
 * After this pass every softmax_grad that matches reads a softmax that has
 * no other reader and directly precedes it; the rest of the graph is as
 * before. Runs after dce (which keeps the clones, they are read) and
 * before fuse; simplify, which would merge the clones back, runs earlier.
 */
#include "passes/pass.h"

enum { REMAT_CHAIN_MAX = 8 };

/* The chain softmax <- (cast | causal_mask)* <- root of softmax y, as ids
 * from y outward into chain[0..*len) (root excluded): true when every link
 * has y's shape, each a single operand, and the root is narrower than y. */
static bool remat_chain(const ir_graph *g, const ir_node *y, int *chain, int *len, int *root)
{
    int k = 0, cur = y->id;
    chain[k++] = cur;
    int x = y->in[0];
    while (k < REMAT_CHAIN_MAX) {
        const ir_node *n = g->nodes[x];
        if ((n->op != IR_OP_cast && n->op != IR_OP_causal_mask) || n->nin != 1) break;
        if (n->type.rank != y->type.rank) return false;
        for (int d = 0; d < n->type.rank; d++)
            if (n->type.dims[d] != y->type.dims[d]) return false;
        chain[k++] = x;
        x = n->in[0];
    }
    const ir_node *r = g->nodes[x];
    if (!ir_is_float(r->type.dtype) || alloy_dtype_size(r->type.dtype) >= alloy_dtype_size(y->type.dtype)) return false;
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

/* Whether a node other than `except` reads node v (else the clone would leave v dead). */
static bool read_elsewhere(const ir_graph *g, int v, int except)
{
    for (int i = v + 1; i < g->nnodes; i++)
        if (i != except)
            for (int j = 0; j < g->nodes[i]->nin; j++)
                if (g->nodes[i]->in[j] == v) return true;
    return false;
}

alloy_status pass_remat(ir_graph **gp, const pass_options *opts)
{
    (void)opts;
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
        int chain[REMAT_CHAIN_MAX], len = 0, root = -1;
        if (y->op != IR_OP_softmax || kept(g, y->id) || !read_elsewhere(g, y->id, i) ||
            !remat_chain(g, y, chain, &len, &root))
            continue;
        int prev = root, first = g->nnodes;
        for (int c = len - 1; c >= 0 && !g->status; c--) { /* from the root outward */
            const ir_node *src = g->nodes[chain[c]];
            ir_node *m = ir_add_node(g, src->op, 1, &prev, src->nattrs, src->attrs, &src->type, NULL);
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
