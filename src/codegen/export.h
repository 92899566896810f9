/* export.h - a compiled schedule written out for CUDA: kernels grouped into NVRTC modules, each compiled per architecture through the kernel cache on a thread pool, sources, binaries and a summary table in a directory. */
#ifndef ALLOY_CG_EXPORT_H
#define ALLOY_CG_EXPORT_H

#include "codegen/emit.h"
#include "codegen/nvrtc.h"

/* ---- modules: how kernels are grouped into NVRTC programs ---- */

/* The most kernels one module (one NVRTC program, one CUBIN) holds. */
#define CG_MODULE_KERNELS 64

/* How many modules nkernels kernels make: ceil(nkernels / CG_MODULE_KERNELS). */
AL_HIDDEN int cg_module_count(int nkernels);
/* Module m's kernels [*first, *first + *n) of nkernels. The modules split
 * the kernels in order into parts whose sizes differ by at most one (285
 * kernels: 57 each), so parallel compiles take about the same time. */
AL_HIDDEN void cg_module_range(int nkernels, int m, int *first, int *n);
/* Module m's name, "alloy_m<m>": its NVRTC program name (part of its cache
 * key) and the stem of its files. */
AL_HIDDEN void cg_module_name(int m, char *out, size_t len);

/* ---- architectures ---- */

/* The most architectures one export compiles for. */
#define CG_MAX_ARCHS 16

/* Parses "sm_80,sm_90" (spaces around each allowed) into archs[0..*n): each
 * item sm_XY with XY the compute capability as major*10+minor, 10 to 9999,
 * none twice, at most max. ALLOY_ERR_INVALID with err naming the bad item. */
AL_HIDDEN alloy_status cg_parse_archs(const char *text, int *archs, int max, int *n, char *err, size_t errlen);

/* ---- the export ---- */

typedef struct cg_export_options {
    const int *archs; /* compute capabilities to build for (80, 90) */
    int narchs;       /* 1 to CG_MAX_ARCHS */
    const char *dir;  /* the directory written (made, with its parents, when missing) */
    bool cache;       /* compile through the kernel cache (cache.h); false: compile everything, keep nothing */
    const char *cache_dir; /* the cache's directory; NULL or "": a cache in memory only */
    const char *dump_dir;  /* NULL or "": none; else every module source is also written there */
    int nthreads;          /* compile threads; 0: every online CPU */
    /* For tests: when set, module m is compiled from the source this
     * returns (which must outlive the call; NULL: the emitted one) instead
     * of the emitted one. */
    const char *(*source_hook)(void *ctx, int module, const char *emitted);
    void *hook_ctx;
} cg_export_options;

/* What an export wrote. */
typedef struct cg_export_totals {
    int kernels, modules;
    /* steps that call a library: those with no kernel (GEMMs by cuBLASLt,
     * ops with no kernel yet) and gemm steps, whose matmul a library runs
     * before their epilogue kernel */
    int library_calls;
    int targets;       /* distinct binaries per module: an sm_XY CUBIN, or compute_XY PTX when NVRTC lacks sm_XY */
    int binaries;      /* modules * targets */
    int from_cache;    /* of binaries, those the kernel cache held */
    int64_t bytes;     /* bytes the kernels load and store in one run */
    double compile_ms; /* wall time of the compiles */
    int threads;
} cg_export_totals;

/* Emits g's kernels for schedule s (cg_emit), groups them into modules
 * (cg_module_range) and writes into o->dir, each file through a temporary
 * file renamed into place:
 *   alloy_mN.cu            module N's source (also into o->dump_dir)
 *   alloy_mN.sm_XY.cubin   its CUBIN for each architecture, or
 *   alloy_mN.compute_XY.ptx  PTX (without the trailing NUL) where NVRTC
 *                          has no sm_XY and falls back to the newest below
 *   summary.txt            one row per kernel (name, step, step kind, grid
 *                          x block, bytes per run, module file:line, the
 *                          step's members), one per step that calls a
 *                          library (with why: cg_program's skipped steps,
 *                          and the matmul of each gemm step), and the
 *                          totals; written last
 * Sources are written before compiling, so that a failure can name them.
 * Every module is compiled for every target on o->nthreads threads,
 * through the cache when o->cache. When any compile fails, no binary and no
 * summary is written, the ones an earlier export left under those names are
 * removed (so no source is paired with a stale binary), NVRTC's whole log
 * goes to alloy_mN.<target>.log next to the source, and the status is that
 * of the first failure with err naming the source file, the target and the
 * log file, then NVRTC's message and log (as much as fits). Other errors:
 * ALLOY_ERR_INVALID (options), ALLOY_ERR_UNSUPPORTED (an architecture NVRTC
 * cannot build for), ALLOY_ERR_IO (a file or directory, named), ALLOY_ERR_OOM.
 * totals (may be NULL) is filled on success. */
AL_HIDDEN alloy_status cg_export(const ir_graph *g, const schedule *s, const cg_nvrtc *nv, const cg_export_options *o,
                                 cg_export_totals *totals, char *err, size_t errlen);

#endif
