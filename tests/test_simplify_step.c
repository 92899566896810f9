/* test_simplify_step.c - the simplify pass at scale: the AMP transformer training step run before and after (fewer nodes, every result kept), a second simplify changing nothing, linear time, and every allocation failure leaving the graph as it was. */
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
#include "base/convert.h"
#include "ir/ir.h"
#include "models.h"
#include "passes/pass.h"
#include "runtime/cpu/cpu.h"
#include "runtime/graph/graph_impl.h"
#include "simplify_support.h"
#include "support.h"


/* ---- the transformer training step ---- */

enum { BLK_B = 2, BLK_T = 4, BLK_V = 11, BLK_D = 8, BLK_H = 2 };

static alloy_graph *amp_training_block(void)
{
    alloy_graph *g = alloy_graph_new("block");
    assert_non_null(g);
    test_block m = build_transformer_block(g, ALLOY_F32, BLK_B, BLK_T, BLK_V, BLK_D, BLK_H);
    assert_int_equal(alloy_graph_set_loss(g, m.loss), ALLOY_OK);
    assert_int_equal(alloy_graph_enable_amp(g, ALLOY_F16), ALLOY_OK);
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    sc.init_scale = 1024; /* 65536 overflows f16 on the first step, which would skip the update */
    assert_int_equal(alloy_graph_set_grad_scaler(g, sc), ALLOY_OK);
    assert_int_equal(alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01)), ALLOY_OK);
    FILE *devnull = fopen("/dev/null", "w");
    assert_non_null(devnull);
    alloy_status st = alloy_graph_dump(g, devnull, ALLOY_DUMP_IR);
    fclose(devnull);
    if (st) fail_msg("compile: %s", alloy_last_error(g));
    assert_int_equal(state_ensure(g), ALLOY_OK);
    return g;
}

/* g's compiled step as simplify sees it in the pipeline, after dce and
 * before fuse: fuse only annotates groups, so clearing them undoes it. */
static ir_graph *before_fuse(alloy_graph *g)
{
    for (int i = 0; i < g->compiled->nnodes; i++) g->compiled->nodes[i]->group = -1;
    return g->compiled;
}

/* Runs c (a compiled step of g) once on g's state and fixed tokens; the
 * values of outputs, updates and the loss are kept (free with
 * cpu_release_values and al_free). */
static rt_tensor *run_step(alloy_graph *g, const ir_graph *c)
{
    static int32_t tokens[BLK_B * BLK_T], targets[BLK_B * BLK_T];
    for (int i = 0; i < BLK_B * BLK_T; i++) {
        tokens[i] = (i * 7 + 3) % BLK_V;
        targets[i] = (i * 5 + 1) % BLK_V;
    }
    rt_tensor *values = al_calloc((size_t)c->nnodes, sizeof *values);
    bool *keep = al_calloc((size_t)c->nnodes, sizeof *keep);
    assert_true(values && keep);
    for (int i = 0; i < c->noutputs; i++) keep[c->outputs[i].node] = true;
    for (int i = 0; i < c->nupdates; i++) keep[c->updates[i].node] = true;
    keep[c->loss] = true;
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        if (n->op == IR_OP_input) values[i].data = strcmp(n->name, "tokens") == 0 ? tokens : targets;
        if (n->op == IR_OP_param || n->op == IR_OP_state) {
            rt_state *s = state_find(g, n->name);
            assert_non_null(s);
            assert_int_equal(state_host(g, s), ALLOY_OK);
            values[i].data = s->cell->host;
        }
    }
    cpu_exec x = {.nthreads = 1};
    if (cpu_run_graph(&x, c, values, keep)) fail_msg("run: %s", x.error);
    al_free(keep);
    return values;
}

/* Whether a and b agree within f32 rounding (2^-23 relative, NaN = NaN). */
static bool close_f32(double a, double b)
{
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (a == b) return true;
    return fabs(a - b) <= 0x1p-23 * fmax(fabs(a), fabs(b));
}

/* Node `ia` of a (values va) and node `ib` of b (vb) hold the same value. */
static int compare_values(const char *what, const ir_graph *a, const rt_tensor *va, int ia, const ir_graph *b,
                          const rt_tensor *vb, int ib, int *bitwise)
{
    const ir_type *t = &a->nodes[ia]->type;
    assert_true(ir_type_eq(t, &b->nodes[ib]->type));
    int64_t n = ir_numel(t);
    double *x = al_arena_alloc(&simplify_arena, sizeof(double) * (size_t)(2 * n + 1)), *y = x + n;
    assert_non_null(x);
    cvt_load_f64(t->dtype, va[ia].data, x, (size_t)n);
    cvt_load_f64(t->dtype, vb[ib].data, y, (size_t)n);
    for (int64_t e = 0; e < n; e++)
        if (!close_f32(x[e], y[e])) fail_msg("%s element %lld: %.9g before simplify, %.9g after", what, (long long)e, x[e], y[e]);
    *bitwise += memcmp(va[ia].data, vb[ib].data, ir_nbytes(t)) == 0;
    return 1;
}

static void test_simplifying_the_amp_training_step_of_the_transformer_block_removes_nodes_and_keeps_every_result(
    void **state)
{
    (void)state;
    alloy_graph *g = amp_training_block();
    const ir_graph *c = before_fuse(g);
    ir_graph *s = simplified(c, true);
    print_message("transformer block, f16 AMP + dynamic scaler + adamw: %d nodes compiled, %d after simplify + dce\n",
                  c->nnodes, s->nnodes);
    assert_true(s->nnodes < c->nnodes);
    assert_int_equal(s->noutputs, c->noutputs);
    assert_int_equal(s->nupdates, c->nupdates);
    rt_tensor *va = run_step(g, c), *vb = run_step(g, s);
    int compared = 0, bitwise = 0;
    for (int i = 0; i < c->noutputs; i++) {
        assert_string_equal(c->outputs[i].name, s->outputs[i].name);
        compared += compare_values(c->outputs[i].name, c, va, c->outputs[i].node, s, vb, s->outputs[i].node, &bitwise);
    }
    for (int i = 0; i < c->nupdates; i++) {
        assert_string_equal(c->updates[i].name, s->updates[i].name);
        compared += compare_values(c->updates[i].name, c, va, c->updates[i].node, s, vb, s->updates[i].node, &bitwise);
    }
    compared += compare_values("loss", c, va, c->loss, s, vb, s->loss, &bitwise);
    int apply = ir_find_output(s, OUT_APPLY);
    assert_true(apply >= 0 && *(const uint8_t *)vb[s->outputs[apply].node].data == 1); /* the update ran */
    print_message("%d outputs, updates and the loss compared, %d bit for bit\n", compared, bitwise);
    cpu_release_values(c, va);
    cpu_release_values(s, vb);
    al_free(va);
    al_free(vb);
    ir_graph_free(s);
    alloy_graph_free(g);
    al_arena_free(&simplify_arena);
}

static void test_a_second_simplify_of_the_training_step_changes_nothing(void **state)
{
    (void)state;
    alloy_graph *g = amp_training_block();
    ir_graph *once = simplified(before_fuse(g), true), *twice = simplified(once, true);
    char *a = ir_print_string(once), *b = ir_print_string(twice);
    assert_string_equal(a, b);
    al_free(a);
    al_free(b);
    ir_graph_free(twice);
    ir_graph_free(once);
    alloy_graph_free(g);
    al_arena_free(&simplify_arena);
}

/* ---- linear time ---- */

/* `blocks` blocks of h -> [constant 1, mul(h, 1), exp twice, add of the
 * two exps, cast to f64 and back to f32, constant 2 + constant 2]: every
 * rewrite fires in every block, 9 nodes a block. Returns simplify's time
 * in ms (the best of three) and checks how many nodes are left. */
static double simplify_chain_ms(int blocks)
{
    ir_graph *g = ir_graph_new("chain");
    ir_type t = {ALLOY_F32, 1, {4}}, w = {ALLOY_F64, 1, {4}}, scalar = {ALLOY_F32, 0, {0}};
    int h = add_leaf(g, IR_OP_input, &t, 0, "x")->id;
    for (int b = 0; b < blocks; b++) {
        int one = add_leaf(g, IR_OP_constant, &scalar, 1, NULL)->id;
        int m = add_node(g, IR_OP_mul, h, one, &t, NULL)->id;
        int e1 = add_node(g, IR_OP_exp, m, -1, &t, NULL)->id, e2 = add_node(g, IR_OP_exp, h, -1, &t, NULL)->id;
        int sum = add_node(g, IR_OP_add, e1, e2, &t, NULL)->id;
        int wide = add_node(g, IR_OP_cast, sum, -1, &w, NULL)->id;
        int two = add_leaf(g, IR_OP_constant, &scalar, 2, NULL)->id;
        add_node(g, IR_OP_add, two, two, &scalar, NULL); /* folds to 4 */
        h = add_node(g, IR_OP_cast, wide, -1, &t, NULL)->id;
    }
    ir_add_output(g, "y", h);
    double best = 1e300;
    for (int rep = 0; rep < 3; rep++) {
        ir_graph *c = ir_graph_clone(g);
        assert_non_null(c);
        double t0 = test_now_ms();
        assert_int_equal(pass_simplify(&c, &no_options), ALLOY_OK);
        best = fmin(best, test_now_ms() - t0);
        assert_int_equal(c->nnodes, 4 + 3 * blocks); /* x, 1, 2, 4; exp, add, the dead f64 cast per block */
        ir_graph_free(c);
    }
    ir_graph_free(g);
    return best;
}

static void test_simplify_takes_time_linear_in_the_graph(void **state)
{
    (void)state;
    double small = simplify_chain_ms(10000), large = simplify_chain_ms(40000);
    print_message("simplify: 90k nodes in %.1f ms, 360k nodes in %.1f ms\n", small, large);
    assert_true(large < 10 * small + 50); /* 4x the nodes: about 4x the time; quadratic would be 16x */
}

/* ---- allocation failures ---- */

static void test_simplify_survives_every_allocation_failure_leaving_the_graph_as_it_was(void **state)
{
    (void)state;
    alloy_set_allocator(NULL, NULL);
    static const char *const text = "graph all {\n"
                                    "  %x = input : f32[4]\n"
                                    "  %h = input : f16[4]\n"
                                    "  %one = constant {value=1.0} : f32[]\n"
                                    "  %two = constant {value=2.0} : f32[]\n"
                                    "  %3 = add(%one, %two) : f32[]\n"
                                    "  %4 = mul(%x, %3) : f32[4]\n"
                                    "  %5 = mul(%x, %3) : f32[4]\n"
                                    "  %6 = mul(%4, %one) : f32[4]\n"
                                    "  %7 = cast(%h) : f32[4]\n"
                                    "  %8 = cast(%7) : f16[4]\n"
                                    "  %y = add(%6, %5) : f32[4]\n"
                                    "  output \"y\" = %y\n"
                                    "  output \"h\" = %8\n"
                                    "}\n";
    ir_graph *g = test_parse_ir(text);
    ir_graph *want = simplified(g, false);
    char *expect = ir_print_string(want);
    bool done = false;
    int failures = 0;
    for (long budget = 0; !done && budget < 10000; budget++) {
        ir_graph *c = ir_graph_clone(g), *before = c;
        assert_non_null(c);
        alloy_set_allocator(test_budget_realloc, NULL);
        test_alloc_budget = budget;
        alloy_status st = pass_simplify(&c, &no_options);
        test_alloc_budget = -1;
        alloy_set_allocator(NULL, NULL);
        if (st) {
            assert_int_equal(st, ALLOY_ERR_OOM);
            assert_ptr_equal(c, before); /* the input graph is kept, with the error */
            assert_int_equal(c->status, ALLOY_ERR_OOM);
            assert_non_null(strstr(c->error, "simplify"));
            failures++;
        } else {
            char *got = ir_print_string(c);
            assert_string_equal(got, expect);
            al_free(got);
            done = true;
        }
        ir_graph_free(c);
    }
    assert_true(done);
    assert_true(failures > 10);
    al_free(expect);
    ir_graph_free(want);
    ir_graph_free(g);
    al_arena_free(&simplify_arena);
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        SIMPLIFY_TEST(test_simplifying_the_amp_training_step_of_the_transformer_block_removes_nodes_and_keeps_every_result),
        SIMPLIFY_TEST(test_a_second_simplify_of_the_training_step_changes_nothing),
        SIMPLIFY_TEST_PLAIN(test_simplify_takes_time_linear_in_the_graph),
        SIMPLIFY_TEST(test_simplify_survives_every_allocation_failure_leaving_the_graph_as_it_was),
    };
    return simplify_run_tests(tests, sizeof tests / sizeof tests[0]);
}
