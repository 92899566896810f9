/* grad_scaler.c - dynamic loss scaling and gradient accumulation: unscale, found_inf, skip, scale update.
 *
 * Runs after autodiff (which seeded the backward with the state "scaler.scale"
 * when a scaler is set). After this pass, when training:
 *   - every "grad:<name>" output holds the UNSCALED gradient (g * f32(1/scale)),
 *     averaged over the micro-batches of the step when accumulating;
 *   - "step.found_inf" (bool) says some unscaled gradient of this step had an
 *     inf/NaN (with accumulation: reported on the step's last micro-batch), "step.apply" (bool) says the optimizer must update on this run
 *     (last micro-batch and all finite); the optimizer pass gates on it;
 *   - the scale and growth tracker follow PyTorch's GradScaler exactly:
 *     inf/NaN -> scale *= backoff (not below min_scale), tracker = 0;
 *     else tracker += 1 and at growth_interval scale *= growth when the
 *     grown scale is finite, tracker = 0. With accumulation they change only
 *     on the last micro-batch, from the inf/NaN seen over all of them;
 *   - with hysteresis H > 1 (Megatron's DynamicGradScaler): the state
 *     "scaler.hysteresis_tracker" starts at H, an inf/NaN step counts it
 *     down (not below 0) and backs off only when it is 0, a growth refills it;
 *   - with a stop rule (max_consecutive_skips, stop_at_min_scale) the output
 *     "scaler.diverged" says which one this step reached (DIVERGED_*), and
 *     such a step writes the scaler's state of the last good step (kept in
 *     "scaler.good.*") instead of its own: every state tensor is then as
 *     the last step that applied an update left it, bit for bit;
 *   - every state update the graph had before this pass (the forward's:
 *     batch_norm's running statistics, updates the IR declares) is
 *     where(step.apply, new, old), as the optimizer gates its own: a
 *     skipped step (and, accumulating, every micro-batch but the last)
 *     leaves that state bit for bit as it was.
 * Nothing is emitted when training has neither a scaler nor accumulation.
 */
#include <string.h>

#include "alloy/train.h"
#include "passes/grad_rules.h"
#include "passes/pass.h"

#define E2(op, a, b) ad_emit(&c, IR_OP_##op, 2, (int[]){a, b}, 0, NULL, NULL)
#define E3(op, a, b, x) ad_emit(&c, IR_OP_##op, 3, (int[]){a, b, x}, 0, NULL, NULL)

static bool is_grad_output(const ir_output *o) { return strncmp(o->name, "grad:", 5) == 0; }

/* A scalar constant of dtype. */
static int scalar(ad_ctx *c, alloy_dtype dt, double v) { return ad_scalar(c, dt, v); }

/* x cast to dtype (x itself when it already is). */
static int as_dtype(ad_ctx *c, int x, alloy_dtype dt)
{
    if (x < 0 || c->g->nodes[x]->type.dtype == dt) return x;
    ir_type t = c->g->nodes[x]->type;
    t.dtype = dt;
    return ad_emit(c, IR_OP_cast, 1, &x, 0, NULL, &t);
}

/* The scale update (PyTorch's _amp_update_scale_, with Megatron's
 * hysteresis), the skip counters, and the stop rules; see the top comment. */
static void scale_update(ad_ctx *cp, const alloy_grad_scaler *sc, int found, int is_last, int apply, int scale,
                         int f_false, int i_zero)
{
    ad_ctx c = *cp;
    ir_graph *g = c.g;
    bool dynamic = sc->kind == ALLOY_SCALER_DYNAMIC;
    bool stop_min = dynamic && sc->stop_at_min_scale && sc->min_scale > 0;
    bool stopping = sc->max_consecutive_skips > 0 || stop_min;
    int hysteresis = dynamic && sc->hysteresis > 1 ? sc->hysteresis : 1;
    int next_scale = scale, skipped = pass_state_leaf(g, STATE_SKIPPED, ALLOY_I32, 0, NULL, 0);
    int counted = E3(where, found, E2(add, skipped, scalar(&c, ALLOY_I32, 1)), skipped);
    int tracker = -1, next_tracker = -1, hyst = -1, next_hyst = -1, backoff_due = found;
    if (dynamic) {
        tracker = pass_state_leaf(g, STATE_TRACKER, ALLOY_I32, 0, NULL, 0);
        int t1 = E2(add, tracker, scalar(&c, ALLOY_I32, 1));
        int at = E2(equal, t1, scalar(&c, ALLOY_I32, sc->growth_interval));
        /* f32(scale * factor) with the product in f64, as PyTorch's kernels */
        int scale64 = as_dtype(&c, scale, ALLOY_F64);
        int grown = as_dtype(&c, E2(mul, scale64, scalar(&c, ALLOY_F64, sc->growth_factor)), ALLOY_F32);
        int grown_ok = ad_emit(&c, IR_OP_where, 3, (int[]){ad_emit(&c, IR_OP_isfinite, 1, &grown, 0, NULL, NULL), grown, scale}, 0, NULL, NULL);
        int backed = as_dtype(&c, E2(mul, scale64, scalar(&c, ALLOY_F64, sc->backoff_factor)), ALLOY_F32);
        if (sc->min_scale > 0) backed = E2(maximum, backed, scalar(&c, ALLOY_F32, sc->min_scale));
        int kept = E3(where, at, grown_ok, scale);
        if (hysteresis > 1) { /* Megatron: count down on each overflow, back off at 0, refill on growth */
            hyst = pass_state_leaf(g, STATE_HYSTERESIS, ALLOY_I32, 0, NULL, hysteresis);
            int h1 = E2(maximum, E2(sub, hyst, scalar(&c, ALLOY_I32, 1)), i_zero);
            backoff_due = E3(where, found, E2(equal, h1, i_zero), f_false);
            next_hyst = E3(where, found, h1, E3(where, at, scalar(&c, ALLOY_I32, hysteresis), hyst));
            next_scale = E3(where, backoff_due, backed, E3(where, found, scale, kept));
        } else {
            next_scale = E3(where, found, backed, kept);
        }
        next_tracker = E3(where, found, i_zero, E3(where, at, i_zero, t1));
        if (is_last >= 0) {
            next_scale = E3(where, is_last, next_scale, scale);
            next_tracker = E3(where, is_last, next_tracker, tracker);
            if (hyst >= 0) next_hyst = E3(where, is_last, next_hyst, hyst);
        }
    }
    if (is_last >= 0) counted = E3(where, is_last, counted, skipped);
    if (stopping) { /* the stop rules, and the roll back to the last good step's scaler state */
        int consec = pass_state_leaf(g, STATE_CONSEC_SKIPS, ALLOY_I32, 0, NULL, 0);
        int c1 = E3(where, found, E2(add, consec, scalar(&c, ALLOY_I32, 1)), i_zero);
        if (is_last >= 0) c1 = E3(where, is_last, c1, consec);
        int reason = i_zero;
        if (sc->max_consecutive_skips > 0)
            reason = E3(where, E2(greater_equal, c1, scalar(&c, ALLOY_I32, sc->max_consecutive_skips)),
                        scalar(&c, ALLOY_I32, DIVERGED_SKIPS), reason);
        if (stop_min) { /* DeepSpeed: a backoff due with the scale already at min_scale */
            int at_min = E2(less_equal, scale, scalar(&c, ALLOY_F32, sc->min_scale));
            reason = E3(where, E3(where, backoff_due, at_min, f_false), scalar(&c, ALLOY_I32, DIVERGED_MIN_SCALE),
                        reason);
        }
        if (is_last >= 0) reason = E3(where, is_last, reason, i_zero);
        int diverged = E2(not_equal, reason, i_zero);
        int fresh = E2(equal, consec, i_zero); /* the state as found is the last good step's */
        if (dynamic) { /* a static scale never changes: nothing to keep */
            int good_s = pass_state_leaf(g, STATE_GOOD_SCALE, ALLOY_F32, 0, NULL, sc->init_scale);
            ir_add_update(g, STATE_GOOD_SCALE, E3(where, apply, next_scale, E3(where, fresh, scale, good_s)));
            next_scale = E3(where, diverged, good_s, next_scale);
        }
        if (tracker >= 0) {
            int good_t = pass_state_leaf(g, STATE_GOOD_TRACKER, ALLOY_I32, 0, NULL, 0);
            ir_add_update(g, STATE_GOOD_TRACKER, E3(where, apply, next_tracker, E3(where, fresh, tracker, good_t)));
            next_tracker = E3(where, diverged, good_t, next_tracker);
        }
        if (hyst >= 0) {
            int good_h = pass_state_leaf(g, STATE_GOOD_HYSTERESIS, ALLOY_I32, 0, NULL, hysteresis);
            ir_add_update(g, STATE_GOOD_HYSTERESIS, E3(where, apply, next_hyst, E3(where, fresh, hyst, good_h)));
            next_hyst = E3(where, diverged, good_h, next_hyst);
        }
        /* the skips since the last good step are not counted: consec of them */
        counted = E3(where, diverged, E2(sub, skipped, consec), counted);
        ir_add_update(g, STATE_CONSEC_SKIPS, E3(where, diverged, i_zero, c1));
        ir_add_output(g, OUT_DIVERGED, reason);
        ir_add_output(g, OUT_CONSEC, c1);
    }
    if (tracker >= 0) ir_add_update(g, STATE_TRACKER, next_tracker);
    if (hyst >= 0) ir_add_update(g, STATE_HYSTERESIS, next_hyst);
    if (dynamic) ir_add_update(g, STATE_SCALE, next_scale);
    ir_add_update(g, STATE_SKIPPED, counted);
    ir_add_output(g, OUT_NEXT_SCALE, next_scale);
    ir_add_output(g, STATE_SCALE, scale);
}

alloy_status pass_grad_scaler(ir_graph **gp, const pass_options *opts)
{
    ir_graph *g = *gp;
    static const alloy_grad_scaler no_scaler = {.kind = ALLOY_SCALER_NONE};
    const alloy_grad_scaler *sc = opts->scaler ? opts->scaler : &no_scaler;
    int k = opts->optimizer && opts->optimizer->accumulation_steps > 1 ? opts->optimizer->accumulation_steps : 1;
    bool scaling = sc->kind != ALLOY_SCALER_NONE;
    if (!opts->train || (!scaling && k == 1)) return ALLOY_OK;
    ad_ctx c = {g};
    int no = g->noutputs, nforward = g->nupdates;
    int found = -1, is_last = -1;
    int scale = scaling ? ir_find_name(g, STATE_SCALE) : -1;
    if (scaling && scale < 0) return ir_error(g, ALLOY_ERR_VERIFY, "grad_scaler: no '%s' state (autodiff did not seed)", STATE_SCALE);
    int inv = scaling ? E2(div, scalar(&c, ALLOY_F32, 1.0), scale) : -1;
    /* unscale */
    int *grads = al_calloc((size_t)no + 1, sizeof(int));
    int ng = 0;
    if (!grads) return ir_error(g, ALLOY_ERR_OOM, "grad_scaler: out of memory");
    for (int i = 0; i < no && !g->status; i++) {
        if (!is_grad_output(&g->outputs[i])) continue;
        int gr = g->outputs[i].node;
        if (scaling) gr = E2(mul, gr, as_dtype(&c, inv, g->nodes[gr]->type.dtype));
        g->outputs[i].node = gr;
        grads[ng++] = gr;
    }
    if (scaling && ng) found = ad_emit(&c, IR_OP_found_inf, ng, grads, 0, NULL, NULL);
    if (scaling && ng && opts->dp_world > 0) /* data-parallel: every rank skips together, the flag agreed by MAX */
        found = ad_emit(&c, IR_OP_all_reduce, 1, &found, 1, (ir_attr[]){ir_a_str("reduce", "max")}, NULL);
    al_free(grads);
    if (scaling && !ng) found = ad_emit(&c, IR_OP_constant, 0, NULL, 1, (ir_attr[]){ir_a_float("value", 0)},
                                        &(ir_type){.dtype = ALLOY_BOOL});
    int f_false = ad_emit(&c, IR_OP_constant, 0, NULL, 1, (ir_attr[]){ir_a_float("value", 0)},
                          &(ir_type){.dtype = ALLOY_BOOL});
    int i_zero = scalar(&c, ALLOY_I32, 0);
    /* accumulation: average the unscaled gradients over k micro-batches */
    if (k > 1) {
        int micro = pass_state_leaf(g, STATE_MICRO, ALLOY_I32, 0, NULL, 0);
        int next = E2(add, micro, scalar(&c, ALLOY_I32, 1));
        is_last = E2(equal, next, scalar(&c, ALLOY_I32, k));
        ir_add_update(g, STATE_MICRO, E3(where, is_last, i_zero, next));
        for (int i = 0; i < no && !g->status; i++) {
            if (!is_grad_output(&g->outputs[i])) continue;
            const ir_type *t = &g->nodes[g->outputs[i].node]->type;
            char name[512];
            al_fmt(name, sizeof name, "%s" SUFFIX_GRAD_ACC, g->outputs[i].name + 5);
            int param = opts->dp_zero == 1 && opts->dp_world >= 1 ? ir_find_name(g, g->outputs[i].name + 5) : -1;
            if (param >= 0 && g->nodes[param]->op != IR_OP_param) param = -1; /* an input's gradient stays whole */
            int acc = param >= 0 ? dp_state_shard(g, name, &g->nodes[param]->type, opts->dp_world) /* ZeRO-1's shard */
                                 : pass_state_leaf(g, name, t->dtype, t->rank, t->dims, 0);
            int sum = E2(add, acc, g->outputs[i].node);
            ir_add_update(g, name, E3(where, is_last, scalar(&c, t->dtype, 0), sum));
            g->outputs[i].node = E2(mul, sum, scalar(&c, t->dtype, 1.0 / k));
        }
        if (scaling) { /* inf/NaN in any micro-batch of the step */
            int acc = pass_state_leaf(g, STATE_FOUND_ACC, ALLOY_BOOL, 0, NULL, 0);
            found = E3(where, acc, acc, found);
            ir_add_update(g, STATE_FOUND_ACC, E3(where, is_last, f_false, found));
        }
    }
    int apply = scaling ? (k > 1 ? E3(where, found, f_false, is_last) : E2(equal, found, f_false)) : is_last;
    if (!scaling) found = f_false;
    for (int i = 0; i < nforward && apply >= 0 && !g->status; i++) { /* the forward's state updates */
        int old = ir_find_name(g, g->updates[i].name);
        if (old >= 0) g->updates[i].node = E3(where, apply, g->updates[i].node, old);
    }
    if (scaling) scale_update(&c, sc, found, is_last, apply, scale, f_false, i_zero);
    /* reported once per step: on the micro-batch that decides it */
    if (!g->status) ir_add_output(g, OUT_FOUND_INF, k > 1 ? E3(where, is_last, found, f_false) : found);
    if (!g->status && apply >= 0) {
        ir_add_output(g, OUT_APPLY, apply);
    }
    return g->status;
}
