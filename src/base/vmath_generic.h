/* vmath_generic.h - makes exp, erf, tanh and gelu_erf(_grad) in expressions written once for float and double (ops.def's) take vmath.h's functions for float.
 *
 * Include after <tgmath.h>, only in files that evaluate ops.def's
 * expressions and row programs (cpu_elementwise.c, cpu_fused_kernels.c, cpu_row_programs.c, cpu_row_by_hand.c,
 * evaluate.c): a float argument gets al_vexpf/al_verff/al_vtanhf
 * (vectorizable), a double one libm's function as before; GELU and its
 * gradient get vgelu.h's al_vgeluf/al_vgelu_gradf for float and the erf
 * formula for double. Every f32
 * evaluation of ops.def then computes the same bits, the host emulation of
 * the generated CUDA code included (tests/cuda_emu/emu.h maps its float
 * exp/erf/tanh the same way). */
#ifndef ALLOY_BASE_VMATH_GENERIC_H
#define ALLOY_BASE_VMATH_GENERIC_H

#include <math.h>

#include "base/vmath.h"

#undef exp
#undef erf
#undef tanh
/* inside its own expansion the name is not expanded again: `exp` there is libm's double function */
#define exp(x) _Generic((x), float: al_vexpf, default: exp)(x)
#define erf(x) _Generic((x), float: al_verff, default: erf)(x)
#define tanh(x) _Generic((x), float: al_vtanhf, default: tanh)(x)
/* ops.def's gelu and gelu_grad: vgelu.h's pieces for float, the erf formula for double */
#define gelu_erf(x) _Generic((x), float: al_vgeluf, default: al_vgelu_f64)(x)
#define gelu_erf_grad(x) _Generic((x), float: al_vgelu_gradf, default: al_vgelu_grad_f64)(x)

#endif
