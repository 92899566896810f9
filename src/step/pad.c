/* pad.c - padded row strides: which stored values of a schedule get rows longer than their width so the GEMMs that read or write them see aligned leading dimensions. */
#include <string.h>

#include "step/schedule.h"

static bool is_low(alloy_dtype d) { return d == ALLOY_F16 || d == ALLOY_BF16; }

/* A matmul the library runs with f16/bf16 operands: the only GEMMs whose
 * aligned kernels (tensor cores, 16-byte vector loads) padding buys. */
static bool low_gemm(const ir_graph *g, const ir_node *x)
{
    return x->op == IR_OP_matmul && is_low(g->nodes[x->in[0]]->type.dtype) && is_low(g->nodes[x->in[1]]->type.dtype);
}

static bool same_dims(const ir_type *a, const ir_type *b)
{
    return a->rank == b->rank && memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank) == 0;
}

/* Whether v's step computes it in a way that can write rows ld apart:
 * the library GEMM (a lone matmul, a gemm step's product or its bias
 * epilogue's sum), or an elementwise or row kernel storing v over the
 * step's own shape (its index goes through cg_value_index). */
static bool producer_takes_stride(const ir_graph *g, const schedule *s, int v)
{
    const sched_step *st = &s->steps[s->step_of[v]];
    const ir_node *first = g->nodes[s->members[st->first].node], *n = g->nodes[v];
    switch (st->kind) {
    case STEP_KIND_OP: return n->op == IR_OP_matmul || n->op == IR_OP_cast;
    case STEP_KIND_EW: return same_dims(&n->type, &st->space);
    case STEP_KIND_GEMM: return first->op == IR_OP_matmul && same_dims(&n->type, &st->space);
    case STEP_KIND_ROW: {
        for (int p = st->first_part; p < st->first_part + st->nparts; p++)
            if (s->parts[p].kind == PART_COLSUM) return false;
        return same_dims(&n->type, &st->space);
    }
    default: return false;
    }
}

/* Whether step k reads v (from outside the step) only in ways that take a
 * row stride: as a matmul operand (the library's ld), or over the step's
 * own shape in an elementwise, cast, GEMM epilogue or row kernel without
 * column sums. */
static bool consumer_takes_stride(const ir_graph *g, const schedule *s, int k, int v)
{
    const sched_step *st = &s->steps[k];
    const ir_type *t = &g->nodes[v]->type;
    for (int p = st->first_part; p < st->first_part + st->nparts; p++)
        if (s->parts[p].kind == PART_COLSUM) return false;
    for (int m = st->first; m < st->first + st->n; m++) {
        const ir_node *x = g->nodes[s->members[m].node];
        bool reads = false;
        for (int j = 0; j < x->nin; j++) reads |= x->in[j] == v;
        if (!reads) continue;
        if (x->op == IR_OP_matmul && (st->kind == STEP_KIND_OP || (st->kind == STEP_KIND_GEMM && m == st->first))) {
            if (!low_gemm(g, x)) return false;
            continue;
        }
        bool kernel = st->kind == STEP_KIND_EW || (st->kind == STEP_KIND_GEMM && m > st->first) || /* an epilogue */
                      st->kind == STEP_KIND_ROW || (st->kind == STEP_KIND_OP && x->op == IR_OP_cast);
        if (!kernel || !same_dims(t, st->kind == STEP_KIND_OP ? &x->type : &st->space)) return false;
    }
    return true;
}

/* Whether some f16/bf16 library GEMM reads or writes v. */
static bool feeds_gemm(const ir_graph *g, const schedule *s, int v, const int *readers, const int *first_reader)
{
    const ir_node *n = g->nodes[v];
    if (low_gemm(g, n)) return true;
    const sched_step *st = &s->steps[s->step_of[v]];
    if (st->kind == STEP_KIND_GEMM && low_gemm(g, g->nodes[s->members[st->first].node])) return true; /* its epilogue */
    for (int r = first_reader[v]; r < first_reader[v + 1]; r++)
        if (low_gemm(g, g->nodes[readers[r]])) return true;
    return false;
}

alloy_status sched_pad(const ir_graph *g, schedule *s, char *err, size_t errlen)
{
    int nn = g->nnodes;
    al_free(s->row_stride), s->row_stride = NULL;
    int64_t *ld = al_calloc((size_t)nn + 1, sizeof *ld);
    int *owner = al_malloc(sizeof(int) * ((size_t)nn + 1)), *first = al_calloc((size_t)nn + 2, sizeof(int));
    int64_t *off = al_malloc(sizeof(int64_t) * ((size_t)nn + 1));
    int nedges = 0;
    for (int i = 0; i < nn; i++) nedges += g->nodes[i]->nin;
    int *readers = al_malloc(sizeof(int) * ((size_t)nedges + 1)), *fill = al_calloc((size_t)nn + 1, sizeof(int));
    if (!ld || !owner || !first || !off || !readers || !fill) {
        al_free(ld), al_free(owner), al_free(first), al_free(off), al_free(readers), al_free(fill);
        al_fmt(err, errlen, "out of memory choosing the padded row strides of %d nodes", nn);
        return ALLOY_ERR_OOM;
    }
    /* readers of each node, grouped by node (counting sort) */
    for (int i = 0; i < nn; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++) first[g->nodes[i]->in[j] + 1]++;
    for (int i = 0; i < nn; i++) first[i + 1] += first[i];
    for (int i = 0; i < nn; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++) {
            int o = g->nodes[i]->in[j];
            readers[first[o] + fill[o]++] = i;
        }
    sched_views(g, s, owner, off);
    bool any = false;
    for (int v = 0; v < nn; v++) {
        const ir_node *n = g->nodes[v];
        int k = s->step_of[v];
        if (k < 0 || n->type.rank != 2 || ir_numel(&n->type) == 0) continue;
        int64_t c = n->type.dims[1];
        const sched_step *st = &s->steps[k];
        /* a gemm step's matmul that is not stored: its f32 product in the scratch, read by its epilogue */
        bool product = st->kind == STEP_KIND_GEMM && s->members[st->first].node == v && !sched_stored(s, v);
        if (!product && !sched_stored(s, v)) continue;
        size_t size = product ? sizeof(float) : alloy_dtype_size(n->type.dtype);
        if ((int64_t)size * c % 16 == 0) continue; /* aligned already */
        if (c < SCHED_PAD_MIN_COLS) continue;      /* a narrow GEMM: padding would multiply its bytes for nothing */
        if (owner[v] >= 0 || (s->members[s->member_of[v]].flags & MEMBER_VIEW)) continue;
        bool ok = feeds_gemm(g, s, v, readers, first) && producer_takes_stride(g, s, v);
        /* kept: fetched values are copied out row by row; an update's value is copied whole into its state */
        for (int i = 0; ok && i < g->nupdates; i++) ok = g->updates[i].node != v;
        for (int r = first[v]; ok && r < first[v + 1]; r++) {
            int x = readers[r];
            if (owner[x] == v) ok = false; /* a view of v reads its bytes as dense */
            else if (s->step_of[x] != k) ok = s->step_of[x] >= 0 && consumer_takes_stride(g, s, s->step_of[x], v);
        }
        if (!ok) continue;
        ld[v] = (c + SCHED_PAD_ELEMS - 1) / SCHED_PAD_ELEMS * SCHED_PAD_ELEMS;
        any = true;
    }
    al_free(owner), al_free(first), al_free(off), al_free(readers), al_free(fill);
    if (any) s->row_stride = ld;
    else al_free(ld);
    return ALLOY_OK;
}

int64_t sched_ld(const ir_graph *g, const schedule *s, int node)
{
    if (s && s->row_stride && s->row_stride[node] > 0) return s->row_stride[node];
    const ir_type *t = &g->nodes[node]->type;
    return t->rank ? t->dims[t->rank - 1] : 1;
}


int64_t sched_padded_numel(const ir_graph *g, const schedule *s, int node)
{
    const ir_type *t = &g->nodes[node]->type;
    if (!sched_padded(s, node)) return ir_numel(t);
    int64_t c = t->dims[t->rank - 1];
    return c ? ir_numel(t) / c * s->row_stride[node] : 0;
}
