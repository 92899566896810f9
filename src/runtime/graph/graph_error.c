/* graph_error.c - the alloy_graph object's error record: graph_fail, the builder's first error, alloy_graph_status and alloy_last_error. */
#include <stdio.h>

#include "runtime/graph/graph_impl.h"

/* Copies a builder error g has not seen yet into g's record: it happened
 * after every failure recorded there (a later one would have copied it
 * first), so it is now the most recent. */
static void graph_error_sync(alloy_graph *g)
{
    if (!g->ir->status || g->builder_error_seen) return;
    g->builder_error_seen = true;
    g->status = g->ir->status;
    al_fmt(g->error, sizeof g->error, "%s", g->ir->error);
}

alloy_status graph_fail(alloy_graph *g, alloy_status status, const char *fmt, ...)
{
    graph_error_sync(g);
    g->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->error, sizeof g->error, fmt, ap);
    va_end(ap);
    return status;
}

alloy_status graph_built(alloy_graph *g)
{
    if (!g->ir->status) return ALLOY_OK;
    return graph_fail(g, g->ir->status, "%s", g->ir->error);
}

alloy_status alloy_graph_status(const alloy_graph *g)
{
    if (!g) return ALLOY_ERR_INVALID;
    graph_error_sync((alloy_graph *)(uintptr_t)g); /* the record is not part of the graph's value */
    return g->status;
}

const char *alloy_last_error(const alloy_graph *g)
{
    if (!g) return "no graph (NULL)";
    graph_error_sync((alloy_graph *)(uintptr_t)g);
    return g->status ? g->error : "";
}
