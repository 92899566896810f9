/* alloy/loss.h - the losses of torch.nn.functional: mse, l1, smooth_l1, binary cross entropy with logits, nll and cross entropy with class weights, ignore_index and label smoothing. */
#ifndef ALLOY_LOSS_H
#define ALLOY_LOSS_H

#include <stdint.h>

#include "alloy/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a loss's per-element (or per-position) values become its result, as
 * PyTorch's `reduction`: their mean (a scalar), their sum (a scalar), or
 * the values themselves (the elementwise losses only). */
typedef enum alloy_reduction {
    ALLOY_REDUCTION_MEAN,
    ALLOY_REDUCTION_SUM,
    ALLOY_REDUCTION_NONE,
} alloy_reduction;

/* ignore_index that ignores no target (PyTorch's default is -100). */
#define ALLOY_NO_IGNORE_INDEX INT64_MIN

/* Every loss computes in f32 under AMP (docs/amp.md: the IR ops are on the
 * deny list), and has a gradient for each floating-point operand but the
 * class weights. The elementwise ones broadcast input and target. */

/* (input - target)^2. */
ALLOY_API alloy_tensor *alloy_mse_loss(alloy_graph *g, alloy_tensor *input, alloy_tensor *target,
                                       alloy_reduction reduction);
/* |input - target|. */
ALLOY_API alloy_tensor *alloy_l1_loss(alloy_graph *g, alloy_tensor *input, alloy_tensor *target,
                                      alloy_reduction reduction);
/* 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, d = input - target;
 * beta finite and >= 0 (0: l1_loss). */
ALLOY_API alloy_tensor *alloy_smooth_l1_loss(alloy_graph *g, alloy_tensor *input, alloy_tensor *target,
                                             double beta, alloy_reduction reduction);
/* -[pw z log sigmoid(x) + (1 - z) log(1 - sigmoid(x))] for logits x and
 * targets z in [0, 1], without overflow; pos_weight pw broadcasts against
 * x (NULL: 1). */
ALLOY_API alloy_tensor *alloy_binary_cross_entropy_with_logits(alloy_graph *g, alloy_tensor *logits,
                                                               alloy_tensor *target, alloy_tensor *pos_weight,
                                                               alloy_reduction reduction);
/* -weight[t] log_probs[..., t] at each position, t its target (i32/i64
 * [...], in [0, C) or ignore_index, itself in [-2^24, 2^24]); log_probs [..., C]; weight [C] or NULL
 * (all 1). Mean: the sum over the weight total of the positions not
 * ignored (NaN when that is 0, as PyTorch); sum: the sum. No NONE. */
ALLOY_API alloy_tensor *alloy_nll_loss(alloy_graph *g, alloy_tensor *log_probs, alloy_tensor *targets,
                                       alloy_tensor *weight, int64_t ignore_index, alloy_reduction reduction);
/* nll_loss of log_softmax(logits) with PyTorch's label smoothing in [0, 1]:
 * (1 - s) nll + s / C sum_c weight[c] (-log_softmax(logits)[c]) per position,
 * reduced as nll_loss. One `cross_entropy` node; alloy_cross_entropy is
 * this with no weight, no ignore_index, no smoothing and the mean. */
ALLOY_API alloy_tensor *alloy_cross_entropy_loss(alloy_graph *g, alloy_tensor *logits, alloy_tensor *targets,
                                                 alloy_tensor *weight, int64_t ignore_index, double label_smoothing,
                                                 alloy_reduction reduction);

#ifdef __cplusplus
}
#endif

#endif
