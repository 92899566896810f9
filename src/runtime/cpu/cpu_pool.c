/* cpu_pool.c - max_pool2d, avg_pool2d, adaptive_avg_pool2d and their gradients: direct loops in f64 over every window, each result rounded once to its dtype. */
#include <math.h>
#include <string.h>

#include "base/convert.h"
#include "ir/conv.h"
#include "runtime/cpu/cpu.h"

/* The rows [*lo, *hi) of adaptive bin i of `out` over `len`: PyTorch's
 * floor(i len / out) to ceil((i + 1) len / out). */
static void bin(int64_t i, int64_t len, int64_t out, int64_t *lo, int64_t *hi)
{
    *lo = i * len / out;
    *hi = ((i + 1) * len + out - 1) / out;
}

/* The window of output (oy, ox) of a pool with geometry g, clipped to the
 * input: rows [y0, y1), columns [x0, x1); *count is the divisor of an
 * average (the unclipped window size where padding counts). */
static void window(const ir_node *n, const ir_conv_geom *g, int64_t oy, int64_t ox, int64_t *y0, int64_t *y1, int64_t *x0,
                   int64_t *x1, double *count)
{
    if (n->op == IR_OP_adaptive_avg_pool2d || n->op == IR_OP_adaptive_avg_pool2d_grad) {
        bin(oy, g->h, g->oh, y0, y1);
        bin(ox, g->w, g->ow, x0, x1);
        *count = (double)((*y1 - *y0) * (*x1 - *x0));
        return;
    }
    int64_t ys = oy * g->sh - g->ph, xs = ox * g->sw - g->pw;
    *y0 = ys < 0 ? 0 : ys, *y1 = ys + g->kh > g->h ? g->h : ys + g->kh;
    *x0 = xs < 0 ? 0 : xs, *x1 = xs + g->kw > g->w ? g->w : xs + g->kw;
    bool include = ir_attr_schema(n->op, "count_include_pad") && ir_attr_i(n, "count_include_pad");
    *count = include ? (double)(g->kh * g->kw) : (double)((*y1 - *y0) * (*x1 - *x0));
}

/* The flat index in plane p of the first maximum of window (oy, ox) (a NaN
 * wins, the first one; the type rule keeps every window non-empty). */
static int64_t argmax(const ir_node *n, const ir_conv_geom *g, const double *p, int64_t oy, int64_t ox)
{
    int64_t y0, y1, x0, x1, best = -1;
    double count, m = 0;
    window(n, g, oy, ox, &y0, &y1, &x0, &x1, &count);
    for (int64_t y = y0; y < y1; y++)
        for (int64_t x = x0; x < x1; x++) {
            double v = p[y * g->w + x];
            if (best < 0 || (m == m && (v > m || v != v))) m = v, best = y * g->w + x;
        }
    return best;
}

/* Runs pool n (or its gradient) over planes of [h, w] (x) and [oh, ow]
 * (dy) into out, all in f64: forward y from x; max grad dx from x and dy;
 * average grads dx from dy. */
static void pool_f64(const ir_node *n, const ir_conv_geom *g, const double *x, const double *dy, double *out)
{
    bool max = n->op == IR_OP_max_pool2d || n->op == IR_OP_max_pool2d_grad;
    bool grad = n->op == IR_OP_max_pool2d_grad || n->op == IR_OP_avg_pool2d_grad || n->op == IR_OP_adaptive_avg_pool2d_grad;
    int64_t hw = g->h * g->w, ohw = g->oh * g->ow;
    for (int64_t p = 0; p < g->n * g->c; p++)
        for (int64_t oy = 0; oy < g->oh; oy++)
            for (int64_t ox = 0; ox < g->ow; ox++) {
                int64_t o = p * ohw + oy * g->ow + ox;
                if (max) {
                    int64_t at = argmax(n, g, x + p * hw, oy, ox);
                    if (grad) out[p * hw + at] += dy[o];
                    else out[o] = x[p * hw + at];
                    continue;
                }
                int64_t y0, y1, x0, x1;
                double count, s = 0;
                window(n, g, oy, ox, &y0, &y1, &x0, &x1, &count);
                for (int64_t y = y0; y < y1; y++)
                    for (int64_t xx = x0; xx < x1; xx++)
                        if (grad) out[p * hw + y * g->w + xx] += dy[o] / count;
                        else s += x[p * hw + y * g->w + xx];
                if (!grad) out[o] = s / count;
            }
}

/* Loads operand t as f64 into a new block (NULL when out of memory). */
static double *load(const rt_tensor *t)
{
    int64_t count = ir_numel(&t->type);
    double *v = al_malloc(sizeof(double) * (size_t)(count > 0 ? count : 1));
    if (v) cvt_load_f64(t->type.dtype, t->data, v, (size_t)count);
    return v;
}

/* The pools and their gradients: geometry over the forward's input (x, or
 * the declared result of an average's gradient), values in f64, stored once. */
static alloy_status pool(cpu_exec *ex, const ir_node *n, rt_tensor *out, const rt_tensor *in, bool grad)
{
    const ir_type *xt = !grad || n->op == IR_OP_max_pool2d_grad ? &in[0].type : &out->type;
    ir_conv_geom g;
    char why[256], label[32];
    if (ir_conv_geom_of(n, xt, NULL, &g, why, sizeof why))
        return cpu_fail(ex, ALLOY_ERR_VERIFY, "%s '%s': %s", ir_ops[n->op].name, ir_node_label(n, label, sizeof label), why);
    int64_t count = ir_numel(&out->type);
    bool has_x = !grad || n->op == IR_OP_max_pool2d_grad;
    double *x = has_x ? load(&in[0]) : NULL, *dy = grad ? load(&in[has_x ? 1 : 0]) : NULL;
    double *y = al_malloc(sizeof(double) * (size_t)(count > 0 ? count : 1));
    alloy_status st = ALLOY_OK;
    if ((has_x && !x) || (grad && !dy) || !y) st = cpu_out_of_memory(ex, n);
    else {
        memset(y, 0, sizeof(double) * (size_t)count);
        pool_f64(n, &g, x, dy, y);
        cvt_store_f64(out->type.dtype, y, out->data, (size_t)count);
    }
    al_free(x), al_free(dy), al_free(y);
    return st;
}

/* max_pool2d, avg_pool2d, adaptive_avg_pool2d (x) -> y */
alloy_status cpu_pool(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    return pool(x, n, out, in, false);
}

/* max_pool2d_grad (x, dy), avg_pool2d_grad and adaptive_avg_pool2d_grad (dy) -> dx */
alloy_status cpu_pool_grad(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    return pool(x, n, out, in, true);
}
