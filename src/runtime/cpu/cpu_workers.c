/* cpu_workers.c - the worker threads of one CPU run: started when a kernel or a group is first big enough to split, each job's blocks claimed one at a time by the threads and the caller. */
#include "runtime/cpu/cpu_workers.h"

/* The contracts of the non-static functions are in cpu.h. */

static void *worker_main(void *arg)
{
    cpu_worker_arg *a = arg;
    cpu_workers *w = a->w;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && (!w->job || w->next >= w->nblocks || a->index >= w->threads))
            pthread_cond_wait(&w->wake, &w->mu);
        if (w->stop) break;
        int64_t b = w->next++;
        void (*job)(void *, int64_t, int) = w->job;
        void *job_arg = w->job_arg;
        pthread_mutex_unlock(&w->mu);
        job(job_arg, b, a->index);
        pthread_mutex_lock(&w->mu);
        if (++w->finished == w->nblocks) pthread_cond_signal(&w->done);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

cpu_workers *cpu_workers_new(void)
{
    cpu_workers *w = al_calloc(1, sizeof *w);
    if (!w) return NULL;
    if (pthread_mutex_init(&w->mu, NULL) == 0) {
        if (pthread_cond_init(&w->wake, NULL) == 0) {
            if (pthread_cond_init(&w->done, NULL) == 0) w->ready = true;
            else pthread_cond_destroy(&w->wake);
        }
        if (!w->ready) pthread_mutex_destroy(&w->mu);
    }
    return w;
}

void cpu_workers_free(cpu_workers *w)
{
    if (!w) return;
    if (w->ready) {
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_broadcast(&w->wake);
        pthread_mutex_unlock(&w->mu);
        for (int t = 0; t < w->started; t++) pthread_join(w->thread[t], NULL);
        pthread_cond_destroy(&w->done);
        pthread_cond_destroy(&w->wake);
        pthread_mutex_destroy(&w->mu);
    }
    al_free(w->scratch);
    for (int t = 0; t < CPU_MAX_THREADS; t++) al_free(w->views[t]);
    al_free(w->buffer);
    al_free(w->group_block);
    al_free(w);
}

rt_tensor *cpu_workers_views(cpu_workers *w, int thread, int n)
{
    if (thread < 0 || thread >= CPU_MAX_THREADS) return NULL;
    if (w->nviews[thread] < n) {
        al_free(w->views[thread]);
        w->views[thread] = al_malloc(sizeof(rt_tensor) * (size_t)n);
        w->nviews[thread] = w->views[thread] ? n : 0;
    }
    return w->views[thread];
}

void *cpu_workers_buffer(cpu_workers *w, size_t bytes)
{
    if (bytes <= w->buffer_bytes) return w->buffer;
    al_free(w->buffer); /* its contents need not survive */
    w->buffer = al_malloc(bytes);
    w->buffer_bytes = w->buffer ? bytes : 0;
    return w->buffer;
}

/* Up to `want` threads in all, the caller included; returns how many there are. */
static int start_workers(cpu_workers *w, int want)
{
    if (!w->ready) return 1;
    while (w->started + 1 < want) {
        int t = w->started;
        w->arg[t] = (cpu_worker_arg){w, t + 1};
        if (pthread_create(&w->thread[t], NULL, worker_main, &w->arg[t]) != 0) break;
        w->started++;
    }
    return w->started + 1 < want ? w->started + 1 : want;
}

int cpu_workers_threads(cpu_workers *w, int want)
{
    return want > 1 ? start_workers(w, want) : 1;
}

void cpu_workers_run(cpu_workers *w, int threads, int64_t nblocks, void (*fn)(void *arg, int64_t block, int thread),
                     void *arg)
{
    if (threads <= 1 || nblocks <= 1) {
        for (int64_t b = 0; b < nblocks; b++) fn(arg, b, 0);
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->job = fn;
    w->job_arg = arg;
    w->threads = threads;
    w->nblocks = nblocks;
    w->next = w->finished = 0;
    pthread_cond_broadcast(&w->wake);
    while (w->next < w->nblocks) {
        int64_t b = w->next++;
        pthread_mutex_unlock(&w->mu);
        fn(arg, b, 0);
        pthread_mutex_lock(&w->mu);
        w->finished++;
    }
    while (w->finished < w->nblocks) pthread_cond_wait(&w->done, &w->mu);
    w->job = NULL;
    pthread_mutex_unlock(&w->mu);
}

