/* groups.c - fusion group kinds, membership rules and the printed group table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/groups.h"

const char *ir_group_kind_name(ir_group_kind k)
{
    switch (k) {
    case IR_GROUP_EW: return "ew";
    case IR_GROUP_ROW: return "row";
    case IR_GROUP_GEMM: return "gemm";
    case IR_GROUP_MULTI: return "multi";
    }
    return "?";
}

static bool narrow_float(alloy_dtype dt) { return dt == ALLOY_F32 || dt == ALLOY_F16 || dt == ALLOY_BF16; }

bool ir_fuse_elementwise(const ir_graph *g, const ir_node *n)
{
    if (ir_ops[n->op].elementwise) return n->nin >= 1 && n->nin <= 3;
    return n->op == IR_OP_cast && n->nin == 1 && narrow_float(n->type.dtype) &&
           narrow_float(g->nodes[n->in[0]]->type.dtype);
}

bool ir_row_operand(const ir_node *n, int j)
{
    const ir_row_program *p = ir_ops[n->op].row;
    if (!p) return j == 0;
    char role = j < (int)strlen(p->roles) ? p->roles[j] : 'r';
    return role == 'r' || role == 'i';
}

bool ir_fuse_row_op(const ir_graph *g, const ir_node *n)
{
    const ir_row_program *p = ir_ops[n->op].row;
    if (!p) return false;
    const ir_type *t = &g->nodes[n->in[0]]->type;
    int axis;
    if (ir_attr_schema(n->op, "axis") &&
        (!ir_norm_axis(ir_attr_i(n, "axis"), t->rank, &axis) || axis != t->rank - 1))
        return false; /* row groups run along the last axis */
    if (t->rank < 1 || t->dims[t->rank - 1] < 1) return false;
    if (ir_row_summarize(p).by_position && t->rank < 2) return false;
    for (int j = 0; j < n->nin; j++)
        if (p->roles[j] != 'i' && !narrow_float(g->nodes[n->in[j]]->type.dtype)) return false;
    return narrow_float(n->type.dtype);
}

bool ir_fuse_colsum(const ir_graph *g, const ir_node *n)
{
    if (n->op != IR_OP_reduce_sum || n->nin != 1 || n->type.dtype != ALLOY_F32) return false;
    const ir_type *t = &g->nodes[n->in[0]]->type;
    if (t->dtype != ALLOY_F32 || t->rank < 2 || t->dims[t->rank - 1] < 1) return false;
    /* the unfused kernel copies a single row (a sum 0 + -0 would give +0) */
    if (ir_numel(t) / t->dims[t->rank - 1] < 2) return false;
    int naxes;
    const int64_t *axes = ir_attr_ints(n, "axes", &naxes);
    bool reduced[ALLOY_MAX_RANK] = {false};
    if (!axes || naxes != t->rank - 1) return false;
    for (int i = 0; i < naxes; i++) {
        int ax;
        if (!ir_norm_axis(axes[i], t->rank, &ax) || ax == t->rank - 1 || reduced[ax]) return false;
        reduced[ax] = true;
    }
    return true;
}

const ir_type *ir_fuse_shape(const ir_graph *g, const ir_node *n)
{
    const ir_row_program *p = ir_ops[n->op].row;
    if (!p) return ir_fuse_colsum(g, n) ? &g->nodes[n->in[0]]->type : &n->type;
    ir_row_summary s = ir_row_summarize(p);
    return s.per_row_result || s.per_row_value ? &g->nodes[n->in[0]]->type : &n->type;
}

bool ir_row_keeps(const ir_node *n)
{
    return ir_ops[n->op].row && ir_row_summarize(ir_ops[n->op].row).per_row_value;
}

bool ir_fuse_wide(const ir_graph *g, const ir_node *n)
{
    if (ir_fuse_row_op(g, n)) return false;
    for (int j = 0; j < n->nin; j++) {
        alloy_dtype dt = g->nodes[n->in[j]]->type.dtype;
        if (dt == ALLOY_F64 || ir_is_int(dt)) return true;
    }
    return false;
}

bool ir_gemm_head(const ir_node *n)
{
    return n->op == IR_OP_matmul || n->op == IR_OP_conv1d || n->op == IR_OP_conv2d;
}

bool ir_same_dims(const ir_type *a, const ir_type *b)
{
    return a->rank == b->rank && memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank) == 0;
}

bool ir_reads_rows(const ir_graph *g, const ir_node *r, int p)
{
    bool row = ir_fuse_row_op(g, r), ew = !row && ir_fuse_elementwise(g, r) && !ir_fuse_wide(g, r);
    if (!row && !ew) return false;
    for (int j = 0; j < r->nin; j++)
        if (r->in[j] == p && (row ? ir_row_operand(r, j) : ir_same_dims(&g->nodes[p]->type, &r->type))) return true;
    return false;
}

ir_group_kind ir_group_kind_of(const ir_graph *g, const int *members, int n)
{
    bool row = false, multi = false;
    const ir_type *first = n > 0 ? ir_fuse_shape(g, g->nodes[members[0]]) : NULL;
    for (int k = 0; k < n; k++) {
        const ir_node *m = g->nodes[members[k]];
        if (ir_gemm_head(m)) return IR_GROUP_GEMM;
        if (m->op == IR_OP_found_inf) multi = true;
        else if (!ir_same_dims(ir_fuse_shape(g, m), first)) multi = true;
        if (ir_fuse_row_op(g, m)) row = true;
    }
    return multi ? IR_GROUP_MULTI : row ? IR_GROUP_ROW : IR_GROUP_EW;
}

/* ---- the group table ---- */

typedef struct gtab {
    const ir_graph *g;
    FILE *out;
    int *uses_in;  /* node -> readers inside its own group */
    uint8_t *out_of; /* node -> read outside its group, or an output/update/loss */
} gtab;

static void print_expr(const gtab *t, int id, int gk, int depth)
{
    const ir_node *n = t->g->nodes[id];
    if (n->group != gk || (depth > 0 && (t->uses_in[id] > 1 || t->out_of[id])) || depth > 24) {
        fprintf(t->out, "%%%d", id);
        return;
    }
    fputs(ir_ops[n->op].name, t->out);
    if (n->op == IR_OP_cast) fprintf(t->out, "<%s>", alloy_dtype_name(n->type.dtype));
    fputc('(', t->out);
    for (int j = 0; j < n->nin; j++) {
        if (j) fputs(", ", t->out);
        print_expr(t, n->in[j], gk, depth + 1);
    }
    fputc(')', t->out);
}

void ir_print_groups(const ir_graph *g, FILE *out)
{
    int nn = g->nnodes;
    ir_groups gs;
    if (ir_groups_collect(g, &gs)) return;
    gtab t = {.g = g, .out = out, .uses_in = al_calloc((size_t)nn + 1, sizeof(int)), .out_of = al_calloc((size_t)nn + 1, 1)};
    int *ext = al_malloc(sizeof(int) * ((size_t)nn + 1));
    if (!t.uses_in || !t.out_of || !ext) goto done;
    for (int i = 0; i < g->noutputs; i++) t.out_of[g->outputs[i].node] = 1;
    for (int i = 0; i < g->nupdates; i++) t.out_of[g->updates[i].node] = 1;
    if (g->loss >= 0) t.out_of[g->loss] = 1;
    for (int i = 0; i < nn; i++) {
        const ir_node *n = g->nodes[i];
        for (int j = 0; j < n->nin; j++) {
            const ir_node *o = g->nodes[n->in[j]];
            if (o->group < 0) continue;
            if (o->group == n->group) t.uses_in[o->id]++;
            else t.out_of[o->id] = 1;
        }
    }
    for (int k = 0; k < gs.ngroups; k++) {
        int nm = gs.start[k + 1] - gs.start[k], ne = 0, gid = gs.id[k];
        const int *members = &gs.member[gs.start[k]];
        ir_group_kind kind = ir_group_kind_of(g, members, nm);
        char ty[96];
        const ir_node *shape_of = g->nodes[members[0]];
        for (int m = 0; m < nm && kind == IR_GROUP_ROW; m++)
            if (ir_fuse_row_op(g, g->nodes[members[m]])) shape_of = g->nodes[g->nodes[members[m]]->in[0]];
        if (kind == IR_GROUP_GEMM) shape_of = g->nodes[members[nm - 1]];
        ir_fmt_type(ty, sizeof ty, kind == IR_GROUP_ROW ? &shape_of->type : ir_fuse_shape(g, shape_of));
        fprintf(out, "# group %d %s %s, %d members: in", gid, ir_group_kind_name(kind),
                kind == IR_GROUP_MULTI ? "(shapes vary)" : ty, nm);
        for (int m = 0; m < nm; m++) {
            const ir_node *n = g->nodes[members[m]];
            for (int j = 0; j < n->nin; j++) {
                int o = n->in[j];
                if (g->nodes[o]->group == gid) continue;
                bool seen = false;
                for (int e = 0; e < ne && !seen; e++) seen = ext[e] == o;
                if (!seen) ext[ne++] = o;
            }
        }
        for (int e = 0; e < ne; e++) fprintf(out, " %%%d", ext[e]);
        fputs("; out", out);
        for (int m = 0; m < nm; m++)
            if (t.out_of[members[m]]) fprintf(out, " %%%d", members[m]);
        fputc('\n', out);
        for (int m = 0; m < nm; m++) {
            int id = members[m];
            if (!t.out_of[id] && t.uses_in[id] <= 1) continue;
            fprintf(out, "#   %%%d = ", id);
            print_expr(&t, id, gid, 0);
            fputc('\n', out);
        }
    }
done:
    ir_groups_free(&gs);
    al_free(t.uses_in), al_free(t.out_of), al_free(ext);
}

/* ---- legality (ir_verify) ---- */

static int find_root(int *parent, int i)
{
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
}

/* The kind rules of a group, members[0..n) in id order; NULL or why not.
 * member_at[id] is node id's index in its group and in_group[id] its group
 * (both per node), so joining chains costs a lookup per operand. */
static const char *kind_violation(const ir_graph *g, const int *members, int n, ir_group_kind kind, int *parent,
                                  const int *member_at, const int *in_group, int *bad)
{
    const ir_node *first = g->nodes[members[0]];
    int colsums = 0;
    for (int m = 0; m < n; m++) {
        const ir_node *x = g->nodes[members[m]];
        *bad = x->id;
        bool ew = ir_fuse_elementwise(g, x);
        switch (kind) {
        case IR_GROUP_EW:
            if (!ew) return "is not elementwise, yet its group has no row op, matmul, convolution or found_inf";
            if (!ir_same_dims(&x->type, &first->type)) return "has another shape than the group's first member";
            if (ir_fuse_wide(g, x) != ir_fuse_wide(g, first)) return "computes in another precision than the group";
            break;
        case IR_GROUP_ROW:
            if (ir_fuse_colsum(g, x)) {
                if (++colsums > IR_MAX_COLSUMS)
                    return "is a column sum beyond the most a row group takes (IR_MAX_COLSUMS)";
            } else if (!ew && !ir_fuse_row_op(g, x)) {
                return "is neither elementwise, a last-axis row op on f32/f16/bf16 nor an f32 column sum";
            }
            for (int j = 0; j < x->nin; j++) /* a column sum's result exists once every row is done */
                if (in_group[x->in[j]] == in_group[x->id] && ir_fuse_colsum(g, g->nodes[x->in[j]]))
                    return "reads a column sum of its own row group";
            if (!ir_same_dims(ir_fuse_shape(g, x), ir_fuse_shape(g, first)))
                return "iterates over another shape than the row group";
            if (ir_fuse_wide(g, x)) return "computes in f64, which row groups do not";
            for (int j = 0; j < x->nin; j++)
                if (in_group[x->in[j]] == in_group[x->id] && ir_row_keeps(g->nodes[x->in[j]]))
                    return "reads a per-row statistic of its own group (kept values are read by later steps only)";
            break;
        case IR_GROUP_GEMM:
            if ((m == 0) != ir_gemm_head(x))
                return m == 0 ? "is first in a gemm group but not its matmul or convolution"
                              : "is a second matmul or convolution in a gemm group";
            if (m > 0 && !ew) return "is not elementwise, so no GEMM epilogue computes it";
            if (m > 0 && !ir_same_dims(&x->type, &first->type))
                return "has another shape than the matmul or convolution it follows";
            if (m > 1 && ir_fuse_wide(g, x) != ir_fuse_wide(g, g->nodes[members[1]]))
                return "computes in another precision than the epilogue";
            break;
        case IR_GROUP_MULTI:
            if (x->op == IR_OP_found_inf) {
                if (m != n - 1) return "is a found_inf that is not the last member of its multi group";
                break;
            }
            if (x->op == IR_OP_sum_squares) { /* the gradient norm over found_inf's operands */
                if (m != n - 2 || g->nodes[members[n - 1]]->op != IR_OP_found_inf)
                    return "is a sum_squares that is not right before its multi group's found_inf";
                break;
            }
            if (!ew) return "is not elementwise, which multi groups need";
            parent[m] = m;
            for (int j = 0; j < x->nin; j++) {
                int o = x->in[j]; /* an operand in the group is an earlier member */
                if (in_group[o] != in_group[x->id]) continue;
                int a = find_root(parent, member_at[o]);
                if (!ir_same_dims(&g->nodes[members[a]]->type, &x->type))
                    return "has another shape than the chain it joins";
                if (ir_fuse_wide(g, g->nodes[members[a]]) != ir_fuse_wide(g, x))
                    return "computes in another precision than the chain it joins";
                parent[a] = m;
            }
            break;
        }
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

alloy_status ir_groups_collect(const ir_graph *g, ir_groups *out)
{
    memset(out, 0, sizeof *out);
    int nn = g->nnodes, nm = 0;
    for (int i = 0; i < nn; i++) nm += g->nodes[i]->group >= 0;
    uint64_t *keys = al_malloc(sizeof(uint64_t) * (size_t)(nm + 1));
    out->id = al_malloc(sizeof(int) * (size_t)(nm + 1));
    out->start = al_malloc(sizeof(int) * (size_t)(nm + 2));
    out->member = al_malloc(sizeof(int) * (size_t)(nm + 1));
    out->group_of = al_malloc(sizeof(int) * (size_t)(nn + 1));
    if (!keys || !out->id || !out->start || !out->member || !out->group_of) {
        al_free(keys);
        ir_groups_free(out);
        return ALLOY_ERR_OOM;
    }
    nm = 0;
    for (int i = 0; i < nn; i++) {
        out->group_of[i] = -1;
        if (g->nodes[i]->group >= 0) keys[nm++] = (uint64_t)(uint32_t)g->nodes[i]->group << 32 | (uint32_t)i;
    }
    qsort(keys, (size_t)nm, sizeof *keys, cmp_u64); /* already sorted by id within a group */
    int k = -1;
    for (int m = 0; m < nm; m++) {
        int gid = (int)(keys[m] >> 32), node = (int)(keys[m] & 0xffffffffu);
        if (k < 0 || out->id[k] != gid) {
            out->id[++k] = gid;
            out->start[k] = m;
        }
        out->member[m] = node;
        out->group_of[node] = k;
    }
    out->ngroups = k + 1;
    out->start[k + 1] = nm;
    al_free(keys);
    return ALLOY_OK;
}

void ir_groups_free(ir_groups *gs)
{
    al_free(gs->id), al_free(gs->start), al_free(gs->member), al_free(gs->group_of);
    memset(gs, 0, sizeof *gs);
}

int ir_group_size(const ir_groups *gs, int i)
{
    int k = gs->group_of[i];
    return k >= 0 ? gs->start[k + 1] - gs->start[k] : 1;
}

alloy_status ir_check_groups(ir_graph *g)
{
    int nn = g->nnodes;
    char a[64], b[64];
    bool any = false;
    for (int i = 0; i < nn && !any; i++) any = g->nodes[i]->group >= 0;
    if (!any) return ALLOY_OK;
    ir_groups gs;
    int *parent = al_malloc(sizeof(int) * (size_t)nn), *member_at = al_malloc(sizeof(int) * (size_t)nn);
    if (!parent || !member_at || ir_groups_collect(g, &gs)) {
        al_free(parent), al_free(member_at);
        return ir_error(g, ALLOY_ERR_OOM, "out of memory checking the fusion groups of %d nodes", nn);
    }
    for (int k = 0; k < gs.ngroups; k++)
        for (int m = gs.start[k]; m < gs.start[k + 1]; m++) member_at[gs.member[m]] = m - gs.start[k];
    alloy_status st = ALLOY_OK;
    for (int k = 0; k < gs.ngroups && !st; k++) {
        int n = gs.start[k + 1] - gs.start[k];
        if (n < 2) continue;
        const int *mem = &gs.member[gs.start[k]];
        ir_group_kind kind = ir_group_kind_of(g, mem, n);
        int bad = mem[0];
        const char *why = kind_violation(g, mem, n, kind, parent, member_at, gs.group_of, &bad);
        if (why)
            st = ir_error(g, ALLOY_ERR_VERIFY, "fusion group %d (%s): %s %s %s", gs.id[k], ir_group_kind_name(kind),
                          ir_ops[g->nodes[bad]->op].name, ir_node_label(g->nodes[bad], a, sizeof a), why);
    }
    /* a node's position: its group's last member when the group has two or more */
#define POS(i) (ir_group_size(&gs, i) > 1 ? gs.member[gs.start[gs.group_of[i] + 1] - 1] : (i))
    for (int i = 0; i < nn && !st; i++) {
        const ir_node *n = g->nodes[i];
        for (int j = 0; j < n->nin && !st; j++) {
            const ir_node *o = g->nodes[n->in[j]];
            if (gs.group_of[i] >= 0 && gs.group_of[o->id] == gs.group_of[i]) continue;
            int pi = POS(i), po = POS(o->id);
            if (po >= pi)
                st = ir_error(g, ALLOY_ERR_VERIFY,
                              "fusion group %d cannot run at its last member: %s %s (run at %%%d) reads %s %s "
                              "(run at %%%d)",
                              po == o->id ? n->group : o->group, ir_ops[n->op].name, ir_node_label(n, a, sizeof a),
                              pi, ir_ops[o->op].name, ir_node_label(o, b, sizeof b), po);
        }
    }
#undef POS
    ir_groups_free(&gs);
    al_free(parent), al_free(member_at);
    return st;
}

bool ir_amp_checked(const ir_graph *g, const ir_node *n)
{
    alloy_dtype dt = n->type.dtype;
    if (dt != ALLOY_F32 && dt != ALLOY_F16 && dt != ALLOY_BF16 && dt != ALLOY_F64) return false;
    if (n->nin == 0 || n->op == IR_OP_causal_mask) return false;
    switch (n->op) { /* ops whose values are some of their operands': an inf there was flagged where it was made */
    case IR_OP_reshape: case IR_OP_transpose: case IR_OP_slice: case IR_OP_concat: case IR_OP_broadcast_to:
    case IR_OP_gather: case IR_OP_index_select: case IR_OP_embedding: case IR_OP_pad: case IR_OP_max_pool2d:
    case IR_OP_reduce_max:
        return false;
    default: break;
    }
    for (int j = 0; j < n->nin; j++) {
        const ir_node *c = g->nodes[n->in[j]];
        if (c->op != IR_OP_constant) continue;
        const ir_attr *v = ir_attr_find(c, "value");
        if (v && v->kind == IR_ATTR_FLOAT && !isfinite(v->f)) return false;
    }
    return true;
}
