/* alloy/random.h - dropout and random tensors, drawn from a counter-based generator (Philox 4x32-10) so runs are reproducible (docs/ir.md, "Random ops"). */
#ifndef ALLOY_RANDOM_H
#define ALLOY_RANDOM_H

#include "alloy/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Each random node draws element i from Philox 4x32-10 keyed by the graph's
 * seed (alloy_graph_set_seed, read when the graph compiles), the node's
 * stream (its id when built: every random node has its own), the step and
 * i. The step is the training step's counter (updates applied and the
 * micro-batch; a skipped step draws again what it drew) when the graph
 * trains with an optimizer, else 0 on every run. The CPU and the generated
 * CUDA kernels draw the same bits. */

/* torch.nn.functional.dropout(x, p, training): while the graph trains (a
 * loss, training on) each element of x is kept with probability 1 - p and
 * scaled by 1/(1-p), else multiplied by 0 (NaN and inf stay non-finite);
 * p = 1 gives zeros. In a graph that does not train (no loss, or
 * alloy_graph_set_training(g, false)) it is the identity. The gradient
 * reuses the forward's mask, drawn again rather than stored. x floating
 * point, p in [0, 1]. AMP: follows its input. */
ALLOY_API alloy_tensor *alloy_dropout(alloy_graph *g, alloy_tensor *x, double p);
/* A tensor of uniform values in [low, high) (low <= high, both finite): low
 * + (high - low) * u, u with 24 random bits (53 for f64), computed in f64
 * and rounded once to dtype (rounding may reach high). dtype floating point. */
ALLOY_API alloy_tensor *alloy_uniform(alloy_graph *g, alloy_dtype dtype, int rank, const int64_t *dims, double low,
                                      double high);
/* A tensor of normal values N(mean, std^2) (finite, std >= 0) by Box-Muller
 * in f64 from two 53-bit uniforms per element, rounded once to dtype. */
ALLOY_API alloy_tensor *alloy_normal(alloy_graph *g, alloy_dtype dtype, int rank, const int64_t *dims, double mean,
                                     double std);

#ifdef __cplusplus
}
#endif
#endif
