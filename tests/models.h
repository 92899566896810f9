/* models.h - graphs several test suites share: a two-layer MLP, a small CNN, a transformer block and the quadratic f64 graph of the optimizer tests. */
#ifndef ALLOY_TEST_MODELS_H
#define ALLOY_TEST_MODELS_H

#include <alloy/alloy.h>

/* x[batch, in] -> matmul w1 + b1 -> relu -> matmul w2 + b2 = "logits" [batch, out];
 * loss = cross_entropy(logits, targets[batch] i32) = "loss".
 * Params: w1 [in, hidden], b1 [hidden], w2 [hidden, out], b2 [out]. */
typedef struct test_mlp {
    alloy_tensor *x, *targets, *logits, *loss;
} test_mlp;
test_mlp build_mlp(alloy_graph *g, alloy_dtype dtype, int batch, int in, int hidden, int out);

/* One pre-norm GPT block over tokens[batch, seq] (i32) with a vocabulary of
 * `vocab`, width `dim`, `heads` heads, a GELU MLP of width 4*dim, and a
 * final layer_norm + head to logits [batch*seq, vocab]; loss =
 * cross_entropy(logits, targets[batch*seq]). Named params: tok_emb, pos_emb,
 * ln1.g/b, attn.wq/wk/wv/wo, ln2.g/b, mlp.w1/b1/w2/b2, lnf.g/b, head.w. */
typedef struct test_block {
    alloy_tensor *tokens, *targets, *logits, *loss;
} test_block;
test_block build_transformer_block(alloy_graph *g, alloy_dtype dtype, int batch, int seq, int vocab,
                                   int dim, int heads);

/* The optimizer tests' graph, in f64: loss = sum(xw * w) + 0.5 sum(w^2) +
 * sum(xb * b) + 0.5 sum(b^2) = "loss", so d loss / d p = x + p for the
 * params w [2,3] and b [3] (uniform in [-1, 1) from `seed`), with inputs
 * xw [2,3] and xb [3]. The tests see w and b as one vector of QUAD_NP
 * values: w's QUAD_NW, then b's. The scaler and optimizer are set when not
 * NULL. NULL when any call fails (alloy_last_error of the graph, if any, says
 * why; the graph is then freed). */
enum { QUAD_NP = 9, QUAD_NW = 6 };
alloy_graph *build_quad(uint64_t seed, const alloy_optimizer *o, const alloy_grad_scaler *sc);

/* The state tensors "w<suffix>" and "b<suffix>" (f64) into v[QUAD_NP]. */
alloy_status read_quad(alloy_graph *g, const char *suffix, double *v);

/* x[batch, 1, 8, 8] -> conv2d 3x3 pad 1 (c1 channels) + b1 as [c1, 1, 1]
 * (an explicit bias add, "conv1") -> relu -> max_pool 2 -> conv2d 3x3 pad 1
 * (c2 channels, its own bias operand b2, "conv2") -> relu -> adaptive
 * average pool to 1x1 -> [batch, c2] -> matmul fc + fcb = "logits"
 * [batch, 10]; loss = cross_entropy(logits, targets[batch] i32) = "loss".
 * Params: w1 [c1, 1, 3, 3], b1 [c1], w2 [c2, c1, 3, 3], b2 [c2], fc [c2, 10],
 * fcb [10], kaiming-uniform weights (gain sqrt 2). */
typedef struct test_cnn {
    alloy_tensor *x, *targets, *logits, *loss;
} test_cnn;
test_cnn build_cnn(alloy_graph *g, alloy_dtype dtype, int batch, int c1, int c2);

#endif
