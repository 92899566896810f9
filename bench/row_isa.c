/* row_isa.c - benchmark: ns per element of the CPU row kernels alone (softmax, layer_norm, cross_entropy and their gradients, f32) for each x86-64 level, one thread.
 *
 *   row_isa [ROWS [N [OP ...]]]   ROWS rows of N (default 4096 x 256, as
 *                                 bench/ew_torch.py --rows), the ops named (default all)
 *
 * Calls cpu_row_run (runtime/cpu/cpu_rows.c with the row functions of
 * cpu_row_programs.c and cpu_row_by_hand.c, compiled once per level by
 * row_isa_level.h) on one op node over tensors already in place: no graph
 * run, no feeds or fetches copied, so the figure is the kernel's, to set
 * beside bench/ew_torch.py --rows (ATen's kernels called with out=). Ops:
 * softmax (x), softmax_causal (x with -inf above row r's diagonal, column
 * j > r mod N: an attention's masked scores, every column computed),
 * softmax_causal_live (the same rows as a causal softmax's, [ROWS / N, N, N]:
 * only columns j <= r mod N read, zeros stored past them), softmax_grad (y, dy),
 * softmax_grad_causal (y the causal softmax of those scores, dy; every
 * column) and softmax_grad_causal_live (the same as a causal softmax's
 * gradient: columns j <= r mod N),
 * layer_norm (x, gamma, beta), layer_norm_mean and layer_norm_rstd (x: the
 * statistics a training step's row group computes beside layer_norm, one
 * value per row; ns per element of x),
 * layer_norm_grad_stats (x, dy, mean, rstd, gamma: dx only, as autodiff
 * emits it), cross_entropy (x, targets: each row's loss, the mean over rows
 * not timed), cross_entropy_grad (x, targets, dloss 1: dx of the mean loss);
 * targets (r * 31) mod N, i64. x = ((i * 7919) mod 65536) / 65536 * 8 - 4, dy = 1 - i mod 3,
 * gamma = beta = 1 + 0.01 j, as ew_torch.py. Best of 15 rounds of >= 2M
 * elements, thread CPU time; the last column says whether every level this
 * CPU runs gave the same bits (NaN signs aside). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

#include "alloy/alloy.h"
#include "runtime/cpu/cpu.h"
#include "runtime/graph/graph_impl.h"

typedef alloy_status (*row_run_fn)(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in,
                                   int64_t total_rows, void *results, bool causal);
alloy_status row_isa_run_0(cpu_exec *, const ir_node *, rt_tensor *, const rt_tensor *, int64_t, void *, bool);
alloy_status row_isa_run_1(cpu_exec *, const ir_node *, rt_tensor *, const rt_tensor *, int64_t, void *, bool);
alloy_status row_isa_run_2(cpu_exec *, const ir_node *, rt_tensor *, const rt_tensor *, int64_t, void *, bool);

enum { LEVELS = 3 };
static const char *const level_names[LEVELS] = {"x86-64-v4 (AVX-512)", "x86-64-v3 (AVX2)", "baseline (SSE2)"};
static const row_run_fn level_fns[LEVELS] = {row_isa_run_0, row_isa_run_1, row_isa_run_2};

static bool level_runs(int l)
{
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    return l == 2 || (l == 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ||
           (l == 0 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"));
#else
    return false;
#endif
}

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static bool same_floats(const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!(isnan(a[i]) && isnan(b[i])) && memcmp(&a[i], &b[i], sizeof(float))) return false;
    return true;
}

/* A buffer at a 64-byte boundary, as the CPU backend's plan places every
 * value (PLAN_ALIGN) and as ATen allocates: malloc's large blocks start 16
 * bytes past one, which splits every 64-byte access across two cache lines
 * and timed the AVX-512 kernels slower than they run in the library. */
static void *buffer(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

int main(int argc, char **argv)
{
    int64_t rows = argc > 1 ? atoll(argv[1]) : 4096, n = argc > 2 ? atoll(argv[2]) : 256;
    if (rows <= 0 || n <= 0) return fprintf(stderr, "usage: row_isa [ROWS [N [OP ...]]]\n"), 2;
    int64_t total = rows * n;
    float *x = buffer(sizeof(float) * (size_t)total), *dy = buffer(sizeof(float) * (size_t)total);
    float *sm = buffer(sizeof(float) * (size_t)total), *y = buffer(sizeof(float) * (size_t)total);
    float *y0 = buffer(sizeof(float) * (size_t)total), *gamma = buffer(sizeof(float) * (size_t)n);
    float *xm = buffer(sizeof(float) * (size_t)total), *smm = buffer(sizeof(float) * (size_t)total);
    float *mean = buffer(sizeof(float) * (size_t)rows), *rstd = buffer(sizeof(float) * (size_t)rows);
    float *res = buffer(sizeof(float) * (size_t)(2 * rows)), *res0 = buffer(sizeof(float) * (size_t)(2 * rows));
    int64_t *targets = buffer(sizeof(int64_t) * (size_t)rows);
    float dloss = 1;
    if (!x || !dy || !sm || !y || !y0 || !gamma || !mean || !rstd || !xm || !smm || !res || !res0 || !targets)
        return fprintf(stderr, "row_isa: out of memory\n"), 1;
    for (int64_t r = 0; r < rows; r++) targets[r] = r * 31 % n;
    for (int64_t i = 0; i < total; i++) {
        x[i] = (float)((double)((i * 7919) % 65536) / 65536 * 8 - 4);
        dy[i] = (float)(1 - i % 3);
        xm[i] = i % n > (i / n) % n ? -INFINITY : x[i];
    }
    for (int64_t j = 0; j < n; j++) gamma[j] = 1.0f + 0.01f * (float)j;
    for (int64_t r = 0; r < rows; r++) { /* the statistics layer_norm_grad_stats reads, in f64 */
        double s = 0, v = 0;
        for (int64_t j = 0; j < n; j++) s += x[r * n + j];
        s /= (double)n;
        for (int64_t j = 0; j < n; j++) v += (x[r * n + j] - s) * (x[r * n + j] - s);
        mean[r] = (float)s, rstd[r] = (float)(1 / sqrt(v / (double)n + 1e-5));
    }
    for (int64_t r = 0; r < rows; r++) { /* softmax_grad's y: a softmax of x */
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < n; j++) m = fmax(m, x[r * n + j]);
        for (int64_t j = 0; j < n; j++) s += exp(x[r * n + j] - m);
        for (int64_t j = 0; j < n; j++) sm[r * n + j] = (float)(exp(x[r * n + j] - m) / s);
        m = -INFINITY, s = 0; /* and of the masked scores */
        for (int64_t j = 0; j < n; j++) m = fmax(m, xm[r * n + j]);
        for (int64_t j = 0; j < n; j++) s += exp(xm[r * n + j] - m);
        for (int64_t j = 0; j < n; j++) smm[r * n + j] = (float)(exp(xm[r * n + j] - m) / s);
    }

    /* one node per op in a graph of its own; its operands are the arrays above */
    ir_graph *g = ir_graph_new("row_isa");
    if (!g) return fprintf(stderr, "row_isa: out of memory\n"), 1;
    ir_type rt = {.dtype = ALLOY_F32, .rank = 2, .dims = {rows, n}}, vt = {.dtype = ALLOY_F32, .rank = 1, .dims = {n}};
    ir_type st = {.dtype = ALLOY_F32, .rank = 2, .dims = {rows, 1}};
    /* the causal rows as [ROWS / N, N, N] (rows a multiple of N) */
    ir_type ct = {.dtype = ALLOY_F32, .rank = 3, .dims = {rows / n, n, n}};
    bool whole = rows % n == 0;
    ir_attr eps = ir_a_float("eps", 1e-5), axis = ir_a_int("axis", 1);
    int ix = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &rt, "x")->id;
    int idy = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &rt, "dy")->id;
    int igm = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &vt, "gamma")->id;
    int imean = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &st, "mean")->id;
    int irstd = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &st, "rstd")->id;
    ir_attr axis3 = ir_a_int("axis", 2);
    int icx = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, whole ? &ct : &rt, "xc")->id;
    int icdy = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, whole ? &ct : &rt, "dyc")->id;
    ir_type tt = {.dtype = ALLOY_I64, .rank = 1, .dims = {rows}}, sc = {.dtype = ALLOY_F32, .rank = 0};
    int itg = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &tt, "targets")->id;
    int idl = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &sc, "dloss")->id;
    const struct {
        const char *name;
        ir_node *node;
        const void *in[5];
        bool causal;
    } ops[] = {
        {"softmax", ir_add_node(g, IR_OP_softmax, 1, (int[]){ix}, 1, &axis, NULL, "sm"), {x}, false},
        {"softmax_causal", ir_add_node(g, IR_OP_softmax, 1, (int[]){ix}, 1, &axis, NULL, "smc"), {xm}, false},
        {"softmax_causal_live", ir_add_node(g, IR_OP_softmax, 1, (int[]){icx}, 1, &axis3, NULL, "smcl"), {xm}, whole},
        {"softmax_grad", ir_add_node(g, IR_OP_softmax_grad, 2, (int[]){ix, idy}, 1, &axis, NULL, "smg"), {sm, dy}, false},
        {"softmax_grad_causal", ir_add_node(g, IR_OP_softmax_grad, 2, (int[]){ix, idy}, 1, &axis, NULL, "smgc"),
         {smm, dy}, false},
        {"softmax_grad_causal_live", ir_add_node(g, IR_OP_softmax_grad, 2, (int[]){icx, icdy}, 1, &axis3, NULL, "smgcl"),
         {smm, dy}, whole},
        {"layer_norm", ir_add_node(g, IR_OP_layer_norm, 3, (int[]){ix, igm, igm}, 1, &eps, NULL, "ln"), {x, gamma, gamma}, false},
        {"layer_norm_mean", ir_add_node(g, IR_OP_layer_norm_mean, 1, (int[]){ix}, 0, NULL, NULL, "lnm"), {x}, false},
        {"layer_norm_rstd", ir_add_node(g, IR_OP_layer_norm_rstd, 1, (int[]){ix}, 1, &eps, NULL, "lnr"), {x}, false},
        {"layer_norm_grad", ir_add_node(g, IR_OP_layer_norm_grad_stats, 5, (int[]){ix, idy, imean, irstd, igm}, 0, NULL,
                                        NULL, "lng"),
         {x, dy, mean, rstd, gamma}, false},
        {"cross_entropy", ir_add_node(g, IR_OP_cross_entropy, 2, (int[]){ix, itg}, 0, NULL, NULL, "ce"), {x, targets}, false},
        {"cross_entropy_grad", ir_add_node(g, IR_OP_cross_entropy_grad, 3, (int[]){ix, itg, idl}, 0, NULL, NULL, "ceg"),
         {x, targets, &dloss}, false},
    };
    printf("f32, %lld rows of %lld, one thread, the kernel alone (cpu_row_run), best thread CPU time, ns per element\n%-16s",
           (long long)rows, (long long)n, "op");
    for (int l = 0; l < LEVELS; l++) printf(" %20s", level_names[l]);
    printf(" same bits\n");
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        bool asked = argc <= 3;
        for (int a = 3; a < argc; a++) asked = asked || !strcmp(argv[a], ops[o].name);
        if (!asked) continue;
        const ir_node *node = ops[o].node;
        if (!node) return fprintf(stderr, "row_isa: %s: %s\n", ops[o].name, g->error), 1;
        rt_tensor in[5], out = {node->type, y};
        /* a per-row loss: each row's value and weight into res, as cpu_row gives them to its mean */
        bool per_row = ir_row_summarize(ir_ops[node->op].row).per_row_result;
        float *got = per_row ? res : y, *want = per_row ? res0 : y0;
        int64_t compared = per_row ? 2 * rows : total;
        for (int j = 0; j < node->nin; j++) in[j] = (rt_tensor){g->nodes[node->in[j]]->type, (void *)ops[o].in[j]};
        printf("%-16s", ops[o].name);
        bool first = true, same = true;
        for (int l = 0; l < LEVELS; l++) {
            if (!level_runs(l)) {
                printf(" %20s", "-");
                continue;
            }
            cpu_exec ex = {.nthreads = 1};
            int64_t reps = (2 << 20) / total + 1;
            double best = 1e30;
            for (int r = 0; r < 16; r++) {
                double t0 = thread_cpu();
                for (int64_t i = 0; i < reps; i++) level_fns[l](&ex, node, &out, in, rows, per_row ? res : NULL, ops[o].causal);
                double t = thread_cpu() - t0;
                if (r > 0 && t < best) best = t; /* the first round warms up */
            }
            if (ex.status) return fprintf(stderr, "row_isa: %s: %s\n", ops[o].name, ex.error), 1;
            printf(" %20.3f", best * 1e9 / (double)(reps * total));
            if (!first) same = same && same_floats(got, want, compared);
            else memcpy(want, got, sizeof(float) * (size_t)compared);
            first = false;
        }
        printf(" %s\n", same ? "yes" : "NO");
        fflush(stdout);
    }
    ir_graph_free(g);
    free(x), free(dy), free(sm), free(y), free(y0), free(gamma), free(mean), free(rstd), free(xm), free(smm), free(res),
        free(res0), free(targets);
    return 0;
}
