/* alloy/cost.h - the modelled cost of a graph's compiled GPU step, from its launch plan, with no GPU: every launch's bytes, FLOPs, registers and spills, and its time by a table of device constants. */
#ifndef ALLOY_COST_H_PUBLIC
#define ALLOY_COST_H_PUBLIC

#include <stdio.h>

#include "alloy/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What to model. A zeroed struct is the default: the H100 SXM table, no
 * ptxas resources, the 15 slowest launches listed. */
typedef struct alloy_cost_options {
    const char *device;    /* the constants: "h100" (NULL) or "h200" */
    const char *arch;      /* "sm_90": compile the kernels with NVRTC (through the kernel cache) for ptxas'
                            * registers, spills and shared memory; NULL: none (no NVRTC needed) */
    const char *calibrate; /* a file holding an ALLOY_PROFILE table from a GPU: the device's bandwidth
                            * efficiency, GEMM rates and kernel floor are fitted to it first; NULL: none */
    int top;               /* slowest launches listed (0: 15; -1: none) */
    int all;               /* nonzero: list every launch too */
} alloy_cost_options;

/* What the model gives for one step. */
typedef struct alloy_cost_totals {
    int launches;            /* kernels + GEMMs + memsets + copies (+ collectives): the nodes of the step's CUDA graph */
    int kernels, gemms, memsets, copies;
    int tiny_kernels;        /* generated kernels of at most 4 blocks */
    int spill_kernels;       /* kernels ptxas reports spills for; -1 without arch */
    double bytes;            /* device memory traffic: reads, writes and spills, each element once */
    double kernel_bytes;     /* of bytes, the generated kernels' */
    double emitted_kernel_bytes; /* the emitter's own count of the same (export summary.txt, the profile's
                                  * bytes): each kernel's main operands once, without, e.g., a gemm
                                  * epilogue's read of the f32 product */
    double flops;
    double ms_low, ms_high;  /* modelled step time, milliseconds */
    int collectives;         /* data-parallel collectives (launches counts them too) */
    double link_bytes;       /* the bytes each rank sends in them (not in bytes) */
} alloy_cost_totals;

/* Compiles g as alloy_graph_run would on a GPU (no backend is opened; with
 * the option device=auto, the default, the passes choose as for a GPU,
 * whatever the machine has, and that compile is dropped after, so a later
 * run compiles for its own device; a graph already compiled is modelled as
 * it is), emits its CUDA kernels, builds the launch plan the CUDA backend would replay and
 * models every launch (docs/cuda.md, "The cost model"): its bytes, FLOPs,
 * class, ptxas resources (with o->arch), and time by the device's
 * constants. Fills *totals (may be NULL) and, when report is not NULL,
 * prints the model there: the constants, totals, a summary per class of
 * launch, the slowest launches and (o->all) every launch. All figures are
 * modelled, not measured. o may be NULL (defaults). Errors: an unknown
 * device or bad arch (ALLOY_ERR_INVALID), no NVRTC for an arch
 * (ALLOY_ERR_UNSUPPORTED), a calibration file that cannot be read
 * (ALLOY_ERR_IO) or holds no profile (ALLOY_ERR_INVALID), a step with no
 * CUDA kernel (ALLOY_ERR_UNSUPPORTED), each with alloy_last_error. */
ALLOY_API alloy_status alloy_graph_cost(alloy_graph *g, const alloy_cost_options *o, alloy_cost_totals *totals,
                                        FILE *report);
/* alloy_graph_cost with the default options but arch (may be NULL),
 * printing the report to out. */
ALLOY_API alloy_status alloy_graph_cost_report(alloy_graph *g, FILE *out, const char *arch);

#ifdef __cplusplus
}
#endif
#endif
