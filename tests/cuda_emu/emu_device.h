/* emu_device.h - the CUDA backend's device (runtime/cuda/device.h) on the host: memory from malloc, generated modules compiled as host C++ and run under the CUDA emulation, GEMMs by a plain column-major loop, stream capture recorded and replayed. The whole CUDA backend runs in CI on it. */
#ifndef ALLOY_EMU_DEVICE_H
#define ALLOY_EMU_DEVICE_H

#include "runtime/backend.h"
#include "runtime/bundle/bundle.h"
#include "runtime/cuda/device.h"

/* What the emulated device has done since it opened. */
typedef struct emu_device_stats {
    long launches, gemms, copies, zeros, captures, replays, modules, events;
    long host_calls; /* libraries' work run on the stream (emu_stream.h: the emulated NCCL's collectives), replays too */
    long bias_gemms; /* of gemms, those with an epilogue adding a bias (BIAS, GELU_BIAS, GELU_AUX_BIAS) */
    long gelu_gemms; /* of gemms, those with a GELU epilogue (GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS) */
    long whole_gemms; /* of gemms, those computing a gemm step whole: D a later member's value (a cast, a bias add) */
    long pointer_gemms; /* of gemms, those batched by arrays of pointers (CUBLASLT_BATCH_MODE_POINTER_ARRAY) */
} emu_device_stats;

/* An emulated device of compute capability sm (memory freshly allocated
 * reads as 0xff bytes: NaN in every float dtype, so a kernel reading what
 * nothing wrote shows). NULL with why in err when the host compiler is
 * missing. */
cdev *emu_device_open(int sm, char *err, size_t errlen);
emu_device_stats emu_device_get_stats(const cdev *dev);
/* Caps the memory all emulated devices hold together (SIZE_MAX: none); an
 * allocation past it fails as cuMemAlloc's out-of-memory does. */
void emu_device_set_budget(size_t bytes);
/* Bytes all emulated devices hold now. */
size_t emu_device_in_use(void);
/* An rt_backend_opener: the CUDA backend on a fresh emulated sm_90 device
 * (rt_backend_set_cuda_opener(emu_backend_opener) puts every graph's
 * device=cuda, and auto, on it). */
alloy_status emu_backend_opener(const al_options *cfg, rt_backend **out, char *err, size_t errlen);
/* A bundle_image_builder (runtime/graph/bundle_save.h) for archs "host":
 * each module compiled as the device's load compiles it, into a shared
 * object kept as a BUNDLE_HOST image, which the device loads with no
 * compile. bundle_set_image_builder(emu_bundle_images) makes
 * alloy_graph_save_bundle write them. */
alloy_status emu_bundle_images(const al_options *cfg, const char *archs, int nmodules, const char *const *names,
                               const char *const *sources, bundle_cuda *x, char *err, size_t errlen);
/* The CUDA driver version devices opened next report, 13000 for 13.0
 * (0, the default: none, which the backend does not check). */
void emu_device_set_driver(int version);
/* Whether the emulated cuBLASLt's heuristic returns an algorithm for a
 * pointer-array GEMM (CUBLASLT_BATCH_MODE_POINTER_ARRAY; default true):
 * false makes preparing one fail as cuBLASLt's empty answer does. */
void emu_device_set_pointer_arrays(bool found);
/* Whether the emulated cuBLASLt's heuristic finds an algorithm for a
 * strided batch of more than one matrix (default true): false simulates a
 * library with none, so that a pointer-array GEMM's strided runs fail too. */
void emu_device_set_strided_batches(bool found);
/* Makes the nth launch (from 1) of a kernel whose name contains kernel
 * ("" or NULL: any) fault as a GPU does: the launch returns, and that call
 * and every later one on the device fails with CUDA_ERROR_ILLEGAL_ADDRESS;
 * nth 0 injects nothing. The kernel it hit: emu_device_faulted_kernel(). */
void emu_device_inject_fault(const char *kernel, long nth);
const char *emu_device_faulted_kernel(void);
/* What all emulated devices have done since the process started. */
emu_device_stats emu_totals(void);

#endif
