/* lower_norm.h - batch_norm and group_norm rewritten into other ops for the graph's mode (the lower_norm pass, lower_norm.c). */
#ifndef ALLOY_LOWER_NORM_H
#define ALLOY_LOWER_NORM_H

#include "passes/pass.h"

/* Whether op is one lower_norm rewrites (batch_norm, group_norm). */
AL_HIDDEN bool lower_norm_op(int op);
/* Appends to out the ops computing node n (batch_norm or group_norm of the
 * input graph) from its operands in[] (ids in out), and returns the id of
 * the result, which takes n's name; -1 with the error recorded on out.
 * batch_norm trains (batch statistics) when its `training` attribute says
 * so, or, without one, when opts->train; then each running statistic that
 * is a state leaf gets its update (momentum, the unbiased variance), which
 * grad_scaler gates on step.apply like every forward state update. */
AL_HIDDEN int lower_norm(ir_graph *out, const ir_node *n, const int *in, const pass_options *opts);

#endif
