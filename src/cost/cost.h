/* cost.h - the launch-plan cost model: every launch of a compiled step (generated kernel, cuBLASLt GEMM, memset, copy) with its bytes, FLOPs and ptxas resources, timed by a table of named device constants; no GPU needed. */
#ifndef ALLOY_COST_H
#define ALLOY_COST_H

#include <stdio.h>

#include "codegen/emit.h"
#include "codegen/ptxas.h"
#include "step/launch_plan.h"

/* ---- device constants (device_table.c) ---- */

/* What the model assumes of one GPU. Every rate is a low-high range: the
 * low end gives the high time. Where each comes from: device_table.c. */
typedef struct cost_device {
    const char *name;   /* "h100", "h200" */
    const char *title;  /* "H100 SXM 80GB (HBM3)" */
    double hbm;         /* peak HBM bandwidth, bytes/s */
    double eff_lo, eff_hi;       /* fraction of hbm a generated kernel, memset or copy reaches */
    int sms;                     /* streaming multiprocessors: a kernel of fewer blocks gets that share of hbm */
    double tensor_lo, tensor_hi; /* f16/bf16 GEMMs on tensor cores (f32 sums), FLOP/s */
    double odd_lo, odd_hi;       /* the same when a leading dimension is not a multiple of 16 bytes */
    double f32_lo, f32_hi;       /* f32 GEMMs (no TF32) and SIMT FLOPs, FLOP/s */
    double attn_lo, attn_hi;     /* alloy's mma.sync attention kernels, FLOP/s */
    double floor_lo, floor_hi;   /* shortest time of a kernel or GEMM, seconds */
    double node_lo, node_hi;     /* cost of each node of a replayed CUDA graph, seconds */
    /* collectives (NCCL, ring algorithm) among the GPUs of one machine */
    double link;                 /* NVLink bandwidth per GPU and direction, bytes/s */
    double link_eff_lo, link_eff_hi; /* fraction of link a ring collective reaches (bus bandwidth) */
    double ib;                   /* between machines: the network per GPU and direction, bytes/s (printed, not used) */
    double coll_lo, coll_hi;     /* latency of a collective of few bytes, seconds */
} cost_device;

/* The table of name ("h100", "h200"; case-insensitive), NULL when none. */
AL_HIDDEN const cost_device *cost_device_find(const char *name);
/* The names the tables have, "h100, h200", for messages. */
AL_HIDDEN const char *cost_device_names(void);
/* Prints d's constants, one per line with its unit, as '#' lines. */
AL_HIDDEN void cost_device_print(FILE *out, const cost_device *d);
/* The same for its collective constants (printed when a step has collectives). */
AL_HIDDEN void cost_device_print_links(FILE *out, const cost_device *d);

/* ---- launches (cost.c) ---- */

typedef enum cost_action { COST_KERNEL, COST_GEMM, COST_MEMSET, COST_COPY, COST_COLLECTIVE } cost_action;

/* What a launch is for, the grouping of the summary (cost_class_name). */
typedef enum cost_class {
    COST_GEMM_ALIGNED, /* a cuBLASLt GEMM, every leading dimension a multiple of 16 bytes */
    COST_GEMM_ODD,     /* a cuBLASLt GEMM with an odd leading dimension (the vocabulary's 50257) */
    COST_ATTENTION,    /* the attention op's kernels */
    COST_ROW,          /* row kernels (softmax, norms, cross-entropy) and their column sums */
    COST_LAYOUT,       /* movement ops as copy kernels: reshape, transpose, slice, concat, pad, broadcast */
    COST_EPILOGUE,     /* a gemm step's epilogue kernel (reads the f32 product back) */
    COST_ELEMENTWISE,  /* ew steps and casts */
    COST_MULTI,        /* multi-tensor steps (the optimizer, unscale, found_inf) */
    COST_OTHER_OP,     /* reductions, embeddings, gathers and other op kernels */
    COST_TINY,         /* any generated kernel of at most COST_TINY_BLOCKS blocks (bookkeeping) */
    COST_MEMSET_CLASS, /* flags zeroed */
    COST_COPY_CLASS,   /* updates copied into state */
    COST_COLLECTIVE_CLASS, /* data-parallel collectives: all_reduce, reduce_scatter, all_gather over the ranks */
    COST_NCLASSES
} cost_class;

/* A kernel of at most this many blocks is COST_TINY, whatever its step. */
#define COST_TINY_BLOCKS 4

/* One launch of the step. */
typedef struct cost_launch {
    cost_action action;
    cost_class cls;
    int step;   /* its schedule step; -1: an update's copy after the steps */
    int index;  /* COST_KERNEL: the kernel in the program; COST_GEMM: the GEMM in the launch plan; else -1 */
    char name[64];
    unsigned grid, block; /* generated kernels; 0 for the rest */
    int64_t read, written; /* bytes from and to device memory, each element once */
    int64_t spill;         /* bytes of local memory the kernel's spills move (ptxas' per-thread counts x threads x passes) */
    int64_t emitted;       /* kernels: the emitter's own count (cg_kernel.bytes: export summary, profile) */
    int64_t link;          /* collectives: bytes each rank sends over the link (cost_collective_bytes) */
    int world;             /* collectives: the ranks it runs over */
    int node;              /* collectives: the op's node */
    double flops;          /* GEMMs: 2 m n k x batch; attention: its products; elementwise and rows: counted */
    bool tensor;           /* the FLOPs run on tensor cores */
    bool odd;              /* a GEMM with a leading dimension not a multiple of 16 bytes */
    int64_t lda, ldb, ldd; /* GEMMs: the launch plan's leading dimensions (padded rows: sched_pad) */
    bool padded;           /* GEMMs: some leading dimension is a padded row stride, longer than the rows it holds */
    bool finish;           /* a one-launch reduction: its last block finishes the sum after the others (one more floor) */
    cg_resources res;      /* ptxas' report (res.known false when not compiled) */
    double t_lo, t_hi;     /* modelled seconds (cost_apply) */
} cost_launch;

/* Per class, and for the whole step. */
typedef struct cost_sum {
    int launches;
    int64_t bytes; /* read + written + spill */
    double flops, t_lo, t_hi;
} cost_sum;

typedef struct cost_model {
    cost_launch *launches;
    int n;
    int kernels, gemms, memsets, copies, collectives;
    int spill_kernels; /* kernels whose ptxas report has spill stores or loads */
    int resources_known; /* kernels with a ptxas report */
    int64_t kernel_bytes, emitted_bytes; /* the generated kernels' bytes: this model's, and the emitter's own count */
    cost_sum total, by_class[COST_NCLASSES];
} cost_model;

/* The launches of launch plan lp of g (schedule s, plan p, kernels prog),
 * in plan order, with bytes, FLOPs and class, then one launch per
 * collective step of s (over cost_world(g, 2) ranks); res (NULL: none) the
 * ptxas report of each kernel of prog. Times are zero until cost_apply.
 * ALLOY_ERR_OOM with err; fills *out (cost_free). */
AL_HIDDEN alloy_status cost_build(const ir_graph *g, const schedule *s, const cg_program *prog, const lp_plan *lp,
                                  const cg_resources *res, cost_model *out, char *err, size_t errlen);
/* The bytes each rank sends in a ring collective of op over world ranks
 * on a buffer of n bytes (all_reduce's operand, reduce_scatter's operand,
 * all_gather's result): all_reduce 2 (W-1)/W n (a reduce-scatter and an
 * all-gather), reduce_scatter and all_gather (W-1)/W n. */
AL_HIDDEN int64_t cost_collective_bytes(int op, int64_t n, int world);
/* The ranks the collectives of g run over: the `world` of its first
 * reduce_scatter or all_gather, else `world` (an all_reduce carries none). */
AL_HIDDEN int cost_world(const ir_graph *g, int world);
/* Sets the ranks of m's all_reduce launches (g's) to world, with their bytes. */
AL_HIDDEN void cost_set_world(cost_model *m, const ir_graph *g, int world);
/* Times every launch with d's constants (cost_time) and sums them. */
AL_HIDDEN void cost_apply(cost_model *m, const cost_device *d);
/* The launch plan of prog over plan p (step/launch_plan.h, as the CUDA
 * backend replays it, collectives included): the launches the model
 * times, read as data. Fills *lp (cost_plan_free)
 * or returns the error with err. */
AL_HIDDEN alloy_status cost_plan(const ir_graph *g, const schedule *s, const mem_plan *p, const cg_program *prog,
                                 lp_plan *lp, char *err, size_t errlen);
AL_HIDDEN void cost_plan_free(lp_plan *lp);
/* The modelled time of one launch, low and high, in seconds:
 *   max(bytes / (hbm x eff x share), flops / rate, floor) + node
 * bytes = read + written + spill; share = min(1, blocks / sms) for a
 * generated kernel (a kernel of 3 blocks keeps 3 SMs busy, not the GPU),
 * 1 for the rest, scaling the rate too; rate: tensor (odd when a leading dimension is odd),
 * attention or f32 by what the launch runs; floor only for kernels and
 * GEMMs (a memset or copy is a graph node of its own). A collective:
 *   link bytes / (link x link_eff) + coll latency + node. */
AL_HIDDEN void cost_time(const cost_launch *l, const cost_device *d, double *lo, double *hi);
AL_HIDDEN void cost_free(cost_model *m);
/* "gemm", "gemm odd ld", "attention", "row", "layout copy", ... */
AL_HIDDEN const char *cost_class_name(cost_class c);

/* ---- the report (cost_report.c) ---- */

/* Prints m (timed with d): a header naming the graph, arch and device,
 * the totals, a summary per class, the `top` slowest launches by modelled
 * time, then with all every launch. ALLOY_ERR_OOM when the ranking cannot
 * be allocated (what came before it is printed). */
AL_HIDDEN alloy_status cost_print(FILE *out, const char *graph, const char *arch, const cost_model *m, const cost_device *d,
                          int top, bool all);

/* ---- calibration (cost_calibrate.c) ---- */

/* What a profile gave the calibration: rows used for each constant. */
typedef struct cost_fit {
    int rows;                  /* profile rows read */
    int bw_rows, gemm_rows, odd_rows, floor_rows;
    int matched;               /* kernel rows whose bytes came from the model (same name) */
} cost_fit;

/* Fits base's bandwidth efficiency, aligned and odd GEMM rates and kernel
 * floor to the rows of an ALLOY_PROFILE table (runtime/profile.c's format)
 * in text: efficiency from kernels, memsets and copies of at least 8 MiB
 * (their bytes over time over hbm, 25th-75th percentile; a kernel's bytes
 * are m's launch of the same name when m (may be NULL) has one, since the
 * profile's column is the emitter's count), GEMM rates from GEMMs of at
 * least 1 GFLOP (TFLOP/s, 25th-75th percentile; odd as m's GEMM of the
 * same name is, whose leading dimensions may be padded, else when a
 * dimension of its name is not a multiple of 8), the floor from kernels of under 64 KiB
 * (their time, 25th-75th percentile). Constants without rows keep base's
 * value; the graph node cost is not in a profile (its launches are direct)
 * and stays. ALLOY_ERR_INVALID when text has no profile rows. */
AL_HIDDEN alloy_status cost_calibrate(const char *text, const cost_device *base, const cost_model *m,
                                      cost_device *out, cost_fit *fit, char *err, size_t errlen);

#endif
