/* cpu_softmax_exp.h - the softmax's exp on the CPU: base/vmath.h's al_vexpf for the arguments a softmax has (x - max: 0 or less, or NaN), the same bits in fewer operations. */
#ifndef ALLOY_RUNTIME_CPU_CPU_SOFTMAX_EXP_H
#define ALLOY_RUNTIME_CPU_CPU_SOFTMAX_EXP_H

#include <stdint.h>

#include "base/vmath.h"

/* e^d for d <= 0 or NaN: al_vexpf(d)'s bits (every such float checked:
 * tests/test_rows.c sweeps them, bench/RESULTS.md records the exhaustive
 * run), for the exponentials a softmax takes of x - max, which is never
 * above 0 (x <= max; NaN where the row's largest is NaN or x and the
 * largest are the same infinity). Two steps of al_vexpf are not needed
 * there: the clamp of d to 100 (never reached), and 2^k as two halves
 * (k = round(d / ln2) lies in [-150, 0] for d >= -104): p 2^(k + 64) is
 * exact (normal, p in [0.7, 1.5]) and its product with 2^-64 rounds once,
 * as al_vexpf's p 2^k1 2^k2 does, so the result is the same rounding of
 * the same p 2^k, subnormal results included. Callers with d > 0 must use
 * al_vexpf. */
static inline float cpu_softmax_exp_f32(float d)
{
    float dc = d >= -104.0f ? d : 0.0f; /* false for a NaN too: e^0 computed there, as al_vexpf */
    const float shifter = 12582912.0f;
    float kf = fmaf(dc, 1.44269504088896341f, shifter) - shifter;
    float r = fmaf(-kf, 0.693145751953125f, dc);
    r = fmaf(-kf, 1.42860682030941723212e-6f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r * r, r);
    p = p + 1.0f;
    float y = p * vm_pow2i((int32_t)kf + 64) * 0x1p-64f;
    return d >= -104.0f ? y : d != d ? d : 0.0f;
}

#endif
