/* compile_bundle.c - graph_compile_ir in liballoy-runtime, which has no pass pipeline: only a bundle's graph, compiled when it was loaded, runs (the full library has compile_ir.c instead). */
#include "runtime/graph/graph_impl.h"

alloy_status graph_compile_ir(alloy_graph *g)
{
    if (g->compiled) return ALLOY_OK; /* alloy_bundle_load set the bundle's compiled IR, schedule and plan */
    return graph_fail(g, ALLOY_ERR_UNSUPPORTED,
                      "graph '%s': liballoy-runtime runs bundles only and has no compiler; link liballoy to compile "
                      "graphs", g->ir->name);
}
