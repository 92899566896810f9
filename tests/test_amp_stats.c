/* test_amp_stats.c - range statistics (amp_stats) on the CPU: max |x| and the underflow fraction against f64 references, the same bits with them on and off, the stats file, and range-aware colouring (amp_ranges) ending the skipped steps of a model that overflows f16. */
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
#include "support.h"

enum { N = 8 };

/* p = x * f16(w) and q = square(p), both f16 (w = 1 and never updated:
 * no optimizer), loss = reduce_sum(f32(q)): p is x as f16 holds it and q
 * its square before rounding, exact in f32 (a product of two 11-bit
 * significands), so max |x| has an exact f64 reference. */
static alloy_graph *low_graph(alloy_dtype dt, bool stats)
{
    alloy_graph *g = alloy_graph_new("stats");
    assert_non_null(g);
    alloy_tensor *x = alloy_input(g, "x", dt, 1, (int64_t[]){N});
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 1, (int64_t[]){N}, alloy_init_ones());
    alloy_tensor *p = alloy_set_name(g, alloy_mul(g, x, alloy_cast(g, w, dt)), "p");
    alloy_tensor *q = alloy_set_name(g, alloy_square(g, p), "q");
    alloy_tensor *loss = alloy_set_name(g, alloy_reduce_sum(g, alloy_cast(g, q, ALLOY_F32), 0, NULL, false), "loss");
    expect_ok(g, alloy_output(g, "loss", loss), "output");
    expect_ok(g, alloy_graph_set_option(g, "device", "cpu"), "set_option");
    if (stats) expect_ok(g, alloy_graph_set_option(g, "amp_stats", "1"), "set_option");
    return g;
}

static alloy_graph *f16_graph(bool stats) { return low_graph(ALLOY_F16, stats); }

static void run_x_as(alloy_graph *g, alloy_dtype dt, const double *v)
{
    uint16_t x[N];
    for (int i = 0; i < N; i++) x[i] = dt == ALLOY_F16 ? cvt_f64_to_f16(v[i]) : cvt_f64_to_bf16(v[i]);
    alloy_host_tensor feed = {"x", dt, 1, {N}, x};
    expect_ok(g, alloy_graph_run(g, &feed, 1, NULL, 0), "run");
}

static void run_x(alloy_graph *g, const double *v) { run_x_as(g, ALLOY_F16, v); }

/* The statistics of the value printed as label; fails when untracked. */
static alloy_amp_stat stat_of(alloy_graph *g, const char *label)
{
    alloy_amp_stat s;
    for (int i = 0; i < alloy_graph_amp_stats_count(g); i++) {
        expect_ok(g, alloy_graph_amp_stats_at(g, i, &s), "amp_stats_at");
        if (strcmp(s.node, label) == 0) return s;
    }
    fail_msg("no statistics for %s", label);
    return s;
}

static void test_max_abs_is_the_f64_reference_over_the_steps_before_rounding(void **state)
{
    (void)state;
    alloy_graph *g = f16_graph(true);
    /* step 3 squares 300 to 90000: past f16's 65504, stored as inf, but
     * the statistics see the value before the store rounds it */
    static const double steps[3][N] = {{1, -2, 3, 0.5, 0, 7, -8, 2.25},
                                       {-100.5, 3, 0.125, 9, 1, 1, 1, 1},
                                       {300, -1, 2, 3, 4, 5, 6, 7}};
    double max_p = 0, max_q = 0;
    for (int s = 0; s < 3; s++) {
        run_x(g, steps[s]);
        for (int i = 0; i < N; i++) {
            double p = test_round_to(ALLOY_F16, steps[s][i]); /* exact in f16: no rounding */
            max_p = fmax(max_p, fabs(p));
            max_q = fmax(max_q, p * p);
        }
        alloy_amp_stat sp = stat_of(g, "%p"), sq = stat_of(g, "%q");
        assert_true(sp.max_abs == max_p);
        assert_true(sq.max_abs == max_q);
        assert_int_equal(sp.elements, (s + 1) * N);
        assert_int_equal(sp.dtype, ALLOY_F16);
        assert_string_equal(sq.op, "square");
        assert_false(sp.backward);
        assert_true(fabs(sp.headroom - log2(65504.0 / max_p)) < 1e-12);
    }
    assert_true(stat_of(g, "%q").max_abs == 90000.0);
    assert_true(stat_of(g, "%q").headroom < 0); /* it overflowed */
    /* a recompile starts again */
    expect_ok(g, alloy_graph_set_option(g, "num_threads", "1"), "set_option");
    assert_int_equal(alloy_graph_amp_stats_count(g), 0);
    alloy_graph_free(g);
}

static void test_underflow_fraction_counts_nonzero_values_below_the_f16_normal(void **state)
{
    (void)state;
    alloy_graph *g = f16_graph(true);
    /* p: 2 subnormal (1e-5, -3e-5), a zero (not counted), 5 normal; q = p^2:
     * 1e-10, 9e-10, 1e-4^2 = 1e-8 and 6.1e-5^2 flush; 0.01^2 = 1e-4 does not */
    static const double v[N] = {1e-5, -3e-5, 0, 1e-4, 0x1p-14, 0.01, 1, -2};
    run_x(g, v);
    int tiny_p = 0, tiny_q = 0;
    for (int i = 0; i < N; i++) {
        double p = test_round_to(ALLOY_F16, v[i]), q = p * p;
        tiny_p += p != 0 && fabs(p) < 0x1p-14;
        tiny_q += q != 0 && q < 0x1p-14;
    }
    assert_int_equal(tiny_p, 2);
    assert_int_equal(tiny_q, 4);
    assert_true(stat_of(g, "%p").underflow == (double)tiny_p / N);
    assert_true(stat_of(g, "%q").underflow == (double)tiny_q / N);
    run_x(g, (const double[N]){1, 1, 1, 1, 1, 1, 1, 1}); /* none: the fraction halves */
    assert_true(stat_of(g, "%q").underflow == (double)tiny_q / (2 * N));
    alloy_graph_free(g);
}

static void test_bf16_values_measure_against_bf16s_range(void **state)
{
    (void)state;
    alloy_graph *g = low_graph(ALLOY_BF16, true);
    /* 1e30 fits bf16 (max 3.39e38) but its square 1e60 does not; 1e-20
     * is normal in bf16 (f16 would flush it), 1e-39 is a bf16 subnormal */
    static const double v[N] = {1e30, -2, 1e-20, 1e-39, 0, 1, 3, 4};
    run_x_as(g, ALLOY_BF16, v);
    double p0 = test_round_to(ALLOY_BF16, 1e30);
    alloy_amp_stat sp = stat_of(g, "%p"), sq = stat_of(g, "%q");
    assert_int_equal(sp.dtype, ALLOY_BF16);
    assert_true(sp.max_abs == p0);
    assert_true(fabs(sp.headroom - log2(0x1.fep127 / p0)) < 1e-12);
    assert_true(sp.underflow == 1.0 / N); /* 1e-39 alone */
    assert_true(isinf(sq.max_abs)); /* 1e60 is inf in the f32 the loop computes in */
    assert_true(sq.headroom < 0);
    alloy_graph_free(g);
}

/* overflow.ir (tests/data): a two-matmul classifier trained with f16 AMP,
 * adamw and the dynamic scaler, fed batch s % 2 of file at step s. */
typedef struct feeds {
    alloy_safetensors *file;
    const alloy_host_tensor *x, *labels;
} feeds;

static feeds load_feeds(const char *name)
{
    feeds f = {0};
    char err[512] = "";
    if (alloy_safetensors_load(test_path_in(ALLOY_TEST_DATA, name), &f.file, err, sizeof err))
        fail_msg("%s: %s", name, err);
    f.x = alloy_safetensors_find(f.file, "x");
    f.labels = alloy_safetensors_find(f.file, "labels");
    assert_true(f.x && f.labels);
    return f;
}

static alloy_graph *overflow_graph(const char *stats, const char *ranges)
{
    char err[512] = "";
    alloy_graph *g = alloy_graph_load_ir(test_path_in(ALLOY_TEST_DATA, "overflow.ir"), err, sizeof err);
    if (!g) fail_msg("overflow.ir: %s", err);
    expect_ok(g, alloy_graph_set_training(g, true), "set_training");
    expect_ok(g, alloy_graph_enable_amp(g, ALLOY_F16), "enable_amp");
    expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_adamw(0.001, 0.9, 0.999, 1e-8, 0.01)), "add_optimizer");
    expect_ok(g, alloy_graph_set_option(g, "device", "cpu"), "set_option");
    if (stats) expect_ok(g, alloy_graph_set_option(g, "amp_stats", stats), "set_option");
    if (ranges) expect_ok(g, alloy_graph_set_option(g, "amp_ranges", ranges), "set_option");
    return g;
}

/* Runs steps [first, first + n) of g; the steps it skipped. */
static int train(alloy_graph *g, const feeds *f, int first, int n)
{
    int skipped = 0;
    for (int s = first; s < first + n; s++) {
        size_t xb = (size_t)alloy_host_tensor_numel(f->x) / 2 * 4, lb = (size_t)alloy_host_tensor_numel(f->labels) / 2 * 4;
        alloy_host_tensor in[2] = {{"x", ALLOY_F32, 2, {4, 8}, (char *)f->x->data + (size_t)(s % 2) * xb},
                                   {"labels", ALLOY_I32, 1, {4}, (char *)f->labels->data + (size_t)(s % 2) * lb}};
        expect_ok(g, alloy_graph_run(g, in, 2, NULL, 0), "run");
        alloy_step_info info;
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        skipped += info.skipped;
    }
    return skipped;
}

static void test_with_stats_off_a_training_step_leaves_the_same_bits(void **state)
{
    (void)state;
    feeds f = load_feeds("overflow_backward.safetensors"); /* skips some steps, then trains */
    alloy_graph *on = overflow_graph("1", NULL), *off = overflow_graph(NULL, NULL);
    int skipped_on = train(on, &f, 0, 10), skipped_off = train(off, &f, 0, 10);
    assert_int_equal(skipped_on, skipped_off);
    assert_true(skipped_on > 0 && skipped_on < 10);
    assert_true(alloy_graph_amp_stats_count(on) > 0);
    assert_int_equal(alloy_graph_amp_stats_count(off), 0);
    snapshot a = take_snapshot(on), b = take_snapshot(off);
    assert_int_equal(a.n, b.n);
    for (int i = 0; i < a.n; i++) {
        assert_string_equal(a.names[i], b.names[i]);
        assert_int_equal(a.bytes[i], b.bytes[i]);
        assert_memory_equal(a.data[i], b.data[i], a.bytes[i]);
    }
    free_snapshot(&a), free_snapshot(&b);
    alloy_graph_free(on), alloy_graph_free(off);
    alloy_safetensors_free(f.file);
}

/* What compiling g logged with amp_log=1 (test_malloc'd). */
static char *amp_log(alloy_graph *g)
{
    FILE *log = tmpfile();
    assert_non_null(log);
    expect_ok(g, alloy_graph_set_option(g, "amp_log", "1"), "set_option");
    expect_ok(g, alloy_graph_print_after(g, NULL, log), "print_after");
    alloy_amp_report rep;
    expect_ok(g, alloy_graph_amp_report(g, &rep), "amp_report");
    long len = ftell(log);
    assert_true(len > 0);
    char *text = test_calloc(1, (size_t)len + 1);
    rewind(log);
    assert_int_equal(fread(text, 1, (size_t)len, log), (size_t)len);
    fclose(log);
    return text;
}

static void test_range_aware_colouring_trains_without_skips_after_a_calibration_run(void **state)
{
    (void)state;
    /* |x| up to 3e4: the first matmul overflows f16 in the forward at any
     * scale, so plain f16 AMP skips every step */
    feeds f = load_feeds("overflow_forward.safetensors");
    alloy_graph *cal = overflow_graph("1", NULL);
    assert_int_equal(train(cal, &f, 0, 4), 4);
    const char *path = test_tmp_path("overflow.stats");
    expect_ok(cal, alloy_graph_save_amp_stats(cal, path), "save_amp_stats");
    size_t len;
    char *file = (char *)test_read_file(path, &len);
    assert_true(strncmp(file, "alloy-amp-stats 1 graph=overflow runs=4\n", 40) == 0);
    assert_non_null(strstr(file, "\n%h matmul f16 fwd max=inf "));
    assert_non_null(strstr(file, "\n%a gelu f16 fwd max="));
    test_free(file);
    alloy_amp_stat a = stat_of(cal, "%a");
    alloy_graph_free(cal);

    alloy_graph *g = overflow_graph(NULL, path);
    char *log = amp_log(g);
    alloy_amp_report rep;
    expect_ok(g, alloy_graph_amp_report(g, &rep), "amp_report");
    assert_int_equal(rep.range_kept, 3);
    assert_int_equal(rep.low_nodes, 0);
    /* a reason for each node moved: its own max, or the value it reads */
    assert_non_null(strstr(log, "range statistics from "));
    assert_non_null(strstr(log, "(margin 2): 3 nodes kept f32\n"));
    assert_non_null(strstr(log, "alloy amp:   %h matmul kept f32: max |x| inf > 65504/2\n"));
    char want[128];
    snprintf(want, sizeof want, "alloy amp:   %%a gelu kept f32: max |x| %.1fe4 > 65504/2\n", a.max_abs / 1e4);
    assert_non_null(strstr(log, want));
    assert_non_null(strstr(log, "alloy amp:   %logits matmul kept f32: max |x| "));
    test_free(log);
    assert_int_equal(train(g, &f, 0, 8), 0);
    alloy_graph_free(g);

    /* a margin of 1 and a stats file of small values: nothing moves */
    const char *small = test_tmp_path("small.stats");
    static const char text[] = "alloy-amp-stats 1 graph=overflow runs=1\n%h matmul f16 fwd max=40000 underflow=0 "
                               "elements=64 nan=0\n";
    FILE *out = fopen(small, "w");
    assert_non_null(out);
    fputs(text, out);
    fclose(out);
    g = overflow_graph(NULL, small);
    expect_ok(g, alloy_graph_set_option(g, "amp_range_margin", "1"), "set_option");
    expect_ok(g, alloy_graph_amp_report(g, &rep), "amp_report");
    assert_int_equal(rep.range_kept, 0);
    expect_ok(g, alloy_graph_set_option(g, "amp_range_margin", "2"), "set_option"); /* 40000 * 2 > 65504 */
    expect_ok(g, alloy_graph_amp_report(g, &rep), "amp_report");
    assert_int_equal(rep.range_kept, 1); /* %h alone: its reader, the gelu, is infer, kept f32 by the promote rule */
    alloy_graph_free(g);
    alloy_safetensors_free(f.file);
}

/* A saved stats file loads into a graph compiled the same way: every
 * value's max |x| (bit for bit), elements and underflow fraction as saved;
 * a second load adds to them; a line naming no value, or naming it with
 * another op, is an error at that line that changes nothing. */
static void test_a_saved_stats_file_loads_back_into_the_same_step(void **state)
{
    (void)state;
    feeds f = load_feeds("overflow_forward.safetensors");
    alloy_graph *cal = overflow_graph("1", NULL);
    assert_int_equal(train(cal, &f, 0, 3), 3);
    const char *path = test_tmp_path("saved.stats");
    expect_ok(cal, alloy_graph_save_amp_stats(cal, path), "save_amp_stats");
    int n = alloy_graph_amp_stats_count(cal);
    assert_true(n >= 6);
    alloy_graph *g = overflow_graph(NULL, NULL);
    assert_int_equal(alloy_graph_amp_stats_count(g), 0);
    expect_ok(g, alloy_graph_load_amp_stats(g, path), "load_amp_stats");
    assert_int_equal(alloy_graph_amp_stats_count(g), n);
    for (int i = 0; i < n; i++) {
        alloy_amp_stat a, b;
        expect_ok(cal, alloy_graph_amp_stats_at(cal, i, &a), "amp_stats_at");
        expect_ok(g, alloy_graph_amp_stats_at(g, i, &b), "amp_stats_at");
        assert_string_equal(a.node, b.node);
        assert_string_equal(a.op, b.op);
        assert_int_equal(a.backward, b.backward);
        assert_memory_equal(&a.max_abs, &b.max_abs, sizeof a.max_abs);
        assert_int_equal(a.elements, b.elements);
        assert_true(fabs(a.underflow - b.underflow) <= 0.5 / (double)a.elements);
        assert_int_equal(a.nan, b.nan);
    }
    expect_ok(g, alloy_graph_load_amp_stats(g, path), "load_amp_stats");
    alloy_amp_stat a, b;
    expect_ok(cal, alloy_graph_amp_stats_at(cal, 0, &a), "amp_stats_at");
    expect_ok(g, alloy_graph_amp_stats_at(g, 0, &b), "amp_stats_at");
    assert_int_equal(b.elements, 2 * a.elements);
    static const char *const bad[][2] = {
        {"alloy-amp-stats 1 graph=overflow runs=1\n%h matmul f16 fwd max=1 underflow=0 elements=4 nan=0\n"
         "%nowhere add f16 fwd max=1 underflow=0 elements=4 nan=0\n",
         "bad2.stats:3: %nowhere is no value of the compiled graph 'overflow'"},
        {"alloy-amp-stats 1 graph=overflow runs=1\n%h gelu f16 fwd max=1 underflow=0 elements=4 nan=0\n",
         "bad2.stats:2: %h is matmul f16 here but gelu f16 in the file"},
        {"not a stats file\n", "bad2.stats:1: not a stats file"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        const char *bpath = test_tmp_path("bad2.stats");
        FILE *out = fopen(bpath, "w");
        assert_non_null(out);
        fputs(bad[k][0], out);
        fclose(out);
        assert_int_equal(alloy_graph_load_amp_stats(g, bpath), ALLOY_ERR_FORMAT);
        if (!strstr(alloy_last_error(g), bad[k][1])) fail_msg("got '%s'", alloy_last_error(g));
        expect_ok(g, alloy_graph_amp_stats_at(g, 0, &b), "amp_stats_at");
        assert_int_equal(b.elements, 2 * a.elements); /* unchanged */
    }
    alloy_graph_free(g);
    alloy_graph_free(cal);
    alloy_safetensors_free(f.file);
}

static void test_a_bad_stats_file_is_an_error_naming_its_line(void **state)
{
    (void)state;
    const char *path = test_tmp_path("bad.stats");
    FILE *out = fopen(path, "w");
    assert_non_null(out);
    fputs("alloy-amp-stats 1 graph=overflow runs=1\n%h matmul f16 fwd max=-3 underflow=0 elements=1 nan=0\n", out);
    fclose(out);
    alloy_graph *g = overflow_graph(NULL, path);
    alloy_amp_report rep;
    assert_int_equal(alloy_graph_amp_report(g, &rep), ALLOY_ERR_FORMAT);
    const char *msg = alloy_last_error(g);
    assert_non_null(strstr(msg, "bad.stats:2: max is not a number >= 0"));
    alloy_graph_free(g);
    g = overflow_graph(NULL, test_tmp_path("missing.stats"));
    assert_int_equal(alloy_graph_amp_report(g, &rep), ALLOY_ERR_IO);
    assert_non_null(strstr(alloy_last_error(g), "missing.stats"));
    alloy_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_max_abs_is_the_f64_reference_over_the_steps_before_rounding),
        cmocka_unit_test(test_underflow_fraction_counts_nonzero_values_below_the_f16_normal),
        cmocka_unit_test(test_bf16_values_measure_against_bf16s_range),
        cmocka_unit_test(test_with_stats_off_a_training_step_leaves_the_same_bits),
        cmocka_unit_test_setup_teardown(test_range_aware_colouring_trains_without_skips_after_a_calibration_run,
                                        test_tmpdir_setup, test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_a_saved_stats_file_loads_back_into_the_same_step, test_tmpdir_setup,
                                        test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_a_bad_stats_file_is_an_error_naming_its_line, test_tmpdir_setup,
                                        test_tmpdir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
