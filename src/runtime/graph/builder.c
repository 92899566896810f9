/* builder.c - the builder calls of alloy/graph.h: one constructor per op, poisoned handles, errors on the graph (each other public header's builders: the *_api.c of its name). */
#include <math.h>
#include <string.h>

#include "runtime/graph/graph_impl.h"
#include "passes/pass.h"

/* A public handle is the node itself. */
#define NODE(t) ((ir_node *)(void *)(t))
#define HANDLE(n) ((alloy_tensor *)(void *)(n))

/* Checks g and the operands: returns false quietly when g already has an
 * error (poison passes through), records one for NULL or foreign handles. */
static bool operands_ok(alloy_graph *g, const char *op, int n, alloy_tensor *const *xs)
{
    if (!g) return false;
    if (g->ir->status) return false;
    for (int i = 0; i < n; i++) {
        ir_node *node = NODE(xs[i]);
        if (!node) {
            ir_error(g->ir, ALLOY_ERR_INVALID, "%s: operand %d is NULL", op, i);
            return false;
        }
        if (node->id < 0 || node->id >= g->ir->nnodes || g->ir->nodes[node->id] != node) {
            ir_error(g->ir, ALLOY_ERR_INVALID, "%s: operand %d belongs to another graph", op, i);
            return false;
        }
    }
    return true;
}

static alloy_tensor *add(alloy_graph *g, int op, int n, alloy_tensor *const *xs, int nattrs,
                         const ir_attr *attrs, const ir_type *declared)
{
    if (!operands_ok(g, ir_ops[op].name, n, xs)) return NULL;
    int ids[64];
    if (n > 64) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "%s: at most 64 operands", ir_ops[op].name);
        return NULL;
    }
    for (int i = 0; i < n; i++) ids[i] = NODE(xs[i])->id;
    ir_node *node = ir_add_node(g->ir, op, n, ids, nattrs, attrs, declared, NULL);
    if (node && g->amp_scopes) node->amp = g->amp_scope[g->amp_scopes - 1]; /* the AMP pass keeps it */
    if (node) graph_invalidate(g);
    return HANDLE(node);
}

alloy_tensor *graph_add_op(alloy_graph *g, int op, int n, alloy_tensor *const *xs, int nattrs, const ir_attr *attrs)
{
    return add(g, op, n, xs, nattrs, attrs, NULL);
}

alloy_tensor *graph_add_declared(alloy_graph *g, int op, int n, alloy_tensor *const *xs, int nattrs,
                                 const ir_attr *attrs, const ir_type *declared)
{
    return add(g, op, n, xs, nattrs, attrs, declared);
}

bool graph_declared_type(alloy_graph *g, const char *op, alloy_dtype dtype, int rank, const int64_t *dims, ir_type *t)
{
    if ((unsigned)dtype >= ALLOY_DTYPE_COUNT) {
        ir_error(g->ir, ALLOY_ERR_DTYPE, "%s: unknown dtype %d", op, (int)dtype);
        return false;
    }
    if (rank < 0 || rank > ALLOY_MAX_RANK || (rank > 0 && !dims)) {
        ir_error(g->ir, ALLOY_ERR_SHAPE, "%s: rank %d is not in [0, %d] or dims is NULL", op, rank,
                 ALLOY_MAX_RANK);
        return false;
    }
    t->dtype = dtype;
    t->rank = rank;
    if (rank) memcpy(t->dims, dims, sizeof(int64_t) * (size_t)rank);
    return true;
}

static alloy_tensor *leaf(alloy_graph *g, int op, const char *name, alloy_dtype dtype, int rank,
                          const int64_t *dims, int nattrs, const ir_attr *attrs)
{
    if (!g || g->ir->status) return NULL;
    ir_type t;
    if (!graph_declared_type(g, ir_ops[op].name, dtype, rank, dims, &t)) return NULL;
    if ((op == IR_OP_input || op == IR_OP_param) && (!name || !*name)) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "%s: a name is required", ir_ops[op].name);
        return NULL;
    }
    char why[400];
    pass_name_use use = op == IR_OP_constant ? PASS_NAME_NODE : PASS_NAME_LEAF;
    if (name && pass_reserved_name(g->ir, name, use, why, sizeof why)) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "%s: %s", ir_ops[op].name, why);
        return NULL;
    }
    ir_node *node = ir_add_node(g->ir, op, 0, NULL, nattrs, attrs, &t, name);
    if (node) graph_invalidate(g);
    return HANDLE(node);
}

alloy_tensor *alloy_input(alloy_graph *g, const char *name, alloy_dtype dtype, int rank,
                          const int64_t *dims)
{
    return leaf(g, IR_OP_input, name, dtype, rank, dims, 0, NULL);
}

alloy_init alloy_init_zeros(void) { return (alloy_init){ALLOY_INIT_ZEROS, 0, 0}; }
alloy_init alloy_init_ones(void) { return (alloy_init){ALLOY_INIT_ONES, 0, 0}; }
alloy_init alloy_init_constant(double v) { return (alloy_init){ALLOY_INIT_CONSTANT, v, 0}; }
alloy_init alloy_init_normal(double std) { return (alloy_init){ALLOY_INIT_NORMAL, 0, std}; }
alloy_init alloy_init_uniform(double lo, double hi) { return (alloy_init){ALLOY_INIT_UNIFORM, lo, hi}; }
alloy_init alloy_init_kaiming_uniform(double gain) { return (alloy_init){ALLOY_INIT_KAIMING_UNIFORM, gain, 0}; }
alloy_init alloy_init_kaiming_normal(double gain) { return (alloy_init){ALLOY_INIT_KAIMING_NORMAL, gain, 0}; }
alloy_init alloy_init_xavier_uniform(double gain) { return (alloy_init){ALLOY_INIT_XAVIER_UNIFORM, gain, 0}; }
alloy_init alloy_init_xavier_normal(double gain) { return (alloy_init){ALLOY_INIT_XAVIER_NORMAL, gain, 0}; }

alloy_tensor *alloy_param(alloy_graph *g, const char *name, alloy_dtype dtype, int rank,
                          const int64_t *dims, alloy_init init)
{
    if (!g || g->ir->status) return NULL;
    ir_attr attrs[3];
    int n = 0;
    switch (init.kind) {
    case ALLOY_INIT_ZEROS: attrs[n++] = ir_a_str("init", "zeros"); break;
    case ALLOY_INIT_ONES: attrs[n++] = ir_a_str("init", "ones"); break;
    case ALLOY_INIT_CONSTANT:
        attrs[n++] = ir_a_str("init", "constant");
        attrs[n++] = ir_a_float("value", init.a);
        break;
    case ALLOY_INIT_NORMAL:
        attrs[n++] = ir_a_str("init", "normal");
        if (init.a != 0) attrs[n++] = ir_a_float("mean", init.a);
        attrs[n++] = ir_a_float("std", init.b);
        break;
    case ALLOY_INIT_UNIFORM:
        attrs[n++] = ir_a_str("init", "uniform");
        attrs[n++] = ir_a_float("low", init.a);
        attrs[n++] = ir_a_float("high", init.b);
        break;
    case ALLOY_INIT_KAIMING_UNIFORM: attrs[n++] = ir_a_str("init", "kaiming_uniform"); goto gain;
    case ALLOY_INIT_KAIMING_NORMAL: attrs[n++] = ir_a_str("init", "kaiming_normal"); goto gain;
    case ALLOY_INIT_XAVIER_UNIFORM: attrs[n++] = ir_a_str("init", "xavier_uniform"); goto gain;
    case ALLOY_INIT_XAVIER_NORMAL:
        attrs[n++] = ir_a_str("init", "xavier_normal");
    gain:
        attrs[n++] = ir_a_float("gain", init.a);
        break;
    default:
        ir_error(g->ir, ALLOY_ERR_INVALID, "param '%s': unknown init kind %d", name ? name : "?",
                 (int)init.kind);
        return NULL;
    }
    if (!ir_is_float(dtype) && init.kind != ALLOY_INIT_ZEROS && init.kind != ALLOY_INIT_ONES &&
        init.kind != ALLOY_INIT_CONSTANT) {
        ir_error(g->ir, ALLOY_ERR_DTYPE, "param '%s': random init needs a floating-point dtype",
                 name ? name : "?");
        return NULL;
    }
    return leaf(g, IR_OP_param, name, dtype, rank, dims, n, attrs);
}

alloy_tensor *alloy_constant(alloy_graph *g, alloy_dtype dtype, int rank, const int64_t *dims,
                             const double *values)
{
    if (!g || g->ir->status) return NULL;
    ir_type t;
    if (!graph_declared_type(g, "constant", dtype, rank, dims, &t)) return NULL;
    int64_t n = ir_numel(&t);
    if (n < 0 || n > (1 << 24) || (n > 0 && !values)) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "constant: %lld values (at most 2^24, values non-NULL)",
                 (long long)n);
        return NULL;
    }
    ir_attr a = ir_a_floats("values", (int)n, values);
    return leaf(g, IR_OP_constant, NULL, dtype, rank, dims, 1, &a);
}

alloy_tensor *alloy_full(alloy_graph *g, alloy_dtype dtype, int rank, const int64_t *dims,
                         double value)
{
    ir_attr a = ir_a_float("value", value);
    return leaf(g, IR_OP_constant, NULL, dtype, rank, dims, 1, &a);
}

alloy_tensor *alloy_scalar(alloy_graph *g, alloy_dtype dtype, double value)
{
    return alloy_full(g, dtype, 0, NULL, value);
}

#define UNARY(fn, op)                                                                     \
    alloy_tensor *fn(alloy_graph *g, alloy_tensor *x) { return add(g, op, 1, &x, 0, NULL, NULL); }
#define BINARY(fn, op)                                                                    \
    alloy_tensor *fn(alloy_graph *g, alloy_tensor *a, alloy_tensor *b)                    \
    {                                                                                     \
        alloy_tensor *xs[2] = {a, b};                                                     \
        return add(g, op, 2, xs, 0, NULL, NULL);                                          \
    }
BINARY(alloy_add, IR_OP_add)
BINARY(alloy_sub, IR_OP_sub)
BINARY(alloy_mul, IR_OP_mul)
BINARY(alloy_div, IR_OP_div)
BINARY(alloy_maximum, IR_OP_maximum)
BINARY(alloy_minimum, IR_OP_minimum)
BINARY(alloy_pow, IR_OP_pow)
BINARY(alloy_equal, IR_OP_equal)
BINARY(alloy_not_equal, IR_OP_not_equal)
BINARY(alloy_less, IR_OP_less)
BINARY(alloy_less_equal, IR_OP_less_equal)
BINARY(alloy_greater, IR_OP_greater)
BINARY(alloy_greater_equal, IR_OP_greater_equal)
UNARY(alloy_neg, IR_OP_neg)
UNARY(alloy_relu, IR_OP_relu)
UNARY(alloy_gelu, IR_OP_gelu)
UNARY(alloy_gelu_tanh, IR_OP_gelu_tanh)
UNARY(alloy_tanh, IR_OP_tanh)
UNARY(alloy_sigmoid, IR_OP_sigmoid)
UNARY(alloy_silu, IR_OP_silu)
UNARY(alloy_exp, IR_OP_exp)
UNARY(alloy_log, IR_OP_log)
UNARY(alloy_sqrt, IR_OP_sqrt)
UNARY(alloy_rsqrt, IR_OP_rsqrt)
UNARY(alloy_square, IR_OP_square)
UNARY(alloy_sin, IR_OP_sin)
UNARY(alloy_cos, IR_OP_cos)
UNARY(alloy_abs, IR_OP_abs)
UNARY(alloy_sign, IR_OP_sign)
UNARY(alloy_erf, IR_OP_erf)
UNARY(alloy_log1p, IR_OP_log1p)
UNARY(alloy_expm1, IR_OP_expm1)
UNARY(alloy_softplus, IR_OP_softplus)
UNARY(alloy_causal_mask, IR_OP_causal_mask)

alloy_tensor *alloy_leaky_relu(alloy_graph *g, alloy_tensor *x, double negative_slope)
{
    ir_attr a = ir_a_float("negative_slope", negative_slope);
    return add(g, IR_OP_leaky_relu, 1, &x, 1, &a, NULL);
}

alloy_tensor *alloy_elu(alloy_graph *g, alloy_tensor *x, double alpha)
{
    ir_attr a = ir_a_float("alpha", alpha);
    return add(g, IR_OP_elu, 1, &x, 1, &a, NULL);
}

alloy_tensor *alloy_clamp(alloy_graph *g, alloy_tensor *x, double min, double max)
{
    ir_attr a[2] = {ir_a_float("min", min), ir_a_float("max", max)};
    return add(g, IR_OP_clamp, 1, &x, 2, a, NULL);
}

static alloy_tensor *arg(alloy_graph *g, int op, alloy_tensor *x, int axis, bool keepdims)
{
    ir_attr a[2] = {ir_a_int("axis", axis), ir_a_bool("keepdims", keepdims)};
    return add(g, op, 1, &x, 2, a, NULL);
}

alloy_tensor *alloy_argmax(alloy_graph *g, alloy_tensor *x, int axis, bool keepdims)
{
    return arg(g, IR_OP_argmax, x, axis, keepdims);
}

alloy_tensor *alloy_argmin(alloy_graph *g, alloy_tensor *x, int axis, bool keepdims)
{
    return arg(g, IR_OP_argmin, x, axis, keepdims);
}

alloy_tensor *alloy_one_hot(alloy_graph *g, alloy_tensor *ids, int64_t depth, alloy_dtype dtype)
{
    if (!operands_ok(g, "one_hot", 1, &ids)) return NULL;
    if ((unsigned)dtype >= ALLOY_DTYPE_COUNT) {
        ir_error(g->ir, ALLOY_ERR_DTYPE, "one_hot: unknown dtype %d", (int)dtype);
        return NULL;
    }
    ir_type t = {.dtype = dtype};
    ir_attr a = ir_a_int("depth", depth);
    return add(g, IR_OP_one_hot, 1, &ids, 1, &a, &t);
}

alloy_tensor *alloy_where(alloy_graph *g, alloy_tensor *cond, alloy_tensor *a, alloy_tensor *b)
{
    alloy_tensor *xs[3] = {cond, a, b};
    return add(g, IR_OP_where, 3, xs, 0, NULL, NULL);
}

alloy_tensor *alloy_matmul(alloy_graph *g, alloy_tensor *a, alloy_tensor *b, bool transpose_a,
                           bool transpose_b)
{
    alloy_tensor *xs[2] = {a, b};
    ir_attr attrs[2];
    int n = 0;
    if (transpose_a) attrs[n++] = ir_a_bool("transpose_a", true);
    if (transpose_b) attrs[n++] = ir_a_bool("transpose_b", true);
    return add(g, IR_OP_matmul, 2, xs, n, attrs, NULL);
}

static alloy_tensor *reduce(alloy_graph *g, int op, alloy_tensor *x, int naxes,
                            const int64_t *axes, bool keepdims)
{
    ir_attr attrs[2];
    int n = 0;
    if (g && !g->ir->status && axes && (naxes < 0 || naxes > ALLOY_MAX_RANK)) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "%s: %d axes (0 to %d)", ir_ops[op].name, naxes, ALLOY_MAX_RANK);
        return NULL;
    }
    if (axes) attrs[n++] = ir_a_ints("axes", naxes, axes);
    if (keepdims) attrs[n++] = ir_a_bool("keepdims", true);
    return add(g, op, 1, &x, n, attrs, NULL);
}

alloy_tensor *alloy_reduce_sum(alloy_graph *g, alloy_tensor *x, int naxes, const int64_t *axes, bool keepdims)
{
    return reduce(g, IR_OP_reduce_sum, x, naxes, axes, keepdims);
}
alloy_tensor *alloy_reduce_mean(alloy_graph *g, alloy_tensor *x, int naxes, const int64_t *axes, bool keepdims)
{
    return reduce(g, IR_OP_reduce_mean, x, naxes, axes, keepdims);
}
alloy_tensor *alloy_reduce_max(alloy_graph *g, alloy_tensor *x, int naxes, const int64_t *axes, bool keepdims)
{
    return reduce(g, IR_OP_reduce_max, x, naxes, axes, keepdims);
}

alloy_tensor *alloy_softmax(alloy_graph *g, alloy_tensor *x, int axis)
{
    ir_attr a = ir_a_int("axis", axis);
    return add(g, IR_OP_softmax, 1, &x, 1, &a, NULL);
}

alloy_tensor *alloy_attention(alloy_graph *g, alloy_tensor *q, alloy_tensor *k, alloy_tensor *v, bool causal,
                              double scale)
{
    alloy_tensor *xs[3] = {q, k, v};
    ir_attr a[2] = {ir_a_bool("causal", causal), ir_a_float("scale", scale)};
    return add(g, IR_OP_attention, 3, xs, 2, a, NULL);
}

alloy_tensor *alloy_log_softmax(alloy_graph *g, alloy_tensor *x, int axis)
{
    ir_attr a = ir_a_int("axis", axis);
    return add(g, IR_OP_log_softmax, 1, &x, 1, &a, NULL);
}

alloy_tensor *alloy_layer_norm(alloy_graph *g, alloy_tensor *x, alloy_tensor *gamma,
                               alloy_tensor *beta, double eps)
{
    if (g && !g->ir->status && !gamma != !beta) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "layer_norm: give both gamma and beta, or neither");
        return NULL;
    }
    alloy_tensor *xs[3] = {x, gamma, beta};
    ir_attr a = ir_a_float("eps", eps);
    return add(g, IR_OP_layer_norm, gamma ? 3 : 1, xs, 1, &a, NULL);
}

alloy_tensor *alloy_rms_norm(alloy_graph *g, alloy_tensor *x, alloy_tensor *gamma, double eps)
{
    alloy_tensor *xs[2] = {x, gamma};
    ir_attr a = ir_a_float("eps", eps);
    return add(g, IR_OP_rms_norm, gamma ? 2 : 1, xs, 1, &a, NULL);
}

alloy_tensor *alloy_cross_entropy(alloy_graph *g, alloy_tensor *logits, alloy_tensor *targets)
{
    alloy_tensor *xs[2] = {logits, targets};
    return add(g, IR_OP_cross_entropy, 2, xs, 0, NULL, NULL);
}

alloy_tensor *alloy_embedding(alloy_graph *g, alloy_tensor *ids, alloy_tensor *table)
{
    alloy_tensor *xs[2] = {ids, table};
    return add(g, IR_OP_embedding, 2, xs, 0, NULL, NULL);
}

/* The start of a reshape error: "reshape(f32[2,3]) of 'x' to [-1,4]". */
static void reshape_where(char *buf, size_t len, const ir_node *x, int rank, const int64_t *dims)
{
    char type[96], label[64], to[160];
    ir_fmt_type(type, sizeof type, &x->type);
    al_fmt_dims(to, sizeof to, rank, dims);
    al_fmt(buf, len, "reshape(%s) of '%s' to %s", type, ir_node_label(x, label, sizeof label), to);
}

alloy_tensor *alloy_reshape(alloy_graph *g, alloy_tensor *x, int rank, const int64_t *dims)
{
    if (!operands_ok(g, "reshape", 1, &x)) return NULL;
    ir_type t;
    if (!graph_declared_type(g, "reshape", NODE(x)->type.dtype, rank, dims, &t)) return NULL;
    char where[320];
    int infer = -1;
    int64_t known = 1;
    bool overflow = false; /* the known dims' product passes int64: no -1 can make it fit */
    for (int i = 0; i < rank; i++) {
        if (dims[i] == -1 && infer < 0) infer = i;
        else if (dims[i] < 0) {
            reshape_where(where, sizeof where, NODE(x), rank, dims);
            ir_error(g->ir, ALLOY_ERR_SHAPE, "%s: dim %d is %lld (only one -1 allowed)", where, i,
                     (long long)dims[i]);
            return NULL;
        } else if (overflow || (dims[i] && known > INT64_MAX / dims[i])) overflow = true;
        else known *= dims[i];
    }
    if (infer >= 0) {
        int64_t total = ir_numel(&NODE(x)->type);
        if (overflow || known == 0 || total % known) {
            reshape_where(where, sizeof where, NODE(x), rank, dims);
            if (overflow)
                ir_error(g->ir, ALLOY_ERR_SHAPE, "%s: cannot infer dim %d: the other dims' product passes int64", where,
                         infer);
            else
                ir_error(g->ir, ALLOY_ERR_SHAPE,
                         "%s: cannot infer dim %d: the %lld elements are not a whole number of the other dims' %lld",
                         where, infer, (long long)total, (long long)known);
            return NULL;
        }
        t.dims[infer] = total / known;
    }
    return add(g, IR_OP_reshape, 1, &x, 0, NULL, &t);
}

alloy_tensor *alloy_transpose(alloy_graph *g, alloy_tensor *x, const int64_t *perm)
{
    if (!operands_ok(g, "transpose", 1, &x)) return NULL;
    if (!perm) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "transpose: perm is NULL");
        return NULL;
    }
    ir_attr a = ir_a_ints("perm", NODE(x)->type.rank, perm);
    return add(g, IR_OP_transpose, 1, &x, 1, &a, NULL);
}

alloy_tensor *alloy_broadcast_to(alloy_graph *g, alloy_tensor *x, int rank, const int64_t *dims)
{
    if (!operands_ok(g, "broadcast_to", 1, &x)) return NULL;
    ir_type t;
    if (!graph_declared_type(g, "broadcast_to", NODE(x)->type.dtype, rank, dims, &t)) return NULL;
    return add(g, IR_OP_broadcast_to, 1, &x, 0, NULL, &t);
}

alloy_tensor *alloy_slice(alloy_graph *g, alloy_tensor *x, int axis, int64_t start, int64_t end)
{
    if (!operands_ok(g, "slice", 1, &x)) return NULL;
    const ir_type *t = &NODE(x)->type;
    int ax;
    if (!ir_norm_axis(axis, t->rank, &ax)) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "slice: axis %d out of range for rank %d", axis, t->rank);
        return NULL;
    }
    int64_t d = t->dims[ax];
    if (start < 0) start += d;
    if (end < 0) end += d;
    ir_attr attrs[3] = {ir_a_int("axis", ax), ir_a_int("start", start), ir_a_int("end", end)};
    return add(g, IR_OP_slice, 1, &x, 3, attrs, NULL);
}

alloy_tensor *alloy_concat(alloy_graph *g, int n, alloy_tensor *const *xs, int axis)
{
    if (!g || g->ir->status) return NULL;
    if (n < 1 || !xs) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "concat: needs at least one operand");
        return NULL;
    }
    if (!operands_ok(g, "concat", n, xs)) return NULL;
    int ax;
    if (!ir_norm_axis(axis, NODE(xs[0])->type.rank, &ax)) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "concat: axis %d out of range for rank %d", axis,
                 NODE(xs[0])->type.rank);
        return NULL;
    }
    ir_attr a = ir_a_int("axis", ax);
    return add(g, IR_OP_concat, n, xs, 1, &a, NULL);
}

alloy_tensor *alloy_cast(alloy_graph *g, alloy_tensor *x, alloy_dtype dtype)
{
    if (!operands_ok(g, "cast", 1, &x)) return NULL;
    ir_type t = NODE(x)->type;
    if ((unsigned)dtype >= ALLOY_DTYPE_COUNT) {
        ir_error(g->ir, ALLOY_ERR_DTYPE, "cast: unknown dtype %d", (int)dtype);
        return NULL;
    }
    t.dtype = dtype;
    return add(g, IR_OP_cast, 1, &x, 0, NULL, &t);
}

alloy_tensor *alloy_set_name(alloy_graph *g, alloy_tensor *t, const char *name)
{
    if (!operands_ok(g, "set_name", 1, &t)) return NULL;
    char why[400];
    const ir_node *n = NODE(t);
    bool leaf = n->op == IR_OP_input || n->op == IR_OP_param;
    if (pass_reserved_name(g->ir, name, leaf ? PASS_NAME_LEAF : PASS_NAME_NODE, why, sizeof why)) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "set_name: %s", why);
        return NULL;
    }
    if (ir_set_name(g->ir, NODE(t), name)) return NULL;
    return t;
}

alloy_status alloy_output(alloy_graph *g, const char *name, alloy_tensor *t)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!operands_ok(g, "output", 1, &t)) return g->ir->status;
    char why[400];
    if (pass_reserved_name(g->ir, name, PASS_NAME_OUTPUT, why, sizeof why))
        return ir_error(g->ir, ALLOY_ERR_INVALID, "output: %s", why);
    alloy_status st = ir_add_output(g->ir, name, NODE(t)->id);
    if (!st) graph_invalidate(g);
    return st;
}

alloy_tensor *alloy_graph_find(alloy_graph *g, const char *name)
{
    if (!g) return NULL;
    if (!name) {
        graph_fail(g, ALLOY_ERR_INVALID, "graph_find: name is NULL");
        return NULL;
    }
    int id = ir_find_name(g->ir, name);
    return id < 0 ? NULL : HANDLE(g->ir->nodes[id]);
}

alloy_host_tensor alloy_tensor_info(const alloy_tensor *t)
{
    alloy_host_tensor info = {0};
    if (!t) return (alloy_host_tensor){.dtype = ALLOY_DTYPE_COUNT, .rank = -1}; /* no tensor has these */
    const ir_node *n = (const ir_node *)(const void *)t;
    info.dtype = n->type.dtype;
    info.rank = n->type.rank;
    memcpy(info.dims, n->type.dims, sizeof info.dims);
    return info;
}

alloy_tensor *alloy_linear(alloy_graph *g, alloy_tensor *x, const char *name, int64_t in, int64_t out, bool bias)
{
    if (!g || g->ir->status) return NULL;
    if (!name || in < 1 || out < 1) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "linear: %s", !name ? "name is NULL" : "in and out must be at least 1");
        return NULL;
    }
    char wname[256], bname[256];
    if (snprintf(wname, sizeof wname, "%s.weight", name) >= (int)sizeof wname ||
        snprintf(bname, sizeof bname, "%s.bias", name) >= (int)sizeof bname) {
        ir_error(g->ir, ALLOY_ERR_INVALID, "linear: name '%.64s...' is too long", name);
        return NULL;
    }
    double bound = 1.0 / sqrt((double)in); /* torch.nn.Linear's kaiming_uniform(a=sqrt(5)) and its bias */
    alloy_dtype dt = x && !g->ir->status ? NODE(x)->type.dtype : ALLOY_F32;
    alloy_tensor *w = alloy_param(g, wname, dt, 2, (const int64_t[]){out, in}, alloy_init_uniform(-bound, bound));
    alloy_tensor *y = alloy_matmul(g, x, w, false, true);
    if (!bias) return y;
    alloy_tensor *b = alloy_param(g, bname, dt, 1, (const int64_t[]){out}, alloy_init_uniform(-bound, bound));
    return alloy_add(g, y, b);
}
