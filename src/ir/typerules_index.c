/* typerules_index.c - the type rules of the indexing ops gather, index_select, arange, cumsum and their gradients. */
#include <math.h>
#include <string.h>

#include "ir/typerules.h"

/* The axis attribute of n for rank, normalized into *ax. */
static alloy_status axis_of(const ir_node *n, int rank, int *ax, char *why, size_t whylen)
{
    if (!ir_norm_axis(ir_attr_i(n, "axis"), rank, ax))
        FAIL(ALLOY_ERR_INVALID, "axis %lld out of range for rank %d", (long long)ir_attr_i(n, "axis"), rank);
    return ALLOY_OK;
}

/* gather (x [...], index: integers of x's rank, no larger than x but along
 * axis) -> x's dtype, index's shape (torch.gather). */
RULE(ty_gather)
{
    const ir_type *x = in[0], *index = in[1];
    int ax;
    if (!ir_is_int(index->dtype)) FAIL(ALLOY_ERR_DTYPE, "index must be i32 or i64, not %s", alloy_dtype_name(index->dtype));
    if (x->dtype == ALLOY_BOOL) FAIL(ALLOY_ERR_DTYPE, "input must be numeric, not bool");
    if (index->rank != x->rank) FAIL(ALLOY_ERR_SHAPE, "index must have the input's rank %d, not %d", x->rank, index->rank);
    if (x->rank == 0) FAIL(ALLOY_ERR_SHAPE, "input must have rank >= 1");
    alloy_status st = axis_of(n, x->rank, &ax, why, whylen);
    if (st) return st;
    for (int d = 0; d < x->rank; d++)
        if (d != ax && index->dims[d] > x->dims[d])
            FAIL(ALLOY_ERR_SHAPE, "index dim %d is %lld, more than the input's %lld", d, (long long)index->dims[d],
                 (long long)x->dims[d]);
    *out = *index;
    out->dtype = x->dtype;
    return ALLOY_OK;
}

/* index_select (x [...], index [K] integers) -> x with dim axis K. */
RULE(ty_index_select)
{
    const ir_type *x = in[0], *index = in[1];
    int ax;
    if (!ir_is_int(index->dtype)) FAIL(ALLOY_ERR_DTYPE, "index must be i32 or i64, not %s", alloy_dtype_name(index->dtype));
    if (x->dtype == ALLOY_BOOL) FAIL(ALLOY_ERR_DTYPE, "input must be numeric, not bool");
    if (index->rank != 1) FAIL(ALLOY_ERR_SHAPE, "index must have rank 1, not %d", index->rank);
    if (x->rank == 0) FAIL(ALLOY_ERR_SHAPE, "input must have rank >= 1");
    alloy_status st = axis_of(n, x->rank, &ax, why, whylen);
    if (st) return st;
    *out = *x;
    out->dims[ax] = index->dims[0];
    return ALLOY_OK;
}

/* arange: the declared dtype, [ceil((end - start) / step)]; finite
 * attributes, step != 0 pointing from start towards end (or start == end). */
RULE(ty_arange)
{
    (void)in;
    double start = ir_attr_f(n, "start"), end = ir_attr_f(n, "end"), step = ir_attr_f(n, "step");
    if ((unsigned)out->dtype >= ALLOY_DTYPE_COUNT || out->dtype == ALLOY_BOOL)
        FAIL(ALLOY_ERR_DTYPE, "the result must be numeric");
    if (!isfinite(start) || !isfinite(end) || !isfinite(step) || step == 0)
        FAIL(ALLOY_ERR_INVALID, "start %g, end %g and step %g must be finite with step != 0", start, end, step);
    double count = ceil((end - start) / step);
    if (count < 0) FAIL(ALLOY_ERR_INVALID, "step %g does not lead from start %g to end %g", step, start, end);
    if (!(count < 9.0e15)) FAIL(ALLOY_ERR_SHAPE, "%g elements are too many", count);
    out->rank = 1;
    out->dims[0] = (int64_t)count;
    return ALLOY_OK;
}

/* cumsum (x numeric, rank >= 1) -> x's type. */
RULE(ty_cumsum)
{
    int ax;
    if (in[0]->dtype == ALLOY_BOOL) FAIL(ALLOY_ERR_DTYPE, "operand must be numeric, not bool");
    if (in[0]->rank == 0) FAIL(ALLOY_ERR_SHAPE, "operand must have rank >= 1");
    alloy_status st = axis_of(n, in[0]->rank, &ax, why, whylen);
    if (st) return st;
    *out = *in[0];
    return ALLOY_OK;
}

/* (index, dy) -> the declared input type dx: gather's or index_select's
 * type rule of (dx, index) must give dy's type. */
static alloy_status scatter_grad(const ir_node *n, const ir_type *const *in, ir_type *out, ir_type_rule forward,
                                 char *why, size_t whylen)
{
    if (!ir_is_float(in[1]->dtype)) FAIL(ALLOY_ERR_DTYPE, "dy must be floating point");
    ir_type x = *out, y;
    x.dtype = in[1]->dtype;
    const ir_type *ins[2] = {&x, in[0]};
    alloy_status st = forward(n, ins, &y, why, whylen);
    if (st) return st;
    if (!ir_type_eq(&y, in[1])) FAIL(ALLOY_ERR_SHAPE, "dy does not have the forward result's shape");
    *out = x;
    return ALLOY_OK;
}

RULE(ty_gather_grad) { return scatter_grad(n, in, out, ty_gather, why, whylen); }
RULE(ty_index_select_grad) { return scatter_grad(n, in, out, ty_index_select, why, whylen); }
