/* typerules_random.c - the type rules of the random ops (dropout, uniform, normal): their attributes and the optional step operand. */
#include <math.h>
#include <string.h>

#include "ir/typerules.h"

/* The attributes every random op has: stream in [0, 2^32) (a Philox counter
 * word), and the step operand, when given (the last one, operand `at`), an
 * integer scalar. */
static alloy_status common(const ir_node *n, const ir_type *const *in, int at, char *why, size_t whylen)
{
    int64_t stream = ir_attr_i(n, "stream");
    if (stream < 0 || stream > (int64_t)0xffffffff)
        FAIL(ALLOY_ERR_INVALID, "stream %lld is not in [0, 2^32)", (long long)stream);
    if (n->nin > at && (!ir_is_int(in[at]->dtype) || in[at]->rank != 0))
        FAIL(ALLOY_ERR_DTYPE, "the step (operand %d) must be an i32 or i64 scalar, not %s[rank %d]", at,
             alloy_dtype_name(in[at]->dtype), in[at]->rank);
    return ALLOY_OK;
}

RULE(ty_dropout)
{
    double p = ir_attr_f(n, "p");
    if (!(p >= 0 && p <= 1)) FAIL(ALLOY_ERR_INVALID, "p is %g; it must be in [0, 1]", p);
    if (!ir_is_float(in[0]->dtype))
        FAIL(ALLOY_ERR_DTYPE, "operand must be floating point, not %s", alloy_dtype_name(in[0]->dtype));
    alloy_status st = common(n, in, 1, why, whylen);
    if (st) return st;
    *out = *in[0];
    return ALLOY_OK;
}

/* uniform and normal: the declared type (a float dtype) and finite
 * parameters: low <= high, std >= 0. */
RULE(ty_random)
{
    alloy_status st = ty_declared(n, in, out, why, whylen);
    if (st) return st;
    if (!ir_is_float(out->dtype)) FAIL(ALLOY_ERR_DTYPE, "the result must be floating point, not %s", alloy_dtype_name(out->dtype));
    if (n->op == IR_OP_uniform) {
        double lo = ir_attr_f(n, "low"), hi = ir_attr_f(n, "high");
        if (!isfinite(lo) || !isfinite(hi) || lo > hi) FAIL(ALLOY_ERR_INVALID, "low %g and high %g must be finite with low <= high", lo, hi);
    } else {
        double mean = ir_attr_f(n, "mean"), std = ir_attr_f(n, "std");
        if (!isfinite(mean) || !isfinite(std) || std < 0) FAIL(ALLOY_ERR_INVALID, "mean %g and std %g must be finite with std >= 0", mean, std);
    }
    return common(n, in, 0, why, whylen);
}
