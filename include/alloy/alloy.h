/* alloy/alloy.h - alloy, a graph compiler for mixed-precision training: the whole public API.
 *
 *     alloy_graph *g = alloy_graph_new("mlp");
 *     alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){B, D});
 *     alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 2, (int64_t[]){D, H},
 *                                   alloy_init_normal(0.02));
 *     alloy_output(g, "y", alloy_relu(g, alloy_matmul(g, x, w, false, false)));
 *
 *     alloy_host_tensor feed = {"x", ALLOY_F32, 2, {B, D}, xdata};
 *     alloy_host_tensor fetch = {.name = "y"};
 *     if (alloy_graph_run(g, &feed, 1, &fetch, 1))
 *         fprintf(stderr, "%s\n", alloy_last_error(g));
 *     // fetch.data now points at y (owned by g until the next run)
 *     alloy_graph_free(g);
 *
 * Builder calls never abort: a bad shape or dtype records an error on the
 * graph (naming the op, operand types and node) and returns NULL, which
 * later calls pass through; alloy_graph_run returns the first error.
 */
#ifndef ALLOY_ALLOY_H
#define ALLOY_ALLOY_H

#include "alloy/types.h"
#include "alloy/graph.h"
#include "alloy/loss.h"
#include "alloy/amp.h"
#include "alloy/safetensors.h"
#include "alloy/train.h"
#include "alloy/random.h"
#include "alloy/conv.h"
#include "alloy/norm.h"
#include "alloy/index.h"
#include "alloy/cuda.h"
#include "alloy/cost.h"
#include "alloy/bundle.h"

#endif
