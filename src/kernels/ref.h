/* ref.h - the reference kernels of the structured ops, shared by the CPU backend and constant folding: raw buffers and ir types in, no backend or graph object. */
#ifndef ALLOY_REF_H
#define ALLOY_REF_H

#include "ir/ir.h"

/* ---- data movement (ref_movement.c): each result element is one operand
 * element of es bytes (or pad's zero), so one kernel serves every dtype and
 * constant folding's doubles alike (es = sizeof(double)). t is the operand's
 * type, to the result's; only their dims are read. ---- */

/* Fills count elements of es bytes at dst with copies of the element at dst. */
AL_HIDDEN void ref_replicate(void *dst, size_t es, int64_t count);
/* transpose: result dim i is t's dim perm[i] (n's `perm`). */
AL_HIDDEN void ref_transpose(const ir_node *n, const ir_type *t, size_t es, const void *in, void *out);
/* broadcast_to: in (type t, aligned right) repeated along its size-1 and missing dims up to `to`. */
AL_HIDDEN void ref_broadcast_to(const ir_type *t, const ir_type *to, size_t es, const void *in, void *out);
/* slice: elements start..end-1 of t along n's `axis`. */
AL_HIDDEN void ref_slice(const ir_node *n, const ir_type *t, size_t es, const void *in, void *out);
/* One concat operand (type t) into the result (type to) at offset `at` along axis. */
AL_HIDDEN void ref_place(const ir_type *to, int axis, int64_t at, const ir_type *t, size_t es, const void *in,
                         void *out);
/* pad: n's `before` zeros (all-zero bytes: +0 in every dtype), the operand, then zeros along n's `axis`. */
AL_HIDDEN void ref_pad(const ir_node *n, const ir_type *t, const ir_type *to, size_t es, const void *in, void *out);

/* ---- indexing (ref_index.c) ---- */

/* An index operand: its dims (type's dtype is not read) and its values,
 * ALLOY_I32 or ALLOY_I64 elements as dtype says (constant folding holds
 * its indices as i64, whatever the operand's dtype). */
typedef struct ref_index {
    const ir_type *type;
    alloy_dtype dtype;
    const void *data;
} ref_index;

/* Index p of ix. */
static inline int64_t ref_index_at(const ref_index *ix, int64_t p)
{
    if (ix->dtype == ALLOY_I32) return ((const int32_t *)ix->data)[p];
    return ((const int64_t *)ix->data)[p];
}

/* ALLOY_OK when every index of ix is in [0, limit) (or equals *skip, when
 * skip is not NULL); else ALLOY_ERR_INVALID, the first bad one in index
 * order named in why: "<op> '<node>': <noun> <value> out of range [0,
 * <limit>) at position [<coordinates>]". */
AL_HIDDEN alloy_status ref_check_indices(const ir_node *n, const ref_index *ix, int64_t limit, const char *noun,
                                         const int64_t *skip, char *why, size_t whylen);
/* embedding (n): out[p, :] = table[ids[p], :] for the rows of table (type
 * table_type, [rows, D], elements of es bytes); an id outside [0, rows) is
 * ref_check_indices' error and nothing is written. */
AL_HIDDEN alloy_status ref_embedding(const ir_node *n, const ref_index *ids, const ir_type *table_type, size_t es,
                                     const void *table, void *out, char *why, size_t whylen);
/* The offset in x (dims t) of index element p of gather: p's coordinates
 * with the one along axis replaced by index[p]. */
AL_HIDDEN int64_t ref_gather_offset(const ir_type *t, int axis, const ref_index *index, int64_t p);
/* gather (torch.gather, n's `axis`): out[p] = in[p with coordinate axis =
 * index[p]], in of type t; index_select: out[o, k, i] = in[o, index[k], i]
 * around the axis. An index outside [0, t's dim) is ref_check_indices'
 * error and nothing is written. */
AL_HIDDEN alloy_status ref_gather(const ir_node *n, const ir_type *t, const ref_index *index, size_t es, const void *in,
                                  void *out, char *why, size_t whylen);
AL_HIDDEN alloy_status ref_index_select(const ir_node *n, const ir_type *t, const ref_index *index, size_t es,
                                        const void *in, void *out, char *why, size_t whylen);
/* arange (n): element i = start + i * step in f64, stored as dtype (rounded
 * once; ALLOY_F64 keeps the unrounded sums). */
AL_HIDDEN void ref_arange(const ir_node *n, alloy_dtype dtype, void *out);

/* ---- random ops (ref_random.c): n's seed (0 when absent) and stream,
 * the training step `step`, element i of the result drawing counter i ---- */

/* uniform, normal (n): elements [first, first + len) drawn in f64 into
 * out[0..len), unrounded (rounding to the dtype is the caller's). */
AL_HIDDEN void ref_draw(const ir_node *n, unsigned long long step, int64_t first, int64_t len, double *out);
/* dropout (n): v (elements [first, first + len) of x in the compute type:
 * doubles when wide, for f64, else floats) times scale where the element is
 * kept, times 0 where it is dropped (so a NaN or inf stays non-finite, as
 * PyTorch's x * mask), in place; rounding to the dtype is the caller's. */
AL_HIDDEN void ref_dropout(const ir_node *n, unsigned long long step, bool wide, int64_t first, int64_t len, void *v);

/* ---- reductions and the running sum (ref_reduce.c) ---- */

/* The pairwise sums of reduce_sum: a sum of more than REF_SUM_LEAF terms is
 * the sum of its first n/2 and its last n - n/2 terms, a shorter one is
 * added in order from 0; columns go REF_SUM_COLS at a time. */
enum {
    REF_SUM_LEAF = 16,
    REF_SUM_COLS = 256,
    REF_SUM_MAX_DEPTH = 64,
    REF_COLSUM_STACK = REF_SUM_COLS * REF_SUM_MAX_DEPTH,
};

/* reduce_sum / reduce_mean / reduce_max (n's op) of src (type t, in the
 * compute type: f32, f64, or i64 for the maximum of integers) over n's
 * `axes` (all when absent) into dst (ir_numel(&n->type) values of the same
 * type), summing pairwise; one term is copied (-0 kept), no terms sum to 0
 * and average to NaN (0 for i64), a NaN makes the maximum NaN. Rounding to
 * the dtype is the caller's. False when out of memory (dst then partial). */
AL_HIDDEN bool ref_reduce_f32(const ir_node *n, const ir_type *t, const float *src, float *dst);
AL_HIDDEN bool ref_reduce_f64(const ir_node *n, const ir_type *t, const double *src, double *dst);
AL_HIDDEN bool ref_reduce_i64(const ir_node *n, const ir_type *t, const int64_t *src, int64_t *dst);
/* ref_reduce_f32 of the f16 or bf16 (t->dtype) values at src, converted
 * to f32 a few thousand at a time as the reduction reaches them: the same
 * bits as ref_reduce_f32 over their widened copy, without that copy. */
AL_HIDDEN bool ref_reduce_half(const ir_node *n, const ir_type *t, const uint16_t *src, float *dst);

/* out[0..ncols) = the column sums of rows [0, nrows) of the f32 matrix at
 * src (row stride ncols), in the order of the unfused reduce_sum over the
 * rows, so a row group summing a subtree's rows gets that subtree's sums
 * bit for bit; stack: REF_COLSUM_STACK floats. */
AL_HIDDEN void ref_column_sums_f32(const float *src, int64_t nrows, int64_t ncols, float *out, float *stack);

/* cumsum (n's `axis` and `reverse`) of v (type t's dims) in place, in the
 * compute type: doubles when wide, else floats; each prefix is the running
 * sum so far, unrounded (rounding to the dtype is the caller's). */
AL_HIDDEN void ref_cumsum(const ir_node *n, const ir_type *t, bool wide, void *v);

#endif
