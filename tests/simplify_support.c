/* simplify_support.c - what the simplify suites share (simplify_support.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "simplify_support.h"

#include "support.h"

const pass_options no_options = {.loss_seed = -1};

al_arena simplify_arena;

/* A test frees the scratch at its end; one that failed half way left its
 * blocks to cmocka, which freed them after the test: forget them here. */
int simplify_teardown(void **state)
{
    (void)state;
    memset(&simplify_arena, 0, sizeof simplify_arena);
    alloy_set_allocator(NULL, NULL);
    return 0;
}

int simplify_run_tests(const struct CMUnitTest *tests, size_t count)
{
    setenv("ALLOY_DISABLE_PASSES", "simplify,fuse", 1);
    return _cmocka_run_group_tests("simplify", tests, count, NULL, NULL);
}

/* A copy of g after simplify (and dce when asked), verified. */
ir_graph *simplified(const ir_graph *g, bool dce)
{
    ir_graph *c = ir_graph_clone(g);
    assert_non_null(c);
    alloy_status st = pass_simplify(&c, &no_options);
    if (!st && dce) st = pass_dce(&c, &no_options);
    if (!st) st = ir_verify(c);
    if (st) fail_msg("simplify: %s", c->error);
    return c;
}

ir_node *add_node(ir_graph *g, int op, int a, int b, const ir_type *t, const char *name)
{
    int in[2] = {a, b};
    ir_node *n = ir_add_node(g, op, b < 0 ? 1 : 2, in, 0, NULL, t, name);
    if (!n) fail_msg("ir_add_node: %s", g->error);
    return n;
}

ir_node *add_leaf(ir_graph *g, int op, const ir_type *t, double value, const char *name)
{
    ir_attr a[2] = {op == IR_OP_constant ? ir_a_float("value", value) : ir_a_str("init", "zeros")};
    ir_node *n = ir_add_node(g, op, 0, NULL, op == IR_OP_input ? 0 : 1, a, t, name);
    if (!n) fail_msg("ir_add_node: %s", g->error);
    return n;
}
