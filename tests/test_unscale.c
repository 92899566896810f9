/* test_unscale.c - the unscaled gradients are not stored for the optimizer: it unscales as it reads, the CPU's values bit for bit the stored path's, a fetched gradient unscaled. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "block_support.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* The transformer block of tests/models.c, trained under f16 AMP with the
 * dynamic scaler and AdamW with clipping (the norm is used, not only
 * reported). At the PyTorch default scale 2^16 its first gradients
 * overflow f16: the first steps are skipped, later ones applied. */
enum { STEPS = 10, MAX_STATE = 64 };

static const char *const params[] = {"tok_emb", "pos_emb", "ln1.g", "ln1.b", "attn.wq", "attn.wk",
                                     "attn.wv", "attn.wo", "ln2.g", "ln2.b", "mlp.b1", "mlp.b2",
                                     "mlp.w1", "mlp.w2", "lnf.g", "lnf.b", "head.w"};
enum { NPARAMS = sizeof params / sizeof params[0] };

/* The block's trainer: amp ALLOY_F16 with the dynamic scaler from
 * init_scale, or F32 with none; `passes`: a disable_passes value or NULL. */
static alloy_graph *trainer(alloy_dtype amp, double init_scale, const char *passes)
{
    alloy_optimizer o = alloy_adamw(3e-2, 0.9, 0.999, 1e-8, 0.01);
    o.clip_norm = 0.5;
    alloy_graph *g = block_trainer(amp, init_scale, o);
    if (passes) expect_ok(g, alloy_graph_set_option(g, "disable_passes", passes), "disable_passes");
    return g;
}

/* Batch `step` of the block's task: seeds from 2000, targets (5 token + 2) % BV. */
static void batch(int step, int32_t *tokens, int32_t *targets, alloy_host_tensor feeds[2])
{
    block_batch(2000 + (uint64_t)step, 5, 2, tokens, targets, feeds);
}

/* One step on batch `step`, fetching every parameter's gradient into
 * grads[] (copies, test_free'd by the caller) when grads is not NULL. */
static alloy_step_info run_step(alloy_graph *g, int step, void **grads)
{
    int32_t tokens[BB * BT], targets[BB * BT];
    alloy_host_tensor feeds[2], fetches[NPARAMS];
    char names[NPARAMS][32];
    batch(step, tokens, targets, feeds);
    for (int i = 0; i < NPARAMS; i++) {
        snprintf(names[i], sizeof names[i], "grad:%s", params[i]);
        fetches[i] = (alloy_host_tensor){.name = names[i]};
    }
    expect_ok(g, alloy_graph_run(g, feeds, 2, grads ? fetches : NULL, grads ? NPARAMS : 0), "run");
    for (int i = 0; grads && i < NPARAMS; i++) {
        size_t bytes = alloy_dtype_size(fetches[i].dtype);
        for (int d = 0; d < fetches[i].rank; d++) bytes *= (size_t)fetches[i].dims[d];
        assert_int_equal(fetches[i].dtype, F32);
        grads[i] = test_malloc(bytes + 1);
        memcpy(grads[i], fetches[i].data, bytes);
    }
    alloy_step_info info;
    expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
    return info;
}

/* FNV-1a over every state tensor's name and bytes, in state order; with
 * `trained` only the parameters and their moments (not the scaler's,
 * step's and optimizer's counters, which a skipped step moves). */
static uint64_t hash_of(alloy_graph *g, bool trained)
{
    uint64_t h = 1469598103934665603ull;
    int n = alloy_graph_state_count(g);
    assert_true(n > 0 && n <= MAX_STATE);
    for (int i = 0; i < n; i++) {
        alloy_host_tensor t;
        expect_ok(g, alloy_graph_state_at(g, i, &t), "state_at");
        if (trained && (!strncmp(t.name, "scaler.", 7) || !strncmp(t.name, "step.", 5) || !strncmp(t.name, "optim.", 6)))
            continue;
        size_t bytes = alloy_dtype_size(t.dtype);
        for (int d = 0; d < t.rank; d++) bytes *= (size_t)t.dims[d];
        for (const char *c = t.name; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
        for (size_t k = 0; k < bytes; k++) h = (h ^ ((const uint8_t *)t.data)[k]) * 1099511628211ull;
    }
    return h;
}

static uint64_t state_hash(alloy_graph *g) { return hash_of(g, false); }

static uint64_t bits(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* The compiled step stores no parameter's unscaled gradient: the output
 * "grad:<p>" is no member any step writes, and only found_inf and the norm
 * read it; a run that fetches it has a schedule that stores it. */
static void test_the_step_stores_no_unscaled_gradient_unless_one_is_fetched(void **state)
{
    (void)state;
    alloy_graph *g = trainer(F16, 1024, NULL);
    run_step(g, 0, NULL);
    const ir_graph *c = g->compiled;
    const schedule *s = &g->comp.sched;
    int unstored = 0;
    for (int o = 0; o < c->noutputs; o++) {
        if (strncmp(c->outputs[o].name, "grad:", 5) != 0) continue;
        int id = c->outputs[o].node;
        assert_int_equal(c->nodes[id]->op, IR_OP_mul); /* the unscale */
        assert_false(s->kept[id]);
        int m = s->member_of[id];
        assert_true(m >= 0);
        if (!(s->members[m].flags & MEMBER_STORED)) unstored++;
        for (int i = 0; i < c->nnodes; i++) /* read by the checks only */
            for (int j = 0; j < c->nodes[i]->nin; j++)
                if (c->nodes[i]->in[j] == id && c->nodes[i]->op != IR_OP_found_inf &&
                    c->nodes[i]->op != IR_OP_sum_squares)
                    fail_msg("%s: %%%d (%s) reads it", c->outputs[o].name, i, ir_ops[c->nodes[i]->op].name);
    }
    assert_int_equal(unstored, NPARAMS);
    void *grads[NPARAMS];
    run_step(g, 1, grads); /* the fetching run's own schedule stores them */
    for (int i = 0; i < NPARAMS; i++) test_free(grads[i]);
    const schedule *f = &g->exec_sched;
    assert_non_null(g->exec_keep);
    for (int o = 0; o < c->noutputs; o++) {
        if (strncmp(c->outputs[o].name, "grad:", 5) != 0) continue;
        int id = c->outputs[o].node;
        assert_true(f->kept[id] && (f->members[f->member_of[id]].flags & MEMBER_STORED));
    }
    alloy_graph_free(g);
}

/* The CPU's losses, norms, scales and final state, bit for bit: the
 * default step (the check kernel stores nothing, the update unscales as it
 * reads), the same fetching every gradient every step, and the stored path
 * (no remat clones, every gradient fetched, so stored: the optimizer reads
 * them back, as before the change). Steps 0 and 1 overflow at 2^16 and
 * are skipped, leaving every state tensor as it was. The final state's
 * hash is the one the stored path gave on the tree before the change
 * (the same test run there). */
static void test_the_cpu_step_is_bit_for_bit_the_stored_path(void **state)
{
    (void)state;
    alloy_graph *g[3] = {trainer(F16, 4194304, NULL), trainer(F16, 4194304, NULL), trainer(F16, 4194304, "remat")};
    int skipped = 0, applied = 0;
    for (int step = 0; step < STEPS; step++) {
        uint64_t before = hash_of(g[0], true);
        alloy_step_info info[3];
        void *grads[2][NPARAMS];
        info[0] = run_step(g[0], step, NULL);
        info[1] = run_step(g[1], step, grads[0]);
        info[2] = run_step(g[2], step, grads[1]);
        for (int k = 1; k < 3; k++) {
            assert_int_equal(bits(info[k].loss), bits(info[0].loss));
            assert_int_equal(bits(info[k].grad_norm), bits(info[0].grad_norm));
            assert_int_equal(bits(info[k].next_scale), bits(info[0].next_scale));
            assert_int_equal(info[k].skipped, info[0].skipped);
            assert_int_equal(state_hash(g[k]), state_hash(g[0]));
        }
        for (int i = 0; i < NPARAMS; i++) { /* the fetched gradients: the same bits both ways */
            alloy_host_tensor t;
            expect_ok(g[0], alloy_graph_get_state(g[0], params[i], &t), "get_state");
            size_t bytes = sizeof(float);
            for (int d = 0; d < t.rank; d++) bytes *= (size_t)t.dims[d];
            assert_memory_equal(grads[0][i], grads[1][i], bytes);
            test_free(grads[0][i]), test_free(grads[1][i]);
        }
        if (info[0].skipped) assert_int_equal(hash_of(g[0], true), before); /* nothing trained moved */
        else assert_true(hash_of(g[0], true) != before);
        skipped += info[0].skipped, applied += !info[0].skipped;
        print_message("step %d: loss %.9g norm %.9g scale %g%s\n", step, info[0].loss, info[0].grad_norm,
                      info[0].scale, info[0].skipped ? " skipped" : "");
    }
    assert_true(skipped >= 1 && applied >= 4);
    uint64_t h = state_hash(g[0]);
    print_message("final state hash %016llx\n", (unsigned long long)h);
    /* the stored path's since GELU is computed by polynomial pieces for Phi (095f279: the block's GELU
     * and its gradient changed bits by design; before, 0xc0683a6c91739368 from 4b4201c on) */
    assert_int_equal(h, 0x6ee3a342a16bbcc7ull);
    for (int k = 0; k < 3; k++) alloy_graph_free(g[k]);
}

/* A fetched gradient is the unscaled one: at scale 1024 the f16 step's
 * gradient of every parameter is within 2% (of its largest element) of the
 * f32 step's, which has no scale; the scaled one would be 1024 times it. */
static void test_a_fetched_gradient_is_the_unscaled_one(void **state)
{
    (void)state;
    alloy_graph *amp = trainer(F16, 1024, NULL), *f32 = trainer(F32, 1, NULL);
    void *ga[NPARAMS], *gf[NPARAMS];
    alloy_step_info ia = run_step(amp, 0, ga);
    run_step(f32, 0, gf);
    assert_false(ia.skipped);
    for (int i = 0; i < NPARAMS; i++) {
        alloy_host_tensor t;
        expect_ok(amp, alloy_graph_get_state(amp, params[i], &t), "get_state");
        int64_t n = 1;
        for (int d = 0; d < t.rank; d++) n *= t.dims[d];
        const float *a = ga[i], *f = gf[i];
        double most = 0, err = 0;
        for (int64_t k = 0; k < n; k++) {
            most = fmax(most, fabs(f[k]));
            err = fmax(err, fabs((double)a[k] - f[k]));
        }
        if (!(most > 0 && err <= 0.02 * most))
            fail_msg("grad:%s: f16 step differs from f32 by %g, largest element %g", params[i], err, most);
        test_free(ga[i]), test_free(gf[i]);
    }
    alloy_graph_free(amp), alloy_graph_free(f32);
}

/* Runs that alternate between fetching every gradient and fetching none
 * build two executables, the default and the fetching run's, and reuse
 * them: no build per run. Their losses and state are a never-fetching
 * graph's, their gradients an always-fetching graph's, bit for bit. A run
 * with a third keep set (one gradient) builds once more, in place of the
 * fetching one; the default stays. */
static void test_alternating_fetches_build_two_executables_not_one_per_run(void **state)
{
    (void)state;
    alloy_graph *g = trainer(F16, 1024, NULL), *never = trainer(F16, 1024, NULL), *always = trainer(F16, 1024, NULL);
    for (int step = 0; step < 8; step++) {
        void *grads[2][NPARAMS];
        alloy_step_info a = run_step(g, step, step % 2 ? grads[0] : NULL), b = run_step(never, step, NULL);
        run_step(always, step, grads[1]);
        assert_int_equal(bits(a.loss), bits(b.loss));
        assert_int_equal(bits(a.next_scale), bits(b.next_scale));
        assert_int_equal(state_hash(g), state_hash(never));
        for (int i = 0; step % 2 && i < NPARAMS; i++) {
            alloy_host_tensor t;
            expect_ok(g, alloy_graph_get_state(g, params[i], &t), "get_state");
            size_t bytes = sizeof(float);
            for (int d = 0; d < t.rank; d++) bytes *= (size_t)t.dims[d];
            assert_memory_equal(grads[0][i], grads[1][i], bytes);
        }
        for (int i = 0; i < NPARAMS; i++) {
            if (step % 2) test_free(grads[0][i]);
            test_free(grads[1][i]);
        }
        assert_int_equal(g->exec_builds, step ? 2 : 1);
    }
    assert_int_equal(never->exec_builds, 1);
    assert_int_equal(always->exec_builds, 1);
    /* another keep set takes the fetching run's place; the default is still there */
    int32_t tokens[BB * BT], targets[BB * BT];
    alloy_host_tensor feeds[2], one = {.name = "grad:head.w"};
    batch(8, tokens, targets, feeds);
    expect_ok(g, alloy_graph_run(g, feeds, 2, &one, 1), "run fetching grad:head.w");
    assert_int_equal(g->exec_builds, 3);
    run_step(g, 9, NULL);
    assert_int_equal(g->exec_builds, 3);
    void *grads[NPARAMS];
    run_step(g, 10, grads); /* every gradient again: built again, in place of grad:head.w's */
    for (int i = 0; i < NPARAMS; i++) test_free(grads[i]);
    assert_int_equal(g->exec_builds, 4);
    alloy_graph_free(g), alloy_graph_free(never), alloy_graph_free(always);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_step_stores_no_unscaled_gradient_unless_one_is_fetched),
        cmocka_unit_test(test_the_cpu_step_is_bit_for_bit_the_stored_path),
        cmocka_unit_test(test_a_fetched_gradient_is_the_unscaled_one),
        cmocka_unit_test(test_alternating_fetches_build_two_executables_not_one_per_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
