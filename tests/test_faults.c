/* test_faults.c - allocation failures injected at every point of the whole pipeline: build a training graph, compile, two steps, save and load a checkpoint. */
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
#include "models.h"
#include "support.h"

/* ---- an allocator that fails one allocation and counts live blocks ----
 * Through the C library, not cmocka (thousands of runs of the pipeline):
 * `live` says after each run whether alloy freed all it allocated; the
 * sanitizer build's leak checker watches the rest. */
static struct {
    long count;   /* allocations asked for so far */
    long fail_at; /* the one that fails; -1: none */
    long live;    /* blocks allocated and not freed */
} hook = {0, -1, 0};

static void *failing_realloc(void *p, size_t size, void *user)
{
    (void)user;
    if (size == 0) {
        if (p) hook.live--;
        free(p);
        return NULL;
    }
    if (hook.count++ == hook.fail_at) return NULL;
    void *q = realloc(p, size);
    if (q && !p) hook.live++;
    return q;
}

/* ---- the pipeline, stage by stage ----
 *
 * A two-layer MLP (4 x 3 -> 8 -> 3) with f16 AMP, a dynamic loss scaler
 * and AdamW: every pass of a training compile runs (AMP, autodiff, loss
 * scaling, optimizer, simplification, fusion, schedule, plan). */
enum stage { BUILD, COMPILE, STEP1, STEP2, SAVE, LOAD, DONE };
static const char *const stage_names[] = {"build", "compile", "step 1", "step 2", "save", "load", "done"};
enum { BATCH = 4, IN = 3, HIDDEN = 8, OUT = 3 };

typedef struct pipeline {
    alloy_graph *g;
    enum stage next; /* the first stage not done */
    const char *path;
    double loss[2];
} pipeline;

static alloy_status build(pipeline *p)
{
    alloy_graph *g = p->g = alloy_graph_new("faults");
    if (!g) return ALLOY_ERR_OOM;
    alloy_graph_set_seed(g, 21);
    test_mlp m = build_mlp(g, F32, BATCH, IN, HIDDEN, OUT);
    /* a builder call that fails poisons the graph; the status says so */
    alloy_graph_set_loss(g, m.loss);
    alloy_graph_enable_amp(g, ALLOY_F16);
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    sc.growth_interval = 1; /* the scale changes on each step */
    alloy_graph_set_grad_scaler(g, sc);
    alloy_graph_add_optimizer(g, alloy_adamw(0.01, 0.9, 0.999, 1e-8, 0.01));
    return alloy_graph_status(g);
}

static alloy_status run_stage(pipeline *p, enum stage s)
{
    static const float x[BATCH * IN] = {0.5f, -1, 2, 0.25f, 1, -0.5f, -2, 0.75f, 1.5f, 0, -0.25f, 1};
    static const int32_t targets[BATCH] = {0, 2, 1, 2};
    alloy_host_tensor feeds[2] = {{"x", F32, 2, {BATCH, IN}, (void *)(uintptr_t)x},
                                  {"targets", I32, 1, {BATCH}, (void *)(uintptr_t)targets}};
    alloy_memory_info mi;
    alloy_step_info info;
    alloy_status st;
    switch (s) {
    case BUILD: return build(p);
    case COMPILE: return alloy_graph_memory_info(p->g, &mi);
    case STEP1:
    case STEP2:
        if ((st = alloy_graph_run(p->g, feeds, 2, NULL, 0))) return st;
        if ((st = alloy_graph_step_info(p->g, &info))) return st;
        p->loss[s - STEP1] = info.loss;
        return ALLOY_OK;
    case SAVE: return alloy_graph_save_checkpoint(p->g, p->path);
    case LOAD: return alloy_graph_load_checkpoint(p->g, p->path);
    case DONE: break;
    }
    return ALLOY_OK;
}

/* Runs the stages from p->next on until one fails (its status) or all are done. */
static alloy_status advance(pipeline *p)
{
    for (; p->next < DONE; p->next++) {
        alloy_status st = run_stage(p, p->next);
        if (st) return st;
    }
    return ALLOY_OK;
}

/* Whether every state tensor of g has the bytes of s (and g no others). */
static bool state_equals(alloy_graph *g, const snapshot *s, char *why, size_t len)
{
    if (alloy_graph_state_count(g) != s->n) {
        snprintf(why, len, "%d state tensors, %d expected", alloy_graph_state_count(g), s->n);
        return false;
    }
    for (int i = 0; i < s->n; i++) {
        alloy_host_tensor t;
        if (alloy_graph_get_state(g, s->names[i], &t) ||
            (size_t)alloy_host_tensor_numel(&t) * alloy_dtype_size(t.dtype) != s->bytes[i] ||
            memcmp(t.data, s->data[i], s->bytes[i]) != 0) {
            snprintf(why, len, "state '%s' differs", s->names[i]);
            return false;
        }
    }
    return true;
}

/* Fails allocation N for N = 0, 1, ... until the pipeline runs through.
 * Each failure must come back as ALLOY_ERR_OOM with a message saying "out
 * of memory" (never a crash, never another status, never ignored); then,
 * allocating again, the same graph must finish the pipeline from the stage
 * that failed with the losses and the final state of an undisturbed run,
 * bit for bit (a graph whose build failed is poisoned by design: it must
 * only free cleanly); and freeing it must free every block. */
static void test_every_allocation_failure_in_build_compile_train_save_and_load_is_an_error_and_recoverable(void **state)
{
    (void)state;
    char path[200];
    snprintf(path, sizeof path, "%s", test_tmp_path("faults.safetensors"));
    alloy_set_allocator(failing_realloc, NULL);

    /* the undisturbed run: the reference */
    hook.count = hook.live = 0, hook.fail_at = -1;
    pipeline ref = {.path = path};
    if (advance(&ref)) fail_msg("undisturbed run: %s failed: %s", stage_names[ref.next], alloy_last_error(ref.g));
    long total = hook.count;
    snapshot want = take_snapshot(ref.g); /* through the counting hook too; freed below */
    assert_true(isfinite(ref.loss[0]) && isfinite(ref.loss[1]));

    long per_stage[DONE] = {0}, recovered = 0;
    double start = test_now_ms();
    long n;
    for (n = 0;; n++) {
        long live_before = hook.live;
        hook.count = 0, hook.fail_at = n;
        pipeline p = {.path = path};
        alloy_status st = advance(&p);
        if (hook.count <= n) { /* allocation n was never asked for: the run is complete */
            if (st) test_case_failed("allocation %ld: none failed, yet %s failed: %s", n, stage_names[p.next],
                                     p.g ? alloy_last_error(p.g) : "(no graph)");
            alloy_graph_free(p.g);
            break;
        }
        per_stage[p.next < DONE ? p.next : DONE - 1]++;
        if (st != ALLOY_ERR_OOM || (p.g && !*alloy_last_error(p.g)))
            test_case_failed("allocation %ld failing in %s: %s \"%s\", expected out of memory with a message", n,
                             p.next < DONE ? stage_names[p.next] : "no stage", alloy_status_name(st),
                             p.g ? alloy_last_error(p.g) : "(no graph)");
        else if (p.g && !strstr(alloy_last_error(p.g), "out of memory"))
            test_case_failed("allocation %ld failing in %s: the message \"%s\" does not say out of memory", n,
                             stage_names[p.next], alloy_last_error(p.g));
        hook.fail_at = -1;
        if (p.g && p.next > BUILD && st) { /* the same graph goes on from the stage that failed */
            enum stage failed = p.next;
            char why[200] = "";
            if ((st = advance(&p)))
                test_case_failed("allocation %ld failed in %s; going on, %s failed: %s", n, stage_names[failed],
                                 stage_names[p.next], alloy_last_error(p.g));
            else if (memcmp(p.loss, ref.loss, sizeof p.loss) != 0)
                test_case_failed("allocation %ld failed in %s; the losses after going on are %.9g %.9g, "
                                 "undisturbed %.9g %.9g", n, stage_names[failed], p.loss[0], p.loss[1], ref.loss[0],
                                 ref.loss[1]);
            else if (!state_equals(p.g, &want, why, sizeof why))
                test_case_failed("allocation %ld failed in %s; after going on, %s", n, stage_names[failed], why);
            else
                recovered++;
        }
        alloy_graph_free(p.g);
        if (hook.live != live_before)
            test_case_failed("allocation %ld failing in %s: %ld block(s) leaked", n, stage_names[p.next],
                             hook.live - live_before);
    }
    double ms = test_now_ms() - start;
    print_message("%ld allocations in the undisturbed run; each failed in turn (build %ld, compile %ld, step 1 %ld, "
                  "step 2 %ld, save %ld, load %ld); %ld graphs went on to the undisturbed result; %.0f ms\n",
                  total, per_stage[BUILD], per_stage[COMPILE], per_stage[STEP1], per_stage[STEP2], per_stage[SAVE],
                  per_stage[LOAD], recovered, ms);
    assert_int_equal(n, total);
    free_snapshot(&want);
    alloy_graph_free(ref.g);
    alloy_set_allocator(NULL, NULL);
    if (hook.live != 0) test_case_failed("%ld block(s) still allocated at the end", hook.live);
    test_end_cases();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            test_every_allocation_failure_in_build_compile_train_save_and_load_is_an_error_and_recoverable,
            test_tmpdir_setup, test_tmpdir_teardown),
    };
    return cmocka_run_group_tests_name("faults", tests, NULL, NULL);
}
