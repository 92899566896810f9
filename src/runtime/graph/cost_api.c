/* cost_api.c - alloy_graph_cost: the graph compiled, its kernels emitted, its launch plan built and modelled (src/cost/), with ptxas resources from NVRTC when an architecture is given. */
#include <stdio.h>
#include <string.h>

#include "alloy/cost.h"
#include "codegen/cache.h"
#include "codegen/export.h"
#include "cost/cost.h"
#include "runtime/graph/graph_impl.h"

/* The kernel cache's share of memory for resource logs (they are a few KiB each). */
#define COST_MEM_CACHE (8u << 20)

/* ptxas' report of every kernel of prog for arch ("sm_90"), into res. */
static alloy_status resources(alloy_graph *g, const cg_program *prog, const char *arch, cg_resources *res)
{
    int sms[CG_MAX_ARCHS], nsms;
    char msg[1024];
    alloy_status st = cg_parse_archs(arch, sms, CG_MAX_ARCHS, &nsms, msg, sizeof msg);
    if (st) return graph_fail(g, st, "cost: %s", msg);
    if (nsms != 1) return graph_fail(g, ALLOY_ERR_INVALID, "cost: one architecture, not %d ('%s')", nsms, arch);
    char cache_dir[OPT_PATH_MAX + 16] = "";
    if (g->cfg.cache && (st = graph_cache_dir(g, &g->cfg, cache_dir, sizeof cache_dir))) return st;
    cg_nvrtc *nv;
    if ((st = cg_nvrtc_open(g->cfg.nvrtc[0] ? g->cfg.nvrtc : NULL, &nv, msg, sizeof msg)))
        return graph_fail(g, st, "cost: NVRTC, which ptxas' resources for %s come from, is not available: %s", arch,
                          msg);
    cg_cache *cache = NULL;
    if (g->cfg.cache &&
        (st = cg_cache_open(cache_dir[0] ? cache_dir : NULL, COST_MEM_CACHE, CG_CACHE_DISK_BOUND, &cache, msg,
                            sizeof msg))) {
        cg_nvrtc_close(nv);
        return graph_fail(g, st, "cost: %s", msg);
    }
    size_t errlen = 8192;
    char *err = al_malloc(errlen);
    if (!err) st = graph_fail(g, ALLOY_ERR_OOM, "cost: out of memory");
    else if ((st = cg_ptxas_resources(nv, cache, prog, sms[0], g->cfg.num_threads, res, err, errlen)))
        graph_fail(g, st, "cost: compiling graph '%s' for ptxas' resources: %s", g->ir->name, err);
    al_free(err);
    cg_cache_close(cache);
    cg_nvrtc_close(nv);
    return st;
}

/* The device table o asks for into *out. */
static alloy_status device_of(alloy_graph *g, const alloy_cost_options *o, cost_device *out)
{
    const char *name = o && o->device ? o->device : "h100";
    const cost_device *d = cost_device_find(name);
    if (!d)
        return graph_fail(g, ALLOY_ERR_INVALID, "cost: no device table '%s' (tables: %s)", name,
                          cost_device_names());
    *out = *d;
    return ALLOY_OK;
}

/* The whole of file path into *text (al_free it). */
static alloy_status read_profile(alloy_graph *g, const char *path, char **text)
{
    FILE *f = fopen(path, "rb");
    if (!f) return graph_fail(g, ALLOY_ERR_IO, "cost: cannot open the profile %s", path);
    size_t cap = 1 << 16, len = 0;
    char *buf = al_malloc(cap);
    for (size_t got = 1; buf && got;) {
        if (len + 1 == cap) {
            char *p = al_realloc(buf, cap * 2);
            if (!p) al_free(buf);
            buf = p, cap *= 2;
            if (!buf) break;
        }
        got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf) return graph_fail(g, ALLOY_ERR_OOM, "cost: out of memory reading %s", path);
    if (bad) {
        al_free(buf);
        return graph_fail(g, ALLOY_ERR_IO, "cost: cannot read the profile %s", path);
    }
    buf[len] = '\0';
    *text = buf;
    return ALLOY_OK;
}

/* dev fitted to the profile in file path, with m's bytes for its kernels; report gets the fit. */
static alloy_status calibrate(alloy_graph *g, const char *path, const cost_model *m, cost_device *dev, FILE *report)
{
    char *text = NULL, msg[512];
    alloy_status st = read_profile(g, path, &text);
    if (st) return st;
    cost_fit fit;
    cost_device base = *dev;
    st = cost_calibrate(text, &base, m, dev, &fit, msg, sizeof msg);
    al_free(text);
    if (st) return graph_fail(g, st, "cost: %s: %s", path, msg);
    if (report)
        fprintf(report, "# calibrated from %s: %d profile rows (%d kernels' bytes from this model); efficiency from "
                        "%d rows, GEMM rates from %d aligned and %d odd, the floor from %d; the graph node cost is not "
                        "in a profile (its launches are direct) and stays\n",
                path, fit.rows, fit.matched, fit.bw_rows, fit.gemm_rows, fit.odd_rows, fit.floor_rows);
    return ALLOY_OK;
}

alloy_status alloy_graph_cost(alloy_graph *g, const alloy_cost_options *o, alloy_cost_totals *totals, FILE *report)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (g->ir->status) return graph_built(g);
    const char *arch = o && o->arch && o->arch[0] ? o->arch : NULL;
    cost_device dev;
    /* the GPU's plan (device=auto would choose the CPU's on a machine without one), dropped again after
     * if made for this call */
    bool own;
    alloy_status st = graph_compile_for_gpu(g, &own);
    if (!st) st = device_of(g, o, &dev);
    if (st) {
        if (own) graph_invalidate(g);
        return st;
    }
    cg_program prog;
    lp_plan lp;
    cost_model m = {0};
    cg_resources *res = NULL;
    char err[1024];
    const ir_graph *c = g->compiled;
    const schedule *s = &g->comp.sched;
    /* the kernels the CUDA backend would run, amp_check's and amp_stats' included (cuda_jit.c) */
    unsigned checks = (g->cfg.amp_check ? CG_CHECK_FINITE : 0u) | (g->cfg.amp_stats ? CG_CHECK_RANGE : 0u) |
                      (g->cfg.cuda_gemm_f32 ? LP_WIDEN : 0u);
    if ((st = cg_emit_checked(c, s, checks, &prog, err, sizeof err))) {
        graph_fail(g, st, "cost: emitting the kernels: %s", err);
        if (own) graph_invalidate(g);
        return st;
    }
    if ((st = cost_plan(c, s, &g->comp.plan, &prog, &lp, err, sizeof err))) {
        cg_program_free(&prog);
        graph_fail(g, st, "cost: graph '%s': %s", g->ir->name, err);
        if (own) graph_invalidate(g);
        return st;
    }
    if (arch && !(res = al_calloc((size_t)prog.nkernels + 1, sizeof *res))) st = graph_fail(g, ALLOY_ERR_OOM, "cost: out of memory");
    if (!st && arch) st = resources(g, &prog, arch, res);
    if (!st && (st = cost_build(c, s, &prog, &lp, res, &m, err, sizeof err))) graph_fail(g, st, "cost: %s", err);
    if (!st && g->comm) cost_set_world(&m, c, alloy_comm_size(g->comm)); /* a data-parallel graph's all_reduce */
    if (!st && o && o->calibrate) st = calibrate(g, o->calibrate, &m, &dev, report);
    if (!st) {
        cost_apply(&m, &dev);
        if (totals) {
            *totals = (alloy_cost_totals){.launches = m.n, .kernels = m.kernels, .gemms = m.gemms,
                                          .memsets = m.memsets, .copies = m.copies,
                                          .spill_kernels = arch ? m.spill_kernels : -1,
                                          .bytes = (double)m.total.bytes, .flops = m.total.flops,
                                          .ms_low = m.total.t_lo * 1e3, .ms_high = m.total.t_hi * 1e3};
            for (int i = 0; i < m.n; i++) {
                const cost_launch *l = &m.launches[i];
                totals->tiny_kernels += l->action == COST_KERNEL && l->grid <= COST_TINY_BLOCKS;
            }
            for (int i = 0; i < m.n; i++) totals->link_bytes += (double)m.launches[i].link;
            totals->bytes -= totals->link_bytes;
            totals->collectives = m.collectives;
            totals->kernel_bytes = (double)m.kernel_bytes;
            totals->emitted_kernel_bytes = (double)m.emitted_bytes;
        }
        if (report) {
            int top = o && o->top ? o->top : 15;
            if (cost_print(report, g->ir->name, arch, &m, &dev, top < 0 ? 0 : top, o && o->all))
                st = graph_fail(g, ALLOY_ERR_OOM, "cost: out of memory ranking the launches");
            fflush(report);
        }
    }
    cost_free(&m);
    al_free(res);
    cost_plan_free(&lp);
    cg_program_free(&prog);
    if (own) graph_invalidate(g);
    return st;
}

alloy_status alloy_graph_cost_report(alloy_graph *g, FILE *out, const char *arch)
{
    alloy_cost_options o = {.arch = arch};
    return alloy_graph_cost(g, &o, NULL, out);
}
