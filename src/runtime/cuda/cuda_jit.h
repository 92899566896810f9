/* cuda_jit.h - the CUDA backend's compiler half: a step's kernels emitted (cg_emit) and compiled on the device. liballoy has it (cuda_jit.c); liballoy-runtime, which runs bundles' images only, has cuda_jit_none.c, which refuses. */
#ifndef ALLOY_CUDA_JIT_H
#define ALLOY_CUDA_JIT_H

#include "runtime/backend.h"
#include "runtime/cuda/device.h"

/* The kernels of schedule s of g into *out; an error on b naming why
 * (liballoy-runtime: ALLOY_ERR_UNSUPPORTED, it has no emitter). */
AL_HIDDEN alloy_status cuda_jit_make_kernels(rt_backend *b, const ir_graph *g, const schedule *s, cg_program *out);
/* Compiles prog's kernels on dev in modules (*modules, *nmodules: allocated
 * here) and finds each kernel's function into fn[q]; frees the sources. */
AL_HIDDEN alloy_status cuda_jit_load(rt_backend *b, cdev *dev, cg_program *prog, cdev_module ***modules, int *nmodules,
                                     cdev_function **fn);
/* Frees what cuda_jit_make_kernels made. */
AL_HIDDEN void cuda_jit_free(cg_program *prog);

#endif
