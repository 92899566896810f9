/* grad_rules_conv.c - the gradient rules of the convolutions and pools: their backward ops (ops.def), the bias's gradient a reduce_sum. */
#include "passes/grad_rules.h"

#define TYPE(id) (&c->g->nodes[id]->type)
#define IN(j) (n->in[j])
#define RULE(name) alloy_status name(ad_ctx *c, const ir_node *n, int dy, int *dx)
#define DONE return c->g->status

/* conv(x, w[, bias]): dx = conv_grad_input(dy, w), dw = conv_grad_weight(x,
 * dy), dbias = dy summed over every dim but the channels */
RULE(gr_conv)
{
    dx[0] = ad_emit(c, IR_OP_conv_grad_input, 2, (int[]){dy, IN(1)}, n->nattrs, n->attrs, TYPE(IN(0)));
    dx[1] = ad_emit(c, IR_OP_conv_grad_weight, 2, (int[]){IN(0), dy}, n->nattrs, n->attrs, TYPE(IN(1)));
    if (n->nin > 2) {
        int64_t axes[3] = {0, 2, 3};
        ir_attr a = ir_a_ints("axes", n->type.rank - 1, axes);
        dx[2] = ad_emit(c, IR_OP_reduce_sum, 1, &dy, 1, &a, NULL);
    }
    DONE;
}

/* dy to the first maximum of each window (summed where windows overlap) */
RULE(gr_max_pool2d)
{
    dx[0] = ad_emit(c, IR_OP_max_pool2d_grad, 2, (int[]){IN(0), dy}, n->nattrs, n->attrs, NULL);
    DONE;
}

/* dy / the window's divisor to every element of the window */
RULE(gr_avg_pool2d)
{
    dx[0] = ad_emit(c, IR_OP_avg_pool2d_grad, 1, &dy, n->nattrs, n->attrs, TYPE(IN(0)));
    DONE;
}

RULE(gr_adaptive_avg_pool2d)
{
    dx[0] = ad_emit(c, IR_OP_adaptive_avg_pool2d_grad, 1, &dy, n->nattrs, n->attrs, TYPE(IN(0)));
    DONE;
}
