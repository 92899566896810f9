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

void cpu_range_add_f32(rt_range *r, alloy_dtype dt, const float *y, int64_t n)
{
    float normal = smallest_normal(dt);
    if (!r || normal == 0 || n <= 0) return;
    /* written without branches so that the loop vectorizes; a NaN fails
     * both compares and so moves neither the max nor the count */
    float max = 0;
    int64_t tiny = 0;
    int nan = 0;
    for (int64_t k = 0; k < n; k++) {
        float a = fabsf(y[k]);
        max = a > max ? a : max;
        tiny += (a > 0) & (a < normal);
        nan |= a != a;
    }
    merge(r, max, nan, (uint64_t)tiny, (uint64_t)n);
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
    /* on the bit patterns: |x| is the pattern less its sign, which orders
     * as the magnitude does; a subnormal has a zero exponent field */
    const uint16_t *h = p;
    uint16_t expo = dt == ALLOY_F16 ? 0x7c00 : 0x7f80;
    uint16_t max = 0;
    int64_t tiny = 0;
    int nan = 0;
    for (int64_t k = 0; k < n; k++) {
        uint16_t a = h[k] & 0x7fff;
        bool is_nan = (a & expo) == expo && (a & ~expo);
        max = !is_nan && a > max ? a : max;
        tiny += a && !(a & expo);
        nan |= is_nan;
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
