/* cpu.c - the CPU executor: runs a graph node by node and each fusion group as one unit, freeing values after their last use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ir/groups.h"
#include "base/convert.h"
#include "runtime/cpu/cpu.h"
#include "passes/plan.h"

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

/* Worker threads for this run: what the caller asked for (the num_threads
 * option), or every online CPU when that is 0. */
static int resolve_threads(int asked)
{
    if (asked >= 1) return asked > MAX_THREADS ? MAX_THREADS : asked;
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
        const ir_node *n = g->nodes[i];
        if (k >= 0 && !ir_fuse_elementwise(g, n) && !ir_fuse_row_op(g, n) && n->op != IR_OP_matmul &&
            n->op != IR_OP_found_inf)
            return cpu_fail(x, ALLOY_ERR_VERIFY,
                            "fusion group %d: member %%%d is %s, which no group kind takes", k, i,
                            ir_ops[n->op].name);
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

/* Members of node id's fusion group (1 when it has none). */
static int group_size(const ir_graph *g, const run_groups *rg, int id)
{
    int k = g->nodes[id]->group;
    return k >= 0 ? rg->start[k + 1] - rg->start[k] : 1;
}

/* The one rule for which values of a fusion group are stored (materialized):
 * every node outside a group of 2+, and a member of one when a node outside
 * its group reads it, it is an output, update or the loss, or keep[id]. The
 * executor and the arena plan (cpu_plan_arena) both decide by this. */
static bool member_stored(const ir_graph *g, const run_groups *rg, int id, const bool *keep)
{
    return group_size(g, rg, id) == 1 || rg->must_store[id] || (keep && keep[id]);
}

/* Where node id's value goes: its arena slot, or a fresh al_malloc block
 * when there is no arena. NULL (after recording why on x) on failure. */
static void *value_memory(cpu_exec *x, const ir_graph *g, int id, const mem_plan *plan, char *arena)
{
    const ir_node *n = g->nodes[id];
    size_t bytes = ir_nbytes(&n->type);
    void *p = NULL;
    if (arena) {
        if (plan->offset[id] >= 0) return arena + plan->offset[id];
        char t[64];
        cpu_fail(x, ALLOY_ERR_VERIFY, "%s %s has no slot in the arena plan", ir_ops[n->op].name,
                 ir_node_label(n, t, sizeof t));
        return NULL;
    }
    p = al_malloc(bytes ? bytes : 1);
    if (!p) {
        char t[96];
        ir_fmt_type(t, sizeof t, &n->type);
        cpu_fail(x, ALLOY_ERR_OOM, "out of memory allocating %zu bytes for %s %s", bytes,
                 ir_ops[n->op].name, t);
    }
    return p;
}

/* Runs the elementwise node i alone, or the group whose last member it is,
 * giving memory to the values that must be stored. */
static void run_fused(cpu_exec *x, const ir_graph *g, const run_groups *rg, int i, rt_tensor *values,
                      const bool *keep, cpu_workers *w, const mem_plan *plan, char *arena)
{
    int k = g->nodes[i]->group;
    const int *members = k >= 0 ? &rg->member[rg->start[k]] : &i;
    int n = k >= 0 ? rg->start[k + 1] - rg->start[k] : 1;
    for (int m = 0; m < n; m++) {
        int id = members[m];
        if (!member_stored(g, rg, id, keep)) continue;
        values[id].data = value_memory(x, g, id, plan, arena);
        if (!values[id].data) return;
    }
    if (k >= 0) cpu_run_kind_group(x, g, members, n, values, w);
    else cpu_run_group(x, g, members, n, values, w);
}

/* Drops the operands of node n whose last consumer this was: frees them, or
 * (from an arena) only forgets them. */
static void release_operands(const ir_graph *g, const ir_node *n, int *uses, rt_tensor *values,
                             const bool *keep, bool arena)
{
    for (int j = 0; j < n->nin; j++) {
        int id = n->in[j];
        if (--uses[id] == 0 && !(keep && keep[id]) && owns_value(g->nodes[id])) {
            if (!arena) al_free(values[id].data);
            values[id].data = NULL;
        }
    }
}

alloy_status cpu_plan_arena(cpu_exec *x, const ir_graph *g, const bool *keep, mem_plan *out)
{
    memset(out, 0, sizeof *out);
    int nn = g->nnodes;
    run_groups rg = {0};
    int *pos = al_calloc((size_t)nn + 1, sizeof(int));
    uint8_t *mat = al_calloc((size_t)nn + 1, 1), *inplace = al_calloc((size_t)nn + 1, 1);
    uint8_t *keep8 = al_calloc((size_t)nn + 1, 1);
    if (!pos || !mat || !inplace || !keep8)
        cpu_fail(x, ALLOY_ERR_OOM, "out of memory planning the arena of %d nodes", nn);
    else if (!plan_groups(x, g, &rg)) {
        for (int i = 0; i < nn; i++) {
            const ir_node *n = g->nodes[i];
            int k = n->group;
            pos[i] = k >= 0 ? rg.member[rg.start[k + 1] - 1] : i;
            bool leaf = n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state;
            mat[i] = !leaf && member_stored(g, &rg, i, keep);
            /* a group of 2+ reads its inputs while it writes its members */
            inplace[i] = ir_ops[n->op].elementwise && group_size(g, &rg, i) == 1;
            keep8[i] = keep && keep[i];
        }
        plan_schedule s = {.exec_pos = pos, .materialized = mat, .keep = keep8, .inplace_ok = inplace};
        char err[256];
        alloy_status st = plan_build(g, &s, out, err, sizeof err);
        if (st) cpu_fail(x, st, "planning the arena: %s", err);
        /* scratch for the f32 product of the largest GEMM epilogue group */
        size_t scratch = 0;
        for (int k = 0; k < rg.ngroups && !st; k++) {
            const ir_node *first = g->nodes[rg.member[rg.start[k]]];
            size_t bytes = sizeof(float) * (size_t)ir_numel(&first->type);
            if (first->op == IR_OP_matmul && bytes > scratch) scratch = bytes;
        }
        if (!st && scratch) {
            out->scratch_offset = (out->arena_bytes + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
            out->scratch_bytes = scratch;
            out->arena_bytes = out->scratch_offset + scratch;
        }
    }
    free_groups(&rg);
    al_free(pos), al_free(mat), al_free(inplace), al_free(keep8);
    return x->status;
}

alloy_status cpu_run_graph(cpu_exec *x, const ir_graph *g, rt_tensor *values, const bool *keep)
{
    return cpu_run_graph_arena(x, g, values, keep, NULL, NULL);
}

alloy_status cpu_run_graph_arena(cpu_exec *x, const ir_graph *g, rt_tensor *values, const bool *keep,
                                 const mem_plan *plan, char *arena)
{
    if (!plan) arena = NULL;
    if (arena && plan->nnodes != g->nnodes)
        return cpu_fail(x, ALLOY_ERR_INVALID, "the arena plan is for %d nodes, the graph has %d",
                        plan->nnodes, g->nnodes);
    x->nthreads = resolve_threads(x->nthreads);
    x->scratch = arena && plan->scratch_bytes ? arena + plan->scratch_offset : NULL;
    x->scratch_bytes = x->scratch ? plan->scratch_bytes : 0;
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
    bool in_arena = arena != NULL;
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
            run_fused(x, g, &rg, i, values, keep, workers, plan, arena);
            if (k < 0) {
                release_operands(g, n, uses, values, keep, in_arena);
                continue;
            }
            for (int m = rg.start[k]; m < rg.start[k + 1]; m++)
                release_operands(g, g->nodes[rg.member[m]], uses, values, keep, in_arena);
            continue;
        }
        v->data = value_memory(x, g, i, plan, arena);
        if (!v->data) break;
        rt_tensor *in = n->nin <= 8 ? in_small : al_malloc(sizeof(rt_tensor) * (size_t)n->nin);
        if (!in) {
            cpu_fail(x, ALLOY_ERR_OOM, "out of memory running %s", ir_ops[n->op].name);
            break;
        }
        for (int j = 0; j < n->nin; j++) in[j] = values[n->in[j]];
        cpu_ops[n->op].kernel(x, n, v, in);
        if (in != in_small) al_free(in);
        release_operands(g, n, uses, values, keep, in_arena);
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

void cpu_load_compute(bool wide, alloy_dtype dt, const void *src, void *dst, int64_t n)
{
    if (wide) cvt_load_f64(dt, src, dst, (size_t)n);
    else cvt_load_f32(dt, src, dst, (size_t)n);
}

void cpu_store_compute(bool wide, alloy_dtype dt, const void *src, void *dst, int64_t n)
{
    if (wide) cvt_store_f64(dt, src, dst, (size_t)n);
    else cvt_store_f32(dt, src, dst, (size_t)n);
}

void *cpu_alloc_compute(bool wide, int64_t n)
{
    return al_malloc((wide ? sizeof(double) : sizeof(float)) * (size_t)(n > 0 ? n : 1));
}

alloy_status cpu_out_of_memory(cpu_exec *x, const ir_node *n)
{
    char label[32];
    return cpu_fail(x, ALLOY_ERR_OOM, "%s '%s': out of memory", ir_ops[n->op].name,
                    ir_node_label(n, label, sizeof label));
}
