/* ptxas.h - what ptxas says of each compiled kernel (registers, stack, spills, shared memory): NVRTC's verbose log parsed, modules compiled for it through the kernel cache. */
#ifndef ALLOY_CG_PTXAS_H
#define ALLOY_CG_PTXAS_H

#include "codegen/cache.h"
#include "codegen/emit.h"

/* The NVRTC option that makes ptxas write its resource lines into the
 * program log (NVRTC 13.0 takes it; -Xptxas=-v is the same). */
#define CG_PTXAS_VERBOSE "--ptxas-options=-v"

/* One kernel's resources for one architecture, as ptxas reports them. */
typedef struct cg_resources {
    bool known;            /* ptxas reported this kernel */
    int registers;         /* per thread */
    int stack;             /* bytes of stack frame per thread */
    int spill_stores;      /* bytes of spill stores per thread (static, each instruction once) */
    int spill_loads;       /* bytes of spill loads per thread */
    int shared;            /* bytes of static shared memory per block */
} cg_resources;

/* Reads kernel `name`'s lines from a ptxas -v log (the block after
 * "Compiling entry function 'NAME' for 'sm_XY'": "N bytes stack frame, N
 * bytes spill stores, N bytes spill loads" and "Used N registers, ... N
 * bytes smem") into *out. false (and *out cleared) when the log has no such
 * kernel or its lines do not parse. */
AL_HIDDEN bool cg_ptxas_parse(const char *log, const char *name, cg_resources *out);

/* The resources of every kernel of prog for compute capability sm, in
 * res[0..prog->nkernels): each module (cg_module_range) compiled by NVRTC
 * with CG_PTXAS_VERBOSE on nthreads threads (0: every CPU) and its log
 * parsed. With a cache (may be NULL) each module's log is kept in it under
 * a key of its own (the module's compile key with the verbose option and
 * "ptxas-log" added), so a later call reads it without compiling. A target
 * NVRTC builds as PTX has no ptxas run: its kernels stay unknown. A failed
 * compile is its status with err naming the module; ALLOY_ERR_OOM. */
AL_HIDDEN alloy_status cg_ptxas_resources(const cg_nvrtc *nv, cg_cache *cache, const cg_program *prog, int sm,
                                          int nthreads, cg_resources *res, char *err, size_t errlen);

#endif
