/* test_ops.c - every op's CPU kernel checked against an independent plain-double reference on random inputs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ir/typerules.h"
#include "runtime/cpu/cpu.h"

/* Tolerances on a result's normalized error (see check()). f32: TOL_ARITH
 * where only correctly rounded arithmetic takes part, TOL_TRANS where libm
 * functions (exp, log, tanh, erf, pow) do. f16/bf16: a few ulp of the result
 * dtype (one rounding is at most 4.9e-4 resp. 3.9e-3). f64: TOL_F64.
 * Integers, bools and data movement: exact. */
#define TOL_ARITH 1e-5
#define TOL_TRANS 1e-4
#define TOL_F16 1e-3
#define TOL_BF16 8e-3
#define TOL_F64 1e-12
#define PI 3.14159265358979323846

#define F32 ALLOY_F32
#define F16 ALLOY_F16
#define BF16 ALLOY_BF16
#define F64 ALLOY_F64
#define I32 ALLOY_I32
#define I64 ALLOY_I64
#define BOOL ALLOY_BOOL

static al_arena arena;            /* every tensor of a test; freed after each test */
static bool covered[IR_OP_COUNT]; /* the ops some test has run */
static char run_error[512];       /* the message of the last run_op */
static uint64_t rng = 0x853c49e6748fea9bu;

/* A test tensor: its type and its elements as doubles. */
typedef struct tensor {
    ir_type type;
    double *v;
} tensor;

static double uniform(double lo, double hi) /* splitmix64 */
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return lo + (hi - lo) * (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

static ir_type ty(alloy_dtype dt, int rank, ...)
{
    ir_type t = {.dtype = dt, .rank = rank};
    va_list ap;
    va_start(ap, rank);
    for (int i = 0; i < rank; i++) t.dims[i] = va_arg(ap, int);
    va_end(ap);
    return t;
}

/* v rounded to nearest even with `precision` significant bits, exponents
 * down to min_exp (subnormals below), past max to infinity. */
static double round_binary(double v, int precision, int min_exp, double max)
{
    if (!isfinite(v) || v == 0) return v;
    int e;
    frexp(v, &e);
    double quantum = ldexp(1, (e - 1 < min_exp ? min_exp : e - 1) - (precision - 1));
    double r = nearbyint(v / quantum) * quantum;
    return fabs(r) > max ? copysign(INFINITY, v) : r;
}

/* v as dtype dt holds it, rounded once (integers truncate and saturate, NaN -> 0). */
static double round_to(alloy_dtype dt, double v)
{
    switch (dt) {
    case F32: return (float)v;
    case F16: return round_binary(v, 11, -14, 65504);
    case BF16: return round_binary(v, 8, -126, 0x1.FEp127);
    case I32: return isnan(v) ? 0 : trunc(fmax(fmin(v, 2147483647.0), -2147483648.0));
    case I64: return isnan(v) ? 0 : trunc(fmax(fmin(v, 0x1p63), -0x1p63));
    case BOOL: return v != 0;
    default: return v;
    }
}

static uint16_t f16_bits(double v) /* v exactly representable */
{
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    int e;
    double m = frexp(fabs(v), &e);
    if (isnan(v)) return 0x7e00;
    if (isinf(v)) return sign | 0x7c00;
    if (fabs(v) < 0x1p-14) return sign | (uint16_t)(fabs(v) * 0x1p24);
    return sign | (uint16_t)((e + 14) << 10) | (uint16_t)((m * 2 - 1) * 1024);
}

static void encode(alloy_dtype dt, const double *v, void *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float f = (float)v[i];
        uint32_t u;
        memcpy(&u, &f, 4);
        switch (dt) {
        case F32: ((float *)dst)[i] = f; break;
        case F64: ((double *)dst)[i] = v[i]; break;
        case F16: ((uint16_t *)dst)[i] = f16_bits(v[i]); break;
        case BF16: ((uint16_t *)dst)[i] = (uint16_t)(u >> 16); break;
        case I32: ((int32_t *)dst)[i] = (int32_t)v[i]; break;
        case I64: ((int64_t *)dst)[i] = v[i] >= 0x1p63 ? INT64_MAX : (int64_t)v[i]; break;
        default: ((uint8_t *)dst)[i] = v[i] != 0; break;
        }
    }
}

static double decode(alloy_dtype dt, const void *src, int64_t i)
{
    uint32_t h = dt == F16 || dt == BF16 ? ((const uint16_t *)src)[i] : 0, e = (h >> 10) & 31, m = h & 1023;
    float f;
    switch (dt) {
    case F32: return ((const float *)src)[i];
    case F64: return ((const double *)src)[i];
    case F16:
        return (h & 0x8000 ? -1 : 1) *
               (e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, (int)e - 25));
    case BF16:
        h <<= 16;
        memcpy(&f, &h, 4);
        return f;
    case I32: return ((const int32_t *)src)[i];
    case I64: return (double)((const int64_t *)src)[i];
    default: return ((const uint8_t *)src)[i];
    }
}

static tensor zeros(ir_type t)
{
    tensor x = {t, al_arena_alloc(&arena, sizeof(double) * (size_t)(ir_numel(&t) + 1))};
    assert_non_null(x.v);
    return x;
}

/* Uniform in [lo, hi) rounded to the dtype (bools: 0 or 1 at random). */
static tensor random_tensor(ir_type t, double lo, double hi)
{
    tensor x = zeros(t);
    for (int64_t i = 0; i < ir_numel(&t); i++)
        x.v[i] = t.dtype == BOOL ? uniform(0, 1) < 0.5 : round_to(t.dtype, uniform(lo, hi));
    return x;
}

static void unravel(const ir_type *t, int64_t flat, int64_t *idx)
{
    for (int d = t->rank - 1; d >= 0; d--) {
        idx[d] = flat % t->dims[d];
        flat /= t->dims[d];
    }
}

/* Flat index in t of the element that numpy-broadcasts to index idx of a rank-r result. */
static int64_t bcast_offset(const ir_type *t, int r, const int64_t *idx)
{
    int64_t off = 0;
    for (int d = 0; d < t->rank; d++) off = off * t->dims[d] + (t->dims[d] == 1 ? 0 : idx[d + r - t->rank]);
    return off;
}

/* Builds a graph of nin inputs feeding one `op` node named "under_test",
 * runs it on the CPU and decodes the result into *out. Returns the run's
 * status (its message in run_error); a graph that does not build fails. */
static alloy_status run_op(int op, int nin, const tensor *in, int nattrs, const ir_attr *attrs,
                           const ir_type *declared, tensor *out)
{
    covered[op] = covered[IR_OP_input] = true;
    ir_graph *g = ir_graph_new("test");
    assert_non_null(g);
    int ids[16];
    for (int i = 0; i < nin; i++) {
        ir_node *input = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &in[i].type, NULL);
        if (!input) fail_msg("input %d: %s", i, g->error);
        ids[i] = input->id;
    }
    ir_node *node = ir_add_node(g, op, nin, ids, nattrs, attrs, declared, "under_test");
    if (!node) fail_msg("%s", g->error);
    rt_tensor *values = al_calloc((size_t)g->nnodes, sizeof *values);
    assert_non_null(values);
    for (int i = 0; i < nin; i++) {
        values[i].data = al_arena_alloc(&arena, ir_nbytes(&in[i].type) + 1);
        encode(in[i].type.dtype, in[i].v, values[i].data, ir_numel(&in[i].type));
    }
    cpu_exec x = {.nthreads = 1};
    alloy_status st = cpu_run_graph(&x, g, values, NULL);
    snprintf(run_error, sizeof run_error, "%s", x.error);
    if (st == ALLOY_OK) {
        *out = zeros(node->type);
        for (int64_t i = 0; i < ir_numel(&node->type); i++)
            out->v[i] = decode(node->type.dtype, values[node->id].data, i);
    }
    cpu_release_values(g, values);
    al_free(values);
    ir_graph_free(g);
    return st;
}

static tensor expect_op(int op, int nin, const tensor *in, int nattrs, const ir_attr *attrs,
                        const ir_type *declared)
{
    tensor out = {0};
    if (run_op(op, nin, in, nattrs, attrs, declared, &out)) fail_msg("%s failed: %s", ir_ops[op].name, run_error);
    return out;
}

static double tol_for(alloy_dtype dt, double f32_tol)
{
    return dt == F32 ? f32_tol : dt == F16 ? TOL_F16 : dt == BF16 ? TOL_BF16 : dt == F64 ? TOL_F64 : 0;
}

/* As in ggml's test-backend-ops: the normalized error sqrt(sum (got-ref)^2 /
 * sum ref^2) must be <= tol, and no element may be off by more than
 * 4 * tol * max(|ref|, rms(ref)). Non-finite references must match exactly. */
static void check(const tensor *got, const double *ref, double tol, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int64_t n = ir_numel(&got->type);
    double diff2 = 0, ref2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = got->v[i], r = ref[i];
        if (isfinite(r) && isfinite(g)) diff2 += (g - r) * (g - r), ref2 += r * r;
        else if (!(isnan(r) && isnan(g)) && g != r)
            fail_msg("%s: element %lld is %.9g, expected %.9g", what, (long long)i, g, r);
    }
    double err = ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2), rms = sqrt(ref2 / (double)(n ? n : 1));
    if (err > tol) fail_msg("%s: normalized error %.3g > %.3g", what, err, tol);
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs(got->v[i] - ref[i]) > 4 * tol * fmax(fabs(ref[i]), rms))
            fail_msg("%s: element %lld is %.9g, expected %.9g", what, (long long)i, got->v[i], ref[i]);
}

static const char *shape_str(const ir_type *t)
{
    static char buf[4][96];
    static int next;
    char *b = buf[next++ % 4];
    ir_fmt_type(b, 96, t);
    return b;
}

/* ---- elementwise ---- */

static double ew_ref(int op, double a, double b, double c)
{
    switch (op) {
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
    case IR_OP_isfinite: return isfinite(a) ? 1 : 0;
    case IR_OP_amp_allow:
    case IR_OP_amp_deny: return a;
    /* the backward ops autodiff emits: a is the forward input or output, b or c dy */
    case IR_OP_relu_grad: return a > 0 ? b : 0;
    case IR_OP_gelu_grad: return b * (0.5 * (1 + erf(a / sqrt(2))) + a * exp(-0.5 * a * a) / sqrt(2 * PI));
    case IR_OP_gelu_tanh_grad: {
        double t = tanh(sqrt(2 / PI) * (a + 0.044715 * a * a * a));
        return b * (0.5 * (1 + t) + 0.5 * a * (1 - t * t) * sqrt(2 / PI) * (1 + 3 * 0.044715 * a * a));
    }
    case IR_OP_tanh_grad: return b * (1 - a * a);
    case IR_OP_sigmoid_grad: return b * a * (1 - a);
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
    fail_msg("no reference for %s", ir_ops[op].name);
    return 0;
}

/* One elementwise op on random operands of the given shapes in dtype dt. */
static void check_elementwise(int op, alloy_dtype dt, const ir_type *shapes)
{
    int nin = ir_ops[op].min_in;
    bool positive = op == IR_OP_log || op == IR_OP_sqrt || op == IR_OP_rsqrt || op == IR_OP_pow ||
                    op == IR_OP_sqrt_grad || op == IR_OP_pow_grad_base || op == IR_OP_pow_grad_exp;
    bool ties = ir_ops[op].type == ty_compare || op == IR_OP_maximum || op == IR_OP_minimum ||
                op == IR_OP_maximum_grad || op == IR_OP_minimum_grad || op == IR_OP_reduce_max_grad;
    bool nans = ir_is_float(dt) && (op == IR_OP_maximum || op == IR_OP_minimum || op == IR_OP_relu);
    bool transcendental = op == IR_OP_pow || op == IR_OP_gelu || op == IR_OP_gelu_tanh || op == IR_OP_tanh ||
                          op == IR_OP_sigmoid || op == IR_OP_exp || op == IR_OP_log || op == IR_OP_gelu_grad ||
                          op == IR_OP_gelu_tanh_grad || op == IR_OP_pow_grad_base || op == IR_OP_pow_grad_exp;
    tensor in[3];
    for (int k = 0; k < nin; k++) {
        ir_type t = shapes[k];
        t.dtype = op == IR_OP_where && k == 0 ? BOOL : dt;
        in[k] = random_tensor(t, positive ? 0.25 : -3, positive ? 2.5 : 3);
        for (int64_t i = 0; i < ir_numel(&t); i++) {
            if (ties || ir_is_int(dt)) in[k].v[i] = floor(in[k].v[i]); /* equal values occur */
            if ((op == IR_OP_div || op == IR_OP_div_grad_b) && k == 1) /* divisors away from zero */
                in[k].v[i] = round_to(dt, (uniform(0, 1) < 0.5 ? -1 : 1) * uniform(1, 5));
            if (nans && i == k * 3) in[k].v[i] = NAN; /* NaN wins */
        }
    }
    tensor out = expect_op(op, nin, in, 0, NULL, NULL);
    double *ref = zeros(out.type).v, v[3] = {0, 0, 0};
    int64_t idx[ALLOY_MAX_RANK];
    for (int64_t i = 0; i < ir_numel(&out.type); i++) {
        unravel(&out.type, i, idx);
        for (int k = 0; k < nin; k++) v[k] = in[k].v[bcast_offset(&in[k].type, out.type.rank, idx)];
        ref[i] = ew_ref(op, v[0], v[1], v[2]);
        if (!ir_is_float(out.type.dtype)) ref[i] = round_to(out.type.dtype, ref[i]);
    }
    check(&out, ref, tol_for(out.type.dtype, transcendental ? TOL_TRANS : TOL_ARITH), "%s(%s, %s, %s)",
          ir_ops[op].name, shape_str(&in[0].type), nin > 1 ? shape_str(&in[1].type) : "",
          nin > 2 ? shape_str(&in[2].type) : "");
}

/* Whether integer operands make sense for an elementwise op. */
static bool integer_op(int op)
{
    return ir_ops[op].type == ty_compare || op == IR_OP_neg || op == IR_OP_add || op == IR_OP_sub ||
           op == IR_OP_mul || op == IR_OP_div || op == IR_OP_maximum || op == IR_OP_minimum ||
           op == IR_OP_relu || op == IR_OP_square || op == IR_OP_where;
}

/* Every elementwise op (for integers, those that take them) in dtype dt
 * over broadcasting, scalar, empty and odd shapes. */
static void check_all_elementwise(alloy_dtype dt)
{
    ir_type sets[][3] = {
        {ty(F32, 1, 17)}, {ty(F32, 2, 3, 33)}, {ty(F32, 1, 130)}, {ty(F32, 1, 0)}, {ty(F32, 0)}, {ty(F32, 3, 2, 1, 5)},
        {ty(F32, 3, 4, 1, 5), ty(F32, 2, 3, 1), ty(F32, 1, 5)},   {ty(F32, 0), ty(F32, 1, 17), ty(F32, 0)},
        {ty(F32, 1, 33), ty(F32, 0), ty(F32, 1, 33)},             {ty(F32, 3, 2, 3, 130), ty(F32, 1, 130), ty(F32, 0)},
        {ty(F32, 2, 0, 3), ty(F32, 2, 1, 3), ty(F32, 1, 3)},      {ty(F32, 1, 1), ty(F32, 1, 1), ty(F32, 1, 1)},
        {ty(F32, 2, 17, 1), ty(F32, 2, 1, 33), ty(F32, 2, 17, 33)}};
    for (int op = 0; op < IR_OP_COUNT; op++) {
        if (!ir_ops[op].elementwise || (ir_is_int(dt) && !integer_op(op))) continue;
        for (int s = ir_ops[op].min_in == 1 ? 0 : 6; s < (ir_ops[op].min_in == 1 ? 6 : 13); s++)
            check_elementwise(op, dt, sets[s]);
    }
}

static void test_elementwise_ops_match_a_double_reference_in_f32(void **state)
{
    (void)state;
    check_all_elementwise(F32);
}

static void test_elementwise_ops_round_once_in_f16_bf16_and_f64(void **state)
{
    (void)state;
    check_all_elementwise(F16);
    check_all_elementwise(BF16);
    check_all_elementwise(F64);
}

static void test_elementwise_ops_on_integers_are_exact(void **state)
{
    (void)state;
    check_all_elementwise(I32);
    check_all_elementwise(I64);
}

/* ---- matmul ---- */

/* batch_a..., m, k (k, m if ta) x batch_b..., k, n (n, k if tb); batch dims end at a 0. */
static void check_matmul(alloy_dtype dt, const int *batch_a, const int *batch_b, int m, int k, int n, bool ta, bool tb)
{
    ir_type sa = {.dtype = dt}, sb = {.dtype = dt};
    while (batch_a[sa.rank]) sa.dims[sa.rank] = batch_a[sa.rank], sa.rank++;
    while (batch_b[sb.rank]) sb.dims[sb.rank] = batch_b[sb.rank], sb.rank++;
    sa.dims[sa.rank++] = ta ? k : m, sa.dims[sa.rank++] = ta ? m : k;
    sb.dims[sb.rank++] = tb ? n : k, sb.dims[sb.rank++] = tb ? k : n;
    tensor in[2] = {random_tensor(sa, -1, 1), random_tensor(sb, -1, 1)};
    ir_attr attrs[2] = {ir_a_bool("transpose_a", ta), ir_a_bool("transpose_b", tb)};
    tensor out = expect_op(IR_OP_matmul, 2, in, 2, attrs, NULL);
    double *ref = zeros(out.type).v;
    int r = out.type.rank;
    int64_t idx[ALLOY_MAX_RANK];
    ir_type batch_of_a = sa, batch_of_b = sb; /* the matrix dims as 1, so only batch dims count */
    batch_of_a.dims[sa.rank - 2] = batch_of_a.dims[sa.rank - 1] = batch_of_b.dims[sb.rank - 2] = 1;
    batch_of_b.dims[sb.rank - 1] = 1;
    for (int64_t o = 0; o < ir_numel(&out.type); o++) {
        unravel(&out.type, o, idx);
        int64_t i = idx[r - 2], j = idx[r - 1], s = 0;
        const double *a = in[0].v + bcast_offset(&batch_of_a, r, idx) * m * k;
        const double *b = in[1].v + bcast_offset(&batch_of_b, r, idx) * k * n;
        for (ref[o] = 0; s < k; s++) ref[o] += a[ta ? s * m + i : i * k + s] * b[tb ? j * k + s : s * n + j];
    }
    check(&out, ref, tol_for(dt, TOL_ARITH), "matmul(%s, %s, ta=%d, tb=%d)", shape_str(&sa), shape_str(&sb), ta, tb);
}

static void test_matmul_matches_reference_for_every_transpose_and_broadcast_batch(void **state)
{
    (void)state;
    static const struct { int batch_a[3], batch_b[3], m, k, n; } cases[] = {
        {{0}, {0}, 1, 1, 1},        {{0}, {0}, 17, 33, 5}, {{0}, {0}, 33, 130, 17},
        {{2, 1, 0}, {3, 0}, 5, 7, 4}, {{3, 0}, {0}, 5, 7, 4}, {{0}, {2, 0}, 4, 6, 3}};
    alloy_dtype dts[] = {F32, F64, F16, BF16};
    for (int d = 0; d < 4; d++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int t = 0; t < 4; t++)
                check_matmul(dts[d], cases[c].batch_a, cases[c].batch_b, cases[c].m, cases[c].k, cases[c].n, t & 1,
                             t & 2);
}

static void test_matmul_with_an_empty_inner_or_outer_dimension_gives_zeros_or_nothing(void **state)
{
    (void)state;
    static const int none[1] = {0};
    check_matmul(F32, none, none, 3, 0, 4, false, false);
    check_matmul(F16, none, none, 3, 0, 4, true, true);
    check_matmul(F32, none, none, 0, 5, 4, false, false);
}

/* ---- reductions ---- */

/* Reduces the axes in mask (all of them, with no axes attribute, if all). */
static void check_reduce(int op, const tensor *x, unsigned mask, bool all, bool keep)
{
    int64_t axes[ALLOY_MAX_RANK], nout, count = 1, idx[ALLOY_MAX_RANK];
    int naxes = 0, r = x->type.rank;
    bool reduced[ALLOY_MAX_RANK];
    for (int d = 0; d < r; d++) {
        reduced[d] = all || (mask >> d & 1);
        if (!all && (mask >> d & 1)) axes[naxes++] = (d + (int)mask) % 2 ? d - r : d; /* some negative */
        count *= reduced[d] ? x->type.dims[d] : 1;
    }
    ir_attr attrs[2] = {ir_a_bool("keepdims", keep), ir_a_ints("axes", naxes, axes)};
    tensor out = expect_op(op, 1, x, all ? 1 : 2, attrs, NULL);
    double *ref = zeros(out.type).v;
    nout = ir_numel(&out.type);
    for (int64_t o = 0; o < nout; o++) ref[o] = op == IR_OP_reduce_max ? -INFINITY : 0;
    for (int64_t i = 0, o = 0; i < ir_numel(&x->type); i++, o = 0) {
        unravel(&x->type, i, idx);
        for (int d = 0; d < r; d++) o = reduced[d] ? o : o * x->type.dims[d] + idx[d];
        double v = x->v[i];
        if (op != IR_OP_reduce_max) ref[o] += v;
        else if (!isnan(ref[o]) && (v > ref[o] || isnan(v))) ref[o] = v;
    }
    for (int64_t o = 0; o < nout && op == IR_OP_reduce_mean; o++) /* integer means truncate */
        ref[o] = ir_is_int(x->type.dtype) ? (count ? trunc(ref[o] / (double)count) : 0) : ref[o] / (double)count;
    check(&out, ref, tol_for(x->type.dtype, TOL_ARITH), "%s(%s, axes mask %u%s, keepdims %d)", ir_ops[op].name,
          shape_str(&x->type), mask, all ? " (absent)" : "", keep);
}

static void test_reductions_over_every_axis_subset_of_a_rank3_tensor(void **state)
{
    (void)state;
    alloy_dtype dts[] = {F32, F16, BF16, F64, I32, I64};
    for (int d = 0; d < 6; d++) {
        tensor x = random_tensor(ty(dts[d], 3, 6, 17, 33), -50, 50);
        for (int op = IR_OP_reduce_sum; op <= IR_OP_reduce_max; op++)
            for (unsigned mask = 0; mask <= 8; mask++)
                for (int keep = 0; keep < 2; keep++) check_reduce(op, &x, mask & 7, mask == 8, keep);
    }
}

static void test_reductions_of_edge_shapes_and_empty_axes(void **state)
{
    (void)state;
    tensor scalar = random_tensor(ty(F32, 0), -1, 1), ones = random_tensor(ty(F32, 3, 1, 130, 1), -1, 1);
    tensor empty = random_tensor(ty(F32, 3, 2, 0, 3), -1, 1), big = random_tensor(ty(F32, 2, 130, 33), -1, 1);
    tensor ints = random_tensor(ty(I32, 2, 3, 0), -1, 1);
    for (int op = IR_OP_reduce_sum; op <= IR_OP_reduce_max; op++) {
        check_reduce(op, &scalar, 0, true, false);
        check_reduce(op, &ones, 5, false, true);
        check_reduce(op, &ones, 2, false, false);
        check_reduce(op, &big, 1, false, false);
        check_reduce(op, &big, 2, false, true);
        if (op == IR_OP_reduce_max) continue;      /* empty maxima are type errors */
        check_reduce(op, &empty, 2, false, false); /* sums 0, means NaN */
        check_reduce(op, &empty, 1, false, true);  /* an empty result */
        check_reduce(op, &ints, 2, false, false);  /* the integer mean of nothing is 0 */
    }
}

static void test_reduce_sum_of_a_million_floats_has_logarithmic_error(void **state)
{
    (void)state;
    /* 2^20 values in [0, 1): adding them in order in f32 is off by ~1e-5,
     * pairwise by ~1e-7; both the contiguous and the column-wise path */
    for (int cols = 1; cols <= 4; cols += 3) {
        ir_type t = cols == 1 ? ty(F32, 1, 1 << 20) : ty(F32, 2, 1 << 18, 4);
        tensor x = random_tensor(t, 0, 1);
        int64_t axis = 0;
        ir_attr axes = ir_a_ints("axes", 1, &axis);
        tensor out = expect_op(IR_OP_reduce_sum, 1, &x, 1, &axes, NULL);
        for (int64_t j = 0; j < cols; j++) {
            double exact = 0;
            for (int64_t i = 0; i < t.dims[0]; i++) exact += x.v[i * cols + j];
            if (fabs(out.v[j] - exact) > 1e-6 * exact)
                fail_msg("sum over %s is %.9g, exact %.9g", shape_str(&t), out.v[j], exact);
        }
    }
}

static void test_reduce_max_propagates_nan(void **state)
{
    (void)state;
    tensor x = random_tensor(ty(F32, 2, 4, 5), -1, 1);
    x.v[7] = NAN; /* row 1, column 2 */
    for (unsigned mask = 1; mask <= 3; mask++) check_reduce(IR_OP_reduce_max, &x, mask, false, false);
}

/* ---- softmax, layer_norm, cross_entropy ---- */

static void check_softmax(int op, alloy_dtype dt, ir_type t, int axis, double offset)
{
    t.dtype = dt;
    tensor x = random_tensor(t, offset - 5, offset + 5);
    ir_attr attr = ir_a_int("axis", axis);
    tensor out = expect_op(op, 1, &x, axis == -1 ? 0 : 1, &attr, NULL);
    int ax = axis < 0 ? axis + t.rank : axis;
    int64_t len = t.dims[ax], inner = 1, outer = 1;
    for (int d = 0; d < t.rank; d++) outer *= d < ax ? t.dims[d] : 1, inner *= d > ax ? t.dims[d] : 1;
    double *ref = zeros(t).v;
    for (int64_t o = 0; o < outer * inner; o++) {
        double *x_row = x.v + o / inner * len * inner + o % inner, *ref_row = ref + (x_row - x.v), m = -INFINITY, s = 0;
        for (int64_t i = 0; i < len; i++) m = fmax(m, x_row[i * inner]);
        for (int64_t i = 0; i < len; i++) s += exp(x_row[i * inner] - m);
        for (int64_t i = 0; i < len; i++)
            ref_row[i * inner] = op == IR_OP_softmax ? exp(x_row[i * inner] - m) / s : x_row[i * inner] - m - log(s);
    }
    check(&out, ref, tol_for(dt, TOL_TRANS), "%s(%s, axis %d) near %g", ir_ops[op].name, shape_str(&t), axis, offset);
}

static void test_softmax_and_log_softmax_over_any_axis(void **state)
{
    (void)state;
    ir_type shapes[] = {ty(F32, 3, 3, 5, 7), ty(F32, 1, 17), ty(F32, 2, 2, 130), ty(F32, 1, 1), ty(F32, 2, 0, 4)};
    alloy_dtype dts[] = {F32, F64, F16, BF16};
    for (int op = IR_OP_softmax; op <= IR_OP_log_softmax; op++)
        for (int d = 0; d < 4; d++) {
            for (int axis = -1; axis < 3; axis++) check_softmax(op, dts[d], shapes[0], axis, 0);
            check_softmax(op, dts[d], shapes[0], 1, 1000); /* needs the max subtraction */
            for (int s = 1; s < 5; s++) check_softmax(op, dts[d], shapes[s], -1, 0);
            check_softmax(op, dts[d], shapes[4], 0, 0);
        }
}

static void check_layer_norm(alloy_dtype dt, ir_type t, bool affine, double eps)
{
    t.dtype = dt;
    int64_t d = t.dims[t.rank - 1], rows = ir_numel(&t) / d;
    tensor in[3] = {random_tensor(t, 3, 7), random_tensor(ty(dt, 1, (int)d), 0.5, 2),
                    random_tensor(ty(dt, 1, (int)d), -1, 1)};
    ir_attr attr = ir_a_float("eps", eps);
    tensor out = expect_op(IR_OP_layer_norm, affine ? 3 : 1, in, eps == 1e-5 ? 0 : 1, &attr, NULL);
    double *ref = zeros(t).v;
    for (int64_t r = 0; r < rows; r++) {
        const double *x = in[0].v + r * d;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; i++) mean += x[i] / (double)d;
        for (int64_t i = 0; i < d; i++) var += (x[i] - mean) * (x[i] - mean) / (double)d; /* biased */
        for (int64_t i = 0; i < d; i++) {
            double y = (x[i] - mean) / sqrt(var + eps);
            ref[r * d + i] = affine ? y * in[1].v[i] + in[2].v[i] : y;
        }
    }
    check(&out, ref, tol_for(dt, TOL_ARITH), "layer_norm(%s, affine %d, eps %g)", shape_str(&t), affine, eps);
}

static void test_layer_norm_normalizes_the_last_axis_with_and_without_affine(void **state)
{
    (void)state;
    ir_type shapes[] = {ty(F32, 2, 5, 17), ty(F32, 3, 2, 3, 33), ty(F32, 1, 130), ty(F32, 2, 4, 1)};
    alloy_dtype dts[] = {F32, F64, F16, BF16};
    for (int d = 0; d < 4; d++)
        for (int s = 0; s < 4; s++) {
            check_layer_norm(dts[d], shapes[s], false, 1e-5);
            check_layer_norm(dts[d], shapes[s], true, 1e-5);
            check_layer_norm(dts[d], shapes[s], true, 1e-2);
        }
}

static void check_cross_entropy(alloy_dtype dt, ir_type t, alloy_dtype target_dt)
{
    t.dtype = dt;
    int64_t classes = t.dims[t.rank - 1], positions = ir_numel(&t) / classes;
    ir_type tt = t;
    tt.dtype = target_dt, tt.rank--;
    tensor in[2] = {random_tensor(t, -4, 4), random_tensor(tt, 0, (double)classes)};
    tensor out = expect_op(IR_OP_cross_entropy, 2, in, 0, NULL, NULL);
    double ref = 0;
    for (int64_t p = 0; p < positions; p++) {
        const double *row = in[0].v + p * classes;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < classes; c++) m = fmax(m, row[c]);
        for (int64_t c = 0; c < classes; c++) s += exp(row[c] - m);
        ref += (log(s) + m - row[(int64_t)in[1].v[p]]) / (double)positions;
    }
    check(&out, &ref, tol_for(dt, TOL_TRANS), "cross_entropy(%s, %s)", shape_str(&t), shape_str(&tt));
}

static void test_cross_entropy_is_the_mean_negative_log_likelihood(void **state)
{
    (void)state;
    alloy_dtype dts[] = {F32, F64, F16, BF16};
    for (int d = 0; d < 4; d++) {
        check_cross_entropy(dts[d], ty(F32, 2, 4, 7), I32);
        check_cross_entropy(dts[d], ty(F32, 3, 2, 3, 5), I64);
        check_cross_entropy(dts[d], ty(F32, 2, 1, 130), I32);
        check_cross_entropy(dts[d], ty(F32, 1, 17), I64);
    }
}

static void test_cross_entropy_rejects_a_target_out_of_range_naming_the_node(void **state)
{
    (void)state;
    for (int bad = -1; bad <= 7; bad += 8) {
        tensor in[2] = {random_tensor(ty(F32, 2, 4, 7), -1, 1), random_tensor(ty(I64, 1, 4), 0, 7)}, out;
        in[1].v[2] = bad;
        assert_int_equal(run_op(IR_OP_cross_entropy, 2, in, 0, NULL, NULL, &out), ALLOY_ERR_INVALID);
        char value[32];
        snprintf(value, sizeof value, "target %d", bad);
        if (!strstr(run_error, "under_test") || !strstr(run_error, value) || !strstr(run_error, "[2]"))
            fail_msg("message lacks the node, value or position: %s", run_error);
    }
}

/* ---- data movement ---- */

static void test_constant_fills_or_lists_values_rounded_once_in_every_dtype(void **state)
{
    (void)state;
    /* 1 + 2^-11 + 2^-40 rounds up to f16 1 + 2^-10 directly, but to 1 via f32 (bf16: 2^-8) */
    double values[6] = {0, 1.5, -2.75, 1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-8 + 0x1p-40, -0.5};
    for (alloy_dtype dt = 0; dt < ALLOY_DTYPE_COUNT; dt++) {
        ir_type t = ty(dt, 2, 2, 3);
        ir_attr list = ir_a_floats("values", 6, values), fill = ir_a_float("value", -2.75);
        tensor got = expect_op(IR_OP_constant, 0, NULL, 1, &list, &t), ref = zeros(t);
        for (int i = 0; i < 6; i++) ref.v[i] = round_to(dt, values[i]);
        check(&got, ref.v, 0, "constant %s values", alloy_dtype_name(dt));
        got = expect_op(IR_OP_constant, 0, NULL, 1, &fill, &t);
        for (int i = 0; i < 6; i++) ref.v[i] = round_to(dt, -2.75);
        check(&got, ref.v, 0, "constant %s fill", alloy_dtype_name(dt));
    }
}

static void test_embedding_gathers_table_rows_by_id(void **state)
{
    (void)state;
    ir_type ids[] = {ty(I32, 2, 2, 3), ty(I64, 1, 5), ty(I64, 0), ty(I32, 1, 0)};
    alloy_dtype dts[] = {F32, F16, F64, I64};
    for (int d = 0; d < 4; d++)
        for (int s = 0; s < 4; s++) {
            tensor in[2] = {random_tensor(ids[s], 0, 10), random_tensor(ty(dts[d], 2, 10, 6), -5, 5)};
            tensor out = expect_op(IR_OP_embedding, 2, in, 0, NULL, NULL);
            double *ref = zeros(out.type).v;
            for (int64_t i = 0; i < ir_numel(&out.type); i++) ref[i] = in[1].v[(int64_t)in[0].v[i / 6] * 6 + i % 6];
            check(&out, ref, 0, "embedding(%s, %s)", shape_str(&in[0].type), shape_str(&in[1].type));
        }
}

static void test_embedding_rejects_an_id_out_of_range_naming_the_node(void **state)
{
    (void)state;
    tensor in[2] = {random_tensor(ty(I32, 2, 2, 3), 0, 10), random_tensor(ty(F32, 2, 10, 4), -1, 1)}, out;
    in[0].v[4] = 10;
    assert_int_equal(run_op(IR_OP_embedding, 2, in, 0, NULL, NULL, &out), ALLOY_ERR_INVALID);
    if (!strstr(run_error, "under_test") || !strstr(run_error, "id 10") || !strstr(run_error, "[1,1]"))
        fail_msg("message lacks the node, id or position: %s", run_error);
}

static void test_reshape_keeps_the_bytes(void **state)
{
    (void)state;
    tensor x = random_tensor(ty(F16, 3, 2, 3, 4), -1, 1);
    ir_type t = ty(F16, 2, 4, 6);
    tensor out = expect_op(IR_OP_reshape, 1, &x, 0, NULL, &t);
    check(&out, x.v, 0, "reshape");
}

static void check_transpose(alloy_dtype dt, ir_type t, const int64_t *perm)
{
    t.dtype = dt;
    tensor x = random_tensor(t, -9, 9);
    ir_attr attr = ir_a_ints("perm", t.rank, perm);
    tensor out = expect_op(IR_OP_transpose, 1, &x, 1, &attr, NULL);
    double *ref = zeros(out.type).v;
    int64_t idx[ALLOY_MAX_RANK], in_idx[ALLOY_MAX_RANK], off = 0;
    for (int64_t i = 0; i < ir_numel(&out.type); i++, off = 0) {
        unravel(&out.type, i, idx);
        for (int d = 0; d < t.rank; d++) in_idx[perm[d]] = idx[d];
        for (int d = 0; d < t.rank; d++) off = off * t.dims[d] + in_idx[d];
        ref[i] = x.v[off];
    }
    check(&out, ref, 0, "transpose(%s) perm %lld %lld ...", shape_str(&t), (long long)perm[0], (long long)perm[1]);
}

static void test_transpose_handles_every_rank3_permutation_and_large_tiles(void **state)
{
    (void)state;
    static const int64_t perms3[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    static const int64_t swap[2] = {1, 0}, p4[4] = {3, 1, 0, 2}, r4[4] = {3, 2, 1, 0};
    for (int p = 0; p < 6; p++) {
        check_transpose(F32, ty(F32, 3, 3, 5, 7), perms3[p]);
        check_transpose(BOOL, ty(F32, 3, 2, 17, 33), perms3[p]);
        check_transpose(F64, ty(F32, 3, 1, 33, 1), perms3[p]);
    }
    check_transpose(F16, ty(F32, 2, 33, 130), swap);
    check_transpose(F64, ty(F32, 2, 130, 33), swap);
    check_transpose(F32, ty(F32, 2, 0, 3), swap);
    check_transpose(I64, ty(F32, 4, 2, 3, 4, 5), p4);
    check_transpose(I32, ty(F32, 4, 1, 5, 1, 7), r4);
}

static void test_broadcast_to_repeats_size_one_and_missing_dims(void **state)
{
    (void)state;
    ir_type from[] = {ty(F32, 2, 3, 1), ty(F16, 0),    ty(F32, 1, 4),      ty(F64, 2, 1, 1), ty(I32, 4, 3, 1, 1, 4),
                      ty(F32, 1, 5),    ty(BOOL, 2, 3, 1)};
    ir_type to[] = {ty(F32, 3, 2, 3, 4), ty(F16, 1, 5),  ty(F32, 3, 2, 3, 4), ty(F64, 2, 1, 1), ty(I32, 4, 3, 5, 6, 4),
                    ty(F32, 2, 0, 5),    ty(BOOL, 3, 2, 3, 130)};
    for (int c = 0; c < 7; c++) {
        tensor x = random_tensor(from[c], -9, 9), out = expect_op(IR_OP_broadcast_to, 1, &x, 0, NULL, &to[c]);
        double *ref = zeros(to[c]).v;
        int64_t idx[ALLOY_MAX_RANK];
        for (int64_t i = 0; i < ir_numel(&to[c]); i++) {
            unravel(&to[c], i, idx);
            ref[i] = x.v[bcast_offset(&from[c], to[c].rank, idx)];
        }
        check(&out, ref, 0, "broadcast_to(%s -> %s)", shape_str(&from[c]), shape_str(&to[c]));
    }
}

static void test_slice_takes_a_range_along_any_axis(void **state)
{
    (void)state;
    tensor x = random_tensor(ty(F32, 3, 4, 6, 5), -9, 9);
    static const int ranges[][3] = {{0, 1, 3}, {1, 0, 6}, {2, 2, 2}, {-1, 3, 5}, {1, 5, 6}, {2, 0, 5}};
    for (int c = 0; c < 6; c++) {
        ir_attr attrs[3] = {ir_a_int("axis", ranges[c][0]), ir_a_int("start", ranges[c][1]),
                            ir_a_int("end", ranges[c][2])};
        tensor out = expect_op(IR_OP_slice, 1, &x, 3, attrs, NULL);
        double *ref = zeros(out.type).v;
        int64_t idx[ALLOY_MAX_RANK];
        for (int64_t i = 0; i < ir_numel(&out.type); i++) {
            unravel(&out.type, i, idx);
            idx[(ranges[c][0] + 3) % 3] += ranges[c][1];
            ref[i] = x.v[(idx[0] * 6 + idx[1]) * 5 + idx[2]];
        }
        check(&out, ref, 0, "slice axis %d [%d, %d)", ranges[c][0], ranges[c][1], ranges[c][2]);
    }
}

static void test_concat_joins_operands_along_any_axis(void **state)
{
    (void)state;
    for (int axis = -1; axis < 3; axis++) {
        int ax = (axis + 3) % 3, sizes[3] = {3, 1, 0};
        tensor in[3];
        for (int k = 0; k < 3; k++) {
            ir_type t = ty(F16, 3, 2, 3, 4);
            t.dims[ax] = sizes[k];
            in[k] = random_tensor(t, -9, 9);
        }
        ir_attr attr = ir_a_int("axis", axis);
        tensor out = expect_op(IR_OP_concat, 3, in, 1, &attr, NULL);
        double *ref = zeros(out.type).v;
        int64_t idx[ALLOY_MAX_RANK];
        for (int64_t i = 0; i < ir_numel(&out.type); i++) {
            unravel(&out.type, i, idx);
            int k = 0;
            while (idx[ax] >= sizes[k]) idx[ax] -= sizes[k++];
            const int64_t *dims = in[k].type.dims;
            ref[i] = in[k].v[(idx[0] * dims[1] + idx[1]) * dims[2] + idx[2]];
        }
        check(&out, ref, 0, "concat axis %d", axis);
    }
}

static void test_causal_mask_hides_keys_after_each_query(void **state)
{
    (void)state;
    ir_type shapes[] = {ty(F32, 2, 4, 4), ty(F32, 3, 2, 3, 5), ty(F32, 2, 1, 1), ty(F32, 3, 2, 0, 3)};
    alloy_dtype dts[] = {F32, F16, BF16, F64};
    double values[] = {-INFINITY, 0, -1e4 - 1}; /* the default, then the attribute */
    for (int d = 0; d < 4; d++)
        for (int s = 0; s < 4; s++)
            for (int v = 0; v < 3; v++) {
                ir_type t = shapes[s];
                t.dtype = dts[d];
                ir_attr value = ir_a_float("value", values[v]);
                tensor x = random_tensor(t, -9, 9), out = expect_op(IR_OP_causal_mask, 1, &x, v > 0, &value, NULL);
                int64_t tq = t.dims[t.rank - 2], tk = t.dims[t.rank - 1];
                double *ref = zeros(t).v;
                for (int64_t i = 0; i < ir_numel(&t); i++)
                    ref[i] = i % tk > (i / tk) % tq + (tk - tq) ? round_to(dts[d], values[v]) : x.v[i];
                check(&out, ref, 0, "causal_mask(%s, value %g)", shape_str(&t), values[v]);
            }
}

static void test_cast_converts_between_every_pair_of_dtypes_rounding_once(void **state)
{
    (void)state;
    double values[] = {0, 1, -1, 2.5, -3.75, 100.125, 1e-3, -7, 1.0 / 3, 70000, 1 + 0x1p-11 + 0x1p-40,
                       1 + 0x1p-8 + 0x1p-40, -1e10, 3e9, NAN, INFINITY, -INFINITY};
    int count = (int)(sizeof values / sizeof values[0]);
    for (alloy_dtype from = 0; from < ALLOY_DTYPE_COUNT; from++)
        for (alloy_dtype to = 0; to < ALLOY_DTYPE_COUNT; to++) {
            ir_type t = ty(from, 1, count), t_out = ty(to, 1, count);
            tensor x = zeros(t);
            for (int i = 0; i < count; i++) x.v[i] = round_to(from, values[i]);
            tensor out = expect_op(IR_OP_cast, 1, &x, 0, NULL, &t_out);
            double *ref = zeros(t_out).v;
            for (int i = 0; i < count; i++) ref[i] = round_to(to, x.v[i]);
            check(&out, ref, 0, "cast %s -> %s", alloy_dtype_name(from), alloy_dtype_name(to));
        }
}

/* found_inf: true exactly when some element of some operand is inf or NaN,
 * whatever the operands' float dtypes. */
static void test_found_inf_sees_an_inf_or_nan_in_any_operand_of_any_float_dtype(void **state)
{
    (void)state;
    const alloy_dtype dts[] = {F32, F16, BF16, F64};
    const double bad[] = {INFINITY, -INFINITY, NAN};
    for (size_t d = 0; d < 4; d++) {
        for (size_t b = 0; b < 3; b++) {
            tensor in[3];
            for (int k = 0; k < 3; k++) {
                in[k] = zeros(ty(dts[(d + (size_t)k) % 4], 2, 3, 5));
                for (int i = 0; i < 15; i++) in[k].v[i] = round_to(in[k].type.dtype, uniform(-100, 100));
            }
            tensor ok = expect_op(IR_OP_found_inf, 3, in, 0, NULL, NULL);
            assert_int_equal(ok.type.rank, 0);
            assert_true(ok.v[0] == 0);
            in[2].v[14] = bad[b]; /* the last element of the last operand */
            tensor hit = expect_op(IR_OP_found_inf, 3, in, 0, NULL, NULL);
            assert_true(hit.v[0] == 1);
        }
    }
}

static void test_every_op_in_the_table_was_run(void **state)
{
    (void)state;
    /* param and state are leaves like input (the executor only reads them); the
     * structured backward ops (kernels in cpu_grad.c) are outside this suite */
    static const char *elsewhere[] = {"param", "state", "softmax_grad", "log_softmax_grad", "layer_norm_grad",
                                      "rms_norm", "rms_norm_grad", /* test_rows.c */
                                      "cross_entropy_grad", "embedding_grad", "pad"};
    for (size_t i = 0; i < sizeof elsewhere / sizeof elsewhere[0]; i++)
        if (ir_op_lookup(elsewhere[i]) >= 0) covered[ir_op_lookup(elsewhere[i])] = true;
    for (int op = 0; op < IR_OP_COUNT; op++)
        if (!covered[op]) fail_msg("no test runs op %s", ir_ops[op].name);
}

static int free_arena(void **state)
{
    (void)state;
    al_arena_free(&arena);
    return 0;
}

#define TEST(f) cmocka_unit_test_teardown(f, free_arena)

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_elementwise_ops_match_a_double_reference_in_f32),
        TEST(test_found_inf_sees_an_inf_or_nan_in_any_operand_of_any_float_dtype),
        TEST(test_elementwise_ops_round_once_in_f16_bf16_and_f64),
        TEST(test_elementwise_ops_on_integers_are_exact),
        TEST(test_matmul_matches_reference_for_every_transpose_and_broadcast_batch),
        TEST(test_matmul_with_an_empty_inner_or_outer_dimension_gives_zeros_or_nothing),
        TEST(test_reductions_over_every_axis_subset_of_a_rank3_tensor),
        TEST(test_reductions_of_edge_shapes_and_empty_axes),
        TEST(test_reduce_sum_of_a_million_floats_has_logarithmic_error),
        TEST(test_reduce_max_propagates_nan),
        TEST(test_softmax_and_log_softmax_over_any_axis),
        TEST(test_layer_norm_normalizes_the_last_axis_with_and_without_affine),
        TEST(test_cross_entropy_is_the_mean_negative_log_likelihood),
        TEST(test_cross_entropy_rejects_a_target_out_of_range_naming_the_node),
        TEST(test_constant_fills_or_lists_values_rounded_once_in_every_dtype),
        TEST(test_embedding_gathers_table_rows_by_id),
        TEST(test_embedding_rejects_an_id_out_of_range_naming_the_node),
        TEST(test_reshape_keeps_the_bytes),
        TEST(test_transpose_handles_every_rank3_permutation_and_large_tiles),
        TEST(test_broadcast_to_repeats_size_one_and_missing_dims),
        TEST(test_slice_takes_a_range_along_any_axis),
        TEST(test_concat_joins_operands_along_any_axis),
        TEST(test_causal_mask_hides_keys_after_each_query),
        TEST(test_cast_converts_between_every_pair_of_dtypes_rounding_once),
        TEST(test_every_op_in_the_table_was_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
