/* cpu.c - the CPU executor: runs a schedule step by step in one planned arena. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ir/groups.h"
#include "runtime/cpu/cpu.h"
#include "step/plan.h"

enum { MAX_THREADS = 64 };

/* Worker threads for this run: what the caller asked for (the num_threads
 * option), or every online CPU when that is 0. */
static int resolve_threads(int asked)
{
    if (asked >= 1) return asked > MAX_THREADS ? MAX_THREADS : asked;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 1 ? (online > MAX_THREADS ? MAX_THREADS : (int)online) : 1;
}

static bool is_leaf(const ir_node *n) { return n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state; }

/* The monotonic clock in seconds (the profile's step times). */
static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Runs one step whose stored members already have memory. */
static void run_step(cpu_exec *x, const ir_graph *g, const schedule *s, const sched_step *step, rt_tensor *values,
                     cpu_workers *w)
{
    const sched_member *members = &s->members[step->first];
    switch (step->kind) {
    /* strided operands and results (step/attn_views.h: q sliced out of a
     * fused projection and scaled, dq scaled into its transpose's order)
     * are read and stored through their strides by the chunk loop */
    case STEP_KIND_EW: cpu_run_group_ex(x, g, members, step->n, values, w, NULL, NULL); return;
    case STEP_KIND_ROW: cpu_run_row(x, g, s, step, values, w); return;
    case STEP_KIND_GEMM: cpu_run_gemm(x, g, s, step, values, w); return;
    case STEP_KIND_MULTI: cpu_run_multi(x, g, s, step, values, w); return;
    case STEP_KIND_OP:
    case STEP_KIND_COLLECTIVE: break;
    }
    if (members[0].flags & MEMBER_VIEW) return; /* its value is its operand's bytes (the plan's view_of) */
    cpu_run_op(x, g->nodes[members[0].node], values);
}

/* amp_check and amp_stats after a step: the stored values of its members that the
 * chunk loop did not see (a GEMM's product, a row op's, an op kernel's). */
static void check_step(cpu_exec *x, const ir_graph *g, const schedule *s, const sched_step *step,
                       const rt_tensor *values)
{
    for (int m = step->first; m < step->first + step->n; m++) {
        int id = s->members[m].node;
        const ir_node *n = g->nodes[id];
        if (!values[id].data || (step->kind != STEP_KIND_OP && ir_fuse_elementwise(g, n)) || !cpu_amp_checked(g, n))
            continue;
        if (step->kind == STEP_KIND_GEMM && m == step->first) continue; /* its product: cpu_run_gemm checked it */
        if (x->nonfinite)
            x->nonfinite[id] |= (uint8_t)cpu_nonfinite_bits(n->type.dtype, values[id].data, ir_numel(&n->type));
        if (x->ranges) cpu_range_add_stored(cpu_range_of(x, g, n), n->type.dtype, values[id].data, ir_numel(&n->type));
    }
}

/* Reserves in w the buffers every EW group of steps [k, nsteps) needs
 * (plan.h: the tail that writes state in place holds only elementwise
 * work), so that they run without allocating. */
static alloy_status reserve_tail(cpu_exec *x, const ir_graph *g, const schedule *s, int k, cpu_workers *w)
{
    int most = 1;
    for (int q = s->steps[k].first_part; q < s->nparts; q++)
        if (s->parts[q].kind == PART_EW && s->parts[q].n > most) most = s->parts[q].n;
    for (int j = k; j < s->nsteps; j++)
        if (s->steps[j].n > most && s->steps[j].kind == STEP_KIND_EW) most = s->steps[j].n;
    if (cpu_workers_reserve(w, most, x->nthreads))
        return cpu_fail(x, ALLOY_ERR_OOM, "out of memory reserving the buffers of the update steps of graph '%s'",
                        g->name);
    return ALLOY_OK;
}

alloy_status cpu_run_schedule(cpu_exec *x, const ir_graph *g, const schedule *s, const mem_plan *plan, char *arena,
                              rt_tensor *values, cpu_workers *w)
{
    if (plan->nnodes != g->nnodes || s->nnodes != g->nnodes)
        return cpu_fail(x, ALLOY_ERR_INVALID, "the schedule and plan are for %d and %d nodes, the graph has %d",
                        s->nnodes, plan->nnodes, g->nnodes);
    x->nthreads = resolve_threads(x->nthreads);
    x->workers = w;
    x->graph = g, x->sched = s; /* the attention ops read their strided views through them */
    x->scratch = plan->scratch_bytes ? arena + plan->scratch_offset : NULL;
    x->scratch_bytes = plan->scratch_bytes;
    int *last = al_malloc(sizeof(int) * ((size_t)g->nnodes + 1)); /* the last step reading each value */
    if (!last) return cpu_fail(x, ALLOY_ERR_OOM, "out of memory starting a run of %d nodes", g->nnodes);
    for (int i = 0; i < g->nnodes; i++) {
        const ir_node *n = g->nodes[i];
        last[i] = -1;
        values[i].type = n->type;
        if (is_leaf(n)) {
            if (!values[i].data && ir_nbytes(&n->type))
                cpu_fail(x, ALLOY_ERR_NOT_FOUND, "%s '%s' has no value", ir_ops[n->op].name, n->name ? n->name : "?");
        } else {
            values[i].data = NULL;
        }
    }
    for (int k = 0; k < s->nsteps; k++)
        for (int i = 0; i < s->steps[k].nin; i++) last[s->inputs[s->steps[k].first_in + i]] = k;
    for (int k = 0; k < s->nsteps && !x->status; k++) {
        const sched_step *step = &s->steps[k];
        for (int m = step->first; m < step->first + step->n; m++) {
            int id = s->members[m].node;
            if (!(s->members[m].flags & MEMBER_STORED)) continue;
            if (plan->state_of && plan->state_of[id] >= 0) { /* an update written in place */
                values[id].data = values[plan->state_of[id]].data;
                continue;
            }
            if (plan->offset[id] < 0) {
                char t[64];
                cpu_fail(x, ALLOY_ERR_VERIFY, "%s %s has no slot in the arena plan", ir_ops[g->nodes[id]->op].name,
                         ir_node_label(g->nodes[id], t, sizeof t));
                break;
            }
            values[id].data = arena + plan->offset[id];
        }
        /* from here on steps write state: what they need is reserved first, so
         * that a run that fails leaves the state as it was */
        if (plan->state_of && k == plan->first_write && reserve_tail(x, g, s, k, w)) break;
        x->state_of = plan->state_of && k >= plan->first_write ? plan->state_of : NULL;
        if (x->status) break;
        double t0 = x->step_us ? seconds_now() : 0;
        run_step(x, g, s, step, values, w);
        if ((x->nonfinite || x->ranges) && !x->status && step->kind != STEP_KIND_EW) check_step(x, g, s, step, values);
        if (x->step_us) x->step_us[k] = 1e6 * (seconds_now() - t0);
        /* values past their last reader are forgotten: their slots are reused */
        for (int i = 0; i < step->nin; i++) {
            int o = s->inputs[step->first_in + i];
            if (last[o] == k && !s->kept[o] && !is_leaf(g->nodes[o])) values[o].data = NULL;
        }
    }
    al_free(last);
    x->graph = NULL, x->sched = NULL;
    return x->status;
}

alloy_status cpu_run_graph(cpu_exec *x, const ir_graph *g, rt_tensor *values, const bool *keep)
{
    schedule s;
    mem_plan plan;
    char err[256];
    alloy_status st = sched_build(g, keep, &s, err, sizeof err);
    if (st) return cpu_fail(x, st, "scheduling: %s", err);
    st = plan_for_schedule(g, &s, false, &plan, err, sizeof err);
    if (st) {
        sched_free(&s);
        return cpu_fail(x, st, "planning: %s", err);
    }
    void *block = al_malloc(plan.arena_bytes + PLAN_ALIGN);
    cpu_workers *w = cpu_workers_new();
    if (!block || !w) cpu_fail(x, ALLOY_ERR_OOM, "out of memory for an arena of %zu bytes", plan.arena_bytes);
    else {
        char *arena = (char *)block + (PLAN_ALIGN - (uintptr_t)block % PLAN_ALIGN) % PLAN_ALIGN;
        cpu_run_schedule(x, g, &s, &plan, arena, values, w);
        /* kept values move out of the arena into blocks of their own */
        for (int i = 0; i < g->nnodes; i++) {
            if (is_leaf(g->nodes[i]) || !values[i].data) continue;
            void *copy = x->status ? NULL : al_malloc(ir_nbytes(&g->nodes[i]->type) + 1);
            if (copy) memcpy(copy, values[i].data, ir_nbytes(&g->nodes[i]->type));
            else if (!x->status) cpu_fail(x, ALLOY_ERR_OOM, "out of memory keeping the value of node %%%d", i);
            values[i].data = copy;
        }
    }
    cpu_workers_free(w);
    al_free(block);
    plan_free(&plan);
    sched_free(&s);
    return x->status;
}

void cpu_release_values(const ir_graph *g, rt_tensor *values)
{
    for (int i = 0; i < g->nnodes; i++) {
        if (!is_leaf(g->nodes[i])) {
            al_free(values[i].data);
            values[i].data = NULL;
        }
    }
}
