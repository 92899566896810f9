/* fuse_attention.c - the attention pass: softmax(causal_mask(q k^T * s)) v written out as matmul, scale, mask, softmax, matmul becomes one attention node, so neither the forward nor the backward stores the score matrix.
 *
 * A match, read from the second matmul back (every node named here but q,
 * k and v unnamed, with that one consumer only and no output, update or
 * loss of its own, so nothing else reads the scores):
 *   matmul(P, v)                         no transposes
 *   P = softmax(X, axis -1)              (axis 3 of rank 4)
 *   X = causal_mask(Y) with value -inf   -> causal; else X = Y
 *   Y = mul(Z, c) or mul(c, Z)           c a one-element constant: scale c
 *                                        (several such muls multiply); else Y = Z
 *   Z = matmul(A, k, transpose_b)        no transpose_a
 *   A = mul(q, c) (c as above)           -> scale * c (q need not be single use); else A = q
 * with q [B, H, T, D], k and v [B, H, S, D] of one float dtype (T <= S when
 * causal, as causal_mask requires) becomes attention(q, k, v, causal,
 * scale), taking the second matmul's name, amp and flags. The graph is
 * rebuilt in order without the replaced nodes (a mul of q with other
 * consumers stays). Runs before amp and autodiff, so the attention's AMP
 * class (allow) and its gradient rule apply. Numerics: the scale is applied
 * to the f32 scores instead of rounding q * c to q's dtype, and the
 * softmax's sums run in another order, so results agree with the written-out
 * graph to rounding, not bit for bit (docs/fusion.md).
 */
#include <math.h>

#include "passes/pass.h"

/* A node's uses: consumers, plus one per output, update and the loss. */
static int *count_uses(const ir_graph *g)
{
    int *uses = al_calloc((size_t)g->nnodes + 1, sizeof(int));
    if (!uses) return NULL;
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++) uses[g->nodes[i]->in[j]]++;
    for (int i = 0; i < g->noutputs; i++) uses[g->outputs[i].node]++;
    for (int i = 0; i < g->nupdates; i++) uses[g->updates[i].node]++;
    if (g->loss >= 0) uses[g->loss]++;
    return uses;
}

/* Node id inside the pattern: unnamed with one use. */
static bool inner(const ir_graph *g, const int *uses, int id, int op)
{
    const ir_node *n = g->nodes[id];
    return n->op == op && uses[id] == 1 && !n->name;
}

/* The value of a one-element constant as its dtype holds it (f32: rounded
 * to float, as the written-out mul reads it), or NaN. */
static double scalar_of(const ir_node *c)
{
    if (c->op != IR_OP_constant || ir_numel(&c->type) != 1) return NAN;
    const ir_attr *v = ir_attr_find(c, "value"), *vs = ir_attr_find(c, "values");
    double x = v ? v->f : vs && vs->n == 1 ? vs->floats[0] : NAN;
    if (c->type.dtype == ALLOY_F32) return (double)(float)x;
    return c->type.dtype == ALLOY_F64 ? x : NAN;
}

/* When node id is mul(x, c) or mul(c, x) of x's type and a one-element
 * constant c: x, with *scale multiplied by c; else -1. */
static int unscaled(const ir_graph *g, int id, double *scale)
{
    const ir_node *m = g->nodes[id];
    if (m->op != IR_OP_mul) return -1;
    for (int side = 0; side < 2; side++) {
        const ir_node *x = g->nodes[m->in[side]], *c = g->nodes[m->in[1 - side]];
        double v = scalar_of(c);
        if (!isnan(v) && ir_type_eq(&x->type, &m->type) && isfinite(v)) {
            *scale *= v;
            return x->id;
        }
    }
    return -1;
}

/* One match: the attention's operands and attributes, and the nodes it replaces. */
typedef struct match {
    int q, k, v;
    bool causal;
    double scale;
    int dead[8], ndead;
} match;

/* Whether matmul n ends a written-out attention (the top of this file). */
static bool match_at(const ir_graph *g, const int *uses, const ir_node *n, match *m)
{
    if (n->op != IR_OP_matmul || ir_attr_i(n, "transpose_a") || ir_attr_i(n, "transpose_b")) return false;
    *m = (match){.scale = 1.0, .v = n->in[1]};
    int p = n->in[0];
    if (!inner(g, uses, p, IR_OP_softmax) || g->nodes[p]->type.rank != 4) return false;
    int64_t axis = ir_attr_i(g->nodes[p], "axis");
    if (axis != -1 && axis != 3) return false;
    m->dead[m->ndead++] = p;
    int x = g->nodes[p]->in[0];
    if (inner(g, uses, x, IR_OP_causal_mask) && ir_attr_f(g->nodes[x], "value") == -INFINITY) {
        m->causal = true;
        m->dead[m->ndead++] = x;
        x = g->nodes[x]->in[0];
    }
    for (int y; m->ndead < 6 && inner(g, uses, x, IR_OP_mul) && (y = unscaled(g, x, &m->scale)) >= 0; x = y)
        m->dead[m->ndead++] = x;
    if (!inner(g, uses, x, IR_OP_matmul)) return false;
    const ir_node *z = g->nodes[x];
    if (ir_attr_i(z, "transpose_a") || !ir_attr_i(z, "transpose_b")) return false;
    m->dead[m->ndead++] = x;
    m->k = z->in[1];
    m->q = z->in[0];
    int a = unscaled(g, m->q, &m->scale);
    if (a >= 0) {
        if (uses[m->q] == 1 && !g->nodes[m->q]->name) m->dead[m->ndead++] = m->q;
        m->q = a;
    }
    const ir_type *q = &g->nodes[m->q]->type, *k = &g->nodes[m->k]->type, *v = &g->nodes[m->v]->type;
    if (q->rank != 4 || k->rank != 4 || v->rank != 4 || !ir_is_float(q->dtype) || k->dtype != q->dtype ||
        v->dtype != q->dtype || n->type.dtype != q->dtype || !isfinite(m->scale))
        return false;
    for (int d = 0; d < 4; d++)
        if ((d != 2 && k->dims[d] != q->dims[d]) || v->dims[d] != k->dims[d]) return false;
    return !m->causal || q->dims[2] <= k->dims[2];
}

/* Replaces *gp by its copy with every match rewritten; *gp untouched when
 * there is none. Errors: out of memory only. */
/* Whether a match is rewritten (the option `attention`): always, or by
 * default for a CUDA compile (device=cuda), and elsewhere when one
 * attention's f32 scores take at least ATTN_CPU_MIN_BYTES. On the CPU the
 * written-out form is the faster one at small sizes (its two products are
 * the BLAS's GEMMs; char_gpt's fp32 step took 15-20% longer with the op),
 * so there the rewrite is for memory. device=auto compiles for the backend
 * that opened before the passes ran (graph_compile): the GPU where one
 * runs, else the CPU. */
enum { ATTN_CPU_MIN_BYTES = 64 << 20 };

static bool want_rewrite(const ir_graph *g, const match *m, const al_options *cfg)
{
    if (cfg->attention_always || cfg->device == OPT_DEVICE_CUDA) return true;
    const ir_node *p = g->nodes[m->dead[0]]; /* the softmax: [B, H, T, S] */
    return (double)ir_numel(&p->type) * 4.0 >= (double)ATTN_CPU_MIN_BYTES;
}

alloy_status pass_fuse_attention(ir_graph **gp, const pass_options *opts)
{
    const al_options *cfg = pass_cfg(opts);
    ir_graph *g = *gp;
    int *uses = count_uses(g);
    int *map = al_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    match *at = al_calloc((size_t)g->nnodes + 1, sizeof(match));
    uint8_t *skip = al_calloc((size_t)g->nnodes + 1, 1), *ends = al_calloc((size_t)g->nnodes + 1, 1);
    if (!uses || !map || !at || !skip || !ends) {
        al_free(uses), al_free(map), al_free(at), al_free(skip), al_free(ends);
        return ir_error(g, ALLOY_ERR_OOM, "attention: out of memory");
    }
    int found = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (match_at(g, uses, g->nodes[i], &at[i]) && want_rewrite(g, &at[i], cfg)) {
            ends[i] = 1, found++;
            for (int j = 0; j < at[i].ndead; j++) skip[at[i].dead[j]] = 1;
        }
    ir_graph *out = found ? ir_graph_new(g->name) : NULL;
    int ins_small[16];
    for (int i = 0; out && i < g->nnodes && !out->status; i++) {
        const ir_node *n = g->nodes[i];
        if (skip[i]) continue;
        ir_node *m;
        if (ends[i]) {
            int ins[3] = {map[at[i].q], map[at[i].k], map[at[i].v]};
            ir_attr a[2] = {ir_a_bool("causal", at[i].causal), ir_a_float("scale", at[i].scale)};
            m = ir_add_node(out, IR_OP_attention, 3, ins, 2, a, NULL, n->name);
        } else {
            int *ins = n->nin <= 16 ? ins_small : al_malloc(sizeof(int) * (size_t)n->nin);
            if (!ins) {
                ir_error(out, ALLOY_ERR_OOM, "attention: out of memory");
                break;
            }
            for (int j = 0; j < n->nin; j++) ins[j] = map[n->in[j]];
            m = ir_add_node(out, n->op, n->nin, ins, n->nattrs, n->attrs, &n->type, n->name);
            if (ins != ins_small) al_free(ins);
        }
        if (!m) break;
        m->amp = n->amp, m->flags = n->flags, m->group = n->group;
        map[i] = m->id;
    }
    for (int i = 0; out && i < g->noutputs && !out->status; i++) ir_add_output(out, g->outputs[i].name, map[g->outputs[i].node]);
    for (int i = 0; out && i < g->nupdates && !out->status; i++) ir_add_update(out, g->updates[i].name, map[g->updates[i].node]);
    if (out && g->loss >= 0) out->loss = map[g->loss];
    al_free(uses), al_free(map), al_free(at), al_free(skip), al_free(ends);
    if (!found) return ALLOY_OK;
    if (!out || out->status) {
        alloy_status st = out ? out->status : ALLOY_ERR_OOM;
        ir_error(g, st, "attention: %s", out ? out->error : "out of memory");
        ir_graph_free(out);
        return st;
    }
    ir_graph_free(g);
    *gp = out;
    return ALLOY_OK;
}
