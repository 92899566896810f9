/* bundle_read.c - reading a bundle: every byte checked before it is trusted (docs/bundle.md). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/sha256.h"
#include "ir/groups.h"
#include "runtime/io/checksum.h"
#include "runtime/io/safetensors_memory.h"
#include "runtime/bundle/bundle.h"
#include "step/attn_views.h"

/* A cursor over one section; the first failure is recorded and sticks. */
typedef struct rd {
    const uint8_t *p;
    size_t len, pos;
    size_t base; /* the section's offset in the file, for messages */
    const char *where, *section;
    char *err;
    size_t errlen;
    bool bad, oom; /* oom: the failure was an allocation */
} rd;

static bool rd_fail(rd *r, const char *fmt, const char *what, int64_t v)
{
    if (r->bad) return false;
    r->bad = true;
    char msg[256];
    al_fmt(msg, sizeof msg, fmt, what, v);
    al_fmt(r->err, r->errlen, "%s: section %s at byte %zu: %s", r->where, r->section, r->base + r->pos, msg);
    return false;
}

/* An allocation failed while reading what (n items). */
static bool rd_oom(rd *r, const char *what, int64_t n)
{
    if (!r->bad) r->oom = true;
    return rd_fail(r, "%s: out of memory (%" PRId64 " items)", what, n);
}

static bool rd_need(rd *r, size_t n, const char *what)
{
    if (r->bad) return false;
    if (r->len - r->pos < n)
        return rd_fail(r, "%s: section too short (%" PRId64 " more bytes needed)", what,
                       (int64_t)(n - (r->len - r->pos)));
    return true;
}

static uint64_t rd_u64(rd *r, const char *what)
{
    if (!rd_need(r, 8, what)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)r->p[r->pos + i] << (8 * i);
    r->pos += 8;
    return v;
}

static uint32_t rd_u32(rd *r, const char *what)
{
    if (!rd_need(r, 4, what)) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)r->p[r->pos + i] << (8 * i);
    r->pos += 4;
    return v;
}

/* An int32 in [lo, hi]; out of range records an error naming what. */
static int rd_int(rd *r, const char *what, int64_t lo, int64_t hi)
{
    size_t at = r->pos;
    int v = (int)(int32_t)rd_u32(r, what);
    if (!r->bad && (v < lo || v > hi)) {
        r->pos = at;
        char range[96];
        al_fmt(range, sizeof range, "%%s = %%" PRId64 " is outside [%" PRId64 ", %" PRId64 "]", lo, hi);
        rd_fail(r, range, what, v);
        return (int)lo;
    }
    return v;
}

/* A count of items of at least `each` bytes that must fit in what is left. */
static int rd_count(rd *r, const char *what, size_t each)
{
    int n = rd_int(r, what, 0, INT_MAX / 2);
    if (!r->bad && (size_t)n > (r->len - r->pos) / (each ? each : 1)) {
        rd_fail(r, "%s = %" PRId64 " does not fit in the section", what, n);
        return 0;
    }
    return n;
}

static ir_type rd_type(rd *r, const char *what)
{
    ir_type t = {0};
    t.dtype = (alloy_dtype)rd_int(r, what, 0, ALLOY_DTYPE_COUNT - 1);
    t.rank = rd_int(r, what, 0, ALLOY_MAX_RANK);
    for (int d = 0; d < t.rank && !r->bad; d++) {
        t.dims[d] = (int64_t)rd_u64(r, what);
        if (t.dims[d] < 0) rd_fail(r, "%s: negative dimension %" PRId64, what, t.dims[d]);
    }
    return t;
}

static bool rd_done(rd *r)
{
    if (!r->bad && r->pos != r->len) rd_fail(r, "%s: %" PRId64 " bytes left over at its end", "section",
                                            (int64_t)(r->len - r->pos));
    return !r->bad;
}

/* Whether node i of g is bound from outside (never scheduled). */
static bool is_leaf(const ir_graph *g, int i)
{
    int op = g->nodes[i]->op;
    return op == IR_OP_input || op == IR_OP_param || op == IR_OP_state;
}

/* Whether n is a transpose [0, 2, 1, 3] of a rank-4 value (a view around the attention ops). */
static bool heads_transpose(const ir_node *n)
{
    int np = 0;
    const int64_t *perm = n->op == IR_OP_transpose ? ir_attr_ints(n, "perm", &np) : NULL;
    return perm && np == 4 && perm[0] == 0 && perm[1] == 2 && perm[2] == 1 && perm[3] == 3;
}

/* Whether node n may carry MEMBER_VIEW (with flags, its member's): a
 * reshape or contiguous slice of a computed value, a concat gathering
 * computed values at aligned byte offsets, or around the attention ops a
 * transpose [0, 2, 1, 3], a strided slice, a concat of reshapes (schedule.h,
 * step/attn_views.h); and MEMBER_STRIDED only on an attention op, a
 * batched matmul attn_views_mark may stride (attn_strided_matmul), a
 * rank-4 elementwise op (a product scaled) or such a view. */
static bool view_fits(const ir_graph *g, const ir_node *n, uint8_t flags)
{
    bool attn = n->op == IR_OP_attention || n->op == IR_OP_attention_grad;
    if (!(flags & MEMBER_VIEW))
        return !(flags & MEMBER_STRIDED) || attn || attn_strided_matmul(g, n) || (ir_ops[n->op].elementwise && n->type.rank == 4);
    if (attn || n->nin < 1 || is_leaf(g, n->in[0])) return false;
    if (heads_transpose(n)) return true;
    if (flags & MEMBER_STRIDED) return n->op == IR_OP_reshape || n->op == IR_OP_slice;
    if (n->op != IR_OP_concat) return sched_view_delta(g, n) >= 0;
    bool gather = true, alias = n->nin == 3;
    for (int k = 0; k < n->nin; k++) {
        if (sched_gather_delta(g, n, k) < 0 || is_leaf(g, n->in[k])) gather = false;
        if (g->nodes[n->in[k]]->op != IR_OP_reshape) alias = false;
    }
    return gather || alias;
}

static bool read_schedule(rd *r, const ir_graph *g, schedule *s)
{
    int nn = g->nnodes;
    s->nnodes = rd_int(r, "nnodes (the IR's node count)", nn, nn);
    s->nsteps = rd_count(r, "nsteps", 40);
    s->nmembers = rd_count(r, "nmembers", 8);
    s->nparts = rd_count(r, "nparts", 16);
    s->ninputs = rd_count(r, "ninputs", 4);
    if (r->bad) return false;
    s->steps = al_calloc((size_t)s->nsteps + 1, sizeof *s->steps);
    s->members = al_calloc((size_t)s->nmembers + 1, sizeof *s->members);
    s->parts = al_calloc((size_t)s->nparts + 1, sizeof *s->parts);
    s->inputs = al_calloc((size_t)s->ninputs + 1, sizeof *s->inputs);
    s->step_of = al_calloc((size_t)nn + 1, sizeof *s->step_of);
    s->member_of = al_calloc((size_t)nn + 1, sizeof *s->member_of);
    s->kept = al_calloc((size_t)nn + 1, 1);
    if (!s->steps || !s->members || !s->parts || !s->inputs || !s->step_of || !s->member_of || !s->kept)
        return rd_oom(r, "schedule", s->nsteps);
    int next_member = 0, next_part = 0, next_in = 0, last_pos = -1;
    for (int i = 0; i < s->nsteps && !r->bad; i++) {
        sched_step *t = &s->steps[i];
        t->kind = (step_kind)rd_int(r, "step kind", STEP_KIND_OP, STEP_KIND_COLLECTIVE);
        t->pos = rd_int(r, "step pos", last_pos + 1, nn - 1);
        t->first = rd_int(r, "step first member", next_member, next_member);
        t->n = rd_int(r, "step member count", 1, s->nmembers - t->first);
        t->first_part = rd_int(r, "step first part", next_part, next_part);
        t->nparts = rd_int(r, "step part count", 1, s->nparts - t->first_part);
        t->first_in = rd_int(r, "step first input", next_in, next_in);
        t->nin = rd_int(r, "step input count", 0, s->ninputs - t->first_in);
        t->space = rd_type(r, "step space");
        last_pos = t->pos, next_member = t->first + t->n, next_part = t->first_part + t->nparts;
        next_in = t->first_in + t->nin;
    }
    if (!r->bad && (next_member != s->nmembers || next_part != s->nparts || next_in != s->ninputs))
        return rd_fail(r, "%s: the steps cover %" PRId64 " of its members, parts and inputs", "schedule",
                       next_member + next_part + next_in);
    for (int i = 0; i < s->nmembers && !r->bad; i++) {
        s->members[i].node = rd_int(r, "member node", 0, nn - 1);
        s->members[i].flags = (uint8_t)rd_int(r, "member flags", 0, 255);
        if (!r->bad && is_leaf(g, s->members[i].node))
            rd_fail(r, "%s: member %%%" PRId64 " is an input, param or state", "schedule", s->members[i].node);
    }
    for (int i = 0; i < s->nparts && !r->bad; i++) {
        sched_part *p = &s->parts[i];
        p->kind = (part_kind)rd_int(r, "part kind", PART_EW, PART_COLSUM);
        p->wide = rd_int(r, "part wide", 0, 1);
        p->first = rd_int(r, "part first member", 0, s->nmembers - 1);
        p->n = rd_int(r, "part member count", 1, s->nmembers - p->first);
    }
    for (int i = 0; i < s->nsteps && !r->bad; i++) { /* a step's parts lie inside its members */
        const sched_step *t = &s->steps[i];
        for (int k = t->first_part; k < t->first_part + t->nparts; k++) {
            const sched_part *p = &s->parts[k];
            if (p->first < t->first || p->first + p->n > t->first + t->n)
                rd_fail(r, "%s: part %" PRId64 " lies outside its step's members", "schedule", k);
            /* a column sum part: one column sum of a row step, and every column sum in one */
            else if ((p->kind == PART_COLSUM) !=
                     (t->kind == STEP_KIND_ROW && p->n == 1 && ir_fuse_colsum(g, g->nodes[s->members[p->first].node])))
                rd_fail(r, p->kind == PART_COLSUM ? "%s: part %" PRId64 " is no column sum of a row step"
                                                  : "%s: part %" PRId64 " holds a column sum outside a column sum part",
                        "schedule", k);
        }
    }
    for (int i = 0; i < s->ninputs && !r->bad; i++) s->inputs[i] = rd_int(r, "step input node", 0, nn - 1);
    for (int i = 0; i < s->nsteps && !r->bad; i++) { /* its position, iteration shape and kind fit its members */
        const sched_step *t = &s->steps[i];
        const ir_node *first = g->nodes[s->members[t->first].node], *last = g->nodes[s->members[t->first + t->n - 1].node];
        const ir_type *space = t->kind == STEP_KIND_ROW ? ir_fuse_shape(g, first) : t->kind == STEP_KIND_GEMM ? &first->type : &last->type;
        if (last->id != t->pos) rd_fail(r, "%s: step %" PRId64 "'s position is not its last member", "schedule", i);
        else if (!space || !ir_type_eq(space, &t->space))
            rd_fail(r, "%s: step %" PRId64 "'s iteration shape does not fit its members", "schedule", i);
        else if ((t->kind == STEP_KIND_OP || t->kind == STEP_KIND_COLLECTIVE) && t->n != 1) rd_fail(r, "%s: op step %" PRId64 " has several members", "schedule", i);
        for (int m = t->first; m < t->first + t->n && !r->bad; m++) /* a view: a lone reshape or contiguous slice of a non-leaf */
            if ((s->members[m].flags & (MEMBER_VIEW | MEMBER_STRIDED)) &&
                ((t->kind != STEP_KIND_OP && !(t->kind == STEP_KIND_EW && t->n == 1 && !(s->members[m].flags & MEMBER_VIEW))) ||
                 !view_fits(g, last, s->members[m].flags)))
                rd_fail(r, "%s: step %" PRId64 " has a view that is not a lone reshape, contiguous slice or gathered concat of "
                        "computed values, nor a strided view around an attention op or batched product", "schedule", i);
    }
    for (int i = 0; i < nn && !r->bad; i++) {
        s->step_of[i] = rd_int(r, "step_of", -1, s->nsteps - 1);
        s->member_of[i] = rd_int(r, "member_of", -1, s->nmembers - 1);
        int m = s->member_of[i];
        if (!r->bad && m >= 0 && s->members[m].node != i)
            rd_fail(r, "%s: member_of of node %" PRId64 " names another node's member", "schedule", i);
        if (!r->bad && m >= 0 && (s->step_of[i] < 0 || m < s->steps[s->step_of[i]].first ||
                                  m >= s->steps[s->step_of[i]].first + s->steps[s->step_of[i]].n))
            rd_fail(r, "%s: node %" PRId64 "'s step does not hold its member", "schedule", i);
    }
    for (int i = 0; i < s->nmembers && !r->bad; i++)
        if (s->member_of[s->members[i].node] != i)
            rd_fail(r, "%s: member %" PRId64 " is not its node's member", "schedule", i);
    for (int i = 0; i < s->ninputs && !r->bad; i++) {
        int in = s->inputs[i];
        if (!is_leaf(g, in) && !sched_stored(s, in))
            rd_fail(r, "%s: step input %%%" PRId64 " is neither bound nor stored", "schedule", in);
    }
    if (rd_need(r, (size_t)nn, "kept")) {
        for (int i = 0; i < nn && !r->bad; i++)
            if (r->p[r->pos + (size_t)i] > 1) rd_fail(r, "%s: kept of node %" PRId64 " is not 0 or 1", "schedule", i);
        if (!r->bad) memcpy(s->kept, r->p + r->pos, (size_t)nn), r->pos += (size_t)nn;
    }
    /* a product stored before its range rule only where its readers apply the rule (the kernels the
     * bundle carries were emitted for these flags: a bundle without one keeps its epilogue kernel) */
    if (!r->bad) {
        uint8_t *had = al_malloc((size_t)s->nmembers + 1);
        if (!had) return rd_oom(r, "schedule", s->nmembers);
        for (int m = 0; m < s->nmembers; m++) {
            had[m] = s->members[m].flags & MEMBER_RANGED_READ;
            s->members[m].flags &= (uint8_t)~MEMBER_RANGED_READ;
        }
        sched_mark_ranged_reads(g, s);
        for (int m = 0; m < s->nmembers; m++) {
            if (had[m] && !(s->members[m].flags & MEMBER_RANGED_READ) && !r->bad)
                rd_fail(r, "%s: node %%%" PRId64 " is marked as ranged by its readers, which do not all load it so",
                        "schedule", s->members[m].node);
            s->members[m].flags = (uint8_t)((s->members[m].flags & ~MEMBER_RANGED_READ) | had[m]);
        }
        al_free(had);
        if (r->bad) return rd_done(r);
    }
    /* the padded row strides are a function of the graph and the schedule, as when the bundle was
     * written (its plan's slots and kernels have them): chosen again, not stored */
    char why[160];
    if (!r->bad && sched_pad(g, s, why, sizeof why)) return rd_oom(r, "padded row strides", nn);
    int marked = 0; /* and never at an odd leading dimension */
    for (int m = 0; m < s->nmembers; m++) marked += (s->members[m].flags & MEMBER_RANGED_READ) != 0;
    if (!r->bad) sched_align_ranged_reads(g, s);
    for (int m = 0; m < s->nmembers; m++) marked -= (s->members[m].flags & MEMBER_RANGED_READ) != 0;
    if (!r->bad && marked) rd_fail(r, "%s: %" PRId64 " widened products marked as ranged by their readers at unaligned rows",
                                   "schedule", marked);
    return rd_done(r);
}

/* Node i's value lives in state leaf -2 - off (an update written in
 * place): checks that i is a stored update of that leaf with its type and
 * records it in p->state_of. */
static bool read_in_place(rd *r, const ir_graph *g, const schedule *s, mem_plan *p, int i, int64_t off)
{
    int64_t t = -2 - off;
    const ir_node *leaf = t < g->nnodes ? g->nodes[t] : NULL;
    int u = leaf && leaf->name ? ir_find_update(g, leaf->name) : -1;
    if (!leaf || (leaf->op != IR_OP_param && leaf->op != IR_OP_state) || u < 0 || g->updates[u].node != i || !sched_stored(s, i) ||
        !ir_type_eq(&leaf->type, &g->nodes[i]->type))
        return rd_fail(r, "%s: node %%%" PRId64 " is placed in a leaf it does not update", "plan", i);
    if (!p->state_of) {
        p->state_of = al_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
        if (!p->state_of) return rd_oom(r, "plan", g->nnodes);
        for (int k = 0; k < g->nnodes; k++) p->state_of[k] = -1;
        p->first_write = s->nsteps;
    }
    p->state_of[i] = (int)t;
    if (s->step_of[i] < p->first_write) p->first_write = s->step_of[i];
    return true;
}

static bool read_plan(rd *r, const ir_graph *g, const schedule *s, mem_plan *p)
{
    int nn = g->nnodes;
    p->nnodes = rd_int(r, "nnodes (the IR's node count)", nn, nn);
    p->arena_bytes = (size_t)rd_u64(r, "arena bytes");
    p->peak_live_bytes = (size_t)rd_u64(r, "peak live bytes");
    p->inplace = rd_int(r, "in place count", 0, nn);
    p->scratch_offset = (size_t)rd_u64(r, "scratch offset");
    p->scratch_bytes = (size_t)rd_u64(r, "scratch bytes");
    rd_int(r, "dtype count", ALLOY_DTYPE_COUNT, ALLOY_DTYPE_COUNT);
    for (int d = 0; d < ALLOY_DTYPE_COUNT; d++) p->bytes_by_dtype[d] = (size_t)rd_u64(r, "bytes per dtype");
    if (r->bad) return false;
    if (p->arena_bytes > (size_t)INT64_MAX / 2 || p->peak_live_bytes > p->arena_bytes ||
        p->scratch_bytes > p->arena_bytes || p->scratch_offset > p->arena_bytes - p->scratch_bytes)
        return rd_fail(r, "%s: scratch or peak outside the arena of %" PRId64 " bytes", "plan",
                       (int64_t)p->arena_bytes);
    if (!rd_need(r, (size_t)nn * 8, "offsets")) return false;
    p->offset = al_calloc((size_t)nn + 1, sizeof *p->offset);
    int *owner = al_malloc(sizeof(int) * ((size_t)nn + 1)); /* views and gathered pieces: 16-byte aligned */
    int64_t *delta = al_malloc(sizeof(int64_t) * ((size_t)nn + 1));
    if (!p->offset || !owner || !delta) {
        al_free(owner), al_free(delta);
        return rd_oom(r, "plan", nn);
    }
    sched_views(g, s, owner, delta);
    for (int i = 0; i < nn && !r->bad; i++) {
        int64_t off = (int64_t)rd_u64(r, "offset");
        p->offset[i] = off;
        size_t bytes = ir_nbytes(&g->nodes[i]->type);
        if (off < -1) { /* an update written into state leaf -2 - off */
            p->offset[i] = -1;
            if (!read_in_place(r, g, s, p, (int)i, off)) break;
            continue;
        }
        if (off == -1) {
            if (sched_stored(s, i)) rd_fail(r, "%s: stored node %%%" PRId64 " has no arena slot", "plan", i);
            continue;
        }
        if (is_leaf(g, i)) rd_fail(r, "%s: leaf %%%" PRId64 " has an arena slot", "plan", i);
        else if (off < 0 || off % (owner[i] >= 0 ? SCHED_VIEW_ALIGN : PLAN_ALIGN) ||
                 (uint64_t)off > p->arena_bytes ||
                 bytes > p->arena_bytes - (size_t)off)
            rd_fail(r, "%s: node %%%" PRId64 "'s slot lies outside the arena or is misaligned", "plan", i);
    }
    al_free(owner), al_free(delta);
    char msg[160];
    alloy_status vs = r->bad ? ALLOY_OK : plan_attach_views(g, s, p, msg, sizeof msg);
    if (vs) { /* the schedule's views, each at the slot of the value it views */
        r->oom = vs == ALLOY_ERR_OOM;
        r->bad = true;
        al_fmt(r->err, r->errlen, "%s: section %s: %s", r->where, r->section, msg);
        return false;
    }
    return rd_done(r);
}

static bool read_state(rd *r, const ir_graph *g, bundle_contents *c)
{
    int n = rd_count(r, "state count", 12);
    if (r->bad) return false;
    c->state = al_calloc((size_t)n + 1, sizeof *c->state);
    if (!c->state) return rd_oom(r, "state", n);
    c->nstate = n; /* only with the array that bundle_contents_free walks */
    for (int i = 0; i < c->nstate && !r->bad; i++) {
        size_t len = rd_u32(r, "name length");
        if (!rd_need(r, len, "name")) break;
        if (memchr(r->p + r->pos, 0, len)) return rd_fail(r, "%s: a NUL inside tensor name %" PRId64, "state", i);
        c->state[i].name = al_malloc(len + 1);
        if (!c->state[i].name) return rd_oom(r, "state name", i);
        memcpy(c->state[i].name, r->p + r->pos, len);
        c->state[i].name[len] = '\0';
        r->pos += len;
        c->state[i].type = rd_type(r, "state type");
        int node = r->bad ? -1 : ir_find_name(g, c->state[i].name);
        if (!r->bad && (node < 0 || (g->nodes[node]->op != IR_OP_param && g->nodes[node]->op != IR_OP_state)))
            return rd_fail(r, "%s: tensor %" PRId64 " names no param or state of the IR", "state", i);
        if (!r->bad && !ir_type_eq(&c->state[i].type, &g->nodes[node]->type))
            return rd_fail(r, "%s: tensor %" PRId64 "'s dtype or shape differs from the IR's", "state", i);
    }
    int want = 0;
    for (int i = 0; i < g->nnodes; i++) want += g->nodes[i]->op == IR_OP_param || g->nodes[i]->op == IR_OP_state;
    if (!r->bad && want != c->nstate)
        return rd_fail(r, "%s: %" PRId64 " tensors, but the IR has a different number of params and state", "state",
                       c->nstate);
    return rd_done(r);
}

/* CUDA_EXEC: min_driver, nmodules, nimages (i32s), then per image kind,
 * arch, module, a reserved word (u32s), its length (u64) and bytes; the
 * images in module order, every module with module 0's targets, none twice;
 * a cubin an ELF file, PTX text ending in its one NUL. */
static bool read_cuda(rd *r, bundle_cuda *x)
{
    x->min_driver = (uint32_t)rd_int(r, "min_driver", 1000, 1000000);
    x->nmodules = (uint32_t)rd_int(r, "nmodules", 1, 1 << 20);
    int n = rd_count(r, "nimages", 24);
    if (!r->bad && (n == 0 || (uint32_t)n % x->nmodules != 0))
        return rd_fail(r, "%s = %" PRId64 " is not a positive multiple of nmodules", "nimages", n);
    if (r->bad) return false;
    if (!(x->images = al_calloc((size_t)n, sizeof *x->images))) return rd_oom(r, "images", n);
    int per = n / (int)x->nmodules;
    for (int i = 0; i < n && !r->bad; i++) {
        bundle_image *im = &x->images[i];
        im->kind = (uint32_t)rd_int(r, "image kind", BUNDLE_CUBIN, BUNDLE_HOST);
        im->arch = im->kind == BUNDLE_HOST ? (uint32_t)rd_int(r, "host image arch", 0, 0)
                                           : (uint32_t)rd_int(r, "image arch", 10, 9999);
        im->module = (uint32_t)rd_int(r, "image module (images go in module order)", i / per, i / per);
        if (rd_u32(r, "image reserved word") != 0 && !r->bad)
            return rd_fail(r, "%s %" PRId64 ": reserved word not 0", "image", i);
        uint64_t size = rd_u64(r, "image length");
        if (!r->bad && (size == 0 || size > r->len - r->pos))
            return rd_fail(r, "%s %" PRId64 ": length 0 or past the end of the section", "image", i);
        if (r->bad) return false;
        const uint8_t *p = r->p + r->pos;
        if (im->kind != BUNDLE_PTX && (size < 4 || memcmp(p, "\177ELF", 4) != 0))
            return rd_fail(r, im->kind == BUNDLE_CUBIN ? "%s %" PRId64 ": a cubin that is not an ELF file"
                                                       : "%s %" PRId64 ": a host image that is not an ELF file",
                           "image", i);
        if (im->kind == BUNDLE_PTX && memchr(p, 0, (size_t)size) != p + size - 1)
            return rd_fail(r, "%s %" PRId64 ": PTX that is not text ending in one NUL", "image", i);
        const bundle_image *first = &x->images[i % per];
        if (i >= per && (im->kind != first->kind || im->arch != first->arch))
            return rd_fail(r, "%s %" PRId64 ": its module's targets are not module 0's", "image", i);
        for (int j = 0; j < i && i < per; j++)
            if (x->images[j].kind == im->kind && x->images[j].arch == im->arch)
                return rd_fail(r, "%s %" PRId64 ": a target repeated", "image", i);
        if (!(im->data = al_malloc((size_t)size))) return rd_oom(r, "image bytes", (int64_t)size);
        memcpy(im->data, p, (size_t)size);
        im->size = (size_t)size;
        x->nimages = i + 1;
        r->pos += (size_t)size;
    }
    return rd_done(r);
}

static bool is_ident_char(uint8_t ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

/* A length-prefixed text of 1 to max bytes with no NUL (ident: letters,
 * digits, '_' only) into out (out_len > max). */
static bool rd_text(rd *r, const char *what, size_t max, bool ident, char *out)
{
    uint32_t n = rd_u32(r, what);
    if (!r->bad && (n == 0 || n > max))
        return rd_fail(r, "%s: length %" PRId64 " is 0 or too long", what, n);
    if (!rd_need(r, n, what)) return false;
    for (uint32_t i = 0; i < n; i++)
        if (!r->p[r->pos + i] || (ident && !is_ident_char(r->p[r->pos + i])))
            return rd_fail(r, "%s: byte %" PRId64 " is not allowed there", what, i);
    memcpy(out, r->p + r->pos, n);
    out[n] = '\0';
    r->pos += n;
    return true;
}

/* CUDA_KERNELS: nkernels, nskipped (i32s); per kernel its name (u32 length,
 * bytes), module (u32), step, step kind (i32s), grid, block (u32s), nparams
 * (i32) and per parameter kind (u32), node (i32), written (u32), count
 * (i64); per skipped step its index (i32) and why (u32 length, text). The
 * kernels go in step order and module order, every module of x holding at
 * least one; each kernel's step kind is its schedule step's. lp_build checks
 * the parameters' places against the plan at load. */
static bool read_kernels(rd *r, const ir_graph *g, const schedule *s, bundle_cuda *x)
{
    cg_program *prog = &x->prog;
    int n = rd_count(r, "nkernels", 36);
    if (!r->bad && n < 1) return rd_fail(r, "%s = %" PRId64 ": a kernel table with no kernel", "nkernels", n);
    int nskipped = rd_count(r, "nskipped", 8);
    if (r->bad) return false;
    prog->kernels = al_calloc((size_t)n, sizeof *prog->kernels);
    x->module_of = al_calloc((size_t)n, sizeof *x->module_of);
    prog->skipped = al_calloc((size_t)nskipped + 1, sizeof *prog->skipped);
    prog->why = al_calloc((size_t)nskipped + 1, sizeof *prog->why);
    if (!prog->kernels || !x->module_of || !prog->skipped || !prog->why) return rd_oom(r, "kernels", n);
    x->has_kernels = true;
    for (int q = 0; q < n && !r->bad; q++) {
        cg_kernel *k = &prog->kernels[q];
        prog->nkernels = q + 1;
        if (!rd_text(r, "kernel name", sizeof k->name - 1, true, k->name)) return false;
        uint32_t prev = q ? x->module_of[q - 1] : 0;
        x->module_of[q] = (uint32_t)rd_int(r, "kernel module (in order, none empty)", q ? prev : 0,
                                           q ? (int64_t)prev + 1 : 0);
        if (!r->bad && x->module_of[q] >= x->nmodules)
            return rd_fail(r, "%s %" PRId64 ": its module is past the executable's modules", "kernel", q);
        k->step = rd_int(r, "kernel step (in order)", q ? prog->kernels[q - 1].step : 0, s->nsteps - 1);
        k->kind = (step_kind)rd_int(r, "kernel step kind", STEP_KIND_OP, STEP_KIND_MULTI);
        if (!r->bad && k->kind != s->steps[k->step].kind)
            return rd_fail(r, "%s %" PRId64 ": its step kind is not its schedule step's", "kernel", q);
        k->grid = (unsigned)rd_int(r, "kernel grid", 1, INT_MAX);
        k->block = (unsigned)rd_int(r, "kernel block", 1, 1024);
        k->nparams = rd_count(r, "kernel nparams", 20);
        if (r->bad) return false;
        if (k->nparams > 256) return rd_fail(r, "%s = %" PRId64 " is over 256", "kernel nparams", k->nparams);
        if (!(k->params = al_calloc((size_t)k->nparams + 1, sizeof *k->params))) return rd_oom(r, "params", k->nparams);
        for (int i = 0; i < k->nparams && !r->bad; i++) {
            cg_param *pa = &k->params[i];
            pa->kind = (cg_param_kind)rd_int(r, "param kind", CG_PARAM_NODE, CG_PARAM_COUNTER);
            if (!r->bad && pa->kind == CG_PARAM_CHECKS) return rd_fail(r, "%s = %" PRId64 ": the run's check words, which no bundle carries", "param kind", (int64_t)pa->kind);
            pa->node = rd_int(r, "param node", 0, g->nnodes - 1);
            pa->written = rd_int(r, "param written", 0, 1) != 0;
            uint64_t count = rd_u64(r, "param count");
            if (!r->bad && count > (1ull << 40)) return rd_fail(r, "%s: %" PRId64 " elements, over 2^40", "param count", (int64_t)count);
            pa->count = (int64_t)count;
        }
    }
    if (!r->bad && x->module_of[n - 1] != x->nmodules - 1)
        return rd_fail(r, "%s: %" PRId64 " modules hold kernels, not the executable's count", "kernels",
                       (int64_t)x->module_of[n - 1] + 1);
    for (int i = 0; i < nskipped && !r->bad; i++) {
        char why[513];
        prog->skipped[i] = rd_int(r, "skipped step", 0, s->nsteps - 1);
        if (!rd_text(r, "skipped step's why", sizeof why - 1, false, why)) return false;
        if (!(prog->why[i] = al_strdup(why))) return rd_oom(r, "why", 1);
        prog->nskipped = i + 1;
    }
    return rd_done(r);
}

/* INIT_STATE: a safetensors file (its own header and offsets checked as
 * alloy_safetensors_load checks a file) holding every tensor of the state
 * layout with its dtype and shape and nothing else, with alloy's checksum
 * when it has one. The bytes are kept for the load. */
static alloy_status read_init_state(const uint8_t *p, size_t len, const char *where, size_t at, bundle_contents *c,
                                    char *err, size_t errlen)
{
    char sec[600];
    al_fmt(sec, sizeof sec, "%s: section initial state at byte %zu", where, at);
    alloy_safetensors *file = NULL;
    alloy_status st = io_safetensors_load_memory(p, len, sec, &file, err, errlen);
    if (st) return st == ALLOY_ERR_OOM ? st : ALLOY_ERR_FORMAT;
    int n = alloy_safetensors_count(file);
    if (n != c->nstate) {
        al_fmt(err, errlen, "%s: %d tensors, the state layout has %d", sec, n, c->nstate);
        st = ALLOY_ERR_FORMAT;
    }
    for (int i = 0; !st && i < c->nstate; i++) {
        const alloy_host_tensor *t = alloy_safetensors_find(file, c->state[i].name);
        const ir_type *want = &c->state[i].type;
        bool same = t && t->dtype == want->dtype && t->rank == want->rank;
        for (int d = 0; same && d < want->rank; d++) same = t->dims[d] == want->dims[d];
        if (!same) {
            al_fmt(err, errlen, "%s: state '%s' is %s", sec, c->state[i].name,
                   t ? "there with another dtype or shape than the layout's" : "missing");
            st = ALLOY_ERR_FORMAT;
        }
    }
    const char *want = alloy_safetensors_metadata(file, IO_CHECKSUM_KEY);
    if (!st && want) {
        const alloy_host_tensor **ts = al_calloc((size_t)n + 1, sizeof *ts);
        char got[IO_CHECKSUM_LEN] = "";
        for (int i = 0; ts && i < n; i++) ts[i] = alloy_safetensors_get(file, i);
        st = ts ? io_tensors_checksum(ts, n, got) : ALLOY_ERR_OOM;
        al_free(ts);
        if (st) al_fmt(err, errlen, "%s: out of memory", sec);
        else if (strcmp(got, want) != 0) {
            al_fmt(err, errlen, "%s: the tensors' checksum is %s, the file's says %.40s", sec, got, want);
            st = ALLOY_ERR_FORMAT;
        }
    }
    alloy_safetensors_free(file);
    if (!st && !(c->init_state = al_malloc(len))) {
        al_fmt(err, errlen, "%s: out of memory", sec);
        st = ALLOY_ERR_OOM;
    }
    if (!st) memcpy(c->init_state, p, len), c->init_state_len = len;
    return st;
}

/* META: key=value lines; every key required, none unknown. */
static bool read_meta(rd *r, bundle_contents *c)
{
    /* the first NREQUIRED keys are in every bundle; the scaler's stop rules
     * and hysteresis only where set (a bundle without them reads as before) */
    enum { NREQUIRED = 7, NKEYS = 9 };
    static const char *const keys[NKEYS] = {"graph", "seed", "training", "scaler", "growth_interval", "optimizer",
                                            "accumulation_steps", "hysteresis", "max_consecutive_skips"};
    bool seen[NKEYS] = {0};
    char line[256];
    while (!r->bad && r->pos < r->len) {
        const uint8_t *nl = memchr(r->p + r->pos, '\n', r->len - r->pos);
        size_t n = nl ? (size_t)(nl - (r->p + r->pos)) : r->len - r->pos;
        if (!nl || n >= sizeof line) return rd_fail(r, "%s: a line without its newline or over %" PRId64 " bytes",
                                                    "meta", (int64_t)sizeof line);
        memcpy(line, r->p + r->pos, n);
        line[n] = '\0';
        char *eq = strchr(line, '=');
        int k = -1;
        if (eq) {
            *eq = '\0';
            for (int i = 0; i < NKEYS; i++)
                if (strcmp(line, keys[i]) == 0) k = i;
        }
        if (k < 0 || seen[k]) return rd_fail(r, "%s: an unknown or repeated key (line of %" PRId64 " bytes)", "meta",
                                             (int64_t)n);
        seen[k] = true;
        const char *v = eq + 1;
        char *end;
        errno = 0;
        if (k == 0) {
            if (strlen(v) >= sizeof c->graph_name) return rd_fail(r, "%s: graph name over %" PRId64 " bytes", "meta", 127);
            al_fmt(c->graph_name, sizeof c->graph_name, "%s", v);
        } else {
            unsigned long long x = strtoull(v, &end, 10);
            if (!*v || *end || errno || (k > 1 && x > INT_MAX))
                return rd_fail(r, "%s: a bad number for key %" PRId64 " (graph, seed, training, ...)", "meta", k);
            if (k == 1) c->seed = x;
            else if (k == 2) c->training = x != 0;
            else if (k == 3) c->scaler_kind = (int)x;
            else if (k == 4) c->growth_interval = (int)x;
            else if (k == 5) c->optimizer_kind = (int)x;
            else if (k == 6) c->accumulation_steps = (int)x;
            else if (k == 7) c->hysteresis = (int)x;
            else c->max_consecutive_skips = (int)x;
        }
        r->pos += n + 1;
    }
    for (int i = 0; i < NREQUIRED && !r->bad; i++)
        if (!seen[i]) return rd_fail(r, "%s: key %" PRId64 " missing (graph, seed, training, ...)", "meta", i);
    return !r->bad;
}

const char *bundle_tag_name(uint32_t tag)
{
    static const char *const names[] = {"?", "meta", "ir", "schedule", "plan", "state", "options", "initial state",
                                        "cuda executable", "cuda kernels"};
    return tag >= 1 && tag <= BUNDLE_SEC_LAST ? names[tag] : "unknown";
}

static uint32_t le32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

/* The header: magic, version, sizes, checksum. */
static alloy_status check_header(const uint8_t *b, size_t len, const char *where, char *err, size_t errlen)
{
    if (len < 8 || memcmp(b, BUNDLE_MAGIC, 8) != 0) {
        al_fmt(err, errlen, "%s: not an alloy bundle (the file does not start with \"" BUNDLE_MAGIC "\")", where);
        return ALLOY_ERR_FORMAT;
    }
    if (len < BUNDLE_HEADER_BYTES) {
        al_fmt(err, errlen, "%s: truncated: %zu bytes, shorter than the %u-byte header", where, len, BUNDLE_HEADER_BYTES);
        return ALLOY_ERR_FORMAT;
    }
    uint32_t version = le32(b + 8), hbytes = le32(b + 12);
    if (version > BUNDLE_VERSION) {
        al_fmt(err, errlen, "%s: bundle format version %u is newer than this alloy reads (%u); written by alloy %.15s",
               where, version, BUNDLE_VERSION, (const char *)b + 16);
        return ALLOY_ERR_UNSUPPORTED;
    }
    if (version >= 1 && version < BUNDLE_VERSION) {
        al_fmt(err, errlen,
               "%s: bundle format version %u is older than this alloy reads (%u: the memory plan changed); "
               "written by alloy %.15s: compile the step again (alloyc compile ... -o BUNDLE)",
               where, version, BUNDLE_VERSION, (const char *)b + 16);
        return ALLOY_ERR_UNSUPPORTED;
    }
    if (version == 0 || hbytes != BUNDLE_HEADER_BYTES || memchr(b + 16, 0, 16) == NULL || le32(b + 44) != 0) {
        al_fmt(err, errlen, "%s: header: bad version %u, header size %u, alloy version or reserved word", where,
               version, hbytes);
        return ALLOY_ERR_FORMAT;
    }
    uint64_t payload = le64(b + 32);
    if (payload != len - BUNDLE_HEADER_BYTES) {
        al_fmt(err, errlen, "%s: %s: the header gives %" PRIu64 " payload bytes, the file has %zu", where,
               payload > len - BUNDLE_HEADER_BYTES ? "truncated" : "trailing bytes", payload, len - BUNDLE_HEADER_BYTES);
        return ALLOY_ERR_FORMAT;
    }
    uint8_t sum[32];
    al_sha256(b + BUNDLE_HEADER_BYTES, payload, sum);
    if (memcmp(sum, b + 48, 32) != 0) {
        al_fmt(err, errlen, "%s: checksum mismatch: the payload's SHA-256 is not the header's; the file is damaged",
               where);
        return ALLOY_ERR_FORMAT;
    }
    return ALLOY_OK;
}

alloy_status bundle_decode(const uint8_t *bytes, size_t len, const char *where, bundle_contents *out, char *err,
                           size_t errlen)
{
    memset(out, 0, sizeof *out);
    alloy_status st = check_header(bytes, len, where, err, errlen);
    if (st) return st;
    bundle_contents c = {0};
    memcpy(c.alloy_version, bytes + 16, 16);
    uint32_t nsections = le32(bytes + 40);
    /* the sections: each tag once, in order; the ones this reader needs all present */
    const uint8_t *sec[BUNDLE_SEC_LAST + 1] = {0};
    size_t sec_len[BUNDLE_SEC_LAST + 1] = {0}, sec_at[BUNDLE_SEC_LAST + 1] = {0};
    size_t pos = BUNDLE_HEADER_BYTES;
    uint32_t last = 0;
    for (uint32_t i = 0; i < nsections; i++) {
        if (len - pos < 16) {
            al_fmt(err, errlen, "%s: section %u at byte %zu: its 16-byte heading runs past the end", where, i, pos);
            return ALLOY_ERR_FORMAT;
        }
        uint32_t tag = le32(bytes + pos), zero = le32(bytes + pos + 4);
        uint64_t n = le64(bytes + pos + 8);
        if (tag <= last || tag > BUNDLE_SEC_LAST || zero) {
            al_fmt(err, errlen, "%s: section %u at byte %zu: tag %u (%s) unknown, repeated or out of order", where, i,
                   pos, tag, bundle_tag_name(tag));
            return ALLOY_ERR_FORMAT;
        }
        if (n > len - pos - 16) {
            al_fmt(err, errlen, "%s: section %s at byte %zu: length %" PRIu64 " runs past the end of the file", where,
                   bundle_tag_name(tag), pos, n);
            return ALLOY_ERR_FORMAT;
        }
        sec[tag] = bytes + pos + 16, sec_len[tag] = (size_t)n, sec_at[tag] = pos + 16;
        last = tag;
        pos += 16 + (size_t)n;
    }
    if (pos != len) {
        al_fmt(err, errlen, "%s: %zu bytes after the last of %u sections", where, len - pos, nsections);
        return ALLOY_ERR_FORMAT;
    }
    for (uint32_t t = BUNDLE_SEC_META; t <= BUNDLE_SEC_OPTIONS; t++)
        if (!sec[t]) {
            al_fmt(err, errlen, "%s: section %s missing", where, bundle_tag_name(t));
            return ALLOY_ERR_FORMAT;
        }
#define RD(tag) (rd){sec[tag], sec_len[tag], 0, sec_at[tag], where, bundle_tag_name(tag), err, errlen, false, false}
    rd r = RD(BUNDLE_SEC_META);
    bool ok = read_meta(&r, &c);
    if (ok) {
        char perr[512];
        c.ir = ir_parse((const char *)sec[BUNDLE_SEC_IR], sec_len[BUNDLE_SEC_IR], "bundle ir", perr, sizeof perr);
        if (!c.ir) {
            al_fmt(err, errlen, "%s: section ir at byte %zu: %s", where, sec_at[BUNDLE_SEC_IR], perr);
            ok = false;
            /* the parser gives no status: "FILE:LINE:COL: out of memory ..." is a failed allocation */
            r.oom = strstr(perr, ": out of memory") != NULL;
        } else if (ir_verify(c.ir)) {
            al_fmt(err, errlen, "%s: section ir at byte %zu: %s", where, sec_at[BUNDLE_SEC_IR], c.ir->error);
            ok = false;
            r.oom = c.ir->status == ALLOY_ERR_OOM;
        }
    }
    if (ok) r = RD(BUNDLE_SEC_SCHEDULE), ok = read_schedule(&r, c.ir, &c.comp.sched);
    if (ok) r = RD(BUNDLE_SEC_PLAN), ok = read_plan(&r, c.ir, &c.comp.sched, &c.comp.plan);
    if (ok) r = RD(BUNDLE_SEC_STATE), ok = read_state(&r, c.ir, &c);
    if (ok && sec[BUNDLE_SEC_INIT_STATE]) {
        alloy_status ist = read_init_state(sec[BUNDLE_SEC_INIT_STATE], sec_len[BUNDLE_SEC_INIT_STATE], where,
                                           sec_at[BUNDLE_SEC_INIT_STATE], &c, err, errlen);
        ok = !ist;
        r.oom = ist == ALLOY_ERR_OOM;
    }
    if (ok && sec[BUNDLE_SEC_CUDA_EXEC]) r = RD(BUNDLE_SEC_CUDA_EXEC), ok = read_cuda(&r, &c.cuda);
    if (ok && sec[BUNDLE_SEC_CUDA_KERNELS] && !sec[BUNDLE_SEC_CUDA_EXEC]) {
        al_fmt(err, errlen, "%s: section cuda kernels at byte %zu: a kernel table without a cuda executable", where,
               sec_at[BUNDLE_SEC_CUDA_KERNELS]);
        ok = false;
    }
    if (ok && sec[BUNDLE_SEC_CUDA_KERNELS])
        r = RD(BUNDLE_SEC_CUDA_KERNELS), ok = read_kernels(&r, c.ir, &c.comp.sched, &c.cuda);
#undef RD
    if (ok) {
        size_t n = sec_len[BUNDLE_SEC_OPTIONS];
        c.options = al_malloc(n + 1);
        if (!c.options) {
            al_fmt(err, errlen, "%s: out of memory", where);
            bundle_contents_free(&c);
            return ALLOY_ERR_OOM;
        }
        memcpy(c.options, sec[BUNDLE_SEC_OPTIONS], n);
        c.options[n] = '\0';
        if (strlen(c.options) != n) {
            al_fmt(err, errlen, "%s: section options at byte %zu: a NUL inside the text", where,
                   sec_at[BUNDLE_SEC_OPTIONS]);
            ok = false;
        }
    }
    if (!ok) {
        bundle_contents_free(&c);
        return r.oom ? ALLOY_ERR_OOM : ALLOY_ERR_FORMAT;
    }
    *out = c;
    return ALLOY_OK;
}

/* Reads n bytes from fd at its position; 0 or an errno (EIO: the file ended). */
static int read_all(int fd, uint8_t *p, size_t n)
{
    while (n) {
        ssize_t r = read(fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r < 0 ? errno : EIO;
        p += r, n -= (size_t)r;
    }
    return 0;
}

alloy_status bundle_read_file(const char *path, bundle_contents *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int fd;
    uint64_t size;
    alloy_status st = al_file_open_read(path, 0, &fd, &size, err, errlen);
    if (st) return st;
    /* the header first: a file that is no bundle, or not the size its
     * header gives, is refused from its first 80 bytes, whatever its size */
    uint8_t head[BUNDLE_HEADER_BYTES], *bytes = NULL;
    size_t n = size < sizeof head ? (size_t)size : sizeof head;
    int e = read_all(fd, head, n);
    if (!e && (n < sizeof head || memcmp(head, BUNDLE_MAGIC, 8) != 0)) {
        close(fd);
        return bundle_decode(head, n, path, out, err, errlen);
    }
    uint64_t payload = e ? 0 : le64(head + 32);
    if (!e && payload != size - BUNDLE_HEADER_BYTES) {
        close(fd);
        al_fmt(err, errlen, "%s: %s: the header gives %" PRIu64 " payload bytes, the file has %" PRIu64, path,
               payload > size - BUNDLE_HEADER_BYTES ? "truncated" : "trailing bytes", payload,
               size - BUNDLE_HEADER_BYTES);
        return ALLOY_ERR_FORMAT;
    }
    if (!e && !(bytes = size < SIZE_MAX ? al_malloc((size_t)size) : NULL)) {
        close(fd);
        al_fmt(err, errlen, "%s: out of memory reading its %" PRIu64 " bytes", path, size);
        return ALLOY_ERR_OOM;
    }
    if (!e) {
        memcpy(bytes, head, sizeof head);
        e = read_all(fd, bytes + sizeof head, (size_t)size - sizeof head);
    }
    close(fd);
    if (e) {
        al_free(bytes);
        al_fmt(err, errlen, "%s: cannot read: %s", path, e == EIO ? "the file ended early (cut while read?)" : strerror(e));
        return ALLOY_ERR_IO;
    }
    st = bundle_decode(bytes, (size_t)size, path, out, err, errlen);
    al_free(bytes);
    return st;
}

void bundle_contents_free(bundle_contents *c)
{
    ir_graph_free(c->ir);
    sched_free(&c->comp.sched);
    plan_free(&c->comp.plan);
    al_free(c->options);
    for (int i = 0; c->state && i < c->nstate; i++) al_free(c->state[i].name);
    al_free(c->state);
    al_free(c->init_state);
    bundle_cuda_free(&c->cuda);
    memset(c, 0, sizeof *c);
}
