/* cpu_fused.c - runs a fusion group (or one elementwise node) as one chunked pass over its shape, split across threads. */
/* No trapping math here (vmath.h, CPU_VECTOR_CLONES): the chunk functions'
 * selects then vectorize on every ISA level, not only with AVX-512's masks. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <string.h>
#include <tgmath.h>

#include "ir/groups.h"
#include "base/convert.h"
#include "step/attn_views.h"
#include "base/vmath_generic.h"
#include "runtime/cpu/cpu.h"
#include "runtime/cpu/cpu_workers.h"

/* Each EW line of ops.def becomes two more chunk functions for groups of two
 * or more: the expression of cpu_elementwise.c's, so the same values (a NaN's
 * sign and payload may differ: vector code may take the other operand's), over
 * operands that are never NULL (an unused one points at a, and its loads are
 * dead) and never alias y, in blocks of 16 the compiler turns into vector
 * code at -O2, one clone per ISA (no fast-math, no contraction; exp, erf and
 * tanh of float are base/vmath.h's, so they vectorize too). */
typedef void (*fz_f32)(int64_t n, float *restrict y, const float *restrict a, const float *restrict b,
                       const float *restrict c, const double *p);
typedef void (*fz_f64)(int64_t n, double *restrict y, const double *restrict a,
                       const double *restrict b, const double *restrict c, const double *p);
#define OP(...)
#define P(k) ((T)p[k])
#define FZ_BODY(T_, nm, expr)                                                              \
    CPU_VECTOR_CLONES static void fz_##nm##_##T_(int64_t n, T_##_t *restrict y,            \
                                                 const T_##_t *restrict pa,                \
                                                 const T_##_t *restrict pb,                \
                                                 const T_##_t *restrict pc,                \
                                                 const double *p)                          \
    {                                                                                      \
        typedef T_##_t T;                                                                  \
        (void)p;                                                                           \
        int64_t i = 0;                                                                     \
        for (; i + 16 <= n; i += 16)                                                       \
            for (int j = 0; j < 16; j++) {                                                 \
                T a = pa[i + j], b = pb[i + j], c = pc[i + j];                             \
                (void)a, (void)b, (void)c;                                                 \
                y[i + j] = (T)(expr);                                                      \
            }                                                                              \
        for (; i < n; i++) {                                                               \
            T a = pa[i], b = pb[i], c = pc[i];                                             \
            (void)a, (void)b, (void)c;                                                     \
            y[i] = (T)(expr);                                                              \
        }                                                                                  \
    }
typedef float f32_t;
typedef double f64_t;
#define EW(nm, nin, at, ty, amp, grad, expr) FZ_BODY(f32, nm, expr) FZ_BODY(f64, nm, expr)
#include "ir/ops.def"
#undef EW
#undef P

/* A cast member: the value passes through in the compute type; a cast to
 * f16/bf16 is then rounded to its dtype like a bool/integer result (the
 * member's `exact`), so an explicit cast still rounds. */
static void fz_copy_f32(int64_t n, float *restrict y, const float *restrict a, const float *restrict b,
                        const float *restrict c, const double *p)
{
    (void)b, (void)c, (void)p;
    memcpy(y, a, sizeof(float) * (size_t)n);
}

static void fz_copy_f64(int64_t n, double *restrict y, const double *restrict a, const double *restrict b,
                        const double *restrict c, const double *p)
{
    (void)b, (void)c, (void)p;
    memcpy(y, a, sizeof(double) * (size_t)n);
}

static const struct {
    fz_f32 f32;
    fz_f64 f64;
} fz_kernels[IR_OP_COUNT] = {
#define EW(nm, ...) [IR_OP_##nm] = {fz_##nm##_f32, fz_##nm##_f64},
#include "ir/ops.def"
#undef EW
};
#undef OP

/* Elements per step (a plan's chunk, CHUNK or CHUNK / 2): every buffer of
 * a chunk (one per input that is converted, gathered or a broadcast
 * scalar, one per live member) must stay in L1 while the members run. An
 * AdamW update has ~20 of them: on an AdamW-like chain of 4M f32 (bench
 * notes in docs/fusion.md) 128 ran in 12 ms, 256 in 17 ms, 1024 in 20 ms.
 * A group whose buffers take at most SMALL_BUFFERS bytes at CHUNK (the
 * bf16 step's epilogues and gradient groups) runs CHUNK at a time, half
 * as many trips through the members' loop (bench/RESULTS.md, "char_gpt's
 * bf16 step"); unfused ops do not care. A thread is worth waking for
 * about MIN_WORK element-visits (loads plus member evaluations). */
enum { CHUNK = 256, SMALL_BUFFERS = 16 << 10, MIN_WORK = 1 << 17, MAX_THREADS = CPU_MAX_THREADS };

/* How an external input walks the iteration space. */
typedef enum fz_walk {
    WALK_DENSE,   /* its elements are the iteration order: read at the flat index */
    WALK_UNIFORM, /* one element for the whole space (a scalar, or broadcast everywhere) */
    WALK_STRIDED, /* broadcast along some dims: gathered row segment by row segment */
} fz_walk;

typedef struct fz_input {
    alloy_dtype dtype;
    size_t es;
    const char *data;
    fz_walk walk;
    /* a GEMM's f32 product (dense walk, f32 compute only): when ranged, the
     * range rule of range_dtype applied as it is loaded; stored rounded to
     * store_dtype at store (NULL: not) */
    bool ranged;
    alloy_dtype range_dtype, store_dtype;
    char *store;
    bool aliased; /* a member is stored over it (an update written in place): read through a copy */
    int into;     /* >= 0: its chunks are converted straight into that member's destination (load_into_dst) */
    bool laid_out; /* a strided view (step/attn_views.h): stride starts as its layout (laid_out_strides) */
    bool row;      /* strided along the last iteration dim only, with stride 1: a row broadcast to every row (a bias) */
    int64_t stride[ALLOY_MAX_RANK]; /* elements per step of each iteration dim */
} fz_input;

typedef struct fz_member {
    fz_f32 f32;
    fz_f64 f64;
    int src[3];  /* >= 0: external input; < 0: member -src-1; unused operands -0x7fff */
    int nin;
    int slot;    /* chunk buffer holding its value, or -1: computed straight into dst (or passed) */
    bool passed; /* a cast whose value is its input's chunk as loaded: that chunk, not a copy */
    char *dst;   /* where it is stored, or NULL: never materialized */
    bool exact;  /* a bool or integer result, or a cast to f16/bf16: rounded to its dtype in the buffer too */
    bool check;  /* found_inf reads it: any non-finite value (as stored) sets the plan's flag */
    bool ranged; /* an unrounded f16/bf16 value: overflows to inf as a store would (cpu_range_f32) */
    uint8_t *flag; /* amp_check: its node's NONFINITE_* bits (cpu_exec.nonfinite), or NULL */
    rt_range *range; /* amp_stats: its node's statistics (cpu_exec.ranges), or NULL */
    double p[IR_EW_MAX_ATTRS]; /* the op's attributes (ir_ew_params) */
    alloy_dtype dtype;
    size_t es;
    /* stored through strides (a result written in its transpose's order,
     * step/attn_views.h): computed into a chunk buffer and stored from it,
     * row segment by row segment, to dst + the elements per step of each
     * iteration dim */
    bool scatter;
    int64_t stride[ALLOY_MAX_RANK];
} fz_member;

typedef struct fz_plan {
    bool wide; /* computes in f64 */
    int rank;  /* of the coalesced iteration space (>= 1) */
    int64_t dims[ALLOY_MAX_RANK];
    int64_t total;
    int64_t chunk; /* elements per chunk: CHUNK, or CHUNK / 2 for a group of many buffers */
    int ninputs, nmembers, nslots;
    fz_input *inputs;
    fz_member *members;
    int *nonfinite; /* set to 1 when a `check` member has a non-finite value (any thread) */
} fz_plan;

enum { NO_OPERAND = -0x7fff };

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
 * stored through strides (cpu_elementwise.c's build_space for any number
 * of walkers): size-1 dims dropped, neighbouring dims merged where every
 * walker walks them as one. A walker laid out by strides (an input's
 * laid_out, a member's scatter) holds them per dim of out in its stride
 * array on entry; it is rewritten in place, never ahead of the dim being
 * read. */
static void build_space(fz_plan *p, const ir_type *out, const ir_type *const *in_types)
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

static void load_chunk_f32(alloy_dtype dt, const void *src, float *dst, int64_t n);

/* Loads len elements of in from flat iteration index start into buf (compute
 * type), one row segment at a time. */
static void gather(const fz_plan *p, const fz_input *in, int64_t start, int64_t len, void *buf)
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
            load_chunk_f32(in->dtype, src, (float *)(void *)dst, seg);
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

/* bf16 <-> f32 of one chunk, written here rather than called through
 * convert.c's dispatcher (a switch, a CPU check and a call for 128
 * elements): each ISA clone converts in its own vectors, inside the chunk
 * loop, in blocks of 16 as the chunk functions (vector code at -O2 too).
 * Bit for bit convert.c's: a NaN keeps its sign and payload with the quiet
 * bit set; a store rounds to nearest even, overflowing to inf. A fused
 * typed loop (each op reading bf16 and writing bf16 itself) measured no
 * faster: bench/RESULTS.md, "Conversions at group edges". */
CPU_VECTOR_CLONES static void bf16_load_chunk(const uint16_t *restrict s, float *restrict d, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) d[i + j] = cvt_bf16_value(s[i + j]);
    for (; i < n; i++) d[i] = cvt_bf16_value(s[i]);
}

CPU_VECTOR_CLONES static void bf16_store_chunk(const float *restrict s, uint16_t *restrict d, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) d[i + j] = cvt_bf16_rounded(s[i + j]);
    for (; i < n; i++) d[i] = cvt_bf16_rounded(s[i]);
}

/* cvt_load_f32 / cvt_store_f32 of one chunk, bf16 done in place, f16
 * straight to convert.c's runs (AVX-512 or F16C: GCC 12 turns a loop of
 * _Float16 conversions into one vcvtph2ps per element, and the integer
 * conversions of convert.h into many instructions per vector). */
static void load_chunk_f32(alloy_dtype dt, const void *src, float *dst, int64_t n)
{
    if (dt == ALLOY_BF16) bf16_load_chunk(src, dst, n);
    else if (dt == ALLOY_F16) cvt_f16_load(src, dst, (size_t)n);
    else cvt_load_f32(dt, src, dst, (size_t)n);
}

static void store_chunk_f32(alloy_dtype dt, const float *src, void *dst, int64_t n)
{
    if (dt == ALLOY_BF16) bf16_store_chunk(src, dst, n);
    else if (dt == ALLOY_F16) cvt_f16_store(src, dst, (size_t)n);
    else cvt_store_f32(dt, src, dst, (size_t)n);
}

/* Stores len elements of member mb's chunk y (the compute type, in
 * iteration order from flat index start) to their strided places, rounded
 * to its dtype as store_chunk_f32 / cvt_store_f64 do, one row segment at
 * a time. */
static void scatter(const fz_plan *p, const fz_member *mb, int64_t start, int64_t len, const void *y)
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
            else store_chunk_f32(mb->dtype, (const float *)(const void *)from, to, n);
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

/* The range rule of an unrounded f16/bf16 intermediate (docs/fusion.md): it
 * keeps its f32 precision but not more range than its dtype, so a value
 * that a store would round to inf becomes that inf (|x| >= 65520 for f16,
 * >= 0x1.ffp127 for bf16). Overflow decisions (found_inf, the loss
 * scaler) are then those of the unfused graph. */
/* cpu_range_f32 from x into y (x == y allowed). A select, not a branch, so
 * that the loop vectorizes: it runs on every chunk of a ranged value. NaN
 * compares false and stays. */
CPU_VECTOR_CLONES static void range_copy_f32(alloy_dtype dt, const float *x, float *y, int64_t n)
{
    float limit = dt == ALLOY_F16 ? 65520.0f : dt == ALLOY_BF16 ? 0x1.ffp127f : 0.0f;
    if (limit == 0.0f) {
        if (x != y) memcpy(y, x, sizeof(float) * (size_t)n);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = fabsf(v) >= limit ? copysignf(INFINITY, v) : v;
    }
}

/* Whether any of x[0..n) is one that the range rule of dt changes (an
 * or-reduction, no stores, so it vectorizes): a GEMM product's chunk is
 * then read in place, and a ranged value left as it is, unless one is. */
CPU_VECTOR_CLONES static bool range_changes(alloy_dtype dt, const float *x, int64_t n)
{
    float limit = dt == ALLOY_F16 ? 65520.0f : dt == ALLOY_BF16 ? 0x1.ffp127f : INFINITY;
    int over = 0;
    for (int64_t i = 0; i < n; i++) over |= fabsf(x[i]) >= limit && fabsf(x[i]) < INFINITY;
    return over != 0;
}

void cpu_range_f32(alloy_dtype dt, float *y, int64_t n)
{
    if (range_changes(dt, y, n)) range_copy_f32(dt, y, y, n);
}

static void range_f64(alloy_dtype dt, double *y, int64_t n)
{
    double limit = dt == ALLOY_F16 ? 65520.0 : dt == ALLOY_BF16 ? 0x1.ffp127 : 0.0;
    if (limit == 0.0) return;
    for (int64_t i = 0; i < n; i++) {
        double v = y[i];
        y[i] = fabs(v) >= limit ? copysign(INFINITY, v) : v;
    }
}

/* Whether any of n values of dtype dt at p is an inf or NaN (as found_inf
 * sees a stored value; integers and bools never are). */
static bool any_nonfinite(alloy_dtype dt, const void *p, int64_t n)
{
    bool found = false;
    switch (dt) {
    case ALLOY_F32:
        for (int64_t k = 0; k < n; k++) found |= !isfinite(((const float *)p)[k]);
        break;
    case ALLOY_F64:
        for (int64_t k = 0; k < n; k++) found |= !isfinite(((const double *)p)[k]);
        break;
    case ALLOY_F16:
        for (int64_t k = 0; k < n; k++) found |= (((const uint16_t *)p)[k] & 0x7c00) == 0x7c00;
        break;
    case ALLOY_BF16:
        for (int64_t k = 0; k < n; k++) found |= (((const uint16_t *)p)[k] & 0x7f80) == 0x7f80;
        break;
    default: break;
    }
    return found;
}

/* The NONFINITE_* bits of one element's 32/64-bit float pattern or 16-bit
 * exponent field: e the exponent bits, m the mantissa bits. */
#define NF_BITS(e, m, emask) ((e) == (emask) ? ((m) ? NONFINITE_NAN : NONFINITE_INF) : 0)

int cpu_nonfinite_bits(alloy_dtype dt, const void *p, int64_t n)
{
    int bits = 0;
    switch (dt) {
    case ALLOY_F32:
        for (int64_t k = 0; k < n; k++) {
            float v = ((const float *)p)[k];
            if (!isfinite(v)) bits |= isnan(v) ? NONFINITE_NAN : NONFINITE_INF;
        }
        break;
    case ALLOY_F64:
        for (int64_t k = 0; k < n; k++) {
            double v = ((const double *)p)[k];
            if (!isfinite(v)) bits |= isnan(v) ? NONFINITE_NAN : NONFINITE_INF;
        }
        break;
    case ALLOY_F16:
        for (int64_t k = 0; k < n; k++) {
            uint16_t h = ((const uint16_t *)p)[k];
            bits |= NF_BITS(h & 0x7c00, h & 0x3ff, 0x7c00);
        }
        break;
    case ALLOY_BF16:
        for (int64_t k = 0; k < n; k++) {
            uint16_t h = ((const uint16_t *)p)[k];
            bits |= NF_BITS(h & 0x7f80, h & 0x7f, 0x7f80);
        }
        break;
    default: break;
    }
    return bits;
}

int cpu_nonfinite_bits_f32(alloy_dtype dt, const float *y, int64_t n)
{
    /* the smallest magnitudes that round to inf in f16 and bf16; written
     * without branches so that the loop vectorizes */
    float limit = dt == ALLOY_F16 ? 65520.0f : dt == ALLOY_BF16 ? 0x1.ff8p127f : INFINITY;
    int inf = 0, nan = 0;
    for (int64_t k = 0; k < n; k++) {
        float v = y[k];
        nan |= v != v;
        inf |= fabsf(v) >= limit;
    }
    return (inf ? NONFINITE_INF : 0) | (nan ? NONFINITE_NAN : 0);
}

/* amp_check on member mb's chunk y (compute type): its values as a store
 * rounds them (an f32 chunk by the range rule of the member's dtype, no
 * conversion; an f64 one stored first, into roundtrip unless stored). */
static void flag_nonfinite(const fz_member *mb, bool wide, const void *y, const char *dst, char *roundtrip,
                           int64_t len)
{
    int bits;
    if (!wide) {
        bits = cpu_nonfinite_bits_f32(mb->dtype, y, len);
    } else if (mb->dtype == ALLOY_F64 || dst) {
        bits = cpu_nonfinite_bits(mb->dtype, mb->dtype == ALLOY_F64 ? y : (const void *)dst, len);
    } else {
        cvt_store_f64(mb->dtype, y, roundtrip, (size_t)len);
        bits = cpu_nonfinite_bits(mb->dtype, roundtrip, len);
    }
    if (bits) __atomic_fetch_or(mb->flag, (uint8_t)bits, __ATOMIC_RELAXED);
}

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
                if (in->store) store_chunk_f32(in->store_dtype, (const float *)(const void *)src,
                                               in->store + (size_t)start * alloy_dtype_size(in->store_dtype), len);
                bool rule = in->ranged && (in->aliased || in->into >= 0 ||
                                           range_changes(in->range_dtype, (const void *)src, len));
                if (rule) {
                    range_copy_f32(in->range_dtype, (const float *)(const void *)src, b, len);
                    ptr[k] = b;
                } else if (in->ranged) {
                    ptr[k] = src; /* the rule leaves every value of the chunk as it is */
                } else if (in->dtype == ct && !in->aliased) {
                    ptr[k] = src;
                } else {
                    if (p->wide) cvt_load_f64(in->dtype, src, b, (size_t)len);
                    else load_chunk_f32(in->dtype, src, b, len);
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
                    gather(p, in, start, len, b);
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
             * to its places by scatter */
            char *dst = mb->scatter ? NULL : mb->dst ? mb->dst + (size_t)start * mb->es : NULL;
            void *y = mb->passed ? (void *)op[0] : mb->slot >= 0 ? slotbuf + (size_t)mb->slot * bufbytes : dst;
            /* a bool/integer value is what a store and a load give back; a
             * float one stays unrounded (docs/fusion.md) */
            char *back = dst ? dst : roundtrip;
            if (p->wide) {
                if (!mb->passed) mb->f64(len, y, op[0], op[1], op[2], mb->p);
                if (mb->range) cpu_range_add_f64(mb->range, mb->dtype, y, len); /* before the range rule */
                if (mb->ranged) range_f64(mb->dtype, y, len);
                if ((dst && y != dst) || mb->exact || (mb->check && mb->dtype != ALLOY_F64))
                    cvt_store_f64(mb->dtype, y, back, (size_t)len);
                if (mb->exact) cvt_load_f64(mb->dtype, back, y, (size_t)len);
                if (mb->check && any_nonfinite(mb->dtype, mb->dtype == ALLOY_F64 ? (const void *)y : back, len))
                    __atomic_store_n(p->nonfinite, 1, __ATOMIC_RELAXED);
            } else {
                if (mb->f32 == fz_copy_f32 && mb->exact && !mb->ranged) { /* a rounding cast: no copy first */
                    if (mb->range) cpu_range_add_f32(mb->range, mb->dtype, op[0], len);
                    store_chunk_f32(mb->dtype, op[0], back, len);
                } else if (mb->f32 == fz_copy_f32 && mb->ranged) { /* the range rule as the copy */
                    if (mb->range) cpu_range_add_f32(mb->range, mb->dtype, op[0], len);
                    range_copy_f32(mb->dtype, op[0], y, len);
                    if ((dst && y != dst) || mb->exact || (mb->check && mb->dtype != ALLOY_F32))
                        store_chunk_f32(mb->dtype, y, back, len);
                } else {
                    if (!mb->passed) mb->f32(len, y, op[0], op[1], op[2], mb->p);
                    if (mb->range) cpu_range_add_f32(mb->range, mb->dtype, y, len); /* before the range rule */
                    if (mb->ranged) cpu_range_f32(mb->dtype, y, len);
                    if ((dst && y != dst) || mb->exact || (mb->check && mb->dtype != ALLOY_F32))
                        store_chunk_f32(mb->dtype, y, back, len);
                }
                if (mb->exact) load_chunk_f32(mb->dtype, back, y, len);
                if (mb->check && any_nonfinite(mb->dtype, mb->dtype == ALLOY_F32 ? (const void *)y : back, len))
                    __atomic_store_n(p->nonfinite, 1, __ATOMIC_RELAXED);
            }
            if (mb->flag) flag_nonfinite(mb, p->wide, y, dst, roundtrip, len);
            if (mb->scatter) scatter(p, mb, start, len, y);
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
static void run_parallel(cpu_workers *w, const fz_plan *p, int threads, int64_t nchunks)
{
    chunk_job job = {w, p, nchunks / ((int64_t)threads * 4), nchunks};
    if (job.per_block < 1) job.per_block = 1;
    if (threads == 1) job.per_block = nchunks;
    cpu_workers_run(w, threads, (nchunks + job.per_block - 1) / job.per_block, run_chunk_block, &job);
}

/* Index of member id in members[0..n), or -1. members are ascending. */
static int member_index(const sched_member *members, int n, int id)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (members[mid].node == id) return mid;
        if (members[mid].node < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* Whether node n computes in f64 (cpu_ew_uses_f64 over its operands' values). */
static bool member_wide(const ir_node *n, const rt_tensor *values)
{
    rt_tensor in[3];
    for (int j = 0; j < n->nin && j < 3; j++) in[j] = values[n->in[j]];
    return cpu_ew_uses_f64(n, in);
}

/* Whether value id is stored through strides under x's schedule
 * (MEMBER_STRIDED, rank 4: step/attn_views.h); then the elements per step
 * of each dim of out (0 along a dim it broadcasts) into stride, and the
 * offset of its first element from its value's address into *base. */
static bool laid_out_strides(const cpu_exec *x, const ir_graph *g, int id, const ir_type *out, int64_t *stride,
                             int64_t *base)
{
    const schedule *s = x->sched;
    const ir_type *t = &g->nodes[id]->type;
    if (!s || x->graph != g || s->member_of[id] < 0 || !(s->members[s->member_of[id]].flags & MEMBER_STRIDED) ||
        t->rank != 4 || out->rank < 4)
        return false;
    attn_stride l = attn_layout_of(g, s, id);
    const int64_t per_dim[4] = {l.batch, l.head, l.row, 1};
    for (int d = 0; d < out->rank; d++) {
        int td = d - (out->rank - 4);
        stride[d] = td < 0 || t->dims[td] == 1 ? 0 : per_dim[td];
    }
    *base = l.base;
    return true;
}

/* Fills p's members and external inputs (arrays already sized for n members
 * and 3n inputs) and gives each member a chunk buffer: one per value live at
 * a time, none for a stored member of the compute type (computed in place
 * in its destination). ext_slots (ext_mask + 1 of them, all -1, at least
 * twice 3n) index the inputs by node id, so that a group of many inputs
 * (the global gradient norm's sum over every parameter) is planned in time
 * linear in its size. whole: the group's space when it runs over whole
 * values (x's strided ones then read and stored through their strides,
 * laid_out_strides), NULL for a block of rows. Returns NULL, or why the
 * group cannot run. */
static const char *make_plan(fz_plan *p, const cpu_exec *x, const ir_graph *g, const sched_member *members, int n,
                             const rt_tensor *values, const ir_type *whole, const ir_type **in_types, int *last_use,
                             int *free_slots, int *ext_slots, uint32_t ext_mask)
{
    const ir_node *first = g->nodes[members[0].node];
    p->wide = member_wide(first, values);
    alloy_dtype ct = p->wide ? ALLOY_F64 : ALLOY_F32;
    int *ext_id = last_use + n; /* node id of each input (3n ints after last_use) */
    p->ninputs = 0;
    for (int k = 0; k < n; k++) {
        const ir_node *m = g->nodes[members[k].node];
        const cpu_op *info = &cpu_ops[m->op];
        if (!ir_fuse_elementwise(g, m)) return "a member is not an elementwise op or a cast between f16, bf16 and f32";
        bool cast = m->op == IR_OP_cast;
        if (k > 0 && members[k].node <= members[k - 1].node) return "members are not in topological order";
        if (m->type.rank != first->type.rank ||
            memcmp(m->type.dims, first->type.dims, sizeof(int64_t) * (size_t)m->type.rank) != 0)
            return "members have different shapes";
        if (member_wide(m, values) != p->wide) return "members compute in different precisions";
        fz_member *mb = &p->members[k];
        /* a node alone runs the op table's own chunk function: bit for bit
         * cpu_elementwise, NaN payloads included */
        *mb = (fz_member){.f32 = cast ? fz_copy_f32 : n > 1 ? fz_kernels[m->op].f32 : info->ew_f32,
                          .f64 = cast ? fz_copy_f64 : n > 1 ? fz_kernels[m->op].f64 : info->ew_f64,
                          .nin = m->nin, .slot = -1, .dst = values[m->id].data, .dtype = m->type.dtype,
                          .check = (members[k].flags & MEMBER_CHECK) != 0,
                          .ranged = (members[k].flags & MEMBER_RANGED) != 0,
                          .exact = (members[k].flags & MEMBER_EXACT) != 0,
                          .es = alloy_dtype_size(m->type.dtype),
                          .src = {NO_OPERAND, NO_OPERAND, NO_OPERAND}};
        ir_ew_params(m, mb->p);
        int64_t base;
        if (whole && mb->dst && laid_out_strides(x, g, m->id, whole, mb->stride, &base)) {
            mb->scatter = true;
            mb->dst += (size_t)base * mb->es;
        }
        last_use[k] = -1;
        for (int j = 0; j < m->nin; j++) {
            int id = m->in[j], mi = member_index(members, n, id);
            if (mi >= k) return "a member reads a later member";
            if (mi >= 0) {
                mb->src[j] = -mi - 1;
                last_use[mi] = k;
                continue;
            }
            uint32_t h = ((uint32_t)id * 0x9e3779b1u) >> 7 & ext_mask;
            while (ext_slots[h] >= 0 && ext_id[ext_slots[h]] != id) h = (h + 1) & ext_mask;
            int e = ext_slots[h];
            if (e < 0) {
                const rt_tensor *v = &values[id];
                if (!v->data && ir_nbytes(&v->type)) return "an input of the group has no value";
                e = ext_slots[h] = p->ninputs;
                ext_id[e] = id;
                in_types[e] = &v->type;
                fz_input *in = &p->inputs[e];
                *in = (fz_input){.dtype = v->type.dtype, .es = alloy_dtype_size(v->type.dtype), .data = v->data,
                                 .into = -1};
                int64_t at;
                if (whole && laid_out_strides(x, g, id, whole, in->stride, &at)) {
                    in->laid_out = true;
                    in->data += (size_t)at * in->es;
                }
                p->ninputs++;
            }
            mb->src[j] = e;
        }
    }
    /* buffer slots by liveness, in member order */
    int nfree = 0;
    p->nslots = 0;
    for (int k = 0; k < n; k++) {
        fz_member *mb = &p->members[k];
        /* a cast of an external input that neither rounds nor limits
         * the range nor is computed into its destination: the input's
         * chunk buffer (or its data) holds the value for the whole chunk,
         * and no member writes into it */
        mb->passed = mb->f32 == fz_copy_f32 && mb->src[0] >= 0 && !mb->exact && !mb->ranged &&
                     !(mb->dst && mb->dtype == ct) && !mb->scatter;
        if ((mb->scatter || !(mb->dst && mb->dtype == ct)) && !mb->passed)
            mb->slot = nfree ? free_slots[--nfree] : p->nslots++;
        for (int j = 0; j < mb->nin; j++) {
            int mi = mb->src[j] < 0 && mb->src[j] != NO_OPERAND ? -mb->src[j] - 1 : -1;
            if (mi < 0 || last_use[mi] != k || p->members[mi].slot < 0) continue;
            bool dup = false; /* mul(a, a): free a's slot once */
            for (int i = 0; i < j; i++) dup |= mb->src[i] == mb->src[j];
            if (!dup) free_slots[nfree++] = p->members[mi].slot;
        }
        if (last_use[k] < 0 && mb->slot >= 0) free_slots[nfree++] = mb->slot;
    }
    return NULL;
}

/* Hands the GEMM product's range rule and rounded store (x->product) to
 * the chunk loop that loads it, where the product is an input walked
 * densely in f32; else (a broadcast product, an f64 group, a product no
 * member reads) does both over the whole product first, as one pass each. */
static void fold_product(cpu_exec *x, fz_plan *p)
{
    for (int k = 0; k < p->ninputs && !p->wide; k++) {
        fz_input *in = &p->inputs[k];
        if (in->data != (const char *)x->product || in->walk != WALK_DENSE) continue;
        in->ranged = x->product_ranged;
        in->range_dtype = x->product_dtype;
        in->store = x->product_store;
        in->store_dtype = x->product_dtype;
        return;
    }
    if (x->product_store) cvt_store_f32(x->product_dtype, x->product, x->product_store, (size_t)x->product_count);
    if (x->product_ranged) cpu_range_f32(x->product_dtype, x->product, x->product_count);
}

/* A cast member that stores its input as loaded (a widening to the
 * compute type: an f16 or bf16 value cast to f32, alone or in a group)
 * takes its input's chunks converted straight into its destination, and
 * passes them on, instead of converting into a chunk buffer and copying
 * that out. Only for a dense input that is converted (not read in place)
 * and does not overlap the destination. */
static void load_into_dst(fz_plan *p)
{
    alloy_dtype ct = p->wide ? ALLOY_F64 : ALLOY_F32;
    size_t cs = p->wide ? sizeof(double) : sizeof(float);
    for (int k = 0; k < p->nmembers; k++) {
        fz_member *mb = &p->members[k];
        if (mb->f32 != fz_copy_f32 || mb->src[0] < 0 || mb->exact || mb->ranged || !mb->dst || mb->dtype != ct ||
            mb->scatter)
            continue;
        fz_input *in = &p->inputs[mb->src[0]];
        if (in->walk != WALK_DENSE || in->into >= 0 || (in->dtype == ct && !in->aliased && !in->ranged)) continue;
        const char *lo = in->data, *hi = lo + (size_t)p->total * in->es;
        if (mb->dst < hi && lo < mb->dst + (size_t)p->total * cs) continue;
        in->into = k;
        mb->passed = true;
    }
}

/* Bytes of the plan block of a group of n members (members, inputs, input
 * types, last uses + input ids, free slots, the index of the inputs of
 * ext_cap entries, then each input's last reader and whether a reader
 * passes it on: mark_aliased's). */
static size_t group_block_bytes(int n, uint32_t *ext_cap)
{
    uint32_t cap = 16;
    while (cap < 6 * (uint32_t)n) cap *= 2;
    if (ext_cap) *ext_cap = cap;
    return sizeof(fz_member) * (size_t)n + sizeof(fz_input) * 3 * (size_t)n + sizeof(ir_type *) * 3 * (size_t)n +
           sizeof(int) * 5 * (size_t)n + sizeof(int) * cap + (sizeof(int) + 1) * 3 * (size_t)n;
}

/* The most chunk-buffer bytes one thread needs for a group of n members:
 * at most 3n inputs and n slots of CHUNK f64, the roundtrip buffer, the
 * pointers (cpu_run_group_ex's share). */
static size_t share_bound(int n)
{
    size_t at = (size_t)4 * (size_t)n * CHUNK * sizeof(double) + (size_t)CHUNK * 8;
    return (at + sizeof(void *) * 4 * (size_t)n + 63) & ~(size_t)63;
}

alloy_status cpu_workers_reserve(cpu_workers *w, int n, int threads)
{
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    size_t block = group_block_bytes(n, NULL), scratch = share_bound(n) * (size_t)threads;
    if (w->group_block_bytes < block) {
        al_free(w->group_block);
        w->group_block = al_malloc(block);
        w->group_block_bytes = w->group_block ? block : 0;
        if (!w->group_block) return ALLOY_ERR_OOM;
    }
    if (w->scratch_bytes < scratch) {
        void *bigger = al_realloc(w->scratch, scratch);
        if (!bigger) return ALLOY_ERR_OOM;
        w->scratch = bigger;
        w->scratch_bytes = scratch;
    }
    return ALLOY_OK;
}

/* For each input of p: the last member reading it (-1: none) in last[],
 * and in passed[] whether a member reading it passes it on; one pass over
 * the members (a group of every parameter's update has thousands). */
static void input_readers(const fz_plan *p, int *last, uint8_t *passed)
{
    for (int e = 0; e < p->ninputs; e++) last[e] = -1, passed[e] = 0;
    for (int j = 0; j < p->nmembers; j++) {
        const fz_member *mb = &p->members[j];
        for (int q = 0; q < mb->nin; q++) {
            int e = mb->src[q];
            if (e < 0 || e >= p->ninputs) continue;
            last[e] = j;
            passed[e] |= mb->passed;
        }
    }
}

/* Whether input e may be read in place although member k is stored over
 * it: every member reading it comes before k, or is k computed in a chunk
 * buffer of its own (the chunk functions' operands alias no output), and
 * none passes it on (a passed value is the input's chunk itself, which
 * k's store changes). Each chunk is then read before it is overwritten,
 * element for element at the same index. last, passed: input_readers'. */
static bool read_before_store(const fz_plan *p, const int *last, const uint8_t *passed, int e, int k)
{
    if (passed[e] || last[e] > k) return false;
    const fz_member *mb = &p->members[k];
    for (int q = 0; mb->slot < 0 && q < mb->nin; q++)
        if (mb->src[q] == e) return false;
    return true;
}

/* Marks the inputs a member is stored over (an update written into its
 * state's buffer, state_of from the plan, which it reads) and read after
 * that store (read_before_store): those are read through their chunk
 * buffer. ext_slots / ext_id / ext_mask: make_plan's index of the inputs
 * by node id. last, passed: room for input_readers' (the plan block's:
 * a run allocates nothing here, so a step fails before any update). */
static void mark_aliased(fz_plan *p, const sched_member *members, int n, const int *state_of, const int *ext_slots,
                         const int *ext_id, uint32_t ext_mask, int *last, uint8_t *passed)
{
    bool known = false;
    for (int k = 0; k < n; k++) {
        int t = state_of[members[k].node];
        if (t < 0) continue;
        uint32_t h = ((uint32_t)t * 0x9e3779b1u) >> 7 & ext_mask;
        while (ext_slots[h] >= 0 && ext_id[ext_slots[h]] != t) h = (h + 1) & ext_mask;
        int e = ext_slots[h];
        if (e < 0) continue;
        if (!known) input_readers(p, last, passed), known = true;
        if (p->inputs[e].walk != WALK_DENSE || !read_before_store(p, last, passed, e, k)) p->inputs[e].aliased = true;
    }
}

alloy_status cpu_run_group_ex(cpu_exec *x, const ir_graph *g, const sched_member *members, int n,
                              rt_tensor *values, cpu_workers *w, const ir_type *space, int *nonfinite)
{
    const ir_node *last = g->nodes[members[n - 1].node];
    char label[64];
    uint32_t ext_cap;
    size_t bytes = group_block_bytes(n, &ext_cap);
    /* the block reserved in w (cpu_workers_reserve), else one of its own */
    bool own = w->group_block_bytes < bytes;
    char *block = own ? al_malloc(bytes) : w->group_block;
    if (!block)
        return cpu_fail(x, ALLOY_ERR_OOM, "out of memory running the group ending at %s '%s'",
                        ir_ops[last->op].name, ir_node_label(last, label, sizeof label));
    fz_plan p = {.nmembers = n};
    p.members = (fz_member *)(void *)block;
    p.inputs = (fz_input *)(void *)(block + sizeof(fz_member) * (size_t)n);
    const ir_type **in_types = (const ir_type **)(void *)((char *)p.inputs + sizeof(fz_input) * 3 * (size_t)n);
    int *last_use = (int *)(void *)(in_types + 3 * (size_t)n);
    int *free_slots = last_use + 4 * (size_t)n, *ext_slots = free_slots + n;
    for (uint32_t i = 0; i < ext_cap; i++) ext_slots[i] = -1;
    p.nonfinite = nonfinite;
    const char *why = make_plan(&p, x, g, members, n, values, space ? NULL : &last->type, in_types, last_use,
                                free_slots, ext_slots, ext_cap - 1);
    if (why) {
        if (own) al_free(block);
        return cpu_fail(x, ALLOY_ERR_VERIFY, "fusion group ending at %s '%s' cannot run: %s",
                        ir_ops[last->op].name, ir_node_label(last, label, sizeof label), why);
    }
    for (int k = 0; x->nonfinite && k < n; k++) /* amp_check, fused into the chunk loop */
        if (cpu_amp_checked(g, g->nodes[members[k].node])) p.members[k].flag = &x->nonfinite[members[k].node];
    for (int k = 0; x->ranges && k < n; k++) /* amp_stats, the same way */
        p.members[k].range = cpu_range_of(x, g, g->nodes[members[k].node]);
    if (!space) space = &last->type;
    p.total = ir_numel(space);
    if (p.total == 0) {
        if (own) al_free(block);
        return ALLOY_OK;
    }
    build_space(&p, space, in_types);
    if (x->product) fold_product(x, &p);
    if (x->state_of)
        mark_aliased(&p, members, n, x->state_of, ext_slots, last_use + n, ext_cap - 1, ext_slots + ext_cap,
                     (uint8_t *)(ext_slots + ext_cap + 3 * (size_t)n));
    load_into_dst(&p);
    size_t cs = p.wide ? sizeof(double) : sizeof(float);
    p.chunk = (size_t)(p.ninputs + p.nslots) * CHUNK * cs <= SMALL_BUFFERS ? CHUNK : CHUNK / 2;
    int64_t nchunks = (p.total + p.chunk - 1) / p.chunk;
    int64_t work = p.total * (p.ninputs + p.nmembers);
    int64_t want = x->nthreads < 1 ? 1 : x->nthreads > MAX_THREADS ? MAX_THREADS : x->nthreads;
    if (want > work / MIN_WORK) want = work / MIN_WORK;
    if (want > nchunks) want = nchunks;
    int threads = cpu_workers_threads(w, (int)want);
    w->ptr_at = (size_t)(p.ninputs + p.nslots) * (size_t)p.chunk * cs + (size_t)p.chunk * 8;
    w->share = (w->ptr_at + sizeof(void *) * (size_t)(p.ninputs + p.nmembers) + 63) & ~(size_t)63;
    if (w->scratch_bytes < w->share * (size_t)threads) {
        void *bigger = al_realloc(w->scratch, w->share * (size_t)threads);
        if (!bigger) {
            if (own) al_free(block);
            return cpu_fail(x, ALLOY_ERR_OOM, "out of memory for the chunk buffers of %s '%s'",
                            ir_ops[last->op].name, ir_node_label(last, label, sizeof label));
        }
        w->scratch = bigger;
        w->scratch_bytes = w->share * (size_t)threads;
    }
    run_parallel(w, &p, threads, nchunks);
    if (own) al_free(block);
    return ALLOY_OK;
}
