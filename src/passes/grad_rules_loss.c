/* grad_rules_loss.c - the gradient rules of the losses: the elementwise ones (mse, l1, smooth_l1, binary cross entropy with logits) and the row ones (cross_entropy, nll_loss). */
#include "passes/grad_rules.h"

#define TYPE(id) (&c->g->nodes[id]->type)
#define IN(j) (n->in[j])
#define RULE(name) alloy_status name(ad_ctx *c, const ir_node *n, int dy, int *dx)
#define DONE return c->g->status

/* A loss of (a, b) whose gradient op g(a, b, dy) gives a's, and g(b, a, dy) b's. */
static void symmetric(ad_ctx *c, const ir_node *n, int op, int dy, int *dx)
{
    int na = n->nattrs;
    dx[0] = ad_unbroadcast(c, ad_emit(c, op, 3, (int[]){IN(0), IN(1), dy}, na, n->attrs, NULL), TYPE(IN(0)));
    dx[1] = ad_unbroadcast(c, ad_emit(c, op, 3, (int[]){IN(1), IN(0), dy}, na, n->attrs, NULL), TYPE(IN(1)));
}

RULE(gr_mse_loss) { symmetric(c, n, IR_OP_mse_loss_grad, dy, dx); DONE; }
RULE(gr_l1_loss) { symmetric(c, n, IR_OP_l1_loss_grad, dy, dx); DONE; }
RULE(gr_smooth_l1_loss) { symmetric(c, n, IR_OP_smooth_l1_loss_grad, dy, dx); DONE; }

/* dy times the derivative by each operand (logits, target, pos_weight) */
RULE(gr_binary_cross_entropy_with_logits)
{
    for (int k = 0; k < 3; k++) {
        ir_attr a = ir_a_int("operand", k);
        int d = ad_emit(c, IR_OP_binary_cross_entropy_with_logits_grad, 3, (int[]){IN(0), IN(1), IN(2)}, 1, &a, NULL);
        dx[k] = ad_unbroadcast(c, d >= 0 ? ad_emit(c, IR_OP_mul, 2, (int[]){dy, d}, 0, NULL, NULL) : -1, TYPE(IN(k)));
    }
    DONE;
}

/* The weight total a mean divides by: over the targets t of loss n, the
 * class weight w[t] (1 without weights), 0 where t is ignore_index. Built
 * from existing ops; the forward computes the same total inside the op. */
static int weight_total(ad_ctx *c, const ir_node *n)
{
    const ir_type *t = TYPE(IN(1));
    alloy_dtype dt = TYPE(IN(0))->dtype;
    const ir_attr *ignore = ir_attr_find(n, "ignore_index");
    int valid = ignore ? ad_emit(c, IR_OP_not_equal, 2, (int[]){IN(1), ad_scalar(c, t->dtype, (double)ignore->i)}, 0,
                                 NULL, NULL)
                       : -1;
    ir_type per_type = *t;
    per_type.dtype = dt;
    int per;
    if (n->nin > 2) {
        int ids = ignore ? ad_emit(c, IR_OP_where, 3, (int[]){valid, IN(1), ad_scalar(c, t->dtype, 0)}, 0, NULL, NULL)
                         : IN(1);
        ir_type column = {.dtype = dt, .rank = 2, .dims = {TYPE(IN(2))->dims[0], 1}};
        int wt = ad_emit(c, IR_OP_embedding, 2, (int[]){ids, ad_reshape(c, IN(2), &column)}, 0, NULL, NULL);
        per = ad_reshape(c, wt, &per_type);
        if (ignore) per = ad_emit(c, IR_OP_where, 3, (int[]){valid, per, ad_scalar(c, dt, 0)}, 0, NULL, NULL);
    } else {
        per = ad_emit(c, IR_OP_cast, 1, &valid, 0, NULL, &per_type);
    }
    return ad_emit(c, IR_OP_reduce_sum, 1, &per, 0, NULL, NULL);
}

/* The gradient op of a row loss: (x, t, dy) for an unweighted mean over
 * every row (the op divides by the row count), else (x, t, dy, divisor[, w])
 * with the divisor 1 for a sum and the weight total for a mean. */
static int row_loss_grad(ad_ctx *c, const ir_node *n, int op, int dy)
{
    ir_attr attrs[2];
    int na = 0;
    for (const ir_attr_spec *s = ir_ops[op].attrs; s && s->name; s++) {
        const ir_attr *a = ir_attr_find(n, s->name);
        if (a) attrs[na++] = *a;
    }
    bool weighted = n->nin > 2, sum = ir_row_sums(n);
    if (!weighted && !sum && !ir_attr_find(n, "ignore_index"))
        return ad_emit(c, op, 3, (int[]){IN(0), IN(1), dy}, na, attrs, NULL);
    int divisor = sum ? ad_scalar(c, TYPE(IN(0))->dtype, 1.0) : weight_total(c, n);
    return ad_emit(c, op, weighted ? 5 : 4, (int[]){IN(0), IN(1), dy, divisor, weighted ? IN(2) : 0}, na, attrs, NULL);
}

/* no gradient for the targets, nor for the class weights (as PyTorch's nll_loss) */
RULE(gr_cross_entropy)
{
    dx[0] = row_loss_grad(c, n, IR_OP_cross_entropy_grad, dy);
    for (int j = 1; j < n->nin; j++) dx[j] = -1;
    DONE;
}

RULE(gr_nll_loss)
{
    dx[0] = row_loss_grad(c, n, IR_OP_nll_loss_grad, dy);
    for (int j = 1; j < n->nin; j++) dx[j] = -1;
    DONE;
}
