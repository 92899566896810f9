/* state.c - state tensors: creation and seeded initialization, get/set, safetensors save and load. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/safetensors.h"
#include "base/convert.h"
#include "base/name_index.h"
#include "runtime/comm/comm.h"
#include "runtime/io/checksum.h"
#include "runtime/io/safetensors_memory.h"
#include "runtime/graph/graph_impl.h"

/* splitmix64: a small, well-mixed generator; one stream per (seed, name). */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double next_unit(uint64_t *s) /* uniform in (0, 1) */
{
    return ((double)(next_u64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static uint64_t stream_seed(uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603ull ^ seed;
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    next_u64(&h);
    return h;
}

/* Marks in conv_weight[] every param or state that a convolution reads as
 * its weight (conv1d/conv2d/conv_grad_input operand 1, through casts: under
 * AMP the conv reads cast<f16>(w)): its layout is [out, in / groups, k..],
 * not a linear weight's [in, out]. */
static void find_conv_weights(const ir_graph *ir, uint8_t *conv_weight)
{
    for (int i = 0; i < ir->nnodes; i++) {
        const ir_node *n = ir->nodes[i];
        if (n->op != IR_OP_conv1d && n->op != IR_OP_conv2d && n->op != IR_OP_conv_grad_input) continue;
        const ir_node *w = ir->nodes[n->in[1]];
        while (w->op == IR_OP_cast) w = ir->nodes[w->in[0]];
        if (w->op == IR_OP_param || w->op == IR_OP_state) conv_weight[w->id] = 1;
    }
}

/* Fills v[0..n) with the param's initial values in f64. Fans as PyTorch's
 * _calculate_fan_in_and_fan_out: a convolution's weight [out, in / groups,
 * k..] has fan_in = in / groups * prod(k), fan_out = out * prod(k); any
 * other tensor is an [.., in, out] linear weight (a vector: its length). */
static void init_values(const ir_node *n, bool conv_weight, uint64_t seed, double *v, int64_t count)
{
    const char *kind = ir_attr_str(n, "init", "zeros");
    const ir_type *t = &n->type;
    double fan_in = t->rank >= 2 ? (double)t->dims[t->rank - 2] : t->rank == 1 ? (double)t->dims[0] : 1;
    double fan_out = t->rank >= 1 ? (double)t->dims[t->rank - 1] : 1;
    if (conv_weight && t->rank >= 3) {
        double field = 1; /* the kernel's taps */
        for (int d = 2; d < t->rank; d++) field *= (double)t->dims[d];
        fan_in = (double)t->dims[1] * field, fan_out = (double)t->dims[0] * field;
    }
    double gain = ir_attr_float(n, "gain", 1.0);
    double mean = ir_attr_float(n, "mean", 0.0), std = ir_attr_float(n, "std", 1.0);
    double low = ir_attr_float(n, "low", 0.0), high = ir_attr_float(n, "high", 1.0);
    bool normal = false;
    switch ((ir_init)ir_init_lookup(kind)) { /* the type rule let only known inits through */
    case IR_INIT_ZEROS:
    case IR_INIT_ONES:
    case IR_INIT_CONSTANT: {
        double c = kind[0] == 'z' ? 0.0 : kind[0] == 'o' ? 1.0 : ir_attr_float(n, "value", 0.0);
        for (int64_t i = 0; i < count; i++) v[i] = c;
        return;
    }
    case IR_INIT_NORMAL: normal = true; break;
    case IR_INIT_UNIFORM: break;
    case IR_INIT_KAIMING_UNIFORM: high = gain * sqrt(3.0 / fan_in), low = -high; break;
    case IR_INIT_KAIMING_NORMAL: normal = true, mean = 0, std = gain / sqrt(fan_in); break;
    case IR_INIT_XAVIER_UNIFORM: high = gain * sqrt(6.0 / (fan_in + fan_out)), low = -high; break;
    case IR_INIT_XAVIER_NORMAL: normal = true, mean = 0, std = gain * sqrt(2.0 / (fan_in + fan_out)); break;
    case IR_INIT_COUNT: break;
    }
    uint64_t s = stream_seed(seed, n->name);
    for (int64_t i = 0; i < count; i++) {
        if (normal) { /* Box-Muller, one value per pair of draws */
            double u1 = next_unit(&s), u2 = next_unit(&s);
            v[i] = mean + std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        } else {
            v[i] = low + (high - low) * next_unit(&s);
        }
    }
}

const char *state_index_name(const void *g, int i) { return ((const alloy_graph *)g)->state[i].name; }

rt_state *state_find(alloy_graph *g, const char *name)
{
    int i = al_index_find(g->state_slots, g->state_slot_cap, state_index_name, g, name);
    return i < 0 ? NULL : &g->state[i];
}

/* Uploads data (s's bytes) into s's buffer, which it creates when missing;
 * the host copy is not touched. */
static alloy_status upload_bytes(alloy_graph *g, rt_state *s, const void *data)
{
    rt_backend *b = graph_backend(g);
    state_cell *c = s->cell;
    size_t bytes = ir_nbytes(&s->type);
    if (!c->buf && b->ops->buffer_new(b, bytes, &c->buf)) return graph_fail(g, ALLOY_ERR_OOM, "state '%s': %s", s->name, b->error);
    if (bytes && b->ops->upload(b, c->buf, data, bytes)) return graph_fail(g, ALLOY_ERR_INVALID, "state '%s': %s", s->name, b->error);
    return ALLOY_OK;
}

/* Uploads the host copy into its buffer (which it creates when missing). */
static alloy_status state_upload(alloy_graph *g, rt_state *s)
{
    alloy_status st = upload_bytes(g, s, s->cell->host);
    if (!st) s->cell->host_stale = false;
    return st;
}

alloy_status state_host(alloy_graph *g, rt_state *s)
{
    state_cell *c = s->cell;
    if (!c->host_stale) return ALLOY_OK;
    rt_backend *b = graph_backend(g);
    if (b->ops->download(b, c->buf, c->host, ir_nbytes(&s->type)))
        return graph_fail(g, ALLOY_ERR_INVALID, "state '%s': %s", s->name, b->error);
    c->host_stale = false;
    return ALLOY_OK;
}

alloy_status state_write(alloy_graph *g, rt_state *s, const void *data)
{
    alloy_status st = upload_bytes(g, s, data); /* the host copy changes only after the buffer did */
    if (st) return st;
    if (ir_nbytes(&s->type)) memcpy(s->cell->host, data, ir_nbytes(&s->type));
    s->cell->host_stale = false;
    return ALLOY_OK;
}

/* ZeRO-1: s holds a whole tensor (a single process's moment, made before
 * the data-parallel compile or loaded) where the compiled step keeps this
 * rank's shard of type t: s becomes that shard (elements [r k, (r+1) k) of
 * its values flattened, zeros past the end; passes/data_parallel.c). Any
 * other change of type is an error naming the state. */
static alloy_status state_reshard(alloy_graph *g, rt_state *s, const ir_type *t)
{
    int world = g->comm ? alloy_comm_size(g->comm) : 0, rank = g->comm ? alloy_comm_rank(g->comm) : 0;
    int64_t m = ir_numel(&s->type), k = world ? (m + world - 1) / world : -1;
    if (!world || g->dp.zero_stage != 1 || t->rank != 1 || t->dtype != s->type.dtype || t->dims[0] != k) {
        char have[96], want[96];
        ir_fmt_type(have, sizeof have, &s->type), ir_fmt_type(want, sizeof want, t);
        return graph_fail(g, ALLOY_ERR_SHAPE, "state '%s' is %s but the compiled step keeps %s", s->name, have, want);
    }
    if (s->cell->refs > 1) /* another graph reads the whole tensor (alloy_graph_share_state) */
        return graph_fail(g, ALLOY_ERR_INVALID, "state '%s' is shared with another graph: ZeRO-1 cannot keep only its shard",
                          s->name);
    alloy_status st = state_host(g, s);
    if (st) return st;
    size_t es = alloy_dtype_size(t->dtype), bytes = (size_t)k * es;
    uint8_t *host = al_calloc(bytes ? bytes : 1, 1);
    if (!host) return graph_fail(g, ALLOY_ERR_OOM, "out of memory taking the shard of state '%s'", s->name);
    int64_t from = rank * k, n = from >= m ? 0 : (m - from < k ? m - from : k);
    if (n > 0) memcpy(host, (const uint8_t *)s->cell->host + (size_t)from * es, (size_t)n * es);
    state_cell *c = s->cell;
    if (c->buf) graph_backend(g)->ops->buffer_free(graph_backend(g), c->buf), c->buf = NULL;
    al_free(c->host);
    c->host = host;
    s->type = *t;
    return state_upload(g, s);
}

/* Creates (or re-uploads) the state of every param and state node of ir. */
static alloy_status state_create(alloy_graph *g, const ir_graph *ir, const uint8_t *conv_weight)
{
    alloy_status st;
    for (int i = 0; i < ir->nnodes; i++) {
        const ir_node *n = ir->nodes[i];
        if (n->op != IR_OP_param && n->op != IR_OP_state) continue;
        rt_state *have = state_find(g, n->name);
        if (have && !have->cell->buf && (st = state_upload(g, have))) return st; /* an earlier call ran out of memory */
        if (have && !ir_type_eq(&have->type, &n->type) && (st = state_reshard(g, have, &n->type))) return st;
        if (have) continue;
        if (g->nstate == g->state_cap) {
            int cap = g->state_cap ? g->state_cap * 2 : 16;
            rt_state *s = al_realloc(g->state, sizeof *s * (size_t)cap);
            if (!s) return graph_fail(g, ALLOY_ERR_OOM, "out of memory creating state '%s'", n->name);
            g->state = s;
            g->state_cap = cap;
        }
        int64_t count = ir_numel(&n->type);
        size_t bytes = ir_nbytes(&n->type);
        rt_state s = {.name = al_strdup(n->name), .type = n->type, .cell = al_calloc(1, sizeof(state_cell))};
        void *host = al_malloc(bytes ? bytes : 1);
        double *tmp = al_malloc(sizeof(double) * (size_t)(count ? count : 1));
        g->state[g->nstate] = s; /* where the index reads its name */
        if (!s.name || !s.cell || !host || !tmp ||
            !al_index_add(&g->state_slots, &g->state_slot_cap, g->nstate, state_index_name, g, g->nstate)) {
            al_free(s.name);
            al_free(s.cell);
            al_free(host);
            al_free(tmp);
            return graph_fail(g, ALLOY_ERR_OOM, "out of memory creating state '%s' (%zu bytes)",
                              n->name, bytes);
        }
        *s.cell = (state_cell){.refs = 1, .host = host};
        init_values(n, conv_weight[i], g->seed, tmp, count);
        cvt_store_f64(n->type.dtype, tmp, host, (size_t)count);
        al_free(tmp);
        g->state[g->nstate++] = s;
        if (g->comm) { /* data-parallel: every rank starts from rank 0's values (docs/distributed.md) */
            char err[512];
            if ((st = comm_broadcast(g->comm, host, bytes, n->name, err, sizeof err)))
                return graph_fail(g, st, "initial state from rank 0: %s", err);
        }
        st = state_upload(g, &g->state[g->nstate - 1]);
        if (st) return st;
    }
    return ALLOY_OK;
}

alloy_status state_ensure(alloy_graph *g)
{
    if (g->state_ready) return ALLOY_OK;
    if (g->ir->status) return graph_built(g);
    alloy_status st = graph_compile(g);
    if (st) return st;
    const ir_graph *ir = g->compiled;
    uint8_t *conv_weight = al_calloc((size_t)ir->nnodes + 1, 1);
    if (!conv_weight) return graph_fail(g, ALLOY_ERR_OOM, "out of memory initializing state (%d nodes)", ir->nnodes);
    find_conv_weights(ir, conv_weight);
    st = state_create(g, ir, conv_weight);
    al_free(conv_weight);
    if (!st) g->state_ready = true;
    return st;
}

alloy_status state_move(alloy_graph *g, rt_backend *to)
{
    for (int i = 0; i < g->nstate; i++) {
        alloy_status st = state_host(g, &g->state[i]);
        if (st) return st;
    }
    rt_backend *from = graph_backend(g);
    rt_buffer **bufs = al_calloc((size_t)g->nstate + 1, sizeof *bufs);
    if (!bufs) return graph_fail(g, ALLOY_ERR_OOM, "out of memory moving state to the %s backend", to->ops->name);
    alloy_status st = ALLOY_OK;
    for (int i = 0; i < g->nstate && !st; i++) {
        rt_state *s = &g->state[i];
        size_t bytes = ir_nbytes(&s->type);
        if (to->ops->buffer_new(to, bytes, &bufs[i]) || to->ops->upload(to, bufs[i], s->cell->host, bytes))
            st = graph_fail(g, ALLOY_ERR_OOM, "moving state '%s' to the %s backend: %s", s->name, to->ops->name, to->error);
    }
    for (int i = 0; i < g->nstate; i++) { /* all moved, or none: the old buffers stay on failure */
        state_cell *c = g->state[i].cell;
        rt_backend *owner = st ? to : from;
        rt_buffer *drop = st ? bufs[i] : c->buf;
        if (drop) owner->ops->buffer_free(owner, drop);
        if (!st) c->buf = bufs[i];
    }
    al_free(bufs);
    return st;
}

void state_cell_release(alloy_graph *g, state_cell *c)
{
    if (!c || --c->refs > 0) return;
    if (c->buf) graph_backend(g)->ops->buffer_free(graph_backend(g), c->buf);
    al_free(c->host);
    al_free(c);
}

void state_free_all(alloy_graph *g)
{
    for (int i = 0; i < g->nstate; i++) {
        al_free(g->state[i].name);
        state_cell_release(g, g->state[i].cell);
    }
    al_free(g->state);
    al_free(g->state_slots);
    g->state = NULL;
    g->state_slots = NULL;
    g->nstate = g->state_cap = g->state_slot_cap = 0;
}

/* s as a host tensor, its host copy brought up to date. */
static alloy_status describe_state(alloy_graph *g, rt_state *s, alloy_host_tensor *out)
{
    out->name = s->name;
    out->dtype = s->type.dtype;
    out->rank = s->type.rank;
    memcpy(out->dims, s->type.dims, sizeof out->dims);
    out->data = s->cell->host;
    return state_host(g, s);
}

int alloy_graph_state_count(alloy_graph *g)
{
    if (!g || state_ensure(g)) return 0;
    return g->nstate;
}

alloy_status alloy_graph_state_at(alloy_graph *g, int i, alloy_host_tensor *out)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!out) return graph_fail(g, ALLOY_ERR_INVALID, "state_at: out is NULL");
    alloy_status st = state_ensure(g);
    if (st) return st;
    if (i < 0 || i >= g->nstate)
        return graph_fail(g, ALLOY_ERR_NOT_FOUND, "state index %d out of range [0, %d)", i, g->nstate);
    return describe_state(g, &g->state[i], out);
}

alloy_status alloy_graph_get_state(alloy_graph *g, const char *name, alloy_host_tensor *out)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!name || !out) return graph_fail(g, ALLOY_ERR_INVALID, "get_state: %s is NULL", name ? "out" : "name");
    alloy_status st = state_ensure(g);
    if (st) return st;
    rt_state *s = state_find(g, name);
    if (!s) return graph_fail(g, ALLOY_ERR_NOT_FOUND, "no state tensor named '%s'", name);
    return describe_state(g, s, out);
}

/* Checks that src may replace s (same dtype and shape); names both on error. */
static alloy_status check_match(alloy_graph *g, const rt_state *s, const alloy_host_tensor *src,
                                const char *where)
{
    ir_type given = {.dtype = src->dtype, .rank = src->rank};
    if (src->rank < 0 || src->rank > ALLOY_MAX_RANK)
        return graph_fail(g, ALLOY_ERR_SHAPE, "%s'%s': rank %d out of range", where, s->name, src->rank);
    memcpy(given.dims, src->dims, sizeof(int64_t) * (size_t)src->rank);
    if (!ir_type_eq(&s->type, &given)) {
        char want[96], got[96];
        ir_fmt_type(want, sizeof want, &s->type);
        ir_fmt_type(got, sizeof got, &given);
        return graph_fail(g, src->dtype != s->type.dtype ? ALLOY_ERR_DTYPE : ALLOY_ERR_SHAPE,
                          "%sstate '%s' is %s, given %s", where, s->name, want, got);
    }
    return ALLOY_OK;
}

alloy_status alloy_graph_set_state(alloy_graph *g, const alloy_host_tensor *src)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!src || !src->name) return graph_fail(g, ALLOY_ERR_INVALID, "set_state: %s is NULL", src ? "src->name" : "src");
    alloy_status st = state_ensure(g);
    if (st) return st;
    rt_state *s = state_find(g, src->name);
    if (!s) return graph_fail(g, ALLOY_ERR_NOT_FOUND, "no state tensor named '%s'", src->name);
    if ((st = check_match(g, s, src, ""))) return st;
    if (!src->data && ir_nbytes(&s->type))
        return graph_fail(g, ALLOY_ERR_INVALID, "set_state '%s': data is NULL", s->name);
    if ((st = state_check_value(g, s, src->data, "set_state: "))) return st;
    return state_write(g, s, src->data);
}

bool state_is_param(const alloy_graph *g, const rt_state *s)
{
    int id = ir_find_name(g->ir, s->name);
    return id >= 0 && g->ir->nodes[id]->op == IR_OP_param;
}

/* Whether s is part of the model as built: a param or state the model made
 * (batch_norm's running statistics), not state the passes add (moments,
 * counters, the loss scale). Params files hold these. */
static bool state_is_model(const alloy_graph *g, const rt_state *s)
{
    int id = ir_find_name(g->ir, s->name);
    return id >= 0 && (g->ir->nodes[id]->op == IR_OP_param || g->ir->nodes[id]->op == IR_OP_state);
}

/* The dims of the tensor s is ZeRO-1's shard of (the compiled state's
 * shard_of, *rank set), or NULL for a whole tensor. */
static const int64_t *shard_of(const alloy_graph *g, const rt_state *s, int *rank)
{
    *rank = 0;
    if (!g->compiled || !g->comm) return NULL;
    int id = ir_find_name(g->compiled, s->name);
    const ir_node *n = id >= 0 ? g->compiled->nodes[id] : NULL;
    return n && n->op == IR_OP_state && ir_attr_find(n, "shard_of") ? ir_attr_ints(n, "shard_of", rank) : NULL;
}

/* t (describing a ZeRO-1 shard s of a tensor of dims[0..rank)) made whole:
 * every rank's shard all-gathered into *buf (freed by the caller), t's
 * type the whole one. A collective: every rank makes it. */
static alloy_status gather_shard(alloy_graph *g, const rt_state *s, const int64_t *dims, int rank,
                                 alloy_host_tensor *t, void **buf)
{
    int world = alloy_comm_size(g->comm);
    int64_t k = ir_numel(&s->type);
    size_t es = alloy_dtype_size(s->type.dtype);
    *buf = al_malloc((size_t)k * es * (size_t)world + 1);
    if (!*buf) return graph_fail(g, ALLOY_ERR_OOM, "out of memory gathering the shards of state '%s'", s->name);
    char what[300], err[512];
    al_fmt(what, sizeof what, "gathering the shards of state '%s'", s->name);
    alloy_status st = comm_all_gather(g->comm, t->data, *buf, k, s->type.dtype, world, what, err, sizeof err);
    if (st) return graph_fail(g, st, "%s", err);
    t->rank = rank;
    memcpy(t->dims, dims, sizeof(int64_t) * (size_t)rank);
    t->data = *buf;
    return ALLOY_OK;
}

/* Writes g's state (params_only: the model's, params and running
 * statistics, with each batch_norm's num_batches_tracked as PyTorch names
 * it) to path with alloy's checksum. */
static alloy_status save_tensors(alloy_graph *g, const char *path, bool params_only, const char *call)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!path) return graph_fail(g, ALLOY_ERR_INVALID, "%s: path is NULL", call);
    if (!*path) return graph_fail(g, ALLOY_ERR_INVALID, "%s: the path is empty: name the file to write", call);
    alloy_status st = state_ensure(g);
    if (st) return st;
    int ncounts = params_only ? graph_batch_counts(g, NULL, 0) : 0;
    size_t nmax = (size_t)g->nstate + (size_t)ncounts + 1;
    alloy_host_tensor *ts = al_calloc(nmax, sizeof *ts);
    const alloy_host_tensor **order = al_calloc(nmax, sizeof *order);
    char (*count_names)[BATCH_COUNT_NAME] = al_calloc((size_t)ncounts + 1, sizeof *count_names);
    int64_t *counts = al_calloc((size_t)ncounts + 1, sizeof *counts);
    if (!ts || !order || !count_names || !counts) {
        al_free(ts);
        al_free(order);
        al_free(count_names);
        al_free(counts);
        return graph_fail(g, ALLOY_ERR_OOM, "out of memory saving state to %s", path);
    }
    int n = 0, whole_rank;
    void **gathered = al_calloc(nmax, sizeof *gathered);
    if (!gathered) st = graph_fail(g, ALLOY_ERR_OOM, "out of memory saving state to %s", path);
    bool zero = false; /* ZeRO-1: the shards gathered (on every rank), rank 0 writes */
    for (int i = 0; i < g->nstate && !st; i++) {
        if (params_only && !state_is_model(g, &g->state[i])) continue;
        st = describe_state(g, &g->state[i], &ts[n]);
        const int64_t *whole = st ? NULL : shard_of(g, &g->state[i], &whole_rank);
        if (whole) st = gather_shard(g, &g->state[i], whole, whole_rank, &ts[n], &gathered[n]), zero = true;
        order[n] = &ts[n];
        n++;
    }
    graph_batch_counts(g, count_names, ncounts);
    for (int i = 0; i < ncounts; i++) {
        const int64_t *kept = graph_batch_count(g, count_names[i], false);
        counts[i] = kept ? *kept : 0;
        ts[n] = (alloy_host_tensor){.name = count_names[i], .dtype = ALLOY_I64, .rank = 0, .data = &counts[i]};
        order[n] = &ts[n];
        n++;
    }
    char sum[IO_CHECKSUM_LEN] = "";
    if (!st && io_tensors_checksum(order, n, sum)) st = graph_fail(g, ALLOY_ERR_OOM, "out of memory saving state to %s", path);
    al_free(order);
    if (!st && !(zero && alloy_comm_rank(g->comm) != 0)) {
        const char *keys[] = {"format", "graph", IO_CHECKSUM_KEY};
        const char *vals[] = {params_only ? "alloy-params-1" : "alloy-state-1", g->ir->name, sum};
        char err[512] = "";
        st = alloy_safetensors_save(path, ts, n, keys, vals, 3, err, sizeof err);
        if (st) graph_fail(g, st, "%s", err);
    }
    for (int i = 0; gathered && i < n; i++) al_free(gathered[i]);
    al_free(gathered);
    al_free(ts);
    al_free(count_names);
    al_free(counts);
    return st;
}

alloy_status alloy_graph_save_state(alloy_graph *g, const char *path) { return save_tensors(g, path, false, "save_state"); }

alloy_status alloy_graph_save_params(alloy_graph *g, const char *path) { return save_tensors(g, path, true, "save_params"); }

/* When file carries alloy's checksum, checks that its tensors have it
 * (a file without one, e.g. from PyTorch, passes). */
static alloy_status check_checksum(alloy_graph *g, const alloy_safetensors *file, const char *path)
{
    const char *want = alloy_safetensors_metadata(file, IO_CHECKSUM_KEY);
    if (!want) return ALLOY_OK;
    int n = alloy_safetensors_count(file);
    const alloy_host_tensor **ts = al_calloc((size_t)n + 1, sizeof *ts);
    char got[IO_CHECKSUM_LEN] = "";
    for (int i = 0; ts && i < n; i++) ts[i] = alloy_safetensors_get(file, i);
    alloy_status st = ts ? io_tensors_checksum(ts, n, got) : ALLOY_ERR_OOM;
    al_free(ts);
    if (st) return graph_fail(g, st, "%s: out of memory checking the checksum", path);
    if (strcmp(got, want) != 0)
        return graph_fail(g, ALLOY_ERR_FORMAT,
                          "%s: checksum mismatch: the tensors give %s, the file's metadata \"" IO_CHECKSUM_KEY
                          "\" says %.40s; the file is damaged (or was changed without updating its checksum)",
                          path, got, want);
    return ALLOY_OK;
}

/* Loads path into g's state, all or nothing. Every state tensor must be in
 * the file (but optim.lr, which older checkpoints lack) and every file
 * tensor must name one; params_only: only the model's state (params and
 * running statistics), each the file has (the others untouched), and file
 * tensors naming none are counted in *ignored, not refused. Either way a
 * batch_norm's num_batches_tracked (an i64 scalar) is kept for
 * save_params, neither loaded nor ignored. */
static alloy_status load_from(alloy_graph *g, alloy_safetensors *file, const char *path, bool params_only, int *loaded,
                              int *ignored, const char *call);

static alloy_status load_tensors(alloy_graph *g, const char *path, bool params_only, int *loaded, int *ignored,
                                 const char *call)
{
    if (loaded) *loaded = 0;
    if (ignored) *ignored = 0;
    if (!g) return ALLOY_ERR_INVALID;
    if (!path) return graph_fail(g, ALLOY_ERR_INVALID, "%s: path is NULL", call);
    if (!*path) return graph_fail(g, ALLOY_ERR_INVALID, "%s: the path is empty: name the file to read", call);
    alloy_status st = state_ensure(g);
    if (st) return st;
    char err[512] = "";
    alloy_safetensors *file = NULL;
    st = alloy_safetensors_load(path, &file, err, sizeof err);
    if (st) return graph_fail(g, st, "%s", err);
    return load_from(g, file, path, params_only, loaded, ignored, call);
}

alloy_status graph_load_state_memory(alloy_graph *g, const void *bytes, size_t len, const char *where)
{
    alloy_status st = state_ensure(g);
    if (st) return st;
    char err[768] = "";
    alloy_safetensors *file = NULL;
    st = io_safetensors_load_memory(bytes, len, where, &file, err, sizeof err);
    if (st) return graph_fail(g, st, "%s", err);
    return load_from(g, file, where, false, NULL, NULL, "load_state");
}

/* Whether name is gradient accumulation's state (a gradient's sum, the
 * micro-batch counter, the inf seen): at a step's boundary it is zeros, so
 * a graph that accumulates another number of micro-batches (or none)
 * starts from a checkpoint without it, or ignores it in one. */
static bool is_accumulation_state(const char *name)
{
    size_t n = strlen(name), k = strlen(SUFFIX_GRAD_ACC);
    return strcmp(name, STATE_MICRO) == 0 || strcmp(name, STATE_FOUND_ACC) == 0 ||
           (n > k && strcmp(name + n - k, SUFFIX_GRAD_ACC) == 0);
}

/* Whether t's bytes are all zero. */
static bool all_zero(const alloy_host_tensor *t)
{
    size_t bytes = (size_t)alloy_host_tensor_numel(t) * alloy_dtype_size(t->dtype);
    for (size_t i = 0; t->data && i < bytes; i++)
        if (((const uint8_t *)t->data)[i]) return false;
    return true;
}

/* ZeRO-1: when s is a shard and src the whole tensor (the layout every
 * checkpoint has), *out becomes this rank's part of src (data allocated
 * here, zeros past src's end); else *out is left empty (data NULL). */
static alloy_status shard_from(alloy_graph *g, const rt_state *s, const alloy_host_tensor *src, alloy_host_tensor *out)
{
    int rank;
    const int64_t *whole = shard_of(g, s, &rank);
    if (!whole || src->rank != rank || src->dtype != s->type.dtype ||
        memcmp(src->dims, whole, sizeof(int64_t) * (size_t)rank) != 0)
        return ALLOY_OK; /* check_match names any mismatch */
    int64_t m = alloy_host_tensor_numel(src), k = ir_numel(&s->type), from = alloy_comm_rank(g->comm) * k;
    int64_t n = from >= m ? 0 : (m - from < k ? m - from : k);
    size_t es = alloy_dtype_size(s->type.dtype);
    void *data = al_calloc((size_t)k * es + 1, 1);
    if (!data) return graph_fail(g, ALLOY_ERR_OOM, "out of memory taking the shard of state '%s'", s->name);
    if (n > 0 && src->data) memcpy(data, (const uint8_t *)src->data + (size_t)from * es, (size_t)n * es);
    *out = (alloy_host_tensor){.name = s->name, .dtype = s->type.dtype, .rank = 1, .dims = {k}, .data = data};
    return ALLOY_OK;
}

/* load_tensors' work once the file is read (freed here). */
static alloy_status load_from(alloy_graph *g, alloy_safetensors *file, const char *path, bool params_only, int *loaded,
                              int *ignored, const char *call)
{
    alloy_status st = ALLOY_OK;
    const alloy_host_tensor **src = al_calloc((size_t)g->nstate + 1, sizeof *src);
    if (!src) {
        alloy_safetensors_free(file);
        return graph_fail(g, ALLOY_ERR_OOM, "%s: out of memory", call);
    }
    char where[800];
    al_fmt(where, sizeof where, "%s: ", path);
    alloy_host_tensor *shards = al_calloc((size_t)g->nstate + 1, sizeof *shards); /* ZeRO-1: this rank's part */
    if (!shards) {
        al_free(src);
        alloy_safetensors_free(file);
        return graph_fail(g, ALLOY_ERR_OOM, "%s: out of memory", call);
    }
    /* validate everything before changing anything: the checksum, every
     * tensor's name, dtype and shape, the values of alloy's own counters */
    st = check_checksum(g, file, path);
    int nload = 0, nignored = 0;
    for (int i = 0; !st && i < g->nstate; i++) {
        if (params_only && !state_is_model(g, &g->state[i])) continue;
        src[i] = alloy_safetensors_find(file, g->state[i].name);
        /* a checkpoint from before the learning rate was state has no
         * optim.lr: the graph keeps its own (the optimizer's lr) */
        bool optional = strcmp(g->state[i].name, STATE_BASE_LR) == 0 || is_accumulation_state(g->state[i].name);
        if (src[i] && !(st = shard_from(g, &g->state[i], src[i], &shards[i]))) src[i] = shards[i].data ? &shards[i] : src[i];
        if (st) break;
        if (!src[i] && !params_only && !optional)
            st = graph_fail(g, ALLOY_ERR_NOT_FOUND, "%sno tensor for state '%s'", where, g->state[i].name);
        else if (src[i] && !(st = check_match(g, &g->state[i], src[i], where))) nload++;
    }
    for (int i = 0; !st && i < alloy_safetensors_count(file); i++) {
        const alloy_host_tensor *t = alloy_safetensors_get(file, i);
        rt_state *s = state_find(g, t->name);
        int64_t count = -1;
        if (!s && graph_is_batch_count(g, t->name)) { /* PyTorch's counter: kept, written back by save_params */
            if (t->dtype == ALLOY_I64 && t->rank == 0 && t->data) memcpy(&count, t->data, sizeof count);
            if (count < 0)
                st = graph_fail(g, ALLOY_ERR_INVALID, "%stensor '%s' must be an i64 scalar >= 0 (PyTorch's batch count)",
                                where, t->name);
            else if (!graph_batch_count(g, t->name, true)) /* made now (0, as unloaded): nothing fails later */
                st = graph_fail(g, ALLOY_ERR_OOM, "%s: out of memory keeping '%s'", call, t->name);
        } else if (params_only && (!s || !state_is_model(g, s))) nignored++;
        else if (!s && is_accumulation_state(t->name) && all_zero(t)) nignored++; /* saved at a step's boundary */
        else if (!s)
            st = graph_fail(g, ALLOY_ERR_NOT_FOUND,
                            "%stensor '%s' matches no state of graph '%s' (to load the params alone, as into a "
                            "forward-only graph, use alloy_graph_load_params)",
                            where, t->name, g->ir->name);
    }
    for (int i = 0; !st && i < g->nstate; i++)
        if (src[i]) st = state_check_value(g, &g->state[i], src[i]->data, where);
    /* all or nothing: every host copy current first (the old values), then
     * each buffer from the file; a failed upload puts the old values back */
    for (int i = 0; !st && i < g->nstate; i++)
        if (src[i]) st = state_host(g, &g->state[i]);
    int uploaded = 0;
    for (; !st && uploaded < g->nstate; uploaded++)
        if (src[uploaded]) st = upload_bytes(g, &g->state[uploaded], src[uploaded]->data);
    if (st) {
        for (int i = 0; i < uploaded; i++)
            if (src[i]) upload_bytes(g, &g->state[i], g->state[i].cell->host);
    } else {
        for (int i = 0; i < g->nstate; i++) {
            if (!src[i]) continue;
            size_t bytes = ir_nbytes(&g->state[i].type);
            if (bytes) memcpy(g->state[i].cell->host, src[i]->data, bytes);
            g->state[i].cell->host_stale = false;
        }
        for (int i = 0; i < alloy_safetensors_count(file); i++) {
            const alloy_host_tensor *t = alloy_safetensors_get(file, i);
            int64_t *count = state_find(g, t->name) ? NULL : graph_batch_count(g, t->name, false);
            if (count) memcpy(count, t->data, sizeof *count); /* checked above: an i64 scalar */
        }
        if (loaded) *loaded = nload;
        if (ignored) *ignored = nignored;
    }
    for (int i = 0; i < g->nstate; i++) al_free(shards[i].data);
    al_free(shards);
    al_free(src);
    alloy_safetensors_free(file);
    return st;
}

alloy_status alloy_graph_load_state(alloy_graph *g, const char *path)
{
    return load_tensors(g, path, false, NULL, NULL, "load_state");
}

alloy_status alloy_graph_load_params(alloy_graph *g, const char *path, int *loaded, int *ignored)
{
    return load_tensors(g, path, true, loaded, ignored, "load_params");
}
