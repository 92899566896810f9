/* simplify.c - one sweep of common-subexpression elimination, cast folding, constant folding and exact identities.
 *
 * After this pass, among the nodes it kept or made (the graph is rebuilt in
 * order, old ids mapped to new ones as in dce.c):
 * - no two nodes have the same op, operands, attributes (compared exactly,
 *   floats by bits, in any order), type and fusion group, unless both are
 *   named or they are input/param/state leaves, which never merge; the
 *   first one stays;
 * - no cast is to its operand's dtype, and no cast reads a cast that
 *   converts exactly (widening, e.g. f16 -> f32, i32 -> f64, bool -> any):
 *   cast(cast(x, B), C) became cast(x, C), or x itself when C is x's dtype.
 *   A narrowing inner cast (f32 -> f16, f32 -> i32) changes values and is
 *   never folded;
 * - no non-leaf node whose operands are all constants and whose result has
 *   at most FOLD_MAX elements (operands at most FOLD_MAX_OPERAND, so the
 *   pass stays cheap) and an op the reference evaluator computes
 *   (passes/evaluate.c: elementwise, cast, data movement, reductions,
 *   bit for bit what the CPU backend computes): it was evaluated and
 *   replaced by a constant of the same type ({value=v} when all elements are equal,
 *   else {values=[...]}), unless evaluating it failed (the error is then left
 *   for the real run) or a value does not survive the trip through double
 *   (i64 beyond 2^53);
 * - no x*1, 1*x, x/1, x-(+0), x+(-0), (-0)+x, neg(neg(x)), reshape or
 *   broadcast_to to the operand's own shape, or transpose by the identity
 *   perm whose result type (dtype and shape) equals the kept operand's: an
 *   identity that broadcasts is kept. The arithmetic ones need a floating
 *   dtype or i32 (where any zero counts; neg(neg(x)) only for floats, as
 *   integer neg saturates; not i64, which the CPU computes in f64, rounding
 *   beyond 2^53). x+(+0) is NOT an identity (-0 + +0 = +0). A constant
 *   counts as 1 or 0 only when every element, as stored in its dtype, is
 *   exactly that value.
 * Leaves, outputs, updates and the loss are kept, pointing at the
 * replacements; amp, flags and group stay on surviving nodes (a folded
 * constant takes the amp and flags of the node it replaces, and no group).
 * The pass belongs before fuse: it keeps groups apart in CSE but does not
 * re-check fuse's guarantees (a group may lose members). Names: a named
 * node replaced by another gives its name to the replacement when that one
 * has none and is not an input/param/state (whose names are their feed and
 * state keys), else the name is lost, so it can no longer be fetched by
 * name; outputs are unaffected. Nodes left without consumers (a constant
 * 1, an inner cast) are dce's to remove. Linear in nodes + edges, plus one
 * evaluation per folded node. No state is kept between runs.
 */
#include <math.h>
#include <string.h>

#include "passes/pass.h"
#include "base/convert.h"
#include "passes/evaluate.h"

enum {
    FOLD_MAX = 4096,          /* largest result constant folding evaluates */
    FOLD_MAX_OPERAND = 65536, /* and largest operand, so folding stays cheap */
};

/* What a node is, apart from its name and annotations: what CSE compares. */
typedef struct node_key {
    int op, nin;
    const int *in;
    int nattrs;
    const ir_attr *attrs;
    ir_type type;
    int group;
} node_key;

typedef struct sweep {
    ir_graph *out;     /* the rebuilt graph */
    int *map;          /* old id -> new id */
    int *slots;        /* CSE table over new ids, open addressing, -1 empty */
    uint64_t *hashes;  /* new id -> key hash */
    uint8_t *kinds;    /* new id -> const_kind bits of a constant, CONST_KNOWN once computed */
    size_t mask;
    int *ins;          /* operand buffer for the node being rewritten */
} sweep;

static bool is_state_leaf(const ir_node *n) { return n->nin == 0 && n->op != IR_OP_constant; }

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15u + (h << 6) + (h >> 2);
    h ^= h >> 31;
    return h * 0xbf58476d1ce4e5b9u;
}

static uint64_t bits_of(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

static uint64_t hash_attr(const ir_attr *a)
{
    uint64_t h = mix((uint64_t)a->kind, 0);
    for (const char *p = a->name; *p; p++) h = mix(h, (unsigned char)*p);
    switch (a->kind) {
    case IR_ATTR_INT:
    case IR_ATTR_BOOL: return mix(h, (uint64_t)a->i);
    case IR_ATTR_FLOAT: return mix(h, bits_of(a->f));
    case IR_ATTR_STR:
        for (const char *p = a->s; *p; p++) h = mix(h, (unsigned char)*p);
        return h;
    case IR_ATTR_INTS:
        for (int i = 0; i < a->n; i++) h = mix(h, (uint64_t)a->ints[i]);
        return mix(h, (uint64_t)a->n);
    case IR_ATTR_FLOATS:
        for (int i = 0; i < a->n; i++) h = mix(h, bits_of(a->floats[i]));
        return mix(h, (uint64_t)a->n);
    }
    return h;
}

static uint64_t hash_key(const node_key *k)
{
    uint64_t h = mix((uint64_t)k->op, (uint64_t)k->nin);
    for (int i = 0; i < k->nin; i++) h = mix(h, (uint64_t)k->in[i]);
    h = mix(h, (uint64_t)k->type.dtype);
    for (int i = 0; i < k->type.rank; i++) h = mix(h, (uint64_t)k->type.dims[i]);
    h = mix(h, (uint64_t)(k->group + 1));
    uint64_t attrs = 0; /* a sum, so the attributes' order does not matter */
    for (int i = 0; i < k->nattrs; i++) attrs += hash_attr(&k->attrs[i]);
    return mix(h, attrs);
}

static bool attr_eq(const ir_attr *a, const ir_attr *b)
{
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case IR_ATTR_INT:
    case IR_ATTR_BOOL: return a->i == b->i;
    case IR_ATTR_FLOAT: return bits_of(a->f) == bits_of(b->f);
    case IR_ATTR_STR: return strcmp(a->s, b->s) == 0;
    case IR_ATTR_INTS:
        return a->n == b->n && (!a->n || memcmp(a->ints, b->ints, sizeof(int64_t) * (size_t)a->n) == 0);
    case IR_ATTR_FLOATS:
        if (a->n != b->n) return false;
        for (int i = 0; i < a->n; i++)
            if (bits_of(a->floats[i]) != bits_of(b->floats[i])) return false;
        return true;
    }
    return false;
}

static bool key_eq(const node_key *a, const node_key *b)
{
    if (a->op != b->op || a->nin != b->nin || a->nattrs != b->nattrs || a->group != b->group ||
        !ir_type_eq(&a->type, &b->type))
        return false;
    for (int i = 0; i < a->nin; i++)
        if (a->in[i] != b->in[i]) return false;
    for (int i = 0; i < a->nattrs; i++) { /* attribute names are unique within a node */
        int j = 0;
        while (j < b->nattrs && strcmp(a->attrs[i].name, b->attrs[j].name) != 0) j++;
        if (j == b->nattrs || !attr_eq(&a->attrs[i], &b->attrs[j])) return false;
    }
    return true;
}

static node_key key_of(const ir_node *n)
{
    return (node_key){n->op, n->nin, n->in, n->nattrs, n->attrs, n->type, n->group};
}

/* The new node equal to k (hash h), or -1; *slot gets where k would go. */
static int cse_find(const sweep *s, const node_key *k, uint64_t h, size_t *slot)
{
    size_t i = h & s->mask;
    for (; s->slots[i] >= 0; i = (i + 1) & s->mask) {
        int id = s->slots[i];
        node_key other = key_of(s->out->nodes[id]);
        if (s->hashes[id] == h && key_eq(k, &other)) return id;
    }
    *slot = i;
    return -1;
}

/* Whether converting any value of dtype a to dtype b is exact, so that a
 * cast through b changes nothing (bool's 0/1 fit everywhere). */
static bool widens_exactly(alloy_dtype a, alloy_dtype b)
{
    switch (a) {
    case ALLOY_BOOL: return true;
    case ALLOY_F16:
    case ALLOY_BF16: return b == ALLOY_F32 || b == ALLOY_F64;
    case ALLOY_F32: return b == ALLOY_F64;
    case ALLOY_I32: return b == ALLOY_I64 || b == ALLOY_F64;
    default: return false;
    }
}

/* v as an element of dtype stores it (rounded, truncated or saturated). */
static double as_stored(alloy_dtype dtype, double v)
{
    uint64_t buf = 0;
    double back;
    cvt_store_f64(dtype, &v, &buf, 1);
    cvt_load_f64(dtype, &buf, &back, 1);
    return back;
}

/* What every element of a constant is, as bits (integers have one zero,
 * which is both). */
typedef enum { IS_ONE = 1, IS_POS_ZERO = 2, IS_NEG_ZERO = 4, CONST_KNOWN = 8 } const_kind;

static unsigned element_kinds(alloy_dtype dtype, double v)
{
    double x = as_stored(dtype, v);
    if (x == 1.0) return IS_ONE;
    if (x != 0.0) return 0;
    if (!ir_is_float(dtype)) return IS_POS_ZERO | IS_NEG_ZERO;
    return signbit(x) ? IS_NEG_ZERO : IS_POS_ZERO;
}

/* Whether new node id is a constant every element of which is `want`;
 * each constant is scanned once however many nodes read it. */
static bool constant_is(const sweep *s, int id, const_kind want)
{
    const ir_node *n = s->out->nodes[id];
    if (n->op != IR_OP_constant) return false;
    if (!(s->kinds[id] & CONST_KNOWN)) {
        alloy_dtype dt = n->type.dtype;
        const ir_attr *value = ir_attr_find(n, "value"), *values = ir_attr_find(n, "values");
        unsigned kinds = 0; /* ir_add_node made value a FLOAT and values FLOATS */
        if (value && value->kind == IR_ATTR_FLOAT) kinds = element_kinds(dt, value->f);
        else if (values && values->kind == IR_ATTR_FLOATS) {
            kinds = IS_ONE | IS_POS_ZERO | IS_NEG_ZERO;
            for (int i = 0; kinds && i < values->n; i++) kinds &= element_kinds(dt, values->floats[i]);
        }
        s->kinds[id] = (uint8_t)(kinds | CONST_KNOWN);
    }
    return (s->kinds[id] & want) != 0;
}

/* The operand a node reduces to by an exact identity, or -1. k's operands
 * are new ids. */
static int identity_of(const sweep *s, const node_key *k)
{
    const ir_graph *out = s->out;
    if (k->nin < 1) return -1;
    const ir_node *a = out->nodes[k->in[0]], *b = k->nin > 1 ? out->nodes[k->in[1]] : NULL;
    bool same_a = ir_type_eq(&k->type, &a->type), same_b = b && ir_type_eq(&k->type, &b->type);
    switch (k->op) { /* data movement: the same bytes in any dtype */
    case IR_OP_reshape:
    case IR_OP_broadcast_to: return same_a ? k->in[0] : -1;
    case IR_OP_transpose: {
        int n = 0;
        const int64_t *perm = NULL;
        for (int i = 0; i < k->nattrs; i++)
            if (strcmp(k->attrs[i].name, "perm") == 0) perm = k->attrs[i].ints, n = k->attrs[i].n;
        for (int i = 0; i < n; i++)
            if (perm[i] != i) return -1;
        return same_a ? k->in[0] : -1;
    }
    default: break;
    }
    /* Arithmetic: floats, and i32, which the CPU computes exactly in f64.
     * Not i64: the CPU rounds it to f64 too, so x*1 is not x beyond 2^53. */
    alloy_dtype dt = k->type.dtype;
    if (!ir_is_float(dt) && dt != ALLOY_I32) return -1;
    switch (k->op) {
    case IR_OP_mul:
        if (same_a && constant_is(s, k->in[1], IS_ONE)) return k->in[0];
        if (same_b && constant_is(s, k->in[0], IS_ONE)) return k->in[1];
        return -1;
    case IR_OP_div: return same_a && constant_is(s, k->in[1], IS_ONE) ? k->in[0] : -1;
    case IR_OP_sub: return same_a && constant_is(s, k->in[1], IS_POS_ZERO) ? k->in[0] : -1;
    case IR_OP_add: /* x + (+0) is not x when x is -0; an integer zero has both bits */
        if (same_a && constant_is(s, k->in[1], IS_NEG_ZERO)) return k->in[0];
        if (same_b && constant_is(s, k->in[0], IS_NEG_ZERO)) return k->in[1];
        return -1;
    case IR_OP_neg: /* integer neg saturates: neg(neg(INT32_MIN)) is INT32_MIN + 1 */
        return a->op == IR_OP_neg && ir_is_float(dt) ? a->in[0] : -1;
    default: return -1;
    }
}

/* Casts: to the operand's own dtype -> the operand; of an exact (widening)
 * cast -> of the inner cast's operand, or that operand itself. Returns the
 * node to forward to, or -1 after possibly rewriting k's operand. */
static int fold_cast(const sweep *s, node_key *k)
{
    const ir_node *x = s->out->nodes[k->in[0]];
    if (x->type.dtype == k->type.dtype) return k->in[0];
    if (x->op != IR_OP_cast) return -1;
    const ir_node *inner = s->out->nodes[x->in[0]];
    if (!widens_exactly(inner->type.dtype, x->type.dtype)) return -1;
    if (inner->type.dtype == k->type.dtype) return inner->id;
    s->ins[0] = inner->id;
    return -1;
}

/* The values constant c holds, as stored in its dtype, into v (its numel
 * doubles); bytes is scratch of its size. False when c has no value. */
static bool constant_values(const ir_node *c, double *v, void *bytes)
{
    int64_t count = ir_numel(&c->type);
    const ir_attr *values = ir_attr_find(c, "values"), *value = ir_attr_find(c, "value");
    if (values && values->kind == IR_ATTR_FLOATS && values->n == count) {
        if (count) memcpy(v, values->floats, sizeof(double) * (size_t)count); /* empty: floats is NULL */
    } else {
        if (!value) return false;
        for (int64_t i = 0; i < count; i++) v[i] = ir_attr_float(c, "value", 0);
    }
    cvt_store_f64(c->type.dtype, v, bytes, (size_t)count); /* the constant's rounding */
    cvt_load_f64(c->type.dtype, bytes, v, (size_t)count);
    return true;
}

/* Evaluates k (all operands constants in s->out) with the reference
 * evaluator (passes/evaluate.c). On success *values (al_free it) holds its
 * ir_numel(&k->type) elements as doubles; returns ALLOY_OK, ALLOY_ERR_OOM,
 * or another status when the node cannot be folded. */
static alloy_status evaluate(const sweep *s, const node_key *k, double **values)
{
    *values = NULL;
    const ir_type *types[64];
    double *in[64] = {NULL};
    alloy_status st = ALLOY_OK;
    for (int j = 0; j < k->nin && !st; j++) {
        const ir_node *c = s->out->nodes[k->in[j]];
        int64_t count = ir_numel(&c->type);
        types[j] = &c->type;
        in[j] = al_malloc(sizeof(double) * (size_t)(count ? count : 1));
        void *bytes = al_malloc(count ? ir_nbytes(&c->type) : 1);
        if (!in[j] || !bytes) st = ALLOY_ERR_OOM;
        else if (!constant_values(c, in[j], bytes)) st = ALLOY_ERR_INVALID;
        al_free(bytes);
    }
    int64_t count = ir_numel(&k->type);
    double *v = st ? NULL : al_malloc(sizeof(double) * (size_t)(count ? count : 1));
    if (!st && !v) st = ALLOY_ERR_OOM;
    if (!st) {
        ir_node probe = {.op = (uint16_t)k->op, .nin = k->nin, .type = k->type, .nattrs = k->nattrs,
                         .attrs = (ir_attr *)(uintptr_t)k->attrs, .group = -1};
        char why[256];
        st = eval_node(&probe, types, (const double *const *)in, v, why, sizeof why);
    }
    for (int j = 0; j < k->nin; j++) al_free(in[j]);
    if (st) al_free(v);
    else *values = v;
    return st;
}

bool simplify_folds(const ir_graph *g, int nin, const int *in, const ir_type *type)
{
    if (nin == 0 || nin > 64 || ir_numel(type) > FOLD_MAX) return false;
    for (int j = 0; j < nin; j++) {
        const ir_node *c = g->nodes[in[j]];
        if (c->op != IR_OP_constant || ir_numel(&c->type) > FOLD_MAX_OPERAND) return false;
    }
    return true;
}

/* Rewrites k into the constant holding its value when all its operands are
 * constants; *values keeps the attribute's storage until k is emitted. */
static alloy_status fold_constants(const sweep *s, node_key *k, ir_attr *attr, double **values)
{
    *values = NULL;
    if (!simplify_folds(s->out, k->nin, k->in, &k->type)) return ALLOY_OK;
    alloy_status st = evaluate(s, k, values);
    if (st) return st == ALLOY_ERR_OOM ? st : ALLOY_OK; /* a failing node fails in the real run */
    int count = (int)ir_numel(&k->type);
    bool uniform = count > 0;
    for (int i = 1; i < count && uniform; i++) uniform = bits_of((*values)[i]) == bits_of((*values)[0]);
    *attr = uniform ? ir_a_float("value", (*values)[0]) : ir_a_floats("values", count, *values);
    *k = (node_key){IR_OP_constant, 0, NULL, 1, attr, k->type, -1}; /* no fusion group holds a constant */
    return ALLOY_OK;
}

/* Old node n now stands for new node id: carry its name over if allowed. */
static void forward(sweep *s, const ir_node *n, int id)
{
    s->map[n->id] = id;
    ir_node *to = s->out->nodes[id];
    if (n->name && !to->name && !is_state_leaf(to)) ir_set_name(s->out, to, n->name);
}

/* Simplifies old node n into s->out; records where it went in s->map. */
static alloy_status simplify_node(sweep *s, const ir_node *n)
{
    for (int j = 0; j < n->nin; j++) s->ins[j] = s->map[n->in[j]];
    node_key k = {n->op, n->nin, s->ins, n->nattrs, n->attrs, n->type, n->group};
    if (is_state_leaf(n)) { /* inputs, params, state: kept as they are, never merged */
        ir_node *m = ir_add_node(s->out, n->op, 0, NULL, n->nattrs, n->attrs, &n->type, n->name);
        if (!m) return s->out->status;
        m->amp = n->amp, m->flags = n->flags, m->group = n->group;
        s->map[n->id] = m->id;
        s->hashes[m->id] = 0, s->kinds[m->id] = 0;
        return ALLOY_OK;
    }
    int to = n->op == IR_OP_cast ? fold_cast(s, &k) : -1;
    if (to < 0) to = identity_of(s, &k);
    if (to >= 0) {
        forward(s, n, to);
        return s->out->status;
    }
    ir_attr folded;
    double *values;
    alloy_status st = fold_constants(s, &k, &folded, &values);
    if (st) {
        al_free(values);
        return ir_error(s->out, st, "out of memory folding constants");
    }
    uint64_t h = hash_key(&k);
    size_t slot = 0;
    int same = cse_find(s, &k, h, &slot);
    if (same >= 0 && !(n->name && s->out->nodes[same]->name)) { /* never merge two named nodes */
        al_free(values);
        forward(s, n, same);
        return s->out->status;
    }
    ir_node *m = ir_add_node(s->out, k.op, k.nin, k.in, k.nattrs, k.attrs, &k.type, n->name);
    al_free(values);
    if (!m) return s->out->status;
    m->amp = n->amp, m->flags = n->flags, m->group = k.group;
    s->map[n->id] = m->id;
    s->hashes[m->id] = h, s->kinds[m->id] = 0;
    if (same < 0) s->slots[slot] = m->id;
    return ALLOY_OK;
}

/* Replaces *gp by its simplified copy (see the top of this file). On error
 * (only out of memory) *gp is left as it was, with the error recorded. */
alloy_status pass_simplify(ir_graph **gp, const pass_options *opts)
{
    (void)opts;
    ir_graph *g = *gp;
    sweep s = {0};
    int maxin = 1;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->nin > maxin) maxin = g->nodes[i]->nin;
    size_t cap = 16;
    while (cap < 2 * (size_t)g->nnodes) cap *= 2;
    s.mask = cap - 1;
    s.map = al_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    s.hashes = al_malloc(sizeof(uint64_t) * ((size_t)g->nnodes + 1));
    s.kinds = al_malloc((size_t)g->nnodes + 1);
    s.slots = al_malloc(sizeof(int) * cap);
    s.ins = al_malloc(sizeof(int) * (size_t)maxin);
    s.out = ir_graph_new(g->name);
    alloy_status st = ALLOY_OK;
    if (!s.map || !s.hashes || !s.kinds || !s.slots || !s.ins || !s.out) st = ALLOY_ERR_OOM;
    for (size_t i = 0; !st && i < cap; i++) s.slots[i] = -1;
    for (int i = 0; !st && i < g->nnodes; i++) st = simplify_node(&s, g->nodes[i]);
    for (int i = 0; !st && i < g->noutputs; i++)
        st = ir_add_output(s.out, g->outputs[i].name, s.map[g->outputs[i].node]);
    for (int i = 0; !st && i < g->nupdates; i++)
        st = ir_add_update(s.out, g->updates[i].name, s.map[g->updates[i].node]);
    if (!st && g->loss >= 0) s.out->loss = s.map[g->loss];
    if (!st) ir_carry_origins(s.out, g, s.map);
    al_free(s.map);
    al_free(s.hashes);
    al_free(s.kinds);
    al_free(s.slots);
    al_free(s.ins);
    if (st) {
        ir_error(g, st, "simplify: %s", s.out && s.out->status ? s.out->error : "out of memory");
        ir_graph_free(s.out);
        return st;
    }
    ir_graph_free(g);
    *gp = s.out;
    return ALLOY_OK;
}
