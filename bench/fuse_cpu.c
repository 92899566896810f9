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
    const char *no_fuse; /* ALLOY_NO_FUSE for its compile, NULL: fuse everything */
    const char *threads; /* ALLOY_NUM_THREADS, NULL: every online CPU */
} mode;

static const mode modes[] = {
    {"unfused, 1 thread (before)", "1", "1"},
    {"fused, 1 thread", NULL, "1"},
    {"unfused, all threads", "1", NULL},
    {"ew groups only, all threads", "row,gemm,multi", NULL},
    {"fused, all threads (after)", NULL, NULL},
};

static void use_fusion(const mode *m)
{
    if (m->no_fuse) setenv("ALLOY_NO_FUSE", m->no_fuse, 1);
    else unsetenv("ALLOY_NO_FUSE");
}

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
    use_fusion(m);
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

enum { NMODES = sizeof modes / sizeof modes[0], ROUNDS = 3, STEPS = 6 };

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static bool run_mode[NMODES] = {true, true, true, true, true};

/* A graph and its feeds, built fresh for each measurement. */
typedef alloy_graph *(*make_graph)(const void *arg, const mode *m);
typedef void (*make_feeds)(const void *arg, alloy_host_tensor *feeds, int *nfeeds);

/* For ROUNDS rounds, each mode in turn builds its graph, runs 2 warm-up
 * steps (the first compiles) and STEPS timed ones, and frees it: each graph
 * is alone in the process while it runs (as one training graph would be;
 * graphs interleaved step by step would recycle each other's freed memory),
 * and the rounds spread a busy machine's noise over the modes. best[k] and
 * median[k] get seconds per step. */
static bool measure(make_graph mk, make_feeds feed, const void *arg, double *best, double *median)
{
    static double times[NMODES][ROUNDS * STEPS];
    int count[NMODES] = {0};
    for (int r = 0; r < ROUNDS; r++)
        for (int k = 0; k < NMODES; k++) {
            if (!run_mode[k]) continue;
            alloy_graph *g = mk(arg, &modes[k]); /* sets ALLOY_NO_FUSE for its compile */
            use_threads(&modes[k]);
            for (int s = 0; s < 2 + STEPS; s++) {
                alloy_host_tensor feeds[4];
                int nfeeds;
                feed(arg, feeds, &nfeeds);
                double t0 = now();
                if (alloy_graph_run(g, feeds, nfeeds, NULL, 0)) {
                    fprintf(stderr, "run failed: %s\n", alloy_last_error(g));
                    alloy_graph_free(g);
                    return false;
                }
                if (s >= 2) times[k][count[k]++] = now() - t0;
            }
            unsetenv("ALLOY_NO_FUSE");
            alloy_graph_free(g);
        }
    unsetenv("ALLOY_NUM_THREADS");
    for (int k = 0; k < NMODES; k++) {
        if (!run_mode[k]) continue;
        qsort(times[k], (size_t)count[k], sizeof(double), by_value);
        best[k] = times[k][0];
        median[k] = times[k][count[k] / 2];
    }
    return true;
}

static alloy_graph *block_graph(const void *arg, const mode *m) { return trainer(arg, m); }

static void block_feeds(const void *arg, alloy_host_tensor *feeds, int *nfeeds)
{
    const config *c = arg;
    static int32_t tokens[1 << 16], targets[1 << 16];
    int n = c->batch * c->seq;
    for (int i = 0; i < n; i++) tokens[i] = next_token(c->vocab), targets[i] = next_token(c->vocab);
    feeds[0] = (alloy_host_tensor){"tokens", ALLOY_I32, 2, {c->batch, c->seq}, tokens};
    feeds[1] = (alloy_host_tensor){"targets", ALLOY_I32, 1, {n}, targets};
    *nfeeds = 2;
}

/* An AdamW update alone over n f32 elements (the optimizer's formulas with
 * the scalars folded in): inputs p, g, m, v; outputs p', m', v'. Where
 * fusion pays on a CPU: 14 ops, 4 tensors in, 3 out. */
typedef struct adamw_arg {
    int64_t n;
    float *data; /* p, g, m, v */
} adamw_arg;

static alloy_graph *adamw_graph(const void *arg, const mode *mo)
{
    int64_t n = ((const adamw_arg *)arg)->n;
    use_fusion(mo);
    alloy_graph *g = alloy_graph_new("adamw");
    alloy_tensor *p = alloy_input(g, "p", ALLOY_F32, 1, (int64_t[]){n});
    alloy_tensor *gr = alloy_input(g, "g", ALLOY_F32, 1, (int64_t[]){n});
    alloy_tensor *m = alloy_input(g, "m", ALLOY_F32, 1, (int64_t[]){n});
    alloy_tensor *v = alloy_input(g, "v", ALLOY_F32, 1, (int64_t[]){n});
#define S(x) alloy_scalar(g, ALLOY_F32, x)
    alloy_tensor *m2 = alloy_add(g, alloy_mul(g, m, S(0.9)), alloy_mul(g, gr, S(0.1)));
    alloy_tensor *v2 = alloy_add(g, alloy_mul(g, v, S(0.999)), alloy_mul(g, alloy_square(g, gr), S(0.001)));
    alloy_tensor *den = alloy_add(g, alloy_div(g, alloy_sqrt(g, v2), S(0.03)), S(1e-8));
    alloy_tensor *p2 = alloy_sub(g, alloy_mul(g, p, S(0.99999)), alloy_mul(g, S(0.01), alloy_div(g, m2, den)));
#undef S
    alloy_output(g, "p2", p2);
    alloy_output(g, "m2", m2);
    alloy_output(g, "v2", v2);
    return g;
}

static void adamw_feeds(const void *arg, alloy_host_tensor *feeds, int *nfeeds)
{
    const adamw_arg *a = arg;
    static const char *names[4] = {"p", "g", "m", "v"};
    for (int i = 0; i < 4; i++)
        feeds[i] = (alloy_host_tensor){names[i], ALLOY_F32, 1, {a->n}, a->data + (size_t)i * (size_t)a->n};
    *nfeeds = 4;
}

static bool bench_adamw(void)
{
    printf("\nan AdamW update chain alone (14 elementwise ops; 4 f32 tensors in, 3 out)\n");
    printf("%-12s %-28s %9s %9s %9s %8s\n", "elements", "mode", "best ms", "median ms", "GB/s", "x before");
    static const int64_t sizes[] = {1 << 18, 1 << 22};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        adamw_arg a = {sizes[i], malloc(sizeof(float) * 4 * (size_t)sizes[i])};
        for (int64_t e = 0; e < 4 * a.n; e++) a.data[e] = 0.5f + 0.1f * (float)(e % 7);
        double best[NMODES], median[NMODES];
        bool ok = measure(adamw_graph, adamw_feeds, &a, best, median);
        free(a.data);
        if (!ok) return false;
        int first = -1;
        for (int k = 0; k < NMODES; k++) {
            if (!run_mode[k]) continue;
            if (first < 0) first = k;
            char what[32];
            snprintf(what, sizeof what, "%lld", (long long)a.n);
            printf("%-12s %-28s %9.2f %9.2f %9.1f %7.2fx\n", k == first ? what : "", modes[k].name,
                   best[k] * 1e3, median[k] * 1e3, 7.0 * 4 * (double)a.n / best[k] / 1e9,
                   best[first] / best[k]);
        }
    }
    return true;
}

/* fuse_cpu [adamw] [MODE...]: MODE 0..4 runs only those rows of `modes`;
 * `adamw` runs only the AdamW table. */
int main(int argc, char **argv)
{
    int from = argc > 1 && strcmp(argv[1], "adamw") == 0 ? 2 : 1;
    for (int i = from; i < argc; i++) {
        if (i == from) memset(run_mode, 0, sizeof run_mode);
        int k = atoi(argv[i]);
        if (k >= 0 && k < NMODES) run_mode[k] = true;
    }
    if (from == 2) return bench_adamw() ? 0 : 1;
    printf("transformer block training step (forward, backward, scaler, AdamW) on the CPU;\n"
           "each mode's graph alone, %d rounds of %d steps; tokens/s from the best step\n", ROUNDS, STEPS);
    printf("%-28s %-28s %9s %9s %10s %9s\n", "config", "mode", "best ms", "median ms", "tokens/s",
           "x before");
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        const config *c = &configs[i];
        char what[64];
        snprintf(what, sizeof what, "B%d T%d V%d D%d H%d %s", c->batch, c->seq, c->vocab, c->dim,
                 c->heads, c->amp == ALLOY_F32 ? "f32" : "amp-f16");
        double best[NMODES], median[NMODES];
        if (!measure(block_graph, block_feeds, c, best, median)) return 1;
        int first = -1;
        for (int k = 0; k < NMODES; k++) {
            if (!run_mode[k]) continue;
            if (first < 0) first = k;
            printf("%-28s %-28s %9.2f %9.2f %10.0f %8.2fx\n", k == first ? what : "", modes[k].name,
                   best[k] * 1e3, median[k] * 1e3, c->batch * c->seq / best[k], best[first] / best[k]);
        }
    }
    return bench_adamw() ? 0 : 1;
}
