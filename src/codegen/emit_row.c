/* emit_row.c - row kernels: a team of threads per row (one warp for short rows, a block for long ones), each thread holding its columns in registers, or for the longest rows streaming them (online max and sum, values computed again where read); row programs from the op table, elementwise parts between them, per-row results averaged by a second kernel. */
#include <math.h>
#include <string.h>

#include "codegen/emit_impl.h"

/* Rows up to WARP_MAX_COLS columns get a warp each, WARPS rows to a block;
 * longer rows a block of up to MAX_TEAM threads each, sized so a thread
 * holds at most TEAM_COLS columns. Rows longer than that (MAX_TEAM *
 * TEAM_COLS) stream: no column is held, so no width spills (a step the
 * streaming form cannot take, one with column sums, holds up to
 * MAX_COLS_PER_THREAD columns a thread instead). */
enum { WARPS = 4, WARP_MAX_COLS = 1024, TEAM_COLS = 8, MAX_TEAM = 1024, MAX_COLS_PER_THREAD = 64 };

typedef struct row_kernel {
    const ir_graph *g;
    const schedule *s;
    const sched_step *st;
    int64_t C, rows;
    int64_t inner; /* elements after the row's axis: 1 when rows run along the last axis */
    int team; /* threads per row: 32 (a warp) or a whole block */
    int cpl;  /* columns per thread: j_ < cpl, at column_of(j_) */
    /* columns in chunks of vw (1: one at a time): 16 bytes of the widest
     * row-shaped operand or stored member (row_width) */
    int vw;
    bool wide;
    const ir_type *space;
    cg_params ps;
    /* amp_check / amp_stats on the elementwise parts (cg_ew_part.checks, .covered) */
    unsigned checks;
    uint8_t *covered;
    /* vw > 1: the parameters (bit k) whose row this thread holds in
     * l<k>_[cpl], loaded by 16-byte accesses where first read (declared in
     * *decl); vfail: an elementwise part read or wrote a parameter past 63
     * (the kernel is emitted again a column at a time) */
    uint64_t loaded;
    cg_text *decl;
    bool vfail;
    /* the streaming form (rows over MAX_TEAM * TEAM_COLS columns; vw is 1):
     * no per-thread arrays. A MAX, MAP exp(x - max), SUM of the MAP is one
     * pass (a running max and a sum rescaled when it grows, the team's
     * combined at the end); V(k) is its MAP's expression, evaluated where
     * read; a member a later part reads is the lambda r<m>(slot) computing
     * it again at that column */
    bool stream;
    /* causal rows (ir_row_causal): some member is causal, and lim_ (the
     * row's live columns, ir_causal_live) is declared at the row's scope;
     * `limited` (limited_step): the row's operands are loaded only up to lim_ */
    bool causal, limited;
} row_kernel;

/* ---- causal rows ---- */

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
static bool limited_step(const ir_graph *g, const schedule *s, const sched_step *st)
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
    if ((st->kind != STEP_KIND_ROW && st->kind != STEP_KIND_OP) || sp->rank < 2 || !limited_step(g, s, st)) return 1;
    double q = (double)sp->dims[sp->rank - 2], c = (double)sp->dims[sp->rank - 1];
    return c > 0 ? (q * (q + 1) / 2 + q * (c - q)) / (q * c) : 1; /* live columns: row i of q sees i + c - q + 1 */
}

/* The bound of member x's columns in its stages (C text, into buf): lim_ for
 * a causal row op, or a causal_mask of a limited step that is not 0 past
 * the live columns (read there by no one); else C. */
static const char *column_bound(const row_kernel *rk, const ir_node *x, char *buf, size_t len)
{
    if (rk->causal && (ir_row_causal(rk->g, x) || (rk->limited && x->op == IR_OP_causal_mask &&
                                                   !zero_past_live(rk->g, rk->s, rk->st, x->id))))
        return "lim_";
    al_fmt(buf, len, "%lldll", (long long)rk->C);
    return buf;
}

/* Returned by emit_row when the vectorized kernel needs a bit past 63. */
static const char VECTOR_FAILED[] = "a row kernel's vector accesses name a parameter past 63";

/* The call reducing this thread's a_ over the row's team. */
static const char *team_reduce(const row_kernel *rk, bool max)
{
    if (rk->team == 32) return max ? "alloy_warp_max(a_)" : "alloy_warp_sum(a_)";
    return max ? "alloy_block_max(a_, red_)" : "alloy_block_sum(a_, red_)";
}

/* The column of this thread's slot j (C text), into buf: lane + team * j,
 * or in chunks of vw contiguous columns (lane + team * (j / vw)) * vw + j % vw. */
static void column_of(const row_kernel *rk, const char *j, char *buf, size_t len)
{
    if (rk->vw > 1)
        al_fmt(buf, len, "(lane + %d * (%s / %d)) * %d + %s %% %d", rk->team, j, rk->vw, rk->vw, j, rk->vw);
    else
        al_fmt(buf, len, "lane + %d * %s", rk->team, j);
}

/* Opens the loop over this thread's columns of the row. */
static void put_columns(cg_text *t, const row_kernel *rk)
{
    char col[96];
    column_of(rk, "j_", col, sizeof col);
    cg_put(t, "        for (int j_ = 0; j_ < %d; j_++) {\n            const int col = %s;\n", rk->cpl, col);
}

/* Elements of the widest row-shaped ([rows, C]: numel rows * C) operand
 * from outside the step or stored member in 16 bytes, when C is a multiple
 * of it and rows run along the last axis; else 1. */
static int row_width(const row_kernel *rk)
{
    if (rk->inner != 1) return 1;
    const schedule *s = rk->s;
    int64_t n = rk->rows * rk->C;
    size_t widest = 0;
    for (int m = rk->st->first; m < rk->st->first + rk->st->n; m++) {
        const ir_node *x = rk->g->nodes[s->members[m].node];
        if (sched_padded(s, x->id)) return 1; /* its rows are not C elements apart */
        if ((s->members[m].flags & MEMBER_STORED) && ir_numel(&x->type) == n && alloy_dtype_size(x->type.dtype) > widest)
            widest = alloy_dtype_size(x->type.dtype);
        for (int j = 0; j < x->nin; j++) {
            if (sched_padded(s, x->in[j])) return 1;
            const ir_type *ty = &rk->g->nodes[x->in[j]]->type;
            if (s->step_of[x->in[j]] != (int)(rk->st - s->steps) && ir_numel(ty) == n && alloy_dtype_size(ty->dtype) > widest)
                widest = alloy_dtype_size(ty->dtype);
        }
    }
    int w = widest && widest <= 16 ? (int)(16 / widest) : 1;
    return w > 1 && rk->C % w == 0 ? w : 1;
}

/* "f16" or "bf16" when node's value is a widened product stored before its
 * range rule (MEMBER_RANGED_READ: sched_mark_ranged_reads), whose loads
 * apply the rule of that dtype; else NULL. */
static const char *ranged_row(const row_kernel *rk, int node)
{
    int m = rk->s->member_of[node];
    if (m < 0 || !(rk->s->members[m].flags & MEMBER_RANGED_READ)) return NULL;
    return rk->g->nodes[rk->g->nodes[node]->in[0]]->type.dtype == ALLOY_F16 ? "f16" : "bf16";
}

/* Loads parameter k's row into this thread's l<k>_ (its chunks, one
 * 16-byte access each; vw > 1) unless an earlier stage did. */
static void load_row(cg_text *t, row_kernel *rk, int k)
{
    if (rk->loaded >> k & 1) return;
    rk->loaded |= 1ull << k;
    alloy_dtype dt = rk->g->nodes[rk->ps.at[k].node]->type.dtype;
    cg_put(rk->decl, "        alignas(16) %s l%d_[%d];\n", cg_storage(dt), k, rk->cpl);
    char lim[32];
    if (rk->limited) al_fmt(lim, sizeof lim, "lim_"); /* past the live columns: never read (limited_step) */
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
static void element_index(const row_kernel *rk, int node, const char *col, char *buf, size_t len)
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
static bool operand_at(cg_text *t, row_kernel *rk, const ir_node *x, int q, const char *col, const char *slot, int reg)
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
    if (n == rk->rows * rk->C) element_index(rk, o, col, idx, sizeof idx);
    else if (n == rk->C && ty->dims[ty->rank - 1] == rk->C) al_fmt(idx, sizeof idx, "%s", col);
    else if (n == rk->rows) al_fmt(idx, sizeof idx, "row");
    else if (n == 1) al_fmt(idx, sizeof idx, "0");
    else return false;
    char pk[16];
    al_fmt(pk, sizeof pk, "p%d", cg_param_of(&rk->ps, CG_PARAM_NODE, o, false, 0));
    if (reg >= 0 && n == rk->rows * rk->C) al_fmt(pk, sizeof pk, "l%d_", reg), al_fmt(idx, sizeof idx, "%s", slot);
    /* a widened product stored before its range rule: the rule as it is loaded from memory (a row held in
     * registers had it applied once, load_row) */
    const char *rule = reg >= 0 && n == rk->rows * rk->C ? NULL : ranged_row(rk, o);
    if (rule) cg_put(t, "alloy_range_%s", rule);
    cg_put(t, "(");
    cg_load(t, ty->dtype, pk, idx);
    cg_put(t, ")");
    return true;
}

/* The bound of an elementwise part's columns (C text, into buf): lim_ in a
 * limited step for a part of no zero_past_live member (only causal row ops
 * read it, at the live columns); else C. */
static const char *ew_bound(const row_kernel *rk, const sched_part *part, char *buf, size_t len)
{
    if (rk->limited && !zero_past_live(rk->g, rk->s, rk->st, rk->s->members[part->first].node)) return "lim_";
    al_fmt(buf, len, "%lldll", (long long)rk->C);
    return buf;
}

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
static int shared_prefix(const row_kernel *rk, int m, int *from)
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
static int register_row(row_kernel *rk, const ir_node *x, int q, int from)
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
static bool accessors(cg_text *t, row_kernel *rk, const ir_node *x, int m, int shared, int from, int *reg)
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
        if (rk->stream) { /* the slot's MAP expression (streamable: written once, reading no V) */
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
                ir_numel(&rk->g->nodes[x->in[q]]->type) != rk->rows || !operand_at(t, rk, x, q, "0", "0", -1))
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
            if (!operand_at(t, rk, x, q, "0", "0", -1)) return false;
            cg_put(t, "\n");
            continue;
        }
        reg[q] = register_row(rk, x, q, shared);
        cg_put(t, "#define X_%d ", q);
        if (!operand_at(t, rk, x, q, "col", "j_", reg[q])) return false;
        /* AT(q, c): the thread holding column c contributes it, the team sums */
        char cc[96], bound[32] = "";
        column_of(rk, "jj_", cc, sizeof cc);
        if (rk->stream) al_fmt(bound, sizeof bound, " && cc_ < %lld", (long long)rk->C); /* a column read, not held */
        cg_put(t, "\n#define AT_%d(c) ([&]() -> T { T a_ = 0; for (int jj_ = 0; jj_ < %d; jj_++) {"
                  " const int cc_ = %s; if (cc_ == (int)(c)%s) a_ += ", q, rk->cpl, cc, bound);
        if (!operand_at(t, rk, x, q, "cc_", "jj_", reg[q])) return false;
        cg_put(t, "; } return %s; }())\n", team_reduce(rk, false));
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
static void declare_slots(cg_text *t, const row_kernel *rk, int m)
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

/* Whether stages i, i + 1, i + 2 of p are MAX(a, E), MAP(v, exp(E - S(a))),
 * SUM(b, V(v)): a softmax's denominator, which streams in one pass. */
static bool online_softmax(const ir_row_program *p, int i)
{
    if (i + 2 >= p->nstages) return false;
    const ir_row_stage *mx = &p->stages[i], *map = &p->stages[i + 1], *sum = &p->stages[i + 2];
    if (mx->kind != ROW_MAX || map->kind != ROW_MAP || sum->kind != ROW_SUM) return false;
    char want[256], v[16];
    al_fmt(want, sizeof want, "exp(%s - S(%d))", mx->expr, mx->slot);
    al_fmt(v, sizeof v, "V(%d)", map->slot);
    return strlen(mx->expr) < 200 && strcmp(map->expr, want) == 0 && strcmp(sum->expr, v) == 0;
}

/* Stages i..i + 2 of member m's program (online_softmax) in one pass: each
 * thread keeps a running max m_ and the sum a_ of exp(x - m_), rescaling
 * the sum when the max grows; the team's max is S(a), and S(b) the sum of
 * the threads' sums rescaled to it. A -inf column adds nothing (exp(-inf -
 * m_) is 0) unless the whole row is -inf, which gives NaN as the two-pass
 * form does; +inf and NaN give NaN as there. */
static void emit_online_softmax(cg_text *t, const row_kernel *rk, int m, const ir_row_program *p, int i)
{
    const ir_row_stage *mx = &p->stages[i], *sum = &p->stages[i + 2];
    char cb[32];
    const char *bound = column_bound(rk, rk->g->nodes[rk->s->members[m].node], cb, sizeof cb);
    cg_put(t, "        { T m_ = -(T)ALLOY_INF, a_ = 0;\n");
    put_columns(t, rk);
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
static void stream_out(cg_text *t, row_kernel *rk, int m, const ir_row_stage *sg)
{
    const sched_member *mb = &rk->s->members[m];
    const ir_node *x = rk->g->nodes[mb->node];
    char v[16], e[32];
    al_fmt(v, sizeof v, "v%d", m);
    /* a causal row op: 0 past the live columns, its expression not evaluated there */
    al_fmt(e, sizeof e, "%s", rk->causal && ir_row_causal(rk->g, x) ? "col >= lim_ ? (T)0 : " : "");
    if (mb->flags & MEMBER_STORED) {
        char idx[160];
        element_index(rk, x->id, "col", idx, sizeof idx);
        put_columns(t, rk);
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

/* The program of row op member m: stages in order (those shared with an
 * earlier program skipped); OUT stores, spills and rounds. */
static bool emit_program(cg_text *t, row_kernel *rk, int m)
{
    const sched_member *mb = &rk->s->members[m];
    const ir_node *x = rk->g->nodes[mb->node];
    const ir_row_program *prog = ir_ops[x->op].row;
    int from = m, shared = shared_prefix(rk, m, &from), reg[8];
    if (!rk->stream) cg_put(t, "    {\n"); /* streaming: at the row's scope, where later parts call its r<m> */
    if (shared) cg_put(t, "        /* stages 0-%d: those of %%%d's program */\n", shared - 1, rk->s->members[from].node);
    if (!accessors(t, rk, x, m, shared, from, reg)) return false;
    char cb[32], cfull[32];
    const char *bound = column_bound(rk, x, cb, sizeof cb); /* lim_: the stages see the live columns alone */
    bool live = rk->causal && ir_row_causal(rk->g, x); /* and OUT stores 0 past them */
    al_fmt(cfull, sizeof cfull, "%lldll", (long long)rk->C);
    for (int i = shared; i < prog->nstages; i++) {
        const ir_row_stage *sg = &prog->stages[i];
        for (int q = 0; q < (int)strlen(prog->roles) && q < x->nin; q++) /* rows read first here */
            if (reg[q] >= 0 && (mentions(sg->expr, "X", q) || mentions(sg->expr, "AT", q))) load_row(t, rk, reg[q]);
        if (rk->stream && online_softmax(prog, i)) {
            emit_online_softmax(t, rk, m, prog, i);
            i += 2;
            continue;
        }
        if (rk->stream && sg->kind == ROW_MAP) continue; /* V(slot) is its expression */
        if (rk->stream && sg->kind == ROW_OUT) {
            stream_out(t, rk, m, sg);
            continue;
        }
        switch (sg->kind) {
        case ROW_MAX:
        case ROW_SUM: {
            bool max = sg->kind == ROW_MAX;
            cg_put(t, "        { T a_ = %s;\n", max ? "-(T)ALLOY_INF" : "0");
            put_columns(t, rk);
            cg_put(t, "            if (col < %s) a_ = %s(T)(%s)%s;\n        }\n        s%d_%d = %s; }\n",
                   bound, max ? "alloy_max(a_, " : "a_ + ", sg->expr, max ? ")" : "", m, sg->slot,
                   team_reduce(rk, max));
            break;
        }
        case ROW_LET: cg_put(t, "        s%d_%d = (T)(%s);\n", m, sg->slot, sg->expr); break;
        case ROW_MAP:
            put_columns(t, rk);
            cg_put(t, "            if (col < %s) rv%d_%d[j_] = (T)(%s);\n        }\n", bound, m, sg->slot, sg->expr);
            break;
        case ROW_OUT: {
            /* vw > 1: stored through o<m>_, a chunk per 16-byte access */
            bool chunks = rk->vw > 1 && (mb->flags & MEMBER_STORED) && ir_numel(&x->type) == rk->rows * rk->C;
            if (chunks) cg_put(t, "        alignas(16) %s o%d_[%d];\n", cg_storage(x->type.dtype), m, rk->cpl);
            put_columns(t, rk);
            /* a causal row op stores 0 past the live columns (its expression not evaluated there); a
             * causal_mask of a limited step is read there by no one */
            cg_put(t, "            if (col >= %s) continue;\n            T v%d = %s(T)(%s);\n", live ? cfull : bound, m,
                   live ? "col >= lim_ ? (T)0 : " : "", sg->expr);
            char v[16];
            al_fmt(v, sizeof v, "v%d", m);
            cg_apply_flags(t, x->type.dtype, rk->wide, mb->flags, v);
            if (mb->flags & MEMBER_STORED) {
                char idx[160];
                element_index(rk, x->id, "col", idx, sizeof idx);
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

/* ---- the kernels of a step ---- */

/* Whether the step's row kernel can stream (row_kernel's stream): no
 * column sums (a thread's sums of its columns are held), and every row
 * program writes each S and V slot once and reads no V in a MAP. */
static bool streamable(const row_kernel *rk)
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

/* Threads per row and columns per thread for rows of C columns (whole
 * chunks of vw, which divides C), streaming (vw 1) rows over MAX_TEAM *
 * TEAM_COLS columns where the step allows; false when a row neither
 * streams nor fits in registers. */
static bool choose_team(row_kernel *rk)
{
    if (rk->C <= WARP_MAX_COLS) {
        rk->team = 32;
    } else {
        rk->team = 64;
        while (rk->team < MAX_TEAM && (rk->C + rk->team - 1) / rk->team > TEAM_COLS) rk->team *= 2;
    }
    int64_t cpl = (rk->C / rk->vw + rk->team - 1) / rk->team * rk->vw;
    if (rk->team == MAX_TEAM && cpl > TEAM_COLS && cpl <= INT32_MAX / MAX_TEAM && streamable(rk)) {
        rk->stream = true;
        rk->vw = 1;
        cpl = (rk->C + rk->team - 1) / rk->team;
    }
    rk->cpl = (int)(cpl > 0 ? cpl : 1);
    return rk->stream || cpl <= MAX_COLS_PER_THREAD;
}

/* The kernel combining member m's per-row results into its value: their
 * sum over the sum of the rows' weights (stored after them), or their sum
 * for reduction="sum". */
static bool emit_mean(cg_program *prog, const row_kernel *rk, int k, int m, cg_text *t)
{
    const ir_node *x = rk->g->nodes[rk->s->members[m].node];
    cg_params fp = {0};
    int kr = cg_param_of(&fp, CG_PARAM_ROWS, x->id, false, 2 * rk->rows);
    int ko = cg_param_of(&fp, CG_PARAM_NODE, x->id, true, 0);
    char name[48];
    al_fmt(name, sizeof name, "alloy_s%d_mean%d", k, m);
    cg_put_preamble(t);
    cg_put(t, "\nextern \"C\" __global__ void __launch_bounds__(32) %s(", name);
    cg_param_list(t, rk->g, &fp);
    cg_put(t, ")\n{\n    typedef %s T;\n    T a_ = 0, b_ = 0;\n"
              "    for (long long i = threadIdx.x; i < %lldll; i += 32) a_ += p%d[i], b_ += p%d[%lldll + i];\n"
              "    a_ = alloy_warp_sum(a_);\n    b_ = alloy_warp_sum(b_);\n    if (threadIdx.x == 0) p%d[0] = ",
           rk->wide ? "double" : "float", (long long)rk->rows, kr, kr, (long long)rk->rows, ko);
    const char *mean = ir_row_sums(x) ? "a_" : "a_ / b_";
    cg_store(t, x->type.dtype, rk->wide, mean);
    cg_put(t, ";\n}\n");
    bool ok = !t->oom && !fp.oom && cg_add_kernel(prog, rk->g, name, k, rk->st->kind, t, &fp, 1, 32, rk->rows * 8);
    al_free(fp.at);
    return ok;
}

/* ---- column sums (PART_COLSUM): per team in registers, per block, then per column ---- */

/* Row teams of a step with column sums: COLSUM_MAX_TEAMS of them at most,
 * each with COLSUM_TEAM_ROWS rows or more where there are rows enough. A
 * block adds its teams' sums (a tree over its warps) into one partial row
 * of C sums in the scratch, so the partials are per block (gpt2 at B8,
 * 8192 rows: 1024 teams, 256 blocks). */
enum { COLSUM_MAX_TEAMS = 1024, COLSUM_TEAM_ROWS = 8 };

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
typedef struct colsum_plan {
    int64_t blocks, group, groups; /* groups == 1: one level */
} colsum_plan;

static colsum_plan colsum_plan_of(int64_t blocks)
{
    colsum_plan c = {.blocks = blocks, .group = blocks, .groups = 1};
    if (blocks > COLSUM_ONE_LEVEL) {
        while (c.group > 1 && (c.group - 1) * (c.group - 1) >= blocks) c.group--;
        c.groups = (blocks + c.group - 1) / c.group;
    }
    return c;
}

/* Partial rows in a column sum's scratch: the blocks' and the groups'. */
static int64_t colsum_rows(const colsum_plan *c) { return c->blocks + (c->groups > 1 ? c->groups : 0); }

/* Adds this row's columns of column sum member m's operand to the
 * thread's sums cs<m>[] (declared before the row loop). */
static bool colsum_add(cg_text *t, row_kernel *rk, int m)
{
    const ir_node *x = rk->g->nodes[rk->s->members[m].node];
    int o = x->in[0], reg = -1; /* a row from outside: its chunks in registers, as the stages read them */
    if (rk->vw > 1 && rk->s->step_of[o] != (int)(rk->st - rk->s->steps) &&
        ir_numel(&rk->g->nodes[o]->type) == rk->rows * rk->C &&
        (reg = cg_param_of(&rk->ps, CG_PARAM_NODE, o, false, 0)) < 64)
        load_row(t, rk, reg);
    else
        reg = -1;
    put_columns(t, rk);
    cg_put(t, "            if (col < %lldll) cs%d[j_] += ", (long long)rk->C, m);
    if (!operand_at(t, rk, x, 0, "col", "j_", reg)) return false;
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
static void put_rows_added(cg_text *t, const row_kernel *rk, const int *ms, int n, const int *kp, const int *ko,
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
 * partial rows added per column by the last blocks (colsum_plan). */
static void colsum_frame(cg_text *post, row_kernel *rk, const int *ms, int n, const colsum_plan *c)
{
    int kp[IR_MAX_COLSUMS], ko[IR_MAX_COLSUMS];
    bool warp = rk->team == 32;
    char col[96];
    column_of(rk, "j_", col, sizeof col); /* the columns this thread summed (put_columns') */
    cg_put(post, "    __shared__ unsigned last_;\n");
    if (warp) cg_put(post, "    __shared__ T cst_[%d][32];\n    const int w_ = threadIdx.x >> 5;\n", WARPS);
    for (int i = 0; i < n; i++) {
        int m = ms[i], node = rk->s->members[m].node;
        kp[i] = cg_param_of(&rk->ps, CG_PARAM_ROWS, node, true, colsum_rows(c) * rk->C);
        ko[i] = cg_param_of(&rk->ps, CG_PARAM_NODE, node, true, 0);
        cg_put(post, "    for (int j_ = 0; j_ < %d; j_++) {\n        const int col = %s;\n", rk->cpl, col);
        if (warp)
            cg_put(post, "        __syncthreads();\n        cst_[w_][lane] = cs%d[j_];\n"
                         "        for (int h_ = %d; h_ > 0; h_ >>= 1) {\n            __syncthreads();\n"
                         "            if (w_ < h_) cst_[w_][lane] += cst_[w_ + h_][lane];\n        }\n"
                         "        if (w_ == 0 && col < %lldll) p%d[(long long)blockIdx.x * %lldll + col] = cst_[0][lane];\n    }\n",
                   m, WARPS / 2, (long long)rk->C, kp[i], (long long)rk->C);
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

/* An elementwise part of a streaming row kernel: a pass over the row
 * storing its stored members (and checking those checked), when it has
 * any; for each member a later part reads, the lambda r<m>(slot)
 * computing the part again at that column. */
static void stream_part(cg_text *t, row_kernel *rk, const sched_part *part, const ir_type *space)
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
        put_columns(t, rk);
        cg_put(t, "            if (col >= %s) continue;\n            const long long e_ = row * %lldll + col;\n",
               ew_bound(rk, part, cb, sizeof cb), (long long)rk->C);
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

/* The kernels of row step k; with `vector`, 16-byte accesses where
 * row_width allows. */
static const char *emit_row(cg_program *prog, const ir_graph *g, const schedule *s, int k, bool vector)
{
    const sched_step *st = &s->steps[k];
    const ir_node *last = g->nodes[st->pos];
    cg_text decl = {0};
    row_kernel rk = {.g = g, .s = s, .st = st, .vw = 1, .decl = &decl};
    if (st->kind != STEP_KIND_OP) /* a row op step's result is checked after it (cg_emit_check_kernel) */
        rk.checks = prog->checks, rk.covered = prog->covered;
    ir_type space = st->space;
    if (st->kind == STEP_KIND_OP) {
        if (!ir_ops[last->op].row) return "no kernel yet for this op (a library call or an op kernel)";
        int axis = -1;
        const ir_type *in0 = &g->nodes[last->in[0]]->type;
        space = *in0;
        rk.wide = in0->dtype == ALLOY_F64;
        if (ir_attr_schema(last->op, "axis")) {
            if (!ir_norm_axis(ir_attr_i(last, "axis"), in0->rank, &axis)) return "a row op's axis is out of range";
            if (strlen(ir_ops[last->op].row->roles) != (size_t)last->nin || strspn(ir_ops[last->op].row->roles, "r") != (size_t)last->nin)
                if (axis != in0->rank - 1) return "a row op with vector operands along another axis than the last: no kernel yet";
        }
        rk.inner = 1;
        if (axis >= 0 && axis != in0->rank - 1) { /* rows along an inner axis: the row's elements are strided */
            for (int d = axis + 1; d < in0->rank; d++) rk.inner *= in0->dims[d];
            rk.C = in0->dims[axis];
        } else {
            rk.C = space.rank ? space.dims[space.rank - 1] : 1;
        }
    } else {
        rk.inner = 1;
        rk.C = space.rank ? space.dims[space.rank - 1] : 1;
    }
    rk.space = &space;
    rk.rows = rk.C ? ir_numel(&space) / rk.C : 0;
    if (vector) rk.vw = row_width(&rk);
    if (!choose_team(&rk)) return "rows longer than 65536 elements in a step with column sums: no kernel yet";
    if (rk.rows == 0) return "no rows";
    cg_text body = {0}, t = {0}, pre = {0}, post = {0};
    const char *why = NULL;
    for (int m = st->first; m < st->first + st->n; m++)
        rk.causal |= ir_ops[g->nodes[s->members[m].node]->op].row && ir_row_causal(g, g->nodes[s->members[m].node]);
    rk.causal = rk.causal && rk.inner == 1 && space.rank >= 2;
    rk.limited = rk.causal && limited_step(g, s, st);
    if (rk.causal) /* the row's live columns (ir_causal_live) */
        cg_put(&body, "        const long long lim_ = row %% %lldll + %lldll; (void)lim_;\n",
               (long long)space.dims[space.rank - 2], (long long)(rk.C - space.dims[space.rank - 2] + 1));
    for (int m = st->first; m < st->first + st->n && !rk.stream; m++)
        if (s->members[m].flags & MEMBER_SPILLED) cg_put(&body, "        T r%d[%d];\n", m, rk.cpl);
    for (int q = st->first_part; q < st->first_part + st->nparts; q++)
        if (s->parts[q].kind == PART_OP) declare_slots(&body, &rk, s->parts[q].first);
    for (int q = st->first_part; q < st->first_part + st->nparts && !why; q++) {
        const sched_part *part = &s->parts[q];
        if (part->kind == PART_COLSUM) {
            if (!colsum_add(&body, &rk, part->first)) why = "a column sum's operand is not one a row kernel reads";
            continue;
        }
        if (part->kind == PART_OP) {
            if (!emit_program(&body, &rk, part->first)) why = "an operand of a row op is broadcast in a way no kernel reads yet";
            continue;
        }
        if (rk.stream) {
            stream_part(&body, &rk, part, &space);
            continue;
        }
        /* vw > 1: row-shaped operands read from l<k>_[i_] (loaded before
         * the part when first read), stores through s<k>_, a chunk per
         * 16-byte access */
        uint64_t vload = 0, vstore = 0;
        cg_ew_part ep = {.g = g, .s = s, .step = st, .first = part->first, .n = part->n, .space = &space,
                         .wide = part->wide, .product = -1, .ps = &rk.ps, .e = "e_", .slot = "j_",
                         .vec = rk.vw > 1, .vload = &vload, .vstore = &vstore, .vfail = &rk.vfail,
                         .checks = rk.checks, .covered = rk.covered};
        cg_text members = {0};
        cg_emit_members(&members, &ep);
        for (int i = 0; i < 64; i++)
            if (vload >> i & 1) load_row(&body, &rk, i);
        if (rk.vw > 1) cg_put(&body, "        {\n");
        for (int i = 0; i < 64; i++)
            if (vstore >> i & 1)
                cg_put(&body, "        alignas(16) %s s%d_[%d];\n", cg_storage(g->nodes[rk.ps.at[i].node]->type.dtype), i,
                       rk.cpl);
        char cb[32];
        put_columns(&body, &rk);
        cg_put(&body, "            if (col >= %s) continue;\n            const long long e_ = row * %lldll + col;\n",
               ew_bound(&rk, part, cb, sizeof cb), (long long)rk.C);
        if (rk.vw > 1) cg_put(&body, "            const int i_ = j_; (void)i_;\n");
        cg_put(&body, "%s", members.s ? members.s : "");
        body.oom |= members.oom;
        cg_text_free(&members);
        for (int i = 0; i < 64; i++)
            if (vstore >> i & 1)
                cg_put(&body, "            if (j_ %% %d == %d) alloy_vcopy<%d>(p%d + e_ - %d, s%d_ + j_ - %d);\n", rk.vw,
                       rk.vw - 1, (int)alloy_dtype_size(g->nodes[rk.ps.at[i].node]->type.dtype) * rk.vw, i, rk.vw - 1,
                       i, rk.vw - 1);
        cg_put(&body, "        }\n%s", rk.vw > 1 ? "        }\n" : "");
    }
    if (!why && rk.vfail) why = VECTOR_FAILED;
    char name[48];
    al_fmt(name, sizeof name, "alloy_s%d_row", k);
    if (!why) {
        bool warp = rk.team == 32;
        int block = warp ? 32 * WARPS : rk.team, per_block = warp ? WARPS : 1;
        int64_t blocks = (rk.rows + per_block - 1) / per_block;
        if (blocks > CG_MAX_GRID) blocks = CG_MAX_GRID;
        /* column sums (the stored ones): a partial row per block, so fewer teams */
        int sums[IR_MAX_COLSUMS], nsums = 0;
        for (int q = st->first_part; q < st->first_part + st->nparts; q++)
            if (s->parts[q].kind == PART_COLSUM)
                cg_put(&pre, "    T cs%d[%d];\n    for (int j_ = 0; j_ < %d; j_++) cs%d[j_] = 0;\n", s->parts[q].first,
                       rk.cpl, rk.cpl, s->parts[q].first);
        for (int q = st->first_part; q < st->first_part + st->nparts && !why; q++)
            if (s->parts[q].kind == PART_COLSUM && (s->members[s->parts[q].first].flags & MEMBER_STORED)) {
                if (nsums == IR_MAX_COLSUMS) why = "a row step with more than 4 column sums (IR_MAX_COLSUMS)";
                else sums[nsums++] = s->parts[q].first;
            }
        /* read and written once; a limited step reads its rows' live columns alone */
        int64_t bytes = (int64_t)((double)ir_nbytes(&space) * (1 + cg_row_read_share(g, s, k)));
        if (nsums) {
            int64_t teams = rk.rows / COLSUM_TEAM_ROWS < COLSUM_MAX_TEAMS ? rk.rows / COLSUM_TEAM_ROWS : COLSUM_MAX_TEAMS;
            if (blocks > teams / per_block) blocks = teams / per_block > 0 ? teams / per_block : 1;
            colsum_plan cp = colsum_plan_of(blocks);
            colsum_frame(&post, &rk, sums, nsums, &cp);
            for (int i = 0; i < nsums; i++) /* the partial rows written and read back, the sum stored */
                bytes += 2 * 4 * colsum_rows(&cp) * rk.C + (int64_t)ir_nbytes(&g->nodes[s->members[sums[i]].node]->type);
        }
        cg_put_preamble(&t);
        cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", block, name);
        cg_param_list(&t, g, &rk.ps);
        cg_put(&t, ")\n{\n    typedef %s T;\n", rk.wide ? "double" : "float");
        if (warp)
            cg_put(&t, "    const int lane = threadIdx.x & 31;\n    const long long row0_ = (long long)blockIdx.x * %d + (threadIdx.x >> 5);\n",
                   WARPS);
        else
            cg_put(&t, "    __shared__ T red_[32];\n    const int lane = threadIdx.x;\n    const long long row0_ = blockIdx.x;\n");
        cg_put(&t, "    int bad_ = 0; (void)bad_;\n%s"
                   "    for (long long row = row0_; row < %lldll; row += (long long)gridDim.x * %d) {\n%s%s    }\n%s}\n",
               pre.s ? pre.s : "", (long long)rk.rows, per_block, decl.s ? decl.s : "", body.s ? body.s : "",
               post.s ? post.s : "");
        if (!why && (body.oom || decl.oom || pre.oom || post.oom || rk.ps.oom ||
                     !cg_add_kernel(prog, g, name, k, st->kind, &t, &rk.ps, (unsigned)blocks, (unsigned)block, bytes)))
            why = "out of memory";
    }
    /* ops with a result per row: their mean, by a second kernel */
    for (int m = st->first; m < st->first + st->n && !why; m++) {
        const ir_node *x = g->nodes[s->members[m].node];
        if (!ir_ops[x->op].row || !ir_row_summarize(ir_ops[x->op].row).per_row_result) continue;
        if (!emit_mean(prog, &rk, k, m, &t)) why = "out of memory";
    }
    cg_text_free(&body), cg_text_free(&t), cg_text_free(&decl), cg_text_free(&pre), cg_text_free(&post);
    al_free(rk.ps.at);
    return why;
}

const char *cg_emit_row(cg_program *prog, const ir_graph *g, const schedule *s, int k)
{
    const char *why = emit_row(prog, g, s, k, true);
    return why == VECTOR_FAILED ? emit_row(prog, g, s, k, false) : why;
}
