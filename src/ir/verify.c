/* verify.c - checks every IR invariant of a graph and records the first violation. */
#include <string.h>

#include "ir/groups.h"
#include "ir/ir.h"

/* "%3 (matmul)" or "'h' (relu)" for messages about node n. */
static const char *who(const ir_node *n, char *buf, size_t len)
{
    char id[32];
    const char *label = ir_node_label(n, id, sizeof id);
    al_fmt(buf, len, "%s%s%s (%s)", n->name ? "'" : "", label, n->name ? "'" : "",
           n->op < IR_OP_COUNT ? ir_ops[n->op].name : "?");
    return buf;
}

static bool type_valid(const ir_type *t)
{
    if ((unsigned)t->dtype >= ALLOY_DTYPE_COUNT || t->rank < 0 || t->rank > ALLOY_MAX_RANK) return false;
    return al_numel(t->rank, t->dims) >= 0;
}

static alloy_status bad(ir_graph *g, const ir_node *n, const char *what, const char *detail)
{
    char w[160];
    return ir_error(g, ALLOY_ERR_VERIFY, "%s: %s%s", who(n, w, sizeof w), what, detail);
}

static alloy_status check_attrs(ir_graph *g, const ir_node *n)
{
    const ir_op_info *info = &ir_ops[n->op];
    char msg[160];
    if (n->nattrs < 0 || (n->nattrs > 0 && !n->attrs)) return bad(g, n, "corrupt attribute array", "");
    for (int i = 0; i < n->nattrs; i++) {
        const ir_attr *a = &n->attrs[i];
        if (!a->name) return bad(g, n, "an attribute has no name", "");
        const ir_attr_spec *spec = info->attrs;
        while (spec->name && strcmp(spec->name, a->name) != 0) spec++;
        if (!spec->name) {
            al_fmt(msg, sizeof msg, "unknown attribute '%s'", a->name);
            return bad(g, n, msg, "");
        }
        if (a->kind != spec->kind) {
            static const char *kinds[] = {"int", "bool", "float", "ints", "floats", "str"};
            al_fmt(msg, sizeof msg, "attribute '%s' has kind %s, the schema wants %s", a->name,
                   (unsigned)a->kind < 6 ? kinds[a->kind] : "?", kinds[spec->kind]);
            return bad(g, n, msg, "");
        }
        bool list = a->kind == IR_ATTR_INTS || a->kind == IR_ATTR_FLOATS;
        const void *elems = a->kind == IR_ATTR_INTS ? (const void *)a->ints : (const void *)a->floats;
        if ((list && (a->n < 0 || (a->n > 0 && !elems))) || (a->kind == IR_ATTR_STR && !a->s)) {
            al_fmt(msg, sizeof msg, "attribute '%s' has a corrupt value", a->name);
            return bad(g, n, msg, "");
        }
        for (int j = 0; j < i; j++) {
            if (n->attrs[j].name && strcmp(n->attrs[j].name, a->name) == 0) {
                al_fmt(msg, sizeof msg, "attribute '%s' appears twice", a->name);
                return bad(g, n, msg, "");
            }
        }
    }
    for (const ir_attr_spec *spec = info->attrs; spec->name; spec++) {
        if (spec->required && !ir_attr_find(n, spec->name)) {
            al_fmt(msg, sizeof msg, "required attribute '%s' is missing", spec->name);
            return bad(g, n, msg, "");
        }
    }
    return ALLOY_OK;
}

/* Re-runs the op's type rule and compares with the stored type. */
static alloy_status check_type(ir_graph *g, const ir_node *n)
{
    char msg[320], why[256] = "";
    if (!type_valid(&n->type)) return bad(g, n, "stored type is invalid (bad dtype, rank or dims)", "");
    const ir_type *small[16];
    const ir_type **tin = n->nin <= 16 ? small : al_malloc(sizeof *tin * (size_t)n->nin);
    if (!tin) return ir_error(g, ALLOY_ERR_OOM, "out of memory verifying the graph");
    for (int i = 0; i < n->nin; i++) tin[i] = &g->nodes[n->in[i]]->type;
    ir_type t = n->type;
    alloy_status st = ir_ops[n->op].type(n, tin, &t, why, sizeof why);
    if (tin != small) al_free(tin);
    if (st) {
        al_fmt(msg, sizeof msg, "type rule fails: %s", why);
        return bad(g, n, msg, "");
    }
    if (!type_valid(&t) || !ir_type_eq(&t, &n->type)) {
        char want[128], got[128];
        ir_fmt_type(got, sizeof got, &n->type);
        ir_fmt_type(want, sizeof want, &t);
        al_fmt(msg, sizeof msg, "stored type %s but the type rule gives %s", got, want);
        return bad(g, n, msg, "");
    }
    return ALLOY_OK;
}

static alloy_status check_node(ir_graph *g, int i)
{
    const ir_node *n = g->nodes[i];
    char msg[160];
    if (!n) return ir_error(g, ALLOY_ERR_VERIFY, "node %d is missing", i);
    if (n->id != i) return ir_error(g, ALLOY_ERR_VERIFY, "node at index %d has id %d", i, n->id);
    if (n->op >= IR_OP_COUNT) return ir_error(g, ALLOY_ERR_VERIFY, "node %%%d has unknown op %d", i, n->op);
    const ir_op_info *info = &ir_ops[n->op];
    if (n->nin < 0 || (n->nin > 0 && !n->in)) return bad(g, n, "corrupt operand array", "");
    if (n->nin < info->min_in || (info->max_in >= 0 && n->nin > info->max_in)) {
        char range[48];
        if (info->max_in < 0) al_fmt(range, sizeof range, "at least %d", info->min_in);
        else if (info->max_in == info->min_in) al_fmt(range, sizeof range, "%d", info->min_in);
        else al_fmt(range, sizeof range, "%d to %d", info->min_in, info->max_in);
        al_fmt(msg, sizeof msg, "has %d operands; %s takes %s", n->nin, info->name, range);
        return bad(g, n, msg, "");
    }
    for (int j = 0; j < n->nin; j++) {
        if (n->in[j] < 0 || n->in[j] >= i) {
            al_fmt(msg, sizeof msg, "operand %d refers to node %d, which does not come before it", j,
                   n->in[j]);
            return bad(g, n, msg, "");
        }
    }
    if (n->amp > AMP_CLEAR) return bad(g, n, "unknown amp class", "");
    if (n->group < -1) return bad(g, n, "negative fusion group", "");
    if (n->name && !n->name[0]) return bad(g, n, "empty name", "");
    if (!n->name && (n->op == IR_OP_param || n->op == IR_OP_state))
        return bad(g, n, "has no name: a param or state is saved, restored and looked up by its name",
                   " (write it as %name = ..., not %number)");
    alloy_status st = check_attrs(g, n);
    return st ? st : check_type(g, n);
}

/* The name index must be a sane open-addressing table over the named nodes. */
static alloy_status check_names(ir_graph *g)
{
    int named = 0, filled = 0;
    if (g->name_cap < 0 || (g->name_cap & (g->name_cap - 1)) || (g->name_cap > 0 && !g->name_slots))
        return ir_error(g, ALLOY_ERR_VERIFY, "name index is corrupt (capacity %d)", g->name_cap);
    for (int i = 0; i < g->name_cap; i++) {
        int id = g->name_slots[i].id;
        if (id < 0) continue;
        filled++;
        if (id >= g->nnodes || !g->nodes[id]->name)
            return ir_error(g, ALLOY_ERR_VERIFY, "name index slot %d refers to node %d, which has no name", i,
                            id);
    }
    if (filled != g->name_count || (g->name_cap > 0 && filled >= g->name_cap))
        return ir_error(g, ALLOY_ERR_VERIFY, "name index holds %d names but counts %d", filled, g->name_count);
    for (int i = 0; i < g->nnodes; i++) {
        const ir_node *n = g->nodes[i];
        if (!n->name) continue;
        named++;
        int found = ir_find_name(g, n->name);
        char w[160];
        if (found < 0)
            return ir_error(g, ALLOY_ERR_VERIFY, "%s: name is missing from the name index", who(n, w, sizeof w));
        if (found != i)
            return ir_error(g, ALLOY_ERR_VERIFY, "%s: name '%s' is also used by node %%%d", who(n, w, sizeof w),
                            n->name, found);
    }
    if (named != filled)
        return ir_error(g, ALLOY_ERR_VERIFY, "name index holds %d names for %d named nodes", filled, named);
    return ALLOY_OK;
}

static alloy_status check_outputs(ir_graph *g)
{
    if (g->noutputs < 0 || (g->noutputs > 0 && !g->outputs))
        return ir_error(g, ALLOY_ERR_VERIFY, "output list is corrupt");
    for (int i = 0; i < g->noutputs; i++) {
        const ir_output *o = &g->outputs[i];
        if (!o->name || !o->name[0]) return ir_error(g, ALLOY_ERR_VERIFY, "output %d has no name", i);
        if (o->node < 0 || o->node >= g->nnodes)
            return ir_error(g, ALLOY_ERR_VERIFY, "output '%s' refers to node %d, which does not exist", o->name,
                            o->node);
        int found = ir_find_output(g, o->name); /* the index finds the first of a name */
        if (found < 0)
            return ir_error(g, ALLOY_ERR_VERIFY, "output '%s' is missing from the output index", o->name);
        if (found != i) return ir_error(g, ALLOY_ERR_VERIFY, "output '%s' is declared twice", o->name);
    }
    for (int i = 0; i < g->nupdates; i++) {
        const ir_output *u = &g->updates[i];
        if (!u->name || u->node < 0 || u->node >= g->nnodes)
            return ir_error(g, ALLOY_ERR_VERIFY, "update %d is corrupt", i);
        int target = ir_find_name(g, u->name);
        if (target < 0 || (g->nodes[target]->op != IR_OP_param && g->nodes[target]->op != IR_OP_state))
            return ir_error(g, ALLOY_ERR_VERIFY, "update of '%s': no param or state of that name", u->name);
        if (!ir_type_eq(&g->nodes[target]->type, &g->nodes[u->node]->type)) {
            char a[128], b[128];
            ir_fmt_type(a, sizeof a, &g->nodes[target]->type);
            ir_fmt_type(b, sizeof b, &g->nodes[u->node]->type);
            return ir_error(g, ALLOY_ERR_VERIFY, "update of '%s' (%s) with a value of type %s", u->name, a, b);
        }
        int found = ir_find_update(g, u->name);
        if (found < 0)
            return ir_error(g, ALLOY_ERR_VERIFY, "update of '%s' is missing from the update index", u->name);
        if (found != i) return ir_error(g, ALLOY_ERR_VERIFY, "state '%s' is updated twice", u->name);
    }
    if (g->loss == -1) return ALLOY_OK;
    if (g->loss < 0 || g->loss >= g->nnodes)
        return ir_error(g, ALLOY_ERR_VERIFY, "loss refers to node %d, which does not exist", g->loss);
    const ir_node *n = g->nodes[g->loss];
    if (n->type.rank != 0 || !ir_is_float(n->type.dtype)) {
        char t[128];
        ir_fmt_type(t, sizeof t, &n->type);
        return bad(g, n, "is the loss but is not a floating-point scalar: ", t);
    }
    return ALLOY_OK;
}

/* Checks ids, operand order, arity, attribute schemas, types (by re-running
 * each type rule), the name index, outputs and loss; records the first
 * violation on g as ALLOY_ERR_VERIFY and returns it (ALLOY_OK if none). */
alloy_status ir_verify(ir_graph *g)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (g->nnodes < 0 || g->nnodes > g->cap || (g->nnodes > 0 && !g->nodes))
        return ir_error(g, ALLOY_ERR_VERIFY, "node array is corrupt (%d nodes, capacity %d)", g->nnodes, g->cap);
    for (int i = 0; i < g->nnodes; i++) {
        alloy_status st = check_node(g, i);
        if (st) return st;
    }
    alloy_status st = check_names(g);
    if (!st) st = check_outputs(g);
    return st ? st : ir_check_groups(g);
}
