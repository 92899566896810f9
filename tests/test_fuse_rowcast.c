/* test_fuse_rowcast.c - the cast after the column sums (fuse.c's union takes the sums and leaves the group open): a layer_norm backward stores dx's f16/bf16 cast from its row kernel; on the CPU the same bits on any threads, near the unfused run, and a correctly rounded cast, emulated on the device near the CPU, its cast that of its own stored dx bit for bit. */
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
#include "codegen_support.h"
#include "fuse_support.h"
#include "ir/groups.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* ---- the graph: loss = sum(matmul(layer_norm(x + matmul(x, W1) + b1), W) * R) ----
 *
 * With AMP the matmuls run in f16 (bf16): the backward's dh, the layer_norm
 * gradient (f32, summed over the rows for dgamma, dbeta and db1 in the
 * same row group), is read by the residual's add in f32 and, cast to f16,
 * by the two GEMMs of W1's layer (dx's other term, dW1). That cast comes
 * after db1's sum, which the union takes without closing the group: a
 * transformer's lnf and ln2 backwards have this form (db1 the bias
 * gradient of the linear layer before them). */
enum { N = 8, MODES = 2 };
static const char *const mode_names[MODES] = {"f16 AMP", "bf16 AMP"};
static const alloy_dtype mode_dtype[MODES] = {ALLOY_F16, ALLOY_BF16};

typedef struct shape {
    int64_t rows, C;
} shape;

/* 256 x 64: two blocks of rows; 37 x 69: odd sizes, an f16 row of 138 bytes */
static const shape shapes[] = {{256, 64}, {37, 69}};
enum { NSHAPES = sizeof shapes / sizeof shapes[0] };

static alloy_graph *rc_graph(int mode, shape sh)
{
    alloy_graph *g = alloy_graph_new("rowcast");
    alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(sh.rows, sh.C));
    alloy_tensor *w1 = alloy_input(g, "W1", F32, 2, DIMS(sh.C, sh.C));
    alloy_tensor *gamma = alloy_input(g, "gamma", F32, 1, DIMS(sh.C));
    alloy_tensor *beta = alloy_input(g, "beta", F32, 1, DIMS(sh.C));
    alloy_tensor *w = alloy_input(g, "W", F32, 2, DIMS(sh.C, N));
    alloy_tensor *r = alloy_input(g, "R", F32, 2, DIMS(sh.rows, N));
    alloy_tensor *b1 = alloy_input(g, "b1", F32, 1, DIMS(sh.C));
    alloy_tensor *h = alloy_add(g, x, alloy_add(g, alloy_matmul(g, x, w1, false, false), b1));
    alloy_tensor *z = alloy_matmul(g, alloy_layer_norm(g, h, gamma, beta, 1e-5), w, false, false);
    alloy_tensor *loss = alloy_set_name(g, alloy_reduce_sum(g, alloy_mul(g, z, r), 0, NULL, false), "loss");
    alloy_output(g, "loss", loss);
    alloy_tensor *want[] = {x, w1, b1, gamma, beta};
    for (int i = 0; i < 5; i++) expect_ok(g, alloy_graph_request_grad(g, want[i]), "request_grad");
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    expect_ok(g, alloy_graph_enable_amp(g, mode_dtype[mode]), "enable_amp");
    return g;
}

/* The feeds from test_rng = seed (feed_set_free frees them). */
static feed_set make_data(shape sh, uint64_t seed)
{
    static const char *const names[7] = {"x", "W1", "gamma", "beta", "W", "R", "b1"};
    int64_t d[7][2] = {{sh.rows, sh.C}, {sh.C, sh.C}, {sh.C, 0}, {sh.C, 0}, {sh.C, N}, {sh.rows, N}, {sh.C, 0}};
    feed_set f = {0};
    test_rng = seed;
    for (int i = 0; i < 7; i++) {
        int64_t n;
        float *x = feed_floats(&f, names[i], d[i][1] ? 2 : 1, d[i], &n);
        if (i == 1) fill(x, n, -0.2, 0.2);
        else if (i == 2) fill(x, n, 0.5, 1.5);
        else if (i == 5)
            for (int64_t k = 0; k < n; k++) x[k] = 0.5f * (float)test_irand(-1, 1);
        else fill(x, n, -2, 2);
    }
    return f;
}

/* The compiled graph's layer_norm_grad_stats (dh) and the cast of it to
 * the low dtype (the test fails when either is missing). */
static void dh_and_cast(const ir_graph *c, int *lng, int *cast)
{
    *lng = first_node_of(c, IR_OP_layer_norm_grad_stats);
    *cast = -1;
    for (int i = *lng + 1; i < c->nnodes && *cast < 0; i++)
        if (c->nodes[i]->op == IR_OP_cast && c->nodes[i]->in[0] == *lng) *cast = i;
    if (*cast < 0) fail_msg("no cast of the layer_norm gradient");
}

/* |v - d| at most half a unit in the last place of dtype dt at d (a
 * correctly rounded cast, by fp64 arithmetic; subnormal f16 units 2^-24). */
static bool rounded_near(alloy_dtype dt, double v, double d)
{
    int e;
    frexp(d, &e); /* |d| in [2^(e-1), 2^e) */
    int bits = dt == ALLOY_F16 ? 11 : 8;
    double ulp = ldexp(1, e - bits);
    if (dt == ALLOY_F16 && ulp < 0x1p-24) ulp = 0x1p-24;
    return fabs(v - d) <= ulp / 2;
}

static double low_value(alloy_dtype dt, uint16_t h)
{
    uint32_t u = dt == ALLOY_F16 ? cvt_f16_bits_to_f32(h) : cvt_bf16_bits_to_f32(h);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- 1. one step ---- */

static void test_the_row_step_stores_dh_and_its_cast(void **state)
{
    (void)state;
    for (int mode = 0; mode < MODES; mode++)
        for (int k = 0; k < NSHAPES; k++) {
            int steps[2];
            for (int fused = 0; fused < 2; fused++) {
                fusion(fused);
                alloy_graph *g = rc_graph(mode, shapes[k]);
                const ir_graph *c = compiled(g);
                const schedule *s = &g->comp.sched;
                steps[fused] = s->nsteps;
                if (fused) {
                    expect_groups_legal(c);
                    int lng, cast;
                    dh_and_cast(c, &lng, &cast);
                    int st = expect_one_row_step(g, (int[]){lng, cast}, 2, "%s: dh and its cast", mode_names[mode]);
                    /* dh for the residual's add, its cast for the GEMMs: both stored */
                    assert_true(sched_stored(s, lng) && sched_stored(s, cast));
                    int colsums = 0;
                    for (int m = s->steps[st].first; m < s->steps[st].first + s->steps[st].n; m++)
                        colsums += c->nodes[s->members[m].node]->op == IR_OP_reduce_sum;
                    assert_int_equal(colsums, 3); /* dgamma, dbeta, db1 */
                    if (mode == 0 && k == 0) ir_print_groups(c, stdout);
                }
                alloy_graph_free(g);
            }
            printf("%s %lld x %lld: dh, dgamma, dbeta and dh's cast in one row step; %d steps (%d unfused)\n",
                   mode_names[mode], (long long)shapes[k].rows, (long long)shapes[k].C, steps[1], steps[0]);
        }
}

/* ---- 2. the CPU: the same bits on 1 and 2 threads, the cast correctly rounded ---- */

/* Fused against unfused (which rounds more intermediates to the low dtype,
 * docs/fusion.md): max |a - b| / max |b| within a few units of the low
 * dtype's rounding, 2^-8 for f16 (u = 2^-11), 2^-5 for bf16 (u = 2^-8). */
static const double unfused_tol[MODES] = {0x1p-8, 0x1p-5};

static void test_the_cpu_gives_the_same_bits_on_any_threads_and_a_correctly_rounded_cast(void **state)
{
    (void)state;
    static const char *const grads[5] = {"grad:x", "grad:W1", "grad:b1", "grad:gamma", "grad:beta"};
    for (int mode = 0; mode < MODES; mode++)
        for (int k = 0; k < NSHAPES; k++) {
            feed_set d = make_data(shapes[k], 41 + (uint64_t)k);
            float *want[5] = {0};
            double worst = 0;
            for (int run = 0; run < 3; run++) { /* fused on 1 and 2 threads; unfused */
                fusion(run < 2);
                setenv("ALLOY_NUM_THREADS", run == 1 ? "2" : "1", 1);
                alloy_graph *g = rc_graph(mode, shapes[k]);
                alloy_host_tensor f[5];
                for (int i = 0; i < 5; i++) f[i] = (alloy_host_tensor){.name = grads[i]};
                expect_ok(g, alloy_graph_run(g, d.t, d.n, f, 5), "run");
                for (int i = 0; i < 5; i++) {
                    int64_t n = alloy_host_tensor_numel(&f[i]), at;
                    if (!run) {
                        want[i] = test_malloc(sizeof(float) * (size_t)n);
                        memcpy(want[i], f[i].data, sizeof(float) * (size_t)n);
                    } else if (run == 1 && !test_same_bits(F32, f[i].data, want[i], n, &at)) {
                        fail_msg("%s %lldx%lld: %s[%lld] %.9g on 2 threads, %.9g on 1", mode_names[mode],
                                 (long long)shapes[k].rows, (long long)shapes[k].C, grads[i], (long long)at,
                                 ((float *)f[i].data)[at], want[i][at]);
                    } else if (run == 2) {
                        worst = fmax(worst, codegen_error(F32, want[i], f[i].data, n));
                    }
                }
                alloy_graph_free(g);
            }
            printf("%s %lld x %lld: grad x, W1, b1, gamma, beta the same bits on 1 and 2 threads; fused vs unfused "
                   "max rel %.3g (bound %.3g)\n",
                   mode_names[mode], (long long)shapes[k].rows, (long long)shapes[k].C, worst, unfused_tol[mode]);
            assert_true(worst <= unfused_tol[mode]);
            unsetenv("ALLOY_NUM_THREADS");
            for (int i = 0; i < 5; i++) test_free(want[i]);
            /* the fused step's cast: dh rounded to nearest, every element */
            fusion(true);
            alloy_graph *g = rc_graph(mode, shapes[k]);
            int lng, cast;
            dh_and_cast(compiled(g), &lng, &cast);
            cgs_step st;
            cgs_prepare(&st, g, &d);
            const float *dh = st.ref[lng].data;
            const uint16_t *lo = st.ref[cast].data;
            int64_t n = shapes[k].rows * shapes[k].C;
            for (int64_t i = 0; i < n; i++)
                if (!rounded_near(mode_dtype[mode], low_value(mode_dtype[mode], lo[i]), dh[i]))
                    fail_msg("%s: cast[%lld] %.9g is not dh %.9g rounded", mode_names[mode], (long long)i,
                             low_value(mode_dtype[mode], lo[i]), dh[i]);
            printf("%s %lld x %lld: the row step's cast of dh within half an ulp of dh (fp64), all %lld\n",
                   mode_names[mode], (long long)shapes[k].rows, (long long)shapes[k].C, (long long)n);
            cgs_release(&st);
            alloy_graph_free(g);
            feed_set_free(&d);
        }
}

/* ---- 3. the device, emulated ---- */

static void test_the_emulated_row_kernel_stores_the_cast_of_its_own_dh(void **state)
{
    (void)state;
    emu_or_skip();
    for (int mode = 0; mode < MODES; mode++)
        for (int k = 0; k < NSHAPES; k++) {
            fusion(true);
            feed_set d = make_data(shapes[k], 53 + (uint64_t)k);
            alloy_graph *g = rc_graph(mode, shapes[k]);
            int lng, cast;
            dh_and_cast(compiled(g), &lng, &cast);
            cgs_step st;
            cgs_prepare(&st, g, &d);
            cgs_kernel_at *at;
            emu_kernel *ek = cgs_compile(&st, &at);
            emu_stats es = cgs_emulate(&st, at);
            if (es.failed) fail_msg("%s", es.first_failure);
            /* the kernel's cast is its own stored dh rounded (the same bits as a cast kernel reading dh back) */
            const float *dh = st.buf[lng];
            const uint16_t *lo = st.buf[cast], *cpu = st.ref[cast].data;
            int64_t n = shapes[k].rows * shapes[k].C, same = 0;
            for (int64_t i = 0; i < n; i++) {
                uint32_t u;
                memcpy(&u, &dh[i], sizeof u);
                uint16_t r = (uint16_t)(mode_dtype[mode] == ALLOY_F16 ? cvt_f32_bits_to_f16(u) : cvt_f32_bits_to_bf16(u));
                if (lo[i] != r)
                    fail_msg("%s: emulated cast[%lld] 0x%04x, its dh %.9g rounds to 0x%04x", mode_names[mode],
                             (long long)i, lo[i], dh[i], r);
                same += lo[i] == cpu[i];
            }
            printf("%s %lld x %lld emulated: %d kernels, %d stored values within tolerance of the CPU; the cast is "
                   "the kernel's dh rounded, bit for bit; %lld of %lld the CPU's bits\n",
                   mode_names[mode], (long long)shapes[k].rows, (long long)shapes[k].C, es.kernels, es.values,
                   (long long)same, (long long)n);
            test_free(at);
            emu_free(ek);
            cgs_release(&st);
            alloy_graph_free(g);
            feed_set_free(&d);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        FUSE_TEST(test_the_row_step_stores_dh_and_its_cast),
        FUSE_TEST(test_the_cpu_gives_the_same_bits_on_any_threads_and_a_correctly_rounded_cast),
        FUSE_TEST(test_the_emulated_row_kernel_stores_the_cast_of_its_own_dh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
