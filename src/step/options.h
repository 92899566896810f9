/* options.h - alloy's one configuration struct: filled once at the API boundary (environment, alloyc flags, alloy_graph_set_option), read by passes and backends, printed in dumps, hashed into cache keys. */
#ifndef ALLOY_OPTIONS_H
#define ALLOY_OPTIONS_H

#include <stdint.h>
#include <stdio.h>

#include "base/base.h"

/* The longest path an option holds, with its NUL. */
#define OPT_PATH_MAX 1024

typedef enum opt_device { OPT_DEVICE_AUTO, OPT_DEVICE_CPU, OPT_DEVICE_CUDA } opt_device;
/* The CPU's f16/bf16 GEMM kernel (runtime/cpu/gemm_lowp.h): auto picks the
 * fastest this CPU has; the others force one (one the CPU lacks gives the
 * next one down: avx512_bf16, avx512, avx2, portable). */
typedef enum opt_lowp_gemm {
    OPT_LOWP_AUTO,
    OPT_LOWP_AVX512_BF16, /* vdpbf16ps on K-pair panels (bf16; f16 takes avx512) */
    OPT_LOWP_AVX512,      /* AVX-512 FMA on f32 panels converted while packing */
    OPT_LOWP_PORTABLE,    /* C on f32 panels: any CPU */
    OPT_LOWP_SGEMM,       /* both operands converted to f32, then the f32 GEMM (the BLAS) */
    OPT_LOWP_AVX2,        /* AVX2 FMA on avx512's f32 panels, its bits (forced only; below avx512) */
    OPT_LOWP_COUNT
} opt_lowp_gemm;

/* Every knob that changes what alloy compiles or how it runs. Nothing below
 * the API reads the environment: this struct is the configuration. */
typedef struct al_options {
    uint32_t print_after;  /* bit i: print the IR after pipeline pass i (pass_name) */
    uint32_t print_before; /* bit i: print the IR before pipeline pass i */
    uint32_t disabled;     /* bit i: skip pipeline pass i */
    uint32_t no_fuse;      /* bit 1 << ir_group_kind: form no groups of that kind; OPT_NO_FUSE_ALL: none */
    bool amp_log;          /* the amp pass reports what it converted and why */
    bool amp_check;        /* runs flag each value that is not finite (the overflow locator; CPU and CUDA) */
    bool amp_stats;        /* runs track each f16/bf16 value's max |x| and underflow fraction (range statistics; CPU and CUDA) */
    double amp_range_margin; /* range-aware colouring: a node whose max |x| times this would overflow stays f32; 0: 2 */
    bool time_passes;      /* the pass manager prints each pass's time and node count */
    bool no_arena;         /* the memory plan gives every value its own slot (no reuse) */
    bool blas;             /* the CPU backend's GEMM uses the BLAS when the build has one */
    int num_threads;       /* CPU worker threads (and NVRTC compiles); 0: every online CPU */
    opt_lowp_gemm lowp_gemm; /* the CPU's f16/bf16 GEMM kernel */
    opt_device device;
    bool cuda_graph;       /* the CUDA backend captures a step after its first run and replays it (0: launches every call) */
    bool cuda_gemm_f32;    /* cuBLASLt writes an f16/bf16 product's cast to f32 itself (no range rule; docs/cuda.md) */
    int cuda_device;       /* the GPU the CUDA backend opens (its ordinal); -1: a data-parallel rank's local rank, else 0 */
    bool attention_always; /* the attention pass rewrites every match (default: for CUDA, and on the CPU big ones) */
    bool remat_always;     /* the remat pass recomputes every softmax it can (default: for CUDA, and on the CPU big ones) and keeps the forward's f16/bf16 copies, as for CUDA */
    int profile;           /* N > 0: after every N-th run, a table of what each launch (CPU: each step) took; 0: none */
    /* The kernel cache and source dumps: where generated code goes, not
     * what it is, so they stay out of opt_hash. Strings are NUL-padded to
     * their end (opt_init zeroes them), so the struct compares with memcmp. */
    bool cache;                       /* false: no kernel cache at all, in memory or on disk */
    char cache_dir[OPT_PATH_MAX];     /* the cache's directory; "": the default (runtime/graph resolves it) */
    char dump_dir[OPT_PATH_MAX];      /* every generated source is also written here; "": none */
    char nvrtc[OPT_PATH_MAX];         /* the NVRTC library to load; "": libnvrtc.so.13, .12, .11.2 from the loader's path */
    char nccl[OPT_PATH_MAX];          /* the NCCL library a data-parallel CUDA step loads; "": libnccl.so.2 */
    /* range-aware colouring (docs/amp.md, "Range statistics"): the stats
     * file the amp pass reads; "": none. Its contents change what is
     * compiled: a cache key over compiled code must take them too. */
    char amp_ranges[OPT_PATH_MAX];
} al_options;

#define OPT_NO_FUSE_ALL 1u

/* One option: its name (alloy_graph_set_option, alloyc --NAME) and the
 * environment variable that sets it. */
typedef struct opt_key {
    const char *name;
    const char *env;
    const char *help; /* the values it takes */
} opt_key;

/* The options, in the order opt_print writes them; ends with {NULL}. */
AL_HIDDEN extern const opt_key opt_keys[];

/* Defaults: nothing printed or disabled, fusion on, BLAS on, threads 0 (all
 * CPUs), device auto, cuda_device -1 (by local rank), CUDA graphs on, kernel cache on in its default directory, no dumps. */
AL_HIDDEN void opt_init(al_options *o);
/* Sets option `name` from its text form (pass lists "amp,fuse" or "all",
 * fusion kinds "row,gemm,multi" or "1"/"all", booleans 0/1, a thread
 * count, a device, a directory of fewer than OPT_PATH_MAX bytes). An
 * unknown name or value leaves o unchanged and returns ALLOY_ERR_INVALID
 * with err naming the option and listing the valid values. An empty value resets the option to its default. */
AL_HIDDEN alloy_status opt_set(al_options *o, const char *name, const char *value, char *err,
                               size_t errlen);
/* One line "# options: name=value ..." of every option that differs from
 * the default (just "# options: defaults" when none does). */
AL_HIDDEN void opt_print(const al_options *o, FILE *out);
/* A hash of the options that change compiled code (not the printing ones),
 * for kernel-cache and bundle keys. */
AL_HIDDEN uint64_t opt_hash(const al_options *o);

#endif
