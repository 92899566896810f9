/* test_random.c - the random ops: Philox's known answers, dropout's masks (reproducible, per step and node, mean-preserving, the same in the backward, off outside training, across skipped steps), uniform and normal moments, the seed, the IR text. */
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
#include "base/random.h"
#include "support.h"

enum { BIG = 1 << 20 }; /* elements of the statistical checks */

/* Random123's kat_vectors for philox4x32_10: counter, key -> the four words. */
static void test_philox_4x32_10_gives_the_random123_known_answers(void **state)
{
    (void)state;
    static const unsigned kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
         0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
         0x24126ea1},
    };
    for (int k = 0; k < 3; k++) {
        unsigned c[4] = {kat[k][0], kat[k][1], kat[k][2], kat[k][3]};
        alloy_philox4x32_10(c, kat[k][4], kat[k][5]);
        for (int j = 0; j < 4; j++) assert_int_equal(c[j], kat[k][6 + j]);
    }
    /* the element's counter: (i, i >> 32, stream, step) under (seed, seed >> 32) */
    unsigned w[4], c[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    alloy_random_words(0x299f31d0a4093822ull, 0x13198a2e, 0x03707344, 0x85a308d3243f6a88ull, w);
    alloy_philox4x32_10(c, 0xa4093822, 0x299f31d0);
    assert_memory_equal(w, c, sizeof w);
}

/* x [n] -> h = x * w (w a param of ones) -> y1 = dropout(h, p), y2 =
 * dropout(h, p) (another node); loss = sum(y1 * c). SGD with lr 0 keeps w
 * at 1, so grad:w = dropout(c) * x redraws y1's mask. With `train` false
 * the graph has no loss. */
static alloy_graph *dropout_graph(uint64_t seed, int64_t n, double p, bool train, bool scaler)
{
    alloy_graph *g = alloy_graph_new("dropout");
    alloy_graph_set_seed(g, seed);
    alloy_tensor *x = alloy_input(g, "x", F32, 1, DIMS(n)), *c = alloy_input(g, "c", F32, 1, DIMS(n));
    alloy_tensor *w = alloy_param(g, "w", F32, 1, DIMS(n), alloy_init_ones());
    alloy_tensor *h = alloy_mul(g, x, w);
    alloy_tensor *y1 = alloy_set_name(g, alloy_dropout(g, h, p), "y1"), *y2 = alloy_dropout(g, h, p);
    expect_ok(g, alloy_output(g, "y1", y1), "output y1");
    expect_ok(g, alloy_output(g, "y2", y2), "output y2");
    if (train) {
        expect_ok(g, alloy_graph_set_loss(g, alloy_reduce_sum(g, alloy_mul(g, y1, c), 0, NULL, false)), "loss");
        if (scaler) expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), "scaler");
        expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.0, 0.0, 0.0, false)), "optimizer");
    }
    return g;
}

/* x in [0.5, 1.5) (never 0, so a zero output is a dropped element); c = 1. */
static float *positive_values(int64_t n, uint64_t seed)
{
    float *v = malloc(sizeof(float) * (size_t)n);
    assert_non_null(v);
    test_rng = seed;
    for (int64_t i = 0; i < n; i++) v[i] = (float)test_uniform(0.5, 1.5);
    return v;
}

/* One run; copies of the fetched values (NULL names skipped) into out[]. */
static void run(alloy_graph *g, const float *x, const float *c, int64_t n, const char *const *names, float **out, int nout)
{
    alloy_host_tensor feeds[2] = {{"x", F32, 1, {n}, (void *)x}, {"c", F32, 1, {n}, (void *)c}};
    alloy_host_tensor fetch[4];
    for (int i = 0; i < nout; i++) fetch[i] = (alloy_host_tensor){.name = names[i]};
    expect_ok(g, alloy_graph_run(g, feeds, 2, fetch, nout), "run");
    for (int i = 0; i < nout; i++) {
        assert_int_equal(fetch[i].dtype, F32);
        out[i] = malloc(sizeof(float) * (size_t)n);
        assert_non_null(out[i]);
        memcpy(out[i], fetch[i].data, sizeof(float) * (size_t)n);
    }
}

static int64_t count_differing_masks(const float *a, const float *b, int64_t n)
{
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += (a[i] == 0) != (b[i] == 0);
    return d;
}

static void test_dropout_keeps_1_minus_p_scales_by_1_over_1_minus_p_and_its_gradient_redraws_the_mask(void **state)
{
    (void)state;
    const int64_t n = BIG;
    const double p = 0.1;
    float *x = positive_values(n, 1), *c = malloc(sizeof(float) * n);
    assert_non_null(c);
    for (int64_t i = 0; i < n; i++) c[i] = 1;
    alloy_graph *g = dropout_graph(7, n, p, true, false);
    static const char *const names[] = {"y1", "y2", "grad:w"};
    float *r0[3], *r1[1];
    run(g, x, c, n, names, r0, 3);
    run(g, x, c, n, names, r1, 1);
    /* every element is x * (float)(1/(1-p)) or 0; the gradient is the same mask times c * x */
    float scale = (float)(1 / (1 - p));
    int64_t kept = 0;
    double ratio = 0;
    for (int64_t i = 0; i < n; i++) {
        float want = x[i] * scale;
        if (r0[0][i] != 0 && r0[0][i] != want) fail_msg("y1[%lld] = %.9g, neither 0 nor x * scale = %.9g", (long long)i, r0[0][i], want);
        if (r0[2][i] != r0[0][i]) fail_msg("grad:w[%lld] = %.9g where y1 is %.9g", (long long)i, r0[2][i], r0[0][i]);
        kept += r0[0][i] != 0;
        ratio += r0[0][i] / x[i];
    }
    /* binomial: the kept fraction and the mean of y/x within 5 sigma */
    double sigma = sqrt(p * (1 - p) / (double)n), frac = (double)kept / (double)n, mean = ratio / (double)n;
    print_message("p = %.2f over %lld elements: kept %.5f (sigma %.1e), mean of y/x %.5f\n", p, (long long)n, frac, sigma, mean);
    assert_true(fabs(frac - (1 - p)) < 5 * sigma);
    assert_true(fabs(mean - 1) < 5 * sigma / (1 - p));
    /* another node, another step: other masks (about 2p(1-p) of the elements differ) */
    int64_t nodes = count_differing_masks(r0[0], r0[1], n), steps = count_differing_masks(r0[0], r1[0], n);
    print_message("masks differ: across nodes in %lld elements, across steps in %lld\n", (long long)nodes, (long long)steps);
    assert_true(nodes > n / 10 && steps > n / 10);
    alloy_step_info s;
    expect_ok(g, alloy_graph_step_info(g, &s), "step_info");
    assert_int_equal(s.step, 2);
    /* the same seed and step in a new graph: the same bits; another seed: another mask */
    alloy_graph *same = dropout_graph(7, n, p, true, false), *other = dropout_graph(8, n, p, true, false);
    float *s0[1], *o0[1];
    run(same, x, c, n, names, s0, 1);
    run(other, x, c, n, names, o0, 1);
    assert_memory_equal(s0[0], r0[0], sizeof(float) * (size_t)n);
    assert_true(count_differing_masks(o0[0], r0[0], n) > n / 10);
    for (int i = 0; i < 3; i++) free(r0[i]);
    free(r1[0]), free(s0[0]), free(o0[0]), free(x), free(c);
    alloy_graph_free(g), alloy_graph_free(same), alloy_graph_free(other);
}

/* A skipped step (an inf in the loss) advances neither optim.step nor the
 * mask: the run after it draws the skipped run's mask, so the k-th applied
 * update uses the mask it uses without the skip. */
static void test_a_skipped_step_does_not_change_the_mask_of_the_next_applied_step(void **state)
{
    (void)state;
    const int64_t n = 4096;
    float *x = positive_values(n, 2), *c = malloc(sizeof(float) * n), *bad = malloc(sizeof(float) * n);
    assert_non_null(c), assert_non_null(bad);
    for (int64_t i = 0; i < n; i++) c[i] = bad[i] = 1;
    bad[5] = INFINITY;
    static const char *const names[] = {"y1"};
    alloy_graph *a = dropout_graph(3, n, 0.5, true, true), *b = dropout_graph(3, n, 0.5, true, true);
    float *ya[3], *yb[4];
    for (int k = 0; k < 3; k++) run(a, x, c, n, names, &ya[k], 1);
    for (int k = 0; k < 4; k++) {
        run(b, x, k == 1 ? bad : c, n, names, &yb[k], 1);
        alloy_step_info s;
        expect_ok(b, alloy_graph_step_info(b, &s), "step_info");
        assert_int_equal(s.skipped, k == 1);
        assert_int_equal(s.step, k == 0 ? 1 : k);
    }
    assert_memory_equal(yb[0], ya[0], sizeof(float) * n);
    assert_memory_equal(yb[1], ya[1], sizeof(float) * n); /* the skipped run drew update 1's mask */
    assert_memory_equal(yb[2], ya[1], sizeof(float) * n); /* and update 1 drew it again */
    assert_memory_equal(yb[3], ya[2], sizeof(float) * n);
    assert_true(count_differing_masks(ya[1], ya[2], n) > n / 10);
    for (int k = 0; k < 3; k++) free(ya[k]);
    for (int k = 0; k < 4; k++) free(yb[k]);
    free(x), free(c), free(bad);
    alloy_graph_free(a), alloy_graph_free(b);
}

/* With accumulation the k-th micro-batch of an update draws step n * K + k:
 * every micro-batch its own mask. */
static void test_each_micro_batch_of_an_accumulated_step_draws_its_own_mask(void **state)
{
    (void)state;
    const int64_t n = 4096;
    float *x = positive_values(n, 4), *c = malloc(sizeof(float) * n);
    assert_non_null(c);
    for (int64_t i = 0; i < n; i++) c[i] = 1;
    alloy_graph *g = dropout_graph(3, n, 0.5, true, false);
    alloy_optimizer o = alloy_sgd(0.0, 0.0, 0.0, false);
    o.accumulation_steps = 2;
    expect_ok(g, alloy_graph_add_optimizer(g, o), "optimizer");
    static const char *const names[] = {"y1"};
    float *y[4];
    for (int k = 0; k < 4; k++) run(g, x, c, n, names, &y[k], 1);
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++) assert_true(count_differing_masks(y[i], y[j], n) > n / 10);
    for (int k = 0; k < 4; k++) free(y[k]);
    free(x), free(c);
    alloy_graph_free(g);
}

static void test_p0_is_the_identity_and_p1_gives_zeros_while_training(void **state)
{
    (void)state;
    const int64_t n = 1000;
    float *x = positive_values(n, 5), *c = malloc(sizeof(float) * n);
    assert_non_null(c);
    for (int64_t i = 0; i < n; i++) c[i] = 1;
    static const char *const names[] = {"y1", "grad:w"};
    alloy_graph *g0 = dropout_graph(1, n, 0.0, true, false), *g1 = dropout_graph(1, n, 1.0, true, false);
    float *r0[2], *r1[2];
    run(g0, x, c, n, names, r0, 2);
    run(g1, x, c, n, names, r1, 2);
    assert_memory_equal(r0[0], x, sizeof(float) * n);
    assert_memory_equal(r0[1], x, sizeof(float) * n); /* dL/dw = c * x */
    for (int64_t i = 0; i < n; i++) assert_true(r1[0][i] == 0 && r1[1][i] == 0);
    for (int i = 0; i < 2; i++) free(r0[i]), free(r1[i]);
    free(x), free(c);
    alloy_graph_free(g0), alloy_graph_free(g1);
}

/* Eval mode: training off, or no loss at all: y is x, bit for bit. */
static void test_dropout_is_the_identity_when_the_graph_does_not_train(void **state)
{
    (void)state;
    const int64_t n = 1000;
    float *x = positive_values(n, 6), *c = malloc(sizeof(float) * n);
    assert_non_null(c);
    for (int64_t i = 0; i < n; i++) c[i] = 1;
    static const char *const names[] = {"y1"};
    alloy_graph *off = dropout_graph(1, n, 0.5, true, false), *forward = dropout_graph(1, n, 0.5, false, false);
    float *y[3];
    run(off, x, c, n, names, &y[0], 1);
    assert_true(count_differing_masks(y[0], x, n) > n / 4); /* training: dropped */
    expect_ok(off, alloy_graph_set_training(off, false), "training off");
    run(off, x, c, n, names, &y[1], 1);
    run(forward, x, c, n, names, &y[2], 1);
    assert_memory_equal(y[1], x, sizeof(float) * n);
    assert_memory_equal(y[2], x, sizeof(float) * n);
    for (int i = 0; i < 3; i++) free(y[i]);
    free(x), free(c);
    alloy_graph_free(off), alloy_graph_free(forward);
}

/* Moments of n draws against the distribution's, within 5 standard errors:
 * the mean, the variance (its error from the fourth moment m4), and for
 * the normal the fraction within one std (0.682689). */
static void check_moments(const char *what, const double *v, int64_t n, double mean, double var, double m4, bool normal,
                          double mean_, double std_)
{
    double s = 0, ss = 0, within = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    double m = s / (double)n;
    for (int64_t i = 0; i < n; i++) ss += (v[i] - m) * (v[i] - m), within += fabs(v[i] - mean_) < std_;
    double vr = ss / (double)(n - 1), f = within / (double)n;
    double se_mean = sqrt(var / (double)n), se_var = sqrt((m4 - var * var) / (double)n);
    print_message("%s: mean %.5f (want %.5f +- %.1e), variance %.5f (want %.5f +- %.1e)\n", what, m, mean, 5 * se_mean,
                  vr, var, 5 * se_var);
    assert_true(fabs(m - mean) < 5 * se_mean);
    assert_true(fabs(vr - var) < 5 * se_var);
    if (normal) assert_true(fabs(f - 0.682689492) < 5 * sqrt(0.682689492 * (1 - 0.682689492) / (double)n));
}

static void test_uniform_and_normal_have_their_distributions_moments(void **state)
{
    (void)state;
    static const alloy_dtype dts[] = {F32, F64, BF16};
    for (int d = 0; d < 3; d++) {
        alloy_graph *g = alloy_graph_new("draws");
        alloy_graph_set_seed(g, 99);
        expect_ok(g, alloy_output(g, "u", alloy_uniform(g, dts[d], 2, DIMS(BIG / 4, 4), -1, 3)), "u");
        expect_ok(g, alloy_output(g, "z", alloy_normal(g, dts[d], 1, DIMS(BIG), 2, 0.5)), "z");
        alloy_host_tensor f[2] = {{.name = "u"}, {.name = "z"}};
        expect_ok(g, alloy_graph_run(g, NULL, 0, f, 2), "run");
        double *u = malloc(sizeof(double) * BIG), *z = malloc(sizeof(double) * BIG);
        assert_non_null(u), assert_non_null(z);
        for (int64_t i = 0; i < BIG; i++) {
            u[i] = test_decode(dts[d], f[0].data, i), z[i] = test_decode(dts[d], f[1].data, i);
            if (!(u[i] >= -1 && u[i] <= 3)) fail_msg("uniform %s element %lld is %g", alloy_dtype_name(dts[d]), (long long)i, u[i]);
        }
        char what[64];
        /* U(-1, 3): variance 16/12, fourth central moment 4^4/80; N(2, 0.25): 3 * 0.25^2.
         * bf16 rounds each value by up to 2^-9 relative: its moments get a looser check below. */
        if (dts[d] != BF16) {
            snprintf(what, sizeof what, "uniform %s", alloy_dtype_name(dts[d]));
            check_moments(what, u, BIG, 1, 16.0 / 12, 256.0 / 80, false, 0, 0);
            snprintf(what, sizeof what, "normal %s", alloy_dtype_name(dts[d]));
            check_moments(what, z, BIG, 2, 0.25, 3 * 0.0625, true, 2, 0.5);
        } else {
            double su = 0, sz = 0;
            for (int64_t i = 0; i < BIG; i++) su += u[i], sz += z[i];
            assert_true(fabs(su / BIG - 1) < 0.01 && fabs(sz / BIG - 2) < 0.01);
        }
        free(u), free(z);
        alloy_graph_free(g);
    }
}

/* The seed is read at compile: set after a run it recompiles; the same seed
 * again gives the same draws. Two random nodes never draw alike. */
static void test_the_graph_seed_keys_every_draw_and_each_node_draws_its_own(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("seeded");
    alloy_graph_set_seed(g, 1);
    expect_ok(g, alloy_output(g, "a", alloy_uniform(g, F32, 1, DIMS(64), 0, 1)), "a");
    expect_ok(g, alloy_output(g, "b", alloy_uniform(g, F32, 1, DIMS(64), 0, 1)), "b");
    float v[3][2][64];
    for (int r = 0; r < 3; r++) {
        alloy_graph_set_seed(g, r == 1 ? 2 : 1);
        alloy_host_tensor f[2] = {{.name = "a"}, {.name = "b"}};
        expect_ok(g, alloy_graph_run(g, NULL, 0, f, 2), "run");
        memcpy(v[r][0], f[0].data, sizeof v[r][0]);
        memcpy(v[r][1], f[1].data, sizeof v[r][1]);
    }
    assert_memory_equal(v[0], v[2], sizeof v[0]);
    assert_memory_not_equal(v[0][0], v[1][0], sizeof v[0][0]);
    assert_memory_not_equal(v[0][0], v[0][1], sizeof v[0][0]);
    alloy_graph_free(g);
}

/* Under AMP a uniform between two matmuls (an add that becomes f16 reads
 * it) keeps its declared f32, as torch.rand does under autocast, even
 * with the training step as its operand; dropout there runs in f16. */
static void test_random_draws_keep_their_dtype_under_amp_and_dropout_follows_its_input(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("amp");
    alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(8, 8));
    alloy_tensor *w1 = alloy_param(g, "w1", F32, 2, DIMS(8, 8), alloy_init_normal(0.1));
    alloy_tensor *w2 = alloy_param(g, "w2", F32, 2, DIMS(8, 8), alloy_init_normal(0.1));
    alloy_tensor *h = alloy_add(g, alloy_matmul(g, x, w1, false, false), alloy_set_name(g, alloy_uniform(g, F32, 2, DIMS(8, 8), 0, 1), "noise"));
    h = alloy_set_name(g, alloy_dropout(g, h, 0.25), "dropped");
    expect_ok(g, alloy_graph_set_loss(g, alloy_reduce_mean(g, alloy_matmul(g, h, w2, false, false), 0, NULL, false)), "loss");
    expect_ok(g, alloy_graph_enable_amp(g, F16), "amp");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0, 0, false)), "optimizer");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    expect_ok(g, alloy_graph_dump(g, f, ALLOY_DUMP_IR), "dump");
    fclose(f);
    const char *noise = strstr(text, "%noise = uniform("), *dropped = strstr(text, "%dropped = dropout(");
    assert_non_null(noise), assert_non_null(dropped);
    if (strncmp(strchr(noise, ':'), ": f32[8,8]", 10)) fail_msg("%.120s", noise);
    if (strncmp(strchr(strchr(dropped, '}'), ':'), ": f16[8,8]", 10)) fail_msg("%.120s", dropped);
    free(text);
    alloy_graph_free(g);
}

/* The IR text: attributes round-trip; a bad p or step names itself; the
 * random pass cannot be disabled while the graph has random ops. */
static void test_random_ops_in_ir_text_and_their_errors(void **state)
{
    (void)state;
    static const char text[] = "graph t {\n"
                               "  %x = input : f32[4]\n"
                               "  %y = dropout(%x) {p=0.25, stream=4} : f32[4]\n"
                               "  %u = uniform() {low=-1, high=1, seed=5, stream=9} : f16[2,3]\n"
                               "  output \"y\" = %y\n"
                               "  output \"u\" = %u\n"
                               "}\n";
    char err[512];
    alloy_graph *g = alloy_graph_parse(text, strlen(text), "t.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    char *printed = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&printed, &len);
    assert_non_null(f);
    alloy_graph_dump(g, f, ALLOY_DUMP_SOURCE);
    fclose(f);
    assert_non_null(strstr(printed, "dropout(%x) {p=0.25, stream=4}"));
    assert_non_null(strstr(printed, "uniform {low=-1.0, high=1.0, seed=5, stream=9} : f16[2,3]"));
    free(printed);
    expect_ok(g, alloy_graph_set_option(g, "disable_passes", "random"), "set_option");
    assert_int_not_equal(alloy_graph_run(g, NULL, 0, NULL, 0), ALLOY_OK);
    assert_non_null(strstr(alloy_last_error(g), "disable_passes=random"));
    alloy_graph_free(g);
    static const struct {
        const char *line, *says;
    } bad[] = {
        {"%y = dropout(%x) {p=1.5, stream=0} : f32[4]", "p is 1.5"},
        {"%y = dropout(%x) {p=0.5} : f32[4]", "stream"},
        {"%y = dropout(%x, %x) {stream=0} : f32[4]", "i32 or i64 scalar"},
        {"%y = uniform() {low=2, high=1, stream=0} : f32[4]", "low <= high"},
        {"%y = normal() {std=-1, stream=0} : f32[4]", "std >= 0"},
        {"%y = normal() {stream=0} : i32[4]", "floating point"},
        {"%y = uniform() {stream=4294967296} : f32[4]", "stream 4294967296"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char src[256];
        snprintf(src, sizeof src, "graph t {\n  %%x = input : f32[4]\n  %s\n  output \"y\" = %%y\n}\n", bad[i].line);
        alloy_graph *b = alloy_graph_parse(src, strlen(src), "bad.ir", err, sizeof err);
        if (b) fail_msg("%s parsed", bad[i].line);
        if (!strstr(err, bad[i].says) || !strstr(err, "bad.ir:3:")) fail_msg("%s: %s (want \"%s\")", bad[i].line, err, bad[i].says);
    }
    /* the builder: a bad p is the graph's error, poisoning what follows */
    alloy_graph *h = alloy_graph_new("b");
    alloy_tensor *x = alloy_input(h, "x", F32, 1, DIMS(4));
    assert_null(alloy_dropout(h, x, -0.5));
    assert_int_equal(alloy_graph_status(h), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(h), "p is -0.5"));
    alloy_graph_free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_4x32_10_gives_the_random123_known_answers),
        cmocka_unit_test(test_dropout_keeps_1_minus_p_scales_by_1_over_1_minus_p_and_its_gradient_redraws_the_mask),
        cmocka_unit_test(test_a_skipped_step_does_not_change_the_mask_of_the_next_applied_step),
        cmocka_unit_test(test_each_micro_batch_of_an_accumulated_step_draws_its_own_mask),
        cmocka_unit_test(test_p0_is_the_identity_and_p1_gives_zeros_while_training),
        cmocka_unit_test(test_dropout_is_the_identity_when_the_graph_does_not_train),
        cmocka_unit_test(test_uniform_and_normal_have_their_distributions_moments),
        cmocka_unit_test(test_the_graph_seed_keys_every_draw_and_each_node_draws_its_own),
        cmocka_unit_test(test_random_ops_in_ir_text_and_their_errors),
        cmocka_unit_test(test_random_draws_keep_their_dtype_under_amp_and_dropout_follows_its_input),
    };
    return cmocka_run_group_tests_name("random", tests, NULL, NULL);
}
