/* groups.h - fusion group kinds and membership rules, shared by the fuse pass, the executors and the group table printer. */
#ifndef ALLOY_GROUPS_H
#define ALLOY_GROUPS_H

#include <stdio.h>

#include "ir/ir.h"

/* What a fusion group (the nodes with one `!group=N`) is; docs/fusion.md.
 *   EW:    elementwise members (and casts) over one shape;
 *   ROW:   row-local ops (softmax, layer_norm, cross_entropy and their
 *          gradients, causal_mask) with elementwise producers and
 *          consumers, over one [rows, C] shape; a row's results depend on
 *          that row only, but for the column sums (ir_fuse_colsum), which
 *          sum a [rows, C] value of the group over its rows;
 *   GEMM:  a matmul or a forward convolution (conv1d, conv2d) and its
 *          epilogue (bias add, relu or gelu_tanh, casts), what a cuBLASLt
 *          epilogue computes after a GEMM (or a conv kernel after its
 *          sums);
 *   MULTI: several elementwise chains of different shapes run as one
 *          (multi-tensor) launch, with an optional found_inf reducing
 *          over them: the unscale + isfinite of all gradients, the
 *          optimizer update of all parameters. */
typedef enum ir_group_kind { IR_GROUP_EW, IR_GROUP_ROW, IR_GROUP_GEMM, IR_GROUP_MULTI } ir_group_kind;

AL_HIDDEN const char *ir_group_kind_name(ir_group_kind k);

/* An elementwise member: an EW op of ops.def, or a cast between f16, bf16
 * and f32 (computed in f32; an explicit cast still rounds to its dtype). */
AL_HIDDEN bool ir_fuse_elementwise(const ir_graph *g, const ir_node *n);
/* Whether the amp_check and amp_stats options look at node n's values (on
 * every backend alike): a float value computed by an op, not one that only
 * moves its operands' values (an inf there was flagged where it was made),
 * nor one whose constant operand is itself not finite (a mask's -inf). */
AL_HIDDEN bool ir_amp_checked(const ir_graph *g, const ir_node *n);
/* A row op (one with a row program in ops.def) that may join a ROW group:
 * along the last axis only, on f32/f16/bf16 data (its index operands
 * aside). */
AL_HIDDEN bool ir_fuse_row_op(const ir_graph *g, const ir_node *n);
/* Whether operand j of row op n is read row by row: its program's role is
 * r (a [rows, C] tensor) or i (one index per row, cross_entropy's targets);
 * v and s operands (gamma, beta, dloss) are read whole by every row. */
AL_HIDDEN bool ir_row_operand(const ir_node *n, int j);
/* A column sum: reduce_sum of an f32 value of rank >= 2 over every axis
 * but the last (any keepdims, so [C] or [1, .., 1, C]), to f32, with at
 * least 2 rows. A ROW group of its operand's shape may take it when its
 * operand is a member or an input, and no member reads its result: each
 * block of rows (a CPU block, a CUDA row team) sums its rows' columns, and
 * a final combine writes the result, so the operand need not be stored
 * (docs/fusion.md). At most IR_MAX_COLSUMS per group (a CUDA thread holds
 * each one's sums of its columns in registers). */
enum { IR_MAX_COLSUMS = 4 };
AL_HIDDEN bool ir_fuse_colsum(const ir_graph *g, const ir_node *n);
/* The shape member n iterates over: its result's, or for a row op whose
 * result is the mean of per-row values (cross_entropy) or a column sum its
 * first operand's. */
AL_HIDDEN const ir_type *ir_fuse_shape(const ir_graph *g, const ir_node *n);
/* Whether a and b have the same dims (their dtypes aside). */
AL_HIDDEN bool ir_same_dims(const ir_type *a, const ir_type *b);
/* Whether r reads tensor p whole at every element of its iteration, as a
 * member of a row group would: a row op's row operand, or an f32
 * elementwise member's operand of r's own shape (not broadcast). The
 * sibling and column-sum rules (fuse_siblings.c, fuse_colsum.c) join
 * groups through such readers. */
AL_HIDDEN bool ir_reads_rows(const ir_graph *g, const ir_node *r, int p);
/* Whether row op n's value is one number per row ([.., 1], a KEEP stage:
 * layer_norm_mean, layer_norm_rstd, rms_norm_rstd). Such a member iterates over its
 * operand's shape and is read only outside its group: a later step reads
 * the stored values, never a member of the same group. */
AL_HIDDEN bool ir_row_keeps(const ir_node *n);
/* Whether n computes in f64 (some operand is f64 or an integer), the rule
 * of cpu_ew_uses_f64, read from the IR types. */
AL_HIDDEN bool ir_fuse_wide(const ir_graph *g, const ir_node *n);

/* Whether row op n has causal rows (causal_rows.c; docs/fusion.md, "Causal
 * rows"): a softmax along the last axis of causal_mask(x) with value -inf
 * (through casts between float dtypes), or the softmax_grad along the last
 * axis whose probabilities are (through such casts) such a softmax. Every
 * backend then reads and computes row `row` of n's [.., T, S] rows only at
 * its ir_causal_live columns and stores exact zeros past them: the mask
 * gives -inf there whatever x holds, so the softmax is exactly 0, and the
 * gradient's masked columns contribute nothing (a non-finite dy there
 * included, as in a fused attention). */
AL_HIDDEN bool ir_row_causal(const ir_graph *g, const ir_node *n);
/* The live columns of row `row` (counted over all but the last axis) of a
 * causal row op of type t [.., T, S]: (row mod T) + S - T + 1, in [1, S]
 * (causal_mask hides column j > i + S - T of query i; T <= S). */
AL_HIDDEN int64_t ir_causal_live(const ir_type *t, int64_t row);

/* Whether n may head a GEMM group: a matmul, conv1d or conv2d (the
 * forward convolutions; their gradients are not heads). */
AL_HIDDEN bool ir_gemm_head(const ir_node *n);

/* The kind of the group of members[0..n) (ascending ids): GEMM with a
 * GEMM head (ir_gemm_head), MULTI with found_inf or members of different
 * shapes, ROW with a row op, else EW. */
AL_HIDDEN ir_group_kind ir_group_kind_of(const ir_graph *g, const int *members, int n);

/* The fusion groups of g: group k (ascending by its annotation id, which
 * need not be dense) has id[k] and the members member[start[k] ..
 * start[k + 1]) in ascending node order; group_of[node] is k, or -1. */
typedef struct ir_groups {
    int ngroups;
    int *id, *start, *member, *group_of;
} ir_groups;
/* Fills *out (ir_groups_free); ALLOY_ERR_OOM leaves it empty. O(n log n). */
AL_HIDDEN alloy_status ir_groups_collect(const ir_graph *g, ir_groups *out);
AL_HIDDEN void ir_groups_free(ir_groups *gs);
/* Members of node i's group (1 when it has none). */
AL_HIDDEN int ir_group_size(const ir_groups *gs, int i);

/* Checks the `group` annotations of g (ir_verify calls it): group ids below
 * the node count; every member of a group of two or more is a member its
 * kind takes (ir_group_kind_of); the group can run at its last member (every
 * operand from outside comes from an earlier position, every reader
 * outside from a later one); and per kind: EW members share one shape and
 * compute type; ROW members share one iteration shape (ir_fuse_shape) and
 * compute in f32, and its column sums follow ir_fuse_colsum's rule;
 * GEMM is a GEMM head first (matmul or convolution), then
 * elementwise members of its result's shape; MULTI has at most one
 * found_inf, last, and each connected chain of elementwise members shares
 * a shape and compute type. Records the
 * first violation on g as ALLOY_ERR_VERIFY naming the group, the node (by
 * name when it has one) and the rule. */
AL_HIDDEN alloy_status ir_check_groups(ir_graph *g);

/* Prints one comment block per group: kind, iteration shape, inputs,
 * outputs, and each output's expression tree, e.g.
 *   # group 3 row f32[8192,64]: in %27; out %31
 *   #   %31 = cast<f16>(softmax(cast<f32>(causal_mask(%27))))
 * A member read twice inside the group gets a line of its own. Comments,
 * so the text still parses. Nothing when g has no group. */
AL_HIDDEN void ir_print_groups(const ir_graph *g, FILE *out);

#endif
