/* vgelu.h - GELU (erf form) and its derivative for f32 by polynomial pieces, written once for the CPU (C) and the generated CUDA code (as text).
 *
 * GELU(x) = x Phi(x), Phi the normal distribution function, and GELU'(x) =
 * Phi(x) + x phi(x). Neither goes through a general erf and exp: each is two
 * polynomials and a few selects, no division, no table.
 *
 *   |x| < 1.8:   Phi(x) = 1/2 + x p(x^2), GELU'(x) = 1/2 + x w(x^2)
 *               (p of degree 7, w of degree 9);
 *   |x| >= 1.8:  t = |x| clamped to 5.5 (GELU) or 6 (GELU'), u = t minus
 *               the piece's middle (a subtraction, not an FMA: the FMA
 *               pipes are the bottleneck); c(u) ~ Phi(-t) (degree 12), v(u)
 *               ~ Phi(-t) - t phi(t) (degree 14), set to 0 beyond the clamp (where
 *               Phi(-t) < 1.9e-8 and t phi(t) < 3.7e-8); then Phi(x) = c for
 *               x < 0 and 1 - c for x > 0, GELU'(x) = v and 1 - v. So GELU(x)
 *               = x and GELU'(x) = 1 exactly above the clamp, 0 below -5.5
 *               (-6).
 *
 * The pieces are near-minimax fits (Lawson's iteration on 2000 Chebyshev
 * points, from mpmath's values; the absolute error of x p, x w, c and v
 * minimized), coefficients rounded to f32. The negative tail takes
 * Phi(-t) from its own polynomial, not as 1 + erf: GELU's relative error
 * there no longer grows with the cancellation. Error over every 257th f32
 * against f64 erfc (tests/test_vmath.c's sweep; bench/RESULTS.md has the
 * table), against the erf form with al_verff/al_vexpf it replaces:
 *   GELU:  x >= 0 1.52 ulp (1.63); x in [-1.5, 0) 10.5 (8.6: Phi = 1/2 +
 *          x p cancels near -1.5 in both); [-3, -1.5) 51 (162);
 *          |error| / (2^-24 max(1, |x|)) 1.82 (1.80) everywhere;
 *   GELU': x >= 0 1.29 ulp (1.66); [-3, -1.5) 15 (30); |error| /
 *          (2^-24 max(1, |x|)) 1.80 (2.33) everywhere, the bound that holds
 *          around GELU''s zero near x = -0.75 too.
 * Cost (bench/ew_isa, AMD EPYC Zen 4; bench/RESULTS.md): the AVX-512 loop
 * is 37 instructions per 16 elements for GELU, 41 for GELU' (the erf form's
 * GELU' 96), 0.44 and 0.52 ns per element (0.66 and 1.18 before); the
 * baseline (SSE2) clone calls libm's fmaf for each step: about 37 and 43 ns.
 *
 * Each Horner step is an explicit fmaf and nothing else contracts, so every
 * CPU clone (vmath.h), constant folding and the host emulation of the
 * generated CUDA code give the same bits; a GPU may contract x * Phi(x) and
 * 1 - c into FMAs (an ulp or so). NaN gives NaN, +-0 keeps its sign (GELU),
 * +inf gives +inf and 1; -inf gives NaN for GELU (-inf times 0), as the
 * erf formula does, and 0 for GELU' (the formula: NaN).
 *
 * AL_VGELU_FUNCTIONS(QUAL, GELU, GELU_GRAD, GELU64, GELU_GRAD64) defines
 * GELU(x) and GELU_GRAD(x) (the derivative, to be multiplied by dy) for
 * float as above, and GELU64, GELU_GRAD64 for double by the erf formula
 * (libm's erf and exp: f64 results as before), QUAL before each. vmath.h
 * expands it as `static inline` with the names al_vgeluf, al_vgelu_gradf,
 * al_vgelu_f64, al_vgelu_grad_f64; the CUDA kernel preamble
 * (src/codegen/emit_text.c) takes AL_VGELU_TEXT, the same functions as
 * source text named gelu_erf and gelu_erf_grad (float and double
 * overloads), the names ops.def's gelu and gelu_grad call. */
#ifndef ALLOY_BASE_VGELU_H
#define ALLOY_BASE_VGELU_H

#define AL_VGELU_FUNCTIONS(QUAL, GELU, GELU_GRAD, GELU64, GELU_GRAD64)                                    \
    QUAL float GELU(float x)                                                                                \
    {                                                                                                       \
        float ax = fabsf(x);                                                                                \
        float x2 = x * x;                                                                                   \
        float p = -1.969992880e-08f;                                                                        \
        p = fmaf(p, x2, 5.601250450e-07f);                                                                  \
        p = fmaf(p, x2, -9.149041944e-06f);                                                                 \
        p = fmaf(p, x2, 1.149511008e-04f);                                                                  \
        p = fmaf(p, x2, -1.186873298e-03f);                                                                 \
        p = fmaf(p, x2, 9.973328561e-03f);                                                                  \
        p = fmaf(p, x2, -6.649032980e-02f);                                                                 \
        p = fmaf(p, x2, 3.989422917e-01f);                                                                  \
        float small = fmaf(x, p, 0.5f);                                                                     \
        float t = ax > 5.5f ? 5.5f : ax;                                                                    \
        float u = t - 3.65f;                                                                                \
        float c = 6.803466590e-08f;                                                                         \
        c = fmaf(c, u, -1.227185038e-07f);                                                                  \
        c = fmaf(c, u, -1.164312152e-06f);                                                                  \
        c = fmaf(c, u, 4.804443051e-06f);                                                                   \
        c = fmaf(c, u, -3.354641194e-06f);                                                                  \
        c = fmaf(c, u, -3.033314897e-05f);                                                                  \
        c = fmaf(c, u, 1.536136697e-04f);                                                                   \
        c = fmaf(c, u, -4.265421885e-04f);                                                                  \
        c = fmaf(c, u, 8.012038888e-04f);                                                                   \
        c = fmaf(c, u, -1.048854785e-03f);                                                                  \
        c = fmaf(c, u, 9.316378855e-04f);                                                                   \
        c = fmaf(c, u, -5.104079028e-04f);                                                                  \
        c = fmaf(c, u, 1.311185770e-04f);                                                                   \
        c = ax > 5.5f ? 0.0f : c;                                                                           \
        float big = x < 0.0f ? c : 1.0f - c;                                                                \
        return x * (ax < 1.8f ? small : big);                                                               \
    }                                                                                                       \
    QUAL float GELU_GRAD(float x)                                                                           \
    {                                                                                                       \
        float ax = fabsf(x);                                                                                \
        float x2 = x * x;                                                                                   \
        float w = -9.863603267e-10f;                                                                        \
        w = fmaf(w, x2, 3.297953199e-08f);                                                                  \
        w = fmaf(w, x2, -6.297398727e-07f);                                                                 \
        w = fmaf(w, x2, 9.252441487e-06f);                                                                  \
        w = fmaf(w, x2, -1.132273028e-04f);                                                                 \
        w = fmaf(w, x2, 1.154242083e-03f);                                                                  \
        w = fmaf(w, x2, -9.498564526e-03f);                                                                 \
        w = fmaf(w, x2, 5.984132364e-02f);                                                                  \
        w = fmaf(w, x2, -2.659615278e-01f);                                                                 \
        w = fmaf(w, x2, 7.978845835e-01f);                                                                  \
        float small = fmaf(x, w, 0.5f);                                                                     \
        float t = ax > 6.0f ? 6.0f : ax;                                                                    \
        float u = t - 3.9f;                                                                                 \
        float v = 2.907855468e-08f;                                                                         \
        v = fmaf(v, u, -1.017741980e-07f);                                                                  \
        v = fmaf(v, u, -4.558628177e-07f);                                                                  \
        v = fmaf(v, u, 2.810308160e-06f);                                                                   \
        v = fmaf(v, u, -2.411291007e-06f);                                                                  \
        v = fmaf(v, u, -1.887132385e-05f);                                                                  \
        v = fmaf(v, u, 7.994980842e-05f);                                                                   \
        v = fmaf(v, u, -1.335397392e-04f);                                                                  \
        v = fmaf(v, u, -6.455371476e-05f);                                                                  \
        v = fmaf(v, u, 9.507302311e-04f);                                                                   \
        v = fmaf(v, u, -2.647187794e-03f);                                                                  \
        v = fmaf(v, u, 4.267295823e-03f);                                                                   \
        v = fmaf(v, u, -4.342717584e-03f);                                                                  \
        v = fmaf(v, u, 2.624199959e-03f);                                                                   \
        v = fmaf(v, u, -7.266525645e-04f);                                                                  \
        v = ax > 6.0f ? 0.0f : v;                                                                           \
        float big = x < 0.0f ? v : 1.0f - v;                                                                \
        return ax < 1.8f ? small : big;                                                                     \
    }                                                                                                       \
    QUAL double GELU64(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)); }            \
    QUAL double GELU_GRAD64(double x)                                                                       \
    {                                                                                                       \
        return 0.5 * (1.0 + erf(x * 0.70710678118654752440)) + x * exp(-0.5 * x * x) * 0.39894228040143267794; \
    }

#define AL_VGELU_STR_(...) #__VA_ARGS__
#define AL_VGELU_STR(...) AL_VGELU_STR_(__VA_ARGS__)
/* The two functions as CUDA C++ source text, for the kernel preamble. */
#define AL_VGELU_TEXT                                                                                         \
    AL_VGELU_STR(AL_VGELU_FUNCTIONS(static __device__ __forceinline__, gelu_erf, gelu_erf_grad, gelu_erf, gelu_erf_grad))

#endif
