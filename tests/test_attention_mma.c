/* test_attention_mma.c - attention's tensor-core kernels (emit_attention_mma.c and _grad.c, mma.sync.m16n8k16 on f16/bf16, ldmatrix, cp.async), forward and backward (also on the forward's kept logsumexp), run on the host emulation against attention and its gradient written out in f64, causal or not, at odd lengths and head dims 16-128; the SIMT kernels where the mma ones do not apply; the 7 products per tile in the emitted source; all NVRTC-compiled for sm_80 and sm_90, ptxas' spills read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/alloy.h"
#include "base/convert.h"
#include "codegen/ptxas.h"
#include "codegen_support.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* One attention of a test graph: dtype, [b, h, t, d] queries over s keys,
 * whether the emitter should give it the tensor-core kernel, and whether
 * its attention_grad takes the forward's own output as o (so the backward
 * reads the logsumexp the forward kept) rather than an o of its own. */
typedef struct mcase {
    alloy_dtype dt;
    int64_t b, h, t, s, d;
    bool causal, mma, kept;
} mcase;

/* f16 and bf16 at lengths 17, 63, 65, 129 (no multiple of the 16-row warp
 * tile or the 64-key tile), head dims 16-128, batch x heads > 1; T > S (the
 * first causal rows see no key: zeros) and T < S; then what the mma kernel
 * does not take: head dims 24 and 8, and f32. */
#define MMA_CASES(DT)                                                                                                  \
    {DT, 1, 2, 17, 17, 16, true, true, false}, {DT, 2, 1, 17, 17, 16, false, true, false}, {DT, 1, 3, 63, 63, 32, true, true, false},      \
        {DT, 2, 2, 65, 65, 64, false, true, false}, {DT, 1, 2, 129, 129, 128, true, true, false}, {DT, 1, 1, 129, 129, 128, false, true, false}, \
        {DT, 1, 2, 65, 17, 64, true, true, false}, {DT, 2, 1, 17, 63, 32, true, true, false}, {DT, 1, 2, 33, 33, 24, true, false, false},    \
        {DT, 1, 1, 20, 20, 8, false, false, false}
/* (the backward on the forward's kept logsumexp: head dims 64 and 128, causal and not) */
#define KEPT_CASES(DT) {DT, 1, 2, 65, 65, 64, true, true, true}, {DT, 1, 1, 33, 47, 128, false, true, true}
static const mcase f16_cases[] = {MMA_CASES(ALLOY_F16), KEPT_CASES(ALLOY_F16), {ALLOY_F32, 1, 2, 17, 17, 64, true, false, false}};
static const mcase bf16_cases[] = {MMA_CASES(ALLOY_BF16), KEPT_CASES(ALLOY_BF16)};

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(double lo, double hi)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (double)(rng >> 11) * 0x1p-53;
}

/* A graph of every case's attention, y<i> = attention(q<i>, k<i>, v<i>),
 * scale 1/sqrt(d), and its feeds: q and k in [-2, 2) (peaked rows), v in
 * [-1, 1), rounded to the dtype. */
static alloy_graph *cases_graph(const mcase *c, int n, feed_set *f)
{
    alloy_graph *g = alloy_graph_new("attention_mma");
    assert_non_null(g);
    memset(f, 0, sizeof *f);
    assert_true(3 * n <= (int)(sizeof f->t / sizeof f->t[0]));
    for (int i = 0; i < n; i++) {
        int64_t qd[4] = {c[i].b, c[i].h, c[i].t, c[i].d}, kd[4] = {c[i].b, c[i].h, c[i].s, c[i].d};
        alloy_tensor *x[3];
        for (int j = 0; j < 3; j++) {
            alloy_host_tensor *t = &f->t[f->n++];
            char *name = test_malloc(16);
            snprintf(name, 16, "%c%d", "qkv"[j], i);
            x[j] = alloy_input(g, name, c[i].dt, 4, j ? kd : qd);
            assert_non_null(x[j]);
            *t = (alloy_host_tensor){name, c[i].dt, 4, {0}, NULL};
            memcpy(t->dims, j ? kd : qd, sizeof qd);
            int64_t count = alloy_host_tensor_numel(t);
            double *v = test_malloc(sizeof(double) * (size_t)(count + 1));
            for (int64_t e = 0; e < count; e++) v[e] = j < 2 ? uniform(-2, 2) : uniform(-1, 1);
            t->data = test_malloc(alloy_dtype_size(c[i].dt) * (size_t)(count + 1));
            cvt_store_f64(c[i].dt, v, t->data, (size_t)count);
            test_free(v);
        }
        alloy_tensor *y = alloy_attention(g, x[0], x[1], x[2], c[i].causal, 1 / sqrt((double)c[i].d));
        assert_non_null(y);
        char name[16];
        snprintf(name, sizeof name, "y%d", i);
        assert_int_equal(alloy_output(g, name, y), ALLOY_OK);
        /* attention_grad(q, k, v, o, do) on o and do of their own (any o: delta = do.o is an input of the formulas) */
        int ids[5] = {((ir_node *)(void *)x[0])->id, ((ir_node *)(void *)x[1])->id, ((ir_node *)(void *)x[2])->id,
                      ((ir_node *)(void *)y)->id, 0};
        for (int j = c[i].kept; j < 2; j++) {
            alloy_host_tensor *t = &f->t[f->n++];
            char *in_name = test_malloc(16);
            snprintf(in_name, 16, "%c%d", "od"[j], i);
            alloy_tensor *xin = alloy_input(g, in_name, c[i].dt, 4, qd);
            assert_non_null(xin);
            ids[3 + j] = ((ir_node *)(void *)xin)->id;
            *t = (alloy_host_tensor){in_name, c[i].dt, 4, {0}, NULL};
            memcpy(t->dims, qd, sizeof qd);
            int64_t count = alloy_host_tensor_numel(t);
            double *v = test_malloc(sizeof(double) * (size_t)(count + 1));
            for (int64_t e = 0; e < count; e++) v[e] = uniform(-0.5, 0.5);
            t->data = test_malloc(alloy_dtype_size(c[i].dt) * (size_t)(count + 1));
            cvt_store_f64(c[i].dt, v, t->data, (size_t)count);
            test_free(v);
        }
        ir_attr attrs[2] = {{.name = "causal", .kind = IR_ATTR_BOOL, .i = c[i].causal},
                            {.name = "scale", .kind = IR_ATTR_FLOAT, .f = 1 / sqrt((double)c[i].d)}};
        snprintf(name, sizeof name, "g%d", i);
        ir_node *gn = ir_add_node(g->ir, IR_OP_attention_grad, 5, ids, 2, attrs, NULL, name);
        assert_non_null(gn);
        assert_int_equal(ir_add_output(g->ir, name, gn->id), ALLOY_OK);
    }
    assert_int_equal(alloy_graph_set_option(g, "device", "cpu"), ALLOY_OK);
    return g;
}

static void free_feeds(feed_set *f)
{
    for (int i = 0; i < f->n; i++) test_free((void *)f->t[i].name), test_free(f->t[i].data);
}

/* Which case an attention node of the compiled graph is: its q input's name "q<i>". */
static int case_of(const ir_graph *c, const ir_node *n)
{
    const char *name = c->nodes[n->in[0]]->name;
    assert_true(name && name[0] == 'q');
    return atoi(name + 1);
}

/* The worst |error| / bound of kernel output y (case mc, compiled node n)
 * against attention written out in f64 from the same (rounded) inputs.
 * The bound: the mma kernel rounds each probability p_j to the dtype
 * (unit roundoff u: 2^-11 f16, 2^-8 bf16) and divides by the sum of the
 * rounded values, so each weight w_j = p_j / sum p is off by at most
 * 2u / (1 - u) of itself and, the weights summing to 1 either way,
 * |o' - o| <= 2u / (1 - u) sum_j w_j |v_j - o| <= 2u / (1 - u) spread, with
 * spread = max over the row's visible keys of |v_j - o|; f32 scores, sums
 * and rescaling add S 2^-24 + 2^-20 of the spread; the store rounds once
 * (u |o|, and 2^-24 for an f16 subnormal). The SIMT kernel keeps p in f32:
 * the same bound holds for it. A row that sees no key must be 0 exactly. */
static double check_case(const mcase *mc, const void *const in[3], const void *y, double *worst_abs)
{
    int64_t BH = mc->b * mc->h, T = mc->t, S = mc->s, D = mc->d;
    double u = mc->dt == ALLOY_F16 ? 0x1p-11 : mc->dt == ALLOY_BF16 ? 0x1p-8 : 0x1p-24, scale = 1 / sqrt((double)D);
    double *q = test_malloc(sizeof(double) * (size_t)(BH * T * D)), *k = test_malloc(sizeof(double) * (size_t)(BH * S * D)),
           *v = test_malloc(sizeof(double) * (size_t)(BH * S * D)), *got = test_malloc(sizeof(double) * (size_t)(BH * T * D)),
           *w = test_malloc(sizeof(double) * (size_t)(S + 1));
    cvt_load_f64(mc->dt, in[0], q, (size_t)(BH * T * D));
    cvt_load_f64(mc->dt, in[1], k, (size_t)(BH * S * D));
    cvt_load_f64(mc->dt, in[2], v, (size_t)(BH * S * D));
    cvt_load_f64(mc->dt, y, got, (size_t)(BH * T * D));
    double worst = 0;
    for (int64_t bh = 0; bh < BH; bh++)
        for (int64_t i = 0; i < T; i++) {
            int64_t lim = mc->causal ? i + S - T + 1 : S;
            lim = lim < 0 ? 0 : lim > S ? S : lim;
            double m = -INFINITY, l = 0;
            for (int64_t j = 0; j < lim; j++) {
                double s = 0;
                for (int64_t d = 0; d < D; d++) s += q[(bh * T + i) * D + d] * k[(bh * S + j) * D + d];
                w[j] = s * scale;
                m = fmax(m, w[j]);
            }
            for (int64_t j = 0; j < lim; j++) w[j] = exp(w[j] - m), l += w[j];
            for (int64_t d = 0; d < D; d++) {
                double o = 0, spread = 0, g = got[(bh * T + i) * D + d];
                for (int64_t j = 0; j < lim; j++) o += w[j] / l * v[(bh * S + j) * D + d];
                for (int64_t j = 0; j < lim; j++) spread = fmax(spread, fabs(v[(bh * S + j) * D + d] - o));
                double bound = (2 * u / (1 - u) + (double)S * 0x1p-24 + 0x1p-20) * spread + u * fabs(o) + 0x1p-24;
                double err = fabs(g - o);
                if (lim == 0) bound = 0, err = g == 0 ? 0 : INFINITY;
                if (!(err <= bound))
                    fail_msg("%s [%lld,%lld,%lld,%lld] over %lld keys%s: (batch x head %lld) row %lld, column %lld: %.9g, written out %.9g "
                             "(error %.3g, bound %.3g)",
                             alloy_dtype_name(mc->dt), (long long)mc->b, (long long)mc->h, (long long)T, (long long)D,
                             (long long)S, mc->causal ? " causal" : "", (long long)bh, (long long)i, (long long)d, g, o, err,
                             bound);
                if (bound > 0) worst = fmax(worst, err / bound);
                *worst_abs = fmax(*worst_abs, err);
            }
        }
    test_free(q), test_free(k), test_free(v), test_free(got), test_free(w);
    return worst;
}

/* The worst |error| / bound of attention_grad's output (dq, dk, dv stacked
 * per (batch, head)) against the f64 formulas on the same inputs: P the
 * softmax, dP_ij = do_i.v_j, delta_i = do_i.o_i, dS = P (dP - delta), dq =
 * scale dS k, dk = scale dS^T q, dv = P^T do. The bound is per element over
 * the magnitude of its terms: the mma kernels round dS and P to the dtype
 * before their second products (u of each term; for f16 also 2^-25 absolute,
 * an f16 subnormal's rounding), and compute P and dP - delta in f32 (2^-14
 * relative of P, 2^-20 of sum_d |do_d v_d| + |delta|, well above f32's own
 * errors); the store rounds once (u |result|). */
static double check_grad(const mcase *mc, const void *const in[5], const void *y, double *worst_abs)
{
    int64_t BH = mc->b * mc->h, T = mc->t, S = mc->s, D = mc->d;
    double u = mc->dt == ALLOY_F16 ? 0x1p-11 : mc->dt == ALLOY_BF16 ? 0x1p-8 : 0x1p-24, scale = 1 / sqrt((double)D);
    double sub = mc->dt == ALLOY_F16 ? 0x1p-25 : 0;
    int64_t nq = BH * T * D, nk = BH * S * D, ng = BH * (T + 2 * S) * D;
    double *x[5], *got = test_malloc(sizeof(double) * (size_t)ng), *want = test_calloc((size_t)ng, sizeof(double)),
                  *bound = test_calloc((size_t)ng, sizeof(double));
    for (int j = 0; j < 5; j++) {
        int64_t n = j == 1 || j == 2 ? nk : nq;
        x[j] = test_malloc(sizeof(double) * (size_t)n);
        cvt_load_f64(mc->dt, in[j], x[j], (size_t)n);
    }
    cvt_load_f64(mc->dt, y, got, (size_t)ng);
    double *P = test_malloc(sizeof(double) * (size_t)(T * S)), *dS = test_malloc(sizeof(double) * (size_t)(T * S)),
           *eS = test_malloc(sizeof(double) * (size_t)(T * S));
    for (int64_t bh = 0; bh < BH; bh++) {
        const double *q = x[0] + bh * T * D, *k = x[1] + bh * S * D, *v = x[2] + bh * S * D, *o = x[3] + bh * T * D,
                     *dO = x[4] + bh * T * D;
        double *dq = want + bh * (T + 2 * S) * D, *dk = dq + T * D, *dv = dk + S * D;
        double *bq = bound + bh * (T + 2 * S) * D, *bk = bq + T * D, *bv = bk + S * D;
        for (int64_t i = 0; i < T; i++) {
            int64_t lim = mc->causal ? i + S - T + 1 : S;
            lim = lim < 0 ? 0 : lim > S ? S : lim;
            double m = -INFINITY, l = 0, delta = 0, dmag = 0;
            for (int64_t d = 0; d < D; d++) delta += dO[i * D + d] * o[i * D + d], dmag += fabs(dO[i * D + d] * o[i * D + d]);
            for (int64_t j = 0; j < S; j++) {
                double s = 0;
                for (int64_t d = 0; d < D; d++) s += q[i * D + d] * k[j * D + d];
                P[i * S + j] = j < lim ? s * scale : -INFINITY;
                if (j < lim) m = fmax(m, P[i * S + j]);
            }
            for (int64_t j = 0; j < S; j++) P[i * S + j] = j < lim ? exp(P[i * S + j] - m) : 0, l += P[i * S + j];
            for (int64_t j = 0; j < S; j++) {
                double p = l > 0 ? P[i * S + j] / l : 0, dp = 0, mag = 0;
                for (int64_t d = 0; d < D; d++) dp += dO[i * D + d] * v[j * D + d], mag += fabs(dO[i * D + d] * v[j * D + d]);
                P[i * S + j] = p;
                dS[i * S + j] = p * (dp - delta);
                eS[i * S + j] = p * (fabs(dp - delta) * (u + 0x1p-14) + 0x1p-20 * (mag + dmag));
            }
        }
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < S; j++)
                for (int64_t d = 0; d < D; d++) {
                    double ds = dS[i * S + j], p = P[i * S + j], es = eS[i * S + j] + (p > 0 ? sub : 0);
                    dq[i * D + d] += scale * ds * k[j * D + d];
                    bq[i * D + d] += scale * es * fabs(k[j * D + d]);
                    dk[j * D + d] += scale * ds * q[i * D + d];
                    bk[j * D + d] += scale * es * fabs(q[i * D + d]);
                    dv[j * D + d] += p * dO[i * D + d];
                    bv[j * D + d] += (p * (u + 0x1p-14) + (p > 0 ? sub : 0)) * fabs(dO[i * D + d]);
                }
    }
    double worst = 0;
    for (int64_t e = 0; e < ng; e++) {
        double b = bound[e] + u * fabs(want[e]) + 0x1p-24, err = fabs(got[e] - want[e]);
        int64_t bh = e / ((T + 2 * S) * D), r = e / D % (T + 2 * S);
        if (!(err <= b))
            fail_msg("%s [%lld,%lld,%lld,%lld] over %lld keys%s, attention_grad: (batch x head %lld) %s row %lld, column %lld: "
                     "%.9g, written out %.9g (error %.3g, bound %.3g)",
                     alloy_dtype_name(mc->dt), (long long)mc->b, (long long)mc->h, (long long)T, (long long)D, (long long)S,
                     mc->causal ? " causal" : "", (long long)bh, r < T ? "dq" : r < T + S ? "dk" : "dv",
                     (long long)(r < T ? r : r < T + S ? r - T : r - T - S), (long long)(e % D), got[e], want[e], err, b);
        worst = fmax(worst, err / b);
        *worst_abs = fmax(*worst_abs, err);
    }
    for (int j = 0; j < 5; j++) test_free(x[j]);
    test_free(got), test_free(want), test_free(bound), test_free(P), test_free(dS), test_free(eS);
    return worst;
}

/* Emits, emulates and checks every case of c: the kernel kind the emitter
 * chose, then each output against the f64 reference. */
static void run_cases(const mcase *c, int n, const char *what, bool shuffles)
{
    char why[256];
    if (!emu_available(why, sizeof why)) {
        print_message("no host emulation: %s\n", why);
        skip();
    }
    feed_set f;
    alloy_graph *g = cases_graph(c, n, &f);
    cgs_step st;
    cgs_prepare(&st, g, &f);
    const ir_graph *cg = g->compiled;
    /* the kernel each attention got: the mma one names the tensor-core product */
    int seen = 0;
    for (int kn = 0; kn < st.prog.nkernels; kn++) {
        const cg_kernel *ker = &st.prog.kernels[kn];
        const ir_node *node = cg->nodes[g->comp.sched.steps[ker->step].pos];
        if (node->op != IR_OP_attention && node->op != IR_OP_attention_grad) continue;
        const mcase *mc = &c[case_of(cg, node)];
        bool mma = strstr(ker->source + ker->body, "alloy_mma_m16n8k16_") != NULL;
        if (mma != mc->mma)
            fail_msg("%s head_dim %lld: the %s kernel, expected the %s one", alloy_dtype_name(mc->dt), (long long)mc->d,
                     mma ? "mma" : "SIMT", mc->mma ? "mma" : "SIMT");
        if (mma) assert_int_equal(ker->block, 128);
        /* a kept case's key kernel reads the forward's logsumexp; the others' read the one their row pass computed */
        bool reads_kept = false;
        for (int p = 0; p < ker->nparams; p++) reads_kept |= ker->params[p].kind == CG_PARAM_KEPT && !ker->params[p].written;
        if (node->op == IR_OP_attention_grad && mma && strstr(ker->name, "_keys") && reads_kept != mc->kept)
            fail_msg("%s: %s the forward's kept logsumexp", ker->name, reads_kept ? "reads" : "does not read");
        seen++;
    }
    /* the forward's kernel; the backward's two (SIMT) or, mma, the row pass, the key blocks and (over 64 keys) dq */
    int want = 0;
    for (int i = 0; i < n; i++) want += c[i].mma && c[i].s > 64 ? 4 : 3;
    assert_int_equal(seen, want);
    char err[4096];
    char *module = cg_module_source(&st.prog, 0, st.prog.nkernels);
    assert_non_null(module);
    /* with shuffles: the source's pre-sm_80 form of the product (warp shuffles) instead of the emulation's mma */
    const char *cxx0 = getenv("CXX");
    char *saved = cxx0 ? test_malloc(strlen(cxx0) + 1) : NULL, cxx[512];
    if (saved) strcpy(saved, cxx0);
    snprintf(cxx, sizeof cxx, "%s -DALLOY_EMU_MMA_SHUFFLES", cxx0 && *cxx0 ? cxx0 : "c++");
    if (shuffles) setenv("CXX", cxx, 1);
    emu_kernel *ek = emu_compile(module, st.prog.kernels[0].name, err, sizeof err);
    if (shuffles && saved) setenv("CXX", saved, 1);
    else if (shuffles) unsetenv("CXX");
    test_free(saved);
    al_free(module);
    if (!ek) fail_msg("%s", err);
    cgs_kernel_at *at = test_calloc((size_t)st.prog.nkernels + 1, sizeof *at);
    for (int k = 0; k < st.prog.nkernels; k++) {
        at[k].library = ek;
        snprintf(at[k].name, sizeof at[k].name, "%s", st.prog.kernels[k].name);
    }
    emu_stats stats = cgs_emulate(&st, at);
    test_free(at);
    /* a launch that failed (a missing lane, a divergent barrier) fails here; values against the CPU are checked below
     * against the f64 reference instead */
    for (int i = 0; i < cg->nnodes; i++) {
        const ir_node *node = cg->nodes[i];
        if (node->op != IR_OP_attention) continue;
        const mcase *mc = &c[case_of(cg, node)];
        double worst_abs = 0, worst, gworst_abs = 0, gworst;
        const void *in[3] = {st.buf[node->in[0]], st.buf[node->in[1]], st.buf[node->in[2]]};
        worst = check_case(mc, in, st.buf[i], &worst_abs);
        char gname[16];
        snprintf(gname, sizeof gname, "g%d", case_of(cg, node));
        const ir_node *gn = cg->nodes[ir_find_name(cg, gname)];
        const void *gin[5] = {st.buf[gn->in[0]], st.buf[gn->in[1]], st.buf[gn->in[2]], st.buf[gn->in[3]], st.buf[gn->in[4]]};
        gworst = check_grad(mc, gin, st.buf[gn->id], &gworst_abs);
        print_message("# %s [%lld,%lld,%lld,%lld] over %lld keys%s, %s kernels: forward worst error %.3g (%.2f of the bound), "
                      "backward %.3g (%.2f)\n",
                      alloy_dtype_name(mc->dt), (long long)mc->b, (long long)mc->h, (long long)mc->t, (long long)mc->d,
                      (long long)mc->s, mc->causal ? " causal" : "", mc->mma ? "mma" : "SIMT", worst_abs, worst, gworst_abs,
                      gworst);
    }
    if (stats.failed && strstr(stats.first_failure, "against the CPU") == NULL) fail_msg("%s: %s", what, stats.first_failure);
    print_message("# %s: %d kernels emulated, worst error against the CPU backend %.3g\n", what, stats.kernels, stats.worst);
    emu_free(ek);
    cgs_release(&st);
    free_feeds(&f);
    alloy_graph_free(g);
}

static void test_f16_attention_on_tensor_cores_matches_the_f64_reference(void **state)
{
    (void)state;
    run_cases(f16_cases, (int)(sizeof f16_cases / sizeof f16_cases[0]), "f16", false);
}

static void test_bf16_attention_on_tensor_cores_matches_the_f64_reference(void **state)
{
    (void)state;
    run_cases(bf16_cases, (int)(sizeof bf16_cases / sizeof bf16_cases[0]), "bf16", false);
}

/* The pre-sm_80 form of the product (the same fragments through warp
 * shuffles and FMAs, what an sm_75 build runs) on the same cases. */
static void test_the_shuffle_form_for_gpus_before_sm80_matches_too(void **state)
{
    (void)state;
    run_cases(f16_cases, (int)(sizeof f16_cases / sizeof f16_cases[0]), "f16, mma by shuffles", true);
    run_cases(bf16_cases, (int)(sizeof bf16_cases / sizeof bf16_cases[0]), "bf16, mma by shuffles", true);
}

/* How many tensor-core products kernel kn's body calls (MMA_ sites, each
 * once per 16 x 8 x 16 block of a tile's product). */
static int products_in(const cg_kernel *kn)
{
    int count = 0;
    for (const char *at = kn->source + kn->body; (at = strstr(at, "MMA_(")) != NULL; at++) count++;
    return count;
}

/* FlashAttention-2's structure: the forward computes 2 QK^T-sized products
 * per tile (S = Q K^T, O += P V) and keeps the rows' logsumexp; the backward
 * is one kernel over key blocks with the other 5 (S, dP = dO V^T, dV += P^T
 * dO, dK += dS^T Q, dQ += dS K, dQ in f32 through atomicAdd), beside a row
 * pass with none (delta, the accumulator zeroed) and, over 64 keys, dq's
 * rounding; the
 * fragments of the shared tiles load with ldmatrix (.trans for V, dO and K
 * as B operands), the K/V (forward) and Q/dO (backward) tiles with
 * cp.async 16-byte copies, double-buffered. */
static void test_attention_runs_at_seven_products_per_tile_with_ldmatrix_and_cp_async(void **state)
{
    (void)state;
    static const mcase cases[] = {{ALLOY_F16, 1, 2, 65, 65, 64, true, true, true}, {ALLOY_BF16, 1, 1, 33, 33, 128, false, true, true}};
    feed_set f;
    alloy_graph *g = cases_graph(cases, 2, &f);
    if (graph_compile(g)) fail_msg("%s", alloy_last_error(g));
    cg_program prog;
    char err[1024];
    if (cg_emit(g->compiled, &g->comp.sched, &prog, err, sizeof err)) fail_msg("%s", err);
    const ir_graph *c = g->compiled;
    int forward = 0, keys = 0, rows = 0, dq = 0;
    for (int q = 0; q < prog.nkernels; q++) {
        const cg_kernel *kn = &prog.kernels[q];
        const ir_node *node = c->nodes[g->comp.sched.steps[kn->step].pos];
        const char *body = kn->source + kn->body;
        if (node->op == IR_OP_attention) {
            assert_int_equal(products_in(kn), 2);
            bool keeps = false;
            for (int p = 0; p < kn->nparams; p++) keeps |= kn->params[p].kind == CG_PARAM_KEPT && kn->params[p].written;
            assert_true(keeps);
            assert_non_null(strstr(body, "alloy_ldmatrix_x4("));
            assert_non_null(strstr(body, "alloy_ldmatrix_x4_trans("));
            assert_non_null(strstr(body, "alloy_cp_async_16("));
            assert_non_null(strstr(body, "alloy_cp_async_wait_"));
            forward++;
        } else if (node->op == IR_OP_attention_grad && strstr(kn->name, "_keys")) {
            assert_int_equal(products_in(kn), 5);
            /* over 64 keys, several key blocks add into dq's f32 accumulator; at most 64, the one stores dq */
            assert_true((strstr(body, "atomicAdd(") != NULL) == (cases[case_of(c, node)].s > 64));
            assert_non_null(strstr(body, "alloy_ldmatrix_x4_trans("));
            assert_non_null(strstr(body, "alloy_cp_async_16("));
            keys++;
        } else if (node->op == IR_OP_attention_grad && strstr(kn->name, "_dq")) {
            assert_int_equal(products_in(kn), 0);
            dq++;
        } else if (node->op == IR_OP_attention_grad) {
            assert_int_equal(products_in(kn), 0);
            rows++;
        }
    }
    assert_int_equal(forward, 2), assert_int_equal(keys, 2), assert_int_equal(rows, 2), assert_int_equal(dq, 1);
    cg_program_free(&prog);
    free_feeds(&f);
    alloy_graph_free(g);
}

/* Both groups' kernels (mma and SIMT) through NVRTC for sm_80 and sm_90, f16's for sm_75. */
static void test_the_kernels_compile_for_sm80_and_sm90(void **state)
{
    (void)state;
    cg_nvrtc *nv = nvrtc_or_skip();
    cg_program programs[2];
    const mcase *groups[2] = {f16_cases, bf16_cases};
    int sizes[2] = {(int)(sizeof f16_cases / sizeof f16_cases[0]), (int)(sizeof bf16_cases / sizeof bf16_cases[0])};
    char err[1024];
    for (int i = 0; i < 2; i++) {
        feed_set f;
        alloy_graph *g = cases_graph(groups[i], sizes[i], &f);
        if (graph_compile(g)) fail_msg("%s", alloy_last_error(g));
        if (cg_emit(g->compiled, &g->comp.sched, &programs[i], err, sizeof err)) fail_msg("%s", err);
        free_feeds(&f);
        alloy_graph_free(g);
    }
    char dir[] = "/tmp/alloy-kcache-XXXXXX", cmd[128];
    assert_non_null(mkdtemp(dir));
    static const int archs[] = {80, 90};
    int modules, compiles;
    double ms = compile_all(nv, dir, programs, 2, archs, 2, &modules, &compiles);
    print_message("# %d + %d attention kernels in %d NVRTC programs for sm_80 and sm_90: %.0f ms\n", programs[0].nkernels,
                  programs[1].nkernels, modules, ms);
    /* and the shuffle form, for sm_75 (f16's kernels: bf16's differ only in the conversion) */
    static const int turing[] = {75};
    ms = compile_all(nv, dir, programs, 1, turing, 1, &modules, &compiles);
    print_message("# %d f16 attention kernels for sm_75 (the mma by shuffles): %.0f ms\n", programs[0].nkernels, ms);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    for (int i = 0; i < 2; i++) cg_program_free(&programs[i]);
    cg_nvrtc_close(nv);
}

/* ptxas's resources of the tensor-core kernels (forward, the backward's
 * two or three) for sm_80 and sm_90 at head dims 64 and 128, f16 and bf16: no
 * spill at head dim 64; at 128 what ptxas reports is printed. */
static void test_the_kernels_spill_nothing_at_head_dim_64(void **state)
{
    (void)state;
    cg_nvrtc *nv = nvrtc_or_skip();
    /* over 64 keys (dq through the f32 accumulator and its own kernel) and at most 64 (the key kernel stores it) */
    static const mcase cases[] = {{ALLOY_F16, 1, 2, 65, 65, 64, true, true, true},
                                  {ALLOY_BF16, 1, 2, 33, 33, 64, false, true, true},
                                  {ALLOY_F16, 1, 1, 33, 97, 128, true, true, true},
                                  {ALLOY_BF16, 1, 1, 33, 33, 128, false, true, true}};
    feed_set f;
    alloy_graph *g = cases_graph(cases, 4, &f);
    if (graph_compile(g)) fail_msg("%s", alloy_last_error(g));
    cg_program prog;
    char err[1024];
    if (cg_emit(g->compiled, &g->comp.sched, &prog, err, sizeof err)) fail_msg("%s", err);
    const ir_graph *c = g->compiled;
    cg_resources *res = test_calloc((size_t)prog.nkernels + 1, sizeof *res);
    static const int archs[] = {80, 90};
    for (int a = 0; a < 2; a++) {
        if (cg_ptxas_resources(nv, NULL, &prog, archs[a], 0, res, err, sizeof err)) fail_msg("%s", err);
        for (int q = 0; q < prog.nkernels; q++) {
            const ir_node *node = c->nodes[g->comp.sched.steps[prog.kernels[q].step].pos];
            if (node->op != IR_OP_attention && node->op != IR_OP_attention_grad) continue;
            const mcase *mc = &cases[case_of(c, node)];
            const cg_resources *r = &res[q];
            if (!r->known) fail_msg("sm_%d %s: ptxas reported nothing", archs[a], prog.kernels[q].name);
            print_message("# sm_%d %s %s head dim %lld: %d registers, %d bytes stack, %d bytes spill stores, %d bytes spill "
                          "loads, %d bytes smem\n",
                          archs[a], alloy_dtype_name(mc->dt), prog.kernels[q].name, (long long)mc->d, r->registers, r->stack,
                          r->spill_stores, r->spill_loads, r->shared);
            if (mc->d <= 64 && (r->spill_stores || r->spill_loads))
                fail_msg("sm_%d %s (head dim %lld) spills: %d bytes stored, %d loaded", archs[a], prog.kernels[q].name,
                         (long long)mc->d, r->spill_stores, r->spill_loads);
        }
    }
    test_free(res);
    cg_program_free(&prog);
    free_feeds(&f);
    alloy_graph_free(g);
    cg_nvrtc_close(nv);
}

/* "emulate": the kernels on the host emulation; "nvrtc": their NVRTC compiles; no argument: both. */
int main(int argc, char **argv)
{
    const struct CMUnitTest emulated[] = {
        cmocka_unit_test(test_f16_attention_on_tensor_cores_matches_the_f64_reference),
        cmocka_unit_test(test_bf16_attention_on_tensor_cores_matches_the_f64_reference),
        cmocka_unit_test(test_the_shuffle_form_for_gpus_before_sm80_matches_too),
        cmocka_unit_test(test_attention_runs_at_seven_products_per_tile_with_ldmatrix_and_cp_async),
    };
    const struct CMUnitTest compiled[] = {
        cmocka_unit_test(test_the_kernels_compile_for_sm80_and_sm90),
        cmocka_unit_test(test_the_kernels_spill_nothing_at_head_dim_64),
    };
    const char *part = argc > 1 ? argv[1] : "";
    if (*part && strcmp(part, "emulate") != 0 && strcmp(part, "nvrtc") != 0) {
        fprintf(stderr, "usage: %s [emulate|nvrtc]\n", argv[0]);
        return 2;
    }
    int failed = 0;
    if (strcmp(part, "nvrtc") != 0) failed += cmocka_run_group_tests_name("attention_mma emulated", emulated, NULL, NULL);
    if (strcmp(part, "emulate") != 0) failed += cmocka_run_group_tests_name("attention_mma nvrtc", compiled, NULL, NULL);
    return failed;
}
