/* gemm_cpu.c - benchmark: the portable f32 GEMM kernel against the BLAS, GFLOP/s per shape. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "runtime/cpu/gemm.h"

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

int main(void)
{
    const char *backend = gemm_backend_name();
    bool have_blas = strcmp(backend, "portable") != 0;
    const char *threads = getenv("ALLOY_NUM_THREADS");
    printf("f32 GEMM, C = A*B, best of >= 5 runs; portable kernel threads: %s; BLAS: %s\n\n",
           threads ? threads : "all online CPUs",
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
    return 0;
}
