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

#endif
