/* optimizer.c - the optimizer update of every trained parameter, as graph nodes gated by step.apply.
 *
 * After this pass (when training with an optimizer): each parameter with a
 * "grad:<name>" output has an update p <- p' computed from its gradient (the
 * unscaled, accumulated one when grad_scaler ran), with SGD (momentum,
 * nesterov, weight decay) or Adam/AdamW on the parameter's own dtype (f32
 * master weights under AMP); moments are state "<name>.m", "<name>.v" or
 * "<name>.momentum"; the update counter "optim.step" advances only when the
 * update is applied; when "step.apply" exists every state update is
 * where(apply, new, old), so a skipped step leaves parameters, moments and
 * the counter bit-for-bit unchanged. The learning rate of the step is
 * computed in the graph in f64, like the bias corrections, from the base
 * rate, the state "optim.lr" (f64, set at run time by alloy_graph_set_lr),
 * and the counter by the schedule (constant; warmup then constant, cosine
 * or linear decay; step; multi-step; one-cycle), scaled per parameter by
 * its group's lr_scale, and output as "step.lr" (f64, before the scaling);
 * a group without decay gets no weight decay; the global gradient norm as
 * "step.grad_norm" (f64); with clip_norm > 0 gradients are scaled by
 * min(1, clip_norm / (norm + 1e-6)) first (PyTorch's clip_grad_norm_).
 * Updates follow PyTorch's formulas (torch.optim.SGD, Adam, AdamW).
 * Under ZeRO-1 (dp_zero = 1; data_parallel.c) each "grad:<name>" is this
 * rank's shard of the flattened, padded gradient: the update runs on the
 * same shard of the parameter, with moments of the shard's length, and the
 * updated shards are all-gathered into the parameter; the squared norm is
 * the sum over the ranks (all_reduce) of each rank's shards' sum_squares,
 * or, with clip_norm > 0, the whole gradients' (the shards all-gathered),
 * so that the clipped step is one process's bit for bit.
 */
#include <math.h>
#include <string.h>

#include "alloy/train.h"
#include "passes/grad_rules.h"
#include "passes/pass.h"

#define E1(op, a) ad_emit(c, IR_OP_##op, 1, (int[]){a}, 0, NULL, NULL)
#define E2(op, a, b) ad_emit(c, IR_OP_##op, 2, (int[]){a, b}, 0, NULL, NULL)
#define E3(op, a, b, x) ad_emit(c, IR_OP_##op, 3, (int[]){a, b, x}, 0, NULL, NULL)
#define S(dt, v) ad_scalar(c, dt, v)

static int cast_to(ad_ctx *c, int x, alloy_dtype dt)
{
    if (x < 0 || c->g->nodes[x]->type.dtype == dt) return x;
    ir_type t = c->g->nodes[x]->type;
    t.dtype = dt;
    return ad_emit(c, IR_OP_cast, 1, &x, 0, NULL, &t);
}

/* Scalars of the step (learning rate, bias corrections) are computed in f64,
 * as PyTorch computes them in Python floats, and cast once where used. */
#define F ALLOY_F64

/* Anneals from start to end as pct goes 0 -> 1 along half a cosine:
 * end + (start - end) / 2 * (1 + cos(pi pct)) (PyTorch's OneCycleLR). */
static int cos_anneal(ad_ctx *c, int start, int end, int pct)
{
    int half = E2(mul, S(F, 0.5), E2(add, S(F, 1.0), E1(cos, E2(mul, pct, S(F, M_PI)))));
    return E2(add, end, E2(mul, E2(sub, start, end), half));
}

/* min(1, max(0, x)) */
static int clamp01(ad_ctx *c, int x) { return E2(minimum, S(F, 1.0), E2(maximum, S(F, 0.0), x)); }

/* The learning rate (f64) of the update after `done` completed updates
 * (the applied-update counter: a skipped step does not move it), from the
 * base rate `base` (the state optim.lr, so alloy_graph_set_lr changes it
 * with no recompile). The formulas are docs/training.md's. */
static int learning_rate(ad_ctx *c, const alloy_optimizer *o, int done, int base)
{
    if (o->schedule == ALLOY_LR_CONSTANT) return base;
    int t = cast_to(c, done, F); /* 0-based index of this update */
    if (o->schedule == ALLOY_LR_STEP) { /* i32 division truncates: floor for t >= 0 */
        int k = cast_to(c, E2(div, done, S(ALLOY_I32, o->step_size)), F);
        return E2(mul, base, E2(pow, S(F, o->gamma), k));
    }
    if (o->schedule == ALLOY_LR_MULTI_STEP) {
        int passed = -1; /* milestones reached: t >= m */
        for (int i = 0; i < o->nmilestones; i++) {
            int hit = cast_to(c, E2(greater_equal, t, S(F, o->milestones[i])), F);
            passed = passed < 0 ? hit : E2(add, passed, hit);
        }
        return E2(mul, base, E2(pow, S(F, o->gamma), passed));
    }
    if (o->schedule == ALLOY_LR_ONE_CYCLE) { /* PyTorch's two phases, as float step counts */
        double end1 = o->pct_start * o->total_steps - 1, end2 = o->total_steps - 1.0;
        int initial = E2(div, base, S(F, o->div_factor));
        int last = E2(div, initial, S(F, o->final_div_factor));
        int up = cos_anneal(c, initial, base, E2(div, t, S(F, end1)));
        int down = cos_anneal(c, base, last, clamp01(c, E2(div, E2(sub, t, S(F, end1)), S(F, end2 - end1))));
        return E3(where, E2(less_equal, t, S(F, end1)), up, down);
    }
    int warm = o->warmup_steps;
    int lr = base;
    if (warm > 0) lr = E2(mul, lr, E2(minimum, S(F, 1.0), E2(div, E2(add, t, S(F, 1.0)), S(F, warm))));
    if (o->schedule == ALLOY_LR_WARMUP_COSINE || o->schedule == ALLOY_LR_WARMUP_LINEAR_DECAY) {
        double span = o->total_steps > warm ? o->total_steps - warm : 1;
        int progress = clamp01(c, E2(div, E2(sub, t, S(F, warm)), S(F, span)));
        int min_lr = S(F, o->min_lr);
        int decayed = o->schedule == ALLOY_LR_WARMUP_COSINE
                          ? cos_anneal(c, base, min_lr, progress)
                          : E2(add, min_lr, E2(mul, E2(sub, base, min_lr), E2(sub, S(F, 1.0), progress)));
        lr = warm > 0 ? E3(where, E2(less, t, S(F, warm)), lr, decayed) : decayed;
    }
    return lr;
}

/* A moment of p (type t): zeros of t, or under ZeRO-1 (whole, the
 * parameter's type, not NULL) this rank's shard of one of whole's type. */
static int moment(ad_ctx *c, const char *name, const ir_type *t, const ir_type *whole, int world)
{
    return whole ? dp_state_shard(c->g, name, whole, world) : pass_state_leaf(c->g, name, t->dtype, t->rank, t->dims, 0);
}

/* p' for one parameter, with learning rate lr (f64) and weight decay wd
 * (its group's); adds the moment updates itself. p is the parameter, or
 * under ZeRO-1 its shard (whole: the parameter's type, over world ranks). */
static int update_param(ad_ctx *c, const alloy_optimizer *o, const char *name, int p, int grad,
                        int lr, double wd, int step_after, int apply, const ir_type *whole, int world)
{
    const ir_type *t = &c->g->nodes[p]->type;
    alloy_dtype dt = t->dtype;
    char sname[512];
    int lr64 = lr;
    lr = cast_to(c, lr, dt);
    if (o->kind == ALLOY_OPTIM_SGD) {
        if (wd) grad = E2(add, grad, E2(mul, p, S(dt, wd)));
        int dir = grad;
        if (o->momentum) {
            al_fmt(sname, sizeof sname, "%s" SUFFIX_MOMENTUM, name);
            int buf = moment(c, sname, t, whole, world);
            int nbuf = E2(add, E2(mul, buf, S(dt, o->momentum)), grad);
            ir_add_update(c->g, sname, apply >= 0 ? E3(where, apply, nbuf, buf) : nbuf);
            dir = o->nesterov ? E2(add, grad, E2(mul, nbuf, S(dt, o->momentum))) : nbuf;
        }
        return E2(sub, p, E2(mul, dir, lr));
    }
    /* Adam / AdamW */
    if (o->kind == ALLOY_OPTIM_ADAM && wd) grad = E2(add, grad, E2(mul, p, S(dt, wd)));
    if (o->kind == ALLOY_OPTIM_ADAMW && wd) p = E2(mul, p, cast_to(c, E2(sub, S(F, 1.0), E2(mul, lr64, S(F, wd))), dt));
    al_fmt(sname, sizeof sname, "%s" SUFFIX_MOMENT1, name);
    int m = moment(c, sname, t, whole, world);
    int nm = E2(add, E2(mul, m, S(dt, o->beta1)), E2(mul, grad, S(dt, 1.0 - o->beta1)));
    ir_add_update(c->g, sname, apply >= 0 ? E3(where, apply, nm, m) : nm);
    al_fmt(sname, sizeof sname, "%s" SUFFIX_MOMENT2, name);
    int v = moment(c, sname, t, whole, world);
    int nv = E2(add, E2(mul, v, S(dt, o->beta2)), E2(mul, E1(square, grad), S(dt, 1.0 - o->beta2)));
    ir_add_update(c->g, sname, apply >= 0 ? E3(where, apply, nv, v) : nv);
    int tf = cast_to(c, step_after, F);
    int bc1 = E2(sub, S(F, 1.0), E2(pow, S(F, o->beta1), tf));
    int bc2 = E2(sub, S(F, 1.0), E2(pow, S(F, o->beta2), tf));
    /* PyTorch: denom = sqrt(v') / sqrt(bc2) + eps; p -= (lr / bc1) * m' / denom */
    int denom = E2(add, E2(div, E1(sqrt, nv), cast_to(c, E1(sqrt, bc2), dt)), S(dt, o->eps));
    return E2(sub, p, E2(mul, cast_to(c, E2(div, lr64, bc1), dt), E2(div, nm, denom)));
}

alloy_status pass_optimizer(ir_graph **gp, const pass_options *opts)
{
    ir_graph *g = *gp;
    const alloy_optimizer *o = opts->optimizer;
    if (!opts->train || !o || !o->kind) return ALLOY_OK;
    ad_ctx ctx = {g}, *c = &ctx;
    int apply_out = ir_find_output(g, OUT_APPLY);
    int apply = apply_out >= 0 ? g->outputs[apply_out].node : -1;
    int done = pass_state_leaf(g, STATE_COUNT, ALLOY_I32, 0, NULL, 0);
    int next = E2(add, done, S(ALLOY_I32, 1));
    ir_add_update(g, STATE_COUNT, apply >= 0 ? E3(where, apply, next, done) : next);
    int lr = learning_rate(c, o, done, pass_state_leaf(g, STATE_BASE_LR, F, 0, NULL, o->lr));
    /* global norm of the gradients of trained parameters: each gradient's
     * squares summed in f32, those sums added in f64; one sum_squares over
     * all of them (a multi-tensor launch on a GPU) when every gradient is
     * f32, else square, reduce_sum and cast per gradient */
    int no = g->noutputs, sumsq = -1, ngrad = 0;
    int *grads = al_calloc((size_t)no + 1, sizeof(int));
    if (!grads) return ir_error(g, ALLOY_ERR_OOM, "optimizer: out of memory");
    bool all_f32 = true;
    bool zero = opts->dp_zero == 1 && opts->dp_world >= 1;
    /* ZeRO-1 with clipping: the norm of the whole gradients, gathered from
     * the ranks' shards, so that it (and the step) is one process's bit for
     * bit; without clipping the shards' sums are added over the ranks
     * (cheaper; only the reported norm's last bits may differ) */
    bool gather = zero && o->clip_norm > 0;
    for (int i = 0; i < no; i++) {
        const char *nm = g->outputs[i].name;
        int p = strncmp(nm, "grad:", 5) ? -1 : ir_find_name(g, nm + 5);
        if (p < 0 || g->nodes[p]->op != IR_OP_param) continue;
        int gr = g->outputs[i].node;
        grads[ngrad++] = gather ? dp_unshard(c, gr, &g->nodes[p]->type, opts->dp_world) : gr;
        all_f32 &= g->nodes[gr]->type.dtype == ALLOY_F32;
    }
    if (ngrad && all_f32) sumsq = ad_emit(c, IR_OP_sum_squares, ngrad, grads, 0, NULL, NULL);
    for (int i = 0; ngrad && !all_f32 && i < ngrad && !g->status; i++) {
        int sq = cast_to(c, ad_emit(c, IR_OP_reduce_sum, 1, (int[]){E1(square, grads[i])}, 0, NULL, NULL), F);
        sumsq = sumsq < 0 ? sq : E2(add, sumsq, sq);
    }
    al_free(grads);
    if (g->status) return g->status;
    if (sumsq < 0) return ir_error(g, ALLOY_ERR_INVALID, "optimizer: no trainable parameter gets a gradient from the loss");
    if (zero && !gather) sumsq = E1(all_reduce, sumsq); /* the shards' squares of every rank */
    int norm = E1(sqrt, sumsq);
    int coef = o->clip_norm > 0 ? E2(minimum, S(F, 1.0), E2(div, S(F, o->clip_norm), E2(add, norm, S(F, 1e-6))))
                                : -1;
    for (int i = 0; i < no && !g->status; i++) {
        const char *nm = g->outputs[i].name;
        int p = strncmp(nm, "grad:", 5) ? -1 : ir_find_name(g, nm + 5);
        if (p < 0 || g->nodes[p]->op != IR_OP_param) continue;
        int grad = g->outputs[i].node;
        if (coef >= 0) grad = E2(mul, grad, cast_to(c, coef, g->nodes[p]->type.dtype));
        double lr_scale;
        bool decay;
        pg_lookup(opts->groups, opts->ngroups, nm + 5, &lr_scale, &decay);
        int plr = lr_scale == 1.0 ? lr : E2(mul, lr, S(F, lr_scale));
        int old = zero ? dp_shard_of(c, p, opts->dp_world, opts->dp_rank) : p;
        int np = update_param(c, o, nm + 5, old, grad, plr, decay ? o->weight_decay : 0.0, next, apply,
                              zero ? &g->nodes[p]->type : NULL, opts->dp_world);
        if (apply >= 0) np = E3(where, apply, np, old);
        ir_add_update(g, nm + 5, zero ? dp_unshard(c, np, &g->nodes[p]->type, opts->dp_world) : np);
    }
    if (!g->status) ir_add_output(g, OUT_LR, lr);
    if (!g->status) ir_add_output(g, OUT_GRAD_NORM, norm);
    return g->status;
}
