/* test_causal_rows.c - causal rows (ir/causal_rows.c): which softmax and softmax_grad rows are causal, a hand-worked case where dy is inf at a masked column, the CPU against fp64, and the emulated device's row kernels (live columns loaded alone) against the CPU in f32, f16 and bf16, causal and not. */
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
#include "codegen/emit_impl.h"
#include "codegen_support.h"
#include "fuse_support.h"
#include "ir/groups.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* ---- 1. the derivation ---- */

/* softmax(cast(causal_mask(x))) and its gradient are causal; a mask of
 * another value, a softmax along another axis, or no mask are not; the
 * live columns of row r of [.., T, S] are r mod T + S - T + 1. */
static void test_a_softmax_of_masked_scores_and_its_gradient_have_causal_rows(void **state)
{
    (void)state;
    ir_graph *g = ir_graph_new("causal");
    assert_non_null(g);
    ir_type t = {.dtype = ALLOY_F16, .rank = 3, .dims = {2, 3, 5}};
    ir_attr minf = ir_a_float("value", -INFINITY), big = ir_a_float("value", -1e30), last = ir_a_int("axis", -1),
            mid = ir_a_int("axis", 1);
    int x = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &t, "x")->id;
    int mask = ir_add_node(g, IR_OP_causal_mask, 1, &x, 1, &minf, NULL, NULL)->id;
    int finite = ir_add_node(g, IR_OP_causal_mask, 1, &x, 1, &big, NULL, NULL)->id;
    ir_type t32 = t;
    t32.dtype = ALLOY_F32;
    int wide = ir_add_node(g, IR_OP_cast, 1, &mask, 0, NULL, &t32, NULL)->id;
    ir_node *sm = ir_add_node(g, IR_OP_softmax, 1, &wide, 1, &last, NULL, "p");
    ir_node *sm_mid = ir_add_node(g, IR_OP_softmax, 1, &wide, 1, &mid, NULL, "pm");
    ir_node *sm_finite = ir_add_node(g, IR_OP_softmax, 1, &finite, 1, &last, NULL, "pf");
    ir_node *sm_plain = ir_add_node(g, IR_OP_softmax, 1, &x, 1, &last, NULL, "px");
    assert_non_null(sm), assert_non_null(sm_mid), assert_non_null(sm_finite), assert_non_null(sm_plain);
    int narrow = ir_add_node(g, IR_OP_cast, 1, &sm->id, 0, NULL, &t, NULL)->id; /* the probabilities stored in f16 */
    int back = ir_add_node(g, IR_OP_cast, 1, &narrow, 0, NULL, &t32, NULL)->id;
    int dy = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &t32, "dy")->id;
    ir_node *grad = ir_add_node(g, IR_OP_softmax_grad, 2, (int[]){back, dy}, 1, &last, NULL, "dx");
    ir_node *grad_plain = ir_add_node(g, IR_OP_softmax_grad, 2, (int[]){dy, dy}, 1, &last, NULL, "dxp");
    assert_non_null(grad), assert_non_null(grad_plain);
    assert_true(ir_row_causal(g, sm));
    assert_true(ir_row_causal(g, grad));
    assert_false(ir_row_causal(g, sm_mid));
    assert_false(ir_row_causal(g, sm_finite));
    assert_false(ir_row_causal(g, sm_plain));
    assert_false(ir_row_causal(g, grad_plain));
    /* T = 3 queries, S = 5 keys: query i sees keys j <= i + 2 */
    static const int64_t want[6] = {3, 4, 5, 3, 4, 5};
    for (int r = 0; r < 6; r++) assert_int_equal(ir_causal_live(&t, r), want[r]);
    ir_graph_free(g);
}

/* ---- 2. the CPU's causal rows give the bits of whole rows ---- */

/* Row op `op` (softmax of x, or softmax_grad of y, dy) over [2, t, t] f32
 * rows by cpu_row_run on one thread, causal or over whole rows, into out. */
static void run_rows(int op, const float *a, const float *b, int64_t t, bool causal, float *out)
{
    ir_graph *g = ir_graph_new("rows");
    assert_non_null(g);
    ir_type ty = {.dtype = ALLOY_F32, .rank = 3, .dims = {2, t, t}};
    int ids[2] = {ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &ty, "a")->id,
                  ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &ty, "b")->id};
    ir_attr axis = ir_a_int("axis", -1);
    int nin = op == IR_OP_softmax_grad ? 2 : 1;
    ir_node *node = ir_add_node(g, op, nin, ids, 1, &axis, NULL, "row");
    assert_non_null(node);
    rt_tensor in[2] = {{ty, (void *)a}, {ty, (void *)b}}, y = {ty, out};
    cpu_exec x = {.nthreads = 1};
    assert_int_equal(cpu_row_run(&x, node, &y, in, 2 * t, NULL, causal), ALLOY_OK);
    ir_graph_free(g);
}

/* Rows of 1 to 300 (one leaf of the pairwise sum, several, a complete
 * tree of them (256: its live leaves 8 at a time), a partial last
 * live leaf; short rows run whole and masked, rows of 256 or more to their
 * live columns): the causal softmax of masked scores, and the causal
 * gradient with dy finite everywhere, are the whole rows' results bit for
 * bit (a zero's sign aside: the gradient's masked 0 * (dy - s) was -0
 * where dy < s, now +0); with dy inf or NaN at the masked columns the
 * causal gradient is the same bits again. */
static void test_causal_rows_on_the_cpu_give_the_bits_of_whole_rows_where_dy_is_finite(void **state)
{
    (void)state;
    static const int64_t sizes[] = {1, 2, 15, 16, 17, 33, 64, 100, 255, 256, 300};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int64_t t = sizes[k], n = 2 * t * t;
        float *x = test_malloc(sizeof(float) * (size_t)n), *dy = test_malloc(sizeof(float) * (size_t)n);
        float *y = test_malloc(sizeof(float) * (size_t)n), *whole = test_malloc(sizeof(float) * (size_t)n);
        float *live = test_malloc(sizeof(float) * (size_t)n);
        test_rng = 5 + (uint64_t)k;
        for (int64_t i = 0; i < n; i++) {
            int64_t row = i / t, col = i % t;
            x[i] = col > row % t ? -INFINITY : (float)test_uniform(-4, 4);
            dy[i] = (float)test_uniform(-2, 2);
        }
        for (int op = 0; op < 2; op++) {
            int code = op ? IR_OP_softmax_grad : IR_OP_softmax;
            run_rows(code, op ? y : x, dy, t, false, whole);
            run_rows(code, op ? y : x, dy, t, true, live);
            for (int64_t i = 0; i < n; i++)
                if (whole[i] != live[i] || (whole[i] != 0 && memcmp(&whole[i], &live[i], sizeof(float))))
                    fail_msg("%s, rows of %lld: element %lld: causal %.9g, whole row %.9g", op ? "softmax_grad" : "softmax",
                             (long long)t, (long long)i, live[i], whole[i]);
            if (!op) memcpy(y, whole, sizeof(float) * (size_t)n); /* the gradient's probabilities */
        }
        /* dy inf and NaN at the masked columns: the causal gradient's bits do not move */
        for (int64_t i = 0; i < n; i++)
            if (i % t > (i / t) % t) dy[i] = i % 2 ? INFINITY : NAN;
        run_rows(IR_OP_softmax_grad, y, dy, t, true, whole);
        if (memcmp(whole, live, sizeof(float) * (size_t)n)) fail_msg("rows of %lld: a non-finite masked dy moved the gradient", (long long)t);
        test_free(x), test_free(dy), test_free(y), test_free(whole), test_free(live);
    }
    printf("softmax and softmax_grad over causal rows of 1 to 300: the whole rows' bits\n");
}

/* ---- 2b. the hand-worked case: dy inf at a masked column ---- */

/* x [1, 2, 3] (T 2, S 3: row 0 sees columns 0-1, row 1 all three), a NaN
 * at the masked column; loss = sum(softmax(causal_mask(x)) * R), R inf at
 * the masked column, so dy = R there. By hand:
 *   row 0: y = [1/2, 1/2, 0], sum(y dy) over the live columns = 2,
 *          dx = y (dy - 2) = [-1/2, 1/2, 0];
 *   row 1: y = [1/3, 1/3, 1/3], dy = [0, 3, 6], sum = 3, dx = [-1, 0, 1].
 * Summing y dy over the whole row, as alloy did before, made row 0's sum
 * 0 * inf = NaN and dx NaN at every column of that row. */
static alloy_graph *hand_graph(alloy_dtype dt)
{
    alloy_graph *g = alloy_graph_new("hand");
    alloy_tensor *x = alloy_input(g, "x", dt, 3, DIMS(1, 2, 3));
    alloy_tensor *r = alloy_input(g, "R", dt, 3, DIMS(1, 2, 3));
    alloy_tensor *y = alloy_set_name(g, alloy_softmax(g, alloy_causal_mask(g, x), -1), "y");
    alloy_tensor *loss = alloy_set_name(g, alloy_reduce_sum(g, alloy_mul(g, y, r), 0, NULL, false), "loss");
    alloy_output(g, "y", y);
    alloy_output(g, "loss", loss);
    expect_ok(g, alloy_graph_request_grad(g, x), "request_grad");
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    return g;
}

static float hand_x[6] = {0, 0, NAN, 0, 0, 0};
static float hand_r[6] = {1, 3, INFINITY, 0, 3, 6};

static void test_an_inf_dy_at_a_masked_column_leaves_the_gradient_finite(void **state)
{
    (void)state;
    static const float want_y[6] = {0.5f, 0.5f, 0, 1 / 3.0f, 1 / 3.0f, 1 / 3.0f};
    static const float want_dx[6] = {-0.5f, 0.5f, 0, -1, 0, 1};
    for (int fused = 0; fused < 2; fused++) {
        fusion(fused);
        alloy_graph *g = hand_graph(F32);
        alloy_host_tensor in[2] = {{"x", F32, 3, {1, 2, 3}, hand_x}, {"R", F32, 3, {1, 2, 3}, hand_r}};
        alloy_host_tensor out[2] = {{.name = "y"}, {.name = "grad:x"}};
        expect_ok(g, alloy_graph_run(g, in, 2, out, 2), "run");
        const float *y = out[0].data, *dx = out[1].data;
        for (int i = 0; i < 6; i++) {
            if (fabsf(y[i] - want_y[i]) > 1e-7f || fabsf(dx[i] - want_dx[i]) > 1e-6f)
                fail_msg("%s: element %d: y %.9g dx %.9g, by hand %.9g and %.9g", fused ? "fused" : "unfused", i, y[i],
                         dx[i], want_y[i], want_dx[i]);
        }
        /* the masked columns' probabilities are exact zeros (+0), whatever x held there (NaN) */
        assert_true(y[2] == 0 && !signbit(y[2]));
        printf("%s: y and grad:x as worked by hand; the masked column's dy = inf leaves row 0's gradient finite\n",
               fused ? "fused" : "unfused");
        alloy_graph_free(g);
        /* f64 (the row programs as generated, not the f32 functions written out by hand) */
        double x64[6], r64[6];
        for (int i = 0; i < 6; i++) x64[i] = hand_x[i], r64[i] = hand_r[i];
        g = hand_graph(ALLOY_F64);
        alloy_host_tensor in64[2] = {{"x", ALLOY_F64, 3, {1, 2, 3}, x64}, {"R", ALLOY_F64, 3, {1, 2, 3}, r64}};
        alloy_host_tensor out64[2] = {{.name = "y"}, {.name = "grad:x"}};
        expect_ok(g, alloy_graph_run(g, in64, 2, out64, 2), "run f64");
        const double *y64 = out64[0].data, *dx64 = out64[1].data;
        for (int i = 0; i < 6; i++)
            if (fabs(y64[i] - want_y[i]) > 1e-7 || fabs(dx64[i] - want_dx[i]) > 1e-12)
                fail_msg("f64 %s: element %d: y %.17g dx %.17g, by hand %.9g and %.9g", fused ? "fused" : "unfused", i,
                         y64[i], dx64[i], want_y[i], want_dx[i]);
        alloy_graph_free(g);
    }
}

/* ---- 3. scores of a GEMM, rows on the CPU and on the emulated device ---- */

/* loss = sum(matmul(P, v) * R), P = softmax(causal_mask(matmul(a, b))) or
 * softmax(matmul(a, b)): with AMP the scores come from an f16 (bf16) GEMM,
 * the probabilities are cast to it for the second GEMM, and the backward's
 * dP is that GEMM's widened product, as in a written-out attention. */
enum { MODES = 3 };
static const char *const mode_names[MODES] = {"f32", "f16 AMP", "bf16 AMP"};
static const alloy_dtype mode_dtype[MODES] = {ALLOY_F32, ALLOY_F16, ALLOY_BF16};

typedef struct att_shape {
    int64_t b, t, s, d;
} att_shape;

/* T = S = 64 (a warp per row, 16-byte accesses), T 5 < S 9 (odd rows, a
 * column at a time), T 6 < S 1536 (a block per row), T 3 < S 9000 (rows that stream) */
static const att_shape att_shapes[] = {{4, 64, 64, 8}, {2, 5, 9, 4}, {1, 6, 1536, 4}, {1, 3, 9000, 4}};
enum { NSHAPES = sizeof att_shapes / sizeof att_shapes[0] };

static alloy_graph *att_graph(int mode, att_shape sh, bool causal)
{
    alloy_graph *g = alloy_graph_new("rows");
    alloy_tensor *a = alloy_input(g, "a", F32, 3, DIMS(sh.b, sh.t, sh.d));
    alloy_tensor *bt = alloy_input(g, "b", F32, 3, DIMS(sh.b, sh.d, sh.s));
    alloy_tensor *v = alloy_input(g, "v", F32, 3, DIMS(sh.b, sh.s, sh.d));
    alloy_tensor *r = alloy_input(g, "R", F32, 3, DIMS(sh.b, sh.t, sh.d));
    alloy_tensor *scores = alloy_matmul(g, a, bt, false, false);
    alloy_tensor *p = alloy_softmax(g, causal ? alloy_causal_mask(g, scores) : scores, -1);
    alloy_tensor *o = alloy_matmul(g, p, v, false, false);
    alloy_tensor *loss = alloy_set_name(g, alloy_reduce_sum(g, alloy_mul(g, o, r), 0, NULL, false), "loss");
    alloy_output(g, "loss", loss);
    alloy_tensor *want[] = {a, bt, v};
    for (int i = 0; i < 3; i++) expect_ok(g, alloy_graph_request_grad(g, want[i]), "request_grad");
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    if (mode) expect_ok(g, alloy_graph_enable_amp(g, mode_dtype[mode]), "enable_amp");
    return g;
}

/* The feeds a, b, v, R, uniform in [-1.5, 1.5) from test_rng = seed (feed_set_free frees them). */
static feed_set att_make(att_shape sh, uint64_t seed)
{
    static const char *const names[4] = {"a", "b", "v", "R"};
    int64_t d[4][3] = {{sh.b, sh.t, sh.d}, {sh.b, sh.d, sh.s}, {sh.b, sh.s, sh.d}, {sh.b, sh.t, sh.d}};
    feed_set f = {0};
    test_rng = seed;
    for (int i = 0; i < 4; i++) {
        int64_t n;
        float *x = feed_floats(&f, names[i], 3, d[i], &n);
        fill(x, n, -1.5, 1.5);
    }
    return f;
}

/* The first softmax and softmax_grad of compiled graph c (-1 when none). */
static void row_ops(const ir_graph *c, int *sm, int *grad)
{
    *sm = *grad = -1;
    for (int i = 0; i < c->nnodes; i++) {
        if (c->nodes[i]->op == IR_OP_softmax && *sm < 0) *sm = i;
        if (c->nodes[i]->op == IR_OP_softmax_grad && *grad < 0) *grad = i;
    }
    assert_true(*sm >= 0 && *grad >= 0);
}

/* The CPU's f32 causal probabilities against fp64 from the same scores:
 * softmax over each row's live columns, exact zeros past them. */
static void test_the_cpu_causal_softmax_matches_fp64_over_the_live_columns(void **state)
{
    (void)state;
    for (int k = 0; k < NSHAPES; k++) {
        att_shape sh = att_shapes[k];
        feed_set d = att_make(sh, 7 + (uint64_t)k);
        for (int fused = 0; fused < 2; fused++) {
            fusion(fused);
            alloy_graph *g = att_graph(0, sh, true);
            int sm, grad;
            row_ops(compiled(g), &sm, &grad);
            cgs_step st;
            cgs_prepare(&st, g, &d);
            const ir_graph *c = g->compiled;
            assert_true(ir_row_causal(c, c->nodes[sm]) && ir_row_causal(c, c->nodes[grad]));
            const float *x = st.ref[c->nodes[c->nodes[sm]->in[0]]->in[0]].data; /* the mask's operand: the scores */
            const float *y = st.ref[sm].data;
            double worst = 0;
            for (int64_t row = 0; row < sh.b * sh.t; row++) {
                int64_t live = row % sh.t + sh.s - sh.t + 1;
                const float *xr = x + row * sh.s, *yr = y + row * sh.s;
                double m = -INFINITY, sum = 0;
                for (int64_t j = 0; j < live; j++) m = fmax(m, xr[j]);
                for (int64_t j = 0; j < live; j++) sum += exp(xr[j] - m);
                for (int64_t j = 0; j < sh.s; j++) {
                    if (j >= live) {
                        if (yr[j] != 0) fail_msg("row %lld column %lld (masked): %.9g", (long long)row, (long long)j, yr[j]);
                        continue;
                    }
                    worst = fmax(worst, fabs(yr[j] - exp(xr[j] - m) / sum));
                }
            }
            printf("%s %lldx%lldx%lld: causal softmax within %.3g of fp64 at the live columns, 0 past them\n",
                   fused ? "fused" : "unfused", (long long)sh.b, (long long)sh.t, (long long)sh.s, worst);
            assert_true(worst <= 1e-6);
            cgs_release(&st);
            alloy_graph_free(g);
        }
        feed_set_free(&d);
    }
}

/* Every stored value of every step, emulated, within tolerance of the CPU
 * (masked zeros and NaNs included); the causal row steps are limited (the
 * scores and the probabilities loaded up to the live columns alone), the
 * others not. */
static void test_the_emulated_row_kernels_agree_with_the_cpu_causal_and_not(void **state)
{
    (void)state;
    emu_or_skip();
    fusion(true);
    for (int mode = 0; mode < MODES; mode++)
        for (int k = 0; k < NSHAPES; k++)
            for (int causal = 0; causal < 2; causal++) {
                att_shape sh = att_shapes[k];
                feed_set d = att_make(sh, 31 + (uint64_t)k);
                alloy_graph *g = att_graph(mode, sh, causal);
                int sm, grad;
                const ir_graph *c = compiled(g);
                row_ops(c, &sm, &grad);
                const schedule *s = &g->comp.sched;
                double share[2] = {cg_row_read_share(c, s, s->step_of[sm]), cg_row_read_share(c, s, s->step_of[grad])};
                double want = causal ? ((double)sh.t * (sh.t + 1) / 2 + (double)sh.t * (sh.s - sh.t)) / ((double)sh.t * sh.s) : 1;
                for (int q = 0; q < 2; q++)
                    if (fabs(share[q] - want) > 1e-12) {
                        ir_print_groups(c, stdout);
                        fail_msg("%s %s step of %s rows reads %.4f of its rows, want %.4f", mode_names[mode],
                                 q ? "softmax_grad" : "softmax", causal ? "causal" : "full", share[q], want);
                    }
                emu_stats es = emulate_step(g, &d);
                printf("%s %lldx%lldx%lld %s: %d kernels, %d stored values within tolerance (worst %.3g), rows read %.3f\n",
                       mode_names[mode], (long long)sh.b, (long long)sh.t, (long long)sh.s, causal ? "causal" : "full",
                       es.kernels, es.values, es.worst, share[0]);
                assert_int_equal(es.failed, 0);
                alloy_graph_free(g);
                feed_set_free(&d);
            }
}

/* The hand case on the emulated device: the same finite gradient as the CPU. */
static void test_the_emulated_hand_case_gives_the_cpu_values(void **state)
{
    (void)state;
    emu_or_skip();
    for (int fused = 0; fused < 2; fused++) {
        fusion(fused);
        alloy_graph *g = hand_graph(F32);
        feed_set f = {.n = 2};
        f.t[0] = (alloy_host_tensor){"x", F32, 3, {1, 2, 3}, hand_x};
        f.t[1] = (alloy_host_tensor){"R", F32, 3, {1, 2, 3}, hand_r};
        emu_stats es = emulate_step(g, &f);
        assert_int_equal(es.failed, 0);
        assert_true(es.kernels > 0);
        alloy_graph_free(g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_softmax_of_masked_scores_and_its_gradient_have_causal_rows),
        cmocka_unit_test(test_causal_rows_on_the_cpu_give_the_bits_of_whole_rows_where_dy_is_finite),
        FUSE_TEST(test_an_inf_dy_at_a_masked_column_leaves_the_gradient_finite),
        FUSE_TEST(test_the_cpu_causal_softmax_matches_fp64_over_the_live_columns),
        FUSE_TEST(test_the_emulated_row_kernels_agree_with_the_cpu_causal_and_not),
        FUSE_TEST(test_the_emulated_hand_case_gives_the_cpu_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
