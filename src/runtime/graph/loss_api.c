/* loss_api.c - the losses of alloy/loss.h: one loss node each (an elementwise loss and its reduction, or cross_entropy / nll_loss). */
#include "alloy/loss.h"
#include "runtime/graph/graph_impl.h"

#define NODE(t) ((ir_node *)(void *)(t))

/* The reduction of elementwise loss values l. */
static alloy_tensor *reduce(alloy_graph *g, const char *op, alloy_tensor *l, alloy_reduction reduction)
{
    switch (reduction) {
    case ALLOY_REDUCTION_MEAN: return alloy_reduce_mean(g, l, 0, NULL, false);
    case ALLOY_REDUCTION_SUM: return alloy_reduce_sum(g, l, 0, NULL, false);
    case ALLOY_REDUCTION_NONE: return l;
    }
    if (g && !g->ir->status) ir_error(g->ir, ALLOY_ERR_INVALID, "%s: unknown reduction %d", op, (int)reduction);
    return NULL;
}

/* Whether reduction is one a loss takes (NONE only when none_ok); records the error. */
static bool reduction_ok(alloy_graph *g, const char *op, alloy_reduction reduction, bool none_ok)
{
    if (!g || g->ir->status) return false;
    if (reduction == ALLOY_REDUCTION_MEAN || reduction == ALLOY_REDUCTION_SUM || (none_ok && reduction == ALLOY_REDUCTION_NONE))
        return true;
    ir_error(g->ir, ALLOY_ERR_INVALID, "%s: reduction %d is not mean or sum%s", op, (int)reduction,
             none_ok ? " or none" : " (no per-position result yet)");
    return false;
}

static alloy_tensor *elementwise(alloy_graph *g, int op, alloy_tensor *a, alloy_tensor *b, int nattrs,
                                 const ir_attr *attrs, alloy_reduction reduction)
{
    if (!reduction_ok(g, ir_ops[op].name, reduction, true)) return NULL;
    alloy_tensor *xs[2] = {a, b};
    return reduce(g, ir_ops[op].name, graph_add_op(g, op, 2, xs, nattrs, attrs), reduction);
}

alloy_tensor *alloy_mse_loss(alloy_graph *g, alloy_tensor *input, alloy_tensor *target, alloy_reduction reduction)
{
    return elementwise(g, IR_OP_mse_loss, input, target, 0, NULL, reduction);
}

alloy_tensor *alloy_l1_loss(alloy_graph *g, alloy_tensor *input, alloy_tensor *target, alloy_reduction reduction)
{
    return elementwise(g, IR_OP_l1_loss, input, target, 0, NULL, reduction);
}

alloy_tensor *alloy_smooth_l1_loss(alloy_graph *g, alloy_tensor *input, alloy_tensor *target, double beta,
                                   alloy_reduction reduction)
{
    ir_attr a = ir_a_float("beta", beta);
    return elementwise(g, IR_OP_smooth_l1_loss, input, target, 1, &a, reduction);
}

alloy_tensor *alloy_binary_cross_entropy_with_logits(alloy_graph *g, alloy_tensor *logits, alloy_tensor *target,
                                                     alloy_tensor *pos_weight, alloy_reduction reduction)
{
    const char *op = "binary_cross_entropy_with_logits";
    if (!reduction_ok(g, op, reduction, true)) return NULL;
    if (!logits) { /* the builder's own message */
        alloy_tensor *xs[2] = {logits, target};
        return graph_add_op(g, IR_OP_binary_cross_entropy_with_logits, 2, xs, 0, NULL);
    }
    if (!pos_weight) pos_weight = alloy_constant(g, NODE(logits)->type.dtype, 0, NULL, (double[]){1});
    alloy_tensor *xs[3] = {logits, target, pos_weight};
    return reduce(g, op, graph_add_op(g, IR_OP_binary_cross_entropy_with_logits, 3, xs, 0, NULL), reduction);
}

/* cross_entropy or nll_loss: attributes only where they differ from "none
 * ignored, no smoothing, mean", so the default prints as before. */
static alloy_tensor *row_loss(alloy_graph *g, int op, alloy_tensor *x, alloy_tensor *targets, alloy_tensor *weight,
                              int64_t ignore_index, double label_smoothing, alloy_reduction reduction)
{
    if (!reduction_ok(g, ir_ops[op].name, reduction, false)) return NULL;
    ir_attr attrs[3];
    int n = 0;
    if (ignore_index != ALLOY_NO_IGNORE_INDEX) attrs[n++] = ir_a_int("ignore_index", ignore_index);
    if (label_smoothing != 0) attrs[n++] = ir_a_float("label_smoothing", label_smoothing);
    if (reduction == ALLOY_REDUCTION_SUM) attrs[n++] = ir_a_str("reduction", "sum");
    alloy_tensor *xs[3] = {x, targets, weight};
    return graph_add_op(g, op, weight ? 3 : 2, xs, n, attrs);
}

alloy_tensor *alloy_nll_loss(alloy_graph *g, alloy_tensor *log_probs, alloy_tensor *targets, alloy_tensor *weight,
                             int64_t ignore_index, alloy_reduction reduction)
{
    return row_loss(g, IR_OP_nll_loss, log_probs, targets, weight, ignore_index, 0, reduction);
}

alloy_tensor *alloy_cross_entropy_loss(alloy_graph *g, alloy_tensor *logits, alloy_tensor *targets,
                                       alloy_tensor *weight, int64_t ignore_index, double label_smoothing,
                                       alloy_reduction reduction)
{
    return row_loss(g, IR_OP_cross_entropy, logits, targets, weight, ignore_index, label_smoothing, reduction);
}
