/* dump_api.c - alloy_graph_dump: the graph as built, as compiled, as a DOT picture or as a memory picture (the full library). */
#include "passes/inspect.h"
#include "runtime/graph/graph_impl.h"

alloy_status alloy_graph_dump(alloy_graph *g, FILE *out, alloy_dump_kind kind)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!out) return graph_fail(g, ALLOY_ERR_INVALID, "dump: out is NULL");
    if (kind < ALLOY_DUMP_SOURCE || kind > ALLOY_DUMP_MEMORY_SVG)
        return graph_fail(g, ALLOY_ERR_INVALID, "dump: unknown kind %d (ALLOY_DUMP_SOURCE, _IR, _DOT or _MEMORY_SVG)",
                          (int)kind);
    if (kind == ALLOY_DUMP_SOURCE) {
        ir_print(g->ir, out);
        return ALLOY_OK;
    }
    if (g->ir->status) return graph_built(g);
    alloy_status st = graph_compile(g);
    if (st) return st;
    char err[256] = "";
    if (kind == ALLOY_DUMP_IR) ir_print(g->compiled, out);
    else if (kind == ALLOY_DUMP_DOT) st = insp_dot(g->compiled, &g->comp.sched, out, err, sizeof err);
    else st = insp_memory_svg(g->compiled, &g->comp.sched, &g->comp.plan, out, err, sizeof err);
    return st ? graph_fail(g, st, "dump: %s", err) : ALLOY_OK;
}
