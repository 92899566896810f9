/* driver.h - the CUDA driver loaded at run time: libcuda.so.1 through dlopen, every entry point through cuGetProcAddress at an explicit version, so the same binary starts on a machine without a GPU. */
#ifndef ALLOY_CUDA_DRIVER_H
#define ALLOY_CUDA_DRIVER_H

#include <cuda.h>

#include "base/base.h"

/* The ABI version every entry point is asked for: CUDA 12.0's signatures
 * (cuMemAlloc_v2, cuStreamBeginCapture_v2, cuGraphInstantiateWithFlags),
 * which every 12.x and 13.x driver serves. */
#define CU_DRIVER_ABI 12000

/* X(name, return, parameters): the entry points alloy calls. */
#define CU_DRIVER_ENTRIES(X)                                                                                   \
    X(cuInit, (unsigned int flags))                                                                            \
    X(cuDriverGetVersion, (int *version))                                                                      \
    X(cuDeviceGetCount, (int *count))                                                                          \
    X(cuDeviceGet, (CUdevice * dev, int ordinal))                                                              \
    X(cuDeviceGetName, (char *name, int len, CUdevice dev))                                                    \
    X(cuDeviceGetAttribute, (int *value, CUdevice_attribute attr, CUdevice dev))                               \
    X(cuDevicePrimaryCtxRetain, (CUcontext * ctx, CUdevice dev))                                               \
    X(cuDevicePrimaryCtxRelease, (CUdevice dev))                                                               \
    X(cuCtxSetCurrent, (CUcontext ctx))                                                                        \
    X(cuMemGetInfo, (size_t * free_bytes, size_t *total_bytes))                                                \
    X(cuMemAlloc, (CUdeviceptr * ptr, size_t bytes))                                                           \
    X(cuMemFree, (CUdeviceptr ptr))                                                                            \
    X(cuMemcpyHtoDAsync, (CUdeviceptr dst, const void *src, size_t bytes, CUstream stream))                    \
    X(cuMemcpyDtoHAsync, (void *dst, CUdeviceptr src, size_t bytes, CUstream stream))                          \
    X(cuMemcpyDtoDAsync, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream))                    \
    X(cuMemsetD8Async, (CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream))                  \
    X(cuStreamCreate, (CUstream * stream, unsigned int flags))                                                 \
    X(cuStreamDestroy, (CUstream stream))                                                                      \
    X(cuStreamSynchronize, (CUstream stream))                                                                  \
    X(cuStreamQuery, (CUstream stream))                                                                        \
    X(cuModuleLoadData, (CUmodule * module, const void *image))                                                \
    X(cuModuleUnload, (CUmodule module))                                                                       \
    X(cuModuleGetFunction, (CUfunction * fn, CUmodule module, const char *name))                               \
    X(cuLaunchKernel, (CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,         \
                       unsigned bz, unsigned shared, CUstream stream, void **params, void **extra))            \
    X(cuStreamBeginCapture, (CUstream stream, CUstreamCaptureMode mode))                                       \
    X(cuStreamEndCapture, (CUstream stream, CUgraph * graph))                                                  \
    X(cuGraphInstantiateWithFlags, (CUgraphExec * exec, CUgraph graph, unsigned long long flags))              \
    X(cuGraphLaunch, (CUgraphExec exec, CUstream stream))                                                      \
    X(cuGraphExecDestroy, (CUgraphExec exec))                                                                  \
    X(cuGraphDestroy, (CUgraph graph))                                                                         \
    X(cuEventCreate, (CUevent * event, unsigned int flags))                                                    \
    X(cuEventRecord, (CUevent event, CUstream stream))                                                         \
    X(cuEventElapsedTime, (float *ms, CUevent start, CUevent end))                                             \
    X(cuEventDestroy, (CUevent event))                                                                         \
    X(cuGetErrorName, (CUresult error, const char **name))                                                     \
    X(cuGetErrorString, (CUresult error, const char **text))

/* The loaded driver: one function pointer per entry, named without "cu". */
typedef struct cu_driver {
    void *library;
    int version; /* cuDriverGetVersion: 13000 for 13.0 */
#define CU_DRIVER_FIELD(name, params) CUresult (*name) params;
    CU_DRIVER_ENTRIES(CU_DRIVER_FIELD)
#undef CU_DRIVER_FIELD
} cu_driver;

/* Loads path (NULL: libcuda.so.1) and every entry, then cuInit(0).
 * ALLOY_ERR_UNSUPPORTED with err saying what is missing: the library (no
 * NVIDIA driver installed), an entry point (a driver older than CUDA 12.0),
 * or cuInit's error (no GPU, a driver/kernel-module mismatch). */
AL_HIDDEN alloy_status cu_driver_open(const char *path, cu_driver **out, char *err, size_t errlen);
/* Frees d; the library itself stays loaded for the process. */
AL_HIDDEN void cu_driver_close(cu_driver *d);
/* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for r, into buf; returns buf. */
AL_HIDDEN const char *cu_driver_error(const cu_driver *d, CUresult r, char *buf, size_t len);

#endif
