/* gemm_epilogue.c - which gemm steps one cuBLASLt call computes whole: product, cast, bias and GELU (launch_plan.h, lp_library_epilogue). */
#include "step/launch_plan.h"

/* Whether t is a vector of n values: every dim but the last 1, the last n. */
static bool is_row_vector(const ir_type *t, int64_t n)
{
    if (t->rank < 1 || t->dims[t->rank - 1] != n) return false;
    for (int i = 0; i < t->rank - 1; i++)
        if (t->dims[i] != 1) return false;
    return true;
}

static bool library_dtype(alloy_dtype dt) { return dt == ALLOY_F16 || dt == ALLOY_BF16 || dt == ALLOY_F32; }

/* Whether stored member `aux` (GELU's input) can be cuBLASLt's GELU_AUX
 * output beside D (node result): the same type as D, the same row stride,
 * and that stride a multiple of 8 elements (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD
 * and its batch stride must be). */
static bool aux_fits(const ir_graph *g, const schedule *s, int aux, int result)
{
    int64_t ld = sched_ld(g, s, aux);
    return ir_type_eq(&g->nodes[aux]->type, &g->nodes[result]->type) && ld == sched_ld(g, s, result) && ld % 8 == 0;
}

bool lp_library_epilogue(const ir_graph *g, const schedule *s, int k, unsigned checks, lp_library *out)
{
    const sched_step *st = &s->steps[k];
    if (checks & ~LP_WIDEN || st->kind != STEP_KIND_GEMM || st->n < 2 || st->n > 3) return false;
    const sched_member *mm = &s->members[st->first], *ml = &s->members[st->first + st->n - 1];
    const ir_node *mat = g->nodes[mm->node], *lastn = g->nodes[ml->node];
    if (mat->op != IR_OP_matmul || !library_dtype(mat->type.dtype) || mat->type.rank < 2) return false;
    /* GELU in f32 and bf16 only: an f16 product at or below -65520 is -inf before GELU under the range
     * rule (docs/fusion.md), whose GELU is NaN (-inf times 0), where cuBLASLt's f32 sum gives -0; bf16's
     * range ends where f32's does, within a hair (0x1.ffp127) */
    bool gelu = lastn->op == IR_OP_gelu_tanh;
    if (gelu && mat->type.dtype == ALLOY_F16) return false;
    /* every member but the last is read by the next alone (GELU's input may be stored too), none is checked */
    for (int i = 0; i < st->n; i++) {
        unsigned f = s->members[st->first + i].flags;
        if (f & MEMBER_CHECK || (i + 1 < st->n && f & MEMBER_STORED && !(gelu && i + 2 == st->n))) return false;
    }
    if (!(ml->flags & MEMBER_STORED)) return false;
    const ir_type *ta = &g->nodes[mat->in[0]]->type;
    if (ta->dims[ta->rank - (ir_attr_i(mat, "transpose_a") ? 2 : 1)] == 0) return false; /* an empty sum: bias alone */
    lp_library lib = {.bias = -1, .result = ml->node, .d = mat->type.dtype, .gelu = gelu, .aux = -1};
    int cur = mat->id;
    for (int i = 1; i < st->n; i++) {
        const ir_node *n = g->nodes[s->members[st->first + i].node], *c = g->nodes[cur];
        if (n->op == IR_OP_cast && i == 1 && n->nin == 1 && !gelu &&
            (n->type.dtype == ALLOY_F32 || n->type.dtype == mat->type.dtype)) {
            /* D in the cast's dtype, the f32 sum rounded once into it; cuBLASLt's D is A and B's dtype or
             * f32 (f16 A and B into bf16 D, or f32 into f16, is no combination it has); widening a
             * product under the range rule when its readers apply the rule (MEMBER_RANGED_READ), or when
             * asked to drop it (LP_WIDEN) */
            if (n->type.dtype != mat->type.dtype && mm->flags & MEMBER_RANGED && !(checks & LP_WIDEN) &&
                !(s->members[st->first + i].flags & MEMBER_RANGED_READ))
                return false;
            lib.d = n->type.dtype;
        } else if (n->op == IR_OP_add && n->nin == 2 && (i == 1 || lib.d == ALLOY_F32)) {
            /* a bias after the product, or after its widening to f32 (after a narrowing cast the kernel
             * rounds twice, the library once) */
            int other = n->in[0] == cur ? n->in[1] : n->in[1] == cur ? n->in[0] : -1;
            if (other < 0 || other == cur || !ir_type_eq(&n->type, &c->type)) return false;
            const ir_type *tb = &g->nodes[other]->type;
            if (tb->dtype != lib.d || !is_row_vector(tb, c->type.dims[c->type.rank - 1]))
                return false; /* cuBLASLt's bias is D's dtype, along D's m rows */
            lib.bias = other;
        } else if (n->op == IR_OP_gelu_tanh && i + 1 == st->n && n->nin == 1 && ir_type_eq(&n->type, &c->type)) {
            /* GELU of the f32 sum (+ bias), in D's dtype; its input written beside D when stored */
            if (s->members[st->first + i - 1].flags & MEMBER_STORED) {
                if (!aux_fits(g, s, cur, n->id)) return false;
                lib.aux = cur;
            }
        } else {
            return false;
        }
        if (n->in[0] != cur && (n->nin < 2 || n->in[1] != cur)) return false;
        cur = n->id;
    }
    *out = lib;
    return true;
}
