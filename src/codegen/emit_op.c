/* emit_op.c - kernels for the single-op steps: data movement, constants, reductions (the CPU's pairwise order), embedding and its gradient, a lone found_inf. */
#include <string.h>

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

static unsigned grid_for(int64_t total)
{
    int64_t blocks = (total + CG_BLOCK - 1) / CG_BLOCK;
    return (unsigned)(blocks < 1 ? 1 : blocks > CG_MAX_GRID ? CG_MAX_GRID : blocks);
}

/* A kernel over the node's elements: body (statements at flat index e) in a grid-stride loop. */
static bool finish(cg_program *prog, const ir_graph *g, int k, const char *name, const char *compute_type,
                   cg_text *body, cg_params *ps, int64_t total, const char *file_scope, const char *before)
{
    cg_text t = {0};
    cg_put_preamble(&t);
    cg_put(&t, "%s\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", file_scope ? file_scope : "", CG_BLOCK, name);
    cg_param_list(&t, g, ps);
    cg_put(&t, ")\n{\n    typedef %s T;\n%s", compute_type, before ? before : "");
    cg_put(&t, "    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < %lldll;"
               " e += (long long)gridDim.x * blockDim.x) {\n%s    }\n}\n",
           (long long)total, body->s ? body->s : "");
    int64_t bytes = 0;
    for (int i = 0; i < ps->n; i++)
        if (ps->at[i].kind == CG_PARAM_NODE) bytes += (int64_t)ir_nbytes(&g->nodes[ps->at[i].node]->type);
    bool ok = !body->oom && cg_add_kernel(prog, g, name, k, STEP_OP, &t, ps, grid_for(total), CG_BLOCK, bytes);
    cg_text_free(&t);
    return ok;
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
    bool ok = finish(prog, g, k, name, "float", &b, &ps, ir_numel(o), NULL, NULL);
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
        cg_put(&before, "static __device__ const unsigned long long %s_bits[%lld] = {", name, (long long)(count ? count : 1));
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
    bool ok = finish(prog, g, k, name, "double", &b, &ps, count, before.s, NULL);
    cg_text_free(&b), cg_text_free(&before);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* reduce_sum / mean / max: one thread per output element; sums pairwise in
 * the CPU's order (halves, runs of at most 16 added in order), in f32 for
 * f16/bf16/f32, f64 for f64, wrapping int64 for integers; max with NaN
 * winning. */
static const char *reduce(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    const ir_type *t = &g->nodes[n->in[0]]->type;
    bool reduced[ALLOY_MAX_RANK] = {false};
    int naxes;
    const int64_t *axes = ir_attr_ints(n, "axes", &naxes);
    for (int i = 0; i < naxes; i++) {
        int ax;
        if (ir_norm_axis(axes[i], t->rank, &ax)) reduced[ax] = true;
    }
    int64_t count = 1, nout = 1;
    for (int d = 0; d < t->rank; d++) {
        if (reduced[d]) count *= t->dims[d];
        else nout *= t->dims[d];
    }
    bool integer = ir_is_int(t->dtype);
    /* integer sums wrap (unsigned, as the CPU's int64 accumulator); a maximum compares signed */
    const char *acc = integer ? (n->op == IR_OP_reduce_max ? "long long" : "unsigned long long")
                              : t->dtype == ALLOY_F64 ? "double" : "float";
    cg_params ps = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0), in = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    cg_text b = {0}, before = {0};
    /* the element r of the reduced set, and the output's kept coordinates, as an offset in the operand */
    cg_put(&before, "    struct R_ {\n        const %s *p; long long base;\n"
                    "        __device__ long long at(long long r) const\n        {\n            long long o_ = base;\n",
           cg_storage(t->dtype));
    int64_t stride = 1, rstride[ALLOY_MAX_RANK];
    for (int d = t->rank - 1; d >= 0; d--) rstride[d] = stride, stride *= t->dims[d];
    for (int d = t->rank - 1; d >= 0; d--)
        if (reduced[d])
            cg_put(&before, "            o_ += (r %% %lldll) * %lldll; r /= %lldll;\n", (long long)t->dims[d],
                   (long long)rstride[d], (long long)t->dims[d]);
    cg_put(&before, "            return o_;\n        }\n        __device__ %s v(long long r) const { return ", acc);
    if (integer) cg_put(&before, "(%s)(long long)p[at(r)]", acc);
    else if (t->dtype == ALLOY_F16) cg_put(&before, "alloy_h2f(p[at(r)])");
    else if (t->dtype == ALLOY_BF16) cg_put(&before, "alloy_bf2f(p[at(r)])");
    else cg_put(&before, "p[at(r)]");
    cg_put(&before, "; }\n        __device__ %s sum(long long lo, long long n) const\n        {\n"
                    "            if (n > 16) return sum(lo, n / 2) + sum(lo + n / 2, n - n / 2);\n"
                    "            %s s = 0;\n            for (long long i = 0; i < n; i++) s += v(lo + i);\n"
                    "            return s;\n        }\n    };\n",
           acc, acc);
    /* the kept coordinates of output e */
    cg_put(&b, "        long long q_ = e, base_ = 0; (void)q_;\n");
    for (int d = t->rank - 1; d >= 0; d--)
        if (!reduced[d])
            cg_put(&b, "        base_ += (q_ %% %lldll) * %lldll; q_ /= %lldll;\n", (long long)t->dims[d],
                   (long long)rstride[d], (long long)t->dims[d]);
    cg_put(&b, "        const R_ r_ = {p%d, base_};\n", in);
    if (n->op == IR_OP_reduce_max) {
        cg_put(&b, "        %s m_ = r_.v(0);\n        for (long long i = 1; i < %lldll; i++) { %s x_ = r_.v(i); "
                   "if (!(m_ != m_) && (x_ > m_ || x_ != x_)) m_ = x_; }\n",
               acc, (long long)count, acc);
    } else if (count == 1) { /* the CPU copies (a sum 0 + -0 would give +0) */
        cg_put(&b, "        %s m_ = r_.v(0);\n", acc);
    } else if (count == 0) {
        cg_put(&b, "        %s m_ = %s;\n", acc, n->op == IR_OP_reduce_mean && !integer ? "ALLOY_NAN" : "0");
    } else {
        cg_put(&b, "        %s m_ = r_.sum(0, %lldll);\n", acc, (long long)count);
        if (n->op == IR_OP_reduce_mean)
            cg_put(&b, integer ? "        m_ = (%s)((long long)m_ / %lldll);\n" : "        m_ = m_ / (%s)%lldll;\n", acc,
                   (long long)count);
    }
    cg_put(&b, "        p%d[e] = ", out);
    if (integer) cg_put(&b, "(%s)(long long)m_", cg_storage(n->type.dtype));
    else cg_store(&b, n->type.dtype, t->dtype == ALLOY_F64, "m_");
    cg_put(&b, ";\n");
    bool ok = finish(prog, g, k, name, "float", &b, &ps, nout, NULL, before.s);
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
    bool ok = finish(prog, g, k, name, "float", &b, &ps, ir_numel(&n->type), NULL, NULL);
    cg_text_free(&b);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* embedding_grad: one thread per table element, adding the rows of dy whose
 * id is its row in position order (the CPU's order), in f32 (f64 for f64). */
static const char *embedding_grad(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    const ir_type *ids = &g->nodes[n->in[0]]->type, *dy = &g->nodes[n->in[1]]->type;
    int64_t rows = n->type.dims[0], dim = n->type.dims[1], positions = ir_numel(ids);
    bool wide = n->type.dtype == ALLOY_F64;
    cg_params ps = {0};
    cg_text b = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int pi = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0), pd = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0);
    int flag = cg_param_of(&ps, CG_PARAM_FLAG, n->id, true, 1);
    cg_put(&b, "        const long long row_ = e / %lldll, c_ = e %% %lldll;\n        T a_ = 0;\n", (long long)dim,
           (long long)dim);
    cg_put(&b, "        for (long long p_ = 0; p_ < %lldll; p_++) {\n            const long long id_ = (long long)p%d[p_];\n"
               "            if (e == 0 && (id_ < 0 || id_ >= %lldll)) atomicOr(p%d, 1u);\n"
               "            if (id_ == row_) a_ += ",
           (long long)positions, pi, (long long)rows, flag);
    char pdn[16];
    al_fmt(pdn, sizeof pdn, "p%d", pd);
    char idx[64];
    al_fmt(idx, sizeof idx, "p_ * %lldll + c_", (long long)dim);
    cg_load(&b, dy->dtype, pdn, idx);
    cg_put(&b, ";\n        }\n        p%d[e] = ", out);
    cg_store(&b, n->type.dtype, wide, "a_");
    cg_put(&b, ";\n");
    bool ok = finish(prog, g, k, name, wide ? "double" : "float", &b, &ps, rows * dim, NULL, NULL);
    cg_text_free(&b);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
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
    case IR_OP_reduce_max: return reduce(prog, g, k, n, name);
    case IR_OP_embedding: return embedding(prog, g, k, n, name);
    case IR_OP_embedding_grad: return embedding_grad(prog, g, k, n, name);
    case IR_OP_found_inf: return cg_emit_multi(prog, g, s, k);
    case IR_OP_matmul: return "a library GEMM (cuBLASLt)";
    default: return "no kernel yet for this op";
    }
}
