/* simplify_support.h - what the simplify suites (test_simplify.c, test_simplify_step.c) share: the pass run on a copy, nodes added or the test fails. */
#ifndef ALLOY_TEST_SIMPLIFY_SUPPORT_H
#define ALLOY_TEST_SIMPLIFY_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "ir/ir.h"
#include "passes/pass.h"

struct CMUnitTest;

/* The running test's scratch; each test frees it at its end (before cmocka checks for leaks). */
extern al_arena simplify_arena;
/* cmocka teardown: forgets the scratch of a failed test, restores the C library's allocator. */
int simplify_teardown(void **state);
/* Tests with the leak-checked allocator, or (for timings) the C library's. */
#define SIMPLIFY_TEST(f) cmocka_unit_test_setup_teardown(f, test_checked_alloc, simplify_teardown)
#define SIMPLIFY_TEST_PLAIN(f) cmocka_unit_test_teardown(f, simplify_teardown)
/* Runs a simplify suite (group "simplify") with the pipeline's own simplify
 * and fuse off: these tests run simplify themselves on the unsimplified
 * compiled graph. */
int simplify_run_tests(const struct CMUnitTest *tests, size_t count);

/* Options with nothing set (no loss seed). */
extern const pass_options no_options;
/* A copy of g after simplify (and dce when asked), verified; the test fails on an error. */
ir_graph *simplified(const ir_graph *g, bool dce);
/* op(a) (b < 0) or op(a, b) with declared type t (may be NULL), named name; the test fails on an error. */
ir_node *add_node(ir_graph *g, int op, int a, int b, const ir_type *t, const char *name);
/* An input, a param/state (init zeros) or a constant filled with value, of type t. */
ir_node *add_leaf(ir_graph *g, int op, const ir_type *t, double value, const char *name);

#endif
