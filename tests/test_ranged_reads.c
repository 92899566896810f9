/* test_ranged_reads.c - widened f16/bf16 products without an epilogue kernel (step/ranged_reads.c): cuBLASLt writes the f32 sum, the reading kernels apply the range rule, on the emulated device against the CPU, at the range's edge and in a skipped step. */
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
#include "cuda_emu/emu_device.h"
#include "cuda_emu/emu_loader.h"
#include "cuda_emu/emu_use.h"
#include "runtime/backend.h"
#include "support.h"

enum { ROWS = 4, K = 20, OUT = 8, TROWS = 8, TOUT = 4 };

/* y = f32(f(x) f(w)) + b, f the cast to amp; x [ROWS, K], w [K, OUT], b [OUT] inputs in f32. The
 * widened product's one reader is the add (an ew kernel): cuBLASLt writes it, no epilogue kernel. */
static alloy_graph *linear(const char *device, alloy_dtype amp)
{
    alloy_graph *g = alloy_graph_new("ranged");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){ROWS, K});
    alloy_tensor *w = alloy_input(g, "w", ALLOY_F32, 2, (int64_t[]){K, OUT});
    alloy_tensor *b = alloy_input(g, "b", ALLOY_F32, 1, (int64_t[]){OUT});
    alloy_tensor *p = alloy_matmul(g, alloy_cast(g, x, amp), alloy_cast(g, w, amp), false, false);
    expect_ok(g, alloy_output(g, "y", alloy_add(g, alloy_cast(g, p, ALLOY_F32), b)), "output");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    return g;
}

/* Runs linear's graph on x (w all ones, b all 0.5) into y[ROWS * OUT]; the emulated device's
 * GEMMs and GEMMs that wrote a later member's value (whole_gemms) into *gemms and *whole. */
static void run_linear(alloy_graph *g, const float *x, float *y, long *gemms, long *whole)
{
    float w[K * OUT], b[OUT];
    for (int i = 0; i < K * OUT; i++) w[i] = 1;
    for (int i = 0; i < OUT; i++) b[i] = 0.5f;
    alloy_host_tensor feeds[3] = {{"x", ALLOY_F32, 2, {ROWS, K}, (void *)x},
                                  {"w", ALLOY_F32, 2, {K, OUT}, w},
                                  {"b", ALLOY_F32, 1, {OUT}, b}},
                      out = {.name = "y"};
    emu_device_stats s0 = emu_totals();
    expect_ok(g, alloy_graph_run(g, feeds, 3, &out, 1), "run");
    emu_device_stats s1 = emu_totals();
    *gemms = s1.gemms - s0.gemms, *whole = s1.whole_gemms - s0.whole_gemms;
    memcpy(y, out.data, sizeof(float) * ROWS * OUT);
}

/* The rows of x, each row's sum against a column of ones, hand-worked: in f16 (max 65504, a
 * store rounds |s| >= 65520 to inf) 20 x 4000 = 80000 -> inf; 32768 + 32736 + 6 = 65510, which
 * an f16 store would round to 65504, is kept unrounded (the range rule keeps f32 precision);
 * 32768 + 32752 = 65520 -> inf, its negative -inf. In bf16 (a store rounds |s| >= 0x1.ffp127 to
 * inf, f32's max is 0x1.fffffep127) 2^127 + ... + 2^119 = 0x1.ffp127 -> inf though finite in
 * f32; without 2^119, 0x1.fep127 = bf16's max stays; 1 + 2 + 3 = 6; 2^127 + 2^127 is inf in
 * f32 already (negated: -inf). Every term is exact in its dtype, every sum exact in f32. */
static void fill_rows(alloy_dtype amp, float *x, double *want)
{
    memset(x, 0, sizeof(float) * ROWS * K);
    if (amp == ALLOY_F16) {
        for (int k = 0; k < K; k++) x[k] = 4000;
        x[K] = 32768, x[K + 1] = 32736, x[K + 2] = 6;
        x[2 * K] = 32768, x[2 * K + 1] = 32752;
        x[3 * K] = -32768, x[3 * K + 1] = -32752;
        want[0] = INFINITY, want[1] = 65510.5, want[2] = INFINITY, want[3] = -INFINITY;
    } else {
        for (int k = 0; k < 9; k++) x[k] = ldexpf(1, 127 - k);
        for (int k = 0; k < 8; k++) x[K + k] = ldexpf(1, 127 - k);
        x[2 * K] = 1, x[2 * K + 1] = 2, x[2 * K + 2] = 3;
        x[3 * K] = -ldexpf(1, 127), x[3 * K + 1] = -ldexpf(1, 127);
        want[0] = INFINITY, want[1] = 0x1.fep127, want[2] = 6.5, want[3] = -INFINITY;
    }
}

/* The product is written by cuBLASLt in f32 (one GEMM, writing the cast's value) and the add's
 * kernel applies the range rule as it loads it: inf where the CPU has inf, the unrounded sum
 * elsewhere, bit for bit the CPU's, in f16 and bf16. */
static void test_a_widened_product_past_the_range_is_inf_on_the_device_without_an_epilogue_kernel(void **state)
{
    (void)state;
    use_emulation();
    static const alloy_dtype amps[] = {ALLOY_F16, ALLOY_BF16};
    for (int a = 0; a < 2; a++) {
        float x[ROWS * K], yc[ROWS * OUT], yd[ROWS * OUT];
        double want[ROWS];
        fill_rows(amps[a], x, want);
        alloy_graph *cpu = linear("cpu", amps[a]), *dev = linear("cuda", amps[a]);
        long gemms, whole, g2, w2;
        run_linear(cpu, x, yc, &g2, &w2);
        run_linear(dev, x, yd, &gemms, &whole);
        print_message("%s rows: CPU %.9g %.9g %.9g %.9g, device %.9g %.9g %.9g %.9g; %ld GEMM, %ld writing the "
                      "widened value\n",
                      alloy_dtype_name(amps[a]), yc[0], yc[OUT], yc[2 * OUT], yc[3 * OUT], yd[0], yd[OUT],
                      yd[2 * OUT], yd[3 * OUT], gemms, whole);
        assert_int_equal(gemms, 1);
        assert_int_equal(whole, 1); /* no epilogue kernel: the GEMM wrote f32(p) itself */
        for (int r = 0; r < ROWS; r++)
            for (int o = 0; o < OUT; o++) {
                if ((double)yc[r * OUT + o] != want[r])
                    fail_msg("%s row %d: the CPU gives %.9g, by hand %.9g", alloy_dtype_name(amps[a]), r,
                             yc[r * OUT + o], want[r]);
                assert_memory_equal(&yd[r * OUT + o], &yc[r * OUT + o], sizeof(float));
            }
        alloy_graph_free(cpu), alloy_graph_free(dev);
    }
    rt_backend_set_cuda_opener(NULL);
}

/* p = f(x) f(w) output in amp itself: a lone matmul, cuBLASLt's D in amp (the f32 sum rounded once,
 * as the CPU stores its product). cuBLASLt converts its f32 result into a 16-bit D with round to
 * nearest even and no saturation (docs/cuda.md, "Whole steps in cuBLASLt"), so the emulated one
 * does: the sums of fill_rows past the range are inf in D, the others rounded: 65510 -> 65504 in
 * f16 (the range rule kept it unrounded above), 0x1.fep127 and 6 stay in bf16; bit for bit the
 * CPU's. */
static void test_a_lone_half_product_past_the_range_is_inf_in_cublaslts_d_as_on_the_cpu(void **state)
{
    (void)state;
    use_emulation();
    static const alloy_dtype amps[] = {ALLOY_F16, ALLOY_BF16};
    for (int a = 0; a < 2; a++) {
        float x[ROWS * K], w[K * OUT];
        double want[ROWS];
        fill_rows(amps[a], x, want);
        for (int i = 0; i < K * OUT; i++) w[i] = 1;
        uint16_t got[2][ROWS * OUT];
        for (int run = 0; run < 2; run++) {
            alloy_graph *g = alloy_graph_new("lone");
            alloy_tensor *xt = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){ROWS, K});
            alloy_tensor *wt = alloy_input(g, "w", ALLOY_F32, 2, (int64_t[]){K, OUT});
            expect_ok(g, alloy_output(g, "p", alloy_matmul(g, alloy_cast(g, xt, amps[a]), alloy_cast(g, wt, amps[a]),
                                                           false, false)),
                      "output");
            expect_ok(g, alloy_graph_set_option(g, "device", run ? "cuda" : "cpu"), "device");
            alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {ROWS, K}, x}, {"w", ALLOY_F32, 2, {K, OUT}, w}},
                              out = {.name = "p"};
            expect_ok(g, alloy_graph_run(g, feeds, 2, &out, 1), "run");
            memcpy(got[run], out.data, sizeof got[run]);
            alloy_graph_free(g);
        }
        double d[ROWS];
        for (int r = 0; r < ROWS; r++) d[r] = test_decode(amps[a], got[1], r * OUT);
        print_message("%s lone product rows on the device: %.9g %.9g %.9g %.9g\n", alloy_dtype_name(amps[a]), d[0], d[1],
                      d[2], d[3]);
        /* the rounded values by hand: want[] less the bias 0.5, rounded into amp */
        double hand[ROWS] = {want[0], amps[a] == ALLOY_F16 ? 65504 : 0x1.fep127, want[2], want[3]};
        if (amps[a] == ALLOY_BF16) hand[2] = 6;
        for (int r = 0; r < ROWS; r++) {
            if (d[r] != hand[r]) fail_msg("%s row %d: %.9g, by hand %.9g", alloy_dtype_name(amps[a]), r, d[r], hand[r]);
            assert_memory_equal(&got[1][r * OUT], &got[0][r * OUT], OUT * sizeof(uint16_t));
        }
    }
    rt_backend_set_cuda_opener(NULL);
}

/* y = x w + b under AMP (amp) with the dynamic scaler (2^16; none without `scaled`) and SGD;
 * x [TROWS, K] input, w [K, TOUT] and b zeros, loss = mse(y, t). */
static alloy_graph *trainer_scaled(const char *device, alloy_dtype amp, bool scaled)
{
    alloy_graph *g = alloy_graph_new("ranged_step");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){TROWS, K});
    alloy_tensor *t = alloy_input(g, "t", ALLOY_F32, 2, (int64_t[]){TROWS, TOUT});
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 2, (int64_t[]){K, TOUT}, alloy_init_zeros());
    alloy_tensor *b = alloy_param(g, "b", ALLOY_F32, 1, (int64_t[]){TOUT}, alloy_init_zeros());
    alloy_tensor *y = alloy_add(g, alloy_matmul(g, x, w, false, false), b);
    expect_ok(g, alloy_graph_set_loss(g, alloy_mse_loss(g, y, t, ALLOY_REDUCTION_MEAN)), "set_loss");
    expect_ok(g, alloy_graph_enable_amp(g, amp), "enable_amp");
    if (scaled) expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.01, 0, 0, false)), "add_optimizer");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    return g;
}

static alloy_graph *trainer(const char *device, alloy_dtype amp) { return trainer_scaled(device, amp, true); }

/* One step with every x = xv and t = tv; its info, w after it into w[K * TOUT], the device's
 * GEMMs that wrote a widened value into *whole. */
static alloy_step_info step_to(alloy_graph *g, float xv, float tv, float *w, long *whole)
{
    float x[TROWS * K], t[TROWS * TOUT];
    for (int i = 0; i < TROWS * K; i++) x[i] = xv;
    for (int i = 0; i < TROWS * TOUT; i++) t[i] = tv;
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {TROWS, K}, x}, {"t", ALLOY_F32, 2, {TROWS, TOUT}, t}}, out;
    emu_device_stats s0 = emu_totals();
    expect_ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), "training step");
    *whole = emu_totals().whole_gemms - s0.whole_gemms;
    expect_ok(g, alloy_graph_get_state(g, "w", &out), "get_state w");
    memcpy(w, out.data, sizeof(float) * K * TOUT);
    alloy_step_info info;
    expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
    return info;
}

static alloy_step_info step(alloy_graph *g, float xv, float *w, long *whole) { return step_to(g, xv, -0.25f, w, whole); }

/* The weight gradient x^T dy in amp, widened to f32 for the unscale: with w = b = 0 and t =
 * -0.25, dy = 2 (y - t) / 32 * 2^16 = 1024 in every element (exact), so with x = 20 each
 * product is 8 * 20 * 1024 = 163840: past f16's range (inf, the step skipped, the scale halved,
 * w untouched) though finite in f32, and within bf16's (the step taken). Then x = 0.5: taken in
 * both. The device's GEMMs write both widened products (the forward's and the weight
 * gradient's: 2 a step) and it skips and updates exactly as the CPU, w bit for bit. */
static void test_a_weight_gradient_past_the_range_skips_the_step_on_the_device_as_on_the_cpu(void **state)
{
    (void)state;
    use_emulation();
    static const alloy_dtype amps[] = {ALLOY_F16, ALLOY_BF16};
    static const float xs[] = {20, 0.5f};
    for (int a = 0; a < 2; a++) {
        alloy_graph *cpu = trainer("cpu", amps[a]), *dev = trainer("cuda", amps[a]);
        for (int s = 0; s < 2; s++) {
            float wc[K * TOUT], wd[K * TOUT];
            long whole, unused;
            alloy_step_info c = step(cpu, xs[s], wc, &unused), d = step(dev, xs[s], wd, &whole);
            print_message("%s step %d (x = %g): CPU skipped %d, scale %g -> %g, w[0] %.9g; device skipped %d, scale "
                          "%g -> %g, w[0] %.9g; %ld GEMMs writing a widened value\n",
                          alloy_dtype_name(amps[a]), s, xs[s], c.skipped, c.scale, c.next_scale, wc[0], d.skipped,
                          d.scale, d.next_scale, wd[0], whole);
            bool skip_here = s == 0 && amps[a] == ALLOY_F16;
            assert_int_equal(c.skipped, skip_here);
            assert_int_equal(d.skipped, skip_here);
            assert_true(c.scale == d.scale && c.next_scale == d.next_scale);
            assert_true(skip_here ? c.next_scale == c.scale / 2 : c.next_scale == c.scale);
            assert_int_equal(c.step, d.step);
            assert_int_equal(whole, 2);
            for (int i = 0; i < K * TOUT; i++) {
                if (skip_here) assert_true(wc[i] == 0);
                else assert_true(wc[i] < 0);
            }
            assert_memory_equal(wd, wc, sizeof wc);
        }
        alloy_graph_free(cpu), alloy_graph_free(dev);
    }
    rt_backend_set_cuda_opener(NULL);
}

/* Without a scaler the widened weight gradient is read by the update and the gradient norm's
 * lone sum_squares kernel, which apply the range rule as they load it: with w = b = 0, x = 1000
 * and t = -30000, dy = 2 * 30000 / 32 = 1875 and each product is 8 * 1000 * 1875 = 1.5e7, past
 * f16's range: the norm is inf and w becomes -inf on the CPU and on the device alike; within
 * bf16's the norm is finite and the same on both (to f32 sums in another order). The device's GEMMs write both widened products
 * (no epilogue kernel), and w is bit for bit the CPU's. */
static void test_the_norm_applies_the_range_rule_to_a_weight_gradient_without_a_scaler(void **state)
{
    (void)state;
    use_emulation();
    static const alloy_dtype amps[] = {ALLOY_F16, ALLOY_BF16};
    for (int a = 0; a < 2; a++) {
        alloy_graph *cpu = trainer_scaled("cpu", amps[a], false), *dev = trainer_scaled("cuda", amps[a], false);
        float wc[K * TOUT], wd[K * TOUT];
        long whole, unused;
        alloy_step_info c = step_to(cpu, 1000, -30000, wc, &unused), d = step_to(dev, 1000, -30000, wd, &whole);
        print_message("%s without a scaler: CPU grad norm %g, w[0] %g; device grad norm %g, w[0] %g; %ld GEMMs "
                      "writing a widened value\n",
                      alloy_dtype_name(amps[a]), c.grad_norm, wc[0], d.grad_norm, wd[0], whole);
        if (amps[a] == ALLOY_F16) {
            assert_true(isinf(c.grad_norm) && isinf(d.grad_norm));
            assert_true(isinf(wc[0]) && wc[0] < 0);
        } else {
            assert_true(isfinite(c.grad_norm) && c.grad_norm > 1e7);
            assert_true(fabs(c.grad_norm - d.grad_norm) <= 1e-6 * c.grad_norm); /* sums in another order */
        }
        assert_int_equal(whole, 2);
        assert_memory_equal(wd, wc, sizeof wc);
        alloy_graph_free(cpu), alloy_graph_free(dev);
    }
    rt_backend_set_cuda_opener(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_widened_product_past_the_range_is_inf_on_the_device_without_an_epilogue_kernel),
        cmocka_unit_test(test_a_weight_gradient_past_the_range_skips_the_step_on_the_device_as_on_the_cpu),
        cmocka_unit_test(test_a_lone_half_product_past_the_range_is_inf_in_cublaslts_d_as_on_the_cpu),
        cmocka_unit_test(test_the_norm_applies_the_range_rule_to_a_weight_gradient_without_a_scaler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
