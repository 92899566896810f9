/* state.c - state tensors: creation and seeded initialization, their buffers and host copies, moving them between backends (the public calls: state_api.c). */
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
alloy_status state_upload_bytes(alloy_graph *g, rt_state *s, const void *data)
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
    alloy_status st = state_upload_bytes(g, s, s->cell->host);
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
    alloy_status st = state_upload_bytes(g, s, data); /* the host copy changes only after the buffer did */
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

alloy_status state_init(alloy_graph *g)
{
    const ir_graph *ir = g->compiled;
    uint8_t *conv_weight = al_calloc((size_t)ir->nnodes + 1, 1);
    if (!conv_weight) return graph_fail(g, ALLOY_ERR_OOM, "out of memory initializing state (%d nodes)", ir->nnodes);
    find_conv_weights(ir, conv_weight);
    alloy_status st = state_create(g, ir, conv_weight);
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

bool state_is_param(const alloy_graph *g, const rt_state *s)
{
    int id = ir_find_name(g->ir, s->name);
    return id >= 0 && g->ir->nodes[id]->op == IR_OP_param;
}

alloy_status state_describe(alloy_graph *g, rt_state *s, alloy_host_tensor *out)
{
    out->name = s->name;
    out->dtype = s->type.dtype;
    out->rank = s->type.rank;
    memcpy(out->dims, s->type.dims, sizeof out->dims);
    out->data = s->cell->host;
    return state_host(g, s);
}
