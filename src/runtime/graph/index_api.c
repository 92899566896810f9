/* index_api.c - the builders of alloy/index.h: gather, index_select, arange, cumsum. */
#include "alloy/index.h"
#include "runtime/graph/graph_impl.h"

#define HANDLE(n) ((alloy_tensor *)(void *)(n))

alloy_tensor *alloy_gather(alloy_graph *g, alloy_tensor *x, int axis, alloy_tensor *index)
{
    alloy_tensor *xs[2] = {x, index};
    ir_attr a = ir_a_int("axis", axis);
    return graph_add_op(g, IR_OP_gather, 2, xs, 1, &a);
}

alloy_tensor *alloy_index_select(alloy_graph *g, alloy_tensor *x, int axis, alloy_tensor *index)
{
    alloy_tensor *xs[2] = {x, index};
    ir_attr a = ir_a_int("axis", axis);
    return graph_add_op(g, IR_OP_index_select, 2, xs, 1, &a);
}

alloy_tensor *alloy_arange(alloy_graph *g, double start, double end, double step, alloy_dtype dtype)
{
    if (!g || g->ir->status) return NULL;
    if ((unsigned)dtype >= ALLOY_DTYPE_COUNT) {
        ir_error(g->ir, ALLOY_ERR_DTYPE, "arange: unknown dtype %d", (int)dtype);
        return NULL;
    }
    ir_type t = {.dtype = dtype};
    ir_attr a[3] = {ir_a_float("start", start), ir_a_float("end", end), ir_a_float("step", step)};
    ir_node *n = ir_add_node(g->ir, IR_OP_arange, 0, NULL, 3, a, &t, NULL);
    if (n && g->amp_scopes) n->amp = g->amp_scope[g->amp_scopes - 1];
    if (n) graph_invalidate(g);
    return HANDLE(n);
}

alloy_tensor *alloy_cumsum(alloy_graph *g, alloy_tensor *x, int axis)
{
    ir_attr a = ir_a_int("axis", axis);
    return graph_add_op(g, IR_OP_cumsum, 1, &x, 1, &a);
}
