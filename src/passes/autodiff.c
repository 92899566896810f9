/* autodiff.c - reverse-mode differentiation from the loss, appending the backward to the same graph.
 *
 * After this pass (when the graph has a loss and training is on): for every
 * trainable parameter (and every input asked for) that the loss depends on,
 * the graph has an output "grad:<name>" holding d loss / d tensor, with the
 * tensor's exact type. Gradients are built only for nodes that both depend
 * on such a tensor and reach the loss. A node's gradient has the node's
 * dtype, so under AMP the gradients of low-precision nodes are low precision
 * and the cast back at each weight cast makes parameter gradients f32.
 * Fan-out gradients are summed with add in that dtype, except that a sum
 * of pads of one tensor's gradient along one axis whose pieces tile it
 * (the slices of a fused projection: q, k, v) is one concat of the pieces
 * (join_pads; the pads and adds are left to dce). The seed is 1 (or
 * opts->loss_seed when a later pass provides one, e.g. the loss scale).
 */
#include <string.h>

#include "alloy/train.h"
#include "passes/grad_rules.h"
#include "passes/pass.h"

static bool wants_grad(const ir_node *n, const pass_options *opts)
{
    if (n->op == IR_OP_param) return !ir_attr_i(n, "frozen") && ir_is_float(n->type.dtype);
    if (n->op != IR_OP_input || !n->name) return false;
    for (int i = 0; i < opts->ngrad_inputs; i++)
        if (strcmp(opts->grad_inputs[i], n->name) == 0) return true;
    return false;
}

/* Whether got is a broadcast of want: the same dtype, at least its rank, and
 * each of want's dims (aligned right) equal to got's or 1. */
static bool broadcasts_to(const ir_type *want, const ir_type *got)
{
    if (want->dtype != got->dtype || got->rank < want->rank) return false;
    for (int d = 0; d < want->rank; d++) {
        int64_t w = want->dims[d], h = got->dims[got->rank - want->rank + d];
        if (w != h && w != 1) return false;
    }
    return true;
}

enum { MAX_PIECES = 16 };

/* Collects the pads of a backward sum (nodes from nfwd on) of type t:
 * node id is a pad of type t (one piece: its operand and where it starts
 * on the axis), or an add over t of two such sums. Returns the pieces'
 * count, or -1 when id is not such a sum or the pads' axes differ. */
static int pad_pieces(const ir_graph *g, int nfwd, int id, const ir_type *t, int *axis, int *piece, int64_t *start,
                      int n)
{
    const ir_node *x = g->nodes[id];
    if (id < nfwd || !ir_type_eq(&x->type, t)) return -1;
    if (x->op == IR_OP_add) {
        if (!ir_type_eq(&g->nodes[x->in[0]]->type, t) || !ir_type_eq(&g->nodes[x->in[1]]->type, t)) return -1;
        n = pad_pieces(g, nfwd, x->in[0], t, axis, piece, start, n);
        return n < 0 ? -1 : pad_pieces(g, nfwd, x->in[1], t, axis, piece, start, n);
    }
    int a;
    if (x->op != IR_OP_pad || n == MAX_PIECES || !ir_norm_axis(ir_attr_i(x, "axis"), t->rank, &a) || (n && a != *axis))
        return -1;
    *axis = a;
    piece[n] = x->in[0], start[n] = ir_attr_i(x, "before");
    return n + 1;
}

/* The gradient sum id as one concat when it is a sum of pads whose pieces
 * tile its axis in order with no gap or overlap (pad + add computes the
 * same values, but for a -0 piece element, which the add made +0); else
 * id. The concat reads each piece once and writes the result once, where
 * the pads wrote the whole width per piece and the adds read it back. */
static int join_pads(ad_ctx *ctx, int nfwd, int id)
{
    const ir_graph *g = ctx->g;
    const ir_type *t = &g->nodes[id]->type;
    int piece[MAX_PIECES], axis = 0;
    int64_t start[MAX_PIECES];
    int n = g->nodes[id]->op == IR_OP_add ? pad_pieces(g, nfwd, id, t, &axis, piece, start, 0) : -1;
    if (n < 2) return id;
    for (int i = 1; i < n; i++) /* by start; few pieces */
        for (int j = i; j > 0 && start[j] < start[j - 1]; j--) {
            int p = piece[j];
            int64_t s = start[j];
            piece[j] = piece[j - 1], start[j] = start[j - 1];
            piece[j - 1] = p, start[j - 1] = s;
        }
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        if (start[i] != at) return id;
        at += g->nodes[piece[i]]->type.dims[axis];
    }
    if (at != t->dims[axis]) return id;
    ir_attr attr = {.name = "axis", .kind = IR_ATTR_INT, .i = axis};
    int c = ad_emit(ctx, IR_OP_concat, n, piece, 1, &attr, NULL);
    return c >= 0 && ir_type_eq(&g->nodes[c]->type, t) ? c : id;
}

alloy_status pass_autodiff(ir_graph **gp, const pass_options *opts)
{
    ir_graph *g = *gp;
    if (!opts->train) return ALLOY_OK;
    if (g->loss < 0) return ir_error(g, ALLOY_ERR_INVALID, "autodiff: training needs a loss (alloy_graph_set_loss)");
    int loss = g->loss, nfwd = g->nnodes;
    const ir_type *lt = &g->nodes[loss]->type;
    if (lt->rank != 0 || !ir_is_float(lt->dtype)) {
        char t[96];
        ir_fmt_type(t, sizeof t, lt);
        return ir_error(g, ALLOY_ERR_SHAPE, "autodiff: the loss must be a floating-point scalar, not %s", t);
    }
    uint8_t *active = al_calloc((size_t)nfwd + 1, 1);
    uint8_t *reach = al_calloc((size_t)nfwd + 1, 1);
    int *grad = al_malloc(sizeof(int) * ((size_t)nfwd + 1));
    if (!active || !reach || !grad) {
        al_free(active), al_free(reach), al_free(grad);
        return ir_error(g, ALLOY_ERR_OOM, "autodiff: out of memory");
    }
    for (int i = 0; i < nfwd; i++) {
        const ir_node *n = g->nodes[i];
        grad[i] = -1;
        if (n->nin == 0) active[i] = wants_grad(n, opts);
        else if (ir_is_float(n->type.dtype))
            for (int j = 0; j < n->nin; j++) active[i] |= active[n->in[j]];
    }
    reach[loss] = 1;
    for (int i = loss; i >= 0; i--)
        if (reach[i])
            for (int j = 0; j < g->nodes[i]->nin; j++) reach[g->nodes[i]->in[j]] = 1;
    ad_ctx ctx = {g};
    if (opts->scaler && opts->scaler->kind != ALLOY_SCALER_NONE) { /* seed with the loss scale: d(loss*s)/d loss */
        int scale = pass_state_leaf(g, STATE_SCALE, ALLOY_F32, 0, NULL, opts->scaler->init_scale);
        grad[loss] = lt->dtype == ALLOY_F32 ? scale
                                            : ad_emit(&ctx, IR_OP_cast, 1, &scale, 0, NULL, lt);
    } else {
        grad[loss] = opts->loss_seed >= 0 ? opts->loss_seed : ad_scalar(&ctx, lt->dtype, 1.0);
    }
    int dx_small[16];
    for (int i = loss; i >= 0 && !g->status; i--) {
        if (!active[i] || !reach[i] || grad[i] < 0 || g->nodes[i]->nin == 0) continue;
        int joined = g->nnodes; /* every consumer of i came later: grad[i] is whole */
        grad[i] = join_pads(&ctx, nfwd, grad[i]);
        for (int k = joined; k < g->nnodes; k++) g->nodes[k]->origin = i;
        if (g->status) break;
        const ir_node *n = g->nodes[i];
        ad_rule rule = ad_rules[n->op];
        char label[64];
        if (!rule) {
            ir_error(g, ALLOY_ERR_UNSUPPORTED, "autodiff: %s (node %s) has no gradient rule",
                     ir_ops[n->op].name, ir_node_label(n, label, sizeof label));
            break;
        }
        int *dx = n->nin <= 16 ? dx_small : al_malloc(sizeof(int) * (size_t)n->nin);
        if (!dx) {
            ir_error(g, ALLOY_ERR_OOM, "autodiff: out of memory");
            break;
        }
        for (int j = 0; j < n->nin; j++) dx[j] = -1;
        int first_new = g->nnodes;
        rule(&ctx, n, grad[i], dx);
        for (int j = 0; j < n->nin && !g->status; j++) {
            int u = n->in[j];
            if (!active[u] || dx[j] < 0) continue;
            const ir_type *want = &g->nodes[u]->type, *got = &g->nodes[dx[j]]->type;
            if (!ir_type_eq(want, got) && broadcasts_to(want, got)) { /* a rule's unsummed gradient */
                dx[j] = ad_unbroadcast(&ctx, dx[j], want);
                if (dx[j] < 0) break;
                got = &g->nodes[dx[j]]->type;
            }
            if (!ir_type_eq(want, got)) {
                char a[96], b[96];
                ir_fmt_type(a, sizeof a, want);
                ir_fmt_type(b, sizeof b, got);
                ir_error(g, ALLOY_ERR_VERIFY, "autodiff: gradient rule of %s (node %s) gave %s for operand %d of type %s",
                         ir_ops[n->op].name, ir_node_label(n, label, sizeof label), b, j, a);
                break;
            }
            grad[u] = grad[u] < 0 ? dx[j] : ad_emit(&ctx, IR_OP_add, 2, (int[]){grad[u], dx[j]}, 0, NULL, NULL);
        }
        if (dx != dx_small) al_free(dx);
        for (int k = first_new; k < g->nnodes; k++) g->nodes[k]->origin = i; /* the amp_check report's "backward of" */
    }
    for (int i = 0; i < nfwd && !g->status; i++) {
        const ir_node *n = g->nodes[i];
        if (n->nin || !active[i] || grad[i] < 0) continue;
        grad[i] = join_pads(&ctx, nfwd, grad[i]);
        char name[512];
        al_fmt(name, sizeof name, GRAD_PREFIX "%s", n->name);
        ir_add_output(g, name, grad[i]);
    }
    al_free(active);
    al_free(reach);
    al_free(grad);
    if (g->status) return g->status;
    return ad_place_statistics(gp, nfwd);
}
