/* launch_plan.c - building the launch plan (launch_plan.h): places for every kernel argument, GEMMs in the library's convention (a gemm step's convolution is a kernel), flags zeroed, updates copied. */
#include <string.h>

#include "ir/groups.h"
#include "step/attn_views.h"
#include "step/launch_plan.h"

/* A growing plan, with the first failure's message. */
typedef struct lp_builder {
    lp_plan *lp;
    const schedule *s; /* the padded row strides (sched_ld) */
    int acap, gcap;
    int64_t pcap;   /* ptr_offsets' capacity */
    int64_t ptr_at; /* the pointer arrays' bytes so far (their offsets are made absolute at the end) */
    char *err;
    size_t errlen;
    alloy_status status;
    int *kept_node;       /* the nodes with a kept or counter slot, */
    cg_param_kind *kept_kind; /* which of the two, */
    int64_t *kept_offset; /* and where each starts in the aux block */
    int nkept;
} lp_builder;

static bool grow(void **arr, int *cap, int need, size_t size)
{
    if (need <= *cap) return true;
    int cap2 = *cap ? *cap * 2 : 64;
    while (cap2 < need) cap2 *= 2;
    void *p = al_realloc(*arr, size * (size_t)cap2);
    if (!p) return false;
    *arr = p;
    *cap = cap2;
    return true;
}

static bool oom(lp_builder *b)
{
    if (!b->status) {
        b->status = ALLOY_ERR_OOM;
        al_fmt(b->err, b->errlen, "out of memory building the launch plan");
    }
    return false;
}

static bool add_action(lp_builder *b, lp_action a)
{
    lp_plan *lp = b->lp;
    if (!grow((void **)&lp->actions, &b->acap, lp->nactions + 1, sizeof a)) return oom(b);
    lp->actions[lp->nactions++] = a;
    return true;
}

static int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

bool lp_place_of(const ir_graph *g, const mem_plan *p, int node, lp_place *out)
{
    const ir_node *n = g->nodes[node];
    if (n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state) {
        *out = (lp_place){LP_LEAF, node, 0};
        return true;
    }
    if (node < p->nnodes && p->state_of && p->state_of[node] >= 0) { /* an update written in place */
        *out = (lp_place){LP_LEAF, p->state_of[node], 0};
        return true;
    }
    if (node >= p->nnodes || p->offset[node] < 0) return false;
    *out = (lp_place){LP_ARENA, -1, p->offset[node]};
    return true;
}

int lp_alignment(int64_t offset, int64_t stride_bytes, int64_t batch)
{
    int a = LP_AUX_ALIGN;
    while (a > 1 && (offset % a || (batch > 1 && stride_bytes % a))) a /= 2;
    return a;
}

int lp_gemm_alignment(const lp_plan *lp, const lp_gemm *gm, int which)
{
    const lp_place *pl = which == 0 ? &gm->a : which == 1 ? &gm->b : &gm->out;
    alloy_dtype dt = which == 2 ? gm->d : gm->ab;
    if (!gm->pointers) {
        int64_t stride = which == 0 ? gm->stride_a : which == 1 ? gm->stride_b : gm->stride_d;
        return lp_alignment(pl->offset, stride * (int64_t)alloy_dtype_size(dt), gm->batch);
    }
    int a = lp_alignment(pl->offset, 0, 1);
    const int64_t *po = &lp->ptr_offsets[gm->ptrs + which * gm->batch];
    for (int64_t i = 0; i < gm->batch; i++)
        while (a > 1 && (pl->offset + po[i]) % a) a /= 2;
    return a;
}

void lp_gemm_pointers(const lp_plan *lp, const lp_gemm *gm, uint64_t a, uint64_t b, uint64_t out, uint64_t *ptrs)
{
    const int64_t *po = &lp->ptr_offsets[gm->ptrs];
    for (int64_t i = 0; i < 3 * gm->batch; i++)
        ptrs[i] = (i < gm->batch ? a : i < 2 * gm->batch ? b : out) + (uint64_t)po[i];
}

static bool place_or_fail(lp_builder *b, const ir_graph *g, const mem_plan *p, int node, int step, lp_place *out)
{
    if (lp_place_of(g, p, node, out)) return true;
    char label[64];
    if (!b->status) {
        b->status = ALLOY_ERR_INVALID;
        al_fmt(b->err, b->errlen, "step %d: %s %s has no place in memory (not stored by its step)", step,
               ir_ops[g->nodes[node]->op].name, ir_node_label(g->nodes[node], label, sizeof label));
    }
    return false;
}

static bool strided(const schedule *s, int i)
{
    return s->member_of[i] >= 0 && (s->members[s->member_of[i]].flags & MEMBER_STRIDED);
}

/* Strided value x ([B, H, R, D]) as a GEMM operand: its two batch strides
 * into st[0..1] (elements), its row stride into *ld, its base into *at. */
static void strided_operand(const ir_graph *g, const schedule *s, int x, size_t es, int64_t *st, int64_t *ld, lp_place *at)
{
    attn_stride l = attn_layout_of(g, s, x);
    st[0] = l.batch, st[1] = l.head, *ld = l.row;
    at->offset += l.base * (int64_t)es;
}

/* The GEMMs of matmul n into `out` (dtype d, the value of node result):
 * one strided-batched call per combination of the batch dims that do not
 * fold into one stride (one pointer-array call for them all where a
 * strided view gives them two batch strides, every place is the arena's
 * and there is no epilogue); with lib (a step lp_library_epilogue takes),
 * each with its epilogue: the bias vector added (the same for every batch:
 * cuBLASLt's bias batch stride 0), GELU, and GELU's input written at its
 * slot beside D (as D, a batch stride apart). D is node result's value. */
static bool add_gemm_epilogue(lp_builder *b, const ir_graph *g, const mem_plan *p, int step, const ir_node *n,
                              lp_place out, alloy_dtype d, int result, const lp_library *lib)
{
    int bias = lib ? lib->bias : -1, aux = lib ? lib->aux : -1;
    bool gelu = lib && lib->gelu;
    lp_epilogue epi = gelu ? (aux >= 0 ? (bias >= 0 ? LP_EPILOGUE_GELU_AUX_BIAS : LP_EPILOGUE_GELU_AUX)
                                       : (bias >= 0 ? LP_EPILOGUE_GELU_BIAS : LP_EPILOGUE_GELU))
                          : bias >= 0 ? LP_EPILOGUE_BIAS
                                      : LP_EPILOGUE_NONE;
    const ir_type *ta = &g->nodes[n->in[0]]->type, *tb = &g->nodes[n->in[1]]->type, *to = &n->type;
    bool trans_a = ir_attr_i(n, "transpose_a") != 0, trans_b = ir_attr_i(n, "transpose_b") != 0;
    int64_t m = to->dims[to->rank - 2], nn = to->dims[to->rank - 1];
    int64_t k = ta->dims[ta->rank - (trans_a ? 2 : 1)];
    if (ir_numel(to) == 0) return true;
    if (k == 0) /* empty sums: +0 */
        return add_action(b, (lp_action){.kind = LP_ZERO, .step = step, .dst = out,
                                         .bytes = (int64_t)alloy_dtype_size(d) * ir_numel(to)});
    lp_place pa, pb, pbias = {0}, paux = {0};
    if (!place_or_fail(b, g, p, n->in[0], step, &pa) || !place_or_fail(b, g, p, n->in[1], step, &pb)) return false;
    if (bias >= 0 && !place_or_fail(b, g, p, bias, step, &pbias)) return false;
    if (aux >= 0 && !place_or_fail(b, g, p, aux, step, &paux)) return false;
    /* batch dims of the output, size-1 dims dropped, with each operand's strides */
    int r = to->rank - 2, nb = 0;
    int64_t sa_all[ALLOY_MAX_RANK], sb_all[ALLOY_MAX_RANK], dims[ALLOY_MAX_RANK], sa[ALLOY_MAX_RANK],
        sb[ALLOY_MAX_RANK], sd[ALLOY_MAX_RANK];
    ir_matmul_batch_strides(ta, r, sa_all);
    ir_matmul_batch_strides(tb, r, sb_all);
    int64_t step_d = m * nn, sd_all[ALLOY_MAX_RANK]; /* the output is dense */
    for (int i = r - 1; i >= 0; i--) {
        sd_all[i] = step_d;
        step_d *= to->dims[i];
    }
    /* the row strides: padded values' (sched_pad), or a strided view's (attn_views.h) */
    int64_t ld_a = sched_ld(g, b->s, n->in[0]), ld_b = sched_ld(g, b->s, n->in[1]), ld_d = sched_ld(g, b->s, result);
    bool viewed = attn_strided_matmul(g, n) &&
                  (strided(b->s, n->in[0]) || strided(b->s, n->in[1]) || (result == n->id && strided(b->s, n->id)));
    if (viewed) { /* [B, H, R, D] values stored in another order: two batch strides each */
        size_t es = alloy_dtype_size(ta->dtype);
        if (strided(b->s, n->in[0])) strided_operand(g, b->s, n->in[0], es, sa_all, &ld_a, &pa);
        if (strided(b->s, n->in[1])) strided_operand(g, b->s, n->in[1], es, sb_all, &ld_b, &pb);
        if (result == n->id && strided(b->s, n->id)) strided_operand(g, b->s, n->id, alloy_dtype_size(d), sd_all, &ld_d, &out);
    }
    for (int i = 0; i < r; i++) {
        if (to->dims[i] == 1) continue;
        dims[nb] = to->dims[i], sa[nb] = sa_all[i], sb[nb] = sb_all[i], sd[nb] = sd_all[i];
        nb++;
    }
    /* fold the innermost dims into one strided batch while the strides allow */
    int inner = nb;
    int64_t batch = 1, stra = 0, strb = 0, strd = m * nn;
    if (nb > 0) {
        inner = nb - 1;
        batch = dims[inner], stra = sa[inner], strb = sb[inner], strd = sd[inner];
        while (inner > 0 && sa[inner - 1] == stra * batch && sb[inner - 1] == strb * batch &&
               sd[inner - 1] == strd * batch) {
            inner--;
            batch *= dims[inner];
        }
    }
    /* one call per index of the outer dims [0, inner) */
    int64_t outer = 1;
    for (int i = 0; i < inner; i++) outer *= dims[i];
    size_t ea = alloy_dtype_size(ta->dtype), ed = alloy_dtype_size(d);
    lp_plan *lp = b->lp;
    if (viewed && outer > 1 && epi == LP_EPILOGUE_NONE && pa.space == LP_ARENA && pb.space == LP_ARENA && out.space == LP_ARENA) {
        /* strided views with two batch levels, places the executable keeps: one call over arrays of pointers
         * (any other product keeps its plan: strided calls) */
        lp_gemm gm = {.node = n->id, .step = step, .result = result, .bias_node = -1, .aux_node = -1,
                      .epilogue = LP_EPILOGUE_NONE,
                      .ab = ta->dtype, .d = d, .ta = trans_b, .tb = trans_a, .m = nn, .n = m, .k = k,
                      .lda = ld_b, .ldb = ld_a, .ldd = ld_d, .batch = outer * batch, .a = pb, .b = pa, .out = out,
                      .pointers = true, .ptrs = lp->nptr_offsets, .ptr_at = {LP_AUX, -1, b->ptr_at}};
        int64_t need = lp->nptr_offsets + 3 * gm.batch;
        if (need > b->pcap) {
            int64_t cap = b->pcap ? 2 * b->pcap : 256;
            while (cap < need) cap *= 2;
            int64_t *q = al_realloc(lp->ptr_offsets, sizeof(int64_t) * (size_t)cap);
            if (!q) return oom(b);
            lp->ptr_offsets = q, b->pcap = cap;
        }
        int64_t *po = &lp->ptr_offsets[gm.ptrs];
        for (int64_t j = 0; j < gm.batch; j++) { /* matrix j: outer index j / batch, inner j % batch */
            int64_t rem = j / batch, ii = j % batch, off_a = ii * stra, off_b = ii * strb, off_d = ii * strd;
            for (int i = inner - 1; i >= 0; i--) {
                int64_t idx = rem % dims[i];
                rem /= dims[i];
                off_a += idx * sa[i], off_b += idx * sb[i], off_d += idx * sd[i];
            }
            po[j] = off_b * (int64_t)ea, po[gm.batch + j] = off_a * (int64_t)ea, po[2 * gm.batch + j] = off_d * (int64_t)ed;
        }
        lp->nptr_offsets = need;
        b->ptr_at += round_up(3 * gm.batch * (int64_t)sizeof(uint64_t), LP_AUX_ALIGN);
        if (!grow((void **)&lp->gemms, &b->gcap, lp->ngemms + 1, sizeof gm)) return oom(b);
        lp->gemms[lp->ngemms] = gm;
        return add_action(b, (lp_action){.kind = LP_GEMM, .step = step, .index = lp->ngemms++});
    }
    for (int64_t o = 0; o < outer; o++) {
        int64_t rem = o, off_a = 0, off_b = 0, off_d = 0;
        for (int i = inner - 1; i >= 0; i--) {
            int64_t idx = rem % dims[i];
            rem /= dims[i];
            off_a += idx * sa[i], off_b += idx * sb[i], off_d += idx * sd[i];
        }
        lp_gemm gm = {.node = n->id, .step = step, .result = result, .bias_node = bias, .bias = pbias,
                      .aux_node = aux, .aux = paux, .ld_aux = aux >= 0 ? ld_d : 0, .epilogue = epi, .ab = ta->dtype, .d = d,
                      /* row-major out = op(a) op(b) is column-major out^T = op(b)^T op(a)^T */
                      .ta = trans_b, .tb = trans_a, .m = nn, .n = m, .k = k,
                      .lda = ld_b, .ldb = ld_a, .ldd = ld_d,
                      .batch = batch, .stride_a = strb, .stride_b = stra, .stride_d = strd,
                      .a = pb, .b = pa, .out = out};
        gm.a.offset += off_b * (int64_t)ea, gm.b.offset += off_a * (int64_t)ea, gm.out.offset += off_d * (int64_t)ed;
        if (aux >= 0) gm.aux.offset += off_d * (int64_t)ed; /* GELU's input: D's type and layout (lp_library_epilogue) */
        if (!grow((void **)&lp->gemms, &b->gcap, lp->ngemms + 1, sizeof gm)) return oom(b);
        lp->gemms[lp->ngemms] = gm;
        if (!add_action(b, (lp_action){.kind = LP_GEMM, .step = step, .index = lp->ngemms++})) return false;
    }
    return true;
}

/* add_gemm_epilogue without an epilogue: D is matmul n's value. */
static bool add_gemm(lp_builder *b, const ir_graph *g, const mem_plan *p, int step, const ir_node *n, lp_place out,
                     alloy_dtype d)
{
    return add_gemm_epilogue(b, g, p, step, n, out, d, n->id, NULL);
}

/* A step's aux slots: one per (kind, node) of its flags and per-row partials. */
typedef struct aux_slot {
    cg_param_kind kind;
    int node;
    int64_t offset;
} aux_slot;

/* The elementwise, row and multi kernels load and store 16 bytes at a
 * time (emit_ew.c, emit_row.c), so every kernel argument must start
 * 16-byte aligned. It does by construction: arena slots are
 * PLAN_ALIGN-aligned, aux slots LP_AUX_ALIGN-aligned, leaves start their
 * own allocations (256-byte aligned); this says so rather than fault on a
 * misaligned address. */
#define LP_KERNEL_ALIGN 16
_Static_assert(PLAN_ALIGN % LP_KERNEL_ALIGN == 0 && LP_AUX_ALIGN % LP_KERNEL_ALIGN == 0,
               "kernel arguments must stay 16-byte aligned");

static bool aligned_or_fail(lp_builder *b, const cg_kernel *kn, int i, const lp_place *at)
{
    if (at->offset % LP_KERNEL_ALIGN == 0) return true;
    if (!b->status) {
        b->status = ALLOY_ERR_INVALID;
        al_fmt(b->err, b->errlen, "step %d: kernel %s parameter %d at byte offset %lld: not %d-byte aligned", kn->step,
               kn->name, i, (long long)at->offset, LP_KERNEL_ALIGN);
    }
    return false;
}

/* The kernels [first, end) of step k: flags zeroed, arguments placed. */
static bool add_kernels(lp_builder *b, const ir_graph *g, const mem_plan *p, const cg_program *prog, int k, int first,
                        int end)
{
    lp_plan *lp = b->lp;
    aux_slot slots[16];
    int nslots = 0;
    int64_t aux = (int64_t)(lp->checks_bytes + lp->kept_bytes + lp->counter_bytes); /* the run's words stay below every step's slots */
    for (int q = first; q < end; q++) {
        const cg_kernel *kn = &prog->kernels[q];
        for (int i = 0; i < kn->nparams; i++) {
            const cg_param *pa = &kn->params[i];
            lp_place *at = &lp->args[lp->first_arg[q] + i];
            if (pa->kind == CG_PARAM_NODE) {
                if (!place_or_fail(b, g, p, pa->node, k, at) || !aligned_or_fail(b, kn, i, at)) return false;
                continue;
            }
            if (pa->kind == CG_PARAM_CHECKS) {
                *at = (lp_place){LP_AUX, -1, 0};
                continue;
            }
            if (pa->kind == CG_PARAM_KEPT || pa->kind == CG_PARAM_COUNTER) {
                int s = 0;
                while (s < b->nkept && !(b->kept_node[s] == pa->node && b->kept_kind[s] == pa->kind)) s++;
                *at = (lp_place){LP_AUX, -1, s < b->nkept ? b->kept_offset[s] : 0};
                continue;
            }
            if (pa->kind == CG_PARAM_PRODUCT) {
                *at = (lp_place){LP_ARENA, -1, (int64_t)p->scratch_offset};
                if (!aligned_or_fail(b, kn, i, at)) return false;
                continue;
            }
            int s = 0;
            while (s < nslots && !(slots[s].kind == pa->kind && slots[s].node == pa->node)) s++;
            if (s == nslots) {
                if (nslots == 16) {
                    b->status = ALLOY_ERR_UNSUPPORTED;
                    al_fmt(b->err, b->errlen, "step %d: more than 16 scratch buffers", k);
                    return false;
                }
                int64_t size = pa->kind == CG_PARAM_FLAG ? 4
                                                         : pa->count * (g->nodes[pa->node]->type.dtype == ALLOY_F64 ? 8 : 4);
                slots[nslots] = (aux_slot){pa->kind, pa->node, aux};
                if (pa->kind == CG_PARAM_FLAG &&
                    !add_action(b, (lp_action){.kind = LP_ZERO, .step = k, .dst = {LP_AUX, -1, aux}, .bytes = 4}))
                    return false;
                aux += round_up(size > 0 ? size : 1, LP_AUX_ALIGN);
                nslots++;
            }
            *at = (lp_place){LP_AUX, -1, slots[s].offset};
        }
    }
    if ((size_t)aux > lp->aux_bytes) lp->aux_bytes = (size_t)aux;
    for (int q = first; q < end; q++)
        if (!add_action(b, (lp_action){.kind = LP_KERNEL, .step = k, .index = q})) return false;
    return true;
}

/* Whether every value step k computes has no element (softmax of a [0, 4]
 * input): nothing to launch, whatever the emitter says of the step. */
static bool computes_nothing(const ir_graph *g, const schedule *s, int k)
{
    const sched_step *st = &s->steps[k];
    for (int m = st->first; m < st->first + st->n; m++)
        if (ir_numel(&g->nodes[s->members[m].node]->type) > 0) return false;
    return true;
}

static const char *skipped_why(const cg_program *prog, int k)
{
    for (int i = 0; i < prog->nskipped; i++)
        if (prog->skipped[i] == k) return prog->why[i];
    return NULL;
}

alloy_status lp_build(const ir_graph *g, const schedule *s, const mem_plan *p, const cg_program *prog, lp_plan *out,
                      char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    lp_builder b = {.lp = out, .s = s, .err = err, .errlen = errlen};
    out->arena_bytes = p->arena_bytes;
    out->nkernels = prog->nkernels;
    out->first_arg = al_malloc(sizeof(int) * ((size_t)prog->nkernels + 1));
    int nargs = 0;
    for (int q = 0; out->first_arg && q < prog->nkernels; q++) {
        out->first_arg[q] = nargs;
        nargs += prog->kernels[q].nparams;
    }
    out->args = al_calloc((size_t)nargs + 1, sizeof(lp_place));
    if (!out->first_arg || !out->args) oom(&b);
    if (prog->checks && !b.status) { /* amp_check / amp_stats: the words zeroed once, before the first step */
        out->checks_bytes = (size_t)round_up((int64_t)g->nnodes * CG_CHECK_WORDS * 4, LP_AUX_ALIGN);
        out->aux_bytes = out->checks_bytes;
        add_action(&b, (lp_action){.kind = LP_ZERO, .step = 0, .dst = {LP_AUX, -1, 0}, .bytes = (int64_t)out->checks_bytes});
    }
    /* the kept slots: one per node that kernels keep statistics of, sized by its largest count; then the
     * counter slots, one per node whose one-launch reduction counts its blocks */
    b.kept_node = al_malloc(sizeof(int) * ((size_t)nargs + 1));
    b.kept_kind = al_malloc(sizeof(cg_param_kind) * ((size_t)nargs + 1));
    b.kept_offset = al_malloc(sizeof(int64_t) * ((size_t)nargs + 1));
    int64_t *kept_size = al_calloc((size_t)nargs + 1, sizeof(int64_t));
    if (!b.kept_node || !b.kept_kind || !b.kept_offset || !kept_size) oom(&b);
    for (int q = 0; !b.status && q < prog->nkernels; q++)
        for (int i = 0; i < prog->kernels[q].nparams; i++) {
            const cg_param *pa = &prog->kernels[q].params[i];
            if (pa->kind != CG_PARAM_KEPT && pa->kind != CG_PARAM_COUNTER) continue;
            int j = 0;
            while (j < b.nkept && !(b.kept_node[j] == pa->node && b.kept_kind[j] == pa->kind)) j++;
            if (j == b.nkept) b.kept_node[b.nkept] = pa->node, b.kept_kind[b.nkept++] = pa->kind;
            if (4 * pa->count > kept_size[j]) kept_size[j] = 4 * pa->count;
        }
    for (int j = 0; !b.status && j < b.nkept; j++) {
        if (b.kept_kind[j] != CG_PARAM_KEPT) continue;
        b.kept_offset[j] = (int64_t)(out->checks_bytes + out->kept_bytes);
        out->kept_bytes += (size_t)round_up(kept_size[j] > 0 ? kept_size[j] : 1, LP_AUX_ALIGN);
    }
    for (int j = 0; !b.status && j < b.nkept; j++) {
        if (b.kept_kind[j] != CG_PARAM_COUNTER) continue;
        b.kept_offset[j] = (int64_t)(out->checks_bytes + out->kept_bytes + out->counter_bytes);
        out->counter_bytes += (size_t)round_up(kept_size[j] > 0 ? kept_size[j] : 1, LP_AUX_ALIGN);
    }
    size_t run_words = out->checks_bytes + out->kept_bytes + out->counter_bytes;
    if (run_words > out->aux_bytes) out->aux_bytes = run_words;
    al_free(kept_size);
    int next = 0;
    for (int k = 0; !b.status && k < s->nsteps; k++) {
        const sched_step *st = &s->steps[k];
        int end = next;
        while (end < prog->nkernels && prog->kernels[end].step == k) end++;
        const ir_node *first = g->nodes[s->members[st->first].node], *last = g->nodes[st->pos];
        if (st->kind == STEP_KIND_COLLECTIVE && end == next) { /* a library call on the step's stream, no kernel */
            lp_place src, dst;
            if (last->nin != 1 || !place_or_fail(&b, g, p, last->in[0], k, &src) ||
                !place_or_fail(&b, g, p, last->id, k, &dst)) {
                if (!b.status) {
                    b.status = ALLOY_ERR_INVALID;
                    al_fmt(err, errlen, "step %d: a collective of %d operands", k, last->nin);
                }
                break;
            }
            add_action(&b, (lp_action){.kind = LP_COLLECTIVE, .step = k, .index = last->id, .dst = dst, .src = src,
                                       .bytes = (int64_t)ir_nbytes(&last->type)});
            continue;
        }
        lp_library lib;
        if (st->kind == STEP_KIND_GEMM && end == next && lp_library_epilogue(g, s, k, prog->checks | LP_WIDEN, &lib)) {
            lp_place o; /* the whole step in the library: product (+ bias, GELU) straight into the last member's slot */
            if (first->op == IR_OP_matmul && place_or_fail(&b, g, p, lib.result, k, &o))
                add_gemm_epilogue(&b, g, p, k, first, o, lib.d, lib.result, &lib);
            continue;
        }
        if (st->kind == STEP_KIND_GEMM && end > next) { /* the product into the scratch, then the epilogue */
            if (!ir_gemm_head(first)) {
                b.status = ALLOY_ERR_INVALID;
                al_fmt(err, errlen, "step %d: a gemm step that does not start with a matmul or convolution", k);
                break;
            }
            /* a convolution's product is its step's first kernel (emit_conv.c) */
            if (first->op == IR_OP_matmul)
                add_gemm(&b, g, p, k, first, (lp_place){LP_ARENA, -1, (int64_t)p->scratch_offset}, ALLOY_F32);
        } else if (st->kind == STEP_KIND_OP && last->op == IR_OP_matmul && (end == next || prog->kernels[next].check)) {
            lp_place o; /* the library GEMM into the slot, then its check kernel when there is one */
            if (place_or_fail(&b, g, p, last->id, k, &o)) add_gemm(&b, g, p, k, last, o, last->type.dtype);
            if (end == next) continue;
        } else if (end == next) {
            const char *why = skipped_why(prog, k);
            if (!why || computes_nothing(g, s, k)) continue; /* nothing to compute (an empty step) */
            char label[64];
            b.status = ALLOY_ERR_UNSUPPORTED;
            al_fmt(err, errlen, "step %d (%s, %s %s): no CUDA kernel: %s", k, sched_kind_name(st->kind),
                   ir_ops[last->op].name, ir_node_label(last, label, sizeof label), why);
            break;
        }
        if (!b.status) add_kernels(&b, g, p, prog, k, next, end);
        next = end;
    }
    /* the pointer arrays above everything else in the aux block */
    if (!b.status && b.ptr_at) {
        int64_t base = round_up((int64_t)out->aux_bytes, LP_AUX_ALIGN);
        for (int i = 0; i < out->ngemms; i++)
            if (out->gemms[i].pointers) out->gemms[i].ptr_at.offset += base;
        out->ptr_bytes = (size_t)b.ptr_at;
        out->aux_bytes = (size_t)base + out->ptr_bytes;
    }
    out->first_update = out->nactions;
    for (int i = 0; !b.status && i < g->nupdates; i++) {
        int t = ir_find_name(g, g->updates[i].name), v = g->updates[i].node;
        int64_t bytes = (int64_t)ir_nbytes(&g->nodes[v]->type);
        lp_place src;
        if (!bytes || t == v || (p->state_of && p->state_of[v] == t)) continue; /* nothing to copy */
        if (t < 0) {
            b.status = ALLOY_ERR_NOT_FOUND;
            al_fmt(err, errlen, "update of '%s': the graph has no state of that name", g->updates[i].name);
            break;
        }
        if (!place_or_fail(&b, g, p, v, -1, &src)) break;
        add_action(&b, (lp_action){.kind = LP_COPY, .step = -1, .dst = {LP_LEAF, t, 0}, .src = src, .bytes = bytes});
    }
    al_free(b.kept_node);
    al_free(b.kept_kind);
    al_free(b.kept_offset);
    if (b.status) lp_free(out);
    return b.status;
}

void lp_free(lp_plan *lp)
{
    al_free(lp->actions), al_free(lp->gemms), al_free(lp->args), al_free(lp->first_arg), al_free(lp->ptr_offsets);
    memset(lp, 0, sizeof *lp);
}
