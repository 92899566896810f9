/* test_fuse_kinds.c - the ROW, GEMM and MULTI fusion groups run against the unfused run and fp64 references: a masked attention softmax over several row blocks, a residual add + layer_norm with a partial last block, cross_entropy with its gradient, a GEMM epilogue (bias, tanh GELU, cast; the erf GELU stays out), the unscale + found_inf group's skip decisions, row group inputs a row block can and cannot slice. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "ir/groups.h"
#include "models.h"
#include "base/convert.h"
#include "runtime/cpu/cpu.h"
#include "runtime/graph/graph_impl.h"
#include "fuse_support.h"
#include "support.h"


/* ---- helpers ---- */

/* CPU threads of the runs from now on. */
static void threads(int n)
{
    char s[16];
    snprintf(s, sizeof s, "%d", n);
    setenv("ALLOY_NUM_THREADS", s, 1);
}

static ir_group_kind group_kind(const ir_graph *c, int k)
{
    int *ids = test_malloc(sizeof(int) * (size_t)c->nnodes), n = group_members(c, k, ids);
    assert_true(n >= 2);
    ir_group_kind kind = ir_group_kind_of(c, ids, n);
    test_free(ids);
    return kind;
}

/* "op op op" of group k's members, for messages and the printed log. */
static void group_ops(const ir_graph *c, int k, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < c->nnodes && at < len; i++)
        if (c->nodes[i]->group == k)
            at += (size_t)snprintf(buf + at, len - at, "%s%s", at ? " " : "", ir_ops[c->nodes[i]->op].name);
}

static void expect_group_ops(const ir_graph *c, int k, const char *want)
{
    char got[512];
    group_ops(c, k, got, sizeof got);
    if (strcmp(got, want) != 0) fail_msg("group %d: members '%s', want '%s'", k, got, want);
}

typedef alloy_graph *(*graph_builder)(int variant);

/* build(variant) compiles to exactly one group, of kind `kind`, holding the
 * node called `member` and made of the ops `ops` (printed with the table). */
static void expect_one_group(graph_builder build, int variant, const char *member, ir_group_kind kind,
                             const char *ops)
{
    alloy_graph *g = build(variant);
    const ir_graph *c = compiled(g);
    ir_print_groups(c, stdout);
    assert_int_equal(group_count(c), 1);
    int k = group_of(c, member);
    assert_int_equal(group_kind(c, k), kind);
    expect_group_ops(c, k, ops);
    alloy_graph_free(g);
}

static void fill_f16(uint16_t *x, int64_t n, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) x[i] = cvt_f64_to_f16(lo + (hi - lo) * test_uniform(0, 1));
}

static double f16(uint16_t h) { return cvt_f16_to_f32(h); }

/* How many f16 values lie between a and b (0: the same bits; +0 and -0 are 0 apart). */
static int f16_ulps(uint16_t a, uint16_t b)
{
    int ia = a & 0x8000 ? -(a & 0x7fff) : a, ib = b & 0x8000 ? -(b & 0x7fff) : b;
    return abs(ia - ib);
}

/* One run of a fresh graph from build(variant) with fusion on or off, on
 * nthreads threads: the tensors fetched by names[0..n) are copied into
 * out[i] (test_malloc'd; the caller frees them). */

static void run_copy(graph_builder build, int variant, bool fused, int nthreads, const alloy_host_tensor *feeds,
                     int nfeeds, const char *const *names, int n, void **out)
{
    fusion(fused);
    threads(nthreads);
    alloy_graph *g = build(variant);
    alloy_host_tensor f[4];
    assert_true(n <= 4);
    for (int i = 0; i < n; i++) f[i] = (alloy_host_tensor){.name = names[i]};
    expect_ok(g, alloy_graph_run(g, feeds, nfeeds, f, n), fused ? "fused run" : "unfused run");
    assert_int_equal(group_count(g->compiled) > 0, fused);
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)alloy_host_tensor_numel(&f[i]) * alloy_dtype_size(f[i].dtype);
        out[i] = test_malloc(bytes ? bytes : 1);
        memcpy(out[i], f[i].data, bytes);
    }
    alloy_graph_free(g);
    fusion(true);
    unsetenv("ALLOY_NUM_THREADS");
}

/* The fetches names[0..n) of the unfused run on one thread, and of fused
 * runs on one and on two threads, bit for bit the same; the unfused values
 * stay in want[i] (test_malloc'd). */
static void expect_fused_bits(graph_builder build, int variant, const alloy_host_tensor *feeds, int nfeeds,
                              const char *const *names, int n, const size_t *bytes, void **want)
{
    run_copy(build, variant, false, 1, feeds, nfeeds, names, n, want);
    for (int t = 1; t <= 2; t++) {
        void *got[4];
        run_copy(build, variant, true, t, feeds, nfeeds, names, n, got);
        for (int i = 0; i < n; i++) {
            if (memcmp(got[i], want[i], bytes[i]) != 0)
                fail_msg("'%s' on %d thread(s): fused bits differ from the unfused run", names[i], t);
            test_free(got[i]);
        }
    }
}

/* ---- 1. the attention softmax: mul, causal_mask, cast, softmax, cast ---- */

/* [B, H, T, T] scores: 4*2*64 = 512 rows of 64, two row blocks of 256 rows
 * (ROW_BLOCK_ELEMS 16384 / 64, a multiple of T as causal_mask needs). The
 * scale is no power of two, so the f16 mul really rounds. */
enum { AB = 4, AH = 2, AT = 64, AN = AB * AH * AT * AT };
#define ATT_SCALE 0.3

static alloy_graph *attention_graph(int variant)
{
    (void)variant;
    alloy_graph *g = alloy_graph_new("attention");
    alloy_tensor *x = alloy_input(g, "scores", F16, 4, DIMS(AB, AH, AT, AT));
    alloy_tensor *s = alloy_set_name(g, alloy_mul(g, x, alloy_scalar(g, F16, ATT_SCALE)), "scaled");
    alloy_tensor *m = alloy_set_name(g, alloy_causal_mask(g, s), "masked");
    alloy_tensor *w = alloy_set_name(g, alloy_cast(g, m, F32), "widened");
    alloy_tensor *p = alloy_set_name(g, alloy_softmax(g, w, -1), "probs");
    alloy_output(g, "attn", alloy_set_name(g, alloy_cast(g, p, F16), "attn"));
    return g;
}

/* softmax over keys j <= i of f16(x * f16(scale)), in f64, rounded to f16. */
static void attention_reference(const uint16_t *x, uint16_t *want)
{
    double scale = f16(cvt_f64_to_f16(ATT_SCALE)), v[AT];
    for (int64_t r = 0; r < AN / AT; r++) {
        int64_t i = r % AT;
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
            v[j] = f16(cvt_f64_to_f16(f16(x[r * AT + j]) * scale));
            m = fmax(m, v[j]);
        }
        for (int64_t j = 0; j <= i; j++) sum += exp(v[j] - m);
        for (int64_t j = 0; j < AT; j++) want[r * AT + j] = j <= i ? cvt_f64_to_f16(exp(v[j] - m) / sum) : 0;
    }
}

static void test_a_masked_softmax_row_group_spans_several_blocks_and_gives_the_unfused_bits(void **state)
{
    (void)state;
    expect_one_group(attention_graph, 0, "attn", IR_GROUP_ROW, "mul causal_mask cast softmax cast");
    alloy_graph *g = attention_graph(0);
    static uint16_t x[AN], want[AN];
    test_rng = 17;
    fill_f16(x, AN, -16, 16);
    alloy_host_tensor feed = {"scores", F16, 4, {AB, AH, AT, AT}, x}, fetch = {.name = "attn"};
    expect_ok(g, alloy_graph_run(g, &feed, 1, &fetch, 1), "run");
    /* fused for real: the members between were never materialized */
    assert_false(sched_stored(&g->comp.sched, node_named(g->compiled, "masked")));
    assert_false(sched_stored(&g->comp.sched, node_named(g->compiled, "probs")));
    alloy_graph_free(g);

    const char *names[] = {"attn"};
    size_t bytes[] = {sizeof x};
    void *unfused[1];
    expect_fused_bits(attention_graph, 0, &feed, 1, names, 1, bytes, unfused);
    attention_reference(x, want);
    const uint16_t *got = unfused[0];
    int worst = 0;
    int64_t off = 0;
    for (int64_t e = 0; e < AN; e++) {
        int u = f16_ulps(got[e], want[e]);
        off += u != 0;
        if (u > worst) worst = u;
    }
    printf("attention softmax, %d rows of %d in 2 blocks: fused == unfused on 1 and 2 threads; "
           "vs f64 reference: max %d f16 ulp, %lld of %d elements not the correctly rounded value\n",
           AN / AT, AT, worst, (long long)off, AN);
    assert_true(worst <= 1);
    test_free(unfused[0]);
}

/* ---- 2. residual add, layer_norm, cast ---- */

/* 300 rows of 96: 170 rows per block (16384 / 96), so the second block
 * has 130 rows. */
enum { LR = 300, LC = 96 };
#define LN_EPS 1e-5
/* The bound against the f64 reference: 2 f16 ulps, or LN_F32_NOISE
 * absolute. layer_norm computes in f32, so its result carries an absolute
 * error of a few 2^-24 times the row's scale (|y * gamma| + |beta| <= ~8
 * here: < 1e-6); where the result cancels to near 0 (|ref| < 2^-6), that
 * is more than 2 f16 ulps (2^-24 at 1e-4: measured 2 ulps at 9.9e-5).
 * Above 2^-6 an f16 ulp (>= 2^-16) dwarfs it: within 1 ulp. */
#define LN_F32_NOISE 1e-6
#define LN_BIG 0x1p-6

static alloy_graph *layer_norm_graph(int variant)
{
    (void)variant;
    alloy_graph *g = alloy_graph_new("layer_norm");
    alloy_tensor *a = alloy_input(g, "a", F32, 2, DIMS(LR, LC));
    alloy_tensor *b = alloy_input(g, "b", F32, 2, DIMS(LR, LC));
    alloy_tensor *gamma = alloy_input(g, "gamma", F32, 1, DIMS(LC));
    alloy_tensor *beta = alloy_input(g, "beta", F32, 1, DIMS(LC));
    alloy_tensor *r = alloy_set_name(g, alloy_add(g, a, b), "residual");
    alloy_tensor *n = alloy_set_name(g, alloy_layer_norm(g, r, gamma, beta, LN_EPS), "normed");
    alloy_output(g, "residual", r);
    alloy_output(g, "out", alloy_set_name(g, alloy_cast(g, n, F16), "out"));
    return g;
}

static void test_a_residual_add_layer_norm_cast_row_group_with_a_partial_last_block_gives_the_unfused_bits(
    void **state)
{
    (void)state;
    expect_one_group(layer_norm_graph, 0, "out", IR_GROUP_ROW, "add layer_norm cast");

    static float a[LR * LC], b[LR * LC], gamma[LC], beta[LC];
    test_rng = 23;
    fill(a, LR * LC, -2, 2), fill(b, LR * LC, -1, 3), fill(gamma, LC, 0.5, 1.5), fill(beta, LC, -0.5, 0.5);
    alloy_host_tensor feeds[4] = {{"a", F32, 2, {LR, LC}, a}, {"b", F32, 2, {LR, LC}, b},
                                  {"gamma", F32, 1, {LC}, gamma}, {"beta", F32, 1, {LC}, beta}};
    const char *names[] = {"residual", "out"};
    size_t bytes[] = {sizeof a, sizeof(uint16_t) * LR * LC};
    void *unfused[2];
    expect_fused_bits(layer_norm_graph, 0, feeds, 4, names, 2, bytes, unfused);
    const float *res = unfused[0];
    const uint16_t *out = unfused[1];
    int worst_big = 0, worst = 0;
    double worst_small = 0;
    for (int r = 0; r < LR; r++) {
        double v[LC], mean = 0, var = 0;
        for (int j = 0; j < LC; j++) {
            float sum = a[r * LC + j] + b[r * LC + j];
            assert_memory_equal(&res[r * LC + j], &sum, sizeof sum);
            v[j] = sum;
            mean += v[j] / LC;
        }
        for (int j = 0; j < LC; j++) var += (v[j] - mean) * (v[j] - mean) / LC;
        for (int j = 0; j < LC; j++) {
            double want = (v[j] - mean) / sqrt(var + LN_EPS) * gamma[j] + beta[j], err = fabs(f16(out[r * LC + j]) - want);
            int u = f16_ulps(out[r * LC + j], cvt_f64_to_f16(want));
            worst = u > worst ? u : worst;
            if (fabs(want) >= LN_BIG) worst_big = u > worst_big ? u : worst_big;
            else worst_small = fmax(worst_small, err);
            if (u > 2 && err > LN_F32_NOISE)
                fail_msg("row %d col %d: %.9g, %d f16 ulp from the f64 %.9g", r, j, f16(out[r * LC + j]), u, want);
        }
    }
    printf("layer_norm, %d rows of %d (blocks of 170 and 130 rows): fused == unfused on 1 and 2 threads; vs f64 "
           "reference: max %d f16 ulp (%d where |ref| >= 2^-6), max |error| %.3g where |ref| < 2^-6 (f16 rounding included)\n",
           LR, LC, worst, worst_big, worst_small);
    assert_true(worst_big <= 1);
    test_free(unfused[0]);
    test_free(unfused[1]);
}

/* ---- 3. cross_entropy and its gradient ---- */

/* 600 rows of 37 (the brief's 200 rows fit one block; 600 make two, of
 * 442 and 158 rows: 16384 / 37 = 442), so the per-row losses of both
 * blocks meet in the mean and the gradient's 1/rows is the whole group's. */
enum { CR = 600, CC = 37 };
#define CE_SCALE 1.7f

/* loss = cross_entropy(x * 1.7, targets), with the gradient of x. */
static alloy_graph *cross_entropy_graph(int variant)
{
    (void)variant;
    alloy_graph *g = alloy_graph_new("cross_entropy");
    alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(CR, CC));
    alloy_tensor *t = alloy_input(g, "targets", ALLOY_I32, 1, DIMS(CR));
    alloy_tensor *logits = alloy_set_name(g, alloy_mul(g, x, alloy_scalar(g, F32, CE_SCALE)), "logits");
    alloy_tensor *loss = alloy_set_name(g, alloy_cross_entropy(g, logits, t), "loss");
    alloy_output(g, "loss", loss);
    expect_ok(g, alloy_graph_request_grad(g, x), "request_grad");
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    return g;
}

static void test_cross_entropy_and_its_gradient_form_one_row_group_with_the_unfused_bits_and_the_f64_loss(
    void **state)
{
    (void)state;
    /* forward and backward in one group: cross_entropy_grad reads the
     * logits row by row, and nothing outside reads the group before it */
    expect_one_group(cross_entropy_graph, 0, "loss", IR_GROUP_ROW, "mul cross_entropy cross_entropy_grad mul");

    static float x[CR * CC];
    int32_t t[CR];
    test_rng = 31;
    fill(x, CR * CC, -2, 2);
    for (int r = 0; r < CR; r++) t[r] = (int32_t)(test_uniform(0, 1) * CC);
    alloy_host_tensor feeds[2] = {{"x", F32, 2, {CR, CC}, x}, {"targets", ALLOY_I32, 1, {CR}, t}};
    const char *names[] = {"loss", "grad:x"};
    size_t bytes[] = {sizeof(float), sizeof x};
    void *unfused[2];
    expect_fused_bits(cross_entropy_graph, 0, feeds, 2, names, 2, bytes, unfused);
    double loss = 0, worst_grad = 0;
    const float *grad = unfused[1];
    for (int r = 0; r < CR; r++) {
        double l[CC], m = -INFINITY, sum = 0;
        for (int j = 0; j < CC; j++) m = fmax(m, l[j] = (float)(x[r * CC + j] * CE_SCALE));
        for (int j = 0; j < CC; j++) sum += exp(l[j] - m);
        loss += (log(sum) + m - l[t[r]]) / CR;
        for (int j = 0; j < CC; j++) {
            double want = CE_SCALE * (exp(l[j] - m) / sum - (j == t[r])) / CR;
            worst_grad = fmax(worst_grad, fabs(grad[r * CC + j] - want));
        }
    }
    double got = *(const float *)unfused[0], rel = fabs(got - loss) / loss;
    printf("cross_entropy over %d rows of %d (2 blocks): fused == unfused (loss, grad:x) on 1 and 2 threads; loss %.9g vs f64 "
           "%.9g (rel %.2e); grad:x max |error| %.3g = %.3g of scale/rows\n",
           CR, CC, got, loss, rel, worst_grad, worst_grad / (CE_SCALE / CR));
    assert_true(rel <= 1e-6);
    /* p - onehot in f32: ~1e-7 absolute, times scale/rows */
    assert_true(worst_grad <= 1e-6 * CE_SCALE / CR);
    test_free(unfused[0]);
    test_free(unfused[1]);
}

/* ---- 4. GEMM epilogues ---- */

enum { GM = 64, GK = 48, GN = 40 };

/* out = cast<f32>(act(a @ w + bias)), all f16 but out; variant 0: tanh GELU
 * (a cuBLASLt epilogue), 1: erf GELU (none). */
static alloy_graph *gemm_graph(int variant)
{
    alloy_graph *g = alloy_graph_new("gemm");
    alloy_tensor *a = alloy_input(g, "a", F16, 2, DIMS(GM, GK));
    alloy_tensor *w = alloy_input(g, "w", F16, 2, DIMS(GK, GN));
    alloy_tensor *bias = alloy_input(g, "bias", F16, 1, DIMS(GN));
    alloy_tensor *p = alloy_set_name(g, alloy_matmul(g, a, w, false, false), "product");
    alloy_tensor *h = alloy_set_name(g, alloy_add(g, p, bias), "preact");
    alloy_tensor *act = alloy_set_name(g, variant == 1 ? alloy_gelu(g, h) : alloy_gelu_tanh(g, h), "act");
    alloy_output(g, "out", alloy_set_name(g, alloy_cast(g, act, F32), "out"));
    if (variant == 2) alloy_output(g, "preact", h); /* read after the group, as a backward reads it */
    return g;
}

static double gelu_tanh_ref(double z) { return 0.5 * z * (1 + tanh(0.79788456080286535588 * (z + 0.044715 * z * z * z))); }
static double gelu_erf_ref(double z) { return 0.5 * z * (1 + erf(z * 0.70710678118654752440)); }

/* a @ w + bias in f64 from the f16 inputs (every product exact). */
static void gemm_preact_reference(const uint16_t *a, const uint16_t *w, const uint16_t *bias, double *h)
{
    for (int i = 0; i < GM; i++)
        for (int j = 0; j < GN; j++) {
            double s = f16(bias[j]);
            for (int k = 0; k < GK; k++) s += f16(a[i * GK + k]) * f16(w[k * GN + j]);
            h[i * GN + j] = s;
        }
}

static void gemm_inputs(uint16_t *a, uint16_t *w, uint16_t *bias, alloy_host_tensor *feeds)
{
    test_rng = 41;
    fill_f16(a, GM * GK, -1, 1), fill_f16(w, GK * GN, -0.5, 0.5), fill_f16(bias, GN, -1, 1);
    feeds[0] = (alloy_host_tensor){"a", F16, 2, {GM, GK}, a};
    feeds[1] = (alloy_host_tensor){"w", F16, 2, {GK, GN}, w};
    feeds[2] = (alloy_host_tensor){"bias", F16, 1, {GN}, bias};
}

/* Fused, out is gelu_tanh (in f32) of the f32 accumulation of 48 exact
 * products plus the bias: error <= ~48 * 2^-24 * sum |a w| (< 3e-5 here)
 * plus f32's gelu, so 1e-4 * (|ref| + 1) (measured 3.3e-7). Unfused, the
 * product, the bias add and gelu each round to f16 (2^-11 relative); the
 * bias add can cancel, so that is no bound in ulps of the result
 * (measured 7.6e-4 * (|ref| + 1)); in sum the fused errors are smaller. */
static void test_a_gemm_epilogue_group_keeps_the_product_in_f32_and_is_closer_to_f64_than_unfused(void **state)
{
    (void)state;
    expect_one_group(gemm_graph, 0, "product", IR_GROUP_GEMM, "matmul add gelu_tanh cast");

    uint16_t a[GM * GK], w[GK * GN], bias[GN];
    alloy_host_tensor feeds[3];
    gemm_inputs(a, w, bias, feeds);
    static double h[GM * GN];
    gemm_preact_reference(a, w, bias, h);
    const char *names[] = {"out"};
    void *fused[1], *unfused[1];
    run_copy(gemm_graph, 0, true, 1, feeds, 3, names, 1, fused);
    run_copy(gemm_graph, 0, false, 1, feeds, 3, names, 1, unfused);
    const float *f = fused[0], *u = unfused[0];
    double worst = 0, sum_fused = 0, sum_unfused = 0, worst_unfused = 0;
    for (int e = 0; e < GM * GN; e++) {
        double want = gelu_tanh_ref(h[e]);
        worst = fmax(worst, fabs(f[e] - want) / (fabs(want) + 1));
        sum_fused += fabs(f[e] - want);
        sum_unfused += fabs(u[e] - want);
        worst_unfused = fmax(worst_unfused, fabs(u[e] - want) / (fabs(want) + 1));
    }
    printf("gemm [%d,%d]@[%d,%d] + bias, gelu_tanh, cast: fused max |error|/(|ref|+1) %.3g, sum |error| fused %.3g "
           "vs unfused %.3g; unfused max |error|/(|ref|+1) %.3g\n",
           GM, GK, GK, GN, worst, sum_fused, sum_unfused, worst_unfused);
    assert_true(worst <= 1e-4);
    assert_true(sum_fused < sum_unfused);
    test_free(fused[0]);
    test_free(unfused[0]);
}

static void test_an_erf_gelu_is_no_gemm_epilogue_and_stays_outside_the_gemm_group(void **state)
{
    (void)state;
    alloy_graph *g = gemm_graph(1);
    const ir_graph *c = compiled(g);
    ir_print_groups(c, stdout);
    int k = group_of(c, "product");
    assert_int_equal(group_kind(c, k), IR_GROUP_GEMM);
    expect_group_ops(c, k, "matmul add");
    assert_true(group_of(c, "act") != k);
    assert_int_equal(group_of(c, "act"), group_of(c, "out"));
    assert_int_equal(group_kind(c, group_of(c, "act")), IR_GROUP_EW);
    alloy_graph_free(g);

    uint16_t a[GM * GK], w[GK * GN], bias[GN];
    alloy_host_tensor feeds[3];
    gemm_inputs(a, w, bias, feeds);
    static double h[GM * GN];
    gemm_preact_reference(a, w, bias, h);
    const char *names[] = {"preact", "out"};
    void *fused[2];
    run_copy(gemm_graph, 1, true, 1, feeds, 3, names, 2, fused);
    /* the stored add (f16) is the product and bias added in f32 and rounded
     * once: the correctly rounded f64 value up to f32's error. The f16 gelu
     * and its cast to f32 are an EW group: gelu's f16 result is never
     * rounded, so out is gelu of the stored add to f32 precision (an f16
     * rounding would be ~5e-4) */
    const uint16_t *pre = fused[0];
    const float *out = fused[1];
    int worst_pre = 0;
    double worst_out = 0;
    for (int e = 0; e < GM * GN; e++) {
        int ul = f16_ulps(pre[e], cvt_f64_to_f16(h[e]));
        if (ul > worst_pre) worst_pre = ul;
        worst_out = fmax(worst_out, fabs(out[e] - gelu_erf_ref(f16(pre[e]))) / (fabs(gelu_erf_ref(f16(pre[e]))) + 1));
    }
    printf("gemm + erf gelu: stored preact max %d f16 ulp from f64; out vs f64 gelu of it: max %.3g\n", worst_pre,
           worst_out);
    assert_true(worst_pre <= 1);
    assert_true(worst_out <= 1e-6);
    test_free(fused[0]);
    test_free(fused[1]);
}

/* GELU_AUX: when the pre-activation has another reader after the group
 * (an output here; in a training step the activation's gradient), the
 * epilogue still goes through the activation and also stores the
 * pre-activation, as cuBLASLt's GELU_AUX_BIAS does. The stored add is the
 * f32 product plus bias rounded once to f16; the activation reads the
 * unrounded f32 value (the group contract), so out is gelu_tanh of the
 * exact pre-activation to f32 precision, not of its f16 rounding. */
static void test_a_gemm_epilogue_stores_the_preactivation_another_node_reads_and_goes_on_through_gelu(void **state)
{
    (void)state;
    alloy_graph *g = gemm_graph(2);
    const ir_graph *c = compiled(g);
    ir_print_groups(c, stdout);
    assert_int_equal(group_count(c), 1);
    int k = group_of(c, "product");
    assert_int_equal(group_kind(c, k), IR_GROUP_GEMM);
    expect_group_ops(c, k, "matmul add gelu_tanh cast");
    alloy_graph_free(g);

    uint16_t a[GM * GK], w[GK * GN], bias[GN];
    alloy_host_tensor feeds[3];
    gemm_inputs(a, w, bias, feeds);
    static double h[GM * GN];
    gemm_preact_reference(a, w, bias, h);
    const char *names[] = {"preact", "out"};
    void *fused[2], *unfused[2];
    run_copy(gemm_graph, 2, true, 1, feeds, 3, names, 2, fused);
    run_copy(gemm_graph, 2, false, 1, feeds, 3, names, 2, unfused);
    const uint16_t *pre = fused[0];
    const float *out = fused[1], *out_unfused = unfused[1];
    int worst_pre = 0;
    double worst_out = 0, worst_unfused = 0;
    for (int e = 0; e < GM * GN; e++) {
        worst_pre = fmax(worst_pre, f16_ulps(pre[e], cvt_f64_to_f16(h[e])));
        /* act is f16: its one rounding is the store's, as the cast to f32 passes it through */
        double want = gelu_tanh_ref(h[e]);
        worst_out = fmax(worst_out, fabs(out[e] - want) / (fabs(want) + 1e-3));
        worst_unfused = fmax(worst_unfused, fabs(out_unfused[e] - want) / (fabs(want) + 1e-3));
    }
    printf("gemm + gelu_tanh with the preact stored: preact max %d f16 ulp from f64; out vs f64 gelu_tanh: fused "
           "%.3g, unfused %.3g\n", worst_pre, worst_out, worst_unfused);
    assert_true(worst_pre <= 1);
    assert_true(worst_out <= 1e-3); /* act's f16 store: half an ulp, 2^-11, plus f32 slack */
    assert_true(worst_out <= worst_unfused);
    for (int i = 0; i < 2; i++) test_free(fused[i]), test_free(unfused[i]);
}

/* ---- 5. unscale + found_inf ---- */

enum { MB = 16, MI = 12, MH = 24, MO = 6, MSTEPS = 3, MPARAMS = 4 };
#define MLP_LR 0.05

static const char *const mlp_params[MPARAMS] = {"w1", "b1", "w2", "b2"};

/* The MLP with a dynamic loss scaler (2^16) and SGD; variant 1: AMP f16. */
static alloy_graph *mlp_trainer(int variant)
{
    alloy_graph *g = alloy_graph_new("mlp");
    alloy_graph_set_seed(g, 3);
    test_mlp m = build_mlp(g, F32, MB, MI, MH, MO);
    expect_ok(g, alloy_graph_set_loss(g, m.loss), "set_loss");
    if (variant) expect_ok(g, alloy_graph_enable_amp(g, F16), "enable_amp");
    expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(MLP_LR, 0, 0, false)), "add_optimizer");
    return g;
}

/* The multi group ending in found_inf, which holds the unscale mul of
 * every parameter's gradient (found_inf reads them inside the group). */
static void expect_found_inf_group(const ir_graph *c)
{
    int fi = -1;
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i]->op == IR_OP_found_inf) fi = i;
    assert_true(fi >= 0);
    const ir_node *F = c->nodes[fi];
    int k = F->group, *ids = test_malloc(sizeof(int) * (size_t)c->nnodes), n = group_members(c, k, ids);
    assert_true(k >= 0);
    assert_int_equal(group_kind(c, k), IR_GROUP_MULTI);
    assert_int_equal(ids[n - 1], fi);
    test_free(ids);
    assert_int_equal(F->nin, MPARAMS);
    for (int j = 0; j < F->nin; j++) {
        const ir_node *unscale = c->nodes[F->in[j]];
        assert_int_equal(unscale->op, IR_OP_mul);
        assert_int_equal(unscale->group, k);
    }
}

typedef struct mlp_record {
    bool skipped[MSTEPS];
    double loss[MSTEPS], scale[MSTEPS];
    int nonfinite[MSTEPS][MPARAMS]; /* elements of the fetched grad:<p> that are inf/NaN */
    snapshot before, after[MSTEPS];
} mlp_record;

/* Three SGD steps with fusion on or off: normal inputs; the same with
 * x[5] = bad (inf: the step must be skipped); other normal inputs. */
static void train_mlp(int variant, bool fused, float bad, mlp_record *r)
{
    fusion(fused);
    alloy_graph *g = mlp_trainer(variant);
    const ir_graph *c = compiled(g);
    if (fused) expect_found_inf_group(c);
    else assert_int_equal(group_count(c), 0);
    r->before = take_snapshot(g);
    for (int s = 0; s < MSTEPS; s++) {
        float x[MB * MI];
        int32_t t[MB];
        test_rng = 50 + (uint64_t)(s == 2);
        fill(x, MB * MI, -1, 1);
        for (int i = 0; i < MB; i++) t[i] = (int32_t)(test_uniform(0, 1) * MO);
        if (s == 1) x[5] = bad;
        alloy_host_tensor feeds[2] = {{"x", F32, 2, {MB, MI}, x}, {"targets", ALLOY_I32, 1, {MB}, t}};
        alloy_host_tensor grads[MPARAMS] = {{.name = "grad:w1"}, {.name = "grad:b1"}, {.name = "grad:w2"},
                                            {.name = "grad:b2"}};
        expect_ok(g, alloy_graph_run(g, feeds, 2, grads, MPARAMS), "training step");
        for (int p = 0; p < MPARAMS; p++) {
            r->nonfinite[s][p] = 0;
            for (int64_t e = 0; e < alloy_host_tensor_numel(&grads[p]); e++)
                r->nonfinite[s][p] += !isfinite(((const float *)grads[p].data)[e]);
        }
        alloy_step_info info;
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        r->skipped[s] = info.skipped, r->loss[s] = info.loss, r->scale[s] = info.scale;
        r->after[s] = take_snapshot(g);
    }
    alloy_graph_free(g);
    fusion(true);
}

static void free_record(mlp_record *r)
{
    free_snapshot(&r->before);
    for (int s = 0; s < MSTEPS; s++) free_snapshot(&r->after[s]);
}

static int state_index(const snapshot *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) return i;
    fail_msg("no state '%s'", name);
    return -1;
}

/* The skipped step 1 left the parameters and the step counter as step 0
 * left them, bit for bit, and halved the scale of step 2. */
static void expect_step_1_skipped(const mlp_record *r)
{
    for (int s = 0; s < MSTEPS; s++) assert_int_equal(r->skipped[s], s == 1);
    for (int p = 0; p < MPARAMS; p++) {
        assert_int_equal(r->nonfinite[0][p] + r->nonfinite[2][p], 0);
        if (p == 0) assert_true(r->nonfinite[1][p] > 0); /* x reaches w1's gradient */
    }
    for (int p = 0; p <= MPARAMS; p++) {
        int i = state_index(&r->after[0], p < MPARAMS ? mlp_params[p] : "optim.step");
        assert_memory_equal(r->after[1].data[i], r->after[0].data[i], r->after[0].bytes[i]);
        if (p < MPARAMS) assert_memory_not_equal(r->after[0].data[i], r->before.data[i], r->before.bytes[i]);
    }
    assert_true(r->scale[0] == 65536 && r->scale[1] == 65536 && r->scale[2] == 32768);
}

/* Largest |fused - unfused| of a parameter after the last step, and the
 * largest distance it moved from its initial value (unfused). */
static void param_diffs(const mlp_record *f, const mlp_record *u, double *diff, double *moved)
{
    *diff = *moved = 0;
    for (int p = 0; p < MPARAMS; p++) {
        int i = state_index(&u->before, mlp_params[p]);
        const float *a = f->after[MSTEPS - 1].data[i], *b = u->after[MSTEPS - 1].data[i], *b0 = u->before.data[i];
        for (size_t e = 0; e < u->before.bytes[i] / sizeof(float); e++) {
            *diff = fmax(*diff, fabs((double)a[e] - b[e]));
            *moved = fmax(*moved, fabs((double)b[e] - b0[e]));
        }
    }
}

/* Bounds for the AMP f16 run: fusion removes f16 roundings (the GEMM
 * groups keep the products in f32, the bias adds round once), each a
 * change of <= 2^-11 relative in a forward or backward value. The loss is
 * the mean of cross entropies whose logits move by a few such roundings:
 * MLP_LOSS_REL (measured 1e-5). A gradient element moves by a few
 * roundings of its terms, so two SGD steps move a parameter by a small
 * fraction of its largest step: MLP_PARAM_OF_MOVE times the largest
 * distance a parameter moved (measured 3.8e-4 of it). */
#define MLP_LOSS_REL 1e-3
#define MLP_PARAM_OF_MOVE 0x1p-6

static void test_the_unscale_and_found_inf_multi_group_skips_an_inf_step_as_the_unfused_run_does(void **state)
{
    (void)state;
    for (int variant = 0; variant <= 1; variant++) {
        mlp_record f, u;
        train_mlp(variant, true, INFINITY, &f);
        train_mlp(variant, false, INFINITY, &u);
        for (int s = 0; s < MSTEPS; s++)
            printf("%s step %d: skipped %d/%d, loss %.9g/%.9g, scale %g/%g (fused/unfused)\n",
                   variant ? "AMP f16" : "f32", s, f.skipped[s], u.skipped[s], f.loss[s], u.loss[s], f.scale[s],
                   u.scale[s]);
        expect_step_1_skipped(&f);
        expect_step_1_skipped(&u);
        if (variant == 0) { /* f32: every value is the unfused one */
            assert_int_equal(f.after[0].n, u.after[0].n);
            for (int s = 0; s < MSTEPS; s++) {
                if (s != 1) assert_memory_equal(&f.loss[s], &u.loss[s], sizeof(double));
                for (int i = 0; i < u.after[s].n; i++)
                    assert_memory_equal(f.after[s].data[i], u.after[s].data[i], u.after[s].bytes[i]);
            }
        } else {
            double worst_loss = 0, diff, moved;
            for (int s = 0; s < MSTEPS; s += 2) worst_loss = fmax(worst_loss, fabs(f.loss[s] - u.loss[s]) / u.loss[s]);
            param_diffs(&f, &u, &diff, &moved);
            printf("AMP f16: worst loss rel diff %.2e (bound %.0e); parameters: max |fused - unfused| %.3g = %.3g of "
                   "the largest move %.3g (bound %.3g)\n", worst_loss, MLP_LOSS_REL, diff, diff / moved, moved,
                   MLP_PARAM_OF_MOVE);
            assert_true(worst_loss <= MLP_LOSS_REL);
            assert_true(diff <= MLP_PARAM_OF_MOVE * moved);
        }
        free_record(&f);
        free_record(&u);
    }
}

/* The range rule (docs/fusion.md, "Numerics"): with x[5] = 100 at step 1
 * the forward stays finite, but the backward matmuls of w1 and w2 give
 * products beyond the f16 range. Unfused, they are rounded to f16 (inf)
 * before their cast to f32. Fused, each is a `cast<f32>(matmul)` GEMM group
 * whose product is never stored in f16 but keeps f16's range, so the same
 * elements are inf: found_inf fires in both, the step is skipped in both,
 * and the runs go on together (losses within MLP_LOSS_REL). */
static void test_a_gemm_product_beyond_the_f16_range_is_inf_fused_as_unfused_and_both_skip_the_step(void **state)
{
    (void)state;
    mlp_record f, u;
    train_mlp(1, true, 100.0f, &f);
    train_mlp(1, false, 100.0f, &u);
    for (int s = 0; s < MSTEPS; s++)
        printf("AMP f16, x[5] = 100 at step 1: step %d skipped %d/%d, loss %.9g/%.9g, non-finite gradient elements "
               "w1 %d/%d b1 %d/%d w2 %d/%d b2 %d/%d (fused/unfused)\n",
               s, f.skipped[s], u.skipped[s], f.loss[s], u.loss[s], f.nonfinite[s][0], u.nonfinite[s][0],
               f.nonfinite[s][1], u.nonfinite[s][1], f.nonfinite[s][2], u.nonfinite[s][2], f.nonfinite[s][3],
               u.nonfinite[s][3]);
    assert_int_equal(u.skipped[1], 1); /* f16(x^T dy) overflowed */
    assert_true(u.nonfinite[1][0] + u.nonfinite[1][2] > 0);
    for (int s = 0; s < MSTEPS; s++) {
        assert_int_equal(f.skipped[s], u.skipped[s]);
        for (int w = 0; w < 4; w++) assert_int_equal(f.nonfinite[s][w], u.nonfinite[s][w]);
        assert_true(fabs(f.loss[s] - u.loss[s]) <= MLP_LOSS_REL * fabs(u.loss[s]));
    }
    free_record(&f);
    free_record(&u);
}

/* A linear layer pre = bias + a w in dt (f16 or bf16), a [2, 24, 48], w [48, 40], and y = act(pre)
 * (act 0: none, y = pre; 1: relu; 2: gelu_tanh), pre fetched too when act (so stored, as for an
 * activation's gradient): a gemm step the CPU runs whole in the GEMM's tiles (gemm_lowp_epi: no f32
 * product written out), and with amp_check on (which keeps the fused group, checking what it
 * computes) the group's chunk loop. y and pre bit for bit the same on 1 and 2 threads. In f16 a's
 * first row is 16 and w's first 20 columns 100, so those 20 products are 16 x 100 x 48 = 76800, past
 * f16's range, and the bias of -30000 would bring them back to 46800: the range rule makes each inf
 * before the add, on both paths. */
static void linear_act_run(alloy_dtype dt, int act, bool checked, int nthreads, const uint16_t *a, const uint16_t *w,
                           const uint16_t *bias, uint16_t *y, uint16_t *pre)
{
    threads(nthreads);
    alloy_graph *g = alloy_graph_new("linear_act");
    alloy_tensor *ta = alloy_input(g, "a", dt, 3, DIMS(2, 24, 48)), *tw = alloy_input(g, "w", dt, 2, DIMS(48, 40));
    alloy_tensor *tb = alloy_input(g, "bias", dt, 1, DIMS(40));
    alloy_tensor *p = alloy_add(g, tb, alloy_matmul(g, ta, tw, false, false));
    alloy_output(g, "y", act == 1 ? alloy_relu(g, p) : act == 2 ? alloy_gelu_tanh(g, p) : p);
    if (act) alloy_output(g, "pre", p);
    if (checked) expect_ok(g, alloy_graph_set_option(g, "amp_check", "1"), "amp_check");
    alloy_host_tensor feeds[3] = {{"a", dt, 3, {2, 24, 48}, (void *)a}, {"w", dt, 2, {48, 40}, (void *)w},
                                  {"bias", dt, 1, {40}, (void *)bias}};
    alloy_host_tensor out[2] = {{.name = "y"}, {.name = "pre"}};
    expect_ok(g, alloy_graph_run(g, feeds, 3, out, act ? 2 : 1), "run");
    assert_int_equal(out[0].dtype, dt);
    memcpy(y, out[0].data, sizeof(uint16_t) * 2 * 24 * 40);
    if (act) memcpy(pre, out[1].data, sizeof(uint16_t) * 2 * 24 * 40);
    alloy_graph_free(g);
    unsetenv("ALLOY_NUM_THREADS");
}

static void test_a_linear_layer_in_the_gemm_tiles_gives_the_fused_groups_bits_and_range_rule(void **state)
{
    (void)state;
    enum { NA = 2 * 24 * 48, NW = 48 * 40, NY = 2 * 24 * 40 };
    static uint16_t a[NA], w[NW], bias[40], want[NY], got[NY], want_pre[NY], got_pre[NY];
    static const char *const acts[] = {"bias", "bias + relu", "bias + gelu_tanh"};
    for (int di = 0; di < 2; di++)
        for (int act = 0; act < 3; act++) {
            alloy_dtype dt = di ? ALLOY_BF16 : F16;
            double va[NA], vw[NW], vb[40];
            test_rng = 83;
            for (int i = 0; i < NA; i++) va[i] = test_uniform(-1, 1);
            for (int i = 0; i < NW; i++) vw[i] = test_uniform(-1, 1);
            for (int j = 0; j < 40; j++) vb[j] = test_uniform(-1, 1);
            if (dt == F16) {
                for (int p = 0; p < 48; p++) va[p] = 16;
                for (int p = 0; p < 48; p++)
                    for (int j = 0; j < 20; j++) vw[p * 40 + j] = 100;
                for (int j = 0; j < 20; j++) vb[j] = -30000;
            }
            test_encode(dt, va, a, NA), test_encode(dt, vw, w, NW), test_encode(dt, vb, bias, 40);
            linear_act_run(dt, act, true, 1, a, w, bias, want, want_pre);
            for (int t = 1; t <= 2; t++) {
                linear_act_run(dt, act, false, t, a, w, bias, got, got_pre);
                for (int i = 0; i < NY; i++)
                    if (got[i] != want[i] || (act && got_pre[i] != want_pre[i]))
                        fail_msg("%s %s, %d thread(s): y[%d] is 0x%04x in the tiles, 0x%04x from the fused group "
                                 "(pre 0x%04x, 0x%04x)", alloy_dtype_name(dt), acts[act], t, i, got[i], want[i],
                                 got_pre[i], want_pre[i]);
            }
            if (dt == F16)
                for (int j = 0; j < 20; j++) {
                    double v = test_decode(dt, act ? got_pre : got, j);
                    assert_true(isinf(v) && v > 0);
                }
            printf("%s linear layer (%s) in the GEMM's tiles: the fused group's bits on 1 and 2 threads%s\n",
                   alloy_dtype_name(dt), acts[act], dt == F16 ? "; 20 products past f16's range inf despite a bias of -30000" : "");
        }
}

/* ---- 6. row group inputs a block can and cannot slice ---- */

enum { SA = 8, SB = 128, SC = 32, SN = SA * SB * SC };

/* softmax over the last axis of x [8,128,32] (32768 elements: two row
 * blocks of 512 rows) plus y. Variant 0: softmax(x + y), y [8,1,32],
 * neither the group's shape, one row, nor one value per row, so no block
 * can take its part of it and the group runs as one block of all rows.
 * Variant 1: softmax((x + y) * z), y [8,128,1] (one value per row, sliced
 * per block) and z [32] (one row, read whole by every block). */
static alloy_graph *broadcast_softmax_graph(int variant)
{
    alloy_graph *g = alloy_graph_new("broadcast_softmax");
    alloy_tensor *x = alloy_input(g, "x", F32, 3, DIMS(SA, SB, SC));
    alloy_tensor *y = variant ? alloy_input(g, "y", F32, 3, DIMS(SA, SB, 1)) : alloy_input(g, "y", F32, 3, DIMS(SA, 1, SC));
    alloy_tensor *s = alloy_set_name(g, alloy_add(g, x, y), "sum");
    if (variant) s = alloy_mul(g, s, alloy_input(g, "z", F32, 1, DIMS(SC)));
    alloy_output(g, "p", alloy_set_name(g, alloy_softmax(g, s, -1), "p"));
    return g;
}

static void expect_broadcast_softmax(int variant)
{
    expect_one_group(broadcast_softmax_graph, variant, "p", IR_GROUP_ROW, variant ? "add mul softmax" : "add softmax");

    static float x[SN], y[SA * SB], z[SC];
    test_rng = 61 + (uint64_t)variant;
    fill(x, SN, -3, 3), fill(y, SA * SB, -3, 3), fill(z, SC, 0.5, 2);
    alloy_host_tensor feeds[3] = {{"x", F32, 3, {SA, SB, SC}, x},
                                  variant ? (alloy_host_tensor){"y", F32, 3, {SA, SB, 1}, y}
                                          : (alloy_host_tensor){"y", F32, 3, {SA, 1, SC}, y},
                                  {"z", F32, 1, {SC}, z}};
    const char *names[] = {"p"};
    size_t bytes[] = {sizeof x};
    void *unfused[1];
    expect_fused_bits(broadcast_softmax_graph, variant, feeds, variant ? 3 : 2, names, 1, bytes, unfused);
    const float *p = unfused[0];
    double worst = 0;
    for (int r = 0; r < SA * SB; r++) {
        double v[SC], m = -INFINITY, sum = 0;
        for (int j = 0; j < SC; j++) {
            float yv = variant ? y[r] : y[(r / SB) * SC + j];
            float sv = x[r * SC + j] + yv;
            v[j] = variant ? (float)(sv * z[j]) : sv;
            m = fmax(m, v[j]);
        }
        for (int j = 0; j < SC; j++) sum += exp(v[j] - m);
        for (int j = 0; j < SC; j++) {
            double want = exp(v[j] - m) / sum;
            worst = fmax(worst, fabs(p[r * SC + j] - want) / want);
        }
    }
    printf("softmax(x + y%s), y %s: fused == unfused on 1 and 2 threads; max rel error vs f64 %.3g\n",
           variant ? " * z" : "", variant ? "[8,128,1] per row, z [32]" : "[8,1,32]", worst);
    assert_true(worst <= 1e-5);
    test_free(unfused[0]);
}

static void test_a_row_group_input_no_row_block_can_slice_runs_as_one_block_and_gives_the_unfused_bits(void **state)
{
    (void)state;
    expect_broadcast_softmax(0);
}

static void test_per_row_and_whole_row_inputs_of_a_row_group_are_sliced_per_block_and_give_the_unfused_bits(
    void **state)
{
    (void)state;
    expect_broadcast_softmax(1);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* the printed group tables interleave with cmocka's lines */
    const struct CMUnitTest tests[] = {
        FUSE_TEST(test_a_masked_softmax_row_group_spans_several_blocks_and_gives_the_unfused_bits),
        FUSE_TEST(test_a_residual_add_layer_norm_cast_row_group_with_a_partial_last_block_gives_the_unfused_bits),
        FUSE_TEST(test_cross_entropy_and_its_gradient_form_one_row_group_with_the_unfused_bits_and_the_f64_loss),
        FUSE_TEST(test_a_gemm_epilogue_group_keeps_the_product_in_f32_and_is_closer_to_f64_than_unfused),
        FUSE_TEST(test_an_erf_gelu_is_no_gemm_epilogue_and_stays_outside_the_gemm_group),
        FUSE_TEST(test_a_gemm_epilogue_stores_the_preactivation_another_node_reads_and_goes_on_through_gelu),
        FUSE_TEST(test_the_unscale_and_found_inf_multi_group_skips_an_inf_step_as_the_unfused_run_does),
        FUSE_TEST(test_a_gemm_product_beyond_the_f16_range_is_inf_fused_as_unfused_and_both_skip_the_step),
        FUSE_TEST(test_a_linear_layer_in_the_gemm_tiles_gives_the_fused_groups_bits_and_range_rule),
        FUSE_TEST(test_a_row_group_input_no_row_block_can_slice_runs_as_one_block_and_gives_the_unfused_bits),
        FUSE_TEST(test_per_row_and_whole_row_inputs_of_a_row_group_are_sliced_per_block_and_give_the_unfused_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
