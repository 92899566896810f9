/* cpu_row_programs.c - the row programs of ops.def on the CPU: their stages, one function per RW line for float and one for double, and the leaf sums of a SUM. */
/* No trapping math here (as in cpu_elementwise.c): the stages' loops, exp
 * included (base/vmath.h), then vectorize on every ISA level. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <string.h>
#include <tgmath.h>

#include "base/vmath_generic.h" /* float exp/erf/tanh as every f32 evaluation of ops.def computes them */
#include "runtime/cpu/cpu_rows.h"

/* The leaf sums of a SUM: cpu_leaf_sums_T(t, leaf, nleaves, out) sets out[l]
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
#define LEAF_SUMS(T_)                                                                      \
    CPU_VECTOR_CLONES void cpu_leaf_sums_##T_(const T_ *t, const int64_t *leaf, int nleaves, T_ *out) \
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
#define OUT(e)                                                                             \
    EACH_ROW_DO({                                                                          \
        T *y_ = (T *)r->y + b_ * r->n;                                                     \
        const int64_t n_ = r->live[b_];                                                    \
        IVDEP for (int64_t i = 0; i < n_; i++) y_[i] = (T)(e);                             \
        for (int64_t i = n_; i < r->n; i++) y_[i] = 0;                                     \
    })
/* the per-row values: RESULT and WEIGHT get one row per call; KEEP's
 * rows may come in a batch, each row's value at r->y[b] */
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
        ((T *)r->y)[b_] = (T)(e);                                                          \
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
#define LEAF_SUM(t, l, nl, o) _Generic((t), float *: cpu_leaf_sums_float, double *: cpu_leaf_sums_double)(t, l, nl, o)
#define LEVELS_OF(v, nl) _Generic((v), float *: levels_f32, double *: levels_double)(v, nl)
#define MAX_OF(v, n) _Generic((v), float *: max_of_f32, double *: max_of_f64)(v, n)
#define COMBINE(v, n, k) _Generic((v), float *: combine_f32, double *: combine_f64)(v, n, k)
#include "ir/ops.def"
#undef RW

const struct row_fn_pair cpu_row_fns[IR_OP_COUNT] = {
#define RW(nm, ...) [IR_OP_##nm] = {row_##nm##_f32, row_##nm##_f64},
#include "ir/ops.def"
#undef RW
};
#undef OP
#undef EW
