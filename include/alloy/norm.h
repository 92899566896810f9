/* alloy/norm.h - batch normalization with running statistics, and group normalization (docs/ir.md, docs/training.md "Batch normalization"). */
#ifndef ALLOY_NORM_H
#define ALLOY_NORM_H

#include "alloy/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* torch.nn.BatchNorm1d/2d/3d over x [N, C, ...] (x [N, C] too): per
 * channel, (x - mean) / sqrt(var + eps) * weight + bias. Makes the state
 * "<name>.running_mean" (zeros) and "<name>.running_var" (ones) and, when
 * affine, the params "<name>.weight" (ones) and "<name>.bias" (zeros), all
 * [C] of x's dtype: PyTorch's state_dict names. While the graph trains (a
 * loss, training on) mean and var are the batch's (the biased variance)
 * and each run updates running = (1 - momentum) running + momentum stat
 * with the batch mean and the unbiased variance, only on applied steps (a
 * step the loss scaler skips leaves them as they were); in a graph that
 * does not train the running statistics normalize. Statistics are f32
 * under AMP. momentum in [0, 1] (PyTorch's default 0.1), eps >= 0 (1e-5);
 * training needs more than one value per channel. */
ALLOY_API alloy_tensor *alloy_batch_norm(alloy_graph *g, alloy_tensor *x, const char *name, double momentum, double eps,
                                         bool affine);
/* torch.nn.functional.group_norm: x [N, C, ...] normalized over each
 * sample's groups of C / num_groups channels (and all positions), then
 * times weight and plus bias ([C], both or neither: NULL). num_groups
 * divides C. Statistics are f32 under AMP. */
ALLOY_API alloy_tensor *alloy_group_norm(alloy_graph *g, alloy_tensor *x, int64_t num_groups, alloy_tensor *weight,
                                         alloy_tensor *bias, double eps);

#ifdef __cplusplus
}
#endif
#endif
