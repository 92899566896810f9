/* optim_api.c - the optimizer's settings after it was added: the learning rate between steps (no recompile) and parameter groups. */
#include <math.h>
#include <string.h>

#include "passes/pass.h"
#include "runtime/graph/graph_impl.h"

alloy_status alloy_graph_set_lr(alloy_graph *g, double lr)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!(isfinite(lr) && lr >= 0))
        return graph_fail(g, ALLOY_ERR_INVALID, "set_lr: lr is %g; it must be finite and >= 0", lr);
    if (!g->optimizer.kind)
        return graph_fail(g, ALLOY_ERR_INVALID, "set_lr: graph '%s' has no optimizer (alloy_graph_add_optimizer)",
                          g->ir->name);
    /* the rate lives in the state optim.lr, which the compiled step reads:
     * make it when the step is compiled but its state is not made yet (it
     * would start from the compiled default), then write it */
    alloy_status st = g->compiled && !g->state_ready ? state_ensure(g) : ALLOY_OK;
    if (st) return st;
    rt_state *s = state_find(g, STATE_BASE_LR);
    if (s && (st = state_write(g, s, &lr))) return st;
    g->optimizer.lr = lr; /* the initial value at a compile that makes the state */
    return ALLOY_OK;
}

/* Whether the glob item[0..len) matches a param of g as built. */
static bool matches_a_param(const alloy_graph *g, const char *item, size_t len)
{
    for (int i = 0; i < g->ir->nnodes; i++) {
        const ir_node *n = g->ir->nodes[i];
        if (n->op == IR_OP_param && pg_glob(item, len, n->name)) return true;
    }
    return false;
}

alloy_status alloy_graph_set_param_group(alloy_graph *g, const char *patterns, double lr_scale, bool weight_decay)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (g->ir->status) return graph_built(g);
    if (!patterns) return graph_fail(g, ALLOY_ERR_INVALID, "set_param_group: patterns is NULL");
    if (!(isfinite(lr_scale) && lr_scale >= 0))
        return graph_fail(g, ALLOY_ERR_INVALID, "set_param_group '%s': lr_scale is %g; it must be finite and >= 0",
                          patterns, lr_scale);
    const char *p = patterns, *item;
    size_t len;
    int nitems = 0;
    while (pg_next(&p, &item, &len)) {
        nitems++;
        if (!len)
            return graph_fail(g, ALLOY_ERR_INVALID, "set_param_group '%s': pattern %d is empty", patterns, nitems);
        if (!matches_a_param(g, item, len))
            return graph_fail(g, ALLOY_ERR_NOT_FOUND, "set_param_group: pattern '%.*s' matches no param of graph '%s'",
                              (int)len, item, g->ir->name);
    }
    if (!nitems) return graph_fail(g, ALLOY_ERR_INVALID, "set_param_group: no pattern given (\"\")");
    size_t end = strlen(patterns);
    while (end && patterns[end - 1] == ' ') end--;
    if (patterns[end - 1] == ',') /* a trailing comma: an empty last pattern, as an empty middle one is */
        return graph_fail(g, ALLOY_ERR_INVALID, "set_param_group '%s': pattern %d is empty", patterns, nitems + 1);
    const param_group *last = g->ngroups ? &g->groups[g->ngroups - 1] : NULL;
    if (last && strcmp(last->patterns, patterns) == 0 && last->lr_scale == lr_scale && last->decay == weight_decay)
        return ALLOY_OK; /* the same call again changes nothing: no second copy, no recompile */
    param_group *groups = al_realloc(g->groups, sizeof *groups * (size_t)(g->ngroups + 1));
    if (!groups) return graph_fail(g, ALLOY_ERR_OOM, "set_param_group '%s': out of memory", patterns);
    g->groups = groups;
    param_group *pg = &groups[g->ngroups];
    *pg = (param_group){.patterns = al_strdup(patterns), .lr_scale = lr_scale, .decay = weight_decay};
    if (!pg->patterns) return graph_fail(g, ALLOY_ERR_OOM, "set_param_group '%s': out of memory", patterns);
    g->ngroups++;
    graph_invalidate(g); /* lr_scale and decay are part of the compiled update */
    return ALLOY_OK;
}
