/* conv_cpu.c - benchmark: a small CNN's forward and training step on the CPU with its convolutions' gemm groups (conv + channel bias + relu) and without them (no_fuse=gemm), one thread, best CPU time per step (steady on a shared machine). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloy/alloy.h"
#include "alloy/conv.h"

#define DIMS(...) (int64_t[]){__VA_ARGS__}

enum { BATCH = 32, SIDE = 32, C1 = 32, C2 = 64, CLASSES = 10, WARMUP = 2, ROUNDS = 6, STEPS = 4 };

/* x [BATCH, 3, 32, 32] -> conv 3x3 (C1) + b1 as [C1, 1, 1] -> relu -> max
 * pool 2 -> conv 3x3 (C2, its own bias) -> relu -> average pool -> linear:
 * the logits; training: cross_entropy, AdamW, AMP in amp (F32: off). */
static alloy_graph *cnn(bool train, alloy_dtype amp)
{
    alloy_graph *g = alloy_graph_new("cnn");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 4, DIMS(BATCH, 3, SIDE, SIDE));
    alloy_init k = alloy_init_kaiming_uniform(sqrt(2.0));
    alloy_tensor *w1 = alloy_param(g, "w1", ALLOY_F32, 4, DIMS(C1, 3, 3, 3), k);
    alloy_tensor *b1 = alloy_param(g, "b1", ALLOY_F32, 1, DIMS(C1), alloy_init_zeros());
    alloy_tensor *w2 = alloy_param(g, "w2", ALLOY_F32, 4, DIMS(C2, C1, 3, 3), k);
    alloy_tensor *b2 = alloy_param(g, "b2", ALLOY_F32, 1, DIMS(C2), alloy_init_zeros());
    alloy_tensor *fc = alloy_param(g, "fc", ALLOY_F32, 2, DIMS(C2, CLASSES), alloy_init_xavier_uniform(1.0));
    alloy_tensor *h = alloy_conv2d(g, x, w1, NULL, NULL, DIMS(1, 1), NULL, 1);
    h = alloy_relu(g, alloy_add(g, h, alloy_reshape(g, b1, 3, DIMS(C1, 1, 1))));
    h = alloy_max_pool2d(g, h, DIMS(2, 2), NULL, NULL);
    h = alloy_relu(g, alloy_conv2d(g, h, w2, b2, NULL, DIMS(1, 1), NULL, 1));
    h = alloy_reshape(g, alloy_adaptive_avg_pool2d(g, h, DIMS(1, 1)), 2, DIMS(BATCH, C2));
    alloy_tensor *logits = alloy_matmul(g, h, fc, false, false);
    if (train) {
        alloy_tensor *loss = alloy_cross_entropy(g, logits, alloy_input(g, "t", ALLOY_I32, 1, DIMS(BATCH)));
        alloy_output(g, "loss", loss);
        alloy_graph_set_loss(g, loss);
        if (amp != ALLOY_F32) alloy_graph_enable_amp(g, amp);
        if (amp == ALLOY_F16) alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler());
        alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01));
    } else {
        alloy_output(g, "logits", logits);
        if (amp != ALLOY_F32) alloy_graph_enable_amp(g, amp);
    }
    return g;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); /* one thread: the step's own work, not the machine's load */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The best CPU time per step in ms over ROUNDS rounds of STEPS steps, after WARMUP. */
static double best_step(bool train, alloy_dtype amp, const char *no_fuse)
{
    if (no_fuse) setenv("ALLOY_NO_FUSE", no_fuse, 1);
    else unsetenv("ALLOY_NO_FUSE");
    static float x[BATCH * 3 * SIDE * SIDE];
    static int32_t t[BATCH];
    for (int i = 0; i < BATCH * 3 * SIDE * SIDE; i++) x[i] = (float)((i * 7919 % 2001) - 1000) / 1000.0f;
    for (int i = 0; i < BATCH; i++) t[i] = i % CLASSES;
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 4, {BATCH, 3, SIDE, SIDE}, x}, {"t", ALLOY_I32, 1, {BATCH}, t}};
    alloy_graph *g = cnn(train, amp);
    double best = INFINITY;
    for (int r = -1; r < ROUNDS; r++) {
        double t0 = now();
        int n = r < 0 ? WARMUP : STEPS;
        for (int s = 0; s < n; s++)
            if (alloy_graph_run(g, feeds, train ? 2 : 1, NULL, 0)) {
                fprintf(stderr, "%s\n", alloy_last_error(g));
                exit(1);
            }
        if (r >= 0 && (now() - t0) / n < best) best = (now() - t0) / n;
    }
    alloy_graph_free(g);
    return best * 1e3;
}

int main(void)
{
    setenv("ALLOY_NUM_THREADS", "1", 1);
    printf("CNN [%d,3,%d,%d] conv3x3(%d)+bias+relu, pool, conv3x3(%d, own bias)+relu, 1 thread: best CPU ms per step of %dx%d\n", BATCH,
           SIDE, SIDE, C1, C2, ROUNDS, STEPS);
    printf("%-22s %14s %14s %8s\n", "graph", "no_fuse=gemm", "fused", "ratio");
    for (int train = 0; train < 2; train++)
        for (int a = 0; a < 2; a++) {
            alloy_dtype amp = a ? ALLOY_F16 : ALLOY_F32;
            double off = INFINITY, on = INFINITY;
            for (int k = 0; k < 2; k++) { /* both orders: the second graph of a pair may run warmer or colder */
                double a0 = best_step(train, amp, k ? NULL : "gemm"), a1 = best_step(train, amp, k ? "gemm" : NULL);
                off = fmin(off, k ? a1 : a0), on = fmin(on, k ? a0 : a1);
            }
            char what[32];
            snprintf(what, sizeof what, "%s, %s", train ? "training step" : "forward", a ? "f16 AMP" : "f32");
            printf("%-22s %14.2f %14.2f %7.2fx\n", what, off, on, off / on);
        }
    return 0;
}
