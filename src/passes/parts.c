/* parts.c - which part of a training step each node is (forward, backward, update), derived from the graph's loss and outputs. */
#include <string.h>

#include "passes/inspect.h"

const char *insp_part_name(insp_part p)
{
    static const char *const names[] = {"forward", "backward", "update"};
    return p <= INSP_UPDATE ? names[p] : "?";
}

/* Marks (mark[i] = 1) node `root` and every node it depends on that is
 * not marked yet; operands have smaller ids, so one descending sweep does. */
static void mark_ancestors(const ir_graph *g, uint8_t *mark, int root)
{
    if (root < 0 || root >= g->nnodes) return;
    mark[root] = 1;
    for (int i = root; i >= 0; i--) {
        if (mark[i] != 1) continue;
        const ir_node *n = g->nodes[i];
        for (int k = 0; k < n->nin; k++)
            if (!mark[n->in[k]]) mark[n->in[k]] = 1;
    }
}

alloy_status insp_parts(const ir_graph *g, uint8_t *part)
{
    int n = g->nnodes;
    uint8_t *fwd = al_calloc((size_t)n + 1, 1), *bwd = al_calloc((size_t)n + 1, 1);
    if (!fwd || !bwd) {
        al_free(fwd), al_free(bwd);
        return ALLOY_ERR_OOM;
    }
    if (g->loss >= 0) mark_ancestors(g, fwd, g->loss);
    else memset(fwd, 1, (size_t)n);
    for (int o = 0; o < g->noutputs; o++)
        if (strncmp(g->outputs[o].name, "grad:", 5) == 0) mark_ancestors(g, bwd, g->outputs[o].node);
    for (int i = 0; i < n; i++) part[i] = fwd[i] ? INSP_FORWARD : bwd[i] ? INSP_BACKWARD : INSP_UPDATE;
    al_free(fwd), al_free(bwd);
    return ALLOY_OK;
}
