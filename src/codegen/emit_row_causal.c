/* emit_row_causal.c - causal rows in row kernels: which members are 0 past a row's live columns, the steps that read no column past them, the bounds of their stages and parts. */
#include <math.h>

#include "codegen/emit_impl.h"

/* Whether node (a member of step st) is exactly 0 past each row's live
 * columns: a causal row op, a causal_mask with value +0 (a gradient's:
 * its expression gives 0 there without reading its operand), or a cast
 * between float dtypes of one. */
static bool zero_past_live(const ir_graph *g, const schedule *s, const sched_step *st, int node)
{
    const ir_node *n = g->nodes[node];
    if (s->step_of[node] != (int)(st - s->steps)) return false;
    if (n->op == IR_OP_causal_mask) return ir_attr_f(n, "value") == 0 && !signbit(ir_attr_f(n, "value"));
    if (ir_ops[n->op].row) return ir_row_causal(g, n);
    return n->op == IR_OP_cast && n->nin == 1 && ir_is_float(n->type.dtype) &&
           ir_is_float(g->nodes[n->in[0]]->type.dtype) && zero_past_live(g, s, st, n->in[0]);
}

/* Whether row step st needs no column past a row's live ones but to store
 * zeros there: it has a causal row op, its other row ops are causal_masks
 * (their masked columns are read by causal ops alone), every value it
 * stores is zero_past_live, no column sums, and each elementwise part is
 * all zero_past_live members (computed at every column, from the causal
 * ops' zeros) or none (computed at the live ones only: only causal ops
 * read them). Its row-shaped operands are then loaded only up to lim_. */
bool cg_row_limited(const ir_graph *g, const schedule *s, const sched_step *st)
{
    bool any = false;
    for (int q = st->first_part; q < st->first_part + st->nparts; q++) {
        const sched_part *part = &s->parts[q];
        if (part->kind == PART_COLSUM) return false;
        int zeros = 0;
        for (int m = part->first; m < part->first + part->n; m++) {
            const ir_node *x = g->nodes[s->members[m].node];
            bool zero = zero_past_live(g, s, st, x->id);
            if (part->kind == PART_OP) {
                if (ir_row_causal(g, x)) any = true;
                else if (x->op != IR_OP_causal_mask) return false;
            }
            if ((s->members[m].flags & MEMBER_STORED) && !zero) return false;
            zeros += zero;
        }
        if (part->kind == PART_EW && zeros && zeros != part->n) return false;
    }
    return any;
}

double cg_row_read_share(const ir_graph *g, const schedule *s, int k)
{
    const sched_step *st = &s->steps[k];
    const ir_type *sp = st->kind == STEP_KIND_OP ? &g->nodes[g->nodes[st->pos]->in[0]]->type : &st->space;
    if ((st->kind != STEP_KIND_ROW && st->kind != STEP_KIND_OP) || sp->rank < 2 || !cg_row_limited(g, s, st)) return 1;
    double q = (double)sp->dims[sp->rank - 2], c = (double)sp->dims[sp->rank - 1];
    return c > 0 ? (q * (q + 1) / 2 + q * (c - q)) / (q * c) : 1; /* live columns: row i of q sees i + c - q + 1 */
}

/* The bound of member x's columns in its stages (C text, into buf): lim_ for
 * a causal row op, or a causal_mask of a limited step that is not 0 past
 * the live columns (read there by no one); else C. */
const char *cg_row_column_bound(const cg_row_kernel *rk, const ir_node *x, char *buf, size_t len)
{
    if (rk->causal && (ir_row_causal(rk->g, x) || (rk->limited && x->op == IR_OP_causal_mask &&
                                                   !zero_past_live(rk->g, rk->s, rk->st, x->id))))
        return "lim_";
    al_fmt(buf, len, "%lldll", (long long)rk->C);
    return buf;
}

/* The bound of an elementwise part's columns (C text, into buf): lim_ in a
 * limited step for a part of no zero_past_live member (only causal row ops
 * read it, at the live columns); else C. */
const char *cg_row_ew_bound(const cg_row_kernel *rk, const sched_part *part, char *buf, size_t len)
{
    if (rk->limited && !zero_past_live(rk->g, rk->s, rk->st, rk->s->members[part->first].node)) return "lim_";
    al_fmt(buf, len, "%lldll", (long long)rk->C);
    return buf;
}
