/* device.h - what the CUDA backend asks of a device: memory, copies, modules of generated kernels, launches, library GEMMs, a captured step. The driver implements it on a GPU (driver_device.c); the tests implement it on the host emulation. */
#ifndef ALLOY_CUDA_DEVICE_H
#define ALLOY_CUDA_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "step/options.h"
#include "step/launch_plan.h"

typedef uint64_t cdev_ptr; /* a device address; 0 is none */
typedef struct cdev cdev;
typedef struct cdev_module cdev_module;
typedef struct cdev_function cdev_function;
typedef struct cdev_gemm cdev_gemm;
/* A GEMM run's epilogue addresses (launch_plan.h, lp_epilogue): the bias
 * vector it adds and where GELU's input goes (GELU_AUX), 0 where unused. */
typedef struct cdev_gemm_extra {
    cdev_ptr bias, aux;
} cdev_gemm_extra;
typedef struct cdev_event cdev_event;

/* A piece of device memory one action touches, for a checking device (the tests' emulation): the
 * plan slot (or leaf buffer, aux slot, GEMM scratch) an argument points into. */
typedef struct cdev_extent {
    cdev_ptr base;  /* its first byte */
    uint64_t bytes;
    int64_t offset; /* its offset in the arena or aux block (0 for a leaf's buffer) */
    uint32_t tag;   /* the value it holds: node + 1 (a GEMM's product: the matmul's) */
    uint8_t space;  /* lp_space */
    bool written;   /* the action stores into it */
    bool kept;      /* its bytes last from run to run (a reduction's block counters): read before this run writes them */
    char name[56];  /* "%12 (add)" */
} cdev_extent;

/* Every call returns ALLOY_OK, or an error with its message in dev->error
 * naming what failed (and, for memory, the bytes asked and free). Copies,
 * memsets, launches and GEMMs are queued in order on the device's one
 * stream; download waits for them. */
typedef struct cdev_ops {
    alloy_status (*alloc)(cdev *dev, size_t bytes, cdev_ptr *out);
    void (*release)(cdev *dev, cdev_ptr ptr);
    alloy_status (*upload)(cdev *dev, cdev_ptr dst, const void *src, size_t bytes);
    alloy_status (*download)(cdev *dev, void *dst, cdev_ptr src, size_t bytes);
    alloy_status (*copy)(cdev *dev, cdev_ptr dst, cdev_ptr src, size_t bytes);
    alloy_status (*zero)(cdev *dev, cdev_ptr dst, size_t bytes);
    /* Loads n modules of generated CUDA C (names[i], sources[i]), compiled
     * for this device (in parallel where it can); out[i] per module. NULL
     * where the device compiles nothing (a GPU in liballoy-runtime). */
    alloy_status (*load)(cdev *dev, int n, const char *const *names, const char *const *sources, cdev_module **out);
    /* Loads module `name` from a bundle's image of kind (bundle_image_kind:
     * a cubin or PTX on a GPU, cuModuleLoadData; the device's own
     * image_kind otherwise) with no compiler of alloy's. */
    alloy_status (*load_image)(cdev *dev, const char *name, uint32_t kind, const void *image, size_t size,
                               cdev_module **out);
    alloy_status (*function)(cdev *dev, cdev_module *m, const char *kernel, cdev_function **out);
    void (*unload)(cdev *dev, cdev_module *m); /* with its functions */
    /* params as cuLaunchKernel takes them: a pointer to each of the nparams arguments */
    alloy_status (*launch)(cdev *dev, cdev_function *f, unsigned grid, unsigned block, void **params, int nparams);
    /* A GEMM's descriptors and algorithm, chosen once (alignments of the
     * operands as lp_alignment gives them); then each run only executes
     * (ex: the epilogue's bias vector and GELU's input, 0 without). */
    alloy_status (*gemm_prepare)(cdev *dev, const lp_gemm *gm, const int align[3], cdev_gemm **out);
    alloy_status (*gemm)(cdev *dev, cdev_gemm *h, cdev_ptr a, cdev_ptr b, cdev_ptr d, cdev_gemm_extra ex);
    void (*gemm_free)(cdev *dev, cdev_gemm *h);
    /* Captured replay (NULL where the device has none): capture_begin,
     * the step's calls, capture_end gives a replayable step; replay runs it. */
    alloy_status (*capture_begin)(cdev *dev);
    alloy_status (*capture_end)(cdev *dev, void **graph);
    alloy_status (*replay)(cdev *dev, void *graph);
    void (*graph_free)(cdev *dev, void *graph);
    alloy_status (*sync)(cdev *dev);
    /* Whether everything queued has finished, without waiting (cuStreamQuery;
     * NULL where sync returns at once, as on the emulation): *done false
     * while work is in flight. What a collective's deadline polls. */
    alloy_status (*query)(cdev *dev, bool *done);
    /* The device's stream as the libraries take it (a CUstream, which is
     * NCCL's cudaStream_t; the emulation's own stream object), with the
     * device's context current on the calling thread (NCCL's communicator
     * is made on the current device). NULL where the device has none. */
    void *(*stream)(cdev *dev);
    void (*close)(cdev *dev);
    /* Timing for the profile option (NULL where the device has none): an
     * event recorded on the stream marks the moment the device reaches
     * it; elapsed gives the milliseconds between two recorded events once
     * the stream has passed both (after sync). Not recorded while capturing. */
    alloy_status (*event_new)(cdev *dev, cdev_event **out);
    alloy_status (*event_record)(cdev *dev, cdev_event *ev);
    alloy_status (*event_elapsed)(cdev *dev, cdev_event *start, cdev_event *end, float *ms);
    void (*event_free)(cdev *dev, cdev_event *ev);
    /* Checking (NULL on a GPU): the extents the next launch's arguments (or GEMM's a, b, d,
     * memset's or copy's dst and src) point into, given just before it is queued or captured;
     * and, before each run of a step, the allocations whose bytes that step defines anew (its
     * arena and aux block), so that reading what the step has not written is an error. */
    void (*describe)(cdev *dev, const cdev_extent *ext, int n);
    void (*step_begin)(cdev *dev, const cdev_ptr *fresh, int n);
} cdev_ops;

/* The oldest CUDA driver the backend runs on: 12.1, the first to take kernel parameter lists
 * over 4 KB (the generated kernels' pointer lists can be longer). */
enum { CUDA_MIN_DRIVER = 12010 };

struct cdev {
    const cdev_ops *ops;
    char name[128];   /* "NVIDIA H100 80GB HBM3 (sm_90, driver 13.0)" */
    int sm;           /* compute capability, 90 for 9.0 */
    int ordinal;      /* which GPU of the machine (cuDeviceGet's ordinal; the options' cuda_device) */
    int driver;       /* the CUDA driver's version, 13000 for 13.0; 0: unknown (an emulated device) */
    uint32_t image_kind; /* 0: a GPU, which loads the cubin or PTX bundle_cuda_pick chooses; else the only
                          * bundle image kind it loads (the tests' emulation: BUNDLE_HOST) */
    size_t reserved;  /* bytes the device holds for itself while open (cuBLASLt's workspace) */
    char error[1024]; /* the last failure */
};

/* The GPU through the driver (driver_device.c): libcuda.so.1, device
 * ordinal cfg->cuda_device (0 when unset), a primary context and a stream; cuBLASLt loaded; and in
 * liballoy NVRTC and cfg's kernel cache (driver_jit.h), nthreads compiling.
 * ALLOY_ERR_UNSUPPORTED with err naming what is missing (the driver, a
 * GPU, a library) when this machine cannot run CUDA; an ordinal the
 * machine lacks is ALLOY_ERR_UNSUPPORTED naming it and the GPUs there are. */
AL_HIDDEN alloy_status cdev_open_driver(const al_options *cfg, int nthreads, cdev **out, char *err, size_t errlen);

#endif
