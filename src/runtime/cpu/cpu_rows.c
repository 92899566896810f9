/* cpu_rows.c - the row ops on the CPU: one function per RW line of ops.def, generated from its program, and the driver that feeds it rows. */
/* No trapping math here (as in cpu_elementwise.c): the stages' loops, exp
 * included (base/vmath.h), then vectorize on every ISA level. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <string.h>
#include <tgmath.h>

#include "base/convert.h"
#include "base/vmath_generic.h" /* float exp/erf/tanh as every f32 evaluation of ops.def computes them */
#include "ir/groups.h" /* ir_row_causal, ir_causal_live */
#include "runtime/cpu/cpu.h"
#if defined(__SSE2__)
#include <emmintrin.h> /* every x86-64 level has SSE2: MAX's lanes (max_of_f32) */
#endif

/* Operands, attributes, S and V slots a program may use. */
enum { ROW_MAX_IN = 6, ROW_MAX_ATTRS = 4, ROW_MAX_S = 16, ROW_MAX_V = 8, LEAF = 16, COLS = 16, LANES = 16 };
/* Short rows go to a program up to ROW_BATCH at a time (at most ROW_BATCH_ELEMS
 * elements in all): each stage runs over every row of the batch before the
 * next, so a SUM's leaves of all of them are added side by side (a row of
 * 64 has only 4 leaves, one vector; 4 rows fill the 16 independent chains
 * leaf_sums_T keeps) and a stage's loop overhead is paid once per batch.
 * Every row still gets the same additions in the same order: the same
 * bits. */
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

/* Fills r->pos for row r->row (once per row, for programs that read POS). */
static void set_positions(row_args *r)
{
    int64_t q = r->row;
    for (int k = 1; k < r->rank; k++) {
        r->pos[k] = q % r->dims[r->rank - 1 - k];
        q /= r->dims[r->rank - 1 - k];
    }
}

/* Pairwise sums: rounding error grows with log(n). sum_T(v, n) adds runs of
 * at most LEAF values in order and splits longer ones in halves; a program's
 * SUM does the same over its terms: leaf_plan lists the leaves of that tree
 * for a row of n, leaf_sums_T adds each leaf's terms in order, and
 * combine_T (or levels_T, for a complete tree) adds the leaf sums as sum_T
 * would. */
static float sum_f32(const float *v, int64_t n)
{
    if (n > LEAF) return sum_f32(v, n / 2) + sum_f32(v + n / 2, n - n / 2);
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return s;
}

static double sum_f64(const double *v, int64_t n)
{
    if (n > LEAF) return sum_f64(v, n / 2) + sum_f64(v + n / 2, n - n / 2);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return s;
}

static int leaf_plan(int64_t n, int64_t *len, int k)
{
    if (n > LEAF) return leaf_plan(n - n / 2, len, leaf_plan(n / 2, len, k));
    len[k] = n;
    return k + 1;
}

static float combine_f32(const float *leaf_sums, int64_t n, int *k)
{
    if (n <= LEAF) return leaf_sums[(*k)++];
    float a = combine_f32(leaf_sums, n / 2, k);
    return a + combine_f32(leaf_sums, n - n / 2, k);
}

static double combine_f64(const double *leaf_sums, int64_t n, int *k)
{
    if (n <= LEAF) return leaf_sums[(*k)++];
    double a = combine_f64(leaf_sums, n / 2, k);
    return a + combine_f64(leaf_sums, n - n / 2, k);
}

/* combine_T over a complete tree: pairs of neighbours, level by level (the
 * same additions; in place, no recursion). */
#define LEVELS(T_)                                                                         \
    static T_ levels_##T_(T_ *v, int nleaves)                                              \
    {                                                                                      \
        for (int w = nleaves; w > 1; w /= 2)                                               \
            for (int i = 0; i < w / 2; i++) v[i] = v[2 * i] + v[2 * i + 1];                \
        return v[0];                                                                       \
    }
LEVELS(float)
LEVELS(double)

/* The leaf sums of a SUM: leaf_sums_T(t, leaf, nleaves, out) sets out[l]
 * to the terms of leaf l added in order from 0, as a running sum over the
 * row would. Consecutive leaves of the same length are added side by side
 * (a vector of leaves, one term of each per step): the same additions in
 * the same order per leaf, so the same bits as one leaf after another. */
#define LEAF_BLOCKS(T_, W, L)                                                              \
    for (; k0 + (W) <= m; k0 += (W)) {                                                     \
        T_ acc[W] = {0};                                                                   \
        for (int64_t j = 0; j < (L); j++)                                                  \
            for (int k = 0; k < (W); k++) acc[k] += base[(k0 + k) * (L) + j];              \
        for (int k = 0; k < (W); k++) o[k0 + k] = acc[k];                                  \
    }
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

#define LEAF_SUMS(T_)                                                                      \
    static CPU_VECTOR_CLONES void leaf_sums_##T_(const T_ *t, const int64_t *leaf, int nleaves, T_ *out) \
    {                                                                                      \
        int64_t at = 0;                                                                    \
        for (int l = 0; l < nleaves;) {                                                    \
            int64_t len = leaf[l];                                                         \
            int m = 1;                                                                     \
            while (l + m < nleaves && leaf[l + m] == len) m++;                             \
            T_ *o = out + l;                                                               \
            const T_ *base = t + at;                                                       \
            int k0 = 0;                                                                    \
            if (len == LEAF) { /* 16, 8 or 4 leaves at a time, in registers */             \
                k0 = LEAF_GROUPS(T_, base, m, o);                                          \
                LEAF_BLOCKS(T_, 16, LEAF)                                                  \
                LEAF_BLOCKS(T_, 8, LEAF)                                                   \
                LEAF_BLOCKS(T_, 4, LEAF)                                                   \
            } else {                                                                       \
                LEAF_BLOCKS(T_, 16, len)                                                   \
                LEAF_BLOCKS(T_, 4, len)                                                    \
            }                                                                              \
            for (int k = k0; k < m; k++) { /* the rest one by one */                       \
                T_ a = 0;                                                                  \
                for (int64_t j = 0; j < len; j++) a += base[(int64_t)k * len + j];         \
                o[k] = a;                                                                  \
            }                                                                              \
            at += (int64_t)m * len;                                                        \
            l += m;                                                                        \
        }                                                                                  \
    }
LEAF_SUMS(float)
LEAF_SUMS(double)

/* leaf_sums_float over the terms p[i] * q[i] (each product rounded to
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

/* ---- the programs, expanded for T = float and double ---- */

#define X(j) xb_[j][i]
#define V(k) ((T *)r->v[k])[b_ * r->n + i]
#define S(k) s_[k][b_]
#define N ((T)r->n)
#define COL i
#define P(k) ((T)r->p[k])
#define HAS(j) ((j) < r->nin)
#define INDEX(j) r->index[j]
#define AT(j, c) xb_[j][c]
#define SCALAR(j) ((T)r->scalar[j])
#define W(j) ((T)r->w[b_][j])
#define ROWS r->rows
#define POS(k) r->pos[k]
#define DIM(k) r->dims[r->rank - 1 - (k)]

/* Each stage runs over the call's rows in turn (EACH_ROW: row b_, its
 * operands' rows at xb_). MAX: the terms into r->terms (a vector loop),
 * then MAX_OF: their largest by lanes of LANES; a NaN among them, or a
 * largest value of 0 (whose sign the first such term decides), takes the
 * row's in-order loop instead, so the result is that loop's bits. SUM: the
 * terms of every row into r->terms, row after row, then the leaf sums of all
 * of them at once (the leaf list holds each row's leaves in turn), then each
 * row's leaf sums combined. */
#define EACH_ROW_DO(...)                                                                   \
    for (int b_ = 0; b_ < r->nb; b_++) {                                                   \
        const T *xb_[ROW_MAX_IN];                                                          \
        for (int j_ = 0; j_ < ROW_MAX_IN; j_++) xb_[j_] = x_[j_] + b_ * xs_[j_];           \
        (void)xb_;                                                                         \
        __VA_ARGS__                                                                        \
    }
#define MAX(k, e)                                                                          \
    {                                                                                      \
        T *e_ = (T *)r->terms;                                                             \
        EACH_ROW_DO({                                                                      \
            const int64_t n_ = r->live[b_];                                                \
            IVDEP for (int64_t i = 0; i < n_; i++) e_[i] = (T)(e);                         \
            s_[k][b_] = MAX_OF(e_, n_);                                                    \
        })                                                                                 \
    }
#define SUM(k, e)                                                                          \
    {                                                                                      \
        T *e_ = (T *)r->terms;                                                             \
        EACH_ROW_DO({                                                                      \
            T *t_ = e_ + b_ * r->n;                                                        \
            const int64_t n_ = r->live[b_];                                                \
            IVDEP for (int64_t i = 0; i < n_; i++) t_[i] = (T)(e);                         \
            for (int64_t i = n_; i < r->pad[b_]; i++) t_[i] = 0;                           \
        })                                                                                 \
        if (!r->causal)                                                                    \
            LEAF_SUM(e_, r->leaf, r->nleaves * r->nb, (T *)r->tmp);                        \
        else                                                                               \
            for (int b_ = 0; b_ < r->nb; b_++) {                                           \
                T *l_ = (T *)r->tmp + b_ * r->nleaves;                                     \
                LEAF_SUM(e_ + b_ * r->n, r->leaf, r->live_leaves[b_], l_);                 \
                for (int q_ = r->live_leaves[b_]; q_ < r->nleaves; q_++) l_[q_] = 0;       \
            }                                                                              \
        for (int b_ = 0; b_ < r->nb; b_++) {                                               \
            T *l_ = (T *)r->tmp + b_ * r->nleaves;                                         \
            int k_ = 0;                                                                    \
            s_[k][b_] = r->balanced ? LEVELS_OF(l_, r->nleaves) : COMBINE(l_, r->n, &k_);  \
        }                                                                                  \
    }
#define LET(k, e)                                                                          \
    EACH_ROW_DO({                                                                          \
        const int64_t i = 0;                                                               \
        (void)i;                                                                           \
        s_[k][b_] = (T)(e);                                                                \
    })
#define MAP(k, e)                                                                          \
    EACH_ROW_DO({                                                                          \
        T *v_ = (T *)r->v[k] + b_ * r->n;                                                  \
        const int64_t n_ = r->live[b_];                                                    \
        IVDEP for (int64_t i = 0; i < n_; i++) v_[i] = (T)(e);                             \
    })
/* IVDEP: a loop's stores go to a buffer that shares no bytes with what its
 * e reads elsewhere than at column i (cpu_row_run sees to it for the result's
 * row), so GCC may vectorize without checking */
#if defined(__GNUC__) && !defined(__clang__)
#define IVDEP _Pragma("GCC ivdep")
#else
#define IVDEP
#endif
#define OUT(e)                                                                             \
    EACH_ROW_DO({                                                                          \
        T *y_ = (T *)r->y + b_ * r->n;                                                     \
        const int64_t n_ = r->live[b_];                                                    \
        IVDEP for (int64_t i = 0; i < n_; i++) y_[i] = (T)(e);                             \
        for (int64_t i = n_; i < r->n; i++) y_[i] = 0;                                     \
    })
/* the per-row values (a program with one of these gets one row per call) */
#define RESULT(e)                                                                          \
    EACH_ROW_DO({                                                                          \
        const int64_t i = 0;                                                               \
        (void)i;                                                                           \
        *(T *)r->result = (T)(e);                                                          \
    })
#define KEEP(e)                                                                            \
    EACH_ROW_DO({                                                                          \
        const int64_t i = 0;                                                               \
        (void)i;                                                                           \
        *(T *)r->y = (T)(e);                                                               \
    })
#define WEIGHT(e)                                                                          \
    EACH_ROW_DO({                                                                          \
        const int64_t i = 0;                                                               \
        (void)i;                                                                           \
        *(T *)r->weight = (T)(e);                                                          \
    })

/* The operands as T; one not given reads operand 0's row instead, so a
 * `HAS(j) ? ..X(j).. : ..` loads only from memory it may read and its loop
 * vectorizes with a select (the value read is not used). */
#define ROW_OPERANDS                                                                       \
    const T *x_[ROW_MAX_IN];                                                               \
    int64_t xs_[ROW_MAX_IN];                                                               \
    for (int j_ = 0; j_ < ROW_MAX_IN; j_++) {                                              \
        x_[j_] = j_ < r->nin ? r->x[j_] : r->x[0];                                         \
        xs_[j_] = j_ < r->nin ? r->xs[j_] : r->xs[0];                                      \
    }

typedef void (*row_fn)(const row_args *r);
#define OP(...)
#define EW(...)
#define RW(nm, mn, mx, at, ty, amp, grad, roles, program)                                  \
    static CPU_VECTOR_CLONES void row_##nm##_f32(const row_args *r)                        \
    {                                                                                      \
        typedef float T;                                                                   \
        T s_[ROW_MAX_S][ROW_BATCH];                                                        \
        (void)s_;                                                                          \
        ROW_OPERANDS                                                                       \
        program                                                                            \
    }                                                                                      \
    static CPU_VECTOR_CLONES void row_##nm##_f64(const row_args *r)                        \
    {                                                                                      \
        typedef double T;                                                                  \
        T s_[ROW_MAX_S][ROW_BATCH];                                                        \
        (void)s_;                                                                          \
        ROW_OPERANDS                                                                       \
        program                                                                            \
    }
#define LEAF_SUM(t, l, nl, o) _Generic((t), float *: leaf_sums_float, double *: leaf_sums_double)(t, l, nl, o)
#define LEVELS_OF(v, nl) _Generic((v), float *: levels_f32, double *: levels_double)(v, nl)
#define MAX_OF(v, n) _Generic((v), float *: max_of_f32, double *: max_of_f64)(v, n)
#define COMBINE(v, n, k) _Generic((v), float *: combine_f32, double *: combine_f64)(v, n, k)
#include "ir/ops.def"
#undef RW

static const struct {
    row_fn f32, f64;
} row_fns[IR_OP_COUNT] = {
#define RW(nm, ...) [IR_OP_##nm] = {row_##nm##_f32, row_##nm##_f64},
#include "ir/ops.def"
#undef RW
};
#undef OP
#undef EW

/* The leaf sums of two SUMs at once, 8 leaves of LEAF terms side by side
 * in a 32-byte vector: each 8 x 8 block of terms transposed in registers
 * (unpacks, shufps, 128-bit halves) and added one term of every leaf per
 * addition, so each leaf is still added in order from 0: the same bits as
 * leaf_sums_float. Both SUMs' chains (4 in all for 16 leaves) run side by
 * side. Only where the CPU has x86-64-v3 (AVX2): GCC makes scalar code of
 * these shuffles for SSE2, whose clone keeps leaf_sums_float's 4 x 4
 * transposes. oa and ob: 2 m floats in all. wide_leaves() says whether to call it: the library's v3 and v4
 * clones run where __builtin_cpu_supports("x86-64-v3") holds, and a build
 * without clones for one level (bench/row_isa_level.c) knows its own. */
#if defined(LEAF_TRANSPOSE) && defined(__x86_64__)
#define LEAF8 1
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8f_unaligned __attribute__((vector_size(32), aligned(4), may_alias));
#define LOAD8(p) (*(const v8f_unaligned *)(const void *)(p)) /* straight from memory, not through a copy */
#define SH8(a, b, ...) __builtin_shuffle(a, b, (v8i){__VA_ARGS__})
/* acc (lane l: leaf l of the 8 leaves of LEAF terms at base) += their terms j..j+7 in order */
#define ADD8_TERMS(acc, base, j)                                                           \
    {                                                                                      \
        const float *p_ = (base) + (j);                                                    \
        v8f a_[8] = {LOAD8(p_), LOAD8(p_ + LEAF), LOAD8(p_ + 2 * LEAF), LOAD8(p_ + 3 * LEAF),  \
                     LOAD8(p_ + 4 * LEAF), LOAD8(p_ + 5 * LEAF), LOAD8(p_ + 6 * LEAF), LOAD8(p_ + 7 * LEAF)}; \
        v8f t0 = SH8(a_[0], a_[1], 0, 8, 1, 9, 4, 12, 5, 13), t1 = SH8(a_[0], a_[1], 2, 10, 3, 11, 6, 14, 7, 15); \
        v8f t2 = SH8(a_[2], a_[3], 0, 8, 1, 9, 4, 12, 5, 13), t3 = SH8(a_[2], a_[3], 2, 10, 3, 11, 6, 14, 7, 15); \
        v8f t4 = SH8(a_[4], a_[5], 0, 8, 1, 9, 4, 12, 5, 13), t5 = SH8(a_[4], a_[5], 2, 10, 3, 11, 6, 14, 7, 15); \
        v8f t6 = SH8(a_[6], a_[7], 0, 8, 1, 9, 4, 12, 5, 13), t7 = SH8(a_[6], a_[7], 2, 10, 3, 11, 6, 14, 7, 15); \
        v8f u0 = SH8(t0, t2, 0, 1, 8, 9, 4, 5, 12, 13), u1 = SH8(t0, t2, 2, 3, 10, 11, 6, 7, 14, 15); \
        v8f u2 = SH8(t1, t3, 0, 1, 8, 9, 4, 5, 12, 13), u3 = SH8(t1, t3, 2, 3, 10, 11, 6, 7, 14, 15); \
        v8f u4 = SH8(t4, t6, 0, 1, 8, 9, 4, 5, 12, 13), u5 = SH8(t4, t6, 2, 3, 10, 11, 6, 7, 14, 15); \
        v8f u6 = SH8(t5, t7, 0, 1, 8, 9, 4, 5, 12, 13), u7 = SH8(t5, t7, 2, 3, 10, 11, 6, 7, 14, 15); \
        acc += SH8(u0, u4, 0, 1, 2, 3, 8, 9, 10, 11);                                      \
        acc += SH8(u1, u5, 0, 1, 2, 3, 8, 9, 10, 11);                                      \
        acc += SH8(u2, u6, 0, 1, 2, 3, 8, 9, 10, 11);                                      \
        acc += SH8(u3, u7, 0, 1, 2, 3, 8, 9, 10, 11);                                      \
        acc += SH8(u0, u4, 4, 5, 6, 7, 12, 13, 14, 15);                                    \
        acc += SH8(u1, u5, 4, 5, 6, 7, 12, 13, 14, 15);                                    \
        acc += SH8(u2, u6, 4, 5, 6, 7, 12, 13, 14, 15);                                    \
        acc += SH8(u3, u7, 4, 5, 6, 7, 12, 13, 14, 15);                                    \
    }
/* o1[0..m), o2[0..m): the sums of the m leaves of LEAF terms at t1, t2 (m a multiple of 8) */
__attribute__((target("avx2,fma"))) static void leaf8_sums2_f32(const float *ta, const float *tb, int m, float *oa,
                                                                float *ob)
{
    for (int q = 0; q < 2; q++) {
        const float *t = q ? tb : ta;
        float *o = q ? ob : oa;
        int k = 0;
        for (; k + 16 <= m; k += 16) {
            const float *b = t + (int64_t)k * LEAF;
            v8f s0 = {0}, s1 = {0};
            for (int j = 0; j < LEAF; j += 8) {
                ADD8_TERMS(s0, b, j)
                ADD8_TERMS(s1, b + 8 * LEAF, j)
            }
            memcpy(o + k, &s0, sizeof s0), memcpy(o + k + 8, &s1, sizeof s1);
        }
        for (; k + 8 <= m; k += 8) {
            v8f s0 = {0};
            for (int j = 0; j < LEAF; j += 8) ADD8_TERMS(s0, t + (int64_t)k * LEAF, j)
            memcpy(o + k, &s0, sizeof s0);
        }
    }
}
#undef ADD8_TERMS
#undef LOAD8
#undef SH8
static bool wide_leaves(void)
{
#if defined(ALLOY_NO_VECTOR_CLONES)
#if defined(__AVX2__) && defined(__FMA__)
    return true;
#else
    return false;
#endif
#else
    return __builtin_cpu_supports("x86-64-v3");
#endif
}
#endif

/* levels_f32's sum of a complete tree of up to 16 leaf sums, in
 * registers: the same pairs of neighbours level by level, without the
 * stores and reloads between levels (a chain of store-to-load forwards,
 * which cost a row of 64's 4 leaves more than their additions). */
static inline float tree_f32(const float *v, int nleaves)
{
    switch (nleaves) {
    case 1: return v[0];
    case 2: return v[0] + v[1];
    case 4: return (v[0] + v[1]) + (v[2] + v[3]);
    case 8: return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    case 16:
        return (((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]))) +
               (((v[8] + v[9]) + (v[10] + v[11])) + ((v[12] + v[13]) + (v[14] + v[15])));
    default: return levels_f32((float *)v, nleaves);
    }
}

/* layer_norm_grad_stats in f32 as its program computes it: g = dy gamma,
 * h = (x - mean) rstd and the second SUM's terms g h in one pass over the
 * row (the first SUM's terms are g itself), the leaves of each SUM added in
 * one call for the whole batch, each row's leaf sums combined in registers,
 * then dx = rstd (g - mean(g) - h mean(g h)): two passes over each row, the
 * same operations in the same order as the program, the same bits
 * (tests/test_rows.c checks them against in-order loops). */
#define LN_GRAD_TERMS(G)                                                                   \
    IVDEP for (int64_t i = 0; i < n; i++) {                                                \
        float g_ = (G), h_ = (x[i] - mean) * rstd;                                         \
        gb[i] = g_, hb[i] = h_, ghb[i] = g_ * h_;                                          \
    }
static CPU_VECTOR_CLONES void row_layer_norm_grad_stats_one_pass_f32(const row_args *r)
{
    const int64_t n = r->n;
    const float *gamma = r->nin > 4 ? r->x[4] : NULL;
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
    int m = r->nleaves * r->nb;
    /* both SUMs' leaves at once where they are leaves of LEAF: r->tmp holds a
     * batch's elements, 16 times their leaves, room for both; else one SUM
     * after the other in the same place */
    float *leaf_sums2 = leaf_sums;
#if defined(LEAF8)
    bool both = r->balanced && r->leaf[0] == LEAF && m % 8 == 0 && wide_leaves();
    if (both) leaf_sums2 = leaf_sums + m, leaf8_sums2_f32(g, gh, m, leaf_sums, leaf_sums2);
#else
    bool both = false;
#endif
    for (int q = 0; q < 2; q++) {
        float *ls = q ? leaf_sums2 : leaf_sums;
        if (!both) leaf_sums_float(terms[q], r->leaf, m, ls);
        for (int b = 0; b < r->nb; b++) {
            float *l = ls + b * r->nleaves;
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

/* The sum of a row's terms t[0..n) as a SUM adds them (the leaf list of
 * one row, n as r->n). */
static inline float row_sum_f32(const row_args *r, const float *t, float *leaf_sums)
{
    leaf_sums_float(t, r->leaf, r->nleaves, leaf_sums);
    int k = 0;
    return r->balanced ? tree_f32(leaf_sums, r->nleaves) : combine_f32(leaf_sums, r->n, &k);
}

/* cross_entropy in f32 without class weights or label smoothing (else the
 * generated function): its program's operations in the same order, with
 * the largest and the sum of the exponentials taken from x and V(0) where
 * they lie (no copy into the terms buffer) and the smoothing sum, whose
 * terms are all +0 then, as the +0 it adds up to. The same bits
 * (tests/test_rows.c checks them against in-order loops). */
static CPU_VECTOR_CLONES void row_cross_entropy_by_hand_f32(const row_args *r)
{
    if (r->nin > 2 || (float)r->p[1] != 0) {
        row_cross_entropy_f32(r);
        return;
    }
    typedef float T;
    const int64_t n = r->n;
    const T *x = r->x[0];
    T *e = r->v[0];
    T s0 = max_of_f32(x, n);
    IVDEP for (int64_t i = 0; i < n; i++) e[i] = exp(x[i] - s0);
    T s1 = row_sum_f32(r, e, r->tmp), s2 = log(s1), s3 = 0, p1 = (T)r->p[1];
    bool ignored = r->index[1] == (long long)(T)r->p[0];
    T s4 = ignored ? (T)0 : (T)1;
    *(T *)r->weight = s4;
    *(T *)r->result = ignored ? (T)0 : ((T)1 - p1) * s4 * (s2 + s0 - x[r->index[1]]) - p1 / (T)n * s3;
}

/* cross_entropy_grad in f32 without class weights (else the generated
 * function): the same operations in the same order, the largest and the
 * sum of the exponentials taken where they lie, and the sum of n ones
 * (exact in f32 below 2^24) as n. The same bits. */
static CPU_VECTOR_CLONES void row_cross_entropy_grad_by_hand_f32(const row_args *r)
{
    const int64_t n = r->n;
    if (r->nin > 4 || n >= (1 << 24)) {
        row_cross_entropy_grad_f32(r);
        return;
    }
    typedef float T;
    const T *x = r->x[0];
    T *e = r->v[0], *y = r->y;
    T s0 = max_of_f32(x, n);
    IVDEP for (int64_t i = 0; i < n; i++) e[i] = exp(x[i] - s0);
    T s1 = row_sum_f32(r, e, r->tmp);
    T s2 = (T)r->scalar[2] / (r->nin > 3 ? (T)r->scalar[3] : (T)r->rows), s3 = (T)n, p1 = (T)r->p[1];
    int64_t t = r->index[1];
    bool ignored = t == (long long)(T)r->p[0];
    T s4 = ignored ? (T)0 : (T)1, s5 = ((T)1 - p1) * s4 + p1 / (T)n * s3;
    T hot = ((T)1 - p1) * s4, rest = p1 / (T)n * (T)1;
    if (ignored) {
        for (int64_t i = 0; i < n; i++) y[i] = 0;
        return;
    }
    IVDEP for (int64_t i = 0; i < n; i++) y[i] = (s5 * (e[i] / s1) - (i == t ? hot : (T)0) - rest) * s2;
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
        leaf_sums_float(t, r->leaf, r->nleaves * r->nb, leaf_sums);
    else
        for (int b = 0; b < r->nb; b++) {
            float *l = leaf_sums + b * r->nleaves;
            leaf_sums_float(t + b * r->n, r->leaf, r->live_leaves[b], l);
            for (int q = r->live_leaves[b]; q < r->nleaves; q++) l[q] = 0;
        }
    for (int b = 0; b < r->nb; b++) {
        float *l = leaf_sums + b * r->nleaves;
        int k = 0;
        sums[b] = r->balanced ? levels_f32(l, r->nleaves) : combine_f32(l, r->n, &k);
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
    for (int b = 0; b < r->nb; b++) {
        const float *x = (const float *)r->x[0] + b * r->xs[0];
        float *vb = v + b * n;
        const int64_t cols = whole ? n : r->live[b];
        m[b] = max_of_f32(x, cols);
        const float mb = m[b];
        IVDEP for (int64_t i = 0; i < cols; i++) vb[i] = exp(x[i] - mb);
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

/* softmax_grad in f32 as its program computes it (SUM(0, X(1) * X(0))
 * OUT(X(0) * (X(1) - S(0)))), the sum's leaves added from the products as
 * they are made (leaf_sums_products_f32): no terms written and read back,
 * the same bits. A causal row of CAUSAL_LIVE_MIN or more reads y and dy
 * only at its live columns, its last live leaf added up to them (its
 * terms past them were 0: the same sum). */
static CPU_VECTOR_CLONES void row_softmax_grad_by_hand_f32(const row_args *r)
{
    const int64_t n = r->n;
    const float *y = r->x[0], *dy = r->x[1];
    float s[ROW_BATCH], *leaf_sums = r->tmp;
    /* Short causal rows whole: y is exactly 0 past the live columns, so
     * each product there is 0 (adding it changes no sum) unless dy is not
     * finite there, which makes the row's sum NaN (0 * inf); only such a
     * row's sum is added again over its live columns alone. */
    const bool whole = r->causal && n < CAUSAL_LIVE_MIN;
    if (!r->causal || whole)
        leaf_sums_products_f32(y, dy, r->leaf, r->nleaves * r->nb, leaf_sums);
    for (int b = 0; b < r->nb; b++) {
        float *l = leaf_sums + b * r->nleaves;
        int k = 0;
        if (r->causal) {
            if (whole) {
                s[b] = r->balanced ? levels_f32(l, r->nleaves) : combine_f32(l, n, &k);
                if (isfinite(s[b])) continue;
                k = 0;
            }
            const float *yb = y + b * n, *dyb = dy + b * n;
            int full = r->live_leaves[b] - (r->pad[b] > r->live[b]); /* leaves whose every column is live */
            leaf_sums_products_f32(yb, dyb, r->leaf, full, l);
            if (full < r->live_leaves[b]) { /* the last, in order up to the live columns */
                float a = 0;
                for (int64_t j = r->pad[b] - r->leaf[full]; j < r->live[b]; j++) a += yb[j] * dyb[j];
                l[full] = a;
            }
            for (int q = r->live_leaves[b]; q < r->nleaves; q++) l[q] = 0;
        }
        s[b] = r->balanced ? levels_f32(l, r->nleaves) : combine_f32(l, n, &k);
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

/* f32 row functions written out by hand in place of the generated one */
static const row_fn row_f32_by_hand[IR_OP_COUNT] = {
    [IR_OP_layer_norm_grad_stats] = row_layer_norm_grad_stats_one_pass_f32,
    [IR_OP_softmax] = row_softmax_by_hand_f32,
    [IR_OP_softmax_grad] = row_softmax_grad_by_hand_f32,
    [IR_OP_cross_entropy] = row_cross_entropy_by_hand_f32,
    [IR_OP_cross_entropy_grad] = row_cross_entropy_grad_by_hand_f32,
};

/* ---- the driver ---- */

/* The live columns of causal rows by the row's position p along the
 * queries (T of them): live[p] (ir_causal_live), the leaves of the
 * pairwise tree that hold them (leaves[p]) and the end of the last
 * (pad[p]); leaf_end: the leaves' ends in the row. */
static void live_table(const ir_type *t, const int64_t *leaf_end, int nleaves, int64_t *live, int64_t *pad,
                       int64_t *leaves)
{
    int l = 0;
    for (int64_t p = 0; p < t->dims[t->rank - 2]; p++) {
        live[p] = ir_causal_live(t, p);
        while (l < nleaves - 1 && leaf_end[l] < live[p]) l++; /* the first leaf ending at or past it */
        pad[p] = leaf_end[l], leaves[p] = l + 1;
    }
}

/* Sets the live columns of the call's rows (row_args.live): all n, or for
 * causal rows each one's from the table (live_table, by[0..2] its live,
 * pad and leaves; rows of T positions). */
static void set_live(row_args *r, int64_t T, int64_t *const by[3])
{
    int64_t p = r->causal ? r->row % T : 0;
    for (int b = 0; b < r->nb; b++) {
        if (!r->causal) {
            r->live[b] = r->pad[b] = r->n;
            r->live_leaves[b] = r->nleaves;
            continue;
        }
        r->live[b] = by[0][p], r->pad[b] = by[1][p], r->live_leaves[b] = (int)by[2][p];
        if (++p == T) p = 0;
    }
}

alloy_status cpu_row_run(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in, int64_t total_rows,
                         void *results, bool causal)
{
    const ir_row_program *prog = ir_ops[n->op].row;
    ir_row_summary sum = ir_row_summarize(prog);
    const ir_type *t = &in[0].type;
    bool wide = t->dtype == ALLOY_F64;
    int axis = t->rank - 1;
    if (ir_attr_schema(n->op, "axis")) ir_norm_axis(ir_attr_i(n, "axis"), t->rank, &axis);
    int64_t len = t->rank ? t->dims[axis] : 1, outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= t->dims[d];
    for (int d = axis + 1; d < t->rank; d++) inner *= t->dims[d];
    for (int j = 0; j < n->nin; j++)
        if (prog->roles[j] == 'i' && cpu_check_targets(x, n, &in[j], len)) return x->status;
    if (outer * len * inner == 0) return ALLOY_OK;
    if (causal && (t->rank < 2 || axis != t->rank - 1 || t->dims[t->rank - 2] > len))
        return cpu_fail(x, ALLOY_ERR_VERIFY, "%s: causal rows need [.., queries, keys] rows along the last axis",
                        ir_ops[n->op].name);
    if (n->nin > ROW_MAX_IN || sum.nscalars > ROW_MAX_S || sum.nvectors > ROW_MAX_V)
        return cpu_fail(x, ALLOY_ERR_UNSUPPORTED, "%s: its row program needs more slots than the CPU has",
                        ir_ops[n->op].name);
    /* short rows along the last axis, ROW_BATCH at a time, for programs
     * whose rows need nothing of their own but their w operands */
    bool batchable = inner == 1 && !sum.per_row_result && !sum.per_row_value && !sum.by_position;
    for (int j = 0; j < n->nin; j++) batchable = batchable && prog->roles[j] != 'i';
    int64_t nb = batchable ? ROW_BATCH_ELEMS / len : 1;
    nb = nb < 1 ? 1 : nb > ROW_BATCH ? ROW_BATCH : nb;
    row_args r = {.n = len, .nb = 1, .rows = total_rows, .nin = n->nin, .rank = t->rank, .dims = t->dims, .causal = causal};
    int np = 0;
    for (const ir_attr_spec *a = ir_ops[n->op].attrs; a && a->name && np < ROW_MAX_ATTRS; a++)
        r.p[np++] = a->kind == IR_ATTR_FLOAT ? ir_attr_f(n, a->name) : (double)ir_attr_i(n, a->name);
    /* buffers: a slab per r operand, one for the result, then the row views */
    size_t cs = wide ? sizeof(double) : sizeof(float), slab = (size_t)(len * inner);
    size_t cap = slab > (size_t)(nb * len) ? slab : (size_t)(nb * len); /* each buffer's elements */
    int nbuf = n->nin + 1 + sum.nvectors + 2 + (inner > 1 ? n->nin + 1 : 0);
    size_t leaf_bytes = sizeof(int64_t) * (size_t)(nb * len + 1 + len + (causal ? 3 * len : 0));
    char *block = al_malloc(leaf_bytes + cs * cap * (size_t)nbuf + cs);
    if (!block) return cpu_out_of_memory(x, n);
    int64_t *leaves = (int64_t *)(void *)block; /* first: al_malloc aligns it */
    char *at = block + leaf_bytes;
    void *slabs[ROW_MAX_IN + 1] = {NULL}, *cols[ROW_MAX_IN + 1] = {NULL};
    for (int j = 0; j <= n->nin; j++, at += cs * cap) slabs[j] = at; /* slabs[nin]: the result */
    for (int k = 0; k < sum.nvectors; k++, at += cs * cap) r.v[k] = at;
    r.tmp = at, at += cs * cap;   /* the leaf sums of a SUM */
    r.terms = at, at += cs * cap; /* the terms of a MAX or a SUM */
    r.nleaves = leaf_plan(len, leaves, 0);
    int64_t *leaf_end = leaves + nb * len + 1; /* each leaf's end in the row */
    int64_t at_end = 0;
    for (int l = 0; l < r.nleaves; l++) leaf_end[l] = at_end += leaves[l];
    int64_t T = causal ? t->dims[t->rank - 2] : 1; /* <= len (causal_mask's rule, checked above) */
    int64_t *const by_position[3] = {leaf_end + len, leaf_end + 2 * len, leaf_end + 3 * len};
    if (causal) live_table(t, leaf_end, r.nleaves, by_position[0], by_position[1], by_position[2]);
    for (int64_t b = 1; b < nb; b++) memcpy(leaves + b * r.nleaves, leaves, sizeof(int64_t) * (size_t)r.nleaves);
    r.leaf = leaves;
    r.balanced = (r.nleaves & (r.nleaves - 1)) == 0;
    for (int l = 1; l < r.nleaves; l++) r.balanced = r.balanced && leaves[l] == leaves[0];
    for (int j = 0; inner > 1 && j <= n->nin; j++, at += cs * cap) cols[j] = at;
    r.y = inner > 1 ? cols[n->nin] : slabs[n->nin];
    for (int j = 0; j < n->nin; j++) {
        char role = prog->roles[j];
        if (role == 'v') cpu_load_compute(wide, in[j].type.dtype, in[j].data, slabs[j], len);
        if (role == 's') cvt_load_f64(in[j].type.dtype, in[j].data, &r.scalar[j], 1);
        r.x[j] = inner > 1 && role == 'r' ? cols[j] : slabs[j];
        r.xs[j] = role == 'r' ? len : 0;
    }
    row_fn fn = wide ? row_fns[n->op].f64 : row_f32_by_hand[n->op] ? row_f32_by_hand[n->op] : row_fns[n->op].f32;
    size_t out_es = alloy_dtype_size(out->type.dtype);
    /* rows along the last axis in the compute type are read where they lie,
     * and the result's rows written where they go (when the result shares
     * no bytes with an operand): no copies */
    bool direct_in[ROW_MAX_IN] = {false};
    for (int j = 0; j < n->nin; j++)
        direct_in[j] = inner == 1 && prog->roles[j] == 'r' && in[j].type.dtype == (wide ? ALLOY_F64 : ALLOY_F32);
    bool direct_out = inner == 1 && !sum.per_row_value && !sum.per_row_result &&
                      out->type.dtype == (wide ? ALLOY_F64 : ALLOY_F32);
    for (int j = 0; direct_out && j < n->nin; j++) {
        const char *a = in[j].data, *b = out->data;
        size_t an = (size_t)ir_numel(&in[j].type) * alloy_dtype_size(in[j].type.dtype);
        if (a < b + (size_t)(outer * len) * cs && b < a + an) direct_out = false;
    }
    for (int64_t o = 0; o < outer; o += r.nb) {
        r.nb = (int)(outer - o < nb ? outer - o : nb); /* nb > 1: inner is 1, slab is len */
        for (int j = 0; j < n->nin; j++) {
            if (direct_in[j])
                r.x[j] = (const char *)in[j].data + (size_t)o * slab * cs;
            else if (prog->roles[j] == 'r')
                cpu_load_compute(wide, in[j].type.dtype,
                                 (const char *)in[j].data + (size_t)o * slab * alloy_dtype_size(in[j].type.dtype),
                                 slabs[j], (int64_t)slab * r.nb);
        }
        if (direct_out) r.y = (char *)out->data + (size_t)o * slab * cs;
        for (int64_t c = 0; c < inner; c++) {
            r.row = o * inner + c;
            if (sum.by_position) set_positions(&r);
            set_live(&r, T, by_position);
            for (int j = 0; j < n->nin; j++) {
                if (prog->roles[j] == 'i') r.index[j] = cpu_index_at(&in[j], r.row);
                if (prog->roles[j] == 'w') { /* the batch's values in one call */
                    double w[ROW_BATCH];
                    cvt_load_f64(in[j].type.dtype,
                                 (const char *)in[j].data + (size_t)r.row * alloy_dtype_size(in[j].type.dtype), w,
                                 (size_t)r.nb);
                    for (int b = 0; b < r.nb; b++) r.w[b][j] = w[b];
                }
            }
            if (inner > 1) /* a column of the slab as a row */
                for (int j = 0; j < n->nin; j++)
                    if (prog->roles[j] == 'r')
                        for (int64_t i = 0; i < len; i++)
                            memcpy((char *)cols[j] + (size_t)i * cs, (char *)slabs[j] + ((size_t)(i * inner + c)) * cs, cs);
            r.result = results ? (char *)results + (size_t)r.row * cs : NULL;
            r.weight = results ? (char *)results + (size_t)(total_rows + r.row) * cs : NULL;
            if (results && !sum.weighted) { /* no WEIGHT stage: every row weighs 1 */
                if (wide) *(double *)r.weight = 1;
                else *(float *)r.weight = 1;
            }
            fn(&r);
            if (inner > 1 && !sum.per_row_result)
                for (int64_t i = 0; i < len; i++)
                    memcpy((char *)slabs[n->nin] + ((size_t)(i * inner + c)) * cs, (char *)r.y + (size_t)i * cs, cs);
        }
        if (sum.per_row_value) /* one value per row (rows run along the last axis: inner is 1) */
            cpu_store_compute(wide, out->type.dtype, slabs[n->nin], (char *)out->data + (size_t)o * out_es, 1);
        else if (!sum.per_row_result && !direct_out)
            cpu_store_compute(wide, out->type.dtype, slabs[n->nin], (char *)out->data + (size_t)o * slab * out_es,
                              (int64_t)slab * r.nb);
    }
    al_free(block);
    return ALLOY_OK;
}

void cpu_row_mean(bool wide, bool sum, const void *results, int64_t rows, rt_tensor *out)
{
    /* the mean over no rows, or rows of total weight 0, is 0/0 = NaN, as in PyTorch */
    if (wide) {
        const double *v = results;
        double mean = sum ? sum_f64(v, rows) : sum_f64(v, rows) / sum_f64(v + rows, rows);
        cpu_store_compute(wide, out->type.dtype, &mean, out->data, 1);
    } else {
        const float *v = results;
        float mean = sum ? sum_f32(v, rows) : sum_f32(v, rows) / sum_f32(v + rows, rows);
        cpu_store_compute(wide, out->type.dtype, &mean, out->data, 1);
    }
}

/* The kernel of every row op: all rows, and a per-row result's mean. */
alloy_status cpu_row(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *t = &in[0].type;
    int64_t len = t->rank ? t->dims[t->rank - 1] : 1, rows = len ? ir_numel(t) / len : 0;
    bool causal = x->graph && ir_row_causal(x->graph, n);
    if (!ir_row_summarize(ir_ops[n->op].row).per_row_result) return cpu_row_run(x, n, out, in, rows, NULL, causal);
    bool wide = t->dtype == ALLOY_F64;
    void *results = cpu_alloc_compute(wide, 2 * rows);
    if (!results) return cpu_out_of_memory(x, n);
    alloy_status st = cpu_row_run(x, n, out, in, rows, results, causal);
    if (!st) cpu_row_mean(wide, ir_row_sums(n), results, rows, out);
    al_free(results);
    return st;
}
