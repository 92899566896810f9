/* gpu_step.c - benchmark: one model of bench/gpu.sh (char_gpt, the 4x4096 MLP, GPT-2 124M with attention written out or as the attention op) trained by alloy in fp32, f16 AMP or bf16 AMP; prints one machine-readable result line that bench/gpu_report.py merges with bench/gpu_torch.py's. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloy/alloy.h"
#include "alloy/cuda.h"
#include "gpt_model.h"
#include "mlp_model.h"

static const char usage[] =
    "usage: gpu_step --model M [options]\n"
    "Trains model M (forward, backward, AdamW; f16 with the dynamic loss scaler) on random data\n"
    "and prints one line, tab-separated key=value fields after the word `result`:\n"
    "  impl=alloy model dtype mode=- device batch tokens (per step: batch * context, or the\n"
    "  MLP's rows) and the shape (vocab context dim layers heads | in hidden layers classes),\n"
    "  ms (median step), ms_min, steps, first_s (the first run: compile + one step), warmup_s\n"
    "  (every warm-up run), peak_bytes (alloy_graph_device_memory's peak: arena, aux, state,\n"
    "  inputs, cuBLASLt's workspace), plan_bytes (planned arena + state), loss (last step),\n"
    "  device_name. Errors go to stderr with status 1 (2: the device cannot run).\n"
    "A step is timed by the wall clock around alloy_graph_run, which returns after the step\n"
    "(the GPU's stream synchronized) with its loss read back; it includes copying the fed\n"
    "inputs (GPTs: tokens and targets, 2 x batch x context i32; the MLP: its labels, while its\n"
    "x is a frozen parameter that stays on the device, as PyTorch's batch does).\n"
    "  --model M      char_gpt, mlp, gpt2 (attention written out: disable_passes=attention),\n"
    "                 gpt2_flash (the attention op: attention=always)\n"
    "  --dtype D      f32, f16 or bf16 (default f16)\n"
    "  --gelu G       the GPTs' MLP activation: erf (default, as char_gpt) or tanh (GPT-2's\n"
    "                 own approximation, which cuBLASLt's GELU epilogues compute)\n"
    "  --device D     cuda (default) or cpu\n"
    "  --steps N      timed steps (default 20); --warmup N  untimed runs first (default 5, >= 1)\n"
    "  --quick        tiny shapes (for checking the scripts on a CPU)\n"
    "  --batch N, --context N, --dim N, --layers N, --heads N, --vocab N, --in N, --hidden N,\n"
    "  --classes N    override the model's shape\n"
    "  --set NAME=VALUE  an option (docs/options.md) after the model's own (repeats); e.g.\n"
    "                 --set disable_passes= runs gpt2 with alloy's default passes\n"
    "  --cost         print the modelled cost of the step (alloy_graph_cost: launches, bytes,\n"
    "                 FLOPs, modelled ms; no GPU needed) and exit without running it\n"
    "  --arch sm_XY   with --cost: ptxas registers and spills from NVRTC (kernel cache)\n"
    "  --all          with --cost: list every launch, not only the 15 slowest\n"
    "  --export-cuda DIR  with --arch: compile the step's kernels for that architecture\n"
    "                 (alloy_graph_export_cuda, through the kernel cache: the entries a\n"
    "                 run on such a GPU reads) into DIR and exit without running it\n"
    "  --cost-device D  the constants: h100 or h200 (default: h200 when the GPU's name says\n"
    "                 H200, else h100); a run's result line carries the model's figures\n"
    "                 (model_device, model_launches, model_gb, model_ms_lo, model_ms_hi)\n"
    "Shapes (full / --quick):\n"
    "  char_gpt    V76 T64 D128 L2 H4 B32           / V76 T16 D32 L1 H2 B4\n"
    "  mlp         in 4096, 4 x 4096, 1000-way B8192 / in 64, 2 x 64, 10-way B64\n"
    "  gpt2        V50257 T1024 D768 L12 H12 B8      / V128 T32 D32 L2 H2 B2\n"
    "  gpt2_flash  as gpt2, B32                      / as gpt2, B4\n";

static void fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void fail(int status, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fputs("gpu_step: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    exit(status);
}

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int parse_int(const char *flag, const char *s)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : -1;
    if (!s || !*s || *end || errno || v < 0 || v > 1 << 24)
        fail(1, "%s wants an integer in [0, %d], got '%s'", flag, 1 << 24, s ? s : "");
    return (int)v;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Next value of a 32-bit LCG, for reproducible random data. */
static unsigned next_seed(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return *seed >> 8;
}

/* Sets option name=value on g or fails naming it. */
static void set_option(alloy_graph *g, const char *name, const char *value)
{
    if (alloy_graph_set_option(g, name, value)) fail(1, "option %s=%s: %s", name, value, alloy_last_error(g));
}

int main(int argc, char **argv)
{
    const char *model = NULL, *dtype = "f16", *device = "cuda", *gelu = "erf";
    int steps = 20, warmup = 5, batch = -1;
    bool quick = false, cost_only = false, cost_all = false;
    const char *arch = NULL, *cost_device = NULL, *export_dir = NULL, *sets[32];
    int nsets = 0;
    int o_context = -1, o_dim = -1, o_layers = -1, o_heads = -1, o_vocab = -1, o_in = -1, o_hidden = -1, o_classes = -1;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--help")) { fputs(usage, stdout); return 0; }
        if (!strcmp(flag, "--quick")) { quick = true; continue; }
        if (!strcmp(flag, "--cost")) { cost_only = true; continue; }
        if (!strcmp(flag, "--all")) { cost_all = true; continue; }
        i++;
        if (!strcmp(flag, "--model") && val) model = val;
        else if (!strcmp(flag, "--dtype") && val) dtype = val;
        else if (!strcmp(flag, "--gelu") && val) gelu = val;
        else if (!strcmp(flag, "--device") && val) device = val;
        else if (!strcmp(flag, "--steps")) steps = parse_int(flag, val);
        else if (!strcmp(flag, "--warmup")) warmup = parse_int(flag, val);
        else if (!strcmp(flag, "--batch")) batch = parse_int(flag, val);
        else if (!strcmp(flag, "--arch") && val) arch = val;
        else if (!strcmp(flag, "--cost-device") && val) cost_device = val;
        else if (!strcmp(flag, "--export-cuda") && val) export_dir = val;
        else if (!strcmp(flag, "--set") && val && strchr(val, '=') && nsets < 32) sets[nsets++] = val;
        else if (!strcmp(flag, "--context")) o_context = parse_int(flag, val);
        else if (!strcmp(flag, "--dim")) o_dim = parse_int(flag, val);
        else if (!strcmp(flag, "--layers")) o_layers = parse_int(flag, val);
        else if (!strcmp(flag, "--heads")) o_heads = parse_int(flag, val);
        else if (!strcmp(flag, "--vocab")) o_vocab = parse_int(flag, val);
        else if (!strcmp(flag, "--in")) o_in = parse_int(flag, val);
        else if (!strcmp(flag, "--hidden")) o_hidden = parse_int(flag, val);
        else if (!strcmp(flag, "--classes")) o_classes = parse_int(flag, val);
        else fail(1, "unknown option or missing value: %s (see --help)", flag);
    }
    if (!model) fail(1, "--model is required: char_gpt, mlp, gpt2 or gpt2_flash (see --help)");
    bool is_mlp = !strcmp(model, "mlp"), is_char = !strcmp(model, "char_gpt"), is_gpt2 = !strcmp(model, "gpt2"),
         is_flash = !strcmp(model, "gpt2_flash");
    if (!is_mlp && !is_char && !is_gpt2 && !is_flash)
        fail(1, "--model wants char_gpt, mlp, gpt2 or gpt2_flash, got '%s'", model);
    alloy_dtype amp = !strcmp(dtype, "f32") ? ALLOY_F32 : !strcmp(dtype, "f16") ? ALLOY_F16
                      : !strcmp(dtype, "bf16") ? ALLOY_BF16 : ALLOY_I32;
    if (amp == ALLOY_I32) fail(1, "--dtype wants f32, f16 or bf16, got '%s'", dtype);
    if (strcmp(device, "cuda") && strcmp(device, "cpu")) fail(1, "--device wants cuda or cpu, got '%s'", device);
    if (strcmp(gelu, "erf") && strcmp(gelu, "tanh")) fail(1, "--gelu wants erf or tanh, got '%s'", gelu);
    if (steps < 1 || warmup < 1) fail(1, "--steps and --warmup must be at least 1 (the first run compiles)");

    gpt_config gpt = is_char ? (quick ? (gpt_config){76, 16, 32, 1, 2, 128, false} : (gpt_config){76, 64, 128, 2, 4, 512, false})
                             : (quick ? (gpt_config){128, 32, 32, 2, 2, 128, false} : (gpt_config){50257, 1024, 768, 12, 12, 3072, false});
    mlp_config mlp = quick ? (mlp_config){64, 64, 2, 10} : (mlp_config){4096, 4096, 4, 1000};
    if (batch < 0) batch = is_char ? (quick ? 4 : 32) : is_mlp ? (quick ? 64 : 8192) : is_gpt2 ? (quick ? 2 : 8) : (quick ? 4 : 32);
    if (o_context >= 0) gpt.context = o_context;
    if (o_dim >= 0) gpt.dim = o_dim;
    if (o_layers >= 0) gpt.layers = mlp.layers = o_layers;
    if (o_heads >= 0) gpt.heads = o_heads;
    if (o_vocab >= 0) gpt.vocab = o_vocab;
    if (o_in >= 0) mlp.in = o_in;
    if (o_hidden >= 0) mlp.hidden = o_hidden;
    if (o_classes >= 0) mlp.classes = o_classes;
    gpt.mlp_width = 4 * gpt.dim;
    gpt.gelu_tanh = !strcmp(gelu, "tanh");
    if (!is_mlp && gpt_config_problem(&gpt)) fail(1, "%s", gpt_config_problem(&gpt));
    if (is_mlp && (mlp.in < 1 || mlp.hidden < 1 || mlp.classes < 1)) fail(1, "--in, --hidden and --classes must be at least 1");
    if (batch < 1) fail(1, "--batch must be at least 1");

    alloy_graph *g = alloy_graph_new(model);
    if (!g) fail(1, "out of memory");
    alloy_graph_set_seed(g, 1);
    /* the MLP's batch (128 MiB at full size) lives on the device, as PyTorch's does: a frozen parameter, not an input */
    alloy_tensor *loss = is_mlp ? mlp_build(g, &mlp, batch, true) : gpt_build(g, &gpt, batch, true).loss;
    alloy_graph_set_loss(g, loss);
    if (amp != ALLOY_F32) alloy_graph_enable_amp(g, amp);
    if (amp == ALLOY_F16) alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler());
    alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.99, 1e-8, 0.01));
    if (alloy_graph_status(g)) fail(1, "building %s: %s", model, alloy_last_error(g));
    set_option(g, "device", device);
    if (is_gpt2) set_option(g, "disable_passes", "attention"); /* the scores written out, as PyTorch's eager model */
    if (is_flash) set_option(g, "attention", "always");
    for (int i = 0; i < nsets; i++) {
        char name[64];
        const char *eq = strchr(sets[i], '=');
        snprintf(name, sizeof name, "%.*s", (int)(eq - sets[i]), sets[i]);
        set_option(g, name, eq + 1);
    }
    if (export_dir) { /* the kernels for one architecture: no device, no run */
        if (!arch) fail(1, "--export-cuda wants --arch sm_XY");
        if (alloy_graph_export_cuda(g, arch, export_dir)) fail(1, "export: %s", alloy_last_error(g));
        printf("# %s %s B%d: kernels for %s in %s\n", model, dtype, batch, arch, export_dir);
        alloy_graph_free(g);
        return 0;
    }
    if (cost_only) { /* the model alone: no device, no run */
        alloy_cost_options co = {.device = cost_device, .arch = arch, .all = cost_all};
        printf("# %s %s B%d (gpu_step --cost)\n", model, dtype, batch);
        if (alloy_graph_cost(g, &co, NULL, stdout)) fail(1, "cost: %s", alloy_last_error(g));
        alloy_graph_free(g);
        return 0;
    }
    /* device=cuda without a GPU fails here, naming what is missing */
    double t0 = seconds();
    const char *device_name = alloy_graph_device(g); /* compiles the step */
    if (!device_name) fail(2, "%s", alloy_last_error(g));
    double open_s = seconds() - t0;

    /* GPTs: tokens [batch, context] and targets [batch * context]; mlp: labels [batch] */
    size_t rows = is_mlp ? (size_t)batch : (size_t)batch * (size_t)gpt.context;
    size_t nx = is_mlp ? 1 : rows; /* the MLP's x is a parameter on the device */
    int *x = malloc(sizeof(int) * nx);
    int *labels = malloc(sizeof(int) * rows);
    double *ms = malloc(sizeof(double) * (size_t)steps);
    if (!x || !labels || !ms) fail(1, "out of memory for the data");
    unsigned seed = 1;
    for (size_t i = 0; i < nx && !is_mlp; i++) x[i] = (int)(next_seed(&seed) % (unsigned)gpt.vocab);
    for (size_t i = 0; i < rows; i++) labels[i] = (int)(next_seed(&seed) % (unsigned)(is_mlp ? mlp.classes : gpt.vocab));
    alloy_host_tensor feeds[2];
    int nfeeds = 2;
    if (is_mlp) {
        feeds[0] = (alloy_host_tensor){"labels", ALLOY_I32, 1, {batch}, labels};
        nfeeds = 1;
    } else {
        feeds[0] = (alloy_host_tensor){"tokens", ALLOY_I32, 2, {batch, gpt.context}, x};
        feeds[1] = (alloy_host_tensor){"targets", ALLOY_I32, 1, {(int64_t)rows}, labels};
    }

    double first_s = 0, warmup_s = open_s;
    for (int i = 0; i < warmup + steps; i++) {
        double s0 = seconds();
        if (alloy_graph_run(g, feeds, nfeeds, NULL, 0)) fail(1, "%s %s, run %d: %s", model, dtype, i + 1, alloy_last_error(g));
        double took = seconds() - s0;
        if (i == 0) first_s = took + open_s;
        if (i < warmup) warmup_s += took;
        else ms[i - warmup] = 1e3 * took;
    }
    alloy_step_info info;
    if (alloy_graph_step_info(g, &info)) fail(1, "step_info: %s", alloy_last_error(g));
    alloy_memory_info mi;
    alloy_device_memory dm;
    if (alloy_graph_memory_info(g, &mi) || alloy_graph_device_memory(g, &dm)) fail(1, "memory: %s", alloy_last_error(g));
    /* the cost model of the same compiled step, beside the measured time */
    alloy_cost_options co = {.device = cost_device ? cost_device : strstr(device_name, "H200") ? "h200" : "h100",
                             .top = -1};
    alloy_cost_totals ct;
    bool modelled = alloy_graph_cost(g, &co, &ct, NULL) == ALLOY_OK;
    qsort(ms, (size_t)steps, sizeof(double), compare_doubles);
    double median = steps % 2 ? ms[steps / 2] : 0.5 * (ms[steps / 2 - 1] + ms[steps / 2]);

    printf("result\timpl=alloy\tmodel=%s\tdtype=%s\tmode=-\tdevice=%s\tbatch=%d\ttokens=%zu", model, dtype, device, batch,
           rows);
    if (is_mlp) printf("\tin=%d\thidden=%d\tlayers=%d\tclasses=%d", mlp.in, mlp.hidden, mlp.layers, mlp.classes);
    else printf("\tvocab=%d\tcontext=%d\tdim=%d\tlayers=%d\theads=%d", gpt.vocab, gpt.context, gpt.dim, gpt.layers, gpt.heads);
    if (modelled)
        printf("\tmodel_device=%s\tmodel_launches=%d\tmodel_gb=%.3f\tmodel_ms_lo=%.3f\tmodel_ms_hi=%.3f", co.device,
               ct.launches, ct.bytes / 1e9, ct.ms_low, ct.ms_high);
    printf("\tms=%.4f\tms_min=%.4f\tsteps=%d\tfirst_s=%.3f\twarmup_s=%.3f\tpeak_bytes=%zu\tplan_bytes=%zu\tloss=%.5f"
           "\tdevice_name=%s\n",
           median, ms[0], steps, first_s, warmup_s, dm.peak_bytes, mi.arena_bytes + mi.state_bytes, info.loss,
           device_name);
    alloy_graph_free(g);
    free(x), free(labels), free(ms);
    return 0;
}
