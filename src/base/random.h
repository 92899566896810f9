/* random.h - counter-based random numbers: Philox 4x32-10 and the draws of dropout, uniform and normal, as one text that is both C and CUDA C++.
 *
 * ALLOY_RANDOM_DEFS is the definitions; this header expands them for the
 * CPU kernels and the evaluator, and the CUDA emitter (codegen/emit_op.c)
 * writes ALLOY_RANDOM_TEXT, the same definitions as a string, into every
 * kernel that draws (NVRTC compiles it with -default-device, the host
 * emulation as C++): one source for the bits on every backend.
 *
 * The draw of element i of a random op (docs/ir.md, "Random ops"):
 *     key     = (seed & 0xffffffff, seed >> 32)
 *     counter = (i & 0xffffffff, i >> 32, stream, step)   (stream and step mod 2^32)
 *     words w0..w3 = philox4x32_10(counter, key)
 * Philox is Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"
 * (SC11), as Random123, cuRAND and PyTorch's GPU generator compute it:
 * round: (hi(M1*c2)^c1^k0, lo(M1*c2), hi(M0*c0)^c3^k1, lo(M0*c0)); the key
 * bumped by (W0, W1) between rounds. test_random checks the Random123
 * known-answer vectors.
 *
 * Everything is in unsigned 32/64-bit integer arithmetic and doubles, so
 * the words, dropout's keep decisions and uniform's values are the same bits
 * everywhere; normal's log and cos are the math library's. */
#ifndef ALLOY_BASE_RANDOM_H
#define ALLOY_BASE_RANDOM_H

/* The definitions, one macro (no comments or directives inside: it is also
 * a string). */
#define ALLOY_RANDOM_DEFS                                                                                    \
    static inline void alloy_philox4x32_10(unsigned c[4], unsigned k0, unsigned k1)                          \
    {                                                                                                        \
        for (int r = 0; r < 10; r++) {                                                                       \
            unsigned long long p0 = 0xD2511F53ull * c[0], p1 = 0xCD9E8D57ull * c[2];                         \
            unsigned n0 = (unsigned)(p1 >> 32) ^ c[1] ^ k0, n2 = (unsigned)(p0 >> 32) ^ c[3] ^ k1;           \
            c[0] = n0;                                                                                       \
            c[1] = (unsigned)p1;                                                                             \
            c[2] = n2;                                                                                       \
            c[3] = (unsigned)p0;                                                                             \
            k0 += 0x9E3779B9u;                                                                               \
            k1 += 0xBB67AE85u;                                                                               \
        }                                                                                                    \
    }                                                                                                        \
    static inline void alloy_random_words(unsigned long long seed, unsigned long long stream,                \
                                          unsigned long long step, unsigned long long i, unsigned w[4])      \
    {                                                                                                        \
        w[0] = (unsigned)i;                                                                                  \
        w[1] = (unsigned)(i >> 32);                                                                          \
        w[2] = (unsigned)stream;                                                                             \
        w[3] = (unsigned)step;                                                                               \
        alloy_philox4x32_10(w, (unsigned)seed, (unsigned)(seed >> 32));                                      \
    }                                                                                                        \
    static inline double alloy_random_u53(unsigned a, unsigned b)                                            \
    {                                                                                                        \
        return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) * (1.0 / 9007199254740992.0);              \
    }                                                                                                        \
    static inline int alloy_dropout_keep(unsigned long long seed, unsigned long long stream,                 \
                                         unsigned long long step, unsigned long long i, double threshold)    \
    {                                                                                                        \
        unsigned w[4];                                                                                       \
        alloy_random_words(seed, stream, step, i, w);                                                        \
        return (double)w[0] < threshold;                                                                     \
    }                                                                                                        \
    static inline double alloy_uniform_draw(unsigned long long seed, unsigned long long stream,              \
                                            unsigned long long step, unsigned long long i, int wide,         \
                                            double low, double high)                                         \
    {                                                                                                        \
        unsigned w[4];                                                                                       \
        alloy_random_words(seed, stream, step, i, w);                                                        \
        double u = wide ? alloy_random_u53(w[0], w[1]) : (double)(w[0] >> 8) * (1.0 / 16777216.0);           \
        return low + (high - low) * u;                                                                       \
    }                                                                                                        \
    static inline double alloy_normal_draw(unsigned long long seed, unsigned long long stream,               \
                                           unsigned long long step, unsigned long long i, double mean,       \
                                           double std)                                                       \
    {                                                                                                        \
        unsigned w[4];                                                                                       \
        alloy_random_words(seed, stream, step, i, w);                                                        \
        double u1 = alloy_random_u53(w[0], w[1]) + 1.0 / 9007199254740992.0;                                 \
        double u2 = alloy_random_u53(w[2], w[3]);                                                            \
        return mean + std * (sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2));                      \
    }

#define ALLOY_RANDOM_STR_(...) #__VA_ARGS__
#define ALLOY_RANDOM_STR(...) ALLOY_RANDOM_STR_(__VA_ARGS__)
/* The definitions as CUDA source text. */
#define ALLOY_RANDOM_TEXT ALLOY_RANDOM_STR(ALLOY_RANDOM_DEFS)

/* dropout's keep threshold and scale for probability p (0 <= p <= 1): an
 * element is kept when its word w0 < threshold, i.e. with probability
 * 1 - p to within 2^-32; kept elements are multiplied by scale = 1/(1-p),
 * dropped ones by 0 (p = 1: every element, scale 0, as PyTorch). */
#define ALLOY_DROPOUT_THRESHOLD(p) ((1.0 - (p)) * 4294967296.0)
#define ALLOY_DROPOUT_SCALE(p) ((p) < 1.0 ? 1.0 / (1.0 - (p)) : 0.0)

#ifndef ALLOY_RANDOM_NO_DEFS
#include <math.h>
ALLOY_RANDOM_DEFS
#endif

#endif
