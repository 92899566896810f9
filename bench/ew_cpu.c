/* ew_cpu.c - benchmark: ns per element of the CPU backend's transcendental elementwise ops (f32, one thread, CPU time).
 *
 *   ew_cpu [N]   N elements per op (default 4M); prints one row per op,
 *                then softmax and layer_norm over 4096 rows of 256, forward
 *                and forward + backward (ns per element of x).
 *
 * Links only the public API, so the same binary measures two builds of
 * liballoy side by side (LD_LIBRARY_PATH=old/build ./ew_cpu, then the new):
 * bench/RESULTS.md has the before/after of base/vmath.h this way. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "alloy/alloy.h"
#include "alloy/train.h"

typedef alloy_tensor *(*unary_fn)(alloy_graph *, alloy_tensor *);

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best of 7 runs of y = op(x) over n values in [-4, 4), ns per element. */
static double time_op(const char *name, unary_fn op, int64_t n, float *x)
{
    alloy_graph *g = alloy_graph_new(name);
    alloy_graph_set_option(g, "num_threads", "1");
    alloy_tensor *in = alloy_input(g, "x", ALLOY_F32, 1, (int64_t[]){n});
    alloy_output(g, "y", op(g, in));
    alloy_host_tensor feed = {"x", ALLOY_F32, 1, {n}, x};
    alloy_host_tensor fetch = {.name = "y"};
    double best = 1e30;
    for (int r = 0; r < 8; r++) {
        double t0 = cpu_seconds();
        if (alloy_graph_run(g, &feed, 1, &fetch, 1)) {
            fprintf(stderr, "%s: %s\n", name, alloy_last_error(g));
            exit(1);
        }
        double t = cpu_seconds() - t0;
        if (r > 0 && t < best) best = t; /* the first run compiles */
    }
    alloy_graph_free(g);
    return best * 1e9 / (double)n;
}

enum { ROWS = 4096, COLS = 256 };

/* Best of 7 runs of softmax or layer_norm (gamma, beta; eps 1e-5) over
 * [ROWS, COLS]; with backward, loss = sum(y * dy) and the gradients of x
 * (and gamma, beta), as PyTorch's y.backward(dy). ns per element of x. */
static double time_row(bool layer_norm, bool backward, float *x, float *dy, float *gb)
{
    alloy_graph *g = alloy_graph_new(layer_norm ? "layer_norm" : "softmax");
    alloy_graph_set_option(g, "num_threads", "1");
    alloy_tensor *in = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){ROWS, COLS});
    alloy_tensor *gamma = layer_norm ? alloy_input(g, "gamma", ALLOY_F32, 1, (int64_t[]){COLS}) : NULL;
    alloy_tensor *beta = layer_norm ? alloy_input(g, "beta", ALLOY_F32, 1, (int64_t[]){COLS}) : NULL;
    alloy_tensor *y = layer_norm ? alloy_layer_norm(g, in, gamma, beta, 1e-5) : alloy_softmax(g, in, 1);
    int nfeeds = layer_norm ? 3 : 1;
    alloy_host_tensor feeds[4] = {{"x", ALLOY_F32, 2, {ROWS, COLS}, x},
                                  {"gamma", ALLOY_F32, 1, {COLS}, gb},
                                  {"beta", ALLOY_F32, 1, {COLS}, gb}};
    if (backward) {
        alloy_tensor *d = alloy_input(g, "dy", ALLOY_F32, 2, (int64_t[]){ROWS, COLS});
        alloy_tensor *loss = alloy_reduce_sum(g, alloy_mul(g, y, d), 2, (int64_t[]){0, 1}, false);
        alloy_graph_set_loss(g, loss);
        alloy_graph_request_grad(g, in);
        if (layer_norm) alloy_graph_request_grad(g, gamma), alloy_graph_request_grad(g, beta);
        feeds[nfeeds++] = (alloy_host_tensor){"dy", ALLOY_F32, 2, {ROWS, COLS}, dy};
    } else {
        alloy_output(g, "y", y);
    }
    alloy_host_tensor fetch = {.name = backward ? "grad:x" : "y"};
    double best = 1e30;
    for (int r = 0; r < 8; r++) {
        double t0 = cpu_seconds();
        if (alloy_graph_run(g, feeds, nfeeds, &fetch, 1)) {
            fprintf(stderr, "row op: %s\n", alloy_last_error(g));
            exit(1);
        }
        double t = cpu_seconds() - t0;
        if (r > 0 && t < best) best = t;
    }
    alloy_graph_free(g);
    return best * 1e9 / (double)(ROWS * COLS);
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 4 << 20;
    if (n <= 0) return fprintf(stderr, "usage: ew_cpu [N]\n"), 2;
    float *x = malloc(sizeof(float) * (size_t)n);
    if (!x) return fprintf(stderr, "ew_cpu: out of memory\n"), 1;
    for (int64_t i = 0; i < n; i++) x[i] = -4.0f + 8.0f * (float)((double)i / (double)n);
    static const struct {
        const char *name;
        unary_fn fn;
    } ops[] = {{"gelu", alloy_gelu}, {"gelu_tanh", alloy_gelu_tanh}, {"tanh", alloy_tanh},
               {"sigmoid", alloy_sigmoid}, {"exp", alloy_exp}, {"erf", alloy_erf}};
    printf("%-10s %12s\n", "op (f32)", "ns/element");
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        printf("%-10s %12.3f\n", ops[i].name, time_op(ops[i].name, ops[i].fn, n, x));
    float *rx = malloc(sizeof(float) * ROWS * COLS), *dy = malloc(sizeof(float) * ROWS * COLS);
    float gb[COLS];
    if (!rx || !dy) return fprintf(stderr, "ew_cpu: out of memory\n"), 1;
    for (int64_t i = 0; i < (int64_t)ROWS * COLS; i++) {
        rx[i] = -4.0f + 8.0f * (float)((double)(i * 7919 % 65536) / 65536.0);
        dy[i] = 1.0f - (float)(i % 3);
    }
    for (int i = 0; i < COLS; i++) gb[i] = 1.0f + 0.01f * (float)i;
    printf("softmax    %12.3f\n", time_row(false, false, rx, dy, gb));
    printf("softmax_fb %12.3f\n", time_row(false, true, rx, dy, gb));
    printf("layer_norm %12.3f\n", time_row(true, false, rx, dy, gb));
    printf("l_norm_fb  %12.3f\n", time_row(true, true, rx, dy, gb));
    free(rx);
    free(dy);
    free(x);
    return 0;
}
