/* emit_text.c - the emitter's text tools: the kernel preamble, loads and stores per dtype, the member flags, parameters, and the single-op kernel's frame (cg_op_kernel), and a value's element index (padded rows). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/vgelu.h"
#include "codegen/emit_impl.h"
#include "step/attn_views.h"

/* The preamble: storage types are plain integers and floats; conversions
 * follow src/base/convert.c bit for bit on the host (integer arithmetic),
 * and use the hardware's round-to-nearest-even conversions on the device
 * (the same values; NaN payloads may differ). No header is included, so
 * NVRTC needs no include path. */
static const char *const preamble[] = {
    "/* alloy kernel preamble (src/codegen/emit_text.c) */\n"
    "#ifdef __CUDA_ARCH__\n"
    "static __device__ __forceinline__ unsigned alloy_f2u(float f) { return __float_as_uint(f); }\n"
    "static __device__ __forceinline__ float alloy_u2f(unsigned u) { return __uint_as_float(u); }\n"
    "static __device__ __forceinline__ unsigned long long alloy_d2u(double d) { return (unsigned long long)__double_as_longlong(d); }\n"
    "static __device__ __forceinline__ double alloy_u2d(unsigned long long u) { return __longlong_as_double((long long)u); }\n"
    "#else\n"
    "static __device__ __forceinline__ unsigned alloy_f2u(float f) { unsigned u; __builtin_memcpy(&u, &f, 4); return u; }\n"
    "static __device__ __forceinline__ float alloy_u2f(unsigned u) { float f; __builtin_memcpy(&f, &u, 4); return f; }\n"
    "static __device__ __forceinline__ unsigned long long alloy_d2u(double d) { unsigned long long u; __builtin_memcpy(&u, &d, 8); return u; }\n"
    "static __device__ __forceinline__ double alloy_u2d(unsigned long long u) { double d; __builtin_memcpy(&d, &u, 8); return d; }\n"
    "#endif\n"
    "#define ALLOY_INF alloy_u2f(0x7f800000u)\n"
    "#define ALLOY_NAN alloy_u2f(0x7fc00000u)\n"
    ,
    "/* f16 <-> f32 */\n"
    "static __device__ __forceinline__ float alloy_h2f(unsigned short h)\n"
    "{\n"
    "#ifdef __CUDA_ARCH__\n"
    "    float f;\n"
    "    asm(\"{ cvt.f32.f16 %0, %1; }\" : \"=f\"(f) : \"h\"(h));\n"
    "    return f;\n"
    "#else\n"
    "    unsigned sign = (h & 0x8000u) << 16, a = h & 0x7fffu, r = (a << 13) + 0x38000000u;\n"
    "    if (a >= 0x7c00u) r = (a << 13) | 0x7f800000u | (a > 0x7c00u ? 0x400000u : 0u);\n"
    "    if (a < 0x0400u) r = alloy_f2u((float)(int)a * 0x1p-24f);\n"
    "    return alloy_u2f(sign | r);\n"
    "#endif\n"
    "}\n"
    "static __device__ __forceinline__ unsigned short alloy_f2h(float f)\n"
    "{\n"
    "#ifdef __CUDA_ARCH__\n"
    "    unsigned short h;\n"
    "    asm(\"{ cvt.rn.f16.f32 %0, %1; }\" : \"=h\"(h) : \"f\"(f));\n"
    "    return h;\n"
    "#else\n"
    "    unsigned x = alloy_f2u(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;\n"
    "    unsigned n = a - 0x38000000u;\n"
    "    n = (n + 0xfffu + ((n >> 13) & 1u)) >> 13;\n"
    "    unsigned e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;\n"
    "    unsigned s = 126u - (e < 101u || e > 112u ? 101u : e);\n"
    "    unsigned sub = (m + (1u << (s - 1)) - 1u + ((m >> s) & 1u)) >> s;\n"
    "    unsigned r = a < 0x38800000u ? sub : n;\n"
    "    r = a >= 0x477ff000u ? 0x7c00u : r;\n"
    "    r = a > 0x7f800000u ? 0x7e00u | ((a >> 13) & 0x3ffu) : r;\n"
    "    return (unsigned short)(sign | r);\n"
    "#endif\n"
    "}\n"
    ,
    "/* bf16 <-> f32 (integer rules on both sides) */\n"
    "static __device__ __forceinline__ float alloy_bf2f(unsigned short h)\n"
    "{\n"
    "    unsigned u = h;\n"
    "    return alloy_u2f(((u & 0x7fffu) > 0x7f80u ? u | 0x40u : u) << 16);\n"
    "}\n"
    "static __device__ __forceinline__ unsigned short alloy_f2bf(float f)\n"
    "{\n"
    "    unsigned x = alloy_f2u(f), r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;\n"
    "    return (unsigned short)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : r);\n"
    "}\n"
    "/* double -> f16/bf16, rounded once */\n"
    "static __device__ __forceinline__ unsigned long long alloy_rne_shift(unsigned long long v, unsigned s)\n"
    "{\n"
    "    return (v + (1ull << (s - 1)) - 1u + ((v >> s) & 1u)) >> s;\n"
    "}\n"
    "static __device__ __forceinline__ unsigned short alloy_narrow(double d, unsigned mbits, unsigned bias)\n"
    "{\n"
    "    const unsigned shift = 52 - mbits;\n"
    "    const unsigned long long inf = (unsigned long long)(2 * bias + 1) << mbits, mmask = (1ull << mbits) - 1;\n"
    "    unsigned long long x = alloy_d2u(d), sign = (x >> 48) & 0x8000u, a = x & 0x7fffffffffffffffull;\n"
    "    if (a > 0x7ff0000000000000ull) return (unsigned short)(sign | inf | (mmask & ~(mmask >> 1)) | ((a >> shift) & mmask));\n"
    "    unsigned long long ovf = ((unsigned long long)(1023 + bias) << 52) | (((2ull << mbits) - 1) << (shift - 1));\n"
    "    if (a >= ovf) return (unsigned short)(sign | inf);\n"
    "    if (a >= (unsigned long long)(1024 - bias) << 52)\n"
    "        return (unsigned short)(sign | alloy_rne_shift(a - ((unsigned long long)(1023 - bias) << 52), shift));\n"
    "    unsigned e = (unsigned)(a >> 52), s = 1076 - bias - mbits - e;\n"
    "    if (s > 54) s = 54;\n"
    "    return (unsigned short)(sign | alloy_rne_shift((a & 0xfffffffffffffull) | 1ull << 52, s));\n"
    "}\n"
    "static __device__ __forceinline__ unsigned short alloy_d2h(double d) { return alloy_narrow(d, 10, 15); }\n"
    "static __device__ __forceinline__ unsigned short alloy_d2bf(double d) { return alloy_narrow(d, 7, 127); }\n"
    ,
    "/* integers: truncation toward zero with saturation, NaN -> 0 */\n"
    "static __device__ __forceinline__ int alloy_sat_i32(double d)\n"
    "{\n"
    "    return d != d ? 0 : d >= 0x1p31 ? 2147483647 : d <= -0x1p31 ? (-2147483647 - 1) : (int)d;\n"
    "}\n"
    "static __device__ __forceinline__ long long alloy_sat_i64(double d)\n"
    "{\n"
    "    return d != d ? 0 : d >= 0x1p63 ? 9223372036854775807ll : d <= -0x1p63 ? (-9223372036854775807ll - 1) : (long long)d;\n"
    "}\n"
    "/* the range rule: an unrounded f16/bf16 value overflows where a store would */\n"
    "static __device__ __forceinline__ float alloy_range_f16(float x) { return fabsf(x) >= 65520.0f ? (x < 0 ? -ALLOY_INF : ALLOY_INF) : x; }\n"
    "static __device__ __forceinline__ float alloy_range_bf16(float x) { return fabsf(x) >= 0x1.ffp127f ? (x < 0 ? -ALLOY_INF : ALLOY_INF) : x; }\n"
    "static __device__ __forceinline__ double alloy_range_f16(double x) { return fabs(x) >= 65520.0 ? (x < 0 ? -(double)ALLOY_INF : (double)ALLOY_INF) : x; }\n"
    "static __device__ __forceinline__ double alloy_range_bf16(double x) { return fabs(x) >= 0x1.ffp127 ? (x < 0 ? -(double)ALLOY_INF : (double)ALLOY_INF) : x; }\n"
    ,
    "/* warp sums and maxima over 32 lanes (NaN wins the max) */\n"
    "static __device__ __forceinline__ float alloy_warp_sum(float v)\n"
    "{\n"
    "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "    return v;\n"
    "}\n"
    "static __device__ __forceinline__ double alloy_warp_sum(double v)\n"
    "{\n"
    "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "    return v;\n"
    "}\n"
    "template <typename T> static __device__ __forceinline__ T alloy_max(T m, T v) { return (v > m || v != v || m != m) ? (m != m ? m : v) : m; }\n"
    "template <typename T> static __device__ __forceinline__ T alloy_warp_max(T v)\n"
    "{\n"
    "    for (int o = 16; o > 0; o >>= 1) v = alloy_max(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "    return v;\n"
    "}\n"
    "/* block sums and maxima: warps reduce, then every warp reduces the warps' results from\n"
    "   shared memory sh[32] (the same order in every thread); every thread of the block calls */\n"
    "template <typename T> static __device__ __forceinline__ T alloy_block_sum(T v, T *sh)\n"
    "{\n"
    "    v = alloy_warp_sum(v);\n"
    "    __syncthreads();\n"
    "    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
    "    __syncthreads();\n"
    "    return alloy_warp_sum((threadIdx.x & 31) < (blockDim.x >> 5) ? sh[threadIdx.x & 31] : (T)0);\n"
    "}\n"
    "template <typename T> static __device__ __forceinline__ T alloy_block_max(T v, T *sh)\n"
    "{\n"
    "    v = alloy_warp_max(v);\n"
    "    __syncthreads();\n"
    "    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
    "    __syncthreads();\n"
    "    return alloy_warp_max((threadIdx.x & 31) < (blockDim.x >> 5) ? sh[threadIdx.x & 31] : -(T)ALLOY_INF);\n"
    "}\n"
    "/* B bytes moved as one load or store (16: a 128-bit access); both sides aligned to B */\n"
    "template <int B> struct alloy_bits;\n"
    "template <> struct alloy_bits<1> { typedef unsigned char t; };\n"
    "template <> struct alloy_bits<2> { typedef unsigned short t; };\n"
    "template <> struct alloy_bits<4> { typedef unsigned t; };\n"
    "template <> struct alloy_bits<8> { typedef unsigned long long t; };\n"
    "struct alignas(16) alloy_b128 { unsigned long long lo, hi; };\n"
    "template <> struct alloy_bits<16> { typedef alloy_b128 t; };\n"
    "template <int B> static __device__ __forceinline__ void alloy_vcopy(void *dst, const void *src)\n"
    "{\n"
    "    *(typename alloy_bits<B>::t *)dst = *(const typename alloy_bits<B>::t *)src;\n"
    "}\n",
    "/* GELU (erf form) and its derivative: the CPU backend's functions (src/base/vgelu.h), as its text */\n"
    AL_VGELU_TEXT "\n",
};

void cg_put_preamble(cg_text *t)
{
    for (size_t i = 0; i < sizeof preamble / sizeof preamble[0]; i++) cg_put(t, "%s", preamble[i]);
}


const char *cg_storage(alloy_dtype dt)
{
    switch (dt) {
    case ALLOY_F32: return "float";
    case ALLOY_F64: return "double";
    case ALLOY_F16:
    case ALLOY_BF16: return "unsigned short";
    case ALLOY_I32: return "int";
    case ALLOY_I64: return "long long";
    case ALLOY_BOOL: return "unsigned char";
    default: return "void";
    }
}

void cg_load(cg_text *t, alloy_dtype dt, const char *p, const char *idx)
{
    switch (dt) {
    case ALLOY_F16: cg_put(t, "(T)alloy_h2f(%s[%s])", p, idx); return;
    case ALLOY_BF16: cg_put(t, "(T)alloy_bf2f(%s[%s])", p, idx); return;
    case ALLOY_BOOL: cg_put(t, "(%s[%s] ? (T)1 : (T)0)", p, idx); return;
    default: cg_put(t, "(T)%s[%s]", p, idx); return;
    }
}

void cg_store(cg_text *t, alloy_dtype dt, bool wide, const char *v)
{
    switch (dt) {
    case ALLOY_F32: cg_put(t, "(float)(%s)", v); return;
    case ALLOY_F64: cg_put(t, "(double)(%s)", v); return;
    case ALLOY_F16: cg_put(t, wide ? "alloy_d2h(%s)" : "alloy_f2h(%s)", v); return;
    case ALLOY_BF16: cg_put(t, wide ? "alloy_d2bf(%s)" : "alloy_f2bf(%s)", v); return;
    case ALLOY_I32: cg_put(t, "alloy_sat_i32((double)(%s))", v); return;
    case ALLOY_I64: cg_put(t, "alloy_sat_i64((double)(%s))", v); return;
    case ALLOY_BOOL: cg_put(t, "(unsigned char)((%s) != 0)", v); return;
    default: cg_put(t, "0"); return;
    }
}

void cg_apply_flags(cg_text *t, alloy_dtype dt, bool wide, uint8_t flags, const char *v)
{
    if ((flags & MEMBER_RANGED) && (dt == ALLOY_F16 || dt == ALLOY_BF16))
        cg_put(t, "        %s = alloy_range_%s(%s);\n", v, dt == ALLOY_F16 ? "f16" : "bf16", v);
    if (!(flags & MEMBER_EXACT) || (dt == ALLOY_F32 && !wide) || (dt == ALLOY_F64 && wide)) return;
    cg_put(t, "        { %s r_ = ", cg_storage(dt));
    cg_store(t, dt, wide, v);
    cg_put(t, "; %s = ", v);
    cg_load(t, dt, "(&r_)", "0");
    cg_put(t, "; }\n");
}

void cg_double(cg_text *t, double v)
{
    if (isnan(v)) cg_put(t, "(T)ALLOY_NAN");
    else if (isinf(v)) cg_put(t, v < 0 ? "(T)-ALLOY_INF" : "(T)ALLOY_INF");
    else cg_put(t, "(T)%a", v);
}

void cg_put_expr(cg_text *t, const ir_node *x)
{
    if (x->op == IR_OP_cast) {
        cg_put(t, "a");
        return;
    }
    const char *e = ir_ops[x->op].expr;
    double p[IR_EW_MAX_ATTRS] = {0};
    int np = ir_ew_params(x, p);
    while (*e) {
        const char *at = strstr(e, "P(");
        while (at && at > e && (isalnum((unsigned char)at[-1]) || at[-1] == '_')) at = strstr(at + 1, "P(");
        char *end = NULL;
        long k = at ? strtol(at + 2, &end, 10) : -1;
        if (!at || end == at + 2 || *end != ')' || k < 0 || k >= np) { /* no attribute reference left */
            cg_put(t, "%s", e);
            return;
        }
        cg_put(t, "%.*s(", (int)(at - e), e);
        cg_double(t, p[k]);
        cg_put(t, ")");
        e = end + 1;
    }
}

int cg_param_of(cg_params *ps, cg_param_kind kind, int node, bool written, int64_t count)
{
    for (int i = 0; i < ps->n; i++)
        if (ps->at[i].kind == kind && ps->at[i].node == node) {
            ps->at[i].written |= written;
            return i;
        }
    if (ps->n == ps->cap) {
        int cap = ps->cap ? ps->cap * 2 : 16;
        cg_param *at = al_realloc(ps->at, sizeof *at * (size_t)cap);
        if (!at) {
            ps->oom = true;
            return 0;
        }
        ps->at = at, ps->cap = cap;
    }
    ps->at[ps->n] = (cg_param){kind, node, written, count};
    return ps->n++;
}

static void param_type(cg_text *t, const ir_graph *g, const cg_param *p);

void cg_param_list(cg_text *t, const ir_graph *g, const cg_params *ps)
{
    for (int i = 0; i < ps->n; i++) {
        cg_put(t, "%s", i ? ", " : "");
        param_type(t, g, &ps->at[i]);
        cg_put(t, "__restrict__ p%d", i);
    }
}

/* The parameter's C++ type, e.g. "const float *". */
static void param_type(cg_text *t, const ir_graph *g, const cg_param *p)
{
    const char *ty = p->kind == CG_PARAM_PRODUCT ? "float"
                     : p->kind == CG_PARAM_FLAG || p->kind == CG_PARAM_CHECKS || p->kind == CG_PARAM_COUNTER
                         ? "unsigned int"
                     : p->kind == CG_PARAM_ROWS  ? (g->nodes[p->node]->type.dtype == ALLOY_F64 ? "double" : "float")
                     : p->kind == CG_PARAM_KEPT  ? "float"
                                                 : cg_storage(g->nodes[p->node]->type.dtype);
    cg_put(t, "%s%s *", p->written ? "" : "const ", ty);
}

bool cg_add_kernel(cg_program *p, const ir_graph *g, const char *name, int step, step_kind kind, cg_text *text,
                   cg_params *params, unsigned grid, unsigned block, int64_t bytes)
{
    /* the host emulation's entry: the kernel called with cuLaunchKernel-style parameters */
    cg_put(text, "#ifdef ALLOY_HOST_EMULATION\nextern \"C\" void %s__host(void **params)\n{\n    %s(", name, name);
    for (int i = 0; i < params->n; i++) {
        cg_put(text, "%s*(", i ? ", " : "");
        param_type(text, g, &params->at[i]);
        cg_put(text, "*)params[%d]", i);
    }
    cg_put(text, ");\n}\n#endif\n");
    if (text->oom || params->oom) return false;
    if (p->nkernels == p->cap) {
        int cap = p->cap ? p->cap * 2 : 32;
        cg_kernel *k = al_realloc(p->kernels, sizeof *k * (size_t)cap);
        if (!k) return false;
        p->kernels = k, p->cap = cap;
    }
    cg_kernel *k = &p->kernels[p->nkernels++];
    cg_text pre = {0};
    cg_put_preamble(&pre);
    bool whole = !pre.oom && text->len >= pre.len && memcmp(text->s, pre.s, pre.len) == 0;
    *k = (cg_kernel){.step = step, .kind = kind, .source = text->s, .body = whole ? pre.len : 0, .params = params->at,
                     .nparams = params->n, .grid = grid, .block = block, .bytes = bytes};
    cg_text_free(&pre);
    al_fmt(k->name, sizeof k->name, "%s", name);
    memset(text, 0, sizeof *text);
    memset(params, 0, sizeof *params);
    return true;
}

char *cg_module_source(const cg_program *p, int first, int n)
{
    cg_text t = {0};
    cg_put_preamble(&t);
    for (int i = first; i < first + n && i < p->nkernels; i++) cg_put(&t, "%s", p->kernels[i].source + p->kernels[i].body);
    if (t.oom) {
        cg_text_free(&t);
        return NULL;
    }
    return t.s;
}

static unsigned grid_for(int64_t total)
{
    int64_t blocks = (total + CG_BLOCK - 1) / CG_BLOCK;
    return (unsigned)(blocks < 1 ? 1 : blocks > CG_MAX_GRID ? CG_MAX_GRID : blocks);
}

/* A kernel over the node's elements: body (statements at flat index e) in a grid-stride loop (emit_impl.h). */
bool cg_op_kernel(cg_program *prog, const ir_graph *g, int k, const char *name, const char *compute_type,
                  cg_text *body, cg_params *ps, int64_t total, const char *file_scope, const char *before)
{
    cg_text t = {0};
    cg_put_preamble(&t);
    cg_put(&t, "%s\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", file_scope ? file_scope : "", CG_BLOCK, name);
    cg_param_list(&t, g, ps);
    cg_put(&t, ")\n{\n    typedef %s T;\n%s", compute_type, before ? before : "");
    cg_put(&t, "    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < %lldll;"
               " e += (long long)gridDim.x * blockDim.x) {\n%s    }\n}\n",
           (long long)total, body->s ? body->s : "");
    int64_t bytes = 0;
    for (int i = 0; i < ps->n; i++)
        if (ps->at[i].kind == CG_PARAM_NODE) bytes += (int64_t)ir_nbytes(&g->nodes[ps->at[i].node]->type);
    bool ok = !body->oom && cg_add_kernel(prog, g, name, k, STEP_KIND_OP, &t, ps, grid_for(total), CG_BLOCK, bytes);
    cg_text_free(&t);
    return ok;
}

void cg_value_index(const ir_graph *g, const schedule *s, int node, const char *e, char *buf, size_t len)
{
    const ir_type *v = &g->nodes[node]->type;
    if (s && s->member_of[node] >= 0 && (s->members[s->member_of[node]].flags & MEMBER_STRIDED) && v->rank == 4) {
        /* a strided view or result [B, H, R, D] (step/attn_views.h): element (b, h, r, d) of the flat index */
        attn_stride l = attn_layout_of(g, s, node);
        long long H = (long long)v->dims[1], R = (long long)v->dims[2], D = (long long)v->dims[3];
        al_fmt(buf, len, "(%lld + (%s) / %lld * %lld + (%s) / %lld %% %lld * %lld + (%s) / %lld %% %lld * %lld + (%s) %% %lld)",
               (long long)l.base, e, H * R * D, (long long)l.batch, e, R * D, H, (long long)l.head, e, D, R,
               (long long)l.row, e, D);
        return;
    }
    if (!sched_padded(s, node)) {
        al_fmt(buf, len, "%s", e);
        return;
    }
    const ir_type *t = &g->nodes[node]->type;
    long long c = (long long)t->dims[t->rank - 1];
    al_fmt(buf, len, "((%s) / %lldll * %lldll + (%s) %% %lldll)", e, c, (long long)s->row_stride[node], e, c);
}
