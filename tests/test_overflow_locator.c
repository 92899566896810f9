/* test_overflow_locator.c - amp_check on the CPU: the first inf/NaN of a skipped step named in the forward (a large exp) and in the backward (a square whose gradient overflows f16), the report's line, the stop rule's message carrying it, and the same bits with the check on and off. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "base/convert.h"
#include "models.h"
#include "support.h"

enum { N = 4 };

/* p = x * f16(w) in f16 (w = 1), then e = exp(p) (kind 'e') or q = square(p)
 * (kind 'q') in f16; loss = reduce_sum(f32(...)). exp overflows f16 for
 * p > 11.09 (e^12 = 162755); square's gradient 2 * p * dq overflows for p
 * = 200 once dq = scale is 1024 (819200), while its value 40000 fits. */
static alloy_graph *f16_graph(char kind, bool check, double init_scale)
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
    sc.init_scale = init_scale;
    expect_ok(g, alloy_graph_set_grad_scaler(g, sc), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.001, 0, 0, false)), "add_optimizer");
    if (check) expect_ok(g, alloy_graph_set_option(g, "amp_check", "1"), "set_option");
    return g;
}

static alloy_status run_x(alloy_graph *g, double v)
{
    uint16_t x[N];
    for (int i = 0; i < N; i++) x[i] = cvt_f64_to_f16(v * (i + 1) / N);
    alloy_host_tensor feed = {"x", ALLOY_F16, 1, {N}, x};
    return alloy_graph_run(g, &feed, 1, NULL, 0);
}

static alloy_overflow_info info_of(alloy_graph *g)
{
    alloy_overflow_info o;
    expect_ok(g, alloy_graph_overflow_info(g, &o), "overflow_info");
    return o;
}

static void test_a_forward_overflow_is_named_at_the_exp_that_made_it(void **state)
{
    (void)state;
    /* scale 1024: the seed's gradient of e is 1024 in f16 (65536, the
     * default, is f16's inf: every step would skip at that cast) */
    alloy_graph *g = f16_graph('e', true, 1024);
    expect_ok(g, run_x(g, 1.0), "run"); /* e^1 at most: finite */
    alloy_overflow_info o = info_of(g);
    if (!o.checked || o.found) fail_msg("a finite step: %s", o.summary);
    expect_ok(g, run_x(g, 48.0), "run"); /* p = 12 .. 48: exp overflows */
    alloy_step_info s;
    expect_ok(g, alloy_graph_step_info(g, &s), "step_info");
    assert_true(s.skipped);
    o = info_of(g);
    assert_true(o.found && o.has_inf && !o.has_nan && !o.backward);
    assert_string_equal(o.node, "%e");
    assert_string_equal(o.op, "exp");
    assert_int_equal(o.dtype, ALLOY_F16);
    assert_true(o.rank == 1 && o.dims[0] == N);
    assert_string_equal(o.summary, "first inf at %e exp f16[4] (forward), scale 1024 -> 512");
    alloy_graph_free(g);
}

static void test_a_backward_overflow_is_named_with_its_forward_node_and_parameter(void **state)
{
    (void)state;
    alloy_graph *g = f16_graph('q', true, 1024);
    expect_ok(g, run_x(g, 200.0), "run"); /* q <= 40000 fits f16; dq = 1024, dp = 2 * 200 * 1024 does not */
    alloy_step_info s;
    expect_ok(g, alloy_graph_step_info(g, &s), "step_info");
    assert_true(s.skipped && isfinite(s.loss));
    alloy_overflow_info o = info_of(g);
    assert_true(o.found && o.backward && o.has_inf);
    assert_string_equal(o.op, "square_grad");
    assert_string_equal(o.forward_node, "%q");
    assert_string_equal(o.forward_op, "square");
    assert_string_equal(o.param, "w");
    char want[256];
    snprintf(want, sizeof want, "first inf at %s square_grad f16[4] (backward of square %%q, gradient of 'w'), "
                                "scale 1024 -> 512", o.node);
    assert_string_equal(o.summary, want);
    alloy_graph_free(g);
}

/* The IR text of a bundle carries each backward node's origin (!origin=),
 * so a bundle's report names the forward node as the compiled graph's does. */
static void test_a_bundles_report_says_backward_of_which_node_as_the_graphs_does(void **state)
{
    (void)state;
    alloy_graph *g = f16_graph('q', true, 1024);
    char path[] = "/tmp/alloy_locator_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    expect_ok(g, run_x(g, 200.0), "run");
    alloy_overflow_info want = info_of(g);
    assert_true(want.found && want.backward && want.forward_node[0]);
    alloy_bundle *b = NULL;
    char err[512];
    setenv("ALLOY_AMP_CHECK", "1", 1);
    alloy_status st = alloy_bundle_load(path, &b, err, sizeof err);
    unsetenv("ALLOY_AMP_CHECK");
    remove(path);
    if (st) fail_msg("bundle_load: %s", err);
    uint16_t x[N];
    for (int i = 0; i < N; i++) x[i] = cvt_f64_to_f16(200.0 * (i + 1) / N);
    alloy_host_tensor feed = {"x", ALLOY_F16, 1, {N}, x};
    assert_int_equal(alloy_bundle_run(b, &feed, 1, NULL, 0), ALLOY_OK);
    alloy_overflow_info o;
    assert_int_equal(alloy_bundle_overflow_info(b, &o), ALLOY_OK);
    assert_true(o.found && o.backward);
    assert_string_equal(o.forward_node, "%q");
    assert_string_equal(o.forward_op, "square");
    assert_string_equal(o.summary, want.summary);
    alloy_bundle_free(b);
    alloy_graph_free(g);
}

static void test_the_stop_rules_message_carries_the_locators_line(void **state)
{
    (void)state;
    alloy_graph *g = f16_graph('e', true, 1024);
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    sc.init_scale = 1024;
    sc.max_consecutive_skips = 2;
    expect_ok(g, alloy_graph_set_grad_scaler(g, sc), "set_grad_scaler");
    expect_ok(g, run_x(g, 48.0), "run");
    assert_int_equal(run_x(g, 48.0), ALLOY_ERR_DIVERGED);
    assert_string_equal(alloy_last_error(g), "training diverged at step 2: 2 skipped steps in a row reached "
                                             "max_consecutive_skips (scale 512); the state is the last good "
                                             "step's (optimizer step 0, scale 1024); first inf at %e exp f16[4] "
                                             "(forward)");
    alloy_graph_free(g);
}

static void test_amp_check_leaves_every_bit_of_the_step_as_it_was(void **state)
{
    (void)state;
    static const double xs[] = {1.0, 200.0, 3.0, 0.5, 200.0, 2.0};
    alloy_graph *on = f16_graph('q', true, 1024), *off = f16_graph('q', false, 1024);
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        expect_ok(on, run_x(on, xs[i]), "run");
        expect_ok(off, run_x(off, xs[i]), "run");
        alloy_step_info a, b;
        expect_ok(on, alloy_graph_step_info(on, &a), "step_info");
        expect_ok(off, alloy_graph_step_info(off, &b), "step_info");
        assert_memory_equal(&a.loss, &b.loss, sizeof a.loss);
        assert_true(a.skipped == b.skipped && a.next_scale == b.next_scale);
        assert_true(info_of(on).checked && !info_of(off).checked && !info_of(off).found);
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

static void test_a_finite_transformer_step_flags_nothing_though_its_mask_holds_minus_inf(void **state)
{
    (void)state;
    /* the written-out attention: causal_mask puts -inf above the diagonal,
     * softmax turns it into zeros; neither is an overflow. Fused, the mask
     * is never stored; with no_fuse every node is a step of its own. */
    for (int fuse = 0; fuse < 2; fuse++) {
        alloy_graph *g = alloy_graph_new("block");
        assert_non_null(g);
        test_block m = build_transformer_block(g, ALLOY_F32, 2, 4, 11, 8, 2);
        expect_ok(g, alloy_graph_set_loss(g, m.loss), "set_loss");
        expect_ok(g, alloy_graph_enable_amp(g, ALLOY_F16), "enable_amp");
        expect_ok(g, alloy_graph_set_option(g, "disable_passes", "attention"), "set_option");
        expect_ok(g, alloy_graph_set_option(g, "no_fuse", fuse ? "" : "all"), "set_option");
        expect_ok(g, alloy_graph_set_option(g, "amp_check", "1"), "set_option");
        alloy_grad_scaler sc = alloy_dynamic_scaler();
        sc.init_scale = 1024;
        expect_ok(g, alloy_graph_set_grad_scaler(g, sc), "set_grad_scaler");
        expect_ok(g, alloy_graph_add_optimizer(g, alloy_adam(0.001, 0.9, 0.999, 1e-8, 0)), "add_optimizer");
        int32_t tokens[8], targets[8];
        for (int i = 0; i < 8; i++) tokens[i] = (i * 7 + 3) % 11, targets[i] = (i * 5 + 1) % 11;
        alloy_host_tensor feeds[2] = {{"tokens", ALLOY_I32, 2, {2, 4}, tokens},
                                      {"targets", ALLOY_I32, 1, {8}, targets}};
        for (int k = 0; k < 3; k++) {
            expect_ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), "run");
            alloy_step_info s;
            expect_ok(g, alloy_graph_step_info(g, &s), "step_info");
            alloy_overflow_info o = info_of(g);
            if (s.skipped || !o.checked || o.found)
                fail_msg("fuse %d, step %d: skipped %d, %s", fuse, k, s.skipped, o.summary);
        }
        alloy_graph_free(g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_forward_overflow_is_named_at_the_exp_that_made_it),
        cmocka_unit_test(test_a_backward_overflow_is_named_with_its_forward_node_and_parameter),
        cmocka_unit_test(test_a_bundles_report_says_backward_of_which_node_as_the_graphs_does),
        cmocka_unit_test(test_the_stop_rules_message_carries_the_locators_line),
        cmocka_unit_test(test_amp_check_leaves_every_bit_of_the_step_as_it_was),
        cmocka_unit_test(test_a_finite_transformer_step_flags_nothing_though_its_mask_holds_minus_inf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
