/* typerules_conv.c - the type rules of the convolutions and pools and their backward ops, and the geometry they share (conv.h). */
#include <string.h>

#include "ir/conv.h"
#include "ir/typerules.h"

/* whether op is a convolution or one of its backward ops (they have a weight) */
static bool is_conv(int op) { return op == IR_OP_conv1d || op == IR_OP_conv2d || op == IR_OP_conv_grad_input || op == IR_OP_conv_grad_weight; }

/* Attribute `name` of n for `spatial` dims into v[0..2) (h, w; h stays
 * def when spatial is 1): absent gives def (or dflt[] when given), present it
 * must have one entry per spatial dim, each >= min. */
static alloy_status per_dim(const ir_node *n, const char *name, int spatial, int64_t def, const int64_t *dflt,
                            int64_t min, int64_t *v, char *why, size_t whylen)
{
    int count;
    const int64_t *a = ir_attr_ints(n, name, &count);
    v[0] = v[1] = def;
    if (!a) {
        if (dflt) v[0] = dflt[0], v[1] = dflt[1];
        return ALLOY_OK;
    }
    if (count != spatial) FAIL(ALLOY_ERR_INVALID, "%s needs %d entries (one per spatial dim), not %d", name, spatial, count);
    for (int i = 0; i < count; i++)
        if (a[i] < min || a[i] > ((int64_t)1 << 40))
            FAIL(ALLOY_ERR_INVALID, "%s[%d] is %lld; it must be in [%lld, 2^40]", name, i, (long long)a[i], (long long)min);
    v[2 - spatial] = a[0];
    if (spatial == 2) v[1] = a[1];
    return ALLOY_OK;
}

/* The result length of one spatial dim, or -1 when the window does not fit. */
static int64_t out_len(int64_t len, int64_t k, int64_t s, int64_t p, int64_t d)
{
    if ((double)d * (double)(k - 1) > 4e18) return -1;
    int64_t span = d * (k - 1) + 1, padded = len + 2 * p;
    return padded < span ? -1 : (padded - span) / s + 1;
}

alloy_status ir_conv_geom_of(const ir_node *n, const ir_type *x, const ir_type *w, ir_conv_geom *g, char *why,
                             size_t whylen)
{
    memset(g, 0, sizeof *g);
    int spatial = x->rank - 2;
    bool conv = is_conv(n->op);
    if (spatial != 2 && !(spatial == 1 && conv))
        FAIL(ALLOY_ERR_SHAPE, "the input must have rank %s, not %d", conv ? "3 (N, C, L) or 4 (N, C, H, W)" : "4 (N, C, H, W)",
             x->rank);
    if ((n->op == IR_OP_conv1d && spatial != 1) || (n->op == IR_OP_conv2d && spatial != 2))
        FAIL(ALLOY_ERR_SHAPE, "the input must have rank %d (%s), not %d", n->op == IR_OP_conv1d ? 3 : 4,
             n->op == IR_OP_conv1d ? "N, C, L" : "N, C, H, W", x->rank);
    g->spatial = spatial;
    g->n = x->dims[0], g->c = x->dims[1];
    g->h = spatial == 2 ? x->dims[2] : 1, g->w = x->dims[x->rank - 1];
    g->groups = 1;
    int64_t k[2] = {1, 1}, s[2], p[2], d[2];
    alloy_status st;
    if (n->op == IR_OP_adaptive_avg_pool2d || n->op == IR_OP_adaptive_avg_pool2d_grad) {
        int64_t o[2];
        if ((st = per_dim(n, "output_size", 2, 1, NULL, 1, o, why, whylen))) return st;
        if (!ir_attr_find(n, "output_size")) FAIL(ALLOY_ERR_INVALID, "needs attribute output_size");
        if (g->h < 1 || g->w < 1) FAIL(ALLOY_ERR_SHAPE, "the input's spatial dims must be >= 1, not %lldx%lld", (long long)g->h, (long long)g->w);
        g->o = g->c, g->oh = o[0], g->ow = o[1];
        g->kh = g->kw = g->sh = g->sw = g->dh = g->dw = 1;
        return ALLOY_OK;
    }
    if (conv) {
        if (w->rank != x->rank) FAIL(ALLOY_ERR_SHAPE, "the weight must have rank %d, not %d", x->rank, w->rank);
        int64_t groups = ir_attr_i(n, "groups");
        if (groups < 1) FAIL(ALLOY_ERR_INVALID, "groups must be >= 1, not %lld", (long long)groups);
        g->groups = groups, g->o = w->dims[0];
        if (g->c % groups || g->o % groups)
            FAIL(ALLOY_ERR_SHAPE, "groups %lld must divide the input channels %lld and the output channels %lld", (long long)groups,
                 (long long)g->c, (long long)g->o);
        if (w->dims[1] != g->c / groups)
            FAIL(ALLOY_ERR_SHAPE, "the weight's dim 1 must be in_channels / groups = %lld, not %lld", (long long)(g->c / groups),
                 (long long)w->dims[1]);
        k[1] = w->dims[x->rank - 1];
        if (spatial == 2) k[0] = w->dims[2];
        if (k[0] < 1 || k[1] < 1) FAIL(ALLOY_ERR_SHAPE, "the kernel must be at least 1x1");
        if ((st = per_dim(n, "stride", spatial, 1, NULL, 1, s, why, whylen)) ||
            (st = per_dim(n, "padding", spatial, 0, NULL, 0, p, why, whylen)) ||
            (st = per_dim(n, "dilation", spatial, 1, NULL, 1, d, why, whylen)))
            return st;
    } else {
        if (!ir_attr_find(n, "kernel")) FAIL(ALLOY_ERR_INVALID, "needs attribute kernel");
        if ((st = per_dim(n, "kernel", 2, 1, NULL, 1, k, why, whylen)) ||
            (st = per_dim(n, "stride", 2, 1, k, 1, s, why, whylen)) ||
            (st = per_dim(n, "padding", 2, 0, NULL, 0, p, why, whylen)))
            return st;
        if (2 * p[0] > k[0] || 2 * p[1] > k[1])
            FAIL(ALLOY_ERR_INVALID, "padding [%lld,%lld] must be at most half the kernel [%lld,%lld]", (long long)p[0],
                 (long long)p[1], (long long)k[0], (long long)k[1]);
        d[0] = d[1] = 1;
        g->o = g->c;
    }
    g->kh = k[0], g->kw = k[1], g->sh = s[0], g->sw = s[1], g->ph = p[0], g->pw = p[1], g->dh = d[0], g->dw = d[1];
    g->oh = out_len(g->h, k[0], s[0], p[0], d[0]);
    g->ow = out_len(g->w, k[1], s[1], p[1], d[1]);
    if (g->oh < 1 || g->ow < 1)
        FAIL(ALLOY_ERR_SHAPE, "the window (kernel %lldx%lld, dilation %lldx%lld) does not fit the padded input %lldx%lld",
             (long long)k[0], (long long)k[1], (long long)d[0], (long long)d[1], (long long)(g->h + 2 * p[0]),
             (long long)(g->w + 2 * p[1]));
    return ALLOY_OK;
}

/* The result type [n, o, (oh,) ow] of geometry g in dtype dt. */
static ir_type result_of(const ir_conv_geom *g, alloy_dtype dt)
{
    ir_type t = {.dtype = dt, .rank = g->spatial + 2, .dims = {g->n, g->o}};
    if (g->spatial == 2) t.dims[2] = g->oh;
    t.dims[t.rank - 1] = g->ow;
    return t;
}

/* dy must be the forward's result type of geometry g */
static alloy_status check_dy(const ir_conv_geom *g, const ir_type *dy, char *why, size_t whylen)
{
    ir_type want = result_of(g, dy->dtype);
    if (!ir_type_eq(&want, dy)) {
        char a[96], b[96];
        al_fmt_dims(a, sizeof a, want.rank, want.dims);
        al_fmt_dims(b, sizeof b, dy->rank, dy->dims);
        FAIL(ALLOY_ERR_SHAPE, "dy must be %s, not %s", a, b);
    }
    return ALLOY_OK;
}

/* a floating-point dtype, and b's the same when b is given (`what` names them) */
static alloy_status same_float(const ir_type *a, const ir_type *b, const char *what, char *why, size_t whylen)
{
    if (!ir_is_float(a->dtype)) FAIL(ALLOY_ERR_DTYPE, "operands must be floating point, not %s", alloy_dtype_name(a->dtype));
    if (b && a->dtype != b->dtype)
        FAIL(ALLOY_ERR_DTYPE, "%s dtypes differ (%s vs %s)", what, alloy_dtype_name(a->dtype), alloy_dtype_name(b->dtype));
    return ALLOY_OK;
}

/* conv1d, conv2d: (x, w[, bias [o]]) of one float dtype -> [n, o, (oh,) ow] */
RULE(ty_conv)
{
    alloy_status st = same_float(in[0], in[1], "operand", why, whylen);
    if (!st && n->nin > 2) st = same_float(in[0], in[2], "operand", why, whylen);
    if (st) return st;
    ir_conv_geom g;
    if ((st = ir_conv_geom_of(n, in[0], in[1], &g, why, whylen))) return st;
    if (n->nin > 2 && (in[2]->rank != 1 || in[2]->dims[0] != g.o))
        FAIL(ALLOY_ERR_SHAPE, "the bias must be [%lld] (one per output channel)", (long long)g.o);
    *out = result_of(&g, in[0]->dtype);
    return ALLOY_OK;
}

/* conv_grad_input (dy, w) -> dx, conv_grad_weight (x, dy) -> dw: the
 * declared shape (x's, w's) in the operands' dtype */
RULE(ty_conv_grad)
{
    alloy_status st = same_float(in[0], in[1], "operand", why, whylen);
    if (st) return st;
    bool input = n->op == IR_OP_conv_grad_input;
    const ir_type *x = input ? out : in[0], *w = input ? in[1] : out, *dy = input ? in[0] : in[1];
    if (out->rank < 3 || out->rank > 4 || al_numel(out->rank, out->dims) < 0)
        FAIL(ALLOY_ERR_SHAPE, "the declared result must be a valid rank 3 or 4 shape");
    ir_conv_geom g;
    if ((st = ir_conv_geom_of(n, x, w, &g, why, whylen)) || (st = check_dy(&g, dy, why, whylen))) return st;
    out->dtype = in[0]->dtype;
    return ALLOY_OK;
}

/* the pools: x [n, c, h, w] float -> [n, c, oh, ow] */
RULE(ty_pool)
{
    alloy_status st = same_float(in[0], NULL, NULL, why, whylen);
    if (st) return st;
    ir_conv_geom g;
    if ((st = ir_conv_geom_of(n, in[0], NULL, &g, why, whylen))) return st;
    *out = result_of(&g, in[0]->dtype);
    return ALLOY_OK;
}

/* max_pool2d_grad (x, dy) -> x's type; avg_pool2d_grad and
 * adaptive_avg_pool2d_grad (dy) -> the declared shape (x's) in dy's dtype */
RULE(ty_pool_grad)
{
    bool max = n->op == IR_OP_max_pool2d_grad;
    alloy_status st = same_float(in[0], max ? in[1] : NULL, "x and dy", why, whylen);
    if (st) return st;
    const ir_type *x = max ? in[0] : out;
    if (!max && (out->rank != 4 || al_numel(out->rank, out->dims) < 0)) FAIL(ALLOY_ERR_SHAPE, "the declared result must be a valid rank 4 shape");
    ir_conv_geom g;
    if ((st = ir_conv_geom_of(n, x, NULL, &g, why, whylen)) || (st = check_dy(&g, in[max ? 1 : 0], why, whylen))) return st;
    if (max) *out = *in[0];
    else out->dtype = in[0]->dtype;
    return ALLOY_OK;
}
