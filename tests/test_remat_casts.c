/* test_remat_casts.c - the backward casting again what the forward cast to f16/bf16 (passes/remat_casts.c): the planned peak of a small AMP step against a hand-worked count, the same bits with the rule and without, an f32 step left alone, allocation failures. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <string.h>

#include "alloy/alloy.h"
#include "alloy/amp.h"
#include "alloy/train.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* The end both steps share: the second layer's residual, x2 = x1 + y1, and loss = sum(x2 * r). */
#define SECOND_RESIDUAL_AND_LOSS                                                                   \
    "  %x2 = add(%x1, %y1) : f32[64,32]\n"                                                         \
    "  %p = mul(%x2, %r) : f32[64,32]\n"                                                           \
    "  %loss = reduce_sum(%p) {axes=[0, 1], keepdims=false} : f32[]\n"                             \
    "  output \"loss\" = %loss\n"                                                                  \
    "  loss %loss\n"                                                                               \
    "}\n"

/* Two pre-norm residual layers, x1 = x + ln(x) w0, x2 = x1 + ln(x1) w1, of
 * 64 rows of 32 (an f32 row tensor 8192 bytes, f16 4096, a weight's f16
 * copy 2048, a layer norm's mean or rstd 256); loss = sum(x2 * r). */
static const char residual_ir[] =
    "graph res {\n"
    "  %x = input : f32[64,32]\n"
    "  %r = input : f32[64,32]\n"
    "  %g0 = param {init=\"ones\"} : f32[32]\n"
    "  %b0 = param {init=\"zeros\"} : f32[32]\n"
    "  %w0 = param {init=\"normal\", std=0.1} : f32[32,32]\n"
    "  %g1 = param {init=\"ones\"} : f32[32]\n"
    "  %b1 = param {init=\"zeros\"} : f32[32]\n"
    "  %w1 = param {init=\"normal\", std=0.1} : f32[32,32]\n"
    "  %h0 = layer_norm(%x, %g0, %b0) {eps=1e-5} : f32[64,32]\n"
    "  %y0 = matmul(%h0, %w0) : f32[64,32]\n"
    "  %x1 = add(%x, %y0) : f32[64,32]\n"
    "  %h1 = layer_norm(%x1, %g1, %b1) {eps=1e-5} : f32[64,32]\n"
    "  %y1 = matmul(%h1, %w1) : f32[64,32]\n" SECOND_RESIDUAL_AND_LOSS;

/* The same with one-head attention in the second layer (the probabilities
 * a = softmax(q h1^T) cast to f16 for a h1 and for the backward's dV),
 * and an MLP with GELU. */
static const char block_ir[] =
    "graph block {\n"
    "  %x = input : f32[64,32]\n"
    "  %r = input : f32[64,32]\n"
    "  %g0 = param {init=\"ones\"} : f32[32]\n"
    "  %b0 = param {init=\"zeros\"} : f32[32]\n"
    "  %w0 = param {init=\"normal\", std=0.1} : f32[32,128]\n"
    "  %w2 = param {init=\"normal\", std=0.1} : f32[128,32]\n"
    "  %g1 = param {init=\"ones\"} : f32[32]\n"
    "  %b1 = param {init=\"zeros\"} : f32[32]\n"
    "  %wq = param {init=\"normal\", std=0.3} : f32[32,32]\n"
    "  %w1 = param {init=\"normal\", std=0.1} : f32[32,32]\n"
    "  %h0 = layer_norm(%x, %g0, %b0) {eps=1e-5} : f32[64,32]\n"
    "  %u = matmul(%h0, %w0) : f32[64,128]\n"
    "  %z = gelu(%u) : f32[64,128]\n"
    "  %y0 = matmul(%z, %w2) : f32[64,32]\n"
    "  %x1 = add(%x, %y0) : f32[64,32]\n"
    "  %h1 = layer_norm(%x1, %g1, %b1) {eps=1e-5} : f32[64,32]\n"
    "  %q = matmul(%h1, %wq) : f32[64,32]\n"
    "  %s = matmul(%q, %h1) {transpose_a=false, transpose_b=true} : f32[64,64]\n"
    "  %a = softmax(%s) {axis=-1} : f32[64,64]\n"
    "  %o = matmul(%a, %h1) : f32[64,32]\n"
    "  %y1 = matmul(%o, %w1) : f32[64,32]\n" SECOND_RESIDUAL_AND_LOSS;

/* text's step: AMP in `amp` (f32: none), SGD with momentum, no loss
 * scaler; the remat pass on (the default) or disabled. */
static alloy_graph *build(const char *text, alloy_dtype amp, bool remat)
{
    char err[256] = "";
    alloy_graph *g = alloy_graph_parse(text, strlen(text), "test.ir", err, sizeof err);
    if (!g) fail_msg("parse: %s", err);
    expect_ok(g, alloy_graph_set_option(g, "device", "cpu"), "device");
    if (amp != ALLOY_F32) expect_ok(g, alloy_graph_enable_amp(g, amp), "enable_amp");
    expect_ok(g, alloy_graph_set_training(g, true), "training");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(1e-3, 0.9, 0, false)), "optimizer");
    if (!remat) expect_ok(g, alloy_graph_set_option(g, "disable_passes", "remat"), "disable");
    return g;
}

static size_t peak_of(const char *text, alloy_dtype amp, bool remat)
{
    alloy_graph *g = build(text, amp, remat);
    alloy_memory_info m;
    expect_ok(g, alloy_graph_memory_info(g, &m), "memory_info");
    alloy_graph_free(g);
    return m.peak_live_bytes;
}

/* The residual step's planned peak, worked by hand from its schedule.
 * Without the rule it comes at the end of the forward: x1 and the loss's
 * product p (8192 each), the f32 cast of y1 that p reads (8192), the f16
 * copies of h0 and h1 the dW products read in the backward (4096 each),
 * w0's and w1's f16 copies (2048 each, cast at the start of the step for
 * the forward and the backward's dX), the four statistics (4 x 256):
 * 37888 bytes. With it the forward's copies die in the forward, and the
 * peak is in the second layer's backward: x1 (8192, its norm's backward
 * reads it), the f32 gradient that norm reads (8192), grad:w1 (f32
 * 32x32, 4096: kept for the update), the f16 gradient of x2 that both
 * products of layer 1 read (4096), w1's f16 copy cast again for dX
 * (2048), the statistics (1024) and the loss (64): 27712 bytes. */
static void test_the_planned_peak_of_a_small_amp_step_is_the_hand_worked_count(void **state)
{
    (void)state;
    for (int a = 0; a < 2; a++) {
        alloy_dtype amp = a ? ALLOY_BF16 : ALLOY_F16;
        assert_int_equal(peak_of(residual_ir, amp, false), 37888);
        assert_int_equal(peak_of(residual_ir, amp, true), 27712);
    }
    /* fp32's, for scale: AMP's peak was 0.902 of it, now 0.660 */
    assert_int_equal(peak_of(residual_ir, ALLOY_F32, true), 41984);
}

/* One training step's results as doubles: the loss and every gradient. */
enum { NFETCH = 9 };
static const char *const fetch_names[NFETCH] = {"loss",    "grad:g0", "grad:b0", "grad:w0", "grad:w2",
                                                "grad:g1", "grad:b1", "grad:wq", "grad:w1"};

static void step(alloy_dtype amp, bool remat, double *out[NFETCH], int64_t n[NFETCH])
{
    alloy_graph *g = build(block_ir, amp, remat);
    static float xs[64 * 32], rs[64 * 32];
    test_rng = 31;
    for (int e = 0; e < 64 * 32; e++) xs[e] = (float)test_uniform(-2, 2), rs[e] = (float)test_uniform(-1, 1);
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {64, 32}, xs}, {"r", ALLOY_F32, 2, {64, 32}, rs}};
    alloy_host_tensor fetch[NFETCH];
    memset(fetch, 0, sizeof fetch);
    for (int i = 0; i < NFETCH; i++) fetch[i].name = fetch_names[i];
    expect_ok(g, alloy_graph_run(g, feeds, 2, fetch, NFETCH), "run");
    for (int i = 0; i < NFETCH; i++) {
        n[i] = 1;
        for (int d = 0; d < fetch[i].rank; d++) n[i] *= fetch[i].dims[d];
        out[i] = test_malloc(sizeof(double) * (size_t)n[i]);
        for (int64_t e = 0; e < n[i]; e++) out[i][e] = test_decode(fetch[i].dtype, fetch[i].data, e);
    }
    alloy_graph_free(g);
}

/* The recomputed casts are the same ops on the same values: the loss and
 * every gradient of an AMP step with layer norms, attention and GELU are
 * the same bits with the rule and with the remat pass disabled. */
static void test_the_step_gives_the_same_bits_with_the_casts_recomputed(void **state)
{
    (void)state;
    for (int a = 0; a < 2; a++) {
        alloy_dtype amp = a ? ALLOY_BF16 : ALLOY_F16;
        double *on[NFETCH], *off[NFETCH];
        int64_t n_on[NFETCH], n_off[NFETCH];
        step(amp, true, on, n_on);
        step(amp, false, off, n_off);
        for (int i = 0; i < NFETCH; i++) {
            assert_int_equal(n_on[i], n_off[i]);
            for (int64_t e = 0; e < n_on[i]; e++)
                if (memcmp(&on[i][e], &off[i][e], sizeof(double)) != 0)
                    fail_msg("%s: %s[%lld] is %.9g recomputed, %.9g stored", alloy_dtype_name(amp), fetch_names[i],
                             (long long)e, on[i][e], off[i][e]);
            test_free(on[i]), test_free(off[i]);
        }
        /* and the rule did apply here: the peak went down */
        assert_true(peak_of(block_ir, amp, true) < peak_of(block_ir, amp, false));
    }
}

/* An f32 step casts nothing: the pass leaves it as it was. */
static void test_an_f32_step_is_left_alone(void **state)
{
    (void)state;
    int nodes[2];
    for (int on = 0; on < 2; on++) {
        alloy_graph *g = build(block_ir, ALLOY_F32, on);
        if (graph_compile_ir(g)) fail_msg("%s", alloy_last_error(g));
        nodes[on] = g->compiled->nnodes;
        alloy_graph_free(g);
    }
    assert_int_equal(nodes[1], nodes[0]);
}

static alloy_graph *amp_step(void *ctx)
{
    (void)ctx;
    return build(block_ir, ALLOY_F16, true);
}

static alloy_status compile_step(alloy_graph **g, void *ctx)
{
    (void)ctx;
    return graph_compile_ir(*g);
}

/* Compiling the AMP step with allocation number k failing, for every k in
 * turn: OK or ALLOY_ERR_OOM with everything freed (leak-checked), the
 * rule's own allocations among them. */
static void test_compiling_fails_cleanly_at_every_allocation(void **state)
{
    (void)state;
    test_fail_each_allocation(amp_step, compile_step, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_planned_peak_of_a_small_amp_step_is_the_hand_worked_count),
        cmocka_unit_test(test_the_step_gives_the_same_bits_with_the_casts_recomputed),
        cmocka_unit_test(test_an_f32_step_is_left_alone),
        cmocka_unit_test_setup_teardown(test_compiling_fails_cleanly_at_every_allocation, test_checked_alloc,
                                        test_plain_alloc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
