/* bundle_read_schedule.c - reading a bundle's schedule and memory plan sections, each index and flag checked against the graph. */
#include <inttypes.h>
#include <string.h>

#include "ir/groups.h"
#include "runtime/bundle/bundle_read.h"
#include "step/attn_views.h"

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

/* The SCHEDULE section into s, every index and flag checked against g (sched_free frees it). */
bool bundle_read_schedule(bundle_rd *r, const ir_graph *g, schedule *s)
{
    int nn = g->nnodes;
    s->nnodes = bundle_rd_int(r, "nnodes (the IR's node count)", nn, nn);
    s->nsteps = bundle_rd_count(r, "nsteps", 40);
    s->nmembers = bundle_rd_count(r, "nmembers", 8);
    s->nparts = bundle_rd_count(r, "nparts", 16);
    s->ninputs = bundle_rd_count(r, "ninputs", 4);
    if (r->bad) return false;
    s->steps = al_calloc((size_t)s->nsteps + 1, sizeof *s->steps);
    s->members = al_calloc((size_t)s->nmembers + 1, sizeof *s->members);
    s->parts = al_calloc((size_t)s->nparts + 1, sizeof *s->parts);
    s->inputs = al_calloc((size_t)s->ninputs + 1, sizeof *s->inputs);
    s->step_of = al_calloc((size_t)nn + 1, sizeof *s->step_of);
    s->member_of = al_calloc((size_t)nn + 1, sizeof *s->member_of);
    s->kept = al_calloc((size_t)nn + 1, 1);
    if (!s->steps || !s->members || !s->parts || !s->inputs || !s->step_of || !s->member_of || !s->kept)
        return bundle_rd_oom(r, "schedule", s->nsteps);
    int next_member = 0, next_part = 0, next_in = 0, last_pos = -1;
    for (int i = 0; i < s->nsteps && !r->bad; i++) {
        sched_step *t = &s->steps[i];
        t->kind = (step_kind)bundle_rd_int(r, "step kind", STEP_KIND_OP, STEP_KIND_COLLECTIVE);
        t->pos = bundle_rd_int(r, "step pos", last_pos + 1, nn - 1);
        t->first = bundle_rd_int(r, "step first member", next_member, next_member);
        t->n = bundle_rd_int(r, "step member count", 1, s->nmembers - t->first);
        t->first_part = bundle_rd_int(r, "step first part", next_part, next_part);
        t->nparts = bundle_rd_int(r, "step part count", 1, s->nparts - t->first_part);
        t->first_in = bundle_rd_int(r, "step first input", next_in, next_in);
        t->nin = bundle_rd_int(r, "step input count", 0, s->ninputs - t->first_in);
        t->space = bundle_rd_type(r, "step space");
        last_pos = t->pos, next_member = t->first + t->n, next_part = t->first_part + t->nparts;
        next_in = t->first_in + t->nin;
    }
    if (!r->bad && (next_member != s->nmembers || next_part != s->nparts || next_in != s->ninputs))
        return bundle_rd_fail(r, "%s: the steps cover %" PRId64 " of its members, parts and inputs", "schedule",
                              next_member + next_part + next_in);
    for (int i = 0; i < s->nmembers && !r->bad; i++) {
        s->members[i].node = bundle_rd_int(r, "member node", 0, nn - 1);
        s->members[i].flags = (uint8_t)bundle_rd_int(r, "member flags", 0, 255);
        if (!r->bad && is_leaf(g, s->members[i].node))
            bundle_rd_fail(r, "%s: member %%%" PRId64 " is an input, param or state", "schedule", s->members[i].node);
    }
    for (int i = 0; i < s->nparts && !r->bad; i++) {
        sched_part *p = &s->parts[i];
        p->kind = (part_kind)bundle_rd_int(r, "part kind", PART_EW, PART_COLSUM);
        p->wide = bundle_rd_int(r, "part wide", 0, 1);
        p->first = bundle_rd_int(r, "part first member", 0, s->nmembers - 1);
        p->n = bundle_rd_int(r, "part member count", 1, s->nmembers - p->first);
    }
    for (int i = 0; i < s->nsteps && !r->bad; i++) { /* a step's parts lie inside its members */
        const sched_step *t = &s->steps[i];
        for (int k = t->first_part; k < t->first_part + t->nparts; k++) {
            const sched_part *p = &s->parts[k];
            if (p->first < t->first || p->first + p->n > t->first + t->n)
                bundle_rd_fail(r, "%s: part %" PRId64 " lies outside its step's members", "schedule", k);
            /* a column sum part: one column sum of a row step, and every column sum in one */
            else if ((p->kind == PART_COLSUM) !=
                     (t->kind == STEP_KIND_ROW && p->n == 1 && ir_fuse_colsum(g, g->nodes[s->members[p->first].node])))
                bundle_rd_fail(r, p->kind == PART_COLSUM ? "%s: part %" PRId64 " is no column sum of a row step"
                                                         : "%s: part %" PRId64 " holds a column sum outside a column sum part",
                        "schedule", k);
        }
    }
    for (int i = 0; i < s->ninputs && !r->bad; i++) s->inputs[i] = bundle_rd_int(r, "step input node", 0, nn - 1);
    for (int i = 0; i < s->nsteps && !r->bad; i++) { /* its position, iteration shape and kind fit its members */
        const sched_step *t = &s->steps[i];
        const ir_node *first = g->nodes[s->members[t->first].node], *last = g->nodes[s->members[t->first + t->n - 1].node];
        const ir_type *space = t->kind == STEP_KIND_ROW ? ir_fuse_shape(g, first) : t->kind == STEP_KIND_GEMM ? &first->type : &last->type;
        if (last->id != t->pos) bundle_rd_fail(r, "%s: step %" PRId64 "'s position is not its last member", "schedule", i);
        else if (!space || !ir_type_eq(space, &t->space))
            bundle_rd_fail(r, "%s: step %" PRId64 "'s iteration shape does not fit its members", "schedule", i);
        else if ((t->kind == STEP_KIND_OP || t->kind == STEP_KIND_COLLECTIVE) && t->n != 1) bundle_rd_fail(r, "%s: op step %" PRId64 " has several members", "schedule", i);
        for (int m = t->first; m < t->first + t->n && !r->bad; m++) /* a view: a lone reshape or contiguous slice of a non-leaf */
            if ((s->members[m].flags & (MEMBER_VIEW | MEMBER_STRIDED)) &&
                ((t->kind != STEP_KIND_OP && !(t->kind == STEP_KIND_EW && t->n == 1 && !(s->members[m].flags & MEMBER_VIEW))) ||
                 !view_fits(g, last, s->members[m].flags)))
                bundle_rd_fail(r, "%s: step %" PRId64 " has a view that is not a lone reshape, contiguous slice or gathered concat of "
                        "computed values, nor a strided view around an attention op or batched product", "schedule", i);
    }
    for (int i = 0; i < nn && !r->bad; i++) {
        s->step_of[i] = bundle_rd_int(r, "step_of", -1, s->nsteps - 1);
        s->member_of[i] = bundle_rd_int(r, "member_of", -1, s->nmembers - 1);
        int m = s->member_of[i];
        if (!r->bad && m >= 0 && s->members[m].node != i)
            bundle_rd_fail(r, "%s: member_of of node %" PRId64 " names another node's member", "schedule", i);
        if (!r->bad && m >= 0 && (s->step_of[i] < 0 || m < s->steps[s->step_of[i]].first ||
                                  m >= s->steps[s->step_of[i]].first + s->steps[s->step_of[i]].n))
            bundle_rd_fail(r, "%s: node %" PRId64 "'s step does not hold its member", "schedule", i);
    }
    for (int i = 0; i < s->nmembers && !r->bad; i++)
        if (s->member_of[s->members[i].node] != i)
            bundle_rd_fail(r, "%s: member %" PRId64 " is not its node's member", "schedule", i);
    for (int i = 0; i < s->ninputs && !r->bad; i++) {
        int in = s->inputs[i];
        if (!is_leaf(g, in) && !sched_stored(s, in))
            bundle_rd_fail(r, "%s: step input %%%" PRId64 " is neither bound nor stored", "schedule", in);
    }
    if (bundle_rd_need(r, (size_t)nn, "kept")) {
        for (int i = 0; i < nn && !r->bad; i++)
            if (r->p[r->pos + (size_t)i] > 1) bundle_rd_fail(r, "%s: kept of node %" PRId64 " is not 0 or 1", "schedule", i);
        if (!r->bad) memcpy(s->kept, r->p + r->pos, (size_t)nn), r->pos += (size_t)nn;
    }
    /* a product stored before its range rule only where its readers apply the rule (the kernels the
     * bundle carries were emitted for these flags: a bundle without one keeps its epilogue kernel) */
    if (!r->bad) {
        uint8_t *had = al_malloc((size_t)s->nmembers + 1);
        if (!had) return bundle_rd_oom(r, "schedule", s->nmembers);
        for (int m = 0; m < s->nmembers; m++) {
            had[m] = s->members[m].flags & MEMBER_RANGED_READ;
            s->members[m].flags &= (uint8_t)~MEMBER_RANGED_READ;
        }
        sched_mark_ranged_reads(g, s);
        for (int m = 0; m < s->nmembers; m++) {
            if (had[m] && !(s->members[m].flags & MEMBER_RANGED_READ) && !r->bad)
                bundle_rd_fail(r, "%s: node %%%" PRId64 " is marked as ranged by its readers, which do not all load it so",
                        "schedule", s->members[m].node);
            s->members[m].flags = (uint8_t)((s->members[m].flags & ~MEMBER_RANGED_READ) | had[m]);
        }
        al_free(had);
        if (r->bad) return bundle_rd_done(r);
    }
    /* the padded row strides are a function of the graph and the schedule, as when the bundle was
     * written (its plan's slots and kernels have them): chosen again, not stored */
    char why[160];
    if (!r->bad && sched_pad(g, s, why, sizeof why)) return bundle_rd_oom(r, "padded row strides", nn);
    int marked = 0; /* and never at an odd leading dimension */
    for (int m = 0; m < s->nmembers; m++) marked += (s->members[m].flags & MEMBER_RANGED_READ) != 0;
    if (!r->bad) sched_align_ranged_reads(g, s);
    for (int m = 0; m < s->nmembers; m++) marked -= (s->members[m].flags & MEMBER_RANGED_READ) != 0;
    if (!r->bad && marked) bundle_rd_fail(r, "%s: %" PRId64 " widened products marked as ranged by their readers at unaligned rows",
                                          "schedule", marked);
    return bundle_rd_done(r);
}

/* Node i's value lives in state leaf -2 - off (an update written in
 * place): checks that i is a stored update of that leaf with its type and
 * records it in p->state_of. */
static bool read_in_place(bundle_rd *r, const ir_graph *g, const schedule *s, mem_plan *p, int i, int64_t off)
{
    int64_t t = -2 - off;
    const ir_node *leaf = t < g->nnodes ? g->nodes[t] : NULL;
    int u = leaf && leaf->name ? ir_find_update(g, leaf->name) : -1;
    if (!leaf || (leaf->op != IR_OP_param && leaf->op != IR_OP_state) || u < 0 || g->updates[u].node != i || !sched_stored(s, i) ||
        !ir_type_eq(&leaf->type, &g->nodes[i]->type))
        return bundle_rd_fail(r, "%s: node %%%" PRId64 " is placed in a leaf it does not update", "plan", i);
    if (!p->state_of) {
        p->state_of = al_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
        if (!p->state_of) return bundle_rd_oom(r, "plan", g->nnodes);
        for (int k = 0; k < g->nnodes; k++) p->state_of[k] = -1;
        p->first_write = s->nsteps;
    }
    p->state_of[i] = (int)t;
    if (s->step_of[i] < p->first_write) p->first_write = s->step_of[i];
    return true;
}

/* The PLAN section into p, each offset checked against the arena and the schedule (plan_free frees it). */
bool bundle_read_plan(bundle_rd *r, const ir_graph *g, const schedule *s, mem_plan *p)
{
    int nn = g->nnodes;
    p->nnodes = bundle_rd_int(r, "nnodes (the IR's node count)", nn, nn);
    p->arena_bytes = (size_t)bundle_rd_u64(r, "arena bytes");
    p->peak_live_bytes = (size_t)bundle_rd_u64(r, "peak live bytes");
    p->inplace = bundle_rd_int(r, "in place count", 0, nn);
    p->scratch_offset = (size_t)bundle_rd_u64(r, "scratch offset");
    p->scratch_bytes = (size_t)bundle_rd_u64(r, "scratch bytes");
    bundle_rd_int(r, "dtype count", ALLOY_DTYPE_COUNT, ALLOY_DTYPE_COUNT);
    for (int d = 0; d < ALLOY_DTYPE_COUNT; d++) p->bytes_by_dtype[d] = (size_t)bundle_rd_u64(r, "bytes per dtype");
    if (r->bad) return false;
    if (p->arena_bytes > (size_t)INT64_MAX / 2 || p->peak_live_bytes > p->arena_bytes ||
        p->scratch_bytes > p->arena_bytes || p->scratch_offset > p->arena_bytes - p->scratch_bytes)
        return bundle_rd_fail(r, "%s: scratch or peak outside the arena of %" PRId64 " bytes", "plan",
                              (int64_t)p->arena_bytes);
    if (!bundle_rd_need(r, (size_t)nn * 8, "offsets")) return false;
    p->offset = al_calloc((size_t)nn + 1, sizeof *p->offset);
    int *owner = al_malloc(sizeof(int) * ((size_t)nn + 1)); /* views and gathered pieces: 16-byte aligned */
    int64_t *delta = al_malloc(sizeof(int64_t) * ((size_t)nn + 1));
    if (!p->offset || !owner || !delta) {
        al_free(owner), al_free(delta);
        return bundle_rd_oom(r, "plan", nn);
    }
    sched_views(g, s, owner, delta);
    for (int i = 0; i < nn && !r->bad; i++) {
        int64_t off = (int64_t)bundle_rd_u64(r, "offset");
        p->offset[i] = off;
        size_t bytes = ir_nbytes(&g->nodes[i]->type);
        if (off < -1) { /* an update written into state leaf -2 - off */
            p->offset[i] = -1;
            if (!read_in_place(r, g, s, p, (int)i, off)) break;
            continue;
        }
        if (off == -1) {
            if (sched_stored(s, i)) bundle_rd_fail(r, "%s: stored node %%%" PRId64 " has no arena slot", "plan", i);
            continue;
        }
        if (is_leaf(g, i)) bundle_rd_fail(r, "%s: leaf %%%" PRId64 " has an arena slot", "plan", i);
        else if (off < 0 || off % (owner[i] >= 0 ? SCHED_VIEW_ALIGN : PLAN_ALIGN) ||
                 (uint64_t)off > p->arena_bytes ||
                 bytes > p->arena_bytes - (size_t)off)
            bundle_rd_fail(r, "%s: node %%%" PRId64 "'s slot lies outside the arena or is misaligned", "plan", i);
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
    return bundle_rd_done(r);
}
