/* emit_index.c - kernels for the indexing ops: gather and index_select (an index out of range sets the step's flag and reads 0), their scatter-add gradients (a thread per element of dx adding in the CPU's order), arange, cumsum (a thread per line). */
#include "codegen/emit_impl.h"

/* outer, len, inner of t around axis. */
static void around(const ir_type *t, int axis, int64_t *outer, int64_t *len, int64_t *inner)
{
    *outer = *inner = 1;
    for (int d = 0; d < axis; d++) *outer *= t->dims[d];
    for (int d = axis + 1; d < t->rank; d++) *inner *= t->dims[d];
    *len = t->dims[axis];
}

/* Appends `long long c<d>` coordinates of flat index `e` in t. */
static void coords(cg_text *b, const ir_type *t, const char *e)
{
    cg_put(b, "        long long q_ = %s; (void)q_;\n", e);
    for (int d = t->rank - 1; d >= 0; d--)
        cg_put(b, "        const long long c%d = q_ %% %lldll; q_ /= %lldll; (void)c%d;\n", d, (long long)t->dims[d],
               (long long)t->dims[d], d);
}

/* Appends the flat offset in t of coordinates c<d>, with `at` (C text) along axis. */
static void offset(cg_text *b, const ir_type *t, int axis, const char *at)
{
    int64_t stride = 1;
    cg_put(b, "(0ll");
    for (int d = t->rank - 1; d >= 0; d--) {
        if (d == axis) cg_put(b, " + (%s) * %lldll", at, (long long)stride);
        else cg_put(b, " + c%d * %lldll", d, (long long)stride);
        stride *= t->dims[d];
    }
    cg_put(b, ")");
}

static const char *done(bool ok, cg_text *b, cg_params *ps)
{
    bool oom = b->oom;
    cg_text_free(b);
    al_free(ps->at);
    return ok && !oom ? NULL : "out of memory";
}

/* gather: out[e] = x[e's coordinates with index[e] along axis]; index_select:
 * out[(o, j, i)] = x[(o, index[j], i)]. */
static const char *select_kernel(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name, int axis)
{
    const ir_type *x = &g->nodes[n->in[0]]->type;
    int64_t outer, len, inner;
    around(x, axis, &outer, &len, &inner);
    cg_params ps = {0};
    cg_text b = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0), px = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    int pi = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0), flag = cg_param_of(&ps, CG_PARAM_FLAG, n->id, true, 1);
    if (n->op == IR_OP_gather) {
        cg_put(&b, "        const long long id_ = (long long)p%d[e];\n", pi);
        coords(&b, &n->type, "e");
        cg_put(&b, "        if (id_ < 0 || id_ >= %lldll) { p%d[e] = (%s)0; atomicOr(p%d, 1u); continue; }\n        p%d[e] = p%d[",
               (long long)len, out, cg_storage(n->type.dtype), flag, out, px);
        offset(&b, x, axis, "id_");
        cg_put(&b, "];\n");
    } else {
        int64_t kk = n->type.dims[axis];
        cg_put(&b, "        const long long i_ = e %% %lldll, j_ = e / %lldll %% %lldll, o_ = e / %lldll / %lldll;\n",
               (long long)inner, (long long)inner, (long long)kk, (long long)inner, (long long)kk);
        cg_put(&b, "        const long long id_ = (long long)p%d[j_];\n", pi);
        cg_put(&b, "        if (id_ < 0 || id_ >= %lldll) { p%d[e] = (%s)0; atomicOr(p%d, 1u); continue; }\n",
               (long long)len, out, cg_storage(n->type.dtype), flag);
        cg_put(&b, "        p%d[e] = p%d[(o_ * %lldll + id_) * %lldll + i_];\n", out, px, (long long)len, (long long)inner);
    }
    bool ok = cg_op_kernel(prog, g, k, name, "float", &b, &ps, ir_numel(&n->type), NULL, NULL);
    return done(ok, &b, &ps);
}

/* gather_grad, index_select_grad: a thread per element of dx adds, in dy's
 * order (the CPU's), the elements of dy the forward read from it; f32
 * accumulation (f64 for f64). Threads past dx's elements only check the index. */
static const char *scatter_kernel(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name, int axis)
{
    const ir_type *x = &n->type, *it = &g->nodes[n->in[0]]->type, *dy = &g->nodes[n->in[1]]->type;
    int64_t outer, len, inner, nx = ir_numel(x), ni = ir_numel(it);
    around(x, axis, &outer, &len, &inner);
    bool wide = x->dtype == ALLOY_F64;
    cg_params ps = {0};
    cg_text b = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0), pi = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    int pd = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0), flag = cg_param_of(&ps, CG_PARAM_FLAG, n->id, true, 1);
    char pdn[16];
    al_fmt(pdn, sizeof pdn, "p%d", pd);
    cg_put(&b, "        if (e < %lldll) { const long long id_ = (long long)p%d[e]; if (id_ < 0 || id_ >= %lldll) atomicOr(p%d, 1u); }\n",
           (long long)ni, pi, (long long)len, flag);
    cg_put(&b, "        if (e >= %lldll) continue;\n        T a_ = 0;\n", (long long)nx);
    coords(&b, x, "e");
    if (n->op == IR_OP_gather_grad) { /* the index positions sharing e's other coordinates, along axis in order */
        cg_put(&b, "        if (1");
        for (int d = 0; d < x->rank; d++)
            if (d != axis) cg_put(&b, " && c%d < %lldll", d, (long long)it->dims[d]);
        cg_put(&b, ")\n        for (long long t_ = 0; t_ < %lldll; t_++) {\n            const long long p_ = ", (long long)it->dims[axis]);
        offset(&b, it, axis, "t_");
        cg_put(&b, ";\n            if ((long long)p%d[p_] == c%d) a_ += ", pi, axis);
        cg_load(&b, dy->dtype, pdn, "p_");
        cg_put(&b, ";\n        }\n");
    } else { /* dy [outer, K, inner]: slices j whose index is e's coordinate along axis */
        int64_t kk = dy->dims[axis];
        cg_put(&b, "        const long long i_ = e %% %lldll, r_ = e / %lldll %% %lldll, o_ = e / %lldll / %lldll;\n",
               (long long)inner, (long long)inner, (long long)len, (long long)inner, (long long)len);
        cg_put(&b, "        for (long long j_ = 0; j_ < %lldll; j_++)\n            if ((long long)p%d[j_] == r_) a_ += ", (long long)kk, pi);
        char idx[96];
        al_fmt(idx, sizeof idx, "(o_ * %lldll + j_) * %lldll + i_", (long long)kk, (long long)inner);
        cg_load(&b, dy->dtype, pdn, idx);
        cg_put(&b, ";\n");
    }
    cg_put(&b, "        p%d[e] = ", out);
    cg_store(&b, x->dtype, wide, "a_");
    cg_put(&b, ";\n");
    bool ok = cg_op_kernel(prog, g, k, name, wide ? "double" : "float", &b, &ps, nx > ni ? nx : ni, NULL, NULL);
    return done(ok, &b, &ps);
}

/* arange: start + e * step in double, rounded once (the CPU's cvt_store_f64). */
static const char *arange_kernel(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    cg_params ps = {0};
    cg_text b = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    cg_put(&b, "        const double v_ = ");
    cg_double(&b, ir_attr_f(n, "start"));
    cg_put(&b, " + (double)e * ");
    cg_double(&b, ir_attr_f(n, "step"));
    cg_put(&b, ";\n        p%d[e] = ", out);
    cg_store(&b, n->type.dtype, true, "v_");
    cg_put(&b, ";\n");
    bool ok = cg_op_kernel(prog, g, k, name, "double", &b, &ps, ir_numel(&n->type), NULL, NULL);
    return done(ok, &b, &ps);
}

/* cumsum: a thread per line along axis, summing in order (reverse: from the
 * end) in f32 (f64 for f64 and integers) and storing each prefix, as the CPU. */
static const char *cumsum_kernel(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name, int axis)
{
    const ir_type *t = &n->type;
    int64_t outer, len, inner;
    around(t, axis, &outer, &len, &inner);
    bool wide = t->dtype == ALLOY_F64 || ir_is_int(t->dtype), reverse = ir_attr_i(n, "reverse");
    cg_params ps = {0};
    cg_text b = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0), px = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    char pxn[16];
    al_fmt(pxn, sizeof pxn, "p%d", px);
    cg_put(&b, "        const long long base_ = (e / %lldll) * %lldll + e %% %lldll;\n        T s_ = 0;\n", (long long)inner,
           (long long)(len * inner), (long long)inner);
    cg_put(&b, "        for (long long s = 0; s < %lldll; s++) {\n            const long long at_ = base_ + (%s) * %lldll;\n"
               "            s_ += ",
           (long long)len, reverse ? "LEN_ - 1 - s" : "s", (long long)inner);
    cg_load(&b, t->dtype, pxn, "at_");
    cg_put(&b, ";\n            p%d[at_] = ", out);
    cg_store(&b, t->dtype, wide, "s_");
    cg_put(&b, ";\n        }\n");
    char before[64];
    al_fmt(before, sizeof before, "    const long long LEN_ = %lldll;\n", (long long)len);
    bool ok = cg_op_kernel(prog, g, k, name, wide ? "double" : "float", &b, &ps, outer * inner, NULL, before);
    return done(ok, &b, &ps);
}

const char *cg_emit_index(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    int axis = 0;
    if (ir_attr_schema(n->op, "axis")) {
        const ir_type *t = n->op == IR_OP_gather || n->op == IR_OP_index_select ? &g->nodes[n->in[0]]->type : &n->type;
        ir_norm_axis(ir_attr_i(n, "axis"), t->rank, &axis);
    }
    switch (n->op) {
    case IR_OP_gather:
    case IR_OP_index_select: return select_kernel(prog, g, k, n, name, axis);
    case IR_OP_gather_grad:
    case IR_OP_index_select_grad: return scatter_kernel(prog, g, k, n, name, axis);
    case IR_OP_arange: return arange_kernel(prog, g, k, n, name);
    case IR_OP_cumsum: return cumsum_kernel(prog, g, k, n, name, axis);
    default: return "no kernel yet for this op";
    }
}
