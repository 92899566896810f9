/* dce.c - dead-code elimination: keeps only nodes the outputs and the loss depend on.
 *
 * After this pass every node is an output, the loss, or an operand (directly
 * or not) of one; ids are renumbered densely in the same relative order;
 * names, attributes and annotations are kept. Inputs and params are kept
 * even when unused, so feeds and state keep their meaning.
 */
#include "passes/pass.h"

alloy_status pass_dce(ir_graph **gp, const pass_options *opts)
{
    (void)opts;
    ir_graph *g = *gp;
    uint8_t *live = al_calloc((size_t)g->nnodes + 1, 1);
    int *map = al_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    if (!live || !map) {
        al_free(live), al_free(map);
        return ir_error(g, ALLOY_ERR_OOM, "dce: out of memory");
    }
    for (int i = 0; i < g->noutputs; i++) live[g->outputs[i].node] = 1;
    for (int i = 0; i < g->nupdates; i++) live[g->updates[i].node] = 1;
    if (g->loss >= 0) live[g->loss] = 1;
    int dead = 0;
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const ir_node *n = g->nodes[i];
        if (n->nin == 0 && n->op != IR_OP_constant) live[i] = 1; /* inputs, params, state */
        if (!live[i]) {
            dead++;
            continue;
        }
        for (int j = 0; j < n->nin; j++) live[n->in[j]] = 1;
    }
    if (!dead) {
        al_free(live), al_free(map);
        return ALLOY_OK;
    }
    int n = 0; /* the live ids, in order: map is free for them */
    for (int i = 0; i < g->nnodes; i++)
        if (live[i]) map[n++] = i;
    ir_graph *out = ir_graph_reordered(g, map, n, "dce");
    al_free(live);
    al_free(map);
    if (!out) return g->status;
    ir_graph_free(g);
    *gp = out;
    return ALLOY_OK;
}
