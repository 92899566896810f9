/* cpu_fused_walk.c - a fused group's iteration space and strided walks (inputs gathered, members scattered by row segment). */
/* No trapping math here (vmath.h, CPU_VECTOR_CLONES): the chunk functions'
 * selects then vectorize on every ISA level, not only with AVX-512's masks. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "base/convert.h"
#include "runtime/cpu/cpu_fused.h"

/* The strides array of walker k of p (its inputs, then its members), or
 * NULL for a member stored densely (or not at all): those walk the space
 * as its own order. */
static int64_t *walker(fz_plan *p, int k)
{
    if (k < p->ninputs) return p->inputs[k].stride;
    fz_member *mb = &p->members[k - p->ninputs];
    return mb->scatter ? mb->stride : NULL;
}

/* Coalesced iteration space of shape `out` over the inputs and the members
 * stored through strides (cpu_elementwise.c's fz_build_space for any number
 * of walkers): size-1 dims dropped, neighbouring dims merged where every
 * walker walks them as one. A walker laid out by strides (an input's
 * laid_out, a member's scatter) holds them per dim of out in its stride
 * array on entry; it is rewritten in place, never ahead of the dim being
 * read. */
void fz_build_space(fz_plan *p, const ir_type *out, const ir_type *const *in_types)
{
    int r = out->rank, nw = p->ninputs + p->nmembers;
    p->rank = 0;
    for (int d = 0; d < r; d++) {
        if (out->dims[d] == 1) continue;
        bool merge = p->rank > 0;
        for (int k = 0; k < nw; k++) {
            int64_t *st = walker(p, k), s;
            if (!st) continue;
            if (k >= p->ninputs || p->inputs[k].laid_out) {
                s = st[d];
            } else { /* the input's stride at out dim d */
                const ir_type *t = in_types[k];
                int64_t acc = 1;
                for (int e = r - 1; e > d; e--) {
                    int te = e - (r - t->rank);
                    acc *= te >= 0 ? t->dims[te] : 1;
                }
                int td = d - (r - t->rank);
                s = (td >= 0 ? t->dims[td] : 1) == 1 ? 0 : acc;
            }
            if (merge && st[p->rank - 1] != s * out->dims[d]) merge = false;
            st[p->rank] = s; /* tentative next dim */
        }
        if (merge) {
            p->dims[p->rank - 1] *= out->dims[d];
            for (int k = 0; k < nw; k++) {
                int64_t *st = walker(p, k);
                if (st) st[p->rank - 1] = st[p->rank];
            }
        } else {
            p->dims[p->rank++] = out->dims[d];
        }
    }
    if (p->rank == 0) {
        p->rank = 1;
        p->dims[0] = 1;
        for (int k = 0; k < nw; k++) {
            int64_t *st = walker(p, k);
            if (st) st[0] = 0;
        }
    }
    for (int k = 0; k < p->ninputs; k++) {
        fz_input *in = &p->inputs[k];
        bool uniform = true, dense = true;
        int64_t acc = 1;
        for (int d = p->rank - 1; d >= 0; d--) {
            uniform &= in->stride[d] == 0;
            dense &= in->stride[d] == acc;
            acc *= p->dims[d];
        }
        in->walk = uniform ? WALK_UNIFORM : dense ? WALK_DENSE : WALK_STRIDED;
        in->row = in->walk == WALK_STRIDED && in->stride[p->rank - 1] == 1;
        for (int d = 0; d < p->rank - 1; d++) in->row &= in->stride[d] == 0;
    }
}

/* Loads len elements of in from flat iteration index start into buf (compute
 * type), one row segment at a time. */
void fz_gather(const fz_plan *p, const fz_input *in, int64_t start, int64_t len, void *buf)
{
    int r = p->rank;
    int64_t idx[ALLOY_MAX_RANK], rem = start, off = 0;
    for (int d = r - 1; d >= 0; d--) {
        idx[d] = rem % p->dims[d];
        rem /= p->dims[d];
        off += idx[d] * in->stride[d];
    }
    int64_t inner = p->dims[r - 1], sin = in->stride[r - 1];
    size_t cs = p->wide ? sizeof(double) : sizeof(float);
    for (int64_t done = 0; done < len;) {
        int64_t seg = inner - idx[r - 1];
        if (seg > len - done) seg = len - done;
        char *dst = (char *)buf + (size_t)done * cs;
        const char *src = in->data + (size_t)off * in->es;
        if (sin == 0) {
            if (p->wide) {
                double v;
                cvt_load_f64(in->dtype, src, &v, 1);
                for (int64_t i = 0; i < seg; i++) ((double *)(void *)dst)[i] = v;
            } else {
                float v;
                cvt_load_f32(in->dtype, src, &v, 1);
                for (int64_t i = 0; i < seg; i++) ((float *)(void *)dst)[i] = v;
            }
        } else if (p->wide) {
            cvt_load_f64(in->dtype, src, (double *)(void *)dst, (size_t)seg);
        } else {
            fz_load_chunk_f32(in->dtype, src, (float *)(void *)dst, seg);
        }
        done += seg;
        idx[r - 1] += seg;
        off += seg * sin;
        if (idx[r - 1] < inner) continue;
        off -= inner * sin;
        idx[r - 1] = 0;
        for (int d = r - 2; d >= 0; d--) {
            idx[d]++;
            off += in->stride[d];
            if (idx[d] < p->dims[d]) break;
            off -= in->stride[d] * p->dims[d];
            idx[d] = 0;
        }
    }
}

/* Stores len elements of member mb's chunk y (the compute type, in
 * iteration order from flat index start) to their strided places, rounded
 * to its dtype as fz_store_chunk_f32 / cvt_store_f64 do, one row segment at
 * a time. */
void fz_scatter(const fz_plan *p, const fz_member *mb, int64_t start, int64_t len, const void *y)
{
    int r = p->rank;
    size_t cs = p->wide ? sizeof(double) : sizeof(float);
    int64_t idx[ALLOY_MAX_RANK], rem = start, off = 0;
    for (int d = r - 1; d >= 0; d--) {
        idx[d] = rem % p->dims[d];
        rem /= p->dims[d];
        off += idx[d] * mb->stride[d];
    }
    int64_t inner = p->dims[r - 1], sin = mb->stride[r - 1];
    for (int64_t done = 0; done < len;) {
        int64_t seg = inner - idx[r - 1];
        if (seg > len - done) seg = len - done;
        for (int64_t i = 0; i < seg; i += sin == 1 ? seg : 1) {
            const char *from = (const char *)y + (size_t)(done + i) * cs;
            char *to = mb->dst + (size_t)(off + i * sin) * mb->es;
            int64_t n = sin == 1 ? seg : 1;
            if (p->wide) cvt_store_f64(mb->dtype, (const double *)(const void *)from, to, (size_t)n);
            else fz_store_chunk_f32(mb->dtype, (const float *)(const void *)from, to, n);
        }
        done += seg;
        idx[r - 1] += seg;
        off += seg * sin;
        if (idx[r - 1] < inner) continue;
        off -= inner * sin;
        idx[r - 1] = 0;
        for (int d = r - 2; d >= 0; d--) {
            idx[d]++;
            off += mb->stride[d];
            if (idx[d] < p->dims[d]) break;
            off -= mb->stride[d] * p->dims[d];
            idx[d] = 0;
        }
    }
}
