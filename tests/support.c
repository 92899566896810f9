/* support.c - what several test suites share: alloy's allocator routed through cmocka. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <setjmp.h>
#include <cmocka.h>

#include <alloy/alloy.h>

#include "support.h"

void *test_cmocka_realloc(void *ptr, size_t size, void *user)
{
    (void)user;
    return test_realloc(ptr, size);
}

int test_checked_alloc(void **state)
{
    (void)state;
    alloy_set_allocator(test_cmocka_realloc, NULL);
    return 0;
}

int test_plain_alloc(void **state)
{
    (void)state;
    alloy_set_allocator(NULL, NULL);
    return 0;
}

snapshot take_snapshot(alloy_graph *g)
{
    snapshot s = {.n = alloy_graph_state_count(g)};
    assert_true(s.n > 0 && s.n <= 32);
    for (int i = 0; i < s.n; i++) {
        alloy_host_tensor t;
        alloy_status st = alloy_graph_state_at(g, i, &t);
        if (st) fail_msg("state_at %d: %s", i, alloy_last_error(g));
        s.names[i] = test_malloc(strlen(t.name) + 1);
        strcpy(s.names[i], t.name);
        s.bytes[i] = (size_t)alloy_host_tensor_numel(&t) * alloy_dtype_size(t.dtype);
        s.data[i] = test_malloc(s.bytes[i] + 1);
        memcpy(s.data[i], t.data, s.bytes[i]);
    }
    return s;
}

void free_snapshot(snapshot *s)
{
    for (int i = 0; i < s->n; i++) test_free(s->names[i]), test_free(s->data[i]);
    s->n = 0;
}
