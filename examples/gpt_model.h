/* gpt_model.h - a small GPT (pre-norm transformer over token ids) built with alloy's builder API; shared by examples/char_gpt.c and bench/char_gpt_bench.c. */
#ifndef ALLOY_EXAMPLES_GPT_MODEL_H
#define ALLOY_EXAMPLES_GPT_MODEL_H

#include "alloy/alloy.h"

/* The model's shape. dim must be a multiple of heads. */
typedef struct gpt_config {
    int vocab;     /* distinct token ids: 0 .. vocab-1 */
    int context;   /* tokens per sequence (also the positional table's length) */
    int dim;       /* embedding width */
    int layers;    /* transformer blocks */
    int heads;     /* attention heads per block */
    int mlp_width; /* hidden width of each block's GELU MLP */
    bool gelu_tanh; /* the MLP's GELU in its tanh form (GPT-2's own); false: the erf form */
} gpt_config;

/* The handles a caller feeds, fetches or trains on. */
typedef struct gpt_model {
    alloy_tensor *tokens;  /* input "tokens", i32 [batch, context] */
    alloy_tensor *logits;  /* "logits", [batch * context, vocab]: row b*context+t predicts token t+1 */
    alloy_tensor *targets; /* input "targets", i32 [batch * context]; NULL without a loss */
    alloy_tensor *loss;    /* "loss", mean cross-entropy; NULL without a loss */
} gpt_model;

/* NULL when cfg describes a model gpt_build can make, else a one-line reason. */
const char *gpt_config_problem(const gpt_config *cfg);

/* Builds the model into g for `batch` sequences: token + learned positional
 * embedding, cfg->layers pre-norm blocks (x += attention(ln1(x));
 * x += mlp(ln2(x))), a final layer_norm and an untied linear head. With
 * with_loss the graph gets the "targets" input and the output "loss" (the
 * caller sets it as g's loss to train; "logits" stays fetchable by name);
 * without, the output is "logits". All tensors are f32; AMP
 * is the caller's choice. Parameter names and shapes depend on cfg only, not
 * on batch, so graphs built at different batch sizes share state by name:
 *   tok_emb [vocab, dim], pos_emb [context, dim],
 *   h<i>.ln1.{weight,bias} [dim], h<i>.attn.qkv.weight [dim, 3*dim],
 *   h<i>.attn.qkv.bias [3*dim], h<i>.attn.proj.{weight [dim, dim], bias [dim]},
 *   h<i>.ln2.{weight,bias}, h<i>.mlp.fc.{weight [dim, mlp_width], bias},
 *   h<i>.mlp.proj.{weight [mlp_width, dim], bias}, ln_f.{weight,bias},
 *   head.weight [dim, vocab].
 * Errors are recorded on g (alloy_graph_run reports them). */
gpt_model gpt_build(alloy_graph *g, const gpt_config *cfg, int batch, bool with_loss);

#endif
