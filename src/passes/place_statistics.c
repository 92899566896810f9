/* place_statistics.c - the last step of autodiff: the per-row statistics a gradient rule kept (layer_norm_mean, layer_norm_rstd, rms_norm_rstd of a forward tensor) move next to the forward row op that reads the same rows.
 *
 * A gradient rule appends them to the backward like every node it emits, but
 * their value is the forward's: layer_norm computes the same mean and rstd.
 * Placed right after the forward layer_norm of x, the fuse pass's sibling
 * rule puts them in its row group, which computes the statistics once (the
 * programs share their first stages, codegen/emit_row_program.c) and stores two
 * numbers per row; the backward then reads those instead of two reductions
 * per row. With no such forward reader they go right after x itself.
 *
 * The order is otherwise kept: forward nodes, then the backward minus the
 * moved statistics. Linear in nodes + edges.
 */
#include "ir/groups.h"
#include "passes/pass.h"

alloy_status ad_place_statistics(ir_graph **gp, int nfwd)
{
    ir_graph *g = *gp;
    int nn = g->nnodes;
    /* anchor[i]: the forward node statistic i follows; chain through next */
    int *anchor = al_malloc(sizeof(int) * ((size_t)nn + 1)), *head = al_malloc(sizeof(int) * ((size_t)nn + 1));
    int *next = al_malloc(sizeof(int) * ((size_t)nn + 1)), *order = al_malloc(sizeof(int) * ((size_t)nn + 1));
    if (!anchor || !head || !next || !order) {
        al_free(anchor), al_free(head), al_free(next), al_free(order);
        return ir_error(g, ALLOY_ERR_OOM, "autodiff: out of memory placing the kept statistics");
    }
    for (int i = 0; i < nn; i++) anchor[i] = -1, head[i] = -1, next[i] = -1;
    int moved = 0;
    for (int i = nfwd; i < nn; i++) {
        const ir_node *n = g->nodes[i];
        if (!ir_row_keeps(n) || n->in[0] >= nfwd) continue;
        anchor[i] = n->in[0];
        moved++;
    }
    if (moved) {
        /* the last forward row op reading x row by row */
        for (int r = 0; r < nfwd; r++) {
            const ir_node *n = g->nodes[r];
            if (!ir_ops[n->op].row) continue;
            for (int j = 0; j < n->nin; j++)
                if (ir_row_operand(n, j)) head[n->in[j]] = r; /* borrowed: x -> its last row reader */
        }
        for (int i = nfwd; i < nn; i++)
            if (anchor[i] >= 0 && head[anchor[i]] > anchor[i]) anchor[i] = head[anchor[i]];
        for (int i = 0; i < nn; i++) head[i] = -1;
        for (int i = nn - 1; i >= nfwd; i--) /* per anchor, its statistics in id order */
            if (anchor[i] >= 0) next[i] = head[anchor[i]], head[anchor[i]] = i;
        int k = 0;
        for (int i = 0; i < nfwd; i++) {
            order[k++] = i;
            for (int s = head[i]; s >= 0; s = next[s]) order[k++] = s;
        }
        for (int i = nfwd; i < nn; i++)
            if (anchor[i] < 0) order[k++] = i;
        ir_graph *out = ir_graph_reordered(g, order, k, "autodiff");
        if (out) {
            ir_graph_free(g);
            *gp = out;
        }
    }
    al_free(anchor), al_free(head), al_free(next), al_free(order);
    return (*gp)->status;
}
