/* simplify_support.h - what the simplify suites (test_simplify.c, test_simplify_step.c) share: the pass run on a copy, nodes added or the test fails. */
#ifndef ALLOY_TEST_SIMPLIFY_SUPPORT_H
#define ALLOY_TEST_SIMPLIFY_SUPPORT_H

#include <stdbool.h>

#include "ir/ir.h"
#include "passes/pass.h"

/* Options with nothing set (no loss seed). */
extern const pass_options no_options;
/* A copy of g after simplify (and dce when asked), verified; the test fails on an error. */
ir_graph *simplified(const ir_graph *g, bool dce);
/* op(a) (b < 0) or op(a, b) with declared type t (may be NULL), named name; the test fails on an error. */
ir_node *add_node(ir_graph *g, int op, int a, int b, const ir_type *t, const char *name);
/* An input, a param/state (init zeros) or a constant filled with value, of type t. */
ir_node *add_leaf(ir_graph *g, int op, const ir_type *t, double value, const char *name);

#endif
