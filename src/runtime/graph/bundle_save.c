/* bundle_save.c - alloy_graph_save_bundle: a graph's compiled step written as a bundle, with its CUDA executable compiled by NVRTC for the architectures asked for (the full library: it runs the pass pipeline and NVRTC). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/bundle.h"
#include "codegen/export.h"
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

/* Adds bin, compiled for module m, to x's images, unless m already has its
 * target (two architectures NVRTC builds the same PTX for). */
static alloy_status add_image(bundle_cuda *x, const cg_binary *bin, uint32_t m)
{
    uint32_t kind = bin->kind == CG_CUBIN ? BUNDLE_CUBIN : BUNDLE_PTX;
    for (int i = 0; i < x->nimages; i++)
        if (x->images[i].module == m && x->images[i].kind == kind && x->images[i].arch == (uint32_t)bin->arch)
            return ALLOY_OK;
    uint8_t *data = al_malloc(bin->size);
    if (!data) return ALLOY_ERR_OOM;
    memcpy(data, bin->data, bin->size);
    x->images[x->nimages++] = (bundle_image){kind, (uint32_t)bin->arch, m, data, bin->size};
    return ALLOY_OK;
}

/* g's CUDA executable for archs ("sm_80,sm_90") into x: its kernels
 * (cg_emit) in modules (cg_module_range), each compiled by NVRTC to a cubin
 * per architecture (PTX for the newest below where NVRTC has none) and to
 * PTX for the lowest architecture, which newer GPUs' drivers compile; the
 * driver version that PTX needs is NVRTC's. No GPU is needed. A step with
 * no kernel (every step a library call) gives no images. */
static alloy_status cuda_images(alloy_graph *g, const char *path, const char *archs, bundle_cuda *x)
{
    int sms[CG_MAX_ARCHS], nsms, lowest = 0;
    char msg[1024];
    alloy_status st = cg_parse_archs(archs, sms, CG_MAX_ARCHS, &nsms, msg, sizeof msg);
    if (st) return graph_fail(g, st, "save_bundle %s: %s", path, msg);
    for (int i = 0; i < nsms; i++) lowest = !lowest || sms[i] < lowest ? sms[i] : lowest;
    cg_nvrtc *nv = NULL;
    if ((st = cg_nvrtc_open(g->cfg.nvrtc[0] ? g->cfg.nvrtc : NULL, &nv, msg, sizeof msg)))
        return graph_fail(g, st, "save_bundle %s: the CUDA executables for %s need NVRTC: %s", path, archs, msg);
    cg_program prog;
    if ((st = cg_emit(g->compiled, &g->comp.sched, &prog, msg, sizeof msg))) {
        cg_nvrtc_close(nv);
        return graph_fail(g, st, "save_bundle %s: %s", path, msg);
    }
    int nmodules = cg_module_count(prog.nkernels), per = nsms + 1, n = nmodules * per;
    char (*names)[32] = al_calloc((size_t)nmodules + 1, 32), **sources = al_calloc((size_t)nmodules + 1, sizeof *sources);
    cg_kernel_src *ks = al_calloc((size_t)n + 1, sizeof *ks);
    cg_binary *bins = al_calloc((size_t)n + 1, sizeof *bins);
    x->images = al_calloc((size_t)n + 1, sizeof *x->images);
    st = names && sources && ks && bins && x->images ? ALLOY_OK : ALLOY_ERR_OOM;
    for (int m = 0; !st && m < nmodules; m++) {
        int first, count;
        cg_module_range(prog.nkernels, m, &first, &count);
        cg_module_name(m, names[m], 32);
        if (!(sources[m] = cg_module_source(&prog, first, count))) st = ALLOY_ERR_OOM;
        for (int t = 0; t < per; t++)
            ks[m * per + t] = (cg_kernel_src){.name = names[m], .source = sources[m],
                                              .sm = t < nsms ? sms[t] : lowest, .ptx = t == nsms};
    }
    if (st) graph_fail(g, st, "save_bundle %s: out of memory compiling the CUDA executable", path);
    else if ((st = cg_nvrtc_compile_many(nv, ks, n, g->cfg.num_threads, NULL, bins))) {
        int bad = 0;
        while (bad < n - 1 && !bins[bad].status) bad++;
        graph_fail(g, st, "save_bundle %s: %s", path, bins[bad].message ? bins[bad].message : "NVRTC failed");
    }
    for (int i = 0; !st && i < n; i++)
        if ((st = add_image(x, &bins[i], (uint32_t)(i / per))))
            graph_fail(g, st, "save_bundle %s: out of memory keeping the CUDA executable", path);
    if (!st) {
        int major, minor;
        cg_nvrtc_version(nv, &major, &minor);
        x->min_driver = (uint32_t)(1000 * major + 10 * minor);
        x->nmodules = (uint32_t)nmodules;
    }
    for (int i = 0; bins && i < n; i++) cg_binary_free(&bins[i]);
    for (int m = 0; sources && m < nmodules; m++) al_free(sources[m]);
    al_free(names), al_free(sources), al_free(ks), al_free(bins);
    cg_program_free(&prog);
    cg_nvrtc_close(nv);
    if (st || !x->nimages) bundle_cuda_free(x);
    return st;
}

alloy_status alloy_graph_save_bundle(alloy_graph *g, const char *path, const char *archs)
{
    if (!g) return ALLOY_ERR_INVALID;
    g->status = ALLOY_OK;
    if (!path) return graph_fail(g, ALLOY_ERR_INVALID, "save_bundle: path is NULL");
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
    if (archs && *archs && (st = cuda_images(g, path, archs, &c.cuda))) return st;
    c.options = options_text(&g->cfg);
    if (!c.options) {
        bundle_cuda_free(&c.cuda);
        return graph_fail(g, ALLOY_ERR_OOM, "save_bundle %s: out of memory", path);
    }
    char err[1024];
    st = bundle_write_file(path, &c, err, sizeof err);
    al_free(c.options);
    bundle_cuda_free(&c.cuda);
    return st ? graph_fail(g, st, "save_bundle: %s", err) : ALLOY_OK;
}
