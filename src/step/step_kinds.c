/* step_kinds.c - the step kinds' table (step_kinds.def): each kind's name and what its emitter loads through the range rule. */
#include "step/schedule.h"

static const struct {
    const char *name;
    unsigned rule_loads;
} step_kinds[] = {
#define STEP(kind, name, rule_loads) [STEP_KIND_##kind] = {name, rule_loads},
#include "step/step_kinds.def"
#undef STEP
};
enum { STEP_KINDS = sizeof step_kinds / sizeof step_kinds[0] };

const char *sched_kind_name(step_kind k) { return (unsigned)k < STEP_KINDS ? step_kinds[k].name : "?"; }

unsigned sched_kind_rule_loads(step_kind k) { return (unsigned)k < STEP_KINDS ? step_kinds[k].rule_loads : 0; }
