/* test_reduce_launch.c - the split reductions in one launch on the emulated device: column sums (bias gradients; alone, and in the kernel of the elementwise step computing their operand) and long contiguous sums, f32/f16/bf16, and a per-thread sum over strided axes (the CPU's pairwise order, bit for bit), against an f64 sum of the same operand and the CPU backend; the same bits run after run (the block counters back at 0), and one launch each in the plan. */
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
#include "runtime/graph/bundle_save.h"
#include "support.h"

/* A reduction to try: op over axis (-1: all axes) into "y" of h, x [rows,
 * cols] f32 as dt: h is x itself (f32) or a lone cast (its own step), or
 * with `fused` the negation of that (an elementwise step, whose kernel
 * then computes the column reduction too); h is fetched. */
typedef struct reduce_case {
    int64_t rows, cols;
    int axis;
    alloy_dtype dt;
    int op; /* 0 sum, 1 mean, 2 max */
    bool fused;
} reduce_case;

static alloy_graph *build(const reduce_case *c, const char *device)
{
    alloy_graph *g = alloy_graph_new("reduce");
    assert_non_null(g);
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){c->rows, c->cols});
    alloy_tensor *h = c->dt == ALLOY_F32 ? x : alloy_cast(g, x, c->dt);
    if (c->fused) h = alloy_neg(g, h);
    int64_t axes[1] = {c->axis};
    int naxes = c->axis >= 0 ? 1 : 0;
    const int64_t *ax = c->axis >= 0 ? axes : NULL;
    alloy_tensor *y = c->op == 0   ? alloy_reduce_sum(g, h, naxes, ax, false)
                      : c->op == 1 ? alloy_reduce_mean(g, h, naxes, ax, false)
                                   : alloy_reduce_max(g, h, naxes, ax, false);
    expect_ok(g, alloy_output(g, "h", h), "output h");
    expect_ok(g, alloy_output(g, "y", y), "output y");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    return g;
}

/* Runs g on x; *h and *y get copies of the fetched values (free them). */
static void run(alloy_graph *g, const reduce_case *c, const float *x, void **h, void **y, int64_t *ny)
{
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {c->rows, c->cols}, (void *)x};
    alloy_host_tensor out[2] = {{.name = "h"}, {.name = "y"}};
    expect_ok(g, alloy_graph_run(g, &feed, 1, out, 2), "run");
    size_t hb = (size_t)alloy_host_tensor_numel(&out[0]) * alloy_dtype_size(out[0].dtype);
    *ny = alloy_host_tensor_numel(&out[1]);
    size_t yb = (size_t)*ny * alloy_dtype_size(out[1].dtype);
    *h = malloc(hb + 1), *y = malloc(yb + 1);
    assert_true(*h && *y);
    memcpy(*h, out[0].data, hb);
    memcpy(*y, out[1].data, yb);
}

/* The unit roundoff of dt. */
static double unit(alloy_dtype dt) { return dt == ALLOY_F16 ? 0x1p-11 : dt == ALLOY_BF16 ? 0x1p-8 : 0x1p-24; }

/* Output o of c from the operand h (dtype c->dt) in f64, and the sum of its terms' magnitudes. */
static double reference(const reduce_case *c, const void *h, int64_t o, double *mag)
{
    int64_t count = c->axis < 0 ? c->rows * c->cols : c->axis == 0 ? c->rows : c->cols;
    double s = c->op == 2 ? -INFINITY : 0;
    *mag = 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t at = c->axis < 0 ? i : c->axis == 0 ? i * c->cols + o : o * c->cols + i;
        double v = test_decode(c->dt, h, at);
        s = c->op == 2 ? fmax(s, v) : s + v;
        *mag += fabs(v);
    }
    if (c->op == 1) s /= (double)count, *mag /= (double)count;
    return s;
}

/* How many launches of the plan are kernels whose name holds `part`, and the total. */
static int kernels_named(alloy_graph *g, const char *part, int *launches)
{
    char *text = NULL;
    size_t len = 0;
    FILE *report = open_memstream(&text, &len);
    assert_non_null(report);
    alloy_cost_options o = {.all = 1, .top = -1};
    alloy_cost_totals t;
    expect_ok(g, alloy_graph_cost(g, &o, &t, report), "cost");
    fclose(report);
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) n += strstr(line, part) != NULL;
    free(text);
    *launches = t.launches;
    return n;
}

/* c on the emulated device three times and on the CPU: every output within
 * its bound of the f64 sum of the operand (the output's rounding, and f32
 * additions of at most a few hundred terms deep), as close to the CPU's,
 * the same bits in each of the three runs (each run's last blocks set the
 * counters back to 0: a counter left at any other value would finish
 * early or never); one reduction kernel, no "_final" kernel, and with
 * `fused` the reduction in the elementwise step's kernel (one launch). */
static void against_cpu(const reduce_case *c)
{
    use_emulation();
    alloy_graph *cpu = build(c, "cpu"), *gpu = build(c, "cuda");
    int64_t n = c->rows * c->cols;
    float *x = malloc(sizeof *x * (size_t)n);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(sin(0.7 * (double)i + 0.3) * (1.0 + (double)(i % 7) / 3.0));
    void *h0, *hc, *yc, *y[3];
    int64_t ny;
    run(cpu, c, x, &hc, &yc, &ny);
    run(gpu, c, x, &h0, &y[0], &ny);
    free(h0);
    for (int r = 1; r < 3; r++) {
        run(gpu, c, x, &h0, &y[r], &ny);
        free(h0);
    }
    alloy_dtype out = c->dt;
    double worst = 0, worst_cpu = 0;
    for (int64_t o = 0; o < ny; o++) {
        double mag, ref = reference(c, hc, o, &mag);
        double got = test_decode(out, y[0], o), cpu_v = test_decode(out, yc, o);
        double bound = unit(out) * fabs(ref) + (c->op == 2 ? 0 : 256 * 0x1p-24 * mag) + 1e-30;
        double e = fabs(got - ref) / bound, ec = fabs(got - cpu_v) / (2 * bound);
        if (!(e <= 1)) fail_msg("output %lld: %.9g emulated, %.9g in f64 (bound %.3g)", (long long)o, got, ref, bound);
        if (!(ec <= 1)) fail_msg("output %lld: %.9g emulated, %.9g on the CPU", (long long)o, got, cpu_v);
        worst = fmax(worst, e), worst_cpu = fmax(worst_cpu, ec);
    }
    for (int r = 1; r < 3; r++) {
        int64_t at;
        if (!test_same_bits(out, y[0], y[r], ny, &at))
            fail_msg("run %d differs from run 1 at output %lld: %.9g, then %.9g", r + 1, (long long)at,
                     test_decode(out, y[0], at), test_decode(out, y[r], at));
    }
    int launches, finals = kernels_named(gpu, "_final", &launches);
    int reduces = kernels_named(gpu, c->op == 0 ? "_reduce_sum" : c->op == 1 ? "_reduce_mean" : "_reduce_max", &launches);
    int joined = kernels_named(gpu, "_chain2_ew_reduce", &launches);
    assert_int_equal(finals, 0);
    assert_int_equal(reduces, 1);
    assert_int_equal(joined, c->fused ? 1 : 0);
    if (c->fused) assert_int_equal(launches, 1); /* the cast, the negation and the sum: one kernel */
    print_message("[%lld, %lld] %s%s over %d, %s: %lld outputs, worst %.3g of the f64 bound, %.3g of the CPU's; "
                  "3 runs bitwise equal; %d launches\n",
                  (long long)c->rows, (long long)c->cols, c->fused ? "elementwise + " : "", c->op == 0 ? "sum" : c->op == 1 ? "mean" : "max", c->axis,
                  alloy_dtype_name(c->dt), (long long)ny, worst, worst_cpu, launches);
    for (int r = 0; r < 3; r++) free(y[r]);
    free(hc), free(yc), free(x);
    alloy_graph_free(cpu);
    alloy_graph_free(gpu);
    rt_backend_set_cuda_opener(NULL);
}

/* Columns (a bias gradient): 2049 rows in 33 chunks, the last block adds
 * them a warp per column (lane 0 takes chunks 0 and 32); alone, and in the
 * elementwise step that computes its operand. */
static void test_a_column_sum_over_33_chunks_matches_f64_and_the_cpu_run_after_run(void **state)
{
    (void)state;
    const alloy_dtype dts[3] = {ALLOY_F32, ALLOY_F16, ALLOY_BF16};
    for (int i = 0; i < 3; i++) {
        against_cpu(&(reduce_case){2049, 33, 0, dts[i], 0, false});
        against_cpu(&(reduce_case){2049, 33, 0, dts[i], 0, true});
    }
}

/* 700 rows: 11 chunks, a thread per column adds them in order; 300
 * columns, two groups (two counters), the second part full. */
static void test_a_column_sum_over_11_chunks_and_two_groups_adds_them_a_thread_per_column(void **state)
{
    (void)state;
    against_cpu(&(reduce_case){700, 300, 0, ALLOY_F16, 0, false});
    against_cpu(&(reduce_case){700, 300, 0, ALLOY_BF16, 0, true});
}

/* The mean and the maximum take the same kernels. */
static void test_a_column_mean_and_maximum_finish_in_the_same_launch(void **state)
{
    (void)state;
    against_cpu(&(reduce_case){2049, 33, 0, ALLOY_F32, 1, true});
    against_cpu(&(reduce_case){2049, 33, 0, ALLOY_BF16, 2, false});
    against_cpu(&(reduce_case){700, 300, 0, ALLOY_F16, 2, true});
}

/* The elementwise step's kernel sums as the reduction's own kernel does:
 * the sum of -h, fused, is bit for bit minus the sum of h alone (negation
 * is exact, and each addition rounds symmetrically). */
static void test_a_fused_column_sum_has_the_bits_of_the_sum_alone(void **state)
{
    (void)state;
    use_emulation();
    const alloy_dtype dts[3] = {ALLOY_F32, ALLOY_F16, ALLOY_BF16};
    for (int i = 0; i < 3; i++) {
        reduce_case alone = {2049, 33, 0, dts[i], 0, false}, fused = alone;
        fused.fused = true;
        alloy_graph *a = build(&alone, "cuda"), *b = build(&fused, "cuda");
        int64_t n = alone.rows * alone.cols, ny;
        float *x = malloc(sizeof *x * (size_t)n);
        assert_non_null(x);
        for (int64_t j = 0; j < n; j++) x[j] = (float)(cos(0.3 * (double)j) * (1.0 + (double)(j % 5)));
        void *ha, *ya, *hb, *yb;
        run(a, &alone, x, &ha, &ya, &ny);
        run(b, &fused, x, &hb, &yb, &ny);
        for (int64_t o = 0; o < ny; o++) {
            double u = test_decode(dts[i], ya, o), v = test_decode(dts[i], yb, o);
            if (!(u == -v)) fail_msg("%s column %lld: %.9g alone, %.9g fused", alloy_dtype_name(dts[i]), (long long)o, u, v);
        }
        free(x), free(ha), free(ya), free(hb), free(yb);
        alloy_graph_free(a);
        alloy_graph_free(b);
    }
    rt_backend_set_cuda_opener(NULL);
}

/* A cast of the column sum after it (a bf16 bias gradient to its f32
 * parameter's dtype) joins the sum's kernel: the thread storing a sum
 * stores its cast too, which is that sum exactly in f32. Fused, one launch
 * in all; alone, the sum and cast in one launch after the operand's cast. */
static void test_the_cast_of_a_fused_column_sum_joins_its_kernel(void **state)
{
    (void)state;
    use_emulation();
    const alloy_dtype dts[4] = {ALLOY_BF16, ALLOY_F16, ALLOY_BF16, ALLOY_F16};
    for (int i = 0; i < 4; i++) {
        reduce_case c = {700, 300, 0, dts[i], 0, i < 2};
        alloy_graph *g = alloy_graph_new("reduce_cast");
        assert_non_null(g);
        alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){c.rows, c.cols});
        alloy_tensor *h = alloy_cast(g, x, c.dt);
        if (c.fused) h = alloy_neg(g, h);
        alloy_tensor *y = alloy_reduce_sum(g, h, 1, (int64_t[]){0}, false);
        expect_ok(g, alloy_output(g, "y", y), "output y");
        expect_ok(g, alloy_output(g, "z", alloy_cast(g, y, ALLOY_F32)), "output z");
        expect_ok(g, alloy_graph_set_option(g, "device", "cuda"), "device");
        int64_t n = c.rows * c.cols;
        float *xs = malloc(sizeof *xs * (size_t)n);
        assert_non_null(xs);
        for (int64_t j = 0; j < n; j++) xs[j] = (float)sin(0.11 * (double)j);
        alloy_host_tensor feed = {"x", ALLOY_F32, 2, {c.rows, c.cols}, xs};
        alloy_host_tensor out[2] = {{.name = "y"}, {.name = "z"}};
        expect_ok(g, alloy_graph_run(g, &feed, 1, out, 2), "run");
        assert_int_equal(out[1].dtype, ALLOY_F32);
        for (int64_t o = 0; o < c.cols; o++) {
            double u = test_decode(c.dt, out[0].data, o), v = test_decode(ALLOY_F32, out[1].data, o);
            if (!(u == v)) fail_msg("%s column %lld: the sum %.9g, its cast %.9g", alloy_dtype_name(c.dt), (long long)o, u, v);
        }
        int launches;
        assert_int_equal(kernels_named(g, c.fused ? "_chain3_ew_reduce_sum" : "_chain2_reduce_sum", &launches), 1);
        assert_int_equal(launches, c.fused ? 1 : 2);
        free(xs);
        alloy_graph_free(g);
    }
    rt_backend_set_cuda_opener(NULL);
}

/* Contiguous: a row of 270001 (33 blocks, a warp adds their sums), 3 rows
 * of 50001 (7 blocks each, a thread), and all of [263, 1031] (34 blocks). */
static void test_long_rows_and_a_whole_tensor_sum_in_one_launch(void **state)
{
    (void)state;
    against_cpu(&(reduce_case){1, 270001, 1, ALLOY_F32, 0, false});
    against_cpu(&(reduce_case){3, 50001, 1, ALLOY_F16, 0, false});
    against_cpu(&(reduce_case){263, 1031, -1, ALLOY_BF16, 0, false});
}

/* The sum over the outer and inner axes of x [a, b, c] (axes 0 and 2: no
 * contiguous or column layout) takes one thread per output, summing in the
 * CPU's pairwise order without recursion: each output has the CPU's bits,
 * and is within a pairwise bound of its f64 sum. Counts a * c of 16 (one
 * run), 17 and 33 (a half of 17 split once more), 32, and 1073 (six levels
 * of halves, runs of 16 and 17 split into 8 + 9). */
static void test_a_strided_sum_per_thread_has_the_cpus_bits(void **state)
{
    (void)state;
    use_emulation();
    static const int64_t shapes[][3] = {{4, 3, 4}, {17, 5, 1}, {3, 2, 11}, {8, 6, 4}, {37, 3, 29}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t *d = shapes[s], n = d[0] * d[1] * d[2];
        float *x = malloc(sizeof *x * (size_t)n);
        assert_non_null(x);
        for (int64_t i = 0; i < n; i++) x[i] = (float)(sin(0.37 * (double)i + 0.1) * (1.0 + (double)(i % 5) * 1e3));
        float *y[2];
        for (int dev = 0; dev < 2; dev++) {
            alloy_graph *g = alloy_graph_new("strided_sum");
            assert_non_null(g);
            alloy_tensor *xt = alloy_input(g, "x", ALLOY_F32, 3, d);
            alloy_tensor *yt = alloy_reduce_sum(g, xt, 2, (int64_t[]){0, 2}, false);
            expect_ok(g, alloy_output(g, "y", yt), "output y");
            expect_ok(g, alloy_graph_set_option(g, "device", dev ? "cuda" : "cpu"), "device");
            alloy_host_tensor feed = {"x", ALLOY_F32, 3, {d[0], d[1], d[2]}, x};
            alloy_host_tensor out = {.name = "y"};
            expect_ok(g, alloy_graph_run(g, &feed, 1, &out, 1), "run");
            assert_int_equal(alloy_host_tensor_numel(&out), d[1]);
            y[dev] = malloc(sizeof(float) * (size_t)d[1]);
            assert_non_null(y[dev]);
            memcpy(y[dev], out.data, sizeof(float) * (size_t)d[1]);
            alloy_graph_free(g);
        }
        for (int64_t o = 0; o < d[1]; o++) {
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < d[0]; i++)
                for (int64_t k = 0; k < d[2]; k++) {
                    double v = x[(i * d[1] + o) * d[2] + k];
                    ref += v, mag += fabs(v);
                }
            if (memcmp(&y[0][o], &y[1][o], sizeof(float)) != 0)
                fail_msg("[%lld, %lld, %lld] output %lld: %.9g emulated, %.9g on the CPU", (long long)d[0],
                         (long long)d[1], (long long)d[2], (long long)o, y[1][o], y[0][o]);
            if (!(fabs(y[1][o] - ref) <= 32 * 0x1p-24 * mag)) /* runs of 16 and log2(1073 / 16) levels: 23 roundings deep */
                fail_msg("output %lld: %.9g emulated, %.9g in f64", (long long)o, y[1][o], ref);
        }
        print_message("[%lld, %lld, %lld] summed over axes 0 and 2 (%lld terms): the CPU's bits\n", (long long)d[0],
                      (long long)d[1], (long long)d[2], (long long)(d[0] * d[2]));
        free(x), free(y[0]), free(y[1]);
    }
    rt_backend_set_cuda_opener(NULL);
}

/* A bundle carries the kernels with their block counters: loaded, its
 * counters zeroed, three runs give the JIT's bits (the fused column sum,
 * and a contiguous sum over 33 blocks). */
static void test_a_bundle_runs_the_one_launch_reductions_as_the_jit_does(void **state)
{
    (void)state;
    use_emulation();
    const reduce_case cases[2] = {{2049, 33, 0, ALLOY_F16, 0, true}, {1, 270001, 1, ALLOY_BF16, 0, false}};
    for (int i = 0; i < 2; i++) {
        const reduce_case *c = &cases[i];
        char path[256], err[1024];
        snprintf(path, sizeof path, "%s/reduce%d.alloy", test_tmpdir, i);
        alloy_graph *g = build(c, "cuda");
        int64_t n = c->rows * c->cols, ny;
        float *x = malloc(sizeof *x * (size_t)n);
        assert_non_null(x);
        for (int64_t j = 0; j < n; j++) x[j] = (float)sin(0.013 * (double)j + 1.0);
        void *h, *want;
        run(g, c, x, &h, &want, &ny);
        bundle_image_builder old = bundle_set_image_builder(emu_bundle_images);
        alloy_status st = alloy_graph_save_bundle(g, path, "host");
        bundle_set_image_builder(old);
        if (st) fail_msg("save_bundle: %s", alloy_last_error(g));
        alloy_bundle *b;
        if (alloy_bundle_load(path, &b, err, sizeof err)) fail_msg("bundle_load: %s", err);
        for (int r = 0; r < 3; r++) {
            alloy_host_tensor feed = {"x", ALLOY_F32, 2, {c->rows, c->cols}, x};
            alloy_host_tensor out = {.name = "y"};
            if (alloy_bundle_run(b, &feed, 1, &out, 1)) fail_msg("run %d: %s", r + 1, alloy_bundle_last_error(b));
            int64_t at;
            if (!test_same_bits(c->dt, want, out.data, ny, &at))
                fail_msg("case %d run %d: output %lld is %.9g, the JIT's %.9g", i, r + 1, (long long)at,
                         test_decode(c->dt, out.data, at), test_decode(c->dt, want, at));
        }
        alloy_bundle_free(b);
        free(x), free(h), free(want);
        alloy_graph_free(g);
    }
    rt_backend_set_cuda_opener(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_column_sum_over_33_chunks_matches_f64_and_the_cpu_run_after_run),
        cmocka_unit_test(test_a_column_sum_over_11_chunks_and_two_groups_adds_them_a_thread_per_column),
        cmocka_unit_test(test_a_column_mean_and_maximum_finish_in_the_same_launch),
        cmocka_unit_test(test_a_fused_column_sum_has_the_bits_of_the_sum_alone),
        cmocka_unit_test(test_the_cast_of_a_fused_column_sum_joins_its_kernel),
        cmocka_unit_test(test_long_rows_and_a_whole_tensor_sum_in_one_launch),
        cmocka_unit_test(test_a_strided_sum_per_thread_has_the_cpus_bits),
        cmocka_unit_test_setup_teardown(test_a_bundle_runs_the_one_launch_reductions_as_the_jit_does, test_tmpdir_setup,
                                        test_tmpdir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
