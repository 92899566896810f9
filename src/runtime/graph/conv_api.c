/* conv_api.c - the builder calls of alloy/conv.h: one conv1d, conv2d or pool node each, every window attribute given. */
#include "alloy/conv.h"
#include "runtime/graph/graph_impl.h"

/* The node op over xs (bias NULL: left out) with the window attributes:
 * kernel (or output_size), stride, padding, dilation (NULL: their defaults)
 * of `dims` entries; `groups` is a convolution's groups, avg_pool2d's
 * count_include_pad (nonzero: true). */
static alloy_tensor *window_op(alloy_graph *g, int op, alloy_tensor *x, alloy_tensor *w, alloy_tensor *bias, int dims,
                               const int64_t *kernel, const int64_t *stride, const int64_t *padding,
                               const int64_t *dilation, int64_t groups)
{
    if (!g || g->ir->status) return NULL;
    const char *name = ir_ops[op].name;
    bool conv = op == IR_OP_conv1d || op == IR_OP_conv2d;
    if (!conv && !kernel) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "%s: %s is NULL", name, op == IR_OP_adaptive_avg_pool2d ? "output_size" : "kernel");
        return NULL;
    }
    int64_t ones[2] = {1, 1}, zeros[2] = {0, 0};
    ir_attr a[4];
    int na = 0;
    if (op == IR_OP_adaptive_avg_pool2d) a[na++] = ir_a_ints("output_size", 2, kernel);
    else {
        if (!conv) a[na++] = ir_a_ints("kernel", dims, kernel);
        a[na++] = ir_a_ints("stride", dims, stride ? stride : conv ? ones : kernel);
        a[na++] = ir_a_ints("padding", dims, padding ? padding : zeros);
        if (conv) a[na++] = ir_a_ints("dilation", dims, dilation ? dilation : ones);
    }
    if (conv) a[na++] = ir_a_int("groups", groups);
    else if (op == IR_OP_avg_pool2d) a[na++] = ir_a_bool("count_include_pad", groups != 0);
    alloy_tensor *xs[3] = {x, w, bias};
    return graph_add_op(g, op, conv ? (bias ? 3 : 2) : 1, xs, na, a);
}

alloy_tensor *alloy_conv2d(alloy_graph *g, alloy_tensor *x, alloy_tensor *w, alloy_tensor *bias, const int64_t *stride,
                           const int64_t *padding, const int64_t *dilation, int64_t groups)
{
    return window_op(g, IR_OP_conv2d, x, w, bias, 2, NULL, stride, padding, dilation, groups);
}

alloy_tensor *alloy_conv1d(alloy_graph *g, alloy_tensor *x, alloy_tensor *w, alloy_tensor *bias, int64_t stride,
                           int64_t padding, int64_t dilation, int64_t groups)
{
    return window_op(g, IR_OP_conv1d, x, w, bias, 1, NULL, &stride, &padding, &dilation, groups);
}

alloy_tensor *alloy_max_pool2d(alloy_graph *g, alloy_tensor *x, const int64_t *kernel, const int64_t *stride,
                               const int64_t *padding)
{
    return window_op(g, IR_OP_max_pool2d, x, NULL, NULL, 2, kernel, stride, padding, NULL, -1);
}

alloy_tensor *alloy_avg_pool2d(alloy_graph *g, alloy_tensor *x, const int64_t *kernel, const int64_t *stride,
                               const int64_t *padding, bool count_include_pad)
{
    return window_op(g, IR_OP_avg_pool2d, x, NULL, NULL, 2, kernel, stride, padding, NULL, count_include_pad);
}

alloy_tensor *alloy_adaptive_avg_pool2d(alloy_graph *g, alloy_tensor *x, const int64_t *output_size)
{
    return window_op(g, IR_OP_adaptive_avg_pool2d, x, NULL, NULL, 2, output_size, NULL, NULL, NULL, -1);
}
