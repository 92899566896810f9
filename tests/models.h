/* models.h - graphs several test suites share: a two-layer MLP, a small CNN and a transformer block. */
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
