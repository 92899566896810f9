/* amp_api.c - the public AMP calls: enable_amp, list edits (API and environment), markers, report. */
#include <stdlib.h>
#include <string.h>

#include "passes/pass.h"
#include "runtime/graph/graph_impl.h"

alloy_status alloy_graph_enable_amp(alloy_graph *g, alloy_dtype dtype)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (dtype != ALLOY_F16 && dtype != ALLOY_BF16 && dtype != ALLOY_F32)
        return graph_fail(g, ALLOY_ERR_INVALID, "enable_amp: dtype must be f16, bf16 or f32 (off), not %s",
                          alloy_dtype_name(dtype));
    g->amp.dtype = dtype;
    graph_invalidate(g);
    return ALLOY_OK;
}

/* Sets or clears op's membership of the list with class cls in cfg. */
static alloy_status edit(amp_config *cfg, int cls, const char *op_name, bool add, char *err, size_t len)
{
    int op = op_name ? ir_op_lookup(op_name) : -1;
    if (op < 0) {
        al_fmt(err, len, "amp lists: unknown op '%s'", op_name ? op_name : "(NULL)");
        return ALLOY_ERR_NOT_FOUND;
    }
    if (add) cfg->lists[op] |= (uint8_t)(1u << cls);
    else cfg->lists[op] &= (uint8_t) ~(1u << cls);
    return ALLOY_OK;
}

static alloy_status api_edit(alloy_graph *g, alloy_amp_list list, const char *op, bool add)
{
    if (!g) return ALLOY_ERR_INVALID;
    int cls = graph_amp_list_class(list);
    if (cls < 0) return graph_fail(g, ALLOY_ERR_INVALID, "amp lists: unknown list %d", (int)list);
    char err[256];
    alloy_status st = edit(&g->amp, cls, op, add, err, sizeof err);
    if (st) return graph_fail(g, st, "%s", err);
    graph_invalidate(g);
    return ALLOY_OK;
}

alloy_status alloy_amp_lists_add(alloy_graph *g, alloy_amp_list list, const char *op)
{
    return api_edit(g, list, op, true);
}

alloy_status alloy_amp_lists_remove(alloy_graph *g, alloy_amp_list list, const char *op)
{
    return api_edit(g, list, op, false);
}

alloy_status alloy_amp_set_unlisted(alloy_graph *g, alloy_amp_list list)
{
    if (!g) return ALLOY_ERR_INVALID;
    int cls = graph_amp_list_class(list);
    if (cls < 0) return graph_fail(g, ALLOY_ERR_INVALID, "amp: unknown list %d", (int)list);
    g->amp.unlisted = (ir_amp_class)cls;
    graph_invalidate(g);
    return ALLOY_OK;
}

alloy_status graph_pass_options(alloy_graph *g, pass_options *opts)
{
    graph_env_warn_once(); /* the environment is read here: say what in it is not */
    memset(opts, 0, sizeof *opts);
    opts->amp = g->amp;
    opts->loss_seed = -1;
    for (int k = 0; k < graph_amp_env_count(); k++) {
        char var[64];
        bool add = k % 2 == 0;
        const char *val = getenv(graph_amp_env_name(k, var, sizeof var));
        if (!val || !*val) continue;
        char buf[1024];
        al_fmt(buf, sizeof buf, "%s", val);
        for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
            char err[256];
            alloy_status st = edit(&opts->amp, graph_amp_env_class(k), tok, add, err, sizeof err);
            if (st) return graph_fail(g, st, "%s=%s: %s", var, val, err);
        }
    }
    return ALLOY_OK;
}

static alloy_tensor *marker(alloy_graph *g, alloy_tensor *x, int op)
{
    if (!g || g->ir->status) return NULL;
    ir_node *n = (ir_node *)(void *)x;
    if (!n || n->id < 0 || n->id >= g->ir->nnodes || g->ir->nodes[n->id] != n) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "%s: operand is NULL or from another graph", ir_ops[op].name);
        return NULL;
    }
    ir_node *m = ir_add_node(g->ir, op, 1, &n->id, 0, NULL, NULL, NULL);
    if (m) graph_invalidate(g);
    return (alloy_tensor *)(void *)m;
}

alloy_tensor *alloy_amp_allow(alloy_graph *g, alloy_tensor *x) { return marker(g, x, IR_OP_amp_allow); }
alloy_tensor *alloy_amp_deny(alloy_graph *g, alloy_tensor *x) { return marker(g, x, IR_OP_amp_deny); }

alloy_status alloy_graph_amp_report(alloy_graph *g, alloy_amp_report *out)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!out) return graph_fail(g, ALLOY_ERR_INVALID, "amp_report: out is NULL");
    if (g->ir->status) return graph_built(g);
    alloy_status st = graph_compile(g);
    if (st) return st;
    *out = g->amp_report;
    return ALLOY_OK;
}

alloy_status alloy_graph_load_amp_stats(alloy_graph *g, const char *path)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!path || !*path) return graph_fail(g, ALLOY_ERR_INVALID, "load_amp_stats: path is NULL or empty");
    if (g->ir->status) return graph_built(g);
    alloy_status st = graph_compile(g);
    return st ? st : range_stats_load(g, path);
}

alloy_status alloy_amp_scope_push(alloy_graph *g, alloy_dtype dtype)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (dtype != ALLOY_F32 && dtype != ALLOY_F16 && dtype != ALLOY_BF16)
        return graph_fail(g, ALLOY_ERR_INVALID, "amp_scope_push: dtype must be f32, f16 or bf16, not %s",
                          (unsigned)dtype < ALLOY_DTYPE_COUNT ? alloy_dtype_name(dtype) : "unknown");
    if (g->amp_scopes == ALLOY_AMP_SCOPE_MAX)
        return graph_fail(g, ALLOY_ERR_INVALID, "amp_scope_push: scopes nest at most %d deep", ALLOY_AMP_SCOPE_MAX);
    g->amp_scope[g->amp_scopes++] = dtype == ALLOY_F32 ? AMP_DENY : AMP_ALLOW;
    return ALLOY_OK;
}

alloy_status alloy_amp_scope_pop(alloy_graph *g)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!g->amp_scopes) return graph_fail(g, ALLOY_ERR_INVALID, "amp_scope_pop: no scope was pushed");
    g->amp_scopes--;
    return ALLOY_OK;
}
