/* typerules_norm.c - the type rules of batch_norm and group_norm. */
#include <math.h>
#include <string.h>

#include "ir/typerules.h"

/* Operand t is [C] of x's dtype (what: its role, for the message). */
static alloy_status channel_vector(const ir_type *t, const ir_type *x, int64_t c, const char *what, char *why,
                                   size_t whylen)
{
    if (t->rank != 1 || t->dims[0] != c) FAIL(ALLOY_ERR_SHAPE, "%s must have shape [%lld], one per channel", what, (long long)c);
    if (t->dtype != x->dtype)
        FAIL(ALLOY_ERR_DTYPE, "%s dtype %s differs from the input's %s", what, alloy_dtype_name(t->dtype),
             alloy_dtype_name(x->dtype));
    return ALLOY_OK;
}

/* x [N, C, ...] floating point, eps >= 0 */
static alloy_status channels_first(const ir_node *n, const ir_type *x, char *why, size_t whylen)
{
    if (!ir_is_float(x->dtype)) FAIL(ALLOY_ERR_DTYPE, "input must be floating point, not %s", alloy_dtype_name(x->dtype));
    if (x->rank < 2) FAIL(ALLOY_ERR_SHAPE, "input must be [N, C, ...] (rank >= 2), not rank %d", x->rank);
    CHECK_EPS(n);
    return ALLOY_OK;
}

/* (x [N, C, ...], running_mean [C], running_var [C][, weight [C], bias [C]]) -> x's type;
 * momentum in [0, 1]; training needs more than one value per channel (PyTorch's rule). */
RULE(ty_batch_norm)
{
    static const char *const roles[] = {"input", "running_mean", "running_var", "weight", "bias"};
    const ir_type *x = in[0];
    alloy_status st = channels_first(n, x, why, whylen);
    if (st) return st;
    if (n->nin == 4) FAIL(ALLOY_ERR_INVALID, "give both weight and bias, or neither");
    for (int i = 1; i < n->nin; i++)
        if ((st = channel_vector(in[i], x, x->dims[1], roles[i], why, whylen))) return st;
    double momentum = ir_attr_f(n, "momentum");
    if (!(momentum >= 0 && momentum <= 1)) FAIL(ALLOY_ERR_INVALID, "momentum must be in [0, 1], not %g", momentum);
    if (ir_attr_find(n, "training") && ir_attr_i(n, "training") && x->dims[1] > 0 && ir_numel(x) / x->dims[1] == 1)
        FAIL(ALLOY_ERR_SHAPE, "training needs more than one value per channel (input %lld x %lld)", (long long)x->dims[0],
             (long long)x->dims[1]);
    *out = *x;
    return ALLOY_OK;
}

/* (x [N, C, ...][, weight [C], bias [C]]) -> x's type; num_groups >= 1 divides C. */
RULE(ty_group_norm)
{
    const ir_type *x = in[0];
    alloy_status st = channels_first(n, x, why, whylen);
    if (st) return st;
    int64_t groups = ir_attr_i(n, "num_groups"), c = x->dims[1];
    if (groups < 1 || c % groups != 0)
        FAIL(ALLOY_ERR_INVALID, "num_groups %lld must be >= 1 and divide the %lld channels", (long long)groups, (long long)c);
    if (n->nin == 2) FAIL(ALLOY_ERR_INVALID, "give both weight and bias, or neither");
    for (int i = 1; i < n->nin; i++)
        if ((st = channel_vector(in[i], x, c, i == 1 ? "weight" : "bias", why, whylen))) return st;
    *out = *x;
    return ALLOY_OK;
}
