/* profile.h - the profile option's table (ALLOY_PROFILE): what each launch of one run took (CUDA: device events around every kernel, GEMM, memset and copy; CPU: each schedule step by the wall clock), with the bytes it moved and the work it did. */
#ifndef ALLOY_PROFILE_H
#define ALLOY_PROFILE_H

#include <stdio.h>

#include "base/base.h"

/* One launch (or CPU step) of a profiled run. */
typedef struct rt_profile_row {
    char name[64];      /* a kernel's name, "gemm.MxNxK.f16" (row-major product: M x N, inner K), "memset", "copy" */
    const char *action; /* "kernel", "gemm", "memset", "copy"; the CPU: "step" */
    int step;           /* its schedule step; -1: a copy of an update into its state buffer after the steps */
    const char *kind;   /* the step's kind (sched_kind_name), "update" for step -1 */
    double us;          /* microseconds it took */
    int64_t bytes;      /* bytes it loads and stores, each element once (a copy counts its read and its write) */
    double flops;       /* GEMMs: 2 M N K per batch; 0 for the rest */
} rt_profile_row;

/* Whether run number `run` (1 for the first) is profiled when the profile
 * option is `every` (0: never; N: runs N, 2N, 3N, ...). */
AL_HIDDEN bool rt_profile_due(int every, long run);

/* Prints rows[0..n) of run `run` of graph `graph` to out as '#' lines:
 *   # profile: graph 'mlp', run 3 on DEVICE: N launches (the CPU: N steps), T us (CLOCK)
 *   #   idx  step kind   action     time_us      bytes     GB/s  TFLOP/s  name
 *   #     0     0 gemm   gemm         12.30       2560     0.21    0.001  gemm.16x32x12.f32
 *   ...
 *   # total by action: gemm 5 x, 60.1 us (41%); kernel ...
 * GB/s is bytes over time for every row, TFLOP/s only for GEMMs ("-" else). */
AL_HIDDEN void rt_profile_print(FILE *out, const char *graph, const char *device, const char *clock, long run,
                                const rt_profile_row *rows, int n);

#endif
