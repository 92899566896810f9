/* test_fuse_colsum.c - column sums in row groups (ir_fuse_colsum, fuse_colsum.c): layer_norm's backward computes dx, dgamma and dbeta in one step, the product dy * xhat never stored; on the CPU bit for bit the unfused sums and near an f64 reference, emulated on the device near the CPU; a reader of the product after its sums joins the group, and one reading a sum leaves the product stored; the verifier's rule. */
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
#include "alloy/bundle.h"
#include "base/convert.h"
#include "codegen_support.h"
#include "fuse_support.h"
#include "ir/groups.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* ---- the graph: loss = sum(matmul(layer_norm(x, gamma, beta), W) * R) ---- */

/* Its backward is char_gpt's: dy = R W^T from a matmul (f16 or bf16 with
 * AMP, then cast to f32), layer_norm_grad_stats(x, dy, mean, rstd, gamma) for dx, and the sums
 * over the rows of dy * layer_norm(x) (dgamma) and of dy (dbeta). W holds
 * small integers and R halves in {-1/2, 0, 1/2}, so dy is exact in every
 * dtype (|dy| <= N * 3 / 2 = 12, a multiple of 1/2: exact in bf16's 8 bits):
 * the reference knows dy exactly, and dbeta, a sum of such values below
 * 2^24 / 2, is exact in f32 whatever the order. */
enum { N = 8, MODES = 3 };
static const char *const mode_names[MODES] = {"f32", "f16 AMP", "bf16 AMP"};

typedef struct ln_shape {
    int64_t rows, C;
} ln_shape;

/* 2048 x 128: char_gpt's (16 tree blocks of 128 rows); 37 x 69: one block,
 * odd sizes; 1001 x 69: unequal halves down the tree (blocks of 125 and 126);
 * 96 x 1500: rows longer than a warp takes (a block of threads per row on a
 * GPU, 2 columns a thread), 8 tree blocks of 12 rows on the CPU (subtrees
 * of at most 16 rows: 16384 / 1500 is 10, below a pairwise leaf's 16). */
static const ln_shape shapes[] = {{2048, 128}, {37, 69}, {1001, 69}, {96, 1500}};
enum { NSHAPES = sizeof shapes / sizeof shapes[0] };

static alloy_graph *ln_graph(int mode, ln_shape sh)
{
    alloy_graph *g = alloy_graph_new("ln_backward");
    alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(sh.rows, sh.C));
    alloy_tensor *gamma = alloy_input(g, "gamma", F32, 1, DIMS(sh.C));
    alloy_tensor *beta = alloy_input(g, "beta", F32, 1, DIMS(sh.C));
    alloy_tensor *w = alloy_input(g, "W", F32, 2, DIMS(sh.C, N));
    alloy_tensor *r = alloy_input(g, "R", F32, 2, DIMS(sh.rows, N));
    alloy_tensor *y = alloy_layer_norm(g, x, gamma, beta, 1e-5);
    alloy_tensor *z = alloy_matmul(g, y, w, false, false);
    alloy_tensor *loss = alloy_set_name(g, alloy_reduce_sum(g, alloy_mul(g, z, r), 0, NULL, false), "loss");
    alloy_output(g, "loss", loss);
    expect_ok(g, alloy_graph_request_grad(g, x), "request_grad x");
    expect_ok(g, alloy_graph_request_grad(g, gamma), "request_grad gamma");
    expect_ok(g, alloy_graph_request_grad(g, beta), "request_grad beta");
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    if (mode) expect_ok(g, alloy_graph_enable_amp(g, mode == 1 ? ALLOY_F16 : ALLOY_BF16), "enable_amp");
    return g;
}

typedef struct ln_data {
    ln_shape sh;
    float *x, *gamma, *beta, *w, *r;
    alloy_host_tensor feeds[5];
} ln_data;

static ln_data make_data(ln_shape sh, uint64_t seed)
{
    ln_data d = {.sh = sh};
    int64_t rc = sh.rows * sh.C;
    d.x = test_malloc(sizeof(float) * (size_t)rc);
    d.gamma = test_malloc(sizeof(float) * (size_t)sh.C);
    d.beta = test_malloc(sizeof(float) * (size_t)sh.C);
    d.w = test_malloc(sizeof(float) * (size_t)(sh.C * N));
    d.r = test_malloc(sizeof(float) * (size_t)(sh.rows * N));
    test_rng = seed;
    for (int64_t i = 0; i < rc; i++) d.x[i] = (float)(test_uniform(-2, 2) + 0.5 * (double)(i % sh.C) / (double)sh.C);
    fill(d.gamma, sh.C, 0.5, 1.5);
    fill(d.beta, sh.C, -0.5, 0.5);
    for (int64_t i = 0; i < sh.C * N; i++) d.w[i] = (float)test_irand(-3, 3);
    for (int64_t i = 0; i < sh.rows * N; i++) d.r[i] = 0.5f * (float)test_irand(-1, 1);
    d.feeds[0] = (alloy_host_tensor){"x", F32, 2, {sh.rows, sh.C}, d.x};
    d.feeds[1] = (alloy_host_tensor){"gamma", F32, 1, {sh.C}, d.gamma};
    d.feeds[2] = (alloy_host_tensor){"beta", F32, 1, {sh.C}, d.beta};
    d.feeds[3] = (alloy_host_tensor){"W", F32, 2, {sh.C, N}, d.w};
    d.feeds[4] = (alloy_host_tensor){"R", F32, 2, {sh.rows, N}, d.r};
    return d;
}

static void free_data(ln_data *d)
{
    test_free(d->x), test_free(d->gamma), test_free(d->beta), test_free(d->w), test_free(d->r);
}

/* The f64 references: dgamma, dbeta and, per column, sum_r |dy| (|xhat| + 1)
 * (the scale of dgamma's rounding: its terms and xhat's own error). */
static void reference(const ln_data *d, double *dgamma, double *dbeta, double *scale)
{
    int64_t R = d->sh.rows, C = d->sh.C;
    for (int64_t j = 0; j < C; j++) dgamma[j] = dbeta[j] = scale[j] = 0;
    for (int64_t r = 0; r < R; r++) {
        double mean = 0, var = 0;
        for (int64_t j = 0; j < C; j++) mean += d->x[r * C + j];
        mean /= (double)C;
        for (int64_t j = 0; j < C; j++) var += (d->x[r * C + j] - mean) * (d->x[r * C + j] - mean);
        double inv = 1 / sqrt(var / (double)C + 1e-5);
        for (int64_t j = 0; j < C; j++) {
            double dy = 0, xhat = (d->x[r * C + j] - mean) * inv;
            for (int n = 0; n < N; n++) dy += (double)d->r[r * N + n] * d->w[j * N + n];
            dgamma[j] += dy * xhat;
            dbeta[j] += dy;
            scale[j] += fabs(dy) * (fabs(xhat) + 1);
        }
    }
}

/* One run on nthreads threads, fused or not: grad:gamma, grad:beta,
 * grad:x copied into out[0..3) (test_malloc'd). */
static void run_grads(int mode, const ln_data *d, bool fused, int nthreads, float **out)
{
    fusion(fused);
    char t[16];
    snprintf(t, sizeof t, "%d", nthreads);
    setenv("ALLOY_NUM_THREADS", t, 1);
    alloy_graph *g = ln_graph(mode, d->sh);
    alloy_host_tensor f[3] = {{.name = "grad:gamma"}, {.name = "grad:beta"}, {.name = "grad:x"}};
    expect_ok(g, alloy_graph_run(g, d->feeds, 5, f, 3), fused ? "fused run" : "unfused run");
    for (int i = 0; i < 3; i++) {
        size_t bytes = sizeof(float) * (size_t)alloy_host_tensor_numel(&f[i]);
        out[i] = test_malloc(bytes);
        memcpy(out[i], f[i].data, bytes);
    }
    alloy_graph_free(g);
    unsetenv("ALLOY_NUM_THREADS");
}

/* The compiled graph's nodes: layer_norm_grad_stats, dgamma, dbeta. */
static void backward_nodes(const ir_graph *c, int *lng, int *dgamma, int *dbeta)
{
    *lng = first_node_of(c, IR_OP_layer_norm_grad_stats);
    *dgamma = output_node(c, "grad:gamma");
    *dbeta = output_node(c, "grad:beta");
}

/* ---- 1. one step ---- */

static void test_the_layer_norm_backward_computes_dx_dgamma_and_dbeta_in_one_step(void **state)
{
    (void)state;
    for (int mode = 0; mode < MODES; mode++)
        for (int k = 0; k < NSHAPES; k++) {
            int steps[2], colsums = 0;
            for (int fused = 0; fused < 2; fused++) {
                fusion(fused);
                alloy_graph *g = ln_graph(mode, shapes[k]);
                const ir_graph *c = compiled(g);
                expect_groups_legal(c);
                const schedule *s = &g->comp.sched;
                steps[fused] = s->nsteps;
                int lng, dgamma, dbeta;
                backward_nodes(c, &lng, &dgamma, &dbeta);
                if (!fused) {
                    alloy_graph_free(g);
                    continue;
                }
                int st = expect_one_row_step(g, (int[]){lng, dgamma, dbeta}, 3, "%s %lldx%lld: dx, dgamma and dbeta",
                                             mode_names[mode], (long long)shapes[k].rows, (long long)shapes[k].C);
                /* dgamma's product dy * xhat: summed in the step, never stored */
                int product = c->nodes[dgamma]->in[0];
                assert_int_equal(c->nodes[product]->op, IR_OP_mul);
                assert_int_equal(s->step_of[product], st);
                assert_false(sched_stored(s, product));
                assert_true(sched_stored(s, dgamma) && sched_stored(s, dbeta));
                for (int q = 0; q < s->nparts; q++) colsums += s->parts[q].kind == PART_COLSUM;
                if (mode == 1 && k == 0) {
                    ir_print_groups(c, stdout);
                    sched_print(c, s, stdout);
                }
                alloy_graph_free(g);
            }
            printf("%s %lld x %lld: dx, dgamma, dbeta in one row step; %d steps (%d with the column sums as steps "
                   "of their own, %d unfused)\n",
                   mode_names[mode], (long long)shapes[k].rows, (long long)shapes[k].C, steps[1], steps[1] + colsums,
                   steps[0]);
        }
}

/* ---- 2. the CPU: the unfused bits, and near f64 ---- */

/* Per column, |dgamma - f64| <= DGAMMA_TOL * sum_r |dy| (|xhat| + 1): the
 * pairwise sum (16-term leaves, log2(2048 / 16) = 7 levels) is off by at
 * most (15 + 7) u of sum |dy xhat|, and each f32 xhat by a few u of
 * (|xhat| + 1) (its mean, variance and rsqrt in f32); u = 2^-24, so
 * 32 u = 1.9e-6 covers both. */
#define DGAMMA_TOL (32 * 0x1p-24)

static void test_dgamma_and_dbeta_are_the_unfused_bits_and_near_f64(void **state)
{
    (void)state;
    for (int mode = 0; mode < MODES; mode++)
        for (int k = 0; k < NSHAPES; k++) {
            ln_data d = make_data(shapes[k], 11 + (uint64_t)k);
            int64_t C = shapes[k].C;
            float *want[3];
            run_grads(mode, &d, false, 1, want);
            for (int t = 1; t <= 2; t++) {
                float *got[3];
                run_grads(mode, &d, true, t, got);
                static const char *const what[3] = {"dgamma", "dbeta", "dx"};
                int64_t count[3] = {C, C, shapes[k].rows * C}, at;
                for (int i = 0; i < 3; i++) {
                    if (!test_same_bits(F32, got[i], want[i], count[i], &at))
                        fail_msg("%s %lldx%lld, %d thread(s): fused %s[%lld] %.9g, unfused %.9g", mode_names[mode],
                                 (long long)shapes[k].rows, (long long)C, t, what[i], (long long)at, got[i][at],
                                 want[i][at]);
                    test_free(got[i]);
                }
            }
            double *rg = test_malloc(sizeof(double) * (size_t)C * 3), *rb = rg + C, *sc = rg + 2 * C, worst = 0;
            reference(&d, rg, rb, sc);
            for (int64_t j = 0; j < C; j++) {
                if ((double)want[1][j] != rb[j])
                    fail_msg("%s: dbeta[%lld] %.9g, exactly %.9g", mode_names[mode], (long long)j, want[1][j], rb[j]);
                worst = fmax(worst, fabs(want[0][j] - rg[j]) / sc[j]);
            }
            printf("%s %lld x %lld: dgamma, dbeta, dx fused = unfused bit for bit on 1 and 2 threads; dbeta exact; "
                   "dgamma max |error| %.3g u of sum |dy| (|xhat| + 1)\n",
                   mode_names[mode], (long long)shapes[k].rows, (long long)C, worst / 0x1p-24);
            assert_true(worst <= DGAMMA_TOL);
            test_free(rg);
            for (int i = 0; i < 3; i++) test_free(want[i]);
            free_data(&d);
        }
}

/* ---- 3. the device, emulated ---- */

/* Per column, |device - CPU| <= EMU_TOL * sum_r |dy| (|xhat| + 1). Both add
 * the same kind of f32 terms in different orders: a team (a warp) adds its
 * rows in order (at most 9 here), a block its 4 warps' sums in a tree (2
 * levels), then the last block of each group of blocks the group's rows in
 * order and the last of those the groups' in order (at most 10 and 10: 93
 * blocks in 10 groups), at most (9 + 2 + 9 + 9) u of sum |dy xhat| off the
 * exact sum, the CPU at most (15 + 7) u; and the kernel's xhat (its warp's
 * sums of the row) differs from the CPU's by a few u of (|xhat| + 1). 64 u
 * = 3.8e-6 covers the two sums and the terms. */
#define EMU_TOL (64 * 0x1p-24)

/* The step's kernels compiled for the emulated device: the row step is one
 * kernel (alloy_s<k>_row), no column sum kernel after it. */
static emu_kernel *emulated(cgs_step *st, const alloy_graph *g, int lng, cgs_kernel_at **at)
{
    int row_step = g->comp.sched.step_of[lng], kernels = 0;
    for (int q = 0; q < st->prog.nkernels; q++)
        if (st->prog.kernels[q].step == row_step) {
            kernels++;
            if (!strstr(st->prog.kernels[q].name, "_row")) fail_msg("a second kernel in the row step: %s", st->prog.kernels[q].name);
        }
    if (kernels != 1) fail_msg("%d kernels in the row step", kernels);
    return cgs_compile(st, at);
}

/* dbeta exactly the f64 reference, dgamma within EMU_TOL of the CPU's;
 * returns dgamma's worst error in u of its scale. */
static double check_sums(const cgs_step *st, const ln_data *d, int dgamma, int dbeta, const char *what)
{
    int64_t C = d->sh.C;
    double *rg = test_malloc(sizeof(double) * (size_t)C * 3), *rb = rg + C, *sc = rg + 2 * C, worst = 0;
    reference(d, rg, rb, sc);
    const float *eg = st->buf[dgamma], *cg = st->ref[dgamma].data, *eb = st->buf[dbeta];
    for (int64_t j = 0; j < C; j++) {
        worst = fmax(worst, fabs((double)eg[j] - cg[j]) / sc[j]);
        if ((double)eb[j] != rb[j]) fail_msg("%s: emulated dbeta[%lld] %.9g, exactly %.9g", what, (long long)j, eb[j], rb[j]);
    }
    test_free(rg);
    assert_true(worst <= EMU_TOL);
    return worst / 0x1p-24;
}

static void test_the_emulated_kernels_agree_with_the_cpu(void **state)
{
    (void)state;
    emu_or_skip();
    for (int mode = 0; mode < MODES; mode++)
        for (int k = 0; k < NSHAPES; k++) {
            fusion(true);
            ln_data d = make_data(shapes[k], 29 + (uint64_t)k);
            alloy_graph *g = ln_graph(mode, shapes[k]);
            const ir_graph *c = compiled(g);
            int lng, dgamma, dbeta;
            backward_nodes(c, &lng, &dgamma, &dbeta);
            feed_set f = {0};
            for (int i = 0; i < 5; i++) f.t[f.n++] = d.feeds[i];
            cgs_step st;
            cgs_prepare(&st, g, &f);
            cgs_kernel_at *at;
            emu_kernel *ek = emulated(&st, g, lng, &at);
            emu_stats es = cgs_emulate(&st, at);
            if (es.failed) fail_msg("%s", es.first_failure);
            double worst = check_sums(&st, &d, dgamma, dbeta, mode_names[mode]);
            printf("%s %lld x %lld emulated: %d kernels, %d stored values; dbeta exact; dgamma max |device - cpu| "
                   "%.3g u of sum |dy| (|xhat| + 1)\n",
                   mode_names[mode], (long long)shapes[k].rows, (long long)shapes[k].C, es.kernels, es.values, worst);
            test_free(at);
            emu_free(ek);
            cgs_release(&st);
            alloy_graph_free(g);
            free_data(&d);
        }
}

/* The row kernel adds its blocks' partial rows itself, in two levels when
 * it has more than 32 blocks: 3001 x 45 (odd) takes 375 warp teams in 93
 * blocks, 10 groups of 10 blocks (the last of 3); 264 x 1100, a block a
 * row team, 33 blocks in 6 groups of 6 (the last of 3). f32, f16 and bf16
 * AMP, each emulated three times: the same bits each time, dbeta exact,
 * dgamma within EMU_TOL of the CPU's. The emulator runs blocks in index
 * order; on a GPU another block may finish last, and it adds the same rows
 * in the same (index) order; the emulator's race check holds each block's
 * reads of the others' rows to their fence and count. */
static void test_one_launch_adds_the_blocks_partials_with_the_same_bits_three_times(void **state)
{
    (void)state;
    emu_or_skip();
    static const ln_shape many[] = {{3001, 45}, {264, 1100}};
    for (int mode = 0; mode < MODES; mode++)
        for (int k = 0; k < 2; k++) {
            const ln_shape sh = many[k];
            fusion(true);
            ln_data d = make_data(sh, 77 + (uint64_t)k);
            alloy_graph *g = ln_graph(mode, sh);
            const ir_graph *c = compiled(g);
            int lng, dgamma, dbeta;
            backward_nodes(c, &lng, &dgamma, &dbeta);
            feed_set f = {0};
            for (int i = 0; i < 5; i++) f.t[f.n++] = d.feeds[i];
            cgs_step st;
            cgs_prepare(&st, g, &f);
            cgs_kernel_at *at;
            emu_kernel *ek = emulated(&st, g, lng, &at);
            unsigned grid = 0;
            for (int q = 0; q < st.prog.nkernels; q++)
                if (st.prog.kernels[q].step == g->comp.sched.step_of[lng]) grid = st.prog.kernels[q].grid;
            assert_int_equal(grid, k == 0 ? 93 : 33);
            int64_t C = sh.C;
            float *first = test_malloc(sizeof(float) * (size_t)C * 2);
            for (int run = 0; run < 3; run++) {
                memset(st.buf[dgamma], 0, sizeof(float) * (size_t)C);
                memset(st.buf[dbeta], 0, sizeof(float) * (size_t)C);
                emu_stats es = cgs_emulate(&st, at);
                if (es.failed) fail_msg("%s", es.first_failure);
                if (run == 0) {
                    memcpy(first, st.buf[dgamma], sizeof(float) * (size_t)C);
                    memcpy(first + C, st.buf[dbeta], sizeof(float) * (size_t)C);
                } else {
                    assert_memory_equal(first, st.buf[dgamma], sizeof(float) * (size_t)C);
                    assert_memory_equal(first + C, st.buf[dbeta], sizeof(float) * (size_t)C);
                }
            }
            double worst = check_sums(&st, &d, dgamma, dbeta, mode_names[mode]);
            print_message("%s %lld x %lld emulated three times, the same bits: %u blocks, one launch; dbeta exact; "
                          "dgamma max |device - cpu| %.3g u of sum |dy| (|xhat| + 1)\n",
                          mode_names[mode], (long long)sh.rows, (long long)C, grid, worst);
            test_free(at), test_free(first);
            emu_free(ek);
            cgs_release(&st);
            alloy_graph_free(g);
            free_data(&d);
        }
}

/* ---- 4. a bundle carries the column sums ---- */

static void test_a_bundle_runs_the_column_sums_as_compiled(void **state)
{
    (void)state;
    char dir[64];
    assert_true(test_make_dir(dir, sizeof dir, "/tmp/alloy-colsum-XXXXXX"));
    const char *path = test_path_in(dir, "ln.alloy");
    ln_data d = make_data(shapes[2], 41);
    float *want[3];
    run_grads(0, &d, true, 1, want);
    fusion(true);
    alloy_graph *g = ln_graph(0, shapes[2]);
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    alloy_graph_free(g);
    alloy_bundle *b;
    char err[512];
    if (alloy_bundle_load(path, &b, err, sizeof err)) fail_msg("load: %s", err);
    alloy_host_tensor f[3] = {{.name = "grad:gamma"}, {.name = "grad:beta"}, {.name = "grad:x"}};
    if (alloy_bundle_run(b, d.feeds, 5, f, 3)) fail_msg("run: %s", alloy_bundle_last_error(b));
    for (int i = 0; i < 3; i++) {
        assert_memory_equal(f[i].data, want[i], sizeof(float) * (size_t)alloy_host_tensor_numel(&f[i]));
        test_free(want[i]);
    }
    printf("the bundle of the f32 step (1001 x 69) reads its column sum parts back and runs to the JIT's bits\n");
    alloy_bundle_free(b);
    free_data(&d);
    test_remove_dir(dir);
}

/* ---- 5. out of memory in a run: an error, and the next run as before ---- */

static void test_every_allocation_failure_of_a_run_is_an_error_and_the_next_run_gives_the_same_bits(void **state)
{
    (void)state;
    ln_data d = make_data(shapes[2], 53);
    float *want[3];
    run_grads(0, &d, true, 2, want);
    fusion(true);
    setenv("ALLOY_NUM_THREADS", "2", 1);
    alloy_graph *g = ln_graph(0, shapes[2]);
    alloy_host_tensor f[3] = {{.name = "grad:gamma"}, {.name = "grad:beta"}, {.name = "grad:x"}};
    expect_ok(g, alloy_graph_run(g, d.feeds, 5, f, 3), "first run"); /* compiled, arena and threads there */
    alloy_set_allocator(test_failing_realloc, NULL);
    long n;
    for (n = 0;; n++) {
        test_alloc_count = 0, test_fail_at = n;
        alloy_status st = alloy_graph_run(g, d.feeds, 5, f, 3);
        test_fail_at = -1;
        if (test_alloc_count <= n) {
            expect_ok(g, st, "a run with no allocation failing");
            break;
        }
        if (st != ALLOY_ERR_OOM || !strstr(alloy_last_error(g), "out of memory"))
            fail_msg("allocation %ld of the run failing: %s \"%s\"", n, alloy_status_name(st), alloy_last_error(g));
        expect_ok(g, alloy_graph_run(g, d.feeds, 5, f, 3), "the run after");
        for (int i = 0; i < 3; i++)
            if (memcmp(f[i].data, want[i], sizeof(float) * (size_t)alloy_host_tensor_numel(&f[i])) != 0)
                fail_msg("allocation %ld failed; the next run's %s differs", n, f[i].name);
    }
    alloy_set_allocator(test_cmocka_realloc, NULL);
    printf("each of the %ld allocations of a run (1001 x 69, 2 threads) failed in turn: out of memory, and the next "
           "run the same bits\n", n);
    assert_true(n > 0);
    alloy_graph_free(g);
    unsetenv("ALLOY_NUM_THREADS");
    for (int i = 0; i < 3; i++) test_free(want[i]);
    free_data(&d);
}

/* ---- 6. what reads the product after its sums; what the verifier refuses ---- */

enum { PR = 300, PC = 40 };

/* What reads the product p after its column sums s: exp(p); p * s, which
 * reads the group's sum; exp(p) after t = s * s, a reader of the sum that
 * runs before it; or p + dy * s, whose other operand reads the sum (as one
 * group with p's, a member would read the sum). */
typedef enum product_reader { READ_EXP, READ_WITH_SUM, READ_AFTER_SUM_READER, READ_BESIDE_SUM_READER } product_reader;

/* p = dy * layer_norm(x), s = its column sums, and e read after them
 * (product_reader); outputs s, e and with READ_AFTER_SUM_READER t. */
static alloy_graph *shared_product_graph(product_reader how)
{
    alloy_graph *g = alloy_graph_new("shared");
    alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(PR, PC));
    alloy_tensor *dy = alloy_input(g, "dy", F32, 2, DIMS(PR, PC));
    alloy_tensor *p = alloy_set_name(g, alloy_mul(g, dy, alloy_layer_norm(g, x, NULL, NULL, 1e-5)), "p");
    alloy_tensor *s = alloy_set_name(g, alloy_reduce_sum(g, p, 1, DIMS(0), false), "s");
    alloy_output(g, "s", s);
    if (how == READ_AFTER_SUM_READER) alloy_output(g, "t", alloy_mul(g, s, s));
    alloy_tensor *e = how == READ_WITH_SUM            ? alloy_mul(g, p, s)
                      : how == READ_BESIDE_SUM_READER ? alloy_add(g, p, alloy_mul(g, dy, s))
                                                      : alloy_exp(g, p);
    alloy_output(g, "e", alloy_set_name(g, e, "e"));
    return g;
}

/* The product's case: fused, s in p's group; e there too (p never stored,
 * one step) unless it reads s or a reader of s comes first (then p is
 * stored for it: 2 steps, 3 with t's of READ_AFTER_SUM_READER); s and e
 * the unfused bits. */
static void product_case(product_reader how)
{
    bool joins = how == READ_EXP;
    float *x = test_malloc(sizeof(float) * PR * PC), *dy = test_malloc(sizeof(float) * PR * PC);
    test_rng = 5;
    fill(x, PR * PC, -2, 2);
    fill(dy, PR * PC, -1, 1);
    alloy_host_tensor feeds[2] = {{"x", F32, 2, {PR, PC}, x}, {"dy", F32, 2, {PR, PC}, dy}};
    float *res[2][2];
    int steps[2];
    for (int fused = 0; fused < 2; fused++) {
        fusion(fused);
        alloy_graph *g = shared_product_graph(how);
        const ir_graph *c = compiled(g);
        const schedule *s = &g->comp.sched;
        int p = node_named(c, "p"), sum = node_named(c, "s"), e = node_named(c, "e");
        steps[fused] = s->nsteps;
        bool in_group = c->nodes[sum]->group >= 0 && c->nodes[sum]->group == c->nodes[p]->group;
        bool e_in = c->nodes[e]->group >= 0 && c->nodes[e]->group == c->nodes[p]->group;
        bool stored = sched_stored(s, p);
        if (fused) ir_print_groups(c, stdout);
        alloy_host_tensor f[2] = {{.name = "s"}, {.name = "e"}};
        expect_ok(g, alloy_graph_run(g, feeds, 2, f, 2), "run");
        for (int i = 0; i < 2; i++) {
            size_t bytes = sizeof(float) * (size_t)alloy_host_tensor_numel(&f[i]);
            res[fused][i] = test_malloc(bytes);
            memcpy(res[fused][i], f[i].data, bytes);
        }
        alloy_graph_free(g);
        if (fused) {
            assert_true(in_group);
            /* a member reads no column sum of its group, and every reader of one runs after the group */
            assert_int_equal(e_in, joins);
            assert_int_equal(stored, !joins);
        }
    }
    assert_memory_equal(res[0][0], res[1][0], sizeof(float) * PC);
    assert_memory_equal(res[0][1], res[1][1], sizeof(float) * PR * PC);
    assert_int_equal(steps[1], joins ? 1 : how == READ_AFTER_SUM_READER ? 3 : 2);
    static const char *const what[] = {"exp(p)", "p * s", "exp(p) after s * s", "p + dy * s"};
    printf("%s after the column sums: %s; %d step(s) (%d unfused); s and e = unfused bit for bit\n", what[how],
           joins ? "in the group, p not stored" : "outside the group, p stored", steps[1], steps[0]);
    for (int i = 0; i < 4; i++) test_free(res[i / 2][i % 2]);
    test_free(x), test_free(dy);
}

static void test_a_reader_of_the_product_after_its_sums_joins_the_group(void **state)
{
    (void)state;
    product_case(READ_EXP);
}

static void test_a_product_read_with_its_sum_is_stored(void **state)
{
    (void)state;
    product_case(READ_WITH_SUM);
}

static void test_a_reader_of_the_sum_closes_the_group(void **state)
{
    (void)state;
    product_case(READ_AFTER_SUM_READER);
    product_case(READ_BESIDE_SUM_READER);
}

/* IR text parsed and verified (the verifier runs ir_check_groups): NULL and
 * the error in err when it refuses. */
static ir_graph *parse(const char *text, char *err, size_t len)
{
    err[0] = 0;
    return ir_parse(text, strlen(text), "test.ir", err, len);
}

static void test_the_verifier_refuses_a_member_reading_its_groups_column_sum(void **state)
{
    (void)state;
    char err[512];
    ir_graph *ok = parse("graph g {\n"
                         "  %x = input : f32[8,4]\n"
                         "  %1 = softmax(%x) {axis=-1} : f32[8,4] !group=0\n"
                         "  %2 = reduce_sum(%1) {axes=[0], keepdims=true} : f32[1,4] !group=0\n"
                         "  output \"y\" = %2\n"
                         "}\n",
                         err, sizeof err);
    if (!ok) fail_msg("a row group with a column sum: %s", err);
    ir_graph_free(ok);
    ir_graph *bad = parse("graph g {\n"
                          "  %x = input : f32[8,4]\n"
                          "  %1 = softmax(%x) {axis=-1} : f32[8,4] !group=0\n"
                          "  %2 = reduce_sum(%1) {axes=[0], keepdims=true} : f32[1,4] !group=0\n"
                          "  %3 = add(%1, %2) : f32[8,4] !group=0\n"
                          "  output \"y\" = %3\n"
                          "}\n",
                          err, sizeof err);
    assert_null(bad);
    printf("refused: %s\n", err);
    assert_non_null(strstr(err, "reads a column sum of its own row group"));
    /* a sum along the rows is no column sum */
    ir_graph *rows = parse("graph g {\n"
                           "  %x = input : f32[8,4]\n"
                           "  %1 = softmax(%x) {axis=-1} : f32[8,4] !group=0\n"
                           "  %2 = reduce_sum(%1) {axes=[1], keepdims=true} : f32[8,1] !group=0\n"
                           "  output \"y\" = %2\n"
                           "}\n",
                           err, sizeof err);
    assert_null(rows);
    printf("refused: %s\n", err);
    assert_non_null(strstr(err, "fusion group 0")); /* its other shape makes the group multi, which takes no reduce_sum */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        FUSE_TEST(test_the_layer_norm_backward_computes_dx_dgamma_and_dbeta_in_one_step),
        FUSE_TEST(test_dgamma_and_dbeta_are_the_unfused_bits_and_near_f64),
        FUSE_TEST(test_the_emulated_kernels_agree_with_the_cpu),
        FUSE_TEST(test_one_launch_adds_the_blocks_partials_with_the_same_bits_three_times),
        FUSE_TEST(test_a_bundle_runs_the_column_sums_as_compiled),
        FUSE_TEST(test_every_allocation_failure_of_a_run_is_an_error_and_the_next_run_gives_the_same_bits),
        FUSE_TEST(test_a_reader_of_the_product_after_its_sums_joins_the_group),
        FUSE_TEST(test_a_product_read_with_its_sum_is_stored),
        FUSE_TEST(test_a_reader_of_the_sum_closes_the_group),
        FUSE_TEST(test_the_verifier_refuses_a_member_reading_its_groups_column_sum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
