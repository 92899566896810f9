/* typerules_attention.c - the type rules of attention and attention_grad: rank-4 [B, H, T, D] operands of one float dtype. */
#include <math.h>

#include "ir/typerules.h"

static const char *const NAMES[] = {"q", "k", "v", "o", "do"};

/* q [B, H, T, D], k and v [B, H, S, D] of one float dtype, a finite scale;
 * operands 3 and 4 (attention_grad's o and do), when there, q's type. */
static alloy_status check(const ir_node *n, const ir_type *const *in, char *why, size_t whylen)
{
    double scale = ir_attr_f(n, "scale");
    if (!isfinite(scale)) FAIL(ALLOY_ERR_INVALID, "scale must be finite, not %g", scale);
    const ir_type *q = in[0];
    if (!ir_is_float(q->dtype)) FAIL(ALLOY_ERR_DTYPE, "q must be floating point, not %s", alloy_dtype_name(q->dtype));
    for (int j = 0; j < n->nin; j++) {
        if (in[j]->rank != 4)
            FAIL(ALLOY_ERR_SHAPE, "%s must be rank 4 [batch, heads, length, head_dim], not rank %d", NAMES[j], in[j]->rank);
        if (in[j]->dtype != q->dtype)
            FAIL(ALLOY_ERR_DTYPE, "%s is %s but q is %s; the operands share one dtype", NAMES[j],
                 alloy_dtype_name(in[j]->dtype), alloy_dtype_name(q->dtype));
        const ir_type *like = j == 2 ? in[1] : j >= 3 ? q : NULL;
        for (int d = 0; d < 4; d++) {
            bool same = like ? in[j]->dims[d] == like->dims[d] : d == 2 || in[j]->dims[d] == q->dims[d];
            if (!same)
                FAIL(ALLOY_ERR_SHAPE, "%s's dim %d is %lld but %s's is %lld", NAMES[j], d, (long long)in[j]->dims[d],
                     like == in[1] ? "k" : "q", (long long)(like ? like->dims[d] : q->dims[d]));
        }
    }
    return ALLOY_OK;
}

/* (q, k, v) -> [B, H, T, D], q's type. */
RULE(ty_attention)
{
    alloy_status st = check(n, in, why, whylen);
    if (st) return st;
    *out = *in[0];
    return ALLOY_OK;
}

/* (q, k, v, o, do) -> dq, dk, dv stacked along axis 2: [B, H, T + 2S, D]. */
RULE(ty_attention_grad)
{
    alloy_status st = check(n, in, why, whylen);
    if (st) return st;
    *out = *in[0];
    out->dims[2] = in[0]->dims[2] + 2 * in[1]->dims[2];
    return ALLOY_OK;
}
