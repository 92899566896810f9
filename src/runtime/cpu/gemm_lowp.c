/* gemm_lowp.c - the f16/bf16 GEMM's driver: kernel choice, packing (with conversion), cache blocks over threads, the portable kernel. */
#include "runtime/cpu/gemm_lowp.h"

#include <math.h>
#include <string.h>

#include "base/convert.h"
#include "base/vmath.h"
#include "runtime/cpu/gemm.h"

/* The hot loop pinned to -O2 with the vectorizer, as in gemm.c: -O3
 * vectorizes the wrong loop of the micro-kernel and spills. */
#if defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((optimize("O2", "tree-vectorize")))
#else
#define HOT
#endif

/* Below this many multiply-adds one thread does it all (gemm.c measured
 * where a second thread starts to pay). Threads take whole tiles of
 * MC_ROWS x NC_COLS (rounded to the kernel's tile), which also bound the
 * f32 buffer a low-precision result is summed in; packing goes by groups
 * of PACK_STRIPS strips. A bf16 A is read in place
 * (not packed) where C has at most A_IN_PLACE_STRIPS strips of columns;
 * an operand one tile reads alone, BY_TILE_BYTES or more packed, is
 * packed by that tile a k block at a time. */
#define PAR_MIN_MACS ((int64_t)128 * 128 * 128)
enum {
    MAX_THREADS = 64,
    MC_ROWS = 112,
    NC_COLS = 256,
    PACK_STRIPS = 8,
    ALIGN = 64,
    A_IN_PLACE_STRIPS = 4,
    BY_TILE_BYTES = 256 << 10
};

static int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }
static int64_t cdiv(int64_t x, int64_t y) { return (x + y - 1) / y; }

/* ---- the portable kernel: C on f32 panels, 6 x 8 (12 SSE accumulators) ---- */

enum { P_MR = 6, P_NR = 8 };

HOT static void tile_portable(int64_t kunits, const void *pa, const void *pb, float *c, int64_t ldc,
                              int mr, int nr, bool add)
{
    const float *a = pa, *b = pb;
    float acc[P_MR][P_NR] = {{0.0f}};
    for (int64_t p = 0; p < kunits; p++) {
        const float *ap = a + p * P_MR, *bp = b + p * P_NR;
#pragma GCC unroll 8
        for (int i = 0; i < P_MR; i++) {
            float ai = ap[i];
            for (int j = 0; j < P_NR; j++) acc[i][j] += ai * bp[j];
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) c[i * ldc + j] = add ? c[i * ldc + j] + acc[i][j] : acc[i][j];
}

static const lowp_kernel k_portable = {P_MR, P_NR, 1, 4, 384, tile_portable, NULL, NULL, NULL, NULL, NULL};

/* ---- choosing ---- */

opt_lowp_gemm gemm_lowp_kernel(alloy_dtype dt, opt_lowp_gemm asked)
{
    if (asked == OPT_LOWP_AUTO) {
        if (gemm_lowp_x86_has(OPT_LOWP_AVX512_BF16, dt)) return OPT_LOWP_AVX512_BF16;
        if (gemm_lowp_x86_has(OPT_LOWP_AVX512, dt)) return OPT_LOWP_AVX512;
        /* without AVX-512: avx2 (operands converted while packing) ran
         * char_gpt's f16 and bf16 steps in 3-6% less CPU time than the
         * BLAS on operands converted first, on a CPU without AVX-512
         * (bench/RESULTS.md, "An AVX2-only CPU") */
        if (gemm_lowp_x86_has(OPT_LOWP_AVX2, dt)) return OPT_LOWP_AVX2;
        return OPT_LOWP_SGEMM;
    }
    if (asked == OPT_LOWP_AVX512_BF16 && !gemm_lowp_x86_has(asked, dt)) asked = OPT_LOWP_AVX512;
    if (asked == OPT_LOWP_AVX512 && !gemm_lowp_x86_has(asked, dt)) asked = OPT_LOWP_AVX2;
    if (asked == OPT_LOWP_AVX2 && !gemm_lowp_x86_has(asked, dt)) asked = OPT_LOWP_PORTABLE;
    return asked;
}

const char *gemm_lowp_kernel_name(opt_lowp_gemm k)
{
    static const char *const names[OPT_LOWP_COUNT] = {"auto", "avx512_bf16", "avx512", "portable", "sgemm", "avx2"};
    return k >= 0 && k < OPT_LOWP_COUNT ? names[k] : "?";
}

/* ---- packing ---- */

static uint32_t load_pair(const uint16_t *p, bool both)
{
    uint16_t lo = p[0], hi = both ? p[1] : 0;
    return (uint32_t)lo | (uint32_t)hi << 16;
}

/* bf16 kept as bf16, two k per 32-bit unit: dst[(p * R + r)] = op(X)(r,
 * 2p..2p+1), for units p0 <= p < p1. */
static void pack_pairs(const strip_src *s, int R, int64_t p0, int64_t p1, uint32_t *restrict dst)
{
    if (s->ks == 1) { /* k contiguous: each row's pairs are 32-bit words */
        for (int64_t r = 0; r < s->rows; r++) {
            const uint16_t *row = s->base + r * s->rs;
            int64_t p = p0;
            for (; p < p1 && 2 * p + 1 < s->k; p++) dst[p * R + r] = load_pair(row + 2 * p, true);
            if (p < p1 && 2 * p < s->k) dst[p * R + r] = load_pair(row + 2 * p, false), p++;
            for (; p < p1; p++) dst[p * R + r] = 0;
        }
    } else { /* r contiguous: two rows of k interleaved */
        for (int64_t p = p0; p < p1; p++) {
            uint16_t *d = (uint16_t *)(dst + p * R);
            const uint16_t *k0 = 2 * p < s->k ? s->base + 2 * p * s->ks : NULL;
            if (2 * p + 1 < s->k)
                for (int64_t r = 0; r < s->rows; r++) d[2 * r] = k0[r], d[2 * r + 1] = k0[s->ks + r];
            else if (k0) /* k odd: the last pair's second half is 0 */
                for (int64_t r = 0; r < s->rows; r++) d[2 * r] = k0[r], d[2 * r + 1] = 0;
            else
                memset(d, 0, sizeof(uint32_t) * (size_t)s->rows);
        }
    }
    if (s->rows < R)
        for (int64_t p = p0; p < p1; p++) memset(dst + p * R + s->rows, 0, sizeof(uint32_t) * (size_t)(R - s->rows));
}

/* f16/bf16 converted to f32: dst[p * R + r] = op(X)(r, p), for p0 <= p < p1. */
static void pack_f32(const strip_src *s, int R, int64_t p0, int64_t p1, float *restrict dst)
{
    if (s->ks == 1) { /* k contiguous: convert a run of a row, then scatter it */
        enum { RUN = 256 };
        float run[RUN];
        for (int64_t r = 0; r < s->rows; r++)
            for (int64_t q = p0; q < p1; q += RUN) {
                int64_t len = min64(RUN, p1 - q);
                cvt_load_f32(s->dt, s->base + r * s->rs + q, run, (size_t)len);
                for (int64_t p = 0; p < len; p++) dst[(q + p) * R + r] = run[p];
            }
    } else {
        for (int64_t p = p0; p < p1; p++) cvt_load_f32(s->dt, s->base + p * s->ks, dst + p * R, (size_t)s->rows);
    }
    if (s->rows < R)
        for (int64_t p = p0; p < p1; p++) memset(dst + p * R + s->rows, 0, sizeof(float) * (size_t)(R - s->rows));
}

/* ---- bench-only: per-shape CPU time (built with -DALLOY_GEMM_PROFILE) ---- */

#ifdef ALLOY_GEMM_PROFILE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* One row per distinct product: the calling thread's CPU seconds in the
 * pack and tile phases (meaningful at 1 thread; an operand packed by its
 * tile counts in the tile phase), printed at exit to
 * stderr. Not thread-safe: a profiling build's 1-thread runs only. */
typedef struct prof_row {
    int64_t m, n, k, batches;
    bool ta, tb, bcast_a, bcast_b;
    alloy_dtype out;
    int64_t calls;
    double pack_s, tile_s;
} prof_row;
enum { PROF_ROWS = 128 };
static prof_row prof[PROF_ROWS];
static int nprof;

static double prof_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void prof_print(void)
{
    fprintf(stderr, "gemm_lowp profile: m n k batches ta tb bcast_a bcast_b out calls pack_ms tile_ms\n");
    for (int i = 0; i < nprof; i++) {
        const prof_row *p = &prof[i];
        fprintf(stderr, "gemm_lowp profile: %lld %lld %lld %lld %d %d %d %d %s %lld %.3f %.3f\n", (long long)p->m,
                (long long)p->n, (long long)p->k, (long long)p->batches, p->ta, p->tb, p->bcast_a, p->bcast_b,
                alloy_dtype_name(p->out), (long long)p->calls, 1e3 * p->pack_s, 1e3 * p->tile_s);
    }
}

static prof_row *prof_find(const gemm_lowp_args *g, int64_t batches, bool bca, bool bcb)
{
    for (int i = 0; i < nprof; i++) {
        prof_row *p = &prof[i];
        if (p->m == g->m && p->n == g->n && p->k == g->k && p->batches == batches && p->ta == g->ta &&
            p->tb == g->tb && p->bcast_a == bca && p->bcast_b == bcb && p->out == g->out_dtype)
            return p;
    }
    if (nprof == PROF_ROWS) return NULL;
    if (nprof == 0) atexit(prof_print);
    prof[nprof] = (prof_row){g->m, g->n, g->k, batches, g->ta, g->tb, bca, bcb, g->out_dtype, 0, 0.0, 0.0};
    return &prof[nprof++];
}
#endif

/* ---- one run ---- */

typedef struct lowp_run {
    const gemm_lowp_args *g;
    const gemm_lowp_epilogue *epi; /* NULL: none */
    const lowp_kernel *kern;
    int64_t batches;
    int64_t a_copies, b_copies;  /* packed copies of A, B: batches, 1 when broadcast to all, 0 in place */
    int64_t kunits;              /* k in kernel units, rounded up */
    int64_t mstrips, nstrips;    /* per copy */
    size_t a_strip, b_strip;     /* bytes of one packed strip */
    int64_t a_groups, b_groups;  /* pack jobs per copy */
    bool a_in_place;             /* A read where it is by the kernel: not packed */
    bool a_by_tile, b_by_tile;   /* packed by the tile that reads it, one k block at a time (see tile_job) */
    size_t a_block, b_block;     /* bytes of one strip of a k block so packed */
    int64_t mc, nc, mblocks, nblocks;
    char *apack, *bpack;
    char *tpack;                 /* per thread: a k block's A strips then B strips, those packed by tile */
    size_t tpack_bytes;          /* per thread */
    int64_t ldt;                 /* row stride of a tile buffer */
    float *ctile;                /* per thread: mc x ldt, a tile's sums */
} lowp_run;

/* Element offset of batch b of an operand with these strides. */
static int64_t batch_offset(const gemm_lowp_args *g, const int64_t *stride, int64_t b)
{
    int64_t off = 0;
    for (int d = g->batch_rank - 1; d >= 0; d--) {
        off += b % g->batch_dims[d] * stride[d];
        b /= g->batch_dims[d];
    }
    return off;
}

/* C's row stride, and the element offset of row i of batch b's C (dense,
 * or placed by stride_c and ldc). */
static int64_t c_ld(const gemm_lowp_args *g) { return g->stride_c ? g->ldc : g->n; }

static int64_t c_row(const gemm_lowp_args *g, int64_t b, int64_t i)
{
    return g->stride_c ? batch_offset(g, g->stride_c, b) + i * g->ldc : (b * g->m + i) * g->n;
}

static bool all_zero(const int64_t *v, int n)
{
    for (int i = 0; i < n; i++)
        if (v[i]) return false;
    return true;
}

/* Units [u0, u1) of one strip of one copy of A or B, op(X)'s k counted
 * from kfirst (a k block packed by its tile: units from its start), into
 * dst. */
static void pack_strip_to(const lowp_run *r, bool is_a, int64_t copy, int64_t strip, int64_t kfirst, int64_t u0,
                          int64_t u1, char *dst)
{
    const gemm_lowp_args *g = r->g;
    const lowp_kernel *kn = r->kern;
    int R = is_a ? kn->mr : kn->nr;
    int64_t len = is_a ? g->m : g->n, r0 = strip * R;
    int64_t off = batch_offset(g, is_a ? g->stride_a : g->stride_b, copy);
    const uint16_t *x = (const uint16_t *)(is_a ? g->a : g->b) + off;
    strip_src s = {g->dtype, NULL, 0, 0, min64(R, len - r0), g->k - kfirst, len - r0};
    if (is_a) { /* op(A)(i, kk) = a[i * lda + kk], or a[kk * lda + i] */
        s.rs = g->ta ? 1 : g->lda, s.ks = g->ta ? g->lda : 1;
    } else {    /* op(B)(kk, j) = b[kk * ldb + j], or b[j * ldb + kk] */
        s.rs = g->tb ? g->ldb : 1, s.ks = g->tb ? 1 : g->ldb;
    }
    s.base = x + r0 * s.rs + kfirst * s.ks;
    int64_t done = kn->pack ? kn->pack(&s, R, u0, u1, dst) : u0;
    if (done >= u1) return;
    if (kn->ku == 2) pack_pairs(&s, R, done, u1, (uint32_t *)(void *)dst);
    else pack_f32(&s, R, done, u1, (float *)(void *)dst);
}

/* Units [u0, u1) of one strip of one copy of A or B, into its panel. */
static void pack_strip(const lowp_run *r, bool is_a, int64_t copy, int64_t strip, int64_t u0, int64_t u1)
{
    char *dst = (is_a ? r->apack + (size_t)copy * (size_t)r->mstrips * r->a_strip
                      : r->bpack + (size_t)copy * (size_t)r->nstrips * r->b_strip) +
                (size_t)strip * (is_a ? r->a_strip : r->b_strip);
    pack_strip_to(r, is_a, copy, strip, 0, u0, u1, dst);
}

/* Pack job j: PACK_STRIPS strips of one copy of A (the first jobs) or B.
 * Where a strip's rows are contiguous in k each strip goes whole; else the
 * strips go UNITS_AT_ONCE units at a time, so that every row of op(X)
 * read is read along all the job's strips at once. */
static void pack_job(void *arg, int64_t j, int thread)
{
    (void)thread;
    enum { UNITS_AT_ONCE = 16 };
    const lowp_run *r = arg;
    const gemm_lowp_args *g = r->g;
    bool is_a = j < r->a_copies * r->a_groups;
    if (!is_a) j -= r->a_copies * r->a_groups;
    int64_t groups = is_a ? r->a_groups : r->b_groups, strips = is_a ? r->mstrips : r->nstrips;
    int64_t copy = j / groups, s0 = j % groups * PACK_STRIPS, s1 = min64(s0 + PACK_STRIPS, strips);
    bool k_rows = is_a ? !g->ta : g->tb;
    int64_t step = k_rows ? r->kunits : UNITS_AT_ONCE;
    for (int64_t u0 = 0; u0 < r->kunits; u0 += step)
        for (int64_t s = s0; s < s1; s++) pack_strip(r, is_a, copy, s, u0, min64(u0 + step, r->kunits));
}

/* c[0..n): the range rule of `before` (fz_range_copy_f32's select), then
 * + bias[i] in f32 (bias NULL: none), then the rule of `after`, in one pass. */
static CPU_VECTOR_CLONES void range_add_row(float *restrict c, const float *restrict bias, float before, float after,
                                            int64_t n)
{
    if (!bias) {
        for (int64_t i = 0; i < n; i++) c[i] = fabsf(c[i]) >= before ? copysignf(INFINITY, c[i]) : c[i];
        return;
    }
    if (after == INFINITY) { /* no rule after the add: one select less */
        for (int64_t i = 0; i < n; i++) {
            float v = fabsf(c[i]) >= before ? copysignf(INFINITY, c[i]) : c[i];
            c[i] = v + bias[i];
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float v = fabsf(c[i]) >= before ? copysignf(INFINITY, c[i]) : c[i];
        v = v + bias[i];
        c[i] = fabsf(v) >= after ? copysignf(INFINITY, v) : v;
    }
}

/* Row of n sums c (f32) of a tile into C's row out: epi's steps (bias[0..n)
 * and sum_out the row's columns, NULL where epi has none), in f32, then
 * rounded once into C's dtype (cvt_store_f32); n at most NC_COLS. */
static void epilogue_row(const gemm_lowp_epilogue *epi, alloy_dtype dt, float *c, const float *bias, void *sum_out,
                         void *out, int64_t n)
{
    /* a last member's range rule is its store's rounding to inf already: only a value read on is ranged */
    if (epi->range != ALLOY_F32 || bias)
        range_add_row(c, bias, cvt_inf_bound_f32(epi->range), cvt_inf_bound_f32(epi->act ? epi->bias_range : ALLOY_F32), n);
    if (sum_out) cvt_store_f32(dt, c, sum_out, (size_t)n);
    if (epi->act) {
        float y[NC_COLS];
        for (int64_t i0 = 0; i0 < n; i0 += NC_COLS) { /* the chunk function needs y apart from its operand */
            int64_t len = n - i0 < NC_COLS ? n - i0 : NC_COLS;
            epi->act(len, y, c + i0, c + i0, c + i0, NULL);
            memcpy(c + i0, y, sizeof(float) * (size_t)len);
        }
    }
    cvt_store_f32(dt, c, out, (size_t)n);
}

/* Whether tiles are summed straight into C (see tile_job). */
static bool direct_c(const gemm_lowp_args *g) { return g->out_dtype == ALLOY_F32 && c_ld(g) % 1024 != 0; }

/* Tile job t: rows [i0, i0+mc) x columns [j0, j0+nc) of one batch's C,
 * k block by k block, B strip by B strip (in L1), A strip by A strip. */
static void tile_job(void *arg, int64_t t, int thread)
{
    const lowp_run *r = arg;
    const gemm_lowp_args *g = r->g;
    const lowp_kernel *kn = r->kern;
    int64_t per_batch = r->mblocks * r->nblocks, b = t / per_batch;
    int64_t ib = t % per_batch / r->nblocks, jb = t % per_batch % r->nblocks;
    int64_t i0 = ib * r->mc, j0 = jb * r->nc, mc = min64(r->mc, g->m - i0), nc = min64(r->nc, g->n - j0);
    const char *ap = r->apack + (size_t)(r->a_copies > 1 ? b : 0) * (size_t)r->mstrips * r->a_strip +
                     (size_t)(i0 / kn->mr) * r->a_strip;
    const char *bp = r->bpack + (size_t)(r->b_copies > 1 ? b : 0) * (size_t)r->nstrips * r->b_strip +
                     (size_t)(j0 / kn->nr) * r->b_strip;
    /* an operand that only this tile reads is packed here, a k block at a
     * time, into this thread's buffer (L2 holds it, and the tiles read it
     * from there) instead of all of k into the shared panels first */
    char *ablock = r->tpack + (size_t)thread * r->tpack_bytes;
    char *bblock = ablock + (r->a_by_tile ? (size_t)cdiv(mc, kn->mr) * r->a_block : 0);
    size_t astride = r->a_by_tile ? r->a_block : r->a_strip, bstride = r->b_by_tile ? r->b_block : r->b_strip;
    /* an f32 C takes the sums where they go (the kernel adds each k block
     * to what C holds: the same sums as through a buffer, and no copy)
     * unless its rows are a multiple of 4 KiB apart (a tile's rows would
     * all fall in one L1 set: 2-7% slower measured at n = 1024, 2048); an
     * f16/bf16 one, or such an f32 one, has them in this thread's tile
     * buffer, rows a little over nc apart, then copied or rounded once
     * into C (such an f32 one's last k block written by the kernel from
     * the buffer into C, no copy after, ran no faster: 1024 x 1024 x 1024
     * within +-2%, its stores then 14 rows in one L1 set) */
    bool direct = direct_c(g);
    /* an f16 or bf16 C with a kernel that rounds in registers: the last k
     * block goes straight to C (the earlier ones, if any, into the buffer) */
    void (*tile_round)(int64_t, const void *, const void *, const float *, int64_t, uint16_t *, int64_t, int, int) =
        direct || r->epi ? NULL : g->out_dtype == ALLOY_F16 ? kn->tile_f16 : g->out_dtype == ALLOY_BF16 ? kn->tile_bf16 : NULL;
    bool round16 = tile_round != NULL;
    /* A in place: the tile's rows of this batch's op(A), k-contiguous */
    const uint16_t *a0 = r->a_in_place ? (const uint16_t *)g->a + batch_offset(g, g->stride_a, b) + i0 * g->lda : NULL;
    int64_t ldo = c_ld(g);
    uint16_t *out16 = round16 ? (uint16_t *)g->c + c_row(g, b, i0) + j0 : NULL;
    int64_t ldc = direct ? ldo : r->ldt;
    float *c = direct ? (float *)g->c + c_row(g, b, i0) + j0 : r->ctile + (size_t)thread * (size_t)(r->mc * ldc);
    int64_t kcu = kn->kc / kn->ku;
    size_t a_unit = (size_t)kn->mr * (size_t)kn->ku * (size_t)kn->esize;
    size_t b_unit = (size_t)kn->nr * (size_t)kn->ku * (size_t)kn->esize;
    for (int64_t pc = 0; pc < r->kunits; pc += kcu) {
        int64_t ku = min64(kcu, r->kunits - pc);
        if (r->a_by_tile)
            for (int64_t ir = 0; ir < mc; ir += kn->mr)
                pack_strip_to(r, true, b, (i0 + ir) / kn->mr, pc * kn->ku, 0, ku,
                              ablock + (size_t)(ir / kn->mr) * r->a_block);
        if (r->b_by_tile)
            for (int64_t jr = 0; jr < nc; jr += kn->nr)
                pack_strip_to(r, false, b, (j0 + jr) / kn->nr, pc * kn->ku, 0, ku,
                              bblock + (size_t)(jr / kn->nr) * r->b_block);
        bool to16 = round16 && pc + ku >= r->kunits;
        for (int64_t jr = 0; jr < nc; jr += kn->nr) {
            const char *bs = r->b_by_tile ? bblock + (size_t)(jr / kn->nr) * bstride
                                          : bp + (size_t)(jr / kn->nr) * bstride + (size_t)pc * b_unit;
            for (int64_t ir = 0; ir < mc; ir += kn->mr) {
                const char *as = r->a_by_tile ? ablock + (size_t)(ir / kn->mr) * astride
                                              : ap + (size_t)(ir / kn->mr) * astride + (size_t)pc * a_unit;
                int mv = (int)min64(kn->mr, mc - ir), nv = (int)min64(kn->nr, nc - jr);
                const uint16_t *ai = a0 ? a0 + ir * g->lda + 2 * pc : NULL;
                const float *cin = pc > 0 ? c + ir * ldc + jr : NULL;
                if (to16 && ai)
                    kn->tile_bf16_in_place(ku, ai, g->lda, bs, cin, ldc, out16 + ir * ldo + jr, ldo, mv, nv);
                else if (to16)
                    tile_round(ku, as, bs, cin, ldc, out16 + ir * ldo + jr, ldo, mv, nv);
                else if (ai)
                    kn->tile_in_place(ku, ai, g->lda, bs, c + ir * ldc + jr, ldc, mv, nv, pc > 0);
                else
                    kn->tile(ku, as, bs, c + ir * ldc + jr, ldc, mv, nv, pc > 0);
            }
        }
    }
    if (direct || round16) return;
    size_t es = alloy_dtype_size(g->out_dtype);
    for (int64_t i = 0; i < mc; i++) {
        void *out = (char *)g->c + (size_t)(c_row(g, b, i0 + i) + j0) * es;
        if (r->epi)
            epilogue_row(r->epi, g->out_dtype, c + i * ldc, r->epi->bias ? r->epi->bias + j0 : NULL,
                         r->epi->sum_out ? (char *)r->epi->sum_out + (size_t)(c_row(g, b, i0 + i) + j0) * es : NULL,
                         out, nc);
        else cvt_store_f32(g->out_dtype, c + i * ldc, out, (size_t)nc);
    }
}

/* Threads worth using for `macs` multiply-adds in `jobs` pieces. */
static int pick_threads(int threads, double macs, int64_t jobs)
{
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (macs < (double)PAR_MIN_MACS) return 1;
    int64_t by_work = (int64_t)(macs / (PAR_MIN_MACS / 2));
    int64_t t = min64(min64(threads, jobs), by_work);
    return t < 1 ? 1 : (int)t;
}

/* Aligned start of a buffer from w (or a fresh one: *own is set). */
static char *scratch(cpu_workers *w, size_t bytes, void **own)
{
    *own = NULL;
    char *p = w ? cpu_workers_buffer(w, bytes + ALIGN) : (*own = al_malloc(bytes + ALIGN));
    return p ? p + (ALIGN - (uintptr_t)p % ALIGN) % ALIGN : NULL;
}

/* The sgemm kernel: per batch, the spans of A and B the product reads to
 * f32, then the f32 GEMM's pieces (the BLAS when there is one) on up to
 * `threads` threads of w into C, or into f32 then rounded when C is
 * f16/bf16. */
static alloy_status run_sgemm(const gemm_lowp_args *g, const gemm_lowp_epilogue *epi, int64_t batches, cpu_workers *w,
                              int threads)
{
    int64_t ar = g->ta ? g->k : g->m, ac = g->ta ? g->m : g->k;
    int64_t br = g->tb ? g->n : g->k, bc = g->tb ? g->k : g->n;
    size_t na = (size_t)((ar - 1) * g->lda + ac), nb = (size_t)((br - 1) * g->ldb + bc);
    size_t nc = g->out_dtype == ALLOY_F32 ? 0 : (size_t)(g->m * g->n);
    void *own;
    char *buf = scratch(w, (na + nb + nc) * sizeof(float) + 2 * ALIGN, &own);
    if (!buf) return ALLOY_ERR_OOM;
    float *a = (float *)(void *)buf, *b = a + na, *c = b + nb;
    for (int64_t bi = 0; bi < batches; bi++) {
        cvt_load_f32(g->dtype, (const uint16_t *)g->a + batch_offset(g, g->stride_a, bi), a, na);
        cvt_load_f32(g->dtype, (const uint16_t *)g->b + batch_offset(g, g->stride_b, bi), b, nb);
        float *cb = nc ? c : (float *)g->c + c_row(g, bi, 0);
        gemm_product prod = {false, g->ta, g->tb, g->m, g->n, g->k, g->lda, g->ldb, nc ? g->n : c_ld(g), 1.0, 0.0,
                             a, b, cb};
        gemm_run(&prod, w, w ? threads : 1);
        size_t es = alloy_dtype_size(g->out_dtype);
        if (nc && epi)
            for (int64_t i = 0; i < g->m; i++)
                epilogue_row(epi, g->out_dtype, c + i * g->n, epi->bias,
                             epi->sum_out ? (char *)epi->sum_out + (size_t)c_row(g, bi, i) * es : NULL,
                             (char *)g->c + (size_t)c_row(g, bi, i) * es, g->n);
        else if (nc && !g->stride_c) cvt_store_f32(g->out_dtype, c, (char *)g->c + (size_t)c_row(g, bi, 0) * es, nc);
        else if (nc)
            for (int64_t i = 0; i < g->m; i++)
                cvt_store_f32(g->out_dtype, c + i * g->n, (char *)g->c + (size_t)c_row(g, bi, i) * es, (size_t)g->n);
    }
    al_free(own);
    return ALLOY_OK;
}

alloy_status gemm_lowp(const gemm_lowp_args *g, opt_lowp_gemm asked, cpu_workers *w, int threads)
{
    return gemm_lowp_epi(g, NULL, asked, w, threads);
}

alloy_status gemm_lowp_epi(const gemm_lowp_args *g, const gemm_lowp_epilogue *epi, opt_lowp_gemm asked, cpu_workers *w,
                           int threads)
{
    if (epi && g->out_dtype == ALLOY_F32) return ALLOY_ERR_INVALID; /* the epilogue rounds into an f16/bf16 C */
    int64_t batches = 1;
    for (int d = 0; d < g->batch_rank; d++) batches *= g->batch_dims[d];
    if (g->m <= 0 || g->n <= 0 || batches <= 0) return ALLOY_OK;
    if (g->k <= 0) { /* empty sums: all-zero bytes are +0 in every float dtype */
        size_t es = alloy_dtype_size(g->out_dtype);
        if (!g->stride_c) memset(g->c, 0, (size_t)(batches * g->m * g->n) * es);
        else
            for (int64_t bi = 0; bi < batches; bi++)
                for (int64_t i = 0; i < g->m; i++) memset((char *)g->c + (size_t)c_row(g, bi, i) * es, 0, (size_t)g->n * es);
        return ALLOY_OK;
    }
    opt_lowp_gemm kind = gemm_lowp_kernel(g->dtype, asked);
    if (kind == OPT_LOWP_SGEMM) return run_sgemm(g, epi, batches, w, threads);
    const lowp_kernel *kn = kind == OPT_LOWP_PORTABLE ? &k_portable : gemm_lowp_x86_kernel(kind);
    if (!kn) kn = &k_portable;

    lowp_run r = {.g = g, .epi = epi, .kern = kn, .batches = batches};
    r.a_copies = all_zero(g->stride_a, g->batch_rank) ? 1 : batches;
    r.b_copies = all_zero(g->stride_b, g->batch_rank) ? 1 : batches;
    r.kunits = cdiv(g->k, kn->ku);
    r.mstrips = cdiv(g->m, kn->mr), r.nstrips = cdiv(g->n, kn->nr);
    /* and the slack a kernel's packing may write past a strip */
    r.a_strip = (size_t)(r.kunits * kn->mr * kn->ku * kn->esize) + ALIGN;
    r.b_strip = (size_t)(r.kunits * kn->nr * kn->ku * kn->esize) + ALIGN;
    r.a_groups = cdiv(r.mstrips, PACK_STRIPS), r.b_groups = cdiv(r.nstrips, PACK_STRIPS);
    r.mc = min64(cdiv(MC_ROWS, kn->mr) * kn->mr, r.mstrips * kn->mr);
    r.nc = min64(cdiv(NC_COLS, kn->nr) * kn->nr, r.nstrips * kn->nr);
    r.mblocks = cdiv(g->m, r.mc), r.nblocks = cdiv(g->n, r.nc);
    /* a C of at most 2 strips more than MC_ROWS is one block high where
     * that leaves a tile for each thread (the weight gradients' 128 rows:
     * 10 strips, not 8 + 2, so that B is one tile's alone, below); the
     * tiles' shape changes no sum */
    int want = w && threads > 1 ? threads : 1;
    bool one_high = r.mblocks <= 2 && r.mstrips * kn->mr <= r.mc + 2 * kn->mr;
    /* such a C on several threads is cut into as many column blocks of equal
     * strips as the threads at least (the weight gradients' 128 x 128: two
     * tiles of 64 columns, not one; 128 x 384: 192 + 192, not 256 + 128) */
    if (one_high && batches == 1 && want > 1 && r.nstrips > 1) {
        int64_t blocks = cdiv(r.nstrips * kn->nr, NC_COLS);
        blocks = cdiv(blocks < want ? want : blocks, want) * want;
        if (blocks > r.nstrips) blocks = r.nstrips;
        r.nc = cdiv(r.nstrips, blocks) * kn->nr, r.nblocks = cdiv(g->n, r.nc);
    }
    if (one_high && r.mblocks == 2 && batches * r.nblocks >= want)
        r.mc = r.mstrips * kn->mr, r.mblocks = 1;
    int64_t tiles = batches * r.mblocks * r.nblocks;
    double macs = (double)batches * (double)g->m * (double)g->n * (double)g->k;
    int nt = w ? pick_threads(threads, macs, tiles) : 1;
    if (nt > 1) nt = cpu_workers_threads(w, nt);
    /* bf16 pairs of k-contiguous rows are what the kernel broadcasts: it
     * reads them where they are (k even: no pair past a row's end) where
     * each is read at most A_IN_PLACE_STRIPS times (once per B strip of a
     * tile); past that, 14 rows' streams from L2 cost the tiles more than
     * the packing saves (2048x512x128: the tiles +5%, the packing 3% of the time) */
    r.a_in_place = kn->tile_in_place && kn->tile_bf16_in_place && !g->ta && g->k % 2 == 0 &&
                   g->out_dtype != ALLOY_F16 && r.nstrips <= A_IN_PLACE_STRIPS;
    if (r.a_in_place) r.a_copies = 0;
    /* an operand that is one tile's alone (A: C one block wide; B: one
     * block high; neither broadcast across batches) and large is packed by
     * that tile, k block by k block: packed whole up front it would not
     * stay in L2 for the tiles (and its stores went out to L3) */
    size_t a_copy = (size_t)r.mstrips * r.a_strip, b_copy = (size_t)r.nstrips * r.b_strip;
    r.a_by_tile = r.a_copies == batches && r.nblocks == 1 && a_copy >= BY_TILE_BYTES;
    r.b_by_tile = r.b_copies == batches && r.mblocks == 1 && b_copy >= BY_TILE_BYTES;
    int64_t kcu = kn->kc / kn->ku;
    r.a_block = (size_t)(kcu * kn->mr * kn->ku * kn->esize) + ALIGN;
    r.b_block = (size_t)(kcu * kn->nr * kn->ku * kn->esize) + ALIGN;
    r.tpack_bytes = (r.a_by_tile ? (size_t)(r.mc / kn->mr) * r.a_block : 0) +
                    (r.b_by_tile ? (size_t)(r.nc / kn->nr) * r.b_block : 0);
    if (r.a_by_tile) r.a_copies = 0;
    if (r.b_by_tile) r.b_copies = 0;

    size_t apack = ((size_t)r.a_copies * (size_t)r.mstrips * r.a_strip + ALIGN - 1) / ALIGN * ALIGN;
    size_t bpack = ((size_t)r.b_copies * (size_t)r.nstrips * r.b_strip + ALIGN - 1) / ALIGN * ALIGN;
    r.ldt = r.nc + 16;
    size_t ctile = direct_c(g) ? 0 : sizeof(float) * (size_t)(r.mc * r.ldt) * (size_t)nt;
    size_t tpack = r.tpack_bytes * (size_t)nt;
    void *own;
    char *buf = scratch(w, apack + bpack + ctile + tpack, &own);
    if (!buf) return ALLOY_ERR_OOM;
    r.apack = buf, r.bpack = buf + apack, r.ctile = (float *)(void *)(buf + apack + bpack);
    r.tpack = buf + apack + bpack + ctile;
#ifdef ALLOY_GEMM_PROFILE
    prof_row *pr = prof_find(g, batches, r.a_copies == 1 && batches > 1, r.b_copies == 1 && batches > 1);
    double t0 = prof_now();
#endif
    cpu_workers_run(w, nt, r.a_copies * r.a_groups + r.b_copies * r.b_groups, pack_job, &r);
#ifdef ALLOY_GEMM_PROFILE
    double t1 = prof_now();
#endif
    cpu_workers_run(w, nt, tiles, tile_job, &r);
#ifdef ALLOY_GEMM_PROFILE
    if (pr) pr->calls++, pr->pack_s += t1 - t0, pr->tile_s += prof_now() - t1;
#endif
    al_free(own);
    return ALLOY_OK;
}
