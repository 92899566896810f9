/* mlp_model.h - the benchmarks' MLP (x -> [linear + bias -> relu] x layers -> linear + bias -> cross-entropy) built with alloy's builder API; shared by bench/step_bench.c and bench/gpu_step.c. */
#ifndef ALLOY_BENCH_MLP_MODEL_H
#define ALLOY_BENCH_MLP_MODEL_H

#include "alloy/alloy.h"

/* The MLP's shape: `layers` hidden layers of width `hidden` after an input of width `in`, then a `classes`-way head. */
typedef struct mlp_config {
    int in, hidden, layers, classes;
} mlp_config;

/* Builds the MLP into g for `batch` rows, as examples/mlp_csv.c builds its
 * model: inputs "x" f32 [batch, in] and "labels" i32 [batch], parameters
 * fc<i>.weight [in, out] (Kaiming uniform) and fc<i>.bias [out] (zeros);
 * returns the mean cross-entropy loss, also the output "loss". With
 * resident_x, "x" is instead a frozen parameter (uniform in [-1, 1)): it
 * stays on the device between runs, as a benchmark's batch does in
 * PyTorch, instead of being copied from the host by every run. */
alloy_tensor *mlp_build(alloy_graph *g, const mlp_config *c, int batch, bool resident_x);

#endif
