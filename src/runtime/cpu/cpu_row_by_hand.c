/* cpu_row_by_hand.c - f32 row functions written out by hand in place of the generated ones (softmax, softmax_grad, cross_entropy and its gradient; the table of them with layer_norm's, cpu_row_layer_norm.c), the same bits with fewer passes over the row. */
/* No trapping math here (as in cpu_row_programs.c): these functions' loops,
 * exp included (base/vmath.h), then vectorize on every ISA level, and
 * cpu_rows.h's inline pieces compile with the options they have there. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <string.h>
#include <tgmath.h>
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h> /* softmax's largest by 32-byte lanes (max_of_f32_lanes8) */
#endif

#include "base/vmath_generic.h" /* float exp/erf/tanh as every f32 evaluation of ops.def computes them */
#include "runtime/cpu/cpu_row_leaf8.h"
#include "runtime/cpu/cpu_rows.h"
#include "runtime/cpu/cpu_softmax_exp.h"

/* cpu_leaf_sums_float over the terms p[i] * q[i] (each product rounded to
 * float, then added in order): a SUM of a product without its terms
 * stored, the same bits. */
static CPU_VECTOR_CLONES void leaf_sums_products_f32(const float *p, const float *q, const int64_t *leaf, int nleaves,
                                                     float *out)
{
    int64_t at = 0;
    for (int l = 0; l < nleaves;) {
        int64_t len = leaf[l];
        int m = 1;
        while (l + m < nleaves && leaf[l + m] == len) m++;
        float *o = out + l;
        const float *bp = p + at, *bq = q + at;
        int k0 = len == LEAF ? LEAF_GROUPS_PRODUCTS(bp, bq, m, o) : 0;
        for (; k0 + 4 <= m; k0 += 4) { /* 4 leaves side by side */
            float acc[4] = {0};
            for (int64_t j = 0; j < len; j++)
                for (int k = 0; k < 4; k++) acc[k] += bp[(k0 + k) * len + j] * bq[(k0 + k) * len + j];
            for (int k = 0; k < 4; k++) o[k0 + k] = acc[k];
        }
        for (int k = k0; k < m; k++) {
            float a = 0;
            for (int64_t j = 0; j < len; j++) a += bp[(int64_t)k * len + j] * bq[(int64_t)k * len + j];
            o[k] = a;
        }
        at += (int64_t)m * len;
        l += m;
    }
}

#if defined(LEAF8)
#define SHUF8(a, b, ...) __builtin_shuffle(a, b, (v8i){__VA_ARGS__})
/* acc (lane l: leaf l of 8) += t[0..8) in order, where t[k] holds 8 terms
 * of leaf k in order: the 8 x 8 transpose of leaf8_sums2_f32 (unpacks,
 * shufps, 128-bit halves), then one term of every leaf per addition. */
__attribute__((target("avx2,fma"), always_inline)) static inline v8f add8_transposed(v8f acc, const v8f t[8])
{
    v8f t0 = SHUF8(t[0], t[1], 0, 8, 1, 9, 4, 12, 5, 13), t1 = SHUF8(t[0], t[1], 2, 10, 3, 11, 6, 14, 7, 15);
    v8f t2 = SHUF8(t[2], t[3], 0, 8, 1, 9, 4, 12, 5, 13), t3 = SHUF8(t[2], t[3], 2, 10, 3, 11, 6, 14, 7, 15);
    v8f t4 = SHUF8(t[4], t[5], 0, 8, 1, 9, 4, 12, 5, 13), t5 = SHUF8(t[4], t[5], 2, 10, 3, 11, 6, 14, 7, 15);
    v8f t6 = SHUF8(t[6], t[7], 0, 8, 1, 9, 4, 12, 5, 13), t7 = SHUF8(t[6], t[7], 2, 10, 3, 11, 6, 14, 7, 15);
    v8f u0 = SHUF8(t0, t2, 0, 1, 8, 9, 4, 5, 12, 13), u1 = SHUF8(t0, t2, 2, 3, 10, 11, 6, 7, 14, 15);
    v8f u2 = SHUF8(t1, t3, 0, 1, 8, 9, 4, 5, 12, 13), u3 = SHUF8(t1, t3, 2, 3, 10, 11, 6, 7, 14, 15);
    v8f u4 = SHUF8(t4, t6, 0, 1, 8, 9, 4, 5, 12, 13), u5 = SHUF8(t4, t6, 2, 3, 10, 11, 6, 7, 14, 15);
    v8f u6 = SHUF8(t5, t7, 0, 1, 8, 9, 4, 5, 12, 13), u7 = SHUF8(t5, t7, 2, 3, 10, 11, 6, 7, 14, 15);
    acc += SHUF8(u0, u4, 0, 1, 2, 3, 8, 9, 10, 11);
    acc += SHUF8(u1, u5, 0, 1, 2, 3, 8, 9, 10, 11);
    acc += SHUF8(u2, u6, 0, 1, 2, 3, 8, 9, 10, 11);
    acc += SHUF8(u3, u7, 0, 1, 2, 3, 8, 9, 10, 11);
    acc += SHUF8(u0, u4, 4, 5, 6, 7, 12, 13, 14, 15);
    acc += SHUF8(u1, u5, 4, 5, 6, 7, 12, 13, 14, 15);
    acc += SHUF8(u2, u6, 4, 5, 6, 7, 12, 13, 14, 15);
    acc += SHUF8(u3, u7, 4, 5, 6, 7, 12, 13, 14, 15);
    return acc;
}
#undef SHUF8

/* acc (lane l: leaf l of the 8 leaves of LEAF terms at p) += their terms
 * j..j+7, or with q the products p[i] * q[i] of those terms, each rounded
 * to float before it is added, as a stored term is */
__attribute__((target("avx2,fma"), always_inline)) static inline v8f add8_terms_of(v8f acc, const float *p,
                                                                                    const float *q, int j)
{
    v8f t[8];
    for (int k = 0; k < 8; k++) {
        v8f a, b;
        memcpy(&a, p + k * LEAF + j, sizeof a);
        if (q) memcpy(&b, q + k * LEAF + j, sizeof b), a = a * b;
        t[k] = a;
    }
    return add8_transposed(acc, t);
}

/* o[0..m): the sums of the m leaves of LEAF terms at p, or of the products
 * p[i] * q[i] (q not NULL), m a multiple of 8: 8 leaves side by side in a
 * 32-byte vector, each leaf in order from 0: the same bits as
 * cpu_leaf_sums_float and leaf_sums_products_f32, with 3 shuffles of 8
 * terms where their 4 x 4 transposes take 2 of 4. One chain of 8 leaves
 * at a time, each group's independent of the last (two side by side, as
 * leaf8_sums2_f32, ran 5-10% slower: more registers live than AVX2 has). */
__attribute__((target("avx2,fma"), always_inline)) static inline void leaf8_sums_of(const float *p, const float *q,
                                                                                     int m, float *o)
{
    for (int k = 0; k + 8 <= m; k += 8) {
        v8f s0 = {0};
        for (int j = 0; j < LEAF; j += 8) s0 = add8_terms_of(s0, p + (int64_t)k * LEAF, q ? q + (int64_t)k * LEAF : NULL, j);
        memcpy(o + k, &s0, sizeof s0);
    }
}

/* leaf8_sums_of for softmax's sum and softmax_grad's: only where the CPU
 * has x86-64-v3 (wide_leaves), as leaf8_sums2_f32. */
__attribute__((target("avx2,fma"))) static void leaf8_sums_f32(const float *t, int m, float *o)
{
    leaf8_sums_of(t, NULL, m, o);
}

__attribute__((target("avx2,fma"))) static void leaf8_product_sums_f32(const float *p, const float *q, int m, float *o)
{
    leaf8_sums_of(p, q, m, o);
}

/* v's lanes added as tree_f32 adds runs of w of them (w = 1, 2, 4 or 8):
 * each run's sum in its first lane, its leftmost leaf on the left of every
 * addition, as tree_f32 (v[0] + v[1], ...) */
__attribute__((target("avx2,fma"), always_inline)) static inline v8f tree8_lanes(v8f v, int w)
{
    if (w >= 2) v = v + __builtin_shuffle(v, (v8i){1, 0, 3, 2, 5, 4, 7, 6});
    if (w >= 4) v = v + __builtin_shuffle(v, (v8i){2, 3, 0, 1, 6, 7, 4, 5});
    if (w >= 8) v = v + __builtin_shuffle(v, (v8i){4, 5, 6, 7, 0, 1, 2, 3});
    return v;
}

static float softmax_grad_live_sum(const row_args *r, int b);

/* softmax_grad's whole rows of a complete tree of w or more leaves of LEAF
 * (w = 1, 2, 4: rows of exactly w; 8: of 8 or more): the leaf sums of
 * y dy 8 leaves at a time (add8_transposed), each group's rows' trees in
 * registers (tree8_lanes: a row's sum straight to the output loop, no
 * store and reload of its leaf sums), a longer row's sums of 8 leaves
 * combined by tree_f32; then the output y (dy - s) of every row of the
 * call in 32-byte vectors, each 64 bytes' first half stored first (GCC
 * stored the second first, slower on AVX2). `causal`: short causal rows
 * whole, a row whose sum is not finite added again over its live columns
 * (softmax_grad_live_sum), +0 stored past them. Each leaf in order from 0,
 * each row's tree as levels_f32: the same bits. Only where
 * softmax_grad_rows8 takes the call. */
__attribute__((target("avx2,fma"), always_inline)) static inline void softmax_grad_rows8_body(const row_args *r, int w, bool causal)
{
    const int64_t n = r->n;
    const int nl = r->nleaves, nb = r->nb;
    const float *y = r->x[0], *dy = r->x[1];
    float *out = r->y, s[ROW_BATCH], *groups = r->tmp; /* a long row's sums of 8 leaves */
    float left = 0;                                     /* a row of 16 leaves: its first 8's sum */
    for (int g = 0; g < nl * nb / 8; g++) { /* leaves 8g..8g+7 */
        const float *py = y + (int64_t)g * 8 * LEAF, *pdy = dy + (int64_t)g * 8 * LEAF;
        v8f acc = {0};
        for (int j = 0; j < LEAF; j += 8) {
            v8f t[8];
            for (int k = 0; k < 8; k++) {
                v8f a, d;
                memcpy(&a, py + k * LEAF + j, sizeof a);
                memcpy(&d, pdy + k * LEAF + j, sizeof d);
                t[k] = a * d;
            }
            acc = add8_transposed(acc, t);
        }
        acc = tree8_lanes(acc, w);
        if (w < 8)
            for (int b = 0; b < 8 / w; b++) s[g * 8 / w + b] = acc[b * w];
        else if (nl == 8) s[g] = acc[0];
        else if (nl == 16 && g % 2 == 0) left = acc[0];
        else if (nl == 16) s[g / 2] = left + acc[0];
        else groups[g] = acc[0];
    }
    for (int b = 0; w == 8 && nl > 16 && b < nb; b++) s[b] = tree_f32(groups + b * nl / 8, nl / 8);
    for (int b = 0; causal && b < nb; b++)
        if (!isfinite(s[b])) s[b] = softmax_grad_live_sum(r, b);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int b = 0; b < nb; b++) {
        const __m256 sv = _mm256_set1_ps(s[b]);
        const int64_t row = (int64_t)b * n;
        for (int64_t c = row; c < row + n; c += 16) {
            __m256 lo = _mm256_mul_ps(_mm256_loadu_ps(y + c), _mm256_sub_ps(_mm256_loadu_ps(dy + c), sv));
            __m256 hi = _mm256_mul_ps(_mm256_loadu_ps(y + c + 8), _mm256_sub_ps(_mm256_loadu_ps(dy + c + 8), sv));
            if (causal) { /* +0 past the live columns */
                const __m256i live = _mm256_set1_epi32((int32_t)(r->live[b] - (c - row))); /* from c on */
                lo = _mm256_and_ps(lo, _mm256_castsi256_ps(_mm256_cmpgt_epi32(live, lane)));
                hi = _mm256_and_ps(hi, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_sub_epi32(live, _mm256_set1_epi32(8)), lane)));
            }
            _mm256_storeu_ps(out + c, lo);
            __asm__ volatile("" ::: "memory"); /* the first half first */
            _mm256_storeu_ps(out + c + 8, hi);
        }
    }
}
/* softmax_grad_rows8_body with w as a constant. In AVX2 registers on
 * x86-64-v4 too: its 32 registers and 64-byte stores gained nothing here
 * (bench/row_isa). */
__attribute__((target("avx2,fma"))) static void softmax_grad_rows8_avx2(const row_args *r)
{
    switch (r->nleaves * (r->causal ? -1 : 1)) {
    case 1: softmax_grad_rows8_body(r, 1, false); break;
    case 2: softmax_grad_rows8_body(r, 2, false); break;
    case 4: softmax_grad_rows8_body(r, 4, false); break;
    case -1: softmax_grad_rows8_body(r, 1, true); break;
    case -2: softmax_grad_rows8_body(r, 2, true); break;
    case -4: softmax_grad_rows8_body(r, 4, true); break;
    default:
        if (r->causal) softmax_grad_rows8_body(r, 8, true);
        else softmax_grad_rows8_body(r, 8, false);
    }
}

/* The largest of v[0..n) as max_of_f32 finds it, by 32-byte lanes (4
 * vectors of 8, then one pair for 16 more, then where fewer than 16 are
 * left one pair for the last 16, some seen again, which changes neither
 * the largest nor whether a NaN was seen: half of max_of_f32's 16-byte
 * instructions, and no scalar remainder in a row of 76): lanes keep
 * x > l ? x : l and count NaNs, then MAX_TAIL
 * combines them and takes the in-order loop where a NaN or a largest of 0
 * makes the lanes' answer differ from it. Any other largest value is one
 * value with one sign, whichever lanes saw it: the same bits. Only where
 * the CPU has x86-64-v3 (wide_leaves). */
__attribute__((target("avx2,fma"))) static float max_of_f32_lanes8(const float *v, int64_t n)
{
    __m256 l0 = _mm256_set1_ps(-INFINITY), l1 = l0, l2 = l0, l3 = l0, nans = _mm256_setzero_ps();
    int64_t i_ = 0;
    for (; i_ + 32 <= n; i_ += 32) {
        __m256 x0 = _mm256_loadu_ps(v + i_), x1 = _mm256_loadu_ps(v + i_ + 8), x2 = _mm256_loadu_ps(v + i_ + 16),
               x3 = _mm256_loadu_ps(v + i_ + 24);
        l0 = _mm256_max_ps(x0, l0), l1 = _mm256_max_ps(x1, l1), l2 = _mm256_max_ps(x2, l2), l3 = _mm256_max_ps(x3, l3);
        nans = _mm256_or_ps(nans, _mm256_or_ps(_mm256_cmp_ps(x0, x1, _CMP_UNORD_Q), _mm256_cmp_ps(x2, x3, _CMP_UNORD_Q)));
    }
    if (i_ + 16 <= n) {
        __m256 x0 = _mm256_loadu_ps(v + i_), x1 = _mm256_loadu_ps(v + i_ + 8);
        l0 = _mm256_max_ps(x0, l0), l1 = _mm256_max_ps(x1, l1);
        nans = _mm256_or_ps(nans, _mm256_cmp_ps(x0, x1, _CMP_UNORD_Q));
        i_ += 16;
    }
    if (i_ < n && n >= 16) { /* the last 16, some seen already: a largest and a NaN count the same */
        __m256 x0 = _mm256_loadu_ps(v + n - 16), x1 = _mm256_loadu_ps(v + n - 8);
        l0 = _mm256_max_ps(x0, l0), l1 = _mm256_max_ps(x1, l1);
        nans = _mm256_or_ps(nans, _mm256_cmp_ps(x0, x1, _CMP_UNORD_Q));
        i_ = n;
    }
    __m256 l = _mm256_max_ps(_mm256_max_ps(l0, l1), _mm256_max_ps(l2, l3)); /* lanes without NaNs: any order */
    float lanes[8];
    _mm256_storeu_ps(lanes, l);
    float m_ = -INFINITY;
    int64_t nan = _mm256_movemask_ps(nans) != 0;
    for (int q_ = 0; q_ < 8; q_++) m_ = lanes[q_] > m_ ? lanes[q_] : m_;
    MAX_TAIL(float)
}

/* max_of_f32_lanes8 of each of the nb rows of n at x (n apart) into m[b] */
__attribute__((target("avx2,fma"))) static void max_rows_f32_lanes8(const float *x, int64_t n, int nb, float *m)
{
    for (int b = 0; b < nb; b++) m[b] = max_of_f32_lanes8(x + b * n, n);
}

/* v[i] = cpu_softmax_exp_f32(x[i] - m[b]) over the nb rows of n at x (n a
 * multiple of 16), 16 at a time in AVX-512 registers: the same operations
 * up to p, then p 2^k by vscalefps, which rounds the exact p 2^k once, as
 * cpu_softmax_exp_f32's (p 2^(k + 64)) 2^-64 does (its first product is
 * exact): the same bits, subnormal results included. Where d = x - m is
 * below -104 or NaN the lanes' result is 0 or d, as there (their p is
 * computed from d itself, never used, and no trap is raised: alloy never
 * unmasks floating-point exceptions). About 20 vector instructions per 16
 * exponentials, where GCC's vectors of cpu_softmax_exp_f32 took about 33
 * (the clamp's select, the exponent's integer steps, the two products, the
 * last selects). Only where the CPU has x86-64-v4 (wide512). */
__attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512dq"))) static void
softmax_exps_v4(const float *x, int64_t n, int nb, const float *m, float *v)
{
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), shifter = _mm512_set1_ps(12582912.0f);
    const __m512 ln2hi = _mm512_set1_ps(0.693145751953125f), ln2lo = _mm512_set1_ps(1.42860682030941723212e-6f);
    const __m512 c6 = _mm512_set1_ps(1.0f / 5040.0f), c5 = _mm512_set1_ps(1.0f / 720.0f);
    const __m512 c4 = _mm512_set1_ps(1.0f / 120.0f), c3 = _mm512_set1_ps(1.0f / 24.0f);
    const __m512 c2 = _mm512_set1_ps(1.0f / 6.0f), c1 = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512 lowest = _mm512_set1_ps(-104.0f);
    for (int b = 0; b < nb; b++) {
        const __m512 mb = _mm512_set1_ps(m[b]);
        for (int64_t c = (int64_t)b * n; c < (int64_t)(b + 1) * n; c += 16) {
            __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + c), mb);
            __mmask16 in = _mm512_cmp_ps_mask(d, lowest, _CMP_GE_OQ), nan = _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
            __m512 kf = _mm512_sub_ps(_mm512_fmadd_ps(d, log2e, shifter), shifter);
            __m512 r = _mm512_fnmadd_ps(kf, ln2lo, _mm512_fnmadd_ps(kf, ln2hi, d));
            __m512 p = _mm512_fmadd_ps(c6, r, c5);
            p = _mm512_fmadd_ps(p, r, c4);
            p = _mm512_fmadd_ps(p, r, c3);
            p = _mm512_fmadd_ps(p, r, c2);
            p = _mm512_fmadd_ps(p, r, c1);
            p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), one);
            __m512 e = _mm512_maskz_mov_ps(in, _mm512_scalef_ps(p, kf));
            _mm512_storeu_ps(v + c, _mm512_mask_mov_ps(e, nan, d));
        }
    }
}

/* cpu_softmax_exp_f32 of the 8 lanes of d in AVX2 registers, its
 * operations in its order; `normal`: every lane of d is -86 or above
 * (k >= -124: p 2^k is normal and exact), so that p 2^k is one product
 * and no lane needs the clamp or the select. The same bits either way. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 softmax_exp8(__m256 d, bool normal)
{
    const __m256 shifter = _mm256_set1_ps(12582912.0f);
    __m256 in = _mm256_cmp_ps(d, _mm256_set1_ps(-104.0f), _CMP_GE_OQ);
    __m256 dc = normal ? d : _mm256_and_ps(d, in);
    __m256 kf = _mm256_sub_ps(_mm256_fmadd_ps(dc, _mm256_set1_ps(1.44269504088896341f), shifter), shifter);
    __m256 r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(0.693145751953125f), dc);
    r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(1.42860682030941723212e-6f), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 5040.0f), r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i k = _mm256_cvttps_epi32(kf);
    if (normal) return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23)));
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127 + 64)), 23)));
    y = _mm256_mul_ps(y, _mm256_set1_ps(0x1p-64f));
    __m256 nan = _mm256_and_ps(d, _mm256_cmp_ps(d, d, _CMP_UNORD_Q)); /* d where NaN, else +0 */
    return _mm256_blendv_ps(nan, y, in);
}

/* softmax_exps_v4 for x86-64-v3: 16 values at a time, as two vectors of 8
 * by softmax_exp8, whose shorter form (`normal`) where all 16 are -86 or
 * above. Only where the CPU has x86-64-v3 (wide_leaves). */
__attribute__((target("avx2,fma"))) static void softmax_exps_v3(const float *x, int64_t n, int nb, const float *m,
                                                              float *v)
{
    const __m256 low = _mm256_set1_ps(-86.0f);
    for (int b = 0; b < nb; b++) {
        const __m256 mb = _mm256_set1_ps(m[b]);
        for (int64_t c = (int64_t)b * n; c < (int64_t)(b + 1) * n; c += 16) {
            __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + c), mb), d1 = _mm256_sub_ps(_mm256_loadu_ps(x + c + 8), mb);
            __m256 ok = _mm256_and_ps(_mm256_cmp_ps(d0, low, _CMP_GE_OQ), _mm256_cmp_ps(d1, low, _CMP_GE_OQ));
            if (_mm256_movemask_ps(ok) == 0xff) {
                _mm256_storeu_ps(v + c, softmax_exp8(d0, true));
                _mm256_storeu_ps(v + c + 8, softmax_exp8(d1, true));
            } else {
                _mm256_storeu_ps(v + c, softmax_exp8(d0, false));
                _mm256_storeu_ps(v + c + 8, softmax_exp8(d1, false));
            }
        }
    }
}
#endif

/* The largest of each of the nb rows of n at x (n apart) into m[b], as
 * max_of_f32 finds it: by max_rows_f32_lanes8 where the CPU has x86-64-v3. */
static void softmax_row_max_f32(const float *x, int64_t n, int nb, float *m)
{
#if defined(LEAF8)
    if (wide_leaves()) {
        max_rows_f32_lanes8(x, n, nb, m);
        return;
    }
#endif
    for (int b = 0; b < nb; b++) m[b] = max_of_f32(x + b * n, n);
}

/* The leaf sums of a softmax's sum over the nleaves leaves that leaf[]
 * lists (t's terms, or with q the products t[i] * q[i]): 8 leaves at a
 * time (leaf8_sums_f32, leaf8_product_sums_f32) where they are leaves of
 * LEAF and the CPU has x86-64-v3, the rest (fewer than 8, or every one
 * elsewhere) by cpu_leaf_sums_float or leaf_sums_products_f32. The same
 * bits either way. */
static void softmax_leaf_sums_f32(const float *t, const float *q, const int64_t *leaf, int nleaves, bool balanced,
                                  float *out)
{
    int k = 0;
#if defined(LEAF8)
    if (balanced && leaf[0] == LEAF && nleaves >= 8 && wide_leaves()) {
        k = nleaves & ~7;
        if (q) leaf8_product_sums_f32(t, q, k, out);
        else leaf8_sums_f32(t, k, out);
    }
#else
    (void)balanced;
#endif
    if (k == nleaves) return;
    const float *tk = t + (int64_t)k * LEAF;
    if (q) leaf_sums_products_f32(tk, q + (int64_t)k * LEAF, leaf + k, nleaves - k, out + k);
    else cpu_leaf_sums_float(tk, leaf + k, nleaves - k, out + k);
}

/* Causal rows shorter than this run the f32 softmax and softmax_grad over
 * whole rows, masked (the live columns' values, zeros past them), rather
 * than each row to its live columns: the batch's leaves added side by
 * side and full-length vector loops beat half the work there (bench/row_isa,
 * rows of 64: 1.21 and 0.52 ns an element live, against 1.01 and 0.32 for
 * whole rows). The same bits either way. */
enum { CAUSAL_LIVE_MIN = 256 };

/* The pairwise sums of the call's rows of terms t (n apart; each row's
 * terms past its live ones 0 up to its pad, or up to n when `whole`) into
 * sums[b], as a program's SUM adds them. */
static void row_sums_f32(const row_args *r, const float *t, float *sums, bool whole)
{
    float *leaf_sums = r->tmp;
    if (!r->causal || whole)
        softmax_leaf_sums_f32(t, NULL, r->leaf, r->nleaves * r->nb, r->balanced, leaf_sums);
    else
        for (int b = 0; b < r->nb; b++) {
            float *l = leaf_sums + b * r->nleaves;
            softmax_leaf_sums_f32(t + b * r->n, NULL, r->leaf, r->live_leaves[b], r->balanced, l);
            for (int q = r->live_leaves[b]; q < r->nleaves; q++) l[q] = 0;
        }
    for (int b = 0; b < r->nb; b++) {
        float *l = leaf_sums + b * r->nleaves;
        int k = 0;
        sums[b] = r->balanced ? tree_f32(l, r->nleaves) : combine_f32(l, r->n, &k);
    }
}

/* softmax in f32 as its program computes it, without the program's copies
 * of x and of V(0) into the terms buffer: the largest of x read in place,
 * the leaf sums read from V(0) itself. The same operations in the same
 * order, the same bits. */
static CPU_VECTOR_CLONES void row_softmax_by_hand_f32(const row_args *r)
{
    const int64_t n = r->n;
    float m[ROW_BATCH], s[ROW_BATCH];
    float *v = r->v[0];
    /* short causal rows whole: x holds the mask's -inf past the live columns
     * (the CPU stores causal_mask's value), which change neither the largest
     * nor the sum (exp(-inf - m) is 0, or NaN only where the live part is) */
    const bool whole = r->causal && n < CAUSAL_LIVE_MIN;
    if (n % 16 == 0 && (!r->causal || whole)) { /* whole rows of 16s: loops of 16 with nothing left over */
        const float *x = r->x[0];
        softmax_row_max_f32(x, n, r->nb, m);
#if defined(LEAF8)
        if (wide512()) softmax_exps_v4(x, n, r->nb, m, v);
        else if (wide_leaves()) softmax_exps_v3(x, n, r->nb, m, v);
        else
#endif
            for (int b = 0; b < r->nb; b++) {
                const float mb = m[b];
                for (int64_t c = b * n; c < (b + 1) * n; c += 16)
                    for (int i = 0; i < 16; i++) v[c + i] = cpu_softmax_exp_f32(x[c + i] - mb);
            }
        row_sums_f32(r, v, s, whole);
        float *y = r->y;
        for (int b = 0; b < r->nb; b++) {
            const float sb = s[b];
            const float *vb = v + b * n;
            float *yb = y + b * n;
            if (whole) { /* 0 past the live columns */
                const int64_t live = r->live[b];
                IVDEP for (int64_t i = 0; i < n; i++) yb[i] = i < live ? vb[i] / sb : 0;
                continue;
            }
            for (int64_t c = 0; c < n; c += 16)
                for (int i = 0; i < 16; i++) yb[c + i] = vb[c + i] / sb;
        }
        return;
    }
    for (int b = 0; b < r->nb; b++) {
        const float *x = (const float *)r->x[0] + b * r->xs[0];
        float *vb = v + b * n;
        const int64_t cols = whole ? n : r->live[b];
        softmax_row_max_f32(x, cols, 1, &m[b]);
        const float mb = m[b];
        IVDEP for (int64_t i = 0; i < cols; i++) vb[i] = cpu_softmax_exp_f32(x[i] - mb);
        for (int64_t i = cols; i < r->pad[b]; i++) vb[i] = 0;
    }
    row_sums_f32(r, v, s, whole);
    for (int b = 0; b < r->nb; b++) {
        const float *vb = v + b * n;
        float *y = (float *)r->y + b * n;
        const int64_t live = r->live[b];
        const float sb = s[b];
        if (whole) { /* one full-length loop */
            IVDEP for (int64_t i = 0; i < n; i++) y[i] = i < live ? vb[i] / sb : 0;
            continue;
        }
        IVDEP for (int64_t i = 0; i < live; i++) y[i] = vb[i] / sb;
        for (int64_t i = live; i < n; i++) y[i] = 0;
    }
}

/* softmax_grad over the call's rows by softmax_grad_rows8_body, returning
 * true, where they are rows of a complete tree of leaves of LEAF, whole
 * (not causal, or causal rows shorter than CAUSAL_LIVE_MIN), the call's
 * leaves a multiple of 8, on a CPU with AVX2; else false, having done
 * nothing */
static bool softmax_grad_rows8(const row_args *r)
{
#if defined(LEAF8)
    if ((r->causal && r->n >= CAUSAL_LIVE_MIN) || !r->balanced || r->leaf[0] != LEAF || (r->nleaves * r->nb) % 8 ||
        !wide_leaves())
        return false;
    softmax_grad_rows8_avx2(r);
    return true;
#else
    (void)r;
    return false;
#endif
}

/* The sum of y dy over causal row b's live columns alone, as its program
 * adds it (a whole row's sum is NaN where dy is not finite past them): its
 * leaves whose every column is live, then the last in order up to the live
 * columns, and 0 for the dead ones, combined by the row's tree; its leaf
 * sums in r->tmp, row b's place */
static float softmax_grad_live_sum(const row_args *r, int b)
{
    const float *yb = (const float *)r->x[0] + b * r->n, *dyb = (const float *)r->x[1] + b * r->n;
    float *l = (float *)r->tmp + b * r->nleaves;
    int full = r->live_leaves[b] - (r->pad[b] > r->live[b]), k = 0; /* leaves whose every column is live */
    softmax_leaf_sums_f32(yb, dyb, r->leaf, full, r->balanced, l);
    if (full < r->live_leaves[b]) { /* the last, in order up to the live columns */
        float a = 0;
        for (int64_t j = r->pad[b] - r->leaf[full]; j < r->live[b]; j++) a += yb[j] * dyb[j];
        l[full] = a;
    }
    for (int q = r->live_leaves[b]; q < r->nleaves; q++) l[q] = 0;
    return r->balanced ? tree_f32(l, r->nleaves) : combine_f32(l, r->n, &k);
}

/* softmax_grad in f32 as its program computes it (SUM(0, X(1) * X(0))
 * OUT(X(0) * (X(1) - S(0)))), the sum's leaves added from the products as
 * they are made (softmax_grad_rows8 where it fits, else
 * leaf_sums_products_f32): no terms written and read back, the same bits. A causal row of CAUSAL_LIVE_MIN or more reads y and dy
 * only at its live columns, its last live leaf added up to them (its
 * terms past them were 0: the same sum). */
static CPU_VECTOR_CLONES void row_softmax_grad_by_hand_f32(const row_args *r)
{
    const int64_t n = r->n;
    if (softmax_grad_rows8(r)) return;
    const float *y = r->x[0], *dy = r->x[1];
    float s[ROW_BATCH], *leaf_sums = r->tmp;
    /* Short causal rows whole: y is exactly 0 past the live columns, so
     * each product there is 0 (adding it changes no sum) unless dy is not
     * finite there, which makes the row's sum NaN (0 * inf); only such a
     * row's sum is added again over its live columns alone. */
    const bool whole = r->causal && n < CAUSAL_LIVE_MIN;
    if (!r->causal || whole)
        softmax_leaf_sums_f32(y, dy, r->leaf, r->nleaves * r->nb, r->balanced, leaf_sums);
    for (int b = 0; b < r->nb; b++) {
        float *l = leaf_sums + b * r->nleaves;
        int k = 0;
        if (r->causal) {
            if (whole) {
                s[b] = r->balanced ? tree_f32(l, r->nleaves) : combine_f32(l, n, &k);
                if (isfinite(s[b])) continue;
            }
            s[b] = softmax_grad_live_sum(r, b);
            continue;
        }
        s[b] = r->balanced ? tree_f32(l, r->nleaves) : combine_f32(l, n, &k);
    }
    if (n % 16 == 0 && !r->causal) { /* whole rows of 16s: loops of 16 with nothing left over */
        float *out = r->y;
        for (int b = 0; b < r->nb; b++) {
            const float sb = s[b];
            for (int64_t c = b * n; c < (b + 1) * n; c += 16)
                for (int i = 0; i < 16; i++) out[c + i] = y[c + i] * (dy[c + i] - sb);
        }
        return;
    }
    for (int b = 0; b < r->nb; b++) {
        const float *yb = y + b * n, *dyb = dy + b * n;
        float *out = (float *)r->y + b * n;
        const int64_t live = r->live[b];
        const float sb = s[b];
        if (whole) { /* one full-length loop */
            IVDEP for (int64_t i = 0; i < n; i++) out[i] = i < live ? yb[i] * (dyb[i] - sb) : 0;
            continue;
        }
        IVDEP for (int64_t i = 0; i < live; i++) out[i] = yb[i] * (dyb[i] - sb);
        for (int64_t i = live; i < n; i++) out[i] = 0;
    }
}

/* e[i] = exp(x[i] - m), i < n, by the softmax's exp (m the row's largest:
 * every argument 0 or less, or NaN): loops of 16, and the last fewer than
 * 16 as the 16 ending at n, whose first ones are computed again from the
 * same x: the same values, and no scalar remainder (a row of 76 has 12). */
static inline void shifted_exps_f32(const float *x, int64_t n, float m, float *e)
{
    int64_t c = 0;
    for (; c + 16 <= n; c += 16)
        for (int i = 0; i < 16; i++) e[c + i] = cpu_softmax_exp_f32(x[c + i] - m);
    if (c == n) return;
    if (n >= 16)
        for (int i = 0; i < 16; i++) e[n - 16 + i] = cpu_softmax_exp_f32(x[n - 16 + i] - m);
    else
        for (int64_t i = c; i < n; i++) e[i] = cpu_softmax_exp_f32(x[i] - m);
}

#if defined(LEAF8)
/* o[0..8): the sums of the 8 leaves that leaf[] lists for a row of 65 to
 * 127 exponentials at t (each leaf 8 to 16 of them: a row of 76 has 9, 10,
 * 9, 10, ...), leaf l in lane l: its first 8 terms loaded from its start
 * and added 8 x 8 transposed (add8_transposed), then 8 more from 8 past its
 * start, those past its end (the next leaf's) made +0 first. Each leaf in
 * order from 0, plus +0s, which leave a sum of exponentials (+0 or more,
 * or NaN) as it was: the same bits as cpu_leaf_sums_float, which adds
 * leaves of different lengths one at a time. t must be readable 16 terms
 * past the row (CE_OWN_EXPS). Only where the CPU has x86-64-v3
 * (wide_leaves). */
__attribute__((target("avx2,fma"))) static void leaf8_sums_unequal_f32(const float *t, const int64_t *leaf, float *o)
{
    int64_t start[8], at = 0;
    for (int l = 0; l < 8; l++) start[l] = at, at += leaf[l];
    v8f a[8];
    for (int l = 0; l < 8; l++) memcpy(&a[l], t + start[l], sizeof a[l]);
    v8f acc = add8_transposed((v8f){0}, a);
    const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int l = 0; l < 8; l++) {
        v8f b;
        memcpy(&b, t + start[l] + 8, sizeof b);
        v8i in = lane < (v8i){0} + (int32_t)(leaf[l] - 8); /* all ones where term 8 + j is the leaf's */
        a[l] = (v8f)((v8i)b & in);
    }
    acc = add8_transposed(acc, a);
    memcpy(o, &acc, sizeof acc);
}
#endif

/* Batches of at most this many elements take their exponentials into a
 * buffer of the function's own, 16 terms longer (zeros), which
 * leaf8_sums_unequal_f32 may read past the last row. */
enum { CE_OWN_EXPS = 1024 };

/* The pairwise sums s[b] of the call's rows of n terms e (n apart) as a
 * SUM adds them: leaves of LEAF 8 at a time where there are 8 or more
 * (softmax_leaf_sums_f32, over every row's leaves), the 8 shorter leaves
 * of a row of 65 to 127 side by side (leaf8_sums_unequal_f32, `padded`:
 * e is the CE_OWN_EXPS buffer), else cpu_leaf_sums_float; then each
 * row's tree over its leaf sums. The same bits. */
static inline void cross_entropy_sums_f32(const row_args *r, const float *e, bool padded, float *s)
{
    float *l = r->tmp;
#if defined(LEAF8)
    if (padded && r->nleaves == 8 && r->leaf[0] != LEAF && r->n < 128 && wide_leaves())
        for (int b = 0; b < r->nb; b++) leaf8_sums_unequal_f32(e + b * r->n, r->leaf, l + 8 * b);
    else
#else
    (void)padded;
#endif
        softmax_leaf_sums_f32(e, NULL, r->leaf, r->nleaves * r->nb, r->balanced, l);
    for (int b = 0; b < r->nb; b++) {
        int k = 0;
        const float *lb = l + b * r->nleaves;
        s[b] = r->balanced ? tree_f32(lb, r->nleaves) : combine_f32(lb, r->n, &k);
    }
}

/* The generated f32 function of op over the call's rows one at a time (a
 * batch's rows each as a call of one: it reads one row's i operands and
 * writes one result) */
static void cross_entropy_generated_f32(const row_args *r, int op)
{
    if (r->nb == 1) {
        cpu_row_fns[op].f32(r);
        return;
    }
    for (int b = 0; b < r->nb; b++) {
        row_args one = *r;
        one.nb = 1, one.row = r->row + b;
        for (int j = 0; j < r->nin; j++) {
            one.x[j] = (const float *)r->x[j] + b * r->xs[j];
            one.index[j] = r->index_of[b][j];
            one.w[0][j] = r->w[b][j];
        }
        one.live[0] = r->live[b], one.pad[0] = r->pad[b], one.live_leaves[0] = r->live_leaves[b];
        one.y = (float *)r->y + b * r->n;
        if (r->result) one.result = (float *)r->result + b, one.weight = (float *)r->weight + b;
        cpu_row_fns[op].f32(&one);
    }
}

/* cross_entropy in f32 without class weights or label smoothing (else the
 * generated function): its program's operations in the same order, with
 * the largest (softmax_row_max_f32) and the sum of the exponentials
 * (shifted_exps_f32, cross_entropy_sums_f32) taken from x and V(0) where
 * they lie (no copy into the terms buffer) and the smoothing sum, whose
 * terms are all +0 then, as the +0 it adds up to. Short rows come in
 * batches (cpu_row_f32_batch_indexed): each stage over every row of the
 * batch before the next. The same bits (tests/test_rows.c checks them
 * against in-order loops). */
static CPU_VECTOR_CLONES void row_cross_entropy_by_hand_f32(const row_args *r)
{
    if (r->nin > 2 || (float)r->p[1] != 0) {
        cross_entropy_generated_f32(r, IR_OP_cross_entropy);
        return;
    }
    typedef float T;
    const int64_t n = r->n;
    const int nb = r->nb;
    const T *x = r->x[0];
    T own[CE_OWN_EXPS + 16] __attribute__((aligned(64)));
    const bool padded = nb * n <= CE_OWN_EXPS;
    T *e = padded ? own : r->v[0];
    if (padded) memset(own + nb * n, 0, sizeof(T) * 16);
    T m[ROW_BATCH], s[ROW_BATCH];
    softmax_row_max_f32(x, n, nb, m);
    for (int b = 0; b < nb; b++) shifted_exps_f32(x + b * n, n, m[b], e + b * n);
    cross_entropy_sums_f32(r, e, padded, s);
    T *result = r->result, *weight = r->weight;
    for (int b = 0; b < nb; b++) {
        T s0 = m[b], s1 = s[b], s2 = log(s1), s3 = 0, p1 = (T)r->p[1];
        int64_t t = r->index_of[b][1];
        bool ignored = t == (long long)(T)r->p[0];
        T s4 = ignored ? (T)0 : (T)1;
        weight[b] = s4;
        result[b] = ignored ? (T)0 : ((T)1 - p1) * s4 * (s2 + s0 - x[b * n + t]) - p1 / (T)n * s3;
    }
}

/* y[0..left) = v[0..left), left < 16: by two 32-byte masked stores where
 * the CPU has x86-64-v3 (GCC made the loop's conditional stores scalar,
 * one at a time), else in order. */
#if defined(LEAF8)
__attribute__((target("avx2,fma"))) static void store_first_f32_lanes8(float *y, const float *v, int left)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32(left), lane), _mm256_loadu_ps(v));
    _mm256_maskstore_ps(y + 8, _mm256_cmpgt_epi32(_mm256_set1_epi32(left - 8), lane), _mm256_loadu_ps(v + 8));
}
#endif

static inline void store_first_f32(float *y, const float *v, int left)
{
#if defined(LEAF8)
    if (wide_leaves()) {
        store_first_f32_lanes8(y, v, left);
        return;
    }
#endif
    memcpy(y, v, sizeof(float) * (size_t)left);
}

/* cross_entropy_grad in f32 without class weights (else the generated
 * function): the same operations in the same order, the largest and the
 * sum of the exponentials as cross_entropy takes them, and the sum of n
 * ones (exact in f32 below 2^24) as n. The one-hot term is subtracted at
 * the target alone: elsewhere the program subtracts +0, which leaves every
 * value as it was (-0 included). In batches as cross_entropy. The same
 * bits. */
static CPU_VECTOR_CLONES void row_cross_entropy_grad_by_hand_f32(const row_args *r)
{
    const int64_t n = r->n;
    if (r->nin > 4 || n >= (1 << 24)) {
        cross_entropy_generated_f32(r, IR_OP_cross_entropy_grad);
        return;
    }
    typedef float T;
    const int nb = r->nb;
    const T *x = r->x[0];
    T own[CE_OWN_EXPS + 16] __attribute__((aligned(64)));
    const bool padded = nb * n <= CE_OWN_EXPS;
    T *e = padded ? own : r->v[0];
    if (padded) memset(own + nb * n, 0, sizeof(T) * 16);
    T m[ROW_BATCH], s[ROW_BATCH];
    softmax_row_max_f32(x, n, nb, m);
    for (int b = 0; b < nb; b++) shifted_exps_f32(x + b * n, n, m[b], e + b * n);
    cross_entropy_sums_f32(r, e, padded, s);
    const T p1 = (T)r->p[1];
    const T s2 = (T)r->scalar[2] / (r->nin > 3 ? (T)r->scalar[3] : (T)r->rows), s3 = (T)n;
    for (int b = 0; b < nb; b++) {
        const T *eb = e + b * n;
        T *y = (T *)r->y + b * n;
        int64_t t = r->index_of[b][1];
        if (t == (long long)(T)r->p[0]) { /* ignored: no gradient */
            memset(y, 0, sizeof(T) * (size_t)n);
            continue;
        }
        const T s1 = s[b], s4 = (T)1, s5 = ((T)1 - p1) * s4 + p1 / (T)n * s3;
        const T hot = ((T)1 - p1) * s4, rest = p1 / (T)n * (T)1;
        int64_t c = 0;
        for (; c + 16 <= n; c += 16)
            for (int i = 0; i < 16; i++) y[c + i] = (s5 * (eb[c + i] / s1) - rest) * s2;
        if (c < n && padded) { /* the last fewer than 16 as one vector (eb readable past n), then stored */
            T v[16] __attribute__((aligned(64)));
            for (int i = 0; i < 16; i++) v[i] = (s5 * (eb[c + i] / s1) - rest) * s2;
            store_first_f32(y + c, v, (int)(n - c));
        } else if (c < n && n >= 16) /* the last 16, the first of them again: the same values */
            for (int i = 0; i < 16; i++) y[n - 16 + i] = (s5 * (eb[n - 16 + i] / s1) - rest) * s2;
        else
            for (int64_t i = c; i < n; i++) y[i] = (s5 * (eb[i] / s1) - rest) * s2;
        if (t >= 0 && t < n) y[t] = (s5 * (eb[t] / s1) - hot - rest) * s2;
    }
}

/* f32 row functions written out by hand in place of the generated one */
const row_fn cpu_row_f32_by_hand[IR_OP_COUNT] = {
    [IR_OP_layer_norm_grad_stats] = cpu_row_layer_norm_grad_stats_f32,
    [IR_OP_layer_norm] = cpu_row_layer_norm_f32,
    [IR_OP_layer_norm_mean] = cpu_row_layer_norm_mean_f32,
    [IR_OP_layer_norm_rstd] = cpu_row_layer_norm_rstd_f32,
    [IR_OP_softmax] = row_softmax_by_hand_f32,
    [IR_OP_softmax_grad] = row_softmax_grad_by_hand_f32,
    [IR_OP_cross_entropy] = row_cross_entropy_by_hand_f32,
    [IR_OP_cross_entropy_grad] = row_cross_entropy_grad_by_hand_f32,
};

/* Elements of short rows per call for the f32 functions above that run
 * several rows side by side, where not 0 (wide: only where their AVX2 code
 * runs). layer_norm's two sums are a chain of dependent steps per row (leaf
 * sums, mean, leaf sums, rstd), and so are layer_norm_grad_stats' two sums
 * and its output; 4 rows of 256 at a time overlap their chains. The
 * generated layer_norm_grad_stats keeps ROW_BATCH_ELEMS: its buffers of g,
 * h and g h 4 KiB apart would alias. The softmax and its gradient: rows of
 * 64 sixteen at a time, of 256 four; at ROW_BATCH_ELEMS (256) they spent
 * the call and their sums' addition chains once per 256 elements
 * (bench/row_isa, AVX-512: softmax_grad 0.25 -> 0.20 ns an element at rows
 * of 64, 0.25 -> 0.19 at rows of 256; bench/RESULTS.md). The cross-entropy
 * pair (indexed: their targets and per-row results come in batches too)
 * took one row per call before: now rows of 76 thirteen at a time, of 64
 * sixteen (bench/row_isa, AVX-512, rows of 64: cross_entropy 1.05 -> 0.59
 * ns an element). The same additions per row: the same bits. */
static const struct {
    int elems;
    bool wide, indexed; /* indexed: see cpu_row_f32_batch_indexed */
} batch_elems[IR_OP_COUNT] = {
    [IR_OP_layer_norm] = {1024, false, false},
    [IR_OP_layer_norm_mean] = {1024, false, false},
    [IR_OP_layer_norm_rstd] = {1024, false, false},
    [IR_OP_layer_norm_grad_stats] = {1024, true, false},
    [IR_OP_softmax] = {1024, false, false},
    [IR_OP_softmax_grad] = {1024, false, false},
    [IR_OP_cross_entropy] = {1024, false, true},
    [IR_OP_cross_entropy_grad] = {1024, false, true},
};

int64_t cpu_row_f32_batch_elems(int op)
{
    if (!batch_elems[op].elems) return ROW_BATCH_ELEMS;
#if defined(LEAF8)
    if (batch_elems[op].wide && !wide_leaves()) return ROW_BATCH_ELEMS;
#else
    if (batch_elems[op].wide) return ROW_BATCH_ELEMS;
#endif
    return batch_elems[op].elems;
}

bool cpu_row_f32_batch_indexed(int op)
{
    return batch_elems[op].indexed;
}
