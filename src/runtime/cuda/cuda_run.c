/* cuda_run.c - one run of a CUDA step: the leaves bound, the launch plan replayed as one captured graph or launched directly, then the downloads and checks. */
#include <string.h>

#include "runtime/cuda/cuda_exec.h"

/* Whether the graph captured earlier still runs this call: every leaf at the address it was captured with. */
static bool capture_current(const rt_exec *e)
{
    return e->graph && memcmp(e->leaf, e->captured, sizeof *e->leaf * (size_t)e->g->nnodes) == 0;
}

/* One run of the step: replays the captured graph, or launches the plan
 * directly (the first run, a profiled one, ALLOY_CUDA_SYNC), with the
 * collectives, downloads and checks args asks for. */
alloy_status cu_run(rt_backend *b, rt_exec *e, const rt_run_args *args)
{
    cdev *dev = cu_device_of(b);
    const ir_graph *g = e->g;
    for (int i = 0; i < g->nnodes; i++) {
        const ir_node *n = g->nodes[i];
        bool leaf = n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state;
        e->leaf[i] = leaf && args->leaf[i] ? args->leaf[i]->ptr : 0;
    }
    alloy_status st = ALLOY_OK;
    if (dev->ops->step_begin) dev->ops->step_begin(dev, (cdev_ptr[]){e->arena, e->aux}, 2); /* nothing written yet */
    /* a profiled run launches directly, with an event before and after each action */
    bool profiling = rt_profile_due(b->cfg.profile, e->runs + 1) && dev->ops->event_record;
    if (profiling && (st = cu_profile_events(b, e))) return st;
    /* the first run launches directly (modules and the library settle); later ones replay one capture */
    bool graphs = !profiling && !((cuda_backend *)b)->sync_each && b->cfg.cuda_graph && dev->ops->capture_begin &&
                  e->runs > 0;
    e->comm = e->ncoll ? args->comm : NULL;
    if (e->comm && (st = cu_connect_collectives(b, e))) return st;
    bool capture = false;
    if (graphs) {
        bool changed;
        if ((st = cu_stage_leaves(b, e, args, &changed))) return st;
        capture = changed || !capture_current(e);
    }
    if (e->comm && (st = cu_agree_on_graphs(b, e, &graphs, &capture))) return st;
    if (graphs) {
        if (capture) {
            if (e->graph) dev->ops->graph_free(dev, e->graph);
            e->graph = NULL;
            if ((st = dev->ops->capture_begin(dev))) return cu_dev_fail(b, st, "capturing the step");
            /* leaves staged as the step finds them: updates written in place change them */
            alloy_status qs = cu_enqueue_staging(b, e);
            if (!qs) qs = cu_enqueue(b, e, 0, e->lp.first_update);
            if (!qs) qs = cu_enqueue(b, e, e->lp.first_update, e->lp.nactions);
            void *graph = NULL;
            st = dev->ops->capture_end(dev, &graph);
            if (qs) {
                if (graph) dev->ops->graph_free(dev, graph);
                return qs;
            }
            if (st) return cu_dev_fail(b, st, "capturing the step");
            e->graph = graph;
            memcpy(e->captured, e->leaf, sizeof *e->leaf * (size_t)g->nnodes);
        }
        if ((st = dev->ops->replay(dev, e->graph))) return cu_dev_fail(b, st, "replaying the step");
        if (e->comm) st = cu_wait_for_collectives(b, e); /* before a download waits for the stream, with no deadline */
        if (!st) st = cu_run_downloads(b, e, args, true, true);
    } else {
        e->timing = profiling;
        st = cu_run_downloads(b, e, args, false, true); /* leaves before updates written in place */
        if (!st) st = cu_enqueue(b, e, 0, e->lp.first_update);
        if (!st && e->comm) st = cu_wait_for_collectives(b, e);
        if (!st) st = cu_run_downloads(b, e, args, false, false);
        if (!st) st = cu_enqueue(b, e, e->lp.first_update, e->lp.nactions);
        e->timing = false;
    }
    if (!st && (st = dev->ops->sync(dev))) cu_dev_fail(b, st, "the step");
    if (!st && e->comm) st = cu_check_collectives(b, e);
    if (!st) st = cu_run_checks(b, e, args);
    if (!st && profiling) st = cu_profile_print(b, e, e->runs + 1, args->profile_to);
    if (!st) e->runs++;
    return st;
}
