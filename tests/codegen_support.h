/* codegen_support.h - what the emitter's tests share (test_codegen.c, test_codegen_ops.c and the suites that emulate a step): f32 feeds, a compiled graph's step run on the CPU and its emitted kernels under the host emulation against it, and a program's kernels NVRTC-compiled in modules. */
#ifndef ALLOY_TEST_CODEGEN_SUPPORT_H
#define ALLOY_TEST_CODEGEN_SUPPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "alloy/alloy.h"
#include "codegen/emit.h"
#include "codegen/nvrtc.h"
#include "cuda_emu/emu_loader.h"
#include "runtime/cpu/cpu.h"

/* A compiled graph's feeds: the values of its inputs, by name. */
typedef struct feed_set {
    alloy_host_tensor t[64];
    int n;
} feed_set;
/* A new f32 feed called name of rank dims appended to f: its values
 * (test_malloc'd, for the caller to fill and test_free), *n of them. */
float *feed_floats(feed_set *f, const char *name, int rank, const int64_t *dims, int64_t *n);
/* Frees the values of f's feeds (each made by feed_floats). */
void feed_set_free(feed_set *f);

/* What an emulated step did. A stored value further from the CPU's than
 * codegen_tolerance counts in failed; so does a kernel that did not launch
 * (first_failure says which, the first of them). A value that differs from
 * the CPU's in any bit (any NaN equal to any NaN) counts in inexact unless
 * its step holds a row op, a reduce_sum, a reduce_mean or a convolution
 * (they may sum in another order): the other steps compute the CPU's expressions, take a
 * maximum or move data, so they give its bits (first_inexact says which). */
typedef struct emu_stats {
    int kernels, steps_emulated, steps_on_cpu, values, bitwise;
    int conv_gemm_steps; /* gemm steps headed by a convolution, emulated (its kernel and the epilogue's) */
    double worst;
    int failed, inexact;
    char first_failure[512], first_inexact[512];
} emu_stats;

/* Largest |a - b| / max(|b|) over n elements of dtype dt (0 when equal; inf on a NaN mismatch). */
double codegen_error(alloy_dtype dt, const void *a, const void *b, int64_t n);
/* The same with max(|b|) taken as at least min_scale (a sum's magnitude of terms). */
double codegen_error_at_scale(alloy_dtype dt, const void *a, const void *b, int64_t n, double min_scale);
/* Tolerance of an emulated value against the CPU's, per dtype (0 for integers and bools). */
double codegen_tolerance(alloy_dtype dt);

/* Compiled graph g's step, run once on the CPU with every value kept, and
 * the kernels cg_emit gives for its schedule (the graph stays g's). */
typedef struct cgs_step {
    alloy_graph *g;
    rt_tensor *ref; /* per compiled node: the CPU's value */
    bool *all;
    void **buf;     /* per compiled node: what the kernels read and write */
    cg_program prog;
} cgs_step;

/* Runs g's compiled step on the CPU (inputs from f, params and state from
 * g's state) keeping every value, and emits its kernels into st->prog;
 * fails the test on an error. */
void cgs_prepare(cgs_step *st, alloy_graph *g, const feed_set *f);
/* Where cgs_emulate finds a kernel: the library holding it, its name there. */
typedef struct cgs_kernel_at {
    emu_kernel *library;
    char name[64];
} cgs_kernel_at;

/* Runs st's kernels, kernel k as at[k] says, step by step on the CPU's
 * values of the step's inputs (a step without a kernel, a library call,
 * takes the CPU's values; a GEMM step's product comes from the CPU's
 * matmul, as the library would give it), comparing each value a kernel
 * stores with the CPU's. */
emu_stats cgs_emulate(cgs_step *st, const cgs_kernel_at *at);
/* Every kernel of st's program compiled for the emulation into one library
 * (NULL when there are none), and *at (test_calloc'd; the caller
 * test_frees it) naming each kernel there for cgs_emulate; fails the test
 * on a compile error. */
emu_kernel *cgs_compile(const cgs_step *st, cgs_kernel_at **at);
/* Frees what st holds (a program emitted into a zeroed st too). */
void cgs_release(cgs_step *st);
/* text (al_malloc'd; NULL on OOM) with every emitted kernel name in it,
 * "alloy_s<step>_...", as "alloy_<prefix>s<step>_...": kernels of several
 * programs in one library or NVRTC program. "" renames nothing. */
char *cgs_rename(const char *text, const char *prefix);

/* Runs compiled graph g's step once on the CPU (every value kept), then
 * every emitted kernel emulated (all in one library) against it as
 * cgs_emulate does; fails the test on a value beyond codegen_tolerance. */
emu_stats emulate_step(alloy_graph *g, const feed_set *f);

/* Skips the test, saying why, where the host emulation cannot run. */
void emu_or_skip(void);
/* NVRTC from the loader's path, or the test skipped saying why. */
cg_nvrtc *nvrtc_or_skip(void);

/* Every kernel of programs[0..n), grouped into modules as the export and
 * the runtime group them (cg_module_range), for each of archs[0..narchs)
 * through a cache in dir, on all cores; returns the milliseconds it took
 * and fails on any compile error. */
double compile_all(const cg_nvrtc *nv, const char *dir, cg_program *programs, int n, const int *archs, int narchs,
                   int *modules, int *compiles);

#endif
