/* char_gpt_bench.c - benchmark: training tokens/s of examples/char_gpt's model in alloy (f32, f16 and bf16 AMP) and, side by side, in PyTorch on the same CPU. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloy/alloy.h"
#include "gpt_model.h"
#include "proc_threads.h"

#ifndef CHAR_GPT_TORCH_SCRIPT
#define CHAR_GPT_TORCH_SCRIPT "bench/char_gpt_torch.py"
#endif

static const char usage[] =
    "usage: char_gpt_bench [options]\n"
    "Times training steps (forward, backward, AdamW) of the char_gpt model on random\n"
    "tokens; configs: alloy f32, f16 AMP (dynamic scaler), bf16 AMP, then PyTorch f32\n"
    "and bf16 autocast through bench/char_gpt_torch.py when `import torch` works.\n"
    "Every row shows, on both sides alike, the median over the timed steps of the\n"
    "wall time and of the process CPU time (user + system, all threads), and how many\n"
    "threads had at least 1% of that CPU time (/proc/self/task).\n"
    "  --steps N      timed steps per config (default 20)\n"
    "  --warmup N     untimed steps first; alloy compiles on the first (default 3)\n"
    "  --batch N --context N --dim N --layers N --heads N   the model (char_gpt's defaults)\n"
    "  --vocab N      vocabulary (default 76, the bytes of GPL-3)\n"
    "  --python EXE   interpreter for the PyTorch side (default python3)\n"
    "  --no-torch     skip PyTorch\n"
    "  --configs LIST the alloy configs to run, of f32,f16,bf16 (default all three)\n"
    "  --fetch-grad   every other step (warmup and timed) also fetches grad:tok_emb, a\n"
    "                 gradient the default step does not store (a run of its own schedule)\n"
    "  --cpu-time     tokens/s and the ratio column from the CPU time instead of the\n"
    "                 wall time (on a shared machine other processes' time does not count)\n"
    "Threads: ALLOY_NUM_THREADS (default: all cores) for alloy; PyTorch gets the same count,\n"
    "with OMP_WAIT_POLICY=PASSIVE at 2 or more unless the environment sets it.\n";

/* One config's medians, ms per step, and the threads that ran (-1: unknown). */
typedef struct bench_result {
    char config[48];
    double wall_ms, cpu_ms;
    int ran;
} bench_result;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fputs("char_gpt_bench: ", stderr);
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

/* The model with AMP dtype amp (ALLOY_F32 = off) trained as char_gpt trains
 * it: `warmup` untimed steps, then the medians of `steps` timed ones (the
 * median shrugs off steps slowed by other processes) into r. */
static bool fetch_grad; /* --fetch-grad */

static void time_alloy(const gpt_config *cfg, int batch, alloy_dtype amp, int warmup, int steps, bench_result *r)
{
    alloy_graph *g = alloy_graph_new("char_gpt_bench");
    if (!g) fail("out of memory");
    gpt_model m = gpt_build(g, cfg, batch, true);
    alloy_graph_set_loss(g, m.loss);
    if (amp != ALLOY_F32) alloy_graph_enable_amp(g, amp);
    if (amp == ALLOY_F16) alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler());
    alloy_optimizer adamw = alloy_adamw(3e-3, 0.9, 0.99, 1e-8, 0.01);
    adamw.schedule = ALLOY_LR_WARMUP_COSINE;
    adamw.warmup_steps = 50, adamw.total_steps = 300, adamw.min_lr = 3e-4;
    alloy_graph_add_optimizer(g, adamw);
    if (alloy_graph_status(g)) fail("building the model: %s", alloy_last_error(g));

    size_t n = (size_t)batch * (size_t)cfg->context;
    int *tokens = malloc(sizeof(int) * n), *targets = malloc(sizeof(int) * n);
    if (!tokens || !targets) fail("out of memory");
    unsigned seed = 1;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        tokens[i] = (int)((seed >> 16) % (unsigned)cfg->vocab);
        targets[i] = (int)((seed >> 8) % (unsigned)cfg->vocab);
    }
    alloy_host_tensor feeds[2] = {{"tokens", ALLOY_I32, 2, {batch, cfg->context}, tokens},
                                  {"targets", ALLOY_I32, 1, {(int64_t)n}, targets}};
    double *wall = malloc(sizeof(double) * (size_t)steps), *cpu = malloc(sizeof(double) * (size_t)steps);
    if (!wall || !cpu) fail("out of memory");
    proc_threads before, after;
    double cpu0 = 0.0;
    for (int i = 0; i < warmup + steps; i++) {
        if (i == warmup) proc_threads_take(&before), cpu0 = seconds_on(CLOCK_PROCESS_CPUTIME_ID);
        double w0 = seconds_on(CLOCK_MONOTONIC), c0 = seconds_on(CLOCK_PROCESS_CPUTIME_ID);
        alloy_host_tensor grad = {.name = "grad:tok_emb"};
        if (alloy_graph_run(g, feeds, 2, &grad, fetch_grad && i % 2)) fail("training step: %s", alloy_last_error(g));
        if (i >= warmup) {
            cpu[i - warmup] = seconds_on(CLOCK_PROCESS_CPUTIME_ID) - c0;
            wall[i - warmup] = seconds_on(CLOCK_MONOTONIC) - w0;
        }
    }
    double cpu_all = seconds_on(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    proc_threads_take(&after);
    r->wall_ms = 1e3 * median(wall, steps);
    r->cpu_ms = 1e3 * median(cpu, steps);
    r->ran = proc_threads_ran(&before, &after, (long long)(cpu_all * 1e7));
    alloy_graph_free(g);
    free(tokens), free(targets), free(wall), free(cpu);
}

/* Runs the PyTorch script with the same model and step counts; appends its
 * "step_ms<TAB>config<TAB>WALL<TAB>CPU<TAB>RAN" lines to results and echoes the rest. */
static int time_torch(const char *python, const gpt_config *cfg, int batch, int warmup, int steps,
                      int threads, bench_result *results, int nresults)
{
    const char *script = CHAR_GPT_TORCH_SCRIPT;
    if (strchr(script, '\'') || strchr(python, '\'')) {
        printf("torch: skipped (a quote in the interpreter's or the script's path)\n");
        return nresults;
    }
    char command[1024];
    snprintf(command, sizeof command,
             "'%s' '%s' --steps %d --warmup %d --batch %d --context %d --dim %d --layers %d "
             "--heads %d --vocab %d --threads %d 2>&1",
             python, script, steps, warmup, batch, cfg->context, cfg->dim, cfg->layers, cfg->heads,
             cfg->vocab, threads);
    /* PyTorch's OpenMP threads spin by default while a partner is
     * descheduled: on a shared machine that measures the load (the caller's
     * OMP_WAIT_POLICY wins) */
    if (threads > 1) setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    printf("torch: OMP_WAIT_POLICY=%s\n", getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "(unset)");
    fflush(stdout);
    FILE *pipe = popen(command, "r");
    if (!pipe) {
        printf("torch: cannot run %s: %s\n", python, strerror(errno));
        return nresults;
    }
    char line[512];
    while (fgets(line, sizeof line, pipe)) {
        bench_result r;
        if (nresults < 8 &&
            sscanf(line, "step_ms\t%47[^\t]\t%lf\t%lf\t%d", r.config, &r.wall_ms, &r.cpu_ms, &r.ran) == 4)
            results[nresults++] = r;
        else
            printf("torch: %s", line);
    }
    int status = pclose(pipe);
    if (status != 0) printf("torch: %s exited with status %d\n", script, status);
    return nresults;
}

int main(int argc, char **argv)
{
    gpt_config cfg = {76, 64, 128, 2, 4, 512, false};
    int batch = 32, warmup = 3, steps = 20;
    bool torch = true, cpu_time = false;
    const char *python = "python3", *configs = "f32,f16,bf16";
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--help")) { fputs(usage, stdout); return 0; }
        if (!strcmp(flag, "--no-torch")) { torch = false; continue; }
        if (!strcmp(flag, "--cpu-time")) { cpu_time = true; continue; }
        if (!strcmp(flag, "--fetch-grad")) { fetch_grad = true; continue; }
        i++;
        if (!strcmp(flag, "--steps")) steps = parse_int(flag, val);
        else if (!strcmp(flag, "--warmup")) warmup = parse_int(flag, val);
        else if (!strcmp(flag, "--batch")) batch = parse_int(flag, val);
        else if (!strcmp(flag, "--context")) cfg.context = parse_int(flag, val);
        else if (!strcmp(flag, "--dim")) cfg.dim = parse_int(flag, val);
        else if (!strcmp(flag, "--layers")) cfg.layers = parse_int(flag, val);
        else if (!strcmp(flag, "--heads")) cfg.heads = parse_int(flag, val);
        else if (!strcmp(flag, "--vocab")) cfg.vocab = parse_int(flag, val);
        else if (!strcmp(flag, "--python") && val) python = val;
        else if (!strcmp(flag, "--configs") && val) configs = val;
        else fail("unknown option or missing value: %s (see --help)", flag);
    }
    cfg.mlp_width = 4 * cfg.dim;
    const char *problem = gpt_config_problem(&cfg);
    if (problem) fail("%s", problem);
    if (steps < 1 || batch < 1) fail("--steps and --batch must be at least 1");
    const char *env = getenv("ALLOY_NUM_THREADS");
    int threads = env && atoi(env) > 0 ? atoi(env) : (int)sysconf(_SC_NPROCESSORS_ONLN);

    printf("char_gpt model: vocab %d, context %d, batch %d, dim %d, %d layers, %d heads, MLP %d; "
           "%d warmup + %d timed steps%s; %d threads\n", cfg.vocab, cfg.context, batch, cfg.dim,
           cfg.layers, cfg.heads, cfg.mlp_width, warmup, steps,
           fetch_grad ? ", every other one fetching grad:tok_emb" : "", threads);
    bench_result results[8];
    int n = 0;
    const struct { const char *name, *key; alloy_dtype amp; } alloy_configs[] = {
        {"alloy fp32", "f32", ALLOY_F32}, {"alloy fp16 AMP", "f16", ALLOY_F16}, {"alloy bf16 AMP", "bf16", ALLOY_BF16}};
    for (int i = 0; i < 3; i++) {
        char list[64];
        snprintf(list, sizeof list, ",%s,", configs);
        char key[16];
        snprintf(key, sizeof key, ",%s,", alloy_configs[i].key);
        if (!strstr(list, key)) continue;
        snprintf(results[n].config, sizeof results[n].config, "%s", alloy_configs[i].name);
        time_alloy(&cfg, batch, alloy_configs[i].amp, warmup, steps, &results[n++]);
    }
    if (torch) n = time_torch(python, &cfg, batch, warmup, steps, threads, results, n);
    if (n == 0) return 0;

    /* the same quantity on both sides: medians of wall time and of CPU time */
    const char *by = cpu_time ? "CPU" : "wall";
    printf("\n%-22s | %10s | %12s | %11s | %11s | %s\n", "config", "tokens/s", "wall ms/step", "CPU ms/step",
           "threads ran", "step time / the first row's");
    for (int i = 0; i < n; i++) {
        double ms = cpu_time ? results[i].cpu_ms : results[i].wall_ms, ms0 = cpu_time ? results[0].cpu_ms : results[0].wall_ms;
        printf("%-22s | %10.0f | %12.1f | %11.1f | %11d | %.2f\n", results[i].config, 1e3 * batch * cfg.context / ms,
               results[i].wall_ms, results[i].cpu_ms, results[i].ran, ms / ms0);
    }
    printf("(medians over %d timed steps; tokens/s and the last column from the %s time; %d thread(s) asked)\n", steps,
           by, threads);
    return 0;
}
