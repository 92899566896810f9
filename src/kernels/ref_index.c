/* ref_index.c - the indexing kernels over elements of any size, generic over i32 and i64 indices: the range check and its message, embedding, gather, index_select, arange. */
#include <string.h>

#include "base/convert.h"
#include "kernels/ref.h"

/* The contracts of the non-static functions are in ref.h. */
alloy_status ref_check_indices(const ir_node *n, const ref_index *ix, int64_t limit, const char *noun,
                               const int64_t *skip, char *why, size_t whylen)
{
    int64_t count = ir_numel(ix->type);
    for (int64_t p = 0; p < count; p++) {
        int64_t v = ref_index_at(ix, p);
        if ((v >= 0 && v < limit) || (skip && v == *skip)) continue;
        int64_t idx[ALLOY_MAX_RANK], rest = p;
        for (int d = ix->type->rank - 1; d >= 0; d--) {
            idx[d] = rest % ix->type->dims[d];
            rest /= ix->type->dims[d];
        }
        char label[32], where[128];
        al_fmt_dims(where, sizeof where, ix->type->rank, idx);
        al_fmt(why, whylen, "%s '%s': %s %lld out of range [0, %lld) at position %s", ir_ops[n->op].name,
               ir_node_label(n, label, sizeof label), noun, (long long)v, (long long)limit, where);
        return ALLOY_ERR_INVALID;
    }
    return ALLOY_OK;
}

alloy_status ref_embedding(const ir_node *n, const ref_index *ids, const ir_type *table_type, size_t es,
                           const void *table, void *out, char *why, size_t whylen)
{
    alloy_status st = ref_check_indices(n, ids, table_type->dims[0], "id", NULL, why, whylen);
    if (st) return st;
    size_t row_bytes = (size_t)table_type->dims[1] * es;
    if (!row_bytes) return ALLOY_OK;
    for (int64_t p = 0; p < ir_numel(ids->type); p++)
        memcpy((char *)out + (size_t)p * row_bytes, (const char *)table + (size_t)ref_index_at(ids, p) * row_bytes,
               row_bytes);
    return ALLOY_OK;
}

/* n's axis, normalized for rank. */
static int axis_of(const ir_node *n, int rank)
{
    int axis = 0;
    ir_norm_axis(ir_attr_i(n, "axis"), rank, &axis);
    return axis;
}

int64_t ref_gather_offset(const ir_type *t, int axis, const ref_index *index, int64_t p)
{
    const ir_type *it = index->type;
    int64_t rest = p, off = 0, stride = 1;
    for (int d = it->rank - 1; d >= 0; d--) {
        int64_t i = rest % it->dims[d];
        rest /= it->dims[d];
        off += (d == axis ? ref_index_at(index, p) : i) * stride;
        stride *= t->dims[d];
    }
    return off;
}

alloy_status ref_gather(const ir_node *n, const ir_type *t, const ref_index *index, size_t es, const void *in,
                        void *out, char *why, size_t whylen)
{
    int axis = axis_of(n, t->rank);
    alloy_status st = ref_check_indices(n, index, t->dims[axis], "index", NULL, why, whylen);
    if (st) return st;
    for (int64_t p = 0; p < ir_numel(index->type); p++)
        memcpy((char *)out + (size_t)p * es, (const char *)in + (size_t)ref_gather_offset(t, axis, index, p) * es, es);
    return ALLOY_OK;
}

alloy_status ref_index_select(const ir_node *n, const ir_type *t, const ref_index *index, size_t es, const void *in,
                              void *out, char *why, size_t whylen)
{
    int axis = axis_of(n, t->rank);
    int64_t outer = 1, inner = 1, len = t->dims[axis], k = index->type->dims[0];
    for (int d = 0; d < axis; d++) outer *= t->dims[d];
    for (int d = axis + 1; d < t->rank; d++) inner *= t->dims[d];
    alloy_status st = ref_check_indices(n, index, len, "index", NULL, why, whylen);
    if (st) return st;
    size_t block = (size_t)inner * es;
    if (!block) return ALLOY_OK;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < k; j++)
            memcpy((char *)out + (size_t)(o * k + j) * block,
                   (const char *)in + (size_t)(o * len + ref_index_at(index, j)) * block, block);
    return ALLOY_OK;
}

void ref_arange(const ir_node *n, alloy_dtype dtype, void *out)
{
    double start = ir_attr_f(n, "start"), step = ir_attr_f(n, "step");
    size_t es = alloy_dtype_size(dtype);
    for (int64_t i = 0; i < ir_numel(&n->type); i++) {
        double v = start + (double)i * step;
        cvt_store_f64(dtype, &v, (char *)out + (size_t)i * es, 1);
    }
}
