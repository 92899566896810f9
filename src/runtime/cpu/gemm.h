/* gemm.h - the CPU backend's matrix multiply: cblas when built with a BLAS, else a blocked C kernel. */
#ifndef ALLOY_GEMM_H
#define ALLOY_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"

/* C[M,N] = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or X^T.
 * A is M x K (K x M when trans_a), leading dimension lda; likewise B. Uses
 * the BLAS when the build has one and gemm_configure allows it, else the portable
 * kernel. beta == 0 means C is not read (may hold NaN). */
AL_HIDDEN void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                        float *c, int64_t ldc);
AL_HIDDEN void gemm_f64(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                        const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                        double *c, int64_t ldc);
/* Whether gemm_f32/gemm_f64 may use the BLAS (the blas option), and the
 * threads of the portable kernel (0: every online CPU). Process-wide. */
AL_HIDDEN void gemm_configure(bool use_blas, int threads);
/* The portable cache-blocked kernel, always available (benchmarks and tests
 * call it directly to compare with the BLAS). */
AL_HIDDEN void gemm_f32_portable(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                 float alpha, const float *a, int64_t lda, const float *b,
                                 int64_t ldb, float beta, float *c, int64_t ldc);
/* "openblas" (or the BLAS found) / "portable": what gemm_f32 uses now. */
AL_HIDDEN const char *gemm_backend_name(void);

#endif
