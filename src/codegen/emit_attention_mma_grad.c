/* emit_attention_mma_grad.c - attention_grad for f16 and bf16 on tensor cores (FlashAttention-2's backward without atomics): per 16 query rows a warp computes the logsumexp, delta = do.o and dq; per 16 key rows a warp computes dk and dv. */
#include "codegen/emit_impl.h"

/* Loads this lane's A fragments of rows r0_ and r1_ (rows >= LEN_ zero) of
 * the [rows, D_] matrix at BASE, ROW elements from row to row, into NAME[KS_][4]. */
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

/* Copies rows [x0_, x0_ + TILE_) of two [LEN_, D_] matrices (GA, GB, rows
 * RA, RB elements apart) into shared tiles A and B (rows padded to PS_,
 * zeros past LEN_) between barriers. */
static void load_tiles(cg_text *t, const char *a, const char *ga, const char *ra, const char *b, const char *gb,
                       const char *rb)
{
    cg_put(t,
           "            __syncthreads();\n"
           "            for (int e_ = threadIdx.x; e_ < TILE_ * (D_ / 8); e_ += blockDim.x) {\n"
           "                const int r_ = e_ / (D_ / 8), c_ = e_ %% (D_ / 8) * 8;\n"
           "                const long long x_ = x0_ + r_;\n"
           "                if (x_ < LEN2_) {\n"
           "                    alloy_vcopy<16>(%s + r_ * PS_ + c_, %s + x_ * %s + c_);\n"
           "                    alloy_vcopy<16>(%s + r_ * PS_ + c_, %s + x_ * %s + c_);\n"
           "                } else {\n"
           "                    *(alloy_b128 *)(%s + r_ * PS_ + c_) = alloy_b128{0, 0};\n"
           "                    *(alloy_b128 *)(%s + r_ * PS_ + c_) = alloy_b128{0, 0};\n"
           "                }\n"
           "            }\n",
           a, ga, ra, b, gb, rb, a, b);
}

/* C[NT_][4] = A B^T over a 16 x D_ A in registers (AF[KS_][4]) and the
 * tile's 64 rows of B in shared memory (SH): 8 n-tiles of 8 rows. */
static void product_nt(cg_text *t, const char *c, const char *af, const char *sh)
{
    cg_put(t,
           "            float %s[NT_][4];\n"
           "#pragma unroll\n"
           "            for (int nt = 0; nt < NT_; nt++) {\n"
           "                %s[nt][0] = %s[nt][1] = %s[nt][2] = %s[nt][3] = 0.f;\n"
           "#pragma unroll\n"
           "                for (int kk = 0; kk < KS_; kk++) {\n"
           "                    const unsigned short *br_ = %s + (nt * 8 + g_) * PS_ + kk * 16 + 2 * t4_;\n"
           "                    const unsigned bf_[2] = {*(const unsigned *)br_, *(const unsigned *)(br_ + 8)};\n"
           "                    MMA_(%s[nt], %s[kk], bf_);\n"
           "                }\n"
           "            }\n",
           c, c, c, c, c, sh, c, af);
}

/* ACC[DN_][4] += X B over the tile: X [16, TILE_] given per n-tile pair as
 * f32 C fragments (X_[NT_][4], rounded here to the dtype: the C fragments of
 * n-tiles 2kk and 2kk + 1 are the A fragment of k-block kk), B the tile's
 * [TILE_, D_] rows in shared memory (SH). */
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
           "                for (int dn = 0; dn < DN_; dn++) {\n"
           "                    const unsigned short *bc_ = %s + (kk * 16 + 2 * t4_) * PS_ + dn * 8 + g_;\n"
           "                    const unsigned bf_[2] = {(unsigned)bc_[0] | (unsigned)bc_[PS_] << 16,\n"
           "                                             (unsigned)bc_[8 * PS_] | (unsigned)bc_[9 * PS_] << 16};\n"
           "                    MMA_(%s[dn], xa_, bf_);\n"
           "                }\n"
           "            }\n",
           x, sh, acc);
}

/* Stores ACC[DN_][4] * MUL for rows r0_, r1_ (< LEN_) of the [.., D_] matrix at BASE, rows ROW elements apart. */
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

/* Kernel 1, a warp per 16 query rows: pass 1 over the key tiles gives each
 * row's logsumexp (log2 units) with the forward's online max and sum; delta
 * = do.o; pass 2 recomputes P = exp2(S - lse), dP = dO V^T, dS = P (dP -
 * delta) rounded to the dtype, dQ += dS K; dq = scale dQ. lse and delta go
 * to the rows buffer for kernel 2. */
static const char *rows_kernel(cg_program *prog, const ir_graph *g, const ir_node *n, int k, const char *name,
                               const attn_strides *st)
{
    cg_params ps = {0};
    cg_text t = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int pq = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0), pk = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0),
        pv = cg_param_of(&ps, CG_PARAM_NODE, n->in[2], false, 0), po = cg_param_of(&ps, CG_PARAM_NODE, n->in[3], false, 0),
        pd = cg_param_of(&ps, CG_PARAM_NODE, n->in[4], false, 0);
    const ir_type *qt = &g->nodes[n->in[0]]->type;
    int64_t BH = qt->dims[0] * qt->dims[1], T = qt->dims[2];
    int rows = cg_param_of(&ps, CG_PARAM_ROWS, n->id, true, 2 * BH * T);
    cg_attention_mma_open(&t, g, n, &ps, name, st);
    cg_put(&t, "    __shared__ alloy_b128 kb_[TILE_ * PS_ / 8], vb_[TILE_ * PS_ / 8];\n"
               "    unsigned short *ks_ = (unsigned short *)kb_, *vs_ = (unsigned short *)vb_;\n"
               "    const int warp_ = threadIdx.x >> 5, lane_ = threadIdx.x & 31, g_ = lane_ >> 2, t4_ = lane_ & 3;\n"
               "    const long long nb_ = (T_ + ROWS_ - 1) / ROWS_, LEN_ = T_, LEN2_ = S_;\n"
               "    for (long long blk_ = blockIdx.x; blk_ < BH_ * nb_; blk_ += gridDim.x) {\n"
               "        const long long bh_ = blk_ / nb_, i0_ = (blk_ %% nb_) * ROWS_, w0_ = i0_ + warp_ * 16;\n"
               "        const long long r0_ = w0_ + g_, r1_ = r0_ + 8;\n"
               "        const long long last_ = i0_ + ROWS_ - 1 < T_ - 1 ? i0_ + ROWS_ - 1 : T_ - 1;\n"
               "        const long long wlast_ = w0_ + 15 < T_ - 1 ? w0_ + 15 : T_ - 1;\n"
               "        const long long blim_ = LIM_(last_), wlim_ = w0_ < T_ ? LIM_(wlast_) : 0;\n"
               "        const long long lim0_ = r0_ < T_ ? LIM_(r0_) : 0, lim1_ = r1_ < T_ ? LIM_(r1_) : 0;\n"
               "        const unsigned short *q_ = p%d + QOFF_(bh_), *do_ = p%d + DOOFF_(bh_), *o_ = p%d + OOFF_(bh_);\n"
               "        const unsigned short *k_ = p%d + KOFF_(bh_), *v_ = p%d + VOFF_(bh_);\n",
           pq, pd, po, pk, pv);
    load_a(&t, "qa_", "q_", "QROW_");
    load_a(&t, "da_", "do_", "DOROW_");
    /* delta over the lane's 4 columns per k-block, then the group's 4 lanes */
    cg_put(&t, "        float d0_ = 0.f, d1_ = 0.f;\n"
               "#pragma unroll\n"
               "        for (int kk = 0; kk < KS_; kk++)\n"
               "#pragma unroll\n"
               "            for (int h = 0; h < 4; h++) {\n"
               "                const long long r_ = h & 1 ? r1_ : r0_;\n"
               "                if (r_ >= T_) continue;\n"
               "                const int c_ = kk * 16 + 2 * t4_ + (h >> 1) * 8;\n"
               "                const float x_ = FROM_((unsigned short)da_[kk][h]) * FROM_(o_[r_ * OROW_ + c_]) +\n"
               "                                 FROM_((unsigned short)(da_[kk][h] >> 16)) * FROM_(o_[r_ * OROW_ + c_ + 1]);\n"
               "                if (h & 1) d1_ += x_; else d0_ += x_;\n"
               "            }\n"
               "        d0_ += __shfl_xor_sync(0xffffffffu, d0_, 1);\n"
               "        d0_ += __shfl_xor_sync(0xffffffffu, d0_, 2);\n"
               "        d1_ += __shfl_xor_sync(0xffffffffu, d1_, 1);\n"
               "        d1_ += __shfl_xor_sync(0xffffffffu, d1_, 2);\n"
               "        float m0_ = -ALLOY_INF, m1_ = -ALLOY_INF, l0_ = 0.f, l1_ = 0.f;\n"
               "        for (long long x0_ = 0; x0_ < blim_; x0_ += TILE_) {\n");
    load_tiles(&t, "ks_", "k_", "KROW_", "vs_", "v_", "VROW_");
    cg_put(&t, "            __syncthreads();\n"
               "            if (x0_ >= wlim_) continue;\n");
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
               "        if (t4_ == 0 && r0_ < T_) p%d[LSEOFF_(bh_) + r0_ * LSEROW_] = e0_, p%d[BH_ * T_ + LSEOFF_(bh_) + r0_ * LSEROW_] = d0_;\n"
               "        if (t4_ == 0 && r1_ < T_) p%d[LSEOFF_(bh_) + r1_ * LSEROW_] = e1_, p%d[BH_ * T_ + LSEOFF_(bh_) + r1_ * LSEROW_] = d1_;\n",
           rows, rows, rows, rows);
    zero_acc(&t, "dq_");
    cg_put(&t, "        for (long long x0_ = 0; x0_ < blim_; x0_ += TILE_) {\n");
    load_tiles(&t, "ks_", "k_", "KROW_", "vs_", "v_", "VROW_");
    cg_put(&t, "            __syncthreads();\n"
               "            if (x0_ >= wlim_) continue;\n");
    product_nt(&t, "s_", "qa_", "ks_");
    product_nt(&t, "dp_", "da_", "vs_");
    cg_put(&t, "#pragma unroll\n"
               "            for (int nt = 0; nt < NT_; nt++)\n"
               "#pragma unroll\n"
               "                for (int c = 0; c < 2; c++) {\n"
               "                    const long long j_ = x0_ + nt * 8 + 2 * t4_ + c;\n"
               "                    const float p0_ = j_ < lim0_ ? exp2f(s_[nt][c] * SL2_ - e0_) : 0.f;\n"
               "                    const float p1_ = j_ < lim1_ ? exp2f(s_[nt][2 + c] * SL2_ - e1_) : 0.f;\n"
               "                    s_[nt][c] = p0_ * (dp_[nt][c] - d0_);\n"
               "                    s_[nt][2 + c] = p1_ * (dp_[nt][2 + c] - d1_);\n"
               "                }\n");
    product_acc(&t, "dq_", "s_", "ks_");
    cg_put(&t, "        }\n"
               "        unsigned short *dqo_ = p%d + DQOFF_(bh_);\n",
           out);
    store_acc(&t, "dq_", "dqo_", "DQROW_", "SCALE_");
    cg_put(&t, "    }\n");
    const ir_type *kt = &g->nodes[n->in[1]]->type;
    int64_t bytes = (int64_t)(4 * ir_nbytes(qt) + 4 * ir_nbytes(kt));
    bool ok = cg_attention_mma_close(prog, g, n, k, name, &t, &ps, T, bytes);
    cg_text_free(&t);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* Kernel 2, a warp per 16 key rows j (K and V as A fragments in registers):
 * over the query tiles that see the block's keys (q and do through shared
 * memory, with their lse and delta), S^T = K Q^T, P^T = exp2(S^T - lse_i),
 * dP^T = V dO^T, dS^T = P^T (dP^T - delta_i); dV += P^T dO and dK += dS^T Q,
 * both rounded to the dtype first; dk = scale dK. */
static const char *keys_kernel(cg_program *prog, const ir_graph *g, const ir_node *n, int k, const char *name,
                               const attn_strides *st)
{
    cg_params ps = {0};
    cg_text t = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int pq = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0), pk = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0),
        pv = cg_param_of(&ps, CG_PARAM_NODE, n->in[2], false, 0), pd = cg_param_of(&ps, CG_PARAM_NODE, n->in[4], false, 0);
    const ir_type *qt = &g->nodes[n->in[0]]->type, *kt = &g->nodes[n->in[1]]->type;
    int64_t BH = qt->dims[0] * qt->dims[1], T = qt->dims[2];
    int rows = cg_param_of(&ps, CG_PARAM_ROWS, n->id, false, 2 * BH * T);
    cg_attention_mma_open(&t, g, n, &ps, name, st);
    /* query i sees key j when j < LIM_(i), that is from query j - (S_ - T_) on when causal */
    cg_put(&t, "    __shared__ alloy_b128 qb_[TILE_ * PS_ / 8], db_[TILE_ * PS_ / 8];\n"
               "    __shared__ float lse_[TILE_], dl_[TILE_];\n"
               "    unsigned short *qs_ = (unsigned short *)qb_, *ds_ = (unsigned short *)db_;\n"
               "    const int warp_ = threadIdx.x >> 5, lane_ = threadIdx.x & 31, g_ = lane_ >> 2, t4_ = lane_ & 3;\n"
               "    const long long nb_ = (S_ + ROWS_ - 1) / ROWS_, LEN_ = S_, LEN2_ = T_;\n"
               "    for (long long blk_ = blockIdx.x; blk_ < BH_ * nb_; blk_ += gridDim.x) {\n"
               "        const long long bh_ = blk_ / nb_, j0_ = (blk_ %% nb_) * ROWS_, w0_ = j0_ + warp_ * 16;\n"
               "        const long long r0_ = w0_ + g_, r1_ = r0_ + 8;\n"
               "        long long start_ = %s;\n"
               "        start_ = start_ < 0 ? 0 : start_ - start_ %% TILE_;\n"
               "        const unsigned short *q_ = p%d + QOFF_(bh_), *do_ = p%d + DOOFF_(bh_);\n"
               "        const unsigned short *k_ = p%d + KOFF_(bh_), *v_ = p%d + VOFF_(bh_);\n",
           ir_attr_i(n, "causal") ? "j0_ - (S_ - T_)" : "0", pq, pd, pk, pv);
    load_a(&t, "ka_", "k_", "KROW_");
    load_a(&t, "va_", "v_", "VROW_");
    zero_acc(&t, "dk_");
    zero_acc(&t, "dv_");
    cg_put(&t, "        for (long long x0_ = start_; x0_ < T_; x0_ += TILE_) {\n");
    load_tiles(&t, "qs_", "q_", "QROW_", "ds_", "do_", "DOROW_");
    cg_put(&t, "            for (int e_ = threadIdx.x; e_ < TILE_; e_ += blockDim.x) {\n"
               "                const long long i_ = x0_ + e_;\n"
               "                lse_[e_] = i_ < T_ ? p%d[LSEOFF_(bh_) + i_ * LSEROW_] : -ALLOY_INF;\n"
               "                dl_[e_] = i_ < T_ ? p%d[BH_ * T_ + LSEOFF_(bh_) + i_ * LSEROW_] : 0.f;\n"
               "            }\n"
               "            __syncthreads();\n"
               "            /* the whole warp: no query of the tile sees its first key */\n"
               "            const long long ilast_ = x0_ + TILE_ - 1 < T_ - 1 ? x0_ + TILE_ - 1 : T_ - 1;\n"
               "            if (w0_ >= S_ || LIM_(ilast_) <= w0_) continue;\n",
           rows, rows);
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
    cg_put(&t, "        }\n"
               "        unsigned short *dko_ = p%d + DKOFF_(bh_), *dvo_ = p%d + DVOFF_(bh_);\n",
           out, out);
    store_acc(&t, "dk_", "dko_", "DKROW_", "SCALE_");
    store_acc(&t, "dv_", "dvo_", "DVROW_", "1.f");
    cg_put(&t, "    }\n");
    int64_t bytes = (int64_t)(2 * ir_nbytes(qt) + 4 * ir_nbytes(kt));
    bool ok = cg_attention_mma_close(prog, g, n, k, name, &t, &ps, kt->dims[2], bytes);
    cg_text_free(&t);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

const char *cg_emit_attention_grad_mma(cg_program *prog, const ir_graph *g, const ir_node *n, int k,
                                       const attn_strides *st)
{
    char name[48];
    al_fmt(name, sizeof name, "alloy_s%d_%s", k, ir_ops[n->op].name);
    const char *why = rows_kernel(prog, g, n, k, name, st);
    if (why) return why;
    al_fmt(name, sizeof name, "alloy_s%d_%s_keys", k, ir_ops[n->op].name);
    return keys_kernel(prog, g, n, k, name, st);
}
