/* emit_row.c - row kernels: one warp per row, each lane holding its columns in registers; row programs from the op table, elementwise parts between them, per-row results averaged by a second kernel. */
#include <string.h>

#include "codegen/emit_impl.h"

enum { WARPS = 4, MAX_COLS_PER_LANE = 64 };

typedef struct row_kernel {
    const ir_graph *g;
    const schedule *s;
    const sched_step *st;
    int64_t C, rows;
    int cpl; /* columns per lane */
    bool wide;
    const ir_type *space;
    cg_params ps;
} row_kernel;

/* Appends the text of operand q of row op x at column variable `col`, slot
 * variable `slot`; false when its shape is one this kernel does not read. */
static bool operand_at(cg_text *t, row_kernel *rk, const ir_node *x, int q, const char *col, const char *slot)
{
    int o = x->in[q];
    const schedule *s = rk->s;
    if (s->step_of[o] == (int)(rk->st - s->steps)) {
        cg_put(t, "r%d[%s]", s->member_of[o], slot);
        return true;
    }
    const ir_type *ty = &rk->g->nodes[o]->type;
    int64_t n = ir_numel(ty);
    char idx[96];
    if (n == rk->rows * rk->C) al_fmt(idx, sizeof idx, "row * %lldll + %s", (long long)rk->C, col);
    else if (n == rk->C && ty->dims[ty->rank - 1] == rk->C) al_fmt(idx, sizeof idx, "%s", col);
    else if (n == rk->rows) al_fmt(idx, sizeof idx, "row");
    else if (n == 1) al_fmt(idx, sizeof idx, "0");
    else return false;
    char pk[16];
    al_fmt(pk, sizeof pk, "p%d", cg_param_of(&rk->ps, CG_PARAM_NODE, o, false, 0));
    cg_put(t, "(");
    cg_load(t, ty->dtype, pk, idx);
    cg_put(t, ")");
    return true;
}

/* Appends the accessor macros of row op x's program (ops.def: X, V, S, N,
 * COL, P, HAS, INDEX, AT, SCALAR, ROWS, POS, DIM) for member m. */
static bool accessors(cg_text *t, row_kernel *rk, const ir_node *x, int m)
{
    const ir_row_program *prog = ir_ops[x->op].row;
    cg_put(t, "#define X(q) X_##q\n#define AT(q, c) AT_##q(c)\n#define INDEX(q) INDEX_##q\n#define SCALAR(q) SCALAR_##q\n"
              "#define HAS(q) HAS_##q\n#define P(k) P_##k\n#define POS(k) POS_##k\n#define DIM(k) DIM_##k\n"
              "#define V(k) rv%d_##k[j_]\n#define S(k) s%d_##k\n#define N ((T)%lldll)\n#define COL col\n#define ROWS (%lldll)\n",
           m, m, (long long)rk->C, (long long)rk->rows);
    for (int q = 0; q < (int)strlen(prog->roles); q++) {
        cg_put(t, "#define HAS_%d %d\n", q, q < x->nin);
        if (q >= x->nin) { /* absent: read only behind HAS(q), which is 0 */
            cg_put(t, "#define X_%d ((T)0)\n#define AT_%d(c) ((T)0)\n#define INDEX_%d 0ll\n#define SCALAR_%d ((T)0)\n", q, q, q, q);
            continue;
        }
        char role = prog->roles[q];
        if (role == 'i') {
            cg_put(t, "#define INDEX_%d ((long long)p%d[%s])\n", q,
                   cg_param_of(&rk->ps, CG_PARAM_NODE, x->in[q], false, 0),
                   ir_numel(&rk->g->nodes[x->in[q]]->type) == 1 ? "0" : "row");
            continue;
        }
        if (role == 's') {
            cg_put(t, "#define SCALAR_%d ", q);
            if (!operand_at(t, rk, x, q, "0", "0")) return false;
            cg_put(t, "\n");
            continue;
        }
        cg_put(t, "#define X_%d ", q);
        if (!operand_at(t, rk, x, q, "col", "j_")) return false;
        cg_put(t, "\n#define AT_%d(c) ([&]() -> T { T a_ = 0; for (int jj_ = 0; jj_ < %d; jj_++) {"
                  " const int cc_ = lane + 32 * jj_; if (cc_ == (int)(c)) a_ += ", q, rk->cpl);
        if (!operand_at(t, rk, x, q, "cc_", "jj_")) return false;
        cg_put(t, "; } return alloy_warp_sum(a_); }())\n");
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
    static const char *const names[] = {"X", "AT", "INDEX", "SCALAR", "HAS", "P", "POS", "DIM", "V", "S", "N", "COL", "ROWS"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) cg_put(t, "#undef %s\n", names[i]);
    for (int q = 0; q < (int)strlen(ir_ops[x->op].row->roles); q++)
        cg_put(t, "#undef HAS_%d\n#undef X_%d\n#undef AT_%d\n#undef INDEX_%d\n#undef SCALAR_%d\n", q, q, q, q, q);
    int k = 0;
    for (const ir_attr_spec *a = ir_ops[x->op].attrs; a && a->name; a++) cg_put(t, "#undef P_%d\n", k++);
    for (int d = 0; d < sp->rank; d++) cg_put(t, "#undef DIM_%d\n#undef POS_%d\n", d, d);
}

#define COLUMNS "        for (int j_ = 0; j_ < %d; j_++) {\n            const int col = lane + 32 * j_;\n"

/* The program of row op member m: stages in order; OUT stores, spills and rounds. */
static bool emit_program(cg_text *t, row_kernel *rk, int m)
{
    const sched_member *mb = &rk->s->members[m];
    const ir_node *x = rk->g->nodes[mb->node];
    const ir_row_program *prog = ir_ops[x->op].row;
    ir_row_summary sum = ir_row_summarize(prog);
    cg_put(t, "    {\n");
    if (!accessors(t, rk, x, m)) return false;
    for (int k = 0; k < sum.nscalars; k++) cg_put(t, "        T s%d_%d = 0; (void)s%d_%d;\n", m, k, m, k);
    for (int k = 0; k < sum.nvectors; k++) cg_put(t, "        T rv%d_%d[%d];\n", m, k, rk->cpl);
    for (int i = 0; i < prog->nstages; i++) {
        const ir_row_stage *sg = &prog->stages[i];
        switch (sg->kind) {
        case ROW_MAX:
        case ROW_SUM: {
            bool max = sg->kind == ROW_MAX;
            cg_put(t, "        { T a_ = %s;\n" COLUMNS "            if (col < %lldll) a_ = %s(T)(%s)%s;\n        }\n"
                      "        s%d_%d = %s(a_); }\n",
                   max ? "-(T)ALLOY_INF" : "0", rk->cpl, (long long)rk->C, max ? "alloy_max(a_, " : "a_ + ", sg->expr,
                   max ? ")" : "", m, sg->slot, max ? "alloy_warp_max" : "alloy_warp_sum");
            break;
        }
        case ROW_LET: cg_put(t, "        s%d_%d = (T)(%s);\n", m, sg->slot, sg->expr); break;
        case ROW_MAP:
            cg_put(t, COLUMNS "            if (col < %lldll) rv%d_%d[j_] = (T)(%s);\n        }\n", rk->cpl,
                   (long long)rk->C, m, sg->slot, sg->expr);
            break;
        case ROW_OUT: {
            cg_put(t, COLUMNS "            if (col >= %lldll) continue;\n            T v%d = (T)(%s);\n", rk->cpl,
                   (long long)rk->C, m, sg->expr);
            char v[16];
            al_fmt(v, sizeof v, "v%d", m);
            cg_apply_flags(t, x->type.dtype, rk->wide, mb->flags, v);
            if (mb->flags & MEMBER_STORED) {
                cg_put(t, "            p%d[row * %lldll + col] = ", cg_param_of(&rk->ps, CG_PARAM_NODE, x->id, true, 0),
                       (long long)rk->C);
                cg_store(t, x->type.dtype, rk->wide, v);
                cg_put(t, ";\n");
            }
            if (mb->flags & MEMBER_SPILLED) cg_put(t, "            r%d[j_] = v%d;\n", m, m);
            cg_put(t, "        }\n");
            break;
        }
        case ROW_RESULT:
            /* every lane evaluates it (AT reads across lanes), one writes */
            cg_put(t, "        { const T res_ = (T)(%s); if (lane == 0) p%d[row] = res_; }\n", sg->expr,
                   cg_param_of(&rk->ps, CG_PARAM_ROWS, x->id, true, rk->rows));
            break;
        }
    }
    undefine(t, x, rk->space);
    cg_put(t, "    }\n");
    return true;
}

const char *cg_emit_row(cg_program *prog, const ir_graph *g, const schedule *s, int k)
{
    const sched_step *st = &s->steps[k];
    const ir_node *last = g->nodes[st->pos];
    row_kernel rk = {.g = g, .s = s, .st = st};
    ir_type space = st->space;
    if (st->kind == STEP_OP) {
        if (!ir_ops[last->op].row) return "no kernel yet for this op (a library call or an op kernel)";
        int axis;
        const ir_type *in0 = &g->nodes[last->in[0]]->type;
        if (ir_attr_schema(last->op, "axis") && (!ir_norm_axis(ir_attr_i(last, "axis"), in0->rank, &axis) ||
                                                 axis != in0->rank - 1))
            return "a row op along another axis than the last: no kernel yet";
        space = *in0;
        rk.wide = in0->dtype == ALLOY_F64;
    }
    rk.space = &space;
    rk.C = space.rank ? space.dims[space.rank - 1] : 1;
    rk.rows = rk.C ? ir_numel(&space) / rk.C : 0;
    rk.cpl = (int)((rk.C + 31) / 32);
    if (rk.cpl > MAX_COLS_PER_LANE) return "rows longer than 2048 elements: no kernel yet";
    if (rk.rows == 0) return "no rows";
    cg_text body = {0}, t = {0};
    const char *why = NULL;
    for (int m = st->first; m < st->first + st->n; m++)
        if (s->members[m].flags & MEMBER_SPILLED) cg_put(&body, "    T r%d[%d];\n", m, rk.cpl);
    for (int q = st->first_part; q < st->first_part + st->nparts && !why; q++) {
        const sched_part *part = &s->parts[q];
        if (part->kind == PART_OP) {
            if (!emit_program(&body, &rk, part->first)) why = "an operand of a row op is broadcast in a way no kernel reads yet";
            continue;
        }
        cg_ew_part ep = {.g = g, .s = s, .step = st, .first = part->first, .n = part->n, .space = &space,
                         .wide = part->wide, .product = -1, .ps = &rk.ps, .e = "e_", .slot = "j_"};
        cg_put(&body, COLUMNS "            if (col >= %lldll) continue;\n            const long long e_ = row * %lldll + col;\n",
               rk.cpl, (long long)rk.C, (long long)rk.C);
        cg_emit_members(&body, &ep);
        cg_put(&body, "        }\n");
    }
    char name[48];
    al_fmt(name, sizeof name, "alloy_s%d_row", k);
    if (!why) {
        cg_put_preamble(&t);
        cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", 32 * WARPS, name);
        cg_param_list(&t, g, &rk.ps);
        cg_put(&t, ")\n{\n    typedef %s T;\n    const int lane = threadIdx.x & 31;\n    int bad_ = 0; (void)bad_;\n"
                   "    for (long long row = (long long)blockIdx.x * %d + (threadIdx.x >> 5); row < %lldll;"
                   " row += (long long)gridDim.x * %d) {\n%s    }\n}\n",
               rk.wide ? "double" : "float", WARPS, (long long)rk.rows, WARPS, body.s ? body.s : "");
        int64_t blocks = (rk.rows + WARPS - 1) / WARPS;
        if (body.oom || !cg_add_kernel(prog, g, name, k, st->kind, &t, &rk.ps, (unsigned)(blocks > CG_MAX_GRID ? CG_MAX_GRID : blocks),
                                       32 * WARPS, (int64_t)ir_nbytes(&space) * 2))
            why = "out of memory";
    }
    /* ops with a result per row: their mean, by a second kernel */
    for (int m = st->first; m < st->first + st->n && !why; m++) {
        const ir_node *x = g->nodes[s->members[m].node];
        if (!ir_ops[x->op].row || !ir_row_summarize(ir_ops[x->op].row).per_row_result) continue;
        cg_params fp = {0};
        int kr = cg_param_of(&fp, CG_PARAM_ROWS, x->id, false, rk.rows);
        int ko = cg_param_of(&fp, CG_PARAM_NODE, x->id, true, 0);
        al_fmt(name, sizeof name, "alloy_s%d_mean%d", k, m);
        cg_put_preamble(&t);
        cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(32) %s(", name);
        cg_param_list(&t, g, &fp);
        cg_put(&t, ")\n{\n    typedef %s T;\n    T a_ = 0;\n    for (long long i = threadIdx.x; i < %lldll; i += 32) a_ += p%d[i];\n"
                   "    a_ = alloy_warp_sum(a_);\n    if (threadIdx.x == 0) p%d[0] = ",
               rk.wide ? "double" : "float", (long long)rk.rows, kr, ko);
        char mean[64];
        al_fmt(mean, sizeof mean, "a_ / (T)%lldll", (long long)rk.rows);
        cg_store(&t, x->type.dtype, rk.wide, mean);
        cg_put(&t, ";\n}\n");
        if (t.oom || !cg_add_kernel(prog, g, name, k, st->kind, &t, &fp, 1, 32, rk.rows * 4)) why = "out of memory";
        al_free(fp.at);
    }
    cg_text_free(&body), cg_text_free(&t);
    al_free(rk.ps.at);
    return why;
}
