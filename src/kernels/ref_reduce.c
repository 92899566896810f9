/* ref_reduce.c - reduce_sum, reduce_mean and reduce_max over any set of axes, accumulating wide and pairwise (f16/bf16 converted a run at a time); cumsum. */
#include <math.h>
#include <string.h>

#include "base/convert.h"
#include "base/vmath.h"
#include "kernels/ref.h"

/* LEAF: sums of at most this many terms are added in order; longer ones are
 * split in halves, so rounding error grows with log(n), not n. COLS: output
 * columns reduced together when the reduced axes are not the innermost. */
enum { LEAF = REF_SUM_LEAF, COLS = REF_SUM_COLS, MAX_DEPTH = REF_SUM_MAX_DEPTH };
/* CHUNK: f16/bf16 elements converted to f32 at a time (at least COLS). */
enum { CHUNK = 4096 };

/* The reduction with size-1 dims dropped and contiguous neighbours merged:
 * the kept dims (walked in output order) and the reduced dims, each with its
 * stride in the input, in elements. */
typedef struct reduce_plan {
    int op;
    alloy_dtype dtype; /* the input's (f16 or bf16 for the half reducer) */
    int nkept, nred;
    int64_t kept[ALLOY_MAX_RANK], kept_stride[ALLOY_MAX_RANK];
    int64_t red[ALLOY_MAX_RANK], red_stride[ALLOY_MAX_RANK];
    int64_t count; /* input elements per output element */
    int64_t nout;
} reduce_plan;

static void push_dim(int64_t *dims, int64_t *strides, int *count, int64_t size, int64_t stride)
{
    if (size == 1) return;
    /* unsigned: only an empty input's dims can pass int64, and it is never read */
    if (*count > 0 && (uint64_t)strides[*count - 1] == (uint64_t)stride * (uint64_t)size) {
        dims[*count - 1] = (int64_t)((uint64_t)dims[*count - 1] * (uint64_t)size);
        strides[*count - 1] = stride;
        return;
    }
    dims[*count] = size;
    strides[*count] = stride;
    (*count)++;
}

static void make_plan(const ir_node *n, const ir_type *t, reduce_plan *p)
{
    bool reduced[ALLOY_MAX_RANK] = {false};
    int naxes;
    const int64_t *axes = ir_attr_ints(n, "axes", &naxes);
    for (int i = 0; i < naxes; i++) {
        int ax;
        if (ir_norm_axis(axes[i], t->rank, &ax)) reduced[ax] = true;
    }
    if (!ir_attr_find(n, "axes"))
        for (int d = 0; d < t->rank; d++) reduced[d] = true;
    /* unsigned products: an empty input may have other dims whose product
     * passes int64 ([0, 2^62/10, 120]); nothing is read then, and the
     * counts are fixed below, but the products must not be undefined */
    int64_t stride[ALLOY_MAX_RANK];
    uint64_t step = 1, count = 1, nout = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        stride[d] = (int64_t)step;
        step *= (uint64_t)t->dims[d];
    }
    p->op = n->op;
    p->dtype = t->dtype;
    p->nkept = p->nred = 0;
    for (int d = 0; d < t->rank; d++) {
        if (reduced[d]) {
            push_dim(p->red, p->red_stride, &p->nred, t->dims[d], stride[d]);
            count *= (uint64_t)t->dims[d];
        } else {
            push_dim(p->kept, p->kept_stride, &p->nkept, t->dims[d], stride[d]);
            nout *= (uint64_t)t->dims[d];
        }
    }
    /* exact unless the input is empty: then a reduced dim of 0 makes count 0
     * exactly, and a kept dim of 0 leaves no output to compute */
    p->nout = ir_numel(t) ? (int64_t)nout : ir_numel(&n->type);
    p->count = ir_numel(t) || p->nout ? (int64_t)count : 0;
}

/* Offset of the r-th reduced element (row-major over the reduced dims). */
static int64_t red_offset(const reduce_plan *p, int64_t r)
{
    int64_t off = 0;
    for (int d = p->nred - 1; d >= 0; d--) {
        off += (r % p->red[d]) * p->red_stride[d];
        r /= p->red[d];
    }
    return off;
}

/* Advances the multi-index idx over dims[0..rank) (last fastest) and keeps
 * *off = sum idx[d] * stride[d]. */
static void advance(int rank, const int64_t *dims, const int64_t *stride, int64_t *idx, int64_t *off)
{
    for (int d = rank - 1; d >= 0; d--) {
        *off += stride[d];
        if (++idx[d] < dims[d]) return;
        *off -= stride[d] * dims[d];
        idx[d] = 0;
    }
}

/* The typed reducers: E is the stored element, T the compute type, A the
 * accumulator (unsigned for integers, so overflow wraps instead of being
 * undefined), IS_NAN tests T, EMPTY_MEAN is the mean of no elements. WIDE
 * is 1 when E is narrower than T (f16, bf16): then elements are converted
 * as they are reached, at most CHUNK at a time (a subtree of a pairwise
 * sum, a stretch of a maximum, one row of up to COLS columns), into a
 * buffer of T, never the whole input at once. LOAD(p, d, s, n) converts n
 * elements from s to d; VIEW(p, buf, s, n) is s read as T (s itself, or
 * its n elements converted into buf). The additions are the same, in the
 * same order, as over a widened copy: a pairwise sum splits at n / 2
 * whether it converts or not. */
#define DEFINE_REDUCER(S, E, T, A, IS_NAN, EMPTY_MEAN, WIDE, LOAD, VIEW, LEAF_FAST, ADD_FAST)                   \
    static A sum_##S(const T *v, int64_t n)                                                \
    {                                                                                      \
        if (n > LEAF) return sum_##S(v, n / 2) + sum_##S(v + n / 2, n - n / 2);            \
        A s = 0;                                                                           \
        for (int64_t i = 0; i < n; i++) s += (A)v[i];                                      \
        return s;                                                                          \
    }                                                                                      \
    /* sum_ over stored elements: subtrees of up to CHUNK terms read as T */              \
    static A sum_stored_##S(const reduce_plan *p, const E *v, int64_t n, T *buf)           \
    {                                                                                      \
        if (n > CHUNK)                                                                     \
            return sum_stored_##S(p, v, n / 2, buf) + sum_stored_##S(p, v + n / 2, n - n / 2, buf); \
        return sum_##S(VIEW(p, buf, v, n), n);                                             \
    }                                                                                      \
    static T finish_##S(const reduce_plan *p, const E *v, int64_t n, T *buf)               \
    {                                                                                      \
        if (p->op == IR_OP_reduce_sum) return (T)sum_stored_##S(p, v, n, buf);             \
        if (p->op == IR_OP_reduce_mean) return (T)sum_stored_##S(p, v, n, buf) / (T)n;     \
        const T *c = VIEW(p, buf, v, n < CHUNK ? n : CHUNK);                               \
        T m = c[0];                                                                        \
        for (int64_t i0 = 0; i0 < n && !IS_NAN(m); i0 += CHUNK) {                          \
            int64_t k = n - i0 < CHUNK ? n - i0 : CHUNK;                                   \
            if (i0) c = VIEW(p, buf, v + i0, k);                                           \
            for (int64_t i = i0 ? 0 : 1; i < k && !IS_NAN(m); i++)                         \
                if (c[i] > m || IS_NAN(c[i])) m = c[i];                                    \
        }                                                                                  \
        return m;                                                                          \
    }                                                                                      \
    /* reduced dims innermost: each output's elements are runs of contiguous ones */       \
    static void reduce_rows_##S(const reduce_plan *p, const E *src, T *dst, E *gathered, T *buf) \
    {                                                                                      \
        int64_t kidx[ALLOY_MAX_RANK] = {0}, base = 0, run = p->red[p->nred - 1];           \
        for (int64_t o = 0; o < p->nout; o++) {                                            \
            const E *v = src + base;                                                       \
            if (p->nred > 1) {                                                             \
                int64_t ridx[ALLOY_MAX_RANK] = {0}, off = 0;                               \
                for (int64_t r = 0; r < p->count; r += run) {                              \
                    memcpy(gathered + r, src + base + off, sizeof(E) * (size_t)run);       \
                    advance(p->nred - 1, p->red, p->red_stride, ridx, &off);               \
                }                                                                          \
                v = gathered;                                                              \
            }                                                                              \
            dst[o] = finish_##S(p, v, p->count, buf);                                      \
            advance(p->nkept, p->kept, p->kept_stride, kidx, &base);                       \
        }                                                                                  \
    }                                                                                      \
    /* out[0..w) = pairwise column sums of reduced rows [lo, hi) of the w columns at      \
     * src; stack holds one w-vector per recursion level, buf one row read as T */        \
    static void column_sums_##S(const reduce_plan *p, const E *src, int64_t lo, int64_t hi, \
                                int64_t w, A *out, A *stack, T *buf)                       \
    {                                                                                      \
        if (hi - lo > LEAF) {                                                              \
            int64_t mid = lo + (hi - lo) / 2;                                              \
            column_sums_##S(p, src, lo, mid, w, out, stack + COLS, buf);                   \
            column_sums_##S(p, src, mid, hi, w, stack, stack + COLS, buf);                 \
            ADD_FAST(out, stack, w);                                                       \
            return;                                                                        \
        }                                                                                  \
        if (LEAF_FAST(p, src, lo, hi, w, out)) return;                                      \
        for (int64_t j = 0; j < w; j++) out[j] = 0;                                        \
        for (int64_t r = lo; r < hi; r++) {                                                \
            const T *row = VIEW(p, buf, src + red_offset(p, r), w);                        \
            for (int64_t j = 0; j < w; j++) out[j] += (A)row[j];                           \
        }                                                                                  \
    }                                                                                      \
    /* innermost dim kept: reduce blocks of up to COLS neighbouring outputs at once */     \
    static void reduce_columns_##S(const reduce_plan *p, const E *src, T *dst, A *acc, T *buf) \
    {                                                                                      \
        int64_t width = p->kept[p->nkept - 1], outer = p->nout / width;                    \
        int64_t kidx[ALLOY_MAX_RANK] = {0}, base = 0;                                      \
        for (int64_t o = 0; o < outer; o++, dst += width) {                                \
            for (int64_t j0 = 0; j0 < width; j0 += COLS) {                                 \
                int64_t w = width - j0 < COLS ? width - j0 : COLS;                         \
                const E *col = src + base + j0;                                            \
                if (p->op == IR_OP_reduce_max) {                                           \
                    T *m = dst + j0;                                                       \
                    LOAD(p, m, col, w);                                                    \
                    for (int64_t r = 1; r < p->count; r++) {                               \
                        const T *row = VIEW(p, buf, col + red_offset(p, r), w);            \
                        for (int64_t j = 0; j < w; j++)                                    \
                            if (!IS_NAN(m[j]) && (row[j] > m[j] || IS_NAN(row[j]))) m[j] = row[j]; \
                    }                                                                      \
                    continue;                                                              \
                }                                                                          \
                column_sums_##S(p, col, 0, p->count, w, acc, acc + COLS, buf);             \
                for (int64_t j = 0; j < w; j++)                                            \
                    dst[j0 + j] = p->op == IR_OP_reduce_sum ? (T)acc[j] : (T)acc[j] / (T)p->count; \
            }                                                                              \
            advance(p->nkept - 1, p->kept, p->kept_stride, kidx, &base);                   \
        }                                                                                  \
    }                                                                                      \
    static bool run_##S(const reduce_plan *p, const E *src, T *dst)                        \
    {                                                                                      \
        if (p->count == 0) {                                                               \
            for (int64_t o = 0; o < p->nout; o++)                                          \
                dst[o] = p->op == IR_OP_reduce_mean ? EMPTY_MEAN : (T)0;                   \
            return true;                                                                   \
        }                                                                                  \
        if (p->nred == 0) {                                                                \
            LOAD(p, dst, src, p->nout);                                                    \
            return true;                                                                   \
        }                                                                                  \
        T *buf = WIDE ? al_malloc(sizeof(T) * CHUNK) : NULL;                               \
        if (WIDE && !buf) return false;                                                    \
        bool ok = true;                                                                    \
        if (p->red_stride[p->nred - 1] == 1) {                                             \
            E *gathered = NULL;                                                            \
            if (p->nred > 1 && !(gathered = al_malloc(sizeof(E) * (size_t)p->count)))      \
                ok = false;                                                                \
            else                                                                           \
                reduce_rows_##S(p, src, dst, gathered, buf);                               \
            al_free(gathered);                                                             \
        } else {                                                                           \
            A *acc = al_malloc(sizeof(A) * COLS * (MAX_DEPTH + 1));                        \
            if (acc)                                                                       \
                reduce_columns_##S(p, src, dst, acc, buf);                                 \
            ok = acc != NULL;                                                              \
            al_free(acc);                                                                  \
        }                                                                                  \
        al_free(buf);                                                                      \
        return ok;                                                                         \
    }

/* Column sums at vector width, one clone per ISA level: the same additions
 * in the same order as the generic loops (each column from 0, row after
 * row), so the same bits. out[0..w) = sums of rows [0, rows) of the w
 * columns at src, rows ld apart, each element E widened by WIDEN to f32:
 * leaf_rows_f32, and leaf_rows_bf16 (exact: its bits the f32's high half). */
static inline float widen_f32(float v) { return v; }

static inline float widen_bf16(uint16_t v)
{
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#define LEAF_ROWS(S, E)                                                                    \
    CPU_VECTOR_CLONES static void leaf_rows_##S(const E *src, int64_t ld, int64_t rows, int64_t w, \
                                                float *restrict out)                       \
    {                                                                                      \
        int64_t j0 = 0;                                                                    \
        for (; j0 + 16 <= w; j0 += 16) {                                                   \
            float acc[16];                                                                 \
            for (int k = 0; k < 16; k++) acc[k] = 0.0f;                                    \
            for (int64_t r = 0; r < rows; r++)                                             \
                for (int k = 0; k < 16; k++) acc[k] += widen_##S(src[r * ld + j0 + k]);    \
            for (int k = 0; k < 16; k++) out[j0 + k] = acc[k];                             \
        }                                                                                  \
        for (; j0 < w; j0++) {                                                             \
            float a = 0.0f;                                                                \
            for (int64_t r = 0; r < rows; r++) a += widen_##S(src[r * ld + j0]);           \
            out[j0] = a;                                                                   \
        }                                                                                  \
    }
LEAF_ROWS(f32, float)
LEAF_ROWS(bf16, uint16_t)

/* out[0..w) += in[0..w) (a node of the pairwise tree joining its halves). */
CPU_VECTOR_CLONES static void add_cols_f32(float *restrict out, const float *restrict in, int64_t w)
{
    for (int64_t j = 0; j < w; j++) out[j] += in[j];
}

/* A leaf by leaf_rows_f32 where the reduced rows are one stride apart. */
#define F32_LEAF(p, src, lo, hi, w, out)                                                    \
    ((p)->nred == 1 ? (leaf_rows_f32((src) + (lo) * (p)->red_stride[0], (p)->red_stride[0], \
                                     (hi) - (lo), (w), (out)),                             \
                       true)                                                               \
                    : false)
#define F32_ADD(out, in, w) add_cols_f32((out), (in), (w))
/* bf16 likewise (f16 takes the generic loops: its widening is not a shift) */
#define HALF_LEAF(p, src, lo, hi, w, out)                                                   \
    ((p)->nred == 1 && (p)->dtype == ALLOY_BF16                                            \
         ? (leaf_rows_bf16((src) + (lo) * (p)->red_stride[0], (p)->red_stride[0], (hi) - (lo), \
                           (w), (out)),                                                    \
            true)                                                                          \
         : false)
/* the other types: the generic loops */
#define NO_LEAF(p, src, lo, hi, w, out) ((void)(p), (void)(src), false)
#define PLAIN_ADD(out, in, w)                                                               \
    do {                                                                                   \
        for (int64_t j_ = 0; j_ < (w); j_++) (out)[j_] += (in)[j_];                       \
    } while (0)

#define FLOAT_IS_NAN(v) isnan(v)
#define INT_IS_NAN(v) false
/* same type: runs copied, read in place */
#define COPY_LOAD(p, d, s, n) memcpy((d), (s), sizeof *(d) * (size_t)(n))
#define COPY_VIEW(p, buf, s, n) ((void)(buf), (s))
/* f16, bf16 (p->dtype) to f32: convert.c's bulk conversion, n at a time */
#define HALF_LOAD(p, d, s, n) cvt_load_f32((p)->dtype, (s), (d), (size_t)(n))
#define HALF_VIEW(p, buf, s, n) (HALF_LOAD(p, buf, s, n), (const float *)(buf))
DEFINE_REDUCER(f32, float, float, float, FLOAT_IS_NAN, NAN, 0, COPY_LOAD, COPY_VIEW, F32_LEAF, F32_ADD)
DEFINE_REDUCER(f64, double, double, double, FLOAT_IS_NAN, NAN, 0, COPY_LOAD, COPY_VIEW, NO_LEAF, PLAIN_ADD)
DEFINE_REDUCER(i64, int64_t, int64_t, uint64_t, INT_IS_NAN, 0, 0, COPY_LOAD, COPY_VIEW, NO_LEAF, PLAIN_ADD)
DEFINE_REDUCER(half, uint16_t, float, float, FLOAT_IS_NAN, NAN, 1, HALF_LOAD, HALF_VIEW, HALF_LEAF, F32_ADD)

void ref_column_sums_f32(const float *src, int64_t nrows, int64_t ncols, float *out, float *stack)
{
    reduce_plan p = {.op = IR_OP_reduce_sum, .nred = 1, .red = {nrows}, .red_stride = {ncols}, .count = nrows};
    for (int64_t j0 = 0; j0 < ncols; j0 += COLS)
        column_sums_f32(&p, src + j0, 0, nrows, ncols - j0 < COLS ? ncols - j0 : COLS, out + j0, stack, NULL);
}

/* The typed entry points: the contract is in ref.h. */
bool ref_reduce_f32(const ir_node *n, const ir_type *t, const float *src, float *dst)
{
    reduce_plan p;
    make_plan(n, t, &p);
    return p.nout == 0 || run_f32(&p, src, dst);
}

bool ref_reduce_f64(const ir_node *n, const ir_type *t, const double *src, double *dst)
{
    reduce_plan p;
    make_plan(n, t, &p);
    return p.nout == 0 || run_f64(&p, src, dst);
}

bool ref_reduce_half(const ir_node *n, const ir_type *t, const uint16_t *src, float *dst)
{
    reduce_plan p;
    make_plan(n, t, &p);
    return p.nout == 0 || run_half(&p, src, dst);
}

bool ref_reduce_i64(const ir_node *n, const ir_type *t, const int64_t *src, int64_t *dst)
{
    reduce_plan p;
    make_plan(n, t, &p);
    return p.nout == 0 || run_i64(&p, src, dst);
}

/* cumsum in place, along the axis in order (from the end when reverse). */
void ref_cumsum(const ir_node *n, const ir_type *t, bool wide, void *v)
{
    int axis = 0;
    ir_norm_axis(ir_attr_i(n, "axis"), t->rank, &axis);
    bool reverse = ir_attr_i(n, "reverse");
    int64_t len = t->dims[axis], outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= t->dims[d];
    for (int d = axis + 1; d < t->rank; d++) inner *= t->dims[d];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            double sd = 0;
            float sf = 0;
            for (int64_t s = 0; s < len; s++) {
                int64_t at = (o * len + (reverse ? len - 1 - s : s)) * inner + j;
                if (wide) ((double *)v)[at] = sd += ((double *)v)[at];
                else ((float *)v)[at] = sf += ((float *)v)[at];
            }
        }
}
