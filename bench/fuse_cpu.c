/* fuse_cpu.c - benchmark: tokens/s of the transformer block's training step on the CPU, with and without fusion groups and threads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloy/alloy.h"
#include "models.h"

typedef struct config {
    int batch, seq, vocab, dim, heads;
    alloy_dtype amp; /* ALLOY_F32: AMP off */
} config;

/* A char-level block (vocab 65 as char_gpt's), 512 tokens a step, in f32
 * and in AMP f16 (dynamic scaler), both trained by AdamW. */
static const config configs[] = {
    {8, 64, 65, 128, 4, ALLOY_F32},
    {8, 64, 65, 128, 4, ALLOY_F16},
    {8, 64, 65, 256, 8, ALLOY_F16},
};

typedef struct mode {
    const char *name;
    bool fuse;
    const char *threads; /* ALLOY_NUM_THREADS, NULL: every online CPU */
} mode;

static const mode modes[] = {
    {"unfused, 1 thread (before)", false, "1"},
    {"fused, 1 thread", true, "1"},
    {"unfused, all threads", false, NULL},
    {"fused, all threads (after)", true, NULL},
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng = 12345;
static int next_token(int vocab)
{
    rng = rng * 6364136223846793005u + 1442695040888963407u;
    return (int)((rng >> 33) % (uint64_t)vocab);
}

static void use_threads(const mode *m)
{
    if (m->threads) setenv("ALLOY_NUM_THREADS", m->threads, 1);
    else unsetenv("ALLOY_NUM_THREADS");
}

/* The block's training graph, compiled with fusion on or off. */
static alloy_graph *trainer(const config *c, const mode *m)
{
    if (m->fuse) unsetenv("ALLOY_NO_FUSE");
    else setenv("ALLOY_NO_FUSE", "1", 1);
    alloy_graph *g = alloy_graph_new("block");
    alloy_graph_set_seed(g, 1);
    test_block b = build_transformer_block(g, ALLOY_F32, c->batch, c->seq, c->vocab, c->dim, c->heads);
    alloy_graph_set_loss(g, b.loss);
    if (c->amp != ALLOY_F32) {
        alloy_graph_enable_amp(g, c->amp);
        alloy_grad_scaler s = alloy_dynamic_scaler();
        s.init_scale = 1024;
        alloy_graph_set_grad_scaler(g, s);
    }
    alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01));
    return g;
}

enum { NMODES = sizeof modes / sizeof modes[0], MAX_ROUNDS = 200 };

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Runs the modes' steps round-robin (one step each per round, so a busy
 * machine slows them alike) for >= 7 rounds and ~3 s after 2 warm-up rounds
 * (the first compiles); best[k] and median[k] get seconds per step. */
static bool measure(const config *c, double *best, double *median)
{
    alloy_graph *g[NMODES];
    for (int k = 0; k < NMODES; k++) g[k] = trainer(c, &modes[k]);
    unsetenv("ALLOY_NO_FUSE");
    int n = c->batch * c->seq;
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)n), *targets = malloc(sizeof(int32_t) * (size_t)n);
    static double times[NMODES][MAX_ROUNDS];
    int rounds = 0;
    bool ok = true;
    double start = now();
    for (int r = 0; ok && r < 2 + MAX_ROUNDS && (rounds < 7 || now() - start < 3.0); r++) {
        for (int i = 0; i < n; i++) tokens[i] = next_token(c->vocab), targets[i] = next_token(c->vocab);
        alloy_host_tensor feeds[2] = {{"tokens", ALLOY_I32, 2, {c->batch, c->seq}, tokens},
                                      {"targets", ALLOY_I32, 1, {n}, targets}};
        for (int k = 0; ok && k < NMODES; k++) {
            use_threads(&modes[k]);
            double t0 = now();
            if (alloy_graph_run(g[k], feeds, 2, NULL, 0)) {
                fprintf(stderr, "run failed: %s\n", alloy_last_error(g[k]));
                ok = false;
            }
            if (r >= 2) times[k][rounds] = now() - t0;
        }
        if (r >= 2) rounds++;
    }
    for (int k = 0; k < NMODES; k++) {
        alloy_graph_free(g[k]);
        qsort(times[k], (size_t)rounds, sizeof(double), by_value);
        best[k] = times[k][0];
        median[k] = times[k][rounds / 2];
    }
    free(tokens);
    free(targets);
    unsetenv("ALLOY_NUM_THREADS");
    return ok && rounds > 0;
}

int main(void)
{
    printf("transformer block training step (forward, backward, scaler, AdamW) on the CPU;\n"
           "modes run round-robin; best and median of >= 7 steps; tokens/s from the best\n");
    printf("%-28s %-28s %9s %9s %10s %9s\n", "config", "mode", "best ms", "median ms", "tokens/s",
           "x before");
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const config *c = &configs[i];
        char what[64];
        snprintf(what, sizeof what, "B%d T%d V%d D%d H%d %s", c->batch, c->seq, c->vocab, c->dim,
                 c->heads, c->amp == ALLOY_F32 ? "f32" : "amp-f16");
        double best[NMODES], median[NMODES];
        if (!measure(c, best, median)) return 1;
        for (int k = 0; k < NMODES; k++)
            printf("%-28s %-28s %9.2f %9.2f %10.0f %8.2fx\n", k ? "" : what, modes[k].name,
                   best[k] * 1e3, median[k] * 1e3, c->batch * c->seq / best[k], best[0] / best[k]);
    }
    return 0;
}
