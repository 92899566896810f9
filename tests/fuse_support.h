/* fuse_support.h - what the fusion suites (test_fuse.c, test_fuse_block.c, test_fuse_kinds.c, test_fuse_conv.c, test_fuse_colsum.c, test_fuse_rowcast.c) share: setup, switches, compiled-graph lookups, the legality of every group, random floats. */
#ifndef ALLOY_TEST_FUSE_SUPPORT_H
#define ALLOY_TEST_FUSE_SUPPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "alloy/alloy.h"
#include "ir/ir.h"

/* cmocka setup/teardown: leak-checked allocator, fusion on, default threads
 * (teardown: the C library's allocator, the switches cleared again). */
int fuse_setup(void **state);
int fuse_teardown(void **state);
/* A cmocka test entry with that setup and teardown. */
#define FUSE_TEST(f) cmocka_unit_test_setup_teardown(f, fuse_setup, fuse_teardown)

/* Fusion on or off (ALLOY_NO_FUSE) for the graphs compiled from now on. */
void fusion(bool on);
/* g compiled (the whole pipeline), or the test fails. */
const ir_graph *compiled(alloy_graph *g);
/* The id of the node called name (the test fails when there is none). */
int node_named(const ir_graph *c, const char *name);
/* The first node of op `op` (the test fails when there is none). */
int first_node_of(const ir_graph *c, ir_op op);
/* The step of nodes[0] in g's schedule, which must be a row step holding
 * every node of nodes[0..n); else the test fails, naming them as the
 * printf-style fmt says, after printing the groups and the schedule. */
int expect_one_row_step(const alloy_graph *g, const int *nodes, int n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The group of the node called name, or -1. */
int group_of(const ir_graph *c, const char *name);
/* How many groups c has (its highest group id + 1). */
int group_count(const ir_graph *c);
/* The members of group k in id order into ids (room for c->nnodes); their count. */
int group_members(const ir_graph *c, int k, int *ids);

/* How many members group k has (0 for k < 0). */
int group_size(const ir_graph *c, int k);
/* The node of the update / output called name (the test fails when there is none). */
int update_node(const ir_graph *c, const char *name);
int output_node(const ir_graph *c, const char *name);
/* Whether n computes in f64 (some operand is f64 or an integer). */
bool computes_wide(const ir_graph *c, const ir_node *n);
/* Every guarantee pass_fuse states, checked from scratch (ids dense and
 * numbered by first member, >= 2 members, each kind's members and shapes,
 * every edge into or out of a group from an earlier position to a later one). */
void expect_groups_legal(const ir_graph *c);

/* n floats uniform in [lo, hi) from support's generator (test_rng). */
void fill(float *x, int64_t n, double lo, double hi);

#endif
