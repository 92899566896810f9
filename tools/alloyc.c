/* alloyc.c - the alloy command-line driver: prints a graph's compiled IR (or its pictures), runs it once on the CPU with safetensors in and out, or compiles it to CUDA kernels in a directory. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloyc.h"
#include "base/file.h"

/* The help text, in parts (C compilers need only take string literals of
 * 4095 characters). */
static const char *const usage_text[] = {
    "usage: alloyc print FILE.ir [--amp=f16|bf16|off] [--train [--optimizer=sgd|adam|adamw]\n"
    "                            [--scaler=dynamic|static:S|none]] [--print-after=PASS,...|all]\n"
    "                            [--print-before=PASS,...|all] [--time-passes] [--dump-dir DIR]\n"
    "                            [--emit=ir|dot|svg|memory-svg] [--set NAME=VALUE]...\n"
    "       alloyc run FILE.ir [--feed NAME=FILE | --feed FILE]... [--params FILE]\n"
    "                          [--seed N] [--fetch NAME|grad:NAME]... [--loss NAME]\n"
    "                          [--amp=f16|bf16|off]\n"
    "                          [--time-passes] [--dump-dir DIR] [--set NAME=VALUE]... --out FILE\n"
    "       alloyc compile FILE.ir [--train [--optimizer=KIND] [--scaler=KIND]]\n"
    "                              [--amp=f16|bf16|off] [--time-passes] [--dump-dir DIR]\n"
    "                              [--set NAME=VALUE]... --arch sm_XY[,sm_XY...] [--emit=cuda] -o DIR\n"
    "       alloyc compile FILE.ir [--train ...] [--amp=...] [--seed N] [--with-state]\n"
    "                              [--set NAME=VALUE]... [--arch sm_XY[,sm_XY...]] [--emit=bundle]\n"
    "                              -o FILE.alloy\n"
    "       alloyc train FILE.ir --steps N [--feed NAME=FILE | --feed FILE]... [--loss NAME]\n"
    "                            [--optimizer=sgd|adam|adamw] [--lr X] [--weight-decay X]\n"
    "                            [--momentum X] [--clip-norm X] [--amp=f16|bf16|off]\n"
    "                            [--scaler=dynamic|static:S|none] [--params FILE] [--seed N]\n"
    "                            [--checkpoint FILE [--save-every K]] [--save-params FILE]\n"
    "                            [--log-every K] [--amp-stats FILE]\n"
    "                            [--time-passes] [--dump-dir DIR] [--set NAME=VALUE]...\n"
    "       alloyc cost FILE.ir [--train ...] [--amp=...] [--set NAME=VALUE]... [--arch sm_XY]\n"
    "                           [--device h100|h200] [--calibrate PROFILE] [--top N] [--all]\n"
    "       alloyc amp-report FILE.ir [--amp=f16|bf16] [--train ...] [--set NAME=VALUE]...\n"
    "                                 [--stats FILE]\n"
    "       alloyc --help | --version\n"
    "\n",
    "Commands:\n"
    "  print   parse and verify FILE.ir, compile it and print the compiled IR on stdout\n"
    "          (or, with --emit, a picture of it: docs/inspect.md)\n"
    "  run     run FILE.ir once on the CPU and write the fetched tensors to a\n"
    "          safetensors file\n"
    "  compile compile FILE.ir to CUDA C kernels, compile those with NVRTC for each\n"
    "          architecture (no GPU needed) and write them to a directory; print\n"
    "          its summary table; or, with --emit=bundle or -o FILE.alloy, write\n"
    "          the compiled step as one bundle file (docs/bundle.md) that\n"
    "          alloy_bundle_load runs without compiling again: on the CPU, and\n"
    "          (with --arch) on a GPU from its cubins or PTX\n"
    "  train   run N training steps of FILE.ir (its loss, a backward, the optimizer)\n"
    "          on batches from safetensors files, printing progress lines; resume\n"
    "          from --checkpoint if it exists and save it at the end\n"
    "  cost    model the compiled GPU step of FILE.ir from its launch plan, no GPU\n"
    "          needed: every kernel, cuBLASLt GEMM, memset and copy with its bytes,\n"
    "          FLOPs and modelled time by a device's constants; totals, a summary\n"
    "          per class of launch and the slowest launches (docs/cuda.md)\n"
    "  amp-report  compile FILE.ir with AMP (f16 unless --amp says) and print\n"
    "          what it converted and why each node next to a low-precision one\n"
    "          stayed f32, then the counts; with --stats FILE (a stats file train\n"
    "          --amp-stats wrote), colour by its ranges (the amp_ranges option,\n"
    "          each decision with its reason) and print its values: dtype, max\n"
    "          |x|, headroom to the format's max, underflow, the ten with least\n"
    "          headroom (docs/amp.md)\n"
    "\n"
    "Compile options (all commands):\n"
    "  --amp=f16|bf16|off  automatic mixed precision (docs/amp.md); --set amp_log=1\n"
    "                    prints what it converted and why nodes stayed f32\n"
    "  --set NAME=VALUE  set one option (docs/options.md): print_after, print_before,\n"
    "                    disable_passes, no_fuse, amp_log, amp_check, amp_stats,\n"
    "                    amp_ranges, amp_range_margin, no_arena, blas,\n"
    "                    num_threads, cuda_device, nccl,\n"
    "                    lowp_gemm, device, cache, cache_dir, dump_dir, nvrtc, cuda_graph,\n"
    "                    cuda_gemm_f32,\n"
    "                    time_passes, attention, remat, profile; over its ALLOY_* environment\n"
    "                    variable (run computes on the CPU unless --set device=cuda);\n"
    "                    repeats\n"
    "  --time-passes     (--set time_passes=1, ALLOY_TIME_PASSES=1) print a table of\n"
    "                    each pass's time and node count after the compile, as '#'\n"
    "                    lines where printed passes go: stdout with --print-after or\n"
    "                    --print-before (stderr with --emit other than ir), else stderr\n"
    "  --dump-dir DIR    (--set dump_dir=DIR, ALLOY_DUMP_DIR) write the IR before the\n"
    "                    first pass and after each pass to DIR (made when missing), one\n"
    "                    file per stage in pipeline order: GRAPH.00-input.ir,\n"
    "                    GRAPH.01-verify.ir, ... GRAPH.14-plan.ir, each written\n"
    "                    atomically and parsing back as IR; generated CUDA sources go\n"
    "                    there too\n"
    "  --loss NAME       the named scalar node to train on (or differentiate) instead of\n"
    "                    the IR's 'loss %node' line\n"
    "\n",
    "Options of print (--train, --optimizer, --scaler, --print-after and\n"
    "--print-before also of compile; --optimizer, --scaler and the hyper-parameters\n"
    "also of train, which needs no --train):\n"
    "  --train           also build the backward from the IR's 'loss' (grad:NAME outputs)\n"
    "  --optimizer=KIND  with --train: add an sgd, adam or adamw update (train: adamw\n"
    "                    unless given)\n"
    "  --lr X            the learning rate (default 1e-3)\n"
    "  --weight-decay X  default 0.01 for adamw (decoupled), 0 for sgd and adam (L2)\n"
    "  --momentum X      sgd's momentum (default 0.9); adam(w) use betas 0.9, 0.999, eps 1e-8\n"
    "  --clip-norm X     clip the global gradient norm to X (default 0: off)\n"
    "  --scaler=KIND     with --train: dynamic (PyTorch defaults), static:SCALE or none\n"
    "                    (train: dynamic with --amp=f16, else none, unless given), then\n"
    "                    ,KEY=VALUE options: min_scale=S, hysteresis=N (Megatron's),\n"
    "                    max_consecutive_skips=N, stop_at_min_scale (DeepSpeed's): a run\n"
    "                    that reaches a stop rule ends with its last good step's state\n"
    "  --print-after=P   print the IR after pass P (comma-separated, or all) before the\n"
    "                    result; passes: verify, random, lower_norm, attention, amp, autodiff,\n"
    "                    data_parallel, grad_scaler, optimizer, simplify, dce, remat, fuse,\n"
    "                    schedule, plan (after fuse:\n"
    "                    the fusion groups with their kind, inputs, outputs and expressions;\n"
    "                    after schedule:\n"
    "                    the steps with their parts and member flags; after plan: the steps\n"
    "                    and every value's arena slot)\n"
    "  --print-before=P  the same, before pass P\n"
    "  --emit=KIND       print: what to write on stdout: ir (the default), dot (the\n"
    "                    compiled graph in Graphviz DOT: nodes coloured by AMP class,\n"
    "                    shaped by forward, backward or update part, dtypes and shapes on\n"
    "                    the edges, each fused step a cluster), svg (that graph drawn by\n"
    "                    Graphviz's dot -Tsvg, which must be on the PATH), memory-svg (the\n"
    "                    memory plan drawn by alloy: each value's lifetime over the\n"
    "                    schedule's steps against its arena offset, the peak marked)\n",
    "\n"
    "Options of run (each also accepted as --option=VALUE):\n"
    "  --feed NAME=FILE  feed graph input NAME with the tensor called NAME in the\n"
    "                    safetensors FILE (a value with '=' always reads this way)\n"
    "  --feed FILE       feed every tensor of the safetensors FILE whose name is an\n"
    "                    input of the graph; --feed repeats, each input fed once\n"
    "  --params FILE     load the parameters and batch_norm running statistics from\n"
    "                    the safetensors FILE, strictly as PyTorch's\n"
    "                    load_state_dict(strict=True): it must hold exactly those, with\n"
    "                    their dtypes and shapes (a batch_norm's num_batches_tracked\n"
    "                    may be there too); without it they start from their inits\n"
    "  --seed N          seed for parameter initialization (default 0)\n"
    "  --fetch NAME      write the output or named node NAME (an input, parameter or\n"
    "                    intermediate); repeats; default: every\n"
    "                    'output \"NAME\" = ...' line of FILE.ir. grad:NAME is the\n"
    "                    gradient of the loss (the IR's 'loss' line, or --loss) with\n"
    "                    respect to parameter or input NAME: run then builds the\n"
    "                    backward (no loss scaling, no update)\n"
    "  -o, --out FILE    the safetensors file to write, one tensor per fetched name;\n"
    "                    on success run prints the names and types it wrote\n"
    "\n"
    "Options of compile:\n"
    "  --arch LIST       the GPU architectures to build for, compute capabilities\n"
    "                    as sm_XY separated by commas (sm_80,sm_90); where NVRTC\n"
    "                    has no sm_XY it builds PTX for the newest one below;\n"
    "                    the step is compiled as for a GPU (device=auto: the GPU's\n"
    "                    pass choices on any machine; --set device=cpu keeps the\n"
    "                    CPU's)\n"
    "  --emit=cuda|bundle  what to write: CUDA C and NVRTC binaries into a directory\n"
    "                    (cuda: the default unless -o ends in .alloy), or a bundle\n"
    "                    file: the optimized IR, schedule, memory plan, state layout,\n"
    "                    options and seed, written atomically; no GPU needed; with\n"
    "                    --arch also the CUDA executable: per module a cubin for each\n"
    "                    architecture and PTX for the lowest, compiled by NVRTC, and\n"
    "                    the kernel table the GPU runs them from (no NVRTC at load)\n"
    "  --seed N          bundle: the seed its state is initialized from (default 0)\n"
    "  --with-state      bundle: also store the initial state itself (safetensors\n"
    "                    bytes of every param, moment and counter, as initialized\n"
    "                    from the seed); a load starts from them\n"
    "  -o, --out DIR     the directory to write (made when missing): alloy_mN.cu,\n"
    "                    the source of module N (up to 64 kernels);\n"
    "                    alloy_mN.sm_XY.cubin for each architecture (or\n"
    "                    alloy_mN.compute_XY.ptx); summary.txt: a row per kernel and\n"
    "                    per step left to libraries, then totals (also printed)\n"
    "  NVRTC (libnvrtc.so.13, .12 or .11.2) is loaded at run time. Compiles go\n"
    "  through the kernel cache: ALLOY_CACHE_DIR (--set cache_dir=DIR), else\n"
    "  $XDG_CACHE_HOME/alloy or ~/.cache/alloy; ALLOY_CACHE=0 (--set cache=0)\n"
    "  compiles everything. ALLOY_DUMP_DIR (--set dump_dir=DIR) gets a copy of\n"
    "  every source.\n"
    "\n",
    "Options of cost (and those of compile: --train, --optimizer, --scaler, --amp,\n"
    "--set):\n"
    "  --arch sm_XY      one architecture: compile the kernels with NVRTC (through the\n"
    "                    kernel cache) for ptxas' registers, spills and shared memory\n"
    "                    per kernel; spills add their local-memory traffic\n"
    "  --device D        the constants' table: h100 (default, H100 SXM) or h200\n"
    "  --calibrate FILE  fit the table's bandwidth efficiency, GEMM rates and kernel\n"
    "                    floor to an ALLOY_PROFILE table measured on a GPU (FILE may\n"
    "                    hold other lines), print the fit, then model with it\n"
    "  --top N           the slowest launches listed (default 15)\n"
    "  --all             also list every launch in plan order\n"
    "  The step is compiled as for a GPU (device=auto: the GPU's pass choices on\n"
    "  any machine; --set device=cpu models the CPU's plan).\n"
    "  Every figure is modelled, not measured. The IR file fixes the shapes: a\n"
    "  batch size is the IR's (bench/gpu_step --cost --batch N models the\n"
    "  benchmarks' models at any batch).\n"
    "\n",
    "Options of amp-report (and those of compile: --train, --optimizer, --scaler,\n"
    "--amp, --set):\n"
    "  --amp=f16|bf16    the low-precision dtype (default f16)\n"
    "  --stats FILE      a stats file (alloyc train --amp-stats FILE, or\n"
    "                    alloy_graph_save_amp_stats): colour by its observed ranges\n"
    "                    (--set amp_range_margin=M, default 2) and print its values\n"
    "\n",
    "Options of train (--feed, --params, --seed as in run, except as said):\n"
    "  --steps N         the steps to run now (required); step numbers go on from\n"
    "                    the checkpoint's (its optimizer steps plus skipped steps)\n"
    "  --feed NAME=FILE, --feed FILE  as in run; a tensor of the input's type is fed\n"
    "                    every step, one with an extra leading dimension B (f32[B,8,4]\n"
    "                    for an input f32[8,4]) holds B batches: step s takes batch\n"
    "                    (s - 1) mod B; batched feeds must agree on B\n"
    "  --params FILE     start the parameters from FILE, as strictly as run does (a\n"
    "                    PyTorch state_dict), when there is no checkpoint to resume from\n"
    "  --save-params FILE  at the end, write the parameters and batch_norm running\n"
    "                    statistics alone (PyTorch's state_dict names; loads with\n"
    "                    load_state_dict(strict=True) and with --params)\n"
    "  --checkpoint FILE resume from FILE if it exists (all state: parameters, moments,\n"
    "                    counters, loss scale), and save it there, atomically, at the end\n"
    "  --save-every K    also save the checkpoint after every step divisible by K\n"
    "  --log-every K     print a progress line after every step divisible by K and\n",
    "                    after the last (default 10): 'step S loss L scale X skipped K\n"
    "                    samples/s R lr LR', K the steps skipped so far for inf/NaN\n"
    "                    gradients; tok/s when an input is integer of rank >= 2 (token\n"
    "                    ids: all its elements count), else samples/s (the first\n"
    "                    input's leading dimension), timed without the compile and,\n"
    "                    unless it is alone on its line, the first step (its setup)\n"
    "  --data-parallel   under mpirun: this process is one rank of a data-parallel run\n"
    "                    (docs/distributed.md); with W ranks, rank r's step s takes\n"
    "                    batch ((s - 1) W + r) mod B, the gradients are averaged over\n"
    "                    the ranks, rank 0 prints and writes the checkpoint\n"
    "  --zero            with --data-parallel: ZeRO-1, each rank keeps and updates its\n"
    "                    shard of the optimizer's moments; the checkpoint is the same\n"
    "                    layout (every rank takes part in writing it)\n"
    "  --set amp_check=1 also prints, for every skipped step, 'step S skipped: first\n"
    "                    inf at NODE OP TYPE (forward|backward of OP NODE, gradient of\n"
    "                    PARAM), scale A -> B' (the overflow locator, CPU; docs/amp.md)\n"
    "  --amp-stats FILE  track each f16/bf16 value's max |x| and underflow over the\n"
    "                    steps (--set amp_stats=1, CPU), print them at the end (the\n"
    "                    ten with the least headroom last) and write them to FILE,\n"
    "                    which a later compile reads with --set amp_ranges=FILE:\n"
    "                    values whose max |x| times amp_range_margin (2) would\n"
    "                    overflow stay f32 (docs/amp.md, \"Range statistics\")\n"
    "  train computes on the device option's choice (auto: the GPU when there is one;\n"
    "  --set device=cpu for the CPU).\n"
    "\n"
    "  -h, --help        print this help and exit\n"
    "  --version         print the version and exit\n"
    "\n"
    "Exit status: 0 on success, 1 on an error (unreadable file, bad IR, dtype or\n"
    "shape mismatch, no NVRTC, a kernel NVRTC rejects, a checkpoint of another\n"
    "graph, a scaler stop rule reached), 2 on a usage error (unknown or repeated\n"
    "flag, bad flag value). Errors are one line on stderr.\n",
};

static void print_usage(void)
{
    for (size_t i = 0; i < sizeof usage_text / sizeof usage_text[0]; i++) fputs(usage_text[i], stdout);
}

/* A usage error: the message, a pointer to --help, exit status 2. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return alloyc_fail(EXIT_USAGE, "%s (see alloyc --help)", msg);
}

/* ---- command line ---- */

static const char *const emit_names[] = {"ir", "dot", "svg", "memory-svg"};

/* Matches argv[*i] against --flag and --flag=VALUE. Returns 1 and sets
 * *value on a match, 0 when argv[*i] is another argument, -1 when the value
 * is missing. */
static int take_value(int argc, char **argv, int *i, const char *flag, const char **value)
{
    const char *arg = argv[*i];
    size_t n = strlen(flag);
    if (strncmp(arg, flag, n) != 0) return 0;
    if (arg[n] == '=') {
        *value = arg + n + 1;
        return 1;
    }
    if (arg[n] != '\0') return 0;
    if (*i + 1 >= argc) return -1;
    *value = argv[++*i];
    return 1;
}

static bool parse_seed(const char *text, uint64_t *out)
{
    if (!(*text >= '0' && *text <= '9')) return false; /* strtoull takes "-1" and " 1" */
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end) return false;
    *out = (uint64_t)v;
    return true;
}

/* A hyper-parameter: a finite number >= 0 written whole ("1e-3", "0.9"). */
static bool parse_rate(const char *text, double *out)
{
    if (!((*text >= '0' && *text <= '9') || *text == '.')) return false; /* no sign, space, nan or inf */
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno == ERANGE && v != 0) return false; /* overflow; underflow to 0 reads as 0 */
    if (*end || !isfinite(v)) return false;
    *out = v;
    return true;
}

/* A count in [min, max] written in decimal. */
static bool parse_count(const char *text, long min, long max, long *out)
{
    uint64_t v;
    if (!parse_seed(text, &v) || v < (uint64_t)min || v > (uint64_t)max) return false;
    *out = (long)v;
    return true;
}

bool alloyc_scaler(const char *text, alloy_grad_scaler *out, char *why, size_t whylen)
{
    size_t head = strcspn(text, ",");
    alloy_grad_scaler s = alloy_dynamic_scaler();
    double v;
    char num[64];
    if (head == 7 && strncmp(text, "dynamic", 7) == 0) {
    } else if (head > 7 && head - 7 < sizeof num && strncmp(text, "static:", 7) == 0) {
        memcpy(num, text + 7, head - 7), num[head - 7] = '\0';
        if (!parse_rate(num, &v) || v <= 0) {
            snprintf(why, whylen, "--scaler static:SCALE wants a finite number > 0, got '%s'", text);
            return false;
        }
        s = alloy_static_scaler(v);
    } else {
        snprintf(why, whylen, "--scaler wants dynamic, static:SCALE or none, then ,KEY=VALUE options; got '%s'", text);
        return false;
    }
    for (const char *p = text + head; *p == ',';) {
        p++;
        size_t len = strcspn(p, ",");
        char item[96];
        if (len >= sizeof item) len = sizeof item - 1;
        memcpy(item, p, len), item[len] = '\0';
        p += strcspn(p, ",");
        char *eq = strchr(item, '=');
        const char *val = eq ? eq + 1 : "";
        if (eq) *eq = '\0';
        long n;
        bool ok = true;
        if (strcmp(item, "min_scale") == 0) ok = parse_rate(val, &s.min_scale);
        else if (strcmp(item, "hysteresis") == 0) ok = parse_count(val, 0, INT32_MAX, &n) && (s.hysteresis = (int)n, 1);
        else if (strcmp(item, "max_consecutive_skips") == 0)
            ok = parse_count(val, 0, INT32_MAX, &n) && (s.max_consecutive_skips = (int)n, 1);
        else if (strcmp(item, "stop_at_min_scale") == 0) ok = !eq, s.stop_at_min_scale = true;
        else {
            snprintf(why, whylen, "--scaler: unknown option '%s' (min_scale=S, hysteresis=N, max_consecutive_skips=N, "
                     "stop_at_min_scale)", item);
            return false;
        }
        if (!ok) {
            snprintf(why, whylen, "--scaler: bad value for '%s' in '%s'", item, text);
            return false;
        }
    }
    *out = s;
    return true;
}

/* The commands, as bits of the options each takes. */
enum { CMD_PRINT = 1, CMD_RUN = 2, CMD_COMPILE = 4, CMD_TRAIN = 8, CMD_COST = 16, CMD_AMP_REPORT = 32, CMD_ALL = 63 };
enum { COMMAND_COUNT = 6 };
static const char *const command_names[COMMAND_COUNT] = {"print", "run", "compile", "train", "cost", "amp-report"};

/* The options that take a value, and the commands that take each. */
enum { F_FEED, F_FETCH, F_PARAMS, F_SEED, F_OUT, F_AMP, F_OPTIMIZER, F_SCALER, F_PRINT_AFTER, F_PRINT_BEFORE, F_SET,
       F_ARCH, F_EMIT, F_DUMP_DIR, F_LR, F_WEIGHT_DECAY, F_MOMENTUM, F_CLIP_NORM, F_LOSS, F_STEPS, F_CHECKPOINT,
       F_SAVE_EVERY, F_LOG_EVERY, F_SAVE_PARAMS, F_AMP_STATS, F_DEVICE, F_CALIBRATE, F_TOP, F_STATS, F_COUNT };
static const struct {
    const char *name, *alias;
    unsigned commands;
} value_flags[F_COUNT] = {
    [F_FEED] = {"--feed", NULL, CMD_RUN | CMD_TRAIN},
    [F_FETCH] = {"--fetch", NULL, CMD_RUN},
    [F_PARAMS] = {"--params", NULL, CMD_RUN | CMD_TRAIN},
    [F_SEED] = {"--seed", NULL, CMD_RUN | CMD_COMPILE | CMD_TRAIN},
    [F_OUT] = {"--out", "-o", CMD_RUN | CMD_COMPILE},
    [F_AMP] = {"--amp", NULL, CMD_ALL},
    [F_OPTIMIZER] = {"--optimizer", NULL, CMD_PRINT | CMD_COMPILE | CMD_TRAIN | CMD_COST | CMD_AMP_REPORT},
    [F_SCALER] = {"--scaler", NULL, CMD_PRINT | CMD_COMPILE | CMD_TRAIN | CMD_COST | CMD_AMP_REPORT},
    [F_LR] = {"--lr", NULL, CMD_PRINT | CMD_COMPILE | CMD_TRAIN | CMD_COST | CMD_AMP_REPORT},
    [F_WEIGHT_DECAY] = {"--weight-decay", NULL, CMD_PRINT | CMD_COMPILE | CMD_TRAIN | CMD_COST | CMD_AMP_REPORT},
    [F_MOMENTUM] = {"--momentum", NULL, CMD_PRINT | CMD_COMPILE | CMD_TRAIN | CMD_COST | CMD_AMP_REPORT},
    [F_CLIP_NORM] = {"--clip-norm", NULL, CMD_PRINT | CMD_COMPILE | CMD_TRAIN | CMD_COST | CMD_AMP_REPORT},
    [F_LOSS] = {"--loss", NULL, CMD_ALL},
    [F_STEPS] = {"--steps", NULL, CMD_TRAIN},
    [F_CHECKPOINT] = {"--checkpoint", NULL, CMD_TRAIN},
    [F_SAVE_EVERY] = {"--save-every", NULL, CMD_TRAIN},
    [F_SAVE_PARAMS] = {"--save-params", NULL, CMD_TRAIN},
    [F_AMP_STATS] = {"--amp-stats", NULL, CMD_TRAIN},
    [F_LOG_EVERY] = {"--log-every", NULL, CMD_TRAIN},
    [F_PRINT_AFTER] = {"--print-after", NULL, CMD_PRINT | CMD_COMPILE},
    [F_PRINT_BEFORE] = {"--print-before", NULL, CMD_PRINT | CMD_COMPILE},
    [F_SET] = {"--set", NULL, CMD_ALL},
    [F_ARCH] = {"--arch", NULL, CMD_COMPILE | CMD_COST},
    [F_DEVICE] = {"--device", NULL, CMD_COST},
    [F_CALIBRATE] = {"--calibrate", NULL, CMD_COST},
    [F_TOP] = {"--top", NULL, CMD_COST},
    [F_STATS] = {"--stats", NULL, CMD_AMP_REPORT},
    [F_EMIT] = {"--emit", NULL, CMD_PRINT | CMD_COMPILE},
    [F_DUMP_DIR] = {"--dump-dir", NULL, CMD_ALL},
};

/* Remembers the first option the command does not take (reported once the
 * command line is read, after the errors of its values). */
static void note_option(options *o, unsigned command, const char *name, unsigned commands)
{
    if (!(commands & command) && !o->misplaced) {
        o->misplaced = name;
        o->misplaced_commands = commands;
    }
}

/* Whether list is sm_XY[,sm_XY...]: compute capabilities from 10 to 9999,
 * no leading zero, none twice (the library checks again; here it is a
 * usage error). */
static bool valid_archs(const char *list)
{
    int seen[16], n = 0;
    for (const char *p = list;;) {
        size_t len = strcspn(p, ",");
        if (len < 5 || len > 7 || strncmp(p, "sm_", 3) != 0 || p[3] == '0' || n == 16) return false;
        int sm = 0;
        for (size_t i = 3; i < len; i++) {
            if (p[i] < '0' || p[i] > '9') return false;
            sm = sm * 10 + (p[i] - '0');
        }
        for (int i = 0; i < n; i++)
            if (seen[i] == sm) return false;
        seen[n++] = sm;
        if (!p[len]) return true;
        p += len + 1;
    }
}

/* Fills o from argv; returns 0, or an exit code after printing (help,
 * version or a usage error). *done is set when the program should exit. */
static int parse_args(int argc, char **argv, options *o, bool *done)
{
    *done = true;
    if (argc < 2) return usage_error("no command given");
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0) {
        print_usage();
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("alloyc %d.%d.%d\n", ALLOY_VERSION_MAJOR, ALLOY_VERSION_MINOR, ALLOY_VERSION_PATCH);
        return 0;
    }
    unsigned command = 0;
    for (int c = 0; c < COMMAND_COUNT; c++)
        if (strcmp(cmd, command_names[c]) == 0) command = 1u << c;
    if (!command) {
        if (cmd[0] == '-') return usage_error("unknown option '%s'", cmd);
        return usage_error("unknown command '%s' (commands: print, run, compile, train, cost, amp-report)", cmd);
    }
    o->command = cmd;
    o->feeds = calloc((size_t)argc, sizeof *o->feeds);
    o->fetches = calloc((size_t)argc, sizeof *o->fetches);
    o->sets = calloc((size_t)argc, sizeof *o->sets);
    if (!o->feeds || !o->fetches || !o->sets) return alloyc_fail(EXIT_ERROR, "out of memory");
    bool emit = false;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i], *value = NULL;
        int got;
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            print_usage();
            return 0;
        }
        if (strcmp(arg, "--version") == 0) {
            printf("alloyc %d.%d.%d\n", ALLOY_VERSION_MAJOR, ALLOY_VERSION_MINOR,
                   ALLOY_VERSION_PATCH);
            return 0;
        }
        if (strcmp(arg, "--train") == 0) {
            o->train = true;
            note_option(o, command, arg, CMD_PRINT | CMD_COMPILE | CMD_COST | CMD_AMP_REPORT);
            continue;
        }
        if (strcmp(arg, "--time-passes") == 0) {
            o->time_passes = true;
            continue;
        }
        if (strcmp(arg, "--all") == 0) {
            o->all = true;
            note_option(o, command, arg, CMD_COST);
            continue;
        }
        if (strcmp(arg, "--data-parallel") == 0) {
            o->data_parallel = true;
            note_option(o, command, arg, CMD_TRAIN);
            continue;
        }
        if (strcmp(arg, "--zero") == 0) {
            o->zero = true;
            note_option(o, command, arg, CMD_TRAIN);
            continue;
        }
        if (strcmp(arg, "--with-state") == 0) {
            o->with_state = true;
            note_option(o, command, arg, CMD_COMPILE);
            continue;
        }
        int which = -1;
        const char *given = NULL; /* the spelling used: --out or -o */
        for (int f = 0; f < F_COUNT && which < 0; f++) {
            for (int a = 0; a < 2 && which < 0; a++) {
                const char *name = a ? value_flags[f].alias : value_flags[f].name;
                if (!name) continue;
                got = take_value(argc, argv, &i, name, &value);
                if (got < 0) return usage_error("%s needs a value", name);
                if (got > 0) which = f, given = name;
            }
        }
        if (which >= 0) {
            note_option(o, command, given, value_flags[which].commands);
            if (!*value) return usage_error("%s needs a non-empty value", given);
        }
        switch (which) {
        case F_FEED:
            if (value[0] == '=') return usage_error("--feed '%s': the input name before '=' is empty", value);
            o->feeds[o->nfeeds++] = value;
            break;
        case F_FETCH:
            for (int k = 0; k < o->nfetches; k++)
                if (strcmp(o->fetches[k], value) == 0)
                    return usage_error("--fetch '%s' is given twice", value);
            o->fetches[o->nfetches++] = value;
            break;
        case F_PARAMS:
            if (o->params) return usage_error("--params is given twice");
            o->params = value;
            break;
        case F_SEED:
            if (o->have_seed) return usage_error("--seed is given twice");
            if (!parse_seed(value, &o->seed))
                return usage_error("--seed wants an integer in [0, 2^64), got '%s'", value);
            o->have_seed = true;
            break;
        case F_OUT:
            if (o->out) return usage_error("--out is given twice");
            o->out = value;
            break;
        case F_AMP:
            if (strcmp(value, "f16") == 0 || strcmp(value, "fp16") == 0) o->amp = ALLOY_F16;
            else if (strcmp(value, "bf16") == 0) o->amp = ALLOY_BF16;
            else if (strcmp(value, "off") == 0 || strcmp(value, "f32") == 0) o->amp = ALLOY_F32;
            else return usage_error("--amp wants f16, bf16 or off, got '%s'", value);
            o->amp_given = true;
            break;
        case F_OPTIMIZER:
            if (strcmp(value, "sgd") && strcmp(value, "adam") && strcmp(value, "adamw"))
                return usage_error("--optimizer wants sgd, adam or adamw, got '%s'", value);
            o->optimizer = value;
            break;
        case F_SCALER:
            if (strcmp(value, "none") != 0) {
                alloy_grad_scaler sc;
                char why[256];
                if (!alloyc_scaler(value, &sc, why, sizeof why)) return usage_error("%s", why);
            }
            o->scaler = value;
            break;
        case F_PRINT_AFTER:
            o->print_after = value;
            break;
        case F_PRINT_BEFORE:
            o->print_before = value;
            break;
        case F_SET:
            if (!strchr(value, '=') || value[0] == '=') return usage_error("--set wants NAME=VALUE, got '%s'", value);
            o->sets[o->nsets++] = value;
            break;
        case F_ARCH:
            if (o->arch) return usage_error("--arch is given twice");
            if (!valid_archs(value))
                return usage_error("--arch wants sm_XY[,sm_XY...], compute capabilities 10 to 9999 each given "
                                   "once (for example sm_80,sm_90), got '%s'", value);
            o->arch = value;
            break;
        case F_EMIT:
            if (emit) return usage_error("--emit is given twice");
            emit = true;
            o->emit_given = true;
            if (command == CMD_COMPILE) {
                if (strcmp(value, "cuda") != 0 && strcmp(value, "bundle") != 0)
                    return usage_error("--emit of compile wants cuda or bundle, got '%s'", value);
                o->bundle = strcmp(value, "bundle") == 0;
                break;
            }
            if (command != CMD_PRINT) break; /* reported as misplaced */
            int kind = -1;
            for (int k = 0; k <= EMIT_MEMORY_SVG; k++)
                if (strcmp(value, emit_names[k]) == 0) kind = k;
            if (kind < 0) return usage_error("--emit of print wants ir, dot, svg or memory-svg, got '%s'", value);
            o->emit = (emit_kind)kind;
            break;
        case F_DEVICE:
            if (o->cost_device) return usage_error("--device is given twice");
            if (strcmp(value, "h100") && strcmp(value, "h200"))
                return usage_error("--device wants h100 or h200, got '%s'", value);
            o->cost_device = value;
            break;
        case F_CALIBRATE:
            if (o->calibrate) return usage_error("--calibrate is given twice");
            o->calibrate = value;
            break;
        case F_TOP:
            if (o->top) return usage_error("--top is given twice");
            if (!parse_count(value, 1, 1000000, &o->top))
                return usage_error("--top wants a whole number from 1 to 1000000, got '%s'", value);
            break;
        case F_DUMP_DIR:
            if (o->dump_dir) return usage_error("--dump-dir is given twice");
            o->dump_dir = value;
            break;
        case F_LR:
        case F_WEIGHT_DECAY:
        case F_MOMENTUM:
        case F_CLIP_NORM: {
            double *at = which == F_LR ? &o->lr : which == F_WEIGHT_DECAY ? &o->weight_decay
                                               : which == F_MOMENTUM   ? &o->momentum
                                                                       : &o->clip_norm;
            bool *have = which == F_LR ? &o->have_lr : which == F_WEIGHT_DECAY ? &o->have_weight_decay
                                                      : which == F_MOMENTUM   ? &o->have_momentum
                                                                              : &o->have_clip_norm;
            if (*have) return usage_error("%s is given twice", given);
            if (!parse_rate(value, at)) return usage_error("%s wants a finite number >= 0, got '%s'", given, value);
            *have = true;
            break;
        }
        case F_LOSS:
            if (o->loss) return usage_error("--loss is given twice");
            o->loss = value;
            break;
        case F_STEPS:
            if (o->steps) return usage_error("--steps is given twice");
            if (!parse_count(value, 1, 1000000000, &o->steps))
                return usage_error("--steps wants a whole number from 1 to 1000000000, got '%s'", value);
            break;
        case F_CHECKPOINT:
            if (o->checkpoint) return usage_error("--checkpoint is given twice");
            o->checkpoint = value;
            break;
        case F_STATS:
            if (o->stats) return usage_error("--stats is given twice");
            o->stats = value;
            break;
        case F_AMP_STATS:
            if (o->amp_stats) return usage_error("--amp-stats is given twice");
            o->amp_stats = value;
            break;
        case F_SAVE_PARAMS:
            if (o->save_params) return usage_error("--save-params is given twice");
            o->save_params = value;
            break;
        case F_SAVE_EVERY:
        case F_LOG_EVERY: {
            long *at = which == F_SAVE_EVERY ? &o->save_every : &o->log_every;
            if (*at) return usage_error("%s is given twice", given);
            if (!parse_count(value, 1, 1000000000, at))
                return usage_error("%s wants a whole number from 1 to 1000000000, got '%s'", given, value);
            break;
        }
        default:
            if (arg[0] == '-' && arg[1] != '\0') return usage_error("unknown option '%s'", arg);
            if (o->ir_path) return usage_error("unexpected argument '%s'", arg);
            o->ir_path = arg;
        }
    }
    if (!o->ir_path) return usage_error("'%s' needs an IR file", cmd);
    if (o->misplaced) {
        char list[128] = "";
        for (int c = 0, k = 0, n = __builtin_popcount(o->misplaced_commands); c < COMMAND_COUNT; c++) {
            if (!(o->misplaced_commands & 1u << c)) continue;
            size_t used = strlen(list);
            snprintf(list + used, sizeof list - used, "%s'%s'", k == 0 ? "" : k == n - 1 ? " and " : ", ",
                     command_names[c]);
            k++;
        }
        return usage_error("%s is an option of %s, not '%s'", o->misplaced, list, cmd);
    }
    if (command == CMD_RUN && !o->out) return usage_error("run needs --out FILE");
    if (command == CMD_COMPILE && !o->out)
        return usage_error("compile needs -o DIR (the directory to write) or -o FILE.alloy (a bundle)");
    size_t outlen = o->out ? strlen(o->out) : 0;
    if (command == CMD_COMPILE && !o->emit_given && outlen > 6 && strcmp(o->out + outlen - 6, ".alloy") == 0)
        o->bundle = true;
    if (command == CMD_COMPILE && !o->bundle && o->have_seed)
        return usage_error("--seed of compile is for bundles (--emit=bundle or -o FILE.alloy)");
    if (command == CMD_COMPILE && !o->bundle && o->with_state)
        return usage_error("--with-state is for bundles (--emit=bundle or -o FILE.alloy)");
    if (command == CMD_COMPILE && !o->bundle && !o->arch)
        return usage_error("compile needs --arch sm_XY[,sm_XY...] (for example sm_80,sm_90)");
    if (command != CMD_TRAIN && (o->optimizer || o->scaler) && !o->train)
        return usage_error("--optimizer and --scaler need --train");
    const char *hyper = o->have_lr ? "--lr" : o->have_weight_decay ? "--weight-decay"
                      : o->have_momentum ? "--momentum" : o->have_clip_norm ? "--clip-norm" : NULL;
    if (hyper && command != CMD_TRAIN && !o->optimizer) return usage_error("%s needs --optimizer", hyper);
    if (o->have_momentum && o->optimizer && strcmp(o->optimizer, "sgd") != 0)
        return usage_error("--momentum is a setting of --optimizer=sgd, not %s", o->optimizer);
    if (command == CMD_TRAIN && !o->optimizer && o->have_momentum)
        return usage_error("--momentum is a setting of --optimizer=sgd (train's default optimizer is adamw)");
    if (command == CMD_TRAIN && !o->steps) return usage_error("train needs --steps N (the steps to run)");
    if (o->save_every && !o->checkpoint) return usage_error("--save-every needs --checkpoint FILE");
    *done = false;
    return 0;
}

/* ---- names ---- */

/* A growing list of malloc'd strings. */
typedef struct names {
    char **at;
    int n, cap;
} names;

static bool names_add(names *l, char *s)
{
    if (!s) return false;
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        char **at = realloc(l->at, sizeof *at * (size_t)cap);
        if (!at) {
            free(s);
            return false;
        }
        l->at = at;
        l->cap = cap;
    }
    l->at[l->n++] = s;
    return true;
}

static bool names_has(const names *l, const char *s)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->at[i], s) == 0) return true;
    return false;
}

static void names_free(names *l)
{
    for (int i = 0; i < l->n; i++) free(l->at[i]);
    free(l->at);
    *l = (names){0};
}

/* The names of g's outputs and inputs, in the order they were declared.
 * Returns false when out of memory. */
static bool list_names(const alloy_graph *g, names *outputs, names *inputs)
{
    for (int i = 0; i < alloy_graph_output_count(g); i++)
        if (!names_add(outputs, strdup(alloy_graph_output_name(g, i)))) return false;
    for (int i = 0; i < alloy_graph_input_count(g); i++) {
        alloy_host_tensor in;
        if (alloy_graph_input_at(g, i, &in) || !names_add(inputs, strdup(in.name))) return false;
    }
    return true;
}

/* ---- commands ---- */

/* Applies the compile options to g; returns the first failing status (alloyc.h). */
alloy_status alloyc_configure(alloy_graph *g, const options *o)
{
    alloy_status st = ALLOY_OK;
    if (o->amp != ALLOY_F32) st = alloy_graph_enable_amp(g, o->amp);
    if (!st && (o->train || o->loss)) st = alloy_graph_set_training(g, o->train); /* set_loss turned it on */
    if (!st && o->scaler && strcmp(o->scaler, "none") != 0) {
        alloy_grad_scaler s;
        char why[256];
        alloyc_scaler(o->scaler, &s, why, sizeof why); /* checked with the arguments */
        st = alloy_graph_set_grad_scaler(g, s);
    }
    if (!st && o->optimizer) st = alloy_graph_add_optimizer(g, alloyc_optimizer(o));
    /* printed passes go to stdout, unless stdout carries a picture */
    FILE *log = o->emit == EMIT_IR ? stdout : stderr;
    if (!st && o->print_after) st = alloy_graph_print_after(g, o->print_after, log);
    if (!st && o->print_before) {
        st = alloy_graph_print_after(g, o->print_after ? o->print_after : "", log);
        if (!st) st = alloy_graph_set_option(g, "print_before", o->print_before);
    }
    return st ? st : alloyc_apply_sets(g, o);
}

/* The path of program `name` in a directory of $PATH into buf; false when none is executable there. */
static bool find_program(const char *name, char *buf, size_t len)
{
    const char *path = getenv("PATH");
    for (const char *p = path ? path : ""; *p;) {
        size_t n = strcspn(p, ":");
        if (n && snprintf(buf, len, "%.*s/%s", (int)n, p, name) < (int)len && access(buf, X_OK) == 0) return true;
        p += n + (p[n] == ':');
    }
    return false;
}

/* Compiles g and pipes its DOT text through Graphviz's `dot -Tsvg` (at
 * dot_path) onto stdout; an exit code. */
static int print_svg(alloy_graph *g, const options *o, const char *dot_path)
{
    int fds[2];
    if (pipe(fds) != 0) return alloyc_fail(EXIT_ERROR, "cannot make a pipe to dot: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]);
        return alloyc_fail(EXIT_ERROR, "cannot start %s: %s", dot_path, strerror(errno));
    }
    if (pid == 0) {
        dup2(fds[0], 0);
        close(fds[0]), close(fds[1]);
        execl(dot_path, "dot", "-Tsvg", (char *)NULL);
        fprintf(stderr, "alloyc: cannot run %s: %s\n", dot_path, strerror(errno));
        _exit(127);
    }
    close(fds[0]);
    void (*was)(int) = signal(SIGPIPE, SIG_IGN); /* a dot that exits early is reported below */
    FILE *to_dot = fdopen(fds[1], "w");
    alloy_status st = to_dot ? alloy_graph_dump(g, to_dot, ALLOY_DUMP_DOT) : ALLOY_ERR_IO;
    if (to_dot) fclose(to_dot);
    else close(fds[1]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    signal(SIGPIPE, was);
    if (st && st != ALLOY_ERR_IO) return alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(g, st));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return alloyc_fail(EXIT_ERROR, "%s -Tsvg failed (%s %d) on the DOT text of %s; --emit=dot writes that text", dot_path,
                    WIFEXITED(status) ? "exit status" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), o->ir_path);
    if (st) return alloyc_fail(EXIT_ERROR, "%s: writing the DOT text to %s failed", o->ir_path, dot_path);
    return 0;
}

static int cmd_print(const options *o)
{
    alloy_graph *g = alloyc_load_graph(o->ir_path);
    if (!g) return EXIT_ERROR;
    if (o->loss && alloyc_set_loss(g, o)) {
        alloy_graph_free(g);
        return EXIT_ERROR;
    }
    char dot_path[4096];
    if (o->emit == EMIT_SVG && !find_program("dot", dot_path, sizeof dot_path)) {
        alloy_graph_free(g);
        return alloyc_fail(EXIT_ERROR, "--emit=svg needs Graphviz's dot on the PATH (not found; install graphviz, or write "
                                "the DOT text with --emit=dot and render it elsewhere)");
    }
    static const alloy_dump_kind kinds[] = {ALLOY_DUMP_IR, ALLOY_DUMP_DOT, ALLOY_DUMP_DOT, ALLOY_DUMP_MEMORY_SVG};
    alloy_status st = alloyc_configure(g, o);
    alloy_memory_info compiled;
    if (!st && o->emit == EMIT_SVG && !(st = alloy_graph_memory_info(g, &compiled))) { /* compile errors before dot starts */
        int code = print_svg(g, o, dot_path);
        alloy_graph_free(g);
        return code;
    }
    if (!st) st = alloy_graph_dump(g, stdout, kinds[o->emit]);
    int rc = 0;
    if (st) rc = alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(g, st));
    else if (fflush(stdout) || ferror(stdout)) rc = alloyc_fail(EXIT_ERROR, "writing the IR to stdout failed");
    alloy_graph_free(g);
    return rc;
}

/* What a run holds, freed at once by run_free. */
typedef struct run_ctx {
    const char *ir_path;
    alloy_graph *g;
    names outputs, inputs;
    alloy_safetensors **files; /* one per --feed */
    alloy_host_tensor *feeds;
    const char **feed_file; /* the file each feed came from, for messages */
    int nfeeds, feed_cap;
    alloy_host_tensor *fetches;
} run_ctx;

static void run_free(run_ctx *r, int nfiles)
{
    for (int i = 0; i < nfiles; i++) alloy_safetensors_free(r->files[i]);
    free(r->files);
    free(r->feeds);
    free(r->feed_file);
    free(r->fetches);
    names_free(&r->outputs);
    names_free(&r->inputs);
    alloy_graph_free(r->g);
}

/* Adds tensor t (from file) to the feeds; fails if its input is fed already. */
static int add_feed(run_ctx *r, const alloy_host_tensor *t, const char *file)
{
    for (int i = 0; i < r->nfeeds; i++)
        if (strcmp(r->feeds[i].name, t->name) == 0)
            return alloyc_fail(EXIT_USAGE, "input '%s' is fed twice (from %s and from %s)", t->name,
                        r->feed_file[i], file);
    if (r->nfeeds == r->feed_cap) {
        int cap = r->feed_cap ? r->feed_cap * 2 : 8;
        alloy_host_tensor *feeds = realloc(r->feeds, sizeof *feeds * (size_t)cap);
        if (!feeds) return alloyc_fail(EXIT_ERROR, "out of memory");
        r->feeds = feeds;
        const char **from = realloc(r->feed_file, sizeof *from * (size_t)cap);
        if (!from) return alloyc_fail(EXIT_ERROR, "out of memory");
        r->feed_file = from;
        r->feed_cap = cap;
    }
    r->feeds[r->nfeeds] = *t;
    r->feed_file[r->nfeeds++] = file;
    return 0;
}

/* Loads the file of the i-th --feed and adds what it names to the feeds. */
static int load_feed(run_ctx *r, const char *spec, int i)
{
    const char *eq = strchr(spec, '=');
    char name[512] = "";
    const char *path = spec;
    if (eq) {
        if ((size_t)(eq - spec) >= sizeof name) return alloyc_fail(EXIT_USAGE, "--feed: input name is too long");
        memcpy(name, spec, (size_t)(eq - spec));
        name[eq - spec] = '\0';
        path = eq + 1;
        if (!*path) return alloyc_fail(EXIT_USAGE, "--feed %s: no file after '='", spec);
    }
    char err[1024] = "";
    alloy_status st = alloy_safetensors_load(path, &r->files[i], err, sizeof err);
    if (st) return alloyc_fail(EXIT_ERROR, "%s", err[0] ? err : alloy_status_name(st));
    const alloy_safetensors *file = r->files[i];
    if (eq) {
        const alloy_host_tensor *t = alloy_safetensors_find(file, name);
        if (!t) return alloyc_fail(EXIT_ERROR, "%s: no tensor named '%s' to feed", path, name);
        return add_feed(r, t, path);
    }
    int matched = 0;
    for (int k = 0; k < alloy_safetensors_count(file); k++) {
        const alloy_host_tensor *t = alloy_safetensors_get(file, k);
        if (!names_has(&r->inputs, t->name)) continue;
        int rc = add_feed(r, t, path);
        if (rc) return rc;
        matched++;
    }
    if (!matched) {
        char list[512] = "";
        for (int k = 0; k < r->inputs.n; k++) {
            size_t used = strlen(list);
            snprintf(list + used, sizeof list - used, "%s'%s'", k ? ", " : "", r->inputs.at[k]);
        }
        return alloyc_fail(EXIT_ERROR, "%s: no tensor in it is named like an input of %s (inputs: %s)", path,
                    r->ir_path, r->inputs.n ? list : "none");
    }
    return 0;
}

/* Turns the backward on when a --fetch names a gradient (grad:NAME; for an
 * input NAME, asks for its gradient too), from --loss or the IR's loss;
 * an exit code. */
static int setup_grads(alloy_graph *g, const options *o)
{
    const char *first = NULL;
    for (int i = 0; i < o->nfetches; i++) {
        if (strncmp(o->fetches[i], "grad:", 5) != 0) continue;
        if (!first) first = o->fetches[i];
        alloy_tensor *t = alloy_graph_find(g, o->fetches[i] + 5);
        alloy_host_tensor in;
        for (int k = 0; t && k < alloy_graph_input_count(g); k++) {
            if (alloy_graph_input_at(g, k, &in) || strcmp(in.name, o->fetches[i] + 5) != 0) continue;
            alloy_status st = alloy_graph_request_grad(g, t);
            if (st) return alloyc_fail(EXIT_ERROR, "--fetch %s: %s", o->fetches[i], alloyc_graph_error(g, st));
        }
    }
    if (o->loss && alloyc_set_loss(g, o)) return EXIT_ERROR;
    if (!first) {
        if (o->loss) alloy_graph_set_training(g, false); /* set_loss turned it on; off always succeeds */
        return 0;
    }
    if (alloy_graph_set_training(g, true))
        return alloyc_fail(EXIT_ERROR, "--fetch %s needs a loss to differentiate: %s has no 'loss' line; name the loss "
                                "node with --loss NAME", first, o->ir_path);
    return 0;
}

static int cmd_run(const options *o)
{
    run_ctx r = {.ir_path = o->ir_path};
    int rc = 0, nfiles = 0;
    char err[1024] = "";
    r.g = alloyc_load_graph(o->ir_path);
    if (!r.g) {
        rc = EXIT_ERROR;
        goto done;
    }
    if (!list_names(r.g, &r.outputs, &r.inputs)) {
        rc = alloyc_fail(EXIT_ERROR, "out of memory");
        goto done;
    }
    if (o->amp != ALLOY_F32 && alloy_graph_enable_amp(r.g, o->amp)) {
        rc = alloyc_fail(EXIT_ERROR, "%s", alloyc_graph_error(r.g, ALLOY_ERR_INVALID));
        goto done;
    }
    if ((rc = setup_grads(r.g, o))) goto done;
    /* run is the CPU reference run, whatever device the environment picks */
    alloy_status set = alloy_graph_set_option(r.g, "device", "cpu");
    if (!set) set = alloyc_apply_sets(r.g, o);
    if (set) {
        rc = alloyc_fail(EXIT_ERROR, "%s", alloyc_graph_error(r.g, set));
        goto done;
    }
    if (o->have_seed) alloy_graph_set_seed(r.g, o->seed);
    if (o->params && (rc = alloyc_load_params(r.g, o->params, o->ir_path, NULL))) goto done;
    r.files = calloc((size_t)o->nfeeds + 1, sizeof *r.files);
    if (!r.files) {
        rc = alloyc_fail(EXIT_ERROR, "out of memory");
        goto done;
    }
    for (; nfiles < o->nfeeds; nfiles++) {
        if ((rc = load_feed(&r, o->feeds[nfiles], nfiles))) {
            nfiles++;
            goto done;
        }
    }
    const char *const *fetch_names = o->fetches;
    int nfetch = o->nfetches;
    if (!nfetch) {
        fetch_names = (const char *const *)r.outputs.at;
        nfetch = r.outputs.n;
    }
    if (!nfetch) {
        rc = alloyc_fail(EXIT_ERROR, "%s declares no output; name what to write with --fetch", o->ir_path);
        goto done;
    }
    r.fetches = calloc((size_t)nfetch, sizeof *r.fetches);
    if (!r.fetches) {
        rc = alloyc_fail(EXIT_ERROR, "out of memory");
        goto done;
    }
    for (int i = 0; i < nfetch; i++) r.fetches[i].name = fetch_names[i];
    alloy_status st = alloy_graph_run(r.g, r.feeds, r.nfeeds, r.fetches, nfetch);
    if (st) {
        rc = alloyc_fail(EXIT_ERROR, "%s", alloyc_graph_error(r.g, st));
        goto done;
    }
    static const char *const keys[] = {"producer", "graph_file"};
    const char *values[] = {"alloyc", o->ir_path};
    st = alloy_safetensors_save(o->out, r.fetches, nfetch, keys, values, 2, err, sizeof err);
    if (st) {
        rc = alloyc_fail(EXIT_ERROR, "%s", err[0] ? err : alloy_status_name(st));
        goto done;
    }
    printf("wrote %s:", o->out);
    for (int i = 0; i < nfetch; i++) {
        const alloy_host_tensor *t = &r.fetches[i];
        printf("%s %s %s[", i ? "," : "", t->name, alloy_dtype_name(t->dtype));
        for (int d = 0; d < t->rank; d++) printf("%s%lld", d ? "," : "", (long long)t->dims[d]);
        printf("]");
    }
    printf("\n");
    if (fflush(stdout) || ferror(stdout)) rc = alloyc_fail(EXIT_ERROR, "writing to stdout failed");
done:
    run_free(&r, nfiles);
    return rc;
}

/* Prints dir/summary.txt and a line naming dir; an exit code. */
static int print_summary(const char *dir)
{
    size_t n = strlen(dir) + sizeof "/summary.txt";
    char *path = malloc(n);
    if (!path) return alloyc_fail(EXIT_ERROR, "out of memory");
    snprintf(path, n, "%s/summary.txt", dir);
    size_t len;
    uint8_t *text;
    char err[1024];
    alloy_status st = al_file_read(path, 0, &text, &len, err, sizeof err);
    free(path);
    if (st) return alloyc_fail(EXIT_ERROR, "%s", err);
    fwrite(text, 1, len, stdout);
    al_free(text);
    printf("wrote %s\n", dir);
    if (fflush(stdout) || ferror(stdout)) return alloyc_fail(EXIT_ERROR, "writing to stdout failed");
    return 0;
}

static int cmd_compile(const options *o)
{
    alloy_graph *g = alloyc_load_graph(o->ir_path);
    if (!g) return EXIT_ERROR;
    if (o->loss && alloyc_set_loss(g, o)) {
        alloy_graph_free(g);
        return EXIT_ERROR;
    }
    alloy_status st = alloyc_configure(g, o);
    if (o->bundle) {
        if (o->have_seed) alloy_graph_set_seed(g, o->seed);
        if (!st) st = alloy_graph_save_bundle_flags(g, o->out, o->arch, o->with_state ? ALLOY_BUNDLE_WITH_STATE : 0);
        int rc = st ? alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(g, st)) : 0;
        if (!st) printf("wrote %s\n", o->out);
        alloy_graph_free(g);
        return rc;
    }
    if (!st) st = alloy_graph_export_cuda(g, o->arch, o->out);
    int rc = st ? alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(g, st)) : print_summary(o->out);
    alloy_graph_free(g);
    return rc;
}

/* Parses the command line and runs the command; the exit status says how it went. */
int main(int argc, char **argv)
{
    options o = {0};
    bool done;
    int rc = parse_args(argc, argv, &o, &done);
    if (!done)
        rc = strcmp(o.command, "print") == 0 ? cmd_print(&o)
             : strcmp(o.command, "run") == 0 ? cmd_run(&o)
             : strcmp(o.command, "train") == 0 ? alloyc_train(&o)
             : strcmp(o.command, "cost") == 0  ? alloyc_cost(&o)
             : strcmp(o.command, "amp-report") == 0 ? alloyc_amp_report(&o)
                                               : cmd_compile(&o);
    free(o.feeds);
    free(o.fetches);
    free(o.sets);
    return rc;
}
