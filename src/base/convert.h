/* convert.h - exact conversions between f32/f64 and every storage dtype. */
#ifndef ALLOY_CONVERT_H
#define ALLOY_CONVERT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"

/* IEEE binary16 and bfloat16 <-> binary32, round to nearest even, NaN kept NaN
 * (quiet), overflow to infinity, subnormals exact. */
AL_HIDDEN float cvt_f16_to_f32(uint16_t h);
AL_HIDDEN uint16_t cvt_f32_to_f16(float f);
AL_HIDDEN float cvt_bf16_to_f32(uint16_t h);
AL_HIDDEN uint16_t cvt_f32_to_bf16(float f);
/* bf16 <-> f32 on the bits, in integer operations only (a NaN quieted, the
 * rest rounded to nearest even; overflow carries into inf): the one
 * definition convert.c's conversions and cpu_fused_convert.c's chunk loops use, so
 * that a loop of them turns into vector code in each ISA clone. */
/* The smallest magnitude an f32 value's store into dt rounds to inf
 * (65520 for f16, 0x1.ffp127 for bf16; INFINITY for f32 and wider): the
 * bound of the fused groups' range rule. */
static inline float cvt_inf_bound_f32(alloy_dtype dt)
{
    return dt == ALLOY_F16 ? 65520.0f : dt == ALLOY_BF16 ? 0x1.ffp127f : __builtin_inff();
}

static inline uint32_t cvt_bf16_bits_to_f32(uint32_t h) { return ((h & 0x7fffu) > 0x7f80u ? h | 0x40u : h) << 16; }

static inline uint32_t cvt_f32_bits_to_bf16(uint32_t x)
{
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return (int32_t)(x & 0x7fffffffu) > 0x7f800000 ? (x >> 16) | 0x40u : r;
}

/* f16 <-> f32 on the bits, in integer operations (and one exact multiply
 * with a normal result, so neither the rounding mode nor FTZ/DAZ changes
 * them): the one definition of the scalar f16 conversions, which x86's
 * F16C and AVX-512 instructions (vcvtph2ps, vcvtps2ph with round to
 * nearest even) match bit for bit: a NaN keeps its sign and the top of its
 * payload with the quiet bit set, a narrowing rounds to nearest even,
 * |x| >= 65520 overflows to inf, subnormals are exact. */
static inline uint32_t cvt_f16_bits_to_f32(uint32_t h)
{
    uint32_t sign = (h & 0x8000u) << 16, a = h & 0x7fffu;
    uint32_t r = (a << 13) + 0x38000000u; /* normal: rebias exponent 15 -> 127 */
    if (a >= 0x7c00u) r = (a << 13) | 0x7f800000u | (a > 0x7c00u ? 0x400000u : 0u);
    if (a < 0x0400u) { /* zero and subnormals: a * 2^-24, exact */
        float f = (float)(int32_t)a * 0x1p-24f;
        memcpy(&r, &f, sizeof r);
    }
    return sign | r;
}

static inline uint32_t cvt_f32_bits_to_f16(uint32_t x)
{
    uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    /* normal result: rebias 127 -> 15, round the 13 dropped bits to nearest
     * even; a carry out of the mantissa correctly bumps the exponent */
    uint32_t n = a - 0x38000000u;
    n = (n + 0xfffu + ((n >> 13) & 1u)) >> 13;
    /* subnormal result (a < 2^-14): m * 2^(e-150) in units of 2^-24 is
     * m >> (126-e); shifts of 25 and more give 0 (below half the smallest
     * subnormal) */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t s = 126u - (e < 101u || e > 112u ? 101u : e);
    uint32_t sub = (m + (1u << (s - 1)) - 1u + ((m >> s) & 1u)) >> s;
    uint32_t r = a < 0x38800000u ? sub : n;
    r = a >= 0x477ff000u ? 0x7c00u : r; /* >= 65520 rounds to infinity */
    r = a > 0x7f800000u ? 0x7e00u | ((a >> 13) & 0x3ffu) : r;
    return sign | r;
}

/* cvt_bf16_to_f32 and cvt_f32_to_bf16 inline. */
static inline float cvt_bf16_value(uint16_t h)
{
    uint32_t u = cvt_bf16_bits_to_f32(h);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t cvt_bf16_rounded(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return (uint16_t)cvt_f32_bits_to_bf16(x);
}

/* Runs of f16 <-> f32: n f16 at src (any alignment) to f32 at dst, and n
 * f32 back to f16, bit for bit cvt_f16_to_f32 / cvt_f32_to_f16, with the
 * widest instructions this CPU has (cvt_isa_now): AVX-512's 16 at a time,
 * F16C's 8 (with AVX2), or the portable code above. The loops that convert
 * f16 in bulk (cvt_load_f32/cvt_store_f32, the fused groups' chunks) call
 * these; src and dst must not overlap. */
AL_HIDDEN void cvt_f16_load(const void *src, float *dst, size_t n);
AL_HIDDEN void cvt_f16_store(const float *src, void *dst, size_t n);

/* f64 -> f16/bf16 rounded once (not via f32, which would round twice). */
AL_HIDDEN uint16_t cvt_f64_to_f16(double d);
AL_HIDDEN uint16_t cvt_f64_to_bf16(double d);

/* Bulk: n elements of `dtype` at src (any alloy dtype) to f32 / f64, and back.
 * Integer and bool sources convert by value; stores to integers truncate
 * toward zero with saturation at the type's range (NaN -> 0); stores to bool
 * write 1 for any non-zero value (NaN included). src and dst must not overlap
 * (except f32 -> f32 and f64 -> f64, which are plain copies). */
AL_HIDDEN void cvt_load_f32(alloy_dtype dtype, const void *src, float *dst, size_t n);
AL_HIDDEN void cvt_store_f32(alloy_dtype dtype, const float *src, void *dst, size_t n);
AL_HIDDEN void cvt_load_f64(alloy_dtype dtype, const void *src, double *dst, size_t n);
AL_HIDDEN void cvt_store_f64(alloy_dtype dtype, const double *src, void *dst, size_t n);

/* cast: n elements of dtype `from` at src to dtype `to` at dst, each
 * rounded once: through f64 when either side is f64 or an integer, else
 * through f32; a plain copy when the dtypes are equal. src and dst must not overlap. */
AL_HIDDEN void cvt_convert(alloy_dtype from, const void *src, alloy_dtype to, void *dst, size_t n);

/* The instruction sets the bulk conversions choose from, narrowest first:
 * portable C; x86 AVX2 + F16C; x86 AVX-512 (F, BW, VL; f16 only, bf16
 * stays on AVX2's code). */
typedef enum cvt_isa { CVT_ISA_PORTABLE, CVT_ISA_F16C, CVT_ISA_AVX512 } cvt_isa;

/* The instruction set the bulk conversions use now: the widest this CPU has
 * (read once), at most the cap of cvt_force_isa. */
AL_HIDDEN cvt_isa cvt_isa_now(void);

/* For tests and benchmarks: caps the bulk conversions at `cap` (the results
 * are the same bit for bit on every level); returns the level now used,
 * which is lower than cap where the CPU lacks it. CVT_ISA_AVX512 lifts the
 * cap. */
AL_HIDDEN cvt_isa cvt_force_isa(cvt_isa cap);

/* cvt_force_isa(on ? CVT_ISA_PORTABLE : CVT_ISA_AVX512); returns whether
 * this CPU has a SIMD path (AVX2 + F16C or more). */
AL_HIDDEN bool cvt_force_portable(bool on);

#endif
