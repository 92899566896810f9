/* vmath.h - exp, erf, tanh (and, from vgelu.h, GELU and its gradient) for f32 written so a compiler can vectorize the loops that call them.
 *
 * libm's expf/erff/tanhf are opaque calls: a loop over a GELU or a softmax
 * stays one element at a time. These are branch-free (selects, no calls, no
 * table lookups), so the CPU backend's chunk loops (cpu_elementwise.c,
 * cpu_fused_kernels.c) turn into vector code, for whichever ISA the chunk function is
 * compiled for (CPU_VECTOR_CLONES below picks AVX-512, AVX2 or SSE2 at load
 * time). Each Horner step is an explicit fmaf(), one rounding: C11 mode
 * contracts nothing else, and fmaf is correctly rounded wherever it runs
 * (a vfmadd instruction in the x86-64-v3 and v4 clones, libm's exact fmaf
 * call in the SSE2 baseline clone and in constant folding, evaluate.c), so
 * every clone and the folder give the same bits. Only the baseline clone
 * pays for it: a call per fmaf keeps its loops scalar (erf about 25 ns per
 * element there against 2.9 without fmaf, 0.58 on AVX-512; GELU 37 against
 * 0.44; bench/ew_isa on an AMD EPYC Zen 4, bench/RESULTS.md).
 *
 * Error against the exact value, measured over every 257th f32 (both signs,
 * f64 libm as the reference; tests/test_vmath.c's sweep): al_vexpf 1.014 ulp,
 * al_vtanhf 1.250 ulp, al_verff 1.127 ulp (CUDA documents 2 ulp for its expf,
 * erff and tanhf); special values (NaN, +-inf, +-0, overflow to inf,
 * underflow through the subnormals to 0) as libm gives them. That test
 * checks the bounds and the special values.
 *
 * Only for float: the f64 chunk functions keep libm's double functions. */
#ifndef ALLOY_BASE_VMATH_H
#define ALLOY_BASE_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Chunk functions get one clone per ISA (GCC's target_clones: an ifunc picks
 * one when the library loads), so the same binary uses AVX-512 where the CPU
 * has it and runs on any x86-64. Elsewhere (clang, other CPUs): one version.
 * The files that define them (cpu_elementwise.c, cpu_fused*.c) compile
 * without trapping math (a #pragma at their top, so that these inline
 * functions get the same options and still inline): while a floating-point
 * operation may trap, the selects below (x > 100 ? ...) are branches to GCC,
 * and only AVX-512's masked operations let it vectorize them anyway; the
 * AVX2 and SSE2 clones stayed one element at a time (GELU 22 ns per element
 * against 3.3 vectorized, AVX2 clone on an AMD EPYC Zen 4: bench/ew_isa,
 * bench/RESULTS.md). The values are the same; only floating-point exception
 * flags, which alloy never reads, may differ. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(ALLOY_NO_VECTOR_CLONES)
#define CPU_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_VECTOR_CLONES
#endif

static inline float vm_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t vm_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* 2^n for n in [-126, 127], built from its exponent bits. */
static inline float vm_pow2i(int32_t n) { return vm_from_bits((uint32_t)(n + 127) << 23); }

/* e^x. x = k ln2 + r with |r| <= ln2/2 (ln2 in two parts, so k ln2 is
 * exact), e^r by its Taylor polynomial to r^7 (error < 2^-27), then times
 * 2^k in two halves, so that a subnormal result is rounded once and an
 * overflowing one becomes inf. */
static inline float al_vexpf(float x)
{
    /* One select per statement (a chain of them is a PHI too wide for GCC's
     * if-conversion). Below -104 the result rounds to 0: compute e^0 there
     * instead, since the scaling would pass through subnormals, which cost a
     * microcode assist per operation (a causal mask's -inf scores are half
     * of a softmax's inputs). */
    float xc = x > 100.0f ? 100.0f : x;
    xc = x >= -104.0f ? xc : 0.0f; /* false for a NaN too: e^0 computed there */
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float kf = fmaf(xc, 1.44269504088896341f, shifter) - shifter;
    float r = fmaf(-kf, 0.693145751953125f, xc); /* ln2's high part: 15 bits, exact product */
    r = fmaf(-kf, 1.42860682030941723212e-6f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r * r, r); /* e^r - 1, kept apart from the 1 for accuracy */
    p = p + 1.0f;
    int32_t k = (int32_t)kf;
    /* halves k1 = floor(k / 2) (GCC and clang shift signed integers
     * arithmetically; no sign fix-up as for k / 2), k2 = k - k1: p 2^k1 is
     * exact, so the product rounds once, as any split of k would */
    int32_t k1 = k >> 1, k2 = k - k1;
    float y = p * vm_pow2i(k1) * vm_pow2i(k2);
    return x >= -104.0f ? y : x != x ? x : 0.0f; /* the same test as above: one compare */
}

/* tanh x: x - x^3 q(x^2) for |x| < 0.625 (q a least-squares fit of
 * degree 5, relative error 5e-10 in f64), else 1 - 2 / (e^{2|x|} + 1) with x's sign;
 * +-1 beyond 9.1, where tanh rounds to 1. */
static inline float al_vtanhf(float x)
{
    float ax = x < 0.0f ? -x : x;
    float x2 = x * x;
    float q = -2.178023523e-03f;
    q = fmaf(q, x2, 8.214972292e-03f);
    q = fmaf(q, x2, -2.171555269e-02f);
    q = fmaf(q, x2, 5.394939667e-02f);
    q = fmaf(q, x2, -1.333322606e-01f);
    q = fmaf(q, x2, 3.333333129e-01f);
    float small = fmaf(-x * x2, q, x);
    float e = al_vexpf(2.0f * (ax > 9.1f ? 9.1f : ax));
    float big = 1.0f - 2.0f / (e + 1.0f);
    big = ax > 9.1f ? 1.0f : big;
    big = x < 0.0f ? -big : big;
    float y = ax < 0.625f ? small : big;
    return ((x != x) | (x == 0.0f)) ? x : y; /* NaN and -0 pass through */
}

/* erf x from three polynomial pieces, no exp, no division: x + x r(x^2) for
 * |x| < 1.1 (r of degree 7), else 1 - q(|x| - 1.65) for |x| in [1.1, 2.2)
 * and 1 - q(|x| - 3.06) for |x| in [2.2, 3.92] (q of degree 8, fitting
 * erfc; one Horner loop for both, each element picking its piece's
 * coefficients with one select), x's sign restored; +-1 beyond 3.92, where
 * erf rounds to 1. The pieces are Chebyshev interpolants in f64 (of
 * erf(x)/x - 1 in x^2, and of erfc), coefficients rounded to f32: largest
 * error 1.4e-10 relative, 2.4e-8 and 8.7e-9 absolute. Both r and q are
 * computed for every element (a vector has both kinds); a single loop over
 * all three pieces costs more, as GCC splits its selects apart again. */
static inline float al_verff(float x)
{
    float ax = x < 0.0f ? -x : x;
    float x2 = x * x;
    int small = ax < 1.1f;
    int tail = ax >= 2.2f;
    float az = ax > 3.92f ? 3.92f : ax;
    float u = az - (tail ? 3.06f : 1.65f);
    float q = (tail ? 1.020556524e-04f : 5.310624737e-04f);
    q = fmaf(q, u, tail ? -3.471449813e-04f : 5.403813384e-03f);
    q = fmaf(q, u, tail ? 6.034240236e-04f : -1.339084541e-02f);
    q = fmaf(q, u, tail ? -7.711944659e-04f : 2.480302786e-04f);
    q = fmaf(q, u, tail ? 7.720421009e-04f : 4.986103679e-02f);
    q = fmaf(q, u, tail ? -5.732718998e-04f : -1.098759835e-01f);
    q = fmaf(q, u, tail ? 2.966379044e-04f : 1.223408072e-01f);
    q = fmaf(q, u, tail ? -9.674548046e-05f : -7.414573785e-02f);
    q = fmaf(q, u, tail ? 1.507534109e-05f : 1.962441656e-02f);
    float r = -8.848233909e-06f;
    r = fmaf(r, x2, 1.097230050e-04f);
    r = fmaf(r, x2, -8.442827447e-04f);
    r = fmaf(r, x2, 5.218169669e-03f);
    r = fmaf(r, x2, -2.686441685e-02f);
    r = fmaf(r, x2, 1.128376552e-01f);
    r = fmaf(r, x2, -3.761263741e-01f);
    r = fmaf(r, x2, 1.283791670e-01f);
    float big = 1.0f - q;
    big = ax > 3.92f ? 1.0f : big;
    big = x < 0.0f ? -big : big;
    float y = small ? fmaf(x, r, x) : big;
    return ((x != x) | (x == 0.0f)) ? x : y; /* NaN and -0 pass through */
}

/* GELU (erf form) and its derivative directly, not through al_verff:
 * al_vgeluf, al_vgelu_gradf (float), al_vgelu_f64, al_vgelu_grad_f64
 * (double, libm); vgelu.h says how and how well. */
#include "vgelu.h" /* beside this file: emu.h includes vmath.h by its path */
AL_VGELU_FUNCTIONS(static inline, al_vgeluf, al_vgelu_gradf, al_vgelu_f64, al_vgelu_grad_f64)

#endif
