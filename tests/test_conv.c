/* test_conv.c - the convolutions and pools of alloy/conv.h through the builder: PyTorch's values and gradients (tests/data/conv.safetensors), low precision under f16/bf16 AMP (conv allow, the pool after it following), a small CNN's training step, bad shapes and attributes as errors naming the op, and the kaiming/xavier fans of a convolution's weight. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp_support.h"
#include "support.h"

#ifndef DIMS
#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#endif

enum { MAXV = 2048 };

/* The case of conv.safetensors, as the script writes it. */
typedef enum op_kind { CONV2D, DEPTHWISE, CONV1D, MAX_POOL, AVG_POOL, AVG_POOL_NOPAD, ADAPTIVE } op_kind;
static const char *const case_names[] = {"conv2d", "depthwise", "conv1d", "max_pool2d", "avg_pool2d", "avg_pool2d_nopad",
                                         "adaptive_avg_pool2d"};

/* The op of case k (the script's parameters) over x, w, b (NULL where the case has none). */
static alloy_tensor *build(alloy_graph *g, op_kind k, alloy_tensor *x, alloy_tensor *w, alloy_tensor *b)
{
    switch (k) {
    case CONV2D: return alloy_conv2d(g, x, w, b, DIMS(2, 1), DIMS(1, 0), DIMS(1, 2), 2);
    case DEPTHWISE: return alloy_conv2d(g, x, w, NULL, DIMS(2, 2), DIMS(1, 1), NULL, 3);
    case CONV1D: return alloy_conv1d(g, x, w, b, 2, 1, 2, 1);
    case MAX_POOL: return alloy_max_pool2d(g, x, DIMS(3, 2), DIMS(2, 1), DIMS(1, 1));
    case AVG_POOL: return alloy_avg_pool2d(g, x, DIMS(3, 3), DIMS(2, 2), DIMS(1, 1), true);
    case AVG_POOL_NOPAD: return alloy_avg_pool2d(g, x, DIMS(3, 3), DIMS(2, 2), DIMS(1, 1), false);
    case ADAPTIVE: return alloy_adaptive_avg_pool2d(g, x, DIMS(3, 4));
    }
    return NULL;
}

static const alloy_host_tensor *find(const alloy_safetensors *st, const char *name, const char *what)
{
    char key[64];
    snprintf(key, sizeof key, "%s.%s", name, what);
    return alloy_safetensors_find(st, key);
}

static int64_t count_of(const alloy_host_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= t->dims[d];
    return n;
}

/* The largest |got - ref| over max(1, max |ref|): got of dtype dt (n values), ref f64. */
static double error_of(alloy_dtype dt, const void *got, const alloy_host_tensor *ref)
{
    double err = 0, scale = 1;
    int64_t n = count_of(ref);
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(test_decode(ref->dtype, ref->data, i)));
    for (int64_t i = 0; i < n; i++)
        err = fmax(err, fabs(test_decode(dt, got, i) - test_decode(ref->dtype, ref->data, i)));
    return isnan(err) ? INFINITY : err / scale;
}

/* Runs case k of st: y = op(x, w, b), loss = sum(y * r), under AMP dtype
 * amp (ALLOY_F32: none); checks y and the gradient of every input against
 * PyTorch's within bound. */
static void check_case(const alloy_safetensors *st, op_kind k, alloy_dtype amp, double bound)
{
    const char *name = case_names[k];
    static const char *const ins[3] = {"x", "w", "b"};
    alloy_graph *g = new_graph(name);
    alloy_tensor *t[3] = {NULL, NULL, NULL};
    alloy_host_tensor feeds[4];
    int nf = 0;
    for (int j = 0; j < 3; j++) {
        const alloy_host_tensor *v = find(st, name, ins[j]);
        if (!v) continue;
        t[j] = alloy_input(g, ins[j], ALLOY_F32, v->rank, v->dims);
        feeds[nf] = *v;
        feeds[nf++].name = ins[j];
    }
    const alloy_host_tensor *r = find(st, name, "r"), *y_want = find(st, name, "y");
    assert_non_null(t[0]);
    assert_non_null(r);
    alloy_tensor *y = build(g, k, t[0], t[1], t[2]);
    alloy_tensor *loss = alloy_reduce_sum(g, alloy_mul(g, y, alloy_input(g, "r", ALLOY_F32, r->rank, r->dims)), 0, NULL, false);
    feeds[nf] = *r;
    feeds[nf++].name = "r";
    expect_ok(g, alloy_output(g, "y", y), "output");
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    alloy_host_tensor fetch[4] = {{.name = "y"}};
    static const char *const grads[3] = {"grad:x", "grad:w", "grad:b"};
    int nfetch = 1;
    for (int j = 0; j < 3; j++)
        if (t[j]) {
            expect_ok(g, alloy_graph_request_grad(g, t[j]), "request_grad");
            fetch[nfetch++].name = grads[j];
        }
    if (amp != ALLOY_F32) alloy_graph_enable_amp(g, amp);
    expect_ok(g, alloy_graph_run(g, feeds, nf, fetch, nfetch), "run");
    char what[96];
    snprintf(what, sizeof what, "%s (%s)", name, alloy_dtype_name(amp));
    double e = error_of(fetch[0].dtype, fetch[0].data, y_want);
    if (getenv("CONV_VERBOSE")) printf("%s: y error %.2e\n", what, e);
    if (!(e <= bound)) fail_msg("%s: y differs from PyTorch's by %.2e > %.0e", what, e, bound);
    for (int j = 0, f = 1; j < 3; j++) {
        if (!t[j]) continue;
        char d[8];
        snprintf(d, sizeof d, "d%s", ins[j]);
        e = error_of(fetch[f].dtype, fetch[f].data, find(st, name, d));
        if (getenv("CONV_VERBOSE")) printf("%s: %s error %.2e\n", what, d, e);
        if (!(e <= bound)) fail_msg("%s: %s differs from PyTorch's by %.2e > %.0e", what, d, e, bound);
        f++;
    }
    free_graph(g);
}

static alloy_safetensors *reference(void)
{
    alloy_safetensors *st;
    char err[256];
    if (alloy_safetensors_load(ALLOY_TEST_DATA "/conv.safetensors", &st, err, sizeof err)) fail_msg("%s", err);
    return st;
}

/* f32 against PyTorch's f64 values (of the same f32 inputs) within 1e-5. */
static void test_ops_and_gradients_match_pytorch(void **state)
{
    (void)state;
    alloy_safetensors *st = reference();
    for (int k = CONV2D; k <= ADAPTIVE; k++) check_case(st, (op_kind)k, ALLOY_F32, 1e-5);
    alloy_safetensors_free(st);
}

/* Under f16 and bf16 AMP the convolutions run in low precision (one
 * rounding of each input and of the f32 sum): within a few ulp of the
 * dtype, relative to the largest value. */
static void test_amp_results_stay_within_the_low_precision_rounding(void **state)
{
    (void)state;
    alloy_safetensors *st = reference();
    for (int k = CONV2D; k <= ADAPTIVE; k++) {
        check_case(st, (op_kind)k, ALLOY_F16, 4e-3);
        check_case(st, (op_kind)k, ALLOY_BF16, 3e-2);
    }
    alloy_safetensors_free(st);
}

/* x -> conv2d(w, b) -> max_pool2d -> avg_pool2d -> adaptive_avg_pool2d:
 * under AMP the conv is allow (low precision, its operands cast) and the
 * pools after it follow it (clear ops between low-precision ones: low
 * precision, no cast between). */
static void test_conv_is_low_precision_and_pools_follow_it_under_amp(void **state)
{
    (void)state;
    static const alloy_dtype low[] = {ALLOY_F16, ALLOY_BF16};
    static const char *const names[] = {"c", "mp", "ap", "aa"};
    for (int d = 0; d < 2; d++) {
        alloy_graph *g = new_graph("amp_conv");
        alloy_tensor *x = in_f32(g, "x", 4, DIMS(2, 3, 12, 12));
        alloy_tensor *w = param_f32(g, "w", 4, DIMS(8, 3, 3, 3));
        alloy_tensor *b = param_f32(g, "b", 1, DIMS(8));
        alloy_tensor *c = named(g, alloy_conv2d(g, x, w, b, NULL, DIMS(1, 1), NULL, 1), "c");
        alloy_tensor *mp = named(g, alloy_max_pool2d(g, c, DIMS(2, 2), NULL, NULL), "mp");
        alloy_tensor *ap = named(g, alloy_avg_pool2d(g, mp, DIMS(2, 2), NULL, NULL, true), "ap");
        output(g, "y", named(g, alloy_adaptive_avg_pool2d(g, ap, DIMS(1, 1)), "aa"));
        alloy_graph_enable_amp(g, low[d]);
        const ir_graph *cg = compile_amp(g, NULL);
        for (int k = 0; k < 4; k++) {
            int id = resolve(cg, names[k]);
            if (id < 0) fail_in(cg, "no node %s", names[k]);
            const ir_node *n = cg->nodes[id];
            if (n->type.dtype != low[d] || (k == 0 && n->amp != AMP_ALLOW))
                fail_in(cg, "%s in %s AMP: %s, coloured %s", names[k], alloy_dtype_name(low[d]), alloy_dtype_name(n->type.dtype),
                        amp_str(n->amp));
            for (int j = 0; j < n->nin; j++) /* every operand low precision: the conv's inserted casts, the pools' producers */
                if (cg->nodes[n->in[j]]->type.dtype != low[d] || (k && is_inserted_cast(cg->nodes[n->in[j]])))
                    fail_in(cg, "%s in %s AMP: operand %d is %s%s", names[k], alloy_dtype_name(low[d]), j,
                            alloy_dtype_name(cg->nodes[n->in[j]]->type.dtype),
                            is_inserted_cast(cg->nodes[n->in[j]]) ? " (a cast)" : "");
        }
        free_graph(g);
    }
}

/* A small CNN (conv, relu, max pool, conv, adaptive average pool, linear,
 * cross entropy) trains with SGD: its loss falls over 30 steps on a fixed
 * batch, in f32 and under f16 AMP with the dynamic scaler. */
static void test_a_small_cnn_trains(void **state)
{
    (void)state;
    for (int amp = 0; amp < 2; amp++) {
        alloy_graph *g = new_graph("cnn");
        alloy_tensor *x = in_f32(g, "x", 4, DIMS(8, 1, 8, 8));
        alloy_tensor *t = alloy_input(g, "t", ALLOY_I64, 1, DIMS(8));
        alloy_tensor *w1 = alloy_param(g, "w1", ALLOY_F32, 4, DIMS(6, 1, 3, 3), alloy_init_normal(0.3));
        alloy_tensor *b1 = alloy_param(g, "b1", ALLOY_F32, 1, DIMS(6), alloy_init_zeros());
        alloy_tensor *w2 = alloy_param(g, "w2", ALLOY_F32, 4, DIMS(8, 3, 3, 3), alloy_init_normal(0.3));
        alloy_tensor *fc = alloy_param(g, "fc", ALLOY_F32, 2, DIMS(8, 4), alloy_init_normal(0.3));
        alloy_tensor *h = alloy_relu(g, alloy_conv2d(g, x, w1, b1, NULL, DIMS(1, 1), NULL, 1));
        h = alloy_max_pool2d(g, h, DIMS(2, 2), NULL, NULL);
        h = alloy_relu(g, alloy_conv2d(g, h, w2, NULL, DIMS(2, 2), DIMS(1, 1), NULL, 2));
        h = alloy_reshape(g, alloy_adaptive_avg_pool2d(g, h, DIMS(1, 1)), 2, DIMS(8, 8));
        alloy_tensor *loss = alloy_cross_entropy_loss(g, alloy_matmul(g, h, fc, false, false), t, NULL, ALLOY_NO_IGNORE_INDEX,
                                                      0, ALLOY_REDUCTION_MEAN);
        expect_ok(g, alloy_output(g, "loss", loss), "output");
        expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
        expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0.9, 0, false)), "optimizer");
        if (amp) alloy_graph_enable_amp(g, ALLOY_F16);
        float xs[8 * 64];
        int64_t ts[8];
        for (int i = 0; i < 8; i++) { /* class i % 4: a bright quadrant */
            ts[i] = i % 4;
            for (int p = 0; p < 64; p++)
                xs[i * 64 + p] = (float)(((p / 8 < 4) == (ts[i] < 2) && (p % 8 < 4) == (ts[i] % 2 == 0)) + 0.1 * ((i * 7 + p * 3) % 5));
        }
        alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 4, {8, 1, 8, 8}, xs}, {"t", ALLOY_I64, 1, {8}, ts}};
        double first = 0, last = 0;
        for (int step = 0; step < 30; step++) {
            alloy_host_tensor fetch = {.name = "loss"};
            expect_ok(g, alloy_graph_run(g, feeds, 2, &fetch, 1), "run");
            last = test_decode(fetch.dtype, fetch.data, 0);
            if (step == 0) first = last;
        }
        if (getenv("CONV_VERBOSE")) printf("cnn %s: loss %.4f -> %.4f\n", amp ? "f16 AMP" : "f32", first, last);
        if (!(last < 0.5 * first)) fail_msg("cnn %s: loss %.4f -> %.4f did not halve", amp ? "f16 AMP" : "f32", first, last);
        free_graph(g);
    }
}

/* The error g records for a bad call: it names the op and says what is wrong. */
static void expect_error(alloy_graph *g, alloy_tensor *t, const char *op, const char *why)
{
    if (t) fail_msg("%s: built, expected an error saying '%s'", op, why);
    const char *e = alloy_last_error(g);
    if (!strstr(e, op) || !strstr(e, why)) fail_msg("error '%s' does not name %s and say '%s'", e, op, why);
}

static void test_bad_shapes_and_attributes_are_errors_naming_the_op(void **state)
{
    (void)state;
    static const struct {
        int what;
        const char *op, *why;
    } cases[] = {
        {0, "conv2d", "groups 2 must divide the input channels 3"},
        {1, "conv2d", "the weight's dim 1 must be in_channels / groups = 3, not 2"},
        {2, "conv2d", "does not fit the padded input 4x4"},
        {3, "conv2d", "the bias must be [5]"},
        {4, "conv1d", "the input must have rank 3"},
        {5, "conv2d", "stride[1] is 0"},
        {6, "conv2d", "dtypes differ"},
        {7, "max_pool2d", "padding [2,0] must be at most half the kernel [3,3]"},
        {8, "max_pool2d", "kernel is NULL"},
        {9, "adaptive_avg_pool2d", "output_size[0] is 0"},
        {10, "avg_pool2d", "the input must have rank 4"},
        {11, "conv2d", "groups must be >= 1, not 0"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        alloy_graph *g = new_graph("bad");
        alloy_tensor *x = in_f32(g, "x", 4, DIMS(1, 3, 4, 4)), *x3 = in_f32(g, "x3", 3, DIMS(1, 3, 4));
        alloy_tensor *w = in_f32(g, "w", 4, DIMS(5, 3, 3, 3)), *b = in_f32(g, "b", 1, DIMS(4));
        alloy_tensor *r = NULL;
        switch (cases[k].what) {
        case 0: r = alloy_conv2d(g, x, in_f32(g, "w2", 4, DIMS(4, 2, 3, 3)), NULL, NULL, NULL, NULL, 2); break;
        case 1: r = alloy_conv2d(g, x, in_f32(g, "w2", 4, DIMS(5, 2, 3, 3)), NULL, NULL, NULL, NULL, 1); break;
        case 2: r = alloy_conv2d(g, x, w, NULL, NULL, NULL, DIMS(2, 2), 1); break;
        case 3: r = alloy_conv2d(g, x, w, b, NULL, NULL, NULL, 1); break;
        case 4: r = alloy_conv1d(g, x, w, NULL, 1, 0, 1, 1); break;
        case 5: r = alloy_conv2d(g, x, w, NULL, DIMS(1, 0), NULL, NULL, 1); break;
        case 6: r = alloy_conv2d(g, x, alloy_input(g, "wh", ALLOY_F16, 4, DIMS(5, 3, 3, 3)), NULL, NULL, NULL, NULL, 1); break;
        case 7: r = alloy_max_pool2d(g, x, DIMS(3, 3), NULL, DIMS(2, 0)); break;
        case 8: r = alloy_max_pool2d(g, x, NULL, NULL, NULL); break;
        case 9: r = alloy_adaptive_avg_pool2d(g, x, DIMS(0, 2)); break;
        case 10: r = alloy_avg_pool2d(g, x3, DIMS(2, 2), NULL, NULL, true); break;
        case 11: r = alloy_conv2d(g, x, w, NULL, NULL, NULL, NULL, 0); break;
        }
        expect_error(g, r, cases[k].op, cases[k].why);
        free_graph(g);
    }
}

/* ---- the fans of a convolution's weight ---- */

/* Max |v| and the standard deviation (about 0) of state `name` of g. */
static void weight_stats(alloy_graph *g, const char *name, double *max_abs, double *std)
{
    alloy_host_tensor t;
    expect_ok(g, alloy_graph_get_state(g, name, &t), name);
    int64_t n = count_of(&t);
    double m = 0, ss = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = test_decode(t.dtype, t.data, i);
        m = fmax(m, fabs(v)), ss += v * v;
    }
    *max_abs = m, *std = sqrt(ss / (double)n);
}

/* kaiming/xavier take a convolution weight's fans as PyTorch does
 * (fan_in = in / groups * kernel taps, fan_out = out * taps), a linear
 * weight's from its [in, out] layout, with AMP on (the conv then reads a
 * cast of the param) or off. Hand-computed:
 *   conv2d w [16, 3, 3, 5], 6 input channels in 2 groups, kaiming_uniform(sqrt 2):
 *     fan_in 3 * 15 = 45, bound sqrt(2) sqrt(3 / 45) = 0.36515 (by the last two
 *     dims it would be 1.0);
 *   conv1d w [64, 32, 5], xavier_normal(1): fan_in 160, fan_out 320,
 *     std sqrt(2 / 480) = 0.064550 (by the last two dims 0.23250);
 *   linear fc [20, 30], kaiming_normal(1): std 1 / sqrt(20) = 0.22361. */
static void test_kaiming_and_xavier_take_a_conv_weights_fans_from_its_kernel(void **state)
{
    (void)state;
    for (int amp = 0; amp < 2; amp++) {
        alloy_graph *g = new_graph("fans");
        alloy_tensor *x = in_f32(g, "x", 4, DIMS(2, 6, 9, 9));
        alloy_tensor *w = alloy_param(g, "w2d", ALLOY_F32, 4, DIMS(16, 3, 3, 5), alloy_init_kaiming_uniform(sqrt(2.0)));
        alloy_tensor *y = alloy_conv2d(g, x, w, NULL, NULL, NULL, NULL, 2); /* [2, 16, 7, 5] */
        alloy_tensor *x1 = in_f32(g, "x1", 3, DIMS(2, 32, 12));
        alloy_tensor *w1 = alloy_param(g, "w1d", ALLOY_F32, 3, DIMS(64, 32, 5), alloy_init_xavier_normal(1.0));
        alloy_tensor *y1 = alloy_conv1d(g, x1, w1, NULL, 1, 0, 1, 1); /* [2, 64, 8] */
        alloy_tensor *x2 = in_f32(g, "x2", 2, DIMS(4, 20));
        alloy_tensor *fc = alloy_param(g, "fc", ALLOY_F32, 2, DIMS(20, 30), alloy_init_kaiming_normal(1.0));
        alloy_tensor *loss = alloy_add(g, alloy_add(g, alloy_reduce_sum(g, alloy_cast(g, y, ALLOY_F32), 0, NULL, false),
                                                     alloy_reduce_sum(g, alloy_cast(g, y1, ALLOY_F32), 0, NULL, false)),
                                       alloy_reduce_sum(g, alloy_cast(g, alloy_matmul(g, x2, fc, false, false), ALLOY_F32),
                                                        0, NULL, false));
        expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
        expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0, 0, false)), "optimizer");
        if (amp) expect_ok(g, alloy_graph_enable_amp(g, ALLOY_F16), "enable_amp");
        double m, sd;
        weight_stats(g, "w2d", &m, &sd);
        double bound = sqrt(2.0) * sqrt(3.0 / 45.0);
        printf("%s: conv2d kaiming_uniform max |w| %.5f (bound %.5f)", amp ? "f16 AMP" : "f32", m, bound);
        assert_true(m <= bound && m >= 0.98 * bound); /* 720 draws: the largest is within 2% of the bound */
        assert_true(fabs(sd - bound / sqrt(3.0)) <= 0.1 * bound / sqrt(3.0));
        weight_stats(g, "w1d", &m, &sd);
        printf("; conv1d xavier_normal std %.5f (want %.5f)", sd, sqrt(2.0 / 480.0));
        assert_true(fabs(sd - sqrt(2.0 / 480.0)) <= 0.03 * sqrt(2.0 / 480.0)); /* 10240 draws: ~0.7% */
        weight_stats(g, "fc", &m, &sd);
        printf("; linear kaiming_normal std %.5f (want %.5f)\n", sd, 1 / sqrt(20.0));
        assert_true(fabs(sd - 1 / sqrt(20.0)) <= 0.1 / sqrt(20.0)); /* 600 draws: ~3% */
        free_graph(g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        AMP_TEST(test_ops_and_gradients_match_pytorch),
        AMP_TEST(test_amp_results_stay_within_the_low_precision_rounding),
        AMP_TEST(test_conv_is_low_precision_and_pools_follow_it_under_amp),
        AMP_TEST(test_a_small_cnn_trains),
        AMP_TEST(test_bad_shapes_and_attributes_are_errors_naming_the_op),
        AMP_TEST(test_kaiming_and_xavier_take_a_conv_weights_fans_from_its_kernel),
    };
    return cmocka_run_group_tests_name("conv", tests, NULL, NULL);
}
