/* bundle_api.c - the public bundle calls: a bundle as an alloy_graph whose compiled IR, schedule and plan come from the file instead of the pass pipeline (saving one: bundle_save.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/bundle.h"
#include "runtime/bundle/bundle.h"
#include "runtime/graph/graph_impl.h"

struct alloy_bundle {
    alloy_graph *g;
};

/* Applies the bundle's options line ("# options: defaults" or "# options:
 * NAME=VALUE ...") over cfg. */
static alloy_status apply_options(al_options *cfg, const char *line, const char *path, char *err, size_t errlen)
{
    static const char prefix[] = "# options:";
    if (strncmp(line, prefix, sizeof prefix - 1) != 0) {
        al_fmt(err, errlen, "%s: section options: does not start with '%s'", path, prefix);
        return ALLOY_ERR_FORMAT;
    }
    char *copy = al_strdup(line + sizeof prefix - 1);
    if (!copy) {
        al_fmt(err, errlen, "%s: out of memory", path);
        return ALLOY_ERR_OOM;
    }
    alloy_status st = ALLOY_OK;
    char *save = NULL;
    for (char *tok = strtok_r(copy, " ", &save); tok && !st; tok = strtok_r(NULL, " ", &save)) {
        if (strcmp(tok, "defaults") == 0) continue;
        char *eq = strchr(tok, '=');
        char why[512] = "";
        if (!eq) {
            al_fmt(err, errlen, "%s: section options: '%s' is not NAME=VALUE", path, tok);
            st = ALLOY_ERR_FORMAT;
            break;
        }
        *eq = '\0';
        if (opt_set(cfg, tok, eq + 1, why, sizeof why)) {
            al_fmt(err, errlen, "%s: section options: %s", path, why);
            st = ALLOY_ERR_FORMAT;
        }
    }
    al_free(copy);
    return st;
}

/* On a GPU (a backend with device_caps), that every module of the bundle's
 * CUDA executable has an image the GPU runs (bundle_cuda_pick); an error
 * naming the GPU and the bundle's targets otherwise. A bundle without one
 * is compiled for the GPU as a graph is. */
static alloy_status check_gpu(const rt_backend *be, const bundle_cuda *x, const char *path, char *err, size_t errlen)
{
    int sm, driver;
    if (!x->nimages || !be->ops->device_caps || !be->ops->device_caps(be, &sm, &driver)) return ALLOY_OK;
    for (uint32_t m = 0; m < x->nmodules; m++) {
        const bundle_image *im;
        char why[768];
        alloy_status st = bundle_cuda_pick(x, m, sm, driver, &im, why, sizeof why);
        if (st) {
            al_fmt(err, errlen, "%s: %s", path, why);
            return st;
        }
    }
    return ALLOY_OK;
}

alloy_status alloy_bundle_load(const char *path, alloy_bundle **out, char *err, size_t errlen)
{
    if (!out) return ALLOY_ERR_INVALID;
    *out = NULL;
    char dummy[1];
    if (!err || !errlen) err = dummy, errlen = sizeof dummy;
    err[0] = '\0';
    if (!path) {
        al_fmt(err, errlen, "bundle_load: path is NULL");
        return ALLOY_ERR_INVALID;
    }
    bundle_contents c;
    alloy_status st = bundle_read_file(path, &c, err, errlen);
    if (st) return st;
    alloy_bundle *b = al_calloc(1, sizeof *b);
    alloy_graph *g = b ? alloy_graph_new(c.graph_name) : NULL;
    if (!g) {
        al_free(b);
        bundle_contents_free(&c);
        al_fmt(err, errlen, "%s: out of memory", path);
        return ALLOY_ERR_OOM;
    }
    b->g = g;
    g->from_bundle = true;
    g->seed = c.seed;
    g->training = c.training;
    g->scaler.kind = (alloy_scaler_kind)c.scaler_kind;
    g->scaler.growth_interval = c.growth_interval;
    g->scaler.hysteresis = c.hysteresis;
    g->scaler.max_consecutive_skips = c.max_consecutive_skips;
    g->optimizer.kind = (alloy_optimizer_kind)c.optimizer_kind;
    g->optimizer.accumulation_steps = c.accumulation_steps;
    /* the environment's configuration (the device), then what compiled the bundle */
    st = graph_options(g, &g->cfg);
    if (st) al_fmt(err, errlen, "%s: %s", path, g->error);
    else st = apply_options(&g->cfg, c.options, path, err, errlen);
    if (!st) {
        size_t n = (size_t)c.ir->nnodes + 1;
        g->compiled = c.ir, c.ir = NULL;
        g->comp = c.comp;
        memset(&c.comp, 0, sizeof c.comp);
        g->leaf = al_calloc(n, sizeof *g->leaf);
        g->input_buf = al_calloc(n, sizeof *g->input_buf);
        g->fetched = al_calloc(n, sizeof *g->fetched);
        if (!g->leaf || !g->input_buf || !g->fetched) {
            al_fmt(err, errlen, "%s: out of memory", path);
            st = ALLOY_ERR_OOM;
        }
    }
    /* the CUDA executable stays with the graph: exec_load builds the step from it */
    if (!st && c.cuda.nimages && !(g->bundle_exec = al_malloc(sizeof *g->bundle_exec))) {
        al_fmt(err, errlen, "%s: out of memory", path);
        st = ALLOY_ERR_OOM;
    }
    if (g->bundle_exec) {
        *g->bundle_exec = c.cuda;
        memset(&c.cuda, 0, sizeof c.cuda);
    }
    uint8_t *init = c.init_state; /* the saved initial state, loaded over the seed's below */
    size_t init_len = c.init_state_len;
    c.init_state = NULL;
    bundle_contents_free(&c);
    if (!st) {
        step_info_nodes(g);
        st = state_ensure(g); /* opens the backend, creates and initializes the state */
        if (st) al_fmt(err, errlen, "%s: %s", path, g->error);
    }
    if (!st && init) {
        char where[600];
        al_fmt(where, sizeof where, "%s: section initial state", path);
        if ((st = graph_load_state_memory(g, init, init_len, where))) al_fmt(err, errlen, "%s", g->error);
    }
    al_free(init);
    if (!st && g->bundle_exec) st = check_gpu(graph_backend(g), g->bundle_exec, path, err, errlen);
    if (st) {
        alloy_bundle_free(b);
        return st;
    }
    *out = b;
    return ALLOY_OK;
}

int alloy_bundle_input_count(const alloy_bundle *b)
{
    int n = 0;
    for (int i = 0; b && i < b->g->compiled->nnodes; i++) n += b->g->compiled->nodes[i]->op == IR_OP_input;
    return n;
}

alloy_status alloy_bundle_input_at(const alloy_bundle *b, int i, alloy_host_tensor *out)
{
    if (!b) return ALLOY_ERR_INVALID;
    if (!out) return graph_fail_const(b->g, ALLOY_ERR_INVALID, "bundle_input_at: out is NULL");
    const ir_graph *c = b->g->compiled;
    for (int k = 0, left = i; k < c->nnodes; k++) {
        const ir_node *n = c->nodes[k];
        if (n->op != IR_OP_input || left--) continue;
        *out = (alloy_host_tensor){.name = n->name, .dtype = n->type.dtype, .rank = n->type.rank};
        memcpy(out->dims, n->type.dims, sizeof out->dims);
        return ALLOY_OK;
    }
    return graph_fail_const(b->g, ALLOY_ERR_NOT_FOUND, "bundle_input_at: index %d out of range [0, %d)", i,
                            alloy_bundle_input_count(b));
}

alloy_status alloy_bundle_run(alloy_bundle *b, const alloy_host_tensor *feeds, int nfeeds, alloy_host_tensor *fetches,
                              int nfetches)
{
    return b ? alloy_graph_run(b->g, feeds, nfeeds, fetches, nfetches) : ALLOY_ERR_INVALID;
}

alloy_status alloy_bundle_step_info(const alloy_bundle *b, alloy_step_info *out)
{
    return b ? alloy_graph_step_info(b->g, out) : ALLOY_ERR_INVALID;
}

alloy_status alloy_bundle_overflow_info(const alloy_bundle *b, alloy_overflow_info *out)
{
    return b ? alloy_graph_overflow_info(b->g, out) : ALLOY_ERR_INVALID;
}

int alloy_bundle_state_count(alloy_bundle *b) { return b ? alloy_graph_state_count(b->g) : 0; }

alloy_status alloy_bundle_state_at(alloy_bundle *b, int i, alloy_host_tensor *out)
{
    return b ? alloy_graph_state_at(b->g, i, out) : ALLOY_ERR_INVALID;
}

alloy_status alloy_bundle_get_state(alloy_bundle *b, const char *name, alloy_host_tensor *out)
{
    return b ? alloy_graph_get_state(b->g, name, out) : ALLOY_ERR_INVALID;
}

alloy_status alloy_bundle_set_state(alloy_bundle *b, const alloy_host_tensor *src)
{
    return b ? alloy_graph_set_state(b->g, src) : ALLOY_ERR_INVALID;
}

alloy_status alloy_bundle_save_state(alloy_bundle *b, const char *path)
{
    return b ? alloy_graph_save_state(b->g, path) : ALLOY_ERR_INVALID;
}

alloy_status alloy_bundle_load_state(alloy_bundle *b, const char *path)
{
    return b ? alloy_graph_load_state(b->g, path) : ALLOY_ERR_INVALID;
}

const char *alloy_bundle_last_error(const alloy_bundle *b) { return b ? alloy_last_error(b->g) : "bundle is NULL"; }

void alloy_bundle_free(alloy_bundle *b)
{
    if (!b) return;
    alloy_graph_free(b->g);
    al_free(b);
}
