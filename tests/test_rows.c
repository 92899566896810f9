/* test_rows.c - row programs (ops.def RW lines): their shape as data, rms_norm forward and backward against f64 references, rms_norm and silu fused in a row group as unfused, f32 softmax, layer_norm, cross_entropy and their gradients bit for bit against in-order loops, short rows among them, and the softmax's exp against al_vexpf. */
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

#include "alloy/alloy.h"
#include "base/vmath.h"
#include "base/convert.h"
#include "ir/groups.h"
#include "runtime/cpu/cpu.h"
#include "runtime/cpu/cpu_softmax_exp.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})

static uint64_t rng = 1;

static double uniform(double lo, double hi)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (double)(rng >> 11) * 0x1p-53;
}

/* n values in [lo, hi) rounded to dtype dt, as doubles, and as dt's bytes. */
static double *values_in(alloy_dtype dt, int64_t n, double lo, double hi, void **bytes)
{
    double *v = test_malloc(sizeof(double) * (size_t)(n + 1));
    *bytes = test_malloc(alloy_dtype_size(dt) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) v[i] = uniform(lo, hi);
    cvt_store_f64(dt, v, *bytes, (size_t)n);
    cvt_load_f64(dt, *bytes, v, (size_t)n);
    return v;
}

/* Relative tolerance of a result rounded to dt after an f32 computation. */
static double tol_of(alloy_dtype dt) { return dt == ALLOY_F64 ? 1e-12 : dt == ALLOY_F32 ? 2e-6 : dt == ALLOY_F16 ? 2e-3 : 1.6e-2; }

static void expect_close(alloy_dtype dt, const void *got, const double *ref, int64_t n, double tol, const char *what)
{
    double *g = test_malloc(sizeof(double) * (size_t)(n + 1)), worst = 0, scale = 1e-30;
    cvt_load_f64(dt, got, g, (size_t)n);
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(g[i] - ref[i]) / scale);
    test_free(g);
    if (!(worst <= tol)) fail_msg("%s: normalized error %.3g > %.3g", what, worst, tol);
}

/* ---- the programs as data ---- */

static void test_every_row_program_names_each_operand_role_and_fits_the_cpu_slots(void **state)
{
    (void)state;
    int programs = 0;
    for (int op = 0; op < IR_OP_COUNT; op++) {
        const ir_row_program *p = ir_ops[op].row;
        if (!p) continue;
        programs++;
        assert_int_equal((int)strlen(p->roles), ir_ops[op].max_in);
        assert_true(strspn(p->roles, "rvisw") == strlen(p->roles));
        assert_int_equal(p->roles[0], 'r'); /* the first operand gives the rows */
        ir_row_summary s = ir_row_summarize(p);
        assert_true(s.nscalars <= 16 && s.nvectors <= 8);
        /* exactly one way out, last: a row (OUT), a value per row averaged (RESULT) or kept (KEEP) */
        int outs = 0;
        for (int i = 0; i < p->nstages; i++)
            outs += p->stages[i].kind == ROW_OUT || p->stages[i].kind == ROW_RESULT || p->stages[i].kind == ROW_KEEP;
        ir_row_stage_kind last = p->stages[p->nstages - 1].kind;
        if (outs != 1 || (last != ROW_OUT && last != ROW_RESULT && last != ROW_KEEP))
            fail_msg("%s: its program must end in its one OUT, RESULT or KEEP", ir_ops[op].name);
        /* a slot is written before it is read */
        for (int i = 0; i < p->nstages; i++)
            for (int k = 0; k < 16; k++) {
                char use[16];
                snprintf(use, sizeof use, "S(%d)", k);
                const char *text = p->stages[i].expr, *hit = text;
                /* S(k) itself, not the end of POS(k) or HAS(k) */
                while ((hit = strstr(hit, use)) && hit > text && (isalnum((unsigned char)hit[-1]) || hit[-1] == '_')) hit++;
                if (!hit) continue;
                bool set = false;
                for (int e = 0; e < i; e++) set |= p->stages[e].kind <= ROW_LET && p->stages[e].slot == k;
                if (!set) fail_msg("%s: stage %d reads S(%d) before a stage sets it", ir_ops[op].name, i, k);
            }
    }
    assert_true(programs >= 11); /* softmax, log_softmax, layer_norm, rms_norm, cross_entropy, causal_mask and grads */
    assert_non_null(ir_ops[IR_OP_rms_norm].row);
    assert_true(ir_row_summarize(ir_ops[IR_OP_cross_entropy].row).per_row_result);
    assert_true(ir_row_summarize(ir_ops[IR_OP_causal_mask].row).by_position);
}

/* ---- rms_norm forward: y = x / sqrt(mean(x^2) + eps) * gamma ---- */

static void check_rms_norm(alloy_dtype dt, int rank, const int64_t *dims, bool gamma, double eps)
{
    int64_t d = dims[rank - 1], n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    alloy_graph *g = alloy_graph_new("rms");
    alloy_tensor *x = alloy_input(g, "x", dt, rank, dims);
    alloy_tensor *w = gamma ? alloy_input(g, "gamma", dt, 1, &d) : NULL;
    alloy_output(g, "y", alloy_rms_norm(g, x, w, eps));
    void *xb, *wb;
    double *xv = values_in(dt, n, -3, 3, &xb), *wv = values_in(dt, d, 0.5, 1.5, &wb);
    alloy_host_tensor feeds[2] = {{"x", dt, rank, {0}, xb}, {"gamma", dt, 1, {d}, wb}}, fetch = {.name = "y"};
    memcpy(feeds[0].dims, dims, sizeof(int64_t) * (size_t)rank);
    if (alloy_graph_run(g, feeds, gamma ? 2 : 1, &fetch, 1)) fail_msg("%s", alloy_last_error(g));
    double *ref = test_malloc(sizeof(double) * (size_t)(n + 1));
    for (int64_t r = 0; r < n / d; r++) {
        double ms = 0;
        for (int64_t i = 0; i < d; i++) ms += xv[r * d + i] * xv[r * d + i] / (double)d;
        for (int64_t i = 0; i < d; i++) ref[r * d + i] = xv[r * d + i] / sqrt(ms + eps) * (gamma ? wv[i] : 1);
    }
    char what[96];
    snprintf(what, sizeof what, "rms_norm %s rank %d last %lld gamma %d eps %g", alloy_dtype_name(dt), rank,
             (long long)d, gamma, eps);
    expect_close(dt, fetch.data, ref, n, tol_of(dt), what);
    test_free(ref), test_free(xv), test_free(wv), test_free(xb), test_free(wb);
    alloy_graph_free(g);
}

static void test_rms_norm_matches_a_double_reference_in_every_float_dtype(void **state)
{
    (void)state;
    static const alloy_dtype dts[] = {ALLOY_F32, ALLOY_F64, ALLOY_F16, ALLOY_BF16};
    for (int k = 0; k < 4; k++)
        for (int gamma = 0; gamma < 2; gamma++) {
            check_rms_norm(dts[k], 2, DIMS(5, 17), gamma, 1e-5);
            check_rms_norm(dts[k], 3, DIMS(2, 3, 130), gamma, 1e-6);
            check_rms_norm(dts[k], 2, DIMS(4, 1), gamma, 1e-2);
        }
}

/* ---- rms_norm_grad: dx = r * g - x * r^3 * mean(g * x), g = dy * gamma ---- */

static void test_rms_norm_grad_kernel_matches_a_double_reference(void **state)
{
    (void)state;
    static const alloy_dtype dts[] = {ALLOY_F32, ALLOY_F64, ALLOY_F16, ALLOY_BF16};
    for (int k = 0; k < 4; k++)
        for (int gamma = 0; gamma < 2; gamma++) {
            alloy_dtype dt = dts[k];
            const int64_t rows = 6, d = 33;
            ir_graph *ir = ir_graph_new("rms_grad");
            ir_type t = {.dtype = dt, .rank = 2, .dims = {rows, d}}, tv = {.dtype = dt, .rank = 1, .dims = {d}};
            int x = ir_add_node(ir, IR_OP_input, 0, NULL, 0, NULL, &t, "x")->id;
            int dy = ir_add_node(ir, IR_OP_input, 0, NULL, 0, NULL, &t, "dy")->id;
            int w = ir_add_node(ir, IR_OP_input, 0, NULL, 0, NULL, &tv, "gamma")->id;
            ir_attr eps = ir_a_float("eps", 1e-5);
            ir_node *dx = ir_add_node(ir, IR_OP_rms_norm_grad, gamma ? 3 : 2, (int[]){x, dy, w}, 1, &eps, NULL, NULL);
            assert_non_null(dx);
            ir_add_output(ir, "dx", dx->id);
            void *xb, *db, *wb;
            double *xv = values_in(dt, rows * d, -2, 2, &xb), *dv = values_in(dt, rows * d, -1, 1, &db);
            double *wv = values_in(dt, d, 0.5, 1.5, &wb);
            rt_tensor *values = test_calloc((size_t)ir->nnodes, sizeof(rt_tensor));
            values[x].data = xb, values[dy].data = db, values[w].data = wb;
            cpu_exec ex = {.nthreads = 1};
            if (cpu_run_graph(&ex, ir, values, NULL)) fail_msg("%s", ex.error);
            double *ref = test_malloc(sizeof(double) * (size_t)(rows * d));
            for (int64_t r = 0; r < rows; r++) {
                const double *xr = xv + r * d, *dr = dv + r * d;
                double ms = 0, gx = 0;
                for (int64_t i = 0; i < d; i++) ms += xr[i] * xr[i] / (double)d;
                double rs = 1 / sqrt(ms + 1e-5);
                for (int64_t i = 0; i < d; i++) gx += dr[i] * (gamma ? wv[i] : 1) * xr[i] / (double)d;
                for (int64_t i = 0; i < d; i++)
                    ref[r * d + i] = rs * dr[i] * (gamma ? wv[i] : 1) - xr[i] * rs * rs * rs * gx;
            }
            char what[64];
            snprintf(what, sizeof what, "rms_norm_grad %s gamma %d", alloy_dtype_name(dt), gamma);
            expect_close(dt, values[dx->id].data, ref, rows * d, 4 * tol_of(dt), what);
            cpu_release_values(ir, values);
            test_free(values), test_free(ref), test_free(xv), test_free(dv), test_free(wv);
            test_free(xb), test_free(db), test_free(wb);
            ir_graph_free(ir);
        }
}

/* ---- fused: a row group with rms_norm and silu gives the unfused bits ---- */

/* y = silu(rms_norm(x + b, gamma)) * s, trained one AdamW step; returns the
 * step's loss and fills out with y (f32, rows x d). */
static float rms_block(bool fused, float *out, const float *xs, const float *bs)
{
    enum { ROWS = 96, D = 64 };
    alloy_graph *g = alloy_graph_new("rms_block");
    alloy_graph_set_seed(g, 3);
    if (!fused) alloy_graph_set_option(g, "no_fuse", "all");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(ROWS, D));
    alloy_tensor *b = alloy_input(g, "b", ALLOY_F32, 1, DIMS(D));
    alloy_tensor *gamma = alloy_param(g, "gamma", ALLOY_F32, 1, DIMS(D), alloy_init_uniform(0.5, 1.5));
    alloy_tensor *h = alloy_rms_norm(g, alloy_add(g, x, b), gamma, 1e-5);
    alloy_tensor *y = alloy_mul(g, alloy_silu(g, h), alloy_scalar(g, ALLOY_F32, 0.75));
    alloy_output(g, "y", y);
    alloy_tensor *loss = alloy_reduce_mean(g, alloy_square(g, y), 0, NULL, false);
    alloy_output(g, "loss", loss);
    alloy_graph_set_loss(g, loss);
    alloy_graph_add_optimizer(g, alloy_adamw(1e-2, 0.9, 0.999, 1e-8, 0.0));
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {ROWS, D}, (void *)xs}, {"b", ALLOY_F32, 1, {D}, (void *)bs}};
    alloy_host_tensor fetch[2] = {{.name = "y"}, {.name = "loss"}};
    if (alloy_graph_run(g, feeds, 2, fetch, 2)) fail_msg("%s", alloy_last_error(g));
    memcpy(out, fetch[0].data, sizeof(float) * ROWS * D);
    float l = *(const float *)fetch[1].data;
    /* fused: rms_norm and silu share one row group with their neighbours */
    const ir_graph *c = g->compiled;
    int rms = -1;
    for (int i = 0; i < c->nnodes && rms < 0; i++)
        if (c->nodes[i]->op == IR_OP_rms_norm) rms = i;
    assert_true(rms >= 0);
    const schedule *s = &g->comp.sched;
    const sched_step *st = &s->steps[s->step_of[rms]];
    if (fused) {
        assert_int_equal(st->kind, STEP_KIND_ROW);
        bool silu = false;
        for (int m = st->first; m < st->first + st->n; m++) silu |= c->nodes[s->members[m].node]->op == IR_OP_silu;
        assert_true(silu);
    } else {
        assert_int_equal(st->kind, STEP_KIND_OP);
    }
    alloy_graph_free(g);
    return l;
}

static void test_rms_norm_and_silu_fuse_into_one_row_step_and_give_the_unfused_bits(void **state)
{
    (void)state;
    enum { ROWS = 96, D = 64 };
    float *xs = test_malloc(sizeof(float) * ROWS * D), bs[D];
    float *a = test_malloc(sizeof(float) * ROWS * D), *b = test_malloc(sizeof(float) * ROWS * D);
    for (int i = 0; i < ROWS * D; i++) xs[i] = (float)uniform(-2, 2);
    for (int i = 0; i < D; i++) bs[i] = (float)uniform(-0.5, 0.5);
    float la = rms_block(true, a, xs, bs), lb = rms_block(false, b, xs, bs);
    assert_memory_equal(a, b, sizeof(float) * ROWS * D);
    assert_true(la == lb);
    test_free(xs), test_free(a), test_free(b);
}

/* ---- the vector row kernels against the in-order loops ---- */

/* The pairwise sum every SUM stage computes: runs of at most 16 added in
 * order from 0, longer runs split in halves. */
static float pairwise(const float *v, int64_t n)
{
    if (n > 16) return pairwise(v, n / 2) + pairwise(v + n / 2, n - n / 2);
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return s;
}

/* Row xr of n as the row programs start a softmax, in order: its largest
 * (a NaN wins) into *max, exp of each value less it into v; returns their
 * pairwise sum. */
static float shifted_exps(const float *xr, int64_t n, float *v, float *max)
{
    float m = -INFINITY;
    for (int64_t j = 0; j < n && m == m; j++)
        if (xr[j] > m || xr[j] != xr[j]) m = xr[j];
    for (int64_t j = 0; j < n; j++) v[j] = al_vexpf(xr[j] - m);
    *max = m;
    return pairwise(v, n);
}

/* y = softmax (layer_norm false) or layer_norm without gamma and beta
 * (eps 1e-5) of rows x [rows, n], f32 on the CPU, one thread. */
static void run_row_op(bool layer_norm, const float *x, int64_t rows, int64_t n, float *y)
{
    alloy_graph *g = alloy_graph_new("row");
    alloy_graph_set_option(g, "num_threads", "1");
    alloy_tensor *in = alloy_input(g, "x", ALLOY_F32, 2, DIMS(rows, n));
    alloy_output(g, "y", layer_norm ? alloy_layer_norm(g, in, NULL, NULL, 1e-5) : alloy_softmax(g, in, 1));
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {rows, n}, (void *)x};
    alloy_host_tensor fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_OK);
    memcpy(y, fetch.data, sizeof(float) * (size_t)(rows * n));
    alloy_graph_free(g);
}

/* Equal bits, or both NaN (a NaN's sign and payload are not kept). */
static void assert_same_floats(const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!(isnan(a[i]) && isnan(b[i]))) assert_memory_equal(&a[i], &b[i], sizeof(float));
}

static void test_f32_softmax_and_layer_norm_give_the_bits_of_in_order_loops(void **state)
{
    (void)state;
    static const int64_t lens[] = {1, 3, 17, 37, 48, 64, 80, 100, 256, 1000};
    enum { ROWS = 37 }; /* rows of 64 run 16 at a time: two batches and a part, the odd rows among the first */
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
        int64_t n = lens[l];
        float *x = test_malloc(sizeof(float) * ROWS * (size_t)n), *y = test_malloc(sizeof(float) * ROWS * (size_t)n);
        float *want = test_malloc(sizeof(float) * ROWS * (size_t)n), *v = test_malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < ROWS * n; i++) x[i] = (float)uniform(-30, 30);
        for (int64_t j = 0; j < n; j++) {
            x[1 * n + j] = j % 2 ? -0.0f : -1.0f; /* the largest is -0 (or -1 when n is 1) */
            x[2 * n + j] = j % 3 ? 0.0f : -0.0f;  /* zeros of both signs */
            x[3 * n + j] = j == n / 2 ? NAN : x[3 * n + j];
            x[4 * n + j] = j == n - 1 ? INFINITY : x[4 * n + j];
            x[5 * n + j] = 1000.0f + (float)j;    /* large: the shift by the largest matters */
            x[7 * n + j] = j > n / 3 ? -INFINITY : x[7 * n + j]; /* a causal mask's row */
            x[8 * n + j] = -INFINITY;             /* a row masked whole */
        }
        /* softmax: the largest in order (a NaN wins), exp of the shifted values, their sum */
        for (int r = 0; r < ROWS; r++) {
            float m, s = shifted_exps(x + r * n, n, v, &m);
            for (int64_t j = 0; j < n; j++) want[r * n + j] = v[j] / s;
        }
        run_row_op(false, x, ROWS, n, y);
        assert_same_floats(y, want, ROWS * n);
        /* layer_norm: mean, biased variance, 1 / sqrt(variance + eps) */
        for (int r = 0; r < ROWS; r++) {
            const float *xr = x + r * n;
            float mean = pairwise(xr, n) / (float)n;
            for (int64_t j = 0; j < n; j++) v[j] = (xr[j] - mean) * (xr[j] - mean);
            float rstd = 1.0f / sqrtf(pairwise(v, n) / (float)n + (float)1e-5);
            for (int64_t j = 0; j < n; j++) want[r * n + j] = (xr[j] - mean) * rstd;
        }
        run_row_op(true, x, ROWS, n, y);
        assert_same_floats(y, want, ROWS * n);
        test_free(x), test_free(y), test_free(want), test_free(v);
    }
}

/* The softmax's exponentials in its vector loops (each level's own: on
 * AVX-512 by vscalefps) against al_vexpf, bit for bit: rows of 16 whose
 * largest is 0 and whose other 15 values are at or below -25 (each exp
 * under 2^-36, their sum with e^0 exactly 1), so that each result is the
 * exp itself: every 257th float from -25 to -inf and every float from -86
 * to -105 (subnormal results, then 0). Then rows of 16 values from -25 to
 * 0 (every 257th float) against the in-order loops. */
static void test_f32_softmax_rows_give_al_vexpf_bit_for_bit_at_every_257th_float(void **state)
{
    (void)state;
    enum { N = 16 };
    float f25 = -25.0f, f86 = -86.0f, f105 = -105.0f;
    uint32_t lo25, lo86, hi105;
    memcpy(&lo25, &f25, sizeof lo25), memcpy(&lo86, &f86, sizeof lo86), memcpy(&hi105, &f105, sizeof hi105);
    int64_t count = 0;
    for (uint64_t u = lo25; u <= 0xff800000u; u += u >= lo86 && u < hi105 ? 1 : 257) count++;
    int64_t rows = (count + N - 2) / (N - 1);
    float *x = test_malloc(sizeof(float) * (size_t)(rows * N)), *y = test_malloc(sizeof(float) * (size_t)(rows * N));
    int64_t at = 0;
    for (uint64_t u = lo25; u <= 0xff800000u; u += u >= lo86 && u < hi105 ? 1 : 257, at++) {
        uint32_t bits = (uint32_t)u;
        if (at % (N - 1) == 0) x[at / (N - 1) * N] = 0.0f; /* each row's largest */
        memcpy(&x[at / (N - 1) * N + 1 + at % (N - 1)], &bits, sizeof bits);
    }
    for (; at % (N - 1); at++) x[at / (N - 1) * N + 1 + at % (N - 1)] = -INFINITY;
    run_row_op(false, x, rows, N, y);
    for (int64_t i = 0; i < rows * N; i++) {
        float want = i % N ? al_vexpf(x[i]) : 1.0f;
        if (memcmp(&want, &y[i], sizeof want)) fail_msg("softmax at x - max = %a: %a, al_vexpf %a", (double)x[i], (double)y[i], (double)want);
    }
    assert_true(count > 6000000); /* 4.0M strided and 2.5M from -86 to -105 */
    test_free(x), test_free(y);
    /* from -0 to -25, against the in-order loops (each row's sum is no longer 1) */
    rows = ((int64_t)lo25 - 0x80000000 + 257 * N - 1) / (257 * N);
    x = test_malloc(sizeof(float) * (size_t)(rows * N)), y = test_malloc(sizeof(float) * (size_t)(rows * N));
    float *want = test_malloc(sizeof(float) * (size_t)(rows * N)), v[N];
    for (int64_t i = 0; i < rows * N; i++) {
        uint32_t bits = (uint32_t)(0x80000000u + 257 * (uint64_t)i);
        memcpy(&x[i], &bits, sizeof bits);
        x[i] = bits < lo25 ? x[i] : -25.0f;
    }
    for (int64_t r = 0; r < rows; r++) {
        float m, s = shifted_exps(x + r * N, N, v, &m);
        for (int j = 0; j < N; j++) want[r * N + j] = v[j] / s;
    }
    run_row_op(false, x, rows, N, y);
    assert_same_floats(y, want, rows * N);
    test_free(x), test_free(y), test_free(want);
}

/* The softmax's exp (x - max: 0 or less, or NaN) against al_vexpf, bit
 * for bit: every 257th float from -0 to -NaN, every float from -86 to -105
 * (where results turn subnormal, then 0: k past -126, then d below -104),
 * and +0, -inf and NaNs of both signs. */
static void test_the_softmax_exp_gives_the_bits_of_al_vexpf_at_zero_and_below(void **state)
{
    (void)state;
    uint32_t lo86, hi105;
    float f86 = -86.0f, f105 = -105.0f;
    memcpy(&lo86, &f86, sizeof lo86), memcpy(&hi105, &f105, sizeof hi105);
    int64_t checked = 0;
    for (uint64_t u = 0x80000000u; u <= 0xffffffffu; u += u >= lo86 && u < hi105 ? 1 : 257) {
        uint32_t bits = (uint32_t)u;
        float d, want, got;
        memcpy(&d, &bits, sizeof d);
        want = al_vexpf(d), got = cpu_softmax_exp_f32(d);
        if (memcmp(&want, &got, sizeof want) && !(isnan(want) && isnan(got)))
            fail_msg("exp(%a): al_vexpf %a, the softmax's %a", (double)d, (double)want, (double)got);
        checked++;
    }
    const float special[] = {0.0f, -0.0f, -INFINITY, NAN, -NAN, -104.0f, -103.99999f, -104.00001f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        float want = al_vexpf(special[i]), got = cpu_softmax_exp_f32(special[i]);
        if (memcmp(&want, &got, sizeof want) && !(isnan(want) && isnan(got)))
            fail_msg("exp(%a): al_vexpf %a, the softmax's %a", (double)special[i], (double)want, (double)got);
    }
    assert_true(checked > 10000000); /* the sweep ran: 8.4M strided and 2.5M around -86..-105 */
}

/* Row op `op` of f32 operands in[0..nin) (rows [rows, n], gamma [n],
 * mean and rstd [rows, 1]) by cpu_row_run on one thread, into y. */
static void run_row_node(int op, int nin, const float *const *in, int64_t rows, int64_t n, float *y)
{
    ir_graph *g = ir_graph_new("grad");
    assert_non_null(g);
    ir_type rt = {.dtype = ALLOY_F32, .rank = 2, .dims = {rows, n}}, vt = {.dtype = ALLOY_F32, .rank = 1, .dims = {n}};
    ir_type st = {.dtype = ALLOY_F32, .rank = 2, .dims = {rows, 1}};
    const ir_type *types[5] = {&rt, &rt, &st, &st, &vt}; /* layer_norm_grad_stats: x, dy, mean, rstd, gamma */
    int ids[5];
    static const char *const names[5] = {"x", "dy", "mean", "rstd", "gamma"};
    for (int j = 0; j < nin; j++) ids[j] = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, types[j], names[j])->id;
    ir_attr axis = ir_a_int("axis", 1);
    ir_node *node = ir_add_node(g, op, nin, ids, op == IR_OP_softmax_grad, &axis, NULL, "grad");
    assert_non_null(node);
    rt_tensor ts[5], out = {node->type, y};
    for (int j = 0; j < nin; j++) ts[j] = (rt_tensor){g->nodes[ids[j]]->type, (void *)in[j]};
    cpu_exec x = {.nthreads = 1};
    assert_int_equal(cpu_row_run(&x, node, &out, ts, rows, NULL, false), ALLOY_OK);
    ir_graph_free(g);
}

static void test_f32_softmax_and_layer_norm_gradients_of_short_rows_give_the_bits_of_in_order_loops(void **state)
{
    (void)state;
    static const int64_t lens[] = {1, 5, 16, 32, 37, 48, 64, 76, 128, 256, 512};
    enum { ROWS = 37 };
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
        int64_t n = lens[l];
        size_t bytes = sizeof(float) * ROWS * (size_t)n;
        float *x = test_malloc(bytes), *dy = test_malloc(bytes), *y = test_malloc(bytes), *want = test_malloc(bytes);
        float *gamma = test_malloc(sizeof(float) * (size_t)n), *v0 = test_malloc(sizeof(float) * (size_t)n);
        float *v1 = test_malloc(sizeof(float) * (size_t)n), mean[ROWS], rstd[ROWS];
        for (int64_t i = 0; i < ROWS * n; i++) x[i] = (float)uniform(0, 0.2), dy[i] = (float)uniform(-3, 3);
        for (int64_t j = 0; j < n; j++) gamma[j] = (float)uniform(0.5, 1.5);
        for (int r = 0; r < ROWS; r++) mean[r] = (float)uniform(-1, 1), rstd[r] = (float)uniform(0.5, 4);
        /* softmax_grad (y, dy): y (dy - sum(dy y)) */
        for (int r = 0; r < ROWS; r++) {
            const float *yr = x + r * n, *dr = dy + r * n;
            for (int64_t j = 0; j < n; j++) v0[j] = dr[j] * yr[j];
            float s = pairwise(v0, n);
            for (int64_t j = 0; j < n; j++) want[r * n + j] = yr[j] * (dr[j] - s);
        }
        run_row_node(IR_OP_softmax_grad, 2, (const float *const[]){x, dy}, ROWS, n, y);
        assert_same_floats(y, want, ROWS * n);
        /* layer_norm_grad_stats (x, dy, mean, rstd, gamma): g = dy gamma, h = (x - mean) rstd,
         * rstd (g - sum(g) / n - h sum(g h) / n) */
        for (int r = 0; r < ROWS; r++) {
            const float *xr = x + r * n, *dr = dy + r * n;
            for (int64_t j = 0; j < n; j++) v0[j] = dr[j] * gamma[j], v1[j] = (xr[j] - mean[r]) * rstd[r];
            float s1 = pairwise(v0, n) / (float)n;
            for (int64_t j = 0; j < n; j++) want[r * n + j] = v0[j] * v1[j];
            float s3 = pairwise(want + r * n, n) / (float)n;
            for (int64_t j = 0; j < n; j++) want[r * n + j] = rstd[r] * (v0[j] - s1 - v1[j] * s3);
        }
        run_row_node(IR_OP_layer_norm_grad_stats, 5, (const float *const[]){x, dy, mean, rstd, gamma}, ROWS, n, y);
        assert_same_floats(y, want, ROWS * n);
        for (int r = 0; r < ROWS; r++) { /* without gamma: g = dy */
            const float *xr = x + r * n, *dr = dy + r * n;
            for (int64_t j = 0; j < n; j++) v1[j] = (xr[j] - mean[r]) * rstd[r], want[r * n + j] = dr[j] * v1[j];
            float s1 = pairwise(dr, n) / (float)n, s3 = pairwise(want + r * n, n) / (float)n;
            for (int64_t j = 0; j < n; j++) want[r * n + j] = rstd[r] * (dr[j] - s1 - v1[j] * s3);
        }
        run_row_node(IR_OP_layer_norm_grad_stats, 4, (const float *const[]){x, dy, mean, rstd}, ROWS, n, y);
        assert_same_floats(y, want, ROWS * n);
        test_free(x), test_free(dy), test_free(y), test_free(want), test_free(gamma), test_free(v0), test_free(v1);
    }
}

/* layer_norm (x [rows, n], gamma, beta [n], eps 1e-5) or, op not
 * layer_norm, its statistic layer_norm_mean or layer_norm_rstd of x ([rows,
 * 1] into y) by cpu_row_run on one thread, into y. */
static void run_layer_norm_node(int op, const float *x, const float *gamma, const float *beta, int64_t rows, int64_t n,
                                float *y)
{
    ir_graph *g = ir_graph_new("layer_norm");
    assert_non_null(g);
    ir_type rt = {.dtype = ALLOY_F32, .rank = 2, .dims = {rows, n}}, vt = {.dtype = ALLOY_F32, .rank = 1, .dims = {n}};
    int ids[3] = {ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &rt, "x")->id,
                  ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &vt, "gamma")->id,
                  ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &vt, "beta")->id};
    ir_attr eps = ir_a_float("eps", 1e-5);
    ir_node *node = ir_add_node(g, op, op == IR_OP_layer_norm ? 3 : 1, ids, op != IR_OP_layer_norm_mean, &eps, NULL, "ln");
    assert_non_null(node);
    rt_tensor ts[3] = {{rt, (void *)x}, {vt, (void *)gamma}, {vt, (void *)beta}}, out = {node->type, y};
    cpu_exec ex = {.nthreads = 1};
    assert_int_equal(cpu_row_run(&ex, node, &out, ts, rows, NULL, false), ALLOY_OK);
    ir_graph_free(g);
}

/* layer_norm with gamma and beta, and its statistics layer_norm_mean and
 * layer_norm_rstd, over rows whose leaves the CPU adds 8 at a time (16 to
 * 1024: rows of 64 16 to a batch, 37 rows so the last batch has 5, whose 20
 * leaves go to the generated function) and rows of uneven trees: the bits
 * of in-order loops, ((x - mean) rstd) gamma + beta. */
static void test_f32_layer_norm_with_gamma_and_beta_gives_the_bits_of_in_order_loops(void **state)
{
    (void)state;
    static const int64_t lens[] = {1, 5, 16, 32, 37, 64, 128, 200, 256, 512, 1024};
    enum { ROWS = 37 };
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
        int64_t n = lens[l];
        size_t bytes = sizeof(float) * ROWS * (size_t)n;
        float *x = test_malloc(bytes), *y = test_malloc(bytes), *want = test_malloc(bytes);
        float *gamma = test_malloc(sizeof(float) * (size_t)n), *beta = test_malloc(sizeof(float) * (size_t)n);
        float *v = test_malloc(sizeof(float) * (size_t)n), means[ROWS], rstds[ROWS], got[ROWS];
        for (int64_t i = 0; i < ROWS * n; i++) x[i] = (float)uniform(-3, 5);
        for (int64_t j = 0; j < n; j++) {
            gamma[j] = (float)uniform(0.5, 1.5), beta[j] = (float)uniform(-1, 1);
            x[2 * n + j] = 1000.0f + (float)uniform(0, 0.01); /* a large mean: the shift matters */
            x[3 * n + j] = j == n / 2 ? NAN : x[3 * n + j];
            x[4 * n + j] = 0.25f;                              /* constant: variance 0, rstd 1 / sqrt(eps) */
        }
        for (int r = 0; r < ROWS; r++) {
            const float *xr = x + r * n;
            float mean = pairwise(xr, n) / (float)n;
            for (int64_t j = 0; j < n; j++) v[j] = (xr[j] - mean) * (xr[j] - mean);
            float rstd = 1.0f / sqrtf(pairwise(v, n) / (float)n + (float)1e-5);
            for (int64_t j = 0; j < n; j++) want[r * n + j] = (xr[j] - mean) * rstd * gamma[j] + beta[j];
            means[r] = mean, rstds[r] = rstd;
        }
        run_layer_norm_node(IR_OP_layer_norm, x, gamma, beta, ROWS, n, y);
        assert_same_floats(y, want, ROWS * n);
        run_layer_norm_node(IR_OP_layer_norm_mean, x, NULL, NULL, ROWS, n, got);
        assert_same_floats(got, means, ROWS);
        run_layer_norm_node(IR_OP_layer_norm_rstd, x, NULL, NULL, ROWS, n, got);
        assert_same_floats(got, rstds, ROWS);
        test_free(x), test_free(y), test_free(want), test_free(gamma), test_free(beta), test_free(v);
    }
}

/* cross_entropy (per_row: each row's loss and weight into res) or
 * cross_entropy_grad (dx into y) of f32 logits x [rows, n] and i64 targets,
 * by cpu_row_run on one thread; with_weight: a class weight of all ones
 * (the grad also gets its divisor, rows), which takes the generated program
 * where without it f32 has a function of its own. */
static void run_cross_entropy(bool grad, bool with_weight, const float *x, const int64_t *targets, int64_t rows,
                              int64_t n, float *y, float *res)
{
    ir_graph *g = ir_graph_new("ce");
    assert_non_null(g);
    float *ones = test_malloc(sizeof(float) * (size_t)n), dloss = 1, divisor = (float)rows;
    for (int64_t j = 0; j < n; j++) ones[j] = 1;
    ir_type rt = {.dtype = ALLOY_F32, .rank = 2, .dims = {rows, n}}, tt = {.dtype = ALLOY_I64, .rank = 1, .dims = {rows}};
    ir_type vt = {.dtype = ALLOY_F32, .rank = 1, .dims = {n}}, sc = {.dtype = ALLOY_F32, .rank = 0};
    int ids[5];
    ids[0] = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &rt, "x")->id;
    ids[1] = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &tt, "t")->id;
    const void *data[5] = {x, targets};
    int nin = 2;
    if (grad) {
        ids[nin] = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &sc, "dloss")->id, data[nin++] = &dloss;
        if (with_weight) ids[nin] = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &sc, "div")->id, data[nin++] = &divisor;
    }
    if (with_weight) ids[nin] = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &vt, "w")->id, data[nin++] = ones;
    ir_attr ignore = ir_a_int("ignore_index", -1);
    ir_node *node = ir_add_node(g, grad ? IR_OP_cross_entropy_grad : IR_OP_cross_entropy, nin, ids, 1, &ignore, NULL, "ce");
    assert_non_null(node);
    rt_tensor ts[5], out = {node->type, grad ? (void *)y : (void *)res};
    for (int j = 0; j < nin; j++) ts[j] = (rt_tensor){g->nodes[ids[j]]->type, (void *)data[j]};
    cpu_exec ex = {.nthreads = 1};
    assert_int_equal(cpu_row_run(&ex, node, &out, ts, rows, grad ? NULL : res, false), ALLOY_OK);
    ir_graph_free(g);
    test_free(ones);
}

static void test_f32_cross_entropy_and_its_gradient_give_the_bits_of_in_order_loops(void **state)
{
    (void)state;
    /* 65 to 127: 8 leaves of 8 to 16 terms, side by side on AVX2 (72: all
     * of 9; 76: 9, 10, ...); 17 and 100: the last 16 computed as one vector */
    static const int64_t lens[] = {1, 5, 16, 17, 37, 64, 65, 72, 76, 100, 127, 128, 256, 1000, 1024};
    enum { ROWS = 37 };
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
        int64_t n = lens[l];
        size_t bytes = sizeof(float) * ROWS * (size_t)n;
        float *x = test_malloc(bytes), *y = test_malloc(bytes), *y_weighted = test_malloc(bytes), *want = test_malloc(bytes);
        float *v = test_malloc(sizeof(float) * (size_t)n), res[2 * ROWS], res_weighted[2 * ROWS], want_res[2 * ROWS];
        int64_t targets[ROWS];
        for (int64_t i = 0; i < ROWS * n; i++) x[i] = (float)uniform(-8, 8);
        for (int64_t j = 0; j < n; j++) {
            x[1 * n + j] = j % 2 ? -0.0f : -1.0f;                 /* the largest is -0 (or -1 when n is 1) */
            x[2 * n + j] = 1000.0f + (float)j;                    /* large: the shift by the largest matters */
            x[7 * n + j] = j > n / 3 ? -INFINITY : x[7 * n + j]; /* -inf past a third of the row */
        }
        for (int r = 0; r < ROWS; r++) targets[r] = r == 3 ? -1 : (int64_t)(uniform(0, 1) * (double)n); /* row 3: ignore_index */
        /* the program in f32, p1 (label smoothing) 0: max, exp(x - max), their pairwise sum s1,
         * loss (1 - p1) w (log s1 + max - x[t]) - p1 / n * 0, weight w (0 for an ignored row);
         * dx = (s5 (e / s1) - [j == t] (1 - p1) w - p1 / n) dloss / rows, s5 = (1 - p1) w + p1 / n * n */
        const float p1 = 0;
        for (int r = 0; r < ROWS; r++) {
            const float *xr = x + r * n;
            float m, s1 = shifted_exps(xr, n, v, &m), w = targets[r] == -1 ? 0.0f : 1.0f;
            want_res[r] = targets[r] == -1 ? 0.0f : (1.0f - p1) * w * (logf(s1) + m - xr[targets[r]]) - p1 / (float)n * 0.0f;
            want_res[ROWS + r] = w;
            float s5 = (1.0f - p1) * w + p1 / (float)n * (float)n, s2 = 1.0f / (float)ROWS;
            for (int64_t j = 0; j < n; j++)
                want[r * n + j] = targets[r] == -1 ? 0.0f
                                                   : (s5 * (v[j] / s1) - (j == targets[r] ? (1.0f - p1) * w : 0.0f) -
                                                      p1 / (float)n * 1.0f) * s2;
        }
        run_cross_entropy(false, false, x, targets, ROWS, n, y, res);
        run_cross_entropy(false, true, x, targets, ROWS, n, y, res_weighted);
        assert_same_floats(res, want_res, 2 * ROWS);
        assert_same_floats(res_weighted, want_res, 2 * ROWS);
        run_cross_entropy(true, false, x, targets, ROWS, n, y, res);
        run_cross_entropy(true, true, x, targets, ROWS, n, y_weighted, res);
        assert_same_floats(y, want, ROWS * n);
        assert_same_floats(y_weighted, want, ROWS * n);
        test_free(x), test_free(y), test_free(y_weighted), test_free(want), test_free(v);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_row_program_names_each_operand_role_and_fits_the_cpu_slots),
        cmocka_unit_test(test_rms_norm_matches_a_double_reference_in_every_float_dtype),
        cmocka_unit_test(test_rms_norm_grad_kernel_matches_a_double_reference),
        cmocka_unit_test(test_rms_norm_and_silu_fuse_into_one_row_step_and_give_the_unfused_bits),
        cmocka_unit_test(test_f32_softmax_rows_give_al_vexpf_bit_for_bit_at_every_257th_float),
        cmocka_unit_test(test_the_softmax_exp_gives_the_bits_of_al_vexpf_at_zero_and_below),
        cmocka_unit_test(test_f32_softmax_and_layer_norm_give_the_bits_of_in_order_loops),
        cmocka_unit_test(test_f32_softmax_and_layer_norm_gradients_of_short_rows_give_the_bits_of_in_order_loops),
        cmocka_unit_test(test_f32_layer_norm_with_gamma_and_beta_gives_the_bits_of_in_order_loops),
        cmocka_unit_test(test_f32_cross_entropy_and_its_gradient_give_the_bits_of_in_order_loops),
    };
    return cmocka_run_group_tests_name("rows", tests, test_checked_alloc, test_plain_alloc);
}
