/* test_ops.c - the CPU kernels' special cases: errors that name the node, values that round once, sums that keep their precision, flags over mixed dtypes (every op's ordinary cases are in the op table, test_op_cases.c). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/cpu/cpu.h"
#include "support.h"

static al_arena arena;      /* every tensor of a test; freed at its end */
static char run_error[512]; /* the message of the last run_op */

/* A test tensor: its type and its elements as doubles. */
typedef struct tensor {
    ir_type type;
    double *v;
} tensor;

static ir_type ty(alloy_dtype dt, int rank, const int64_t *dims)
{
    ir_type t = {.dtype = dt, .rank = rank};
    if (rank) memcpy(t.dims, dims, sizeof(int64_t) * (size_t)rank);
    return t;
}

static tensor zeros(ir_type t)
{
    tensor x = {t, al_arena_alloc(&arena, sizeof(double) * (size_t)(ir_numel(&t) + 1))};
    assert_non_null(x.v);
    return x;
}

/* Uniform in [lo, hi) rounded to the dtype. */
static tensor random_tensor(ir_type t, double lo, double hi)
{
    tensor x = zeros(t);
    for (int64_t i = 0; i < ir_numel(&t); i++) x.v[i] = test_round_to(t.dtype, test_uniform(lo, hi));
    return x;
}

static tensor values(ir_type t, const double *v)
{
    tensor x = zeros(t);
    for (int64_t i = 0; i < ir_numel(&t); i++) x.v[i] = test_round_to(t.dtype, v[i]);
    return x;
}

/* Builds a graph of nin inputs feeding one `op` node named "under_test",
 * runs it on the CPU and decodes the result into *out. Returns the run's
 * status (its message in run_error); a graph that does not build fails. */
static alloy_status run_op(int op, int nin, const tensor *in, const ir_type *declared, tensor *out)
{
    ir_graph *g = ir_graph_new("test");
    assert_non_null(g);
    int ids[16];
    for (int i = 0; i < nin; i++) {
        ir_node *input = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &in[i].type, NULL);
        if (!input) fail_msg("input %d: %s", i, g->error);
        ids[i] = input->id;
    }
    ir_node *node = ir_add_node(g, op, nin, ids, 0, NULL, declared, "under_test");
    if (!node) fail_msg("%s", g->error);
    rt_tensor *vals = al_calloc((size_t)g->nnodes, sizeof *vals);
    assert_non_null(vals);
    for (int i = 0; i < nin; i++) {
        vals[i].data = al_arena_alloc(&arena, ir_nbytes(&in[i].type) + 1);
        test_encode(in[i].type.dtype, in[i].v, vals[i].data, ir_numel(&in[i].type));
    }
    cpu_exec x = {.nthreads = 1};
    alloy_status st = cpu_run_graph(&x, g, vals, NULL);
    snprintf(run_error, sizeof run_error, "%s", x.error);
    if (st == ALLOY_OK) {
        *out = zeros(node->type);
        for (int64_t i = 0; i < ir_numel(&node->type); i++) out->v[i] = test_decode(node->type.dtype, vals[node->id].data, i);
    }
    cpu_release_values(g, vals);
    al_free(vals);
    ir_graph_free(g);
    return st;
}

static tensor expect_op(int op, int nin, const tensor *in, const ir_type *declared)
{
    tensor out = {0};
    if (run_op(op, nin, in, declared, &out)) fail_msg("%s failed: %s", ir_ops[op].name, run_error);
    return out;
}

/* Every value exactly as expected. */
static void expect_values(const tensor *got, const double *want, const char *what)
{
    char why[256];
    if (!test_close(got->v, want, ir_numel(&got->type), 0, why, sizeof why)) fail_msg("%s: %s", what, why);
}

/* ---- errors that name the node ---- */

static void test_cross_entropy_rejects_a_target_out_of_range_naming_the_node(void **state)
{
    (void)state;
    for (int bad = -1; bad <= 7; bad += 8) {
        tensor in[2] = {random_tensor(ty(F32, 2, DIMS(4, 7)), -1, 1), random_tensor(ty(I64, 1, DIMS(4)), 0, 7)}, out;
        in[1].v[2] = bad;
        assert_int_equal(run_op(IR_OP_cross_entropy, 2, in, NULL, &out), ALLOY_ERR_INVALID);
        char value[32];
        snprintf(value, sizeof value, "target %d", bad);
        if (!strstr(run_error, "under_test") || !strstr(run_error, value) || !strstr(run_error, "[2]"))
            fail_msg("message lacks the node, value or position: %s", run_error);
    }
    al_arena_free(&arena);
}

static void test_cross_entropy_grad_rejects_a_target_out_of_range_naming_the_node(void **state)
{
    (void)state;
    static const double bad[][6] = {{0, 1, 2, 3, 4, 5}, {0, -1, 2, 3, 4, 0}};
    static const char *const msg[] = {"cross_entropy_grad 'under_test': target 5 out of range [0, 5) at position [1,2]",
                                      "cross_entropy_grad 'under_test': target -1 out of range [0, 5) at position [0,1]"};
    for (int k = 0; k < 2; k++) {
        tensor in[3] = {random_tensor(ty(F32, 3, DIMS(2, 3, 5)), -1, 1), values(ty(I32, 2, DIMS(2, 3)), bad[k]),
                        values(ty(F32, 0, NULL), (double[]){1})};
        tensor out;
        assert_int_equal(run_op(IR_OP_cross_entropy_grad, 3, in, NULL, &out), ALLOY_ERR_INVALID);
        assert_string_equal(run_error, msg[k]);
    }
    al_arena_free(&arena);
}

static void test_embedding_rejects_an_id_out_of_range_naming_the_node(void **state)
{
    (void)state;
    tensor in[2] = {random_tensor(ty(I32, 2, DIMS(2, 3)), 0, 10), random_tensor(ty(F32, 2, DIMS(10, 4)), -1, 1)}, out;
    in[0].v[4] = 10;
    assert_int_equal(run_op(IR_OP_embedding, 2, in, NULL, &out), ALLOY_ERR_INVALID);
    if (!strstr(run_error, "under_test") || !strstr(run_error, "id 10") || !strstr(run_error, "[1,1]"))
        fail_msg("message lacks the node, id or position: %s", run_error);
    al_arena_free(&arena);
}

static void test_embedding_grad_rejects_an_id_out_of_range_naming_the_node(void **state)
{
    (void)state;
    static const double bad[][4] = {{0, 1, 6, 2}, {-3, 0, 0, 0}};
    static const char *const msg[] = {"embedding_grad 'under_test': id 6 out of range [0, 6) at position [1,0]",
                                      "embedding_grad 'under_test': id -3 out of range [0, 6) at position [0,0]"};
    for (int k = 0; k < 2; k++) {
        tensor in[2] = {values(ty(I64, 2, DIMS(2, 2)), bad[k]), random_tensor(ty(F32, 3, DIMS(2, 2, 3)), -1, 1)};
        ir_type table = ty(F32, 2, DIMS(6, 3));
        tensor out;
        assert_int_equal(run_op(IR_OP_embedding_grad, 2, in, &table, &out), ALLOY_ERR_INVALID);
        assert_string_equal(run_error, msg[k]);
    }
    al_arena_free(&arena);
}

/* ---- values that round once, sums that keep their precision ---- */

static void test_cast_converts_special_values_between_every_pair_of_dtypes_rounding_once(void **state)
{
    (void)state;
    double v[] = {0, 1, -1, 2.5, -3.75, 100.125, 1e-3, -7, 1.0 / 3, 70000, 1 + 0x1p-11 + 0x1p-40,
                  1 + 0x1p-8 + 0x1p-40, -1e10, 3e9, NAN, INFINITY, -INFINITY};
    int count = (int)(sizeof v / sizeof v[0]);
    for (alloy_dtype from = 0; from < ALLOY_DTYPE_COUNT; from++)
        for (alloy_dtype to = 0; to < ALLOY_DTYPE_COUNT; to++) {
            ir_type t = ty(from, 1, DIMS(count)), t_out = ty(to, 1, DIMS(count));
            tensor x = values(t, v);
            tensor out = expect_op(IR_OP_cast, 1, &x, &t_out), want = zeros(t_out);
            for (int i = 0; i < count; i++) want.v[i] = test_round_to(to, x.v[i]);
            char what[64];
            snprintf(what, sizeof what, "cast %s -> %s", alloy_dtype_name(from), alloy_dtype_name(to));
            expect_values(&out, want.v, what);
        }
    al_arena_free(&arena);
}

static void test_reduce_sum_of_a_million_floats_has_logarithmic_error(void **state)
{
    (void)state;
    /* 2^20 values in [0, 1): adding them in order in f32 is off by ~1e-5,
     * pairwise by ~1e-7; both the contiguous and the column-wise path */
    for (int cols = 1; cols <= 4; cols += 3) {
        ir_type t = cols == 1 ? ty(F32, 1, DIMS(1 << 20)) : ty(F32, 2, DIMS(1 << 18, 4));
        tensor x = random_tensor(t, 0, 1);
        int64_t axis = 0;
        ir_graph *g = ir_graph_new("sum");
        assert_non_null(g);
        ir_node *in = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &t, "x");
        ir_attr axes = ir_a_ints("axes", 1, &axis);
        ir_node *sum = in ? ir_add_node(g, IR_OP_reduce_sum, 1, &in->id, 1, &axes, NULL, "under_test") : NULL;
        if (!sum) fail_msg("%s", g->error);
        rt_tensor vals[2] = {{.data = al_arena_alloc(&arena, ir_nbytes(&t))}};
        test_encode(F32, x.v, vals[0].data, ir_numel(&t));
        cpu_exec ex = {.nthreads = 1};
        if (cpu_run_graph(&ex, g, vals, NULL)) fail_msg("%s", ex.error);
        for (int64_t j = 0; j < cols; j++) {
            double exact = 0, got = ((const float *)vals[1].data)[j];
            for (int64_t i = 0; i < t.dims[0]; i++) exact += x.v[i * cols + j];
            if (fabs(got - exact) > 1e-6 * exact) fail_msg("sum over %s is %.9g, exact %.9g", test_type_str(&t), got, exact);
        }
        cpu_release_values(g, vals);
        ir_graph_free(g);
    }
    al_arena_free(&arena);
}

/* 4096 ones into f16/bf16 rows: summed in f16 row 0 would stop at 2048
 * (2048 + 1 rounds back to 2048), in bf16 at 256; in f32 it is exact. */
static void test_embedding_grad_accumulates_half_precision_in_f32(void **state)
{
    (void)state;
    enum { P = 4096 };
    double *ids = al_arena_alloc(&arena, sizeof(double) * P), *ones = al_arena_alloc(&arena, sizeof(double) * P);
    for (int p = 0; p < P; p++) ids[p] = p % 4 == 3 ? 2 : 0, ones[p] = 1;
    for (int k = 0; k < 2; k++) {
        alloy_dtype dt = k ? BF16 : F16;
        tensor in[2] = {values(ty(I32, 1, DIMS(P)), ids), values(ty(dt, 2, DIMS(P, 1)), ones)};
        ir_type table = ty(dt, 2, DIMS(3, 1));
        tensor got = expect_op(IR_OP_embedding_grad, 2, in, &table);
        assert_true(got.v[0] == 3072 && got.v[1] == 0 && got.v[2] == 1024);
    }
    al_arena_free(&arena);
}

/* found_inf: true exactly when some element of some operand is inf or NaN,
 * whatever the operands' float dtypes (each operand another dtype). */
static void test_found_inf_sees_an_inf_or_nan_in_any_operand_of_any_float_dtype(void **state)
{
    (void)state;
    const alloy_dtype dts[] = {F32, F16, BF16, F64};
    const double bad[] = {INFINITY, -INFINITY, NAN};
    for (size_t d = 0; d < 4; d++) {
        for (size_t b = 0; b < 3; b++) {
            tensor in[3];
            for (int k = 0; k < 3; k++) in[k] = random_tensor(ty(dts[(d + (size_t)k) % 4], 2, DIMS(3, 5)), -100, 100);
            tensor ok = expect_op(IR_OP_found_inf, 3, in, NULL);
            assert_int_equal(ok.type.rank, 0);
            assert_true(ok.v[0] == 0);
            in[2].v[14] = bad[b]; /* the last element of the last operand */
            tensor hit = expect_op(IR_OP_found_inf, 3, in, NULL);
            assert_true(hit.v[0] == 1);
        }
    }
    al_arena_free(&arena);
}

/* One rule for integers (docs/ir.md, "Integer arithmetic"): every op's
 * result is its exact value truncated toward zero and saturated to the
 * dtype, elementwise ops and reductions alike (reduce_sum used to wrap). */
static void test_integer_results_saturate_in_elementwise_ops_and_reductions_alike(void **state)
{
    (void)state;
    const double p30 = 0x1p30, p31 = 0x1p31, p62 = 0x1p62, p63 = 0x1p63;
    static const int64_t one[] = {1}, three[] = {3}, two[] = {2};
    for (int w = 0; w < 2; w++) {
        alloy_dtype dt = w ? ALLOY_I64 : ALLOY_I32;
        /* i64's max, 2^63 - 1, decodes to the double 2^63 */
        double big = w ? p62 : p30, max = w ? p63 : p31 - 1, min = w ? -p63 : -p31;
        tensor three_big = values(ty(dt, 1, three), (const double[]){big, big, big});
        tensor three_neg = values(ty(dt, 1, three), (const double[]){-big, -big, -big});
        tensor r = expect_op(IR_OP_reduce_sum, 1, &three_big, NULL);
        expect_values(&r, (const double[]){max}, w ? "i64 3 * 2^62 summed" : "i32 3 * 2^30 summed");
        r = expect_op(IR_OP_reduce_sum, 1, &three_neg, NULL);
        expect_values(&r, (const double[]){min}, w ? "i64 -3 * 2^62 summed" : "i32 -3 * 2^30 summed");
        r = expect_op(IR_OP_reduce_mean, 1, &three_big, NULL); /* the exact mean fits */
        expect_values(&r, (const double[]){big}, "the mean of three equal values");
        tensor odd = values(ty(dt, 1, two), (const double[]){-3, 0});
        r = expect_op(IR_OP_reduce_mean, 1, &odd, NULL);
        expect_values(&r, (const double[]){-1}, "mean(-3, 0) = -1.5, truncated toward zero");
        r = expect_op(IR_OP_reduce_max, 1, &three_neg, NULL);
        expect_values(&r, (const double[]){-big}, "the maximum compares");
        /* elementwise: the same rule */
        tensor a[2] = {values(ty(dt, 1, one), (const double[]){w ? p62 + p62 / 2 : p31 - 1}),
                       values(ty(dt, 1, one), (const double[]){big})};
        r = expect_op(IR_OP_add, 2, a, NULL);
        expect_values(&r, (const double[]){max}, "near max + big");
        r = expect_op(IR_OP_mul, 2, a, NULL);
        expect_values(&r, (const double[]){max}, "near max * big");
        a[0] = values(ty(dt, 1, one), (const double[]){min});
        r = expect_op(IR_OP_sub, 2, a, NULL);
        expect_values(&r, (const double[]){min}, "min - big");
        r = expect_op(IR_OP_neg, 1, a, NULL);
        expect_values(&r, (const double[]){max}, "-min");
        a[1] = values(ty(dt, 1, one), (const double[]){0});
        r = expect_op(IR_OP_div, 2, a, NULL);
        expect_values(&r, (const double[]){min}, "min / 0");
        a[0] = a[1];
        r = expect_op(IR_OP_div, 2, a, NULL);
        expect_values(&r, (const double[]){0}, "0 / 0");
    }
    al_arena_free(&arena);
}

/* A test that failed half way left its blocks to cmocka, which freed them. */

static int forget_arena(void **state)
{
    memset(&arena, 0, sizeof arena);
    return test_plain_alloc(state);
}

#define TEST(f) cmocka_unit_test_setup_teardown(f, test_checked_alloc, forget_arena)

int main(void)
{
    test_rng = 0x853c49e6748fea9bu;
    const struct CMUnitTest tests[] = {
        TEST(test_cross_entropy_rejects_a_target_out_of_range_naming_the_node),
        TEST(test_cross_entropy_grad_rejects_a_target_out_of_range_naming_the_node),
        TEST(test_embedding_rejects_an_id_out_of_range_naming_the_node),
        TEST(test_embedding_grad_rejects_an_id_out_of_range_naming_the_node),
        TEST(test_cast_converts_special_values_between_every_pair_of_dtypes_rounding_once),
        TEST(test_reduce_sum_of_a_million_floats_has_logarithmic_error),
        TEST(test_embedding_grad_accumulates_half_precision_in_f32),
        TEST(test_found_inf_sees_an_inf_or_nan_in_any_operand_of_any_float_dtype),
        TEST(test_integer_results_saturate_in_elementwise_ops_and_reductions_alike),
    };
    return cmocka_run_group_tests_name("ops", tests, NULL, NULL);
}
