/* evaluate.h - a reference evaluator for passes: one node on constant operands, bit for bit as the CPU. */
#ifndef ALLOY_EVALUATE_H
#define ALLOY_EVALUATE_H

#include "ir/ir.h"

/* Evaluates node n on constant operands. n's op, attributes, nin and result
 * type are used (n->in is ignored); in_types[j] is operand j's type and in[j]
 * its ir_numel(in_types[j]) values as doubles, row-major, each exactly the
 * value stored in that dtype. out gets ir_numel(&n->type) doubles, each exactly
 * representable in n's dtype: bit for bit what the CPU backend computes for
 * this node. Returns ALLOY_OK; ALLOY_ERR_UNSUPPORTED (why says so) for an op
 * it does not evaluate; ALLOY_ERR_INVALID with why for values the op rejects
 * (an embedding, gather or index_select index out of range, ...);
 * ALLOY_ERR_OOM when a scratch buffer cannot be had. Never touches runtime
 * code: data movement, cumsum and the reductions run the CPU backend's own
 * kernels (kernels/ref.h) on these doubles or on f32/i64 copies of them.
 *
 * Evaluated: every elementwise op, cast, reshape, broadcast_to, transpose,
 * slice, pad, concat, embedding, gather, index_select, arange, cumsum,
 * reduce_sum/mean/max, dropout, uniform, normal (row ops, whose meaning is
 * their row program, and attention and attention_grad, heavy and blockwise,
 * are not folded). n must be
 * well typed (as ir_add_node leaves it). Doubles hold i64 values exactly
 * only up to 2^53: an i64 reduction whose exact result a double cannot hold
 * is ALLOY_ERR_UNSUPPORTED, and i64 operands beyond 2^53 reach this function
 * already rounded, so data movement and reductions of them cannot match. */
AL_HIDDEN alloy_status eval_node(const ir_node *n, const ir_type *const *in_types, const double *const *in,
                                 double *out, char *why, size_t whylen);

#endif
