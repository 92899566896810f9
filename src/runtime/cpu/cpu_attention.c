/* cpu_attention.c - attention and attention_grad: blockwise online softmax per (batch, head) on the worker threads, never storing the score matrix. */
#include <math.h>
#include <string.h>

#include "base/convert.h"
#include "runtime/cpu/cpu.h"
#include "step/attn_views.h"

/* Rows and columns of a score block. */
enum { BR = 32, BC = 64 };

/* One op's problem: q [B, H, T, D], k and v [B, H, S, D]. */
typedef struct attn_shape {
    int64_t B, H, T, S, D;
    bool causal;
    double scale;
} attn_shape;

#define C float
#define SFX _f32
#include "runtime/cpu/cpu_attention_impl.h"
#undef C
#undef SFX
#define C double
#define SFX _f64
#include "runtime/cpu/cpu_attention_impl.h"
#undef C
#undef SFX

/* What every (batch, head) job reads: the op's operands and result, and a
 * scratch of `per_thread` compute elements per thread. */
typedef struct attn_job {
    attn_shape a;
    attn_strides st; /* where each operand's rows lie (contiguous unless the schedule made views) */
    bool grad, wide;
    alloy_dtype dt;
    const rt_tensor *in;
    rt_tensor *out;
    char *scratch;
    int64_t per_thread;
} attn_job;

/* The compute elements one (batch, head) needs: q, k, v, k transposed (and
 * v transposed, o, do, dq, dk, dv for the backward), two score blocks and
 * two per-row vectors. */
static int64_t scratch_elems(const attn_shape *a, bool grad)
{
    int64_t tensors = grad ? 3 * a->T * a->D + 6 * a->S * a->D : a->T * a->D + 3 * a->S * a->D;
    return tensors + a->T * a->D + 2 * BR * BC + 2 * a->T;
}

/* Element offset of (batch, head) bh's first row in layout l. */
static int64_t head_at(const attn_job *j, const attn_stride *l, int64_t bh)
{
    return l->base + bh / j->st.H * l->batch + bh % j->st.H * l->head;
}

/* Loads `rows` rows of D elements of (batch, head) bh in layout l of src to the compute type at dst. */
static void load_rows(const attn_job *j, const void *src, const attn_stride *l, int64_t bh, int64_t rows, void *dst)
{
    size_t es = alloy_dtype_size(j->dt), cs = j->wide ? sizeof(double) : sizeof(float);
    int64_t at = head_at(j, l, bh), D = j->a.D;
    for (int64_t t = 0; t < rows; t++)
        cpu_load_compute(j->wide, j->dt, (const char *)src + (size_t)(at + t * l->row) * es, (char *)dst + (size_t)(t * D) * cs, D);
}

/* Stores `rows` rows of D compute elements at src, rounded, into (batch, head) bh in layout l of dst. */
static void store_rows(const attn_job *j, const void *src, const attn_stride *l, int64_t bh, int64_t rows, void *dst)
{
    size_t es = alloy_dtype_size(j->dt), cs = j->wide ? sizeof(double) : sizeof(float);
    int64_t at = head_at(j, l, bh), D = j->a.D;
    for (int64_t t = 0; t < rows; t++)
        cpu_store_compute(j->wide, j->dt, (const char *)src + (size_t)(t * D) * cs, (char *)dst + (size_t)(at + t * l->row) * es, D);
}

/* Runs (batch, head) `block` on thread `thread`: loads its slices to the
 * compute type, runs the forward or backward, stores rounded once. */
static void attn_block(void *arg, int64_t block, int thread)
{
    attn_job *j = arg;
    const attn_shape *a = &j->a;
    size_t cs = j->wide ? sizeof(double) : sizeof(float);
    int64_t td = a->T * a->D, sd = a->S * a->D;
    char *base = j->scratch + (size_t)thread * (size_t)j->per_thread * cs;
    char *at = base;
#define TAKE(n) (at += (size_t)(n) * cs, at - (size_t)(n) * cs)
    void *q = TAKE(td), *k = TAKE(sd), *v = TAKE(sd);
    load_rows(j, j->in[0].data, &j->st.q, block, a->T, q);
    load_rows(j, j->in[1].data, &j->st.k, block, a->S, k);
    load_rows(j, j->in[2].data, &j->st.v, block, a->S, v);
    void *s = TAKE(BR * BC), *dp = TAKE(BR * BC), *lse = TAKE(a->T), *delta = TAKE(a->T), *kt = TAKE(sd);
    if (j->wide) transpose_f64(k, a->S, a->D, kt);
    else transpose_f32(k, a->S, a->D, kt);
    if (!j->grad) {
        void *o = TAKE(td);
        if (j->wide) forward_f64(a, q, kt, v, o, lse, s);
        else forward_f32(a, q, kt, v, o, lse, s);
        store_rows(j, o, &j->st.o, block, a->T, j->out->data);
        return;
    }
    void *o = TAKE(td), *dout = TAKE(td), *dq = TAKE(td), *dk = TAKE(sd), *dv = TAKE(sd), *vt = TAKE(sd);
#undef TAKE
    if (j->wide) transpose_f64(v, a->S, a->D, vt);
    else transpose_f32(v, a->S, a->D, vt);
    load_rows(j, j->in[3].data, &j->st.o, block, a->T, o);
    load_rows(j, j->in[4].data, &j->st.dout, block, a->T, dout);
    if (j->wide) backward_f64(a, q, k, kt, vt, o, dout, dq, dk, dv, lse, delta, s, dp);
    else backward_f32(a, q, k, kt, vt, o, dout, dq, dk, dv, lse, delta, s, dp);
    store_rows(j, dq, &j->st.dq, block, a->T, j->out->data);
    store_rows(j, dk, &j->st.dk, block, a->S, j->out->data);
    store_rows(j, dv, &j->st.dv, block, a->S, j->out->data);
}

/* Both ops: the (batch, head) pairs split over up to x->nthreads workers,
 * each with its own scratch; f32 compute for f32/f16/bf16 (rounded once on
 * store), f64 for f64. Rows that see no column (causal with T > S) give 0. */
static alloy_status run(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in, bool grad)
{
    const ir_type *qt = &in[0].type;
    attn_job j = {.a = {qt->dims[0], qt->dims[1], qt->dims[2], in[1].type.dims[2], qt->dims[3],
                        ir_attr_i(n, "causal") != 0, ir_attr_f(n, "scale")},
                  .grad = grad, .wide = qt->dtype == ALLOY_F64, .dt = qt->dtype, .in = in, .out = out};
    if (x->graph && x->sched) attn_strides_of(x->graph, x->sched, n, &j.st);
    else attn_strides_plain(j.a.H, j.a.T, j.a.S, j.a.D, &j.st);
    int64_t pairs = j.a.B * j.a.H;
    if (pairs == 0 || j.a.T == 0 || j.a.S == 0 || j.a.D == 0) { /* no query, key or feature: every result is 0 */
        memset(out->data, 0, (size_t)ir_numel(&out->type) * alloy_dtype_size(out->type.dtype));
        return ALLOY_OK;
    }
    int want = x->nthreads < pairs ? x->nthreads : (int)pairs;
    int threads = x->workers && want > 1 ? cpu_workers_threads(x->workers, want) : 1;
    j.per_thread = scratch_elems(&j.a, grad);
    j.scratch = al_malloc((size_t)threads * (size_t)j.per_thread * (j.wide ? sizeof(double) : sizeof(float)));
    if (!j.scratch) return cpu_out_of_memory(x, n);
    cpu_workers_run(x->workers, threads, pairs, attn_block, &j);
    al_free(j.scratch);
    return ALLOY_OK;
}

/* attention(q, k, v): the contract is in ops.def and docs/ir.md. */
alloy_status cpu_attention(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    return run(x, n, out, in, false);
}

/* attention_grad(q, k, v, o, do) -> [dq; dk; dv] along axis 2. */
alloy_status cpu_attention_grad(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    return run(x, n, out, in, true);
}
