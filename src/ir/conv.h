/* conv.h - the geometry of a convolution or pooling node (sizes, stride, padding, dilation, groups; one spatial dim or two), shared by its type rule, kernels and gradient rule. */
#ifndef ALLOY_IR_CONV_H
#define ALLOY_IR_CONV_H

#include "ir/ir.h"

/* A convolution or pooling window over x [n, c, h, w] (NCHW; an NCL x has
 * h = 1 and a kernel of height 1): the result is [n, o, oh, ow] with
 * oh = (h + 2 ph - dh (kh - 1) - 1) / sh + 1 (floor), likewise ow. A
 * convolution's weight is [o, c / groups, kh, kw]; pools have o = c,
 * groups 1, dilation 1; adaptive_avg_pool2d has only oh, ow (its bins are
 * PyTorch's: rows [floor(i h / oh), ceil((i + 1) h / oh)) of output row i). */
typedef struct ir_conv_geom {
    int spatial; /* 1 (NCL) or 2 (NCHW) */
    int64_t n, c, h, w;
    int64_t o, kh, kw;
    int64_t oh, ow;
    int64_t sh, sw, ph, pw, dh, dw;
    int64_t groups;
} ir_conv_geom;

/* The geometry of node n (conv1d, conv2d, a pool or one of their backward
 * ops) over the forward's input type x and, for a convolution, its weight
 * type w (NULL for pools). Checks the attributes (one entry per spatial
 * dim, stride and dilation >= 1, padding >= 0, a pool's padding at most
 * half its kernel, groups dividing both channel counts) and that the window
 * fits the padded input; nonzero with the reason in why otherwise. */
AL_HIDDEN alloy_status ir_conv_geom_of(const ir_node *n, const ir_type *x, const ir_type *w, ir_conv_geom *g,
                                       char *why, size_t whylen);

#endif
