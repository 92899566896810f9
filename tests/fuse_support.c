/* fuse_support.c - what the fusion suites share (fuse_support.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fuse_support.h"
#include "ir/groups.h"
#include "runtime/cpu/cpu.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

int fuse_setup(void **state)
{
    (void)state;
    alloy_set_allocator(test_cmocka_realloc, NULL);
    unsetenv("ALLOY_NO_FUSE");
    unsetenv("ALLOY_NUM_THREADS");
    return 0;
}

int fuse_teardown(void **state)
{
    (void)state;
    alloy_set_allocator(NULL, NULL);
    unsetenv("ALLOY_NO_FUSE");
    unsetenv("ALLOY_NUM_THREADS");
    return 0;
}

void fusion(bool on)
{
    if (on) unsetenv("ALLOY_NO_FUSE");
    else setenv("ALLOY_NO_FUSE", "1", 1);
}

const ir_graph *compiled(alloy_graph *g)
{
    expect_ok(g, graph_compile(g), "compile");
    return g->compiled;
}

int node_named(const ir_graph *c, const char *name)
{
    int id = ir_find_name(c, name);
    if (id < 0) fail_msg("no node named '%s'", name);
    return id;
}

int first_node_of(const ir_graph *c, ir_op op)
{
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i]->op == op) return i;
    fail_msg("no %s node", ir_ops[op].name);
    return -1;
}

int expect_one_row_step(const alloy_graph *g, const int *nodes, int n, const char *fmt, ...)
{
    const schedule *s = &g->comp.sched;
    int st = s->step_of[nodes[0]];
    bool one = st >= 0 && s->steps[st].kind == STEP_KIND_ROW;
    for (int i = 1; i < n; i++) one &= s->step_of[nodes[i]] == st;
    if (one) return st;
    ir_print_groups(g->compiled, stdout);
    sched_print(g->compiled, s, stdout);
    char what[256], steps[256];
    va_list args;
    va_start(args, fmt);
    vsnprintf(what, sizeof what, fmt, args);
    va_end(args);
    size_t at = 0;
    for (int i = 0; i < n && at < sizeof steps; i++)
        at += (size_t)snprintf(steps + at, sizeof steps - at, " %d", s->step_of[nodes[i]]);
    fail_msg("%s: not one row step (steps%s)", what, steps);
    return -1;
}

int group_of(const ir_graph *c, const char *name) { return c->nodes[node_named(c, name)]->group; }

int group_count(const ir_graph *c)
{
    int n = 0;
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i]->group + 1 > n) n = c->nodes[i]->group + 1;
    return n;
}

int group_members(const ir_graph *c, int k, int *ids)
{
    int n = 0;
    for (int i = 0; i < c->nnodes; i++)
        if (k >= 0 && c->nodes[i]->group == k) ids[n++] = i;
    return n;
}

void fill(float *x, int64_t n, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)test_uniform(lo, hi);
}

int group_size(const ir_graph *c, int k)
{
    int n = 0;
    for (int i = 0; i < c->nnodes; i++) n += k >= 0 && c->nodes[i]->group == k;
    return n;
}

int update_node(const ir_graph *c, const char *name)
{
    for (int i = 0; i < c->nupdates; i++)
        if (strcmp(c->updates[i].name, name) == 0) return c->updates[i].node;
    fail_msg("no update '%s'", name);
    return -1;
}

int output_node(const ir_graph *c, const char *name)
{
    int i = ir_find_output(c, name);
    if (i < 0) fail_msg("no output '%s'", name);
    return c->outputs[i].node;
}

bool computes_wide(const ir_graph *c, const ir_node *n)
{
    for (int j = 0; j < n->nin; j++) {
        alloy_dtype dt = c->nodes[n->in[j]]->type.dtype;
        if (dt == ALLOY_F64 || dt == ALLOY_I32 || dt == ALLOY_I64) return true;
    }
    return false;
}

/* Every guarantee pass_fuse states, checked from scratch: ids dense and
 * numbered by first member, >= 2 members, and per kind (ir/groups.h): an
 * EW group is elementwise members of one shape and one compute type; a ROW
 * group adds row ops, all members over one shape in f32; a GEMM group is a
 * matmul or conv1d/conv2d first and elementwise members of its shape; a MULTI group's
 * members are elementwise and f32 but for found_inf; and every edge into or
 * out of a group goes from an earlier position to a later one (a group
 * sits at its last member). */
void expect_groups_legal(const ir_graph *c)
{
    int ng = group_count(c);
    int *first = test_calloc((size_t)ng + 1, sizeof(int)), *last = test_calloc((size_t)ng + 1, sizeof(int));
    int *size = test_calloc((size_t)ng + 1, sizeof(int));
    for (int k = 0; k < ng; k++) first[k] = -1;
    int seen = 0;
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        int k = n->group;
        if (k < 0) continue;
        if (first[k] < 0) {
            if (k != seen) fail_msg("group %d appears before group %d", k, seen);
            seen++;
            first[k] = i;
        }
        last[k] = i;
        size[k]++;
    }
    int *members = test_malloc(sizeof(int) * (size_t)c->nnodes);
    for (int k = 0; k < ng; k++) {
        int nm = 0;
        for (int i = first[k]; i <= last[k]; i++)
            if (c->nodes[i]->group == k) members[nm++] = i;
        ir_group_kind kind = ir_group_kind_of(c, members, nm);
        const ir_node *f = c->nodes[members[kind == IR_GROUP_GEMM ? 1 : 0]];
        if (kind == IR_GROUP_GEMM) { /* a matmul or a forward convolution first */
            int head = c->nodes[members[0]]->op;
            assert_true(head == IR_OP_matmul || head == IR_OP_conv1d || head == IR_OP_conv2d);
        }
        for (int m = kind == IR_GROUP_GEMM ? 1 : 0; m < nm; m++) {
            const ir_node *n = c->nodes[members[m]];
            if (kind == IR_GROUP_MULTI) {
                assert_true((ir_fuse_elementwise(c, n) && !computes_wide(c, n)) || n->op == IR_OP_found_inf ||
                            (n->op == IR_OP_sum_squares && m == nm - 2)); /* the gradient norm, before found_inf */
                continue;
            }
            assert_true(ir_fuse_elementwise(c, n) ||
                        (kind == IR_GROUP_ROW && (ir_fuse_row_op(c, n) || ir_fuse_colsum(c, n))));
            const ir_type *t = ir_fuse_shape(c, n), *ft = ir_fuse_shape(c, f);
            assert_int_equal(t->rank, ft->rank);
            for (int d = 0; d < t->rank; d++) assert_int_equal(t->dims[d], ft->dims[d]);
            assert_int_equal(ir_fuse_wide(c, n), ir_fuse_wide(c, f));
            if (kind != IR_GROUP_EW) assert_false(ir_fuse_wide(c, n));
        }
    }
    test_free(members);
    for (int k = 0; k < ng; k++) {
        assert_true(first[k] >= 0);
        assert_true(size[k] >= 2);
    }
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        int pi = n->group >= 0 ? last[n->group] : i;
        for (int j = 0; j < n->nin; j++) {
            const ir_node *o = c->nodes[n->in[j]];
            if (n->group >= 0 && o->group == n->group) continue;
            int po = o->group >= 0 ? last[o->group] : o->id;
            if (po >= pi) fail_msg("%%%d (at %d) reads %%%d (at %d)", i, pi, o->id, po);
        }
    }
    test_free(first);
    test_free(last);
    test_free(size);
}
