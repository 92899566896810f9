/* amp_support.c - what the AMP suites share (amp_support.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "amp_support.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* ---- allocator and environment ---- */

static const char *const env_vars[] = {
    "ALLOY_AMP_ALLOWLIST_ADD", "ALLOY_AMP_ALLOWLIST_REMOVE", "ALLOY_AMP_DENYLIST_ADD",
    "ALLOY_AMP_DENYLIST_REMOVE", "ALLOY_AMP_INFERLIST_ADD",  "ALLOY_AMP_INFERLIST_REMOVE",
    "ALLOY_AMP_CLEARLIST_ADD",   "ALLOY_AMP_CLEARLIST_REMOVE", "ALLOY_AMP_LOG",
};

void clear_env(void)
{
    for (int i = 0; i < COUNT(env_vars); i++) unsetenv(env_vars[i]);
}

/* The graphs a test has open, so that teardown frees those a failed
 * assertion left behind (and the failure is not followed by leak reports). */
static alloy_graph *open_graphs[8];

alloy_graph *new_graph(const char *name)
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

void free_graph(alloy_graph *g)
{
    for (int i = 0; i < COUNT(open_graphs); i++)
        if (open_graphs[i] == g) open_graphs[i] = NULL;
    alloy_graph_free(g);
}

int amp_setup(void **state)
{
    (void)state;
    clear_env();
    alloy_set_allocator(test_cmocka_realloc, NULL);
    return 0;
}

/* Also runs after a failed test, so a failing test never leaves its list
 * edits in the environment of the next one. */
int amp_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < COUNT(open_graphs); i++) free_graph(open_graphs[i]);
    alloy_set_allocator(NULL, NULL);
    clear_env();
    return 0;
}

int amp_run_tests(const struct CMUnitTest *tests, size_t count)
{
    setenv("ALLOY_DISABLE_PASSES", "simplify,fuse", 1);
    return _cmocka_run_group_tests("amp", tests, count, NULL, NULL);
}

/* ---- building ---- */

alloy_tensor *named(alloy_graph *g, alloy_tensor *t, const char *name)
{
    alloy_tensor *r = alloy_set_name(g, t, name);
    if (!r) fail_msg("naming '%s': %s", name, alloy_last_error(g));
    return r;
}

alloy_tensor *in_f32(alloy_graph *g, const char *name, int rank, const int64_t *dims)
{
    return alloy_input(g, name, ALLOY_F32, rank, dims);
}

alloy_tensor *param_f32(alloy_graph *g, const char *name, int rank, const int64_t *dims)
{
    return alloy_param(g, name, ALLOY_F32, rank, dims, alloy_init_normal(0.1));
}

void output(alloy_graph *g, const char *name, alloy_tensor *t)
{
    alloy_status st = alloy_output(g, name, t);
    if (st) fail_msg("output '%s': %s", name, alloy_last_error(g));
}

/* x -> exp -> transpose -> add(b) -> reshape -> matmul(w) = y */
alloy_graph *deny_chain_graph(void)
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

/* ---- inspecting the compiled graph ---- */

/* Compiles g (through alloy_graph_amp_report) and returns the compiled IR. */
const ir_graph *compile_amp(alloy_graph *g, alloy_amp_report *rep)
{
    alloy_amp_report local;
    alloy_status st = alloy_graph_amp_report(g, rep ? rep : &local);
    if (st) fail_msg("compile failed: %s: %s", alloy_status_name(st), alloy_last_error(g));
    assert_non_null(g->compiled);
    return g->compiled;
}

/* Prints the compiled graph (for the log) and fails with the message. */
void fail_in(const ir_graph *c, const char *fmt, ...)
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

bool is_inserted_cast(const ir_node *n)
{
    return (n->flags & IR_NODE_INSERTED) && n->op == IR_OP_cast;
}

/* How many operand slots, outputs and loss references name node id. */
int uses(const ir_graph *c, int id)
{
    int k = 0;
    for (int i = 0; i < c->nnodes; i++)
        for (int j = 0; j < c->nodes[i]->nin; j++) k += c->nodes[i]->in[j] == id;
    for (int i = 0; i < c->noutputs; i++) k += c->outputs[i].node == id;
    return k + (c->loss == id);
}

/* The inserted cast of node src to dtype, or -1. */
int cast_of(const ir_graph *c, int src, alloy_dtype dtype)
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
int check_casts(const ir_graph *c, int *weight)
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

/* The node a reference names in c (see want_node), or -1. */
int resolve(const ir_graph *c, const char *ref)
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

const char *amp_str(int amp)
{
    static const char *names[] = {"none", "allow", "deny", "infer", "clear"};
    return amp >= 0 && amp <= AMP_CLEAR ? names[amp] : "?";
}

/* Compiles g and checks the result is exactly w: every node (named, with its
 * dtype, colour and operands), every inserted cast (source, dtype, number of
 * users) and nothing else, the outputs, and the report's counts. */
void expect_graph(alloy_graph *g, const want *w)
{
    alloy_amp_report rep;
    const ir_graph *c = compile_amp(g, &rep);
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
