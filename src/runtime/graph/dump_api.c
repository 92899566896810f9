/* dump_api.c - alloy_graph_dump: the graph as built, as compiled, as a DOT picture or as a memory picture (the full library). */
#include <errno.h>
#include <string.h>

#include "passes/inspect.h"
#include "runtime/graph/graph_impl.h"

alloy_status alloy_graph_dump(alloy_graph *g, FILE *out, alloy_dump_kind kind)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!out) return graph_fail(g, ALLOY_ERR_INVALID, "dump: out is NULL");
    if (kind < ALLOY_DUMP_SOURCE || kind > ALLOY_DUMP_MEMORY_SVG)
        return graph_fail(g, ALLOY_ERR_INVALID, "dump: unknown kind %d (ALLOY_DUMP_SOURCE, _IR, _DOT or _MEMORY_SVG)",
                          (int)kind);
    alloy_status st = ALLOY_OK;
    char err[256] = "";
    if (kind == ALLOY_DUMP_SOURCE) {
        ir_print(g->ir, out);
    } else {
        if (g->ir->status) return graph_built(g);
        if ((st = graph_compile(g))) return st;
        if (kind == ALLOY_DUMP_IR) ir_print(g->compiled, out);
        else if (kind == ALLOY_DUMP_DOT) st = insp_dot(g->compiled, &g->comp.sched, out, err, sizeof err);
        else st = insp_memory_svg(g->compiled, &g->comp.sched, &g->comp.plan, out, err, sizeof err);
        if (st) return graph_fail(g, st, "dump: %s", err);
    }
    /* what stays in out's buffer is written now, so a full disk or a
     * closed descriptor is this call's error, not a silent loss */
    errno = 0;
    if (fflush(out) != 0 || ferror(out))
        return graph_fail(g, ALLOY_ERR_IO, "dump: writing graph '%s' failed: %s", g->ir->name,
                          errno ? strerror(errno) : "the stream has an error");
    return ALLOY_OK;
}
