/* backend_exec.c - a built ir_graph compiled and run on one backend (backend_exec.h). */
#include <stdio.h>
#include <string.h>

#include "backend_exec.h"

static bool is_leaf(const ir_node *n) { return n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state; }

static alloy_status fail(bx_exec *x, alloy_status st, const char *what, const char *why)
{
    snprintf(x->error, sizeof x->error, "%s: %s", what, why);
    return st;
}

alloy_status bx_open(int i, rt_backend **out, char *err, size_t errlen)
{
    al_options cfg;
    opt_init(&cfg);
    return rt_backend_open_at(i, &cfg, out, err, errlen);
}

ir_graph *bx_passes(const ir_graph *g, const bx_options *o, pass_compiled *comp, char *err, size_t errlen)
{
    al_options cfg;
    opt_init(&cfg);
    if (o->no_fuse) cfg.no_fuse = OPT_NO_FUSE_ALL;
    pass_options opts = {.loss_seed = -1, .train = o->train, .grad_inputs = o->grad_inputs,
                         .ngrad_inputs = o->ngrad_inputs, .cfg = &cfg};
    amp_config_init(&opts.amp);
    ir_graph *c = ir_graph_clone(g);
    if (!c) {
        snprintf(err, errlen, "out of memory copying the graph");
        return NULL;
    }
    pass_compiled local = {0};
    if (pass_run_pipeline(&c, &opts, comp ? comp : &local, NULL, NULL, 0, NULL)) {
        snprintf(err, errlen, "pass pipeline: %s", c->error);
        ir_graph_free(c);
        return NULL;
    }
    pass_compiled_free(&local);
    return c;
}

alloy_status bx_compile(rt_backend *b, const ir_graph *g, const bx_options *o, bx_exec *x)
{
    memset(x, 0, sizeof *x);
    x->backend = b;
    if (!(x->graph = bx_passes(g, o, &x->comp, x->error, sizeof x->error))) return ALLOY_ERR_INVALID;
    const ir_graph *c = x->graph;
    x->leaf = al_calloc((size_t)c->nnodes + 1, sizeof *x->leaf);
    x->out = al_calloc((size_t)c->noutputs + 1, sizeof *x->out);
    if (!x->leaf || !x->out) return fail(x, ALLOY_ERR_OOM, "compile", "out of memory");
    for (int i = 0; i < c->nnodes; i++) {
        size_t bytes = ir_nbytes(&c->nodes[i]->type);
        if (is_leaf(c->nodes[i]) && bytes && b->ops->buffer_new(b, bytes, &x->leaf[i]))
            return fail(x, ALLOY_ERR_OOM, "leaf buffer", b->error);
    }
    for (int i = 0; i < c->noutputs; i++)
        if (!(x->out[i] = al_malloc(ir_nbytes(&c->nodes[c->outputs[i].node]->type) + 1)))
            return fail(x, ALLOY_ERR_OOM, "compile", "out of memory");
    alloy_status st = b->ops->compile(b, c, &x->comp.sched, &x->comp.plan, &x->exec);
    return st ? fail(x, st, "backend compile", b->error) : ALLOY_OK;
}

alloy_status bx_upload(bx_exec *x, const char *name, const void *data)
{
    int id = ir_find_name(x->graph, name);
    if (id < 0 || !is_leaf(x->graph->nodes[id])) return fail(x, ALLOY_ERR_NOT_FOUND, name, "no leaf of that name");
    size_t bytes = ir_nbytes(&x->graph->nodes[id]->type);
    if (!bytes) return ALLOY_OK;
    alloy_status st = x->backend->ops->upload(x->backend, x->leaf[id], data, bytes);
    return st ? fail(x, st, "upload", x->backend->error) : ALLOY_OK;
}

alloy_status bx_run(bx_exec *x)
{
    const ir_graph *c = x->graph;
    rt_download *d = al_malloc(sizeof *d * ((size_t)c->noutputs + 1));
    if (!d) return fail(x, ALLOY_ERR_OOM, "run", "out of memory");
    for (int i = 0; i < c->noutputs; i++) d[i] = (rt_download){c->outputs[i].node, x->out[i]};
    rt_run_args args = {.leaf = x->leaf, .downloads = d, .ndownloads = c->noutputs};
    alloy_status st = x->backend->ops->run(x->backend, x->exec, &args);
    al_free(d);
    return st ? fail(x, st, "run", x->backend->error) : ALLOY_OK;
}

const void *bx_output(const bx_exec *x, const char *name, const ir_type **type)
{
    int k = ir_find_output(x->graph, name);
    if (k < 0) return NULL;
    if (type) *type = &x->graph->nodes[x->graph->outputs[k].node]->type;
    return x->out[k];
}

void bx_free(bx_exec *x)
{
    if (x->exec) x->backend->ops->exec_free(x->backend, x->exec);
    for (int i = 0; x->graph && x->leaf && i < x->graph->nnodes; i++)
        if (x->leaf[i]) x->backend->ops->buffer_free(x->backend, x->leaf[i]);
    for (int i = 0; x->graph && x->out && i < x->graph->noutputs; i++) al_free(x->out[i]);
    al_free(x->leaf);
    al_free(x->out);
    pass_compiled_free(&x->comp);
    ir_graph_free(x->graph);
    memset(x, 0, sizeof *x);
}
