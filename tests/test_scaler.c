/* test_scaler.c - loss scaling: the dynamic scale's trajectory against a reference model of PyTorch's _amp_update_scale_, the f32 finiteness guard, min_scale, the static scaler, skipped steps that change nothing, unscaled gradients, f16/bf16 AMP with a scaler, bad parameters. */
#include <float.h>
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
#include "models.h"
#include "support.h"


/* The smallest double that rounds to +inf in f32 (round to nearest even):
 * FLT_MAX plus half an ulp of FLT_MAX (2^103). A scaled gradient g (exact
 * in double: an f32 scale times an f32 value) overflows iff |g| >= this. */
#define F32_OVERFLOW 0x1.ffffffp+127
/* The same for f16: 65504 + 16 rounds to inf. */
#define F16_OVERFLOW 65520.0

/* ---- helpers ---- */


static void run(alloy_graph *g, alloy_host_tensor *feeds, int nfeeds, alloy_host_tensor *fetches,
                int nfetches)
{
    expect_ok(g, alloy_graph_run(g, feeds, nfeeds, fetches, nfetches), "alloy_graph_run");
}

/* A rank-0 state tensor as a double (f32, i32 or f64). */
static double state_scalar(alloy_graph *g, const char *name)
{
    alloy_host_tensor t;
    expect_ok(g, alloy_graph_get_state(g, name, &t), name);
    assert_int_equal(t.rank, 0);
    switch (t.dtype) {
    case ALLOY_F32: return *(const float *)t.data;
    case ALLOY_F64: return *(const double *)t.data;
    case ALLOY_I32: return *(const int32_t *)t.data;
    default: fail_msg("state '%s' has unexpected dtype %s", name, alloy_dtype_name(t.dtype));
    }
    return 0;
}

static double fetched_scalar(const alloy_host_tensor *t)
{
    assert_int_equal(t->rank, 0);
    switch (t->dtype) {
    case ALLOY_F32: return *(const float *)t->data;
    case ALLOY_F64: return *(const double *)t->data;
    case ALLOY_I32: return *(const int32_t *)t->data;
    case ALLOY_BOOL: return *(const uint8_t *)t->data;
    default: fail_msg("fetch '%s' has unexpected dtype %s", t->name, alloy_dtype_name(t->dtype));
    }
    return 0;
}

/* The scaler's own state changes on every step, skipped or not. */
static bool is_scaler_state(const char *name)
{
    return strncmp(name, "scaler.", 7) == 0 || strcmp(name, "step.skipped_steps") == 0;
}

/* Whether every state tensor of g other than the scaler's is bit-for-bit
 * as in s: how many were compared, or -1 (each changed one reported). */
static int expect_unchanged_but_scaler(alloy_graph *g, const snapshot *s, const char *when)
{
    int compared = 0;
    bool changed = false;
    for (int i = 0; i < s->n; i++) {
        if (is_scaler_state(s->names[i])) continue;
        alloy_host_tensor t;
        expect_ok(g, alloy_graph_get_state(g, s->names[i], &t), s->names[i]);
        if (memcmp(t.data, s->data[i], s->bytes[i]) != 0) {
            print_error("%s: state '%s' changed on a skipped step\n", when, s->names[i]);
            changed = true;
        }
        compared++;
    }
    return changed ? -1 : compared;
}

/* Distance in ulps between two finite f32 values of the same sign. */
static int64_t ulp_diff(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = INT32_MIN - ia;
    if (ib < 0) ib = INT32_MIN - ib;
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

/* ---- the reference: PyTorch's GradScaler, written from its rules ----
 *
 * _amp_update_scale_ (aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp,
 * the CUDA kernel alike): the scale is an f32 tensor, the factors are
 * doubles, each product is computed in double and stored to f32 once.
 *   found_inf: scale = scale * backoff; tracker = 0
 *   else:      successful = tracker + 1
 *              if successful == growth_interval:
 *                  new = f32(scale * growth); if isfinite(new): scale = new
 *                  tracker = 0
 *              else tracker = successful
 * alloy's extension: after a backoff, scale = max(scale, min_scale) when
 * min_scale > 0. A static scaler never changes its scale. Every step with
 * found_inf is skipped and counted. */
typedef struct ref_scaler {
    bool dynamic;
    float scale;
    double growth, backoff, min_scale;
    int interval;
    int tracker;
    int skipped, applied;
    int grown, backed_off, held_at_f32_max; /* what the trajectory went through */
} ref_scaler;

static ref_scaler ref_from(alloy_grad_scaler sc)
{
    return (ref_scaler){.dynamic = sc.kind == ALLOY_SCALER_DYNAMIC,
                        .scale = (float)sc.init_scale,
                        .growth = sc.growth_factor,
                        .backoff = sc.backoff_factor,
                        .min_scale = sc.min_scale,
                        .interval = sc.growth_interval};
}

static void ref_update(ref_scaler *r, bool found_inf)
{
    if (found_inf) r->skipped++;
    else r->applied++;
    if (!r->dynamic) return;
    if (found_inf) {
        double s = (double)r->scale * r->backoff;
        if (r->min_scale > 0 && s < r->min_scale) s = r->min_scale;
        r->scale = (float)s;
        r->tracker = 0;
        r->backed_off++;
    } else if (r->tracker + 1 == r->interval) {
        double s = (double)r->scale * r->growth;
        if (s < F32_OVERFLOW) {
            r->scale = s > FLT_MAX ? FLT_MAX : (float)s;
            r->grown++;
        } else {
            r->held_at_f32_max++;
        }
        r->tracker = 0;
    } else {
        r->tracker++;
    }
}

/* found_inf of the linear graph below: its gradient is f32(scale * x[i]),
 * an exact double product rounded once to f32. */
static bool ref_found_inf_f32(const float *x, int n, float scale)
{
    for (int i = 0; i < n; i++) {
        double g = (double)scale * (double)x[i];
        if (isnan(g) || fabs(g) >= F32_OVERFLOW) return true;
    }
    return false;
}

/* ---- the graph: loss = reduce_sum(x * w), so d loss / d w = x whatever w ---- */

enum { N = 4 };

static alloy_graph *linear_graph(alloy_grad_scaler sc, const alloy_optimizer *opt)
{
    alloy_graph *g = alloy_graph_new("linear");
    assert_non_null(g);
    alloy_graph_set_seed(g, 7);
    alloy_tensor *x = alloy_input(g, "x", F32, 1, DIMS(N));
    alloy_tensor *w = alloy_param(g, "w", F32, 1, DIMS(N), alloy_init_uniform(-1, 1));
    alloy_tensor *loss = alloy_set_name(g, alloy_reduce_sum(g, alloy_mul(g, x, w), 0, NULL, false), "loss");
    expect_ok(g, alloy_output(g, "loss", loss), "alloy_output");
    expect_ok(g, alloy_graph_set_loss(g, loss), "alloy_graph_set_loss");
    if (sc.kind != ALLOY_SCALER_NONE) expect_ok(g, alloy_graph_set_grad_scaler(g, sc), "alloy_graph_set_grad_scaler");
    if (opt) expect_ok(g, alloy_graph_add_optimizer(g, *opt), "alloy_graph_add_optimizer");
    return g;
}

static alloy_grad_scaler dynamic(double init, double growth, double backoff, int interval, double min_scale)
{
    alloy_grad_scaler s = alloy_dynamic_scaler();
    s.init_scale = init, s.growth_factor = growth, s.backoff_factor = backoff;
    s.growth_interval = interval, s.min_scale = min_scale;
    return s;
}

/* x for one step: 'F' finite values in [-1, 1], 'H' huge (`huge` in every
 * element: finite, its scaled gradient may overflow), 'N' a NaN, 'I' an inf. */
static void step_input(char kind, float huge, float *x)
{
    for (int i = 0; i < N; i++) x[i] = (float)test_uniform(-1, 1);
    if (kind == 'H')
        for (int i = 0; i < N; i++) x[i] = i % 2 ? -huge : huge;
    else if (kind == 'N') x[1] = NAN;
    else if (kind == 'I') x[2] = -INFINITY;
    else assert_true(kind == 'F');
}

/* The first failure of a trajectory, reported after the graph is freed. */
#define TRAJ_FAIL(...)                                     \
    do {                                                   \
        snprintf(failed, sizeof failed, __VA_ARGS__);      \
        goto done;                                         \
    } while (0)

/* Runs one step per letter of `pattern` and checks, on every step, the scale
 * used, the next scale, found_inf, the growth tracker, the skipped count,
 * the optimizer step, step_info, the unscaled gradient (exactly
 * f32(f32(scale * x) * f32(1 / scale)), which is x itself for a power-of-two
 * scale and within max_grad_ulps of x otherwise) and that a skipped step left
 * everything but the scaler's state untouched. Returns the reference at
 * the end (what the trajectory went through). */
static ref_scaler check_trajectory(alloy_grad_scaler sc, const alloy_optimizer *opt, const char *pattern,
                                   float huge, int max_grad_ulps)
{
    alloy_graph *g = linear_graph(sc, opt);
    ref_scaler r = ref_from(sc);
    snapshot before = {0};
    char failed[512] = "";
    for (int step = 0; pattern[step]; step++) {
        float x[N];
        step_input(pattern[step], huge, x);
        bool found = ref_found_inf_f32(x, N, r.scale);
        float used = r.scale;
        before = take_snapshot(g);
        alloy_host_tensor feed = {"x", F32, 1, {N}, x};
        /* the scale used: the state before the run and step_info after it
         * (the fetched "scaler.scale" output has a test of its own) */
        alloy_host_tensor fetch[4] = {{.name = "step.apply"}, {.name = "scaler.next_scale"},
                                      {.name = "step.found_inf"}, {.name = "grad:w"}};
        char when[64];
        snprintf(when, sizeof when, "step %d ('%c', scale %g)", step, pattern[step], (double)used);
        if (state_scalar(g, "scaler.scale") != used)
            TRAJ_FAIL("%s: the scale before the step is %.9g, expected %.9g", when, state_scalar(g, "scaler.scale"),
                     (double)used);
        run(g, &feed, 1, fetch, 4);
        ref_update(&r, found);
        if ((fetched_scalar(&fetch[0]) != 0) != !found)
            TRAJ_FAIL("%s: step.apply is %g, expected %d", when, fetched_scalar(&fetch[0]), !found);
        if ((fetched_scalar(&fetch[2]) != 0) != found)
            TRAJ_FAIL("%s: found_inf is %g, expected %d", when, fetched_scalar(&fetch[2]), found);
        if (fetched_scalar(&fetch[1]) != r.scale)
            TRAJ_FAIL("%s: next scale is %.9g, expected %.9g", when, fetched_scalar(&fetch[1]), (double)r.scale);
        if (state_scalar(g, "scaler.scale") != r.scale)
            TRAJ_FAIL("%s: state scaler.scale is %.9g, expected %.9g", when, state_scalar(g, "scaler.scale"),
                     (double)r.scale);
        if (r.dynamic && state_scalar(g, "scaler.growth_tracker") != r.tracker)
            TRAJ_FAIL("%s: growth tracker is %g, expected %d", when, state_scalar(g, "scaler.growth_tracker"),
                     r.tracker);
        if (state_scalar(g, "step.skipped_steps") != r.skipped)
            TRAJ_FAIL("%s: step.skipped_steps is %g, expected %d", when, state_scalar(g, "step.skipped_steps"),
                     r.skipped);
        alloy_step_info info;
        expect_ok(g, alloy_graph_step_info(g, &info), "alloy_graph_step_info");
        if (info.skipped != found || info.scale != used || info.next_scale != r.scale ||
            info.skipped_steps != r.skipped)
            TRAJ_FAIL("%s: step_info {skipped %d, scale %.9g, next_scale %.9g, skipped_steps %lld}, expected "
                     "{%d, %.9g, %.9g, %d}",
                     when, info.skipped, info.scale, info.next_scale, (long long)info.skipped_steps, found,
                     (double)used, (double)r.scale, r.skipped);
        if (opt) {
            if (state_scalar(g, "optim.step") != r.applied || info.step != r.applied || info.updated == found)
                TRAJ_FAIL("%s: optim.step %g, step_info.step %lld, updated %d; expected %d updates, updated %d",
                         when, state_scalar(g, "optim.step"), (long long)info.step, info.updated, r.applied,
                         !found);
            if (found && expect_unchanged_but_scaler(g, &before, when) < 3)
                TRAJ_FAIL("%s: a state tensor changed on a skipped step (or w, its moments, optim.step are missing)", when);
        }
        if (!found) { /* the fetched gradient is unscaled: f32(f32(scale * x) * f32(1 / scale)) */
            const float *gw = fetch[3].data;
            float inv = (float)(1.0 / used);
            for (int i = 0; i < N; i++) {
                float want = (float)((double)(float)((double)used * x[i]) * inv);
                if (gw[i] != want || ulp_diff(want, x[i]) > max_grad_ulps)
                    TRAJ_FAIL("%s: grad:w[%d] = %.9g, the unscaled gradient is %.9g (x %.9g)", when, i,
                             (double)gw[i], (double)want, (double)x[i]);
            }
        }
        free_snapshot(&before);
    }
done:
    free_snapshot(&before);
    alloy_graph_free(g);
    if (failed[0]) fail_msg("%s", failed);
    return r;
}

/* ---- tests ---- */

static void test_dynamic_scale_backs_off_on_overflow_and_nan_and_grows_after_each_interval_of_finite_steps(void **state)
{
    (void)state;
    /* init 1024, x2 every 3 finite steps, x0.25 on inf/NaN. 'H' feeds 1e36:
     * its scaled gradient overflows f32 at scale >= 512 (5.1e38) and fits
     * at 256 (2.6e38), so whether an 'H' step is skipped depends on the
     * scale the trajectory has reached. */
    alloy_optimizer adam = alloy_adam(0.01, 0.9, 0.999, 1e-8, 0);
    ref_scaler r = check_trajectory(dynamic(1024, 2, 0.25, 3, 0), &adam, "FFFHHHFFFNFFFFHFIFFFFF", 1e36f, 0);
    /* the pattern went through every branch of the rule */
    assert_true(r.grown >= 3);
    assert_true(r.backed_off >= 4);
    assert_true(r.applied >= 14);
}

static void test_sgd_momentum_trajectory_matches_the_reference_model_too(void **state)
{
    (void)state;
    alloy_optimizer sgd = alloy_sgd(0.05, 0.9, 0.01, true);
    ref_scaler r = check_trajectory(dynamic(65536, 2, 0.5, 2, 0), &sgd, "FFHFFNNFFFIFF", 1e34f, 0);
    assert_true(r.grown >= 2 && r.backed_off >= 3);
}

static void test_scale_never_grows_past_the_f32_range_but_the_growth_tracker_still_resets(void **state)
{
    (void)state;
    /* 2^127 * 2 is inf in f32: at every interval the scale stays 2^127 and
     * the tracker goes back to 0; a NaN then backs off to 2^126. |x| <= 1
     * keeps 2^127 * x finite. */
    alloy_optimizer adam = alloy_adam(0.01, 0.9, 0.999, 1e-8, 0);
    alloy_grad_scaler sc = dynamic(0x1p127, 2, 0.5, 3, 0);
    ref_scaler r = check_trajectory(sc, &adam, "FFFFFFFN", 1, 0);
    assert_int_equal(r.held_at_f32_max, 2);
    assert_int_equal(r.grown, 0);
    assert_true(r.scale == 0x1p126f);

    /* the same, step by step, written out */
    alloy_graph *g = linear_graph(sc, &adam);
    const int tracker[6] = {1, 2, 0, 1, 2, 0};
    for (int step = 0; step < 6; step++) {
        float x[N] = {0.5f, -0.25f, 1, -1};
        alloy_host_tensor feed = {"x", F32, 1, {N}, x};
        alloy_host_tensor fetch = {.name = "scaler.next_scale"};
        run(g, &feed, 1, &fetch, 1);
        assert_true(*(const float *)fetch.data == 0x1p127f);
        assert_true(state_scalar(g, "scaler.growth_tracker") == tracker[step]);
        assert_true(isfinite(state_scalar(g, "scaler.scale")));
    }
    alloy_graph_free(g);
}

static void test_min_scale_bounds_the_backoff_and_growth_resumes_from_it(void **state)
{
    (void)state;
    alloy_optimizer adam = alloy_adam(0.01, 0.9, 0.999, 1e-8, 0);
    /* 8 -> 4 -> 2 -> max(1, 1.5) = 1.5 -> 1.5 ..., then x2 every 2 finite steps */
    ref_scaler r = check_trajectory(dynamic(8, 2, 0.5, 2, 1.5), &adam, "NNNNNFFFFN", 1, 1);
    assert_true(r.backed_off == 6);
    /* written out: after the five NaNs the scale sits at the bound, two
     * growths double it twice (6), the last NaN halves it (3) */
    assert_true(r.scale == 3.0f);
    /* a bound that is not a power of two is stored as f32(0.3) */
    r = check_trajectory(dynamic(1, 2, 0.5, 5, 0.3), &adam, "NNNF", 1, 1);
    assert_true(r.scale == 0.3f);
}

static void test_non_power_of_two_factors_round_once_from_double_as_pytorch_does(void **state)
{
    (void)state;
    /* PyTorch multiplies the f32 scale by the double factor and stores the
     * result to f32 once; rounding the factor to f32 first gives a scale one
     * ulp off after a few backoffs (1024 * 0.3^3 is 27.648 in PyTorch, not
     * 27.648003). Unscaled gradients may then be 1 ulp off x. */
    alloy_optimizer adam = alloy_adam(0.01, 0.9, 0.999, 1e-8, 0);
    ref_scaler r = check_trajectory(dynamic(1024, 1.7, 0.3, 2, 0), &adam, "NNNNFFFFNNFFFFNN", 1, 1);
    assert_true(r.grown >= 4 && r.backed_off >= 8);
}

static void test_static_scaler_keeps_its_scale_and_still_skips_non_finite_steps(void **state)
{
    (void)state;
    /* 4096 * 1e36 overflows f32: 'H' steps are skipped like NaN/inf ones;
     * the scale stays 4096 through runs of finite steps. */
    alloy_optimizer adam = alloy_adam(0.01, 0.9, 0.999, 1e-8, 0.01);
    ref_scaler r = check_trajectory(alloy_static_scaler(4096), &adam, "FFFFFFFNFFHFFIFF", 1e36f, 0);
    assert_int_equal(r.skipped, 3);
    assert_true(r.scale == 4096.0f);
    /* no growth tracker for a constant scale is needed; if there is one it
     * must not matter: the scale after many finite steps is still 4096 */
    alloy_graph *g = linear_graph(alloy_static_scaler(4096), &adam);
    for (int step = 0; step < 10; step++) {
        float x[N] = {0.5f, 0.25f, -1, 1};
        alloy_host_tensor feed = {"x", F32, 1, {N}, x};
        run(g, &feed, 1, NULL, 0);
        alloy_step_info info;
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        assert_true(info.scale == 4096 && info.next_scale == 4096 && !info.skipped);
    }
    alloy_graph_free(g);
}

/* On a skipped step every state tensor but the scaler's keeps its bytes,
 * for each optimizer's moments, after the moments became non-zero. */
static void test_a_skipped_step_leaves_parameters_moments_and_the_step_counter_bit_for_bit_unchanged(void **state)
{
    (void)state;
    const alloy_optimizer opts[] = {
        alloy_adam(0.01, 0.9, 0.999, 1e-8, 0.01),
        alloy_adamw(0.01, 0.9, 0.999, 1e-8, 0.1),
        alloy_sgd(0.1, 0.9, 0.01, true),
    };
    const char *const moments[][2] = {{"w.m", "w.v"}, {"w.m", "w.v"}, {"w.momentum", NULL}};
    for (size_t k = 0; k < sizeof opts / sizeof *opts; k++) {
        alloy_graph *g = linear_graph(dynamic(256, 2, 0.5, 100, 0), &opts[k]);
        for (int step = 0; step < 3; step++) {
            float x[N];
            step_input('F', 0, x);
            alloy_host_tensor feed = {"x", F32, 1, {N}, x};
            run(g, &feed, 1, NULL, 0);
        }
        assert_true(state_scalar(g, "optim.step") == 3);
        for (int m = 0; m < 2 && moments[k][m]; m++) { /* the moments are in use */
            alloy_host_tensor t;
            expect_ok(g, alloy_graph_get_state(g, moments[k][m], &t), moments[k][m]);
            assert_true(((const float *)t.data)[0] != 0);
        }
        for (int step = 0; step < 2; step++) {
            float x[N];
            step_input(step ? 'I' : 'N', 0, x);
            snapshot before = take_snapshot(g);
            alloy_host_tensor feed = {"x", F32, 1, {N}, x};
            run(g, &feed, 1, NULL, 0);
            /* w, its moments, optim.step and optim.lr: 4 or 5 tensors, all unchanged */
            assert_int_equal(expect_unchanged_but_scaler(g, &before, "skipped step"), moments[k][1] ? 5 : 4);
            free_snapshot(&before);
        }
        alloy_step_info info;
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        assert_true(info.skipped && !info.updated && info.step == 3 && info.skipped_steps == 2);
        assert_true(info.scale == 128 && info.next_scale == 64);
        alloy_graph_free(g);
    }
}

/* The skipped-step test above on a whole f16 AMP training step: an MLP
 * (f16 matmuls, f32 master weights, AdamW, dynamic scaler growing every 3
 * finite steps) trained for 5 steps, then inputs that make a gradient
 * inf/NaN: a finite input too large for f16 (70000 > 65504: inf after the
 * cast), a NaN in one element, and a finite 300 whose f16 products overflow
 * once scaled. Each such step is skipped: parameters, both moments and
 * optim.step keep their bits; the scale used is halved for the next step,
 * the growth tracker goes to 0, step.skipped_steps counts it. A finite batch
 * right after is applied at the halved scale, and training goes on: the
 * loss over the next 30 steps falls. */
static void test_f16_amp_training_skips_a_step_with_inf_or_nan_gradients_bit_for_bit_and_goes_on(void **state)
{
    (void)state;
    enum { B = 8, IN = 4, H = 16, OUT = 3 };
    alloy_graph *g = alloy_graph_new("f16-inject");
    alloy_graph_set_seed(g, 5);
    test_mlp m = build_mlp(g, F32, B, IN, H, OUT);
    expect_ok(g, alloy_graph_set_loss(g, m.loss), "set_loss");
    expect_ok(g, alloy_graph_enable_amp(g, ALLOY_F16), "enable_amp");
    expect_ok(g, alloy_graph_set_grad_scaler(g, dynamic(0x1p10, 2, 0.5, 3, 0)), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_adamw(0.01, 0.9, 0.999, 1e-8, 0.01)), "add_optimizer");
    test_rng = 0x5eed0f16u;
    float x[B * IN];
    int32_t t[B];
    for (int i = 0; i < B; i++) t[i] = i % OUT;
    alloy_host_tensor feeds[2] = {{"x", F32, 2, {B, IN}, x}, {"targets", I32, 1, {B}, t}};
    /* inputs with a class signal, so the loss can fall */
#define FINITE_BATCH() \
    for (int i = 0; i < B * IN; i++) x[i] = (float)(test_uniform(-0.5, 0.5) + (i % IN == t[i / IN] ? 1 : 0))
    alloy_step_info info;
    for (int step = 0; step < 5; step++) {
        FINITE_BATCH();
        run(g, feeds, 2, NULL, 0);
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        assert_false(info.skipped);
    }
    const struct {
        const char *what;
        float value;
        int at; /* element of x; -1: all */
    } inject[] = {{"an input of 70000 (inf in f16)", 70000, 5}, {"a NaN input", NAN, 2}, {"inputs of 300", 300, -1}};
    for (size_t k = 0; k < sizeof inject / sizeof *inject; k++) {
        FINITE_BATCH();
        for (int i = 0; i < B * IN; i++)
            if (inject[k].at < 0 || i == inject[k].at) x[i] = inject[k].value;
        double scale = state_scalar(g, "scaler.scale"), skipped = state_scalar(g, "step.skipped_steps");
        double tracker = state_scalar(g, "scaler.growth_tracker"), updates = state_scalar(g, "optim.step");
        snapshot before = take_snapshot(g);
        alloy_host_tensor grad = {.name = "grad:w1"};
        run(g, feeds, 2, &grad, 1);
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        bool finite = true;
        for (int i = 0; i < IN * H; i++) finite &= isfinite(((const float *)grad.data)[i]);
        print_message("%s: scale %g -> %g, skipped %d, tracker was %g\n", inject[k].what, info.scale,
                      info.next_scale, info.skipped, tracker);
        if (finite) fail_msg("%s: grad:w1 is finite; the injection did not reach the gradients", inject[k].what);
        if (!info.skipped || info.updated) fail_msg("%s: skipped %d, updated %d", inject[k].what, info.skipped, info.updated);
        /* 4 parameters, 8 moments, optim.step and optim.lr: all bit for bit */
        assert_int_equal(expect_unchanged_but_scaler(g, &before, inject[k].what), 14);
        free_snapshot(&before);
        assert_true(info.scale == scale && info.next_scale == scale / 2);
        assert_true(state_scalar(g, "scaler.scale") == scale / 2);
        assert_true(state_scalar(g, "scaler.growth_tracker") == 0);
        assert_true(state_scalar(g, "step.skipped_steps") == skipped + 1 && info.skipped_steps == skipped + 1);
        assert_true(state_scalar(g, "optim.step") == updates && info.step == updates);
        /* the next finite batch is applied at the halved scale */
        FINITE_BATCH();
        run(g, feeds, 2, NULL, 0);
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        if (info.skipped || !info.updated || info.scale != scale / 2 || !isfinite(info.loss))
            fail_msg("after %s: skipped %d, updated %d, scale %g (expected %g), loss %g", inject[k].what,
                     info.skipped, info.updated, info.scale, scale / 2, info.loss);
        assert_true(state_scalar(g, "optim.step") == updates + 1);
    }
    double first = 0, last = 0;
    for (int step = 0; step < 30; step++) {
        FINITE_BATCH();
        run(g, feeds, 2, NULL, 0);
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        assert_true(isfinite(info.loss));
        if (step < 5) first += info.loss / 5;
        if (step >= 25) last += info.loss / 5;
    }
#undef FINITE_BATCH
    print_message("after the injections: mean loss of 5 steps %.4f, 25 steps later %.4f; %lld steps skipped in all\n",
                  first, last, (long long)info.skipped_steps);
    assert_true(last < 0.8 * first);
    alloy_graph_free(g);
}

/* Scaling by a power of two commutes with every f32 rounding (barring
 * overflow and subnormals), so the unscaled gradients of the MLP equal those
 * of the same graph without a scaler bit for bit, whatever the scale. */
static void test_unscaled_mlp_gradients_equal_the_gradients_without_a_scaler_for_power_of_two_scales(void **state)
{
    (void)state;
    enum { B = 8, IN = 5, H = 6, OUT = 3 };
    alloy_graph *gs = alloy_graph_new("scaled"), *gp = alloy_graph_new("plain");
    test_mlp ms = build_mlp(gs, F32, B, IN, H, OUT), mp = build_mlp(gp, F32, B, IN, H, OUT);
    expect_ok(gs, alloy_graph_set_loss(gs, ms.loss), "set_loss");
    expect_ok(gp, alloy_graph_set_loss(gp, mp.loss), "set_loss");
    /* grows x2 on every step: 2^10, 2^11, ... (no optimizer: params stay) */
    expect_ok(gs, alloy_graph_set_grad_scaler(gs, dynamic(0x1p10, 2, 0.5, 1, 0)), "set_grad_scaler");
    const char *const names[] = {"grad:w1", "grad:b1", "grad:w2", "grad:b2"};
    for (int step = 0; step < 5; step++) {
        float x[B * IN];
        int32_t t[B];
        for (int i = 0; i < B * IN; i++) x[i] = (float)test_uniform(-2, 2);
        for (int i = 0; i < B; i++) t[i] = (int32_t)(test_next_u64() % OUT);
        alloy_host_tensor feeds[2] = {{"x", F32, 2, {B, IN}, x}, {"targets", ALLOY_I32, 1, {B}, t}};
        alloy_host_tensor fs[4], fp[4];
        for (int i = 0; i < 4; i++) fs[i] = (alloy_host_tensor){.name = names[i]}, fp[i] = fs[i];
        run(gs, feeds, 2, fs, 4);
        run(gp, feeds, 2, fp, 4);
        alloy_step_info info;
        expect_ok(gs, alloy_graph_step_info(gs, &info), "step_info");
        assert_true(info.scale == ldexp(1, 10 + step) && !info.skipped);
        for (int i = 0; i < 4; i++) {
            int64_t n = alloy_host_tensor_numel(&fp[i]);
            assert_int_equal(fs[i].dtype, F32);
            assert_int_equal(alloy_host_tensor_numel(&fs[i]), n);
            const float *a = fs[i].data, *b = fp[i].data;
            for (int64_t j = 0; j < n; j++)
                if (ulp_diff(a[j], b[j]) > 0 || !isfinite(a[j]))
                    fail_msg("step %d %s[%lld]: %.9g with the scaler, %.9g without", step, names[i], (long long)j,
                             (double)a[j], (double)b[j]);
        }
    }
    alloy_graph_free(gs);
    alloy_graph_free(gp);
}

/* f16 AMP: loss = reduce_sum(x @ w) with the matmul in f16. Unfused
 * (ALLOY_NO_FUSE=gemm), the gradient of w is f16(scale * x), inf once
 * scale * max|x| >= 65520, then cast to f32. Fused, that matmul and the cast
 * are one GEMM epilogue group whose f32 product is never stored in f16, but
 * keeps f16's range (docs/fusion.md): beyond it, inf as unfused. Either way
 * the scaler backs off step after step until the gradients fit, then the
 * step is applied, at the same steps. */
static void f16_backoff(bool fused)
{
    if (!fused) setenv("ALLOY_NO_FUSE", "gemm", 1);
    alloy_graph *g = alloy_graph_new("f16");
    alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(1, N));
    alloy_tensor *w = alloy_param(g, "w", F32, 2, DIMS(N, 1), alloy_init_uniform(-1, 1));
    alloy_tensor *loss = alloy_reduce_sum(g, alloy_matmul(g, x, w, false, false), 0, NULL, false);
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    expect_ok(g, alloy_graph_enable_amp(g, ALLOY_F16), "enable_amp");
    alloy_grad_scaler sc = dynamic(0x1p20, 2, 0.5, 1000, 0);
    expect_ok(g, alloy_graph_set_grad_scaler(g, sc), "set_grad_scaler");
    alloy_optimizer adam = alloy_adam(0.01, 0.9, 0.999, 1e-8, 0);
    expect_ok(g, alloy_graph_add_optimizer(g, adam), "add_optimizer");
    float xv[N] = {3, -0.5f, 1.25f, 2}; /* exact in f16; max |x| = 3 */
    double scale = 0x1p20;
    int skipped = 0;
    for (int step = 0; step < 10; step++) {
        bool found = 3 * scale >= F16_OVERFLOW; /* 3 * 2^14 = 49152 fits, 3 * 2^15 does not */
        alloy_host_tensor feed = {"x", F32, 2, {1, N}, xv};
        alloy_host_tensor fetch[1] = {{.name = "grad:w"}};
        run(g, &feed, 1, fetch, 1);
        alloy_step_info info;
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        if (info.skipped != found || info.scale != scale)
            fail_msg("step %d: skipped %d at scale %g; expected %d at scale %g", step, info.skipped, info.scale,
                     found, scale);
        if (!found) {
            assert_int_equal(fetch[0].dtype, F32);
            for (int i = 0; i < N; i++) assert_true(((const float *)fetch[0].data)[i] == xv[i]);
        }
        skipped += found;
        if (found) scale *= 0.5;
    }
    assert_int_equal(skipped, 6); /* 2^20 .. 2^15 */
    assert_true(state_scalar(g, "optim.step") == 4);
    alloy_graph_free(g);
    unsetenv("ALLOY_NO_FUSE");
}

static void test_f16_amp_scaler_backs_off_until_the_half_precision_gradients_fit(void **state)
{
    (void)state;
    f16_backoff(false);
}

static void test_fused_f16_amp_keeps_the_f16_range_of_its_gemm_products_and_backs_off_as_unfused(void **state)
{
    (void)state;
    f16_backoff(true);
}

/* bf16 AMP does not need a scaler but accepts one: the scale follows the
 * rules, the unscaled gradients equal those of the same bf16 graph without a
 * scaler (a power-of-two scale commutes with bf16 rounding), and training
 * with it lowers the loss. */
static void test_bf16_amp_accepts_a_scaler_and_its_unscaled_gradients_match_the_unscaled_graph(void **state)
{
    (void)state;
    enum { B = 16, IN = 6, H = 16, OUT = 3 };
    alloy_graph *gs = alloy_graph_new("bf16-scaled"), *gp = alloy_graph_new("bf16-plain");
    test_mlp ms = build_mlp(gs, F32, B, IN, H, OUT), mp = build_mlp(gp, F32, B, IN, H, OUT);
    expect_ok(gs, alloy_graph_set_loss(gs, ms.loss), "set_loss");
    expect_ok(gp, alloy_graph_set_loss(gp, mp.loss), "set_loss");
    expect_ok(gs, alloy_graph_enable_amp(gs, ALLOY_BF16), "enable_amp");
    expect_ok(gp, alloy_graph_enable_amp(gp, ALLOY_BF16), "enable_amp");
    alloy_grad_scaler sc = dynamic(0x1p8, 2, 0.5, 2, 0);
    assert_int_equal(alloy_graph_set_grad_scaler(gs, sc), ALLOY_OK);
    ref_scaler r = ref_from(sc);
    const char *const names[] = {"grad:w1", "grad:b1", "grad:w2", "grad:b2"};
    float x[B * IN];
    int32_t t[B];
    for (int i = 0; i < B * IN; i++) x[i] = (float)test_uniform(-2, 2);
    for (int i = 0; i < B; i++) t[i] = (int32_t)(x[i * IN] > 0) + (int32_t)(x[i * IN + 1] > 0);
    alloy_host_tensor feeds[2] = {{"x", F32, 2, {B, IN}, x}, {"targets", ALLOY_I32, 1, {B}, t}};
    for (int step = 0; step < 5; step++) {
        alloy_host_tensor fs[4], fp[4];
        for (int i = 0; i < 4; i++) fs[i] = (alloy_host_tensor){.name = names[i]}, fp[i] = fs[i];
        run(gs, feeds, 2, fs, 4);
        run(gp, feeds, 2, fp, 4);
        alloy_step_info info;
        expect_ok(gs, alloy_graph_step_info(gs, &info), "step_info");
        if (info.scale != r.scale || info.skipped)
            fail_msg("step %d: scale %g (skipped %d), expected %g", step, info.scale, info.skipped, (double)r.scale);
        ref_update(&r, false);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(fs[i].dtype, F32);
            const float *a = fs[i].data, *b = fp[i].data;
            for (int64_t j = 0; j < alloy_host_tensor_numel(&fp[i]); j++)
                if (a[j] != b[j])
                    fail_msg("step %d %s[%lld]: %.9g with the scaler, %.9g without", step, names[i], (long long)j,
                             (double)a[j], (double)b[j]);
        }
    }
    assert_true(r.grown == 2);
    /* and it trains: AdamW on the same batch lowers the loss */
    expect_ok(gs, alloy_graph_add_optimizer(gs, alloy_adamw(0.02, 0.9, 0.999, 1e-8, 0)), "add_optimizer");
    double first = 0, last = 0;
    for (int step = 0; step < 30; step++) {
        run(gs, feeds, 2, NULL, 0);
        alloy_step_info info;
        expect_ok(gs, alloy_graph_step_info(gs, &info), "step_info");
        assert_false(info.skipped);
        assert_true(info.updated);
        if (step == 0) first = info.loss;
        last = info.loss;
    }
    assert_true(state_scalar(gs, "optim.step") == 30);
    if (!(last < 0.5 * first)) fail_msg("bf16 + scaler: loss %g after 30 steps, %g at the start", last, first);
    alloy_graph_free(gs);
    alloy_graph_free(gp);
}

/* docs/training.md lists "scaler.scale" as a state and an output: "loss
 * scale used by this step". Fetched after a run it must be the scale the
 * step used (step_info.scale), not the one the update wrote for the next. */
static void test_the_fetched_scaler_scale_output_is_the_scale_the_step_used(void **state)
{
    (void)state;
    alloy_optimizer sgd = alloy_sgd(0.1, 0, 0, false);
    alloy_graph *g = linear_graph(dynamic(1024, 2, 0.5, 1, 0), &sgd); /* x2 on every finite step */
    double got[3], used[3];
    for (int step = 0; step < 3; step++) {
        float x[N] = {0.5f, -0.5f, 0.25f, 1};
        alloy_host_tensor feed = {"x", F32, 1, {N}, x};
        alloy_host_tensor fetch[2] = {{.name = "scaler.scale"}, {.name = "scaler.next_scale"}};
        run(g, &feed, 1, fetch, 2);
        alloy_step_info info;
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        got[step] = fetched_scalar(&fetch[0]);
        used[step] = info.scale;
        assert_true(info.scale == ldexp(1024, step) && fetched_scalar(&fetch[1]) == ldexp(1024, step + 1));
    }
    alloy_graph_free(g);
    for (int step = 0; step < 3; step++)
        if (got[step] != used[step])
            fail_msg("step %d: fetched scaler.scale is %g, the step used %g", step, got[step], used[step]);
}

#define EXPECT_REJECTED(g, sc, ...)                                                                       \
    do {                                                                                                  \
        alloy_status st_ = alloy_graph_set_grad_scaler(g, sc);                                            \
        if (st_ != ALLOY_ERR_INVALID)                                                                     \
            fail_msg("line %d: set_grad_scaler returned %s, expected invalid argument", __LINE__,         \
                     alloy_status_name(st_));                                                             \
        const char *parts_[] = {__VA_ARGS__};                                                             \
        for (size_t i_ = 0; i_ < sizeof parts_ / sizeof *parts_; i_++)                                    \
            if (!strstr(alloy_last_error(g), parts_[i_]))                                                 \
                fail_msg("line %d: message \"%s\" lacks \"%s\"", __LINE__, alloy_last_error(g), parts_[i_]); \
    } while (0)

static void test_bad_scaler_parameters_are_rejected_with_a_message_and_the_previous_scaler_stays(void **state)
{
    (void)state;
    alloy_optimizer sgd = alloy_sgd(0.1, 0, 0, false);
    alloy_graph *g = linear_graph(dynamic(512, 2, 0.5, 4, 0), &sgd);
    EXPECT_REJECTED(g, dynamic(0, 2, 0.5, 4, 0), "init_scale");
    EXPECT_REJECTED(g, dynamic(-1, 2, 0.5, 4, 0), "init_scale");
    EXPECT_REJECTED(g, dynamic(INFINITY, 2, 0.5, 4, 0), "init_scale");
    EXPECT_REJECTED(g, dynamic(NAN, 2, 0.5, 4, 0), "init_scale");
    EXPECT_REJECTED(g, dynamic(1e39, 2, 0.5, 4, 0), "init_scale"); /* beyond f32 */
    EXPECT_REJECTED(g, dynamic(512, 1.0, 0.5, 4, 0), "growth_factor");
    EXPECT_REJECTED(g, dynamic(512, 0.5, 0.5, 4, 0), "growth_factor");
    EXPECT_REJECTED(g, dynamic(512, NAN, 0.5, 4, 0), "growth_factor");
    EXPECT_REJECTED(g, dynamic(512, 2, 1.0, 4, 0), "backoff_factor");
    EXPECT_REJECTED(g, dynamic(512, 2, 0, 4, 0), "backoff_factor");
    EXPECT_REJECTED(g, dynamic(512, 2, -0.5, 4, 0), "backoff_factor");
    EXPECT_REJECTED(g, dynamic(512, 2, 0.5, 0, 0), "growth_interval");
    EXPECT_REJECTED(g, dynamic(512, 2, 0.5, -3, 0), "growth_interval");
    EXPECT_REJECTED(g, dynamic(512, 2, 0.5, 4, -1), "min_scale");
    EXPECT_REJECTED(g, alloy_static_scaler(0), "init_scale");
    EXPECT_REJECTED(g, alloy_static_scaler(-8), "init_scale");
    alloy_grad_scaler odd = alloy_dynamic_scaler();
    odd.kind = (alloy_scaler_kind)7;
    EXPECT_REJECTED(g, odd, "kind", "7");
    /* NaN and infinities in every field the kind uses; the message starts
     * with the field (a NaN or infinite min_scale or growth_factor used to
     * be accepted: an infinite min_scale makes every later step skip) */
    const struct {
        alloy_grad_scaler sc;
        const char *field;
    } non_finite[] = {
        {dynamic(NAN, 2, 0.5, 4, 0), "init_scale"},       {dynamic(512, INFINITY, 0.5, 4, 0), "growth_factor"},
        {dynamic(512, NAN, 0.5, 4, 0), "growth_factor"},  {dynamic(512, 2, NAN, 4, 0), "backoff_factor"},
        {dynamic(512, 2, -INFINITY, 4, 0), "backoff_factor"}, {dynamic(512, 2, 0.5, 4, NAN), "min_scale"},
        {dynamic(512, 2, 0.5, 4, INFINITY), "min_scale"}, {dynamic(512, 2, 0.5, 4, 1e39), "min_scale"},
        {dynamic(512, 2, 0.5, 4, -INFINITY), "min_scale"}, {alloy_static_scaler(INFINITY), "init_scale"},
        {alloy_static_scaler(NAN), "init_scale"},         {dynamic(512, 1.0, 0.5, 4, 0), "growth_factor"},
        {dynamic(512, 2, 1.0, 4, 0), "backoff_factor"},   {dynamic(512, 2, 0.5, 0, 0), "growth_interval"},
        {dynamic(512, 2, 0.5, 4, -1), "min_scale"},
    };
    EXPECT_REJECTED(g, dynamic(512, 2, 0.5, 4, NAN), "set_grad_scaler: min_scale is nan; it must be 0 (none) or a positive finite f32");
    for (size_t i = 0; i < sizeof non_finite / sizeof *non_finite; i++) {
        char want[64];
        snprintf(want, sizeof want, "set_grad_scaler: %s is ", non_finite[i].field);
        alloy_status st = alloy_graph_set_grad_scaler(g, non_finite[i].sc);
        if (st != ALLOY_ERR_INVALID || strncmp(alloy_last_error(g), want, strlen(want)) != 0)
            fail_msg("case %zu: %s \"%s\", expected invalid argument starting \"%s\"", i, alloy_status_name(st),
                     st ? alloy_last_error(g) : "", want);
    }
    /* none of them replaced the scaler that was set: 512, grows after 4 */
    for (int step = 0; step < 5; step++) {
        float x[N] = {0.5f, -0.5f, 0.25f, 1};
        alloy_host_tensor feed = {"x", F32, 1, {N}, x};
        run(g, &feed, 1, NULL, 0);
        alloy_step_info info;
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        assert_true(info.scale == (step < 4 ? 512 : 1024));
    }
    alloy_graph_free(g);
}

/* A scale whose inverse is no finite f32 (a denormal init or min scale)
 * made every step skip forever: refused; a scaler on a graph without a
 * loss was ignored (step_info then gave OK and a NaN loss): an error at
 * compile; step_info before any run gave OK and a scale of 0: an error. */
static void test_denormal_scales_a_scaler_without_a_loss_and_step_info_before_a_run_are_errors(void **state)
{
    (void)state;
    alloy_optimizer sgd = alloy_sgd(0.1, 0, 0, false);
    alloy_graph *g = linear_graph(dynamic(512, 2, 0.5, 4, 0), &sgd);
    alloy_step_info info;
    assert_int_equal(alloy_graph_step_info(g, &info), ALLOY_ERR_INVALID);
    assert_string_equal(alloy_last_error(g), "step_info: graph 'linear' has run no step yet (alloy_graph_run)");
    EXPECT_REJECTED(g, dynamic(1e-45, 2, 0.5, 4, 0),
                    "set_grad_scaler: init_scale is 1e-45; it must be a positive finite f32 of at least 1.17549e-38");
    EXPECT_REJECTED(g, alloy_static_scaler(1e-40), "init_scale is 1e-40");
    EXPECT_REJECTED(g, dynamic(512, 2, 0.5, 4, 1e-39), "min_scale is 1e-39", "at least 1.17549e-38");
    expect_ok(g, alloy_graph_set_grad_scaler(g, dynamic(1.2e-38, 2, 0.5, 4, 1.2e-38)), "the smallest normal scales");
    float x[N] = {0.5f, -0.5f, 0.25f, 1};
    alloy_host_tensor feed = {"x", F32, 1, {N}, x};
    run(g, &feed, 1, NULL, 0);
    expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
    assert_false(info.skipped); /* 1 / 1.2e-38 is a finite f32: the step applies */
    alloy_graph_free(g);

    g = alloy_graph_new("noloss");
    alloy_tensor *xi = alloy_input(g, "x", F32, 1, DIMS(N));
    expect_ok(g, alloy_output(g, "y", alloy_relu(g, xi)), "output");
    expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), "set_grad_scaler");
    assert_int_equal(alloy_graph_run(g, &feed, 1, NULL, 0), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "a loss scaler is set (alloy_graph_set_grad_scaler) but the graph has "
                                                "no loss to scale"));
    assert_int_equal(alloy_graph_step_info(g, &info), ALLOY_ERR_INVALID);
    expect_ok(g, alloy_graph_set_grad_scaler(g, (alloy_grad_scaler){.kind = ALLOY_SCALER_NONE}), "no scaler");
    expect_ok(g, alloy_graph_run(g, &feed, 1, NULL, 0), "run without the scaler");
    alloy_graph_free(g);
}

#define TEST(f) cmocka_unit_test_setup_teardown(f, test_checked_alloc, test_plain_alloc)

int main(void)
{
    test_rng = 0x5ca1ab1e0ddba11u;
    const struct CMUnitTest tests[] = {
        TEST(test_dynamic_scale_backs_off_on_overflow_and_nan_and_grows_after_each_interval_of_finite_steps),
        TEST(test_sgd_momentum_trajectory_matches_the_reference_model_too),
        TEST(test_scale_never_grows_past_the_f32_range_but_the_growth_tracker_still_resets),
        TEST(test_min_scale_bounds_the_backoff_and_growth_resumes_from_it),
        TEST(test_non_power_of_two_factors_round_once_from_double_as_pytorch_does),
        TEST(test_static_scaler_keeps_its_scale_and_still_skips_non_finite_steps),
        TEST(test_a_skipped_step_leaves_parameters_moments_and_the_step_counter_bit_for_bit_unchanged),
        TEST(test_f16_amp_training_skips_a_step_with_inf_or_nan_gradients_bit_for_bit_and_goes_on),
        TEST(test_unscaled_mlp_gradients_equal_the_gradients_without_a_scaler_for_power_of_two_scales),
        TEST(test_f16_amp_scaler_backs_off_until_the_half_precision_gradients_fit),
        TEST(test_fused_f16_amp_keeps_the_f16_range_of_its_gemm_products_and_backs_off_as_unfused),
        TEST(test_bf16_amp_accepts_a_scaler_and_its_unscaled_gradients_match_the_unscaled_graph),
        TEST(test_the_fetched_scaler_scale_output_is_the_scale_the_step_used),
        TEST(test_bad_scaler_parameters_are_rejected_with_a_message_and_the_previous_scaler_stays),
        TEST(test_denormal_scales_a_scaler_without_a_loss_and_step_info_before_a_run_are_errors),
    };
    return cmocka_run_group_tests_name("scaler", tests, NULL, NULL);
}
