/* linear_cpu.c - one linear layer y = act(x w + b) alone on the CPU (a GEMM step with its epilogue), best thread CPU time per run: the GEMM and its epilogue, the fetch of y included. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloy/alloy.h"

static const char usage[] =
    "usage: linear_cpu [--dtype f16|bf16|f32] [--act none|relu|gelu_tanh] [--rows N] [--k N] [--n N] [--reps N]\n"
    "Runs y = act(x w + b) (x [rows, k] and w [k, n] parameters, b [n], all in the dtype; y\n"
    "fetched, and with an activation its input too, as a training step stores it)\n"
    "`reps` times in each of 5 rounds after 5 warm-up runs and prints the best round's thread\n"
    "CPU ms per run (the calling thread's: run it with ALLOY_NUM_THREADS=1). Defaults: bf16,\n"
    "rows 2048, k 128, n 512 (char_gpt's first MLP projection).\n";

static double thread_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int int_arg(const char *flag, const char *val)
{
    char *end;
    long v = val ? strtol(val, &end, 10) : 0;
    if (!val || *end || v < 1 || v > 1 << 24) {
        fprintf(stderr, "linear_cpu: %s wants a positive integer\n%s", flag, usage);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv)
{
    const char *dtype = "bf16", *act = "none";
    int rows = 2048, k = 128, n = 512, reps = 100;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        i++;
        if (!strcmp(flag, "--dtype") && val) dtype = val;
        else if (!strcmp(flag, "--act") && val) act = val;
        else if (!strcmp(flag, "--rows")) rows = int_arg(flag, val);
        else if (!strcmp(flag, "--k")) k = int_arg(flag, val);
        else if (!strcmp(flag, "--n")) n = int_arg(flag, val);
        else if (!strcmp(flag, "--reps")) reps = int_arg(flag, val);
        else {
            fprintf(stderr, "linear_cpu: unknown option or missing value: %s\n%s", flag, usage);
            return 2;
        }
    }
    alloy_dtype dt = !strcmp(dtype, "f16") ? ALLOY_F16 : !strcmp(dtype, "bf16") ? ALLOY_BF16 : !strcmp(dtype, "f32") ? ALLOY_F32 : ALLOY_I32;
    if (dt == ALLOY_I32) {
        fprintf(stderr, "linear_cpu: --dtype wants f16, bf16 or f32, got '%s'\n", dtype);
        return 2;
    }
    alloy_graph *g = alloy_graph_new("linear");
    alloy_graph_set_seed(g, 1);
    alloy_tensor *x = alloy_param(g, "x", dt, 2, (int64_t[]){rows, k}, alloy_init_uniform(-1, 1));
    alloy_tensor *w = alloy_param(g, "w", dt, 2, (int64_t[]){k, n}, alloy_init_uniform(-1, 1));
    alloy_tensor *b = alloy_param(g, "b", dt, 1, (int64_t[]){n}, alloy_init_uniform(-1, 1));
    bool relu = !strcmp(act, "relu"), gelu = !strcmp(act, "gelu_tanh");
    if (!relu && !gelu && strcmp(act, "none")) {
        fprintf(stderr, "linear_cpu: --act wants none, relu or gelu_tanh, got '%s'\n", act);
        return 2;
    }
    alloy_tensor *pre = alloy_add(g, alloy_matmul(g, x, w, false, false), b);
    alloy_output(g, "y", relu ? alloy_relu(g, pre) : gelu ? alloy_gelu_tanh(g, pre) : pre);
    if (relu || gelu) alloy_output(g, "pre", pre);
    alloy_graph_set_option(g, "device", "cpu");
    alloy_host_tensor y[2] = {{.name = "y"}, {.name = "pre"}};
    int nout = relu || gelu ? 2 : 1;
    for (int i = 0; i < 5; i++)
        if (alloy_graph_run(g, NULL, 0, y, nout)) {
            fprintf(stderr, "linear_cpu: %s\n", alloy_last_error(g));
            return 1;
        }
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = thread_ms();
        for (int i = 0; i < reps; i++) alloy_graph_run(g, NULL, 0, y, nout);
        double t = (thread_ms() - t0) / reps;
        if (t < best) best = t;
    }
    printf("linear %s %s [%d,%d]x[%d,%d] + b: %.4f ms per run (best of 5 rounds of %d)\n", dtype, act, rows, k, k, n,
           best, reps);
    alloy_graph_free(g);
    return 0;
}
