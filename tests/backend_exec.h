/* backend_exec.h - tests run a built ir_graph on one backend as the graph object does (compile.c, run.c): the pass pipeline, the schedule and plan, the backend's compile, leaf uploads, one run, the outputs downloaded. */
#ifndef ALLOY_TEST_BACKEND_EXEC_H
#define ALLOY_TEST_BACKEND_EXEC_H

#include <stdbool.h>

#include "ir/ir.h"
#include "passes/pass.h"
#include "runtime/backend.h"

/* How to compile: forward only or with the backward, fused or not. */
typedef struct bx_options {
    bool train;                     /* autodiff from g->loss: outputs "grad:<name>" */
    const char *const *grad_inputs; /* the inputs whose gradients are wanted */
    int ngrad_inputs;
    bool no_fuse;                   /* the no_fuse option "all": no fusion group */
} bx_options;

/* A graph compiled for one backend, its leaf buffers and, after a run, its
 * outputs on the host. */
typedef struct bx_exec {
    rt_backend *backend;
    ir_graph *graph;   /* the compiled graph (owned) */
    pass_compiled comp; /* its schedule and plan */
    rt_exec *exec;
    rt_buffer **leaf;  /* per node: the buffer of an input, param or state leaf */
    void **out;        /* per output of graph: its value after bx_run */
    char error[1024];
} bx_exec;

/* Opens backend i (rt_backend_count) with the default options; as
 * rt_backend_open_at (ALLOY_ERR_UNSUPPORTED when this machine cannot run it). */
alloy_status bx_open(int i, rt_backend **out, char *err, size_t errlen);
/* A copy of g through the pass pipeline (comp, may be NULL: its schedule
 * and plan); NULL with the reason in err. */
ir_graph *bx_passes(const ir_graph *g, const bx_options *o, pass_compiled *comp, char *err, size_t errlen);
/* Compiles a copy of g for b: the pipeline, the backend's executable, a
 * buffer for every leaf. On failure x->error says why (x is still freed
 * with bx_free). */
alloy_status bx_compile(rt_backend *b, const ir_graph *g, const bx_options *o, bx_exec *x);
/* Copies data (ir_nbytes of the leaf's type) into the leaf called name. */
alloy_status bx_upload(bx_exec *x, const char *name, const void *data);
/* One run, then every output downloaded. */
alloy_status bx_run(bx_exec *x);
/* The value of output `name` after bx_run and its type (NULL when there is no such output). */
const void *bx_output(const bx_exec *x, const char *name, const ir_type **type);
void bx_free(bx_exec *x);

#endif
