/* gpt_model.c - a small GPT (pre-norm transformer over token ids) built with alloy's builder API. */
#include <math.h>
#include <stdio.h>

#include "gpt_model.h"

#define DIMS(...) (int64_t[]){__VA_ARGS__}

/* What every layer of one build needs to know. */
typedef struct builder {
    alloy_graph *g;
    const gpt_config *cfg;
    int batch;
    int64_t rows;         /* batch * context: the rows of every [rows, dim] activation */
    double residual_std;  /* init std of the layers that write into the residual stream */
} builder;

const char *gpt_config_problem(const gpt_config *cfg)
{
    if (cfg->vocab < 1) return "the vocabulary is empty";
    if (cfg->context < 1) return "--context must be at least 1";
    if (cfg->dim < 1) return "--dim must be at least 1";
    if (cfg->layers < 1) return "--layers must be at least 1";
    if (cfg->heads < 1) return "--heads must be at least 1";
    if (cfg->mlp_width < 1) return "the MLP width must be at least 1";
    if (cfg->dim % cfg->heads != 0) return "--dim must be a multiple of --heads";
    return NULL;
}

/* A parameter called "<prefix>.<what>". */
static alloy_tensor *param(builder *b, const char *prefix, const char *what, int rank,
                           const int64_t *dims, alloy_init init)
{
    char name[96];
    snprintf(name, sizeof name, "%s.%s", prefix, what);
    return alloy_param(b->g, name, ALLOY_F32, rank, dims, init);
}

/* x [rows, in] @ "<prefix>.weight" [in, out] + "<prefix>.bias" [out]. The
 * weight starts at N(0, std) and the bias at zero, as in GPT-2. */
static alloy_tensor *linear(builder *b, alloy_tensor *x, const char *prefix, int in, int out,
                            double std)
{
    alloy_tensor *w = param(b, prefix, "weight", 2, DIMS(in, out), alloy_init_normal(std));
    alloy_tensor *bias = param(b, prefix, "bias", 1, DIMS(out), alloy_init_zeros());
    return alloy_add(b->g, alloy_matmul(b->g, x, w, false, false), bias);
}

/* layer_norm over the last axis with a learned gain (ones) and shift (zeros). */
static alloy_tensor *norm(builder *b, alloy_tensor *x, const char *prefix)
{
    int dim = b->cfg->dim;
    alloy_tensor *gain = param(b, prefix, "weight", 1, DIMS(dim), alloy_init_ones());
    alloy_tensor *shift = param(b, prefix, "bias", 1, DIMS(dim), alloy_init_zeros());
    return alloy_layer_norm(b->g, x, gain, shift, 1e-5);
}

/* [rows, dim] -> [batch, heads, context, dim/heads]. */
static alloy_tensor *split_heads(builder *b, alloy_tensor *x)
{
    int64_t B = b->batch, T = b->cfg->context, H = b->cfg->heads, hd = b->cfg->dim / H;
    x = alloy_reshape(b->g, x, 4, DIMS(B, T, H, hd));
    return alloy_transpose(b->g, x, DIMS(0, 2, 1, 3));
}

/* Causal multi-head self-attention of x [rows, dim]: one fused q|k|v
 * projection, softmax(q k^T / sqrt(head_dim)) v per head, the heads joined
 * and projected back to [rows, dim]. */
static alloy_tensor *attention(builder *b, alloy_tensor *x, const char *prefix)
{
    alloy_graph *g = b->g;
    int D = b->cfg->dim, hd = D / b->cfg->heads;
    char name[64];
    snprintf(name, sizeof name, "%s.qkv", prefix);
    alloy_tensor *qkv = linear(b, x, name, D, 3 * D, 0.02); /* [rows, 3*dim] */
    alloy_tensor *q = split_heads(b, alloy_slice(g, qkv, 1, 0, D));
    alloy_tensor *k = split_heads(b, alloy_slice(g, qkv, 1, D, 2 * D));
    alloy_tensor *v = split_heads(b, alloy_slice(g, qkv, 1, 2 * D, 3 * D));
    /* Scaling q rather than the scores touches context/head_dim times fewer values. */
    q = alloy_mul(g, q, alloy_scalar(g, ALLOY_F32, 1.0 / sqrt((double)hd)));
    alloy_tensor *scores = alloy_matmul(g, q, k, false, true); /* [B, H, T, T] */
    alloy_tensor *weights = alloy_softmax(g, alloy_causal_mask(g, scores), -1);
    alloy_tensor *y = alloy_matmul(g, weights, v, false, false); /* [B, H, T, hd] */
    y = alloy_reshape(g, alloy_transpose(g, y, DIMS(0, 2, 1, 3)), 2, DIMS(b->rows, D));
    snprintf(name, sizeof name, "%s.proj", prefix);
    return linear(b, y, name, D, D, b->residual_std);
}

/* The position-wise MLP: linear to mlp_width, GELU (erf, or the tanh form), linear back to dim. */
static alloy_tensor *mlp(builder *b, alloy_tensor *x, const char *prefix)
{
    int D = b->cfg->dim, W = b->cfg->mlp_width;
    char name[64];
    snprintf(name, sizeof name, "%s.fc", prefix);
    alloy_tensor *pre = linear(b, x, name, D, W, 0.02);
    alloy_tensor *h = b->cfg->gelu_tanh ? alloy_gelu_tanh(b->g, pre) : alloy_gelu(b->g, pre);
    snprintf(name, sizeof name, "%s.proj", prefix);
    return linear(b, h, name, W, D, b->residual_std);
}

/* One pre-norm transformer block "h<layer>" on the residual stream x. */
static alloy_tensor *block(builder *b, alloy_tensor *x, int layer)
{
    char prefix[32], sub[48];
    snprintf(prefix, sizeof prefix, "h%d", layer);
    snprintf(sub, sizeof sub, "%s.ln1", prefix);
    alloy_tensor *h = norm(b, x, sub);
    snprintf(sub, sizeof sub, "%s.attn", prefix);
    x = alloy_add(b->g, x, attention(b, h, sub));
    snprintf(sub, sizeof sub, "%s.ln2", prefix);
    h = norm(b, x, sub);
    snprintf(sub, sizeof sub, "%s.mlp", prefix);
    return alloy_add(b->g, x, mlp(b, h, sub));
}

gpt_model gpt_build(alloy_graph *g, const gpt_config *cfg, int batch, bool with_loss)
{
    /* GPT-2's init: N(0, 0.02), and the projections into the residual
     * stream scaled by 1/sqrt(2 * layers) so its variance stays put. */
    builder b = {g, cfg, batch, (int64_t)batch * cfg->context, 0.02 / sqrt(2.0 * cfg->layers)};
    int64_t B = batch, T = cfg->context, D = cfg->dim, V = cfg->vocab;
    gpt_model m = {0};
    m.tokens = alloy_input(g, "tokens", ALLOY_I32, 2, DIMS(B, T));
    alloy_tensor *tok_emb = alloy_param(g, "tok_emb", ALLOY_F32, 2, DIMS(V, D), alloy_init_normal(0.02));
    alloy_tensor *pos_emb = alloy_param(g, "pos_emb", ALLOY_F32, 2, DIMS(T, D), alloy_init_normal(0.02));
    alloy_tensor *x = alloy_add(g, alloy_embedding(g, m.tokens, tok_emb), pos_emb); /* [B, T, D] */
    x = alloy_reshape(g, x, 2, DIMS(B * T, D));
    for (int layer = 0; layer < cfg->layers; layer++) x = block(&b, x, layer);
    x = norm(&b, x, "ln_f");
    alloy_tensor *head = alloy_param(g, "head.weight", ALLOY_F32, 2, DIMS(D, V), alloy_init_normal(0.02));
    m.logits = alloy_set_name(g, alloy_matmul(g, x, head, false, false), "logits");
    if (with_loss) {
        m.targets = alloy_input(g, "targets", ALLOY_I32, 1, DIMS(B * T));
        m.loss = alloy_set_name(g, alloy_cross_entropy(g, m.logits, m.targets), "loss");
        alloy_output(g, "loss", m.loss);
    } else {
        alloy_output(g, "logits", m.logits);
    }
    return m;
}
