/* state_api.c - the public state calls of alloy/graph.h: listing, get and set, safetensors save and load (the whole state, or the params). */
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

/* The contracts of the alloy_ calls are in alloy/graph.h. */
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
    return state_describe(g, &g->state[i], out);
}

alloy_status alloy_graph_get_state(alloy_graph *g, const char *name, alloy_host_tensor *out)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!name || !out) return graph_fail(g, ALLOY_ERR_INVALID, "get_state: %s is NULL", name ? "out" : "name");
    alloy_status st = state_ensure(g);
    if (st) return st;
    rt_state *s = state_find(g, name);
    if (!s) return graph_fail(g, ALLOY_ERR_NOT_FOUND, "no state tensor named '%s'", name);
    return state_describe(g, s, out);
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
        st = state_describe(g, &g->state[i], &ts[n]);
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
        if (src[uploaded]) st = state_upload_bytes(g, &g->state[uploaded], src[uploaded]->data);
    if (st) {
        for (int i = 0; i < uploaded; i++)
            if (src[i]) state_upload_bytes(g, &g->state[i], g->state[i].cell->host);
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
