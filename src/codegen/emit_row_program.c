/* emit_row_program.c - row programs from the op table in row kernels: the first stages programs share, the accessor macros around a program, each program's slots and stages. */
#include <string.h>

#include "codegen/emit_impl.h"

/* ---- programs sharing their first stages ---- */

/* Whether expr mentions accessor name(q), e.g. "X(1)" or "AT(1,". */
static bool mentions(const char *expr, const char *name, int q)
{
    char a[16], b[16];
    al_fmt(a, sizeof a, "%s(%d)", name, q);
    al_fmt(b, sizeof b, "%s(%d,", name, q);
    return strstr(expr, a) || strstr(expr, b);
}

/* Whether stage sg of op x reads the same values as it does for op y:
 * every operand it names is the same node, and it names no attribute. */
static bool same_operands(const ir_row_stage *sg, const ir_node *x, const ir_node *y)
{
    static const char *const names[] = {"X", "AT", "INDEX", "SCALAR", "HAS", "W"};
    if (strstr(sg->expr, "P(")) return false;
    const char *rx = ir_ops[x->op].row->roles, *ry = ir_ops[y->op].row->roles;
    int nq = (int)(strlen(rx) > strlen(ry) ? strlen(rx) : strlen(ry));
    for (int q = 0; q < nq; q++) {
        bool same = q < x->nin && q < y->nin && x->in[q] == y->in[q] && q < (int)strlen(rx) && q < (int)strlen(ry) &&
                    rx[q] == ry[q];
        if (same) continue;
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
            if (mentions(sg->expr, names[k], q)) return false;
    }
    return true;
}

/* Whether stages [from, n) of p write the slot stage sg wrote. */
static bool rewritten(const ir_row_program *p, int from, const ir_row_stage *sg)
{
    bool vec = sg->kind == ROW_MAP;
    for (int i = from; i < p->nstages; i++) {
        const ir_row_stage *o = &p->stages[i];
        if (o->slot == sg->slot && (o->kind == ROW_MAP) == vec && o->kind != ROW_OUT && o->kind != ROW_RESULT &&
            o->kind != ROW_WEIGHT && o->kind != ROW_KEEP)
            return true;
    }
    return false;
}

/* The stages row op member m can take from an earlier row op of the step
 * instead of computing them: the longest prefix of MAX, SUM, LET and MAP
 * stages both programs have alike (same kind, slot, expression, operands)
 * and neither writes again. Returns its length, the member in *from. */
static int shared_prefix(const cg_row_kernel *rk, int m, int *from)
{
    const schedule *s = rk->s;
    const ir_node *x = rk->g->nodes[s->members[m].node];
    const ir_row_program *px = ir_ops[x->op].row;
    int best = 0;
    for (int q = rk->st->first_part; q < rk->st->first_part + rk->st->nparts; q++) {
        const sched_part *part = &s->parts[q];
        if (part->kind != PART_OP) continue;
        if (part->first >= m) break;
        const ir_node *y = rk->g->nodes[s->members[part->first].node];
        const ir_row_program *py = ir_ops[y->op].row;
        int n = 0;
        while (n < px->nstages && n < py->nstages) {
            const ir_row_stage *a = &px->stages[n], *b = &py->stages[n];
            if (a->kind != b->kind || a->slot != b->slot || strcmp(a->expr, b->expr) != 0) break;
            if (a->kind == ROW_OUT || a->kind == ROW_RESULT || a->kind == ROW_WEIGHT || a->kind == ROW_KEEP ||
                !same_operands(a, x, y))
                break;
            if (rewritten(px, n + 1, a) || rewritten(py, n + 1, b)) break;
            n++;
        }
        if (n > best) best = n, *from = part->first;
    }
    return best;
}

/* ---- one program ---- */

/* The parameter whose row this thread holds in registers for operand q of
 * row op x (program stages from `from` on), or -1: a row-shaped operand
 * from outside the step, with vw > 1, held already or read by X in a
 * stage (one read by AT alone stays in memory: a column per row). */
static int register_row(cg_row_kernel *rk, const ir_node *x, int q, int from)
{
    const ir_row_program *prog = ir_ops[x->op].row;
    int o = x->in[q];
    if (rk->vw <= 1 || rk->s->step_of[o] == (int)(rk->st - rk->s->steps) ||
        ir_numel(&rk->g->nodes[o]->type) != rk->rows * rk->C)
        return -1;
    int k = cg_param_of(&rk->ps, CG_PARAM_NODE, o, false, 0);
    if (k >= 64) return -1;
    bool read = rk->loaded >> k & 1;
    for (int i = from; i < prog->nstages && !read; i++) read = mentions(prog->stages[i].expr, "X", q);
    return read ? k : -1;
}

/* Appends the accessor macros of row op x's program (ops.def: X, V, S, N,
 * COL, P, HAS, INDEX, AT, SCALAR, ROWS, POS, DIM) for member m, whose
 * first `shared` stages' slots are member `from`'s; reg[q]: the parameter
 * operand q reads from registers (register_row), or -1. */
static bool accessors(cg_text *t, cg_row_kernel *rk, const ir_node *x, int m, int shared, int from, int *reg)
{
    const ir_row_program *prog = ir_ops[x->op].row;
    ir_row_summary sum = ir_row_summarize(prog);
    cg_put(t, "#define X(q) X_##q\n#define AT(q, c) AT_##q(c)\n#define INDEX(q) INDEX_##q\n#define SCALAR(q) SCALAR_##q\n"
              "#define HAS(q) HAS_##q\n#define W(q) W_##q\n#define P(k) P_##k\n#define POS(k) POS_##k\n#define DIM(k) DIM_##k\n"
              "#define V(k) V_##k\n#define S(k) S_##k\n#define N ((T)%lldll)\n#define COL col\n#define ROWS (%lldll)\n",
           (long long)rk->C, (long long)rk->rows);
    for (int k = 0; k < sum.nscalars; k++) {
        int owner = m;
        for (int i = 0; i < shared; i++)
            if (prog->stages[i].kind != ROW_MAP && prog->stages[i].slot == k) owner = from;
        cg_put(t, "#define S_%d s%d_%d\n", k, owner, k);
    }
    for (int k = 0; k < sum.nvectors; k++) {
        int owner = m;
        for (int i = 0; i < shared; i++)
            if (prog->stages[i].kind == ROW_MAP && prog->stages[i].slot == k) owner = from;
        if (rk->stream) { /* the slot's MAP expression (cg_row_streamable: written once, reading no V) */
            const char *e = "0";
            for (int i = 0; i < prog->nstages; i++)
                if (prog->stages[i].kind == ROW_MAP && prog->stages[i].slot == k) e = prog->stages[i].expr;
            cg_put(t, "#define V_%d ((T)(%s))\n", k, e);
            continue;
        }
        cg_put(t, "#define V_%d rv%d_%d[j_]\n", k, owner, k);
    }
    for (int q = 0; q < (int)strlen(prog->roles); q++) {
        reg[q] = -1;
        cg_put(t, "#define HAS_%d %d\n", q, q < x->nin);
        if (q >= x->nin) { /* absent: read only behind HAS(q), which is 0 */
            cg_put(t, "#define X_%d ((T)0)\n#define AT_%d(c) ((T)0)\n#define INDEX_%d 0ll\n#define SCALAR_%d ((T)0)\n"
                      "#define W_%d ((T)0)\n", q, q, q, q, q);
            continue;
        }
        char role = prog->roles[q];
        if (role == 'w') { /* one value per row: a stored [.., 1] tensor (never a member of this step: groups.c) */
            cg_put(t, "#define W_%d ", q);
            if (rk->s->step_of[x->in[q]] == (int)(rk->st - rk->s->steps) ||
                ir_numel(&rk->g->nodes[x->in[q]]->type) != rk->rows || !cg_row_operand_at(t, rk, x, q, "0", "0", -1))
                return false;
            cg_put(t, "\n");
            continue;
        }
        if (role == 'i') {
            cg_put(t, "#define INDEX_%d ((long long)p%d[%s])\n", q,
                   cg_param_of(&rk->ps, CG_PARAM_NODE, x->in[q], false, 0),
                   ir_numel(&rk->g->nodes[x->in[q]]->type) == 1 ? "0" : "row");
            continue;
        }
        if (role == 's') {
            cg_put(t, "#define SCALAR_%d ", q);
            if (!cg_row_operand_at(t, rk, x, q, "0", "0", -1)) return false;
            cg_put(t, "\n");
            continue;
        }
        reg[q] = register_row(rk, x, q, shared);
        cg_put(t, "#define X_%d ", q);
        if (!cg_row_operand_at(t, rk, x, q, "col", "j_", reg[q])) return false;
        /* AT(q, c): the thread holding column c contributes it, the team sums */
        char cc[96], bound[32] = "";
        cg_row_column_of(rk, "jj_", cc, sizeof cc);
        if (rk->stream) al_fmt(bound, sizeof bound, " && cc_ < %lld", (long long)rk->C); /* a column read, not held */
        cg_put(t, "\n#define AT_%d(c) ([&]() -> T { T a_ = 0; for (int jj_ = 0; jj_ < %d; jj_++) {"
                  " const int cc_ = %s; if (cc_ == (int)(c)%s) a_ += ", q, rk->cpl, cc, bound);
        if (!cg_row_operand_at(t, rk, x, q, "cc_", "jj_", reg[q])) return false;
        cg_put(t, "; } return %s; }())\n", cg_row_team_reduce(rk, false));
    }
    int k = 0;
    for (const ir_attr_spec *a = ir_ops[x->op].attrs; a && a->name; a++, k++) {
        cg_put(t, "#define P_%d ", k);
        cg_double(t, a->kind == IR_ATTR_FLOAT ? ir_attr_f(x, a->name) : (double)ir_attr_i(x, a->name));
        cg_put(t, "\n");
    }
    const ir_type *sp = rk->space;
    for (int d = 0; d < sp->rank; d++) {
        int64_t below = 1; /* rows below dim d */
        for (int e = d + 1; e < sp->rank - 1; e++) below *= sp->dims[e];
        cg_put(t, "#define DIM_%d (%lldll)\n", sp->rank - 1 - d, (long long)sp->dims[d]);
        if (d < sp->rank - 1)
            cg_put(t, "#define POS_%d ((row / %lldll) %% %lldll)\n", sp->rank - 1 - d, (long long)below,
                   (long long)sp->dims[d]);
    }
    return true;
}

static void undefine(cg_text *t, const ir_node *x, const ir_type *sp)
{
    static const char *const names[] = {"X", "AT", "INDEX", "SCALAR", "HAS", "W", "P", "POS", "DIM", "V", "S", "N", "COL", "ROWS"};
    const ir_row_program *prog = ir_ops[x->op].row;
    ir_row_summary sum = ir_row_summarize(prog);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) cg_put(t, "#undef %s\n", names[i]);
    for (int q = 0; q < (int)strlen(prog->roles); q++)
        cg_put(t, "#undef HAS_%d\n#undef X_%d\n#undef AT_%d\n#undef INDEX_%d\n#undef SCALAR_%d\n#undef W_%d\n", q, q, q, q, q, q);
    for (int k = 0; k < sum.nscalars; k++) cg_put(t, "#undef S_%d\n", k);
    for (int k = 0; k < sum.nvectors; k++) cg_put(t, "#undef V_%d\n", k);
    int k = 0;
    for (const ir_attr_spec *a = ir_ops[x->op].attrs; a && a->name; a++) cg_put(t, "#undef P_%d\n", k++);
    for (int d = 0; d < sp->rank; d++) cg_put(t, "#undef DIM_%d\n#undef POS_%d\n", d, d);
}

/* Declares row op member m's slots (before every program of the row, so a
 * later program can read the ones it shares). */
void cg_row_declare_slots(cg_text *t, const cg_row_kernel *rk, int m)
{
    const ir_node *x = rk->g->nodes[rk->s->members[m].node];
    const ir_row_program *prog = ir_ops[x->op].row;
    ir_row_summary sum = ir_row_summarize(prog);
    int from, shared = shared_prefix(rk, m, &from);
    for (int k = 0; k < sum.nscalars + sum.nvectors; k++) {
        bool vec = k >= sum.nscalars;
        int slot = vec ? k - sum.nscalars : k;
        bool theirs = false;
        for (int i = 0; i < shared; i++) theirs |= (prog->stages[i].kind == ROW_MAP) == vec && prog->stages[i].slot == slot;
        if (theirs) continue;
        if (vec && rk->stream) continue; /* V(slot): its expression, where read */
        if (vec) cg_put(t, "        T rv%d_%d[%d];\n", m, slot, rk->cpl);
        else cg_put(t, "        T s%d_%d = 0; (void)s%d_%d;\n", m, slot, m, slot);
    }
}

/* The program of row op member m: stages in order (those shared with an
 * earlier program skipped); OUT stores, spills and rounds. */
bool cg_row_program(cg_text *t, cg_row_kernel *rk, int m)
{
    const sched_member *mb = &rk->s->members[m];
    const ir_node *x = rk->g->nodes[mb->node];
    const ir_row_program *prog = ir_ops[x->op].row;
    int from = m, shared = shared_prefix(rk, m, &from), reg[8];
    if (!rk->stream) cg_put(t, "    {\n"); /* streaming: at the row's scope, where later parts call its r<m> */
    if (shared) cg_put(t, "        /* stages 0-%d: those of %%%d's program */\n", shared - 1, rk->s->members[from].node);
    if (!accessors(t, rk, x, m, shared, from, reg)) return false;
    char cb[32], cfull[32];
    const char *bound = cg_row_column_bound(rk, x, cb, sizeof cb); /* lim_: the stages see the live columns alone */
    bool live = rk->causal && ir_row_causal(rk->g, x); /* and OUT stores 0 past them */
    al_fmt(cfull, sizeof cfull, "%lldll", (long long)rk->C);
    for (int i = shared; i < prog->nstages; i++) {
        const ir_row_stage *sg = &prog->stages[i];
        for (int q = 0; q < (int)strlen(prog->roles) && q < x->nin; q++) /* rows read first here */
            if (reg[q] >= 0 && (mentions(sg->expr, "X", q) || mentions(sg->expr, "AT", q))) cg_row_load(t, rk, reg[q]);
        if (rk->stream && cg_row_online_softmax(prog, i)) {
            cg_row_put_online_softmax(t, rk, m, prog, i);
            i += 2;
            continue;
        }
        if (rk->stream && sg->kind == ROW_MAP) continue; /* V(slot) is its expression */
        if (rk->stream && sg->kind == ROW_OUT) {
            cg_row_stream_out(t, rk, m, sg);
            continue;
        }
        switch (sg->kind) {
        case ROW_MAX:
        case ROW_SUM: {
            bool max = sg->kind == ROW_MAX;
            cg_put(t, "        { T a_ = %s;\n", max ? "-(T)ALLOY_INF" : "0");
            cg_row_put_columns(t, rk);
            cg_put(t, "            if (col < %s) a_ = %s(T)(%s)%s;\n        }\n        s%d_%d = %s; }\n",
                   bound, max ? "alloy_max(a_, " : "a_ + ", sg->expr, max ? ")" : "", m, sg->slot,
                   cg_row_team_reduce(rk, max));
            break;
        }
        case ROW_LET: cg_put(t, "        s%d_%d = (T)(%s);\n", m, sg->slot, sg->expr); break;
        case ROW_MAP:
            cg_row_put_columns(t, rk);
            cg_put(t, "            if (col < %s) rv%d_%d[j_] = (T)(%s);\n        }\n", bound, m, sg->slot, sg->expr);
            break;
        case ROW_OUT: {
            /* vw > 1: stored through o<m>_, a chunk per 16-byte access */
            bool chunks = rk->vw > 1 && (mb->flags & MEMBER_STORED) && ir_numel(&x->type) == rk->rows * rk->C;
            if (chunks) cg_put(t, "        alignas(16) %s o%d_[%d];\n", cg_storage(x->type.dtype), m, rk->cpl);
            cg_row_put_columns(t, rk);
            /* a causal row op stores 0 past the live columns (its expression not evaluated there); a
             * causal_mask of a limited step is read there by no one */
            cg_put(t, "            if (col >= %s) continue;\n            T v%d = %s(T)(%s);\n", live ? cfull : bound, m,
                   live ? "col >= lim_ ? (T)0 : " : "", sg->expr);
            char v[16];
            al_fmt(v, sizeof v, "v%d", m);
            cg_apply_flags(t, x->type.dtype, rk->wide, mb->flags, v);
            if (mb->flags & MEMBER_STORED) {
                char idx[160];
                cg_row_element_index(rk, x->id, "col", idx, sizeof idx);
                int ko = cg_param_of(&rk->ps, CG_PARAM_NODE, x->id, true, 0);
                if (chunks) cg_put(t, "            o%d_[j_] = ", m);
                else cg_put(t, "            p%d[%s] = ", ko, idx);
                cg_store(t, x->type.dtype, rk->wide, v);
                cg_put(t, ";\n");
                if (chunks) /* the chunk's last column: all of it */
                    cg_put(t, "            if (j_ %% %d == %d) alloy_vcopy<%d>(p%d + (%s) - %d, o%d_ + j_ - %d);\n", rk->vw,
                           rk->vw - 1, (int)alloy_dtype_size(x->type.dtype) * rk->vw, ko, idx, rk->vw - 1, m, rk->vw - 1);
            }
            if (mb->flags & MEMBER_SPILLED) cg_put(t, "            r%d[j_] = v%d;\n", m, m);
            cg_put(t, "        }\n");
            break;
        }
        case ROW_KEEP: { /* the row's value: one thread stores it */
            cg_put(t, "        { const T res_ = (T)(%s);\n", sg->expr);
            if (mb->flags & MEMBER_STORED) {
                cg_put(t, "          if (lane == 0) p%d[row] = ", cg_param_of(&rk->ps, CG_PARAM_NODE, x->id, true, 0));
                cg_store(t, x->type.dtype, rk->wide, "res_");
                cg_put(t, ";\n");
            }
            cg_put(t, "          (void)res_; }\n");
            break;
        }
        case ROW_RESULT:
        case ROW_WEIGHT: {
            /* every thread evaluates it (AT reads across the team), one writes; the weights follow the results */
            int kr = cg_param_of(&rk->ps, CG_PARAM_ROWS, x->id, true, 2 * rk->rows);
            cg_put(t, "        { const T res_ = (T)(%s); if (lane == 0) p%d[%srow] = res_; }\n", sg->expr, kr,
                   sg->kind == ROW_WEIGHT ? "ROWS + " : "");
            if (sg->kind == ROW_RESULT && !ir_row_summarize(prog).weighted)
                cg_put(t, "        if (lane == 0) p%d[ROWS + row] = (T)1;\n", kr);
            break;
        }
        }
    }
    undefine(t, x, rk->space);
    if (!rk->stream) cg_put(t, "    }\n");
    return true;
}
