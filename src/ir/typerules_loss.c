/* typerules_loss.c - the type rules and attribute checks of the losses (smooth_l1_loss, the class weights and options of cross_entropy and nll_loss). */
#include <math.h>
#include <string.h>

#include "ir/typerules.h"

alloy_status ir_loss_attrs(const ir_node *n, const ir_type *logits, const ir_type *weight, char *why, size_t whylen)
{
    const char *reduction = ir_attr_str(n, "reduction", "mean");
    if (strcmp(reduction, "mean") != 0 && strcmp(reduction, "sum") != 0)
        FAIL(ALLOY_ERR_INVALID, "reduction must be \"mean\" or \"sum\", not \"%s\"", reduction);
    /* the row programs compare targets with it in the compute type: exact in f32 */
    const ir_attr *ignore = ir_attr_find(n, "ignore_index");
    if (ignore && (ignore->i < -(1 << 24) || ignore->i > (1 << 24)))
        FAIL(ALLOY_ERR_INVALID, "ignore_index %lld is not in [-2^24, 2^24]", (long long)ignore->i);
    double eps = ir_attr_f(n, "label_smoothing");
    if (!(eps >= 0 && eps <= 1)) FAIL(ALLOY_ERR_INVALID, "label_smoothing must be in [0, 1], not %g", eps);
    if (weight) {
        int64_t classes = logits->rank ? logits->dims[logits->rank - 1] : 1;
        if (weight->dtype != logits->dtype)
            FAIL(ALLOY_ERR_DTYPE, "weight must have the logits' dtype %s, not %s", alloy_dtype_name(logits->dtype),
                 alloy_dtype_name(weight->dtype));
        if (weight->rank != 1 || weight->dims[0] != classes)
            FAIL(ALLOY_ERR_SHAPE, "weight must be [%lld], one per class", (long long)classes);
    }
    return ALLOY_OK;
}

/* (input, target) -> the elementwise loss; beta >= 0 (0: l1_loss). */
alloy_status ty_smooth_l1(const ir_node *n, const ir_type *const *in, ir_type *out, char *why, size_t whylen)
{
    double beta = ir_attr_f(n, "beta");
    if (!(beta >= 0) || isinf(beta)) FAIL(ALLOY_ERR_INVALID, "beta must be finite and >= 0, not %g", beta);
    return ty_binary_float(n, in, out, why, whylen);
}

/* (x, z, pos_weight) -> the derivative by operand 0, 1 or 2. */
alloy_status ty_bce_grad(const ir_node *n, const ir_type *const *in, ir_type *out, char *why, size_t whylen)
{
    int64_t operand = ir_attr_i(n, "operand");
    if (operand < 0 || operand > 2) FAIL(ALLOY_ERR_INVALID, "operand must be 0, 1 or 2, not %lld", (long long)operand);
    return ty_ternary(n, in, out, why, whylen);
}
