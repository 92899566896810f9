/* alloy/cuda.h - CUDA ahead of time: a graph's compiled step as CUDA C kernels, compiled with NVRTC for chosen GPU architectures and written to a directory (no GPU needed). */
#ifndef ALLOY_CUDA_H
#define ALLOY_CUDA_H

#include "alloy/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Compiles g as alloy_graph_run would (training, AMP, loss scaler,
 * optimizer and options apply; no backend is opened), generates a CUDA C
 * kernel for every scheduled step that has one, groups the kernels into
 * NVRTC programs (modules) of up to 64, compiles each module for every
 * architecture in archs ("sm_80,sm_90": compute capabilities as sm_XY) on
 * every CPU (the num_threads option caps them), and writes into dir (made
 * when missing; every file through a temporary file renamed into place):
 *
 *   alloy_mN.cu              module N's CUDA C source
 *   alloy_mN.sm_XY.cubin     its machine code for sm_XY (an ELF file), or
 *   alloy_mN.compute_XY.ptx  PTX for the newest architecture NVRTC has
 *                            below a requested one it lacks
 *   summary.txt              one row per kernel: name, step, step kind,
 *                            grid x block, bytes moved per run, the module
 *                            file and line of its source, the step's members;
 *                            one row per step left to libraries (GEMMs by
 *                            cuBLASLt) with why; then totals (kernels,
 *                            modules, bytes, compile time, binaries that
 *                            came from the kernel cache). Written last.
 *
 * NVRTC is loaded at run time (libnvrtc.so.13, .12 or .11.2); without it
 * the call is ALLOY_ERR_UNSUPPORTED saying where it looked. Options
 * (docs/options.md): the kernel cache (cache, cache_dir; ALLOY_CACHE=0
 * compiles everything), dump_dir (a copy of every source). A kernel NVRTC
 * rejects is ALLOY_ERR_NVRTC: no binary is written (older ones of the same
 * names are removed), NVRTC's log goes to alloy_mN.<arch>.log, and
 * alloy_last_error(g) names the source file, the architecture and the log
 * file, then the log. A bad archs (or NULL/empty dir) is ALLOY_ERR_INVALID,
 * an architecture NVRTC cannot build for ALLOY_ERR_UNSUPPORTED, a file that
 * cannot be written ALLOY_ERR_IO naming it. */
ALLOY_API alloy_status alloy_graph_export_cuda(alloy_graph *g, const char *archs, const char *dir);

#ifdef __cplusplus
}
#endif
#endif
