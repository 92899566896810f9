/* fuse_support.h - what the two fusion suites (test_fuse.c, test_fuse_kinds.c) share: setup, switches, compiled-graph lookups, a seeded generator. */
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

/* Fails the test with g's last error when st is not ALLOY_OK. */
void check(alloy_graph *g, alloy_status st, const char *what);
/* Fusion on or off (ALLOY_NO_FUSE) for the graphs compiled from now on. */
void fusion(bool on);
/* g compiled (the whole pipeline), or the test fails. */
const ir_graph *compiled(alloy_graph *g);
/* The id of the node called name (the test fails when there is none). */
int node_named(const ir_graph *c, const char *name);
/* The group of the node called name, or -1. */
int group_of(const ir_graph *c, const char *name);
/* How many groups c has (its highest group id + 1). */
int group_count(const ir_graph *c);
/* The members of group k in id order into ids (room for c->nnodes); their count. */
int group_members(const ir_graph *c, int k, int *ids);

/* splitmix64: set rng, then unit() gives [0, 1); fill draws n floats in [lo, hi). */
extern uint64_t rng;
double unit(void);
void fill(float *x, int64_t n, double lo, double hi);

#endif
