/* cpu_conv.c - conv1d/conv2d and their input and weight gradients: im2col per image and group, then the GEMM's pieces on the run's threads (gemm_run), f16/bf16 through f32 rounded once on store. */
#include <string.h>

#include "ir/conv.h"
#include "runtime/cpu/cpu.h"
#include "runtime/cpu/gemm.h"

/* A tensor's data in the compute type (f64 when wide, else f32): the data
 * itself when it has that dtype, else a converted copy (*owned). NULL when
 * out of memory. */
static void *compute_view(bool wide, const rt_tensor *t, bool *owned)
{
    *owned = false;
    if (t->type.dtype == (wide ? ALLOY_F64 : ALLOY_F32)) return t->data;
    int64_t count = ir_numel(&t->type);
    void *b = cpu_alloc_compute(wide, count);
    if (!b) return NULL;
    cpu_load_compute(wide, t->type.dtype, t->data, b, count);
    *owned = true;
    return b;
}

/* The column matrix of image x (c_in channels of [h, w], one group's) for
 * geometry g: col[(ci kh + i) kw + j][oy ow + ox] = x[ci][oy sh - ph + i dh][ox sw - pw + j dw],
 * 0 outside the input. */
#define IM2COL(T)                                                                                          \
    static void im2col_##T(const ir_conv_geom *g, int64_t c_in, const T *x, T *col)                        \
    {                                                                                                      \
        int64_t P = g->oh * g->ow;                                                                         \
        for (int64_t ci = 0; ci < c_in; ci++)                                                              \
            for (int64_t i = 0; i < g->kh; i++)                                                            \
                for (int64_t j = 0; j < g->kw; j++) {                                                      \
                    T *row = col + ((ci * g->kh + i) * g->kw + j) * P;                                     \
                    for (int64_t oy = 0; oy < g->oh; oy++) {                                               \
                        int64_t iy = oy * g->sh - g->ph + i * g->dh;                                       \
                        T *r = row + oy * g->ow;                                                           \
                        if (iy < 0 || iy >= g->h) {                                                        \
                            memset(r, 0, sizeof(T) * (size_t)g->ow);                                       \
                            continue;                                                                      \
                        }                                                                                  \
                        const T *xr = x + (ci * g->h + iy) * g->w;                                         \
                        for (int64_t ox = 0; ox < g->ow; ox++) {                                           \
                            int64_t ix = ox * g->sw - g->pw + j * g->dw;                                   \
                            r[ox] = ix >= 0 && ix < g->w ? xr[ix] : (T)0;                                  \
                        }                                                                                  \
                    }                                                                                      \
                }                                                                                          \
    }                                                                                                      \
    /* the adjoint: dx[ci][iy][ix] += col[...] for every entry im2col reads from there */                  \
    static void col2im_##T(const ir_conv_geom *g, int64_t c_in, const T *col, T *dx)                       \
    {                                                                                                      \
        int64_t P = g->oh * g->ow;                                                                         \
        for (int64_t ci = 0; ci < c_in; ci++)                                                              \
            for (int64_t i = 0; i < g->kh; i++)                                                            \
                for (int64_t j = 0; j < g->kw; j++) {                                                      \
                    const T *row = col + ((ci * g->kh + i) * g->kw + j) * P;                               \
                    for (int64_t oy = 0; oy < g->oh; oy++) {                                               \
                        int64_t iy = oy * g->sh - g->ph + i * g->dh;                                       \
                        if (iy < 0 || iy >= g->h) continue;                                                \
                        const T *r = row + oy * g->ow;                                                     \
                        T *xr = dx + (ci * g->h + iy) * g->w;                                              \
                        for (int64_t ox = 0; ox < g->ow; ox++) {                                           \
                            int64_t ix = ox * g->sw - g->pw + j * g->dw;                                   \
                            if (ix >= 0 && ix < g->w) xr[ix] += r[ox];                                     \
                        }                                                                                  \
                    }                                                                                      \
                }                                                                                          \
    }

IM2COL(float)
IM2COL(double)

/* Whether im2col of g is the input itself (a 1x1 kernel, stride 1, no padding). */
static bool direct(const ir_conv_geom *g)
{
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* One product of a convolution, alpha 1, in f32 or f64: its pieces
 * (gemm_parts, fixed by the shape) on the run's threads, so the same bits
 * whatever the thread count. */
static void conv_gemm(cpu_exec *ex, bool f64, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a,
                      int64_t lda, const void *b, int64_t ldb, double beta, void *c, int64_t ldc)
{
    gemm_product p = {f64, ta, tb, m, n, k, lda, ldb, ldc, 1.0, beta, a, b, c};
    gemm_run(&p, ex->workers, ex->nthreads);
}

/* The three products per image b and group gi, in compute type T:
 *   forward      y_g[og, P]  = w_g[og, K] col[K, P] (+ bias)
 *   grad input   dcol[K, P]  = w_g^T dy_g, then col2im into dx
 *   grad weight  dw_g[og, K] += dy_g col^T
 * with K = (c / groups) kh kw, P = oh ow; y, dx, dw zeroed first. */
#define CONV(T)                                                                                             \
    static void conv_##T(cpu_exec *ex, const ir_conv_geom *g, int which, const T *x, const T *w, const T *dy, const T *bias, \
                         T *out, T *col)                                                                    \
    {                                                                                                       \
        int64_t cg = g->c / g->groups, og = g->o / g->groups, K = cg * g->kh * g->kw, P = g->oh * g->ow;    \
        int64_t xs = cg * g->h * g->w, ys = og * P, ws = og * K;                                           \
        bool dir = direct(g);                                                                               \
        for (int64_t b = 0; K && og && b < g->n; b++) /* an empty product adds nothing */                 \
            for (int64_t gi = 0; gi < g->groups; gi++) {                                                    \
                int64_t xo = (b * g->groups + gi) * xs, yo = (b * g->groups + gi) * ys;                     \
                const T *wg = w ? w + gi * ws : NULL;                                                       \
                if (which == 0) {                                                                           \
                    const T *c = dir ? x + xo : col;                                                        \
                    if (!dir) im2col_##T(g, cg, x + xo, col);                                               \
                    conv_gemm(ex, sizeof(T) == sizeof(double), false, false, og, P, K, wg, K, c, P, 1.0, out + yo, P);                     \
                } else if (which == 1) {                                                                    \
                    if (dir) {                                                                              \
                        conv_gemm(ex, sizeof(T) == sizeof(double), true, false, K, P, og, wg, K, dy + yo, P, 1.0, out + xo, P);            \
                    } else {                                                                                \
                        conv_gemm(ex, sizeof(T) == sizeof(double), true, false, K, P, og, wg, K, dy + yo, P, 0.0, col, P);                 \
                        col2im_##T(g, cg, col, out + xo);                                                   \
                    }                                                                                       \
                } else {                                                                                    \
                    const T *c = dir ? x + xo : col;                                                        \
                    if (!dir) im2col_##T(g, cg, x + xo, col);                                               \
                    conv_gemm(ex, sizeof(T) == sizeof(double), false, true, og, K, P, dy + yo, P, c, P, 1.0, out + gi * ws, K);            \
                }                                                                                           \
            }                                                                                               \
        if (which == 0 && bias)                                                                             \
            for (int64_t b = 0; b < g->n; b++)                                                              \
                for (int64_t o = 0; o < g->o; o++)                                                          \
                    for (int64_t p = 0; p < P; p++) out[(b * g->o + o) * P + p] += bias[o];                 \
    }

CONV(float)
CONV(double)

/* Runs product `which` (0 forward, 1 grad input, 2 grad weight) of node n
 * with geometry g: x, w, dy, bias the operands (NULL where the product has
 * none) into out, in f64 when out is f64, else in f32 with one rounding on
 * store. */
static alloy_status run(cpu_exec *ex, const ir_node *n, const ir_conv_geom *g, int which, const rt_tensor *x,
                        const rt_tensor *w, const rt_tensor *dy, const rt_tensor *bias, rt_tensor *out)
{
    bool wide = out->type.dtype == ALLOY_F64, own[5] = {false};
    const rt_tensor *ts[4] = {x, w, dy, bias};
    void *v[5] = {NULL};
    int64_t count = ir_numel(&out->type), K = g->c / g->groups * g->kh * g->kw, P = g->oh * g->ow;
    alloy_status st = ALLOY_OK;
    if (count == 0) return ALLOY_OK;
    for (int k = 0; k < 4 && !st; k++) /* an empty operand (no batch) is read nowhere */
        if (ts[k] && ir_numel(&ts[k]->type) && !(v[k] = compute_view(wide, ts[k], &own[k]))) st = cpu_out_of_memory(ex, n);
    if (!st && !(v[4] = out->type.dtype == (wide ? ALLOY_F64 : ALLOY_F32) ? out->data : cpu_alloc_compute(wide, count)))
        st = cpu_out_of_memory(ex, n);
    own[4] = v[4] != out->data;
    void *col = st || direct(g) ? NULL : cpu_alloc_compute(wide, K * P);
    if (!st && !direct(g) && !col) st = cpu_out_of_memory(ex, n);
    if (!st) {
        memset(v[4], 0, (wide ? sizeof(double) : sizeof(float)) * (size_t)count);
        if (wide) conv_double(ex, g, which, v[0], v[1], v[2], v[3], v[4], col);
        else conv_float(ex, g, which, v[0], v[1], v[2], v[3], v[4], col);
        if (own[4]) cpu_store_compute(wide, out->type.dtype, v[4], out->data, count);
    }
    al_free(col);
    for (int k = 0; k < 5; k++)
        if (own[k]) al_free(v[k]);
    return st;
}

/* The geometry of n over the forward's input type x and weight type w (the
 * type rule checked it). */
static alloy_status geometry(cpu_exec *ex, const ir_node *n, const ir_type *x, const ir_type *w, ir_conv_geom *g)
{
    char why[256];
    if (ir_conv_geom_of(n, x, w, g, why, sizeof why)) {
        char label[32];
        return cpu_fail(ex, ALLOY_ERR_VERIFY, "%s '%s': %s", ir_ops[n->op].name, ir_node_label(n, label, sizeof label), why);
    }
    return ALLOY_OK;
}

/* conv1d / conv2d (x, w[, bias]) -> y */
alloy_status cpu_conv(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    ir_conv_geom g;
    if (geometry(x, n, &in[0].type, &in[1].type, &g)) return x->status;
    return run(x, n, &g, 0, &in[0], &in[1], NULL, n->nin > 2 ? &in[2] : NULL, out);
}

/* conv_grad_input (dy, w) -> dx; conv_grad_weight (x, dy) -> dw */
alloy_status cpu_conv_grad(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    ir_conv_geom g;
    if (n->op == IR_OP_conv_grad_input) {
        if (geometry(x, n, &out->type, &in[1].type, &g)) return x->status;
        return run(x, n, &g, 1, NULL, &in[1], &in[0], NULL, out);
    }
    if (geometry(x, n, &in[0].type, &out->type, &g)) return x->status;
    return run(x, n, &g, 2, &in[0], NULL, &in[1], NULL, out);
}
