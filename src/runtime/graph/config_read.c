/* config_read.c - a graph's configuration: the options struct from the environment and alloy_graph_set_option's record, filled once per compile (before the backend opens and the passes run). */
#include <stdlib.h>
#include <string.h>

#include "runtime/graph/graph_impl.h"

/* Whether option name was set through the API. */
static bool graph_option_set(const alloy_graph *g, const char *name)
{
    for (int i = 0; i < g->noptions; i++)
        if (strcmp(g->options[i].name, name) == 0) return true;
    return false;
}

alloy_status graph_options(alloy_graph *g, al_options *cfg)
{
    opt_init(cfg);
    char err[768];
    for (const opt_key *k = opt_keys; k->name; k++) {
        const char *v = getenv(k->env);
        if (!v || !*v || graph_option_set(g, k->name)) continue; /* the API's setting wins */
        alloy_status st = opt_set(cfg, k->name, v, err, sizeof err);
        if (st) return graph_fail(g, st, "%s: %s", k->env, err);
    }
    for (int i = 0; i < g->noptions; i++) {
        alloy_status st = opt_set(cfg, g->options[i].name, g->options[i].value, err, sizeof err);
        if (st) return graph_fail(g, st, "%s", err);
    }
    return ALLOY_OK;
}
