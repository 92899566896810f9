/* cpu_fused_convert.c - a fused group's chunk conversions to and from f32 and the range rule of its f16/bf16 values. */
/* No trapping math here (vmath.h, CPU_VECTOR_CLONES): the chunk functions'
 * selects then vectorize on every ISA level, not only with AVX-512's masks. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <string.h>
#include <tgmath.h>

#include "base/convert.h"
#include "base/vmath.h"
#include "runtime/cpu/cpu_fused.h"

/* bf16 <-> f32 of one chunk, written here rather than called through
 * convert.c's dispatcher (a switch, a CPU check and a call for 128
 * elements): each ISA clone converts in its own vectors, inside the chunk
 * loop, in blocks of 16 as the chunk functions (vector code at -O2 too).
 * Bit for bit convert.c's: a NaN keeps its sign and payload with the quiet
 * bit set; a store rounds to nearest even, overflowing to inf. A fused
 * typed loop (each op reading bf16 and writing bf16 itself) measured no
 * faster: bench/RESULTS.md, "Conversions at group edges". */
CPU_VECTOR_CLONES static void bf16_load_chunk(const uint16_t *restrict s, float *restrict d, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) d[i + j] = cvt_bf16_value(s[i + j]);
    for (; i < n; i++) d[i] = cvt_bf16_value(s[i]);
}

CPU_VECTOR_CLONES static void bf16_store_chunk(const float *restrict s, uint16_t *restrict d, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) d[i + j] = cvt_bf16_rounded(s[i + j]);
    for (; i < n; i++) d[i] = cvt_bf16_rounded(s[i]);
}

/* cvt_load_f32 / cvt_store_f32 of one chunk, bf16 done in place, f16
 * straight to convert.c's runs (AVX-512 or F16C: GCC 12 turns a loop of
 * _Float16 conversions into one vcvtph2ps per element, and the integer
 * conversions of convert.h into many instructions per vector). */
void fz_load_chunk_f32(alloy_dtype dt, const void *src, float *dst, int64_t n)
{
    if (dt == ALLOY_BF16) bf16_load_chunk(src, dst, n);
    else if (dt == ALLOY_F16) cvt_f16_load(src, dst, (size_t)n);
    else cvt_load_f32(dt, src, dst, (size_t)n);
}

void fz_store_chunk_f32(alloy_dtype dt, const float *src, void *dst, int64_t n)
{
    if (dt == ALLOY_BF16) bf16_store_chunk(src, dst, n);
    else if (dt == ALLOY_F16) cvt_f16_store(src, dst, (size_t)n);
    else cvt_store_f32(dt, src, dst, (size_t)n);
}

/* The range rule of an unrounded f16/bf16 intermediate (docs/fusion.md): it
 * keeps its f32 precision but not more range than its dtype, so a value
 * that a store would round to inf becomes that inf (|x| >= 65520 for f16,
 * >= 0x1.ffp127 for bf16). Overflow decisions (found_inf, the loss
 * scaler) are then those of the unfused graph. */
/* cpu_range_f32 from x into y (x == y allowed). A select, not a branch, so
 * that the loop vectorizes: it runs on every chunk of a ranged value. NaN
 * compares false and stays. */
CPU_VECTOR_CLONES void fz_range_copy_f32(alloy_dtype dt, const float *x, float *y, int64_t n)
{
    float limit = cvt_inf_bound_f32(dt);
    if (limit == INFINITY) {
        if (x != y) memcpy(y, x, sizeof(float) * (size_t)n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = fabsf(v) >= limit ? copysignf(INFINITY, v) : v;
    }
}

/* Whether any of x[0..n) is one that the range rule of dt changes (an
 * or-reduction, no stores, so it vectorizes): a GEMM product's chunk is
 * then read in place, and a ranged value left as it is, unless one is. */
CPU_VECTOR_CLONES bool fz_range_changes(alloy_dtype dt, const float *x, int64_t n)
{
    float limit = cvt_inf_bound_f32(dt);
    int over = 0;
    for (int64_t i = 0; i < n; i++) over |= fabsf(x[i]) >= limit && fabsf(x[i]) < INFINITY;
    return over != 0;
}

void cpu_range_f32(alloy_dtype dt, float *y, int64_t n)
{
    if (fz_range_changes(dt, y, n)) fz_range_copy_f32(dt, y, y, n);
}

void fz_range_f64(alloy_dtype dt, double *y, int64_t n)
{
    double limit = dt == ALLOY_F16 ? 65520.0 : dt == ALLOY_BF16 ? 0x1.ffp127 : 0.0;
    if (limit == 0.0) return;
    for (int64_t i = 0; i < n; i++) {
        double v = y[i];
        y[i] = fabs(v) >= limit ? copysign(INFINITY, v) : v;
    }
}
