/* cpu_backend.h - opening the CPU backend (the registry, runtime/backend.c, is its one caller in the library). */
#ifndef ALLOY_CPU_BACKEND_H
#define ALLOY_CPU_BACKEND_H

#include "runtime/backend.h"

/* Opens the CPU backend with cfg's threads, BLAS and GEMM choices. */
AL_HIDDEN alloy_status cpu_backend_open(const al_options *cfg, rt_backend **out, char *err, size_t errlen);

#endif
