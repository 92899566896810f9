/* test_remat.c - the softmax's backward recomputing the softmax from the half-precision scores (passes/remat.c) in a written-out causal attention under mixed precision: no f32 T x T value stored, the CPU's bits unchanged, the emulated device against the CPU, which softmaxes each device recomputes by default. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "alloy/alloy.h"
#include "alloy/amp.h"
#include "cost/cost.h"
#include "cuda_emu/emu_device.h"
#include "cuda_emu/emu_loader.h"
#include "ir/ir.h"
#include "mha_support.h"
#include "runtime/backend.h"
#include "runtime/graph/graph_impl.h"
#include "step/schedule.h"
#include "support.h"

/* Batch, context, heads, head dim: C = H * D, x [N, C]. */
enum { B = 2, T = 17, H = 2, D = 8, C = H * D, N = B * T };

static const mha_shape shape = {B, T, H, D};

/* Attention as a user writes it: q, k, v = x wq, x wk, x wv split into
 * heads, softmax(causal_mask(q k^T / sqrt(D))) v, the heads joined back;
 * loss = sum(y * r); mixed precision in `amp` (f32: none); remat on:
 * remat=always (the CPU's default recomputes only big softmaxes), off: the
 * pass disabled. */
static alloy_graph *build(alloy_dtype amp, bool remat, const char *device)
{
    mha_graph m = mha_graph_new("remat", shape, ALLOY_F32);
    alloy_tensor *qkv = alloy_matmul(m.g, m.x, m.w, false, false);
    alloy_tensor *q = mha_heads(&m, qkv, 0), *k = mha_heads(&m, qkv, 1), *v = mha_heads(&m, qkv, 2);
    alloy_graph *g = mha_graph_finish(&m, mha_written_out(&m, q, k, v), false);
    if (amp != ALLOY_F32) expect_ok(g, alloy_graph_enable_amp(g, amp), "enable_amp");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    expect_ok(g, alloy_graph_set_option(g, "disable_passes", remat ? "attention" : "attention,remat"), "disable");
    if (remat) expect_ok(g, alloy_graph_set_option(g, "remat", "always"), "remat");
    return g;
}

/* What a run gives back (y, grad:x, grad:w as doubles) and what its schedule stores. */
typedef struct result {
    double *v[3];
    int wide_tt;       /* stored f32 values of shape [B, H, T, T] */
    int64_t tt_bytes;  /* bytes of every stored [B, H, T, T] value */
    int steps;
} result;

static const int64_t sizes[3] = {N * C, N * C, C * 3 * C};
static const char *const names[3] = {"y", "grad:x", "grad:w"};
static const int64_t feed_sizes[3] = {N * C, C * 3 * C, N * C}; /* x, w, r */

static result run(alloy_dtype amp, bool remat, const char *device, float *const feeds_data[3])
{
    alloy_graph *g = build(amp, remat, device);
    alloy_host_tensor feeds[3] = {{"x", ALLOY_F32, 2, {N, C}, feeds_data[0]},
                                  {"w", ALLOY_F32, 2, {C, 3 * C}, feeds_data[1]},
                                  {"r", ALLOY_F32, 2, {N, C}, feeds_data[2]}};
    alloy_host_tensor fetch[3] = {{.name = "y"}, {.name = "grad:x"}, {.name = "grad:w"}};
    expect_ok(g, alloy_graph_run(g, feeds, 3, fetch, 3), "run");
    result out = {{NULL}, 0, 0, g->comp.sched.nsteps};
    for (int i = 0; i < 3; i++) {
        out.v[i] = test_malloc(sizeof(double) * (size_t)sizes[i]);
        for (int64_t e = 0; e < sizes[i]; e++) out.v[i][e] = test_decode(fetch[i].dtype, fetch[i].data, e);
    }
    const ir_graph *c = g->compiled;
    for (int i = 0; i < c->nnodes; i++) {
        const ir_type *t = &c->nodes[i]->type;
        if (!sched_stored(&g->comp.sched, i) || t->rank != 4 || t->dims[2] != T || t->dims[3] != T) continue;
        if (g->comp.plan.view_of && g->comp.plan.view_of[i] >= 0) continue;
        out.tt_bytes += (int64_t)ir_nbytes(t);
        out.wide_tt += t->dtype == ALLOY_F32;
    }
    alloy_graph_free(g);
    return out;
}

static void free_result(result *r)
{
    for (int i = 0; i < 3; i++) test_free(r->v[i]);
}

static void make_feeds(float *f[3], unsigned seed)
{
    test_rng = seed;
    for (int i = 0; i < 3; i++) {
        f[i] = test_malloc(sizeof(float) * (size_t)feed_sizes[i]);
        for (int64_t e = 0; e < feed_sizes[i]; e++) f[i][e] = (float)test_uniform(-1, 1);
    }
}

static const alloy_dtype amps[] = {ALLOY_F16, ALLOY_BF16};

/* On the CPU the pass changes no bit; the plan stores one f32 [B, H, T, T]
 * value fewer (the softmax's output, B*H*T*T*4 bytes): the one left is
 * the gradient's product cast to f32 that the softmax's backward reads. */
static void test_the_cpu_gives_the_same_bits_and_stores_no_f32_scores(void **state)
{
    (void)state;
    for (size_t a = 0; a < 2; a++) {
        float *f[3];
        make_feeds(f, 7 + (unsigned)a);
        result on = run(amps[a], true, "cpu", f), off = run(amps[a], false, "cpu", f);
        for (int i = 0; i < 3; i++)
            for (int64_t e = 0; e < sizes[i]; e++)
                if (memcmp(&on.v[i][e], &off.v[i][e], sizeof(double)) != 0)
                    fail_msg("%s: %s[%lld] is %.9g recomputed, %.9g stored", alloy_dtype_name(amps[a]), names[i],
                             (long long)e, on.v[i][e], off.v[i][e]);
        print_message("# %s: [B,H,T,T] stored %lld bytes (f32: %d) recomputed, %lld (f32: %d) stored; %d and %d steps\n",
                      alloy_dtype_name(amps[a]), (long long)on.tt_bytes, on.wide_tt, (long long)off.tt_bytes,
                      off.wide_tt, on.steps, off.steps);
        /* left: the gradient's product dP cast to f32, which the softmax's backward reads */
        assert_int_equal(on.wide_tt, 1);
        assert_int_equal(off.wide_tt, 2);
        assert_int_equal(off.tt_bytes - on.tt_bytes, (int64_t)B * H * T * T * 4);
        assert_int_equal(on.steps, off.steps);
        free_result(&on), free_result(&off);
        for (int i = 0; i < 3; i++) test_free(f[i]);
    }
}

/* In an f32 step the softmax's output is a GEMM's operand, stored anyway:
 * the pass leaves the graph as it is (the same nodes, the same schedule). */
static void test_an_f32_step_keeps_its_stored_softmax(void **state)
{
    (void)state;
    int nodes[2], steps[2];
    for (int on = 0; on < 2; on++) {
        alloy_graph *g = build(ALLOY_F32, on, "cpu");
        if (graph_compile_ir(g)) fail_msg("%s", alloy_last_error(g));
        nodes[on] = g->compiled->nnodes, steps[on] = g->comp.sched.nsteps;
        alloy_graph_free(g);
    }
    assert_int_equal(nodes[1], nodes[0]);
    assert_int_equal(steps[1], steps[0]);
}

static alloy_graph *build_step(void *ctx)
{
    (void)ctx;
    return build(ALLOY_F16, true, "cpu");
}

static alloy_status compile_step(alloy_graph **g, void *ctx)
{
    (void)ctx;
    return graph_compile_ir(*g);
}

/* Compiling the step with allocation number k failing, for every k in
 * turn until a compile needs no more: each one OK or ALLOY_ERR_OOM with
 * everything freed (cmocka's allocator, leak-checked), the last one OK;
 * the pass's own allocations among them. */
static void test_compiling_fails_cleanly_at_every_allocation(void **state)
{
    (void)state;
    test_fail_each_allocation(build_step, compile_step, NULL);
}

/* The cost model of the step compiled for the device: the same launches,
 * and B*H*T*T*4 + B*H*T(T+1)/2*2 bytes fewer (hand-worked): the forward's
 * row kernel no longer writes the f32 softmax output (4 bytes an element,
 * the masked zeros too), and the backward's reads the f16/bf16 scores (2)
 * in its place (4), both only up to each causal row's diagonal
 * (T(T+1)/2 live elements a head). */
static void test_the_modelled_step_moves_the_softmax_output_and_half_its_live_reads_fewer(void **state)
{
    (void)state;
    for (size_t a = 0; a < 2; a++) {
        cost_model m[2];
        for (int on = 0; on < 2; on++) {
            alloy_graph *g = build(amps[a], on, "cuda");
            char err[1024];
            cg_program prog;
            lp_plan lp;
            if (graph_compile_ir(g)) fail_msg("%s", alloy_last_error(g));
            if (cg_emit(g->compiled, &g->comp.sched, &prog, err, sizeof err)) fail_msg("%s", err);
            if (cost_plan(g->compiled, &g->comp.sched, &g->comp.plan, &prog, &lp, err, sizeof err)) fail_msg("%s", err);
            if (cost_build(g->compiled, &g->comp.sched, &prog, &lp, NULL, &m[on], err, sizeof err)) fail_msg("%s", err);
            cost_apply(&m[on], cost_device_find("h100"));
            cost_plan_free(&lp);
            cg_program_free(&prog);
            alloy_graph_free(g);
        }
        print_message("# %s modelled: %d launches, %lld bytes recomputed; %d launches, %lld bytes stored\n",
                      alloy_dtype_name(amps[a]), m[1].n, (long long)m[1].total.bytes, m[0].n,
                      (long long)m[0].total.bytes);
        assert_int_equal(m[1].n, m[0].n);
        assert_int_equal(m[0].total.bytes - m[1].total.bytes, (int64_t)B * H * T * T * 4 + (int64_t)B * H * T * (T + 1) / 2 * 2);
        cost_free(&m[0]), cost_free(&m[1]);
    }
}

/* On the emulated device the recomputing step agrees with the CPU within
 * the bound of a chain of 6 half-precision ops (as test_attn_views'), and
 * gives the same bits as the device storing the softmax's output. */
static void test_the_emulated_device_agrees_with_the_cpu(void **state)
{
    (void)state;
    mha_emulated_device_or_skip();
    for (size_t a = 0; a < 2; a++) {
        float *f[3];
        make_feeds(f, 7 + (unsigned)a);
        result dev = run(amps[a], true, "cuda", f), stored = run(amps[a], false, "cuda", f), cpu = run(amps[a], true, "cpu", f);
        assert_int_equal(dev.wide_tt, 1);
        assert_int_equal(stored.wide_tt, 2);
        double tol = mha_chain_bound(6, 3 * C, amps[a]);
        for (int i = 0; i < 3; i++) {
            double d = mha_rel_diff(dev.v[i], cpu.v[i], sizes[i]), s = mha_rel_diff(dev.v[i], stored.v[i], sizes[i]);
            print_message("# emulated %s %s: against the CPU %.3g (bound %.3g), against the stored softmax %.3g\n",
                          alloy_dtype_name(amps[a]), names[i], d, tol, s);
            if (!(d <= tol)) fail_msg("%s %s: the device differs from the CPU by %.3g", alloy_dtype_name(amps[a]), names[i], d);
            assert_true(s == 0);
        }
        free_result(&dev), free_result(&stored), free_result(&cpu);
        for (int i = 0; i < 3; i++) test_free(f[i]);
    }
    rt_backend_set_cuda_opener(NULL);
}

/* A causal attention [1, 1, t, 8] under bf16 AMP, written out, on `device`
 * with the option remat at `remat` (NULL: its default), compiled (with
 * `open`, as a run compiles it: the backend opens first; `nvrtc` the
 * option's value, NULL: its default): how many softmaxes it has (2: the
 * backward's recomputed one too). */
static int softmaxes_opened(int64_t t, const char *device, const char *remat, bool open, const char *nvrtc)
{
    alloy_graph *g = alloy_graph_new("scores");
    int64_t dims[4] = {1, 1, t, 8};
    alloy_tensor *q = alloy_input(g, "q", ALLOY_F32, 4, dims), *k = alloy_input(g, "k", ALLOY_F32, 4, dims),
                 *v = alloy_input(g, "v", ALLOY_F32, 4, dims);
    alloy_tensor *p = alloy_softmax(g, alloy_causal_mask(g, alloy_matmul(g, q, k, false, true)), -1);
    expect_ok(g, alloy_graph_set_loss(g, alloy_reduce_sum(g, alloy_matmul(g, p, v, false, false), 0, NULL, false)),
              "loss");
    expect_ok(g, alloy_graph_request_grad(g, q), "grad q");
    expect_ok(g, alloy_graph_enable_amp(g, ALLOY_BF16), "enable_amp");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    expect_ok(g, alloy_graph_set_option(g, "disable_passes", "attention"), "disable");
    if (remat) expect_ok(g, alloy_graph_set_option(g, "remat", remat), "remat");
    if (nvrtc) expect_ok(g, alloy_graph_set_option(g, "nvrtc", nvrtc), "nvrtc");
    if (open ? graph_compile(g) : graph_compile_ir(g)) fail_msg("%s", alloy_last_error(g));
    int n = 0;
    for (int i = 0; i < g->compiled->nnodes; i++) n += g->compiled->nodes[i]->op == IR_OP_softmax;
    alloy_graph_free(g);
    return n;
}

static int softmaxes(int64_t t, const char *device, const char *remat)
{
    return softmaxes_opened(t, device, remat, false, NULL);
}

/* device=auto opens the backend before the passes run and compiles for
 * it: where the (emulated) GPU opens, every softmax is recomputed, as for
 * device=cuda; where no CUDA backend can open (an NVRTC that does not
 * load), the step is the CPU's. */
static void test_auto_compiles_for_the_device_that_opens(void **state)
{
    (void)state;
    assert_int_equal(softmaxes_opened(16, "auto", NULL, true, "/nonexistent/libnvrtc.so"), 1);
    mha_emulated_device_or_skip();
    assert_int_equal(softmaxes_opened(16, "auto", NULL, true, NULL), 2);
    assert_int_equal(softmaxes_opened(16, "cpu", NULL, true, NULL), 1);
    rt_backend_set_cuda_opener(NULL);
}

/* By default a CUDA compile recomputes every softmax it can; the CPU (and
 * device=auto compiled with no backend open) only one whose
 * f32 output takes at least 64 MiB (t = 4096: 4096 * 4096 * 4 bytes, one
 * short of it at 4095); remat=always recomputes the small one on the CPU
 * too, and a misspelt value names the valid ones. */
static void test_the_cpu_recomputes_only_big_softmaxes_by_default(void **state)
{
    (void)state;
    assert_int_equal(softmaxes(16, "cuda", NULL), 2);
    assert_int_equal(softmaxes(16, "cpu", NULL), 1);
    assert_int_equal(softmaxes(16, "auto", NULL), 1);
    assert_int_equal(softmaxes(4095, "cpu", NULL), 1);
    assert_int_equal(softmaxes(4096, "cpu", NULL), 2);
    assert_int_equal(softmaxes(16, "cpu", "always"), 2);
    assert_int_equal(softmaxes(16, "cuda", "auto"), 2);
    alloy_graph *g = alloy_graph_new("bogus");
    assert_int_equal(alloy_graph_set_option(g, "remat", "never"), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "auto or always"));
    alloy_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_cpu_gives_the_same_bits_and_stores_no_f32_scores),
        cmocka_unit_test(test_an_f32_step_keeps_its_stored_softmax),
        cmocka_unit_test(test_the_cpu_recomputes_only_big_softmaxes_by_default),
        cmocka_unit_test_setup_teardown(test_compiling_fails_cleanly_at_every_allocation, test_checked_alloc,
                                        test_plain_alloc),
        cmocka_unit_test(test_the_modelled_step_moves_the_softmax_output_and_half_its_live_reads_fewer),
        cmocka_unit_test(test_the_emulated_device_agrees_with_the_cpu),
        cmocka_unit_test(test_auto_compiles_for_the_device_that_opens),
    };
    return cmocka_run_group_tests_name("remat", tests, NULL, NULL);
}
