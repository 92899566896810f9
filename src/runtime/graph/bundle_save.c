/* bundle_save.c - alloy_graph_save_bundle: a graph's compiled step written as a bundle, with its CUDA executable compiled by NVRTC for the architectures asked for (the full library: it runs the pass pipeline and NVRTC). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloy/bundle.h"
#include "base/file.h"
#include "codegen/cache.h"
#include "codegen/export.h"
#include "runtime/bundle/bundle.h"
#include "runtime/graph/bundle_save.h"
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

/* Kernels the cache of one save keeps in memory (the disk holds the rest). */
#define BUNDLE_MEM_CACHE (64u << 20)

/* The default image builder: every module compiled by NVRTC to a cubin per
 * architecture of archs (PTX for the newest below where NVRTC has none) and
 * to PTX for the lowest architecture, which newer GPUs' drivers compile,
 * through the kernel cache unless cfg turns it off; the driver version
 * that PTX needs is NVRTC's. No GPU is needed. */
static alloy_status nvrtc_images(const al_options *cfg, const char *archs, int nmodules, const char *const *names,
                                 const char *const *sources, bundle_cuda *x, char *err, size_t errlen)
{
    int sms[CG_MAX_ARCHS], nsms, lowest = 0;
    char msg[1024];
    alloy_status st = cg_parse_archs(archs, sms, CG_MAX_ARCHS, &nsms, msg, sizeof msg);
    if (st) {
        al_fmt(err, errlen, "%s", msg);
        return st;
    }
    for (int i = 0; i < nsms; i++) lowest = !lowest || sms[i] < lowest ? sms[i] : lowest;
    cg_nvrtc *nv = NULL;
    if ((st = cg_nvrtc_open(cfg->nvrtc[0] ? cfg->nvrtc : NULL, &nv, msg, sizeof msg))) {
        al_fmt(err, errlen, "the CUDA executables for %s need NVRTC: %s", archs, msg);
        return st;
    }
    /* through the kernel cache as the CUDA backend's compiles are: a
     * second save of the same step compiles nothing */
    cg_cache *cache = NULL;
    char dir[OPT_PATH_MAX + 16] = "";
    if (cfg->cache) {
        st = cg_cache_default_dir(cfg->cache_dir, getenv("XDG_CACHE_HOME"), getenv("HOME"), dir, sizeof dir);
        if (st == ALLOY_ERR_INVALID) {
            al_fmt(err, errlen, "the kernel cache directory is longer than %zu bytes", sizeof dir - 1);
            cg_nvrtc_close(nv);
            return st;
        }
        if ((st = cg_cache_open(*dir ? dir : NULL, BUNDLE_MEM_CACHE, CG_CACHE_DISK_BOUND, &cache, msg, sizeof msg))) {
            al_fmt(err, errlen, "the kernel cache: %s", msg);
            cg_nvrtc_close(nv);
            return st;
        }
    }
    int per = nsms + 1, n = nmodules * per;
    cg_kernel_src *ks = al_calloc((size_t)n + 1, sizeof *ks);
    cg_binary *bins = al_calloc((size_t)n + 1, sizeof *bins);
    x->images = al_calloc((size_t)n + 1, sizeof *x->images);
    st = ks && bins && x->images ? ALLOY_OK : ALLOY_ERR_OOM;
    for (int m = 0; !st && m < nmodules; m++)
        for (int t = 0; t < per; t++)
            ks[m * per + t] = (cg_kernel_src){.name = names[m], .source = sources[m],
                                              .sm = t < nsms ? sms[t] : lowest, .ptx = t == nsms};
    if (st) al_fmt(err, errlen, "out of memory compiling the CUDA executable");
    else if ((st = cache ? cg_cache_compile_many(cache, nv, ks, n, cfg->num_threads, NULL, bins)
                         : cg_nvrtc_compile_many(nv, ks, n, cfg->num_threads, NULL, bins))) {
        int bad = 0;
        while (bad < n - 1 && !bins[bad].status) bad++;
        al_fmt(err, errlen, "%s", bins[bad].message ? bins[bad].message : "NVRTC failed");
    }
    for (int i = 0; !st && i < n; i++)
        if ((st = add_image(x, &bins[i], (uint32_t)(i / per))))
            al_fmt(err, errlen, "out of memory keeping the CUDA executable");
    if (!st) {
        int major, minor;
        cg_nvrtc_version(nv, &major, &minor);
        x->min_driver = (uint32_t)(1000 * major + 10 * minor);
    }
    for (int i = 0; bins && i < n; i++) cg_binary_free(&bins[i]);
    al_free(ks), al_free(bins);
    cg_cache_close(cache);
    cg_nvrtc_close(nv);
    return st;
}

static bundle_image_builder image_builder = nvrtc_images;

bundle_image_builder bundle_set_image_builder(bundle_image_builder builder)
{
    bundle_image_builder old = image_builder;
    image_builder = builder ? builder : nvrtc_images;
    return old;
}

alloy_status bundle_kernel_table(const cg_program *prog, bundle_cuda *x)
{
    int n = prog->nkernels;
    cg_program *t = &x->prog;
    t->kernels = al_calloc((size_t)n + 1, sizeof *t->kernels);
    x->module_of = al_calloc((size_t)n + 1, sizeof *x->module_of);
    t->skipped = al_calloc((size_t)prog->nskipped + 1, sizeof *t->skipped);
    t->why = al_calloc((size_t)prog->nskipped + 1, sizeof *t->why);
    if (!t->kernels || !x->module_of || !t->skipped || !t->why) return ALLOY_ERR_OOM;
    x->has_kernels = true;
    for (int m = 0; m < (int)x->nmodules; m++) {
        int first, count;
        cg_module_range(n, m, &first, &count);
        for (int q = first; q < first + count; q++) x->module_of[q] = (uint32_t)m;
    }
    for (int q = 0; q < n; q++) {
        cg_kernel *k = &t->kernels[q];
        *k = prog->kernels[q];
        k->source = NULL, k->body = 0;
        k->params = al_calloc((size_t)k->nparams + 1, sizeof *k->params);
        t->nkernels = q + 1;
        if (!k->params) return ALLOY_ERR_OOM;
        memcpy(k->params, prog->kernels[q].params, sizeof *k->params * (size_t)k->nparams);
    }
    for (int i = 0; i < prog->nskipped; i++) {
        t->skipped[i] = prog->skipped[i];
        if (!(t->why[i] = al_strdup(prog->why[i]))) return ALLOY_ERR_OOM;
        t->nskipped = i + 1;
    }
    return ALLOY_OK;
}

/* The schedule and plan a bundle of g holds into *out: those of a run that
 * fetches every output. The default schedule stores a gradient output of a
 * parameter the step updates only in a run that fetches it (schedule.c),
 * and a run that fetches one gets a schedule of its own; a bundle's step
 * runs where nothing compiles (liballoy-runtime: no kernels for another
 * schedule), so it keeps them all, and a bundle's run fetches any output
 * from the one executable it holds. The cost: the step stores those
 * gradients in every run. *own says whether *out is a new schedule and
 * plan (pass_compiled_free it) or g->comp itself (no output left out). */
static alloy_status bundle_schedule(alloy_graph *g, const char *path, pass_compiled *out, bool *own)
{
    const ir_graph *c = g->compiled;
    *out = g->comp, *own = false;
    bool *want = NULL;
    for (int i = 0; i < c->noutputs; i++) {
        int id = c->outputs[i].node;
        if (g->comp.sched.kept[id]) continue;
        if (!want && !(want = al_calloc((size_t)c->nnodes + 1, sizeof *want)))
            return graph_fail(g, ALLOY_ERR_OOM, "save_bundle %s: out of memory", path);
        want[id] = true;
    }
    if (!want) return ALLOY_OK;
    char err[256];
    pass_compiled made = {0};
    alloy_status st = sched_build(c, want, &made.sched, err, sizeof err);
    if (!st) st = plan_for_step(c, &made.sched, g->cfg.no_arena, &made.plan, err, sizeof err);
    al_free(want);
    if (st) {
        pass_compiled_free(&made);
        return graph_fail(g, st, "save_bundle %s: scheduling the step with every output kept: %s", path, err);
    }
    *out = made, *own = true;
    return ALLOY_OK;
}

/* g's CUDA executable of schedule s for archs ("sm_80,sm_90") into x: its
 * kernels (cg_emit) in modules (cg_module_range), their images from the
 * image builder (NVRTC's unless a test put a device's under it), and the
 * kernel table from which the runtime rebuilds the launch plan with no
 * emitter. A step with no kernel (every step a library call) gives no
 * images. */
static alloy_status cuda_images(alloy_graph *g, const schedule *s, const char *path, const char *archs, bundle_cuda *x)
{
    char msg[1024];
    cg_program prog;
    alloy_status st = cg_emit(g->compiled, s, &prog, msg, sizeof msg);
    if (st) return graph_fail(g, st, "save_bundle %s: %s", path, msg);
    int nmodules = cg_module_count(prog.nkernels);
    char (*names)[32] = al_calloc((size_t)nmodules + 1, 32), **sources = al_calloc((size_t)nmodules + 1, sizeof *sources);
    const char **nm = al_calloc((size_t)nmodules + 1, sizeof *nm), **src = al_calloc((size_t)nmodules + 1, sizeof *src);
    st = names && sources && nm && src ? ALLOY_OK : ALLOY_ERR_OOM;
    for (int m = 0; !st && m < nmodules; m++) {
        int first, count;
        cg_module_range(prog.nkernels, m, &first, &count);
        cg_module_name(m, names[m], 32);
        if (!(sources[m] = cg_module_source(&prog, first, count))) st = ALLOY_ERR_OOM;
        nm[m] = names[m], src[m] = sources[m];
    }
    if (st) graph_fail(g, st, "save_bundle %s: out of memory compiling the CUDA executable", path);
    else if (nmodules && (st = image_builder(&g->cfg, archs, nmodules, nm, src, x, msg, sizeof msg)))
        graph_fail(g, st, "save_bundle %s: %s", path, msg);
    if (!st && x->nimages) {
        x->nmodules = (uint32_t)nmodules;
        if ((st = bundle_kernel_table(&prog, x))) graph_fail(g, st, "save_bundle %s: out of memory keeping the kernel table", path);
    }
    for (int m = 0; sources && m < nmodules; m++) al_free(sources[m]);
    al_free(names), al_free(sources), al_free(nm), al_free(src);
    cg_program_free(&prog);
    if (st || !x->nimages) bundle_cuda_free(x);
    return st;
}

/* g's state now as an alloy-state safetensors file's bytes into *out: saved
 * (alloy_graph_save_state, with its checksum) to a temporary file beside
 * path and read back. */
static alloy_status state_bytes(alloy_graph *g, const char *path, uint8_t **out, size_t *len)
{
    *out = NULL, *len = 0;
    size_t n = strlen(path);
    char *tmp = al_malloc(n + 16);
    if (!tmp) return graph_fail(g, ALLOY_ERR_OOM, "save_bundle %s: out of memory", path);
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".state-XXXXXX", 14);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        alloy_status st = graph_fail(g, ALLOY_ERR_IO, "save_bundle %s: cannot make %s: %s", path, tmp, strerror(errno));
        al_free(tmp);
        return st;
    }
    close(fd);
    alloy_status st = alloy_graph_save_state(g, tmp);
    char msg[1024];
    if (!st && (st = al_file_read(tmp, 0, out, len, msg, sizeof msg)))
        graph_fail(g, st, "save_bundle %s: reading the state back: %s", path, msg);
    unlink(tmp);
    al_free(tmp);
    if (st) {
        al_free(*out);
        *out = NULL, *len = 0;
    }
    return st;
}

alloy_status alloy_graph_save_bundle(alloy_graph *g, const char *path, const char *archs)
{
    return alloy_graph_save_bundle_flags(g, path, archs, 0);
}

/* Writes g's bundle, g compiled, to path (alloy_graph_save_bundle_flags). */
static alloy_status save_compiled(alloy_graph *g, const char *path, const char *archs, unsigned flags)
{
    char err[1024];
    alloy_status st;
    pass_compiled comp;
    bool own_comp;
    if ((st = bundle_schedule(g, path, &comp, &own_comp))) return st;
    bundle_contents c = {.ir = g->compiled, .comp = comp, .seed = g->seed, .training = g->training,
                         .scaler_kind = (int)g->scaler.kind, .growth_interval = g->scaler.growth_interval,
                         .hysteresis = g->scaler.hysteresis, .max_consecutive_skips = g->scaler.max_consecutive_skips,
                         .optimizer_kind = (int)g->optimizer.kind,
                         .accumulation_steps = g->optimizer.accumulation_steps};
    al_fmt(c.graph_name, sizeof c.graph_name, "%s", g->ir->name);
    if (strlen(g->ir->name) >= sizeof c.graph_name || strchr(g->ir->name, '\n'))
        st = graph_fail(g, ALLOY_ERR_INVALID, "save_bundle %s: graph name over %zu bytes or with a newline", path,
                        sizeof c.graph_name - 1);
    else if (flags & ~(unsigned)ALLOY_BUNDLE_WITH_STATE)
        st = graph_fail(g, ALLOY_ERR_INVALID, "save_bundle %s: unknown flags 0x%x", path, flags);
    if (!st && (flags & ALLOY_BUNDLE_WITH_STATE)) st = state_bytes(g, path, &c.init_state, &c.init_state_len);
    if (!st && archs && *archs) st = cuda_images(g, &comp.sched, path, archs, &c.cuda);
    if (!st && !(c.options = options_text(&g->cfg)))
        st = graph_fail(g, ALLOY_ERR_OOM, "save_bundle %s: out of memory", path);
    if (!st && (st = bundle_write_file(path, &c, err, sizeof err))) graph_fail(g, st, "save_bundle: %s", err);
    al_free(c.options);
    al_free(c.init_state);
    bundle_cuda_free(&c.cuda);
    if (own_comp) pass_compiled_free(&comp);
    return st;
}

alloy_status alloy_graph_save_bundle_flags(alloy_graph *g, const char *path, const char *archs, unsigned flags)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!path) return graph_fail(g, ALLOY_ERR_INVALID, "save_bundle: path is NULL");
    if (g->ir->status) return graph_built(g);
    /* the target first: nothing is compiled for a path that cannot take
     * the bundle (a FIFO, a device, a directory, a missing folder) */
    char err[1024];
    alloy_status st = al_file_check_writable(path, err, sizeof err);
    if (st) return graph_fail(g, st, "save_bundle: %s", err);
    /* with CUDA images, the GPU's plan (device=auto), that compile dropped again after if made for the bundle */
    bool gpu = archs && *archs, own_compile = false;
    if ((st = gpu ? graph_compile_for_gpu(g, &own_compile) : graph_compile_ir(g))) return st;
    st = save_compiled(g, path, archs, flags);
    if (own_compile) graph_invalidate(g);
    return st;
}
