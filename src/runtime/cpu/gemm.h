/* gemm.h - the CPU backend's matrix multiply: cblas on one thread per piece when built with a BLAS, else a blocked C kernel; pieces spread over alloy's threads. */
#ifndef ALLOY_GEMM_H
#define ALLOY_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "runtime/cpu/cpu.h"

/* One product C[M,N] = alpha * op(A) * op(B) + beta * C in f32 or f64
 * (a, b, c then point at floats or doubles), laid out as gemm_f32's. */
typedef struct gemm_product {
    bool f64, trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldc;
    double alpha, beta;
    const void *a, *b;
    void *c;
} gemm_product;

/* Below this many multiply-adds a product runs on one thread: starting
 * and joining a thread costs about as much as a 100^3 product on one core
 * (measured: 2 threads lose at 96^3, win at 128^3). */
#define GEMM_PAR_MIN_MACS ((int64_t)128 * 128 * 128)

/* How many pieces p is cut into for threads: strips of C along the longer
 * of m and n, at least 256 wide (a multiple of 64), at most 16, one piece
 * below 128^3 multiply-adds. A function of the shape alone, so each
 * element of C comes from the same call whatever the thread count. */
AL_HIDDEN int64_t gemm_parts(const gemm_product *p);
/* Piece `part` (0 <= part < gemm_parts(p)) of p on the calling thread: one
 * BLAS call on one thread (the BLAS's own threads are never used: alloy
 * runs the pieces on its threads), or the portable kernel. */
AL_HIDDEN void gemm_part(const gemm_product *p, int64_t part);
/* All of p's pieces on up to `threads` threads of w, the caller one of
 * them (w NULL: threads started for this call and joined before it
 * returns), on one thread too: bit-identical whatever the thread count. */
AL_HIDDEN void gemm_run(const gemm_product *p, cpu_workers *w, int threads);

/* C[M,N] = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or X^T.
 * A is M x K (K x M when trans_a), leading dimension lda; likewise B. Uses
 * the BLAS when the build has one and gemm_configure allows it, else the portable
 * kernel; gemm_run on gemm_configure's threads. beta == 0 means C is not
 * read (may hold NaN). */
AL_HIDDEN void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                        float *c, int64_t ldc);
AL_HIDDEN void gemm_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                        const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                        double *c, int64_t ldc);
/* Whether gemm_f32/gemm_f64 and gemm_part may use the BLAS (the blas
 * option), and the threads gemm_f32, gemm_f64 and gemm_f32_portable use
 * (0: every online CPU). Process-wide. */
AL_HIDDEN void gemm_configure(bool use_blas, int threads);
/* The portable cache-blocked kernel, always available (benchmarks and tests
 * call it directly to compare with the BLAS). */
AL_HIDDEN void gemm_f32_portable(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                 float alpha, const float *a, int64_t lda, const float *b,
                                 int64_t ldb, float beta, float *c, int64_t ldc);
/* "openblas" (or the BLAS found) / "portable": what gemm_f32 uses now. */
AL_HIDDEN const char *gemm_backend_name(void);

#endif
