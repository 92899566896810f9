/* cuda_backend.h - opening the CUDA backend: on the GPU the driver finds, or on any device that implements device.h (the tests' host emulation). */
#ifndef ALLOY_CUDA_BACKEND_H
#define ALLOY_CUDA_BACKEND_H

#include "runtime/backend.h"
#include "runtime/cuda/device.h"

/* The backend over dev (taken: closed with the backend, or here on failure).
 * ALLOY_ERR_UNSUPPORTED when dev's driver is older than CUDA_MIN_DRIVER.
 * With ALLOY_CUDA_SYNC=1 in the environment every action is launched
 * directly (no graph) and waited for, and a fault names its step, action,
 * kernel and launch shape. */
AL_HIDDEN alloy_status cuda_backend_open_on(const al_options *cfg, cdev *dev, rt_backend **out, char *err,
                                            size_t errlen);
/* The backend over the first GPU (cdev_open_driver with cfg's NVRTC, kernel
 * cache and dump settings); ALLOY_ERR_UNSUPPORTED with err naming what
 * this machine lacks. */
AL_HIDDEN alloy_status cuda_backend_open(const al_options *cfg, rt_backend **out, char *err, size_t errlen);

#endif
