/* op_cases.c - the op case table (op_cases.h): the f64 references, the rows, and how a row expands into cases and draws its values. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gradcheck.h"
#include "op_cases.h"
#include "support.h"

#define PI 3.14159265358979323846

/* Evaluation bounds on the normalized error. f32: arith where only
 * correctly rounded arithmetic takes part, trans where libm functions (exp,
 * log, tanh, erf, pow) do. f16/bf16: a few ulp of the result dtype (one
 * rounding is at most 4.9e-4 resp. 3.9e-3). f64: 1e-12. Data movement and
 * leaves: exact. */
const oc_tol oc_tol_arith = {.f32 = 1e-5, .f16 = 1e-3, .bf16 = 8e-3, .f64 = 1e-12};
const oc_tol oc_tol_trans = {.f32 = 1e-4, .f16 = 1e-3, .bf16 = 8e-3, .f64 = 1e-12};
const oc_tol oc_tol_exact = {0, 0, 0, 0};
/* Gradient bounds against f64 finite differences of the reference at the
 * same (rounded) inputs. f64: gc_check's per-tensor error, GC_BOUND.
 * Rounding dtypes: the normalized error over all the case's gradient
 * elements; the backward runs in that dtype (one rounding per stored
 * value, the forward's rounded y feeding it) and a gradient summed over a
 * broadcast operand cancels. Measured over 48 seeds (OP_CASES_SEED) at most
 * 4.8e-6 (f32), 7.2e-3 (f16), 3.2e-2 (bf16); the bounds are about 4x that. */
const oc_tol oc_tol_grad = {.f32 = 2e-5, .f16 = 3e-2, .bf16 = 1.5e-1, .f64 = GC_BOUND};

/* ---- index helpers ---- */

static void unravel(const ir_type *t, int64_t flat, int64_t *idx)
{
    for (int d = t->rank - 1; d >= 0; d--) {
        idx[d] = flat % t->dims[d];
        flat /= t->dims[d];
    }
}

static int64_t ravel(const ir_type *t, const int64_t *idx)
{
    int64_t off = 0;
    for (int d = 0; d < t->rank; d++) off = off * t->dims[d] + idx[d];
    return off;
}

/* Flat index in t of the element that numpy-broadcasts to index idx of a rank-r result. */
static int64_t bcast_offset(const ir_type *t, int r, const int64_t *idx)
{
    int64_t off = 0;
    for (int d = 0; d < t->rank; d++) off = off * t->dims[d] + (t->dims[d] == 1 ? 0 : idx[d + r - t->rank]);
    return off;
}

/* outer/len/inner of t around axis a (normalized) */
static void split(const ir_type *t, int a, int64_t *outer, int64_t *len, int64_t *inner)
{
    *outer = *inner = 1;
    for (int d = 0; d < a; d++) *outer *= t->dims[d];
    for (int d = a + 1; d < t->rank; d++) *inner *= t->dims[d];
    *len = t->dims[a];
}

/* Attribute `name` of n (default def) as an axis of a rank-`rank` tensor. */
static int axis_of(const ir_node *n, const char *name, int64_t def, int rank)
{
    int64_t a = ir_attr_int(n, name, def);
    return (int)(a < 0 ? a + rank : a);
}

/* ---- elementwise ---- */

/* log(1 / (1 + exp(-x))) without overflow. */
static double log_sigmoid(double x) { return x < 0 ? x - log1p(exp(x)) : -log1p(exp(-x)); }

double ew_ref(const ir_node *n, double a, double b, double c)
{
    /* the attributes with PyTorch's defaults, written here again (not read from the schema) */
    double slope = ir_attr_float(n, "negative_slope", 0.01), alpha = ir_attr_float(n, "alpha", 1.0);
    double lo = ir_attr_float(n, "min", -INFINITY), hi = ir_attr_float(n, "max", INFINITY);
    double beta = ir_attr_float(n, "beta", 1.0), d = a - b, sign_d = isnan(d) ? d : d > 0 ? 1 : d < 0 ? -1 : 0;
    int64_t operand = ir_attr_int(n, "operand", 0);
    switch (n->op) {
    case IR_OP_neg: return -a;
    case IR_OP_add: return a + b;
    case IR_OP_sub: return a - b;
    case IR_OP_mul: return a * b;
    case IR_OP_div: return a / b;
    case IR_OP_maximum: return a > b || isnan(a) ? a : b;
    case IR_OP_minimum: return a < b || isnan(a) ? a : b;
    case IR_OP_pow: return pow(a, b);
    case IR_OP_relu: return a > 0 || isnan(a) ? a : 0;
    case IR_OP_gelu: return 0.5 * a * (1 + erf(a / sqrt(2)));
    case IR_OP_gelu_tanh: return 0.5 * a * (1 + tanh(sqrt(2 / PI) * (a + 0.044715 * a * a * a)));
    case IR_OP_tanh: return tanh(a);
    case IR_OP_sigmoid: return 1 / (1 + exp(-a));
    case IR_OP_silu: return a / (1 + exp(-a));
    case IR_OP_exp: return exp(a);
    case IR_OP_log: return log(a);
    case IR_OP_sqrt: return sqrt(a);
    case IR_OP_rsqrt: return 1 / sqrt(a);
    case IR_OP_square: return a * a;
    case IR_OP_equal: return a == b;
    case IR_OP_not_equal: return a != b;
    case IR_OP_less: return a < b;
    case IR_OP_less_equal: return a <= b;
    case IR_OP_greater: return a > b;
    case IR_OP_greater_equal: return a >= b;
    case IR_OP_where: return a != 0 ? b : c;
    case IR_OP_cos: return cos(a);
    case IR_OP_sin: return sin(a);
    case IR_OP_abs: return fabs(a);
    case IR_OP_sign: return isnan(a) ? a : a > 0 ? 1 : a < 0 ? -1 : 0;
    case IR_OP_erf: return erf(a);
    case IR_OP_log1p: return log1p(a);
    case IR_OP_expm1: return expm1(a);
    case IR_OP_softplus: return log1p(exp(a)); /* f64: exp overflows past 709 only */
    case IR_OP_leaky_relu: return a > 0 ? a : slope * a;
    case IR_OP_elu: return a > 0 ? a : alpha * expm1(a);
    case IR_OP_clamp: return isnan(a) ? a : fmin(fmax(a, lo), hi);
    case IR_OP_isfinite: return isfinite(a) ? 1 : 0;
    case IR_OP_amp_allow:
    case IR_OP_amp_deny: return a;
    /* losses of (input a, target b) per element; binary cross entropy of logit a, target b, pos_weight c */
    case IR_OP_mse_loss: return d * d;
    case IR_OP_l1_loss: return fabs(d);
    case IR_OP_smooth_l1_loss: return fabs(d) < beta ? 0.5 * d * d / beta : fabs(d) - 0.5 * beta;
    case IR_OP_binary_cross_entropy_with_logits: return -(c * b * log_sigmoid(a) + (1 - b) * log_sigmoid(-a));
    case IR_OP_mse_loss_grad: return 2 * d * c;
    case IR_OP_l1_loss_grad: return sign_d * c;
    case IR_OP_smooth_l1_loss_grad: return fabs(d) < beta ? d / beta * c : sign_d * c;
    case IR_OP_binary_cross_entropy_with_logits_grad: { /* by a, b or c */
        double sig = 1 / (1 + exp(-a));
        return operand == 0 ? sig * (c * b + 1 - b) - c * b
               : operand == 1 ? -c * log_sigmoid(a) + log_sigmoid(-a)
                              : -b * log_sigmoid(a);
    }
    /* the backward ops autodiff emits: a is the forward input or output, b or c dy */
    case IR_OP_relu_grad: return a > 0 ? b : 0;
    case IR_OP_gelu_grad: return b * (0.5 * (1 + erf(a / sqrt(2))) + a * exp(-0.5 * a * a) / sqrt(2 * PI));
    case IR_OP_gelu_tanh_grad: {
        double t = tanh(sqrt(2 / PI) * (a + 0.044715 * a * a * a));
        return b * (0.5 * (1 + t) + 0.5 * a * (1 - t * t) * sqrt(2 / PI) * (1 + 3 * 0.044715 * a * a));
    }
    case IR_OP_tanh_grad: return b * (1 - a * a);
    case IR_OP_sigmoid_grad: return b * a * (1 - a);
    case IR_OP_erf_grad: return b * 2 / sqrt(PI) * exp(-a * a);
    case IR_OP_log1p_grad: return b / (1 + a);
    case IR_OP_expm1_grad: return b * (a + 1); /* a = expm1(x) */
    case IR_OP_softplus_grad: return b / (1 + exp(-a));
    case IR_OP_leaky_relu_grad: return a > 0 ? b : slope * b;
    case IR_OP_elu_grad: return a > 0 ? b : alpha * exp(a) * b;
    case IR_OP_clamp_grad: return a >= lo && a <= hi ? b : 0;
    case IR_OP_silu_grad: return b * (1 + a * (1 - 1 / (1 + exp(-a)))) / (1 + exp(-a));
    case IR_OP_sqrt_grad: return b * 0.5 / a;
    case IR_OP_rsqrt_grad: return b * -0.5 * a * a * a;
    case IR_OP_square_grad: return 2 * a * b;
    case IR_OP_div_grad_b: return -c * a / (b * b);
    case IR_OP_pow_grad_base: return c * b * pow(a, b - 1);
    case IR_OP_pow_grad_exp: return c * b * log(a);
    case IR_OP_maximum_grad: return a > b ? c : a == b ? 0.5 * c : 0;
    case IR_OP_minimum_grad: return a < b ? c : a == b ? 0.5 * c : 0;
    case IR_OP_reduce_max_grad: return a == b ? c : 0;
    }
    fail_msg("no elementwise reference for %s", ir_ops[n->op].name);
    return 0;
}

static void ref_elementwise(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    int64_t idx[ALLOY_MAX_RANK];
    double v[3] = {0, 0, 0};
    for (int64_t i = 0; i < ir_numel(&out->type); i++) {
        unravel(&out->type, i, idx);
        for (int k = 0; k < n->nin; k++) v[k] = in[k].v[bcast_offset(&in[k].type, out->type.rank, idx)];
        out->v[i] = ew_ref(n, v[0], v[1], v[2]);
    }
}

/* ---- leaves ---- */

static void ref_leaf(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    (void)n;
    memcpy(out->v, in[0].v, sizeof(double) * (size_t)ir_numel(&out->type));
}

static void ref_constant(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    (void)in;
    int count;
    const ir_attr *values = ir_attr_find(n, "values");
    count = values ? values->n : 0;
    for (int64_t i = 0; i < ir_numel(&out->type); i++)
        out->v[i] = test_round_to(out->type.dtype, values && i < count ? values->floats[i] : ir_attr_float(n, "value", 0));
}

/* ---- linear algebra and reductions ---- */

static void ref_matmul(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    bool ta = ir_attr_int(n, "transpose_a", 0), tb = ir_attr_int(n, "transpose_b", 0);
    const ir_type *sa = &in[0].type, *sb = &in[1].type;
    int ra = sa->rank, rb = sb->rank, r = out->type.rank;
    int64_t m = sa->dims[ra - (ta ? 1 : 2)], k = sa->dims[ra - (ta ? 2 : 1)], nn = sb->dims[rb - (tb ? 2 : 1)];
    ir_type batch_a = *sa, batch_b = *sb; /* the matrix dims as 1, so only batch dims count */
    batch_a.dims[ra - 2] = batch_a.dims[ra - 1] = batch_b.dims[rb - 2] = batch_b.dims[rb - 1] = 1;
    int64_t idx[ALLOY_MAX_RANK];
    for (int64_t o = 0; o < ir_numel(&out->type); o++) {
        unravel(&out->type, o, idx);
        int64_t i = idx[r - 2], j = idx[r - 1];
        const double *a = in[0].v + bcast_offset(&batch_a, r, idx) * m * k;
        const double *b = in[1].v + bcast_offset(&batch_b, r, idx) * k * nn;
        double s = 0;
        for (int64_t l = 0; l < k; l++) s += a[ta ? l * m + i : i * k + l] * b[tb ? j * k + l : l * nn + j];
        out->v[o] = s;
    }
}

/* reduce_sum, reduce_mean, reduce_max over `axes` (absent: all); NaN wins a
 * max; an integer mean truncates (of nothing: 0), a float mean of nothing is NaN. */
static void ref_reduce(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int r = t->rank, naxes;
    const int64_t *axes = ir_attr_ints(n, "axes", &naxes);
    bool all = !ir_attr_find(n, "axes"), reduced[ALLOY_MAX_RANK];
    for (int d = 0; d < r; d++) reduced[d] = all;
    for (int a = 0; a < naxes; a++) reduced[axes[a] < 0 ? axes[a] + r : axes[a]] = true;
    int64_t count = 1, idx[ALLOY_MAX_RANK], nout = ir_numel(&out->type);
    for (int d = 0; d < r; d++) count *= reduced[d] ? t->dims[d] : 1;
    for (int64_t o = 0; o < nout; o++) out->v[o] = n->op == IR_OP_reduce_max ? -INFINITY : 0;
    for (int64_t i = 0; i < ir_numel(t); i++) {
        unravel(t, i, idx);
        int64_t o = 0;
        for (int d = 0; d < r; d++) o = reduced[d] ? o : o * t->dims[d] + idx[d];
        double v = in[0].v[i];
        if (n->op != IR_OP_reduce_max) out->v[o] += v;
        else if (!isnan(out->v[o]) && (v > out->v[o] || isnan(v))) out->v[o] = v;
    }
    for (int64_t o = 0; o < nout && n->op == IR_OP_reduce_mean; o++)
        out->v[o] = ir_is_int(t->dtype) ? (count ? trunc(out->v[o] / (double)count) : 0) : out->v[o] / (double)count;
}

/* argmax / argmin along the axis: the first NaN if there is one, else the
 * first element equal to the largest (smallest) value. */
static void ref_arg(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t outer, len, inner;
    split(t, axis_of(n, "axis", -1, t->rank), &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            const double *x = in[0].v + o * len * inner + j;
            double extreme = n->op == IR_OP_argmax ? -INFINITY : INFINITY;
            int64_t at = -1;
            for (int64_t i = 0; i < len && at < 0; i++)
                if (isnan(x[i * inner])) at = i;
            for (int64_t i = 0; i < len; i++) extreme = n->op == IR_OP_argmax ? fmax(extreme, x[i * inner]) : fmin(extreme, x[i * inner]);
            for (int64_t i = 0; i < len && at < 0; i++)
                if (x[i * inner] == extreme) at = i;
            out->v[o * inner + j] = (double)at;
        }
}

/* ---- softmax, layer_norm, cross_entropy and their gradients ---- */

static void ref_softmax(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t outer, len, inner;
    split(t, axis_of(n, "axis", -1, t->rank), &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            const double *x = in[0].v + o * len * inner + j;
            double *y = out->v + o * len * inner + j, m = -INFINITY, s = 0;
            for (int64_t i = 0; i < len; i++) m = fmax(m, x[i * inner]);
            for (int64_t i = 0; i < len; i++) s += exp(x[i * inner] - m);
            for (int64_t i = 0; i < len; i++)
                y[i * inner] = n->op == IR_OP_softmax ? exp(x[i * inner] - m) / s : x[i * inner] - m - log(s);
        }
}

/* softmax_grad: dx = y (dy - sum dy y); log_softmax_grad: dx = dy - exp(y) sum dy (along the axis). */
static void ref_softmax_grad(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    bool log_out = n->op == IR_OP_log_softmax_grad;
    int64_t outer, len, inner;
    split(t, axis_of(n, "axis", -1, t->rank), &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            const double *y = in[0].v + o * len * inner + j, *dy = in[1].v + o * len * inner + j;
            double *dx = out->v + o * len * inner + j, s = 0;
            for (int64_t i = 0; i < len; i++) s += log_out ? dy[i * inner] : dy[i * inner] * y[i * inner];
            for (int64_t i = 0; i < len; i++)
                dx[i * inner] = log_out ? dy[i * inner] - exp(y[i * inner]) * s : y[i * inner] * (dy[i * inner] - s);
        }
}

/* The mean and biased variance of a row of d values. */
static void row_moments(const double *x, int64_t d, double *mean, double *var)
{
    double m = 0, v = 0;
    for (int64_t i = 0; i < d; i++) m += x[i] / (double)d;
    for (int64_t i = 0; i < d; i++) v += (x[i] - m) * (x[i] - m) / (double)d;
    *mean = m, *var = v;
}

/* (x - mean) / sqrt(var + eps) over the last axis (biased variance), then * gamma + beta. */
static void ref_layer_norm(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t d = t->dims[t->rank - 1], rows = d ? ir_numel(t) / d : 0;
    double eps = ir_attr_float(n, "eps", 1e-5);
    for (int64_t r = 0; r < rows; r++) {
        const double *x = in[0].v + r * d;
        double mean, var;
        row_moments(x, d, &mean, &var);
        for (int64_t i = 0; i < d; i++) {
            double y = (x[i] - mean) / sqrt(var + eps);
            out->v[r * d + i] = n->nin == 3 ? y * in[1].v[i] + in[2].v[i] : y;
        }
    }
}

/* One row of layer_norm's dx from a mean m and rstd s (x's, or any given):
 * s (g - mean(g) - xhat mean(g xhat)), xhat = (x - m) s, g = dy * gamma. */
static void layer_norm_dx(const double *x, const double *dy, const double *gamma, int64_t d, double m, double s,
                          double *dx)
{
    double mg = 0, mgx = 0;
    for (int64_t i = 0; i < d; i++) {
        double g = dy[i] * (gamma ? gamma[i] : 1);
        mg += g / (double)d, mgx += g * (x[i] - m) * s / (double)d;
    }
    for (int64_t i = 0; i < d; i++) dx[i] = s * (dy[i] * (gamma ? gamma[i] : 1) - mg - (x[i] - m) * s * mgx);
}

/* dx of layer_norm, x's own statistics. */
static void ref_layer_norm_grad(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t d = t->dims[t->rank - 1], rows = d ? ir_numel(t) / d : 0;
    double eps = ir_attr_float(n, "eps", 1e-5);
    for (int64_t r = 0; r < rows; r++) {
        double mean, var;
        row_moments(in[0].v + r * d, d, &mean, &var);
        layer_norm_dx(in[0].v + r * d, in[1].v + r * d, n->nin == 3 ? in[2].v : NULL, d, mean, 1 / sqrt(var + eps),
                      out->v + r * d);
    }
}

/* The mean of each row of x over the last axis, and 1 / sqrt(biased
 * variance + eps): one value per row ([.., 1]). */
static void ref_layer_norm_stats(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t d = t->dims[t->rank - 1], rows = d ? ir_numel(t) / d : 0;
    double eps = ir_attr_float(n, "eps", 1e-5);
    for (int64_t r = 0; r < rows; r++) {
        double mean, var;
        row_moments(in[0].v + r * d, d, &mean, &var);
        out->v[r] = n->op == IR_OP_layer_norm_mean ? mean : 1 / sqrt(var + eps);
    }
}

/* dx of layer_norm from the given per-row mean and rstd (any values). */
static void ref_layer_norm_grad_stats(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t d = t->dims[t->rank - 1], rows = d ? ir_numel(t) / d : 0;
    for (int64_t r = 0; r < rows; r++)
        layer_norm_dx(in[0].v + r * d, in[1].v + r * d, n->nin == 5 ? in[4].v : NULL, d, in[2].v[r], in[3].v[r],
                      out->v + r * d);
}

/* x / sqrt(mean(x^2) + eps) over the last axis, then * gamma. */
static void ref_rms_norm(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t d = t->dims[t->rank - 1], rows = d ? ir_numel(t) / d : 0;
    double eps = ir_attr_float(n, "eps", 1e-5);
    for (int64_t r = 0; r < rows; r++) {
        const double *x = in[0].v + r * d;
        double ms = 0;
        for (int64_t i = 0; i < d; i++) ms += x[i] * x[i] / (double)d;
        for (int64_t i = 0; i < d; i++) out->v[r * d + i] = x[i] / sqrt(ms + eps) * (n->nin == 2 ? in[1].v[i] : 1);
    }
}

/* dx of rms_norm: r g - x r^3 mean(g x), r = 1 / sqrt(mean(x^2) + eps), g = dy * gamma. */
static void ref_rms_norm_grad(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t d = t->dims[t->rank - 1], rows = d ? ir_numel(t) / d : 0;
    double eps = ir_attr_float(n, "eps", 1e-5);
    for (int64_t r = 0; r < rows; r++) {
        const double *x = in[0].v + r * d, *dy = in[1].v + r * d;
        double ms = 0, gx = 0;
        for (int64_t i = 0; i < d; i++) ms += x[i] * x[i] / (double)d;
        double rs = 1 / sqrt(ms + eps);
        for (int64_t i = 0; i < d; i++) gx += dy[i] * (n->nin == 3 ? in[2].v[i] : 1) * x[i] / (double)d;
        for (int64_t i = 0; i < d; i++)
            out->v[r * d + i] = rs * dy[i] * (n->nin == 3 ? in[2].v[i] : 1) - x[i] * rs * rs * rs * gx;
    }
}

/* 1 / sqrt(mean(x^2) + eps) per row ([.., 1]). */
static void ref_rms_norm_rstd(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t d = t->dims[t->rank - 1], rows = d ? ir_numel(t) / d : 0;
    double eps = ir_attr_float(n, "eps", 1e-5);
    for (int64_t r = 0; r < rows; r++) {
        double ms = 0;
        for (int64_t i = 0; i < d; i++) ms += in[0].v[r * d + i] * in[0].v[r * d + i] / (double)d;
        out->v[r] = 1 / sqrt(ms + eps);
    }
}

/* dx of rms_norm from a given per-row r (any value, not necessarily x's):
 * r g - x r^3 mean(g x), g = dy * gamma. */
static void ref_rms_norm_grad_stats(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t d = t->dims[t->rank - 1], rows = d ? ir_numel(t) / d : 0;
    for (int64_t r = 0; r < rows; r++) {
        const double *x = in[0].v + r * d, *dy = in[1].v + r * d;
        double rs = in[2].v[r], gx = 0;
        for (int64_t i = 0; i < d; i++) gx += dy[i] * (n->nin == 4 ? in[3].v[i] : 1) * x[i] / (double)d;
        for (int64_t i = 0; i < d; i++)
            out->v[r * d + i] = rs * dy[i] * (n->nin == 4 ? in[3].v[i] : 1) - x[i] * rs * rs * rs * gx;
    }
}

/* The mean over positions of -log softmax(logits)[target]. */
static void ref_cross_entropy(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    (void)n;
    const ir_type *t = &in[0].type;
    int64_t classes = t->dims[t->rank - 1], positions = ir_numel(t) / classes;
    double loss = 0;
    for (int64_t p = 0; p < positions; p++) {
        const double *row = in[0].v + p * classes;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < classes; c++) m = fmax(m, row[c]);
        for (int64_t c = 0; c < classes; c++) s += exp(row[c] - m);
        loss += (log(s) + m - row[(int64_t)in[1].v[p]]) / (double)positions;
    }
    out->v[0] = loss;
}

/* (softmax(logits) - onehot(target)) * dloss / positions. */
static void ref_cross_entropy_grad(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    (void)n;
    const ir_type *t = &in[0].type;
    int64_t classes = t->dims[t->rank - 1], positions = ir_numel(t) / classes;
    for (int64_t p = 0; p < positions; p++) {
        const double *row = in[0].v + p * classes;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < classes; c++) m = fmax(m, row[c]);
        for (int64_t c = 0; c < classes; c++) s += exp(row[c] - m);
        for (int64_t c = 0; c < classes; c++)
            out->v[p * classes + c] = (exp(row[c] - m) / s - (c == (int64_t)in[1].v[p])) * in[2].v[0] / (double)positions;
    }
}

/* cross_entropy (of logits) and nll_loss (of log-probabilities) as PyTorch's
 * F.cross_entropy / F.nll_loss: per position not ignored, (1 - s) w[t] (-logp[t])
 * + s / C sum_c w[c] (-logp[c]); the sum, or the sum over the total w[t]. */
static void ref_row_loss(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t classes = t->rank ? t->dims[t->rank - 1] : 1, positions = classes ? ir_numel(t) / classes : 0;
    const ir_attr *ignore = ir_attr_find(n, "ignore_index");
    double s = ir_attr_float(n, "label_smoothing", 0), num = 0, den = 0;
    bool sum = strcmp(ir_attr_str(n, "reduction", "mean"), "sum") == 0;
    for (int64_t p = 0; p < positions; p++) {
        int64_t target = (int64_t)in[1].v[p];
        if (ignore && target == ignore->i) continue;
        const double *row = in[0].v + p * classes;
        double m = -INFINITY, e = 0, smooth = 0;
        for (int64_t c = 0; c < classes; c++) m = fmax(m, row[c]);
        for (int64_t c = 0; c < classes; c++) e += exp(row[c] - m);
        double lse = n->op == IR_OP_cross_entropy ? m + log(e) : 0; /* logp = x - lse */
        for (int64_t c = 0; c < classes; c++) smooth += (n->nin > 2 ? in[2].v[c] : 1) * (lse - row[c]);
        double wt = n->nin > 2 ? in[2].v[target] : 1;
        num += (1 - s) * wt * (lse - row[target]) + s / (double)classes * smooth;
        den += wt;
    }
    out->v[0] = sum ? num : num / den;
}

/* The gradients of ref_row_loss by the logits (log-probabilities), given
 * dloss and the divisor (absent: the position count):
 * (a softmax - (1 - s) w[t] onehot(t) - s / C w) dloss / divisor with
 * a = (1 - s) w[t] + s / C sum(w); nll_loss: -w[t] onehot(t) dloss / divisor. */
static void ref_row_loss_grad(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t classes = t->rank ? t->dims[t->rank - 1] : 1, positions = classes ? ir_numel(t) / classes : 0;
    const ir_attr *ignore = ir_attr_find(n, "ignore_index");
    double s = ir_attr_float(n, "label_smoothing", 0);
    double scale = in[2].v[0] / (n->nin > 3 ? in[3].v[0] : (double)positions), wsum = 0;
    for (int64_t c = 0; c < classes; c++) wsum += n->nin > 4 ? in[4].v[c] : 1;
    for (int64_t p = 0; p < positions; p++) {
        int64_t target = (int64_t)in[1].v[p];
        const double *row = in[0].v + p * classes;
        double *g = out->v + p * classes;
        if (ignore && target == ignore->i) continue; /* zeros */
        double wt = n->nin > 4 ? in[4].v[target] : 1, m = -INFINITY, e = 0;
        if (n->op == IR_OP_nll_loss_grad) {
            g[target] = -wt * scale;
            continue;
        }
        for (int64_t c = 0; c < classes; c++) m = fmax(m, row[c]);
        for (int64_t c = 0; c < classes; c++) e += exp(row[c] - m);
        double a = (1 - s) * wt + s / (double)classes * wsum;
        for (int64_t c = 0; c < classes; c++)
            g[c] = (a * exp(row[c] - m) / e - (c == target ? (1 - s) * wt : 0) -
                    s / (double)classes * (n->nin > 4 ? in[4].v[c] : 1)) * scale;
    }
}

/* ---- data movement ---- */

static void ref_embedding(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    (void)n;
    int64_t dim = in[1].type.dims[1];
    for (int64_t i = 0; i < ir_numel(&in[0].type); i++)
        for (int64_t j = 0; j < dim; j++) out->v[i * dim + j] = in[1].v[(int64_t)in[0].v[i] * dim + j];
}

/* The rows of dy summed into the rows their ids name. */
static void ref_embedding_grad(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    (void)n;
    int64_t dim = out->type.dims[1];
    for (int64_t p = 0; p < ir_numel(&in[0].type); p++)
        for (int64_t j = 0; j < dim; j++) out->v[(int64_t)in[0].v[p] * dim + j] += in[1].v[p * dim + j];
}

/* Row p is 1 at column ids[p] (the result is zeroed). */
static void ref_one_hot(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    int64_t depth = ir_attr_int(n, "depth", 0);
    for (int64_t p = 0; p < ir_numel(&in[0].type); p++) out->v[p * depth + (int64_t)in[0].v[p]] = 1;
}

static void ref_copy(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    (void)n;
    memcpy(out->v, in[0].v, sizeof(double) * (size_t)ir_numel(&out->type));
}

/* all_gather with no communicator (one rank): x once in each of `world` places */
static void ref_repeat(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    int64_t k = ir_numel(&in[0].type), world = ir_attr_int(n, "world", 1);
    for (int64_t r = 0; r < world; r++) memcpy(out->v + r * k, in[0].v, sizeof(double) * (size_t)k);
}

/* ---- convolutions and pools ---- */

/* A window op's sizes, read from the node's attributes and operand types
 * here (not from ir/conv.h): x [n, c, h, w] (h 1 for conv1d), result [n, o,
 * oh, ow] from the result (or dy) type, kernel [kh, kw]. */
typedef struct oc_win {
    int64_t n, c, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups;
} oc_win;

/* Attribute `name`'s entries (one per spatial dim) into v[0..2), height
 * first; absent: def0, def1. */
static void win_attr(const ir_node *n, const char *name, int spatial, int64_t def0, int64_t def1, int64_t *v)
{
    int k;
    const int64_t *a = ir_attr_ints(n, name, &k);
    v[0] = def0, v[1] = def1;
    if (a && spatial == 2) v[0] = a[0], v[1] = a[1];
    if (a && spatial == 1) v[1] = a[0];
}

/* x the forward's input type, y its result type, w the weight's (NULL for pools) */
static oc_win win_of(const ir_node *n, const ir_type *x, const ir_type *y, const ir_type *w)
{
    int sp = x->rank - 2;
    oc_win g = {.n = x->dims[0], .c = x->dims[1], .h = sp == 2 ? x->dims[2] : 1, .w = x->dims[x->rank - 1],
                .o = y->dims[1], .oh = sp == 2 ? y->dims[2] : 1, .ow = y->dims[y->rank - 1], .groups = 1};
    int64_t k[2] = {1, 1}, v[2];
    if (w) k[0] = sp == 2 ? w->dims[2] : 1, k[1] = w->dims[w->rank - 1];
    else win_attr(n, "kernel", 2, 1, 1, k);
    g.kh = k[0], g.kw = k[1];
    win_attr(n, "stride", sp, w ? 1 : k[0], w ? 1 : k[1], v), g.sh = v[0], g.sw = v[1];
    win_attr(n, "padding", sp, 0, 0, v), g.ph = v[0], g.pw = v[1];
    win_attr(n, "dilation", sp, 1, 1, v), g.dh = v[0], g.dw = v[1];
    if (w) g.groups = ir_attr_int(n, "groups", 1);
    return g;
}

/* The flat index of x[b, ci, iy, ix], or -1 outside (padding). */
static int64_t win_x(const oc_win *g, int64_t b, int64_t ci, int64_t iy, int64_t ix)
{
    return iy < 0 || iy >= g->h || ix < 0 || ix >= g->w ? -1 : ((b * g->c + ci) * g->h + iy) * g->w + ix;
}

/* Every term of the convolution sum(x[b, ci, oy sh - ph + ky dh, ...] w[o, ci - group start, ky, kx]):
 * which 0 adds it to y[b, o, oy, ox] (+ bias), 1 adds dy times w to dx, 2 dy times x to dw. */
static void conv_terms(const oc_win *g, int which, const double *x, const double *w, const double *dy, double *out)
{
    int64_t cg = g->c / g->groups, og = g->o / g->groups;
    for (int64_t b = 0; b < g->n; b++)
        for (int64_t o = 0; o < g->o; o++)
            for (int64_t oy = 0; oy < g->oh; oy++)
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    int64_t yi = ((b * g->o + o) * g->oh + oy) * g->ow + ox;
                    for (int64_t ci = 0; ci < cg; ci++)
                        for (int64_t ky = 0; ky < g->kh; ky++)
                            for (int64_t kx = 0; kx < g->kw; kx++) {
                                int64_t xi = win_x(g, b, o / og * cg + ci, oy * g->sh - g->ph + ky * g->dh,
                                                   ox * g->sw - g->pw + kx * g->dw);
                                int64_t wi = ((o * cg + ci) * g->kh + ky) * g->kw + kx;
                                if (xi < 0) continue;
                                if (which == 0) out[yi] += x[xi] * w[wi];
                                else if (which == 1) out[xi] += dy[yi] * w[wi];
                                else out[wi] += dy[yi] * x[xi];
                            }
                }
}

/* conv1d / conv2d (x, w[, bias]) */
static void ref_conv(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    oc_win g = win_of(n, &in[0].type, &out->type, &in[1].type);
    conv_terms(&g, 0, in[0].v, in[1].v, NULL, out->v);
    for (int64_t i = 0; n->nin > 2 && i < ir_numel(&out->type); i++) out->v[i] += in[2].v[i / (g.oh * g.ow) % g.o];
}

/* conv_grad_input (dy, w) -> dx; conv_grad_weight (x, dy) -> dw */
static void ref_conv_grad(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    if (n->op == IR_OP_conv_grad_input) {
        oc_win g = win_of(n, &out->type, &in[0].type, &in[1].type);
        conv_terms(&g, 1, NULL, in[1].v, in[0].v, out->v);
    } else {
        oc_win g = win_of(n, &in[0].type, &in[1].type, &out->type);
        conv_terms(&g, 2, in[0].v, NULL, in[1].v, out->v);
    }
}

/* The window of pool output (oy, ox): rows [*y0, *y1), columns [*x0, *x1)
 * of the padded input (may reach outside x); adaptive: PyTorch's bins. */
static void pool_window(const ir_node *n, const oc_win *g, int64_t oy, int64_t ox, int64_t *y0, int64_t *y1, int64_t *x0,
                        int64_t *x1)
{
    if (n->op == IR_OP_adaptive_avg_pool2d || n->op == IR_OP_adaptive_avg_pool2d_grad) {
        *y0 = (int64_t)floor((double)(oy * g->h) / (double)g->oh), *y1 = (int64_t)ceil((double)((oy + 1) * g->h) / (double)g->oh);
        *x0 = (int64_t)floor((double)(ox * g->w) / (double)g->ow), *x1 = (int64_t)ceil((double)((ox + 1) * g->w) / (double)g->ow);
        return;
    }
    *y0 = oy * g->sh - g->ph, *y1 = *y0 + g->kh;
    *x0 = ox * g->sw - g->pw, *x1 = *x0 + g->kw;
}

/* Each pool output's value, or (grad) dy spread back: max to the first
 * maximum of the window (a NaN wins), averages over the window's elements
 * inside x, divided by kernel size where count_include_pad (the default). */
static void pool_ref(const ir_node *n, const oc_win *g, const double *x, const double *dy, double *out, bool grad)
{
    bool max = n->op == IR_OP_max_pool2d || n->op == IR_OP_max_pool2d_grad;
    bool adaptive = n->op == IR_OP_adaptive_avg_pool2d || n->op == IR_OP_adaptive_avg_pool2d_grad;
    bool with_pad = !adaptive && !max && ir_attr_int(n, "count_include_pad", 1);
    for (int64_t b = 0; b < g->n; b++)
        for (int64_t ch = 0; ch < g->c; ch++)
            for (int64_t oy = 0; oy < g->oh; oy++)
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    int64_t yi = ((b * g->c + ch) * g->oh + oy) * g->ow + ox, y0, y1, x0, x1, best = -1, inside = 0;
                    pool_window(n, g, oy, ox, &y0, &y1, &x0, &x1);
                    double s = 0;
                    for (int64_t iy = y0; iy < y1; iy++)
                        for (int64_t ix = x0; ix < x1; ix++) {
                            int64_t xi = win_x(g, b, ch, iy, ix);
                            if (xi < 0) continue;
                            inside++;
                            if (max && (best < 0 || (!isnan(x[best]) && (isnan(x[xi]) || x[xi] > x[best])))) best = xi;
                            if (!max && !grad) s += x[xi];
                        }
                    double count = with_pad ? (double)(g->kh * g->kw) : (double)inside;
                    if (max) {
                        if (grad) out[best] += dy[yi];
                        else out[yi] = x[best];
                    } else if (!grad) {
                        out[yi] = s / count;
                    } else {
                        for (int64_t iy = y0; iy < y1; iy++)
                            for (int64_t ix = x0; ix < x1; ix++)
                                if (win_x(g, b, ch, iy, ix) >= 0) out[win_x(g, b, ch, iy, ix)] += dy[yi] / count;
                    }
                }
}

static void ref_pool(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    oc_win g = win_of(n, &in[0].type, &out->type, NULL);
    pool_ref(n, &g, in[0].v, NULL, out->v, false);
}

/* max_pool2d_grad (x, dy); avg_pool2d_grad and adaptive_avg_pool2d_grad (dy) */
static void ref_pool_grad(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    bool max = n->op == IR_OP_max_pool2d_grad;
    const oc_tensor *dy = &in[max ? 1 : 0];
    oc_win g = win_of(n, &out->type, &dy->type, NULL);
    pool_ref(n, &g, max ? in[0].v : NULL, dy->v, out->v, true);
}

/* batch_norm per channel c of x [N, C, ...] (operands x, running_mean,
 * running_var[, weight, bias]): the batch's mean and biased variance of
 * channel c when training=1, the running ones when training=0. */
static void ref_batch_norm(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t nb = t->dims[0], ch = t->dims[1], inner = 1;
    for (int d = 2; d < t->rank; d++) inner *= t->dims[d];
    double eps = ir_attr_float(n, "eps", 1e-5);
    bool training = ir_attr_int(n, "training", 1) != 0;
    for (int64_t c = 0; c < ch; c++) {
        double mean = 0, var = 0, count = (double)(nb * inner);
        for (int64_t b = 0; b < nb; b++)
            for (int64_t i = 0; i < inner; i++) mean += in[0].v[(b * ch + c) * inner + i] / count;
        for (int64_t b = 0; b < nb; b++)
            for (int64_t i = 0; i < inner; i++) {
                double d = in[0].v[(b * ch + c) * inner + i] - mean;
                var += d * d / count;
            }
        if (!training) mean = in[1].v[c], var = in[2].v[c];
        for (int64_t b = 0; b < nb; b++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t at = (b * ch + c) * inner + i;
                double y = (in[0].v[at] - mean) / sqrt(var + eps);
                out->v[at] = n->nin == 5 ? y * in[3].v[c] + in[4].v[c] : y;
            }
    }
}

/* group_norm: x [N, C, ...] normalized over each sample's C / G channels of a group, then * weight + bias per channel. */
static void ref_group_norm(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t nb = t->dims[0], ch = t->dims[1], groups = ir_attr_int(n, "num_groups", 1), inner = 1;
    for (int d = 2; d < t->rank; d++) inner *= t->dims[d];
    int64_t len = ch / groups * inner;
    double eps = ir_attr_float(n, "eps", 1e-5);
    for (int64_t r = 0; r < nb * groups; r++) {
        const double *x = in[0].v + r * len;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < len; i++) mean += x[i] / (double)len;
        for (int64_t i = 0; i < len; i++) var += (x[i] - mean) * (x[i] - mean) / (double)len;
        for (int64_t i = 0; i < len; i++) {
            int64_t c = (r % groups) * (ch / groups) + i / inner;
            double y = (x[i] - mean) / sqrt(var + eps);
            out->v[r * len + i] = n->nin == 3 ? y * in[1].v[c] + in[2].v[c] : y;
        }
    }
}

/* torch.gather: out[p] = x[p with coordinate `axis` = index[p]]; gather_grad
 * (index, dy) adds dy[p] there instead. */
static void ref_gather(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    bool grad = n->op == IR_OP_gather_grad;
    const oc_tensor *x = grad ? out : &in[0], *index = grad ? &in[0] : &in[1];
    int ax = axis_of(n, "axis", 0, x->type.rank);
    int64_t idx[ALLOY_MAX_RANK];
    for (int64_t p = 0; p < ir_numel(&index->type); p++) {
        unravel(&index->type, p, idx);
        idx[ax] = (int64_t)index->v[p];
        if (grad) out->v[ravel(&x->type, idx)] += in[1].v[p];
        else out->v[p] = x->v[ravel(&x->type, idx)];
    }
}

/* torch.index_select: slice k of out along axis is slice index[k] of x;
 * index_select_grad (index, dy) adds slice k of dy into slice index[k]. */
static void ref_index_select(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    bool grad = n->op == IR_OP_index_select_grad;
    const oc_tensor *index = grad ? &in[0] : &in[1], *y = grad ? &in[1] : out;
    const ir_type *xt = grad ? &out->type : &in[0].type;
    int ax = axis_of(n, "axis", 0, xt->rank);
    int64_t idx[ALLOY_MAX_RANK];
    for (int64_t p = 0; p < ir_numel(&y->type); p++) {
        unravel(&y->type, p, idx);
        idx[ax] = (int64_t)index->v[idx[ax]];
        if (grad) out->v[ravel(xt, idx)] += in[1].v[p];
        else out->v[p] = in[0].v[ravel(xt, idx)];
    }
}

/* start + i * step, rounded to the dtype */
static void ref_arange(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    (void)in;
    double start = ir_attr_float(n, "start", 0), step = ir_attr_float(n, "step", 1);
    for (int64_t i = 0; i < ir_numel(&out->type); i++) out->v[i] = test_round_to(out->type.dtype, start + (double)i * step);
}

/* the sums of x along axis up to each element (from the end when reverse) */
static void ref_cumsum(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &in[0].type;
    int64_t outer, len, inner;
    split(t, axis_of(n, "axis", 0, t->rank), &outer, &len, &inner);
    bool reverse = ir_attr_int(n, "reverse", 0) != 0;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++)
            for (int64_t i = 0; i < len; i++) {
                double s = 0;
                for (int64_t k = reverse ? i : 0; k < (reverse ? len : i + 1); k++) s += in[0].v[(o * len + k) * inner + j];
                out->v[(o * len + i) * inner + j] = s;
            }
}

/* ---- attention ---- */

/* Naive softmax attention of one (batch, head) in f64: p[i * S + j] the
 * probabilities of scale q k^T, 0 where causal hides j > i + S - T (a row
 * that sees no column is all 0). */
static void attention_probs(const ir_node *n, const double *q, const double *k, int64_t T, int64_t S, int64_t D,
                            double *p)
{
    bool causal = ir_attr_i(n, "causal") != 0;
    double scale = ir_attr_f(n, "scale");
    for (int64_t i = 0; i < T; i++) {
        double m = -INFINITY, sum = 0;
        int64_t end = causal ? i + S - T + 1 : S;
        for (int64_t j = 0; j < S; j++) {
            double dot = 0;
            for (int64_t d = 0; d < D; d++) dot += q[i * D + d] * k[j * D + d];
            p[i * S + j] = j < end ? dot * scale : -INFINITY;
            m = fmax(m, p[i * S + j]);
        }
        for (int64_t j = 0; j < S; j++) sum += p[i * S + j] = j < end ? exp(p[i * S + j] - m) : 0;
        for (int64_t j = 0; j < S; j++) p[i * S + j] = sum > 0 ? p[i * S + j] / sum : 0;
    }
}

/* attention(q, k, v): p v per (batch, head). attention_grad(q, k, v, o, do):
 * [dq; dk; dv] along axis 2 with dv = p^T do, ds = p (do v^T - rowsum(do o)),
 * dq = scale ds k, dk = scale ds^T q. */
static void ref_attention(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const int64_t *qd = in[0].type.dims;
    int64_t T = qd[2], S = in[1].type.dims[2], D = qd[3], td = T * D, sd = S * D;
    double scale = ir_attr_f(n, "scale");
    bool grad = n->op == IR_OP_attention_grad;
    double *p = malloc(sizeof(double) * (size_t)(T * S + 1));
    assert_non_null(p);
    for (int64_t bh = 0; bh < qd[0] * qd[1]; bh++) {
        const double *q = in[0].v + bh * td, *k = in[1].v + bh * sd, *v = in[2].v + bh * sd;
        attention_probs(n, q, k, T, S, D, p);
        if (!grad) {
            for (int64_t i = 0; i < T; i++)
                for (int64_t j = 0; j < S; j++)
                    for (int64_t d = 0; d < D; d++) out->v[bh * td + i * D + d] += p[i * S + j] * v[j * D + d];
            continue;
        }
        const double *o = in[3].v + bh * td, *dout = in[4].v + bh * td;
        double *dq = out->v + bh * (td + 2 * sd), *dk = dq + td, *dv = dk + sd;
        for (int64_t i = 0; i < T; i++) {
            double delta = 0;
            for (int64_t d = 0; d < D; d++) delta += dout[i * D + d] * o[i * D + d];
            for (int64_t j = 0; j < S; j++) {
                double dp = 0;
                for (int64_t d = 0; d < D; d++) dp += dout[i * D + d] * v[j * D + d];
                double ds = p[i * S + j] * (dp - delta) * scale;
                for (int64_t d = 0; d < D; d++) {
                    dv[j * D + d] += p[i * S + j] * dout[i * D + d];
                    dq[i * D + d] += ds * k[j * D + d];
                    dk[j * D + d] += ds * q[i * D + d];
                }
            }
        }
    }
    free(p);
}

/* ---- random ops ---- */

/* Philox 4x32-10 written again from Salmon et al., "Parallel random
 * numbers: as easy as 1, 2, 3" (SC11), not from src/base/random.h: ten
 * rounds of two 32x32->64 multiplies, the key bumped by the golden-ratio
 * constants before every round after the first. */
static void philox_ref(uint32_t ctr[4], const uint32_t key_in[2])
{
    uint32_t key[2] = {key_in[0], key_in[1]};
    for (int round = 0; round < 10; round++) {
        if (round > 0) key[0] += 0x9E3779B9u, key[1] += 0xBB67AE85u;
        uint64_t prod0 = (uint64_t)0xD2511F53u * ctr[0], prod1 = (uint64_t)0xCD9E8D57u * ctr[2];
        uint32_t next[4] = {(uint32_t)(prod1 >> 32) ^ ctr[1] ^ key[0], (uint32_t)prod1,
                            (uint32_t)(prod0 >> 32) ^ ctr[3] ^ key[1], (uint32_t)prod0};
        memcpy(ctr, next, sizeof next);
    }
}

/* uniform and normal as docs/ir.md defines them: element i draws the words
 * of counter (i, i >> 32, stream, step) under key (seed, seed >> 32); a
 * uniform u has the top 24 bits of word 0 (f64: 27 of word 0 and 26 of
 * word 1), normal is Box-Muller's cosine branch of two 53-bit uniforms. */
static void ref_random(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    uint64_t seed = (uint64_t)ir_attr_int(n, "seed", 0), stream = (uint64_t)ir_attr_int(n, "stream", 0);
    uint64_t step = n->nin ? (uint64_t)(int64_t)in[0].v[0] : 0;
    bool normal = n->op == IR_OP_normal;
    double a = ir_attr_float(n, normal ? "mean" : "low", 0), b = ir_attr_float(n, normal ? "std" : "high", 1);
    for (int64_t i = 0; i < ir_numel(&out->type); i++) {
        uint32_t w[4] = {(uint32_t)i, (uint32_t)((uint64_t)i >> 32), (uint32_t)stream, (uint32_t)step};
        philox_ref(w, (uint32_t[]){(uint32_t)seed, (uint32_t)(seed >> 32)});
        double u53 = ldexp((double)(w[0] >> 5), 26) + (double)(w[1] >> 6), v53 = ldexp((double)(w[2] >> 5), 26) + (double)(w[3] >> 6);
        if (normal)
            out->v[i] = a + b * (sqrt(-2 * log(ldexp(u53 + 1, -53))) * cos(2 * PI * ldexp(v53, -53)));
        else
            out->v[i] = a + (b - a) * (out->type.dtype == ALLOY_F64 ? ldexp(u53, -53) : ldexp((double)(w[0] >> 8), -24));
    }
}

static void ref_transpose(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    int np;
    const int64_t *perm = ir_attr_ints(n, "perm", &np);
    int64_t idx[ALLOY_MAX_RANK], in_idx[ALLOY_MAX_RANK];
    for (int64_t i = 0; i < ir_numel(&out->type); i++) {
        unravel(&out->type, i, idx);
        for (int d = 0; d < np; d++) in_idx[perm[d]] = idx[d];
        out->v[i] = in[0].v[ravel(&in[0].type, in_idx)];
    }
}

static void ref_broadcast_to(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    (void)n;
    int64_t idx[ALLOY_MAX_RANK];
    for (int64_t i = 0; i < ir_numel(&out->type); i++) {
        unravel(&out->type, i, idx);
        out->v[i] = in[0].v[bcast_offset(&in[0].type, out->type.rank, idx)];
    }
}

static void ref_slice(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    int ax = axis_of(n, "axis", 0, in[0].type.rank);
    int64_t start = ir_attr_int(n, "start", 0), idx[ALLOY_MAX_RANK];
    for (int64_t i = 0; i < ir_numel(&out->type); i++) {
        unravel(&out->type, i, idx);
        idx[ax] += start;
        out->v[i] = in[0].v[ravel(&in[0].type, idx)];
    }
}

static void ref_concat(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    int ax = axis_of(n, "axis", 0, out->type.rank);
    int64_t idx[ALLOY_MAX_RANK];
    for (int64_t i = 0; i < ir_numel(&out->type); i++) {
        unravel(&out->type, i, idx);
        int k = 0;
        while (idx[ax] >= in[k].type.dims[ax]) idx[ax] -= in[k++].type.dims[ax];
        out->v[i] = in[k].v[ravel(&in[k].type, idx)];
    }
}

static void ref_pad(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    int ax = axis_of(n, "axis", 0, in[0].type.rank);
    int64_t before = ir_attr_int(n, "before", 0), idx[ALLOY_MAX_RANK];
    for (int64_t i = 0; i < ir_numel(&out->type); i++) {
        unravel(&out->type, i, idx);
        idx[ax] -= before;
        out->v[i] = idx[ax] >= 0 && idx[ax] < in[0].type.dims[ax] ? in[0].v[ravel(&in[0].type, idx)] : 0;
    }
}

/* Keys after each query (shifted by keys - queries) become `value`. */
static void ref_causal_mask(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    const ir_type *t = &out->type;
    int64_t tq = t->dims[t->rank - 2], tk = t->dims[t->rank - 1];
    double value = test_round_to(t->dtype, ir_attr_float(n, "value", -INFINITY));
    for (int64_t i = 0; i < ir_numel(t); i++) out->v[i] = i % tk > (i / tk) % tq + (tk - tq) ? value : in[0].v[i];
}

static void ref_cast(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    (void)n;
    for (int64_t i = 0; i < ir_numel(&out->type); i++) out->v[i] = test_round_to(out->type.dtype, in[0].v[i]);
}

/* true when some element of some operand is inf or NaN */
static void ref_found_inf(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    out->v[0] = 0;
    for (int k = 0; k < n->nin; k++)
        for (int64_t i = 0; i < ir_numel(&in[k].type); i++)
            if (!isfinite(in[k].v[i])) out->v[0] = 1;
}

/* sum_squares: an f64 result of f32 sums, so f32's bound on it */
static const oc_tol tol_f32_sums = {.f32 = 1e-5, .f16 = 1e-5, .bf16 = 1e-5, .f64 = 1e-5};

/* the operands' squares summed, in f64 */
static void ref_sum_squares(const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    out->v[0] = 0;
    for (int k = 0; k < n->nin; k++)
        for (int64_t i = 0; i < ir_numel(&in[k].type); i++) out->v[0] += in[k].v[i] * in[k].v[i];
}

/* ---- the table ----
 *
 * Adding an op: its rows below and its reference. An elementwise op is
 * usually one row and one line of ew_ref:
 *     {"silu", UNARY, TRANS},          case IR_OP_silu: return a / (1 + exp(-a));
 * a structured op a ref_ function and a row or two:
 *     {"rms_norm", "[5,17]; [5,17] [17]", "; eps=0.01", .dom = {U(-2, 2), U(0.5, 2)}, .ref = ref_rms_norm},
 * The guards of test_op_cases.c fail, naming the op, until it has an
 * evaluation case, a gradient case if ops.def gives it a gradient rule (a
 * row without OC_NO_GRAD of at most 1024 operand elements), and its row in
 * docs/ir.md; every case then runs in every dtype the op's type rule takes,
 * through its gradient check and, where the fusion rules let it join a
 * group, fused against unfused. */

/* Domains. */
#define U(a, b) {.lo = (a), .hi = (b)}
#define POS U(0.25, 2.5) /* log, sqrt, rsqrt, pow's base: x > 0 */
#define AWAY(a, b) {.lo = (a), .hi = (b), .flags = OC_AWAY}
#define INTS(a, b) {.lo = (a), .hi = (b), .grid = 1} /* equal values occur */
#define GRID(a, b, step, off) {.lo = (a), .hi = (b), .grid = (step), .shift = (off)}
#define NANS(a, b) {.lo = (a), .hi = (b), .flags = OC_NAN}
#define SPECIALS {.flags = OC_SPECIAL}
#define DISTINCT {.flags = OC_DISTINCT}
#define INDEX(operand, d) {.flags = OC_INDEX, .of = (operand), .dim = (d)}

/* Tolerances. */
#define ARITH .tol = &oc_tol_arith
#define TRANS .tol = &oc_tol_trans
#define EXACT .tol = &oc_tol_exact

/* Shape sets for elementwise ops: odd sizes, 0 and 1 dims, scalars,
 * broadcasting either way and both ways. */
#define UNARY "[17]; [3,33]; [130]; [0]; []; [2,1,5]"
#define BINARY "[4,1,5] [3,1]; [] [17]; [33] []; [2,3,130] [130]; [0,3] [1,3]; [1] [1]; [17,1] [1,33]"
#define TERNARY "[4,1,5] [3,1] [5]; [] [17] []; [33] [] [33]; [2,3,130] [130] []; [0,3] [1,3] [3]; [1] [1] [1]; [17,1] [1,33] [17,33]"
#define WHERE                                                                                                      \
    "bool[4,1,5] [3,1] [5]; bool[] [17] []; bool[33] [] [33]; bool[2,3,130] [130] []; bool[0,3] [1,3] [3]; "      \
    "bool[1] [1] [1]; bool[17,1] [1,33] [17,33]; bool[3,1] [2,3,4] [4]"

/* matmul a[ba..., m, k] x b[bb..., k, n] with each transpose (ba, bb: "[" or "[2,1," ...). */
#define MATMUL(ba, bb, m, k, n)                                                                                    \
    {"matmul", ba #m "," #k "] " bb #k "," #n "]", .ref = ref_matmul},                                             \
    {"matmul", ba #k "," #m "] " bb #k "," #n "]", "transpose_a=1", .ref = ref_matmul},                            \
    {"matmul", ba #m "," #k "] " bb #n "," #k "]", "transpose_b=1", .ref = ref_matmul},                            \
    {"matmul", ba #k "," #m "] " bb #n "," #k "]", "transpose_a=1 transpose_b=1", .ref = ref_matmul}

/* Every axis set of a rank-3 tensor (absent: all; some negative), with and without keepdims. */
#define AXES3 "; axes=[]; axes=[0]; axes=[-2]; axes=[2]; axes=[0,-2]; axes=[-3,2]; axes=[1,2]; axes=[0,1,-1] | ; keepdims=1"
#define PERMS3 "perm=[0,1,2]; perm=[0,2,1]; perm=[1,0,2]; perm=[1,2,0]; perm=[2,0,1]; perm=[2,1,0]"

const op_case op_cases[] = {
    /* leaves: bound values come back as they went in; constants are their attributes rounded once */
    {"input", NULL, NULL, "[2,3]; []; [0]; [130]", EXACT, .ref = ref_leaf},
    {"param", NULL, "init=zeros", "[2,3]; []", EXACT, .ref = ref_leaf},
    {"state", NULL, "init=zeros", "[2,3]; []", EXACT, .ref = ref_leaf},
    /* 1 + 2^-11 + 2^-40 rounds up to f16 1 + 2^-10 directly, but to 1 via f32 (bf16: 1 + 2^-8 + 2^-40) */
    {"constant", NULL, "value=-2.75; value=0.1; values=[0,1.5,-2.75,0x1.0020000001p0,0x1.0100000001p0,-0.5]", "[2,3]",
     EXACT, .ref = ref_constant},
    {"constant", NULL, "value=1.5", "[]; [0]; [3,1]", EXACT, .ref = ref_constant},

    /* elementwise arithmetic and activations */
    {"neg", UNARY, ARITH},
    {"add", BINARY, ARITH},
    {"sub", BINARY, ARITH},
    {"mul", BINARY, ARITH},
    {"mul", "i32[17] i32[17]; i64[3,5] i64[5]", .dom = {U(-1e5, 1e5), U(-1e5, 1e5)}, EXACT}, /* i32 products saturate */
    {"add", "i32[17] i32[17]; i32[33] i32[]", .dom = {U(-2.1e9, 2.1e9), U(-2.1e9, 2.1e9)}, EXACT},
    {"div", BINARY, .dom = {{0}, AWAY(1, 5)}}, /* divisors away from zero */
    /* ties and NaNs (NaN wins); the gradient rows keep a and b 0.05 apart (no kink) */
    {"maximum", BINARY, .dom = {INTS(-3, 3), INTS(-3, 3)}, .flags = OC_NO_GRAD},
    {"maximum", "[17] [17]; [3,5] [5]", .dom = {NANS(-3, 3), NANS(-3, 3)}, .flags = OC_NO_GRAD},
    {"maximum", BINARY, .dom = {GRID(-1.5, 1.5, 0.1, 0.05), GRID(-1.5, 1.5, 0.1, 0)}},
    {"minimum", BINARY, .dom = {INTS(-3, 3), INTS(-3, 3)}, .flags = OC_NO_GRAD},
    {"minimum", "[17] [17]; [3,5] [5]", .dom = {NANS(-3, 3), NANS(-3, 3)}, .flags = OC_NO_GRAD},
    {"minimum", BINARY, .dom = {GRID(-1.5, 1.5, 0.1, 0.05), GRID(-1.5, 1.5, 0.1, 0)}},
    {"pow", BINARY, .dom = {POS, U(-2, 2)}, TRANS},
    {"relu", UNARY, .dom = {AWAY(0.05, 3)}}, /* away from the kink at 0 */
    {"relu", "[17]; [3,5]", .dom = {NANS(-3, 3)}, .flags = OC_NO_GRAD},
    {"gelu", UNARY, TRANS},
    {"gelu_tanh", UNARY, TRANS},
    {"silu", UNARY, TRANS},
    {"tanh", UNARY, TRANS, .flags = OC_NO_GRAD}, /* saturated: tanh_grad's 1 - y^2 from a rounded y keeps no precision */
    {"tanh", UNARY, .dom = {U(-1.5, 1.5)}, TRANS},
    {"sigmoid", UNARY, TRANS},
    {"exp", UNARY, TRANS},
    {"log", UNARY, .dom = {POS}, TRANS},
    {"sqrt", UNARY, .dom = {POS}},
    {"rsqrt", UNARY, .dom = {POS}},
    {"square", UNARY, ARITH},
    {"cos", UNARY, ARITH},
    {"sin", UNARY, ARITH},
    /* abs and sign never round; away from 0 for the gradient (sign's is zeros), then zeros, NaN and inf */
    {"abs", UNARY, .dom = {AWAY(0.05, 3)}, EXACT},
    {"abs", "[17]; [3,5]", .dom = {SPECIALS}, EXACT, .flags = OC_NO_GRAD},
    {"sign", UNARY, .dom = {AWAY(0.05, 3)}, EXACT},
    {"sign", "[17]; [3,33]", .dom = {INTS(-2, 2)}, EXACT, .flags = OC_NO_GRAD},
    {"sign", "[17]; [3,5]", .dom = {SPECIALS}, EXACT, .flags = OC_NO_GRAD},
    {"erf", UNARY, TRANS},
    /* near 0, where log(1 + x) and exp(x) - 1 would keep no relative precision */
    {"log1p", UNARY, .dom = {U(-0.75, 3)}, TRANS},
    {"log1p", "[17]; [130]", .dom = {AWAY(1e-6, 1e-3)}, TRANS},
    {"expm1", UNARY, TRANS},
    {"expm1", "[17]; [130]", .dom = {AWAY(1e-6, 1e-3)}, TRANS},
    /* and far from it, where log(1 + exp(x)) overflows f32's exp */
    {"softplus", UNARY, .dom = {U(-8, 20)}, TRANS}, /* (f16 keeps no precision below 6e-5, softplus(-10)) */
    {"softplus", "[17]; [130]", .dom = {AWAY(20, 200)}, TRANS},
    {"leaky_relu", UNARY, "; negative_slope=0.2; negative_slope=-1.5", .dom = {AWAY(0.05, 3)}, ARITH},
    {"elu", UNARY, "; alpha=0.5; alpha=2", .dom = {AWAY(0.05, 3)}, TRANS},
    /* values on a grid the bounds are not on (no kink for the gradient); a
     * bound left out is none, min > max gives max; then NaN and inf */
    {"clamp", UNARY, "; min=-1.5; max=0.75; min=-1.5 max=0.75; min=1 max=-1", .dom = {GRID(-3, 3, 0.25, 0.125)}, EXACT},
    {"clamp", "[17]; [3,5]", "; min=-1.5 max=0.75; min=0", .dom = {SPECIALS}, EXACT, .flags = OC_NO_GRAD},

    /* comparisons (equal values occur), isfinite, where */
    {"equal", BINARY, .dom = {INTS(-3, 3), INTS(-3, 3)}},
    {"not_equal", BINARY, .dom = {INTS(-3, 3), INTS(-3, 3)}},
    {"less", BINARY, .dom = {INTS(-3, 3), INTS(-3, 3)}},
    {"less_equal", BINARY, .dom = {INTS(-3, 3), INTS(-3, 3)}},
    {"greater", BINARY, .dom = {INTS(-3, 3), INTS(-3, 3)}},
    {"greater_equal", BINARY, .dom = {INTS(-3, 3), INTS(-3, 3)}},
    {"isfinite", UNARY, .dom = {SPECIALS}},
    {"where", WHERE, ARITH},

    /* AMP markers: identities while AMP is off */
    {"amp_allow", UNARY, ARITH},
    {"amp_deny", UNARY, ARITH},

    /* linear algebra */
    MATMUL("[", "[", 1, 1, 1),
    MATMUL("[", "[", 17, 33, 5),
    MATMUL("[", "[", 33, 130, 17),
    MATMUL("[2,1,", "[3,", 5, 7, 4),
    MATMUL("[3,", "[", 5, 7, 4),
    MATMUL("[", "[2,", 4, 6, 3),
    MATMUL("[", "[2,2,", 3, 4, 2),
    MATMUL("[2,", "[2,", 3, 4, 2),
    /* an empty inner dimension gives zeros, an empty outer one nothing */
    {"matmul", "[3,0] [0,4]; [0,5] [5,4]", .ref = ref_matmul},
    {"matmul", "[0,3] [4,0]", "transpose_a=1 transpose_b=1", .ref = ref_matmul},

    /* reductions: every axis set; scalars, size-1 and empty axes. Float sums
     * of positive values (a sum that cancels keeps no relative precision);
     * integers of both signs (means truncate toward zero). */
    {"reduce_sum", "[6,17,33]", AXES3, .dom = {U(0.5, 10)}, .ref = ref_reduce}, /* all of it: 2e4 < f16's 65504 */
    {"reduce_sum", "i32[6,17,33]; i64[6,17,33]", AXES3, .dom = {U(-50, 50)}, EXACT, .ref = ref_reduce},
    /* integer sums past the dtype's range saturate, as elementwise results do (docs/ir.md) */
    {"reduce_sum", "i32[6,17,33]", AXES3, .dom = {U(-2.1e9, 2.1e9)}, EXACT, .ref = ref_reduce},
    {"reduce_mean", "i32[6,17,33]", "axes=[1]; axes=[0,2]", .dom = {U(-2.1e9, 2.1e9)}, EXACT, .ref = ref_reduce},
    {"reduce_sum", "[2,3,4]", AXES3, .dom = {U(0.25, 3)}, .ref = ref_reduce},
    {"reduce_sum", "[]", " | ; keepdims=1", .dom = {U(0.25, 3)}, .ref = ref_reduce},
    {"reduce_sum", "[1,130,1]", "axes=[0,2] keepdims=1; axes=[1]", .dom = {U(0.25, 3)}, .ref = ref_reduce},
    {"reduce_sum", "[130,33]", "axes=[0]; axes=[1] keepdims=1", .dom = {U(0.25, 3)}, .ref = ref_reduce},
    {"reduce_sum", "[2,0,3]; [3,0]", "axes=[1]; axes=[0] keepdims=1", .ref = ref_reduce}, /* sums of nothing: 0 */
    {"reduce_mean", "[6,17,33]", AXES3, .dom = {U(0.5, 50)}, .ref = ref_reduce},
    {"reduce_mean", "i32[6,17,33]; i64[6,17,33]", AXES3, .dom = {U(-50, 50)}, EXACT, .ref = ref_reduce},
    {"reduce_mean", "[2,3,4]", AXES3, .dom = {U(0.25, 3)}, .ref = ref_reduce},
    {"reduce_mean", "[]", " | ; keepdims=1", .dom = {U(0.25, 3)}, .ref = ref_reduce},
    {"reduce_mean", "[1,130,1]", "axes=[0,2] keepdims=1; axes=[1]", .dom = {U(0.25, 3)}, .ref = ref_reduce},
    {"reduce_mean", "[130,33]", "axes=[0]; axes=[1] keepdims=1", .dom = {U(0.25, 3)}, .ref = ref_reduce},
    /* float means of nothing are NaN, integer ones 0 */
    {"reduce_mean", "[2,0,3]; [3,0]", "axes=[1]; axes=[0] keepdims=1", .ref = ref_reduce, .flags = OC_NO_GRAD},
    {"reduce_max", "[6,17,33]", AXES3, .dom = {U(-50, 50)}, .ref = ref_reduce},
    {"reduce_max", "[2,3,4]", AXES3, .dom = {DISTINCT}, .ref = ref_reduce}, /* a unique maximum everywhere */
    {"reduce_max", "[]", " | ; keepdims=1", .ref = ref_reduce},
    {"reduce_max", "[1,130,1]", "axes=[0,2] keepdims=1; axes=[1]", .dom = {DISTINCT}, .ref = ref_reduce},
    {"reduce_max", "[130,33]", "axes=[0]; axes=[1] keepdims=1", .ref = ref_reduce},
    {"reduce_max", "[2,0,3]", "axes=[0] keepdims=1", .ref = ref_reduce}, /* an empty result (empty maxima are type errors) */
    {"reduce_max", "[4,5]", "axes=[0]; axes=[1]; axes=[0,1]", .dom = {NANS(-1, 1)}, .ref = ref_reduce,
     .flags = OC_NO_GRAD}, /* NaN wins */

    /* argmax, argmin: ties (the first wins), every axis with and without keepdims, NaN (wins over
     * inf, at any position), empty results */
    {"argmax", "[6,17,33]", "axis=0; axis=1; axis=-1; axis=2 keepdims=1; axis=-3 keepdims=1", .dom = {INTS(-3, 3)}, EXACT, .ref = ref_arg},
    {"argmax", "[17]; [2,1,5]; [130]", " | ; keepdims=1", .dom = {INTS(-3, 3)}, EXACT, .ref = ref_arg},
    {"argmax", "[17]; [3,20]", "; axis=0", .dom = {SPECIALS}, EXACT, .ref = ref_arg},
    {"argmax", "[4,0,3]", "axis=0; axis=-1", EXACT, .ref = ref_arg},
    {"argmin", "[6,17,33]", "axis=0; axis=1; axis=-1; axis=2 keepdims=1; axis=-3 keepdims=1", .dom = {INTS(-3, 3)}, EXACT, .ref = ref_arg},
    {"argmin", "[17]; [2,1,5]; [130]", " | ; keepdims=1", .dom = {INTS(-3, 3)}, EXACT, .ref = ref_arg},
    {"argmin", "[17]; [3,20]", "; axis=0", .dom = {SPECIALS}, EXACT, .ref = ref_arg},
    {"argmin", "[4,0,3]", "axis=0; axis=-1", EXACT, .ref = ref_arg},

    /* softmax and log_softmax along any axis */
    {"softmax", "[3,5,7]", "; axis=0; axis=1; axis=2; axis=-2", TRANS, .ref = ref_softmax},
    {"softmax", "[17]; [2,130]; [1]; [0,4]", "", TRANS, .ref = ref_softmax},
    {"softmax", "[0,4]", "axis=0", TRANS, .ref = ref_softmax},
    /* needs the max subtraction; the finite-difference step grows with |x| ~ 1000 */
    {"softmax", "[3,5,7]", "axis=1", .dom = {U(995, 1005)}, TRANS, .ref = ref_softmax, .flags = OC_NO_GRAD},
    {"log_softmax", "[3,5,7]", "; axis=0; axis=1; axis=2; axis=-2", TRANS, .ref = ref_softmax},
    {"log_softmax", "[17]; [2,130]; [1]; [0,4]", "", TRANS, .ref = ref_softmax},
    {"log_softmax", "[0,4]", "axis=0", TRANS, .ref = ref_softmax},
    {"log_softmax", "[3,5,7]", "axis=1", .dom = {U(995, 1005)}, TRANS, .ref = ref_softmax, .flags = OC_NO_GRAD},

    /* layer_norm with and without gamma and beta, default and given eps */
    {"layer_norm", "[5,17]; [2,3,33]; [130]; [4,1]; [5,17] [17] [17]; [2,3,33] [33] [33]; [130] [130] [130]; [4,1] [1] [1]",
     "; eps=0.01", .dom = {U(3, 7), U(0.5, 2), U(-1, 1)}, .ref = ref_layer_norm},
    {"layer_norm", "[3,5]; [2,2,6]; [7]; [3,5] [5] [5]; [2,2,6] [6] [6]; [7] [7] [7]", "",
     .dom = {U(-2, 2), U(0.5, 1.5), U(-0.5, 0.5)}, .ref = ref_layer_norm},

    /* rms_norm with and without gamma, default and given eps */
    {"rms_norm", "[5,17]; [2,3,33]; [130]; [4,2]; [5,17] [17]; [2,3,33] [33]; [130] [130]; [4,2] [2]", "; eps=0.01",
     .dom = {U(-3, 3), U(0.5, 2)}, .ref = ref_rms_norm},

    /* batch_norm in both modes (training given: the graph's mode would follow the check), [N, C] and
     * [N, C, H, W], with and without weight and bias; the running statistics have no gradient in training */
    {"batch_norm", "[6,3] [3] [3]; [2,3,4,5] [3] [3]; [3,2,5] [2] [2]; [6,3] [3] [3] [3] [3]; [2,3,4,5] [3] [3] [3] [3]",
     "training=1; training=1 eps=0.1", .dom = {U(-2, 3), U(-1, 1), U(0.5, 2), U(0.5, 2), U(-1, 1)}, .constant_in = 6,
     .ref = ref_batch_norm},
    {"batch_norm", "[6,3] [3] [3]; [2,3,4,5] [3] [3]; [6,3] [3] [3] [3] [3]; [2,3,2,3] [3] [3] [3] [3]",
     "training=0; training=0 eps=0.1 momentum=0.5", .dom = {U(-2, 3), U(-1, 1), U(0.5, 2), U(0.5, 2), U(-1, 1)},
     .ref = ref_batch_norm},
    {"group_norm", "[2,6,5]; [3,12]; [2,6,2,3] [6] [6]; [1,4,3] [4] [4]", "num_groups=2; num_groups=1 eps=0.1",
     .dom = {U(-2, 3), U(0.5, 2), U(-1, 1)}, .ref = ref_group_norm},
    {"group_norm", "[2,6,5] [6] [6]", "num_groups=6; num_groups=3", .dom = {U(-2, 3), U(0.5, 2), U(-1, 1)}, .ref = ref_group_norm},

    /* cross_entropy: i32 and i64 targets, scalar targets */
    {"cross_entropy", "[4,7] i32[4]; [2,3,5] i64[2,3]; [1,130] i32[1]; [17] i64[]; [4,5] i32[4]",
     .dom = {U(-4, 4), INDEX(0, -1)}, TRANS, .ref = ref_cross_entropy},

    /* cross_entropy and nll_loss with class weights, ignore_index (a class
     * the drawn targets hit: those positions weigh 0), label smoothing, sum */
    {"cross_entropy", "[6,7] i32[6]; [2,3,5] i64[2,3]; [6,7] i32[6] [7]; [2,3,5] i64[2,3] [5]",
     "ignore_index=2; label_smoothing=0.1; ignore_index=0 label_smoothing=0.25; reduction=sum; ignore_index=1 reduction=sum",
     .dom = {U(-4, 4), INDEX(0, -1), U(0.25, 2)}, TRANS, .constant_in = 4, .ref = ref_row_loss},
    {"cross_entropy", "[4,7] i32[4] [7]; [1,130] i32[1] [130]; [17] i64[] [17]", "; label_smoothing=0.2 reduction=sum", .dom = {U(-4, 4), INDEX(0, -1), U(0.25, 2)}, TRANS,
     .constant_in = 4, .ref = ref_row_loss},
    {"nll_loss", "[6,7] i32[6]; [2,3,5] i64[2,3]; [6,7] i32[6] [7]; [2,3,5] i64[2,3] [5]; [1,130] i32[1]",
     "; ignore_index=2; reduction=sum; ignore_index=0 reduction=sum", .dom = {U(-4, 0), INDEX(0, -1), U(0.25, 2)}, TRANS,
     .constant_in = 4, .ref = ref_row_loss},

    {"nll_loss", "[17] i64[] [17]; [17] i32[]", "; reduction=sum", .dom = {U(-4, 0), INDEX(0, -1), U(0.25, 2)}, TRANS,
     .constant_in = 4, .ref = ref_row_loss},

    /* losses per element: away from the kinks of l1 (a grid and an offset grid never tie) */
    {"mse_loss", BINARY, ARITH},
    {"l1_loss", BINARY, .dom = {GRID(-3, 3, 0.25, 0.125), GRID(-3, 3, 0.25, 0)}, ARITH},
    {"l1_loss", "[17] [17]; [3,5] [5]", .dom = {NANS(-3, 3), NANS(-3, 3)}, ARITH, .flags = OC_NO_GRAD},
    {"smooth_l1_loss", BINARY, "; beta=0.5; beta=2.5; beta=0", .dom = {GRID(-3, 3, 0.25, 0.125), GRID(-3, 3, 0.25, 0)},
     ARITH},
    {"binary_cross_entropy_with_logits", TERNARY, .dom = {U(-6, 6), U(0, 1), U(0.5, 3)}, TRANS},
    {"binary_cross_entropy_with_logits", "[17] [17] []; [3,5] [3,5] [5]", .dom = {AWAY(20, 60), U(0, 1), U(0.5, 3)},
     TRANS, .flags = OC_NO_GRAD}, /* large logits: no overflow */

    /* convolutions: stride, padding, dilation, groups (2 and depthwise, with a
     * channel multiplier), kernels not square, sizes the stride does not divide,
     * a 1x1 kernel (the input is its own column matrix), an empty batch */
    {"conv2d", "[2,4,7,9] [6,4,3,2]; [2,4,7,9] [6,4,3,2] [6]",
     "; stride=[2,1] padding=[1,0]; dilation=[2,1] padding=[2,1]; stride=[2,3] padding=[1,1] dilation=[1,2]", .ref = ref_conv},
    {"conv2d", "[2,4,6,5] [6,2,3,3]; [2,4,6,5] [6,2,3,3] [6]", "groups=2; groups=2 stride=[2,2] padding=[1,1]", .ref = ref_conv},
    {"conv2d", "[1,3,7,6] [3,1,3,2]; [1,3,7,6] [6,1,3,3] [6]",
     "groups=3 padding=[1,1]; groups=3 stride=[2,1] dilation=[2,2] padding=[2,1]", .ref = ref_conv},
    {"conv2d", "[2,5,3,4] [7,5,1,1]; [2,5,3,4] [7,5,1,1] [7]", "; stride=[2,2]", .ref = ref_conv},
    {"conv2d", "[1,2,2,3] [2,2,3,3]; [0,4,5,5] [3,4,3,3] [3]", "padding=[1,1]", .ref = ref_conv},
    {"conv1d", "[2,4,11] [6,4,3]; [2,4,11] [6,4,3] [6]", "; stride=[2] padding=[1]; dilation=[2] padding=[2]; stride=[3] dilation=[2]",
     .ref = ref_conv},
    {"conv1d", "[2,4,9] [4,2,3] [4]; [2,4,9] [4,2,3]", "groups=2 stride=[2] padding=[1]; groups=2", .ref = ref_conv},
    {"conv1d", "[2,3,10] [3,1,4]; [2,3,10] [6,1,4] [6]", "groups=3 padding=[2]; groups=3 stride=[2] dilation=[2]", .ref = ref_conv},
    /* pools: overlapping windows, padding, strides that do not divide; max
     * with distinct values (finite differences), ties (the first wins) and NaN */
    {"max_pool2d", "[2,3,7,9]", "kernel=[2,2]; kernel=[3,2] stride=[2,1] padding=[1,1]; kernel=[3,3] stride=[2,2] padding=[1,1]",
     .dom = {DISTINCT}, EXACT, .ref = ref_pool},
    {"max_pool2d", "[2,3,7,9]", "kernel=[3,3] stride=[1,2]", .dom = {INTS(-2, 2)}, EXACT, .ref = ref_pool, .flags = OC_NO_GRAD},
    {"max_pool2d", "[1,2,5,5]", "kernel=[2,2]", .dom = {NANS(-2, 2)}, EXACT, .ref = ref_pool, .flags = OC_NO_GRAD},
    {"avg_pool2d", "[2,3,7,9]",
     "kernel=[2,2]; kernel=[3,2] stride=[2,1] padding=[1,1]; kernel=[3,3] stride=[2,2] padding=[1,1] count_include_pad=0",
     .ref = ref_pool},
    {"adaptive_avg_pool2d", "[2,3,7,9]; [1,2,5,5]", "output_size=[3,4]; output_size=[1,1]; output_size=[7,9]; output_size=[10,2]",
     .ref = ref_pool},

    /* data movement */
    {"embedding", "i32[2,3] [10,6]; i64[5] [10,6]; i64[] [10,6]; i32[0] [10,6]; i32[2,3] [5,3]; i64[4] [6,2]",
     .dom = {INDEX(1, 0), U(-5, 5)}, EXACT, .ref = ref_embedding},
    /* the declared type gives the dtype (the case's); the rule gives the shape */
    {"one_hot", "i32[2,4]; i64[5]; i64[]; i32[0,3]", "depth=6; depth=1", .declared = "[]", .dom = {INDEX(-1, -1)}, EXACT,
     .ref = ref_one_hot},
    /* gather, index_select along each axis (repeated indices: their gradients add), integers too */
    {"gather", "[4,5,3] i64[2,5,3]; [4,5,3] i32[6,2,1]; [4,5,3] i64[0,5,3]", "axis=0", .dom = {U(-3, 3), INDEX(0, 0)}, EXACT,
     .ref = ref_gather},
    {"gather", "[4,5,3] i64[4,7,3]; [4,5,3] i32[2,2,2]", "axis=1; axis=-2", .dom = {U(-3, 3), INDEX(0, 1)}, EXACT, .ref = ref_gather},
    {"gather", "[4,5,3] i32[4,5,6]; [7] i64[9]; i32[3,4] i64[3,2]", "axis=-1", .dom = {U(-30, 30), INDEX(0, -1)}, EXACT,
     .ref = ref_gather},
    {"index_select", "[4,5,3] i64[6]; [4,5,3] i32[0]; [7] i64[3]", "axis=0", .dom = {U(-3, 3), INDEX(0, 0)}, EXACT,
     .ref = ref_index_select},
    {"index_select", "[4,5,3] i32[7]; i64[4,5,3] i64[2]", "axis=1; axis=-2", .dom = {U(-30, 30), INDEX(0, 1)}, EXACT,
     .ref = ref_index_select},
    {"index_select", "[4,5,3] i64[4]", "axis=2", .dom = {U(-3, 3), INDEX(0, 2)}, EXACT, .ref = ref_index_select},
    {"arange", NULL, "end=5; start=-2.5 end=4 step=0.5; start=3 end=-3 step=-0.75; start=1 end=1; start=0.1 end=1.7 step=0.1",
     "[]", EXACT, .ref = ref_arange, .flags = OC_NO_GRAD},
    /* cumsum of positive values (sums that cancel keep no relative precision), integers of both signs */
    {"cumsum", "[6,17,5]; [3,1]", "axis=0; axis=1; axis=-1; axis=0 reverse=1; axis=-1 reverse=1", .dom = {U(0.25, 2)},
     .ref = ref_cumsum},
    {"cumsum", "[130]", "; reverse=1", .dom = {U(0.25, 2)}, .ref = ref_cumsum},
    {"cumsum", "i32[6,17]; i64[130]", "axis=0; axis=-1 reverse=1", .dom = {U(-50, 50)}, EXACT, .ref = ref_cumsum},
    {"cumsum", "[0,3]; [4,0]", "axis=0; axis=1", .ref = ref_cumsum},
    {"reshape", "[2,3,4]", .declared = "[4,6]; [24]; [3,4,2]; [1,24,1]", EXACT, .ref = ref_copy},
    {"reshape", "[]; [1]", .declared = "[1,1]", EXACT, .ref = ref_copy},
    {"reshape", "[0,3]", .declared = "[3,0]", EXACT, .ref = ref_copy},
    {"transpose", "[3,5,7]; [2,17,33]; [1,33,1]; [2,3,4]", PERMS3, EXACT, .ref = ref_transpose},
    {"transpose", "[33,130]; [130,33]; [0,3]; [2,3]", "perm=[1,0]", EXACT, .ref = ref_transpose},
    {"transpose", "[2,3,4,5]", "perm=[3,1,0,2]", EXACT, .ref = ref_transpose},
    {"transpose", "[1,5,1,7]", "perm=[3,2,1,0]", EXACT, .ref = ref_transpose},
    {"broadcast_to", "[3,1]", .declared = "[2,3,4]; [2,3,130]", EXACT, .ref = ref_broadcast_to},
    {"broadcast_to", "[]", .declared = "[5]; [2,2]", EXACT, .ref = ref_broadcast_to},
    {"broadcast_to", "[4]", .declared = "[2,3,4]; [3,4]", EXACT, .ref = ref_broadcast_to},
    {"broadcast_to", "[1,1]", .declared = "[1,1]", EXACT, .ref = ref_broadcast_to},
    {"broadcast_to", "[3,1,1,4]", .declared = "[3,5,6,4]", EXACT, .ref = ref_broadcast_to},
    {"broadcast_to", "[5]", .declared = "[0,5]", EXACT, .ref = ref_broadcast_to},
    {"broadcast_to", "[1,3,1]", .declared = "[2,3,4]", EXACT, .ref = ref_broadcast_to},
    {"slice", "[4,6,5]",
     "axis=0 start=1 end=3; axis=1 start=0 end=6; axis=2 start=2 end=2; axis=-1 start=3 end=5; axis=1 start=5 end=6; "
     "axis=2 start=0 end=5",
     EXACT, .ref = ref_slice},
    {"slice", "[3,5,2]", "axis=1 start=1 end=4; axis=0 start=2 end=3; axis=-1 start=1 end=2; axis=2 start=0 end=2",
     EXACT, .ref = ref_slice},
    {"slice", "[2,5]", "axis=-1 start=1 end=4", EXACT, .ref = ref_slice},
    {"concat", "[3,3,4] [1,3,4] [0,3,4]", "axis=0", EXACT, .ref = ref_concat},
    {"concat", "[2,3,4] [2,1,4] [2,0,4]", "axis=1", EXACT, .ref = ref_concat},
    {"concat", "[2,3,3] [2,3,1] [2,3,0]", "axis=2; axis=-1", EXACT, .ref = ref_concat},
    {"concat", "[2,1,3] [2,2,3] [2,3,3]", "axis=1", EXACT, .ref = ref_concat},
    {"concat", "[1,4] [2,4]", "; axis=0", EXACT, .ref = ref_concat},
    {"concat", "[2,2] [2,3]", "axis=-1", EXACT, .ref = ref_concat},
    {"concat", "[2,3]", "axis=1", EXACT, .ref = ref_concat},
    /* the default -inf makes sum(y * r) infinite: evaluation only */
    {"causal_mask", "[4,4]; [2,3,5]; [1,1]; [2,0,3]", "", EXACT, .ref = ref_causal_mask, .flags = OC_NO_GRAD},
    {"causal_mask", "[4,4]; [2,3,5]; [1,1]; [2,0,3]; [1,2,2,3]", "value=0; value=-3", EXACT, .ref = ref_causal_mask},
    /* masked entries of -10001 make |loss| ~ 1e5, whose rounding noise (ulp(loss) / step ~ 1e-5) the
     * finite differences cannot see past */
    {"causal_mask", "[4,4]; [2,3,5]; [1,1]; [2,0,3]", "value=-10001", EXACT, .ref = ref_causal_mask, .flags = OC_NO_GRAD},
    /* casts that round are piecewise constant, so finite differences say
     * nothing of them (test_autodiff checks the straight-through gradient) */
    {"cast", "[17]; [2,3]; []", .declared = "f32; f16; bf16; i32; i64; bool", .dom = {U(-100, 100)}, EXACT,
     .ref = ref_cast, .flags = OC_NO_GRAD},
    {"cast", "[17]; [2,3]; []", .declared = "f64", .dom = {U(-100, 100)}, EXACT, .ref = ref_cast},
    /* random ops. A graph that does not train has no dropout (eval mode: the
     * identity for any p); in training p = 0 is the identity too, and the
     * gradient check runs on it (test_random checks masks for p > 0). */
    {"dropout", "[17]; [3,5]; []; [0,4]", "p=0.5 stream=3; p=1 stream=0; p=0 stream=2 seed=-5", EXACT, .ref = ref_copy,
     .flags = OC_NO_GRAD},
    {"dropout", "[17]; [3,5]", "p=0 stream=1", EXACT, .ref = ref_copy},
    {"uniform", NULL, "stream=0; stream=5 low=-2 high=3 seed=7; stream=4294967295 low=1.5 high=1.5 seed=-1", "[17]; [3,5]; []; [0,4]",
     ARITH, .ref = ref_random, .flags = OC_NO_GRAD},
    {"uniform", "i64[]; i32[]", "stream=9 low=-1 high=1 seed=12345678901", "[130]", .dom = {INTS(0, 1e6)}, ARITH,
     .ref = ref_random, .flags = OC_NO_GRAD},
    {"normal", NULL, "stream=0; stream=6 mean=3 std=0.25 seed=7; stream=2 std=0", "[17]; [3,5]; []; [0,4]", TRANS,
     .ref = ref_random, .flags = OC_NO_GRAD},
    {"normal", "i64[]; i32[]", "stream=9 mean=-1 std=2 seed=-12345678901", "[130]", .dom = {INTS(0, 1e6)}, TRANS,
     .ref = ref_random, .flags = OC_NO_GRAD},
    {"pad", "[2,3,4]", "axis=-1; axis=0; axis=1; axis=2 | before=1 after=2; before=0 after=3; before=2 after=0; before=0 after=0",
     .dom = {U(-100, 100)}, EXACT, .ref = ref_pad},

    /* backward ops autodiff emits */
    {"relu_grad", BINARY, ARITH},
    {"gelu_grad", BINARY, TRANS},
    {"gelu_tanh_grad", BINARY, TRANS},
    {"tanh_grad", BINARY, ARITH},
    {"sigmoid_grad", BINARY, ARITH},
    {"erf_grad", BINARY, TRANS},
    {"log1p_grad", BINARY, .dom = {U(-0.75, 3)}},
    {"expm1_grad", BINARY, .dom = {U(-0.95, 3)}},
    {"softplus_grad", BINARY, TRANS},
    {"leaky_relu_grad", BINARY, "; negative_slope=0.2", ARITH},
    {"elu_grad", BINARY, "; alpha=0.5", TRANS},
    /* on the bounds the gradient passes (PyTorch's rule) */
    {"clamp_grad", BINARY, "; min=-1.5 max=0.75; max=0.75", .dom = {GRID(-3, 3, 0.25, 0)}, EXACT},
    {"silu_grad", BINARY, TRANS},
    {"sqrt_grad", BINARY, .dom = {POS}},
    {"rsqrt_grad", BINARY, .dom = {POS}, ARITH}, /* a = rsqrt(x) > 0 */
    {"square_grad", BINARY, ARITH},
    {"div_grad_b", TERNARY, .dom = {{0}, AWAY(1, 5)}},
    {"pow_grad_base", TERNARY, .dom = {POS}, TRANS},
    {"pow_grad_exp", TERNARY, .dom = {POS}, TRANS},
    {"maximum_grad", TERNARY, .dom = {INTS(-3, 3), INTS(-3, 3)}},
    {"minimum_grad", TERNARY, .dom = {INTS(-3, 3), INTS(-3, 3)}},
    {"reduce_max_grad", TERNARY, .dom = {INTS(-3, 3), INTS(-3, 3)}},
    {"softmax_grad", "[3,5,4] [3,5,4]; [2,6,20] [2,6,20]", "; axis=0; axis=1; axis=2", .dom = {U(0, 1), U(-1, 1)},
     .ref = ref_softmax_grad},
    {"softmax_grad", "[9] [9]", "; axis=0", .dom = {U(0, 1), U(-1, 1)}, .ref = ref_softmax_grad},
    {"log_softmax_grad", "[3,5,4] [3,5,4]; [2,6,20] [2,6,20]", "; axis=0; axis=1; axis=2", .dom = {U(-3, 0), U(-1, 1)},
     .ref = ref_softmax_grad},
    {"log_softmax_grad", "[9] [9]", "; axis=0", .dom = {U(-3, 0), U(-1, 1)}, .ref = ref_softmax_grad},
    {"layer_norm_grad", "[4,7] [4,7]; [2,3,40] [2,3,40]; [1] [1]; [4,7] [4,7] [7]; [2,3,40] [2,3,40] [40]; [1] [1] [1]",
     "eps=1e-5; eps=0.1", .dom = {U(-2, 2), U(-1, 1), U(0.5, 1.5)}, .ref = ref_layer_norm_grad},
    /* the statistics layer_norm's gradient keeps: f32 for f32/f16/bf16 x, f64 for f64 */
    {"layer_norm_mean", "[4,7]; [2,3,40]; [1]", .dom = {U(-2, 2)}, .ref = ref_layer_norm_stats},
    {"layer_norm_rstd", "[4,7]; [2,3,40]; [1]", "eps=1e-5; eps=0.1", .dom = {U(-2, 2)}, .ref = ref_layer_norm_stats},
    {"layer_norm_grad_stats",
     "[4,7] [4,7] f32[4,1] f32[4,1]; [2,3,40] [2,3,40] f32[2,3,1] f32[2,3,1] [40]; "
     "[4,7] [4,7] f64[4,1] f64[4,1] [7]; [1] [1] f32[1] f32[1] [1]",
     .dom = {U(-2, 2), U(-1, 1), U(-0.5, 0.5), U(0.5, 1.5), U(0.5, 1.5)}, .ref = ref_layer_norm_grad_stats},
    {"rms_norm_rstd", "[4,7]; [2,3,40]; [1]", "eps=1e-5; eps=0.1", .dom = {U(-2, 2)}, .ref = ref_rms_norm_rstd},
    {"rms_norm_grad_stats",
     "[4,7] [4,7] f32[4,1]; [2,3,40] [2,3,40] f32[2,3,1] [40]; [4,7] [4,7] f64[4,1] [7]; [3] [3] f32[1] [3]",
     .dom = {U(-2, 2), U(-1, 1), U(0.5, 1.5), U(0.5, 1.5)}, .ref = ref_rms_norm_grad_stats},
    /* (no one-element rows: there dx = g r eps r^2 comes out of a cancellation, in any precision) */
    {"rms_norm_grad", "[4,7] [4,7]; [2,3,40] [2,3,40]; [3] [3]; [4,7] [4,7] [7]; [2,3,40] [2,3,40] [40]",
     "eps=1e-5; eps=0.1", .dom = {U(-2, 2), U(-1, 1), U(0.5, 1.5)}, .ref = ref_rms_norm_grad},
    {"cross_entropy_grad", "[2,3,5] i32[2,3] []; [2,3,5] i64[2,3] []; [4,7] i32[4] []; [5] i64[] []",
     .dom = {U(-3, 3), INDEX(0, -1), U(0.5, 1)}, .ref = ref_cross_entropy_grad},
    {"cross_entropy_grad", "[6,7] i32[6] [] []; [2,3,5] i64[2,3] [] []; [6,7] i32[6] [] [] [7]; [5] i64[] [] [] [5]",
     "ignore_index=2; label_smoothing=0.1; ignore_index=0 label_smoothing=0.3", .dom = {U(-3, 3), INDEX(0, -1), U(0.5, 1), U(1, 3), U(0.25, 2)},
     .ref = ref_row_loss_grad},
    {"nll_loss_grad", "[6,7] i32[6] []; [6,7] i32[6] [] []; [2,3,5] i64[2,3] [] []; [6,7] i32[6] [] [] [7]", "; ignore_index=2",
     .dom = {U(-3, 0), INDEX(0, -1), U(0.5, 1), U(1, 3), U(0.25, 2)}, ARITH, .ref = ref_row_loss_grad},
    {"mse_loss_grad", TERNARY, ARITH},
    {"l1_loss_grad", TERNARY, .dom = {GRID(-3, 3, 0.25, 0.125), GRID(-3, 3, 0.25, 0)}, EXACT},
    {"smooth_l1_loss_grad", TERNARY, "; beta=0.5; beta=0", .dom = {GRID(-3, 3, 0.25, 0.125), GRID(-3, 3, 0.25, 0)}, ARITH},
    {"binary_cross_entropy_with_logits_grad", TERNARY, "operand=0; operand=1; operand=2", .dom = {U(-6, 6), U(0, 1), U(0.5, 3)},
     TRANS},
    {"embedding_grad", "i32[2,4] [2,4,3]; i64[2,4] [2,4,3]; i32[0] [0,3]", .declared = "[6,3]",
     .dom = {INDEX(-1, 0), U(-1, 1)}, .ref = ref_embedding_grad},
    {"embedding_grad", "i64[5] [5,2]", .declared = "[3,2]", .dom = {INDEX(-1, 0), U(-1, 1)}, .ref = ref_embedding_grad},
    {"conv_grad_input", "[2,6,4,8] [6,4,3,2]", "stride=[2,1] padding=[1,0]", .declared = "[2,4,7,9]", .ref = ref_conv_grad},
    {"conv_grad_input", "[1,6,4,4] [6,1,3,3]", "groups=3 stride=[2,1] dilation=[2,2] padding=[2,1]", .declared = "[1,3,7,6]",
     .ref = ref_conv_grad},
    {"conv_grad_input", "[2,4,5] [4,2,3]", "groups=2 stride=[2] padding=[1]", .declared = "[2,4,9]", .ref = ref_conv_grad},
    {"conv_grad_weight", "[2,4,7,9] [2,6,4,8]", "stride=[2,1] padding=[1,0]", .declared = "[6,4,3,2]", .ref = ref_conv_grad},
    {"conv_grad_weight", "[1,3,7,6] [1,6,4,4]", "groups=3 stride=[2,1] dilation=[2,2] padding=[2,1]", .declared = "[6,1,3,3]",
     .ref = ref_conv_grad},
    {"conv_grad_weight", "[2,4,9] [2,4,5]", "groups=2 stride=[2] padding=[1]", .declared = "[4,2,3]", .ref = ref_conv_grad},
    {"max_pool2d_grad", "[2,3,7,9] [2,3,4,10]", "kernel=[3,2] stride=[2,1] padding=[1,1]", .dom = {INTS(-2, 2)}, .ref = ref_pool_grad},
    {"avg_pool2d_grad", "[2,3,4,5]", "kernel=[3,3] stride=[2,2] padding=[1,1]; kernel=[3,3] stride=[2,2] padding=[1,1] count_include_pad=0",
     .declared = "[2,3,7,9]", .ref = ref_pool_grad},
    {"adaptive_avg_pool2d_grad", "[2,3,3,4]", "output_size=[3,4]", .declared = "[2,3,7,9]", .ref = ref_pool_grad},

    {"gather_grad", "i64[2,5,3] [2,5,3]; i32[6,5,2] [6,5,2]", "axis=0", .declared = "[4,5,3]", .dom = {INDEX(-1, 0), U(-1, 1)},
     .ref = ref_gather},
    {"gather_grad", "i64[4,7,3] [4,7,3]", "axis=1; axis=-2", .declared = "[4,5,3]", .dom = {INDEX(-1, 1), U(-1, 1)},
     .ref = ref_gather},
    {"index_select_grad", "i64[6] [6,5,3]; i32[0] [0,5,3]", "axis=0", .declared = "[4,5,3]", .dom = {INDEX(-1, 0), U(-1, 1)},
     .ref = ref_index_select},
    {"index_select_grad", "i32[9] [4,5,9]", "axis=2; axis=-1", .declared = "[4,5,3]", .dom = {INDEX(-1, 2), U(-1, 1)},
     .ref = ref_index_select},

    /* attention: T = 1, 7, 64, 130; D = 16, 64; key lengths other than T
     * (causal then hides j > i + S - T; with S < T the first rows see nothing) */
    {"attention", "[1,1,1,16] [1,1,1,16] [1,1,1,16]; [1,2,7,16] [1,2,7,16] [1,2,7,16]; [2,1,7,16] [2,1,5,16] [2,1,5,16]; "
     "[1,1,5,16] [1,1,9,16] [1,1,9,16]",
     "causal=0; causal=1 | scale=0.25; scale=-0.5", .dom = {U(-1, 1), U(-1, 1), U(-1, 1)}, TRANS, .ref = ref_attention},
    {"attention", "[1,2,64,64] [1,2,64,64] [1,2,64,64]; [2,1,130,16] [2,1,130,16] [2,1,130,16]; [1,1,130,64] [1,1,130,64] [1,1,130,64]",
     "causal=0 scale=0.125; causal=1 scale=0.125", .dom = {U(-2, 2), U(-2, 2), U(-1, 1)}, TRANS, .ref = ref_attention},
    {"attention", "[0,2,7,16] [0,2,7,16] [0,2,7,16]; [1,1,0,16] [1,1,3,16] [1,1,3,16]", "scale=1", TRANS, .ref = ref_attention},
    {"attention_grad", "[1,2,7,16] [1,2,7,16] [1,2,7,16] [1,2,7,16] [1,2,7,16]; [1,1,5,16] [1,1,9,16] [1,1,9,16] [1,1,5,16] [1,1,5,16]; "
     "[2,1,7,16] [2,1,5,16] [2,1,5,16] [2,1,7,16] [2,1,7,16]; [1,1,1,16] [1,1,1,16] [1,1,1,16] [1,1,1,16] [1,1,1,16]; "
     "[1,1,130,64] [1,1,130,64] [1,1,130,64] [1,1,130,64] [1,1,130,64]; [1,2,64,16] [1,2,64,16] [1,2,64,16] [1,2,64,16] [1,2,64,16]",
     "causal=0 scale=0.25; causal=1 scale=0.25", .dom = {U(-1, 1), U(-1, 1), U(-1, 1), U(-1, 1), U(-1, 1)}, TRANS,
     .ref = ref_attention},

    /* training step: loss scaling */
    {"found_inf", "[3,5] [3,5] [3,5]; [17]; [2,3] []", EXACT, .ref = ref_found_inf},
    {"found_inf", "[3,5] [3,5] [3,5]; [17]; [2,3] []", .dom = {SPECIALS, SPECIALS, SPECIALS}, EXACT, .ref = ref_found_inf},
    {"sum_squares", "f32[3,5] f32[9000] f32[17]; f32[17]; f32[2,3] f32[0]", .dom = {U(-2, 2), U(-2, 2), U(-2, 2)},
     .tol = &tol_f32_sums, .ref = ref_sum_squares, .flags = OC_NO_GRAD},

    /* data-parallel collectives: a run with no communicator is one rank, whose reduction is its own value
     * (tests/test_data_parallel.c runs them over two ranks) */
    {"all_reduce", "[3,5]; [17]; []", "; reduce=sum; reduce=max", EXACT, .ref = ref_copy, .flags = OC_NO_GRAD},
    /* reduce_scatter: rank 0's shard, x's first n / world elements; all_gather: x world times */
    {"reduce_scatter", "[12]; [6]", "world=1; world=2; world=3", EXACT, .ref = ref_copy, .flags = OC_NO_GRAD},
    {"all_gather", "[5]; [0]", "world=1; world=3", EXACT, .ref = ref_repeat, .flags = OC_NO_GRAD},
};

const int op_ncases = (int)(sizeof op_cases / sizeof op_cases[0]);

/* ---- expanding a row ---- */

enum { MAX_ALTS = 32, ALT_LEN = 256 };

/* The alternatives of s separated by sep, trimmed, into alt; their count (an empty or NULL s: one empty). */
static int alternatives(const char *s, char sep, char alt[][ALT_LEN], int max)
{
    int n = 0;
    if (!s) s = "";
    for (;;) {
        const char *end = strchr(s, sep);
        size_t len = end ? (size_t)(end - s) : strlen(s);
        while (len && *s == ' ') s++, len--;
        while (len && s[len - 1] == ' ') len--;
        if (n == max || len >= ALT_LEN) return -1;
        memcpy(alt[n], s, len);
        alt[n++][len] = '\0';
        if (!end) return n;
        s = end + 1;
    }
}

/* "i32[2,3]", "[2,3]", "f16", "f16[4]", "[]" into t: dtype ALLOY_DTYPE_COUNT
 * when not written, rank -1 when no dims are. */
static bool parse_type(const char *s, ir_type *t)
{
    memset(t, 0, sizeof *t);
    t->dtype = ALLOY_DTYPE_COUNT;
    t->rank = -1;
    size_t name = strcspn(s, "[");
    if (name) {
        for (alloy_dtype dt = 0; dt < ALLOY_DTYPE_COUNT; dt++)
            if (strlen(alloy_dtype_name(dt)) == name && !strncmp(s, alloy_dtype_name(dt), name)) t->dtype = dt;
        if (t->dtype == ALLOY_DTYPE_COUNT) return false;
    }
    s += name;
    if (!*s) return name > 0;
    if (*s++ != '[') return false;
    t->rank = 0;
    while (*s && *s != ']') {
        char *end;
        long long d = strtoll(s, &end, 10);
        if (end == s || t->rank == ALLOY_MAX_RANK || d < 0) return false;
        t->dims[t->rank++] = d;
        s = *end == ',' ? end + 1 : end;
    }
    return *s == ']' && s[1] == '\0';
}

/* One "name=value" of op's schema into attribute slot k of c. */
static bool parse_attr(oc_case *c, int k, const char *text, char *err, size_t errlen)
{
    const char *eq = strchr(text, '=');
    const ir_attr_spec *spec = ir_ops[c->op].attrs;
    while (spec && spec->name && (!eq || strlen(spec->name) != (size_t)(eq - text) || strncmp(spec->name, text, (size_t)(eq - text))))
        spec++;
    if (!eq || !spec || !spec->name) {
        snprintf(err, errlen, "%s has no attribute '%s'", ir_ops[c->op].name, text);
        return false;
    }
    const char *v = eq + 1;
    char *end = NULL;
    ir_attr *a = &c->attrs[k];
    switch (spec->kind) {
    case IR_ATTR_INT: *a = ir_a_int(spec->name, strtoll(v, &end, 0)); break;
    case IR_ATTR_BOOL: *a = ir_a_bool(spec->name, strtol(v, &end, 10) != 0); break;
    case IR_ATTR_FLOAT: *a = ir_a_float(spec->name, strtod(v, &end)); break;
    case IR_ATTR_STR:
        snprintf(c->strs[k], sizeof c->strs[k], "%s", v);
        *a = ir_a_str(spec->name, c->strs[k]);
        end = (char *)v + strlen(v);
        break;
    case IR_ATTR_INTS:
    case IR_ATTR_FLOATS: {
        int n = 0;
        if (*v++ != '[') break;
        int cap = spec->kind == IR_ATTR_INTS ? (int)(sizeof c->ints[k] / sizeof c->ints[k][0])
                                             : (int)(sizeof c->floats[k] / sizeof c->floats[k][0]);
        while (*v && *v != ']' && n < cap) {
            if (spec->kind == IR_ATTR_INTS) c->ints[k][n++] = strtoll(v, &end, 0);
            else c->floats[k][n++] = strtod(v, &end);
            if (end == v) break;
            v = *end == ',' ? end + 1 : end;
        }
        end = *v == ']' ? (char *)v + 1 : NULL;
        *a = spec->kind == IR_ATTR_INTS ? ir_a_ints(spec->name, n, c->ints[k]) : ir_a_floats(spec->name, n, c->floats[k]);
        break;
    }
    }
    if (!end || *end) {
        snprintf(err, errlen, "%s: bad value in '%s'", ir_ops[c->op].name, text);
        return false;
    }
    return true;
}

/* The words of an attribute alternative (separated by spaces) into c. */
static bool parse_attrs(oc_case *c, const char *text, char *err, size_t errlen)
{
    char buf[ALT_LEN];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
        if (c->nattrs == OC_MAX_ATTRS) {
            snprintf(err, errlen, "%s: more than %d attributes", ir_ops[c->op].name, OC_MAX_ATTRS);
            return false;
        }
        if (!parse_attr(c, c->nattrs++, w, err, errlen)) return false;
    }
    return true;
}

int oc_expand(const op_case *r, oc_case **out, char *err, size_t errlen)
{
    static char shapes[MAX_ALTS][ALT_LEN], groups[4][ALT_LEN], alts[4][MAX_ALTS][ALT_LEN], decls[MAX_ALTS][ALT_LEN];
    *out = NULL;
    int op = ir_op_lookup(r->op);
    if (op < 0) {
        snprintf(err, errlen, "no op '%s' in ops.def", r->op);
        return -1;
    }
    int nshapes = alternatives(r->operands, ';', shapes, MAX_ALTS);
    int ngroups = alternatives(r->attrs, '|', groups, 4);
    int ndecls = alternatives(r->declared, ';', decls, MAX_ALTS), nalts[4], total = nshapes * ndecls;
    for (int g = 0; g < ngroups && total > 0; g++) total *= nalts[g] = alternatives(groups[g], ';', alts[g], MAX_ALTS);
    if (nshapes < 0 || ngroups < 0 || ndecls < 0 || total <= 0) {
        snprintf(err, errlen, "%s: too many or too long alternatives", r->op);
        return -1;
    }
    oc_case *cs = calloc((size_t)total, sizeof *cs);
    if (!cs) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < total; i++) {
        oc_case *c = &cs[i];
        int rest = i, s = rest % nshapes, d;
        rest /= nshapes, d = rest % ndecls, rest /= ndecls;
        c->row = r, c->op = op;
        int len = snprintf(c->label, sizeof c->label, "%s", r->op);
        char buf[ALT_LEN];
        snprintf(buf, sizeof buf, "%s", shapes[s]);
        for (char *save = NULL, *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
            if (c->nin == OC_MAX_IN || !parse_type(w, &c->in[c->nin]) || c->in[c->nin].rank < 0) {
                snprintf(err, errlen, "%s: bad operand type '%s'", r->op, w);
                free(cs);
                return -1;
            }
            c->fixed[c->nin] = c->in[c->nin].dtype != ALLOY_DTYPE_COUNT;
            c->nin++;
            len += snprintf(c->label + len, sizeof c->label - (size_t)len, " %s", w);
        }
        for (int g = 0; g < ngroups; g++) {
            const char *a = alts[g][rest % nalts[g]];
            rest /= nalts[g];
            if (!parse_attrs(c, a, err, errlen)) {
                free(cs);
                return -1;
            }
            if (*a) len += snprintf(c->label + len, sizeof c->label - (size_t)len, " %s", a);
        }
        if (r->declared) {
            if (!parse_type(decls[d], &c->declared)) {
                snprintf(err, errlen, "%s: bad declared type '%s'", r->op, decls[d]);
                free(cs);
                return -1;
            }
            c->has_declared = true;
            c->declared_dtype = c->declared.dtype != ALLOY_DTYPE_COUNT;
            c->declared_shape = c->declared.rank >= 0;
            len += snprintf(c->label + len, sizeof c->label - (size_t)len, " : %s", decls[d]);
        }
    }
    *out = cs;
    return total;
}

/* ---- types, values, references ---- */

ir_type oc_operand_type(const oc_case *c, int k, alloy_dtype dt)
{
    ir_type t = c->in[k];
    if (!c->fixed[k]) t.dtype = dt;
    return t;
}

bool oc_declared_type(const oc_case *c, alloy_dtype dt, ir_type *out)
{
    if (!c->has_declared) return false;
    *out = c->declared;
    if (!c->declared_dtype) out->dtype = dt;
    if (!c->declared_shape) {
        ir_type shape = c->nin ? oc_operand_type(c, 0, dt) : (ir_type){0};
        out->rank = shape.rank;
        memcpy(out->dims, shape.dims, sizeof out->dims);
    }
    return true;
}

bool oc_takes_dtype(const oc_case *c)
{
    for (int k = 0; k < c->nin; k++)
        if (!c->fixed[k]) return true;
    return c->has_declared && !c->declared_dtype;
}

void oc_draw(const oc_case *c, int k, const ir_type *types, const ir_type *result, double *v)
{
    const oc_domain *d = &c->row->dom[k < OC_MAX_IN ? k : 0];
    const ir_type *t = &types[k];
    int64_t n = ir_numel(t);
    double lo = d->lo, hi = d->hi;
    if (lo == 0 && hi == 0) lo = -3, hi = 3;
    bool integer = !ir_is_float(t->dtype);
    if (d->flags & OC_INDEX) {
        const ir_type *of = d->of < 0 ? result : &types[d->of];
        lo = 0, hi = (double)of->dims[d->dim < 0 ? d->dim + of->rank : d->dim];
    }
    for (int64_t i = 0; i < n; i++) {
        double u = test_uniform(lo, hi);
        if (d->flags & OC_AWAY) u *= test_uniform(0, 1) < 0.5 ? -1 : 1;
        if (d->grid > 0) u = d->shift + d->grid * floor(u / d->grid);
        if (d->flags & OC_DISTINCT) u = 0.1 * (double)i - 0.05 * (double)n + test_uniform(-0.01, 0.01);
        if (t->dtype == BOOL) u = test_uniform(0, 1) < 0.5;
        else if (integer) u = (d->flags & OC_INDEX) ? floor(u) : lo > 0 && fabs(u) < 1 ? copysign(1, u) : trunc(u);
        if (!integer && (d->flags & OC_NAN) && i == 3 * k) u = NAN;
        if (!integer && (d->flags & OC_SPECIAL) && i % 5 == 4) u = (const double[]){INFINITY, -INFINITY, NAN}[i / 5 % 3];
        v[i] = test_round_to(t->dtype, u);
    }
    for (int64_t i = n - 1; i > 0 && (d->flags & OC_DISTINCT); i--) { /* random order */
        int64_t j = (int64_t)(test_next_u64() % (uint64_t)(i + 1));
        double s = v[i];
        v[i] = v[j], v[j] = s;
    }
}

oc_ref oc_reference(const oc_case *c)
{
    if (c->row->ref) return c->row->ref;
    return ir_ops[c->op].elementwise ? ref_elementwise : NULL;
}

void oc_evaluate(const oc_case *c, const ir_node *n, const oc_tensor *in, oc_tensor *out)
{
    int64_t count = ir_numel(&out->type);
    memset(out->v, 0, sizeof(double) * (size_t)count);
    oc_reference(c)(n, in, out);
    for (int64_t i = 0; i < count; i++) /* integers as stored; floats beyond the dtype's range overflow */
        if (!ir_is_float(out->type.dtype) || (isfinite(out->v[i]) && isinf(test_round_to(out->type.dtype, out->v[i]))))
            out->v[i] = test_round_to(out->type.dtype, out->v[i]);
}

double oc_bound(const oc_case *c, alloy_dtype dt, bool grad)
{
    const oc_tol *t = grad ? (c->row->gtol ? c->row->gtol : &oc_tol_grad) : c->row->tol ? c->row->tol : &oc_tol_arith;
    switch (dt) {
    case F32: return t->f32;
    case F16: return t->f16;
    case BF16: return t->bf16;
    case F64: return t->f64;
    default: return 0;
    }
}
