/* support.c - what several test suites share: alloy's allocator routed through cmocka. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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
