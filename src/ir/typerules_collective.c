/* typerules_collective.c - the type rules of the collectives (all_reduce, reduce_scatter, all_gather) and the loss-scaling checks (found_inf, sum_squares). */
#include <string.h>

#include "ir/typerules.h"

/* x -> x's type, reduce "sum" (numeric x, the default) or "max" */
RULE(ty_all_reduce)
{
    const char *reduce = ir_attr_str(n, "reduce", "sum");
    if (strcmp(reduce, "sum") != 0 && strcmp(reduce, "max") != 0)
        FAIL(ALLOY_ERR_INVALID, "reduce must be \"sum\" or \"max\", not \"%s\"", reduce);
    if (strcmp(reduce, "sum") == 0 && in[0]->dtype == ALLOY_BOOL) FAIL(ALLOY_ERR_DTYPE, "a sum of bools: use reduce=\"max\"");
    *out = *in[0];
    return ALLOY_OK;
}

/* the world attribute of a reduce_scatter / all_gather and its 1-D numeric
 * operand, checked */
static alloy_status world_operand(const ir_node *n, const ir_type *x, int64_t *world, char *err, size_t errlen)
{
    *world = ir_attr_i(n, "world");
    if (*world < 1 || *world > 1 << 20) {
        al_fmt(err, errlen, "world must be 1 to %d ranks, not %lld", 1 << 20, (long long)*world);
        return ALLOY_ERR_INVALID;
    }
    if (x->rank != 1) {
        al_fmt(err, errlen, "operand must be 1-D (a flat bucket), not rank %d", x->rank);
        return ALLOY_ERR_SHAPE;
    }
    if (x->dtype == ALLOY_BOOL) {
        al_fmt(err, errlen, "operand must be numeric, not bool");
        return ALLOY_ERR_DTYPE;
    }
    return ALLOY_OK;
}

/* x[n] -> x's dtype [n / world]: this rank's shard of the sum over the ranks */
RULE(ty_reduce_scatter)
{
    int64_t world;
    alloy_status st = world_operand(n, in[0], &world, why, whylen);
    if (st) return st;
    if (in[0]->dims[0] % world)
        FAIL(ALLOY_ERR_SHAPE, "%lld elements do not split into %lld equal shards (pad the bucket to a multiple)",
             (long long)in[0]->dims[0], (long long)world);
    *out = *in[0];
    out->dims[0] = in[0]->dims[0] / world;
    return ALLOY_OK;
}

/* x[n] -> x's dtype [world * n]: every rank's x in rank order */
RULE(ty_all_gather)
{
    int64_t world;
    alloy_status st = world_operand(n, in[0], &world, why, whylen);
    if (st) return st;
    if (in[0]->dims[0] > INT64_MAX / world) FAIL(ALLOY_ERR_SHAPE, "the gathered size overflows");
    *out = *in[0];
    out->dims[0] = in[0]->dims[0] * world;
    return ALLOY_OK;
}

/* any number of floating-point tensors -> bool scalar */
RULE(ty_found_inf)
{
    for (int i = 0; i < n->nin; i++)
        if (!ir_is_float(in[i]->dtype)) FAIL(ALLOY_ERR_DTYPE, "operand %d must be floating point", i);
    out->dtype = ALLOY_BOOL;
    out->rank = 0;
    return ALLOY_OK;
}

/* any number of f32 tensors -> f64 scalar */
RULE(ty_sum_squares)
{
    for (int i = 0; i < n->nin; i++)
        if (in[i]->dtype != ALLOY_F32) FAIL(ALLOY_ERR_DTYPE, "operand %d must be f32, not %s", i, alloy_dtype_name(in[i]->dtype));
    out->dtype = ALLOY_F64;
    out->rank = 0;
    return ALLOY_OK;
}
