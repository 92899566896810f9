/* cpu_matmul.c - batched matmul with numpy-broadcast batch dims, one gemm per batch. */
#include <string.h>

#include "runtime/cpu/cpu.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_lowp.h"

/* What one matmul needs: sizes, leading dims and the batch walk. */
typedef struct mm_plan {
    bool trans_a, trans_b;
    int64_t m, n, k, lda, ldb;
    int batch_rank;
    int64_t batch_dims[ALLOY_MAX_RANK];
    int64_t stride_a[ALLOY_MAX_RANK], stride_b[ALLOY_MAX_RANK];
    int64_t batches;
} mm_plan;

/* Calls GEMM (gemm_f32 or gemm_f64) once per batch: a and b are the operands'
 * data in the compute type T, advanced by the plan's strides; c is the dense
 * [batches, m, n] result. */
#define FOR_EACH_BATCH(p, T, a, b, c, GEMM)                                                \
    do {                                                                                   \
        int64_t idx_[ALLOY_MAX_RANK] = {0}, off_a = 0, off_b = 0;                          \
        for (int64_t bi = 0; bi < (p)->batches; bi++) {                                    \
            GEMM((p)->trans_a, (p)->trans_b, (p)->m, (p)->n, (p)->k, (T)1, (a) + off_a,     \
                 (p)->lda, (b) + off_b, (p)->ldb, (T)0, (c) + bi * (p)->m * (p)->n, (p)->n); \
            for (int d = (p)->batch_rank - 1; d >= 0; d--) {                               \
                off_a += (p)->stride_a[d];                                                 \
                off_b += (p)->stride_b[d];                                                 \
                if (++idx_[d] < (p)->batch_dims[d]) break;                                 \
                off_a -= (p)->stride_a[d] * (p)->batch_dims[d];                            \
                off_b -= (p)->stride_b[d] * (p)->batch_dims[d];                            \
                idx_[d] = 0;                                                               \
            }                                                                              \
        }                                                                                  \
    } while (0)

/* f16/bf16 operands: the low-precision GEMM (gemm_lowp.h), summed in f32,
 * the result f32 or rounded once to the output's dtype. */
static alloy_status matmul_low_precision(cpu_exec *x, const ir_node *n, const mm_plan *p,
                                         rt_tensor *out, const rt_tensor *in)
{
    gemm_lowp_args g = {in[0].type.dtype, out->type.dtype, p->trans_a, p->trans_b, p->m, p->n, p->k,
                        p->lda, p->ldb, p->batch_rank, p->batch_dims, p->stride_a, p->stride_b,
                        in[0].data, in[1].data, out->data};
    if (in[1].type.dtype != g.dtype || (g.out_dtype != ALLOY_F32 && g.out_dtype != g.dtype)) {
        char label[32];
        return cpu_fail(x, ALLOY_ERR_UNSUPPORTED, "matmul '%s': %s x %s -> %s is not supported",
                        ir_node_label(n, label, sizeof label), alloy_dtype_name(g.dtype),
                        alloy_dtype_name(in[1].type.dtype), alloy_dtype_name(g.out_dtype));
    }
    if (gemm_lowp(&g, (opt_lowp_gemm)x->lowp_gemm, x->workers, x->nthreads)) {
        char label[32];
        return cpu_fail(x, ALLOY_ERR_OOM, "matmul '%s': out of memory packing the operands",
                        ir_node_label(n, label, sizeof label));
    }
    return ALLOY_OK;
}

/* matmul: out[..., M, N] = op(a) op(b) per batch, batch dims broadcast;
 * f32/f64 straight through gemm, f16/bf16 via f32 with one final rounding. */
alloy_status cpu_matmul(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *ta = &in[0].type, *tb = &in[1].type, *to = &out->type;
    mm_plan p;
    p.trans_a = ir_attr_i(n, "transpose_a") != 0;
    p.trans_b = ir_attr_i(n, "transpose_b") != 0;
    p.m = to->dims[to->rank - 2];
    p.n = to->dims[to->rank - 1];
    p.k = ta->dims[ta->rank - (p.trans_a ? 2 : 1)];
    p.lda = ta->dims[ta->rank - 1];
    p.ldb = tb->dims[tb->rank - 1];
    p.batch_rank = to->rank - 2;
    p.batches = 1;
    for (int d = 0; d < p.batch_rank; d++) {
        p.batch_dims[d] = to->dims[d];
        p.batches *= to->dims[d];
    }
    ir_matmul_batch_strides(ta, p.batch_rank, p.stride_a);
    ir_matmul_batch_strides(tb, p.batch_rank, p.stride_b);

    if (ir_numel(to) == 0) return ALLOY_OK;
    if (p.k == 0) { /* empty sums: all-zero bytes are +0 in every float dtype */
        memset(out->data, 0, ir_nbytes(to));
        return ALLOY_OK;
    }
    /* f16/bf16 operands go through f32 whatever the result's dtype: a GEMM
     * epilogue group (cpu_groups.c) asks for the unrounded f32 product */
    if (ta->dtype == ALLOY_F16 || ta->dtype == ALLOY_BF16) return matmul_low_precision(x, n, &p, out, in);
    switch (to->dtype) {
    case ALLOY_F32:
        FOR_EACH_BATCH(&p, float, (const float *)in[0].data, (const float *)in[1].data,
                       (float *)out->data, gemm_f32);
        return ALLOY_OK;
    case ALLOY_F64:
        FOR_EACH_BATCH(&p, double, (const double *)in[0].data, (const double *)in[1].data,
                       (double *)out->data, gemm_f64);
        return ALLOY_OK;
    case ALLOY_F16:
    case ALLOY_BF16:
        return matmul_low_precision(x, n, &p, out, in);
    default: {
        char label[32];
        return cpu_fail(x, ALLOY_ERR_UNSUPPORTED, "matmul '%s': dtype %s is not supported",
                        ir_node_label(n, label, sizeof label), alloy_dtype_name(to->dtype));
    }
    }
}
