/* typerules_grad.c - the type rules of the gradient ops (softmax, normalization, cross-entropy and embedding gradients, row statistics). */
#include "ir/typerules.h"

/* (y, dy) of softmax / log_softmax: same type, the axis in range. */
RULE(ty_softmax_grad)
{
    if (!ir_type_eq(in[0], in[1])) FAIL(ALLOY_ERR_SHAPE, "y and dy must have the same type");
    return ty_softmax(n, in, out, why, whylen);
}

/* (x, dy[, gamma]) -> dx */
RULE(ty_layer_norm_grad)
{
    if (!ir_type_eq(in[0], in[1])) FAIL(ALLOY_ERR_SHAPE, "x and dy must have the same type");
    const ir_type *ins[3] = {in[0], n->nin > 2 ? in[2] : NULL, n->nin > 2 ? in[2] : NULL};
    ir_node fake = *n;
    fake.nin = n->nin > 2 ? 3 : 1;
    return ty_layer_norm(&fake, ins, out, why, whylen);
}

/* (x, dy[, gamma]) -> dx */
RULE(ty_rms_norm_grad)
{
    if (!ir_type_eq(in[0], in[1])) FAIL(ALLOY_ERR_SHAPE, "x and dy must have the same type");
    const ir_type *ins[2] = {in[0], n->nin > 2 ? in[2] : NULL};
    ir_node fake = *n;
    fake.nin = n->nin > 2 ? 2 : 1;
    return ty_rms_norm(&fake, ins, out, why, whylen);
}

/* x (float, rank >= 1) -> one value per row, [.., 1]: f32, or f64 for f64 x
 * (the compute type of x's row programs); eps, where the op has it, finite and >= 0 */
RULE(ty_row_stat)
{
    const ir_type *x = in[0];
    if (!ir_is_float(x->dtype)) FAIL(ALLOY_ERR_DTYPE, "input must be floating point");
    if (x->rank < 1) FAIL(ALLOY_ERR_SHAPE, "input must have rank >= 1");
    if (ir_attr_schema(n->op, "eps")) CHECK_EPS(n);
    *out = *x;
    out->dims[out->rank - 1] = 1;
    out->dtype = x->dtype == ALLOY_F64 ? ALLOY_F64 : ALLOY_F32;
    return ALLOY_OK;
}

/* x and dy of one type, and the count operands from in[2] (named names[])
 * of the type of x's kept statistics (ty_row_stat) */
static alloy_status kept_operands(const ir_node *n, const ir_type *const *in, const char *const *names, int count,
                                  char *why, size_t whylen)
{
    if (!ir_type_eq(in[0], in[1])) FAIL(ALLOY_ERR_SHAPE, "x and dy must have the same type");
    ir_type stat;
    alloy_status st = ty_row_stat(n, in, &stat, why, whylen);
    if (st) return st;
    for (int i = 0; i < count; i++)
        if (!ir_type_eq(in[2 + i], &stat)) {
            char want[96];
            ir_fmt_type(want, sizeof want, &stat);
            FAIL(ALLOY_ERR_SHAPE, "%s must be %s, one value per row of x", names[i], want);
        }
    return ALLOY_OK;
}

/* (x, dy, mean, rstd[, gamma]) -> dx */
RULE(ty_layer_norm_grad_stats)
{
    static const char *const names[] = {"mean", "rstd"};
    alloy_status st = kept_operands(n, in, names, 2, why, whylen);
    if (st) return st;
    const ir_type *ins[3] = {in[0], n->nin > 4 ? in[4] : NULL, n->nin > 4 ? in[4] : NULL};
    ir_node fake = *n;
    fake.nin = n->nin > 4 ? 3 : 1;
    return ty_layer_norm(&fake, ins, out, why, whylen);
}

/* (x, dy, rstd[, gamma]) -> dx */
RULE(ty_rms_norm_grad_stats)
{
    static const char *const names[] = {"rstd"};
    alloy_status st = kept_operands(n, in, names, 1, why, whylen);
    if (st) return st;
    const ir_type *ins[2] = {in[0], n->nin > 3 ? in[3] : NULL};
    ir_node fake = *n;
    fake.nin = n->nin > 3 ? 2 : 1;
    return ty_rms_norm(&fake, ins, out, why, whylen);
}

/* (logits, targets, dloss[, divisor[, weight]]) -> dlogits */
RULE(ty_cross_entropy_grad)
{
    ir_type loss;
    ir_node fake = *n;
    fake.nin = n->nin > 4 ? 3 : 2;
    const ir_type *ins[3] = {in[0], in[1], n->nin > 4 ? in[4] : NULL};
    alloy_status st = ty_cross_entropy(&fake, ins, &loss, why, whylen);
    if (st) return st;
    if (in[2]->rank != 0 || in[2]->dtype != in[0]->dtype)
        FAIL(ALLOY_ERR_SHAPE, "dloss must be a scalar of the logits' dtype");
    if (n->nin > 3 && (in[3]->rank != 0 || in[3]->dtype != in[0]->dtype))
        FAIL(ALLOY_ERR_SHAPE, "the divisor must be a scalar of the logits' dtype");
    *out = *in[0];
    return ALLOY_OK;
}

/* (ids [...], dy [..., D]) -> dtable, declared [rows, D] */
RULE(ty_embedding_grad)
{
    const ir_type *ids = in[0], *dy = in[1];
    if (!ir_is_int(ids->dtype)) FAIL(ALLOY_ERR_DTYPE, "ids must be i32 or i64");
    if (dy->rank != ids->rank + 1) FAIL(ALLOY_ERR_SHAPE, "dy must have rank(ids) + 1");
    for (int i = 0; i < ids->rank; i++)
        if (dy->dims[i] != ids->dims[i]) FAIL(ALLOY_ERR_SHAPE, "dy dim %d differs from ids", i);
    if (out->rank != 2 || out->dims[1] != dy->dims[dy->rank - 1] || out->dims[0] < 0)
        FAIL(ALLOY_ERR_SHAPE, "result must be declared [rows, %lld]", (long long)dy->dims[dy->rank - 1]);
    out->dtype = dy->dtype;
    return ALLOY_OK;
}
