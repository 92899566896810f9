/* emit_row_colsum.c - column sums of row steps: per thread in registers over its rows, per block in a partial row, the partial rows added by the last blocks in the same launch. */
#include "codegen/emit_impl.h"

/* ---- column sums (PART_COLSUM): per team in registers, per block, then per column ---- */

/* The blocks' partial rows are added in the same launch, counted done on
 * block counters (CG_PARAM_COUNTER, zeroed when the step is loaded, set
 * back to 0 by the block that counts last): up to COLSUM_ONE_LEVEL blocks,
 * the last block to finish adds them all; more, in groups of `group`
 * (ceil(sqrt(blocks))) blocks, the last block of each group adds its
 * group's rows into a group row (after the blocks' rows in the scratch),
 * and the last of those adds the group rows. Each sum is added in a fixed
 * order (rows in block order, then groups in order) whichever block
 * finishes last, so its bits are the same run to run. */
enum { COLSUM_ONE_LEVEL = 32 };

cg_row_colsum_plan cg_row_colsum_plan_of(int64_t blocks)
{
    cg_row_colsum_plan c = {.blocks = blocks, .group = blocks, .groups = 1};
    if (blocks > COLSUM_ONE_LEVEL) {
        while (c.group > 1 && (c.group - 1) * (c.group - 1) >= blocks) c.group--;
        c.groups = (blocks + c.group - 1) / c.group;
    }
    return c;
}

/* Partial rows in a column sum's scratch: the blocks' and the groups'. */
int64_t cg_row_colsum_rows(const cg_row_colsum_plan *c) { return c->blocks + (c->groups > 1 ? c->groups : 0); }

/* Adds this row's columns of column sum member m's operand to the
 * thread's sums cs<m>[] (declared before the row loop). */
bool cg_row_colsum_add(cg_text *t, cg_row_kernel *rk, int m)
{
    const ir_node *x = rk->g->nodes[rk->s->members[m].node];
    int o = x->in[0], reg = -1; /* a row from outside: its chunks in registers, as the stages read them */
    if (rk->vw > 1 && rk->s->step_of[o] != (int)(rk->st - rk->s->steps) &&
        ir_numel(&rk->g->nodes[o]->type) == rk->rows * rk->C &&
        (reg = cg_param_of(&rk->ps, CG_PARAM_NODE, o, false, 0)) < 64)
        cg_row_load(t, rk, reg);
    else
        reg = -1;
    cg_row_put_columns(t, rk);
    cg_put(t, "            if (col < %lldll) cs%d[j_] += ", (long long)rk->C, m);
    if (!cg_row_operand_at(t, rk, x, 0, "col", "j_", reg)) return false;
    cg_put(t, ";\n        }\n");
    return true;
}

/* Appends the counting of this block done on counter p<cnt>[idx] (C text)
 * among `parts` (C text, an unsigned value) blocks, after the stores
 * before it: the blocks but the last return; the last sets the counter
 * back to 0. */
static void put_counted(cg_text *t, int cnt, const char *idx, const char *parts)
{
    char last[160];
    al_fmt(last, sizeof last, "%s - 1u", parts);
    cg_put_count_done(t, cnt, idx, last, "    ");
    cg_put(t, "    if (!last_) return;\n    __threadfence();\n");
}

/* Appends, for each column sum m in ms[n] (scratch p<kp[i]>, result
 * p<ko[i]>), the adding of partial rows [lo, hi) (C text) of its scratch
 * per column into row `to` of the scratch (C text) or, with `to` NULL,
 * into its result in its dtype; a thread per column, rows in order, read
 * through volatile (other blocks wrote them). */
static void put_rows_added(cg_text *t, const cg_row_kernel *rk, const int *ms, int n, const int *kp, const int *ko,
                           const char *lo, const char *hi, const char *to)
{
    for (int i = 0; i < n; i++) {
        const ir_node *x = rk->g->nodes[rk->s->members[ms[i]].node];
        cg_put(t, "    for (long long c_ = threadIdx.x; c_ < %lldll; c_ += blockDim.x) {\n        T a_ = 0;\n"
                  "        for (long long b_ = %s; b_ < %s; b_++) a_ += ((const volatile %s *)p%d)[b_ * %lldll + c_];\n",
               (long long)rk->C, lo, hi, x->type.dtype == ALLOY_F64 ? "double" : "float", kp[i], (long long)rk->C);
        if (to) {
            cg_put(t, "        p%d[(%s) * %lldll + c_] = a_;\n    }\n", kp[i], to, (long long)rk->C);
            continue;
        }
        cg_put(t, "        p%d[c_] = ", ko[i]);
        cg_store(t, x->type.dtype, rk->wide, "a_");
        cg_put(t, ";\n    }\n");
    }
}

/* Text after the row loop for the n stored column sums ms[] of the step
 * (their sums cs<m>[] at 0 before it): the block's sums (its warps' added in a
 * tree in shared memory) to its partial row p[block * C + col], then the
 * partial rows added per column by the last blocks (cg_row_colsum_plan). */
void cg_row_colsum_frame(cg_text *post, cg_row_kernel *rk, const int *ms, int n, const cg_row_colsum_plan *c)
{
    int kp[IR_MAX_COLSUMS], ko[IR_MAX_COLSUMS];
    bool warp = rk->team == 32;
    char col[96];
    cg_row_column_of(rk, "j_", col, sizeof col); /* the columns this thread summed (cg_row_put_columns') */
    cg_put(post, "    __shared__ unsigned last_;\n");
    if (warp) cg_put(post, "    __shared__ T cst_[%d][32];\n    const int w_ = threadIdx.x >> 5;\n", CG_ROW_WARPS);
    for (int i = 0; i < n; i++) {
        int m = ms[i], node = rk->s->members[m].node;
        kp[i] = cg_param_of(&rk->ps, CG_PARAM_ROWS, node, true, cg_row_colsum_rows(c) * rk->C);
        ko[i] = cg_param_of(&rk->ps, CG_PARAM_NODE, node, true, 0);
        cg_put(post, "    for (int j_ = 0; j_ < %d; j_++) {\n        const int col = %s;\n", rk->cpl, col);
        if (warp)
            cg_put(post, "        __syncthreads();\n        cst_[w_][lane] = cs%d[j_];\n"
                         "        for (int h_ = %d; h_ > 0; h_ >>= 1) {\n            __syncthreads();\n"
                         "            if (w_ < h_) cst_[w_][lane] += cst_[w_ + h_][lane];\n        }\n"
                         "        if (w_ == 0 && col < %lldll) p%d[(long long)blockIdx.x * %lldll + col] = cst_[0][lane];\n    }\n",
                   m, CG_ROW_WARPS / 2, (long long)rk->C, kp[i], (long long)rk->C);
        else
            cg_put(post, "        if (col < %lldll) p%d[(long long)blockIdx.x * %lldll + col] = cs%d[j_];\n    }\n",
                   (long long)rk->C, kp[i], (long long)rk->C, m);
    }
    int cnt = cg_param_of(&rk->ps, CG_PARAM_COUNTER, rk->s->members[ms[0]].node, true, c->groups + (c->groups > 1));
    char lo[64], hi[128], parts[80], to[48];
    cg_put(post, "    const long long grp_ = blockIdx.x / %lldll;\n", (long long)c->group);
    al_fmt(lo, sizeof lo, "grp_ * %lldll", (long long)c->group);
    al_fmt(hi, sizeof hi, "(grp_ + 1) * %lldll < %lldll ? (grp_ + 1) * %lldll : %lldll", (long long)c->group,
           (long long)c->blocks, (long long)c->group, (long long)c->blocks);
    int64_t tail = c->blocks - (c->groups - 1) * c->group; /* the last group's blocks */
    al_fmt(parts, sizeof parts, "(grp_ < %lldll ? %lldu : %lldu)", (long long)(c->groups - 1), (long long)c->group,
           (long long)tail);
    cg_put(post, "    const long long lo_ = %s, hi_ = %s;\n", lo, hi);
    put_counted(post, cnt, "grp_", parts);
    if (c->groups == 1) {
        put_rows_added(post, rk, ms, n, kp, ko, "lo_", "hi_", NULL);
        return;
    }
    al_fmt(to, sizeof to, "%lldll + grp_", (long long)c->blocks);
    put_rows_added(post, rk, ms, n, kp, ko, "lo_", "hi_", to);
    al_fmt(lo, sizeof lo, "%lldll", (long long)c->blocks);
    al_fmt(hi, sizeof hi, "%lldll", (long long)(c->blocks + c->groups));
    al_fmt(parts, sizeof parts, "%lldu", (long long)c->groups);
    al_fmt(to, sizeof to, "%lld", (long long)c->groups);
    put_counted(post, cnt, to, parts);
    put_rows_added(post, rk, ms, n, kp, ko, lo, hi, NULL);
}
