/* graph.c - graphs and nodes: creation with type checking, names, attributes, clone. */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

ir_graph *ir_graph_new(const char *name)
{
    ir_graph *g = al_calloc(1, sizeof *g);
    if (!g) return NULL;
    g->loss = -1;
    g->name = al_arena_strdup(&g->arena, name ? name : "graph");
    if (!g->name) {
        ir_graph_free(g);
        return NULL;
    }
    return g;
}

void ir_graph_free(ir_graph *g)
{
    if (!g) return;
    al_free(g->nodes);
    al_free(g->outputs);
    al_free(g->updates);
    al_free(g->name_slots);
    al_free(g->out_slots);
    al_free(g->upd_slots);
    al_arena_free(&g->arena);
    al_free(g);
}

alloy_status ir_error(ir_graph *g, alloy_status status, const char *fmt, ...)
{
    if (g->status) return g->status;
    g->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->error, sizeof g->error, fmt, ap);
    va_end(ap);
    return status;
}

/* The name entry `id` of an index stands for. */
static const char *node_key(const void *g, int id) { return ((const ir_graph *)g)->nodes[id]->name; }
static const char *output_key(const void *g, int id) { return ((const ir_graph *)g)->outputs[id].name; }
static const char *update_key(const void *g, int id) { return ((const ir_graph *)g)->updates[id].name; }

int ir_find_name(const ir_graph *g, const char *name)
{
    return al_index_find(g->name_slots, g->name_cap, node_key, g, name);
}

static bool name_insert(ir_graph *g, int id)
{
    if (!al_index_add(&g->name_slots, &g->name_cap, g->name_count, node_key, g, id)) return false;
    g->name_count++;
    return true;
}

alloy_status ir_set_name(ir_graph *g, ir_node *n, const char *name)
{
    if (!name || !*name) return ir_error(g, ALLOY_ERR_INVALID, "empty node name");
    if (n->name && strcmp(n->name, name) == 0) return ALLOY_OK;
    if (n->name) return ir_error(g, ALLOY_ERR_INVALID, "node '%s' is already named", n->name);
    if (ir_find_name(g, name) >= 0)
        return ir_error(g, ALLOY_ERR_INVALID, "name '%s' is already used by another node", name);
    n->name = al_arena_strdup(&g->arena, name);
    if (!n->name || !name_insert(g, n->id)) {
        n->name = NULL;
        return ir_error(g, ALLOY_ERR_OOM, "out of memory naming node '%s'", name);
    }
    return ALLOY_OK;
}

static bool copy_attr(al_arena *a, ir_attr *dst, const ir_attr *src, const char *schema_name)
{
    *dst = *src;
    dst->name = schema_name;
    if (src->kind == IR_ATTR_STR) dst->s = al_arena_strdup(a, src->s ? src->s : "");
    if (src->kind == IR_ATTR_INTS)
        dst->ints = src->n ? al_arena_memdup(a, src->ints, sizeof(int64_t) * (size_t)src->n) : NULL;
    if (src->kind == IR_ATTR_FLOATS)
        dst->floats = src->n ? al_arena_memdup(a, src->floats, sizeof(double) * (size_t)src->n) : NULL;
    return !a->failed;
}

/* Describes "op(f32[2,3], f32[3,4]) 'name'" for error messages. */
static void describe(const ir_graph *g, int op, int nin, const int *in, const char *name,
                     char *buf, size_t len)
{
    size_t used;
    al_fmt(buf, len, "%s(", ir_ops[op].name);
    for (int i = 0; i < nin; i++) {
        char t[96] = "?";
        if (in[i] >= 0 && in[i] < g->nnodes) ir_fmt_type(t, sizeof t, &g->nodes[in[i]]->type);
        used = strlen(buf);
        al_fmt(buf + used, len - used, "%s%s", i ? ", " : "", t);
    }
    used = strlen(buf);
    if (name) al_fmt(buf + used, len - used, ") '%s'", name);
    else al_fmt(buf + used, len - used, ") at node %%%d", g->nnodes);
}

ir_node *ir_add_node(ir_graph *g, int op, int nin, const int *in, int nattrs,
                     const ir_attr *attrs, const ir_type *declared, const char *name)
{
    char what[512];
    if (op < 0 || op >= IR_OP_COUNT) {
        ir_error(g, ALLOY_ERR_INVALID, "unknown op number %d", op);
        return NULL;
    }
    const ir_op_info *info = &ir_ops[op];
    for (int i = 0; i < nin; i++) {
        if (in[i] < 0 || in[i] >= g->nnodes) {
            ir_error(g, ALLOY_ERR_INVALID, "%s: operand %d refers to node %d, which does not exist",
                     info->name, i, in[i]);
            return NULL;
        }
    }
    /* the description is formatted only when an error needs it */
#define WHAT (describe(g, op, nin, in, name, what, sizeof what), what)
    if (nin < info->min_in || (info->max_in >= 0 && nin > info->max_in)) {
        if (info->max_in < 0)
            ir_error(g, ALLOY_ERR_INVALID, "%s: takes at least %d operands, got %d", WHAT, info->min_in, nin);
        else if (info->min_in == info->max_in)
            ir_error(g, ALLOY_ERR_INVALID, "%s: takes %d operands, got %d", WHAT, info->min_in, nin);
        else
            ir_error(g, ALLOY_ERR_INVALID, "%s: takes %d to %d operands, got %d", WHAT,
                     info->min_in, info->max_in, nin);
        return NULL;
    }
    /* check attributes against the schema */
    for (int i = 0; i < nattrs; i++) {
        const ir_attr_spec *spec = info->attrs;
        while (spec->name && strcmp(spec->name, attrs[i].name) != 0) spec++;
        if (!spec->name) {
            ir_error(g, ALLOY_ERR_INVALID, "%s: unknown attribute '%s'", WHAT, attrs[i].name);
            return NULL;
        }
        bool kind_ok = spec->kind == attrs[i].kind ||
                       (spec->kind == IR_ATTR_FLOAT && attrs[i].kind == IR_ATTR_INT) ||
                       (spec->kind == IR_ATTR_FLOATS && attrs[i].kind == IR_ATTR_INTS);
        if (!kind_ok) {
            ir_error(g, ALLOY_ERR_INVALID, "%s: attribute '%s' has the wrong kind", WHAT, attrs[i].name);
            return NULL;
        }
        for (int j = 0; j < i; j++) {
            if (strcmp(attrs[j].name, attrs[i].name) == 0) {
                ir_error(g, ALLOY_ERR_INVALID, "%s: attribute '%s' given twice", WHAT, attrs[i].name);
                return NULL;
            }
        }
    }
    for (const ir_attr_spec *spec = info->attrs; spec->name; spec++) {
        if (!spec->required) continue;
        int j = 0;
        while (j < nattrs && strcmp(attrs[j].name, spec->name) != 0) j++;
        if (j == nattrs) {
            ir_error(g, ALLOY_ERR_INVALID, "%s: missing attribute '%s'", WHAT, spec->name);
            return NULL;
        }
    }
    if (g->nnodes == g->cap) {
        int cap = g->cap ? g->cap * 2 : 64;
        ir_node **nodes = al_realloc(g->nodes, sizeof *nodes * (size_t)cap);
        if (!nodes) {
            ir_error(g, ALLOY_ERR_OOM, "out of memory adding %s", WHAT);
            return NULL;
        }
        g->nodes = nodes;
        g->cap = cap;
    }
    /* the attributes in schema order, each given one or its default */
    int nout = 0;
    for (const ir_attr_spec *spec = info->attrs; spec->name; spec++) nout++;
    ir_node *n = al_arena_alloc(&g->arena, sizeof *n);
    int *ins = nin ? al_arena_memdup(&g->arena, in, sizeof(int) * (size_t)nin) : NULL;
    ir_attr *as = nout ? al_arena_alloc(&g->arena, sizeof(ir_attr) * (size_t)nout) : NULL;
    if (!n || (nin && !ins) || (nout && !as)) {
        ir_error(g, ALLOY_ERR_OOM, "out of memory adding %s", WHAT);
        return NULL;
    }
    nout = 0;
    for (const ir_attr_spec *spec = info->attrs; spec->name; spec++) {
        int i = 0;
        while (i < nattrs && strcmp(attrs[i].name, spec->name) != 0) i++;
        ir_attr a;
        int64_t all_axes[ALLOY_MAX_RANK];
        if (i < nattrs) {
            a = attrs[i];
        } else if (!spec->has_default) {
            continue; /* optional with no default: an init's parameters */
        } else if (spec->kind == IR_ATTR_INTS) { /* every axis of the first operand */
            int rank = nin > 0 ? g->nodes[in[0]]->type.rank : 0;
            for (int d = 0; d < rank; d++) all_axes[d] = d;
            a = ir_a_ints(spec->name, rank, all_axes);
        } else {
            a = spec->kind == IR_ATTR_FLOAT ? ir_a_float(spec->name, spec->def)
                : spec->kind == IR_ATTR_BOOL ? ir_a_bool(spec->name, spec->def != 0)
                                             : ir_a_int(spec->name, (int64_t)spec->def);
        }
        if (spec->kind == IR_ATTR_FLOAT && a.kind == IR_ATTR_INT) {
            a.kind = IR_ATTR_FLOAT;
            a.f = (double)attrs[i].i;
        }
        if (spec->kind == IR_ATTR_FLOATS && a.kind == IR_ATTR_INTS) {
            double *f = al_arena_alloc(&g->arena, sizeof(double) * (size_t)(a.n ? a.n : 1));
            if (!f) {
                ir_error(g, ALLOY_ERR_OOM, "out of memory adding %s", WHAT);
                return NULL;
            }
            for (int j = 0; j < a.n; j++) f[j] = (double)attrs[i].ints[j];
            a.kind = IR_ATTR_FLOATS;
            a.floats = f;
        }
        if (!copy_attr(&g->arena, &as[nout++], &a, spec->name)) {
            ir_error(g, ALLOY_ERR_OOM, "out of memory adding %s", WHAT);
            return NULL;
        }
    }
    nattrs = nout;
    n->id = g->nnodes;
    n->op = (uint16_t)op;
    n->nin = nin;
    n->in = ins;
    n->nattrs = nattrs;
    n->attrs = as;
    n->group = -1;
    n->origin = -1;
    if (declared) n->type = *declared;
    const ir_type *in_types[64];
    const ir_type **tin = nin <= 64 ? in_types : al_malloc(sizeof(ir_type *) * (size_t)nin);
    if (!tin) {
        ir_error(g, ALLOY_ERR_OOM, "out of memory adding %s", WHAT);
        return NULL;
    }
    for (int i = 0; i < nin; i++) tin[i] = &g->nodes[in[i]]->type;
    char why[256] = "";
    alloy_status st = info->type(n, tin, &n->type, why, sizeof why);
    if (tin != in_types) al_free(tin);
    if (!st && (al_numel(n->type.rank, n->type.dims) < 0 ||
                (size_t)al_numel(n->type.rank, n->type.dims) > SIZE_MAX / 8)) {
        st = ALLOY_ERR_SHAPE;
        al_fmt(why, sizeof why, "the result has more elements than fit in memory");
    }
    if (st) {
        ir_error(g, st, "%s: %s", WHAT, why);
        return NULL;
    }
    g->nodes[g->nnodes++] = n;
    if (name && ir_set_name(g, n, name)) {
        g->nnodes--;
        return NULL;
    }
    return n;
}
#undef WHAT

alloy_status ir_add_output(ir_graph *g, const char *name, int node)
{
    if (!name || !*name) return ir_error(g, ALLOY_ERR_INVALID, "output needs a name");
    if (node < 0 || node >= g->nnodes)
        return ir_error(g, ALLOY_ERR_INVALID, "output '%s' refers to no node", name);
    if (ir_find_output(g, name) >= 0)
        return ir_error(g, ALLOY_ERR_INVALID, "output '%s' is declared twice", name);
    if (g->noutputs == g->outcap) {
        int cap = g->outcap ? g->outcap * 2 : 8;
        ir_output *o = al_realloc(g->outputs, sizeof *o * (size_t)cap);
        if (!o) return ir_error(g, ALLOY_ERR_OOM, "out of memory adding output '%s'", name);
        g->outputs = o;
        g->outcap = cap;
    }
    const char *copy = al_arena_strdup(&g->arena, name);
    if (!copy) return ir_error(g, ALLOY_ERR_OOM, "out of memory adding output '%s'", name);
    g->outputs[g->noutputs] = (ir_output){copy, node};
    if (!al_index_add(&g->out_slots, &g->out_cap, g->noutputs, output_key, g, g->noutputs))
        return ir_error(g, ALLOY_ERR_OOM, "out of memory adding output '%s'", name);
    g->noutputs++;
    return ALLOY_OK;
}

alloy_status ir_add_update(ir_graph *g, const char *name, int node)
{
    if (!name || !*name) return ir_error(g, ALLOY_ERR_INVALID, "update needs a state name");
    if (node < 0 || node >= g->nnodes)
        return ir_error(g, ALLOY_ERR_INVALID, "update of '%s' refers to no node", name);
    if (ir_find_update(g, name) >= 0)
        return ir_error(g, ALLOY_ERR_INVALID, "state '%s' is updated twice", name);
    if (g->nupdates == g->updcap) {
        int cap = g->updcap ? g->updcap * 2 : 8;
        ir_output *u = al_realloc(g->updates, sizeof *u * (size_t)cap);
        if (!u) return ir_error(g, ALLOY_ERR_OOM, "out of memory adding update of '%s'", name);
        g->updates = u;
        g->updcap = cap;
    }
    const char *copy = al_arena_strdup(&g->arena, name);
    if (!copy) return ir_error(g, ALLOY_ERR_OOM, "out of memory adding update of '%s'", name);
    g->updates[g->nupdates] = (ir_output){copy, node};
    if (!al_index_add(&g->upd_slots, &g->upd_cap, g->nupdates, update_key, g, g->nupdates))
        return ir_error(g, ALLOY_ERR_OOM, "out of memory adding update of '%s'", name);
    g->nupdates++;
    return ALLOY_OK;
}

int ir_find_output(const ir_graph *g, const char *name)
{
    return al_index_find(g->out_slots, g->out_cap, output_key, g, name);
}

int ir_find_update(const ir_graph *g, const char *name)
{
    return al_index_find(g->upd_slots, g->upd_cap, update_key, g, name);
}

ir_graph *ir_graph_clone(const ir_graph *src)
{
    ir_graph *g = ir_graph_new(src->name);
    if (!g) return NULL;
    for (int i = 0; i < src->nnodes; i++) {
        const ir_node *s = src->nodes[i];
        ir_node *n = ir_add_node(g, s->op, s->nin, s->in, s->nattrs, s->attrs, &s->type, s->name);
        if (!n) {
            ir_graph_free(g);
            return NULL;
        }
        n->amp = s->amp;
        n->flags = s->flags;
        n->group = s->group;
        n->origin = s->origin;
    }
    for (int i = 0; i < src->noutputs; i++) {
        if (ir_add_output(g, src->outputs[i].name, src->outputs[i].node)) {
            ir_graph_free(g);
            return NULL;
        }
    }
    for (int i = 0; i < src->nupdates; i++) {
        if (ir_add_update(g, src->updates[i].name, src->updates[i].node)) {
            ir_graph_free(g);
            return NULL;
        }
    }
    g->loss = src->loss;
    return g;
}

void ir_carry_origins(ir_graph *out, const ir_graph *in, const int *map)
{
    for (int i = 0; i < in->nnodes; i++) {
        int m = map[i], o = in->nodes[i]->origin;
        if (m >= 0 && m < out->nnodes && o >= 0 && map[o] >= 0 && out->nodes[m]->origin < 0)
            out->nodes[m]->origin = map[o];
    }
}

ir_graph *ir_graph_reordered(ir_graph *g, const int *order, int n, const char *who)
{
    int *map = al_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    ir_graph *out = map ? ir_graph_new(g->name) : NULL;
    int ins_small[16];
    for (int i = 0; i < g->nnodes && map; i++) map[i] = -1;
    for (int k = 0; out && k < n && !out->status; k++) {
        const ir_node *s = g->nodes[order[k]];
        int *ins = s->nin <= 16 ? ins_small : al_malloc(sizeof(int) * (size_t)s->nin);
        if (!ins) {
            ir_error(out, ALLOY_ERR_OOM, "out of memory");
            break;
        }
        bool placed = true;
        for (int j = 0; j < s->nin; j++) placed &= (ins[j] = map[s->in[j]]) >= 0;
        ir_node *m = placed ? ir_add_node(out, s->op, s->nin, ins, s->nattrs, s->attrs, &s->type, s->name) : NULL;
        if (ins != ins_small) al_free(ins);
        if (!placed) {
            char label[64];
            ir_error(out, ALLOY_ERR_VERIFY, "node %s comes before an operand of it", ir_node_label(s, label, sizeof label));
        }
        if (!m) break;
        m->amp = s->amp;
        m->flags = s->flags;
        m->group = s->group;
        map[s->id] = m->id;
    }
    if (out && !out->status) ir_carry_origins(out, g, map);
    for (int i = 0; out && i < g->noutputs && !out->status; i++)
        if (map[g->outputs[i].node] >= 0) ir_add_output(out, g->outputs[i].name, map[g->outputs[i].node]);
    for (int i = 0; out && i < g->nupdates && !out->status; i++)
        if (map[g->updates[i].node] >= 0) ir_add_update(out, g->updates[i].name, map[g->updates[i].node]);
    if (out && g->loss >= 0) out->loss = map[g->loss];
    if (!out || out->status) {
        ir_error(g, out ? out->status : ALLOY_ERR_OOM, "%s: %s", who, out ? out->error : "out of memory");
        ir_graph_free(out);
        out = NULL;
    }
    al_free(map);
    return out;
}

const ir_attr *ir_attr_find(const ir_node *n, const char *name)
{
    for (int i = 0; i < n->nattrs; i++)
        if (strcmp(n->attrs[i].name, name) == 0) return &n->attrs[i];
    return NULL;
}

int64_t ir_attr_int(const ir_node *n, const char *name, int64_t def)
{
    const ir_attr *a = ir_attr_find(n, name);
    return a && (a->kind == IR_ATTR_INT || a->kind == IR_ATTR_BOOL) ? a->i : def;
}

double ir_attr_float(const ir_node *n, const char *name, double def)
{
    const ir_attr *a = ir_attr_find(n, name);
    if (!a) return def;
    return a->kind == IR_ATTR_FLOAT ? a->f : a->kind == IR_ATTR_INT ? (double)a->i : def;
}

const ir_attr_spec *ir_attr_schema(int op, const char *name)
{
    for (const ir_attr_spec *a = ir_ops[op].attrs; a && a->name; a++)
        if (strcmp(a->name, name) == 0) return a;
    return NULL;
}

/* The schema default of attribute name of n's op; for one without a default,
 * the value its absence reads as (the schema's def field: 0, -1 for a loss's
 * ignore_index). */
static double schema_default(const ir_node *n, const char *name)
{
    const ir_attr_spec *a = ir_attr_schema(n->op, name);
    return a ? a->def : 0;
}

int64_t ir_attr_i(const ir_node *n, const char *name)
{
    return ir_attr_int(n, name, (int64_t)schema_default(n, name));
}

double ir_attr_f(const ir_node *n, const char *name) { return ir_attr_float(n, name, schema_default(n, name)); }

int ir_ew_params(const ir_node *n, double *p)
{
    int k = 0;
    for (const ir_attr_spec *a = ir_ops[n->op].attrs; a && a->name && k < IR_EW_MAX_ATTRS; a++, k++)
        p[k] = a->kind == IR_ATTR_FLOAT ? ir_attr_f(n, a->name)
               : a->kind == IR_ATTR_INT || a->kind == IR_ATTR_BOOL ? (double)ir_attr_i(n, a->name)
                                                                   : 0;
    return k;
}

const char *ir_attr_str(const ir_node *n, const char *name, const char *def)
{
    const ir_attr *a = ir_attr_find(n, name);
    return a && a->kind == IR_ATTR_STR ? a->s : def;
}

const int64_t *ir_attr_ints(const ir_node *n, const char *name, int *count)
{
    const ir_attr *a = ir_attr_find(n, name);
    if (!a || a->kind != IR_ATTR_INTS) {
        *count = 0;
        return NULL;
    }
    *count = a->n;
    return a->ints;
}

ir_attr ir_a_int(const char *name, int64_t v) { return (ir_attr){.name = name, .kind = IR_ATTR_INT, .i = v}; }
ir_attr ir_a_bool(const char *name, bool v) { return (ir_attr){.name = name, .kind = IR_ATTR_BOOL, .i = v}; }
ir_attr ir_a_float(const char *name, double v) { return (ir_attr){.name = name, .kind = IR_ATTR_FLOAT, .f = v}; }
ir_attr ir_a_str(const char *name, const char *v) { return (ir_attr){.name = name, .kind = IR_ATTR_STR, .s = v}; }
ir_attr ir_a_ints(const char *name, int n, const int64_t *v)
{
    return (ir_attr){.name = name, .kind = IR_ATTR_INTS, .n = n, .ints = (int64_t *)v};
}
ir_attr ir_a_floats(const char *name, int n, const double *v)
{
    return (ir_attr){.name = name, .kind = IR_ATTR_FLOATS, .n = n, .floats = (double *)v};
}

int64_t ir_numel(const ir_type *t) { return al_numel(t->rank, t->dims); }
size_t ir_nbytes(const ir_type *t) { return (size_t)ir_numel(t) * alloy_dtype_size(t->dtype); }

void ir_matmul_batch_strides(const ir_type *t, int out_batch_rank, int64_t *stride)
{
    /* unsigned: an empty operand's other dims may multiply past int64
     * (fuzz_builder); nothing is read then, but the product must be defined */
    int own = t->rank - 2;
    uint64_t step = (uint64_t)t->dims[t->rank - 2] * (uint64_t)t->dims[t->rank - 1];
    for (int d = out_batch_rank - 1; d >= 0; d--) {
        int td = d - (out_batch_rank - own);
        int64_t size = td >= 0 ? t->dims[td] : 1;
        stride[d] = size == 1 ? 0 : (int64_t)step;
        step *= (uint64_t)size;
    }
}

bool ir_type_eq(const ir_type *a, const ir_type *b)
{
    return a->dtype == b->dtype && a->rank == b->rank &&
           memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank) == 0;
}

bool ir_is_float(alloy_dtype dt)
{
    return dt == ALLOY_F32 || dt == ALLOY_F16 || dt == ALLOY_BF16 || dt == ALLOY_F64;
}

bool ir_is_int(alloy_dtype dt) { return dt == ALLOY_I32 || dt == ALLOY_I64; }

void ir_fmt_type(char *buf, size_t len, const ir_type *t)
{
    char dims[80];
    al_fmt_dims(dims, sizeof dims, t->rank, t->dims);
    al_fmt(buf, len, "%s%s", alloy_dtype_name(t->dtype), dims);
}

const char *ir_node_label(const ir_node *n, char *buf, size_t len)
{
    if (n->name) return n->name;
    al_fmt(buf, len, "%%%d", n->id);
    return buf;
}
