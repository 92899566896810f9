/* cpu_rows.h - what the CPU's row files share: a row as a row function sees it, the tables of row functions, and the inline pieces of a SUM's pairwise sum and of MAX. */
#ifndef ALLOY_RUNTIME_CPU_CPU_ROWS_H
#define ALLOY_RUNTIME_CPU_CPU_ROWS_H

/* Every file that includes this one starts with the #pragma that turns off
 * trapping math (cpu_row_programs.c's top says why), so the inline functions
 * below get the options of the row functions that call them and still
 * inline there (base/vmath.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "runtime/cpu/cpu.h"
#if defined(__SSE2__)
#include <emmintrin.h> /* every x86-64 level has SSE2: MAX's lanes (max_of_f32) */
#endif

/* Operands, attributes, S and V slots a program may use. */
enum { ROW_MAX_IN = 6, ROW_MAX_ATTRS = 4, ROW_MAX_S = 16, ROW_MAX_V = 8, LEAF = 16, COLS = 16, LANES = 16 };
/* Short rows go to a program up to ROW_BATCH at a time (at most ROW_BATCH_ELEMS
 * elements in all, or what cpu_row_f32_batch_elems asks): each stage runs
 * over every row of the batch before the next, so a SUM's leaves of all of
 * them are added side by side (a row of 64 has only 4 leaves, one vector;
 * 4 rows fill the 16 independent chains cpu_leaf_sums_T keeps) and a
 * stage's loop overhead is paid once per batch. Every row still gets the
 * same additions in the same order: the same bits. */
enum { ROW_BATCH = 16, ROW_BATCH_ELEMS = 256 };

/* One row as a program sees it; buffers in the compute type. */
typedef struct row_args {
    int64_t n;    /* the row's length */
    int nb;       /* rows in this call: 1, or a batch of rows n apart in every r operand, V slot and y */
    int64_t row;  /* the first one's index among the op's rows (of this call) */
    int64_t rows; /* ROWS: the op's row count */
    int nin;
    const void *x[ROW_MAX_IN]; /* r operands: this row; v operands: the whole vector */
    int64_t xs[ROW_MAX_IN];    /* the distance from one row to the next in x[j]: n for r operands, else 0 */
    int64_t index[ROW_MAX_IN]; /* i operands: this row's integer */
    int64_t index_of[ROW_BATCH][ROW_MAX_IN]; /* i operands: each row's, in a batch (cpu_row_f32_batch_indexed) */
    double scalar[ROW_MAX_IN]; /* s operands */
    double w[ROW_BATCH][ROW_MAX_IN]; /* w operands: each row's value */
    double p[ROW_MAX_ATTRS];   /* the op's attributes in schema order */
    int rank;
    const int64_t *dims; /* the shape the rows come from (its last dim is the row) */
    int64_t pos[ALLOY_MAX_RANK]; /* POS(k): this row's index along the k-th dim from the end (k >= 1) */
    void *v[ROW_MAX_V];
    void *tmp, *terms, *y, *result, *weight;
    /* the pairwise sum's tree over a row: its leaves' lengths in order
     * (nleaves of them, then the same again for each further row of the batch) */
    const int64_t *leaf;
    int nleaves;
    bool balanced; /* nleaves is a power of 2 and every leaf as long: the tree is complete */
    /* each row's live columns (ir_row_causal): n, or for causal rows their
     * ir_causal_live; MAX, SUM and MAP see only those, OUT stores 0 past them.
     * A causal row's SUM adds its first live_leaves[b] leaves (the last one's
     * terms past the live ones are 0, up to column pad[b]) and takes 0 for the
     * rest: the tree of the whole row, whose dead leaves added 0, the same bits */
    bool causal;
    int64_t live[ROW_BATCH], pad[ROW_BATCH];
    int live_leaves[ROW_BATCH];
} row_args;

/* IVDEP: a loop's stores go to a buffer that shares no bytes with what its
 * e reads elsewhere than at column i (cpu_row_run sees to it for the result's
 * row), so GCC may vectorize without checking */
#if defined(__GNUC__) && !defined(__clang__)
#define IVDEP _Pragma("GCC ivdep")
#else
#define IVDEP
#endif

typedef void (*row_fn)(const row_args *r);

/* The function of each RW line of ops.def, for f32 and for f64 compute
 * (cpu_row_programs.c); ops without a row program have none. */
AL_HIDDEN extern const struct row_fn_pair {
    row_fn f32, f64;
} cpu_row_fns[IR_OP_COUNT];
/* f32 row functions written out by hand in place of cpu_row_fns[op].f32
 * where not NULL (cpu_row_by_hand.c): the same bits. */
AL_HIDDEN extern const row_fn cpu_row_f32_by_hand[IR_OP_COUNT];
/* layer_norm, layer_norm_mean, layer_norm_rstd and layer_norm_grad_stats
 * of f32 rows, by hand (cpu_row_layer_norm.c; in cpu_row_f32_by_hand):
 * the bits of cpu_row_fns[op].f32, which they call for the rows their own
 * code does not take. */
AL_HIDDEN void cpu_row_layer_norm_f32(const row_args *r);
AL_HIDDEN void cpu_row_layer_norm_mean_f32(const row_args *r);
AL_HIDDEN void cpu_row_layer_norm_rstd_f32(const row_args *r);
AL_HIDDEN void cpu_row_layer_norm_grad_stats_f32(const row_args *r);
/* Elements of short rows per call (at most ROW_BATCH rows) of op's f32
 * function: ROW_BATCH_ELEMS, or more for those by hand whose row is a chain
 * of dependent steps, to run several rows side by side (cpu_row_by_hand.c). */
AL_HIDDEN int64_t cpu_row_f32_batch_elems(int op);
/* Whether op's f32 function by hand takes batches of rows with i operands
 * (each row's in index_of) and one result per row (each row's at result +
 * b and weight + b): cpu_row_run batches such rows only for it. */
AL_HIDDEN bool cpu_row_f32_batch_indexed(int op);
/* A SUM's leaf sums: out[l] = the terms t of leaf l (of the nleaves whose
 * lengths leaf[] lists, one after another in t) added in order from 0
 * (cpu_row_programs.c). */
AL_HIDDEN void cpu_leaf_sums_float(const float *t, const int64_t *leaf, int nleaves, float *out);
/* The leaves of the pairwise tree of a sum of n terms (n > LEAF: the
 * halves n / 2 and n - n / 2, in order), their lengths written from
 * len[k] on (at most n / 8 + 1 of them); returns k plus their count. */
AL_HIDDEN int cpu_leaf_plan(int64_t n, int64_t *len, int k);
AL_HIDDEN void cpu_leaf_sums_double(const double *t, const int64_t *leaf, int nleaves, double *out);

/* Pairwise sums: rounding error grows with log(n). sum_T(v, n) adds runs of
 * at most LEAF values in order and splits longer ones in halves; a program's
 * SUM does the same over its terms: cpu_leaf_plan lists the leaves of that tree
 * for a row of n (those two: cpu_rows.c), cpu_leaf_sums_T adds each leaf's
 * terms in order, and combine_T (or levels_T, for a complete tree) adds the
 * leaf sums as sum_T would. */
static inline float combine_f32(const float *leaf_sums, int64_t n, int *k)
{
    if (n <= LEAF) return leaf_sums[(*k)++];
    float a = combine_f32(leaf_sums, n / 2, k);
    return a + combine_f32(leaf_sums, n - n / 2, k);
}

static inline double combine_f64(const double *leaf_sums, int64_t n, int *k)
{
    if (n <= LEAF) return leaf_sums[(*k)++];
    double a = combine_f64(leaf_sums, n / 2, k);
    return a + combine_f64(leaf_sums, n - n / 2, k);
}

/* combine_T over a complete tree: pairs of neighbours, level by level (the
 * same additions; in place, no recursion). */
#define LEVELS(T_)                                                                         \
    static inline T_ levels_##T_(T_ *v, int nleaves)                                       \
    {                                                                                      \
        for (int w = nleaves; w > 1; w /= 2)                                               \
            for (int i = 0; i < w / 2; i++) v[i] = v[2 * i] + v[2 * i + 1];                \
        return v[0];                                                                       \
    }
LEVELS(float)
LEVELS(double)

/* f32 leaves of LEAF terms, 4 side by side in a vector: each group of 4
 * leaves' terms read as 4 vectors of 4 neighbours, a 4 x 4 transpose turns
 * them into 4 vectors of one term of each leaf, added in order; 4 groups
 * (16 leaves) at a time hide the additions' latency. Contiguous loads and
 * shuffles instead of a load per term and lane: the same additions in the
 * same order, the same bits. GCC's vector extension, so every ISA level
 * (SSE2 included) has it; elsewhere the loops below. */
#if defined(__GNUC__) && !defined(__clang__)
#define LEAF_TRANSPOSE 1
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f load4(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* acc (lane l: leaf l of 4 leaves) += terms j..j+3 of each, given as
 * a, b, c, d (those of leaves 0-3), one term of every leaf per addition */
static inline v4f add4_vectors(v4f acc, v4f a, v4f b, v4f c, v4f d)
{
    v4f ab_lo = __builtin_shuffle(a, b, (v4i){0, 4, 1, 5}), ab_hi = __builtin_shuffle(a, b, (v4i){2, 6, 3, 7});
    v4f cd_lo = __builtin_shuffle(c, d, (v4i){0, 4, 1, 5}), cd_hi = __builtin_shuffle(c, d, (v4i){2, 6, 3, 7});
    acc += __builtin_shuffle(ab_lo, cd_lo, (v4i){0, 1, 4, 5});
    acc += __builtin_shuffle(ab_lo, cd_lo, (v4i){2, 3, 6, 7});
    acc += __builtin_shuffle(ab_hi, cd_hi, (v4i){0, 1, 4, 5});
    acc += __builtin_shuffle(ab_hi, cd_hi, (v4i){2, 3, 6, 7});
    return acc;
}

/* acc (lane l: leaf l of the 4 leaves of LEAF terms at base) += their
 * terms j..j+3 */
static inline v4f add4_terms(v4f acc, const float *base, int j)
{
    return add4_vectors(acc, load4(base + j), load4(base + LEAF + j), load4(base + 2 * LEAF + j),
                        load4(base + 3 * LEAF + j));
}

/* the same for the terms p[i] * q[i] of the 4 leaves at p and q, each
 * product rounded to float before it is added, as a stored term is */
static inline v4f add4_products(v4f acc, const float *p, const float *q, int j)
{
    v4f a = load4(p + j) * load4(q + j), b = load4(p + LEAF + j) * load4(q + LEAF + j);
    v4f c = load4(p + 2 * LEAF + j) * load4(q + 2 * LEAF + j), d = load4(p + 3 * LEAF + j) * load4(q + 3 * LEAF + j);
    return add4_vectors(acc, a, b, c, d);
}

/* leaf_groups_f32 over the terms p[i] * q[i] */
static inline int leaf_groups_products_f32(const float *p, const float *q, int m, float *o)
{
    int k = 0;
    for (; k + 8 <= m; k += 8) {
        const float *bp = p + (int64_t)k * LEAF, *bq = q + (int64_t)k * LEAF;
        v4f s0 = {0}, s1 = {0};
        for (int j = 0; j < LEAF; j += 4) {
            s0 = add4_products(s0, bp, bq, j);
            s1 = add4_products(s1, bp + 4 * LEAF, bq + 4 * LEAF, j);
        }
        memcpy(o + k, &s0, sizeof s0), memcpy(o + k + 4, &s1, sizeof s1);
    }
    for (; k + 4 <= m; k += 4) {
        v4f s0 = {0};
        for (int j = 0; j < LEAF; j += 4) s0 = add4_products(s0, p + (int64_t)k * LEAF, q + (int64_t)k * LEAF, j);
        memcpy(o + k, &s0, sizeof s0);
    }
    return k;
}

/* The sums of m leaves of LEAF terms at t into o[0..m) (m a multiple of 4);
 * returns m. */
static inline int leaf_groups_f32(const float *t, int m, float *o)
{
    int k = 0;
    for (; k + 16 <= m; k += 16) {
        const float *b = t + (int64_t)k * LEAF;
        v4f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (int j = 0; j < LEAF; j += 4) {
            s0 = add4_terms(s0, b, j);
            s1 = add4_terms(s1, b + 4 * LEAF, j);
            s2 = add4_terms(s2, b + 8 * LEAF, j);
            s3 = add4_terms(s3, b + 12 * LEAF, j);
        }
        memcpy(o + k, &s0, sizeof s0), memcpy(o + k + 4, &s1, sizeof s1);
        memcpy(o + k + 8, &s2, sizeof s2), memcpy(o + k + 12, &s3, sizeof s3);
    }
    for (; k + 4 <= m; k += 4) {
        v4f s0 = {0};
        for (int j = 0; j < LEAF; j += 4) s0 = add4_terms(s0, t + (int64_t)k * LEAF, j);
        memcpy(o + k, &s0, sizeof s0);
    }
    return k;
}
/* levels_float over 8 leaf sums or more, 4 new sums at a time: the
 * neighbours of 8 sums split into their even and odd ones by two shuffles
 * and added (the same additions, in place); the last 4 as levels_float. */
static inline float levels_f32(float *v, int nleaves)
{
    int w = nleaves;
    for (; w >= 8; w /= 2)
        for (int i = 0; i < w / 2; i += 4) {
            v4f a = load4(v + 2 * i), b = load4(v + 2 * i + 4);
            v4f sum = __builtin_shuffle(a, b, (v4i){0, 2, 4, 6}) + __builtin_shuffle(a, b, (v4i){1, 3, 5, 7});
            memcpy(v + i, &sum, sizeof sum);
        }
    return levels_float(v, w);
}
#define LEAF_GROUPS(T_, base, m, o) (sizeof(T_) == sizeof(float) ? leaf_groups_f32((const float *)(const void *)(base), (m) & ~3, (float *)(void *)(o)) : 0)
#define LEAF_GROUPS_PRODUCTS(p, q, m, o) leaf_groups_products_f32(p, q, (m) & ~3, o)
#else
#define LEAF_GROUPS(T_, base, m, o) 0
#define LEAF_GROUPS_PRODUCTS(p, q, m, o) 0
#define levels_f32 levels_float
#endif

/* The largest of v[0..n) as the in-order loop `if (v > m || v != v) m = v`
 * from -inf finds it (NaN wins, the first of equal zeros): by lanes of
 * LANES (v > largest ? v : largest), the lanes and the rest then combined;
 * a NaN among them (nan counts them) or a largest of 0 takes the in-order
 * loop. Infinities need no loop of their own: -inf never replaces the
 * largest, +inf always does, in either order (a causal mask's -inf scores
 * are in most rows of an attention's softmax). The f32 lanes are 16-byte
 * vectors (GCC's vector extension: its compare and select stay vector
 * code on every ISA level, where GCC made the array form scalar conditional
 * moves). */
#define MAX_TAIL(T_)                                                                       \
    for (; i_ < n; i_++) {                                                                 \
        nan += v[i_] != v[i_];                                                             \
        m_ = v[i_] > m_ ? v[i_] : m_;                                                      \
    }                                                                                      \
    if (nan || m_ == 0) {                                                                  \
        m_ = -INFINITY;                                                                    \
        for (int64_t j_ = 0; j_ < n && m_ == m_; j_++)                                     \
            if (v[j_] > m_ || v[j_] != v[j_]) m_ = v[j_];                                  \
    }                                                                                      \
    return m_;

/* The largest of v[0..n) in T by LANES lanes (a select per lane, NaNs
 * counted), then MAX_TAIL: the body of max_of_f64, and of max_of_f32
 * where SSE is not there. */
#define MAX_BY_LANES(T)                                                                    \
    T l_[LANES];                                                                           \
    int64_t nans[LANES];                                                                   \
    for (int q_ = 0; q_ < LANES; q_++) l_[q_] = -INFINITY, nans[q_] = 0;                   \
    int64_t i_ = 0;                                                                        \
    for (; i_ + LANES <= n; i_ += LANES)                                                   \
        for (int q_ = 0; q_ < LANES; q_++) {                                               \
            T v_ = v[i_ + q_];                                                             \
            nans[q_] += v_ != v_;                                                          \
            l_[q_] = v_ > l_[q_] ? v_ : l_[q_];                                            \
        }                                                                                  \
    T m_ = -INFINITY;                                                                      \
    int64_t nan = 0;                                                                       \
    for (int q_ = 0; q_ < LANES; q_++) {                                                   \
        nan += nans[q_];                                                                   \
        m_ = l_[q_] > m_ ? l_[q_] : m_;                                                    \
    }                                                                                      \
    MAX_TAIL(T)

static inline double max_of_f64(const double *v, int64_t n) { MAX_BY_LANES(double) }

#if defined(__SSE2__)
/* lanes 4a..4a+3 in la: SSE's maxps is x > l ? x : l, lane by lane (and
 * every x86-64 level has it; GCC's vector extension spilled the select's
 * masks to memory); nans: all ones in the lanes that saw a NaN */
static inline float max_of_f32(const float *v, int64_t n)
{
    __m128 l0 = _mm_set1_ps(-INFINITY), l1 = l0, l2 = l0, l3 = l0, nans = _mm_setzero_ps();
    int64_t i_ = 0;
    for (; i_ + LANES <= n; i_ += LANES) {
        __m128 x0 = _mm_loadu_ps(v + i_), x1 = _mm_loadu_ps(v + i_ + 4), x2 = _mm_loadu_ps(v + i_ + 8),
               x3 = _mm_loadu_ps(v + i_ + 12);
        l0 = _mm_max_ps(x0, l0), l1 = _mm_max_ps(x1, l1), l2 = _mm_max_ps(x2, l2), l3 = _mm_max_ps(x3, l3);
        nans = _mm_or_ps(nans, _mm_or_ps(_mm_cmpunord_ps(x0, x1), _mm_cmpunord_ps(x2, x3)));
    }
    float lanes[LANES];
    _mm_storeu_ps(lanes, l0), _mm_storeu_ps(lanes + 4, l1), _mm_storeu_ps(lanes + 8, l2), _mm_storeu_ps(lanes + 12, l3);
    float m_ = -INFINITY;
    int64_t nan = _mm_movemask_ps(nans) != 0;
    for (int q_ = 0; q_ < LANES; q_++) m_ = lanes[q_] > m_ ? lanes[q_] : m_;
    MAX_TAIL(float)
}
#else
static inline float max_of_f32(const float *v, int64_t n) { MAX_BY_LANES(float) }
#endif

#endif
