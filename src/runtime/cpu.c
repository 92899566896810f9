/* cpu.c - the CPU executor: runs a graph node by node and each fusion group as one unit, freeing values after their last use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/cpu.h"

enum { MAX_THREADS = 64 };

alloy_status cpu_fail(cpu_exec *x, alloy_status status, const char *fmt, ...)
{
    if (x->status) return x->status;
    x->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->error, sizeof x->error, fmt, ap);
    va_end(ap);
    return status;
}

/* Leaves other than constants are bound by the caller (feeds, state). */
static bool owns_value(const ir_node *n) { return n->nin > 0 || n->op == IR_OP_constant; }

/* Worker threads for this run: ALLOY_NUM_THREADS, else what the caller asked
 * for when above 1, else the online CPUs. */
static int resolve_threads(int asked)
{
    const char *env = getenv("ALLOY_NUM_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (!*end && v >= 1) return v > MAX_THREADS ? MAX_THREADS : (int)v;
    }
    if (asked > 1) return asked > MAX_THREADS ? MAX_THREADS : asked;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 1 ? (online > MAX_THREADS ? MAX_THREADS : (int)online) : 1;
}

/* The fusion groups of a run: members of group k in id order at
 * member[start[k] .. start[k + 1]); must_store[i] when node i's value is
 * needed beyond its own group's run. */
typedef struct run_groups {
    int ngroups;
    int *start;
    int *member;
    uint8_t *must_store;
} run_groups;

static void free_groups(run_groups *rg)
{
    al_free(rg->start), al_free(rg->member), al_free(rg->must_store);
}

/* Builds rg from the node->group annotations and checks that every group can
 * run at its last member: each edge that enters or leaves a group goes from
 * an earlier position to a later one. */
static alloy_status plan_groups(cpu_exec *x, const ir_graph *g, run_groups *rg)
{
    int nn = g->nnodes, ng = 0;
    for (int i = 0; i < nn; i++) {
        int k = g->nodes[i]->group;
        if (k >= nn)
            return cpu_fail(x, ALLOY_ERR_UNSUPPORTED,
                            "fusion group %d of node %%%d is not below the node count %d "
                            "(the fuse pass numbers groups densely)", k, i, nn);
        if (k >= 0 && !ir_ops[g->nodes[i]->op].elementwise)
            return cpu_fail(x, ALLOY_ERR_VERIFY, "fusion group %d: member %%%d is %s, not elementwise",
                            k, i, ir_ops[g->nodes[i]->op].name);
        if (k + 1 > ng) ng = k + 1;
    }
    rg->ngroups = ng;
    rg->start = al_calloc((size_t)ng + 2, sizeof(int));
    rg->member = al_malloc(sizeof(int) * ((size_t)nn + 1));
    rg->must_store = al_calloc((size_t)nn + 1, 1);
    if (!rg->start || !rg->member || !rg->must_store)
        return cpu_fail(x, ALLOY_ERR_OOM, "out of memory planning a run of %d nodes", nn);
    for (int i = 0; i < nn; i++)
        if (g->nodes[i]->group >= 0) rg->start[g->nodes[i]->group + 2]++;
    for (int k = 2; k < ng + 2; k++) rg->start[k] += rg->start[k - 1];
    for (int i = 0; i < nn; i++) /* ascending i: members land in id order */
        if (g->nodes[i]->group >= 0) rg->member[rg->start[g->nodes[i]->group + 1]++] = i;
    for (int i = 0; i < g->noutputs; i++) rg->must_store[g->outputs[i].node] = 1;
    for (int i = 0; i < g->nupdates; i++) rg->must_store[g->updates[i].node] = 1;
    if (g->loss >= 0) rg->must_store[g->loss] = 1;
    for (int i = 0; i < nn; i++) {
        const ir_node *n = g->nodes[i];
        int gi = n->group, pi = gi >= 0 ? rg->member[rg->start[gi + 1] - 1] : i;
        for (int j = 0; j < n->nin; j++) {
            const ir_node *o = g->nodes[n->in[j]];
            if (gi >= 0 && o->group == gi) continue;
            int po = o->group >= 0 ? rg->member[rg->start[o->group + 1] - 1] : o->id;
            if (o->group >= 0) rg->must_store[o->id] = 1;
            if (po >= pi)
                return cpu_fail(x, ALLOY_ERR_VERIFY,
                                "fusion groups cannot run at their last members: %%%d (run at %%%d) "
                                "reads %%%d (run at %%%d)", i, pi, o->id, po);
        }
    }
    return ALLOY_OK;
}

/* Runs the elementwise node i alone, or the group whose last member it is,
 * allocating the values that must be stored. */
static void run_fused(cpu_exec *x, const ir_graph *g, const run_groups *rg, int i, rt_tensor *values,
                      const bool *keep, cpu_workers *w)
{
    int k = g->nodes[i]->group;
    const int *members = k >= 0 ? &rg->member[rg->start[k]] : &i;
    int n = k >= 0 ? rg->start[k + 1] - rg->start[k] : 1;
    for (int m = 0; m < n; m++) {
        int id = members[m];
        if (n > 1 && !rg->must_store[id] && !(keep && keep[id])) continue;
        size_t bytes = ir_nbytes(&g->nodes[id]->type);
        values[id].data = al_malloc(bytes ? bytes : 1);
        if (!values[id].data) {
            char t[96];
            ir_fmt_type(t, sizeof t, &g->nodes[id]->type);
            cpu_fail(x, ALLOY_ERR_OOM, "out of memory allocating %zu bytes for %s %s", bytes,
                     ir_ops[g->nodes[id]->op].name, t);
            return;
        }
    }
    cpu_run_group(x, g, members, n, values, w);
}

/* Frees the operands of node n whose last consumer this was. */
static void release_operands(const ir_graph *g, const ir_node *n, int *uses, rt_tensor *values,
                             const bool *keep)
{
    for (int j = 0; j < n->nin; j++) {
        int id = n->in[j];
        if (--uses[id] == 0 && !(keep && keep[id]) && owns_value(g->nodes[id])) {
            al_free(values[id].data);
            values[id].data = NULL;
        }
    }
}

alloy_status cpu_run_graph(cpu_exec *x, const ir_graph *g, rt_tensor *values, const bool *keep)
{
    x->nthreads = resolve_threads(x->nthreads);
    run_groups rg = {0};
    int *uses = al_calloc((size_t)g->nnodes + 1, sizeof(int));
    if (!uses) return cpu_fail(x, ALLOY_ERR_OOM, "out of memory planning a run of %d nodes", g->nnodes);
    if (plan_groups(x, g, &rg)) {
        free_groups(&rg);
        al_free(uses);
        return x->status;
    }
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++) uses[g->nodes[i]->in[j]]++;
    cpu_workers *workers = cpu_workers_new();
    if (!workers) cpu_fail(x, ALLOY_ERR_OOM, "out of memory starting a run of %d nodes", g->nnodes);
    rt_tensor in_small[8];
    for (int i = 0; i < g->nnodes && !x->status; i++) {
        const ir_node *n = g->nodes[i];
        rt_tensor *v = &values[i];
        v->type = n->type;
        if (!owns_value(n)) {
            if (!v->data && ir_nbytes(&n->type))
                cpu_fail(x, ALLOY_ERR_NOT_FOUND, "%s '%s' has no value",
                         ir_ops[n->op].name, n->name ? n->name : "?");
            continue;
        }
        int k = n->group;
        if (k >= 0 && rg.member[rg.start[k + 1] - 1] != i) continue; /* runs with its group */
        if (k >= 0 || ir_ops[n->op].elementwise) {
            run_fused(x, g, &rg, i, values, keep, workers);
            if (k < 0) {
                release_operands(g, n, uses, values, keep);
                continue;
            }
            for (int m = rg.start[k]; m < rg.start[k + 1]; m++)
                release_operands(g, g->nodes[rg.member[m]], uses, values, keep);
            continue;
        }
        size_t bytes = ir_nbytes(&n->type);
        v->data = al_malloc(bytes ? bytes : 1);
        if (!v->data) {
            char t[96];
            ir_fmt_type(t, sizeof t, &n->type);
            cpu_fail(x, ALLOY_ERR_OOM, "out of memory allocating %zu bytes for %s %s", bytes,
                     ir_ops[n->op].name, t);
            break;
        }
        rt_tensor *in = n->nin <= 8 ? in_small : al_malloc(sizeof(rt_tensor) * (size_t)n->nin);
        if (!in) {
            cpu_fail(x, ALLOY_ERR_OOM, "out of memory running %s", ir_ops[n->op].name);
            break;
        }
        for (int j = 0; j < n->nin; j++) in[j] = values[n->in[j]];
        ir_ops[n->op].cpu(x, n, v, in);
        if (in != in_small) al_free(in);
        release_operands(g, n, uses, values, keep);
    }
    cpu_workers_free(workers);
    free_groups(&rg);
    al_free(uses);
    return x->status;
}

void cpu_release_values(const ir_graph *g, rt_tensor *values)
{
    for (int i = 0; i < g->nnodes; i++) {
        if (owns_value(g->nodes[i])) {
            al_free(values[i].data);
            values[i].data = NULL;
        }
    }
}
