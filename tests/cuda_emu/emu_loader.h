/* emu_loader.h - compiles a CUDA C++ kernel source as host C++ against emu.h, loads it and launches it: generated kernels run without a GPU. */
#ifndef ALLOY_EMU_LOADER_H
#define ALLOY_EMU_LOADER_H

#include <stdbool.h>
#include <stddef.h>

typedef struct emu_kernel emu_kernel;

/* Whether the host C++ compiler ($CXX, else c++) is on PATH; false with the
 * reason in why (a test then skips). */
bool emu_available(char *why, size_t len);

/* Compiles source (CUDA C++ with an ALLOY_HOST_EMULATION trampoline
 * kernel_name__host) with emu.h force-included into a shared library in a
 * temporary directory (kept until emu_free, for sanitizers' stack traces) and
 * loads it. $CXX may carry extra flags ("g++ -DALLOY_EMU_STACK=262144").
 * NULL with the reason in err: the compiler's own output on a compile error,
 * or a missing symbol. */
emu_kernel *emu_compile(const char *source, const char *kernel_name, char *err, size_t errlen);

/* A module's image for the emulated device: source compiled as
 * emu_compile does into a shared object, its bytes in *bytes (free them).
 * 0, or -1 with the reason. */
int emu_build_image(const char *source, unsigned char **bytes, size_t *len, char *err, size_t errlen);

/* Loads an image emu_build_image made (no compiler runs); emu_select
 * picks its kernel. NULL with the reason. */
emu_kernel *emu_load_image(const void *bytes, size_t len, char *err, size_t errlen);

/* How many sources emu_compile and emu_build_image have compiled since the
 * process started; and, poisoned, every compile fails (a test proving a
 * path compiles nothing). */
long emu_compile_count(void);
void emu_poison_compiles(bool on);

/* Makes k launch kernel_name of the same library (one compile of a source
 * with many kernels); -1 with the reason when it has no such trampoline. */
int emu_select(emu_kernel *k, const char *kernel_name, char *err, size_t errlen);

/* Runs the kernel on grid x block threads; params as cuLaunchKernel takes
 * them (an array of pointers to each argument). 0, or -1 with the reason in
 * err, after "kernel NAME: " (bad dimensions, divergent barrier, a thread's
 * stack overflow, a checker's finding, ...). */
int emu_launch(const emu_kernel *k, const unsigned grid[3], const unsigned block[3], void **params, char *err,
               size_t errlen);

/* A checker of a kernel's global-memory accesses (emu_slots.h): the access of n bytes at p (kind:
 * 0 a read, 1 a write, 2 an atomic, 3 a __threadfence: p NULL, n 0) by a thread of block (its
 * linear index in the grid); nonzero
 * with the finding in msg fails the launch. */
typedef int (*emu_global_check)(void *ctx, const void *p, unsigned n, int kind, unsigned block, char *msg, size_t len);
/* Has fn(ctx, ...) see every access outside k's own data in k's launches from now (NULL: none);
 * false when k was compiled without the checker's hooks (checking off, or a ThreadSanitizer build). */
bool emu_check_global(const emu_kernel *k, emu_global_check fn, void *ctx);

/* Whether the emulation's checkers are on: unless ALLOY_EMU_CHECK=0 (kernels compiled while it is
 * 0 lack the shared-memory checker; launches while it is 0 skip the others). */
bool emu_checking(void);
/* Whether kernels compiled now get the shared-memory checker (races, uninitialised reads) and the
 * hooks of the global one: checking, and no ThreadSanitizer in the flags. Under AddressSanitizer
 * the checked kernels are compiled without it and ask the process's ASan about each access. */
bool emu_checks_shared(void);

/* Whether kernels compiled now get the GPU-numerics mode (ALLOY_EMU_NUMERICS=gpu: FMA
 * contraction as NVRTC's default --fmad=true, and CUDA's math functions at their documented
 * maximum ulp error, emu_gpumath.h); a value other than host or gpu fails each compile. */
bool emu_gpu_numerics(void);

/* source with each "__shared__ TYPE a[N], b[M][K], c;" declaration rewritten into statics that put
 * 64 bytes of redzone before and after each array, registered for the shared-memory checker (an
 * access to a redzone fails the launch naming the array); a declaration of another form (extern,
 * pointers, initialisers) stays as it is, after a comment saying so. The loader compiles this
 * instead of source when kernels get the shared-memory checker. Malloc'd; NULL when out of memory. */
char *emu_redzone_rewrite(const char *source);

/* Unloads the kernel; NULL is fine. */
void emu_free(emu_kernel *k);

#endif
