/* test_amp_cuda.c - amp_check and amp_stats on the CUDA backend (the host emulation of the device) against the CPU backend: the overflow locator names the same node, forward and backward, in a fused group and in a GEMM's product; the statistics give the same max |x| bits and underflow counts; the options change no bit of the step. */
#include <ctype.h>
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
#include "base/convert.h"
#include "cuda_emu/emu_device.h"
#include "cuda_emu/emu_loader.h"
#include "cuda_emu/emu_use.h"
#include "models.h"
#include "runtime/backend.h"
#include "support.h"

enum { N = 4, ROWS = 4, IN = 8, OUT = 4 };

/* The graphs of test_overflow_locator: p = x * f16(w) (w = 1), then e =
 * exp(p) (kind 'e') or q = square(p) (kind 'q') in f16; loss =
 * reduce_sum(f32(...)); SGD, the dynamic scaler at 1024. */
static alloy_graph *ew_graph(const char *device, char kind, bool check, bool stats)
{
    alloy_graph *g = alloy_graph_new("locate");
    assert_non_null(g);
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F16, 1, (int64_t[]){N});
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 1, (int64_t[]){N}, alloy_init_ones());
    alloy_tensor *p = alloy_set_name(g, alloy_mul(g, x, alloy_cast(g, w, ALLOY_F16)), "p");
    alloy_tensor *y = kind == 'e' ? alloy_set_name(g, alloy_exp(g, p), "e") : alloy_set_name(g, alloy_square(g, p), "q");
    alloy_tensor *loss = alloy_set_name(g, alloy_reduce_sum(g, alloy_cast(g, y, ALLOY_F32), 0, NULL, false), "loss");
    expect_ok(g, alloy_output(g, "loss", loss), "output");
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    sc.init_scale = 1024;
    expect_ok(g, alloy_graph_set_grad_scaler(g, sc), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.001, 0, 0, false)), "add_optimizer");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    if (check) expect_ok(g, alloy_graph_set_option(g, "amp_check", "1"), "set_option");
    if (stats) expect_ok(g, alloy_graph_set_option(g, "amp_stats", "1"), "set_option");
    return g;
}

/* h = relu(x @ w + b) in f16 (x: ROWS x IN, w: IN x OUT, every f16 value
 * a small integer so that each product and sum is exact in any order),
 * loss = reduce_sum(f32(h * h)): a GEMM with a fused epilogue whose f32
 * product is checked before it is rounded. */
static alloy_graph *gemm_graph(const char *device, bool check, bool stats)
{
    alloy_graph *g = alloy_graph_new("gemm");
    assert_non_null(g);
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F16, 2, (int64_t[]){ROWS, IN});
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 2, (int64_t[]){IN, OUT}, alloy_init_ones());
    alloy_tensor *b = alloy_param(g, "b", ALLOY_F32, 1, (int64_t[]){OUT}, alloy_init_ones());
    alloy_tensor *mm = alloy_set_name(g, alloy_matmul(g, x, alloy_cast(g, w, ALLOY_F16), false, false), "mm");
    alloy_tensor *h = alloy_set_name(g, alloy_relu(g, alloy_add(g, mm, alloy_cast(g, b, ALLOY_F16))), "h");
    alloy_tensor *loss = alloy_set_name(g, alloy_reduce_sum(g, alloy_cast(g, alloy_mul(g, h, h), ALLOY_F32), 0, NULL,
                                                            false), "loss");
    expect_ok(g, alloy_output(g, "loss", loss), "output");
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    sc.init_scale = 1;
    expect_ok(g, alloy_graph_set_grad_scaler(g, sc), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0, 0, 0, false)), "add_optimizer");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    if (check) expect_ok(g, alloy_graph_set_option(g, "amp_check", "1"), "set_option");
    if (stats) expect_ok(g, alloy_graph_set_option(g, "amp_stats", "1"), "set_option");
    return g;
}

static void run_ew(alloy_graph *g, double v)
{
    uint16_t x[N];
    for (int i = 0; i < N; i++) x[i] = cvt_f64_to_f16(v * (i + 1) / N);
    alloy_host_tensor feed = {"x", ALLOY_F16, 1, {N}, x};
    expect_ok(g, alloy_graph_run(g, &feed, 1, NULL, 0), "run");
}

/* x[r][c] = v * (r + c + 1) / 16 (below f16's smallest normal for the
 * smallest when v is 0.0005). */
static void run_gemm(alloy_graph *g, double v)
{
    uint16_t x[ROWS * IN];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < IN; c++) x[r * IN + c] = cvt_f64_to_f16(v * (r + c + 1) / 16);
    alloy_host_tensor feed = {"x", ALLOY_F16, 2, {ROWS, IN}, x};
    expect_ok(g, alloy_graph_run(g, &feed, 1, NULL, 0), "run");
}

static alloy_overflow_info info_of(alloy_graph *g)
{
    alloy_overflow_info o;
    expect_ok(g, alloy_graph_overflow_info(g, &o), "overflow_info");
    return o;
}

/* The two reports agree field by field (the scale included); with ids
 * false, the labels of unnamed nodes ("%76") are left out: the CUDA
 * pipeline lowers some ops otherwise (layer_norm), so the two compiled
 * graphs number their nodes differently. */
static void assert_same_report_as(const alloy_overflow_info *cpu, const alloy_overflow_info *cuda, bool ids)
{
    assert_true(cpu->checked && cuda->checked);
    assert_int_equal(cpu->found, cuda->found);
    assert_true(cpu->has_inf == cuda->has_inf && cpu->has_nan == cuda->has_nan);
    if (ids || !isdigit((unsigned char)cpu->node[1])) assert_string_equal(cpu->node, cuda->node);
    if (!cpu->found) return;
    assert_string_equal(cpu->op, cuda->op);
    assert_int_equal(cpu->dtype, cuda->dtype);
    assert_int_equal(cpu->rank, cuda->rank);
    for (int d = 0; d < cpu->rank; d++) assert_int_equal(cpu->dims[d], cuda->dims[d]);
    assert_int_equal(cpu->backward, cuda->backward);
    assert_true((cpu->forward_op == NULL) == (cuda->forward_op == NULL));
    if (cpu->forward_op) assert_string_equal(cpu->forward_op, cuda->forward_op);
    if (ids || !isdigit((unsigned char)cpu->forward_node[1])) assert_string_equal(cpu->forward_node, cuda->forward_node);
    assert_string_equal(cpu->param, cuda->param);
    if (ids) assert_string_equal(cpu->summary, cuda->summary);
    assert_int_equal(cpu->input_max_known, cuda->input_max_known);
    if (cpu->input_max_known) assert_true(cpu->input_max_abs == cuda->input_max_abs);
}

static void assert_same_report(const alloy_overflow_info *cpu, const alloy_overflow_info *cuda)
{
    assert_same_report_as(cpu, cuda, true);
}

static void test_a_forward_overflow_is_named_at_the_same_exp_on_cpu_and_cuda(void **state)
{
    (void)state;
    use_emulation();
    alloy_graph *cpu = ew_graph("cpu", 'e', true, false), *cuda = ew_graph("cuda", 'e', true, false);
    run_ew(cpu, 1.0), run_ew(cuda, 1.0); /* finite: nothing flagged, on both */
    alloy_overflow_info a = info_of(cpu), b = info_of(cuda);
    assert_true(b.checked && !b.found);
    assert_same_report(&a, &b);
    run_ew(cpu, 48.0), run_ew(cuda, 48.0); /* p = 12 .. 48: exp overflows */
    a = info_of(cpu), b = info_of(cuda);
    assert_true(b.found && !b.backward);
    assert_string_equal(b.summary, "first inf at %e exp f16[4] (forward), scale 1024 -> 512");
    assert_same_report(&a, &b);
    alloy_graph_free(cpu), alloy_graph_free(cuda);
}

static void test_a_backward_overflow_is_named_with_the_same_forward_node_on_cpu_and_cuda(void **state)
{
    (void)state;
    use_emulation();
    alloy_graph *cpu = ew_graph("cpu", 'q', true, false), *cuda = ew_graph("cuda", 'q', true, false);
    run_ew(cpu, 200.0), run_ew(cuda, 200.0); /* q fits f16; its gradient 2 * 200 * 1024 does not */
    alloy_overflow_info a = info_of(cpu), b = info_of(cuda);
    assert_true(b.found && b.backward);
    assert_string_equal(b.op, "square_grad");
    assert_string_equal(b.forward_node, "%q");
    assert_string_equal(b.param, "w");
    assert_same_report(&a, &b);
    alloy_graph_free(cpu), alloy_graph_free(cuda);
}

/* With amp_stats on, the report gives the largest |x| among the flagged
 * node's operands in that run: exp's operand p = 12 .. 48. */
static void test_the_report_gives_the_operands_max_abs_when_amp_stats_is_on(void **state)
{
    (void)state;
    use_emulation();
    alloy_graph *cpu = ew_graph("cpu", 'e', true, true), *cuda = ew_graph("cuda", 'e', true, true);
    run_ew(cpu, 100.0), run_ew(cuda, 100.0); /* an earlier run's larger p is not this run's */
    run_ew(cpu, 48.0), run_ew(cuda, 48.0);
    alloy_overflow_info a = info_of(cpu), b = info_of(cuda);
    assert_true(b.found && b.input_max_known && b.input_max_abs == 48.0);
    assert_string_equal(b.summary, "first inf at %e exp f16[4] (forward), inputs max |x| 48, scale 512 -> 256");
    assert_same_report(&a, &b);
    assert_true(a.input_max_known && a.input_max_abs == b.input_max_abs);
    alloy_graph_free(cpu), alloy_graph_free(cuda);
}

static void test_a_gemm_product_that_overflows_is_named_on_cpu_and_cuda(void **state)
{
    (void)state;
    use_emulation();
    alloy_graph *cpu = gemm_graph("cpu", true, false), *cuda = gemm_graph("cuda", true, false);
    run_gemm(cpu, 1.0), run_gemm(cuda, 1.0);
    alloy_overflow_info a = info_of(cpu), b = info_of(cuda);
    assert_true(b.checked && !b.found);
    /* x = 2048 (r + c + 1), exact in f16; a row of eight summed is past
     * 65504 in the f32 product, before any f16 store */
    run_gemm(cpu, 32768.0), run_gemm(cuda, 32768.0);
    a = info_of(cpu), b = info_of(cuda);
    assert_true(b.found && !b.backward);
    assert_string_equal(b.node, "%mm");
    assert_same_report(&a, &b);
    alloy_graph_free(cpu), alloy_graph_free(cuda);
}

/* The step's loss, scale and state, bit for bit, over steps that skip and
 * steps that do not, with the options on and off, on the device. */
static void test_amp_check_and_amp_stats_leave_every_bit_of_the_cuda_step_as_it_was(void **state)
{
    (void)state;
    use_emulation();
    static const double xs[] = {1.0, 200.0, 3.0, 0.5, 200.0, 2.0};
    alloy_graph *on = ew_graph("cuda", 'q', true, true), *off = ew_graph("cuda", 'q', false, false);
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        run_ew(on, xs[i]), run_ew(off, xs[i]);
        alloy_step_info a, b;
        expect_ok(on, alloy_graph_step_info(on, &a), "step_info");
        expect_ok(off, alloy_graph_step_info(off, &b), "step_info");
        assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
        assert_true(a.skipped == b.skipped && a.next_scale == b.next_scale);
        assert_true(info_of(on).checked && !info_of(off).checked);
    }
    snapshot s_on = take_snapshot(on), s_off = take_snapshot(off);
    assert_int_equal(s_on.n, s_off.n);
    for (int i = 0; i < s_on.n; i++) {
        assert_string_equal(s_on.names[i], s_off.names[i]);
        assert_memory_equal(s_on.data[i], s_off.data[i], s_on.bytes[i]);
    }
    free_snapshot(&s_on), free_snapshot(&s_off);
    alloy_graph_free(on), alloy_graph_free(off);
}

/* A model's f16 AMP step on device: the MLP (kind 'm') or the transformer
 * block ('b'), AdamW, the dynamic scaler at init_scale, amp_check on. */
static alloy_graph *model_step(const char *device, char kind, double init_scale)
{
    alloy_graph *g = alloy_graph_new(kind == 'm' ? "mlp" : "block");
    alloy_graph_set_seed(g, 11);
    alloy_tensor *loss = kind == 'm' ? build_mlp(g, ALLOY_F32, 16, 12, 32, 10).loss
                                     : build_transformer_block(g, ALLOY_F32, 2, 8, 24, 16, 2).loss;
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    expect_ok(g, alloy_graph_enable_amp(g, ALLOY_F16), "enable_amp");
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    sc.init_scale = init_scale;
    expect_ok(g, alloy_graph_set_grad_scaler(g, sc), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01)), "add_optimizer");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    expect_ok(g, alloy_graph_set_option(g, "amp_check", "1"), "set_option");
    return g;
}

static void run_model(alloy_graph *g, char kind, double xscale)
{
    static float x[16 * 12];
    static int32_t targets[16], tokens[16];
    for (int i = 0; i < 16 * 12; i++) x[i] = (float)(xscale * (((i * 37) % 23) - 11) / 11.0);
    for (int i = 0; i < 16; i++) targets[i] = (i * 7) % 10, tokens[i] = (i * 5) % 24;
    if (kind == 'm') {
        alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {16, 12}, x}, {"targets", ALLOY_I32, 1, {16}, targets}};
        expect_ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), "run");
    } else {
        alloy_host_tensor feeds[2] = {{"tokens", ALLOY_I32, 2, {2, 8}, tokens}, {"targets", ALLOY_I32, 1, {16}, targets}};
        expect_ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), "run");
    }
}

/* Whole models, where many kernels of every kind check: a forward overflow
 * in the MLP's first GEMM (inputs up to 3e4), and a backward one in the
 * transformer block at a loss scale of 2^40 (the first backward value is
 * past f16 at once); the first flagged node is the same on both. */
static void test_whole_models_name_the_same_first_node_on_cpu_and_cuda(void **state)
{
    (void)state;
    use_emulation();
    alloy_graph *cpu = model_step("cpu", 'm', 1024), *cuda = model_step("cuda", 'm', 1024);
    run_model(cpu, 'm', 1.0), run_model(cuda, 'm', 1.0);
    alloy_overflow_info a = info_of(cpu), b = info_of(cuda);
    assert_true(b.checked && !b.found);
    assert_same_report_as(&a, &b, false);
    run_model(cpu, 'm', 3e4), run_model(cuda, 'm', 3e4);
    a = info_of(cpu), b = info_of(cuda);
    assert_true(b.found && !b.backward);
    assert_same_report_as(&a, &b, false);
    alloy_graph_free(cpu), alloy_graph_free(cuda);
    cpu = model_step("cpu", 'b', 0x1p40), cuda = model_step("cuda", 'b', 0x1p40);
    run_model(cpu, 'b', 1.0), run_model(cuda, 'b', 1.0);
    a = info_of(cpu), b = info_of(cuda);
    assert_true(b.found && b.backward);
    assert_string_equal(b.op, "cast"); /* cross_entropy_grad's f32 rows, scaled by 2^40, cast to f16 */
    assert_same_report_as(&a, &b, false);
    alloy_graph_free(cpu), alloy_graph_free(cuda);
}

/* Every entry of the two graphs' statistics: the same values, max |x|
 * bit for bit, the same underflow fraction and element count. */
static void assert_same_stats(alloy_graph *cpu, alloy_graph *cuda)
{
    int n = alloy_graph_amp_stats_count(cpu);
    assert_true(n > 0);
    assert_int_equal(alloy_graph_amp_stats_count(cuda), n);
    for (int i = 0; i < n; i++) {
        alloy_amp_stat a, b;
        expect_ok(cpu, alloy_graph_amp_stats_at(cpu, i, &a), "amp_stats_at");
        expect_ok(cuda, alloy_graph_amp_stats_at(cuda, i, &b), "amp_stats_at");
        assert_string_equal(a.node, b.node);
        if (memcmp(&a.max_abs, &b.max_abs, sizeof a.max_abs) != 0)
            fail_msg("%s: max |x| %a on the CPU, %a on the device", a.node, a.max_abs, b.max_abs);
        assert_memory_equal(&a.underflow, &b.underflow, sizeof a.underflow);
        assert_int_equal(a.elements, b.elements);
        assert_int_equal(a.nan, b.nan);
    }
}

static void test_range_statistics_are_the_cpus_bit_for_bit_on_the_device(void **state)
{
    (void)state;
    use_emulation();
    alloy_graph *cpu = ew_graph("cpu", 'q', false, true), *cuda = ew_graph("cuda", 'q', false, true);
    static const double xs[] = {3.0, 0.0003, 200.0, 1e-6}; /* squares past 65504; squares below 2^-14 */
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) run_ew(cpu, xs[i]), run_ew(cuda, xs[i]);
    assert_same_stats(cpu, cuda);
    bool tiny = false; /* the steps at 0.0003 and 1e-6 square p to below 2^-14 */
    for (int i = 0; i < alloy_graph_amp_stats_count(cuda); i++) {
        alloy_amp_stat s;
        expect_ok(cuda, alloy_graph_amp_stats_at(cuda, i, &s), "amp_stats_at");
        tiny |= s.underflow > 0;
    }
    assert_true(tiny);
    alloy_graph_free(cpu), alloy_graph_free(cuda);
    cpu = gemm_graph("cpu", true, true), cuda = gemm_graph("cuda", true, true);
    static const double gs[] = {1.0, 0.0005, 32768.0};
    for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++) run_gemm(cpu, gs[i]), run_gemm(cuda, gs[i]);
    assert_same_stats(cpu, cuda);
    bool seen = false;
    for (int i = 0; i < alloy_graph_amp_stats_count(cuda); i++) {
        alloy_amp_stat s;
        expect_ok(cuda, alloy_graph_amp_stats_at(cuda, i, &s), "amp_stats_at");
        if (strcmp(s.node, "%mm") != 0) continue;
        /* the unrounded f32 product: row 3, 2048 * (4 + 5 + ... + 11), past f16's 65504 */
        assert_true(s.max_abs == 2048.0 * 60);
        seen = true;
    }
    assert_true(seen);
    alloy_graph_free(cpu), alloy_graph_free(cuda);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_forward_overflow_is_named_at_the_same_exp_on_cpu_and_cuda),
        cmocka_unit_test(test_a_backward_overflow_is_named_with_the_same_forward_node_on_cpu_and_cuda),
        cmocka_unit_test(test_the_report_gives_the_operands_max_abs_when_amp_stats_is_on),
        cmocka_unit_test(test_a_gemm_product_that_overflows_is_named_on_cpu_and_cuda),
        cmocka_unit_test(test_whole_models_name_the_same_first_node_on_cpu_and_cuda),
        cmocka_unit_test(test_amp_check_and_amp_stats_leave_every_bit_of_the_cuda_step_as_it_was),
        cmocka_unit_test(test_range_statistics_are_the_cpus_bit_for_bit_on_the_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
