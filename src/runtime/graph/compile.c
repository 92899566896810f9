/* compile.c - an alloy_graph's compiled step on a backend: opening the backend, the executable a run needs, dropping both (the pass pipeline: compile_ir.c; a bundle's graph: compile_bundle.c). */
#include <string.h>

#include "runtime/graph/graph_impl.h"

static alloy_status fall_back_to_cpu(alloy_graph *g, const ir_graph *c, const schedule *s, const mem_plan *p,
                                     rt_exec **out);

/* The name of the device backend the options ask for, NULL for auto. */
static const char *wanted_device(const alloy_graph *g)
{
    return g->cfg.device == OPT_DEVICE_CPU ? "cpu" : g->cfg.device == OPT_DEVICE_CUDA ? "cuda" : NULL;
}

/* Makes `next` g's backend: the state moves into its buffers and the old
 * one (which no other graph uses) closes; on failure nothing changed. */
static alloy_status switch_backend(alloy_graph *g, rt_backend *next)
{
    if (!g->dev) {
        g->dev = al_calloc(1, sizeof *g->dev);
        if (!g->dev) return graph_fail(g, ALLOY_ERR_OOM, "out of memory opening the %s backend", next->ops->name);
        *g->dev = (graph_device){.refs = 1, .backend = next};
        return ALLOY_OK;
    }
    alloy_status st = state_move(g, next);
    if (st) return st;
    rt_backend_close(g->dev->backend);
    g->dev->backend = next;
    return ALLOY_OK;
}

/* Opens the backend the options ask for, or keeps the open one when it is
 * that one (taking the new options); state moves to a new backend's
 * buffers. A backend shared with other graphs (alloy_graph_share_state)
 * stays: asking for another device is an error. */
static alloy_status open_backend(alloy_graph *g)
{
    const char *want = wanted_device(g);
    rt_backend *b = graph_backend(g);
    if (b && (!want || strcmp(want, b->ops->name) == 0)) {
        b->cfg = g->cfg;
        return ALLOY_OK;
    }
    if (b && g->dev->refs > 1)
        return graph_fail(g, ALLOY_ERR_INVALID,
                          "device %s: graph '%s' shares state with another graph on the %s backend and cannot move "
                          "to another device",
                          want, g->ir->name, b->ops->name);
    char err[512];
    rt_backend *next;
    al_options cfg = g->cfg; /* cuda_device auto: a data-parallel rank's GPU is its local rank */
    if (cfg.cuda_device < 0 && g->comm) cfg.cuda_device = alloy_comm_local_rank(g->comm);
    alloy_status st = rt_backend_open(&cfg, &next, err, sizeof err);
    if (st) return graph_fail(g, st, "device %s: %s", want ? want : "auto", err);
    if ((st = switch_backend(g, next))) rt_backend_close(next);
    return st;
}

alloy_status graph_compile(alloy_graph *g)
{
    bool fresh = !g->compiled;
    alloy_status st = ALLOY_OK;
    /* device=auto: the backend opens first, so that the passes compile for the device that runs the step */
    if (fresh && !g->dev && !g->from_bundle && !(st = graph_options(g, &g->cfg)) && g->cfg.device == OPT_DEVICE_AUTO)
        st = open_backend(g);
    if (!st) st = graph_compile_ir(g);
    if (!st && (fresh || !g->dev)) st = open_backend(g); /* a new compile may change the device */
    return st;
}

/* Frees both executables (their schedules and plans stay). */
static void free_execs(alloy_graph *g)
{
    rt_backend *b = graph_backend(g);
    if (g->exec_default) b->ops->exec_free(b, g->exec_default);
    if (g->exec_kept) b->ops->exec_free(b, g->exec_kept);
    g->exec = g->exec_default = g->exec_kept = NULL;
}

/* Drops the executable of the other keep set, its schedule and plan. */
static void drop_kept_exec(alloy_graph *g)
{
    if (g->exec_kept) graph_backend(g)->ops->exec_free(graph_backend(g), g->exec_kept);
    if (g->exec == g->exec_kept) g->exec = NULL;
    g->exec_kept = NULL;
    al_free(g->exec_keep);
    g->exec_keep = NULL;
    sched_free(&g->exec_sched);
    plan_free(&g->exec_plan);
}

/* Drops both executables and the other keep set's schedule and plan. */
static void drop_exec(alloy_graph *g)
{
    free_execs(g);
    drop_kept_exec(g);
}

/* Frees the buffers the feeds were uploaded into; a run makes them again. */
static void drop_inputs(alloy_graph *g)
{
    int n = g->compiled ? g->compiled->nnodes : 0;
    for (int i = 0; g->input_buf && i < n; i++) {
        if (g->input_buf[i]) graph_backend(g)->ops->buffer_free(graph_backend(g), g->input_buf[i]);
        g->input_buf[i] = NULL;
        if (g->leaf) g->leaf[i] = NULL;
    }
}

void graph_drop_exec(alloy_graph *g)
{
    drop_exec(g);
    drop_inputs(g);
}

void graph_invalidate(alloy_graph *g)
{
    g->state_ready = false; /* a recompile may add state (moments, scale) */
    graph_drop_exec(g);
    int n = g->compiled ? g->compiled->nnodes : 0;
    for (int i = 0; g->fetched && i < n; i++) al_free(g->fetched[i]);
    al_free(g->leaf), al_free(g->input_buf), al_free(g->fetched);
    g->leaf = g->input_buf = NULL;
    g->fetched = NULL;
    sched_free(&g->comp.sched);
    plan_free(&g->comp.plan);
    ir_graph_free(g->compiled);
    g->compiled = NULL;
    range_stats_drop(g);
}

void graph_release_device(alloy_graph *g)
{
    if (g->dev && --g->dev->refs == 0) {
        rt_backend_close(g->dev->backend);
        al_free(g->dev);
    }
    g->dev = NULL;
}

/* Builds the schedule and plan of a run that keeps keep[0..nnodes) into
 * exec_sched / exec_plan (exec_keep its copy). */
static alloy_status plan_kept(alloy_graph *g, const uint8_t *keep)
{
    const ir_graph *c = g->compiled;
    size_t n = (size_t)c->nnodes;
    bool *want = al_calloc(n + 1, sizeof(bool));
    g->exec_keep = al_malloc(n + 1);
    if (!want || !g->exec_keep) {
        al_free(want);
        return graph_fail(g, ALLOY_ERR_OOM, "out of memory planning a run of graph '%s'", c->name);
    }
    memcpy(g->exec_keep, keep, n);
    for (size_t i = 0; i < n; i++) want[i] = keep[i];
    char err[256];
    alloy_status st = sched_build(c, want, &g->exec_sched, err, sizeof err);
    if (!st) st = plan_for_step(c, &g->exec_sched, g->cfg.no_arena, &g->exec_plan, err, sizeof err);
    al_free(want);
    return st ? graph_fail(g, st, "planning a run of graph '%s': %s", c->name, err) : ALLOY_OK;
}

alloy_status graph_exec_ready(alloy_graph *g, const uint8_t *keep)
{
    const ir_graph *c = g->compiled;
    g->exec = keep ? g->exec_kept : g->exec_default;
    if (g->exec && (!keep || memcmp(keep, g->exec_keep, (size_t)c->nnodes) == 0)) return ALLOY_OK;
    const schedule *s = &g->comp.sched;
    const mem_plan *p = &g->comp.plan;
    alloy_status st = ALLOY_OK;
    if (keep) { /* a run that keeps more: its own schedule and plan, in place of the last such run's */
        drop_kept_exec(g);
        if ((st = plan_kept(g, keep))) {
            drop_kept_exec(g);
            return st;
        }
        s = &g->exec_sched;
        p = &g->exec_plan;
    }
    rt_exec **slot = keep ? &g->exec_kept : &g->exec_default;
    rt_backend *b = graph_backend(g);
    b->cfg = g->cfg; /* a backend shared with other graphs has the last one's options */
    /* a bundle's own schedule: its backend's executable from the file (CUDA: the images, no compiler) */
    st = g->from_bundle && !keep ? b->ops->exec_load(b, c, s, p, g->bundle_exec, slot)
                                 : b->ops->compile(b, c, s, p, slot);
    if (st == ALLOY_ERR_UNSUPPORTED && g->cfg.device == OPT_DEVICE_AUTO && strcmp(b->ops->name, "cpu") != 0)
        st = fall_back_to_cpu(g, c, s, p, slot);
    if (st) {
        *slot = NULL;
        if (keep) drop_kept_exec(g);
        return graph_fail(g, st, "%s", graph_backend(g)->error);
    }
    g->exec = *slot;
    g->exec_builds++;
    return ALLOY_OK;
}

/* device=auto, and the preferred backend cannot run this graph (an op it
 * has no kernel for): the CPU runs it instead, the state moved there, and
 * the backend's note says why; the other executable, the old backend's, is
 * freed first. A backend shared with other graphs stays: the graph cannot
 * run, and the error says why. */
static alloy_status fall_back_to_cpu(alloy_graph *g, const ir_graph *c, const schedule *s, const mem_plan *p,
                                     rt_exec **out)
{
    rt_backend *b = graph_backend(g);
    char why[512], err[512];
    al_fmt(why, sizeof why, "%s cannot run graph '%s': %s", b->ops->name, c->name, b->error);
    if (g->dev->refs > 1)
        return rt_fail(b, ALLOY_ERR_UNSUPPORTED, "%s; and the CPU cannot take over: the graph shares state with "
                       "other graphs on the %s backend", why, b->ops->name);
    rt_backend *cpu;
    alloy_status st = rt_backend_open_named("cpu", &g->cfg, &cpu, err, sizeof err);
    if (!st) drop_inputs(g), free_execs(g); /* inputs are uploaded again, into the CPU's buffers */
    if (!st && (st = switch_backend(g, cpu))) {
        rt_backend_close(cpu);
        al_fmt(err, sizeof err, "%s", g->error);
    }
    if (st) return rt_fail(b, st, "%s; and the CPU could not take over: %s", why, err);
    al_fmt(cpu->note, sizeof cpu->note, "%s", why);
    return cpu->ops->compile(cpu, c, s, p, out);
}

alloy_status state_ensure(alloy_graph *g)
{
    if (g->state_ready) return ALLOY_OK;
    if (g->ir->status) return graph_built(g);
    alloy_status st = graph_compile(g);
    return st ? st : state_init(g);
}
