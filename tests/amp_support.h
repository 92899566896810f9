/* amp_support.h - what the AMP suites (test_amp.c, test_amp_lists.c, test_amp_models.c) share: setup that clears the list environment, graphs a failed test leaves behind, building shortcuts, and inspecting a compiled graph against an expected one written as a table. */
#ifndef ALLOY_TEST_AMP_SUPPORT_H
#define ALLOY_TEST_AMP_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloy/alloy.h"
#include "ir/ir.h"

struct CMUnitTest;

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- allocator and environment ---- */

/* Unsets every ALLOY_AMP_* list variable and ALLOY_AMP_LOG. */
void clear_env(void);
/* A new graph that amp_teardown frees if the test fails before free_graph. */
alloy_graph *new_graph(const char *name);
void free_graph(alloy_graph *g);
/* cmocka setup/teardown: a clean environment and the leak-checked
 * allocator; teardown also frees the graphs a failed test left open. */
int amp_setup(void **state);
int amp_teardown(void **state);
#define AMP_TEST(f) cmocka_unit_test_setup_teardown(f, amp_setup, amp_teardown)
/* Runs an AMP suite (group "amp") with the later optimizing passes off:
 * these tests check the amp pass's own output, and simplify and fuse
 * would fold casts of constants and group elementwise ops. */
int amp_run_tests(const struct CMUnitTest *tests, size_t count);

/* ---- building ---- */

alloy_tensor *named(alloy_graph *g, alloy_tensor *t, const char *name);
alloy_tensor *in_f32(alloy_graph *g, const char *name, int rank, const int64_t *dims);
alloy_tensor *param_f32(alloy_graph *g, const char *name, int rank, const int64_t *dims);
void output(alloy_graph *g, const char *name, alloy_tensor *t);
/* x -> exp -> transpose -> add(b) -> reshape -> matmul(w) = y, AMP f16 on. */
alloy_graph *deny_chain_graph(void);

/* ---- inspecting the compiled graph ---- */

/* Compiles g (through alloy_graph_amp_report) and returns the compiled IR. */
const ir_graph *compile_amp(alloy_graph *g, alloy_amp_report *rep);
/* Prints the compiled graph (for the log) and fails with the message. */
void fail_in(const ir_graph *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool is_inserted_cast(const ir_node *n);
/* How many operand slots, outputs and loss references name node id. */
int uses(const ir_graph *c, int id);
/* The inserted cast of node src to dtype, or -1. */
int cast_of(const ir_graph *c, int src, alloy_dtype dtype);
/* The checks every AMP result must pass (no cast of a cast, no duplicate,
 * no unused cast, no marker left); the number of inserted casts and, in
 * *weight, how many cast a parameter. Linear in the graph. */
int check_casts(const ir_graph *c, int *weight);

/* ---- expected graphs, as tables ---- */

/* One node of the compiled graph: its name (every non-inserted node of a
 * hand-built graph is named), dtype, colour, and operands. An operand "t"
 * is the node named t itself; "t>f16" is the inserted cast of t to f16. */
typedef struct want_node {
    const char *name;
    alloy_dtype dtype;
    ir_amp_class amp;
    const char *in[4];
} want_node;

/* One inserted cast: of which tensor, to which dtype, and how many
 * consumers (operand slots and outputs) share it. */
typedef struct want_cast {
    const char *src;
    alloy_dtype dtype;
    int uses;
} want_cast;

typedef struct want_output {
    const char *name;
    const char *ref; /* as want_node's operands */
} want_output;

typedef struct want {
    const want_node *nodes;
    int nnodes;
    const want_cast *casts;
    int ncasts;
    const want_output *outputs;
    int noutputs;
} want;

#define NODES(...) .nodes = (const want_node[]){__VA_ARGS__}, \
    .nnodes = COUNT(((const want_node[]){__VA_ARGS__}))
#define CASTS(...) .casts = (const want_cast[]){__VA_ARGS__}, \
    .ncasts = COUNT(((const want_cast[]){__VA_ARGS__}))
#define OUTPUTS(...) .outputs = (const want_output[]){__VA_ARGS__}, \
    .noutputs = COUNT(((const want_output[]){__VA_ARGS__}))

/* The node a reference names in c (see want_node), or -1. */
int resolve(const ir_graph *c, const char *ref);
const char *amp_str(int amp);
/* Compiles g and checks the result is exactly w (nodes, casts, outputs, the report's counts). */
void expect_graph(alloy_graph *g, const want *w);

#endif
