/* f16_convert.c - benchmark: cvt_f16_load / cvt_f16_store (base/convert.c) on each instruction set this CPU has, ns per element, in 128-element chunks (a fused group's, in L1) and over 4 MiB. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/convert.h"

enum { SPAN = 1 << 21, ROUNDS = 7 };

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint16_t h[2 * SPAN];
static float f[2 * SPAN];

/* The best of ROUNDS passes over 64 Mi elements in runs of n, walking a
 * 2 Mi-element span (runs of 128 stay in L1 each; the span does not). */
static void measure(const char *isa, int n)
{
    long reps = (64L << 20) / n;
    double best_load = 1e30, best_store = 1e30;
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = cpu_now();
        for (long i = 0; i < reps; i++) cvt_f16_load(h + (i * n) % SPAN, f + SPAN, (size_t)n);
        double t1 = cpu_now();
        for (long i = 0; i < reps; i++) cvt_f16_store(f + (i * n) % SPAN, h + SPAN, (size_t)n);
        double t2 = cpu_now();
        if (t1 - t0 < best_load) best_load = t1 - t0;
        if (t2 - t1 < best_store) best_store = t2 - t1;
    }
    double el = (double)reps * n;
    printf("%-9s %9d %10.3f %10.3f\n", isa, n, best_load / el * 1e9, best_store / el * 1e9);
}

int main(void)
{
    static const char *const names[] = {"portable", "f16c", "avx512"};
    srand(1);
    for (int i = 0; i < 2 * SPAN; i++) h[i] = (uint16_t)(rand() & 0x7bff), f[i] = (float)rand() / (float)RAND_MAX;
    printf("%-9s %9s %10s %10s   (ns per element, thread CPU time, best of %d)\n", "isa", "run", "load", "store",
           ROUNDS);
    for (int isa = CVT_ISA_AVX512; isa >= CVT_ISA_PORTABLE; isa--) {
        if (cvt_force_isa((cvt_isa)isa) != (cvt_isa)isa) continue; /* not on this CPU */
        measure(names[isa], 128);
        measure(names[isa], 1 << 20);
    }
    cvt_force_isa(CVT_ISA_AVX512);
    return 0;
}
