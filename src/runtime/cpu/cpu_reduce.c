/* cpu_reduce.c - reduce_sum, reduce_mean and reduce_max (each dtype to its compute type and kernels/ref_reduce.c), argmax and argmin along an axis. */
#include "base/convert.h"
#include "kernels/ref.h"
#include "runtime/cpu/cpu.h"

/* reduce_sum / reduce_mean / reduce_max over `axes` (all when absent),
 * accumulating in f32 (f16, bf16, f32) or f64 (f64, and the sums and means
 * of integers) and rounding once on store: integer results are truncated
 * toward zero and saturated, as every integer op's (docs/ir.md, "Integer
 * arithmetic"). The maximum of integers compares them exactly. The mean of
 * no elements is NaN (0 for integers); a NaN makes the maximum NaN. */
alloy_status cpu_reduce(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    if (ir_numel(&out->type) == 0) return ALLOY_OK;
    const ir_type *t = &in[0].type;
    alloy_dtype dt = t->dtype;
    size_t numel = (size_t)ir_numel(t), nout = (size_t)ir_numel(&out->type);
    bool ok = false;
    void *src = NULL, *dst = NULL; /* converted copies, when needed */
    switch (dt) {
    case ALLOY_F32:
        ok = ref_reduce_f32(n, t, in[0].data, out->data);
        break;
    case ALLOY_F64:
        ok = ref_reduce_f64(n, t, in[0].data, out->data);
        break;
    case ALLOY_I64:
    case ALLOY_I32:
        if (n->op == IR_OP_reduce_max) { /* exact: compares, no arithmetic */
            if (dt == ALLOY_I64) {
                ok = ref_reduce_i64(n, t, in[0].data, out->data);
                break;
            }
            src = al_malloc(sizeof(int64_t) * (numel ? numel : 1));
            dst = al_malloc(sizeof(int64_t) * nout);
            if (!src || !dst) break;
            for (size_t i = 0; i < numel; i++) ((int64_t *)src)[i] = ((const int32_t *)in[0].data)[i];
            ok = ref_reduce_i64(n, t, src, dst);
            for (size_t i = 0; ok && i < nout; i++) ((int32_t *)out->data)[i] = (int32_t)((int64_t *)dst)[i];
            break;
        }
        /* sums and means in f64, stored truncated and saturated */
        src = al_malloc(sizeof(double) * (numel ? numel : 1));
        dst = al_malloc(sizeof(double) * nout);
        if (!src || !dst) break;
        cvt_load_f64(dt, in[0].data, src, numel);
        ok = ref_reduce_f64(n, t, src, dst);
        if (ok) cvt_store_f64(dt, dst, out->data, nout);
        break;
    case ALLOY_F16:
    case ALLOY_BF16: /* read a few thousand at a time, widened as reached: no f32 copy of the input */
        dst = al_malloc(sizeof(float) * nout);
        if (!dst) break;
        ok = ref_reduce_half(n, t, in[0].data, dst);
        if (ok) cvt_store_f32(dt, dst, out->data, nout);
        break;
    default: {
        char label[32];
        return cpu_fail(x, ALLOY_ERR_UNSUPPORTED, "%s '%s': dtype %s is not supported",
                        ir_ops[n->op].name, ir_node_label(n, label, sizeof label),
                        alloy_dtype_name(dt));
    }
    }
    al_free(src);
    al_free(dst);
    if (ok) return ALLOY_OK;
    char label[32];
    return cpu_fail(x, ALLOY_ERR_OOM, "%s '%s': out of memory", ir_ops[n->op].name,
                    ir_node_label(n, label, sizeof label));
}

/* argmax / argmin (x [outer, len, inner] around `axis`) -> i64 [outer, inner]:
 * the index of the first maximum (minimum) along the axis, a NaN counting as
 * one that nothing later replaces (PyTorch's rule). Values compare as
 * doubles (exact for every float dtype and i32; i64 past 2^53 rounds, as
 * in every op: docs/ir.md, "Integer arithmetic"). The type rule keeps the
 * axis non-empty. */
alloy_status cpu_arg(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *t = &in[0].type;
    int axis = 0;
    ir_norm_axis(ir_attr_i(n, "axis"), t->rank, &axis);
    int64_t outer = 1, inner = 1, len = t->dims[axis];
    for (int d = 0; d < axis; d++) outer *= t->dims[d];
    for (int d = axis + 1; d < t->rank; d++) inner *= t->dims[d];
    if (outer * inner == 0) return ALLOY_OK;
    bool max = n->op == IR_OP_argmax;
    size_t es = alloy_dtype_size(t->dtype);
    double *v = al_malloc(sizeof(double) * (size_t)(len * inner));
    if (!v) return cpu_out_of_memory(x, n);
    int64_t *y = out->data;
    for (int64_t o = 0; o < outer; o++) {
        cvt_load_f64(t->dtype, (const char *)in[0].data + (size_t)(o * len * inner) * es, v, (size_t)(len * inner));
        for (int64_t j = 0; j < inner; j++) {
            int64_t best = 0;
            double b = v[j];
            for (int64_t i = 1; i < len && b == b; i++) {
                double c = v[i * inner + j];
                if (c != c || (max ? c > b : c < b)) b = c, best = i;
            }
            y[o * inner + j] = best;
        }
    }
    al_free(v);
    return ALLOY_OK;
}
