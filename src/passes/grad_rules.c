/* grad_rules.c - the gradient rule of every differentiable op (the op table's grad column). */
#include <string.h>

#include "passes/grad_rules.h"

#define TYPE(id) (&c->g->nodes[id]->type)
#define IN(j) (n->in[j])
#define E1(op, a) ad_emit(c, IR_OP_##op, 1, (int[]){a}, 0, NULL, NULL)
#define E2(op, a, b) ad_emit(c, IR_OP_##op, 2, (int[]){a, b}, 0, NULL, NULL)
#define E3(op, a, b, x) ad_emit(c, IR_OP_##op, 3, (int[]){a, b, x}, 0, NULL, NULL)
#define RULE(name) alloy_status name(ad_ctx *c, const ir_node *n, int dy, int *dx)
#define DONE return c->g->status

int ad_emit(ad_ctx *c, int op, int nin, const int *in, int nattrs, const ir_attr *attrs,
            const ir_type *declared)
{
    if (c->g->status) return -1;
    for (int i = 0; i < nin; i++)
        if (in[i] < 0) return -1;
    ir_node *node = ir_add_node(c->g, op, nin, in, nattrs, attrs, declared, NULL);
    return node ? node->id : -1;
}

int ad_scalar(ad_ctx *c, alloy_dtype dtype, double value)
{
    ir_type t = {.dtype = dtype, .rank = 0};
    ir_attr a = ir_a_float("value", value);
    return ad_emit(c, IR_OP_constant, 0, NULL, 1, &a, &t);
}

int ad_reshape(ad_ctx *c, int x, const ir_type *target)
{
    if (x < 0) return -1;
    const ir_type *t = TYPE(x);
    if (t->rank == target->rank && !memcmp(t->dims, target->dims, sizeof(int64_t) * (size_t)t->rank))
        return x;
    ir_type want = *target;
    want.dtype = t->dtype;
    return ad_emit(c, IR_OP_reshape, 1, &x, 0, NULL, &want);
}

int ad_unbroadcast(ad_ctx *c, int g, const ir_type *target)
{
    if (g < 0) return -1;
    const ir_type *t = TYPE(g);
    int lead = t->rank - target->rank;
    int64_t axes[ALLOY_MAX_RANK];
    int naxes = 0;
    for (int d = 0; d < t->rank; d++)
        if (d < lead || (target->dims[d - lead] == 1 && t->dims[d] != 1)) axes[naxes++] = d;
    if (naxes) {
        /* only leading axes summed: their sum has the target's shape, and
         * no reshape sits between it and a row group that may take it as a
         * column sum (ir_fuse_colsum) */
        ir_attr a[2] = {ir_a_ints("axes", naxes, axes), ir_a_bool("keepdims", naxes != lead)};
        g = ad_emit(c, IR_OP_reduce_sum, 1, &g, 2, a, NULL);
    }
    return ad_reshape(c, g, target);
}

/* dy reshaped with the reduced axes kept as 1 (the shape keepdims gives). */
static int keepdims_of(ad_ctx *c, const ir_node *n, int y)
{
    const ir_type *x = TYPE(IN(0));
    int naxes;
    const int64_t *axes = ir_attr_ints(n, "axes", &naxes);
    ir_type keep = *x;
    for (int d = 0; d < x->rank; d++) {
        bool reduced = !ir_attr_find(n, "axes");
        for (int i = 0; i < naxes; i++) {
            int ax;
            if (ir_norm_axis(axes[i], x->rank, &ax) && ax == d) reduced = true;
        }
        if (reduced) keep.dims[d] = 1;
    }
    return ad_reshape(c, y, &keep);
}

static int broadcast_to(ad_ctx *c, int x, const ir_type *target)
{
    if (x < 0) return -1;
    if (ir_type_eq(TYPE(x), target)) return x;
    ir_type t = *target;
    t.dtype = TYPE(x)->dtype;
    return ad_emit(c, IR_OP_broadcast_to, 1, &x, 0, NULL, &t);
}

RULE(gr_identity) { dx[0] = dy; DONE; }
RULE(gr_neg) { dx[0] = E1(neg, dy); DONE; }
RULE(gr_cast) { dx[0] = ad_emit(c, IR_OP_cast, 1, &dy, 0, NULL, TYPE(IN(0))); DONE; }
RULE(gr_reshape) { dx[0] = ad_reshape(c, dy, TYPE(IN(0))); DONE; }
RULE(gr_broadcast_to) { dx[0] = ad_unbroadcast(c, dy, TYPE(IN(0))); DONE; }

RULE(gr_add)
{
    dx[0] = ad_unbroadcast(c, dy, TYPE(IN(0)));
    dx[1] = ad_unbroadcast(c, dy, TYPE(IN(1)));
    DONE;
}

RULE(gr_sub)
{
    dx[0] = ad_unbroadcast(c, dy, TYPE(IN(0)));
    dx[1] = ad_unbroadcast(c, E1(neg, dy), TYPE(IN(1)));
    DONE;
}

RULE(gr_mul)
{
    dx[0] = ad_unbroadcast(c, E2(mul, dy, IN(1)), TYPE(IN(0)));
    dx[1] = ad_unbroadcast(c, E2(mul, dy, IN(0)), TYPE(IN(1)));
    DONE;
}

RULE(gr_div)
{
    dx[0] = ad_unbroadcast(c, E2(div, dy, IN(1)), TYPE(IN(0)));
    dx[1] = ad_unbroadcast(c, E3(div_grad_b, IN(0), IN(1), dy), TYPE(IN(1)));
    DONE;
}

RULE(gr_maximum)
{
    dx[0] = ad_unbroadcast(c, E3(maximum_grad, IN(0), IN(1), dy), TYPE(IN(0)));
    dx[1] = ad_unbroadcast(c, E3(maximum_grad, IN(1), IN(0), dy), TYPE(IN(1)));
    DONE;
}

RULE(gr_minimum)
{
    dx[0] = ad_unbroadcast(c, E3(minimum_grad, IN(0), IN(1), dy), TYPE(IN(0)));
    dx[1] = ad_unbroadcast(c, E3(minimum_grad, IN(1), IN(0), dy), TYPE(IN(1)));
    DONE;
}

RULE(gr_pow)
{
    dx[0] = ad_unbroadcast(c, E3(pow_grad_base, IN(0), IN(1), dy), TYPE(IN(0)));
    dx[1] = ad_unbroadcast(c, E3(pow_grad_exp, IN(0), n->id, dy), TYPE(IN(1)));
    DONE;
}

RULE(gr_relu) { dx[0] = E2(relu_grad, IN(0), dy); DONE; }
RULE(gr_gelu) { dx[0] = E2(gelu_grad, IN(0), dy); DONE; }
RULE(gr_gelu_tanh) { dx[0] = E2(gelu_tanh_grad, IN(0), dy); DONE; }
RULE(gr_tanh) { dx[0] = E2(tanh_grad, n->id, dy); DONE; }
RULE(gr_sigmoid) { dx[0] = E2(sigmoid_grad, n->id, dy); DONE; }
RULE(gr_silu) { dx[0] = E2(silu_grad, IN(0), dy); DONE; }
RULE(gr_exp) { dx[0] = E2(mul, dy, n->id); DONE; }
RULE(gr_log) { dx[0] = E2(div, dy, IN(0)); DONE; }
RULE(gr_sqrt) { dx[0] = E2(sqrt_grad, n->id, dy); DONE; }
RULE(gr_rsqrt) { dx[0] = E2(rsqrt_grad, n->id, dy); DONE; }
RULE(gr_square) { dx[0] = E2(square_grad, IN(0), dy); DONE; }
RULE(gr_sin) { dx[0] = E2(mul, dy, E1(cos, IN(0))); DONE; }
RULE(gr_cos) { dx[0] = E2(mul, dy, E1(neg, E1(sin, IN(0)))); DONE; }
RULE(gr_abs) { dx[0] = E2(mul, dy, E1(sign, IN(0))); DONE; } /* 0 at 0, as PyTorch */
RULE(gr_erf) { dx[0] = E2(erf_grad, IN(0), dy); DONE; }
RULE(gr_log1p) { dx[0] = E2(log1p_grad, IN(0), dy); DONE; }
RULE(gr_expm1) { dx[0] = E2(expm1_grad, n->id, dy); DONE; }
RULE(gr_softplus) { dx[0] = E2(softplus_grad, IN(0), dy); DONE; }

/* sign is piecewise constant: its gradient is zeros of x's type (not
 * nothing, so x still gets a gradient when sign is its only use) */
RULE(gr_sign)
{
    (void)dy;
    dx[0] = broadcast_to(c, ad_scalar(c, TYPE(IN(0))->dtype, 0.0), TYPE(IN(0)));
    DONE;
}

/* the backward op takes the forward's attributes (the same schema) */
RULE(gr_leaky_relu)
{
    dx[0] = ad_emit(c, IR_OP_leaky_relu_grad, 2, (int[]){IN(0), dy}, n->nattrs, n->attrs, NULL);
    DONE;
}

RULE(gr_elu)
{
    dx[0] = ad_emit(c, IR_OP_elu_grad, 2, (int[]){IN(0), dy}, n->nattrs, n->attrs, NULL);
    DONE;
}

/* dy where min <= x <= max (bounds included, as PyTorch), else 0 */
RULE(gr_clamp)
{
    dx[0] = ad_emit(c, IR_OP_clamp_grad, 2, (int[]){IN(0), dy}, n->nattrs, n->attrs, NULL);
    DONE;
}

RULE(gr_where)
{
    int zero = ad_scalar(c, TYPE(dy)->dtype, 0.0);
    dx[0] = -1; /* the condition is bool */
    dx[1] = ad_unbroadcast(c, E3(where, IN(0), dy, zero), TYPE(IN(1)));
    dx[2] = ad_unbroadcast(c, E3(where, IN(0), zero, dy), TYPE(IN(2)));
    DONE;
}

static int matmul(ad_ctx *c, int a, int b, bool ta, bool tb)
{
    ir_attr attrs[2];
    int k = 0;
    if (ta) attrs[k++] = ir_a_bool("transpose_a", true);
    if (tb) attrs[k++] = ir_a_bool("transpose_b", true);
    return ad_emit(c, IR_OP_matmul, 2, (int[]){a, b}, k, attrs, NULL);
}

/* C = op(A) op(B): dA = dC op(B)^T (transposed back when A was), dB likewise;
 * broadcast batch dims are summed away. */
RULE(gr_matmul)
{
    bool ta = ir_attr_i(n, "transpose_a"), tb = ir_attr_i(n, "transpose_b");
    int a = IN(0), b = IN(1);
    int da = ta ? matmul(c, b, dy, tb, true) : matmul(c, dy, b, false, !tb);
    int db = tb ? matmul(c, dy, a, true, ta) : matmul(c, a, dy, !ta, false);
    dx[0] = ad_unbroadcast(c, da, TYPE(a));
    dx[1] = ad_unbroadcast(c, db, TYPE(b));
    DONE;
}

RULE(gr_reduce_sum)
{
    dx[0] = broadcast_to(c, keepdims_of(c, n, dy), TYPE(IN(0)));
    DONE;
}

RULE(gr_reduce_mean)
{
    int64_t count = ir_numel(TYPE(IN(0))) / (ir_numel(&n->type) ? ir_numel(&n->type) : 1);
    int scale = ad_scalar(c, n->type.dtype, count ? 1.0 / (double)count : 0.0);
    dx[0] = E2(mul, broadcast_to(c, keepdims_of(c, n, dy), TYPE(IN(0))), scale);
    DONE;
}

RULE(gr_reduce_max)
{
    dx[0] = E3(reduce_max_grad, IN(0), keepdims_of(c, n, n->id), keepdims_of(c, n, dy));
    DONE;
}

RULE(gr_softmax)
{
    ir_attr a = ir_a_int("axis", ir_attr_i(n, "axis"));
    dx[0] = ad_emit(c, IR_OP_softmax_grad, 2, (int[]){n->id, dy}, 1, &a, NULL);
    DONE;
}

RULE(gr_log_softmax)
{
    ir_attr a = ir_a_int("axis", ir_attr_i(n, "axis"));
    dx[0] = ad_emit(c, IR_OP_log_softmax_grad, 2, (int[]){n->id, dy}, 1, &a, NULL);
    DONE;
}

/* The mean and rstd of x's rows, as layer_norm computed them: the
 * statistics its gradient reads instead of recomputing (a pass at the end of
 * autodiff, ad_place_statistics, moves them next to the forward layer_norm,
 * whose row group then stores them). */
static void kept_statistics(ad_ctx *c, const ir_node *n, int *mean, int *rstd)
{
    ir_attr eps = ir_a_float("eps", ir_attr_f(n, "eps"));
    *mean = ad_emit(c, IR_OP_layer_norm_mean, 1, &IN(0), 0, NULL, NULL);
    *rstd = ad_emit(c, IR_OP_layer_norm_rstd, 1, &IN(0), 1, &eps, NULL);
}

/* x normalized by the kept statistics, (x - mean) * rstd (mean < 0: none,
 * rms_norm's x * rstd), computed in the statistics' type as the row
 * programs compute it and rounded once to x's dtype. */
static int normalized(ad_ctx *c, int x, int mean, int rstd)
{
    if (x < 0 || rstd < 0) return -1;
    int v = x;
    if (TYPE(x)->dtype != TYPE(rstd)->dtype) { /* f16/bf16 x: the statistics are f32 */
        ir_type wide = *TYPE(x);
        wide.dtype = TYPE(rstd)->dtype;
        v = ad_emit(c, IR_OP_cast, 1, &x, 0, NULL, &wide);
    }
    if (mean >= 0) v = E2(sub, v, mean);
    v = E2(mul, v, rstd);
    return v >= 0 && TYPE(v)->dtype != TYPE(x)->dtype ? ad_emit(c, IR_OP_cast, 1, &v, 0, NULL, TYPE(x)) : v;
}

/* dx by the fused formula from the kept statistics; dgamma = sum(dy * xhat),
 * dbeta = sum(dy) over rows, given unsummed: autodiff sums them after dx is
 * accumulated, so dx and dy * xhat, which read the same rows, can be one
 * fusion group. xhat: normalized(). */
RULE(gr_layer_norm)
{
    bool affine = n->nin == 3;
    int mean, rstd;
    kept_statistics(c, n, &mean, &rstd);
    dx[0] = ad_emit(c, IR_OP_layer_norm_grad_stats, affine ? 5 : 4,
                    affine ? (int[]){IN(0), dy, mean, rstd, IN(1)} : (int[]){IN(0), dy, mean, rstd}, 0, NULL, NULL);
    if (affine) {
        dx[1] = mean < 0 ? -1 : E2(mul, dy, normalized(c, IN(0), mean, rstd));
        dx[2] = dy;
    }
    DONE;
}

/* dx from the kept rstd (as gr_layer_norm); dgamma = sum(dy * x * rstd)
 * over rows, unsummed (autodiff sums it after dx) */
RULE(gr_rms_norm)
{
    ir_attr eps = ir_a_float("eps", ir_attr_f(n, "eps"));
    bool affine = n->nin == 2;
    int rstd = ad_emit(c, IR_OP_rms_norm_rstd, 1, &IN(0), 1, &eps, NULL);
    dx[0] = ad_emit(c, IR_OP_rms_norm_grad_stats, affine ? 4 : 3,
                    affine ? (int[]){IN(0), dy, rstd, IN(1)} : (int[]){IN(0), dy, rstd}, 0, NULL, NULL);
    if (affine) {
        dx[1] = E2(mul, dy, normalized(c, IN(0), -1, rstd));
    }
    DONE;
}

RULE(gr_embedding)
{
    dx[0] = -1;
    dx[1] = ad_emit(c, IR_OP_embedding_grad, 2, (int[]){IN(0), dy}, 0, NULL, TYPE(IN(1)));
    DONE;
}

RULE(gr_transpose)
{
    int np;
    const int64_t *perm = ir_attr_ints(n, "perm", &np);
    int64_t inv[ALLOY_MAX_RANK];
    for (int i = 0; i < np; i++) inv[perm[i]] = i;
    ir_attr a = ir_a_ints("perm", np, inv);
    dx[0] = ad_emit(c, IR_OP_transpose, 1, &dy, 1, &a, NULL);
    DONE;
}

/* The op's axis attribute normalized for its first operand (parsed IR may
 * say axis=-1). */
static int norm_axis(ad_ctx *c, const ir_node *n)
{
    int ax = 0;
    ir_norm_axis(ir_attr_i(n, "axis"), TYPE(IN(0))->rank, &ax);
    return ax;
}

RULE(gr_slice)
{
    int ax = norm_axis(c, n);
    int64_t dim = TYPE(IN(0))->dims[ax];
    ir_attr a[3] = {ir_a_int("axis", ax), ir_a_int("before", ir_attr_i(n, "start")),
                    ir_a_int("after", dim - ir_attr_i(n, "end"))};
    dx[0] = ad_emit(c, IR_OP_pad, 1, &dy, 3, a, NULL);
    DONE;
}

RULE(gr_concat)
{
    int ax = norm_axis(c, n);
    int64_t start = 0;
    for (int j = 0; j < n->nin; j++) {
        int64_t len = TYPE(IN(j))->dims[ax];
        ir_attr a[3] = {ir_a_int("axis", ax), ir_a_int("start", start), ir_a_int("end", start + len)};
        dx[j] = ad_emit(c, IR_OP_slice, 1, &dy, 3, a, NULL);
        start += len;
    }
    DONE;
}

RULE(gr_causal_mask)
{
    ir_attr a = ir_a_float("value", 0.0);
    dx[0] = ad_emit(c, IR_OP_causal_mask, 1, &dy, 1, &a, NULL);
    DONE;
}

/* dropout's gradient is dropout of dy under the same key (attributes and
 * step operand): the forward's mask drawn again, never stored */
RULE(gr_dropout)
{
    int in[2] = {dy, n->nin > 1 ? IN(1) : 0};
    dx[0] = ad_emit(c, IR_OP_dropout, n->nin, in, n->nattrs, n->attrs, NULL);
    DONE;
}

/* the table: ops.def's grad_rule column, `none` -> NULL */
#define gr_none NULL
const ad_rule ad_rules[IR_OP_COUNT] = {
#define OP(nm, mn, mx, at, ty, cpu, amp, grad) [IR_OP_##nm] = gr_##grad,
#define EW(nm, nin, at, ty, amp, grad, expr) [IR_OP_##nm] = gr_##grad,
#include "ir/ops.def"
#undef OP
#undef EW
};

/* batch_norm and group_norm reach autodiff only when the pass that lowers them did not run */
RULE(gr_lowered)
{
    (void)dy, (void)dx;
    char label[32];
    return ir_error(c->g, ALLOY_ERR_VERIFY, "autodiff: %s %s was not lowered (the lower_norm pass lowers it before autodiff)",
                    ir_ops[n->op].name, ir_node_label(n, label, sizeof label));
}
