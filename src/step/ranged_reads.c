/* ranged_reads.c - sched_mark_ranged_reads: the widened f16/bf16 products whose readers apply the range rule as they load them. */
#include "step/schedule.h"

static bool low_float(alloy_dtype dt) { return dt == ALLOY_F16 || dt == ALLOY_BF16; }

/* Which reader r is, in step_kinds.def's terms: an elementwise op, a row
 * op, a sum_squares, a column sum (ir_fuse_colsum); 0 for any other. */
static unsigned reader_kind(const ir_graph *g, const ir_node *r)
{
    if (ir_fuse_elementwise(g, r)) return RULE_LOADS_EW;
    if (ir_ops[r->op].row) return RULE_LOADS_ROW;
    if (r->op == IR_OP_sum_squares) return RULE_LOADS_SUM_SQUARES;
    return ir_fuse_colsum(g, r) ? RULE_LOADS_COLSUM : 0;
}

/* Whether node r loads its operands where a generated kernel applies the
 * range rule: its step kind's emitter loads its kind of reader so
 * (step_kinds.def); never a view's or a strided member's loads. */
static bool loads_with_rule(const ir_graph *g, const schedule *s, const ir_node *r)
{
    int k = s->step_of[r->id];
    if (k < 0 || s->members[s->member_of[r->id]].flags & (MEMBER_VIEW | MEMBER_STRIDED)) return false;
    return (sched_kind_rule_loads(s->steps[k].kind) & reader_kind(g, r)) != 0;
}

void sched_mark_ranged_reads(const ir_graph *g, schedule *s)
{
    for (int k = 0; k < s->nsteps; k++) {
        const sched_step *st = &s->steps[k];
        if (st->kind != STEP_KIND_GEMM || st->n != 2) continue;
        const ir_node *mat = g->nodes[s->members[st->first].node];
        sched_member *mc = &s->members[st->first + 1];
        const ir_node *c = g->nodes[mc->node];
        if (mat->op != IR_OP_matmul || !low_float(mat->type.dtype) || !(s->members[st->first].flags & MEMBER_RANGED))
            continue;
        if (c->op != IR_OP_cast || c->type.dtype != ALLOY_F32 || c->in[0] != mat->id || !(mc->flags & MEMBER_STORED) ||
            mc->flags & (MEMBER_CHECK | MEMBER_VIEW | MEMBER_STRIDED) || s->kept[c->id])
            continue;
        mc->flags |= MEMBER_RANGED_READ; /* cleared below if some reader loads it otherwise */
    }
    for (int i = 0; i < g->nnodes; i++) {
        const ir_node *r = g->nodes[i];
        for (int j = 0; j < r->nin; j++) {
            int m = s->member_of[r->in[j]];
            if (m >= 0 && s->members[m].flags & MEMBER_RANGED_READ && !loads_with_rule(g, s, r))
                s->members[m].flags &= (uint8_t)~MEMBER_RANGED_READ;
        }
    }
}

void sched_align_ranged_reads(const ir_graph *g, schedule *s)
{
    for (int m = 0; m < s->nmembers; m++) {
        if (!(s->members[m].flags & MEMBER_RANGED_READ)) continue;
        int v = s->members[m].node;
        const ir_type *t = &g->nodes[v]->type;
        int64_t c = t->dims[t->rank - 1]; /* narrower rows are never padded (latency-bound GEMMs): left as they are */
        if (c >= SCHED_PAD_MIN_COLS && c * (int64_t)sizeof(float) % 16 != 0 && !sched_padded(s, v))
            s->members[m].flags &= (uint8_t)~MEMBER_RANGED_READ;
    }
}
