/* compile_ir.c - compiling an alloy_graph's built IR with the pass pipeline, and naming the device it runs on (the full library; liballoy-runtime has compile_bundle.c instead). */
#include <string.h>

#include "passes/pass.h"
#include "runtime/graph/graph_impl.h"

/* g's IR through the pass pipeline; for_gpu: device=auto takes the GPU's choices. */
static alloy_status compile_ir(alloy_graph *g, bool for_gpu)
{
    if (g->compiled) return ALLOY_OK;
    if (g->from_bundle) return graph_fail(g, ALLOY_ERR_INVALID, "graph '%s' came from a bundle and cannot be compiled again", g->ir->name);
    pass_options opts;
    alloy_status st = graph_options(g, &g->cfg);
    if (!st) st = graph_pass_options(g, &opts);
    if (!st) st = graph_dp_check_ranks(g); /* before any collective the step runs */
    if (st) return st;
    if (g->scaler.kind != ALLOY_SCALER_NONE && g->ir->loss < 0) /* else ignored, and step_info reported a NaN loss */
        return graph_fail(g, ALLOY_ERR_INVALID,
                          "compiling graph '%s': a loss scaler is set (alloy_graph_set_grad_scaler) but the graph has "
                          "no loss to scale; set the loss (alloy_graph_set_loss) or no scaler",
                          g->ir->name);
    ir_graph *c = ir_graph_clone(g->ir);
    if (!c) return graph_fail(g, ALLOY_ERR_OOM, "out of memory copying the graph to compile it");
    opts.amp_report = &g->amp_report;
    opts.train = g->training;
    opts.scaler = &g->scaler;
    opts.optimizer = &g->optimizer;
    opts.groups = g->groups;
    opts.ngroups = g->ngroups;
    opts.seed = g->seed;
    opts.grad_inputs = (const char *const *)g->grad_inputs;
    opts.ngrad_inputs = g->ngrad_inputs;
    /* device=auto compiles for the GPU when the backend already open is CUDA's (graph_compile opens it
     * first) or when the caller writes or models a GPU's step, else as for the CPU */
    al_options cfg = g->cfg;
    if (cfg.device == OPT_DEVICE_AUTO && (for_gpu || (g->dev && strcmp(graph_backend(g)->ops->name, "cuda") == 0)))
        cfg.device = OPT_DEVICE_CUDA;
    opts.cfg = &cfg;
    opts.log = g->print_to; /* the AMP report goes where printed passes go (NULL: stderr) */
    if (g->comm) {
        opts.dp_world = alloy_comm_size(g->comm);
        opts.dp_rank = alloy_comm_rank(g->comm);
        opts.dp_bucket_bytes = g->dp.bucket_bytes;
        opts.dp_zero = g->dp.zero_stage;
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
    g->compiled_for_gpu = cfg.device == OPT_DEVICE_CUDA;
    if (!g->leaf || !g->input_buf || !g->fetched) {
        graph_invalidate(g);
        return graph_fail(g, ALLOY_ERR_OOM, "out of memory preparing graph '%s' to run", g->ir->name);
    }
    step_info_nodes(g);
    return ALLOY_OK;
}

alloy_status graph_compile_ir(alloy_graph *g) { return compile_ir(g, false); }

alloy_status graph_compile_for_gpu(alloy_graph *g, bool *temporary)
{
    *temporary = false;
    if (g->from_bundle || (g->compiled && g->compiled_for_gpu)) return graph_compile_ir(g);
    alloy_status st = graph_options(g, &g->cfg); /* the device option as the environment and the API set it */
    if (st || g->cfg.device == OPT_DEVICE_CPU) return st ? st : graph_compile_ir(g);
    if (g->compiled) graph_invalidate(g); /* device=auto compiled it for the CPU */
    st = compile_ir(g, true);
    *temporary = !st;
    return st;
}

const char *alloy_graph_device(alloy_graph *g)
{
    if (!g) return NULL;
    if (graph_built(g)) return NULL;
    if (state_ensure(g) || graph_exec_ready(g, NULL)) return NULL;
    const rt_backend *b = graph_backend(g);
    const char *gpu = b->ops->device_name ? b->ops->device_name(b) : NULL;
    if (gpu) al_fmt(g->device_text, sizeof g->device_text, "cuda: %s", gpu);
    else if (b->note[0]) al_fmt(g->device_text, sizeof g->device_text, "%s (%s)", b->ops->name, b->note);
    else al_fmt(g->device_text, sizeof g->device_text, "%s", b->ops->name);
    return g->device_text;
}
