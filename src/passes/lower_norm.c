/* lower_norm.c - the lower_norm pass: batch_norm and group_norm lowered into transposes, reshapes, layer_norm (the shared row form: statistics in f32 under AMP) and elementwise ops, for the graph's mode.
 *
 * After this pass (nothing changes in a graph without batch_norm or
 * group_norm) no batch_norm or group_norm is left: each is rewritten into
 * other ops, batch_norm with batch statistics while training (and its
 * running statistics' updates) or with its running statistics in eval
 * mode, as torch.nn.BatchNorm2d in train() and eval(). It runs after the
 * random pass and before amp and autodiff.
 */
#include <string.h>

#include "passes/grad_rules.h"
#include "passes/lower_norm.h"

#define TYPE(id) (&c->g->nodes[id]->type)
#define E2(op, a, b) ad_emit(c, IR_OP_##op, 2, (int[]){a, b}, 0, NULL, NULL)

bool lower_norm_op(int op) { return op == IR_OP_batch_norm || op == IR_OP_group_norm; }

/* v [C] reshaped to [1, C, 1, ...] for x of rank `rank`. */
static int per_channel(ad_ctx *c, int v, int rank)
{
    ir_type t = *TYPE(v);
    t.rank = rank;
    for (int d = 0; d < rank; d++) t.dims[d] = d == 1 ? TYPE(v)->dims[0] : 1;
    return ad_reshape(c, v, &t);
}

/* layer_norm (no affine) of x viewed as [rows, len] (x's elements in order), back in x's shape. */
static int normalize_rows(ad_ctx *c, int x, int64_t rows, int64_t len, double eps)
{
    ir_type view = *TYPE(x), shape = *TYPE(x);
    view.rank = 2, view.dims[0] = rows, view.dims[1] = len;
    ir_attr a = ir_a_float("eps", eps);
    int y = ad_emit(c, IR_OP_layer_norm, 1, (int[]){ad_reshape(c, x, &view)}, 1, &a, NULL);
    return ad_reshape(c, y, &shape);
}

/* y * weight + bias per channel (y itself without them). */
static int affine(ad_ctx *c, int y, int nin, const int *in, int first)
{
    if (nin <= first) return y;
    int rank = TYPE(in[0])->rank;
    return E2(add, E2(mul, y, per_channel(c, in[first], rank)), per_channel(c, in[first + 1], rank));
}

/* The updates of running_mean (in[1]) and running_var (in[2]) when they
 * are state leaves: (1 - m) r + m s with s the batch mean and the unbiased
 * batch variance (PyTorch's), over count values per channel; none for an
 * empty batch. */
static void update_running(ad_ctx *c, const ir_node *n, const int *in, int64_t count)
{
    const ir_graph *g = c->g;
    if (count < 2) return; /* an empty batch observes nothing (one value per channel is an error) */
    if (g->nodes[in[1]]->op != IR_OP_state && g->nodes[in[2]]->op != IR_OP_state) return;
    const ir_type *x = TYPE(in[0]);
    int64_t axes[ALLOY_MAX_RANK];
    int naxes = 0;
    for (int d = 0; d < x->rank; d++)
        if (d != 1) axes[naxes++] = d;
    ir_attr ax = ir_a_ints("axes", naxes, axes);
    alloy_dtype dt = x->dtype;
    double m = ir_attr_f(n, "momentum");
    int mean = ad_emit(c, IR_OP_reduce_mean, 1, &in[0], 1, &ax, NULL);
    int centred = E2(sub, in[0], per_channel(c, mean, x->rank));
    int sq = ad_emit(c, IR_OP_square, 1, &centred, 0, NULL, NULL);
    int var = E2(div, ad_emit(c, IR_OP_reduce_sum, 1, &sq, 1, &ax, NULL), ad_scalar(c, dt, (double)(count - 1)));
    int stats[2] = {mean, var};
    for (int k = 0; k < 2; k++) {
        const ir_node *r = g->nodes[in[1 + k]];
        if (r->op != IR_OP_state) continue;
        int next = E2(add, E2(mul, in[1 + k], ad_scalar(c, dt, 1.0 - m)), E2(mul, stats[k], ad_scalar(c, dt, m)));
        if (next >= 0) ir_add_update(c->g, r->name, next);
    }
}

static int batch_norm(ad_ctx *c, const ir_node *n, const int *in, const pass_options *opts)
{
    const ir_type *x = TYPE(in[0]);
    double eps = ir_attr_f(n, "eps");
    bool training = ir_attr_find(n, "training") ? ir_attr_i(n, "training") != 0 : opts->train;
    int64_t channels = x->dims[1], count = channels ? ir_numel(x) / channels : 0;
    if (!training) { /* (x - running_mean) * weight / sqrt(running_var + eps) + bias */
        int scale = ad_emit(c, IR_OP_rsqrt, 1, (int[]){E2(add, in[2], ad_scalar(c, x->dtype, eps))}, 0, NULL, NULL);
        if (n->nin > 3) scale = E2(mul, scale, in[3]);
        int y = E2(mul, E2(sub, in[0], per_channel(c, in[1], x->rank)), per_channel(c, scale, x->rank));
        return n->nin > 3 ? E2(add, y, per_channel(c, in[4], x->rank)) : y;
    }
    if (count == 1) {
        char label[32];
        ir_error(c->g, ALLOY_ERR_SHAPE, "batch_norm %s: training needs more than one value per channel (input %lld x %lld)",
                 ir_node_label(n, label, sizeof label), (long long)x->dims[0], (long long)channels);
        return -1;
    }
    /* channels first: [C, N, ...], each channel's values one row of layer_norm */
    int64_t perm[ALLOY_MAX_RANK];
    for (int d = 0; d < x->rank; d++) perm[d] = d < 2 ? 1 - d : d;
    ir_attr p = ir_a_ints("perm", x->rank, perm);
    int t = ad_emit(c, IR_OP_transpose, 1, &in[0], 1, &p, NULL);
    int y = normalize_rows(c, t, channels, count, eps);
    y = ad_emit(c, IR_OP_transpose, 1, &y, 1, &p, NULL); /* the swap is its own inverse */
    update_running(c, n, in, count);
    return affine(c, y, n->nin, in, 3);
}

/* each sample's group of C / G channels is contiguous: one row of layer_norm */
static int group_norm(ad_ctx *c, const ir_node *n, const int *in)
{
    const ir_type *x = TYPE(in[0]);
    int64_t groups = ir_attr_i(n, "num_groups"), len = x->dims[1] / groups;
    for (int d = 2; d < x->rank; d++) len *= x->dims[d];
    int y = normalize_rows(c, in[0], x->dims[0] * groups, len, ir_attr_f(n, "eps"));
    return affine(c, y, n->nin, in, 1);
}

int lower_norm(ir_graph *out, const ir_node *n, const int *in, const pass_options *opts)
{
    ad_ctx ctx = {out}, *c = &ctx;
    int first = out->nnodes;
    int y = n->op == IR_OP_batch_norm ? batch_norm(c, n, in, opts) : group_norm(c, n, in);
    if (y < 0 || out->status) return -1;
    for (int i = first; i < out->nnodes; i++) /* an AMP scope's pin and the inserted mark carry over */
        out->nodes[i]->amp = n->amp, out->nodes[i]->flags = n->flags;
    if (n->name && ir_set_name(out, out->nodes[y], n->name)) return -1;
    return y;
}

/* Copies node n of the input into out with operands through map, a norm lowered. */
static void copy_node(ir_graph *out, const ir_node *n, int *map, const pass_options *opts)
{
    int in[5] = {0}, nin = n->nin;
    if (lower_norm_op(n->op)) { /* 1 to 5 operands */
        for (int j = 0; j < nin; j++) in[j] = map[n->in[j]];
        int y = lower_norm(out, n, in, opts);
        if (y >= 0) map[n->id] = y;
        return;
    }
    int *ins = in;
    if (nin > 5 && !(ins = al_malloc(sizeof(int) * (size_t)nin))) {
        ir_error(out, ALLOY_ERR_OOM, "lower_norm: out of memory");
        return;
    }
    for (int j = 0; j < nin; j++) ins[j] = map[n->in[j]];
    ir_node *m = ir_add_node(out, n->op, nin, ins, n->nattrs, n->attrs, &n->type, n->name);
    if (ins != in) al_free(ins);
    if (m) m->amp = n->amp, m->flags = n->flags, m->group = n->group, map[n->id] = m->id;
}

alloy_status pass_lower_norm(ir_graph **gp, const pass_options *opts)
{
    ir_graph *g = *gp;
    bool any = false;
    for (int i = 0; i < g->nnodes && !any; i++) any = lower_norm_op(g->nodes[i]->op);
    if (!any) return ALLOY_OK;
    int *map = al_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    ir_graph *out = map ? ir_graph_new(g->name) : NULL;
    if (!out) {
        al_free(map);
        return ir_error(g, ALLOY_ERR_OOM, "lower_norm: out of memory");
    }
    for (int i = 0; i < g->nnodes; i++) map[i] = -1;
    for (int i = 0; i < g->nnodes && !out->status; i++) copy_node(out, g->nodes[i], map, opts);
    for (int i = 0; i < g->noutputs && !out->status; i++) ir_add_output(out, g->outputs[i].name, map[g->outputs[i].node]);
    for (int i = 0; i < g->nupdates && !out->status; i++) ir_add_update(out, g->updates[i].name, map[g->updates[i].node]);
    if (g->loss >= 0) out->loss = map[g->loss];
    al_free(map);
    if (out->status) {
        alloy_status st = ir_error(g, out->status, "lower_norm: %s", out->error);
        ir_graph_free(out);
        return st;
    }
    ir_graph_free(g);
    *gp = out;
    return ALLOY_OK;
}
