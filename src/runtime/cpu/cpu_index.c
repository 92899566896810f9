/* cpu_index.c - the indexing kernels: gather and index_select along an axis and their scatter-add gradients, arange, cumsum. */
#include <string.h>

#include "base/convert.h"
#include "kernels/ref.h"
#include "runtime/cpu/cpu.h"

/* outer, len, inner of t around axis (normalized). */
static void around(const ir_type *t, int axis, int64_t *outer, int64_t *len, int64_t *inner)
{
    *outer = *inner = 1;
    for (int d = 0; d < axis; d++) *outer *= t->dims[d];
    for (int d = axis + 1; d < t->rank; d++) *inner *= t->dims[d];
    *len = t->dims[axis];
}

static int axis_of(const ir_node *n, int rank)
{
    int axis = 0;
    ir_norm_axis(ir_attr_i(n, "axis"), rank, &axis);
    return axis;
}

/* The offset in x (dims xt) of index element p (index dims it): p's
 * coordinates with the one along axis replaced by the index's value. */
static int64_t gather_offset(const ir_type *xt, const ir_type *it, int axis, const rt_tensor *index, int64_t p)
{
    int64_t rest = p, off = 0, stride = 1;
    for (int d = it->rank - 1; d >= 0; d--) {
        int64_t i = rest % it->dims[d];
        rest /= it->dims[d];
        off += (d == axis ? cpu_index_at(index, p) : i) * stride;
        stride *= xt->dims[d];
    }
    return off;
}

/* gather: out[p] = x[p with coordinate axis = index[p]] (torch.gather). */
alloy_status cpu_gather(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *xt = &in[0].type, *it = &in[1].type;
    int axis = axis_of(n, xt->rank);
    if (cpu_check_indices(x, n, &in[1], xt->dims[axis], "index")) return x->status;
    size_t es = alloy_dtype_size(xt->dtype);
    for (int64_t p = 0; p < ir_numel(it); p++)
        memcpy((char *)out->data + (size_t)p * es, (const char *)in[0].data + (size_t)gather_offset(xt, it, axis, &in[1], p) * es, es);
    return ALLOY_OK;
}

/* index_select: out[o, k, i] = x[o, index[k], i] around axis. */
alloy_status cpu_index_select(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *xt = &in[0].type;
    int axis = axis_of(n, xt->rank);
    int64_t outer, len, inner, k = in[1].type.dims[0];
    around(xt, axis, &outer, &len, &inner);
    if (cpu_check_indices(x, n, &in[1], len, "index")) return x->status;
    size_t block = (size_t)inner * alloy_dtype_size(xt->dtype);
    if (!block) return ALLOY_OK;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < k; j++)
            memcpy((char *)out->data + (size_t)(o * k + j) * block,
                   (const char *)in[0].data + (size_t)(o * len + cpu_index_at(&in[1], j)) * block, block);
    return ALLOY_OK;
}

/* The scatter-adds: dx (out, zeros) gets dy added where the forward read,
 * in dy's order, summed in f32 (f64 for f64) and rounded once. */
static alloy_status scatter_add(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *xt = &out->type, *dt = &in[1].type;
    int axis = axis_of(n, xt->rank);
    int64_t outer, len, inner, count = ir_numel(dt);
    around(xt, axis, &outer, &len, &inner);
    if (cpu_check_indices(x, n, &in[0], len, "index")) return x->status;
    bool wide = xt->dtype == ALLOY_F64;
    size_t es = wide ? sizeof(double) : sizeof(float);
    void *acc = al_calloc((size_t)(ir_numel(xt) > 0 ? ir_numel(xt) : 1), es), *dy = cpu_alloc_compute(wide, count);
    if (!acc || !dy) {
        al_free(acc), al_free(dy);
        return cpu_out_of_memory(x, n);
    }
    cpu_load_compute(wide, dt->dtype, in[1].data, dy, count);
    int64_t k = n->op == IR_OP_index_select_grad ? in[0].type.dims[0] : 0;
    for (int64_t p = 0; p < count; p++) {
        int64_t at;
        if (n->op == IR_OP_gather_grad) {
            at = gather_offset(xt, dt, axis, &in[0], p);
        } else { /* p = (o, j, i) in dy [outer, k, inner] */
            int64_t i = p % inner, j = p / inner % k, o = p / inner / k;
            at = (o * len + cpu_index_at(&in[0], j)) * inner + i;
        }
        if (wide) ((double *)acc)[at] += ((const double *)dy)[p];
        else ((float *)acc)[at] += ((const float *)dy)[p];
    }
    cpu_store_compute(wide, xt->dtype, acc, out->data, ir_numel(xt));
    al_free(acc), al_free(dy);
    return ALLOY_OK;
}

alloy_status cpu_gather_grad(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    return scatter_add(x, n, out, in);
}

alloy_status cpu_index_select_grad(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    return scatter_add(x, n, out, in);
}

/* arange: element i = start + i * step in f64, rounded once to the dtype. */
alloy_status cpu_arange(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)x, (void)in;
    double start = ir_attr_f(n, "start"), step = ir_attr_f(n, "step");
    size_t es = alloy_dtype_size(out->type.dtype);
    for (int64_t i = 0; i < ir_numel(&out->type); i++) {
        double v = start + (double)i * step;
        cvt_store_f64(out->type.dtype, &v, (char *)out->data + (size_t)i * es, 1);
    }
    return ALLOY_OK;
}

/* cumsum along axis, in order from the start (from the end when reverse):
 * a running sum in f32 for f16/bf16/f32, f64 for f64 and integers (stored
 * truncated and saturated, as reductions), each prefix rounded once. */
alloy_status cpu_cumsum(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *t = &in[0].type;
    bool wide = t->dtype == ALLOY_F64 || ir_is_int(t->dtype);
    int64_t count = ir_numel(t);
    void *v = cpu_alloc_compute(wide, count);
    if (!v) return cpu_out_of_memory(x, n);
    cpu_load_compute(wide, t->dtype, in[0].data, v, count);
    ref_cumsum(n, t, wide, v);
    cpu_store_compute(wide, t->dtype, v, out->data, count);
    al_free(v);
    return ALLOY_OK;
}
