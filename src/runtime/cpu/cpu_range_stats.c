/* cpu_range_stats.c - the amp_stats option on the CPU: each f16/bf16 value's max |x| and underflow count, added from the loops that already hold its values. */
#include <math.h>
#include <string.h>

#include "base/convert.h"
#include "runtime/cpu/cpu.h"

/* The smallest normal of dt: 2^-14 for f16, 2^-126 for bf16; 0 for a
 * dtype with no statistics. */
static float smallest_normal(alloy_dtype dt)
{
    return dt == ALLOY_F16 ? 0x1p-14f : dt == ALLOY_BF16 ? 0x1p-126f : 0.0f;
}

/* Adds one chunk's results to r: max |x| by a compare-and-swap on the
 * bits (non-negative floats order as their bits do), the counts by adds. */
static void merge(rt_range *r, float max, bool nan, uint64_t tiny, uint64_t n)
{
    uint32_t bits;
    memcpy(&bits, &max, sizeof bits);
    uint32_t old = __atomic_load_n(&r->max_bits, __ATOMIC_RELAXED);
    while (bits > old && !__atomic_compare_exchange_n(&r->max_bits, &old, bits, true, __ATOMIC_RELAXED,
                                                      __ATOMIC_RELAXED)) {
    }
    if (nan) __atomic_store_n(&r->nan, 1u, __ATOMIC_RELAXED);
    if (tiny) __atomic_fetch_add(&r->tiny, tiny, __ATOMIC_RELAXED);
    __atomic_fetch_add(&r->count, n, __ATOMIC_RELAXED);
}

/* f32 bit patterns, read where the floats are */
typedef uint32_t __attribute__((may_alias)) f32_bits;

/* Over m patterns: the largest |x| pattern that is not a NaN, the count of
 * nonzero ones below lim, whether a NaN was there. On the bits, |x| being
 * the pattern less its sign (ordered as the magnitude is), so the loop is
 * an integer max and compare, which vectorize (a float max does not
 * without -ffast-math). A NaN's pattern is above inf's: when the max is
 * one, a second, rare, loop finds the largest that is not. */
static uint32_t scan_bits(const f32_bits *p, int64_t m, uint32_t lim, uint32_t *tiny_out, bool *nan_out)
{
    uint32_t max = 0, tiny = 0;
    for (int64_t k = 0; k < m; k++) {
        uint32_t a = p[k] & 0x7fffffffu;
        max = a > max ? a : max;
        tiny += a - 1u < lim - 1u; /* 0 < a < lim, in one unsigned compare */
    }
    *tiny_out = tiny;
    *nan_out = max > 0x7f800000u;
    if (*nan_out) {
        max = 0;
        for (int64_t k = 0; k < m; k++) {
            uint32_t a = p[k] & 0x7fffffffu;
            if (a <= 0x7f800000u && a > max) max = a;
        }
    }
    return max;
}

void cpu_range_add_f32(rt_range *r, alloy_dtype dt, const float *y, int64_t n)
{
    float normal = smallest_normal(dt);
    if (!r || normal == 0 || n <= 0) return;
    uint32_t lim;
    memcpy(&lim, &normal, sizeof lim);
    for (int64_t done = 0; done < n;) { /* blocks of 2^20: the count stays in 32 bits */
        int64_t m = n - done < (1 << 20) ? n - done : (1 << 20);
        uint32_t tiny;
        bool nan;
        uint32_t max = scan_bits((const f32_bits *)(const void *)(y + done), m, lim, &tiny, &nan);
        float fmax;
        memcpy(&fmax, &max, sizeof fmax);
        merge(r, fmax, nan, tiny, (uint64_t)m);
        done += m;
    }
}

void cpu_range_add_f64(rt_range *r, alloy_dtype dt, const double *y, int64_t n)
{
    double normal = smallest_normal(dt);
    if (!r || normal == 0 || n <= 0) return;
    double max = 0;
    int64_t tiny = 0;
    int nan = 0;
    for (int64_t k = 0; k < n; k++) {
        double a = fabs(y[k]);
        max = a > max ? a : max;
        tiny += (a > 0) & (a < normal);
        nan |= a != a;
    }
    /* the f32 that holds max: rounded up, so a max past f32's range is inf */
    float m = (float)max;
    if ((double)m < max) m = nextafterf(m, INFINITY);
    merge(r, m, nan, (uint64_t)tiny, (uint64_t)n);
}

void cpu_range_add_stored(rt_range *r, alloy_dtype dt, const void *p, int64_t n)
{
    if (!r || (dt != ALLOY_F16 && dt != ALLOY_BF16) || n <= 0) return;
    /* on the bit patterns as cpu_range_add_f32 does: a subnormal is a
     * nonzero pattern below the smallest normal's (0x0400 f16, 0x0080 bf16) */
    const uint16_t *h = p;
    uint16_t inf = dt == ALLOY_F16 ? 0x7c00 : 0x7f80, normal = dt == ALLOY_F16 ? 0x0400 : 0x0080;
    uint16_t max = 0;
    int64_t tiny = 0;
    for (int64_t k = 0; k < n; k++) {
        uint16_t a = h[k] & 0x7fff;
        max = a > max ? a : max;
        tiny += (uint16_t)(a - 1u) < (uint16_t)(normal - 1u);
    }
    bool nan = max > inf;
    if (nan) { /* rare: the largest that is not a NaN */
        max = 0;
        for (int64_t k = 0; k < n; k++) {
            uint16_t a = h[k] & 0x7fff;
            if (a <= inf && a > max) max = a;
        }
    }
    float m = dt == ALLOY_F16 ? cvt_f16_to_f32(max) : cvt_bf16_to_f32(max);
    merge(r, m, nan, (uint64_t)tiny, (uint64_t)n);
}

rt_range *cpu_range_of(const cpu_exec *x, const ir_graph *g, const ir_node *n)
{
    if (!x->ranges || (n->type.dtype != ALLOY_F16 && n->type.dtype != ALLOY_BF16) || !cpu_amp_checked(g, n))
        return NULL;
    return &x->ranges[n->id];
}
