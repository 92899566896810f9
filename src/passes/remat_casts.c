/* remat_casts.c - the remat pass's cast rule: a half-precision copy the backward reads is cast again there from a value the backward keeps anyway.
 *
 * Under mixed precision the forward rounds f32 values v to f16/bf16
 * (c = cast(v)) for its GEMMs, and the backward's GEMMs read c again: the
 * attention's probabilities P (dV = P^T dO), a layer norm's output (the dW
 * of the linear layer after it), a weight's working copy (dX). Kept from
 * the forward to the backward, c is live across the whole middle of the
 * step, next to what it was cast from: the f32 softmax that the softmax's
 * backward reads, the f32 residual x that the norm's backward reads, the
 * f32 parameter. Here c's readers in the backward (the nodes that are no
 * ancestor of the loss) read a clone instead, placed right before the
 * first of them, when the clone's operands are there anyway:
 *
 * - c = cast(v), v a leaf (a parameter: fuse_casts.c leaves a backward
 *   copy where it is) or read again at or after that point (the f32
 *   softmax, read by its softmax_grad after dV): the clone is cast(v);
 * - c = cast(v), v = layer_norm(x, weight, bias) or rms_norm(x, weight)
 *   read only by c, each operand a leaf or read again at or after that
 *   point (x by the norm's backward): the clones are the norm and the
 *   cast, which fuse puts into a row step of the backward.
 *
 * The forward's c is then read only by the forward and dies there; the
 * clone lives from its first reader's step to its last's. The clones are
 * the same ops on the same values (a stored f32 value is the f32 value the
 * forward's group cast unrounded), so the results keep their bits
 * (tests/test_remat_casts.c). The cost is one more f32 -> half pass over
 * each copy in the backward, and for a norm its row statistics again.
 * pass_remat runs this rule on the CPU with remat=auto only (remat.c).
 */
#include "passes/pass.h"

enum { FORWARD = 1, KEPT = 2 };

/* Marks in part[] (n entries) the loss and every node it depends on
 * (FORWARD) and the values stored for a reason other than their readers:
 * outputs, updates, the loss (KEPT). */
static void mark_parts(const ir_graph *g, int n, uint8_t *part)
{
    for (int o = 0; o < g->noutputs; o++)
        if (g->outputs[o].node >= 0 && g->outputs[o].node < n) part[g->outputs[o].node] |= KEPT;
    for (int u = 0; u < g->nupdates; u++)
        if (g->updates[u].node >= 0 && g->updates[u].node < n) part[g->updates[u].node] |= KEPT;
    if (g->loss < 0 || g->loss >= n) return;
    part[g->loss] |= FORWARD | KEPT;
    for (int i = g->loss; i >= 0; i--) {
        if (!(part[i] & FORWARD)) continue;
        const ir_node *m = g->nodes[i];
        for (int k = 0; k < m->nin; k++) part[m->in[k]] |= FORWARD;
    }
}

static bool is_leaf(const ir_node *n)
{
    return n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state || n->op == IR_OP_constant;
}

/* Per node of [0, n): the last node reading it, the first backward node
 * reading it, the last forward node reading it (-1: none) and how many
 * nodes read it. */
typedef struct reads {
    int *last, *first_bwd, *last_fwd, *count;
} reads;

/* Whether v is available at node `at` without being kept longer: a leaf,
 * or read at or after `at` by a node the clone leaves as it is. */
static bool live_at(const ir_graph *g, const reads *r, int v, int at) { return is_leaf(g->nodes[v]) || r->last[v] >= at; }

/* The clone's chain for c = cast(v) whose first backward reader is `at`:
 * 1 (cast(v), v live there), 2 (a norm and the cast, the norm's tensor
 * operands live there), 0 (none: c stays stored). */
static int cast_chain(const ir_graph *g, const reads *r, const uint8_t *part, int c, int at)
{
    const ir_node *cn = g->nodes[c], *v = g->nodes[cn->in[0]];
    if (v->op == IR_OP_constant || !ir_is_float(v->type.dtype) || !ir_is_float(cn->type.dtype) ||
        alloy_dtype_size(cn->type.dtype) >= alloy_dtype_size(v->type.dtype))
        return 0;
    if (is_leaf(v) || r->last[v->id] >= at) return 1; /* a leaf (a weight's copy) is there all step */
    if ((v->op != IR_OP_layer_norm && v->op != IR_OP_rms_norm) || v->nin > 3 || (part[v->id] & KEPT) ||
        r->count[v->id] != 1)
        return 0;
    for (int k = 0; k < v->nin; k++)
        if (!live_at(g, r, v->in[k], at)) return 0;
    return 2;
}

int remat_casts(ir_graph *g, int n0, int *before, int *count)
{
    if (g->loss < 0) return 0;
    uint8_t *part = al_calloc((size_t)n0 + 1, 1);
    int *scratch = al_malloc(sizeof(int) * (5 * (size_t)n0 + 1));
    if (!part || !scratch) {
        al_free(part), al_free(scratch);
        ir_error(g, ALLOY_ERR_OOM, "remat: out of memory");
        return 0;
    }
    reads r = {scratch, scratch + n0, scratch + 2 * n0, scratch + 3 * n0};
    int *clone = scratch + 4 * n0; /* per cast: the clone the backward reads instead, or -1 */
    mark_parts(g, n0, part);
    for (int i = 0; i < n0; i++) r.last[i] = r.first_bwd[i] = r.last_fwd[i] = clone[i] = -1, r.count[i] = 0;
    for (int i = 0; i < n0; i++) {
        const ir_node *m = g->nodes[i];
        for (int k = 0; k < m->nin; k++) {
            int v = m->in[k];
            if (v >= n0) continue; /* a clone of the softmax rule: it reads no cast this rule clones */
            r.last[v] = i, r.count[v]++;
            if (part[i] & FORWARD) r.last_fwd[v] = i;
            else if (r.first_bwd[v] < 0) r.first_bwd[v] = i;
        }
    }
    int made = 0;
    for (int c = 0; c < n0 && !g->status; c++) {
        const ir_node *cn = g->nodes[c];
        int at = r.first_bwd[c];
        if (cn->op != IR_OP_cast || cn->nin != 1 || !(part[c] & FORWARD) || (part[c] & KEPT) || at < 0 ||
            r.last_fwd[c] > at || before[at] >= 0)
            continue;
        int len = cast_chain(g, &r, part, c, at);
        if (!len) continue;
        int prev = cn->in[0], first = g->nnodes;
        for (int s = len - 1; s >= 0 && !g->status; s--) { /* the norm (len 2), then the cast */
            const ir_node *src = g->nodes[s ? g->nodes[c]->in[0] : c];
            int ins[3]; /* cast_chain: at most 3 operands */
            for (int k = 0; k < src->nin; k++) ins[k] = src->in[k];
            if (!s) ins[0] = prev;
            ir_node *m = ir_add_node(g, src->op, src->nin, ins, src->nattrs, src->attrs, &src->type, NULL);
            if (!m) break;
            m->amp = src->amp, m->flags = src->flags, m->origin = src->id;
            prev = m->id;
        }
        if (g->status) break;
        clone[c] = prev;
        before[at] = first, count[at] = len;
        made++;
    }
    for (int i = 0; i < n0 && made && !g->status; i++) { /* the backward reads the clones */
        ir_node *m = g->nodes[i];
        if (part[i] & FORWARD) continue;
        for (int k = 0; k < m->nin; k++)
            if (m->in[k] < n0 && clone[m->in[k]] >= 0) m->in[k] = clone[m->in[k]];
    }
    al_free(part), al_free(scratch);
    return made;
}
