/* test_evaluate.c - passes/evaluate.c against the CPU executor, bit for bit, on random and special values. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "passes/evaluate.h"
#include "base/convert.h"
#include "runtime/cpu/cpu.h"
#include "support.h"


/* What random operands hold besides ordinary values (floats of magnitude
 * 2^-10..2^10, integers in [-100, 100), bools). */
enum {
    SPECIAL = 1,  /* inf, -inf, NaN, -0, values that overflow f16/bf16/f32, subnormals, integer extremes */
    WIDE_I64 = 2, /* i64 values a double cannot hold (only where the CPU too reads them as doubles) */
    IDS = 4,      /* integers are ids in [0, 5), never SPECIAL */
};

static const alloy_dtype all_dtypes[] = {F32, F16, BF16, F64, I32, I64, BOOL};
static bool covered[IR_OP_COUNT]; /* the ops compared at least once */

/* A shape of up to rank 4. */
typedef struct shape {
    int rank;
    int64_t d[4];
} shape;

static ir_type ty(alloy_dtype dt, shape s)
{
    ir_type t = {.dtype = dt, .rank = s.rank};
    memcpy(t.dims, s.d, sizeof(int64_t) * (size_t)s.rank);
    return t;
}

/* One random element of dtype dt, as stored, at p. */
static void random_element(alloy_dtype dt, int mode, unsigned char *p)
{
    static const double specials[] = {INFINITY, -INFINITY, NAN, -NAN, -0.0, 0.0, 65504, 65520, 7e4, -1e6,
                                      3.4e38, -1e39, 6e-8, 1e-40, 5e-324};
    static const int64_t extremes[] = {INT32_MAX, INT32_MIN, 0, (INT64_C(1) << 40) + 1, -(INT64_C(1) << 40)};
    static const int64_t wide[] = {INT64_MAX, INT64_MIN, (INT64_C(1) << 62) + 1, -(INT64_C(1) << 53) - 1};
    double u = test_uniform(0, 1), v = ldexp(test_uniform(-1, 1), (int)floor(test_uniform(-10, 11)));
    int pick = (int)test_uniform(0, 60); /* which special value */
    if (dt == BOOL) {
        *p = u < 0.5;
    } else if (ir_is_int(dt)) {
        int64_t i = (int64_t)floor((mode & IDS) ? test_uniform(0, 5) : test_uniform(-100, 100));
        if ((mode & SPECIAL) && !(mode & IDS) && u < 0.1) i = extremes[pick % (dt == I32 ? 3 : 5)];
        if ((mode & WIDE_I64) && dt == I64 && u > 0.9) i = wide[pick % 4];
        int32_t i32 = (int32_t)i;
        if (dt == I32) memcpy(p, &i32, 4);
        else memcpy(p, &i, 8);
    } else {
        if ((mode & SPECIAL) && u < 0.15) v = specials[pick % 15];
        cvt_store_f64(dt, &v, p, 1);
    }
}

/* "op(f16[2,3], f16[3]) -> f16[2,3]" into buf. */
static void describe(char *buf, size_t len, const ir_node *n, const ir_type *t)
{
    char s[64];
    size_t at = (size_t)snprintf(buf, len, "%s(", ir_ops[n->op].name);
    for (int j = 0; j < n->nin && at < len; j++) {
        ir_fmt_type(s, sizeof s, &t[j]);
        at += (size_t)snprintf(buf + at, len - at, "%s%s", j ? ", " : "", s);
    }
    ir_fmt_type(s, sizeof s, &n->type);
    if (at < len) snprintf(buf + at, len - at, ") -> %s", s);
}

/* Asserts that got (eval_node's doubles) stores into dtype dt as the CPU's
 * bytes at cpu, element by element (two NaNs count as equal), and that each
 * double is one the dtype holds: a store and a load give it back. */
static void expect_same_bits(alloy_dtype dt, const void *cpu, const double *got, int64_t count,
                             const char *what)
{
    size_t es = alloy_dtype_size(dt);
    for (int64_t i = 0; i < count; i++) {
        const unsigned char *ref = (const unsigned char *)cpu + (size_t)i * es;
        unsigned char mine[8];
        double back, want;
        cvt_store_f64(dt, &got[i], mine, 1);
        cvt_load_f64(dt, mine, &back, 1);
        cvt_load_f64(dt, ref, &want, 1);
        if (isnan(want) && isnan(got[i])) continue;
        if (memcmp(mine, ref, es) != 0)
            fail_msg("%s: element %lld is %a, the CPU has %a", what, (long long)i, got[i], want);
        if (memcmp(&back, &got[i], sizeof back) != 0)
            fail_msg("%s: element %lld, %a, is not a %s value", what, (long long)i, got[i],
                     alloy_dtype_name(dt));
    }
}

/* Builds inputs of types t[0..nin) holding random values (mode), feeding
 * one `op` node; runs it with cpu_run_graph and with eval_node and asserts
 * the same status, the same bits, or the same error message. Returns false,
 * comparing nothing, when the op's type rule refuses these operands. */
static bool check_op(int op, int nin, const ir_type *t, int nattrs, const ir_attr *attrs,
                     const ir_type *declared, int mode)
{
    ir_graph *g = ir_graph_new("eval");
    assert_non_null(g);
    int ids[8];
    for (int j = 0; j < nin; j++) {
        ir_node *input = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &t[j], NULL);
        if (!input) fail_msg("input %d: %s", j, g->error);
        ids[j] = input->id;
    }
    ir_node *n = ir_add_node(g, op, nin, ids, nattrs, attrs, declared, "under_test");
    if (!n) {
        assert_true(g->status == ALLOY_ERR_DTYPE || g->status == ALLOY_ERR_SHAPE);
        ir_graph_free(g);
        return false;
    }
    covered[op] = true;
    char what[512], why[512] = "";
    describe(what, sizeof what, n, t);
    rt_tensor *values = test_calloc((size_t)g->nnodes, sizeof *values);
    const ir_type *types[8];
    double *in[8];
    for (int j = 0; j < nin; j++) {
        int64_t count = ir_numel(&t[j]);
        size_t es = alloy_dtype_size(t[j].dtype);
        values[j].data = test_malloc(ir_nbytes(&t[j]) + 1);
        in[j] = test_malloc(sizeof(double) * (size_t)(count + 1));
        for (int64_t i = 0; i < count; i++)
            random_element(t[j].dtype, mode, (unsigned char *)values[j].data + i * es);
        cvt_load_f64(t[j].dtype, values[j].data, in[j], (size_t)count);
        types[j] = &t[j];
    }
    cpu_exec x = {.nthreads = 1};
    alloy_status want = cpu_run_graph(&x, g, values, NULL);
    int64_t count = ir_numel(&n->type);
    double *out = test_malloc(sizeof(double) * (size_t)(count + 1));
    alloy_status got = eval_node(n, types, (const double *const *)in, out, why, sizeof why);
    if (got != want)
        fail_msg("%s: eval_node gave status %d (%s), the CPU %d (%s)", what, got, why, want, x.error);
    if (want == ALLOY_OK) expect_same_bits(n->type.dtype, values[n->id].data, out, count, what);
    else assert_string_equal(why, x.error);
    test_free(out);
    for (int j = 0; j < nin; j++) test_free(values[j].data), test_free(in[j]);
    cpu_release_values(g, values);
    test_free(values);
    ir_graph_free(g);
    return true;
}

/* ---- elementwise ---- */

/* Operand shapes (a unary op takes the first, a binary one the first two). */
static const shape ew_shapes[][3] = {
    {{0, {0}}, {0, {0}}, {0, {0}}},
    {{2, {3, 4}}, {2, {3, 4}}, {2, {3, 4}}},
    {{3, {2, 3, 4}}, {1, {4}}, {1, {1}}},
    {{3, {2, 1, 4}}, {2, {3, 1}}, {3, {1, 1, 4}}},
    {{2, {0, 3}}, {2, {1, 3}}, {1, {3}}},
    {{1, {5}}, {0, {0}}, {2, {1, 5}}},
    {{2, {2, 1100}}, {2, {1, 1100}}, {0, {0}}},
};
enum { N_EW_SHAPES = sizeof ew_shapes / sizeof ew_shapes[0] };

static void test_elementwise_ops_match_the_cpu_in_every_dtype_and_broadcast(void **state)
{
    (void)state;
    for (int op = 0; op < IR_OP_COUNT; op++) {
        if (!ir_ops[op].elementwise) continue;
        int runs = 0, nin = ir_ops[op].min_in;
        for (size_t k = 0; k < sizeof all_dtypes / sizeof all_dtypes[0]; k++) {
            for (int s = 0; s < N_EW_SHAPES; s++) {
                ir_type t[3];
                for (int j = 0; j < nin; j++) t[j] = ty(all_dtypes[k], ew_shapes[s][j]);
                if (op == IR_OP_where) t[0].dtype = BOOL;
                runs += check_op(op, nin, t, 0, NULL, NULL, SPECIAL | WIDE_I64);
                runs += check_op(op, nin, t, 0, NULL, NULL, 0);
            }
        }
        /* every op takes at least the floating dtypes */
        if (runs < 2 * 4 * N_EW_SHAPES) fail_msg("%s ran only %d times", ir_ops[op].name, runs);
    }
}

/* The ops whose expression reads attributes (P(k)), with values other
 * than the defaults: negative and zero slopes, a bound only on one side,
 * crossed bounds, bounds that are not f32 values (0.1 rounds to T). */
static void test_elementwise_attributes_reach_the_folded_value_as_the_cpu_reads_them(void **state)
{
    (void)state;
    static const struct {
        const char *op;
        int n;
        ir_attr a[2];
    } cases[] = {
        {"leaky_relu", 1, {{"negative_slope", IR_ATTR_FLOAT, .f = 0.2}}},
        {"leaky_relu", 1, {{"negative_slope", IR_ATTR_FLOAT, .f = -1.5}}},
        {"leaky_relu_grad", 1, {{"negative_slope", IR_ATTR_FLOAT, .f = 0.1}}},
        {"elu", 1, {{"alpha", IR_ATTR_FLOAT, .f = 0.3}}},
        {"elu_grad", 1, {{"alpha", IR_ATTR_FLOAT, .f = 2.5}}},
        {"clamp", 2, {{"min", IR_ATTR_FLOAT, .f = -0.1}, {"max", IR_ATTR_FLOAT, .f = 0.7}}},
        {"clamp", 1, {{"max", IR_ATTR_FLOAT, .f = 0.1}}},
        {"clamp", 2, {{"min", IR_ATTR_FLOAT, .f = 1}, {"max", IR_ATTR_FLOAT, .f = -1}}},
        {"clamp_grad", 2, {{"min", IR_ATTR_FLOAT, .f = -0.5}, {"max", IR_ATTR_FLOAT, .f = 0.1}}},
        {"smooth_l1_loss", 1, {{"beta", IR_ATTR_FLOAT, .f = 0.3}}},
        {"smooth_l1_loss", 1, {{"beta", IR_ATTR_FLOAT, .f = 0}}},
        {"smooth_l1_loss_grad", 1, {{"beta", IR_ATTR_FLOAT, .f = 0.1}}},
        {"binary_cross_entropy_with_logits_grad", 1, {{.name = "operand", .kind = IR_ATTR_INT, .i = 1}}},
        {"binary_cross_entropy_with_logits_grad", 1, {{.name = "operand", .kind = IR_ATTR_INT, .i = 2}}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int op = ir_op_lookup(cases[i].op), nin = ir_ops[op].min_in, runs = 0;
        for (size_t k = 0; k < sizeof all_dtypes / sizeof all_dtypes[0]; k++)
            for (int s = 0; s < N_EW_SHAPES; s++) {
                ir_type t[3];
                for (int j = 0; j < nin; j++) t[j] = ty(all_dtypes[k], ew_shapes[s][j]);
                runs += check_op(op, nin, t, cases[i].n, cases[i].a, NULL, SPECIAL | WIDE_I64);
                runs += check_op(op, nin, t, cases[i].n, cases[i].a, NULL, 0);
            }
        if (runs < 2 * 4 * N_EW_SHAPES) fail_msg("%s ran only %d times", cases[i].op, runs);
    }
}

/* ---- cast ---- */

static void test_cast_between_every_pair_of_dtypes_matches_the_cpu(void **state)
{
    (void)state;
    static const shape shapes[] = {{2, {3, 50}}, {0, {0}}, {2, {0, 2}}};
    for (size_t a = 0; a < 7; a++)
        for (size_t b = 0; b < 7; b++)
            for (int s = 0; s < 3; s++) {
                ir_type from = ty(all_dtypes[a], shapes[s]), to = ty(all_dtypes[b], shapes[s]);
                /* an i64 -> i64 cast copies: its values must survive doubles */
                int mode = SPECIAL | (a == b ? 0 : WIDE_I64);
                assert_true(check_op(IR_OP_cast, 1, &from, 0, NULL, &to, mode));
            }
}

/* ---- data movement ---- */

/* Runs op on operands of shapes s[0..nin) in every dtype; returns how many ran. */
static int check_all_dtypes(int op, int nin, const shape *s, int nattrs, const ir_attr *attrs,
                            const shape *declared)
{
    int runs = 0;
    for (size_t k = 0; k < 7; k++) {
        ir_type t[4], d = declared ? ty(all_dtypes[k], *declared) : (ir_type){0};
        for (int j = 0; j < nin; j++) t[j] = ty(all_dtypes[k], s[j]);
        runs += check_op(op, nin, t, nattrs, attrs, declared ? &d : NULL, SPECIAL);
    }
    return runs;
}

static void test_reshape_broadcast_to_and_transpose_match_the_cpu(void **state)
{
    (void)state;
    static const shape reshapes[][2] = {
        {{3, {2, 3, 4}}, {2, {4, 6}}}, {{2, {2, 0}}, {2, {0, 5}}}, {{0, {0}}, {2, {1, 1}}}};
    for (int c = 0; c < 3; c++)
        assert_int_equal(check_all_dtypes(IR_OP_reshape, 1, &reshapes[c][0], 0, NULL, &reshapes[c][1]), 7);
    static const shape broadcasts[][2] = {{{2, {3, 1}}, {3, {2, 3, 4}}}, {{0, {0}}, {2, {2, 2}}},
                                          {{1, {4}}, {2, {3, 4}}},      {{1, {1}}, {1, {0}}},
                                          {{3, {1, 3, 1}}, {4, {2, 1, 3, 5}}}};
    for (int c = 0; c < 5; c++)
        assert_int_equal(
            check_all_dtypes(IR_OP_broadcast_to, 1, &broadcasts[c][0], 0, NULL, &broadcasts[c][1]), 7);
    static const struct {
        shape s;
        int64_t perm[4];
    } transposes[] = {{{3, {2, 3, 4}}, {2, 0, 1}}, {{3, {2, 3, 4}}, {1, 0, 2}}, {{3, {2, 3, 4}}, {0, 1, 2}},
                      {{4, {2, 1, 3, 5}}, {3, 1, 0, 2}}, {{2, {40, 33}}, {1, 0}}, {{2, {0, 3}}, {1, 0}}};
    for (int c = 0; c < 6; c++) {
        ir_attr perm = ir_a_ints("perm", transposes[c].s.rank, transposes[c].perm);
        assert_int_equal(check_all_dtypes(IR_OP_transpose, 1, &transposes[c].s, 1, &perm, NULL), 7);
    }
}

static void test_slice_pad_and_concat_match_the_cpu_along_any_axis(void **state)
{
    (void)state;
    static const shape x = {3, {4, 5, 6}}, y = {2, {3, 4}}, empty = {2, {2, 0}};
    static const int64_t slices[][3] = {{1, 1, 4}, {-1, 0, 6}, {0, 2, 2}, {-3, 3, 4}};
    for (int c = 0; c < 4; c++) {
        ir_attr a[3] = {ir_a_int("axis", slices[c][0]), ir_a_int("start", slices[c][1]),
                        ir_a_int("end", slices[c][2])};
        assert_int_equal(check_all_dtypes(IR_OP_slice, 1, &x, 3, a, NULL), 7);
    }
    static const int64_t pads[][3] = {{0, 1, 2}, {-1, 0, 3}, {1, 2, 1}, {0, 0, 0}};
    for (int c = 0; c < 4; c++) {
        ir_attr a[3] = {ir_a_int("axis", pads[c][0]), ir_a_int("before", pads[c][1]),
                        ir_a_int("after", pads[c][2])};
        assert_int_equal(check_all_dtypes(IR_OP_pad, 1, &y, 3, a, NULL), 7);
        assert_int_equal(check_all_dtypes(IR_OP_pad, 1, &empty, 3, a, NULL), 7);
    }
    static const struct {
        int axis, nin;
        shape s[3];
    } concats[] = {{0, 3, {{2, {2, 3}}, {2, {1, 3}}, {2, {0, 3}}}},
                   {-1, 3, {{2, {2, 3}}, {2, {2, 1}}, {2, {2, 4}}}},
                   {1, 2, {{3, {2, 0, 3}}, {3, {2, 2, 3}}}},
                   {0, 1, {{1, {5}}}}};
    for (int c = 0; c < 4; c++) {
        ir_attr a = ir_a_int("axis", concats[c].axis);
        assert_int_equal(check_all_dtypes(IR_OP_concat, concats[c].nin, concats[c].s, 1, &a, NULL), 7);
    }
}

static void test_embedding_gathers_rows_like_the_cpu(void **state)
{
    (void)state;
    static const shape ids[] = {{2, {2, 3}}, {0, {0}}, {1, {0}}, {3, {2, 2, 4}}};
    static const shape tables[] = {{2, {5, 4}}, {2, {6, 0}}, {2, {5, 1}}};
    for (int i = 0; i < 4; i++)
        for (int tb = 0; tb < 3; tb++)
            for (int id_dt = 0; id_dt < 2; id_dt++)
                for (size_t k = 0; k < 7; k++) {
                    ir_type t[2] = {ty(id_dt ? I64 : I32, ids[i]), ty(all_dtypes[k], tables[tb])};
                    assert_true(check_op(IR_OP_embedding, 2, t, 0, NULL, NULL, IDS | SPECIAL));
                }
}

static void test_embedding_rejects_an_id_out_of_range_with_the_cpu_message(void **state)
{
    (void)state;
    /* ids in [0, 5) against 3 rows: the CPU fails, and eval_node with the same words */
    for (int round = 0; round < 10; round++) {
        ir_type t[2] = {ty(round % 2 ? I64 : I32, (shape){2, {4, 4}}), ty(F32, (shape){2, {3, 2}})};
        assert_true(check_op(IR_OP_embedding, 2, t, 0, NULL, NULL, IDS));
    }
    /* and directly: id 7 at position [1] of 3 rows */
    ir_type ids = ty(I64, (shape){1, {2}}), table = ty(F32, (shape){2, {3, 2}});
    ir_node n = {.id = 4, .op = IR_OP_embedding, .nin = 2, .type = ty(F32, (shape){2, {2, 2}})};
    const ir_type *types[2] = {&ids, &table};
    const double id_values[2] = {2, 7}, rows[6] = {1, 2, 3, 4, 5, 6};
    const double *in[2] = {id_values, rows};
    double out[4];
    char why[256] = "";
    assert_int_equal(eval_node(&n, types, in, out, why, sizeof why), ALLOY_ERR_INVALID);
    assert_string_equal(why, "embedding '%4': id 7 out of range [0, 3) at position [1]");
}

/* gather and index_select along each axis, every dtype, ids in [0, 5):
 * against an axis of 5 the CPU's values, against one of 3 its error too;
 * arange in every numeric dtype; cumsum along each axis, both ways, with
 * inf, NaN and integer extremes (saturating sums). */
static void test_indexing_ops_and_cumsum_match_the_cpu(void **state)
{
    (void)state;
    for (size_t k = 0; k < 7; k++)
        for (int axis = 0; axis < 3; axis++)
            for (int id_dt = 0; id_dt < 2; id_dt++) {
                shape xs = {3, {4, 5, 3}}, gs = {3, {3, 2, 2}}, ss = {1, {6}};
                xs.d[axis] = axis == 1 ? 5 : 3; /* ids past 3 are out of range on the other axes */
                gs.d[axis] = 4;
                ir_type tg[2] = {ty(all_dtypes[k], xs), ty(id_dt ? I64 : I32, gs)};
                ir_type ts[2] = {ty(all_dtypes[k], xs), ty(id_dt ? I64 : I32, ss)};
                ir_attr a = ir_a_int("axis", axis - 3 * (axis == 2));
                check_op(IR_OP_gather, 2, tg, 1, &a, NULL, IDS | SPECIAL);
                check_op(IR_OP_index_select, 2, ts, 1, &a, NULL, IDS | SPECIAL);
                ir_attr c[2] = {ir_a_int("axis", axis), ir_a_bool("reverse", id_dt)};
                check_op(IR_OP_cumsum, 1, tg, 2, c, NULL, SPECIAL);
            }
    for (size_t k = 0; k < 7; k++) {
        ir_type declared = ty(all_dtypes[k], (shape){0, {0}});
        ir_attr a[3] = {ir_a_float("start", -2.5), ir_a_float("end", 40000), ir_a_float("step", 3.7)};
        check_op(IR_OP_arange, 0, NULL, 3, a, &declared, 0);
    }
    assert_true(covered[IR_OP_gather] && covered[IR_OP_index_select] && covered[IR_OP_cumsum] && covered[IR_OP_arange]);
}

/* ---- reductions ---- */

static const struct {
    shape s;
    int naxes; /* -1: no axes attribute (all axes) */
    int64_t axes[3];
} reduce_cases[] = {
    {{3, {2, 3, 4}}, -1, {0}},        {{3, {2, 3, 4}}, 0, {0}},         {{3, {2, 3, 4}}, 1, {-1}},
    {{3, {2, 3, 4}}, 1, {0}},         {{3, {2, 3, 4}}, 2, {0, 2}},      {{3, {2, 3, 4}}, 2, {-3, -2}},
    {{3, {3, 1, 5}}, 1, {1}},         {{2, {40, 37}}, 1, {0}},          {{2, {37, 40}}, 1, {1}},
    {{2, {20, 300}}, 1, {0}},         {{1, {600}}, -1, {0}},            {{4, {2, 20, 3, 20}}, 2, {1, 3}},
    {{4, {2, 20, 3, 20}}, 2, {0, 2}}, {{4, {20, 2, 20, 3}}, 2, {2, 0}}, {{4, {3, 17, 1, 40}}, 3, {3, 0, 2}},
    {{2, {0, 4}}, 1, {0}},            {{2, {3, 0}}, 1, {0}},            {{0, {0}}, -1, {0}},
};

/* Whether reduce_cases[c] reduces an axis of size 0 (which reduce_max refuses). */
static bool reduces_an_empty_axis(size_t c)
{
    const shape *s = &reduce_cases[c].s;
    bool empty = false;
    for (int i = 0; i < reduce_cases[c].naxes; i++) {
        int64_t ax = reduce_cases[c].axes[i];
        empty |= s->d[ax < 0 ? ax + s->rank : ax] == 0;
    }
    return empty;
}

static void test_reductions_match_the_cpu_on_both_of_its_paths(void **state)
{
    (void)state;
    static const int ops[] = {IR_OP_reduce_sum, IR_OP_reduce_mean, IR_OP_reduce_max};
    for (size_t c = 0; c < sizeof reduce_cases / sizeof reduce_cases[0]; c++)
        for (int keep = 0; keep < 2; keep++)
            for (int o = 0; o < 3; o++)
                for (int mode = 0; mode < 2; mode++) {
                    int naxes = reduce_cases[c].naxes, runs = 0;
                    ir_attr a[2] = {ir_a_bool("keepdims", keep),
                                    ir_a_ints("axes", naxes < 0 ? 0 : naxes, reduce_cases[c].axes)};
                    for (size_t k = 0; k < 7; k++) {
                        ir_type t = ty(all_dtypes[k], reduce_cases[c].s);
                        runs += check_op(ops[o], 1, &t, naxes < 0 ? 1 : 2, a, NULL, mode ? SPECIAL : 0);
                    }
                    /* every dtype but bool */
                    bool refused = ops[o] == IR_OP_reduce_max && reduces_an_empty_axis(c);
                    assert_int_equal(runs, refused ? 0 : 6);
                }
}

/* Integer sums are f64 sums stored truncated and saturated, on the CPU and
 * here alike (docs/ir.md, "Integer arithmetic"): 2^53 + 1 rounds to 2^53,
 * and 2^62 * 3 saturates. */
static void test_reduce_sum_of_i64_computes_in_f64_and_saturates(void **state)
{
    (void)state;
    ir_type x = ty(I64, (shape){1, {3}});
    ir_node n = {.op = IR_OP_reduce_sum, .nin = 1, .type = ty(I64, (shape){0, {0}})};
    const ir_type *types[1] = {&x};
    const double ok_values[3] = {0x1p53, -1, 0}, round_values[3] = {0x1p53, 1, 0}, big_values[3] = {0x1p62, 0x1p62, 0x1p62};
    const double *in[1] = {ok_values};
    double out[1];
    char why[256] = "";
    assert_int_equal(eval_node(&n, types, in, out, why, sizeof why), ALLOY_OK);
    assert_true(out[0] == 0x1p53 - 1);
    in[0] = round_values;
    assert_int_equal(eval_node(&n, types, in, out, why, sizeof why), ALLOY_OK);
    assert_true(out[0] == 0x1p53);
    in[0] = big_values; /* INT64_MAX, which is 2^63 as a double */
    assert_int_equal(eval_node(&n, types, in, out, why, sizeof why), ALLOY_OK);
    assert_true(out[0] == 0x1p63);
}

/* The scratch copies eval_node makes (f32 and i64 operands and results of a
 * reduction, f32 running sums, the kernel's own gathered terms) fail as
 * ALLOY_ERR_OOM naming the op, each allocation in turn, and leak nothing;
 * with every allocation granted the values are the hand-worked ones. */
static void test_scratch_that_cannot_be_had_is_out_of_memory_naming_the_op(void **state)
{
    (void)state;
    ir_type x = ty(F16, (shape){3, {2, 3, 2}}), f = ty(F32, (shape){1, {4}}), i = ty(I32, (shape){1, {4}});
    int64_t axes[2] = {0, 2};
    ir_attr red_attrs[1] = {ir_a_ints("axes", 2, axes)}, max_attrs[1] = {ir_a_ints("axes", 1, axes)};
    ir_attr sum_attrs[1] = {ir_a_int("axis", 0)};
    ir_node cases[3] = {
        {.op = IR_OP_reduce_sum, .nin = 1, .type = ty(F16, (shape){1, {3}}), .nattrs = 1, .attrs = red_attrs},
        {.op = IR_OP_cumsum, .nin = 1, .type = f, .nattrs = 1, .attrs = sum_attrs},
        {.op = IR_OP_reduce_max, .nin = 1, .type = ty(I32, (shape){0, {0}}), .nattrs = 1, .attrs = max_attrs},
    };
    const ir_type *types[3] = {&x, &f, &i};
    const double values[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, neg[4] = {-3, 7, -1, 2};
    const double want[3][4] = {{1 + 2 + 7 + 8, 3 + 4 + 9 + 10, 5 + 6 + 11 + 12}, {1, 3, 6, 10}, {7}};
    for (int c = 0; c < 3; c++) {
        const double *in[1] = {c == 2 ? neg : values};
        for (test_fail_at = 0;; test_fail_at++) {
            double out[4] = {0};
            char why[256] = "";
            alloy_set_allocator(test_failing_realloc, NULL);
            test_alloc_count = 0;
            alloy_status st = eval_node(&cases[c], &types[c], in, out, why, sizeof why);
            bool failed = test_alloc_count > test_fail_at;
            alloy_set_allocator(test_cmocka_realloc, NULL);
            if (!failed) {
                assert_int_equal(st, ALLOY_OK);
                for (int k = 0; k < ir_numel(&cases[c].type); k++) assert_true(out[k] == want[c][k]);
                break;
            }
            assert_int_equal(st, ALLOY_ERR_OOM);
            assert_non_null(strstr(why, ir_ops[cases[c].op].name));
            assert_non_null(strstr(why, "out of memory"));
        }
        assert_true(test_fail_at >= 1); /* the case allocated, and each allocation's failure was seen */
    }
    test_fail_at = -1;
}

/* ---- what is not evaluated ---- */

static bool evaluated(int op)
{
    switch (op) {
    case IR_OP_cast:
    case IR_OP_reshape:
    case IR_OP_broadcast_to:
    case IR_OP_transpose:
    case IR_OP_slice:
    case IR_OP_pad:
    case IR_OP_concat:
    case IR_OP_embedding:
    case IR_OP_gather:
    case IR_OP_index_select:
    case IR_OP_arange:
    case IR_OP_cumsum:
    case IR_OP_reduce_sum:
    case IR_OP_reduce_mean:
    case IR_OP_reduce_max:
    case IR_OP_dropout:
    case IR_OP_uniform:
    case IR_OP_normal: return true;
    default: return ir_ops[op].elementwise;
    }
}

/* dropout (with and without its step operand; inf and NaN among the
 * values), uniform and normal in every float dtype: base/random.h's draws
 * as cpu_random.c makes them. */
static void test_random_ops_draw_the_cpus_bits(void **state)
{
    (void)state;
    static const shape shapes[] = {{1, {0}}, {2, {3, 5}}, {1, {1100}}};
    static const alloy_dtype floats[] = {F32, F16, BF16, F64};
    for (int si = 0; si < 3; si++)
        for (int d = 0; d < 4; d++) {
            ir_type t[2] = {ty(floats[d], shapes[si]), ty(I32, (shape){0, {0}})};
            ir_attr drop[3] = {ir_a_float("p", 0.3), ir_a_int("stream", 5), ir_a_int("seed", -3)};
            for (int nin = 1; nin <= 2; nin++) assert_true(check_op(IR_OP_dropout, nin, t, 3, drop, NULL, SPECIAL));
            ir_attr uni[4] = {ir_a_float("low", -2), ir_a_float("high", 5), ir_a_int("stream", 7), ir_a_int("seed", 11)};
            ir_attr nor[4] = {ir_a_float("mean", 1), ir_a_float("std", 3), ir_a_int("stream", 8), ir_a_int("seed", 11)};
            for (int nin = 0; nin <= 1; nin++) {
                assert_true(check_op(IR_OP_uniform, nin, &t[1], 4, uni, &t[0], SPECIAL));
                assert_true(check_op(IR_OP_normal, nin, &t[1], 4, nor, &t[0], SPECIAL));
            }
        }
}

static void test_other_ops_are_unsupported_naming_the_op(void **state)
{
    (void)state;
    int refused = 0;
    for (int op = 0; op < IR_OP_COUNT; op++) {
        if (evaluated(op)) continue;
        ir_node n = {.op = (uint16_t)op, .type = ty(F32, (shape){1, {2}})};
        double out[2];
        char why[256] = "";
        if (eval_node(&n, NULL, NULL, out, why, sizeof why) != ALLOY_ERR_UNSUPPORTED)
            fail_msg("%s: not ALLOY_ERR_UNSUPPORTED", ir_ops[op].name);
        assert_non_null(strstr(why, ir_ops[op].name));
        refused++;
    }
    assert_true(refused >= 15); /* leaves, matmul, softmax, layer_norm, cross_entropy, found_inf, the grads */
    assert_false(evaluated(IR_OP_matmul));
}

static void test_every_evaluated_op_was_compared(void **state)
{
    (void)state;
    for (int op = 0; op < IR_OP_COUNT; op++)
        if (evaluated(op) && !covered[op]) fail_msg("%s was never compared with the CPU", ir_ops[op].name);
}

#define TEST(f) cmocka_unit_test_setup_teardown(f, test_checked_alloc, test_plain_alloc)

int main(void)
{
    test_rng = 0x853c49e6748fea9bu;
    const struct CMUnitTest tests[] = {
        TEST(test_elementwise_ops_match_the_cpu_in_every_dtype_and_broadcast),
        TEST(test_elementwise_attributes_reach_the_folded_value_as_the_cpu_reads_them),
        TEST(test_cast_between_every_pair_of_dtypes_matches_the_cpu),
        TEST(test_reshape_broadcast_to_and_transpose_match_the_cpu),
        TEST(test_slice_pad_and_concat_match_the_cpu_along_any_axis),
        TEST(test_embedding_gathers_rows_like_the_cpu),
        TEST(test_embedding_rejects_an_id_out_of_range_with_the_cpu_message),
        TEST(test_indexing_ops_and_cumsum_match_the_cpu),
        TEST(test_reductions_match_the_cpu_on_both_of_its_paths),
        TEST(test_reduce_sum_of_i64_computes_in_f64_and_saturates),
        TEST(test_scratch_that_cannot_be_had_is_out_of_memory_naming_the_op),
        TEST(test_random_ops_draw_the_cpus_bits),
        TEST(test_other_ops_are_unsupported_naming_the_op),
        TEST(test_every_evaluated_op_was_compared),
    };
    return cmocka_run_group_tests_name("evaluate", tests, NULL, NULL);
}
