/* cpu_ops.c - the CPU backend's per-op table, expanded from ops.def's cpu_kernel column and EW expressions. */
#include "runtime/cpu/cpu.h"

#define cpu_none NULL /* bound leaves: input, param, state */
const cpu_op cpu_ops[IR_OP_COUNT] = {
#define OP(nm, mn, mx, at, ty, kernel, ...) [IR_OP_##nm] = {cpu_##kernel, NULL, NULL},
#define EW(nm, ...) [IR_OP_##nm] = {cpu_elementwise, ew_##nm##_f32, ew_##nm##_f64},
#include "ir/ops.def"
#undef OP
#undef EW
};
