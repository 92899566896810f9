/* typerules.h - the type (shape + dtype) rule of every op, named in ops.def. */
#ifndef ALLOY_TYPERULES_H
#define ALLOY_TYPERULES_H

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

#endif
