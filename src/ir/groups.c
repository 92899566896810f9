/* groups.c - fusion group kinds, membership rules and the printed group table. */
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
    switch (n->op) {
    case IR_OP_softmax_grad:
    case IR_OP_log_softmax_grad:
    case IR_OP_layer_norm_grad: return j <= 1;
    case IR_OP_cross_entropy:
    case IR_OP_cross_entropy_grad: return j <= 1; /* logits and the per-row targets */
    default: return j == 0;
    }
}

bool ir_fuse_row_op(const ir_graph *g, const ir_node *n)
{
    switch (n->op) {
    case IR_OP_softmax:
    case IR_OP_log_softmax:
    case IR_OP_softmax_grad:
    case IR_OP_log_softmax_grad: {
        int axis;
        const ir_type *t = &g->nodes[n->in[0]]->type;
        if (!ir_norm_axis(ir_attr_int(n, "axis", -1), t->rank, &axis) || axis != t->rank - 1) return false;
        break;
    }
    case IR_OP_layer_norm:
    case IR_OP_layer_norm_grad:
    case IR_OP_cross_entropy:
    case IR_OP_cross_entropy_grad:
    case IR_OP_causal_mask: break;
    default: return false;
    }
    const ir_type *t = &g->nodes[n->in[0]]->type;
    if (t->rank < 1 || t->dims[t->rank - 1] < 1) return false;
    if (n->op == IR_OP_causal_mask && t->rank < 2) return false;
    for (int j = 0; j < n->nin; j++) {
        const ir_node *o = g->nodes[n->in[j]];
        bool targets = (n->op == IR_OP_cross_entropy || n->op == IR_OP_cross_entropy_grad) && j == 1;
        if (!targets && !narrow_float(o->type.dtype)) return false;
    }
    return narrow_float(n->type.dtype);
}

const ir_type *ir_fuse_shape(const ir_graph *g, const ir_node *n)
{
    return n->op == IR_OP_cross_entropy ? &g->nodes[n->in[0]]->type : &n->type;
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

static bool same_dims(const ir_type *a, const ir_type *b)
{
    return a->rank == b->rank && memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank) == 0;
}

ir_group_kind ir_group_kind_of(const ir_graph *g, const int *members, int n)
{
    bool row = false, multi = false;
    const ir_type *first = n > 0 ? ir_fuse_shape(g, g->nodes[members[0]]) : NULL;
    for (int k = 0; k < n; k++) {
        const ir_node *m = g->nodes[members[k]];
        if (m->op == IR_OP_matmul) return IR_GROUP_GEMM;
        if (m->op == IR_OP_found_inf) multi = true;
        else if (!same_dims(ir_fuse_shape(g, m), first)) multi = true;
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
    int ng = 0, nn = g->nnodes;
    for (int i = 0; i < nn; i++)
        if (g->nodes[i]->group + 1 > ng) ng = g->nodes[i]->group + 1;
    if (ng == 0 || ng > nn) return;
    gtab t = {.g = g, .out = out, .uses_in = al_calloc((size_t)nn, sizeof(int)), .out_of = al_calloc((size_t)nn, 1)};
    int *members = al_malloc(sizeof(int) * (size_t)nn);
    int *ext = al_malloc(sizeof(int) * (size_t)nn);
    if (!t.uses_in || !t.out_of || !members || !ext) goto done;
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
    for (int k = 0; k < ng; k++) {
        int nm = 0, ne = 0;
        for (int i = 0; i < nn; i++)
            if (g->nodes[i]->group == k) members[nm++] = i;
        if (nm == 0) continue;
        ir_group_kind kind = ir_group_kind_of(g, members, nm);
        char ty[96];
        const ir_node *shape_of = g->nodes[members[0]];
        for (int m = 0; m < nm && kind == IR_GROUP_ROW; m++)
            if (ir_fuse_row_op(g, g->nodes[members[m]])) shape_of = g->nodes[g->nodes[members[m]]->in[0]];
        if (kind == IR_GROUP_GEMM) shape_of = g->nodes[members[nm - 1]];
        ir_fmt_type(ty, sizeof ty, kind == IR_GROUP_ROW ? &shape_of->type : ir_fuse_shape(g, shape_of));
        fprintf(out, "# group %d %s %s, %d members: in", k, ir_group_kind_name(kind),
                kind == IR_GROUP_MULTI ? "(shapes vary)" : ty, nm);
        for (int m = 0; m < nm; m++) {
            const ir_node *n = g->nodes[members[m]];
            for (int j = 0; j < n->nin; j++) {
                int o = n->in[j];
                if (g->nodes[o]->group == k) continue;
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
            print_expr(&t, id, k, 0);
            fputc('\n', out);
        }
    }
done:
    al_free(t.uses_in), al_free(t.out_of), al_free(members), al_free(ext);
}
