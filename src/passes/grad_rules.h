/* grad_rules.h - the gradient rule of every differentiable op and the small API rules emit nodes with. */
#ifndef ALLOY_GRAD_RULES_H
#define ALLOY_GRAD_RULES_H

#include "ir/ir.h"

/* What a rule sees: the graph the backward is appended to. */
struct ad_ctx {
    ir_graph *g;
};

/* Appends op(in...) and returns its id; -1 (error recorded on the graph) on
 * failure or when any operand is -1, so rules chain calls and check once. */
AL_HIDDEN int ad_emit(ad_ctx *c, int op, int nin, const int *in, int nattrs, const ir_attr *attrs,
                      const ir_type *declared);
/* A rank-0 constant. */
AL_HIDDEN int ad_scalar(ad_ctx *c, alloy_dtype dtype, double value);
/* x reshaped to target's dims (x itself if they agree). */
AL_HIDDEN int ad_reshape(ad_ctx *c, int x, const ir_type *target);
/* Sums gradient g over the dims that broadcasting added or expanded so it
 * has target's shape (numpy broadcasting undone). */
AL_HIDDEN int ad_unbroadcast(ad_ctx *c, int g, const ir_type *target);

#define GRAD_RULE(name) AL_HIDDEN alloy_status name(ad_ctx *c, const ir_node *n, int dy, int *dx)
GRAD_RULE(gr_identity);
GRAD_RULE(gr_neg);
GRAD_RULE(gr_add);
GRAD_RULE(gr_sub);
GRAD_RULE(gr_mul);
GRAD_RULE(gr_div);
GRAD_RULE(gr_maximum);
GRAD_RULE(gr_minimum);
GRAD_RULE(gr_pow);
GRAD_RULE(gr_relu);
GRAD_RULE(gr_gelu);
GRAD_RULE(gr_gelu_tanh);
GRAD_RULE(gr_tanh);
GRAD_RULE(gr_sigmoid);
GRAD_RULE(gr_exp);
GRAD_RULE(gr_log);
GRAD_RULE(gr_sqrt);
GRAD_RULE(gr_rsqrt);
GRAD_RULE(gr_square);
GRAD_RULE(gr_where);
GRAD_RULE(gr_matmul);
GRAD_RULE(gr_reduce_sum);
GRAD_RULE(gr_reduce_mean);
GRAD_RULE(gr_reduce_max);
GRAD_RULE(gr_softmax);
GRAD_RULE(gr_log_softmax);
GRAD_RULE(gr_layer_norm);
GRAD_RULE(gr_cross_entropy);
GRAD_RULE(gr_embedding);
GRAD_RULE(gr_reshape);
GRAD_RULE(gr_transpose);
GRAD_RULE(gr_broadcast_to);
GRAD_RULE(gr_slice);
GRAD_RULE(gr_concat);
GRAD_RULE(gr_causal_mask);
GRAD_RULE(gr_cast);
#undef GRAD_RULE

#endif
