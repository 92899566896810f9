/* mha_support.h - what the suites of a multi-head attention over a fused projection (test_attn_views.c, test_ptrbatch.c, test_remat.c) share: the graph's pieces, its data and results, their comparisons, the emulated device. */
#ifndef ALLOY_TEST_MHA_SUPPORT_H
#define ALLOY_TEST_MHA_SUPPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "alloy/alloy.h"

/* Batch, context, heads, head dim: C = h * d features, N = b * t rows. */
typedef struct mha_shape {
    int64_t b, t, h, d;
} mha_shape;

/* A graph being built: inputs x [N, C], w [C, 3C], r [N, C] of dtype dt. */
typedef struct mha_graph {
    alloy_graph *g;
    mha_shape sh;
    alloy_dtype dt;
    alloy_tensor *x, *w, *r;
} mha_graph;

/* A new graph called name with the inputs x, w and r. */
mha_graph mha_graph_new(const char *name, mha_shape sh, alloy_dtype dt);
/* Column block `block` (0 q, 1 k, 2 v) of the projection qkv [N, 3C] split
 * into heads: [N, C] -> [B, H, T, D]. */
alloy_tensor *mha_heads(const mha_graph *m, alloy_tensor *qkv, int block);
/* Attention written out: softmax(causal_mask((q / sqrt(D)) k^T)) v. */
alloy_tensor *mha_written_out(const mha_graph *m, alloy_tensor *q, alloy_tensor *k, alloy_tensor *v);
/* The heads of o [B, H, T, D] joined back into y [N, C], the output "y",
 * the loss sum(y * r) (squared: sum(y * r * y)), x's and w's gradients
 * requested; returns the graph. */
alloy_graph *mha_graph_finish(const mha_graph *m, alloy_tensor *o, bool squared);

/* One configuration's data: x and r uniform in [-1, 1), w in [-0.5, 0.5),
 * rounded to dt, from test_rng = seed. */
typedef struct mha_data {
    mha_shape sh;
    alloy_dtype dt;
    void *x, *w, *r;
} mha_data;
mha_data mha_make_data(mha_shape sh, alloy_dtype dt, unsigned seed);
void mha_free_data(mha_data *d);

/* What a run gives back: y [N, C], grad:x [N, C], grad:w [C, 3C], as doubles. */
typedef struct mha_result {
    mha_shape sh;
    double *y, *gx, *gw;
} mha_result;
/* d's feeds x, w, r, and the fetches y, grad:x, grad:w (empty). */
void mha_io(const mha_data *d, alloy_host_tensor feeds[3], alloy_host_tensor fetch[3]);
/* What fetch (filled by a run) holds. */
mha_result mha_fetched(mha_shape sh, const alloy_host_tensor fetch[3]);
/* `runs` runs of g with d's feeds (the test fails on an error); the last one's results. */
mha_result mha_run(alloy_graph *g, const mha_data *d, int runs);
/* g saved as a bundle at path, loaded and run once with d's feeds (the test fails on an error). */
mha_result mha_run_bundle(alloy_graph *g, const mha_data *d, const char *path);
void mha_free_result(mha_result *r);
/* Fails the test, naming what, unless a and b hold the same values bit for bit. */
void mha_expect_same(const mha_result *a, const mha_result *b, const char *what);

/* The largest |a - b| relative to the largest |b| over n values. */
double mha_rel_diff(const double *a, const double *b, int64_t n);
/* How far a value may drift from the CPU's through `depth` ops whose
 * longest sum has `terms` terms, relative to the largest magnitude (as
 * test_cuda.c's chain_bound: per op each side's rounding of the stored
 * result, 2u; the sums in another f32 order, doubled for tensor cores,
 * 2 n u32; CUDA's math at 2 ulp, 4 u32). */
double mha_chain_bound(int depth, int terms, alloy_dtype dt);

/* Steps of g's compiled schedule running a kernel for a transpose, slice
 * or concat (layout copies); *strided (unless NULL) its attention ops
 * (forward and backward) that read or write through strides. */
int mha_layout_copies(const alloy_graph *g, int *strided);

/* The CUDA backend opened on the host emulation of the device from now on,
 * or the test skipped, saying why, where the emulation cannot run. */
void mha_emulated_device_or_skip(void);

#endif
