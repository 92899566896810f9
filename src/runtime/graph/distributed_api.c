/* distributed_api.c - the public data-parallel call: a graph's communicator and bucket, ZeRO and timeout options. */
#include <math.h>
#include <string.h>

#include "runtime/comm/comm.h"
#include "runtime/graph/graph_impl.h"

/* DDP's default bucket: 25 MiB. */
#define DEFAULT_BUCKET_BYTES ((size_t)25 << 20)

alloy_status alloy_graph_set_data_parallel(alloy_graph *g, alloy_comm *comm, const alloy_data_parallel *opts)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!alloy_have_mpi())
        return graph_fail(g, ALLOY_ERR_UNSUPPORTED,
                          "set_data_parallel: alloy was built without MPI (install libopenmpi-dev and configure with "
                          "-Dmpi=enabled)");
    if (!comm) return graph_fail(g, ALLOY_ERR_INVALID, "set_data_parallel: comm is NULL (alloy_comm_world)");
    alloy_data_parallel o = opts ? *opts : (alloy_data_parallel){0};
    if (o.zero_stage != 0 && o.zero_stage != 1)
        return graph_fail(g, ALLOY_ERR_INVALID, "set_data_parallel: zero_stage %d is not built (0 or 1)", o.zero_stage);
    if (!(o.timeout_s >= 0) || isinf(o.timeout_s))
        return graph_fail(g, ALLOY_ERR_INVALID, "set_data_parallel: timeout_s %g must be finite and >= 0 (0: none)",
                          o.timeout_s);
    if (!o.bucket_bytes) o.bucket_bytes = DEFAULT_BUCKET_BYTES;
    comm_configure(comm, o.timeout_s, o.ordered_sum);
    g->comm = comm;
    g->dp = o;
    graph_invalidate(g);
    /* state made before this call (its later tensors are broadcast as they are made): rank 0's, on every rank */
    for (int i = 0; i < g->nstate; i++) {
        rt_state *s = &g->state[i];
        size_t bytes = ir_nbytes(&s->type);
        char err[512];
        alloy_status st = state_host(g, s);
        if (st) return st;
        void *copy = al_malloc(bytes ? bytes : 1);
        if (!copy) return graph_fail(g, ALLOY_ERR_OOM, "set_data_parallel: out of memory for state '%s'", s->name);
        if (bytes) memcpy(copy, s->cell->host, bytes);
        st = comm_broadcast(comm, copy, bytes, s->name, err, sizeof err);
        if (st) graph_fail(g, st, "set_data_parallel: state from rank 0: %s", err);
        else st = state_write(g, s, copy);
        al_free(copy);
        if (st) return st;
    }
    return ALLOY_OK;
}

/* FNV-1a of n bytes, continuing from h. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
    return h;
}

alloy_status graph_dp_check_ranks(alloy_graph *g)
{
    if (!g->comm) return ALLOY_OK;
    static const char *const parts[] = {"built graph (ops, shapes, parameters and their initializers)",
                                        "training options (AMP dtype, loss scaler, optimizer, accumulation)",
                                        "data-parallel options (bucket_bytes, zero_stage, ordered_sum)"};
    enum { NPARTS = 3 };
    uint64_t mine[NPARTS], h = 1469598103934665603ull;
    char *text = ir_print_string(g->ir);
    if (!text) return graph_fail(g, ALLOY_ERR_OOM, "out of memory printing graph '%s' to compare ranks", g->ir->name);
    mine[0] = fnv(h, text, strlen(text));
    al_free(text);
    const alloy_grad_scaler *s = &g->scaler;
    const alloy_optimizer *o = &g->optimizer;
    char opts[1024];
    al_fmt(opts, sizeof opts, "%d %d | %d %a %a %a %d %a | %d %a %a %d %a %a %a %a %d %d %d %a %a %d %a %d %d %a %a %a",
           (int)g->training, (int)g->amp.dtype, (int)s->kind, s->init_scale, s->growth_factor, s->backoff_factor,
           s->growth_interval, s->min_scale, (int)o->kind, o->lr, o->momentum, (int)o->nesterov, o->beta1, o->beta2,
           o->eps, o->weight_decay, (int)o->schedule, o->warmup_steps, o->total_steps, o->min_lr, o->clip_norm,
           o->accumulation_steps, o->gamma, o->step_size, o->nmilestones, o->pct_start, o->div_factor,
           o->final_div_factor);
    mine[1] = fnv(h, opts, strlen(opts));
    al_fmt(opts, sizeof opts, "%zu %d %d", g->dp.bucket_bytes, g->dp.zero_stage, (int)g->dp.ordered_sum);
    mine[2] = fnv(h, opts, strlen(opts));
    int n = alloy_comm_size(g->comm);
    uint64_t *all = al_malloc(sizeof(uint64_t) * NPARTS * (size_t)n);
    if (!all) return graph_fail(g, ALLOY_ERR_OOM, "out of memory comparing graph '%s' across %d ranks", g->ir->name, n);
    char err[512];
    alloy_status st = comm_all_gather_u64(g->comm, mine, NPARTS, all, g->ir->name, err, sizeof err);
    if (st) {
        al_free(all);
        return graph_fail(g, st, "comparing graph '%s' across ranks: %s", g->ir->name, err);
    }
    for (int r = 1; r < n && !st; r++)
        for (int k = 0; k < NPARTS && !st; k++)
            if (all[r * NPARTS + k] != all[k])
                st = graph_fail(g, ALLOY_ERR_INVALID,
                                "data-parallel graph '%s': rank %d's %s differ from rank 0's; every rank must build "
                                "the same training step",
                                g->ir->name, r, parts[k]);
    al_free(all);
    return st;
}

/* Whether s is ZeRO-1's shard of a tensor (each rank holds its own part). */
static bool is_shard(const alloy_graph *g, const rt_state *s)
{
    int id = g->compiled ? ir_find_name(g->compiled, s->name) : -1;
    return id >= 0 && ir_attr_find(g->compiled->nodes[id], "shard_of");
}

alloy_status alloy_graph_check_replicas(alloy_graph *g)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!g->comm) return ALLOY_OK; /* one process: one replica */
    alloy_status st = state_ensure(g);
    if (st) return st;
    int n = alloy_comm_size(g->comm), k = g->nstate;
    uint64_t *mine = al_calloc((size_t)k + 1, sizeof *mine), *all = al_calloc((size_t)k * (size_t)n + 1, sizeof *all);
    if (!mine || !all) {
        al_free(mine), al_free(all);
        return graph_fail(g, ALLOY_ERR_OOM, "check_replicas: out of memory for %d hashes", k * n);
    }
    for (int i = 0; i < k && !st; i++) {
        rt_state *s = &g->state[i];
        if (is_shard(g, s)) continue; /* 0 on every rank */
        if (!(st = state_host(g, s))) mine[i] = fnv(1469598103934665603ull, s->cell->host, ir_nbytes(&s->type));
    }
    char err[512];
    if (!st && (st = comm_all_gather_u64(g->comm, mine, k, all, "check_replicas", err, sizeof err)))
        graph_fail(g, st, "check_replicas: %s", err);
    for (int r = 1; r < n && !st; r++) {
        int first = -1, differ = 0;
        for (int i = 0; i < k; i++)
            if (all[(size_t)r * (size_t)k + (size_t)i] != all[i]) differ++, first = first < 0 ? i : first;
        if (differ)
            st = graph_fail(g, ALLOY_ERR_INVALID,
                            "check_replicas: rank %d's state differs from rank 0's: '%s' (%d of %d state tensors "
                            "differ); data-parallel ranks must hold the same state",
                            r, g->state[first].name, differ, k);
    }
    al_free(mine), al_free(all);
    return st;
}
