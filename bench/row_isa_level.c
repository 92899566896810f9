/* row_isa_level.c - the CPU row kernels (runtime/cpu/cpu_rows.c) compiled for one x86-64 level under names of their own, for bench/row_isa.
 *
 * Built three times (ROW_LEVEL 0: x86-64-v4, AVX-512; 1: x86-64-v3, AVX2 +
 * FMA; 2: the baseline, SSE2), each without the library's target clones, so
 * that bench/row_isa times every level's code on one CPU, as the library's
 * clones would run it there. */
#define ALLOY_NO_VECTOR_CLONES
#if ROW_LEVEL == 0
#pragma GCC target("arch=x86-64-v4")
#define cpu_row_run row_isa_run_0
#define cpu_row_mean row_isa_mean_0
#define cpu_row row_isa_row_0
#elif ROW_LEVEL == 1
#pragma GCC target("arch=x86-64-v3")
#define cpu_row_run row_isa_run_1
#define cpu_row_mean row_isa_mean_1
#define cpu_row row_isa_row_1
#else
#define cpu_row_run row_isa_run_2
#define cpu_row_mean row_isa_mean_2
#define cpu_row row_isa_row_2
#endif
#include "runtime/cpu/cpu_rows.c"
