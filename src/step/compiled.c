/* compiled.c - freeing what the pipeline compiles besides the graph (the schedule and the plan). */
#include "step/compiled.h"

void pass_compiled_free(pass_compiled *c)
{
    sched_free(&c->sched);
    plan_free(&c->plan);
}
