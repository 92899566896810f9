/* train_api.c - the public training calls: loss, training switch, input gradients, frozen params. */
#include <string.h>

#include "runtime/graph_impl.h"

/* The node behind handle t when it belongs to g, else NULL with an error. */
static ir_node *own_node(alloy_graph *g, alloy_tensor *t, const char *what)
{
    ir_node *n = (ir_node *)(void *)t;
    if (!n || n->id < 0 || n->id >= g->ir->nnodes || g->ir->nodes[n->id] != n) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "%s: tensor is NULL or from another graph", what);
        return NULL;
    }
    return n;
}

alloy_status alloy_graph_set_loss(alloy_graph *g, alloy_tensor *loss)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (g->ir->status) return g->ir->status;
    ir_node *n = own_node(g, loss, "set_loss");
    if (!n) return g->ir->status;
    if (n->type.rank != 0 || !ir_is_float(n->type.dtype)) {
        char t[96], label[64];
        ir_fmt_type(t, sizeof t, &n->type);
        return ir_error(g->ir, ALLOY_ERR_SHAPE, "set_loss: the loss must be a floating-point scalar; %s %s is %s",
                        ir_ops[n->op].name, ir_node_label(n, label, sizeof label), t);
    }
    g->ir->loss = n->id;
    g->training = true;
    graph_invalidate(g);
    return ALLOY_OK;
}

alloy_status alloy_graph_set_training(alloy_graph *g, bool training)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (training && g->ir->loss < 0)
        return graph_fail(g, ALLOY_ERR_INVALID, "set_training: graph '%s' has no loss", g->ir->name);
    g->training = training;
    graph_invalidate(g);
    return ALLOY_OK;
}

alloy_status alloy_graph_request_grad(alloy_graph *g, alloy_tensor *input)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (g->ir->status) return g->ir->status;
    ir_node *n = own_node(g, input, "request_grad");
    if (!n) return g->ir->status;
    if (n->op != IR_OP_input || !ir_is_float(n->type.dtype))
        return ir_error(g->ir, ALLOY_ERR_INVALID, "request_grad: '%s' is not a floating-point input",
                        n->name ? n->name : ir_ops[n->op].name);
    char **names = al_realloc(g->grad_inputs, sizeof(char *) * (size_t)(g->ngrad_inputs + 1));
    if (!names) return ir_error(g->ir, ALLOY_ERR_OOM, "request_grad: out of memory");
    g->grad_inputs = names;
    if (!(names[g->ngrad_inputs] = al_strdup(n->name)))
        return ir_error(g->ir, ALLOY_ERR_OOM, "request_grad: out of memory");
    g->ngrad_inputs++;
    graph_invalidate(g);
    return ALLOY_OK;
}

alloy_status alloy_param_freeze(alloy_graph *g, alloy_tensor *param)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (g->ir->status) return g->ir->status;
    ir_node *n = own_node(g, param, "param_freeze");
    if (!n) return g->ir->status;
    if (n->op != IR_OP_param)
        return ir_error(g->ir, ALLOY_ERR_INVALID, "param_freeze: '%s' is not a param",
                        n->name ? n->name : ir_ops[n->op].name);
    if (ir_attr_int(n, "frozen", 0)) return ALLOY_OK;
    ir_attr *attrs = al_arena_alloc(&g->ir->arena, sizeof(ir_attr) * (size_t)(n->nattrs + 1));
    if (!attrs) return ir_error(g->ir, ALLOY_ERR_OOM, "param_freeze: out of memory");
    memcpy(attrs, n->attrs, sizeof(ir_attr) * (size_t)n->nattrs);
    attrs[n->nattrs] = ir_a_bool("frozen", true);
    n->attrs = attrs;
    n->nattrs++;
    graph_invalidate(g);
    return ALLOY_OK;
}
