/* mlp_model.c - the benchmarks' MLP built with alloy's builder API (mlp_model.h). */
#include <stdio.h>

#include "mlp_model.h"

alloy_tensor *mlp_build(alloy_graph *g, const mlp_config *c, int batch, bool resident_x)
{
    alloy_tensor *h;
    if (resident_x) {
        h = alloy_param(g, "x", ALLOY_F32, 2, (int64_t[]){batch, c->in}, alloy_init_uniform(-1.0, 1.0));
        alloy_param_freeze(g, h);
    } else {
        h = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){batch, c->in});
    }
    int in = c->in;
    for (int i = 0; i <= c->layers; i++) {
        bool last = i == c->layers;
        int out = last ? c->classes : c->hidden;
        char wname[32], bname[32];
        snprintf(wname, sizeof wname, "fc%d.weight", i);
        snprintf(bname, sizeof bname, "fc%d.bias", i);
        alloy_tensor *w = alloy_param(g, wname, ALLOY_F32, 2, (int64_t[]){in, out},
                                      alloy_init_kaiming_uniform(last ? 1.0 : 1.4142135623730951));
        alloy_tensor *b = alloy_param(g, bname, ALLOY_F32, 1, (int64_t[]){out}, alloy_init_zeros());
        h = alloy_add(g, alloy_matmul(g, h, w, false, false), b);
        if (!last) h = alloy_relu(g, h);
        in = out;
    }
    alloy_tensor *labels = alloy_input(g, "labels", ALLOY_I32, 1, (int64_t[]){batch});
    alloy_tensor *loss = alloy_set_name(g, alloy_cross_entropy(g, h, labels), "loss");
    alloy_output(g, "loss", loss);
    return loss;
}
