/* test_optim.c - the optimizers against hand computations of PyTorch's update formulas in f64: SGD (momentum, nesterov, weight decay), Adam (L2), AdamW; global-norm clipping; learning-rate schedules; gradient accumulation, with and without a scaler. */
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


/* Parameters, moments and inputs are f64, and the hand computation below
 * does PyTorch's arithmetic in f64, so the two agree to a few f64 roundings:
 * the bound is relative, |got - want| <= REL * max(|want|, FLOOR). */
#define REL 1e-12
#define FLOOR 1e-2
/* Values alloy computes in f32 by design (the learning rate of a schedule,
 * step.lr; the global norm and the clipping coefficient): a few f32
 * roundings, 2^-24 = 6e-8 each. */
#define REL_F32 1e-6

/* ---- helpers ---- */


static double state_scalar(alloy_graph *g, const char *name)
{
    alloy_host_tensor t;
    expect_ok(g, alloy_graph_get_state(g, name, &t), name);
    assert_int_equal(t.rank, 0);
    if (t.dtype == ALLOY_I32) return *(const int32_t *)t.data;
    if (t.dtype == ALLOY_F32) return *(const float *)t.data;
    assert_int_equal(t.dtype, F64);
    return *(const double *)t.data;
}

static double fetched_scalar(const alloy_host_tensor *t)
{
    assert_int_equal(t->rank, 0);
    switch (t->dtype) {
    case ALLOY_F32: return *(const float *)t->data;
    case ALLOY_F64: return *(const double *)t->data;
    case ALLOY_BOOL: return *(const uint8_t *)t->data;
    default: fail_msg("fetch '%s': unexpected dtype %s", t->name, alloy_dtype_name(t->dtype));
    }
    return 0;
}

static int failures; /* cases of the running test that failed, each reported */

static void case_failed(const char *f, ...) __attribute__((format(printf, 1, 2)));
static void case_failed(const char *f, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, f);
    vsnprintf(msg, sizeof msg, f, ap);
    va_end(ap);
    print_error("FAILED: %s\n", msg);
    failures++;
}

static void finish(void)
{
    int n = failures;
    failures = 0;
    if (n) fail_msg("%d case(s) failed, each reported above", n);
}

/* got against want elementwise within rel (relative, floor FLOOR). */
static bool close_all(const char *what, const double *got, const double *want, int n, double rel)
{
    double worst = 0;
    int at = -1;
    for (int i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) / fmax(fabs(want[i]), FLOOR);
        if (!(e <= worst)) worst = e, at = i; /* NaN counts as worst */
    }
    if (at >= 0 && !(worst <= rel)) {
        case_failed("%s: element %d is %.17g, expected %.17g (relative error %.3g > %.3g)", what, at, got[at],
                    want[at], worst, rel);
        return false;
    }
    return true;
}

/* ---- the graph: models.c's build_quad (loss = sum(x p) + 0.5 sum(p^2), so
 * d loss / d p = x + p for p = w [2,3], b [3], each x fed per step), seed 11 ---- */
enum { NP = QUAD_NP };

static alloy_graph *quad_graph(const alloy_optimizer *o, const alloy_grad_scaler *sc)
{
    alloy_graph *g = build_quad(11, o, sc);
    assert_non_null(g);
    return g;
}

static void read_pair(alloy_graph *g, const char *suffix, double *v)
{
    expect_ok(g, read_quad(g, suffix, v), suffix);
}

static void random_x(double *x)
{
    for (int i = 0; i < NP; i++) x[i] = test_uniform(-1, 1);
}

static void run_x(alloy_graph *g, double *x, alloy_host_tensor *fetches, int nfetches)
{
    alloy_host_tensor feeds[2] = {{"xw", F64, 2, {2, 3}, x}, {"xb", F64, 1, {3}, x + 6}};
    expect_ok(g, alloy_graph_run(g, feeds, 2, fetches, nfetches), "alloy_graph_run");
}

static alloy_step_info step_info(alloy_graph *g)
{
    alloy_step_info info;
    expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
    return info;
}

/* ---- the reference: torch.optim.SGD / Adam / AdamW, one update in f64 ----
 *
 * SGD (dampening 0):  d = g + wd p
 *                     momentum: buf = d on the first step, else momentum buf + d
 *                               d = nesterov ? d + momentum buf : buf
 *                     p -= lr d
 * Adam:               g += wd p                       (L2)
 * AdamW:              p *= 1 - lr wd                  (decoupled)
 * both:               m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *                     step_size = lr / (1 - beta1^t)
 *                     denom = sqrt(v) / sqrt(1 - beta2^t) + eps
 *                     p -= step_size m / denom
 * t counts updates from 1. */
typedef struct ref_opt {
    double p[NP], m[NP], v[NP], buf[NP];
    int t;
} ref_opt;

static void ref_update(const alloy_optimizer *o, ref_opt *r, const double *grad, double lr)
{
    r->t++;
    for (int i = 0; i < NP; i++) {
        double g = grad[i], p = r->p[i];
        if (o->kind == ALLOY_OPTIM_SGD) {
            double d = g + o->weight_decay * p;
            if (o->momentum != 0) {
                r->buf[i] = r->t == 1 ? d : o->momentum * r->buf[i] + d;
                d = o->nesterov ? d + o->momentum * r->buf[i] : r->buf[i];
            }
            r->p[i] = p - lr * d;
            continue;
        }
        if (o->kind == ALLOY_OPTIM_ADAM) g += o->weight_decay * p;
        else p *= 1 - lr * o->weight_decay;
        r->m[i] = o->beta1 * r->m[i] + (1 - o->beta1) * g;
        r->v[i] = o->beta2 * r->v[i] + (1 - o->beta2) * g * g;
        double step_size = lr / (1 - pow(o->beta1, r->t));
        double denom = sqrt(r->v[i]) / sqrt(1 - pow(o->beta2, r->t)) + o->eps;
        r->p[i] = p - step_size * r->m[i] / denom;
    }
}

/* d loss / d p of the quad graph, and its loss */
static void ref_grad(const ref_opt *r, const double *x, double *g)
{
    for (int i = 0; i < NP; i++) g[i] = x[i] + r->p[i];
}

static double ref_loss(const ref_opt *r, const double *x)
{
    double l = 0;
    for (int i = 0; i < NP; i++) l += x[i] * r->p[i] + 0.5 * r->p[i] * r->p[i];
    return l;
}

static const char *opt_name(const alloy_optimizer *o, char *buf, size_t n)
{
    if (o->kind == ALLOY_OPTIM_SGD)
        snprintf(buf, n, "SGD(lr %g, momentum %g, wd %g%s)", o->lr, o->momentum, o->weight_decay,
                 o->nesterov ? ", nesterov" : "");
    else
        snprintf(buf, n, "%s(lr %g, betas %g %g, eps %g, wd %g)", o->kind == ALLOY_OPTIM_ADAM ? "Adam" : "AdamW",
                 o->lr, o->beta1, o->beta2, o->eps, o->weight_decay);
    return buf;
}

/* Runs `steps` updates of o on the quad graph and checks, after every one,
 * the parameters, the moments, the loss, optim.step and step_info against
 * the reference (the reference's learning rate is o->lr: a constant
 * schedule). */
static void check_optimizer(alloy_optimizer o, int steps)
{
    char name[128], what[192];
    opt_name(&o, name, sizeof name);
    alloy_graph *g = quad_graph(&o, NULL);
    ref_opt r = {.t = 0};
    read_pair(g, "", r.p); /* the initial values: the starting point of both */
    for (int step = 1; step <= steps; step++) {
        double x[NP], grad[NP], got[NP];
        random_x(x);
        double loss = ref_loss(&r, x);
        ref_grad(&r, x, grad);
        ref_update(&o, &r, grad, o.lr);
        run_x(g, x, NULL, 0);
        alloy_step_info info = step_info(g);
        snprintf(what, sizeof what, "%s step %d: loss", name, step);
        close_all(what, &info.loss, &loss, 1, REL);
        if (info.step != step || state_scalar(g, "optim.step") != step || !info.updated || info.skipped)
            case_failed("%s step %d: step_info.step %lld, optim.step %g, updated %d, skipped %d", name, step,
                        (long long)info.step, state_scalar(g, "optim.step"), info.updated, info.skipped);
        read_pair(g, "", got);
        snprintf(what, sizeof what, "%s step %d: parameters", name, step);
        close_all(what, got, r.p, NP, REL);
        if (o.kind == ALLOY_OPTIM_SGD && o.momentum != 0) {
            read_pair(g, ".momentum", got);
            snprintf(what, sizeof what, "%s step %d: momentum buffer", name, step);
            close_all(what, got, r.buf, NP, REL);
        } else if (o.kind != ALLOY_OPTIM_SGD) {
            read_pair(g, ".m", got);
            snprintf(what, sizeof what, "%s step %d: first moment", name, step);
            close_all(what, got, r.m, NP, REL);
            read_pair(g, ".v", got);
            snprintf(what, sizeof what, "%s step %d: second moment", name, step);
            close_all(what, got, r.v, NP, REL);
        }
    }
    alloy_graph_free(g);
}

/* ---- tests ----
 *
 * The learning rates of the formula tests are exact in f32 (0.125, 0.0625,
 * 2^-10): alloy computes the learning rate in the graph in f32, and the
 * last test checks what that does to f64 parameters with lr = 0.1. */

static void test_sgd_plain_momentum_nesterov_and_weight_decay_match_pytorch_over_one_and_three_steps(void **state)
{
    (void)state;
    const alloy_optimizer opts[] = {
        alloy_sgd(0.125, 0, 0, false),   alloy_sgd(0.125, 0.9, 0, false),  alloy_sgd(0.125, 0.9, 0, true),
        alloy_sgd(0.125, 0, 0.1, false), alloy_sgd(0.0625, 0.8, 0.05, false), alloy_sgd(0.0625, 0.8, 0.05, true),
    };
    for (size_t k = 0; k < sizeof opts / sizeof *opts; k++) {
        check_optimizer(opts[k], 1);
        check_optimizer(opts[k], 3);
    }
    finish();
}

static void test_adam_with_l2_weight_decay_matches_pytorch_over_one_and_three_steps(void **state)
{
    (void)state;
    const alloy_optimizer opts[] = {
        alloy_adam(0.0625, 0.9, 0.999, 1e-8, 0),
        alloy_adam(0.0625, 0.9, 0.999, 1e-8, 0.01),
        alloy_adam(0x1p-10, 0.8, 0.95, 1e-3, 0.5), /* eps and decay large enough to matter */
    };
    for (size_t k = 0; k < sizeof opts / sizeof *opts; k++) {
        check_optimizer(opts[k], 1);
        check_optimizer(opts[k], 3);
    }
    finish();
}

static void test_adamw_decays_the_weights_decoupled_from_the_gradient_as_pytorch_does(void **state)
{
    (void)state;
    const alloy_optimizer opts[] = {
        alloy_adamw(0.0625, 0.9, 0.999, 1e-8, 0.01),
        alloy_adamw(0.125, 0.8, 0.95, 1e-3, 0.5),
        alloy_adamw(0.0625, 0.9, 0.999, 1e-8, 0), /* no decay: the same as Adam */
    };
    for (size_t k = 0; k < sizeof opts / sizeof *opts; k++) {
        check_optimizer(opts[k], 1);
        check_optimizer(opts[k], 3);
    }
    /* the two kinds really differ with weight decay: AdamW's p after one
     * step is not Adam's (a reference that mixed them up would agree) */
    ref_opt a = {.t = 0}, w = {.t = 0};
    double grad[NP];
    for (int i = 0; i < NP; i++) a.p[i] = w.p[i] = 0.5 + 0.1 * i, grad[i] = 0.3 - 0.07 * i;
    alloy_optimizer oa = alloy_adam(0.125, 0.9, 0.999, 1e-8, 0.5), ow = alloy_adamw(0.125, 0.9, 0.999, 1e-8, 0.5);
    ref_update(&oa, &a, grad, oa.lr);
    ref_update(&ow, &w, grad, ow.lr);
    assert_true(fabs(a.p[0] - w.p[0]) > 1e-3);
    finish();
}

/* PyTorch's clip_grad_norm_: total = sqrt(sum of squares over every
 * gradient); each gradient is multiplied by min(1, clip / (total + 1e-6)).
 * step_info.grad_norm is total (before clipping). */
static void test_clipping_scales_gradients_by_clip_over_the_global_norm_only_when_the_norm_exceeds_it(void **state)
{
    (void)state;
    for (int c = 0; c < 2; c++) {
        bool clipped = c == 0;
        double x[NP], grad[NP];
        random_x(x);
        /* the norm of this step's gradient, from the initial parameters */
        alloy_graph *probe = quad_graph(NULL, NULL);
        ref_opt r = {.t = 0};
        read_pair(probe, "", r.p);
        alloy_graph_free(probe);
        ref_grad(&r, x, grad);
        double norm = 0;
        for (int i = 0; i < NP; i++) norm += grad[i] * grad[i];
        norm = sqrt(norm);
        alloy_optimizer o = alloy_sgd(0.125, 0, 0, false);
        o.clip_norm = clipped ? 0.25 * norm : 4 * norm;
        double coef = clipped ? o.clip_norm / (norm + 1e-6) : 1;
        alloy_graph *g = quad_graph(&o, NULL);
        double before[NP], after[NP], applied[NP], want[NP];
        read_pair(g, "", before);
        assert_memory_equal(before, r.p, sizeof before);
        alloy_host_tensor fetch = {.name = "step.grad_norm"};
        run_x(g, x, &fetch, 1);
        alloy_step_info info = step_info(g);
        close_all(clipped ? "clipped: step.grad_norm" : "unclipped: step.grad_norm", (double[]){fetched_scalar(&fetch)},
                  &norm, 1, REL_F32);
        close_all("step_info.grad_norm", &info.grad_norm, &norm, 1, REL_F32);
        read_pair(g, "", after);
        /* the gradient the update applied: (before - after) / lr */
        for (int i = 0; i < NP; i++) applied[i] = (before[i] - after[i]) / o.lr, want[i] = coef * grad[i];
        /* clipped: the coefficient is computed in f32; unclipped it is exactly 1 */
        close_all(clipped ? "clipped gradient" : "unclipped gradient", applied, want, NP, clipped ? REL_F32 : REL);
        if (!clipped) {
            ref_update(&o, &r, grad, o.lr);
            close_all("unclipped parameters", after, r.p, NP, REL);
        }
        alloy_graph_free(g);
    }
    finish();
}

/* GradScaler's documented pattern: unscale, then clip. With a loss scale of
 * 2^12 the clipping and the reported norm see the unscaled gradients: the
 * same update as without a scaler. */
static void test_clipping_under_a_loss_scale_uses_the_unscaled_gradient_norm(void **state)
{
    (void)state;
    double x[NP], grad[NP];
    random_x(x);
    alloy_graph *probe = quad_graph(NULL, NULL);
    ref_opt r = {.t = 0};
    read_pair(probe, "", r.p);
    alloy_graph_free(probe);
    ref_grad(&r, x, grad);
    double norm = 0;
    for (int i = 0; i < NP; i++) norm += grad[i] * grad[i];
    norm = sqrt(norm);
    alloy_optimizer o = alloy_sgd(0.125, 0, 0, false);
    o.clip_norm = 0.5 * norm;
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    sc.init_scale = 0x1p12;
    alloy_graph *g = quad_graph(&o, &sc);
    double after[NP], applied[NP], want[NP];
    run_x(g, x, NULL, 0);
    alloy_step_info info = step_info(g);
    assert_true(info.scale == 0x1p12 && !info.skipped && info.updated);
    close_all("step_info.grad_norm under a scale of 2^12", &info.grad_norm, &norm, 1, REL_F32);
    read_pair(g, "", after);
    for (int i = 0; i < NP; i++)
        applied[i] = (r.p[i] - after[i]) / o.lr, want[i] = o.clip_norm / (norm + 1e-6) * grad[i];
    close_all("clipped gradient under a scale of 2^12", applied, want, NP, REL_F32);
    alloy_graph_free(g);
    finish();
}

/* The documented schedules, t = optimizer updates done before this one:
 *   warmup linear: lr * min(1, (t + 1) / warmup)
 *   warmup cosine: t < warmup: lr (t + 1) / warmup; else
 *                  min_lr + (lr - min_lr) (1 + cos(pi min(1, (t - warmup) / (total - warmup)))) / 2
 * step.lr (f32) is checked against them for every step, past total_steps
 * too, and each update applies the lr it reports. */
static double schedule_lr(const alloy_optimizer *o, int t)
{
    int warm = o->warmup_steps; /* 0: no warmup at all */
    if (o->schedule == ALLOY_LR_CONSTANT) return o->lr;
    if (o->schedule == ALLOY_LR_WARMUP_LINEAR) return warm ? o->lr * fmin(1.0, (t + 1.0) / warm) : o->lr;
    if (t < warm) return o->lr * (t + 1.0) / warm;
    double progress = fmin(1.0, (double)(t - warm) / (o->total_steps - warm));
    return o->min_lr + (o->lr - o->min_lr) * 0.5 * (1 + cos(M_PI * progress));
}

/* Checks step.lr and the update over `updates` steps of schedule o. */
static void check_schedule(const alloy_optimizer *o, const char *name, int updates)
{
    alloy_graph *g = quad_graph(o, NULL);
    for (int t = 0; t < updates; t++) {
        double x[NP], before[NP], after[NP], grad[NP], applied[NP];
        random_x(x);
        ref_opt r = {.t = 0};
        read_pair(g, "", before);
        memcpy(r.p, before, sizeof before);
        ref_grad(&r, x, grad);
        alloy_host_tensor fetch = {.name = "step.lr"};
        run_x(g, x, &fetch, 1);
        double lr = fetched_scalar(&fetch), want = schedule_lr(o, t);
        char what[96];
        snprintf(what, sizeof what, "%s: step.lr of update %d", name, t);
        close_all(what, &lr, &want, 1, REL_F32);
        alloy_step_info info = step_info(g);
        if (info.lr != lr) case_failed("%s: step_info.lr %.9g, step.lr %.9g", what, info.lr, lr);
        read_pair(g, "", after);
        for (int i = 0; i < NP; i++) applied[i] = before[i] - lr * grad[i];
        snprintf(what, sizeof what, "%s: update %d applies the lr it reports", name, t);
        close_all(what, after, applied, NP, REL);
    }
    alloy_graph_free(g);
}

static void test_learning_rate_schedules_follow_their_formulas_step_by_step_and_hold_min_lr_after_total_steps(void **state)
{
    (void)state;
    alloy_optimizer lin = alloy_sgd(0.5, 0, 0, false);
    lin.schedule = ALLOY_LR_WARMUP_LINEAR, lin.warmup_steps = 4;
    alloy_optimizer cosine = alloy_sgd(0.5, 0, 0, false);
    cosine.schedule = ALLOY_LR_WARMUP_COSINE, cosine.warmup_steps = 3, cosine.total_steps = 9, cosine.min_lr = 0.05;
    alloy_optimizer constant = alloy_sgd(0.5, 0, 0, false);
    alloy_optimizer lin0 = lin;
    lin0.warmup_steps = 0;
    check_schedule(&lin, "warmup linear", 12);
    check_schedule(&lin0, "linear without warmup", 4);
    check_schedule(&cosine, "warmup cosine", 12);
    check_schedule(&constant, "constant", 4);
    /* the schedule's shape, in the reference itself: the peak at the end of
     * warmup, min_lr from total_steps on */
    assert_true(schedule_lr(&cosine, 3) == 0.5 && schedule_lr(&cosine, 9) == 0.05 && schedule_lr(&cosine, 11) == 0.05);
    finish();
}

/* warmup_steps = 0 is no warmup: the cosine runs from lr at update 0 to
 * min_lr at total_steps, progress t / total_steps. */
static void test_warmup_cosine_without_warmup_decays_from_the_first_update(void **state)
{
    (void)state;
    alloy_optimizer cosine = alloy_sgd(0.5, 0, 0, false);
    cosine.schedule = ALLOY_LR_WARMUP_COSINE, cosine.total_steps = 8, cosine.min_lr = 0.1;
    /* the reference: 0.5 at t = 0, (0.1 + 0.4 * (1 + cos(pi / 8)) / 2) = 0.4848 at t = 1, 0.3 at t = 4 */
    assert_true(fabs(schedule_lr(&cosine, 4) - 0.3) < 1e-15);
    check_schedule(&cosine, "cosine without warmup", 10);
    finish();
}

/* A skipped step (inf/NaN) is no update: the schedule does not move. */
static void test_a_skipped_step_does_not_advance_the_learning_rate_schedule(void **state)
{
    (void)state;
    alloy_optimizer o = alloy_adamw(0.5, 0.9, 0.999, 1e-8, 0);
    o.schedule = ALLOY_LR_WARMUP_LINEAR, o.warmup_steps = 8;
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    alloy_graph *g = quad_graph(&o, &sc);
    const char pattern[] = "FFNNFIF";
    int done = 0;
    for (int i = 0; pattern[i]; i++) {
        double x[NP];
        random_x(x);
        if (pattern[i] == 'N') x[4] = NAN;
        if (pattern[i] == 'I') x[7] = INFINITY;
        run_x(g, x, NULL, 0);
        alloy_step_info info = step_info(g);
        double want = schedule_lr(&o, done);
        char what[96];
        snprintf(what, sizeof what, "run %d ('%c'): lr after %d updates", i, pattern[i], done);
        close_all(what, &info.lr, &want, 1, REL_F32);
        if (info.skipped != (pattern[i] != 'F')) case_failed("%s: skipped %d", what, info.skipped);
        done += pattern[i] == 'F';
        if (info.step != done) case_failed("%s: step_info.step %lld, expected %d", what, (long long)info.step, done);
    }
    alloy_graph_free(g);
    finish();
}

/* K = 3 micro-batches per update: the update applies the mean of their
 * gradients (the parameters stay put in between, so each micro-batch's
 * gradient is x_k + p); nothing changes on the first K-1 runs. */
static void test_gradient_accumulation_over_three_micro_batches_equals_one_step_on_the_mean_gradient(void **state)
{
    (void)state;
    enum { K = 3 };
    alloy_optimizer clipped = alloy_sgd(0.125, 0, 0, false);
    clipped.clip_norm = 0.05; /* below every mean gradient's norm: clipping is on */
    const alloy_optimizer base[] = {alloy_adam(0.0625, 0.9, 0.999, 1e-8, 0.01), alloy_sgd(0.125, 0.9, 0.01, true),
                                    clipped};
    const char *const names[] = {"Adam", "SGD", "clipped SGD"};
    for (int k = 0; k < 3; k++) {
        alloy_optimizer o = base[k];
        o.accumulation_steps = K;
        alloy_graph *g = quad_graph(&o, NULL);
        alloy_graph *mean_graph = quad_graph(&base[k], NULL); /* fed the mean input, no accumulation */
        ref_opt r = {.t = 0};
        read_pair(g, "", r.p);
        for (int step = 1; step <= 2; step++) {
            double xs[K][NP], mean_grad[NP] = {0}, mean_x[NP] = {0}, before[NP], got[NP];
            read_pair(g, "", before);
            for (int micro = 0; micro < K; micro++) {
                random_x(xs[micro]);
                double grad[NP];
                ref_grad(&r, xs[micro], grad);
                for (int i = 0; i < NP; i++) mean_grad[i] += grad[i] / K, mean_x[i] += xs[micro][i] / K;
                run_x(g, xs[micro], NULL, 0);
                alloy_step_info info = step_info(g);
                bool last = micro == K - 1;
                if (info.updated != last || info.skipped || info.step != (last ? step : step - 1) ||
                    state_scalar(g, "optim.step") != (last ? step : step - 1))
                    case_failed("update %d micro-batch %d: updated %d, step %lld, optim.step %g", step, micro,
                                info.updated, (long long)info.step, state_scalar(g, "optim.step"));
                if (!last) {
                    read_pair(g, "", got);
                    if (memcmp(got, before, sizeof got))
                        case_failed("update %d micro-batch %d: parameters changed inside accumulation", step, micro);
                }
            }
            char what[96];
            if (o.clip_norm > 0) { /* clip the mean gradient (not each micro-batch's) by its norm */
                double norm = 0;
                for (int i = 0; i < NP; i++) norm += mean_grad[i] * mean_grad[i];
                norm = sqrt(norm);
                assert_true(norm > o.clip_norm);
                for (int i = 0; i < NP; i++) mean_grad[i] *= o.clip_norm / (norm + 1e-6);
                alloy_step_info info = step_info(g);
                snprintf(what, sizeof what, "%s update %d: grad_norm of the mean gradient", names[k], step);
                close_all(what, &info.grad_norm, &norm, 1, REL_F32);
            }
            ref_update(&o, &r, mean_grad, o.lr);
            read_pair(g, "", got);
            snprintf(what, sizeof what, "%s update %d: parameters", names[k], step);
            close_all(what, got, r.p, NP, o.clip_norm > 0 ? REL_F32 : REL);
            if (k < 2) {
                read_pair(g, k ? ".momentum" : ".m", got);
                snprintf(what, sizeof what, "%s update %d: first moment", names[k], step);
                close_all(what, got, k ? r.buf : r.m, NP, REL);
            }
            if (o.clip_norm > 0) memcpy(r.p, got, sizeof got); /* go on from alloy's (f32 coefficient) */
            /* and the graph without accumulation, fed the mean input (its
             * gradient is mean(x) + p, the mean gradient) */
            run_x(mean_graph, mean_x, NULL, 0);
            double other[NP];
            read_pair(mean_graph, "", other);
            read_pair(g, "", got);
            snprintf(what, sizeof what, "%s update %d: against one step on the mean input", names[k], step);
            close_all(what, got, other, NP, o.clip_norm > 0 ? REL_F32 : REL);
        }
        alloy_graph_free(g);
        alloy_graph_free(mean_graph);
    }
    finish();
}

/* With a scaler the scale is constant within an accumulated step and moves
 * once per step; an inf/NaN in any micro-batch skips the whole step, and
 * the next step applies the mean of its own micro-batches only. */
static void test_accumulation_with_a_scaler_keeps_the_scale_within_a_step_and_an_inf_in_any_micro_batch_skips_it(void **state)
{
    (void)state;
    enum { K = 3 };
    alloy_optimizer o = alloy_adam(0.0625, 0.9, 0.999, 1e-8, 0);
    o.accumulation_steps = K;
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    sc.init_scale = 256, sc.growth_interval = 1; /* would grow on every run if it moved per micro-batch */
    alloy_graph *g = quad_graph(&o, &sc);
    ref_opt r = {.t = 0};
    read_pair(g, "", r.p);
    /* three steps: finite; a NaN in micro-batch 1 (of 0..2); finite */
    const double scale_used[3] = {256, 512, 256}, next_scale[3] = {512, 256, 512};
    for (int step = 0; step < 3; step++) {
        double mean_grad[NP] = {0}, before[NP], got[NP];
        read_pair(g, "", before);
        bool bad = step == 1;
        for (int micro = 0; micro < K; micro++) {
            double x[NP], grad[NP];
            random_x(x);
            if (bad && micro == 1) x[2] = NAN;
            ref_grad(&r, x, grad);
            for (int i = 0; i < NP; i++) mean_grad[i] += grad[i] / K;
            alloy_host_tensor fetch = {.name = "scaler.next_scale"};
            run_x(g, x, &fetch, 1);
            alloy_step_info info = step_info(g);
            bool last = micro == K - 1;
            double next = last ? next_scale[step] : scale_used[step];
            if (info.scale != scale_used[step] || info.next_scale != next || fetched_scalar(&fetch) != next ||
                state_scalar(g, "scaler.scale") != next)
                case_failed("step %d micro-batch %d: scale %g, next %g (fetched %g, state %g); expected %g, %g", step,
                            micro, info.scale, info.next_scale, fetched_scalar(&fetch),
                            state_scalar(g, "scaler.scale"), scale_used[step], next);
            if (info.skipped != (bad && last) || info.updated != (!bad && last) ||
                info.skipped_steps != (step >= 1 && (step > 1 || last)))
                case_failed("step %d micro-batch %d: skipped %d, updated %d, skipped_steps %lld", step, micro,
                            info.skipped, info.updated, (long long)info.skipped_steps);
            if (!last || bad) {
                read_pair(g, "", got);
                if (memcmp(got, before, sizeof got))
                    case_failed("step %d micro-batch %d: parameters changed", step, micro);
            }
        }
        if (!bad) ref_update(&o, &r, mean_grad, o.lr);
        read_pair(g, "", got);
        char what[64];
        snprintf(what, sizeof what, "step %d: parameters", step);
        close_all(what, got, r.p, NP, REL);
        read_pair(g, ".v", got);
        snprintf(what, sizeof what, "step %d: second moment", step);
        close_all(what, got, r.v, NP, REL);
    }
    assert_true(state_scalar(g, "optim.step") == 2);
    assert_true(state_scalar(g, "step.skipped_steps") == 1);
    alloy_graph_free(g);
    finish();
}

/* step_info.grad_norm is not finite when a gradient is not (inf for an inf
 * gradient, as PyTorch's clip_grad_norm_ returns; NaN for a NaN one); the
 * step itself is skipped (a scaler is set). */
static void test_grad_norm_is_not_finite_when_a_gradient_is_inf_or_nan(void **state)
{
    (void)state;
    alloy_optimizer o = alloy_sgd(0.125, 0, 0, false);
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    alloy_graph *g = quad_graph(&o, &sc);
    for (int k = 0; k < 2; k++) {
        double x[NP];
        random_x(x);
        x[3] = k ? NAN : -INFINITY;
        run_x(g, x, NULL, 0);
        alloy_step_info info = step_info(g);
        if (!info.skipped) case_failed("%s gradient: the step was not skipped", k ? "NaN" : "inf");
        if (k ? !isnan(info.grad_norm) : !(isinf(info.grad_norm) && info.grad_norm > 0))
            case_failed("%s gradient: step_info.grad_norm is %g, expected %s", k ? "NaN" : "inf", info.grad_norm,
                        k ? "nan" : "inf");
    }
    alloy_graph_free(g);
    finish();
}

static void test_optimizer_parameters_out_of_range_are_rejected_with_a_message(void **state)
{
    (void)state;
    alloy_graph *g = quad_graph(NULL, NULL);
    struct {
        alloy_optimizer o;
        const char *part;
    } bad[] = {
        {alloy_sgd(-0.1, 0, 0, false), "lr"},
        {alloy_sgd(0.1, -0.9, 0, false), "momentum"},
        {alloy_sgd(0.1, 0, -1, false), "weight_decay"},
        {alloy_sgd(0.1, 0, 0, true), "nesterov"},
        {alloy_adam(0.1, 1.0, 0.999, 1e-8, 0), "beta1"},
        {alloy_adam(0.1, 0.9, 1.5, 1e-8, 0), "beta2"},
        {alloy_adamw(0.1, 0.9, 0.999, 0, 0), "eps"},
        {alloy_adam(NAN, 0.9, 0.999, 1e-8, 0), "lr"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        alloy_status st = alloy_graph_add_optimizer(g, bad[i].o);
        if (st != ALLOY_ERR_INVALID || !strstr(alloy_last_error(g), bad[i].part))
            case_failed("case %zu: %s \"%s\", expected invalid argument naming %s", i, alloy_status_name(st),
                        alloy_last_error(g), bad[i].part);
    }
    alloy_optimizer cosine = alloy_sgd(0.1, 0, 0, false);
    cosine.schedule = ALLOY_LR_WARMUP_COSINE, cosine.warmup_steps = 10, cosine.total_steps = 10;
    assert_int_equal(alloy_graph_add_optimizer(g, cosine), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "total_steps"));
    alloy_graph_free(g);
    /* an optimizer needs a loss */
    g = alloy_graph_new("no-loss");
    alloy_tensor *w = alloy_param(g, "w", F64, 1, DIMS(2), alloy_init_ones());
    expect_ok(g, alloy_output(g, "y", alloy_square(g, w)), "alloy_output");
    assert_int_equal(alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0, 0, false)), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "loss"));
    alloy_graph_free(g);
    finish();
}

/* Every hyper-parameter of every optimizer kind set to NaN, +inf, -inf or a
 * negative value (meaningless for all of them) is rejected with an error
 * that names that field first ("add_optimizer: <field> is ..."), and the
 * optimizer set before stays: the next step is that optimizer's update,
 * finite. Before these checks a NaN weight decay, momentum or clip norm and
 * an infinite lr or eps were accepted and made every parameter NaN. */
static void test_non_finite_or_negative_hyper_parameters_are_rejected_naming_the_field_and_the_optimizer_stays(void **state)
{
    (void)state;
    const alloy_optimizer kinds[] = {
        alloy_sgd(0.125, 0.5, 0.0625, false),
        alloy_adam(0.125, 0.9, 0.999, 1e-8, 0.0625),
        alloy_adamw(0.125, 0.9, 0.999, 1e-8, 0.0625),
    };
    const double bad_values[] = {NAN, INFINITY, -INFINITY, -1};
    enum { LR, WD, MOMENTUM, BETA1, BETA2, EPS, MIN_LR, CLIP, NFIELDS };
    static const char *const field_names[NFIELDS] = {"lr", "weight_decay", "momentum", "beta1", "beta2",
                                                     "eps", "min_lr", "clip_norm"};
    alloy_optimizer set = alloy_sgd(0.125, 0, 0, false);
    alloy_graph *g = quad_graph(&set, NULL);
    int cases = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        for (int f = 0; f < NFIELDS; f++) {
            bool adam = kinds[k].kind != ALLOY_OPTIM_SGD;
            if (f == MOMENTUM ? adam : (f == BETA1 || f == BETA2 || f == EPS) && !adam) continue; /* unused */
            for (size_t v = 0; v < sizeof bad_values / sizeof *bad_values; v++) {
                alloy_optimizer o = kinds[k];
                double *field[NFIELDS] = {&o.lr, &o.weight_decay, &o.momentum, &o.beta1,
                                          &o.beta2, &o.eps, &o.min_lr, &o.clip_norm};
                *field[f] = bad_values[v];
                char want[64];
                snprintf(want, sizeof want, "add_optimizer: %s is ", field_names[f]);
                alloy_status st = alloy_graph_add_optimizer(g, o);
                cases++;
                if (st != ALLOY_ERR_INVALID || strncmp(alloy_last_error(g), want, strlen(want)) != 0)
                    case_failed("kind %d, %s = %g: %s \"%s\", expected invalid argument starting \"%s\"",
                                (int)o.kind, field_names[f], bad_values[v], alloy_status_name(st),
                                st ? alloy_last_error(g) : "", want);
            }
        }
    }
    /* the integer fields */
    struct {
        const char *field;
        int warmup, total, accumulation;
    } ints[] = {{"warmup_steps", -1, 0, 1}, {"total_steps", 0, -5, 1}, {"accumulation_steps", 0, 0, -2}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        alloy_optimizer o = kinds[1];
        o.warmup_steps = ints[i].warmup, o.total_steps = ints[i].total, o.accumulation_steps = ints[i].accumulation;
        char want[64];
        snprintf(want, sizeof want, "add_optimizer: %s is ", ints[i].field);
        alloy_status st = alloy_graph_add_optimizer(g, o);
        cases++;
        if (st != ALLOY_ERR_INVALID || strncmp(alloy_last_error(g), want, strlen(want)) != 0)
            case_failed("%s: %s \"%s\", expected invalid argument starting \"%s\"", ints[i].field,
                        alloy_status_name(st), st ? alloy_last_error(g) : "", want);
    }
    /* one message whole, as docs/errors.md gives it */
    if (alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0, NAN, false)) != ALLOY_ERR_INVALID ||
        strcmp(alloy_last_error(g), "add_optimizer: weight_decay is nan; it must be finite and >= 0") != 0)
        case_failed("NaN weight decay: \"%s\"", alloy_last_error(g));
    alloy_optimizer odd = kinds[0];
    odd.schedule = (alloy_lr_schedule)7;
    if (alloy_graph_add_optimizer(g, odd) != ALLOY_ERR_INVALID ||
        strcmp(alloy_last_error(g), "add_optimizer: unknown schedule 7") != 0)
        case_failed("schedule 7: \"%s\"", alloy_last_error(g));
    print_message("%d bad hyper-parameters rejected; e.g. %s\n", cases, alloy_last_error(g));
    /* the optimizer set first is the one that runs: SGD, lr 1/8, one step */
    double x[NP], p0[NP], p1[NP], want[NP];
    random_x(x);
    read_pair(g, "", p0);
    run_x(g, x, NULL, 0);
    read_pair(g, "", p1);
    for (int i = 0; i < NP; i++) want[i] = p0[i] - 0.125 * (x[i] + p0[i]);
    close_all("parameters after the step of the optimizer set first", p1, want, NP, REL);
    alloy_graph_free(g);
    /* the edges of each range are accepted: zeros where 0 is meaningful */
    g = quad_graph(NULL, NULL);
    alloy_optimizer edge = alloy_adamw(0, 0, 0, 1e-30, 0);
    edge.accumulation_steps = 0; /* a zeroed struct: one micro-batch */
    expect_ok(g, alloy_graph_add_optimizer(g, edge), "add_optimizer (range edges)");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0, 0, 0, false)), "add_optimizer (range edges)");
    alloy_graph_free(g);
    finish();
}

/* f64 parameters in PyTorch are updated with the learning rate as a double:
 * lr = 0.1 moves p by exactly 0.1 * d in f64 arithmetic. A learning rate
 * rounded to f32 (0.10000000149) is off by 1.5e-8 relative, far beyond the
 * f64 bound. */
static void test_f64_parameters_are_updated_with_the_learning_rate_in_f64(void **state)
{
    (void)state;
    check_optimizer(alloy_sgd(0.1, 0, 0, false), 1);
    check_optimizer(alloy_adam(0.001, 0.9, 0.999, 1e-8, 0), 1);
    check_optimizer(alloy_adamw(0.003, 0.9, 0.999, 1e-8, 0.01), 3);
    finish();
}

/* The gradient norm's sum_squares (one node over every f32 gradient; two
 * launches on CUDA) gives on the CPU the bits of the chain it replaced in
 * the optimizer pass: square, reduce_sum in f32, cast to f64, f64 adds in
 * order; and the f64 sum of squares within f32's bound. */
static void test_sum_squares_gives_the_bits_of_square_reduce_sum_cast_and_add(void **state)
{
    (void)state;
    char dir[64];
    assert_true(test_make_dir(dir, sizeof dir, "/tmp/alloy-optim-XXXXXX"));
    const char *path = test_path_in(dir, "ssq.ir");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("graph ssq {\n  %a = input : f32[3,1000]\n  %b = input : f32[17]\n  %c = input : f32[40000]\n"
          "  %s = sum_squares(%a, %b, %c) : f64[]\n"
          "  %qa = square(%a) : f32[3,1000]\n  %ra = reduce_sum(%qa) : f32[]\n  %fa = cast(%ra) : f64[]\n"
          "  %qb = square(%b) : f32[17]\n  %rb = reduce_sum(%qb) : f32[]\n  %fb = cast(%rb) : f64[]\n"
          "  %qc = square(%c) : f32[40000]\n  %rc = reduce_sum(%qc) : f32[]\n  %fc = cast(%rc) : f64[]\n"
          "  %t0 = add(%fa, %fb) : f64[]\n  %t = add(%t0, %fc) : f64[]\n"
          "  output \"s\" = %s\n  output \"t\" = %t\n}\n",
          f);
    fclose(f);
    char err[512];
    alloy_graph *g = alloy_graph_load_ir(path, err, sizeof err);
    if (!g) fail_msg("%s", err);
    static float a[3000], b[17], c[40000];
    double exact = 0;
    for (int i = 0; i < 3000; i++) a[i] = (float)(test_uniform(-3, 3)), exact += (double)a[i] * a[i];
    for (int i = 0; i < 17; i++) b[i] = (float)(test_uniform(-1e3, 1e3)), exact += (double)b[i] * b[i];
    for (int i = 0; i < 40000; i++) c[i] = (float)(test_uniform(-1e-2, 1e-2)), exact += (double)c[i] * c[i];
    alloy_host_tensor feeds[3] = {{"a", ALLOY_F32, 2, {3, 1000}, a}, {"b", ALLOY_F32, 1, {17}, b},
                                  {"c", ALLOY_F32, 1, {40000}, c}};
    alloy_host_tensor fetch[2] = {{.name = "s"}, {.name = "t"}};
    expect_ok(g, alloy_graph_run(g, feeds, 3, fetch, 2), "alloy_graph_run");
    double got = fetched_scalar(&fetch[0]), chain = fetched_scalar(&fetch[1]);
    assert_memory_equal(&got, &chain, sizeof got);
    close_all("sum_squares", &got, &exact, 1, REL_F32);
    alloy_graph_free(g);
    test_remove_dir(dir);
    finish();
}

#define TEST(f) cmocka_unit_test_setup_teardown(f, test_checked_alloc, test_plain_alloc)

int main(void)
{
    test_rng = 0x0b7e151628aed2a6u;
    const struct CMUnitTest tests[] = {
        TEST(test_sgd_plain_momentum_nesterov_and_weight_decay_match_pytorch_over_one_and_three_steps),
        TEST(test_adam_with_l2_weight_decay_matches_pytorch_over_one_and_three_steps),
        TEST(test_adamw_decays_the_weights_decoupled_from_the_gradient_as_pytorch_does),
        TEST(test_clipping_scales_gradients_by_clip_over_the_global_norm_only_when_the_norm_exceeds_it),
        TEST(test_clipping_under_a_loss_scale_uses_the_unscaled_gradient_norm),
        TEST(test_learning_rate_schedules_follow_their_formulas_step_by_step_and_hold_min_lr_after_total_steps),
        TEST(test_warmup_cosine_without_warmup_decays_from_the_first_update),
        TEST(test_a_skipped_step_does_not_advance_the_learning_rate_schedule),
        TEST(test_gradient_accumulation_over_three_micro_batches_equals_one_step_on_the_mean_gradient),
        TEST(test_accumulation_with_a_scaler_keeps_the_scale_within_a_step_and_an_inf_in_any_micro_batch_skips_it),
        TEST(test_grad_norm_is_not_finite_when_a_gradient_is_inf_or_nan),
        TEST(test_optimizer_parameters_out_of_range_are_rejected_with_a_message),
        TEST(test_non_finite_or_negative_hyper_parameters_are_rejected_naming_the_field_and_the_optimizer_stays),
        TEST(test_f64_parameters_are_updated_with_the_learning_rate_in_f64),
        TEST(test_sum_squares_gives_the_bits_of_square_reduce_sum_cast_and_add),
    };
    return cmocka_run_group_tests_name("optim", tests, NULL, NULL);
}
