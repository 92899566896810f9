/* grad_rules_attention.c - the gradient rule of attention: one attention_grad node that recomputes the scores blockwise, sliced into dq, dk and dv. */
#include "passes/grad_rules.h"

#define TYPE(id) (&c->g->nodes[id]->type)
#define IN(j) (n->in[j])
#define RULE(name) alloy_status name(ad_ctx *c, const ir_node *n, int dy, int *dx)
#define DONE return c->g->status

/* attention_grad(q, k, v, o, dy) with the forward's attributes gives
 * [B, H, T + 2S, D]: rows [0, T) of axis 2 are dq, [T, T + S) dk and
 * [T + S, T + 2S) dv. The forward's output o is an operand (for
 * D_i = rowsum(do * o)); the scores and probabilities are never stored. */
RULE(gr_attention)
{
    int in[5] = {IN(0), IN(1), IN(2), n->id, dy};
    int all = ad_emit(c, IR_OP_attention_grad, 5, in, n->nattrs, n->attrs, NULL);
    int64_t t = TYPE(IN(0))->dims[2], s = TYPE(IN(1))->dims[2];
    int64_t start[3] = {0, t, t + s}, end[3] = {t, t + s, t + 2 * s};
    for (int j = 0; j < 3; j++) {
        ir_attr a[3] = {ir_a_int("axis", 2), ir_a_int("start", start[j]), ir_a_int("end", end[j])};
        dx[j] = ad_emit(c, IR_OP_slice, 1, &all, 3, a, NULL);
    }
    DONE;
}
