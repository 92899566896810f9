/* alloyc_train_reference.c - test helper: train_mlp.ir's training built through the C API instead of alloyc train, printing the same progress lines without the rate. */
#include <stdio.h>
#include <stdlib.h>

#include "alloy/alloy.h"

static const char usage_text[] =
    "usage: alloyc_train_reference FEEDS PARAMS STEPS\n"
    "Builds tests/data/train_mlp.ir's MLP with the builder API, loads the\n"
    "parameters from PARAMS, and trains STEPS steps with f16 AMP, the dynamic\n"
    "loss scaler and AdamW (lr 3e-3, betas 0.9 0.999, eps 1e-8, weight decay\n"
    "0.01), step s on batch (s-1) mod B of FEEDS (x f32[B,8,4], labels\n"
    "i32[B,8]). Prints 'step S loss L scale X skipped K' per step, in alloyc\n"
    "train's formats. Exit 1 on an error.\n";

/* Prints the graph's error and exits. */
static void die(alloy_graph *g, const char *what)
{
    fprintf(stderr, "alloyc_train_reference: %s: %s\n", what, g ? alloy_last_error(g) : "failed");
    exit(1);
}

/* Builds the MLP as train_mlp.ir declares it (same names, shapes and inits). */
static void build(alloy_graph *g)
{
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){8, 4});
    alloy_tensor *labels = alloy_input(g, "labels", ALLOY_I32, 1, (int64_t[]){8});
    alloy_tensor *w1 = alloy_param(g, "w1", ALLOY_F32, 2, (int64_t[]){4, 16}, alloy_init_kaiming_uniform(1.4142135623730951));
    alloy_tensor *b1 = alloy_param(g, "b1", ALLOY_F32, 1, (int64_t[]){16}, alloy_init_zeros());
    alloy_tensor *w2 = alloy_param(g, "w2", ALLOY_F32, 2, (int64_t[]){16, 3}, alloy_init_xavier_uniform(1.0));
    alloy_tensor *b2 = alloy_param(g, "b2", ALLOY_F32, 1, (int64_t[]){3}, alloy_init_zeros());
    alloy_tensor *h = alloy_set_name(g, alloy_relu(g, alloy_add(g, alloy_matmul(g, x, w1, false, false), b1)), "h");
    alloy_tensor *logits = alloy_set_name(g, alloy_add(g, alloy_matmul(g, h, w2, false, false), b2), "logits");
    alloy_tensor *loss = alloy_set_name(g, alloy_cross_entropy(g, logits, labels), "loss");
    /* the outputs too: an output stays live, which shapes fusion and so where f16 rounds */
    if (alloy_output(g, "logits", logits) || alloy_output(g, "loss", loss)) die(g, "output");
    if (alloy_graph_set_loss(g, loss)) die(g, "set_loss");
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fputs(usage_text, stderr);
        return 2;
    }
    long steps = strtol(argv[3], NULL, 10);
    char err[1024] = "";
    alloy_safetensors *file;
    if (alloy_safetensors_load(argv[1], &file, err, sizeof err)) {
        fprintf(stderr, "alloyc_train_reference: %s\n", err);
        return 1;
    }
    const alloy_host_tensor *x = alloy_safetensors_find(file, "x"), *labels = alloy_safetensors_find(file, "labels");
    if (!x || !labels || x->rank != 3 || labels->rank != 2 || x->dims[0] != labels->dims[0]) {
        fprintf(stderr, "alloyc_train_reference: %s: want x f32[B,8,4] and labels i32[B,8]\n", argv[1]);
        return 1;
    }
    alloy_graph *g = alloy_graph_new("train_mlp");
    if (!g) die(NULL, "alloy_graph_new");
    build(g);
    if (alloy_graph_set_option(g, "device", "cpu") || alloy_graph_enable_amp(g, ALLOY_F16) ||
        alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()) ||
        alloy_graph_add_optimizer(g, alloy_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01)))
        die(g, "configuring");
    if (alloy_graph_load_params(g, argv[2], NULL, NULL)) die(g, "load_params");
    int64_t batches = x->dims[0];
    for (long step = 1; step <= steps; step++) {
        int64_t b = (step - 1) % batches;
        alloy_host_tensor feeds[2] = {
            {"x", ALLOY_F32, 2, {8, 4}, (float *)x->data + b * 8 * 4},
            {"labels", ALLOY_I32, 1, {8}, (int32_t *)labels->data + b * 8},
        };
        alloy_step_info s;
        if (alloy_graph_run(g, feeds, 2, NULL, 0) || alloy_graph_step_info(g, &s)) die(g, "run");
        printf("step %ld loss %.7g scale %g skipped %lld\n", step, s.loss, s.scale, (long long)s.skipped_steps);
    }
    alloy_graph_free(g);
    alloy_safetensors_free(file);
    return 0;
}
