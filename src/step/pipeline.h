/* pipeline.h - the pipeline's pass names without the passes (what the options name; liballoy-runtime has them too). */
#ifndef ALLOY_PIPELINE_H
#define ALLOY_PIPELINE_H

#include "base/base.h"

/* The pipeline's passes in order: how many, and the name of the i-th. */
AL_HIDDEN int pass_count(void);
AL_HIDDEN const char *pass_name(int i);

#endif
