/* compile_time.c - benchmark: compile time of training steps (AMP, loss scaler, AdamW) of transformer stacks from 1k to 1M nodes, per pass, with the fitted growth exponent. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloy/alloy.h"
#include "gpt_model.h"
#include "runtime/graph/graph_impl.h"

static const char usage[] =
    "usage: compile_time [options]\n"
    "Compiles the training step (bf16 AMP, dynamic loss scaler, AdamW) of char_gpt's\n"
    "model, then of transformer stacks (examples/gpt_model.c, 12 parameters a layer,\n"
    "narrow so that state stays small) sized to about 1k, 10k, 100k and 1M nodes in\n"
    "the compiled step; prints each pass's time (verifying included), the CPU\n"
    "executable's build, and the growth exponent of the pipeline's time in the node\n"
    "count (least squares on log-log over the stacks).\n"
    "  --max-nodes N  largest stack (default 1000000; 100000 skips the 1M one)\n"
    "  --sizes A,B,.. the stacks' node counts instead (up to 8)\n"
    "  --repeat N     compiles per size; the fastest counts (default 3, 1 from 300k nodes)\n"
    "  --amp f16|bf16|off   (default bf16)\n";

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fputs("compile_time: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    exit(1);
}

/* CPU time of this thread (the compile runs on it alone): what other
 * processes on a busy machine do not inflate, unlike wall time. */
static double cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + 1e-6 * (double)t.tv_nsec;
}

static double wall_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + 1e-6 * (double)t.tv_nsec;
}

/* One compile's numbers. */
typedef struct compile_result {
    int built;               /* nodes as built (the forward) */
    int nodes;               /* nodes of the compiled step */
    int params;              /* parameters */
    pass_timing passes[16];  /* each pass, verifying included */
    int npasses;
    double pipeline_ms;      /* the pass pipeline (with cloning the built graph) */
    double state_ms;         /* creating and initializing the state tensors (parameters, moments) */
    double exec_ms;          /* the CPU backend's executable from the schedule and plan */
    double wall_ms;          /* the three in wall time */
} compile_result;

/* The training step of cfg at `batch`, compiled once: the pipeline, the
 * state, then the CPU executable (what a first run does before it runs). */
static compile_result compile_once(const gpt_config *cfg, int batch, alloy_dtype amp)
{
    compile_result r = {0};
    alloy_graph *g = alloy_graph_new("stack");
    if (!g) fail("out of memory");
    gpt_model m = gpt_build(g, cfg, batch, true);
    alloy_graph_set_loss(g, m.loss);
    if (amp != ALLOY_F32) alloy_graph_enable_amp(g, amp);
    if (amp == ALLOY_F16) alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler());
    alloy_graph_add_optimizer(g, alloy_adamw(3e-3, 0.9, 0.99, 1e-8, 0.01));
    alloy_graph_set_option(g, "device", "cpu");
    if (alloy_last_error(g)[0]) fail("building: %s", alloy_last_error(g));
    r.built = g->ir->nnodes;
    for (int i = 0; i < g->ir->nnodes; i++) r.params += g->ir->nodes[i]->op == IR_OP_param;
    double w0 = wall_ms(), t0 = cpu_ms();
    alloy_status st = graph_compile(g);
    r.pipeline_ms = cpu_ms() - t0;
    if (st) fail("compiling %d layers: %s", cfg->layers, alloy_last_error(g));
    r.nodes = g->compiled->nnodes;
    r.npasses = g->ntimings;
    memcpy(r.passes, g->timings, sizeof r.passes);
    t0 = cpu_ms();
    st = state_ensure(g);
    r.state_ms = cpu_ms() - t0;
    if (st) fail("state: %s", alloy_last_error(g));
    t0 = cpu_ms();
    st = graph_exec_ready(g, NULL);
    r.exec_ms = cpu_ms() - t0;
    r.wall_ms = wall_ms() - w0;
    if (st) fail("CPU executable of %d layers: %s", cfg->layers, alloy_last_error(g));
    alloy_graph_free(g);
    return r;
}

/* The fastest of `repeat` compiles, column by column (the passes from the
 * fastest pipeline). */
static compile_result compile_best(const gpt_config *cfg, int batch, alloy_dtype amp, int repeat)
{
    compile_result best = compile_once(cfg, batch, amp);
    for (int i = 1; i < repeat; i++) {
        compile_result r = compile_once(cfg, batch, amp);
        if (r.pipeline_ms < best.pipeline_ms) {
            compile_result prev = best;
            best = r;
            r = prev;
        }
        if (r.state_ms < best.state_ms) best.state_ms = r.state_ms;
        if (r.exec_ms < best.exec_ms) best.exec_ms = r.exec_ms;
        if (r.wall_ms < best.wall_ms) best.wall_ms = r.wall_ms;
    }
    return best;
}

static void print_header(const compile_result *r)
{
    printf("%-10s %8s %8s %7s", "model", "built", "nodes", "params");
    for (int i = 0; i < r->npasses; i++) printf(" %10s", r->passes[i].name);
    printf(" %10s %10s %10s %10s %10s\n", "pipeline", "state", "cpu_exec", "total", "wall");
}

static void print_row(const char *label, const compile_result *r)
{
    printf("%-10s %8d %8d %7d", label, r->built, r->nodes, r->params);
    for (int i = 0; i < r->npasses; i++) printf(" %10.2f", r->passes[i].cpu_ms);
    printf(" %10.2f %10.2f %10.2f %10.2f %10.2f\n", r->pipeline_ms, r->state_ms, r->exec_ms,
           r->pipeline_ms + r->state_ms + r->exec_ms, r->wall_ms);
    fflush(stdout);
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
    long max_nodes = 1000000, sizes[8];
    int nsizes = 0;
    int repeat = 3;
    alloy_dtype amp = ALLOY_BF16;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(flag, "--max-nodes")) max_nodes = parse_long(flag, val, 1000, 10000000);
        else if (!strcmp(flag, "--sizes")) {
            for (const char *p = val ? val : ""; *p && nsizes < 8;) {
                char *end;
                sizes[nsizes++] = strtol(p, &end, 10);
                if (end == p || sizes[nsizes - 1] < 100 || sizes[nsizes - 1] > 10000000 || (*end && *end != ','))
                    fail("--sizes wants node counts in [100, 10000000] separated by commas");
                p = *end ? end + 1 : end;
            }
            if (!nsizes) fail("--sizes wants node counts in [100, 10000000] separated by commas");
        } else if (!strcmp(flag, "--repeat")) repeat = (int)parse_long(flag, val, 1, 100);
        else if (!strcmp(flag, "--amp")) {
            if (!val) fail("--amp wants f16, bf16 or off");
            amp = !strcmp(val, "f16") ? ALLOY_F16 : !strcmp(val, "bf16") ? ALLOY_BF16 : !strcmp(val, "off") ? ALLOY_F32
                                                                                                             : ALLOY_DTYPE_COUNT;
            if (amp == ALLOY_DTYPE_COUNT) fail("--amp wants f16, bf16 or off, got '%s'", val);
        } else {
            fprintf(stderr, "%s", usage);
            fail("unknown option '%s'", flag);
        }
        i++;
    }
    printf("# compile time of training steps (%s, AdamW%s); ms of CPU time (wall: of all three), fastest of %d;\n"
           "# each pass verifies after itself; pipeline includes cloning the built graph\n",
           amp == ALLOY_F32 ? "f32" : amp == ALLOY_F16 ? "f16 AMP" : "bf16 AMP",
           amp == ALLOY_F16 ? ", dynamic loss scaler" : "", repeat);

    /* char_gpt as examples/char_gpt trains it */
    gpt_config chargpt = {.vocab = 76, .context = 64, .dim = 128, .layers = 2, .heads = 4, .mlp_width = 512};
    compile_result r = compile_best(&chargpt, 32, amp, repeat < 5 ? 5 : repeat);
    print_header(&r);
    print_row("char_gpt", &r);

    /* the stacks: a layer's nodes from one and two layers, then layers to
     * reach each size */
    gpt_config stack = {.vocab = 16, .context = 4, .dim = 8, .layers = 1, .heads = 2, .mlp_width = 16};
    compile_result one = compile_once(&stack, 1, amp);
    stack.layers = 2;
    compile_result two = compile_once(&stack, 1, amp);
    int per_layer = two.nodes - one.nodes, base = one.nodes - per_layer;
    double xs[8], ys[8];
    int n = 0;
    if (!nsizes)
        for (long target = 1000; target <= max_nodes && nsizes < 8; target *= 10) sizes[nsizes++] = target;
    for (int k = 0; k < nsizes; k++) {
        long target = sizes[k];
        stack.layers = (int)((target - base + per_layer / 2) / per_layer);
        if (stack.layers < 1) stack.layers = 1;
        r = compile_best(&stack, 1, amp, target >= 300000 ? 1 : repeat);
        char label[32];
        snprintf(label, sizeof label, "%dL", stack.layers);
        print_row(label, &r);
        xs[n] = r.nodes, ys[n] = r.pipeline_ms + r.state_ms + r.exec_ms;
        n++;
    }
    if (n >= 2) {
        printf("# growth exponent of the total in nodes: %.3f", fit_exponent(xs, ys, n));
        if (n >= 3) printf(" (over the last three sizes: %.3f)", fit_exponent(xs + n - 3, ys + n - 3, 3));
        printf("\n");
    }
    return 0;
}
