/* test_convert.c - f16/bf16 conversions against a double-arithmetic reference; the inline bf16 ones against the scalar ones; bulk load/store on every instruction set. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fenv.h>
#include <math.h>
#include <string.h>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "base/convert.h"
#include "support.h"

/* ---- helpers ---------------------------------------------------------- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double bits_f64(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static bool f16_is_nan(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }
static bool bf16_is_nan(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }

/* ---- independent reference ------------------------------------------------
 * The finite non-negative values of a format, decoded from their bit fields
 * with ldexp, in increasing order (the bit patterns are ordered like the
 * values), plus a sentinel 2^(emax+1) standing for infinity: a value at or
 * past the midpoint between the largest finite and the sentinel rounds to it,
 * which is exactly IEEE overflow under round to nearest even. */

#define F16_INF 0x7c00u
#define BF16_INF 0x7f80u
static double f16_vals[F16_INF + 1], bf16_vals[BF16_INF + 1];

static double decode(unsigned p, unsigned mbits, int bias)
{
    unsigned e = p >> mbits, m = p & ((1u << mbits) - 1);
    if (e == 0) return ldexp(m, 1 - bias - (int)mbits);
    return ldexp((1u << mbits) + m, (int)e - bias - (int)mbits);
}

static int setup_tables(void **state)
{
    (void)state;
    for (unsigned p = 0; p <= F16_INF; p++) f16_vals[p] = decode(p, 10, 15);
    for (unsigned p = 0; p <= BF16_INF; p++) bf16_vals[p] = decode(p, 7, 127);
    return 0;
}

/* Nearest value to |v| (v finite), ties to the even pattern. The comparison
 * 2|v| against lo + hi is exact in double: both are sums of two narrow values. */
static unsigned nearest(const double *vals, unsigned inf, double v)
{
    double a = fabs(v);
    if (a >= vals[inf]) return inf;
    unsigned lo = 0, hi = inf; /* vals[lo] <= a < vals[hi] */
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (vals[mid] <= a) lo = mid;
        else hi = mid;
    }
    double twice = 2 * a, mid = vals[lo] + vals[hi];
    if (twice < mid) return lo;
    if (twice > mid) return hi;
    return (lo & 1u) ? hi : lo;
}

static uint16_t ref_narrow(double v, bool bf16)
{
    uint16_t sign = signbit(v) ? 0x8000u : 0u;
    unsigned inf = bf16 ? BF16_INF : F16_INF;
    if (isinf(v)) return (uint16_t)(sign | inf);
    return (uint16_t)(sign | nearest(bf16 ? bf16_vals : f16_vals, inf, v));
}

static void check_f32_against_reference(float f)
{
    if (isnan(f)) {
        uint16_t h = cvt_f32_to_f16(f), b = cvt_f32_to_bf16(f);
        assert_true(f16_is_nan(h) && (h & 0x0200u) && (h >> 15) == (f32_bits(f) >> 31));
        assert_true(bf16_is_nan(b) && (b & 0x0040u) && (b >> 15) == (f32_bits(f) >> 31));
        return;
    }
    uint16_t h = cvt_f32_to_f16(f), rh = ref_narrow(f, false);
    uint16_t b = cvt_f32_to_bf16(f), rb = ref_narrow(f, true);
    if (h != rh || b != rb)
        fail_msg("%a (0x%08x): f16 0x%04x want 0x%04x, bf16 0x%04x want 0x%04x", (double)f,
                 (unsigned)f32_bits(f), h, rh, b, rb);
}

static void check_f64_against_reference(double d)
{
    uint16_t h = cvt_f64_to_f16(d), b = cvt_f64_to_bf16(d);
    if (isnan(d)) {
        assert_true(f16_is_nan(h) && bf16_is_nan(b) && (h >> 15) == (unsigned)!!signbit(d) &&
                    (b >> 15) == (unsigned)!!signbit(d));
        return;
    }
    uint16_t rh = ref_narrow(d, false), rb = ref_narrow(d, true);
    if (h != rh || b != rb)
        fail_msg("%a: f16 0x%04x want 0x%04x, bf16 0x%04x want 0x%04x", d, h, rh, b, rb);
}

/* A random f32 concentrated where f16 and bf16 round interestingly: any bit
 * pattern (NaNs included), the f16 range, and exact ties give or take one ulp
 * for f16 normals, f16 subnormals and bf16. */
static float random_f32(void)
{
    uint32_t u = (uint32_t)test_next_u64(), v = (uint32_t)(test_next_u64() >> 32), near = v % 3u - 1u;
    uint32_t sign = u & 0x80000000u, f16_exp = (100u + v / 3u % 45u) << 23;
    switch (v >> 29) {
    case 0: case 1: return bits_f32(u);
    case 2: case 3: return bits_f32(sign | f16_exp | (u & 0x7fffffu));
    case 4: return bits_f32(sign | f16_exp | (u & 0x7fe000u) | (0x1000u + near));
    case 5: { /* (k + 1/2) * 2^-24 for k < 1024, exact in f32 */
        float t = ((float)(u % 1024u) + 0.5f) * 0x1p-24f;
        return bits_f32(sign | (f32_bits(t) + near));
    }
    default: return bits_f32((u & 0xffff0000u) | (0x8000u + near));
    }
}

/* ---- scalar conversions --------------------------------------------------- */

static void test_every_f16_pattern_round_trips_through_f32(void **state)
{
    (void)state;
    for (uint32_t p = 0; p <= 0xffffu; p++) {
        float f = cvt_f16_to_f32((uint16_t)p);
        uint16_t back = cvt_f32_to_f16(f);
        if (f16_is_nan((uint16_t)p)) {
            /* quieted, sign and payload kept (the x86 F16C convention) */
            assert_int_equal(f32_bits(f), (p & 0x8000u) << 16 | 0x7fc00000u | (p & 0x3ffu) << 13);
            assert_int_equal(back, p | 0x0200u);
        } else {
            double want = (p & 0x8000u ? -1 : 1) * f16_vals[p & 0x7fffu];
            if ((p & 0x7fffu) == F16_INF) want = p & 0x8000u ? -INFINITY : INFINITY;
            assert_true((double)f == want);
            assert_int_equal(signbit(f) != 0, (p >> 15) != 0);
            assert_int_equal(back, p);
        }
    }
}

static void test_every_bf16_pattern_round_trips_through_f32(void **state)
{
    (void)state;
    for (uint32_t p = 0; p <= 0xffffu; p++) {
        float f = cvt_bf16_to_f32((uint16_t)p);
        uint16_t back = cvt_f32_to_bf16(f);
        if (bf16_is_nan((uint16_t)p)) {
            assert_int_equal(f32_bits(f), (p | 0x0040u) << 16); /* quieted */
            assert_int_equal(back, p | 0x0040u);
        } else {
            assert_int_equal(f32_bits(f), p << 16);
            assert_int_equal(back, p);
        }
    }
}

/* The header's inline bf16 conversions (for vector loops, and under
 * convert.c's own) against independent references: every bf16 pattern
 * widened, against its value decoded by hand (sign, exponent, mantissa; a
 * NaN quiet with its sign kept), and every f32 whose low 16 bits are one of
 * the rounding cases (below, at and above the half, zero, all ones)
 * rounded, against the double reference ref_narrow (a NaN quiet with its
 * sign kept): every sign, exponent and NaN payload among them. */
static void test_the_inline_bf16_conversions_give_the_scalar_functions_bits(void **state)
{
    (void)state;
    static const uint32_t low[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff};
    int64_t bad = 0;
    for (uint32_t p = 0; p <= 0xffffu; p++) {
        float w = cvt_bf16_value((uint16_t)p);
        unsigned sign = p >> 15, ex = (p >> 7) & 0xffu, man = p & 0x7fu;
        if (ex == 0xffu && man) {
            bad += !(isnan(w) && (f32_bits(w) & 0x00400000u) && (f32_bits(w) >> 31) == sign);
        } else {
            double v = ex == 0xffu ? INFINITY : ex ? ldexp(1.0 + man / 128.0, (int)ex - 127) : ldexp(man, -133);
            bad += (double)w != (sign ? -v : v) || (signbit(w) != 0) != (sign != 0);
        }
        bad += f32_bits(w) != f32_bits(cvt_bf16_to_f32((uint16_t)p));
        for (size_t l = 0; l < sizeof low / sizeof low[0]; l++) {
            uint32_t x = p << 16 | low[l];
            float f;
            memcpy(&f, &x, sizeof f);
            uint16_t r = cvt_bf16_rounded(f);
            if (isnan(f)) bad += !(bf16_is_nan(r) && (r & 0x0040u) && (r >> 15) == (x >> 31));
            else bad += r != ref_narrow(f, true);
        }
    }
    assert_int_equal(bad, 0);
}

static void test_f32_to_f16_and_bf16_match_the_double_reference_on_random_values(void **state)
{
    (void)state;
    for (int i = 0; i < 3000000; i++) check_f32_against_reference(random_f32());
}

static void test_f32_to_f16_rounds_hand_picked_cases_to_nearest_even(void **state)
{
    (void)state;
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000}, {-0.0f, 0x8000}, {1.0f, 0x3c00}, {-2.0f, 0xc000},
        {65504.0f, 0x7bff},               /* largest finite */
        {65519.99f, 0x7bff},              /* just below the overflow threshold */
        {65520.0f, 0x7c00},               /* the threshold itself: tie to even = inf */
        {-65520.0f, 0xfc00}, {1e10f, 0x7c00}, {INFINITY, 0x7c00}, {-INFINITY, 0xfc00},
        {0x1p-24f, 0x0001},               /* smallest subnormal */
        {0x1p-25f, 0x0000},               /* half of it: tie to even = 0 */
        {-0x1p-25f, 0x8000},
        {0x1.000002p-25f, 0x0001},        /* just above half */
        {0x3p-26f, 0x0001},               /* 0.75 ulp */
        {0x3p-25f, 0x0002},               /* 1.5 ulp: tie to even = 2 */
        {0x5p-25f, 0x0002},               /* 2.5 ulp: tie to even = 2 */
        {0x7p-25f, 0x0004},               /* 3.5 ulp: tie to even = 4 */
        {0x1p-14f - 0x1p-25f, 0x0400},    /* tie between largest subnormal and smallest normal */
        {0x1p-14f - 0x1p-24f, 0x03ff},
        {0x1p-149f, 0x0000}, {-0x1p-126f, 0x8000},
        {1.0f + 0x1p-11f, 0x3c00},        /* halfway, even below */
        {1.0f + 0x3p-11f, 0x3c02},        /* halfway, even above */
        {1.0f + 0x1p-11f + 0x1p-23f, 0x3c01},
        {2048.0f + 1.0f, 0x6800},         /* ulp 2 at 2048: tie to even */
        {2048.0f + 3.0f, 0x6802},
        {0.1f, 0x2e66}, {3.14159265f, 0x4248},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cvt_f32_to_f16(cases[i].f) != cases[i].h)
            fail_msg("%a: got 0x%04x want 0x%04x", (double)cases[i].f, cvt_f32_to_f16(cases[i].f),
                     cases[i].h);
        check_f32_against_reference(cases[i].f);
        check_f64_against_reference(cases[i].f);
    }
    uint16_t qn = cvt_f32_to_f16(-NAN);
    assert_true(f16_is_nan(qn) && (qn & 0x8000u));
    assert_int_equal(cvt_f32_to_f16(bits_f32(0x7f800001u)), 0x7e00); /* signalling NaN is quieted */
}

static void test_f32_to_bf16_rounds_hand_picked_cases_to_nearest_even(void **state)
{
    (void)state;
    static const struct {
        uint32_t f;
        uint16_t b;
    } cases[] = {
        {0x3f808000u, 0x3f80}, /* halfway, even below */
        {0x3f818000u, 0x3f82}, /* halfway, even above */
        {0x3f808001u, 0x3f81},
        {0x3f807fffu, 0x3f80},
        {0x7f7f7fffu, 0x7f7f}, /* just below the overflow threshold */
        {0x7f7f8000u, 0x7f80}, /* tie between largest finite and 2^128: inf */
        {0x7f7fffffu, 0x7f80}, {0xff7fffffu, 0xff80},
        {0x00008000u, 0x0000}, /* subnormal tie to even */
        {0x00018000u, 0x0002}, {0x00000001u, 0x0000}, {0x80000001u, 0x8000},
        {0x007fffffu, 0x0080}, /* largest f32 subnormal rounds up to the smallest normal */
        {0x7f800000u, 0x7f80}, {0x80000000u, 0x8000},
        {0x7f800001u, 0x7fc0}, /* signalling NaN whose payload would truncate away */
        {0xffc12345u, 0xffc1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float f = bits_f32(cases[i].f);
        if (cvt_f32_to_bf16(f) != cases[i].b)
            fail_msg("0x%08x: got 0x%04x want 0x%04x", (unsigned)cases[i].f, cvt_f32_to_bf16(f),
                     cases[i].b);
        check_f32_against_reference(f);
    }
}

static void test_f64_narrows_once_without_double_rounding(void **state)
{
    (void)state;
    /* Just above an f16 tie, by less than half an f32 ulp: via f32 it becomes
     * the tie and rounds down to even; rounded once it must round up. */
    double d = 1.0 + 0x1p-11 + 0x1p-40;
    assert_int_equal(cvt_f32_to_f16((float)d), 0x3c00); /* the double-rounding answer */
    assert_int_equal(cvt_f64_to_f16(d), 0x3c01);
    assert_int_equal(cvt_f64_to_f16(-d), 0xbc01);
    d = 1.0 + 0x1p-8 + 0x1p-40; /* the same for bf16 */
    assert_int_equal(cvt_f32_to_bf16((float)d), 0x3f80);
    assert_int_equal(cvt_f64_to_bf16(d), 0x3f81);
    /* and in the subnormal and overflow regions */
    d = 0x1p-25 + 0x1p-60;
    assert_int_equal(cvt_f32_to_f16((float)d), 0x0000);
    assert_int_equal(cvt_f64_to_f16(d), 0x0001);
    d = 65520.0 - 0x1p-20;
    assert_int_equal(cvt_f32_to_f16((float)d), 0x7c00);
    assert_int_equal(cvt_f64_to_f16(d), 0x7bff);
    assert_int_equal(cvt_f64_to_f16(65520.0), 0x7c00);
    assert_int_equal(cvt_f64_to_f16(1e300), 0x7c00);
    assert_int_equal(cvt_f64_to_bf16(-1e300), 0xff80);
    assert_int_equal(cvt_f64_to_f16(-0x1p-1074), 0x8000);
    assert_int_equal(cvt_f64_to_f16(bits_f64(0x7ff0000000000001u)), 0x7e00);
    assert_int_equal(cvt_f64_to_bf16(bits_f64(0xfff0000000000001u)), 0xffc0);
}

static void test_f64_to_f16_and_bf16_match_the_double_reference_on_random_values(void **state)
{
    (void)state;
    for (int i = 0; i < 2000000; i++) {
        uint64_t u = test_next_u64(), keep = 0x800fffffffffffffu; /* sign and mantissa */
        double d;
        switch (i & 3) {
        case 0: d = bits_f64(u); break;
        case 1: d = bits_f64((u & keep) | (990 + test_next_u64() % 60) << 52); break;   /* f16 range */
        case 2: d = bits_f64((u & keep) | (860 + test_next_u64() % 300) << 52); break;  /* bf16 small */
        default: /* a hair either side of an f16 or bf16 tie */
            d = (double)random_f32();
            d += d * (double)((int)(test_next_u64() % 5) - 2) * 0x1p-40;
            break;
        }
        check_f64_against_reference(d);
    }
}

/* ---- bulk load and store ---------------------------------------------------- */

static void test_bulk_f16_and_bf16_match_scalar_results_at_any_offset_and_length(void **state)
{
    (void)state;
    static uint16_t bits[65536 + 40];
    static float f[65536 + 40];
    static uint16_t back[65536 + 40];
    static unsigned char raw[2 * 65536 + 64];
    for (int bf = 0; bf < 2; bf++) {
        alloy_dtype dt = bf ? ALLOY_BF16 : ALLOY_F16;
        for (size_t n = 0; n < 40; n++) { /* every tail length, misaligned by one byte */
            for (size_t i = 0; i < n; i++) bits[i] = (uint16_t)test_next_u64();
            memcpy(raw + 1, bits, 2 * n);
            cvt_load_f32(dt, raw + 1, f, n);
            for (size_t i = 0; i < n; i++) {
                float want = bf ? cvt_bf16_to_f32(bits[i]) : cvt_f16_to_f32(bits[i]);
                assert_int_equal(f32_bits(f[i]), f32_bits(want));
            }
            cvt_store_f32(dt, f, raw + 1, n);
            memcpy(back, raw + 1, 2 * n);
            for (size_t i = 0; i < n; i++)
                assert_int_equal(back[i], bf ? cvt_f32_to_bf16(f[i]) : cvt_f32_to_f16(f[i]));
        }
        for (uint32_t p = 0; p <= 0xffffu; p++) bits[p] = (uint16_t)p;
        cvt_load_f32(dt, bits, f, 65536);
        for (uint32_t p = 0; p <= 0xffffu; p++) {
            float want = bf ? cvt_bf16_to_f32((uint16_t)p) : cvt_f16_to_f32((uint16_t)p);
            assert_int_equal(f32_bits(f[p]), f32_bits(want));
        }
        cvt_store_f32(dt, f, back, 65536);
        for (uint32_t p = 0; p <= 0xffffu; p++)
            assert_int_equal(back[p], bf ? cvt_f32_to_bf16(f[p]) : cvt_f32_to_f16(f[p]));
    }
}

static void test_simd_and_portable_paths_agree_bit_for_bit(void **state)
{
    (void)state;
    if (!cvt_force_portable(false)) skip(); /* no SIMD path on this CPU */
    enum { N = 1 << 20 };
    static uint16_t bits[65536], a16[N], b16[N];
    static float fa[N], fb[N], in[N];
    for (uint32_t p = 0; p <= 0xffffu; p++) bits[p] = (uint16_t)p;
    for (int bf = 0; bf < 2; bf++) {
        alloy_dtype dt = bf ? ALLOY_BF16 : ALLOY_F16;
        cvt_force_portable(false);
        cvt_load_f32(dt, bits, fa, 65536);
        cvt_force_portable(true);
        cvt_load_f32(dt, bits, fb, 65536);
        assert_memory_equal(fa, fb, sizeof(float) * 65536);
        /* every f32 the loads produce, then random patterns of every kind */
        for (int round = 0; round < 4; round++) {
            for (size_t i = 0; i < N; i++) in[i] = i < 65536 && round == 0 ? fa[i] : random_f32();
            if (round == 1)
                for (size_t i = 0; i < N; i++) /* NaNs of every payload and sign */
                    in[i] = bits_f32((uint32_t)test_next_u64() | 0x7f800001u);
            cvt_force_portable(false);
            cvt_store_f32(dt, in, a16, N);
            cvt_force_portable(true);
            cvt_store_f32(dt, in, b16, N);
            for (size_t i = 0; i < N; i++)
                if (a16[i] != b16[i])
                    fail_msg("%s 0x%08x: simd 0x%04x portable 0x%04x", bf ? "bf16" : "f16",
                             (unsigned)f32_bits(in[i]), a16[i], b16[i]);
        }
    }
    cvt_force_portable(false);
}

/* What a widening of f16 pattern p must give: the hand decoding (f16_vals)
 * for numbers, for a NaN its sign and payload with the quiet bit set. */
static uint32_t want_widened(uint32_t p)
{
    if (f16_is_nan((uint16_t)p)) return (p & 0x8000u) << 16 | 0x7fc00000u | (p & 0x3ffu) << 13;
    uint32_t sign = (p & 0x8000u) << 16;
    if ((p & 0x7fffu) == F16_INF) return sign | 0x7f800000u;
    return sign | f32_bits((float)f16_vals[p & 0x7fffu]); /* every f16 value is an f32 */
}

/* What a narrowing of f32 f must give: the nearest-value reference, for a
 * NaN its sign and the top of its payload with the quiet bit set. */
static uint16_t want_narrowed(float f)
{
    uint32_t u = f32_bits(f);
    if (isnan(f)) return (uint16_t)((u >> 16 & 0x8000u) | 0x7e00u | (u >> 13 & 0x3ffu));
    return ref_narrow(f, false);
}

/* f32 inputs for the narrowing: every 4093rd pattern (all exponents, both
 * signs, NaNs), and around every f16 rounding boundary (the midpoint of two
 * neighbours, exact in f32, and one f32 ulp either side) with both signs. */
static size_t narrowing_sweep(float *in, size_t cap)
{
    size_t n = 0;
    for (uint64_t u = 0; u <= 0xffffffffu && n < cap; u += 4093) in[n++] = bits_f32((uint32_t)u);
    for (uint32_t p = 0; p < F16_INF && n + 6 <= cap; p++) {
        uint32_t mid = f32_bits((float)((f16_vals[p] + f16_vals[p + 1]) / 2));
        for (uint32_t d = 0; d < 3; d++) {
            in[n++] = bits_f32(mid + d - 1);
            in[n++] = bits_f32((mid + d - 1) | 0x80000000u);
        }
    }
    return n;
}

/* cvt_f16_load and cvt_f16_store on each instruction set this CPU has
 * (AVX-512, AVX2 + F16C, portable): every one of the 65,536 f16 patterns
 * widened against the hand decoding, and ~1.2M f32 (every 4093rd pattern,
 * every rounding boundary of f16 give or take an ulp) narrowed against the
 * nearest-value reference, bit for bit; then every length 0-40 from a
 * misaligned address (the vector loops' tails and masks). */
static void test_f16_runs_on_every_isa_match_the_decoding_and_the_reference(void **state)
{
    (void)state;
    enum { N = (1 << 20) + (6 << 15) };
    static uint16_t bits[65536 + 64], h[N + 64];
    static float f[N + 64], in[N];
    static unsigned char raw[2 * 64 + 2];
    for (uint32_t p = 0; p <= 0xffffu; p++) bits[p] = (uint16_t)p;
    size_t nin = narrowing_sweep(in, N);
    assert_true(nin > (1u << 20) + 180000u);
    int levels = 0;
    for (int isa = CVT_ISA_PORTABLE; isa <= CVT_ISA_AVX512; isa++) {
        if (cvt_force_isa((cvt_isa)isa) != (cvt_isa)isa) continue; /* this CPU lacks it */
        levels++;
        cvt_f16_load(bits, f, 65536);
        for (uint32_t p = 0; p <= 0xffffu; p++)
            if (f32_bits(f[p]) != want_widened(p))
                fail_msg("isa %d: f16 0x%04x widened to 0x%08x, want 0x%08x", isa, (unsigned)p,
                         (unsigned)f32_bits(f[p]), (unsigned)want_widened(p));
        cvt_f16_store(in, h, nin);
        for (size_t i = 0; i < nin; i++)
            if (h[i] != want_narrowed(in[i]))
                fail_msg("isa %d: f32 0x%08x narrowed to 0x%04x, want 0x%04x", isa, (unsigned)f32_bits(in[i]),
                         h[i], want_narrowed(in[i]));
        for (size_t n = 0; n <= 40; n++) {
            uint16_t src[40], back[41];
            float wide[41];
            for (size_t i = 0; i < n; i++) src[i] = (uint16_t)test_next_u64();
            memcpy(raw + 1, src, 2 * n);
            wide[n] = 7.0f; /* past the end: left alone */
            cvt_f16_load(raw + 1, wide, n);
            for (size_t i = 0; i < n; i++) assert_int_equal(f32_bits(wide[i]), want_widened(src[i]));
            assert_true(wide[n] == 7.0f);
            memset(raw, 0xab, sizeof raw);
            cvt_f16_store(wide, raw + 1, n);
            memcpy(back, raw + 1, 2 * n + 2);
            for (size_t i = 0; i < n; i++) assert_int_equal(back[i], want_narrowed(wide[i]));
            assert_int_equal(back[n], 0xabab);
        }
    }
    cvt_force_isa(CVT_ISA_AVX512);
    print_message("f16 runs checked on %d instruction sets (this CPU's widest: %d)\n", levels, (int)cvt_isa_now());
    assert_true(levels >= 1);
}

/* Both paths must give the same bits whatever the FP environment says. */
static void test_f16_and_bf16_results_ignore_the_rounding_mode_and_ftz_daz(void **state)
{
    (void)state;
    enum { N = 1 << 16 };
    static uint16_t bits[N], want16[2][N], got16[N];
    static float want[2][N], got[N], in[N];
    for (uint32_t p = 0; p < N; p++) bits[p] = (uint16_t)p;
    for (size_t i = 0; i < N; i++) in[i] = random_f32();
    for (int bf = 0; bf < 2; bf++) {
        cvt_load_f32(bf ? ALLOY_BF16 : ALLOY_F16, bits, want[bf], N);
        cvt_store_f32(bf ? ALLOY_BF16 : ALLOY_F16, in, want16[bf], N);
    }
    const int modes[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO, FE_TONEAREST};
    int bad = -1;
    for (int m = 0; m < 4; m++) {
#if defined(__SSE2__)
        unsigned csr = _mm_getcsr();
        if (m == 3) _mm_setcsr(csr | 0x8040u); /* flush to zero, denormals are zero */
#endif
        assert_int_equal(fesetround(modes[m]), 0);
        for (int k = 0; k < 6; k++) { /* k: bf16?, instruction set (k >> 1) */
            alloy_dtype dt = k & 1 ? ALLOY_BF16 : ALLOY_F16;
            cvt_force_isa((cvt_isa)(k >> 1));
            cvt_load_f32(dt, bits, got, N);
            cvt_store_f32(dt, in, got16, N);
            bool same = !memcmp(got, want[k & 1], sizeof got) &&
                        !memcmp(got16, want16[k & 1], sizeof got16);
            for (size_t i = 0; i < N && same; i += 97) /* and the scalar functions */
                same = (k & 1 ? cvt_f32_to_bf16(in[i]) : cvt_f32_to_f16(in[i])) == want16[k & 1][i];
            if (!same && bad < 0) bad = m * 8 + k;
        }
        cvt_force_isa(CVT_ISA_AVX512);
        fesetround(FE_TONEAREST);
#if defined(__SSE2__)
        _mm_setcsr(csr);
#endif
    }
    if (bad >= 0)
        fail_msg("FP environment %d changed %s results (bulk at instruction set %d, or scalar)", bad / 8,
                 bad & 1 ? "bf16" : "f16", (bad & 7) >> 1);
}

static void test_bulk_integer_stores_truncate_toward_zero_and_saturate(void **state)
{
    (void)state;
    const float f[] = {2.9f, -2.9f, -0.0f, NAN, -NAN, INFINITY, -INFINITY, 1e10f, -1e10f,
                       2147483520.0f, 2147483648.0f, -2147483648.0f, 0x1p63f, -0x1p63f, 0x1p62f};
    const int32_t want32[] = {2, -2, 0, 0, 0, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN,
                              2147483520, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, INT32_MAX};
    const int64_t want64[] = {2, -2, 0, 0, 0, INT64_MAX, INT64_MIN, 10000000000, -10000000000,
                              2147483520, 2147483648, -2147483648, INT64_MAX, INT64_MIN,
                              (int64_t)1 << 62};
    enum { N = sizeof f / sizeof f[0] };
    double d[N];
    int32_t i32[N];
    int64_t i64[N];
    for (size_t i = 0; i < N; i++) d[i] = f[i];
    cvt_store_f32(ALLOY_I32, f, i32, N);
    assert_memory_equal(i32, want32, sizeof i32);
    cvt_store_f32(ALLOY_I64, f, i64, N);
    assert_memory_equal(i64, want64, sizeof i64);
    cvt_store_f64(ALLOY_I32, d, i32, N);
    assert_memory_equal(i32, want32, sizeof i32);
    cvt_store_f64(ALLOY_I64, d, i64, N);
    assert_memory_equal(i64, want64, sizeof i64);
    /* doubles just inside and outside the i32 range */
    const double e[] = {2147483647.9, -2147483648.9, 2147483648.0, -2147483649.0, 9.3e18, -9.3e18};
    cvt_store_f64(ALLOY_I32, e, i32, 6);
    const int32_t we32[] = {INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN};
    assert_memory_equal(i32, we32, sizeof we32);
    cvt_store_f64(ALLOY_I64, e, i64, 6);
    const int64_t we64[] = {2147483647, -2147483648, 2147483648, -2147483649, INT64_MAX, INT64_MIN};
    assert_memory_equal(i64, we64, sizeof we64);
}

static void test_bulk_bool_stores_one_for_every_nonzero_value_including_nan(void **state)
{
    (void)state;
    const float f[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, NAN, INFINITY, 0x1p-149f, -3.0f};
    const unsigned char want[] = {0, 0, 1, 1, 1, 1, 1, 1, 1};
    enum { N = sizeof f / sizeof f[0] };
    unsigned char b[N];
    double d[N];
    for (size_t i = 0; i < N; i++) d[i] = f[i];
    cvt_store_f32(ALLOY_BOOL, f, b, N);
    assert_memory_equal(b, want, N);
    memset(b, 7, N);
    cvt_store_f64(ALLOY_BOOL, d, b, N);
    assert_memory_equal(b, want, N);
    d[0] = 0x1p-1074; /* a double subnormal is non-zero too */
    cvt_store_f64(ALLOY_BOOL, d, b, 1);
    assert_int_equal(b[0], 1);
    float lf[N];
    double ld[N];
    cvt_load_f32(ALLOY_BOOL, want, lf, N);
    cvt_load_f64(ALLOY_BOOL, want, ld, N);
    for (size_t i = 0; i < N; i++) {
        assert_true(lf[i] == (float)want[i] && !signbit(lf[i]));
        assert_true(ld[i] == (double)want[i]);
    }
}

static void test_bulk_loads_convert_every_dtype_by_value(void **state)
{
    (void)state;
    float lf[4];
    double ld[4];
    const int32_t i32[] = {-7, INT32_MAX, INT32_MIN, 16777217};
    cvt_load_f32(ALLOY_I32, i32, lf, 4);
    assert_true(lf[0] == -7.0f && lf[1] == 0x1p31f && lf[2] == -0x1p31f && lf[3] == 16777216.0f);
    cvt_load_f64(ALLOY_I32, i32, ld, 4);
    assert_true(ld[0] == -7.0 && ld[1] == 2147483647.0 && ld[2] == -2147483648.0 &&
                ld[3] == 16777217.0);
    const int64_t i64[] = {-7, INT64_MAX, INT64_MIN, ((int64_t)1 << 53) + 1};
    cvt_load_f32(ALLOY_I64, i64, lf, 4);
    assert_true(lf[0] == -7.0f && lf[1] == 0x1p63f && lf[2] == -0x1p63f && lf[3] == 0x1p53f);
    /* rounded once: through double this would become a tie and round down */
    const int64_t above_tie = ((int64_t)1 << 62) + ((int64_t)1 << 38) + 1;
    cvt_load_f32(ALLOY_I64, &above_tie, lf, 1);
    assert_true(lf[0] == 0x1p62f + 0x1p39f);
    cvt_load_f64(ALLOY_I64, i64, ld, 4);
    assert_true(ld[0] == -7.0 && ld[1] == 0x1p63 && ld[2] == -0x1p63 && ld[3] == 0x1p53);
    const double f64[] = {1.0 + 0x1p-24, 1e300, -0x1p-149, 1.0 + 0x3p-24}; /* ties to even in f32 */
    cvt_load_f32(ALLOY_F64, f64, lf, 4);
    assert_true(lf[0] == 1.0f && lf[1] == INFINITY && lf[2] == -0x1p-149f &&
                lf[3] == 1.0f + 0x1p-22f);
    const float f32[] = {0.1f, -0x1p-149f, INFINITY, -0.0f};
    cvt_load_f64(ALLOY_F32, f32, ld, 4);
    assert_true(ld[0] == (double)0.1f && ld[1] == -0x1p-149 && ld[2] == INFINITY && signbit(ld[3]));
    cvt_load_f32(ALLOY_F32, f32, lf, 4);
    assert_memory_equal(lf, f32, sizeof f32);
    const uint16_t h[] = {0x3c00, 0x0001, 0xfc00, 0x7e00};
    cvt_load_f64(ALLOY_F16, h, ld, 4);
    assert_true(ld[0] == 1.0 && ld[1] == 0x1p-24 && ld[2] == -INFINITY && isnan(ld[3]));
    const uint16_t b[] = {0x3f80, 0x0001, 0xff80, 0x7fc0};
    cvt_load_f64(ALLOY_BF16, b, ld, 4);
    assert_true(ld[0] == 1.0 && ld[1] == 0x1p-133 && ld[2] == -INFINITY && isnan(ld[3]));
    cvt_load_f64(ALLOY_F64, f64, ld, 4);
    assert_memory_equal(ld, f64, sizeof f64);
}

static void test_bulk_float_stores_round_to_nearest_even(void **state)
{
    (void)state;
    const double d[] = {1.0 + 0x1p-11 + 0x1p-40, 65520.0, -0x1p-25, NAN};
    uint16_t h[4], b[4];
    float f[4];
    double back[4];
    cvt_store_f64(ALLOY_F16, d, h, 4);
    assert_true(h[0] == 0x3c01 && h[1] == 0x7c00 && h[2] == 0x8000 && f16_is_nan(h[3]));
    cvt_store_f64(ALLOY_BF16, d, b, 4);
    for (int i = 0; i < 4; i++) assert_int_equal(b[i], cvt_f64_to_bf16(d[i]));
    cvt_store_f64(ALLOY_F32, d, f, 4);
    assert_true(f[0] == 1.0f + 0x1p-11f && f[1] == 65520.0f && f[2] == -0x1p-25f && isnan(f[3]));
    cvt_store_f32(ALLOY_F64, f, back, 4);
    assert_true(back[0] == 1.0 + 0x1p-11 && back[1] == 65520.0 && isnan(back[3]));
    cvt_store_f32(ALLOY_F32, f, f, 4); /* in place is a no-op */
    assert_true(f[1] == 65520.0f);
    cvt_store_f64(ALLOY_F64, d, back, 4);
    assert_memory_equal(back, d, sizeof d);
}

/* cvt_convert, the cast of the CPU backend and of constant folding: f64
 * and integers go through f64 (rounded once), the others through f32. */
static void test_cast_rounds_once_through_f64_from_f64_and_integers(void **state)
{
    (void)state;
    /* 1 + 2^-8 + 2^-30 is above bf16's halfway 1 + 2^-8: up to 1 + 2^-7
     * (0x3f81); through f32 it would first become the tie, then 1.0 */
    const double d = 1.0 + 0x1p-8 + 0x1p-30;
    uint16_t b;
    cvt_convert(ALLOY_F64, &d, ALLOY_BF16, &b, 1);
    assert_int_equal(b, 0x3f81);
    /* 2^24 + 2^16 + 1 likewise: 2^24 + 2^17 (0x4b81), where f32 first would tie twice down to 2^24 (0x4b80) */
    const int64_t i[] = {(1 << 24) + (1 << 16) + 1, -3, 2049, 70000};
    uint16_t bi[4], hi[4];
    cvt_convert(ALLOY_I64, i, ALLOY_BF16, bi, 4);
    assert_int_equal(bi[0], 0x4b81);
    assert_int_equal(bi[1], 0xc040);
    cvt_convert(ALLOY_I64, i, ALLOY_F16, hi, 4);
    assert_true(hi[1] == 0xc200 && hi[2] == 0x6800 && hi[3] == 0x7c00); /* -3; 2049 ties to even 2048; past 65520: inf */
    /* f16 -> bf16 through f32: 1 + 2^-10 rounds to 1.0 */
    const uint16_t h = 0x3c01;
    cvt_convert(ALLOY_F16, &h, ALLOY_BF16, &b, 1);
    assert_int_equal(b, 0x3f80);
    /* to integers: truncated toward zero, saturated */
    const float f[] = {2.7f, -2.7f, 3e9f};
    int32_t to[3];
    cvt_convert(ALLOY_F32, f, ALLOY_I32, to, 3);
    assert_true(to[0] == 2 && to[1] == -2 && to[2] == INT32_MAX);
    /* the same dtype: the bytes as they are (-0 kept) */
    const float z[] = {-0.0f, 1.5f};
    float zc[2];
    cvt_convert(ALLOY_F32, z, ALLOY_F32, zc, 2);
    assert_memory_equal(zc, z, sizeof z);
}

int main(void)
{
    test_rng = 0x9e3779b97f4a7c15u;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_f16_pattern_round_trips_through_f32),
        cmocka_unit_test(test_every_bf16_pattern_round_trips_through_f32),
        cmocka_unit_test(test_the_inline_bf16_conversions_give_the_scalar_functions_bits),
        cmocka_unit_test(test_f32_to_f16_and_bf16_match_the_double_reference_on_random_values),
        cmocka_unit_test(test_f32_to_f16_rounds_hand_picked_cases_to_nearest_even),
        cmocka_unit_test(test_f32_to_bf16_rounds_hand_picked_cases_to_nearest_even),
        cmocka_unit_test(test_f64_narrows_once_without_double_rounding),
        cmocka_unit_test(test_f64_to_f16_and_bf16_match_the_double_reference_on_random_values),
        cmocka_unit_test(test_bulk_f16_and_bf16_match_scalar_results_at_any_offset_and_length),
        cmocka_unit_test(test_simd_and_portable_paths_agree_bit_for_bit),
        cmocka_unit_test(test_f16_runs_on_every_isa_match_the_decoding_and_the_reference),
        cmocka_unit_test(test_f16_and_bf16_results_ignore_the_rounding_mode_and_ftz_daz),
        cmocka_unit_test(test_bulk_integer_stores_truncate_toward_zero_and_saturate),
        cmocka_unit_test(test_bulk_bool_stores_one_for_every_nonzero_value_including_nan),
        cmocka_unit_test(test_bulk_loads_convert_every_dtype_by_value),
        cmocka_unit_test(test_bulk_float_stores_round_to_nearest_even),
        cmocka_unit_test(test_cast_rounds_once_through_f64_from_f64_and_integers),
    };
    return cmocka_run_group_tests(tests, setup_tables, NULL);
}
