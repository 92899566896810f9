/* ref_movement.c - the data movement kernels over elements of any size: transpose, broadcast_to, slice, concat's placement, pad. */
#include <string.h>

#include "kernels/ref.h"

enum { TILE = 32 };

/* Advances the multi-index idx over dims[0..rank) (last fastest) and keeps
 * *off_a, *off_b = sum idx[d] * stride_a[d], stride_b[d]. */
static void advance(int rank, const int64_t *dims, int64_t *idx, const int64_t *stride_a,
                    int64_t *off_a, const int64_t *stride_b, int64_t *off_b)
{
    for (int d = rank - 1; d >= 0; d--) {
        *off_a += stride_a[d];
        *off_b += stride_b[d];
        if (++idx[d] < dims[d]) return;
        *off_a -= stride_a[d] * dims[d];
        *off_b -= stride_b[d] * dims[d];
        idx[d] = 0;
    }
}

/* The contracts of the non-static functions are in ref.h. */
void ref_replicate(void *dst, size_t es, int64_t count)
{
    char *d = dst;
    size_t have = 1, total = (size_t)count;
    while (have < total) {
        size_t n = have < total - have ? have : total - have;
        memcpy(d + have * es, d, n * es);
        have += n;
    }
}

/* Row-major strides (elements) of dims. */
static void dense_strides(int rank, const int64_t *dims, int64_t *stride)
{
    int64_t step = 1;
    for (int d = rank - 1; d >= 0; d--) {
        stride[d] = step;
        step *= dims[d];
    }
}

/* Appends an output dim with its input stride, dropping size-1 dims and
 * merging it into the previous one when the input walks them contiguously. */
static void push_dim(int64_t *dims, int64_t *in_stride, int *rank, int64_t size, int64_t stride)
{
    if (size == 1) return;
    if (*rank > 0 && in_stride[*rank - 1] == stride * size) {
        dims[*rank - 1] *= size;
        in_stride[*rank - 1] = stride;
        return;
    }
    dims[*rank] = size;
    in_stride[*rank] = stride;
    (*rank)++;
}

/* One [rows, cols] plane of a transpose, in TILE x TILE blocks: out[i, j]
 * (row stride out_stride, contiguous j) = in[i + j * in_stride]. */
#define DEFINE_PLANE(U)                                                                    \
    static void plane_##U(U *out, const U *in, int64_t rows, int64_t cols,                 \
                          int64_t out_stride, int64_t in_stride)                           \
    {                                                                                      \
        for (int64_t i0 = 0; i0 < rows; i0 += TILE)                                        \
            for (int64_t j0 = 0; j0 < cols; j0 += TILE) {                                  \
                int64_t i1 = i0 + TILE < rows ? i0 + TILE : rows;                          \
                int64_t j1 = j0 + TILE < cols ? j0 + TILE : cols;                          \
                for (int64_t i = i0; i < i1; i++)                                          \
                    for (int64_t j = j0; j < j1; j++)                                      \
                        out[i * out_stride + j] = in[i + j * in_stride];                   \
            }                                                                              \
    }
DEFINE_PLANE(uint8_t)
DEFINE_PLANE(uint16_t)
DEFINE_PLANE(uint32_t)
DEFINE_PLANE(uint64_t)

static void plane(size_t es, void *out, const void *in, int64_t rows, int64_t cols,
                  int64_t out_stride, int64_t in_stride)
{
    switch (es) {
    case 1: plane_uint8_t(out, in, rows, cols, out_stride, in_stride); break;
    case 2: plane_uint16_t(out, in, rows, cols, out_stride, in_stride); break;
    case 4: plane_uint32_t(out, in, rows, cols, out_stride, in_stride); break;
    default: plane_uint64_t(out, in, rows, cols, out_stride, in_stride); break;
    }
}

/* transpose: out dim i is in dim perm[i]. Dims that stay adjacent are merged;
 * rows that stay contiguous are copied whole, others in tiled planes. */
void ref_transpose(const ir_node *n, const ir_type *t, size_t es, const void *in, void *out)
{
    if (ir_numel(t) == 0) return;
    int np;
    const int64_t *perm = ir_attr_ints(n, "perm", &np);
    int64_t in_stride[ALLOY_MAX_RANK], dims[ALLOY_MAX_RANK], stride[ALLOY_MAX_RANK];
    dense_strides(t->rank, t->dims, in_stride);
    int rank = 0; /* the output's dims, simplified, with their input strides */
    for (int i = 0; i < np; i++) push_dim(dims, stride, &rank, t->dims[perm[i]], in_stride[perm[i]]);
    const char *src = in;
    char *dst = out;
    if (rank == 0 || stride[rank - 1] == 1) { /* rows stay contiguous */
        int64_t row = rank ? dims[rank - 1] : 1, idx[ALLOY_MAX_RANK] = {0}, off = 0;
        int64_t zero[ALLOY_MAX_RANK] = {0}, unused = 0, total = ir_numel(t);
        for (int64_t o = 0; o < total; o += row) {
            memcpy(dst + (size_t)o * es, src + (size_t)off * es, (size_t)row * es);
            advance(rank - 1, dims, idx, stride, &off, zero, &unused);
        }
        return;
    }
    /* the input's contiguous dim is output dim k: copy [dims[k], dims[last]] planes */
    int k = 0, last = rank - 1;
    while (stride[k] != 1) k++;
    int64_t out_stride[ALLOY_MAX_RANK];
    dense_strides(rank, dims, out_stride);
    int64_t outer_dims[ALLOY_MAX_RANK], outer_in[ALLOY_MAX_RANK], outer_out[ALLOY_MAX_RANK];
    int outer_rank = 0;
    int64_t planes = 1;
    for (int d = 0; d < last; d++) {
        if (d == k) continue;
        outer_dims[outer_rank] = dims[d];
        outer_in[outer_rank] = stride[d];
        outer_out[outer_rank++] = out_stride[d];
        planes *= dims[d];
    }
    int64_t idx[ALLOY_MAX_RANK] = {0}, in_off = 0, out_off = 0;
    for (int64_t p = 0; p < planes; p++) {
        plane(es, dst + (size_t)out_off * es, src + (size_t)in_off * es, dims[k], dims[last],
              out_stride[k], stride[last]);
        advance(outer_rank, outer_dims, idx, outer_in, &in_off, outer_out, &out_off);
    }
}

/* broadcast_to: in (aligned right) repeated along its size-1 and missing dims. */
void ref_broadcast_to(const ir_type *t, const ir_type *to, size_t es, const void *in, void *out)
{
    if (ir_numel(to) == 0) return;
    int64_t own[ALLOY_MAX_RANK], dims[ALLOY_MAX_RANK], stride[ALLOY_MAX_RANK];
    dense_strides(t->rank, t->dims, own);
    int rank = 0; /* output dims, simplified, with input strides (0: broadcast) */
    for (int d = 0; d < to->rank; d++) {
        int td = d - (to->rank - t->rank);
        bool repeated = td < 0 || t->dims[td] == 1;
        if (to->dims[d] == 1) continue;
        if (repeated) {
            if (rank > 0 && stride[rank - 1] == 0) dims[rank - 1] *= to->dims[d];
            else dims[rank] = to->dims[d], stride[rank++] = 0;
        } else {
            push_dim(dims, stride, &rank, to->dims[d], own[td]);
        }
    }
    const char *src = in;
    char *dst = out;
    int64_t row = rank ? dims[rank - 1] : 1, total = ir_numel(to);
    bool row_repeats = rank > 0 && stride[rank - 1] == 0;
    int64_t idx[ALLOY_MAX_RANK] = {0}, off = 0, zero[ALLOY_MAX_RANK] = {0}, unused = 0;
    for (int64_t o = 0; o < total; o += row) {
        char *d = dst + (size_t)o * es;
        if (row_repeats) {
            memcpy(d, src + (size_t)off * es, es);
            ref_replicate(d, es, row);
        } else {
            memcpy(d, src + (size_t)off * es, (size_t)row * es);
        }
        advance(rank - 1, dims, idx, stride, &off, zero, &unused);
    }
}

/* slice: elements start..end-1 along `axis`. */
void ref_slice(const ir_node *n, const ir_type *t, size_t es, const void *in, void *out)
{
    int axis = 0;
    ir_norm_axis(ir_attr_i(n, "axis"), t->rank, &axis);
    int64_t start = ir_attr_i(n, "start"), end = ir_attr_i(n, "end"), outer = 1;
    size_t inner = es;
    for (int d = 0; d < axis; d++) outer *= t->dims[d];
    for (int d = axis + 1; d < t->rank; d++) inner *= (size_t)t->dims[d];
    size_t in_block = (size_t)t->dims[axis] * inner, out_block = (size_t)(end - start) * inner;
    if (out_block == 0) return;
    for (int64_t o = 0; o < outer; o++)
        memcpy((char *)out + (size_t)o * out_block,
               (const char *)in + (size_t)o * in_block + (size_t)start * inner, out_block);
}

/* The operand's blocks (its dims from axis on) one after another, each at
 * its place in the result's: `at` elements along axis into its block. */
void ref_place(const ir_type *to, int axis, int64_t at, const ir_type *t, size_t es, const void *in, void *out)
{
    int64_t outer = 1;
    size_t inner = es;
    for (int d = 0; d < axis; d++) outer *= to->dims[d];
    for (int d = axis + 1; d < to->rank; d++) inner *= (size_t)to->dims[d];
    size_t in_block = (size_t)t->dims[axis] * inner, out_block = (size_t)to->dims[axis] * inner;
    if (in_block == 0) return;
    for (int64_t o = 0; o < outer; o++)
        memcpy((char *)out + (size_t)o * out_block + (size_t)at * inner, (const char *)in + (size_t)o * in_block,
               in_block);
}

void ref_pad(const ir_node *n, const ir_type *t, const ir_type *to, size_t es, const void *in, void *out)
{
    size_t bytes = (size_t)ir_numel(to) * es;
    if (bytes == 0) return;
    memset(out, 0, bytes);
    int axis = 0;
    ir_norm_axis(ir_attr_i(n, "axis"), t->rank, &axis);
    ref_place(to, axis, ir_attr_i(n, "before"), t, es, in, out);
}
