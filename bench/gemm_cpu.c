/* gemm_cpu.c - benchmark: the portable f32 GEMM kernel against the BLAS, and the f16/bf16 GEMM against the old convert-then-sgemm path and the vdpbf16ps peak, GFLOP/s per shape, with the threads that ran. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/convert.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_lowp.h"
#include "proc_threads.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

typedef void (*gemm_fn)(bool, bool, int64_t, int64_t, int64_t, float, const float *, int64_t,
                        const float *, int64_t, float, float *, int64_t);

typedef struct shape {
    int64_t m, n, k;
    bool ta, tb;
    const char *what;
} shape;

/* Square sizes, then the products of a small transformer layer (2048 tokens,
 * d_model 512, 4x FFN) as a training step runs them. */
static const shape shapes[] = {
    {256, 256, 256, false, false, "square"},
    {512, 512, 512, false, false, "square"},
    {1024, 1024, 1024, false, false, "square"},
    {2048, 128, 512, false, false, "x * W_head"},
    {2048, 512, 512, false, true, "x * W^T (out proj)"},
    {2048, 1536, 512, false, false, "x * W_qkv"},
    {2048, 2048, 512, false, false, "FFN up"},
    {2048, 512, 2048, false, false, "FFN down"},
    {512, 512, 2048, true, false, "dW = x^T * dy"},
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Best seconds of at least 5 runs and ~1 s, after one warm-up run: the best
 * run is the one least disturbed by whatever else the machine is doing. */
static double best_time(gemm_fn f, const shape *s, const float *a, const float *b, float *c)
{
    int64_t lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
    f(s->ta, s->tb, s->m, s->n, s->k, 1.0f, a, lda, b, ldb, 0.0f, c, s->n);
    double best = INFINITY, start = now();
    for (int rep = 0; rep < 5 || (now() - start < 1.0 && rep < 200); rep++) {
        double t0 = now();
        f(s->ta, s->tb, s->m, s->n, s->k, 1.0f, a, lda, b, ldb, 0.0f, c, s->n);
        double t = now() - t0;
        if (t < best) best = t;
    }
    return best;
}

/* ---- f16/bf16 ---- */

static double process_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One batched low-precision product and the two ways to run it. */
typedef struct lowp_case {
    int64_t batch, m, n, k;
    bool ta, tb;
    const char *what;
} lowp_case;

/* Large squares, then char_gpt's products (2048 tokens, dim 128, MLP 512,
 * 4 heads of 32 over a context of 64) as its training step runs them. */
static const lowp_case lowp_cases[] = {
    {1, 1024, 1024, 1024, false, false, "square"},
    {1, 2048, 2048, 2048, false, false, "square"},
    {1, 2048, 512, 128, false, false, "char_gpt fc"},
    {1, 2048, 128, 512, false, false, "char_gpt mlp proj"},
    {1, 2048, 384, 128, false, false, "char_gpt qkv"},
    {1, 2048, 512, 128, false, true, "char_gpt dX fc"},
    {1, 512, 128, 2048, true, false, "char_gpt dW proj"},
    {128, 64, 64, 32, false, true, "char_gpt q k^T"},
    {128, 64, 32, 64, false, false, "char_gpt p v"},
};

/* The path every f16/bf16 matmul took before gemm_lowp: three f32 copies
 * allocated, both operands converted on one thread, sgemm per batch. */
static void old_lowp(const gemm_lowp_args *g, int64_t batch)
{
    size_t na = (size_t)(batch * g->m * g->k), nb = (size_t)(batch * g->k * g->n), nc = (size_t)(batch * g->m * g->n);
    float *a = al_malloc(na * sizeof *a), *b = al_malloc(nb * sizeof *b), *c = al_malloc(nc * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    cvt_load_f32(g->dtype, g->a, a, na);
    cvt_load_f32(g->dtype, g->b, b, nb);
    for (int64_t i = 0; i < batch; i++)
        gemm_f32(g->ta, g->tb, g->m, g->n, g->k, 1.0f, a + i * g->m * g->k, g->lda, b + i * g->k * g->n, g->ldb,
                 0.0f, c + i * g->m * g->n, g->n);
    cvt_store_f32(g->out_dtype, c, g->c, nc);
    al_free(a), al_free(b), al_free(c);
}

/* Best thread CPU seconds of >= `reps` runs (and ~0.5 s), after a warm-up:
 * CPU time, so other processes on the machine do not count, and the best
 * run, least disturbed by them. kernel OPT_LOWP_COUNT: the old path. */
static double best_lowp(const gemm_lowp_args *g, int64_t batch, opt_lowp_gemm kernel, int reps)
{
    double best = INFINITY, start = thread_cpu();
    for (int rep = -1; rep < reps || (thread_cpu() - start < 0.5 && rep < 100); rep++) {
        double t0 = thread_cpu();
        if (kernel == OPT_LOWP_COUNT) old_lowp(g, batch);
        else if (gemm_lowp(g, kernel, NULL, 1)) {
            fprintf(stderr, "gemm_lowp: out of memory\n");
            exit(1);
        }
        double t = thread_cpu() - t0;
        if (rep >= 0 && t < best) best = t;
    }
    return best;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* vdpbf16ps's throughput on this core, GFLOP/s: 24 independent chains
 * (more than latency x ports on any AVX512_BF16 core), 64 flops each. */
#define DP_CHAIN(i) c##i = _mm512_dpbf16_ps(c##i, x, y); __asm__ volatile("" : "+v"(c##i));
#define DP_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) \
    X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
#define DP_ZERO(i) __m512 c##i = _mm512_setzero_ps();
#define DP_SUM(i) s = _mm512_add_ps(s, c##i);
__attribute__((target("avx512f,avx512bf16"))) static double dpbf16_peak(void)
{
    DP_CHAINS(DP_ZERO)
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x00010001);
    const long iters = 20000000;
    double t0 = thread_cpu();
    for (long it = 0; it < iters; it++) {
        DP_CHAINS(DP_CHAIN)
    }
    double t = thread_cpu() - t0;
    __m512 s = _mm512_setzero_ps();
    DP_CHAINS(DP_SUM)
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return 24.0 * 64.0 * (double)iters / t * 1e-9;
}
#endif

static bool use_blas = true; /* ALLOY_BLAS */

/* The f16/bf16 table, on one thread: thread CPU time counts only the
 * calling thread, so the old path's f32 GEMM must not start others. */
static void lowp_table(void)
{
    gemm_configure(use_blas, 1);
    double peak = 0.0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (gemm_lowp_x86_has(OPT_LOWP_AVX512_BF16, ALLOY_BF16))
        for (int i = 0; i < 3; i++) peak = fmax(peak, dpbf16_peak());
#endif
    opt_lowp_gemm kb = gemm_lowp_kernel(ALLOY_BF16, OPT_LOWP_AUTO), kh = gemm_lowp_kernel(ALLOY_F16, OPT_LOWP_AUTO);
    printf("\nf16/bf16 GEMM, f32 result, 1 thread, best thread CPU time of >= 5 runs; kernels: bf16 %s, f16 %s;\n"
           "old: three f32 copies, operands converted on one thread, f32 GEMM (%s)\n",
           gemm_lowp_kernel_name(kb), gemm_lowp_kernel_name(kh), gemm_backend_name());
    if (peak > 0.0) printf("vdpbf16ps peak of this core, measured: %.1f GFLOP/s\n", peak);
    printf("\n%-24s %-18s %9s %7s %9s %7s %9s %9s %9s\n", "batch x M x N x K (op)", "", "bf16", "% peak", "bf16 old",
           "new/old", "f16", "f16 old", "rel diff");
    for (size_t i = 0; i < sizeof lowp_cases / sizeof lowp_cases[0]; i++) {
        const lowp_case *lc = &lowp_cases[i];
        int64_t na = lc->batch * lc->m * lc->k, nb = lc->batch * lc->k * lc->n, nc = lc->batch * lc->m * lc->n;
        uint16_t *a = al_malloc((size_t)na * 2), *b = al_malloc((size_t)nb * 2);
        float *c1 = al_malloc((size_t)nc * 4), *c2 = al_malloc((size_t)nc * 4);
        if (!a || !b || !c1 || !c2) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        int64_t sa[1] = {lc->m * lc->k}, sb[1] = {lc->k * lc->n}, dims[1] = {lc->batch};
        gemm_lowp_args g = {ALLOY_BF16, ALLOY_F32, lc->ta, lc->tb, lc->m, lc->n, lc->k,
                            lc->ta ? lc->m : lc->k, lc->tb ? lc->k : lc->n, lc->batch > 1 ? 1 : 0,
                            dims, sa, sb, a, b, c1, NULL, 0};
        double flops = 2.0 * (double)nc * (double)lc->k, gf[4];
        double diff = 0.0, mag = 0.0;
        for (int d = 0; d < 2; d++) {
            g.dtype = d ? ALLOY_F16 : ALLOY_BF16;
            srand(1);
            for (int64_t j = 0; j < na; j++)
                a[j] = d ? cvt_f32_to_f16((float)rand() / (float)RAND_MAX - 0.5f)
                         : cvt_f32_to_bf16((float)rand() / (float)RAND_MAX - 0.5f);
            for (int64_t j = 0; j < nb; j++)
                b[j] = d ? cvt_f32_to_f16((float)rand() / (float)RAND_MAX - 0.5f)
                         : cvt_f32_to_bf16((float)rand() / (float)RAND_MAX - 0.5f);
            g.c = c1;
            gf[2 * d] = flops / best_lowp(&g, lc->batch, OPT_LOWP_AUTO, 5) * 1e-9;
            g.c = c2;
            gf[2 * d + 1] = flops / best_lowp(&g, lc->batch, OPT_LOWP_COUNT, 5) * 1e-9;
            for (int64_t j = 0; j < nc; j++) {
                diff = fmax(diff, fabs((double)c1[j] - (double)c2[j]));
                mag = fmax(mag, fabs((double)c2[j]));
            }
        }
        char dimtext[48], pct[16] = "-";
        snprintf(dimtext, sizeof dimtext, "%dx%dx%dx%d (%c%c)", (int)lc->batch, (int)lc->m, (int)lc->n, (int)lc->k,
                 lc->ta ? 'T' : 'N', lc->tb ? 'T' : 'N');
        if (peak > 0.0) snprintf(pct, sizeof pct, "%.1f", 100.0 * gf[0] / peak);
        printf("%-24s %-18s %9.1f %7s %9.1f %7.2f %9.1f %9.1f %9.1e\n", dimtext, lc->what, gf[0], pct, gf[1],
               gf[0] / gf[1], gf[2], gf[3], mag > 0 ? diff / mag : diff);
        fflush(stdout);
        al_free(a), al_free(b), al_free(c1), al_free(c2);
    }
}

/* The threads of this process that ran between *before and now (>= 1% of
 * the CPU time since cpu0), printed after a table; *before is renewed. */
static void report_threads(proc_threads *before, double *cpu0, int asked)
{
    proc_threads now;
    proc_threads_take(&now);
    double cpu = process_cpu() - *cpu0;
    int ran = proc_threads_ran(before, &now, (long long)(cpu * 1e7));
    printf("threads that ran during the table: %d (%d asked)%s\n", ran, asked,
           ran > asked ? ": MORE THAN ASKED" : "");
    *before = now;
    *cpu0 = process_cpu();
}

int main(int argc, char **argv)
{
    /* ALLOY_NUM_THREADS and ALLOY_BLAS as a graph reads them: the f32 GEMM
     * runs its pieces on that many threads, the BLAS always on one */
    const char *env = getenv("ALLOY_NUM_THREADS"), *blas_env = getenv("ALLOY_BLAS");
    char *end = NULL;
    long asked = env && *env ? strtol(env, &end, 10) : 0;
    if (env && *env && (*end || asked < 1 || asked > 64)) {
        fprintf(stderr, "gemm_cpu: ALLOY_NUM_THREADS wants 1 to 64, got '%s'\n", env);
        return 2;
    }
    use_blas = !(blas_env && (!strcmp(blas_env, "0") || !strcmp(blas_env, "false") || !strcmp(blas_env, "no") ||
                                   !strcmp(blas_env, "off")));
    gemm_configure(use_blas, (int)asked);
    int threads = asked > 0 ? (int)asked : (int)sysconf(_SC_NPROCESSORS_ONLN);
    proc_threads before;
    proc_threads_take(&before);
    double cpu0 = process_cpu();
    if (argc > 1 && strcmp(argv[1], "lowp") == 0) { /* only the f16/bf16 table */
        lowp_table();
        report_threads(&before, &cpu0, 1);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: gemm_cpu [lowp]\n");
        return 2;
    }
    const char *backend = gemm_backend_name();
    bool have_blas = strcmp(backend, "portable") != 0;
    printf("f32 GEMM, C = A*B, best of >= 5 runs (wall time); threads: %d (ALLOY_NUM_THREADS=%s); BLAS: %s\n\n",
           threads, env ? env : "unset: every online CPU",
           have_blas ? backend : "none (ALLOY_BLAS=0 or not built)");
    printf("%-18s %-20s %12s %12s %8s %10s\n", "M x N x K (op)", "", "portable", "BLAS", "ratio",
           "max|diff|");
    printf("%-18s %-20s %12s %12s %8s %10s\n", "", "", "GFLOP/s", "GFLOP/s", "BLAS/p", "rel");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        size_t na = (size_t)(s->m * s->k), nb = (size_t)(s->k * s->n), nc = (size_t)(s->m * s->n);
        float *a = al_malloc(na * sizeof *a), *b = al_malloc(nb * sizeof *b);
        float *c1 = al_malloc(nc * sizeof *c1), *c2 = al_malloc(nc * sizeof *c2);
        if (!a || !b || !c1 || !c2) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        srand(1);
        for (size_t j = 0; j < na; j++) a[j] = (float)rand() / (float)RAND_MAX - 0.5f;
        for (size_t j = 0; j < nb; j++) b[j] = (float)rand() / (float)RAND_MAX - 0.5f;
        double flops = 2.0 * (double)s->m * (double)s->n * (double)s->k;
        double gp = flops / best_time(gemm_f32_portable, s, a, b, c1) * 1e-9;
        char dims[40], blas_col[16] = "-", ratio_col[16] = "-", diff_col[16] = "-";
        snprintf(dims, sizeof dims, "%dx%dx%d (%c%c)", (int)s->m, (int)s->n, (int)s->k,
                 s->ta ? 'T' : 'N', s->tb ? 'T' : 'N');
        if (have_blas) {
            double gb = flops / best_time(gemm_f32, s, a, b, c2) * 1e-9;
            double diff = 0.0, mag = 0.0;
            for (size_t j = 0; j < nc; j++) {
                diff = fmax(diff, fabs((double)c1[j] - (double)c2[j]));
                mag = fmax(mag, fabs((double)c2[j]));
            }
            snprintf(blas_col, sizeof blas_col, "%.1f", gb);
            snprintf(ratio_col, sizeof ratio_col, "%.2f", gb / gp);
            snprintf(diff_col, sizeof diff_col, "%.1e", mag > 0 ? diff / mag : diff);
        }
        printf("%-18s %-20s %12.1f %12s %8s %10s\n", dims, s->what, gp, blas_col, ratio_col,
               diff_col);
        fflush(stdout);
        al_free(a), al_free(b), al_free(c1), al_free(c2);
    }
    report_threads(&before, &cpu0, threads);
    lowp_table();
    report_threads(&before, &cpu0, 1);
    return 0;
}
