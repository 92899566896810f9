/* emit_attention_mma.c - the attention forward for f16 and bf16 on tensor cores: FlashAttention-2's loop over mma.sync.m16n8k16 (inline PTX, f32 accumulators and statistics), a warp per 16 query rows, the rows' logsumexp kept for the backward. */
#include "codegen/emit_impl.h"

/* 64 query rows per block (4 warps of 16), key/value tiles of 64 rows in
 * shared memory, each row padded by 8 elements (16 bytes) so that the
 * fragment loads of a warp's 8 groups fall in different banks. */
enum { MMA_ROWS = 64, MMA_THREADS = 128, MMA_TILE = 64, MMA_PAD = 8, MMA_MAX_D = 128 };

bool cg_attention_mma_takes(alloy_dtype dt, int64_t head_dim)
{
    return (dt == ALLOY_F16 || dt == ALLOY_BF16) && head_dim > 0 && head_dim % 16 == 0 && head_dim <= MMA_MAX_D;
}

/* The tensor-core product behind one name per input type, defined once per
 * module: inline PTX on the device; the host emulation (tests/cuda_emu/emu.h)
 * defines the same names over its warp. d[0..3] += A B with A 16x16 (a[0..3],
 * row-major), B 16x8 (b[0..1], column-major), laid out per lane as the PTX ISA's
 * "Matrix Fragments for mma.m16n8k16 with floating point type" says (groupID =
 * lane >> 2, threadID_in_group = lane % 4; A: rows groupID and groupID + 8,
 * columns threadID_in_group * 2 + {0, 1} and the same + 8; B: rows
 * threadID_in_group * 2 + {0, 1} (+ 8), column groupID; C/D: rows groupID and
 * groupID + 8, columns threadID_in_group * 2 + {0, 1}). The instruction needs
 * sm_80; for older targets (sm_75) and for testing that path on the host
 * emulation (-DALLOY_EMU_MMA_SHUFFLES) the same names compute the product
 * from the same fragments with warp shuffles. */
static const char mma_defs[] =
    "#ifndef ALLOY_MMA_M16N8K16\n"
    "#define ALLOY_MMA_M16N8K16\n"
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n"
    "static __device__ __forceinline__ void alloy_mma_m16n8k16_f16(float *d, const unsigned *a, const unsigned *b)\n"
    "{\n"
    "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\\n\"\n"
    "                 : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])\n"
    "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n"
    "}\n"
    "static __device__ __forceinline__ void alloy_mma_m16n8k16_bf16(float *d, const unsigned *a, const unsigned *b)\n"
    "{\n"
    "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\\n\"\n"
    "                 : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])\n"
    "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n"
    "}\n"
    "#elif defined(__CUDA_ARCH__) || defined(ALLOY_EMU_MMA_SHUFFLES)\n"
    "/* before sm_80 (no m16n8k16 for f16/bf16): the same product from the same fragments by warp shuffles and\n"
    "   FMAs. Lane (g, t) needs A's rows g and g + 8, held by lanes 4g..4g+3, and B's columns 2t and 2t + 1, held\n"
    "   by lanes 4(2t)..+3 and 4(2t+1)..+3; source lane t2 of a group holds k = 2 t2 + {0, 1} and the same + 8. */\n"
    "template <bool BF> static __device__ __forceinline__ float alloy_mma_elem(unsigned r, int hi)\n"
    "{\n"
    "    const unsigned short h = (unsigned short)(hi ? r >> 16 : r & 0xffffu);\n"
    "    return BF ? alloy_bf2f(h) : alloy_h2f(h);\n"
    "}\n"
    "/* out of line, by value: one small function instead of 32 shuffles at every unrolled use, and the\n"
    "   caller's fragment arrays stay in registers */\n"
    "struct alloy_mma_acc { float x[4]; };\n"
    "template <bool BF> static __device__ __noinline__ alloy_mma_acc alloy_mma_by_shuffles(alloy_mma_acc d, unsigned a0, unsigned a1,\n"
    "                                                                                   unsigned a2, unsigned a3, unsigned b0, unsigned b1)\n"
    "{\n"
    "    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "    const unsigned a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};\n"
    "    for (int t2 = 0; t2 < 4; t2++) {\n"
    "        unsigned ar[4];\n"
    "        for (int r = 0; r < 4; r++) ar[r] = __shfl_sync(0xffffffffu, a[r], g * 4 + t2);\n"
    "        for (int c = 0; c < 2; c++) {\n"
    "            const unsigned bs0 = __shfl_sync(0xffffffffu, b[0], (2 * t + c) * 4 + t2);\n"
    "            const unsigned bs1 = __shfl_sync(0xffffffffu, b[1], (2 * t + c) * 4 + t2);\n"
    "            for (int h = 0; h < 2; h++) { /* h: row g (A registers 0, 2) or g + 8 (1, 3) */\n"
    "                float s = d.x[2 * h + c];\n"
    "                s += alloy_mma_elem<BF>(ar[h], 0) * alloy_mma_elem<BF>(bs0, 0) + alloy_mma_elem<BF>(ar[h], 1) * alloy_mma_elem<BF>(bs0, 1);\n"
    "                s += alloy_mma_elem<BF>(ar[h + 2], 0) * alloy_mma_elem<BF>(bs1, 0) + alloy_mma_elem<BF>(ar[h + 2], 1) * alloy_mma_elem<BF>(bs1, 1);\n"
    "                d.x[2 * h + c] = s;\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "    return d;\n"
    "}\n"
    "template <bool BF> static __device__ __forceinline__ void alloy_mma_shfl(float *d, const unsigned *a, const unsigned *b)\n"
    "{\n"
    "    alloy_mma_acc c = {{d[0], d[1], d[2], d[3]}};\n"
    "    c = alloy_mma_by_shuffles<BF>(c, a[0], a[1], a[2], a[3], b[0], b[1]);\n"
    "    d[0] = c.x[0], d[1] = c.x[1], d[2] = c.x[2], d[3] = c.x[3];\n"
    "}\n"
    "static __device__ __forceinline__ void alloy_mma_m16n8k16_f16(float *d, const unsigned *a, const unsigned *b) { alloy_mma_shfl<false>(d, a, b); }\n"
    "static __device__ __forceinline__ void alloy_mma_m16n8k16_bf16(float *d, const unsigned *a, const unsigned *b) { alloy_mma_shfl<true>(d, a, b); }\n"
    "#endif\n"
    "#endif\n";

/* The fragment loads and tile copies, defined once per module on the GPU
 * (the host emulation, tests/cuda_emu/emu.h, defines the same names):
 * alloy_ldmatrix_x4[_trans](r, row) is ldmatrix.sync.aligned.m8n8.x4[.trans]
 * .shared.b16, lanes 8m..8m+7 giving the 16-byte rows of matrix m, r[m] per
 * lane as the PTX ISA lays it out (row lane / 4, columns 2 (lane % 4) + {0,
 * 1}; transposed: rows 2 (lane % 4) + {0, 1} of column lane / 4); sm_75 on.
 * alloy_cp_async_16(dst, src) is cp.async.cg.shared.global of 16 bytes,
 * with cp.async.commit_group and cp.async.wait_group 0 / 1 (sm_80 on; a
 * plain copy before). */
static const char ldmatrix_defs[] =
    "#if !defined(ALLOY_LDMATRIX) && defined(__CUDA_ARCH__)\n"
    "#define ALLOY_LDMATRIX\n"
    "static __device__ __forceinline__ unsigned alloy_smem_addr(const void *p)\n"
    "{\n"
    "    unsigned a;\n"
    "    asm(\"{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\" : \"=r\"(a) : \"l\"(p));\n"
    "    return a;\n"
    "}\n"
    "static __device__ __forceinline__ void alloy_ldmatrix_x4(unsigned *r, const void *row)\n"
    "{\n"
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\\n\"\n"
    "                 : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(alloy_smem_addr(row)) : \"memory\");\n"
    "}\n"
    "static __device__ __forceinline__ void alloy_ldmatrix_x4_trans(unsigned *r, const void *row)\n"
    "{\n"
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\\n\"\n"
    "                 : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(alloy_smem_addr(row)) : \"memory\");\n"
    "}\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "static __device__ __forceinline__ void alloy_cp_async_16(void *dst, const void *src)\n"
    "{\n"
    "    asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16;\\n\" : : \"r\"(alloy_smem_addr(dst)), \"l\"(src) : \"memory\");\n"
    "}\n"
    "static __device__ __forceinline__ void alloy_cp_async_commit() { asm volatile(\"cp.async.commit_group;\\n\" : : : \"memory\"); }\n"
    "static __device__ __forceinline__ void alloy_cp_async_wait_all() { asm volatile(\"cp.async.wait_group 0;\\n\" : : : \"memory\"); }\n"
    "static __device__ __forceinline__ void alloy_cp_async_wait_1() { asm volatile(\"cp.async.wait_group 1;\\n\" : : : \"memory\"); }\n"
    "#else /* before sm_80: a plain 16-byte copy, nothing to wait for */\n"
    "static __device__ __forceinline__ void alloy_cp_async_16(void *dst, const void *src) { alloy_vcopy<16>(dst, src); }\n"
    "static __device__ __forceinline__ void alloy_cp_async_commit() {}\n"
    "static __device__ __forceinline__ void alloy_cp_async_wait_all() {}\n"
    "static __device__ __forceinline__ void alloy_cp_async_wait_1() {}\n"
    "#endif\n"
    "#endif\n";

/* The kernel after its signature. Per block: 64 query rows of one (batch,
 * head); warp w owns rows i0 + 16 w .. + 15, and lane (g = lane >> 2,
 * t = lane % 4) holds rows g and g + 8 of them. The warp's Q stays in
 * registers as A fragments; per key tile (K and V copied into shared memory
 * by cp.async, double-buffered at D_ <= 64 so that the next tile's copies
 * fly while this one is computed; their B fragments loaded by ldmatrix, V's
 * transposed): S = Q K^T (8 n-tiles of 8 keys), scaled into log2 units, masked, the rows'
 * maxima over the 4 lanes of a group, the accumulator rescaled, P =
 * exp2(S - m) rounded to f16/bf16 (the rounded values summed into l, so the
 * weights divide by their own sum), and O += P V with P's C fragments of
 * n-tiles 2kk and 2kk + 1 reused as the A fragment of k-block kk. Last,
 * the row sums over the group and O / l, rounded once. */
static const char *const mma_body[] = {
    "    unsigned short *ks_ = (unsigned short *)kb_, *vs_ = (unsigned short *)vb_;\n"
    "    const int warp_ = threadIdx.x >> 5, lane_ = threadIdx.x & 31, g_ = lane_ >> 2, t4_ = lane_ & 3;\n"
    "    const long long nb_ = (T_ + ROWS_ - 1) / ROWS_;\n"
    "    for (long long blk_ = blockIdx.x; blk_ < BH_ * nb_; blk_ += gridDim.x) {\n"
    "        const long long bh_ = blk_ / nb_, i0_ = (blk_ % nb_) * ROWS_, w0_ = i0_ + warp_ * 16;\n"
    "        const long long r0_ = w0_ + g_, r1_ = r0_ + 8;\n"
    "        const long long last_ = i0_ + ROWS_ - 1 < T_ - 1 ? i0_ + ROWS_ - 1 : T_ - 1;\n"
    "        const long long wlast_ = w0_ + 15 < T_ - 1 ? w0_ + 15 : T_ - 1;\n"
    "        /* keys the block loads, keys this warp's rows see, keys each of the lane's rows sees */\n"
    "        const long long blim_ = LIM_(last_), wlim_ = w0_ < T_ ? LIM_(wlast_) : 0;\n"
    "        const long long lim0_ = r0_ < T_ ? LIM_(r0_) : 0, lim1_ = r1_ < T_ ? LIM_(r1_) : 0;\n"
    "        const unsigned short *q_ = PQ_ + QOFF_(bh_), *k_ = PK_ + KOFF_(bh_), *v_ = PV_ + VOFF_(bh_);\n"
    "        unsigned qa_[KS_][4];\n"
    "#pragma unroll\n"
    "        for (int kk = 0; kk < KS_; kk++) {\n"
    "            const int c_ = kk * 16 + 2 * t4_;\n"
    "            qa_[kk][0] = r0_ < T_ ? *(const unsigned *)(q_ + (int)r0_ * QROW_ + c_) : 0u; /* int: rows * QROW_ < 2^31, checked at emit */\n"
    "            qa_[kk][1] = r1_ < T_ ? *(const unsigned *)(q_ + (int)r1_ * QROW_ + c_) : 0u; /* int: rows * QROW_ < 2^31, checked at emit */\n"
    "            qa_[kk][2] = r0_ < T_ ? *(const unsigned *)(q_ + (int)r0_ * QROW_ + c_ + 8) : 0u; /* int: rows * QROW_ < 2^31, checked at emit */\n"
    "            qa_[kk][3] = r1_ < T_ ? *(const unsigned *)(q_ + (int)r1_ * QROW_ + c_ + 8) : 0u; /* int: rows * QROW_ < 2^31, checked at emit */\n"
    "        }\n"
    "        float o_[DN_][4];\n"
    "#pragma unroll\n"
    "        for (int dn = 0; dn < DN_; dn++) o_[dn][0] = o_[dn][1] = o_[dn][2] = o_[dn][3] = 0.f;\n"
    "        float m0_ = -ALLOY_INF, m1_ = -ALLOY_INF, l0_ = 0.f, l1_ = 0.f, u0_ = 0.f, u1_ = 0.f;\n"
    ,
    /* the K and V rows [j0, j0 + TILE_) into stage st by 16-byte cp.async copies (zeros past S_:
     * 0 * a stale NaN would reach O), committed as one group */
    "#define ISSUE_(j0, st)                                                                               \\\n"
    "    do {                                                                                             \\\n"
    "        for (int e_ = threadIdx.x; e_ < TILE_ * (D_ / 8); e_ += blockDim.x) {                        \\\n"
    "            const int r_ = e_ / (D_ / 8), c_ = e_ % (D_ / 8) * 8;                                    \\\n"
    "            const long long j_ = (j0) + r_;                                                          \\\n"
    "            unsigned short *kd_ = ks_ + (st) * TILE_ * PS_ + r_ * PS_ + c_;                          \\\n"
    "            unsigned short *vd_ = vs_ + (st) * TILE_ * PS_ + r_ * PS_ + c_;                          \\\n"
    "            if (j_ < S_) {                                                                           \\\n"
    "                alloy_cp_async_16(kd_, k_ + j_ * KROW_ + c_);                                         \\\n"
    "                alloy_cp_async_16(vd_, v_ + j_ * VROW_ + c_);                                         \\\n"
    "            } else {                                                                                 \\\n"
    "                *(alloy_b128 *)kd_ = alloy_b128{0, 0};                                               \\\n"
    "                *(alloy_b128 *)vd_ = alloy_b128{0, 0};                                               \\\n"
    "            }                                                                                        \\\n"
    "        }                                                                                            \\\n"
    "        alloy_cp_async_commit();                                                                     \\\n"
    "    } while (0)\n"
    /* two stages (D_ <= 64): tile j + 1's copies fly while tile j is computed; one stage: issued
     * after the tile's last reader */
    "        if (blim_ > 0) ISSUE_(0, 0);\n"
    "        for (long long j0_ = 0, it_ = 0; j0_ < blim_; j0_ += TILE_, it_++) {\n"
    "            const int st_ = STAGES_ == 2 ? (int)(it_ & 1) : 0; /* int: a parity */\n"
    "            if (STAGES_ == 2 && j0_ + TILE_ < blim_) {\n"
    "                ISSUE_(j0_ + TILE_, st_ ^ 1);\n"
    "                alloy_cp_async_wait_1();\n"
    "            } else {\n"
    "                alloy_cp_async_wait_all();\n"
    "            }\n"
    "            __syncthreads();\n"
    "            const unsigned short *kt_ = ks_ + st_ * TILE_ * PS_, *vt_ = vs_ + st_ * TILE_ * PS_;\n"
    "            if (j0_ < wlim_) { /* else the whole warp: its rows see none of these keys */\n"
    "            float s_[NT_][4];\n"
    "#pragma unroll\n"
    "            for (int np = 0; np < NT_; np += 2) {\n"
    "#pragma unroll\n"
    "                for (int h = 0; h < 8; h++) s_[np + h / 4][h % 4] = 0.f;\n"
    "#pragma unroll\n"
    "                for (int kk = 0; kk < KS_; kk++) {\n"
    "                    /* B fragments of n-tiles np and np + 1: lanes 8m..8m+7 give the rows of matrix m */\n"
    "                    unsigned kf_[4];\n"
    "                    alloy_ldmatrix_x4(kf_, kt_ + ((np + (lane_ >> 4)) * 8 + (lane_ & 7)) * PS_ + kk * 16 + ((lane_ >> 3) & 1) * 8);\n"
    "#pragma unroll\n"
    "                    for (int h = 0; h < 2; h++) MMA_(s_[np + h], qa_[kk], kf_ + 2 * h);\n"
    "                }\n"
    "            }\n"
    ,
    "            float x0_ = m0_, x1_ = m1_;\n"
    "#pragma unroll\n"
    "            for (int nt = 0; nt < NT_; nt++)\n"
    "#pragma unroll\n"
    "                for (int c = 0; c < 2; c++) {\n"
    "                    const long long j_ = j0_ + nt * 8 + 2 * t4_ + c;\n"
    "                    s_[nt][c] = j_ < lim0_ ? s_[nt][c] * SL2_ : -ALLOY_INF;\n"
    "                    s_[nt][2 + c] = j_ < lim1_ ? s_[nt][2 + c] * SL2_ : -ALLOY_INF;\n"
    "                    x0_ = fmaxf(x0_, s_[nt][c]);\n"
    "                    x1_ = fmaxf(x1_, s_[nt][2 + c]);\n"
    "                }\n"
    "            x0_ = fmaxf(x0_, __shfl_xor_sync(0xffffffffu, x0_, 1));\n"
    "            x0_ = fmaxf(x0_, __shfl_xor_sync(0xffffffffu, x0_, 2));\n"
    "            x1_ = fmaxf(x1_, __shfl_xor_sync(0xffffffffu, x1_, 1));\n"
    "            x1_ = fmaxf(x1_, __shfl_xor_sync(0xffffffffu, x1_, 2));\n"
    "            /* a row that has seen no key yet subtracts 0: its P are exp2(-inf) = 0 */\n"
    "            const float b0_ = x0_ == -ALLOY_INF ? 0.f : x0_, b1_ = x1_ == -ALLOY_INF ? 0.f : x1_;\n"
    "            const float c0_ = exp2f(m0_ - b0_), c1_ = exp2f(m1_ - b1_);\n"
    "            m0_ = x0_, m1_ = x1_, l0_ *= c0_, l1_ *= c1_, u0_ *= c0_, u1_ *= c1_;\n"
    "#pragma unroll\n"
    "            for (int dn = 0; dn < DN_; dn++) o_[dn][0] *= c0_, o_[dn][1] *= c0_, o_[dn][2] *= c1_, o_[dn][3] *= c1_;\n"
    ,
    "#pragma unroll\n"
    "            for (int kk = 0; kk < TILE_ / 16; kk++) {\n"
    "                unsigned pa_[4];\n"
    "#pragma unroll\n"
    "                for (int h = 0; h < 4; h++) { /* A register h: n-tile 2kk + h / 2, row g (even h) or g + 8 */\n"
    "                    const float *sv_ = s_[2 * kk + h / 2] + (h & 1) * 2, b_ = h & 1 ? b1_ : b0_;\n"
    "                    const float e0_ = exp2f(sv_[0] - b_), e1_ = exp2f(sv_[1] - b_);\n"
    "                    const unsigned short lo_ = TO_(e0_), hi_ = TO_(e1_);\n"
    "                    const float sum_ = FROM_(lo_) + FROM_(hi_);\n"
    "                    if (h & 1) l1_ += sum_, u1_ += e0_ + e1_; else l0_ += sum_, u0_ += e0_ + e1_;\n"
    "                    pa_[h] = (unsigned)lo_ | (unsigned)hi_ << 16;\n"
    "                }\n"
    "#pragma unroll\n"
    "                for (int dn = 0; dn < DN_; dn += 2) {\n"
    "                    /* B fragments of column tiles dn and dn + 1, V's rows (keys) transposed */\n"
    "                    unsigned vf_[4];\n"
    "                    alloy_ldmatrix_x4_trans(vf_, vt_ + (kk * 16 + ((lane_ >> 3) & 1) * 8 + (lane_ & 7)) * PS_ + (dn + (lane_ >> 4)) * 8);\n"
    "#pragma unroll\n"
    "                    for (int h = 0; h < 2; h++) MMA_(o_[dn + h], pa_, vf_ + 2 * h);\n"
    "                }\n"
    "            }\n"
    "            }\n"
    "            __syncthreads();\n"
    "            if (STAGES_ == 1 && j0_ + TILE_ < blim_) ISSUE_(j0_ + TILE_, 0);\n"
    "        }\n"
    "#undef ISSUE_\n"
    ,
    "        /* each lane summed its own columns: the row's sum is over the 4 lanes of its group */\n"
    "        l0_ += __shfl_xor_sync(0xffffffffu, l0_, 1);\n"
    "        l0_ += __shfl_xor_sync(0xffffffffu, l0_, 2);\n"
    "        l1_ += __shfl_xor_sync(0xffffffffu, l1_, 1);\n"
    "        l1_ += __shfl_xor_sync(0xffffffffu, l1_, 2);\n"
    "        u0_ += __shfl_xor_sync(0xffffffffu, u0_, 1);\n"
    "        u0_ += __shfl_xor_sync(0xffffffffu, u0_, 2);\n"
    "        u1_ += __shfl_xor_sync(0xffffffffu, u1_, 1);\n"
    "        u1_ += __shfl_xor_sync(0xffffffffu, u1_, 2);\n"
    "        /* the rows' logsumexp (log2 units, of the unrounded weights) kept for the backward: -inf where no key */\n"
    "        if (t4_ == 0 && r0_ < T_) PL_[LSEOFF_(bh_) + r0_ * LSEROW_] = u0_ > 0.f ? m0_ + log2f(u0_) : -ALLOY_INF;\n"
    "        if (t4_ == 0 && r1_ < T_) PL_[LSEOFF_(bh_) + r1_ * LSEROW_] = u1_ > 0.f ? m1_ + log2f(u1_) : -ALLOY_INF;\n"
    "        unsigned short *out_ = PO_ + OOFF_(bh_);\n"
    "#pragma unroll\n"
    "        for (int dn = 0; dn < DN_; dn++) {\n"
    "            const int c_ = dn * 8 + 2 * t4_;\n"
    "            if (r0_ < T_)\n"
    "                *(unsigned *)(out_ + (int)r0_ * OROW_ + c_) = (unsigned)TO_(l0_ > 0.f ? o_[dn][0] / l0_ : 0.f) | /* int: rows * OROW_ < 2^31, checked at emit */\n"
    "                                                      (unsigned)TO_(l0_ > 0.f ? o_[dn][1] / l0_ : 0.f) << 16;\n"
    "            if (r1_ < T_)\n"
    "                *(unsigned *)(out_ + (int)r1_ * OROW_ + c_) = (unsigned)TO_(l1_ > 0.f ? o_[dn][2] / l1_ : 0.f) | /* int: rows * OROW_ < 2^31, checked at emit */\n"
    "                                                      (unsigned)TO_(l1_ > 0.f ? o_[dn][3] / l1_ : 0.f) << 16;\n"
    "        }\n"
    "    }\n",
};

void cg_attention_mma_open(cg_text *t, const ir_graph *g, const ir_node *n, const cg_params *ps, const char *name,
                           const attn_strides *st)
{
    const ir_type *q = &g->nodes[n->in[0]]->type;
    int64_t BH = q->dims[0] * q->dims[1], T = q->dims[2], S = g->nodes[n->in[1]]->type.dims[2], D = q->dims[3];
    bool bf = q->dtype == ALLOY_BF16;
    double scale = ir_attr_f(n, "scale");
    cg_put_preamble(t);
    cg_put(t, "%s", mma_defs);
    cg_put(t, "%s", ldmatrix_defs);
    /* at least 2 blocks of MMA_THREADS per SM (up to 255 registers): with the bound alone ptxas held the
     * strided forward to 128 registers and spilled 12-16 bytes at GPT-2's shapes */
    cg_put(t, "\nextern \"C\" __global__ void __launch_bounds__(%d, 2) %s(", MMA_THREADS, name);
    cg_param_list(t, g, ps);
    cg_put(t, ")\n{\n    typedef float T;\n");
    cg_put(t, "    const long long BH_ = %lldll, T_ = %lldll, S_ = %lldll;\n", (long long)BH, (long long)T, (long long)S);
    cg_put(t, "    enum { D_ = %lld, ROWS_ = %d, TILE_ = %d, PS_ = D_ + %d, KS_ = D_ / 16, DN_ = D_ / 8, NT_ = TILE_ / 8 };\n",
           (long long)D, MMA_ROWS, MMA_TILE, MMA_PAD);
    /* the scores in log2 units: exp(scale s - m) = exp2(s SL2 - m') */
    cg_put(t, "    const float SCALE_ = ");
    cg_double(t, (double)(float)scale);
    cg_put(t, ", SL2_ = ");
    cg_double(t, (double)(float)(scale * 1.4426950408889634074));
    cg_put(t, ";\n    (void)SCALE_;\n");
    cg_put(t, "#define MMA_ alloy_mma_m16n8k16_%s\n#define TO_ %s\n#define FROM_ %s\n", bf ? "bf16" : "f16",
           bf ? "alloy_f2bf" : "alloy_f2h", bf ? "alloy_bf2f" : "alloy_h2f");
    if (ir_attr_i(n, "causal") != 0)
        cg_put(t, "#define LIM_(i) ((i) + S_ - T_ + 1 < 0 ? 0ll : (i) + S_ - T_ + 1 > S_ ? S_ : (i) + S_ - T_ + 1)\n");
    else
        cg_put(t, "#define LIM_(i) S_\n");
    /* where each operand of head bh (batch x head) starts and the stride between its rows, in elements,
     * from the operands' layouts: every global address of an operand goes through these */
    cg_attention_strides(t, st);
}

bool cg_attention_mma_close(cg_program *prog, const ir_graph *g, const ir_node *n, int k, const char *name, cg_text *t,
                            cg_params *ps, int64_t rows, int64_t bytes)
{
    cg_put(t, "#undef MMA_\n#undef TO_\n#undef FROM_\n#undef LIM_\n");
    cg_attention_strides_end(t);
    cg_put(t, "}\n");
    const ir_type *q = &g->nodes[n->in[0]]->type;
    int64_t blocks = q->dims[0] * q->dims[1] * ((rows + MMA_ROWS - 1) / MMA_ROWS);
    unsigned grid = (unsigned)(blocks < 1 ? 1 : blocks > CG_MAX_GRID ? CG_MAX_GRID : blocks);
    return !t->oom && cg_add_kernel(prog, g, name, k, STEP_KIND_OP, t, ps, grid, MMA_THREADS, bytes);
}

const char *cg_emit_attention_mma(cg_program *prog, const ir_graph *g, const ir_node *n, int k, const char *name,
                                  const attn_strides *st)
{
    cg_params ps = {0};
    cg_text t = {0};
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int pq = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0), pk = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0),
        pv = cg_param_of(&ps, CG_PARAM_NODE, n->in[2], false, 0);
    const ir_type *qt = &g->nodes[n->in[0]]->type;
    int pl = cg_param_of(&ps, CG_PARAM_KEPT, n->id, true, qt->dims[0] * qt->dims[1] * qt->dims[2]);
    cg_attention_mma_open(&t, g, n, &ps, name, st);
    /* K and V tiles double-buffered where they fit the 48 KB of static shared memory (D_ <= 64) */
    cg_put(&t, "    enum { STAGES_ = D_ <= 64 ? 2 : 1 };\n"
               "    __shared__ alloy_b128 kb_[STAGES_ * TILE_ * PS_ / 8], vb_[STAGES_ * TILE_ * PS_ / 8];\n");
    cg_put(&t, "#define PQ_ p%d\n#define PK_ p%d\n#define PV_ p%d\n#define PO_ p%d\n#define PL_ p%d\n", pq, pk, pv, out, pl);
    for (size_t i = 0; i < sizeof mma_body / sizeof mma_body[0]; i++) cg_put(&t, "%s", mma_body[i]);
    cg_put(&t, "#undef PQ_\n#undef PK_\n#undef PV_\n#undef PO_\n#undef PL_\n");
    int64_t bytes = (int64_t)(ir_nbytes(&n->type) * 2 + 2 * ir_nbytes(&g->nodes[n->in[1]]->type) + 4 * ir_numel(qt) / qt->dims[3]);
    bool ok = cg_attention_mma_close(prog, g, n, k, name, &t, &ps, g->nodes[n->in[0]]->type.dims[2], bytes);
    cg_text_free(&t);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}
