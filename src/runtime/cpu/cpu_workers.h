/* cpu_workers.h - the worker threads of one CPU run, as the pool (cpu_workers.c) and the fused groups that keep their chunk buffers in it (cpu_fused*.c) see them. */
#ifndef ALLOY_CPU_WORKERS_H
#define ALLOY_CPU_WORKERS_H

#include <pthread.h>

#include "runtime/cpu/cpu.h"

enum { CPU_MAX_THREADS = 64 };

typedef struct cpu_worker_arg {
    cpu_workers *w;
    int index; /* 1.. : thread t uses the t-th chunk buffers; the caller is 0 */
} cpu_worker_arg;

/* The job in flight is split into blocks that threads claim one at a time
 * under mu, the caller too: a thread that is late (descheduled on a busy
 * machine) finds the blocks taken and costs nothing, and the caller waits
 * only for blocks already claimed. */
struct cpu_workers {
    pthread_mutex_t mu;
    pthread_cond_t wake; /* a job was posted, or stop */
    pthread_cond_t done; /* the job's last block finished */
    bool ready;          /* mu and the conditions exist; else one thread */
    bool stop;
    int started;         /* worker threads running */
    pthread_t thread[CPU_MAX_THREADS];
    cpu_worker_arg arg[CPU_MAX_THREADS];
    /* the job, under mu: job(job_arg, block, thread) */
    void (*job)(void *arg, int64_t block, int thread);
    void *job_arg;
    int threads;         /* that take part, the caller included */
    int64_t nblocks, next, finished;
    /* a fused group's chunk buffers (cpu_fused_chunks.c): thread t's at scratch + t * share */
    char *scratch;
    size_t scratch_bytes, share, ptr_at;
    /* per thread: the values a row group's blocks see (cpu_workers_views) */
    rt_tensor *views[CPU_MAX_THREADS];
    int nviews[CPU_MAX_THREADS];
    void *buffer;        /* cpu_workers_buffer's */
    char *group_block;   /* a group's plan (cpu_run_group_ex), kept once reserved */
    size_t group_block_bytes;
    size_t buffer_bytes;
};

#endif
