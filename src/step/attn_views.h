/* attn_views.h - the attention ops' and batched products' operands as strided views: q, k, v read out of a fused projection, o written in its consumer's layout, dq, dk, dv written into one concatenated buffer. */
#ifndef ALLOY_ATTN_VIEWS_H
#define ALLOY_ATTN_VIEWS_H

#include <stdint.h>

#include "ir/ir.h"
#include "step/schedule.h"

/* Where one [B, H, rows, D] operand's elements lie, in elements from the
 * address of its node's value: element (b, h, t, d) at base + b * batch +
 * h * head + t * row + d (the element stride is always 1). */
typedef struct attn_stride {
    int64_t base, batch, head, row;
} attn_stride;

/* The layouts of one attention or attention_grad node's operands and
 * result. H: heads (dims[1] of q), for splitting bh = b * H + h. For
 * attention the result is o; for attention_grad it is dq, dk, dv, all
 * three at the address of the node's value (contiguous: dk at base T*D and
 * dv at (T+S)*D of the [B, H, T + 2S, D] result). */
typedef struct attn_strides {
    int64_t H, T, S; /* heads; query and key rows */
    attn_stride q, k, v, o, dout, dq, dk, dv;
} attn_strides;

/* Marks the strided views around the attention ops and the batched
 * matmuls of schedule s (called by sched_build after the plain views),
 * where the pattern is the one a multi-head block writes, every value in
 * it is read by nothing that needs it contiguous, and every stride and
 * offset is a multiple of SCHED_VIEW_ALIGN bytes; other layouts keep their
 * copy kernels:
 *   - an operand transpose(reshape([slice of the last axis of] X), perm
 *     [0, 2, 1, 3]) of a stored row-major X, read only by attention ops
 *     and attn_strided_matmul matmuls whose step gives the operands to the
 *     library GEMM (a lone matmul, a gemm step's head): the transpose (and
 *     slice) become MEMBER_VIEW | MEMBER_STRIDED (no kernel; the op reads
 *     X's bytes through strides, the GEMM through two batch strides);
 *   - the result of a lone attn_strided_matmul read only by one transpose
 *     [0, 2, 1, 3]: stored in the transpose's [B, T, H, D] order
 *     (MEMBER_STRIDED; the GEMM writes it there) and the transpose is a
 *     plain view of it;
 *   - an attention o read only by one transpose [0, 2, 1, 3] (and as
 *     attention_grad's o): o is stored in the transpose's [B, T, H, D]
 *     order (MEMBER_STRIDED) and the transpose is a plain view of it;
 *   - a lone concat along the last axis of [B*T, H*D] values, each the
 *     reshape of such a transpose view of a strided result (dq, dk, dv of a
 *     written-out attention): each result written into the concat's rows
 *     at its columns (attn_interleave_piece), the concat a view owning
 *     them (MEMBER_VIEW, no kernel);
 *   - an attention_grad whose dq, dk, dv slices are each transposed
 *     [0, 2, 1, 3], reshaped to [.., H*D] and concatenated along the last
 *     axis in that order (T == S): its result is stored in the concat's
 *     order (MEMBER_STRIDED), the slices, transposes and reshapes are
 *     strided views of it and the concat a plain view (an alias).
 * A MEMBER_STRIDED value's bytes are not its type's row-major order: only
 * attention ops (through attn_strides_of), those matmuls (attn_layout_of)
 * and the views above read them.
 * uses, strided, ew: g->nnodes ints of scratch each (the readers of each
 * node, counted once: the pass is linear in the graph but for the short
 * walks from a view to its few readers). */
AL_HIDDEN void attn_views_mark(const ir_graph *g, schedule *s, int *uses, int *strided, int *ew);
/* Whether n is a batched matmul attn_views_mark may give strided operands
 * or result: rank 4, both operands [B, H, .., ..] with its own batch dims
 * (no broadcast). */
AL_HIDDEN bool attn_strided_matmul(const ir_graph *g, const ir_node *n);
/* The layout of rank-4 value x ([B, H, R, D]) as schedule s stores it (s
 * NULL or x not MEMBER_STRIDED: contiguous); for a backend's batched
 * GEMM over an attn_strided_matmul's operands and result. */
AL_HIDDEN attn_stride attn_layout_of(const ir_graph *g, const schedule *s, int x);
/* Every operand and result contiguous: q, o, do [B, H, T, D], k, v [B, H,
 * S, D], dq, dk, dv the parts of attention_grad's [B, H, T + 2S, D]. */
AL_HIDDEN void attn_strides_plain(int64_t H, int64_t T, int64_t S, int64_t D, attn_strides *out);
/* The layouts of attention node n's operands and result under schedule s
 * (s NULL: every one contiguous). */
AL_HIDDEN void attn_strides_of(const ir_graph *g, const schedule *s, const ir_node *n, attn_strides *out);
/* The byte offset of strided view i (a MEMBER_STRIDED view, or a plain
 * view attn_views_mark made: a transpose, an aliasing concat) inside its
 * operand's value (in[0]'s), or -1 when i is none of them. */
AL_HIDDEN int64_t attn_view_delta(const ir_graph *g, const schedule *s, int i);
/* For input q of concat c that attn_views_mark made an interleave (dq, dk,
 * dv each written by its own step in its transpose's order into the
 * concat's [B*T, W] rows: a strided result P whose transpose's reshape is
 * the input): P into *piece and the column of c's rows it starts at
 * (elements); -1 for any other concat or input. The planner places P at
 * that byte offset of c's slot, a piece as a gather's (sched_views). */
AL_HIDDEN int64_t attn_interleave_piece(const ir_graph *g, const schedule *s, int c, int q, int *piece);
/* Whether concat c is an alias attn_views_mark made (a plain view of its
 * first operand's strided root), not a gather. */
AL_HIDDEN bool attn_view_alias(const ir_graph *g, const schedule *s, int c);

#endif
