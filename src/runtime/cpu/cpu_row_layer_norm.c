/* cpu_row_layer_norm.c - layer_norm, its statistics (layer_norm_mean, layer_norm_rstd) and layer_norm_grad_stats in f32 written out by hand: both sums 8 leaves at a time from the operands where they lie, the same bits as their programs. */
/* No trapping math here, as in cpu_row_by_hand.c and cpu_row_programs.c. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <string.h>

#include "base/vmath.h" /* CPU_VECTOR_CLONES */
#include "runtime/cpu/cpu_row_leaf8.h"
#include "runtime/cpu/cpu_rows.h"

/* layer_norm's and layer_norm_grad_stats' sums, 8 leaves of LEAF terms side
 * by side in a 32-byte vector: each 8 x 8 block of terms transposed in
 * registers (unpacks, shufps, 128-bit halves) and added one term of every
 * leaf per addition, so each leaf is still added in order from 0: the same
 * bits as cpu_leaf_sums_float. Only where the CPU has x86-64-v3 (AVX2),
 * as wide_leaves() says: GCC makes scalar code of these shuffles for SSE2,
 * whose clone runs the generated functions (or, for the gradient, the
 * 4 x 4 transposes of cpu_leaf_sums_float). */
#if defined(LEAF8)
typedef float v8f_unaligned __attribute__((vector_size(32), aligned(4), may_alias));
#define LOAD8(p) (*(const v8f_unaligned *)(const void *)(p)) /* straight from memory, not through a copy */
#define SH8(a, b, ...) __builtin_shuffle(a, b, (v8i){__VA_ARGS__})
/* tr[q] (q = 0..7; lane l: term q of a[l]) = the 8 x 8 transpose of the
 * vectors a[0..8) in registers */
#define TRANSPOSE8_REGS(tr, a_)                                                            \
    {                                                                                      \
        v8f t0 = SH8(a_[0], a_[1], 0, 8, 1, 9, 4, 12, 5, 13), t1 = SH8(a_[0], a_[1], 2, 10, 3, 11, 6, 14, 7, 15); \
        v8f t2 = SH8(a_[2], a_[3], 0, 8, 1, 9, 4, 12, 5, 13), t3 = SH8(a_[2], a_[3], 2, 10, 3, 11, 6, 14, 7, 15); \
        v8f t4 = SH8(a_[4], a_[5], 0, 8, 1, 9, 4, 12, 5, 13), t5 = SH8(a_[4], a_[5], 2, 10, 3, 11, 6, 14, 7, 15); \
        v8f t6 = SH8(a_[6], a_[7], 0, 8, 1, 9, 4, 12, 5, 13), t7 = SH8(a_[6], a_[7], 2, 10, 3, 11, 6, 14, 7, 15); \
        v8f u0 = SH8(t0, t2, 0, 1, 8, 9, 4, 5, 12, 13), u1 = SH8(t0, t2, 2, 3, 10, 11, 6, 7, 14, 15); \
        v8f u2 = SH8(t1, t3, 0, 1, 8, 9, 4, 5, 12, 13), u3 = SH8(t1, t3, 2, 3, 10, 11, 6, 7, 14, 15); \
        v8f u4 = SH8(t4, t6, 0, 1, 8, 9, 4, 5, 12, 13), u5 = SH8(t4, t6, 2, 3, 10, 11, 6, 7, 14, 15); \
        v8f u6 = SH8(t5, t7, 0, 1, 8, 9, 4, 5, 12, 13), u7 = SH8(t5, t7, 2, 3, 10, 11, 6, 7, 14, 15); \
        tr[0] = SH8(u0, u4, 0, 1, 2, 3, 8, 9, 10, 11);                                     \
        tr[1] = SH8(u1, u5, 0, 1, 2, 3, 8, 9, 10, 11);                                     \
        tr[2] = SH8(u2, u6, 0, 1, 2, 3, 8, 9, 10, 11);                                     \
        tr[3] = SH8(u3, u7, 0, 1, 2, 3, 8, 9, 10, 11);                                     \
        tr[4] = SH8(u0, u4, 4, 5, 6, 7, 12, 13, 14, 15);                                   \
        tr[5] = SH8(u1, u5, 4, 5, 6, 7, 12, 13, 14, 15);                                   \
        tr[6] = SH8(u2, u6, 4, 5, 6, 7, 12, 13, 14, 15);                                   \
        tr[7] = SH8(u3, u7, 4, 5, 6, 7, 12, 13, 14, 15);                                   \
    }
/* the 4 floats at lo, then the 4 at hi: one load and one load into the
 * high 16 bytes */
#define LOAD4X2(lo, hi) ((v8f)_mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)), _mm_loadu_ps(hi), 1))
/* tr[q] (q = 0..3; lane l: term q of a[l & 3]'s half l >> 2) = the two
 * 4 x 4 transposes of the halves of a[0..4) in registers: the first two
 * steps of TRANSPOSE8_REGS */
#define TRANSPOSE4X2_REGS(tr, a_)                                                          \
    {                                                                                      \
        v8f t0 = SH8(a_[0], a_[1], 0, 8, 1, 9, 4, 12, 5, 13), t1 = SH8(a_[0], a_[1], 2, 10, 3, 11, 6, 14, 7, 15); \
        v8f t2 = SH8(a_[2], a_[3], 0, 8, 1, 9, 4, 12, 5, 13), t3 = SH8(a_[2], a_[3], 2, 10, 3, 11, 6, 14, 7, 15); \
        tr[0] = SH8(t0, t2, 0, 1, 8, 9, 4, 5, 12, 13), tr[1] = SH8(t0, t2, 2, 3, 10, 11, 6, 7, 14, 15); \
        tr[2] = SH8(t1, t3, 0, 1, 8, 9, 4, 5, 12, 13), tr[3] = SH8(t1, t3, 2, 3, 10, 11, 6, 7, 14, 15); \
    }
/* tr[q] (lane l: leaf l of the 8 leaves of LEAF terms at base) = their term
 * j + q */
#define TRANSPOSE8(tr, base, j)                                                            \
    {                                                                                      \
        const float *p_ = (base) + (j);                                                    \
        v8f a8_[8] = {LOAD8(p_), LOAD8(p_ + LEAF), LOAD8(p_ + 2 * LEAF), LOAD8(p_ + 3 * LEAF), \
                      LOAD8(p_ + 4 * LEAF), LOAD8(p_ + 5 * LEAF), LOAD8(p_ + 6 * LEAF), LOAD8(p_ + 7 * LEAF)}; \
        TRANSPOSE8_REGS(tr, a8_)                                                           \
    }

/* Whether layer_norm_stats8_f32 takes the call's rows: a complete tree of
 * leaves of LEAF, the call's leaves a multiple of 8, a CPU with AVX2 */
static bool layer_norm_stats8_fits(const row_args *r)
{
    return !r->causal && r->balanced && r->leaf[0] == LEAF && (r->nleaves * r->nb) % 8 == 0 && wide_leaves();
}

/* layer_norm's two sums over the call's rows as its program adds them
 * (SUM(0, X(0)), then SUM(2, (X(0) - S(1)) (X(0) - S(1)))), their leaves 8
 * at a time: each 8 x 8 block of x transposed once (TRANSPOSE8), its leaves
 * added one term of every leaf per addition and the transposed block kept
 * in r->terms, from where the second sum's terms are made lane by lane
 * (lane l: the mean of leaf l's row). Each leaf is still added in order
 * from 0 and each row's leaf sums combined as levels_f32 does: the same
 * bits. The row's mean and rstd into mean[b], rstd[b] (rstd NULL: the mean
 * alone). Only where layer_norm_stats8_fits (layer_norm_stats8_f32 below). */
static inline __attribute__((always_inline)) void layer_norm_stats8_body(const row_args *r, float *mean, float *rstd)
{
    typedef float v8f_u __attribute__((vector_size(32), aligned(4), may_alias));
    const float *x = r->x[0];
    const int nl = r->nleaves, m = nl * r->nb;
    float *ls = r->tmp, *xt = r->terms;
    for (int k = 0; k < m; k += 8) {
        const float *b = x + (int64_t)k * LEAF;
        v8f_u *t = (v8f_u *)(void *)(xt + (int64_t)k * LEAF);
        v8f s = {0};
        for (int j = 0; j < LEAF; j += 8) {
            v8f tr[8];
            TRANSPOSE8(tr, b, j)
            for (int q = 0; q < 8; q++) s += tr[q], t[j + q] = tr[q];
        }
        *(v8f_u *)(void *)(ls + k) = s;
    }
    for (int b = 0; b < r->nb; b++) mean[b] = tree_f32(ls + b * nl, nl) / (float)r->n;
    if (!rstd) return;
    for (int k = 0; k < m; k += 8) {
        const v8f_u *t = (const v8f_u *)(const void *)(xt + (int64_t)k * LEAF);
        const float *mk = mean + k / nl; /* the means of the rows of leaves k..k+7 */
        v8f mv;
        switch (nl) { /* a power of 2: 8 or more leaves to a row, or 4, 2, 1 */
        case 4: mv = (v8f){mk[0], mk[0], mk[0], mk[0], mk[1], mk[1], mk[1], mk[1]}; break;
        case 2: mv = (v8f){mk[0], mk[0], mk[1], mk[1], mk[2], mk[2], mk[3], mk[3]}; break;
        case 1: mv = (v8f){mk[0], mk[1], mk[2], mk[3], mk[4], mk[5], mk[6], mk[7]}; break;
        default: mv = (v8f){0} + mk[0];
        }
        v8f s = {0};
        for (int q = 0; q < LEAF; q++) {
            v8f d = t[q] - mv;
            s += d * d;
        }
        *(v8f_u *)(void *)(ls + k) = s;
    }
    const float eps = (float)r->p[0];
    for (int b = 0; b < r->nb; b++) rstd[b] = 1.0f / sqrtf(tree_f32(ls + b * nl, nl) / (float)r->n + eps);
}

/* layer_norm_grad_stats' leaf sums of g and of g h (lane l of each 8: leaf
 * l of the call's leaves k..k+7) for rows of 4 or more leaves, with the
 * 8 x 8 transposes' third step (the 128-bit swaps) gone: each vector holds
 * 4 terms of leaf k + q in its low 16 bytes and of leaf k + q + 4 in its
 * high 16, loaded so (a 16-byte load into each half), so the first two
 * steps of the transpose leave term j of leaves k..k+7 in lanes 0..7. Each
 * leaf still added in order from 0: the same bits. one_row: the 8 leaves in
 * one row (rows of 8 or more leaves; gamma then already in the order of the
 * loads, 8 floats for leaves q and q + 4 at 2 (q LEAF + j), as
 * layer_norm_grad_sums_halves_body copies it; else 4 leaves to a row, gamma
 * as it lies, its 16 vectors (4 terms of a leaf in both halves) broadcast
 * once a call, the same for every group); with_gamma: g = dy gamma, else
 * g = dy. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void
ln_grad_leaf_sums_halves(const float *x, const float *dy, const float *gamma, int m, int nl, int shift,
                         const float *mean, const float *rstd, float *ls1, float *ls3, const bool one_row,
                         const bool with_gamma)
{
    v8f gv[4][4]; /* rows of 4 leaves: gamma of leaves q and q + 4 at term j, in both halves */
    if (with_gamma && !one_row)
        for (int q = 0; q < 4; q++)
            for (int j = 0; j < LEAF; j += 4)
                gv[q][j / 4] = (v8f)_mm256_broadcast_ps((const __m128 *)(const void *)(gamma + q * LEAF + j));
    for (int k = 0; k < m; k += 8) {
        v8f a1 = {0}, a3 = {0};
        const float *gm = with_gamma ? gamma + (one_row ? 2 : 1) * (k & (nl - 1)) * LEAF : NULL;
        const int b = k >> shift, hi = one_row ? b : b + 1; /* the rows of leaves k and k + 4 */
        const v8f mv = {mean[b], mean[b], mean[b], mean[b], mean[hi], mean[hi], mean[hi], mean[hi]};
        const v8f rv = {rstd[b], rstd[b], rstd[b], rstd[b], rstd[hi], rstd[hi], rstd[hi], rstd[hi]};
        for (int j = 0; j < LEAF; j += 4) {
            v8f g[4], gh[4];
            const int64_t at = (int64_t)k * LEAF + j;
            for (int q = 0; q < 4; q++) {
                v8f gq = LOAD4X2(dy + at + q * LEAF, dy + at + (q + 4) * LEAF);
                if (with_gamma)
                    gq *= one_row ? (v8f)LOAD8(gm + 2 * (q * LEAF + j)) : gv[q][j / 4];
                g[q] = gq, gh[q] = gq * ((LOAD4X2(x + at + q * LEAF, x + at + (q + 4) * LEAF) - mv) * rv);
            }
            v8f tr[4];
            TRANSPOSE4X2_REGS(tr, g)
            for (int q = 0; q < 4; q++) a1 += tr[q];
            TRANSPOSE4X2_REGS(tr, gh)
            for (int q = 0; q < 4; q++) a3 += tr[q];
        }
        memcpy(ls1 + k, &a1, sizeof a1), memcpy(ls3 + k, &a3, sizeof a3);
    }
}

/* layer_norm_grad_stats' two sums over the call's rows as its program adds
 * them (SUM(0, g), SUM(2, g h) with g = dy gamma, h = (x - mean) rstd), their
 * leaves 8 at a time: each leaf's 8 terms made in a vector from x, dy and
 * gamma where they lie, 8 leaves' vectors of g and of g h transposed in
 * registers and added one term of every leaf per addition: no g, h or g h
 * written out. Each leaf is still added in order from 0 and each row's leaf
 * sums combined as levels_f32 does: the same bits. Each row's sum(g) / n
 * and sum(g h) / n into s1[b], s3[b]. Only where layer_norm_stats8_fits. */
static inline __attribute__((always_inline)) void layer_norm_grad_sums8_body(const row_args *r, float *s1, float *s3)
{
    const float *x = r->x[0], *dy = r->x[1], *gamma = r->nin > 4 ? r->x[4] : NULL;
    const int nl = r->nleaves, m = nl * r->nb;
    float *ls1 = r->tmp, *ls3 = ls1 + m; /* r->tmp holds a batch's elements, 16 times its leaves */
    float mean[ROW_BATCH], rstd[ROW_BATCH];
    for (int b = 0; b < r->nb; b++) mean[b] = (float)r->w[b][2], rstd[b] = (float)r->w[b][3];
    int shift = 0; /* leaf L of the call is in row L >> shift (nl a power of 2) */
    while ((1 << shift) < nl) shift++;
    for (int k = 0; k < m; k += 8) {
        v8f a1 = {0}, a3 = {0};
        for (int j = 0; j < LEAF; j += 8) {
            v8f g[8], gh[8];
            const int64_t at = (int64_t)k * LEAF + j;
            const float *gm = gamma ? gamma + (k & (nl - 1)) * LEAF + j : NULL; /* leaf q's: gm + q LEAF (nl >= 8) */
            if (nl >= 8) { /* the 8 leaves in one row */
                const float mb = mean[k >> shift], rb = rstd[k >> shift];
                for (int q = 0; q < 8; q++) {
                    v8f d = LOAD8(dy + at + q * LEAF);
                    v8f gq = gamma ? d * LOAD8(gm + q * LEAF) : d;
                    g[q] = gq, gh[q] = gq * ((LOAD8(x + at + q * LEAF) - mb) * rb);
                }
            } else
                for (int q = 0; q < 8; q++) {
                    int b = (k + q) >> shift;
                    v8f d = LOAD8(dy + at + q * LEAF);
                    v8f gq = gamma ? d * LOAD8(gamma + (q & (nl - 1)) * LEAF + j) : d;
                    g[q] = gq, gh[q] = gq * ((LOAD8(x + at + q * LEAF) - mean[b]) * rstd[b]);
                }
            v8f tr[8];
            TRANSPOSE8_REGS(tr, g)
            for (int q = 0; q < 8; q++) a1 += tr[q];
            TRANSPOSE8_REGS(tr, gh)
            for (int q = 0; q < 8; q++) a3 += tr[q];
        }
        memcpy(ls1 + k, &a1, sizeof a1), memcpy(ls3 + k, &a3, sizeof a3);
    }
    for (int b = 0; b < r->nb; b++) {
        s1[b] = tree_f32(ls1 + b * nl, nl) / (float)r->n;
        s3[b] = tree_f32(ls3 + b * nl, nl) / (float)r->n;
    }
}

/* the longest row whose gamma layer_norm_grad_sums_halves_body copies into
 * the order its loads take (rows of 8 or more leaves) */
enum { HALVES_GAMMA_MAX_N = 512 };
/* layer_norm_grad_sums8_body's sums for rows of 4 or more leaves through
 * ln_grad_leaf_sums_halves (no 128-bit swaps): the same bits. Only where
 * layer_norm_stats8_fits and r->nleaves >= 4. */
__attribute__((target("avx2,fma"))) static inline __attribute__((always_inline)) void
layer_norm_grad_sums_halves_body(const row_args *r, float *s1, float *s3)
{
    const float *x = r->x[0], *dy = r->x[1], *gamma = r->nin > 4 ? r->x[4] : NULL;
    const int nl = r->nleaves, m = nl * r->nb;
    float *ls1 = r->tmp, *ls3 = ls1 + m; /* r->tmp holds a batch's elements, 16 times its leaves */
    float mean[ROW_BATCH], rstd[ROW_BATCH];
    for (int b = 0; b < r->nb; b++) mean[b] = (float)r->w[b][2], rstd[b] = (float)r->w[b][3];
    int shift = 0; /* leaf L of the call is in row L >> shift (nl a power of 2) */
    while ((1 << shift) < nl) shift++;
    float gh[2 * HALVES_GAMMA_MAX_N] __attribute__((aligned(32)));
    if (nl >= 8 && gamma) { /* gamma as the halves load it, once a call (n <= HALVES_GAMMA_MAX_N) */
        for (int l = 0; l < nl; l += 8)
            for (int j = 0; j < LEAF; j += 4)
                for (int q = 0; q < 4; q++) {
                    float *o = gh + 2 * ((l + q) * LEAF + j);
                    memcpy(o, gamma + (l + q) * LEAF + j, 16), memcpy(o + 4, gamma + (l + q + 4) * LEAF + j, 16);
                }
        gamma = gh;
    }
    if (nl >= 8 && gamma) ln_grad_leaf_sums_halves(x, dy, gamma, m, nl, shift, mean, rstd, ls1, ls3, true, true);
    else if (nl >= 8) ln_grad_leaf_sums_halves(x, dy, gamma, m, nl, shift, mean, rstd, ls1, ls3, true, false);
    else if (gamma) ln_grad_leaf_sums_halves(x, dy, gamma, m, nl, shift, mean, rstd, ls1, ls3, false, true);
    else ln_grad_leaf_sums_halves(x, dy, gamma, m, nl, shift, mean, rstd, ls1, ls3, false, false);
    for (int b = 0; b < r->nb; b++) {
        s1[b] = tree_f32(ls1 + b * nl, nl) / (float)r->n;
        s3[b] = tree_f32(ls3 + b * nl, nl) / (float)r->n;
    }
}

/* The functions above compiled for x86-64-v3 and for x86-64-v4 (the
 * same vectors of 8; v4's 32 registers hold a block's 16 vectors of g and g
 * h without spills), the one the CPU runs chosen as the library's clones
 * are: the same bits either way. The gradient's sums without the 128-bit
 * swaps (layer_norm_grad_sums_halves_body) on v3 for rows of 4 or more
 * leaves (with gamma, rows of up to HALVES_GAMMA_MAX_N; longer ones the
 * 8 x 8 transposes), on v4 for rows of 4 only. On Zen 4 they took
 * layer_norm_grad at rows of 64, 128 and 256 below the 8 x 8 transposes'
 * time on v3 and at rows of 64 on v4; on v4 at rows of 128 and 256 they
 * were slower (bench/row_isa; bench/RESULTS.md), so v4 keeps the 8 x 8
 * transposes there. */
__attribute__((target("avx2,fma"))) static void layer_norm_stats8_v3(const row_args *r, float *mean, float *rstd)
{
    layer_norm_stats8_body(r, mean, rstd);
}
__attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512dq"))) static void layer_norm_stats8_v4(const row_args *r, float *mean, float *rstd)
{
    layer_norm_stats8_body(r, mean, rstd);
}
__attribute__((target("avx2,fma"))) static void layer_norm_grad_sums8_v3(const row_args *r, float *s1, float *s3)
{
    if (r->nleaves == 4 || (r->nleaves > 4 && (r->nin <= 4 || r->n <= HALVES_GAMMA_MAX_N)))
        layer_norm_grad_sums_halves_body(r, s1, s3);
    else layer_norm_grad_sums8_body(r, s1, s3);
}
__attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512dq"))) static void layer_norm_grad_sums8_v4(const row_args *r, float *s1, float *s3)
{
    if (r->nleaves == 4) layer_norm_grad_sums_halves_body(r, s1, s3);
    else layer_norm_grad_sums8_body(r, s1, s3);
}
static void layer_norm_stats8_f32(const row_args *r, float *mean, float *rstd)
{
    if (wide512()) layer_norm_stats8_v4(r, mean, rstd);
    else layer_norm_stats8_v3(r, mean, rstd);
}
static void layer_norm_grad_sums8_f32(const row_args *r, float *s1, float *s3)
{
    if (wide512()) layer_norm_grad_sums8_v4(r, s1, s3);
    else layer_norm_grad_sums8_v3(r, s1, s3);
}
#undef TRANSPOSE8
#undef TRANSPOSE8_REGS
#undef TRANSPOSE4X2_REGS
#undef LOAD4X2
#undef LOAD8
#undef SH8
#endif

/* layer_norm_grad_stats in f32 as its program computes it, dx = rstd (g -
 * mean(g) - h mean(g h)) with g = dy gamma, h = (x - mean) rstd. Where the
 * rows' leaves go 8 at a time, both sums from x, dy and gamma where they
 * lie (layer_norm_grad_sums8_f32), then g and h made again in the loop
 * that stores dx: no buffers. Else g, h and the second SUM's terms g h in
 * one pass over the row (the first SUM's terms are g itself), the leaves of
 * each SUM added in one call for the whole batch, each row's leaf sums
 * combined in registers, then dx. The same operations in the same order as
 * the program, the same bits (tests/test_rows.c checks them against
 * in-order loops). */
#define LN_GRAD_TERMS(G)                                                                   \
    IVDEP for (int64_t i = 0; i < n; i++) {                                                \
        float g_ = (G), h_ = (x[i] - mean) * rstd;                                         \
        gb[i] = g_, hb[i] = h_, ghb[i] = g_ * h_;                                          \
    }
CPU_VECTOR_CLONES void cpu_row_layer_norm_grad_stats_f32(const row_args *r)
{
    const int64_t n = r->n;
    const float *gamma = r->nin > 4 ? r->x[4] : NULL;
#if defined(LEAF8)
    if (layer_norm_stats8_fits(r)) { /* the sums from x, dy and gamma where they lie, then dx */
        float m1[ROW_BATCH], m3[ROW_BATCH];
        layer_norm_grad_sums8_f32(r, m1, m3);
        for (int b = 0; b < r->nb; b++) {
            const float *x = (const float *)r->x[0] + b * n, *dy = (const float *)r->x[1] + b * n;
            float *y = (float *)r->y + b * n, mean = (float)r->w[b][2], rstd = (float)r->w[b][3];
            const float s1 = m1[b], s3 = m3[b];
            if (gamma) {
                IVDEP for (int64_t i = 0; i < n; i++) y[i] = rstd * (dy[i] * gamma[i] - s1 - (x[i] - mean) * rstd * s3);
            } else {
                IVDEP for (int64_t i = 0; i < n; i++) y[i] = rstd * (dy[i] - s1 - (x[i] - mean) * rstd * s3);
            }
        }
        return;
    }
#endif
    float *g = r->v[0], *h = r->v[1], *gh = (float *)r->terms, *leaf_sums = r->tmp;
    float s1[ROW_BATCH], s3[ROW_BATCH];
    for (int b = 0; b < r->nb; b++) {
        const float *x = (const float *)r->x[0] + b * n, *dy = (const float *)r->x[1] + b * n;
        float mean = (float)r->w[b][2], rstd = (float)r->w[b][3];
        float *gb = g + b * n, *hb = h + b * n, *ghb = gh + b * n;
        if (gamma) {
            LN_GRAD_TERMS(dy[i] * gamma[i])
        } else {
            LN_GRAD_TERMS(dy[i])
        }
    }
    float *sums[2] = {s1, s3};
    const float *terms[2] = {g, gh};
    for (int q = 0; q < 2; q++) {
        cpu_leaf_sums_float(terms[q], r->leaf, r->nleaves * r->nb, leaf_sums);
        for (int b = 0; b < r->nb; b++) {
            float *l = leaf_sums + b * r->nleaves;
            int k = 0;
            sums[q][b] = (r->balanced ? tree_f32(l, r->nleaves) : combine_f32(l, n, &k)) / (float)n;
        }
    }
    for (int b = 0; b < r->nb; b++) {
        const float *gb = g + b * n, *hb = h + b * n;
        float *y = (float *)r->y + b * n, rstd = (float)r->w[b][3], m1 = s1[b], m3 = s3[b];
        IVDEP for (int64_t i = 0; i < n; i++) y[i] = rstd * (gb[i] - m1 - hb[i] * m3);
    }
}
#undef LN_GRAD_TERMS

/* layer_norm in f32 as its program computes it (SUM(0, X(0)) LET(1, S(0) /
 * N) SUM(2, (X(0) - S(1)) (X(0) - S(1))) LET(3, 1 / sqrt(S(2) / N + eps))
 * OUT((X(0) - S(1)) S(3) gamma + beta)): where the rows' leaves go 8 at a
 * time (layer_norm_stats8_f32), x is read once for both sums and the
 * program's copies of x and of the squared differences into the terms
 * buffer are gone; else the generated function. The same operations in
 * the same order, the same bits (tests/test_rows.c checks them against
 * in-order loops). */
CPU_VECTOR_CLONES void cpu_row_layer_norm_f32(const row_args *r)
{
#if defined(LEAF8)
    if (layer_norm_stats8_fits(r)) {
        const int64_t n = r->n;
        float mean[ROW_BATCH], rstd[ROW_BATCH];
        layer_norm_stats8_f32(r, mean, rstd);
        const float *gamma = r->x[1], *beta = r->x[2];
        for (int b = 0; b < r->nb; b++) {
            const float *x = (const float *)r->x[0] + b * n;
            float *y = (float *)r->y + b * n, mb = mean[b], sb = rstd[b];
            if (r->nin > 2) {
                IVDEP for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mb) * sb * gamma[i] + beta[i];
            } else {
                IVDEP for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mb) * sb;
            }
        }
        return;
    }
#endif
    cpu_row_fns[IR_OP_layer_norm].f32(r);
}

/* layer_norm_mean and layer_norm_rstd in f32 (the statistics a layer_norm
 * keeps for its gradient: its program's first stages, then KEEP), from
 * layer_norm_stats8_f32 where it takes the rows, else the generated
 * functions: the same bits as layer_norm's own mean and rstd. */
static CPU_VECTOR_CLONES void layer_norm_stat_f32(const row_args *r, int op)
{
#if defined(LEAF8)
    if (layer_norm_stats8_fits(r)) {
        float mean[ROW_BATCH];
        if (op == IR_OP_layer_norm_mean) layer_norm_stats8_f32(r, r->y, NULL);
        else layer_norm_stats8_f32(r, mean, r->y);
        return;
    }
#endif
    cpu_row_fns[op].f32(r);
}

void cpu_row_layer_norm_mean_f32(const row_args *r) { layer_norm_stat_f32(r, IR_OP_layer_norm_mean); }

void cpu_row_layer_norm_rstd_f32(const row_args *r) { layer_norm_stat_f32(r, IR_OP_layer_norm_rstd); }
