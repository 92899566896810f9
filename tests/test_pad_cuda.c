/* test_pad_cuda.c - padded GEMM rows on the emulated device: a classifier over an odd vocabulary (37, 101 classes; 9001, streamed rows) trained in f16 and bf16 gives the CPU backend's fetched logits, loss and parameters within the CUDA tests' tolerance, and its launch plan gives the vocabulary GEMMs padded, aligned leading dimensions. */
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

enum { ROWS = 16, DIM = 24, STEPS = 2 };

/* h = x w1, logits = h w (v classes), loss = cross_entropy(logits, t);
 * AMP in amp (f16 with the dynamic scaler at 1024), SGD at 0.5, on device. */
static alloy_graph *classifier(const char *device, int v, alloy_dtype amp)
{
    alloy_graph *g = alloy_graph_new("classifier");
    assert_non_null(g);
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){ROWS, DIM});
    alloy_tensor *t = alloy_input(g, "t", ALLOY_I32, 1, (int64_t[]){ROWS});
    alloy_tensor *w1 = alloy_param(g, "w1", ALLOY_F32, 2, (int64_t[]){DIM, DIM}, alloy_init_normal(0.3));
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 2, (int64_t[]){DIM, v}, alloy_init_normal(0.3));
    alloy_tensor *h = alloy_matmul(g, x, w1, false, false);
    alloy_tensor *logits = alloy_set_name(g, alloy_matmul(g, h, w, false, false), "logits");
    alloy_tensor *loss = alloy_set_name(g, alloy_cross_entropy(g, logits, t), "loss");
    expect_ok(g, alloy_output(g, "loss", loss), "output");
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    expect_ok(g, alloy_graph_enable_amp(g, amp), "enable_amp");
    if (amp == ALLOY_F16) {
        alloy_grad_scaler sc = alloy_dynamic_scaler();
        sc.init_scale = 1024;
        expect_ok(g, alloy_graph_set_grad_scaler(g, sc), "set_grad_scaler");
    }
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.5, 0, 0, false)), "add_optimizer");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    return g;
}

/* The CUDA tests' bound (test_cuda.c, chain_bound) for a chain of 10 ops
 * whose longest sum has `terms` terms, values stored in amp's dtype. */
static double tolerance(int terms, alloy_dtype amp)
{
    double u = amp == ALLOY_F16 ? 0x1p-11 : 0x1p-8, u32 = 0x1p-24;
    return 10 * (2 * u + 2.0 * terms * u32 + 4 * u32);
}

/* Largest |a - b| over n elements relative to the largest |a| (NaN against a number: inf). */
static double distance(alloy_dtype da, const void *a, alloy_dtype db, const void *b, int64_t n)
{
    double scale = 0, worst = 0;
    for (int64_t k = 0; k < n; k++) scale = fmax(scale, fabs(test_decode(da, a, k)));
    for (int64_t k = 0; k < n; k++) {
        double x = test_decode(da, a, k), y = test_decode(db, b, k);
        double d = isnan(x) != isnan(y) ? INFINITY : isnan(x) ? 0 : fabs(x - y) / (scale > 0 ? scale : 1);
        worst = fmax(worst, d);
    }
    return worst;
}

/* One step on g with batch s: fetches the logits (ROWS x v) and the loss into out. */
static void step(alloy_graph *g, int v, int s, alloy_host_tensor out[2])
{
    float x[ROWS * DIM];
    int32_t t[ROWS];
    for (int i = 0; i < ROWS * DIM; i++) x[i] = (float)sin(0.37 * i + s) * 1.5f;
    for (int r = 0; r < ROWS; r++) t[r] = (int32_t)((r * 7 + s * 3) % v);
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {ROWS, DIM}, x}, {"t", ALLOY_I32, 1, {ROWS}, t}};
    out[0] = (alloy_host_tensor){.name = "logits"};
    out[1] = (alloy_host_tensor){.name = "loss"};
    expect_ok(g, alloy_graph_run(g, feeds, 2, out, 2), "run");
    assert_int_equal(out[0].rank, 2);
    assert_int_equal(out[0].dims[0], ROWS);
    assert_int_equal(out[0].dims[1], v);
}

/* The emulated device's launch list (the cost model's, from the launch
 * plan the backend replays): the vocabulary GEMMs show the padded leading
 * dimension ("+"), and none is "gemm odd ld". */
static void assert_padded_plan(alloy_graph *g, int v)
{
    char *text = NULL;
    size_t len = 0;
    FILE *report = open_memstream(&text, &len);
    assert_non_null(report);
    alloy_cost_options o = {.all = 1, .top = -1};
    expect_ok(g, alloy_graph_cost(g, &o, NULL, report), "cost");
    fclose(report);
    char ld[32];
    snprintf(ld, sizeof ld, "ld %d/", (v + 63) / 64 * 64);
    int padded = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strstr(line, "gemm odd ld")) fail_msg("%d classes: an odd GEMM: %s", v, line);
        if (strstr(line, " gemm.") && strchr(line, '+')) padded++;
    }
    if (padded != 3) fail_msg("%d classes: %d padded GEMMs in the launch list, want the 3 vocabulary GEMMs", v, padded);
    free(text);
}

static void against_cpu(int v, alloy_dtype amp)
{
    use_emulation();
    alloy_graph *cpu = classifier("cpu", v, amp), *gpu = classifier("cuda", v, amp);
    /* the same initial parameters */
    int n = alloy_graph_state_count(cpu);
    for (int i = 0; i < n; i++) {
        alloy_host_tensor st;
        expect_ok(cpu, alloy_graph_state_at(cpu, i, &st), "state_at");
        expect_ok(gpu, alloy_graph_set_state(gpu, &st), st.name);
    }
    double tol = tolerance(v > DIM ? v : DIM, amp), worst_logits = 0, worst_loss = 0;
    for (int s = 0; s < STEPS; s++) {
        alloy_host_tensor a[2], b[2];
        step(cpu, v, s, a);
        step(gpu, v, s, b);
        double dl = distance(a[0].dtype, a[0].data, b[0].dtype, b[0].data, (int64_t)ROWS * v);
        double la = test_decode(a[1].dtype, a[1].data, 0), lb = test_decode(b[1].dtype, b[1].data, 0);
        double rel = fabs(la - lb) / fmax(fabs(la), 1e-6);
        if (!(dl <= tol)) fail_msg("step %d: logits differ by %.3g (> %.3g)", s, dl, tol);
        if (!(rel <= tol)) fail_msg("step %d: loss %.9g on the CPU, %.9g emulated (relative %.3g > %.3g)", s, la, lb, rel, tol);
        worst_logits = fmax(worst_logits, dl), worst_loss = fmax(worst_loss, rel);
    }
    double worst_state = 0;
    for (int i = 0; i < n; i++) {
        alloy_host_tensor ta, tb;
        expect_ok(cpu, alloy_graph_state_at(cpu, i, &ta), "state_at");
        expect_ok(gpu, alloy_graph_get_state(gpu, ta.name, &tb), ta.name);
        double d = distance(ta.dtype, ta.data, tb.dtype, tb.data, alloy_host_tensor_numel(&ta));
        if (!(d <= tol)) fail_msg("state '%s' differs by %.3g (> %.3g)", ta.name, d, tol);
        worst_state = fmax(worst_state, d);
    }
    print_message("%d classes, %s: worst logits %.3g, loss %.3g, state %.3g; tolerance %.3g\n", v, alloy_dtype_name(amp),
                  worst_logits, worst_loss, worst_state, tol);
    assert_padded_plan(gpu, v);
    alloy_graph_free(cpu);
    alloy_graph_free(gpu);
    rt_backend_set_cuda_opener(NULL);
}

static void test_37_classes_in_f16_match_the_cpu_with_padded_gemms(void **state)
{
    (void)state;
    against_cpu(37, ALLOY_F16);
}

static void test_101_classes_in_f16_match_the_cpu_with_padded_gemms(void **state)
{
    (void)state;
    against_cpu(101, ALLOY_F16);
}

static void test_37_classes_in_bf16_match_the_cpu_with_padded_gemms(void **state)
{
    (void)state;
    against_cpu(37, ALLOY_BF16);
}

static void test_101_classes_in_bf16_match_the_cpu_with_padded_gemms(void **state)
{
    (void)state;
    against_cpu(101, ALLOY_BF16);
}

/* 9001 classes: the row kernels stream the row (online max and sum, the form of GPT-2's 50257). */
static void test_9001_classes_in_f16_stream_their_padded_rows_as_on_the_cpu(void **state)
{
    (void)state;
    against_cpu(9001, ALLOY_F16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_37_classes_in_f16_match_the_cpu_with_padded_gemms),
        cmocka_unit_test(test_101_classes_in_f16_match_the_cpu_with_padded_gemms),
        cmocka_unit_test(test_37_classes_in_bf16_match_the_cpu_with_padded_gemms),
        cmocka_unit_test(test_101_classes_in_bf16_match_the_cpu_with_padded_gemms),
        cmocka_unit_test(test_9001_classes_in_f16_stream_their_padded_rows_as_on_the_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
