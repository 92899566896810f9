/* cuda_api.c - alloy_graph_export_cuda: the graph compiled with the GPU's choices, NVRTC loaded, the options applied, the export written (codegen/export.c). */
#include <stdlib.h>
#include <string.h>

#include "codegen/cache.h"
#include "codegen/export.h"
#include "runtime/graph/graph_impl.h"

alloy_status graph_cache_dir(alloy_graph *g, const al_options *cfg, char *out, size_t len)
{
    alloy_status st = cg_cache_default_dir(cfg->cache_dir, getenv("XDG_CACHE_HOME"), getenv("HOME"), out, len);
    if (st == ALLOY_ERR_INVALID)
        return graph_fail(g, st, "the kernel cache directory (cache_dir, ALLOY_CACHE_DIR, XDG_CACHE_HOME or HOME) "
                                 "is longer than %zu bytes", len - 1);
    return ALLOY_OK; /* ALLOY_ERR_NOT_FOUND: out is "", a cache in memory only */
}

/* The export of g's compiled step for the architectures sms[0..nsms) into dir. */
static alloy_status export_compiled(alloy_graph *g, const int *sms, int nsms, const char *dir)
{
    char msg[1024];
    alloy_status st;
    char cache_dir[OPT_PATH_MAX + 16] = "";
    if (g->cfg.cache && (st = graph_cache_dir(g, &g->cfg, cache_dir, sizeof cache_dir))) return st;
    cg_nvrtc *nv;
    if ((st = cg_nvrtc_open(g->cfg.nvrtc[0] ? g->cfg.nvrtc : NULL, &nv, msg, sizeof msg)))
        return graph_fail(g, st, "export_cuda: NVRTC is not available, and alloy compiles CUDA kernels with it: %s",
                          msg);
    size_t errlen = 16384; /* room for NVRTC's log; g keeps what fits */
    char *err = al_malloc(errlen);
    if (!err) {
        cg_nvrtc_close(nv);
        return graph_fail(g, ALLOY_ERR_OOM, "export_cuda: out of memory");
    }
    cg_export_options o = {.archs = sms, .narchs = nsms, .dir = dir, .cache = g->cfg.cache, .cache_dir = cache_dir,
                           .dump_dir = g->cfg.dump_dir, .nthreads = g->cfg.num_threads};
    st = cg_export(g->compiled, &g->comp.sched, nv, &o, NULL, err, errlen);
    if (st) graph_fail(g, st, "export_cuda: graph '%s' to %s: %s", g->ir->name, dir, err);
    al_free(err);
    cg_nvrtc_close(nv);
    return st;
}

alloy_status alloy_graph_export_cuda(alloy_graph *g, const char *archs, const char *dir)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (g->ir->status) return graph_built(g);
    if (!dir || !*dir) return graph_fail(g, ALLOY_ERR_INVALID, "export_cuda: no output directory given");
    int sms[CG_MAX_ARCHS], nsms;
    char msg[1024];
    alloy_status st = cg_parse_archs(archs, sms, CG_MAX_ARCHS, &nsms, msg, sizeof msg);
    if (st) return graph_fail(g, st, "export_cuda: %s", msg);
    bool own; /* the GPU's plan (device=auto), dropped again after if made for the export */
    if ((st = graph_compile_for_gpu(g, &own))) return st;
    st = export_compiled(g, sms, nsms, dir);
    if (own) graph_invalidate(g);
    return st;
}
