/* test_arena.c - the CPU backend runs every compiled graph from one arena, allocated once: the AMP transformer training step gives the same losses, parameters and fetched intermediates bit for bit as the al_malloc executor (ALLOY_NO_ARENA=1), and its arena is smaller than fp32's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "models.h"
#include "runtime/cpu/cpu.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

enum { BATCH = 8, SEQ = 64, VOCAB = 65, DIM = 64, HEADS = 4, STEPS = 5 };

static void build(alloy_status st, const alloy_graph *g, const char *what)
{
    if (st) fail_msg("%s: %s: %s", what, alloy_status_name(st), alloy_last_error(g));
}

/* The transformer block's training step: adamw, AMP f16 with the dynamic scaler when amp. */
static alloy_graph *block_step(bool amp)
{
    alloy_graph *g = alloy_graph_new(amp ? "block_amp" : "block_f32");
    assert_non_null(g);
    alloy_graph_set_seed(g, 7);
    test_block b = build_transformer_block(g, ALLOY_F32, BATCH, SEQ, VOCAB, DIM, HEADS);
    build(alloy_graph_set_loss(g, b.loss), g, "set_loss");
    build(alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01)), g, "adamw");
    if (amp) {
        build(alloy_graph_enable_amp(g, ALLOY_F16), g, "amp");
        build(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), g, "scaler");
    }
    return g;
}

/* Feeds for step s: every input is i32 ids in [0, VOCAB), the same for every graph. */
typedef struct feeds {
    alloy_host_tensor t[4];
    int n;
} feeds;

static feeds make_feeds(alloy_graph *g, int step)
{
    feeds f = {.n = alloy_graph_input_count(g)};
    assert_true(f.n > 0 && f.n <= 4);
    uint64_t h = 0x1234567u + (uint64_t)step * 0x9e3779b97f4a7c15u;
    for (int i = 0; i < f.n; i++) {
        build(alloy_graph_input_at(g, i, &f.t[i]), g, "input_at");
        assert_int_equal(f.t[i].dtype, ALLOY_I32);
        int64_t count = alloy_host_tensor_numel(&f.t[i]);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(count + 1));
        assert_non_null(ids);
        for (int64_t k = 0; k < count; k++) {
            h = h * 6364136223846793005u + 1442695040888963407u;
            ids[k] = (int32_t)((h >> 33) % VOCAB);
        }
        f.t[i].data = ids;
    }
    return f;
}

static void free_feeds(feeds *f)
{
    for (int i = 0; i < f->n; i++) free(f->t[i].data);
}

/* What a run of STEPS steps gives: losses, logits of every step, the state at the end. */
typedef struct trace {
    float loss[STEPS];
    void *logits[STEPS];
    size_t logits_bytes;
    const void *exec[STEPS];
} trace;

/* Trains STEPS steps; arena off: the no_arena option (no slot shared). */
static void train(alloy_graph *g, bool arena, bool fetch_logits, trace *t)
{
    build(alloy_graph_set_option(g, "no_arena", arena ? "" : "1"), g, "set_option");
    for (int s = 0; s < STEPS; s++) {
        feeds f = make_feeds(g, s);
        alloy_host_tensor fetch[2] = {{.name = "loss"}, {.name = "logits"}};
        build(alloy_graph_run(g, f.t, f.n, fetch, fetch_logits ? 2 : 1), g, "training step");
        assert_int_equal(fetch[0].dtype, ALLOY_F32);
        memcpy(&t->loss[s], fetch[0].data, sizeof(float));
        t->exec[s] = g->exec;
        if (fetch_logits) {
            size_t bytes = (size_t)alloy_host_tensor_numel(&fetch[1]) * alloy_dtype_size(fetch[1].dtype);
            assert_true(bytes > 0);
            t->logits_bytes = bytes;
            t->logits[s] = malloc(bytes);
            assert_non_null(t->logits[s]);
            memcpy(t->logits[s], fetch[1].data, bytes);
        }
        free_feeds(&f);
    }
}

static void free_trace(trace *t)
{
    for (int s = 0; s < STEPS; s++) free(t->logits[s]);
}

/* Every state tensor of a equals b's bit for bit. */
static void same_state(alloy_graph *a, alloy_graph *b)
{
    int n = alloy_graph_state_count(a);
    assert_true(n > 0);
    assert_int_equal(n, alloy_graph_state_count(b));
    for (int i = 0; i < n; i++) {
        alloy_host_tensor x, y;
        build(alloy_graph_state_at(a, i, &x), a, "state_at");
        build(alloy_graph_get_state(b, x.name, &y), b, "get_state");
        size_t bytes = (size_t)alloy_host_tensor_numel(&x) * alloy_dtype_size(x.dtype);
        assert_int_equal(bytes, (size_t)alloy_host_tensor_numel(&y) * alloy_dtype_size(y.dtype));
        if (memcmp(x.data, y.data, bytes) != 0) fail_msg("state '%s' differs with and without the arena", x.name);
    }
}

static void compare_runs(bool fetch_logits)
{
    alloy_graph *a = block_step(true), *m = block_step(true);
    trace ta = {0}, tm = {0};
    train(a, true, fetch_logits, &ta);
    train(m, false, fetch_logits, &tm);
    for (int s = 0; s < STEPS; s++) {
        if (memcmp(&ta.loss[s], &tm.loss[s], sizeof(float)) != 0)
            fail_msg("step %d: loss %.9g with the arena, %.9g without", s, ta.loss[s], tm.loss[s]);
        /* compiled once: the same executable (and its arena) on every run */
        assert_non_null(ta.exec[s]);
        assert_ptr_equal(ta.exec[s], ta.exec[0]);
        if (fetch_logits) {
            assert_int_equal(ta.logits_bytes, tm.logits_bytes);
            if (memcmp(ta.logits[s], tm.logits[s], ta.logits_bytes) != 0)
                fail_msg("step %d: fetched logits differ with and without the arena", s);
        }
    }
    assert_true(ta.loss[STEPS - 1] < ta.loss[0]); /* it trains */
    same_state(a, m);
    free_trace(&ta);
    free_trace(&tm);
    alloy_graph_free(a);
    alloy_graph_free(m);
}

static void test_amp_training_step_from_the_arena_matches_a_plan_that_shares_no_slot_bit_for_bit(void **state)
{
    (void)state;
    compare_runs(false);
}

static void test_a_fetched_intermediate_comes_from_the_arena_and_matches(void **state)
{
    (void)state;
    compare_runs(true);
}

static void test_the_arena_is_allocated_once_and_replanned_only_when_the_fetches_change(void **state)
{
    (void)state;
    alloy_graph *g = block_step(true);
    trace t = {0};
    train(g, true, false, &t);
    assert_null(g->exec_keep); /* outputs, updates, loss: the compiled schedule and plan */
    const void *exec = g->exec;
    size_t bytes = g->comp.plan.arena_bytes;
    train(g, true, false, &t); /* same keep set: the same executable */
    assert_ptr_equal(g->exec, exec);
    train(g, true, true, &t); /* logits kept too: a schedule and plan of its own, never a smaller need */
    assert_non_null(g->exec_keep);
    assert_true(g->exec_plan.arena_bytes >= bytes);
    assert_ptr_equal(t.exec[STEPS - 1], t.exec[0]);
    int out = ir_find_output(g->compiled, "logits");
    int logits = out >= 0 ? g->compiled->outputs[out].node : ir_find_name(g->compiled, "logits");
    assert_true(logits >= 0 && g->exec_sched.kept[logits] && !g->comp.sched.kept[logits]);
    free_trace(&t);
    /* recompiling drops the executable with the compiled step */
    build(alloy_graph_print_after(g, NULL, NULL), g, "print_after");
    assert_null(g->exec);
    assert_null(g->exec_keep);
    alloy_graph_free(g);
}

static void test_the_amp_arena_is_smaller_than_fp32s(void **state)
{
    (void)state;
    size_t bytes[2];
    for (int amp = 0; amp < 2; amp++) {
        alloy_graph *g = block_step(amp);
        trace t = {0};
        train(g, true, false, &t);
        alloy_memory_info m;
        build(alloy_graph_memory_info(g, &m), g, "memory_info");
        assert_int_equal(m.arena_bytes, g->comp.plan.arena_bytes);
        assert_true(m.peak_live_bytes <= m.arena_bytes && m.scratch_bytes < m.arena_bytes && m.steps > 0);
        assert_true(m.state_bytes > 0);
        bytes[amp] = m.arena_bytes;
        printf("  transformer block training step (batch %d, seq %d, dim %d) %s: arena %zu bytes, "
               "peak live %zu, %d in place, %d steps, state %zu bytes\n", BATCH, SEQ, DIM, amp ? "AMP f16" : "fp32",
               m.arena_bytes, m.peak_live_bytes, m.inplace, m.steps, m.state_bytes);
        alloy_graph_free(g);
    }
    printf("  AMP / fp32 arena: %.3f\n", (double)bytes[1] / (double)bytes[0]);
    assert_true(bytes[1] < bytes[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_amp_training_step_from_the_arena_matches_a_plan_that_shares_no_slot_bit_for_bit),
        cmocka_unit_test(test_a_fetched_intermediate_comes_from_the_arena_and_matches),
        cmocka_unit_test(test_the_arena_is_allocated_once_and_replanned_only_when_the_fetches_change),
        cmocka_unit_test(test_the_amp_arena_is_smaller_than_fp32s),
    };
    return cmocka_run_group_tests_name("arena", tests, test_checked_alloc, test_plain_alloc);
}
