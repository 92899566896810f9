/* evaluate.c - the reference evaluator: one node on constant operands in plain C, bit for bit as the CPU. */
#include <string.h>
#include <tgmath.h>

#include "passes/evaluate.h"
#include "base/convert.h"
#include "base/vmath_generic.h"
#include "kernels/ref.h"

/* ---- values as the CPU stores them ---- */

/* v (f32 compute type) stored into dtype dt and loaded back. */
static double stored_f32(alloy_dtype dt, float v)
{
    unsigned char bytes[8];
    double d;
    cvt_store_f32(dt, &v, bytes, 1);
    cvt_load_f64(dt, bytes, &d, 1);
    return d;
}

/* v (f64 compute type) stored into dtype dt and loaded back. */
static double stored_f64(alloy_dtype dt, double v)
{
    unsigned char bytes[8];
    double d;
    cvt_store_f64(dt, &v, bytes, 1);
    cvt_load_f64(dt, bytes, &d, 1);
    return d;
}

/* v as an i64 store gives it: truncated, saturated, NaN 0. */
static int64_t as_i64(double v)
{
    int64_t i;
    cvt_store_f64(ALLOY_I64, &v, &i, 1);
    return i;
}

/* ---- indexing ---- */

/* Row-major multi-index of flat element i of t (which has elements). */
static void unravel(const ir_type *t, int64_t i, int64_t *idx)
{
    for (int d = t->rank - 1; d >= 0; d--) {
        idx[d] = i % t->dims[d];
        i /= t->dims[d];
    }
}

/* Flat index in t of the element that numpy-broadcasts to index idx of a rank-r result. */
static int64_t bcast_index(const ir_type *t, int r, const int64_t *idx)
{
    int64_t off = 0;
    for (int d = 0; d < t->rank; d++) off = off * t->dims[d] + (t->dims[d] == 1 ? 0 : idx[d + r - t->rank]);
    return off;
}

/* ---- elementwise: ops.def's expressions, as cpu_elementwise.c expands them
 * (float's exp, erf and tanh from base/vmath.h there and here: a folded
 * constant has the bits the kernel would compute) ---- */

#define OP(...)
#define EW(nm, nin, at, ty, amp, grad, expr) \
    case IR_OP_##nm: return (T)(expr);
#define P(k) ((T)p[k])

static float ew_f32(int op, float a, float b, float c, const double *p)
{
    typedef float T;
    switch (op) {
#include "ir/ops.def"
    }
    return 0;
}

static double ew_f64(int op, double a, double b, double c, const double *p)
{
    typedef double T;
    switch (op) {
#include "ir/ops.def"
    }
    return 0;
}
#undef OP
#undef EW
#undef P

/* In f64 when an operand is f64 or an integer (cpu_ew_uses_f64), else in f32;
 * the result rounded once to n's dtype. */
static void elementwise(const ir_node *n, const ir_type *const *t, const double *const *in, double *out)
{
    bool wide = false;
    for (int j = 0; j < n->nin; j++)
        wide |= t[j]->dtype == ALLOY_F64 || ir_is_int(t[j]->dtype);
    int64_t idx[ALLOY_MAX_RANK];
    double p[IR_EW_MAX_ATTRS] = {0};
    ir_ew_params(n, p);
    for (int64_t i = 0; i < ir_numel(&n->type); i++) {
        unravel(&n->type, i, idx);
        double v[3] = {0, 0, 0};
        for (int j = 0; j < n->nin; j++) v[j] = in[j][bcast_index(t[j], n->type.rank, idx)];
        out[i] = wide ? stored_f64(n->type.dtype, ew_f64(n->op, v[0], v[1], v[2], p))
                      : stored_f32(n->type.dtype, ew_f32(n->op, (float)v[0], (float)v[1], (float)v[2], p));
    }
}

/* cast: base/convert.c's, the CPU's, from values of n's operand's dtype
 * (exact there) to n's dtype, in chunks. */
static void cast(const ir_node *n, const ir_type *from, const double *x, double *out)
{
    enum { CHUNK = 256 };
    alloy_dtype a = from->dtype, b = n->type.dtype;
    unsigned char src[CHUNK * 8], dst[CHUNK * 8];
    for (int64_t i = 0; i < ir_numel(&n->type); i += CHUNK) {
        size_t len = (size_t)(ir_numel(&n->type) - i < CHUNK ? ir_numel(&n->type) - i : CHUNK);
        cvt_store_f64(a, x + i, src, len);
        cvt_convert(a, src, b, dst, len);
        cvt_load_f64(b, dst, out + i, len);
    }
}

/* ---- data movement: kernels/ref_movement.c, the CPU's kernels, over doubles ---- */

static void movement(const ir_node *n, const ir_type *const *t, const double *const *in, double *out)
{
    const ir_type *o = &n->type;
    size_t es = sizeof *out;
    switch (n->op) {
    case IR_OP_broadcast_to: ref_broadcast_to(t[0], o, es, in[0], out); break;
    case IR_OP_transpose: ref_transpose(n, t[0], es, in[0], out); break;
    case IR_OP_slice: ref_slice(n, t[0], es, in[0], out); break;
    case IR_OP_pad: ref_pad(n, t[0], o, es, in[0], out); break;
    case IR_OP_concat: {
        int axis = 0;
        int64_t at = 0;
        ir_norm_axis(ir_attr_i(n, "axis"), o->rank, &axis);
        for (int j = 0; j < n->nin; j++) {
            ref_place(o, axis, at, t[j], es, in[j], out);
            at += t[j]->dims[axis];
        }
        break;
    }
    default: /* reshape */
        if (ir_numel(o)) memcpy(out, in[0], es * (size_t)ir_numel(o));
        break;
    }
}

/* Out of memory, in why. */
static alloy_status out_of_memory(const ir_node *n, char *why, size_t whylen)
{
    al_fmt(why, whylen, "%s: out of memory", ir_ops[n->op].name);
    return ALLOY_ERR_OOM;
}

/* embedding, gather, index_select: kernels/ref_index.c, the CPU's, over
 * doubles with the indices (operand ix: integers, so exact as doubles) as
 * i64; an index out of range is ALLOY_ERR_INVALID with the CPU's message. */
static alloy_status indexed(const ir_node *n, const ir_type *const *t, const double *const *in, double *out, char *why,
                            size_t whylen)
{
    int ix = n->op == IR_OP_embedding ? 0 : 1;
    int64_t count = ir_numel(t[ix]);
    int64_t *values = al_malloc(sizeof *values * (size_t)(count ? count : 1));
    if (!values) return out_of_memory(n, why, whylen);
    for (int64_t p = 0; p < count; p++) values[p] = as_i64(in[ix][p]);
    ref_index index = {t[ix], ALLOY_I64, values};
    size_t es = sizeof *out;
    alloy_status st = n->op == IR_OP_embedding ? ref_embedding(n, &index, t[1], es, in[1], out, why, whylen)
                      : n->op == IR_OP_gather  ? ref_gather(n, t[0], &index, es, in[0], out, why, whylen)
                                               : ref_index_select(n, t[0], &index, es, in[0], out, why, whylen);
    al_free(values);
    return st;
}

/* arange: kernels/ref_index.c's f64 values, each rounded once to n's dtype. */
static void arange(const ir_node *n, double *out)
{
    ref_arange(n, ALLOY_F64, out);
    for (int64_t i = 0; i < ir_numel(&n->type); i++) out[i] = stored_f64(n->type.dtype, out[i]);
}

/* cumsum: the CPU's running sum (ref_cumsum) in f32 (f64 for f64 and
 * integers), each prefix stored. */
static alloy_status cumsum(const ir_node *n, const ir_type *t, const double *x, double *out, char *why,
                           size_t whylen)
{
    int64_t count = ir_numel(t);
    if (t->dtype == ALLOY_F64 || ir_is_int(t->dtype)) {
        if (count) memcpy(out, x, sizeof *out * (size_t)count);
        ref_cumsum(n, t, true, out);
        for (int64_t i = 0; i < count; i++) out[i] = stored_f64(t->dtype, out[i]);
        return ALLOY_OK;
    }
    float *v = al_malloc(sizeof *v * (size_t)(count ? count : 1));
    if (!v) return out_of_memory(n, why, whylen);
    for (int64_t i = 0; i < count; i++) v[i] = (float)x[i];
    ref_cumsum(n, t, false, v);
    for (int64_t i = 0; i < count; i++) out[i] = stored_f32(t->dtype, v[i]);
    al_free(v);
    return ALLOY_OK;
}

/* reduce_sum / reduce_mean / reduce_max: the CPU's kernels
 * (kernels/ref_reduce.c) in its compute types: f32 for f16/bf16/f32, f64
 * for f64 and for sums and means of integers (stored truncated and
 * saturated), int64 for the maximum of integers. */
static alloy_status reduce(const ir_node *n, const ir_type *t, const double *x, double *out, char *why,
                           size_t whylen)
{
    alloy_dtype dt = t->dtype;
    int64_t count = ir_numel(t), nout = ir_numel(&n->type);
    bool ok = true;
    if (dt == ALLOY_F64 || (ir_is_int(dt) && n->op != IR_OP_reduce_max)) {
        ok = ref_reduce_f64(n, t, x, out);
        for (int64_t o = 0; ok && dt != ALLOY_F64 && o < nout; o++) out[o] = stored_f64(dt, out[o]);
    } else if (dt == ALLOY_F32 || dt == ALLOY_F16 || dt == ALLOY_BF16) {
        float *src = al_malloc(sizeof *src * (size_t)(count ? count : 1));
        float *dst = al_malloc(sizeof *dst * (size_t)(nout ? nout : 1));
        for (int64_t i = 0; src && i < count; i++) src[i] = (float)x[i];
        ok = src && dst && ref_reduce_f32(n, t, src, dst);
        for (int64_t o = 0; ok && o < nout; o++) out[o] = stored_f32(dt, dst[o]);
        al_free(src), al_free(dst);
    } else if (dt == ALLOY_I32 || dt == ALLOY_I64) {
        int64_t *src = al_malloc(sizeof *src * (size_t)(count ? count : 1));
        int64_t *dst = al_malloc(sizeof *dst * (size_t)(nout ? nout : 1));
        for (int64_t i = 0; src && i < count; i++) src[i] = as_i64(x[i]);
        ok = src && dst && ref_reduce_i64(n, t, src, dst);
        alloy_status st = ALLOY_OK;
        for (int64_t o = 0; ok && !st && o < nout; o++) {
            out[o] = dt == ALLOY_I32 ? (int32_t)dst[o] : (double)dst[o];
            if (as_i64(out[o]) != dst[o]) {
                al_fmt(why, whylen, "%s: the i64 result %lld has no exact double", ir_ops[n->op].name,
                       (long long)dst[o]);
                st = ALLOY_ERR_UNSUPPORTED;
            }
        }
        al_free(src), al_free(dst);
        if (st) return st;
    } else {
        al_fmt(why, whylen, "%s: dtype %s is not evaluated", ir_ops[n->op].name, alloy_dtype_name(dt));
        return ALLOY_ERR_UNSUPPORTED;
    }
    return ok ? ALLOY_OK : out_of_memory(n, why, whylen);
}

/* ---- random ops: kernels/ref_random.c, as cpu_random.c runs them ---- */

/* dropout in f32 (f64 for f64), uniform and normal drawn in f64, each
 * value rounded once to n's dtype. */
static alloy_status random_values(const ir_node *n, const double *const *in, double *out, char *why, size_t whylen)
{
    int at = n->op == IR_OP_dropout ? 1 : 0;
    unsigned long long step = n->nin > at ? (unsigned long long)as_i64(in[at][0]) : 0;
    alloy_dtype dt = n->type.dtype;
    int64_t count = ir_numel(&n->type);
    if (n->op != IR_OP_dropout) {
        ref_draw(n, step, 0, count, out);
        for (int64_t i = 0; i < count; i++) out[i] = stored_f64(dt, out[i]);
        return ALLOY_OK;
    }
    if (dt == ALLOY_F64) {
        if (count) memcpy(out, in[0], sizeof *out * (size_t)count);
        ref_dropout(n, step, true, 0, count, out);
        return ALLOY_OK;
    }
    float *v = al_malloc(sizeof *v * (size_t)(count ? count : 1));
    if (!v) return out_of_memory(n, why, whylen);
    for (int64_t i = 0; i < count; i++) v[i] = (float)in[0][i];
    ref_dropout(n, step, false, 0, count, v);
    for (int64_t i = 0; i < count; i++) out[i] = stored_f32(dt, v[i]);
    al_free(v);
    return ALLOY_OK;
}

/* Dispatches on the op; the contract is in evaluate.h. */
alloy_status eval_node(const ir_node *n, const ir_type *const *in_types, const double *const *in, double *out,
                       char *why, size_t whylen)
{
    if (ir_ops[n->op].elementwise && n->nin <= 3) {
        elementwise(n, in_types, in, out);
        return ALLOY_OK;
    }
    switch (n->op) {
    case IR_OP_cast: cast(n, in_types[0], in[0], out); return ALLOY_OK;
    case IR_OP_reshape:
    case IR_OP_broadcast_to:
    case IR_OP_transpose:
    case IR_OP_slice:
    case IR_OP_pad:
    case IR_OP_concat: movement(n, in_types, in, out); return ALLOY_OK;
    case IR_OP_embedding:
    case IR_OP_gather:
    case IR_OP_index_select: return indexed(n, in_types, in, out, why, whylen);
    case IR_OP_arange: arange(n, out); return ALLOY_OK;
    case IR_OP_cumsum: return cumsum(n, in_types[0], in[0], out, why, whylen);
    case IR_OP_reduce_sum:
    case IR_OP_reduce_mean:
    case IR_OP_reduce_max: return reduce(n, in_types[0], in[0], out, why, whylen);
    case IR_OP_dropout:
    case IR_OP_uniform:
    case IR_OP_normal: return random_values(n, in, out, why, whylen);
    default:
        al_fmt(why, whylen, "%s has no reference evaluation", ir_ops[n->op].name);
        return ALLOY_ERR_UNSUPPORTED;
    }
}
