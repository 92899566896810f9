/* cpu_index.c - index ops: argmax and argmin along an axis, one_hot. */
#include <string.h>

#include "base/convert.h"
#include "runtime/cpu/cpu.h"

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

/* one_hot (ids [...], i32/i64) -> [..., depth] of the node's dtype: 1 at
 * column ids[p] of row p, 0 elsewhere; an id outside [0, depth) is an error
 * naming the node, the id and its position (PyTorch refuses it too). */
alloy_status cpu_one_hot(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    int64_t depth = ir_attr_i(n, "depth"), count = ir_numel(&in[0].type);
    if (cpu_check_indices(x, n, &in[0], depth, "id")) return x->status;
    size_t es = alloy_dtype_size(out->type.dtype);
    unsigned char one[8];
    double v = 1;
    cvt_store_f64(out->type.dtype, &v, one, 1);
    if (ir_nbytes(&out->type)) memset(out->data, 0, ir_nbytes(&out->type)); /* every dtype's 0 is all zero bits */
    for (int64_t p = 0; p < count; p++)
        memcpy((char *)out->data + (size_t)(p * depth + cpu_index_at(&in[0], p)) * es, one, es);
    return ALLOY_OK;
}
