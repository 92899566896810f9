"""proc_threads.py - benchmark helper: which threads of this process ran during a timed section (/proc/self/task), as bench/proc_threads.c does for alloy's side."""
import os


def thread_cpu_ns():
    """{tid: CPU ns so far} for each thread of this process (schedstat), {} where /proc cannot tell."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[tid] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def threads_ran(before, after, min_ns):
    """How many threads ran at least min_ns between two thread_cpu_ns() snapshots (-1: unknown)."""
    if not after:
        return -1
    return sum(1 for tid, ns in after.items() if ns - before.get(tid, 0) >= min_ns)
