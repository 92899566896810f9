/* graph.c - the alloy_graph object: lifecycle, errors, reading IR text, dumps, inputs and outputs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/inspect.h"
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

void alloy_graph_free(alloy_graph *g)
{
    if (!g) return;
    graph_invalidate(g);
    state_free_all(g);
    graph_release_device(g);
    ir_graph_free(g->ir);
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

alloy_status alloy_graph_dump(alloy_graph *g, FILE *out, alloy_dump_kind kind)
{
    if (!g || !out) return ALLOY_ERR_INVALID;
    if (kind < ALLOY_DUMP_SOURCE || kind > ALLOY_DUMP_MEMORY_SVG)
        return graph_fail(g, ALLOY_ERR_INVALID, "dump: unknown kind %d (ALLOY_DUMP_SOURCE, _IR, _DOT or _MEMORY_SVG)",
                          (int)kind);
    if (kind == ALLOY_DUMP_SOURCE) {
        ir_print(g->ir, out);
        return ALLOY_OK;
    }
    if (g->ir->status) return g->ir->status;
    alloy_status st = graph_compile(g);
    if (st) return st;
    char err[256] = "";
    if (kind == ALLOY_DUMP_IR) ir_print(g->compiled, out);
    else if (kind == ALLOY_DUMP_DOT) st = insp_dot(g->compiled, &g->comp.sched, out, err, sizeof err);
    else st = insp_memory_svg(g->compiled, &g->comp.sched, &g->comp.plan, out, err, sizeof err);
    return st ? graph_fail(g, st, "dump: %s", err) : ALLOY_OK;
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

alloy_status alloy_graph_memory_info(alloy_graph *g, alloy_memory_info *out)
{
    if (!g || !out) return ALLOY_ERR_INVALID;
    if (g->ir->status) return g->ir->status;
    alloy_status st = graph_compile(g);
    if (st) return st;
    const mem_plan *p = &g->comp.plan;
    *out = (alloy_memory_info){.arena_bytes = p->arena_bytes, .peak_live_bytes = p->peak_live_bytes,
                               .scratch_bytes = p->scratch_bytes, .inplace = p->inplace, .steps = g->comp.sched.nsteps};
    for (int i = 0; i < g->compiled->nnodes; i++) {
        const ir_node *n = g->compiled->nodes[i];
        if (n->op == IR_OP_param || n->op == IR_OP_state) out->state_bytes += ir_nbytes(&n->type);
    }
    return ALLOY_OK;
}
