/* typerules.c - result type (dtype + static shape) of the core ops from their operands and attributes; the families' rules are in typerules_*.c. */
#include <math.h>
#include <string.h>

#include "base/convert.h"
#include "ir/typerules.h"

/* dout may not overlap da or db. */
bool ir_broadcast_dims(int ra, const int64_t *da, int rb, const int64_t *db, int *rout,
                       int64_t *dout)
{
    int r = ra > rb ? ra : rb;
    for (int i = 0; i < r; i++) {
        int64_t x = i < r - ra ? 1 : da[i - (r - ra)];
        int64_t y = i < r - rb ? 1 : db[i - (r - rb)];
        if (x != y && x != 1 && y != 1) return false;
        dout[i] = x == 1 ? y : x;
    }
    *rout = r;
    return true;
}

bool ir_norm_axis(int64_t axis, int rank, int *out)
{
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return false;
    *out = (int)axis;
    return true;
}

static bool dims_ok(const ir_type *t)
{
    return t->rank >= 0 && t->rank <= ALLOY_MAX_RANK && al_numel(t->rank, t->dims) >= 0;
}

RULE(ty_declared)
{
    if ((unsigned)out->dtype >= ALLOY_DTYPE_COUNT) FAIL(ALLOY_ERR_DTYPE, "unknown dtype");
    if (!dims_ok(out)) FAIL(ALLOY_ERR_SHAPE, "declared shape has a negative or overflowing dim");
    return ALLOY_OK;
}

const char *const ir_init_names[IR_INIT_COUNT] = {
    "zeros", "ones", "constant", "normal", "uniform", "kaiming_uniform", "kaiming_normal", "xavier_uniform",
    "xavier_normal",
};

int ir_init_lookup(const char *name)
{
    for (int i = 0; i < IR_INIT_COUNT; i++)
        if (strcmp(ir_init_names[i], name) == 0) return i;
    return -1;
}

/* Per init (ir_init order): the attributes it reads, and whether it draws random values. */
static const struct {
    const char *reads[2];
    bool random;
} inits[IR_INIT_COUNT] = {
    [IR_INIT_ZEROS] = {{NULL, NULL}, false},
    [IR_INIT_ONES] = {{NULL, NULL}, false},
    [IR_INIT_CONSTANT] = {{"value", NULL}, false},
    [IR_INIT_NORMAL] = {{"mean", "std"}, true},
    [IR_INIT_UNIFORM] = {{"low", "high"}, true},
    [IR_INIT_KAIMING_UNIFORM] = {{"gain", NULL}, true},
    [IR_INIT_KAIMING_NORMAL] = {{"gain", NULL}, true},
    [IR_INIT_XAVIER_UNIFORM] = {{"gain", NULL}, true},
    [IR_INIT_XAVIER_NORMAL] = {{"gain", NULL}, true},
};

/* A declared leaf whose init names a known init, with only the attributes
 * that init reads: a misspelt init="nromal" or a std= on a kaiming init
 * would otherwise be ignored. */
RULE(ty_param)
{
    alloy_status st = ty_declared(n, in, out, why, whylen);
    if (st) return st;
    const char *init = ir_attr_str(n, "init", "");
    int k = ir_init_lookup(init);
    if (k < 0)
        FAIL(ALLOY_ERR_INVALID,
             "unknown init \"%.64s\" (zeros, ones, constant, normal, uniform, kaiming_uniform, kaiming_normal, "
             "xavier_uniform or xavier_normal)", init);
    for (int i = 0; i < n->nattrs; i++) {
        const char *a = n->attrs[i].name;
        if (strcmp(a, "init") == 0 || strcmp(a, "frozen") == 0) continue;
        if (strcmp(a, "shard_of") == 0) { /* ZeRO-1: a 1-D state of ceil(numel(shard_of) / world) elements */
            int k2 = 0;
            const int64_t *d = ir_attr_ints(n, "shard_of", &k2);
            int64_t whole = 1;
            for (int j = 0; j < k2; j++) whole = d[j] >= 0 && whole <= INT64_MAX / (d[j] ? d[j] : 1) ? whole * d[j] : -1;
            if (n->op != IR_OP_state || out->rank != 1 || k2 > ALLOY_MAX_RANK || whole < 0 || out->dims[0] > whole + 1)
                FAIL(ALLOY_ERR_INVALID, "shard_of marks a 1-D state no longer than the tensor it is a shard of");
            continue;
        }
        bool reads = (inits[k].reads[0] && strcmp(a, inits[k].reads[0]) == 0) ||
                     (inits[k].reads[1] && strcmp(a, inits[k].reads[1]) == 0);
        if (!reads)
            FAIL(ALLOY_ERR_INVALID, "init \"%s\" does not read '%s' (it reads %s%s%s)", init, a,
                 inits[k].reads[0] ? inits[k].reads[0] : "no attribute", inits[k].reads[1] ? " and " : "",
                 inits[k].reads[1] ? inits[k].reads[1] : "");
    }
    if (inits[k].random && !ir_is_float(out->dtype))
        FAIL(ALLOY_ERR_DTYPE, "random init \"%s\" needs a floating-point dtype, not %s", init,
             alloy_dtype_name(out->dtype));
    /* NaN or an infinity in any number the init reads makes every element
     * NaN or inf; a constant must also be finite in the param's dtype */
    for (int r = 0; r < 2; r++) {
        const char *a = inits[k].reads[r];
        double v = a && ir_attr_find(n, a) ? ir_attr_f(n, a) : 0;
        if (!isfinite(v)) FAIL(ALLOY_ERR_INVALID, "init \"%s\": %s is %g; it must be finite", init, a, v);
    }
    double value = ir_attr_f(n, "value");
    if (k == IR_INIT_CONSTANT && !ir_value_fits(value, out->dtype))
        FAIL(ALLOY_ERR_INVALID, "init \"constant\": value %g does not fit %s (%s)", value, alloy_dtype_name(out->dtype),
             ir_is_float(out->dtype) ? "it rounds to inf" : "out of its range");
    return ALLOY_OK;
}

bool ir_value_fits(double v, alloy_dtype dtype)
{
    switch (dtype) {
    case ALLOY_F16: return isfinite(v) && (cvt_f64_to_f16(v) & 0x7c00) != 0x7c00;
    case ALLOY_BF16: return isfinite(v) && (cvt_f64_to_bf16(v) & 0x7f80) != 0x7f80;
    case ALLOY_F32: return isfinite(v) && isfinite((float)v);
    case ALLOY_F64: return isfinite(v);
    case ALLOY_I32: return v >= -2147483648.0 && v <= 2147483647.0;
    case ALLOY_I64: return v >= -9223372036854775808.0 && v < 9223372036854775808.0;
    case ALLOY_BOOL: return v == 0 || v == 1;
    default: return false;
    }
}

RULE(ty_constant)
{
    alloy_status st = ty_declared(n, in, out, why, whylen);
    if (st) return st;
    const ir_attr *value = ir_attr_find(n, "value"), *values = ir_attr_find(n, "values");
    if (!!value == !!values) FAIL(ALLOY_ERR_INVALID, "a constant needs exactly one of value= or values=");
    if (values && values->n != ir_numel(out))
        FAIL(ALLOY_ERR_SHAPE, "%d values for %lld elements", values->n, (long long)ir_numel(out));
    return ALLOY_OK;
}

/* An elementwise op's FLOAT attributes (leaky_relu's slope, clamp's
 * bounds) may be infinite but not NaN: a NaN bound or slope would turn
 * every value it touches into NaN with nothing to say where it came from. */
static alloy_status ew_attrs(const ir_node *n, char *why, size_t whylen)
{
    for (int i = 0; i < n->nattrs; i++)
        if (n->attrs[i].kind == IR_ATTR_FLOAT && isnan(n->attrs[i].f))
            FAIL(ALLOY_ERR_INVALID, "%s must be a number, not NaN", n->attrs[i].name);
    return ALLOY_OK;
}

RULE(ty_unary)
{
    if (in[0]->dtype == ALLOY_BOOL) FAIL(ALLOY_ERR_DTYPE, "operand must be numeric, not bool");
    if (ew_attrs(n, why, whylen)) return ALLOY_ERR_INVALID;
    *out = *in[0];
    return ALLOY_OK;
}

RULE(ty_unary_float)
{
    if (!ir_is_float(in[0]->dtype))
        FAIL(ALLOY_ERR_DTYPE, "operand must be floating point, not %s", alloy_dtype_name(in[0]->dtype));
    if (ew_attrs(n, why, whylen)) return ALLOY_ERR_INVALID;
    *out = *in[0];
    return ALLOY_OK;
}

static alloy_status broadcast_n(int nin, const ir_type *const *in, ir_type *out, char *why,
                                size_t whylen)
{
    *out = *in[0];
    for (int i = 1; i < nin; i++) {
        ir_type prev = *out; /* ir_broadcast_dims must not read what it writes */
        if (!ir_broadcast_dims(prev.rank, prev.dims, in[i]->rank, in[i]->dims, &out->rank, out->dims))
            FAIL(ALLOY_ERR_SHAPE, "shapes do not broadcast");
    }
    return ALLOY_OK;
}

RULE(ty_binary)
{
    if (in[0]->dtype != in[1]->dtype)
        FAIL(ALLOY_ERR_DTYPE, "operand dtypes differ (%s vs %s); insert a cast",
             alloy_dtype_name(in[0]->dtype), alloy_dtype_name(in[1]->dtype));
    if (in[0]->dtype == ALLOY_BOOL) FAIL(ALLOY_ERR_DTYPE, "operands must be numeric, not bool");
    if (ew_attrs(n, why, whylen)) return ALLOY_ERR_INVALID;
    return broadcast_n(2, in, out, why, whylen);
}

RULE(ty_binary_float)
{
    if (!ir_is_float(in[0]->dtype))
        FAIL(ALLOY_ERR_DTYPE, "operands must be floating point, not %s", alloy_dtype_name(in[0]->dtype));
    return ty_binary(n, in, out, why, whylen);
}

RULE(ty_compare)
{
    if (in[0]->dtype != in[1]->dtype)
        FAIL(ALLOY_ERR_DTYPE, "operand dtypes differ (%s vs %s)", alloy_dtype_name(in[0]->dtype),
             alloy_dtype_name(in[1]->dtype));
    alloy_status st = broadcast_n(2, in, out, why, whylen);
    out->dtype = ALLOY_BOOL;
    return st;
}

RULE(ty_where)
{
    if (in[0]->dtype != ALLOY_BOOL)
        FAIL(ALLOY_ERR_DTYPE, "condition must be bool, not %s", alloy_dtype_name(in[0]->dtype));
    if (in[1]->dtype != in[2]->dtype)
        FAIL(ALLOY_ERR_DTYPE, "branch dtypes differ (%s vs %s)", alloy_dtype_name(in[1]->dtype),
             alloy_dtype_name(in[2]->dtype));
    alloy_status st = broadcast_n(3, in, out, why, whylen);
    out->dtype = in[1]->dtype;
    return st;
}

RULE(ty_matmul)
{
    const ir_type *a = in[0], *b = in[1];
    if (a->dtype != b->dtype)
        FAIL(ALLOY_ERR_DTYPE, "operand dtypes differ (%s vs %s)", alloy_dtype_name(a->dtype),
             alloy_dtype_name(b->dtype));
    if (!ir_is_float(a->dtype)) FAIL(ALLOY_ERR_DTYPE, "operands must be floating point");
    if (a->rank < 2 || b->rank < 2) FAIL(ALLOY_ERR_SHAPE, "operands must have rank >= 2");
    bool ta = ir_attr_i(n, "transpose_a"), tb = ir_attr_i(n, "transpose_b");
    int64_t m = a->dims[a->rank - (ta ? 1 : 2)], ka = a->dims[a->rank - (ta ? 2 : 1)];
    int64_t kb = b->dims[b->rank - (tb ? 1 : 2)], nn = b->dims[b->rank - (tb ? 2 : 1)];
    if (ka != kb)
        FAIL(ALLOY_ERR_SHAPE, "inner dimensions differ: %lld vs %lld", (long long)ka, (long long)kb);
    int rb;
    int64_t batch[ALLOY_MAX_RANK];
    if (!ir_broadcast_dims(a->rank - 2, a->dims, b->rank - 2, b->dims, &rb, batch))
        FAIL(ALLOY_ERR_SHAPE, "batch dimensions do not broadcast");
    out->dtype = a->dtype;
    out->rank = rb + 2;
    memcpy(out->dims, batch, sizeof(int64_t) * (size_t)rb);
    out->dims[rb] = m;
    out->dims[rb + 1] = nn;
    return ALLOY_OK;
}

RULE(ty_reduce)
{
    const ir_type *x = in[0];
    if (x->dtype == ALLOY_BOOL) FAIL(ALLOY_ERR_DTYPE, "cannot reduce bool");
    int naxes;
    const int64_t *axes = ir_attr_ints(n, "axes", &naxes);
    bool keep = ir_attr_i(n, "keepdims");
    bool reduced[ALLOY_MAX_RANK] = {false};
    for (int i = 0; i < naxes; i++) {
        int ax;
        if (!ir_norm_axis(axes[i], x->rank, &ax))
            FAIL(ALLOY_ERR_INVALID, "axis %lld out of range for rank %d", (long long)axes[i], x->rank);
        if (reduced[ax]) FAIL(ALLOY_ERR_INVALID, "axis %d listed twice", ax);
        reduced[ax] = true;
    }
    if (!ir_attr_find(n, "axes"))
        for (int i = 0; i < x->rank; i++) reduced[i] = true;
    out->dtype = x->dtype;
    out->rank = 0;
    for (int i = 0; i < x->rank; i++) {
        if (!reduced[i]) out->dims[out->rank++] = x->dims[i];
        else if (keep) out->dims[out->rank++] = 1;
        else continue;
    }
    if (n->op == IR_OP_reduce_max) {
        for (int i = 0; i < x->rank; i++)
            if (reduced[i] && x->dims[i] == 0) FAIL(ALLOY_ERR_SHAPE, "reduce_max over an empty axis");
    }
    return ALLOY_OK;
}

/* argmax, argmin: x numeric [..., K, ...] -> i64 with `axis` removed (kept
 * as 1 with keepdims); the axis may not be empty (no index to give) */
RULE(ty_arg)
{
    const ir_type *x = in[0];
    int ax;
    if (x->dtype == ALLOY_BOOL) FAIL(ALLOY_ERR_DTYPE, "operand must be numeric, not bool");
    if (!ir_norm_axis(ir_attr_i(n, "axis"), x->rank, &ax))
        FAIL(ALLOY_ERR_INVALID, "axis %lld out of range for rank %d", (long long)ir_attr_i(n, "axis"), x->rank);
    if (x->dims[ax] == 0) FAIL(ALLOY_ERR_SHAPE, "axis %d is empty: there is no index to give", ax);
    bool keep = ir_attr_i(n, "keepdims");
    out->dtype = ALLOY_I64;
    out->rank = 0;
    for (int i = 0; i < x->rank; i++)
        if (i != ax) out->dims[out->rank++] = x->dims[i];
        else if (keep) out->dims[out->rank++] = 1;
    return ALLOY_OK;
}

/* one_hot: ids i32/i64 [...] -> the declared dtype [..., depth]: 1 at each id's column, else 0 */
RULE(ty_one_hot)
{
    const ir_type *ids = in[0];
    int64_t depth = ir_attr_i(n, "depth");
    if ((unsigned)out->dtype >= ALLOY_DTYPE_COUNT) FAIL(ALLOY_ERR_DTYPE, "unknown result dtype");
    if (depth < 1) FAIL(ALLOY_ERR_INVALID, "depth must be >= 1, not %lld", (long long)depth);
    if (!ir_is_int(ids->dtype)) FAIL(ALLOY_ERR_DTYPE, "ids must be i32 or i64, not %s", alloy_dtype_name(ids->dtype));
    if (ids->rank + 1 > ALLOY_MAX_RANK) FAIL(ALLOY_ERR_SHAPE, "result rank exceeds %d", ALLOY_MAX_RANK);
    out->rank = ids->rank + 1;
    memcpy(out->dims, ids->dims, sizeof(int64_t) * (size_t)ids->rank);
    out->dims[ids->rank] = depth;
    return ALLOY_OK;
}

RULE(ty_softmax)
{
    int ax;
    if (!ir_is_float(in[0]->dtype)) FAIL(ALLOY_ERR_DTYPE, "operand must be floating point");
    if (!ir_norm_axis(ir_attr_i(n, "axis"), in[0]->rank, &ax))
        FAIL(ALLOY_ERR_INVALID, "axis %lld out of range for rank %d",
             (long long)ir_attr_i(n, "axis"), in[0]->rank);
    *out = *in[0];
    return ALLOY_OK;
}

RULE(ty_layer_norm)
{
    const ir_type *x = in[0];
    if (!ir_is_float(x->dtype)) FAIL(ALLOY_ERR_DTYPE, "input must be floating point");
    if (x->rank < 1) FAIL(ALLOY_ERR_SHAPE, "input must have rank >= 1");
    if (n->nin == 2) FAIL(ALLOY_ERR_INVALID, "give both gamma and beta, or neither");
    int64_t d = x->dims[x->rank - 1];
    for (int i = 1; i < n->nin; i++) {
        if (in[i]->rank != 1 || in[i]->dims[0] != d)
            FAIL(ALLOY_ERR_SHAPE, "%s must have shape [%lld]", i == 1 ? "gamma" : "beta", (long long)d);
        if (in[i]->dtype != x->dtype)
            FAIL(ALLOY_ERR_DTYPE, "%s dtype %s differs from input %s", i == 1 ? "gamma" : "beta",
                 alloy_dtype_name(in[i]->dtype), alloy_dtype_name(x->dtype));
    }
    CHECK_EPS(n);
    *out = *x;
    return ALLOY_OK;
}

/* (x[, gamma]) -> x's type: gamma, when given, is [C] of x's dtype */
RULE(ty_rms_norm)
{
    const ir_type *x = in[0];
    if (!ir_is_float(x->dtype)) FAIL(ALLOY_ERR_DTYPE, "input must be floating point");
    if (x->rank < 1) FAIL(ALLOY_ERR_SHAPE, "input must have rank >= 1");
    int64_t d = x->dims[x->rank - 1];
    if (n->nin == 2 && (in[1]->rank != 1 || in[1]->dims[0] != d))
        FAIL(ALLOY_ERR_SHAPE, "gamma must have shape [%lld]", (long long)d);
    if (n->nin == 2 && in[1]->dtype != x->dtype)
        FAIL(ALLOY_ERR_DTYPE, "gamma dtype %s differs from input %s", alloy_dtype_name(in[1]->dtype),
             alloy_dtype_name(x->dtype));
    CHECK_EPS(n);
    *out = *x;
    return ALLOY_OK;
}

RULE(ty_cross_entropy)
{
    const ir_type *logits = in[0], *target = in[1];
    if (!ir_is_float(logits->dtype)) FAIL(ALLOY_ERR_DTYPE, "logits must be floating point");
    if (!ir_is_int(target->dtype)) FAIL(ALLOY_ERR_DTYPE, "targets must be i32 or i64");
    if (logits->rank < 1 || target->rank != logits->rank - 1)
        FAIL(ALLOY_ERR_SHAPE, "targets must have the logits' shape without the class axis");
    for (int i = 0; i < target->rank; i++)
        if (target->dims[i] != logits->dims[i])
            FAIL(ALLOY_ERR_SHAPE, "targets dim %d is %lld, logits have %lld", i,
                 (long long)target->dims[i], (long long)logits->dims[i]);
    if (ir_loss_attrs(n, logits, n->nin > 2 ? in[2] : NULL, why, whylen)) return ALLOY_ERR_INVALID;
    out->dtype = logits->dtype;
    out->rank = 0;
    return ALLOY_OK;
}

RULE(ty_embedding)
{
    const ir_type *ids = in[0], *table = in[1];
    if (!ir_is_int(ids->dtype)) FAIL(ALLOY_ERR_DTYPE, "ids must be i32 or i64");
    if (table->rank != 2) FAIL(ALLOY_ERR_SHAPE, "table must have rank 2 [rows, dim]");
    if (ids->rank + 1 > ALLOY_MAX_RANK) FAIL(ALLOY_ERR_SHAPE, "result rank exceeds %d", ALLOY_MAX_RANK);
    out->dtype = table->dtype;
    out->rank = ids->rank + 1;
    memcpy(out->dims, ids->dims, sizeof(int64_t) * (size_t)ids->rank);
    out->dims[ids->rank] = table->dims[1];
    return ALLOY_OK;
}

RULE(ty_reshape)
{
    if (!dims_ok(out)) FAIL(ALLOY_ERR_SHAPE, "target shape has a negative or overflowing dim");
    if (ir_numel(out) != ir_numel(in[0]))
        FAIL(ALLOY_ERR_SHAPE, "element counts differ: %lld vs %lld", (long long)ir_numel(in[0]),
             (long long)ir_numel(out));
    out->dtype = in[0]->dtype;
    return ALLOY_OK;
}

RULE(ty_transpose)
{
    int np;
    const int64_t *perm = ir_attr_ints(n, "perm", &np);
    if (np != in[0]->rank) FAIL(ALLOY_ERR_INVALID, "perm has %d entries for rank %d", np, in[0]->rank);
    bool seen[ALLOY_MAX_RANK] = {false};
    out->dtype = in[0]->dtype;
    out->rank = np;
    for (int i = 0; i < np; i++) {
        if (perm[i] < 0 || perm[i] >= np || seen[perm[i]])
            FAIL(ALLOY_ERR_INVALID, "perm is not a permutation of 0..%d", np - 1);
        seen[perm[i]] = true;
        out->dims[i] = in[0]->dims[perm[i]];
    }
    return ALLOY_OK;
}

RULE(ty_broadcast_to)
{
    int r;
    int64_t dims[ALLOY_MAX_RANK];
    if (!dims_ok(out)) FAIL(ALLOY_ERR_SHAPE, "target shape has a negative or overflowing dim");
    if (in[0]->rank > out->rank || !ir_broadcast_dims(in[0]->rank, in[0]->dims, out->rank, out->dims, &r, dims) ||
        memcmp(dims, out->dims, sizeof(int64_t) * (size_t)r) != 0)
        FAIL(ALLOY_ERR_SHAPE, "operand does not broadcast to the target shape");
    out->dtype = in[0]->dtype;
    return ALLOY_OK;
}

RULE(ty_slice)
{
    int ax;
    if (!ir_norm_axis(ir_attr_i(n, "axis"), in[0]->rank, &ax))
        FAIL(ALLOY_ERR_INVALID, "axis %lld out of range for rank %d", (long long)ir_attr_i(n, "axis"),
             in[0]->rank);
    int64_t start = ir_attr_i(n, "start"), end = ir_attr_i(n, "end");
    if (start < 0 || end < start || end > in[0]->dims[ax])
        FAIL(ALLOY_ERR_INVALID, "range [%lld, %lld) is not within [0, %lld] of axis %d",
             (long long)start, (long long)end, (long long)in[0]->dims[ax], ax);
    *out = *in[0];
    out->dims[ax] = end - start;
    return ALLOY_OK;
}

RULE(ty_concat)
{
    int ax;
    if (!ir_norm_axis(ir_attr_i(n, "axis"), in[0]->rank, &ax))
        FAIL(ALLOY_ERR_INVALID, "axis %lld out of range for rank %d", (long long)ir_attr_i(n, "axis"),
             in[0]->rank);
    *out = *in[0];
    out->dims[ax] = 0;
    for (int i = 0; i < n->nin; i++) {
        if (in[i]->dtype != in[0]->dtype) FAIL(ALLOY_ERR_DTYPE, "operand %d dtype differs", i);
        if (in[i]->rank != in[0]->rank) FAIL(ALLOY_ERR_SHAPE, "operand %d rank differs", i);
        for (int d = 0; d < in[0]->rank; d++)
            if (d != ax && in[i]->dims[d] != in[0]->dims[d])
                FAIL(ALLOY_ERR_SHAPE, "operand %d dim %d is %lld, expected %lld", i, d,
                     (long long)in[i]->dims[d], (long long)in[0]->dims[d]);
        if (in[i]->dims[ax] > INT64_MAX - out->dims[ax]) FAIL(ALLOY_ERR_SHAPE, "concatenated dim overflows");
        out->dims[ax] += in[i]->dims[ax];
    }
    return ALLOY_OK;
}

RULE(ty_causal_mask)
{
    if (!ir_is_float(in[0]->dtype)) FAIL(ALLOY_ERR_DTYPE, "operand must be floating point");
    if (in[0]->rank < 2) FAIL(ALLOY_ERR_SHAPE, "operand must have rank >= 2 [..., queries, keys]");
    if (in[0]->dims[in[0]->rank - 2] > in[0]->dims[in[0]->rank - 1])
        FAIL(ALLOY_ERR_SHAPE, "more queries than keys");
    *out = *in[0];
    return ALLOY_OK;
}

RULE(ty_cast)
{
    if ((unsigned)out->dtype >= ALLOY_DTYPE_COUNT) FAIL(ALLOY_ERR_DTYPE, "unknown target dtype");
    alloy_dtype dt = out->dtype;
    *out = *in[0];
    out->dtype = dt;
    return ALLOY_OK;
}

RULE(ty_ternary)
{
    for (int i = 1; i < 3; i++)
        if (in[i]->dtype != in[0]->dtype)
            FAIL(ALLOY_ERR_DTYPE, "operand dtypes differ (%s vs %s)", alloy_dtype_name(in[0]->dtype),
                 alloy_dtype_name(in[i]->dtype));
    if (!ir_is_float(in[0]->dtype)) FAIL(ALLOY_ERR_DTYPE, "operands must be floating point");
    return broadcast_n(3, in, out, why, whylen);
}

/* zero padding along one axis */
RULE(ty_pad)
{
    int ax;
    if (!ir_norm_axis(ir_attr_i(n, "axis"), in[0]->rank, &ax))
        FAIL(ALLOY_ERR_INVALID, "axis out of range for rank %d", in[0]->rank);
    int64_t before = ir_attr_i(n, "before"), after = ir_attr_i(n, "after");
    if (before < 0 || after < 0) FAIL(ALLOY_ERR_INVALID, "padding must be >= 0");
    if (before > INT64_MAX - in[0]->dims[ax] - after) FAIL(ALLOY_ERR_SHAPE, "padded dim overflows");
    *out = *in[0];
    out->dims[ax] += before + after;
    return ALLOY_OK;
}

RULE(ty_isfinite)
{
    if (!ir_is_float(in[0]->dtype)) FAIL(ALLOY_ERR_DTYPE, "operand must be floating point");
    *out = *in[0];
    out->dtype = ALLOY_BOOL;
    return ALLOY_OK;
}
