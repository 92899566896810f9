/* extents.h - the device memory each action of a launch plan touches, as extents (device.h) for a device that checks its accesses. */
#ifndef ALLOY_CUDA_EXTENTS_H
#define ALLOY_CUDA_EXTENTS_H

#include "runtime/cuda/device.h"

/* Where a run's places are: the arena, the aux block, and per node the buffer bound to a leaf. */
typedef struct cu_bases {
    cdev_ptr arena, aux;
    const cdev_ptr *leaf;
} cu_bases;

/* The extents action a of plan lp (graph g, schedule s, memory plan p, kernels prog) touches, into
 * out (at most max; a kernel's one per parameter, in order): each argument's whole plan slot (a
 * padded value's rows at their row stride: sched_pad), leaf
 * buffer, aux slot or GEMM scratch (a GEMM: A, B, D, then a BIAS epilogue's vector, then a
 * pointer-array GEMM's arrays), with the
 * value it holds and whether the action writes it.
 * Returns how many. */
AL_HIDDEN int cu_action_extents(const ir_graph *g, const schedule *s, const mem_plan *p, const lp_plan *lp,
                                const cg_program *prog, const lp_action *a, cu_bases at, cdev_extent *out, int max);

#endif
