/* data_parallel.c - data-parallel training: each parameter's gradient summed over the ranks in buckets, then divided by their number; the reported loss their mean.
 *
 * Runs after autodiff and before grad_scaler and optimizer, when the graph
 * trains data-parallel (pass_options.dp_world >= 1). After this pass:
 *   - every "grad:<param>" output is g' = r * f(1/world), where r is g's
 *     part of its bucket's all_reduce (reduce="sum"): the gradients of
 *     trained parameters, taken in reverse order (the order the backward
 *     finishes them, as DDP), are cut into buckets of one dtype of about
 *     dp_bucket_bytes each (a gradient larger than that is a bucket of its
 *     own); a bucket of several is flattened and concatenated into one
 *     contiguous buffer, reduced by one all_reduce, and sliced back, so each
 *     bucket costs one collective. Gradients of inputs (request_grad) stay
 *     the rank's own;
 *   - the loss is mean over the ranks: all_reduce(loss) * (1/world), what
 *     the step reports (autodiff already seeded the backward from the
 *     rank's own loss);
 *   - grad_scaler then unscales the reduced gradients, so every rank sees
 *     the same values and the same inf/NaN, and agrees its found_inf by an
 *     all_reduce(reduce="max") besides; clipping's norm is the global one.
 * With two ranks the sum is one addition (x0 + x1, the same bits in either
 * order); with scale factors that are powers of two the step equals a
 * single process accumulating the ranks' micro-batches in rank order
 * (docs/distributed.md). Nothing is emitted for a graph that does not train.
 *
 * ZeRO-1 (dp_zero = 1): each parameter's gradient is flattened, padded with
 * zeros to a multiple of the world and reduce-scattered on its own, so
 * "grad:<param>" becomes this rank's shard (dp_shard_len elements) times
 * f(1/world); the loss scaler then unscales and checks shards, and the
 * optimizer updates this rank's shard of each parameter and all-gathers it
 * (optimizer.c). Buckets do not apply: one collective per parameter.
 */
#include <string.h>

#include "passes/grad_rules.h"
#include "passes/pass.h"

typedef struct bucket_item {
    int out;      /* index in g->outputs */
    int64_t numel;
} bucket_item;

/* Whether output o is the gradient of a trained parameter of g. */
static bool is_param_grad(const ir_graph *g, const ir_output *o)
{
    if (strncmp(o->name, "grad:", 5) != 0) return false;
    int p = ir_find_name(g, o->name + 5);
    return p >= 0 && g->nodes[p]->op == IR_OP_param;
}

/* items[0..n): one bucket of one dtype; replaces each output's node by its
 * reduced value (not yet averaged). */
static void reduce_bucket(ad_ctx *c, const bucket_item *items, int n)
{
    ir_graph *g = c->g;
    if (n == 1) {
        int gr = g->outputs[items[0].out].node;
        g->outputs[items[0].out].node = ad_emit(c, IR_OP_all_reduce, 1, &gr, 0, NULL, NULL);
        return;
    }
    int *flat = al_calloc((size_t)n, sizeof(int));
    if (!flat) {
        ir_error(g, ALLOY_ERR_OOM, "data_parallel: out of memory");
        return;
    }
    for (int i = 0; i < n; i++) {
        ir_type t = g->nodes[g->outputs[items[i].out].node]->type;
        t.rank = 1, t.dims[0] = items[i].numel;
        flat[i] = ad_reshape(c, g->outputs[items[i].out].node, &t);
    }
    int cat = ad_emit(c, IR_OP_concat, n, flat, 1, (ir_attr[]){ir_a_int("axis", 0)}, NULL);
    al_free(flat);
    int r = ad_emit(c, IR_OP_all_reduce, 1, &cat, 0, NULL, NULL);
    int64_t at = 0;
    for (int i = 0; i < n && !g->status; i++) {
        const ir_type *t = &g->nodes[g->outputs[items[i].out].node]->type;
        int part = ad_emit(c, IR_OP_slice, 1, &r, 3,
                           (ir_attr[]){ir_a_int("axis", 0), ir_a_int("start", at), ir_a_int("end", at + items[i].numel)},
                           NULL);
        g->outputs[items[i].out].node = ad_reshape(c, part, t);
        at += items[i].numel;
    }
}

int64_t dp_shard_len(int64_t n, int world) { return (n + world - 1) / world; }

int dp_flat_padded(ad_ctx *c, int x, int world)
{
    const ir_type *t = &c->g->nodes[x]->type;
    int64_t n = ir_numel(t), pad = dp_shard_len(n, world) * world - n;
    ir_type flat = *t;
    flat.rank = 1, flat.dims[0] = n;
    int f = ad_reshape(c, x, &flat);
    if (!pad) return f;
    return ad_emit(c, IR_OP_pad, 1, &f, 3, (ir_attr[]){ir_a_int("axis", 0), ir_a_int("before", 0), ir_a_int("after", pad)},
                   NULL);
}

int dp_shard_of(ad_ctx *c, int x, int world, int rank)
{
    int64_t s = dp_shard_len(ir_numel(&c->g->nodes[x]->type), world);
    int f = dp_flat_padded(c, x, world);
    if (world == 1) return f;
    return ad_emit(c, IR_OP_slice, 1, &f, 3,
                   (ir_attr[]){ir_a_int("axis", 0), ir_a_int("start", rank * s), ir_a_int("end", (rank + 1) * s)}, NULL);
}

int dp_unshard(ad_ctx *c, int shard, const ir_type *t, int world)
{
    int64_t n = ir_numel(t), s = dp_shard_len(n, world);
    int all = world == 1 ? shard : ad_emit(c, IR_OP_all_gather, 1, &shard, 1, (ir_attr[]){ir_a_int("world", world)}, NULL);
    if (s * world != n)
        all = ad_emit(c, IR_OP_slice, 1, &all, 3, (ir_attr[]){ir_a_int("axis", 0), ir_a_int("start", 0), ir_a_int("end", n)},
                      NULL);
    return ad_reshape(c, all, t);
}

int dp_state_shard(ir_graph *g, const char *name, const ir_type *whole, int world)
{
    int id = ir_find_name(g, name);
    if (id >= 0) return id;
    ir_type t = {.dtype = whole->dtype, .rank = 1, .dims = {dp_shard_len(ir_numel(whole), world)}};
    ir_attr attrs[2] = {ir_a_str("init", "zeros"), ir_a_ints("shard_of", whole->rank, whole->dims)};
    ir_node *n = ir_add_node(g, IR_OP_state, 0, NULL, 2, attrs, &t, name);
    return n ? n->id : -1;
}

/* ZeRO-1: each trained parameter's gradient becomes this rank's shard of its sum. */
static void scatter_grads(ad_ctx *c, const bool *grad, int world)
{
    ir_graph *g = c->g;
    for (int i = g->noutputs - 1; i >= 0 && !g->status; i--) { /* reverse order: the order the backward finishes them */
        if (!grad[i]) continue;
        int f = dp_flat_padded(c, g->outputs[i].node, world);
        g->outputs[i].node = ad_emit(c, IR_OP_reduce_scatter, 1, &f, 1, (ir_attr[]){ir_a_int("world", world)}, NULL);
    }
}

alloy_status pass_data_parallel(ir_graph **gp, const pass_options *opts)
{
    ir_graph *g = *gp;
    if (!opts->train || opts->dp_world < 1) return ALLOY_OK;
    ad_ctx c = {g};
    int no = g->noutputs, world = opts->dp_world;
    size_t limit = opts->dp_bucket_bytes ? opts->dp_bucket_bytes : (size_t)25 << 20;
    bucket_item *items = al_calloc((size_t)no + 1, sizeof *items);
    bool *taken = al_calloc((size_t)no + 1, sizeof *taken), *grad = al_calloc((size_t)no + 1, sizeof *grad);
    if (!items || !taken || !grad) {
        al_free(items), al_free(taken), al_free(grad);
        return ir_error(g, ALLOY_ERR_OOM, "data_parallel: out of memory");
    }
    for (int i = 0; i < no; i++) grad[i] = is_param_grad(g, &g->outputs[i]);
    if (opts->dp_zero == 1) scatter_grads(&c, grad, world), no = 0; /* no buckets */
    /* buckets in reverse output order, one dtype each: take the latest
     * unbucketed gradient, then earlier ones of its dtype until full */
    for (int start = no - 1; start >= 0 && !g->status; start--) {
        if (taken[start] || !grad[start]) continue;
        alloy_dtype dt = g->nodes[g->outputs[start].node]->type.dtype;
        int n = 0;
        size_t bytes = 0;
        for (int i = start; i >= 0 && bytes < limit; i--) {
            if (taken[i] || !grad[i]) continue;
            const ir_type *t = &g->nodes[g->outputs[i].node]->type;
            if (t->dtype != dt) continue;
            taken[i] = true;
            items[n++] = (bucket_item){i, ir_numel(t)};
            bytes += ir_nbytes(t);
        }
        reduce_bucket(&c, items, n);
    }
    /* the mean over the ranks */
    no = g->noutputs;
    for (int i = 0; i < no && !g->status; i++) {
        if (!grad[i] || world == 1) continue;
        int gr = g->outputs[i].node;
        alloy_dtype dt = g->nodes[gr]->type.dtype;
        g->outputs[i].node = ad_emit(&c, IR_OP_mul, 2, (int[]){gr, ad_scalar(&c, dt, 1.0 / world)}, 0, NULL, NULL);
    }
    al_free(items), al_free(taken), al_free(grad);
    if (g->loss >= 0 && !g->status) {
        int loss = g->loss;
        int sum = ad_emit(&c, IR_OP_all_reduce, 1, &loss, 0, NULL, NULL);
        alloy_dtype dt = g->nodes[loss]->type.dtype;
        g->loss = world == 1 ? sum : ad_emit(&c, IR_OP_mul, 2, (int[]){sum, ad_scalar(&c, dt, 1.0 / world)}, 0, NULL, NULL);
    }
    return g->status;
}
