/* gemm.c - the CPU backend's matrix multiply: cblas on one thread per piece when built with a BLAS, else a blocked C kernel; pieces spread over threads. */
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
/* Below GEMM_PAR_MIN_MACS multiply-adds one thread does it all, and each
 * thread gets at least half of it. */
#define PAR_MIN_MACS GEMM_PAR_MIN_MACS
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

#if USE_CBLAS
/* The BLAS runs on one thread: alloy cuts a product into pieces and runs
 * them on its own threads (gemm_run), so that one pool serves the GEMMs
 * and the other kernels. Left alone, OpenBLAS would start a thread per CPU
 * (or OPENBLAS_NUM_THREADS), whose workers spin in sched_yield after each
 * call and fight alloy's threads for the cores.
 *
 * Then one product of 64 x 1024 x 512 (67 MFLOP, about 1.5 ms) on each of
 * the threads the GEMMs may use, all at once: OpenBLAS 0.3.21 with its Zen
 * kernels (an AVX2-only EPYC, Zen 1) ran every product at a third of its
 * speed (1024 x 256 x 784: 12-14 against 42 GFLOP/s, the time in its
 * micro-kernel) until a call of 384 or more columns with a deep k had
 * used the same work buffer, which alloy's pieces of 256 columns never
 * do; after one, every product on that buffer ran at full speed, with the
 * same bits (the call faulted in 25 pages of the buffer that the narrow
 * ones never touched). OpenBLAS gives each of the calls running at once a
 * buffer of its own, the first free one, so the priming calls start
 * together to reach as many buffers as alloy's threads can use (the MLP
 * 784-1024-1024-10's f32 step at batch 1024: bench/RESULTS.md). */
enum { PRIME_M = 64, PRIME_N = 1024, PRIME_K = 512 };
enum { PRIME_FLOATS = PRIME_M * PRIME_K + PRIME_K * PRIME_N + PRIME_M * PRIME_N };

/* The priming threads start their calls together when go is set. */
typedef struct prime_start {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool go;
} prime_start;

static void *blas_prime(void *arg)
{
    prime_start *start = arg;
    float *a = calloc(PRIME_FLOATS, sizeof(float));
    if (start) {
        pthread_mutex_lock(&start->lock);
        while (!start->go) pthread_cond_wait(&start->cond, &start->lock);
        pthread_mutex_unlock(&start->lock);
    }
    if (a) /* without it, only slower */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, PRIME_M, PRIME_N, PRIME_K, 1.0f, a, PRIME_K,
                    a + PRIME_M * PRIME_K, PRIME_N, 0.0f, a + PRIME_M * PRIME_K + PRIME_K * PRIME_N, PRIME_N);
    free(a);
    return NULL;
}

static void blas_setup(void)
{
#ifdef OPENBLAS_VERSION
    openblas_set_num_threads(1);
#endif
    prime_start start = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
    pthread_t tids[MAX_THREADS];
    int started = 1; /* this thread, then those that start (one that does not: a buffer left as it is) */
    for (; started < env_threads && started < MAX_THREADS; started++)
        if (pthread_create(&tids[started], NULL, blas_prime, &start) != 0) break;
    pthread_mutex_lock(&start.lock);
    start.go = true;
    pthread_cond_broadcast(&start.cond);
    pthread_mutex_unlock(&start.lock);
    blas_prime(NULL);
    for (int t = 1; t < started; t++) pthread_join(tids[t], NULL);
}

static void blas_one_thread(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, blas_setup);
}

static bool fits_int(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc)
{
    return m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
           ldc <= INT_MAX;
}
#endif

/* ---- pieces ---- */

/* A piece is at least PIECE_MIN wide (a multiple of PIECE_ALIGN, so BLAS
 * register tiles fall on the same rows and columns in every piece) and
 * there are at most
 * MAX_PIECES: each piece packs the whole other operand again, which a strip
 * this wide amortizes. */
enum { PIECE_MIN = 256, PIECE_ALIGN = 64, MAX_PIECES = 16 };

/* The strip width of p's pieces along the dimension split (n when n >= m). */
static int64_t piece_width(const gemm_product *p, int64_t *len)
{
    *len = p->n >= p->m ? p->n : p->m;
    int64_t w = round_up((*len + MAX_PIECES - 1) / MAX_PIECES, PIECE_ALIGN);
    return w < PIECE_MIN ? PIECE_MIN : w;
}

int64_t gemm_parts(const gemm_product *p)
{
    if (p->m <= 0 || p->n <= 0) return 0;
    if ((double)p->m * (double)p->n * (double)p->k < (double)PAR_MIN_MACS) return 1;
    int64_t len, w = piece_width(p, &len);
    return (len + w - 1) / w;
}

/* The single-threaded product q (gemm_product layout) with its own pointers. */
static void product_one_thread(const gemm_product *q)
{
    if (q->m <= 0 || q->n <= 0) return;
#if USE_CBLAS
    /* degenerate shapes stay here: the BLAS would insist on lda >= 1 and so on */
    if (env_blas && q->k > 0 && q->alpha != 0.0 && fits_int(q->m, q->n, q->k, q->lda, q->ldb, q->ldc)) {
        blas_one_thread();
        enum CBLAS_TRANSPOSE ta = q->trans_a ? CblasTrans : CblasNoTrans, tb = q->trans_b ? CblasTrans : CblasNoTrans;
        if (q->f64)
            cblas_dgemm(CblasRowMajor, ta, tb, (int)q->m, (int)q->n, (int)q->k, q->alpha, q->a, (int)q->lda, q->b,
                        (int)q->ldb, q->beta, q->c, (int)q->ldc);
        else
            cblas_sgemm(CblasRowMajor, ta, tb, (int)q->m, (int)q->n, (int)q->k, (float)q->alpha, q->a, (int)q->lda,
                        q->b, (int)q->ldb, (float)q->beta, q->c, (int)q->ldc);
        return;
    }
#endif
    if (q->f64) {
        dgemm_portable(q->trans_a, q->trans_b, q->m, q->n, q->k, q->alpha, q->a, q->lda, q->b, q->ldb, q->beta, q->c,
                       q->ldc);
        return;
    }
    if (q->k <= 0 || q->alpha == 0.0) {
        scale_f32(q->m, q->n, (float)q->beta, q->c, q->ldc);
        return;
    }
    sgemm_args g = {q->trans_a, q->trans_b, q->m, q->n, q->k, (float)q->alpha, (float)q->beta,
                    q->a, q->b, q->c, q->lda, q->ldb, q->ldc};
    sgemm_part whole = {&g, 0, q->m, 0, q->n};
    run_part(&whole);
}

/* A product of several pieces runs in its pieces on one thread too (one
 * piece is the whole product, one call): a BLAS may sum an element of a
 * product otherwise than the same element of a piece of it (OpenBLAS
 * 0.3.21: 33 x 600 x 120 against pieces of 256, 256 and 88 columns on a
 * Zen 4; 1024 x 320 x 160 against pieces of 256 rows, 2.4% of the
 * elements, rows 252-767, with its Zen kernels on an AVX2-only EPYC, though
 * not with its Cooper Lake ones), so C's bits never depend on the thread
 * count (tests/test_gemm.c). */
void gemm_part(const gemm_product *p, int64_t part)
{
    init_env();
    gemm_product q = *p;
    size_t es = p->f64 ? sizeof(double) : sizeof(float);
    int64_t parts = gemm_parts(p);
    if (parts > 1) {
        int64_t len, w = piece_width(p, &len), lo = part * w, hi = min64(len, lo + w);
        if (p->n >= p->m) { /* columns [lo, hi) of C: of op(B) */
            q.n = hi - lo;
            q.b = (const char *)p->b + (size_t)(p->trans_b ? lo * p->ldb : lo) * es;
            q.c = (char *)p->c + (size_t)lo * es;
        } else {            /* rows [lo, hi) of C: of op(A) */
            q.m = hi - lo;
            q.a = (const char *)p->a + (size_t)(p->trans_a ? lo : lo * p->lda) * es;
            q.c = (char *)p->c + (size_t)(lo * p->ldc) * es;
        }
    }
    product_one_thread(&q);
}

/* Pieces claimed one at a time by the threads of one gemm_run without a pool. */
typedef struct piece_claim {
    const gemm_product *p;
    int64_t parts;
    _Atomic int64_t next;
} piece_claim;

static void *claim_pieces(void *arg)
{
    piece_claim *c = arg;
    for (int64_t i; (i = c->next++) < c->parts;) gemm_part(c->p, i);
    return NULL;
}

static void piece_job(void *arg, int64_t part, int thread)
{
    (void)thread;
    gemm_part(arg, part);
}

void gemm_run(const gemm_product *p, cpu_workers *w, int threads)
{
    int64_t parts = gemm_parts(p);
    if (parts <= 0) return;
    int64_t nt = min64(threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads, parts);
    if (w) {
        if (nt > 1) nt = cpu_workers_threads(w, (int)nt);
        cpu_workers_run(w, (int)nt, parts, piece_job, (void *)p);
        return;
    }
    piece_claim c = {p, parts, 0};
    pthread_t tids[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int64_t t = 1; t < nt; t++) started[t] = pthread_create(&tids[t], NULL, claim_pieces, &c) == 0;
    claim_pieces(&c); /* a thread that did not start leaves its pieces to the others */
    for (int64_t t = 1; t < nt; t++)
        if (started[t]) pthread_join(tids[t], NULL);
}

void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
              int64_t ldc)
{
    init_env();
    gemm_product p = {false, trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, a, b, c};
    gemm_run(&p, NULL, env_threads);
}

void gemm_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const double *a, int64_t lda, const double *b, int64_t ldb, double beta, double *c,
              int64_t ldc)
{
    init_env();
    gemm_product p = {true, trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, a, b, c};
    gemm_run(&p, NULL, env_threads);
}

const char *gemm_backend_name(void)
{
    init_env();
#if USE_CBLAS
    if (env_blas) return BLAS_NAME;
#endif
    return "portable";
}
