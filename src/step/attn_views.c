/* attn_views.c - strided views around the attention ops and the batched products of a written-out attention: the layout copies of a multi-head block (q/k/v sliced and transposed, o transposed back, dq/dk/dv concatenated) become strides the attention kernels and the GEMMs read and write through. */
#include <string.h>

#include "step/attn_views.h"

static bool is_attention(const ir_node *n) { return n->op == IR_OP_attention || n->op == IR_OP_attention_grad; }

/* Whether n is transpose(x, perm [0, 2, 1, 3]). */
static bool swaps_heads(const ir_node *n)
{
    int np = 0;
    const int64_t *perm = n->op == IR_OP_transpose ? ir_attr_ints(n, "perm", &np) : NULL;
    return perm && np == 4 && perm[0] == 0 && perm[1] == 2 && perm[2] == 1 && perm[3] == 3;
}

static uint8_t flags_of(const schedule *s, int i) { return s->member_of[i] >= 0 ? s->members[s->member_of[i]].flags : 0; }

/* Whether i is computed by a lone OP step of its own, stored, not kept,
 * not yet a view: a copy kernel this pass may remove. */
static bool lone_copy(const schedule *s, int i)
{
    int k = s->step_of[i];
    return k >= 0 && s->steps[k].kind == STEP_KIND_OP && s->steps[k].n == 1 && !s->kept[i] &&
           (flags_of(s, i) & (MEMBER_STORED | MEMBER_VIEW)) == MEMBER_STORED;
}

static void add_flags(schedule *s, int i, uint8_t f) { s->members[s->member_of[i]].flags |= f; }

static bool aligned(int64_t elems, size_t es) { return (elems * (int64_t)es) % SCHED_VIEW_ALIGN == 0; }

bool attn_strided_matmul(const ir_graph *g, const ir_node *n)
{
    if (n->op != IR_OP_matmul || n->nin != 2 || n->type.rank != 4) return false;
    for (int j = 0; j < 2; j++) {
        const ir_type *t = &g->nodes[n->in[j]]->type;
        if (t->rank != 4 || t->dims[0] != n->type.dims[0] || t->dims[1] != n->type.dims[1]) return false;
    }
    return true;
}

/* Whether the step of matmul n hands its operands to the library GEMM
 * whole: a lone matmul, or the head of a gemm step. */
static bool library_matmul(const schedule *s, const ir_node *n)
{
    int k = s->step_of[n->id];
    if (k < 0) return false;
    const sched_step *st = &s->steps[k];
    return (st->kind == STEP_KIND_OP && st->n == 1) || (st->kind == STEP_KIND_GEMM && s->members[st->first].node == n->id);
}

/* Whether reader n of a value reads it through strides: an attention op,
 * or a batched matmul of [B, H, R, D] operands whose step gives them to the
 * library GEMM. */
static bool strided_reader(const schedule *s, const ir_graph *g, const ir_node *n)
{
    return is_attention(n) || (attn_strided_matmul(g, n) && library_matmul(s, n));
}

/* The consumers of x into list[0..max) (each once per operand slot); returns the count. */
static int readers(const ir_graph *g, int x, int *list, int max)
{
    int k = 0;
    for (int i = x + 1; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++)
            if (g->nodes[i]->in[j] == x) {
                if (k < max) list[k] = i;
                k++;
            }
    return k;
}

/* readers with the count known (uses[x]): the walk stops at the last
 * consumer, or does not start when there are more than max. */
static int counted_readers(const ir_graph *g, const int *uses, int x, int *list, int max)
{
    int k = 0;
    if (uses[x] > max) return uses[x];
    for (int i = x + 1; i < g->nnodes && k < uses[x]; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++)
            if (g->nodes[i]->in[j] == x) list[k++] = i;
    return uses[x];
}

static bool same_dims(const ir_type *a, const ir_type *b)
{
    return a->rank == b->rank && !memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank);
}

/* Whether reader n of x reads it whole as an elementwise member: a
 * member of an ew step over x's own shape (no broadcast). */
static bool elementwise_reader(const ir_graph *g, const schedule *s, const ir_node *n, const ir_type *t)
{
    int st = s->step_of[n->id];
    return st >= 0 && s->steps[st].kind == STEP_KIND_EW && same_dims(&s->steps[st].space, t) &&
           same_dims(&n->type, t) && ir_ops[n->op].elementwise;
}

/* The scratch of attn_views_mark, per node: its consumers' operand slots
 * (uses), those that read it through strides (strided_reader) and those
 * that read it whole as elementwise members (elementwise_reader); counted
 * once, in one pass over the graph (the schedule's steps do not change
 * while the views are marked). */
typedef struct {
    int *uses, *strided, *ew;
} reads;

/* Operand x of an attention op, batched matmul or (sliced out of X only)
 * elementwise step: transpose(reshape([slice(] X [)])) of a row-major X
 * read only by such ops becomes a strided view of X. An elementwise
 * reader may write its result over its operand's slot where the operand
 * dies (plan.c), never over the owner of a view of part of it: so only a
 * proper slice's. */
static void mark_operand(const ir_graph *g, schedule *s, const reads *rd, int x)
{
    const int *uses = rd->uses;
    const ir_node *t = g->nodes[x];
    if (!swaps_heads(t) || !lone_copy(s, x)) return;
    int ew = rd->ew[x];
    if (rd->strided[x] + ew != uses[x]) return;
    const ir_node *r = g->nodes[t->in[0]];
    if (r->op != IR_OP_reshape || s->kept[r->id] || (flags_of(s, r->id) & (MEMBER_VIEW | MEMBER_STRIDED)) != MEMBER_VIEW)
        return;
    const ir_node *src = g->nodes[r->in[0]], *sl = NULL;
    int64_t H = t->type.dims[1], D = t->type.dims[3];
    size_t es = alloy_dtype_size(t->type.dtype);
    if (src->op == IR_OP_slice && lone_copy(s, src->id)) {
        sl = src;
        src = g->nodes[sl->in[0]];
        int64_t axis = ir_attr_i(sl, "axis");
        if (axis != sl->type.rank - 1 || uses[sl->id] != 1 || uses[r->id] != 1 || !aligned(ir_attr_i(sl, "start"), es))
            return;
    }
    /* an ew reader may take its operand's slot where that dies, whole (plan.c, may_take): a proper slice's never */
    if (ew && (!sl || ir_nbytes(&sl->type) >= ir_nbytes(&src->type))) return;
    /* X is a stored value whose bytes are row-major (a plain view at most) */
    if (s->step_of[src->id] < 0 || !sched_stored(s, src->id) || (flags_of(s, src->id) & MEMBER_STRIDED)) return;
    const ir_type *cut = sl ? &sl->type : &src->type;
    int64_t W = src->type.dims[src->type.rank - 1];
    if (cut->rank < 1 || cut->dims[cut->rank - 1] != H * D || !aligned(W, es) || !aligned(D, es)) return;
    if (sl) add_flags(s, sl->id, MEMBER_VIEW | MEMBER_STRIDED), add_flags(s, r->id, MEMBER_STRIDED);
    add_flags(s, x, MEMBER_VIEW | MEMBER_STRIDED);
}

/* attention o read by one transpose [0, 2, 1, 3] and otherwise only as
 * attention_grad's o: stored in the transpose's order. */
static void mark_output(const ir_graph *g, schedule *s, const int *uses, int o)
{
    const ir_node *n = g->nodes[o];
    int list[8], k = counted_readers(g, uses, o, list, 8), tr = -1;
    if (k > 8 || k != uses[o] || s->kept[o] || (flags_of(s, o) & (MEMBER_STORED | MEMBER_VIEW)) != MEMBER_STORED) return;
    for (int i = 0; i < k; i++) {
        const ir_node *c = g->nodes[list[i]];
        if (swaps_heads(c) && tr < 0 && lone_copy(s, c->id)) tr = c->id;
        else if (c->op != IR_OP_attention_grad || c->in[3] != o || c->in[0] == o || c->in[1] == o || c->in[2] == o ||
                 c->in[4] == o)
            return;
    }
    size_t es = alloy_dtype_size(n->type.dtype);
    if (tr < 0 || !aligned(n->type.dims[1] * n->type.dims[3], es) || !aligned(n->type.dims[3], es)) return;
    add_flags(s, o, MEMBER_STRIDED);
    add_flags(s, tr, MEMBER_VIEW);
}

/* A lone batched matmul (or a lone elementwise op over such a product:
 * dq scaled) whose result o only one transpose [0, 2, 1, 3] reads: the
 * GEMM (the kernel) writes o in the transpose's [B, T, H, D] order. */
static void mark_product(const ir_graph *g, schedule *s, const int *uses, int o)
{
    const ir_node *n = g->nodes[o];
    int list[2];
    int k = s->step_of[o];
    step_kind kind = n->op == IR_OP_matmul ? STEP_KIND_OP : STEP_KIND_EW;
    if (k < 0 || s->steps[k].kind != kind || s->steps[k].n != 1 || s->kept[o] || n->type.rank != 4 ||
        (flags_of(s, o) & (MEMBER_STORED | MEMBER_VIEW | MEMBER_CHECK)) != MEMBER_STORED || uses[o] != 1 ||
        counted_readers(g, uses, o, list, 2) != 1)
        return;
    const ir_node *c = g->nodes[list[0]];
    size_t es = alloy_dtype_size(n->type.dtype);
    if (!swaps_heads(c) || !lone_copy(s, c->id) || !aligned(n->type.dims[1] * n->type.dims[3], es) ||
        !aligned(n->type.dims[3], es))
        return;
    add_flags(s, o, MEMBER_STRIDED);
    add_flags(s, c->id, MEMBER_VIEW);
}

/* attention_grad G whose dq, dk, dv slices go through transpose and
 * reshape into one concat: G stored in the concat's order. */
static void mark_grads(const ir_graph *g, schedule *s, const int *uses, int id)
{
    const ir_node *n = g->nodes[id];
    int64_t H = n->type.dims[1], T = g->nodes[n->in[0]]->type.dims[2], S = g->nodes[n->in[1]]->type.dims[2],
            D = n->type.dims[3];
    int list[4], chain[3][3], concat = -1; /* per part: slice, transpose, reshape */
    size_t es = alloy_dtype_size(n->type.dtype);
    if (T != S || counted_readers(g, uses, id, list, 4) != 3 || uses[id] != 3 || s->kept[id] ||
        (flags_of(s, id) & (MEMBER_STORED | MEMBER_VIEW)) != MEMBER_STORED || !aligned(H * D, es) || !aligned(D, es))
        return;
    for (int i = 0; i < 3; i++) {
        const ir_node *sl = g->nodes[list[i]];
        int64_t start = sl->op == IR_OP_slice ? ir_attr_i(sl, "start") : -1;
        int part = start == 0 ? 0 : start == T ? 1 : start == 2 * T ? 2 : -1;
        int next[2];
        if (part < 0 || ir_attr_i(sl, "axis") != 2 || ir_attr_i(sl, "end") != start + T || !lone_copy(s, sl->id) ||
            uses[sl->id] != 1 || counted_readers(g, uses, sl->id, next, 2) != 1)
            return;
        const ir_node *tr = g->nodes[next[0]];
        if (!swaps_heads(tr) || !lone_copy(s, tr->id) || uses[tr->id] != 1 || counted_readers(g, uses, tr->id, next, 2) != 1) return;
        const ir_node *rs = g->nodes[next[0]];
        if (rs->op != IR_OP_reshape || s->kept[rs->id] || uses[rs->id] != 1 || counted_readers(g, uses, rs->id, next, 2) != 1 ||
            (flags_of(s, rs->id) & (MEMBER_VIEW | MEMBER_STRIDED)) != MEMBER_VIEW || rs->type.rank < 1 ||
            rs->type.dims[rs->type.rank - 1] != H * D)
            return;
        const ir_node *c = g->nodes[next[0]];
        if (c->op != IR_OP_concat || c->nin != 3 || c->in[part] != rs->id || ir_attr_i(c, "axis") != c->type.rank - 1 ||
            (concat >= 0 && concat != c->id) || !lone_copy(s, c->id))
            return;
        concat = c->id;
        chain[part][0] = sl->id, chain[part][1] = tr->id, chain[part][2] = rs->id;
    }
    add_flags(s, id, MEMBER_STRIDED);
    for (int p = 0; p < 3; p++)
        for (int j = 0; j < 3; j++) add_flags(s, chain[p][j], MEMBER_VIEW | MEMBER_STRIDED);
    add_flags(s, concat, MEMBER_VIEW);
}

int64_t attn_interleave_piece(const ir_graph *g, const schedule *s, int c, int q, int *piece)
{
    const ir_node *n = g->nodes[c];
    if (n->op != IR_OP_concat || q < 0 || q >= n->nin || n->type.rank != 2 || !(flags_of(s, c) & MEMBER_VIEW)) return -1;
    const ir_node *r = g->nodes[n->in[q]];
    if (r->op != IR_OP_reshape || r->nin != 1 || (flags_of(s, r->id) & (MEMBER_VIEW | MEMBER_STRIDED)) != MEMBER_VIEW)
        return -1;
    const ir_node *t = g->nodes[r->in[0]];
    if (!swaps_heads(t) || (flags_of(s, t->id) & (MEMBER_VIEW | MEMBER_STRIDED)) != MEMBER_VIEW) return -1;
    const ir_node *p = g->nodes[t->in[0]];
    if ((flags_of(s, p->id) & (MEMBER_VIEW | MEMBER_STRIDED)) != MEMBER_STRIDED || p->type.rank != 4 ||
        p->op == IR_OP_attention || p->op == IR_OP_attention_grad)
        return -1;
    int64_t col = 0;
    for (int j = 0; j < q; j++) col += g->nodes[n->in[j]]->type.dims[1];
    *piece = p->id;
    return col;
}

/* Whether strided result x ([B, H, T, D], stored in [B, T, H, D] order)
 * is a piece of an interleaving concat: its transpose's reshape is input
 * q of concat c, at column *col of c's rows (W wide). */
static bool piece_of(const ir_graph *g, const schedule *s, int x, int64_t *col, int64_t *W)
{
    int list[2];
    if (readers(g, x, list, 2) != 1) return false;
    int t = list[0];
    if (readers(g, t, list, 2) != 1) return false;
    int r = list[0];
    if (readers(g, r, list, 2) != 1) return false;
    const ir_node *c = g->nodes[list[0]];
    for (int q = 0; c->op == IR_OP_concat && q < c->nin; q++) {
        int piece = -1;
        int64_t at = c->in[q] == r ? attn_interleave_piece(g, s, c->id, q, &piece) : -1;
        if (at >= 0 && piece == x) {
            *col = at, *W = c->type.dims[1];
            return true;
        }
    }
    return false;
}

/* A lone concat of [B*T, H*D] values along its last axis, each the
 * reshape of a transpose view of a strided result (mark_product: dq, dk,
 * dv in their transposes' order): each result written into the concat's
 * rows at its columns, the concat a view (MEMBER_VIEW) owning them. */
static void mark_interleave(const ir_graph *g, schedule *s, const int *uses, int c)
{
    const ir_node *n = g->nodes[c];
    if (n->op != IR_OP_concat || n->type.rank != 2 || ir_attr_i(n, "axis") != 1 || !lone_copy(s, c)) return;
    size_t es = alloy_dtype_size(n->type.dtype);
    int64_t col = 0, W = n->type.dims[1];
    if (!aligned(W, es)) return;
    for (int q = 0; q < n->nin; q++) {
        const ir_node *r = g->nodes[n->in[q]];
        if (r->op != IR_OP_reshape || uses[r->id] != 1 || s->kept[r->id] ||
            (flags_of(s, r->id) & (MEMBER_VIEW | MEMBER_STRIDED)) != MEMBER_VIEW)
            return;
        const ir_node *t = g->nodes[r->in[0]];
        if (!swaps_heads(t) || uses[t->id] != 1 || s->kept[t->id] ||
            (flags_of(s, t->id) & (MEMBER_VIEW | MEMBER_STRIDED)) != MEMBER_VIEW)
            return;
        const ir_node *p = g->nodes[t->in[0]];
        if ((flags_of(s, p->id) & (MEMBER_VIEW | MEMBER_STRIDED)) != MEMBER_STRIDED || uses[p->id] != 1 || s->kept[p->id] ||
            p->type.rank != 4 || p->op == IR_OP_attention || p->op == IR_OP_attention_grad ||
            p->type.dims[0] * p->type.dims[2] != n->type.dims[0] || r->type.dims[1] != p->type.dims[1] * p->type.dims[3] ||
            !aligned(col, es))
            return;
        col += r->type.dims[1];
    }
    add_flags(s, c, MEMBER_VIEW);
}

void attn_views_mark(const ir_graph *g, schedule *s, int *uses, int *strided, int *ew)
{
    int nn = g->nnodes;
    reads rd = {uses, strided, ew};
    for (int i = 0; i < nn; i++) uses[i] = strided[i] = ew[i] = 0;
    for (int i = 0; i < nn; i++) {
        const ir_node *n = g->nodes[i];
        bool by_strides = strided_reader(s, g, n);
        for (int k = 0; k < n->nin; k++) {
            int x = n->in[k];
            uses[x]++;
            strided[x] += by_strides;
            ew[x] += elementwise_reader(g, s, n, &g->nodes[x]->type);
        }
    }
    for (int k = 0; k < s->nsteps; k++) {
        const ir_node *n = g->nodes[s->members[s->steps[k].first].node];
        if (attn_strided_matmul(g, n) && library_matmul(s, n)) {
            for (int j = 0; j < 2; j++) {
                mark_operand(g, s, &rd, n->in[j]);
                /* an operand an ew step computes from such a view (q scaled before q k^T) */
                int e = s->step_of[n->in[j]];
                if (e >= 0 && s->steps[e].kind == STEP_KIND_EW)
                    for (int i = 0; i < s->steps[e].nin; i++) mark_operand(g, s, &rd, s->inputs[s->steps[e].first_in + i]);
            }
            mark_product(g, s, uses, n->id);
            continue;
        }
        if (s->steps[k].kind == STEP_KIND_EW && s->steps[k].n == 1 && ir_ops[n->op].elementwise) {
            /* an elementwise op of a strided product's operands' kind: dq = (dS k) scaled */
            bool of_product = false;
            for (int j = 0; j < n->nin; j++)
                of_product |= attn_strided_matmul(g, g->nodes[n->in[j]]) && same_dims(&g->nodes[n->in[j]]->type, &n->type);
            if (of_product) mark_product(g, s, uses, n->id);
            continue;
        }
        n = g->nodes[s->steps[k].pos];
        if (s->steps[k].kind != STEP_KIND_OP || !is_attention(n) || n->type.rank != 4) continue;
        for (int j = 0; j < n->nin; j++) mark_operand(g, s, &rd, n->in[j]);
        if (n->op == IR_OP_attention) mark_output(g, s, uses, n->id);
        else mark_grads(g, s, uses, n->id);
    }
    for (int k = 0; k < s->nsteps; k++) /* after every product's marks: dq, dk, dv written into their concat */
        if (s->steps[k].kind == STEP_KIND_OP) mark_interleave(g, s, uses, s->steps[k].pos);
}

/* Contiguous [B, H, R, D]. */
static attn_stride contiguous(int64_t H, int64_t R, int64_t D) { return (attn_stride){0, H * R * D, R * D, D}; }

/* The layout of operand x ([B, H, R, D]) as its node's value holds it. */
static attn_stride operand(const ir_graph *g, const schedule *s, int x)
{
    const ir_type *t = &g->nodes[x]->type;
    int64_t H = t->dims[1], R = t->dims[2], D = t->dims[3];
    if (!s || !(flags_of(s, x) & MEMBER_STRIDED)) return contiguous(H, R, D);
    int op = g->nodes[x]->op;
    int64_t col, rows;
    if ((op == IR_OP_matmul || ir_ops[op].elementwise) && !(flags_of(s, x) & MEMBER_VIEW) && piece_of(g, s, x, &col, &rows))
        return (attn_stride){0, R * rows, D, rows}; /* in a concat's [B, T, rows] rows, at its address (col in) */
    if (op == IR_OP_attention || op == IR_OP_matmul || (ir_ops[op].elementwise && !(flags_of(s, x) & MEMBER_VIEW)))
        return (attn_stride){0, R * H * D, D, H * D}; /* stored [B, T, H, D] */
    /* transpose(reshape([slice(] X [)])): rows of X are W wide (any other
     * chain, as a damaged bundle could flag, reads contiguous) */
    const ir_node *r = g->nodes[x]->nin == 1 ? g->nodes[g->nodes[x]->in[0]] : NULL;
    const ir_node *src = r && r->op == IR_OP_reshape && r->nin == 1 ? g->nodes[r->in[0]] : NULL;
    if (src && src->op == IR_OP_slice && src->nin == 1 && (flags_of(s, src->id) & MEMBER_STRIDED)) src = g->nodes[src->in[0]];
    if (!src || g->nodes[x]->op != IR_OP_transpose || src->type.rank < 1) return contiguous(H, R, D);
    int64_t W = src->type.dims[src->type.rank - 1];
    return (attn_stride){0, R * W, D, W};
}

attn_stride attn_layout_of(const ir_graph *g, const schedule *s, int x) { return operand(g, s, x); }

void attn_strides_plain(int64_t H, int64_t T, int64_t S, int64_t D, attn_strides *out)
{
    int64_t rows = T + 2 * S;
    memset(out, 0, sizeof *out);
    out->H = H, out->T = T, out->S = S;
    out->q = out->o = out->dout = contiguous(H, T, D);
    out->k = out->v = contiguous(H, S, D);
    out->dq = (attn_stride){0, H * rows * D, rows * D, D};
    out->dk = (attn_stride){T * D, H * rows * D, rows * D, D};
    out->dv = (attn_stride){(T + S) * D, H * rows * D, rows * D, D};
}

void attn_strides_of(const ir_graph *g, const schedule *s, const ir_node *n, attn_strides *out)
{
    const ir_type *q = &g->nodes[n->in[0]]->type;
    int64_t H = q->dims[1], T = q->dims[2], D = q->dims[3], C = H * D;
    attn_strides_plain(H, T, g->nodes[n->in[1]]->type.dims[2], D, out);
    out->q = operand(g, s, n->in[0]), out->k = operand(g, s, n->in[1]), out->v = operand(g, s, n->in[2]);
    if (n->op == IR_OP_attention) {
        out->o = operand(g, s, n->id);
        return;
    }
    out->o = operand(g, s, n->in[3]), out->dout = operand(g, s, n->in[4]);
    if (s && (flags_of(s, n->id) & MEMBER_STRIDED) && T == g->nodes[n->in[1]]->type.dims[2]) { /* stored as [B, T, 3, H, D]: the concat's rows */
        out->dq = (attn_stride){0, T * 3 * C, D, 3 * C};
        out->dk = (attn_stride){C, T * 3 * C, D, 3 * C};
        out->dv = (attn_stride){2 * C, T * 3 * C, D, 3 * C};
    }
}

bool attn_view_alias(const ir_graph *g, const schedule *s, int c)
{
    const ir_node *n = g->nodes[c];
    return n->op == IR_OP_concat && n->nin > 0 && (flags_of(s, c) & MEMBER_VIEW) &&
           (flags_of(s, n->in[0]) & MEMBER_STRIDED);
}

int64_t attn_view_delta(const ir_graph *g, const schedule *s, int i)
{
    const ir_node *n = g->nodes[i];
    uint8_t f = flags_of(s, i);
    if (!(f & MEMBER_VIEW)) return -1;
    if (n->op == IR_OP_transpose || attn_view_alias(g, s, i)) return 0;
    if (!(f & MEMBER_STRIDED)) return -1;
    if (n->op == IR_OP_reshape) return 0;
    if (n->op != IR_OP_slice) return -1;
    const ir_node *x = g->nodes[n->in[0]];
    size_t es = alloy_dtype_size(n->type.dtype);
    if (x->op == IR_OP_attention_grad) { /* dq, dk, dv: at 0, C, 2C of each row of the concat's order */
        int64_t part = n->type.rank == 4 && n->type.dims[2] > 0 ? ir_attr_i(n, "start") / n->type.dims[2] : 0;
        return part * x->type.dims[1] * x->type.dims[3] * (int64_t)es;
    }
    return ir_attr_i(n, "start") * (int64_t)es; /* a slice of the last axis of a row-major value */
}
