/* test_amp_lists.c - editing the AMP lists (the API and the environment): moving an op, conflicts and unknown names as errors, the unlisted class, and the AMP log saying why each f32 neighbour stays f32. */
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
#include "amp_support.h"
#include "ir/ir.h"
#include "models.h"
#include "passes/pass.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* ==== editing the lists ==== */

/* x -> gelu = y */
static alloy_graph *gelu_graph(void)
{
    alloy_graph *g = new_graph("gelu");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 4));
    output(g, "y", named(g, alloy_gelu(g, x), "h"));
    alloy_graph_enable_amp(g, ALLOY_F16);
    return g;
}

/* gelu as an infer op with nothing low precision around it: f32, no casts. */
static const want gelu_as_infer = {
    NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"h", ALLOY_F32, AMP_INFER, {"x"}}),
    .casts = NULL, .ncasts = 0,
    OUTPUTS({"y", "h"}),
};

/* gelu as an allow op: x -> f16, h -> f32 for the output. */
static const want gelu_as_allow = {
    NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"h", ALLOY_F16, AMP_ALLOW, {"x>f16"}}),
    CASTS({"x", ALLOY_F16, 1}, {"h", ALLOY_F32, 1}),
    OUTPUTS({"y", "h>f32"}),
};

static void test_moving_gelu_from_the_infer_to_the_allow_list_makes_it_run_in_f16(void **state)
{
    (void)state;
    alloy_graph *g = gelu_graph();
    expect_graph(g, &gelu_as_infer);
    assert_int_equal(alloy_amp_lists_remove(g, ALLOY_AMP_INFERLIST, "gelu"), ALLOY_OK);
    assert_int_equal(alloy_amp_lists_add(g, ALLOY_AMP_ALLOWLIST, "gelu"), ALLOY_OK);
    expect_graph(g, &gelu_as_allow); /* the edit recompiles */
    alloy_amp_report rep;
    assert_int_equal(alloy_graph_amp_report(g, &rep), ALLOY_OK);
    assert_int_equal(rep.float_nodes, 1);
    assert_int_equal(rep.low_nodes, 1);
    free_graph(g);
}

static void test_an_op_added_to_a_second_list_is_a_compile_error_naming_the_op_and_both_lists(void **state)
{
    (void)state;
    alloy_graph *g = gelu_graph();
    assert_int_equal(alloy_amp_lists_add(g, ALLOY_AMP_ALLOWLIST, "gelu"), ALLOY_OK);
    alloy_amp_report rep;
    assert_int_equal(alloy_graph_amp_report(g, &rep), ALLOY_ERR_INVALID);
    const char *msg = alloy_last_error(g);
    if (!strstr(msg, "amp: op 'gelu' is on both the allow and infer lists")) fail_msg("message: %s", msg);
    float x[8] = {0};
    alloy_host_tensor feed = {.name = "x", .dtype = ALLOY_F32, .rank = 2, .dims = {2, 4}, .data = x};
    alloy_host_tensor fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_ERR_INVALID);
    if (!strstr(alloy_last_error(g), "'gelu' is on both")) fail_msg("message: %s", alloy_last_error(g));
    /* An unknown op is refused when the edit is made. */
    assert_int_equal(alloy_amp_lists_add(g, ALLOY_AMP_DENYLIST, "gelux"), ALLOY_ERR_NOT_FOUND);
    if (!strstr(alloy_last_error(g), "'gelux'")) fail_msg("message: %s", alloy_last_error(g));
    /* Completing the move fixes it. */
    assert_int_equal(alloy_amp_lists_remove(g, ALLOY_AMP_INFERLIST, "gelu"), ALLOY_OK);
    expect_graph(g, &gelu_as_allow);
    free_graph(g);
}

static void test_list_edits_from_the_environment_apply_at_compile_time_on_top_of_the_api(void **state)
{
    (void)state;
    /* x -> exp = e -> gelu = h = y */
    alloy_graph *g = new_graph("env");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 4));
    alloy_tensor *e = named(g, alloy_exp(g, x), "e");
    output(g, "y", named(g, alloy_gelu(g, e), "h"));
    alloy_graph_enable_amp(g, ALLOY_F16);
    /* Default: e deny; h infer and a consumer of e -> deny. No casts. */
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"e", ALLOY_F32, AMP_DENY, {"x"}},
              {"h", ALLOY_F32, AMP_DENY, {"e"}}),
        .ncasts = 0, OUTPUTS({"y", "h"}),
    });
    /* API: gelu off the infer list. Environment: both onto the allow list,
     * exp off the deny list. Both e and h allow: x -> f16, h -> f32. */
    assert_int_equal(alloy_amp_lists_remove(g, ALLOY_AMP_INFERLIST, "gelu"), ALLOY_OK);
    setenv("ALLOY_AMP_ALLOWLIST_ADD", "exp, gelu", 1);
    setenv("ALLOY_AMP_DENYLIST_REMOVE", "exp", 1);
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"e", ALLOY_F16, AMP_ALLOW, {"x>f16"}},
              {"h", ALLOY_F16, AMP_ALLOW, {"e"}}),
        CASTS({"x", ALLOY_F16, 1}, {"h", ALLOY_F32, 1}), OUTPUTS({"y", "h>f32"}),
    });
    /* Without the environment (recompiled), the API edit alone remains:
     * gelu is on no list -> the unlisted class, deny. */
    clear_env();
    assert_int_equal(alloy_graph_enable_amp(g, ALLOY_F16), ALLOY_OK);
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"e", ALLOY_F32, AMP_DENY, {"x"}},
              {"h", ALLOY_F32, AMP_DENY, {"e"}}),
        .ncasts = 0, OUTPUTS({"y", "h"}),
    });
    free_graph(g);
}

static void test_an_unknown_op_in_an_environment_list_is_an_error_naming_it(void **state)
{
    (void)state;
    alloy_graph *g = gelu_graph();
    setenv("ALLOY_AMP_CLEARLIST_ADD", "reshape,not_an_op", 1);
    alloy_amp_report rep;
    assert_int_equal(alloy_graph_amp_report(g, &rep), ALLOY_ERR_NOT_FOUND);
    const char *msg = alloy_last_error(g);
    if (!strstr(msg, "'not_an_op'") || !strstr(msg, "ALLOY_AMP_CLEARLIST_ADD")) fail_msg("message: %s", msg);
    clear_env();
    expect_graph(g, &gelu_as_infer);
    free_graph(g);
}

static void test_an_op_on_no_list_is_denied_until_the_unlisted_class_is_changed(void **state)
{
    (void)state;
    /* x -> matmul(w1) -> add(b) -> matmul(w2) = y, with add taken off the infer list */
    alloy_graph *g = new_graph("unlisted");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 4));
    alloy_tensor *w1 = param_f32(g, "w1", 2, DIMS(4, 8));
    alloy_tensor *b = param_f32(g, "b", 1, DIMS(8));
    alloy_tensor *w2 = param_f32(g, "w2", 2, DIMS(8, 3));
    alloy_tensor *m1 = named(g, alloy_matmul(g, x, w1, false, false), "m1");
    alloy_tensor *a = named(g, alloy_add(g, m1, b), "a");
    output(g, "y", named(g, alloy_matmul(g, a, w2, false, false), "m2"));
    alloy_graph_enable_amp(g, ALLOY_F16);
    assert_int_equal(alloy_amp_lists_remove(g, ALLOY_AMP_INFERLIST, "add"), ALLOY_OK);
    /* add is unlisted -> deny: f32 between the matmuls.
     * Casts: x, w1, w2 -> f16 (2 weights), m1 -> f32, a -> f16, m2 -> f32: 6. */
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w1", ALLOY_F32, AMP_NONE, {0}},
              {"b", ALLOY_F32, AMP_NONE, {0}}, {"w2", ALLOY_F32, AMP_NONE, {0}},
              {"m1", ALLOY_F16, AMP_ALLOW, {"x>f16", "w1>f16"}}, {"a", ALLOY_F32, AMP_DENY, {"m1>f32", "b"}},
              {"m2", ALLOY_F16, AMP_ALLOW, {"a>f16", "w2>f16"}}),
        CASTS({"x", ALLOY_F16, 1}, {"w1", ALLOY_F16, 1}, {"w2", ALLOY_F16, 1}, {"m1", ALLOY_F32, 1},
              {"a", ALLOY_F16, 1}, {"m2", ALLOY_F32, 1}),
        OUTPUTS({"y", "m2>f32"}),
    });
    /* Unlisted ops as clear: a is a clear op sandwiched between m1 and m2
     * -> allow. Casts: x, w1, b, w2 -> f16 (3 weights), m2 -> f32: 5. */
    assert_int_equal(alloy_amp_set_unlisted(g, ALLOY_AMP_CLEARLIST), ALLOY_OK);
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w1", ALLOY_F32, AMP_NONE, {0}},
              {"b", ALLOY_F32, AMP_NONE, {0}}, {"w2", ALLOY_F32, AMP_NONE, {0}},
              {"m1", ALLOY_F16, AMP_ALLOW, {"x>f16", "w1>f16"}}, {"a", ALLOY_F16, AMP_ALLOW, {"m1", "b>f16"}},
              {"m2", ALLOY_F16, AMP_ALLOW, {"a", "w2>f16"}}),
        CASTS({"x", ALLOY_F16, 1}, {"w1", ALLOY_F16, 1}, {"b", ALLOY_F16, 1}, {"w2", ALLOY_F16, 1},
              {"m2", ALLOY_F32, 1}),
        OUTPUTS({"y", "m2>f32"}),
    });
    free_graph(g);
}

/* Runs the compile pipeline on a copy of g's graph with ALLOY_AMP_LOG=1
 * and returns what the amp pass logged (free it). */
static char *amp_log(alloy_graph *g)
{
    setenv("ALLOY_AMP_LOG", "1", 1);
    FILE *f = tmpfile();
    assert_non_null(f);
    ir_graph *copy = ir_graph_clone(g->ir);
    assert_non_null(copy);
    pass_options opts;
    al_options cfg;
    assert_int_equal(graph_options(g, &cfg), ALLOY_OK);
    assert_true(cfg.amp_log);
    assert_int_equal(graph_pass_options(g, &opts), ALLOY_OK);
    opts.log = f;
    opts.cfg = &cfg;
    alloy_status st = pass_run_pipeline(&copy, &opts, NULL, f, NULL, 0, NULL);
    if (st) fail_msg("pipeline: %s", copy->error);
    ir_graph_free(copy);
    unsetenv("ALLOY_AMP_LOG");
    long len = ftell(f);
    assert_true(len >= 0);
    char *text = calloc(1, (size_t)len + 1);
    assert_non_null(text);
    rewind(f);
    assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    return text;
}

static void test_alloy_amp_log_counts_the_casts_and_says_why_each_f32_neighbour_of_an_f16_node_stays_f32(
    void **state)
{
    (void)state;
    /* The MLP (see the MLP test below): 4 of its 6 f32 compute nodes go to
     * f16 with 5 casts, 3 of them weights. The f32 nodes next to an f16
     * one: only logits = add(b2) (its input is matmul 2); cross_entropy's
     * inputs are logits (f32) and the targets. */
    alloy_graph *g = new_graph("mlp");
    build_mlp(g, ALLOY_F32, 4, 8, 16, 5);
    alloy_graph_enable_amp(g, ALLOY_F16);
    char *log = amp_log(g);
    assert_string_equal(log, "alloy amp: converted 4/6 nodes to f16 with 5 casts (3 weight casts)\n"
                             "alloy amp:   logits (add) stays f32: infer op not between low-precision nodes\n");
    free(log);
    free_graph(g);
    /* The deny chain (first test): of its 5 f32 compute nodes, s and m go
     * to f16 with 3 casts (1 weight). The only f32 node next to an f16 one
     * is a (it feeds s), deny by propagation from e. */
    g = deny_chain_graph();
    log = amp_log(g);
    assert_string_equal(log, "alloy amp: converted 2/5 nodes to f16 with 3 casts (1 weight casts)\n"
                             "alloy amp:   a (add) stays f32: downstream of deny node e (exp) through "
                             "clear/infer ops\n");
    free(log);
    free_graph(g);
}

/* ==== the documented lists ==== */

/* Each op the class table of docs/amp.md ("## The four classes") names in a
 * class's row has that class in ops.def: the default lists are the op
 * table's column, so the doc may not drift from it. */
static void test_docs_amp_md_names_each_op_in_the_class_ops_def_gives_it(void **state)
{
    (void)state;
    static const char *const classes[] = {[AMP_ALLOW] = "allow", [AMP_DENY] = "deny", [AMP_INFER] = "infer",
                                          [AMP_CLEAR] = "clear"};
    size_t len;
    char *text = (char *)test_read_file(ALLOY_AMP_MD, &len);
    char *at = strstr(text, "\n## The four classes\n");
    if (!at) fail_msg("%s has no section \"## The four classes\"", ALLOY_AMP_MD);
    char *end = strstr(at + 1, "\n## ");
    if (end) *end = '\0';
    int named = 0;
    for (char *line = at + 1; line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        int cls = -1;
        for (int k = AMP_ALLOW; k <= AMP_CLEAR; k++)
            if (!strncmp(line, "| ", 2) && !strncmp(line + 2, classes[k], strlen(classes[k])) && line[2 + strlen(classes[k])] == ' ')
                cls = k;
        if (cls < 0) continue;
        char *eol = strchr(line, '\n') ? strchr(line, '\n') : line + strlen(line), *cell = eol;
        while (cell > line && cell[-1] == ' ') cell--;
        if (cell > line && cell[-1] == '|') cell--;
        while (cell > line && cell[-1] != '|') cell--;
        for (char *tick = strchr(cell, '`'); tick && tick < eol; tick = strchr(tick, '`')) {
            char *close = strchr(tick + 1, '`'), name[64];
            if (!close || close > eol) break;
            snprintf(name, sizeof name, "%.*s", (int)(close - tick - 1), tick + 1);
            int op = ir_op_lookup(name);
            if (op < 0) fail_msg("docs/amp.md lists an op `%s` that ops.def does not have", name);
            if ((int)ir_ops[op].amp != cls)
                fail_msg("docs/amp.md lists `%s` as %s, ops.def gives %s", name, classes[cls], classes[ir_ops[op].amp]);
            named++;
            tick = close + 1;
        }
    }
    test_free(text);
    assert_true(named >= 40);
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        AMP_TEST(test_moving_gelu_from_the_infer_to_the_allow_list_makes_it_run_in_f16),
        AMP_TEST(test_an_op_added_to_a_second_list_is_a_compile_error_naming_the_op_and_both_lists),
        AMP_TEST(test_list_edits_from_the_environment_apply_at_compile_time_on_top_of_the_api),
        AMP_TEST(test_an_unknown_op_in_an_environment_list_is_an_error_naming_it),
        AMP_TEST(test_an_op_on_no_list_is_denied_until_the_unlisted_class_is_changed),
        AMP_TEST(test_alloy_amp_log_counts_the_casts_and_says_why_each_f32_neighbour_of_an_f16_node_stays_f32),
        AMP_TEST(test_docs_amp_md_names_each_op_in_the_class_ops_def_gives_it),
    };
    return amp_run_tests(tests, COUNT(tests));
}
