/* test_attention.c - the attention pass and the attention op in whole graphs: the GPT example's written-out attention becomes the op, with no layout copy around it, and trains to the same losses; a long sequence's step plans no [B, H, T, T] buffer; the builder's errors. (The op against its f64 reference, forward and backward, is in op_cases.c.) */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../examples/gpt_model.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

static int count_op(const ir_graph *g, int op)
{
    int k = 0;
    for (int i = 0; i < g->nnodes; i++) k += g->nodes[i]->op == op;
    return k;
}

/* A nodes of the compiled graph stored in the plan whose type is [.., T, S]
 * with T and S both `len` (a score matrix). */
static int stored_square(alloy_graph *g, int64_t len)
{
    const ir_graph *c = g->compiled;
    int k = 0;
    for (int i = 0; i < c->nnodes; i++) {
        const ir_type *t = &c->nodes[i]->type;
        if (t->rank >= 2 && t->dims[t->rank - 1] == len && t->dims[t->rank - 2] == len && g->comp.plan.offset[i] >= 0) k++;
    }
    return k;
}

/* Steps of g's default schedule that copy with a kernel what the attention
 * op reads or writes: transposes, slices, concats (the views around it
 * leave none: step/attn_views.h). */
static int layout_copies(const alloy_graph *g)
{
    const schedule *s = &g->comp.sched;
    int k = 0;
    for (int i = 0; i < s->nsteps; i++) {
        int op = g->compiled->nodes[s->steps[i].pos]->op;
        k += s->steps[i].kind == STEP_KIND_OP && !(s->members[s->steps[i].first].flags & MEMBER_VIEW) &&
             (op == IR_OP_transpose || op == IR_OP_slice || op == IR_OP_concat);
    }
    return k;
}

/* The GPT example (3 sequences of 13 tokens: T not a multiple of any block)
 * with AdamW, f32 or AMP; the attention pass disabled when `written`. */
static alloy_graph *gpt_step(alloy_dtype amp, bool written)
{
    alloy_graph *g = alloy_graph_new("gpt");
    assert_non_null(g);
    gpt_config cfg = {.vocab = 20, .context = 13, .dim = 32, .layers = 2, .heads = 2, .mlp_width = 64};
    gpt_model m = gpt_build(g, &cfg, 3, true);
    assert_int_equal(alloy_graph_set_loss(g, m.loss), ALLOY_OK);
    if (amp != ALLOY_F32) {
        assert_int_equal(alloy_graph_enable_amp(g, amp), ALLOY_OK);
        if (amp == ALLOY_F16) assert_int_equal(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), ALLOY_OK);
    }
    assert_int_equal(alloy_graph_add_optimizer(g, alloy_adamw(3e-3, 0.9, 0.99, 1e-8, 0.01)), ALLOY_OK);
    assert_int_equal(alloy_graph_set_option(g, "device", "cpu"), ALLOY_OK);
    /* on the CPU the pass leaves small attentions written out unless told to rewrite every one */
    assert_int_equal(alloy_graph_set_option(g, written ? "disable_passes" : "attention", written ? "attention" : "always"),
                     ALLOY_OK);
    return g;
}

/* Runs `steps` training steps of g on fixed tokens, the losses into loss[]. */
static void train(alloy_graph *g, int steps, double *loss)
{
    int32_t tokens[39], targets[39];
    for (int i = 0; i < 39; i++) tokens[i] = (i * 7 + 3) % 20, targets[i] = (i * 5 + 1) % 20;
    alloy_host_tensor feeds[2] = {{"tokens", ALLOY_I32, 2, {3, 13}, tokens}, {"targets", ALLOY_I32, 1, {39}, targets}};
    for (int s = 0; s < steps; s++) {
        alloy_host_tensor fetch = {.name = "loss"};
        alloy_status st = alloy_graph_run(g, feeds, 2, &fetch, 1);
        if (st) fail_msg("step %d: %s", s, alloy_last_error(g));
        loss[s] = test_decode(fetch.dtype, fetch.data, 0);
    }
}

static void check_gpt(alloy_dtype amp, double tol)
{
    enum { STEPS = 6 };
    double fused[STEPS], written[STEPS];
    alloy_graph *a = gpt_step(amp, false), *b = gpt_step(amp, true);
    train(a, STEPS, fused);
    train(b, STEPS, written);
    /* the compiled step holds the op twice (one per layer), the written-out one none */
    assert_int_equal(count_op(a->compiled, IR_OP_attention), 2);
    assert_int_equal(count_op(a->compiled, IR_OP_attention_grad), 2);
    assert_int_equal(count_op(a->compiled, IR_OP_softmax), 0);
    assert_int_equal(count_op(b->compiled, IR_OP_attention), 0);
    assert_int_equal(stored_square(a, 13), 0);
    /* q, k, v read out of the fused projection, o and dq/dk/dv written in place: no layout copy per layer,
     * with the op or with the scores written out (its batched products, q's scale and dq's through strides) */
    assert_int_equal(layout_copies(a), 0);
    assert_int_equal(layout_copies(b), 0);
    assert_true(stored_square(b, 13) > 0);
    for (int s = 0; s < STEPS; s++) {
        print_message("# %s step %d: loss %.7f fused, %.7f written out\n", alloy_dtype_name(amp), s, fused[s], written[s]);
        if (!(fabs(fused[s] - written[s]) <= tol * fabs(written[s])))
            fail_msg("step %d: loss %.9g fused, %.9g written out", s, fused[s], written[s]);
    }
    assert_true(written[STEPS - 1] < written[0]); /* it trains */
    alloy_graph_free(a);
    alloy_graph_free(b);
}

static void test_gpt_step_gets_the_op_and_trains_to_the_same_losses_f32(void **state)
{
    (void)state;
    check_gpt(ALLOY_F32, 2e-5);
}

static void test_gpt_step_gets_the_op_and_trains_to_the_same_losses_f16_amp(void **state)
{
    (void)state;
    check_gpt(ALLOY_F16, 5e-3);
}

static void test_gpt_step_gets_the_op_and_trains_to_the_same_losses_bf16_amp(void **state)
{
    (void)state;
    check_gpt(ALLOY_BF16, 3e-2);
}

/* A causal attention step over T = 1024 (B 1, H 2, D 64, f16 AMP): the
 * written-out graph's plan holds [1, 2, 1024, 1024] scores (8 MiB in f32),
 * the fused one none, and its arena is smaller than one such matrix. */
static alloy_graph *long_step(bool written)
{
    alloy_graph *g = alloy_graph_new("long");
    assert_non_null(g);
    int64_t dims[4] = {1, 2, 1024, 64};
    alloy_tensor *q = alloy_param(g, "q", ALLOY_F32, 4, dims, alloy_init_normal(1));
    alloy_tensor *k = alloy_param(g, "k", ALLOY_F32, 4, dims, alloy_init_normal(1));
    alloy_tensor *v = alloy_param(g, "v", ALLOY_F32, 4, dims, alloy_init_normal(1));
    q = alloy_mul(g, q, alloy_scalar(g, ALLOY_F32, 0.125));
    alloy_tensor *p = alloy_softmax(g, alloy_causal_mask(g, alloy_matmul(g, q, k, false, true)), -1);
    alloy_tensor *y = alloy_matmul(g, p, v, false, false);
    alloy_tensor *loss = alloy_reduce_mean(g, alloy_mul(g, y, y), 0, NULL, false);
    assert_int_equal(alloy_output(g, "loss", loss), ALLOY_OK);
    assert_int_equal(alloy_graph_set_loss(g, loss), ALLOY_OK);
    assert_int_equal(alloy_graph_enable_amp(g, ALLOY_F16), ALLOY_OK);
    assert_int_equal(alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0, 0, false)), ALLOY_OK);
    assert_int_equal(alloy_graph_set_option(g, "device", "cpu"), ALLOY_OK);
    /* on the CPU the pass leaves small attentions written out unless told to rewrite every one */
    assert_int_equal(alloy_graph_set_option(g, written ? "disable_passes" : "attention", written ? "attention" : "always"),
                     ALLOY_OK);
    return g;
}

static void test_a_long_sequence_plans_no_score_matrix(void **state)
{
    (void)state;
    alloy_memory_info fused, written;
    alloy_graph *a = long_step(false), *b = long_step(true);
    assert_int_equal(alloy_graph_memory_info(a, &fused), ALLOY_OK);
    assert_int_equal(alloy_graph_memory_info(b, &written), ALLOY_OK);
    size_t scores = (size_t)2 * 1024 * 1024 * 4;
    print_message("# T=1024 step: arena %zu bytes fused, %zu written out (one f32 score matrix: %zu)\n", fused.arena_bytes,
                  written.arena_bytes, scores);
    assert_int_equal(count_op(a->compiled, IR_OP_attention), 1);
    assert_int_equal(stored_square(a, 1024), 0);
    assert_true(stored_square(b, 1024) > 0);
    assert_true(written.arena_bytes >= scores);
    assert_true(fused.arena_bytes < scores / 2);
    /* and it runs to a finite loss */
    alloy_host_tensor fetch = {.name = "loss"};
    if (alloy_graph_run(a, NULL, 0, &fetch, 1)) fail_msg("%s", alloy_last_error(a));
    assert_true(isfinite(test_decode(fetch.dtype, fetch.data, 0)));
    alloy_graph_free(a);
    alloy_graph_free(b);
}

/* The scores fetched by name, or a second consumer: not rewritten. */
static void test_scores_read_elsewhere_keep_the_written_out_attention(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("shared");
    int64_t dims[4] = {1, 1, 5, 8};
    alloy_tensor *q = alloy_input(g, "q", ALLOY_F32, 4, dims), *k = alloy_input(g, "k", ALLOY_F32, 4, dims),
                 *v = alloy_input(g, "v", ALLOY_F32, 4, dims);
    alloy_tensor *s = alloy_matmul(g, q, k, false, true);
    alloy_tensor *y = alloy_matmul(g, alloy_softmax(g, s, -1), v, false, false);
    assert_int_equal(alloy_output(g, "y", y), ALLOY_OK);
    assert_int_equal(alloy_output(g, "s", s), ALLOY_OK);
    assert_int_equal(alloy_graph_set_option(g, "device", "cpu"), ALLOY_OK);
    assert_int_equal(alloy_graph_set_option(g, "attention", "always"), ALLOY_OK);
    alloy_memory_info info;
    assert_int_equal(alloy_graph_memory_info(g, &info), ALLOY_OK);
    assert_int_equal(count_op(g->compiled, IR_OP_attention), 0);
    assert_int_equal(count_op(g->compiled, IR_OP_softmax), 1);
    alloy_graph_free(g);
}

/* The default on the CPU (where the written-out form's BLAS GEMMs are the
 * faster at small sizes): a causal attention whose f32 scores take less
 * than 64 MiB stays written out, one of 64 MiB ([1, 1, 4096, 4096]) becomes
 * the op; `attention=bogus` is refused naming the values. */
static alloy_graph *causal_graph(int64_t t)
{
    alloy_graph *g = alloy_graph_new("causal");
    int64_t dims[4] = {1, 1, t, 8};
    alloy_tensor *q = alloy_input(g, "q", ALLOY_F32, 4, dims), *k = alloy_input(g, "k", ALLOY_F32, 4, dims),
                 *v = alloy_input(g, "v", ALLOY_F32, 4, dims);
    alloy_tensor *p = alloy_softmax(g, alloy_causal_mask(g, alloy_matmul(g, q, k, false, true)), -1);
    assert_int_equal(alloy_output(g, "y", alloy_matmul(g, p, v, false, false)), ALLOY_OK);
    assert_int_equal(alloy_graph_set_option(g, "device", "cpu"), ALLOY_OK);
    return g;
}

static void test_on_the_cpu_only_attentions_with_big_scores_become_the_op_by_default(void **state)
{
    (void)state;
    alloy_memory_info info;
    alloy_graph *small = causal_graph(4095), *big = causal_graph(4096);
    assert_int_equal(alloy_graph_memory_info(small, &info), ALLOY_OK);
    assert_int_equal(alloy_graph_memory_info(big, &info), ALLOY_OK);
    assert_int_equal(count_op(small->compiled, IR_OP_attention), 0);
    assert_int_equal(count_op(small->compiled, IR_OP_softmax), 1);
    assert_int_equal(count_op(big->compiled, IR_OP_attention), 1);
    assert_int_equal(count_op(big->compiled, IR_OP_softmax), 0);
    assert_int_equal(alloy_graph_set_option(small, "attention", "bogus"), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(small), "auto or always"));
    alloy_graph_free(small);
    alloy_graph_free(big);
}

/* Non-causal with the scale on the scores (s * 0.3 then softmax) and T != S:
 * one attention {causal=0, scale=0.3} whose output matches the written-out
 * graph's. */
static alloy_graph *cross_graph(bool written, float *q, float *k, float *v, alloy_host_tensor *feeds)
{
    alloy_graph *g = alloy_graph_new("cross");
    int64_t qd[4] = {2, 3, 5, 8}, kd[4] = {2, 3, 9, 8};
    alloy_tensor *Q = alloy_input(g, "q", ALLOY_F32, 4, qd), *K = alloy_input(g, "k", ALLOY_F32, 4, kd),
                 *V = alloy_input(g, "v", ALLOY_F32, 4, kd);
    alloy_tensor *s = alloy_mul(g, alloy_matmul(g, Q, K, false, true), alloy_scalar(g, ALLOY_F32, 0.3));
    assert_int_equal(alloy_output(g, "y", alloy_matmul(g, alloy_softmax(g, s, -1), V, false, false)), ALLOY_OK);
    assert_int_equal(alloy_graph_set_option(g, "device", "cpu"), ALLOY_OK);
    /* on the CPU the pass leaves small attentions written out unless told to rewrite every one */
    assert_int_equal(alloy_graph_set_option(g, written ? "disable_passes" : "attention", written ? "attention" : "always"),
                     ALLOY_OK);
    feeds[0] = (alloy_host_tensor){"q", ALLOY_F32, 4, {2, 3, 5, 8}, q};
    feeds[1] = (alloy_host_tensor){"k", ALLOY_F32, 4, {2, 3, 9, 8}, k};
    feeds[2] = (alloy_host_tensor){"v", ALLOY_F32, 4, {2, 3, 9, 8}, v};
    return g;
}

static void test_a_scale_on_the_scores_without_a_mask_becomes_the_op(void **state)
{
    (void)state;
    static float q[240], k[432], v[432];
    for (int i = 0; i < 432; i++) {
        if (i < 240) q[i] = (float)sin(0.37 * i);
        k[i] = (float)cos(0.23 * i), v[i] = (float)sin(0.11 * i + 1);
    }
    alloy_host_tensor feeds[3], ya = {.name = "y"}, yb = {.name = "y"};
    alloy_graph *a = cross_graph(false, q, k, v, feeds), *b = cross_graph(true, q, k, v, feeds);
    if (alloy_graph_run(a, feeds, 3, &ya, 1)) fail_msg("%s", alloy_last_error(a));
    if (alloy_graph_run(b, feeds, 3, &yb, 1)) fail_msg("%s", alloy_last_error(b));
    assert_int_equal(count_op(a->compiled, IR_OP_attention), 1);
    const ir_node *n = NULL;
    for (int i = 0; i < a->compiled->nnodes; i++)
        if (a->compiled->nodes[i]->op == IR_OP_attention) n = a->compiled->nodes[i];
    assert_int_equal(ir_attr_i(n, "causal"), 0);
    assert_true(ir_attr_f(n, "scale") == (double)0.3f);
    double got[240], want[240];
    for (int i = 0; i < 240; i++) got[i] = ((float *)ya.data)[i], want[i] = ((float *)yb.data)[i];
    char why[256];
    if (!test_close(got, want, 240, 1e-6, why, sizeof why)) fail_msg("%s", why);
    alloy_graph_free(a);
    alloy_graph_free(b);
}

static void test_the_builder_names_a_bad_operand(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("bad");
    int64_t qd[4] = {1, 2, 5, 8}, kd[4] = {1, 2, 6, 4};
    alloy_tensor *q = alloy_input(g, "q", ALLOY_F32, 4, qd), *k = alloy_input(g, "k", ALLOY_F32, 4, kd);
    assert_null(alloy_attention(g, q, k, k, true, 0.5));
    assert_non_null(strstr(alloy_last_error(g), "k's dim 3 is 4 but q's is 8"));
    alloy_graph_free(g);
    g = alloy_graph_new("bad");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 3, qd);
    assert_null(alloy_attention(g, x, x, x, false, 1));
    assert_non_null(strstr(alloy_last_error(g), "q must be rank 4"));
    alloy_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_on_the_cpu_only_attentions_with_big_scores_become_the_op_by_default),
        cmocka_unit_test(test_gpt_step_gets_the_op_and_trains_to_the_same_losses_f32),
        cmocka_unit_test(test_gpt_step_gets_the_op_and_trains_to_the_same_losses_f16_amp),
        cmocka_unit_test(test_gpt_step_gets_the_op_and_trains_to_the_same_losses_bf16_amp),
        cmocka_unit_test(test_a_long_sequence_plans_no_score_matrix),
        cmocka_unit_test(test_scores_read_elsewhere_keep_the_written_out_attention),
        cmocka_unit_test(test_a_scale_on_the_scores_without_a_mask_becomes_the_op),
        cmocka_unit_test(test_the_builder_names_a_bad_operand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
