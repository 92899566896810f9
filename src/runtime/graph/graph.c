/* graph.c - the alloy_graph object: lifecycle, reading IR text, inputs and outputs (errors: graph_error.c; dumps: dump_api.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/graph/graph_impl.h"

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
    if (g->bundle_exec) bundle_cuda_free(g->bundle_exec); /* after the executable that used it */
    al_free(g->bundle_exec);
    ir_graph_free(g->ir);
    graph_options_free(g);
    for (int i = 0; i < g->ngrad_inputs; i++) al_free(g->grad_inputs[i]);
    al_free(g->grad_inputs);
    graph_batch_counts_free(g);
    for (int i = 0; i < g->ngroups; i++) al_free(g->groups[i].patterns);
    al_free(g->groups);
    al_free(g);
}

void alloy_graph_set_seed(alloy_graph *g, uint64_t seed)
{
    if (!g || g->seed == seed) return;
    g->seed = seed;
    if (g->compiled && !g->from_bundle) graph_invalidate(g); /* random ops read the seed at compile */
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
    if (!path) {
        al_fmt(err, errlen, "alloy_graph_load_ir: path is NULL");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        al_fmt(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    /* a regular file says its size; a pipe or device (/dev/zero) is read
     * only up to the limit, so no input takes more memory than that */
    struct stat sb;
    bool stat_ok = fstat(fileno(f), &sb) == 0;
    const char *why = NULL;
    char whybuf[160];
    if (stat_ok && S_ISDIR(sb.st_mode)) why = "is a directory";
    else if (stat_ok && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > ALLOY_IR_MAX_BYTES) {
        al_fmt(whybuf, sizeof whybuf, "%lld bytes, more than the %llu (%llu MiB) an IR file may have",
               (long long)sb.st_size, (unsigned long long)ALLOY_IR_MAX_BYTES,
               (unsigned long long)(ALLOY_IR_MAX_BYTES >> 20));
        why = whybuf;
    }
    if (why) {
        fclose(f);
        al_fmt(err, errlen, "%s: %s", path, why);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0, got;
    char *text = al_malloc(cap);
    while (text && len <= ALLOY_IR_MAX_BYTES && (got = fread(text + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap && len <= ALLOY_IR_MAX_BYTES) { /* at most one byte past the limit */
            size_t more = cap * 2 < ALLOY_IR_MAX_BYTES + 1 ? cap * 2 : ALLOY_IR_MAX_BYTES + 1;
            char *bigger = al_realloc(text, more);
            if (!bigger) {
                al_free(text);
                text = NULL;
                break;
            }
            text = bigger;
            cap = more;
        }
    }
    bool bad = ferror(f);
    int read_errno = errno;
    fclose(f);
    if (!text || bad || len > ALLOY_IR_MAX_BYTES) {
        al_free(text);
        if (len > ALLOY_IR_MAX_BYTES)
            al_fmt(err, errlen, "%s: more than the %llu bytes (%llu MiB) an IR file may have", path,
                   (unsigned long long)ALLOY_IR_MAX_BYTES, (unsigned long long)(ALLOY_IR_MAX_BYTES >> 20));
        else if (bad) al_fmt(err, errlen, "%s: cannot read: %s", path, strerror(read_errno ? read_errno : EIO));
        else al_fmt(err, errlen, "%s: out of memory reading it", path);
        return NULL;
    }
    alloy_graph *g = alloy_graph_parse(text, len, path, err, errlen);
    al_free(text);
    return g;
}

int alloy_graph_output_count(const alloy_graph *g) { return g ? g->ir->noutputs : 0; }

const char *alloy_graph_output_name(const alloy_graph *g, int i)
{
    if (!g) return NULL;
    if (i < 0 || i >= g->ir->noutputs) {
        graph_fail_const(g, ALLOY_ERR_NOT_FOUND, "output_name: index %d out of range [0, %d)", i, g->ir->noutputs);
        return NULL;
    }
    return g->ir->outputs[i].name;
}

int alloy_graph_input_count(const alloy_graph *g)
{
    int n = 0;
    for (int i = 0; g && i < g->ir->nnodes; i++) n += g->ir->nodes[i]->op == IR_OP_input;
    return n;
}

alloy_status alloy_graph_input_at(const alloy_graph *g, int i, alloy_host_tensor *out)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!out) return graph_fail_const(g, ALLOY_ERR_INVALID, "input_at: out is NULL");
    int asked = i;
    for (int k = 0; k < g->ir->nnodes; k++) {
        const ir_node *n = g->ir->nodes[k];
        if (n->op != IR_OP_input || i--) continue;
        *out = (alloy_host_tensor){.name = n->name, .dtype = n->type.dtype, .rank = n->type.rank};
        memcpy(out->dims, n->type.dims, sizeof out->dims);
        return ALLOY_OK;
    }
    return graph_fail_const(g, ALLOY_ERR_NOT_FOUND, "input_at: index %d out of range [0, %d)", asked,
                            alloy_graph_input_count(g));
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
    if (!g) return ALLOY_ERR_INVALID;
    if (!out) return graph_fail(g, ALLOY_ERR_INVALID, "memory_info: out is NULL");
    if (g->ir->status) return graph_built(g);
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

alloy_status alloy_graph_device_memory(alloy_graph *g, alloy_device_memory *out)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!out) return graph_fail(g, ALLOY_ERR_INVALID, "device_memory: out is NULL");
    if (g->ir->status) return graph_built(g);
    alloy_status st = graph_compile(g);
    if (st) return st;
    rt_backend *b = graph_backend(g);
    if (!b || !b->ops->memory)
        return graph_fail(g, ALLOY_ERR_UNSUPPORTED, "device_memory: the %s backend does not count its memory",
                          b ? b->ops->name : "(none)");
    b->ops->memory(b, &out->in_use_bytes, &out->peak_bytes);
    return ALLOY_OK;
}
