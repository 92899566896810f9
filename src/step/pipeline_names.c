/* pipeline_names.c - the pipeline's pass names without the passes (options name passes; the runtime library has the options but no pass). */
#include "step/pipeline.h"

static const char *const names[] = {
#define PASS(name, run, build) #name,
#include "step/pipeline.def"
#undef PASS
};
enum { NNAMES = sizeof names / sizeof names[0] };

int pass_count(void) { return NNAMES; }

const char *pass_name(int i) { return i >= 0 && i < NNAMES ? names[i] : NULL; }
