/* test_emu_numerics.c - the emulation's GPU-numerics mode (ALLOY_EMU_NUMERICS=gpu, cuda_emu/emu_gpumath.h): each CUDA math function within its documented ulp bound of the correctly rounded result and at it somewhere, both ways; a*b+c fused as NVRTC's --fmad=true does; the default mode neither; bad settings refused. */
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

/* The functions the kernel evaluates, in its order, with CUDA's maximum ulp error for each
 * (CUDA C++ Programming Guide, Mathematical Functions, single precision, full range): the
 * emitted sources' spellings (exp(float) is expf) and the C names. */
enum { NFN = 16 };
static const struct {
    const char *name;
    int ulps;
} fns[NFN] = {{"exp", 2},  {"exp2f", 2}, {"expm1", 1}, {"log", 1},  {"log2f", 1},  {"log1p", 1},
              {"sin", 2},  {"cos", 2},   {"tanh", 2},  {"erf", 2},  {"pow", 4},    {"rsqrtf", 2},
              {"expf", 2}, {"tanhf", 2}, {"erff", 2},  {"logf", 1}};

static const char math_src[] =
    "extern \"C\" __global__ void gpu_math(float *__restrict__ out, const float *__restrict__ x, long long n)\n"
    "{\n"
    "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i >= n) return;\n"
    "    const float t = x[i], p = fabs(t) + 0.1f;\n"
    "    float *o = out + i * 16;\n"
    "    o[0] = exp(t), o[1] = exp2f(t), o[2] = expm1(t), o[3] = log(p), o[4] = log2f(p), o[5] = log1p(p);\n"
    "    o[6] = sin(t), o[7] = cos(t), o[8] = tanh(t), o[9] = erf(t), o[10] = pow(p, t), o[11] = rsqrtf(p);\n"
    "    o[12] = expf(t), o[13] = tanhf(t), o[14] = erff(t), o[15] = logf(p);\n"
    "}\n"
    "extern \"C\" __global__ void multiply_add(float *__restrict__ out, const float *__restrict__ a, const float *__restrict__ b,\n"
    "                                         const float *__restrict__ c)\n"
    "{\n"
    "    out[threadIdx.x] = a[threadIdx.x] * b[threadIdx.x] + c[threadIdx.x];\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void gpu_math__host(void **p) { gpu_math(*(float **)p[0], *(const float **)p[1], *(long long *)p[2]); }\n"
    "extern \"C\" void multiply_add__host(void **p)\n"
    "{\n"
    "    multiply_add(*(float **)p[0], *(const float **)p[1], *(const float **)p[2], *(const float **)p[3]);\n"
    "}\n"
    "#endif\n";

enum { N = 4096 };

/* The correctly rounded float of function f at t (p = |t| + 0.1f as the kernel forms it), from
 * long double (64-bit significand: a float rounding it differently would need a tie within 2^-40). */
static float reference(int f, float t)
{
    long double x = t, p = (float)(fabsf(t) + 0.1f);
    long double r = 0;
    switch (f) {
    case 0: case 12: r = expl(x); break;
    case 1: r = exp2l(x); break;
    case 2: r = expm1l(x); break;
    case 3: case 15: r = logl(p); break;
    case 4: r = log2l(p); break;
    case 5: r = log1pl(p); break;
    case 6: r = sinl(x); break;
    case 7: r = cosl(x); break;
    case 8: case 13: r = tanhl(x); break;
    case 9: case 14: r = erfl(x); break;
    case 10: r = powl(p, x); break;
    default: r = 1 / sqrtl(p); break;
    }
    return (float)r;
}

/* How many floats lie from a to b (signed order of the bit patterns). */
static int64_t ulps_between(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4), memcpy(&ib, &b, 4);
    int64_t ka = ia < 0 ? (int64_t)INT32_MIN - ia : ia, kb = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return kb - ka;
}

/* Runs gpu_math over x in (-4, 4) with the current environment's mode into out (N x 16). */
static void run_math(const float *x, float *out)
{
    emu_kernel *k = emu_compile(math_src, "gpu_math", err, sizeof err);
    if (!k) fail_msg("%s", err);
    long long n = N;
    void *params[] = {&out, &x, &n};
    const unsigned grid[3] = {N / 256, 1, 1}, block[3] = {256, 1, 1};
    if (emu_launch(k, grid, block, params, err, sizeof err) != 0) fail_msg("%s", err);
    emu_free(k);
}

static float *inputs(void)
{
    float *x = test_malloc(sizeof(float) * N);
    test_rng = 42;
    for (int i = 0; i < N; i++) x[i] = (float)test_uniform(-4, 4);
    x[0] = -0.0f; /* the exact cases: exp(-0) = 1, sin, tanh, erf, expm1 of -0 are -0 */
    return x;
}

static void need_compiler(void)
{
    char why[512];
    if (!emu_available(why, sizeof why)) {
        print_message("SKIP: %s\n", why);
        skip();
    }
}

/* Every result within the function's bound of the correctly rounded one, the bound reached both
 * up and down for each function; another seed moves some results the other way. */
static void test_gpu_numerics_math_is_within_cudas_bound_and_reaches_it_both_ways(void **state)
{
    (void)state;
    need_compiler();
    float *x = inputs(), *out = test_malloc(sizeof(float) * N * NFN), *other = test_malloc(sizeof(float) * N * NFN);
    setenv("ALLOY_EMU_NUMERICS", "gpu", 1);
    unsetenv("ALLOY_EMU_NUMERICS_SEED");
    assert_true(emu_gpu_numerics());
    run_math(x, out);
    setenv("ALLOY_EMU_NUMERICS_SEED", "7", 1);
    run_math(x, other);
    unsetenv("ALLOY_EMU_NUMERICS_SEED");
    unsetenv("ALLOY_EMU_NUMERICS");
    static const int keeps_minus_zero[] = {2, 6, 8, 9, 13, 14}; /* expm1 sin tanh erf tanhf erff */
    for (size_t j = 0; j < sizeof keeps_minus_zero / sizeof *keeps_minus_zero; j++)
        if (!(out[keeps_minus_zero[j]] == 0 && signbit(out[keeps_minus_zero[j]])))
            fail_msg("%s(-0) is %a, not -0", fns[keeps_minus_zero[j]].name, (double)out[keeps_minus_zero[j]]);
    assert_true(out[0] == 1 && out[12] == 1); /* exp(-0), expf(-0): exact */
    for (int f = 0; f < NFN; f++) {
        int up = 0, down = 0, moved = 0;
        for (int i = 0; i < N; i++) {
            float want = reference(f, x[i]), got = out[(int64_t)i * NFN + f];
            int64_t d = ulps_between(want, got);
            if (d > fns[f].ulps || d < -fns[f].ulps)
                fail_msg("%s(%.9g): %.9g is %lld ulp from the correctly rounded %.9g (CUDA's bound %d)", fns[f].name,
                         (double)x[i], (double)got, (long long)d, (double)want, fns[f].ulps);
            up += d == fns[f].ulps, down += d == -fns[f].ulps;
            moved += got != other[(int64_t)i * NFN + f];
        }
        print_message("%-6s bound %d ulp: %4d of %d results at +%d, %4d at -%d; seed 7 changes %d\n", fns[f].name,
                      fns[f].ulps, up, N, fns[f].ulps, down, fns[f].ulps, moved);
        if (!up || !down) fail_msg("%s never reaches its bound %s", fns[f].name, up ? "downward" : "upward");
        if (!moved) fail_msg("%s: another seed changes no result", fns[f].name);
    }
    test_free(x), test_free(out), test_free(other);
}

/* a*b+c with a = b = 1 + 2^-12, c = -(1 + 2^-11): the product 1 + 2^-11 + 2^-24 rounds to
 * 1 + 2^-11 (a tie, to even), so unfused gives 0, fused 2^-24. */
static float multiply_add_in(const char *mode)
{
    if (mode) setenv("ALLOY_EMU_NUMERICS", mode, 1);
    emu_kernel *k = emu_compile(math_src, "multiply_add", err, sizeof err);
    unsetenv("ALLOY_EMU_NUMERICS");
    if (!k) fail_msg("%s", err);
    float a = 1 + 0x1p-12f, c = -(1 + 0x1p-11f), out = -1;
    float *po = &out, *pa = &a, *pc = &c;
    void *params[] = {&po, &pa, &pa, &pc};
    const unsigned one[3] = {1, 1, 1};
    if (emu_launch(k, one, one, params, err, sizeof err) != 0) fail_msg("%s", err);
    emu_free(k);
    return out;
}

static void test_gpu_numerics_fuses_a_multiply_add_and_the_default_mode_does_not(void **state)
{
    (void)state;
    need_compiler();
    float gpu = multiply_add_in("gpu"), host = multiply_add_in(NULL);
    print_message("a*b+c: %a with ALLOY_EMU_NUMERICS=gpu, %a by default\n", (double)gpu, (double)host);
    assert_true(host == 0);
#if defined(__x86_64__) || defined(__i386__)
    if (!__builtin_cpu_supports("fma")) {
        print_message("SKIP: this host has no FMA instructions (the mode cannot contract here)\n");
        skip();
    }
#endif
    assert_true(gpu == 0x1p-24f);
}

/* The default mode keeps the CPU backend's own exp (the GPU mode's differs from it). */
static void test_the_default_mode_leaves_math_as_the_cpu_computes_it(void **state)
{
    (void)state;
    need_compiler();
    float *x = inputs(), *out = test_malloc(sizeof(float) * N * NFN);
    unsetenv("ALLOY_EMU_NUMERICS");
    assert_false(emu_gpu_numerics());
    run_math(x, out);
    int64_t worst = 0;
    for (int i = 0; i < N; i++) {
        int64_t d = ulps_between(reference(0, x[i]), out[(int64_t)i * NFN]);
        worst = d > worst ? d : -d > worst ? -d : worst;
    }
    assert_true(worst <= 1); /* vmath.h's expf, within an ulp: never CUDA's worst end */
    test_free(x), test_free(out);
}

static void expect_refused(const char *name, const char *value, const char *says)
{
    setenv("ALLOY_EMU_NUMERICS", "gpu", 1);
    setenv(name, value, 1);
    emu_kernel *k = emu_compile(math_src, "multiply_add", err, sizeof err);
    unsetenv("ALLOY_EMU_NUMERICS");
    unsetenv("ALLOY_EMU_NUMERICS_SEED");
    assert_null(k);
    if (!strstr(err, says)) fail_msg("%s=%s: '%s' does not say '%s'", name, value, err, says);
}

static void test_a_bad_mode_or_seed_is_refused_by_name(void **state)
{
    (void)state;
    need_compiler();
    expect_refused("ALLOY_EMU_NUMERICS", "fast", "ALLOY_EMU_NUMERICS=fast: expected host (the default) or gpu");
    expect_refused("ALLOY_EMU_NUMERICS_SEED", "x1", "ALLOY_EMU_NUMERICS_SEED=x1: expected a non-negative integer");
    expect_refused("ALLOY_EMU_NUMERICS_SEED", "-3", "ALLOY_EMU_NUMERICS_SEED=-3");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_numerics_math_is_within_cudas_bound_and_reaches_it_both_ways),
        cmocka_unit_test(test_gpu_numerics_fuses_a_multiply_add_and_the_default_mode_does_not),
        cmocka_unit_test(test_the_default_mode_leaves_math_as_the_cpu_computes_it),
        cmocka_unit_test(test_a_bad_mode_or_seed_is_refused_by_name),
    };
    return cmocka_run_group_tests_name("emu numerics", tests, NULL, NULL);
}
