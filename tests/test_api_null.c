/* test_api_null.c - every public call with NULL and out-of-range arguments: an error (never a crash), and a message of its own. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "alloy_config.h"
#include "support.h"

/* ---- every call on a NULL graph ---- */

static void every_call_on_a_null_graph_fails_without_crashing(void **state)
{
    (void)state;
    alloy_graph *g = NULL;
    alloy_tensor *t = NULL, *ts[2] = {NULL, NULL};
    alloy_host_tensor h = {.name = "x"};
    alloy_memory_info mi;
    alloy_device_memory dm;
    alloy_amp_report ar;
    alloy_step_info si;
    const int64_t d[2] = {2, 3};
    alloy_graph_free(g);
    alloy_graph_set_seed(g, 1);
    assert_int_equal(alloy_graph_status(g), ALLOY_ERR_INVALID);
    assert_string_equal(alloy_last_error(g), "no graph (NULL)");
    assert_null(alloy_input(g, "x", F32, 2, d));
    assert_null(alloy_param(g, "w", F32, 2, d, alloy_init_zeros()));
    assert_null(alloy_constant(g, F32, 1, d, (const double[]){1, 2}));
    assert_null(alloy_full(g, F32, 2, d, 1.0));
    assert_null(alloy_scalar(g, F32, 1.0));
    alloy_tensor *(*const unary[])(alloy_graph *, alloy_tensor *) = {
        alloy_neg,  alloy_relu, alloy_gelu, alloy_gelu_tanh, alloy_tanh,   alloy_sigmoid, alloy_silu,   alloy_exp,
        alloy_log,  alloy_sqrt, alloy_rsqrt, alloy_square,   alloy_causal_mask, alloy_amp_allow, alloy_amp_deny,
        alloy_sin,  alloy_cos,  alloy_abs,   alloy_sign,     alloy_erf,    alloy_log1p,   alloy_expm1,  alloy_softplus};
    alloy_tensor *(*const binary[])(alloy_graph *, alloy_tensor *, alloy_tensor *) = {
        alloy_add,   alloy_sub,       alloy_mul,  alloy_div,        alloy_maximum, alloy_minimum, alloy_pow,
        alloy_equal, alloy_not_equal, alloy_less, alloy_less_equal, alloy_greater, alloy_greater_equal,
        alloy_cross_entropy, alloy_embedding};
    for (size_t i = 0; i < sizeof unary / sizeof *unary; i++) assert_null(unary[i](g, t));
    for (size_t i = 0; i < sizeof binary / sizeof *binary; i++) assert_null(binary[i](g, t, t));
    assert_null(alloy_where(g, t, t, t));
    assert_null(alloy_leaky_relu(g, t, 0.01));
    assert_null(alloy_elu(g, t, 1.0));
    assert_null(alloy_clamp(g, t, -1, 1));
    assert_null(alloy_argmax(g, t, -1, false));
    assert_null(alloy_argmin(g, t, 0, true));
    assert_null(alloy_one_hot(g, t, 4, F32));
    assert_null(alloy_conv2d(g, t, t, t, NULL, NULL, NULL, 1));
    assert_null(alloy_conv1d(g, t, t, NULL, 1, 0, 1, 1));
    assert_null(alloy_max_pool2d(g, t, DIMS(2, 2), NULL, NULL));
    assert_null(alloy_avg_pool2d(g, t, DIMS(2, 2), NULL, NULL, true));
    assert_null(alloy_adaptive_avg_pool2d(g, t, DIMS(1, 1)));
    assert_null(alloy_matmul(g, t, t, false, true));
    assert_null(alloy_reduce_sum(g, t, 0, NULL, false));
    assert_null(alloy_reduce_mean(g, t, 1, (const int64_t[]){0}, true));
    assert_null(alloy_reduce_max(g, t, 0, NULL, false));
    assert_null(alloy_softmax(g, t, -1));
    assert_null(alloy_log_softmax(g, t, -1));
    assert_null(alloy_layer_norm(g, t, t, t, 1e-5));
    assert_null(alloy_rms_norm(g, t, NULL, 1e-5));
    assert_null(alloy_batch_norm(g, t, "bn", 0.1, 1e-5, true));
    assert_null(alloy_group_norm(g, t, 2, NULL, NULL, 1e-5));
    assert_null(alloy_gather(g, t, 0, t));
    assert_null(alloy_index_select(g, t, 0, t));
    assert_null(alloy_arange(g, 0, 4, 1, F32));
    assert_null(alloy_cumsum(g, t, 0));
    assert_null(alloy_mse_loss(g, t, t, ALLOY_REDUCTION_MEAN));
    assert_null(alloy_l1_loss(g, t, t, ALLOY_REDUCTION_SUM));
    assert_null(alloy_smooth_l1_loss(g, t, t, 1.0, ALLOY_REDUCTION_NONE));
    assert_null(alloy_binary_cross_entropy_with_logits(g, t, t, NULL, ALLOY_REDUCTION_MEAN));
    assert_null(alloy_nll_loss(g, t, t, NULL, -100, ALLOY_REDUCTION_MEAN));
    assert_null(alloy_cross_entropy_loss(g, t, t, NULL, -100, 0.1, ALLOY_REDUCTION_MEAN));
    assert_null(alloy_reshape(g, t, 2, d));
    assert_null(alloy_transpose(g, t, (const int64_t[]){1, 0}));
    assert_null(alloy_broadcast_to(g, t, 2, d));
    assert_null(alloy_slice(g, t, 0, 0, 1));
    assert_null(alloy_concat(g, 2, ts, 0));
    assert_null(alloy_cast(g, t, F16));
    assert_null(alloy_set_name(g, t, "n"));
    assert_int_equal(alloy_output(g, "y", t), ALLOY_ERR_INVALID);
    assert_null(alloy_graph_find(g, "x"));
    assert_int_equal(alloy_graph_output_count(g), 0);
    assert_null(alloy_graph_output_name(g, 0));
    assert_int_equal(alloy_graph_input_count(g), 0);
    assert_int_equal(alloy_graph_input_at(g, 0, &h), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_tensor_info(t).rank, -1); /* no tensor: rank -1, dtype ALLOY_DTYPE_COUNT */
    assert_int_equal(alloy_graph_run(g, NULL, 0, NULL, 0), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_state_count(g), 0);
    assert_int_equal(alloy_graph_state_at(g, 0, &h), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_get_state(g, "w", &h), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_set_state(g, &h), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_save_state(g, "/nonexistent/s"), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_load_state(g, "/nonexistent/s"), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_save_params(g, "/nonexistent/s"), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_load_params(g, "/nonexistent/s", NULL, NULL), ALLOY_ERR_INVALID);
    int shared = -1, unshared = -1;
    assert_int_equal(alloy_graph_share_state(g, NULL, &shared, &unshared), ALLOY_ERR_INVALID);
    assert_true(shared == 0 && unshared == 0);
    assert_null(alloy_linear(g, t, "fc", 2, 2, true));
    assert_int_equal(alloy_graph_print_after(g, "amp", NULL), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_memory_info(g, &mi), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_device_memory(g, &dm), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_set_option(g, "amp_log", "1"), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_dump(g, stderr, ALLOY_DUMP_SOURCE), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_enable_amp(g, F16), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_amp_lists_add(g, ALLOY_AMP_ALLOWLIST, "matmul"), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_amp_lists_remove(g, ALLOY_AMP_ALLOWLIST, "matmul"), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_amp_set_unlisted(g, ALLOY_AMP_DENYLIST), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_amp_scope_push(g, F32), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_amp_scope_pop(g), ALLOY_ERR_INVALID);
    assert_null(alloy_graph_device(g));
    assert_int_equal(alloy_graph_amp_report(g, &ar), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_amp_stats(g, stdout), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_amp_stats_count(g), 0);
    assert_int_equal(alloy_graph_amp_stats_at(g, 0, NULL), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_save_amp_stats(g, "x.stats"), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_export_cuda(g, "sm_80", "/nonexistent/d"), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_cost(g, NULL, NULL, NULL), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_cost_report(g, stderr, "sm_90"), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_set_loss(g, t), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_set_training(g, true), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_request_grad(g, t), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_param_freeze(g, t), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0, 0, false)), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_set_lr(g, 0.1), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_set_param_group(g, "*", 1, false), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_step_info(g, &si), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_save_checkpoint(g, "/nonexistent/c"), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_set_data_parallel(g, NULL, NULL), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_load_checkpoint(g, "/nonexistent/c"), ALLOY_ERR_INVALID);
}

/* ---- calls without a graph ---- */

static void calls_without_a_graph_reject_null_and_out_of_range_arguments(void **state)
{
    (void)state;
    alloy_dtype dt = F64;
    assert_string_equal(alloy_dtype_name((alloy_dtype)99), "?");
    assert_string_equal(alloy_dtype_name((alloy_dtype)-1), "?");
    assert_int_equal(alloy_dtype_from_name(NULL, &dt), -1);
    assert_int_equal(alloy_dtype_from_name("f32", NULL), -1);
    assert_int_equal(alloy_dtype_from_name("f8", &dt), -1);
    assert_int_equal(dt, F64); /* untouched by the failures */
    assert_int_equal(alloy_dtype_size((alloy_dtype)ALLOY_DTYPE_COUNT), 0);
    assert_string_equal(alloy_status_name((alloy_status)99), "unknown status");
    assert_int_equal(alloy_host_tensor_numel(NULL), -1);
    /* communicators: NULL in, -1 or an error out, no MPI started */
    assert_int_equal(alloy_comm_rank(NULL), -1);
    assert_int_equal(alloy_comm_size(NULL), -1);
    assert_int_equal(alloy_comm_local_rank(NULL), -1);
    alloy_comm_free(NULL);
    assert_int_equal(alloy_comm_world(NULL, NULL, 0), alloy_have_mpi() ? ALLOY_ERR_INVALID : ALLOY_ERR_UNSUPPORTED);
    assert_int_equal(alloy_comm_from_mpi_handle(0, NULL, NULL, 0), alloy_have_mpi() ? ALLOY_ERR_INVALID : ALLOY_ERR_UNSUPPORTED);
    /* bundles: a NULL bundle, path or output is refused, never dereferenced */
    char berr[128] = "";
    alloy_bundle *bundle = (alloy_bundle *)(uintptr_t)1;
    alloy_host_tensor bt = {0};
    alloy_step_info binfo;
    assert_int_equal(alloy_bundle_load(NULL, &bundle, berr, sizeof berr), ALLOY_ERR_INVALID);
    assert_null(bundle);
    assert_int_equal(alloy_bundle_load("/nonexistent/b.alloy", NULL, berr, sizeof berr), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_bundle_load("/nonexistent/b.alloy", &bundle, berr, sizeof berr), ALLOY_ERR_IO);
    assert_non_null(strstr(berr, "/nonexistent/b.alloy"));
    assert_int_equal(alloy_bundle_run(NULL, NULL, 0, NULL, 0), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_bundle_input_count(NULL), 0);
    assert_int_equal(alloy_bundle_input_at(NULL, 0, &bt), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_bundle_step_info(NULL, &binfo), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_bundle_state_count(NULL), 0); /* as alloy_graph_state_count(NULL) */
    assert_int_equal(alloy_bundle_state_at(NULL, 0, &bt), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_bundle_get_state(NULL, "w", &bt), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_bundle_set_state(NULL, &bt), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_bundle_save_state(NULL, "/nonexistent/s"), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_bundle_load_state(NULL, "/nonexistent/s"), ALLOY_ERR_INVALID);
    assert_non_null(alloy_bundle_last_error(NULL));
    alloy_bundle_free(NULL);
    assert_int_equal(alloy_graph_save_bundle(NULL, "/nonexistent/b.alloy", NULL), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_save_bundle_flags(NULL, "/nonexistent/b.alloy", NULL, ALLOY_BUNDLE_WITH_STATE), ALLOY_ERR_INVALID);
    alloy_host_tensor h = {.rank = ALLOY_MAX_RANK + 1, .dims = {1, 1, 1, 1, 1, 1, 1, 1}};
    assert_int_equal(alloy_host_tensor_numel(&h), -1); /* dims has 8 entries: rank 9 would read past them */
    h.rank = 1000000;
    assert_int_equal(alloy_host_tensor_numel(&h), -1);
    h.rank = -1;
    assert_int_equal(alloy_host_tensor_numel(&h), -1);
    h = (alloy_host_tensor){.rank = 2, .dims = {3, -1}};
    assert_int_equal(alloy_host_tensor_numel(&h), -1);
    h = (alloy_host_tensor){.rank = 2, .dims = {INT64_MAX / 2, 3}};
    assert_int_equal(alloy_host_tensor_numel(&h), -1);
    h = (alloy_host_tensor){.rank = 8, .dims = {2, 2, 2, 2, 2, 2, 2, 3}};
    assert_int_equal(alloy_host_tensor_numel(&h), 384);
    h.rank = 0;
    assert_int_equal(alloy_host_tensor_numel(&h), 1);

    char err[256];
    assert_null(alloy_graph_parse(NULL, 5, "f.ir", err, sizeof err));
    assert_string_equal(err, "f.ir: no text (NULL)");
    assert_null(alloy_graph_parse(NULL, 5, NULL, NULL, 0)); /* no buffer: nothing written */
    assert_null(alloy_graph_parse("graph", 5, NULL, err, sizeof err));
    assert_non_null(strstr(err, "<input>:1:"));
    assert_null(alloy_graph_load_ir(NULL, err, sizeof err));
    assert_string_equal(err, "alloy_graph_load_ir: path is NULL");
    assert_null(alloy_graph_load_ir(NULL, NULL, 0));
    assert_null(alloy_graph_load_ir("/", err, sizeof err));
    assert_string_equal(err, "/: is a directory");
    alloy_graph *g = alloy_graph_new(NULL); /* a name is optional */
    assert_non_null(g);
    alloy_graph_free(g);

    alloy_safetensors *st = (alloy_safetensors *)&err; /* must be set to NULL on failure */
    assert_int_equal(alloy_safetensors_load(NULL, &st, err, sizeof err), ALLOY_ERR_INVALID);
    assert_string_equal(err, "alloy_safetensors_load: path is NULL");
    assert_int_equal(alloy_safetensors_load("/x", NULL, err, sizeof err), ALLOY_ERR_INVALID);
    assert_string_equal(err, "alloy_safetensors_load: out is NULL");
    assert_int_equal(alloy_safetensors_load("/", &st, err, sizeof err), ALLOY_ERR_IO);
    assert_null(st);
    assert_string_equal(err, "/: cannot read: it is a directory, not a regular file");
    assert_int_equal(alloy_safetensors_count(NULL), 0);
    assert_null(alloy_safetensors_get(NULL, 0));
    assert_null(alloy_safetensors_find(NULL, "w"));
    assert_null(alloy_safetensors_metadata(NULL, "format"));
    alloy_safetensors_free(NULL);
    const alloy_host_tensor good = {"w", F32, 1, {2}, (float[]){1, 2}};
    static const struct {
        const char *path;
        alloy_host_tensor t;
        int n, nmeta;
        const char *message;
    } saves[] = {
        {NULL, {"w", F32, 1, {2}, NULL}, 1, 0, "(null): alloy_safetensors_save: path is NULL"},
        {"/nonexistent/s", {"w", F32, 1, {2}, NULL}, -1, 0, "/nonexistent/s: alloy_safetensors_save: negative count"},
        {"/nonexistent/s", {"w", F32, 1, {2}, NULL}, 1, 1, "/nonexistent/s: alloy_safetensors_save: metadata arrays are NULL"},
        {"/nonexistent/s", {NULL, F32, 1, {2}, NULL}, 1, 0, "/nonexistent/s: tensor #0 has a NULL name"},
        {"/nonexistent/s", {"w", F32, 9, {2}, NULL}, 1, 0, "rank outside [0, 8]"},
        {"/nonexistent/s", {"w", (alloy_dtype)42, 1, {2}, NULL}, 1, 0, "dtype is not an alloy_dtype value"},
        {"/nonexistent/s", {"w", F32, 1, {-2}, NULL}, 1, 0, "negative dim or too many elements"},
        {"/nonexistent/s", {"w", F32, 1, {2}, NULL}, 1, 0, "tensor 'w' (f32 [2], dtype value 0): data is NULL"},
    };
    for (size_t i = 0; i < sizeof saves / sizeof *saves; i++) {
        alloy_status s = alloy_safetensors_save(saves[i].path, &saves[i].t, saves[i].n, NULL, NULL, saves[i].nmeta,
                                                err, sizeof err);
        if (s != ALLOY_ERR_INVALID || !strstr(err, saves[i].message))
            test_case_failed("save case %zu: status %d, '%s' (want '%s')", i, s, err, saves[i].message);
    }
    assert_int_equal(alloy_safetensors_save("/nonexistent/s", NULL, 1, NULL, NULL, 0, err, sizeof err),
                     ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "tensors is NULL"));
    assert_int_equal(alloy_safetensors_save("/nonexistent/s", &good, 1, (const char *const[]){NULL},
                                            (const char *const[]){"v"}, 1, err, sizeof err),
                     ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "metadata pair #0 has a NULL key"));
    test_end_cases();
}

/* ---- calls on a graph: each bad argument fails with a message of its own ---- */

/* A graph with input x f32[2,3], param w f32[3,4], y = x @ w (output "y"),
 * v f32[4] (a param), and s = sum(y) f32[] (named "s"). */
typedef struct fixture {
    alloy_graph *g;
    alloy_tensor *x, *w, *y, *v, *s;
} fixture;

static fixture make_fixture(void)
{
    fixture f = {.g = alloy_graph_new("fixture")};
    assert_non_null(f.g);
    f.x = alloy_input(f.g, "x", F32, 2, DIMS(2, 3));
    f.w = alloy_param(f.g, "w", F32, 2, DIMS(3, 4), alloy_init_ones());
    f.v = alloy_param(f.g, "v", F32, 1, DIMS(4), alloy_init_zeros());
    f.y = alloy_matmul(f.g, f.x, f.w, false, false);
    f.s = alloy_set_name(f.g, alloy_reduce_sum(f.g, f.y, 0, NULL, false), "s");
    assert_int_equal(alloy_output(f.g, "y", f.y), ALLOY_OK);
    assert_non_null(f.s);
    return f;
}

/* One bad call: body makes it on the fixture and says whether it failed as
 * documented (a status, NULL, -1); afterwards alloy_last_error must hold
 * `message` (and not the message of the call before). */
typedef struct bad_call {
    const char *call, *message;
    bool (*body)(fixture *f);
} bad_call;

#define BAD(name, message, expr)                                                                    \
    static bool bad_##name(fixture *f)                                                              \
    {                                                                                               \
        (void)f;                                                                                    \
        return (expr);                                                                              \
    }
#define ROW(name, message, expr) {#name, message, bad_##name},

/* The list, as X-macro lines: BAD defines each body, ROW makes the table. */
/* set_data_parallel without a communicator: what a build with MPI says, or one without */
#if ALLOY_HAVE_MPI
#define DP_NULL_COMM "set_data_parallel: comm is NULL (alloy_comm_world)"
#else
#define DP_NULL_COMM "set_data_parallel: alloy was built without MPI"
#endif

#define BAD_CALLS(X)                                                                                                   \
    X(input_without_name, "input: a name is required", !alloy_input(f->g, NULL, F32, 1, DIMS(2)))                       \
    X(input_of_rank_9, "input: rank 9 is not in [0, 8]", !alloy_input(f->g, "z", F32, 9, DIMS(1, 1, 1, 1, 1, 1, 1, 1, 1))) \
    X(input_of_rank_minus_1, "input: rank -1 is not in [0, 8]", !alloy_input(f->g, "z", F32, -1, NULL))                \
    X(input_with_null_dims, "dims is NULL", !alloy_input(f->g, "z", F32, 2, NULL))                                      \
    X(input_of_unknown_dtype, "input: unknown dtype 99", !alloy_input(f->g, "z", (alloy_dtype)99, 1, DIMS(2)))          \
    X(param_of_unknown_init, "param 'p': unknown init kind 99",                                                         \
      !alloy_param(f->g, "p", F32, 1, DIMS(2), (alloy_init){(alloy_init_kind)99, 0, 0}))                                \
    X(param_random_init_of_ints, "param 'p': random init needs a floating-point dtype",                                 \
      !alloy_param(f->g, "p", I32, 1, DIMS(2), alloy_init_normal(1)))                                                   \
    X(constant_without_values, "constant: 2 values (at most 2^24, values non-NULL)",                                   \
      !alloy_constant(f->g, F32, 1, DIMS(2), NULL))                                                                     \
    X(full_of_rank_9, "constant: rank 9", !alloy_full(f->g, F32, 9, DIMS(1, 1, 1, 1, 1, 1, 1, 1, 1), 0))                 \
    X(scalar_of_unknown_dtype, "constant: unknown dtype 42", !alloy_scalar(f->g, (alloy_dtype)42, 0))                   \
    X(add_of_null, "add: operand 1 is NULL", !alloy_add(f->g, f->x, NULL))                                              \
    X(neg_of_null, "neg: operand 0 is NULL", !alloy_neg(f->g, NULL))                                                    \
    X(greater_equal_of_null, "greater_equal: operand 0 is NULL", !alloy_greater_equal(f->g, NULL, f->x))                \
    X(where_of_null, "where: operand 2 is NULL", !alloy_where(f->g, f->x, f->x, NULL))                                  \
    X(matmul_of_null, "matmul: operand 0 is NULL", !alloy_matmul(f->g, NULL, f->w, false, false))                       \
    X(reduce_sum_of_null, "reduce_sum: operand 0 is NULL", !alloy_reduce_sum(f->g, NULL, 0, NULL, false))               \
    X(reduce_sum_of_minus_1_axes, "reduce_sum: -1 axes (0 to 8)",                                                       \
      !alloy_reduce_sum(f->g, f->x, -1, DIMS(0), false))                                                                \
    X(reduce_mean_of_9_axes, "reduce_mean: 9 axes (0 to 8)",                                                            \
      !alloy_reduce_mean(f->g, f->x, 9, DIMS(0, 1, 0, 1, 0, 1, 0, 1, 0), false))                                        \
    X(reduce_max_of_an_axis_out_of_range, "reduce_max", !alloy_reduce_max(f->g, f->x, 1, DIMS(5), false))               \
    X(softmax_of_null, "softmax: operand 0 is NULL", !alloy_softmax(f->g, NULL, -1))                                    \
    X(log_softmax_of_an_axis_out_of_range, "log_softmax", !alloy_log_softmax(f->g, f->x, 7))                            \
    X(layer_norm_with_gamma_alone, "layer_norm: give both gamma and beta, or neither",                                  \
      !alloy_layer_norm(f->g, f->y, f->v, NULL, 1e-5))                                                                  \
    X(rms_norm_of_null, "rms_norm: operand 0 is NULL", !alloy_rms_norm(f->g, NULL, NULL, 1e-5))                         \
    X(batch_norm_of_null, "batch_norm: x is NULL", !alloy_batch_norm(f->g, NULL, "bn", 0.1, 1e-5, true))              \
    X(batch_norm_without_a_name, "batch_norm: a name is required", !alloy_batch_norm(f->g, f->x, NULL, 0.1, 1e-5, true)) \
    X(group_norm_of_null, "group_norm: operand 0 is NULL", !alloy_group_norm(f->g, NULL, 1, NULL, NULL, 1e-5))           \
    X(gather_of_null, "gather: operand 1 is NULL", !alloy_gather(f->g, f->x, 0, NULL))                                   \
    X(index_select_of_null, "index_select: operand 0 is NULL", !alloy_index_select(f->g, NULL, 0, f->x))                 \
    X(arange_with_step_0, "step != 0", !alloy_arange(f->g, 0, 1, 0, F32))                                               \
    X(cumsum_of_null, "cumsum: operand 0 is NULL", !alloy_cumsum(f->g, NULL, 0))                                         \
    X(cross_entropy_of_null, "cross_entropy: operand 1 is NULL", !alloy_cross_entropy(f->g, f->y, NULL))                \
    X(embedding_of_null, "embedding: operand 0 is NULL", !alloy_embedding(f->g, NULL, f->w))                            \
    X(mse_loss_of_null, "mse_loss: operand 1 is NULL", !alloy_mse_loss(f->g, f->x, NULL, ALLOY_REDUCTION_MEAN))          \
    X(bce_of_null_logits, "binary_cross_entropy_with_logits: operand 0 is NULL",                                        \
      !alloy_binary_cross_entropy_with_logits(f->g, NULL, f->x, NULL, ALLOY_REDUCTION_SUM))                              \
    X(bce_of_null_target, "binary_cross_entropy_with_logits: operand 1 is NULL",                                        \
      !alloy_binary_cross_entropy_with_logits(f->g, f->x, NULL, NULL, ALLOY_REDUCTION_SUM))                              \
    X(nll_loss_of_null, "nll_loss: operand 1 is NULL", !alloy_nll_loss(f->g, f->y, NULL, NULL, -100, ALLOY_REDUCTION_SUM)) \
    X(cross_entropy_loss_of_null, "cross_entropy: operand 0 is NULL",                                                   \
      !alloy_cross_entropy_loss(f->g, NULL, f->y, NULL, -100, 0, ALLOY_REDUCTION_MEAN))                                  \
    X(smooth_l1_loss_of_an_unknown_reduction, "smooth_l1_loss: reduction 9 is not mean or sum or none",                  \
      !alloy_smooth_l1_loss(f->g, f->x, f->x, 1, (alloy_reduction)9))                                                    \
    X(reshape_with_null_dims, "reshape: rank 2 is not in [0, 8] or dims is NULL", !alloy_reshape(f->g, f->x, 2, NULL))  \
    X(reshape_of_rank_9, "reshape: rank 9", !alloy_reshape(f->g, f->x, 9, DIMS(1, 1, 1, 1, 1, 1, 1, 1, 6)))              \
    X(transpose_with_null_perm, "transpose: perm is NULL", !alloy_transpose(f->g, f->x, NULL))                          \
    X(broadcast_to_of_rank_minus_1, "broadcast_to: rank -1", !alloy_broadcast_to(f->g, f->x, -1, NULL))                 \
    X(slice_of_an_axis_out_of_range, "slice: axis 7 out of range for rank 2", !alloy_slice(f->g, f->x, 7, 0, 1))         \
    X(concat_of_nothing, "concat: needs at least one operand", !alloy_concat(f->g, 0, NULL, 0))                         \
    X(concat_of_null, "concat: operand 1 is NULL", !alloy_concat(f->g, 2, (alloy_tensor *[]){f->x, NULL}, 0))           \
    X(cast_to_unknown_dtype, "cast: unknown dtype 99", !alloy_cast(f->g, f->x, (alloy_dtype)99))                        \
    X(clamp_of_null, "clamp: operand 0 is NULL", !alloy_clamp(f->g, NULL, 0, 1))                                        \
    X(argmax_of_an_axis_out_of_range, "argmax", !alloy_argmax(f->g, f->x, 2, false))                                    \
    X(one_hot_of_null, "one_hot: operand 0 is NULL", !alloy_one_hot(f->g, NULL, 3, F32))                                \
    X(one_hot_to_unknown_dtype, "one_hot: unknown dtype 99", !alloy_one_hot(f->g, f->x, 3, (alloy_dtype)99))            \
    X(one_hot_of_depth_0, "depth must be >= 1, not 0", !alloy_one_hot(f->g, f->x, 0, F32))                              \
    X(causal_mask_of_null, "causal_mask: operand 0 is NULL", !alloy_causal_mask(f->g, NULL))                            \
    X(conv2d_of_a_null_weight, "conv2d: operand 1 is NULL", !alloy_conv2d(f->g, f->x, NULL, NULL, NULL, NULL, NULL, 1)) \
    X(conv1d_of_null, "conv1d: operand 0 is NULL", !alloy_conv1d(f->g, NULL, f->x, NULL, 1, 0, 1, 1))                   \
    X(max_pool2d_without_a_kernel, "max_pool2d: kernel is NULL", !alloy_max_pool2d(f->g, f->x, NULL, NULL, NULL))       \
    X(avg_pool2d_of_null, "avg_pool2d: operand 0 is NULL", !alloy_avg_pool2d(f->g, NULL, DIMS(2, 2), NULL, NULL, true)) \
    X(adaptive_avg_pool2d_without_a_size, "adaptive_avg_pool2d: output_size is NULL",                                   \
      !alloy_adaptive_avg_pool2d(f->g, f->x, NULL))                                                                    \
    X(amp_allow_of_null, "amp_allow: operand is NULL or from another graph", !alloy_amp_allow(f->g, NULL))              \
    X(amp_deny_of_null, "amp_deny: operand is NULL or from another graph", !alloy_amp_deny(f->g, NULL))                 \
    X(set_name_to_null, "empty node name", !alloy_set_name(f->g, f->y, NULL))                                           \
    X(set_name_of_null, "set_name: operand 0 is NULL", !alloy_set_name(f->g, NULL, "n"))                                \
    X(output_without_name, "output needs a name", alloy_output(f->g, NULL, f->y) == ALLOY_ERR_INVALID)                  \
    X(output_of_null, "output: operand 0 is NULL", alloy_output(f->g, "z", NULL) == ALLOY_ERR_INVALID)                  \
    X(graph_find_of_null, "graph_find: name is NULL", !alloy_graph_find(f->g, NULL))                                    \
    X(output_name_past_the_end, "output_name: index 1 out of range [0, 1)", !alloy_graph_output_name(f->g, 1))          \
    X(output_name_of_minus_1, "output_name: index -1 out of range [0, 1)", !alloy_graph_output_name(f->g, -1))          \
    X(input_at_past_the_end, "input_at: index 1 out of range [0, 1)",                                                   \
      alloy_graph_input_at(f->g, 1, &(alloy_host_tensor){0}) == ALLOY_ERR_NOT_FOUND)                                    \
    X(input_at_into_null, "input_at: out is NULL", alloy_graph_input_at(f->g, 0, NULL) == ALLOY_ERR_INVALID)            \
    X(run_with_null_feeds, "run: feeds/fetches NULL with a non-zero count",                                             \
      alloy_graph_run(f->g, NULL, 1, NULL, 0) == ALLOY_ERR_INVALID)                                                     \
    X(run_with_negative_count, "run: feeds/fetches NULL with a non-zero count",                                         \
      alloy_graph_run(f->g, &(alloy_host_tensor){0}, -1, NULL, 0) == ALLOY_ERR_INVALID)                                 \
    X(run_with_a_nameless_feed, "feed 0 has no name",                                                                   \
      alloy_graph_run(f->g, &(alloy_host_tensor){NULL, F32, 2, {2, 3}, NULL}, 1, NULL, 0) == ALLOY_ERR_INVALID)         \
    X(run_with_a_feed_of_rank_9, "feed 'x': rank 9 out of range",                                                       \
      alloy_graph_run(f->g, &(alloy_host_tensor){"x", F32, 9, {2, 3}, NULL}, 1, NULL, 0) == ALLOY_ERR_SHAPE)            \
    X(run_with_null_feed_data, "feed 'x': data is NULL",                                                                \
      alloy_graph_run(f->g, &(alloy_host_tensor){"x", F32, 2, {2, 3}, NULL}, 1, NULL, 0) == ALLOY_ERR_INVALID)          \
    X(run_with_a_nameless_fetch, "fetch '(NULL)': no output or named node of that name",                                \
      alloy_graph_run(f->g, NULL, 0, &(alloy_host_tensor){0}, 1) == ALLOY_ERR_NOT_FOUND)                                \
    X(state_at_into_null, "state_at: out is NULL", alloy_graph_state_at(f->g, 0, NULL) == ALLOY_ERR_INVALID)            \
    X(state_at_past_the_end, "state index 2 out of range [0, 2)",                                                       \
      alloy_graph_state_at(f->g, 2, &(alloy_host_tensor){0}) == ALLOY_ERR_NOT_FOUND)                                    \
    X(get_state_of_null, "get_state: name is NULL",                                                                     \
      alloy_graph_get_state(f->g, NULL, &(alloy_host_tensor){0}) == ALLOY_ERR_INVALID)                                  \
    X(get_state_into_null, "get_state: out is NULL", alloy_graph_get_state(f->g, "w", NULL) == ALLOY_ERR_INVALID)       \
    X(set_state_of_null, "set_state: src is NULL", alloy_graph_set_state(f->g, NULL) == ALLOY_ERR_INVALID)              \
    X(set_state_without_name, "set_state: src->name is NULL",                                                           \
      alloy_graph_set_state(f->g, &(alloy_host_tensor){NULL, F32, 1, {4}, NULL}) == ALLOY_ERR_INVALID)                  \
    X(set_state_with_null_data, "set_state 'v': data is NULL",                                                          \
      alloy_graph_set_state(f->g, &(alloy_host_tensor){"v", F32, 1, {4}, NULL}) == ALLOY_ERR_INVALID)                   \
    X(set_state_of_rank_9, "'v': rank 9 out of range",                                                                  \
      alloy_graph_set_state(f->g, &(alloy_host_tensor){"v", F32, 9, {4}, NULL}) == ALLOY_ERR_SHAPE)                     \
    X(set_state_of_rank_minus_1, "'v': rank -1 out of range",                                                           \
      alloy_graph_set_state(f->g, &(alloy_host_tensor){"v", F32, -1, {4}, NULL}) == ALLOY_ERR_SHAPE)                    \
    X(save_state_to_null, "save_state: path is NULL", alloy_graph_save_state(f->g, NULL) == ALLOY_ERR_INVALID)          \
    X(load_state_from_null, "load_state: path is NULL", alloy_graph_load_state(f->g, NULL) == ALLOY_ERR_INVALID)        \
    X(save_params_to_null, "save_params: path is NULL", alloy_graph_save_params(f->g, NULL) == ALLOY_ERR_INVALID)       \
    X(load_params_from_null, "load_params: path is NULL",                                                               \
      alloy_graph_load_params(f->g, NULL, NULL, NULL) == ALLOY_ERR_INVALID)                                             \
    X(share_state_with_null, "share_state: owner is NULL",                                                              \
      alloy_graph_share_state(f->g, NULL, NULL, NULL) == ALLOY_ERR_INVALID)                                             \
    X(share_state_with_itself, "share_state: graph 'fixture' cannot share state with itself",                          \
      alloy_graph_share_state(f->g, f->g, NULL, NULL) == ALLOY_ERR_INVALID)                                             \
    X(linear_of_0_inputs, "linear: in and out must be at least 1", !alloy_linear(f->g, f->x, "fc", 0, 2, true))         \
    X(save_checkpoint_to_null, "save_state: path is NULL", alloy_graph_save_checkpoint(f->g, NULL) == ALLOY_ERR_INVALID) \
    X(load_checkpoint_from_null, "load_state: path is NULL",                                                            \
      alloy_graph_load_checkpoint(f->g, NULL) == ALLOY_ERR_INVALID)                                                     \
    X(print_after_of_an_unknown_pass, "unknown pass 'fsue'",                                                            \
      alloy_graph_print_after(f->g, "fsue", NULL) == ALLOY_ERR_INVALID)                                                 \
    X(memory_info_into_null, "memory_info: out is NULL", alloy_graph_memory_info(f->g, NULL) == ALLOY_ERR_INVALID)      \
    X(set_option_of_null, "set_option: option name or value is NULL",                                                   \
      alloy_graph_set_option(f->g, NULL, "1") == ALLOY_ERR_INVALID)                                                     \
    X(dump_to_null, "dump: out is NULL", alloy_graph_dump(f->g, NULL, ALLOY_DUMP_SOURCE) == ALLOY_ERR_INVALID)          \
    X(dump_of_an_unknown_kind, "dump: unknown kind 7 (ALLOY_DUMP_SOURCE, _IR, _DOT or _MEMORY_SVG)",                           \
      alloy_graph_dump(f->g, stderr, (alloy_dump_kind)7) == ALLOY_ERR_INVALID)                                          \
    X(enable_amp_of_i32, "enable_amp: dtype must be f16, bf16 or f32 (off), not i32",                                   \
      alloy_graph_enable_amp(f->g, I32) == ALLOY_ERR_INVALID)                                                           \
    X(amp_lists_add_to_an_unknown_list, "amp lists: unknown list 99",                                                   \
      alloy_amp_lists_add(f->g, (alloy_amp_list)99, "matmul") == ALLOY_ERR_INVALID)                                     \
    X(amp_lists_add_of_null, "amp lists: unknown op '(NULL)'",                                                          \
      alloy_amp_lists_add(f->g, ALLOY_AMP_ALLOWLIST, NULL) == ALLOY_ERR_NOT_FOUND)                                      \
    X(amp_lists_remove_of_an_unknown_op, "amp lists: unknown op 'matmull'",                                             \
      alloy_amp_lists_remove(f->g, ALLOY_AMP_DENYLIST, "matmull") == ALLOY_ERR_NOT_FOUND)                               \
    X(amp_set_unlisted_to_list_0, "amp: unknown list 0", alloy_amp_set_unlisted(f->g, (alloy_amp_list)0) == ALLOY_ERR_INVALID) \
    X(amp_report_into_null, "amp_report: out is NULL", alloy_graph_amp_report(f->g, NULL) == ALLOY_ERR_INVALID)         \
    X(amp_stats_into_null, "amp_stats: out is NULL", alloy_graph_amp_stats(f->g, NULL) == ALLOY_ERR_INVALID)          \
    X(amp_stats_at_past_the_count, "amp_stats_at: index 0 is not below the count 0",                                   \
      alloy_graph_amp_stats_at(f->g, 0, &(alloy_amp_stat){0}) == ALLOY_ERR_INVALID)                                    \
    X(save_amp_stats_to_no_path, "save_amp_stats: path is NULL or empty",                                               \
      alloy_graph_save_amp_stats(f->g, NULL) == ALLOY_ERR_INVALID)                                                      \
    X(amp_scope_pop_without_a_push, "amp_scope_pop: no scope was pushed", alloy_amp_scope_pop(f->g) == ALLOY_ERR_INVALID) \
    X(amp_scope_push_of_i32, "amp_scope_push: dtype must be f32, f16 or bf16, not i32",                                 \
      alloy_amp_scope_push(f->g, I32) == ALLOY_ERR_INVALID)                                                             \
    X(export_cuda_without_archs, "export_cuda: no architecture given",                                                  \
      alloy_graph_export_cuda(f->g, NULL, "/nonexistent/d") == ALLOY_ERR_INVALID)                                       \
    X(export_cuda_without_dir, "export_cuda: no output directory given",                                                \
      alloy_graph_export_cuda(f->g, "sm_80", NULL) == ALLOY_ERR_INVALID)                                                \
    X(set_loss_of_null, "set_loss: tensor is NULL or from another graph",                                              \
      alloy_graph_set_loss(f->g, NULL) == ALLOY_ERR_INVALID)                                                            \
    X(set_loss_of_a_matrix, "set_loss: the loss must be a floating-point scalar",                                       \
      alloy_graph_set_loss(f->g, f->y) == ALLOY_ERR_SHAPE)                                                              \
    X(set_training_without_loss, "set_training: graph 'fixture' has no loss",                                          \
      alloy_graph_set_training(f->g, true) == ALLOY_ERR_INVALID)                                                        \
    X(request_grad_of_null, "request_grad: tensor is NULL or from another graph",                                      \
      alloy_graph_request_grad(f->g, NULL) == ALLOY_ERR_INVALID)                                                        \
    X(request_grad_of_a_param, "request_grad: 'w' is not a floating-point input",                                       \
      alloy_graph_request_grad(f->g, f->w) == ALLOY_ERR_INVALID)                                                        \
    X(param_freeze_of_null, "param_freeze: tensor is NULL or from another graph",                                      \
      alloy_param_freeze(f->g, NULL) == ALLOY_ERR_INVALID)                                                              \
    X(param_freeze_of_an_input, "param_freeze: 'x' is not a param", alloy_param_freeze(f->g, f->x) == ALLOY_ERR_INVALID) \
    X(set_grad_scaler_of_kind_9, "set_grad_scaler: unknown kind 9",                                                     \
      alloy_graph_set_grad_scaler(f->g, (alloy_grad_scaler){.kind = (alloy_scaler_kind)9}) == ALLOY_ERR_INVALID)        \
    X(add_optimizer_of_kind_0, "add_optimizer: unknown kind 0",                                                         \
      alloy_graph_add_optimizer(f->g, (alloy_optimizer){.kind = (alloy_optimizer_kind)0}) == ALLOY_ERR_INVALID)         \
    X(set_lr_to_nan, "set_lr: lr is nan; it must be finite and >= 0", alloy_graph_set_lr(f->g, NAN) == ALLOY_ERR_INVALID) \
    X(set_lr_without_an_optimizer, "set_lr: graph 'fixture' has no optimizer",                                         \
      alloy_graph_set_lr(f->g, 0.1) == ALLOY_ERR_INVALID)                                                               \
    X(set_param_group_of_null, "set_param_group: patterns is NULL",                                                     \
      alloy_graph_set_param_group(f->g, NULL, 1, false) == ALLOY_ERR_INVALID)                                           \
    X(set_param_group_matching_nothing, "set_param_group: pattern 'ww' matches no param of graph 'fixture'",            \
      alloy_graph_set_param_group(f->g, "ww", 1, false) == ALLOY_ERR_NOT_FOUND)                                         \
    X(step_info_into_null, "step_info: out is NULL", alloy_graph_step_info(f->g, NULL) == ALLOY_ERR_INVALID)          \
    X(set_data_parallel_without_comm, DP_NULL_COMM,                                                                     \
      alloy_graph_set_data_parallel(f->g, NULL, NULL) == (ALLOY_HAVE_MPI ? ALLOY_ERR_INVALID : ALLOY_ERR_UNSUPPORTED))

BAD_CALLS(BAD)

static const bad_call bad_calls[] = {BAD_CALLS(ROW)};

static void every_bad_argument_fails_with_its_own_message_not_the_last_one(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bad_calls / sizeof *bad_calls; i++) {
        const bad_call *c = &bad_calls[i];
        fixture f = make_fixture();
        /* an earlier failure leaves its message: the call must replace it */
        assert_int_equal(alloy_graph_set_option(f.g, "stale_marker", "1"), ALLOY_ERR_INVALID);
        assert_non_null(strstr(alloy_last_error(f.g), "stale_marker"));
        bool failed = c->body(&f);
        const char *msg = alloy_last_error(f.g);
        if (!failed) test_case_failed("%s: did not fail as documented (message '%s')", c->call, msg);
        else if (strstr(msg, "stale_marker") || !strstr(msg, c->message))
            test_case_failed("%s: message '%s', want '%s'", c->call, msg, c->message);
        alloy_graph_free(f.g);
    }
    test_end_cases();
}

static void a_graph_that_rejected_bad_arguments_still_runs(void **state)
{
    (void)state;
    fixture f = make_fixture();
    assert_int_equal(alloy_graph_get_state(f.g, NULL, &(alloy_host_tensor){0}), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_dump(f.g, NULL, ALLOY_DUMP_IR), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_set_state(f.g, &(alloy_host_tensor){"w", F32, 9, {3, 4}, NULL}), ALLOY_ERR_SHAPE);
    float xs[6] = {1, 2, 3, 4, 5, 6};
    alloy_host_tensor feed = {"x", F32, 2, {2, 3}, xs}, fetch = {.name = "y"};
    expect_ok(f.g, alloy_graph_run(f.g, &feed, 1, &fetch, 1), "run");
    const float *y = fetch.data; /* w is all ones: each y is its row's sum */
    for (int j = 0; j < 4; j++) {
        assert_float_equal(y[j], 6.0f, 0);
        assert_float_equal(y[4 + j], 15.0f, 0);
    }
    /* the record is the last failure's until another call fails (like errno) */
    assert_string_equal(alloy_last_error(f.g), "'w': rank 9 out of range");
    alloy_graph_free(f.g);
}

static void a_failing_call_after_a_builder_error_reports_its_own_message(void **state)
{
    (void)state;
    fixture f = make_fixture();
    assert_null(alloy_add(f.g, f.x, NULL)); /* the builder error: it poisons the graph */
    assert_string_equal(alloy_last_error(f.g), "add: operand 1 is NULL");
    /* a setter that fails for its own reason says so (it showed the add error) */
    assert_int_equal(alloy_graph_set_lr(f.g, NAN), ALLOY_ERR_INVALID);
    assert_string_equal(alloy_last_error(f.g), "set_lr: lr is nan; it must be finite and >= 0");
    assert_int_equal(alloy_graph_status(f.g), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_set_option(f.g, "no_such_option", "1"), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(f.g), "set_option: unknown option 'no_such_option'"));
    /* a later builder call passes the poison on quietly: no new message */
    assert_null(alloy_relu(f.g, NULL));
    assert_non_null(strstr(alloy_last_error(f.g), "no_such_option"));
    /* a call that needs the built graph fails with the first builder error */
    float xs[6] = {0};
    alloy_host_tensor feed = {"x", F32, 2, {2, 3}, xs}, fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(f.g, &feed, 1, &fetch, 1), ALLOY_ERR_INVALID);
    assert_string_equal(alloy_last_error(f.g), "add: operand 1 is NULL");
    assert_int_equal(alloy_graph_set_lr(f.g, -1), ALLOY_ERR_INVALID);
    assert_string_equal(alloy_last_error(f.g), "set_lr: lr is -1; it must be finite and >= 0");
    alloy_memory_info mi;
    assert_int_equal(alloy_graph_memory_info(f.g, &mi), ALLOY_ERR_INVALID);
    assert_string_equal(alloy_last_error(f.g), "add: operand 1 is NULL");
    /* the handle a failed builder call gave is no f32 scalar */
    alloy_host_tensor none = alloy_tensor_info(NULL);
    assert_int_equal(none.rank, -1);
    assert_int_equal(none.dtype, ALLOY_DTYPE_COUNT);
    assert_int_equal(alloy_host_tensor_numel(&none), -1);
    /* a call that succeeds leaves the record as it was (like errno) */
    assert_int_equal(alloy_amp_scope_push(f.g, ALLOY_F32), ALLOY_OK);
    assert_string_equal(alloy_last_error(f.g), "add: operand 1 is NULL");
    alloy_graph_free(f.g);
}

/* Leaves that IR text left without a name (%2 = param, %0 = input): the
 * param fails verification, the input fails the run with its own message
 * (both once reached a NULL name: al_strdup, strcmp). */
static void unnamed_leaves_fail_with_a_message_not_a_crash(void **state)
{
    (void)state;
    char err[256];
    static const char param_text[] = "graph p {\n  %x = input : f32[3]\n  %2 = param {init=\"zeros\"} : f32[3]\n"
                                     "  %y = add(%x, %2) : f32[3]\n  output \"y\" = %y\n}\n";
    assert_null(alloy_graph_parse(param_text, sizeof param_text - 1, "p.ir", err, sizeof err));
    assert_non_null(strstr(err, "(param): has no name: a param or state is saved, restored and looked up by its name"));
    static const char input_text[] = "graph i {\n  %0 = input : f32[3]\n  %y = relu(%0) : f32[3]\n"
                                     "  output \"y\" = %y\n}\n";
    alloy_graph *g = alloy_graph_parse(input_text, sizeof input_text - 1, "i.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    float x[3] = {1, -2, 3};
    alloy_host_tensor feed = {"x", ALLOY_F32, 1, {3}, x}, fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_ERR_NOT_FOUND);
    assert_non_null(strstr(alloy_last_error(g), "feed 'x': graph 'i' has no input of that name"));
    assert_int_equal(alloy_graph_run(g, NULL, 0, &fetch, 1), ALLOY_ERR_INVALID);
    assert_string_equal(alloy_last_error(g),
                        "input %0 of graph 'i' has no name, so it cannot be fed (write it as %name = input ...)");
    alloy_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_call_on_a_null_graph_fails_without_crashing),
        cmocka_unit_test(calls_without_a_graph_reject_null_and_out_of_range_arguments),
        cmocka_unit_test(every_bad_argument_fails_with_its_own_message_not_the_last_one),
        cmocka_unit_test(a_graph_that_rejected_bad_arguments_still_runs),
        cmocka_unit_test(a_failing_call_after_a_builder_error_reports_its_own_message),
        cmocka_unit_test(unnamed_leaves_fail_with_a_message_not_a_crash),
    };
    return cmocka_run_group_tests_name("api_null", tests, test_checked_alloc, test_plain_alloc);
}
