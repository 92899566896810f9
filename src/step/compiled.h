/* compiled.h - what the pipeline compiles besides the graph (its schedule and memory plan), and each pass's timing. */
#ifndef ALLOY_COMPILED_H
#define ALLOY_COMPILED_H

#include "step/plan.h"
#include "step/schedule.h"

/* What the pipeline compiles besides the graph: the schedule and the memory
 * plan for the default keep set (outputs, updates, loss). Empty (no
 * steps, no offsets) when those passes did not run. */
typedef struct pass_compiled {
    schedule sched;
    mem_plan plan;
} pass_compiled;
AL_HIDDEN void pass_compiled_free(pass_compiled *c);

/* Per-pass timing of the last pipeline run: wall time, and the CPU time of
 * the thread that ran it (which time spent on other processes does not
 * inflate: what bench/compile_time.c and the compile-time tests compare). */
typedef struct pass_timing {
    const char *name;
    double ms;
    int nodes_after;
    double cpu_ms;
} pass_timing;

#endif
