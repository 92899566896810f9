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
    ir_graph *out = ir_graph_new(g->name);
    int ins_small[16];
    for (int i = 0; out && i < g->nnodes && !out->status; i++) {
        const ir_node *n = g->nodes[i];
        if (!live[i]) continue;
        int *ins = n->nin <= 16 ? ins_small : al_malloc(sizeof(int) * (size_t)n->nin);
        if (!ins) {
            ir_error(out, ALLOY_ERR_OOM, "dce: out of memory");
            break;
        }
        for (int j = 0; j < n->nin; j++) ins[j] = map[n->in[j]];
        ir_node *m = ir_add_node(out, n->op, n->nin, ins, n->nattrs, n->attrs, &n->type, n->name);
        if (ins != ins_small) al_free(ins);
        if (!m) break;
        m->amp = n->amp;
        m->flags = n->flags;
        m->group = n->group;
        map[i] = m->id;
    }
    for (int i = 0; out && i < g->noutputs && !out->status; i++)
        ir_add_output(out, g->outputs[i].name, map[g->outputs[i].node]);
    for (int i = 0; out && i < g->nupdates && !out->status; i++)
        ir_add_update(out, g->updates[i].name, map[g->updates[i].node]);
    if (out && g->loss >= 0) out->loss = map[g->loss];
    al_free(live);
    al_free(map);
    if (!out || out->status) {
        alloy_status st = out ? out->status : ALLOY_ERR_OOM;
        ir_error(g, st, "dce: %s", out ? out->error : "out of memory");
        ir_graph_free(out);
        return st;
    }
    ir_graph_free(g);
    *gp = out;
    return ALLOY_OK;
}
