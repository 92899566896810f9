/* emit_ew.c - elementwise kernels: ew steps, casts, GEMM epilogues after the library GEMM, and multi steps (every chain in one launch, found_inf and the gradient norm's squares on the way). */
#include <string.h>

#include "codegen/emit_impl.h"

static bool in_part(const cg_ew_part *p, int node)
{
    int m = p->s->member_of[node];
    return m >= p->first && m < p->first + p->n;
}

/* Appends the element offset of operand node o broadcast against the
 * part's space (coordinates c<d> are declared when `coords`). */
static void offset_of(cg_text *t, const cg_ew_part *p, int o)
{
    const ir_type *sp = p->space, *ty = &p->g->nodes[o]->type;
    if (ir_numel(ty) == 1) {
        cg_put(t, "0");
        return;
    }
    if (ty->rank == sp->rank && memcmp(ty->dims, sp->dims, sizeof(int64_t) * (size_t)sp->rank) == 0) {
        char idx[256]; /* a strided view's (cg_value_index) takes up to ~200 */
        cg_value_index(p->g, p->s, o, p->e, idx, sizeof idx);
        cg_put(t, "%s", idx);
        return;
    }
    int64_t stride = 1;
    bool any = false;
    cg_put(t, "(");
    for (int d = ty->rank - 1; d >= 0; d--) {
        int sd = d + sp->rank - ty->rank;
        if (ty->dims[d] != 1) {
            cg_put(t, "%sc%d * %lldll", any ? " + " : "", sd, (long long)stride);
            any = true;
        }
        stride *= ty->dims[d];
    }
    cg_put(t, "%s)", any ? "" : "0");
}

/* Whether some operand of the part from outside needs coordinates. */
static bool needs_coords(const cg_ew_part *p)
{
    for (int m = p->first; m < p->first + p->n; m++) {
        const ir_node *x = p->g->nodes[p->s->members[m].node];
        for (int j = 0; j < x->nin; j++) {
            const ir_type *ty = &p->g->nodes[x->in[j]]->type;
            if (in_part(p, x->in[j]) || p->s->step_of[x->in[j]] == (int)(p->step - p->s->steps) || ir_numel(ty) == 1)
                continue;
            if (ty->rank != p->space->rank || memcmp(ty->dims, p->space->dims, sizeof(int64_t) * (size_t)ty->rank))
                return true;
        }
    }
    return false;
}

void cg_emit_members(cg_text *t, const cg_ew_part *p)
{
    const ir_graph *g = p->g;
    const schedule *s = p->s;
    if (needs_coords(p)) {
        cg_put(t, "        long long q_ = %s;\n", p->e);
        for (int d = p->space->rank - 1; d >= 0; d--)
            cg_put(t, "        const long long c%d = q_ %% %lldll; q_ /= %lldll; (void)c%d;\n", d,
                   (long long)p->space->dims[d], (long long)p->space->dims[d], d);
    }
    for (int m = p->first; m < p->first + p->n; m++) {
        const sched_member *mb = &s->members[m];
        const ir_node *x = g->nodes[mb->node];
        char src[3][64];
        for (int j = 0; j < 3; j++) {
            if (j >= x->nin) { /* unused operands read as a */
                memcpy(src[j], src[0], sizeof src[j]);
                continue;
            }
            int o = x->in[j];
            int om = s->member_of[o];
            if (in_part(p, o) || (p->product >= 0 && om == p->product)) {
                al_fmt(src[j], sizeof src[j], "v%d", om);
                continue;
            }
            if (p->slot && s->step_of[o] == (int)(p->step - s->steps)) { /* an earlier part's value, this lane's */
                al_fmt(src[j], sizeof src[j], p->stream ? "r%d(%s)" : "r%d[%s]", om, p->slot);
                continue;
            }
            int k = cg_param_of(p->ps, CG_PARAM_NODE, o, false, 0);
            cg_text idx = {0};
            offset_of(&idx, p, o);
            cg_put(t, "        const T x%d_%d = ", m, j);
            /* a widened product stored before its range rule: the rule as it is loaded (sched_mark_ranged_reads) */
            bool ranged = om >= 0 && (s->members[om].flags & MEMBER_RANGED_READ);
            if (ranged) cg_put(t, "alloy_range_%s(", g->nodes[g->nodes[o]->in[0]]->type.dtype == ALLOY_F16 ? "f16" : "bf16");
            char pk[16];
            al_fmt(pk, sizeof pk, "p%d", k);
            if (p->vec && idx.s && strcmp(idx.s, p->e) == 0 && ir_numel(p->space) > 1) {
                if (k >= p->vbase && k - p->vbase < 64) *p->vload |= 1ull << (k - p->vbase);
                else *p->vfail = true;
                al_fmt(pk, sizeof pk, "l%d_", k);
                cg_load(t, g->nodes[o]->type.dtype, pk, "i_");
            } else {
                cg_load(t, g->nodes[o]->type.dtype, pk, idx.s ? idx.s : "0");
            }
            cg_put(t, ranged ? ");\n" : ";\n");
            cg_text_free(&idx);
            al_fmt(src[j], sizeof src[j], "x%d_%d", m, j);
        }
        cg_put(t, "        T v%d;\n        { const T a = %s, b = %s, c = %s; (void)a, (void)b, (void)c; v%d = (T)(",
               m, src[0], src[1], src[2], m);
        cg_put_expr(t, x);
        cg_put(t, "); }\n");
        char v[16];
        al_fmt(v, sizeof v, "v%d", m);
        if (!p->quiet && cg_put_range(t, p->ps, g, x, p->checks, p->wide, v) && p->covered)
            p->covered[x->id] |= CG_CHECK_RANGE;
        cg_apply_flags(t, x->type.dtype, p->wide, mb->flags, v);
        if (p->quiet) continue;
        if (cg_put_flag(t, p->ps, g, x, p->checks, p->wide, v) && p->covered) p->covered[x->id] |= CG_CHECK_FINITE;
        if (mb->flags & MEMBER_STORED) {
            int k = cg_param_of(p->ps, CG_PARAM_NODE, x->id, true, 0);
            char idx[160];
            cg_value_index(g, s, x->id, p->e, idx, sizeof idx);
            if (p->vec && (sched_padded(s, x->id) || (mb->flags & MEMBER_STRIDED))) /* its rows are not whole vectors */
                *p->vfail = true;
            if (p->vec) {
                if (k >= p->vbase && k - p->vbase < 64) *p->vstore |= 1ull << (k - p->vbase);
                else *p->vfail = true;
                cg_put(t, "        s%d_[i_] = ", k);
            } else {
                cg_put(t, "        p%d[%s] = ", k, idx);
            }
            cg_store(t, x->type.dtype, p->wide, v);
            cg_put(t, ";\n");
        }
        if (p->slot && !p->stream && (mb->flags & MEMBER_SPILLED)) /* a later part reads it, rounded */
            cg_put(t, "        r%d[%s] = %s;\n", m, p->slot, v);
        if (mb->flags & MEMBER_CHECK) {
            alloy_dtype dt = x->type.dtype;
            if (dt == ALLOY_F16 || dt == ALLOY_BF16) {
                cg_put(t, "        { %s r_ = ", cg_storage(dt));
                cg_store(t, dt, p->wide, v);
                cg_put(t, "; if (!isfinite(");
                cg_load(t, dt, "(&r_)", "0");
                cg_put(t, ")) bad_ = 1; }\n");
            } else if (ir_is_float(dt)) {
                cg_put(t, "        if (!isfinite(%s)) bad_ = 1;\n", v);
            }
        }
    }
}

static unsigned grid_for(int64_t total)
{
    int64_t blocks = (total + CG_BLOCK - 1) / CG_BLOCK;
    return (unsigned)(blocks < 1 ? 1 : blocks > CG_MAX_GRID ? CG_MAX_GRID : blocks);
}

/* Appends the opening of a grid-stride loop (`{` left open) over [from,
 * to) that sets `const long long var`. Where every element index the loop
 * reaches fits in 32 bits (to plus a grid's stride, times the elements
 * per var, scale) the counter itself is an int: a 64-bit counter, live
 * across the slow paths of divisions and square roots, spilled (the
 * optimizer's updates: 8 B a thread for sm_90 in GPT-2 B32's multi
 * kernel, 12 / 44 B for sm_80 in a lone parameter's AdamW kernel). The
 * body sees the same 64-bit var either way. */
static void put_grid_loop(cg_text *t, const char *var, int64_t from, int64_t to, int scale)
{
    if ((to + (int64_t)CG_MAX_GRID * CG_BLOCK) * scale <= INT32_MAX)
        cg_put(t, "    for (int %s32_ = %lld + (int)(blockIdx.x * blockDim.x + threadIdx.x); %s32_ < %lld;"
                  " %s32_ += (int)(gridDim.x * blockDim.x)) { /* int: (%lld + a grid's stride) x %d < 2^31 */\n"
                  "        const long long %s = %s32_;\n",
               var, (long long)from, var, (long long)to, var, (long long)to, scale, var, var);
    else if (from == 0)
        cg_put(t, "    for (long long %s = (long long)blockIdx.x * blockDim.x + threadIdx.x; %s < %lldll;"
                  " %s += (long long)gridDim.x * blockDim.x) {\n",
               var, var, (long long)to, var);
    else
        cg_put(t, "    for (long long %s = %lldll + (long long)blockIdx.x * blockDim.x + threadIdx.x; %s < %lldll;"
                  " %s += (long long)gridDim.x * blockDim.x) {\n",
               var, (long long)from, var, (long long)to, var);
}

static int64_t part_bytes(const ir_graph *g, const cg_params *ps)
{
    int64_t b = 0;
    for (int i = 0; i < ps->n; i++)
        if (ps->at[i].kind == CG_PARAM_NODE) b += (int64_t)ir_nbytes(&g->nodes[ps->at[i].node]->type);
    return b;
}

/* The statements of an ew step or GEMM epilogue at index p->e: the GEMM's
 * f32 product first (with the matmul's flags; stored when asked), then the
 * members. */
static void ew_body(cg_text *body, cg_ew_part *p)
{
    const schedule *s = p->s;
    if (p->product >= 0) {
        const sched_member *mm = &s->members[p->product];
        const ir_node *x = p->g->nodes[mm->node];
        int kp = cg_param_of(p->ps, CG_PARAM_PRODUCT, x->id, false, 0);
        char idx[160]; /* the product's and the stored matmul's rows: the matmul's row stride (sched_pad) */
        cg_value_index(p->g, s, x->id, "e", idx, sizeof idx);
        if (p->vec && kp < 64 && !sched_padded(s, x->id)) {
            *p->vload |= 1ull << kp;
            cg_put(body, "        T v%d = (T)l%d_[i_];\n", p->product, kp);
        } else {
            if (p->vec) *p->vfail = true;
            cg_put(body, "        T v%d = (T)p%d[%s];\n", p->product, kp, idx);
        }
        if (mm->flags & MEMBER_STORED) {
            int ko = cg_param_of(p->ps, CG_PARAM_NODE, x->id, true, 0);
            cg_put(body, "        p%d[%s] = ", ko, idx);
            char pv[16];
            al_fmt(pv, sizeof pv, "v%d", p->product);
            cg_store(body, x->type.dtype, false, pv);
            cg_put(body, ";\n");
        }
        char pv[16];
        al_fmt(pv, sizeof pv, "v%d", p->product);
        /* the unrounded f32 product, as the CPU checks it (cpu_run_gemm) */
        if (cg_put_range(body, p->ps, p->g, x, p->checks, false, pv) && p->covered) p->covered[x->id] |= CG_CHECK_RANGE;
        if (cg_put_flag(body, p->ps, p->g, x, p->checks, false, pv) && p->covered) p->covered[x->id] |= CG_CHECK_FINITE;
        if ((mm->flags & MEMBER_RANGED) && (x->type.dtype == ALLOY_F16 || x->type.dtype == ALLOY_BF16))
            cg_put(body, "        v%d = alloy_range_%s(v%d);\n", p->product, x->type.dtype == ALLOY_F16 ? "f16" : "bf16",
                   p->product);
    }
    cg_emit_members(body, p);
}

static alloy_dtype param_dtype(const ir_graph *g, const cg_param *pa)
{
    return pa->kind == CG_PARAM_PRODUCT ? ALLOY_F32 : g->nodes[pa->node]->type.dtype;
}

/* Elements a thread moves per vector access: 16 bytes of the widest dtype
 * among the parameters base + i for the bits i of mask (0 when none). */
static int vector_width(const ir_graph *g, const cg_params *ps, uint64_t mask, int base)
{
    size_t widest = 0;
    for (int i = 0; i < 64 && base + i < ps->n; i++)
        if (mask >> i & 1) {
            size_t size = alloy_dtype_size(param_dtype(g, &ps->at[base + i]));
            if (size > widest) widest = size;
        }
    return widest ? (int)(16 / widest) : 0;
}

const char *cg_emit_ew(cg_program *prog, const ir_graph *g, const schedule *s, int k)
{
    const sched_step *st = &s->steps[k];
    const ir_node *last = g->nodes[st->pos];
    cg_ew_part p = {.g = g, .s = s, .step = st, .first = st->first, .n = st->n, .space = &st->space, .product = -1, .e = "e"};
    if (st->kind == STEP_KIND_OP && last->op != IR_OP_cast) return "no kernel yet for this op (a library call or an op kernel)";
    if (st->kind == STEP_KIND_OP) { /* a cast: through f64 when either side is f64 or an integer */
        alloy_dtype a = g->nodes[last->in[0]]->type.dtype, b = last->type.dtype;
        p.wide = a == ALLOY_F64 || b == ALLOY_F64 || ir_is_int(a) || ir_is_int(b);
    } else if (st->kind == STEP_KIND_GEMM) { /* the epilogue: the members after the matmul */
        p.first = st->first + 1, p.n = st->n - 1, p.product = st->first;
        p.wide = s->parts[st->first_part + 1].wide;
    } else {
        p.wide = s->parts[st->first_part].wide;
    }
    if (st->kind != STEP_KIND_OP) /* a cast op step is checked after it, as the CPU does (cg_emit_check_kernel) */
        p.checks = prog->checks, p.covered = prog->covered;
    cg_params ps = {0};
    p.ps = &ps;
    cg_text body = {0}, vbody = {0}, t = {0};
    int64_t total = ir_numel(&st->space);
    /* the vectorized body first (it names the parameters read and written
     * whole), then the scalar one for the tail */
    uint64_t vload = 0, vstore = 0;
    bool vfail = false;
    cg_ew_part vp = p;
    vp.vec = true, vp.vload = &vload, vp.vstore = &vstore, vp.vfail = &vfail;
    ew_body(&vbody, &vp);
    ew_body(&body, &p);
    int width = vfail ? 0 : vector_width(g, &ps, vload | vstore, 0);
    char name[48];
    al_fmt(name, sizeof name, "alloy_s%d_%s", k, sched_kind_name(st->kind));
    cg_put_preamble(&t);
    cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", CG_BLOCK, name);
    cg_param_list(&t, g, &ps);
    cg_put(&t, ")\n{\n    typedef %s T;\n    int bad_ = 0; (void)bad_;\n", p.wide ? "double" : "float");
    int64_t nvec = width > 1 ? total / width : 0;
    if (nvec > 0) {
        put_grid_loop(&t, "g_", 0, nvec, width);
        for (int i = 0; i < ps.n && i < 64; i++) {
            if (!((vload | vstore) >> i & 1)) continue;
            alloy_dtype dt = param_dtype(g, &ps.at[i]);
            int size = (int)alloy_dtype_size(dt);
            if (vload >> i & 1)
                cg_put(&t, "        alignas(16) %s l%d_[%d];\n        alloy_vcopy<%d>(l%d_, p%d + g_ * %d);\n",
                       cg_storage(dt), i, width, size * width, i, i, width);
            if (vstore >> i & 1) cg_put(&t, "        alignas(16) %s s%d_[%d];\n", cg_storage(dt), i, width);
        }
        cg_put(&t, "        for (int i_ = 0; i_ < %d; i_++) {\n        const long long e = g_ * %d + i_;\n%s        }\n",
               width, width, vbody.s ? vbody.s : "");
        for (int i = 0; i < ps.n && i < 64; i++)
            if (vstore >> i & 1)
                cg_put(&t, "        alloy_vcopy<%d>(p%d + g_ * %d, s%d_);\n",
                       (int)alloy_dtype_size(param_dtype(g, &ps.at[i])) * width, i, width, i);
        cg_put(&t, "    }\n");
    }
    int64_t done = nvec * (width > 1 ? width : 1);
    if (done < total) { /* the elements no vector covers */
        put_grid_loop(&t, "e", done, total, 1);
        cg_put(&t, "%s    }\n", body.s ? body.s : "");
    }
    cg_put(&t, "}\n");
    if (nvec > 0) total = nvec;
    bool ok = !body.oom && !vbody.oom && cg_add_kernel(prog, g, name, k, st->kind, &t, &ps, grid_for(total), CG_BLOCK,
                                                       part_bytes(g, &ps));
    cg_text_free(&body), cg_text_free(&vbody), cg_text_free(&t);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}

/* One chain of a multi step: its place in the step's index space (units:
 * a vector of W elements or one element of the tail) and its statements
 * at unit u_. */
typedef struct multi_segment {
    int64_t start, units;
    int64_t chunk; /* with a gradient norm in the step: its first chunk (NORM_CHUNK units each) */
    cg_text body;
} multi_segment;

/* Units (vectors or tail elements) one block sums at a time when the step
 * holds the gradient norm: each such chunk's f32 sum of squares is one
 * partial, so each gradient's sum is over a fixed tree of chunks. */
enum { NORM_CHUNK = 2048 };

/* Appends segments [lo, hi) chunk by chunk: block iteration b_ finds its
 * segment by a balanced tree of comparisons on the chunks' starts, then
 * its threads run the segment's units of that chunk. */
static void put_chunks(cg_text *t, const multi_segment *sg, int lo, int hi, int depth)
{
    if (hi - lo == 1) {
        cg_put(t, "%*s{\n%*s    const long long c0_ = (b_ - %lldll) * %d, c1_ = c0_ + %d < %lldll ? c0_ + %d : %lldll;\n"
                  "%*s    for (long long u_ = c0_ + threadIdx.x; u_ < c1_; u_ += blockDim.x) {\n%s%*s    }\n%*s}\n",
               depth * 4, "", depth * 4, "", (long long)sg[lo].chunk, NORM_CHUNK, NORM_CHUNK, (long long)sg[lo].units,
               NORM_CHUNK, (long long)sg[lo].units, depth * 4, "", sg[lo].body.s ? sg[lo].body.s : "", depth * 4, "",
               depth * 4, "");
        return;
    }
    int mid = (lo + hi) / 2;
    cg_put(t, "%*sif (b_ < %lldll)\n", depth * 4, "", (long long)sg[mid].chunk);
    put_chunks(t, sg, lo, mid, depth + 1);
    cg_put(t, "%*selse\n", depth * 4, "");
    put_chunks(t, sg, mid, hi, depth + 1);
}

/* Appends segments [lo, hi) dispatched on e by a balanced tree of
 * comparisons (log2 of the chain count per element, not a linear scan). */
static void put_segments(cg_text *t, const multi_segment *sg, int lo, int hi, int depth)
{
    if (hi - lo == 1) {
        cg_put(t, "%*s{\n%*s    const long long u_ = e - %lldll;\n%s%*s}\n", depth * 4, "", depth * 4, "",
               (long long)sg[lo].start, sg[lo].body.s ? sg[lo].body.s : "", depth * 4, "");
        return;
    }
    int mid = (lo + hi) / 2;
    cg_put(t, "%*sif (e < %lldll)\n", depth * 4, "", (long long)sg[mid].start);
    put_segments(t, sg, lo, mid, depth + 1);
    cg_put(t, "%*selse\n", depth * 4, "");
    put_segments(t, sg, mid, hi, depth + 1);
}

/* Fills segment m of n elements: with width W > 1, units u_ < n / W move W
 * elements each (the parameters base + i for the bits i of vload read by
 * one 16-byte access into l<k>_, those of vstore written from s<k>_ by
 * one, vbody run per element i_ at index i), the rest one element each
 * (body at index i); width 0 or 1, body alone. */
static void put_segment(multi_segment *m, const ir_graph *g, const cg_params *ps, int64_t n, int width, int base,
                        uint64_t vload, uint64_t vstore, const char *vbody, const char *body)
{
    int64_t nv = width > 1 ? n / width : 0, tail = n - nv * width;
    m->units = nv + tail;
    if (nv > 0) {
        if (tail) cg_put(&m->body, "        if (u_ < %lldll) {\n", (long long)nv);
        else cg_put(&m->body, "        {\n");
        for (int i = 0; i < 64 && base + i < ps->n; i++) {
            if (!((vload | vstore) >> i & 1)) continue;
            alloy_dtype dt = param_dtype(g, &ps->at[base + i]);
            int bytes = (int)alloy_dtype_size(dt) * width;
            if (vload >> i & 1)
                cg_put(&m->body, "        alignas(16) %s l%d_[%d];\n        alloy_vcopy<%d>(l%d_, p%d + u_ * %d);\n",
                       cg_storage(dt), base + i, width, bytes, base + i, base + i, width);
            if (vstore >> i & 1) cg_put(&m->body, "        alignas(16) %s s%d_[%d];\n", cg_storage(dt), base + i, width);
        }
        cg_put(&m->body, "        for (int i_ = 0; i_ < %d; i_++) {\n        const long long i = u_ * %d + i_;\n%s        }\n",
               width, width, vbody);
        for (int i = 0; i < 64 && base + i < ps->n; i++)
            if (vstore >> i & 1)
                cg_put(&m->body, "        alloy_vcopy<%d>(p%d + u_ * %d, s%d_);\n",
                       (int)alloy_dtype_size(param_dtype(g, &ps->at[base + i])) * width, base + i, width, base + i);
        cg_put(&m->body, "        }\n");
    }
    if (tail) /* the elements no vector covers */
        cg_put(&m->body, "        %s{\n        const long long i = u_ + %lldll;\n%s        }\n", nv ? "else " : "",
               (long long)(nv * (width - 1)), body);
}

const char *cg_emit_multi(cg_program *prog, const ir_graph *g, const schedule *s, int k)
{
    const sched_step *st = &s->steps[k];
    const sched_part *lastp = &s->parts[st->first_part + st->nparts - 1];
    const ir_node *fi = lastp->kind == PART_OP ? g->nodes[s->members[lastp->first].node] : NULL;
    /* the gradient norm's sum_squares over found_inf's operands (fuse_norm.c), the part before it */
    const sched_part *normp = fi && st->nparts >= 2 ? lastp - 1 : NULL;
    const ir_node *norm = normp && normp->kind == PART_OP ? g->nodes[s->members[normp->first].node] : NULL;
    if (norm && norm->op != IR_OP_sum_squares) norm = NULL;
    cg_params ps = {0};
    cg_text body = {0}, t = {0};
    int64_t start = 0, chunks = 0;
    int nseg = st->nparts + (fi ? fi->nin : 0), at = 0;
    multi_segment *sg = al_calloc((size_t)nseg + 1, sizeof *sg);
    int *seg_of = norm ? al_malloc(sizeof(int) * ((size_t)g->nnodes + 1)) : NULL; /* a norm operand -> its segment */
    uint8_t *squared = norm ? al_calloc((size_t)g->nnodes + 1, 1) : NULL;
    if (!sg || (norm && (!seg_of || !squared))) {
        al_free(sg), al_free(seg_of), al_free(squared);
        return "out of memory";
    }
    for (int i = 0; norm && i < g->nnodes; i++) seg_of[i] = -1;
    for (int j = 0; norm && j < norm->nin; j++) squared[norm->in[j]] = 1;
    bool oom = false;
    for (int q = st->first_part; q < st->first_part + st->nparts; q++) {
        const sched_part *part = &s->parts[q];
        if (part->kind != PART_EW) continue;
        const ir_type *space = &g->nodes[s->members[part->first + part->n - 1].node]->type;
        int64_t n = ir_numel(space);
        if (n == 0) continue;
        /* the vectorized statements first (they add the chain's own
         * parameters, from base on), then the scalar ones for the tail */
        uint64_t vload = 0, vstore = 0;
        bool vfail = false;
        cg_ew_part p = {.g = g, .s = s, .step = st, .first = part->first, .n = part->n, .space = space,
                        .wide = part->wide, .product = -1, .ps = &ps, .e = "i", .checks = prog->checks,
                        .covered = prog->covered};
        cg_ew_part vp = p;
        vp.vec = true, vp.vbase = ps.n, vp.vload = &vload, vp.vstore = &vstore, vp.vfail = &vfail;
        cg_text vbody = {0}, sbody = {0};
        cg_emit_members(&vbody, &vp);
        cg_emit_members(&sbody, &p);
        for (int mb = part->first; norm && mb < part->first + part->n; mb++) { /* a gradient's squares, in f32 */
            int x = s->members[mb].node;
            if (!squared[x]) continue;
            cg_put(&vbody, "        ss_ += v%d * v%d;\n", mb, mb);
            cg_put(&sbody, "        ss_ += v%d * v%d;\n", mb, mb);
            seg_of[x] = at;
        }
        multi_segment *m = &sg[at++];
        m->start = start;
        if (part->wide) cg_put(&m->body, "        typedef double T;\n");
        put_segment(m, g, &ps, n, vfail ? 0 : vector_width(g, &ps, vload | vstore, vp.vbase), vp.vbase, vload, vstore,
                    vbody.s ? vbody.s : "", sbody.s ? sbody.s : "");
        oom |= vbody.oom || sbody.oom;
        cg_text_free(&vbody), cg_text_free(&sbody);
        start += m->units;
    }
    /* found_inf's operands from outside the step: checked as they are */
    for (int j = 0; fi && j < fi->nin; j++) {
        int o = fi->in[j];
        if (s->step_of[o] == k) continue;
        int64_t n = ir_numel(&g->nodes[o]->type);
        if (n == 0) continue;
        int kp = cg_param_of(&ps, CG_PARAM_NODE, o, false, 0);
        char pk[16], lk[16];
        al_fmt(pk, sizeof pk, "p%d", kp);
        al_fmt(lk, sizeof lk, "l%d_", kp);
        cg_text vbody = {0}, sbody = {0};
        bool sq = norm && squared[o] && seg_of[o] < 0; /* a norm operand from outside: its squares here, once */
        const char *qt = g->nodes[o]->type.dtype == ALLOY_F64 ? "double" : "float"; /* f64 stays f64: no inf made */
        cg_put(&vbody, "        { const %s q_ = ", qt);
        cg_load(&vbody, g->nodes[o]->type.dtype, lk, "i_");
        cg_put(&vbody, "; if (!isfinite(q_)) bad_ = 1;%s }\n", sq ? " ss_ += q_ * q_;" : "");
        cg_put(&sbody, "        { const %s q_ = ", qt);
        cg_load(&sbody, g->nodes[o]->type.dtype, pk, "i");
        cg_put(&sbody, "; if (!isfinite(q_)) bad_ = 1;%s }\n", sq ? " ss_ += q_ * q_;" : "");
        if (sq) seg_of[o] = at;
        multi_segment *m = &sg[at++];
        m->start = start;
        put_segment(m, g, &ps, n, vector_width(g, &ps, 1, kp), kp, 1, 0, vbody.s ? vbody.s : "", sbody.s ? sbody.s : "");
        oom |= vbody.oom || sbody.oom;
        cg_text_free(&vbody), cg_text_free(&sbody);
        start += m->units;
    }
    for (int i = 0; i < at; i++) {
        oom |= sg[i].body.oom;
        sg[i].chunk = chunks;
        chunks += (sg[i].units + NORM_CHUNK - 1) / NORM_CHUNK;
    }
    int64_t *lo = norm ? al_calloc((size_t)norm->nin + 1, sizeof *lo) : NULL;
    int64_t *hi = norm ? al_calloc((size_t)norm->nin + 1, sizeof *hi) : NULL;
    const char *why = norm && (!lo || !hi) ? "out of memory" : NULL;
    for (int j = 0; norm && !why && j < norm->nin; j++) { /* each operand's chunks; none when it has no element */
        int x = norm->in[j], q = seg_of[x];
        if (q >= 0) lo[j] = sg[q].chunk, hi[j] = q + 1 < at ? sg[q + 1].chunk : chunks;
        else if (ir_numel(&g->nodes[x]->type) > 0) why = "a sum_squares operand is not computed or read by its multi step";
    }
    if (norm) al_free(seg_of), al_free(squared);
    if (why) {
        for (int i = 0; i < at; i++) cg_text_free(&sg[i].body);
        al_free(sg), al_free(lo), al_free(hi), al_free(ps.at);
        return why;
    }
    if (at && norm) put_chunks(&body, sg, 0, at, 2);
    else if (at) put_segments(&body, sg, 0, at, 1);
    for (int i = 0; i < at; i++) cg_text_free(&sg[i].body);
    al_free(sg);
    if (oom) body.oom = true;
    char name[48];
    al_fmt(name, sizeof name, "alloy_s%d_multi", k);
    int flag = fi ? cg_param_of(&ps, CG_PARAM_FLAG, fi->id, true, 1) : -1;
    int partial = norm ? cg_param_of(&ps, CG_PARAM_ROWS, norm->id, true, chunks + norm->nin) : -1;
    cg_put_preamble(&t);
    cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", CG_BLOCK, name);
    cg_param_list(&t, g, &ps);
    cg_put(&t, ")\n{\n    typedef float T;\n    int bad_ = 0;\n");
    if (norm) /* chunk by chunk, each chunk's sum of squares a partial */
        cg_put(&t, "    __shared__ float red_[32];\n"
                   "    for (long long b_ = blockIdx.x; b_ < %lldll; b_ += gridDim.x) {\n        float ss_ = 0;\n%s"
                   "        ss_ = alloy_block_sum(ss_, red_);\n"
                   "        if (threadIdx.x == 0) p%d[b_] = (double)ss_;\n    }\n",
               (long long)chunks, body.s ? body.s : "", partial);
    else {
        put_grid_loop(&t, "e", 0, start, 16); /* a unit: at most 16 elements */
        cg_put(&t, "%s    }\n", body.s ? body.s : "");
    }
    if (flag >= 0) cg_put(&t, "    if (bad_) atomicOr(p%d, 1u);\n", flag);
    else cg_put(&t, "    (void)bad_;\n");
    cg_put(&t, "}\n");
    unsigned grid = norm ? (unsigned)(chunks < 1 ? 1 : chunks > CG_MAX_GRID ? CG_MAX_GRID : chunks) : grid_for(start);
    bool ok = !body.oom && cg_add_kernel(prog, g, name, k, STEP_KIND_MULTI, &t, &ps, grid, CG_BLOCK,
                                         part_bytes(g, &ps) + 8 * chunks * (norm != NULL));
    cg_text_free(&body), cg_text_free(&t);
    if (ok && norm) { /* the partials summed per gradient, then in f64; found_inf's bool from the flag */
        al_fmt(name, sizeof name, "alloy_s%d_norm", k);
        ok = !cg_emit_norm_final(prog, g, k, norm, fi, name, chunks, lo, hi);
    }
    al_free(lo), al_free(hi);
    if (ok && fi && !norm) { /* the flag becomes found_inf's bool */
        cg_params fp = {0};
        int kf = cg_param_of(&fp, CG_PARAM_FLAG, fi->id, false, 1);
        int ko = cg_param_of(&fp, CG_PARAM_NODE, fi->id, true, 0);
        al_fmt(name, sizeof name, "alloy_s%d_found_inf", k);
        cg_put_preamble(&t);
        cg_put(&t, "\nextern \"C\" __global__ void %s(", name);
        cg_param_list(&t, g, &fp);
        cg_put(&t, ")\n{\n    if (blockIdx.x == 0 && threadIdx.x == 0) p%d[0] = (unsigned char)(p%d[0] != 0u);\n}\n", ko, kf);
        ok = cg_add_kernel(prog, g, name, k, STEP_KIND_MULTI, &t, &fp, 1, 1, 5);
        cg_text_free(&t);
        al_free(fp.at);
    }
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}
