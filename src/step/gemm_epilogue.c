/* gemm_epilogue.c - which gemm steps cuBLASLt's epilogue computes whole (launch_plan.h, lp_bias_epilogue). */
#include "step/launch_plan.h"

/* Whether t is a vector of n values: every dim but the last 1, the last n. */
static bool is_row_vector(const ir_type *t, int64_t n)
{
    if (t->rank < 1 || t->dims[t->rank - 1] != n) return false;
    for (int i = 0; i < t->rank - 1; i++)
        if (t->dims[i] != 1) return false;
    return true;
}

bool lp_bias_epilogue(const ir_graph *g, const schedule *s, int k, unsigned checks, int *bias)
{
    const sched_step *st = &s->steps[k];
    if (checks || st->kind != STEP_KIND_GEMM || st->n != 2) return false;
    const sched_member *mm = &s->members[st->first], *ma = &s->members[st->first + 1];
    const ir_node *mat = g->nodes[mm->node], *add = g->nodes[ma->node];
    if (mat->op != IR_OP_matmul || add->op != IR_OP_add || add->nin != 2) return false;
    if (mm->flags & (MEMBER_STORED | MEMBER_CHECK) || !(ma->flags & MEMBER_STORED) || ma->flags & MEMBER_CHECK)
        return false;
    const ir_type *to = &mat->type;
    alloy_dtype dt = to->dtype;
    if (dt != ALLOY_F16 && dt != ALLOY_BF16 && dt != ALLOY_F32) return false;
    if (to->rank < 2 || !ir_type_eq(&add->type, to)) return false;
    const ir_type *ta = &g->nodes[mat->in[0]]->type;
    if (ta->dims[ta->rank - (ir_attr_i(mat, "transpose_a") ? 2 : 1)] == 0) return false; /* an empty sum: bias alone */
    int other = add->in[0] == mat->id ? add->in[1] : add->in[1] == mat->id ? add->in[0] : -1;
    if (other < 0 || other == mat->id) return false;
    const ir_type *tb = &g->nodes[other]->type;
    if (tb->dtype != dt || !is_row_vector(tb, to->dims[to->rank - 1])) return false;
    *bias = other;
    return true;
}
