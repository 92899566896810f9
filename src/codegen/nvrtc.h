/* nvrtc.h - NVRTC loaded at run time: its version and architectures, CUDA C compiled to a CUBIN or PTX, one kernel or many on a thread pool. */
#ifndef ALLOY_CG_NVRTC_H
#define ALLOY_CG_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

#include "base/base.h"

/* A loaded NVRTC library (cg_nvrtc_open). Read-only once open: the compile
 * calls may share it between threads. */
typedef struct cg_nvrtc cg_nvrtc;

typedef enum cg_binary_kind {
    CG_CUBIN, /* machine code for one sm_XY, an ELF file */
    CG_PTX    /* PTX text for a compute_XY, which the driver compiles when it loads it */
} cg_binary_kind;

/* The most threads cg_parallel starts (more are clamped to this). */
#define CG_MAX_THREADS 64

/* One kernel to compile. */
typedef struct cg_kernel_src {
    /* the program's file name without ".cu" (NVRTC's program name, and the
     * file the source is dumped to): 1-100 characters of [A-Za-z0-9_.-],
     * not starting with '.' */
    const char *name;
    const char *source; /* CUDA C; brings its own f16/bf16 types (no include path is given) */
    int sm;             /* the GPU's compute capability as major*10+minor: 80, 90, 120 */
    /* NVRTC options after the defaults (-DNAME=1, --maxrregcount=64); none
     * may be empty or hold whitespace, so the options text is unambiguous */
    const char *const *options;
    int noptions;
    bool ptx; /* PTX for compute_<target> even where NVRTC has a CUBIN for it (a bundle's JIT fallback) */
} cg_kernel_src;

/* What a compile gives; the caller owns it (cg_binary_free). Every field is
 * filled as far as the compile got: options once the target is chosen, log
 * once NVRTC ran. */
typedef struct cg_binary {
    alloy_status status; /* ALLOY_OK, or why there is no binary (message) */
    cg_binary_kind kind;
    int arch; /* what it is for: sm_<arch> (CG_CUBIN) or compute_<arch> (CG_PTX) */
    /* the CUBIN, or the PTX with its terminating NUL counted in size (as
     * cuModuleLoadData wants it); NULL when status is not ALLOY_OK */
    unsigned char *data;
    size_t size;
    char *options; /* every option NVRTC was given, separated by single spaces (part of cache keys) */
    char *log;     /* NVRTC's log ("" when it said nothing); warnings on success */
    char *message; /* on failure: what failed, with the whole log; NULL on success */
    bool cached;   /* came from a kernel cache without compiling (cache.h) */
    char key[65];  /* the kernel cache's key (hex) when it went through one, else "" */
} cg_binary;

/* Loads NVRTC: from path when it is not NULL, else libnvrtc.so.13, then .12,
 * then .11.2 from the dynamic loader's search path; each first with
 * RTLD_NOLOAD (a copy the process already has), then loaded. Resolves every
 * entry point alloy uses, reads the version and the architecture list.
 * ALLOY_ERR_UNSUPPORTED when no library loads or one lacks a symbol (the
 * message names the library, the symbol, and where it looked); ALLOY_ERR_OOM.
 * *out is NULL on failure. */
AL_HIDDEN alloy_status cg_nvrtc_open(const char *path, cg_nvrtc **out, char *err, size_t errlen);
/* Unloads (the loader keeps it while other handles hold it). NULL is fine. */
AL_HIDDEN void cg_nvrtc_close(cg_nvrtc *nv);
/* NVRTC's version (13, 0). */
AL_HIDDEN void cg_nvrtc_version(const cg_nvrtc *nv, int *major, int *minor);
/* The architectures NVRTC compiles CUBINs for (75, 80, ... ascending) in
 * *archs (owned by nv); returns their count. */
AL_HIDDEN int cg_nvrtc_archs(const cg_nvrtc *nv, const int **archs);
/* The file the library was loaded from ("/usr/local/cuda-13.0/lib/libnvrtc.so.13"). */
AL_HIDDEN const char *cg_nvrtc_library(const cg_nvrtc *nv);
/* What identifies this compiler in cache keys: "nvrtc 13.0 size 109338064".
 * NVRTC reports no patch level, so the library file's size stands in for
 * the build (independent of where it is installed). */
AL_HIDDEN const char *cg_nvrtc_id(const cg_nvrtc *nv);

/* Chooses what to build for a GPU of compute capability sm: a CUBIN for sm
 * when NVRTC lists it, else PTX for the newest listed architecture below
 * sm. ALLOY_ERR_UNSUPPORTED when NVRTC lists nothing at or below sm;
 * ALLOY_ERR_INVALID for sm outside 10..9999. */
AL_HIDDEN alloy_status cg_nvrtc_target(const cg_nvrtc *nv, int sm, cg_binary_kind *kind, int *arch, char *err,
                                       size_t errlen);
/* Everything a compile of k decides before running NVRTC, into *out (which
 * it first clears; cg_binary_free it): the kind and arch (cg_nvrtc_target)
 * and the options text, the defaults first: --gpu-architecture=sm_XY or
 * compute_XY, --std=c++17, -default-device, and --minimal when NVRTC is 12.4
 * or newer; then k's options. Checks k's name and options. On failure sets
 * out->status and out->message (copied into err) and returns the status. */
AL_HIDDEN alloy_status cg_nvrtc_prepare(const cg_nvrtc *nv, const cg_kernel_src *k, cg_binary *out, char *err,
                                        size_t errlen);
/* Writes k's source to dump_dir/NAME.cu (making dump_dir if it is missing)
 * with al_file_write (base/file.h: atomically, a link followed, anything
 * but a regular file refused) and its path into path. ALLOY_ERR_IO when
 * that fails. */
AL_HIDDEN alloy_status cg_nvrtc_dump(const char *dump_dir, const cg_kernel_src *k, char *path, size_t pathlen,
                                     char *err, size_t errlen);
/* Compiles k (cg_nvrtc_prepare, then NVRTC) into *out. With a dump_dir
 * (NULL: none) the source is written there first and a failure's message
 * names that file. A kernel NVRTC rejects is ALLOY_ERR_NVRTC with the whole
 * NVRTC log in out->message and out->log (and as much as fits in err); an
 * NVRTC out-of-memory is ALLOY_ERR_OOM. Safe to call from several threads
 * on one nv. */
AL_HIDDEN alloy_status cg_nvrtc_compile(const cg_nvrtc *nv, const cg_kernel_src *k, const char *dump_dir,
                                        cg_binary *out, char *err, size_t errlen);
/* Compiles ks[0..n) on nthreads threads (the caller's thread is one of
 * them), each into outs[i] as cg_nvrtc_compile would, in input order; a
 * failure does not stop the others. Returns ALLOY_OK, or the status of the
 * first result (in input order) that failed. */
AL_HIDDEN alloy_status cg_nvrtc_compile_many(const cg_nvrtc *nv, const cg_kernel_src *ks, int n, int nthreads,
                                             const char *dump_dir, cg_binary *outs);
/* Frees what *b holds and clears it. NULL is fine. */
AL_HIDDEN void cg_binary_free(cg_binary *b);
/* Marks *b failed with status and a formatted message (al_malloc'd; a fixed
 * text if that fails), copies the message into err, returns status. */
AL_HIDDEN alloy_status cg_binary_fail(cg_binary *b, alloy_status status, char *err, size_t errlen, const char *fmt,
                                      ...) AL_PRINTF(5, 6);

/* The thread pool the compile calls share: body(ctx, i) for every i in
 * [0, n) on up to nthreads threads (the caller's among them; threads that
 * cannot be started leave their share to the others). */
AL_HIDDEN void cg_parallel(int n, int nthreads, void (*body)(void *ctx, int i), void *ctx);
/* The allocator hook (al_malloc and friends) under one lock: what codegen
 * allocates on pool threads goes through these, since the hook a program
 * installs (cmocka's, in the tests) need not be thread-safe. */
AL_HIDDEN void *cg_malloc(size_t size);
AL_HIDDEN void *cg_realloc(void *ptr, size_t size);
AL_HIDDEN void cg_free(void *ptr);
AL_HIDDEN char *cg_strdup(const char *s);

#endif
