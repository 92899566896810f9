/* fuse_casts.c - the forward's parameter casts (f32 master -> f16/bf16 working copies) as one multi-tensor launch at the start of the step.
 *
 * AMP inserts one cast per (parameter, low dtype), placed right before its
 * first reader: a transformer step has about eight per layer, each a small
 * launch of its own. fuse_hoist_param_casts moves every such cast, and the
 * params they read, to the front of the graph (a valid order: a cast reads
 * a leaf only, and every reader still comes after it); fuse_group_param_casts
 * then makes those casts that are in no group one multi group, which runs
 * at its last member, before anything reads one of them. The values are the
 * same (a cast of a parameter does not depend on where it runs); the working
 * copies live from the start of the step instead of from their first use.
 * The backward's copies (the remat pass casts a parameter again right
 * before the backward's first reader: a backward node, its origin set) stay
 * where they are, so that the forward's copies die with the forward.
 */
#include "ir/groups.h"
#include "passes/pass.h"
#include "step/schedule.h"

/* Whether node i is a cast of a param to f16 or bf16 that joins the group:
 * a copy whose rows the plan may pad (sched_pad: rows of 32 elements or
 * more that are not whole 16 bytes) stays a cast kernel of its own, which
 * can write padded rows, as a multi-tensor kernel cannot; nor does a
 * backward node's copy (remat_casts.c). */
static bool param_cast(const ir_graph *g, int i)
{
    const ir_node *n = g->nodes[i];
    if (!(n->op == IR_OP_cast && n->nin == 1 && n->origin < 0 && g->nodes[n->in[0]]->op == IR_OP_param &&
          (n->type.dtype == ALLOY_F16 || n->type.dtype == ALLOY_BF16) && g->nodes[n->in[0]]->type.dtype == ALLOY_F32))
        return false;
    int64_t cols = n->type.rank == 2 ? n->type.dims[1] : 0;
    return !(cols >= SCHED_PAD_MIN_COLS && cols * (int64_t)alloy_dtype_size(n->type.dtype) % 16 != 0);
}

alloy_status fuse_hoist_param_casts(ir_graph **gp)
{
    ir_graph *g = *gp;
    int nn = g->nnodes, ncasts = 0;
    for (int i = 0; i < nn; i++) ncasts += param_cast(g, i);
    if (ncasts < 2) return ALLOY_OK;
    int *order = al_malloc(sizeof(int) * ((size_t)nn + 1));
    uint8_t *moved = al_calloc((size_t)nn + 1, 1);
    if (!order || !moved) {
        al_free(order), al_free(moved);
        return ir_error(g, ALLOY_ERR_OOM, "fuse: out of memory ordering %d parameter casts", ncasts);
    }
    int n = 0;
    bool changed = false;
    /* every param, and every state leaf before the last param (the leaves'
     * order among themselves, that of alloy_graph_state_at, is kept; the
     * states the training passes add after the graph stay put, so the ids
     * of the forward and backward do not depend on the optimizer or the
     * scaler), then the casts, then the rest, each in id order */
    int last_param = -1;
    for (int i = 0; i < nn; i++)
        if (g->nodes[i]->op == IR_OP_param) last_param = i;
    for (int i = 0; i < nn; i++)
        if (g->nodes[i]->op == IR_OP_param || (g->nodes[i]->op == IR_OP_state && i < last_param))
            order[n++] = i, moved[i] = 1;
    for (int i = 0; i < nn; i++)
        if (param_cast(g, i)) order[n++] = i, moved[i] = 1;
    for (int i = 0; i < nn; i++)
        if (!moved[i]) order[n++] = i;
    for (int i = 0; i < nn; i++) changed |= order[i] != i;
    ir_graph *out = changed ? ir_graph_reordered(g, order, n, "fuse") : NULL;
    al_free(order), al_free(moved);
    if (!changed) return ALLOY_OK;
    if (!out) return g->status;
    ir_graph_free(g);
    *gp = out;
    return ALLOY_OK;
}

void fuse_group_param_casts(const ir_graph *g, int *label)
{
    int name = -1, taken = 0;
    for (int i = 0; i < g->nnodes; i++) {
        if (label[i] >= 0 || !param_cast(g, i)) continue;
        if (name < 0) name = i;
        label[i] = name;
        taken++;
    }
    if (taken == 1) label[name] = -1; /* a lone cast is a kernel of its own anyway */
}
