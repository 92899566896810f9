/* run.c - alloy_graph_run: feeds uploaded, one backend run, fetches and the step's scalars downloaded. */
#include <stdio.h>
#include <string.h>

#include "runtime/graph/graph_impl.h"

/* The node a fetch name refers to: an output name first, else a node name. */
static int fetch_node(const ir_graph *c, const char *name)
{
    for (int i = 0; i < c->noutputs; i++)
        if (strcmp(c->outputs[i].name, name) == 0) return c->outputs[i].node;
    return ir_find_name(c, name);
}

static bool is_leaf(const ir_node *n) { return n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state; }

/* Checks every feed against its input and uploads it into the input's buffer. */
static alloy_status upload_feeds(alloy_graph *g, const alloy_host_tensor *feeds, int nfeeds)
{
    const ir_graph *c = g->compiled;
    rt_backend *b = graph_backend(g);
    for (int i = 0; i < nfeeds; i++) {
        const alloy_host_tensor *f = &feeds[i];
        if (!f->name) return graph_fail(g, ALLOY_ERR_INVALID, "feed %d has no name", i);
        int id = ir_find_name(c, f->name);
        if (id < 0 || c->nodes[id]->op != IR_OP_input)
            return graph_fail(g, ALLOY_ERR_NOT_FOUND, "feed '%s': graph '%s' has no input of that name",
                              f->name, c->name);
        const ir_type *t = &c->nodes[id]->type;
        ir_type given = {.dtype = f->dtype, .rank = f->rank};
        if (f->rank < 0 || f->rank > ALLOY_MAX_RANK)
            return graph_fail(g, ALLOY_ERR_SHAPE, "feed '%s': rank %d out of range", f->name, f->rank);
        memcpy(given.dims, f->dims, sizeof(int64_t) * (size_t)f->rank);
        if (!ir_type_eq(t, &given)) {
            char want[96], got[96];
            ir_fmt_type(want, sizeof want, t);
            ir_fmt_type(got, sizeof got, &given);
            return graph_fail(g, f->dtype != t->dtype ? ALLOY_ERR_DTYPE : ALLOY_ERR_SHAPE,
                              "feed '%s': input is %s, fed %s", f->name, want, got);
        }
        size_t bytes = ir_nbytes(t);
        if (!f->data && bytes) return graph_fail(g, ALLOY_ERR_INVALID, "feed '%s': data is NULL", f->name);
        for (int j = 0; j < i; j++)
            if (feeds[j].name && strcmp(feeds[j].name, f->name) == 0)
                return graph_fail(g, ALLOY_ERR_INVALID, "input '%s' is fed twice", f->name);
        if (!g->input_buf[id] && b->ops->buffer_new(b, bytes, &g->input_buf[id])) return graph_fail(g, ALLOY_ERR_OOM, "%s", b->error);
        if (b->ops->upload(b, g->input_buf[id], f->data, bytes)) return graph_fail(g, ALLOY_ERR_INVALID, "%s", b->error);
        g->leaf[id] = g->input_buf[id];
    }
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        if (n->op != IR_OP_input || !ir_nbytes(&n->type)) continue;
        if (!n->name) /* IR text may leave one unnamed (%3 = input ...); nothing can feed it */
            return graph_fail(g, ALLOY_ERR_INVALID,
                              "input %%%d of graph '%s' has no name, so it cannot be fed (write it as %%name = input ...)",
                              n->id, c->name);
        bool fed = false;
        for (int j = 0; j < nfeeds && !fed; j++) fed = strcmp(feeds[j].name, n->name) == 0;
        if (!fed) return graph_fail(g, ALLOY_ERR_NOT_FOUND, "input '%s' was not fed", n->name);
    }
    return ALLOY_OK;
}

/* Binds every param/state leaf to its state tensor's buffer. */
static alloy_status bind_state(alloy_graph *g)
{
    const ir_graph *c = g->compiled;
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        if (n->op != IR_OP_param && n->op != IR_OP_state) continue;
        rt_state *s = state_find(g, n->name);
        if (!s) return graph_fail(g, ALLOY_ERR_NOT_FOUND, "%s '%s' has no state", ir_ops[n->op].name, n->name);
        g->leaf[i] = s->cell->buf;
    }
    return ALLOY_OK;
}

alloy_status alloy_graph_run(alloy_graph *g, const alloy_host_tensor *feeds, int nfeeds,
                             alloy_host_tensor *fetches, int nfetches)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (g->ir->status) return graph_built(g);
    if ((nfeeds && !feeds) || (nfetches && !fetches) || nfeeds < 0 || nfetches < 0)
        return graph_fail(g, ALLOY_ERR_INVALID, "run: feeds/fetches NULL with a non-zero count");
    alloy_status st = state_ensure(g); /* compiles first */
    if (st) return st;
    const ir_graph *c = g->compiled;
    size_t nn = (size_t)c->nnodes;
    /* fetches of values the default schedule does not keep need a run that keeps them */
    uint8_t *keep = NULL;
    int *fetch_id = al_malloc(sizeof(int) * (size_t)(nfetches + 1));
    rt_download *downloads = al_malloc(sizeof(rt_download) * (size_t)(nfetches + NSCALARS));
    if (!fetch_id || !downloads) st = graph_fail(g, ALLOY_ERR_OOM, "out of memory starting a run");
    for (int i = 0; !st && i < nfetches; i++) {
        int id = fetches[i].name ? fetch_node(c, fetches[i].name) : -1;
        if (id < 0 && fetches[i].name && strncmp(fetches[i].name, GRAD_PREFIX, strlen(GRAD_PREFIX)) == 0 &&
            (g->ir->loss < 0 || !g->training)) {
            st = graph_fail(g, ALLOY_ERR_NOT_FOUND,
                            "fetch '%s': graph '%s' computes no gradients: %s", fetches[i].name, g->ir->name,
                            g->ir->loss < 0 ? "they need a loss (alloy_graph_set_loss)"
                                            : "training is off (alloy_graph_set_training)");
            break;
        }
        if (id < 0) {
            st = graph_fail(g, ALLOY_ERR_NOT_FOUND, "fetch '%s': no output or named node of that name",
                            fetches[i].name ? fetches[i].name : "(NULL)");
            break;
        }
        fetch_id[i] = id;
        if (is_leaf(c->nodes[id]) || g->comp.sched.kept[id]) continue;
        if (!keep && !(keep = al_calloc(nn + 1, 1))) st = graph_fail(g, ALLOY_ERR_OOM, "out of memory starting a run");
        else keep[id] = 1;
    }
    if (!st) st = graph_exec_ready(g, keep);
    if (!st) st = upload_feeds(g, feeds, nfeeds);
    if (!st) st = bind_state(g);
    int nd = 0;
    uint8_t *flags = NULL; /* amp_check's, per compiled node */
    bool checked = false, tracked = false; /* the backend did amp_check's, amp_stats' */
    rt_run_args args;
    for (int i = 0; !st && i < nfetches; i++) {
        int id = fetch_id[i];
        size_t bytes = ir_nbytes(&c->nodes[id]->type);
        if (c->nodes[id]->op == IR_OP_input) continue; /* a fetched feed is the caller's data */
        if (!g->fetched[id] && !(g->fetched[id] = al_malloc(bytes + 1)))
            st = graph_fail(g, ALLOY_ERR_OOM, "out of memory for fetch '%s' (%zu bytes)", fetches[i].name, bytes);
        else downloads[nd++] = (rt_download){id, g->fetched[id]};
    }
    for (int k = 0; !st && k < NSCALARS; k++) /* the step's scalars: one small download */
        if (g->step_node[k] >= 0) downloads[nd++] = (rt_download){g->step_node[k], &g->step_raw[k]};
    if (!st) {
        args = (rt_run_args){.leaf = g->leaf, .downloads = downloads, .ndownloads = nd,
                             .profile_to = g->print_to, .nonfinite_done = &checked, .comm = g->comm};
        if (g->cfg.amp_check && !(args.nonfinite = flags = al_calloc(nn + 1, 1)))
            st = graph_fail(g, ALLOY_ERR_OOM, "out of memory for amp_check's flags (%zu bytes)", nn);
        if (!st) st = range_stats_prepare(g, &args.ranges);
        args.ranges_done = &tracked;
        /* a backend that reads its flags back (CUDA) does so only on a
         * skipped step, when the step has found_inf to say so */
        args.flags_later = flags && graph_backend(g)->ops->read_flags && g->step_node[SCALAR_FOUND] >= 0 && !args.ranges;
    }
    if (!st) {
        rt_backend *b = graph_backend(g);
        b->cfg = g->cfg; /* a backend shared with other graphs has the last one's options */
        st = b->ops->run(b, g->exec, &args);
        for (int i = 0; i < g->nstate; i++) g->state[i].cell->host_stale = true; /* updates wrote the buffers */
        if (st) graph_fail(g, st, "running graph '%s': %s", c->name, b->error);
    }
    if (!st) step_info_capture(g);
    if (!st && checked && args.flags_later && g->step.skipped) {
        rt_backend *b = graph_backend(g);
        if ((st = b->ops->read_flags(b, g->exec, flags))) graph_fail(g, st, "running graph '%s': %s", c->name, b->error);
    }
    if (!st) overflow_capture(g, flags, checked && flags);
    if (!st && tracked) {
        overflow_add_input_range(g, args.ranges);
        range_stats_merge(g);
        g->range_runs++;
    }
    al_free(flags);
    for (int i = 0; !st && i < nfetches; i++) {
        int id = fetch_id[i];
        const ir_node *n = c->nodes[id];
        fetches[i].dtype = n->type.dtype;
        fetches[i].rank = n->type.rank;
        memcpy(fetches[i].dims, n->type.dims, sizeof fetches[i].dims);
        fetches[i].data = g->fetched[id];
        for (int j = 0; n->op == IR_OP_input && j < nfeeds; j++)
            if (strcmp(feeds[j].name, n->name) == 0) fetches[i].data = feeds[j].data;
    }
    al_free(keep), al_free(fetch_id), al_free(downloads);
    if (!st) st = step_diverged(g);
    return st;
}
