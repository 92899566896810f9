/* norm_api.c - the builders of alloy/norm.h: batch_norm with its params and running statistics, group_norm. */
#include <stdio.h>

#include "alloy/norm.h"
#include "runtime/graph/graph_impl.h"

#define NODE(t) ((ir_node *)(void *)(t))
#define HANDLE(n) ((alloy_tensor *)(void *)(n))

/* A state leaf "<prefix><suffix>" [c] of dtype, zeros or ones; NULL with the error on g. */
static alloy_tensor *state(alloy_graph *g, const char *prefix, const char *suffix, alloy_dtype dtype, int64_t c, bool ones)
{
    char name[256];
    if (snprintf(name, sizeof name, "%s%s", prefix, suffix) >= (int)sizeof name) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "batch_norm: the name '%s' is too long", prefix);
        return NULL;
    }
    ir_type t = {.dtype = dtype, .rank = 1, .dims = {c}};
    ir_attr a = ir_a_str("init", ones ? "ones" : "zeros");
    ir_node *n = ir_add_node(g->ir, IR_OP_state, 0, NULL, 1, &a, &t, name);
    if (n) graph_invalidate(g);
    return HANDLE(n);
}

alloy_tensor *alloy_batch_norm(alloy_graph *g, alloy_tensor *x, const char *name, double momentum, double eps, bool affine)
{
    if (!g || g->ir->status) return NULL;
    if (!x || !name || !*name) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "batch_norm: %s", !x ? "x is NULL" : "a name is required");
        return NULL;
    }
    const ir_type *t = &NODE(x)->type;
    if (t->rank < 2) {
        ir_error(g->ir, ALLOY_ERR_SHAPE, "batch_norm '%s': input must be [N, C, ...] (rank >= 2), not rank %d", name, t->rank);
        return NULL;
    }
    int64_t c = t->dims[1];
    char pname[256];
    alloy_tensor *xs[5] = {x, state(g, name, ".running_mean", t->dtype, c, false), NULL, NULL, NULL};
    xs[2] = xs[1] ? state(g, name, ".running_var", t->dtype, c, true) : NULL;
    if (affine && xs[2]) {
        snprintf(pname, sizeof pname, "%s.weight", name);
        xs[3] = alloy_param(g, pname, t->dtype, 1, &c, alloy_init_ones());
        snprintf(pname, sizeof pname, "%s.bias", name);
        xs[4] = alloy_param(g, pname, t->dtype, 1, &c, alloy_init_zeros());
    }
    ir_attr a[2] = {ir_a_float("eps", eps), ir_a_float("momentum", momentum)};
    alloy_tensor *y = graph_add_op(g, IR_OP_batch_norm, affine ? 5 : 3, xs, 2, a);
    if (y && !ir_set_name(g->ir, NODE(y), name)) return y;
    return NULL;
}

alloy_tensor *alloy_group_norm(alloy_graph *g, alloy_tensor *x, int64_t num_groups, alloy_tensor *weight,
                               alloy_tensor *bias, double eps)
{
    if (g && !g->ir->status && !weight != !bias) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "group_norm: give both weight and bias, or neither");
        return NULL;
    }
    alloy_tensor *xs[3] = {x, weight, bias};
    ir_attr a[2] = {ir_a_int("num_groups", num_groups), ir_a_float("eps", eps)};
    return graph_add_op(g, IR_OP_group_norm, weight ? 3 : 1, xs, 2, a);
}
