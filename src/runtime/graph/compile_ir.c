/* compile_ir.c - compiling an alloy_graph's built IR with the pass pipeline, and naming the device it runs on (the full library; liballoy-runtime has compile_bundle.c instead). */
#include <string.h>

#include "alloy_config.h"
#include "passes/pass.h"
#include "runtime/graph/graph_impl.h"
#if ALLOY_HAVE_CUDA
#include "runtime/cuda/cuda_backend.h"
#endif

alloy_status graph_compile_ir(alloy_graph *g)
{
    if (g->compiled) return ALLOY_OK;
    if (g->from_bundle) return graph_fail(g, ALLOY_ERR_INVALID, "graph '%s' came from a bundle and cannot be compiled again", g->ir->name);
    pass_options opts;
    alloy_status st = graph_options(g, &g->cfg);
    if (!st) st = graph_pass_options(g, &opts);
    if (!st) st = graph_dp_check_ranks(g); /* before any collective the step runs */
    if (st) return st;
    ir_graph *c = ir_graph_clone(g->ir);
    if (!c) return graph_fail(g, ALLOY_ERR_OOM, "out of memory copying the graph to compile it");
    opts.amp_report = &g->amp_report;
    opts.train = g->training;
    opts.scaler = g->scaler;
    opts.optimizer = g->optimizer;
    opts.groups = g->groups;
    opts.ngroups = g->ngroups;
    opts.seed = g->seed;
    opts.grad_inputs = (const char *const *)g->grad_inputs;
    opts.ngrad_inputs = g->ngrad_inputs;
    opts.cfg = &g->cfg;
    if (g->comm) {
        opts.dp_world = alloy_comm_size(g->comm);
        opts.dp_rank = alloy_comm_rank(g->comm);
        opts.dp_bucket_bytes = g->dp.bucket_bytes;
    }
    st = pass_run_pipeline(&c, &opts, &g->comp, g->print_to ? g->print_to : stderr, g->timings,
                           (int)(sizeof g->timings / sizeof g->timings[0]), &g->ntimings);
    if (!st && !g->comp.plan.offset) /* schedule and plan disabled: the backend needs them */
        st = ir_error(c, ALLOY_ERR_INVALID, "the schedule and plan passes cannot be disabled for a run");
    if (st) {
        graph_fail(g, st, "compiling graph '%s': %s", g->ir->name, c->error);
        pass_compiled_free(&g->comp);
        ir_graph_free(c);
        return st;
    }
    size_t n = (size_t)c->nnodes + 1;
    g->leaf = al_calloc(n, sizeof *g->leaf);
    g->input_buf = al_calloc(n, sizeof *g->input_buf);
    g->fetched = al_calloc(n, sizeof *g->fetched);
    g->compiled = c;
    if (!g->leaf || !g->input_buf || !g->fetched) {
        graph_invalidate(g);
        return graph_fail(g, ALLOY_ERR_OOM, "out of memory preparing graph '%s' to run", g->ir->name);
    }
    step_info_nodes(g);
    return ALLOY_OK;
}

const char *alloy_graph_device(alloy_graph *g)
{
    if (!g) return NULL;
    g->status = ALLOY_OK;
    if (g->ir->status) return NULL;
    if (state_ensure(g) || graph_exec_ready(g, NULL)) return NULL;
    const rt_backend *b = graph_backend(g);
#if ALLOY_HAVE_CUDA
    const char *gpu = cuda_backend_device_name(b);
#else
    const char *gpu = NULL;
#endif
    if (gpu) al_fmt(g->device_text, sizeof g->device_text, "cuda: %s", gpu);
    else if (b->note[0]) al_fmt(g->device_text, sizeof g->device_text, "%s (%s)", b->ops->name, b->note);
    else al_fmt(g->device_text, sizeof g->device_text, "%s", b->ops->name);
    return g->device_text;
}
