/* alloy/index.h - indexing along an axis (gather, index_select), arange and cumsum (docs/ir.md). */
#ifndef ALLOY_INDEX_H
#define ALLOY_INDEX_H

#include "alloy/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* torch.gather(x, axis, index): index (i32/i64) has x's rank, no dim
 * larger than x's but along axis; out[p] = x[p with its coordinate along
 * axis replaced by index[p]], of index's shape. An index outside [0,
 * x's dim) fails the run naming it and its position. The gradient adds dy
 * into x's gradient where each element was read. AMP: follows x. */
ALLOY_API alloy_tensor *alloy_gather(alloy_graph *g, alloy_tensor *x, int axis, alloy_tensor *index);
/* torch.index_select(x, axis, index): index [K] (i32/i64); the slices of x
 * along axis that index names, in its order (x with dim axis K). Out of
 * range fails the run as gather. The gradient adds each slice of dy into
 * the slice it came from (index_add). AMP: follows x. */
ALLOY_API alloy_tensor *alloy_index_select(alloy_graph *g, alloy_tensor *x, int axis, alloy_tensor *index);
/* torch.arange(start, end, step, dtype): [ceil((end - start) / step)],
 * element i = start + i * step computed in f64 and rounded once; finite
 * values, step != 0 leading from start to end. No gradient. */
ALLOY_API alloy_tensor *alloy_arange(alloy_graph *g, double start, double end, double step, alloy_dtype dtype);
/* torch.cumsum(x, axis): running sums along axis in f32 (f64 for f64 and
 * integers, stored saturated). AMP: f32. The gradient is the cumsum of
 * dy from the other end. */
ALLOY_API alloy_tensor *alloy_cumsum(alloy_graph *g, alloy_tensor *x, int axis);

#ifdef __cplusplus
}
#endif
#endif
