/* emit_op.c - kernels for the single-op steps: data movement, constants, reductions (emit_reduce.c), argmax and argmin, embedding and its gradient, one_hot, the random ops, a lone found_inf; the indexing ops go to emit_index.c. */
#include <string.h>

#include "base/random.h"
#include "codegen/emit_impl.h"

/* Appends declarations of the coordinates o0..o<rank-1> of flat index e in t. */
static void coords(cg_text *c, const ir_type *t, const char *prefix, const char *e)
{
    cg_put(c, "        long long q_ = %s; (void)q_;\n", e);
    for (int d = t->rank - 1; d >= 0; d--)
        cg_put(c, "        const long long %s%d = q_ %% %lldll; q_ /= %lldll; (void)%s%d;\n", prefix, d,
               (long long)t->dims[d], (long long)t->dims[d], prefix, d);
}

/* Appends the flat offset in t of coordinates <prefix><d> (a size-1 dim reads 0). */
static void offset(cg_text *c, const ir_type *t, const char *prefix)
{
    int64_t stride = 1;
    bool any = false;
    cg_put(c, "(");
    for (int d = t->rank - 1; d >= 0; d--) {
        if (t->dims[d] != 1) cg_put(c, "%s%s%d * %lldll", any ? " + " : "", prefix, d, (long long)stride), any = true;
        stride *= t->dims[d];
    }
    cg_put(c, "%s)", any ? "" : "0");
}

/* Data movement: out[e] = an operand element, or a fill (pad's zero). */
static const char *movement(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    cg_params ps = {0};
    cg_text b = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    const ir_type *o = &n->type, *t0 = &g->nodes[n->in[0]]->type;
    int axis = 0;
    if (ir_attr_schema(n->op, "axis")) ir_norm_axis(ir_attr_i(n, "axis"), o->rank, &axis);
    coords(&b, o, "o", "e");
    if (n->op == IR_OP_reshape) {
        cg_put(&b, "        p%d[e] = p%d[e];\n", out, cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0));
    } else if (n->op == IR_OP_broadcast_to) { /* numpy: the operand's dims align right */
        for (int d = 0; d < t0->rank; d++) cg_put(&b, "        const long long i%d = o%d;\n", d, d + o->rank - t0->rank);
        cg_put(&b, "        p%d[e] = p%d[", out, cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0));
        offset(&b, t0, "i");
        cg_put(&b, "];\n");
    } else if (n->op == IR_OP_transpose) {
        int np;
        const int64_t *perm = ir_attr_ints(n, "perm", &np);
        for (int d = 0; d < np; d++) cg_put(&b, "        const long long i%lld = o%d;\n", (long long)perm[d], d);
        cg_put(&b, "        p%d[e] = p%d[", out, cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0));
        offset(&b, t0, "i");
        cg_put(&b, "];\n");
    } else if (n->op == IR_OP_slice || n->op == IR_OP_pad) {
        int64_t shift = n->op == IR_OP_slice ? ir_attr_i(n, "start") : -ir_attr_i(n, "before");
        for (int d = 0; d < o->rank; d++)
            cg_put(&b, "        const long long i%d = o%d + (%lldll);\n", d, d, (long long)(d == axis ? shift : 0));
        cg_put(&b, "        p%d[e] = ", out);
        if (n->op == IR_OP_pad)
            cg_put(&b, "i%d < 0 || i%d >= %lldll ? (%s)0 : ", axis, axis, (long long)t0->dims[axis], cg_storage(o->dtype));
        cg_put(&b, "p%d[", cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0));
        offset(&b, t0, "i");
        cg_put(&b, "];\n");
    } else { /* concat: the operand whose range along axis holds o<axis> */
        int64_t start = 0;
        for (int j = 0; j < n->nin; j++) {
            const ir_type *tj = &g->nodes[n->in[j]]->type;
            cg_put(&b, "        %sif (o%d < %lldll) {\n", j ? "else " : "", axis, (long long)(start + tj->dims[axis]));
            for (int d = 0; d < o->rank; d++)
                cg_put(&b, "            const long long i%d = o%d - (%lldll);\n", d, d, (long long)(d == axis ? start : 0));
            cg_put(&b, "            p%d[e] = p%d[", out, cg_param_of(&ps, CG_PARAM_NODE, n->in[j], false, 0));
            offset(&b, tj, "i");
            cg_put(&b, "];\n        }\n");
            start += tj->dims[axis];
        }
    }
    bool ok = cg_op_kernel(prog, g, k, name, "float", &b, &ps, ir_numel(o), NULL, NULL);
    cg_text_free(&b);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* A constant: its value (or values) rounded once from double, as the CPU
 * stores them. The values are a file-scope array of their bits: a
 * __device__ variable's initializer must be constant (no ALLOY_NAN call),
 * and T is not declared there. */
static const char *constant(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    cg_params ps = {0};
    cg_text b = {0}, before = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    const ir_attr *values = ir_attr_find(n, "values");
    int64_t count = ir_numel(&n->type);
    if (values && values->kind == IR_ATTR_FLOATS && values->n == count) {
        cg_put(&before, "static __device__ const unsigned long long %s_bits[%lld] = {", name,
               (long long)(count ? count : 1));
        for (int64_t i = 0; i < count; i++) {
            uint64_t u;
            memcpy(&u, &values->floats[i], sizeof u);
            cg_put(&before, "%s0x%016llxull", i ? ", " : "", (unsigned long long)u);
        }
        cg_put(&before, "%s};\n", count ? "" : "0");
        cg_put(&b, "        const double v_ = alloy_u2d(%s_bits[e]);\n        p%d[e] = ", name, out);
        cg_store(&b, n->type.dtype, true, "v_");
    } else {
        cg_put(&b, "        const double v_ = (double)");
        cg_double(&b, ir_attr_float(n, "value", 0));
        cg_put(&b, ";\n        p%d[e] = ", out);
        cg_store(&b, n->type.dtype, true, "v_");
    }
    cg_put(&b, ";\n");
    bool ok = cg_op_kernel(prog, g, k, name, "double", &b, &ps, count, before.s, NULL);
    cg_text_free(&b), cg_text_free(&before);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* embedding: out[p, :] = table[ids[p], :]; an id out of range sets the step's flag and gives zeros. */
static const char *embedding(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    const ir_type *table = &g->nodes[n->in[1]]->type;
    int64_t rows = table->dims[0], dim = table->dims[1];
    cg_params ps = {0};
    cg_text b = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int ids = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0), tab = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0);
    int flag = cg_param_of(&ps, CG_PARAM_FLAG, n->id, true, 1);
    cg_put(&b, "        const long long id_ = (long long)p%d[e / %lldll], c_ = e %% %lldll;\n", ids, (long long)dim,
           (long long)dim);
    cg_put(&b, "        if (id_ < 0 || id_ >= %lldll) { p%d[e] = (%s)0; atomicOr(p%d, 1u); continue; }\n",
           (long long)rows, out, cg_storage(n->type.dtype), flag);
    cg_put(&b, "        p%d[e] = p%d[id_ * %lldll + c_];\n", out, tab, (long long)dim);
    bool ok = cg_op_kernel(prog, g, k, name, "float", &b, &ps, ir_numel(&n->type), NULL, NULL);
    cg_text_free(&b);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* argmax / argmin: a thread per result walking its axis in order as the CPU
 * does (cpu_reduce.c): the first extreme wins, a NaN ends the walk; values
 * compare as doubles, so the index is the CPU's. */
static const char *arg(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    const ir_type *t = &g->nodes[n->in[0]]->type;
    int axis = 0;
    ir_norm_axis(ir_attr_i(n, "axis"), t->rank, &axis);
    int64_t len = t->dims[axis], inner = 1;
    for (int d = axis + 1; d < t->rank; d++) inner *= t->dims[d];
    cg_params ps = {0};
    cg_text b = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0), in = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    char pin[16], idx[96];
    al_fmt(pin, sizeof pin, "p%d", in);
    cg_put(&b, "        const long long base_ = (e / %lldll) * %lldll + e %% %lldll;\n        T b_ = ", (long long)inner,
           (long long)(len * inner), (long long)inner);
    cg_load(&b, t->dtype, pin, "base_");
    cg_put(&b, ";\n        long long best_ = 0;\n        for (long long i_ = 1; i_ < %lldll && b_ == b_; i_++) {\n"
               "            const T c_ = ", (long long)len);
    al_fmt(idx, sizeof idx, "base_ + i_ * %lldll", (long long)inner);
    cg_load(&b, t->dtype, pin, idx);
    cg_put(&b, ";\n            if (c_ != c_ || c_ %c b_) { b_ = c_; best_ = i_; }\n        }\n        p%d[e] = best_;\n",
           n->op == IR_OP_argmax ? '>' : '<', out);
    bool ok = cg_op_kernel(prog, g, k, name, "double", &b, &ps, ir_numel(&n->type), NULL, NULL);
    cg_text_free(&b);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* one_hot: a thread per result element, 1 where the column is the row's id;
 * an id out of range gives a row of zeros and sets the step's flag (as
 * embedding does). */
static const char *one_hot(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    int64_t depth = ir_attr_i(n, "depth");
    cg_params ps = {0};
    cg_text b = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0), ids = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    int flag = cg_param_of(&ps, CG_PARAM_FLAG, n->id, true, 1);
    cg_put(&b, "        const long long id_ = (long long)p%d[e / %lldll], c_ = e %% %lldll;\n", ids, (long long)depth,
           (long long)depth);
    cg_put(&b, "        const bool bad_ = id_ < 0 || id_ >= %lldll;\n        if (bad_ && c_ == 0) atomicOr(p%d, 1u);\n"
               "        p%d[e] = ", (long long)depth, flag, out);
    cg_store(&b, n->type.dtype, false, "!bad_ && id_ == c_ ? (T)1 : (T)0");
    cg_put(&b, ";\n");
    bool ok = cg_op_kernel(prog, g, k, name, "float", &b, &ps, ir_numel(&n->type), NULL, NULL);
    cg_text_free(&b);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* dropout, uniform, normal: a thread per element, drawing with
 * base/random.h's definitions (written before the kernel, once per module):
 * the CPU's bits (normal: the device's log and cos). dropout computes
 * x * (kept ? scale : 0) in f32 (f64 for f64), as cpu_random.c. */
static const char *random_op(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    cg_params ps = {0};
    cg_text b = {0};
    int at = n->op == IR_OP_dropout ? 1 : 0;
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int x = at ? cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0) : -1;
    int step = n->nin > at ? cg_param_of(&ps, CG_PARAM_NODE, n->in[at], false, 0) : -1;
    alloy_dtype dt = n->type.dtype;
    bool wide = dt == ALLOY_F64;
    if (step >= 0) cg_put(&b, "        const unsigned long long st_ = (unsigned long long)(long long)p%d[0];\n", step);
    else cg_put(&b, "        const unsigned long long st_ = 0ull;\n");
    cg_put(&b, "        const unsigned long long seed_ = %lluull, stream_ = %lluull;\n",
           (unsigned long long)ir_attr_int(n, "seed", 0), (unsigned long long)ir_attr_i(n, "stream"));
    if (n->op == IR_OP_dropout) {
        double p = ir_attr_f(n, "p");
        char xn[16];
        al_fmt(xn, sizeof xn, "p%d", x);
        cg_put(&b, "        const bool keep_ = alloy_dropout_keep(seed_, stream_, st_, (unsigned long long)e, ");
        cg_put(&b, "%a);\n        const T x_ = ", ALLOY_DROPOUT_THRESHOLD(p)); /* a double, as the CPU compares */
        cg_load(&b, dt, xn, "e");
        cg_put(&b, ";\n        const T v_ = x_ * (keep_ ? (T)");
        cg_double(&b, ALLOY_DROPOUT_SCALE(p));
        cg_put(&b, " : (T)0);\n");
    } else {
        bool normal = n->op == IR_OP_normal;
        cg_put(&b, "        const double v_ = %s(seed_, stream_, st_, (unsigned long long)e, ",
               normal ? "alloy_normal_draw" : "alloy_uniform_draw");
        if (!normal) cg_put(&b, "%d, ", wide);
        /* doubles (finite: the type rule), not T: the draw is in f64 */
        cg_put(&b, "%a, %a);\n", ir_attr_f(n, normal ? "mean" : "low"), ir_attr_f(n, normal ? "std" : "high"));
    }
    cg_put(&b, "        p%d[e] = ", out);
    cg_store(&b, dt, wide || n->op != IR_OP_dropout, "v_");
    cg_put(&b, ";\n");
    static const char scope[] = "#ifndef ALLOY_RANDOM_DEFINED\n#define ALLOY_RANDOM_DEFINED\n" ALLOY_RANDOM_TEXT "\n#endif\n";
    bool ok = cg_op_kernel(prog, g, k, name, wide ? "double" : "float", &b, &ps, ir_numel(&n->type), scope, NULL);
    cg_text_free(&b);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* embedding_grad: the ids scanned once per table row while the table is
 * small, sorted by row first when it is large (a vocabulary of 50,257: the
 * scan reads 8192 ids 50,257 times at GPT-2's B8, the sort's one block
 * compares each id with up to 1,023 others once). */
enum { EMBED_MAX_COLS_PER_THREAD = 32, SORT_BLOCK = 1024, EMBED_SORT_ROWS = 4096 };

/* embedding_grad for a small table (at most EMBED_SORT_ROWS rows): a
 * block per table row, each thread owning columns of it in registers; the block walks the ids in tiles of CG_BLOCK through shared
 * memory, and a tile holding the row's id adds those rows of dy in
 * position order (the CPU's order, so the sums are the CPU's bit for bit).
 * f32 accumulation (f64 for f64). Block 0 flags ids out of range. */
static const char *embedding_grad_scan(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    const ir_type *ids = &g->nodes[n->in[0]]->type, *dy = &g->nodes[n->in[1]]->type;
    int64_t rows = n->type.dims[0], dim = n->type.dims[1], positions = ir_numel(ids);
    int64_t cpt = (dim + CG_BLOCK - 1) / CG_BLOCK;
    if (cpt > EMBED_MAX_COLS_PER_THREAD) return "embedding rows wider than 8192: no kernel yet";
    if (cpt < 1) cpt = 1;
    bool wide = n->type.dtype == ALLOY_F64;
    cg_params ps = {0};
    cg_text t = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int pi = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0), pd = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0);
    int flag = cg_param_of(&ps, CG_PARAM_FLAG, n->id, true, 1);
    cg_put_preamble(&t);
    cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", CG_BLOCK, name);
    cg_param_list(&t, g, &ps);
    cg_put(&t, ")\n{\n    typedef %s T;\n    __shared__ unsigned char hit_[%d];\n    __shared__ int any_;\n"
               "    const int tid = threadIdx.x;\n"
               "    for (long long row = blockIdx.x; row < %lldll; row += gridDim.x) {\n"
               "        T a_[%lld];\n        for (int j_ = 0; j_ < %lld; j_++) a_[j_] = 0;\n"
               "        for (long long t_ = 0; t_ < %lldll; t_ += %d) {\n"
               "            if (tid == 0) any_ = 0;\n            __syncthreads();\n"
               "            const long long p_ = t_ + tid;\n"
               "            const long long id_ = p_ < %lldll ? (long long)p%d[p_] : -1;\n"
               "            if (row == 0 && p_ < %lldll && (id_ < 0 || id_ >= %lldll)) atomicOr(p%d, 1u);\n"
               "            hit_[tid] = id_ == row;\n            if (id_ == row) any_ = 1;\n            __syncthreads();\n"
               "            if (any_)\n"
               "                for (int q_ = 0; q_ < %d && t_ + q_ < %lldll; q_++) {\n"
               "                    if (!hit_[q_]) continue;\n"
               "                    for (int j_ = 0; j_ < %lld; j_++) {\n"
               "                        const long long c_ = tid + %d * j_;\n"
               "                        if (c_ < %lldll) a_[j_] += ",
           wide ? "double" : "float", CG_BLOCK, (long long)rows, (long long)cpt, (long long)cpt, (long long)positions,
           CG_BLOCK, (long long)positions, pi, (long long)positions, (long long)rows, flag, CG_BLOCK,
           (long long)positions, (long long)cpt, CG_BLOCK, (long long)dim);
    char pdn[16], idx[64];
    al_fmt(pdn, sizeof pdn, "p%d", pd);
    al_fmt(idx, sizeof idx, "(t_ + q_) * %lldll + c_", (long long)dim);
    cg_load(&t, dy->dtype, pdn, idx);
    cg_put(&t, ";\n                    }\n                }\n            __syncthreads();\n        }\n"
               "        for (int j_ = 0; j_ < %lld; j_++) {\n            const long long c_ = tid + %d * j_;\n"
               "            if (c_ < %lldll) p%d[row * %lldll + c_] = ",
           (long long)cpt, CG_BLOCK, (long long)dim, out, (long long)dim);
    cg_store(&t, n->type.dtype, wide, "a_[j_]");
    cg_put(&t, ";\n        }\n    }\n}\n");
    bool ok = cg_add_kernel(prog, g, name, k, STEP_KIND_OP, &t, &ps, (unsigned)(rows > CG_MAX_GRID ? CG_MAX_GRID : rows < 1 ? 1 : rows),
                            CG_BLOCK, (int64_t)(ir_nbytes(&n->type) + ir_nbytes(ids) + ir_nbytes(dy)));
    cg_text_free(&t);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* embedding_grad for a large table (more than EMBED_SORT_ROWS rows), in
 * two kernels that share an int scratch in the step's aux block (a CG_PARAM_ROWS slot of the node): start[rows + 1], cur[rows],
 * order[positions].
 *   _sort, one block of SORT_BLOCK threads: counts the ids per row (an id
 *     out of range sets the flag and is skipped), scans the counts into each
 *     row's start, then places the positions in order[] tile by tile, each
 *     after the earlier positions of its row (its rank among the equal ids
 *     of the earlier threads of its tile: SORT_BLOCK / 2 comparisons per
 *     position on average): a stable counting sort, so each row's
 *     positions ascend.
 *   the rows: a block per table row, each thread owning columns of it in
 *     registers, adds the rows of dy at its positions in ascending order (the
 *     CPU's order, so the sums are the CPU's bit for bit) with f32
 *     accumulation (f64 for f64), and stores every row (zeros where no id).
 * The ids are read twice and dy once, instead of all the ids once per table
 * row. */


static const char *embedding_grad_sorted(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    const ir_type *ids = &g->nodes[n->in[0]]->type, *dy = &g->nodes[n->in[1]]->type;
    int64_t rows = n->type.dims[0], dim = n->type.dims[1], positions = ir_numel(ids);
    int64_t cpt = (dim + CG_BLOCK - 1) / CG_BLOCK;
    if (cpt > EMBED_MAX_COLS_PER_THREAD) return "embedding rows wider than 8192: no kernel yet";
    if (rows + 1 + rows + positions > INT32_MAX) return "embedding_grad with over 2^31 rows and positions: no kernel yet";
    if (cpt < 1) cpt = 1;
    bool wide = n->type.dtype == ALLOY_F64;
    int64_t scratch = 2 * rows + 1 + positions; /* ints; the slot holds as many floats (or doubles) */
    /* the sort */
    cg_params ps = {0};
    cg_text t = {0};
    int pi = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    int flag = cg_param_of(&ps, CG_PARAM_FLAG, n->id, true, 1);
    int ps_ = cg_param_of(&ps, CG_PARAM_ROWS, n->id, true, scratch);
    char sort[64];
    al_fmt(sort, sizeof sort, "%s_sort", name);
    cg_put_preamble(&t);
    cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", SORT_BLOCK, sort);
    cg_param_list(&t, g, &ps);
    cg_put(&t,
           ")\n{\n"
           "    const long long R_ = %lldll, P_ = %lldll;\n"
           "    int *start_ = (int *)p%d, *cur_ = start_ + R_ + 1, *order_ = cur_ + R_;\n"
           "    __shared__ int sums_[%d], tile_[%d];\n"
           "    const int tid = threadIdx.x, nt = blockDim.x;\n"
           "    for (long long r_ = tid; r_ < R_; r_ += nt) cur_[r_] = 0;\n"
           "    __syncthreads();\n"
           "    for (long long p_ = tid; p_ < P_; p_ += nt) {\n"
           "        const long long id_ = (long long)p%d[p_];\n"
           "        if (id_ < 0 || id_ >= R_) atomicOr(p%d, 1u);\n"
           "        else atomicAdd(&cur_[id_], 1);\n"
           "    }\n"
           "    __syncthreads();\n"
           "    const long long chunk_ = (R_ + nt - 1) / nt, r0_ = tid * chunk_, r1_ = r0_ + chunk_ < R_ ? r0_ + chunk_ : R_;\n"
           "    int s_ = 0;\n"
           "    for (long long r_ = r0_; r_ < r1_; r_++) s_ += cur_[r_];\n"
           "    sums_[tid] = s_;\n"
           "    __syncthreads();\n"
           "    if (tid == 0) {\n"
           "        int acc_ = 0;\n"
           "        for (int i_ = 0; i_ < nt; i_++) {\n            const int v_ = sums_[i_];\n"
           "            sums_[i_] = acc_;\n            acc_ += v_;\n        }\n"
           "        start_[R_] = acc_;\n"
           "    }\n"
           "    __syncthreads();\n"
           "    int acc_ = sums_[tid];\n"
           "    for (long long r_ = r0_; r_ < r1_; r_++) {\n"
           "        const int c_ = cur_[r_];\n        start_[r_] = acc_;\n        cur_[r_] = acc_;\n        acc_ += c_;\n"
           "    }\n"
           "    __syncthreads();\n"
           "    for (long long t_ = 0; t_ < P_; t_ += nt) {\n"
           "        const long long p_ = t_ + tid;\n"
           "        const long long v_ = p_ < P_ ? (long long)p%d[p_] : -1;\n"
           "        const int id_ = v_ >= 0 && v_ < R_ ? (int)v_ : -1; /* int: rows + positions < 2^31 */\n"
           "        tile_[tid] = id_;\n"
           "        __syncthreads();\n"
           "        int rank_ = 0;\n"
           "        if (id_ >= 0)\n"
           "            for (int i_ = 0; i_ < tid; i_++) rank_ += tile_[i_] == id_;\n"
           "        if (id_ >= 0) order_[cur_[id_] + rank_] = (int)p_; /* int: rows + positions < 2^31 */\n"
           "        __syncthreads();\n"
           "        if (id_ >= 0) atomicAdd(&cur_[id_], 1);\n"
           "        __syncthreads();\n"
           "    }\n"
           "}\n",
           (long long)rows, (long long)positions, ps_, SORT_BLOCK, SORT_BLOCK, pi, flag, pi);
    bool ok = cg_add_kernel(prog, g, sort, k, STEP_KIND_OP, &t, &ps, 1, SORT_BLOCK,
                            (int64_t)(2 * ir_nbytes(ids)) + 4 * scratch);
    cg_text_free(&t);
    al_free(ps.at);
    if (!ok) return "out of memory";
    /* the rows */
    ps = (cg_params){0};
    t = (cg_text){0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int pd = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0);
    int pr = cg_param_of(&ps, CG_PARAM_ROWS, n->id, false, scratch);
    cg_put_preamble(&t);
    cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", CG_BLOCK, name);
    cg_param_list(&t, g, &ps);
    cg_put(&t,
           ")\n{\n    typedef %s T;\n"
           "    const int *start_ = (const int *)p%d, *order_ = start_ + 2 * %lldll + 1;\n"
           "    const int tid = threadIdx.x;\n"
           "    for (long long row = blockIdx.x; row < %lldll; row += gridDim.x) {\n"
           "        T a_[%lld];\n        for (int j_ = 0; j_ < %lld; j_++) a_[j_] = 0;\n"
           "        for (int e_ = start_[row]; e_ < start_[row + 1]; e_++) {\n"
           "            const long long q_ = order_[e_];\n"
           "            for (int j_ = 0; j_ < %lld; j_++) {\n"
           "                const long long c_ = tid + %d * j_;\n"
           "                if (c_ < %lldll) a_[j_] += ",
           wide ? "double" : "float", pr, (long long)rows, (long long)rows, (long long)cpt, (long long)cpt,
           (long long)cpt, CG_BLOCK, (long long)dim);
    char pdn[16], idx[64];
    al_fmt(pdn, sizeof pdn, "p%d", pd);
    al_fmt(idx, sizeof idx, "q_ * %lldll + c_", (long long)dim);
    cg_load(&t, dy->dtype, pdn, idx);
    cg_put(&t, ";\n            }\n        }\n"
               "        for (int j_ = 0; j_ < %lld; j_++) {\n            const long long c_ = tid + %d * j_;\n"
               "            if (c_ < %lldll) p%d[row * %lldll + c_] = ",
           (long long)cpt, CG_BLOCK, (long long)dim, out, (long long)dim);
    cg_store(&t, n->type.dtype, wide, "a_[j_]");
    cg_put(&t, ";\n        }\n    }\n}\n");
    ok = cg_add_kernel(prog, g, name, k, STEP_KIND_OP, &t, &ps, (unsigned)(rows > CG_MAX_GRID ? CG_MAX_GRID : rows < 1 ? 1 : rows),
                       CG_BLOCK, (int64_t)(ir_nbytes(&n->type) + ir_nbytes(dy)) + 4 * (rows + 1 + positions));
    cg_text_free(&t);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

static const char *embedding_grad(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    return n->type.dims[0] > EMBED_SORT_ROWS ? embedding_grad_sorted(prog, g, k, n, name)
                                             : embedding_grad_scan(prog, g, k, n, name);
}

const char *cg_emit_op(cg_program *prog, const ir_graph *g, const schedule *s, int k)
{
    const ir_node *n = g->nodes[s->steps[k].pos];
    char name[48];
    al_fmt(name, sizeof name, "alloy_s%d_%s", k, ir_ops[n->op].name);
    switch (n->op) {
    case IR_OP_reshape:
    case IR_OP_broadcast_to:
    case IR_OP_transpose:
    case IR_OP_slice:
    case IR_OP_pad:
    case IR_OP_concat: return movement(prog, g, k, n, name);
    case IR_OP_constant: return constant(prog, g, k, n, name);
    case IR_OP_reduce_sum:
    case IR_OP_reduce_mean:
    case IR_OP_reduce_max: return cg_emit_reduce(prog, g, k, n, name);
    case IR_OP_embedding: return embedding(prog, g, k, n, name);
    case IR_OP_argmax:
    case IR_OP_argmin: return arg(prog, g, k, n, name);
    case IR_OP_one_hot: return one_hot(prog, g, k, n, name);
    case IR_OP_embedding_grad: return embedding_grad(prog, g, k, n, name);
    case IR_OP_dropout:
    case IR_OP_uniform:
    case IR_OP_normal: return random_op(prog, g, k, n, name);
    case IR_OP_gather:
    case IR_OP_index_select:
    case IR_OP_gather_grad:
    case IR_OP_index_select_grad:
    case IR_OP_arange:
    case IR_OP_cumsum: return cg_emit_index(prog, g, k, n, name);
    case IR_OP_found_inf: return cg_emit_multi(prog, g, s, k);
    case IR_OP_sum_squares: return cg_emit_sum_squares(prog, g, s, k, n, name);
    case IR_OP_attention:
    case IR_OP_attention_grad: return cg_emit_attention(prog, g, s, k);
    case IR_OP_matmul: return "a library GEMM (cuBLASLt)";
    case IR_OP_conv1d:
    case IR_OP_conv2d:
    case IR_OP_conv_grad_input:
    case IR_OP_conv_grad_weight:
    case IR_OP_max_pool2d:
    case IR_OP_avg_pool2d:
    case IR_OP_adaptive_avg_pool2d:
    case IR_OP_max_pool2d_grad:
    case IR_OP_avg_pool2d_grad:
    case IR_OP_adaptive_avg_pool2d_grad: return cg_emit_conv(prog, g, k, n, name);
    default: return "no kernel yet for this op";
    }
}
