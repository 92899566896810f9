/* emit_attention.c - FlashAttention-style kernels for attention and attention_grad (SIMT FMA, f32 statistics): key/value tiles in shared memory, a thread per query row (or key row in the backward) with its accumulators in registers, never a score matrix in memory. f16/bf16 at head dims 16, 32, ..., 128 go to the tensor-core kernels instead (emit_attention_mma.c, emit_attention_mma_grad.c). */
#include <stdint.h>

#include "codegen/emit_impl.h"

/* Query rows per block (a thread each) and key rows per shared tile (half
 * for f64, so two tiles stay within 48 KiB of shared memory at head_dim
 * 128); the widest head_dim the register arrays take. */
enum { ATT_ROWS = 64, ATT_TILE = 32, ATT_MAX_D = 128 };

/* What both kernels of a step know: shapes, attributes, parameters. */
typedef struct att {
    const ir_graph *g;
    const ir_node *n;
    int64_t BH, T, S, D;
    bool causal, wide;
    double scale;
    alloy_dtype dt;
    attn_strides st; /* the operands' layouts */
} att;

/* Appends `#define NAME(i) <load of parameter p at i>` in the compute type. */
static void load_macro(cg_text *t, const att *a, const char *name, int p)
{
    char pn[16];
    al_fmt(pn, sizeof pn, "p%d", p);
    cg_put(t, "#define %s(i_) ", name);
    cg_load(t, a->dt, pn, "(i_)");
    cg_put(t, "\n");
}

/* The kernel's opening: preamble, signature, the compute type T and the
 * problem's constants (the causal limit of row i: keys [0, LIM(i))). */
static void open_kernel(cg_text *t, const att *a, const char *name, const cg_params *ps, unsigned block)
{
    cg_put_preamble(t);
    cg_put(t, "\nextern \"C\" __global__ void __launch_bounds__(%u) %s(", block, name);
    cg_param_list(t, a->g, ps);
    cg_put(t, ")\n{\n    typedef %s T;\n", a->wide ? "double" : "float");
    cg_put(t, "    const long long BH_ = %lldll, T_ = %lldll, S_ = %lldll; (void)BH_;\n    enum { D_ = %lld, TILE_ = %d };\n",
           (long long)a->BH, (long long)a->T, (long long)a->S, (long long)a->D, a->wide ? ATT_TILE / 2 : ATT_TILE);
    cg_put(t, "    const T scale_ = (T)");
    cg_double(t, a->scale);
    cg_put(t, ";\n");
    if (a->causal)
        cg_put(t, "#define LIM_(i) ((i) + S_ - T_ + 1 < 0 ? 0ll : (i) + S_ - T_ + 1 > S_ ? S_ : (i) + S_ - T_ + 1)\n");
    else
        cg_put(t, "#define LIM_(i) S_\n");
    cg_attention_strides(t, &a->st);
}

/* The kernel in t (parameters ps) added to prog, units threads in blocks of
 * ATT_ROWS, moving bytes; t and ps freed. NULL, or "out of memory". */
static const char *add(cg_program *prog, const att *a, int k, const char *name, cg_text *t, cg_params *ps,
                       int64_t units, int64_t bytes)
{
    int64_t blocks = (units + ATT_ROWS - 1) / ATT_ROWS;
    unsigned grid = (unsigned)(blocks < 1 ? 1 : blocks > CG_MAX_GRID ? CG_MAX_GRID : blocks);
    bool ok = !t->oom && cg_add_kernel(prog, a->g, name, k, STEP_KIND_OP, t, ps, grid, ATT_ROWS, bytes);
    cg_text_free(t);
    al_free(ps->at);
    return ok ? NULL : "out of memory";
}

/* Loads tile [j0, j0 + TILE) of two tensors into shared arrays SA, SB
 * (zeros past LEN_) between barriers: macro XA loads the first at BA +
 * row * RA + column, XB the second at BB + row * RB + column. */
static void load_tile(cg_text *t, const char *xa, const char *ba, const char *ra, const char *sa, const char *xb,
                      const char *bb, const char *rb, const char *sb)
{
    cg_put(t, "            __syncthreads();\n"
              "            for (int e_ = threadIdx.x; e_ < TILE_ * D_; e_ += blockDim.x) {\n"
              "                const long long j_ = j0_ + e_ / D_;\n"
              "                %s[e_] = j_ < LEN_ ? %s(%s + j_ * %s + e_ %% D_) : (T)0;\n"
              "                %s[e_] = j_ < LEN_ ? %s(%s + j_ * %s + e_ %% D_) : (T)0;\n"
              "            }\n            __syncthreads();\n",
           sa, xa, ba, ra, sb, xb, bb, rb);
}

/* attention: a thread per query row keeps q, the running max m, sum l and
 * the output accumulator; per key tile it computes the tile's scores into
 * registers, rescales by exp(m_old - m_new) once and adds p v. */
static const char *forward(cg_program *prog, const att *a, int k, const char *name)
{
    const ir_node *n = a->n;
    cg_params ps = {0};
    cg_text t = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int pq = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0), pk = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0),
        pv = cg_param_of(&ps, CG_PARAM_NODE, n->in[2], false, 0);
    open_kernel(&t, a, name, &ps, ATT_ROWS);
    load_macro(&t, a, "LQ_", pq), load_macro(&t, a, "LK_", pk), load_macro(&t, a, "LV_", pv);
    cg_put(&t, "    __shared__ T ks_[TILE_ * D_], vs_[TILE_ * D_];\n"
               "    const long long LEN_ = S_, nb_ = (T_ + %d - 1) / %d;\n"
               "    for (long long blk_ = blockIdx.x; blk_ < BH_ * nb_; blk_ += gridDim.x) {\n"
               "        const long long bh_ = blk_ / nb_, i0_ = (blk_ %% nb_) * %d, i_ = i0_ + threadIdx.x;\n"
               "        const bool row_ = i_ < T_;\n"
               "        const long long ko_ = KOFF_(bh_), vo_ = VOFF_(bh_), qo_ = QOFF_(bh_) + i_ * QROW_;\n"
               "        const long long last_ = i0_ + %d - 1 < T_ - 1 ? i0_ + %d - 1 : T_ - 1;\n"
               "        const long long lim_ = row_ ? LIM_(i_) : 0, blim_ = LIM_(last_);\n"
               "        T q_[D_], a_[D_], s_[TILE_], m_ = -ALLOY_INF, l_ = 0;\n"
               "        for (int d = 0; d < D_; d++) { q_[d] = row_ ? LQ_(qo_ + d) : (T)0; a_[d] = 0; }\n"
               "        for (long long j0_ = 0; j0_ < blim_; j0_ += TILE_) {\n",
           ATT_ROWS, ATT_ROWS, ATT_ROWS, ATT_ROWS, ATT_ROWS);
    load_tile(&t, "LK_", "ko_", "KROW_", "ks_", "LV_", "vo_", "VROW_", "vs_");
    cg_put(&t, "            T mt_ = m_;\n"
               "            for (int c = 0; c < TILE_; c++) {\n"
               "                T sc_ = -ALLOY_INF;\n"
               "                if (j0_ + c < lim_) {\n"
               "                    T acc_ = 0;\n"
               "                    for (int d = 0; d < D_; d++) acc_ += q_[d] * ks_[c * D_ + d];\n"
               "                    sc_ = acc_ * scale_;\n"
               "                }\n"
               "                s_[c] = sc_;\n"
               "                if (sc_ > mt_) mt_ = sc_;\n"
               "            }\n"
               "            if (mt_ == -ALLOY_INF) continue;\n"
               "            const T corr_ = m_ == -ALLOY_INF ? (T)0 : exp(m_ - mt_);\n"
               "            l_ *= corr_;\n"
               "            for (int d = 0; d < D_; d++) a_[d] *= corr_;\n"
               "            for (int c = 0; c < TILE_; c++) {\n"
               "                if (j0_ + c >= lim_) continue;\n"
               "                const T p_ = exp(s_[c] - mt_);\n"
               "                l_ += p_;\n"
               "                for (int d = 0; d < D_; d++) a_[d] += p_ * vs_[c * D_ + d];\n"
               "            }\n"
               "            m_ = mt_;\n"
               "        }\n"
               "        if (row_)\n"
               "            for (int d = 0; d < D_; d++) p%d[OOFF_(bh_) + i_ * OROW_ + d] = ",
           out);
    cg_store(&t, a->dt, a->wide, "l_ > 0 ? a_[d] / l_ : (T)0");
    cg_put(&t, ";\n    }\n#undef LQ_\n#undef LK_\n#undef LV_\n#undef LIM_\n");
    cg_attention_strides_end(&t);
    cg_put(&t, "}\n");
    int64_t bytes = (int64_t)(ir_nbytes(&n->type) * 2 + 2 * ir_nbytes(&a->g->nodes[n->in[1]]->type));
    return add(prog, a, k, name, &t, &ps, a->BH * ((a->T + ATT_ROWS - 1) / ATT_ROWS) * ATT_ROWS, bytes);
}

/* attention_grad, kernel 1: a thread per query row. One pass over the key
 * tiles gives the row's logsumexp, a second dq = scale sum_j P (do.v_j -
 * delta) k_j; lse and delta = do.o go to the rows buffer for kernel 2. */
static const char *backward_rows(cg_program *prog, const att *a, int k, const char *name)
{
    const ir_node *n = a->n;
    cg_params ps = {0};
    cg_text t = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int pq = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0), pk = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0),
        pv = cg_param_of(&ps, CG_PARAM_NODE, n->in[2], false, 0), po = cg_param_of(&ps, CG_PARAM_NODE, n->in[3], false, 0),
        pd = cg_param_of(&ps, CG_PARAM_NODE, n->in[4], false, 0);
    int rows = cg_param_of(&ps, CG_PARAM_ROWS, n->id, true, 2 * a->BH * a->T);
    open_kernel(&t, a, name, &ps, ATT_ROWS);
    load_macro(&t, a, "LQ_", pq), load_macro(&t, a, "LK_", pk), load_macro(&t, a, "LV_", pv);
    load_macro(&t, a, "LO_", po), load_macro(&t, a, "LD_", pd);
    cg_put(&t, "    __shared__ T ks_[TILE_ * D_], vs_[TILE_ * D_];\n"
               "    const long long LEN_ = S_, nb_ = (T_ + %d - 1) / %d;\n"
               "    for (long long blk_ = blockIdx.x; blk_ < BH_ * nb_; blk_ += gridDim.x) {\n"
               "        const long long bh_ = blk_ / nb_, i0_ = (blk_ %% nb_) * %d, i_ = i0_ + threadIdx.x;\n"
               "        const bool row_ = i_ < T_;\n"
               "        const long long ko_ = KOFF_(bh_), vo_ = VOFF_(bh_), qo_ = QOFF_(bh_) + i_ * QROW_;\n"
               "        const long long dd_ = DOOFF_(bh_) + i_ * DOROW_, oo_ = OOFF_(bh_) + i_ * OROW_;\n"
               "        const long long last_ = i0_ + %d - 1 < T_ - 1 ? i0_ + %d - 1 : T_ - 1;\n"
               "        const long long lim_ = row_ ? LIM_(i_) : 0, blim_ = LIM_(last_);\n"
               "        T q_[D_], do_[D_], g_[D_], m_ = -ALLOY_INF, l_ = 0, delta_ = 0;\n"
               "        for (int d = 0; d < D_; d++) {\n"
               "            q_[d] = row_ ? LQ_(qo_ + d) : (T)0; do_[d] = row_ ? LD_(dd_ + d) : (T)0; g_[d] = 0;\n"
               "            delta_ += do_[d] * (row_ ? LO_(oo_ + d) : (T)0);\n"
               "        }\n"
               "        for (long long j0_ = 0; j0_ < blim_; j0_ += TILE_) {\n",
           ATT_ROWS, ATT_ROWS, ATT_ROWS, ATT_ROWS, ATT_ROWS);
    load_tile(&t, "LK_", "ko_", "KROW_", "ks_", "LV_", "vo_", "VROW_", "vs_");
    cg_put(&t, "            for (int c = 0; c < TILE_ && j0_ + c < lim_; c++) {\n"
               "                T acc_ = 0;\n"
               "                for (int d = 0; d < D_; d++) acc_ += q_[d] * ks_[c * D_ + d];\n"
               "                const T sc_ = acc_ * scale_;\n"
               "                if (sc_ > m_) { l_ = l_ * exp(m_ - sc_) + (T)1; m_ = sc_; }\n"
               "                else l_ += exp(sc_ - m_);\n"
               "            }\n"
               "        }\n"
               "        const T lse_ = l_ > 0 ? m_ + log(l_) : -ALLOY_INF;\n"
               "        if (row_) { p%d[LSEOFF_(bh_) + i_ * LSEROW_] = lse_; p%d[BH_ * T_ + LSEOFF_(bh_) + i_ * LSEROW_] = delta_; }\n"
               "        for (long long j0_ = 0; j0_ < blim_; j0_ += TILE_) {\n",
           rows, rows);
    load_tile(&t, "LK_", "ko_", "KROW_", "ks_", "LV_", "vo_", "VROW_", "vs_");
    cg_put(&t, "            if (lse_ == -ALLOY_INF) continue;\n"
               "            for (int c = 0; c < TILE_ && j0_ + c < lim_; c++) {\n"
               "                T acc_ = 0, dp_ = 0;\n"
               "                for (int d = 0; d < D_; d++) { acc_ += q_[d] * ks_[c * D_ + d]; dp_ += do_[d] * vs_[c * D_ + d]; }\n"
               "                const T p_ = exp(acc_ * scale_ - lse_), ds_ = p_ * (dp_ - delta_) * scale_;\n"
               "                for (int d = 0; d < D_; d++) g_[d] += ds_ * ks_[c * D_ + d];\n"
               "            }\n"
               "        }\n"
               "        if (row_)\n"
               "            for (int d = 0; d < D_; d++) p%d[DQOFF_(bh_) + i_ * DQROW_ + d] = ",
           out);
    cg_store(&t, a->dt, a->wide, "g_[d]");
    cg_put(&t, ";\n    }\n#undef LQ_\n#undef LK_\n#undef LV_\n#undef LO_\n#undef LD_\n#undef LIM_\n");
    cg_attention_strides_end(&t);
    cg_put(&t, "}\n");
    int64_t bytes = (int64_t)(4 * ir_nbytes(&a->g->nodes[n->in[0]]->type) + 4 * ir_nbytes(&a->g->nodes[n->in[1]]->type));
    return add(prog, a, k, name, &t, &ps, a->BH * ((a->T + ATT_ROWS - 1) / ATT_ROWS) * ATT_ROWS, bytes);
}

/* attention_grad, kernel 2: a thread per key row j keeps k_j, v_j and its
 * dk, dv; query tiles (q and do) pass through shared memory, and for each
 * query i that sees j: P = exp(scale q.k_j - lse_i), dv += P do_i,
 * dk += scale P (do_i.v_j - delta_i) q_i. */
static const char *backward_cols(cg_program *prog, const att *a, int k, const char *name)
{
    const ir_node *n = a->n;
    cg_params ps = {0};
    cg_text t = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int pq = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0), pk = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0),
        pv = cg_param_of(&ps, CG_PARAM_NODE, n->in[2], false, 0), pd = cg_param_of(&ps, CG_PARAM_NODE, n->in[4], false, 0);
    int rows = cg_param_of(&ps, CG_PARAM_ROWS, n->id, false, 2 * a->BH * a->T);
    open_kernel(&t, a, name, &ps, ATT_ROWS);
    load_macro(&t, a, "LQ_", pq), load_macro(&t, a, "LK_", pk), load_macro(&t, a, "LV_", pv), load_macro(&t, a, "LD_", pd);
    /* query i sees key j when j < LIM_(i): i >= FIRST_(j) */
    cg_put(&t, "    __shared__ T qs_[TILE_ * D_], ds_[TILE_ * D_];\n"
               "    const long long LEN_ = T_, nb_ = (S_ + %d - 1) / %d;\n"
               "    for (long long blk_ = blockIdx.x; blk_ < BH_ * nb_; blk_ += gridDim.x) {\n"
               "        const long long bh_ = blk_ / nb_, j_ = (blk_ %% nb_) * %d + threadIdx.x;\n"
               "        const bool col_ = j_ < S_;\n"
               "        const long long ko_ = KOFF_(bh_) + j_ * KROW_, vo_ = VOFF_(bh_) + j_ * VROW_;\n"
               "        const long long qb_ = QOFF_(bh_), db_ = DOOFF_(bh_);\n"
               "        const long long jmin_ = (blk_ %% nb_) * %d;\n"
               "        long long start_ = %s;\n"
               "        if (start_ < 0) start_ = 0;\n"
               "        start_ -= start_ %% TILE_;\n"
               "        T k_[D_], v_[D_], dk_[D_], dv_[D_];\n"
               "        for (int d = 0; d < D_; d++) {\n"
               "            k_[d] = col_ ? LK_(ko_ + d) : (T)0; v_[d] = col_ ? LV_(vo_ + d) : (T)0; dk_[d] = 0; dv_[d] = 0;\n"
               "        }\n"
               "        for (long long j0_ = start_; j0_ < T_; j0_ += TILE_) {\n",
           ATT_ROWS, ATT_ROWS, ATT_ROWS, ATT_ROWS, a->causal ? "jmin_ - (S_ - T_)" : "0");
    load_tile(&t, "LQ_", "qb_", "QROW_", "qs_", "LD_", "db_", "DOROW_", "ds_");
    cg_put(&t, "            if (!col_) continue;\n"
               "            for (int c = 0; c < TILE_ && j0_ + c < T_; c++) {\n"
               "                const long long i_ = j0_ + c;\n"
               "                if (j_ >= LIM_(i_)) continue;\n"
               "                const T lse_ = p%d[LSEOFF_(bh_) + i_ * LSEROW_], delta_ = p%d[BH_ * T_ + LSEOFF_(bh_) + i_ * LSEROW_];\n"
               "                if (lse_ == -ALLOY_INF) continue;\n"
               "                T acc_ = 0, dp_ = 0;\n"
               "                for (int d = 0; d < D_; d++) { acc_ += qs_[c * D_ + d] * k_[d]; dp_ += ds_[c * D_ + d] * v_[d]; }\n"
               "                const T p_ = exp(acc_ * scale_ - lse_), g_ = p_ * (dp_ - delta_) * scale_;\n"
               "                for (int d = 0; d < D_; d++) { dv_[d] += p_ * ds_[c * D_ + d]; dk_[d] += g_ * qs_[c * D_ + d]; }\n"
               "            }\n"
               "        }\n"
               "        if (col_) {\n"
               "            const long long ok_ = DKOFF_(bh_) + j_ * DKROW_, ov_ = DVOFF_(bh_) + j_ * DVROW_;\n"
               "            for (int d = 0; d < D_; d++) {\n"
               "                p%d[ok_ + d] = ",
           rows, rows, out);
    cg_store(&t, a->dt, a->wide, "dk_[d]");
    cg_put(&t, ";\n                p%d[ov_ + d] = ", out);
    cg_store(&t, a->dt, a->wide, "dv_[d]");
    cg_put(&t, ";\n            }\n        }\n    }\n#undef LQ_\n#undef LK_\n#undef LV_\n#undef LD_\n#undef LIM_\n");
    cg_attention_strides_end(&t);
    cg_put(&t, "}\n");
    int64_t bytes = (int64_t)(2 * ir_nbytes(&a->g->nodes[n->in[0]]->type) + 4 * ir_nbytes(&a->g->nodes[n->in[1]]->type));
    return add(prog, a, k, name, &t, &ps, a->BH * ((a->S + ATT_ROWS - 1) / ATT_ROWS) * ATT_ROWS, bytes);
}

/* A result over no query, key or feature: zeros (dk and dv of T = 0), one
 * thread per element. */
static const char *zeros(cg_program *prog, const att *a, int k, const char *name)
{
    cg_params ps = {0};
    cg_text t = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, a->n->id, true, 0);
    int64_t count = ir_numel(&a->n->type);
    cg_put_preamble(&t);
    cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", ATT_ROWS, name);
    cg_param_list(&t, a->g, &ps);
    cg_put(&t, ")\n{\n    typedef float T;\n    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < %lldll;"
               " e += (long long)gridDim.x * blockDim.x) p%d[e] = ", (long long)count, out);
    cg_store(&t, a->dt, false, "(T)0");
    cg_put(&t, ";\n}\n");
    return add(prog, a, k, name, &t, &ps, count, (int64_t)ir_nbytes(&a->n->type));
}

const char *cg_emit_attention(cg_program *prog, const ir_graph *g, const schedule *s, int k)
{
    const ir_node *n = g->nodes[s->steps[k].pos];
    const ir_type *q = &g->nodes[n->in[0]]->type;
    att a = {g, n, q->dims[0] * q->dims[1], q->dims[2], g->nodes[n->in[1]]->type.dims[2], q->dims[3],
             ir_attr_i(n, "causal") != 0, q->dtype == ALLOY_F64, ir_attr_f(n, "scale"), q->dtype, {0}};
    if (a.D > ATT_MAX_D) return "attention with head_dim over 128: no kernel yet";
    if (a.T > INT32_MAX - 128 || a.S > INT32_MAX - 128) /* the kernels take a row index for an int */
        return "attention with 2^31 - 128 rows or more: no kernel";
    char name[48];
    al_fmt(name, sizeof name, "alloy_s%d_%s", k, ir_ops[n->op].name);
    if (a.BH == 0 || a.T == 0 || a.S == 0 || a.D == 0) return zeros(prog, &a, k, name);
    attn_strides_of(g, s, n, &a.st);
    if (n->op == IR_OP_attention)
        return cg_attention_mma_takes(a.dt, a.D) ? cg_emit_attention_mma(prog, g, n, k, name, &a.st) : forward(prog, &a, k, name);
    if (cg_attention_mma_takes(a.dt, a.D)) return cg_emit_attention_grad_mma(prog, g, n, k, &a.st);
    const char *why = backward_rows(prog, &a, k, name);
    if (why) return why;
    al_fmt(name, sizeof name, "alloy_s%d_%s_keys", k, ir_ops[n->op].name);
    return backward_cols(prog, &a, k, name);
}
