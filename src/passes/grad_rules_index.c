/* grad_rules_index.c - the gradient rules of the indexing ops (gather, index_select: scatter-adds; cumsum: the reverse cumsum). */
#include "passes/grad_rules.h"

#define TYPE(id) (&c->g->nodes[id]->type)
#define IN(j) (n->in[j])
#define RULE(name) alloy_status name(ad_ctx *c, const ir_node *n, int dy, int *dx)
#define DONE return c->g->status

/* The forward's axis, as written (the backward op has the same schema). */
static ir_attr axis_attr(const ir_node *n) { return ir_a_int("axis", ir_attr_i(n, "axis")); }

/* dx = zeros of x's type with dy added at every element gather read; no gradient for the index */
RULE(gr_gather)
{
    ir_attr a = axis_attr(n);
    dx[0] = ad_emit(c, IR_OP_gather_grad, 2, (int[]){IN(1), dy}, 1, &a, TYPE(IN(0)));
    dx[1] = -1;
    DONE;
}

/* dx = zeros of x's type with slice k of dy added at index[k] along the axis (index_add) */
RULE(gr_index_select)
{
    ir_attr a = axis_attr(n);
    dx[0] = ad_emit(c, IR_OP_index_select_grad, 2, (int[]){IN(1), dy}, 1, &a, TYPE(IN(0)));
    dx[1] = -1;
    DONE;
}

/* y_i = sum_{j <= i} x_j, so dx_j = sum_{i >= j} dy_i: the cumsum of dy the other way */
RULE(gr_cumsum)
{
    ir_attr a[2] = {axis_attr(n), ir_a_bool("reverse", !ir_attr_i(n, "reverse"))};
    dx[0] = ad_emit(c, IR_OP_cumsum, 1, &dy, 2, a, NULL);
    DONE;
}
