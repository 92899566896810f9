/* fuse_support.c - what the two fusion suites share (fuse_support.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "fuse_support.h"
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

void check(alloy_graph *g, alloy_status st, const char *what)
{
    if (st != ALLOY_OK) fail_msg("%s failed: %s: %s", what, alloy_status_name(st), alloy_last_error(g));
}

void fusion(bool on)
{
    if (on) unsetenv("ALLOY_NO_FUSE");
    else setenv("ALLOY_NO_FUSE", "1", 1);
}

const ir_graph *compiled(alloy_graph *g)
{
    check(g, graph_compile(g), "compile");
    return g->compiled;
}

int node_named(const ir_graph *c, const char *name)
{
    int id = ir_find_name(c, name);
    if (id < 0) fail_msg("no node named '%s'", name);
    return id;
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

uint64_t rng;

double unit(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

void fill(float *x, int64_t n, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * unit());
}
