/* cpu_fused_kernels.c - the chunk functions of fused members: one per elementwise op and compute type, and the cast's copy. */
/* No trapping math here (vmath.h, CPU_VECTOR_CLONES): the chunk functions'
 * selects then vectorize on every ISA level, not only with AVX-512's masks. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <string.h>
#include <tgmath.h>

#include "base/vmath_generic.h"
#include "runtime/cpu/cpu_fused.h"

/* Each EW line of ops.def becomes two more chunk functions for groups of two
 * or more: the expression of cpu_elementwise.c's, so the same values (a NaN's
 * sign and payload may differ: vector code may take the other operand's), over
 * operands that are never NULL (an unused one points at a, and its loads are
 * dead) and never alias y, in blocks of 16 the compiler turns into vector
 * code at -O2, one clone per ISA (no fast-math, no contraction; exp, erf and
 * tanh of float are base/vmath.h's, so they vectorize too). */
#define OP(...)
#define P(k) ((T)p[k])
#define FZ_BODY(T_, nm, expr)                                                              \
    CPU_VECTOR_CLONES static void fz_##nm##_##T_(int64_t n, T_##_t *restrict y,            \
                                                 const T_##_t *restrict pa,                \
                                                 const T_##_t *restrict pb,                \
                                                 const T_##_t *restrict pc,                \
                                                 const double *p)                          \
    {                                                                                      \
        typedef T_##_t T;                                                                  \
        (void)p;                                                                           \
        int64_t i = 0;                                                                     \
        for (; i + 16 <= n; i += 16)                                                       \
            for (int j = 0; j < 16; j++) {                                                 \
                T a = pa[i + j], b = pb[i + j], c = pc[i + j];                             \
                (void)a, (void)b, (void)c;                                                 \
                y[i + j] = (T)(expr);                                                      \
            }                                                                              \
        for (; i < n; i++) {                                                               \
            T a = pa[i], b = pb[i], c = pc[i];                                             \
            (void)a, (void)b, (void)c;                                                     \
            y[i] = (T)(expr);                                                              \
        }                                                                                  \
    }
typedef float f32_t;
typedef double f64_t;
#define EW(nm, nin, at, ty, amp, grad, expr) FZ_BODY(f32, nm, expr) FZ_BODY(f64, nm, expr)
#include "ir/ops.def"
#undef EW
#undef P

/* A cast member: the value passes through in the compute type; a cast to
 * f16/bf16 is then rounded to its dtype like a bool/integer result (the
 * member's `exact`), so an explicit cast still rounds. */
void fz_copy_f32(int64_t n, float *restrict y, const float *restrict a, const float *restrict b,
                        const float *restrict c, const double *p)
{
    (void)b, (void)c, (void)p;
    memcpy(y, a, sizeof(float) * (size_t)n);
}

void fz_copy_f64(int64_t n, double *restrict y, const double *restrict a, const double *restrict b,
                        const double *restrict c, const double *p)
{
    (void)b, (void)c, (void)p;
    memcpy(y, a, sizeof(double) * (size_t)n);
}

const fz_kernel fz_kernels[IR_OP_COUNT] = {
#define EW(nm, ...) [IR_OP_##nm] = {fz_##nm##_f32, fz_##nm##_f64},
#include "ir/ops.def"
#undef EW
};
#undef OP
