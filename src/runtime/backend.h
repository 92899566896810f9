/* backend.h - the one interface between the graph object and a backend: device buffers, transfers, a schedule compiled into an executable, runs, and the bundle hooks. */
#ifndef ALLOY_BACKEND_H
#define ALLOY_BACKEND_H

#include <stdarg.h>
#include <stdio.h>

#include "ir/ir.h"
#include "step/options.h"
#include "step/plan.h"
#include "step/schedule.h"
#include "runtime/bundle/bundle.h" /* bundle_cuda, which exec_load takes */

typedef struct rt_backend rt_backend;
typedef struct rt_buffer rt_buffer; /* device memory; only its backend looks inside */
typedef struct rt_exec rt_exec;     /* a compiled step; only its backend looks inside */

/* A value copied to the host by a run: node's value (ir_nbytes of its type)
 * into dst. */
typedef struct rt_download {
    int node;
    void *dst;
} rt_download;

/* The range statistics of one value (the amp_stats option), added to by
 * every run that has them on: any thread may add (cpu_range_add_*). */
typedef struct rt_range {
    uint32_t max_bits; /* the largest |x| seen, as f32 bits (an inf counts; a NaN never does) */
    uint32_t nan;      /* 1 once a NaN was seen */
    uint64_t tiny;     /* elements nonzero and below the smallest normal of the value's dtype */
    uint64_t count;    /* elements seen */
} rt_range;

/* What one run binds and hands back. */
typedef struct rt_run_args {
    /* per node of the compiled graph: the buffer of each input, param and
     * state leaf (NULL for other nodes; a leaf of 0 bytes may be NULL) */
    rt_buffer *const *leaf;
    /* copied out after the step computes and before its updates replace
     * state, so a state leaf reads as the value the step used; only kept
     * values (outputs, updates, loss, the schedule's keep set) and leaves */
    const rt_download *downloads;
    int ndownloads;
    /* where the profile option's table goes (runtime/profile.h; NULL: stderr) */
    FILE *profile_to;
    /* the communicator of a data-parallel step's collectives (runtime/comm/comm.h); NULL: none */
    struct alloy_comm *comm;
    /* the amp_check option: per node of the compiled graph, zeroed by the
     * caller; a backend that checks sets NONFINITE_INF / NONFINITE_NAN in
     * the entry of each checked value (cpu_amp_checked) holding one; NULL:
     * no check. nonfinite_done says the backend did. */
    uint8_t *nonfinite;
    bool *nonfinite_done;
    /* with nonfinite set and the backend's read_flags: the caller reads
     * the flags afterwards, only when it wants them (a skipped step), and
     * the run leaves nonfinite as it is (nonfinite_done still says it checked) */
    bool flags_later;
    /* the amp_stats option: per node of the compiled graph, added to (not
     * zeroed) for each f16/bf16 value a backend that tracks computes
     * (cpu_amp_checked's values); NULL: none. ranges_done says it did. */
    rt_range *ranges;
    bool *ranges_done;
} rt_run_args;

/* A backend's entry points. Every call returns ALLOY_OK or an error with
 * its message on the backend (rt_backend.error), naming what failed. */
typedef struct rt_backend_ops {
    const char *name;
    alloy_status (*buffer_new)(rt_backend *b, size_t bytes, rt_buffer **out);
    void (*buffer_free)(rt_backend *b, rt_buffer *buf);
    alloy_status (*upload)(rt_backend *b, rt_buffer *dst, const void *src, size_t bytes);
    alloy_status (*download)(rt_backend *b, const rt_buffer *src, void *dst, size_t bytes);
    /* An executable for schedule s of g with plan p (all three outlive it):
     * one arena of p->arena_bytes, the step's kernels. */
    alloy_status (*compile)(rt_backend *b, const ir_graph *g, const schedule *s, const mem_plan *p, rt_exec **out);
    /* One run: every step in order, the downloads, then every update of g
     * copied into the state leaf it names. */
    alloy_status (*run)(rt_backend *b, rt_exec *e, const rt_run_args *args);
    void (*exec_free)(rt_backend *b, rt_exec *e);
    /* amp_check's flags of e's last run into nonfinite (per node, or-ed
     * in), for a run with flags_later; NULL for a backend that fills them
     * during the run (the CPU). */
    alloy_status (*read_flags)(rt_backend *b, rt_exec *e, uint8_t *nonfinite);
    /* A bundle's step: an executable for schedule s of g with plan p (from
     * the file) and the bundle's CUDA executable x (images and kernel
     * table, outliving the executable; NULL or empty when it has none). The
     * CPU compiles s and p again (its executable is them); the CUDA backend
     * loads x's images and rebuilds its launch plan from the kernel table,
     * with no emitter and no compiler. */
    alloy_status (*exec_load)(rt_backend *b, const ir_graph *g, const schedule *s, const mem_plan *p,
                              const bundle_cuda *x, rt_exec **out);
    void (*close)(rt_backend *b);
    /* A GPU's compute capability (major * 10 + minor) and driver version
     * (1000 * major + 10 * minor), which a bundle's CUDA executable is
     * checked against; false when unknown. NULL: no GPU (the CPU). */
    bool (*device_caps)(const rt_backend *b, int *sm, int *driver);
    /* Bytes the backend holds allocated now and at most since it opened
     * (buffers, arenas, its own scratch); NULL: not counted. */
    void (*memory)(const rt_backend *b, size_t *in_use, size_t *peak);
    /* The name of the GPU it runs on; NULL: no GPU (the CPU). */
    const char *(*device_name)(const rt_backend *b);
} rt_backend_ops;

struct rt_backend {
    const rt_backend_ops *ops;
    al_options cfg;  /* the options it was opened with (threads, BLAS, ...) */
    char error[768]; /* the last failure */
    char note[512];  /* device=auto: why a preferred backend was passed over ("cuda unavailable: ..."), else "" */
};

/* Opens a backend for the options' device: "cpu", "cuda", or for "auto"
 * the first of cuda, cpu this build has that opens on this machine (a
 * backend that cannot run here returns ALLOY_ERR_UNSUPPORTED with why in
 * err; auto then takes the next); "cuda" without a usable GPU is
 * ALLOY_ERR_UNSUPPORTED with err naming what is missing. */
AL_HIDDEN alloy_status rt_backend_open(const al_options *cfg, rt_backend **out, char *err, size_t errlen);
/* The backends compiled in, for tests that run every op on each. */
AL_HIDDEN int rt_backend_count(void);
AL_HIDDEN const char *rt_backend_name(int i);
/* Opens the i-th backend; ALLOY_ERR_UNSUPPORTED with err when this machine cannot run it. */
AL_HIDDEN alloy_status rt_backend_open_at(int i, const al_options *cfg, rt_backend **out, char *err, size_t errlen);
/* Opens the backend named name ("cpu", "cuda") whatever the options' device
 * says; ALLOY_ERR_UNSUPPORTED with err when this build has none of that name
 * or this machine cannot run it. */
AL_HIDDEN alloy_status rt_backend_open_named(const char *name, const al_options *cfg, rt_backend **out, char *err,
                                             size_t errlen);
/* Closes b (NULL: nothing). */
static inline void rt_backend_close(rt_backend *b)
{
    if (b) b->ops->close(b);
}

typedef alloy_status (*rt_backend_opener)(const al_options *cfg, rt_backend **out, char *err, size_t errlen);
/* For tests: the CUDA backend opens through opener (NULL: the GPU's again);
 * returns the previous one (NULL in a build without CUDA, which ignores it). */
AL_HIDDEN rt_backend_opener rt_backend_set_cuda_opener(rt_backend_opener opener);

/* Records a failure on b (printf-style) and returns status. */
static inline alloy_status rt_fail(rt_backend *b, alloy_status status, const char *fmt, ...) AL_PRINTF(3, 4);
static inline alloy_status rt_fail(rt_backend *b, alloy_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->error, sizeof b->error, fmt, ap);
    va_end(ap);
    return status;
}

/* exec_load for a backend whose executable is the schedule and plan alone
 * (the CPU): compiles them again, x unused. */
static inline alloy_status rt_exec_load_by_compiling(rt_backend *b, const ir_graph *g, const schedule *s,
                                                     const mem_plan *p, const bundle_cuda *x, rt_exec **out)
{
    (void)x;
    *out = NULL;
    return b->ops->compile(b, g, s, p, out);
}

#endif
