/* gemm.c - the CPU backend's matrix multiply: cblas when built with a BLAS, else a blocked C kernel. */
#include "runtime/cpu/gemm.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloy_config.h"

/* ALLOY_HAVE_CBLAS is 1 when meson found OpenBLAS/cblas, else 0. */
#if ALLOY_HAVE_CBLAS
#define USE_CBLAS 1
#include <cblas.h>
#ifdef OPENBLAS_VERSION
#define BLAS_NAME "openblas"
#else
#define BLAS_NAME "cblas"
#endif
#else
#define USE_CBLAS 0
#endif

/* The hot loops are pinned to -O2 with the vectorizer: -O3 (a release build)
 * vectorizes the micro-kernel's outer loop instead and spills accumulators,
 * costing a third of the speed. No -march: the code stays portable. */
#if defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((optimize("O2", "tree-vectorize")))
#else
#define HOT
#endif

/* Register tile MR x NR (12 SSE accumulators: fits the 16 xmm registers of
 * baseline x86-64, 6 ymm with AVX), k-depth KC of a packed panel, an MC x KC
 * block of A sized for L2, a KC x NC panel of B for L3. MC % MR == NC % NR == 0.
 * Every element of C is summed in the same order whatever the threading: the
 * k-range is cut at multiples of KC, each piece summed from 0 in p order and
 * then added into C. */
enum { MR = 6, NR = 8, KC = 384, MC = 96, NC = 3072 };
/* Below this many multiply-adds one thread does it all, and each thread gets
 * at least half of it: starting and joining a thread costs about as much as a
 * 100^3 product on one core (measured: 2 threads lose at 96^3, win at 128^3). */
#define PAR_MIN_MACS ((int64_t)128 * 128 * 128)
#define MAX_THREADS 64

/* One f32 product: C[m,n] = alpha * op(A) * op(B) + beta * C. */
typedef struct sgemm_args {
    bool ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    float *c;
    int64_t lda, ldb, ldc;
} sgemm_args;

/* Settings (gemm_configure), process-wide: a BLAS keeps its own global thread
 * pool anyway. Threads 0: every online CPU, read once. */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static bool env_blas = USE_CBLAS;
static int env_threads = 1, online_threads = 1;
static _Atomic int asked_threads;

static void read_online(void)
{
    long t = sysconf(_SC_NPROCESSORS_ONLN);
    online_threads = t < 1 ? 1 : t > MAX_THREADS ? MAX_THREADS : (int)t;
}

static void init_env(void)
{
    pthread_once(&env_once, read_online);
    int t = asked_threads;
    env_threads = t > 0 ? (t > MAX_THREADS ? MAX_THREADS : t) : online_threads;
}

void gemm_configure(bool use_blas, int threads)
{
    env_blas = USE_CBLAS && use_blas;
    asked_threads = threads;
}

static int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }
static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* C = beta * C (beta == 0 writes zeros without reading C). */
static void scale_f32(int64_t m, int64_t n, float beta, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++) {
        float *cr = c + i * ldc;
        if (beta == 0.0f)
            memset(cr, 0, (size_t)n * sizeof *cr);
        else if (beta != 1.0f)
            for (int64_t j = 0; j < n; j++) cr[j] *= beta;
    }
}

static void scale_f64(int64_t m, int64_t n, double beta, double *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++) {
        double *cr = c + i * ldc;
        if (beta == 0.0)
            memset(cr, 0, (size_t)n * sizeof *cr);
        else if (beta != 1.0)
            for (int64_t j = 0; j < n; j++) cr[j] *= beta;
    }
}

/* Rows [i0, i0+mc) and columns [p0, p0+kc) of op(A) into MR-row micro-panels,
 * each stored p-major (MR values per p), rows past mc zero-filled. */
static void pack_a(const sgemm_args *g, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
                   float *restrict dst)
{
    for (int64_t ir = 0; ir < mc; ir += MR, dst += MR * kc) {
        int64_t mr = min64(MR, mc - ir);
        const float *a = g->ta ? g->a + p0 * g->lda + i0 + ir : g->a + (i0 + ir) * g->lda + p0;
        if (g->ta) { /* op(A)(i, p) = a[p * lda + i]: rows of a are contiguous in i */
            for (int64_t p = 0; p < kc; p++) {
                int64_t i = 0;
                for (; i < mr; i++) dst[p * MR + i] = a[p * g->lda + i];
                for (; i < MR; i++) dst[p * MR + i] = 0.0f;
            }
        } else {
            for (int64_t i = 0; i < MR; i++)
                for (int64_t p = 0; p < kc; p++)
                    dst[p * MR + i] = i < mr ? a[i * g->lda + p] : 0.0f;
        }
    }
}

/* Rows [p0, p0+kc) and columns [j0, j0+nc) of op(B) into NR-column
 * micro-panels, each stored p-major (NR values per p), columns past nc zero. */
static void pack_b(const sgemm_args *g, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
                   float *restrict dst)
{
    for (int64_t jr = 0; jr < nc; jr += NR, dst += NR * kc) {
        int64_t nr = min64(NR, nc - jr);
        if (g->tb) { /* op(B)(p, j) = b[j * ldb + p] */
            const float *b = g->b + (j0 + jr) * g->ldb + p0;
            for (int64_t j = 0; j < NR; j++)
                for (int64_t p = 0; p < kc; p++)
                    dst[p * NR + j] = j < nr ? b[j * g->ldb + p] : 0.0f;
        } else {
            const float *b = g->b + p0 * g->ldb + j0 + jr;
            for (int64_t p = 0; p < kc; p++) {
                int64_t j = 0;
                for (; j < nr; j++) dst[p * NR + j] = b[p * g->ldb + j];
                for (; j < NR; j++) dst[p * NR + j] = 0.0f;
            }
        }
    }
}

/* How a k-piece's sum s lands in C: the first piece sets alpha*s (beta == 0,
 * C unread) or alpha*s + beta*c, the later ones add alpha*s. */
enum { STORE_SET, STORE_BETA, STORE_ADD };

static inline float combine(int mode, float s, float c, float alpha, float beta)
{
    return mode == STORE_SET    ? alpha * s
           : mode == STORE_BETA ? alpha * s + beta * c
                                : c + alpha * s;
}

/* The micro-kernel: an MR x NR tile of sums over kc packed steps, held in
 * registers (nothing else is live in the loop), written to tile. */
HOT static void kernel(int64_t kc, const float *restrict a, const float *restrict b,
                       float tile[restrict static MR * NR])
{
    float acc[MR][NR] = {{0.0f}};
    for (int64_t p = 0; p < kc; p++) {
        const float *ap = a + p * MR, *bp = b + p * NR;
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            float ai = ap[i];
            for (int j = 0; j < NR; j++) acc[i][j] += ai * bp[j]; /* one vector op per 4 j */
        }
    }
    memcpy(tile, acc, sizeof acc);
}

/* The top-left mr x nr of a tile into c. */
HOT static void store_tile(const float *restrict tile, float *restrict c, int64_t ldc, int64_t mr,
                           int64_t nr, float alpha, float beta, int mode)
{
    if (nr == NR) {
        for (int64_t i = 0; i < mr; i++) {
            const float *t = tile + i * NR;
            float *cr = c + i * ldc;
            if (mode == STORE_SET)
                for (int j = 0; j < NR; j++) cr[j] = alpha * t[j];
            else if (mode == STORE_BETA)
                for (int j = 0; j < NR; j++) cr[j] = alpha * t[j] + beta * cr[j];
            else
                for (int j = 0; j < NR; j++) cr[j] = cr[j] + alpha * t[j];
        }
    } else {
        for (int64_t i = 0; i < mr; i++)
            for (int64_t j = 0; j < nr; j++) {
                float *cij = c + i * ldc + j;
                float cin = mode == STORE_SET ? 0.0f : *cij; /* beta == 0: C unread */
                *cij = combine(mode, tile[i * NR + j], cin, alpha, beta);
            }
    }
}

/* The blocked product on one thread; abuf holds an MC x KC block of A and
 * bbuf a KC x NC panel of B (each capped at what the sizes need). */
static void sgemm_blocked(const sgemm_args *g, float *abuf, float *bbuf)
{
    for (int64_t jc = 0; jc < g->n; jc += NC) {
        int64_t nc = min64(NC, g->n - jc);
        for (int64_t pc = 0; pc < g->k; pc += KC) {
            int64_t kc = min64(KC, g->k - pc);
            int mode = pc > 0 ? STORE_ADD : g->beta == 0.0f ? STORE_SET : STORE_BETA;
            pack_b(g, pc, kc, jc, nc, bbuf);
            for (int64_t ic = 0; ic < g->m; ic += MC) {
                int64_t mc = min64(MC, g->m - ic);
                pack_a(g, ic, mc, pc, kc, abuf);
                for (int64_t jr = 0; jr < nc; jr += NR)
                    for (int64_t ir = 0; ir < mc; ir += MR) {
                        float tile[MR * NR];
                        kernel(kc, abuf + ir * kc, bbuf + jr * kc, tile);
                        store_tile(tile, g->c + (ic + ir) * g->ldc + jc + jr, g->ldc,
                                   min64(MR, mc - ir), min64(NR, nc - jr), g->alpha, g->beta, mode);
                    }
            }
        }
    }
}

/* Without pack buffers (out of memory): the same sums in the same order, slowly. */
static void sgemm_unpacked(const sgemm_args *g)
{
    for (int64_t i = 0; i < g->m; i++)
        for (int64_t j = 0; j < g->n; j++) {
            float *cij = g->c + i * g->ldc + j;
            for (int64_t pc = 0; pc < g->k; pc += KC) {
                float s = 0.0f;
                for (int64_t p = pc; p < min64(pc + KC, g->k); p++)
                    s += (g->ta ? g->a[p * g->lda + i] : g->a[i * g->lda + p]) *
                         (g->tb ? g->b[j * g->ldb + p] : g->b[p * g->ldb + j]);
                int mode = pc > 0 ? STORE_ADD : g->beta == 0.0f ? STORE_SET : STORE_BETA;
                *cij = combine(mode, s, mode == STORE_SET ? 0.0f : *cij, g->alpha, g->beta);
            }
        }
}

/* A rectangle [i0, i1) x [j0, j1) of C, computed by one thread. */
typedef struct sgemm_part {
    const sgemm_args *g;
    int64_t i0, i1, j0, j1;
} sgemm_part;

static void *run_part(void *arg)
{
    const sgemm_part *pt = arg;
    sgemm_args s = *pt->g;
    s.m = pt->i1 - pt->i0;
    s.n = pt->j1 - pt->j0;
    s.a = s.ta ? s.a + pt->i0 : s.a + pt->i0 * s.lda;
    s.b = s.tb ? s.b + pt->j0 * s.ldb : s.b + pt->j0;
    s.c = s.c + pt->i0 * s.ldc + pt->j0;
    int64_t kc = min64(KC, s.k);
    float *abuf = al_malloc((size_t)(round_up(min64(MC, s.m), MR) * kc) * sizeof(float));
    float *bbuf = al_malloc((size_t)(round_up(min64(NC, s.n), NR) * kc) * sizeof(float));
    if (abuf && bbuf)
        sgemm_blocked(&s, abuf, bbuf);
    else
        sgemm_unpacked(&s);
    al_free(abuf);
    al_free(bbuf);
    return NULL;
}

void gemm_f32_portable(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return;
    if (k <= 0 || alpha == 0.0f) {
        scale_f32(m, n, beta, c, ldc);
        return;
    }
    init_env();
    sgemm_args g = {trans_a, trans_b, m, n, k, alpha, beta, a, b, c, lda, ldb, ldc};
    /* Split the larger of m and n into tile-aligned strips, one per thread:
     * each thread then re-packs only the smaller operand. */
    bool split_n = n >= m;
    int64_t unit = split_n ? NR : MR, len = split_n ? n : m;
    int64_t units = (len + unit - 1) / unit, nt = min64(env_threads, units);
    double macs = (double)m * (double)n * (double)k; /* each thread gets >= PAR_MIN_MACS/2 */
    if (macs < (double)nt * (PAR_MIN_MACS / 2)) nt = (int64_t)(macs / (PAR_MIN_MACS / 2));
    if (macs < PAR_MIN_MACS || nt < 1) nt = 1;
    int64_t per = (units + nt - 1) / nt * unit;
    nt = (len + per - 1) / per;

    sgemm_part parts[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    bool started[MAX_THREADS];
    for (int64_t t = 0; t < nt; t++) {
        int64_t lo = t * per, hi = min64(len, lo + per);
        parts[t] = split_n ? (sgemm_part){&g, 0, m, lo, hi} : (sgemm_part){&g, lo, hi, 0, n};
        started[t] = t > 0 && pthread_create(&tids[t], NULL, run_part, &parts[t]) == 0;
    }
    run_part(&parts[0]);
    for (int64_t t = 1; t < nt; t++) {
        if (started[t])
            pthread_join(tids[t], NULL);
        else
            run_part(&parts[t]); /* could not start a thread: same result, here */
    }
}

#if USE_CBLAS
/* The BLAS's own pool gets alloy's thread count (num_threads): left alone,
 * OpenBLAS starts one thread per CPU whatever alloy was asked for, and its
 * spinning workers fight alloy's. Set only when it changes. */
static void blas_threads(int threads)
{
#ifdef OPENBLAS_VERSION
    static _Atomic int set;
    if (set != threads) {
        openblas_set_num_threads(threads);
        set = threads;
    }
#else
    (void)threads;
#endif
}

static bool fits_int(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc)
{
    return m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
           ldc <= INT_MAX;
}
#endif

void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
              int64_t ldc)
{
    init_env();
#if USE_CBLAS
    /* Degenerate shapes stay here: the BLAS would insist on lda >= 1 and so on. */
    if (env_blas && m > 0 && n > 0 && k > 0 && alpha != 0.0f &&
        fits_int(m, n, k, lda, ldb, ldc)) {
        blas_threads(env_threads);
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a, (int)lda,
                    b, (int)ldb, beta, c, (int)ldc);
        return;
    }
#endif
    gemm_f32_portable(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* f64 without a BLAS: C scaled by beta first, then blocks of op(B) (packed
 * row-major, which also undoes a transpose) streamed against rows of op(A). */
enum { DKC = 128, DNC = 256 };

HOT static void axpy_rows(int64_t kc, int64_t nc, const double *restrict arow,
                          const double *restrict bp, double *restrict cr)
{
    for (int64_t p = 0; p < kc; p++) {
        double ap = arow[p];
        for (int64_t j = 0; j < nc; j++) cr[j] += ap * bp[p * nc + j];
    }
}

static void dgemm_portable(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                           const double *a, int64_t lda, const double *b, int64_t ldb,
                           double beta, double *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return;
    scale_f64(m, n, beta, c, ldc);
    if (k <= 0 || alpha == 0.0) return;
    double *bbuf = al_malloc((size_t)(min64(DKC, k) * min64(DNC, n)) * sizeof(double));
    double *abuf = al_malloc((size_t)min64(DKC, k) * sizeof(double));
    if (!bbuf || !abuf) { /* out of memory: unblocked */
        for (int64_t i = 0; i < m; i++)
            for (int64_t p = 0; p < k; p++) {
                double ap = alpha * (ta ? a[p * lda + i] : a[i * lda + p]);
                for (int64_t j = 0; j < n; j++)
                    c[i * ldc + j] += ap * (tb ? b[j * ldb + p] : b[p * ldb + j]);
            }
    } else {
        for (int64_t pc = 0; pc < k; pc += DKC) {
            int64_t kc = min64(DKC, k - pc);
            for (int64_t jc = 0; jc < n; jc += DNC) {
                int64_t nc = min64(DNC, n - jc);
                for (int64_t p = 0; p < kc; p++)
                    for (int64_t j = 0; j < nc; j++)
                        bbuf[p * nc + j] =
                            tb ? b[(jc + j) * ldb + pc + p] : b[(pc + p) * ldb + jc + j];
                for (int64_t i = 0; i < m; i++) {
                    for (int64_t p = 0; p < kc; p++)
                        abuf[p] = alpha * (ta ? a[(pc + p) * lda + i] : a[i * lda + pc + p]);
                    axpy_rows(kc, nc, abuf, bbuf, c + i * ldc + jc);
                }
            }
        }
    }
    al_free(bbuf);
    al_free(abuf);
}

void gemm_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const double *a, int64_t lda, const double *b, int64_t ldb, double beta, double *c,
              int64_t ldc)
{
    init_env();
#if USE_CBLAS
    if (env_blas && m > 0 && n > 0 && k > 0 && alpha != 0.0 && fits_int(m, n, k, lda, ldb, ldc)) {
        blas_threads(env_threads);
        cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                    trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a, (int)lda,
                    b, (int)ldb, beta, c, (int)ldc);
        return;
    }
#endif
    dgemm_portable(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char *gemm_backend_name(void)
{
    init_env();
#if USE_CBLAS
    if (env_blas) return BLAS_NAME;
#endif
    return "portable";
}
