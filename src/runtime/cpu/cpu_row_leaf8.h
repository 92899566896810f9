/* cpu_row_leaf8.h - what the CPU's f32 row functions by hand share (cpu_row_by_hand.c, cpu_row_layer_norm.c): a complete tree's leaf sums added in registers, vectors of 8 floats and whether their AVX2 code runs. */
#ifndef ALLOY_RUNTIME_CPU_CPU_ROW_LEAF8_H
#define ALLOY_RUNTIME_CPU_CPU_ROW_LEAF8_H

/* The files that include this start with cpu_rows.h's #pragma (no
 * trapping math), so its inline functions compile with their options. */
#include "runtime/cpu/cpu_rows.h"
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
#endif

/* levels_f32's sum of a complete tree of up to 16 leaf sums, in
 * registers: the same pairs of neighbours level by level, without the
 * stores and reloads between levels (a chain of store-to-load forwards,
 * which cost a row of 64's 4 leaves more than their additions). */
static inline float tree_f32(const float *v, int nleaves)
{
    switch (nleaves) {
    case 1: return v[0];
    case 2: return v[0] + v[1];
    case 4: return (v[0] + v[1]) + (v[2] + v[3]);
    case 8: return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    case 16:
        return (((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]))) +
               (((v[8] + v[9]) + (v[10] + v[11])) + ((v[12] + v[13]) + (v[14] + v[15])));
    default: return levels_f32((float *)v, nleaves);
    }
}

/* Leaves of LEAF terms 8 side by side in a 32-byte vector (lane l: leaf l),
 * each leaf still added in order from 0: the same bits as
 * cpu_leaf_sums_float. Only where the CPU has x86-64-v3 (AVX2), as
 * wide_leaves() says: GCC makes scalar code of their shuffles for SSE2, whose
 * clone takes the functions' other paths. */
#if defined(LEAF_TRANSPOSE) && defined(__x86_64__)
#define LEAF8 1
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
/* whether the AVX2 functions of the row files run: the library's v3 and v4 clones run
 * where the CPU has x86-64-v3, and a build without clones for one level
 * (bench/row_isa_level.c) knows its own */
static inline bool wide_leaves(void)
{
#if defined(ALLOY_NO_VECTOR_CLONES)
#if defined(__AVX2__) && defined(__FMA__)
    return true;
#else
    return false;
#endif
#else
    return __builtin_cpu_supports("x86-64-v3");
#endif
}
/* whether their AVX-512 functions run (x86-64-v4), likewise */
static inline bool wide512(void)
{
#if defined(ALLOY_NO_VECTOR_CLONES)
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
    return true;
#else
    return false;
#endif
#else
    return __builtin_cpu_supports("x86-64-v4");
#endif
}
#endif

#endif
