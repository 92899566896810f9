/* step_bench.c - benchmark: one alloy training step (char_gpt's model or an MLP; f32, f16 or bf16 AMP), per-step wall and CPU time; the alloy half of bench/cpu_vs_torch.sh. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloy/alloy.h"
#include "gpt_model.h"
#include "mlp_model.h"
#include "proc_threads.h"

static const char usage[] =
    "usage: step_bench [options]\n"
    "Times one configuration's training steps (forward, backward, AdamW) in alloy on\n"
    "random data and prints, after `warmup` untimed steps (alloy compiles on the first),\n"
    "the median wall time and the median process CPU time (user + system, all threads)\n"
    "of the timed steps as one line: step_ms<TAB>WALL<TAB>CPU, then the threads that\n"
    "ran during the timed steps: threads<TAB>RAN<TAB>ALL, RAN counting those with at least\n"
    "1% of the process's CPU time there (/proc/self/task), ALL every thread at the end.\n"
    "bench/step_torch.py builds the same models in PyTorch; bench/cpu_vs_torch.sh runs both.\n"
    "  --model M      char_gpt (examples/gpt_model.c) or mlp (default char_gpt)\n"
    "  --dtype D      f32, f16 (AMP with the dynamic scaler) or bf16 (AMP) (default f32)\n"
    "  --steps N      timed steps (default 20)\n"
    "  --warmup N     untimed steps first (default 5)\n"
    "  --batch N      sequences (char_gpt, default 32) or rows (mlp, default 256)\n"
    "char_gpt: --context 64 --dim 128 --layers 2 --heads 4 --vocab 76 (char_gpt's defaults)\n"
    "mlp: --in 784 --hidden 1024 --layers 2 (hidden layers) --classes 10:\n"
    "  x -> [linear + bias -> relu] x layers -> linear + bias -> cross-entropy\n"
    "Threads: ALLOY_NUM_THREADS (alloy runs every kernel and GEMM on its own pool).\n";

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fputs("step_bench: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    exit(1);
}

/* Seconds on clock id (CLOCK_MONOTONIC or CLOCK_PROCESS_CPUTIME_ID). */
static double seconds_on(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int parse_int(const char *flag, const char *s)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : -1;
    if (!s || !*s || *end || errno || v < 0 || v > 1 << 20)
        fail("%s wants an integer in [0, %d], got '%s'", flag, 1 << 20, s ? s : "");
    return (int)v;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n), n >= 1; sorts v. */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Next value of a 32-bit LCG, for reproducible random data. */
static unsigned next_seed(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return *seed >> 8;
}

int main(int argc, char **argv)
{
    gpt_config gpt = {76, 64, 128, 2, 4, 512, false};
    mlp_config mlp = {784, 1024, 2, 10};
    int batch = -1, warmup = 5, steps = 20;
    const char *model = "char_gpt", *dtype = "f32";
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--help")) { fputs(usage, stdout); return 0; }
        i++;
        if (!strcmp(flag, "--model") && val) model = val;
        else if (!strcmp(flag, "--dtype") && val) dtype = val;
        else if (!strcmp(flag, "--steps")) steps = parse_int(flag, val);
        else if (!strcmp(flag, "--warmup")) warmup = parse_int(flag, val);
        else if (!strcmp(flag, "--batch")) batch = parse_int(flag, val);
        else if (!strcmp(flag, "--context")) gpt.context = parse_int(flag, val);
        else if (!strcmp(flag, "--dim")) gpt.dim = parse_int(flag, val);
        else if (!strcmp(flag, "--layers")) gpt.layers = mlp.layers = parse_int(flag, val);
        else if (!strcmp(flag, "--heads")) gpt.heads = parse_int(flag, val);
        else if (!strcmp(flag, "--vocab")) gpt.vocab = parse_int(flag, val);
        else if (!strcmp(flag, "--in")) mlp.in = parse_int(flag, val);
        else if (!strcmp(flag, "--hidden")) mlp.hidden = parse_int(flag, val);
        else if (!strcmp(flag, "--classes")) mlp.classes = parse_int(flag, val);
        else fail("unknown option or missing value: %s (see --help)", flag);
    }
    bool is_gpt = !strcmp(model, "char_gpt");
    if (!is_gpt && strcmp(model, "mlp")) fail("--model wants char_gpt or mlp, got '%s'", model);
    alloy_dtype amp = !strcmp(dtype, "f32") ? ALLOY_F32 : !strcmp(dtype, "f16") ? ALLOY_F16
                      : !strcmp(dtype, "bf16") ? ALLOY_BF16 : ALLOY_I32;
    if (amp == ALLOY_I32) fail("--dtype wants f32, f16 or bf16, got '%s'", dtype);
    if (batch < 0) batch = is_gpt ? 32 : 256;
    gpt.mlp_width = 4 * gpt.dim;
    if (is_gpt && gpt_config_problem(&gpt)) fail("%s", gpt_config_problem(&gpt));
    if (!is_gpt && (mlp.in < 1 || mlp.hidden < 1 || mlp.classes < 1))
        fail("--in, --hidden and --classes must be at least 1");
    if (steps < 1 || batch < 1) fail("--steps and --batch must be at least 1");

    alloy_graph *g = alloy_graph_new("step_bench");
    if (!g) fail("out of memory");
    alloy_tensor *loss = is_gpt ? gpt_build(g, &gpt, batch, true).loss : mlp_build(g, &mlp, batch, false);
    alloy_graph_set_loss(g, loss);
    if (amp != ALLOY_F32) alloy_graph_enable_amp(g, amp);
    if (amp == ALLOY_F16) alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler());
    alloy_graph_add_optimizer(g, alloy_adamw(3e-3, 0.9, 0.99, 1e-8, 0.01));
    if (alloy_graph_status(g)) fail("building the model: %s", alloy_last_error(g));

    /* char_gpt: tokens [batch, context] and targets [batch * context];
     * mlp: x [batch, in] in [-1, 1) and labels [batch]. */
    size_t rows = is_gpt ? (size_t)batch * (size_t)gpt.context : (size_t)batch;
    size_t nx = is_gpt ? rows : rows * (size_t)mlp.in;
    void *x = malloc(is_gpt ? sizeof(int) * nx : sizeof(float) * nx);
    int *labels = malloc(sizeof(int) * rows);
    double *wall = malloc(sizeof(double) * (size_t)steps), *cpu = malloc(sizeof(double) * (size_t)steps);
    if (!x || !labels || !wall || !cpu) fail("out of memory");
    unsigned seed = 1;
    for (size_t i = 0; i < nx; i++) {
        if (is_gpt) ((int *)x)[i] = (int)(next_seed(&seed) % (unsigned)gpt.vocab);
        else ((float *)x)[i] = (float)(next_seed(&seed) % 65536u) / 32768.0f - 1.0f;
    }
    for (size_t i = 0; i < rows; i++)
        labels[i] = (int)(next_seed(&seed) % (unsigned)(is_gpt ? gpt.vocab : mlp.classes));
    alloy_host_tensor feeds[2];
    if (is_gpt) {
        feeds[0] = (alloy_host_tensor){"tokens", ALLOY_I32, 2, {batch, gpt.context}, x};
        feeds[1] = (alloy_host_tensor){"targets", ALLOY_I32, 1, {(int64_t)rows}, labels};
    } else {
        feeds[0] = (alloy_host_tensor){"x", ALLOY_F32, 2, {batch, mlp.in}, x};
        feeds[1] = (alloy_host_tensor){"labels", ALLOY_I32, 1, {batch}, labels};
    }
    proc_threads before, after;
    double cpu0 = 0.0;
    for (int i = 0; i < warmup + steps; i++) {
        if (i == warmup) proc_threads_take(&before), cpu0 = seconds_on(CLOCK_PROCESS_CPUTIME_ID);
        double w0 = seconds_on(CLOCK_MONOTONIC), c0 = seconds_on(CLOCK_PROCESS_CPUTIME_ID);
        if (alloy_graph_run(g, feeds, 2, NULL, 0)) fail("training step %d: %s", i + 1, alloy_last_error(g));
        if (i >= warmup) {
            cpu[i - warmup] = seconds_on(CLOCK_PROCESS_CPUTIME_ID) - c0;
            wall[i - warmup] = seconds_on(CLOCK_MONOTONIC) - w0;
        }
    }
    double cpu_all = seconds_on(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    proc_threads_take(&after);
    const char *threads = getenv("ALLOY_NUM_THREADS");
    printf("alloy %s %s, batch %d, ALLOY_NUM_THREADS=%s, %d warmup + %d timed steps\n", model, dtype,
           batch, threads ? threads : "(unset)", warmup, steps);
    printf("step_ms\t%.3f\t%.3f\n", 1e3 * median(wall, steps), 1e3 * median(cpu, steps));
    printf("threads\t%d\t%d\n", proc_threads_ran(&before, &after, (long long)(cpu_all * 1e7)), after.n);
    alloy_graph_free(g);
    free(x), free(labels), free(wall), free(cpu);
    return 0;
}
