/* test_fuse.c - fusion groups: which nodes the fuse pass groups and refuses, the fused executor against the unfused one (bits, threads, broadcasts, out of memory), every bf16 pattern through a group's loads and stores, the pass on 100k random nodes. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "ir/groups.h"
#include "passes/pass.h"
#include "models.h"
#include "base/convert.h"
#include "runtime/cpu/cpu.h"
#include "runtime/graph/graph_impl.h"
#include "fuse_support.h"
#include "support.h"

/* Stated bounds (docs/fusion.md, "Numerics"):
 *  - f32 and f64 groups: bit-for-bit the unfused results. Every member
 *    computes in the same type as unfused (f32, or f64), and an f32/f64
 *    intermediate kept in a chunk buffer is exactly the value unfused
 *    stores.
 *  - f16 groups: loads convert to f32, intermediates stay f32, the store
 *    rounds once; unfused rounds every intermediate to f16 as well. For the
 *    mul -> add -> tanh -> mul chain on inputs without cancellation, each
 *    unfused rounding moves the value by <= 2^-11 relative and the chain's
 *    condition numbers are <= 1, so the two unrounded results differ by
 *    < 3 * 2^-11 relative and their f16 roundings by at most 2 ulps:
 *    |fused - unfused| <= 2^-9 |unfused| (F16_CHAIN_REL). The fused value is
 *    also within half an f16 ulp (plus f32 noise) of the exact result.
 * (The transformer training step fused and unfused: test_fuse_block.c.) */
#define F16_CHAIN_REL 0x1p-9

/* ---- the reference: every node by its own kernel, nothing freed ---- */

/* Runs the compiled graph node by node through the op table's kernels
 * (cpu_elementwise for every elementwise node), as the executor did before
 * fusion; inputs are bound from feeds by name. Values are al_malloc'd. */
static rt_tensor *reference_run(const ir_graph *c, const alloy_host_tensor *feeds, int nfeeds)
{
    rt_tensor *v = test_calloc((size_t)c->nnodes, sizeof *v);
    cpu_exec x = {.nthreads = 1};
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        v[i].type = n->type;
        if (n->op == IR_OP_input) {
            for (int f = 0; f < nfeeds; f++)
                if (strcmp(feeds[f].name, n->name) == 0) v[i].data = feeds[f].data;
            assert_non_null(v[i].data);
            continue;
        }
        assert_true(n->op != IR_OP_param && n->op != IR_OP_state);
        v[i].data = al_malloc(ir_nbytes(&n->type) ? ir_nbytes(&n->type) : 1);
        rt_tensor in[3];
        assert_true(n->nin <= 3);
        for (int j = 0; j < n->nin; j++) in[j] = v[n->in[j]];
        assert_int_equal(cpu_ops[n->op].kernel(&x, n, &v[i], in), ALLOY_OK);
    }
    return v;
}

static void free_reference(const ir_graph *c, rt_tensor *v)
{
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i]->op != IR_OP_input) al_free(v[i].data);
    test_free(v);
}

/* Runs the compiled graph through the executor (fused when it has groups),
 * keeping every output; values are freed by the caller (cpu_release_values). */
static int exec_threads; /* threads of executor_run (0: every CPU) */

static rt_tensor *executor_run(const ir_graph *c, const alloy_host_tensor *feeds, int nfeeds,
                               alloy_status *st, char *err, size_t errlen)
{
    rt_tensor *v = test_calloc((size_t)c->nnodes, sizeof *v);
    for (int i = 0; i < c->nnodes; i++)
        for (int f = 0; f < nfeeds; f++)
            if (c->nodes[i]->op == IR_OP_input && strcmp(feeds[f].name, c->nodes[i]->name) == 0)
                v[i].data = feeds[f].data;
    cpu_exec x = {.nthreads = exec_threads};
    *st = cpu_run_graph(&x, c, v, NULL);
    if (err) snprintf(err, errlen, "%s", x.error);
    return v;
}

static void free_executor_run(const ir_graph *c, rt_tensor *v)
{
    cpu_release_values(c, v);
    test_free(v);
}

/* Largest |a - b| / max(|b|, tiny) over n elements of dtype dt. */
static double max_rel_diff(alloy_dtype dt, const void *a, const void *b, int64_t n, double tiny)
{
    double *x = test_malloc(sizeof(double) * (size_t)n), *y = test_malloc(sizeof(double) * (size_t)n);
    cvt_load_f64(dt, a, x, (size_t)n);
    cvt_load_f64(dt, b, y, (size_t)n);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(x[i] - y[i]) / fmax(fabs(y[i]), tiny);
        if (!(d <= worst)) worst = d;
    }
    test_free(x);
    test_free(y);
    return worst;
}

/* ---- the chain x -> mul -> add -> tanh -> mul ---- */

enum { ROWS = 48, COLS = 80 };

/* "out" = tanh(x * scale + shift) * gain with scale, shift [COLS] constants
 * and gain a scalar; x [ROWS, COLS] of dtype dt. Intermediates are named. */
static alloy_graph *chain_graph(alloy_dtype dt)
{
    alloy_graph *g = alloy_graph_new("chain");
    double scale[COLS], shift[COLS];
    for (int i = 0; i < COLS; i++) scale[i] = 0.5 + i / (double)COLS, shift[i] = 0.25 + 0.01 * i;
    alloy_tensor *x = alloy_input(g, "x", dt, 2, DIMS(ROWS, COLS));
    alloy_tensor *a = alloy_set_name(g, alloy_mul(g, x, alloy_constant(g, dt, 1, DIMS(COLS), scale)), "scaled");
    alloy_tensor *b = alloy_set_name(g, alloy_add(g, a, alloy_constant(g, dt, 1, DIMS(COLS), shift)), "shifted");
    alloy_tensor *t = alloy_set_name(g, alloy_tanh(g, b), "squashed");
    alloy_tensor *y = alloy_set_name(g, alloy_mul(g, t, alloy_scalar(g, dt, 1.75)), "out");
    alloy_output(g, "out", y); /* errors (out of memory) show at the run */
    return g;
}

/* x in [0.5, 1): positive everywhere, so the chain has no cancellation. */
static void chain_input(alloy_dtype dt, void *x)
{
    float v[ROWS * COLS];
    test_rng = 7;
    fill(v, ROWS * COLS, 0.5, 1.0);
    cvt_store_f32(dt, v, x, ROWS * COLS);
}

static void test_a_mul_add_tanh_mul_chain_is_one_group_whose_intermediates_are_never_materialized(void **state)
{
    (void)state;
    alloy_graph *g = chain_graph(F32);
    const ir_graph *c = compiled(g);
    ir_print(c, stdout);
    assert_int_equal(group_count(c), 1);
    int k = group_of(c, "out");
    assert_int_equal(k, 0);
    assert_int_equal(group_of(c, "scaled"), k);
    assert_int_equal(group_of(c, "shifted"), k);
    assert_int_equal(group_of(c, "squashed"), k);
    assert_int_equal(group_size(c, k), 4);
    expect_groups_legal(c);
    float x[ROWS * COLS];
    chain_input(F32, x);
    alloy_host_tensor feed = {"x", F32, 2, {ROWS, COLS}, x}, fetch = {.name = "out"};
    expect_ok(g, alloy_graph_run(g, &feed, 1, &fetch, 1), "run");
    /* the run's values: only the group's output was ever allocated */
    assert_false(sched_stored(&g->comp.sched, node_named(c, "scaled")));
    assert_false(sched_stored(&g->comp.sched, node_named(c, "shifted")));
    assert_false(sched_stored(&g->comp.sched, node_named(c, "squashed")));
    assert_true(sched_stored(&g->comp.sched, node_named(c, "out")));
    alloy_graph_free(g);
}

static void test_a_fused_f32_chain_gives_the_bits_of_the_unfused_run(void **state)
{
    (void)state;
    alloy_graph *g = chain_graph(F32);
    const ir_graph *c = compiled(g);
    float x[ROWS * COLS];
    chain_input(F32, x);
    alloy_host_tensor feed = {"x", F32, 2, {ROWS, COLS}, x};
    rt_tensor *ref = reference_run(c, &feed, 1);
    alloy_status st;
    rt_tensor *got = executor_run(c, &feed, 1, &st, NULL, 0);
    assert_int_equal(st, ALLOY_OK);
    int out = node_named(c, "out");
    assert_memory_equal(got[out].data, ref[out].data, sizeof(float) * ROWS * COLS);
    free_executor_run(c, got);
    free_reference(c, ref);
    alloy_graph_free(g);
}

static void test_a_fused_f16_chain_stays_within_two_f16_ulps_of_the_unfused_run(void **state)
{
    (void)state;
    alloy_graph *g = chain_graph(F16);
    const ir_graph *c = compiled(g);
    assert_int_equal(group_size(c, group_of(c, "out")), 4);
    uint16_t x[ROWS * COLS];
    chain_input(F16, x);
    alloy_host_tensor feed = {"x", F16, 2, {ROWS, COLS}, x};
    rt_tensor *ref = reference_run(c, &feed, 1);
    alloy_status st;
    rt_tensor *got = executor_run(c, &feed, 1, &st, NULL, 0);
    assert_int_equal(st, ALLOY_OK);
    int out = node_named(c, "out");
    double rel = max_rel_diff(F16, got[out].data, ref[out].data, ROWS * COLS, 1e-30);
    /* the fused value is the f16 rounding of the chain computed in f32 */
    double xs[ROWS * COLS], ys[ROWS * COLS], exact_worst = 0;
    cvt_load_f64(F16, x, xs, ROWS * COLS);
    cvt_load_f64(F16, got[out].data, ys, ROWS * COLS);
    for (int i = 0; i < ROWS * COLS; i++) {
        int col = i % COLS;
        double s = cvt_f16_to_f32(cvt_f32_to_f16((float)(0.5 + col / (double)COLS)));
        double b = cvt_f16_to_f32(cvt_f32_to_f16((float)(0.25 + 0.01 * col)));
        double want = tanh(xs[i] * s + b) * 1.75;
        double ulp = ldexp(1.0, ilogb(want) - 10);
        exact_worst = fmax(exact_worst, fabs(ys[i] - want) / ulp);
    }
    printf("f16 chain: fused vs unfused max rel diff %.3g (bound %.3g); fused vs exact %.3f f16 ulp\n",
           rel, F16_CHAIN_REL, exact_worst);
    assert_true(rel <= F16_CHAIN_REL);
    assert_true(rel > 0); /* the intermediates really skipped their f16 roundings */
    assert_true(exact_worst <= 0.5 + 1e-3);
    free_executor_run(c, got);
    free_reference(c, ref);
    alloy_graph_free(g);
}

/* Every bf16 pattern through a fused group's loads and stores: "wide" = x
 * cast to f32 (the load itself: a signalling NaN comes back quiet), "sq" =
 * wide * wide cast to bf16 (exact in f32, so the cast rounds: ties, overflow
 * to inf, NaNs, zeros and subnormals), "sum" = sq + y, "narrow" = an f32 z
 * cast to bf16 (z: every bf16 pattern with low halves that round up, down
 * and to even, signalling NaNs among them) and "tail" = narrow + y (so that
 * the cast runs in a group), checked bit for bit
 * against convert.c's scalar conversions around the same f32 arithmetic.
 * NB is no multiple of 16 or of the chunk, so the tails run too. */
enum { NB = 65536 + 37 };

static void test_a_fused_bf16_group_loads_and_stores_every_bf16_pattern_as_the_scalar_conversions_do(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("bf16_edges");
    alloy_tensor *x = alloy_input(g, "x", BF16, 1, DIMS(NB));
    alloy_tensor *y = alloy_input(g, "y", BF16, 1, DIMS(NB));
    alloy_tensor *wide = alloy_set_name(g, alloy_cast(g, x, F32), "wide");
    alloy_tensor *sq = alloy_set_name(g, alloy_cast(g, alloy_mul(g, wide, wide), BF16), "sq");
    alloy_output(g, "wide", wide);
    alloy_output(g, "sq", sq);
    alloy_output(g, "sum", alloy_set_name(g, alloy_add(g, sq, y), "sum"));
    alloy_tensor *z = alloy_input(g, "z", F32, 1, DIMS(NB));
    alloy_tensor *narrow = alloy_set_name(g, alloy_cast(g, z, BF16), "narrow");
    alloy_output(g, "narrow", narrow);
    alloy_output(g, "tail", alloy_set_name(g, alloy_add(g, narrow, y), "tail"));
    const ir_graph *c = compiled(g);
    assert_int_equal(group_of(c, "sq"), group_of(c, "sum"));
    assert_int_equal(group_of(c, "wide"), group_of(c, "sum"));
    assert_true(group_of(c, "narrow") >= 0);
    uint16_t *xs = test_malloc(sizeof(uint16_t) * NB), *ys = test_malloc(sizeof(uint16_t) * NB);
    float *zs = test_malloc(sizeof(float) * NB);
    static const uint32_t low[] = {0x0000, 0x7fff, 0x8000, 0x8001, 0xffff, 0x0001, 0x4000};
    for (uint32_t i = 0; i < NB; i++) {
        xs[i] = (uint16_t)i;
        uint32_t zb = (uint32_t)(uint16_t)i << 16 | low[i % 7];
        memcpy(&zs[i], &zb, sizeof zb);
        uint16_t h = (uint16_t)(i * 40503u); /* finite: a NaN of sq alone decides the sum's NaN */
        ys[i] = (h & 0x7f80) == 0x7f80 ? h ^ 0x4000 : h;
    }
    alloy_host_tensor feeds[3] = {{"x", BF16, 1, {NB}, xs}, {"y", BF16, 1, {NB}, ys}, {"z", F32, 1, {NB}, zs}};
    alloy_status st;
    rt_tensor *got = executor_run(c, feeds, 3, &st, NULL, 0);
    assert_int_equal(st, ALLOY_OK);
    const uint16_t *gsq = got[node_named(c, "sq")].data, *gsum = got[node_named(c, "sum")].data;
    const float *gwide = got[node_named(c, "wide")].data;
    const uint16_t *gnarrow = got[node_named(c, "narrow")].data, *gtail = got[node_named(c, "tail")].data;
    int64_t bad_sq = 0, bad_sum = 0, bad_wide = 0, bad_narrow = 0;
    for (int64_t i = 0; i < NB; i++) {
        uint16_t n = cvt_f32_to_bf16(zs[i]);
        bad_narrow += gnarrow[i] != n || gtail[i] != cvt_f32_to_bf16(cvt_bf16_to_f32(n) + cvt_bf16_to_f32(ys[i]));
        float want = cvt_bf16_to_f32(xs[i]);
        bad_wide += memcmp(&gwide[i], &want, sizeof want) != 0;
        uint16_t p = cvt_f32_to_bf16(want * want), q = cvt_f32_to_bf16(cvt_bf16_to_f32(p) + cvt_bf16_to_f32(ys[i]));
        bad_sq += gsq[i] != p;
        bad_sum += gsum[i] != q;
        if ((gsq[i] != p || gsum[i] != q) && bad_sq + bad_sum <= 4)
            printf("x 0x%04x y 0x%04x: sq 0x%04x want 0x%04x, sum 0x%04x want 0x%04x\n", xs[i], ys[i], gsq[i], p,
                   gsum[i], q);
    }
    assert_int_equal(bad_wide, 0);
    assert_int_equal(bad_narrow, 0);
    assert_int_equal(bad_sq, 0);
    assert_int_equal(bad_sum, 0);
    free_executor_run(c, got);
    test_free(xs);
    test_free(ys);
    test_free(zs);
    alloy_graph_free(g);
}

static void test_a_fetched_intermediate_is_stored_and_equals_its_unfused_value(void **state)
{
    (void)state;
    float x[ROWS * COLS];
    chain_input(F32, x);
    alloy_host_tensor feed = {"x", F32, 2, {ROWS, COLS}, x};
    float want[ROWS * COLS];
    fusion(false);
    alloy_graph *plain = chain_graph(F32);
    alloy_host_tensor fetch = {.name = "shifted"};
    expect_ok(plain, alloy_graph_run(plain, &feed, 1, &fetch, 1), "unfused run");
    memcpy(want, fetch.data, sizeof want);
    assert_int_equal(group_count(plain->compiled), 0);
    fusion(true);
    alloy_graph *g = chain_graph(F32);
    expect_ok(g, alloy_graph_run(g, &feed, 1, &fetch, 1), "fused run");
    assert_int_equal(group_of(g->compiled, "shifted"), 0);
    assert_non_null(fetch.data);
    assert_memory_equal(fetch.data, want, sizeof want);
    /* not fetched this time: not stored */
    expect_ok(g, alloy_graph_run(g, &feed, 1, NULL, 0), "fused run without fetches");
    assert_false(sched_stored(&g->comp.sched, node_named(g->compiled, "shifted")));
    alloy_graph_free(plain);
    alloy_graph_free(g);
}

/* ---- what joins and what does not ---- */

static void test_a_member_read_by_a_reduction_outside_its_group_is_stored(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("reduced");
    alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(16, 24));
    alloy_tensor *a = alloy_set_name(g, alloy_mul(g, x, alloy_scalar(g, F32, 3.0)), "a");
    alloy_tensor *b = alloy_set_name(g, alloy_sigmoid(g, a), "b");
    alloy_tensor *r = alloy_set_name(g, alloy_reduce_sum(g, a, 1, DIMS(1), false), "r");
    alloy_output(g, "b", b);
    alloy_output(g, "r", r);
    const ir_graph *c = compiled(g);
    ir_print(c, stdout);
    expect_groups_legal(c);
    assert_true(group_of(c, "a") >= 0);
    assert_int_equal(group_of(c, "a"), group_of(c, "b"));
    assert_int_equal(group_of(c, "r"), -1);
    float xs[16 * 24];
    test_rng = 11;
    fill(xs, 16 * 24, -1, 1);
    alloy_host_tensor feed = {"x", F32, 2, {16, 24}, xs};
    rt_tensor *ref = reference_run(c, &feed, 1);
    alloy_status st;
    rt_tensor *v = test_calloc((size_t)c->nnodes, sizeof *v);
    v[node_named(c, "x")].data = xs;
    bool *keep = test_calloc((size_t)c->nnodes, sizeof(bool));
    keep[node_named(c, "a")] = true; /* keep it to look at it after the run */
    cpu_exec ex = {.nthreads = 1};
    st = cpu_run_graph(&ex, c, v, keep);
    assert_int_equal(st, ALLOY_OK);
    int ia = node_named(c, "a"), ib = node_named(c, "b"), ir = node_named(c, "r");
    assert_non_null(v[ia].data);
    assert_memory_equal(v[ia].data, ref[ia].data, sizeof xs);
    assert_memory_equal(v[ib].data, ref[ib].data, sizeof xs);
    assert_memory_equal(v[ir].data, ref[ir].data, sizeof(float) * 16);
    cpu_release_values(c, v);
    test_free(v);
    test_free(keep);
    free_reference(c, ref);
    alloy_graph_free(g);
}

static void test_no_group_crosses_a_shape_change(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("shapes");
    alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(8, 16));
    alloy_tensor *v = alloy_input(g, "v", F32, 1, DIMS(16));
    alloy_tensor *a = alloy_set_name(g, alloy_mul(g, x, alloy_scalar(g, F32, 2.0)), "a");
    alloy_tensor *a2 = alloy_set_name(g, alloy_neg(g, a), "a2");
    alloy_tensor *flat = alloy_reshape(g, a2, 1, DIMS(128));
    alloy_tensor *b = alloy_set_name(g, alloy_add(g, flat, alloy_scalar(g, F32, 1.0)), "b");
    alloy_tensor *b2 = alloy_set_name(g, alloy_tanh(g, b), "b2");
    /* a broadcast changes the shape too: [16] -> [8,16] */
    alloy_tensor *s = alloy_set_name(g, alloy_exp(g, v), "s");
    alloy_tensor *s2 = alloy_set_name(g, alloy_sqrt(g, s), "s2");
    alloy_tensor *m = alloy_set_name(g, alloy_mul(g, x, s2), "m");
    alloy_tensor *m2 = alloy_set_name(g, alloy_relu(g, m), "m2");
    alloy_output(g, "b2", b2);
    alloy_output(g, "m2", m2);
    const ir_graph *c = compiled(g);
    ir_print(c, stdout);
    expect_groups_legal(c);
    assert_int_equal(group_count(c), 4);
    assert_int_equal(group_of(c, "a"), group_of(c, "a2"));
    assert_int_equal(group_of(c, "b"), group_of(c, "b2"));
    assert_int_equal(group_of(c, "s"), group_of(c, "s2"));
    assert_int_equal(group_of(c, "m"), group_of(c, "m2"));
    assert_true(group_of(c, "a") != group_of(c, "b"));
    assert_true(group_of(c, "s") != group_of(c, "m"));
    alloy_graph_free(g);
}

static void test_a_fusion_through_a_path_outside_the_group_is_refused(void **state)
{
    (void)state;
    /* a -> r (reduce, outside) -> b, and a -> b: {a, b} would have to run
     * before r (r reads a) and after it (b reads r) */
    alloy_graph *g = alloy_graph_new("outside");
    alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(4, 8));
    alloy_tensor *a = alloy_set_name(g, alloy_mul(g, x, x), "a");
    alloy_tensor *r = alloy_reduce_sum(g, a, 1, DIMS(1), true);
    alloy_tensor *b = alloy_set_name(g, alloy_sub(g, a, r), "b");
    alloy_tensor *b2 = alloy_set_name(g, alloy_square(g, b), "b2");
    alloy_output(g, "y", b2);
    const ir_graph *c = compiled(g);
    ir_print(c, stdout);
    expect_groups_legal(c);
    assert_int_equal(group_of(c, "a"), -1); /* alone: no group of one */
    assert_true(group_of(c, "b") >= 0);
    assert_int_equal(group_of(c, "b"), group_of(c, "b2"));
    alloy_graph_free(g);
}

static void test_a_diamond_of_elementwise_nodes_becomes_one_group(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("diamond");
    alloy_tensor *x = alloy_input(g, "x", F32, 1, DIMS(100));
    alloy_tensor *a = alloy_set_name(g, alloy_exp(g, x), "a");
    alloy_tensor *b = alloy_set_name(g, alloy_tanh(g, a), "b");
    alloy_tensor *cc = alloy_set_name(g, alloy_sigmoid(g, a), "c");
    alloy_tensor *d = alloy_set_name(g, alloy_div(g, b, cc), "d");
    alloy_output(g, "d", d);
    const ir_graph *c = compiled(g);
    expect_groups_legal(c);
    assert_int_equal(group_count(c), 1);
    assert_int_equal(group_size(c, 0), 4);
    alloy_graph_free(g);
}

static void test_the_verifier_refuses_a_group_annotation_that_cannot_run_at_its_last_member(void **state)
{
    (void)state;
    static const char text[] = "graph bad {\n"
                               "  %x = input : f32[4,8]\n"
                               "  %a = mul(%x, %x) : f32[4,8] !group=0\n"
                               "  %r = reduce_sum(%a) {axes=[1], keepdims=true} : f32[4,1]\n"
                               "  %b = sub(%a, %r) : f32[4,8] !group=0\n"
                               "  output \"b\" = %b\n"
                               "}\n";
    char err[600];
    assert_null(ir_parse(text, sizeof text - 1, "bad.ir", err, sizeof err));
    printf("parser: %s\n", err);
    assert_non_null(strstr(err, "fusion group 0 cannot run at its last member"));
    assert_non_null(strstr(err, "reduce_sum r"));
    assert_non_null(strstr(err, "mul a"));
    /* and the fuse pass, run on such a graph, drops the annotation it cannot honour */
    char ok_text[sizeof text];
    memcpy(ok_text, text, sizeof text);
    for (char *p = strstr(ok_text, " !group=0"); p; p = strstr(p, " !group=0")) memset(p, ' ', 9);
    ir_graph *c = ir_parse(ok_text, sizeof ok_text - 1, "ok.ir", err, sizeof err);
    if (!c) fail_msg("%s", err);
    c->nodes[1]->group = c->nodes[3]->group = 0;
    pass_options opts;
    memset(&opts, 0, sizeof opts);
    assert_int_equal(pass_fuse(&c, &opts), ALLOY_OK);
    for (int i = 0; i < c->nnodes; i++) assert_int_equal(c->nodes[i]->group, -1);
    ir_graph_free(c);
}

static void test_the_verifier_names_a_member_its_group_kind_cannot_take(void **state)
{
    (void)state;
    static const char text[] = "graph bad {\n"
                               "  %x = input : f32[4,8]\n"
                               "  %a = mul(%x, %x) : f32[4,8] !group=7\n"
                               "  %\"h.r\" = reduce_sum(%a) {axes=[1], keepdims=true} : f32[4,1] !group=7\n"
                               "  output \"r\" = %\"h.r\"\n"
                               "}\n";
    char err[600];
    assert_null(ir_parse(text, sizeof text - 1, "bad.ir", err, sizeof err));
    printf("parser: %s\n", err);
    assert_non_null(strstr(err, "fusion group 7 (multi): reduce_sum h.r is not elementwise"));
}

/* A kept statistic is stored by its group and read by later steps: a row
 * group that reads its own layer_norm_mean is refused, naming the rule,
 * and the same graph with the gradient in a group of its own is fine. */
static void test_a_row_group_may_not_read_its_own_kept_statistic(void **state)
{
    (void)state;
    static const char text[] = "graph bad {\n"
                               "  %x = input : f32[4,8]\n"
                               "  %dy = input : f32[4,8]\n"
                               "  %m = layer_norm_mean(%x) : f32[4,1] !group=3\n"
                               "  %r = layer_norm_rstd(%x) {eps=1e-5} : f32[4,1] !group=3\n"
                               "  %dx = layer_norm_grad_stats(%x, %dy, %m, %r) : f32[4,8] !group=3\n"
                               "  output \"dx\" = %dx\n"
                               "}\n";
    char err[600];
    assert_null(ir_parse(text, sizeof text - 1, "bad.ir", err, sizeof err));
    printf("parser: %s\n", err);
    assert_non_null(strstr(err, "fusion group 3 (row): layer_norm_grad_stats dx reads a per-row statistic of its own group"));
    char ok[sizeof text];
    memcpy(ok, text, sizeof text);
    char *last = strstr(ok, "f32[4,8] !group=3");
    last[strlen("f32[4,8] !group=")] = '4';
    ir_graph *g = ir_parse(ok, sizeof ok - 1, "ok.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    ir_graph_free(g);
}

static void test_alloy_no_fuse_leaves_every_node_ungrouped(void **state)
{
    (void)state;
    fusion(false);
    alloy_graph *g = chain_graph(F32);
    const ir_graph *c = compiled(g);
    assert_int_equal(group_count(c), 0);
    alloy_graph_free(g);
    fusion(true);
}

/* Odd shapes with every kind of broadcast input (row, column, scalar, a
 * [3,1,37] slab), big enough to cross chunk boundaries and to be split
 * across threads: the executor against the per-node kernels, bit for bit,
 * on 1 and on 3 threads. */
static void test_broadcast_inputs_of_every_shape_load_as_the_unfused_kernel_loads_them(void **state)
{
    (void)state;
    enum { A = 3, B = 500, C = 37 };
    alloy_graph *g = alloy_graph_new("broadcast");
    alloy_tensor *x = alloy_input(g, "x", F32, 3, DIMS(A, B, C));
    alloy_tensor *col = alloy_input(g, "col", F32, 2, DIMS(B, 1));
    alloy_tensor *row = alloy_input(g, "row", F16, 1, DIMS(C));
    alloy_tensor *slab = alloy_input(g, "slab", F32, 3, DIMS(A, 1, C));
    alloy_tensor *y = alloy_add(g, alloy_mul(g, x, col), alloy_cast(g, row, F32));
    y = alloy_where(g, alloy_greater(g, y, alloy_scalar(g, F32, 0.0)), alloy_tanh(g, y), alloy_mul(g, y, slab));
    y = alloy_sub(g, y, alloy_scalar(g, F32, 0.125));
    alloy_output(g, "y", y);
    const ir_graph *c = compiled(g);
    ir_print(c, stdout);
    expect_groups_legal(c);
    int out = output_node(c, "y");
    assert_true(group_size(c, c->nodes[out]->group) >= 4);
    static float xs[A * B * C], cols[B], slabs[A * C];
    uint16_t rows[C];
    float rowf[C];
    test_rng = 3;
    fill(xs, A * B * C, -2, 2), fill(cols, B, -1, 1), fill(slabs, A * C, -1, 1), fill(rowf, C, -1, 1);
    cvt_store_f32(F16, rowf, rows, C);
    alloy_host_tensor feeds[4] = {{"x", F32, 3, {A, B, C}, xs}, {"col", F32, 2, {B, 1}, cols},
                                  {"row", F16, 1, {C}, rows}, {"slab", F32, 3, {A, 1, C}, slabs}};
    rt_tensor *ref = reference_run(c, feeds, 4);
    for (int threads = 1; threads <= 3; threads += 2) {
        exec_threads = threads;
        alloy_status st;
        rt_tensor *got = executor_run(c, feeds, 4, &st, NULL, 0);
        assert_int_equal(st, ALLOY_OK);
        assert_memory_equal(got[out].data, ref[out].data, sizeof xs);
        free_executor_run(c, got);
    }
    exec_threads = 0;
    free_reference(c, ref);
    alloy_graph_free(g);
}

static void test_a_big_group_gives_the_same_bits_on_one_thread_and_on_two(void **state)
{
    (void)state;
    enum { N = 1 << 20 };
    alloy_graph *g = alloy_graph_new("big");
    alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(1024, 1024));
    alloy_tensor *b = alloy_input(g, "b", F32, 1, DIMS(1024));
    alloy_tensor *y = alloy_gelu(g, alloy_add(g, x, b));
    y = alloy_mul(g, y, alloy_sigmoid(g, y));
    alloy_output(g, "y", y);
    float *xs = test_malloc(sizeof(float) * N), bs[1024];
    test_rng = 5;
    fill(xs, N, -3, 3), fill(bs, 1024, -1, 1);
    alloy_host_tensor feeds[2] = {{"x", F32, 2, {1024, 1024}, xs}, {"b", F32, 1, {1024}, bs}};
    float *one = test_malloc(sizeof(float) * N);
    for (int threads = 1; threads <= 2; threads++) {
        expect_ok(g, alloy_graph_set_option(g, "num_threads", threads == 1 ? "1" : "2"), "set_option");
        alloy_host_tensor fetch = {.name = "y"};
        expect_ok(g, alloy_graph_run(g, feeds, 2, &fetch, 1), "run");
        if (threads == 1) memcpy(one, fetch.data, sizeof(float) * N);
        else assert_memory_equal(one, fetch.data, sizeof(float) * N);
    }
    assert_int_equal(group_count(g->compiled), 1);
    test_free(one);
    test_free(xs);
    alloy_graph_free(g);
}

/* A graph make() builds and one run of it, to fail at each allocation. */
typedef struct oom_run {
    alloy_graph *(*make)(void);
    const alloy_host_tensor *feeds;
    int nfeeds;
    alloy_host_tensor *fetch;
    int nfetch;
} oom_run;

static alloy_status build_and_run(alloy_graph **g, void *ctx)
{
    const oom_run *r = ctx;
    *g = r->make();
    return *g ? alloy_graph_run(*g, r->feeds, r->nfeeds, r->fetch, r->nfetch) : ALLOY_ERR_OOM;
}

/* Builds make()'s graph and runs it once with each of its allocations
 * failing in turn (test_fail_each_allocation): every run OK or
 * ALLOY_ERR_OOM, freeing everything, the last one OK. */
static void expect_clean_oom(alloy_graph *(*make)(void), const alloy_host_tensor *feeds, int nfeeds,
                             alloy_host_tensor *fetch, int nfetch)
{
    oom_run r = {make, feeds, nfeeds, fetch, nfetch};
    test_fail_each_allocation(NULL, build_and_run, &r);
}

static alloy_graph *chain_f32_graph(void) { return chain_graph(F32); }

static void test_a_fused_run_that_runs_out_of_memory_fails_cleanly_at_every_allocation(void **state)
{
    (void)state;
    float x[ROWS * COLS];
    chain_input(F32, x);
    alloy_host_tensor feed = {"x", F32, 2, {ROWS, COLS}, x};
    expect_clean_oom(chain_f32_graph, &feed, 1, NULL, 0);
}

/* The same for a GEMM group (f16 matmul + bias + gelu_tanh + cast to f32)
 * feeding a row group (softmax + cast to f16). */
static alloy_graph *gemm_row_graph(void)
{
    alloy_graph *g = alloy_graph_new("gemm_row");
    alloy_tensor *a = alloy_input(g, "a", F16, 2, DIMS(16, 8));
    alloy_tensor *w = alloy_input(g, "w", F16, 2, DIMS(8, 8));
    alloy_tensor *b = alloy_input(g, "b", F16, 1, DIMS(8));
    alloy_tensor *h = alloy_cast(g, alloy_gelu_tanh(g, alloy_add(g, alloy_matmul(g, a, w, false, false), b)), F32);
    alloy_output(g, "p", alloy_cast(g, alloy_softmax(g, h, -1), F16));
    return g;
}

static void test_a_gemm_and_a_row_group_that_run_out_of_memory_fail_cleanly_at_every_allocation(void **state)
{
    (void)state;
    uint16_t a[16 * 8], w[8 * 8], b[8];
    for (int i = 0; i < 16 * 8; i++) a[i] = 0x3c00; /* 1.0 */
    for (int i = 0; i < 8 * 8; i++) w[i] = (uint16_t)(0x3000 + i); /* small positive values */
    for (int i = 0; i < 8; i++) b[i] = 0;
    alloy_host_tensor feeds[3] = {{"a", F16, 2, {16, 8}, a}, {"w", F16, 2, {8, 8}, w}, {"b", F16, 1, {8}, b}};
    const ir_graph *c = NULL;
    alloy_graph *probe = gemm_row_graph();
    c = compiled(probe);
    assert_int_equal(group_count(c), 2); /* the gemm group and the row group */
    alloy_graph_free(probe);
    alloy_host_tensor fetch[1] = {{.name = "p"}};
    expect_clean_oom(gemm_row_graph, feeds, 3, fetch, 1);
}

/* nnodes nodes over four f32 inputs ([64] .. [512]): random unary and
 * binary elementwise ops over recent values of one shape, and every 7th a
 * reduce_sum to [1] (outside any group) that a later op broadcasts back. */
static ir_graph *random_graph(int nnodes)
{
    enum { WINDOW = 8 };
    test_rng = 99;
    ir_graph *g = ir_graph_new("random");
    int recent[4][WINDOW];
    for (int k = 0; k < 4; k++) {
        ir_type t = {F32, 1, {64 << k}};
        char name[8];
        snprintf(name, sizeof name, "x%d", k);
        int in = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &t, name)->id;
        for (int w = 0; w < WINDOW; w++) recent[k][w] = in;
    }
    static const int ops[] = {IR_OP_neg, IR_OP_relu, IR_OP_add, IR_OP_mul, IR_OP_sub, IR_OP_tanh};
    while (g->nnodes < nnodes) {
        int k = (int)(test_uniform(0, 1) * 4), op = ops[(int)(test_uniform(0, 1) * 6)];
        int in[2] = {recent[k][(int)(test_uniform(0, 1) * WINDOW)], recent[k][(int)(test_uniform(0, 1) * WINDOW)]};
        ir_node *n;
        if (g->nnodes % 7 == 0) {
            ir_attr a[2] = {ir_a_ints("axes", 1, (const int64_t[]){0}), ir_a_bool("keepdims", true)};
            int r = ir_add_node(g, IR_OP_reduce_sum, 1, in, 2, a, NULL, NULL)->id;
            n = ir_add_node(g, IR_OP_add, 2, (int[]){in[1], r}, 0, NULL, NULL, NULL);
        } else {
            n = ir_add_node(g, op, ir_ops[op].min_in, in, 0, NULL, NULL, NULL);
        }
        assert_non_null(n);
        recent[k][(int)(test_uniform(0, 1) * WINDOW)] = n->id;
    }
    ir_add_output(g, "y", g->nnodes - 1);
    assert_int_equal(g->status, ALLOY_OK);
    return g;
}

static void test_the_pass_groups_100k_random_nodes_in_milliseconds_and_every_group_is_legal(void **state)
{
    (void)state;
    ir_graph *g = random_graph(100000);
    pass_options opts;
    memset(&opts, 0, sizeof opts);
    double t0 = test_now_ms();
    assert_int_equal(pass_fuse(&g, &opts), ALLOY_OK);
    double ms = test_now_ms() - t0;
    int grouped = 0;
    for (int i = 0; i < g->nnodes; i++) grouped += g->nodes[i]->group >= 0;
    printf("fuse on %d nodes: %.1f ms, %d groups, %d nodes grouped\n", g->nnodes, ms, group_count(g), grouped);
    assert_true(ms < 1000); /* was 10 s with a test that walked whole groups */
    assert_true(grouped > g->nnodes / 2);
    expect_groups_legal(g);
    ir_graph_free(g);
}

/* An update stored over the input it reads (an optimizer's state written
 * in place) as a member of a group: a member reading that input before the
 * update's member reads it in place, one reading it after (or the update
 * itself, computed in its destination) reads the chunk as it was loaded,
 * not the update's store. Over [3, 300] f32 (several chunks):
 * s' = s + y stored over s, then before = s * y (read first) and after =
 * s - y (read after the store), each by hand. */
static void test_an_update_stored_over_its_input_leaves_later_readers_the_old_values(void **state)
{
    (void)state;
    enum { R = 3, C = 300, NN = R * C };
    for (int order = 0; order < 2; order++) {
        ir_graph *g = ir_graph_new("in_place");
        assert_non_null(g);
        ir_type t = {.dtype = ALLOY_F32, .rank = 2, .dims = {R, C}};
        int s = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &t, "s")->id;
        int y = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &t, "y")->id;
        int before = -1, update, after = -1;
        if (order == 0) before = ir_add_node(g, IR_OP_mul, 2, (int[]){s, y}, 0, NULL, NULL, "before")->id;
        update = ir_add_node(g, IR_OP_add, 2, (int[]){s, y}, 0, NULL, NULL, "update")->id;
        if (order == 1) after = ir_add_node(g, IR_OP_sub, 2, (int[]){s, y}, 0, NULL, NULL, "after")->id;
        int other = order == 0 ? before : after;
        float *sv = test_malloc(sizeof(float) * NN), *yv = test_malloc(sizeof(float) * NN);
        float *s0 = test_malloc(sizeof(float) * NN), *ov = test_malloc(sizeof(float) * NN);
        test_rng = 40 + (uint64_t)order;
        for (int i = 0; i < NN; i++) s0[i] = sv[i] = (float)test_uniform(-2, 2), yv[i] = (float)test_uniform(-2, 2);
        rt_tensor values[5];
        memset(values, 0, sizeof values);
        for (int i = 0; i < g->nnodes; i++) values[i].type = g->nodes[i]->type;
        values[s].data = sv, values[y].data = yv, values[update].data = sv, values[other].data = ov;
        int state_of[5] = {-1, -1, -1, -1, -1};
        state_of[update] = s;
        sched_member members[2] = {{order == 0 ? before : update, 0}, {order == 0 ? update : after, 0}};
        cpu_workers *w = cpu_workers_new();
        assert_non_null(w);
        cpu_exec x = {.nthreads = 1, .state_of = state_of};
        assert_int_equal(cpu_run_group_ex(&x, g, members, 2, values, w, NULL, NULL), ALLOY_OK);
        for (int i = 0; i < NN; i++) {
            float want = order == 0 ? s0[i] * yv[i] : s0[i] - yv[i];
            if (sv[i] != s0[i] + yv[i] || ov[i] != want)
                fail_msg("%s the update, element %d: s' = %.9g (want %.9g), %s = %.9g (want %.9g)",
                         order ? "after" : "before", i, (double)sv[i], (double)(s0[i] + yv[i]),
                         order ? "after" : "before", (double)ov[i], (double)want);
        }
        cpu_workers_free(w);
        test_free(sv), test_free(yv), test_free(s0), test_free(ov);
        ir_graph_free(g);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* the printed IR interleaves with cmocka's lines */
    const struct CMUnitTest tests[] = {
        FUSE_TEST(test_a_mul_add_tanh_mul_chain_is_one_group_whose_intermediates_are_never_materialized),
        FUSE_TEST(test_a_fused_f32_chain_gives_the_bits_of_the_unfused_run),
        FUSE_TEST(test_a_fused_f16_chain_stays_within_two_f16_ulps_of_the_unfused_run),
        FUSE_TEST(test_a_fused_bf16_group_loads_and_stores_every_bf16_pattern_as_the_scalar_conversions_do),
        FUSE_TEST(test_a_fetched_intermediate_is_stored_and_equals_its_unfused_value),
        FUSE_TEST(test_a_member_read_by_a_reduction_outside_its_group_is_stored),
        FUSE_TEST(test_no_group_crosses_a_shape_change),
        FUSE_TEST(test_a_fusion_through_a_path_outside_the_group_is_refused),
        FUSE_TEST(test_a_diamond_of_elementwise_nodes_becomes_one_group),
        FUSE_TEST(test_the_verifier_refuses_a_group_annotation_that_cannot_run_at_its_last_member),
        FUSE_TEST(test_the_verifier_names_a_member_its_group_kind_cannot_take),
        FUSE_TEST(test_a_row_group_may_not_read_its_own_kept_statistic),
        FUSE_TEST(test_alloy_no_fuse_leaves_every_node_ungrouped),
        FUSE_TEST(test_broadcast_inputs_of_every_shape_load_as_the_unfused_kernel_loads_them),
        FUSE_TEST(test_a_big_group_gives_the_same_bits_on_one_thread_and_on_two),
        FUSE_TEST(test_an_update_stored_over_its_input_leaves_later_readers_the_old_values),
        FUSE_TEST(test_a_fused_run_that_runs_out_of_memory_fails_cleanly_at_every_allocation),
        FUSE_TEST(test_a_gemm_and_a_row_group_that_run_out_of_memory_fail_cleanly_at_every_allocation),
        FUSE_TEST(test_the_pass_groups_100k_random_nodes_in_milliseconds_and_every_group_is_legal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
