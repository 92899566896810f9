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
 * definition convert.c's conversions and cpu_fused.c's chunk loops use, so
 * that a loop of them turns into vector code in each ISA clone. */
static inline uint32_t cvt_bf16_bits_to_f32(uint32_t h) { return ((h & 0x7fffu) > 0x7f80u ? h | 0x40u : h) << 16; }

static inline uint32_t cvt_f32_bits_to_bf16(uint32_t x)
{
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return (int32_t)(x & 0x7fffffffu) > 0x7f800000 ? (x >> 16) | 0x40u : r;
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

/* For tests and benchmarks: `on` makes the bulk functions take the portable C
 * paths even where a SIMD path (x86 AVX2+F16C) exists; the results are the same
 * bit for bit either way. Returns whether this CPU has a SIMD path. */
AL_HIDDEN bool cvt_force_portable(bool on);

#endif
