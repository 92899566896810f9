/* schedule_build.c - sched_build: a graph's schedule (its steps and views, schedule.c), then the padded row strides of the values GEMMs read (pad.c) and the widened products left to their readers at aligned rows (ranged_reads.c). */
#include "step/schedule.h"

alloy_status sched_build(const ir_graph *g, const bool *keep, schedule *out, char *err, size_t errlen)
{
    alloy_status st = sched_build_steps(g, keep, out, err, errlen);
    if (!st && (st = sched_pad(g, out, err, errlen))) sched_free(out);
    if (!st) sched_align_ranged_reads(g, out);
    return st;
}
