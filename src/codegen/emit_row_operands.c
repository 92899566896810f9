/* emit_row_operands.c - a row kernel's columns and operands: the columns each thread holds, rows held in registers (16-byte chunk loads), an operand's text at a column, the team's reductions. */
#include "codegen/emit_impl.h"

/* The call reducing this thread's a_ over the row's team. */
const char *cg_row_team_reduce(const cg_row_kernel *rk, bool max)
{
    if (rk->team == 32) return max ? "alloy_warp_max(a_)" : "alloy_warp_sum(a_)";
    return max ? "alloy_block_max(a_, red_)" : "alloy_block_sum(a_, red_)";
}

/* The column of this thread's slot j (C text), into buf: lane + team * j,
 * or in chunks of vw contiguous columns (lane + team * (j / vw)) * vw + j % vw. */
void cg_row_column_of(const cg_row_kernel *rk, const char *j, char *buf, size_t len)
{
    if (rk->vw > 1)
        al_fmt(buf, len, "(lane + %d * (%s / %d)) * %d + %s %% %d", rk->team, j, rk->vw, rk->vw, j, rk->vw);
    else
        al_fmt(buf, len, "lane + %d * %s", rk->team, j);
}

/* Opens the loop over this thread's columns of the row. */
void cg_row_put_columns(cg_text *t, const cg_row_kernel *rk)
{
    char col[96];
    cg_row_column_of(rk, "j_", col, sizeof col);
    cg_put(t, "        for (int j_ = 0; j_ < %d; j_++) {\n            const int col = %s;\n", rk->cpl, col);
}

/* "f16" or "bf16" when node's value is a widened product stored before its
 * range rule (MEMBER_RANGED_READ: sched_mark_ranged_reads), whose loads
 * apply the rule of that dtype; else NULL. */
static const char *ranged_row(const cg_row_kernel *rk, int node)
{
    int m = rk->s->member_of[node];
    if (m < 0 || !(rk->s->members[m].flags & MEMBER_RANGED_READ)) return NULL;
    return rk->g->nodes[rk->g->nodes[node]->in[0]]->type.dtype == ALLOY_F16 ? "f16" : "bf16";
}

/* Loads parameter k's row into this thread's l<k>_ (its chunks, one
 * 16-byte access each; vw > 1) unless an earlier stage did. */
void cg_row_load(cg_text *t, cg_row_kernel *rk, int k)
{
    if (rk->loaded >> k & 1) return;
    rk->loaded |= 1ull << k;
    alloy_dtype dt = rk->g->nodes[rk->ps.at[k].node]->type.dtype;
    cg_put(rk->decl, "        alignas(16) %s l%d_[%d];\n", cg_storage(dt), k, rk->cpl);
    char lim[32];
    if (rk->limited) al_fmt(lim, sizeof lim, "lim_"); /* past the live columns: never read (cg_row_limited) */
    else al_fmt(lim, sizeof lim, "%lldll", (long long)rk->C);
    cg_put(t, "        for (int c_ = 0; c_ < %d; c_++) {\n            const int col0_ = (lane + %d * c_) * %d;\n"
              "            if (col0_ < %s) alloy_vcopy<%d>(l%d_ + c_ * %d, p%d + row * %lldll + col0_);\n        }\n",
           rk->cpl / rk->vw, rk->team, rk->vw, lim, (int)alloy_dtype_size(dt) * rk->vw, k, rk->vw, k,
           (long long)rk->C);
    /* a widened product stored before its range rule: the rule once on the held row (ranged_row) */
    const char *rule = ranged_row(rk, rk->ps.at[k].node);
    if (rule)
        cg_put(t, "        for (int e_ = 0; e_ < %d; e_++) l%d_[e_] = alloy_range_%s(l%d_[e_]);\n", rk->cpl, k, rule, k);
}

/* The index of column `col` (C text) of this thread's row in node's value, into buf. */
void cg_row_element_index(const cg_row_kernel *rk, int node, const char *col, char *buf, size_t len)
{
    /* a padded value's rows lie its row stride apart (sched_pad; only steps with rows along the last axis read them) */
    int64_t ld = sched_padded(rk->s, node) ? rk->s->row_stride[node] : rk->C;
    if (rk->inner == 1) al_fmt(buf, len, "row * %lldll + %s", (long long)ld, col);
    else /* rows along an inner axis: row = outer * inner + position after the axis */
        al_fmt(buf, len, "(row / %lldll) * %lldll + (long long)(%s) * %lldll + row %% %lldll", (long long)rk->inner,
               (long long)(rk->C * rk->inner), col, (long long)rk->inner, (long long)rk->inner);
}

/* Appends the text of operand q of row op x at column variable `col`, slot
 * variable `slot` (a row-shaped one from this thread's l<reg>_ when reg >=
 * 0); false when its shape is one this kernel does not read. */
bool cg_row_operand_at(cg_text *t, cg_row_kernel *rk, const ir_node *x, int q, const char *col, const char *slot, int reg)
{
    int o = x->in[q];
    const schedule *s = rk->s;
    if (s->step_of[o] == (int)(rk->st - s->steps)) {
        cg_put(t, rk->stream ? "r%d(%s)" : "r%d[%s]", s->member_of[o], slot);
        return true;
    }
    const ir_type *ty = &rk->g->nodes[o]->type;
    int64_t n = ir_numel(ty);
    char idx[160];
    if (n == rk->rows * rk->C) cg_row_element_index(rk, o, col, idx, sizeof idx);
    else if (n == rk->C && ty->dims[ty->rank - 1] == rk->C) al_fmt(idx, sizeof idx, "%s", col);
    else if (n == rk->rows) al_fmt(idx, sizeof idx, "row");
    else if (n == 1) al_fmt(idx, sizeof idx, "0");
    else return false;
    char pk[16];
    al_fmt(pk, sizeof pk, "p%d", cg_param_of(&rk->ps, CG_PARAM_NODE, o, false, 0));
    if (reg >= 0 && n == rk->rows * rk->C) al_fmt(pk, sizeof pk, "l%d_", reg), al_fmt(idx, sizeof idx, "%s", slot);
    /* a widened product stored before its range rule: the rule as it is loaded from memory (a row held in
     * registers had it applied once, cg_row_load) */
    const char *rule = reg >= 0 && n == rk->rows * rk->C ? NULL : ranged_row(rk, o);
    if (rule) cg_put(t, "alloy_range_%s", rule);
    cg_put(t, "(");
    cg_load(t, ty->dtype, pk, idx);
    cg_put(t, ")");
    return true;
}
