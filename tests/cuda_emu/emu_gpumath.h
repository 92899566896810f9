/* emu_gpumath.h - the GPU-numerics mode's math (ALLOY_EMU_NUMERICS=gpu): each CUDA math function an emitted kernel calls returns the correctly rounded result moved by CUDA's documented maximum ulp error, up or down by a seeded hash, so the emulation gives a legal GPU result at the worst end. */
#ifndef ALLOY_EMU_GPUMATH_H
#define ALLOY_EMU_GPUMATH_H

/* emu.h includes this last when the loader compiles with -DALLOY_EMU_GPU_NUMERICS (and defines
 * ALLOY_EMU_GPU_SEED, the run's seed). The bounds are those of CUDA C++ Programming Guide,
 * Mathematical Functions (the "Maximum ulp error" tables of the single- and double-precision
 * standard library functions, full range, default flags: -prec-div=true, -prec-sqrt=true, no
 * -use_fast_math, as NVRTC compiles alloy's kernels):
 *
 *   float:  expf 2, exp2f 2, expm1f 1, logf 1, log2f 1, log1pf 1, powf 4, sinf 2, cosf 2,
 *           tanhf 2, erff 2, rsqrtf 2; sqrtf, x/y, x*y, x+y and fmaf 0 (IEEE round to nearest)
 *   double: exp 1, exp2 1, expm1 1, log 1, log2 1, log1p 1, pow 2, sin 2, cos 2, tanh 1, erf 2,
 *           rsqrt 1; sqrt, x/y 0
 *
 * The guide states the bound as the distance in ulps between the correctly rounded result and
 * the one returned, so stepping the correctly rounded result by that many representable numbers
 * is the worst legal answer. The correctly rounded float result comes from the double function
 * (whose own error, 1 ulp of double, cannot move a float rounding but in ties far below the
 * bound); the double one from long double's (x87 extended precision on x86-64). Left exact:
 * zero, infinite and NaN results, C99 Annex F's exact cases (exp(0) = 1, log(1) = 0, pow(x, 0)
 * = pow(1, y) = 1, and -0 through sin, tanh, erf, expm1 and log1p), and results the step would take past the function's range (|tanh|, |erf|
 * <= 1, exp >= 0, sqrt-like >= 0): those move toward the inside only. The fast intrinsics
 * (__expf, __logf, __fdividef) are not modelled: no emitter calls them. */

#include <cstdint>

namespace alloy_emu_gpu {

#ifndef ALLOY_EMU_GPU_SEED
#define ALLOY_EMU_GPU_SEED 1
#endif

/* Which function, mixed into the hash so that exp and log of one input step independently. */
enum fn { F_EXP = 1, F_EXP2, F_EXPM1, F_LOG, F_LOG2, F_LOG1P, F_POW, F_SIN, F_COS, F_TANH, F_ERF, F_RSQRT };

/* splitmix64's finaliser: the step's direction from the function, its input bits and the seed. */
inline bool step_up(fn f, uint64_t bits)
{
    uint64_t z = bits + (uint64_t)f * 0x9e3779b97f4a7c15ull + (uint64_t)ALLOY_EMU_GPU_SEED * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return ((z ^ (z >> 31)) & 1) != 0;
}

/* r (correctly rounded) moved by ulps representable numbers in the hashed direction, kept
 * within [lo, hi]; zero, inf and NaN stay. */
template <class T> inline T perturb(T r, int ulps, fn f, uint64_t bits, T lo, T hi)
{
    if (r == 0 || !std::isfinite(r)) return r;
    bool up = step_up(f, bits);
    T s = r;
    for (int i = 0; i < ulps; i++) {
        T next = std::nextafter(s, up ? (T)INFINITY : -(T)INFINITY);
        if (next < lo || next > hi || !std::isfinite(next)) break; /* the range's edge: stop there */
        s = next;
    }
    return s;
}

inline uint64_t bits_of(float x) { uint32_t b; memcpy(&b, &x, 4); return b; }
inline uint64_t bits_of(double x) { uint64_t b; memcpy(&b, &x, 8); return b; }
inline uint64_t bits_of(float x, float y) { return bits_of(x) << 32 | bits_of(y); }
inline uint64_t bits_of(double x, double y) { return bits_of(x) * 0x9e3779b97f4a7c15ull ^ bits_of(y); }

/* The double and long double results each precision's float and double versions round from. */
inline double wide(double (*f)(double), float x) { return f((double)x); }
inline long double wide(long double (*f)(long double), double x) { return f((long double)x); }

#define ALLOY_EMU_GPU_UNARY(NAME, ID, UF, UD, LO, HI, EXACT_AT, EXACT_VALUE)                                          \
    inline float NAME(float x)                                                                                         \
    {                                                                                                                  \
        if (x == (EXACT_AT)) return (float)(EXACT_VALUE);                                                              \
        return perturb<float>((float)wide(static_cast<double (*)(double)>(std::NAME), x), UF, ID, bits_of(x), (float)(LO),     \
                       (float)(HI));                                                                                   \
    }                                                                                                                  \
    inline double NAME(double x)                                                                                       \
    {                                                                                                                  \
        if (x == (EXACT_AT)) return (double)(EXACT_VALUE);                                                             \
        return perturb<double>((double)wide(static_cast<long double (*)(long double)>(std::NAME), x), UD, ID, bits_of(x),      \
                       (double)(LO), (double)(HI));                                                                    \
    }

/* name, id, float ulps, double ulps, range, the Annex F input whose result is exact and that result
 * (x: the input itself, so that -0 stays -0). */
ALLOY_EMU_GPU_UNARY(exp, F_EXP, 2, 1, 0, INFINITY, 0, 1)
ALLOY_EMU_GPU_UNARY(exp2, F_EXP2, 2, 1, 0, INFINITY, 0, 1)
ALLOY_EMU_GPU_UNARY(expm1, F_EXPM1, 1, 1, -1, INFINITY, 0, x)
ALLOY_EMU_GPU_UNARY(log, F_LOG, 1, 1, -INFINITY, INFINITY, 1, 0)
ALLOY_EMU_GPU_UNARY(log2, F_LOG2, 1, 1, -INFINITY, INFINITY, 1, 0)
ALLOY_EMU_GPU_UNARY(log1p, F_LOG1P, 1, 1, -INFINITY, INFINITY, 0, x)
ALLOY_EMU_GPU_UNARY(sin, F_SIN, 2, 2, -1, 1, 0, x)
ALLOY_EMU_GPU_UNARY(cos, F_COS, 2, 2, -1, 1, 0, 1)
ALLOY_EMU_GPU_UNARY(tanh, F_TANH, 2, 1, -1, 1, 0, x)
ALLOY_EMU_GPU_UNARY(erf, F_ERF, 2, 2, -1, 1, 0, x)
#undef ALLOY_EMU_GPU_UNARY

inline float pow(float x, float y)
{
    if (y == 0 || x == 1) return 1; /* Annex F: exact */
    return perturb<float>((float)std::pow((double)x, (double)y), 4, F_POW, bits_of(x, y), -INFINITY, INFINITY);
}
inline double pow(double x, double y)
{
    if (y == 0 || x == 1) return 1;
    return perturb<double>((double)std::pow((long double)x, (long double)y), 2, F_POW, bits_of(x, y), -INFINITY, INFINITY);
}
/* Mixed operands (pow(float, int)) as CUDA's overloads take them: float unless one is double. */
template <class A, class B> inline auto pow(A x, B y) -> decltype(x + y + 0.0f)
{
    using R = decltype(x + y + 0.0f);
    return pow((R)x, (R)y);
}
inline float rsqrt(float x) { return perturb<float>((float)(1 / std::sqrt((double)x)), 2, F_RSQRT, bits_of(x), 0, INFINITY); }
inline double rsqrt(double x)
{
    return perturb<double>((double)(1 / std::sqrt((long double)x)), 1, F_RSQRT, bits_of(x), 0, INFINITY);
}

} /* namespace alloy_emu_gpu */

/* Every spelling a kernel may use: the C float names and the C++ overloads (exp(float) is float);
 * the parentheses keep a macro's name from being expanded again inside another's. */
#define exp(x) (::alloy_emu_gpu::exp)(x)
#define expf(x) (::alloy_emu_gpu::exp)((float)(x))
#define exp2(x) (::alloy_emu_gpu::exp2)(x)
#define exp2f(x) (::alloy_emu_gpu::exp2)((float)(x))
#define expm1(x) (::alloy_emu_gpu::expm1)(x)
#define expm1f(x) (::alloy_emu_gpu::expm1)((float)(x))
#define log(x) (::alloy_emu_gpu::log)(x)
#define logf(x) (::alloy_emu_gpu::log)((float)(x))
#define log2(x) (::alloy_emu_gpu::log2)(x)
#define log2f(x) (::alloy_emu_gpu::log2)((float)(x))
#define log1p(x) (::alloy_emu_gpu::log1p)(x)
#define log1pf(x) (::alloy_emu_gpu::log1p)((float)(x))
#define sin(x) (::alloy_emu_gpu::sin)(x)
#define sinf(x) (::alloy_emu_gpu::sin)((float)(x))
#define cos(x) (::alloy_emu_gpu::cos)(x)
#define cosf(x) (::alloy_emu_gpu::cos)((float)(x))
#define tanh(x) (::alloy_emu_gpu::tanh)(x)
#define tanhf(x) (::alloy_emu_gpu::tanh)((float)(x))
#define erf(x) (::alloy_emu_gpu::erf)(x)
#define erff(x) (::alloy_emu_gpu::erf)((float)(x))
#define pow(x, y) (::alloy_emu_gpu::pow)(x, y)
#define powf(x, y) (::alloy_emu_gpu::pow)((float)(x), (float)(y))
#define rsqrtf(x) (::alloy_emu_gpu::rsqrt)((float)(x))
#define rsqrt(x) (::alloy_emu_gpu::rsqrt)(x)

#endif
