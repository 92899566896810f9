/* ops.c - expands ops.def into the IR's op table (semantics only) and holds the attribute schemas. */
#include <string.h>

#include "ir/ir.h"
#include "ir/typerules.h"

static const ir_attr_spec A_NONE[] = {{NULL, 0, false}};
static const ir_attr_spec A_PARAM[] = {
    {"init", IR_ATTR_STR, true},   {"mean", IR_ATTR_FLOAT, false}, {"std", IR_ATTR_FLOAT, false},
    {"low", IR_ATTR_FLOAT, false}, {"high", IR_ATTR_FLOAT, false}, {"value", IR_ATTR_FLOAT, false},
    {"gain", IR_ATTR_FLOAT, false}, {"frozen", IR_ATTR_BOOL, false}, {NULL, 0, false}};
static const ir_attr_spec A_CONSTANT[] = {
    {"value", IR_ATTR_FLOAT, false}, {"values", IR_ATTR_FLOATS, false}, {NULL, 0, false}};
static const ir_attr_spec A_MATMUL[] = {
    {"transpose_a", IR_ATTR_BOOL, false}, {"transpose_b", IR_ATTR_BOOL, false}, {NULL, 0, false}};
static const ir_attr_spec A_REDUCE[] = {
    {"axes", IR_ATTR_INTS, false}, {"keepdims", IR_ATTR_BOOL, false}, {NULL, 0, false}};
static const ir_attr_spec A_AXIS[] = {{"axis", IR_ATTR_INT, false}, {NULL, 0, false}};
static const ir_attr_spec A_LAYER_NORM[] = {{"eps", IR_ATTR_FLOAT, false}, {NULL, 0, false}};
static const ir_attr_spec A_TRANSPOSE[] = {{"perm", IR_ATTR_INTS, true}, {NULL, 0, false}};
static const ir_attr_spec A_CAUSAL[] = {{"value", IR_ATTR_FLOAT, false}, {NULL, 0, false}};
static const ir_attr_spec A_PAD[] = {{"axis", IR_ATTR_INT, true},
                                     {"before", IR_ATTR_INT, true},
                                     {"after", IR_ATTR_INT, true},
                                     {NULL, 0, false}};
static const ir_attr_spec A_SLICE[] = {{"axis", IR_ATTR_INT, true},
                                       {"start", IR_ATTR_INT, true},
                                       {"end", IR_ATTR_INT, true},
                                       {NULL, 0, false}};

/* Elementwise ops have no attributes. */
#define EW_ATTRS A_NONE
#define STR(x) #x

const ir_op_info ir_ops[IR_OP_COUNT] = {
#define OP(nm, mn, mx, at, ty, cpu, amp, grad) [IR_OP_##nm] = {#nm, mn, mx, at, ty, amp, false, NULL},
#define EW(nm, nin, ty, amp, grad, expr) [IR_OP_##nm] = {#nm, nin, nin, EW_ATTRS, ty, amp, true, STR(expr)},
#include "ir/ops.def"
#undef OP
#undef EW
};

int ir_op_lookup(const char *name)
{
    for (int i = 0; i < IR_OP_COUNT; i++)
        if (strcmp(ir_ops[i].name, name) == 0) return i;
    return -1;
}
