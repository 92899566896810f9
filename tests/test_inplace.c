/* test_inplace.c - optimizer updates written into their state's buffers: the step's planned memory holds the state once, skipped steps and results unchanged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* A linear layer with AdamW trained on a squared error: w is N x N f32,
 * the batch is one row, so the step's activations are a few rows of N
 * and its memory is the parameter's (value, gradient, moments). */
enum { N = 256, BATCH = 1 };

static void check(alloy_status st, alloy_graph *g, const char *what)
{
    if (st) fail_msg("%s: %s: %s", what, alloy_status_name(st), alloy_last_error(g));
}

static alloy_graph *linear_step(bool amp, bool copies)
{
    alloy_graph *g = alloy_graph_new("linear");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){BATCH, N});
    alloy_tensor *y = alloy_input(g, "y", ALLOY_F32, 2, (int64_t[]){BATCH, N});
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 2, (int64_t[]){N, N}, alloy_init_normal(0.05));
    alloy_tensor *err = alloy_sub(g, alloy_matmul(g, x, w, false, false), y);
    check(alloy_graph_set_loss(g, alloy_reduce_mean(g, alloy_square(g, err), 0, NULL, false)), g, "set_loss");
    if (amp) {
        check(alloy_graph_enable_amp(g, ALLOY_F16), g, "enable_amp");
        check(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), g, "set_grad_scaler");
    }
    check(alloy_graph_add_optimizer(g, alloy_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01)), g, "add_optimizer");
    if (copies) check(alloy_graph_set_option(g, "no_arena", "1"), g, "set_option"); /* every update copied */
    return g;
}

static float xs[BATCH * N], ys[BATCH * N];

/* Feeds x (every element times `gain`) and y; one step; its info. */
static alloy_step_info step(alloy_graph *g, float gain)
{
    float x[BATCH * N];
    for (int i = 0; i < BATCH * N; i++) x[i] = xs[i] * gain;
    alloy_host_tensor feeds[2] = {{.name = "x", .dtype = ALLOY_F32, .rank = 2, .dims = {BATCH, N}, .data = x},
                                  {.name = "y", .dtype = ALLOY_F32, .rank = 2, .dims = {BATCH, N}, .data = ys}};
    check(alloy_graph_run(g, feeds, 2, NULL, 0), g, "run");
    alloy_step_info info;
    check(alloy_graph_step_info(g, &info), g, "step_info");
    return info;
}

static void fill_data(void)
{
    for (int i = 0; i < BATCH * N; i++) xs[i] = (float)test_uniform(-1, 1), ys[i] = (float)test_uniform(-1, 1);
}

/* All state of g as one block per tensor, in state order. */
typedef struct state_copy {
    int n;
    char names[16][64];
    void *data[16];
    size_t bytes[16];
} state_copy;

static void take(alloy_graph *g, state_copy *s)
{
    s->n = alloy_graph_state_count(g);
    assert_true(s->n > 0 && s->n <= 16);
    for (int i = 0; i < s->n; i++) {
        alloy_host_tensor t;
        check(alloy_graph_state_at(g, i, &t), g, "state_at");
        int64_t count = 1;
        for (int d = 0; d < t.rank; d++) count *= t.dims[d];
        snprintf(s->names[i], sizeof s->names[i], "%s", t.name);
        s->bytes[i] = (size_t)count * alloy_dtype_size(t.dtype);
        s->data[i] = test_malloc(s->bytes[i] + 1);
        memcpy(s->data[i], t.data, s->bytes[i]);
    }
}

/* The first byte where a and b differ, or -1. */
static long long first_diff(const void *a, const void *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (((const unsigned char *)a)[i] != ((const unsigned char *)b)[i]) return (long long)i;
    return -1;
}

static void release(state_copy *s)
{
    for (int i = 0; i < s->n; i++) test_free(s->data[i]);
}

/* The bytes of f32 parameter w and its two moments: the state the updates write. */
static const size_t W_BYTES = sizeof(float) * N * N;

static void test_a_training_step_plans_its_state_once_not_twice(void **state)
{
    (void)state;
    for (int amp = 0; amp < 2; amp++) {
        alloy_graph *g = linear_step(amp, false);
        alloy_memory_info m;
        check(alloy_graph_memory_info(g, &m), g, "memory_info");
        /* w, w.m, w.v (f32 each) and a few scalars */
        assert_true(m.state_bytes >= 3 * W_BYTES && m.state_bytes < 3 * W_BYTES + 4096);
        /* live at the update: w's f32 gradient and its square (the global
         * norm's and v's, computed once) and rows of N; updates written into
         * their own buffers add nothing, where copied they added w', m', v'
         * (3 W_BYTES more) */
        size_t most = 2 * W_BYTES + 64 * 1024;
        printf("  linear %dx%d AdamW %s: peak live %zu bytes, arena %zu, state %zu (w %zu)\n", N, N,
               amp ? "f16 AMP" : "fp32", m.peak_live_bytes, m.arena_bytes, m.state_bytes, W_BYTES);
        if (m.peak_live_bytes > most)
            fail_msg("peak live %zu bytes, more than w's gradient and activations (%zu): the update holds a second "
                     "copy of the state", m.peak_live_bytes, most);
        /* every update (w, its moments, the counter, the scaler's state) is written in place here */
        const mem_plan *p = &g->comp.plan;
        assert_non_null(p->state_of);
        const ir_graph *c = g->compiled;
        for (int u = 0; u < c->nupdates; u++)
            if (!strncmp(c->updates[u].name, "w", 1))
                assert_int_equal(p->state_of[c->updates[u].node], ir_find_name(c, c->updates[u].name));
        alloy_graph_free(g);
    }
}

static void test_a_skipped_step_leaves_parameters_moments_and_counter_bit_identical(void **state)
{
    (void)state;
    fill_data();
    alloy_graph *g = linear_step(true, false);
    alloy_step_info info = step(g, 1.0f);
    assert_false(info.skipped);
    state_copy before, after;
    take(g, &before);
    /* x * 1e5 overflows the f16 product: found_inf, the step is skipped */
    info = step(g, 1e5f);
    assert_true(info.skipped);
    take(g, &after);
    assert_int_equal(before.n, after.n);
    int compared = 0;
    for (int i = 0; i < before.n; i++) {
        assert_string_equal(before.names[i], after.names[i]);
        /* the scaler backs off (checked below), the skipped-step count counts */
        if (!strncmp(before.names[i], "scaler.", 7) || !strcmp(before.names[i], "step.skipped_steps")) continue;
        long long at = first_diff(before.data[i], after.data[i], before.bytes[i]);
        if (at >= 0) fail_msg("state '%s' changed at byte %lld by a skipped step", before.names[i], at);
        compared++;
    }
    assert_true(compared >= 4); /* w, w.m, w.v, optim.step (and optim.lr) */
    assert_true(info.next_scale == info.scale * 0.5);
    release(&before), release(&after);
    /* and the next good step trains on from there */
    info = step(g, 1.0f);
    assert_false(info.skipped);
    alloy_graph_free(g);
}

static void test_steps_with_updates_in_place_match_steps_with_updates_copied_bit_for_bit(void **state)
{
    (void)state;
    enum { STEPS = 6 };
    for (int amp = 0; amp < 2; amp++) {
        fill_data();
        double loss[2][STEPS];
        state_copy end[2];
        for (int copies = 0; copies < 2; copies++) {
            alloy_graph *g = linear_step(amp, copies);
            for (int k = 0; k < STEPS; k++) loss[copies][k] = step(g, k == 3 && amp ? 1e5f : 1.0f).loss;
            assert_true(copies || g->comp.plan.state_of); /* in place by default */
            assert_true(!copies || !g->comp.plan.state_of);
            take(g, &end[copies]);
            alloy_graph_free(g);
        }
        assert_memory_equal(loss[0], loss[1], sizeof loss[0]);
        assert_int_equal(end[0].n, end[1].n);
        for (int i = 0; i < end[0].n; i++) {
            long long at = first_diff(end[0].data[i], end[1].data[i], end[0].bytes[i]);
            if (at >= 0) fail_msg("%s: state '%s' differs at byte %lld", amp ? "f16" : "fp32", end[0].names[i], at);
        }
        release(&end[0]), release(&end[1]);
    }
}

static void test_a_fetched_parameter_is_the_value_the_step_used_not_its_update(void **state)
{
    (void)state;
    fill_data();
    for (int amp = 0; amp < 2; amp++) {
        alloy_graph *g = linear_step(amp, false);
        step(g, 1.0f);
        alloy_host_tensor w;
        check(alloy_graph_get_state(g, "w", &w), g, "get_state");
        float *before = test_malloc(W_BYTES);
        memcpy(before, w.data, W_BYTES);
        alloy_host_tensor feeds[2] = {{.name = "x", .dtype = ALLOY_F32, .rank = 2, .dims = {BATCH, N}, .data = xs},
                                      {.name = "y", .dtype = ALLOY_F32, .rank = 2, .dims = {BATCH, N}, .data = ys}};
        alloy_host_tensor fetch = {.name = "w"};
        check(alloy_graph_run(g, feeds, 2, &fetch, 1), g, "run");
        assert_memory_equal(fetch.data, before, W_BYTES);
        check(alloy_graph_get_state(g, "w", &w), g, "get_state");
        assert_true(first_diff(w.data, before, W_BYTES) >= 0); /* and the step did update w */
        test_free(before);
        alloy_graph_free(g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_training_step_plans_its_state_once_not_twice),
        cmocka_unit_test(test_a_skipped_step_leaves_parameters_moments_and_counter_bit_identical),
        cmocka_unit_test(test_steps_with_updates_in_place_match_steps_with_updates_copied_bit_for_bit),
        cmocka_unit_test(test_a_fetched_parameter_is_the_value_the_step_used_not_its_update),
    };
    return cmocka_run_group_tests_name("inplace", tests, test_checked_alloc, test_plain_alloc);
}
