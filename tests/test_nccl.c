/* test_nccl.c - NCCL loaded at run time without a GPU: the library loads, reports its version, makes unique ids, and a communicator it cannot make is a clean error naming the call, as is a library that does not load or lacks NCCL's calls; with a GPU, a one-rank communicator is made and freed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "runtime/cuda/nccl.h"

static nccl_library *open_or_skip(void)
{
    nccl_library *lib;
    char err[512];
    alloy_status st = nccl_open(NULL, &lib, err, sizeof err);
    if (st == ALLOY_ERR_UNSUPPORTED) {
        print_message("skipped: %s\n", err);
        skip();
    }
    if (st) fail_msg("nccl_open: %s", err);
    return lib;
}

static void test_nccl_loads_reports_its_version_and_makes_distinct_unique_ids(void **state)
{
    (void)state;
    nccl_library *lib = open_or_skip();
    print_message("NCCL version %d (the toolkit's header says %d)\n", lib->version, NCCL_VERSION_CODE);
    assert_true(lib->version >= 21400 && lib->version < 30000); /* 2.14 or newer, major 2 */
    ncclUniqueId a, b, zero;
    char err[512];
    memset(&zero, 0, sizeof zero);
    assert_int_equal(nccl_unique_id(lib, &a, err, sizeof err), ALLOY_OK);
    assert_int_equal(nccl_unique_id(lib, &b, err, sizeof err), ALLOY_OK);
    assert_true(memcmp(&a, &zero, sizeof a) != 0);
    assert_true(memcmp(&a, &b, sizeof a) != 0);
    nccl_close(lib);
}

static void test_a_communicator_nccl_cannot_make_is_an_error_naming_the_call_and_the_rank(void **state)
{
    (void)state;
    nccl_library *lib = open_or_skip();
    ncclUniqueId id;
    ncclComm_t comm = (ncclComm_t)(uintptr_t)1;
    char err[512];
    assert_int_equal(nccl_unique_id(lib, &id, err, sizeof err), ALLOY_OK);
    assert_int_equal(nccl_comm_init(lib, 2, &id, 5, &comm, err, sizeof err), ALLOY_ERR_INVALID);
    assert_null(comm);
    assert_string_equal(err, "ncclCommInitRank: rank 5 of 2 is out of range");
    alloy_status st = nccl_comm_init(lib, 1, &id, 0, &comm, err, sizeof err);
    if (st == ALLOY_OK) { /* a GPU: one rank is a communicator */
        print_message("a one-rank communicator on this machine's GPU\n");
        assert_non_null(comm);
        assert_int_equal(lib->ncclCommDestroy(comm), ncclSuccess);
    } else {
        print_message("without a GPU: %s\n", err);
        assert_int_equal(st, ALLOY_ERR_CUDA);
        assert_null(comm);
        assert_int_equal(strncmp(err, "ncclCommInitRank (rank 0 of 1) failed: ", 39), 0);
    }
    nccl_close(lib);
}

static void test_a_library_that_does_not_load_is_an_error_naming_it(void **state)
{
    (void)state;
    nccl_library *lib = (nccl_library *)(uintptr_t)1;
    char err[512];
    assert_int_equal(nccl_open("/nonexistent/libnccl.so.2", &lib, err, sizeof err), ALLOY_ERR_UNSUPPORTED);
    assert_null(lib);
    assert_non_null(strstr(err, "NCCL (/nonexistent/libnccl.so.2) cannot be loaded ("));
    /* a library without NCCL's entry points: this process's C library */
    assert_int_equal(nccl_open("libc.so.6", &lib, err, sizeof err), ALLOY_ERR_UNSUPPORTED);
    assert_string_equal(err, "NCCL (libc.so.6) has no ncclGetVersion: older than 2.14");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_loads_reports_its_version_and_makes_distinct_unique_ids),
        cmocka_unit_test(test_a_communicator_nccl_cannot_make_is_an_error_naming_the_call_and_the_rank),
        cmocka_unit_test(test_a_library_that_does_not_load_is_an_error_naming_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
