/* gemm_lowp_x86.c - the AVX-512 and AVX2 micro-kernels of the f16/bf16 GEMM (vdpbf16ps, f32 FMA), compiled with target attributes and picked at run time. */
#include "runtime/cpu/gemm_lowp.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>

/* No -march anywhere: only these functions use the instructions, and only
 * after gemm_lowp_x86_has has asked the CPU. */
#define TARGET_F32 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,fma,avx512bf16")))
#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

/* The tile: 14 rows x 32 columns, 28 zmm accumulators, 2 zmm of B, and each
 * row's A value broadcast from memory into the multiply-add: 31 of the 32
 * registers, so nothing spills. Per k-unit, 28 vector multiply-adds against
 * 2 vector loads and 14 broadcasts: bound by the multiply-add ports. */
enum { MR = 14, NR = 32 };

/* Masks of the valid columns of the two 16-float halves of a tile row. */
static inline void col_masks(int nr, __mmask16 *m0, __mmask16 *m1)
{
    *m0 = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
    *m1 = (__mmask16)(nr >= 32 ? 0xffff : nr > 16 ? (1u << (nr - 16)) - 1 : 0);
}

/* Stores the accumulators of row i: c[i, 0..nr) = (add ? c : 0) + acc. */
#define STORE_ROW(i)                                                                               \
    if (i < mr) {                                                                                  \
        float *ci = c + (int64_t)(i) * ldc;                                                        \
        if (add) {                                                                                 \
            c##i##_0 = _mm512_add_ps(c##i##_0, _mm512_maskz_loadu_ps(m0, ci));                    \
            c##i##_1 = _mm512_add_ps(c##i##_1, _mm512_maskz_loadu_ps(m1, ci + 16));               \
        }                                                                                          \
        _mm512_mask_storeu_ps(ci, m0, c##i##_0);                                                   \
        _mm512_mask_storeu_ps(ci + 16, m1, c##i##_1);                                              \
    }

/* The A strip streams from L2 (the block's B strip sits in L1): fetched
 * this many elements ahead; the C tile fetched while the sums run. */
enum { A_AHEAD = MR * 16 };
#define PREFETCH_ROW(i)                                                                            \
    if (i < mr) {                                                                                  \
        _mm_prefetch((const char *)(c + (int64_t)(i) * ldc), _MM_HINT_T0);                         \
        _mm_prefetch((const char *)(c + (int64_t)(i) * ldc + 16), _MM_HINT_T0);                    \
    }

#define FOR_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define ZERO_ROW(i) __m512 c##i##_0 = _mm512_setzero_ps(), c##i##_1 = _mm512_setzero_ps();

/* bf16: each unit is a k pair; A holds MR 32-bit pairs, B NR of them, and
 * vdpbf16ps adds both products of a pair into the f32 accumulator. ROWS
 * and HALVES (constants where the shape's kernel is inlined) leave out the
 * rows past an edge tile's last and the second 16 columns: each sum that
 * is kept runs through the same multiply-adds in the same order. */
#define BF16_ROW(i)                                                                                \
    if (i < ROWS) {                                                                                \
        __m512bh ai = (__m512bh)_mm512_set1_epi32(ap[i]);                                          \
        c##i##_0 = _mm512_dpbf16_ps(c##i##_0, ai, b0);                                             \
        if (HALVES == 2) c##i##_1 = _mm512_dpbf16_ps(c##i##_1, ai, b1);                            \
    }
#define BF16_LOOP                                                                                  \
    for (int64_t p = 0; p < kunits; p++, ap += MR, bp += NR * 4) {                                 \
        _mm_prefetch((const char *)(ap + A_AHEAD), _MM_HINT_T0);                                   \
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp);                                            \
        __m512bh b1 = HALVES == 2 ? (__m512bh)_mm512_loadu_si512(bp + 64) : b0;                    \
        FOR_ROWS(BF16_ROW)                                                                         \
    }

/* op(A) read in place (k-contiguous bf16 rows): unit p of row i is the
 * pair at ar[i] + 2p, broadcast as one 32-bit word. */
static inline int32_t load32(const uint16_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
#define BF16_ROW_IN_PLACE(i)                                                                       \
    if (i < ROWS) {                                                                                \
        __m512bh ai = (__m512bh)_mm512_set1_epi32(load32(ar[i] + 2 * p));                          \
        c##i##_0 = _mm512_dpbf16_ps(c##i##_0, ai, b0);                                             \
        if (HALVES == 2) c##i##_1 = _mm512_dpbf16_ps(c##i##_1, ai, b1);                            \
    }
#define BF16_LOOP_IN_PLACE                                                                         \
    for (int64_t p = 0, pf = 0; p < kunits; p++, bp += NR * 4, pf = pf == ROWS - 1 ? 0 : pf + 1) { \
        _mm_prefetch((const char *)(ar[pf] + 2 * p + A_ROW_AHEAD), _MM_HINT_T0);                   \
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp);                                            \
        __m512bh b1 = HALVES == 2 ? (__m512bh)_mm512_loadu_si512(bp + 64) : b0;                    \
        FOR_ROWS(BF16_ROW_IN_PLACE)                                                                \
    }
/* Each row's next lines fetched ahead (one row a unit, in turn: a row
 * moves 4 bytes a unit, so every line is asked for before it is read). */
enum { A_ROW_AHEAD = 64 };
/* The rows of A in place: lda apart, those past mr on row 0 (read, never stored). */
#define A_ROWS                                                                                     \
    const uint16_t *ar[MR];                                                                        \
    for (int i = 0; i < MR; i++) ar[i] = (const uint16_t *)a + (i < mr ? i : 0) * lda;

/* The edge tiles' kernels: at most EDGE_ROWS rows, or 16 columns (the
 * attention's 64-row products: 4 x 14 + 8; a 76-wide head: 32 + 32 + 12). */
enum { EDGE_ROWS = 8 };

/* Calls name##_shape(ROWS, HALVES, args) with the smallest shape that
 * holds mr x nr. */
#define BY_SHAPE(name, ...)                                                                        \
    do {                                                                                           \
        if (mr <= EDGE_ROWS) {                                                                     \
            if (nr <= 16) name##_shape(EDGE_ROWS, 1, __VA_ARGS__);                                 \
            else name##_shape(EDGE_ROWS, 2, __VA_ARGS__);                                          \
        } else if (nr <= 16) {                                                                     \
            name##_shape(MR, 1, __VA_ARGS__);                                                      \
        } else {                                                                                   \
            name##_shape(MR, 2, __VA_ARGS__);                                                      \
        }                                                                                          \
    } while (0)

/* IN_PLACE: A read where it is (lda apart) instead of from a panel. */
TARGET_BF16 static inline __attribute__((always_inline)) void
tile_bf16_shape(const int ROWS, const int HALVES, const bool IN_PLACE, int64_t kunits, const void *a, int64_t lda,
                const void *b, float *c, int64_t ldc, int mr, int nr, bool add)
{
    const char *bp = b;
    FOR_ROWS(PREFETCH_ROW)
    FOR_ROWS(ZERO_ROW)
    if (IN_PLACE) {
        A_ROWS
        BF16_LOOP_IN_PLACE
    } else {
        const int32_t *ap = a;
        BF16_LOOP
    }
    __mmask16 m0, m1;
    col_masks(nr, &m0, &m1);
    FOR_ROWS(STORE_ROW)
}

TARGET_BF16 static void tile_bf16(int64_t kunits, const void *a, const void *b, float *c, int64_t ldc,
                                  int mr, int nr, bool add)
{
    BY_SHAPE(tile_bf16, false, kunits, a, 0, b, c, ldc, mr, nr, add);
}

/* lowp_kernel.tile_in_place */
TARGET_BF16 static void tile_bf16_in_place(int64_t kunits, const uint16_t *a, int64_t lda, const void *b, float *c,
                                           int64_t ldc, int mr, int nr, bool add)
{
    BY_SHAPE(tile_bf16, true, kunits, a, lda, b, c, ldc, mr, nr, add);
}

#define F32_ROW(i)                                                                                 \
    {                                                                                              \
        __m512 ai = _mm512_set1_ps(ap[i]);                                                         \
        c##i##_0 = _mm512_fmadd_ps(ai, b0, c##i##_0);                                              \
        c##i##_1 = _mm512_fmadd_ps(ai, b1, c##i##_1);                                              \
    }

TARGET_F32 static void tile_f32(int64_t kunits, const void *a, const void *b, float *c, int64_t ldc,
                                int mr, int nr, bool add)
{
    const float *ap = a, *bp = b;
    FOR_ROWS(PREFETCH_ROW)
    FOR_ROWS(ZERO_ROW)
    for (int64_t p = 0; p < kunits; p++, ap += MR, bp += NR) {
        _mm_prefetch((const char *)(ap + A_AHEAD), _MM_HINT_T0);
        __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
        FOR_ROWS(F32_ROW)
    }
    __mmask16 m0, m1;
    col_masks(nr, &m0, &m1);
    FOR_ROWS(STORE_ROW)
}

/* 16 f32 sums rounded to bf16 on their bits, as convert.h's
 * cvt_f32_bits_to_bf16 (nearest even, overflow to inf, a NaN keeps its sign
 * and payload top with the quiet bit set): integer operations, so neither
 * MXCSR nor vcvtneps2bf16's flushing of subnormals changes them. */
TARGET_F32 static inline __m256i round_bf16(__m512 v)
{
    __m512i x = _mm512_castps_si512(v), hi = _mm512_srli_epi32(x, 16);
    __m512i bias = _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, bias), 16);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* Row i of an f16 or bf16 C: (cin + acc, or acc) rounded by ROUND (16
 * f32 to 16 halves), the additions those of STORE_ROW; whole rows
 * unmasked (AMD's masked stores are slow). */
#define STORE_ROW_ROUNDED(i, ROUND)                                                                \
    if (i < mr) {                                                                                  \
        if (cin) {                                                                                 \
            const float *ci = cin + (int64_t)(i) * ldin;                                           \
            c##i##_0 = _mm512_add_ps(c##i##_0, _mm512_maskz_loadu_ps(m0, ci));                    \
            c##i##_1 = _mm512_add_ps(c##i##_1, _mm512_maskz_loadu_ps(m1, ci + 16));               \
        }                                                                                          \
        uint16_t *oi = out + (int64_t)(i) * ldo;                                                   \
        __m256i h0 = ROUND(c##i##_0), h1 = ROUND(c##i##_1);                                        \
        if (nr == NR) {                                                                            \
            _mm256_storeu_si256((void *)oi, h0);                                                   \
            _mm256_storeu_si256((void *)(oi + 16), h1);                                            \
        } else {                                                                                   \
            _mm256_mask_storeu_epi16(oi, m0, h0);                                                  \
            _mm256_mask_storeu_epi16(oi + 16, m1, h1);                                             \
        }                                                                                          \
    }
/* f16: to nearest even by vcvtps2ph (imm 0: whatever MXCSR says); bf16: round_bf16. */
#define ROUND_F16(v) _mm512_cvtps_ph((v), 0)
#define STORE_ROW_F16(i) STORE_ROW_ROUNDED(i, ROUND_F16)
#define STORE_ROW_BF16(i) STORE_ROW_ROUNDED(i, round_bf16)

/* The function `name`: tile_f32's sums, rounded into out by STORE (STORE_ROW_F16 or STORE_ROW_BF16). */
#define TILE_F32_ROUNDED(name, STORE)                                                              \
    TARGET_F32 static void name(int64_t kunits, const void *a, const void *b, const float *cin,    \
                                int64_t ldin, uint16_t *out, int64_t ldo, int mr, int nr)          \
    {                                                                                              \
        const float *ap = a, *bp = b;                                                              \
        FOR_ROWS(ZERO_ROW)                                                                         \
        for (int64_t p = 0; p < kunits; p++, ap += MR, bp += NR) {                                 \
            _mm_prefetch((const char *)(ap + A_AHEAD), _MM_HINT_T0);                               \
            __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);                        \
            FOR_ROWS(F32_ROW)                                                                      \
        }                                                                                          \
        __mmask16 m0, m1;                                                                          \
        col_masks(nr, &m0, &m1);                                                                   \
        FOR_ROWS(STORE)                                                                            \
    }

/* An f16 C (lowp_kernel.tile_f16). */
TILE_F32_ROUNDED(tile_f32_to_f16, STORE_ROW_F16)
/* A bf16 C from the avx512 kernel on bf16 operands (lowp_kernel.tile_bf16). */
TILE_F32_ROUNDED(tile_f32_to_bf16, STORE_ROW_BF16)

/* 32 f32 sums (lo's 16, then hi's) rounded to bf16 as round_bf16 does:
 * vcvtne2ps2bf16 rounds to nearest even, overflows to inf and quiets a
 * NaN as cvt_f32_bits_to_bf16 does, but takes a subnormal for zero: a
 * tile row with one goes through round_bf16 instead. */
TARGET_BF16 static inline __m512i round2_bf16(__m512 lo, __m512 hi)
{
    __m512i xl = _mm512_castps_si512(lo), xh = _mm512_castps_si512(hi);
    __m512i mag = _mm512_set1_epi32(0x7fffffff), expo = _mm512_set1_epi32(0x7f800000);
    __mmask16 sl = _mm512_mask_testn_epi32_mask(_mm512_test_epi32_mask(xl, mag), xl, expo);
    __mmask16 sh = _mm512_mask_testn_epi32_mask(_mm512_test_epi32_mask(xh, mag), xh, expo);
    if (__builtin_expect((sl | sh) != 0, 0))
        return _mm512_inserti64x4(_mm512_castsi256_si512(round_bf16(lo)), round_bf16(hi), 1);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* Row i of a bf16 C by round2_bf16: one store of the row's 32 halves. */
#define STORE_ROW_BF16_NE(i)                                                                       \
    if (i < mr) {                                                                                  \
        if (cin) {                                                                                 \
            const float *ci = cin + (int64_t)(i) * ldin;                                           \
            c##i##_0 = _mm512_add_ps(c##i##_0, _mm512_maskz_loadu_ps(m0, ci));                    \
            if (HALVES == 2) c##i##_1 = _mm512_add_ps(c##i##_1, _mm512_maskz_loadu_ps(m1, ci + 16)); \
        }                                                                                          \
        uint16_t *oi = out + (int64_t)(i) * ldo;                                                   \
        __m512i h = round2_bf16(c##i##_0, c##i##_1);                                               \
        if (nr == NR) _mm512_storeu_si512(oi, h);                                                  \
        else _mm512_mask_storeu_epi16(oi, m01, h);                                                 \
    }

/* tile_bf16's sums, rounded to bf16 into out (lowp_kernel.tile_bf16). */
TARGET_BF16 static inline __attribute__((always_inline)) void
tile_bf16_to_bf16_shape(const int ROWS, const int HALVES, const bool IN_PLACE, int64_t kunits, const void *a,
                        int64_t lda, const void *b, const float *cin, int64_t ldin, uint16_t *out, int64_t ldo,
                        int mr, int nr)
{
    const char *bp = b;
    FOR_ROWS(ZERO_ROW)
    if (IN_PLACE) {
        A_ROWS
        BF16_LOOP_IN_PLACE
    } else {
        const int32_t *ap = a;
        BF16_LOOP
    }
    __mmask16 m0, m1;
    col_masks(nr, &m0, &m1);
    __mmask32 m01 = (__mmask32)m0 | (__mmask32)m1 << 16;
    FOR_ROWS(STORE_ROW_BF16_NE)
}

TARGET_BF16 static void tile_bf16_to_bf16(int64_t kunits, const void *a, const void *b, const float *cin,
                                          int64_t ldin, uint16_t *out, int64_t ldo, int mr, int nr)
{
    BY_SHAPE(tile_bf16_to_bf16, false, kunits, a, 0, b, cin, ldin, out, ldo, mr, nr);
}

/* lowp_kernel.tile_bf16_in_place */
TARGET_BF16 static void tile_bf16_to_bf16_in_place(int64_t kunits, const uint16_t *a, int64_t lda, const void *b,
                                                   const float *cin, int64_t ldin, uint16_t *out, int64_t ldo, int mr,
                                                   int nr)
{
    BY_SHAPE(tile_bf16_to_bf16, true, kunits, a, lda, b, cin, ldin, out, ldo, mr, nr);
}

/* ---- packing: 16 x 16 transposes of 32-bit words for k-contiguous rows,
 * interleaves and conversions for r-contiguous ones ---- */

/* r[i] (row i of a 16 x 16 block of 32-bit words) becomes column i. */
TARGET_F32 static inline void transpose16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) {
        r[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int j = 0; j < 4; j++) { /* 128-bit lanes: 0x88 takes lanes 0 and 2 of each, 0xdd 1 and 3 */
        t[j] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);
        t[4 + j] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);
        t[8 + j] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
        t[12 + j] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
        r[4 + j] = _mm512_shuffle_i32x4(t[4 + j], t[12 + j], 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
        r[12 + j] = _mm512_shuffle_i32x4(t[4 + j], t[12 + j], 0xdd);
    }
}

static inline int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }
static inline __mmask16 first16(int64_t n) { return (__mmask16)(n >= 16 ? 0xffff : n > 0 ? (1u << n) - 1 : 0); }
static inline __mmask32 first32(int64_t n) { return n >= 32 ? 0xffffffffu : n > 0 ? (1u << n) - 1 : 0; }

/* 16 f16 or bf16 at p as 16 f32 (their bits). */
TARGET_F32 static inline __m512i load16_f32(alloy_dtype dt, const uint16_t *p)
{
    __m256i h = _mm256_loadu_si256((const void *)p);
    return dt == ALLOY_F16 ? _mm512_castps_si512(_mm512_cvtph_ps(h))
                           : _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}

/* Rows k-contiguous: blocks of 16 units (words: bf16 pairs, or f32) of 16
 * rows at a time, transposed, from u0 (a multiple of 16); returns where it
 * stopped (before a block that is not whole inside k or u1). */
TARGET_F32 static int64_t pack_by_rows(const strip_src *s, int R, bool pairs, int64_t u0, int64_t u1, uint32_t *d)
{
    int64_t blocks = min_i64(s->k / (pairs ? 32 : 16), u1 / 16);
    if (u0 % 16) return u0;
    for (int64_t bl = u0 / 16; bl < blocks; bl++)
        for (int r0 = 0; r0 < R; r0 += 16) {
            __m512i v[16];
            for (int i = 0; i < 16; i++) {
                const uint16_t *src = s->base + (r0 + i) * s->rs + bl * (pairs ? 32 : 16);
                v[i] = r0 + i >= s->rows ? _mm512_setzero_si512()
                       : pairs           ? _mm512_loadu_si512(src)
                                         : load16_f32(s->dt, src);
            }
            transpose16(v);
            /* whole stores, q ascending: where R - r0 < 16 each writes into
             * the next unit's start, which the next one rewrites (and the
             * last, the strip's slack); AMD's masked stores are slow */
            for (int q = 0; q < 16; q++) _mm512_storeu_si512(d + (bl * 16 + q) * R + r0, v[q]);
        }
    return blocks * 16 > u0 ? blocks * 16 : u0;
}

/* bf16 pairs: A of a product that is not transposed and B of one that is
 * have k-contiguous rows; the others two k-rows per unit, interleaved. */
TARGET_F32 static int64_t pack_pairs_x86(const strip_src *s, int R, int64_t u0, int64_t u1, void *dst)
{
    uint32_t *d = dst;
    if (s->ks == 1) return pack_by_rows(s, R, true, u0, u1, d);
    /* word j of the result: u16 j of the first row, then of the second */
    __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5,
                                  36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t p = u0; p < u1; p++)
        for (int r0 = 0; r0 < R; r0 += 32) {
            /* whole loads where the row goes on (a full strip: what is past
             * it lands in words the stores below leave to the next unit) */
            bool whole = s->readable - r0 >= 32;
            __mmask32 lm = first32(s->rows - r0);
            const uint16_t *k0 = s->base + 2 * p * s->ks + r0, *k1 = k0 + s->ks;
            if (s->readable - r0 >= 96) { /* the two rows go on past this strip: their next lines */
                _mm_prefetch((const char *)(k0 + 64), _MM_HINT_T0);
                _mm_prefetch((const char *)(k1 + 64), _MM_HINT_T0);
            }
            __m512i x0 = 2 * p >= s->k ? _mm512_setzero_si512()
                         : whole       ? _mm512_loadu_si512(k0)
                                       : _mm512_maskz_loadu_epi16(lm, k0);
            __m512i x1 = 2 * p + 1 >= s->k ? _mm512_setzero_si512()
                         : whole           ? _mm512_loadu_si512(k1)
                                           : _mm512_maskz_loadu_epi16(lm, k1);
            uint32_t *o = d + p * R + r0; /* whole stores, as in pack_by_rows */
            _mm512_storeu_si512(o, _mm512_permutex2var_epi16(x0, lo, x1));
            if (R - r0 > 16) _mm512_storeu_si512(o + 16, _mm512_permutex2var_epi16(x0, hi, x1));
        }
    return u1;
}

/* f32 panels from f16 (F16C's vcvtph2ps) or bf16 (a shift). */
TARGET_F32 static int64_t pack_f32_x86(const strip_src *s, int R, int64_t u0, int64_t u1, void *dst)
{
    uint32_t *d = dst;
    if (s->ks == 1) return pack_by_rows(s, R, false, u0, u1, d);
    for (int64_t p = u0; p < u1; p++)
        for (int r0 = 0; r0 < R; r0 += 16) {
            const uint16_t *src = s->base + p * s->ks + r0;
            __m256i h = s->readable - r0 >= 16 ? _mm256_loadu_si256((const void *)src)
                                               : _mm256_maskz_loadu_epi16(first16(s->rows - r0), src);
            __m512i v = s->dt == ALLOY_F16 ? _mm512_castps_si512(_mm512_cvtph_ps(h))
                                           : _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
            _mm512_storeu_si512(d + p * R + r0, v); /* whole stores, as in pack_by_rows */
        }
    return u1;
}

/* ---- AVX2: the same f32 panels for CPUs without AVX-512 ---- */

/* The tile: 6 rows x 16 columns, 12 ymm accumulators, 2 ymm of B and one
 * broadcast of A: 15 of the 16 registers. */
enum { MR2 = 6, NR2 = 16 };

#define ZERO_ROW2(i) __m256 d##i##_0 = _mm256_setzero_ps(), d##i##_1 = _mm256_setzero_ps();
#define F32_ROW2(i)                                                                                \
    {                                                                                              \
        __m256 ai = _mm256_broadcast_ss(ap + (i));                                                 \
        d##i##_0 = _mm256_fmadd_ps(ai, b0, d##i##_0);                                              \
        d##i##_1 = _mm256_fmadd_ps(ai, b1, d##i##_1);                                              \
    }
/* A whole row of 16 (c + acc, or acc), or the row's sums to t for the
 * valid part to be written after. */
#define STORE_ROW2(i)                                                                              \
    if (nr == NR2) {                                                                               \
        if (i < mr) {                                                                              \
            float *ci = c + (int64_t)(i) * ldc;                                                    \
            if (add) {                                                                             \
                d##i##_0 = _mm256_add_ps(d##i##_0, _mm256_loadu_ps(ci));                           \
                d##i##_1 = _mm256_add_ps(d##i##_1, _mm256_loadu_ps(ci + 8));                       \
            }                                                                                      \
            _mm256_storeu_ps(ci, d##i##_0);                                                        \
            _mm256_storeu_ps(ci + 8, d##i##_1);                                                    \
        }                                                                                          \
    } else {                                                                                       \
        _mm256_storeu_ps(t[i], d##i##_0);                                                          \
        _mm256_storeu_ps(t[i] + 8, d##i##_1);                                                      \
    }
#define FOR_ROWS2(X) X(0) X(1) X(2) X(3) X(4) X(5)

TARGET_AVX2 static void tile_avx2(int64_t kunits, const void *a, const void *b, float *c, int64_t ldc, int mr,
                                  int nr, bool add)
{
    const float *ap = a, *bp = b;
    FOR_ROWS2(ZERO_ROW2)
    for (int64_t p = 0; p < kunits; p++, ap += MR2, bp += NR2) {
        __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
        FOR_ROWS2(F32_ROW2)
    }
    float t[MR2][NR2];
    FOR_ROWS2(STORE_ROW2)
    if (nr < NR2) /* c + acc, as the vector rows add */
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) c[i * ldc + j] = add ? t[i][j] + c[i * ldc + j] : t[i][j];
}

/* 8 f16 (F16C's vcvtph2ps) or bf16 (a shift) as 8 f32. */
TARGET_AVX2 static inline __m256 cvt8_avx2(alloy_dtype dt, __m128i h)
{
    return dt == ALLOY_F16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* k-contiguous strips: 8 rows x 8 k at a time, each row's 8 converted and
 * the 8 x 8 block transposed in registers, so each k's rows are one store
 * (6 lanes of it for A's 6-row strips, R = 6 or 16); rows past the matrix
 * are zero.
 * Returns the first unit not packed (the last u1 - u0 mod 8 go to the
 * driver's packing). */
TARGET_AVX2 static int64_t pack_k_rows_avx2(const strip_src *s, int R, int64_t u0, int64_t u1, float *d)
{
    int64_t p = u0;
    for (; p + 8 <= u1; p += 8)
        for (int r0 = 0; r0 < R; r0 += 8) {
            __m256 v[8];
            for (int i = 0; i < 8; i++)
                v[i] = r0 + i < s->rows && r0 + i < R
                           ? cvt8_avx2(s->dt, _mm_loadu_si128((const void *)(s->base + (r0 + i) * s->rs + p)))
                           : _mm256_setzero_ps();
            __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
            __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
            __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
            __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
            __m256 q0 = _mm256_shuffle_ps(t0, t2, 0x44), q1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            __m256 q2 = _mm256_shuffle_ps(t1, t3, 0x44), q3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            __m256 q4 = _mm256_shuffle_ps(t4, t6, 0x44), q5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            __m256 q6 = _mm256_shuffle_ps(t5, t7, 0x44), q7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            __m256 col[8] = {_mm256_permute2f128_ps(q0, q4, 0x20), _mm256_permute2f128_ps(q1, q5, 0x20),
                             _mm256_permute2f128_ps(q2, q6, 0x20), _mm256_permute2f128_ps(q3, q7, 0x20),
                             _mm256_permute2f128_ps(q0, q4, 0x31), _mm256_permute2f128_ps(q1, q5, 0x31),
                             _mm256_permute2f128_ps(q2, q6, 0x31), _mm256_permute2f128_ps(q3, q7, 0x31)};
            float *o = d + p * R + r0; /* col[j]: rows r0.. at k p + j */
            if (R - r0 >= 8) {
                for (int j = 0; j < 8; j++) _mm256_storeu_ps(o + j * R, col[j]);
            } else { /* A's 6-row strips: each k's 8 lanes in order, the next k overwriting the 2 past its 6 (a
                      * masked store is microcoded on some CPUs), the last k's 6 alone */
                for (int j = 0; j < 7; j++) _mm256_storeu_ps(o + j * 6, col[j]);
                _mm_storeu_ps(o + 42, _mm256_castps256_ps128(col[7]));
                _mm_storel_pi((__m64 *)(void *)(o + 46), _mm256_extractf128_ps(col[7], 1));
            }
        }
    return p;
}

/* f32 panels: r-contiguous strips 8 rows at a time, k-contiguous ones 8 x 8
 * through registers (pack_k_rows_avx2). */
TARGET_AVX2 static int64_t pack_f32_avx2(const strip_src *s, int R, int64_t u0, int64_t u1, void *dst)
{
    float *d = dst;
    if (s->ks == 1) return pack_k_rows_avx2(s, R, u0, u1, d);
    for (int64_t p = u0; p < u1; p++)
        for (int r0 = 0; r0 < R; r0 += 8) {
            const uint16_t *src = s->base + p * s->ks + r0;
            __m128i h;
            if (s->readable - r0 >= 8) {
                h = _mm_loadu_si128((const void *)src);
            } else { /* the matrix ends inside these 8: zeros past it */
                uint16_t part[8] = {0};
                for (int64_t r = 0; r < s->rows - r0; r++) part[r] = src[r];
                h = _mm_loadu_si128((const void *)part);
            }
            _mm256_storeu_ps(d + p * R + r0, cvt8_avx2(s->dt, h)); /* whole stores, as in pack_by_rows */
        }
    return u1;
}

/* kc: the B strip of a block (kc x NR: 16 KiB of bf16, 24 KiB of f32)
 * stays in L1 while the A strips of the block stream past it. */
static const lowp_kernel k_bf16 = {MR, NR, 2, 2, 256, tile_bf16, pack_pairs_x86, NULL, tile_bf16_to_bf16,
                                   tile_bf16_in_place, tile_bf16_to_bf16_in_place};
static const lowp_kernel k_f32 = {MR, NR, 1, 4, 192, tile_f32, pack_f32_x86, tile_f32_to_f16, tile_f32_to_bf16,
                                  NULL, NULL};
/* The same kc as k_f32: each sum runs through the same k blocks in the
 * same order, so the two give the same bits (12 KiB of B in L1). */
static const lowp_kernel k_avx2 = {MR2, NR2, 1, 4, 192, tile_avx2, pack_f32_avx2, NULL, NULL, NULL, NULL};

const lowp_kernel *gemm_lowp_x86_kernel(opt_lowp_gemm k)
{
    return k == OPT_LOWP_AVX512_BF16 ? &k_bf16 : k == OPT_LOWP_AVX512 ? &k_f32 : k == OPT_LOWP_AVX2 ? &k_avx2 : NULL;
}

/* Bit 0: AVX-512 F+BW+VL (the OS saving zmm state), 1: AVX512_BF16, 2:
 * F16C, 3: AVX2 and FMA (the OS saving ymm state); -1 until read. */
static atomic_int features = -1;

static int read_features(void)
{
    int f = atomic_load_explicit(&features, memory_order_relaxed);
    if (f >= 0) return f;
    __builtin_cpu_init();
    f = 0;
    /* the builtin checks XCR0 too: an OS that does not save zmm state says no */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma"))
        f |= 1;
    unsigned a, b, c, d;
    if ((f & 1) && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5))) f |= 2; /* AVX512_BF16 */
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C)) f |= 4;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) f |= 8;
    atomic_store_explicit(&features, f, memory_order_relaxed);
    return f;
}

bool gemm_lowp_x86_has(opt_lowp_gemm k, alloy_dtype dt)
{
    int f = read_features();
    if (k == OPT_LOWP_AVX512_BF16) return dt == ALLOY_BF16 && (f & 3) == 3;
    if (k == OPT_LOWP_AVX512) return (f & 1) && (dt == ALLOY_BF16 || (f & 4));
    if (k == OPT_LOWP_AVX2) return (f & 8) && (f & 4); /* F16C: the kernel is compiled for it */
    return false;
}

#else

const lowp_kernel *gemm_lowp_x86_kernel(opt_lowp_gemm k)
{
    (void)k;
    return NULL;
}

bool gemm_lowp_x86_has(opt_lowp_gemm k, alloy_dtype dt)
{
    (void)k, (void)dt;
    return false;
}

#endif
