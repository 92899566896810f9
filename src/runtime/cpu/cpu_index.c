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

/* gather, index_select: kernels/ref_index.c over the dtype's element size,
 * an index out of range failing the run with its message. */
alloy_status cpu_gather(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    ref_index index = cpu_index(&in[1]);
    char why[sizeof x->error];
    alloy_status st = ref_gather(n, &in[0].type, &index, alloy_dtype_size(in[0].type.dtype), in[0].data, out->data,
                                 why, sizeof why);
    return st ? cpu_fail(x, st, "%s", why) : ALLOY_OK;
}

alloy_status cpu_index_select(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    ref_index index = cpu_index(&in[1]);
    char why[sizeof x->error];
    alloy_status st = ref_index_select(n, &in[0].type, &index, alloy_dtype_size(in[0].type.dtype), in[0].data,
                                       out->data, why, sizeof why);
    return st ? cpu_fail(x, st, "%s", why) : ALLOY_OK;
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
    ref_index index = cpu_index(&in[0]);
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
            at = ref_gather_offset(xt, axis, &index, p);
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

/* arange: kernels/ref_index.c into the result's dtype. */
alloy_status cpu_arange(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)x, (void)in;
    ref_arange(n, out->type.dtype, out->data);
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
