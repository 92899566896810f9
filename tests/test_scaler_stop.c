/* test_scaler_stop.c - the scaler's hysteresis against a hand-worked trajectory, and the stop rules (max_consecutive_skips, stop_at_min_scale) ending a run with ALLOY_ERR_DIVERGED and the last good step's state, bit for bit, through the API and a bundle. */
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
#include "support.h"

enum { N = 4 };

/* loss = reduce_sum(x * w) with Adam: d loss / d w = x, so a NaN in x is a
 * skipped step and finite x a good one, whatever the scale. */
static alloy_graph *linear_graph_acc(alloy_grad_scaler sc, int accumulation)
{
    alloy_graph *g = alloy_graph_new("linear");
    assert_non_null(g);
    alloy_graph_set_seed(g, 7);
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 1, (int64_t[]){N});
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 1, (int64_t[]){N}, alloy_init_uniform(-1, 1));
    alloy_tensor *loss = alloy_set_name(g, alloy_reduce_sum(g, alloy_mul(g, x, w), 0, NULL, false), "loss");
    expect_ok(g, alloy_output(g, "loss", loss), "alloy_output");
    expect_ok(g, alloy_graph_set_loss(g, loss), "alloy_graph_set_loss");
    expect_ok(g, alloy_graph_set_grad_scaler(g, sc), "alloy_graph_set_grad_scaler");
    alloy_optimizer adam = alloy_adam(0.01, 0.9, 0.999, 1e-8, 0);
    adam.accumulation_steps = accumulation;
    expect_ok(g, alloy_graph_add_optimizer(g, adam), "alloy_graph_add_optimizer");
    return g;
}

static alloy_graph *linear_graph(alloy_grad_scaler sc) { return linear_graph_acc(sc, 1); }

static alloy_grad_scaler dynamic(double init, int interval)
{
    alloy_grad_scaler s = alloy_dynamic_scaler();
    s.init_scale = init, s.growth_interval = interval;
    return s;
}

/* One step: 'F' finite x, 'N' a NaN in x. Returns the run's status. */
static alloy_status step(alloy_graph *g, char kind, int i)
{
    float x[N];
    for (int k = 0; k < N; k++) x[k] = 0.25f * (float)(k + 1) - 0.125f * (float)(i % 3);
    if (kind == 'N') x[1] = NAN;
    alloy_host_tensor feed = {"x", ALLOY_F32, 1, {N}, x};
    return alloy_graph_run(g, &feed, 1, NULL, 0);
}

static double state_scalar(alloy_graph *g, const char *name)
{
    alloy_host_tensor t;
    expect_ok(g, alloy_graph_get_state(g, name, &t), name);
    assert_int_equal(t.rank, 0);
    if (t.dtype == ALLOY_F32) return *(const float *)t.data;
    assert_int_equal(t.dtype, ALLOY_I32);
    return *(const int32_t *)t.data;
}

/* Every state tensor of g is bit for bit as in s (and g has no other). */
static void expect_state_equal(alloy_graph *g, const snapshot *s)
{
    snapshot now = take_snapshot(g);
    assert_int_equal(now.n, s->n);
    for (int i = 0; i < s->n; i++) {
        alloy_host_tensor t;
        expect_ok(g, alloy_graph_get_state(g, s->names[i], &t), s->names[i]);
        if (memcmp(t.data, s->data[i], s->bytes[i]) != 0) fail_msg("state '%s' is not the last good step's", s->names[i]);
    }
    free_snapshot(&now);
}

static void test_hysteresis_backs_off_after_the_counted_overflows_and_refills_on_growth(void **state)
{
    (void)state;
    /* Megatron's rule, worked by hand for hysteresis 2, growth interval 3,
     * from 1024: an overflow counts h down (floor 0) and backs off when h
     * reaches 0; a growth refills h; the growth tracker restarts on every
     * overflow, backed off or not. */
    static const char pattern[] = "NFNNNFFFNN";
    static const float scale[] = {1024, 1024, 512, 256, 128, 128, 128, 256, 256, 128};
    static const int hyst[] = {1, 1, 0, 0, 0, 0, 0, 2, 1, 0};
    static const int tracker[] = {0, 1, 0, 0, 0, 1, 2, 0, 0, 0};
    alloy_grad_scaler sc = dynamic(1024, 3);
    sc.hysteresis = 2;
    alloy_graph *g = linear_graph(sc);
    for (int i = 0; pattern[i]; i++) {
        expect_ok(g, step(g, pattern[i], i), "run");
        alloy_step_info info;
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        assert_int_equal(info.skipped, pattern[i] == 'N');
        if (state_scalar(g, "scaler.scale") != scale[i] || state_scalar(g, "scaler.hysteresis_tracker") != hyst[i] ||
            state_scalar(g, "scaler.growth_tracker") != tracker[i])
            fail_msg("after step %d ('%c'): scale %g hysteresis %g tracker %g, expected %g %d %d", i, pattern[i],
                     state_scalar(g, "scaler.scale"), state_scalar(g, "scaler.hysteresis_tracker"),
                     state_scalar(g, "scaler.growth_tracker"), (double)scale[i], hyst[i], tracker[i]);
        assert_true(info.next_scale == scale[i]);
    }
    alloy_graph_free(g);
    /* hysteresis 1 (and 0) is PyTorch's rule: no counter in the step */
    sc.hysteresis = 1;
    g = linear_graph(sc);
    expect_ok(g, step(g, 'N', 0), "run");
    assert_true(state_scalar(g, "scaler.scale") == 512);
    alloy_host_tensor t;
    assert_int_equal(alloy_graph_get_state(g, "scaler.hysteresis_tracker", &t), ALLOY_ERR_NOT_FOUND);
    assert_int_equal(alloy_graph_get_state(g, "scaler.consecutive_skips", &t), ALLOY_ERR_NOT_FOUND);
    alloy_graph_free(g);
}

static void test_max_consecutive_skips_ends_the_run_with_the_last_good_steps_state(void **state)
{
    (void)state;
    alloy_grad_scaler sc = dynamic(1024, 2000);
    sc.max_consecutive_skips = 3;
    alloy_graph *g = linear_graph(sc);
    /* a skip in between is forgiven by the good steps after it */
    static const char good[] = "FNNFF";
    for (int i = 0; good[i]; i++) expect_ok(g, step(g, good[i], i), "run");
    snapshot last_good = take_snapshot(g); /* after step 5: 3 updates, 2 skips, scale 256 */
    assert_true(state_scalar(g, "scaler.scale") == 256 && state_scalar(g, "step.skipped_steps") == 2);
    expect_ok(g, step(g, 'N', 5), "run");
    expect_ok(g, step(g, 'N', 6), "run");
    assert_true(state_scalar(g, "scaler.scale") == 64);
    assert_int_equal(step(g, 'N', 7), ALLOY_ERR_DIVERGED);
    assert_string_equal(alloy_last_error(g), "training diverged at step 8: 3 skipped steps in a row reached "
                                             "max_consecutive_skips (scale 64); the state is the last good step's "
                                             "(optimizer step 3, scale 256)");
    alloy_step_info info;
    expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
    assert_true(info.diverged && info.skipped && info.consecutive_skips == 3 && info.scale == 64);
    expect_state_equal(g, &last_good);
    /* the run may go on from there: a good step updates as the one after step 5 would */
    expect_ok(g, step(g, 'F', 8), "run");
    assert_true(state_scalar(g, "optim.step") == 4 && state_scalar(g, "scaler.scale") == 256);
    free_snapshot(&last_good);
    alloy_graph_free(g);
}

static void test_a_run_that_never_succeeds_stops_with_its_initial_state(void **state)
{
    (void)state;
    /* an inf in the data every step: no good step, the state stays the initial one */
    alloy_grad_scaler sc = alloy_static_scaler(4096);
    sc.max_consecutive_skips = 2;
    alloy_graph *g = linear_graph(sc);
    snapshot initial = take_snapshot(g);
    expect_ok(g, step(g, 'N', 0), "run");
    assert_int_equal(step(g, 'N', 1), ALLOY_ERR_DIVERGED);
    assert_string_equal(alloy_last_error(g), "training diverged at step 2: 2 skipped steps in a row reached "
                                             "max_consecutive_skips (scale 4096); the state is the last good step's "
                                             "(optimizer step 0, scale 4096)");
    expect_state_equal(g, &initial);
    free_snapshot(&initial);
    alloy_graph_free(g);
}

static void test_stop_at_min_scale_ends_the_run_when_a_backoff_is_due_at_the_bound(void **state)
{
    (void)state;
    /* DeepSpeed's rule: 8 -> 4 -> 2 = min_scale; the next overflow would back
     * off below it, so the run stops there. */
    alloy_grad_scaler sc = dynamic(8, 2000);
    sc.min_scale = 2, sc.stop_at_min_scale = true;
    alloy_graph *g = linear_graph(sc);
    expect_ok(g, step(g, 'F', 0), "run");
    expect_ok(g, step(g, 'F', 1), "run");
    snapshot last_good = take_snapshot(g);
    expect_ok(g, step(g, 'N', 2), "run");
    expect_ok(g, step(g, 'N', 3), "run");
    assert_true(state_scalar(g, "scaler.scale") == 2);
    assert_int_equal(step(g, 'N', 4), ALLOY_ERR_DIVERGED);
    assert_string_equal(alloy_last_error(g), "training diverged at step 5: inf/NaN gradients with the scale at "
                                             "min_scale (2), 3 skipped steps in a row; the state is the last good "
                                             "step's (optimizer step 2, scale 8)");
    expect_state_equal(g, &last_good);
    free_snapshot(&last_good);
    alloy_graph_free(g);

    sc.hysteresis = 2;
    g = linear_graph(sc);
    /* 8 (h 1), 4 (h 0), 2 (h stays 0: each overflow backs off until a
     * growth refills it), then the fourth is due at the bound */
    for (int i = 0; i < 3; i++) expect_ok(g, step(g, 'N', i), "run");
    assert_true(state_scalar(g, "scaler.scale") == 2 && state_scalar(g, "scaler.hysteresis_tracker") == 0);
    assert_int_equal(step(g, 'N', 3), ALLOY_ERR_DIVERGED);
    assert_true(state_scalar(g, "scaler.scale") == 8 && state_scalar(g, "scaler.hysteresis_tracker") == 2);
    alloy_graph_free(g);
}

static void test_with_accumulation_the_stop_rule_counts_steps_not_micro_batches(void **state)
{
    (void)state;
    /* two micro-batches a step: step 1 (FF) applies; steps 2 (NF) and 3
     * (FN) skip; the second skip in a row ends the run on step 3's last
     * micro-batch, and the state (accumulators and micro-batch counter
     * included) is step 1's */
    alloy_grad_scaler sc = dynamic(1024, 2000);
    sc.max_consecutive_skips = 2;
    alloy_graph *g = linear_graph_acc(sc, 2);
    expect_ok(g, step(g, 'F', 0), "run");
    expect_ok(g, step(g, 'F', 1), "run");
    snapshot last_good = take_snapshot(g);
    static const char micro[] = "NFF";
    for (int i = 0; micro[i]; i++) expect_ok(g, step(g, micro[i], 2 + i), "run");
    assert_true(state_scalar(g, "scaler.scale") == 512 && state_scalar(g, "scaler.consecutive_skips") == 1);
    assert_int_equal(step(g, 'N', 5), ALLOY_ERR_DIVERGED);
    assert_string_equal(alloy_last_error(g), "training diverged at step 3: 2 skipped steps in a row reached "
                                             "max_consecutive_skips (scale 512); the state is the last good step's "
                                             "(optimizer step 1, scale 1024)");
    expect_state_equal(g, &last_good);
    free_snapshot(&last_good);
    alloy_graph_free(g);
}

static void test_a_bundle_keeps_the_stop_rules(void **state)
{
    (void)state;
    alloy_grad_scaler sc = dynamic(1024, 2000);
    sc.max_consecutive_skips = 2, sc.hysteresis = 3;
    alloy_graph *g = linear_graph(sc);
    char path[] = "/tmp/alloy_scaler_stop_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    alloy_graph_free(g);
    alloy_bundle *b = NULL;
    char err[512];
    setenv("ALLOY_AMP_CHECK", "1", 1); /* the locator, from the environment, in a bundle's step */
    alloy_status st = alloy_bundle_load(path, &b, err, sizeof err);
    unsetenv("ALLOY_AMP_CHECK");
    remove(path);
    if (st) fail_msg("bundle_load: %s", err);
    float x[N] = {1, NAN, 2, 3};
    alloy_host_tensor feed = {"x", ALLOY_F32, 1, {N}, x};
    assert_int_equal(alloy_bundle_run(b, &feed, 1, NULL, 0), ALLOY_OK);
    assert_int_equal(alloy_bundle_run(b, &feed, 1, NULL, 0), ALLOY_ERR_DIVERGED);
    assert_non_null(strstr(alloy_bundle_last_error(b), "2 skipped steps in a row reached max_consecutive_skips"));
    /* the NaN is x's own (an input: not checked); the first value it makes is
     * x * w, in the forward */
    alloy_overflow_info o;
    assert_int_equal(alloy_bundle_overflow_info(b, &o), ALLOY_OK);
    assert_true(o.checked && o.found && o.has_nan && !o.backward);
    assert_string_equal(o.op, "mul");
    alloy_host_tensor t;
    assert_int_equal(alloy_bundle_get_state(b, "scaler.hysteresis_tracker", &t), ALLOY_OK);
    assert_int_equal(*(const int32_t *)t.data, 3);
    alloy_bundle_free(b);
}

static void test_bad_stop_rules_are_refused_naming_the_field(void **state)
{
    (void)state;
    alloy_graph *g = linear_graph(alloy_dynamic_scaler());
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    sc.max_consecutive_skips = -1;
    assert_int_equal(alloy_graph_set_grad_scaler(g, sc), ALLOY_ERR_INVALID);
    assert_string_equal(alloy_last_error(g),
                        "set_grad_scaler: max_consecutive_skips is -1; it must be >= 0 (0 = no limit)");
    sc = alloy_dynamic_scaler();
    sc.hysteresis = -2;
    assert_int_equal(alloy_graph_set_grad_scaler(g, sc), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "hysteresis is -2"));
    sc = alloy_dynamic_scaler();
    sc.stop_at_min_scale = true;
    assert_int_equal(alloy_graph_set_grad_scaler(g, sc), ALLOY_ERR_INVALID);
    assert_string_equal(alloy_last_error(g), "set_grad_scaler: stop_at_min_scale needs a min_scale > 0");
    alloy_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hysteresis_backs_off_after_the_counted_overflows_and_refills_on_growth),
        cmocka_unit_test(test_max_consecutive_skips_ends_the_run_with_the_last_good_steps_state),
        cmocka_unit_test(test_a_run_that_never_succeeds_stops_with_its_initial_state),
        cmocka_unit_test(test_stop_at_min_scale_ends_the_run_when_a_backoff_is_due_at_the_bound),
        cmocka_unit_test(test_with_accumulation_the_stop_rule_counts_steps_not_micro_batches),
        cmocka_unit_test(test_a_bundle_keeps_the_stop_rules),
        cmocka_unit_test(test_bad_stop_rules_are_refused_naming_the_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
