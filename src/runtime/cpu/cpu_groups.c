/* cpu_groups.c - runs the ROW, GEMM and MULTI fusion groups (ir/groups.h) on the CPU, one pass over memory each. */
#include <string.h>

#include "ir/groups.h"
#include "base/convert.h"
#include "runtime/cpu/cpu.h"

/* Elements of one row block: the block's values of every member stay in L2
 * while its steps run (16k f32 = 64 KB per value). */
enum { ROW_BLOCK_ELEMS = 16384, MIN_ROW_WORK = 1 << 16, MAX_THREADS = 64 };

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
    rt_tensor *view;  /* the run's values with block views of the group's tensors */
    char *scratch;    /* block buffers of members read by a later step */
} row_thread;

typedef struct row_group {
    const ir_graph *g;
    const int *members;
    int n;
    rt_tensor *values;
    ir_type full;             /* the iteration shape */
    int64_t rows, C, period, block_rows, nblocks;
    int *ext, next;           /* inputs from outside, and their view kinds */
    uint8_t *ext_kind;
    size_t *scratch_at;       /* per member: offset of its block buffer, or SIZE_MAX */
    size_t scratch_bytes;
    void *losses;             /* cross_entropy members: per-row losses (f32), one array each */
    int64_t targets_total;    /* positions of a cross_entropy(_grad) in the whole group */
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

static int member_pos(const row_group *rg, int id)
{
    for (int k = 0; k < rg->n; k++)
        if (rg->members[k] == id) return k;
    return -1;
}

static void row_block(void *arg, int64_t b, int ti)
{
    row_group *rg = arg;
    row_thread *t = &rg->t[ti];
    if (t->x.status) return;
    const ir_graph *g = rg->g;
    int64_t r0 = b * rg->block_rows, rb = rg->rows - r0 < rg->block_rows ? rg->rows - r0 : rg->block_rows;
    for (int e = 0; e < rg->next; e++)
        set_view(rg, &t->view[rg->ext[e]], &rg->values[rg->ext[e]], rg->ext_kind[e], r0, rb);
    for (int k = 0; k < rg->n; k++) {
        int id = rg->members[k];
        const ir_node *m = g->nodes[id];
        rt_tensor *v = &t->view[id];
        if (m->op == IR_OP_cross_entropy) continue;
        rt_tensor whole = {m->type, rg->values[id].data};
        set_view(rg, v, &whole, VIEW_FULL, r0, rb);
        if (!whole.data) v->data = rg->scratch_at[k] == SIZE_MAX ? NULL : t->scratch + rg->scratch_at[k];
    }
    ir_type space = block_type(rg, &rg->full, VIEW_FULL, rb);
    int ce = 0;
    for (int k = 0; k < rg->n && !t->x.status;) {
        const ir_node *m = g->nodes[rg->members[k]];
        if (ir_fuse_elementwise(g, m)) {
            int end = k + 1;
            while (end < rg->n && ir_fuse_elementwise(g, g->nodes[rg->members[end]])) end++;
            cpu_run_group_ex(&t->x, g, &rg->members[k], end - k, t->view, t->w, &space, NULL, NULL);
            k = end;
            continue;
        }
        rt_tensor in[3];
        for (int j = 0; j < m->nin && j < 3; j++) in[j] = t->view[m->in[j]];
        rt_tensor *out = &t->view[m->id];
        if (m->op == IR_OP_cross_entropy)
            cpu_cross_entropy_losses(&t->x, m, in, (float *)rg->losses + (size_t)ce++ * (size_t)rg->rows + r0);
        else if (m->op == IR_OP_cross_entropy_grad)
            cpu_cross_entropy_grad_part(&t->x, m, out, in, rg->targets_total);
        else
            cpu_ops[m->op].kernel(&t->x, m, out, in);
        k++;
    }
}

static alloy_status run_row(cpu_exec *x, const ir_graph *g, const int *members, int n, rt_tensor *values,
                            cpu_workers *w)
{
    char label[64];
    const ir_node *last = g->nodes[members[n - 1]];
    row_group *rg = al_calloc(1, sizeof *rg);
    if (!rg) return cpu_fail(x, ALLOY_ERR_OOM, "out of memory running the row group ending at %s",
                             ir_node_label(last, label, sizeof label));
    rg->g = g, rg->members = members, rg->n = n, rg->values = values;
    rg->full = *ir_fuse_shape(g, g->nodes[members[0]]);
    rg->C = rg->full.rank ? rg->full.dims[rg->full.rank - 1] : 1;
    rg->rows = rg->C ? ir_numel(&rg->full) / rg->C : 0;
    rg->period = 1;
    rg->ext = al_malloc(sizeof(int) * 3 * (size_t)n);
    rg->ext_kind = al_malloc(3 * (size_t)n);
    rg->scratch_at = al_malloc(sizeof(size_t) * (size_t)n);
    static const char oom[] = "out of memory"; /* the one reason that is ALLOY_ERR_OOM */
    const char *why = NULL;
    int nce = 0, threads = 1;
    bool single = false;
    if (!rg->ext || !rg->ext_kind || !rg->scratch_at) why = oom;
    for (int k = 0; k < n && !why; k++) {
        const ir_node *m = g->nodes[members[k]];
        if (!ir_fuse_elementwise(g, m) && !ir_fuse_row_op(g, m)) why = "a member is neither elementwise nor a row op";
        else if (!dims_eq(ir_fuse_shape(g, m)->rank, ir_fuse_shape(g, m)->dims, rg->full.rank, rg->full.dims))
            why = "members have different shapes";
        else if (ir_fuse_wide(g, m)) why = "a member computes in f64";
        if (m->op == IR_OP_causal_mask) rg->period = rg->full.dims[rg->full.rank - 2];
        if (m->op == IR_OP_cross_entropy) nce++;
        if (m->op == IR_OP_cross_entropy || m->op == IR_OP_cross_entropy_grad)
            rg->targets_total = ir_numel(&g->nodes[m->in[1]]->type);
        /* a row op's result, and a member read by a later step (not an EW
         * member of the same run), need a block buffer when not stored */
        rg->scratch_at[k] = ir_fuse_elementwise(g, m) || m->op == IR_OP_cross_entropy ? SIZE_MAX : 0;
        for (int j = 0; j < m->nin && !why; j++) {
            int o = m->in[j], mi = member_pos(rg, o);
            if (mi >= 0) {
                if (!ir_fuse_elementwise(g, m) || !ir_fuse_elementwise(g, g->nodes[o])) rg->scratch_at[mi] = 0;
                continue;
            }
            bool seen = false;
            for (int e = 0; e < rg->next && !seen; e++) seen = rg->ext[e] == o;
            if (seen) continue;
            if (!values[o].data && ir_nbytes(&values[o].type)) why = "an input of the group has no value";
            rg->ext_kind[rg->next] = (uint8_t)classify(&g->nodes[o]->type, &rg->full);
            single |= rg->ext_kind[rg->next] == VIEW_OTHER;
            rg->ext[rg->next++] = o;
        }
        /* EW runs are consecutive members: an EW member whose run is broken
         * by a row op and read after it also needs a buffer */
        for (int j = 0; j < m->nin && !why; j++) {
            int mi = member_pos(rg, m->in[j]);
            for (int i = mi + 1; mi >= 0 && i < k; i++)
                if (!ir_fuse_elementwise(g, g->nodes[members[i]])) rg->scratch_at[mi] = 0;
        }
    }
    if (!why && rg->rows > 0) {
        int64_t br = ROW_BLOCK_ELEMS / (rg->C ? rg->C : 1);
        br = br / rg->period * rg->period;
        if (br < rg->period) br = rg->period;
        rg->block_rows = single || br > rg->rows ? rg->rows : br;
        rg->nblocks = (rg->rows + rg->block_rows - 1) / rg->block_rows;
        size_t at = 0;
        for (int k = 0; k < n; k++) {
            if (rg->scratch_at[k] == SIZE_MAX || values[members[k]].data) {
                rg->scratch_at[k] = SIZE_MAX;
                continue;
            }
            rg->scratch_at[k] = at;
            at += ((size_t)rg->block_rows * (size_t)rg->C * alloy_dtype_size(g->nodes[members[k]]->type.dtype) + 63) & ~(size_t)63;
        }
        rg->scratch_bytes = at;
        int64_t want = x->nthreads < MAX_THREADS ? x->nthreads : MAX_THREADS;
        if (want > rg->nblocks) want = rg->nblocks;
        if (rg->rows * rg->C * n < MIN_ROW_WORK) want = 1;
        threads = cpu_workers_threads(w, (int)want);
        if (nce) rg->losses = al_malloc(sizeof(float) * (size_t)nce * (size_t)rg->rows);
        if (nce && !rg->losses) why = oom;
        for (int i = 0; i < threads && !why; i++) {
            row_thread *t = &rg->t[i];
            t->x.nthreads = 1;
            t->w = cpu_workers_new();
            t->view = al_malloc(sizeof(rt_tensor) * (size_t)g->nnodes);
            t->scratch = al_malloc(rg->scratch_bytes ? rg->scratch_bytes : 1);
            if (!t->w || !t->view || !t->scratch) why = oom;
            else memcpy(t->view, values, sizeof(rt_tensor) * (size_t)g->nnodes);
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
            const ir_node *m = g->nodes[members[k]];
            if (m->op != IR_OP_cross_entropy) continue;
            if (values[m->id].data)
                cpu_cross_entropy_mean(false, (float *)rg->losses + (size_t)ce * (size_t)rg->rows, rg->rows,
                                       &values[m->id]);
            ce++;
        }
    }
    for (int i = 0; i < threads; i++) {
        cpu_workers_free(rg->t[i].w);
        al_free(rg->t[i].view), al_free(rg->t[i].scratch);
    }
    al_free(rg->ext), al_free(rg->ext_kind), al_free(rg->scratch_at), al_free(rg->losses);
    al_free(rg);
    if (why)
        return cpu_fail(x, why == oom ? ALLOY_ERR_OOM : ALLOY_ERR_VERIFY,
                        "row group ending at %s '%s': %s", ir_ops[last->op].name,
                        ir_node_label(last, label, sizeof label), why);
    return x->status;
}

/* ---- GEMM groups: the matmul into f32, then its epilogue as one EW pass ---- */

static alloy_status run_gemm(cpu_exec *x, const ir_graph *g, const int *members, int n, rt_tensor *values,
                             cpu_workers *w)
{
    char label[64];
    const ir_node *mm = g->nodes[members[0]];
    if (mm->op != IR_OP_matmul || n < 2)
        return cpu_fail(x, ALLOY_ERR_VERIFY, "gemm group at %s '%s': the first member is not its matmul",
                        ir_ops[mm->op].name, ir_node_label(mm, label, sizeof label));
    int64_t count = ir_numel(&mm->type);
    size_t bytes = sizeof(float) * (size_t)(count ? count : 1);
    bool own = !x->scratch || x->scratch_bytes < bytes; /* the arena's scratch, else a block of its own */
    rt_tensor acc = {mm->type, own ? al_malloc(bytes) : x->scratch};
    acc.type.dtype = ALLOY_F32;
    if (!acc.data) return cpu_out_of_memory(x, mm);
    rt_tensor in[2] = {values[mm->in[0]], values[mm->in[1]]};
    if (!cpu_matmul(x, mm, &acc, in)) {
        rt_tensor saved = values[mm->id];
        if (saved.data) cvt_store_f32(mm->type.dtype, acc.data, saved.data, (size_t)count);
        cpu_range_f32(mm->type.dtype, acc.data, count); /* f16 precision kept, not more range */
        values[mm->id] = acc; /* the epilogue reads the unrounded f32 product */
        cpu_run_group(x, g, members + 1, n - 1, values, w);
        values[mm->id] = saved;
    }
    if (own) al_free(acc.data);
    return x->status;
}

/* ---- MULTI groups: segment by segment, found_inf checked on the way ---- */

static int find_root(int *parent, int i)
{
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
}

static alloy_status run_multi(cpu_exec *x, const ir_graph *g, const int *members, int n, rt_tensor *values,
                              cpu_workers *w)
{
    const ir_node *last = g->nodes[members[n - 1]];
    const ir_node *fi = last->op == IR_OP_found_inf ? last : NULL;
    int ns = fi ? n - 1 : n;
    int *parent = al_malloc(sizeof(int) * (size_t)(n + 1)), *seg = al_malloc(sizeof(int) * (size_t)(n + 1));
    uint8_t *check = al_calloc((size_t)n + 1, 1), *done = al_calloc((size_t)n + 1, 1);
    rt_tensor *outside = fi ? al_malloc(sizeof(rt_tensor) * (size_t)fi->nin) : NULL;
    if (!parent || !seg || !check || !done || (fi && !outside)) {
        al_free(parent), al_free(seg), al_free(check), al_free(done), al_free(outside);
        return cpu_out_of_memory(x, last);
    }
    for (int k = 0; k < ns; k++) parent[k] = k;
    for (int k = 0; k < ns; k++) {
        const ir_node *m = g->nodes[members[k]];
        for (int j = 0; j < m->nin; j++)
            for (int i = 0; i < k; i++)
                if (members[i] == m->in[j]) parent[find_root(parent, i)] = find_root(parent, k);
    }
    int nout = 0;
    for (int j = 0; fi && j < fi->nin; j++) {
        int i = 0;
        while (i < ns && members[i] != fi->in[j]) i++;
        if (i < ns) check[i] = 1;
        else outside[nout++] = values[fi->in[j]];
    }
    int nonfinite = 0;
    for (int k = 0; k < ns && !x->status; k++) {
        if (done[k]) continue;
        int root = find_root(parent, k), len = 0;
        uint8_t seg_check[256], *sc = seg_check;
        for (int i = k; i < ns; i++)
            if (!done[i] && find_root(parent, i) == root) seg[len++] = i;
        if (len > 256 && !(sc = al_malloc((size_t)len))) {
            cpu_out_of_memory(x, last);
            break;
        }
        for (int i = 0; i < len; i++) {
            sc[i] = check[seg[i]];
            done[seg[i]] = 1;
            seg[i] = members[seg[i]];
        }
        cpu_run_group_ex(x, g, seg, len, values, w, NULL, fi ? sc : NULL, &nonfinite);
        if (sc != seg_check) al_free(sc);
    }
    if (fi && !x->status && values[fi->id].data) {
        ir_node probe = *fi; /* found_inf over the operands from outside the group */
        probe.nin = nout;
        uint8_t found_outside = 0;
        rt_tensor flag = {fi->type, &found_outside};
        if (nout) cpu_found_inf(x, &probe, &flag, outside);
        *(uint8_t *)values[fi->id].data = (uint8_t)(nonfinite || found_outside);
    }
    al_free(parent), al_free(seg), al_free(check), al_free(done), al_free(outside);
    return x->status;
}

alloy_status cpu_run_kind_group(cpu_exec *x, const ir_graph *g, const int *members, int n, rt_tensor *values,
                                cpu_workers *w)
{
    switch (ir_group_kind_of(g, members, n)) {
    case IR_GROUP_ROW: return run_row(x, g, members, n, values, w);
    case IR_GROUP_GEMM: return run_gemm(x, g, members, n, values, w);
    case IR_GROUP_MULTI: return run_multi(x, g, members, n, values, w);
    case IR_GROUP_EW: break;
    }
    return cpu_run_group(x, g, members, n, values, w);
}
