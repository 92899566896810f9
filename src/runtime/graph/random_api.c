/* random_api.c - the builders of alloy/random.h: dropout, uniform, normal. */
#include "alloy/random.h"
#include "runtime/graph/graph_impl.h"

/* Random ops: the stream is the id the node gets, unique in the graph and
 * fixed once built (passes renumber nodes; the attribute stays). */
alloy_tensor *alloy_dropout(alloy_graph *g, alloy_tensor *x, double p)
{
    if (!g || g->ir->status) return NULL;
    ir_attr a[2] = {ir_a_float("p", p), ir_a_int("stream", g->ir->nnodes)};
    return graph_add_op(g, IR_OP_dropout, 1, &x, 2, a);
}

static alloy_tensor *draw(alloy_graph *g, int op, alloy_dtype dtype, int rank, const int64_t *dims, const char *an,
                          double a, const char *bn, double b)
{
    if (!g || g->ir->status) return NULL;
    ir_type t;
    if (!graph_declared_type(g, ir_ops[op].name, dtype, rank, dims, &t)) return NULL;
    ir_attr at[3] = {ir_a_float(an, a), ir_a_float(bn, b), ir_a_int("stream", g->ir->nnodes)};
    return graph_add_declared(g, op, 0, NULL, 3, at, &t);
}

alloy_tensor *alloy_uniform(alloy_graph *g, alloy_dtype dtype, int rank, const int64_t *dims, double low, double high)
{
    return draw(g, IR_OP_uniform, dtype, rank, dims, "low", low, "high", high);
}

alloy_tensor *alloy_normal(alloy_graph *g, alloy_dtype dtype, int rank, const int64_t *dims, double mean, double std)
{
    return draw(g, IR_OP_normal, dtype, rank, dims, "mean", mean, "std", std);
}
