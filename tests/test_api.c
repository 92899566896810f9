/* test_api.c - the public builder API's contract: error messages, poisoned handles, feeds and fetches, state round trips, parameter init. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloy/alloy.h"
#include "support.h"

/* ---- helpers ---- */

/* Checks g's first error: its status and that its message holds each of
 * the substrings (EXPECT_ERROR(g, status, "part", ...); "" checks none). */
static void expect_error(const alloy_graph *g, alloy_status status, const char *const *parts)
{
    const char *msg = alloy_last_error(g);
    if (alloy_graph_status(g) != status)
        fail_msg("status %s, expected %s (message: %s)", alloy_status_name(alloy_graph_status(g)),
                 alloy_status_name(status), msg);
    for (; *parts; parts++)
        if (!strstr(msg, *parts)) fail_msg("message \"%s\" lacks \"%s\"", msg, *parts);
}
#define EXPECT_ERROR(g, status, ...) \
    expect_error((g), (status), (const char *const[]){__VA_ARGS__, NULL})

/* A graph with one f32[2,3] input "x" and output "y" = relu(x). */
static alloy_graph *relu_graph(void)
{
    alloy_graph *g = alloy_graph_new("relu_graph");
    assert_non_null(g);
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(2, 3));
    assert_int_equal(alloy_output(g, "y", alloy_relu(g, x)), ALLOY_OK);
    return g;
}

/* A graph with params "w" f32[rows,cols] (init) and "b" f32[cols] (zeros). */
static alloy_graph *param_graph(uint64_t seed, int64_t rows, int64_t cols, alloy_init init)
{
    alloy_graph *g = alloy_graph_new("params");
    assert_non_null(g);
    alloy_graph_set_seed(g, seed);
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(1, rows));
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 2, DIMS(rows, cols), init);
    alloy_tensor *b = alloy_param(g, "b", ALLOY_F32, 1, DIMS(cols), alloy_init_zeros());
    assert_int_equal(alloy_output(g, "y", alloy_add(g, alloy_matmul(g, x, w, false, false), b)),
                     ALLOY_OK);
    return g;
}

/* A copy of state tensor name (caller frees). */
static float *state_copy(alloy_graph *g, const char *name, int64_t *n)
{
    alloy_host_tensor t;
    assert_int_equal(alloy_graph_get_state(g, name, &t), ALLOY_OK);
    assert_int_equal(t.dtype, ALLOY_F32);
    *n = alloy_host_tensor_numel(&t);
    float *copy = malloc(sizeof(float) * (size_t)*n);
    assert_non_null(copy);
    memcpy(copy, t.data, sizeof(float) * (size_t)*n);
    return copy;
}

/* ---- builder errors ---- */

static void test_add_of_unbroadcastable_shapes_names_op_operand_types_and_node(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *a = alloy_input(g, "a", ALLOY_F32, 2, DIMS(2, 3));
    alloy_tensor *b = alloy_input(g, "b", ALLOY_F32, 2, DIMS(4, 5));
    assert_null(alloy_add(g, a, b));
    EXPECT_ERROR(g, ALLOY_ERR_SHAPE, "add(f32[2,3], f32[4,5])", "node %2", "broadcast");
    alloy_graph_free(g);
}

static void test_add_of_different_dtypes_is_a_dtype_error_that_suggests_a_cast(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *a = alloy_input(g, "a", ALLOY_F32, 1, DIMS(3));
    alloy_tensor *b = alloy_input(g, "b", ALLOY_F16, 1, DIMS(3));
    assert_null(alloy_add(g, a, b));
    EXPECT_ERROR(g, ALLOY_ERR_DTYPE, "add(f32[3], f16[3])", "cast");
    alloy_graph_free(g);
}

static void test_matmul_with_different_inner_dims_names_both_dims(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *a = alloy_input(g, "a", ALLOY_F32, 2, DIMS(2, 3));
    alloy_tensor *b = alloy_input(g, "b", ALLOY_F32, 2, DIMS(4, 5));
    assert_null(alloy_matmul(g, a, b, false, false));
    EXPECT_ERROR(g, ALLOY_ERR_SHAPE, "matmul(f32[2,3], f32[4,5])", "node %2", "3 vs 4");
    alloy_graph_free(g);
}

static void test_matmul_transpose_flags_make_the_same_operands_fit(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *a = alloy_input(g, "a", ALLOY_F32, 2, DIMS(3, 2));
    alloy_tensor *b = alloy_input(g, "b", ALLOY_F32, 2, DIMS(5, 3));
    alloy_tensor *c = alloy_matmul(g, a, b, true, true);
    assert_non_null(c);
    alloy_host_tensor info = alloy_tensor_info(c);
    assert_int_equal(info.rank, 2);
    assert_int_equal(info.dims[0], 2);
    assert_int_equal(info.dims[1], 5);
    assert_int_equal(alloy_graph_status(g), ALLOY_OK);
    alloy_graph_free(g);
}

static void test_softmax_axis_out_of_range_is_an_invalid_argument(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(2, 3));
    assert_null(alloy_softmax(g, x, 2));
    EXPECT_ERROR(g, ALLOY_ERR_INVALID, "softmax", "axis 2 out of range for rank 2");
    alloy_graph_free(g);
}

static void test_a_nan_bound_or_slope_is_an_invalid_argument_naming_the_op_and_attribute(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(2, 3));
    assert_null(alloy_clamp(g, x, NAN, 1));
    EXPECT_ERROR(g, ALLOY_ERR_INVALID, "clamp(f32[2,3])", "min must be a number, not NaN");
    alloy_graph_free(g);
    g = alloy_graph_new("g");
    x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(2, 3));
    assert_null(alloy_leaky_relu(g, x, NAN));
    EXPECT_ERROR(g, ALLOY_ERR_INVALID, "leaky_relu", "negative_slope must be a number, not NaN");
    alloy_graph_free(g);
    g = alloy_graph_new("g");
    x = alloy_input(g, "x", ALLOY_BOOL, 1, DIMS(3));
    assert_null(alloy_clamp(g, x, 0, 1));
    EXPECT_ERROR(g, ALLOY_ERR_DTYPE, "clamp", "numeric, not bool");
    alloy_graph_free(g);
}

/* Hand-computed values of the attribute ops through the API, an absent
 * clamp bound printing as the infinity it stands for. */
static void test_clamp_leaky_relu_elu_and_sign_compute_what_pytorch_does(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 1, DIMS(6));
    alloy_output(g, "clamp", alloy_clamp(g, x, -INFINITY, 0.5));
    alloy_output(g, "crossed", alloy_clamp(g, x, 1, -1));
    alloy_output(g, "leaky", alloy_leaky_relu(g, x, 0.25));
    alloy_output(g, "elu", alloy_elu(g, x, 2));
    alloy_output(g, "sign", alloy_sign(g, x));
    float xs[6] = {-2, -0.5f, 0, 0.25f, 3, NAN};
    alloy_host_tensor feed = {"x", ALLOY_F32, 1, {6}, xs};
    alloy_host_tensor fetch[5] = {{.name = "clamp"}, {.name = "crossed"}, {.name = "leaky"}, {.name = "elu"}, {.name = "sign"}};
    assert_int_equal(alloy_graph_run(g, &feed, 1, fetch, 5), ALLOY_OK);
    static const float want[5][5] = {
        {-2, -0.5f, 0, 0.25f, 0.5f},
        {-1, -1, -1, -1, -1},
        {-0.5f, -0.125f, 0, 0.25f, 3},
        {0, 0, 0, 0.25f, 3}, /* the negative ones below */
        {-1, -1, 0, 1, 1},
    };
    for (int k = 0; k < 5; k++) {
        const float *y = fetch[k].data;
        for (int i = 0; i < 5; i++)
            if (k != 3 || i >= 2) assert_float_equal(y[i], want[k][i], 0);
        assert_true(isnan(y[5])); /* NaN passes through every one of them */
    }
    const float *elu = fetch[3].data;
    assert_float_equal(elu[0], 2 * expm1f(-2), 1e-7);
    assert_float_equal(elu[1], 2 * expm1f(-0.5f), 1e-7);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(alloy_graph_dump(g, f, ALLOY_DUMP_SOURCE), ALLOY_OK);
    fclose(f);
    if (!strstr(text, "clamp(%x) {min=-inf, max=0.5} : f32[6]")) fail_msg("dump: %s", text);
    if (!strstr(text, "leaky_relu(%x) {negative_slope=0.25} : f32[6]")) fail_msg("dump: %s", text);
    free(text);
    alloy_graph_free(g);
}

/* argmax/argmin give the first extreme (NaN wins); one_hot an id's row, and
 * an id outside [0, depth) fails the run naming the node, the id and its
 * position, leaving the graph usable. */
static void test_argmax_argmin_and_one_hot_compute_what_pytorch_does(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(2, 4));
    alloy_tensor *ids = alloy_input(g, "ids", ALLOY_I32, 2, DIMS(2, 2));
    alloy_output(g, "max", alloy_argmax(g, x, -1, false));
    alloy_output(g, "min", alloy_argmin(g, x, 0, true));
    alloy_output(g, "hot", alloy_set_name(g, alloy_one_hot(g, ids, 3, ALLOY_F16), "hot"));
    float xs[8] = {1, 5, 5, -2, NAN, 0, 7, 7};
    int32_t is[4] = {2, 0, 1, 1};
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {2, 4}, xs}, {"ids", ALLOY_I32, 2, {2, 2}, is}};
    alloy_host_tensor fetch[3] = {{.name = "max"}, {.name = "min"}, {.name = "hot"}};
    assert_int_equal(alloy_graph_run(g, feeds, 2, fetch, 3), ALLOY_OK);
    assert_int_equal(fetch[0].dtype, ALLOY_I64);
    assert_int_equal(fetch[0].rank, 1);
    assert_int_equal(fetch[1].rank, 2);
    assert_int_equal(fetch[1].dims[0], 1);
    const int64_t *mx = fetch[0].data, *mn = fetch[1].data;
    assert_int_equal(mx[0], 1); /* 5 twice: the first */
    assert_int_equal(mx[1], 0); /* NaN */
    static const int64_t want_min[4] = {1, 1, 0, 0};
    for (int i = 0; i < 4; i++) assert_int_equal(mn[i], want_min[i]);
    assert_int_equal(fetch[2].dtype, ALLOY_F16);
    assert_int_equal(fetch[2].rank, 3);
    assert_int_equal(fetch[2].dims[2], 3);
    const uint16_t *hot = fetch[2].data;
    for (int p = 0; p < 4; p++)
        for (int c = 0; c < 3; c++) assert_int_equal(hot[p * 3 + c], c == is[p] ? 0x3c00 : 0); /* f16 1.0 */
    is[2] = 3;
    assert_int_equal(alloy_graph_run(g, feeds, 2, fetch, 3), ALLOY_ERR_INVALID);
    EXPECT_ERROR(g, ALLOY_ERR_INVALID, "one_hot 'hot'", "id 3 out of range [0, 3)", "[1,0]");
    is[2] = 1;
    assert_int_equal(alloy_graph_run(g, feeds, 2, fetch, 3), ALLOY_OK);
    alloy_graph_free(g);
}

static void test_reduce_and_slice_reject_bad_axes(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(2, 3));
    assert_null(alloy_reduce_sum(g, x, 1, DIMS(-3), false));
    EXPECT_ERROR(g, ALLOY_ERR_INVALID, "reduce_sum", "axis -3 out of range for rank 2");
    alloy_graph_free(g);

    g = alloy_graph_new("g");
    x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(2, 3));
    assert_null(alloy_slice(g, x, 5, 0, 1));
    EXPECT_ERROR(g, ALLOY_ERR_INVALID, "slice", "axis 5 out of range for rank 2");
    alloy_graph_free(g);
}

static void test_negative_axes_count_from_the_end(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 3, DIMS(2, 3, 4));
    alloy_host_tensor r = alloy_tensor_info(alloy_reduce_sum(g, x, 1, DIMS(-1), false));
    assert_int_equal(r.rank, 2);
    assert_int_equal(r.dims[1], 3);
    alloy_host_tensor s = alloy_tensor_info(alloy_slice(g, x, -2, 1, -1));
    assert_int_equal(s.rank, 3);
    assert_int_equal(s.dims[1], 1);
    assert_int_equal(alloy_graph_status(g), ALLOY_OK);
    alloy_graph_free(g);
}

static void test_null_operand_is_an_invalid_argument_naming_the_op(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 1, DIMS(3));
    assert_null(alloy_mul(g, x, NULL));
    EXPECT_ERROR(g, ALLOY_ERR_INVALID, "mul: operand 1 is NULL");
    alloy_graph_free(g);
}

static void test_calls_on_a_null_graph_return_null_or_invalid_without_crashing(void **state)
{
    (void)state;
    assert_null(alloy_input(NULL, "x", ALLOY_F32, 1, DIMS(3)));
    assert_null(alloy_relu(NULL, NULL));
    assert_int_equal(alloy_output(NULL, "y", NULL), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_run(NULL, NULL, 0, NULL, 0), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_status(NULL), ALLOY_ERR_INVALID);
    assert_non_null(alloy_last_error(NULL));
    alloy_graph_free(NULL);
}

static void test_poisoned_handle_passes_through_quietly_and_run_returns_the_first_error(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(2, 3));
    alloy_tensor *w = alloy_input(g, "w", ALLOY_F32, 2, DIMS(4, 5));
    alloy_tensor *bad = alloy_matmul(g, x, w, false, false); /* the first error */
    assert_null(bad);
    char first[1024];
    snprintf(first, sizeof first, "%s", alloy_last_error(g));
    EXPECT_ERROR(g, ALLOY_ERR_SHAPE, "matmul");

    /* later calls, good or bad, return NULL and keep the first message */
    assert_null(alloy_relu(g, bad));
    assert_null(alloy_add(g, bad, x));
    assert_null(alloy_exp(g, x));                      /* valid on its own */
    assert_null(alloy_softmax(g, x, 9));               /* a second, different error */
    assert_null(alloy_input(g, "x", ALLOY_F32, 1, DIMS(1))); /* a duplicate name */
    assert_int_equal(alloy_output(g, "y", bad), ALLOY_ERR_SHAPE);
    EXPECT_ERROR(g, ALLOY_ERR_SHAPE, "");
    assert_string_equal(alloy_last_error(g), first);

    float data[6] = {0};
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {2, 3}, data};
    alloy_host_tensor fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_ERR_SHAPE);
    assert_string_equal(alloy_last_error(g), first);
    assert_null(fetch.data);
    alloy_graph_free(g);
}

static void test_handle_from_another_graph_is_rejected(void **state)
{
    (void)state;
    alloy_graph *g1 = alloy_graph_new("one"), *g2 = alloy_graph_new("two");
    alloy_tensor *x1 = alloy_input(g1, "x", ALLOY_F32, 1, DIMS(3));
    alloy_tensor *x2 = alloy_input(g2, "x", ALLOY_F32, 1, DIMS(3)); /* same id in g2 */
    assert_null(alloy_add(g2, x2, x1));
    EXPECT_ERROR(g2, ALLOY_ERR_INVALID, "add: operand 1 belongs to another graph");
    assert_int_equal(alloy_graph_status(g1), ALLOY_OK);
    alloy_graph_free(g1);
    alloy_graph_free(g2);
}

static void test_duplicate_node_names_are_rejected(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    assert_non_null(alloy_input(g, "x", ALLOY_F32, 1, DIMS(3)));
    assert_null(alloy_param(g, "x", ALLOY_F32, 1, DIMS(3), alloy_init_zeros()));
    EXPECT_ERROR(g, ALLOY_ERR_INVALID, "'x'", "already used");
    alloy_graph_free(g);

    g = alloy_graph_new("g");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 1, DIMS(3));
    alloy_tensor *h = alloy_relu(g, x);
    assert_ptr_equal(alloy_set_name(g, h, "h"), h);
    assert_ptr_equal(alloy_graph_find(g, "h"), h);
    assert_null(alloy_set_name(g, alloy_neg(g, x), "h"));
    EXPECT_ERROR(g, ALLOY_ERR_INVALID, "'h'", "already used");
    alloy_graph_free(g);
}

static void test_duplicate_output_names_are_rejected(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 1, DIMS(3));
    assert_int_equal(alloy_output(g, "y", alloy_relu(g, x)), ALLOY_OK);
    assert_int_equal(alloy_output(g, "y", alloy_neg(g, x)), ALLOY_ERR_INVALID);
    EXPECT_ERROR(g, ALLOY_ERR_INVALID, "output 'y' is declared twice");
    alloy_graph_free(g);
}

static void test_reshape_infers_one_minus_one_dim(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(4, 6));
    alloy_host_tensor r = alloy_tensor_info(alloy_reshape(g, x, 3, DIMS(2, -1, 3)));
    assert_int_equal(alloy_graph_status(g), ALLOY_OK);
    assert_int_equal(r.rank, 3);
    assert_int_equal(r.dims[0], 2);
    assert_int_equal(r.dims[1], 4);
    assert_int_equal(r.dims[2], 3);
    alloy_graph_free(g);
}

static void test_reshape_rejects_two_minus_ones_an_uneven_split_and_a_count_change(void **state)
{
    (void)state;
    static const int64_t bad[3][2] = {{-1, -1}, {-1, 5}, {5, 5}};
    static const char *const why[3] = {"only one -1", "cannot infer", "24 vs 25"};
    for (int i = 0; i < 3; i++) {
        alloy_graph *g = alloy_graph_new("g");
        alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(4, 6));
        assert_null(alloy_reshape(g, x, 2, bad[i]));
        EXPECT_ERROR(g, ALLOY_ERR_SHAPE, "reshape", why[i]);
        if (i < 2) EXPECT_ERROR(g, ALLOY_ERR_SHAPE, "reshape(f32[4,6]) of 'x' to ["); /* the node and its type */
        alloy_graph_free(g);
    }
}

static void test_reshape_rejects_dims_whose_product_overflows(void **state)
{
    (void)state;
    /* 3 * 6148914691236517206 is 2^64 + 2: wrapped, it would let -1 become 12 */
    static const int64_t bad[2][3] = {{-1, 3, 6148914691236517206}, {INT64_C(1) << 40, INT64_C(1) << 40, 1 << 20}};
    static const char *const why[2] = {"cannot infer dim 0: the other dims' product passes int64", "reshape"};
    for (int i = 0; i < 2; i++) {
        alloy_graph *g = alloy_graph_new("g");
        alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(4, 6));
        assert_null(alloy_reshape(g, x, 3, bad[i]));
        EXPECT_ERROR(g, ALLOY_ERR_SHAPE, "reshape", why[i]);
        alloy_graph_free(g);
    }
}

static void test_an_empty_shape_whose_other_dims_multiply_past_the_limit_is_refused(void **state)
{
    (void)state;
    /* [0, 4e17, 120] has no elements, but 4e17 * 120 passes int64: every
     * stride and partial product a kernel forms would overflow. Such shapes
     * are refused where shapes are checked; one under the limit is accepted. */
    alloy_graph *g = alloy_graph_new("g");
    assert_null(alloy_input(g, "x", ALLOY_F32, 3, DIMS(0, 400000000000000000, 120)));
    EXPECT_ERROR(g, ALLOY_ERR_SHAPE, "input", "'x'");
    alloy_graph_free(g);
    g = alloy_graph_new("g");
    alloy_tensor *y = alloy_input(g, "y", ALLOY_F32, 3, DIMS(0, 4000000000, 120));
    assert_non_null(y);
    assert_non_null(alloy_reshape(g, y, 3, DIMS(120, 4000000000000, 0)));
    alloy_graph_free(g);
}

/* ---- running: feeds and fetches ---- */

static void test_run_computes_a_fetch_and_a_failed_run_leaves_the_graph_usable(void **state)
{
    (void)state;
    alloy_graph *g = relu_graph();
    float x[6] = {-1, 2, -3, 4, -5, 6};
    alloy_host_tensor feed = {"nope", ALLOY_F32, 2, {2, 3}, x};
    alloy_host_tensor fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_ERR_NOT_FOUND);
    feed.name = "x";
    char failed[256];
    snprintf(failed, sizeof failed, "%s", alloy_last_error(g));
    assert_non_null(strstr(failed, "nope"));
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_OK);
    /* the record stays the failed run's until another call fails (like errno) */
    assert_int_equal(alloy_graph_status(g), ALLOY_ERR_NOT_FOUND);
    assert_string_equal(alloy_last_error(g), failed);
    assert_int_equal(fetch.dtype, ALLOY_F32);
    assert_int_equal(fetch.rank, 2);
    assert_int_equal(fetch.dims[0], 2);
    assert_int_equal(fetch.dims[1], 3);
    const float *y = fetch.data;
    static const float want[6] = {0, 2, 0, 4, 0, 6};
    for (int i = 0; i < 6; i++) assert_true(y[i] == want[i]);
    alloy_graph_free(g);
}

static void test_feed_with_an_unknown_name_is_not_found(void **state)
{
    (void)state;
    alloy_graph *g = relu_graph();
    float x[6] = {0};
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {2, 3}, x}, {"nope", ALLOY_F32, 2, {2, 3}, x}};
    alloy_host_tensor fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(g, feeds, 2, &fetch, 1), ALLOY_ERR_NOT_FOUND);
    EXPECT_ERROR(g, ALLOY_ERR_NOT_FOUND, "feed 'nope'", "no input");
    alloy_graph_free(g);
}

static void test_fetch_with_an_unknown_name_is_not_found(void **state)
{
    (void)state;
    alloy_graph *g = relu_graph();
    float x[6] = {0};
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {2, 3}, x};
    alloy_host_tensor fetch = {.name = "nope"};
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_ERR_NOT_FOUND);
    EXPECT_ERROR(g, ALLOY_ERR_NOT_FOUND, "fetch 'nope'");
    alloy_graph_free(g);
}

static void test_an_input_left_unfed_is_not_found(void **state)
{
    (void)state;
    alloy_graph *g = relu_graph();
    alloy_host_tensor fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(g, NULL, 0, &fetch, 1), ALLOY_ERR_NOT_FOUND);
    EXPECT_ERROR(g, ALLOY_ERR_NOT_FOUND, "input 'x' was not fed");
    alloy_graph_free(g);
}

static void test_feed_of_the_wrong_dtype_is_a_dtype_error_naming_both_types(void **state)
{
    (void)state;
    alloy_graph *g = relu_graph();
    double x[6] = {0};
    alloy_host_tensor feed = {"x", ALLOY_F64, 2, {2, 3}, x};
    alloy_host_tensor fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_ERR_DTYPE);
    EXPECT_ERROR(g, ALLOY_ERR_DTYPE, "feed 'x'", "f32[2,3]", "f64[2,3]");
    alloy_graph_free(g);
}

static void test_feed_of_the_wrong_shape_is_a_shape_error_naming_both_shapes(void **state)
{
    (void)state;
    alloy_graph *g = relu_graph();
    float x[6] = {0};
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {3, 2}, x};
    alloy_host_tensor fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_ERR_SHAPE);
    EXPECT_ERROR(g, ALLOY_ERR_SHAPE, "feed 'x'", "f32[2,3]", "f32[3,2]");
    feed.rank = 1;
    feed.dims[0] = 6;
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_ERR_SHAPE);
    EXPECT_ERROR(g, ALLOY_ERR_SHAPE, "f32[6]");
    alloy_graph_free(g);
}

/* ---- state ---- */

static void test_state_set_get_save_and_load_round_trip_through_a_file(void **state)
{
    (void)state;
    alloy_graph *g = param_graph(3, 2, 3, alloy_init_normal(1.0));
    assert_int_equal(alloy_graph_state_count(g), 2);
    alloy_host_tensor t;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(alloy_graph_state_at(g, i, &t), ALLOY_OK);
        assert_true(strcmp(t.name, "w") == 0 || strcmp(t.name, "b") == 0);
    }
    assert_int_equal(alloy_graph_state_at(g, 2, &t), ALLOY_ERR_NOT_FOUND);

    float w[6] = {1, -2, 3.5f, -4, 5, 0.25f}, b[3] = {7, 8, 9};
    alloy_host_tensor ws = {"w", ALLOY_F32, 2, {2, 3}, w}, bs = {"b", ALLOY_F32, 1, {3}, b};
    assert_int_equal(alloy_graph_set_state(g, &ws), ALLOY_OK);
    assert_int_equal(alloy_graph_set_state(g, &bs), ALLOY_OK);
    assert_int_equal(alloy_graph_get_state(g, "w", &t), ALLOY_OK);
    assert_memory_equal(t.data, w, sizeof w);
    assert_int_equal(alloy_graph_save_state(g, test_tmp_path("state.safetensors")), ALLOY_OK);

    /* a second graph with other initial values takes the saved ones */
    alloy_graph *g2 = param_graph(99, 2, 3, alloy_init_normal(1.0));
    assert_int_equal(alloy_graph_get_state(g2, "w", &t), ALLOY_OK);
    assert_memory_not_equal(t.data, w, sizeof w);
    assert_int_equal(alloy_graph_load_state(g2, test_tmp_path("state.safetensors")), ALLOY_OK);
    assert_int_equal(alloy_graph_get_state(g2, "w", &t), ALLOY_OK);
    assert_memory_equal(t.data, w, sizeof w);
    assert_int_equal(alloy_graph_get_state(g2, "b", &t), ALLOY_OK);
    assert_memory_equal(t.data, b, sizeof b);

    /* and runs with them: y = x @ w + b */
    float x[2] = {1, 2};
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {1, 2}, x};
    alloy_host_tensor fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(g2, &feed, 1, &fetch, 1), ALLOY_OK);
    const float *y = fetch.data;
    assert_true(y[0] == 1 * 1 + 2 * -4 + 7);
    assert_true(y[1] == 1 * -2 + 2 * 5 + 8);
    assert_true(y[2] == 1 * 3.5f + 2 * 0.25f + 9);
    alloy_graph_free(g);
    alloy_graph_free(g2);
}

static void test_set_state_of_the_wrong_shape_or_name_changes_nothing(void **state)
{
    (void)state;
    alloy_graph *g = param_graph(3, 2, 3, alloy_init_normal(1.0));
    int64_t n;
    float *before = state_copy(g, "w", &n);
    float w[6] = {0};
    alloy_host_tensor ws = {"w", ALLOY_F32, 2, {3, 2}, w};
    assert_int_equal(alloy_graph_set_state(g, &ws), ALLOY_ERR_SHAPE);
    EXPECT_ERROR(g, ALLOY_ERR_SHAPE, "'w'", "f32[2,3]", "f32[3,2]");
    ws.name = "nope";
    assert_int_equal(alloy_graph_set_state(g, &ws), ALLOY_ERR_NOT_FOUND);
    alloy_host_tensor t;
    assert_int_equal(alloy_graph_get_state(g, "nope", &t), ALLOY_ERR_NOT_FOUND);
    float *after = state_copy(g, "w", &n);
    assert_memory_equal(before, after, sizeof(float) * (size_t)n);
    free(before);
    free(after);
    alloy_graph_free(g);
}

static void test_load_state_rejects_a_wrong_shaped_tensor_and_changes_nothing(void **state)
{
    (void)state;
    alloy_graph *g = param_graph(5, 2, 3, alloy_init_normal(1.0));
    int64_t nw, nb;
    float *w_before = state_copy(g, "w", &nw), *b_before = state_copy(g, "b", &nb);
    /* b is right and comes first; w has the wrong shape */
    float b[3] = {1, 2, 3}, w[6] = {1, 2, 3, 4, 5, 6};
    alloy_host_tensor file[2] = {{"b", ALLOY_F32, 1, {3}, b}, {"w", ALLOY_F32, 2, {3, 2}, w}};
    char err[512];
    assert_int_equal(alloy_safetensors_save(test_tmp_path("bad.safetensors"), file, 2, NULL, NULL, 0,
                                            err, sizeof err),
                     ALLOY_OK);
    assert_int_equal(alloy_graph_load_state(g, test_tmp_path("bad.safetensors")), ALLOY_ERR_SHAPE);
    EXPECT_ERROR(g, ALLOY_ERR_SHAPE, "bad.safetensors", "'w'", "f32[2,3]", "f32[3,2]");
    float *w_after = state_copy(g, "w", &nw), *b_after = state_copy(g, "b", &nb);
    assert_memory_equal(w_before, w_after, sizeof(float) * (size_t)nw);
    assert_memory_equal(b_before, b_after, sizeof(float) * (size_t)nb);
    free(w_before);
    free(b_before);
    free(w_after);
    free(b_after);
    alloy_graph_free(g);
}

static void test_load_state_rejects_a_file_with_a_tensor_the_graph_lacks(void **state)
{
    (void)state;
    alloy_graph *g = param_graph(5, 2, 3, alloy_init_zeros());
    float b[3] = {1, 2, 3}, w[6] = {1, 2, 3, 4, 5, 6}, extra[1] = {42};
    alloy_host_tensor file[3] = {{"b", ALLOY_F32, 1, {3}, b},
                                 {"w", ALLOY_F32, 2, {2, 3}, w},
                                 {"extra", ALLOY_F32, 1, {1}, extra}};
    char err[512];
    assert_int_equal(alloy_safetensors_save(test_tmp_path("extra.safetensors"), file, 3, NULL, NULL, 0,
                                            err, sizeof err),
                     ALLOY_OK);
    assert_int_equal(alloy_graph_load_state(g, test_tmp_path("extra.safetensors")), ALLOY_ERR_NOT_FOUND);
    EXPECT_ERROR(g, ALLOY_ERR_NOT_FOUND, "'extra'");
    alloy_host_tensor t;
    assert_int_equal(alloy_graph_get_state(g, "b", &t), ALLOY_OK);
    assert_true(((const float *)t.data)[0] == 0);
    assert_int_equal(alloy_graph_load_state(g, test_tmp_path("missing.safetensors")), ALLOY_ERR_IO);
    alloy_graph_free(g);
}

/* ---- parameter init ---- */

static void test_same_seed_and_name_give_the_same_initial_values(void **state)
{
    (void)state;
    alloy_graph *a = param_graph(42, 8, 8, alloy_init_normal(1.0));
    alloy_graph *b = param_graph(42, 8, 8, alloy_init_normal(1.0));
    int64_t n;
    float *va = state_copy(a, "w", &n), *vb = state_copy(b, "w", &n);
    assert_memory_equal(va, vb, sizeof(float) * (size_t)n);
    free(va);
    free(vb);
    alloy_graph_free(a);
    alloy_graph_free(b);
}

static void test_another_seed_or_name_gives_other_values_and_neighbours_do_not_matter(void **state)
{
    (void)state;
    alloy_graph *a = param_graph(42, 8, 8, alloy_init_normal(1.0));
    alloy_graph *b = param_graph(43, 8, 8, alloy_init_normal(1.0));
    /* c has "v" with w's shape declared before "w", and the same seed as a */
    alloy_graph *c = alloy_graph_new("c");
    alloy_graph_set_seed(c, 42);
    alloy_param(c, "v", ALLOY_F32, 2, DIMS(8, 8), alloy_init_normal(1.0));
    alloy_param(c, "w", ALLOY_F32, 2, DIMS(8, 8), alloy_init_normal(1.0));
    int64_t n;
    float *wa = state_copy(a, "w", &n), *wb = state_copy(b, "w", &n);
    float *vc = state_copy(c, "v", &n), *wc = state_copy(c, "w", &n);
    size_t bytes = sizeof(float) * (size_t)n;
    assert_memory_not_equal(wa, wb, bytes); /* other seed */
    assert_memory_not_equal(wa, vc, bytes); /* other name */
    assert_memory_equal(wa, wc, bytes);     /* adding "v" left "w" alone */
    free(wa);
    free(wb);
    free(vc);
    free(wc);
    alloy_graph_free(a);
    alloy_graph_free(b);
    alloy_graph_free(c);
}

static void test_kaiming_uniform_stays_within_its_bound_and_fills_it(void **state)
{
    (void)state;
    const int64_t fan_in = 400, fan_out = 500;
    const double gain = sqrt(2.0), bound = gain * sqrt(3.0 / (double)fan_in);
    alloy_graph *g = param_graph(7, fan_in, fan_out, alloy_init_kaiming_uniform(gain));
    int64_t n;
    float *w = state_copy(g, "w", &n);
    double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0;
    for (int64_t i = 0; i < n; i++) {
        lo = fmin(lo, w[i]);
        hi = fmax(hi, w[i]);
        sum += w[i];
        sq += (double)w[i] * w[i];
    }
    double mean = sum / (double)n, var = sq / (double)n - mean * mean;
    assert_true(lo >= -bound && hi <= bound);
    assert_true(lo < -0.999 * bound && hi > 0.999 * bound);
    /* U(-b, b): mean 0, variance b^2/3; 200000 draws, 6 sigma */
    assert_true(fabs(mean) < 6 * bound / sqrt(3.0 * (double)n));
    assert_true(fabs(var / (bound * bound / 3) - 1) < 0.02);
    free(w);
    alloy_graph_free(g);
}

static void test_normal_init_has_the_requested_mean_and_std(void **state)
{
    (void)state;
    const double std = 0.5;
    alloy_graph *g = param_graph(11, 500, 500, alloy_init_normal(std));
    int64_t n;
    float *w = state_copy(g, "w", &n);
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; i++) sum += w[i];
    double mean = sum / (double)n;
    for (int64_t i = 0; i < n; i++) sq += (w[i] - mean) * (w[i] - mean);
    double got_std = sqrt(sq / (double)(n - 1));
    /* 250000 draws: the mean's sd is std/500, the std's about std/707; 6 sigma */
    assert_true(fabs(mean) < 6 * std / sqrt((double)n));
    assert_true(fabs(got_std - std) < 6 * std / sqrt(2.0 * (double)n));
    free(w);
    alloy_graph_free(g);
}

static void test_zeros_ones_and_constant_init_fill_exactly(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("g");
    alloy_param(g, "z", ALLOY_F32, 1, DIMS(5), alloy_init_zeros());
    alloy_param(g, "o", ALLOY_F32, 1, DIMS(5), alloy_init_ones());
    alloy_param(g, "c", ALLOY_F32, 1, DIMS(5), alloy_init_constant(-2.5));
    static const char *const names[3] = {"z", "o", "c"};
    static const float want[3] = {0, 1, -2.5f};
    for (int k = 0; k < 3; k++) {
        int64_t n;
        float *v = state_copy(g, names[k], &n);
        for (int64_t i = 0; i < n; i++) assert_true(v[i] == want[k]);
        free(v);
    }
    alloy_graph_free(g);
}

/* Names the training passes make (moments, counters, the scale, gradient
 * outputs) are refused when built, saying why; they were accepted and
 * failed the compile (or a param "w.m" silently became w's moment). */
static void test_reserved_names_are_refused_when_built_saying_what_makes_them(void **state)
{
    (void)state;
    static const struct {
        int how; /* 0 param, 1 set_name, 2 output */
        const char *name, *says;
    } cases[] = {
        {0, "w1.m", "param: the name 'w1.m' is reserved for the optimizer's state: Adam's first moment of 'w1'"},
        {1, "w1.v", "set_name: the name 'w1.v' is reserved for the optimizer's state: Adam's second moment of 'w1'"},
        {0, "w1.momentum", "SGD's momentum buffer of 'w1'"},
        {1, "w1.grad_acc", "gradient accumulation's state"},
        {0, "optim.step", "param: the name 'optim.step' is reserved: the optimizer names its state optim.*"},
        {1, "scaler.scale", "set_name: the name 'scaler.scale' is reserved: the loss scaler names its state"},
        {2, "grad:w1", "output: the name 'grad:w1' is reserved: autodiff names the gradient outputs grad:<name>"},
        {2, "step.lr", "output: the name 'step.lr' is reserved: the training step names its state and outputs"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        alloy_graph *g = alloy_graph_new("names");
        alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(2, 3));
        alloy_tensor *w = alloy_param(g, "w1", F32, 2, DIMS(3, 1), alloy_init_ones());
        alloy_tensor *y = alloy_matmul(g, x, w, false, false);
        bool refused = cases[i].how == 0   ? !alloy_param(g, cases[i].name, F32, 1, DIMS(1), alloy_init_ones())
                       : cases[i].how == 1 ? !alloy_set_name(g, y, cases[i].name)
                                           : alloy_output(g, cases[i].name, y) != ALLOY_OK;
        if (!refused || !strstr(alloy_last_error(g), cases[i].says))
            fail_msg("%s: %s '%s', want '%s'", cases[i].name, refused ? "refused" : "accepted", alloy_last_error(g),
                     cases[i].says);
        assert_int_equal(alloy_graph_status(g), ALLOY_ERR_INVALID);
        alloy_graph_free(g);
    }
    /* the other order: a param whose moments' names a node already has */
    alloy_graph *g = alloy_graph_new("names");
    alloy_tensor *x = alloy_input(g, "x", F32, 1, DIMS(3));
    assert_non_null(alloy_set_name(g, alloy_relu(g, x), "b.m"));
    assert_null(alloy_param(g, "b", F32, 1, DIMS(3), alloy_init_zeros()));
    EXPECT_ERROR(g, ALLOY_ERR_INVALID, "param: 'b' would own the optimizer's state: Adam's first moment, named 'b.m'");
    alloy_graph_free(g);
    /* names that only look alike stay free: "attn.v" without a param "attn", an output "w1.m" */
    g = alloy_graph_new("names");
    x = alloy_input(g, "x", F32, 1, DIMS(3));
    alloy_tensor *w = alloy_param(g, "w1", F32, 1, DIMS(3), alloy_init_ones());
    assert_non_null(alloy_param(g, "attn.v", F32, 1, DIMS(3), alloy_init_ones()));
    assert_non_null(alloy_set_name(g, alloy_relu(g, x), "x.m")); /* x is an input: it has no moments */
    expect_ok(g, alloy_output(g, "w1.m", alloy_mul(g, x, w)), "output w1.m");
    assert_int_equal(alloy_graph_status(g), ALLOY_OK);
    alloy_graph_free(g);
}

/* Fetching a gradient from a graph that computes none says what it needs. */
static void test_fetching_a_gradient_without_a_loss_says_a_loss_is_needed(void **state)
{
    (void)state;
    alloy_graph *g = relu_graph();
    float x[6] = {-1, 2, -3, 4, -5, 6};
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {2, 3}, x}, fetch = {.name = "grad:x"};
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_ERR_NOT_FOUND);
    assert_string_equal(alloy_last_error(g),
                        "fetch 'grad:x': graph 'relu_graph' computes no gradients: they need a loss (alloy_graph_set_loss)");
    alloy_graph_free(g);
}

/* A param's init must give finite values of its dtype: NaN or inf in any
 * number an init reads, and a constant that rounds to inf in the dtype
 * (1e39 into f16 or f32, 70000 into f16) or leaves an integer's range, are
 * refused naming the init and the number (they were accepted). */
static void test_param_inits_that_give_nan_inf_or_values_out_of_the_dtype_are_refused(void **state)
{
    (void)state;
    static const struct {
        alloy_dtype dtype;
        alloy_init init;
        const char *says;
    } cases[] = {
        {ALLOY_F16, {ALLOY_INIT_CONSTANT, 1e39, 0}, "init \"constant\": value 1e+39 does not fit f16 (it rounds to inf)"},
        {ALLOY_F16, {ALLOY_INIT_CONSTANT, 70000, 0}, "value 70000 does not fit f16"},
        {ALLOY_F32, {ALLOY_INIT_CONSTANT, 1e39, 0}, "value 1e+39 does not fit f32"},
        {ALLOY_BF16, {ALLOY_INIT_CONSTANT, INFINITY, 0}, "init \"constant\": value is inf; it must be finite"},
        {ALLOY_I32, {ALLOY_INIT_CONSTANT, 3e9, 0}, "value 3e+09 does not fit i32 (out of its range)"},
        {ALLOY_F32, {ALLOY_INIT_NORMAL, 0, NAN}, "init \"normal\": std is nan; it must be finite"},
        {ALLOY_F32, {ALLOY_INIT_NORMAL, INFINITY, 1}, "init \"normal\": mean is inf"},
        {ALLOY_F32, {ALLOY_INIT_UNIFORM, -INFINITY, 1}, "init \"uniform\": low is -inf"},
        {ALLOY_F32, {ALLOY_INIT_XAVIER_NORMAL, NAN, 0}, "init \"xavier_normal\": gain is nan"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        alloy_graph *g = alloy_graph_new("inits");
        alloy_tensor *p = alloy_param(g, "p", cases[i].dtype, 1, DIMS(3), cases[i].init);
        if (p || !strstr(alloy_last_error(g), cases[i].says))
            fail_msg("case %zu: %s '%s', want '%s'", i, p ? "accepted" : "refused", alloy_last_error(g), cases[i].says);
        alloy_graph_free(g);
    }
    /* the largest values that fit are accepted */
    alloy_graph *g = alloy_graph_new("inits");
    assert_non_null(alloy_param(g, "h", ALLOY_F16, 1, DIMS(3), alloy_init_constant(65504)));
    assert_non_null(alloy_param(g, "i", ALLOY_I32, 1, DIMS(3), alloy_init_constant(2147483647.0)));
    alloy_graph_free(g);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, test_tmpdir_setup, test_tmpdir_teardown)
    const struct CMUnitTest tests[] = {
        T(test_add_of_unbroadcastable_shapes_names_op_operand_types_and_node),
        T(test_reserved_names_are_refused_when_built_saying_what_makes_them),
        T(test_param_inits_that_give_nan_inf_or_values_out_of_the_dtype_are_refused),
        T(test_fetching_a_gradient_without_a_loss_says_a_loss_is_needed),
        T(test_add_of_different_dtypes_is_a_dtype_error_that_suggests_a_cast),
        T(test_matmul_with_different_inner_dims_names_both_dims),
        T(test_matmul_transpose_flags_make_the_same_operands_fit),
        T(test_softmax_axis_out_of_range_is_an_invalid_argument),
        T(test_a_nan_bound_or_slope_is_an_invalid_argument_naming_the_op_and_attribute),
        T(test_clamp_leaky_relu_elu_and_sign_compute_what_pytorch_does),
        T(test_argmax_argmin_and_one_hot_compute_what_pytorch_does),
        T(test_reduce_and_slice_reject_bad_axes),
        T(test_negative_axes_count_from_the_end),
        T(test_null_operand_is_an_invalid_argument_naming_the_op),
        T(test_calls_on_a_null_graph_return_null_or_invalid_without_crashing),
        T(test_poisoned_handle_passes_through_quietly_and_run_returns_the_first_error),
        T(test_handle_from_another_graph_is_rejected),
        T(test_duplicate_node_names_are_rejected),
        T(test_duplicate_output_names_are_rejected),
        T(test_reshape_infers_one_minus_one_dim),
        T(test_reshape_rejects_two_minus_ones_an_uneven_split_and_a_count_change),
        T(test_reshape_rejects_dims_whose_product_overflows),
    T(test_an_empty_shape_whose_other_dims_multiply_past_the_limit_is_refused),
        T(test_run_computes_a_fetch_and_a_failed_run_leaves_the_graph_usable),
        T(test_feed_with_an_unknown_name_is_not_found),
        T(test_fetch_with_an_unknown_name_is_not_found),
        T(test_an_input_left_unfed_is_not_found),
        T(test_feed_of_the_wrong_dtype_is_a_dtype_error_naming_both_types),
        T(test_feed_of_the_wrong_shape_is_a_shape_error_naming_both_shapes),
        T(test_state_set_get_save_and_load_round_trip_through_a_file),
        T(test_set_state_of_the_wrong_shape_or_name_changes_nothing),
        T(test_load_state_rejects_a_wrong_shaped_tensor_and_changes_nothing),
        T(test_load_state_rejects_a_file_with_a_tensor_the_graph_lacks),
        T(test_same_seed_and_name_give_the_same_initial_values),
        T(test_another_seed_or_name_gives_other_values_and_neighbours_do_not_matter),
        T(test_kaiming_uniform_stays_within_its_bound_and_fills_it),
        T(test_normal_init_has_the_requested_mean_and_std),
        T(test_zeros_ones_and_constant_init_fill_exactly),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
