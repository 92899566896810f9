/* cpu_matmul.c - batched matmul with numpy-broadcast batch dims: f32/f64 as pieces of one GEMM per batch on the run's threads, f16/bf16 through the low-precision GEMM; operands read through the strides of the schedule's strided views. */
#include <string.h>

#include "runtime/cpu/cpu.h"
#include "step/attn_views.h"
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

/* The f32/f64 products of one matmul: job j is piece j % parts of batch
 * j / parts, each one gemm_part on whichever thread claims it. */
typedef struct mm_jobs {
    const mm_plan *p;
    gemm_product one; /* batch 0's product */
    int64_t parts;
    size_t esize;
} mm_jobs;

static void mm_job(void *arg, int64_t j, int thread)
{
    (void)thread;
    const mm_jobs *jb = arg;
    const mm_plan *p = jb->p;
    int64_t b = j / jb->parts, off_a = 0, off_b = 0;
    for (int d = p->batch_rank - 1; d >= 0; d--) { /* b walked row-major over batch_dims */
        off_a += b % p->batch_dims[d] * p->stride_a[d];
        off_b += b % p->batch_dims[d] * p->stride_b[d];
        b /= p->batch_dims[d];
    }
    gemm_product q = jb->one;
    q.a = (const char *)q.a + (size_t)off_a * jb->esize;
    q.b = (const char *)q.b + (size_t)off_b * jb->esize;
    q.c = (char *)q.c + (size_t)(j / jb->parts * p->m * p->n) * jb->esize;
    gemm_part(&q, j % jb->parts);
}

/* f32/f64: every batch's pieces (gemm_parts) on up to x->nthreads threads,
 * the threads only where the whole product is worth splitting. */
static void matmul_wide(cpu_exec *x, const mm_plan *p, bool f64, rt_tensor *out, const rt_tensor *in)
{
    mm_jobs jb = {p, {f64, p->trans_a, p->trans_b, p->m, p->n, p->k, p->lda, p->ldb, p->n, 1.0, 0.0, in[0].data,
                      in[1].data, out->data},
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

static alloy_status run_matmul(cpu_exec *x, const ir_node *n, const mm_plan *p, rt_tensor *out, const rt_tensor *in);

static bool strided(const schedule *s, int i)
{
    return s->member_of[i] >= 0 && (s->members[s->member_of[i]].flags & MEMBER_STRIDED);
}

/* A [B, H, R, D] matmul under a schedule that may store its operands or
 * result in another order (step/attn_views.h): the operands are read
 * through their strides while packing; a strided result is computed
 * row-major into a buffer of its own and its rows copied to their places
 * (the same sums, so the same bits as over the copies). */
static alloy_status strided_matmul(cpu_exec *x, const ir_node *n, mm_plan *p, rt_tensor *out, const rt_tensor *in)
{
    const ir_graph *g = x->graph;
    const schedule *s = x->sched;
    for (int j = 0; j < 2; j++) {
        if (!strided(s, n->in[j])) continue;
        attn_stride l = attn_layout_of(g, s, n->in[j]);
        int64_t *st = j ? p->stride_b : p->stride_a;
        st[0] = l.batch, st[1] = l.head;
        *(j ? &p->ldb : &p->lda) = l.row;
    }
    rt_tensor a[2] = {in[0], in[1]};
    for (int j = 0; j < 2; j++)
        if (strided(s, n->in[j]))
            a[j].data = (char *)a[j].data + attn_layout_of(g, s, n->in[j]).base * (int64_t)alloy_dtype_size(a[j].type.dtype);
    if (!strided(s, n->id) || ir_numel(&out->type) == 0) return run_matmul(x, n, p, out, a);
    size_t es = alloy_dtype_size(out->type.dtype), bytes = ir_nbytes(&out->type);
    rt_tensor dense = *out;
    if (!(dense.data = al_malloc(bytes))) {
        char label[32];
        return cpu_fail(x, ALLOY_ERR_OOM, "matmul '%s': out of memory for its strided result",
                        ir_node_label(n, label, sizeof label));
    }
    alloy_status st = run_matmul(x, n, p, &dense, a);
    attn_stride l = attn_layout_of(g, s, n->id);
    const ir_type *t = &out->type;
    int64_t H = t->dims[1], R = t->dims[2], D = t->dims[3];
    for (int64_t b = 0; !st && b < t->dims[0]; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t r = 0; r < R; r++)
                memcpy((char *)out->data + (size_t)(l.base + b * l.batch + h * l.head + r * l.row) * es,
                       (const char *)dense.data + (size_t)(((b * H + h) * R + r) * D) * es, (size_t)D * es);
    al_free(dense.data);
    return st;
}

/* matmul: out[..., M, N] = op(a) op(b) per batch, batch dims broadcast;
 * f32/f64 through gemm_part, f16/bf16 via f32 with one final rounding. */
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
    if (x->graph && x->sched && attn_strided_matmul(x->graph, n)) return strided_matmul(x, n, &p, out, in);
    return run_matmul(x, n, &p, out, in);
}

/* The product of plan p into out. */
static alloy_status run_matmul(cpu_exec *x, const ir_node *n, const mm_plan *p, rt_tensor *out, const rt_tensor *in)
{
    const ir_type *ta = &in[0].type, *to = &out->type;
    if (ir_numel(to) == 0) return ALLOY_OK;
    if (p->k == 0) { /* empty sums: all-zero bytes are +0 in every float dtype */
        memset(out->data, 0, ir_nbytes(to));
        return ALLOY_OK;
    }
    /* f16/bf16 operands go through f32 whatever the result's dtype: a GEMM
     * epilogue group (cpu_groups.c) asks for the unrounded f32 product */
    if (ta->dtype == ALLOY_F16 || ta->dtype == ALLOY_BF16) return matmul_low_precision(x, n, p, out, in);
    switch (to->dtype) {
    case ALLOY_F32:
    case ALLOY_F64:
        matmul_wide(x, p, to->dtype == ALLOY_F64, out, in);
        return ALLOY_OK;
    case ALLOY_F16:
    case ALLOY_BF16:
        return matmul_low_precision(x, n, p, out, in);
    default: {
        char label[32];
        return cpu_fail(x, ALLOY_ERR_UNSUPPORTED, "matmul '%s': dtype %s is not supported",
                        ir_node_label(n, label, sizeof label), alloy_dtype_name(to->dtype));
    }
    }
}
