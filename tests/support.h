/* support.h - what several test suites share: alloy's allocator routed through cmocka. */
#ifndef ALLOY_TEST_SUPPORT_H
#define ALLOY_TEST_SUPPORT_H

#include <stddef.h>

/* An alloy_realloc_fn that allocates through cmocka's test_realloc, so a
 * block alloy leaks fails the test that leaked it. */
void *test_cmocka_realloc(void *ptr, size_t size, void *user);
/* cmocka setup/teardown functions: route alloy's allocations through
 * cmocka (leak-checked), or back to the C library. */
int test_checked_alloc(void **state);
int test_plain_alloc(void **state);

/* A copy of every state tensor of a graph (names and bytes), for checking
 * that a step left state unchanged or that a reload restored it. */
typedef struct alloy_graph alloy_graph;
typedef struct snapshot {
    int n;
    char *names[32];
    void *data[32];
    size_t bytes[32];
} snapshot;
snapshot take_snapshot(alloy_graph *g); /* fails the test on an error */
void free_snapshot(snapshot *s);

#endif
