/* emit_attention_mma_grad.c - attention_grad for f16 and bf16 on tensor cores, FlashAttention-2's backward: a row pass (logsumexp, delta = do.o, the f32 dq accumulator zeroed), one kernel over key blocks (S, dP, dV, dK and dQ: five products per tile, dQ added into f32 with atomics), and dq rounded from its accumulator. */
#include "codegen/emit_impl.h"

/* Loads this lane's A fragments of rows r0_ and r1_ (rows >= LEN_ zero) of
 * the matrix at BASE (ROW elements between rows) into NAME[KS_][4]. */
static void load_a(cg_text *t, const char *name, const char *base, const char *row)
{
    cg_put(t,
           "        unsigned %s[KS_][4];\n"
           "#pragma unroll\n"
           "        for (int kk = 0; kk < KS_; kk++) {\n"
           "            const int c_ = kk * 16 + 2 * t4_;\n"
           "            %s[kk][0] = r0_ < LEN_ ? *(const unsigned *)(%s + r0_ * %s + c_) : 0u;\n"
           "            %s[kk][1] = r1_ < LEN_ ? *(const unsigned *)(%s + r1_ * %s + c_) : 0u;\n"
           "            %s[kk][2] = r0_ < LEN_ ? *(const unsigned *)(%s + r0_ * %s + c_ + 8) : 0u;\n"
           "            %s[kk][3] = r1_ < LEN_ ? *(const unsigned *)(%s + r1_ * %s + c_ + 8) : 0u;\n"
           "        }\n",
           name, name, base, row, name, base, row, name, base, row, name, base, row);
}

/* Copies rows [x0_, x0_ + TILE_) of two matrices of LEN2_ rows (GA and GB,
 * RA and RB elements between rows) into shared tiles A and B (rows padded
 * to PS_, zeros past LEN2_) after a barrier, by 16-byte cp.async copies
 * that the thread waits for (the caller's next barrier publishes them). */
static void load_tiles(cg_text *t, const char *a, const char *ga, const char *ra, const char *b, const char *gb,
                       const char *rb)
{
    cg_put(t,
           "            __syncthreads();\n"
           "            for (int e_ = threadIdx.x; e_ < TILE_ * (D_ / 8); e_ += blockDim.x) {\n"
           "                const int r_ = e_ / (D_ / 8), c_ = e_ %% (D_ / 8) * 8;\n"
           "                const long long x_ = x0_ + r_;\n"
           "                if (x_ < LEN2_) {\n"
           "                    alloy_cp_async_16(%s + r_ * PS_ + c_, %s + x_ * %s + c_);\n"
           "                    alloy_cp_async_16(%s + r_ * PS_ + c_, %s + x_ * %s + c_);\n"
           "                } else {\n"
           "                    *(alloy_b128 *)(%s + r_ * PS_ + c_) = alloy_b128{0, 0};\n"
           "                    *(alloy_b128 *)(%s + r_ * PS_ + c_) = alloy_b128{0, 0};\n"
           "                }\n"
           "            }\n"
           "            alloy_cp_async_commit();\n"
           "            alloy_cp_async_wait_all();\n",
           a, ga, ra, b, gb, rb, a, b);
}

/* C[NT_][4] (declared by the caller) = A B^T over a 16 x D_ A in registers
 * (AF[KS_][4]) and the tile's 64 rows of B in shared memory (SH): 8 n-tiles
 * of 8 rows, the B fragments of two n-tiles per ldmatrix.x4 (lanes 8m..8m+7
 * give the rows of matrix m: n-tile np + m / 2, columns + 8 (m % 2)). */
static void product_nt(cg_text *t, const char *c, const char *af, const char *sh)
{
    cg_put(t,
           "#pragma unroll\n"
           "            for (int np = 0; np < NT_; np += 2) {\n"
           "#pragma unroll\n"
           "                for (int h = 0; h < 8; h++) %s[np + h / 4][h %% 4] = 0.f;\n"
           "#pragma unroll\n"
           "                for (int kk = 0; kk < KS_; kk++) {\n"
           "                    unsigned bf_[4];\n"
           "                    alloy_ldmatrix_x4(bf_, %s + ((np + (lane_ >> 4)) * 8 + (lane_ & 7)) * PS_ + kk * 16 + ((lane_ >> 3) & 1) * 8);\n"
           "#pragma unroll\n"
           "                    for (int h = 0; h < 2; h++) MMA_(%s[np + h], %s[kk], bf_ + 2 * h);\n"
           "                }\n"
           "            }\n",
           c, sh, c, af);
}

/* ACC[DN_][4] += X B over the tile: X [16, TILE_] given per n-tile pair as
 * f32 C fragments (X_[NT_][4], rounded here to the dtype: the C fragments of
 * n-tiles 2kk and 2kk + 1 are the A fragment of k-block kk), B the tile's
 * [TILE_, D_] rows in shared memory (SH), its B fragments of two column
 * tiles per ldmatrix.x4.trans (matrix m: rows + 8 (m % 2), column tile dn +
 * m / 2). */
static void product_acc(cg_text *t, const char *acc, const char *x, const char *sh)
{
    cg_put(t,
           "#pragma unroll\n"
           "            for (int kk = 0; kk < TILE_ / 16; kk++) {\n"
           "                unsigned xa_[4];\n"
           "#pragma unroll\n"
           "                for (int h = 0; h < 4; h++) {\n"
           "                    const float *xv_ = %s[2 * kk + h / 2] + (h & 1) * 2;\n"
           "                    xa_[h] = (unsigned)TO_(xv_[0]) | (unsigned)TO_(xv_[1]) << 16;\n"
           "                }\n"
           "#pragma unroll\n"
           "                for (int dn = 0; dn < DN_; dn += 2) {\n"
           "                    unsigned bf_[4];\n"
           "                    alloy_ldmatrix_x4_trans(bf_, %s + (kk * 16 + ((lane_ >> 3) & 1) * 8 + (lane_ & 7)) * PS_ + (dn + (lane_ >> 4)) * 8);\n"
           "#pragma unroll\n"
           "                    for (int h = 0; h < 2; h++) MMA_(%s[dn + h], xa_, bf_ + 2 * h);\n"
           "                }\n"
           "            }\n",
           x, sh, acc);
}

/* Stores ACC[DN_][4] * MUL for rows r0_, r1_ (< LEN_) of the matrix at BASE (ROW elements between rows). */
static void store_acc(cg_text *t, const char *acc, const char *base, const char *row, const char *mul)
{
    cg_put(t,
           "#pragma unroll\n"
           "        for (int dn = 0; dn < DN_; dn++) {\n"
           "            const int c_ = dn * 8 + 2 * t4_;\n"
           "            if (r0_ < LEN_)\n"
           "                *(unsigned *)(%s + r0_ * %s + c_) = (unsigned)TO_(%s[dn][0] * %s) | (unsigned)TO_(%s[dn][1] * %s) << 16;\n"
           "            if (r1_ < LEN_)\n"
           "                *(unsigned *)(%s + r1_ * %s + c_) = (unsigned)TO_(%s[dn][2] * %s) | (unsigned)TO_(%s[dn][3] * %s) << 16;\n"
           "        }\n",
           base, row, acc, mul, acc, mul, base, row, acc, mul, acc, mul);
}

static void zero_acc(cg_text *t, const char *acc)
{
    cg_put(t,
           "        float %s[DN_][4];\n"
           "#pragma unroll\n"
           "        for (int dn = 0; dn < DN_; dn++) %s[dn][0] = %s[dn][1] = %s[dn][2] = %s[dn][3] = 0.f;\n",
           acc, acc, acc, acc, acc);
}

/* Whether more than one key block (64 keys) adds to each query's dq, so
 * that they add into an f32 accumulator with atomics and a third kernel
 * rounds it; with one (S <= 64) the key kernel stores dq itself. */
static bool dq_accumulates(const ir_graph *g, const ir_node *n)
{
    return g->nodes[n->in[1]]->type.dims[2] > 64;
}

/* The step's scratch (a CG_PARAM_ROWS slot of the node, f32): each row's
 * logsumexp (log2 units) at LSEOFF_(bh), its delta = do.o BH_ T_ further on,
 * then (dq_accumulates) the [BH_, T_, D_] dq accumulator. */
static int64_t scratch_words(const ir_graph *g, const ir_node *n)
{
    const ir_type *q = &g->nodes[n->in[0]]->type;
    return 2 * q->dims[0] * q->dims[1] * q->dims[2] + (dq_accumulates(g, n) ? ir_numel(q) : 0);
}

/* Whether attention_grad n's o is the output of the attention forward of
 * the same q, k, v and attributes, whose kernel keeps the rows' logsumexp
 * (a CG_PARAM_KEPT slot of that node): then the backward reads it instead of
 * recomputing it. */
static bool forward_kept(const ir_graph *g, const ir_node *n)
{
    const ir_node *f = g->nodes[n->in[3]];
    return f->op == IR_OP_attention && f->nin == 3 && f->in[0] == n->in[0] && f->in[1] == n->in[1] &&
           f->in[2] == n->in[2] && ir_attr_i(f, "causal") == ir_attr_i(n, "causal") &&
           ir_attr_f(f, "scale") == ir_attr_f(n, "scale");
}

/* Kernel 1, a warp per 16 query rows: delta = do.o to the scratch and the
 * rows' dq accumulator zeroed for kernel 2's atomics; and, unless the
 * forward kept it (KEPT), each row's logsumexp from one pass over the key
 * tiles with the forward's online max and sum (one product, S = Q K^T). */
static const char *rows_kernel(cg_program *prog, const ir_graph *g, const ir_node *n, int k, const char *name, bool kept,
                               const attn_strides *st)
{
    cg_params ps = {0};
    cg_text t = {0};
    int po = cg_param_of(&ps, CG_PARAM_NODE, n->in[3], false, 0), pd = cg_param_of(&ps, CG_PARAM_NODE, n->in[4], false, 0);
    int pq = kept ? 0 : cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    int pk = kept ? 0 : cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0);
    const ir_type *qt = &g->nodes[n->in[0]]->type;
    int64_t T = qt->dims[2];
    int rows = cg_param_of(&ps, CG_PARAM_ROWS, n->id, true, scratch_words(g, n));
    cg_attention_mma_open(&t, g, n, &ps, name, st);
    if (!kept)
        cg_put(&t, "    __shared__ alloy_b128 kb_[TILE_ * PS_ / 8];\n"
                   "    unsigned short *ks_ = (unsigned short *)kb_;\n");
    cg_put(&t, "    const int warp_ = threadIdx.x >> 5, lane_ = threadIdx.x & 31, g_ = lane_ >> 2, t4_ = lane_ & 3;\n"
               "    const long long nb_ = (T_ + ROWS_ - 1) / ROWS_, LEN_ = T_, LEN2_ = S_;\n"
               "    float *lse_ = p%d, *delta_ = p%d + BH_ * T_, *dqa_ = p%d + 2 * BH_ * T_;\n"
               "    for (long long blk_ = blockIdx.x; blk_ < BH_ * nb_; blk_ += gridDim.x) {\n"
               "        const long long bh_ = blk_ / nb_, i0_ = (blk_ %% nb_) * ROWS_, w0_ = i0_ + warp_ * 16;\n"
               "        const long long r0_ = w0_ + g_, r1_ = r0_ + 8;\n"
               "        const long long last_ = i0_ + ROWS_ - 1 < T_ - 1 ? i0_ + ROWS_ - 1 : T_ - 1;\n"
               "        const long long wlast_ = w0_ + 15 < T_ - 1 ? w0_ + 15 : T_ - 1;\n"
               "        const long long blim_ = LIM_(last_), wlim_ = w0_ < T_ ? LIM_(wlast_) : 0;\n"
               "        const long long lim0_ = r0_ < T_ ? LIM_(r0_) : 0, lim1_ = r1_ < T_ ? LIM_(r1_) : 0;\n"
               "        const unsigned short *do_ = p%d + DOOFF_(bh_), *o_ = p%d + OOFF_(bh_);\n"
               "%s",
           rows, rows, rows, pd, po,
           dq_accumulates(g, n) ? "        for (int c_ = t4_; c_ < D_; c_ += 4) {\n"
                                  "            if (r0_ < T_) dqa_[(bh_ * T_ + r0_) * D_ + c_] = 0.f;\n"
                                  "            if (r1_ < T_) dqa_[(bh_ * T_ + r1_) * D_ + c_] = 0.f;\n"
                                  "        }\n"
                                : "        (void)dqa_;\n");
    if (!kept) {
        cg_put(&t, "        const unsigned short *q_ = p%d + QOFF_(bh_), *k_ = p%d + KOFF_(bh_);\n", pq, pk);
        load_a(&t, "qa_", "q_", "QROW_");
    }
    /* delta over the lane's 4 columns per k-block, then the group's 4 lanes */
    cg_put(&t, "        float d0_ = 0.f, d1_ = 0.f;\n"
               "#pragma unroll\n"
               "        for (int kk = 0; kk < KS_; kk++)\n"
               "#pragma unroll\n"
               "            for (int h = 0; h < 4; h++) {\n"
               "                const long long r_ = h & 1 ? r1_ : r0_;\n"
               "                if (r_ >= T_) continue;\n"
               "                const int c_ = kk * 16 + 2 * t4_ + (h >> 1) * 8;\n"
               "                const float x_ = FROM_(do_[r_ * DOROW_ + c_]) * FROM_(o_[r_ * OROW_ + c_]) +\n"
               "                                 FROM_(do_[r_ * DOROW_ + c_ + 1]) * FROM_(o_[r_ * OROW_ + c_ + 1]);\n"
               "                if (h & 1) d1_ += x_; else d0_ += x_;\n"
               "            }\n"
               "        d0_ += __shfl_xor_sync(0xffffffffu, d0_, 1);\n"
               "        d0_ += __shfl_xor_sync(0xffffffffu, d0_, 2);\n"
               "        d1_ += __shfl_xor_sync(0xffffffffu, d1_, 1);\n"
               "        d1_ += __shfl_xor_sync(0xffffffffu, d1_, 2);\n"
               "        if (t4_ == 0 && r0_ < T_) delta_[bh_ * T_ + r0_] = d0_;\n"
               "        if (t4_ == 0 && r1_ < T_) delta_[bh_ * T_ + r1_] = d1_;\n");
    if (kept) {
        cg_put(&t, "        (void)lse_, (void)blim_, (void)wlim_, (void)lim0_, (void)lim1_;\n"
                   "    }\n");
    } else {
        cg_put(&t, "        float m0_ = -ALLOY_INF, m1_ = -ALLOY_INF, l0_ = 0.f, l1_ = 0.f;\n"
               "        for (long long x0_ = 0; x0_ < blim_; x0_ += TILE_) {\n"
               "            __syncthreads();\n"
               "            for (int e_ = threadIdx.x; e_ < TILE_ * (D_ / 8); e_ += blockDim.x) {\n"
               "                const int r_ = e_ / (D_ / 8), c_ = e_ %% (D_ / 8) * 8;\n"
               "                const long long x_ = x0_ + r_;\n"
               "                if (x_ < S_) alloy_cp_async_16(ks_ + r_ * PS_ + c_, k_ + x_ * KROW_ + c_);\n"
               "                else *(alloy_b128 *)(ks_ + r_ * PS_ + c_) = alloy_b128{0, 0};\n"
               "            }\n"
               "            alloy_cp_async_commit();\n"
               "            alloy_cp_async_wait_all();\n"
               "            __syncthreads();\n"
               "            if (x0_ >= wlim_) continue;\n"
               "            float s_[NT_][4];\n");
    product_nt(&t, "s_", "qa_", "ks_");
    cg_put(&t, "            float x0m_ = m0_, x1m_ = m1_;\n"
               "#pragma unroll\n"
               "            for (int nt = 0; nt < NT_; nt++)\n"
               "#pragma unroll\n"
               "                for (int c = 0; c < 2; c++) {\n"
               "                    const long long j_ = x0_ + nt * 8 + 2 * t4_ + c;\n"
               "                    s_[nt][c] = j_ < lim0_ ? s_[nt][c] * SL2_ : -ALLOY_INF;\n"
               "                    s_[nt][2 + c] = j_ < lim1_ ? s_[nt][2 + c] * SL2_ : -ALLOY_INF;\n"
               "                    x0m_ = fmaxf(x0m_, s_[nt][c]);\n"
               "                    x1m_ = fmaxf(x1m_, s_[nt][2 + c]);\n"
               "                }\n"
               "            x0m_ = fmaxf(x0m_, __shfl_xor_sync(0xffffffffu, x0m_, 1));\n"
               "            x0m_ = fmaxf(x0m_, __shfl_xor_sync(0xffffffffu, x0m_, 2));\n"
               "            x1m_ = fmaxf(x1m_, __shfl_xor_sync(0xffffffffu, x1m_, 1));\n"
               "            x1m_ = fmaxf(x1m_, __shfl_xor_sync(0xffffffffu, x1m_, 2));\n"
               "            const float b0_ = x0m_ == -ALLOY_INF ? 0.f : x0m_, b1_ = x1m_ == -ALLOY_INF ? 0.f : x1m_;\n"
               "            l0_ *= exp2f(m0_ - b0_), l1_ *= exp2f(m1_ - b1_), m0_ = x0m_, m1_ = x1m_;\n"
               "#pragma unroll\n"
               "            for (int nt = 0; nt < NT_; nt++)\n"
               "                l0_ += exp2f(s_[nt][0] - b0_) + exp2f(s_[nt][1] - b0_), l1_ += exp2f(s_[nt][2] - b1_) + exp2f(s_[nt][3] - b1_);\n"
               "        }\n"
               "        l0_ += __shfl_xor_sync(0xffffffffu, l0_, 1);\n"
               "        l0_ += __shfl_xor_sync(0xffffffffu, l0_, 2);\n"
               "        l1_ += __shfl_xor_sync(0xffffffffu, l1_, 1);\n"
               "        l1_ += __shfl_xor_sync(0xffffffffu, l1_, 2);\n"
               "        /* a row that sees no key: lse -inf, P = 0 everywhere */\n"
               "        const float e0_ = l0_ > 0.f ? m0_ + log2f(l0_) : -ALLOY_INF, e1_ = l1_ > 0.f ? m1_ + log2f(l1_) : -ALLOY_INF;\n"
               "        if (t4_ == 0 && r0_ < T_) lse_[LSEOFF_(bh_) + r0_ * LSEROW_] = e0_;\n"
               "        if (t4_ == 0 && r1_ < T_) lse_[LSEOFF_(bh_) + r1_ * LSEROW_] = e1_;\n"
               "    }\n");
    }
    const ir_type *kt = &g->nodes[n->in[1]]->type;
    int64_t bytes = (int64_t)((kept ? 2 : 3) * ir_nbytes(qt) + (kept ? 0 : ir_nbytes(kt)) + 4 * ir_numel(qt));
    bool ok = cg_attention_mma_close(prog, g, n, k, name, &t, &ps, T, bytes);
    cg_text_free(&t);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* Kernel 2, a warp per 16 key rows j (K and V as A fragments in registers),
 * over the query tiles that see the block's keys (q and do through shared
 * memory, with their lse and delta): S^T = K Q^T, P^T = exp2(S^T - lse_i),
 * dP^T = V dO^T, dS^T = P^T (dP^T - delta_i); dV += P^T dO and dK += dS^T Q,
 * both rounded to the dtype first; then, the tile's dS (rounded the same)
 * and the block's K rows in shared memory, each warp adds dS K for 16 of
 * the tile's queries into the f32 dq accumulator (atomics: every key block
 * adds to the same rows). Five products per tile; dk = scale dK. */
static const char *keys_kernel(cg_program *prog, const ir_graph *g, const ir_node *n, int k, const char *name, bool kept,
                               const attn_strides *st)
{
    cg_params ps = {0};
    cg_text t = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int pq = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0), pk = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0),
        pv = cg_param_of(&ps, CG_PARAM_NODE, n->in[2], false, 0), pd = cg_param_of(&ps, CG_PARAM_NODE, n->in[4], false, 0);
    const ir_type *qt = &g->nodes[n->in[0]]->type, *kt = &g->nodes[n->in[1]]->type;
    int rows = cg_param_of(&ps, CG_PARAM_ROWS, n->id, true, scratch_words(g, n));
    int lse = kept ? cg_param_of(&ps, CG_PARAM_KEPT, n->in[3], false, qt->dims[0] * qt->dims[1] * qt->dims[2]) : rows;
    cg_attention_mma_open(&t, g, n, &ps, name, st);
    /* query i sees key j when j < LIM_(i), that is from query j - (S_ - T_) on when causal; the do tile's
     * buffer holds dS [query][key] (pitch DSP_) for the dq product, so it is the larger of the two */
    cg_put(&t, "    enum { DSP_ = TILE_ + 8, DB_ = TILE_ * (PS_ > DSP_ ? PS_ : DSP_) / 8 };\n"
               "    __shared__ alloy_b128 qb_[TILE_ * PS_ / 8], db_[DB_];\n"
               "    __shared__ float lse_[TILE_], dl_[TILE_];\n"
               "    unsigned short *qs_ = (unsigned short *)qb_, *ds_ = (unsigned short *)db_;\n"
               "    const int warp_ = threadIdx.x >> 5, lane_ = threadIdx.x & 31, g_ = lane_ >> 2, t4_ = lane_ & 3;\n"
               "    const long long nb_ = (S_ + ROWS_ - 1) / ROWS_, LEN_ = S_, LEN2_ = T_;\n"
               "    const float *lsep_ = p%d, *deltap_ = p%d + BH_ * T_;\n"
               "    float *dqa_ = p%d + 2 * BH_ * T_;\n"
               "    unsigned short *const dqp_ = p%d;\n"
               "    (void)dqa_, (void)dqp_;\n"
               "    for (long long blk_ = blockIdx.x; blk_ < BH_ * nb_; blk_ += gridDim.x) {\n"
               "        const long long bh_ = blk_ / nb_, j0_ = (blk_ %% nb_) * ROWS_, w0_ = j0_ + warp_ * 16;\n"
               "        const long long r0_ = w0_ + g_, r1_ = r0_ + 8;\n"
               "        long long start_ = %s;\n"
               "        start_ = start_ < 0 ? 0 : start_ - start_ %% TILE_;\n"
               "        const unsigned short *q_ = p%d + QOFF_(bh_), *do_ = p%d + DOOFF_(bh_);\n"
               "        const unsigned short *k_ = p%d + KOFF_(bh_), *v_ = p%d + VOFF_(bh_);\n",
           lse, rows, rows, out, ir_attr_i(n, "causal") ? "j0_ - (S_ - T_)" : "0", pq, pd, pk, pv);
    load_a(&t, "ka_", "k_", "KROW_");
    load_a(&t, "va_", "v_", "VROW_");
    zero_acc(&t, "dk_");
    zero_acc(&t, "dv_");
    cg_put(&t, "        for (long long x0_ = start_; x0_ < T_; x0_ += TILE_) {\n");
    load_tiles(&t, "qs_", "q_", "QROW_", "ds_", "do_", "DOROW_");
    cg_put(&t, "            for (int e_ = threadIdx.x; e_ < TILE_; e_ += blockDim.x) {\n"
               "                const long long i_ = x0_ + e_;\n"
               "                lse_[e_] = i_ < T_ ? lsep_[LSEOFF_(bh_) + i_ * LSEROW_] : -ALLOY_INF;\n"
               "                dl_[e_] = i_ < T_ ? deltap_[bh_ * T_ + i_] : 0.f;\n"
               "            }\n"
               "            __syncthreads();\n"
               "            /* busy_: some query of the tile sees the warp's first key (warp-uniform) */\n"
               "            const long long ilast_ = x0_ + TILE_ - 1 < T_ - 1 ? x0_ + TILE_ - 1 : T_ - 1;\n"
               "            const bool busy_ = w0_ < S_ && LIM_(ilast_) > w0_;\n"
               "            float s_[NT_][4], dp_[NT_][4];\n"
               "            if (busy_) {\n");
    product_nt(&t, "s_", "ka_", "qs_");
    product_nt(&t, "dp_", "va_", "ds_");
    cg_put(&t, "#pragma unroll\n"
               "            for (int nt = 0; nt < NT_; nt++)\n"
               "#pragma unroll\n"
               "                for (int c = 0; c < 4; c++) {\n"
               "                    const int col_ = nt * 8 + 2 * t4_ + (c & 1);\n"
               "                    const long long i_ = x0_ + col_, j_ = c < 2 ? r0_ : r1_;\n"
               "                    const bool seen_ = i_ < T_ && j_ < LIM_(i_) && lse_[col_] != -ALLOY_INF;\n"
               "                    const float p_ = seen_ ? exp2f(s_[nt][c] * SL2_ - lse_[col_]) : 0.f;\n"
               "                    s_[nt][c] = p_;\n"
               "                    dp_[nt][c] = p_ * (dp_[nt][c] - dl_[col_]);\n"
               "                }\n");
    product_acc(&t, "dv_", "s_", "ds_");
    product_acc(&t, "dk_", "dp_", "qs_");
    /* dS into the do buffer as [query][key], the block's K rows into the q buffer, once every warp is done with both */
    cg_put(&t, "            } else {\n"
               "#pragma unroll\n"
               "                for (int nt = 0; nt < NT_; nt++) dp_[nt][0] = dp_[nt][1] = dp_[nt][2] = dp_[nt][3] = 0.f;\n"
               "            }\n"
               "            __syncthreads();\n"
               "#pragma unroll\n"
               "            for (int nt = 0; nt < NT_; nt++)\n"
               "#pragma unroll\n"
               "                for (int c = 0; c < 4; c++)\n"
               "                    ds_[(nt * 8 + 2 * t4_ + (c & 1)) * DSP_ + warp_ * 16 + g_ + (c >> 1) * 8] = TO_(dp_[nt][c]);\n"
               "            for (int e_ = threadIdx.x; e_ < ROWS_ * (D_ / 8); e_ += blockDim.x) {\n"
               "                const int r_ = e_ / (D_ / 8), c_ = e_ %% (D_ / 8) * 8;\n"
               "                if (j0_ + r_ < S_) alloy_cp_async_16(qs_ + r_ * PS_ + c_, k_ + (j0_ + r_) * KROW_ + c_);\n"
               "                else *(alloy_b128 *)(qs_ + r_ * PS_ + c_) = alloy_b128{0, 0};\n"
               "            }\n"
               "            alloy_cp_async_commit();\n"
               "            alloy_cp_async_wait_all();\n"
               "            __syncthreads();\n"
               "            /* dQ rows x0_ + 16 warp_ + g_ (+ 8) of the tile: A = dS (row-major in ds_; ldmatrix matrix m: rows\n"
               "             * + 8 (m %% 2), columns + 8 (m / 2)), B = K (k = key, n = column: transposed, as V in the forward) */\n"
               "            const long long qi0_ = x0_ + warp_ * 16 + g_, qi1_ = qi0_ + 8;\n"
               "            if (x0_ + warp_ * 16 < T_) {\n"
               "#pragma unroll\n"
               "                for (int dn = 0; dn < DN_; dn += 2) {\n"
               "                    float acc_[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};\n"
               "#pragma unroll\n"
               "                    for (int kk = 0; kk < ROWS_ / 16; kk++) {\n"
               "                        unsigned af_[4], bf_[4];\n"
               "                        alloy_ldmatrix_x4(af_, ds_ + (warp_ * 16 + (lane_ & 7) + ((lane_ >> 3) & 1) * 8) * DSP_ + kk * 16 + (lane_ >> 4) * 8);\n"
               "                        alloy_ldmatrix_x4_trans(bf_, qs_ + (kk * 16 + ((lane_ >> 3) & 1) * 8 + (lane_ & 7)) * PS_ + (dn + (lane_ >> 4)) * 8);\n"
               "#pragma unroll\n"
               "                        for (int h = 0; h < 2; h++) MMA_(acc_[h], af_, bf_ + 2 * h);\n"
               "                    }\n"
               "#pragma unroll\n"
               "                    for (int h = 0; h < 2; h++) {\n"
               "                        const int c_ = (dn + h) * 8 + 2 * t4_;\n"
               "%s"
               "                    }\n"
               "                }\n"
               "            }\n"
               "        }\n"
               "        unsigned short *dko_ = p%d + DKOFF_(bh_), *dvo_ = p%d + DVOFF_(bh_);\n",
           dq_accumulates(g, n)
               ? "                        if (qi0_ < T_) atomicAdd(dqa_ + (bh_ * T_ + qi0_) * D_ + c_, acc_[h][0]), atomicAdd(dqa_ + (bh_ * T_ + qi0_) * D_ + c_ + 1, acc_[h][1]);\n"
                 "                        if (qi1_ < T_) atomicAdd(dqa_ + (bh_ * T_ + qi1_) * D_ + c_, acc_[h][2]), atomicAdd(dqa_ + (bh_ * T_ + qi1_) * D_ + c_ + 1, acc_[h][3]);\n"
               : "                        /* the only key block of these queries: dq = scale dQ, rounded once */\n"
                 "                        unsigned short *dqo_ = dqp_ + DQOFF_(bh_);\n"
                 "                        if (qi0_ < T_) *(unsigned *)(dqo_ + qi0_ * DQROW_ + c_) = (unsigned)TO_(acc_[h][0] * SCALE_) | (unsigned)TO_(acc_[h][1] * SCALE_) << 16;\n"
                 "                        if (qi1_ < T_) *(unsigned *)(dqo_ + qi1_ * DQROW_ + c_) = (unsigned)TO_(acc_[h][2] * SCALE_) | (unsigned)TO_(acc_[h][3] * SCALE_) << 16;\n",
           out, out);
    store_acc(&t, "dk_", "dko_", "DKROW_", "SCALE_");
    store_acc(&t, "dv_", "dvo_", "DVROW_", "1.f");
    cg_put(&t, "    }\n");
    /* each element once: q, do, k, v, dk, dv, the accumulator read and written */
    int64_t bytes = (int64_t)(2 * ir_nbytes(qt) + 4 * ir_nbytes(kt) + 8 * ir_numel(qt));
    bool ok = cg_attention_mma_close(prog, g, n, k, name, &t, &ps, kt->dims[2], bytes);
    cg_text_free(&t);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* Kernel 3: dq = scale dQ, rounded once from the f32 accumulator into
 * rows [0, T_) of each head's output. */
static const char *dq_kernel(cg_program *prog, const ir_graph *g, const ir_node *n, int k, const char *name,
                             const attn_strides *st)
{
    cg_params ps = {0};
    cg_text t = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    const ir_type *qt = &g->nodes[n->in[0]]->type;
    int rows = cg_param_of(&ps, CG_PARAM_ROWS, n->id, false, scratch_words(g, n));
    cg_attention_mma_open(&t, g, n, &ps, name, st);
    cg_put(&t, "    const float *dqa_ = p%d + 2 * BH_ * T_;\n"
               "    for (long long e_ = (long long)blockIdx.x * blockDim.x + threadIdx.x; e_ < BH_ * T_ * (D_ / 2);\n"
               "         e_ += (long long)gridDim.x * blockDim.x) {\n"
               "        const long long bh_ = e_ / (T_ * (D_ / 2)), i_ = e_ / (D_ / 2) %% T_, c_ = e_ %% (D_ / 2) * 2;\n"
               "        const float *a_ = dqa_ + (bh_ * T_ + i_) * D_ + c_;\n"
               "        *(unsigned *)(p%d + DQOFF_(bh_) + i_ * DQROW_ + c_) = (unsigned)TO_(a_[0] * SCALE_) | (unsigned)TO_(a_[1] * SCALE_) << 16;\n"
               "    }\n",
           rows, out);
    int64_t bytes = (int64_t)(ir_nbytes(qt) + 4 * ir_numel(qt));
    /* a thread per pair: rows of 64 pairs, 128 threads a block */
    bool ok = cg_attention_mma_close(prog, g, n, k, name, &t, &ps, (qt->dims[2] * qt->dims[3] / 2 + 1) / 2, bytes);
    cg_text_free(&t);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

const char *cg_emit_attention_grad_mma(cg_program *prog, const ir_graph *g, const ir_node *n, int k, const attn_strides *st)
{
    char name[48];
    al_fmt(name, sizeof name, "alloy_s%d_%s", k, ir_ops[n->op].name);
    bool kept = forward_kept(g, n);
    const char *why = rows_kernel(prog, g, n, k, name, kept, st);
    if (why) return why;
    al_fmt(name, sizeof name, "alloy_s%d_%s_keys", k, ir_ops[n->op].name);
    if ((why = keys_kernel(prog, g, n, k, name, kept, st))) return why;
    if (!dq_accumulates(g, n)) return NULL;
    al_fmt(name, sizeof name, "alloy_s%d_%s_dq", k, ir_ops[n->op].name);
    return dq_kernel(prog, g, n, k, name, st);
}
