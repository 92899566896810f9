/* test_share.c - graphs that share state by name (alloy_graph_share_state): an evaluation graph reads what the training graph's steps write with no copy (params and batch_norm's running statistics), mismatches are refused and change nothing, either graph may be freed first, and a training checkpoint loads into a forward-only graph. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* ---- the model: y = x w + b, w f32[3,2], b f32[2] ----
 *
 * The training graph takes 4 rows of x and a target t and minimizes
 * mean((y - t)^2) with AdamW; the evaluation graph takes 1 row and outputs y. */
enum { IN = 3, OUT = 2, TRAIN_ROWS = 4 };

static alloy_graph *train_graph(void)
{
    alloy_graph *g = alloy_graph_new("train");
    assert_non_null(g);
    alloy_graph_set_seed(g, 5);
    alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(TRAIN_ROWS, IN));
    alloy_tensor *t = alloy_input(g, "t", F32, 2, DIMS(TRAIN_ROWS, OUT));
    alloy_tensor *w = alloy_param(g, "w", F32, 2, DIMS(IN, OUT), alloy_init_uniform(-1, 1));
    alloy_tensor *b = alloy_param(g, "b", F32, 1, DIMS(OUT), alloy_init_uniform(-1, 1));
    alloy_tensor *y = alloy_add(g, alloy_matmul(g, x, w, false, false), b);
    alloy_tensor *loss = alloy_reduce_mean(g, alloy_square(g, alloy_sub(g, y, t)), 0, NULL, false);
    expect_ok(g, alloy_output(g, "loss", loss), "output");
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_adamw(0.05, 0.9, 0.999, 1e-8, 0.1)), "add_optimizer");
    return g;
}

/* The forward graph of one row; w_dtype and w_rows let a test build a
 * mismatch, extra adds a param "extra" f32[2] the training graph lacks. */
static alloy_graph *eval_graph(alloy_dtype w_dtype, int64_t w_rows, bool extra)
{
    alloy_graph *g = alloy_graph_new("eval");
    assert_non_null(g);
    alloy_graph_set_seed(g, 99); /* other initial values than train's */
    alloy_tensor *x = alloy_input(g, "x", w_dtype, 2, DIMS(1, w_rows));
    alloy_tensor *w = alloy_param(g, "w", w_dtype, 2, DIMS(w_rows, OUT), alloy_init_uniform(-1, 1));
    alloy_tensor *b = alloy_param(g, "b", w_dtype, 1, DIMS(OUT), alloy_init_uniform(-1, 1));
    alloy_tensor *y = alloy_add(g, alloy_matmul(g, x, w, false, false), b);
    if (extra) y = alloy_add(g, y, alloy_param(g, "extra", w_dtype, 1, DIMS(OUT), alloy_init_constant(0.5)));
    expect_ok(g, alloy_output(g, "y", y), "output");
    return g;
}

static float X_TRAIN[TRAIN_ROWS * IN] = {0.5f, -1, 2, 1, 0.25f, -0.5f, -2, 1.5f, 0, 0.75f, 0.75f, -1};
static float T_TRAIN[TRAIN_ROWS * OUT] = {1, -1, 0.5f, 2, -1.5f, 0, 0.25f, 0.5f};
static float X_EVAL[IN] = {0.3f, -0.7f, 1.1f};

static void train_step(alloy_graph *g)
{
    alloy_host_tensor feeds[2] = {{"x", F32, 2, {TRAIN_ROWS, IN}, X_TRAIN}, {"t", F32, 2, {TRAIN_ROWS, OUT}, T_TRAIN}};
    expect_ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), "train step");
}

/* The evaluation graph's y for X_EVAL into y[OUT]. */
static void eval_y(alloy_graph *g, double *y)
{
    alloy_host_tensor feed = {"x", F32, 2, {1, IN}, X_EVAL}, fetch = {.name = "y"};
    expect_ok(g, alloy_graph_run(g, &feed, 1, &fetch, 1), "eval run");
    assert_int_equal(fetch.dtype, F32);
    for (int j = 0; j < OUT; j++) y[j] = ((const float *)fetch.data)[j];
}

/* y = X_EVAL w + b in f64 from g's state tensors w and b (plus "extra"
 * when given), the reference the evaluation graph is checked against. */
static void reference_y(alloy_graph *g, const float *extra, double *y)
{
    alloy_host_tensor w, b;
    expect_ok(g, alloy_graph_get_state(g, "w", &w), "get_state w");
    expect_ok(g, alloy_graph_get_state(g, "b", &b), "get_state b");
    for (int j = 0; j < OUT; j++) {
        y[j] = ((const float *)b.data)[j] + (extra ? extra[j] : 0);
        for (int i = 0; i < IN; i++) y[j] += (double)X_EVAL[i] * ((const float *)w.data)[i * OUT + j];
    }
}

/* Whether state tensor name has the same bytes in a and b. */
static bool same_state(alloy_graph *a, alloy_graph *b, const char *name)
{
    alloy_host_tensor ta, tb;
    expect_ok(a, alloy_graph_get_state(a, name, &ta), name);
    expect_ok(b, alloy_graph_get_state(b, name, &tb), name);
    assert_int_equal(ta.dtype, tb.dtype);
    assert_int_equal(ta.rank, tb.rank);
    size_t n = alloy_dtype_size(ta.dtype);
    for (int i = 0; i < ta.rank; i++) n *= (size_t)ta.dims[i];
    return memcmp(ta.data, tb.data, n) == 0;
}

static void expect_close(const double *got, const double *want, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= 1e-6 * fmax(1, fabs(want[i]))))
            fail_msg("%s: element %d is %.9g, expected %.9g", what, i, got[i], want[i]);
}

/* Checks g's status and that its message holds each part. */
static void expect_error(alloy_graph *g, alloy_status got, alloy_status want, const char *const *parts)
{
    const char *msg = alloy_last_error(g);
    if (got != want)
        fail_msg("status %s, expected %s (message: %s)", alloy_status_name(got), alloy_status_name(want), msg);
    for (; *parts; parts++)
        if (!strstr(msg, *parts)) fail_msg("message \"%s\" lacks \"%s\"", msg, *parts);
}
#define EXPECT_ERROR(g, call, status, ...) \
    expect_error((g), (call), (status), (const char *const[]){__VA_ARGS__, NULL})

/* ---- tests ---- */

/* Three AdamW steps of the training graph: after each the evaluation
 * graph's params are the training graph's bit for bit, its output is
 * X_EVAL w + b from the training graph's values, and its state tensors
 * are the training graph's storage (one cell, one buffer: no copy). The
 * output moves with training, so an evaluation graph with a copy of its
 * own would fail after the first step. */
static void eval_reads_what_train_steps_write(bool eval_ran_before)
{
    alloy_graph *train = train_graph(), *eval = eval_graph(F32, IN, false);
    double y[OUT], want[OUT], first[OUT];
    if (eval_ran_before) eval_y(eval, y); /* eval has a backend and state of its own: they move */
    int shared = -1, unshared = -1;
    expect_ok(eval, alloy_graph_share_state(eval, train, &shared, &unshared), "share_state");
    assert_int_equal(shared, 2);
    assert_int_equal(unshared, 0);
    assert_int_equal(alloy_graph_state_count(eval), 2); /* its params only: no moments, no counter */
    eval_y(eval, first);
    reference_y(train, NULL, want);
    expect_close(first, want, OUT, "eval before training");
    for (int step = 1; step <= 3; step++) {
        train_step(train);
        assert_true(same_state(eval, train, "w") && same_state(eval, train, "b"));
        eval_y(eval, y);
        reference_y(train, NULL, want);
        expect_close(y, want, OUT, "eval after a training step");
    }
    assert_true(y[0] != first[0] || y[1] != first[1]); /* training moved the params the eval graph reads */
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "b" : "w";
        assert_ptr_equal(state_find(eval, name)->cell, state_find(train, name)->cell);
    }
    assert_ptr_equal(eval->dev, train->dev);
    assert_int_equal(eval->dev->refs, 2);
    /* and the other way: set_state through eval is train's value */
    float b_new[OUT] = {0.125f, -0.25f};
    expect_ok(eval, alloy_graph_set_state(eval, &(alloy_host_tensor){"b", F32, 1, {OUT}, b_new}), "set_state");
    alloy_host_tensor b;
    expect_ok(train, alloy_graph_get_state(train, "b", &b), "get_state b");
    assert_memory_equal(b.data, b_new, sizeof b_new);
    alloy_graph_free(eval);
    alloy_graph_free(train);
}

static void test_an_eval_graph_reads_the_params_the_training_steps_update_with_no_copy(void **state)
{
    (void)state;
    eval_reads_what_train_steps_write(false);
}

static void test_an_eval_graph_that_ran_on_its_own_state_before_sharing_reads_the_training_params_after(void **state)
{
    (void)state;
    eval_reads_what_train_steps_write(true);
}

/* A param of another shape or dtype is refused with both graphs and the
 * tensor named, and nothing is shared: eval's "b", which did match, is
 * still eval's own afterwards. */
static void test_share_state_refuses_a_shape_or_dtype_mismatch_naming_the_tensor_and_changes_nothing(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        alloy_graph *train = train_graph();
        alloy_graph *eval = k == 0 ? eval_graph(F32, IN + 1, false) : eval_graph(F64, IN, false);
        alloy_host_tensor before;
        expect_ok(eval, alloy_graph_get_state(eval, "b", &before), "get_state b");
        double b0[OUT];
        for (int j = 0; j < OUT; j++) b0[j] = test_decode(before.dtype, before.data, j);
        int shared = -1, unshared = -1;
        alloy_status st = alloy_graph_share_state(eval, train, &shared, &unshared);
        if (k == 0)
            EXPECT_ERROR(eval, st, ALLOY_ERR_SHAPE, "share_state: param 'w'", "f32[4,2] in graph 'eval'",
                         "f32[3,2] in graph 'train'", "nothing was shared");
        else EXPECT_ERROR(eval, st, ALLOY_ERR_DTYPE, "param '", "f64[", "in graph 'eval'", "f32[", "in graph 'train'");
        assert_int_equal(shared, 0);
        assert_int_equal(unshared, 0);
        train_step(train);
        alloy_host_tensor after;
        expect_ok(eval, alloy_graph_get_state(eval, "b", &after), "get_state b");
        for (int j = 0; j < OUT; j++) assert_true(test_decode(after.dtype, after.data, j) == b0[j]);
        if (k == 0) assert_false(same_state(eval, train, "b"));
        assert_int_equal(eval->dev->refs, 1);
        alloy_graph_free(eval);
        alloy_graph_free(train);
    }
}

/* The calls that cannot share: NULL owner, itself, a second share, an
 * owner with a builder error, a device the owner does not run on. */
static void test_share_state_refuses_null_self_a_second_share_a_broken_owner_and_another_device(void **state)
{
    (void)state;
    alloy_graph *train = train_graph(), *eval = eval_graph(F32, IN, false), *other = train_graph();
    assert_int_equal(alloy_graph_share_state(NULL, train, NULL, NULL), ALLOY_ERR_INVALID);
    EXPECT_ERROR(eval, alloy_graph_share_state(eval, NULL, NULL, NULL), ALLOY_ERR_INVALID, "share_state: owner is NULL");
    EXPECT_ERROR(eval, alloy_graph_share_state(eval, eval, NULL, NULL), ALLOY_ERR_INVALID, "with itself");
    expect_ok(eval, alloy_graph_set_option(eval, "device", "cuda"), "set_option");
    EXPECT_ERROR(eval, alloy_graph_share_state(eval, train, NULL, NULL), ALLOY_ERR_INVALID, "asks for device cuda",
                 "graph 'train' runs on cpu");
    expect_ok(eval, alloy_graph_set_option(eval, "device", "auto"), "set_option");
    alloy_graph *broken = alloy_graph_new("broken");
    assert_null(alloy_add(broken, alloy_input(broken, "a", F32, 1, DIMS(2)), alloy_input(broken, "b", F32, 1, DIMS(3))));
    EXPECT_ERROR(eval, alloy_graph_share_state(eval, broken, NULL, NULL), ALLOY_ERR_SHAPE, "share_state: graph 'broken'");
    expect_ok(eval, alloy_graph_share_state(eval, train, NULL, NULL), "share_state");
    EXPECT_ERROR(eval, alloy_graph_share_state(eval, other, NULL, NULL), ALLOY_ERR_INVALID,
                 "share_state: graph 'eval' already shares another graph's state; a graph shares state once, with one "
                 "owner");
    /* an owner with sharers taking a third graph's state: the message said it "already shares" */
    EXPECT_ERROR(train, alloy_graph_share_state(train, broken, NULL, NULL), ALLOY_ERR_INVALID,
                 "share_state: graph 'train' cannot take graph 'broken''s state: 1 other graph already shares its own; "
                 "share it with graph 'broken' instead");
    /* the owner may be shared by several: a second sharer binds to the same storage */
    alloy_graph *sampler = eval_graph(F32, IN, false);
    expect_ok(sampler, alloy_graph_share_state(sampler, train, NULL, NULL), "second sharer");
    assert_ptr_equal(state_find(sampler, "w")->cell, state_find(eval, "w")->cell);
    assert_int_equal(train->dev->refs, 3);
    alloy_graph_free(broken), alloy_graph_free(other), alloy_graph_free(train);
    alloy_graph_free(eval), alloy_graph_free(sampler);
}

/* A param the owner lacks stays the sharer's own (its init), counted as
 * unshared; owner's state does not grow by it. */
static void test_a_param_the_owner_lacks_stays_the_sharers_own(void **state)
{
    (void)state;
    alloy_graph *train = train_graph(), *eval = eval_graph(F32, IN, true);
    int shared = -1, unshared = -1;
    expect_ok(eval, alloy_graph_share_state(eval, train, &shared, &unshared), "share_state");
    assert_int_equal(shared, 2);
    assert_int_equal(unshared, 1);
    train_step(train);
    double y[OUT], want[OUT];
    eval_y(eval, y);
    reference_y(train, (const float[]){0.5f, 0.5f}, want);
    expect_close(y, want, OUT, "eval with its own 'extra'");
    alloy_host_tensor t;
    assert_int_equal(alloy_graph_get_state(train, "extra", &t), ALLOY_ERR_NOT_FOUND);
    alloy_graph_free(train);
    alloy_graph_free(eval);
}

/* The storage is reference-counted: with the training graph freed first
 * the evaluation graph still runs on the last trained values; with the
 * evaluation graph freed first training goes on. The allocator is
 * cmocka's, so a leak or a double free fails the test (and CI runs it
 * under ASan). */
static void test_graphs_sharing_state_may_be_freed_in_either_order(void **state)
{
    (void)state;
    for (int order = 0; order < 2; order++) {
        alloy_graph *train = train_graph(), *eval = eval_graph(F32, IN, false);
        expect_ok(eval, alloy_graph_share_state(eval, train, NULL, NULL), "share_state");
        train_step(train);
        double want[OUT], y[OUT];
        reference_y(train, NULL, want);
        if (order == 0) {
            alloy_graph_free(train);
            eval_y(eval, y);
            expect_close(y, want, OUT, "eval after the training graph was freed");
            assert_int_equal(eval->dev->refs, 1);
            alloy_graph_free(eval);
        } else {
            alloy_graph_free(eval);
            assert_int_equal(train->dev->refs, 1);
            train_step(train);
            alloy_step_info info;
            expect_ok(train, alloy_graph_step_info(train, &info), "step_info");
            assert_int_equal(info.step, 2);
            alloy_graph_free(train);
        }
    }
}

/* A training checkpoint (params, moments, counters) into a forward-only
 * graph: load_state refuses the extra tensors and points at load_params,
 * which loads the params and reports the rest as ignored. */
static void test_a_training_checkpoint_loads_into_a_forward_only_graph_with_load_params(void **state)
{
    (void)state;
    char path[] = "/tmp/alloy_share_ckpt_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    alloy_graph *train = train_graph(), *eval = eval_graph(F32, IN, false);
    train_step(train);
    expect_ok(train, alloy_graph_save_checkpoint(train, path), "save_checkpoint");
    int ntrain = alloy_graph_state_count(train); /* w, b, their m and v, optim.step, optim.lr */
    assert_int_equal(ntrain, 8);
    EXPECT_ERROR(eval, alloy_graph_load_state(eval, path), ALLOY_ERR_NOT_FOUND, "matches no state of graph 'eval'",
                 "alloy_graph_load_params");
    assert_false(same_state(eval, train, "w"));
    int loaded = -1, ignored = -1;
    expect_ok(eval, alloy_graph_load_params(eval, path, &loaded, &ignored), "load_params");
    assert_int_equal(loaded, 2);
    assert_int_equal(ignored, ntrain - 2);
    assert_true(same_state(eval, train, "w") && same_state(eval, train, "b"));
    double y[OUT], want[OUT];
    eval_y(eval, y);
    reference_y(train, NULL, want);
    expect_close(y, want, OUT, "eval from the checkpoint");
    unlink(path);
    alloy_graph_free(train);
    alloy_graph_free(eval);
}

/* batch_norm's running statistics are state the model built: an
 * evaluation graph (no loss: it normalizes with them) shares them as it
 * shares params, so after training steps its output is (x - running_mean)
 * / sqrt(running_var + eps) * weight + bias with the training graph's
 * values, computed here in f64. A copy of its own would keep mean 0 and
 * var 1 and be far off (the training data's mean is about 1.5). */
static void test_an_eval_graph_normalizes_with_the_running_statistics_the_training_steps_update(void **state)
{
    (void)state;
    enum { C = 2, ROWS = 4 };
    const double eps = 1e-5;
    alloy_graph *train = alloy_graph_new("train"), *eval = alloy_graph_new("eval");
    alloy_tensor *x = alloy_input(train, "x", F32, 2, DIMS(ROWS, C));
    alloy_tensor *t = alloy_input(train, "t", F32, 2, DIMS(ROWS, C));
    alloy_tensor *y = alloy_batch_norm(train, x, "bn", 0.5, eps, true);
    alloy_tensor *loss = alloy_reduce_mean(train, alloy_square(train, alloy_sub(train, y, t)), 0, NULL, false);
    expect_ok(train, alloy_graph_set_loss(train, loss), "set_loss");
    expect_ok(train, alloy_graph_add_optimizer(train, alloy_adamw(0.05, 0.9, 0.999, 1e-8, 0)), "add_optimizer");
    alloy_tensor *ex = alloy_input(eval, "x", F32, 2, DIMS(1, C));
    expect_ok(eval, alloy_output(eval, "y", alloy_batch_norm(eval, ex, "bn", 0.5, eps, true)), "output");
    int shared = -1, unshared = -1;
    expect_ok(eval, alloy_graph_share_state(eval, train, &shared, &unshared), "share_state");
    assert_int_equal(shared, 4); /* bn.weight, bn.bias, bn.running_mean, bn.running_var */
    assert_int_equal(unshared, 0);
    float xs[ROWS * C] = {1, 2, 2, 0.5f, 0.5f, 3, 3, 1}, ts[ROWS * C] = {1, -1, 0, 2, -2, 0.5f, 0.25f, 0};
    alloy_host_tensor feeds[2] = {{"x", F32, 2, {ROWS, C}, xs}, {"t", F32, 2, {ROWS, C}, ts}};
    float probe[C] = {1.25f, 2.5f};
    for (int step = 1; step <= 3; step++) {
        expect_ok(train, alloy_graph_run(train, feeds, 2, NULL, 0), "train step");
        alloy_host_tensor rm, rv, w, b;
        expect_ok(train, alloy_graph_get_state(train, "bn.running_mean", &rm), "running_mean");
        expect_ok(train, alloy_graph_get_state(train, "bn.running_var", &rv), "running_var");
        expect_ok(train, alloy_graph_get_state(train, "bn.weight", &w), "weight");
        expect_ok(train, alloy_graph_get_state(train, "bn.bias", &b), "bias");
        double want[C], got[C];
        for (int c = 0; c < C; c++) {
            const float *m = rm.data, *v = rv.data, *wc = w.data, *bc = b.data;
            want[c] = (probe[c] - m[c]) / sqrt((double)v[c] + eps) * wc[c] + bc[c];
        }
        assert_true(((const float *)rm.data)[0] != 0); /* the statistics moved */
        alloy_host_tensor feed = {"x", F32, 2, {1, C}, probe}, fetch = {.name = "y"};
        expect_ok(eval, alloy_graph_run(eval, &feed, 1, &fetch, 1), "eval run");
        for (int c = 0; c < C; c++) got[c] = ((const float *)fetch.data)[c];
        expect_close(got, want, C, "eval batch_norm after a training step");
    }
    assert_ptr_equal(state_find(eval, "bn.running_var")->cell, state_find(train, "bn.running_var")->cell);
    alloy_graph_free(eval);
    alloy_graph_free(train);
}

/* y = batch_norm(x [1, 2], "bn") without affine params: a graph whose
 * only state is bn.running_mean and bn.running_var. */
static alloy_graph *bn_graph(const char *name)
{
    alloy_graph *g = alloy_graph_new(name);
    alloy_tensor *x = alloy_input(g, "x", F32, 2, DIMS(1, 2));
    expect_ok(g, alloy_output(g, "y", alloy_batch_norm(g, x, "bn", 0.1, 1e-5, false)), "output");
    return g;
}

/* y = -p for a param p named name: a graph whose only state is that param. */
static alloy_graph *param_graph(const char *graph_name, const char *name, int rank, const int64_t *dims)
{
    alloy_graph *g = alloy_graph_new(graph_name);
    alloy_tensor *p = alloy_param(g, name, F32, rank, dims, alloy_init_zeros());
    expect_ok(g, alloy_output(g, "y", alloy_neg(g, p)), "output");
    return g;
}

/* A name that is a param in one graph and state in the other is refused,
 * naming it and both graphs, and nothing is shared: a sharer's running
 * statistic against the owner's param, a sharer's param against the
 * owner's running statistic, and against an AdamW moment (state the
 * passes made, never shared). */
static void test_share_state_refuses_a_name_that_is_a_param_in_one_graph_and_state_in_the_other(void **state)
{
    (void)state;
    for (int k = 0; k < 3; k++) {
        alloy_graph *owner = k == 0   ? param_graph("owner", "bn.running_mean", 1, DIMS(2))
                             : k == 1 ? bn_graph("owner")
                                      : train_graph();
        alloy_graph *g = k == 0   ? bn_graph("eval")
                         : k == 1 ? param_graph("eval", "bn.running_var", 1, DIMS(2))
                                  : param_graph("eval", "w.m", 2, DIMS(IN, OUT));
        if (k == 2) train_step(owner); /* its AdamW moment "w.m" exists */
        int shared = -1;
        alloy_status st = alloy_graph_share_state(g, owner, &shared, NULL);
        if (k == 0)
            EXPECT_ERROR(g, st, ALLOY_ERR_INVALID, "share_state: state 'bn.running_mean' of graph 'eval'",
                         "names state of graph 'owner' that is not state the model built; nothing was shared");
        else
            EXPECT_ERROR(g, st, ALLOY_ERR_INVALID, k == 1 ? "param 'bn.running_var' of graph 'eval'" : "param 'w.m'",
                         "that is not a param; nothing was shared");
        assert_int_equal(shared, 0);
        alloy_graph_free(g);
        alloy_graph_free(owner);
    }
}

/* Every allocation of a share (the sharer compiled and run before, so its
 * state moves too) failed in turn: each is an out-of-memory error, nothing
 * is shared and no block leaks; with memory back the same call shares. */
static void test_every_allocation_failure_in_share_state_is_an_error_that_shares_nothing(void **state)
{
    (void)state;
    int failures = 0;
    for (long k = 0;; k++) {
        alloy_graph *train = train_graph(), *eval = eval_graph(F32, IN, false);
        double y[OUT];
        eval_y(eval, y);
        train_step(train);
        test_alloc_count = 0, test_fail_at = k;
        alloy_set_allocator(test_failing_realloc, NULL);
        int shared = -1;
        alloy_status st = alloy_graph_share_state(eval, train, &shared, NULL);
        alloy_set_allocator(test_cmocka_realloc, NULL);
        test_fail_at = -1;
        if (st == ALLOY_OK) {
            assert_int_equal(shared, 2);
            alloy_graph_free(eval), alloy_graph_free(train);
            break;
        }
        failures++;
        if (st != ALLOY_ERR_OOM) fail_msg("allocation %ld failed: %s (%s)", k, alloy_status_name(st), alloy_last_error(eval));
        assert_int_equal(shared, 0);
        assert_int_equal(eval->dev->refs, 1);
        assert_ptr_not_equal(state_find(eval, "w")->cell, state_find(train, "w")->cell);
        expect_ok(eval, alloy_graph_share_state(eval, train, &shared, NULL), "share_state with memory back");
        assert_int_equal(shared, 2);
        double want[OUT];
        eval_y(eval, y);
        reference_y(train, NULL, want);
        expect_close(y, want, OUT, "eval after a share that first ran out of memory");
        alloy_graph_free(eval), alloy_graph_free(train);
    }
    assert_true(failures > 0);
    print_message("%d allocations of share_state failed in turn, each cleanly\n", failures);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_an_eval_graph_reads_the_params_the_training_steps_update_with_no_copy,
                                        test_checked_alloc, test_plain_alloc),
        cmocka_unit_test_setup_teardown(
            test_an_eval_graph_that_ran_on_its_own_state_before_sharing_reads_the_training_params_after,
            test_checked_alloc, test_plain_alloc),
        cmocka_unit_test_setup_teardown(
            test_share_state_refuses_a_shape_or_dtype_mismatch_naming_the_tensor_and_changes_nothing,
            test_checked_alloc, test_plain_alloc),
        cmocka_unit_test_setup_teardown(
            test_share_state_refuses_null_self_a_second_share_a_broken_owner_and_another_device, test_checked_alloc,
            test_plain_alloc),
        cmocka_unit_test_setup_teardown(test_a_param_the_owner_lacks_stays_the_sharers_own, test_checked_alloc,
                                        test_plain_alloc),
        cmocka_unit_test_setup_teardown(test_graphs_sharing_state_may_be_freed_in_either_order, test_checked_alloc,
                                        test_plain_alloc),
        cmocka_unit_test_setup_teardown(test_a_training_checkpoint_loads_into_a_forward_only_graph_with_load_params,
                                        test_checked_alloc, test_plain_alloc),
        cmocka_unit_test_setup_teardown(
            test_an_eval_graph_normalizes_with_the_running_statistics_the_training_steps_update, test_checked_alloc,
            test_plain_alloc),
        cmocka_unit_test_setup_teardown(
            test_share_state_refuses_a_name_that_is_a_param_in_one_graph_and_state_in_the_other, test_checked_alloc,
            test_plain_alloc),
        cmocka_unit_test_setup_teardown(test_every_allocation_failure_in_share_state_is_an_error_that_shares_nothing,
                                        test_checked_alloc, test_plain_alloc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
