/* emit_row_stream.c - the streaming form of row kernels for rows too long to hold: no per-thread arrays, a softmax's max and sum in one online pass, values computed again where read. */
#include <string.h>

#include "codegen/emit_impl.h"

/* Whether the step's row kernel can stream (cg_row_kernel's stream): no
 * column sums (a thread's sums of its columns are held), and every row
 * program writes each S and V slot once and reads no V in a MAP. */
bool cg_row_streamable(const cg_row_kernel *rk)
{
    const schedule *s = rk->s;
    for (int q = rk->st->first_part; q < rk->st->first_part + rk->st->nparts; q++) {
        const sched_part *part = &s->parts[q];
        if (part->kind == PART_COLSUM) return false;
        if (part->kind != PART_OP) continue;
        const ir_row_program *p = ir_ops[rk->g->nodes[s->members[part->first].node]->op].row;
        uint64_t scalars = 0, vectors = 0;
        for (int i = 0; i < p->nstages; i++) {
            const ir_row_stage *sg = &p->stages[i];
            bool vec = sg->kind == ROW_MAP;
            if (sg->kind != ROW_MAX && sg->kind != ROW_SUM && sg->kind != ROW_LET && !vec) continue;
            uint64_t *seen = vec ? &vectors : &scalars;
            if (sg->slot < 0 || sg->slot >= 64 || (*seen >> sg->slot & 1) || (vec && strstr(sg->expr, "V("))) return false;
            *seen |= 1ull << sg->slot;
        }
    }
    return true;
}

/* Whether stages i, i + 1, i + 2 of p are MAX(a, E), MAP(v, exp(E - S(a))),
 * SUM(b, V(v)): a softmax's denominator, which streams in one pass. */
bool cg_row_online_softmax(const ir_row_program *p, int i)
{
    if (i + 2 >= p->nstages) return false;
    const ir_row_stage *mx = &p->stages[i], *map = &p->stages[i + 1], *sum = &p->stages[i + 2];
    if (mx->kind != ROW_MAX || map->kind != ROW_MAP || sum->kind != ROW_SUM) return false;
    char want[256], v[16];
    al_fmt(want, sizeof want, "exp(%s - S(%d))", mx->expr, mx->slot);
    al_fmt(v, sizeof v, "V(%d)", map->slot);
    return strlen(mx->expr) < 200 && strcmp(map->expr, want) == 0 && strcmp(sum->expr, v) == 0;
}

/* Stages i..i + 2 of member m's program (cg_row_online_softmax) in one
 * pass: each thread keeps a running max m_ and the sum a_ of exp(x - m_),
 * rescaling the sum when the max grows; the team's max is S(a), and S(b)
 * the sum of the threads' sums rescaled to it. A -inf column adds nothing
 * (exp(-inf - m_) is 0) unless the whole row is -inf, which gives NaN as
 * the two-pass form does; +inf and NaN give NaN as there. */
void cg_row_put_online_softmax(cg_text *t, const cg_row_kernel *rk, int m, const ir_row_program *p, int i)
{
    const ir_row_stage *mx = &p->stages[i], *sum = &p->stages[i + 2];
    char cb[32];
    const char *bound = cg_row_column_bound(rk, rk->g->nodes[rk->s->members[m].node], cb, sizeof cb);
    cg_put(t, "        { T m_ = -(T)ALLOY_INF, a_ = 0;\n");
    cg_row_put_columns(t, rk);
    cg_put(t, "            if (col >= %s) continue;\n            const T x_ = (T)(%s);\n"
              "            if (x_ > m_) a_ = a_ * exp(m_ - x_) + exp(x_ - x_), m_ = x_;\n"
              "            else if (!(x_ == -(T)ALLOY_INF)) a_ += exp(x_ - m_);\n        }\n"
              "        s%d_%d = alloy_block_max(m_, red_);\n        a_ = a_ * exp(m_ - s%d_%d);\n"
              "        s%d_%d = alloy_block_sum(a_, red_); }\n",
           bound, mx->expr, m, mx->slot, m, mx->slot, m, sum->slot);
}

/* A streaming program's OUT stage sg for member m: stored by a pass over
 * the row when the member is stored; the lambda r<m>(slot) computing it
 * at a column when a later part reads it. */
void cg_row_stream_out(cg_text *t, cg_row_kernel *rk, int m, const ir_row_stage *sg)
{
    const sched_member *mb = &rk->s->members[m];
    const ir_node *x = rk->g->nodes[mb->node];
    char v[16], e[32];
    al_fmt(v, sizeof v, "v%d", m);
    /* a causal row op: 0 past the live columns, its expression not evaluated there */
    al_fmt(e, sizeof e, "%s", rk->causal && ir_row_causal(rk->g, x) ? "col >= lim_ ? (T)0 : " : "");
    if (mb->flags & MEMBER_STORED) {
        char idx[160];
        cg_row_element_index(rk, x->id, "col", idx, sizeof idx);
        cg_row_put_columns(t, rk);
        cg_put(t, "            if (col >= %lldll) continue;\n            T v%d = %s(T)(%s);\n", (long long)rk->C, m, e, sg->expr);
        cg_apply_flags(t, x->type.dtype, rk->wide, mb->flags, v);
        cg_put(t, "            p%d[%s] = ", cg_param_of(&rk->ps, CG_PARAM_NODE, x->id, true, 0), idx);
        cg_store(t, x->type.dtype, rk->wide, v);
        cg_put(t, ";\n        }\n");
    }
    if (mb->flags & MEMBER_SPILLED) {
        cg_put(t, "        const auto r%d = [&](int j_) -> T {\n            const int col = lane + %d * j_;\n"
                  "            T v%d = %s(T)(%s);\n", m, rk->team, m, e, sg->expr);
        cg_apply_flags(t, x->type.dtype, rk->wide, mb->flags, v);
        cg_put(t, "            return v%d;\n        };\n", m);
    }
}

/* An elementwise part of a streaming row kernel: a pass over the row
 * storing its stored members (and checking those checked), when it has
 * any; for each member a later part reads, the lambda r<m>(slot)
 * computing the part again at that column. */
void cg_row_stream_part(cg_text *t, cg_row_kernel *rk, const sched_part *part, const ir_type *space)
{
    const schedule *s = rk->s;
    cg_ew_part ep = {.g = rk->g, .s = s, .step = rk->st, .first = part->first, .n = part->n, .space = space,
                     .wide = part->wide, .product = -1, .ps = &rk->ps, .e = "e_", .slot = "j_", .stream = true,
                     .checks = rk->checks, .covered = rk->covered};
    bool pass = false;
    for (int m = part->first; m < part->first + part->n; m++)
        pass |= (s->members[m].flags & (MEMBER_STORED | MEMBER_CHECK)) != 0;
    if (pass) {
        char cb[32];
        cg_row_put_columns(t, rk);
        cg_put(t, "            if (col >= %s) continue;\n            const long long e_ = row * %lldll + col;\n",
               cg_row_ew_bound(rk, part, cb, sizeof cb), (long long)rk->C);
        cg_emit_members(t, &ep);
        cg_put(t, "        }\n");
    }
    ep.quiet = true;
    for (int m = part->first; m < part->first + part->n; m++) {
        if (!(s->members[m].flags & MEMBER_SPILLED)) continue;
        cg_put(t, "        const auto r%d = [&](int j_) -> T {\n            const int col = lane + %d * j_;\n"
                  "            const long long e_ = row * %lldll + col;\n",
               m, rk->team, (long long)rk->C);
        cg_emit_members(t, &ep);
        cg_put(t, "            return v%d;\n        };\n", m);
    }
}
