/* emit_row.c - row kernels: a team of threads per row (one warp for short rows, a block for long ones); the step's row shape, its team and chunk width, the kernel around the row's programs and elementwise parts, per-row results averaged by a second kernel. */
#include <string.h>

#include "codegen/emit_impl.h"

/* Returned by emit_row when the vectorized kernel needs a bit past 63. */
static const char VECTOR_FAILED[] = "a row kernel's vector accesses name a parameter past 63";

/* Elements of the widest row-shaped ([rows, C]: numel rows * C) operand
 * from outside the step or stored member in 16 bytes, when C is a multiple
 * of it and rows run along the last axis; else 1. */
static int row_width(const cg_row_kernel *rk)
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

/* Threads per row and columns per thread for rows of C columns (whole
 * chunks of vw, which divides C), streaming (vw 1) rows over
 * CG_ROW_MAX_TEAM * CG_ROW_TEAM_COLS columns where the step allows; false
 * when a row neither streams nor fits in registers. */
static bool choose_team(cg_row_kernel *rk)
{
    if (rk->C <= CG_ROW_WARP_MAX_COLS) {
        rk->team = 32;
    } else {
        rk->team = 64;
        while (rk->team < CG_ROW_MAX_TEAM && (rk->C + rk->team - 1) / rk->team > CG_ROW_TEAM_COLS) rk->team *= 2;
    }
    int64_t cpl = (rk->C / rk->vw + rk->team - 1) / rk->team * rk->vw;
    if (rk->team == CG_ROW_MAX_TEAM && cpl > CG_ROW_TEAM_COLS && cpl <= INT32_MAX / CG_ROW_MAX_TEAM &&
        cg_row_streamable(rk)) {
        rk->stream = true;
        rk->vw = 1;
        cpl = (rk->C + rk->team - 1) / rk->team;
    }
    rk->cpl = (int)(cpl > 0 ? cpl : 1);
    return rk->stream || cpl <= CG_ROW_MAX_COLS_PER_THREAD;
}

/* The kernel combining member m's per-row results into its value: their
 * sum over the sum of the rows' weights (stored after them), or their sum
 * for reduction="sum". */
static bool emit_mean(cg_program *prog, const cg_row_kernel *rk, int k, int m, cg_text *t)
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

/* The kernels of row step k; with `vector`, 16-byte accesses where
 * row_width allows. */
static const char *emit_row(cg_program *prog, const ir_graph *g, const schedule *s, int k, bool vector)
{
    const sched_step *st = &s->steps[k];
    const ir_node *last = g->nodes[st->pos];
    cg_text decl = {0};
    cg_row_kernel rk = {.g = g, .s = s, .st = st, .vw = 1, .decl = &decl};
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
    rk.limited = rk.causal && cg_row_limited(g, s, st);
    if (rk.causal) /* the row's live columns (ir_causal_live) */
        cg_put(&body, "        const long long lim_ = row %% %lldll + %lldll; (void)lim_;\n",
               (long long)space.dims[space.rank - 2], (long long)(rk.C - space.dims[space.rank - 2] + 1));
    for (int m = st->first; m < st->first + st->n && !rk.stream; m++)
        if (s->members[m].flags & MEMBER_SPILLED) cg_put(&body, "        T r%d[%d];\n", m, rk.cpl);
    for (int q = st->first_part; q < st->first_part + st->nparts; q++)
        if (s->parts[q].kind == PART_OP) cg_row_declare_slots(&body, &rk, s->parts[q].first);
    for (int q = st->first_part; q < st->first_part + st->nparts && !why; q++) {
        const sched_part *part = &s->parts[q];
        if (part->kind == PART_COLSUM) {
            if (!cg_row_colsum_add(&body, &rk, part->first)) why = "a column sum's operand is not one a row kernel reads";
            continue;
        }
        if (part->kind == PART_OP) {
            if (!cg_row_program(&body, &rk, part->first)) why = "an operand of a row op is broadcast in a way no kernel reads yet";
            continue;
        }
        if (rk.stream) {
            cg_row_stream_part(&body, &rk, part, &space);
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
            if (vload >> i & 1) cg_row_load(&body, &rk, i);
        if (rk.vw > 1) cg_put(&body, "        {\n");
        for (int i = 0; i < 64; i++)
            if (vstore >> i & 1)
                cg_put(&body, "        alignas(16) %s s%d_[%d];\n", cg_storage(g->nodes[rk.ps.at[i].node]->type.dtype), i,
                       rk.cpl);
        char cb[32];
        cg_row_put_columns(&body, &rk);
        cg_put(&body, "            if (col >= %s) continue;\n            const long long e_ = row * %lldll + col;\n",
               cg_row_ew_bound(&rk, part, cb, sizeof cb), (long long)rk.C);
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
        int block = warp ? 32 * CG_ROW_WARPS : rk.team, per_block = warp ? CG_ROW_WARPS : 1;
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
            int64_t teams = rk.rows / CG_ROW_COLSUM_TEAM_ROWS < CG_ROW_COLSUM_MAX_TEAMS ? rk.rows / CG_ROW_COLSUM_TEAM_ROWS
                                                                                     : CG_ROW_COLSUM_MAX_TEAMS;
            if (blocks > teams / per_block) blocks = teams / per_block > 0 ? teams / per_block : 1;
            cg_row_colsum_plan cp = cg_row_colsum_plan_of(blocks);
            cg_row_colsum_frame(&post, &rk, sums, nsums, &cp);
            for (int i = 0; i < nsums; i++) /* the partial rows written and read back, the sum stored */
                bytes += 2 * 4 * cg_row_colsum_rows(&cp) * rk.C + (int64_t)ir_nbytes(&g->nodes[s->members[sums[i]].node]->type);
        }
        cg_put_preamble(&t);
        cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", block, name);
        cg_param_list(&t, g, &rk.ps);
        cg_put(&t, ")\n{\n    typedef %s T;\n", rk.wide ? "double" : "float");
        if (warp)
            cg_put(&t, "    const int lane = threadIdx.x & 31;\n    const long long row0_ = (long long)blockIdx.x * %d + (threadIdx.x >> 5);\n",
                   CG_ROW_WARPS);
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
