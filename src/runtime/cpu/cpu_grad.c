/* cpu_grad.c - the backward kernels that are no row program: embedding_grad (a scatter-add) and pad. */
#include "base/convert.h"
#include "kernels/ref.h"
#include "runtime/cpu/cpu.h"

/* embedding_grad (ids [...], dy [..., D]) -> dtable [rows, D]: zeros, then
 * row ids[p] += dy[p] for every position p in order, summed in an f32 table
 * (f64 for f64) and rounded once; an id outside [0, rows) is an error. */
alloy_status cpu_embedding_grad(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const rt_tensor *ids = &in[0], *dy = &in[1];
    int64_t rows = out->type.dims[0], d = out->type.dims[1], count = ir_numel(&ids->type);
    alloy_status st = cpu_check_indices(x, n, ids, rows, "id");
    if (st) return st;
    if (rows * d == 0) return ALLOY_OK;
    bool wide = out->type.dtype == ALLOY_F64;
    size_t es = wide ? sizeof(double) : sizeof(float);
    void *table = al_calloc((size_t)(rows * d), es), *row = cpu_alloc_compute(wide, d);
    if (!table || !row) {
        al_free(table), al_free(row);
        return cpu_out_of_memory(x, n);
    }
    size_t row_bytes = (size_t)d * alloy_dtype_size(dy->type.dtype);
    for (int64_t p = 0; p < count; p++) {
        cpu_load_compute(wide, dy->type.dtype, (const char *)dy->data + (size_t)p * row_bytes, row, d);
        int64_t id = cpu_index_at(ids, p);
        if (wide) {
            double *acc = (double *)table + id * d;
            for (int64_t j = 0; j < d; j++) acc[j] += ((const double *)row)[j];
        } else {
            float *acc = (float *)table + id * d;
            for (int64_t j = 0; j < d; j++) acc[j] += ((const float *)row)[j];
        }
    }
    cpu_store_compute(wide, out->type.dtype, table, out->data, rows * d);
    al_free(table), al_free(row);
    return ALLOY_OK;
}

/* pad: `before` zeros, the operand, `after` zeros along `axis`. */
alloy_status cpu_pad(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)x;
    ref_pad(n, &in[0].type, &out->type, alloy_dtype_size(in[0].type.dtype), in[0].data, out->data);
    return ALLOY_OK;
}
