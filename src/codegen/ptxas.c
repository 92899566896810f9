/* ptxas.c - kernel resources from NVRTC's ptxas -v log: parsing it, and compiling a program's modules for it with the log kept in the kernel cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/export.h"
#include "codegen/ptxas.h"

/* The integer right before `what` on the line at p (up to its end), or -1. */
static int number_before(const char *p, const char *end, const char *what)
{
    size_t n = strlen(what);
    for (const char *q = p; q + n <= end; q++) {
        if (memcmp(q, what, n) != 0) continue;
        const char *d = q;
        while (d > p && d[-1] == ' ') d--;
        const char *e = d;
        while (d > p && d[-1] >= '0' && d[-1] <= '9') d--;
        if (d == e) return -1;
        return (int)strtol(d, NULL, 10);
    }
    return -1;
}

bool cg_ptxas_parse(const char *log, const char *name, cg_resources *out)
{
    memset(out, 0, sizeof *out);
    if (!log || !name) return false;
    char head[160];
    al_fmt(head, sizeof head, "Compiling entry function '%s' for", name);
    const char *at = strstr(log, head);
    if (!at) return false;
    bool have_regs = false, have_frame = false;
    /* the kernel's block: until the next "Compiling entry function" */
    const char *next = strstr(at + strlen(head), "Compiling entry function");
    for (const char *line = at; *line && (!next || line < next);) {
        const char *end = strchr(line, '\n');
        if (!end) end = line + strlen(line);
        int v;
        if ((v = number_before(line, end, "bytes stack frame")) >= 0) {
            out->stack = v, have_frame = true;
            int st = number_before(line, end, "bytes spill stores"), ld = number_before(line, end, "bytes spill loads");
            out->spill_stores = st > 0 ? st : 0, out->spill_loads = ld > 0 ? ld : 0;
        }
        const char *used = strstr(line, "Used ");
        if (used && used < end && (v = number_before(line, end, "registers")) >= 0) {
            out->registers = v, have_regs = true;
            int sm = number_before(line, end, "bytes smem");
            out->shared = sm > 0 ? sm : 0;
        }
        line = *end ? end + 1 : end;
    }
    out->known = have_regs && have_frame;
    if (!out->known) memset(out, 0, sizeof *out);
    return out->known;
}

/* One module's verbose compile. */
typedef struct module_job {
    cg_kernel_src src;
    char name[32];
    char *source;
    char *log; /* cg_malloc'd */
    alloy_status status;
    char err[512];
} module_job;

typedef struct resource_batch {
    const cg_nvrtc *nv;
    cg_cache *cache;
    module_job *jobs;
} resource_batch;

static const char *const verbose[] = {CG_PTXAS_VERBOSE};

static void compile_module(void *ctx, int m)
{
    resource_batch *b = ctx;
    module_job *j = &b->jobs[m];
    cg_binary bin;
    j->status = cg_nvrtc_prepare(b->nv, &j->src, &bin, j->err, sizeof j->err);
    if (j->status) {
        cg_binary_free(&bin);
        return;
    }
    if (bin.kind != CG_CUBIN) { /* PTX: no ptxas run, nothing to read */
        cg_binary_free(&bin);
        return;
    }
    char key[CG_KEY_HEX + 1], *options = cg_malloc(strlen(bin.options) + 16);
    if (!options) {
        cg_binary_free(&bin);
        j->status = ALLOY_ERR_OOM;
        al_fmt(j->err, sizeof j->err, "out of memory");
        return;
    }
    sprintf(options, "%s ptxas-log", bin.options);
    cg_cache_key(j->src.name, j->src.source, options, bin.arch, bin.kind, cg_nvrtc_id(b->nv), key);
    cg_free(options);
    cg_binary_free(&bin);
    unsigned char *data = NULL;
    size_t size = 0;
    if (b->cache && cg_cache_get(b->cache, key, &data, &size) == ALLOY_OK) {
        j->log = cg_malloc(size + 1);
        if (j->log) memcpy(j->log, data, size), j->log[size] = '\0';
        cg_free(data);
        if (!j->log) j->status = ALLOY_ERR_OOM, al_fmt(j->err, sizeof j->err, "out of memory");
        return;
    }
    j->status = cg_nvrtc_compile(b->nv, &j->src, NULL, &bin, j->err, sizeof j->err);
    if (!j->status) {
        j->log = bin.log, bin.log = NULL;
        if (b->cache && j->log) cg_cache_put(b->cache, key, j->log, strlen(j->log), NULL, 0);
    }
    cg_binary_free(&bin);
}

alloy_status cg_ptxas_resources(const cg_nvrtc *nv, cg_cache *cache, const cg_program *prog, int sm, int nthreads,
                                cg_resources *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof *res * (size_t)prog->nkernels);
    int nm = cg_module_count(prog->nkernels);
    module_job *jobs = al_calloc((size_t)nm + 1, sizeof *jobs);
    if (!jobs) {
        al_fmt(err, errlen, "out of memory");
        return ALLOY_ERR_OOM;
    }
    alloy_status st = ALLOY_OK;
    for (int m = 0; m < nm; m++) {
        int first, n;
        cg_module_range(prog->nkernels, m, &first, &n);
        cg_module_name(m, jobs[m].name, sizeof jobs[m].name);
        if (!(jobs[m].source = cg_module_source(prog, first, n))) {
            al_fmt(err, errlen, "out of memory writing the source of module %s", jobs[m].name);
            st = ALLOY_ERR_OOM;
            break;
        }
        jobs[m].src = (cg_kernel_src){.name = jobs[m].name, .source = jobs[m].source, .sm = sm, .options = verbose,
                                      .noptions = 1};
    }
    if (!st) {
        if (nthreads <= 0) nthreads = (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (nthreads < 1) nthreads = 1;
        resource_batch b = {nv, cache, jobs};
        cg_parallel(nm, nthreads, compile_module, &b);
    }
    for (int m = 0; !st && m < nm; m++) {
        if (jobs[m].status) {
            st = jobs[m].status;
            al_fmt(err, errlen, "module %s for sm_%d: %s", jobs[m].name, sm, jobs[m].err);
            break;
        }
        int first, n;
        cg_module_range(prog->nkernels, m, &first, &n);
        for (int q = first; q < first + n; q++) cg_ptxas_parse(jobs[m].log, prog->kernels[q].name, &res[q]);
    }
    for (int m = 0; m < nm; m++) al_free(jobs[m].source), cg_free(jobs[m].log);
    al_free(jobs);
    return st;
}
