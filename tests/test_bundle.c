/* test_bundle.c - ahead-of-time bundles: a training step run from a bundle (an MLP, a CNN with conv-headed gemm groups) gives the JIT graph's bits, and every kind of damaged bundle is a clear error. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <dirent.h>
#include <fcntl.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "models.h"
#include "step/plan.h"
#include "step/schedule.h"
#include "alloy_config.h"
#include "runtime/backend.h"
#include "runtime/cpu/cpu_backend.h"
#include "codegen/export.h"
#include "runtime/bundle/bundle.h"
#include "runtime/graph/bundle_save.h"
#include "support.h"

/* The MLP of models.c (4 x 3 -> 8 -> 3) with f16 AMP, a dynamic loss
 * scaler that changes the scale on every step, and AdamW: every pass of a
 * training compile runs. */
enum { BATCH = 4, IN = 3, HIDDEN = 8, OUT = 3, STEPS = 8 };

static alloy_graph *build_step(void)
{
    alloy_graph *g = alloy_graph_new("aot_mlp");
    assert_non_null(g);
    alloy_graph_set_seed(g, 21);
    test_mlp m = build_mlp(g, F32, BATCH, IN, HIDDEN, OUT);
    alloy_graph_set_loss(g, m.loss);
    alloy_graph_enable_amp(g, ALLOY_F16);
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    sc.growth_interval = 1;
    alloy_graph_set_grad_scaler(g, sc);
    alloy_graph_add_optimizer(g, alloy_adamw(0.01, 0.9, 0.999, 1e-8, 0.01));
    assert_int_equal(alloy_graph_status(g), ALLOY_OK);
    return g;
}

/* Step k's batch: varied inputs; step 3's are huge, so its f16 gradients
 * overflow and the scaler skips it (the skip path runs too). */
static void batch(int k, float *x, int32_t *t)
{
    for (int i = 0; i < BATCH * IN; i++) x[i] = (float)(((i * 7 + k * 5) % 11) - 5) * 0.25f * (k == 3 ? 3e4f : 1.0f);
    for (int i = 0; i < BATCH; i++) t[i] = (i + k) % OUT;
}

typedef alloy_status (*run_fn)(void *obj, const alloy_host_tensor *feeds, int nfeeds, alloy_step_info *info);

static alloy_status run_graph(void *obj, const alloy_host_tensor *feeds, int nfeeds, alloy_step_info *info)
{
    alloy_status st = alloy_graph_run(obj, feeds, nfeeds, NULL, 0);
    return st ? st : alloy_graph_step_info(obj, info);
}

static alloy_status run_bundle(void *obj, const alloy_host_tensor *feeds, int nfeeds, alloy_step_info *info)
{
    alloy_status st = alloy_bundle_run(obj, feeds, nfeeds, NULL, 0);
    return st ? st : alloy_bundle_step_info(obj, info);
}

static void train(void *obj, run_fn run, alloy_step_info *info)
{
    for (int k = 0; k < STEPS; k++) {
        float x[BATCH * IN];
        int32_t t[BATCH];
        batch(k, x, t);
        alloy_host_tensor feeds[2] = {{"x", F32, 2, {BATCH, IN}, x}, {"targets", I32, 1, {BATCH}, t}};
        assert_int_equal(run(obj, feeds, 2, &info[k]), ALLOY_OK);
    }
}

static void test_training_from_a_bundle_gives_the_jit_graphs_losses_and_state_bit_for_bit(void **state)
{
    (void)state;
    alloy_graph *g = build_step();
    const char *path = test_tmp_path("step.alloy");
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    alloy_step_info jit[STEPS], aot[STEPS];
    train(g, run_graph, jit);
    alloy_bundle *b = NULL;
    char err[1024] = "";
    alloy_status st = alloy_bundle_load(path, &b, err, sizeof err);
    if (st) fail_msg("alloy_bundle_load: %s", err);
    /* the inputs a run feeds, as build_mlp made them */
    alloy_host_tensor in;
    assert_int_equal(alloy_bundle_input_count(b), 2);
    assert_int_equal(alloy_bundle_input_at(b, 0, &in), ALLOY_OK);
    assert_string_equal(in.name, "x");
    assert_true(in.dtype == F32 && in.rank == 2 && in.dims[0] == BATCH && in.dims[1] == IN && !in.data);
    assert_int_equal(alloy_bundle_input_at(b, 1, &in), ALLOY_OK);
    assert_string_equal(in.name, "targets");
    assert_true(in.dtype == I32 && in.rank == 1 && in.dims[0] == BATCH);
    assert_int_equal(alloy_bundle_input_at(b, 2, &in), ALLOY_ERR_NOT_FOUND);
    assert_non_null(strstr(alloy_bundle_last_error(b), "index 2 out of range [0, 2)"));
    assert_int_equal(alloy_bundle_input_at(b, -1, &in), ALLOY_ERR_NOT_FOUND);
    train(b, run_bundle, aot);
    int skipped = 0;
    for (int k = 0; k < STEPS; k++) {
        if (memcmp(&jit[k].loss, &aot[k].loss, sizeof(double)) != 0 || jit[k].scale != aot[k].scale ||
            jit[k].next_scale != aot[k].next_scale || jit[k].skipped != aot[k].skipped ||
            jit[k].step != aot[k].step || jit[k].skipped_steps != aot[k].skipped_steps)
            fail_msg("step %d: jit loss %.17g scale %g step %lld, bundle loss %.17g scale %g step %lld", k, jit[k].loss,
                     jit[k].scale, (long long)jit[k].step, aot[k].loss, aot[k].scale, (long long)aot[k].step);
        assert_true(isfinite(jit[k].loss));
        skipped += jit[k].skipped;
    }
    /* step 3 overflowed, and the growing scale overflowed others: the skip path ran in both */
    assert_true(jit[3].skipped);
    assert_true(skipped >= 2 && skipped < STEPS - 2);
    assert_int_equal(jit[STEPS - 1].step, STEPS - skipped);
    /* every state tensor the same bytes (params, moments, scale, counters) */
    int n = alloy_graph_state_count(g);
    assert_int_equal(alloy_bundle_state_count(b), n);
    assert_true(n >= 4 + 8 + 3); /* 4 params, 2 moments each, scaler and step counters */
    for (int i = 0; i < n; i++) {
        alloy_host_tensor want, got;
        expect_ok(g, alloy_graph_state_at(g, i, &want), "state_at");
        assert_int_equal(alloy_bundle_get_state(b, want.name, &got), ALLOY_OK);
        assert_int_equal(got.dtype, want.dtype);
        assert_int_equal(got.rank, want.rank);
        size_t bytes = (size_t)alloy_host_tensor_numel(&want) * alloy_dtype_size(want.dtype);
        if (memcmp(want.data, got.data, bytes) != 0) fail_msg("state '%s' differs after %d steps", want.name, STEPS);
    }
    /* the bundle's state saves and loads like a graph's */
    const char *ckpt = test_tmp_path("bundle_state.safetensors");
    assert_int_equal(alloy_bundle_save_state(b, ckpt), ALLOY_OK);
    assert_int_equal(alloy_graph_load_state(g, ckpt), ALLOY_OK);
    assert_int_equal(alloy_bundle_load_state(b, ckpt), ALLOY_OK);
    alloy_bundle_free(b);
    alloy_graph_free(g);
}

/* A bundle's run fetches the parameters' gradients from the bundle's own
 * executable (its schedule stores them: no other is built, which a
 * bundle's CUDA step could not do without a compiler): every other step
 * fetches all four, and they are the JIT graph's bit for bit, its losses
 * too, skipped step included. */
static void test_a_bundles_runs_fetch_the_gradients_the_jit_graphs_fetch_bit_for_bit(void **state)
{
    (void)state;
    alloy_graph *g = build_step();
    const char *path = test_tmp_path("step.alloy");
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    alloy_bundle *b = NULL;
    char err[1024] = "";
    if (alloy_bundle_load(path, &b, err, sizeof err)) fail_msg("alloy_bundle_load: %s", err);
    static const char *const names[] = {"loss", "grad:w1", "grad:b1", "grad:w2", "grad:b2"};
    enum { NF = sizeof names / sizeof names[0] };
    for (int k = 0; k < STEPS; k++) {
        float x[BATCH * IN];
        int32_t t[BATCH];
        batch(k, x, t);
        alloy_host_tensor feeds[2] = {{"x", F32, 2, {BATCH, IN}, x}, {"targets", I32, 1, {BATCH}, t}};
        alloy_host_tensor jit[NF], aot[NF];
        for (int i = 0; i < NF; i++) jit[i] = aot[i] = (alloy_host_tensor){.name = names[i]};
        int n = k % 2 ? NF : 1;
        expect_ok(g, alloy_graph_run(g, feeds, 2, jit, n), "jit run");
        if (alloy_bundle_run(b, feeds, 2, aot, n))
            fail_msg("step %d from the bundle: %s", k, alloy_bundle_last_error(b));
        for (int i = 0; i < n; i++) {
            assert_int_equal(aot[i].dtype, jit[i].dtype);
            assert_int_equal(aot[i].rank, jit[i].rank);
            size_t bytes = (size_t)alloy_host_tensor_numel(&jit[i]) * alloy_dtype_size(jit[i].dtype);
            if (memcmp(jit[i].data, aot[i].data, bytes) != 0)
                fail_msg("step %d: the bundle's %s is not the JIT's", k, names[i]);
        }
    }
    alloy_step_info info;
    assert_int_equal(alloy_graph_step_info(g, &info), ALLOY_OK);
    assert_true(info.skipped_steps >= 1); /* step 3's overflow: a skipped step's gradients came back too */
    alloy_bundle_free(b);
    alloy_graph_free(g);
}

/* The small CNN of models.c (its convolutions head gemm groups: conv1 with
 * its [C, 1, 1] bias add) under f16 AMP with AdamW, saved as a bundle: 4
 * steps from the bundle give the JIT graph's losses and state bit for bit
 * (the bundle's schedule holds the conv-headed gemm steps). */
static void test_a_cnn_bundle_with_conv_gemm_groups_trains_as_the_jit_graph(void **state)
{
    (void)state;
    enum { N = 8, K = 4 };
    alloy_graph *g = alloy_graph_new("aot_cnn");
    alloy_graph_set_seed(g, 5);
    test_cnn m = build_cnn(g, F32, N, 6, 8);
    alloy_graph_set_loss(g, m.loss);
    alloy_graph_enable_amp(g, ALLOY_F16);
    alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler());
    alloy_graph_add_optimizer(g, alloy_adamw(0.01, 0.9, 0.999, 1e-8, 0.01));
    const char *path = test_tmp_path("cnn.alloy");
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    alloy_bundle *b = NULL;
    char err[1024] = "";
    if (alloy_bundle_load(path, &b, err, sizeof err)) fail_msg("alloy_bundle_load: %s", err);
    for (int k = 0; k < K; k++) {
        float x[N * 64];
        int32_t t[N];
        for (int i = 0; i < N * 64; i++) x[i] = (float)(((i * 13 + k * 7) % 17) - 8) * 0.125f;
        for (int i = 0; i < N; i++) t[i] = (i * 3 + k) % 10;
        alloy_host_tensor feeds[2] = {{"x", F32, 4, {N, 1, 8, 8}, x}, {"targets", I32, 1, {N}, t}};
        alloy_step_info jit, aot;
        assert_int_equal(run_graph(g, feeds, 2, &jit), ALLOY_OK);
        assert_int_equal(run_bundle(b, feeds, 2, &aot), ALLOY_OK);
        if (memcmp(&jit.loss, &aot.loss, sizeof(double)) != 0 || jit.skipped != aot.skipped)
            fail_msg("step %d: jit loss %.17g, bundle loss %.17g", k, jit.loss, aot.loss);
        assert_true(isfinite(jit.loss));
    }
    for (int i = 0; i < alloy_graph_state_count(g); i++) {
        alloy_host_tensor want, got;
        expect_ok(g, alloy_graph_state_at(g, i, &want), "state_at");
        assert_int_equal(alloy_bundle_get_state(b, want.name, &got), ALLOY_OK);
        size_t bytes = (size_t)alloy_host_tensor_numel(&want) * alloy_dtype_size(want.dtype);
        if (memcmp(want.data, got.data, bytes) != 0) fail_msg("state '%s' differs after %d steps", want.name, K);
    }
    alloy_bundle_free(b);
    alloy_graph_free(g);
}

/* ---- damaged bundles ---- */

static uint32_t le32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Where each section starts (its 16-byte heading) in bytes; the count. */
static int sections(const uint8_t *bytes, size_t len, size_t *at, uint32_t *tag)
{
    int n = (int)le32(bytes + 40);
    size_t pos = BUNDLE_HEADER_BYTES;
    for (int i = 0; i < n; i++) {
        at[i] = pos, tag[i] = le32(bytes + pos);
        uint64_t body = le32(bytes + pos + 8) | (uint64_t)le32(bytes + pos + 12) << 32;
        pos += 16 + (size_t)body;
    }
    assert_int_equal(pos, len);
    return n;
}

/* The file as bytes and decoded; the IR section parses back to a graph
 * whose schedule and plan, built again for a run that fetches every
 * output, are the bundle's: it stores the gradient outputs, which the
 * default schedule stores only for a run that fetches them. */
static void test_the_bundles_ir_parses_back_to_the_same_schedule_and_plan(void **state)
{
    (void)state;
    alloy_graph *g = build_step();
    const char *path = test_tmp_path("step.alloy");
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    bundle_contents c;
    char err[1024] = "";
    if (bundle_read_file(path, &c, err, sizeof err)) fail_msg("%s", err);
    /* the schedule of a run that fetches every output: the gradients the
     * default schedule stores only when fetched are kept */
    schedule s, plain;
    mem_plan p;
    bool every_output[256] = {0};
    assert_true(c.ir->nnodes < 256);
    for (int i = 0; i < c.ir->noutputs; i++) every_output[c.ir->outputs[i].node] = true;
    assert_int_equal(sched_build(c.ir, every_output, &s, err, sizeof err), ALLOY_OK);
    assert_int_equal(plan_for_step(c.ir, &s, false, &p, err, sizeof err), ALLOY_OK);
    assert_int_equal(sched_build(c.ir, NULL, &plain, err, sizeof err), ALLOY_OK);
    const schedule *b = &c.comp.sched;
    int grads = 0, left_out = 0;
    for (int i = 0; i < c.ir->noutputs; i++) {
        int id = c.ir->outputs[i].node;
        bool grad = strncmp(c.ir->outputs[i].name, "grad:", 5) == 0;
        assert_true(b->kept[id]);
        assert_true(!grad || sched_stored(b, id));
        grads += grad;
        left_out += !plain.kept[id];
    }
    assert_int_equal(grads, 4); /* w1 b1 w2 b2: what a bundle's run may fetch with nothing compiled */
    assert_int_equal(left_out, 4); /* the default schedule stores none of them */
    sched_free(&plain);
    assert_int_equal(s.nsteps, b->nsteps);
    assert_true(b->nsteps > 5);
    assert_int_equal(s.nmembers, b->nmembers);
    assert_int_equal(s.nparts, b->nparts);
    assert_int_equal(s.ninputs, b->ninputs);
    for (int i = 0; i < s.nsteps; i++) {
        assert_int_equal(s.steps[i].kind, b->steps[i].kind);
        assert_int_equal(s.steps[i].pos, b->steps[i].pos);
        assert_int_equal(s.steps[i].n, b->steps[i].n);
        assert_true(ir_type_eq(&s.steps[i].space, &b->steps[i].space));
    }
    for (int i = 0; i < s.nmembers; i++) {
        assert_int_equal(s.members[i].node, b->members[i].node);
        assert_int_equal(s.members[i].flags, b->members[i].flags);
    }
    assert_memory_equal(s.inputs, b->inputs, sizeof(int) * (size_t)s.ninputs);
    assert_memory_equal(s.kept, b->kept, (size_t)s.nnodes);
    assert_int_equal(p.arena_bytes, c.comp.plan.arena_bytes);
    assert_int_equal(p.scratch_offset, c.comp.plan.scratch_offset);
    assert_memory_equal(p.offset, c.comp.plan.offset, sizeof(int64_t) * (size_t)p.nnodes);
    /* the updates written into their state's buffer came back as such */
    assert_non_null(p.state_of);
    assert_non_null(c.comp.plan.state_of);
    assert_memory_equal(p.state_of, c.comp.plan.state_of, sizeof(int) * (size_t)p.nnodes);
    assert_int_equal(p.first_write, c.comp.plan.first_write);
    /* printing the parsed IR gives the section's text again: every attribute survived */
    size_t len;
    unsigned char *bytes = test_read_file(path, &len);
    char *again = ir_print_string(c.ir);
    assert_non_null(again);
    size_t at[16];
    uint32_t tag[16];
    sections(bytes, len, at, tag);
    assert_int_equal(tag[1], BUNDLE_SEC_IR);
    assert_int_equal(at[2] - at[1] - 16, strlen(again));
    assert_memory_equal(bytes + at[1] + 16, again, strlen(again));
    assert_int_equal(c.seed, 21);
    assert_true(c.training);
    assert_int_equal(c.optimizer_kind, ALLOY_OPTIM_ADAMW);
    al_free(again);
    test_free(bytes);
    sched_free(&s);
    plan_free(&p);
    bundle_contents_free(&c);
    alloy_graph_free(g);
}

/* A step with padded rows (h w over 101 f16 classes, cross_entropy, SGD): the bundle's schedule,
 * read back, has the row strides sched_build gives (they are chosen again, not stored), and its
 * plan the slots sized for them. */
static void test_a_bundles_padded_rows_come_back_as_built(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("padded");
    assert_non_null(g);
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){16, 24});
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 2, (int64_t[]){24, 101}, alloy_init_normal(0.1));
    alloy_tensor *logits = alloy_set_name(g, alloy_matmul(g, x, w, false, false), "logits");
    alloy_tensor *loss = alloy_cross_entropy(g, logits, alloy_input(g, "t", ALLOY_I32, 1, (int64_t[]){16}));
    alloy_graph_set_loss(g, loss);
    alloy_graph_enable_amp(g, ALLOY_BF16);
    alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0, 0, false));
    assert_int_equal(alloy_graph_status(g), ALLOY_OK);
    const char *path = test_tmp_path("padded.alloy");
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    bundle_contents c;
    char err[1024] = "";
    if (bundle_read_file(path, &c, err, sizeof err)) fail_msg("%s", err);
    schedule s;
    mem_plan p;
    assert_int_equal(sched_build(c.ir, NULL, &s, err, sizeof err), ALLOY_OK);
    assert_int_equal(plan_for_step(c.ir, &s, false, &p, err, sizeof err), ALLOY_OK);
    int at = ir_find_name(c.ir, "logits");
    assert_true(at >= 0);
    assert_non_null(s.row_stride);
    assert_non_null(c.comp.sched.row_stride);
    assert_int_equal(s.row_stride[at], 128);
    assert_memory_equal(s.row_stride, c.comp.sched.row_stride, sizeof(int64_t) * (size_t)s.nnodes);
    assert_int_equal(p.arena_bytes, c.comp.plan.arena_bytes);
    assert_memory_equal(p.offset, c.comp.plan.offset, sizeof(int64_t) * (size_t)p.nnodes);
    sched_free(&s);
    plan_free(&p);
    bundle_contents_free(&c);
    alloy_graph_free(g);
}

/* Decodes bytes[0..len) and expects status with every needle in the message. */
static void expect_error(const uint8_t *bytes, size_t len, alloy_status want, const char *needle, const char *needle2,
                         const char *what)
{
    bundle_contents c;
    char err[1024] = "";
    alloy_status st = bundle_decode(bytes, len, "step.alloy", &c, err, sizeof err);
    if (st == ALLOY_OK) {
        bundle_contents_free(&c);
        fail_msg("%s: decoded without an error", what);
    }
    if (st != want || !strstr(err, needle) || (needle2 && !strstr(err, needle2)) || !strstr(err, "step.alloy"))
        fail_msg("%s: status %d, message '%s'; expected %d with '%s' and '%s'", what, st, err, want, needle,
                 needle2 ? needle2 : "");
}

/* The CNN's reshapes of computed values are views (plan.h): the reader
 * rebuilds view_of from the schedule's flags, and a view whose offset is
 * not its owner's slot is an error naming the plan section. */
static void test_a_view_off_its_owners_slot_is_an_error_naming_the_plan(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("aot_cnn");
    test_cnn m = build_cnn(g, F32, 8, 6, 8);
    alloy_graph_set_loss(g, m.loss);
    alloy_graph_enable_amp(g, ALLOY_F16);
    alloy_graph_add_optimizer(g, alloy_adamw(0.01, 0.9, 0.999, 1e-8, 0.01));
    const char *path = test_tmp_path("cnn_views.alloy");
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    alloy_graph_free(g);
    size_t len;
    uint8_t *bytes = test_read_file(path, &len);
    bundle_contents c;
    char err[1024] = "";
    if (bundle_decode(bytes, len, "step.alloy", &c, err, sizeof err)) fail_msg("%s", err);
    int view = -1;
    for (int i = 0; c.comp.plan.view_of && i < c.comp.plan.nnodes && view < 0; i++)
        if (c.comp.plan.view_of[i] >= 0) view = i;
    assert_true(view >= 0);
    assert_true(c.comp.plan.views > 0);
    int64_t owner = c.comp.plan.offset[c.comp.plan.view_of[view]];
    assert_int_equal(c.comp.plan.offset[view], owner);
    bundle_contents_free(&c);
    size_t at[16];
    uint32_t tag[16];
    sections(bytes, len, at, tag);
    size_t slot = at[3] + 16 + 4 + 8 + 8 + 4 + 8 + 8 + 4 + 8 * ALLOY_DTYPE_COUNT + 8 * (size_t)view;
    assert_int_equal(le32(bytes + slot), (uint32_t)owner);
    put32(bytes + slot, owner ? 0u : 64u); /* aligned, inside the arena, not the owner's */
    assert_true(bundle_resign(bytes, len));
    expect_error(bytes, len, ALLOY_ERR_FORMAT, "is not placed 0 bytes into the arena slot", "section plan", "a view moved");
    test_free(bytes);
}

/* A slice view and a gathered concat's pieces travel in a bundle as
 * offsets inside their owner's slot: the reader rebuilds both (s 512 B
 * into a's slot; a and b at 0 and 512 of c's) and names a piece moved off
 * its offset. */
static void test_slice_views_and_gathered_pieces_round_trip_and_a_moved_piece_is_named(void **state)
{
    (void)state;
    static const char ir[] =
        "graph gathered {\n"
        "  %x = input : f32[2,128]\n"
        "  %a = exp(%x) : f32[2,128]\n"
        "  %b = neg(%x) : f32[2,128]\n"
        "  %c = concat(%a, %b) {axis=0} : f32[4,128]\n"
        "  %s = slice(%c) {axis=0, start=1, end=3} : f32[2,128]\n"
        "  %y = mul(%s, %s) : f32[2,128]\n"
        "  output \"y\" = %y\n"
        "}\n";
    char err[1024] = "";
    alloy_graph *g = alloy_graph_parse(ir, strlen(ir), "gathered.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    expect_ok(g, alloy_graph_set_option(g, "no_fuse", "1"), "no_fuse");
    const char *path = test_tmp_path("gathered.alloy");
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    alloy_graph_free(g);
    size_t len;
    uint8_t *bytes = test_read_file(path, &len);
    bundle_contents c;
    if (bundle_decode(bytes, len, "step.alloy", &c, err, sizeof err)) fail_msg("%s", err);
    const mem_plan *p = &c.comp.plan;
    int a = ir_find_name(c.ir, "a"), b = ir_find_name(c.ir, "b"),
        cc = ir_find_name(c.ir, "c"), sv = ir_find_name(c.ir, "s");
    assert_true(a >= 0 && b >= 0 && cc >= 0 && sv >= 0);
    assert_non_null(p->view_of);
    assert_int_equal(p->views, 3);
    assert_int_equal(p->view_of[a], cc);
    assert_int_equal(p->view_of[b], cc);
    assert_int_equal(p->view_of[sv], cc);
    assert_int_equal(p->offset[a], p->offset[cc]);
    assert_int_equal(p->offset[b], p->offset[cc] + 1024);
    assert_int_equal(p->offset[sv], p->offset[cc] + 512);
    int64_t want = p->offset[b];
    bundle_contents_free(&c);
    size_t at[16];
    uint32_t tag[16];
    sections(bytes, len, at, tag);
    size_t slot = at[3] + 16 + 4 + 8 + 8 + 4 + 8 + 8 + 4 + 8 * ALLOY_DTYPE_COUNT + 8 * (size_t)b;
    assert_int_equal(le32(bytes + slot), (uint32_t)want);
    put32(bytes + slot, (uint32_t)want + 16u); /* aligned, inside the arena, off the piece's offset */
    assert_true(bundle_resign(bytes, len));
    expect_error(bytes, len, ALLOY_ERR_FORMAT, "is not placed 1024 bytes into the arena slot", "section plan",
                 "a piece moved");
    test_free(bytes);
}

static uint8_t *saved_bundle(size_t *len)
{
    alloy_graph *g = build_step();
    const char *path = test_tmp_path("step.alloy");
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    alloy_graph_free(g);
    return test_read_file(path, len);
}

static void test_truncated_bundles_are_errors_at_every_header_byte_and_section_boundary(void **state)
{
    (void)state;
    size_t len;
    uint8_t *bytes = saved_bundle(&len);
    char what[64];
    for (size_t cut = 0; cut < BUNDLE_HEADER_BYTES; cut++) {
        al_fmt(what, sizeof what, "cut at header byte %zu", cut);
        expect_error(bytes, cut, ALLOY_ERR_FORMAT, cut < 8 ? "not an alloy bundle" : "truncated", NULL, what);
    }
    size_t at[16];
    uint32_t tag[16];
    int n = sections(bytes, len, at, tag);
    assert_int_equal(n, 6);
    for (int i = 0; i < n; i++) {
        size_t cuts[3] = {at[i], at[i] + 8, at[i] + 16}; /* before, inside and after its heading */
        for (int k = 0; k < 3; k++) {
            al_fmt(what, sizeof what, "cut at %zu, section %s", cuts[k], bundle_tag_name(tag[i]));
            expect_error(bytes, cuts[k], ALLOY_ERR_FORMAT, "truncated", NULL, what);
        }
    }
    expect_error(bytes, len - 1, ALLOY_ERR_FORMAT, "truncated", NULL, "one byte short");
    /* the public loader says the same about a file */
    FILE *f = fopen(test_tmp_path("short.alloy"), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, at[3], f), at[3]);
    fclose(f);
    alloy_bundle *b = (alloy_bundle *)(uintptr_t)1;
    char err[1024];
    assert_int_equal(alloy_bundle_load(test_tmp_path("short.alloy"), &b, err, sizeof err), ALLOY_ERR_FORMAT);
    assert_null(b);
    assert_non_null(strstr(err, "short.alloy: truncated"));
    test_free(bytes);
}

static void test_a_flipped_byte_in_any_section_is_a_checksum_mismatch(void **state)
{
    (void)state;
    size_t len;
    uint8_t *bytes = saved_bundle(&len);
    size_t at[16];
    uint32_t tag[16];
    int n = sections(bytes, len, at, tag);
    char what[64];
    for (int i = 0; i < n; i++) {
        size_t end = i + 1 < n ? at[i + 1] : len;
        size_t spots[3] = {at[i], at[i] + 16, at[i] + 16 + (end - at[i] - 16) / 2}; /* tag, first byte, middle */
        for (int k = 0; k < 3; k++) {
            if (spots[k] >= end) continue;
            bytes[spots[k]] ^= 0x20;
            al_fmt(what, sizeof what, "byte %zu of section %s flipped", spots[k], bundle_tag_name(tag[i]));
            expect_error(bytes, len, ALLOY_ERR_FORMAT, "checksum mismatch", NULL, what);
            bytes[spots[k]] ^= 0x20;
        }
    }
    bytes[60] ^= 1; /* the stored checksum itself */
    expect_error(bytes, len, ALLOY_ERR_FORMAT, "checksum mismatch", NULL, "checksum flipped");
    bytes[60] ^= 1;
    test_free(bytes);
}

static void test_wrong_magic_newer_version_and_bad_lengths_are_named(void **state)
{
    (void)state;
    size_t len;
    uint8_t *bytes = saved_bundle(&len);
    bytes[0] = 'X';
    expect_error(bytes, len, ALLOY_ERR_FORMAT, "not an alloy bundle", NULL, "magic");
    bytes[0] = 'A';
    put32(bytes + 8, BUNDLE_VERSION + 1);
    expect_error(bytes, len, ALLOY_ERR_UNSUPPORTED, "format version 3 is newer", "written by alloy 0.1", "version");
    put32(bytes + 8, 1); /* version 1 had no in-place updates in its plan: refused, not misread */
    expect_error(bytes, len, ALLOY_ERR_UNSUPPORTED, "format version 1 is older than this alloy reads (2",
                 "compile the step again", "old version");
    put32(bytes + 8, BUNDLE_VERSION);
    /* a section length past the end (the checksum made right, so the length check is what fails) */
    size_t at[16];
    uint32_t tag[16];
    sections(bytes, len, at, tag);
    put32(bytes + at[2] + 8, 0x7fffffff);
    bundle_resign(bytes, len);
    expect_error(bytes, len, ALLOY_ERR_FORMAT, "section schedule", "runs past the end", "schedule length");
    test_free(bytes);
}

/* Damage inside a section with the checksum made right: the reader's own
 * checks of each section name it. */
static void test_inconsistent_sections_are_errors_naming_the_section(void **state)
{
    (void)state;
    size_t len;
    uint8_t *good = saved_bundle(&len);
    size_t at[16];
    uint32_t tag[16];
    sections(good, len, at, tag);
    uint8_t *bytes = test_malloc(len);
    struct {
        int section;
        size_t offset; /* into the section's body */
        uint32_t value;
        const char *needle;
    } cases[] = {
        {0, 0, 0x64646573u, "section meta"},             /* "graph=" -> "sedd.." */
        {1, 0, 0x40404040u, "section ir"},               /* the IR text no longer parses */
        {2, 0, 5u, "nnodes (the IR's node count) = 5"},  /* the node count */
        {2, 20 + 8, 0xffffu, "section schedule"},        /* step 0's first member */
        {2, 20 + 12, 0u, "step member count = 0"},       /* step 0 has no members */
        {3, 4, 64u, "outside the arena of 64 bytes"},    /* the arena shrunk to 64 bytes under its values */
        {3, 0, 1u, "section plan"},                      /* node count */
        {4, 0, 1000u, "section state"},                  /* the state count does not fit */
        {4, 4, 1u << 30, "section state"},               /* a name's length runs past the end */
    };
    char what[96];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(bytes, good, len);
        put32(bytes + at[cases[i].section] + 16 + cases[i].offset, cases[i].value);
        assert_true(bundle_resign(bytes, len));
        al_fmt(what, sizeof what, "case %zu (section %s)", i, bundle_tag_name(tag[cases[i].section]));
        expect_error(bytes, len, ALLOY_ERR_FORMAT, cases[i].needle, NULL, what);
    }
    /* a value's slot moved off its alignment, then past the arena */
    size_t offsets = at[3] + 16 + 4 + 8 + 8 + 4 + 8 + 8 + 4 + 8 * ALLOY_DTYPE_COUNT, slot = offsets;
    while (slot < at[4] && le32(good + slot) == 0xffffffffu) slot += 8;
    assert_true(slot < at[4]);
    uint32_t arena = le32(good + at[3] + 16 + 4);
    uint32_t moved[2] = {le32(good + slot) + 8, arena};
    for (int k = 0; k < 2; k++) {
        memcpy(bytes, good, len);
        put32(bytes + slot, moved[k]);
        bundle_resign(bytes, len);
        al_fmt(what, sizeof what, "slot at %zu moved to %u", slot, moved[k]);
        expect_error(bytes, len, ALLOY_ERR_FORMAT, "slot lies outside the arena or is misaligned", "section plan",
                     what);
    }
    /* every byte of the binary sections flipped, checksum made right: an
     * error or a bundle, never a crash or a read outside the buffer (the
     * sanitizer build checks) */
    int errors = 0, total = 0;
    for (int s = 2; s <= 4; s++) {
        size_t end = at[s + 1];
        for (size_t p = at[s] + 16; p < end; p += s == 2 ? 3 : 1) {
            memcpy(bytes, good, len);
            bytes[p] ^= 0x81;
            bundle_resign(bytes, len);
            bundle_contents c;
            char err[1024];
            if (bundle_decode(bytes, len, "x", &c, err, sizeof err) == ALLOY_OK) bundle_contents_free(&c);
            else errors++;
            total++;
        }
    }
    print_message("flipped %d bytes of schedule, plan and state: %d errors\n", total, errors);
    assert_true(errors > total / 2);
    test_free(bytes);
    test_free(good);
}

static void test_save_bundle_refuses_bad_archs_a_missing_nvrtc_and_null_arguments(void **state)
{
    (void)state;
    alloy_graph *g = build_step();
    const char *x = test_tmp_path("x.alloy");
    assert_int_equal(alloy_graph_save_bundle(g, x, "sm_80,sm_8x"), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "sm_8x"));
    expect_ok(g, alloy_graph_set_option(g, "nvrtc", "/nonexistent/libnvrtc.so"), "set_option nvrtc");
    assert_int_equal(alloy_graph_save_bundle(g, x, "sm_80"), ALLOY_ERR_UNSUPPORTED);
    assert_non_null(strstr(alloy_last_error(g), "need NVRTC"));
    assert_non_null(strstr(alloy_last_error(g), "/nonexistent/libnvrtc.so"));
    FILE *none = fopen(x, "rb");
    assert_null(none); /* nothing written */
    assert_int_equal(alloy_graph_save_bundle(g, NULL, NULL), ALLOY_ERR_INVALID);
    alloy_bundle *b;
    char err[256];
    assert_int_equal(alloy_bundle_load(test_tmp_path("missing.alloy"), &b, err, sizeof err), ALLOY_ERR_IO);
    assert_non_null(strstr(err, "missing.alloy: cannot open"));
    assert_null(b);
    assert_int_equal(alloy_bundle_load(test_tmp_path("x.alloy"), NULL, err, sizeof err), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_bundle_load(NULL, &b, err, sizeof err), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_bundle_run(NULL, NULL, 0, NULL, 0), ALLOY_ERR_INVALID);
    alloy_step_info info;
    assert_int_equal(alloy_bundle_step_info(NULL, &info), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_bundle_state_count(NULL), 0);
    alloy_bundle_free(NULL);
    alloy_graph_free(g);
}

/* ---- the CUDA executable ---- */

/* Bytes that pass as a cubin (ELF magic) or PTX (text and its NUL) of arch. */
static bundle_image fake_image(uint32_t kind, uint32_t arch, uint32_t module)
{
    char text[64];
    al_fmt(text, sizeof text, "%s%u module %u", kind == BUNDLE_CUBIN ? "\177ELF sm_" : "// compute_", arch, module);
    size_t n = strlen(text) + 1; /* PTX counts its NUL; a cubin keeps it too */
    uint8_t *data = al_malloc(n);
    assert_non_null(data);
    memcpy(data, text, n);
    return (bundle_image){kind, arch, module, data, n};
}

/* cubins sm_80, sm_90 and PTX compute_80 for nmodules modules; PTX needs driver 12.8. */
static bundle_cuda fake_cuda(uint32_t nmodules)
{
    bundle_cuda x = {.min_driver = 12080, .nmodules = nmodules};
    x.images = al_calloc(3 * nmodules, sizeof *x.images);
    assert_non_null(x.images);
    for (uint32_t m = 0; m < nmodules; m++) {
        x.images[x.nimages++] = fake_image(BUNDLE_CUBIN, 80, m);
        x.images[x.nimages++] = fake_image(BUNDLE_CUBIN, 90, m);
        x.images[x.nimages++] = fake_image(BUNDLE_PTX, 80, m);
    }
    return x;
}

/* What a GPU of compute capability sm with driver `driver` loads: a cubin
 * runs on its major version's later minors only; PTX on any later GPU
 * whose driver is new enough; else an error naming every target. */
static void test_the_cuda_pick_takes_the_cubin_of_the_gpus_major_else_the_ptx(void **state)
{
    (void)state;
    bundle_cuda x = fake_cuda(2);
    static const struct {
        int sm, driver;
        uint32_t kind, arch;
    } cases[] = {
        {80, 12080, BUNDLE_CUBIN, 80}, {86, 11000, BUNDLE_CUBIN, 80}, {89, 12080, BUNDLE_CUBIN, 80},
        {90, 12080, BUNDLE_CUBIN, 90}, {100, 12080, BUNDLE_PTX, 80},  {120, 13000, BUNDLE_PTX, 80},
    };
    char why[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (uint32_t m = 0; m < 2; m++) {
            const bundle_image *im = NULL;
            assert_int_equal(bundle_cuda_pick(&x, m, cases[i].sm, cases[i].driver, &im, why, sizeof why), ALLOY_OK);
            assert_non_null(im);
            if (im->kind != cases[i].kind || im->arch != cases[i].arch || im->module != m)
                fail_msg("sm_%d module %u: picked kind %u arch %u module %u", cases[i].sm, m, im->kind, im->arch,
                         im->module);
        }
    const bundle_image *im = (const bundle_image *)&x; /* set to NULL on failure */
    /* a GPU older than every target: the error names the GPU and the bundle's cubins and PTX */
    assert_int_equal(bundle_cuda_pick(&x, 0, 75, 13000, &im, why, sizeof why), ALLOY_ERR_UNSUPPORTED);
    assert_null(im);
    assert_string_equal(why, "the GPU is sm_75 and the bundle has cubins sm_80, sm_90; PTX compute_80: none runs on "
                             "it (save the bundle with --arch sm_75)");
    /* a newer GPU whose driver is too old for the PTX */
    assert_int_equal(bundle_cuda_pick(&x, 1, 100, 12020, &im, why, sizeof why), ALLOY_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "the PTX needs CUDA driver 12.8 or newer, this driver is 12.2"));
    assert_non_null(strstr(why, "cubins sm_80, sm_90; PTX compute_80"));
    /* a module the bundle does not have, and a bundle with no CUDA executable */
    assert_int_equal(bundle_cuda_pick(&x, 2, 80, 13000, &im, why, sizeof why), ALLOY_ERR_UNSUPPORTED);
    bundle_cuda none = {0};
    assert_int_equal(bundle_cuda_pick(&none, 0, 80, 13000, &im, why, sizeof why), ALLOY_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "no CUDA executable"));
    bundle_cuda_free(&x);
}

/* The CPU bundle's contents with x attached, encoded (test_free *len bytes). */
static uint8_t *encode_with_cuda(bundle_cuda *x, size_t *len)
{
    alloy_graph *g = build_step();
    const char *path = test_tmp_path("step.alloy");
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    alloy_graph_free(g);
    bundle_contents c;
    char err[1024] = "";
    if (bundle_read_file(path, &c, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(c.cuda.nimages, 0); /* a CPU bundle has none */
    c.cuda = *x;
    al_free(c.options); /* the test's ALLOY_DEVICE=cpu, which would win over the device asked for at load */
    c.options = al_strdup("# options: defaults");
    assert_non_null(c.options);
    uint8_t *bytes;
    assert_int_equal(bundle_encode(&c, &bytes, len, err, sizeof err), ALLOY_OK);
    bundle_contents_free(&c); /* frees x's images */
    memset(x, 0, sizeof *x);
    return bytes;
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Encoded and decoded, the section gives the same images; truncated at
 * each of its fields, with a field made wrong (checksum made right), or a
 * flipped byte (checksum not), the reader names what. */
static void test_the_cuda_section_round_trips_and_each_damage_is_named(void **state)
{
    (void)state;
    bundle_cuda want = fake_cuda(2), x = fake_cuda(2);
    size_t len;
    uint8_t *bytes = encode_with_cuda(&x, &len);
    bundle_contents c;
    char err[1024] = "";
    if (bundle_decode(bytes, len, "step.alloy", &c, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(c.cuda.min_driver, 12080);
    assert_int_equal(c.cuda.nmodules, 2);
    assert_int_equal(c.cuda.nimages, want.nimages);
    for (int i = 0; i < want.nimages; i++) {
        const bundle_image *a = &want.images[i], *b = &c.cuda.images[i];
        assert_true(a->kind == b->kind && a->arch == b->arch && a->module == b->module && a->size == b->size);
        assert_memory_equal(a->data, b->data, a->size);
    }
    bundle_contents_free(&c);
    size_t at[16];
    uint32_t tag[16];
    int n = sections(bytes, len, at, tag);
    assert_int_equal(n, 7);
    assert_int_equal(tag[6], BUNDLE_SEC_CUDA_EXEC);
    size_t body = at[6] + 16, first = body + 12; /* the first image's heading */
    uint8_t *copy = test_malloc(len);
    char what[96];
    /* truncated anywhere in the section: the header's payload size no longer fits */
    for (size_t cut = at[6]; cut < len; cut += 3) {
        al_fmt(what, sizeof what, "cut at byte %zu of the cuda section", cut - at[6]);
        expect_error(bytes, cut, ALLOY_ERR_FORMAT, "truncated", NULL, what);
    }
    /* a flipped byte anywhere in it, an image's bytes included: the checksum */
    for (size_t i = at[6]; i < len; i++) {
        memcpy(copy, bytes, len);
        copy[i] ^= 0x20;
        al_fmt(what, sizeof what, "byte %zu of the cuda section flipped", i - at[6]);
        expect_error(copy, len, ALLOY_ERR_FORMAT, "checksum mismatch", NULL, what);
    }
    /* each field wrong, the checksum made right */
    static const struct {
        size_t off;     /* from the body */
        bool from_image; /* off from the first image's heading instead */
        uint32_t value;
        const char *needle;
    } bad[] = {
        {0, false, 12, "min_driver = 12 is outside"},
        {4, false, 0, "nmodules = 0 is outside"},
        {8, false, 5, "nimages = 5 is not a positive multiple of nmodules"},
        {8, false, 1000, "nimages = 1000 does not fit"},
        {0, true, 4, "image kind = 4 is outside"},
        {0, true, 3, "host image arch = 80 is outside"},
        {4, true, 5, "image arch = 5 is outside"},
        {8, true, 1, "image module (images go in module order) = 1 is outside [0, 0]"},
        {12, true, 7, "image 0: reserved word not 0"},
        {16, true, 0, "image 0: length 0 or past the end"},
        {16, true, 1000000, "image 0: length 0 or past the end"},
        {24, true, 0x41414141, "image 0: a cubin that is not an ELF file"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        memcpy(copy, bytes, len);
        put32(copy + (bad[k].from_image ? first : body) + bad[k].off, bad[k].value);
        if (bad[k].off == 16 && bad[k].from_image) put64(copy + first + 16, bad[k].value);
        assert_true(bundle_resign(copy, len));
        al_fmt(what, sizeof what, "field %zu of the cuda section", k);
        expect_error(copy, len, ALLOY_ERR_FORMAT, bad[k].needle, "section cuda", what);
    }
    /* module 1's targets not module 0's: its cubin sm_80 made sm_86 */
    size_t img = first;
    for (int i = 0; i < 3; i++) img += 24 + le32(copy + img + 16);
    memcpy(copy, bytes, len);
    put32(copy + img + 4, 86);
    assert_true(bundle_resign(copy, len));
    expect_error(copy, len, ALLOY_ERR_FORMAT, "image 3: its module's targets are not module 0's", NULL, "targets");
    /* a repeated target: module 0's cubin sm_90 made sm_80 */
    memcpy(copy, bytes, len);
    put32(copy + first + 24 + le32(copy + first + 16) + 4, 80);
    assert_true(bundle_resign(copy, len));
    expect_error(copy, len, ALLOY_ERR_FORMAT, "image 1: a target repeated", NULL, "repeated");
    /* PTX with a NUL inside */
    memcpy(copy, bytes, len);
    size_t ptx = first + 24 + le32(copy + first + 16);
    ptx += 24 + le32(copy + ptx + 16);
    copy[ptx + 24 + 1] = 0;
    assert_true(bundle_resign(copy, len));
    expect_error(copy, len, ALLOY_ERR_FORMAT, "image 2: PTX that is not text ending in one NUL", NULL, "ptx");
    test_free(copy);
    test_free(bytes);
    bundle_cuda_free(&want);
}

/* The CPU bundle of the test step with a CUDA executable: fake cubins
 * (sm_80, one per module) and the step's real kernel table (cg_emit's);
 * *prog keeps the kernels (cg_program_free). test_free the bytes. */
static uint8_t *encode_with_kernels(cg_program *prog, size_t *len)
{
    alloy_graph *g = build_step();
    const char *path = test_tmp_path("step.alloy");
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    alloy_graph_free(g);
    bundle_contents c;
    char err[1024] = "";
    if (bundle_read_file(path, &c, err, sizeof err)) fail_msg("%s", err);
    if (cg_emit(c.ir, &c.comp.sched, prog, err, sizeof err)) fail_msg("%s", err);
    int nm = cg_module_count(prog->nkernels);
    assert_true(nm >= 1);
    c.cuda = (bundle_cuda){.min_driver = 12080, .nmodules = (uint32_t)nm, .images = al_calloc((size_t)nm, sizeof(bundle_image))};
    assert_non_null(c.cuda.images);
    for (int m = 0; m < nm; m++) {
        uint8_t *data = al_malloc(16);
        assert_non_null(data);
        memcpy(data, "\177ELF fake cubin", 16);
        c.cuda.images[c.cuda.nimages++] = (bundle_image){BUNDLE_CUBIN, 80, (uint32_t)m, data, 16};
    }
    assert_int_equal(bundle_kernel_table(prog, &c.cuda), ALLOY_OK);
    uint8_t *bytes;
    assert_int_equal(bundle_encode(&c, &bytes, len, err, sizeof err), ALLOY_OK);
    bundle_contents_free(&c);
    return bytes;
}

/* The kernel table (section 9) round trips: every kernel's name, module,
 * step, geometry and parameters, the skipped steps with why. Cut at its
 * boundary or inside it (the heading and header made to agree, checksum
 * right), a flipped byte in it, each field made wrong: errors naming the
 * section and what. */
static void test_the_kernel_table_round_trips_and_each_damage_is_named(void **state)
{
    (void)state;
    cg_program prog;
    size_t len;
    uint8_t *bytes = encode_with_kernels(&prog, &len);
    bundle_contents c;
    char err[1024] = "", what[96];
    if (bundle_decode(bytes, len, "step.alloy", &c, err, sizeof err)) fail_msg("%s", err);
    assert_true(c.cuda.has_kernels);
    assert_int_equal(c.cuda.prog.nkernels, prog.nkernels);
    assert_int_equal(c.cuda.prog.nskipped, prog.nskipped);
    for (int q = 0; q < prog.nkernels; q++) {
        const cg_kernel *a = &prog.kernels[q], *b = &c.cuda.prog.kernels[q];
        int first, count;
        cg_module_range(prog.nkernels, (int)c.cuda.module_of[q], &first, &count);
        assert_true(q >= first && q < first + count);
        assert_string_equal(a->name, b->name);
        assert_true(a->step == b->step && a->kind == b->kind && a->grid == b->grid && a->block == b->block);
        assert_int_equal(a->nparams, b->nparams);
        assert_null(b->source);
        for (int i = 0; i < a->nparams; i++)
            assert_true(a->params[i].kind == b->params[i].kind && a->params[i].node == b->params[i].node &&
                        a->params[i].written == b->params[i].written && a->params[i].count == b->params[i].count);
    }
    for (int i = 0; i < prog.nskipped; i++) {
        assert_int_equal(prog.skipped[i], c.cuda.prog.skipped[i]);
        assert_string_equal(prog.why[i], c.cuda.prog.why[i]);
    }
    int nsteps = c.comp.sched.nsteps;
    bundle_contents_free(&c);
    size_t at[16];
    uint32_t tag[16];
    assert_int_equal(sections(bytes, len, at, tag), 8);
    assert_int_equal(tag[7], BUNDLE_SEC_CUDA_KERNELS);
    size_t body = at[7] + 16, seclen = len - body;
    uint8_t *copy = test_malloc(len);
    /* cut at the section's start (the header still counts it), and inside: the heading's length and the
     * header's payload size made to agree with the cut, the checksum right */
    memcpy(copy, bytes, len);
    put64(copy + 32, at[7] - BUNDLE_HEADER_BYTES);
    assert_true(bundle_resign(copy, at[7]));
    expect_error(copy, at[7], ALLOY_ERR_FORMAT, "section 7 at byte", "heading runs past the end", "cut at section 9");
    int cuts = 0;
    for (size_t k = 0; k < seclen; k += 5, cuts++) {
        memcpy(copy, bytes, len);
        put64(copy + at[7] + 8, k);
        put64(copy + 32, body + k - BUNDLE_HEADER_BYTES);
        assert_true(bundle_resign(copy, body + k));
        al_fmt(what, sizeof what, "kernel table cut to %zu of its %zu bytes", k, seclen);
        expect_error(copy, body + k, ALLOY_ERR_FORMAT, "section cuda kernels at byte", NULL, what);
    }
    /* a flipped byte anywhere in it */
    for (size_t i = at[7]; i < len; i++) {
        memcpy(copy, bytes, len);
        copy[i] ^= 0x08;
        al_fmt(what, sizeof what, "byte %zu of the kernel table flipped", i - at[7]);
        expect_error(copy, len, ALLOY_ERR_FORMAT, "checksum mismatch", NULL, what);
    }
    /* each field wrong, the checksum made right (the first kernel's fields after its name: module, step,
     * kind, grid, block, nparams, then its first parameter's kind, node, written, count) */
    assert_true(prog.kernels[0].nparams >= 1);
    size_t k0 = body + 8, name = le32(bytes + k0), after = k0 + 4 + name;
    static const char *const needles[] = {
        "nkernels = 0: a kernel table with no kernel", "kernel name: length 0 is 0 or too long",
        "kernel name: byte 0 is not allowed", "kernel module (in order, none empty) = 1 is outside [0, 0]",
        "kernel step (in order) = ", "its step kind is not its schedule step's", "kernel block = 0 is outside",
        "param kind = 9 is outside", "param node = ", "param written = 2 is outside",
    };
    for (int k = 0; k < 10; k++) {
        memcpy(copy, bytes, len);
        uint8_t *p = copy;
        switch (k) {
        case 0: put32(p + body, 0); break;
        case 1: put32(p + k0, 0); break;
        case 2: p[k0 + 4] = '-'; break;
        case 3: put32(p + after, 1); break;
        case 4: put32(p + after + 4, (uint32_t)nsteps); break;
        case 5: put32(p + after + 8, (le32(p + after + 8) + 1) % 5); break;
        case 6: put32(p + after + 16, 0); break;
        case 7: put32(p + after + 24, 9); break;
        case 8: put32(p + after + 28, 1u << 30); break;
        case 9: put32(p + after + 32, 2); break;
        }
        assert_true(bundle_resign(copy, len));
        al_fmt(what, sizeof what, "kernel table field %d", k);
        expect_error(copy, len, ALLOY_ERR_FORMAT, needles[k], "section cuda kernels", what);
    }
    print_message("kernel table: %d kernels, %d skipped steps, %zu bytes; %d cuts, %zu flips, 10 fields: each an error\n",
                  prog.nkernels, prog.nskipped, seclen, cuts, len - at[7]);
    test_free(copy);
    test_free(bytes);
    cg_program_free(&prog);
}

/* Saved with ALLOY_BUNDLE_WITH_STATE after eight steps, a bundle starts
 * from that state, not the seed's: eight more steps from it give the JIT
 * graph's next eight losses and its state bit for bit (a bundle saved
 * without it starts over). The section (7) cut at its boundary or inside,
 * a flipped byte, a tensor's byte changed or its header damaged (checksum
 * made right) are errors naming the section. */
static void test_a_bundle_with_its_state_starts_from_it(void **state)
{
    (void)state;
    alloy_graph *g = build_step();
    const char *path = test_tmp_path("trained.alloy"), *plain = test_tmp_path("plain.alloy");
    alloy_step_info first[STEPS], jit[STEPS], aot[STEPS], fresh[STEPS];
    train(g, run_graph, first);
    expect_ok(g, alloy_graph_save_bundle_flags(g, path, NULL, ALLOY_BUNDLE_WITH_STATE), "save_bundle with state");
    expect_ok(g, alloy_graph_save_bundle(g, plain, NULL), "save_bundle");
    assert_int_equal(alloy_graph_save_bundle_flags(g, plain, NULL, 2), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "unknown flags 0x2"));
    train(g, run_graph, jit);
    alloy_bundle *b = NULL, *p = NULL;
    char err[1024] = "";
    if (alloy_bundle_load(path, &b, err, sizeof err)) fail_msg("alloy_bundle_load: %s", err);
    if (alloy_bundle_load(plain, &p, err, sizeof err)) fail_msg("alloy_bundle_load: %s", err);
    train(b, run_bundle, aot);
    train(p, run_bundle, fresh);
    for (int k = 0; k < STEPS; k++)
        if (memcmp(&jit[k].loss, &aot[k].loss, sizeof(double)) != 0 || jit[k].step != aot[k].step ||
            jit[k].scale != aot[k].scale)
            fail_msg("step %d after the saved state: jit loss %.17g step %lld, bundle %.17g step %lld", k, jit[k].loss,
                     (long long)jit[k].step, aot[k].loss, (long long)aot[k].step);
    assert_true(memcmp(&fresh[0].loss, &first[0].loss, sizeof(double)) == 0); /* without it: the seed's start */
    assert_true(memcmp(&fresh[0].loss, &jit[0].loss, sizeof(double)) != 0);
    int n = alloy_graph_state_count(g);
    for (int i = 0; i < n; i++) {
        alloy_host_tensor want, got;
        expect_ok(g, alloy_graph_state_at(g, i, &want), "state_at");
        assert_int_equal(alloy_bundle_get_state(b, want.name, &got), ALLOY_OK);
        size_t bytes = (size_t)alloy_host_tensor_numel(&want) * alloy_dtype_size(want.dtype);
        if (memcmp(want.data, got.data, bytes) != 0) fail_msg("state '%s' differs", want.name);
    }
    alloy_bundle_free(b);
    alloy_bundle_free(p);
    alloy_graph_free(g);
    /* the section: 7, between options (6) and the end */
    size_t len;
    uint8_t *bytes = test_read_file(path, &len);
    size_t at[16];
    uint32_t tag[16];
    assert_int_equal(sections(bytes, len, at, tag), 7);
    assert_int_equal(tag[6], BUNDLE_SEC_INIT_STATE);
    size_t body = at[6] + 16, seclen = len - body;
    uint8_t *copy = test_malloc(len);
    char what[96];
    memcpy(copy, bytes, len);
    put64(copy + 32, at[6] - BUNDLE_HEADER_BYTES);
    assert_true(bundle_resign(copy, at[6]));
    expect_error(copy, at[6], ALLOY_ERR_FORMAT, "section 6 at byte", "heading runs past the end", "cut at section 7");
    int cuts = 0;
    for (size_t k = 0; k < seclen; k += 7, cuts++) {
        memcpy(copy, bytes, len);
        put64(copy + at[6] + 8, k);
        put64(copy + 32, body + k - BUNDLE_HEADER_BYTES);
        assert_true(bundle_resign(copy, body + k));
        al_fmt(what, sizeof what, "initial state cut to %zu of its %zu bytes", k, seclen);
        expect_error(copy, body + k, ALLOY_ERR_FORMAT, "section initial state at byte", NULL, what);
    }
    for (size_t i = at[6]; i < len; i += 3) {
        memcpy(copy, bytes, len);
        copy[i] ^= 0x40;
        al_fmt(what, sizeof what, "byte %zu of the initial state flipped", i - at[6]);
        expect_error(copy, len, ALLOY_ERR_FORMAT, "checksum mismatch", NULL, what);
    }
    /* the last byte of the tensor data changed: the state's own checksum names it */
    memcpy(copy, bytes, len);
    copy[len - 1] ^= 0x01;
    assert_true(bundle_resign(copy, len));
    expect_error(copy, len, ALLOY_ERR_FORMAT, "section initial state at byte", "the tensors' checksum is", "data");
    /* its JSON header damaged: the safetensors reader's message under the section's name */
    memcpy(copy, bytes, len);
    copy[body + 8] = '[';
    assert_true(bundle_resign(copy, len));
    expect_error(copy, len, ALLOY_ERR_FORMAT, "section initial state at byte", NULL, "header");
    print_message("initial state: %zu bytes; %d cuts, %zu flips: each an error\n", seclen, cuts, (len - at[6] + 2) / 3);
    test_free(copy);
    test_free(bytes);
}

/* A "cuda" backend for the GPU checks: the CPU backend's calls under the
 * name cuda, reporting fake_sm and fake_driver as its GPU. */
static int fake_sm, fake_driver;
static rt_backend_ops fake_gpu_ops;

static bool fake_caps(const rt_backend *b, int *sm, int *driver)
{
    (void)b;
    *sm = fake_sm, *driver = fake_driver;
    return true;
}

static alloy_status fake_gpu_open(const al_options *cfg, rt_backend **out, char *err, size_t errlen)
{
    alloy_status st = cpu_backend_open(cfg, out, err, errlen);
    if (st) return st;
    fake_gpu_ops = *(*out)->ops;
    fake_gpu_ops.name = "cuda";
    fake_gpu_ops.device_caps = fake_caps;
    (*out)->ops = &fake_gpu_ops;
    return ALLOY_OK;
}

/* Loading on a GPU: each module needs an image the GPU runs; a GPU too old
 * for every cubin and the PTX, or whose driver is too old for the PTX, is
 * an error naming the GPU and the bundle's targets (the GPU faked: its
 * compute capability and driver version). */
static void test_loading_on_a_gpu_no_image_runs_on_is_an_error_naming_the_targets(void **state)
{
    (void)state;
    if (!ALLOY_HAVE_CUDA) skip(); /* a build without the CUDA backend opens no GPU */
    bundle_cuda x = fake_cuda(2);
    size_t len;
    uint8_t *bytes = encode_with_cuda(&x, &len);
    const char *path = test_tmp_path("gpu.alloy");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    test_free(bytes);
    rt_backend_set_cuda_opener(fake_gpu_open);
    setenv("ALLOY_DEVICE", "cuda", 1);
    static const struct {
        int sm, driver;
        alloy_status want;
        const char *needle;
    } cases[] = {
        {86, 12000, ALLOY_OK, NULL},
        {100, 12080, ALLOY_OK, NULL},
        {75, 13000, ALLOY_ERR_UNSUPPORTED,
         "gpu.alloy: the GPU is sm_75 and the bundle has cubins sm_80, sm_90; PTX compute_80: none runs on it"},
        {100, 12000, ALLOY_ERR_UNSUPPORTED, "the PTX needs CUDA driver 12.8 or newer, this driver is 12.0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake_sm = cases[i].sm, fake_driver = cases[i].driver;
        alloy_bundle *b = NULL;
        char err[1024] = "";
        alloy_status st = alloy_bundle_load(path, &b, err, sizeof err);
        if (st != cases[i].want || (cases[i].needle && !strstr(err, cases[i].needle)))
            fail_msg("sm_%d driver %d: status %d '%s', expected %d '%s'", cases[i].sm, cases[i].driver, st, err,
                     cases[i].want, cases[i].needle ? cases[i].needle : "");
        if (!st) {
            alloy_step_info info[STEPS];
            train(b, run_bundle, info); /* the fake GPU runs the CPU's calls */
            assert_true(isfinite(info[STEPS - 1].loss));
        } else {
            assert_null(b);
        }
        alloy_bundle_free(b);
    }
    setenv("ALLOY_DEVICE", "cpu", 1);
    rt_backend_set_cuda_opener(NULL);
}

/* The kernel cache's entry files in dir, and whether each was used (its
 * mtime set) after `since` (seconds since the epoch). */
static int cache_entries(const char *dir, time_t since, int *used)
{
    DIR *d = opendir(dir);
    int n = 0;
    *used = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 7 || strcmp(e->d_name + len - 7, ".kernel") != 0) continue;
        char p[512];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        assert_int_equal(stat(p, &sb), 0);
        n++;
        *used += sb.st_mtime >= since;
    }
    if (d) closedir(d);
    return n;
}

/* Every entry file in dir made last modified in 2001. */
static void age_entries(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strstr(e->d_name, ".kernel")) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct timespec t[2] = {{1000000000, 0}, {1000000000, 0}};
        assert_int_equal(utimensat(AT_FDCWD, p, t, 0), 0);
    }
    if (d) closedir(d);
}

/* With archs, the bundle holds per module a cubin for sm_80 and sm_90 and
 * PTX for compute_80 that NVRTC compiled (no GPU here), with NVRTC's
 * version as the driver the PTX needs; the CPU still trains from it. The
 * compiles go through the kernel cache: a second save of the same step
 * takes every image from it (each entry is touched, none added) and writes
 * the same bytes. Before, bundle saves never used the cache. */
static void test_save_bundle_with_archs_compiles_a_cubin_per_arch_and_ptx_with_nvrtc(void **state)
{
    (void)state;
    alloy_graph *g = build_step();
    const char *path = test_tmp_path("cuda.alloy");
    char cache[256], again[256];
    snprintf(cache, sizeof cache, "%s", test_tmp_path("cache"));
    snprintf(again, sizeof again, "%s", test_tmp_path("again.alloy"));
    expect_ok(g, alloy_graph_set_option(g, "cache_dir", cache), "set_option cache_dir");
    double t0 = test_now_ms();
    alloy_status st = alloy_graph_save_bundle(g, path, "sm_90, sm_80");
    if (st == ALLOY_ERR_UNSUPPORTED && strstr(alloy_last_error(g), "need NVRTC")) {
        alloy_graph_free(g);
        skip(); /* no NVRTC on this machine */
    }
    expect_ok(g, st, "save_bundle with archs");
    double t1 = test_now_ms();
    int used, entries = cache_entries(cache, 0, &used);
    assert_true(entries >= 3);
    age_entries(cache);
    time_t before = time(NULL);
    expect_ok(g, alloy_graph_save_bundle(g, again, "sm_90, sm_80"), "save_bundle again");
    double t2 = test_now_ms();
    assert_int_equal(cache_entries(cache, before, &used), entries);
    assert_int_equal(used, entries);
    print_message("save_bundle sm_90,sm_80: %.0f ms compiling %d images, %.0f ms from the cache\n", t1 - t0, entries,
                  t2 - t1);
    size_t n1, n2;
    unsigned char *b1 = test_read_file(path, &n1), *b2 = test_read_file(again, &n2);
    assert_true(n1 == n2 && memcmp(b1, b2, n1) == 0);
    test_free(b1), test_free(b2);
    test_remove_dir(cache);
    alloy_graph_free(g);
    bundle_contents c;
    char err[1024] = "";
    if (bundle_read_file(path, &c, err, sizeof err)) fail_msg("%s", err);
    const bundle_cuda *x = &c.cuda;
    assert_true(x->nmodules >= 1);
    assert_int_equal(x->nimages, 3 * (int)x->nmodules);
    assert_true(x->min_driver >= 11020 && x->min_driver % 10 == 0);
    for (int i = 0; i < x->nimages; i++) {
        const bundle_image *im = &x->images[i];
        assert_int_equal(im->module, (uint32_t)(i / 3));
        /* NVRTC 11.2 and newer build cubins for sm_80 and sm_90 */
        uint32_t want_kind = i % 3 == 2 ? BUNDLE_PTX : BUNDLE_CUBIN, want_arch = i % 3 == 0 ? 90 : 80;
        assert_int_equal(im->kind, want_kind);
        assert_int_equal(im->arch, want_arch);
        if (im->kind == BUNDLE_PTX) assert_non_null(strstr((const char *)im->data, ".target sm_80"));
    }
    char targets[256];
    bundle_cuda_targets(x, targets, sizeof targets);
    assert_string_equal(targets, "cubins sm_90, sm_80; PTX compute_80");
    const bundle_image *im;
    assert_int_equal(bundle_cuda_pick(x, 0, 86, (int)x->min_driver, &im, err, sizeof err), ALLOY_OK);
    assert_true(im->kind == BUNDLE_CUBIN && im->arch == 80);
    bundle_contents_free(&c);
    alloy_bundle *b;
    if (alloy_bundle_load(path, &b, err, sizeof err)) fail_msg("%s", err);
    alloy_step_info info[STEPS];
    train(b, run_bundle, info);
    assert_true(isfinite(info[STEPS - 1].loss));
    alloy_bundle_free(b);
}

/* A bundle with CUDA images is compiled with the GPU's choices under device=auto on a machine without a
 * GPU (char_gpt's block: its written-out attention becomes the attention op), and that compile is dropped
 * after (test_export checks that), so that the graph's own run compiles for its device; without images,
 * the CPU's plan. */
static void test_a_bundle_with_cuda_images_under_device_auto_has_the_gpu_plan(void **state)
{
    (void)state;
    char ir[512], err[1024] = "";
    snprintf(ir, sizeof ir, "%s/char_gpt_block.ir", ALLOY_EXAMPLES_IR);
    for (int images = 1; images >= 0; images--) {
        alloy_graph *g = alloy_graph_load_ir(ir, err, sizeof err);
        if (!g) fail_msg("%s", err);
        expect_ok(g, alloy_graph_set_option(g, "device", "auto"), "set_option device"); /* over ALLOY_DEVICE */
        expect_ok(g, alloy_graph_set_option(g, "cache_dir", test_tmp_path("cache")), "set_option cache_dir");
        const char *path = test_tmp_path("block.alloy");
        alloy_status st = alloy_graph_save_bundle(g, path, images ? "sm_80" : NULL);
        if (st == ALLOY_ERR_UNSUPPORTED && strstr(alloy_last_error(g), "need NVRTC")) {
            alloy_graph_free(g);
            skip(); /* no NVRTC on this machine */
        }
        expect_ok(g, st, "save_bundle");
        alloy_graph_free(g);
        bundle_contents c;
        if (bundle_read_file(path, &c, err, sizeof err)) fail_msg("%s", err);
        int attention = 0;
        for (int i = 0; i < c.ir->nnodes; i++) attention += c.ir->nodes[i]->op == IR_OP_attention;
        assert_int_equal(attention, images ? 1 : 0);
        bundle_contents_free(&c);
    }
    test_remove_dir(test_tmp_path("cache"));
}

/* alloyc compile -o FILE.alloy writes the bundle alloy_graph_save_bundle
 * would: the example MLP's f16 AdamW training step trains from it as the
 * JIT graph of the same IR and settings does, bit for bit. */
static void test_alloyc_compile_writes_a_bundle_that_trains_as_the_jit_graph(void **state)
{
    (void)state;
    const char *ir = ALLOY_EXAMPLES_IR "/mlp_classifier.ir";
    const char *path = test_tmp_path("cli.alloy");
    char cmd[2048];
    al_fmt(cmd, sizeof cmd,
           "'%s' compile '%s' --train --amp=f16 --scaler=dynamic --optimizer=adamw --seed 7 -o '%s' >/dev/null",
           ALLOY_ALLOYC, ir, path);
    assert_int_equal(system(cmd), 0);
    al_fmt(cmd, sizeof cmd, "'%s' compile '%s' --train --emit=bundle --arch sm_8x -o '%s' 2>/dev/null", ALLOY_ALLOYC,
           ir, test_tmp_path("arch.alloy"));
    int rc = system(cmd);
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 2); /* a bad --arch is a usage error, with a bundle too */
    char err[1024] = "";
    alloy_graph *g = alloy_graph_load_ir(ir, err, sizeof err);
    if (!g) fail_msg("%s", err);
    alloy_graph_set_seed(g, 7);
    alloy_graph_enable_amp(g, ALLOY_F16);
    alloy_graph_set_training(g, true);
    alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler());
    alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01));
    alloy_bundle *b;
    if (alloy_bundle_load(path, &b, err, sizeof err)) fail_msg("%s", err);
    static float x[64 * 8];
    static int32_t labels[64];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 64 * 8; i++) x[i] = (float)((i * 13 + k * 7) % 17 - 8) / 8.0f;
        for (int i = 0; i < 64; i++) labels[i] = (i * 5 + k) % 3;
        alloy_host_tensor feeds[2] = {{"x", F32, 2, {64, 8}, x}, {"labels", I32, 1, {64}, labels}};
        alloy_host_tensor fj = {.name = "loss"}, fb = {.name = "loss"};
        expect_ok(g, alloy_graph_run(g, feeds, 2, &fj, 1), "jit run");
        if (alloy_bundle_run(b, feeds, 2, &fb, 1)) fail_msg("bundle run: %s", alloy_bundle_last_error(b));
        float lj, lb;
        memcpy(&lj, fj.data, 4), memcpy(&lb, fb.data, 4);
        if (memcmp(&lj, &lb, 4) != 0 || !isfinite(lj)) fail_msg("step %d: jit loss %.9g, bundle loss %.9g", k, lj, lb);
    }
    alloy_host_tensor wj, wb;
    expect_ok(g, alloy_graph_get_state(g, "w1", &wj), "w1");
    assert_int_equal(alloy_bundle_get_state(b, "w1", &wb), ALLOY_OK);
    assert_memory_equal(wj.data, wb.data, 8 * 256 * sizeof(float));
    alloy_bundle_free(b);
    alloy_graph_free(g);
}

/* Allocation number test_fail_at fails, for each allocation of saving a
 * bundle, loading it and one step in turn: every attempt returns OK or
 * ALLOY_ERR_OOM with a message and frees all it allocated (cmocka's
 * allocator checks), the last one OK; the bundle already at the path
 * stays whole (or is replaced whole) and no temporary file is left. */
static void test_every_allocation_failure_in_save_load_and_run_is_a_clean_error(void **state)
{
    (void)state;
    const char *path = test_tmp_path("oom.alloy");
    float x[BATCH * IN];
    int32_t t[BATCH];
    batch(0, x, t);
    alloy_host_tensor feeds[2] = {{"x", F32, 2, {BATCH, IN}, x}, {"targets", I32, 1, {BATCH}, t}};
    int failures = 0;
    alloy_graph *first = build_step(); /* a good bundle at path: a failed save must leave it whole */
    expect_ok(first, alloy_graph_save_bundle(first, path, NULL), "save_bundle");
    alloy_graph_free(first);
    for (test_fail_at = 0;; test_fail_at++) {
        alloy_graph *g = build_step(); /* built before failures start */
        alloy_set_allocator(test_failing_realloc, NULL);
        test_alloc_count = 0;
        char err[1024] = "";
        alloy_status st = alloy_graph_save_bundle(g, path, NULL);
        if (st) al_fmt(err, sizeof err, "%s", alloy_last_error(g));
        alloy_bundle *b = NULL;
        if (!st) st = alloy_bundle_load(path, &b, err, sizeof err);
        if (!st && (st = alloy_bundle_run(b, feeds, 2, NULL, 0))) al_fmt(err, sizeof err, "%s", alloy_bundle_last_error(b));
        bool failed = test_alloc_count > test_fail_at;
        alloy_bundle_free(b);
        alloy_graph_free(g);
        alloy_set_allocator(test_cmocka_realloc, NULL);
        bundle_contents c; /* the file: the old bundle or the new one, whole either way */
        char rerr[1024];
        if (bundle_read_file(path, &c, rerr, sizeof rerr)) fail_msg("allocation %ld failed: the file: %s", test_fail_at, rerr);
        bundle_contents_free(&c);
        if (!failed) {
            assert_int_equal(st, ALLOY_OK);
            break;
        }
        failures++;
        if (st != ALLOY_ERR_OOM || !strstr(err, "out of memory"))
            fail_msg("allocation %ld failed: %s, '%s' instead of OOM", test_fail_at, alloy_status_name(st), err);
    }
    test_fail_at = -1;
    print_message("failed each of %d allocations in turn\n", failures);
    assert_true(failures > 50);
    /* no temporary file left next to it */
    char cmd[512];
    al_fmt(cmd, sizeof cmd, "ls '%s' | grep -q 'oom.alloy.tmp'", test_tmpdir);
    assert_int_not_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, test_tmpdir_setup, test_tmpdir_teardown)
        T(test_training_from_a_bundle_gives_the_jit_graphs_losses_and_state_bit_for_bit),
        T(test_a_cnn_bundle_with_conv_gemm_groups_trains_as_the_jit_graph),
        T(test_a_bundles_runs_fetch_the_gradients_the_jit_graphs_fetch_bit_for_bit),
        T(test_the_bundles_ir_parses_back_to_the_same_schedule_and_plan),
        T(test_a_bundles_padded_rows_come_back_as_built),
        T(test_truncated_bundles_are_errors_at_every_header_byte_and_section_boundary),
        T(test_a_flipped_byte_in_any_section_is_a_checksum_mismatch),
        T(test_wrong_magic_newer_version_and_bad_lengths_are_named),
        T(test_inconsistent_sections_are_errors_naming_the_section),
        T(test_a_view_off_its_owners_slot_is_an_error_naming_the_plan),
        T(test_slice_views_and_gathered_pieces_round_trip_and_a_moved_piece_is_named),
        T(test_save_bundle_refuses_bad_archs_a_missing_nvrtc_and_null_arguments),
        T(test_the_cuda_pick_takes_the_cubin_of_the_gpus_major_else_the_ptx),
        T(test_the_cuda_section_round_trips_and_each_damage_is_named),
        T(test_the_kernel_table_round_trips_and_each_damage_is_named),
        T(test_a_bundle_with_its_state_starts_from_it),
        T(test_save_bundle_with_archs_compiles_a_cubin_per_arch_and_ptx_with_nvrtc),
        T(test_a_bundle_with_cuda_images_under_device_auto_has_the_gpu_plan),
        T(test_loading_on_a_gpu_no_image_runs_on_is_an_error_naming_the_targets),
        T(test_alloyc_compile_writes_a_bundle_that_trains_as_the_jit_graph),
        T(test_every_allocation_failure_in_save_load_and_run_is_a_clean_error),
#undef T
    };
    return cmocka_run_group_tests_name("aot", tests, NULL, NULL);
}
