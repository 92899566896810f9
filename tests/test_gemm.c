/* test_gemm.c - the CPU GEMM (BLAS, portable f32 kernel, f64, products cut into pieces over threads) against a long double triple loop. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "alloy_config.h"
#include "runtime/cpu/gemm.h"
#include "support.h"

extern char **environ;

typedef void (*gemm_f32_fn)(bool, bool, int64_t, int64_t, int64_t, float, const float *, int64_t,
                            const float *, int64_t, float, float *, int64_t);

/* Which implementation a check runs: an f32 entry point, or gemm_f64. */
typedef struct impl {
    const char *name;
    gemm_f32_fn f32; /* NULL: gemm_f64 */
} impl;

static const impl impl_portable = {"gemm_f32_portable", gemm_f32_portable};
static const impl impl_dispatch = {"gemm_f32", gemm_f32};
static const impl impl_f64 = {"gemm_f64", NULL};

static bool use_blas = true; /* the blas option of this round of the suite */


/* Uniform in [-1, 1), exactly representable in f32 (24-bit mantissa). */
static float rnd(void)
{
    return (float)((int32_t)(test_next_u64() >> 40) - (1 << 23)) / (float)(1 << 23);
}

static void *xalloc(size_t n)
{
    void *p = al_malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* Shapes that hit every edge: unit dimensions, sizes off the 6 x 8 register
 * tile and the 96 / 384 / 3072 cache blocks, k == 0, and products large
 * enough to be split over threads. */
static const int64_t shapes[][3] = {
    {1, 1, 1},     {1, 1, 17},    {1, 17, 3},    {3, 1, 17},    {17, 3, 1},   {3, 3, 3},
    {6, 8, 384},   {7, 9, 385},   {5, 7, 0},     {17, 17, 17},  {1, 129, 65}, {129, 1, 65},
    {65, 65, 1},   {65, 129, 17}, {129, 65, 129}, {121, 17, 513}, {7, 3100, 5}, {130, 200, 300},
    {200, 131, 65},
};

/* alpha, beta; beta == 0 runs with C full of NaN, which must not show. */
static const float scalars[][2] = {{1.0f, 0.0f}, {0.5f, -1.5f}, {-2.0f, 1.0f}, {0.0f, 0.5f},
                                   {0.0f, 0.0f}, {1.0f, 1.0f}};

/* One product checked element by element against a long double reference:
 * with u = eps/2, |fl(x.y) - x.y| <= k*u/(1 - k*u) * |x|.|y| for any summation
 * order, and alpha, beta and the final add cost a few u more, so
 * |C - ref| <= (k + 3) * eps * (|alpha| |op(A)| |op(B)| + |beta| |C0|)
 * bounds the error of every correct implementation (eps of the tested type;
 * for f64 it also covers the reference's own rounding). Elements of every
 * operand outside the m x n x k product (the lda/ldb/ldc padding) hold NaN or
 * a sentinel: reading or writing them fails the check. */
static void check(const impl *im, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                  float beta, int pad)
{
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int64_t lda = ac + pad, ldb = bc + pad + 1, ldc = n + 2 * pad;
    size_t na = (size_t)(ar * lda), nb = (size_t)(br * ldb), nc = (size_t)(m * ldc);
    double *a = xalloc(na * sizeof *a), *b = xalloc(nb * sizeof *b);
    double *c0 = xalloc(nc * sizeof *c0), *c = xalloc(nc * sizeof *c);
    float *af = xalloc(na * sizeof *af), *bf = xalloc(nb * sizeof *bf);
    float *cf = xalloc(nc * sizeof *cf);
    for (size_t i = 0; i < na; i++) a[i] = (int64_t)i % lda < ac ? rnd() : NAN;
    for (size_t i = 0; i < nb; i++) b[i] = (int64_t)i % ldb < bc ? rnd() : NAN;
    for (size_t i = 0; i < nc; i++)
        c0[i] = (int64_t)i % ldc >= n ? 1234.5 : beta == 0.0f ? NAN : rnd();
    for (size_t i = 0; i < na; i++) af[i] = (float)a[i];
    for (size_t i = 0; i < nb; i++) bf[i] = (float)b[i];
    for (size_t i = 0; i < nc; i++) cf[i] = (float)c0[i];
    memcpy(c, c0, nc * sizeof *c);

    if (im->f32)
        im->f32(ta, tb, m, n, k, alpha, af, lda, bf, ldb, beta, cf, ldc);
    else
        gemm_f64(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);

    double eps = im->f32 ? FLT_EPSILON : DBL_EPSILON;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ldc; j++) {
            double got = im->f32 ? cf[i * ldc + j] : c[i * ldc + j];
            if (j >= n) { /* padding: untouched */
                if (got != 1234.5)
                    fail_msg("%s wrote C padding (%d,%d)", im->name, (int)i, (int)j);
                continue;
            }
            long double dot = 0.0L, mag = 0.0L;
            for (int64_t p = 0; p < k; p++) {
                long double x = ta ? a[p * lda + i] : a[i * lda + p];
                long double y = tb ? b[j * ldb + p] : b[p * ldb + j];
                dot += x * y;
                mag += fabsl(x * y);
            }
            double cin = c0[i * ldc + j];
            long double bc0 = beta == 0.0f ? 0.0L : (long double)beta * cin; /* NaN unread */
            long double ref = (long double)alpha * dot + bc0;
            long double scale = fabsl((long double)alpha) * mag + fabsl(bc0);
            double bound = (double)(k + 3) * eps * (double)scale;
            double err = fabs(got - (double)ref);
            if (!(err <= bound))
                fail_msg("%s ta=%d tb=%d m=%d n=%d k=%d alpha=%g beta=%g: C(%d,%d) = %.9g, "
                         "want %.9g (error %.3g > bound %.3g)",
                         im->name, ta, tb, (int)m, (int)n, (int)k, alpha, beta, (int)i, (int)j, got,
                         (double)ref, err, bound);
        }
    al_free(a), al_free(b), al_free(c0), al_free(c), al_free(af), al_free(bf), al_free(cf);
}

/* Every shape x transpose pair x alpha/beta case, with and without padding. */
static void check_all(const impl *im)
{
    test_rng = 42;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            for (size_t ab = 0; ab < sizeof scalars / sizeof scalars[0]; ab++)
                check(im, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], scalars[ab][0],
                      scalars[ab][1], (int)((s + ab + (size_t)t) % 3) * 2);
}

static void test_f32_portable(void **state)
{
    (void)state;
    check_all(&impl_portable);
}

static void test_f32_dispatch(void **state)
{
    (void)state;
    check_all(&impl_dispatch);
}

static void test_f64(void **state)
{
    (void)state;
    check_all(&impl_f64);
}

/* m == 0 or n == 0 touch nothing (pointers may be NULL); k == 0 is C = beta*C,
 * and with beta == 0 writes exact zeros over NaN. */
static void test_degenerate(void **state)
{
    (void)state;
    gemm_f32_portable(false, false, 0, 5, 5, 1.0f, NULL, 5, NULL, 5, 0.0f, NULL, 5);
    gemm_f32(true, true, 5, 0, 5, 1.0f, NULL, 5, NULL, 5, 0.0f, NULL, 5);
    gemm_f64(false, true, 0, 0, 0, 1.0, NULL, 1, NULL, 1, 0.0, NULL, 1);
    float c[6] = {NAN, NAN, NAN, 2.0f, NAN, -4.0f};
    gemm_f32(false, false, 2, 3, 0, 1.0f, NULL, 0, NULL, 3, 0.0f, c, 3);
    for (int i = 0; i < 6; i++) assert_true(c[i] == 0.0f && !signbit(c[i]));
    float d[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    gemm_f32_portable(true, false, 2, 2, 0, 1.0f, NULL, 2, NULL, 2, 0.5f, d, 2);
    assert_true(d[0] == 0.5f && d[1] == 1.0f && d[2] == 1.5f && d[3] == 2.0f);
    double e[2] = {NAN, NAN};
    gemm_f64(false, false, 1, 2, 0, 3.0, NULL, 0, NULL, 2, 0.0, e, 2);
    assert_true(e[0] == 0.0 && e[1] == 0.0);
}

/* An exact case: small integers sum exactly in any order, so every backend
 * must agree bit for bit with the hand-computed product. */
static void test_exact_small(void **state)
{
    (void)state;
    const float a[6] = {1, 2, 3, 4, 5, 6};    /* 2 x 3 */
    const float b[6] = {7, 8, 9, 10, 11, 12}; /* 3 x 2 */
    const float want[4] = {58, 64, 139, 154}; /* a * b */
    float c[4];
    gemm_f32_portable(false, false, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
    assert_memory_equal(c, want, sizeof c);
    gemm_f32(false, false, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
    assert_memory_equal(c, want, sizeof c);
    /* op(A) = a viewed 3x2 transposed -> 2x3: [[1,3,5],[2,4,6]]; op(B) = b viewed
     * 2x3 transposed -> 3x2: [[7,10],[8,11],[9,12]]. */
    gemm_f32_portable(true, true, 2, 2, 3, 1.0f, a, 2, b, 3, 0.0f, c, 2);
    const float want_tt[4] = {1 * 7 + 3 * 8 + 5 * 9, 1 * 10 + 3 * 11 + 5 * 12,
                              2 * 7 + 4 * 8 + 6 * 9, 2 * 10 + 4 * 11 + 6 * 12};
    assert_memory_equal(c, want_tt, sizeof c);
    double cd[4];
    const double ad[6] = {1, 2, 3, 4, 5, 6}, bd[6] = {7, 8, 9, 10, 11, 12};
    gemm_f64(false, false, 2, 2, 3, 1.0, ad, 3, bd, 2, 0.0, cd, 2);
    for (int i = 0; i < 4; i++) assert_true(cd[i] == (double)want[i]);
}

static void test_backend_name(void **state)
{
    (void)state;
    gemm_configure(false, 0); /* the blas option off */
    assert_string_equal(gemm_backend_name(), "portable");
    gemm_configure(true, 0);
    const char *name = gemm_backend_name();
    assert_non_null(name);
    gemm_configure(use_blas, 0);
    /* a build that found a BLAS must use it unless told not to */
    if (ALLOY_HAVE_CBLAS) assert_string_not_equal(name, "portable");
    else assert_string_equal(name, "portable");
    print_message("gemm_f32 backend: %s\n", name);
}

/* The product the --emit children write: two shapes, one split over rows and
 * one over columns when threaded, with edges in every block dimension. */
static float *emit_product(size_t *len)
{
    static const int64_t sh[2][3] = {{301, 263, 517}, {97, 389, 300}};
    size_t total = 0;
    for (int s = 0; s < 2; s++) total += (size_t)(sh[s][0] * sh[s][1]);
    float *out = xalloc(total * sizeof *out), *c = out;
    test_rng = 7;
    for (int s = 0; s < 2; s++) {
        int64_t m = sh[s][0], n = sh[s][1], k = sh[s][2];
        float *a = xalloc((size_t)(m * k) * sizeof *a), *b = xalloc((size_t)(k * n) * sizeof *b);
        for (int64_t i = 0; i < m * k; i++) a[i] = rnd();
        for (int64_t i = 0; i < k * n; i++) b[i] = rnd();
        for (int64_t i = 0; i < m * n; i++) c[i] = rnd();
        gemm_f32_portable(s == 1, s == 0, m, n, k, 0.75f, a, s == 1 ? m : k, b, s == 0 ? k : n,
                          0.5f, c, n);
        c += m * n;
        al_free(a), al_free(b);
    }
    *len = total;
    return out;
}

/* Each element is computed by one thread in a fixed order: the portable
 * kernel's result is bit-identical whatever the thread count. */
static void test_deterministic_across_threads(void **state)
{
    (void)state;
    size_t len, got_len;
    gemm_configure(use_blas, 1);
    float *one = emit_product(&len);
    static const int counts[] = {2, 3, 8};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        gemm_configure(use_blas, counts[i]);
        float *got = emit_product(&got_len);
        assert_int_equal(got_len, len);
        if (memcmp(got, one, len * sizeof(float)) != 0) fail_msg("result differs with %d threads", counts[i]);
        al_free(got);
    }
    gemm_configure(use_blas, 0);
    al_free(one);
}

/* Products big enough to be cut: rows of C when m > n, columns when n >= m. */
/* Shapes cut into pieces: the first two off every tile (33 x 600 x 120 in
 * one call gave other bits than its pieces with OpenBLAS on a Zen 4, and
 * 1024 x 320 x 160 with its Zen kernels: one thread runs the pieces too); a
 * tall product with short k, pieces of 0.54M multiply-adds; then pieces of
 * at least 2^23, square and with edges off the tiles. */
static const int64_t split_shapes[][3] = {{700, 90, 40}, {33, 600, 120}, {1024, 64, 33}, {1024, 320, 160}, {1152, 600, 129}};

/* Pieces follow the shape alone: the longer side in strips of at least
 * 256 (a multiple of 64), at most 16 of them, one below 128^3 multiply-adds. */
static void test_products_are_cut_by_their_shape_alone(void **state)
{
    (void)state;
    gemm_product p = {.m = 700, .n = 90, .k = 40};
    assert_int_equal(gemm_parts(&p), 3);
    p = (gemm_product){.m = 33, .n = 600, .k = 120};
    assert_int_equal(gemm_parts(&p), 3);
    p = (gemm_product){.m = 5000, .n = 8, .k = 100}; /* 16 strips of 320 rows */
    assert_int_equal(gemm_parts(&p), 16);
    p = (gemm_product){.m = 127, .n = 128, .k = 128}; /* below 128^3 */
    assert_int_equal(gemm_parts(&p), 1);
    p = (gemm_product){.m = 0, .n = 128, .k = 128};
    assert_int_equal(gemm_parts(&p), 0);
}

/* Cut products, every transpose, padded operands, on threads started for
 * the call: each piece's offsets into A, B and C are right. */
static void test_cut_products_match_the_reference(void **state)
{
    (void)state;
    gemm_configure(use_blas, 2);
    test_rng = 7;
    for (size_t s = 0; s < sizeof split_shapes / sizeof split_shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            for (size_t ab = 0; ab < 2; ab++) {
                check(&impl_dispatch, t & 1, t & 2, split_shapes[s][0], split_shapes[s][1], split_shapes[s][2],
                      scalars[ab][0], scalars[ab][1], 1);
                check(&impl_f64, t & 1, t & 2, split_shapes[s][0], split_shapes[s][1], split_shapes[s][2],
                      scalars[ab][0], scalars[ab][1], 1);
            }
    gemm_configure(use_blas, 0);
}

/* gemm_run on a worker pool (2 and 3 threads) or on threads of its own
 * gives the bits of one thread, f32 and f64, each shape and transpose. */
static void test_pieces_give_the_same_bits_on_any_thread_count(void **state)
{
    (void)state;
    gemm_configure(use_blas, 0);
    cpu_workers *w = cpu_workers_new();
    assert_non_null(w);
    test_rng = 11;
    for (int f64 = 0; f64 < 2; f64++)
        for (size_t s = 0; s < sizeof split_shapes / sizeof split_shapes[0]; s++)
            for (int t = 0; t < 4; t++) {
                int64_t m = split_shapes[s][0], n = split_shapes[s][1], k = split_shapes[s][2];
                size_t es = f64 ? sizeof(double) : sizeof(float), na = (size_t)(m * k), nb = (size_t)(k * n);
                char *a = xalloc(na * es), *b = xalloc(nb * es), *one = xalloc((size_t)(m * n) * es),
                     *got = xalloc((size_t)(m * n) * es);
                for (size_t i = 0; i < na; i++)
                    if (f64) ((double *)(void *)a)[i] = rnd();
                    else ((float *)(void *)a)[i] = rnd();
                for (size_t i = 0; i < nb; i++)
                    if (f64) ((double *)(void *)b)[i] = rnd();
                    else ((float *)(void *)b)[i] = rnd();
                bool ta = t & 1, tb = t & 2;
                gemm_product p = {f64, ta, tb, m, n, k, ta ? m : k, tb ? k : n, n, 0.75, 0.0, a, b, one};
                gemm_run(&p, NULL, 1);
                static const struct { bool pool; int threads; } runs[] = {{true, 2}, {true, 3}, {false, 3}};
                for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
                    memset(got, 0xff, (size_t)(m * n) * es); /* NaN: beta 0 must not read it */
                    p.c = got;
                    gemm_run(&p, runs[r].pool ? w : NULL, runs[r].threads);
                    if (memcmp(got, one, (size_t)(m * n) * es) != 0)
                        fail_msg("%s %dx%dx%d ta=%d tb=%d: %s, %d threads, differs from one thread",
                                 f64 ? "f64" : "f32", (int)m, (int)n, (int)k, ta, tb, runs[r].pool ? "pool" : "own threads",
                                 runs[r].threads);
                }
                al_free(a), al_free(b), al_free(one), al_free(got);
            }
    cpu_workers_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_name),
        cmocka_unit_test(test_exact_small),
        cmocka_unit_test(test_degenerate),
        cmocka_unit_test(test_f32_portable),
        cmocka_unit_test(test_f32_dispatch),
        cmocka_unit_test(test_f64),
        cmocka_unit_test(test_deterministic_across_threads),
        cmocka_unit_test(test_products_are_cut_by_their_shape_alone),
        cmocka_unit_test(test_cut_products_match_the_reference),
        cmocka_unit_test(test_pieces_give_the_same_bits_on_any_thread_count),
    };
    int failed = cmocka_run_group_tests_name("gemm", tests, NULL, NULL);
    /* With a BLAS, gemm_f32/gemm_f64 take their portable paths only with the
     * blas option off: the suite again so. */
    if (ALLOY_HAVE_CBLAS) {
        use_blas = false;
        failed += cmocka_run_group_tests_name("gemm (blas off)", tests, NULL, NULL);
    }
    return failed != 0;
}
