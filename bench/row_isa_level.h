/* row_isa_level.h - the names of their own that one x86-64 level's build of the CPU row files takes, for bench/row_isa.
 *
 * Each of row_isa_level.c, row_isa_level_programs.c,
 * row_isa_level_by_hand.c and row_isa_level_layer_norm.c includes this,
 * then one file of runtime/cpu (cpu_rows.c, cpu_row_programs.c,
 * cpu_row_by_hand.c, cpu_row_layer_norm.c): four translation units per
 * level, as in the library. Built three times (ROW_LEVEL 0:
 * x86-64-v4, AVX-512; 1: x86-64-v3, AVX2 + FMA; 2: the baseline, SSE2),
 * each without the library's target clones, so that bench/row_isa times
 * every level's code on one CPU, as the library's clones would run it
 * there. Every name the files share (runtime/cpu/cpu_rows.h, cpu.h's
 * cpu_row_run, cpu_row_mean, cpu_row) gets the level's suffix. */
#ifndef ALLOY_BENCH_ROW_ISA_LEVEL_H
#define ALLOY_BENCH_ROW_ISA_LEVEL_H

#define ALLOY_NO_VECTOR_CLONES
#if ROW_LEVEL == 0
#pragma GCC target("arch=x86-64-v4")
#define cpu_row_run row_isa_run_0
#define cpu_row_mean row_isa_mean_0
#define cpu_row row_isa_row_0
#define cpu_row_fns row_isa_fns_0
#define cpu_row_f32_by_hand row_isa_f32_by_hand_0
#define cpu_row_f32_batch_elems row_isa_f32_batch_elems_0
#define cpu_row_f32_batch_indexed row_isa_f32_batch_indexed_0
#define cpu_leaf_sums_float row_isa_leaf_sums_float_0
#define cpu_leaf_sums_double row_isa_leaf_sums_double_0
#define cpu_leaf_plan row_isa_leaf_plan_0
#define cpu_row_layer_norm_f32 row_isa_layer_norm_0
#define cpu_row_layer_norm_mean_f32 row_isa_layer_norm_mean_0
#define cpu_row_layer_norm_rstd_f32 row_isa_layer_norm_rstd_0
#define cpu_row_layer_norm_grad_stats_f32 row_isa_layer_norm_grad_stats_0
#elif ROW_LEVEL == 1
#pragma GCC target("arch=x86-64-v3")
#define cpu_row_run row_isa_run_1
#define cpu_row_mean row_isa_mean_1
#define cpu_row row_isa_row_1
#define cpu_row_fns row_isa_fns_1
#define cpu_row_f32_by_hand row_isa_f32_by_hand_1
#define cpu_row_f32_batch_elems row_isa_f32_batch_elems_1
#define cpu_row_f32_batch_indexed row_isa_f32_batch_indexed_1
#define cpu_leaf_sums_float row_isa_leaf_sums_float_1
#define cpu_leaf_sums_double row_isa_leaf_sums_double_1
#define cpu_leaf_plan row_isa_leaf_plan_1
#define cpu_row_layer_norm_f32 row_isa_layer_norm_1
#define cpu_row_layer_norm_mean_f32 row_isa_layer_norm_mean_1
#define cpu_row_layer_norm_rstd_f32 row_isa_layer_norm_rstd_1
#define cpu_row_layer_norm_grad_stats_f32 row_isa_layer_norm_grad_stats_1
#else
#define cpu_row_run row_isa_run_2
#define cpu_row_mean row_isa_mean_2
#define cpu_row row_isa_row_2
#define cpu_row_fns row_isa_fns_2
#define cpu_row_f32_by_hand row_isa_f32_by_hand_2
#define cpu_row_f32_batch_elems row_isa_f32_batch_elems_2
#define cpu_row_f32_batch_indexed row_isa_f32_batch_indexed_2
#define cpu_leaf_sums_float row_isa_leaf_sums_float_2
#define cpu_leaf_sums_double row_isa_leaf_sums_double_2
#define cpu_leaf_plan row_isa_leaf_plan_2
#define cpu_row_layer_norm_f32 row_isa_layer_norm_2
#define cpu_row_layer_norm_mean_f32 row_isa_layer_norm_mean_2
#define cpu_row_layer_norm_rstd_f32 row_isa_layer_norm_rstd_2
#define cpu_row_layer_norm_grad_stats_f32 row_isa_layer_norm_grad_stats_2
#endif

#endif
