/* cpu.c - the CPU executor: runs a graph node by node, freeing values after their last use. */
#include <stdio.h>
#include <string.h>

#include "runtime/cpu.h"

alloy_status cpu_fail(cpu_exec *x, alloy_status status, const char *fmt, ...)
{
    if (x->status) return x->status;
    x->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->error, sizeof x->error, fmt, ap);
    va_end(ap);
    return status;
}

/* Leaves other than constants are bound by the caller (feeds, state). */
static bool owns_value(const ir_node *n) { return n->nin > 0 || n->op == IR_OP_constant; }

alloy_status cpu_run_graph(cpu_exec *x, const ir_graph *g, rt_tensor *values, const bool *keep)
{
    int *uses = al_calloc((size_t)g->nnodes + 1, sizeof(int));
    if (!uses) return cpu_fail(x, ALLOY_ERR_OOM, "out of memory planning a run of %d nodes", g->nnodes);
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++) uses[g->nodes[i]->in[j]]++;
    rt_tensor in_small[8];
    for (int i = 0; i < g->nnodes && !x->status; i++) {
        const ir_node *n = g->nodes[i];
        rt_tensor *v = &values[i];
        v->type = n->type;
        if (!owns_value(n)) {
            if (!v->data && ir_nbytes(&n->type))
                cpu_fail(x, ALLOY_ERR_NOT_FOUND, "%s '%s' has no value",
                         ir_ops[n->op].name, n->name ? n->name : "?");
            continue;
        }
        size_t bytes = ir_nbytes(&n->type);
        v->data = al_malloc(bytes ? bytes : 1);
        if (!v->data) {
            char t[96];
            ir_fmt_type(t, sizeof t, &n->type);
            cpu_fail(x, ALLOY_ERR_OOM, "out of memory allocating %zu bytes for %s %s", bytes,
                     ir_ops[n->op].name, t);
            break;
        }
        rt_tensor *in = n->nin <= 8 ? in_small : al_malloc(sizeof(rt_tensor) * (size_t)n->nin);
        if (!in) {
            cpu_fail(x, ALLOY_ERR_OOM, "out of memory running %s", ir_ops[n->op].name);
            break;
        }
        for (int j = 0; j < n->nin; j++) in[j] = values[n->in[j]];
        ir_ops[n->op].cpu(x, n, v, in);
        if (in != in_small) al_free(in);
        /* free operands whose last consumer this was */
        for (int j = 0; j < n->nin; j++) {
            int id = n->in[j];
            if (--uses[id] == 0 && !(keep && keep[id]) && owns_value(g->nodes[id])) {
                al_free(values[id].data);
                values[id].data = NULL;
            }
        }
    }
    al_free(uses);
    return x->status;
}

void cpu_release_values(const ir_graph *g, rt_tensor *values)
{
    for (int i = 0; i < g->nnodes; i++) {
        if (owns_value(g->nodes[i])) {
            al_free(values[i].data);
            values[i].data = NULL;
        }
    }
}
