/* models.h - graphs several test suites share: a two-layer MLP and a transformer block. */
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

#endif
