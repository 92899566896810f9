/* cuda_exec.h - what the CUDA backend's files share: the backend and compiled-step structs and the functions one file gives the others. */
#ifndef ALLOY_CUDA_EXEC_H
#define ALLOY_CUDA_EXEC_H

#include "runtime/backend.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_collective.h"
#include "runtime/profile.h"

/* A buffer of the backend: its device address and size. */
struct rt_buffer {
    cdev_ptr ptr;
    size_t bytes;
};

/* The backend: the interface's fields first, then its device. */
typedef struct cuda_backend {
    rt_backend base;
    cdev *dev;
    size_t in_use, peak; /* device bytes allocated through the backend, and the device's own (memory) */
    bool sync_each;      /* ALLOY_CUDA_SYNC=1: every action launched directly and waited for */
    cu_coll *coll;       /* NCCL, loaded by the first step with a collective; its communicator made at its first run */
} cuda_backend;

/* A compiled step: what it runs (not owned), its kernels on the device, its
 * launch plan, its memory, and its captured graph. */
struct rt_exec {
    const ir_graph *g;
    const schedule *s;
    const mem_plan *p;
    const cg_program *prog; /* its kernels: &jit, or a bundle's kernel table */
    cg_program jit;         /* the kernels emitted for it (sources freed once loaded); empty for a bundle's */
    lp_plan lp;
    cdev_module **modules;
    int nmodules;
    cdev_function **fn; /* per kernel */
    cdev_gemm **gemm;   /* per GEMM of the plan */
    int64_t *gemm_run_len; /* per GEMM: 0, or the run length of a pointer-array GEMM called as strided runs (lp_gemm_runs) */
    cdev_ptr arena, aux;
    cdev_ptr *leaf;     /* per node: the address bound to it this run */
    cdev_ptr *captured; /* per node: the address bound when the graph was captured */
    void *graph;
    /* state leaves a run reads back (the step's counters): copied into the
     * staging buffer at the start of the step, before updates written in place change them */
    int *staged;
    int nstaged, staged_cap;
    int64_t *staged_at; /* per staged leaf: its offset in staging */
    cdev_ptr staging;
    size_t staging_bytes;
    uint64_t *argval; /* one kernel's arguments */
    void **argv;
    int maxparams;
    long runs;
    /* the profile option: two events per action (before, after), made at the
     * first profiled run; timing is set while a profiled run queues */
    cdev_event **events;
    bool timing;
    /* data parallel: the collective actions, and the communicator of this run (NULL: one rank, a collective copies) */
    int ncoll, first_coll;
    alloy_comm *comm;
};

/* The backend's device. */
static inline cdev *cu_device_of(rt_backend *b) { return ((cuda_backend *)b)->dev; }

/* cuda_buffers.c: device memory through the backend, counted for cu_memory. */
AL_HIDDEN alloy_status cu_dev_alloc(rt_backend *b, size_t bytes, cdev_ptr *out);
/* Frees device memory cu_dev_alloc gave (ptr 0: none), taking its bytes off the count. */
AL_HIDDEN void cu_dev_release(rt_backend *b, cdev_ptr ptr, size_t bytes);
/* The device's last error as the backend's ("cuda: WHAT: ..."), with status; returns status. */
AL_HIDDEN alloy_status cu_dev_fail(rt_backend *b, alloy_status st, const char *what);
/* The interface's memory, buffer_new, buffer_free, upload and download. */
AL_HIDDEN void cu_memory(const rt_backend *b, size_t *in_use, size_t *peak);
AL_HIDDEN alloy_status cu_buffer_new(rt_backend *b, size_t bytes, rt_buffer **out);
AL_HIDDEN void cu_buffer_free(rt_backend *b, rt_buffer *buf);
AL_HIDDEN alloy_status cu_upload(rt_backend *b, rt_buffer *dst, const void *src, size_t bytes);
AL_HIDDEN alloy_status cu_download(rt_backend *b, const rt_buffer *src, void *dst, size_t bytes);

/* cuda_build.c: an executable for schedule s of g with plan p: its kernels
 * emitted and compiled now (x NULL) or a bundle's kernel table and images
 * (x, which outlives it); the launch plan, the GEMMs and the arena. */
AL_HIDDEN alloy_status cu_build(rt_backend *b, const ir_graph *g, const schedule *s, const mem_plan *p,
                                const bundle_cuda *x, rt_exec **out);
/* Frees e and all it holds (NULL: nothing). */
AL_HIDDEN void cu_exec_free(rt_backend *b, rt_exec *e);

/* cuda_enqueue.c: the device address of place pl this run; 0 with an error
 * in *st when a leaf it names (of bytes > 0) is not bound. */
AL_HIDDEN cdev_ptr cu_address(rt_backend *b, rt_exec *e, const lp_place *pl, int64_t bytes, alloy_status *st);
/* Queues actions [from, to) of the launch plan on the device. */
AL_HIDDEN alloy_status cu_enqueue(rt_backend *b, rt_exec *e, int from, int to);

/* cuda_profile.c: the events of a profiled run, made at the first one. */
AL_HIDDEN alloy_status cu_profile_events(rt_backend *b, rt_exec *e);
/* One row of the profile: action i of the plan, which took us microseconds. */
AL_HIDDEN rt_profile_row cu_profile_row(const rt_exec *e, int i, double us);
/* Prints the profile of run `run` from its events (the stream has passed them). */
AL_HIDDEN alloy_status cu_profile_print(rt_backend *b, rt_exec *e, long run, FILE *out);

/* cuda_readback.c: the downloads' state leaves as this run's staging set;
 * *changed when the set differs from the one the captured graph stages. */
AL_HIDDEN alloy_status cu_stage_leaves(rt_backend *b, rt_exec *e, const rt_run_args *args, bool *changed);
/* Queues the copies of the staged leaves into the staging buffer. */
AL_HIDDEN alloy_status cu_enqueue_staging(rt_backend *b, rt_exec *e);
/* Copies downloads to the host (staged: the state leaves from the staging
 * buffer; leaves: only the state leaves, else only the rest). */
AL_HIDDEN alloy_status cu_run_downloads(rt_backend *b, rt_exec *e, const rt_run_args *args, bool staged, bool leaves);
/* The run's check words: the range statistics, and the non-finite flags
 * unless args leaves them for cu_read_flags. */
AL_HIDDEN alloy_status cu_run_checks(rt_backend *b, rt_exec *e, const rt_run_args *args);
/* The non-finite flags of the last run, read later. */
AL_HIDDEN alloy_status cu_read_flags(rt_backend *b, rt_exec *e, uint8_t *nonfinite);

/* cuda_step_collectives.c: "step 17 (collective, all_reduce %32)": the step of collective action i. */
AL_HIDDEN void cu_collective_label(const rt_exec *e, int i, char *out, size_t len);
/* The step's collectives counted, and NCCL loaded for them;
 * ALLOY_ERR_UNSUPPORTED naming the first one's step where it cannot be. */
AL_HIDDEN alloy_status cu_collectives_ready(rt_backend *b, rt_exec *e);
/* The communicator of the step's collectives over e->comm, made at the first run. */
AL_HIDDEN alloy_status cu_connect_collectives(rt_backend *b, rt_exec *e);
/* Every rank's choice of launching directly or capturing, reduced over the
 * ranks, into *graphs and *capture. */
AL_HIDDEN alloy_status cu_agree_on_graphs(rt_backend *b, rt_exec *e, bool *graphs, bool *capture);
/* Waits for the queued collectives under the communicator's timeout,
 * aborting it and naming them on a peer's failure or the deadline. */
AL_HIDDEN alloy_status cu_wait_for_collectives(rt_backend *b, rt_exec *e);
/* NCCL's asynchronous error after the step, naming its collectives. */
AL_HIDDEN alloy_status cu_check_collectives(rt_backend *b, rt_exec *e);

/* cuda_run.c: one run of the step (the interface's run). */
AL_HIDDEN alloy_status cu_run(rt_backend *b, rt_exec *e, const rt_run_args *args);

#endif
