/* cpu_elementwise.c - elementwise ops: chunk functions generated from ops.def and one broadcasting loop. */
/* No trapping math here (vmath.h, CPU_VECTOR_CLONES): the chunk functions'
 * selects then vectorize on every ISA level, not only with AVX-512's masks. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <string.h>
#include <tgmath.h>

#include "base/convert.h"
#include "base/vmath_generic.h"
#include "runtime/cpu/cpu.h"

/* Each EW line of ops.def becomes two chunk functions whose body is the op's
 * expression evaluated in T = float or double, its attributes P(k) read
 * from p and converted to T. Operands the op does not use point at a, so
 * the loop has no branch and vectorizes (exp/erf/tanh of float included:
 * base/vmath.h), one clone per ISA (an ifunc: the table's pointer
 * resolves to the clone when the library loads). */
#define OP(...)
#define P(k) ((T)p[k])
#define EW_BODY(T_, nm, expr)                                                              \
    CPU_VECTOR_CLONES void ew_##nm##_##T_(int64_t n, T_##_t *y, const T_##_t *pa,          \
                                          const T_##_t *pb, const T_##_t *pc,              \
                                          const double *p)                                 \
    {                                                                                      \
        typedef T_##_t T;                                                                  \
        (void)p;                                                                           \
        for (int64_t i = 0; i < n; i++) {                                                  \
            T a = pa[i], b = pb[i], c = pc[i];                                             \
            (void)a, (void)b, (void)c;                                                     \
            y[i] = (T)(expr);                                                              \
        }                                                                                  \
    }
typedef float f32_t;
typedef double f64_t;
#define EW(nm, nin, at, ty, amp, grad, expr) EW_BODY(f32, nm, expr) EW_BODY(f64, nm, expr)
#include "ir/ops.def"
#undef OP
#undef EW
#undef P

enum { CHUNK = 1024, MAX_IN = 3 };

bool cpu_ew_uses_f64(const ir_node *n, const rt_tensor *in)
{
    for (int i = 0; i < n->nin; i++) {
        alloy_dtype dt = in[i].type.dtype;
        if (dt == ALLOY_F64 || dt == ALLOY_I32 || dt == ALLOY_I64) return true;
    }
    return false;
}

/* The iteration space after merging dims that every operand walks the same
 * way: out dims[0..rank) with each input's element stride per dim. */
typedef struct ew_space {
    int rank;
    int64_t dims[ALLOY_MAX_RANK];
    int64_t stride[MAX_IN][ALLOY_MAX_RANK];
} ew_space;

static void build_space(ew_space *s, const ir_type *out, int nin, const rt_tensor *in)
{
    int r = out->rank;
    int64_t st[MAX_IN][ALLOY_MAX_RANK];
    for (int k = 0; k < nin; k++) {
        const ir_type *t = &in[k].type;
        int64_t acc = 1;
        for (int d = r - 1; d >= 0; d--) {
            int td = d - (r - t->rank);
            int64_t size = td >= 0 ? t->dims[td] : 1;
            st[k][d] = size == 1 ? 0 : acc;
            acc *= size;
        }
    }
    /* drop size-1 dims, then merge d into the dim after it when contiguous */
    s->rank = 0;
    for (int d = 0; d < r; d++) {
        if (out->dims[d] == 1) continue;
        if (s->rank > 0) {
            int p = s->rank - 1;
            bool merge = true;
            for (int k = 0; k < nin; k++)
                if (s->stride[k][p] != st[k][d] * out->dims[d]) merge = false;
            if (merge) {
                s->dims[p] *= out->dims[d];
                for (int k = 0; k < nin; k++) s->stride[k][p] = st[k][d];
                continue;
            }
        }
        s->dims[s->rank] = out->dims[d];
        for (int k = 0; k < nin; k++) s->stride[k][s->rank] = st[k][d];
        s->rank++;
    }
    if (s->rank == 0) {
        s->rank = 1;
        s->dims[0] = 1;
        for (int k = 0; k < nin; k++) s->stride[k][0] = 0;
    }
}

/* Loads len elements of an operand walking with inner stride 0 (broadcast) or 1,
 * converting to the compute type; returns the source itself when no
 * conversion is needed. */
static const float *load_f32(const rt_tensor *t, int64_t off, int64_t stride, int64_t len, float *buf)
{
    size_t es = alloy_dtype_size(t->type.dtype);
    const char *src = (const char *)t->data + (size_t)off * es;
    if (stride == 0) {
        float v;
        cvt_load_f32(t->type.dtype, src, &v, 1);
        for (int64_t i = 0; i < len; i++) buf[i] = v;
        return buf;
    }
    if (t->type.dtype == ALLOY_F32) return (const float *)(const void *)src;
    cvt_load_f32(t->type.dtype, src, buf, (size_t)len);
    return buf;
}

static const double *load_f64(const rt_tensor *t, int64_t off, int64_t stride, int64_t len, double *buf)
{
    size_t es = alloy_dtype_size(t->type.dtype);
    const char *src = (const char *)t->data + (size_t)off * es;
    if (stride == 0) {
        double v;
        cvt_load_f64(t->type.dtype, src, &v, 1);
        for (int64_t i = 0; i < len; i++) buf[i] = v;
        return buf;
    }
    if (t->type.dtype == ALLOY_F64) return (const double *)(const void *)src;
    cvt_load_f64(t->type.dtype, src, buf, (size_t)len);
    return buf;
}

/* One elementwise node alone: out = op(in...) with broadcasting, through the
 * op's chunk functions (in f64 when cpu_ew_uses_f64, else f32). A compiled
 * schedule never asks for it (every elementwise node is in an EW step, which
 * cpu_fused.c runs with the same chunk functions); it is the op table's kernel
 * for an op step a bundle's schedule could name, and the node-by-node
 * reference that test_fuse.c and test_plan.c compare fused runs against. */
alloy_status cpu_elementwise(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const cpu_op *info = &cpu_ops[n->op];
    int nin = n->nin;
    if (nin > MAX_IN) return cpu_fail(x, ALLOY_ERR_UNSUPPORTED, "%s: too many operands", ir_ops[n->op].name);
    if (ir_numel(&out->type) == 0) return ALLOY_OK;
    ew_space s;
    build_space(&s, &out->type, nin, in);
    bool wide = cpu_ew_uses_f64(n, in);
    int64_t inner = s.dims[s.rank - 1];
    int64_t outer = 1;
    for (int d = 0; d < s.rank - 1; d++) outer *= s.dims[d];
    size_t out_es = alloy_dtype_size(out->type.dtype);
    int64_t idx[ALLOY_MAX_RANK] = {0};
    int64_t off[MAX_IN] = {0};
    union {
        float f[MAX_IN + 1][CHUNK];
        double d[MAX_IN + 1][CHUNK];
    } buf;
    int64_t out_off = 0;
    double params[IR_EW_MAX_ATTRS] = {0};
    ir_ew_params(n, params);
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t j0 = 0; j0 < inner; j0 += CHUNK) {
            int64_t len = inner - j0 < CHUNK ? inner - j0 : CHUNK;
            char *dst = (char *)out->data + (size_t)(out_off + j0) * out_es;
            if (wide) {
                const double *p[MAX_IN] = {buf.d[0], buf.d[0], buf.d[0]};
                for (int k = 0; k < nin; k++) {
                    int64_t sk = s.stride[k][s.rank - 1];
                    p[k] = load_f64(&in[k], off[k] + j0 * sk, sk, len, buf.d[k]);
                }
                for (int k = nin; k < MAX_IN; k++) p[k] = p[0];
                double *y = out->type.dtype == ALLOY_F64 ? (double *)(void *)dst : buf.d[MAX_IN];
                info->ew_f64(len, y, p[0], p[1], p[2], params);
                if (y != (double *)(void *)dst) cvt_store_f64(out->type.dtype, y, dst, (size_t)len);
            } else {
                const float *p[MAX_IN] = {buf.f[0], buf.f[0], buf.f[0]};
                for (int k = 0; k < nin; k++) {
                    int64_t sk = s.stride[k][s.rank - 1];
                    p[k] = load_f32(&in[k], off[k] + j0 * sk, sk, len, buf.f[k]);
                }
                for (int k = nin; k < MAX_IN; k++) p[k] = p[0];
                float *y = out->type.dtype == ALLOY_F32 ? (float *)(void *)dst : buf.f[MAX_IN];
                info->ew_f32(len, y, p[0], p[1], p[2], params);
                if (y != (float *)(void *)dst) cvt_store_f32(out->type.dtype, y, dst, (size_t)len);
            }
        }
        out_off += inner;
        /* advance the outer multi-index and every operand's offset */
        for (int d = s.rank - 2; d >= 0; d--) {
            idx[d]++;
            for (int k = 0; k < nin; k++) off[k] += s.stride[k][d];
            if (idx[d] < s.dims[d]) break;
            for (int k = 0; k < nin; k++) off[k] -= s.stride[k][d] * s.dims[d];
            idx[d] = 0;
        }
    }
    return ALLOY_OK;
}
