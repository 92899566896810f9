/* cpu_fused.h - a fused group's chunk-loop plan and the functions that build and run it (the cpu_fused*.c files). */
#ifndef ALLOY_CPU_FUSED_H
#define ALLOY_CPU_FUSED_H

#include "runtime/cpu/cpu.h"
#include "runtime/cpu/cpu_workers.h"

/* A member's chunk function: y[0..n) from operands a, b, c (never NULL,
 * never aliasing y) and the op's attributes p (cpu_fused_kernels.c). */
typedef void (*fz_f32)(int64_t n, float *restrict y, const float *restrict a, const float *restrict b,
                       const float *restrict c, const double *p);
typedef void (*fz_f64)(int64_t n, double *restrict y, const double *restrict a,
                       const double *restrict b, const double *restrict c, const double *p);

/* The chunk functions of an op, f32 and f64. */
typedef struct fz_kernel {
    fz_f32 f32;
    fz_f64 f64;
} fz_kernel;

/* Each elementwise op's chunk functions for groups of two or more members,
 * indexed by ir_op. */
AL_HIDDEN extern const fz_kernel fz_kernels[IR_OP_COUNT];

/* A cast member's chunk functions: y = a (b, c and p unused). */
AL_HIDDEN void fz_copy_f32(int64_t n, float *restrict y, const float *restrict a, const float *restrict b,
                           const float *restrict c, const double *p);
AL_HIDDEN void fz_copy_f64(int64_t n, double *restrict y, const double *restrict a, const double *restrict b,
                           const double *restrict c, const double *p);

/* Elements per step (a plan's chunk, CHUNK or CHUNK / 2): every buffer of
 * a chunk (one per input that is converted, gathered or a broadcast
 * scalar, one per live member) must stay in L1 while the members run. An
 * AdamW update has ~20 of them: on an AdamW-like chain of 4M f32 (bench
 * notes in docs/fusion.md) 128 ran in 12 ms, 256 in 17 ms, 1024 in 20 ms.
 * A group whose buffers take at most SMALL_BUFFERS bytes at CHUNK (the
 * bf16 step's epilogues and gradient groups) runs CHUNK at a time, half
 * as many trips through the members' loop (bench/RESULTS.md, "char_gpt's
 * bf16 step"); unfused ops do not care. A thread is worth waking for
 * about MIN_WORK element-visits (loads plus member evaluations). */
enum { CHUNK = 256, SMALL_BUFFERS = 16 << 10, MIN_WORK = 1 << 17, MAX_THREADS = CPU_MAX_THREADS };

/* How an external input walks the iteration space. */
typedef enum fz_walk {
    WALK_DENSE,   /* its elements are the iteration order: read at the flat index */
    WALK_UNIFORM, /* one element for the whole space (a scalar, or broadcast everywhere) */
    WALK_STRIDED, /* broadcast along some dims: gathered row segment by row segment */
} fz_walk;

typedef struct fz_input {
    alloy_dtype dtype;
    size_t es;
    const char *data;
    fz_walk walk;
    /* a GEMM's f32 product (dense walk, f32 compute only): when ranged, the
     * range rule of range_dtype applied as it is loaded; stored rounded to
     * store_dtype at store (NULL: not) */
    bool ranged;
    alloy_dtype range_dtype, store_dtype;
    char *store;
    bool aliased; /* a member is stored over it (an update written in place): read through a copy */
    int into;     /* >= 0: its chunks are converted straight into that member's destination (load_into_dst) */
    bool laid_out; /* a strided view (step/attn_views.h): stride starts as its layout (laid_out_strides) */
    bool row;      /* strided along the last iteration dim only, with stride 1: a row broadcast to every row (a bias) */
    int64_t stride[ALLOY_MAX_RANK]; /* elements per step of each iteration dim */
} fz_input;

typedef struct fz_member {
    fz_f32 f32;
    fz_f64 f64;
    int src[3];  /* >= 0: external input; < 0: member -src-1; unused operands -0x7fff */
    int nin;
    int slot;    /* chunk buffer holding its value, or -1: computed straight into dst (or passed) */
    bool passed; /* a cast whose value is its input's chunk as loaded: that chunk, not a copy */
    char *dst;   /* where it is stored, or NULL: never materialized */
    bool exact;  /* a bool or integer result, or a cast to f16/bf16: rounded to its dtype in the buffer too */
    bool check;  /* found_inf reads it: any non-finite value (as stored) sets the plan's flag */
    bool ranged; /* an unrounded f16/bf16 value: overflows to inf as a store would (cpu_range_f32) */
    uint8_t *flag; /* amp_check: its node's NONFINITE_* bits (cpu_exec.nonfinite), or NULL */
    rt_range *range; /* amp_stats: its node's statistics (cpu_exec.ranges), or NULL */
    double p[IR_EW_MAX_ATTRS]; /* the op's attributes (ir_ew_params) */
    alloy_dtype dtype;
    size_t es;
    /* stored through strides (a result written in its transpose's order,
     * step/attn_views.h): computed into a chunk buffer and stored from it,
     * row segment by row segment, to dst + the elements per step of each
     * iteration dim */
    bool scatter;
    int64_t stride[ALLOY_MAX_RANK];
} fz_member;

typedef struct fz_plan {
    bool wide; /* computes in f64 */
    int rank;  /* of the coalesced iteration space (>= 1) */
    int64_t dims[ALLOY_MAX_RANK];
    int64_t total;
    int64_t chunk; /* elements per chunk: CHUNK, or CHUNK / 2 for a group of many buffers */
    int ninputs, nmembers, nslots;
    fz_input *inputs;
    fz_member *members;
    int *nonfinite; /* set to 1 when a `check` member has a non-finite value (any thread) */
} fz_plan;

enum { NO_OPERAND = -0x7fff };

/* ---- cpu_fused_plan.c ---- */

/* Fills p's members, inputs and chunk buffers for the n members of a group
 * (the contract at its definition in cpu_fused_plan.c). Returns NULL, or why the
 * group cannot run. */
AL_HIDDEN const char *fz_make_plan(fz_plan *p, const cpu_exec *x, const ir_graph *g, const sched_member *members,
                                   int n, const rt_tensor *values, const ir_type *whole, const ir_type **in_types,
                                   int *last_use, int *free_slots, int *ext_slots, uint32_t ext_mask);
/* Folds x's GEMM product's range rule and rounded store into p's chunk
 * loop, or applies both over the whole product now. */
AL_HIDDEN void fz_fold_product(cpu_exec *x, fz_plan *p);
/* Converts the chunks of a widening cast's input straight into its
 * destination where that is safe. */
AL_HIDDEN void fz_load_into_dst(fz_plan *p);
/* Marks the inputs of p a member is stored over and read after the store:
 * those are read through their chunk buffer. */
AL_HIDDEN void fz_mark_aliased(fz_plan *p, const sched_member *members, int n, const int *state_of,
                               const int *ext_slots, const int *ext_id, uint32_t ext_mask, int *last,
                               uint8_t *passed);

/* ---- cpu_fused_walk.c ---- */

/* Coalesces p's iteration space of shape out and sets each input's walk;
 * in_types: the inputs' types. */
AL_HIDDEN void fz_build_space(fz_plan *p, const ir_type *out, const ir_type *const *in_types);
/* Loads len elements of in from flat index start into buf (compute type). */
AL_HIDDEN void fz_gather(const fz_plan *p, const fz_input *in, int64_t start, int64_t len, void *buf);
/* Stores len elements of mb's chunk y (compute type, from flat index start)
 * to their strided places, rounded to mb's dtype. */
AL_HIDDEN void fz_scatter(const fz_plan *p, const fz_member *mb, int64_t start, int64_t len, const void *y);

/* ---- cpu_fused_convert.c ---- */

/* n values of dtype dt at src widened to f32 into dst. */
AL_HIDDEN void fz_load_chunk_f32(alloy_dtype dt, const void *src, float *dst, int64_t n);
/* n f32 values at src rounded to dtype dt into dst. */
AL_HIDDEN void fz_store_chunk_f32(alloy_dtype dt, const float *src, void *dst, int64_t n);
/* The range rule of dt from x into y (x == y allowed). */
AL_HIDDEN void fz_range_copy_f32(alloy_dtype dt, const float *x, float *y, int64_t n);
/* Whether the range rule of dt changes any of x[0..n). */
AL_HIDDEN bool fz_range_changes(alloy_dtype dt, const float *x, int64_t n);
/* The range rule of dt on y[0..n) in f64, in place. */
AL_HIDDEN void fz_range_f64(alloy_dtype dt, double *y, int64_t n);

/* ---- cpu_fused_nonfinite.c ---- */

/* Whether any of n values of dtype dt at p is an inf or NaN. */
AL_HIDDEN bool fz_any_nonfinite(alloy_dtype dt, const void *p, int64_t n);
/* amp_check on mb's chunk y of len values: ors its NONFINITE_* bits into
 * mb->flag (dst: where it was stored, or NULL; roundtrip: chunk * 8 bytes). */
AL_HIDDEN void fz_flag_nonfinite(const fz_member *mb, bool wide, const void *y, const char *dst, char *roundtrip,
                                 int64_t len);

/* ---- cpu_fused_chunks.c ---- */

/* Runs all of p's nchunks chunks on `threads` of w's threads (the caller
 * one of them), each in its share of w's chunk buffers. */
AL_HIDDEN void fz_run_parallel(cpu_workers *w, const fz_plan *p, int threads, int64_t nchunks);

#endif
