/* cpu_backend.c - the CPU backend behind the backend interface: host buffers, and an executable that runs a schedule in one arena. */
#include <string.h>

#include "runtime/backend.h"
#include "runtime/cpu/cpu.h"
#include "runtime/cpu/gemm.h"
#include "runtime/profile.h"

/* The backend: the interface's fields first, then what memory() counts. */
typedef struct cpu_backend {
    rt_backend base;
    size_t in_use, peak; /* bytes of buffers and arenas */
} cpu_backend;

static void count(rt_backend *b, size_t bytes, bool add)
{
    cpu_backend *cb = (cpu_backend *)b;
    cb->in_use = add ? cb->in_use + bytes : cb->in_use - bytes;
    if (cb->in_use > cb->peak) cb->peak = cb->in_use;
}

static void memory(const rt_backend *b, size_t *in_use, size_t *peak)
{
    const cpu_backend *cb = (const cpu_backend *)b;
    *in_use = cb->in_use, *peak = cb->peak;
}

struct rt_buffer {
    size_t bytes;
    _Alignas(16) char data[]; /* al_malloc aligns to 16 */
};

/* A compiled step: the graph, schedule and plan it runs (not owned), its
 * arena, the values table and worker threads reused by every run. */
struct rt_exec {
    const ir_graph *g;
    const schedule *s;
    const mem_plan *plan;
    void *block; /* al_malloc'd; arena is it rounded up to PLAN_ALIGN */
    char *arena;
    rt_tensor *values;
    cpu_workers *workers;
    int *update_target; /* per update of g: the node id of the state leaf it replaces */
    size_t arena_bytes;  /* counted in the backend's memory while the arena is held */
    long runs;
};

static alloy_status buffer_new(rt_backend *b, size_t bytes, rt_buffer **out)
{
    *out = al_malloc(sizeof **out + (bytes ? bytes : 1));
    if (!*out) return rt_fail(b, ALLOY_ERR_OOM, "cpu: out of memory allocating a buffer of %zu bytes", bytes);
    (*out)->bytes = bytes;
    count(b, bytes, true);
    return ALLOY_OK;
}

static void buffer_free(rt_backend *b, rt_buffer *buf)
{
    if (buf) count(b, buf->bytes, false);
    al_free(buf);
}

static alloy_status upload(rt_backend *b, rt_buffer *dst, const void *src, size_t bytes)
{
    if (bytes > dst->bytes)
        return rt_fail(b, ALLOY_ERR_INVALID, "cpu: upload of %zu bytes into a buffer of %zu", bytes, dst->bytes);
    if (bytes) memcpy(dst->data, src, bytes);
    return ALLOY_OK;
}

static alloy_status download(rt_backend *b, const rt_buffer *src, void *dst, size_t bytes)
{
    if (bytes > src->bytes)
        return rt_fail(b, ALLOY_ERR_INVALID, "cpu: download of %zu bytes from a buffer of %zu", bytes, src->bytes);
    if (bytes) memcpy(dst, src->data, bytes);
    return ALLOY_OK;
}

static void exec_free(rt_backend *b, rt_exec *e)
{
    if (e) count(b, e->arena_bytes, false);
    if (!e) return;
    cpu_workers_free(e->workers);
    al_free(e->block), al_free(e->values), al_free(e->update_target);
    al_free(e);
}

static alloy_status compile(rt_backend *b, const ir_graph *g, const schedule *s, const mem_plan *p, rt_exec **out)
{
    *out = NULL;
    rt_exec *e = al_calloc(1, sizeof *e);
    if (!e) return rt_fail(b, ALLOY_ERR_OOM, "cpu: out of memory compiling graph '%s'", g->name);
    *e = (rt_exec){.g = g, .s = s, .plan = p};
    e->block = al_malloc(p->arena_bytes + PLAN_ALIGN);
    e->values = al_calloc((size_t)g->nnodes + 1, sizeof(rt_tensor));
    e->update_target = al_malloc(sizeof(int) * ((size_t)g->nupdates + 1));
    e->workers = cpu_workers_new();
    if (!e->block || !e->values || !e->update_target || !e->workers) {
        exec_free(b, e);
        return rt_fail(b, ALLOY_ERR_OOM, "cpu: out of memory for the arena of graph '%s' (%zu bytes)", g->name,
                       p->arena_bytes);
    }
    e->arena = (char *)e->block + (PLAN_ALIGN - (uintptr_t)e->block % PLAN_ALIGN) % PLAN_ALIGN;
    e->arena_bytes = p->arena_bytes;
    count(b, e->arena_bytes, true);
    for (int i = 0; i < g->nupdates; i++) e->update_target[i] = ir_find_name(g, g->updates[i].name);
    *out = e;
    return ALLOY_OK;
}

static bool is_leaf(const ir_node *n) { return n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state; }

/* The profile row of schedule step k, which took us: its members' ops as
 * its name (a GEMM step's as "gemm.MxNxK.dtype"), the bytes of its inputs
 * and stored members, 2 M N K per matmul. */
static rt_profile_row step_row(const ir_graph *g, const schedule *s, int k, double us)
{
    const sched_step *step = &s->steps[k];
    rt_profile_row r = {.action = "step", .step = k, .kind = sched_kind_name(step->kind), .us = us};
    size_t at = 0;
    for (int i = 0; i < step->nin; i++) r.bytes += (int64_t)ir_nbytes(&g->nodes[s->inputs[step->first_in + i]]->type);
    for (int m = step->first; m < step->first + step->n; m++) {
        const ir_node *n = g->nodes[s->members[m].node];
        if (s->members[m].flags & MEMBER_STORED) r.bytes += (int64_t)ir_nbytes(&n->type);
        if (n->op == IR_OP_matmul) {
            const ir_type *a = &g->nodes[n->in[0]]->type;
            int64_t K = a->dims[a->rank - (ir_attr_i(n, "transpose_a") ? 2 : 1)];
            int64_t M = n->type.dims[n->type.rank - 2], N = n->type.dims[n->type.rank - 1];
            r.flops += 2.0 * (double)ir_numel(&n->type) * (double)K;
            if (step->kind == STEP_KIND_GEMM || step->n == 1) {
                al_fmt(r.name, sizeof r.name, "gemm.%lldx%lldx%lld.%s", (long long)M, (long long)N, (long long)K,
                       alloy_dtype_name(a->dtype));
                at = sizeof r.name;
            }
        }
        if (at + 1 < sizeof r.name)
            at += (size_t)snprintf(r.name + at, sizeof r.name - at, "%s%s", at ? "+" : "", ir_ops[n->op].name);
    }
    return r;
}

/* Prints the profile of this run from its steps' wall-clock times. */
static alloy_status profile_print(rt_backend *b, const rt_exec *e, const double *step_us, FILE *out)
{
    rt_profile_row *rows = al_calloc((size_t)e->s->nsteps + 1, sizeof *rows);
    if (!rows) return rt_fail(b, ALLOY_ERR_OOM, "cpu: out of memory for the profile");
    for (int k = 0; k < e->s->nsteps; k++) rows[k] = step_row(e->g, e->s, k, step_us[k]);
    rt_profile_print(out ? out : stderr, e->g->name, "cpu", "wall clock around each step", e->runs + 1, rows,
                     e->s->nsteps);
    al_free(rows);
    return ALLOY_OK;
}

static alloy_status run(rt_backend *b, rt_exec *e, const rt_run_args *args)
{
    const ir_graph *g = e->g;
    for (int i = 0; i < g->nnodes; i++) {
        const ir_node *n = g->nodes[i];
        e->values[i].data = is_leaf(n) && args->leaf[i] ? args->leaf[i]->data : NULL;
    }
    /* leaves are read back as the step found them: before updates written in place change them */
    for (int i = 0; i < args->ndownloads; i++) {
        const rt_download *d = &args->downloads[i];
        size_t bytes = ir_nbytes(&g->nodes[d->node]->type);
        if (is_leaf(g->nodes[d->node]) && bytes && e->values[d->node].data)
            memcpy(d->dst, e->values[d->node].data, bytes);
    }
    gemm_configure(b->cfg.blas, b->cfg.num_threads);
    cpu_exec x = {.nthreads = b->cfg.num_threads, .lowp_gemm = b->cfg.lowp_gemm, .comm = args->comm,
                  .nonfinite = args->nonfinite, .ranges = args->ranges};
    if (args->nonfinite_done) *args->nonfinite_done = args->nonfinite != NULL;
    if (args->ranges_done) *args->ranges_done = args->ranges != NULL;
    bool profiling = rt_profile_due(b->cfg.profile, e->runs + 1);
    if (profiling && !(x.step_us = al_calloc((size_t)e->s->nsteps + 1, sizeof *x.step_us)))
        return rt_fail(b, ALLOY_ERR_OOM, "cpu: out of memory for the profile");
    if (cpu_run_schedule(&x, g, e->s, e->plan, e->arena, e->values, e->workers)) {
        al_free(x.step_us);
        return rt_fail(b, x.status, "%s", x.error);
    }
    if (profiling) {
        alloy_status st = profile_print(b, e, x.step_us, args->profile_to);
        al_free(x.step_us);
        if (st) return st;
    }
    for (int i = 0; i < args->ndownloads; i++) {
        const rt_download *d = &args->downloads[i];
        const ir_node *n = g->nodes[d->node];
        size_t bytes = ir_nbytes(&n->type);
        if (is_leaf(n) && e->values[d->node].data) continue; /* read back above */
        if (!e->values[d->node].data && bytes) {
            char label[64];
            return rt_fail(b, ALLOY_ERR_INVALID, "cpu: the value of %s %s is not kept by this run", ir_ops[n->op].name,
                           ir_node_label(n, label, sizeof label));
        }
        if (bytes) memcpy(d->dst, e->values[d->node].data, bytes);
    }
    for (int i = 0; i < g->nupdates; i++) {
        int t = e->update_target[i];
        size_t bytes = ir_nbytes(&g->nodes[g->updates[i].node]->type);
        if (t < 0 || !args->leaf[t]) {
            if (!bytes) continue;
            return rt_fail(b, ALLOY_ERR_NOT_FOUND, "cpu: update of '%s': no state buffer bound", g->updates[i].name);
        }
        if (e->plan->state_of && e->plan->state_of[g->updates[i].node] == t) continue; /* written in place */
        if (bytes) memcpy(args->leaf[t]->data, e->values[g->updates[i].node].data, bytes);
    }
    e->runs++;
    return ALLOY_OK;
}

static void close_backend(rt_backend *b) { al_free(b); }

static const rt_backend_ops cpu_ops_table = {
    .name = "cpu",
    .buffer_new = buffer_new,
    .buffer_free = buffer_free,
    .upload = upload,
    .download = download,
    .compile = compile,
    .run = run,
    .exec_free = exec_free,
    .exec_load = rt_exec_load_by_compiling,
    .close = close_backend,
    .memory = memory,
};

alloy_status cpu_backend_open(const al_options *cfg, rt_backend **out, char *err, size_t errlen)
{
    *out = al_calloc(1, sizeof(cpu_backend));
    if (!*out) {
        al_fmt(err, errlen, "cpu: out of memory opening the backend");
        return ALLOY_ERR_OOM;
    }
    (*out)->ops = &cpu_ops_table;
    (*out)->cfg = *cfg;
    return ALLOY_OK;
}
