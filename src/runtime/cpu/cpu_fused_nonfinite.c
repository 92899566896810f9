/* cpu_fused_nonfinite.c - the inf and NaN checks of a fused group's chunks (found_inf, amp_check). */
/* No trapping math here (vmath.h, CPU_VECTOR_CLONES): the chunk functions'
 * selects then vectorize on every ISA level, not only with AVX-512's masks. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <tgmath.h>

#include "base/convert.h"
#include "runtime/cpu/cpu_fused.h"

/* Whether any of n values of dtype dt at p is an inf or NaN (as found_inf
 * sees a stored value; integers and bools never are). */
bool fz_any_nonfinite(alloy_dtype dt, const void *p, int64_t n)
{
    bool found = false;
    switch (dt) {
    case ALLOY_F32:
        for (int64_t k = 0; k < n; k++) found |= !isfinite(((const float *)p)[k]);
        break;
    case ALLOY_F64:
        for (int64_t k = 0; k < n; k++) found |= !isfinite(((const double *)p)[k]);
        break;
    case ALLOY_F16:
        for (int64_t k = 0; k < n; k++) found |= (((const uint16_t *)p)[k] & 0x7c00) == 0x7c00;
        break;
    case ALLOY_BF16:
        for (int64_t k = 0; k < n; k++) found |= (((const uint16_t *)p)[k] & 0x7f80) == 0x7f80;
        break;
    default: break;
    }
    return found;
}

/* The NONFINITE_* bits of one element's 32/64-bit float pattern or 16-bit
 * exponent field: e the exponent bits, m the mantissa bits. */
#define NF_BITS(e, m, emask) ((e) == (emask) ? ((m) ? NONFINITE_NAN : NONFINITE_INF) : 0)

int cpu_nonfinite_bits(alloy_dtype dt, const void *p, int64_t n)
{
    int bits = 0;
    switch (dt) {
    case ALLOY_F32:
        for (int64_t k = 0; k < n; k++) {
            float v = ((const float *)p)[k];
            if (!isfinite(v)) bits |= isnan(v) ? NONFINITE_NAN : NONFINITE_INF;
        }
        break;
    case ALLOY_F64:
        for (int64_t k = 0; k < n; k++) {
            double v = ((const double *)p)[k];
            if (!isfinite(v)) bits |= isnan(v) ? NONFINITE_NAN : NONFINITE_INF;
        }
        break;
    case ALLOY_F16:
        for (int64_t k = 0; k < n; k++) {
            uint16_t h = ((const uint16_t *)p)[k];
            bits |= NF_BITS(h & 0x7c00, h & 0x3ff, 0x7c00);
        }
        break;
    case ALLOY_BF16:
        for (int64_t k = 0; k < n; k++) {
            uint16_t h = ((const uint16_t *)p)[k];
            bits |= NF_BITS(h & 0x7f80, h & 0x7f, 0x7f80);
        }
        break;
    default: break;
    }
    return bits;
}

int cpu_nonfinite_bits_f32(alloy_dtype dt, const float *y, int64_t n)
{
    /* the smallest magnitudes that round to inf in f16 and bf16; written
     * without branches so that the loop vectorizes */
    float limit = dt == ALLOY_F16 ? 65520.0f : dt == ALLOY_BF16 ? 0x1.ff8p127f : INFINITY;
    int inf = 0, nan = 0;
    for (int64_t k = 0; k < n; k++) {
        float v = y[k];
        nan |= v != v;
        inf |= fabsf(v) >= limit;
    }
    return (inf ? NONFINITE_INF : 0) | (nan ? NONFINITE_NAN : 0);
}

/* amp_check on member mb's chunk y (compute type): its values as a store
 * rounds them (an f32 chunk by the range rule of the member's dtype, no
 * conversion; an f64 one stored first, into roundtrip unless stored). */
void fz_flag_nonfinite(const fz_member *mb, bool wide, const void *y, const char *dst, char *roundtrip,
                           int64_t len)
{
    int bits;
    if (!wide) {
        bits = cpu_nonfinite_bits_f32(mb->dtype, y, len);
    } else if (mb->dtype == ALLOY_F64 || dst) {
        bits = cpu_nonfinite_bits(mb->dtype, mb->dtype == ALLOY_F64 ? y : (const void *)dst, len);
    } else {
        cvt_store_f64(mb->dtype, y, roundtrip, (size_t)len);
        bits = cpu_nonfinite_bits(mb->dtype, roundtrip, len);
    }
    if (bits) __atomic_fetch_or(mb->flag, (uint8_t)bits, __ATOMIC_RELAXED);
}
