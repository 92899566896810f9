/* fuse.c - stub until written */
#include "passes/pass.h"
alloy_status pass_fuse(ir_graph **g, const pass_options *opts) { (void)g; (void)opts; return ALLOY_OK; }
