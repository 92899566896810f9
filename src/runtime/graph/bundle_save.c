/* bundle_save.c - alloy_graph_save_bundle: a graph's compiled step written as a bundle (the full library: it runs the pass pipeline). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/bundle.h"
#include "runtime/bundle/bundle.h"
#include "runtime/graph/graph_impl.h"

/* opt_print's line of cfg without its newline (al_free it); NULL on OOM. */
static char *options_text(const al_options *cfg)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    opt_print(cfg, f);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    char *out = al_strdup(text); /* open_memstream's buffer comes from malloc, ours from al_malloc */
    free(text);
    if (out && strchr(out, '\n')) *strchr(out, '\n') = '\0';
    return out;
}

alloy_status alloy_graph_save_bundle(alloy_graph *g, const char *path, const char *archs)
{
    if (!g) return ALLOY_ERR_INVALID;
    g->status = ALLOY_OK;
    if (!path) return graph_fail(g, ALLOY_ERR_INVALID, "save_bundle: path is NULL");
    if (archs && *archs)
        return graph_fail(g, ALLOY_ERR_UNSUPPORTED,
                          "save_bundle %s: CUDA executables (archs '%s') are not written into bundles yet; pass "
                          "NULL for a CPU bundle",
                          path, archs);
    if (g->ir->status) return g->ir->status;
    alloy_status st = graph_compile_ir(g);
    if (st) return st;
    bundle_contents c = {.ir = g->compiled, .comp = g->comp, .seed = g->seed, .training = g->training,
                         .scaler_kind = (int)g->scaler.kind, .growth_interval = g->scaler.growth_interval,
                         .optimizer_kind = (int)g->optimizer.kind,
                         .accumulation_steps = g->optimizer.accumulation_steps};
    al_fmt(c.graph_name, sizeof c.graph_name, "%s", g->ir->name);
    if (strlen(g->ir->name) >= sizeof c.graph_name || strchr(g->ir->name, '\n'))
        return graph_fail(g, ALLOY_ERR_INVALID, "save_bundle %s: graph name over %zu bytes or with a newline", path,
                          sizeof c.graph_name - 1);
    c.options = options_text(&g->cfg);
    if (!c.options) return graph_fail(g, ALLOY_ERR_OOM, "save_bundle %s: out of memory", path);
    char err[1024];
    st = bundle_write_file(path, &c, err, sizeof err);
    al_free(c.options);
    return st ? graph_fail(g, st, "save_bundle: %s", err) : ALLOY_OK;
}
