/* ew_isa.c - benchmark: ns per element of the CPU backend's f32 elementwise expressions (ops.def, vmath.h) compiled for each x86-64 level, in cache, one thread, next to no other work.
 *
 *   ew_isa [N] [OP ...]   N elements (default 16384: in L1/L2), the ops to
 *                         time (default gelu, gelu_grad, gelu_tanh,
 *                         gelu_tanh_grad, erf, exp, tanh, sigmoid)
 *
 * Each ops.def expression becomes the loop cpu_fused_kernels.c runs for it (blocks
 * of 16, no contraction, no trapping math: the #pragma below, as there)
 * three times over: for x86-64-v4 (AVX-512), v3 (AVX2 + FMA) and the
 * baseline (SSE2), the three clones the library picks from at load time. Levels this CPU lacks print "-". The rows are the
 * kernels alone; bench/ew_cpu times the ops through a whole graph run
 * (copies in and out of the arena included). a runs over [-4, 4), b and c
 * are 1 (a gradient's dy). The last column says whether every level this
 * CPU runs gave the same bits for every element (they must: no contraction,
 * and vmath.h is exact arithmetic on any of them). */
/* as cpu_fused_kernels.c and cpu_elementwise.c compile their chunk functions */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tgmath.h>
#include <time.h>

#include "base/vmath_generic.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define LEVELS 3
#define TARGET_0 __attribute__((target("arch=x86-64-v4"), noinline))
#define TARGET_1 __attribute__((target("arch=x86-64-v3"), noinline))
#define TARGET_2 __attribute__((noinline))
static const char *const level_names[LEVELS] = {"x86-64-v4 (AVX-512)", "x86-64-v3 (AVX2)", "baseline (SSE2)"};
static bool level_runs(int l)
{
    __builtin_cpu_init();
    return l == 2 || (l == 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ||
           (l == 0 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"));
}
#else
#define LEVELS 1
#define TARGET_0 __attribute__((noinline))
static const char *const level_names[LEVELS] = {"this build's"};
static bool level_runs(int l) { return l == 0; }
#endif

typedef void (*ew_fn)(int64_t n, float *restrict y, const float *restrict pa, const float *restrict pb,
                      const float *restrict pc, const double *p);

#define BODY(nm, expr, L)                                                                                       \
    TARGET_##L static void nm##_##L(int64_t n, float *restrict y, const float *restrict pa,                    \
                                    const float *restrict pb, const float *restrict pc, const double *p)       \
    {                                                                                                           \
        typedef float T;                                                                                        \
        (void)p;                                                                                                \
        int64_t i = 0;                                                                                          \
        for (; i + 16 <= n; i += 16)                                                                            \
            for (int j = 0; j < 16; j++) {                                                                      \
                T a = pa[i + j], b = pb[i + j], c = pc[i + j];                                                  \
                (void)a, (void)b, (void)c;                                                                      \
                y[i + j] = (T)(expr);                                                                           \
            }                                                                                                   \
        for (; i < n; i++) {                                                                                    \
            T a = pa[i], b = pb[i], c = pc[i];                                                                  \
            (void)a, (void)b, (void)c;                                                                          \
            y[i] = (T)(expr);                                                                                   \
        }                                                                                                       \
    }
#define OP(...)
#define P(k) ((T)p[k])
#if LEVELS == 3
#define EW(nm, nin, at, ty, amp, grad, expr) BODY(nm, expr, 0) BODY(nm, expr, 1) BODY(nm, expr, 2)
#else
#define EW(nm, nin, at, ty, amp, grad, expr) BODY(nm, expr, 0)
#endif
#include "ir/ops.def"
#undef EW
#undef OP

static const struct {
    const char *name;
    ew_fn fn[LEVELS];
} kernels[] = {
#define OP(...)
#if LEVELS == 3
#define EW(nm, nin, at, ty, amp, grad, expr) {#nm, {nm##_0, nm##_1, nm##_2}},
#else
#define EW(nm, nin, at, ty, amp, grad, expr) {#nm, {nm##_0}},
#endif
#include "ir/ops.def"
#undef EW
#undef OP
};

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Best of 15 rounds of ~2M elements each, thread CPU ns per element. */
static double time_kernel(ew_fn f, int64_t n, float *y, const float *a, const float *b)
{
    double p[4] = {0};
    int64_t reps = (2 << 20) / n + 1;
    double best = 1e30;
    for (int r = 0; r < 16; r++) {
        double t0 = thread_cpu();
        for (int64_t i = 0; i < reps; i++) f(n, y, a, b, b, p);
        double t = thread_cpu() - t0;
        if (r > 0 && t < best) best = t; /* the first round warms up */
    }
    return best * 1e9 / (double)(reps * n);
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 16384;
    if (n <= 0) return fprintf(stderr, "usage: ew_isa [N] [OP ...]\n"), 2;
    static const char *const defaults[] = {"gelu", "gelu_grad", "gelu_tanh", "gelu_tanh_grad",
                                           "erf", "exp", "tanh", "sigmoid"};
    const char *const *ops = argc > 2 ? (const char *const *)argv + 2 : defaults;
    int nops = argc > 2 ? argc - 2 : (int)(sizeof defaults / sizeof defaults[0]);
    /* 64-byte aligned, as the plan places values (and bench/row_isa's buffers) */
    size_t bytes = (sizeof(float) * (size_t)n + 63) / 64 * 64;
    float *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes), *y = aligned_alloc(64, bytes),
          *y0 = aligned_alloc(64, bytes);
    if (!a || !b || !y || !y0) return fprintf(stderr, "ew_isa: out of memory\n"), 1;
    for (int64_t i = 0; i < n; i++) a[i] = -4.0f + 8.0f * (float)((double)i / (double)n), b[i] = 1.0f;
    printf("f32, %lld elements, one thread, best thread CPU time, ns per element\n%-16s", (long long)n, "op");
    for (int l = 0; l < LEVELS; l++) printf(" %20s", level_names[l]);
    printf(" %s\n", "same bits");
    for (int o = 0; o < nops; o++) {
        size_t k = 0;
        while (k < sizeof kernels / sizeof kernels[0] && strcmp(kernels[k].name, ops[o])) k++;
        if (k == sizeof kernels / sizeof kernels[0]) return fprintf(stderr, "ew_isa: no elementwise op '%s'\n", ops[o]), 2;
        printf("%-16s", ops[o]);
        bool first = true, same = true;
        for (int l = 0; l < LEVELS; l++) {
            if (!level_runs(l)) {
                printf(" %20s", "-");
                continue;
            }
            printf(" %20.3f", time_kernel(kernels[k].fn[l], n, y, a, b));
            if (!first) same = same && memcmp(y, y0, sizeof(float) * (size_t)n) == 0;
            else memcpy(y0, y, sizeof(float) * (size_t)n);
            first = false;
        }
        printf(" %s\n", same ? "yes" : "NO");
        fflush(stdout);
    }
    free(a), free(b), free(y), free(y0);
    return 0;
}
