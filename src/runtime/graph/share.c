/* share.c - alloy_graph_share_state: a graph's params and model state (batch_norm's running statistics) bound by name to another graph's storage and backend. */
#include <string.h>

#include "runtime/graph/graph_impl.h"

/* Fails share_state on g with the mismatch of param or state n (g's) and o (owner's). */
static alloy_status mismatch(alloy_graph *g, const alloy_graph *owner, const ir_node *n, const rt_state *o)
{
    char mine[96], theirs[96];
    ir_fmt_type(mine, sizeof mine, &n->type);
    ir_fmt_type(theirs, sizeof theirs, &o->type);
    return graph_fail(g, n->type.dtype != o->type.dtype ? ALLOY_ERR_DTYPE : ALLOY_ERR_SHAPE,
                      "share_state: %s '%s' is %s in graph '%s' but %s in graph '%s'; nothing was shared",
                      n->op == IR_OP_param ? "param" : "state", n->name,
                      mine, g->ir->name, theirs, owner->ir->name);
}

/* The op of name in g's graph as built (IR_OP_param, or IR_OP_state for
 * state the model built: batch_norm's running statistics, an IR `state`),
 * or -1: state the passes add (moments, counters, the scaler's) is in the
 * compiled graph only, and is never shared. */
static int built_op(const alloy_graph *g, const char *name)
{
    int id = ir_find_name(g->ir, name);
    if (id < 0) return -1;
    int op = (int)g->ir->nodes[id]->op;
    return op == IR_OP_param || op == IR_OP_state ? op : -1;
}

/* Checks that g can share with owner (both compiled, owner's state made
 * and its executable ready, the devices agreeing) and finds, for each
 * param and model-built state of g's compiled graph, owner's state tensor
 * of the same kind it binds to (from[i], NULL for none); counts the pairs,
 * the tensors without one, and the pairs g has no state tensor for yet. */
static alloy_status match_params(alloy_graph *g, alloy_graph *owner, rt_state **from, int *nshared, int *nunshared,
                                 int *nnew)
{
    const ir_graph *c = g->compiled;
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        if ((n->op != IR_OP_param && n->op != IR_OP_state) || built_op(g, n->name) != (int)n->op) continue;
        rt_state *o = state_find(owner, n->name);
        if (!o) {
            ++*nunshared;
            continue;
        }
        if (built_op(owner, n->name) != (int)n->op)
            return graph_fail(g, ALLOY_ERR_INVALID,
                              "share_state: %s '%s' of graph '%s' names state of graph '%s' that is not %s; "
                              "nothing was shared",
                              n->op == IR_OP_param ? "param" : "state", n->name, g->ir->name, owner->ir->name,
                              n->op == IR_OP_param ? "a param" : "state the model built");
        if (!ir_type_eq(&n->type, &o->type)) return mismatch(g, owner, n, o);
        from[i] = o;
        ++*nshared;
        *nnew += state_find(g, n->name) == NULL;
    }
    return ALLOY_OK;
}

/* Makes room for nnew more state tensors in g's list. */
static alloy_status reserve_state(alloy_graph *g, int nnew)
{
    if (g->nstate + nnew <= g->state_cap) return ALLOY_OK;
    int cap = g->nstate + nnew;
    rt_state *s = al_realloc(g->state, sizeof *s * (size_t)cap);
    if (!s) return graph_fail(g, ALLOY_ERR_OOM, "share_state: out of memory");
    g->state = s;
    g->state_cap = cap;
    return ALLOY_OK;
}

alloy_status alloy_graph_share_state(alloy_graph *g, alloy_graph *owner, int *shared, int *unshared)
{
    if (shared) *shared = 0;
    if (unshared) *unshared = 0;
    if (!g) return ALLOY_ERR_INVALID;
    if (!owner) return graph_fail(g, ALLOY_ERR_INVALID, "share_state: owner is NULL");
    if (g->ir->status) return graph_built(g);
    if (owner == g) return graph_fail(g, ALLOY_ERR_INVALID, "share_state: graph '%s' cannot share state with itself", g->ir->name);
    if (g->shares_state)
        return graph_fail(g, ALLOY_ERR_INVALID,
                          "share_state: graph '%s' already shares another graph's state; a graph shares state once, "
                          "with one owner",
                          g->ir->name);
    if (g->dev && g->dev->refs > 1)
        return graph_fail(g, ALLOY_ERR_INVALID,
                          "share_state: graph '%s' cannot take graph '%s''s state: %d other graph%s already share%s "
                          "its own; share %s with graph '%s' instead",
                          g->ir->name, owner->ir->name, g->dev->refs - 1, g->dev->refs == 2 ? "" : "s",
                          g->dev->refs == 2 ? "s" : "", g->dev->refs == 2 ? "it" : "each of them", owner->ir->name);
    if (owner->ir->status)
        return graph_fail(g, owner->ir->status, "share_state: graph '%s': %s", owner->ir->name, owner->ir->error);
    /* owner as its first run makes it: state, backend, executable (so a
     * device=auto fallback to the CPU happens before the backend is shared) */
    alloy_status st = state_ensure(owner);
    if (!st) st = graph_exec_ready(owner, NULL);
    if (st) return graph_fail(g, st, "share_state: graph '%s': %s", owner->ir->name, owner->error);
    if ((st = graph_compile_ir(g))) return st;
    rt_backend *to = graph_backend(owner);
    const char *want = g->cfg.device == OPT_DEVICE_CPU ? "cpu" : g->cfg.device == OPT_DEVICE_CUDA ? "cuda" : NULL;
    if (want && strcmp(want, to->ops->name) != 0)
        return graph_fail(g, ALLOY_ERR_INVALID,
                          "share_state: graph '%s' asks for device %s and graph '%s' runs on %s; graphs that share "
                          "state run on one device",
                          g->ir->name, want, owner->ir->name, to->ops->name);
    const ir_graph *c = g->compiled;
    rt_state **from = al_calloc((size_t)c->nnodes + 1, sizeof *from);
    char **names = al_calloc((size_t)c->nnodes + 1, sizeof *names);
    int nshared = 0, nunshared = 0, nnew = 0;
    if (!from || !names) st = graph_fail(g, ALLOY_ERR_OOM, "share_state: out of memory");
    if (!st) st = match_params(g, owner, from, &nshared, &nunshared, &nnew);
    if (!st) st = reserve_state(g, nnew);
    if (!st && !al_index_reserve(&g->state_slots, &g->state_slot_cap, g->nstate + nnew))
        st = graph_fail(g, ALLOY_ERR_OOM, "share_state: out of memory");
    for (int i = 0; !st && i < c->nnodes; i++)
        if (from[i] && !state_find(g, c->nodes[i]->name) && !(names[i] = al_strdup(c->nodes[i]->name)))
            st = graph_fail(g, ALLOY_ERR_OOM, "share_state: out of memory");
    /* g's own state moves to owner's backend (all or nothing); what ran on
     * g's backend (executable, input buffers) is made again by the next run */
    if (!st && g->dev && g->dev != owner->dev) {
        graph_drop_exec(g);
        if (!(st = state_move(g, to))) graph_release_device(g);
    }
    if (st) {
        for (int i = 0; names && i < c->nnodes; i++) al_free(names[i]);
        al_free(names), al_free(from);
        return st;
    }
    /* nothing fails from here on */
    if (!g->dev) {
        g->dev = owner->dev;
        g->dev->refs++;
        g->shares_state = true;
    }
    for (int i = 0; i < c->nnodes; i++) {
        if (!from[i]) continue;
        rt_state *mine = state_find(g, c->nodes[i]->name);
        if (mine) state_cell_release(g, mine->cell);
        else {
            mine = &g->state[g->nstate], *mine = (rt_state){.name = names[i], .type = c->nodes[i]->type};
            /* room was reserved above: this cannot fail */
            (void)al_index_add(&g->state_slots, &g->state_slot_cap, g->nstate, state_index_name, g, g->nstate);
            g->nstate++;
        }
        mine->cell = from[i]->cell;
        mine->cell->refs++;
    }
    al_free(names), al_free(from);
    g->state_ready = false; /* g's other params and state are made in owner's backend at its next use */
    if (shared) *shared = nshared;
    if (unshared) *unshared = nunshared;
    return ALLOY_OK;
}
