/* export.c - a compiled schedule written out for CUDA: kernels in modules of up to 64, each compiled for every architecture through the kernel cache, sources, binaries and summary.txt written atomically. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "codegen/cache.h"
#include "codegen/export.h"
#include "codegen/text.h"
#include "step/launch_plan.h"

/* Payloads an export's cache keeps in memory: enough for one graph's
 * modules, so architectures that fall back to the same PTX compile once. */
#define EXPORT_MEM_CACHE ((size_t)64 << 20)

/* ---- modules ---- */

int cg_module_count(int nkernels) { return nkernels > 0 ? (nkernels + CG_MODULE_KERNELS - 1) / CG_MODULE_KERNELS : 0; }

void cg_module_range(int nkernels, int m, int *first, int *n)
{
    int count = cg_module_count(nkernels);
    if (m < 0 || m >= count) {
        *first = nkernels > 0 ? nkernels : 0;
        *n = 0;
        return;
    }
    int64_t a = (int64_t)nkernels * m / count, b = (int64_t)nkernels * (m + 1) / count;
    *first = (int)a;
    *n = (int)(b - a);
}

void cg_module_name(int m, char *out, size_t len) { al_fmt(out, len, "alloy_m%d", m); }

/* ---- architectures ---- */

alloy_status cg_parse_archs(const char *text, int *archs, int max, int *n, char *err, size_t errlen)
{
    *n = 0;
    if (!text || !*text) {
        al_fmt(err, errlen, "no architecture given (want sm_XY[,sm_XY...], for example sm_80,sm_90)");
        return ALLOY_ERR_INVALID;
    }
    for (const char *p = text;;) {
        size_t len = strcspn(p, ",");
        const char *w = p;
        size_t wn = len;
        while (wn && (*w == ' ' || *w == '\t')) w++, wn--;
        while (wn && (w[wn - 1] == ' ' || w[wn - 1] == '\t')) wn--;
        int sm = 0;
        bool good = wn >= 5 && wn <= 7 && strncmp(w, "sm_", 3) == 0;
        for (size_t i = 3; good && i < wn; i++) {
            good = w[i] >= '0' && w[i] <= '9';
            sm = sm * 10 + (w[i] - '0');
        }
        if (!good || sm < 10 || w[3] == '0') {
            al_fmt(err, errlen,
                   "architecture '%.*s' is not sm_XY with XY the compute capability as major*10+minor, 10 to 9999 "
                   "(for example sm_80,sm_90)",
                   (int)(wn < 40 ? wn : 40), w);
            return ALLOY_ERR_INVALID;
        }
        for (int i = 0; i < *n; i++)
            if (archs[i] == sm) {
                al_fmt(err, errlen, "architecture sm_%d is given twice", sm);
                return ALLOY_ERR_INVALID;
            }
        if (*n == max) {
            al_fmt(err, errlen, "more than %d architectures", max);
            return ALLOY_ERR_INVALID;
        }
        archs[(*n)++] = sm;
        if (!p[len]) return ALLOY_OK;
        p += len + 1;
    }
}

/* ---- text and files ---- */


/* dir/name into out; false when it does not fit. */
static bool path_in(char *out, size_t len, const char *dir, const char *name)
{
    int n = snprintf(out, len, "%s/%s", dir, name);
    return n >= 0 && (size_t)n < len;
}

/* Writes size bytes to path with al_file_write (base/file.h): a reader sees
 * the old file or the whole new one; a link is followed, anything but a
 * regular file refused. ALLOY_ERR_IO naming what failed. */
static alloy_status write_file(const char *path, const void *data, size_t size, char *err, size_t errlen)
{
    char msg[PATH_MAX + 256];
    alloy_status st = al_file_write(path, &data, &size, 1, 0, msg, sizeof msg);
    if (st) al_fmt(err, errlen, "%s", msg);
    return st;
}

/* Deletes path if it is there; ALLOY_ERR_IO when it is and cannot be. */
static alloy_status remove_file(const char *path, char *err, size_t errlen)
{
    if (unlink(path) == 0 || errno == ENOENT) return ALLOY_OK;
    al_fmt(err, errlen, "cannot remove the stale %s: %s", path, strerror(errno));
    return ALLOY_ERR_IO;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- the export ---- */

/* One binary each module is built as: what NVRTC makes for sm (a CUBIN for
 * it, or PTX for the newest architecture below it). */
typedef struct target {
    int sm; /* the first requested architecture that gives it */
    cg_binary_kind kind;
    int arch;
} target;

/* "sm_90.cubin" or "compute_120.ptx". */
static void target_suffix(const target *t, char *out, size_t len)
{
    al_fmt(out, len, t->kind == CG_CUBIN ? "sm_%d.cubin" : "compute_%d.ptx", t->arch);
}

/* "sm_90" or "compute_120": the target alone, for log file names and messages. */
static void target_name(const target *t, char *out, size_t len)
{
    al_fmt(out, len, "%s_%d", t->kind == CG_CUBIN ? "sm" : "compute", t->arch);
}

/* Everything an export holds, freed at once by export_free. */
typedef struct export_state {
    const cg_export_options *o;
    cg_program prog;
    int nmodules, ntargets, nbin;
    target targets[CG_MAX_ARCHS];
    int target_of[CG_MAX_ARCHS]; /* per requested architecture: its target */
    char (*names)[32];     /* per module */
    char **emitted;        /* per module: cg_module_source */
    const char **compiled; /* per module: what NVRTC gets (emitted, or the hook's) */
    cg_kernel_src *ks;     /* per binary: module m for target t at m * ntargets + t */
    cg_binary *bins;
    cg_cache *cache;
    const char **library; /* per step: why it calls a library (NULL: it does not) */
    cg_text summary;
} export_state;

static void export_free(export_state *x)
{
    for (int i = 0; x->bins && i < x->nbin; i++) cg_binary_free(&x->bins[i]);
    for (int m = 0; x->emitted && m < x->nmodules; m++) al_free(x->emitted[m]);
    al_free(x->names), al_free(x->emitted), al_free(x->compiled), al_free(x->ks), al_free(x->bins);
    al_free(x->summary.s);
    al_free(x->library);
    cg_cache_close(x->cache);
    cg_program_free(&x->prog);
}

/* The requested architectures as distinct targets (two that fall back to
 * the same PTX are one). */
static alloy_status resolve_targets(export_state *x, const cg_nvrtc *nv, char *err, size_t errlen)
{
    for (int a = 0; a < x->o->narchs; a++) {
        target t = {.sm = x->o->archs[a]};
        char msg[512];
        alloy_status st = cg_nvrtc_target(nv, t.sm, &t.kind, &t.arch, msg, sizeof msg);
        if (st) {
            al_fmt(err, errlen, "%s", msg); /* it names the architecture */
            return st;
        }
        int i = 0;
        while (i < x->ntargets && !(x->targets[i].kind == t.kind && x->targets[i].arch == t.arch)) i++;
        if (i == x->ntargets) x->targets[x->ntargets++] = t;
        x->target_of[a] = i;
    }
    return ALLOY_OK;
}

/* The modules' sources, names and compile list. */
static alloy_status build_modules(export_state *x, char *err, size_t errlen)
{
    int nm = x->nmodules = cg_module_count(x->prog.nkernels);
    x->nbin = nm * x->ntargets;
    x->names = al_calloc((size_t)nm + 1, sizeof *x->names);
    x->emitted = al_calloc((size_t)nm + 1, sizeof *x->emitted);
    x->compiled = al_calloc((size_t)nm + 1, sizeof *x->compiled);
    x->ks = al_calloc((size_t)x->nbin + 1, sizeof *x->ks);
    x->bins = al_calloc((size_t)x->nbin + 1, sizeof *x->bins);
    if (!x->names || !x->emitted || !x->compiled || !x->ks || !x->bins) {
        al_fmt(err, errlen, "out of memory grouping %d kernels into modules", x->prog.nkernels);
        return ALLOY_ERR_OOM;
    }
    for (int m = 0; m < nm; m++) {
        int first, n;
        cg_module_range(x->prog.nkernels, m, &first, &n);
        cg_module_name(m, x->names[m], sizeof x->names[m]);
        if (!(x->emitted[m] = cg_module_source(&x->prog, first, n))) {
            al_fmt(err, errlen, "out of memory writing the source of module %s", x->names[m]);
            return ALLOY_ERR_OOM;
        }
        x->compiled[m] = x->o->source_hook ? x->o->source_hook(x->o->hook_ctx, m, x->emitted[m]) : NULL;
        if (!x->compiled[m]) x->compiled[m] = x->emitted[m];
        for (int t = 0; t < x->ntargets; t++)
            x->ks[m * x->ntargets + t] = (cg_kernel_src){.name = x->names[m], .source = x->compiled[m],
                                                         .sm = x->targets[t].sm};
    }
    return ALLOY_OK;
}

/* Writes every module's source into dir (made when missing). Into the
 * output directory, first removes summary.txt: it is written last, so its
 * presence says an export completed. */
static alloy_status write_sources(export_state *x, const char *dir, const char *what, char *err, size_t errlen)
{
    if (!cg_make_dirs(dir)) {
        al_fmt(err, errlen, "cannot make the %s %s: %s", what, dir, strerror(errno));
        return ALLOY_ERR_IO;
    }
    char summary[PATH_MAX];
    if (dir == x->o->dir && path_in(summary, sizeof summary, dir, "summary.txt")) {
        alloy_status st = remove_file(summary, err, errlen);
        if (st) return st;
    }
    for (int m = 0; m < x->nmodules; m++) {
        char path[PATH_MAX], file[48];
        al_fmt(file, sizeof file, "%s.cu", x->names[m]);
        if (!path_in(path, sizeof path, dir, file)) {
            al_fmt(err, errlen, "the %s %.200s... is too long a path", what, dir);
            return ALLOY_ERR_IO;
        }
        alloy_status st = write_file(path, x->compiled[m], strlen(x->compiled[m]), err, errlen);
        if (st) return st;
    }
    return ALLOY_OK;
}

/* The file of binary i in the output directory: the binary itself
 * (alloy_mN.sm_XY.cubin, alloy_mN.compute_XY.ptx) or, with log, NVRTC's
 * log of it (alloy_mN.sm_XY.log). false when the path does not fit. */
static bool binary_path(const export_state *x, int i, bool log, char *out, size_t len)
{
    const target *t = &x->targets[i % x->ntargets];
    char file[96], suffix[48];
    if (log) {
        target_name(t, suffix, sizeof suffix);
        al_fmt(file, sizeof file, "%s.%s.log", x->names[i / x->ntargets], suffix);
    } else {
        target_suffix(t, suffix, sizeof suffix);
        al_fmt(file, sizeof file, "%s.%s", x->names[i / x->ntargets], suffix);
    }
    return path_in(out, len, x->o->dir, file);
}

/* After a failed compile: NVRTC's log of each failure next to its source,
 * no binary and no summary (stale ones removed), and the first failure's
 * message naming the source, the target and the log. */
static alloy_status report_failure(export_state *x, char *err, size_t errlen)
{
    int first = -1;
    char msg[512] = "";
    alloy_status io = ALLOY_OK;
    for (int i = 0; i < x->nbin; i++) {
        char path[PATH_MAX];
        const cg_binary *b = &x->bins[i];
        if (b->status && first < 0) first = i;
        if (!io && binary_path(x, i, false, path, sizeof path)) io = remove_file(path, msg, sizeof msg);
        if (!io && b->status && b->log && b->log[0] && binary_path(x, i, true, path, sizeof path))
            io = write_file(path, b->log, strlen(b->log), msg, sizeof msg);
    }
    if (first < 0) { /* cannot happen: the compile reported a failure */
        al_fmt(err, errlen, "a compile failed without saying which");
        return ALLOY_ERR_NVRTC;
    }
    char summary[PATH_MAX];
    if (!io && path_in(summary, sizeof summary, x->o->dir, "summary.txt")) io = remove_file(summary, msg, sizeof msg);
    const cg_binary *b = &x->bins[first];
    char source[PATH_MAX], log[PATH_MAX] = "", tname[32];
    path_in(source, sizeof source, x->o->dir, x->names[first / x->ntargets]);
    target_name(&x->targets[first % x->ntargets], tname, sizeof tname);
    if (b->log && b->log[0]) binary_path(x, first, true, log, sizeof log);
    int failed = 0;
    for (int i = 0; i < x->nbin; i++) failed += x->bins[i].status != ALLOY_OK;
    al_fmt(err, errlen, "%s.cu for %s (sm_%d)%s%s%s: %s%s%s", source, tname, x->targets[first % x->ntargets].sm,
           log[0] ? "; NVRTC's log: " : "", log, failed > 1 ? " (and more failed compiles)" : "",
           b->message ? b->message : alloy_status_name(b->status), io ? "; also: " : "", io ? msg : "");
    return b->status;
}

/* Why a gemm step that has a kernel calls a library too. */
static const char gemm_epilogue[] = "a library GEMM (cuBLASLt), then the epilogue kernel";
/* Why a gemm step has no kernel at all (lp_library_epilogue). */
static const char gemm_bias[] = "a library GEMM (cuBLASLt) with its bias epilogue";
static const char gemm_gelu[] = "a library GEMM (cuBLASLt) with its GELU epilogue";
static const char gemm_cast[] = "a library GEMM (cuBLASLt) writing its dtype";

/* Fills x->library: the steps with no kernel (prog.skipped, with the
 * emitter's reason) and the gemm steps whose matmul a library runs before
 * their epilogue kernel (a convolution head is a kernel of its own, no
 * library call), and those the library's bias or GELU epilogue computes
 * whole.
 * Returns how many; -1 when out of memory. */
static int find_library_calls(export_state *x, const ir_graph *g, const schedule *s)
{
    if (!(x->library = al_calloc((size_t)s->nsteps + 1, sizeof *x->library))) return -1;
    for (int k = 0; k < x->prog.nkernels; k++) {
        const sched_step *st = &s->steps[x->prog.kernels[k].step];
        if (x->prog.kernels[k].kind == STEP_KIND_GEMM && g->nodes[s->members[st->first].node]->op == IR_OP_matmul)
            x->library[x->prog.kernels[k].step] = gemm_epilogue;
    }
    for (int k = 0; k < s->nsteps; k++) {
        lp_library lib;
        if (!x->library[k] && lp_library_epilogue(g, s, k, x->prog.checks | LP_WIDEN, &lib))
            x->library[k] = lib.gelu ? gemm_gelu : lib.bias >= 0 ? gemm_bias : gemm_cast;
    }
    for (int i = 0; i < x->prog.nskipped; i++) x->library[x->prog.skipped[i]] = x->prog.why[i];
    int n = 0;
    for (int k = 0; k < s->nsteps; k++) n += x->library[k] != NULL;
    return n;
}

/* "%3,%5-%9,%12": the step's members, runs of consecutive ids shortened. */
static void put_members(cg_text *t, const schedule *s, const sched_step *st)
{
    for (int i = 0; i < st->n;) {
        int a = s->members[st->first + i].node, j = i;
        while (j + 1 < st->n && s->members[st->first + j + 1].node == s->members[st->first + j].node + 1) j++;
        int b = s->members[st->first + j].node;
        if (j - i >= 2) cg_put(t, "%s%%%d-%%%d", i ? "," : "", a, b), i = j + 1;
        else cg_put(t, "%s%%%d", i ? "," : "", a), i++;
    }
}

/* The line module text starts kernel k on: the module is the preamble,
 * then each kernel's own text (source + body) in order, so kernel k
 * begins where the texts of it and the module's later kernels begin. */
static int kernel_line(const export_state *x, int m, int k)
{
    int first, n;
    cg_module_range(x->prog.nkernels, m, &first, &n);
    size_t tail = 0, len = strlen(x->emitted[m]);
    for (int i = k; i < first + n; i++) tail += strlen(x->prog.kernels[i].source + x->prog.kernels[i].body);
    if (tail > len) return 0;
    const char *text = x->emitted[m], *at = text + (len - tail);
    while (*at == '\n') at++; /* the kernel's first line, not the blank one before it */
    int line = 1;
    for (const char *p = text; p < at; p++) line += *p == '\n';
    return line;
}

static void format_summary(export_state *x, const ir_graph *g, const schedule *s, const cg_nvrtc *nv,
                           const cg_export_totals *tot)
{
    cg_text *t = &x->summary;
    const cg_program *p = &x->prog;
    cg_put(t, "alloy CUDA export of graph '%s'\ntargets:", g->name);
    for (int a = 0; a < x->o->narchs; a++) {
        char suffix[48];
        target_suffix(&x->targets[x->target_of[a]], suffix, sizeof suffix);
        cg_put(t, "%s sm_%d (alloy_mN.%s)", a ? "," : "", x->o->archs[a], suffix);
    }
    cg_put(t, "; compiler: %s\n\n", cg_nvrtc_id(nv));

    int wname = 6;
    for (int k = 0; k < p->nkernels; k++) {
        int n = (int)strlen(p->kernels[k].name);
        if (n > wname) wname = n;
    }
    cg_put(t, "%-*s %5s %-5s %17s %12s  %-18s %s\n", wname, "kernel", "step", "kind", "grid x block", "bytes/run",
        "source", "members");
    for (int m = 0; m < x->nmodules; m++) {
        int first, n;
        cg_module_range(p->nkernels, m, &first, &n);
        for (int k = first; k < first + n; k++) {
            const cg_kernel *kn = &p->kernels[k];
            char grid[40], source[64];
            al_fmt(grid, sizeof grid, "%u x %u", kn->grid, kn->block);
            al_fmt(source, sizeof source, "%s.cu:%d", x->names[m], kernel_line(x, m, k));
            cg_put(t, "%-*s %5d %-5s %17s %12lld  %-18s ", wname, kn->name, kn->step, sched_kind_name(kn->kind), grid,
                (long long)kn->bytes, source);
            /* a chain kernel: the members of every step it computes */
            for (int j = kn->step, left = cg_chain_steps(kn), any = 0; j < s->nsteps && left > 0; j++) {
                if (s->members[s->steps[j].first].flags & MEMBER_VIEW) continue;
                if (any++) cg_put(t, ",");
                put_members(t, s, &s->steps[j]);
                left--;
            }
            cg_put(t, "\n");
        }
    }
    if (tot->library_calls) {
        int wwhy = 3;
        for (int k = 0; k < s->nsteps; k++)
            if (x->library[k] && (int)strlen(x->library[k]) > wwhy) wwhy = (int)strlen(x->library[k]);
        cg_put(t, "\n%12s %-5s %-12s %-*s %s\n", "library step", "kind", "op", wwhy, "why", "members");
        for (int k = 0; k < s->nsteps; k++) {
            const sched_step *st = &s->steps[k];
            if (!x->library[k]) continue;
            /* a gemm step with a kernel: the row is its matmul, the OP part first in the step */
            bool matmul_only = st->kind == STEP_KIND_GEMM && x->library[k] == gemm_epilogue;
            const sched_part *mm = &s->parts[st->first_part];
            const ir_node *op = g->nodes[matmul_only ? s->members[mm->first].node : st->pos];
            cg_put(t, "%12d %-5s %-12s %-*s ", k, sched_kind_name(st->kind), ir_ops[op->op].name, wwhy, x->library[k]);
            if (matmul_only) cg_put(t, "%%%d", s->members[mm->first].node);
            else put_members(t, s, st);
            cg_put(t, "\n");
        }
    }
    int lo = CG_MODULE_KERNELS, hi = 0;
    for (int m = 0; m < x->nmodules; m++) {
        int first, n;
        cg_module_range(p->nkernels, m, &first, &n);
        if (n < lo) lo = n;
        if (n > hi) hi = n;
    }
    cg_put(t, "\nkernels        %d in %d module%s", tot->kernels, tot->modules, tot->modules == 1 ? "" : "s");
    if (tot->modules > 1) cg_put(t, lo == hi ? " (%d kernels each)" : " (%d to %d kernels each)", lo, hi);
    cg_put(t, "\nlibrary calls  %d\n", tot->library_calls);
    cg_put(t, "bytes/run      %lld (%.1f MiB)\n", (long long)tot->bytes, (double)tot->bytes / (1 << 20));
    cg_put(t, "binaries       %d (%d module%s x %d target%s)\n", tot->binaries, tot->modules, tot->modules == 1 ? "" : "s",
        tot->targets, tot->targets == 1 ? "" : "s");
    cg_put(t, "compile time   %.0f ms on %d thread%s\n", tot->compile_ms, tot->threads, tot->threads == 1 ? "" : "s");
    cg_put(t, "from cache     %d of %d binaries%s\n", tot->from_cache, tot->binaries, x->o->cache ? "" : " (cache off)");
}

/* The binaries of a successful compile, then summary.txt, each atomically;
 * a log an earlier failed export left is removed. */
static alloy_status write_outputs(export_state *x, char *err, size_t errlen)
{
    for (int i = 0; i < x->nbin; i++) {
        char path[PATH_MAX];
        const cg_binary *b = &x->bins[i];
        size_t size = b->size;
        if (b->kind == CG_PTX && size && b->data[size - 1] == '\0') size--; /* a text file; loaders add the NUL */
        if (!binary_path(x, i, false, path, sizeof path)) {
            al_fmt(err, errlen, "the output directory %.200s... is too long a path", x->o->dir);
            return ALLOY_ERR_IO;
        }
        alloy_status st = write_file(path, b->data, size, err, errlen);
        if (!st && binary_path(x, i, true, path, sizeof path)) st = remove_file(path, err, errlen);
        if (st) return st;
    }
    char path[PATH_MAX];
    if (!path_in(path, sizeof path, x->o->dir, "summary.txt")) {
        al_fmt(err, errlen, "the output directory %.200s... is too long a path", x->o->dir);
        return ALLOY_ERR_IO;
    }
    return write_file(path, x->summary.s, x->summary.len, err, errlen);
}

alloy_status cg_export(const ir_graph *g, const schedule *s, const cg_nvrtc *nv, const cg_export_options *o,
                       cg_export_totals *totals, char *err, size_t errlen)
{
    if (!o->dir || !o->dir[0]) {
        al_fmt(err, errlen, "no output directory given");
        return ALLOY_ERR_INVALID;
    }
    if (o->narchs < 1 || o->narchs > CG_MAX_ARCHS || !o->archs) {
        al_fmt(err, errlen, "%d architectures given (1 to %d)", o->narchs, CG_MAX_ARCHS);
        return ALLOY_ERR_INVALID;
    }
    export_state x = {.o = o};
    cg_export_totals tot = {0};
    alloy_status st = resolve_targets(&x, nv, err, errlen);
    if (!st) st = cg_emit(g, s, &x.prog, err, errlen);
    if (!st) st = build_modules(&x, err, errlen);
    if (!st) st = write_sources(&x, o->dir, "output directory", err, errlen);
    if (!st && o->dump_dir && o->dump_dir[0]) st = write_sources(&x, o->dump_dir, "dump directory", err, errlen);
    if (!st && o->cache) {
        const char *dir = o->cache_dir && o->cache_dir[0] ? o->cache_dir : NULL;
        char msg[512];
        st = cg_cache_open(dir, EXPORT_MEM_CACHE, CG_CACHE_DISK_BOUND, &x.cache, msg, sizeof msg);
        if (st)
            al_fmt(err, errlen, "%s (the cache_dir option picks another directory; cache=0 turns the kernel cache off)",
                   msg);
    }
    if (!st) {
        long cores = o->nthreads > 0 ? o->nthreads : sysconf(_SC_NPROCESSORS_ONLN);
        tot.threads = (int)(cores < 1 ? 1 : cores > CG_MAX_THREADS ? CG_MAX_THREADS : cores);
        if (tot.threads > x.nbin && x.nbin > 0) tot.threads = x.nbin;
        double t0 = now_ms();
        alloy_status failed = x.cache ? cg_cache_compile_many(x.cache, nv, x.ks, x.nbin, tot.threads, NULL, x.bins)
                                      : cg_nvrtc_compile_many(nv, x.ks, x.nbin, tot.threads, NULL, x.bins);
        tot.compile_ms = now_ms() - t0;
        if (failed) st = report_failure(&x, err, errlen);
    }
    if (!st) {
        tot.kernels = x.prog.nkernels;
        tot.modules = x.nmodules;
        tot.library_calls = find_library_calls(&x, g, s);
        if (tot.library_calls < 0) {
            al_fmt(err, errlen, "out of memory writing the summary");
            st = ALLOY_ERR_OOM;
        }
        tot.targets = x.ntargets;
        tot.binaries = x.nbin;
        for (int i = 0; i < x.nbin; i++) tot.from_cache += x.bins[i].cached;
        for (int k = 0; k < x.prog.nkernels; k++) tot.bytes += x.prog.kernels[k].bytes;
        format_summary(&x, g, s, nv, &tot);
        if (x.summary.oom) {
            al_fmt(err, errlen, "out of memory writing the summary");
            st = ALLOY_ERR_OOM;
        }
    }
    if (!st) st = write_outputs(&x, err, errlen);
    if (!st && totals) *totals = tot;
    export_free(&x);
    return st;
}
