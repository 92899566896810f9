/* cpu_norm.c - softmax, log_softmax, layer_norm and cross_entropy, computed in f32 (f64 for f64) with max subtraction. */
#include <string.h>
#include <tgmath.h>

#include "base/convert.h"
#include "runtime/cpu/cpu.h"

/* LEAF: sums of at most this many terms are added in order, longer ones split
 * in halves. COLS: columns a softmax over a non-last axis gathers at once. */
enum { LEAF = 16, COLS = 16 };

/* The typed row kernels over contiguous rows of the compute type T. */
#define DEFINE_ROWS(S, T)                                                                  \
    /* pairwise sum: error grows with log(n) */                                            \
    static T sum_##S(const T *v, int64_t n)                                                \
    {                                                                                      \
        if (n > LEAF) return sum_##S(v, n / 2) + sum_##S(v + n / 2, n - n / 2);            \
        T s = 0;                                                                           \
        for (int64_t i = 0; i < n; i++) s += v[i];                                         \
        return s;                                                                          \
    }                                                                                      \
    /* largest element, NaN if any is NaN, -inf for an empty row */                        \
    static T max_##S(const T *v, int64_t n)                                                \
    {                                                                                      \
        T m = -INFINITY;                                                                   \
        for (int64_t i = 0; i < n && m == m; i++)                                          \
            if (v[i] > m || v[i] != v[i]) m = v[i];                                        \
        return m;                                                                          \
    }                                                                                      \
    /* v = softmax(v) or log_softmax(v); e is scratch for n elements */                   \
    static void softmax_row_##S(T *v, int64_t n, bool log_out, T *e)                       \
    {                                                                                      \
        T m = max_##S(v, n);                                                               \
        for (int64_t i = 0; i < n; i++) {                                                  \
            v[i] -= m;                                                                     \
            e[i] = exp(v[i]);                                                              \
        }                                                                                  \
        T s = sum_##S(e, n);                                                               \
        if (log_out) {                                                                     \
            T log_s = log(s);                                                              \
            for (int64_t i = 0; i < n; i++) v[i] -= log_s;                                 \
        } else {                                                                           \
            for (int64_t i = 0; i < n; i++) v[i] = e[i] / s;                               \
        }                                                                                  \
    }                                                                                      \
    /* softmax along the middle axis of a [len, inner] slab; columns go through      \
     * rows (COLS of them at a time, for the cache) */                                     \
    static void softmax_slab_##S(T *slab, int64_t len, int64_t inner, bool log_out, T *rows, \
                                 T *e)                                                     \
    {                                                                                      \
        if (inner == 1) {                                                                  \
            softmax_row_##S(slab, len, log_out, e);                                        \
            return;                                                                        \
        }                                                                                  \
        for (int64_t j0 = 0; j0 < inner; j0 += COLS) {                                     \
            int64_t w = inner - j0 < COLS ? inner - j0 : COLS;                             \
            for (int64_t i = 0; i < len; i++)                                              \
                for (int64_t j = 0; j < w; j++) rows[j * len + i] = slab[i * inner + j0 + j]; \
            for (int64_t j = 0; j < w; j++) softmax_row_##S(rows + j * len, len, log_out, e); \
            for (int64_t i = 0; i < len; i++)                                              \
                for (int64_t j = 0; j < w; j++) slab[i * inner + j0 + j] = rows[j * len + i]; \
        }                                                                                  \
    }                                                                                      \
    /* v = (v - mean) / sqrt(var + eps) * gamma + beta (gamma, beta may be NULL) */        \
    static void layer_norm_row_##S(T *v, int64_t n, T eps, const T *gamma, const T *beta,  \
                                   T *d)                                                   \
    {                                                                                      \
        T mean = sum_##S(v, n) / (T)n;                                                     \
        for (int64_t i = 0; i < n; i++) d[i] = (v[i] - mean) * (v[i] - mean);              \
        T inv_std = (T)1 / sqrt(sum_##S(d, n) / (T)n + eps);                               \
        for (int64_t i = 0; i < n; i++) {                                                  \
            T y = (v[i] - mean) * inv_std;                                                 \
            v[i] = gamma ? y * gamma[i] + beta[i] : y;                                     \
        }                                                                                  \
    }                                                                                      \
    /* -log_softmax(v)[target] */                                                          \
    static T nll_row_##S(const T *v, int64_t n, int64_t target, T *e)                      \
    {                                                                                      \
        T m = max_##S(v, n);                                                               \
        for (int64_t i = 0; i < n; i++) e[i] = exp(v[i] - m);                              \
        return log(sum_##S(e, n)) + m - v[target];                                         \
    }

DEFINE_ROWS(f32, float)
DEFINE_ROWS(f64, double)


/* softmax / log_softmax along `axis` (default -1). */
alloy_status cpu_softmax(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *t = &in[0].type;
    int axis = t->rank - 1;
    ir_norm_axis(ir_attr_int(n, "axis", -1), t->rank, &axis);
    if (ir_numel(t) == 0) return ALLOY_OK;
    int64_t outer = 1, len = t->rank ? t->dims[axis] : 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= t->dims[d];
    for (int d = axis + 1; d < t->rank; d++) inner *= t->dims[d];
    bool wide = t->dtype == ALLOY_F64, log_out = n->op == IR_OP_log_softmax;
    size_t es = alloy_dtype_size(t->dtype), slab_bytes = (size_t)(len * inner) * es;
    void *slab = cpu_alloc_compute(wide, len * inner), *e = cpu_alloc_compute(wide, len);
    void *rows = cpu_alloc_compute(wide, len * (inner < COLS ? inner : COLS));
    if (!slab || !rows || !e) {
        al_free(slab), al_free(rows), al_free(e);
        return cpu_out_of_memory(x, n);
    }
    for (int64_t o = 0; o < outer; o++) {
        cpu_load_compute(wide, t->dtype, (const char *)in[0].data + (size_t)o * slab_bytes, slab, len * inner);
        if (wide) softmax_slab_f64(slab, len, inner, log_out, rows, e);
        else softmax_slab_f32(slab, len, inner, log_out, rows, e);
        cpu_store_compute(wide, t->dtype, slab, (char *)out->data + (size_t)o * slab_bytes, len * inner);
    }
    al_free(slab), al_free(rows), al_free(e);
    return ALLOY_OK;
}

/* layer_norm over the last axis: (x - mean) / sqrt(biased var + eps), times
 * gamma plus beta when given (eps default 1e-5). */
alloy_status cpu_layer_norm(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *t = &in[0].type;
    int64_t d = t->dims[t->rank - 1], rows = d ? ir_numel(t) / d : 0;
    if (rows == 0) return ALLOY_OK;
    bool wide = t->dtype == ALLOY_F64, affine = n->nin == 3;
    double eps = ir_attr_float(n, "eps", 1e-5);
    size_t row_bytes = (size_t)d * alloy_dtype_size(t->dtype);
    void *row = cpu_alloc_compute(wide, d), *scratch = cpu_alloc_compute(wide, d);
    void *gamma = affine ? cpu_alloc_compute(wide, d) : NULL, *beta = affine ? cpu_alloc_compute(wide, d) : NULL;
    if (!row || !scratch || (affine && (!gamma || !beta))) {
        al_free(row), al_free(scratch), al_free(gamma), al_free(beta);
        return cpu_out_of_memory(x, n);
    }
    if (affine) {
        cpu_load_compute(wide, in[1].type.dtype, in[1].data, gamma, d);
        cpu_load_compute(wide, in[2].type.dtype, in[2].data, beta, d);
    }
    for (int64_t r = 0; r < rows; r++) {
        cpu_load_compute(wide, t->dtype, (const char *)in[0].data + (size_t)r * row_bytes, row, d);
        if (wide) layer_norm_row_f64(row, d, eps, gamma, beta, scratch);
        else layer_norm_row_f32(row, d, (float)eps, gamma, beta, scratch);
        cpu_store_compute(wide, t->dtype, row, (char *)out->data + (size_t)r * row_bytes, d);
    }
    al_free(row), al_free(scratch), al_free(gamma), al_free(beta);
    return ALLOY_OK;
}

static int64_t target_at(const rt_tensor *targets, int64_t i)
{
    if (targets->type.dtype == ALLOY_I32) return ((const int32_t *)targets->data)[i];
    return ((const int64_t *)targets->data)[i];
}

/* cross_entropy: the mean over all positions of -log_softmax(logits)[target];
 * a target outside [0, classes) is an error naming the node, position and value. */
alloy_status cpu_cross_entropy_losses(cpu_exec *x, const ir_node *n, const rt_tensor *in, void *losses)
{
    const ir_type *t = &in[0].type;
    int64_t classes = t->dims[t->rank - 1], positions = ir_numel(&in[1].type);
    for (int64_t p = 0; p < positions; p++) {
        int64_t target = target_at(&in[1], p);
        if (target >= 0 && target < classes) continue;
        int64_t idx[ALLOY_MAX_RANK], rest = p;
        for (int d = in[1].type.rank - 1; d >= 0; d--) {
            idx[d] = rest % in[1].type.dims[d];
            rest /= in[1].type.dims[d];
        }
        char label[32], where[128];
        al_fmt_dims(where, sizeof where, in[1].type.rank, idx);
        return cpu_fail(x, ALLOY_ERR_INVALID,
                        "cross_entropy '%s': target %lld at position %s out of range [0, %lld)",
                        ir_node_label(n, label, sizeof label), (long long)target, where,
                        (long long)classes);
    }
    bool wide = t->dtype == ALLOY_F64;
    size_t row_bytes = (size_t)classes * alloy_dtype_size(t->dtype);
    void *row = cpu_alloc_compute(wide, classes), *e = cpu_alloc_compute(wide, classes);
    if (!row || !e) {
        al_free(row), al_free(e);
        return cpu_out_of_memory(x, n);
    }
    for (int64_t p = 0; p < positions; p++) {
        cpu_load_compute(wide, t->dtype, (const char *)in[0].data + (size_t)p * row_bytes, row, classes);
        if (wide) ((double *)losses)[p] = nll_row_f64(row, classes, target_at(&in[1], p), e);
        else ((float *)losses)[p] = nll_row_f32(row, classes, target_at(&in[1], p), e);
    }
    al_free(row), al_free(e);
    return ALLOY_OK;
}

/* the mean over no positions is 0/0 = NaN, as in PyTorch */
void cpu_cross_entropy_mean(bool wide, const void *losses, int64_t positions, rt_tensor *out)
{
    if (wide) {
        double mean = sum_f64(losses, positions) / (double)positions;
        cpu_store_compute(wide, out->type.dtype, &mean, out->data, 1);
    } else {
        float mean = sum_f32(losses, positions) / (float)positions;
        cpu_store_compute(wide, out->type.dtype, &mean, out->data, 1);
    }
}

alloy_status cpu_cross_entropy(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    bool wide = in[0].type.dtype == ALLOY_F64;
    int64_t positions = ir_numel(&in[1].type);
    void *losses = cpu_alloc_compute(wide, positions);
    if (!losses) return cpu_out_of_memory(x, n);
    alloy_status st = cpu_cross_entropy_losses(x, n, in, losses);
    if (!st) cpu_cross_entropy_mean(wide, losses, positions, out);
    al_free(losses);
    return st;
}
