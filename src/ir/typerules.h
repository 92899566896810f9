/* typerules.h - the type (shape + dtype) rule of every op, named in ops.def. */
#ifndef ALLOY_TYPERULES_H
#define ALLOY_TYPERULES_H

#include "ir/ir.h"

#define TYPE_RULE(name)                                                                  \
    AL_HIDDEN alloy_status name(const ir_node *n, const ir_type *const *in, ir_type *out, \
                                char *why, size_t whylen)
TYPE_RULE(ty_declared);
TYPE_RULE(ty_constant);
TYPE_RULE(ty_unary);
TYPE_RULE(ty_unary_float);
TYPE_RULE(ty_binary);
TYPE_RULE(ty_binary_float);
TYPE_RULE(ty_compare);
TYPE_RULE(ty_where);
TYPE_RULE(ty_matmul);
TYPE_RULE(ty_reduce);
TYPE_RULE(ty_softmax);
TYPE_RULE(ty_layer_norm);
TYPE_RULE(ty_cross_entropy);
TYPE_RULE(ty_embedding);
TYPE_RULE(ty_reshape);
TYPE_RULE(ty_transpose);
TYPE_RULE(ty_broadcast_to);
TYPE_RULE(ty_slice);
TYPE_RULE(ty_concat);
TYPE_RULE(ty_causal_mask);
TYPE_RULE(ty_cast);
TYPE_RULE(ty_ternary);
TYPE_RULE(ty_softmax_grad);
TYPE_RULE(ty_layer_norm_grad);
TYPE_RULE(ty_cross_entropy_grad);
TYPE_RULE(ty_embedding_grad);
TYPE_RULE(ty_pad);
TYPE_RULE(ty_isfinite);
TYPE_RULE(ty_found_inf);
#undef TYPE_RULE

#endif
