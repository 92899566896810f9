/* schedule.c - fusion groups -> ordered steps with parts, members, numerics flags and external inputs; the schedule pass's printer.
 *
 * After sched_build every non-leaf node is a member of exactly one step; a
 * step runs at its last member's position, and every value it reads from
 * outside was produced by an earlier step (ir_check_groups proved it). The
 * flags say what each member's readers see (docs/fusion.md): they are the
 * rules the CPU executor followed when it derived them per run, written
 * down once so that every backend follows the same ones.
 */
#include <string.h>

#include "step/schedule.h"
#include "step/attn_views.h"
#include "step/state_names.h"

static bool is_leaf(const ir_node *n) { return n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state; }

/* Whether output o is kept only by a run that fetches it: the gradient
 * "grad:<p>" of a parameter p the step updates. Its reader is then the
 * optimizer, which may compute it again as it reads (remat.c), so the step
 * itself need not store it (docs/fusion.md, "The memory plan"); a fetch
 * adds it to the keep set (alloy_graph_run). Every other output is kept. */
static bool kept_on_fetch(const ir_graph *g, const ir_output *o)
{
    size_t n = strlen(GRAD_PREFIX);
    return strncmp(o->name, GRAD_PREFIX, n) == 0 && ir_find_update(g, o->name + n) >= 0; /* the index: O(1) */
}

static bool low_float(alloy_dtype dt) { return dt == ALLOY_F16 || dt == ALLOY_BF16; }

static int find_root(int *parent, int i)
{
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
}

/* Working state of one sched_build. */
typedef struct builder {
    const ir_graph *g;
    schedule *s;
    uint8_t *must_store; /* per node */
    int *stamp;          /* per node: the last step that listed it as an input */
    int *parent;         /* per member slot of a MULTI step: union-find */
    int *tail;           /* per member slot of a MULTI step: the last member of the chain it is the root of */
} builder;

static void add_part(builder *b, part_kind kind, int first, int n)
{
    schedule *s = b->s;
    bool wide = kind == PART_EW && ir_fuse_wide(b->g, b->g->nodes[s->members[first].node]);
    s->parts[s->nparts++] = (sched_part){kind, wide, first, n};
}

/* The flags an EW part of n members gives each (docs/fusion.md): an
 * unrounded f16/bf16 intermediate keeps the dtype's range; bool and integer
 * values, and casts to f16/bf16, are rounded for their readers too. */
static void ew_part_flags(builder *b, const sched_part *p)
{
    for (int m = p->first; m < p->first + p->n; m++) {
        const ir_node *x = b->g->nodes[b->s->members[m].node];
        alloy_dtype dt = x->type.dtype;
        uint8_t f = 0;
        if (p->n > 1 && low_float(dt)) f |= MEMBER_RANGED;
        if ((p->n > 1 && !ir_is_float(dt)) || (x->op == IR_OP_cast && low_float(dt))) f |= MEMBER_EXACT;
        b->s->members[m].flags |= f;
    }
}

/* Adds members order[0..n) of one step of the given kind: their order,
 * parts and flags. */
static void add_members(builder *b, sched_step *st, const int *order, int n)
{
    const ir_graph *g = b->g;
    schedule *s = b->s;
    st->first = s->nmembers;
    st->n = n;
    st->first_part = s->nparts;
    int group_size = n;
    for (int m = 0; m < n; m++) {
        int id = order[m];
        s->member_of[id] = s->nmembers;
        s->step_of[id] = (int)(st - s->steps);
        bool stored = group_size == 1 || b->must_store[id];
        s->members[s->nmembers++] = (sched_member){id, stored ? MEMBER_STORED : 0};
    }
    switch (st->kind) {
    case STEP_KIND_OP:
    case STEP_KIND_COLLECTIVE: add_part(b, PART_OP, st->first, 1); break;
    case STEP_KIND_EW: add_part(b, PART_EW, st->first, n); break;
    case STEP_KIND_GEMM:
        add_part(b, PART_OP, st->first, 1);
        add_part(b, PART_EW, st->first + 1, n - 1);
        if (low_float(g->nodes[order[0]]->type.dtype)) s->members[st->first].flags |= MEMBER_RANGED;
        break;
    case STEP_KIND_ROW:
        for (int m = 0; m < n;) {
            int end = m + 1;
            if (ir_fuse_elementwise(g, g->nodes[order[m]])) {
                while (end < n && ir_fuse_elementwise(g, g->nodes[order[end]])) end++;
                add_part(b, PART_EW, st->first + m, end - m);
            } else if (ir_fuse_colsum(g, g->nodes[order[m]])) {
                add_part(b, PART_COLSUM, st->first + m, 1);
            } else {
                add_part(b, PART_OP, st->first + m, 1);
                s->members[st->first + m].flags |= MEMBER_EXACT;
            }
            m = end;
        }
        break;
    case STEP_KIND_MULTI: {
        /* the chains, in the order of their first member; the gradient
         * norm's sum_squares (fuse_norm.c) and found_inf last */
        bool fi = g->nodes[order[n - 1]]->op == IR_OP_found_inf;
        bool norm = fi && n >= 2 && g->nodes[order[n - 2]]->op == IR_OP_sum_squares;
        int ns = n - fi - norm, at = st->first;
        /* union-find joins members that read one another; each chain is
         * then a list threaded through next[] (stamp, free until the inputs
         * below) from its first member, so placing them is linear however
         * many chains there are (a step of every parameter's update) */
        int *parent = b->parent, *tail = b->tail, *next = b->stamp;
        for (int m = 0; m < ns; m++) parent[m] = m;
        for (int m = 0; m < ns; m++) {
            const ir_node *x = g->nodes[order[m]];
            for (int j = 0; j < x->nin; j++) {
                int src = s->member_of[x->in[j]] - st->first;
                if (s->member_of[x->in[j]] >= 0 && src >= 0 && src < ns)
                    parent[find_root(parent, src)] = find_root(parent, m);
            }
        }
        for (int m = 0; m < ns; m++) tail[m] = -1;
        for (int m = 0; m < ns; m++) {
            int root = find_root(parent, m);
            next[order[m]] = -1;
            if (tail[root] >= 0) next[order[tail[root]]] = m;
            tail[root] = m;
            s->member_of[order[m]] = -1; /* not placed yet */
        }
        for (int m = 0; m < ns; m++) {
            if (s->member_of[order[m]] >= 0) continue; /* placed with its chain's first member */
            int len = 0;
            for (int i = m; i >= 0; i = next[order[i]]) {
                s->member_of[order[i]] = at + len;
                s->members[at + len++] = (sched_member){order[i], b->must_store[order[i]] ? MEMBER_STORED : 0};
            }
            add_part(b, PART_EW, at, len);
            at += len;
        }
        if (norm) { /* its operands in the step are stored only as they would be without it: a backend sums
                     * their squares as it computes them (the CPU in the op's order, cpu_run_multi) */
            s->member_of[order[n - 2]] = at;
            s->members[at] = (sched_member){order[n - 2], b->must_store[order[n - 2]] ? MEMBER_STORED : 0};
            add_part(b, PART_OP, at++, 1);
        }
        if (fi) {
            s->member_of[order[n - 1]] = at;
            s->members[at] = (sched_member){order[n - 1], b->must_store[order[n - 1]] ? MEMBER_STORED : 0};
            add_part(b, PART_OP, at, 1);
            const ir_node *f = g->nodes[order[n - 1]];
            for (int j = 0; j < f->nin; j++)
                if (s->step_of[f->in[j]] == (int)(st - s->steps)) s->members[s->member_of[f->in[j]]].flags |= MEMBER_CHECK;
        }
        for (int m = 0; m < ns; m++) next[order[m]] = -1;
        break;
    }
    }
    st->nparts = s->nparts - st->first_part;
    for (int p = st->first_part; p < s->nparts; p++)
        if (s->parts[p].kind == PART_EW) ew_part_flags(b, &s->parts[p]);
    if (st->kind != STEP_KIND_ROW) return;
    /* a value a later part reads is handed over rounded (the CPU's block
     * buffer; shared memory or registers on a GPU) */
    for (int p = st->first_part; p < s->nparts; p++)
        for (int m = s->parts[p].first; m < s->parts[p].first + s->parts[p].n; m++) {
            const ir_node *x = g->nodes[s->members[m].node];
            for (int j = 0; j < x->nin; j++) {
                int src = s->member_of[x->in[j]];
                if (src >= st->first && src < s->parts[p].first) s->members[src].flags |= MEMBER_SPILLED;
            }
        }
}

/* The nodes the step reads from outside, in order of first use. */
static void add_inputs(builder *b, sched_step *st)
{
    schedule *s = b->s;
    int me = (int)(st - s->steps);
    st->first_in = s->ninputs;
    for (int m = st->first; m < st->first + st->n; m++) {
        const ir_node *x = b->g->nodes[s->members[m].node];
        for (int j = 0; j < x->nin; j++) {
            int o = x->in[j];
            if (s->step_of[o] == me || b->stamp[o] == me) continue;
            b->stamp[o] = me;
            s->inputs[s->ninputs++] = o;
        }
    }
    st->nin = s->ninputs - st->first_in;
}

/* The value a gathered concat's input x stands for: x, or the operand of
 * x when x is a reshape view (the flattened gradient of a bucket). */
static int piece_base(const ir_graph *g, const schedule *s, int x)
{
    const ir_node *n = g->nodes[x];
    int m = s->member_of[x];
    return m >= 0 && (s->members[m].flags & MEMBER_VIEW) && n->op == IR_OP_reshape ? n->in[0] : x;
}

/* Marks MEMBER_VIEW each lone concat whose inputs the planner may place
 * inside its slot (a gather: no kernel). Every input, or the operand of an
 * input that is a reshape view, is a stored value computed by a step of
 * its own kind (no view, no leaf, not kept) read once, by the concat (or
 * by that reshape, read once by the concat), at a byte offset
 * sched_gather_delta allows. uses: nn ints of scratch. */
static void mark_gathers(const ir_graph *g, schedule *s, int *uses)
{
    int nn = g->nnodes;
    for (int i = 0; i < nn; i++) uses[i] = 0;
    for (int i = 0; i < nn; i++)
        for (int k = 0; k < g->nodes[i]->nin; k++) uses[g->nodes[i]->in[k]]++;
    for (int k = 0; k < s->nsteps; k++) {
        const sched_step *step = &s->steps[k];
        const ir_node *c = g->nodes[step->pos];
        if (step->kind != STEP_KIND_OP || c->op != IR_OP_concat || c->nin < 1) continue;
        bool ok = true;
        for (int q = 0; q < c->nin && ok; q++) {
            int x = c->in[q], base = piece_base(g, s, x);
            int m = s->member_of[base];
            ok = sched_gather_delta(g, c, q) >= 0 && uses[x] == 1 && !s->kept[x] && s->step_of[x] >= 0 &&
                 m >= 0 && (s->members[m].flags & (MEMBER_STORED | MEMBER_VIEW)) == MEMBER_STORED &&
                 uses[base] == 1 && !s->kept[base] && ir_nbytes(&g->nodes[base]->type) == ir_nbytes(&g->nodes[x]->type);
        }
        if (ok) s->members[step->first].flags |= MEMBER_VIEW;
    }
}

int64_t sched_gather_delta(const ir_graph *g, const ir_node *c, int k)
{
    if (c->op != IR_OP_concat || k < 0 || k >= c->nin) return -1;
    int64_t axis = ir_attr_i(c, "axis"), outer = 1, inner = 1, at = 0;
    const ir_type *t = &c->type;
    if (axis < 0 || axis >= t->rank) return -1;
    for (int d = 0; d < axis; d++) outer *= t->dims[d];
    for (int d = (int)axis + 1; d < t->rank; d++) inner *= t->dims[d];
    if (outer != 1) return -1; /* the pieces interleave: no byte range each */
    for (int q = 0; q < k; q++) at += g->nodes[c->in[q]]->type.dims[axis];
    int64_t delta = at * inner * (int64_t)alloy_dtype_size(t->dtype);
    return delta % SCHED_VIEW_ALIGN ? -1 : delta;
}

void sched_views(const ir_graph *g, const schedule *s, int *owner, int64_t *off)
{
    int nn = g->nnodes;
    for (int i = 0; i < nn; i++) owner[i] = -1, off[i] = 0;
    for (int c = 0; c < nn; c++) { /* the pieces of each gathered concat */
        int m = s->member_of[c];
        if (m < 0 || !(s->members[m].flags & MEMBER_VIEW) || g->nodes[c]->op != IR_OP_concat || attn_view_alias(g, s, c))
            continue;
        for (int q = 0; q < g->nodes[c]->nin; q++) {
            int base = piece_base(g, s, g->nodes[c]->in[q]);
            int64_t d = sched_gather_delta(g, g->nodes[c], q);
            if (d < 0) { /* an interleave's piece: a strided result in the concat's rows (attn_views.h) */
                int64_t col = attn_interleave_piece(g, s, c, q, &base);
                d = col < 0 ? -1 : col * (int64_t)alloy_dtype_size(g->nodes[c]->type.dtype);
            }
            owner[base] = c, off[base] = d;
        }
    }
    for (int i = 0; i < nn; i++) { /* reshapes and slices, through a piece to its concat */
        int r = sched_view_root(g, s, i);
        if (r < 0) continue;
        int64_t o = sched_view_offset(g, s, i);
        owner[i] = owner[r] >= 0 ? owner[r] : r;
        off[i] = owner[r] >= 0 ? off[r] + o : o;
    }
}

alloy_status sched_build_steps(const ir_graph *g, const bool *keep, schedule *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int nn = g->nnodes;
    size_t edges = 1;
    for (int i = 0; i < nn; i++) edges += (size_t)g->nodes[i]->nin;
    ir_groups gs;
    builder b = {.g = g, .s = out};
    bool ok = ir_groups_collect(g, &gs) == ALLOY_OK;
    out->nnodes = nn;
    out->steps = al_calloc((size_t)nn + 1, sizeof(sched_step));
    out->members = al_calloc((size_t)nn + 1, sizeof(sched_member));
    out->parts = al_calloc((size_t)nn + 1, sizeof(sched_part));
    out->inputs = al_malloc(sizeof(int) * edges);
    out->step_of = al_malloc(sizeof(int) * ((size_t)nn + 1));
    out->member_of = al_malloc(sizeof(int) * ((size_t)nn + 1));
    out->kept = al_calloc((size_t)nn + 1, 1);
    b.must_store = al_calloc((size_t)nn + 1, 1);
    b.stamp = al_malloc(sizeof(int) * ((size_t)nn + 1));
    b.parent = al_malloc(sizeof(int) * ((size_t)nn + 1));
    b.tail = al_malloc(sizeof(int) * ((size_t)nn + 1));
    if (!ok || !out->steps || !out->members || !out->parts || !out->inputs || !out->step_of || !out->member_of ||
        !out->kept || !b.must_store || !b.stamp || !b.parent || !b.tail) {
        if (ok) ir_groups_free(&gs);
        al_free(b.must_store), al_free(b.stamp), al_free(b.parent), al_free(b.tail);
        sched_free(out);
        al_fmt(err, errlen, "out of memory scheduling %d nodes", nn);
        return ALLOY_ERR_OOM;
    }
    for (int i = 0; i < g->noutputs; i++)
        if (!kept_on_fetch(g, &g->outputs[i])) out->kept[g->outputs[i].node] = 1;
    for (int i = 0; i < g->nupdates; i++) out->kept[g->updates[i].node] = 1;
    if (g->loss >= 0) out->kept[g->loss] = 1;
    for (int i = 0; i < nn; i++) {
        if (keep && keep[i]) out->kept[i] = 1;
        b.must_store[i] = out->kept[i];
        out->step_of[i] = out->member_of[i] = -1;
        b.stamp[i] = -1;
    }
    for (int i = 0; i < nn; i++) {
        const ir_node *n = g->nodes[i];
        for (int j = 0; j < n->nin; j++) {
            int o = n->in[j];
            if (gs.group_of[o] >= 0 && gs.group_of[o] != gs.group_of[i]) b.must_store[o] = 1;
        }
    }
    alloy_status st = ALLOY_OK;
    for (int i = 0; i < nn && !st; i++) {
        const ir_node *n = g->nodes[i];
        if (is_leaf(n)) continue;
        int k = gs.group_of[i], size = ir_group_size(&gs, i);
        const int *members = size > 1 ? &gs.member[gs.start[k]] : &i;
        if (members[size - 1] != i) continue; /* runs with its group, at its last member */
        sched_step *step = &out->steps[out->nsteps++];
        step->pos = i;
        if (size > 1) {
            static const step_kind by_group[] = {[IR_GROUP_EW] = STEP_KIND_EW, [IR_GROUP_ROW] = STEP_KIND_ROW,
                                                 [IR_GROUP_GEMM] = STEP_KIND_GEMM, [IR_GROUP_MULTI] = STEP_KIND_MULTI};
            step->kind = by_group[ir_group_kind_of(g, members, size)];
        } else {
            step->kind = ir_ops[n->op].elementwise ? STEP_KIND_EW : ir_op_collective(n->op) ? STEP_KIND_COLLECTIVE : STEP_KIND_OP;
        }
        step->space = step->kind == STEP_KIND_ROW ? *ir_fuse_shape(g, g->nodes[members[0]])
                      : step->kind == STEP_KIND_GEMM ? g->nodes[members[0]]->type
                                                : n->type;
        add_members(&b, step, members, size);
        add_inputs(&b, step);
    }
    /* a lone reshape of a stored value is that value's bytes read with other
     * dims (every arena value is contiguous), a lone slice cutting one byte
     * range out of it those bytes: a view, no kernel */
    for (int k = 0; k < out->nsteps; k++) {
        const sched_step *step = &out->steps[k];
        const ir_node *n = g->nodes[step->pos];
        if (step->kind == STEP_KIND_OP && sched_view_delta(g, n) >= 0 && out->step_of[n->in[0]] >= 0)
            out->members[step->first].flags |= MEMBER_VIEW;
    }
    mark_gathers(g, out, b.stamp);
    if (!st) attn_views_mark(g, out, b.stamp, b.parent, b.tail); /* the builder's scratch, free again here */
    if (!st) sched_mark_ranged_reads(g, out);
    ir_groups_free(&gs);
    al_free(b.must_store), al_free(b.stamp), al_free(b.parent), al_free(b.tail);
    return st;
}

void sched_free(schedule *s)
{
    al_free(s->steps), al_free(s->members), al_free(s->parts), al_free(s->inputs);
    al_free(s->step_of), al_free(s->member_of), al_free(s->kept), al_free(s->row_stride);
    memset(s, 0, sizeof *s);
}

int64_t sched_view_delta(const ir_graph *g, const ir_node *n)
{
    if (n->op == IR_OP_reshape) return 0;
    if (n->op != IR_OP_slice || n->nin != 1) return -1;
    const ir_type *t = &g->nodes[n->in[0]]->type;
    int64_t axis = ir_attr_i(n, "axis"), start = ir_attr_i(n, "start"), outer = 1, inner = 1;
    if (axis < 0 || axis >= t->rank || start < 0 || start > t->dims[axis]) return -1;
    for (int d = 0; d < axis; d++) outer *= t->dims[d];
    for (int d = (int)axis + 1; d < t->rank; d++) inner *= t->dims[d];
    if (outer != 1) return -1; /* rows cut out of several outer blocks: not one byte range */
    int64_t delta = start * inner * (int64_t)alloy_dtype_size(t->dtype);
    return delta % SCHED_VIEW_ALIGN ? -1 : delta;
}

int64_t sched_view_offset(const ir_graph *g, const schedule *s, int i)
{
    int64_t off = 0;
    for (int m; i >= 0 && i < s->nnodes && (m = s->member_of[i]) >= 0 && (s->members[m].flags & MEMBER_VIEW) &&
                (g->nodes[i]->op != IR_OP_concat || attn_view_alias(g, s, i));) {
        int64_t strided = attn_view_delta(g, s, i);
        off += strided >= 0 ? strided : sched_view_delta(g, g->nodes[i]);
        i = g->nodes[i]->in[0];
    }
    return off;
}

int sched_view_root(const ir_graph *g, const schedule *s, int i)
{
    int root = -1;
    for (int m; i >= 0 && i < s->nnodes && (m = s->member_of[i]) >= 0 && (s->members[m].flags & MEMBER_VIEW) &&
                (g->nodes[i]->op != IR_OP_concat || attn_view_alias(g, s, i));)
        root = i = g->nodes[i]->in[0];
    return root;
}

void sched_print(const ir_graph *g, const schedule *s, FILE *out)
{
    int count[STEP_KIND_COLLECTIVE + 1] = {0};
    for (int k = 0; k < s->nsteps; k++) count[s->steps[k].kind]++;
    fprintf(out, "# schedule: %d steps (op %d, ew %d, row %d, gemm %d, multi %d", s->nsteps, count[STEP_KIND_OP],
            count[STEP_KIND_EW], count[STEP_KIND_ROW], count[STEP_KIND_GEMM], count[STEP_KIND_MULTI]);
    if (count[STEP_KIND_COLLECTIVE]) fprintf(out, ", collective %d", count[STEP_KIND_COLLECTIVE]); /* data-parallel steps only */
    fputs(")\n", out);
    static const struct {
        uint8_t flag;
        char letter;
    } letters[] = {{MEMBER_STORED, 's'}, {MEMBER_EXACT, 'x'}, {MEMBER_RANGED, 'r'}, {MEMBER_CHECK, 'c'}, {MEMBER_SPILLED, 'p'},
                   {MEMBER_VIEW, 'v'}, {MEMBER_STRIDED, 'w'}, {MEMBER_RANGED_READ, 'l'}};
    for (int k = 0; k < s->nsteps; k++) {
        const sched_step *st = &s->steps[k];
        char ty[96];
        ir_fmt_type(ty, sizeof ty, &st->space);
        fprintf(out, "# step %d %s @%%%d %s: in", k, sched_kind_name(st->kind), st->pos, ty);
        for (int i = 0; i < st->nin; i++) fprintf(out, " %%%d", s->inputs[st->first_in + i]);
        fputc(';', out);
        for (int p = st->first_part; p < st->first_part + st->nparts; p++) {
            const sched_part *part = &s->parts[p];
            if (p > st->first_part) fputs(" |", out);
            const char *what = part->kind == PART_EW       ? "ew"
                               : part->kind == PART_COLSUM ? "colsum"
                                                           : ir_ops[g->nodes[s->members[part->first].node]->op].name;
            fprintf(out, " %s%s", what, part->wide ? "(f64)" : "");
            for (int m = part->first; m < part->first + part->n; m++) {
                fprintf(out, " %%%d", s->members[m].node);
                if (s->members[m].flags) fputc('=', out);
                for (size_t l = 0; l < sizeof letters / sizeof letters[0]; l++)
                    if (s->members[m].flags & letters[l].flag) fputc(letters[l].letter, out);
                if (sched_padded(s, s->members[m].node))
                    fprintf(out, "%sld%lld", s->members[m].flags ? "," : "=", (long long)s->row_stride[s->members[m].node]);
            }
        }
        fputc('\n', out);
    }
}
