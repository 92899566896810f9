/* convert.c - exact f16/bf16/f64 <-> f32 conversions and bulk load/store for every dtype. */
#include <stdatomic.h>
#include <string.h>

#include "base/convert.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86_SIMD 1
#else
#define HAVE_X86_SIMD 0
#endif

/* Bit views and unaligned little-endian element access (tensors from files
 * need not be aligned, so every element goes through memcpy). */
static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint64_t f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}
#define LOADER(name, T)                                                                  \
    static inline T name(const unsigned char *p)                                         \
    {                                                                                    \
        T v;                                                                             \
        memcpy(&v, p, sizeof v);                                                         \
        return v;                                                                        \
    }
LOADER(ld_u16, uint16_t)
LOADER(ld_f32, float)
LOADER(ld_f64, double)
LOADER(ld_i32, int32_t)
LOADER(ld_i64, int64_t)
#undef LOADER
#define STORER(name, T)                                                                  \
    static inline void name(unsigned char *p, T v) { memcpy(p, &v, sizeof v); }
STORER(st_u16, uint16_t)
STORER(st_f32, float)
STORER(st_f64, double)
STORER(st_i32, int32_t)
STORER(st_i64, int64_t)
#undef STORER

/* The scalar kernels are convert.h's, on bit patterns in integer
 * arithmetic, so the FP rounding mode and FTZ/DAZ do not change them, and
 * they treat NaNs the way x86 F16C does: quiet bit set, payload shifted
 * (truncated when narrowing), sign kept. */
static inline uint64_t rne_shift(uint64_t v, unsigned s)
{
    return (v + ((uint64_t)1 << (s - 1)) - 1u + ((v >> s) & 1u)) >> s;
}

/* A double rounded once to a binary format with `mbits` stored mantissa bits
 * and exponent bias `bias` (f16: 10, 15; bf16: 7, 127). */
static uint16_t narrow_f64(uint64_t x, unsigned mbits, unsigned bias)
{
    const unsigned shift = 52 - mbits;
    const uint64_t inf = (uint64_t)(2 * bias + 1) << mbits, mmask = ((uint64_t)1 << mbits) - 1;
    uint64_t sign = (x >> 48) & 0x8000u, a = x & 0x7fffffffffffffffu;
    if (a > 0x7ff0000000000000u) /* NaN: quiet, top of the payload kept */
        return (uint16_t)(sign | inf | (mmask & ~(mmask >> 1)) | ((a >> shift) & mmask));
    /* halfway between the largest finite value and 2^(bias+1) */
    uint64_t ovf = ((uint64_t)(1023 + bias) << 52) | ((((uint64_t)2 << mbits) - 1) << (shift - 1));
    if (a >= ovf) return (uint16_t)(sign | inf);
    if (a >= (uint64_t)(1024 - bias) << 52) /* normal: rebias, round, carries are right */
        return (uint16_t)(sign | rne_shift(a - ((uint64_t)(1023 - bias) << 52), shift));
    /* subnormal: the ulp is 2^(1-bias-mbits); shifts past 54 all give 0 */
    unsigned e = (unsigned)(a >> 52), s = 1076 - bias - mbits - e;
    if (s > 54) s = 54;
    return (uint16_t)(sign | rne_shift((a & 0xfffffffffffffu) | (uint64_t)1 << 52, s));
}

float cvt_f16_to_f32(uint16_t h) { return bits_f32(cvt_f16_bits_to_f32(h)); }
uint16_t cvt_f32_to_f16(float f) { return (uint16_t)cvt_f32_bits_to_f16(f32_bits(f)); }
float cvt_bf16_to_f32(uint16_t h) { return bits_f32(cvt_bf16_bits_to_f32(h)); }
uint16_t cvt_f32_to_bf16(float f) { return (uint16_t)cvt_f32_bits_to_bf16(f32_bits(f)); }
uint16_t cvt_f64_to_f16(double d) { return narrow_f64(f64_bits(d), 10, 15); }
uint16_t cvt_f64_to_bf16(double d) { return narrow_f64(f64_bits(d), 7, 127); }

/* Truncation toward zero with saturation; NaN -> 0. */
static inline int32_t sat_i32(double d)
{
    if (d != d) return 0;
    if (d >= 0x1p31) return INT32_MAX;
    if (d <= -0x1p31) return INT32_MIN;
    return (int32_t)d;
}
static inline int64_t sat_i64(double d)
{
    if (d != d) return 0;
    if (d >= 0x1p63) return INT64_MAX;
    if (d <= -0x1p63) return INT64_MIN;
    return (int64_t)d;
}

/* Portable bulk kernels for f16/bf16 in blocks of a fixed 16, with restrict,
 * so that GCC vectorizes them even at -O2 (its cheapest cost model adds no
 * epilogue loop and no aliasing check). The bf16 ones vectorize with plain
 * SSE2 (3-5x faster); the f16 ones stay scalar on x86, and run only where
 * the CPU lacks F16C (cvt_f16_load/cvt_f16_store below). */
#define PORTABLE_LOAD(name, conv)                                                        \
    static void name(const unsigned char *restrict s, float *restrict d, size_t n)       \
    {                                                                                    \
        size_t i = 0;                                                                    \
        for (; i + 16 <= n; i += 16)                                                     \
            for (size_t j = i; j < i + 16; j++)                                          \
                d[j] = bits_f32(conv(ld_u16(s + 2 * j)));                                \
        for (; i < n; i++) d[i] = bits_f32(conv(ld_u16(s + 2 * i)));                     \
    }
#define PORTABLE_STORE(name, conv)                                                       \
    static void name(const float *restrict s, unsigned char *restrict d, size_t n)       \
    {                                                                                    \
        size_t i = 0;                                                                    \
        for (; i + 16 <= n; i += 16)                                                     \
            for (size_t j = i; j < i + 16; j++)                                          \
                st_u16(d + 2 * j, (uint16_t)conv(f32_bits(s[j])));                       \
        for (; i < n; i++) st_u16(d + 2 * i, (uint16_t)conv(f32_bits(s[i])));            \
    }
PORTABLE_LOAD(f16_load, cvt_f16_bits_to_f32)
PORTABLE_LOAD(bf16_load, cvt_bf16_bits_to_f32)
PORTABLE_STORE(f16_store, cvt_f32_bits_to_f16)
PORTABLE_STORE(bf16_store, cvt_f32_bits_to_bf16)
#undef PORTABLE_LOAD
#undef PORTABLE_STORE

#if HAVE_X86_SIMD
/* x86 AVX2 + F16C paths. Each handles a multiple of 8 elements and returns how
 * many; the caller finishes with the scalar kernels, which agree bit for bit. */
#define SIMD __attribute__((target("avx2,f16c")))
/* AVX-512 F, BW and VL: 16 f16 per vcvtph2ps/vcvtps2ph, masked tails. */
#define SIMD512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c")))

SIMD static size_t f16_load_simd(const unsigned char *s, float *d, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const void *)(s + 2 * i))));
    return i;
}

SIMD static size_t f16_store_simd(const float *s, unsigned char *d, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) /* imm 0: round to nearest even whatever MXCSR says */
        _mm_storeu_si128((void *)(d + 2 * i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), 0));
    return i;
}

/* All n, the last n % 16 under a mask (no scalar tail). */
SIMD512 static void f16_load_avx512(const unsigned char *s, float *d, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(s + 2 * i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(d + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + 2 * i)));
    }
}

SIMD512 static void f16_store_avx512(const float *s, unsigned char *d, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) /* imm 0: round to nearest even whatever MXCSR says */
        _mm256_storeu_si256((void *)(d + 2 * i), _mm512_cvtps_ph(_mm512_loadu_ps(s + i), 0));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(d + 2 * i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, s + i), 0));
    }
}

SIMD static size_t bf16_load_simd(const unsigned char *s, float *d, size_t n)
{
    const __m256i abs = _mm256_set1_epi16(0x7fff), inf = _mm256_set1_epi16(0x7f80);
    const __m256i quiet = _mm256_set1_epi16(0x40), zero = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const void *)(s + 2 * i));
        __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(h, abs), inf);
        h = _mm256_or_si256(h, _mm256_and_si256(nan, quiet));
        /* order the 64-bit quarters 0,2,1,3 so the in-lane unpacks give 0-7, 8-15 */
        h = _mm256_permute4x64_epi64(h, 0xd8);
        _mm256_storeu_si256((void *)(d + i), _mm256_unpacklo_epi16(zero, h));
        _mm256_storeu_si256((void *)(d + i + 8), _mm256_unpackhi_epi16(zero, h));
    }
    return i;
}

SIMD static inline __m256i f2bf8(__m256i x)
{
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    __m256i hi = _mm256_srli_epi32(x, 16);
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(x, bias), _mm256_and_si256(hi, one));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs), inf);
    __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(_mm256_srli_epi32(r, 16), quiet, nan);
}

SIMD static size_t bf16_store_simd(const float *s, unsigned char *d, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = f2bf8(_mm256_loadu_si256((const void *)(s + i)));
        __m256i b = f2bf8(_mm256_loadu_si256((const void *)(s + i + 8)));
        /* packus interleaves 128-bit lanes; the permute puts them back in order */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
        _mm256_storeu_si256((void *)(d + 2 * i), p);
    }
    return i;
}

/* The widest level this CPU runs. AVX2 and AVX-512 through the builtin,
 * which also checks that the OS saves ymm/zmm state; F16C through cpuid,
 * since older clangs do not know the builtin's "f16c". */
static cvt_isa isa_present(void)
{
    unsigned a, b, c = 0, d;
    __builtin_cpu_init();
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    if (!f16c || !__builtin_cpu_supports("avx2")) return CVT_ISA_PORTABLE;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return CVT_ISA_AVX512;
    return CVT_ISA_F16C;
}
#else
static cvt_isa isa_present(void) { return CVT_ISA_PORTABLE; }
#endif

/* The level in use (min of isa_present and the cap), -1 until first read;
 * one relaxed load per bulk call. */
static atomic_int isa_cap = CVT_ISA_AVX512;
static atomic_int isa_used = -1;
static atomic_int isa_best = -1;

static cvt_isa isa_set(void)
{
    int best = atomic_load_explicit(&isa_best, memory_order_relaxed);
    if (best < 0) atomic_store_explicit(&isa_best, best = (int)isa_present(), memory_order_relaxed);
    int cap = atomic_load_explicit(&isa_cap, memory_order_relaxed);
    int used = best < cap ? best : cap;
    atomic_store_explicit(&isa_used, used, memory_order_relaxed);
    return (cvt_isa)used;
}

cvt_isa cvt_isa_now(void)
{
    int used = atomic_load_explicit(&isa_used, memory_order_relaxed);
    return used >= 0 ? (cvt_isa)used : isa_set();
}

cvt_isa cvt_force_isa(cvt_isa cap)
{
    atomic_store_explicit(&isa_cap, (int)cap, memory_order_relaxed);
    return isa_set();
}

bool cvt_force_portable(bool on)
{
    cvt_force_isa(on ? CVT_ISA_PORTABLE : CVT_ISA_AVX512);
    return atomic_load_explicit(&isa_best, memory_order_relaxed) > CVT_ISA_PORTABLE;
}

void cvt_f16_load(const void *src, float *dst, size_t n)
{
    const unsigned char *s = src;
    size_t i = 0;
#if HAVE_X86_SIMD
    cvt_isa isa = cvt_isa_now();
    if (isa == CVT_ISA_AVX512) {
        f16_load_avx512(s, dst, n);
        return;
    }
    if (isa == CVT_ISA_F16C) i = f16_load_simd(s, dst, n);
#endif
    f16_load(s + 2 * i, dst + i, n - i);
}

void cvt_f16_store(const float *src, void *dst, size_t n)
{
    unsigned char *d = dst;
    size_t i = 0;
#if HAVE_X86_SIMD
    cvt_isa isa = cvt_isa_now();
    if (isa == CVT_ISA_AVX512) {
        f16_store_avx512(src, d, n);
        return;
    }
    if (isa == CVT_ISA_F16C) i = f16_store_simd(src, d, n);
#endif
    f16_store(src + i, d + 2 * i, n - i);
}

#if HAVE_X86_SIMD
#define TRY_SIMD(fn, s, d, n) (cvt_isa_now() >= CVT_ISA_F16C ? fn(s, d, n) : 0)
#else
#define TRY_SIMD(fn, s, d, n) ((void)(s), (void)(d), (size_t)0 * (n))
#endif

void cvt_load_f32(alloy_dtype dtype, const void *src, float *dst, size_t n)
{
    if (n == 0) return; /* an empty tensor may have no buffer at all (NULL) */
    const unsigned char *s = src;
    size_t i = 0;
    switch (dtype) {
    case ALLOY_F32: memmove(dst, src, n * sizeof(float)); return;
    case ALLOY_F16: cvt_f16_load(s, dst, n); return;
    case ALLOY_BF16:
        i = TRY_SIMD(bf16_load_simd, s, dst, n);
        bf16_load(s + 2 * i, dst + i, n - i);
        return;
    case ALLOY_F64: for (; i < n; i++) dst[i] = (float)ld_f64(s + 8 * i); return;
    case ALLOY_I32: for (; i < n; i++) dst[i] = (float)ld_i32(s + 4 * i); return;
    case ALLOY_I64: for (; i < n; i++) dst[i] = (float)ld_i64(s + 8 * i); return;
    case ALLOY_BOOL: for (; i < n; i++) dst[i] = s[i] ? 1.0f : 0.0f; return;
    default: al_assert_fail("valid dtype", __FILE__, __LINE__);
    }
}

void cvt_store_f32(alloy_dtype dtype, const float *src, void *dst, size_t n)
{
    if (n == 0) return; /* an empty tensor may have no buffer at all (NULL) */
    unsigned char *d = dst;
    size_t i = 0;
    switch (dtype) {
    case ALLOY_F32: memmove(dst, src, n * sizeof(float)); return;
    case ALLOY_F16: cvt_f16_store(src, d, n); return;
    case ALLOY_BF16:
        i = TRY_SIMD(bf16_store_simd, src, d, n);
        bf16_store(src + i, d + 2 * i, n - i);
        return;
    case ALLOY_F64: for (; i < n; i++) st_f64(d + 8 * i, (double)src[i]); return;
    case ALLOY_I32: for (; i < n; i++) st_i32(d + 4 * i, sat_i32(src[i])); return;
    case ALLOY_I64: for (; i < n; i++) st_i64(d + 8 * i, sat_i64(src[i])); return;
    case ALLOY_BOOL: for (; i < n; i++) d[i] = src[i] != 0.0f; return;
    default: al_assert_fail("valid dtype", __FILE__, __LINE__);
    }
}

void cvt_load_f64(alloy_dtype dtype, const void *src, double *dst, size_t n)
{
    if (n == 0) return; /* an empty tensor may have no buffer at all (NULL) */
    const unsigned char *s = src;
    size_t i = 0;
    switch (dtype) {
    case ALLOY_F32: for (; i < n; i++) dst[i] = ld_f32(s + 4 * i); return;
    case ALLOY_F16: for (; i < n; i++) dst[i] = bits_f32(cvt_f16_bits_to_f32(ld_u16(s + 2 * i))); return;
    case ALLOY_BF16: for (; i < n; i++) dst[i] = bits_f32(cvt_bf16_bits_to_f32(ld_u16(s + 2 * i))); return;
    case ALLOY_F64: memmove(dst, src, n * sizeof(double)); return;
    case ALLOY_I32: for (; i < n; i++) dst[i] = ld_i32(s + 4 * i); return;
    case ALLOY_I64: for (; i < n; i++) dst[i] = (double)ld_i64(s + 8 * i); return;
    case ALLOY_BOOL: for (; i < n; i++) dst[i] = s[i] ? 1.0 : 0.0; return;
    default: al_assert_fail("valid dtype", __FILE__, __LINE__);
    }
}

void cvt_store_f64(alloy_dtype dtype, const double *src, void *dst, size_t n)
{
    if (n == 0) return; /* an empty tensor may have no buffer at all (NULL) */
    unsigned char *d = dst;
    size_t i = 0;
    switch (dtype) {
    case ALLOY_F32: for (; i < n; i++) st_f32(d + 4 * i, (float)src[i]); return;
    case ALLOY_F16: for (; i < n; i++) st_u16(d + 2 * i, cvt_f64_to_f16(src[i])); return;
    case ALLOY_BF16: for (; i < n; i++) st_u16(d + 2 * i, cvt_f64_to_bf16(src[i])); return;
    case ALLOY_F64: memmove(dst, src, n * sizeof(double)); return;
    case ALLOY_I32: for (; i < n; i++) st_i32(d + 4 * i, sat_i32(src[i])); return;
    case ALLOY_I64: for (; i < n; i++) st_i64(d + 8 * i, sat_i64(src[i])); return;
    case ALLOY_BOOL: for (; i < n; i++) d[i] = src[i] != 0.0; return;
    default: al_assert_fail("valid dtype", __FILE__, __LINE__);
    }
}

void cvt_convert(alloy_dtype from, const void *src, alloy_dtype to, void *dst, size_t n)
{
    enum { CHUNK = 1024 };
    if (n == 0) return;
    if (from == to) {
        memcpy(dst, src, n * alloy_dtype_size(from));
        return;
    }
    /* f64 and integers go through f64 so that nothing rounds twice */
    bool wide = from == ALLOY_F64 || to == ALLOY_F64 || from == ALLOY_I32 || from == ALLOY_I64 || to == ALLOY_I32 ||
                to == ALLOY_I64;
    size_t from_es = alloy_dtype_size(from), to_es = alloy_dtype_size(to);
    union {
        float f[CHUNK];
        double d[CHUNK];
    } buf;
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t len = n - i < CHUNK ? n - i : CHUNK;
        const char *s = (const char *)src + i * from_es;
        char *d = (char *)dst + i * to_es;
        if (wide) {
            cvt_load_f64(from, s, buf.d, len);
            cvt_store_f64(to, buf.d, d, len);
        } else {
            cvt_load_f32(from, s, buf.f, len);
            cvt_store_f32(to, buf.f, d, len);
        }
    }
}
