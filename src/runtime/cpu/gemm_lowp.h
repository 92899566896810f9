/* gemm_lowp.h - the CPU backend's f16/bf16 GEMM: packed panels, register-blocked kernels picked at run time, f32 accumulation. */
#ifndef ALLOY_GEMM_LOWP_H
#define ALLOY_GEMM_LOWP_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "step/options.h"
#include "runtime/cpu/cpu.h"

/* One batched product C[b] = op(A[b]) op(B[b]) of f16 or bf16 operands,
 * summed in f32. op(A) is m x k (A is k x m, leading dimension lda, when
 * ta), op(B) k x n likewise; batch b of A starts at element offset
 * sum_d idx_d(b) * stride_a[d] (b walked row-major over batch_dims; a
 * stride 0 broadcasts), likewise B. C is dense [batches, m, n] unless
 * stride_c is given: then row i of batch b's C starts at element offset
 * sum_d idx_d(b) * stride_c[d] + i * ldc (ldc >= n; the batch strides and
 * ldc place every element apart, no two batches' rows overlapping), so a
 * product can write its rows where a strided layout keeps them. */
typedef struct gemm_lowp_args {
    alloy_dtype dtype;     /* of A and B: ALLOY_F16 or ALLOY_BF16 */
    alloy_dtype out_dtype; /* of C: ALLOY_F32 (the sums), or dtype (each sum rounded once) */
    bool ta, tb;
    int64_t m, n, k, lda, ldb;
    int batch_rank;
    const int64_t *batch_dims, *stride_a, *stride_b; /* batch_rank each (NULL when 0) */
    const void *a, *b;
    void *c;
    const int64_t *stride_c; /* batch_rank of them, or NULL: C dense */
    int64_t ldc;             /* with stride_c: C's row stride in elements */
} gemm_lowp_args;

/* The kernel `asked` gives for operands of dtype dt on this CPU: auto is
 * avx512_bf16 for bf16 where the CPU has AVX512_BF16, avx512 where it has
 * AVX-512 (F, with F16C for f16), else sgemm (the BLAS, or the f32 GEMM's
 * own threaded kernel); avx2 (AVX2, FMA and F16C: avx512's bits) only
 * when forced. A forced kernel the CPU lacks (or avx512_bf16 for f16)
 * gives the next one down (avx512_bf16, avx512, avx2, portable). */
AL_HIDDEN opt_lowp_gemm gemm_lowp_kernel(alloy_dtype dt, opt_lowp_gemm asked);
/* The option's name of kernel k ("avx512_bf16", ...). */
AL_HIDDEN const char *gemm_lowp_kernel_name(opt_lowp_gemm k);

/* Runs g with kernel gemm_lowp_kernel(g->dtype, asked) on up to `threads`
 * threads of w (NULL: one thread), packing into a buffer w keeps for the
 * next call (w NULL: one of its own, freed before returning). Every
 * element is summed in the same order whatever the thread count. The
 * avx512_bf16 kernel flushes subnormal bf16 inputs and f32 partial sums
 * (below 2^-126) to zero, as vdpbf16ps does; the others are exact f32
 * fused or unfused multiply-adds. k == 0 writes zeros. ALLOY_ERR_OOM when
 * the packing buffer cannot be had (C is then unchanged). */
AL_HIDDEN alloy_status gemm_lowp(const gemm_lowp_args *g, opt_lowp_gemm asked, cpu_workers *w, int threads);

/* What a GEMM step's epilogue does to each f32 sum before C's rounding, as
 * its fused group does (docs/fusion.md): the range rule of `range` on the
 * product (ALLOY_F16 or ALLOY_BF16: a value that a store would make inf
 * becomes that inf; ALLOY_F32: none); then bias[j] added in f32 (one per
 * column j of C; NULL: none), that sum's range rule (bias_range) where an
 * activation reads it on, and the sum stored rounded into sum_out (C's
 * dtype and layout; NULL: not stored); then the activation `act` (a fused
 * member's chunk function, cpu_fused.h; NULL: none) of the value so far.
 * C gets the last value, rounded once (a last member's range rule is that
 * store's own rounding to inf, so it is not applied first). */
typedef struct gemm_lowp_epilogue {
    alloy_dtype range;
    const float *bias;
    alloy_dtype bias_range;
    void *sum_out;
    void (*act)(int64_t n, float *restrict y, const float *restrict a, const float *restrict b, const float *restrict c,
                const double *p);
} gemm_lowp_epilogue;

/* gemm_lowp with epi applied to every sum of an f16 or bf16 C before its
 * one rounding (in each tile, while its sums are in cache: the f32 product
 * is never written out): the bits of the sums into f32, then
 * fz_range_copy_f32 and the add, then cvt_store_f32. epi NULL: gemm_lowp. */
AL_HIDDEN alloy_status gemm_lowp_epi(const gemm_lowp_args *g, const gemm_lowp_epilogue *epi, opt_lowp_gemm asked,
                                     cpu_workers *w, int threads);

/* ---- between gemm_lowp.c and the x86 kernels (gemm_lowp_x86.c) ---- */

/* A strip of an operand to pack: element (r, kk) of op(X), r < rows, is
 * base[r * rs + kk * ks], f16 or bf16; one of rs, ks is 1. When rs is 1,
 * base[kk * ks + r] may be read for r < readable (>= rows: the strips
 * after this one). */
typedef struct strip_src {
    alloy_dtype dt;
    const uint16_t *base;
    int64_t rs, ks, rows, k, readable;
} strip_src;

/* A register-blocked kernel over packed panels. A panel of op(A) is an
 * mr-row strip, k-unit by k-unit (ku consecutive k of one row together),
 * rows past the matrix zero; a panel of op(B) likewise with nr columns. */
typedef struct lowp_kernel {
    int mr, nr;  /* register tile */
    int ku;      /* k per unit: 2 (bf16 pairs) or 1 (f32) */
    int esize;   /* bytes of a packed element: 2 (bf16) or 4 (f32) */
    int kc;      /* k per block (a multiple of ku): kc x nr of B stays in L1 */
    /* c[0..mr_valid, 0..nr_valid) (row stride ldc) = (add ? c : 0) + the
     * mr x nr product of kunits units of the panels a and b */
    void (*tile)(int64_t kunits, const void *a, const void *b, float *c, int64_t ldc, int mr_valid,
                 int nr_valid, bool add);
    /* packs units [u0, u1) of strip s as an R-wide panel starting at dst
     * (zeros past s->rows and s->k) and returns where it stopped (u0 to
     * u1); the driver's C packing does the rest. It may write up to 64
     * bytes past unit u1 - 1 (a strip is followed by that much slack), and
     * runs with u0 ascending for each strip. NULL: none. */
    int64_t (*pack)(const strip_src *s, int R, int64_t u0, int64_t u1, void *dst);
    /* tile's last k block of an f16 C: out[0..mr_valid, 0..nr_valid) (row
     * stride ldo) = the sums (plus cin, the earlier blocks' sums, row
     * stride ldin, when not NULL) rounded to f16 in registers: tile into
     * an f32 buffer and cvt_f16_store after it, bit for bit, without the
     * buffer's round trip. NULL: none (the driver rounds the buffer). */
    void (*tile_f16)(int64_t kunits, const void *a, const void *b, const float *cin, int64_t ldin, uint16_t *out,
                     int64_t ldo, int mr_valid, int nr_valid);
    /* tile_f16's contract for a bf16 C (cvt_f32_bits_to_bf16's rounding,
     * bit for bit cvt_store_f32's). NULL: none. */
    void (*tile_bf16)(int64_t kunits, const void *a, const void *b, const float *cin, int64_t ldin, uint16_t *out,
                      int64_t ldo, int mr_valid, int nr_valid);
    /* tile and tile_bf16 with op(A) read where it is instead of from a
     * panel (bf16 pairs only, rows k-contiguous, k even): unit p of row i
     * (i < mr_valid) is the pair at a + i * lda + 2p. The same products in
     * the same order, so the same bits. NULL: none (A is packed). */
    void (*tile_in_place)(int64_t kunits, const uint16_t *a, int64_t lda, const void *b, float *c, int64_t ldc,
                          int mr_valid, int nr_valid, bool add);
    void (*tile_bf16_in_place)(int64_t kunits, const uint16_t *a, int64_t lda, const void *b, const float *cin,
                               int64_t ldin, uint16_t *out, int64_t ldo, int mr_valid, int nr_valid);
} lowp_kernel;

/* The x86 kernels, NULL when the build is not for x86-64 with GCC or clang.
 * Call only where gemm_lowp_x86_has says the CPU runs them. */
AL_HIDDEN const lowp_kernel *gemm_lowp_x86_kernel(opt_lowp_gemm k);
AL_HIDDEN bool gemm_lowp_x86_has(opt_lowp_gemm k, alloy_dtype dt);

#endif
