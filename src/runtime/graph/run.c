/* run.c - alloy_graph: lifecycle, compile on first run, feeds and fetches, dumps. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/pass.h"
#include "runtime/cpu/gemm.h"
#include "runtime/graph/graph_impl.h"

alloy_status graph_fail(alloy_graph *g, alloy_status status, const char *fmt, ...)
{
    g->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->error, sizeof g->error, fmt, ap);
    va_end(ap);
    return status;
}

alloy_graph *alloy_graph_new(const char *name)
{
    alloy_graph *g = al_calloc(1, sizeof *g);
    if (!g) return NULL;
    g->ir = ir_graph_new(name);
    if (!g->ir) {
        al_free(g);
        return NULL;
    }
    amp_config_init(&g->amp);
    return g;
}

static void release_values(alloy_graph *g)
{
    for (int i = 0; i < g->nsnapshots; i++) al_free(g->snapshots[i]);
    al_free(g->snapshots);
    g->snapshots = NULL;
    g->nsnapshots = 0;
    if (g->values && g->compiled && !g->values_in_arena) cpu_release_values(g->compiled, g->values);
    al_free(g->values);
    g->values = NULL;
    g->values_in_arena = false;
}

/* Drops the arena and its plan (after release_values: no value may point there). */
static void release_arena(alloy_graph *g)
{
    plan_free(&g->plan);
    al_free(g->plan_keep);
    al_free(g->arena_block);
    g->plan_keep = NULL;
    g->arena_block = NULL;
    g->arena = NULL;
    g->arena_cap = 0;
}

/* Makes g->plan and g->arena fit a run of compiled keeping keep[]: the
 * cached plan when the keep set is the same, else a new plan, the arena
 * grown only when the new plan needs more. False when there is no plan
 * (out of memory): the run then falls back to al_malloc per value. */
static bool arena_ready(alloy_graph *g, const bool *keep)
{
    const ir_graph *c = g->compiled;
    size_t n = (size_t)c->nnodes;
    if (g->plan_keep && g->arena && memcmp(g->plan_keep, keep, n * sizeof(bool)) == 0) return true;
    plan_free(&g->plan);
    al_free(g->plan_keep);
    g->plan_keep = NULL;
    cpu_exec x = {.nthreads = 1};
    if (cpu_plan_arena(&x, c, keep, &g->plan)) return false;
    g->plan_keep = al_malloc(n * sizeof(bool) + 1);
    if (!g->plan_keep) {
        plan_free(&g->plan);
        return false;
    }
    memcpy(g->plan_keep, keep, n * sizeof(bool));
    if (!g->arena || g->arena_cap < g->plan.arena_bytes) {
        al_free(g->arena_block);
        g->arena = NULL;
        g->arena_cap = 0;
        size_t want = g->plan.arena_bytes ? g->plan.arena_bytes : PLAN_ALIGN;
        g->arena_block = al_malloc(want + PLAN_ALIGN);
        if (!g->arena_block) {
            plan_free(&g->plan);
            al_free(g->plan_keep);
            g->plan_keep = NULL;
            return false;
        }
        uintptr_t a = (uintptr_t)g->arena_block;
        g->arena = (char *)g->arena_block + ((PLAN_ALIGN - a % PLAN_ALIGN) % PLAN_ALIGN);
        g->arena_cap = want;
    }
    return true;
}

void alloy_graph_free(alloy_graph *g)
{
    if (!g) return;
    release_values(g);
    release_arena(g);
    ir_graph_free(g->compiled);
    ir_graph_free(g->ir);
    state_free_all(g);
    graph_options_free(g);
    for (int i = 0; i < g->ngrad_inputs; i++) al_free(g->grad_inputs[i]);
    al_free(g->grad_inputs);
    al_free(g);
}

alloy_status alloy_graph_status(const alloy_graph *g)
{
    if (!g) return ALLOY_ERR_INVALID;
    return g->ir->status ? g->ir->status : g->status;
}

const char *alloy_last_error(const alloy_graph *g)
{
    if (!g) return "no graph (NULL)";
    if (g->ir->status) return g->ir->error;
    return g->status ? g->error : "";
}

void alloy_graph_set_seed(alloy_graph *g, uint64_t seed)
{
    if (g) g->seed = seed;
}

alloy_graph *alloy_graph_parse(const char *text, size_t len, const char *filename, char *err,
                               size_t errlen)
{
    if (!text) {
        al_fmt(err, errlen, "%s: no text (NULL)", filename ? filename : "<input>");
        return NULL;
    }
    ir_graph *ir = ir_parse(text, len, filename ? filename : "<input>", err, errlen);
    if (!ir) return NULL;
    alloy_graph *g = al_calloc(1, sizeof *g);
    if (!g) {
        ir_graph_free(ir);
        al_fmt(err, errlen, "out of memory");
        return NULL;
    }
    g->ir = ir;
    amp_config_init(&g->amp);
    return g;
}

alloy_graph *alloy_graph_load_ir(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        al_fmt(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *text = al_malloc(cap);
    size_t got;
    while (text && (got = fread(text + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *bigger = al_realloc(text, cap * 2);
            if (!bigger) {
                al_free(text);
                text = NULL;
                break;
            }
            text = bigger;
            cap *= 2;
        }
    }
    bool bad = ferror(f);
    fclose(f);
    if (!text || bad) {
        al_free(text);
        al_fmt(err, errlen, "%s: %s", path, bad ? "read error" : "out of memory");
        return NULL;
    }
    alloy_graph *g = alloy_graph_parse(text, len, path, err, errlen);
    al_free(text);
    return g;
}

/* Builds the compiled step from the built graph. */
alloy_status graph_compile(alloy_graph *g)
{
    if (g->compiled) return ALLOY_OK;
    ir_graph *c = ir_graph_clone(g->ir);
    if (!c) return graph_fail(g, ALLOY_ERR_OOM, "out of memory copying the graph to compile it");
    pass_options opts;
    alloy_status st = graph_options(g, &g->cfg);
    if (!st) st = graph_pass_options(g, &opts);
    if (!st && g->cfg.device == OPT_DEVICE_CUDA)
        st = graph_fail(g, ALLOY_ERR_UNSUPPORTED, "device cuda: this build of alloy has no CUDA backend yet");
    if (st) {
        ir_graph_free(c);
        return st;
    }
    opts.amp_report = &g->amp_report;
    opts.train = g->training;
    opts.scaler = g->scaler;
    opts.optimizer = g->optimizer;
    opts.grad_inputs = (const char *const *)g->grad_inputs;
    opts.ngrad_inputs = g->ngrad_inputs;
    opts.cfg = &g->cfg;
    st = pass_run_pipeline(&c, &opts, g->print_to ? g->print_to : stderr, NULL, 0, NULL);
    if (st) {
        graph_fail(g, st, "compiling graph '%s': %s", g->ir->name, c->error);
        ir_graph_free(c);
        return st;
    }
    g->compiled = c;
    return ALLOY_OK;
}

/* The node a fetch name refers to: an output name first, else a node name. */
static int fetch_node(const ir_graph *c, const char *name)
{
    for (int i = 0; i < c->noutputs; i++)
        if (strcmp(c->outputs[i].name, name) == 0) return c->outputs[i].node;
    return ir_find_name(c, name);
}

static alloy_status bind_feeds(alloy_graph *g, const alloy_host_tensor *feeds, int nfeeds)
{
    const ir_graph *c = g->compiled;
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
        if (!f->data && ir_nbytes(t))
            return graph_fail(g, ALLOY_ERR_INVALID, "feed '%s': data is NULL", f->name);
        for (int j = 0; j < i; j++)
            if (feeds[j].name && strcmp(feeds[j].name, f->name) == 0)
                return graph_fail(g, ALLOY_ERR_INVALID, "input '%s' is fed twice", f->name);
        g->values[id].data = f->data;
    }
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        if (n->op == IR_OP_input && !g->values[i].data && ir_nbytes(&n->type))
            return graph_fail(g, ALLOY_ERR_NOT_FOUND, "input '%s' was not fed", n->name);
        if (n->op == IR_OP_param || n->op == IR_OP_state) {
            int s = g->state_of_node[i];
            if (s < 0) return graph_fail(g, ALLOY_ERR_NOT_FOUND, "%s '%s' has no state", ir_ops[n->op].name, n->name);
            g->values[i].data = g->state[s].data;
        }
    }
    return ALLOY_OK;
}

/* A fetched param/state that this run updates is copied first, so the fetch
 * shows the value the step used, not the one it wrote. */
static alloy_status snapshot_fetched_state(alloy_graph *g, const alloy_host_tensor *fetches, int nfetches)
{
    const ir_graph *c = g->compiled;
    for (int i = 0; i < nfetches; i++) {
        int id = fetch_node(c, fetches[i].name);
        const ir_node *n = c->nodes[id];
        if (n->op != IR_OP_param && n->op != IR_OP_state) continue;
        bool updated = false;
        for (int u = 0; u < c->nupdates && !updated; u++) updated = strcmp(c->updates[u].name, n->name) == 0;
        if (!updated) continue;
        void **list = al_realloc(g->snapshots, sizeof(void *) * (size_t)(g->nsnapshots + 1));
        size_t bytes = ir_nbytes(&n->type);
        void *copy = al_malloc(bytes ? bytes : 1);
        if (list) g->snapshots = list;
        if (!list || !copy) {
            al_free(copy);
            return graph_fail(g, ALLOY_ERR_OOM, "out of memory copying fetched state '%s'", n->name);
        }
        memcpy(copy, g->values[id].data, bytes);
        g->snapshots[g->nsnapshots++] = copy;
        g->values[id].data = copy; /* the fetch below reads this copy */
    }
    return ALLOY_OK;
}

alloy_status alloy_graph_run(alloy_graph *g, const alloy_host_tensor *feeds, int nfeeds,
                             alloy_host_tensor *fetches, int nfetches)
{
    if (!g) return ALLOY_ERR_INVALID;
    g->status = ALLOY_OK;
    if (g->ir->status) return g->ir->status;
    if ((nfeeds && !feeds) || (nfetches && !fetches) || nfeeds < 0 || nfetches < 0)
        return graph_fail(g, ALLOY_ERR_INVALID, "run: feeds/fetches NULL with a non-zero count");
    alloy_status st = state_ensure(g); /* compiles first */
    if (st) return st;
    release_values(g);
    const ir_graph *c = g->compiled;
    g->values = al_calloc((size_t)c->nnodes + 1, sizeof(rt_tensor));
    bool *keep = al_calloc((size_t)c->nnodes + 1, sizeof(bool));
    if (!g->values || !keep) {
        al_free(keep);
        return graph_fail(g, ALLOY_ERR_OOM, "out of memory starting a run");
    }
    for (int i = 0; i < nfetches; i++) {
        int id = fetches[i].name ? fetch_node(c, fetches[i].name) : -1;
        if (id < 0) {
            al_free(keep);
            return graph_fail(g, ALLOY_ERR_NOT_FOUND, "fetch '%s': no output or named node of that name",
                              fetches[i].name ? fetches[i].name : "(NULL)");
        }
        keep[id] = true;
    }
    for (int i = 0; i < c->noutputs; i++) keep[c->outputs[i].node] = true; /* step info reads them */
    for (int i = 0; i < c->nupdates; i++) keep[c->updates[i].node] = true;
    if (c->loss >= 0) keep[c->loss] = true;
    st = bind_feeds(g, feeds, nfeeds);
    if (!st) {
        cpu_exec x = {.nthreads = g->cfg.num_threads};
        gemm_configure(g->cfg.blas, g->cfg.num_threads);
        bool arena = !g->cfg.no_arena && arena_ready(g, keep);
        g->values_in_arena = arena;
        st = cpu_run_graph_arena(&x, c, g->values, keep, arena ? &g->plan : NULL, arena ? g->arena : NULL);
        if (st) graph_fail(g, st, "running graph '%s': %s", c->name, x.error);
    }
    if (!st) st = snapshot_fetched_state(g, fetches, nfetches);
    if (!st) {
        step_info_capture(g); /* reads the scale used before the updates replace it */
        for (int i = 0; i < c->nupdates; i++) {
            int s = g->state_of_update[i];
            size_t bytes = ir_nbytes(&c->nodes[c->updates[i].node]->type);
            if (s >= 0 && bytes) memcpy(g->state[s].data, g->values[c->updates[i].node].data, bytes);
        }
    }
    for (int i = 0; i < c->nnodes; i++) /* feeds belong to the caller */
        if (c->nodes[i]->op == IR_OP_input) g->values[i].data = NULL;
    for (int i = 0; !st && i < nfetches; i++) {
        int id = fetch_node(c, fetches[i].name);
        const ir_node *n = c->nodes[id];
        fetches[i].dtype = n->type.dtype;
        fetches[i].rank = n->type.rank;
        memcpy(fetches[i].dims, n->type.dims, sizeof fetches[i].dims);
        fetches[i].data = n->op == IR_OP_input ? NULL : g->values[id].data;
        if (n->op == IR_OP_input) {
            for (int j = 0; j < nfeeds; j++)
                if (strcmp(feeds[j].name, n->name) == 0) fetches[i].data = feeds[j].data;
        }
    }
    al_free(keep);
    return st;
}

alloy_status alloy_graph_dump(alloy_graph *g, FILE *out, alloy_dump_kind kind)
{
    if (!g || !out) return ALLOY_ERR_INVALID;
    if (kind == ALLOY_DUMP_SOURCE) {
        ir_print(g->ir, out);
        return ALLOY_OK;
    }
    if (g->ir->status) return g->ir->status;
    alloy_status st = graph_compile(g);
    if (st) return st;
    ir_print(g->compiled, out);
    return ALLOY_OK;
}

void graph_invalidate(alloy_graph *g)
{
    g->state_ready = false; /* a recompile may add state (moments, scale) */
    release_values(g);
    release_arena(g);
    ir_graph_free(g->compiled);
    g->compiled = NULL;
}

int alloy_graph_output_count(const alloy_graph *g) { return g ? g->ir->noutputs : 0; }

const char *alloy_graph_output_name(const alloy_graph *g, int i)
{
    return g && i >= 0 && i < g->ir->noutputs ? g->ir->outputs[i].name : NULL;
}

int alloy_graph_input_count(const alloy_graph *g)
{
    int n = 0;
    for (int i = 0; g && i < g->ir->nnodes; i++) n += g->ir->nodes[i]->op == IR_OP_input;
    return n;
}

alloy_status alloy_graph_input_at(const alloy_graph *g, int i, alloy_host_tensor *out)
{
    if (!g || !out) return ALLOY_ERR_INVALID;
    for (int k = 0; k < g->ir->nnodes; k++) {
        const ir_node *n = g->ir->nodes[k];
        if (n->op != IR_OP_input || i--) continue;
        *out = (alloy_host_tensor){.name = n->name, .dtype = n->type.dtype, .rank = n->type.rank};
        memcpy(out->dims, n->type.dims, sizeof out->dims);
        return ALLOY_OK;
    }
    return ALLOY_ERR_NOT_FOUND;
}

alloy_status alloy_graph_print_after(alloy_graph *g, const char *passes, FILE *out)
{
    if (!g) return ALLOY_ERR_INVALID;
    alloy_status st = alloy_graph_set_option(g, "print_after", passes ? passes : "");
    if (!st) g->print_to = out;
    return st;
}
