/* emit_reduce.c - the reduction kernels (reduce_sum, reduce_mean, reduce_max): per thread in the CPU's pairwise order, or split over blocks (contiguous) or over chunks of rows (columns) with the last block adding the partials, one launch; and an elementwise step with the column sum of one of its values in the same kernel. */
#include "codegen/emit_impl.h"

/* Which input elements a reduction reads: reduced[d] per axis (every axis
 * when there is no axes attribute), elements per output and outputs. */
typedef struct reduction {
    const ir_type *t;
    bool reduced[ALLOY_MAX_RANK];
    int64_t count, nout;
    bool integer, wide;
    const char *acc; /* the accumulator's C type */
} reduction;

static reduction reduction_of(const ir_graph *g, const ir_node *n)
{
    reduction r = {.t = &g->nodes[n->in[0]]->type, .count = 1, .nout = 1};
    const ir_type *t = r.t;
    int naxes;
    const int64_t *axes = ir_attr_ints(n, "axes", &naxes);
    for (int i = 0; i < naxes; i++) {
        int ax;
        if (ir_norm_axis(axes[i], t->rank, &ax)) r.reduced[ax] = true;
    }
    if (!ir_attr_find(n, "axes"))
        for (int d = 0; d < t->rank; d++) r.reduced[d] = true;
    for (int d = 0; d < t->rank; d++) {
        if (r.reduced[d]) r.count *= t->dims[d];
        else r.nout *= t->dims[d];
    }
    r.integer = ir_is_int(t->dtype);
    r.wide = t->dtype == ALLOY_F64;
    /* integers: the maximum compares them exactly; sums and means are in
     * double and stored truncated and saturated, as every integer op */
    r.wide |= r.integer && n->op != IR_OP_reduce_max;
    r.acc = r.integer && n->op == IR_OP_reduce_max ? "long long" : r.wide ? "double" : "float";
    return r;
}

/* How the reduced elements of an output lie in the input, size-1 axes
 * aside: 'i' contiguous at o * count (the reduced axes innermost), 'o' at
 * r * nout + o (the reduced axes outermost), 'x' any other way. */
static char layout_of(const reduction *r)
{
    int first_red = -1, last_kept = -1, last_red = -1, first_kept = -1;
    for (int d = 0; d < r->t->rank; d++) {
        if (r->t->dims[d] == 1) continue;
        if (r->reduced[d]) {
            if (first_red < 0) first_red = d;
            last_red = d;
        } else {
            if (first_kept < 0) first_kept = d;
            last_kept = d;
        }
    }
    if (first_red < 0 || last_kept < first_red) return 'i';
    if (first_kept < 0 || last_red < first_kept) return 'o';
    return 'x';
}

/* Appends `acc m_ = combine(m_, x)` for reduction op (sum or max, NaN winning). */
static void put_combine(cg_text *b, int op, const char *x)
{
    if (op == IR_OP_reduce_max) cg_put(b, "m_ = alloy_max(m_, %s);", x);
    else cg_put(b, "m_ += %s;", x);
}

/* Appends the statements finishing output `at` (a C index) from m_: the mean's division, the store. */
static void put_finish_at(cg_text *b, const ir_node *n, const reduction *r, int out, const char *at)
{
    if (n->op == IR_OP_reduce_mean && r->count > 0) cg_put(b, "        m_ = m_ / (%s)%lldll;\n", r->acc, (long long)r->count);
    cg_put(b, "        p%d[%s] = ", out, at);
    if (r->integer && n->op == IR_OP_reduce_max) cg_put(b, "(%s)m_", cg_storage(n->type.dtype));
    else cg_store(b, n->type.dtype, r->wide, "m_");
    cg_put(b, ";\n");
}

/* put_finish_at output e. */
static void put_finish(cg_text *b, const ir_node *n, const reduction *r, int out) { put_finish_at(b, n, r, out, "e"); }

/* The input element loaded as the accumulator type, at C index idx. */
static void put_value(cg_text *b, const reduction *r, int in, const char *idx)
{
    if (r->integer) {
        cg_put(b, "(%s)(long long)p%d[%s]", r->acc, in, idx);
        return;
    }
    char p[16];
    al_fmt(p, sizeof p, "p%d", in);
    cg_load(b, r->t->dtype, p, idx);
}

/* Appends the combine of the input element at C index idx into m_ (put_value, put_combine). */
static void put_term(cg_text *b, const ir_node *n, const reduction *r, int in, const char *idx)
{
    cg_text x = {0};
    put_value(&x, r, in, idx);
    put_combine(b, n->op, x.s ? x.s : "0");
    cg_text_free(&x);
}

/* Runs the CPU's pairwise sum adds in order: a run of at most 16 elements. */
enum { PAIRWISE_RUN = 16 };

/* Appends member `sum(lo, n)` of struct R_ for n == count: the CPU's
 * pairwise order (halves split while longer than PAIRWISE_RUN, each run
 * added in order, each node's halves added left + right) without
 * recursion, which costs a call stack and its spills on the GPU. The
 * levels where every node splits (all sizes at a depth are floor or ceil
 * of count / 2^depth) are nested loops over the two halves, one partial a
 * level, the deepest three unrolled; at depth `levels` a node (of at
 * most PAIRWISE_RUN + 1 elements) splits once more if still longer than a
 * run (leaf). */
static void put_pairwise_sum(cg_text *b, const char *acc, int64_t count)
{
    int levels = 0;
    for (int64_t m = count; m > PAIRWISE_RUN; m /= 2) levels++; /* every node above depth `levels` splits */
    cg_put(b, "        __device__ %s run(long long lo, long long n) const\n        {\n"
              "            %s s = 0;\n            for (long long i = 0; i < n; i++) s += v(lo + i);\n"
              "            return s;\n        }\n"
              "        __device__ %s leaf(long long lo, long long n) const\n        {\n"
              "            return n > %d ? run(lo, n / 2) + run(lo + n / 2, n - n / 2) : run(lo, n);\n        }\n"
              "        __device__ %s sum(long long lo0, long long n0) const\n        {\n",
           acc, acc, acc, PAIRWISE_RUN, acc);
    for (int l = 0; l < levels; l++) {
        int in = 12 + 4 * l;
        cg_put(b, "%*s%s s%d = 0;\n%*s#pragma unroll %d\n%*sfor (int c%d = 0; c%d < 2; c%d++) {\n"
                  "%*s    const long long lo%d = c%d ? lo%d + n%d / 2 : lo%d, n%d = c%d ? n%d - n%d / 2 : n%d / 2;\n",
               in, "", acc, l, in, "", l >= levels - 3 ? 2 : 1, in, "", l, l, l, in, "", l + 1, l, l, l, l, l + 1, l, l,
               l, l);
    }
    cg_put(b, "%*sconst %s x%d = leaf(lo%d, n%d);\n", 12 + 4 * levels, "", acc, levels, levels, levels);
    for (int l = levels - 1; l >= 0; l--)
        cg_put(b, "%*s    s%d = c%d ? s%d + x%d : x%d;\n%*s}\n%*sconst %s x%d = s%d;\n", 12 + 4 * l, "", l, l, l, l + 1,
               l + 1, 12 + 4 * l, "", 12 + 4 * l, "", acc, l, l);
    cg_put(b, "            return x0;\n        }\n");
}

/* reduce_sum / mean / max, one thread per output element: sums pairwise in
 * the CPU's order (halves, runs of at most 16 added in order), bit for bit
 * the CPU's; for integers, few elements per output, or outputs enough to
 * fill the GPU. */
static const char *reduce_per_thread(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name,
                                     const reduction *r)
{
    const ir_type *t = r->t;
    const char *acc = r->acc;
    cg_params ps = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0), in = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    cg_text b = {0}, before = {0};
    /* the element r of the reduced set, and the output's kept coordinates, as an offset in the operand */
    /* r < count: where that fits in 32 bits its divisions are unsigned 32-bit ones, as 64-bit divisions are
     * calls whose saved registers spilled (100 B a thread over 1.1M terms, sm_90) */
    bool narrow = r->count <= UINT32_MAX;
    cg_put(&before, "    struct R_ {\n        const %s *p; long long base;\n"
                    "        __device__ long long at(long long r) const\n        {\n            long long o_ = base;\n",
           cg_storage(t->dtype));
    if (narrow) cg_put(&before, "            unsigned q_ = (unsigned)r; /* int: r < %lld */\n", (long long)r->count);
    int64_t stride = 1, rstride[ALLOY_MAX_RANK];
    for (int d = t->rank - 1; d >= 0; d--) rstride[d] = stride, stride *= t->dims[d];
    for (int d = t->rank - 1; d >= 0; d--)
        if (r->reduced[d] && narrow)
            cg_put(&before, "            o_ += (long long)(q_ %% %lluu) * %lldll; q_ /= %lluu;\n",
                   (unsigned long long)t->dims[d], (long long)rstride[d], (unsigned long long)t->dims[d]);
        else if (r->reduced[d])
            cg_put(&before, "            o_ += (r %% %lldll) * %lldll; r /= %lldll;\n", (long long)t->dims[d],
                   (long long)rstride[d], (long long)t->dims[d]);
    cg_put(&before, "            return o_;\n        }\n        __device__ %s v(long long r) const { return ", acc);
    if (r->integer) cg_put(&before, "(%s)(long long)p[at(r)]", acc);
    else if (t->dtype == ALLOY_F16) cg_put(&before, "alloy_h2f(p[at(r)])");
    else if (t->dtype == ALLOY_BF16) cg_put(&before, "alloy_bf2f(p[at(r)])");
    else cg_put(&before, "p[at(r)]");
    cg_put(&before, "; }\n");
    put_pairwise_sum(&before, acc, r->count);
    cg_put(&before, "    };\n");
    /* the kept coordinates of output e */
    cg_put(&b, "        long long q_ = e, base_ = 0; (void)q_;\n");
    for (int d = t->rank - 1; d >= 0; d--)
        if (!r->reduced[d])
            cg_put(&b, "        base_ += (q_ %% %lldll) * %lldll; q_ /= %lldll;\n", (long long)t->dims[d],
                   (long long)rstride[d], (long long)t->dims[d]);
    cg_put(&b, "        const R_ r_ = {p%d, base_};\n", in);
    if (n->op == IR_OP_reduce_max) {
        cg_put(&b, "        %s m_ = r_.v(0);\n        for (long long i = 1; i < %lldll; i++) { %s x_ = r_.v(i); "
                   "if (!(m_ != m_) && (x_ > m_ || x_ != x_)) m_ = x_; }\n",
               acc, (long long)r->count, acc);
    } else if (r->count == 1) { /* the CPU copies (a sum 0 + -0 would give +0) */
        cg_put(&b, "        %s m_ = r_.v(0);\n", acc);
    } else if (r->count == 0) {
        cg_put(&b, "        %s m_ = %s;\n", acc, n->op == IR_OP_reduce_mean && !r->integer ? "ALLOY_NAN" : "0");
    } else {
        cg_put(&b, "        %s m_ = r_.sum(0, %lldll);\n", acc, (long long)r->count);
    }
    put_finish(&b, n, r, out);
    bool ok = cg_op_kernel(prog, g, k, name, "float", &b, &ps, r->nout, NULL, before.s);
    cg_text_free(&b), cg_text_free(&before);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* Threads the split reductions aim to keep busy, and the fewest elements a
 * block (contiguous) or a thread (outermost) takes. */
enum { REDUCE_THREADS = 1 << 18, REDUCE_BLOCK_MIN = 8192, REDUCE_THREAD_MIN = 64 };

/* The split reductions finish in their own launch: each block writes its
 * partial results, then counts itself done on its outputs' counter
 * (CG_PARAM_COUNTER: zeroed when the step is loaded); the block that
 * counts last (after a __threadfence, so every other block's partials are
 * visible to it) adds the partials of those outputs in a fixed order and
 * sets the counter back to 0 for the next run. */

void cg_put_count_done(cg_text *b, int cnt, const char *idx, const char *last, const char *indent)
{
    cg_put(b, "%s__threadfence();\n%s__syncthreads();\n%sif (threadIdx.x == 0) {\n"
              "%s    last_ = atomicAdd(&p%d[%s], 1u) == %s;\n%s    if (last_) p%d[%s] = 0u;\n%s}\n"
              "%s__syncthreads();\n",
           indent, indent, indent, indent, cnt, idx, last, indent, cnt, idx, indent, indent);
}

/* cg_put_count_done among `parts` blocks (a number). */
static void put_count_done(cg_text *b, int cnt, const char *idx, int64_t parts, const char *indent)
{
    char last[32];
    al_fmt(last, sizeof last, "%lldu", (long long)(parts - 1));
    cg_put_count_done(b, cnt, idx, last, indent);
}

/* Appends the adding of the `split` partials of output o_ (C text, a
 * variable) into its result, as the finishing block does: with at least
 * REDUCE_WARP_MIN partials a warp per output (lane l_ adding every 32nd
 * partial from l_, then a shuffle tree), with fewer a thread per output
 * adding them in order. Partial c of output o is at part[o * split + c]
 * (contiguous) or part[c * nout + o]; read through volatile, as other
 * blocks wrote them. `after` (NULL: none): statements after the output's
 * store, in the thread that stored it. */
enum { REDUCE_WARP_MIN = 32 };
static void put_partials(cg_text *b, const ir_node *n, const reduction *r, int out, int part, int64_t split,
                         bool contiguous, const char *after)
{
    char x[128];
    const char *pt = r->wide ? "double" : "float";
    if (contiguous) al_fmt(x, sizeof x, "((const volatile %s *)p%d)[o_ * %lldll + c_]", pt, part, (long long)split);
    else al_fmt(x, sizeof x, "((const volatile %s *)p%d)[c_ * %lldll + o_]", pt, part, (long long)r->nout);
    bool warp = split >= REDUCE_WARP_MIN;
    cg_put(b, "            %s m_ = %s;\n            for (long long c_ = %s; c_ < %lldll; c_ += %d) ", r->acc,
           n->op == IR_OP_reduce_max ? "-(T)ALLOY_INF" : "0", warp ? "l_" : "0", (long long)split, warp ? 32 : 1);
    put_combine(b, n->op, x);
    cg_put(b, "\n");
    if (warp) {
        cg_put(b, "            m_ = %s(m_);\n            if (l_ == 0) {\n", n->op == IR_OP_reduce_max ? "alloy_warp_max" : "alloy_warp_sum");
        cg_text f = {0};
        put_finish_at(&f, n, r, out, "o_");
        cg_put(b, "        %s%s            }\n", f.s ? f.s : "", after ? after : "");
        b->oom |= f.oom;
        cg_text_free(&f);
    } else {
        cg_text f = {0};
        put_finish_at(&f, n, r, out, "o_");
        cg_put(b, "    %s%s", f.s ? f.s : "", after ? after : "");
        b->oom |= f.oom;
        cg_text_free(&f);
    }
}

/* Reduced elements contiguous per output: a block of CG_BLOCK threads per
 * (output, chunk), each thread adding its strided elements in order, then
 * the block's sum (alloy_block_sum); with more than one chunk per output
 * (few outputs, many elements) the chunks' results go to partials, and the
 * last of an output's blocks adds them in chunk order (a warp: lane l
 * chunks l, l + 32, ..., then a shuffle tree), one launch in all. */
static const char *reduce_by_blocks(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name,
                                    const reduction *r)
{
    int64_t split = (r->count + REDUCE_BLOCK_MIN - 1) / REDUCE_BLOCK_MIN, most = REDUCE_THREADS / CG_BLOCK / r->nout;
    if (split > most) split = most;
    if (split < 1) split = 1;
    int64_t chunk = (r->count + split - 1) / split;
    cg_params ps = {0};
    cg_text t = {0};
    bool max = n->op == IR_OP_reduce_max;
    int in = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int part = split > 1 ? cg_param_of(&ps, CG_PARAM_ROWS, n->id, true, r->nout * split) : -1;
    int cnt = split > 1 ? cg_param_of(&ps, CG_PARAM_COUNTER, n->id, true, r->nout) : -1;
    cg_put_preamble(&t);
    cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", CG_BLOCK, name);
    cg_param_list(&t, g, &ps);
    cg_put(&t, ")\n{\n    typedef %s T;\n    __shared__ T red_[32];\n%s", r->wide ? "double" : "float",
           split > 1 ? "    __shared__ unsigned last_;\n    const int l_ = threadIdx.x & 31; (void)l_;\n" : "");
    cg_put(&t, "    for (long long b_ = blockIdx.x; b_ < %lldll; b_ += gridDim.x) {\n"
               "        const long long e = b_ / %lldll, lo_ = (b_ %% %lldll) * %lldll;\n"
               "        const long long hi_ = lo_ + %lldll < %lldll ? lo_ + %lldll : %lldll;\n"
               "        T m_ = %s;\n        for (long long i_ = lo_ + threadIdx.x; i_ < hi_; i_ += %d) { ",
           (long long)(r->nout * split), (long long)split, (long long)split, (long long)chunk, (long long)chunk,
           (long long)r->count, (long long)chunk, (long long)r->count, max ? "-(T)ALLOY_INF" : "0", CG_BLOCK);
    char idx[64];
    al_fmt(idx, sizeof idx, "e * %lldll + i_", (long long)r->count);
    put_term(&t, n, r, in, idx);
    cg_put(&t, " }\n        m_ = %s(m_, red_);\n        if (threadIdx.x == 0) {\n", max ? "alloy_block_max" : "alloy_block_sum");
    if (split > 1) {
        cg_put(&t, "            p%d[b_] = m_;\n        }\n", part);
        put_count_done(&t, cnt, "e", split, "        ");
        cg_put(&t, "        if (last_ && threadIdx.x < %d) {\n            __threadfence();\n"
                   "            const long long o_ = e;\n",
               split >= REDUCE_WARP_MIN ? 32 : 1);
        put_partials(&t, n, r, out, part, split, true, NULL);
        cg_put(&t, "        }\n        __syncthreads();\n    }\n}\n");
    } else {
        cg_text f = {0};
        put_finish(&f, n, r, out);
        cg_put(&t, "    %s", f.s ? f.s : "");
        t.oom |= f.oom;
        cg_text_free(&f);
        cg_put(&t, "        }\n    }\n}\n");
    }
    int64_t blocks = r->nout * split;
    bool ok = cg_add_kernel(prog, g, name, k, STEP_KIND_OP, &t, &ps, (unsigned)(blocks > CG_MAX_GRID ? CG_MAX_GRID : blocks),
                            CG_BLOCK, (int64_t)(ir_nbytes(r->t) + ir_nbytes(&n->type)));
    cg_text_free(&t);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* How a column reduction splits: chunks of rows (`split`, of `chunk` rows
 * each) and groups of CG_BLOCK outputs, a block per (chunk, group). */
typedef struct column_split {
    int64_t split, chunk, groups, blocks;
} column_split;

static column_split column_split_of(const reduction *r)
{
    column_split c;
    int64_t most = REDUCE_THREADS / r->nout;
    c.split = (r->count + REDUCE_THREAD_MIN - 1) / REDUCE_THREAD_MIN;
    if (c.split > most) c.split = most;
    if (c.split < 1) c.split = 1;
    c.chunk = (r->count + c.split - 1) / c.split;
    c.groups = (r->nout + CG_BLOCK - 1) / CG_BLOCK;
    c.blocks = c.groups * c.split;
    return c;
}

/* The column kernel's opening, after its signature: block b takes chunk
 * s_ = b / groups and outputs g_ * CG_BLOCK + thread (o_), rows [lo_, hi_),
 * its sum m_ at the reduction's start; the loop over the rows left open
 * ("{ " after it, i_ the row) inside `if (o_ < nout)`. */
static void put_column_open(cg_text *t, const ir_node *n, const reduction *r, const column_split *c, bool wide)
{
    cg_put(t, ")\n{\n    typedef %s T;\n    int bad_ = 0; (void)bad_;\n    __shared__ unsigned last_;\n"
              "    const long long s_ = blockIdx.x / %lldll, g_ = blockIdx.x %% %lldll;\n"
              "    {\n        const long long o_ = g_ * %d + threadIdx.x;\n"
              "        const long long lo_ = s_ * %lldll, hi_ = lo_ + %lldll < %lldll ? lo_ + %lldll : %lldll;\n"
              "        %s m_ = %s;\n        if (o_ < %lldll) {\n            for (long long i_ = lo_; i_ < hi_; i_++) { ",
           wide ? "double" : "float", (long long)c->groups, (long long)c->groups, CG_BLOCK, (long long)c->chunk,
           (long long)c->chunk, (long long)r->count, (long long)c->chunk, (long long)r->count, r->acc,
           n->op == IR_OP_reduce_max ? "-(T)ALLOY_INF" : "0", (long long)r->nout);
}

/* The column kernel's close: the loop's sum m_ to partial [s_, o_], the
 * block counted done on counter g_, and the last block of group g_ adding
 * the group's partials in chunk order (a warp per output, lane l adding
 * chunks l, l + 32, ..., then a shuffle tree; with fewer than 32 chunks a
 * thread per output), then `after` (may be NULL) at output o_. */
static void put_column_close(cg_text *t, const ir_node *n, const reduction *r, const column_split *c, int out, int part,
                             int cnt, const char *after)
{
    cg_put(t, " }\n            p%d[s_ * %lldll + o_] = m_;\n        }\n    }\n", part, (long long)r->nout);
    put_count_done(t, cnt, "g_", c->split, "    ");
    cg_put(t, "    if (!last_) return;\n    __threadfence();\n");
    if (c->split >= REDUCE_WARP_MIN)
        cg_put(t, "    const int l_ = threadIdx.x & 31;\n"
                  "    for (long long o_ = g_ * %d + (threadIdx.x >> 5); o_ < (g_ + 1) * %d && o_ < %lldll; o_ += %d) {\n",
               CG_BLOCK, CG_BLOCK, (long long)r->nout, CG_BLOCK / 32);
    else
        cg_put(t, "    {\n        const long long o_ = g_ * %d + threadIdx.x;\n        if (o_ < %lldll) {\n", CG_BLOCK,
               (long long)r->nout);
    put_partials(t, n, r, out, part, c->split, false, after);
    cg_put(t, "%s    }\n}\n", c->split >= REDUCE_WARP_MIN ? "" : "        }\n");
}

/* Reduced axes outermost (a bias gradient: [rows, C] -> [C]): a thread per
 * (output, chunk of rows), neighbouring threads reading neighbouring
 * outputs, each adding its rows in order; a block per CG_BLOCK outputs of
 * one chunk. With more than one chunk the chunks' results go to partials,
 * and the last of the blocks of those CG_BLOCK outputs adds their partials
 * (put_column_close), one launch in all. */
static const char *reduce_by_columns(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name,
                                     const reduction *r, const cg_ew_part *cast)
{
    column_split c = column_split_of(r);
    if (c.split == 1 || c.blocks > INT32_MAX) { /* one chunk (or a grid too large to count): a thread per output */
        cg_params ps = {0};
        cg_text b = {0};
        int in = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
        int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
        cg_put(&b, "        const long long o_ = e;\n        %s m_ = %s;\n        for (long long i_ = 0; i_ < %lldll; i_++) { ",
               r->acc, n->op == IR_OP_reduce_max ? "-(T)ALLOY_INF" : "0", (long long)r->count);
        char idx[64];
        al_fmt(idx, sizeof idx, "i_ * %lldll + o_", (long long)r->nout);
        put_term(&b, n, r, in, idx);
        cg_put(&b, " }\n");
        put_finish(&b, n, r, out);
        bool ok = cg_op_kernel(prog, g, k, name, r->wide ? "double" : "float", &b, &ps, r->nout, NULL, NULL);
        cg_text_free(&b);
        al_free(ps.at);
        return ok ? NULL : "out of memory";
    }
    cg_params ps = {0};
    cg_text t = {0}, after = {0};
    int in = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int part = cg_param_of(&ps, CG_PARAM_ROWS, n->id, true, r->nout * c.split);
    int cnt = cg_param_of(&ps, CG_PARAM_COUNTER, n->id, true, c.groups);
    if (cast) {
        cg_ew_part cp = *cast;
        cp.ps = &ps;
        cg_emit_members(&after, &cp);
    }
    cg_put_preamble(&t);
    cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", CG_BLOCK, name);
    cg_param_list(&t, g, &ps);
    put_column_open(&t, n, r, &c, r->wide);
    char idx[64];
    al_fmt(idx, sizeof idx, "i_ * %lldll + o_", (long long)r->nout);
    put_term(&t, n, r, in, idx);
    put_column_close(&t, n, r, &c, out, part, cnt, after.s);
    int64_t bytes = (int64_t)(ir_nbytes(r->t) + ir_nbytes(&n->type));
    if (cast) bytes += (int64_t)ir_nbytes(&g->nodes[cast->s->members[cast->first].node]->type);
    bool ok = !after.oom && cg_add_kernel(prog, g, name, k, STEP_KIND_OP, &t, &ps, (unsigned)c.blocks, CG_BLOCK, bytes);
    cg_text_free(&t), cg_text_free(&after);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* Whether a reduction takes the column kernel (reduce_by_columns, split). */
static bool by_columns(const reduction *r, char layout)
{
    bool busy = r->nout >= REDUCE_THREADS / 4 && r->count <= 256; /* outputs enough, short loops */
    return !(r->integer || r->count <= 32 || busy || layout != 'o');
}

/* reduce_sum / mean / max: the kernel shape by how the reduced elements lie
 * and how many outputs there are. Floating point only for the split forms
 * (integers keep the one order the CPU has); f32 accumulation (f64 for
 * f64); max with NaN winning. */
const char *cg_emit_reduce(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    reduction r = reduction_of(g, n);
    char layout = layout_of(&r);
    bool busy = r.nout >= REDUCE_THREADS / 4 && r.count <= 256; /* outputs enough, short loops */
    if (r.integer || r.count <= 32 || busy || layout == 'x') return reduce_per_thread(prog, g, k, n, name, &r);
    return layout == 'i' ? reduce_by_blocks(prog, g, k, n, name, &r) : reduce_by_columns(prog, g, k, n, name, &r, NULL);
}

/* The lone cast of reduction n's result (between float dtypes, not f64:
 * through f32, as the cast's own kernel) that step k is, or NULL. */
static const ir_node *cast_of(const ir_graph *g, const schedule *s, int k, const ir_node *n)
{
    if (k >= s->nsteps) return NULL;
    const sched_step *st = &s->steps[k];
    const ir_node *c = g->nodes[st->pos];
    if (st->kind != STEP_KIND_OP || st->n != 1 || c->op != IR_OP_cast || c->in[0] != n->id) return NULL;
    alloy_dtype a = n->type.dtype, b = c->type.dtype;
    if (!ir_is_float(a) || !ir_is_float(b) || a == ALLOY_F64 || b == ALLOY_F64) return NULL;
    return ir_numel(&c->type) == ir_numel(&n->type) ? c : NULL;
}

/* The statements of cast step k (cast_of) at output o_, as its own kernel's. */
static cg_ew_part cast_part(const ir_graph *g, const schedule *s, int k)
{
    return (cg_ew_part){.g = g, .s = s, .step = &s->steps[k], .first = s->steps[k].first, .n = 1,
                        .space = &s->steps[k].space, .product = -1, .e = "o_"};
}

const ir_node *cg_reduce_cast_of(const ir_graph *g, const schedule *s, int k)
{
    const sched_step *st = &s->steps[k];
    const ir_node *n = g->nodes[st->pos];
    if (st->kind != STEP_KIND_OP || st->n != 1 || (s->members[st->first].flags & MEMBER_VIEW)) return NULL;
    if (n->op != IR_OP_reduce_sum && n->op != IR_OP_reduce_mean && n->op != IR_OP_reduce_max) return NULL;
    reduction r = reduction_of(g, n);
    if (!by_columns(&r, layout_of(&r))) return NULL;
    column_split c = column_split_of(&r);
    return c.split > 1 && c.blocks <= INT32_MAX ? cast_of(g, s, k + 1, n) : NULL;
}

const char *cg_emit_reduce_cast(cg_program *prog, const ir_graph *g, const schedule *s, int k)
{
    if (!cg_reduce_cast_of(g, s, k)) return "no cast of this step's column reduction after it";
    const ir_node *n = g->nodes[s->steps[k].pos];
    reduction r = reduction_of(g, n);
    cg_ew_part cp = cast_part(g, s, k + 1);
    char name[48];
    al_fmt(name, sizeof name, "alloy_s%d_chain2_%s", k, ir_ops[n->op].name);
    return reduce_by_columns(prog, g, k, n, name, &r, &cp);
}

const ir_node *cg_ew_colsum_of(const ir_graph *g, const schedule *s, int k)
{
    const sched_step *st = &s->steps[k];
    if (st->kind != STEP_KIND_EW || k + 1 >= s->nsteps) return NULL;
    const sched_step *nx = &s->steps[k + 1];
    if (nx->kind != STEP_KIND_OP || nx->n != 1 || (s->members[nx->first].flags & MEMBER_VIEW)) return NULL;
    const ir_node *n = g->nodes[nx->pos];
    if (n->op != IR_OP_reduce_sum && n->op != IR_OP_reduce_mean && n->op != IR_OP_reduce_max) return NULL;
    const ir_node *x = g->nodes[n->in[0]];
    int m = s->member_of[x->id];
    if (s->step_of[x->id] != k || m < 0 || !(s->members[m].flags & MEMBER_STORED)) return NULL;
    if (!ir_is_float(x->type.dtype) || x->type.rank != st->space.rank) return NULL;
    for (int d = 0; d < x->type.rank; d++)
        if (x->type.dims[d] != st->space.dims[d]) return NULL;
    reduction r = reduction_of(g, n);
    if (!by_columns(&r, layout_of(&r))) return NULL;
    column_split c = column_split_of(&r);
    return c.split > 1 && c.blocks <= INT32_MAX ? n : NULL;
}

const ir_node *cg_ew_colsum_cast(const ir_graph *g, const schedule *s, int k)
{
    const ir_node *n = cg_ew_colsum_of(g, s, k);
    return n ? cast_of(g, s, k + 2, n) : NULL;
}

const char *cg_emit_ew_colsum(cg_program *prog, const ir_graph *g, const schedule *s, int k)
{
    const ir_node *n = cg_ew_colsum_of(g, s, k), *cast = cg_ew_colsum_cast(g, s, k);
    if (!n) return "no column reduction of this step's values after it";
    const sched_step *st = &s->steps[k];
    reduction r = reduction_of(g, n);
    column_split c = column_split_of(&r);
    cg_params ps = {0};
    cg_ew_part p = {.g = g, .s = s, .step = st, .first = st->first, .n = st->n, .space = &st->space, .product = -1,
                    .e = "e", .ps = &ps, .wide = s->parts[st->first_part].wide};
    cg_text body = {0}, t = {0}, x = {0};
    cg_emit_members(&body, &p);
    /* the value as stored (rounded to its dtype), read back: the sum the reduction would make of it */
    int in = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    char idx[160];
    cg_value_index(g, s, n->in[0], "e", idx, sizeof idx);
    put_value(&x, &r, in, idx);
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int part = cg_param_of(&ps, CG_PARAM_ROWS, n->id, true, r.nout * c.split);
    int cnt = cg_param_of(&ps, CG_PARAM_COUNTER, n->id, true, c.groups);
    /* the cast after the reduction: its own kernel's statements, at output o_, reading the output just stored */
    cg_text after = {0};
    if (cast) {
        cg_ew_part cp = cast_part(g, s, k + 2);
        cp.ps = &ps;
        cg_emit_members(&after, &cp);
    }
    char name[48];
    al_fmt(name, sizeof name, "alloy_s%d_chain%d_ew_%s", k, cast ? 3 : 2, ir_ops[n->op].name);
    cg_put_preamble(&t);
    cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", CG_BLOCK, name);
    cg_param_list(&t, g, &ps);
    put_column_open(&t, n, &r, &c, p.wide || r.wide);
    cg_put(&t, "\n        const long long e = i_ * %lldll + o_;\n%s        ", (long long)r.nout, body.s ? body.s : "");
    put_combine(&t, n->op, x.s ? x.s : "0");
    cg_put(&t, "\n           ");
    put_column_close(&t, n, &r, &c, out, part, cnt, after.s);
    int64_t bytes = (int64_t)ir_nbytes(&n->type);
    for (int i = 0; i < ps.n; i++)
        if (ps.at[i].kind == CG_PARAM_NODE && ps.at[i].node != n->id) bytes += (int64_t)ir_nbytes(&g->nodes[ps.at[i].node]->type);
    bool ok = !body.oom && !x.oom && !after.oom && !ps.oom &&
              cg_add_kernel(prog, g, name, k, st->kind, &t, &ps, (unsigned)c.blocks, CG_BLOCK, bytes);
    cg_text_free(&body), cg_text_free(&t), cg_text_free(&x), cg_text_free(&after);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

