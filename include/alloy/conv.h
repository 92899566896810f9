/* alloy/conv.h - convolutions and pooling as torch.nn.functional has them: conv1d, conv2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d (NCL / NCHW). */
#ifndef ALLOY_CONV_H
#define ALLOY_CONV_H

#include <stdbool.h>
#include <stdint.h>

#include "alloy/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Each has a gradient for every floating-point operand. A NULL stride,
 * padding or dilation array takes PyTorch's default (stride 1, a pool's
 * stride its kernel; padding 0; dilation 1); arrays are {height, width}. */

/* torch.nn.functional.conv2d: x [N, C, H, W], w [O, C / groups, kH, kW],
 * bias [O] or NULL -> [N, O, H', W'], H' = (H + 2 pad - dil (kH - 1) - 1) /
 * stride + 1. groups divides C and O (groups = C = O: depthwise). x, w and
 * bias of one floating-point dtype. AMP: low precision (the allow list, as
 * matmul), summed in f32 and rounded once. */
ALLOY_API alloy_tensor *alloy_conv2d(alloy_graph *g, alloy_tensor *x, alloy_tensor *w, alloy_tensor *bias,
                                     const int64_t *stride, const int64_t *padding, const int64_t *dilation,
                                     int64_t groups);
/* torch.nn.functional.conv1d: x [N, C, L], w [O, C / groups, k], bias [O]
 * or NULL -> [N, O, L'], as conv2d along one dim. */
ALLOY_API alloy_tensor *alloy_conv1d(alloy_graph *g, alloy_tensor *x, alloy_tensor *w, alloy_tensor *bias,
                                     int64_t stride, int64_t padding, int64_t dilation, int64_t groups);
/* torch.nn.functional.max_pool2d: the maximum of each kernel window of x
 * [N, C, H, W] (padding counts as -inf; at most half the kernel). The
 * gradient goes to the first maximum of a window (a NaN wins). AMP: follows
 * its input. */
ALLOY_API alloy_tensor *alloy_max_pool2d(alloy_graph *g, alloy_tensor *x, const int64_t *kernel,
                                         const int64_t *stride, const int64_t *padding);
/* torch.nn.functional.avg_pool2d: the mean of each window, divided by the
 * kernel's size when count_include_pad (PyTorch's default), else by the
 * window's elements inside x. AMP: follows its input. */
ALLOY_API alloy_tensor *alloy_avg_pool2d(alloy_graph *g, alloy_tensor *x, const int64_t *kernel,
                                         const int64_t *stride, const int64_t *padding, bool count_include_pad);
/* torch.nn.functional.adaptive_avg_pool2d: x [N, C, H, W] -> [N, C, oH, oW],
 * output row i the mean of rows [floor(i H / oH), ceil((i + 1) H / oH)),
 * likewise columns. AMP: follows its input. */
ALLOY_API alloy_tensor *alloy_adaptive_avg_pool2d(alloy_graph *g, alloy_tensor *x, const int64_t *output_size);

#ifdef __cplusplus
}
#endif

#endif
