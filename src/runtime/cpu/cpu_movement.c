/* cpu_movement.c - data movement kernels: constant, embedding, one_hot, reshape, cast; transpose, broadcast_to, slice, concat through kernels/ref_movement.c (causal_mask is a row program: cpu_row_programs.c). */
#include <string.h>

#include "base/convert.h"
#include "kernels/ref.h"
#include "runtime/cpu/cpu.h"

/* constant: out = the `values` attribute element by element, or the `value`
 * attribute everywhere, each rounded once from double to the dtype. */
alloy_status cpu_constant(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)in;
    int64_t count = ir_numel(&out->type);
    if (count == 0) return ALLOY_OK;
    const ir_attr *values = ir_attr_find(n, "values");
    if (values && values->kind == IR_ATTR_FLOATS && values->n == count) {
        cvt_store_f64(out->type.dtype, values->floats, out->data, (size_t)count);
        return ALLOY_OK;
    }
    const ir_attr *value = ir_attr_find(n, "value");
    if (!value) {
        char label[32];
        return cpu_fail(x, ALLOY_ERR_INVALID, "constant '%s': needs value= or values=",
                        ir_node_label(n, label, sizeof label));
    }
    double fill = ir_attr_float(n, "value", 0);
    cvt_store_f64(out->type.dtype, &fill, out->data, 1);
    ref_replicate(out->data, alloy_dtype_size(out->type.dtype), count);
    return ALLOY_OK;
}

/* embedding: kernels/ref_index.c over the table's element size, an id
 * out of range failing the run with its message. */
alloy_status cpu_embedding(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    ref_index ids = cpu_index(&in[0]);
    char why[sizeof x->error];
    alloy_status st = ref_embedding(n, &ids, &in[1].type, alloy_dtype_size(in[1].type.dtype), in[1].data, out->data,
                                    why, sizeof why);
    return st ? cpu_fail(x, st, "%s", why) : ALLOY_OK;
}

/* reshape: out holds in's bytes unchanged. */
alloy_status cpu_copy(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)x, (void)n;
    size_t bytes = ir_nbytes(&out->type);
    if (bytes) memcpy(out->data, in[0].data, bytes);
    return ALLOY_OK;
}

/* transpose, broadcast_to, slice, concat: kernels/ref_movement.c over the
 * dtype's element size. */
alloy_status cpu_transpose(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)x;
    ref_transpose(n, &in[0].type, alloy_dtype_size(in[0].type.dtype), in[0].data, out->data);
    return ALLOY_OK;
}

alloy_status cpu_broadcast_to(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)x, (void)n;
    ref_broadcast_to(&in[0].type, &out->type, alloy_dtype_size(out->type.dtype), in[0].data, out->data);
    return ALLOY_OK;
}

alloy_status cpu_slice(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)x;
    ref_slice(n, &in[0].type, alloy_dtype_size(in[0].type.dtype), in[0].data, out->data);
    return ALLOY_OK;
}

alloy_status cpu_concat(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)x;
    int axis = 0;
    ir_norm_axis(ir_attr_i(n, "axis"), out->type.rank, &axis);
    int64_t at = 0;
    for (int i = 0; i < n->nin; i++) {
        ref_place(&out->type, axis, at, &in[i].type, alloy_dtype_size(out->type.dtype), in[i].data, out->data);
        at += in[i].type.dims[axis];
    }
    return ALLOY_OK;
}

/* cast: every element converted to out's dtype, rounded once (base/convert.c). */
alloy_status cpu_cast(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)x, (void)n;
    cvt_convert(in[0].type.dtype, in[0].data, out->type.dtype, out->data, (size_t)ir_numel(&out->type));
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
