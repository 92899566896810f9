/* test_norms.c - batch_norm and group_norm through the builder: PyTorch's outputs, gradients and running statistics after two SGD steps (tests/data/norms.safetensors), eval mode on the running statistics, running statistics untouched by a skipped step, f32 statistics under AMP; and the indexing ops' and arange's builder and out-of-range errors. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/graph/graph_impl.h"
#include "support.h"

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
enum { MAXV = 512 };

static const alloy_host_tensor *tensor(const alloy_safetensors *st, const char *name)
{
    const alloy_host_tensor *t = alloy_safetensors_find(st, name);
    if (!t) fail_msg("norms.safetensors has no '%s'", name);
    return t;
}

static int64_t numel(const alloy_host_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= t->dims[d];
    return n;
}

/* Reference tensor `prefix.name` as doubles into v; its element count. */
static int64_t ref_values(const alloy_safetensors *st, const char *prefix, const char *name, double *v)
{
    char full[96];
    snprintf(full, sizeof full, "%s.%s", prefix, name);
    const alloy_host_tensor *t = tensor(st, full);
    int64_t n = numel(t);
    assert_true(n <= MAXV);
    for (int64_t i = 0; i < n; i++) v[i] = test_decode(t->dtype, t->data, i);
    return n;
}

/* The f32 reference tensor `prefix.name` as a feed or state called as. */
static alloy_host_tensor as_f32(const alloy_safetensors *st, const char *prefix, const char *name, const char *as)
{
    char full[96];
    snprintf(full, sizeof full, "%s.%s", prefix, name);
    alloy_host_tensor t = *tensor(st, full);
    assert_int_equal(t.dtype, ALLOY_F32);
    t.name = as;
    return t;
}

/* got (f32, n values) against ref within tol of the normalized error. */
static void expect_close_f32(const char *what, const alloy_host_tensor *got, const double *ref, int64_t n, double tol)
{
    assert_int_equal(got->dtype, ALLOY_F32);
    assert_int_equal(numel(got), n);
    double v[MAXV];
    for (int64_t i = 0; i < n; i++) v[i] = ((const float *)got->data)[i];
    char why[256];
    if (!test_close(v, ref, n, tol, why, sizeof why)) fail_msg("%s: %s", what, why);
    print_message("%s: normalized error %.2e\n", what, test_normalized_error(v, ref, n));
}

/* x [shape] -> alloy_batch_norm "bn" (affine) -> y; loss sum(y * r); SGD(0.1). */
static alloy_graph *batch_norm_graph(int rank, const int64_t *dims, bool scaler)
{
    alloy_graph *g = alloy_graph_new("bn");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, rank, dims), *r = alloy_input(g, "r", ALLOY_F32, rank, dims);
    alloy_tensor *y = alloy_batch_norm(g, x, "bn", 0.1, 1e-5, true);
    expect_ok(g, alloy_output(g, "y", y), "output");
    expect_ok(g, alloy_graph_set_loss(g, alloy_reduce_sum(g, alloy_mul(g, y, r), 0, NULL, false)), "loss");
    expect_ok(g, alloy_graph_request_grad(g, x), "request_grad");
    if (scaler) expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), "scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0, 0, false)), "optimizer");
    return g;
}

/* BatchNorm2d on [4, 3, 5, 5] and BatchNorm1d on [8, 3]: two training steps
 * (outputs and the gradients of x, weight and bias), the running statistics
 * and params after them, then eval mode, all against PyTorch in f64. */
static void test_batch_norm_matches_pytorch_over_two_steps_and_in_eval_mode(void **state)
{
    (void)state;
    alloy_safetensors *st;
    char err[256];
    assert_int_equal(alloy_safetensors_load(ALLOY_TEST_DATA "/norms.safetensors", &st, err, sizeof err), ALLOY_OK);
    static const char *const prefixes[] = {"bn", "bn1d"};
    for (int p = 0; p < 2; p++) {
        const char *pre = prefixes[p];
        const alloy_host_tensor *x1 = tensor(st, p ? "bn1d.x1" : "bn.x1");
        alloy_graph *g = batch_norm_graph(x1->rank, x1->dims, false);
        alloy_host_tensor w0 = as_f32(st, pre, "w0", "bn.weight"), b0 = as_f32(st, pre, "b0", "bn.bias");
        expect_ok(g, alloy_graph_set_state(g, &w0), "set weight");
        expect_ok(g, alloy_graph_set_state(g, &b0), "set bias");
        double ref[MAXV];
        char name[64], what[96];
        for (int k = 1; k <= 2; k++) {
            snprintf(name, sizeof name, "x%d", k);
            alloy_host_tensor feeds[2] = {as_f32(st, pre, name, "x"), as_f32(st, pre, "r", "r")};
            alloy_host_tensor fetch[4] = {{.name = "y"}, {.name = "grad:x"}, {.name = "grad:bn.weight"}, {.name = "grad:bn.bias"}};
            expect_ok(g, alloy_graph_run(g, feeds, 2, fetch, 4), "run");
            static const char *const refs[] = {"y%d", "grad_x%d", "grad_w%d", "grad_b%d"};
            for (int j = 0; j < 4; j++) {
                snprintf(name, sizeof name, refs[j], k);
                int64_t n = ref_values(st, pre, name, ref);
                snprintf(what, sizeof what, "%s step %d %s", pre, k, fetch[j].name);
                expect_close_f32(what, &fetch[j], ref, n, j == 1 ? 1e-4 : 1e-5);
            }
        }
        static const char *const states[] = {"running_mean", "running_var", "weight", "bias"};
        for (int j = 0; j < 4; j++) {
            alloy_host_tensor t;
            snprintf(name, sizeof name, "bn.%s", states[j]);
            expect_ok(g, alloy_graph_get_state(g, name, &t), "get_state");
            int64_t n = ref_values(st, pre, states[j], ref);
            snprintf(what, sizeof what, "%s %s after two steps", pre, states[j]);
            expect_close_f32(what, &t, ref, n, 1e-5);
        }
        /* eval mode: the running statistics normalize */
        expect_ok(g, alloy_graph_set_training(g, false), "set_training");
        alloy_host_tensor feeds[2] = {as_f32(st, pre, "x_eval", "x"), as_f32(st, pre, "r", "r")};
        alloy_host_tensor y = {.name = "y"};
        expect_ok(g, alloy_graph_run(g, feeds, 2, &y, 1), "run eval");
        int64_t n = ref_values(st, pre, "y_eval", ref);
        snprintf(what, sizeof what, "%s eval", pre);
        expect_close_f32(what, &y, ref, n, 1e-5);
        alloy_graph_free(g);
    }
    alloy_safetensors_free(st);
}

/* A graph that never trains normalizes with the running statistics as
 * made: mean 0, var 1, so y = x / sqrt(1 + eps) * 1 + 0, by hand. */
static void test_batch_norm_outside_training_uses_the_initial_running_statistics(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("bn_eval");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(2, 3));
    expect_ok(g, alloy_output(g, "y", alloy_batch_norm(g, x, "bn", 0.1, 0.25, true)), "output");
    float xv[6] = {1, -2, 3, 0.5f, 8, -4};
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {2, 3}, xv}, y = {.name = "y"};
    expect_ok(g, alloy_graph_run(g, &feed, 1, &y, 1), "run");
    for (int i = 0; i < 6; i++) assert_float_equal(((float *)y.data)[i], xv[i] / sqrt(1.25), 1e-6);
    alloy_host_tensor rm;
    expect_ok(g, alloy_graph_get_state(g, "bn.running_mean", &rm), "get_state");
    for (int i = 0; i < 3; i++) assert_true(((float *)rm.data)[i] == 0);
    alloy_graph_free(g);
}

/* The state tensor name's bytes (n f32) copied into out. */
static void copy_state(alloy_graph *g, const char *name, float *out, int64_t n)
{
    alloy_host_tensor t;
    expect_ok(g, alloy_graph_get_state(g, name, &t), "get_state");
    assert_int_equal(numel(&t), n);
    memcpy(out, t.data, sizeof(float) * (size_t)n);
}

/* Under a dynamic scaler a step whose gradients are inf is skipped: the
 * running statistics (like the weights) keep their bits; the applied steps
 * around it move them. */
static void test_a_skipped_step_leaves_the_running_statistics_bit_for_bit(void **state)
{
    (void)state;
    alloy_graph *g = batch_norm_graph(4, DIMS(2, 3, 2, 2), true);
    float x[24], r[24], bad[24];
    test_rng = 16;
    for (int i = 0; i < 24; i++) x[i] = (float)test_uniform(-2, 3), r[i] = bad[i] = (float)test_uniform(-1, 1);
    bad[7] = INFINITY; /* the loss and every gradient: inf or NaN */
    static const char *const names[] = {"bn.running_mean", "bn.running_var", "bn.weight"};
    float before[3][3], after[3][3];
    for (int k = 0; k < 3; k++) {
        alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 4, {2, 3, 2, 2}, x}, {"r", ALLOY_F32, 4, {2, 3, 2, 2}, k == 1 ? bad : r}};
        for (int j = 0; j < 3; j++) copy_state(g, names[j], before[j], 3);
        expect_ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), "run");
        for (int j = 0; j < 3; j++) copy_state(g, names[j], after[j], 3);
        alloy_step_info s;
        expect_ok(g, alloy_graph_step_info(g, &s), "step_info");
        assert_int_equal(s.skipped, k == 1);
        for (int j = 0; j < 3; j++) {
            bool same = memcmp(before[j], after[j], sizeof before[j]) == 0;
            if (k == 1 && !same) fail_msg("the skipped step changed %s", names[j]);
            if (k != 1 && same) fail_msg("applied step %d left %s as it was", k, names[j]);
        }
    }
    alloy_graph_free(g);
}

/* Accumulating two micro-batches per update, the running statistics move
 * once per applied step, from its last micro-batch (docs/training.md):
 * untouched after the first run, (1 - m) * 0 + m * mean(x_b) after the
 * second. */
static void test_with_accumulation_the_running_statistics_move_on_the_last_micro_batch(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("bn_acc");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(2, 1));
    alloy_tensor *y = alloy_batch_norm(g, x, "bn", 0.25, 1e-5, true);
    expect_ok(g, alloy_graph_set_loss(g, alloy_reduce_sum(g, alloy_mul(g, y, y), 0, NULL, false)), "loss");
    alloy_optimizer o = alloy_sgd(0.1, 0, 0, false);
    o.accumulation_steps = 2;
    expect_ok(g, alloy_graph_add_optimizer(g, o), "optimizer");
    float xa[2] = {1, 3}, xb[2] = {10, 30}, rm;
    for (int k = 0; k < 2; k++) {
        alloy_host_tensor feed = {"x", ALLOY_F32, 2, {2, 1}, k ? xb : xa};
        expect_ok(g, alloy_graph_run(g, &feed, 1, NULL, 0), "run");
        copy_state(g, "bn.running_mean", &rm, 1);
        assert_true(rm == (k ? 0.25f * 20 : 0.0f));
    }
    alloy_graph_free(g);
}

/* Under f16 and bf16 AMP the normalization runs in f32: the lowered
 * layer_norm and the running statistics' updates are f32, and the output
 * is the f32 graph's within f16 rounding of its input. */
static void test_batch_norm_statistics_stay_f32_under_amp(void **state)
{
    (void)state;
    static const alloy_dtype low[] = {ALLOY_F16, ALLOY_BF16};
    for (int l = 0; l < 2; l++) {
        alloy_graph *g = batch_norm_graph(4, DIMS(2, 3, 2, 2), false);
        expect_ok(g, alloy_graph_enable_amp(g, low[l]), "amp");
        float x[24], r[24];
        test_rng = 5;
        for (int i = 0; i < 24; i++) x[i] = (float)test_uniform(-2, 3), r[i] = (float)test_uniform(-1, 1);
        alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 4, {2, 3, 2, 2}, x}, {"r", ALLOY_F32, 4, {2, 3, 2, 2}, r}};
        alloy_host_tensor y = {.name = "y"};
        expect_ok(g, alloy_graph_run(g, feeds, 2, &y, 1), "run");
        assert_int_equal(y.dtype, ALLOY_F32);
        int norms = 0;
        for (int i = 0; i < g->compiled->nnodes; i++) {
            const ir_node *n = g->compiled->nodes[i];
            if (n->op == IR_OP_layer_norm) norms++, assert_int_equal(n->type.dtype, ALLOY_F32);
            assert_true(n->op != IR_OP_batch_norm);
        }
        assert_int_equal(norms, 1);
        alloy_host_tensor rv;
        expect_ok(g, alloy_graph_get_state(g, "bn.running_var", &rv), "get_state");
        assert_int_equal(rv.dtype, ALLOY_F32);
        alloy_graph_free(g);
    }
}

/* GroupNorm(2 groups, 6 channels) on [2, 6, 3, 3]: output and gradients against PyTorch. */
static void test_group_norm_matches_pytorch(void **state)
{
    (void)state;
    alloy_safetensors *st;
    char err[256];
    assert_int_equal(alloy_safetensors_load(ALLOY_TEST_DATA "/norms.safetensors", &st, err, sizeof err), ALLOY_OK);
    alloy_graph *g = alloy_graph_new("gn");
    const int64_t *dims = tensor(st, "gn.x")->dims;
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 4, dims), *r = alloy_input(g, "r", ALLOY_F32, 4, dims);
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 1, DIMS(6), alloy_init_ones());
    alloy_tensor *b = alloy_param(g, "b", ALLOY_F32, 1, DIMS(6), alloy_init_zeros());
    alloy_tensor *y = alloy_group_norm(g, x, 2, w, b, 1e-5);
    expect_ok(g, alloy_output(g, "y", y), "output");
    expect_ok(g, alloy_graph_set_loss(g, alloy_reduce_sum(g, alloy_mul(g, y, r), 0, NULL, false)), "loss");
    expect_ok(g, alloy_graph_request_grad(g, x), "request_grad");
    alloy_host_tensor w0 = as_f32(st, "gn", "w", "w"), b0 = as_f32(st, "gn", "b", "b");
    expect_ok(g, alloy_graph_set_state(g, &w0), "set w");
    expect_ok(g, alloy_graph_set_state(g, &b0), "set b");
    alloy_host_tensor feeds[2] = {as_f32(st, "gn", "x", "x"), as_f32(st, "gn", "r", "r")};
    alloy_host_tensor fetch[4] = {{.name = "y"}, {.name = "grad:x"}, {.name = "grad:w"}, {.name = "grad:b"}};
    expect_ok(g, alloy_graph_run(g, feeds, 2, fetch, 4), "run");
    static const char *const refs[] = {"y", "grad_x", "grad_w", "grad_b"};
    for (int j = 0; j < 4; j++) {
        double ref[MAXV];
        int64_t n = ref_values(st, "gn", refs[j], ref);
        expect_close_f32(refs[j], &fetch[j], ref, n, j == 1 ? 1e-4 : 1e-5);
    }
    alloy_graph_free(g);
    alloy_safetensors_free(st);
}

/* Builder errors name the op and what is wrong. */
static void test_bad_norm_arguments_are_errors_that_name_them(void **state)
{
    (void)state;
    struct {
        int which;
        const char *want;
    } cases[] = {
        {0, "num_groups 4 must be >= 1 and divide the 6 channels"},
        {1, "give both weight and bias, or neither"},
        {2, "momentum must be in [0, 1], not 1.5"},
        {3, "input must be [N, C, ...] (rank >= 2), not rank 1"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        alloy_graph *g = alloy_graph_new("bad");
        alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 3, DIMS(2, 6, 3)), *v = alloy_input(g, "v", ALLOY_F32, 1, DIMS(6));
        alloy_tensor *y = NULL;
        switch (cases[k].which) {
        case 0: y = alloy_group_norm(g, x, 4, NULL, NULL, 1e-5); break;
        case 1: y = alloy_group_norm(g, x, 2, v, NULL, 1e-5); break;
        case 2: y = alloy_batch_norm(g, x, "bn", 1.5, 1e-5, false); break;
        case 3: y = alloy_batch_norm(g, v, "bn", 0.1, 1e-5, false); break;
        }
        assert_null(y);
        if (!strstr(alloy_last_error(g), cases[k].want)) fail_msg("'%s' does not say '%s'", alloy_last_error(g), cases[k].want);
        alloy_graph_free(g);
    }
}

/* Training on one value per channel is PyTorch's error, at compile time. */
static void test_training_batch_norm_on_one_value_per_channel_is_an_error(void **state)
{
    (void)state;
    alloy_graph *g = batch_norm_graph(2, DIMS(1, 3), false);
    float x[3] = {1, 2, 3};
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {1, 3}, x}, {"r", ALLOY_F32, 2, {1, 3}, x}};
    assert_int_equal(alloy_graph_run(g, feeds, 2, NULL, 0), ALLOY_ERR_SHAPE);
    assert_non_null(strstr(alloy_last_error(g), "training needs more than one value per channel (input 1 x 3)"));
    alloy_graph_free(g);
}

/* batch_norm written in the IR: its running statistics are state leaves,
 * which a training run updates; with the lower_norm pass disabled the graph
 * refuses to compile (nothing would lower it), naming the pass. */
static void test_batch_norm_in_ir_text_trains_its_state_and_needs_the_lower_norm_pass(void **state)
{
    (void)state;
    static const char text[] = "graph bn {\n"
                               "  %x = input : f32[4,2]\n"
                               "  %rm = state {init=\"zeros\"} : f32[2]\n"
                               "  %rv = state {init=\"ones\"} : f32[2]\n"
                               "  %w = param {init=\"ones\"} : f32[2]\n"
                               "  %y = batch_norm(%x, %rm, %rv) {eps=1e-5, momentum=0.5} : f32[4,2]\n"
                               "  %p = mul(%y, %w) : f32[4,2]\n"
                               "  %l = reduce_sum(%p) {axes=[0, 1], keepdims=false} : f32[]\n"
                               "  loss %l\n"
                               "}\n";
    char err[512];
    alloy_graph *g = alloy_graph_parse(text, strlen(text), "bn.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    expect_ok(g, alloy_graph_set_training(g, true), "training");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0, 0, false)), "optimizer");
    float x[8] = {1, 10, 2, 20, 3, 30, 6, 60}; /* channel 0: mean 3, unbiased var 14/3; channel 1: 30, 1400/3 */
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {4, 2}, x}, rm, rv;
    expect_ok(g, alloy_graph_run(g, &feed, 1, NULL, 0), "run");
    float got[2][2];
    expect_ok(g, alloy_graph_get_state(g, "rm", &rm), "rm");
    memcpy(got[0], rm.data, sizeof got[0]);
    expect_ok(g, alloy_graph_get_state(g, "rv", &rv), "rv");
    memcpy(got[1], rv.data, sizeof got[1]);
    const double mean[2] = {1.5, 15}, var[2] = {0.5 + 0.5 * 14 / 3.0, 0.5 + 0.5 * 1400 / 3.0};
    for (int c = 0; c < 2; c++) {
        assert_float_equal(got[0][c], mean[c], 1e-6 * mean[c]);
        assert_float_equal(got[1][c], var[c], 1e-6 * var[c]);
    }
    expect_ok(g, alloy_graph_set_option(g, "disable_passes", "lower_norm"), "set_option");
    assert_int_not_equal(alloy_graph_run(g, &feed, 1, NULL, 0), ALLOY_OK);
    assert_non_null(strstr(alloy_last_error(g), "batch_norm / group_norm"));
    alloy_graph_free(g);
}

/* gather and index_select name the index out of range and its position;
 * their values and cumsum's and arange's, by hand. */
static void test_indexing_ops_by_hand_and_out_of_range_indices_name_the_position(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("index");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(2, 3));
    alloy_tensor *gi = alloy_input(g, "gi", ALLOY_I64, 2, DIMS(2, 2)), *si = alloy_input(g, "si", ALLOY_I32, 1, DIMS(3));
    expect_ok(g, alloy_output(g, "gather", alloy_gather(g, x, 1, gi)), "gather");
    expect_ok(g, alloy_output(g, "select", alloy_index_select(g, x, 0, si)), "index_select");
    expect_ok(g, alloy_output(g, "cumsum", alloy_cumsum(g, x, -1)), "cumsum");
    expect_ok(g, alloy_output(g, "arange", alloy_arange(g, 1, -1, -0.5, ALLOY_F32)), "arange");
    float xv[6] = {1, 2, 3, 4, 5, 6};
    int64_t gv[4] = {2, 0, 1, 1};
    int32_t sv[3] = {1, 1, 0};
    alloy_host_tensor feeds[3] = {{"x", ALLOY_F32, 2, {2, 3}, xv}, {"gi", ALLOY_I64, 2, {2, 2}, gv}, {"si", ALLOY_I32, 1, {3}, sv}};
    alloy_host_tensor out[4] = {{.name = "gather"}, {.name = "select"}, {.name = "cumsum"}, {.name = "arange"}};
    expect_ok(g, alloy_graph_run(g, feeds, 3, out, 4), "run");
    const float gather[4] = {3, 1, 5, 5}, select[9] = {4, 5, 6, 4, 5, 6, 1, 2, 3}, cumsum[6] = {1, 3, 6, 4, 9, 15}, arange[4] = {1, 0.5f, 0, -0.5f};
    assert_memory_equal(out[0].data, gather, sizeof gather);
    assert_memory_equal(out[1].data, select, sizeof select);
    assert_memory_equal(out[2].data, cumsum, sizeof cumsum);
    assert_int_equal(out[3].dims[0], 4);
    assert_memory_equal(out[3].data, arange, sizeof arange);
    gv[3] = 3;
    assert_int_equal(alloy_graph_run(g, feeds, 3, out, 4), ALLOY_ERR_INVALID);
    if (!strstr(alloy_last_error(g), "gather") || !strstr(alloy_last_error(g), "index 3 out of range [0, 3) at position [1,1]"))
        fail_msg("%s", alloy_last_error(g));
    gv[3] = 1, sv[2] = -1;
    assert_int_equal(alloy_graph_run(g, feeds, 3, out, 4), ALLOY_ERR_INVALID);
    if (!strstr(alloy_last_error(g), "index_select") || !strstr(alloy_last_error(g), "index -1 out of range [0, 2) at position [2]"))
        fail_msg("%s", alloy_last_error(g));
    alloy_graph_free(g);
}

/* The indexing ops' and arange's builder errors name what is wrong. */
static void test_bad_indexing_and_arange_arguments_are_errors_that_name_them(void **state)
{
    (void)state;
    static const char *const want[] = {
        "index must be i32 or i64, not f32",      "index must have the input's rank 2, not 1",
        "index dim 0 is 5, more than the input's 2", "index must have rank 1, not 2",
        "must be finite with step != 0",           "step -1 does not lead from start 0 to end 1",
        "elements are too many",                   "eps must be finite and >= 0, not -1",
    };
    for (int k = 0; k < (int)(sizeof want / sizeof want[0]); k++) {
        alloy_graph *g = alloy_graph_new("bad");
        alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(2, 3)), *f = alloy_input(g, "f", ALLOY_F32, 2, DIMS(2, 2));
        alloy_tensor *i1 = alloy_input(g, "i1", ALLOY_I64, 1, DIMS(2)), *i5 = alloy_input(g, "i5", ALLOY_I64, 2, DIMS(5, 1));
        alloy_tensor *y = NULL;
        switch (k) {
        case 0: y = alloy_gather(g, x, 1, f); break;
        case 1: y = alloy_gather(g, x, 1, i1); break;
        case 2: y = alloy_gather(g, x, 1, i5); break;
        case 3: y = alloy_index_select(g, x, 0, i5); break;
        case 4: y = alloy_arange(g, 0, 1, 0, ALLOY_F32); break;
        case 5: y = alloy_arange(g, 0, 1, -1, ALLOY_F32); break;
        case 6: y = alloy_arange(g, 0, 1e16, 1, ALLOY_F32); break;
        case 7: y = alloy_batch_norm(g, alloy_input(g, "b", ALLOY_F32, 2, DIMS(4, 3)), "bn", 0.1, -1, false); break;
        }
        assert_null(y);
        if (!strstr(alloy_last_error(g), want[k])) fail_msg("case %d: '%s' does not say '%s'", k, alloy_last_error(g), want[k]);
        alloy_graph_free(g);
    }
}

/* Every normalization refuses an eps that is NaN, infinite or negative
 * with one message (layer_norm and rms_norm took NaN: every output NaN). */
static void test_every_norm_refuses_a_nan_infinite_or_negative_eps_with_one_message(void **state)
{
    (void)state;
    const double bad[3] = {NAN, INFINITY, -1};
    const char *says[3] = {"eps must be finite and >= 0, not nan", "eps must be finite and >= 0, not inf",
                           "eps must be finite and >= 0, not -1"};
    for (int i = 0; i < 3; i++)
        for (int op = 0; op < 4; op++) {
            alloy_graph *g = alloy_graph_new("eps");
            alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 3, (int64_t[]){2, 4, 3});
            alloy_tensor *y = op == 0   ? alloy_layer_norm(g, x, NULL, NULL, bad[i])
                              : op == 1 ? alloy_rms_norm(g, x, NULL, bad[i])
                              : op == 2 ? alloy_batch_norm(g, x, "bn", 0.1, bad[i], false)
                                        : alloy_group_norm(g, x, 2, NULL, NULL, bad[i]);
            if (y || !strstr(alloy_last_error(g), says[i]))
                fail_msg("op %d, eps %g: %s '%s'", op, bad[i], y ? "accepted" : "refused", alloy_last_error(g));
            alloy_graph_free(g);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_every_norm_refuses_a_nan_infinite_or_negative_eps_with_one_message, test_checked_alloc),
        cmocka_unit_test_setup(test_batch_norm_matches_pytorch_over_two_steps_and_in_eval_mode, test_checked_alloc),
        cmocka_unit_test_setup(test_batch_norm_outside_training_uses_the_initial_running_statistics, test_checked_alloc),
        cmocka_unit_test_setup(test_a_skipped_step_leaves_the_running_statistics_bit_for_bit, test_checked_alloc),
        cmocka_unit_test_setup(test_with_accumulation_the_running_statistics_move_on_the_last_micro_batch, test_checked_alloc),
        cmocka_unit_test_setup(test_batch_norm_statistics_stay_f32_under_amp, test_checked_alloc),
        cmocka_unit_test_setup(test_group_norm_matches_pytorch, test_checked_alloc),
        cmocka_unit_test_setup(test_bad_norm_arguments_are_errors_that_name_them, test_checked_alloc),
        cmocka_unit_test_setup(test_training_batch_norm_on_one_value_per_channel_is_an_error, test_checked_alloc),
        cmocka_unit_test_setup(test_bad_indexing_and_arange_arguments_are_errors_that_name_them, test_checked_alloc),
        cmocka_unit_test_setup(test_batch_norm_in_ir_text_trains_its_state_and_needs_the_lower_norm_pass, test_checked_alloc),
        cmocka_unit_test_setup(test_indexing_ops_by_hand_and_out_of_range_indices_name_the_position, test_checked_alloc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
