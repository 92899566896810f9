/* proc_threads.c - benchmark helper: per-thread CPU time of this process from /proc/self/task (proc_threads.h). */
#include "proc_threads.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* CPU ns of thread tid: the first field of schedstat (exact), else utime +
 * stime of stat (clock ticks); -1 when neither can be read. */
static long long thread_ns(int tid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
    FILE *f = fopen(path, "r");
    long long ns = -1;
    if (f) {
        if (fscanf(f, "%lld", &ns) != 1) ns = -1;
        fclose(f);
        if (ns >= 0) return ns;
    }
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    f = fopen(path, "r");
    if (!f) return -1;
    char buf[1024];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    /* fields after the command's closing parenthesis: 14 and 15 are utime, stime */
    char *p = buf + len;
    while (p > buf && *p != ')') p--;
    unsigned long long utime, stime;
    if (*p != ')' || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
        return -1;
    long hz = sysconf(_SC_CLK_TCK);
    return (long long)((utime + stime) * (1000000000ull / (unsigned long long)(hz > 0 ? hz : 100)));
}

void proc_threads_take(proc_threads *t)
{
    t->n = -1;
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    t->n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && t->n < PROC_THREADS_MAX) {
        int tid = atoi(e->d_name);
        if (tid <= 0) continue;
        long long ns = thread_ns(tid);
        if (ns < 0) continue;
        t->tid[t->n] = tid;
        t->ns[t->n++] = ns;
    }
    closedir(d);
}

int proc_threads_ran(const proc_threads *before, const proc_threads *after, long long min_ns)
{
    if (before->n < 0 || after->n < 0) return -1;
    int ran = 0;
    for (int i = 0; i < after->n; i++) {
        long long start = 0;
        for (int j = 0; j < before->n; j++)
            if (before->tid[j] == after->tid[i]) start = before->ns[j];
        if (after->ns[i] - start >= min_ns) ran++;
    }
    return ran;
}
