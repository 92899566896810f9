/* typerules.h - the type (shape + dtype) rule of every op, named in ops.def. */
#ifndef ALLOY_TYPERULES_H
#define ALLOY_TYPERULES_H

#include <math.h>

#include "ir/ir.h"

#define TYPE_RULE(name)                                                                  \
    AL_HIDDEN alloy_status name(const ir_node *n, const ir_type *const *in, ir_type *out, \
                                char *why, size_t whylen)
/* one prototype per ops.def line (a rule named twice is declared twice) */
#define OP(nm, mn, mx, at, ty, ...) TYPE_RULE(ty);
#define EW(nm, nin, at, ty, ...) TYPE_RULE(ty);
#include "ir/ops.def"
#undef OP
#undef EW
#undef TYPE_RULE

/* For the rule files (typerules*.c): FAIL(status, fmt, ...) writes why and
 * returns status; RULE(name) opens a rule's definition. */
#define FAIL(status, ...)                                                                \
    do {                                                                                 \
        al_fmt(why, whylen, __VA_ARGS__);                                                \
        return status;                                                                   \
    } while (0)
/* Fails unless node n's eps attribute is finite and >= 0 (a NaN, an
 * infinite or a negative eps makes every output NaN or 0): one rule and one
 * message for every normalization. */
#define CHECK_EPS(n)                                                                     \
    do {                                                                                 \
        double eps_ = ir_attr_f((n), "eps");                                             \
        if (!(eps_ >= 0) || isinf(eps_))                                                 \
            FAIL(ALLOY_ERR_INVALID, "eps must be finite and >= 0, not %g", eps_);        \
    } while (0)
#define RULE(name)                                                                       \
    alloy_status name(const ir_node *n, const ir_type *const *in, ir_type *out, char *why, \
                      size_t whylen)

/* The attributes and class weight of a loss row op (cross_entropy,
 * nll_loss and their gradients; weight NULL when not given): reduction
 * "mean" or "sum", label_smoothing in [0, 1], weight [classes] of the
 * logits' dtype. Returns nonzero with the reason in why. (typerules_loss.c) */
AL_HIDDEN alloy_status ir_loss_attrs(const ir_node *n, const ir_type *logits, const ir_type *weight, char *why,
                                     size_t whylen);

#endif
