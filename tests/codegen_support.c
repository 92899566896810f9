/* codegen_support.c - emitted kernels under the host emulation against the CPU backend, and NVRTC compiles in modules (codegen_support.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/convert.h"
#include "codegen/cache.h"
#include "codegen/export.h"
#include "codegen_support.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

double codegen_error(alloy_dtype dt, const void *a, const void *b, int64_t n)
{
    return codegen_error_at_scale(dt, a, b, n, 0);
}

double codegen_error_at_scale(alloy_dtype dt, const void *a, const void *b, int64_t n, double min_scale)
{
    double *x = test_malloc(sizeof(double) * (size_t)(n + 1)), *y = test_malloc(sizeof(double) * (size_t)(n + 1));
    cvt_load_f64(dt, a, x, (size_t)n);
    cvt_load_f64(dt, b, y, (size_t)n);
    double scale = min_scale, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, isfinite(y[i]) ? fabs(y[i]) : 0);
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i]) || isnan(y[i]) || isinf(x[i]) || isinf(y[i])) {
            if (!(isnan(x[i]) && isnan(y[i])) && x[i] != y[i]) worst = INFINITY;
            continue;
        }
        worst = fmax(worst, fabs(x[i] - y[i]) / (scale > 0 ? scale : 1));
    }
    test_free(x), test_free(y);
    return worst;
}

/* Kernels reduce rows in another order (warp and block trees, chunked
 * sums, not the CPU's pairwise ones); elementwise members compute the same
 * expressions and round the same way (test_codegen_ops holds them to the
 * CPU's bits). The error is relative to the tensor's largest element, so a
 * sum that cancels sets the f32 bound: measured 1.8e-5 for a loss of 0.033
 * summed from terms near 1 (the op cases, fp32); 5e-5 leaves room for
 * another CPU's vector path in the reference. A reduce_sum or reduce_mean
 * step's own result is measured against the sum of its terms' magnitudes
 * instead when that is larger (reduction_scale): losses of 1e-4 from terms
 * near 1 occur, and their last bits say nothing of the kernel. */
double codegen_tolerance(alloy_dtype dt)
{
    switch (dt) {
    case ALLOY_F32: return 5e-5;
    case ALLOY_F64: return 1e-12;
    case ALLOY_F16: return 4e-3;
    case ALLOY_BF16: return 3e-2;
    default: return 0;
    }
}

void cgs_prepare(cgs_step *st, alloy_graph *g, const feed_set *f)
{
    memset(st, 0, sizeof *st);
    st->g = g;
    assert_int_equal(state_ensure(g), ALLOY_OK);
    const ir_graph *c = g->compiled;
    int nn = c->nnodes;
    st->ref = test_calloc((size_t)nn + 1, sizeof(rt_tensor));
    st->all = test_calloc((size_t)nn + 1, sizeof(bool));
    st->buf = test_calloc((size_t)nn + 1, sizeof(void *));
    for (int i = 0; i < nn; i++) {
        const ir_node *n = c->nodes[i];
        st->all[i] = true;
        st->buf[i] = test_calloc(ir_nbytes(&n->type) + 8, 1);
        if (n->op == IR_OP_input) {
            for (int k = 0; k < f->n; k++)
                if (strcmp(f->t[k].name, n->name) == 0) memcpy(st->buf[i], f->t[k].data, ir_nbytes(&n->type));
            st->ref[i].data = st->buf[i];
        } else if (n->op == IR_OP_param || n->op == IR_OP_state) {
            rt_state *sv = state_find(g, n->name);
            assert_non_null(sv);
            assert_int_equal(state_host(g, sv), ALLOY_OK);
            memcpy(st->buf[i], sv->cell->host, ir_nbytes(&n->type));
            st->ref[i].data = st->buf[i];
        }
    }
    cpu_exec x = {.nthreads = 1};
    if (cpu_run_graph(&x, c, st->ref, st->all)) fail_msg("cpu: %s", x.error);
    /* every value here has a dense buffer of its own, so the kernels are emitted for dense rows;
     * padded rows (sched_pad) run through the launch plan in test_pad_cuda.c */
    al_free(g->comp.sched.row_stride), g->comp.sched.row_stride = NULL;
    char err[4096];
    if (cg_emit(c, &g->comp.sched, &st->prog, err, sizeof err)) fail_msg("emit: %s", err);
}

char *cgs_rename(const char *text, const char *prefix)
{
    size_t len = strlen(text), plen = strlen(prefix), n = 0;
    static const char name[] = "alloy_s";
    const size_t nlen = sizeof name - 1;
    for (const char *p = strstr(text, name); p; p = strstr(p + nlen, name)) n += isdigit((unsigned char)p[nlen]) != 0;
    char *out = al_malloc(len + n * plen + 1), *o = out;
    if (!out) return NULL;
    for (const char *p = text;;) {
        const char *q = strstr(p, name);
        while (q && !isdigit((unsigned char)q[nlen])) q = strstr(q + nlen, name);
        if (!q) {
            memcpy(o, p, strlen(p) + 1);
            return out;
        }
        memcpy(o, p, (size_t)(q - p) + nlen - 1); /* up to "alloy_" */
        o += (size_t)(q - p) + nlen - 1;
        memcpy(o, prefix, plen), o += plen;
        p = q + nlen - 1;
    }
}

/* Counts a failure in *stats, keeping the first one's text. */
static void note_failure(emu_stats *stats, const char *fmt, ...) AL_PRINTF(2, 3);
static void note_failure(emu_stats *stats, const char *fmt, ...)
{
    if (!stats->failed++) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(stats->first_failure, sizeof stats->first_failure, fmt, ap);
        va_end(ap);
    }
}

/* The largest sum of |terms| behind one result of reduction n (its
 * operand's CPU values x; reduce_mean's divided by the count): a sum added
 * in another order is off by a few ulp of that, however far its value
 * cancels below it (a loss sum(y * r) of terms near 1 that comes out near
 * 1e-4 keeps only the absolute error). */
static double reduction_scale(const ir_node *n, const ir_type *xt, const void *x)
{
    int naxes, r = xt->rank;
    const int64_t *axes = ir_attr_ints(n, "axes", &naxes);
    bool reduced[ALLOY_MAX_RANK];
    for (int d = 0; d < r; d++) reduced[d] = !ir_attr_find(n, "axes");
    for (int i = 0; i < naxes; i++) reduced[axes[i] < 0 ? axes[i] + r : axes[i]] = true;
    int64_t total = ir_numel(xt), nout = ir_numel(&n->type), count = nout ? total / (nout ? nout : 1) : 0;
    double *v = test_malloc(sizeof(double) * (size_t)(total + 1)), *acc = test_calloc((size_t)nout + 1, sizeof(double));
    cvt_load_f64(xt->dtype, x, v, (size_t)total);
    for (int64_t i = 0; i < total; i++) {
        int64_t rest = i, o = 0, stride = 1;
        for (int d = r - 1; d >= 0; d--) {
            int64_t idx = rest % xt->dims[d];
            rest /= xt->dims[d];
            if (!reduced[d]) o += idx * stride, stride *= xt->dims[d];
        }
        if (isfinite(v[i])) acc[o] += fabs(v[i]);
    }
    double scale = 0;
    for (int64_t o = 0; o < nout; o++) scale = fmax(scale, acc[o]);
    if (n->op == IR_OP_reduce_mean && count > 0) scale /= (double)count;
    test_free(v), test_free(acc);
    return scale;
}

/* Compares each value step k of st stores with the CPU's (emu_stats' rules). */
static void compare_step(emu_stats *stats_out, const cgs_step *st, int k)
{
    emu_stats stats = *stats_out;
    const ir_graph *c = st->g->compiled;
    const schedule *s = &st->g->comp.sched;
    const sched_step *step = &s->steps[k];
    rt_tensor *ref = st->ref;
    void **buf = st->buf;
    /* the steps that may sum in an order of their own: row ops, reductions split over blocks or columns, convolutions */
    int last_op = c->nodes[step->pos]->op;
    bool sums = last_op == IR_OP_reduce_sum || last_op == IR_OP_reduce_mean;
    /* (the direct convolution kernels sum in another order than the CPU's im2col GEMM; attention's
     * blockwise kernels than the CPU's blocks) */
    bool convs = last_op == IR_OP_conv1d || last_op == IR_OP_conv2d || last_op == IR_OP_conv_grad_input ||
                 last_op == IR_OP_conv_grad_weight;
    bool attn = last_op == IR_OP_attention || last_op == IR_OP_attention_grad;
    /* sum_squares: f32 sums in another order (chunks, block and warp trees), added in f64; also as a
     * member of the unscale + found_inf multi step (fuse_norm.c) */
    bool squares = last_op == IR_OP_sum_squares;
    int head_op = c->nodes[s->members[step->first].node]->op; /* a gemm step's convolution head sums too */
    bool conv_head = step->kind == STEP_KIND_GEMM && (head_op == IR_OP_conv1d || head_op == IR_OP_conv2d);
    convs |= conv_head;
    stats.conv_gemm_steps += conv_head;
    bool reorders = step->kind == STEP_KIND_ROW || (step->kind == STEP_KIND_GEMM && convs) ||
                    (step->kind == STEP_KIND_OP && (ir_ops[last_op].row || sums || convs || attn || squares));
    for (int m = step->first; m < step->first + step->n; m++) {
        int id = s->members[m].node;
        if (!(s->members[m].flags & MEMBER_STORED)) continue;
        const ir_node *n = c->nodes[id];
        int64_t count = ir_numel(&n->type);
        /* a reduction: the step's own, or a row step's column sum (ir_fuse_colsum) */
        bool sum_here = (sums && id == step->pos) || (step->kind == STEP_KIND_ROW && ir_fuse_colsum(c, n));
        const ir_node *x = sum_here && ir_is_float(n->type.dtype) ? c->nodes[n->in[0]] : NULL;
        double floor = x && ref[x->id].data ? reduction_scale(n, &x->type, ref[x->id].data) : 0;
        double e = codegen_error_at_scale(n->type.dtype, buf[id], ref[id].data, count, floor),
               tol = codegen_tolerance((squares && id == step->pos) || n->op == IR_OP_sum_squares ? ALLOY_F32
                                                                                                    : n->type.dtype);
        stats.values++;
        stats.bitwise += memcmp(buf[id], ref[id].data, ir_nbytes(&n->type)) == 0;
        if (e > stats.worst) stats.worst = e;
        if (!(e <= tol))
            note_failure(&stats, "step %d (%s) %s %%%d (%s): error %.3g against the CPU", k,
                         sched_kind_name(step->kind), ir_ops[n->op].name, id, alloy_dtype_name(n->type.dtype), e);
        int64_t differs;
        if (!reorders && n->op != IR_OP_sum_squares && !test_same_bits(n->type.dtype, buf[id], ref[id].data, count, &differs) && !stats.inexact++)
            snprintf(stats.first_inexact, sizeof stats.first_inexact,
                     "step %d (%s) %s %%%d (%s): element %lld is %.9g, the CPU's %.9g (error %.3g)", k,
                     sched_kind_name(step->kind), ir_ops[n->op].name, id, alloy_dtype_name(n->type.dtype),
                     (long long)differs, test_decode(n->type.dtype, buf[id], differs),
                     test_decode(n->type.dtype, ref[id].data, differs), e);
    }
    *stats_out = stats;
}

/* The last step kernel q (of step k) computes: a chain kernel's
 * (emit_chain.c, "alloy_s<k>_chain<N>") N steps are the first N from k
 * that are not views; any other kernel's, k. */
static int last_step_of(const cgs_step *st, int q, int k)
{
    const schedule *s = &st->g->comp.sched;
    int n = cg_chain_steps(&st->prog.kernels[q]), last = k;
    for (int j = k; j < s->nsteps && n > 0; j++)
        if (!(s->members[s->steps[j].first].flags & MEMBER_VIEW)) last = j, n--;
    return last;
}

emu_stats cgs_emulate(cgs_step *st, const cgs_kernel_at *at)
{
    emu_stats stats = {0};
    const ir_graph *c = st->g->compiled;
    const schedule *s = &st->g->comp.sched;
    const cg_program *prog = &st->prog;
    rt_tensor *ref = st->ref;
    void **buf = st->buf;
    char err[4096];
    stats.kernels = prog->nkernels;
    int next = 0; /* the next kernel, by step */
    /* statistics a step keeps for a later one (CG_PARAM_KEPT), per writing node, for the whole run */
    void **kept = test_calloc((size_t)c->nnodes + 1, sizeof(void *));
    for (int k = 0; k < s->nsteps; k++) {
        const sched_step *step = &s->steps[k];
        if (next >= prog->nkernels || prog->kernels[next].step != k) { /* a library call: the CPU's values */
            for (int m = step->first; m < step->first + step->n; m++) {
                int id = s->members[m].node;
                if (ref[id].data) memcpy(buf[id], ref[id].data, ir_nbytes(&c->nodes[id]->type));
            }
            stats.steps_on_cpu++;
            continue;
        }
        stats.steps_emulated++;
        /* each step on the CPU's values of its inputs: the kernels are compared on the same inputs (a
         * chain kernel's steps on those of the values none of them computes, and the CPU's views) */
        int last = last_step_of(st, next, k);
        for (int j = k; j <= last; j++)
            for (int i = 0; i < s->steps[j].nin; i++) {
                int id = s->inputs[s->steps[j].first_in + i];
                bool inside = s->step_of[id] >= k && s->step_of[id] <= last &&
                              !(s->members[s->steps[s->step_of[id]].first].flags & MEMBER_VIEW);
                if (!inside && ref[id].data && ref[id].data != buf[id])
                    memcpy(buf[id], ref[id].data, ir_nbytes(&c->nodes[id]->type));
            }
        /* scratch of the step (a GEMM's product, per-row results, a flag), shared by its kernels */
        struct {
            cg_param_kind kind;
            int node;
            void *data;
        } scratch[8];
        int nscratch = 0;
        for (; next < prog->nkernels && prog->kernels[next].step == k; next++) {
            const cg_kernel *kn = &prog->kernels[next];
            void **ptrs = test_calloc((size_t)kn->nparams + 1, sizeof(void *));
            void **params = test_calloc((size_t)kn->nparams + 1, sizeof(void *));
            for (int p = 0; p < kn->nparams; p++) {
                const cg_param *pa = &kn->params[p];
                params[p] = &ptrs[p];
                if (pa->kind == CG_PARAM_NODE) {
                    ptrs[p] = buf[pa->node];
                    continue;
                }
                if (pa->kind == CG_PARAM_KEPT) {
                    if (!kept[pa->node]) kept[pa->node] = test_calloc((size_t)(pa->count > 0 ? pa->count : 1) + 1, sizeof(float));
                    ptrs[p] = kept[pa->node];
                    continue;
                }
                int q = 0;
                while (q < nscratch && !(scratch[q].kind == pa->kind && scratch[q].node == pa->node)) q++;
                if (q == nscratch) {
                    assert_true(nscratch < 8);
                    scratch[nscratch].kind = pa->kind, scratch[nscratch].node = pa->node;
                    if (pa->kind == CG_PARAM_PRODUCT && c->nodes[pa->node]->op != IR_OP_matmul) {
                        /* a convolution's product: its kernel, the step's first, writes it */
                        scratch[nscratch].data = test_calloc((size_t)ir_numel(&c->nodes[pa->node]->type) + 1, sizeof(float));
                    } else if (pa->kind == CG_PARAM_PRODUCT) { /* the library GEMM's f32 product */
                        const ir_node *mm = c->nodes[pa->node];
                        rt_tensor out = {mm->type, test_calloc((size_t)ir_numel(&mm->type) + 1, sizeof(float))};
                        out.type.dtype = ALLOY_F32;
                        rt_tensor in[2] = {{c->nodes[mm->in[0]]->type, buf[mm->in[0]]},
                                           {c->nodes[mm->in[1]]->type, buf[mm->in[1]]}};
                        cpu_exec mx = {.nthreads = 1};
                        assert_int_equal(cpu_matmul(&mx, mm, &out, in), ALLOY_OK);
                        scratch[nscratch].data = out.data;
                    } else { /* per-row results, or a zeroed flag */
                        scratch[nscratch].data = test_calloc((size_t)(pa->count > 0 ? pa->count : 1) + 1, sizeof(double));
                    }
                    nscratch++;
                }
                ptrs[p] = scratch[q].data;
            }
            unsigned grid[3] = {kn->grid, 1, 1}, block[3] = {kn->block, 1, 1};
            emu_kernel *ek = at[next].library;
            if (emu_select(ek, at[next].name, err, sizeof err)) note_failure(&stats, "%s", err);
            else if (emu_launch(ek, grid, block, params, err, sizeof err)) note_failure(&stats, "%s: %s", kn->name, err);
            test_free(ptrs), test_free(params);
        }
        for (int q = 0; q < nscratch; q++) test_free(scratch[q].data);
        for (int j = k; j <= last; j++)
            if (!(s->members[s->steps[j].first].flags & MEMBER_VIEW)) compare_step(&stats, st, j);
        k = last;
    }
    for (int i = 0; i < c->nnodes; i++)
        if (kept[i]) test_free(kept[i]);
    test_free(kept);
    return stats;
}

void cgs_release(cgs_step *st)
{
    cg_program_free(&st->prog);
    if (!st->g) return;
    const ir_graph *c = st->g->compiled;
    cpu_release_values(c, st->ref);
    for (int i = 0; i < c->nnodes; i++) test_free(st->buf[i]);
    test_free(st->buf), test_free(st->ref), test_free(st->all);
    memset(st, 0, sizeof *st);
}

emu_kernel *cgs_compile(const cgs_step *st, cgs_kernel_at **at)
{
    char err[4096];
    /* every kernel in one library: one compile */
    char *module = cg_module_source(&st->prog, 0, st->prog.nkernels);
    assert_non_null(module);
    emu_kernel *ek = st->prog.nkernels ? emu_compile(module, st->prog.kernels[0].name, err, sizeof err) : NULL;
    al_free(module);
    if (st->prog.nkernels && !ek) fail_msg("%s", err);
    *at = test_calloc((size_t)st->prog.nkernels + 1, sizeof **at);
    for (int k = 0; k < st->prog.nkernels; k++) {
        (*at)[k].library = ek;
        snprintf((*at)[k].name, sizeof (*at)[k].name, "%s", st->prog.kernels[k].name);
    }
    return ek;
}

emu_stats emulate_step(alloy_graph *g, const feed_set *f)
{
    cgs_step st;
    cgs_prepare(&st, g, f);
    cgs_kernel_at *at;
    emu_kernel *ek = cgs_compile(&st, &at);
    emu_stats stats = cgs_emulate(&st, at);
    test_free(at);
    if (stats.failed) fail_msg("%s", stats.first_failure);
    emu_free(ek);
    cgs_release(&st);
    return stats;
}

double compile_all(const cg_nvrtc *nv, const char *dir, cg_program *programs, int n, const int *archs, int narchs,
                   int *modules, int *compiles)
{
    cg_cache *cache;
    char err[1024];
    if (cg_cache_open(dir, 64 << 20, 0, &cache, err, sizeof err)) fail_msg("cache: %s", err);
    int total = 0;
    for (int i = 0; i < n; i++) total += cg_module_count(programs[i].nkernels) * narchs;
    cg_kernel_src *ks = test_calloc((size_t)total + 1, sizeof *ks);
    cg_binary *out = test_calloc((size_t)total + 1, sizeof *out);
    char **sources = test_calloc((size_t)total + 1, sizeof *sources), (*names)[32] = test_calloc((size_t)total + 1, 32);
    int at = 0;
    for (int i = 0; i < n; i++)
        for (int m = 0; m < cg_module_count(programs[i].nkernels); m++)
            for (int a = 0; a < narchs; a++) {
                int first, count;
                cg_module_range(programs[i].nkernels, m, &first, &count);
                sources[at] = cg_module_source(&programs[i], first, count);
                assert_non_null(sources[at]);
                snprintf(names[at], 32, "alloy_p%d_m%d", i, m);
                ks[at] = (cg_kernel_src){.name = names[at], .source = sources[at], .sm = archs[a]};
                at++;
            }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double t0 = test_now_ms();
    cg_cache_compile_many(cache, nv, ks, total, cores > 1 ? (int)cores : 1, NULL, out);
    double ms = test_now_ms() - t0;
    for (int i = 0; i < total; i++) {
        if (out[i].status) fail_msg("%s for sm_%d: %s", ks[i].name, ks[i].sm, out[i].message ? out[i].message : "failed");
        assert_true(out[i].size > 0 && out[i].kind == CG_CUBIN);
        assert_memory_equal(out[i].data, "\x7f" "ELF", 4);
        cg_binary_free(&out[i]);
        al_free(sources[i]);
    }
    *modules = total;
    *compiles = (int)cg_cache_get_stats(cache).compiles;
    cg_cache_close(cache);
    test_free(ks), test_free(out), test_free(sources), test_free(names);
    return ms;
}

float *feed_floats(feed_set *f, const char *name, int rank, const int64_t *dims, int64_t *n)
{
    if (f->n >= (int)(sizeof f->t / sizeof f->t[0])) fail_msg("feed %s: the feed set is full", name);
    alloy_host_tensor *t = &f->t[f->n++];
    *t = (alloy_host_tensor){name, ALLOY_F32, rank, {0}, NULL};
    *n = 1;
    for (int d = 0; d < rank; d++) *n *= t->dims[d] = dims[d];
    t->data = test_malloc(sizeof(float) * (size_t)*n);
    return t->data;
}

void feed_set_free(feed_set *f)
{
    for (int i = 0; i < f->n; i++) test_free(f->t[i].data);
    f->n = 0;
}

void emu_or_skip(void)
{
    char why[256];
    if (!emu_available(why, sizeof why)) {
        print_message("no host emulation: %s\n", why);
        skip();
    }
}

cg_nvrtc *nvrtc_or_skip(void)
{
    cg_nvrtc *nv;
    char err[1024];
    if (cg_nvrtc_open(NULL, &nv, err, sizeof err)) {
        print_message("no NVRTC: %s\n", err);
        skip();
    }
    return nv;
}
