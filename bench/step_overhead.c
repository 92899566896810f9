/* step_overhead.c - benchmark: the time of one training step of deep stacks of tiny transformer layers, where the step is all overhead, and how it grows with depth. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloy/alloy.h"
#include "gpt_model.h"

static const char usage[] =
    "usage: step_overhead [options]\n"
    "Trains stacks of tiny transformer layers (examples/gpt_model.c: dim 8, 2 heads,\n"
    "context 4, batch 1; f16 AMP, dynamic loss scaler, AdamW) of 24, 48, 96 and 191\n"
    "layers, where a step's arithmetic is negligible and its time is the executor's\n"
    "overhead; prints the median step's wall and CPU time, per layer and per scheduled\n"
    "step, and the growth exponent of the step time in the layer count.\n"
    "  --steps N      timed steps per stack (default 20, after 2 untimed)\n"
    "  --layers A,B,.. the stacks (up to 8)\n"
    "Threads: ALLOY_NUM_THREADS (default: all cores).\n";

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fputs("step_overhead: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    exit(1);
}

static double clock_ms(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec * 1e3 + 1e-6 * (double)t.tv_nsec;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The slope of least squares of log y on log x. */
static double fit_exponent(const double *x, const double *y, int n)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        double lx = log(x[i]), ly = log(y[i]);
        sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly;
    }
    return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

/* Median wall and CPU (process: every thread) ms of `steps` training
 * steps of a stack of `layers`; *nsteps gets its scheduled steps. */
static void time_stack(int layers, int steps, double *wall, double *cpu, int *nsteps)
{
    gpt_config cfg = {.vocab = 16, .context = 4, .dim = 8, .layers = layers, .heads = 2, .mlp_width = 16};
    alloy_graph *g = alloy_graph_new("deep");
    if (!g) fail("out of memory");
    gpt_model m = gpt_build(g, &cfg, 1, true);
    alloy_graph_set_loss(g, m.loss);
    alloy_graph_enable_amp(g, ALLOY_F16);
    alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler());
    alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.99, 1e-8, 0.01));
    alloy_graph_set_option(g, "device", "cpu");
    int32_t tokens[4] = {1, 2, 3, 4}, targets[4] = {2, 3, 4, 5};
    alloy_host_tensor feeds[2] = {{"tokens", ALLOY_I32, 2, {1, 4}, tokens}, {"targets", ALLOY_I32, 1, {4}, targets}};
    double *w = malloc(sizeof(double) * (size_t)steps), *c = malloc(sizeof(double) * (size_t)steps);
    if (!w || !c) fail("out of memory");
    for (int i = -2; i < steps; i++) {
        double w0 = clock_ms(CLOCK_MONOTONIC), c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
        if (alloy_graph_run(g, feeds, 2, NULL, 0)) fail("%d layers: %s", layers, alloy_last_error(g));
        if (i >= 0) w[i] = clock_ms(CLOCK_MONOTONIC) - w0, c[i] = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
    }
    alloy_memory_info info;
    if (alloy_graph_memory_info(g, &info)) fail("%s", alloy_last_error(g));
    *nsteps = info.steps;
    qsort(w, (size_t)steps, sizeof *w, compare_doubles);
    qsort(c, (size_t)steps, sizeof *c, compare_doubles);
    *wall = w[steps / 2], *cpu = c[steps / 2];
    free(w), free(c);
    alloy_graph_free(g);
}

static long parse_long(const char *flag, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi) fail("%s wants an integer in [%ld, %ld]", flag, lo, hi);
    return v;
}

int main(int argc, char **argv)
{
    int steps = 20, layers[8] = {24, 48, 96, 191}, n = 4;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(flag, "--steps")) steps = (int)parse_long(flag, val, 1, 100000);
        else if (!strcmp(flag, "--layers")) {
            n = 0;
            for (const char *p = val ? val : ""; *p && n < 8;) {
                char *end;
                long v = strtol(p, &end, 10);
                if (end == p || v < 1 || v > 4096 || (*end && *end != ',')) fail("--layers wants counts in [1, 4096]");
                layers[n++] = (int)v;
                p = *end ? end + 1 : end;
            }
            if (!n) fail("--layers wants counts in [1, 4096] separated by commas");
        } else {
            fprintf(stderr, "%s", usage);
            fail("unknown option '%s'", flag);
        }
        i++;
    }
    printf("# training steps of tiny transformer stacks (f16 AMP, AdamW); median of %d\n", steps);
    printf("%7s %7s %12s %12s %14s %14s\n", "layers", "steps", "wall ms", "cpu ms", "wall us/layer", "wall us/step");
    double xs[8], ys[8];
    for (int k = 0; k < n; k++) {
        double wall, cpu;
        int nsteps;
        time_stack(layers[k], steps, &wall, &cpu, &nsteps);
        printf("%7d %7d %12.3f %12.3f %14.2f %14.3f\n", layers[k], nsteps, wall, cpu, 1e3 * wall / layers[k],
               1e3 * wall / nsteps);
        fflush(stdout);
        xs[k] = layers[k], ys[k] = wall;
    }
    if (n >= 2) printf("# growth exponent of the step time in layers: %.3f\n", fit_exponent(xs, ys, n));
    return 0;
}
