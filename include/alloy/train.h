/* alloy/train.h - training graphs: the loss, which tensors get gradients, and fetching them. */
#ifndef ALLOY_TRAIN_H
#define ALLOY_TRAIN_H

#include "alloy/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes the floating-point scalar `loss` the graph's loss and turns
 * training on: the compiled step then also computes d loss / d p for every
 * trainable parameter p the loss depends on, fetchable as "grad:<p's name>"
 * (same dtype and shape as p; under AMP parameter gradients are f32). */
ALLOY_API alloy_status alloy_graph_set_loss(alloy_graph *g, alloy_tensor *loss);
/* Turns the backward off (an evaluation graph with a loss) or back on. */
ALLOY_API alloy_status alloy_graph_set_training(alloy_graph *g, bool training);
/* Asks for the gradient of an input as well: "grad:<input name>". */
ALLOY_API alloy_status alloy_graph_request_grad(alloy_graph *g, alloy_tensor *input);
/* Marks a parameter frozen: it gets no gradient (and no update). */
ALLOY_API alloy_status alloy_param_freeze(alloy_graph *g, alloy_tensor *param);

#ifdef __cplusplus
}
#endif
#endif
