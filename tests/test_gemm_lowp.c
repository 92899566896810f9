/* test_gemm_lowp.c - the f16/bf16 GEMM (every kernel this CPU runs, each forced) against an f64 sum of the exact products. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "base/base.h"
#include "base/convert.h"
#include "runtime/cpu/cpu.h"
#include "runtime/cpu/cpu_fused.h"
#include "runtime/cpu/gemm_lowp.h"
#include "support.h"

/* The kernels a test forces in turn; those this CPU lacks are skipped. */
static const opt_lowp_gemm kernels[] = {OPT_LOWP_AVX512_BF16, OPT_LOWP_AVX512, OPT_LOWP_AVX2, OPT_LOWP_PORTABLE,
                                        OPT_LOWP_SGEMM};
enum { NKERNELS = sizeof kernels / sizeof kernels[0] };

static void *xalloc(size_t n)
{
    void *p = al_malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* One product to check: sizes, transposes and the batch layout of A and B
 * (batch_rank 0, or [2, 3] batches with the given strides in units of one
 * matrix, 0 broadcasting). */
typedef struct lowp_shape {
    int64_t m, n, k;
    int batch_rank;
    int64_t dims[2], sa[2], sb[2]; /* strides in matrices */
} lowp_shape;

/* Every operand value is uniform in [-1, 1) rounded to dt; elements outside
 * the product (the lda/ldb padding, the matrices a stride skips) are NaN,
 * so reading one fails the check. C starts as NaN and must be written
 * everywhere; the guard after it must not be. Each element is checked
 * against sum |a||b|-scaled bounds: f32 accumulation of k exact products,
 * (k + 2) * 2^-24 * sum |a||b| in any order, plus (k + 1) * 2^-126 for the
 * flushed subnormals of vdpbf16ps; a rounded result one rounding of its
 * dtype more, and it must be the f32 result rounded (one rounding). */
static void check(opt_lowp_gemm kernel, alloy_dtype dt, bool ta, bool tb, const lowp_shape *s, cpu_workers *w,
                  int threads)
{
    int64_t m = s->m, n = s->n, k = s->k, batches = 1;
    for (int d = 0; d < s->batch_rank; d++) batches *= s->dims[d];
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int64_t lda = ac + 3, ldb = bc + 1;
    int64_t amat = ar * lda, bmat = br * ldb; /* elements of one matrix */
    /* how many matrices of A and B the batch walk reaches */
    int64_t acount = 1, bcount = 1;
    int64_t sa[2], sb[2];
    for (int d = 0; d < s->batch_rank; d++) {
        acount += (s->dims[d] - 1) * s->sa[d];
        bcount += (s->dims[d] - 1) * s->sb[d];
        sa[d] = s->sa[d] * amat, sb[d] = s->sb[d] * bmat;
    }
    size_t na = (size_t)(acount * amat), nb = (size_t)(bcount * bmat), nc = (size_t)(batches * m * n);
    double *av = xalloc(na * sizeof *av), *bv = xalloc(nb * sizeof *bv);
    uint16_t *a = xalloc(na * 2), *b = xalloc(nb * 2);
    for (size_t i = 0; i < na; i++) av[i] = (int64_t)i % lda < ac ? test_round_to(dt, test_uniform(-1, 1)) : NAN;
    for (size_t i = 0; i < nb; i++) bv[i] = (int64_t)i % ldb < bc ? test_round_to(dt, test_uniform(-1, 1)) : NAN;
    test_encode(dt, av, a, (int64_t)na);
    test_encode(dt, bv, b, (int64_t)nb);
    float *c = xalloc((nc + 16) * sizeof *c);
    uint16_t *cl = xalloc((nc + 16) * 2);
    for (size_t i = 0; i < nc + 16; i++) c[i] = NAN, cl[i] = 0x7e01;
    gemm_lowp_args g = {dt, ALLOY_F32, ta, tb, m, n, k, lda, ldb, s->batch_rank, s->dims, sa, sb, a, b, c, NULL, 0};
    assert_int_equal(gemm_lowp(&g, kernel, w, threads), ALLOY_OK);
    g.out_dtype = dt, g.c = cl;
    assert_int_equal(gemm_lowp(&g, kernel, w, threads), ALLOY_OK);
    double u_out = dt == ALLOY_BF16 ? 0x1p-8 : 0x1p-11, tiny_out = dt == ALLOY_BF16 ? 0x1p-134 : 0x1p-25;
    for (int64_t bi = 0; bi < batches; bi++) {
        int64_t i0 = s->batch_rank ? bi / s->dims[1] : 0, i1 = s->batch_rank ? bi % s->dims[1] : 0;
        const double *ab = av + (s->batch_rank ? i0 * sa[0] + i1 * sa[1] : 0);
        const double *bb = bv + (s->batch_rank ? i0 * sb[0] + i1 * sb[1] : 0);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double ref = 0.0, mag = 0.0;
                for (int64_t p = 0; p < k; p++) {
                    double x = ta ? ab[p * lda + i] : ab[i * lda + p], y = tb ? bb[j * ldb + p] : bb[p * ldb + j];
                    ref += x * y; /* exact products; the f64 sum's own error is far below the bound */
                    mag += fabs(x * y);
                }
                size_t at = (size_t)((bi * m + i) * n + j);
                double bound = (double)(k + 2) * 0x1p-24 * mag + (double)(k + 1) * 0x1p-126;
                double got = c[at], got_low = test_decode(dt, cl, (int64_t)at);
                if (!(fabs(got - ref) <= bound))
                    fail_msg("%s %s %c%c %lldx%lldx%lld batch %lld: C[%lld,%lld] = %.9g, f64 reference %.9g (bound %.3g)",
                             gemm_lowp_kernel_name(gemm_lowp_kernel(dt, kernel)), alloy_dtype_name(dt), ta ? 'T' : 'N',
                             tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k, (long long)bi, (long long)i,
                             (long long)j, got, ref, bound);
                if (!(fabs(got_low - ref) <= u_out * fabs(ref) + (1 + u_out) * bound + tiny_out) ||
                    got_low != test_round_to(dt, got))
                    fail_msg("%s %s %c%c %lldx%lldx%lld: %s C[%lld,%lld] = %.9g, f32 sum %.9g, reference %.9g",
                             gemm_lowp_kernel_name(gemm_lowp_kernel(dt, kernel)), alloy_dtype_name(dt), ta ? 'T' : 'N',
                             tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k, alloy_dtype_name(dt),
                             (long long)i, (long long)j, got_low, got, ref);
            }
    }
    for (size_t i = nc; i < nc + 16; i++) {
        if (!isnan(c[i]) || cl[i] != 0x7e01) fail_msg("wrote past C (element %zu)", i);
    }
    al_free(av), al_free(bv), al_free(a), al_free(b), al_free(c), al_free(cl);
}

/* Whether kernel k runs as itself for dt here (else the test says so and skips it). */
static bool runs_here(opt_lowp_gemm k, alloy_dtype dt)
{
    if (gemm_lowp_kernel(dt, k) == k) return true;
    print_message("lowp_gemm=%s for %s: not on this CPU (gives %s), skipped\n", gemm_lowp_kernel_name(k),
                  alloy_dtype_name(dt), gemm_lowp_kernel_name(gemm_lowp_kernel(dt, k)));
    return false;
}

/* Odd shapes for every kernel, dtype and transpose: unit and single rows or
 * columns (1 x N), k odd and 1, sizes off the 14 x 32 and 6 x 8 tiles, and
 * past the 112 x 256 tiles and 192/256/384 k blocks. */
static const lowp_shape odd_shapes[] = {
    {1, 1, 1, 0, {0}, {0}, {0}},       {1, 37, 3, 0, {0}, {0}, {0}},     {37, 1, 5, 0, {0}, {0}, {0}},
    {1, 70, 33, 0, {0}, {0}, {0}},     {13, 31, 17, 0, {0}, {0}, {0}},   {14, 32, 2, 0, {0}, {0}, {0}},
    {15, 33, 35, 0, {0}, {0}, {0}},    {29, 65, 64, 0, {0}, {0}, {0}},   {6, 8, 1, 0, {0}, {0}, {0}},
    {113, 257, 33, 0, {0}, {0}, {0}},  {30, 40, 401, 0, {0}, {0}, {0}}, {3, 300, 779, 0, {0}, {0}, {0}},
};

static void run_odd_shapes(alloy_dtype dt)
{
    test_rng = dt;
    for (int ki = 0; ki < NKERNELS; ki++) {
        if (!runs_here(kernels[ki], dt)) continue;
        for (size_t i = 0; i < sizeof odd_shapes / sizeof odd_shapes[0]; i++)
            for (int t = 0; t < 4; t++) check(kernels[ki], dt, t & 1, t & 2, &odd_shapes[i], NULL, 1);
    }
}

static void test_bf16_odd_shapes_match_f64_on_every_kernel(void **state)
{
    (void)state;
    run_odd_shapes(ALLOY_BF16);
}

static void test_f16_odd_shapes_match_f64_on_every_kernel(void **state)
{
    (void)state;
    run_odd_shapes(ALLOY_F16);
}

/* [2, 3] batches: A and B each batch their own, B broadcast to every
 * batch (a weight), [2, 1] x [1, 3] broadcasting, and A broadcast, with
 * transposes. */
static void test_batches_follow_their_strides(void **state)
{
    (void)state;
    static const lowp_shape batched[] = {
        {9, 35, 19, 2, {2, 3}, {3, 1}, {3, 1}},
        {17, 33, 6, 2, {2, 3}, {3, 1}, {0, 0}},
        {5, 40, 31, 2, {2, 3}, {1, 0}, {0, 1}},
        {12, 40, 8, 2, {2, 3}, {0, 0}, {3, 1}}, /* A broadcast, k even: read in place by avx512_bf16 */
    };
    test_rng = 11;
    for (int ki = 0; ki < NKERNELS; ki++)
        for (int d = 0; d < 2; d++) {
            alloy_dtype dt = d ? ALLOY_F16 : ALLOY_BF16;
            if (!runs_here(kernels[ki], dt)) continue;
            for (size_t i = 0; i < sizeof batched / sizeof batched[0]; i++)
                for (int t = 0; t < 4; t++) check(kernels[ki], dt, t & 1, t & 2, &batched[i], NULL, 1);
        }
}

/* Empty dimensions: nothing is written for m or n == 0 (C is not even
 * read), zeros for k == 0, on every kernel. */
static void test_empty_dimensions(void **state)
{
    (void)state;
    uint16_t a[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80}, b[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80};
    for (int ki = 0; ki < NKERNELS; ki++) {
        float c[8];
        for (int i = 0; i < 8; i++) c[i] = 7.0f;
        gemm_lowp_args g = {ALLOY_BF16, ALLOY_F32, false, false, 0, 2, 2, 2, 2, 0, NULL, NULL, NULL, a, b, c, NULL, 0};
        assert_int_equal(gemm_lowp(&g, kernels[ki], NULL, 1), ALLOY_OK);
        g.m = 2, g.n = 0;
        assert_int_equal(gemm_lowp(&g, kernels[ki], NULL, 1), ALLOY_OK);
        for (int i = 0; i < 8; i++) assert_true(c[i] == 7.0f);
        g.n = 2, g.k = 0;
        assert_int_equal(gemm_lowp(&g, kernels[ki], NULL, 1), ALLOY_OK);
        for (int i = 0; i < 4; i++) assert_true(c[i] == 0.0f && !signbit(c[i]));
        assert_true(c[4] == 7.0f);
        int64_t dims[1] = {0}, st[1] = {4};
        g.k = 2, g.batch_rank = 1, g.batch_dims = dims, g.stride_a = st, g.stride_b = st;
        assert_int_equal(gemm_lowp(&g, kernels[ki], NULL, 1), ALLOY_OK);
        assert_true(c[4] == 7.0f);
    }
}

/* Hand-computed: [[1, 2, 3]] x [[1], [2], [3]] = 14 (bf16 and f16 hold
 * these exactly), transposed operands read as their transposes. */
static void test_exact_small_product(void **state)
{
    (void)state;
    double av[6] = {1, 2, 3, -1, 0.5, 4}, bv[6] = {1, 2, 3, 0.25, -2, 8};
    for (int ki = 0; ki < NKERNELS; ki++)
        for (int d = 0; d < 2; d++) {
            alloy_dtype dt = d ? ALLOY_F16 : ALLOY_BF16;
            uint16_t a[6], b[6];
            test_encode(dt, av, a, 6);
            test_encode(dt, bv, b, 6);
            float c[4];
            /* A [2,3] x B^T where B is [2,3]: c[i][j] = sum_p a[i][p] b[j][p] */
            gemm_lowp_args g = {dt, ALLOY_F32, false, true, 2, 2, 3, 3, 3, 0, NULL, NULL, NULL, a, b, c, NULL, 0};
            assert_int_equal(gemm_lowp(&g, kernels[ki], NULL, 1), ALLOY_OK);
            assert_true(c[0] == 14.0f);           /* 1 + 4 + 9 */
            assert_true(c[1] == 0.25f - 4 + 24);  /* 20.25 */
            assert_true(c[2] == -1 + 1 + 12);     /* 12 */
            assert_true(c[3] == -0.25f - 1 + 32); /* 30.75 */
        }
}

/* A product big enough to be split over threads gives the same bits on
 * 1, 2 and 3 threads (each element summed by one thread in k order), and
 * the workers' buffer is reused from call to call. */
/* The same bits on 1, 2 and 3 threads: a C of 300 x 290, and C's one
 * block high (the weight gradients' 128 rows, A transposed as x^T is),
 * which several threads cut into columns of equal strips (128 x 128: two
 * tiles of 64; 128 x 384: 192 + 192; 128 x 76: 64 + 12). */
static void test_same_bits_on_any_thread_count(void **state)
{
    (void)state;
    cpu_workers *w = cpu_workers_new();
    assert_non_null(w);
    static const int64_t shapes[][4] = {{300, 290, 200, 0}, {128, 128, 2048, 1}, {128, 384, 512, 1}, {128, 76, 600, 1}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
        bool ta = shapes[si][3] != 0;
        uint16_t *a = xalloc((size_t)(m * k) * 2), *b = xalloc((size_t)(k * n) * 2);
        double *v = xalloc((size_t)(m * k + k * n) * sizeof *v);
        test_rng = 5;
        for (int64_t i = 0; i < m * k + k * n; i++) v[i] = test_round_to(ALLOY_BF16, test_uniform(-1, 1));
        test_encode(ALLOY_BF16, v, a, m * k);
        test_encode(ALLOY_BF16, v + m * k, b, k * n);
        float *one = xalloc((size_t)(m * n) * 4), *many = xalloc((size_t)(m * n) * 4);
        for (int ki = 0; ki < NKERNELS - 1; ki++) { /* sgemm's threads are the BLAS's */
            if (!runs_here(kernels[ki], ALLOY_BF16)) continue;
            gemm_lowp_args g = {ALLOY_BF16, ALLOY_F32, ta, false, m, n, k, ta ? m : k, n, 0, NULL, NULL, NULL, a, b, one,
                                NULL, 0};
            assert_int_equal(gemm_lowp(&g, kernels[ki], NULL, 1), ALLOY_OK);
            for (int t = 2; t <= 3; t++) {
                g.c = many;
                assert_int_equal(gemm_lowp(&g, kernels[ki], w, t), ALLOY_OK);
                if (memcmp(one, many, (size_t)(m * n) * 4) != 0)
                    fail_msg("%s %lldx%lldx%lld: the result differs on %d threads", gemm_lowp_kernel_name(kernels[ki]),
                             (long long)m, (long long)n, (long long)k, t);
            }
        }
        al_free(a), al_free(b), al_free(v), al_free(one), al_free(many);
    }
    lowp_shape big = {130, 300, 70, 0, {0}, {0}, {0}};
    for (int ki = 0; ki < NKERNELS; ki++) /* and the threaded runs are right */
        if (runs_here(kernels[ki], ALLOY_F16)) check(kernels[ki], ALLOY_F16, true, false, &big, w, 2);
    /* bf16 at most 128 wide (A read in place by avx512_bf16; X^T's strips
     * split between the threads), and batched (a batch's strips to a job) */
    lowp_shape narrow = {300, 100, 200, 0, {0}, {0}, {0}}, heads = {64, 32, 64, 2, {4, 8}, {8, 1}, {8, 1}};
    for (int ki = 0; ki < NKERNELS; ki++)
        if (runs_here(kernels[ki], ALLOY_BF16))
            for (int tr = 0; tr < 4; tr++) {
                check(kernels[ki], ALLOY_BF16, tr & 1, tr & 2, &narrow, w, 2);
                check(kernels[ki], ALLOY_BF16, tr & 1, tr & 2, &heads, w, 3);
            }
    cpu_workers_free(w);
}

/* auto takes the fastest kernel the CPU has; a forced one the CPU lacks
 * gives the next one down; f16 never gets the bf16 dot product. */
static void test_kernel_choice(void **state)
{
    (void)state;
    assert_int_not_equal(gemm_lowp_kernel(ALLOY_F16, OPT_LOWP_AVX512_BF16), OPT_LOWP_AVX512_BF16);
    assert_int_not_equal(gemm_lowp_kernel(ALLOY_F16, OPT_LOWP_AUTO), OPT_LOWP_AVX512_BF16);
    assert_int_equal(gemm_lowp_kernel(ALLOY_BF16, OPT_LOWP_PORTABLE), OPT_LOWP_PORTABLE);
    assert_int_equal(gemm_lowp_kernel(ALLOY_BF16, OPT_LOWP_SGEMM), OPT_LOWP_SGEMM);
    assert_int_not_equal(gemm_lowp_kernel(ALLOY_F16, OPT_LOWP_AVX2), OPT_LOWP_AVX512); /* only down */
    opt_lowp_gemm best = gemm_lowp_kernel(ALLOY_BF16, OPT_LOWP_AUTO);
    if (gemm_lowp_kernel(ALLOY_BF16, OPT_LOWP_AVX512_BF16) == OPT_LOWP_AVX512_BF16)
        assert_int_equal(best, OPT_LOWP_AVX512_BF16);
    else if (gemm_lowp_kernel(ALLOY_BF16, OPT_LOWP_AVX512) == OPT_LOWP_AVX512)
        assert_int_equal(best, OPT_LOWP_AVX512);
    else if (gemm_lowp_kernel(ALLOY_BF16, OPT_LOWP_AVX2) == OPT_LOWP_AVX2)
        assert_int_equal(best, OPT_LOWP_AVX2); /* without AVX-512 */
    else
        assert_int_equal(best, OPT_LOWP_SGEMM);
    if (gemm_lowp_kernel(ALLOY_F16, OPT_LOWP_AVX512) != OPT_LOWP_AVX512 &&
        gemm_lowp_kernel(ALLOY_F16, OPT_LOWP_AVX2) == OPT_LOWP_AVX2)
        assert_int_equal(gemm_lowp_kernel(ALLOY_F16, OPT_LOWP_AUTO), OPT_LOWP_AVX2);
    print_message("bf16 kernel: %s, f16 kernel: %s\n", gemm_lowp_kernel_name(best),
                  gemm_lowp_kernel_name(gemm_lowp_kernel(ALLOY_F16, OPT_LOWP_AUTO)));
}

/* avx2 and avx512 sum each element over the same k blocks in the same
 * order with fused multiply-adds: the same bits, f32 and rounded, for
 * every transpose and dtype, on shapes off both kernels' tiles. */
static void test_avx2_gives_the_bits_of_avx512(void **state)
{
    (void)state;
    if (!runs_here(OPT_LOWP_AVX2, ALLOY_F16) || !runs_here(OPT_LOWP_AVX512, ALLOY_F16)) skip();
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 17, 5}, {13, 31, 193}, {29, 65, 400}, {120, 260, 33}};
    for (int dti = 0; dti < 2; dti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int tr = 0; tr < 4; tr++) {
                alloy_dtype dt = dti ? ALLOY_BF16 : ALLOY_F16;
                int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
                bool ta = tr & 1, tb = tr & 2;
                int64_t lda = (ta ? m : k) + 1, ldb = tb ? k : n;
                size_t na = (size_t)((ta ? k : m) * lda), nb = (size_t)((tb ? n : k) * ldb);
                double *v = xalloc((na + nb) * sizeof *v);
                uint16_t *a = xalloc(na * 2), *b = xalloc(nb * 2);
                test_rng = (uint64_t)(si * 8 + (size_t)tr + 1);
                for (size_t i = 0; i < na + nb; i++) v[i] = test_round_to(dt, test_uniform(-1, 1));
                test_encode(dt, v, a, (int64_t)na);
                test_encode(dt, v + na, b, (int64_t)nb);
                size_t nc = (size_t)(m * n);
                float *c512 = xalloc(nc * 4), *c2 = xalloc(nc * 4);
                uint16_t *l512 = xalloc(nc * 2), *l2 = xalloc(nc * 2);
                gemm_lowp_args g = {dt, ALLOY_F32, ta, tb, m, n, k, lda, ldb, 0, NULL, NULL, NULL, a, b, c512, NULL, 0};
                assert_int_equal(gemm_lowp(&g, OPT_LOWP_AVX512, NULL, 1), ALLOY_OK);
                g.c = c2;
                assert_int_equal(gemm_lowp(&g, OPT_LOWP_AVX2, NULL, 1), ALLOY_OK);
                g.out_dtype = dt, g.c = l512;
                assert_int_equal(gemm_lowp(&g, OPT_LOWP_AVX512, NULL, 1), ALLOY_OK);
                g.c = l2;
                assert_int_equal(gemm_lowp(&g, OPT_LOWP_AVX2, NULL, 1), ALLOY_OK);
                if (memcmp(c512, c2, nc * 4) != 0 || memcmp(l512, l2, nc * 2) != 0)
                    fail_msg("%s %c%c %lldx%lldx%lld: avx2 and avx512 differ", alloy_dtype_name(dt), ta ? 'T' : 'N',
                             tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k);
                al_free(v), al_free(a), al_free(b), al_free(c512), al_free(c2), al_free(l512), al_free(l2);
            }
}

/* An operand's layout changes no bit: each kernel packs op(A) and op(B)
 * into the same panels whether their rows run along k (the 8 x 8 register
 * transposes of avx2's packing, avx512's pack_by_rows) or across it, so
 * the product of the transposed operands, copied, is the product of the
 * originals bit for bit; k and the strips' rows off the 8 x 8 blocks, f16
 * and bf16, every kernel this CPU runs. */
static void test_an_operands_layout_changes_no_bit(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 17, 9}, {13, 31, 23}, {29, 65, 200}, {6, 16, 8}};
    for (int ki = 0; ki < NKERNELS; ki++)
        for (int dti = 0; dti < 2; dti++) {
            alloy_dtype dt = dti ? ALLOY_BF16 : ALLOY_F16;
            if (!runs_here(kernels[ki], dt)) continue;
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
                size_t na = (size_t)(m * k), nb = (size_t)(k * n), nc = (size_t)(m * n);
                double *v = xalloc((na + nb) * sizeof *v);
                uint16_t *a = xalloc(na * 2), *b = xalloc(nb * 2), *at = xalloc(na * 2), *bt = xalloc(nb * 2);
                test_rng = (uint64_t)(si + 1);
                for (size_t i = 0; i < na + nb; i++) v[i] = test_round_to(dt, test_uniform(-1, 1));
                test_encode(dt, v, a, (int64_t)na);
                test_encode(dt, v + na, b, (int64_t)nb);
                for (int64_t i = 0; i < m; i++) /* at: A^T, [k, m]; bt: B^T, [n, k] */
                    for (int64_t p = 0; p < k; p++) at[p * m + i] = a[i * k + p];
                for (int64_t p = 0; p < k; p++)
                    for (int64_t j = 0; j < n; j++) bt[j * k + p] = b[p * n + j];
                float *c = xalloc(nc * 4), *ct = xalloc(nc * 4);
                gemm_lowp_args g = {dt, ALLOY_F32, false, false, m, n, k, k, n, 0, NULL, NULL, NULL, a, b, c, NULL, 0};
                assert_int_equal(gemm_lowp(&g, kernels[ki], NULL, 1), ALLOY_OK);
                gemm_lowp_args gt = {dt, ALLOY_F32, true, true, m, n, k, m, k, 0, NULL, NULL, NULL, at, bt, ct, NULL, 0};
                assert_int_equal(gemm_lowp(&gt, kernels[ki], NULL, 1), ALLOY_OK);
                if (memcmp(c, ct, nc * 4) != 0)
                    fail_msg("%s %s %lldx%lldx%lld: the transposed operands' product differs",
                             gemm_lowp_kernel_name(kernels[ki]), alloy_dtype_name(dt), (long long)m, (long long)n,
                             (long long)k);
                al_free(v), al_free(a), al_free(b), al_free(at), al_free(bt), al_free(c), al_free(ct);
            }
        }
}

/* Each kernel's f16 or bf16 C is its own f32 C rounded once by
 * cvt_f32_to_f16 / cvt_f32_to_bf16, bit for bit (the kernels that round in
 * registers, avx512's and avx2's, and those that round a buffer), on edge
 * tiles of every shape (rows past a tile's or not, columns past 16 or not)
 * and every transpose, and where the sums are subnormal in C's dtype (the
 * last k block's sum added to the earlier blocks' cancels to below its
 * smallest normal: every 9th row), overflow to inf (row 1) or are NaN
 * (row 2). */
static void test_a_rounded_c_is_the_f32_sums_rounded(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {{64, 32, 64}, {64, 64, 32}, {10, 76, 600}, {8, 16, 520},
                                        {23, 45, 7},  {14, 32, 520}, {30, 17, 513}, {7, 21, 400}};
    for (int ki = 0; ki < NKERNELS; ki++)
        for (int dti = 0; dti < 2; dti++) {
            alloy_dtype dt = dti ? ALLOY_F16 : ALLOY_BF16;
            if (!runs_here(kernels[ki], dt)) continue;
            /* planted: p * 1.5p in the first k block, -p * p in the last: a sum of p^2 / 2, below the smallest
             * normal of dt (2^-126 for bf16, 2^-14 for f16); big * big past dt's largest finite */
            double p = dt == ALLOY_F16 ? 0x1p-8 : 0x1p-63, big = dt == ALLOY_F16 ? 0x1p15 : 0x1p100;
            float tiny = dt == ALLOY_F16 ? 0x1p-14f : 0x1p-126f;
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                for (int tr = 0; tr < 4; tr++) {
                    int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
                    bool ta = tr & 1, tb = tr & 2;
                    int64_t lda = ta ? m : k, ldb = tb ? k : n;
                    double *av = xalloc((size_t)(m * k) * sizeof *av), *bv = xalloc((size_t)(k * n) * sizeof *bv);
                    test_rng = (uint64_t)(si * 4 + (size_t)tr + 77);
                    for (int64_t i = 0; i < m * k; i++) av[i] = test_round_to(dt, test_uniform(-1, 1));
                    for (int64_t i = 0; i < k * n; i++) bv[i] = test_round_to(dt, test_uniform(-1, 1));
                    /* av and bv as op(A) (m x k) and op(B) (k x n); planted rows (k > 384: k 0 and k - 1 in
                     * different k blocks of alloy's kernels, whose blocks are at most 384 deep) */
                    bool planted = k > 384;
                    if (planted)
                        for (int64_t kk = 0; kk < k; kk++)
                            for (int64_t row = 0; row < m; row += 9) {
                                av[row * k + kk] = kk == 0 ? p : kk == k - 1 ? -p : 0.0;
                                if (row == 0)
                                    for (int64_t j = 0; j < n; j++)
                                        bv[kk * n + j] = kk == 0 ? 1.5 * p : kk == k - 1 ? p : bv[kk * n + j];
                            }
                    if (m > 2) {
                        av[1 * k] = big, bv[0] = big; /* and the rest of row 1 finite: inf once rounded */
                        av[2 * k + k - 1] = NAN;
                    }
                    uint16_t *a = xalloc((size_t)(m * k) * 2), *b = xalloc((size_t)(k * n) * 2);
                    double *t = xalloc((size_t)(m * k + k * n) * sizeof *t);
                    for (int64_t i = 0; i < m; i++) /* stored as A (k x m when ta) */
                        for (int64_t kk = 0; kk < k; kk++) t[ta ? kk * lda + i : i * lda + kk] = av[i * k + kk];
                    test_encode(dt, t, a, m * k);
                    for (int64_t kk = 0; kk < k; kk++)
                        for (int64_t j = 0; j < n; j++) t[tb ? j * ldb + kk : kk * ldb + j] = bv[kk * n + j];
                    test_encode(dt, t, b, k * n);
                    float *c = xalloc((size_t)(m * n) * 4);
                    uint16_t *h = xalloc((size_t)(m * n) * 2);
                    gemm_lowp_args g = {dt, ALLOY_F32, ta, tb, m, n, k, lda, ldb, 0, NULL, NULL, NULL, a, b, c, NULL, 0};
                    assert_int_equal(gemm_lowp(&g, kernels[ki], NULL, 1), ALLOY_OK);
                    g.out_dtype = dt, g.c = h;
                    assert_int_equal(gemm_lowp(&g, kernels[ki], NULL, 1), ALLOY_OK);
                    int subnormal = 0;
                    for (int64_t i = 0; i < m * n; i++) {
                        if (c[i] != 0.0f && fabsf(c[i]) < tiny) subnormal++;
                        uint16_t want = dt == ALLOY_F16 ? cvt_f32_to_f16(c[i]) : cvt_f32_to_bf16(c[i]);
                        if (h[i] != want)
                            fail_msg("%s %s %c%c %lldx%lldx%lld: element %lld is %#x, its f32 sum %a rounds to %#x",
                                     gemm_lowp_kernel_name(kernels[ki]), alloy_dtype_name(dt), ta ? 'T' : 'N',
                                     tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k, (long long)i, h[i],
                                     (double)c[i], want);
                    }
                    if (planted) assert_true(subnormal >= n - 1); /* the planted rows did reach the rounding */
                    if (m > 2) /* row 1's first sum rounds to inf, row 2's are NaN */
                        assert_true(h[n] == (dt == ALLOY_F16 ? 0x7c00 : 0x7f80) && isnan(c[2 * n]));
                    al_free(av), al_free(bv), al_free(a), al_free(b), al_free(t), al_free(c), al_free(h);
                }
        }
}

/* C laid out by stride_c and ldc (a [2, 3, m, n] product stored as [2,
 * m, 3, n] rows with a gap after each, as the attention's products write
 * their transposes' order): every element the dense product's bits in its
 * place, nothing else written (the gaps keep their NaN), for f32 and
 * rounded results, on every kernel, 1 and 2 threads, and zeros in place
 * for k == 0. */
static void test_a_laid_out_c_gets_the_dense_bits_in_its_places(void **state)
{
    (void)state;
    enum { M = 13, N = 20, K = 9, GAP = 5, W = 3 * N + GAP, TOTAL = 2 * M * W };
    static const int64_t dims[2] = {2, 3}, sa[2] = {3 * M * K, M * K}, sb[2] = {3 * K * N, K * N};
    static const int64_t sc[2] = {M * W, N};
    cpu_workers *w = cpu_workers_new();
    assert_non_null(w);
    test_rng = 21;
    for (int ki = 0; ki < NKERNELS; ki++)
        for (int d = 0; d < 2; d++) {
            alloy_dtype dt = d ? ALLOY_F16 : ALLOY_BF16;
            if (!runs_here(kernels[ki], dt)) continue;
            double av[6 * M * K], bv[6 * K * N];
            uint16_t a[6 * M * K], b[6 * K * N];
            for (int i = 0; i < 6 * M * K; i++) av[i] = test_round_to(dt, test_uniform(-1, 1));
            for (int i = 0; i < 6 * K * N; i++) bv[i] = test_round_to(dt, test_uniform(-1, 1));
            test_encode(dt, av, a, 6 * M * K);
            test_encode(dt, bv, b, 6 * K * N);
            for (int o = 0; o < 2; o++)
                for (int threads = 1; threads <= 2; threads++)
                    for (int64_t k = K; k >= 0; k -= K) {
                        alloy_dtype out = o ? dt : ALLOY_F32;
                        size_t es = alloy_dtype_size(out);
                        char dense[6 * M * N * 4], laid[TOTAL * 4];
                        memset(laid, 0xff, sizeof laid); /* NaN in every dtype */
                        gemm_lowp_args g = {dt, out, false, false, M, N, k, K, N, 2, dims, sa, sb, a, b, dense, NULL, 0};
                        assert_int_equal(gemm_lowp(&g, kernels[ki], w, threads), ALLOY_OK);
                        g.c = laid, g.stride_c = sc, g.ldc = W;
                        assert_int_equal(gemm_lowp(&g, kernels[ki], w, threads), ALLOY_OK);
                        bool written[TOTAL] = {false};
                        for (int bi = 0; bi < 6; bi++)
                            for (int i = 0; i < M; i++) {
                                int64_t at = bi / 3 * sc[0] + bi % 3 * sc[1] + i * W;
                                for (int j = 0; j < N; j++) written[at + j] = true;
                                if (memcmp(laid + (size_t)at * es, dense + (size_t)((bi * M + i) * N) * es, N * es))
                                    fail_msg("%s %s -> %s k %lld, %d threads: batch %d row %d differs from the dense "
                                             "product",
                                             gemm_lowp_kernel_name(kernels[ki]), alloy_dtype_name(dt),
                                             alloy_dtype_name(out), (long long)k, threads, bi, i);
                            }
                        for (int i = 0; i < TOTAL; i++) {
                            static const char nan_bytes[4] = {-1, -1, -1, -1};
                            if (!written[i] && memcmp(laid + (size_t)i * es, nan_bytes, es))
                                fail_msg("%s: element %d between the laid-out rows was written",
                                         gemm_lowp_kernel_name(kernels[ki]), i);
                        }
                        if (k == 0)
                            for (int i = 0; i < 6 * M * N * (int)es; i++) assert_int_equal(dense[i], 0);
                    }
        }
    cpu_workers_free(w);
}

/* An f32 C whose rows are 4 KiB apart (ldc 1024: its tiles' sums are
 * made in a buffer and copied) against the same product into a dense C
 * (summed in place): the same bits in every
 * place, the rest of each row untouched; both within f32 rounding of the
 * f64 sums. Shapes past one k block and with edge tiles, A packed (n > 128)
 * or transposed, on every kernel, 1 and 2 threads. */
static void test_an_f32_c_of_4_kib_rows_gets_the_dense_bits(void **state)
{
    (void)state;
    enum { LDC = 1024 };
    static const int64_t shapes[][4] = {{40, 200, 600, 0}, {29, 70, 601, 1}, {120, 300, 257, 1}, {3, 1000, 2, 0}};
    cpu_workers *w = cpu_workers_new();
    assert_non_null(w);
    test_rng = 31;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
        bool ta = shapes[si][3] != 0;
        double *av = xalloc(sizeof(double) * (size_t)(m * k)), *bv = xalloc(sizeof(double) * (size_t)(k * n));
        uint16_t *a = xalloc(2 * (size_t)(m * k)), *b = xalloc(2 * (size_t)(k * n));
        float *dense = xalloc(4 * (size_t)(m * n)), *laid = xalloc(4 * (size_t)(m * LDC));
        for (int di = 0; di < 2; di++) {
            alloy_dtype dt = di ? ALLOY_F16 : ALLOY_BF16;
            for (int64_t i = 0; i < m * k; i++) av[i] = test_round_to(dt, test_uniform(-1, 1));
            for (int64_t i = 0; i < k * n; i++) bv[i] = test_round_to(dt, test_uniform(-1, 1));
            test_encode(dt, av, a, (size_t)(m * k));
            test_encode(dt, bv, b, (size_t)(k * n));
            for (int ki = 0; ki < NKERNELS; ki++) {
                if (gemm_lowp_kernel(dt, kernels[ki]) != kernels[ki]) continue;
                for (int threads = 1; threads <= 2; threads++) {
                    gemm_lowp_args g = {dt, ALLOY_F32, ta, false, m, n, k, ta ? m : k, n, 0, NULL, NULL, NULL,
                                        a, b, dense, NULL, 0};
                    assert_int_equal(gemm_lowp(&g, kernels[ki], w, threads), ALLOY_OK);
                    static const int64_t no_batch[1] = {0};
                    memset(laid, 0xff, 4 * (size_t)(m * LDC)); /* NaN */
                    g.c = laid, g.stride_c = no_batch, g.ldc = LDC;
                    assert_int_equal(gemm_lowp(&g, kernels[ki], w, threads), ALLOY_OK);
                    for (int64_t i = 0; i < m; i++) {
                        if (memcmp(laid + i * LDC, dense + i * n, 4 * (size_t)n))
                            fail_msg("%s %s %lldx%lldx%lld%s, %d threads: row %lld differs from the dense C's",
                                     gemm_lowp_kernel_name(kernels[ki]), alloy_dtype_name(dt), (long long)m,
                                     (long long)n, (long long)k, ta ? " (A^T)" : "", threads, (long long)i);
                        for (int64_t j = n; j < LDC; j++)
                            if (!isnan(laid[i * LDC + j])) fail_msg("row %lld: column %lld written", (long long)i, (long long)j);
                    }
                }
            }
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double ref = 0.0, mag = 0.0;
                    for (int64_t kk = 0; kk < k; kk++) {
                        double x = ta ? av[kk * m + i] : av[i * k + kk];
                        ref += x * bv[kk * n + j], mag += fabs(x * bv[kk * n + j]);
                    }
                    if (fabs((double)dense[i * n + j] - ref) > (double)(k + 2) * 0x1p-24 * mag)
                        fail_msg("%s %lldx%lldx%lld: C[%lld, %lld] = %g, f64 %g", alloy_dtype_name(dt), (long long)m,
                                 (long long)n, (long long)k, (long long)i, (long long)j, (double)dense[i * n + j], ref);
                }
        }
        al_free(av), al_free(bv), al_free(a), al_free(b), al_free(dense), al_free(laid);
    }
    cpu_workers_free(w);
}

/* Operands packed by the one tile that reads them, a k block at a time
 * (A where C is one tile block wide, B where it is one high, each packed
 * at least 256 KiB), against f64, and bit for bit against the same
 * product with both operands broadcast over 2 batches (packed whole
 * first, as an operand every batch reads is) and on 1 and 2 threads (a C
 * of 128 rows is one block high on 1 thread, two on 2): k odd and past
 * several k blocks, every transpose, every kernel. */
static void test_operands_packed_by_their_tile_give_the_bits_of_whole_panels(void **state)
{
    (void)state;
    static const lowp_shape shapes[] = {{300, 20, 1201, 0, {0}, {0}, {0}},
                                        {20, 300, 1201, 0, {0}, {0}, {0}},
                                        {128, 200, 1201, 0, {0}, {0}, {0}}}; /* one block high on 1 thread only */
    cpu_workers *w = cpu_workers_new();
    assert_non_null(w);
    test_rng = 41;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t m = shapes[si].m, n = shapes[si].n, k = shapes[si].k;
        uint16_t *a = xalloc(2 * (size_t)(m * k)), *b = xalloc(2 * (size_t)(k * n));
        float *one = xalloc(4 * (size_t)(m * n)), *two = xalloc(8 * (size_t)(m * n)), *first = xalloc(4 * (size_t)(m * n));
        for (int ki = 0; ki < NKERNELS; ki++)
            for (int d = 0; d < 2; d++) {
                alloy_dtype dt = d ? ALLOY_F16 : ALLOY_BF16;
                if (gemm_lowp_kernel(dt, kernels[ki]) != kernels[ki]) continue;
                for (int64_t i = 0; i < m * k; i++) {
                    double v = test_uniform(-1, 1);
                    test_encode(dt, &v, a + i, 1);
                }
                for (int64_t i = 0; i < k * n; i++) {
                    double v = test_uniform(-1, 1);
                    test_encode(dt, &v, b + i, 1);
                }
                for (int t = 0; t < 4; t++)
                    for (int threads = 1; threads <= 2; threads++) {
                        bool ta = t & 1, tb = t & 2;
                        if (threads == 1) check(kernels[ki], dt, ta, tb, &shapes[si], w, 1);
                        static const int64_t dims[1] = {2}, zero[1] = {0};
                        gemm_lowp_args g = {dt, ALLOY_F32, ta, tb, m, n, k, ta ? m : k, tb ? k : n, 0, NULL, NULL,
                                            NULL, a, b, one, NULL, 0};
                        assert_int_equal(gemm_lowp(&g, kernels[ki], w, threads), ALLOY_OK);
                        if (threads == 1) memcpy(first, one, 4 * (size_t)(m * n));
                        else if (kernels[ki] != OPT_LOWP_SGEMM && memcmp(first, one, 4 * (size_t)(m * n)))
                            fail_msg("%s %s %c%c %lldx%lldx%lld: 2 threads give other bits than 1",
                                     gemm_lowp_kernel_name(kernels[ki]), alloy_dtype_name(dt), ta ? 'T' : 'N',
                                     tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k);
                        g.batch_rank = 1, g.batch_dims = dims, g.stride_a = zero, g.stride_b = zero, g.c = two;
                        assert_int_equal(gemm_lowp(&g, kernels[ki], w, threads), ALLOY_OK);
                        for (int bi = 0; bi < 2; bi++)
                            if (memcmp(two + bi * m * n, one, 4 * (size_t)(m * n)))
                                fail_msg("%s %s %c%c %lldx%lldx%lld, %d threads: batch %d of the broadcast product "
                                         "differs",
                                         gemm_lowp_kernel_name(kernels[ki]), alloy_dtype_name(dt), ta ? 'T' : 'N',
                                         tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k, threads, bi);
                    }
            }
        al_free(a), al_free(b), al_free(one), al_free(two), al_free(first);
    }
    cpu_workers_free(w);
}

/* Out of memory for the packing buffer: ALLOY_ERR_OOM, C untouched. */
static void test_out_of_memory_is_an_error(void **state)
{
    (void)state;
    uint16_t a[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80};
    float c[4] = {7, 7, 7, 7};
    gemm_lowp_args g = {ALLOY_BF16, ALLOY_F32, false, false, 2, 2, 2, 2, 2, 0, NULL, NULL, NULL, a, a, c, NULL, 0};
    for (int ki = 0; ki < NKERNELS; ki++) {
        test_alloc_budget = 0;
        alloy_set_allocator(test_budget_realloc, NULL);
        alloy_status st = gemm_lowp(&g, kernels[ki], NULL, 1);
        alloy_set_allocator(NULL, NULL);
        test_alloc_budget = -1;
        assert_int_equal(st, ALLOY_ERR_OOM);
        for (int i = 0; i < 4; i++) assert_true(c[i] == 7.0f);
    }
}

/* gemm_lowp_epi (a GEMM step's epilogue in the tiles) gives, bit for bit,
 * the f32 sums from gemm_lowp put through the same steps by hand: the
 * range rule (fz_range_copy_f32's: |x| >= 65520 in f16, >= 0x1.ffp127 in
 * bf16 is that inf), the bias added in f32, the sum stored rounded, the
 * activation's chunk function (relu, gelu_tanh) and one cvt_store_f32: on
 * every kernel this CPU runs, shapes with edge tiles and several k blocks,
 * one and two threads. Modes: 0 range rule + bias, 1 bias alone, 2 range
 * rule alone, 3 range rule + bias (stored, ranged) + gelu_tanh (ranged),
 * 4 bias + relu. Row 0 of C sums to the rule's bound exactly (f16: 256 x
 * 256 = 65536; bf16: 2^127 x 0x1.fep0 + 2^119 = 0x1.ffp127) and every
 * third column's bias brings it back under the bound (-32768; -2^127):
 * inf under the rule, a finite value without it, so dropping the rule
 * fails here. */
static void test_an_epilogue_in_the_tiles_gives_the_epilogue_groups_bits(void **state)
{
    (void)state;
    cpu_workers *w = cpu_workers_new();
    assert_non_null(w);
    static const int64_t shapes[][3] = {{37, 45, 70}, {150, 96, 600}, {20, 512, 128}};
    for (int di = 0; di < 2; di++)
        for (size_t ki = 0; ki < NKERNELS; ki++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                for (int mode = 0; mode < 5; mode++) {
                    alloy_dtype dt = di ? ALLOY_BF16 : ALLOY_F16;
                    opt_lowp_gemm kernel = kernels[ki];
                    if (gemm_lowp_kernel(dt, kernel) != kernel && kernel != OPT_LOWP_SGEMM) continue;
                    int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
                    bool bf = dt == ALLOY_BF16;
                    double a0 = bf ? 0x1p127 : 256, a1 = bf ? 0x1p119 : 0, b0 = bf ? 0x1.fep0 : 256;
                    double pull = bf ? -0x1p127 : -32768;
                    double *av = xalloc(sizeof(double) * (size_t)(m * k)), *bv = xalloc(sizeof(double) * (size_t)(k * n));
                    uint16_t *a = xalloc(2 * (size_t)(m * k)), *b = xalloc(2 * (size_t)(k * n));
                    test_rng = 7 + (uint64_t)si;
                    for (int64_t i = 0; i < m * k; i++) /* row 0: a0, a1, then zeros */
                        av[i] = i < k ? (i == 0 ? a0 : i == 1 ? a1 : 0) : test_round_to(dt, test_uniform(-1, 1));
                    for (int64_t i = 0; i < k * n; i++) /* B's row 0 b0, row 1 ones */
                        bv[i] = i < n ? b0 : i < 2 * n ? 1 : test_round_to(dt, test_uniform(-1, 1));
                    test_encode(dt, av, a, m * k);
                    test_encode(dt, bv, b, k * n);
                    float *bias = xalloc(sizeof(float) * (size_t)n), *sums = xalloc(sizeof(float) * (size_t)(m * n));
                    for (int64_t j = 0; j < n; j++)
                        bias[j] = (float)(j % 3 == 0 ? pull : test_round_to(dt, test_uniform(-2, 2)));
                    uint16_t *got = xalloc(2 * (size_t)(m * n)), *want = xalloc(2 * (size_t)(m * n));
                    uint16_t *gsum = xalloc(2 * (size_t)(m * n)), *wsum = xalloc(2 * (size_t)(m * n));
                    float *y = xalloc(sizeof(float) * (size_t)(m * n));
                    gemm_lowp_args g = {dt, ALLOY_F32, false, false, m, n, k, k, n, 0, NULL, NULL, NULL, a, b, sums, NULL, 0};
                    for (int threads = 1; threads <= 2; threads++) {
                        g.out_dtype = ALLOY_F32, g.c = sums;
                        assert_int_equal(gemm_lowp(&g, kernel, w, threads), ALLOY_OK);
                        gemm_lowp_epilogue epi = {.range = mode == 1 || mode == 4 ? ALLOY_F32 : dt,
                                                  .bias = mode == 2 ? NULL : bias,
                                                  .bias_range = mode == 3 ? dt : ALLOY_F32,
                                                  .sum_out = mode == 3 ? gsum : NULL,
                                                  .act = mode == 3   ? fz_kernels[IR_OP_gelu_tanh].f32
                                                         : mode == 4 ? fz_kernels[IR_OP_relu].f32
                                                                     : NULL};
                        float limit = dt == ALLOY_F16 ? 65520.0f : 0x1.ffp127f;
                        int passed = 0;
                        for (int64_t i = 0; i < m * n; i++) {
                            float v = sums[i];
                            passed += fabsf(v) >= limit;
                            if (epi.range != ALLOY_F32) v = fabsf(v) >= limit ? copysignf(INFINITY, v) : v;
                            if (epi.bias) v = v + epi.bias[i % n];
                            if (epi.bias_range != ALLOY_F32) v = fabsf(v) >= limit ? copysignf(INFINITY, v) : v;
                            sums[i] = v;
                        }
                        if (epi.sum_out) cvt_store_f32(dt, sums, wsum, (size_t)(m * n));
                        if (epi.act) {
                            epi.act(m * n, y, sums, sums, sums, NULL);
                            for (int64_t i = 0; i < m * n; i++) /* the act's range rule (mode 3) before the store */
                                sums[i] = mode == 3 && fabsf(y[i]) >= limit ? copysignf(INFINITY, y[i]) : y[i];
                        }
                        cvt_store_f32(dt, sums, want, (size_t)(m * n));
                        g.out_dtype = dt, g.c = got;
                        memset(got, 0x7e, 2 * (size_t)(m * n));
                        assert_int_equal(gemm_lowp_epi(&g, &epi, kernel, w, threads), ALLOY_OK);
                        if (mode != 1 && mode != 4) assert_int_equal(passed, n); /* row 0 reaches the bound, no other row */
                        for (int64_t i = 0; i < m * n; i++)
                            if (got[i] != want[i] || (epi.sum_out && gsum[i] != wsum[i]))
                                fail_msg("%s %s %lldx%lldx%lld mode %d, %d threads: C[%lld] is 0x%04x (sum 0x%04x), by "
                                         "hand 0x%04x (0x%04x)", gemm_lowp_kernel_name(gemm_lowp_kernel(dt, kernel)),
                                         alloy_dtype_name(dt), (long long)m, (long long)n, (long long)k, mode, threads,
                                         (long long)i, got[i], gsum[i], want[i], wsum[i]);
                    }
                    g.out_dtype = ALLOY_F32, g.c = sums; /* an f32 C has no such epilogue */
                    gemm_lowp_epilogue none = {.range = ALLOY_F32};
                    assert_int_equal(gemm_lowp_epi(&g, &none, kernel, w, 1), ALLOY_ERR_INVALID);
                    al_free(av), al_free(bv), al_free(a), al_free(b), al_free(bias), al_free(sums), al_free(got),
                        al_free(want), al_free(gsum), al_free(wsum), al_free(y);
                }
    cpu_workers_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_choice),
        cmocka_unit_test(test_exact_small_product),
        cmocka_unit_test(test_empty_dimensions),
        cmocka_unit_test(test_bf16_odd_shapes_match_f64_on_every_kernel),
        cmocka_unit_test(test_f16_odd_shapes_match_f64_on_every_kernel),
        cmocka_unit_test(test_batches_follow_their_strides),
        cmocka_unit_test(test_same_bits_on_any_thread_count),
        cmocka_unit_test(test_avx2_gives_the_bits_of_avx512),
        cmocka_unit_test(test_an_operands_layout_changes_no_bit),
        cmocka_unit_test(test_a_rounded_c_is_the_f32_sums_rounded),
        cmocka_unit_test(test_a_laid_out_c_gets_the_dense_bits_in_its_places),
        cmocka_unit_test(test_an_f32_c_of_4_kib_rows_gets_the_dense_bits),
        cmocka_unit_test(test_operands_packed_by_their_tile_give_the_bits_of_whole_panels),
        cmocka_unit_test(test_out_of_memory_is_an_error),
        cmocka_unit_test(test_an_epilogue_in_the_tiles_gives_the_epilogue_groups_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
