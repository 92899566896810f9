/* models.c - graphs several test suites share: a two-layer MLP, a small CNN, a transformer block and the quadratic f64 graph of the optimizer tests. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models.h"

#define DIMS(...) (int64_t[]){__VA_ARGS__}

test_mlp build_mlp(alloy_graph *g, alloy_dtype dt, int batch, int in, int hidden, int out)
{
    test_mlp m;
    m.x = alloy_input(g, "x", dt, 2, DIMS(batch, in));
    m.targets = alloy_input(g, "targets", ALLOY_I32, 1, DIMS(batch));
    alloy_tensor *w1 = alloy_param(g, "w1", dt, 2, DIMS(in, hidden), alloy_init_kaiming_uniform(sqrt(2.0)));
    alloy_tensor *b1 = alloy_param(g, "b1", dt, 1, DIMS(hidden), alloy_init_uniform(-0.1, 0.1));
    alloy_tensor *w2 = alloy_param(g, "w2", dt, 2, DIMS(hidden, out), alloy_init_xavier_uniform(1.0));
    alloy_tensor *b2 = alloy_param(g, "b2", dt, 1, DIMS(out), alloy_init_uniform(-0.1, 0.1));
    alloy_tensor *h = alloy_relu(g, alloy_add(g, alloy_matmul(g, m.x, w1, false, false), b1));
    m.logits = alloy_set_name(g, alloy_add(g, alloy_matmul(g, h, w2, false, false), b2), "logits");
    m.loss = alloy_set_name(g, alloy_cross_entropy(g, m.logits, m.targets), "loss");
    alloy_output(g, "loss", m.loss);
    return m;
}

test_cnn build_cnn(alloy_graph *g, alloy_dtype dt, int batch, int c1, int c2)
{
    test_cnn m;
    alloy_init k = alloy_init_kaiming_uniform(sqrt(2.0));
    m.x = alloy_input(g, "x", dt, 4, DIMS(batch, 1, 8, 8));
    m.targets = alloy_input(g, "targets", ALLOY_I32, 1, DIMS(batch));
    alloy_tensor *w1 = alloy_param(g, "w1", dt, 4, DIMS(c1, 1, 3, 3), k);
    alloy_tensor *b1 = alloy_param(g, "b1", dt, 1, DIMS(c1), alloy_init_uniform(-0.1, 0.1));
    alloy_tensor *w2 = alloy_param(g, "w2", dt, 4, DIMS(c2, c1, 3, 3), k);
    alloy_tensor *b2 = alloy_param(g, "b2", dt, 1, DIMS(c2), alloy_init_uniform(-0.1, 0.1));
    alloy_tensor *fc = alloy_param(g, "fc", dt, 2, DIMS(c2, 10), alloy_init_xavier_uniform(1.0));
    alloy_tensor *fcb = alloy_param(g, "fcb", dt, 1, DIMS(10), alloy_init_uniform(-0.1, 0.1));
    alloy_tensor *h = alloy_set_name(g, alloy_conv2d(g, m.x, w1, NULL, NULL, DIMS(1, 1), NULL, 1), "conv1");
    h = alloy_relu(g, alloy_add(g, h, alloy_reshape(g, b1, 3, DIMS(c1, 1, 1))));
    h = alloy_max_pool2d(g, h, DIMS(2, 2), NULL, NULL);
    h = alloy_set_name(g, alloy_conv2d(g, h, w2, b2, NULL, DIMS(1, 1), NULL, 1), "conv2");
    h = alloy_adaptive_avg_pool2d(g, alloy_relu(g, h), DIMS(1, 1));
    h = alloy_reshape(g, h, 2, DIMS(batch, c2));
    m.logits = alloy_set_name(g, alloy_add(g, alloy_matmul(g, h, fc, false, false), fcb), "logits");
    m.loss = alloy_set_name(g, alloy_cross_entropy(g, m.logits, m.targets), "loss");
    alloy_output(g, "loss", m.loss);
    return m;
}

static alloy_tensor *linear(alloy_graph *g, alloy_tensor *x, const char *name, alloy_dtype dt, int in, int out)
{
    alloy_tensor *w = alloy_param(g, name, dt, 2, DIMS(in, out), alloy_init_normal(0.2 / sqrt((double)in)));
    return alloy_matmul(g, x, w, false, false);
}

static alloy_tensor *norm(alloy_graph *g, alloy_tensor *x, const char *prefix, alloy_dtype dt, int dim)
{
    char gn[32], bn[32];
    snprintf(gn, sizeof gn, "%s.g", prefix);
    snprintf(bn, sizeof bn, "%s.b", prefix);
    alloy_tensor *gamma = alloy_param(g, gn, dt, 1, DIMS(dim), alloy_init_uniform(0.8, 1.2));
    alloy_tensor *beta = alloy_param(g, bn, dt, 1, DIMS(dim), alloy_init_uniform(-0.1, 0.1));
    return alloy_layer_norm(g, x, gamma, beta, 1e-5);
}

test_block build_transformer_block(alloy_graph *g, alloy_dtype dt, int B, int T, int V, int D, int H)
{
    test_block m;
    int hd = D / H, N = B * T;
    m.tokens = alloy_input(g, "tokens", ALLOY_I32, 2, DIMS(B, T));
    m.targets = alloy_input(g, "targets", ALLOY_I32, 1, DIMS(N));
    alloy_tensor *tok = alloy_param(g, "tok_emb", dt, 2, DIMS(V, D), alloy_init_normal(0.5));
    alloy_tensor *pos = alloy_param(g, "pos_emb", dt, 2, DIMS(T, D), alloy_init_normal(0.5));
    alloy_tensor *x = alloy_add(g, alloy_embedding(g, m.tokens, tok), pos); /* [B,T,D] */
    x = alloy_reshape(g, x, 2, DIMS(N, D));
    /* attention */
    alloy_tensor *h = norm(g, x, "ln1", dt, D);
    alloy_tensor *q = linear(g, h, "attn.wq", dt, D, D), *k = linear(g, h, "attn.wk", dt, D, D),
                 *v = linear(g, h, "attn.wv", dt, D, D);
    alloy_tensor *qkv[3] = {q, k, v};
    for (int i = 0; i < 3; i++) /* [N,D] -> [B,H,T,hd] */
        qkv[i] = alloy_transpose(g, alloy_reshape(g, qkv[i], 4, DIMS(B, T, H, hd)), DIMS(0, 2, 1, 3));
    alloy_tensor *scores = alloy_matmul(g, qkv[0], qkv[1], false, true); /* [B,H,T,T] */
    scores = alloy_mul(g, scores, alloy_scalar(g, dt, 1.0 / sqrt((double)hd)));
    alloy_tensor *att = alloy_softmax(g, alloy_causal_mask(g, scores), -1);
    alloy_tensor *y = alloy_matmul(g, att, qkv[2], false, false); /* [B,H,T,hd] */
    y = alloy_reshape(g, alloy_transpose(g, y, DIMS(0, 2, 1, 3)), 2, DIMS(N, D));
    x = alloy_add(g, x, linear(g, y, "attn.wo", dt, D, D));
    /* MLP */
    h = norm(g, x, "ln2", dt, D);
    alloy_tensor *b1 = alloy_param(g, "mlp.b1", dt, 1, DIMS(4 * D), alloy_init_uniform(-0.1, 0.1));
    alloy_tensor *b2 = alloy_param(g, "mlp.b2", dt, 1, DIMS(D), alloy_init_uniform(-0.1, 0.1));
    h = alloy_gelu(g, alloy_add(g, linear(g, h, "mlp.w1", dt, D, 4 * D), b1));
    x = alloy_add(g, x, alloy_add(g, linear(g, h, "mlp.w2", dt, 4 * D, D), b2));
    /* head */
    h = norm(g, x, "lnf", dt, D);
    m.logits = alloy_set_name(g, linear(g, h, "head.w", dt, D, V), "logits");
    m.loss = alloy_set_name(g, alloy_cross_entropy(g, m.logits, m.targets), "loss");
    alloy_output(g, "loss", m.loss);
    return m;
}

alloy_graph *build_quad(uint64_t seed, const alloy_optimizer *o, const alloy_grad_scaler *sc)
{
    alloy_graph *g = alloy_graph_new("quad");
    if (!g) return NULL;
    alloy_graph_set_seed(g, seed);
    alloy_tensor *xw = alloy_input(g, "xw", ALLOY_F64, 2, DIMS(2, 3));
    alloy_tensor *xb = alloy_input(g, "xb", ALLOY_F64, 1, DIMS(3));
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F64, 2, DIMS(2, 3), alloy_init_uniform(-1, 1));
    alloy_tensor *b = alloy_param(g, "b", ALLOY_F64, 1, DIMS(3), alloy_init_uniform(-1, 1));
    alloy_tensor *half = alloy_scalar(g, ALLOY_F64, 0.5);
    alloy_tensor *lw = alloy_add(g, alloy_reduce_sum(g, alloy_mul(g, xw, w), 0, NULL, false),
                                 alloy_mul(g, half, alloy_reduce_sum(g, alloy_square(g, w), 0, NULL, false)));
    alloy_tensor *lb = alloy_add(g, alloy_reduce_sum(g, alloy_mul(g, xb, b), 0, NULL, false),
                                 alloy_mul(g, half, alloy_reduce_sum(g, alloy_square(g, b), 0, NULL, false)));
    alloy_tensor *loss = alloy_set_name(g, alloy_add(g, lw, lb), "loss");
    if (alloy_output(g, "loss", loss) != ALLOY_OK || alloy_graph_set_loss(g, loss) != ALLOY_OK ||
        (sc && alloy_graph_set_grad_scaler(g, *sc) != ALLOY_OK) || (o && alloy_graph_add_optimizer(g, *o) != ALLOY_OK)) {
        fprintf(stderr, "build_quad: %s\n", alloy_last_error(g));
        alloy_graph_free(g);
        return NULL;
    }
    return g;
}

alloy_status read_quad(alloy_graph *g, const char *suffix, double *v)
{
    static const int64_t count[2] = {QUAD_NW, QUAD_NP - QUAD_NW};
    for (int k = 0; k < 2; k++) {
        char name[32];
        alloy_host_tensor t;
        snprintf(name, sizeof name, "%c%s", "wb"[k], suffix);
        alloy_status st = alloy_graph_get_state(g, name, &t);
        if (st != ALLOY_OK) return st;
        if (t.dtype != ALLOY_F64 || alloy_host_tensor_numel(&t) != count[k]) return ALLOY_ERR_DTYPE;
        memcpy(v + (k ? QUAD_NW : 0), t.data, (size_t)count[k] * sizeof(double));
    }
    return ALLOY_OK;
}
