/* cpu_matmul.c - batched matmul with numpy-broadcast batch dims: f32/f64 as pieces of one GEMM per batch on the run's threads, f16/bf16 through the low-precision GEMM; operands read and results written through the strides of the schedule's strided views. */
#include <string.h>

#include "runtime/cpu/cpu.h"
#include "step/attn_views.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/gemm_lowp.h"

/* What one matmul needs: sizes, leading dims and the batch walk: batch b's
 * row i of C starts at sum_d idx_d(b) * stride_c[d] + i * ldc (a dense
 * [batches, m, n] result, or strided_c's). */
typedef struct mm_plan {
    bool trans_a, trans_b, strided_c;
    int64_t m, n, k, lda, ldb, ldc;
    int batch_rank;
    int64_t batch_dims[ALLOY_MAX_RANK];
    int64_t stride_a[ALLOY_MAX_RANK], stride_b[ALLOY_MAX_RANK], stride_c[ALLOY_MAX_RANK];
    int64_t batches;
} mm_plan;

/* The f32/f64 products of one matmul: job j is piece j % parts of batch
 * j / parts, each one gemm_part on whichever thread claims it. */
typedef struct mm_jobs {
    const mm_plan *p;
    gemm_product one; /* batch 0's product */
    int64_t parts;    /* per batch */
    size_t esize;
} mm_jobs;

static void mm_job(void *arg, int64_t j, int thread)
{
    (void)thread;
    const mm_jobs *jb = arg;
    const mm_plan *p = jb->p;
    int64_t b = j / jb->parts, off_a = 0, off_b = 0, off_c = 0;
    for (int d = p->batch_rank - 1; d >= 0; d--) { /* b walked row-major over batch_dims */
        off_a += b % p->batch_dims[d] * p->stride_a[d];
        off_b += b % p->batch_dims[d] * p->stride_b[d];
        off_c += b % p->batch_dims[d] * p->stride_c[d];
        b /= p->batch_dims[d];
    }
    gemm_product q = jb->one;
    q.a = (const char *)q.a + (size_t)off_a * jb->esize;
    q.b = (const char *)q.b + (size_t)off_b * jb->esize;
    q.c = (char *)q.c + (size_t)off_c * jb->esize;
    gemm_part(&q, j % jb->parts);
}

/* f32/f64: every batch's pieces (gemm_parts) on up to x->nthreads threads,
 * the threads only where the whole product is worth splitting. */
static void matmul_wide(cpu_exec *x, const mm_plan *p, bool f64, rt_tensor *out, const rt_tensor *in)
{
    mm_jobs jb = {p, {f64, p->trans_a, p->trans_b, p->m, p->n, p->k, p->lda, p->ldb, p->strided_c ? p->ldc : p->n, 1.0,
                      0.0, in[0].data, in[1].data, out->data},
                  0, f64 ? sizeof(double) : sizeof(float)};
    jb.parts = gemm_parts(&jb.one);
    int64_t jobs = p->batches * jb.parts;
    double macs = (double)p->batches * (double)p->m * (double)p->n * (double)p->k;
    int threads = 1;
    if (x->workers && x->nthreads > 1 && jobs > 1 && macs >= (double)GEMM_PAR_MIN_MACS)
        threads = cpu_workers_threads(x->workers, jobs < x->nthreads ? (int)jobs : x->nthreads);
    cpu_workers_run(x->workers, threads, jobs, mm_job, &jb);
}

/* f16/bf16 operands: the low-precision GEMM (gemm_lowp.h), summed in f32,
 * the result f32 or rounded once to the output's dtype. */
static alloy_status matmul_low_precision(cpu_exec *x, const ir_node *n, const mm_plan *p, rt_tensor *out,
                                         const rt_tensor *in, const gemm_lowp_epilogue *epi)
{
    gemm_lowp_args g = {in[0].type.dtype, out->type.dtype, p->trans_a, p->trans_b, p->m, p->n, p->k,
                        p->lda, p->ldb, p->batch_rank, p->batch_dims, p->stride_a, p->stride_b,
                        in[0].data, in[1].data, out->data, p->strided_c ? p->stride_c : NULL, p->ldc};
    if (in[1].type.dtype != g.dtype || (g.out_dtype != ALLOY_F32 && g.out_dtype != g.dtype)) {
        char label[32];
        return cpu_fail(x, ALLOY_ERR_UNSUPPORTED, "matmul '%s': %s x %s -> %s is not supported",
                        ir_node_label(n, label, sizeof label), alloy_dtype_name(g.dtype),
                        alloy_dtype_name(in[1].type.dtype), alloy_dtype_name(g.out_dtype));
    }
    if (gemm_lowp_epi(&g, epi, (opt_lowp_gemm)x->lowp_gemm, x->workers, x->nthreads)) {
        char label[32];
        return cpu_fail(x, ALLOY_ERR_OOM, "matmul '%s': out of memory packing the operands",
                        ir_node_label(n, label, sizeof label));
    }
    return ALLOY_OK;
}

static alloy_status run_matmul(cpu_exec *x, const ir_node *n, const mm_plan *p, rt_tensor *out, const rt_tensor *in,
                               const gemm_lowp_epilogue *epi);

static bool strided(const schedule *s, int i)
{
    return s->member_of[i] >= 0 && (s->members[s->member_of[i]].flags & MEMBER_STRIDED);
}

/* A [B, H, R, D] matmul under a schedule that may store its operands or
 * result in another order (step/attn_views.h): the operands are read
 * through their strides while packing, a strided result written through
 * its own (row stride and two batch strides) by the GEMM: the same sums
 * as over contiguous copies, so the same bits, with no copy. */
static alloy_status strided_matmul(cpu_exec *x, const ir_node *n, mm_plan *p, rt_tensor *out, const rt_tensor *in)
{
    const ir_graph *g = x->graph;
    const schedule *s = x->sched;
    rt_tensor a[3] = {in[0], in[1], *out};
    for (int j = 0; j < 3; j++) {
        int id = j < 2 ? n->in[j] : n->id;
        if (!strided(s, id)) continue;
        attn_stride l = attn_layout_of(g, s, id);
        int64_t *st = j == 0 ? p->stride_a : j == 1 ? p->stride_b : p->stride_c;
        st[0] = l.batch, st[1] = l.head;
        *(j == 0 ? &p->lda : j == 1 ? &p->ldb : &p->ldc) = l.row;
        a[j].data = (char *)a[j].data + l.base * (int64_t)alloy_dtype_size(a[j].type.dtype);
    }
    p->strided_c = strided(s, n->id);
    return run_matmul(x, n, p, &a[2], a, NULL);
}

/* The mm_plan of matmul n of in into out. */
static void plan_of(const ir_node *n, const rt_tensor *out, const rt_tensor *in, mm_plan *p);

/* matmul: out[..., M, N] = op(a) op(b) per batch, batch dims broadcast;
 * f32/f64 through gemm_part, f16/bf16 via f32 with one final rounding. */
alloy_status cpu_matmul(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    mm_plan p;
    plan_of(n, out, in, &p);
    if (x->graph && x->sched && attn_strided_matmul(x->graph, n)) return strided_matmul(x, n, &p, out, in);
    return run_matmul(x, n, &p, out, in, NULL);
}

alloy_status cpu_matmul_epilogue(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in,
                                 const gemm_lowp_epilogue *epi)
{
    mm_plan p;
    plan_of(n, out, in, &p);
    bool low = in[0].type.dtype == ALLOY_F16 || in[0].type.dtype == ALLOY_BF16;
    if (!low || out->type.dtype != in[0].type.dtype || p.k == 0 || (x->graph && x->sched && attn_strided_matmul(x->graph, n))) {
        char label[32];
        return cpu_fail(x, ALLOY_ERR_INVALID, "matmul '%s': no epilogue in its tiles (%s into %s, k %lld)",
                        ir_node_label(n, label, sizeof label), alloy_dtype_name(in[0].type.dtype),
                        alloy_dtype_name(out->type.dtype), (long long)p.k);
    }
    return run_matmul(x, n, &p, out, in, epi);
}

static void plan_of(const ir_node *n, const rt_tensor *out, const rt_tensor *in, mm_plan *p)
{
    const ir_type *ta = &in[0].type, *tb = &in[1].type, *to = &out->type;
    p->trans_a = ir_attr_i(n, "transpose_a") != 0;
    p->trans_b = ir_attr_i(n, "transpose_b") != 0;
    p->m = to->dims[to->rank - 2];
    p->n = to->dims[to->rank - 1];
    p->k = ta->dims[ta->rank - (p->trans_a ? 2 : 1)];
    p->lda = ta->dims[ta->rank - 1];
    p->ldb = tb->dims[tb->rank - 1];
    p->strided_c = false;
    p->ldc = p->n;
    p->batch_rank = to->rank - 2;
    p->batches = 1;
    for (int d = 0; d < p->batch_rank; d++) {
        p->batch_dims[d] = to->dims[d];
        p->batches *= to->dims[d];
    }
    ir_matmul_batch_strides(ta, p->batch_rank, p->stride_a);
    ir_matmul_batch_strides(tb, p->batch_rank, p->stride_b);
    /* the dense result's (strided_matmul sets a strided one's) */
    for (int64_t d = p->batch_rank - 1, step = p->m * p->n; d >= 0; step *= p->batch_dims[d], d--)
        p->stride_c[d] = step;
}

/* The product of plan p into out. */
static alloy_status run_matmul(cpu_exec *x, const ir_node *n, const mm_plan *p, rt_tensor *out, const rt_tensor *in,
                               const gemm_lowp_epilogue *epi)
{
    const ir_type *ta = &in[0].type, *to = &out->type;
    if (ir_numel(to) == 0) return ALLOY_OK;
    /* empty sums: all-zero bytes are +0 in every float dtype (a strided
     * result gets its zeros from the GEMMs, row by row) */
    if (p->k == 0 && !p->strided_c) {
        memset(out->data, 0, ir_nbytes(to));
        return ALLOY_OK;
    }
    /* f16/bf16 operands go through f32 whatever the result's dtype: a GEMM
     * epilogue group (cpu_groups.c) asks for the unrounded f32 product */
    if (ta->dtype == ALLOY_F16 || ta->dtype == ALLOY_BF16) return matmul_low_precision(x, n, p, out, in, epi);
    switch (to->dtype) {
    case ALLOY_F32:
    case ALLOY_F64:
        matmul_wide(x, p, to->dtype == ALLOY_F64, out, in);
        return ALLOY_OK;
    case ALLOY_F16:
    case ALLOY_BF16:
        return matmul_low_precision(x, n, p, out, in, NULL);
    default: {
        char label[32];
        return cpu_fail(x, ALLOY_ERR_UNSUPPORTED, "matmul '%s': dtype %s is not supported",
                        ir_node_label(n, label, sizeof label), alloy_dtype_name(to->dtype));
    }
    }
}
