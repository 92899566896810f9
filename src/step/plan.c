/* plan.c - the memory planner: liveness over the schedule, best-fit offsets in one arena, in-place reuse. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "step/plan.h"

/* ---- free blocks: two treaps over one pool, by offset (to merge
 * neighbours) and by (size, offset) (to find the best fit) ---- */

enum { BY_OFFSET, BY_SIZE };

typedef struct free_block {
    int64_t off, size;
    uint32_t prio;
    int kid[2][2]; /* kid[tree][0: smaller keys, 1: larger] */
} free_block;

typedef struct free_space {
    free_block *pool;
    int *spare; /* unused pool entries */
    int nspare;
    int root[2];
    uint32_t seed;
    int64_t top; /* high-water mark of the arena */
} free_space;

static bool key_less(const free_space *f, int tree, int a, int b)
{
    const free_block *x = &f->pool[a], *y = &f->pool[b];
    if (tree == BY_SIZE && x->size != y->size) return x->size < y->size;
    return x->off < y->off;
}

/* Joins two treaps where every key of a is below every key of b. */
static int treap_merge(free_space *f, int tree, int a, int b)
{
    if (a < 0) return b;
    if (b < 0) return a;
    if (f->pool[a].prio > f->pool[b].prio) {
        f->pool[a].kid[tree][1] = treap_merge(f, tree, f->pool[a].kid[tree][1], b);
        return a;
    }
    f->pool[b].kid[tree][0] = treap_merge(f, tree, a, f->pool[b].kid[tree][0]);
    return b;
}

/* Splits root into keys below x's (*lo) and the rest (*hi). */
static void treap_split(free_space *f, int tree, int root, int x, int *lo, int *hi)
{
    if (root < 0) {
        *lo = *hi = -1;
        return;
    }
    if (key_less(f, tree, root, x)) {
        treap_split(f, tree, f->pool[root].kid[tree][1], x, &f->pool[root].kid[tree][1], hi);
        *lo = root;
    } else {
        treap_split(f, tree, f->pool[root].kid[tree][0], x, lo, &f->pool[root].kid[tree][0]);
        *hi = root;
    }
}

/* Removes x (which is in the treap) from the treap at root; returns the new root. */
static int treap_remove(free_space *f, int tree, int root, int x)
{
    free_block *r = &f->pool[root];
    if (root == x) return treap_merge(f, tree, r->kid[tree][0], r->kid[tree][1]);
    int side = key_less(f, tree, x, root) ? 0 : 1;
    r->kid[tree][side] = treap_remove(f, tree, r->kid[tree][side], x);
    return root;
}

static void block_insert(free_space *f, int64_t off, int64_t size)
{
    ALLOY_ASSERT(f->nspare > 0); /* the pool holds one more block than there are slots */
    int x = f->spare[--f->nspare];
    f->seed ^= f->seed << 13, f->seed ^= f->seed >> 17, f->seed ^= f->seed << 5;
    f->pool[x] = (free_block){.off = off, .size = size, .prio = f->seed,
                              .kid = {{-1, -1}, {-1, -1}}};
    for (int t = 0; t < 2; t++) {
        int lo, hi;
        treap_split(f, t, f->root[t], x, &lo, &hi);
        f->root[t] = treap_merge(f, t, treap_merge(f, t, lo, x), hi);
    }
}

static void block_remove(free_space *f, int x)
{
    for (int t = 0; t < 2; t++) f->root[t] = treap_remove(f, t, f->root[t], x);
    f->spare[f->nspare++] = x;
}

/* The free block with the largest offset below off (below true) or the
 * smallest above it (below false), or -1. */
static int block_beside(const free_space *f, int64_t off, bool below)
{
    int best = -1;
    for (int x = f->root[BY_OFFSET]; x >= 0;) {
        const free_block *b = &f->pool[x];
        bool go_right = below ? b->off < off : b->off <= off;
        if (go_right == below) best = x;
        x = b->kid[BY_OFFSET][go_right];
    }
    return best;
}

/* Takes size bytes: the smallest free block that fits (lowest offset among
 * equals), else the free block at the top of the arena grown, else new
 * space at the top. Returns the offset. */
static int64_t space_alloc(free_space *f, int64_t size)
{
    int fit = -1;
    for (int x = f->root[BY_SIZE]; x >= 0;) {
        bool fits = f->pool[x].size >= size;
        if (fits) fit = x;
        x = f->pool[x].kid[BY_SIZE][!fits];
    }
    if (fit >= 0) {
        free_block b = f->pool[fit];
        block_remove(f, fit);
        if (b.size > size) block_insert(f, b.off + size, b.size - size);
        return b.off;
    }
    int last = block_beside(f, f->top, true);
    int64_t off = f->top;
    if (last >= 0 && f->pool[last].off + f->pool[last].size == f->top) {
        off = f->pool[last].off;
        block_remove(f, last);
    }
    f->top = off + size;
    return off;
}

/* Returns [off, off + size) to the free space, merged with free neighbours. */
static void space_free(free_space *f, int64_t off, int64_t size)
{
    int before = block_beside(f, off, true), after = block_beside(f, off, false);
    if (before >= 0 && f->pool[before].off + f->pool[before].size == off) {
        off = f->pool[before].off;
        size += f->pool[before].size;
        block_remove(f, before);
    }
    if (after >= 0 && f->pool[after].off == off + size) {
        size += f->pool[after].size;
        block_remove(f, after);
    }
    block_insert(f, off, size);
}

/* ---- the plan ---- */

static bool is_bound_leaf(const ir_node *n)
{
    return n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

enum { F_MAT = 1, F_KEEP = 2, F_TAKEN = 4, F_FREED = 8, F_VIEWED = 16, F_EARLY = 32 };

/* Scratch of one plan_build call. */
typedef struct planner {
    const ir_graph *g;
    const int *exec_pos;
    const int *view_of; /* plan_schedule's, or NULL */
    const int64_t *view_off; /* plan_schedule's, or NULL */
    const int64_t *row_stride; /* plan_schedule's, or NULL */
    uint8_t *flags;     /* F_* per node */
    int *last;          /* last position the value is needed at (INT_MAX: kept) */
    int *users_at_last; /* distinct consumers at that position */
    int *stamp;         /* per value: the consumer that last counted it */
    int *order;         /* non-leaf nodes by (position, id) */
    int norder;
    free_space space;
} planner;

static int pos_of(const planner *p, int i) { return p->exec_pos ? p->exec_pos[i] : i; }

/* The value owning node i's slot: i itself, or the value it is a view of. */
static int owner_of(const planner *p, int i) { return p->view_of && p->view_of[i] >= 0 ? p->view_of[i] : i; }

static int64_t stride_of(const planner *p, int i) { return p->row_stride ? p->row_stride[i] : 0; }

/* The bytes of node i's value: its rows row_stride apart when padded. */
static size_t value_bytes(const planner *p, int i)
{
    const ir_type *t = &p->g->nodes[i]->type;
    size_t b = ir_nbytes(t);
    int64_t ld = stride_of(p, i);
    if (ld > 0 && t->rank && t->dims[t->rank - 1] > 0) b = b / (size_t)t->dims[t->rank - 1] * (size_t)ld;
    return b;
}

static int64_t slot_bytes(const planner *p, int i)
{
    size_t b = value_bytes(p, i);
    return (int64_t)((b + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN);
}

/* Fills flags, last, users_at_last and order; checks the schedule. */
static alloy_status liveness(planner *p, const plan_schedule *s, char *err, size_t errlen)
{
    const ir_graph *g = p->g;
    char a[64], b[64];
    for (int i = 0; i < g->nnodes; i++) {
        const ir_node *n = g->nodes[i];
        if (is_bound_leaf(n) || (s && s->bound && s->bound[i])) continue;
        p->flags[i] = (!s || !s->materialized || s->materialized[i] ? F_MAT : 0) |
                      (s && s->keep && s->keep[i] ? F_KEEP : 0);
        if (pos_of(p, i) < 0 || pos_of(p, i) == INT_MAX) {
            al_fmt(err, errlen, "schedule: %s '%s' has position %d", ir_ops[n->op].name,
                   ir_node_label(n, a, sizeof a), pos_of(p, i));
            return ALLOY_ERR_INVALID;
        }
        if ((p->flags[i] & (F_MAT | F_KEEP)) == F_KEEP) {
            al_fmt(err, errlen, "schedule: %s '%s' must be kept but is not materialized",
                   ir_ops[n->op].name, ir_node_label(n, a, sizeof a));
            return ALLOY_ERR_INVALID;
        }
        p->last[i] = p->flags[i] & F_KEEP ? INT_MAX : pos_of(p, i);
        p->stamp[i] = -1;
    }
    for (int i = 0; i < g->nnodes && p->view_of; i++) {
        int o = p->view_of[i];
        if (o < 0) continue;
        if (o >= g->nnodes || p->view_of[o] >= 0 || !(p->flags[i] & F_MAT) || !(p->flags[o] & F_MAT) ||
            (pos_of(p, o) >= pos_of(p, i) && g->nodes[o]->op != IR_OP_concat) || pos_of(p, o) == pos_of(p, i)) {
            al_fmt(err, errlen, "schedule: %s '%s' is a view of a value that cannot hold it", ir_ops[g->nodes[i]->op].name,
                   ir_node_label(g->nodes[i], a, sizeof a));
            return ALLOY_ERR_INVALID;
        }
        p->flags[o] |= F_VIEWED;
        if (p->flags[i] & F_KEEP) p->last[o] = INT_MAX; /* a kept view keeps its owner's bytes */
    }
    /* a use of a view is a use of the value that owns its slot */
    for (int i = 0; i < g->nnodes; i++) {
        const ir_node *n = g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            int x = n->in[k], j = owner_of(p, x); /* a gathered piece's owner comes later: x's position counts */
            if (is_bound_leaf(g->nodes[j]) || (s && s->bound && s->bound[j])) continue;
            if (pos_of(p, x) > pos_of(p, i) || (!(p->flags[j] & F_MAT) && pos_of(p, j) != pos_of(p, i))) {
                al_fmt(err, errlen,
                       "schedule: %s '%s' at position %d uses '%s' at position %d%s",
                       ir_ops[n->op].name, ir_node_label(n, a, sizeof a), pos_of(p, i),
                       ir_node_label(g->nodes[x], b, sizeof b), pos_of(p, x),
                       pos_of(p, x) > pos_of(p, i) ? ", produced later" : ", which is not materialized");
                return ALLOY_ERR_INVALID;
            }
            if (p->last[j] < pos_of(p, i)) p->last[j] = pos_of(p, i);
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        const ir_node *n = g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            int j = owner_of(p, n->in[k]);
            if (!(p->flags[j] & F_MAT) || p->stamp[j] == i) continue;
            p->stamp[j] = i;
            p->users_at_last[j] += p->last[j] == pos_of(p, i);
        }
    }
    /* schedule order: by position, then id (the IR order within a group) */
    p->norder = 0;
    if (!p->exec_pos) {
        for (int i = 0; i < g->nnodes; i++)
            if (!is_bound_leaf(g->nodes[i])) p->order[p->norder++] = i;
        return ALLOY_OK;
    }
    uint64_t *keys = al_malloc(sizeof(uint64_t) * ((size_t)g->nnodes + 1));
    if (!keys) {
        al_fmt(err, errlen, "out of memory planning %d nodes", g->nnodes);
        return ALLOY_ERR_OOM;
    }
    int nkeys = 0;
    bool sorted = true;
    for (int i = 0; i < g->nnodes; i++) {
        if (is_bound_leaf(g->nodes[i])) continue;
        keys[nkeys] = (uint64_t)pos_of(p, i) << 32 | (uint32_t)i;
        sorted = sorted && (nkeys == 0 || keys[nkeys - 1] < keys[nkeys]);
        nkeys++;
    }
    if (!sorted) qsort(keys, (size_t)nkeys, sizeof *keys, cmp_u64);
    for (int k = 0; k < nkeys; k++) p->order[p->norder++] = (int)(keys[k] & 0xffffffffu);
    al_free(keys);
    return ALLOY_OK;
}

/* Whether node i may take value j's slot (the slot of j's owner when j is
 * a view): the owner materialized, not kept, not taken, produced before
 * i's position and last used there, it and its views (by `users`
 * consumers at most; 0: any number), and j with i's dims and element
 * size. */
static bool may_take(const planner *p, int i, int j, int users)
{
    const ir_node *n = p->g->nodes[i], *o = p->g->nodes[j];
    j = owner_of(p, j);
    if (ir_nbytes(&p->g->nodes[j]->type) != ir_nbytes(&o->type)) return false; /* a slice view: part of its owner */
    if ((p->flags[j] & (F_MAT | F_KEEP | F_TAKEN)) != F_MAT) return false;
    if (stride_of(p, i) != stride_of(p, j)) return false; /* one index for both: the same row stride */
    if (p->last[j] != pos_of(p, i) || pos_of(p, j) >= pos_of(p, i) || (users && p->users_at_last[j] != users))
        return false;
    return ir_nbytes(&o->type) != 0 && o->type.rank == n->type.rank &&
           alloy_dtype_size(o->type.dtype) == alloy_dtype_size(n->type.dtype) &&
           memcmp(o->type.dims, n->type.dims, sizeof(int64_t) * (size_t)n->type.rank) == 0;
}

/* The value whose slot node i may take in place (an operand, or alias_of[i]), or -1. */
static int inplace_operand(const planner *p, const plan_schedule *s, int i)
{
    const ir_node *n = p->g->nodes[i];
    /* the readers of an alias all run in i's step before i: any number */
    if (s && s->alias_of && s->alias_of[i] >= 0 && may_take(p, i, s->alias_of[i], 0)) return owner_of(p, s->alias_of[i]);
    bool ok = s && s->inplace_ok ? s->inplace_ok[i] != 0 : ir_ops[n->op].elementwise;
    if (!ok) return -1;
    for (int k = 0; k < n->nin; k++)
        if (may_take(p, i, n->in[k], 1)) return owner_of(p, n->in[k]);
    return -1;
}

/* Gives value i a slot (in place, or from the free space); returns the slot's new bytes. */
static int64_t place(planner *p, const plan_schedule *s, mem_plan *out, int i)
{
    const ir_node *n = p->g->nodes[i];
    if (p->flags[i] & F_EARLY) return 0; /* a gathered concat: its slot came with its first piece */
    if (owner_of(p, i) != i) { /* a view: its owner's bytes (placed earlier, or now for a concat's first piece) */
        int o = p->view_of[i];
        int64_t bytes = 0;
        if (pos_of(p, o) > pos_of(p, i) && !(p->flags[o] & F_EARLY)) {
            const ir_node *c = p->g->nodes[o];
            bytes = slot_bytes(p, o);
            out->offset[o] = space_alloc(&p->space, bytes);
            out->bytes_by_dtype[c->type.dtype] += ir_nbytes(&c->type);
            p->flags[o] |= F_EARLY;
        }
        out->offset[i] = out->offset[o] + (p->view_off ? p->view_off[i] : 0);
        out->views++;
        p->flags[i] |= F_FREED; /* nothing of its own to give back */
        return bytes;
    }
    out->bytes_by_dtype[n->type.dtype] += ir_nbytes(&n->type);
    int64_t bytes = slot_bytes(p, i);
    if (bytes == 0) {
        out->offset[i] = 0;
        p->flags[i] |= F_FREED; /* nothing to give back */
        return 0;
    }
    int j = inplace_operand(p, s, i);
    if (j >= 0) {
        out->offset[i] = out->offset[j];
        p->flags[j] |= F_TAKEN;
        out->inplace++;
        return 0;
    }
    out->offset[i] = space_alloc(&p->space, bytes);
    return bytes;
}

/* Gives back the slot of value j (of its owner when j is a view) if
 * position pos was its last use; returns the bytes freed. */
static int64_t release(planner *p, const mem_plan *out, int j, int pos)
{
    j = owner_of(p, j);
    if ((p->flags[j] & (F_MAT | F_TAKEN | F_FREED)) != F_MAT || p->last[j] != pos) return 0;
    p->flags[j] |= F_FREED;
    int64_t bytes = slot_bytes(p, j);
    space_free(&p->space, out->offset[j], bytes);
    return bytes;
}

alloy_status plan_build(const ir_graph *g, const plan_schedule *s, mem_plan *out, char *err,
                        size_t errlen)
{
    if (out) memset(out, 0, sizeof *out);
    if (!g || !out) {
        al_fmt(err, errlen, "plan_build: graph or plan is NULL");
        return ALLOY_ERR_INVALID;
    }
    size_t n = (size_t)g->nnodes;
    planner p = {.g = g, .exec_pos = s ? s->exec_pos : NULL, .view_of = s ? s->view_of : NULL,
                 .view_off = s ? s->view_off : NULL, .row_stride = s ? s->row_stride : NULL};
    p.flags = al_calloc(n + 1, 1);
    p.last = al_calloc(n + 1, sizeof(int));
    p.users_at_last = al_calloc(n + 1, sizeof(int));
    p.stamp = al_calloc(n + 1, sizeof(int));
    p.order = al_calloc(n + 1, sizeof(int));
    p.space.pool = al_calloc(n + 2, sizeof(free_block));
    p.space.spare = al_calloc(n + 2, sizeof(int));
    out->offset = al_calloc(n + 1, sizeof(int64_t));
    alloy_status st = ALLOY_OK;
    if (!p.flags || !p.last || !p.users_at_last || !p.stamp || !p.order || !p.space.pool ||
        !p.space.spare || !out->offset) {
        al_fmt(err, errlen, "out of memory planning %d nodes", g->nnodes);
        st = ALLOY_ERR_OOM;
    }
    if (!st) st = liveness(&p, s, err, errlen);
    if (!st) {
        out->nnodes = g->nnodes;
        for (size_t i = 0; i < n; i++) out->offset[i] = -1;
        for (int k = 0; k < g->nnodes + 2; k++) p.space.spare[p.space.nspare++] = g->nnodes + 1 - k;
        p.space.root[BY_OFFSET] = p.space.root[BY_SIZE] = -1;
        p.space.seed = 0x9e3779b9u;
        int64_t live = 0, peak = 0;
        /* per position: place what it produces, then free what it used last */
        for (int a = 0, b; a < p.norder; a = b) {
            int pos = pos_of(&p, p.order[a]);
            for (b = a; b < p.norder && pos_of(&p, p.order[b]) == pos; b++)
                if (p.flags[p.order[b]] & F_MAT) live += place(&p, s, out, p.order[b]);
            if (live > peak) peak = live;
            for (int k = a; k < b; k++) {
                const ir_node *node = g->nodes[p.order[k]];
                for (int q = 0; q < node->nin; q++) live -= release(&p, out, node->in[q], pos);
                live -= release(&p, out, node->id, pos);
            }
        }
        out->arena_bytes = (size_t)p.space.top;
        out->peak_live_bytes = (size_t)peak;
    }
    if (!st && out->views) {
        out->view_of = al_malloc(sizeof(int) * (n + 1));
        if (!out->view_of) {
            al_fmt(err, errlen, "out of memory planning %d nodes", g->nnodes);
            st = ALLOY_ERR_OOM;
        } else {
            for (size_t i = 0; i < n; i++) out->view_of[i] = p.view_of[i];
        }
    }
    al_free(p.flags);
    al_free(p.last);
    al_free(p.users_at_last);
    al_free(p.stamp);
    al_free(p.order);
    al_free(p.space.pool);
    al_free(p.space.spare);
    if (st) plan_free(out);
    return st;
}

void plan_free(mem_plan *p)
{
    if (!p) return;
    al_free(p->offset);
    al_free(p->state_of);
    al_free(p->view_of);
    memset(p, 0, sizeof *p);
}

/* Whether step k cannot fail once a backend has reserved its buffers:
 * elementwise work only (EW steps, MULTI steps of EW parts, a lone
 * elementwise op). */
static bool step_cannot_fail(const ir_graph *g, const schedule *s, int k)
{
    const sched_step *step = &s->steps[k];
    if (step->kind == STEP_KIND_EW) return true;
    if (step->kind == STEP_KIND_OP) return ir_ops[g->nodes[s->members[step->first].node]->op].elementwise;
    if (step->kind != STEP_KIND_MULTI) return false;
    for (int q = step->first_part; q < step->first_part + step->nparts; q++)
        if (s->parts[q].kind != PART_EW) return false;
    return true;
}

/* Fills state_of (nn entries, all -1) with the updates that plan_for_step
 * writes in place (none that a view reads: viewed, per node); returns the
 * first step writing one, or -1. scratch has 3 nn ints. Steps run in index order, the members of an EW part chunk by
 * chunk in member order. Linear in the nodes and operands. */
static int updates_in_place(const ir_graph *g, const schedule *s, const uint8_t *viewed, int *state_of, int *scratch)
{
    int nn = g->nnodes, tail = s->nsteps;
    while (tail > 0 && step_cannot_fail(g, s, tail - 1)) tail--;
    /* per node: its member index and the EW part holding it (-1: none) */
    int *member = scratch, *part = scratch + nn, *update = scratch + 2 * nn;
    for (int i = 0; i < nn; i++) member[i] = part[i] = update[i] = -1;
    for (int q = 0; q < s->nparts; q++)
        for (int m = s->parts[q].first; m < s->parts[q].first + s->parts[q].n; m++) {
            member[s->members[m].node] = m;
            part[s->members[m].node] = s->parts[q].kind == PART_EW ? q : -1;
        }
    /* candidates: update v of leaf t stored by an EW part of the tail, of t's type */
    for (int u = 0; u < g->nupdates; u++) {
        int t = ir_find_name(g, g->updates[u].name), v = g->updates[u].node, k = v >= 0 ? s->step_of[v] : -1;
        if (t < 0 || t == v || k < tail || part[v] < 0 || !sched_stored(s, v)) continue;
        if (viewed[v] || sched_view_root(g, s, v) >= 0) continue; /* a view of v reads v's slot: v keeps one */
        const ir_node *leaf = g->nodes[t];
        if ((leaf->op != IR_OP_param && leaf->op != IR_OP_state) || !ir_type_eq(&leaf->type, &g->nodes[v]->type))
            continue;
        if (s->steps[k].kind != STEP_KIND_EW && s->steps[k].kind != STEP_KIND_MULTI) continue;
        update[t] = v;
    }
    /* every reader of t runs in an earlier step, or in v's part no later than v */
    for (int i = 0; i < nn; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++) {
            int t = g->nodes[i]->in[j], v = update[t];
            if (v < 0) continue;
            int ki = s->step_of[i], kv = s->step_of[v];
            if (ki > kv || (ki == kv && (part[i] != part[v] || member[i] > member[v]))) update[t] = -1;
        }
    int first = -1;
    for (int t = 0; t < nn; t++) {
        int v = update[t];
        if (v < 0) continue;
        state_of[v] = t;
        if (first < 0 || s->step_of[v] < first) first = s->step_of[v];
    }
    return first;
}

static alloy_status plan_schedule_core(const ir_graph *g, const schedule *s, bool no_reuse, bool in_place,
                                       mem_plan *out, char *err, size_t errlen);

alloy_status plan_for_schedule(const ir_graph *g, const schedule *s, bool no_reuse, mem_plan *out, char *err,
                               size_t errlen)
{
    return plan_schedule_core(g, s, no_reuse, false, out, err, errlen);
}

alloy_status plan_for_step(const ir_graph *g, const schedule *s, bool no_reuse, mem_plan *out, char *err,
                           size_t errlen)
{
    return plan_schedule_core(g, s, no_reuse, !no_reuse && g->nupdates > 0, out, err, errlen);
}

/* Per node, the row input whose slot a stored member of a row step may
 * take (-1 none): an input from outside the step with the member's dims
 * whose readers in the step all come before the member and which the
 * member does not read (nor any value sharing its slot: views). The row executors compute members in order on a
 * block of whole rows (CPU) or a row per team with each column read and
 * written by one thread (CUDA), so every read of the input's row is done
 * before the member's row is stored over it (a column sum's result is
 * written after every row is done: on the CPU after all blocks, on a GPU
 * by a kernel after the row kernel). The classifier's case: the
 * logits' row is cast to f32 for cross_entropy and its gradient, whose
 * f16 result then goes where the logits were. NULL when out of memory. */
static int *row_aliases(const ir_graph *g, const schedule *s, const uint8_t *mat, const int *view_of)
{
    int *alias = al_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    if (!alias) return NULL;
    for (int i = 0; i < g->nnodes; i++) alias[i] = -1;
    for (int k = 0; k < s->nsteps; k++) {
        const sched_step *st = &s->steps[k];
        if (st->kind != STEP_KIND_ROW) continue;
        for (int q = 0; q < st->nin; q++) {
            int j = s->inputs[st->first_in + q], last_reader = -1;
            int owner = view_of[j] >= 0 ? view_of[j] : j;
            const ir_type *jt = &g->nodes[j]->type;
            for (int m = 0; m < st->n; m++) { /* readers of j's slot: of its owner or any view of it */
                const ir_node *x = g->nodes[s->members[st->first + m].node];
                for (int e = 0; e < x->nin; e++)
                    if (x->in[e] == owner || view_of[x->in[e]] == owner) last_reader = m;
            }
            for (int m = last_reader + 1; m < st->n; m++) {
                int i = s->members[st->first + m].node;
                const ir_type *it = &g->nodes[i]->type;
                if (!mat[i] || alias[i] >= 0 || it->rank != jt->rank ||
                    memcmp(it->dims, jt->dims, sizeof(int64_t) * (size_t)it->rank) != 0 ||
                    alloy_dtype_size(it->dtype) != alloy_dtype_size(jt->dtype))
                    continue;
                alias[i] = j;
                break;
            }
        }
    }
    return alias;
}

static alloy_status plan_schedule_core(const ir_graph *g, const schedule *s, bool no_reuse, bool in_place,
                                       mem_plan *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int nn = g->nnodes;
    int *pos = al_calloc((size_t)nn + 1, sizeof(int));
    uint8_t *mat = al_calloc((size_t)nn + 1, 1), *inplace = al_calloc((size_t)nn + 1, 1);
    uint8_t *keep = al_calloc((size_t)nn + 1, 1), *bound = al_calloc((size_t)nn + 1, 1);
    uint8_t *viewed = al_calloc((size_t)nn + 1, 1);
    int *view_of = al_malloc(sizeof(int) * ((size_t)nn + 1));
    int64_t *view_off = al_malloc(sizeof(int64_t) * ((size_t)nn + 1));
    alloy_status st = ALLOY_OK;
    if (!pos || !mat || !inplace || !keep || !bound || !viewed || !view_of || !view_off) {
        al_fmt(err, errlen, "out of memory planning the arena of %d nodes", nn);
        st = ALLOY_ERR_OOM;
    }
    for (int i = 0; i < nn && !st; i++) {
        int k = s->step_of[i];
        if (k < 0) continue; /* bound leaves */
        const sched_step *step = &s->steps[k];
        pos[i] = step->pos;
        mat[i] = sched_stored(s, i);
        keep[i] = s->kept[i] || (no_reuse && mat[i]);
        /* an elementwise step of one node, or an all_reduce (MPI and NCCL reduce in place: its bucket's buffer) */
        /* (not a result stored through strides, attn_views.h: its elements land elsewhere than it reads them) */
        inplace[i] = !no_reuse && ((step->kind == STEP_KIND_EW && step->n == 1 && !(s->members[s->member_of[i]].flags & MEMBER_STRIDED)) ||
                                   (step->kind == STEP_KIND_COLLECTIVE && g->nodes[i]->op == IR_OP_all_reduce));
    }
    if (!st) sched_views(g, s, view_of, view_off); /* views share their owner's slot even without reuse */
    for (int i = 0; i < nn && !st; i++)
        if (view_of[i] >= 0) viewed[view_of[i]] = 1;
    int *alias_of = st || no_reuse ? NULL : row_aliases(g, s, mat, view_of);
    if (!st && !no_reuse && !alias_of) {
        al_fmt(err, errlen, "out of memory planning the row aliases of %d nodes", nn);
        st = ALLOY_ERR_OOM;
    }
    int *state_of = NULL, first_write = -1;
    if (!st && in_place) {
        state_of = al_malloc(sizeof(int) * ((size_t)nn + 1));
        int *scratch = al_malloc(sizeof(int) * (3 * (size_t)nn + 1));
        if (!state_of || !scratch) {
            al_fmt(err, errlen, "out of memory planning the updates of %d nodes", nn);
            st = ALLOY_ERR_OOM;
        } else {
            for (int i = 0; i < nn; i++) state_of[i] = -1;
            first_write = updates_in_place(g, s, viewed, state_of, scratch);
            for (int i = 0; i < nn; i++) /* its value lives in the state's buffer: no slot */
                if (state_of[i] >= 0) bound[i] = 1;
        }
        al_free(scratch);
        if (first_write < 0) al_free(state_of), state_of = NULL;
    }
    if (!st) {
        plan_schedule ps = {.exec_pos = pos, .materialized = mat, .keep = keep, .inplace_ok = inplace,
                            .bound = bound, .alias_of = alias_of, .view_of = view_of,
                            .view_off = view_off, .row_stride = s->row_stride};
        st = plan_build(g, &ps, out, err, errlen);
    }
    size_t scratch = 0;
    for (int k = 0; k < s->nsteps && !st; k++) {
        const sched_step *step = &s->steps[k];
        size_t bytes = sizeof(float) * (size_t)sched_padded_numel(g, s, s->members[step->first].node);
        if (step->kind == STEP_KIND_GEMM && bytes > scratch) scratch = bytes;
    }
    if (!st && scratch) {
        out->scratch_offset = (out->arena_bytes + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
        out->scratch_bytes = scratch;
        out->arena_bytes = out->scratch_offset + scratch;
    }
    if (!st) out->state_of = state_of, out->first_write = first_write;
    else al_free(state_of);
    al_free(pos), al_free(mat), al_free(inplace), al_free(keep), al_free(bound), al_free(alias_of);
    al_free(viewed), al_free(view_of), al_free(view_off);
    return st;
}

alloy_status plan_attach_views(const ir_graph *g, const schedule *s, mem_plan *p, char *err, size_t errlen)
{
    al_free(p->view_of);
    p->view_of = al_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    int64_t *off = al_malloc(sizeof(int64_t) * ((size_t)g->nnodes + 1));
    p->views = 0;
    if (!p->view_of || !off) {
        al_free(p->view_of), al_free(off);
        p->view_of = NULL;
        al_fmt(err, errlen, "out of memory reading the views of %d nodes", g->nnodes);
        return ALLOY_ERR_OOM;
    }
    sched_views(g, s, p->view_of, off);
    alloy_status st = ALLOY_OK;
    for (int i = 0; i < g->nnodes && !st; i++) {
        int o = p->view_of[i];
        if (o < 0) continue;
        p->views++;
        if (p->offset[o] < 0 || p->offset[i] != p->offset[o] + off[i] || (p->state_of && p->state_of[o] >= 0)) {
            al_fmt(err, errlen, "view %%%d is not placed %lld bytes into the arena slot of %%%d, the value it views", i,
                   (long long)off[i], o);
            st = ALLOY_ERR_INVALID;
        }
    }
    al_free(off);
    if (!p->views) al_free(p->view_of), p->view_of = NULL;
    return st;
}

void plan_print(const ir_graph *g, const mem_plan *p, bool per_value, FILE *out)
{
    fprintf(out, "# plan: arena %zu bytes, peak live %zu bytes, in place %d", p->arena_bytes, p->peak_live_bytes,
            p->inplace);
    if (p->views) fprintf(out, ", views %d", p->views);
    if (p->scratch_bytes) fprintf(out, ", scratch %zu at %zu", p->scratch_bytes, p->scratch_offset);
    int written = 0;
    for (int i = 0; p->state_of && i < p->nnodes; i++) written += p->state_of[i] >= 0;
    if (written) fprintf(out, ", updates in place %d", written);
    for (int d = 0; d < ALLOY_DTYPE_COUNT; d++)
        if (p->bytes_by_dtype[d]) fprintf(out, ", %s %zu B", alloy_dtype_name((alloy_dtype)d), p->bytes_by_dtype[d]);
    fputc('\n', out);
    for (int i = 0; per_value && i < g->nnodes && i < p->nnodes; i++)
        if (p->view_of && p->view_of[i] >= 0)
            fprintf(out, "# view %%%d of %%%d @%lld +%lld\n", i, p->view_of[i], (long long)p->offset[p->view_of[i]],
                    (long long)(p->offset[i] - p->offset[p->view_of[i]]));
        else if (p->offset[i] >= 0)
            fprintf(out, "# slot %%%d @%lld +%zu\n", i, (long long)p->offset[i], ir_nbytes(&g->nodes[i]->type));
        else if (p->state_of && p->state_of[i] >= 0)
            fprintf(out, "# update %%%d in state %%%d\n", i, p->state_of[i]);
}
