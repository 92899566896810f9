/* test_cuda_emu.c - the CUDA emulation (cuda_emu/): hand-written kernels in the emitter's style, run as host C++, checked against plain C. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_emu/emu_loader.h"
#include "support.h"

static char err[16384];

/* The kernel name compiled from source; fails the test on a compile error. */
static emu_kernel *compile_kernel(const char *source, const char *name)
{
    emu_kernel *k = emu_compile(source, name, err, sizeof err);
    if (!k) fail_msg("%s", err);
    return k;
}

/* Runs k on grid x block threads (1-D); 0 or -1 with the message in err. */
static int launch(const emu_kernel *k, unsigned grid, unsigned block, void **params)
{
    const unsigned g[3] = {grid, 1, 1}, b[3] = {block, 1, 1};
    return emu_launch(k, g, b, params, err, sizeof err);
}

static void launch_or_fail(const emu_kernel *k, unsigned grid, unsigned block, void **params)
{
    if (launch(k, grid, block, params) != 0) fail_msg("<<<%u, %u>>>: %s", grid, block, err);
}

static void *xalloc(size_t n)
{
    void *p = calloc(n ? n : 1, 1);
    assert_non_null(p);
    return p;
}

static void expect_close(const double *got, const double *ref, int64_t n, double tol)
{
    char why[512];
    if (!test_close(got, ref, n, tol, why, sizeof why)) fail_msg("%s", why);
}

/* ---- elementwise ---- */

/* Device-only code (inline PTX) sits under __CUDA_ARCH__, which the emulation leaves undefined. */
static const char elementwise_src[] =
    "static __device__ __forceinline__ float tanh_of(float x)\n"
    "{\n"
    "#ifdef __CUDA_ARCH__\n"
    "    float y;\n"
    "    asm(\"tanh.approx.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x));\n"
    "    return y;\n"
    "#else\n"
    "    return tanhf(x);\n"
    "#endif\n"
    "}\n"
    "extern \"C\" __global__ void scale_tanh(float *__restrict__ out, const float *__restrict__ x, float a, long long n)\n"
    "{\n"
    "    long long stride = (long long)gridDim.x * blockDim.x;\n"
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)\n"
    "        out[i] = a * x[i] + tanh_of(x[i]);\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void scale_tanh__host(void **p)\n"
    "{\n"
    "    scale_tanh(*(float **)p[0], *(const float **)p[1], *(float *)p[2], *(long long *)p[3]);\n"
    "}\n"
    "#endif\n";

/* 64 blocks of 256 threads cover 100k elements, about 6 each. */
static void test_grid_stride_loop_covers_more_elements_than_threads(void **state)
{
    (void)state;
    emu_kernel *k = compile_kernel(elementwise_src, "scale_tanh");
    long long n = 100000;
    float a = 0.5f, *x = xalloc((size_t)n * sizeof *x), *out = xalloc((size_t)n * sizeof *out);
    double *got = xalloc((size_t)n * sizeof *got), *ref = xalloc((size_t)n * sizeof *ref);
    for (long long i = 0; i < n; i++) x[i] = (float)test_uniform(-3, 3);
    void *params[] = {&out, &x, &a, &n};
    double t0 = test_now_ms();
    launch_or_fail(k, 64, 256, params);
    double ms = test_now_ms() - t0;
    for (long long i = 0; i < n; i++) {
        got[i] = out[i];
        ref[i] = a * x[i] + tanhf(x[i]);
    }
    expect_close(got, ref, n, 1e-6);
    print_message("emulated elementwise kernel: %.1f M elements/s (%lld elements, 64 x 256 threads, %.1f ms)\n",
                  (double)n / ms * 1e-3, n, ms);
    free(x), free(out), free(got), free(ref);
    emu_free(k);
}

/* ---- block reduction: __shared__, __syncthreads, atomicAdd ---- */

static const char block_sum_src[] =
    "template <class T>\n"
    "static __device__ void block_sum(T *__restrict__ total, const T *__restrict__ x, long long n)\n"
    "{\n"
    "    __shared__ T partial[256];\n"
    "    T acc = 0;\n"
    "    long long stride = (long long)gridDim.x * blockDim.x;\n"
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)\n"
    "        acc += x[i];\n"
    "    partial[threadIdx.x] = acc;\n"
    "    __syncthreads();\n"
    "    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {\n"
    "        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];\n"
    "        __syncthreads();\n"
    "    }\n"
    "    if (threadIdx.x == 0) atomicAdd(total, partial[0]);\n"
    "}\n"
    "extern \"C\" __global__ void __launch_bounds__(256) sum_f32(float *total, const float *x, long long n)\n"
    "{\n"
    "    block_sum(total, x, n);\n"
    "}\n"
    "extern \"C\" __global__ void __launch_bounds__(256) sum_i32(int *total, const int *x, long long n)\n"
    "{\n"
    "    block_sum(total, x, n);\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void sum_f32__host(void **p) { sum_f32(*(float **)p[0], *(const float **)p[1], *(long long *)p[2]); }\n"
    "extern \"C\" void sum_i32__host(void **p) { sum_i32(*(int **)p[0], *(const int **)p[1], *(long long *)p[2]); }\n"
    "#endif\n";

static void test_block_reduction_sums_a_million_floats(void **state)
{
    (void)state;
    emu_kernel *k = compile_kernel(block_sum_src, "sum_f32");
    long long n = 1 << 20;
    float *x = xalloc((size_t)n * sizeof *x), total = 0, *total_p = &total;
    double ref = 0;
    for (long long i = 0; i < n; i++) ref += x[i] = (float)test_uniform(0, 1);
    void *params[] = {&total_p, &x, &n};
    double t0 = test_now_ms();
    launch_or_fail(k, 120, 256, params);
    double ms = test_now_ms() - t0;
    if (fabs(total - ref) > 1e-5 * ref) fail_msg("sum %.9g, expected %.9g", total, ref);
    print_message("emulated block reduction: %.1f M elements/s (120 x 256 threads, %.1f ms)\n",
                  (double)n / ms * 1e-3, ms);
    free(x);
    emu_free(k);
}

static void test_block_reduction_sums_integers_exactly(void **state)
{
    (void)state;
    emu_kernel *k = compile_kernel(block_sum_src, "sum_i32");
    long long n = (1 << 20) + 77;
    int *x = xalloc((size_t)n * sizeof *x), total = 0, *total_p = &total;
    long long ref = 0;
    for (long long i = 0; i < n; i++) ref += x[i] = test_irand(-1000, 1000);
    void *params[] = {&total_p, &x, &n};
    launch_or_fail(k, 100, 256, params);
    assert_int_equal(total, ref);
    free(x);
    emu_free(k);
}

/* ---- warp shuffles ---- */

static const char warp_src[] =
    "template <class T>\n"
    "static __device__ void warp_sums(void *xor_out, void *down_out, const void *in)\n"
    "{\n"
    "    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    T v = ((const T *)in)[i], w = v;\n"
    "    for (int m = warpSize / 2; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);\n"
    "    for (int d = warpSize / 2; d > 0; d >>= 1) w += __shfl_down_sync(0xffffffffu, w, d);\n"
    "    ((T *)xor_out)[i] = v;\n"
    "    if (threadIdx.x % warpSize == 0) ((T *)down_out)[i / warpSize] = w;\n"
    "}\n"
    "extern \"C\" __global__ void warp_sums(void *xor_out, void *down_out, const void *in, int type, int *lanes)\n"
    "{\n"
    "    switch (type) {\n"
    "    case 0: warp_sums<float>(xor_out, down_out, in); break;\n"
    "    case 1: warp_sums<double>(xor_out, down_out, in); break;\n"
    "    case 2: warp_sums<int>(xor_out, down_out, in); break;\n"
    "    case 3: warp_sums<unsigned>(xor_out, down_out, in); break;\n"
    "    default: warp_sums<long long>(xor_out, down_out, in); break;\n"
    "    }\n"
    "    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    lanes[2 * i] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 5);\n"
    "    lanes[2 * i + 1] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 3);\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void warp_sums__host(void **p)\n"
    "{\n"
    "    warp_sums(*(void **)p[0], *(void **)p[1], *(const void **)p[2], *(int *)p[3], *(int **)p[4]);\n"
    "}\n"
    "#endif\n";

/* The shuffled types, as the kernel's type parameter numbers them. */
static const char *const shuffle_types[] = {"float", "double", "int", "unsigned", "long long"};
static const size_t shuffle_sizes[] = {sizeof(float), sizeof(double), sizeof(int), sizeof(unsigned),
                                       sizeof(long long)};

/* Element i of an array of shuffle type t: stored from, or read as, a small integer. */
static void store_as(int t, void *array, int i, long long v)
{
    switch (t) {
    case 0: ((float *)array)[i] = (float)v; break;
    case 1: ((double *)array)[i] = (double)v; break;
    case 2: ((int *)array)[i] = (int)v; break;
    case 3: ((unsigned *)array)[i] = (unsigned)v; break;
    default: ((long long *)array)[i] = v; break;
    }
}

static double load_as(int t, const void *array, int i)
{
    switch (t) {
    case 0: return ((const float *)array)[i];
    case 1: return ((const double *)array)[i];
    case 2: return ((const int *)array)[i];
    case 3: return ((const unsigned *)array)[i];
    default: return (double)((const long long *)array)[i];
    }
}

/* Each type's butterfly gives every lane the warp's sum; the down-shift
 * gives it to lane 0. Values are small integers: every sum is exact. Then
 * which lane each thread read: xor 5, and down 3 (own value past lane 31). */
static void test_warp_shuffles_sum_every_type(void **state)
{
    (void)state;
    emu_kernel *k = compile_kernel(warp_src, "warp_sums");
    enum { grid = 3, block = 128, n = grid * block, warps = n / 32 };
    long long values[n], sums[warps] = {0};
    for (int i = 0; i < n; i++) sums[i / 32] += values[i] = test_irand(0, 1000);
    int lanes[2 * n], *lanes_p = lanes;
    for (int t = 0; t < 5; t++) {
        void *in = xalloc(n * shuffle_sizes[t]), *xor_out = xalloc(n * shuffle_sizes[t]);
        void *down_out = xalloc(warps * shuffle_sizes[t]);
        for (int i = 0; i < n; i++) store_as(t, in, i, values[i]);
        void *params[] = {&xor_out, &down_out, &in, &t, &lanes_p};
        launch_or_fail(k, grid, block, params);
        for (int i = 0; i < n; i++) {
            double sum = (double)sums[i / 32], got = load_as(t, xor_out, i);
            if (got != sum)
                test_case_failed("%s: lane %d of warp %d: xor sum %g, expected %g", shuffle_types[t], i % 32, i / 32,
                                 got, sum);
        }
        for (int w = 0; w < warps; w++) {
            double got = load_as(t, down_out, w);
            if (got != (double)sums[w])
                test_case_failed("%s: warp %d: down sum %g, expected %lld", shuffle_types[t], w, got, sums[w]);
        }
        free(in), free(xor_out), free(down_out);
    }
    for (int i = 0; i < n; i++) {
        int tid = i % block, lane = i % 32;
        if (lanes[2 * i] != (tid ^ 5)) test_case_failed("thread %d: xor 5 read thread %d", tid, lanes[2 * i]);
        if (lanes[2 * i + 1] != (lane + 3 < 32 ? tid + 3 : tid))
            test_case_failed("thread %d: down 3 read thread %d", tid, lanes[2 * i + 1]);
    }
    test_end_cases();
    emu_free(k);
}

/* ---- ldmatrix: the PTX ISA's fragment layout ---- */

/* Four 8x8 matrices of b16 in shared memory, element (m, r, c) = 64 m + 8 r + c;
 * lanes 8m..8m+7 give matrix m's row addresses; each lane writes its four
 * registers of ldmatrix.x4 and of ldmatrix.x4.trans. */
static const char ldmatrix_src[] =
    "struct alignas(16) b16x8 { unsigned short e[8]; };\n"
    "extern \"C\" __global__ void ldm(unsigned *out)\n"
    "{\n"
    "    __shared__ b16x8 sm[32];\n"
    "    for (int i = threadIdx.x; i < 256; i += blockDim.x) sm[i / 8].e[i % 8] = (unsigned short)i;\n"
    "    __syncthreads();\n"
    "    const int l = threadIdx.x & 31;\n"
    "    unsigned r[4], t[4];\n"
    "    alloy_ldmatrix_x4(r, sm[(l >> 3) * 8 + (l & 7)].e);\n"
    "    alloy_ldmatrix_x4_trans(t, sm[(l >> 3) * 8 + (l & 7)].e);\n"
    "    for (int m = 0; m < 4; m++) out[l * 8 + m] = r[m], out[l * 8 + 4 + m] = t[m];\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void ldm__host(void **p) { ldm(*(unsigned **)p[0]); }\n"
    "#endif\n";

/* The PTX ISA ("ldmatrix"): lane l's register m holds row l / 4 of matrix m,
 * columns 2 (l % 4) and 2 (l % 4) + 1 (the lower in the low half); with
 * .trans, column l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1. */
static void test_ldmatrix_gives_each_lane_the_isa_fragment_plain_and_transposed(void **state)
{
    (void)state;
    emu_kernel *k = compile_kernel(ldmatrix_src, "ldm");
    unsigned out[32 * 8], *out_p = out;
    memset(out, 0xff, sizeof out);
    void *params[] = {&out_p};
    launch_or_fail(k, 1, 32, params);
    for (unsigned l = 0; l < 32; l++)
        for (unsigned m = 0; m < 4; m++) {
            unsigned plain = 64 * m + 8 * (l / 4) + 2 * (l % 4);
            unsigned want = plain | (plain + 1) << 16;
            unsigned lo = 64 * m + 8 * (2 * (l % 4)) + l / 4, hi = 64 * m + 8 * (2 * (l % 4) + 1) + l / 4;
            if (out[l * 8 + m] != want)
                test_case_failed("lane %u matrix %u: 0x%08x, expected 0x%08x", l, m, out[l * 8 + m], want);
            if (out[l * 8 + 4 + m] != (lo | hi << 16))
                test_case_failed("lane %u matrix %u, .trans: 0x%08x, expected 0x%08x", l, m, out[l * 8 + 4 + m], lo | hi << 16);
        }
    test_end_cases();
    emu_free(k);
}

/* ---- softmax: one warp per row ---- */

static const char softmax_src[] =
    "extern \"C\" __global__ void softmax_rows(float *__restrict__ y, const float *__restrict__ x, int rows, int cols)\n"
    "{\n"
    "    int row = (int)((blockIdx.x * blockDim.x + threadIdx.x) / warpSize), lane = threadIdx.x % warpSize;\n"
    "    if (row >= rows) return;\n"
    "    const float *xr = x + (long long)row * cols;\n"
    "    float *yr = y + (long long)row * cols;\n"
    "    float m = -INFINITY, s = 0.0f;\n"
    "    for (int c = lane; c < cols; c += warpSize) m = fmaxf(m, xr[c]);\n"
    "    for (int o = warpSize / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));\n"
    "    for (int c = lane; c < cols; c += warpSize) s += exp(xr[c] - m);\n"
    "    for (int o = warpSize / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);\n"
    "    float inv = 1.0f / s;\n"
    "    for (int c = lane; c < cols; c += warpSize) yr[c] = exp(xr[c] - m) * inv;\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void softmax_rows__host(void **p)\n"
    "{\n"
    "    softmax_rows(*(float **)p[0], *(const float **)p[1], *(int *)p[2], *(int *)p[3]);\n"
    "}\n"
    "#endif\n";

/* 1001 rows of 77: 4 warps a block, the last block has one row and three warps that return at once. */
static void test_softmax_runs_one_warp_per_row(void **state)
{
    (void)state;
    emu_kernel *k = compile_kernel(softmax_src, "softmax_rows");
    int rows = 1001, cols = 77, n = rows * cols;
    float *x = xalloc((size_t)n * sizeof *x), *y = xalloc((size_t)n * sizeof *y);
    double *got = xalloc((size_t)n * sizeof *got), *ref = xalloc((size_t)n * sizeof *ref);
    for (int i = 0; i < n; i++) x[i] = (float)test_uniform(-8, 8);
    void *params[] = {&y, &x, &rows, &cols};
    launch_or_fail(k, (unsigned)(rows + 3) / 4, 128, params);
    for (int r = 0; r < rows; r++) {
        double m = -INFINITY, s = 0;
        for (int c = 0; c < cols; c++) m = fmax(m, x[r * cols + c]);
        for (int c = 0; c < cols; c++) s += exp(x[r * cols + c] - m);
        for (int c = 0; c < cols; c++) ref[r * cols + c] = exp(x[r * cols + c] - m) / s;
    }
    for (int i = 0; i < n; i++) got[i] = y[i];
    expect_close(got, ref, n, 1e-6);
    free(x), free(y), free(got), free(ref);
    emu_free(k);
}

/* ---- parameters and built-in variables ---- */

static const char params_src[] =
    "extern \"C\" __global__ void params(double *__restrict__ out, int *__restrict__ where,\n"
    "                                   const unsigned short *__restrict__ bits, long long n, float scale, int offset)\n"
    "{\n"
    "    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);\n"
    "    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);\n"
    "    int *w = where + 8 * (b * blockDim.x * blockDim.y * blockDim.z + t);\n"
    "    w[0] = threadIdx.x, w[1] = threadIdx.y, w[2] = threadIdx.z, w[3] = blockIdx.x, w[4] = blockIdx.y;\n"
    "    w[5] = blockIdx.z, w[6] = blockDim.x * blockDim.y * blockDim.z, w[7] = gridDim.x * gridDim.y * gridDim.z;\n"
    "    if (t == 0 && b == 0) out[0] = (double)n, out[1] = scale, out[2] = offset, out[3] = bits[1];\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void params__host(void **p)\n"
    "{\n"
    "    params(*(double **)p[0], *(int **)p[1], *(const unsigned short **)p[2], *(long long *)p[3], *(float *)p[4],\n"
    "           *(int *)p[5]);\n"
    "}\n"
    "#endif\n";

/* Parameters of several types arrive whole; a 3-D launch numbers threads and blocks x first. */
static void test_kernel_reads_parameters_of_several_types(void **state)
{
    (void)state;
    emu_kernel *k = compile_kernel(params_src, "params");
    const unsigned grid[3] = {3, 2, 1}, block[3] = {4, 2, 3};
    enum { threads = 3 * 2 * 4 * 2 * 3 };
    double out[4] = {0}, *out_p = out;
    int where[8 * threads], *where_p = where;
    unsigned short bits[2] = {1, 0xbeef}, *bits_p = bits;
    long long n = (1LL << 40) + 5;
    float scale = -0.375f;
    int offset = -123456;
    void *params[] = {&out_p, &where_p, &bits_p, &n, &scale, &offset};
    if (emu_launch(k, grid, block, params, err, sizeof err) != 0) fail_msg("%s", err);
    assert_true(out[0] == (double)n);
    assert_true(out[1] == -0.375);
    assert_true(out[2] == -123456.0);
    assert_true(out[3] == 0xbeef);
    for (int i = 0; i < threads; i++) {
        int t = i % 24, b = i / 24;
        const int want[8] = {t % 4, t / 4 % 2, t / 8, b % 3, b / 3, 0, 24, 6};
        if (memcmp(&where[8 * i], want, sizeof want) != 0)
            test_case_failed("thread %d of block %d: threadIdx (%d,%d,%d) blockIdx (%d,%d,%d)", t, b, where[8 * i],
                             where[8 * i + 1], where[8 * i + 2], where[8 * i + 3], where[8 * i + 4], where[8 * i + 5]);
    }
    test_end_cases();
    emu_free(k);
}

/* ---- block size and barriers ---- */

static const char mirror_src[] =
    "extern \"C\" __global__ void mirror(int *__restrict__ out, int live)\n"
    "{\n"
    "    __shared__ int seen[1024];\n"
    "    unsigned t = threadIdx.x;\n"
    "    if ((int)t >= live) return;\n"
    "    seen[t] = (int)(blockIdx.x * 10000 + t);\n"
    "    __syncthreads();\n"
    "    out[blockIdx.x * blockDim.x + t] = seen[live - 1 - (int)t];\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void mirror__host(void **p) { mirror(*(int **)p[0], *(int *)p[1]); }\n"
    "#endif\n";

/* Each thread reads what the mirrored thread wrote before the barrier:
 * all 1024 threads of a block are alive at once. */
static void test_block_of_1024_threads_runs_and_1025_is_an_error(void **state)
{
    (void)state;
    emu_kernel *k = compile_kernel(mirror_src, "mirror");
    int *out = xalloc(2 * 1025 * sizeof *out), live = 1024;
    void *params[] = {&out, &live};
    launch_or_fail(k, 2, 1024, params);
    for (int i = 0; i < 2 * 1024; i++)
        if (out[i] != i / 1024 * 10000 + 1023 - i % 1024) fail_msg("out[%d] = %d", i, out[i]);

    assert_int_equal(launch(k, 1, 1025, params), -1);
    assert_non_null(strstr(err, "1025, more than 1024"));
    assert_int_equal(launch(k, 0, 32, params), -1);
    assert_non_null(strstr(err, "grid (0,1,1): dimension x is 0"));
    const unsigned grid[3] = {1, 1, 1}, block[3] = {32, 32, 2};
    assert_int_equal(emu_launch(k, grid, block, params, err, sizeof err), -1);
    assert_non_null(strstr(err, "2048 threads, more than 1024"));
    free(out);
    emu_free(k);
}

/* As on a GPU, a thread that has exited does not hold up a barrier. */
static void test_exited_threads_do_not_hold_up_a_barrier(void **state)
{
    (void)state;
    emu_kernel *k = compile_kernel(mirror_src, "mirror");
    int *out = xalloc(64 * sizeof *out), live = 40;
    void *params[] = {&out, &live};
    launch_or_fail(k, 1, 64, params);
    for (int i = 0; i < live; i++) assert_int_equal(out[i], live - 1 - i);
    free(out);
    emu_free(k);
}

/* Kernels that misuse the execution model, one per mode. Line numbers matter below. */
static const char misuse_src[] =
    "static __device__ float deep(int n)\n"
    "{\n"
    "    volatile float pad[1024];\n"
    "    pad[n % 1024] = (float)n;\n"
    "    return n > 0 ? deep(n - 1) + pad[n % 1024] : 0.0f;\n"
    "}\n"
    "extern \"C\" __global__ void misuse(float *out, int mode)\n"
    "{\n"
    "    float v = (float)threadIdx.x;\n"
    "    if (mode == 0) {\n"
    "        if (threadIdx.x < 32) __syncthreads();\n" /* line 11 */
    "        __syncthreads();\n"                       /* line 12 */
    "    } else if (mode == 1) {\n"
    "        if (threadIdx.x % 32 < 16) __syncthreads();\n"            /* line 14 */
    "        else v = __shfl_xor_sync(0xffffffffu, v, 1);\n"          /* line 15 */
    "    } else if (mode == 2) {\n"
    "        v = __shfl_down_sync(0xffffu, v, 1);\n"
    "    } else {\n"
    "        v = deep(1 << 20);\n"
    "    }\n"
    "    out[threadIdx.x] = v;\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void misuse__host(void **p) { misuse(*(float **)p[0], *(int *)p[1]); }\n"
    "#endif\n";

static void expect_launch_error(const emu_kernel *k, int mode, const char *const *parts)
{
    float out[64];
    float *out_p = out;
    void *params[] = {&out_p, &mode};
    if (launch(k, 2, 64, params) == 0) fail_msg("mode %d: the launch succeeded", mode);
    print_message("mode %d: %s\n", mode, err);
    for (; *parts; parts++)
        if (!strstr(err, *parts)) fail_msg("mode %d: \"%s\" is not in the error: %s", mode, *parts, err);
}

/* Barriers reached by only some threads are errors that name the threads and
 * lines, not hangs; so are a partial shuffle mask and a stack overflow. */
static void test_divergent_barriers_are_reported_not_hung(void **state)
{
    (void)state;
    emu_kernel *k = compile_kernel(misuse_src, "misuse");
    expect_launch_error(k, 0, (const char *const[]){"block (0,0,0): divergent __syncthreads",
                                                     "threads 0-31 in __syncthreads (line 11)",
                                                     "threads 32-63 in __syncthreads (line 12)", NULL});
    expect_launch_error(k, 1, (const char *const[]){"divergent barrier", "threads 0-15 in __syncthreads (line 14)",
                                                     "threads 16-31 in __shfl_xor_sync (line 15)", NULL});
    expect_launch_error(k, 2, (const char *const[]){"__shfl_down_sync (line 17) with mask 0xffff", NULL});
    expect_launch_error(k, 3, (const char *const[]){"block (0,0,0) thread 0 overflowed its", NULL});
    emu_free(k);
}

/* ---- the checkers (on unless ALLOY_EMU_CHECK=0) ---- */

/* One broken kernel per checker and mode, and correct ones beside them; lines matter below. */
static const char checked_src[] =
    "static __device__ void step(void) { __syncthreads(); }\n" /* line 1 */
    "extern \"C\" __global__ void checked(float *out, int mode)\n"
    "{\n"
    "    __shared__ float s[64];\n"
    "    const unsigned t = threadIdx.x;\n"
    "    float v = (float)t;\n"
    "    if (mode == 0) {\n" /* a barrier reached once by threads 32-63, twice by 0-31 */
    "        if (t < 32) step();\n"
    "        step();\n"
    "    } else if (mode == 1) {\n" /* lanes 16-31 exit before the shuffle */
    "        if (t % 32 >= 16) return;\n"
    "        v = __shfl_xor_sync(0xffffffffu, v, 16);\n" /* line 12 */
    "    } else if (mode == 2) {\n" /* half the warp shuffles at another call site */
    "        if (t % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);\n" /* line 14 */
    "        else v = __shfl_xor_sync(0xffffffffu, v, 2);\n" /* line 15 */
    "    } else if (mode == 3) {\n" /* no __syncthreads: thread 32 reads what thread 0 wrote */
    "        s[t] = v;\n"
    "        if (t >= 32) v = s[t - 32];\n"
    "    } else if (mode == 4) {\n" /* an exchange inside a warp without __syncwarp */
    "        s[t] = v;\n"
    "        v = s[t ^ 1];\n"
    "    } else if (mode == 5) {\n" /* shared memory read before anything wrote it */
    "        v = s[t];\n"
    "    } else if (mode == 9) {\n" /* threads 0-63 write different values to one word */
    "        s[0] = v;\n"
    "        step();\n"
    "        v = s[0];\n"
    "    } else if (mode == 10) {\n" /* correct: many threads write the same value (a flag) */
    "        if (t == 0) s[0] = 0;\n"
    "        step();\n"
    "        if (t % 3 == 0) s[0] = 1;\n"
    "        step();\n"
    "        v = s[0];\n"
    "    } else if (mode == 6) {\n" /* correct: across warps through __syncthreads */
    "        s[t] = v;\n"
    "        step();\n"
    "        v = s[63 - t];\n"
    "        step();\n"
    "        s[t] = 2 * v;\n"
    "        step();\n"
    "        v = s[(t + 32) % 64];\n"
    "    } else if (mode == 7) {\n" /* correct: inside a warp through __syncwarp */
    "        s[t] = v;\n"
    "        __syncwarp();\n"
    "        v = s[t ^ 1];\n"
    "        __syncwarp();\n"
    "        s[t] = v + 1;\n"
    "        __syncwarp();\n"
    "        v = s[t ^ 2];\n"
    "    } else {\n" /* correct: exits before the first barrier, full shuffles among the rest */
    "        if (t >= 32) return;\n"
    "        step();\n"
    "        v += __shfl_xor_sync(0xffffffffu, v, 16);\n"
    "    }\n"
    "    out[t] = v;\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void checked__host(void **p) { checked(*(float **)p[0], *(int *)p[1]); }\n"
    "#endif\n";

static int launch_checked(const emu_kernel *k, int mode, float *out)
{
    void *params[] = {&out, &mode};
    return launch(k, 2, 64, params);
}

static void expect_checked_error(const emu_kernel *k, int mode, const char *const *parts)
{
    float out[64];
    if (launch_checked(k, mode, out) == 0) fail_msg("mode %d: the launch succeeded", mode);
    print_message("mode %d: %s\n", mode, err);
    for (; *parts; parts++)
        if (!strstr(err, *parts)) fail_msg("mode %d: \"%s\" is not in the error: %s", mode, *parts, err);
}

/* A barrier call site reached a different number of times per thread, a full-mask shuffle
 * reading an exited lane, and one warp shuffling at two call sites are errors naming the
 * kernel, block, threads and lines. */
static void test_checkers_catch_barrier_and_shuffle_misuse(void **state)
{
    (void)state;
    if (!emu_checking()) skip(); /* ALLOY_EMU_CHECK=0 in the environment */
    emu_kernel *k = compile_kernel(checked_src, "checked");
    expect_checked_error(k, 0, (const char *const[]){"kernel checked: block (0,0,0): __syncthreads reached a different number",
                                                      "their barrier 2 (line 1)", "threads 32-63 after 1", NULL});
    expect_checked_error(k, 1, (const char *const[]){"kernel checked: block (0,0,0) thread 0:",
                                                      "__shfl_xor_sync (line 12) with the full mask reads lane 16, which has exited",
                                                      NULL});
    expect_checked_error(k, 2, (const char *const[]){"kernel checked: block (0,0,0) warp 0: lanes at different warp call sites",
                                                      "lane 0 in __shfl_xor_sync (line 14)", "lane 16 in __shfl_xor_sync (line 15)",
                                                      NULL});
    emu_free(k);
}

/* The shared-memory checker: a missing __syncthreads where the reader has the higher index
 * (which in-order fibers run correctly by luck), an exchange inside a warp without __syncwarp,
 * and a read of shared memory nothing wrote, each named with the kernel, address and threads. */
static void test_checkers_catch_shared_memory_races_and_uninitialised_reads(void **state)
{
    (void)state;
    if (!emu_checks_shared()) skip(); /* ALLOY_EMU_CHECK=0, or a ThreadSanitizer build */
    emu_kernel *k = compile_kernel(checked_src, "checked");
    expect_checked_error(k, 3, (const char *const[]){"kernel checked: block (0,0,0): race on shared memory: thread 32 reads __shared__ byte",
                                                      "which thread 0 wrote in the same barrier interval (no __syncthreads between them)",
                                                      NULL});
    /* thread 0 reads s[1] before thread 1 writes it: the write finds the read */
    expect_checked_error(k, 4, (const char *const[]){"race on shared memory: thread 1 writes __shared__ byte",
                                                      "which thread 0 read in the same barrier interval (the same warp, and no "
                                                      "__syncwarp or __syncthreads between them)",
                                                      NULL});
    expect_checked_error(k, 9, (const char *const[]){"race on shared memory: threads 0 and 1 write different values to __shared__ byte",
                                                      "in the same barrier interval", NULL});
    expect_checked_error(k, 5, (const char *const[]){"kernel checked: block (0,0,0): thread 0 reads __shared__ byte",
                                                      "which no thread of this block has written (uninitialised shared memory)",
                                                      NULL});
    emu_free(k);
}

/* Correct kernels pass every checker, with the values a GPU gives. */
static void test_checkers_pass_correct_kernels(void **state)
{
    (void)state;
    emu_kernel *k = compile_kernel(checked_src, "checked");
    float out[64];
    launch_or_fail(k, 1, 64, (void *[]){&(float *){out}, &(int){6}});
    for (int t = 0; t < 64; t++) assert_float_equal(out[t], 2.0f * (float)(63 - (t + 32) % 64), 0);
    launch_or_fail(k, 1, 64, (void *[]){&(float *){out}, &(int){7}});
    for (int t = 0; t < 64; t++) assert_float_equal(out[t], (float)((t ^ 2) ^ 1) + 1, 0);
    launch_or_fail(k, 1, 64, (void *[]){&(float *){out}, &(int){10}});
    for (int t = 0; t < 64; t++) assert_float_equal(out[t], 1, 0);
    memset(out, 0, sizeof out);
    launch_or_fail(k, 1, 64, (void *[]){&(float *){out}, &(int){8}});
    for (int t = 0; t < 32; t++) assert_float_equal(out[t], (float)(t + (t ^ 16)), 0);
    for (int t = 32; t < 64; t++) assert_float_equal(out[t], 0, 0);
    emu_free(k);
}

/* ALLOY_EMU_CHECK=0 turns the checkers off: a racy kernel compiled and launched so runs. */
static void test_checkers_are_off_under_alloy_emu_check_0(void **state)
{
    (void)state;
    if (!emu_checking()) skip();
    setenv("ALLOY_EMU_CHECK", "0", 1);
    assert_false(emu_checking());
    emu_kernel *k = emu_compile(checked_src, "checked", err, sizeof err);
    float out3[64], out0[64];
    int rc3 = k ? launch_checked(k, 3, out3) : -1, rc0 = k ? launch_checked(k, 0, out0) : -1;
    unsetenv("ALLOY_EMU_CHECK");
    if (!k) fail_msg("%s", err);
    assert_int_equal(rc3, 0);
    for (int t = 32; t < 64; t++) assert_float_equal(out3[t], (float)(t - 32), 0); /* in-order luck */
    assert_int_equal(rc0, 0);
    emu_free(k);
}

/* ---- __shared__ overruns ---- */

/* Two adjacent __shared__ arrays, declared in the emitters' forms (two declarators in one
 * declaration, a two-dimensional one, a scalar): mode 0 fills and reads them correctly; mode 1
 * writes a[n] one past a's end (into b on a GPU), mode 2 reads a[n], mode 3 reads a[-1], mode 4
 * writes m[4][0] past a two-dimensional array's end. */
static const char *const overrun_src =
    "__global__ void overrun(float *out, int mode)\n"
    "{\n"
    "    typedef float T;\n"
    "    __shared__ T a[64], b[64];\n"
    "    __shared__ int m[4][8];\n"
    "    __shared__ int any_;\n"
    "    const int t = threadIdx.x, n = 64;\n"
    "    a[t] = (float)t;\n"
    "    b[t] = 100.0f + t;\n"
    "    if (t < 32) m[t / 8][t % 8] = t;\n"
    "    if (t == 0) any_ = 7;\n"
    "    __syncthreads();\n"
    "    float v = a[63 - t] + b[t] + (float)m[(t / 8) % 4][t % 8] + (float)any_;\n"
    "    if (mode == 1 && t == 5) a[n] = 1.0f;\n"
    "    if (mode == 2 && t == 6) v = a[n + t - 6];\n"
    "    if (mode == 3 && t == 7) v = a[t - 8];\n"
    "    if (mode == 4 && t == 9) m[4][0] = 1;\n"
    "    out[t] = v;\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void overrun__host(void **p) { overrun(*(float **)p[0], *(int *)p[1]); }\n"
    "#endif\n";

static int launch_overrun(const emu_kernel *k, int mode, float *out)
{
    void *params[] = {&out, &mode};
    return launch(k, 3, 64, params);
}

/* A correct kernel with adjacent __shared__ arrays passes with the values a GPU gives. */
static void test_adjacent_shared_arrays_pass(void **state)
{
    (void)state;
    emu_kernel *k = compile_kernel(overrun_src, "overrun");
    float out[64];
    if (launch_overrun(k, 0, out) != 0) fail_msg("%s", err);
    for (int t = 0; t < 64; t++)
        assert_float_equal(out[t], (float)(63 - t) + 100.0f + t + (float)((t / 8) % 4 * 8 + t % 8) + 7.0f, 0);
    emu_free(k);
}

/* One past a __shared__ array's end (a write, a read), one before its start, and past a
 * two-dimensional one's end fail the launch naming the kernel, block, thread, array and byte. */
static void test_shared_overruns_are_caught(void **state)
{
    (void)state;
    if (!emu_checks_shared()) skip(); /* ALLOY_EMU_CHECK=0, or a ThreadSanitizer build */
#if defined(__SANITIZE_ADDRESS__)
    /* the sanitizer build compiles checked kernels with UBSan, whose bounds check stops the process at the
     * overrun (halt_on_error) before the redzone reports it: the plain build tests the redzones */
    skip();
#endif
    emu_kernel *k = compile_kernel(overrun_src, "overrun");
    float out[64];
    static const char *const want[][2] = {
        {"kernel overrun: block (0,0,0) thread 5: __shared__ overrun: writes 4 bytes at", "byte 0 past the end of __shared__ a (256 bytes)"},
        {"kernel overrun: block (0,0,0) thread 6: __shared__ overrun: reads 4 bytes at", "byte 0 past the end of __shared__ a (256 bytes)"},
        {"kernel overrun: block (0,0,0) thread 7: __shared__ overrun: reads 4 bytes at", "4 bytes before the start of __shared__ a (256 bytes)"},
        {"kernel overrun: block (0,0,0) thread 9: __shared__ overrun: writes 4 bytes at", "byte 0 past the end of __shared__ m (128 bytes)"},
    };
    for (int mode = 1; mode <= 4; mode++) {
        if (launch_overrun(k, mode, out) == 0) fail_msg("mode %d: the launch succeeded", mode);
        print_message("mode %d: %s\n", mode, err);
        for (int i = 0; i < 2; i++)
            if (!strstr(err, want[mode - 1][i])) fail_msg("mode %d: \"%s\" is not in the error: %s", mode, want[mode - 1][i], err);
    }
    emu_free(k);
}

/* The rewrite leaves forms it does not know as they are, with a comment, and rewrites the rest. */
static void test_redzone_rewrite_leaves_unknown_forms(void **state)
{
    (void)state;
    char *s = emu_redzone_rewrite("extern __shared__ float dyn[];\n__shared__ float *p;\n// __shared__ int c[2];\n"
                                  "__shared__ alloy_b128 kb_[8 * (2 + 1)], vb_[4];\n");
    assert_non_null(s);
    assert_non_null(strstr(s, "/* alloy-emu: this __shared__ declaration has no redzone (a form the rewrite does not "
                              "know) */ __shared__ float dyn[];"));
    assert_non_null(strstr(s, "*/ __shared__ float *p;"));
    assert_non_null(strstr(s, "// __shared__ int c[2];"));
    assert_non_null(strstr(s, "static struct { unsigned char lead[64]; alloy_b128 v[8 * (2 + 1)]; unsigned char trail[64]; } kb___rz_; auto &kb_ = kb___rz_.v;"));
    assert_non_null(strstr(s, "alloy_b128 v[4]; unsigned char trail[64]; } vb___rz_; auto &vb_ = vb___rz_.v;"));
    free(s);
}

/* With ALLOY_EMU_CHECK=0 the kernel is compiled as it is: the overrun is not checked. */
static void test_shared_overrun_is_not_checked_under_alloy_emu_check_0(void **state)
{
    (void)state;
    if (!emu_checking()) skip();
#if defined(__SANITIZE_ADDRESS__)
    /* an ASan build compiles an unchecked kernel with ASan, which stops the process at the overrun itself */
    skip();
#endif
    setenv("ALLOY_EMU_CHECK", "0", 1);
    emu_kernel *k = emu_compile(overrun_src, "overrun", err, sizeof err);
    float out[64];
    int rc = k ? launch_overrun(k, 2, out) : -1;
    unsetenv("ALLOY_EMU_CHECK");
    if (!k) fail_msg("%s", err);
    assert_int_equal(rc, 0);
    emu_free(k);
}

/* ---- compile errors ---- */

static void test_syntax_error_returns_the_compiler_message(void **state)
{
    (void)state;
    const char *src = "extern \"C\" __global__ void broken(float *out)\n"
                      "{\n"
                      "    out[threadIdx.x] = ;\n"
                      "}\n";
    assert_null(emu_compile(src, "broken", err, sizeof err));
    assert_non_null(strstr(err, "kernel.cu:3:"));
    assert_non_null(strstr(err, "error"));

    const char *no_trampoline = "extern \"C\" __global__ void lonely(float *out) { out[threadIdx.x] = 1.0f; }\n";
    assert_null(emu_compile(no_trampoline, "lonely", err, sizeof err));
    assert_non_null(strstr(err, "no lonely__host"));
}

int main(void)
{
    char why[256];
    if (!emu_available(why, sizeof why)) {
        printf("cuda_emu: skipped: %s\n", why);
        return 77; /* meson's skip */
    }
    test_rng = 0x5eed0c0da;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_stride_loop_covers_more_elements_than_threads),
        cmocka_unit_test(test_block_reduction_sums_a_million_floats),
        cmocka_unit_test(test_block_reduction_sums_integers_exactly),
        cmocka_unit_test(test_warp_shuffles_sum_every_type),
        cmocka_unit_test(test_ldmatrix_gives_each_lane_the_isa_fragment_plain_and_transposed),
        cmocka_unit_test(test_softmax_runs_one_warp_per_row),
        cmocka_unit_test(test_kernel_reads_parameters_of_several_types),
        cmocka_unit_test(test_block_of_1024_threads_runs_and_1025_is_an_error),
        cmocka_unit_test(test_exited_threads_do_not_hold_up_a_barrier),
        cmocka_unit_test(test_divergent_barriers_are_reported_not_hung),
        cmocka_unit_test(test_syntax_error_returns_the_compiler_message),
        cmocka_unit_test(test_checkers_catch_barrier_and_shuffle_misuse),
        cmocka_unit_test(test_checkers_catch_shared_memory_races_and_uninitialised_reads),
        cmocka_unit_test(test_checkers_pass_correct_kernels),
        cmocka_unit_test(test_checkers_are_off_under_alloy_emu_check_0),
        cmocka_unit_test(test_adjacent_shared_arrays_pass),
        cmocka_unit_test(test_shared_overruns_are_caught),
        cmocka_unit_test(test_redzone_rewrite_leaves_unknown_forms),
        cmocka_unit_test(test_shared_overrun_is_not_checked_under_alloy_emu_check_0),
    };
    return cmocka_run_group_tests_name("cuda_emu", tests, NULL, NULL);
}
