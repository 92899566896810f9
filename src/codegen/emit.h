/* emit.h - the CUDA C emitter: scheduled steps -> kernels (source, parameters, launch geometry), from the op table's expressions and row programs. */
#ifndef ALLOY_EMIT_H
#define ALLOY_EMIT_H

#include "ir/ir.h"
#include "passes/plan.h"
#include "passes/schedule.h"

/* What one kernel parameter is: the buffer of a node (an input of the step,
 * or a stored member), or scratch the launcher provides. */
typedef enum cg_param_kind {
    CG_PARAM_NODE,    /* node's value: its arena slot or bound leaf buffer */
    CG_PARAM_PRODUCT, /* a GEMM step's f32 product (the plan's scratch), `node` is the matmul */
    CG_PARAM_ROWS,    /* per-row results of a RESULT op, f32 (or f64 when wide), `count` of them, `node` the op;
                       * also a step's own scratch of `count` 4-byte words (embedding_grad's sort) */
    CG_PARAM_FLAG,    /* one zero-initialized int: a step's found_inf flag, `node` the found_inf */
} cg_param_kind;

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
} cg_kernel;

/* The kernels of a compiled step, and the steps no kernel was emitted for
 * (library calls and ops the emitter does not generate yet), each with why. */
typedef struct cg_program {
    cg_kernel *kernels;
    int nkernels, cap;
    int *skipped; /* step indices */
    const char **why;
    int nskipped;
} cg_program;

/* Emits kernels for every step of schedule s of g that the emitter
 * generates: ew steps, row steps and row ops, gemm epilogues (after the
 * library GEMM), multi steps with their found_inf, casts. Fills *out
 * (cg_program_free) or returns ALLOY_ERR_OOM with err. */
AL_HIDDEN alloy_status cg_emit(const ir_graph *g, const schedule *s, cg_program *out, char *err, size_t errlen);
AL_HIDDEN void cg_program_free(cg_program *p);
/* One source holding kernels [first, first + n) of p after a single
 * preamble (an NVRTC program or a host-emulation library with many
 * kernels); al_free it. NULL on OOM. */
AL_HIDDEN char *cg_module_source(const cg_program *p, int first, int n);


#endif
