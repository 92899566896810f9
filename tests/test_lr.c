/* test_lr.c - the learning rate at run time: every schedule against PyTorch's sequences and hand computations, alloy_graph_set_lr without a recompile, skipped steps that do not move a schedule, and parameter groups (lr scale, weight decay off) against an f64 reference. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "passes/pass.h"
#include "runtime/graph/graph_impl.h"
#include "models.h"
#include "support.h"

/* The learning rate is computed in f64 (docs/training.md), as PyTorch
 * computes it in Python floats: the two agree to a few roundings. */
#define REL 1e-12

/* ---- the graph: models.c's build_quad (loss = sum(x p) + 0.5 sum(p^2) over
 * p = w f64[2,3] and b f64[3]), seed 3 ---- */
enum { NP = QUAD_NP, NW = QUAD_NW };

static alloy_graph *quad_graph(const alloy_optimizer *o, const alloy_grad_scaler *sc)
{
    alloy_graph *g = build_quad(3, o, sc);
    assert_non_null(g);
    return g;
}

static void read_params(alloy_graph *g, const char *suffix, double *v)
{
    expect_ok(g, read_quad(g, suffix, v), suffix);
}

static double state_f64(alloy_graph *g, const char *name)
{
    alloy_host_tensor t;
    expect_ok(g, alloy_graph_get_state(g, name, &t), name);
    assert_int_equal(t.rank, 0);
    return t.dtype == F64 ? *(const double *)t.data : *(const int32_t *)t.data;
}

/* One step fed x; returns step.lr as fetched. */
static double run_x(alloy_graph *g, double *x)
{
    alloy_host_tensor feeds[2] = {{"xw", F64, 2, {2, 3}, x}, {"xb", F64, 1, {3}, x + NW}};
    alloy_host_tensor fetch = {.name = "step.lr"};
    expect_ok(g, alloy_graph_run(g, feeds, 2, &fetch, 1), "run");
    assert_int_equal(fetch.dtype, F64);
    return *(const double *)fetch.data;
}

static void random_x(double *x)
{
    for (int i = 0; i < NP; i++) x[i] = test_uniform(-1, 1);
}

static bool close_rel(double got, double want, double rel) { return fabs(got - want) <= rel * fmax(fabs(want), 1e-300); }

static void expect_close_all(const double *got, const double *want, int n, double rel, const char *what)
{
    for (int i = 0; i < n; i++)
        if (!close_rel(got[i], want[i], rel))
            fail_msg("%s: element %d is %.17g, expected %.17g", what, i, got[i], want[i]);
}

/* Runs SGD (no momentum or decay) with schedule o for n steps: each step's
 * step.lr must be want[t], and the parameters must move by exactly that lr
 * times the gradient x + p. */
static void check_lr_sequence(const alloy_optimizer *o, const double *want, int n, const char *name)
{
    alloy_graph *g = quad_graph(o, NULL);
    for (int t = 0; t < n; t++) {
        double x[NP], before[NP], after[NP], moved[NP];
        random_x(x);
        read_params(g, "", before);
        double lr = run_x(g, x);
        if (!close_rel(lr, want[t], REL)) fail_msg("%s: lr of update %d is %.17g, expected %.17g", name, t, lr, want[t]);
        alloy_step_info info;
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        assert_true(info.lr == lr);
        read_params(g, "", after);
        for (int i = 0; i < NP; i++) moved[i] = before[i] - want[t] * (x[i] + before[i]);
        expect_close_all(after, moved, NP, REL, name);
    }
    alloy_graph_free(g);
}

/* ---- schedules ---- */

/* StepLR(step_size 3, gamma 0.5), MultiStepLR([2, 5], 0.1) and
 * OneCycleLR(max_lr 0.5, total_steps 10; and total_steps 7, pct_start
 * 0.45, div_factor 10, final_div_factor 100), cycle_momentum off, each over
 * SGD(lr 0.5): optimizer.param_groups[0]["lr"] before each step, printed by
 * PyTorch 2.x (torch.optim.lr_scheduler). */
static const double TORCH_STEP[8] = {0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125, 0.125};
static const double TORCH_MULTI[8] = {0.5, 0.5, 0.05, 0.05, 0.05, 0.005000000000000001, 0.005000000000000001,
                                      0.005000000000000001};
static const double TORCH_CYCLE[10] = {0.020000000000000018, 0.26, 0.5, 0.47524231600673683, 0.40587282697488153,
                                       0.30563101096814466, 0.19437098903185537, 0.09412917302511849,
                                       0.024759683993263143, 2e-06};
static const double TORCH_CYCLE2[7] = {0.04999999999999999, 0.2503914781149782, 0.4946170724500836,
                                       0.4422953937035057, 0.26552512479025525, 0.07913585668678093, 0.0005};

static void test_step_multi_step_and_one_cycle_schedules_give_pytorchs_lr_sequences(void **state)
{
    (void)state;
    alloy_optimizer step = alloy_sgd(0.5, 0, 0, false);
    step.schedule = ALLOY_LR_STEP, step.step_size = 3, step.gamma = 0.5;
    check_lr_sequence(&step, TORCH_STEP, 8, "step");
    alloy_optimizer multi = alloy_sgd(0.5, 0, 0, false);
    multi.schedule = ALLOY_LR_MULTI_STEP, multi.milestones[0] = 2, multi.milestones[1] = 5, multi.nmilestones = 2;
    check_lr_sequence(&multi, TORCH_MULTI, 8, "multi-step (gamma 0: PyTorch's 0.1)");
    /* one-cycle with PyTorch's defaults (pct_start 0.3, div 25, final div
     * 1e4 given as 0), then past total_steps: PyTorch raises there, alloy
     * holds the final rate lr / 25 / 1e4 */
    alloy_optimizer cycle = alloy_sgd(0.5, 0, 0, false);
    cycle.schedule = ALLOY_LR_ONE_CYCLE, cycle.total_steps = 10;
    double cycle_after[12];
    memcpy(cycle_after, TORCH_CYCLE, sizeof TORCH_CYCLE);
    cycle_after[10] = cycle_after[11] = 0.5 / 25 / 1e4;
    check_lr_sequence(&cycle, cycle_after, 12, "one-cycle");
    alloy_optimizer cycle2 = alloy_sgd(0.5, 0, 0, false);
    cycle2.schedule = ALLOY_LR_ONE_CYCLE, cycle2.total_steps = 7, cycle2.pct_start = 0.45, cycle2.div_factor = 10;
    cycle2.final_div_factor = 100;
    check_lr_sequence(&cycle2, TORCH_CYCLE2, 7, "one-cycle (pct_start 0.45, div 10, final div 100)");
}

/* Warmup then linear decay, by hand: lr 0.5, warmup 2, total 6, min_lr 0.1:
 * t = 0, 1: 0.5 (t+1)/2; then 0.5 - 0.4 (t-2)/4 down to 0.1 at t = 6, and
 * 0.1 after. Warmup then constant and warmup then cosine keep their
 * formulas (the cosine at its midpoint t = 4 is (0.5 + 0.1) / 2). */
static void test_warmup_then_linear_decay_and_the_older_schedules_follow_hand_computed_sequences(void **state)
{
    (void)state;
    alloy_optimizer lin = alloy_sgd(0.5, 0, 0, false);
    lin.schedule = ALLOY_LR_WARMUP_LINEAR_DECAY, lin.warmup_steps = 2, lin.total_steps = 6, lin.min_lr = 0.1;
    check_lr_sequence(&lin, (const double[]){0.25, 0.5, 0.5, 0.4, 0.3, 0.2, 0.1, 0.1}, 8, "warmup + linear decay");
    alloy_optimizer lin0 = lin;
    lin0.warmup_steps = 0, lin0.total_steps = 4, lin0.min_lr = 0;
    check_lr_sequence(&lin0, (const double[]){0.5, 0.375, 0.25, 0.125, 0, 0}, 6, "linear decay to 0");
    alloy_optimizer warm = alloy_sgd(0.5, 0, 0, false);
    warm.schedule = ALLOY_LR_WARMUP_LINEAR, warm.warmup_steps = 4;
    check_lr_sequence(&warm, (const double[]){0.125, 0.25, 0.375, 0.5, 0.5}, 5, "warmup then constant");
    alloy_optimizer cosine = alloy_sgd(0.5, 0, 0, false);
    cosine.schedule = ALLOY_LR_WARMUP_COSINE, cosine.warmup_steps = 2, cosine.total_steps = 6, cosine.min_lr = 0.1;
    check_lr_sequence(&cosine,
                      (const double[]){0.25, 0.5, 0.5, 0.1 + 0.4 * (1 + cos(M_PI / 4)) / 2, 0.3,
                                       0.1 + 0.4 * (1 + cos(3 * M_PI / 4)) / 2, 0.1, 0.1},
                      8, "warmup + cosine");
    alloy_optimizer constant = alloy_sgd(0.5, 0, 0, false);
    check_lr_sequence(&constant, (const double[]){0.5, 0.5, 0.5}, 3, "constant");
}

/* Under a loss scaler, runs whose gradients hold inf or NaN are skipped:
 * the schedule reads the applied-update counter, so it does not move. */
static void test_a_skipped_step_does_not_advance_step_multi_step_or_one_cycle_schedules(void **state)
{
    (void)state;
    alloy_optimizer step = alloy_adamw(0.5, 0.9, 0.999, 1e-8, 0);
    step.schedule = ALLOY_LR_STEP, step.step_size = 3, step.gamma = 0.5;
    alloy_optimizer multi = alloy_sgd(0.5, 0.9, 0, false);
    multi.schedule = ALLOY_LR_MULTI_STEP, multi.milestones[0] = 2, multi.milestones[1] = 5, multi.nmilestones = 2;
    alloy_optimizer cycle = alloy_adam(0.5, 0.9, 0.999, 1e-8, 0);
    cycle.schedule = ALLOY_LR_ONE_CYCLE, cycle.total_steps = 10;
    const alloy_optimizer *opts[3] = {&step, &multi, &cycle};
    const double *seq[3] = {TORCH_STEP, TORCH_MULTI, TORCH_CYCLE};
    const char pattern[] = "FFIFNNFFF"; /* F finite, I inf, N NaN: 6 applied updates */
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    for (int k = 0; k < 3; k++) {
        alloy_graph *g = quad_graph(opts[k], &sc);
        int done = 0;
        for (int i = 0; pattern[i]; i++) {
            double x[NP];
            random_x(x);
            if (pattern[i] == 'I') x[1] = INFINITY;
            if (pattern[i] == 'N') x[7] = NAN;
            double lr = run_x(g, x);
            alloy_step_info info;
            expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
            if (!close_rel(lr, seq[k][done], REL) || info.skipped != (pattern[i] != 'F'))
                fail_msg("schedule %d, run %d ('%c'): lr %.17g, skipped %d; expected lr %.17g (after %d updates)", k,
                         i, pattern[i], lr, info.skipped, seq[k][done], done);
            done += pattern[i] == 'F';
            assert_int_equal(info.step, done);
            assert_true(state_f64(g, "optim.step") == done);
        }
        alloy_graph_free(g);
    }
}

/* ---- alloy_graph_set_lr ---- */

/* The lr is state the compiled step reads: set_lr changes the next step's
 * rate, and the compiled graph and its executable stay the same objects
 * (no compile). Under a schedule set_lr sets the base the schedule scales. */
static void test_set_lr_takes_effect_at_the_next_step_without_recompiling(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        alloy_optimizer o = alloy_sgd(0.5, 0, 0, false);
        if (k) o.schedule = ALLOY_LR_STEP, o.step_size = 1, o.gamma = 0.5; /* 0.5 * 0.5^t */
        alloy_graph *g = quad_graph(&o, NULL);
        double x[NP], before[NP], after[NP], moved[NP];
        random_x(x);
        assert_true(run_x(g, x) == 0.5);
        assert_true(run_x(g, x) == (k ? 0.25 : 0.5));
        const void *compiled = g->compiled, *exec = g->exec;
        assert_non_null(compiled);
        assert_non_null(exec);
        expect_ok(g, alloy_graph_set_lr(g, 0.125), "set_lr");
        assert_true(state_f64(g, "optim.lr") == 0.125);
        double want = k ? 0.125 * 0.25 : 0.125; /* the third update: t = 2 */
        read_params(g, "", before);
        double lr = run_x(g, x);
        if (lr != want) fail_msg("schedule %d: lr after set_lr is %.17g, expected %.17g", k, lr, want);
        read_params(g, "", after);
        for (int i = 0; i < NP; i++) moved[i] = before[i] - want * (x[i] + before[i]);
        expect_close_all(after, moved, NP, REL, "the step after set_lr");
        assert_ptr_equal(g->compiled, compiled);
        assert_ptr_equal(g->exec, exec);
        alloy_graph_free(g);
    }
}

/* set_lr before the first compile, between a compile without state
 * (memory_info) and the first run, and a second add_optimizer after steps:
 * each next step runs with the rate set last. */
static void test_set_lr_before_the_first_run_and_a_second_add_optimizer_set_the_next_steps_rate(void **state)
{
    (void)state;
    alloy_optimizer o = alloy_sgd(0.5, 0, 0, false);
    double x[NP];
    random_x(x);
    alloy_graph *g = quad_graph(&o, NULL);
    expect_ok(g, alloy_graph_set_lr(g, 0.375), "set_lr before any compile");
    assert_true(run_x(g, x) == 0.375);
    alloy_graph_free(g);
    g = quad_graph(&o, NULL);
    alloy_memory_info mi;
    expect_ok(g, alloy_graph_memory_info(g, &mi), "memory_info"); /* compiled, no state yet */
    expect_ok(g, alloy_graph_set_lr(g, 0.0625), "set_lr after a compile");
    assert_true(run_x(g, x) == 0.0625);
    o.lr = 0.25;
    expect_ok(g, alloy_graph_add_optimizer(g, o), "add_optimizer again");
    assert_true(run_x(g, x) == 0.25);
    assert_true(state_f64(g, "optim.step") == 2); /* the run went on */
    alloy_graph_free(g);
}

/* Refused: a NULL graph, a NaN, infinite or negative rate, a graph without
 * an optimizer; each names the call and the value, and the rate, the
 * compiled step and the next update stay as they were. optim.lr is
 * checked as set_lr checks it when set_state or a checkpoint brings it. */
static void test_set_lr_refuses_bad_rates_and_graphs_without_an_optimizer_and_changes_nothing(void **state)
{
    (void)state;
    assert_int_equal(alloy_graph_set_lr(NULL, 0.1), ALLOY_ERR_INVALID);
    alloy_optimizer o = alloy_sgd(0.5, 0, 0, false);
    alloy_graph *g = quad_graph(&o, NULL);
    double x[NP];
    random_x(x);
    run_x(g, x);
    const void *compiled = g->compiled;
    const double bad[] = {NAN, INFINITY, -INFINITY, -0.5};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(alloy_graph_set_lr(g, bad[i]), ALLOY_ERR_INVALID);
        assert_non_null(strstr(alloy_last_error(g), "set_lr: lr is "));
        assert_non_null(strstr(alloy_last_error(g), "must be finite and >= 0"));
    }
    double minus = -1;
    assert_int_equal(alloy_graph_set_state(g, &(alloy_host_tensor){"optim.lr", F64, 0, {0}, &minus}),
                     ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "state 'optim.lr' holds -1"));
    assert_ptr_equal(g->compiled, compiled);
    assert_true(state_f64(g, "optim.lr") == 0.5 && g->optimizer.lr == 0.5);
    assert_true(run_x(g, x) == 0.5);
    alloy_graph *plain = quad_graph(NULL, NULL);
    assert_int_equal(alloy_graph_set_lr(plain, 0.1), ALLOY_ERR_INVALID);
    assert_string_equal(alloy_last_error(plain), "set_lr: graph 'quad' has no optimizer (alloy_graph_add_optimizer)");
    alloy_graph_free(plain);
    alloy_graph_free(g);
}

/* optim.lr is in the checkpoint: a graph that loads it trains on with the
 * rate set before the save. */
static void test_the_rate_set_by_set_lr_is_saved_and_loaded_with_the_checkpoint(void **state)
{
    (void)state;
    char path[] = "/tmp/alloy_lr_ckpt_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    alloy_optimizer o = alloy_adamw(0.5, 0.9, 0.999, 1e-8, 0.01);
    alloy_graph *a = quad_graph(&o, NULL), *b = quad_graph(&o, NULL);
    double x[NP];
    random_x(x);
    run_x(a, x);
    expect_ok(a, alloy_graph_set_lr(a, 0.03125), "set_lr");
    expect_ok(a, alloy_graph_save_checkpoint(a, path), "save");
    expect_ok(b, alloy_graph_load_checkpoint(b, path), "load");
    assert_true(run_x(b, x) == 0.03125);
    assert_true(run_x(a, x) == 0.03125);
    double pa[NP], pb[NP];
    read_params(a, "", pa);
    read_params(b, "", pb);
    assert_memory_equal(pa, pb, sizeof pa);
    unlink(path);
    alloy_graph_free(a);
    alloy_graph_free(b);
}

/* A checkpoint written before the learning rate was state has every
 * tensor but optim.lr: it loads (params, moments and counters from the
 * file), and the graph keeps its optimizer's rate. Any other missing
 * tensor is still refused. The file is the graph's own checkpoint with
 * optim.lr left out (and no checksum, as a tool that rewrote it would). */
static void test_a_checkpoint_without_optim_lr_loads_and_keeps_the_optimizers_rate(void **state)
{
    (void)state;
    char full[] = "/tmp/alloy_lr_full_XXXXXX", old[] = "/tmp/alloy_lr_old_XXXXXX";
    int fd = mkstemp(full);
    assert_true(fd >= 0);
    close(fd);
    fd = mkstemp(old);
    assert_true(fd >= 0);
    close(fd);
    alloy_optimizer o = alloy_adamw(0.5, 0.9, 0.999, 1e-8, 0.01), o2 = alloy_adamw(0.25, 0.9, 0.999, 1e-8, 0.01);
    alloy_graph *a = quad_graph(&o, NULL), *b = quad_graph(&o2, NULL);
    double x[NP];
    random_x(x);
    run_x(a, x);
    expect_ok(a, alloy_graph_save_checkpoint(a, full), "save");
    alloy_safetensors *file = NULL;
    char err[256];
    assert_int_equal(alloy_safetensors_load(full, &file, err, sizeof err), ALLOY_OK);
    int n = alloy_safetensors_count(file), k = 0;
    alloy_host_tensor kept[64];
    assert_true(n <= 64);
    for (int i = 0; i < n; i++)
        if (strcmp(alloy_safetensors_get(file, i)->name, "optim.lr") != 0) kept[k++] = *alloy_safetensors_get(file, i);
    assert_int_equal(k, n - 1);
    assert_int_equal(alloy_safetensors_save(old, kept, k, NULL, NULL, 0, err, sizeof err), ALLOY_OK);
    expect_ok(b, alloy_graph_load_checkpoint(b, old), "load");
    assert_true(state_f64(b, "optim.lr") == 0.25);
    /* the rest came from the file: the next step of b is a's with lr 0.25 */
    expect_ok(a, alloy_graph_set_lr(a, 0.25), "set_lr");
    assert_true(run_x(b, x) == 0.25);
    assert_true(run_x(a, x) == 0.25);
    double pa[NP], pb[NP];
    read_params(a, "", pa);
    read_params(b, "", pb);
    assert_memory_equal(pa, pb, sizeof pa);
    /* a file missing another state tensor is refused, naming it */
    k = 0;
    for (int i = 0; i < n; i++)
        if (strcmp(alloy_safetensors_get(file, i)->name, "optim.step") != 0) kept[k++] = *alloy_safetensors_get(file, i);
    assert_int_equal(alloy_safetensors_save(old, kept, k, NULL, NULL, 0, err, sizeof err), ALLOY_OK);
    assert_int_equal(alloy_graph_load_checkpoint(b, old), ALLOY_ERR_NOT_FOUND);
    assert_non_null(strstr(alloy_last_error(b), "no tensor for state 'optim.step'"));
    alloy_safetensors_free(file);
    unlink(full);
    unlink(old);
    alloy_graph_free(a);
    alloy_graph_free(b);
}

/* ---- parameter groups ---- */

/* One update of torch.optim's formulas in f64 where each element i has its
 * own lr[i] and weight decay wd[i] (its group's); m, v, buf and t as in
 * test_optim.c's reference. */
typedef struct ref_opt {
    double p[NP], m[NP], v[NP], buf[NP];
    int t;
} ref_opt;

static void ref_update(const alloy_optimizer *o, ref_opt *r, const double *grad, const double *lr, const double *wd)
{
    r->t++;
    for (int i = 0; i < NP; i++) {
        double g = grad[i], p = r->p[i];
        if (o->kind == ALLOY_OPTIM_SGD) {
            double d = g + wd[i] * p;
            if (o->momentum != 0) {
                r->buf[i] = r->t == 1 ? d : o->momentum * r->buf[i] + d;
                d = o->nesterov ? d + o->momentum * r->buf[i] : r->buf[i];
            }
            r->p[i] = p - lr[i] * d;
            continue;
        }
        if (o->kind == ALLOY_OPTIM_ADAM) g += wd[i] * p;
        else p *= 1 - lr[i] * wd[i];
        r->m[i] = o->beta1 * r->m[i] + (1 - o->beta1) * g;
        r->v[i] = o->beta2 * r->v[i] + (1 - o->beta2) * g * g;
        double step_size = lr[i] / (1 - pow(o->beta1, r->t));
        double denom = sqrt(r->v[i]) / sqrt(1 - pow(o->beta2, r->t)) + o->eps;
        r->p[i] = p - step_size * r->m[i] / denom;
    }
}

/* w in the default group (lr, decay), b in the group "b" with lr * 0.25 and
 * no weight decay: three steps with known gradients of each kind against
 * the f64 reference, moments too. A reference that ignored the groups is
 * checked to differ, so the comparison can fail. */
static void test_parameter_groups_scale_the_lr_and_switch_decay_off_as_an_f64_reference_does(void **state)
{
    (void)state;
    const alloy_optimizer kinds[] = {
        alloy_adamw(0.0625, 0.9, 0.999, 1e-8, 0.5),
        alloy_adam(0.0625, 0.8, 0.95, 1e-3, 0.25),
        alloy_sgd(0.125, 0.9, 0.25, true),
    };
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        const alloy_optimizer *o = &kinds[k];
        alloy_graph *g = quad_graph(o, NULL);
        expect_ok(g, alloy_graph_set_param_group(g, "b", 0.25, false), "set_param_group");
        double lr[NP], wd[NP], flat_lr[NP], flat_wd[NP];
        for (int i = 0; i < NP; i++) {
            bool in_b = i >= NW;
            lr[i] = o->lr * (in_b ? 0.25 : 1), wd[i] = in_b ? 0 : o->weight_decay;
            flat_lr[i] = o->lr, flat_wd[i] = o->weight_decay;
        }
        ref_opt r = {.t = 0}, flat;
        read_params(g, "", r.p);
        flat = r;
        for (int step = 1; step <= 3; step++) {
            double x[NP], grad[NP], flat_grad[NP], got[NP];
            random_x(x);
            for (int i = 0; i < NP; i++) grad[i] = x[i] + r.p[i], flat_grad[i] = x[i] + flat.p[i];
            ref_update(o, &r, grad, lr, wd);
            ref_update(o, &flat, flat_grad, flat_lr, flat_wd);
            assert_true(run_x(g, x) == o->lr); /* step.lr is the schedule's rate, before the group's scale */
            read_params(g, "", got);
            char what[96];
            snprintf(what, sizeof what, "kind %d step %d: parameters", (int)o->kind, step);
            expect_close_all(got, r.p, NP, REL, what);
            read_params(g, o->kind == ALLOY_OPTIM_SGD ? ".momentum" : ".m", got);
            expect_close_all(got, o->kind == ALLOY_OPTIM_SGD ? r.buf : r.m, NP, REL, "first moment");
        }
        for (int i = NW; i < NP; i++) assert_false(close_rel(flat.p[i], r.p[i], 1e-6)); /* b's group mattered */
        alloy_graph_free(g);
    }
}

/* Patterns: comma-separated globs ('*' spans dots, '?' one character,
 * spaces around items trimmed); the last group that matches a param is its
 * group. */
static void test_group_patterns_are_comma_separated_globs_and_the_last_matching_group_wins(void **state)
{
    (void)state;
    const char *pat = "*.bias, ln_?.weight,head.weight";
    assert_true(pg_match(pat, "h0.attn.qkv.bias") && pg_match(pat, "ln_f.weight") && pg_match(pat, "head.weight"));
    assert_false(pg_match(pat, "h0.attn.qkv.weight") || pg_match(pat, "ln_ff.weight") || pg_match(pat, "bias"));
    assert_true(pg_match("*", "") && pg_match("a*b*c", "axxbyyc") && !pg_match("a*b*c", "axxbyy"));
    assert_true(pg_match("*norm*", "h1.rmsnorm.scale") && !pg_match("h1", "h10"));
    param_group groups[2] = {{"*", 0.5, false}, {"h1.*", 2, true}};
    double scale;
    bool decay;
    pg_lookup(groups, 2, "h1.w", &scale, &decay);
    assert_true(scale == 2 && decay);
    pg_lookup(groups, 2, "h2.w", &scale, &decay);
    assert_true(scale == 0.5 && !decay);
    pg_lookup(groups, 0, "h2.w", &scale, &decay);
    assert_true(scale == 1 && decay);
    /* through the API: every param at lr * 0, then w back at lr: b stays */
    alloy_optimizer o = alloy_sgd(0.5, 0, 0, false);
    alloy_graph *g = quad_graph(&o, NULL);
    expect_ok(g, alloy_graph_set_param_group(g, "*", 0, true), "group *");
    expect_ok(g, alloy_graph_set_param_group(g, " w ", 1, true), "group w");
    double x[NP], before[NP], after[NP];
    random_x(x);
    read_params(g, "", before);
    run_x(g, x);
    read_params(g, "", after);
    for (int i = 0; i < NP; i++)
        assert_true(i < NW ? after[i] == before[i] - 0.5 * (x[i] + before[i]) : after[i] == before[i]);
    alloy_graph_free(g);
}

/* A pattern that matches no param (a typo), an empty one, NULL, a NaN or
 * negative scale: refused naming what, and the graph keeps its groups and
 * its compiled step. */
static void test_set_param_group_refuses_unmatched_empty_or_null_patterns_and_bad_scales_changing_nothing(void **state)
{
    (void)state;
    assert_int_equal(alloy_graph_set_param_group(NULL, "w", 1, true), ALLOY_ERR_INVALID);
    alloy_optimizer o = alloy_sgd(0.5, 0, 0, false);
    alloy_graph *g = quad_graph(&o, NULL);
    expect_ok(g, alloy_graph_set_param_group(g, "b", 0.5, false), "set_param_group");
    double x[NP];
    random_x(x);
    run_x(g, x);
    const void *compiled = g->compiled;
    struct {
        const char *patterns;
        double scale;
        alloy_status st;
        const char *msg;
    } bad[] = {
        {"w, bias*", 1, ALLOY_ERR_NOT_FOUND, "set_param_group: pattern 'bias*' matches no param of graph 'quad'"},
        {"w,,b", 1, ALLOY_ERR_INVALID, "set_param_group 'w,,b': pattern 2 is empty"},
        {"w,", 1, ALLOY_ERR_INVALID, "set_param_group 'w,': pattern 2 is empty"}, /* a trailing comma was accepted */
        {"w, b , ", 1, ALLOY_ERR_INVALID, "set_param_group 'w, b , ': pattern 3 is empty"},
        {",w", 1, ALLOY_ERR_INVALID, "set_param_group ',w': pattern 1 is empty"},
        {"", 1, ALLOY_ERR_INVALID, "set_param_group: no pattern given (\"\")"},
        {NULL, 1, ALLOY_ERR_INVALID, "set_param_group: patterns is NULL"},
        {"w", NAN, ALLOY_ERR_INVALID, "set_param_group 'w': lr_scale is nan; it must be finite and >= 0"},
        {"w", -1, ALLOY_ERR_INVALID, "set_param_group 'w': lr_scale is -1; it must be finite and >= 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(alloy_graph_set_param_group(g, bad[i].patterns, bad[i].scale, true), bad[i].st);
        assert_string_equal(alloy_last_error(g), bad[i].msg);
    }
    assert_int_equal(g->ngroups, 1);
    assert_ptr_equal(g->compiled, compiled);
    /* the same call again is a no-op: no second copy (it grew by 48 bytes each time), no recompile */
    for (int i = 0; i < 3; i++) expect_ok(g, alloy_graph_set_param_group(g, "b", 0.5, false), "the same group again");
    assert_int_equal(g->ngroups, 1);
    assert_ptr_equal(g->compiled, compiled);
    expect_ok(g, alloy_graph_set_param_group(g, "b", 0.25, false), "another scale");
    assert_int_equal(g->ngroups, 2);
    alloy_graph_free(g);
}

/* The schedules' own fields: each bad one is refused naming it, and the
 * optimizer set before stays. */
static void test_bad_schedule_fields_are_refused_naming_the_field(void **state)
{
    (void)state;
    alloy_optimizer ok = alloy_sgd(0.5, 0, 0, false);
    alloy_graph *g = quad_graph(&ok, NULL);
    alloy_optimizer cases[8];
    const char *want[8];
    for (int i = 0; i < 8; i++) cases[i] = alloy_sgd(0.1, 0, 0, false);
    cases[0].schedule = ALLOY_LR_STEP, want[0] = "add_optimizer: step_size is 0; it must be >= 1";
    cases[1].schedule = ALLOY_LR_STEP, cases[1].step_size = 2, cases[1].gamma = -0.5;
    want[1] = "add_optimizer: gamma is -0.5; it must be finite and > 0 (0 = 0.1)";
    cases[2].schedule = ALLOY_LR_MULTI_STEP, want[2] = "add_optimizer: nmilestones is 0; it must be in [1, ALLOY_MAX_MILESTONES]";
    cases[3].schedule = ALLOY_LR_MULTI_STEP, cases[3].nmilestones = 2, cases[3].milestones[0] = 5,
    cases[3].milestones[1] = 5;
    want[3] = "add_optimizer: milestones[1] is 5; milestones must be >= 1 and increasing";
    cases[4].schedule = ALLOY_LR_ONE_CYCLE, cases[4].total_steps = 100, cases[4].pct_start = 1;
    want[4] = "add_optimizer: pct_start is 1; it must be in (0, 1) (0 = 0.3)";
    cases[5].schedule = ALLOY_LR_ONE_CYCLE, cases[5].total_steps = 3;
    want[5] = "add_optimizer: total_steps is 3; a one-cycle schedule needs pct_start * total_steps (0.9) > 1 and "
              "below total_steps";
    cases[6].schedule = ALLOY_LR_ONE_CYCLE, cases[6].total_steps = 100, cases[6].div_factor = INFINITY;
    want[6] = "add_optimizer: div_factor is inf; it must be finite and > 0 (0 = 25)";
    cases[7].schedule = ALLOY_LR_WARMUP_LINEAR_DECAY, cases[7].warmup_steps = 5, cases[7].total_steps = 5;
    want[7] = "add_optimizer: total_steps is 5; a linear decay schedule needs total_steps > warmup_steps (5)";
    for (int i = 0; i < 8; i++) {
        assert_int_equal(alloy_graph_add_optimizer(g, cases[i]), ALLOY_ERR_INVALID);
        assert_string_equal(alloy_last_error(g), want[i]);
    }
    double x[NP];
    random_x(x);
    assert_true(run_x(g, x) == 0.5); /* the optimizer set first */
    alloy_graph_free(g);
}

#define TEST(f) cmocka_unit_test_setup_teardown(f, test_checked_alloc, test_plain_alloc)

int main(void)
{
    test_rng = 0x5be0cd19137e2179u;
    const struct CMUnitTest tests[] = {
        TEST(test_step_multi_step_and_one_cycle_schedules_give_pytorchs_lr_sequences),
        TEST(test_warmup_then_linear_decay_and_the_older_schedules_follow_hand_computed_sequences),
        TEST(test_a_skipped_step_does_not_advance_step_multi_step_or_one_cycle_schedules),
        TEST(test_set_lr_takes_effect_at_the_next_step_without_recompiling),
        TEST(test_set_lr_before_the_first_run_and_a_second_add_optimizer_set_the_next_steps_rate),
        TEST(test_set_lr_refuses_bad_rates_and_graphs_without_an_optimizer_and_changes_nothing),
        TEST(test_the_rate_set_by_set_lr_is_saved_and_loaded_with_the_checkpoint),
        TEST(test_a_checkpoint_without_optim_lr_loads_and_keeps_the_optimizers_rate),
        TEST(test_parameter_groups_scale_the_lr_and_switch_decay_off_as_an_f64_reference_does),
        TEST(test_group_patterns_are_comma_separated_globs_and_the_last_matching_group_wins),
        TEST(test_set_param_group_refuses_unmatched_empty_or_null_patterns_and_bad_scales_changing_nothing),
        TEST(test_bad_schedule_fields_are_refused_naming_the_field),
    };
    return cmocka_run_group_tests_name("lr", tests, NULL, NULL);
}
