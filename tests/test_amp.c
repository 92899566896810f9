/* test_amp.c - enable_amp: the colouring rules on hand-built graphs, list edits (API and environment),
 * markers, the log, the MLP and transformer block (casts, numerics against f32), overflow in deny ops,
 * IR round trip, table growth and linear time. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloy/alloy.h"
#include "ir/ir.h"
#include "models.h"
#include "passes/pass.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- allocator and environment ---- */

static const char *const env_vars[] = {
    "ALLOY_AMP_ALLOWLIST_ADD", "ALLOY_AMP_ALLOWLIST_REMOVE", "ALLOY_AMP_DENYLIST_ADD",
    "ALLOY_AMP_DENYLIST_REMOVE", "ALLOY_AMP_INFERLIST_ADD",  "ALLOY_AMP_INFERLIST_REMOVE",
    "ALLOY_AMP_CLEARLIST_ADD",   "ALLOY_AMP_CLEARLIST_REMOVE", "ALLOY_AMP_LOG",
};

static void clear_env(void)
{
    for (int i = 0; i < COUNT(env_vars); i++) unsetenv(env_vars[i]);
}

/* The graphs a test has open, so that teardown frees those a failed
 * assertion left behind (and the failure is not followed by leak reports). */
static alloy_graph *open_graphs[8];

static alloy_graph *new_graph(const char *name)
{
    alloy_graph *g = alloy_graph_new(name);
    assert_non_null(g);
    for (int i = 0; i < COUNT(open_graphs); i++)
        if (!open_graphs[i]) {
            open_graphs[i] = g;
            return g;
        }
    fail_msg("more than %d graphs open", COUNT(open_graphs));
    return NULL;
}

static void free_graph(alloy_graph *g)
{
    for (int i = 0; i < COUNT(open_graphs); i++)
        if (open_graphs[i] == g) open_graphs[i] = NULL;
    alloy_graph_free(g);
}

static int setup(void **state)
{
    (void)state;
    clear_env();
    alloy_set_allocator(test_cmocka_realloc, NULL);
    return 0;
}

/* Also runs after a failed test, so a failing test never leaves its list
 * edits in the environment of the next one. */
static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < COUNT(open_graphs); i++) free_graph(open_graphs[i]);
    alloy_set_allocator(NULL, NULL);
    clear_env();
    return 0;
}

/* ---- building ---- */

static alloy_tensor *named(alloy_graph *g, alloy_tensor *t, const char *name)
{
    alloy_tensor *r = alloy_set_name(g, t, name);
    if (!r) fail_msg("naming '%s': %s", name, alloy_last_error(g));
    return r;
}

static alloy_tensor *in_f32(alloy_graph *g, const char *name, int rank, const int64_t *dims)
{
    return alloy_input(g, name, ALLOY_F32, rank, dims);
}

static alloy_tensor *param_f32(alloy_graph *g, const char *name, int rank, const int64_t *dims)
{
    return alloy_param(g, name, ALLOY_F32, rank, dims, alloy_init_normal(0.1));
}

static void output(alloy_graph *g, const char *name, alloy_tensor *t)
{
    alloy_status st = alloy_output(g, name, t);
    if (st) fail_msg("output '%s': %s", name, alloy_last_error(g));
}

/* ---- inspecting the compiled graph ---- */

/* Compiles g (through alloy_graph_amp_report) and returns the compiled IR. */
static const ir_graph *compile(alloy_graph *g, alloy_amp_report *rep)
{
    alloy_amp_report local;
    alloy_status st = alloy_graph_amp_report(g, rep ? rep : &local);
    if (st) fail_msg("compile failed: %s: %s", alloy_status_name(st), alloy_last_error(g));
    assert_non_null(g->compiled);
    return g->compiled;
}

static void fail_in(const ir_graph *c, const char *fmt, ...) AL_PRINTF(2, 3);
/* Prints the compiled graph (for the log) and fails with the message. */
static void fail_in(const ir_graph *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "compiled graph:\n");
    ir_print(c, stderr);
    fail_msg("%s", msg);
}

static bool is_inserted_cast(const ir_node *n)
{
    return (n->flags & IR_NODE_INSERTED) && n->op == IR_OP_cast;
}

/* How many operand slots, outputs and loss references name node id. */
static int uses(const ir_graph *c, int id)
{
    int k = 0;
    for (int i = 0; i < c->nnodes; i++)
        for (int j = 0; j < c->nodes[i]->nin; j++) k += c->nodes[i]->in[j] == id;
    for (int i = 0; i < c->noutputs; i++) k += c->outputs[i].node == id;
    return k + (c->loss == id);
}

/* The inserted cast of node src to dtype, or -1. */
static int cast_of(const ir_graph *c, int src, alloy_dtype dtype)
{
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        if (is_inserted_cast(n) && n->in[0] == src && n->type.dtype == dtype) return i;
    }
    return -1;
}

/* The checks every AMP result must pass, whatever the graph: every node the
 * pass inserted is a cast (one operand, same shape, another dtype) that is
 * used; no cast takes a cast (never cast(cast(x))); no two casts convert the
 * same tensor to the same dtype; no marker survives. Returns the number of
 * inserted casts and, in *weight, how many cast a parameter. Linear in the
 * graph (the 100k-node test uses it): users are counted in one sweep, and
 * every pair of casts is compared through a table indexed by (source,
 * dtype), where two casts collide exactly when the pair is a duplicate. */
static int check_casts(const ir_graph *c, int *weight)
{
    int n = c->nnodes, casts = 0, w = 0;
    int *users = calloc((size_t)n + 1, sizeof(int));
    int *first = malloc(sizeof(int) * ((size_t)n * ALLOY_DTYPE_COUNT + 1));
    assert_true(users && first);
    for (int i = 0; i < n * ALLOY_DTYPE_COUNT; i++) first[i] = -1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c->nodes[i]->nin; j++) users[c->nodes[i]->in[j]]++;
    for (int i = 0; i < c->noutputs; i++) users[c->outputs[i].node]++;
    if (c->loss >= 0) users[c->loss]++;
    char msg[160] = "";
    for (int i = 0; i < n && !*msg; i++) {
        const ir_node *nd = c->nodes[i];
        if (nd->op == IR_OP_amp_allow || nd->op == IR_OP_amp_deny) al_fmt(msg, sizeof msg, "marker %%%d survived", i);
        if (!(nd->flags & IR_NODE_INSERTED) || *msg) continue;
        if (nd->op != IR_OP_cast || nd->nin != 1) {
            al_fmt(msg, sizeof msg, "inserted node %%%d is not a cast", i);
            continue;
        }
        const ir_node *src = c->nodes[nd->in[0]];
        int *slot = &first[(size_t)nd->in[0] * ALLOY_DTYPE_COUNT + nd->type.dtype];
        if (src->op == IR_OP_cast) al_fmt(msg, sizeof msg, "%%%d casts the cast %%%d", i, src->id);
        else if (src->type.dtype == nd->type.dtype) al_fmt(msg, sizeof msg, "%%%d casts to the dtype it has", i);
        else if (src->type.rank != nd->type.rank ||
                 memcmp(src->type.dims, nd->type.dims, sizeof(int64_t) * (size_t)nd->type.rank) != 0)
            al_fmt(msg, sizeof msg, "%%%d changes the shape", i);
        else if (users[i] == 0) al_fmt(msg, sizeof msg, "cast %%%d is unused", i);
        else if (*slot >= 0)
            al_fmt(msg, sizeof msg, "%%%d and %%%d both cast %%%d to %s", *slot, i, nd->in[0],
                   alloy_dtype_name(nd->type.dtype));
        *slot = i;
        casts++;
        w += src->op == IR_OP_param;
    }
    free(users);
    free(first);
    if (*msg) fail_in(c, "%s", msg);
    if (weight) *weight = w;
    return casts;
}

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
static int resolve(const ir_graph *c, const char *ref)
{
    char name[64];
    const char *gt = strchr(ref, '>');
    size_t len = gt ? (size_t)(gt - ref) : strlen(ref);
    assert_true(len < sizeof name);
    memcpy(name, ref, len);
    name[len] = '\0';
    int id = ir_find_name(c, name);
    if (id < 0 || !gt) return id;
    alloy_dtype dt;
    if (alloy_dtype_from_name(gt + 1, &dt) != 0) fail_msg("bad dtype in reference '%s'", ref);
    return cast_of(c, id, dt);
}

static const char *amp_str(int amp)
{
    static const char *names[] = {"none", "allow", "deny", "infer", "clear"};
    return amp >= 0 && amp <= AMP_CLEAR ? names[amp] : "?";
}

/* Compiles g and checks the result is exactly w: every node (named, with its
 * dtype, colour and operands), every inserted cast (source, dtype, number of
 * users) and nothing else, the outputs, and the report's counts. */
static void expect_graph(alloy_graph *g, const want *w)
{
    alloy_amp_report rep;
    const ir_graph *c = compile(g, &rep);
    for (int k = 0; k < w->nnodes; k++) {
        const want_node *e = &w->nodes[k];
        int id = ir_find_name(c, e->name);
        if (id < 0) fail_in(c, "no node named '%s'", e->name);
        const ir_node *n = c->nodes[id];
        if (n->flags & IR_NODE_INSERTED) fail_in(c, "'%s' is marked inserted", e->name);
        if (n->type.dtype != e->dtype)
            fail_in(c, "'%s' is %s, expected %s", e->name, alloy_dtype_name(n->type.dtype),
                    alloy_dtype_name(e->dtype));
        if (n->amp != e->amp)
            fail_in(c, "'%s' is coloured %s, expected %s", e->name, amp_str(n->amp), amp_str(e->amp));
        int nin = 0;
        while (nin < 4 && e->in[nin]) nin++;
        if (n->nin != nin) fail_in(c, "'%s' has %d operands, expected %d", e->name, n->nin, nin);
        for (int j = 0; j < nin; j++) {
            int want_id = resolve(c, e->in[j]);
            if (want_id < 0) fail_in(c, "operand '%s' of '%s' does not exist", e->in[j], e->name);
            if (n->in[j] != want_id)
                fail_in(c, "operand %d of '%s' is %%%d, expected %s (%%%d)", j, e->name, n->in[j], e->in[j],
                        want_id);
        }
    }
    int plain = 0;
    for (int i = 0; i < c->nnodes; i++) plain += !(c->nodes[i]->flags & IR_NODE_INSERTED);
    if (plain != w->nnodes) fail_in(c, "%d nodes besides casts, expected %d", plain, w->nnodes);

    int weight = 0, want_weight = 0;
    int casts = check_casts(c, &weight);
    for (int k = 0; k < w->ncasts; k++) {
        const want_cast *e = &w->casts[k];
        int src = ir_find_name(c, e->src);
        if (src < 0) fail_in(c, "no node named '%s'", e->src);
        int id = cast_of(c, src, e->dtype);
        if (id < 0) fail_in(c, "no cast of '%s' to %s", e->src, alloy_dtype_name(e->dtype));
        if (uses(c, id) != e->uses)
            fail_in(c, "the cast of '%s' to %s has %d users, expected %d", e->src, alloy_dtype_name(e->dtype),
                    uses(c, id), e->uses);
        want_weight += c->nodes[src]->op == IR_OP_param;
    }
    if (casts != w->ncasts) fail_in(c, "%d casts inserted, expected %d", casts, w->ncasts);
    assert_int_equal(weight, want_weight);
    if (rep.casts != w->ncasts || rep.weight_casts != want_weight)
        fail_in(c, "alloy_graph_amp_report counts %d casts (%d weight casts); the compiled graph has %d (%d)",
                rep.casts, rep.weight_casts, w->ncasts, want_weight);

    if (c->noutputs != w->noutputs) fail_in(c, "%d outputs, expected %d", c->noutputs, w->noutputs);
    for (int k = 0; k < w->noutputs; k++) {
        const want_output *e = &w->outputs[k];
        int found = -1;
        for (int i = 0; i < c->noutputs; i++)
            if (strcmp(c->outputs[i].name, e->name) == 0) found = c->outputs[i].node;
        int want_id = resolve(c, e->ref);
        if (found < 0 || found != want_id)
            fail_in(c, "output '%s' is %%%d, expected %s (%%%d)", e->name, found, e->ref, want_id);
    }
}

/* ==== colouring rules on hand-built graphs ==== */

/* x -> exp -> transpose -> add(b) -> reshape -> matmul(w) = y */
static alloy_graph *deny_chain_graph(void)
{
    alloy_graph *g = new_graph("deny_chain");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(4, 2));
    alloy_tensor *b = param_f32(g, "b", 1, DIMS(4));
    alloy_tensor *w = param_f32(g, "w", 2, DIMS(2, 3));
    alloy_tensor *e = named(g, alloy_exp(g, x), "e");
    alloy_tensor *r = named(g, alloy_transpose(g, e, DIMS(1, 0)), "r");
    alloy_tensor *a = named(g, alloy_add(g, r, b), "a");
    alloy_tensor *s = named(g, alloy_reshape(g, a, 2, DIMS(4, 2)), "s");
    alloy_tensor *m = named(g, alloy_matmul(g, s, w, false, false), "m");
    output(g, "y", m);
    alloy_graph_enable_amp(g, ALLOY_F16);
    return g;
}

static void test_deny_propagates_through_clear_and_infer_to_the_consumers_of_exp(void **state)
{
    (void)state;
    alloy_graph *g = deny_chain_graph();
    /* e: exp is on the deny list -> deny, f32.
     * r: a clear op whose consumer a is infer, so r is in U (clear upstream
     *    of deny/infer); it consumes the deny e -> deny, f32.
     * a: infer, so in U; it consumes the deny r -> deny, f32.
     * s: clear, but its only consumer is the allow matmul: not in U, so deny
     *    stops before it; step 5 spreads allow from m back into s -> f16.
     * m: allow -> f16.
     * Casts: a -> f16 (for s), w -> f16 (weight), m -> f32 (output y keeps
     * its declared f32): 3, 1 of them a weight cast. x and b reach the f32
     * nodes uncast. */
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"b", ALLOY_F32, AMP_NONE, {0}},
              {"w", ALLOY_F32, AMP_NONE, {0}}, {"e", ALLOY_F32, AMP_DENY, {"x"}},
              {"r", ALLOY_F32, AMP_DENY, {"e"}}, {"a", ALLOY_F32, AMP_DENY, {"r", "b"}},
              {"s", ALLOY_F16, AMP_ALLOW, {"a>f16"}}, {"m", ALLOY_F16, AMP_ALLOW, {"s", "w>f16"}}),
        CASTS({"a", ALLOY_F16, 1}, {"w", ALLOY_F16, 1}, {"m", ALLOY_F32, 1}),
        OUTPUTS({"y", "m>f32"}),
    });
    free_graph(g);
}

static void test_an_add_and_a_relu_sandwiched_between_two_matmuls_run_in_f16(void **state)
{
    (void)state;
    /* x -> matmul(w1) -> add(b) -> relu -> matmul(w2) = y */
    alloy_graph *g = new_graph("sandwich");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 4));
    alloy_tensor *w1 = param_f32(g, "w1", 2, DIMS(4, 8));
    alloy_tensor *b = param_f32(g, "b", 1, DIMS(8));
    alloy_tensor *w2 = param_f32(g, "w2", 2, DIMS(8, 3));
    alloy_tensor *m1 = named(g, alloy_matmul(g, x, w1, false, false), "m1");
    alloy_tensor *a = named(g, alloy_add(g, m1, b), "a");
    alloy_tensor *h = named(g, alloy_relu(g, a), "h");
    output(g, "y", named(g, alloy_matmul(g, h, w2, false, false), "m2"));
    alloy_graph_enable_amp(g, ALLOY_F16);
    /* No deny node and no loss: nothing is deny. a (infer) and h (clear) are
     * reachable forward from m1 and reach m2 backwards -> allow, f16.
     * Casts: x, w1, b, w2 to f16 (w1, b, w2 are weights) and m2 back to f32
     * for y: 5, 3 weight casts. Nothing between m1, a, h and m2. */
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w1", ALLOY_F32, AMP_NONE, {0}},
              {"b", ALLOY_F32, AMP_NONE, {0}}, {"w2", ALLOY_F32, AMP_NONE, {0}},
              {"m1", ALLOY_F16, AMP_ALLOW, {"x>f16", "w1>f16"}}, {"a", ALLOY_F16, AMP_ALLOW, {"m1", "b>f16"}},
              {"h", ALLOY_F16, AMP_ALLOW, {"a"}}, {"m2", ALLOY_F16, AMP_ALLOW, {"h", "w2>f16"}}),
        CASTS({"x", ALLOY_F16, 1}, {"w1", ALLOY_F16, 1}, {"b", ALLOY_F16, 1}, {"w2", ALLOY_F16, 1},
              {"m2", ALLOY_F32, 1}),
        OUTPUTS({"y", "m2>f32"}),
    });
    free_graph(g);
}

static void test_a_bias_add_that_is_a_graph_output_runs_in_f16_and_is_cast_back_once(void **state)
{
    (void)state;
    /* x -> matmul(w) -> add(b), which is both outputs "y" and "y_again" */
    alloy_graph *g = new_graph("sink");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 4));
    alloy_tensor *w = param_f32(g, "w", 2, DIMS(4, 3));
    alloy_tensor *b = param_f32(g, "b", 1, DIMS(3));
    alloy_tensor *m = named(g, alloy_matmul(g, x, w, false, false), "m");
    alloy_tensor *a = named(g, alloy_add(g, m, b), "a");
    output(g, "y", a);
    output(g, "y_again", a);
    alloy_graph_enable_amp(g, ALLOY_F16);
    /* a is infer, downstream of m, and a graph output: OneFlow's rule counts
     * the output as an allow end of the sandwich -> allow, f16. Both outputs
     * keep the declared f32 through one shared cast of a.
     * Casts: x, w, b to f16 (2 weights) and a to f32 (2 users): 4. */
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w", ALLOY_F32, AMP_NONE, {0}},
              {"b", ALLOY_F32, AMP_NONE, {0}}, {"m", ALLOY_F16, AMP_ALLOW, {"x>f16", "w>f16"}},
              {"a", ALLOY_F16, AMP_ALLOW, {"m", "b>f16"}}),
        CASTS({"x", ALLOY_F16, 1}, {"w", ALLOY_F16, 1}, {"b", ALLOY_F16, 1}, {"a", ALLOY_F32, 2}),
        OUTPUTS({"y", "a>f32"}, {"y_again", "a>f32"}),
    });
    free_graph(g);
}

static void test_allow_spreads_through_reshape_and_transpose_before_and_after_a_matmul(void **state)
{
    (void)state;
    /* x -> reshape -> transpose -> matmul(w) -> transpose -> reshape -> exp = y,
     * and x -> neg = z (a clear op with no low-precision neighbour). */
    alloy_graph *g = new_graph("clear");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(4, 2));
    alloy_tensor *w = param_f32(g, "w", 2, DIMS(2, 3));
    alloy_tensor *r1 = named(g, alloy_reshape(g, x, 2, DIMS(2, 4)), "r1");
    alloy_tensor *t1 = named(g, alloy_transpose(g, r1, DIMS(1, 0)), "t1");
    alloy_tensor *m = named(g, alloy_matmul(g, t1, w, false, false), "m");
    alloy_tensor *t2 = named(g, alloy_transpose(g, m, DIMS(1, 0)), "t2");
    alloy_tensor *r2 = named(g, alloy_reshape(g, t2, 1, DIMS(12)), "r2");
    output(g, "y", named(g, alloy_exp(g, r2), "e"));
    output(g, "z", named(g, alloy_neg(g, x), "n"));
    alloy_graph_enable_amp(g, ALLOY_F16);
    /* r1, t1: clear, feeding only m; step 5 spreads allow backwards from m
     *   through t1 to r1 (x is an input: never coloured, it gets a cast).
     * t2, r2: clear and upstream of the deny exp (so in U), but deny spreads
     *   forward only and exp has no consumers: not deny. Not sandwiched
     *   (no allow end after them). Step 5 spreads allow forward from m
     *   through t2 and r2, stopping at exp -> f16; the cast moves to exp.
     * e: deny, f32. n: clear, its only neighbour is the input x -> stays f32,
     *   coloured clear, and takes x uncast.
     * Casts: x -> f16 (r1 only), w -> f16 (weight), r2 -> f32 (for e): 3. */
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w", ALLOY_F32, AMP_NONE, {0}},
              {"r1", ALLOY_F16, AMP_ALLOW, {"x>f16"}}, {"t1", ALLOY_F16, AMP_ALLOW, {"r1"}},
              {"m", ALLOY_F16, AMP_ALLOW, {"t1", "w>f16"}}, {"t2", ALLOY_F16, AMP_ALLOW, {"m"}},
              {"r2", ALLOY_F16, AMP_ALLOW, {"t2"}}, {"e", ALLOY_F32, AMP_DENY, {"r2>f32"}},
              {"n", ALLOY_F32, AMP_CLEAR, {"x"}}),
        CASTS({"x", ALLOY_F16, 1}, {"w", ALLOY_F16, 1}, {"r2", ALLOY_F32, 1}),
        OUTPUTS({"y", "e"}, {"z", "n"}),
    });
    free_graph(g);
}

static void test_amp_allow_pins_a_tensor_to_f16_and_leaves_no_marker_in_the_compiled_graph(void **state)
{
    (void)state;
    /* x -> mul(two) -> amp_allow -> tanh = y */
    alloy_graph *g = new_graph("pin_allow");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 4));
    alloy_tensor *two = named(g, alloy_scalar(g, ALLOY_F32, 2.0), "two");
    alloy_tensor *a = named(g, alloy_mul(g, x, two), "a");
    alloy_tensor *p = named(g, alloy_amp_allow(g, a), "p");
    output(g, "y", named(g, alloy_tanh(g, p), "h"));
    alloy_graph_enable_amp(g, ALLOY_F16);
    /* Without the marker there is no allow node and everything stays f32.
     * p is an allow node: a (infer, upstream of it) is not downstream of any
     * allow node -> f32, coloured infer. h (infer) is downstream of p and a
     * graph output -> allow, f16. The marker becomes the cast a -> f16.
     * Casts: a -> f16, h -> f32 (output): 2, no weights. */
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"two", ALLOY_F32, AMP_NONE, {0}},
              {"a", ALLOY_F32, AMP_INFER, {"x", "two"}}, {"h", ALLOY_F16, AMP_ALLOW, {"a>f16"}}),
        CASTS({"a", ALLOY_F16, 1}, {"h", ALLOY_F32, 1}),
        OUTPUTS({"y", "h>f32"}),
    });
    assert_int_equal(ir_find_name(g->compiled, "p"), -1); /* the marker's name went with it */
    free_graph(g);
}

static void test_amp_deny_pins_a_tensor_to_f32_between_two_matmuls(void **state)
{
    (void)state;
    /* x -> matmul(w1) -> amp_deny -> add(b) -> matmul(w2) = y */
    alloy_graph *g = new_graph("pin_deny");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 4));
    alloy_tensor *w1 = param_f32(g, "w1", 2, DIMS(4, 8));
    alloy_tensor *b = param_f32(g, "b", 1, DIMS(8));
    alloy_tensor *w2 = param_f32(g, "w2", 2, DIMS(8, 3));
    alloy_tensor *m1 = named(g, alloy_matmul(g, x, w1, false, false), "m1");
    alloy_tensor *d = alloy_amp_deny(g, m1);
    alloy_tensor *a = named(g, alloy_add(g, d, b), "a");
    output(g, "y", named(g, alloy_matmul(g, a, w2, false, false), "m2"));
    alloy_graph_enable_amp(g, ALLOY_F16);
    /* Without the marker a is sandwiched and runs in f16 (see the sandwich
     * test). The marker is a deny node; a is infer (in U) and consumes it
     * -> deny, f32. The marker becomes the cast m1 -> f32.
     * Casts: x, w1, w2 -> f16 (2 weights), m1 -> f32 (the marker),
     * a -> f16 (for m2), m2 -> f32 (output): 6. b stays f32, uncast. */
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w1", ALLOY_F32, AMP_NONE, {0}},
              {"b", ALLOY_F32, AMP_NONE, {0}}, {"w2", ALLOY_F32, AMP_NONE, {0}},
              {"m1", ALLOY_F16, AMP_ALLOW, {"x>f16", "w1>f16"}}, {"a", ALLOY_F32, AMP_DENY, {"m1>f32", "b"}},
              {"m2", ALLOY_F16, AMP_ALLOW, {"a>f16", "w2>f16"}}),
        CASTS({"x", ALLOY_F16, 1}, {"w1", ALLOY_F16, 1}, {"m1", ALLOY_F32, 1}, {"a", ALLOY_F16, 1},
              {"w2", ALLOY_F16, 1}, {"m2", ALLOY_F32, 1}),
        OUTPUTS({"y", "m2>f32"}),
    });
    free_graph(g);
}

static void test_an_amp_deny_marker_whose_consumer_runs_in_f16_leaves_no_cast_behind(void **state)
{
    (void)state;
    /* x -> matmul(w1) -> amp_deny -> relu -> matmul(w2) = y */
    alloy_graph *g = new_graph("pin_deny_clear");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 4));
    alloy_tensor *w1 = param_f32(g, "w1", 2, DIMS(4, 8));
    alloy_tensor *w2 = param_f32(g, "w2", 2, DIMS(8, 3));
    alloy_tensor *m1 = named(g, alloy_matmul(g, x, w1, false, false), "m1");
    alloy_tensor *h = named(g, alloy_relu(g, alloy_amp_deny(g, m1)), "h");
    output(g, "y", named(g, alloy_matmul(g, h, w2, false, false), "m2"));
    alloy_graph_enable_amp(g, ALLOY_F16);
    /* The marker is a deny node, but h is a clear op whose only consumer is
     * the allow m2: h is not in U (not upstream of a deny/infer op), so deny
     * does not reach it, and step 5 spreads allow from m2 into h -> f16.
     * h needs the marker's value in f16: the marker was m1 cast to f32, so
     * h gets m1 itself (never cast(cast(m1))), and the marker leaves nothing
     * ("replaced by a cast (or nothing)", docs/amp.md).
     * Casts: x, w1, w2 -> f16 (2 weights), m2 -> f32 (output): 4, and the
     * report counts the casts the compiled graph has, not a dead one. */
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w1", ALLOY_F32, AMP_NONE, {0}},
              {"w2", ALLOY_F32, AMP_NONE, {0}}, {"m1", ALLOY_F16, AMP_ALLOW, {"x>f16", "w1>f16"}},
              {"h", ALLOY_F16, AMP_ALLOW, {"m1"}}, {"m2", ALLOY_F16, AMP_ALLOW, {"h", "w2>f16"}}),
        CASTS({"x", ALLOY_F16, 1}, {"w1", ALLOY_F16, 1}, {"w2", ALLOY_F16, 1}, {"m2", ALLOY_F32, 1}),
        OUTPUTS({"y", "m2>f32"}),
    });
    free_graph(g);
}

static void test_a_consumer_needing_f32_of_a_tensor_cast_to_f16_gets_the_original_tensor(void **state)
{
    (void)state;
    /* p = amp_allow(x); m = matmul(p, w); e = exp(p); outputs m, e and p */
    alloy_graph *g = new_graph("no_double_cast");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 4));
    alloy_tensor *w = param_f32(g, "w", 2, DIMS(4, 3));
    alloy_tensor *p = alloy_amp_allow(g, x);
    output(g, "m", named(g, alloy_matmul(g, p, w, false, false), "m"));
    output(g, "e", named(g, alloy_exp(g, p), "e"));
    output(g, "p", p);
    alloy_graph_enable_amp(g, ALLOY_F16);
    /* p is the cast x -> f16, which m uses. exp (deny) needs p in f32: that
     * is x itself, not cast(cast(x)). The output "p" is declared f32: x too.
     * Casts: x -> f16, w -> f16 (weight), m -> f32 (output): 3. */
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w", ALLOY_F32, AMP_NONE, {0}},
              {"m", ALLOY_F16, AMP_ALLOW, {"x>f16", "w>f16"}}, {"e", ALLOY_F32, AMP_DENY, {"x"}}),
        CASTS({"x", ALLOY_F16, 1}, {"w", ALLOY_F16, 1}, {"m", ALLOY_F32, 1}),
        OUTPUTS({"m", "m>f32"}, {"e", "e"}, {"p", "x"}),
    });
    free_graph(g);
}

static void test_tensors_already_in_the_dtype_their_consumer_runs_in_get_no_cast(void **state)
{
    (void)state;
    /* x -> matmul(w1) -> relu -> matmul(w2) -> relu = y, and x -> matmul(w3) = y3
     * (x shared by two matmuls); an all-f16 branch xh -> matmul(wh) = yh. */
    alloy_graph *g = new_graph("agree");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 4));
    alloy_tensor *w1 = param_f32(g, "w1", 2, DIMS(4, 8));
    alloy_tensor *w2 = param_f32(g, "w2", 2, DIMS(8, 3));
    alloy_tensor *w3 = param_f32(g, "w3", 2, DIMS(4, 5));
    alloy_tensor *xh = alloy_input(g, "xh", ALLOY_F16, 2, DIMS(2, 4));
    alloy_tensor *wh = alloy_param(g, "wh", ALLOY_F16, 2, DIMS(4, 3), alloy_init_normal(0.1));
    alloy_tensor *m1 = named(g, alloy_matmul(g, x, w1, false, false), "m1");
    alloy_tensor *h = named(g, alloy_relu(g, m1), "h");
    alloy_tensor *m2 = named(g, alloy_matmul(g, h, w2, false, false), "m2");
    output(g, "y", named(g, alloy_relu(g, m2), "h2"));
    output(g, "y3", named(g, alloy_matmul(g, x, w3, false, false), "m3"));
    output(g, "yh", named(g, alloy_matmul(g, xh, wh, false, false), "mh"));
    alloy_graph_enable_amp(g, ALLOY_F16);
    /* h is sandwiched, h2 is downstream of m2 and an output: all of m1, h,
     * m2, h2, m3 run in f16 and pass f16 along with no cast between them.
     * x is cast once, shared by m1 and m3. mh is already f16 (not an f32
     * node, never coloured): no cast in or out.
     * Casts: x (2 users), w1, w2, w3 to f16; h2 and m3 to f32: 6, 3 weights. */
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w1", ALLOY_F32, AMP_NONE, {0}},
              {"w2", ALLOY_F32, AMP_NONE, {0}}, {"w3", ALLOY_F32, AMP_NONE, {0}},
              {"xh", ALLOY_F16, AMP_NONE, {0}}, {"wh", ALLOY_F16, AMP_NONE, {0}},
              {"m1", ALLOY_F16, AMP_ALLOW, {"x>f16", "w1>f16"}}, {"h", ALLOY_F16, AMP_ALLOW, {"m1"}},
              {"m2", ALLOY_F16, AMP_ALLOW, {"h", "w2>f16"}}, {"h2", ALLOY_F16, AMP_ALLOW, {"m2"}},
              {"m3", ALLOY_F16, AMP_ALLOW, {"x>f16", "w3>f16"}}, {"mh", ALLOY_F16, AMP_NONE, {"xh", "wh"}}),
        CASTS({"x", ALLOY_F16, 2}, {"w1", ALLOY_F16, 1}, {"w2", ALLOY_F16, 1}, {"w3", ALLOY_F16, 1},
              {"h2", ALLOY_F32, 1}, {"m3", ALLOY_F32, 1}),
        OUTPUTS({"y", "h2>f32"}, {"y3", "m3>f32"}, {"yh", "mh"}),
    });
    alloy_amp_report rep;
    assert_int_equal(alloy_graph_amp_report(g, &rep), ALLOY_OK);
    assert_int_equal(rep.float_nodes, 5); /* m1 h m2 h2 m3; mh is f16 already */
    assert_int_equal(rep.low_nodes, 5);
    free_graph(g);
}

static void test_integer_bool_and_f64_nodes_are_never_coloured(void **state)
{
    (void)state;
    /* k = ids + 1 (i32) -> embedding(table) -> matmul(w) = m;
     * cond = x2 > 0 (bool); sel = where(cond, m, 0) = y;
     * x64 -> matmul(w64) -> exp = y64, all f64. */
    alloy_graph *g = new_graph("untyped");
    alloy_tensor *ids = alloy_input(g, "ids", ALLOY_I32, 1, DIMS(2));
    alloy_tensor *one = named(g, alloy_scalar(g, ALLOY_I32, 1), "one");
    alloy_tensor *table = param_f32(g, "table", 2, DIMS(5, 4));
    alloy_tensor *w = param_f32(g, "w", 2, DIMS(4, 3));
    alloy_tensor *x2 = in_f32(g, "x2", 2, DIMS(2, 3));
    alloy_tensor *zero = named(g, alloy_scalar(g, ALLOY_F32, 0.0), "zero");
    alloy_tensor *x64 = alloy_input(g, "x64", ALLOY_F64, 2, DIMS(2, 4));
    alloy_tensor *w64 = alloy_param(g, "w64", ALLOY_F64, 2, DIMS(4, 3), alloy_init_normal(0.1));
    alloy_tensor *k = named(g, alloy_add(g, ids, one), "k");
    alloy_tensor *emb = named(g, alloy_embedding(g, k, table), "emb");
    alloy_tensor *m = named(g, alloy_matmul(g, emb, w, false, false), "m");
    alloy_tensor *cond = named(g, alloy_greater(g, x2, zero), "cond");
    output(g, "y", named(g, alloy_where(g, cond, m, zero), "sel"));
    alloy_tensor *m64 = named(g, alloy_matmul(g, x64, w64, false, false), "m64");
    output(g, "y64", named(g, alloy_exp(g, m64), "e64"));
    alloy_graph_enable_amp(g, ALLOY_F16);
    /* k (i32), cond (bool), m64 and e64 (f64): not f32, never coloured, no
     * casts in or out even though m64 is a matmul and e64 an exp.
     * emb: clear, feeds the allow m -> f16 by step 5; its i32 ids pass
     * uncast, its table is cast. sel: clear, downstream of m and an output ->
     * f16; its bool condition passes uncast, the f32 zero is cast (cond uses
     * zero in f32, uncast).
     * Casts: table, w, zero to f16 (2 weights), sel to f32: 4. */
    expect_graph(g, &(want){
        NODES({"ids", ALLOY_I32, AMP_NONE, {0}}, {"one", ALLOY_I32, AMP_NONE, {0}},
              {"table", ALLOY_F32, AMP_NONE, {0}}, {"w", ALLOY_F32, AMP_NONE, {0}},
              {"x2", ALLOY_F32, AMP_NONE, {0}}, {"zero", ALLOY_F32, AMP_NONE, {0}},
              {"x64", ALLOY_F64, AMP_NONE, {0}}, {"w64", ALLOY_F64, AMP_NONE, {0}},
              {"k", ALLOY_I32, AMP_NONE, {"ids", "one"}}, {"emb", ALLOY_F16, AMP_ALLOW, {"k", "table>f16"}},
              {"m", ALLOY_F16, AMP_ALLOW, {"emb", "w>f16"}}, {"cond", ALLOY_BOOL, AMP_NONE, {"x2", "zero"}},
              {"sel", ALLOY_F16, AMP_ALLOW, {"cond", "m", "zero>f16"}},
              {"m64", ALLOY_F64, AMP_NONE, {"x64", "w64"}}, {"e64", ALLOY_F64, AMP_NONE, {"m64"}}),
        CASTS({"table", ALLOY_F16, 1}, {"w", ALLOY_F16, 1}, {"zero", ALLOY_F16, 1}, {"sel", ALLOY_F32, 1}),
        OUTPUTS({"y", "sel>f32"}, {"y64", "e64"}),
    });
    /* The printed IR carries no colour for them either. */
    char *text = ir_print_string(g->compiled);
    assert_non_null(text);
    for (const char *line = text; line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, "  %k ", 5) == 0 || strncmp(line, "  %cond ", 8) == 0 ||
            strncmp(line, "  %m64 ", 7) == 0 || strncmp(line, "  %e64 ", 7) == 0) {
            const char *end = strchr(line, '\n');
            const char *amp = strstr(line, "!amp");
            if (amp && (!end || amp < end)) fail_msg("coloured in the text: %.*s", (int)(end - line), line);
        }
    }
    al_free(text);
    free_graph(g);
}

static void test_the_loss_runs_in_f32_even_when_it_directly_follows_a_matmul(void **state)
{
    (void)state;
    /* x -> matmul(w) -> reshape to a scalar l; first l is only an output,
     * then it is also the loss (training off: no backward). */
    for (int as_loss = 0; as_loss < 2; as_loss++) {
        alloy_graph *g = new_graph("loss");
        alloy_tensor *x = in_f32(g, "x", 2, DIMS(1, 4));
        alloy_tensor *w = param_f32(g, "w", 2, DIMS(4, 1));
        alloy_tensor *m = named(g, alloy_matmul(g, x, w, false, false), "m");
        alloy_tensor *l = named(g, alloy_reshape(g, m, 0, NULL), "l");
        output(g, "l", l);
        if (as_loss) {
            assert_int_equal(alloy_graph_set_loss(g, l), ALLOY_OK);
            assert_int_equal(alloy_graph_set_training(g, false), ALLOY_OK);
        }
        alloy_graph_enable_amp(g, ALLOY_F16);
        if (!as_loss) {
            /* l is clear, downstream of m and an output (a sink): allow, f16,
             * cast back for the output. Casts: x, w, l -> f32: 3. */
            expect_graph(g, &(want){
                NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w", ALLOY_F32, AMP_NONE, {0}},
                      {"m", ALLOY_F16, AMP_ALLOW, {"x>f16", "w>f16"}}, {"l", ALLOY_F16, AMP_ALLOW, {"m"}}),
                CASTS({"x", ALLOY_F16, 1}, {"w", ALLOY_F16, 1}, {"l", ALLOY_F32, 1}),
                OUTPUTS({"l", "l>f32"}),
            });
        } else {
            /* The loss seeds deny propagation itself: l is deny, f32, and the
             * cast moves before it. Casts: x, w, m -> f32: 3. */
            expect_graph(g, &(want){
                NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w", ALLOY_F32, AMP_NONE, {0}},
                      {"m", ALLOY_F16, AMP_ALLOW, {"x>f16", "w>f16"}}, {"l", ALLOY_F32, AMP_DENY, {"m>f32"}}),
                CASTS({"x", ALLOY_F16, 1}, {"w", ALLOY_F16, 1}, {"m", ALLOY_F32, 1}),
                OUTPUTS({"l", "l"}),
            });
            assert_int_equal(g->compiled->loss, ir_find_name(g->compiled, "l"));
        }
        free_graph(g);
    }
}

/* x -> matmul(w) -> add(b) -> mul(two) -> exp = y: the graph where f16 and
 * bf16 differ. */
static alloy_graph *bf16_graph(alloy_dtype amp)
{
    alloy_graph *g = new_graph("bf16_rule");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 4));
    alloy_tensor *w = param_f32(g, "w", 2, DIMS(4, 3));
    alloy_tensor *b = param_f32(g, "b", 1, DIMS(3));
    alloy_tensor *two = named(g, alloy_scalar(g, ALLOY_F32, 2.0), "two");
    alloy_tensor *m = named(g, alloy_matmul(g, x, w, false, false), "m");
    alloy_tensor *a = named(g, alloy_add(g, m, b), "a");
    alloy_tensor *s = named(g, alloy_mul(g, a, two), "s");
    output(g, "y", named(g, alloy_exp(g, s), "e"));
    alloy_graph_enable_amp(g, amp);
    return g;
}

static void test_bf16_runs_an_infer_op_fed_by_a_matmul_in_low_precision_where_f16_keeps_it_f32(void **state)
{
    (void)state;
    /* f16: a and s are infer, downstream of m but with no allow node (or
     * output) after them, only the deny exp: not sandwiched, and deny does
     * not spread backwards -> both f32, coloured infer.
     * Casts: x, w -> f16 (1 weight), m -> f32: 3. */
    alloy_graph *g = bf16_graph(ALLOY_F16);
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w", ALLOY_F32, AMP_NONE, {0}},
              {"b", ALLOY_F32, AMP_NONE, {0}}, {"two", ALLOY_F32, AMP_NONE, {0}},
              {"m", ALLOY_F16, AMP_ALLOW, {"x>f16", "w>f16"}}, {"a", ALLOY_F32, AMP_INFER, {"m>f32", "b"}},
              {"s", ALLOY_F32, AMP_INFER, {"a", "two"}}, {"e", ALLOY_F32, AMP_DENY, {"s"}}),
        CASTS({"x", ALLOY_F16, 1}, {"w", ALLOY_F16, 1}, {"m", ALLOY_F32, 1}),
        OUTPUTS({"y", "e"}),
    });
    free_graph(g);
    /* bf16 adds step 4: a is infer with an allow input (m) and no deny
     * input -> allow; then s has the allow input a -> allow. exp stays f32.
     * Casts: x, w, b, two -> bf16 (w, b weights; two is a constant),
     * s -> f32 for exp: 5. */
    g = bf16_graph(ALLOY_BF16);
    expect_graph(g, &(want){
        NODES({"x", ALLOY_F32, AMP_NONE, {0}}, {"w", ALLOY_F32, AMP_NONE, {0}},
              {"b", ALLOY_F32, AMP_NONE, {0}}, {"two", ALLOY_F32, AMP_NONE, {0}},
              {"m", ALLOY_BF16, AMP_ALLOW, {"x>bf16", "w>bf16"}}, {"a", ALLOY_BF16, AMP_ALLOW, {"m", "b>bf16"}},
              {"s", ALLOY_BF16, AMP_ALLOW, {"a", "two>bf16"}}, {"e", ALLOY_F32, AMP_DENY, {"s>f32"}}),
        CASTS({"x", ALLOY_BF16, 1}, {"w", ALLOY_BF16, 1}, {"b", ALLOY_BF16, 1}, {"two", ALLOY_BF16, 1},
              {"s", ALLOY_F32, 1}),
        OUTPUTS({"y", "e"}),
    });
    free_graph(g);
}

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

/* ==== the shared models ==== */

static bool is_deny_op(int op)
{
    return op == IR_OP_softmax || op == IR_OP_log_softmax || op == IR_OP_layer_norm || op == IR_OP_exp ||
           op == IR_OP_log || op == IR_OP_pow || op == IR_OP_rsqrt || op == IR_OP_reduce_sum ||
           op == IR_OP_reduce_mean || op == IR_OP_cross_entropy;
}

/* Every matmul runs in low precision; every deny-list op in f32; the loss
 * output is f32. Returns the number of matmuls and of deny ops seen. */
static void check_model_precisions(const ir_graph *c, alloy_dtype low, int *matmuls, int *denied)
{
    *matmuls = *denied = 0;
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        if (n->op == IR_OP_matmul) {
            if (n->type.dtype != low || n->amp != AMP_ALLOW) fail_in(c, "matmul %%%d is not low precision", i);
            ++*matmuls;
        }
        if (is_deny_op(n->op)) {
            if (n->type.dtype != ALLOY_F32 || n->amp != AMP_DENY) fail_in(c, "%s %%%d is not f32", ir_ops[n->op].name, i);
            ++*denied;
        }
    }
    int loss = -1;
    for (int i = 0; i < c->noutputs; i++)
        if (strcmp(c->outputs[i].name, "loss") == 0) loss = c->outputs[i].node;
    assert_true(loss >= 0);
    assert_int_equal(c->nodes[loss]->type.dtype, ALLOY_F32);
    assert_int_equal(c->nodes[loss]->op, IR_OP_cross_entropy);
}

/* The single inserted cast of the param named name to dtype, with one user. */
static void expect_weight_cast(const ir_graph *c, const char *name, alloy_dtype dtype)
{
    int p = ir_find_name(c, name);
    if (p < 0) fail_in(c, "no param '%s'", name);
    int id = cast_of(c, p, dtype);
    if (id < 0) fail_in(c, "param '%s' is not cast to %s", name, alloy_dtype_name(dtype));
    if (uses(c, id) != 1) fail_in(c, "the cast of '%s' has %d users", name, uses(c, id));
}

static void test_the_mlp_runs_its_matmuls_in_f16_and_its_loss_in_f32_with_the_fewest_casts(void **state)
{
    (void)state;
    alloy_graph *g = new_graph("mlp");
    build_mlp(g, ALLOY_F32, 4, 8, 16, 5);
    alloy_graph_enable_amp(g, ALLOY_F16);
    alloy_amp_report rep;
    const ir_graph *c = compile(g, &rep);
    /* x -> matmul(w1) -> add(b1) -> relu -> matmul(w2) -> add(b2) = logits -> cross_entropy = loss
     * Colouring: both matmuls allow; add(b1) (infer) and relu (clear) are
     * sandwiched -> allow; add(b2) is infer between matmul 2 and the deny
     * cross_entropy -> f32 (infer); cross_entropy deny.
     * Casts, one per tensor crossing between regions:
     *   weights: w1, b1, w2 -> f16                             3
     *   activations: x -> f16 (matmul 1), matmul 2 -> f32 (add b2)  2
     * b2 feeds an f32 add: no cast. Total 5, 3 of them weight casts. This is
     * the minimum: the two matmuls need f16 operands (x, w1, w2), the f32
     * cross_entropy needs one f16 -> f32 crossing after matmul 2, and
     * running add(b1) in f32 instead of casting b1 would take two
     * activation casts instead of one. */
    int matmuls, denied, weight;
    check_model_precisions(c, ALLOY_F16, &matmuls, &denied);
    assert_int_equal(matmuls, 2);
    assert_int_equal(denied, 1);
    assert_int_equal(check_casts(c, &weight), 5);
    assert_int_equal(weight, 3);
    assert_int_equal(rep.casts, 5);
    assert_int_equal(rep.weight_casts, 3);
    expect_weight_cast(c, "w1", ALLOY_F16);
    expect_weight_cast(c, "b1", ALLOY_F16);
    expect_weight_cast(c, "w2", ALLOY_F16);
    assert_true(cast_of(c, ir_find_name(c, "x"), ALLOY_F16) >= 0);
    int logits = ir_find_name(c, "logits");
    assert_int_equal(c->nodes[logits]->type.dtype, ALLOY_F32);
    assert_int_equal(c->nodes[logits]->amp, AMP_INFER);
    const ir_node *m2 = c->nodes[c->nodes[logits]->in[0]];
    assert_true(is_inserted_cast(m2) && m2->type.dtype == ALLOY_F32);
    assert_int_equal(c->nodes[m2->in[0]]->op, IR_OP_matmul);
    /* f32 nodes: matmul, add, relu, matmul, add, cross_entropy; 4 in f16. */
    assert_int_equal(rep.float_nodes, 6);
    assert_int_equal(rep.low_nodes, 4);
    free_graph(g);
}

static void test_the_transformer_block_runs_its_matmuls_in_f16_and_norms_softmax_loss_in_f32_with_the_fewest_casts(
    void **state)
{
    (void)state;
    alloy_graph *g = new_graph("block");
    build_transformer_block(g, ALLOY_F32, 2, 4, 11, 8, 2);
    alloy_graph_enable_amp(g, ALLOY_F16);
    alloy_amp_report rep;
    const ir_graph *c = compile(g, &rep);
    /* Colouring (models.c):
     *   embedding + pos_emb -> reshape -> ln1: before any matmul, f32 (the add
     *     and reshape feed layer_norm; embedding, add, reshape are not next to
     *     an allow node).
     *   q, k, v matmuls, their reshape+transpose, the scores matmul: f16.
     *   scores * 1/sqrt(hd) (infer) -> causal_mask (clear) -> softmax: the mul
     *     and mask lie between a matmul and the deny softmax -> f32.
     *   att @ v, its transpose+reshape, the wo matmul: f16.
     *   residual add, ln2: f32. mlp.w1 matmul, add(b1), gelu (sandwiched),
     *   mlp.w2 matmul: f16. add(b2), residual add, lnf: f32.
     *   head matmul (= logits): f16; cross_entropy: f32.
     * Casts, one per tensor crossing:
     *   weights -> f16: attn.wq, attn.wk, attn.wv, attn.wo, mlp.w1, mlp.b1,
     *     mlp.w2, head.w                                          8
     *   f32 -> f16: ln1 (one cast shared by the q, k, v matmuls), softmax,
     *     ln2, lnf                                                4
     *   f16 -> f32: scores (for the mul), wo matmul (residual add),
     *     mlp.w2 matmul (add b2), logits (cross_entropy)          4
     * Total 16, 8 weight casts. Minimum: every matmul needs f16 operands
     * and every deny op f32 ones, so each of these 8 activation crossings
     * needs one cast; moving any f32 infer/clear op to f16 (the scale mul,
     * the bias add b2, a residual add) trades one activation cast for at
     * least two (its other operand and its result); running add(b1) and
     * gelu in f32 would trade the b1 cast for two. */
    int matmuls, denied, weight;
    check_model_precisions(c, ALLOY_F16, &matmuls, &denied);
    assert_int_equal(matmuls, 9);
    assert_int_equal(denied, 5); /* 3 layer_norms, softmax, cross_entropy */
    assert_int_equal(check_casts(c, &weight), 16);
    assert_int_equal(weight, 8);
    assert_int_equal(rep.casts, 16);
    assert_int_equal(rep.weight_casts, 8);
    static const char *const weights[] = {"attn.wq", "attn.wk", "attn.wv", "attn.wo",
                                          "mlp.w1",  "mlp.b1",  "mlp.w2",  "head.w"};
    for (int i = 0; i < COUNT(weights); i++) expect_weight_cast(c, weights[i], ALLOY_F16);
    /* The activation casts: f32 -> f16 only after the deny ops (ln1 shared by
     * three matmuls), f16 -> f32 only after matmuls. */
    int to_low = 0, to_f32 = 0, lns = 0;
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        if (n->op == IR_OP_layer_norm || n->op == IR_OP_softmax) {
            int id = cast_of(c, i, ALLOY_F16);
            if (id < 0) fail_in(c, "%%%d (%s) is not cast to f16", i, ir_ops[n->op].name);
            int want_uses = n->op == IR_OP_layer_norm && lns++ == 0 ? 3 : 1;
            if (uses(c, id) != want_uses) fail_in(c, "cast %%%d has %d users, expected %d", id, uses(c, id), want_uses);
        }
        if (!is_inserted_cast(n) || c->nodes[n->in[0]]->op == IR_OP_param) continue;
        const ir_node *src = c->nodes[n->in[0]];
        if (n->type.dtype == ALLOY_F16) {
            if (src->op != IR_OP_layer_norm && src->op != IR_OP_softmax) fail_in(c, "unexpected cast %%%d", i);
            to_low++;
        } else {
            if (n->type.dtype != ALLOY_F32 || src->op != IR_OP_matmul) fail_in(c, "unexpected cast %%%d", i);
            to_f32++;
        }
    }
    assert_int_equal(to_low, 4);
    assert_int_equal(to_f32, 4);
    assert_int_equal(c->nodes[ir_find_name(c, "logits")]->type.dtype, ALLOY_F16);
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        if (n->op == IR_OP_gelu) assert_int_equal(n->type.dtype, ALLOY_F16);
        if (n->op == IR_OP_causal_mask || n->op == IR_OP_mul) assert_int_equal(n->type.dtype, ALLOY_F32);
    }
    /* 32 f32 compute nodes: embedding, add(pos_emb), 5 reshapes, 3
     * layer_norms, 9 matmuls, 4 transposes, mul, causal_mask, softmax, 2
     * residual adds, 2 bias adds, gelu, cross_entropy (1+1+5+3+9+4+1+1+1+2+
     * 2+1+1 = 32); 19 of them now f16: 9 matmuls, 4 reshapes (after q, k, v
     * and after attention), 4 transposes, add(b1), gelu. */
    assert_int_equal(rep.float_nodes, 32);
    assert_int_equal(rep.low_nodes, 19);
    free_graph(g);
}

/* ==== numerics on the CPU backend ==== */

static double half_to_double(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

static double bf16_to_double(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Element i of a fetched floating-point tensor. */
static double element(const alloy_host_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case ALLOY_F32: return ((const float *)t->data)[i];
    case ALLOY_F64: return ((const double *)t->data)[i];
    case ALLOY_F16: return half_to_double(((const uint16_t *)t->data)[i]);
    case ALLOY_BF16: return bf16_to_double(((const uint16_t *)t->data)[i]);
    default: fail_msg("fetched a %s tensor", alloy_dtype_name(t->dtype));
    }
    return NAN;
}

static uint64_t lcg_state;
static double uniform(void) /* in [-1, 1) */
{
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(lcg_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

enum { MLP_B = 16, MLP_IN = 32, MLP_H = 64, MLP_OUT = 10 };
enum { BLK_B = 2, BLK_T = 8, BLK_V = 13, BLK_D = 32, BLK_H = 4 };

/* Runs the MLP (model 0) or the block (1) with AMP in amp (F32: off) on
 * fixed inputs; fills logits (as doubles) and *loss, and *logits_dtype. */
static int run_model(int model, alloy_dtype amp, double *logits, double *loss, alloy_dtype *logits_dtype)
{
    alloy_graph *g = new_graph(model ? "block" : "mlp");
    static float x[MLP_B * MLP_IN];
    static int32_t targets[BLK_B * BLK_T], tokens[BLK_B * BLK_T];
    alloy_host_tensor feeds[2];
    int n;
    lcg_state = 42;
    if (model == 0) {
        build_mlp(g, ALLOY_F32, MLP_B, MLP_IN, MLP_H, MLP_OUT);
        for (int i = 0; i < MLP_B * MLP_IN; i++) x[i] = (float)uniform();
        for (int i = 0; i < MLP_B; i++) targets[i] = i % MLP_OUT;
        feeds[0] = (alloy_host_tensor){.name = "x", .dtype = ALLOY_F32, .rank = 2, .dims = {MLP_B, MLP_IN}, .data = x};
        feeds[1] = (alloy_host_tensor){.name = "targets", .dtype = ALLOY_I32, .rank = 1, .dims = {MLP_B}, .data = targets};
        n = MLP_B * MLP_OUT;
    } else {
        build_transformer_block(g, ALLOY_F32, BLK_B, BLK_T, BLK_V, BLK_D, BLK_H);
        for (int i = 0; i < BLK_B * BLK_T; i++) {
            tokens[i] = (i * 7 + 3) % BLK_V;
            targets[i] = (i * 5 + 1) % BLK_V;
        }
        feeds[0] = (alloy_host_tensor){.name = "tokens", .dtype = ALLOY_I32, .rank = 2, .dims = {BLK_B, BLK_T}, .data = tokens};
        feeds[1] = (alloy_host_tensor){.name = "targets", .dtype = ALLOY_I32, .rank = 1, .dims = {BLK_B * BLK_T}, .data = targets};
        n = BLK_B * BLK_T * BLK_V;
    }
    assert_int_equal(alloy_graph_enable_amp(g, amp), ALLOY_OK);
    alloy_host_tensor fetches[2] = {{.name = "logits"}, {.name = "loss"}};
    alloy_status st = alloy_graph_run(g, feeds, 2, fetches, 2);
    if (st) fail_msg("run: %s", alloy_last_error(g));
    assert_int_equal(alloy_host_tensor_numel(&fetches[0]), n);
    for (int i = 0; i < n; i++) logits[i] = element(&fetches[0], i);
    assert_int_equal(fetches[1].dtype, ALLOY_F32);
    *loss = element(&fetches[1], 0);
    *logits_dtype = fetches[0].dtype;
    free_graph(g);
    return n;
}

/* ||a - b|| / ||b|| */
static double rel_norm(const double *a, const double *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / den);
}

/* Measured (16x32 -> 64 -> 10 MLP; block B2 T8 V13 D32 H4):
 *   MLP   f16: logits 4.9e-4, loss 1.2e-5;  bf16: logits 4.5e-3, loss 2.0e-4
 *   block f16: logits 3.6e-4, loss 6.5e-6;  bf16: logits 4.1e-3, loss 1.6e-4
 * f16 rounds with unit 2^-11 = 4.9e-4, bf16 with 2^-8 = 3.9e-3; the bounds
 * are about 8 units: 4e-3 for f16 and 3e-2 for bf16, logits and loss. The
 * errors must also be non-zero: the low-precision path really ran. */
static void check_model_numerics(int model)
{
    static double ref[BLK_B * BLK_T * BLK_V], low[BLK_B * BLK_T * BLK_V];
    double ref_loss, low_loss;
    alloy_dtype dt;
    int n = run_model(model, ALLOY_F32, ref, &ref_loss, &dt);
    assert_int_equal(dt, ALLOY_F32);
    assert_true(isfinite(ref_loss) && ref_loss > 0);
    static const alloy_dtype amps[] = {ALLOY_F16, ALLOY_BF16};
    static const double bound[] = {4e-3, 3e-2};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(run_model(model, amps[k], low, &low_loss, &dt), n);
        /* The block's logits are its head matmul: low precision. The MLP's are
         * add(b2), an infer op between matmul 2 and the deny cross_entropy:
         * f32 under f16, but bf16 under bf16 (step 4: an allow input, no deny
         * input). */
        assert_int_equal(dt, model == 0 && amps[k] == ALLOY_F16 ? ALLOY_F32 : amps[k]);
        double e_logits = rel_norm(low, ref, n), e_loss = fabs(low_loss - ref_loss) / fabs(ref_loss);
        printf("# %s %s AMP vs f32: logits rel. error %.3e, loss rel. error %.3e (bound %.0e)\n",
               model ? "block" : "mlp", alloy_dtype_name(amps[k]), e_logits, e_loss, bound[k]);
        assert_true(e_logits < bound[k]);
        assert_true(e_loss < bound[k]);
        assert_true(e_logits > 0);
    }
}

static void test_the_amp_forward_of_the_mlp_stays_within_rounding_of_the_f32_forward(void **state)
{
    (void)state;
    check_model_numerics(0);
}

static void test_the_amp_forward_of_the_transformer_block_stays_within_rounding_of_the_f32_forward(void **state)
{
    (void)state;
    check_model_numerics(1);
}

/* Runs g on x = ones[2, k] and returns y[0] (f32). */
static double run_ones(alloy_graph *g, int k)
{
    static float x[2 * 16];
    for (int i = 0; i < 2 * k; i++) x[i] = 1.0f;
    alloy_host_tensor feed = {.name = "x", .dtype = ALLOY_F32, .rank = 2, .dims = {2, k}, .data = x};
    alloy_host_tensor fetch = {.name = "y"};
    alloy_status st = alloy_graph_run(g, &feed, 1, &fetch, 1);
    if (st) fail_msg("run: %s", alloy_last_error(g));
    assert_int_equal(fetch.dtype, ALLOY_F32);
    return element(&fetch, 0);
}

static void test_a_sum_beyond_the_f16_range_stays_finite_because_reduce_sum_is_denied(void **state)
{
    (void)state;
    /* x = ones[2,16] -> matmul(w = 4.0 everywhere, [16,2048]) -> reduce_sum over axis 1 = y.
     * Every matmul entry is 16 * 4 = 64 (exact in f16); each row sums to
     * 2048 * 64 = 131072, exact in f32 but above f16's largest finite
     * value 65504. */
    alloy_graph *g = new_graph("sum");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 16));
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 2, DIMS(16, 2048), alloy_init_constant(4.0));
    alloy_tensor *m = alloy_matmul(g, x, w, false, false);
    output(g, "y", named(g, alloy_reduce_sum(g, m, 1, DIMS(1), false), "s"));
    alloy_graph_enable_amp(g, ALLOY_F16);
    double y = run_ones(g, 16);
    assert_int_equal(g->compiled->nodes[ir_find_name(g->compiled, "s")]->type.dtype, ALLOY_F32);
    assert_true(y == 131072.0);
    /* Forced onto the allow list, the sum is stored in f16: +inf. */
    assert_int_equal(alloy_amp_lists_remove(g, ALLOY_AMP_DENYLIST, "reduce_sum"), ALLOY_OK);
    assert_int_equal(alloy_amp_lists_add(g, ALLOY_AMP_ALLOWLIST, "reduce_sum"), ALLOY_OK);
    y = run_ones(g, 16);
    assert_int_equal(g->compiled->nodes[ir_find_name(g->compiled, "s")]->type.dtype, ALLOY_F16);
    assert_true(isinf(y) && y > 0);
    free_graph(g);
}

static void test_exp_beyond_the_f16_range_stays_finite_because_exp_is_denied(void **state)
{
    (void)state;
    /* x = ones[2,4] -> matmul(w = 3.0 everywhere, [4,3]) = 12 -> exp = y.
     * exp(12) = 162754.79..., finite in f32, above f16's 65504. */
    alloy_graph *g = new_graph("exp");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(2, 4));
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 2, DIMS(4, 3), alloy_init_constant(3.0));
    alloy_tensor *m = alloy_matmul(g, x, w, false, false);
    output(g, "y", named(g, alloy_exp(g, m), "e"));
    alloy_graph_enable_amp(g, ALLOY_F16);
    double y = run_ones(g, 4);
    assert_true(fabs(y - exp(12.0)) <= 1e-6 * exp(12.0));
    /* Forced onto the allow list through the environment: +inf. */
    setenv("ALLOY_AMP_DENYLIST_REMOVE", "exp", 1);
    setenv("ALLOY_AMP_ALLOWLIST_ADD", "exp", 1);
    assert_int_equal(alloy_graph_enable_amp(g, ALLOY_F16), ALLOY_OK); /* recompile */
    y = run_ones(g, 4);
    assert_int_equal(g->compiled->nodes[ir_find_name(g->compiled, "e")]->type.dtype, ALLOY_F16);
    assert_true(isinf(y) && y > 0);
    clear_env();
    free_graph(g);
}

/* ==== the printed IR ==== */

static void expect_round_trip(alloy_graph *g, int casts)
{
    const ir_graph *c = compile(g, NULL);
    char *text = ir_print_string(c);
    assert_non_null(text);
    int inserted = 0, allow = 0;
    for (const char *p = text; (p = strstr(p, " !inserted\n")); p++) inserted++;
    for (const char *p = text; (p = strstr(p, "!amp=allow")); p++) allow++;
    assert_int_equal(inserted, casts);
    assert_true(allow > casts); /* the casts to f16 and the low-precision nodes */
    char err[512] = "";
    ir_graph *parsed = ir_parse(text, strlen(text), "amp.ir", err, sizeof err);
    if (!parsed) fail_msg("parse of the printed AMP IR failed: %s\n%s", err, text);
    char *again = ir_print_string(parsed);
    assert_non_null(again);
    assert_string_equal(again, text);
    assert_int_equal(parsed->nnodes, c->nnodes);
    al_free(again);
    ir_graph_free(parsed);
    al_free(text);
}

static void test_the_printed_amp_ir_parses_and_prints_back_identically(void **state)
{
    (void)state;
    alloy_graph *g = new_graph("mlp");
    build_mlp(g, ALLOY_F32, 4, 8, 16, 5);
    alloy_graph_enable_amp(g, ALLOY_F16);
    expect_round_trip(g, 5);
    free_graph(g);
    static const alloy_dtype amps[] = {ALLOY_F16, ALLOY_BF16};
    for (int k = 0; k < 2; k++) {
        g = new_graph("block");
        build_transformer_block(g, ALLOY_F32, 2, 4, 11, 8, 2);
        alloy_graph_enable_amp(g, amps[k]);
        alloy_amp_report rep;
        assert_int_equal(alloy_graph_amp_report(g, &rep), ALLOY_OK);
        expect_round_trip(g, rep.casts);
        free_graph(g);
    }
}

/* x -> B blocks of [e = exp(h); h = matmul(e, w1) + matmul(e, w2)] = y,
 * after `pad` unused inputs that shift every node id by one each. */
static alloy_graph *build_shared_cast_chain(int pad, int blocks)
{
    alloy_graph *g = new_graph("shared_casts");
    for (int k = 0; k < pad; k++) {
        char name[16];
        snprintf(name, sizeof name, "pad%d", k);
        in_f32(g, name, 1, DIMS(1));
    }
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(4, 4));
    alloy_tensor *w1 = param_f32(g, "w1", 2, DIMS(4, 4));
    alloy_tensor *w2 = param_f32(g, "w2", 2, DIMS(4, 4));
    alloy_tensor *h = x;
    for (int i = 0; i < blocks; i++) {
        alloy_tensor *e = alloy_exp(g, h);
        h = alloy_add(g, alloy_matmul(g, e, w1, false, false), alloy_matmul(g, e, w2, false, false));
    }
    output(g, "y", h);
    alloy_graph_enable_amp(g, ALLOY_F16);
    return g;
}

static void test_a_cast_shared_by_two_consumers_stays_shared_in_graphs_that_outgrow_the_pass_tables(void **state)
{
    (void)state;
    /* Per block: exp is deny (f32); both matmuls are allow and share one
     * cast of e to f16 (2 users); the add feeds the next exp, so it is not
     * sandwiched and stays f32: each matmul result is cast to f32 - except
     * in the last block, whose add is the graph output (allow by the sink
     * rule), cast once to f32. w1 and w2 are cast once each, shared by all
     * B matmuls. Casts: 2 + B (e) + 2(B - 1) + 1 = 3B + 1, 2 of them weights.
     * The rewritten graph grows 7 nodes a block (exp, cast, matmul, matmul,
     * cast, cast, add), so over 7 paddings the shared cast of some block
     * lands on every id modulo 7, including the ids 255 and 511 where the
     * pass's per-node tables grow; under cmocka's allocator every growth
     * moves the tables. */
    enum { BLOCKS = 80 };
    for (int pad = 0; pad < 7; pad++) {
        alloy_graph *g = build_shared_cast_chain(pad, BLOCKS);
        alloy_amp_report rep;
        const ir_graph *c = compile(g, &rep);
        int weight;
        assert_int_equal(check_casts(c, &weight), 3 * BLOCKS + 1);
        assert_int_equal(weight, 2);
        assert_int_equal(rep.casts, 3 * BLOCKS + 1);
        int shared = 0;
        for (int i = 0; i < c->nnodes; i++) {
            const ir_node *n = c->nodes[i];
            if (!is_inserted_cast(n) || c->nodes[n->in[0]]->op != IR_OP_exp) continue;
            if (uses(c, i) != 2) fail_in(c, "the cast %%%d of an exp has %d users, expected 2", i, uses(c, i));
            shared++;
        }
        assert_int_equal(shared, BLOCKS);
        free_graph(g);
    }
}

/* ==== linear time ==== */

/* x -> B blocks of [matmul(h, w) -> add(x) -> exp -> reshape [16] -> reshape [4,4]] = y:
 * a chain 5B + 2 nodes long in which x fans out to B + 1 consumers and w to B. */
static alloy_graph *build_chain(int blocks)
{
    alloy_graph *g = new_graph("chain");
    alloy_tensor *x = in_f32(g, "x", 2, DIMS(4, 4));
    alloy_tensor *w = param_f32(g, "w", 2, DIMS(4, 4));
    alloy_tensor *h = x;
    for (int i = 0; i < blocks; i++) {
        alloy_tensor *m = alloy_matmul(g, h, w, false, false);
        alloy_tensor *e = alloy_exp(g, alloy_add(g, m, x));
        h = alloy_reshape(g, alloy_reshape(g, e, 1, DIMS(16)), 2, DIMS(4, 4));
    }
    output(g, "y", h);
    if (alloy_graph_status(g)) fail_msg("building: %s", alloy_last_error(g));
    return g;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_the_pass_is_linear_and_compiles_a_100k_node_chain_in_under_20_seconds(void **state)
{
    (void)state;
    /* Per block: matmul allow; add infer, not sandwiched (its path onward
     * meets the deny exp) -> f32; exp deny; the two reshapes feed the next
     * matmul -> allow by step 5 (those of the last block feed only the
     * output and stay f32). Casts: x -> f16 and w -> f16 once (shared),
     * every matmul -> f32 for its add (B), every exp but the last -> f16
     * for its reshape (B - 1): 2B + 1, one weight cast. */
    static const int sizes[] = {1000, 10000, 100000};
    double total_s[3];
    for (int k = 0; k < 3; k++) {
        int blocks = sizes[k] / 5;
        alloy_graph *g = build_chain(blocks);
        assert_int_equal(g->ir->nnodes, 5 * blocks + 2);
        alloy_graph_enable_amp(g, ALLOY_F16);

        /* The pipeline on a copy, with per-pass timings. */
        ir_graph *copy = ir_graph_clone(g->ir);
        assert_non_null(copy);
        pass_options opts;
        assert_int_equal(graph_pass_options(g, &opts), ALLOY_OK);
        alloy_amp_report rep;
        opts.amp_report = &rep;
        pass_timing t[16];
        int nt = 0;
        alloy_status st = pass_run_pipeline(&copy, &opts, NULL, stderr, t, 16, &nt);
        if (st) fail_msg("pipeline: %s", copy->error);
        double amp_ms = -1;
        for (int i = 0; i < nt; i++)
            if (strcmp(t[i].name, "amp") == 0) amp_ms = t[i].ms;
        assert_true(amp_ms >= 0);
        ir_graph_free(copy);

        /* The whole compile through the public API. */
        double t0 = now_s();
        const ir_graph *c = compile(g, &rep);
        total_s[k] = now_s() - t0;
        int weight;
        assert_int_equal(check_casts(c, &weight), 2 * blocks + 1);
        assert_int_equal(weight, 1);
        assert_int_equal(rep.casts, 2 * blocks + 1);
        assert_int_equal(c->nnodes, 7 * blocks + 3);
        printf("# %6d nodes: amp pass %8.2f ms, whole compile %8.2f ms\n", 5 * blocks + 2, amp_ms,
               total_s[k] * 1e3);
        free_graph(g);
    }
    assert_true(total_s[2] < 20.0);
}

int main(void)
{
    /* these tests check the amp pass's own output: keep the later optimizing
     * passes (which fold casts of constants, group elementwise ops) out */
    setenv("ALLOY_DISABLE_PASSES", "simplify,fuse", 1);
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_deny_propagates_through_clear_and_infer_to_the_consumers_of_exp),
        T(test_an_add_and_a_relu_sandwiched_between_two_matmuls_run_in_f16),
        T(test_a_bias_add_that_is_a_graph_output_runs_in_f16_and_is_cast_back_once),
        T(test_allow_spreads_through_reshape_and_transpose_before_and_after_a_matmul),
        T(test_amp_allow_pins_a_tensor_to_f16_and_leaves_no_marker_in_the_compiled_graph),
        T(test_amp_deny_pins_a_tensor_to_f32_between_two_matmuls),
        T(test_an_amp_deny_marker_whose_consumer_runs_in_f16_leaves_no_cast_behind),
        T(test_a_consumer_needing_f32_of_a_tensor_cast_to_f16_gets_the_original_tensor),
        T(test_tensors_already_in_the_dtype_their_consumer_runs_in_get_no_cast),
        T(test_integer_bool_and_f64_nodes_are_never_coloured),
        T(test_the_loss_runs_in_f32_even_when_it_directly_follows_a_matmul),
        T(test_bf16_runs_an_infer_op_fed_by_a_matmul_in_low_precision_where_f16_keeps_it_f32),
        T(test_moving_gelu_from_the_infer_to_the_allow_list_makes_it_run_in_f16),
        T(test_an_op_added_to_a_second_list_is_a_compile_error_naming_the_op_and_both_lists),
        T(test_list_edits_from_the_environment_apply_at_compile_time_on_top_of_the_api),
        T(test_an_unknown_op_in_an_environment_list_is_an_error_naming_it),
        T(test_an_op_on_no_list_is_denied_until_the_unlisted_class_is_changed),
        T(test_alloy_amp_log_counts_the_casts_and_says_why_each_f32_neighbour_of_an_f16_node_stays_f32),
        T(test_the_mlp_runs_its_matmuls_in_f16_and_its_loss_in_f32_with_the_fewest_casts),
        T(test_the_transformer_block_runs_its_matmuls_in_f16_and_norms_softmax_loss_in_f32_with_the_fewest_casts),
        T(test_the_amp_forward_of_the_mlp_stays_within_rounding_of_the_f32_forward),
        T(test_the_amp_forward_of_the_transformer_block_stays_within_rounding_of_the_f32_forward),
        T(test_a_sum_beyond_the_f16_range_stays_finite_because_reduce_sum_is_denied),
        T(test_exp_beyond_the_f16_range_stays_finite_because_exp_is_denied),
        T(test_the_printed_amp_ir_parses_and_prints_back_identically),
        T(test_a_cast_shared_by_two_consumers_stays_shared_in_graphs_that_outgrow_the_pass_tables),
        /* the default allocator: cmocka's bookkeeping would dominate the timings */
        cmocka_unit_test_teardown(test_the_pass_is_linear_and_compiles_a_100k_node_chain_in_under_20_seconds,
                                  teardown),
    };
#undef T
    return cmocka_run_group_tests_name("amp", tests, NULL, NULL);
}
