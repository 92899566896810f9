/* chunk_convert.c - benchmark: a bf16 group's conversions as cpu_fused.c runs them (widen into 128-element L1 buffers, compute, round out) against one fused typed loop per op, ns per element. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/convert.h"
#include "base/vmath.h"

/* bf16 <-> f32 as cpu_fused_convert.c converts them (base/convert.h's inline ones). */
#define widen cvt_bf16_value
#define narrow cvt_bf16_rounded

/* Every loop in blocks of 16, as cpu_fused_kernels.c's, one clone per ISA level. */
#define BLOCKS(n, body)                                                                            \
    int64_t i = 0;                                                                                 \
    for (; i + 16 <= (n); i += 16)                                                                 \
        for (int64_t j = i; j < i + 16; j++) body(j);                                              \
    for (; i < (n); i++) body(i)

#define LOAD(k) d[k] = widen(s[k])
#define STORE(k) d[k] = narrow(s[k])
#define ADD(k) y[k] = a[k] + b[k]
#define FMA3(k) y[k] = a[k] * b[k] + c[k]
#define ADD_T(k) y[k] = narrow(widen(a[k]) + widen(b[k]))
#define FMA3_T(k) y[k] = narrow(widen(a[k]) * widen(b[k]) + widen(c[k]))

CPU_VECTOR_CLONES __attribute__((noinline)) static void load(const uint16_t *restrict s, float *restrict d, int64_t n) { BLOCKS(n, LOAD); }
CPU_VECTOR_CLONES __attribute__((noinline)) static void store(const float *restrict s, uint16_t *restrict d, int64_t n) { BLOCKS(n, STORE); }
CPU_VECTOR_CLONES __attribute__((noinline)) static void add(int64_t n, float *restrict y, const float *restrict a,
                                                            const float *restrict b, const float *restrict c)
{
    (void)c;
    BLOCKS(n, ADD);
}
CPU_VECTOR_CLONES __attribute__((noinline)) static void fma3(int64_t n, float *restrict y, const float *restrict a,
                                                             const float *restrict b, const float *restrict c)
{
    BLOCKS(n, FMA3);
}
CPU_VECTOR_CLONES __attribute__((noinline)) static void add_typed(int64_t n, uint16_t *restrict y, const uint16_t *restrict a,
                                                                  const uint16_t *restrict b, const uint16_t *restrict c)
{
    (void)c;
    BLOCKS(n, ADD_T);
}
CPU_VECTOR_CLONES __attribute__((noinline)) static void fma3_typed(int64_t n, uint16_t *restrict y, const uint16_t *restrict a,
                                                                   const uint16_t *restrict b, const uint16_t *restrict c)
{
    BLOCKS(n, FMA3_T);
}

static double thread_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atol(argv[1]) : 1 << 20;
    int reps = argc > 2 ? atoi(argv[2]) : 30;
    if (n < 1 || reps < 1) {
        fprintf(stderr, "usage: chunk_convert [elements (default 1048576)] [repetitions (default 30)]\n");
        return 2;
    }
    enum { CHUNK = 256 }; /* the fused groups' chunk (cpu_fused.h) */
    uint16_t *a = malloc(2 * (size_t)n), *b = malloc(2 * (size_t)n), *c = malloc(2 * (size_t)n);
    uint16_t *y1 = malloc(2 * (size_t)n), *y2 = malloc(2 * (size_t)n);
    if (!a || !b || !c || !y1 || !y2) return 1;
    srand(1);
    for (int64_t i = 0; i < n; i++) {
        a[i] = narrow((float)rand() / (float)RAND_MAX * 8 - 4);
        b[i] = narrow((float)rand() / (float)RAND_MAX);
        c[i] = narrow((float)rand() / (float)RAND_MAX - 0.5f);
    }
    static float ba[CHUNK], bb[CHUNK], bc[CHUNK], by[CHUNK];
    printf("bf16 in, bf16 out, %lld elements, best thread CPU time of %d, ns per element\n", (long long)n, reps);
    for (int op = 0; op < 2; op++) {
        double chunked = 1e30, typed = 1e30;
        for (int r = 0; r < reps; r++) {
            double t = thread_seconds();
            for (int64_t s = 0; s < n; s += CHUNK) {
                int64_t len = n - s < CHUNK ? n - s : CHUNK;
                load(a + s, ba, len), load(b + s, bb, len);
                if (op) load(c + s, bc, len), fma3(len, by, ba, bb, bc);
                else add(len, by, ba, bb, bc);
                store(by, y1 + s, len);
            }
            t = thread_seconds() - t;
            chunked = t < chunked ? t : chunked;
            t = thread_seconds();
            for (int64_t s = 0; s < n; s += CHUNK) {
                int64_t len = n - s < CHUNK ? n - s : CHUNK;
                if (op) fma3_typed(len, y2 + s, a + s, b + s, c + s);
                else add_typed(len, y2 + s, a + s, b + s, c + s);
            }
            t = thread_seconds() - t;
            typed = t < typed ? t : typed;
        }
        printf("%-16s chunked %.3f  fused typed %.3f  same bits %s\n", op ? "a * b + c" : "a + b",
               chunked / (double)n * 1e9, typed / (double)n * 1e9, memcmp(y1, y2, 2 * (size_t)n) ? "NO" : "yes");
    }
    free(a), free(b), free(c), free(y1), free(y2);
    return 0;
}
