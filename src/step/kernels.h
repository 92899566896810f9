/* kernels.h - the kernel table of a compiled CUDA step (each kernel's source, parameters and launch geometry): data the emitter fills, bundles carry and the CUDA backend launches. */
#ifndef ALLOY_KERNELS_H
#define ALLOY_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "step/schedule.h"

/* What one kernel parameter is: the buffer of a node (an input of the step,
 * or a stored member), or scratch the launcher provides. */
typedef enum cg_param_kind {
    CG_PARAM_NODE,    /* node's value: its arena slot or bound leaf buffer */
    CG_PARAM_PRODUCT, /* a GEMM step's f32 product (the plan's scratch), `node` is the matmul */
    CG_PARAM_ROWS,    /* per-row results of a RESULT op, f32 (or f64 when wide), `count` of them, `node` the op;
                       * also a step's own scratch of `count` 4-byte words (embedding_grad's sort) */
    CG_PARAM_FLAG,    /* one zero-initialized int: a step's found_inf flag, `node` the found_inf */
    CG_PARAM_CHECKS,  /* the run's amp_check/amp_stats words (CG_CHECK_WORDS per node), zeroed once per run; node -1 */
    CG_PARAM_KEPT,    /* per-row statistics a step keeps for a later step of the run (attention's logsumexp for
                       * attention_grad), f32, `count` of them, `node` the op that writes them; one slot per node
                       * for the whole run */
    CG_PARAM_COUNTER, /* `count` unsigned ints a one-launch reduction counts its finished blocks in, `node` the op:
                       * one slot per node for the whole run, zeroed when the step is loaded; the kernel's last
                       * block sets each back to 0, so every run starts from 0 */
} cg_param_kind;

/* What the kernels of a step compiled with amp_check or amp_stats also do
 * (cg_program.checks): flag a value that is not finite, track an f16/bf16
 * value's range. */
enum { CG_CHECK_FINITE = 1, CG_CHECK_RANGE = 2 };
/* The run's check words, per node id i at [CG_CHECK_WORDS * i]: word 0 the
 * NONFINITE_* bits (and CG_RANGE_NAN: its statistics saw a NaN), word 1 the
 * largest |x| seen as f32 bits, words 2-3 the count of subnormal elements
 * (an unsigned long long). */
enum { CG_CHECK_WORDS = 4, CG_RANGE_NAN = 4 };

typedef struct cg_param {
    cg_param_kind kind;
    int node;
    bool written;  /* the kernel stores into it */
    int64_t count; /* elements, for ROWS */
} cg_param;

/* One kernel: extern "C" __global__ void name(params...) in `source`, launched
 * 1-D with grid x block threads. Kernels of one step run in their order. */
typedef struct cg_kernel {
    char name[48];
    int step;
    step_kind kind;
    char *source; /* al_malloc'd: the preamble and this kernel, complete for NVRTC */
    size_t body;  /* where the kernel's own text starts in source (after the preamble) */
    cg_param *params;
    int nparams;
    unsigned grid, block;
    int64_t bytes; /* bytes the kernel loads and stores per run (each element once) */
    bool check;    /* a step's check kernel (amp_check/amp_stats on values no epilogue saw), after its own */
} cg_kernel;

/* The kernels of a compiled step, and the steps no kernel was emitted for
 * (library calls and ops the emitter does not generate yet), each with why. */
typedef struct cg_program {
    cg_kernel *kernels;
    int nkernels, cap;
    int *skipped; /* step indices */
    const char **why;
    int nskipped;
    /* CG_CHECK_* the kernels were emitted with (0: none, the default), and
     * per node which of them some kernel does for it (NULL when checks is 0) */
    unsigned checks;
    uint8_t *covered;
} cg_program;

#endif
