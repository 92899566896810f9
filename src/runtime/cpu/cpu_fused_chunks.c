/* cpu_fused_chunks.c - a fused group's chunk loop: inputs loaded, members computed, checked and stored, on the run's threads. */
/* No trapping math here (vmath.h, CPU_VECTOR_CLONES): the chunk functions'
 * selects then vectorize on every ISA level, not only with AVX-512's masks. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <string.h>

#include "base/convert.h"
#include "runtime/cpu/cpu_fused.h"
#include "runtime/cpu/cpu_workers.h"

/* Runs chunks [c0, c1) of p on one thread. scratch holds ninputs + nslots
 * chunk buffers of the compute type and one of p->chunk * 8 bytes (any dtype);
 * ptr has room for ninputs + nmembers pointers. */
static void run_chunks(const fz_plan *p, int64_t c0, int64_t c1, char *scratch, const void **ptr)
{
    size_t cs = p->wide ? sizeof(double) : sizeof(float);
    const int64_t chunk = p->chunk;
    size_t bufbytes = (size_t)chunk * cs;
    alloy_dtype ct = p->wide ? ALLOY_F64 : ALLOY_F32;
    char *inbuf = scratch, *slotbuf = scratch + (size_t)p->ninputs * bufbytes;
    char *roundtrip = slotbuf + (size_t)p->nslots * bufbytes; /* chunk * 8 bytes */
    const void **val = ptr + p->ninputs;
    /* uniform inputs are filled once for all chunks [c0, c1) */
    int64_t fill = p->total - c0 * chunk < chunk ? p->total - c0 * chunk : chunk;
    for (int k = 0; k < p->ninputs; k++) {
        const fz_input *in = &p->inputs[k];
        if (in->walk != WALK_UNIFORM) continue;
        void *b = inbuf + (size_t)k * bufbytes;
        if (p->wide) {
            double v;
            cvt_load_f64(in->dtype, in->data, &v, 1);
            for (int64_t i = 0; i < fill; i++) ((double *)b)[i] = v;
        } else {
            float v;
            cvt_load_f32(in->dtype, in->data, &v, 1);
            for (int64_t i = 0; i < fill; i++) ((float *)b)[i] = v;
        }
        ptr[k] = b;
    }
    for (int64_t c = c0; c < c1; c++) {
        int64_t start = c * chunk, len = p->total - start < chunk ? p->total - start : chunk;
        for (int k = 0; k < p->ninputs; k++) {
            const fz_input *in = &p->inputs[k];
            void *b = in->into >= 0 ? p->members[in->into].dst + (size_t)start * cs : inbuf + (size_t)k * bufbytes;
            if (in->walk == WALK_DENSE) {
                const char *src = in->data + (size_t)start * in->es;
                if (in->store) fz_store_chunk_f32(in->store_dtype, (const float *)(const void *)src,
                                               in->store + (size_t)start * alloy_dtype_size(in->store_dtype), len);
                bool rule = in->ranged && (in->aliased || in->into >= 0 ||
                                           fz_range_changes(in->range_dtype, (const void *)src, len));
                if (rule) {
                    fz_range_copy_f32(in->range_dtype, (const float *)(const void *)src, b, len);
                    ptr[k] = b;
                } else if (in->ranged) {
                    ptr[k] = src; /* the rule leaves every value of the chunk as it is */
                } else if (in->dtype == ct && !in->aliased) {
                    ptr[k] = src;
                } else {
                    if (p->wide) cvt_load_f64(in->dtype, src, b, (size_t)len);
                    else fz_load_chunk_f32(in->dtype, src, b, len);
                    ptr[k] = b;
                }
            } else if (in->walk == WALK_STRIDED) {
                /* a row broadcast to every row: a chunk inside one row of
                 * the compute type is read in place; where every chunk
                 * starts a row, the first one's gathered values serve all
                 * (the last, shorter, reads a prefix of them) */
                int64_t inner = p->dims[p->rank - 1], at = start % inner;
                if (in->row && !in->aliased && in->dtype == ct && at + len <= inner) {
                    ptr[k] = in->data + (size_t)at * in->es;
                } else if (!(in->row && !in->aliased && chunk % inner == 0 && c > c0)) {
                    fz_gather(p, in, start, len, b);
                    ptr[k] = b;
                }
            }
        }
        for (int m = 0; m < p->nmembers; m++) {
            const fz_member *mb = &p->members[m];
            const void *op[3] = {NULL, NULL, NULL};
            for (int j = 0; j < mb->nin; j++)
                op[j] = mb->src[j] >= 0 ? ptr[mb->src[j]] : val[-mb->src[j] - 1];
            for (int j = mb->nin; j < 3; j++) op[j] = op[0];
            /* a strided member is computed as one never stored, then its
             * chunk (as a store and a load give it back where exact) stored
             * to its places by fz_scatter */
            char *dst = mb->scatter ? NULL : mb->dst ? mb->dst + (size_t)start * mb->es : NULL;
            void *y = mb->passed ? (void *)op[0] : mb->slot >= 0 ? slotbuf + (size_t)mb->slot * bufbytes : dst;
            /* a bool/integer value is what a store and a load give back; a
             * float one stays unrounded (docs/fusion.md) */
            char *back = dst ? dst : roundtrip;
            if (p->wide) {
                if (!mb->passed) mb->f64(len, y, op[0], op[1], op[2], mb->p);
                if (mb->range) cpu_range_add_f64(mb->range, mb->dtype, y, len); /* before the range rule */
                if (mb->ranged) fz_range_f64(mb->dtype, y, len);
                if ((dst && y != dst) || mb->exact || (mb->check && mb->dtype != ALLOY_F64))
                    cvt_store_f64(mb->dtype, y, back, (size_t)len);
                if (mb->exact) cvt_load_f64(mb->dtype, back, y, (size_t)len);
                if (mb->check && fz_any_nonfinite(mb->dtype, mb->dtype == ALLOY_F64 ? (const void *)y : back, len))
                    __atomic_store_n(p->nonfinite, 1, __ATOMIC_RELAXED);
            } else {
                if (mb->f32 == fz_copy_f32 && mb->exact && !mb->ranged) { /* a rounding cast: no copy first */
                    if (mb->range) cpu_range_add_f32(mb->range, mb->dtype, op[0], len);
                    fz_store_chunk_f32(mb->dtype, op[0], back, len);
                } else if (mb->f32 == fz_copy_f32 && mb->ranged) { /* the range rule as the copy */
                    if (mb->range) cpu_range_add_f32(mb->range, mb->dtype, op[0], len);
                    fz_range_copy_f32(mb->dtype, op[0], y, len);
                    if ((dst && y != dst) || mb->exact || (mb->check && mb->dtype != ALLOY_F32))
                        fz_store_chunk_f32(mb->dtype, y, back, len);
                } else {
                    if (!mb->passed) mb->f32(len, y, op[0], op[1], op[2], mb->p);
                    if (mb->range) cpu_range_add_f32(mb->range, mb->dtype, y, len); /* before the range rule */
                    if (mb->ranged) cpu_range_f32(mb->dtype, y, len);
                    if ((dst && y != dst) || mb->exact || (mb->check && mb->dtype != ALLOY_F32))
                        fz_store_chunk_f32(mb->dtype, y, back, len);
                }
                if (mb->exact) fz_load_chunk_f32(mb->dtype, back, y, len);
                if (mb->check && fz_any_nonfinite(mb->dtype, mb->dtype == ALLOY_F32 ? (const void *)y : back, len))
                    __atomic_store_n(p->nonfinite, 1, __ATOMIC_RELAXED);
            }
            if (mb->flag) fz_flag_nonfinite(mb, p->wide, y, dst, roundtrip, len);
            if (mb->scatter) fz_scatter(p, mb, start, len, y);
            val[m] = y;
        }
    }
}

/* ---- a group's chunks on the run's threads (cpu_workers.c) ---- */

/* Blocks of per_block chunks of p, thread t working in its share of w's
 * chunk buffers. */
typedef struct chunk_job {
    const cpu_workers *w;
    const fz_plan *p;
    int64_t per_block, nchunks;
} chunk_job;

static void run_chunk_block(void *arg, int64_t b, int t)
{
    const chunk_job *j = arg;
    int64_t c0 = b * j->per_block, c1 = c0 + j->per_block < j->nchunks ? c0 + j->per_block : j->nchunks;
    char *mine = j->w->scratch + j->w->share * (size_t)t;
    run_chunks(j->p, c0, c1, mine, (const void **)(void *)(mine + j->w->ptr_at));
}

/* Runs all of p's chunks on `threads` threads (the caller one of them), in
 * blocks that threads claim one at a time (cpu_workers_run). */
void fz_run_parallel(cpu_workers *w, const fz_plan *p, int threads, int64_t nchunks)
{
    chunk_job job = {w, p, nchunks / ((int64_t)threads * 4), nchunks};
    if (job.per_block < 1) job.per_block = 1;
    if (threads == 1) job.per_block = nchunks;
    cpu_workers_run(w, threads, (nchunks + job.per_block - 1) / job.per_block, run_chunk_block, &job);
}
