/* grad_rules.h - the gradient rule of every differentiable op and the small API rules emit nodes with. */
#ifndef ALLOY_GRAD_RULES_H
#define ALLOY_GRAD_RULES_H

#include "ir/ir.h"

/* What a rule sees: the graph the backward is appended to. */
typedef struct ad_ctx ad_ctx;
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

/* Gradient rule: given the gradient dy of node n's result, emits the
 * gradients of its operands into dx[j] (a node id, or -1 for an operand with
 * no gradient). dx[j] may also have a shape that broadcasts to operand j's
 * (same dtype): autodiff then sums it down (ad_unbroadcast) after adding in
 * the gradients of the operands before j. So a rule whose row kernels read
 * the same rows (layer_norm: dx, and dy * xhat for dgamma) emits only
 * those, and the column sums come after dx's accumulation: the sibling rule
 * of the fuse pass (fuse_siblings.c) can then run them as one group. */
typedef alloy_status (*ad_rule)(ad_ctx *c, const ir_node *n, int dy, int *dx);

/* The rule of every op (ops.def's grad_rule column R is gr_R here); NULL
 * when the op is not differentiable. */
AL_HIDDEN extern const ad_rule ad_rules[IR_OP_COUNT];

#define GRAD_RULE(name) AL_HIDDEN alloy_status name(ad_ctx *c, const ir_node *n, int dy, int *dx)
#define OP(nm, mn, mx, at, ty, cpu, amp, grad) GRAD_RULE(gr_##grad);
#define EW(nm, nin, at, ty, amp, grad, expr) GRAD_RULE(gr_##grad);
#include "ir/ops.def"
#undef OP
#undef EW
#undef GRAD_RULE

#endif
