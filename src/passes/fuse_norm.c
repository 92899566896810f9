/* fuse_norm.c - the gradient norm's sum_squares joins the multi group of the found_inf that checks the same gradients: unscale, inf/NaN check and sum of squares in one pass over them.
 *
 * The optimizer's sum_squares reads the unscaled gradients that grad_scaler's
 * found_inf checks, but comes much later in the graph (after the scale
 * update), so as groups go it cannot join found_inf's: a group runs at its
 * last member, and found_inf's readers come before the sum. Moving the sum
 * right before found_inf is a valid order (its operands are found_inf's, so
 * they come before it; its readers come after found_inf); then
 * fuse_multi_found_inf (fuse_multi.c) takes it in as the member just before found_inf, and the
 * multi kernel sums the squares of each gradient while it has them in
 * registers (codegen: cg_emit_multi). Its value is the same op on the same
 * operands: the CPU backend still runs sum_squares itself.
 */
#include "ir/groups.h"
#include "passes/pass.h"

/* The sum_squares a found_inf F can take in: the first after F whose
 * operands are all f32 operands of F (mark[o] set for F's operands), or -1. */
static int norm_of(const ir_graph *g, int fi, const uint8_t *mark, const uint8_t *moved)
{
    for (int i = fi + 1; i < g->nnodes; i++) {
        const ir_node *n = g->nodes[i];
        if (n->op != IR_OP_sum_squares || n->nin == 0 || moved[i]) continue;
        bool all = true;
        for (int j = 0; j < n->nin && all; j++)
            all = mark[n->in[j]] && g->nodes[n->in[j]]->type.dtype == ALLOY_F32;
        if (all) return i;
    }
    return -1;
}

alloy_status fuse_hoist_sum_squares(ir_graph **gp)
{
    ir_graph *g = *gp;
    int nn = g->nnodes;
    int *before = al_malloc(sizeof(int) * ((size_t)nn + 1)), *order = al_malloc(sizeof(int) * ((size_t)nn + 1));
    uint8_t *mark = al_calloc((size_t)nn + 1, 1), *moved = al_calloc((size_t)nn + 1, 1);
    bool changed = false;
    if (!before || !order || !mark || !moved) {
        al_free(before), al_free(order), al_free(mark), al_free(moved);
        return ir_error(g, ALLOY_ERR_OOM, "fuse: out of memory placing the gradient norm");
    }
    for (int i = 0; i < nn; i++) before[i] = -1;
    for (int fi = 0; fi < nn; fi++) {
        const ir_node *f = g->nodes[fi];
        if (f->op != IR_OP_found_inf) continue;
        for (int j = 0; j < f->nin; j++) mark[f->in[j]] = 1;
        int s = norm_of(g, fi, mark, moved);
        for (int j = 0; j < f->nin; j++) mark[f->in[j]] = 0;
        if (s >= 0) before[fi] = s, moved[s] = 1, changed = true;
    }
    int n = 0;
    for (int i = 0; i < nn && changed; i++) {
        if (before[i] >= 0) order[n++] = before[i];
        if (!moved[i]) order[n++] = i;
    }
    ir_graph *out = changed ? ir_graph_reordered(g, order, n, "fuse") : NULL;
    al_free(before), al_free(order), al_free(mark), al_free(moved);
    if (!changed) return ALLOY_OK;
    if (!out) return g->status;
    ir_graph_free(g);
    *gp = out;
    return ALLOY_OK;
}

/* Union-find root of x. */
static int root_of(int *parent, int x)
{
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
}

bool fuse_norm_fits(const ir_graph *g, const int *label, int fi, int s, bool *fits)
{
    int *parent = al_malloc(sizeof(int) * ((size_t)fi + 1));
    uint8_t *hit = al_calloc((size_t)fi + 1, 1);
    if (!parent || !hit) {
        al_free(parent), al_free(hit);
        return false;
    }
    /* the chains: the group's elementwise members joined by the operands they read of one another */
    for (int i = 0; i < fi; i++) parent[i] = i;
    for (int i = 0; i < fi; i++) {
        if (label[i] != label[fi] || i == s) continue;
        const ir_node *n = g->nodes[i];
        for (int j = 0; j < n->nin; j++)
            if (label[n->in[j]] == label[fi]) parent[root_of(parent, n->in[j])] = root_of(parent, i);
    }
    *fits = true;
    const ir_node *sn = g->nodes[s];
    for (int j = 0; j < sn->nin; j++) { /* one sum per chain: the same operand twice is fine */
        int o = sn->in[j];
        if (label[o] != label[fi]) continue;
        int r = root_of(parent, o);
        bool again = false;
        for (int k = 0; k < j; k++) again |= sn->in[k] == o;
        if (hit[r] && !again) *fits = false;
        hit[r] = 1;
    }
    al_free(parent), al_free(hit);
    return true;
}
