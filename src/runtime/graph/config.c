/* config.c - a graph's options as alloy_graph_set_option records them (read into the options struct once per compile: config_read.c). */
#include <string.h>

#include "runtime/graph/graph_impl.h"

alloy_status alloy_graph_set_option(alloy_graph *g, const char *name, const char *value)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!value) value = "";
    al_options probe;
    opt_init(&probe);
    char err[768];
    alloy_status st = opt_set(&probe, name, value, err, sizeof err);
    if (st) return graph_fail(g, st, "set_option: %s", err);
    int i = 0;
    while (i < g->noptions && strcmp(g->options[i].name, name) != 0) i++;
    if (i < g->noptions && strcmp(g->options[i].value, value) == 0) return ALLOY_OK; /* unchanged: keep the compile */
    char *copy = al_strdup(value);
    if (!copy) return graph_fail(g, ALLOY_ERR_OOM, "set_option: out of memory");
    if (i == g->noptions) {
        graph_option *more = al_realloc(g->options, sizeof *more * (size_t)(g->noptions + 1));
        char *key = al_strdup(name);
        if (more) g->options = more;
        if (!more || !key) {
            al_free(copy), al_free(key);
            return graph_fail(g, ALLOY_ERR_OOM, "set_option: out of memory");
        }
        g->options[g->noptions++] = (graph_option){key, NULL};
    }
    al_free(g->options[i].value);
    g->options[i].value = copy;
    graph_invalidate(g);
    return ALLOY_OK;
}

void graph_options_free(alloy_graph *g)
{
    for (int i = 0; i < g->noptions; i++) al_free(g->options[i].name), al_free(g->options[i].value);
    al_free(g->options);
    g->options = NULL;
    g->noptions = 0;
}
