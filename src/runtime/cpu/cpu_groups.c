/* cpu_groups.c - runs the ROW, GEMM and MULTI fusion groups (ir/groups.h) on the CPU, one pass over memory each. */
#include <string.h>

#include "ir/groups.h"
#include "kernels/ref.h"
#include "base/convert.h"
#include "runtime/cpu/cpu.h"
#include "runtime/cpu/cpu_fused.h"
#include "runtime/cpu/gemm_lowp.h"
#include "step/attn_views.h"

/* Elements of one row block: the block's values of every member stay in L2
 * while its steps run (16k f32 = 64 KB per value). */
enum { ROW_BLOCK_ELEMS = 16384, MIN_ROW_WORK = 1 << 16 }; /* MAX_THREADS: cpu_fused.h */

/* ---- ROW groups ---- */

/* How a tensor from outside the group is read by a block of rows. */
typedef enum view_kind {
    VIEW_FULL,    /* the group's shape: the block's rows of it */
    VIEW_WHOLE,   /* one row broadcast to all ([C], [1, C], a scalar): all of it */
    VIEW_PERROW,  /* one value per row ([rows] targets, or [.., 1]): the block's ones */
    VIEW_OTHER,   /* anything else: only a single block of all rows can read it */
} view_kind;

typedef struct row_thread {
    cpu_exec x;
    cpu_workers *w;   /* chunk buffers for this thread's EW steps; no threads */
    /* block views of the group's inputs and members, by node id (the run's
     * workers lend the array; the other entries are stale and never read) */
    rt_tensor *view;
    char *scratch;    /* block buffers of members read by a later step */
    float *stack;     /* the column sums' pairwise stack (REF_COLSUM_STACK floats) */
} row_thread;

typedef struct row_group {
    const ir_graph *g;
    const schedule *s;
    const sched_step *step;
    const sched_member *members;
    int n;
    rt_tensor *values;
    ir_type full;             /* the iteration shape */
    int64_t rows, C, period, block_rows, nblocks;
    int64_t *block_start;     /* block b is rows [block_start[b], block_start[b + 1]) */
    int ncolsums, tree_depth; /* column sums; the depth of the blocks in the pairwise tree */
    float *partials;          /* per column sum, per block: its C column sums */
    const int *ext;           /* inputs from outside (the step's), and their view kinds */
    int next;
    uint8_t *ext_kind;
    size_t *scratch_at;       /* per member: offset of its block buffer, or SIZE_MAX */
    size_t scratch_bytes;
    void *losses;             /* members with a per-row result (cross_entropy): those and their weights (f32), 2 arrays each */
    row_thread t[MAX_THREADS];
} row_group;

static bool dims_eq(int ra, const int64_t *a, int rb, const int64_t *b)
{
    return ra == rb && memcmp(a, b, sizeof(int64_t) * (size_t)ra) == 0;
}

static view_kind classify(const ir_type *t, const ir_type *full)
{
    int r = full->rank;
    if (dims_eq(t->rank, t->dims, r, full->dims)) return VIEW_FULL;
    bool whole = t->rank <= r;
    for (int d = 0; d + 1 < t->rank && whole; d++) whole = t->dims[d] == 1;
    if (whole && (t->rank == 0 || t->dims[t->rank - 1] == 1 || t->dims[t->rank - 1] == full->dims[r - 1]))
        return VIEW_WHOLE;
    if (dims_eq(t->rank, t->dims, r - 1, full->dims)) return VIEW_PERROW;
    if (t->rank == r && dims_eq(r - 1, t->dims, r - 1, full->dims) && t->dims[r - 1] == 1) return VIEW_PERROW;
    return VIEW_OTHER;
}

/* The type of a block of rb rows of a tensor of kind k and type t. */
static ir_type block_type(const row_group *rg, const ir_type *t, view_kind k, int64_t rb)
{
    if (k == VIEW_WHOLE || k == VIEW_OTHER || rb == rg->rows) return *t;
    ir_type b = *t;
    int64_t last = k == VIEW_FULL ? rg->C : 1;
    bool keep_last = k == VIEW_FULL || t->rank == rg->full.rank; /* [.., 1] keeps its 1 */
    b.rank = 0;
    if (rg->period > 1) {
        b.dims[b.rank++] = rb / rg->period;
        b.dims[b.rank++] = rg->period;
    } else {
        b.dims[b.rank++] = rb;
    }
    if (keep_last) b.dims[b.rank++] = last;
    return b;
}

static void set_view(const row_group *rg, rt_tensor *v, const rt_tensor *whole, view_kind k, int64_t r0,
                     int64_t rb)
{
    size_t es = alloy_dtype_size(whole->type.dtype);
    v->type = block_type(rg, &whole->type, k, rb);
    v->data = whole->data;
    if (whole->data && (k == VIEW_FULL || k == VIEW_PERROW) && rb != rg->rows)
        v->data = (char *)whole->data + (size_t)r0 * (size_t)(k == VIEW_FULL ? rg->C : 1) * es;
}

static void row_block(void *arg, int64_t b, int ti)
{
    row_group *rg = arg;
    row_thread *t = &rg->t[ti];
    if (t->x.status) return;
    const ir_graph *g = rg->g;
    int64_t r0 = rg->block_start[b], rb = rg->block_start[b + 1] - r0;
    for (int e = 0; e < rg->next; e++)
        set_view(rg, &t->view[rg->ext[e]], &rg->values[rg->ext[e]], rg->ext_kind[e], r0, rb);
    for (int k = 0; k < rg->n; k++) {
        int id = rg->members[k].node;
        const ir_node *m = g->nodes[id];
        rt_tensor *v = &t->view[id];
        if ((ir_ops[m->op].row && ir_row_summarize(ir_ops[m->op].row).per_row_result) || ir_fuse_colsum(g, m)) {
            *v = rg->values[id]; /* written after the blocks, from their per-row results or column sums */
            continue;
        }
        rt_tensor whole = {m->type, rg->values[id].data};
        set_view(rg, v, &whole, ir_row_keeps(m) ? VIEW_PERROW : VIEW_FULL, r0, rb); /* a statistic: [rows, 1] */
        if (!whole.data) v->data = rg->scratch_at[k] == SIZE_MAX ? NULL : t->scratch + rg->scratch_at[k];
    }
    ir_type space = block_type(rg, &rg->full, VIEW_FULL, rb);
    int ce = 0, cs = 0;
    const schedule *s = rg->s;
    for (int p = rg->step->first_part; p < rg->step->first_part + rg->step->nparts && !t->x.status; p++) {
        const sched_part *part = &s->parts[p];
        if (part->kind == PART_EW) {
            cpu_run_group_ex(&t->x, g, &s->members[part->first], part->n, t->view, t->w, &space, NULL);
            continue;
        }
        const ir_node *m = g->nodes[s->members[part->first].node];
        if (part->kind == PART_COLSUM) { /* this block's rows of the f32 operand, summed per column */
            const rt_tensor *o = &t->view[m->in[0]];
            if (!o->data) {
                char label[64];
                cpu_fail(&t->x, ALLOY_ERR_VERIFY, "column sum %s of a row group: its operand has no block values",
                         ir_node_label(m, label, sizeof label));
                return;
            }
            float *partial = rg->partials + ((size_t)cs++ * (size_t)rg->nblocks + (size_t)b) * (size_t)rg->C;
            ref_column_sums_f32(o->data, rb, rg->C, partial, t->stack);
            continue;
        }
        rt_tensor in[6]; /* a row op has at most 6 operands (cpu_rows.h) */
        for (int j = 0; j < m->nin && j < 6; j++) in[j] = t->view[m->in[j]];
        float *results = NULL; /* a per-row result (cross_entropy's losses): this block's rows of them */
        if (ir_row_summarize(ir_ops[m->op].row).per_row_result)
            results = (float *)rg->losses + (size_t)ce++ * 2 * (size_t)rg->rows + r0;
        cpu_row_run(&t->x, m, &t->view[m->id], in, rg->rows, results, ir_row_causal(g, m));
    }
}

/* The blocks of a row group with column sums: the subtrees of the pairwise
 * tree of reduce_sum over the rows (ref_column_sums_f32) that first have at
 * most br rows (br >= REF_SUM_LEAF, so every node split here is split by the
 * unfused sum too); each block's sums are then that subtree's, and combining
 * them in the tree's order gives the unfused result bit for bit. Counts the
 * blocks into *n, writing their first rows to starts when not NULL, and
 * returns the depth of the deepest. */
static int tree_blocks(int64_t lo, int64_t hi, int64_t br, int64_t *starts, int64_t *n)
{
    if (hi - lo <= br) {
        if (starts) starts[*n] = lo;
        (*n)++;
        return 0;
    }
    int64_t mid = lo + (hi - lo) / 2;
    int a = tree_blocks(lo, mid, br, starts, n), b = tree_blocks(mid, hi, br, starts, n);
    return 1 + (a > b ? a : b);
}

/* out[0..C) = the column sums of rows [lo, hi) from the blocks' partial sums
 * (*block: the next block in row order), adding the halves as the pairwise
 * tree does; stack holds C floats per level below. */
static void tree_combine(const row_group *rg, const float *partials, int64_t lo, int64_t hi, int64_t *block,
                         float *out, float *stack)
{
    if (rg->block_start[*block] == lo && rg->block_start[*block + 1] == hi) {
        memcpy(out, partials + (size_t)(*block)++ * (size_t)rg->C, sizeof(float) * (size_t)rg->C);
        return;
    }
    int64_t mid = lo + (hi - lo) / 2;
    tree_combine(rg, partials, lo, mid, block, out, stack);
    tree_combine(rg, partials, mid, hi, block, stack, stack + rg->C);
    for (int64_t j = 0; j < rg->C; j++) out[j] += stack[j];
}

/* Each column sum's result from its blocks' partial sums, stored in f32;
 * false when out of memory. */
static bool colsum_results(const row_group *rg)
{
    float *sums = al_malloc(sizeof(float) * (size_t)rg->C * ((size_t)rg->tree_depth + 2));
    if (!sums) return false;
    const sched_step *step = rg->step;
    for (int q = step->first_part, cs = 0; q < step->first_part + step->nparts; q++) {
        if (rg->s->parts[q].kind != PART_COLSUM) continue;
        const ir_node *m = rg->g->nodes[rg->s->members[rg->s->parts[q].first].node];
        int64_t block = 0;
        tree_combine(rg, rg->partials + (size_t)cs++ * (size_t)rg->nblocks * (size_t)rg->C, 0, rg->rows, &block, sums,
                     sums + rg->C);
        if (rg->values[m->id].data) memcpy(rg->values[m->id].data, sums, sizeof(float) * (size_t)rg->C);
    }
    al_free(sums);
    return true;
}

alloy_status cpu_run_row(cpu_exec *x, const ir_graph *g, const schedule *s, const sched_step *step,
                         rt_tensor *values, cpu_workers *w)
{
    char label[64];
    const sched_member *members = &s->members[step->first];
    int n = step->n;
    const ir_node *last = g->nodes[step->pos];
    row_group *rg = al_calloc(1, sizeof *rg);
    if (!rg) return cpu_fail(x, ALLOY_ERR_OOM, "out of memory running the row group ending at %s",
                             ir_node_label(last, label, sizeof label));
    rg->g = g, rg->s = s, rg->step = step, rg->members = members, rg->n = n, rg->values = values;
    rg->full = step->space;
    rg->C = rg->full.rank ? rg->full.dims[rg->full.rank - 1] : 1;
    rg->rows = rg->C ? ir_numel(&rg->full) / rg->C : 0;
    rg->period = 1;
    rg->ext = &s->inputs[step->first_in];
    rg->next = step->nin;
    rg->ext_kind = al_malloc((size_t)step->nin + 1);
    rg->scratch_at = al_malloc(sizeof(size_t) * (size_t)n);
    static const char oom[] = "out of memory"; /* the one reason that is ALLOY_ERR_OOM */
    const char *why = NULL;
    int nce = 0, threads = 1;
    bool single = false;
    if (!rg->ext_kind || !rg->scratch_at) why = oom;
    for (int q = step->first_part; q < step->first_part + step->nparts && !why; q++) {
        if (s->parts[q].kind != PART_COLSUM) continue;
        rg->ncolsums++; /* (a bundle's schedule is read as it says; its graph verified) */
        if (!ir_fuse_colsum(g, g->nodes[s->members[s->parts[q].first].node])) why = "a column sum part is no column sum";
    }
    for (int e = 0; e < rg->next && !why; e++) {
        int o = rg->ext[e];
        if (!values[o].data && ir_nbytes(&values[o].type)) why = "an input of the group has no value";
        rg->ext_kind[e] = (uint8_t)classify(&g->nodes[o]->type, &rg->full);
        single |= rg->ext_kind[e] == VIEW_OTHER;
    }
    for (int k = 0; k < n && !why; k++) {
        const ir_node *m = g->nodes[members[k].node];
        ir_row_summary rs = ir_ops[m->op].row ? ir_row_summarize(ir_ops[m->op].row) : (ir_row_summary){0};
        /* a program that reads its row's place needs whole [.., queries, keys] blocks */
        /* (a causal softmax or its gradient too: its rows' live columns) */
        if (rs.by_position || ir_row_causal(g, m)) rg->period = rg->full.dims[rg->full.rank - 2];
        nce += rs.per_row_result;
        /* a row op's result, and a value a later part reads, need a block
         * buffer when not stored (a per-row result has its own) */
        bool row_op = ir_ops[m->op].row && !rs.per_row_result;
        rg->scratch_at[k] = row_op || (members[k].flags & MEMBER_SPILLED) ? 0 : SIZE_MAX;
    }
    if (!why && rg->rows > 0) {
        int64_t br = ROW_BLOCK_ELEMS / (rg->C ? rg->C : 1);
        br = br / rg->period * rg->period;
        if (br < rg->period) br = rg->period;
        rg->block_rows = single || br > rg->rows ? rg->rows : br;
        rg->nblocks = (rg->rows + rg->block_rows - 1) / rg->block_rows;
        if (rg->ncolsums && rg->period > 1) rg->block_rows = rg->rows, rg->nblocks = 1; /* one subtree: all rows */
        if (rg->ncolsums && rg->nblocks > 1) { /* blocks along the pairwise tree */
            if (br < REF_SUM_LEAF) br = REF_SUM_LEAF;
            rg->nblocks = 0;
            rg->tree_depth = tree_blocks(0, rg->rows, br, NULL, &rg->nblocks);
            rg->block_rows = br;
        }
        rg->block_start = al_malloc(sizeof(int64_t) * ((size_t)rg->nblocks + 1));
        if (!rg->block_start) why = oom;
    }
    if (!why && rg->rows > 0) {
        if (rg->ncolsums && rg->nblocks > 1) {
            int64_t nb = 0;
            tree_blocks(0, rg->rows, rg->block_rows, rg->block_start, &nb);
            int64_t most = 0; /* the largest block, for the block buffers */
            rg->block_start[nb] = rg->rows;
            for (int64_t b = 0; b < nb; b++) {
                int64_t size = rg->block_start[b + 1] - rg->block_start[b];
                if (size > most) most = size;
            }
            rg->block_rows = most;
        } else {
            for (int64_t b = 0; b < rg->nblocks; b++) rg->block_start[b] = b * rg->block_rows;
            rg->block_start[rg->nblocks] = rg->rows;
        }
        if (rg->ncolsums) {
            rg->partials = al_malloc(sizeof(float) * (size_t)rg->ncolsums * (size_t)rg->nblocks * (size_t)rg->C);
            if (!rg->partials) why = oom;
        }
        size_t at = 0;
        for (int k = 0; k < n; k++) {
            if (rg->scratch_at[k] == SIZE_MAX || values[members[k].node].data) {
                rg->scratch_at[k] = SIZE_MAX;
                continue;
            }
            rg->scratch_at[k] = at;
            at += ((size_t)rg->block_rows * (size_t)rg->C * alloy_dtype_size(g->nodes[members[k].node]->type.dtype) + 63) & ~(size_t)63;
        }
        rg->scratch_bytes = at;
        int64_t want = x->nthreads < MAX_THREADS ? x->nthreads : MAX_THREADS;
        if (want > rg->nblocks) want = rg->nblocks;
        if (rg->rows * rg->C * n < MIN_ROW_WORK) want = 1;
        threads = cpu_workers_threads(w, (int)want);
        if (nce) rg->losses = al_malloc(sizeof(float) * (size_t)nce * 2 * (size_t)rg->rows); /* results, weights */
        if (nce && !rg->losses) why = oom;
        for (int i = 0; i < threads && !why; i++) {
            row_thread *t = &rg->t[i];
            t->x.nthreads = 1;
            /* amp_check and amp_stats see the elementwise parts' values too */
            t->x.nonfinite = x->nonfinite, t->x.ranges = x->ranges;
            t->w = cpu_workers_new();
            t->view = cpu_workers_views(w, i, g->nnodes);
            t->scratch = al_malloc(rg->scratch_bytes ? rg->scratch_bytes : 1);
            t->stack = rg->ncolsums ? al_malloc(sizeof(float) * REF_COLSUM_STACK) : NULL;
            if (!t->w || !t->view || !t->scratch || (rg->ncolsums && !t->stack)) why = oom;
        }
    }
    if (!why && rg->rows > 0) {
        cpu_workers_run(w, threads, rg->nblocks, row_block, rg);
        for (int i = 0; i < threads; i++)
            if (rg->t[i].x.status && !x->status) {
                x->status = rg->t[i].x.status;
                memcpy(x->error, rg->t[i].x.error, sizeof x->error);
            }
        for (int k = 0, ce = 0; k < n && !x->status; k++) {
            const ir_node *m = g->nodes[members[k].node];
            if (!ir_ops[m->op].row || !ir_row_summarize(ir_ops[m->op].row).per_row_result) continue;
            if (values[m->id].data)
                cpu_row_mean(false, ir_row_sums(m), (float *)rg->losses + (size_t)ce * 2 * (size_t)rg->rows, rg->rows,
                             &values[m->id]);
            ce++;
        }
        if (!x->status && rg->ncolsums && !colsum_results(rg)) why = oom;
    }
    for (int i = 0; i < threads; i++) {
        cpu_workers_free(rg->t[i].w);
        al_free(rg->t[i].scratch), al_free(rg->t[i].stack);
    }
    al_free(rg->ext_kind), al_free(rg->scratch_at), al_free(rg->losses), al_free(rg->block_start), al_free(rg->partials);
    al_free(rg);
    if (why)
        return cpu_fail(x, why == oom ? ALLOY_ERR_OOM : ALLOY_ERR_VERIFY,
                        "row group ending at %s '%s': %s", ir_ops[last->op].name,
                        ir_node_label(last, label, sizeof label), why);
    return x->status;
}

/* ---- GEMM steps: the matmul or convolution into f32, then its epilogue as one EW pass ---- */

/* Whether bytes [p, p + n) and [q, q + m) overlap. */
static bool overlaps(const void *p, size_t n, const void *q, size_t m)
{
    return p && q && (const char *)p < (const char *)q + m && (const char *)q < (const char *)p + n;
}

/* The range rule of dtype over n f32 values at y, RANGE_BLOCK at a time
 * on the run's threads (block j one job). */
enum { RANGE_BLOCK = 1 << 16 };
typedef struct range_job {
    alloy_dtype dtype;
    float *y;
    int64_t n;
} range_job;

static void range_block(void *arg, int64_t j, int thread)
{
    (void)thread;
    const range_job *r = arg;
    int64_t i0 = j * RANGE_BLOCK, len = r->n - i0 < RANGE_BLOCK ? r->n - i0 : RANGE_BLOCK;
    cpu_range_f32(r->dtype, r->y + i0, len);
}

/* Whether bytes [p, p + n) overlap an operand of a step's matmul mm or its bias (-1: none). */
static bool overlaps_operands(const rt_tensor *values, const ir_node *mm, int bias, const void *p, size_t n)
{
    for (int j = 0; j < 2; j++)
        if (overlaps(p, n, values[mm->in[j]].data, ir_nbytes(&values[mm->in[j]].type))) return true;
    return bias >= 0 && overlaps(p, n, values[bias].data, ir_nbytes(&values[bias].type));
}

/* The f32 value a GEMM step's epilogue only widens its f16/bf16 product
 * into (its one member a cast to f32 of the product, stored, not checked,
 * not a state, and not over the product's operands or its own slot), or
 * NULL. The product is then computed straight into it: the cast's value is
 * the product with its range rule, which is applied in place. */
static void *widened_into(const cpu_exec *x, const ir_graph *g, const sched_step *step, const sched_member *members,
                          const rt_tensor *values)
{
    const ir_node *mm = g->nodes[members[0].node];
    if (step->n != 2 || mm->op != IR_OP_matmul || x->nonfinite || x->ranges) return NULL;
    if (mm->type.dtype != ALLOY_F16 && mm->type.dtype != ALLOY_BF16) return NULL;
    const ir_node *cast = g->nodes[members[1].node];
    if (cast->op != IR_OP_cast || cast->type.dtype != ALLOY_F32 || cast->in[0] != mm->id) return NULL;
    if (members[1].flags & (MEMBER_CHECK | MEMBER_EXACT | MEMBER_SPILLED | MEMBER_STRIDED | MEMBER_VIEW)) return NULL;
    if (x->state_of && x->state_of[cast->id] >= 0) return NULL;
    void *dst = values[cast->id].data;
    size_t bytes = ir_nbytes(&cast->type);
    if (!dst || ir_numel(&cast->type) != ir_numel(&mm->type)) return NULL;
    if (overlaps_operands(values, mm, -1, dst, bytes) || overlaps(dst, bytes, values[mm->id].data, ir_nbytes(&mm->type)))
        return NULL;
    return dst;
}

/* A GEMM step the CPU runs whole in the GEMM's tiles (gemm_lowp_epi):
 * its members an f16/bf16 matmul in its operands' dtype (a non-empty sum,
 * not stored, not checked, not over strided views), then the add of a
 * vector of its last dim in that dtype, or relu / gelu_tanh, or both in
 * that order, all of the matmul's type; the last stored, the add stored
 * or not (an activation's gradient reads it), none checked, rounded for
 * its readers (MEMBER_EXACT) but the last, spilled, strided or a view; no
 * amp_check / amp_stats; the stored values' slots apart from every
 * operand's and each other's. Fills *epi (but the bias's f32 copy) and
 * *bias (-1: none) and returns the last member, or returns -1. The
 * step's values are then the tiles', its fused group's bit for bit: the
 * same operations (the members' chunk functions, the range rule where a
 * member has it) in the same order on each element, with no f32 product
 * written out and read back. */
static int tile_epilogue(const cpu_exec *x, const ir_graph *g, const sched_step *step, const sched_member *members,
                         const rt_tensor *values, gemm_lowp_epilogue *epi, int *bias)
{
    *bias = -1;
    if (step->n < 2 || step->n > 3 || x->nonfinite || x->ranges) return -1;
    const ir_node *mm = g->nodes[members[0].node];
    alloy_dtype dt = mm->type.dtype;
    if (mm->op != IR_OP_matmul || (dt != ALLOY_F16 && dt != ALLOY_BF16) || mm->nin != 2) return -1;
    if (g->nodes[mm->in[0]]->type.dtype != dt || g->nodes[mm->in[1]]->type.dtype != dt) return -1;
    const ir_type *ta = &g->nodes[mm->in[0]]->type;
    if (ta->dims[ta->rank - (ir_attr_i(mm, "transpose_a") ? 2 : 1)] == 0 || attn_strided_matmul(g, mm)) return -1;
    if (members[0].flags & (MEMBER_STORED | MEMBER_CHECK)) return -1;
    *epi = (gemm_lowp_epilogue){.range = members[0].flags & MEMBER_RANGED ? dt : ALLOY_F32, .bias_range = ALLOY_F32};
    int cur = mm->id;
    for (int i = 1; i < step->n; i++) {
        const ir_node *n = g->nodes[members[i].node];
        unsigned f = members[i].flags;
        bool last = i + 1 == step->n;
        if (f & (MEMBER_CHECK | MEMBER_SPILLED | MEMBER_STRIDED | MEMBER_VIEW) || (!last && f & MEMBER_EXACT) ||
            (last && !(f & MEMBER_STORED)) || !ir_type_eq(&n->type, &mm->type))
            return -1;
        alloy_dtype ranged = f & MEMBER_RANGED ? dt : ALLOY_F32;
        if (n->op == IR_OP_add && i == 1 && n->nin == 2) {
            int b = n->in[0] == cur ? n->in[1] : n->in[1] == cur ? n->in[0] : -1;
            if (b < 0 || b == cur) return -1;
            const ir_type *tb = &g->nodes[b]->type;
            int64_t cols = mm->type.dims[mm->type.rank - 1];
            if (tb->dtype != dt || tb->rank < 1 || tb->dims[tb->rank - 1] != cols || ir_numel(tb) != cols) return -1;
            *bias = b, epi->bias_range = ranged;
            if (!last && f & MEMBER_STORED && !(epi->sum_out = values[n->id].data)) return -1;
        } else if ((n->op == IR_OP_relu || n->op == IR_OP_gelu_tanh) && last && n->nin == 1 && n->in[0] == cur) {
            epi->act = fz_kernels[n->op].f32; /* ranged or not: its store rounds past the range to inf */
        } else {
            return -1;
        }
        cur = n->id;
    }
    if (x->state_of && (x->state_of[cur] >= 0 || (epi->sum_out && x->state_of[members[1].node] >= 0))) return -1;
    const void *dst = values[cur].data;
    size_t bytes = ir_nbytes(&mm->type);
    if (!dst || overlaps_operands(values, mm, *bias, dst, bytes)) return -1;
    if (epi->sum_out && (overlaps_operands(values, mm, *bias, epi->sum_out, bytes) || overlaps(dst, bytes, epi->sum_out, bytes)))
        return -1;
    return cur;
}

alloy_status cpu_run_gemm(cpu_exec *x, const ir_graph *g, const schedule *s, const sched_step *step,
                          rt_tensor *values, cpu_workers *w)
{
    const sched_member *members = &s->members[step->first];
    const ir_node *mm = g->nodes[members[0].node];
    if (!ir_gemm_head(mm)) {
        char label[64];
        return cpu_fail(x, ALLOY_ERR_VERIFY, "gemm step headed by %s '%s', not a matmul or convolution",
                        ir_ops[mm->op].name, ir_node_label(mm, label, sizeof label));
    }
    gemm_lowp_epilogue epi;
    int bias, out = mm->op == IR_OP_matmul ? tile_epilogue(x, g, step, members, values, &epi, &bias) : -1;
    if (out >= 0) { /* the product and its epilogue in the GEMM's tiles, straight into the stored members' slots */
        int64_t n = bias >= 0 ? ir_numel(&g->nodes[bias]->type) : 0;
        float *b32 = bias >= 0 ? al_malloc(sizeof(float) * (size_t)n) : NULL;
        if (bias >= 0 && !b32) return cpu_out_of_memory(x, mm);
        if (b32) cvt_load_f32(mm->type.dtype, values[bias].data, b32, (size_t)n);
        epi.bias = b32;
        rt_tensor in[2] = {values[mm->in[0]], values[mm->in[1]]};
        cpu_matmul_epilogue(x, mm, &values[out], in, &epi);
        al_free(b32);
        return x->status;
    }
    int64_t count = ir_numel(&mm->type);
    size_t bytes = sizeof(float) * (size_t)(count ? count : 1);
    rt_tensor saved = values[mm->id];
    void *widened = widened_into(x, g, step, members, values);
    if (widened) { /* the cast's value is the product, ranged: no product buffer, no copy */
        rt_tensor wide = {mm->type, widened}, in[3];
        wide.type.dtype = ALLOY_F32;
        for (int j = 0; j < mm->nin && j < 3; j++) in[j] = values[mm->in[j]];
        if (cpu_matmul(x, mm, &wide, in)) return x->status;
        if (saved.data) cvt_store_f32(mm->type.dtype, widened, saved.data, (size_t)count);
        if (members[0].flags & MEMBER_RANGED) {
            range_job r = {mm->type.dtype, widened, count};
            int64_t blocks = (count + RANGE_BLOCK - 1) / RANGE_BLOCK;
            int want = blocks < x->nthreads ? (int)blocks : x->nthreads;
            int threads = w && want > 1 ? cpu_workers_threads(w, want) : 1;
            cpu_workers_run(w, threads, blocks, range_block, &r);
        }
        return ALLOY_OK;
    }
    /* an f32 product kept in the arena is computed there and read there;
     * else into the arena's scratch, or a block of its own */
    bool direct = saved.data && mm->type.dtype == ALLOY_F32;
    bool own = !direct && (!x->scratch || x->scratch_bytes < bytes);
    rt_tensor acc = {mm->type, direct ? saved.data : own ? al_malloc(bytes) : x->scratch};
    acc.type.dtype = ALLOY_F32;
    if (!acc.data) return cpu_out_of_memory(x, mm);
    rt_tensor in[3];
    for (int j = 0; j < mm->nin && j < 3; j++) in[j] = values[mm->in[j]];
    /* the head's kernel with an f32 result computes the unrounded product
     * (a convolution's with its own bias operand added, in f32) */
    alloy_status head = mm->op == IR_OP_matmul ? cpu_matmul(x, mm, &acc, in) : cpu_conv(x, mm, &acc, in);
    if (!head && x->nonfinite && cpu_amp_checked(g, mm)) /* amp_check: the product as its dtype holds it */
        x->nonfinite[mm->id] |= (uint8_t)cpu_nonfinite_bits_f32(mm->type.dtype, acc.data, count);
    if (!head && x->ranges) /* amp_stats: the unrounded product, as it was checked */
        cpu_range_add_f32(cpu_range_of(x, g, mm), mm->type.dtype, acc.data, count);
    if (!head) {
        /* the epilogue reads the unrounded f32 product; the rounded store of
         * a kept f16/bf16 product and the range rule (f16 precision kept, not
         * more range) happen in its chunk loop (cpu_run_group_ex) */
        x->product = acc.data;
        x->product_count = count;
        x->product_dtype = mm->type.dtype;
        x->product_store = direct ? NULL : saved.data;
        x->product_ranged = (members[0].flags & MEMBER_RANGED) != 0;
        values[mm->id] = acc;
        if (step->n > 1) cpu_run_group_ex(x, g, members + 1, step->n - 1, values, w, NULL, NULL);
        else if (x->product_store) cvt_store_f32(mm->type.dtype, acc.data, saved.data, (size_t)count);
        values[mm->id] = saved;
        x->product = NULL, x->product_store = NULL, x->product_ranged = false;
    }
    if (own) al_free(acc.data);
    return x->status;
}

/* ---- MULTI steps: chain by chain, found_inf checked on the way, a sum_squares over them after ---- */

/* Runs EW part `part` of a multi step whose gradient norm is `norm` (or
 * NULL). A norm operand the part computes but does not store (the unscale
 * whose only other reader, the update, recomputes it: remat.c) is written
 * to a buffer of its own while the part runs, its squares summed into
 * sums[j] (done[j] set; squared in that buffer) and the buffer freed:
 * one allocation per operand, as the lone op makes, and the sum the lone
 * sum_squares would take of it stored, bit for bit, with no slot. */
static void run_multi_part(cpu_exec *x, const ir_graph *g, const schedule *s, const sched_part *part,
                           const ir_node *norm, float *sums, uint8_t *done, rt_tensor *values, cpu_workers *w,
                           int *nonfinite)
{
    int *own = norm ? al_malloc(sizeof(int) * (size_t)part->n) : NULL, nown = 0;
    if (norm && !own) {
        cpu_out_of_memory(x, norm);
        return;
    }
    for (int m = part->first; norm && m < part->first + part->n && !x->status; m++) {
        int id = s->members[m].node;
        if (values[id].data || !ir_nbytes(&g->nodes[id]->type)) continue;
        bool operand = false;
        for (int j = 0; j < norm->nin; j++) operand |= norm->in[j] == id;
        if (!operand) continue;
        if (!(values[id].data = al_malloc(ir_nbytes(&g->nodes[id]->type)))) {
            cpu_out_of_memory(x, norm);
            break;
        }
        own[nown++] = id;
    }
    if (!x->status) cpu_run_group_ex(x, g, &s->members[part->first], part->n, values, w, NULL, nonfinite);
    for (int k = 0; k < nown; k++) {
        int id = own[k];
        for (int j = 0; j < norm->nin && !x->status; j++) {
            if (norm->in[j] != id) continue;
            alloy_status st = ALLOY_OK;
            sums[j] = cpu_square_sum_in_f32(x, norm, &values[id], &st);
            done[j] = !st;
        }
        al_free(values[id].data);
        values[id].data = NULL;
    }
    al_free(own);
}

/* The gradient norm's f64 sum: each operand's f32 sum (sums[j] where
 * done[j], else of its stored value) added in operand order, as
 * cpu_sum_squares adds them. */
static void run_multi_norm(cpu_exec *x, const ir_node *norm, const float *sums, const uint8_t *done,
                           rt_tensor *values)
{
    double total = 0;
    for (int j = 0; j < norm->nin && !x->status; j++) {
        alloy_status st = ALLOY_OK;
        float sum = done[j] ? sums[j] : cpu_square_sum_in_f32(x, norm, &values[norm->in[j]], &st);
        total = j ? total + (double)sum : (double)sum;
    }
    if (!x->status && values[norm->id].data) *(double *)values[norm->id].data = total;
}

alloy_status cpu_run_multi(cpu_exec *x, const ir_graph *g, const schedule *s, const sched_step *step,
                           rt_tensor *values, cpu_workers *w)
{
    const sched_part *last_part = &s->parts[step->first_part + step->nparts - 1];
    const ir_node *fi = last_part->kind == PART_OP ? g->nodes[s->members[last_part->first].node] : NULL;
    const sched_part *norm_part = fi && step->nparts >= 2 && last_part[-1].kind == PART_OP ? last_part - 1 : NULL;
    const ir_node *norm = norm_part ? g->nodes[s->members[norm_part->first].node] : NULL;
    if (norm && norm->op != IR_OP_sum_squares) norm = NULL;
    float *sums = norm ? al_malloc(sizeof(float) * ((size_t)norm->nin + 1)) : NULL;
    uint8_t *done = norm ? al_calloc((size_t)norm->nin + 1, 1) : NULL;
    if (norm && (!sums || !done)) {
        al_free(sums), al_free(done);
        return cpu_out_of_memory(x, norm);
    }
    int nonfinite = 0;
    for (int p = step->first_part; p < step->first_part + step->nparts && !x->status; p++) {
        const sched_part *part = &s->parts[p];
        if (part->kind == PART_EW)
            run_multi_part(x, g, s, part, norm, sums, done, values, w, fi ? &nonfinite : NULL);
        else if (norm && part == norm_part)
            run_multi_norm(x, norm, sums, done, values);
        else if (p < step->first_part + step->nparts - 1) /* another op before found_inf, as a lone op */
            cpu_run_op(x, g->nodes[s->members[part->first].node], values);
    }
    al_free(sums), al_free(done);
    if (!fi || x->status || !values[fi->id].data) return x->status;
    /* found_inf over its operands from outside the step */
    rt_tensor *outside = al_malloc(sizeof(rt_tensor) * (size_t)fi->nin + 1);
    if (!outside) return cpu_out_of_memory(x, fi);
    int nout = 0;
    for (int j = 0; j < fi->nin; j++)
        if (s->step_of[fi->in[j]] != s->step_of[fi->id]) outside[nout++] = values[fi->in[j]];
    ir_node probe = *fi;
    probe.nin = nout;
    uint8_t found_outside = 0;
    rt_tensor flag = {fi->type, &found_outside};
    if (nout) cpu_found_inf(x, &probe, &flag, outside);
    *(uint8_t *)values[fi->id].data = (uint8_t)(nonfinite || found_outside);
    al_free(outside);
    return x->status;
}
