/* causal_rows.c - which row ops have causal rows (a softmax of causal_mask scores and its gradient), read by every backend. */
#include <math.h>

#include "ir/groups.h"

/* Whether value id is causal_mask(x) with value -inf, through casts between
 * float dtypes (a cast keeps -inf, and the dims): its columns past each row's
 * diagonal are -inf whatever x holds there, NaN included. */
static bool masked_scores(const ir_graph *g, int id)
{
    const ir_node *n = g->nodes[id];
    while (n->op == IR_OP_cast && n->nin == 1 && ir_is_float(n->type.dtype) &&
           ir_is_float(g->nodes[n->in[0]]->type.dtype))
        n = g->nodes[n->in[0]];
    return n->op == IR_OP_causal_mask && n->nin == 1 && ir_attr_f(n, "value") == -INFINITY;
}

/* Whether n's op (softmax or softmax_grad) runs along the last axis of a
 * value of rank >= 2. */
static bool along_last(const ir_node *n)
{
    int axis = -1;
    return n->type.rank >= 2 && ir_norm_axis(ir_attr_i(n, "axis"), n->type.rank, &axis) && axis == n->type.rank - 1;
}

bool ir_row_causal(const ir_graph *g, const ir_node *n)
{
    if (n->nin < 1 || !along_last(n)) return false;
    if (n->op == IR_OP_softmax) return masked_scores(g, n->in[0]);
    if (n->op != IR_OP_softmax_grad || n->nin != 2) return false;
    const ir_node *y = g->nodes[n->in[0]]; /* the probabilities, through casts (a cast keeps an exact 0) */
    while (y->op == IR_OP_cast && y->nin == 1 && ir_is_float(y->type.dtype) && ir_is_float(g->nodes[y->in[0]]->type.dtype))
        y = g->nodes[y->in[0]];
    return y->op == IR_OP_softmax && ir_same_dims(&y->type, &n->type) && ir_row_causal(g, y);
}

int64_t ir_causal_live(const ir_type *t, int64_t row)
{
    int64_t q = t->dims[t->rank - 2], k = t->dims[t->rank - 1];
    return row % q + k - q + 1;
}
