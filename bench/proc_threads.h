/* proc_threads.h - benchmark helper: which threads of this process ran during a timed section (Linux /proc/self/task), to check the thread count a benchmark row claims. */
#ifndef ALLOY_BENCH_PROC_THREADS_H
#define ALLOY_BENCH_PROC_THREADS_H

enum { PROC_THREADS_MAX = 256 };

/* Each thread of the process and its CPU time so far in ns (schedstat's
 * time on a CPU, else utime + stime from stat), taken at one moment. */
typedef struct proc_threads {
    int n; /* threads listed; -1: /proc/self/task could not be read */
    int tid[PROC_THREADS_MAX];
    long long ns[PROC_THREADS_MAX];
} proc_threads;

/* Fills t with the process's threads now. */
void proc_threads_take(proc_threads *t);

/* How many threads ran at least min_ns of CPU time between before and
 * after (a thread started in between counts its whole time); -1 when
 * either snapshot failed. */
int proc_threads_ran(const proc_threads *before, const proc_threads *after, long long min_ns);

#endif
