/* cpu_grad.c - the structured backward kernels: softmax_grad, log_softmax_grad, layer_norm_grad, cross_entropy_grad, embedding_grad, pad. */
#include <string.h>
#include <tgmath.h>

#include "base/convert.h"
#include "runtime/cpu/cpu.h"

/* As in cpu_norm.c: every kernel loads its operands into f32 buffers (f64
 * when the data is f64), computes there and rounds once on store. Sums of
 * more than LEAF terms are split in halves (pairwise); COLS columns of a
 * non-last axis are gathered at once. */
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
    /* dy <- d x of softmax (y = softmax(x)): y * (dy - sum(dy * y)), or of              \
     * log_softmax (y = log_softmax(x)): dy - exp(y) * sum(dy); t is scratch */            \
    static void softmax_grad_row_##S(const T *y, T *dy, int64_t n, bool log_out, T *t)     \
    {                                                                                      \
        if (log_out) {                                                                     \
            T s = sum_##S(dy, n);                                                          \
            for (int64_t i = 0; i < n; i++) dy[i] = dy[i] - exp(y[i]) * s;                 \
        } else {                                                                           \
            for (int64_t i = 0; i < n; i++) t[i] = dy[i] * y[i];                           \
            T s = sum_##S(t, n);                                                           \
            for (int64_t i = 0; i < n; i++) dy[i] = y[i] * (dy[i] - s);                    \
        }                                                                                  \
    }                                                                                      \
    /* the same along the middle axis of [len, inner] slabs of y and dy (dy is            \
     * overwritten with dx); columns go through ry, rd (COLS at a time) */                 \
    static void softmax_grad_slab_##S(const T *y, T *dy, int64_t len, int64_t inner,       \
                                      bool log_out, T *ry, T *rd, T *t)                    \
    {                                                                                      \
        if (inner == 1) {                                                                  \
            softmax_grad_row_##S(y, dy, len, log_out, t);                                  \
            return;                                                                        \
        }                                                                                  \
        for (int64_t j0 = 0; j0 < inner; j0 += COLS) {                                     \
            int64_t w = inner - j0 < COLS ? inner - j0 : COLS;                             \
            for (int64_t i = 0; i < len; i++)                                              \
                for (int64_t j = 0; j < w; j++) {                                          \
                    ry[j * len + i] = y[i * inner + j0 + j];                               \
                    rd[j * len + i] = dy[i * inner + j0 + j];                              \
                }                                                                          \
            for (int64_t j = 0; j < w; j++)                                                \
                softmax_grad_row_##S(ry + j * len, rd + j * len, len, log_out, t);         \
            for (int64_t i = 0; i < len; i++)                                              \
                for (int64_t j = 0; j < w; j++) dy[i * inner + j0 + j] = rd[j * len + i];  \
        }                                                                                  \
    }                                                                                      \
    /* dy <- d x of y = (x - mean) * rstd * gamma + beta over one row (biased            \
     * variance, as the forward): rstd * (g - mean(g) - xhat * mean(g * xhat)),            \
     * g = dy * gamma (dy without gamma); t, u are scratch for n elements */               \
    static void layer_norm_grad_row_##S(const T *x, T *dy, int64_t n, T eps, const T *gamma, \
                                        T *t, T *u)                                        \
    {                                                                                      \
        T mean = sum_##S(x, n) / (T)n;                                                     \
        for (int64_t i = 0; i < n; i++) t[i] = (x[i] - mean) * (x[i] - mean);              \
        T rstd = (T)1 / sqrt(sum_##S(t, n) / (T)n + eps);                                  \
        for (int64_t i = 0; i < n; i++) {                                                  \
            T g = gamma ? dy[i] * gamma[i] : dy[i];                                        \
            t[i] = (x[i] - mean) * rstd; /* xhat */                                        \
            dy[i] = g;                                                                     \
            u[i] = g * t[i];                                                               \
        }                                                                                  \
        T mean_g = sum_##S(dy, n) / (T)n, mean_gx = sum_##S(u, n) / (T)n;                  \
        for (int64_t i = 0; i < n; i++) dy[i] = rstd * (dy[i] - mean_g - t[i] * mean_gx);  \
    }                                                                                      \
    /* v <- (softmax(v) - onehot(target)) * scale; e is scratch */                         \
    static void cross_entropy_grad_row_##S(T *v, int64_t n, int64_t target, T scale, T *e) \
    {                                                                                      \
        T m = -INFINITY;                                                                   \
        for (int64_t i = 0; i < n && m == m; i++)                                          \
            if (v[i] > m || v[i] != v[i]) m = v[i];                                        \
        for (int64_t i = 0; i < n; i++) e[i] = exp(v[i] - m);                              \
        T s = sum_##S(e, n);                                                               \
        for (int64_t i = 0; i < n; i++) v[i] = (e[i] / s - (i == target ? (T)1 : (T)0)) * scale; \
    }

DEFINE_ROWS(f32, float)
DEFINE_ROWS(f64, double)


/* Element i of an i32 or i64 tensor. */
static int64_t int_at(const rt_tensor *t, int64_t i)
{
    if (t->type.dtype == ALLOY_I32) return ((const int32_t *)t->data)[i];
    return ((const int64_t *)t->data)[i];
}

/* Checks every element of the integer tensor ids is in [0, limit); else an
 * error naming the op, the node, the value, the range and the position, in
 * the words of the forward kernel's message (embedding names the range
 * first, cross_entropy the position). */
static alloy_status check_range(cpu_exec *x, const ir_node *n, const rt_tensor *ids, int64_t limit,
                                const char *what)
{
    bool range_first = n->op == IR_OP_embedding_grad;
    int64_t count = ir_numel(&ids->type);
    for (int64_t p = 0; p < count; p++) {
        int64_t v = int_at(ids, p);
        if (v >= 0 && v < limit) continue;
        int64_t idx[ALLOY_MAX_RANK], rest = p;
        for (int d = ids->type.rank - 1; d >= 0; d--) {
            idx[d] = rest % ids->type.dims[d];
            rest /= ids->type.dims[d];
        }
        char label[32], where[128];
        al_fmt_dims(where, sizeof where, ids->type.rank, idx);
        const char *name = ir_node_label(n, label, sizeof label);
        if (range_first)
            return cpu_fail(x, ALLOY_ERR_INVALID, "%s '%s': %s %lld out of range [0, %lld) at position %s",
                            ir_ops[n->op].name, name, what, (long long)v, (long long)limit, where);
        return cpu_fail(x, ALLOY_ERR_INVALID, "%s '%s': %s %lld at position %s out of range [0, %lld)",
                        ir_ops[n->op].name, name, what, (long long)v, where, (long long)limit);
    }
    return ALLOY_OK;
}

/* softmax_grad / log_softmax_grad (y, dy) -> dx along `axis` (default -1):
 * y * (dy - sum(dy * y)) resp. dy - exp(y) * sum(dy). */
alloy_status cpu_softmax_grad(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *t = &in[0].type;
    int axis = t->rank - 1;
    ir_norm_axis(ir_attr_int(n, "axis", -1), t->rank, &axis);
    if (ir_numel(t) == 0) return ALLOY_OK;
    int64_t outer = 1, len = t->rank ? t->dims[axis] : 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= t->dims[d];
    for (int d = axis + 1; d < t->rank; d++) inner *= t->dims[d];
    bool wide = t->dtype == ALLOY_F64, log_out = n->op == IR_OP_log_softmax_grad;
    size_t slab_bytes = (size_t)(len * inner) * alloy_dtype_size(t->dtype);
    int64_t cols = inner < COLS ? inner : COLS;
    void *y = cpu_alloc_compute(wide, len * inner), *dy = cpu_alloc_compute(wide, len * inner);
    void *ry = cpu_alloc_compute(wide, len * cols), *rd = cpu_alloc_compute(wide, len * cols);
    void *tmp = cpu_alloc_compute(wide, len);
    if (!y || !dy || !ry || !rd || !tmp) {
        al_free(y), al_free(dy), al_free(ry), al_free(rd), al_free(tmp);
        return cpu_out_of_memory(x, n);
    }
    for (int64_t o = 0; o < outer; o++) {
        size_t off = (size_t)o * slab_bytes;
        cpu_load_compute(wide, t->dtype, (const char *)in[0].data + off, y, len * inner);
        cpu_load_compute(wide, in[1].type.dtype, (const char *)in[1].data + off, dy, len * inner);
        if (wide) softmax_grad_slab_f64(y, dy, len, inner, log_out, ry, rd, tmp);
        else softmax_grad_slab_f32(y, dy, len, inner, log_out, ry, rd, tmp);
        cpu_store_compute(wide, t->dtype, dy, (char *)out->data + off, len * inner);
    }
    al_free(y), al_free(dy), al_free(ry), al_free(rd), al_free(tmp);
    return ALLOY_OK;
}

/* layer_norm_grad (x, dy[, gamma]) -> dx over the last axis, eps as the
 * forward's (default 1e-5). */
alloy_status cpu_layer_norm_grad(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *t = &in[0].type;
    int64_t d = t->dims[t->rank - 1], rows = d ? ir_numel(t) / d : 0;
    if (rows == 0) return ALLOY_OK;
    bool wide = t->dtype == ALLOY_F64, affine = n->nin == 3;
    double eps = ir_attr_float(n, "eps", 1e-5);
    size_t row_bytes = (size_t)d * alloy_dtype_size(t->dtype);
    void *xr = cpu_alloc_compute(wide, d), *dy = cpu_alloc_compute(wide, d);
    void *t1 = cpu_alloc_compute(wide, d), *t2 = cpu_alloc_compute(wide, d);
    void *gamma = affine ? cpu_alloc_compute(wide, d) : NULL;
    if (!xr || !dy || !t1 || !t2 || (affine && !gamma)) {
        al_free(xr), al_free(dy), al_free(t1), al_free(t2), al_free(gamma);
        return cpu_out_of_memory(x, n);
    }
    if (affine) cpu_load_compute(wide, in[2].type.dtype, in[2].data, gamma, d);
    for (int64_t r = 0; r < rows; r++) {
        size_t off = (size_t)r * row_bytes;
        cpu_load_compute(wide, t->dtype, (const char *)in[0].data + off, xr, d);
        cpu_load_compute(wide, in[1].type.dtype, (const char *)in[1].data + off, dy, d);
        if (wide) layer_norm_grad_row_f64(xr, dy, d, eps, gamma, t1, t2);
        else layer_norm_grad_row_f32(xr, dy, d, (float)eps, gamma, t1, t2);
        cpu_store_compute(wide, t->dtype, dy, (char *)out->data + off, d);
    }
    al_free(xr), al_free(dy), al_free(t1), al_free(t2), al_free(gamma);
    return ALLOY_OK;
}

/* cross_entropy_grad (logits [..., C], targets [...], dloss []) -> dlogits:
 * (softmax(logits) - onehot(target)) * dloss / N over the N positions; a
 * target outside [0, C) is an error naming the node. */
alloy_status cpu_cross_entropy_grad(cpu_exec *x, const ir_node *n, rt_tensor *out,
                                    const rt_tensor *in)
{
    return cpu_cross_entropy_grad_part(x, n, out, in, ir_numel(&in[1].type));
}

alloy_status cpu_cross_entropy_grad_part(cpu_exec *x, const ir_node *n, rt_tensor *out,
                                         const rt_tensor *in, int64_t total)
{
    const ir_type *t = &in[0].type;
    int64_t classes = t->dims[t->rank - 1], positions = ir_numel(&in[1].type);
    alloy_status st = check_range(x, n, &in[1], classes, "target");
    if (st) return st;
    if (positions == 0 || classes == 0) return ALLOY_OK;
    bool wide = t->dtype == ALLOY_F64;
    size_t row_bytes = (size_t)classes * alloy_dtype_size(t->dtype);
    void *row = cpu_alloc_compute(wide, classes), *e = cpu_alloc_compute(wide, classes);
    if (!row || !e) {
        al_free(row), al_free(e);
        return cpu_out_of_memory(x, n);
    }
    double dloss64;
    float dloss32;
    cvt_load_f64(in[2].type.dtype, in[2].data, &dloss64, 1);
    cvt_load_f32(in[2].type.dtype, in[2].data, &dloss32, 1);
    for (int64_t p = 0; p < positions; p++) {
        size_t off = (size_t)p * row_bytes;
        cpu_load_compute(wide, t->dtype, (const char *)in[0].data + off, row, classes);
        if (wide) cross_entropy_grad_row_f64(row, classes, int_at(&in[1], p), dloss64 / (double)total, e);
        else cross_entropy_grad_row_f32(row, classes, int_at(&in[1], p), dloss32 / (float)total, e);
        cpu_store_compute(wide, t->dtype, row, (char *)out->data + off, classes);
    }
    al_free(row), al_free(e);
    return ALLOY_OK;
}

/* embedding_grad (ids [...], dy [..., D]) -> dtable [rows, D]: zeros, then
 * row ids[p] += dy[p] for every position p in order, summed in an f32 table
 * (f64 for f64) and rounded once; an id outside [0, rows) is an error. */
alloy_status cpu_embedding_grad(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const rt_tensor *ids = &in[0], *dy = &in[1];
    int64_t rows = out->type.dims[0], d = out->type.dims[1], count = ir_numel(&ids->type);
    alloy_status st = check_range(x, n, ids, rows, "id");
    if (st) return st;
    if (rows * d == 0) return ALLOY_OK;
    bool wide = out->type.dtype == ALLOY_F64;
    size_t es = wide ? sizeof(double) : sizeof(float);
    void *table = al_calloc((size_t)(rows * d), es), *row = cpu_alloc_compute(wide, d);
    if (!table || !row) {
        al_free(table), al_free(row);
        return cpu_out_of_memory(x, n);
    }
    size_t row_bytes = (size_t)d * alloy_dtype_size(dy->type.dtype);
    for (int64_t p = 0; p < count; p++) {
        cpu_load_compute(wide, dy->type.dtype, (const char *)dy->data + (size_t)p * row_bytes, row, d);
        int64_t id = int_at(ids, p);
        if (wide) {
            double *acc = (double *)table + id * d;
            for (int64_t j = 0; j < d; j++) acc[j] += ((const double *)row)[j];
        } else {
            float *acc = (float *)table + id * d;
            for (int64_t j = 0; j < d; j++) acc[j] += ((const float *)row)[j];
        }
    }
    cpu_store_compute(wide, out->type.dtype, table, out->data, rows * d);
    al_free(table), al_free(row);
    return ALLOY_OK;
}

/* pad: `before` zeros, the operand, `after` zeros along `axis`. */
alloy_status cpu_pad(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)x;
    const ir_type *t = &in[0].type;
    int axis = 0;
    ir_norm_axis(ir_attr_int(n, "axis", 0), t->rank, &axis);
    size_t bytes = ir_nbytes(&out->type);
    if (bytes == 0) return ALLOY_OK;
    memset(out->data, 0, bytes); /* all-zero bytes are +0 in every dtype */
    int64_t before = ir_attr_int(n, "before", 0), outer = 1;
    size_t inner = alloy_dtype_size(t->dtype);
    for (int d = 0; d < axis; d++) outer *= t->dims[d];
    for (int d = axis + 1; d < t->rank; d++) inner *= (size_t)t->dims[d];
    size_t in_block = (size_t)t->dims[axis] * inner, out_block = (size_t)out->type.dims[axis] * inner;
    if (in_block == 0) return ALLOY_OK;
    for (int64_t o = 0; o < outer; o++)
        memcpy((char *)out->data + (size_t)o * out_block + (size_t)before * inner,
               (const char *)in[0].data + (size_t)o * in_block, in_block);
    return ALLOY_OK;
}
