/* train_api.c - the public training calls: loss, training switch, input gradients, frozen params. */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "base/convert.h"
#include "runtime/graph/graph_impl.h"

/* The node behind handle t when it belongs to g, else NULL with an error. */
static ir_node *own_node(alloy_graph *g, alloy_tensor *t, const char *what)
{
    ir_node *n = (ir_node *)(void *)t;
    if (!n || n->id < 0 || n->id >= g->ir->nnodes || g->ir->nodes[n->id] != n) {
        graph_fail(g, ALLOY_ERR_INVALID, "%s: tensor is NULL or from another graph", what);
        return NULL;
    }
    return n;
}

alloy_status alloy_graph_set_loss(alloy_graph *g, alloy_tensor *loss)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (g->ir->status) return graph_built(g);
    ir_node *n = own_node(g, loss, "set_loss");
    if (!n) return g->status;
    if (n->type.rank != 0 || !ir_is_float(n->type.dtype)) { /* refused: the graph stays as it was */
        char t[96], label[64];
        ir_fmt_type(t, sizeof t, &n->type);
        return graph_fail(g, ALLOY_ERR_SHAPE, "set_loss: the loss must be a floating-point scalar; %s %s is %s",
                          ir_ops[n->op].name, ir_node_label(n, label, sizeof label), t);
    }
    g->ir->loss = n->id;
    g->training = true;
    graph_invalidate(g);
    return ALLOY_OK;
}

alloy_status alloy_graph_set_training(alloy_graph *g, bool training)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (training && g->ir->loss < 0)
        return graph_fail(g, ALLOY_ERR_INVALID, "set_training: graph '%s' has no loss", g->ir->name);
    g->training = training;
    graph_invalidate(g);
    return ALLOY_OK;
}

alloy_status alloy_graph_request_grad(alloy_graph *g, alloy_tensor *input)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (g->ir->status) return graph_built(g);
    ir_node *n = own_node(g, input, "request_grad");
    if (!n) return g->status;
    if (n->op != IR_OP_input || !ir_is_float(n->type.dtype))
        return graph_fail(g, ALLOY_ERR_INVALID, "request_grad: '%s' is not a floating-point input",
                          n->name ? n->name : ir_ops[n->op].name);
    char **names = al_realloc(g->grad_inputs, sizeof(char *) * (size_t)(g->ngrad_inputs + 1));
    if (!names) return graph_fail(g, ALLOY_ERR_OOM, "request_grad: out of memory");
    g->grad_inputs = names;
    if (!(names[g->ngrad_inputs] = al_strdup(n->name)))
        return graph_fail(g, ALLOY_ERR_OOM, "request_grad: out of memory");
    g->ngrad_inputs++;
    graph_invalidate(g);
    return ALLOY_OK;
}

alloy_status alloy_param_freeze(alloy_graph *g, alloy_tensor *param)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (g->ir->status) return graph_built(g);
    ir_node *n = own_node(g, param, "param_freeze");
    if (!n) return g->status;
    if (n->op != IR_OP_param)
        return graph_fail(g, ALLOY_ERR_INVALID, "param_freeze: '%s' is not a param",
                          n->name ? n->name : ir_ops[n->op].name);
    if (ir_attr_i(n, "frozen")) return ALLOY_OK;
    ir_attr *frozen = (ir_attr *)(uintptr_t)ir_attr_find(n, "frozen"); /* every param has it (schema default) */
    if (!frozen) return graph_fail(g, ALLOY_ERR_VERIFY, "param_freeze: '%s' lacks its frozen attribute", n->name);
    frozen->i = 1;
    graph_invalidate(g);
    return ALLOY_OK;
}

alloy_grad_scaler alloy_dynamic_scaler(void)
{
    return (alloy_grad_scaler){ALLOY_SCALER_DYNAMIC, 65536.0, 2.0, 0.5, 2000, 0.0, 0, 0, false};
}

alloy_grad_scaler alloy_static_scaler(double scale)
{
    return (alloy_grad_scaler){ALLOY_SCALER_STATIC, scale, 1.0, 1.0, 0, 0.0, 0, 0, false};
}

/* The error for a configuration field outside its range: names the call,
 * the field, the value given and the rule. */
static alloy_status field_error(alloy_graph *g, const char *call, const char *field, double v, const char *rule)
{
    return graph_fail(g, ALLOY_ERR_INVALID, "%s: %s is %g; it must be %s", call, field, v, rule);
}

/* Fails the calling function with field_error unless cond holds. */
#define CHECK_FIELD(call, s, f, cond, rule) \
    do {                                    \
        if (!(cond)) return field_error(g, call, #f, (double)(s).f, rule); \
    } while (0)

#define F32_MAX 3.4028234663852886e38 /* the largest finite f32 */
#define F32_MIN_NORMAL 1.1754943508222875e-38 /* the smallest normal f32 */

/* A scale the state tensor scaler.scale (f32) can hold and invert: a
 * normal f32 (a denormal one, 1e-45, has no finite f32 inverse: every
 * unscaled gradient is inf and every step is skipped). */
static bool f32_positive(double v) { return v >= F32_MIN_NORMAL && v <= F32_MAX; }

alloy_status alloy_graph_set_grad_scaler(alloy_graph *g, alloy_grad_scaler s)
{
    if (!g) return ALLOY_ERR_INVALID;
    const char *call = "set_grad_scaler";
    if (s.kind != ALLOY_SCALER_NONE && s.kind != ALLOY_SCALER_DYNAMIC && s.kind != ALLOY_SCALER_STATIC)
        return graph_fail(g, ALLOY_ERR_INVALID, "set_grad_scaler: unknown kind %d", (int)s.kind);
    /* each field the kind uses; a static scaler uses init_scale alone */
    if (s.kind != ALLOY_SCALER_NONE)
        CHECK_FIELD(call, s, init_scale, f32_positive(s.init_scale),
                    "a positive finite f32 of at least 1.17549e-38 (a normal f32: below it 1/scale is inf and every "
                    "step is skipped)");
    if (s.kind == ALLOY_SCALER_DYNAMIC) {
        CHECK_FIELD(call, s, growth_factor, isfinite(s.growth_factor) && s.growth_factor > 1, "finite and > 1");
        CHECK_FIELD(call, s, backoff_factor, s.backoff_factor > 0 && s.backoff_factor < 1, "in (0, 1)");
        CHECK_FIELD(call, s, growth_interval, s.growth_interval >= 1, ">= 1");
        CHECK_FIELD(call, s, min_scale, s.min_scale == 0 || f32_positive(s.min_scale),
                    "0 (none) or a positive finite f32 of at least 1.17549e-38");
    }
    /* the stop rules and hysteresis (docs/amp.md, "When a step overflows") */
    if (s.kind != ALLOY_SCALER_NONE)
        CHECK_FIELD(call, s, max_consecutive_skips, s.max_consecutive_skips >= 0, ">= 0 (0 = no limit)");
    if (s.kind == ALLOY_SCALER_DYNAMIC) {
        CHECK_FIELD(call, s, hysteresis, s.hysteresis >= 0, ">= 0 (0 or 1 = back off on every overflow)");
        if (s.stop_at_min_scale && !(s.min_scale > 0))
            return graph_fail(g, ALLOY_ERR_INVALID, "set_grad_scaler: stop_at_min_scale needs a min_scale > 0");
    }
    g->scaler = s;
    graph_invalidate(g);
    return ALLOY_OK;
}

static alloy_optimizer base_optimizer(alloy_optimizer_kind kind, double lr, double wd)
{
    return (alloy_optimizer){.kind = kind, .lr = lr, .weight_decay = wd, .accumulation_steps = 1};
}

alloy_optimizer alloy_sgd(double lr, double momentum, double weight_decay, bool nesterov)
{
    alloy_optimizer o = base_optimizer(ALLOY_OPTIM_SGD, lr, weight_decay);
    o.momentum = momentum;
    o.nesterov = nesterov;
    return o;
}

alloy_optimizer alloy_adam(double lr, double beta1, double beta2, double eps, double weight_decay)
{
    alloy_optimizer o = base_optimizer(ALLOY_OPTIM_ADAM, lr, weight_decay);
    o.beta1 = beta1, o.beta2 = beta2, o.eps = eps;
    return o;
}

alloy_optimizer alloy_adamw(double lr, double beta1, double beta2, double eps, double weight_decay)
{
    alloy_optimizer o = alloy_adam(lr, beta1, beta2, eps, weight_decay);
    o.kind = ALLOY_OPTIM_ADAMW;
    return o;
}

/* Checks the schedule's fields (those it uses) and puts the documented
 * defaults in place of the 0s that mean them. */
static alloy_status check_schedule(alloy_graph *g, alloy_optimizer *o)
{
    const char *call = "add_optimizer";
    if (o->schedule < ALLOY_LR_CONSTANT || o->schedule > ALLOY_LR_ONE_CYCLE)
        return graph_fail(g, ALLOY_ERR_INVALID, "add_optimizer: unknown schedule %d", (int)o->schedule);
    CHECK_FIELD(call, *o, warmup_steps, o->warmup_steps >= 0, ">= 0");
    CHECK_FIELD(call, *o, total_steps, o->total_steps >= 0, ">= 0");
    alloy_lr_schedule k = o->schedule;
    if ((k == ALLOY_LR_WARMUP_COSINE || k == ALLOY_LR_WARMUP_LINEAR_DECAY) && o->total_steps <= o->warmup_steps)
        return graph_fail(g, ALLOY_ERR_INVALID,
                          "add_optimizer: total_steps is %d; a %s schedule needs total_steps > warmup_steps (%d)",
                          o->total_steps, k == ALLOY_LR_WARMUP_COSINE ? "cosine" : "linear decay", o->warmup_steps);
    if (k == ALLOY_LR_STEP || k == ALLOY_LR_MULTI_STEP) {
        if (o->gamma == 0) o->gamma = 0.1;
        CHECK_FIELD(call, *o, gamma, isfinite(o->gamma) && o->gamma > 0, "finite and > 0 (0 = 0.1)");
    }
    if (k == ALLOY_LR_STEP) CHECK_FIELD(call, *o, step_size, o->step_size >= 1, ">= 1");
    if (k == ALLOY_LR_MULTI_STEP) {
        CHECK_FIELD(call, *o, nmilestones, o->nmilestones >= 1 && o->nmilestones <= ALLOY_MAX_MILESTONES,
                    "in [1, ALLOY_MAX_MILESTONES]");
        for (int i = 0; i < o->nmilestones; i++)
            if (o->milestones[i] < 1 || (i > 0 && o->milestones[i] <= o->milestones[i - 1]))
                return graph_fail(g, ALLOY_ERR_INVALID,
                                  "add_optimizer: milestones[%d] is %d; milestones must be >= 1 and increasing", i,
                                  o->milestones[i]);
    }
    if (k == ALLOY_LR_ONE_CYCLE) {
        if (o->pct_start == 0) o->pct_start = 0.3;
        if (o->div_factor == 0) o->div_factor = 25;
        if (o->final_div_factor == 0) o->final_div_factor = 1e4;
        CHECK_FIELD(call, *o, pct_start, o->pct_start > 0 && o->pct_start < 1, "in (0, 1) (0 = 0.3)");
        CHECK_FIELD(call, *o, div_factor, isfinite(o->div_factor) && o->div_factor > 0, "finite and > 0 (0 = 25)");
        CHECK_FIELD(call, *o, final_div_factor, isfinite(o->final_div_factor) && o->final_div_factor > 0,
                    "finite and > 0 (0 = 1e4)");
        /* PyTorch's phase ends, pct_start * total_steps - 1 and total_steps - 1, must be apart and past 0 */
        double end1 = o->pct_start * o->total_steps - 1;
        if (!(end1 > 0 && o->total_steps - 1.0 > end1))
            return graph_fail(g, ALLOY_ERR_INVALID,
                              "add_optimizer: total_steps is %d; a one-cycle schedule needs pct_start * total_steps "
                              "(%g) > 1 and below total_steps",
                              o->total_steps, o->pct_start * o->total_steps);
    }
    return ALLOY_OK;
}

alloy_status alloy_graph_add_optimizer(alloy_graph *g, alloy_optimizer o)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (o.kind < ALLOY_OPTIM_SGD || o.kind > ALLOY_OPTIM_ADAMW)
        return graph_fail(g, ALLOY_ERR_INVALID, "add_optimizer: unknown kind %d", (int)o.kind);
    /* every field: a NaN or an infinity in any of them would make every
     * parameter NaN after one step */
    const char *call = "add_optimizer";
    const char *non_negative = "finite and >= 0";
    CHECK_FIELD(call, o, lr, isfinite(o.lr) && o.lr >= 0, non_negative);
    CHECK_FIELD(call, o, weight_decay, isfinite(o.weight_decay) && o.weight_decay >= 0, non_negative);
    CHECK_FIELD(call, o, min_lr, isfinite(o.min_lr) && o.min_lr >= 0, non_negative);
    CHECK_FIELD(call, o, clip_norm, isfinite(o.clip_norm) && o.clip_norm >= 0, "finite and >= 0 (0 = off)");
    if (o.kind == ALLOY_OPTIM_SGD) {
        CHECK_FIELD(call, o, momentum, isfinite(o.momentum) && o.momentum >= 0, non_negative);
        if (o.nesterov && o.momentum <= 0)
            return graph_fail(g, ALLOY_ERR_INVALID, "add_optimizer: nesterov needs momentum > 0");
    } else {
        CHECK_FIELD(call, o, beta1, o.beta1 >= 0 && o.beta1 < 1, "in [0, 1)");
        CHECK_FIELD(call, o, beta2, o.beta2 >= 0 && o.beta2 < 1, "in [0, 1)");
        CHECK_FIELD(call, o, eps, isfinite(o.eps) && o.eps > 0, "finite and > 0");
    }
    alloy_status st = check_schedule(g, &o);
    if (st) return st;
    CHECK_FIELD(call, o, accumulation_steps, o.accumulation_steps >= 0, ">= 1 (0 counts as 1)");
    if (o.accumulation_steps < 1) o.accumulation_steps = 1;
    if (g->ir->status) return graph_built(g); /* the loss it needs may be what the builder error cut short */
    if (g->ir->loss < 0) return graph_fail(g, ALLOY_ERR_INVALID, "add_optimizer: set a loss first (alloy_graph_set_loss)");
    rt_state *lr = state_find(g, STATE_BASE_LR); /* kept from an earlier optimizer: it takes the new lr */
    if (lr && (st = state_write(g, lr, &o.lr))) return st;
    g->optimizer = o;
    graph_invalidate(g);
    return ALLOY_OK;
}

void step_info_nodes(alloy_graph *g)
{
    const ir_graph *c = g->compiled;
    static const char *const outputs[NSCALARS] = {
        [SCALAR_SCALE] = STATE_SCALE, [SCALAR_NEXT_SCALE] = OUT_NEXT_SCALE, [SCALAR_FOUND] = OUT_FOUND_INF,
        [SCALAR_APPLY] = OUT_APPLY,     [SCALAR_LR] = OUT_LR,                 [SCALAR_NORM] = OUT_GRAD_NORM,
        [SCALAR_DIVERGED] = OUT_DIVERGED, [SCALAR_CONSEC] = OUT_CONSEC};
    for (int k = 0; k < NSCALARS; k++) {
        int i = outputs[k] ? ir_find_output(c, outputs[k]) : -1;
        g->step_node[k] = i >= 0 ? c->outputs[i].node : -1;
    }
    g->step_node[SCALAR_LOSS] = c->loss;
    /* the counters as the step found them: their state leaves */
    g->step_node[SCALAR_COUNT] = ir_find_name(c, STATE_COUNT);
    g->step_node[SCALAR_SKIPPED] = ir_find_name(c, STATE_SKIPPED);
    for (int k = 0; k < NSCALARS; k++) {
        int id = g->step_node[k];
        if (id >= 0 && (c->nodes[id]->type.rank != 0 || alloy_dtype_size(c->nodes[id]->type.dtype) > 8))
            g->step_node[k] = -1;
    }
}

/* Step scalar k as the last run downloaded it, or def when the graph has none. */
static double step_scalar(const alloy_graph *g, int k, double def)
{
    int id = g->step_node[k];
    if (id < 0) return def;
    double v;
    cvt_load_f64(g->compiled->nodes[id]->type.dtype, &g->step_raw[k], &v, 1);
    return v;
}

/* The value of a scalar state tensor the compiled graph does not read (a
 * counter left by an earlier training compile), or def. */
static double state_scalar(alloy_graph *g, const char *name, double def)
{
    rt_state *s = state_find(g, name);
    if (!s || s->type.rank != 0 || state_host(g, s)) return def;
    double v;
    cvt_load_f64(s->type.dtype, s->cell->host, &v, 1);
    return v;
}

void step_info_capture(alloy_graph *g)
{
    alloy_step_info *s = &g->step;
    memset(s, 0, sizeof *s);
    g->step_ran = true;
    s->loss = step_scalar(g, SCALAR_LOSS, NAN);
    s->scale = step_scalar(g, SCALAR_SCALE, 1.0);
    s->next_scale = step_scalar(g, SCALAR_NEXT_SCALE, s->scale);
    s->skipped = step_scalar(g, SCALAR_FOUND, 0) != 0;
    s->updated = g->training && g->optimizer.kind && step_scalar(g, SCALAR_APPLY, 1) != 0;
    s->lr = step_scalar(g, SCALAR_LR, 0);
    s->grad_norm = step_scalar(g, SCALAR_NORM, NAN);
    /* counters after this run's updates: before + what the run added */
    double count = g->step_node[SCALAR_COUNT] >= 0 ? step_scalar(g, SCALAR_COUNT, 0) : state_scalar(g, STATE_COUNT, 0);
    double skipped = g->step_node[SCALAR_SKIPPED] >= 0 ? step_scalar(g, SCALAR_SKIPPED, 0)
                                                        : state_scalar(g, STATE_SKIPPED, 0);
    s->step = (int64_t)count + (s->updated ? 1 : 0);
    s->skipped_steps = (int64_t)skipped + (s->skipped ? 1 : 0);
    s->consecutive_skips = (int)step_scalar(g, SCALAR_CONSEC, 0);
    s->diverged = step_scalar(g, SCALAR_DIVERGED, DIVERGED_NO) != DIVERGED_NO;
}

alloy_status step_diverged(alloy_graph *g)
{
    const alloy_step_info *s = &g->step;
    if (!s->diverged) return ALLOY_OK;
    int why = (int)step_scalar(g, SCALAR_DIVERGED, DIVERGED_NO);
    char rule[128];
    if (why == DIVERGED_MIN_SCALE)
        al_fmt(rule, sizeof rule, "inf/NaN gradients with the scale at min_scale (%g), %d skipped steps in a row",
               s->scale, s->consecutive_skips);
    else
        al_fmt(rule, sizeof rule, "%d skipped steps in a row reached max_consecutive_skips (scale %g)",
               s->consecutive_skips, s->scale);
    /* the locator's line, without its scales (the message has them) */
    char where[sizeof g->overflow.summary] = "";
    if (g->overflow.found) {
        al_fmt(where, sizeof where, "; %s", g->overflow.summary);
        char *scales = strstr(where, ", scale ");
        if (scales) *scales = '\0';
    }
    return graph_fail(g, ALLOY_ERR_DIVERGED,
                      "training diverged at step %" PRId64 ": %s; the state is the last good step's (optimizer "
                      "step %" PRId64 ", scale %g)%s",
                      s->step + s->skipped_steps, rule, s->step, s->next_scale, where);
}

alloy_status alloy_graph_step_info(const alloy_graph *g, alloy_step_info *out)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!out) return graph_fail_const(g, ALLOY_ERR_INVALID, "step_info: out is NULL");
    if (!g->step_ran)
        return graph_fail_const(g, ALLOY_ERR_INVALID, "step_info: graph '%s' has run no step yet (alloy_graph_run)",
                                g->ir->name);
    *out = g->step;
    return ALLOY_OK;
}

alloy_status alloy_graph_save_checkpoint(alloy_graph *g, const char *path)
{
    return alloy_graph_save_state(g, path);
}

alloy_status alloy_graph_load_checkpoint(alloy_graph *g, const char *path)
{
    return alloy_graph_load_state(g, path);
}
