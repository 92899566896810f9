/* cpu_rows.c - the row ops on the CPU: the driver that feeds a row op's function (cpu_row_programs.c, cpu_row_by_hand.c) its rows, in batches, causal rows by their live columns, and a per-row result's mean. */
/* Compiled as the row functions' files are (no trapping math, the #pragma
 * cpu_rows.h asks of its includers): the driver builds as it did beside
 * them. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <string.h>

#include "base/convert.h"
#include "ir/groups.h" /* ir_row_causal, ir_causal_live */
#include "runtime/cpu/cpu_rows.h"

/* Fills r->pos for row r->row (once per row, for programs that read POS). */
static void set_positions(row_args *r)
{
    int64_t q = r->row;
    for (int k = 1; k < r->rank; k++) {
        r->pos[k] = q % r->dims[r->rank - 1 - k];
        q /= r->dims[r->rank - 1 - k];
    }
}

/* Pairwise sums (cpu_rows.h): sum_T(v, n) adds runs of at most LEAF values
 * in order and splits longer ones in halves; cpu_leaf_plan lists the leaves of
 * that tree for a row of n. */
static float sum_f32(const float *v, int64_t n)
{
    if (n > LEAF) return sum_f32(v, n / 2) + sum_f32(v + n / 2, n - n / 2);
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return s;
}

static double sum_f64(const double *v, int64_t n)
{
    if (n > LEAF) return sum_f64(v, n / 2) + sum_f64(v + n / 2, n - n / 2);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return s;
}

int cpu_leaf_plan(int64_t n, int64_t *len, int k)
{
    if (n > LEAF) return cpu_leaf_plan(n - n / 2, len, cpu_leaf_plan(n / 2, len, k));
    len[k] = n;
    return k + 1;
}

/* The live columns of causal rows by the row's position p along the
 * queries (T of them): live[p] (ir_causal_live), the leaves of the
 * pairwise tree that hold them (leaves[p]) and the end of the last
 * (pad[p]); leaf_end: the leaves' ends in the row. */
static void live_table(const ir_type *t, const int64_t *leaf_end, int nleaves, int64_t *live, int64_t *pad,
                       int64_t *leaves)
{
    int l = 0;
    for (int64_t p = 0; p < t->dims[t->rank - 2]; p++) {
        live[p] = ir_causal_live(t, p);
        while (l < nleaves - 1 && leaf_end[l] < live[p]) l++; /* the first leaf ending at or past it */
        pad[p] = leaf_end[l], leaves[p] = l + 1;
    }
}

/* Sets the live columns of the call's rows (row_args.live): all n, or for
 * causal rows each one's from the table (live_table, by[0..2] its live,
 * pad and leaves; rows of T positions). */
static void set_live(row_args *r, int64_t T, int64_t *const by[3])
{
    int64_t p = r->causal ? r->row % T : 0;
    for (int b = 0; b < r->nb; b++) {
        if (!r->causal) {
            r->live[b] = r->pad[b] = r->n;
            r->live_leaves[b] = r->nleaves;
            continue;
        }
        r->live[b] = by[0][p], r->pad[b] = by[1][p], r->live_leaves[b] = (int)by[2][p];
        if (++p == T) p = 0;
    }
}

alloy_status cpu_row_run(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in, int64_t total_rows,
                         void *results, bool causal)
{
    const ir_row_program *prog = ir_ops[n->op].row;
    ir_row_summary sum = ir_row_summarize(prog);
    const ir_type *t = &in[0].type;
    bool wide = t->dtype == ALLOY_F64;
    int axis = t->rank - 1;
    if (ir_attr_schema(n->op, "axis")) ir_norm_axis(ir_attr_i(n, "axis"), t->rank, &axis);
    int64_t len = t->rank ? t->dims[axis] : 1, outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= t->dims[d];
    for (int d = axis + 1; d < t->rank; d++) inner *= t->dims[d];
    for (int j = 0; j < n->nin; j++)
        if (prog->roles[j] == 'i' && cpu_check_targets(x, n, &in[j], len)) return x->status;
    if (outer * len * inner == 0) return ALLOY_OK;
    if (causal && (t->rank < 2 || axis != t->rank - 1 || t->dims[t->rank - 2] > len))
        return cpu_fail(x, ALLOY_ERR_VERIFY, "%s: causal rows need [.., queries, keys] rows along the last axis",
                        ir_ops[n->op].name);
    if (n->nin > ROW_MAX_IN || sum.nscalars > ROW_MAX_S || sum.nvectors > ROW_MAX_V)
        return cpu_fail(x, ALLOY_ERR_UNSUPPORTED, "%s: its row program needs more slots than the CPU has",
                        ir_ops[n->op].name);
    /* short rows along the last axis, ROW_BATCH at a time, for programs
     * whose rows need nothing of their own but their w operands (a KEEP
     * stage's values: one per row of the batch), or for an f32 function by
     * hand that takes them, i operands and a result per row too
     * (cpu_row_f32_batch_indexed); ROW_BATCH_ELEMS elements, or what the
     * op's f32 function by hand asks for */
    bool indexed = !wide && cpu_row_f32_by_hand[n->op] && cpu_row_f32_batch_indexed(n->op);
    bool batchable = inner == 1 && !sum.by_position && (indexed || !sum.per_row_result);
    for (int j = 0; j < n->nin; j++) batchable = batchable && (indexed || prog->roles[j] != 'i');
    int64_t nb = batchable ? (wide ? ROW_BATCH_ELEMS : cpu_row_f32_batch_elems(n->op)) / len : 1;
    nb = nb < 1 ? 1 : nb > ROW_BATCH ? ROW_BATCH : nb;
    row_args r = {.n = len, .nb = 1, .rows = total_rows, .nin = n->nin, .rank = t->rank, .dims = t->dims, .causal = causal};
    int np = 0;
    for (const ir_attr_spec *a = ir_ops[n->op].attrs; a && a->name && np < ROW_MAX_ATTRS; a++)
        r.p[np++] = a->kind == IR_ATTR_FLOAT ? ir_attr_f(n, a->name) : (double)ir_attr_i(n, a->name);
    /* buffers: a slab per r operand, one for the result, then the row views */
    size_t cs = wide ? sizeof(double) : sizeof(float), slab = (size_t)(len * inner);
    size_t cap = slab > (size_t)(nb * len) ? slab : (size_t)(nb * len); /* each buffer's elements */
    int nbuf = n->nin + 1 + sum.nvectors + 2 + (inner > 1 ? n->nin + 1 : 0);
    size_t leaf_bytes = sizeof(int64_t) * (size_t)(nb * len + 1 + len + (causal ? 3 * len : 0));
    char *block = al_malloc(leaf_bytes + cs * cap * (size_t)nbuf + cs);
    if (!block) return cpu_out_of_memory(x, n);
    int64_t *leaves = (int64_t *)(void *)block; /* first: al_malloc aligns it */
    char *at = block + leaf_bytes;
    void *slabs[ROW_MAX_IN + 1] = {NULL}, *cols[ROW_MAX_IN + 1] = {NULL};
    for (int j = 0; j <= n->nin; j++, at += cs * cap) slabs[j] = at; /* slabs[nin]: the result */
    for (int k = 0; k < sum.nvectors; k++, at += cs * cap) r.v[k] = at;
    r.tmp = at, at += cs * cap;   /* the leaf sums of a SUM */
    r.terms = at, at += cs * cap; /* the terms of a MAX or a SUM */
    r.nleaves = cpu_leaf_plan(len, leaves, 0);
    int64_t *leaf_end = leaves + nb * len + 1; /* each leaf's end in the row */
    int64_t at_end = 0;
    for (int l = 0; l < r.nleaves; l++) leaf_end[l] = at_end += leaves[l];
    int64_t T = causal ? t->dims[t->rank - 2] : 1; /* <= len (causal_mask's rule, checked above) */
    int64_t *const by_position[3] = {leaf_end + len, leaf_end + 2 * len, leaf_end + 3 * len};
    if (causal) live_table(t, leaf_end, r.nleaves, by_position[0], by_position[1], by_position[2]);
    for (int64_t b = 1; b < nb; b++) memcpy(leaves + b * r.nleaves, leaves, sizeof(int64_t) * (size_t)r.nleaves);
    r.leaf = leaves;
    r.balanced = (r.nleaves & (r.nleaves - 1)) == 0;
    for (int l = 1; l < r.nleaves; l++) r.balanced = r.balanced && leaves[l] == leaves[0];
    for (int j = 0; inner > 1 && j <= n->nin; j++, at += cs * cap) cols[j] = at;
    r.y = inner > 1 ? cols[n->nin] : slabs[n->nin];
    for (int j = 0; j < n->nin; j++) {
        char role = prog->roles[j];
        if (role == 'v') cpu_load_compute(wide, in[j].type.dtype, in[j].data, slabs[j], len);
        if (role == 's') cvt_load_f64(in[j].type.dtype, in[j].data, &r.scalar[j], 1);
        r.x[j] = inner > 1 && role == 'r' ? cols[j] : slabs[j];
        r.xs[j] = role == 'r' ? len : 0;
    }
    row_fn fn = wide ? cpu_row_fns[n->op].f64
                     : cpu_row_f32_by_hand[n->op] ? cpu_row_f32_by_hand[n->op] : cpu_row_fns[n->op].f32;
    size_t out_es = alloy_dtype_size(out->type.dtype);
    /* rows along the last axis in the compute type are read where they lie,
     * and the result's rows written where they go (when the result shares
     * no bytes with an operand): no copies */
    bool direct_in[ROW_MAX_IN] = {false};
    for (int j = 0; j < n->nin; j++)
        direct_in[j] = inner == 1 && prog->roles[j] == 'r' && in[j].type.dtype == (wide ? ALLOY_F64 : ALLOY_F32);
    bool direct_out = inner == 1 && !sum.per_row_value && !sum.per_row_result &&
                      out->type.dtype == (wide ? ALLOY_F64 : ALLOY_F32);
    for (int j = 0; direct_out && j < n->nin; j++) {
        const char *a = in[j].data, *b = out->data;
        size_t an = (size_t)ir_numel(&in[j].type) * alloy_dtype_size(in[j].type.dtype);
        if (a < b + (size_t)(outer * len) * cs && b < a + an) direct_out = false;
    }
    for (int64_t o = 0; o < outer; o += r.nb) {
        r.nb = (int)(outer - o < nb ? outer - o : nb); /* nb > 1: inner is 1, slab is len */
        for (int j = 0; j < n->nin; j++) {
            if (direct_in[j])
                r.x[j] = (const char *)in[j].data + (size_t)o * slab * cs;
            else if (prog->roles[j] == 'r')
                cpu_load_compute(wide, in[j].type.dtype,
                                 (const char *)in[j].data + (size_t)o * slab * alloy_dtype_size(in[j].type.dtype),
                                 slabs[j], (int64_t)slab * r.nb);
        }
        if (direct_out) r.y = (char *)out->data + (size_t)o * slab * cs;
        for (int64_t c = 0; c < inner; c++) {
            r.row = o * inner + c;
            if (sum.by_position) set_positions(&r);
            set_live(&r, T, by_position);
            for (int j = 0; j < n->nin; j++) {
                if (prog->roles[j] == 'i') {
                    r.index[j] = cpu_index_at(&in[j], r.row);
                    for (int b = 0; indexed && b < r.nb; b++)
                        r.index_of[b][j] = b ? cpu_index_at(&in[j], r.row + b) : r.index[j];
                }
                if (prog->roles[j] == 'w') { /* the batch's values in one call */
                    double w[ROW_BATCH];
                    cvt_load_f64(in[j].type.dtype,
                                 (const char *)in[j].data + (size_t)r.row * alloy_dtype_size(in[j].type.dtype), w,
                                 (size_t)r.nb);
                    for (int b = 0; b < r.nb; b++) r.w[b][j] = w[b];
                }
            }
            if (inner > 1) /* a column of the slab as a row */
                for (int j = 0; j < n->nin; j++)
                    if (prog->roles[j] == 'r')
                        for (int64_t i = 0; i < len; i++)
                            memcpy((char *)cols[j] + (size_t)i * cs, (char *)slabs[j] + ((size_t)(i * inner + c)) * cs, cs);
            r.result = results ? (char *)results + (size_t)r.row * cs : NULL;
            r.weight = results ? (char *)results + (size_t)(total_rows + r.row) * cs : NULL;
            if (results && !sum.weighted) /* no WEIGHT stage: every row weighs 1 */
                for (int b = 0; b < r.nb; b++) {
                    if (wide) ((double *)r.weight)[b] = 1;
                    else ((float *)r.weight)[b] = 1;
                }
            fn(&r);
            if (inner > 1 && !sum.per_row_result)
                for (int64_t i = 0; i < len; i++)
                    memcpy((char *)slabs[n->nin] + ((size_t)(i * inner + c)) * cs, (char *)r.y + (size_t)i * cs, cs);
        }
        if (sum.per_row_value) /* one value per row (rows run along the last axis: inner is 1) */
            cpu_store_compute(wide, out->type.dtype, slabs[n->nin], (char *)out->data + (size_t)o * out_es, r.nb);
        else if (!sum.per_row_result && !direct_out)
            cpu_store_compute(wide, out->type.dtype, slabs[n->nin], (char *)out->data + (size_t)o * slab * out_es,
                              (int64_t)slab * r.nb);
    }
    al_free(block);
    return ALLOY_OK;
}

void cpu_row_mean(bool wide, bool sum, const void *results, int64_t rows, rt_tensor *out)
{
    /* the mean over no rows, or rows of total weight 0, is 0/0 = NaN, as in PyTorch */
    if (wide) {
        const double *v = results;
        double mean = sum ? sum_f64(v, rows) : sum_f64(v, rows) / sum_f64(v + rows, rows);
        cpu_store_compute(wide, out->type.dtype, &mean, out->data, 1);
    } else {
        const float *v = results;
        float mean = sum ? sum_f32(v, rows) : sum_f32(v, rows) / sum_f32(v + rows, rows);
        cpu_store_compute(wide, out->type.dtype, &mean, out->data, 1);
    }
}

/* The kernel of every row op: all rows, and a per-row result's mean. */
alloy_status cpu_row(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *t = &in[0].type;
    int64_t len = t->rank ? t->dims[t->rank - 1] : 1, rows = len ? ir_numel(t) / len : 0;
    bool causal = x->graph && ir_row_causal(x->graph, n);
    if (!ir_row_summarize(ir_ops[n->op].row).per_row_result) return cpu_row_run(x, n, out, in, rows, NULL, causal);
    bool wide = t->dtype == ALLOY_F64;
    void *results = cpu_alloc_compute(wide, 2 * rows);
    if (!results) return cpu_out_of_memory(x, n);
    alloy_status st = cpu_row_run(x, n, out, in, rows, results, causal);
    if (!st) cpu_row_mean(wide, ir_row_sums(n), results, rows, out);
    al_free(results);
    return st;
}
