/* support.h - what several test suites share: the cmocka allocator hook, a seeded generator, dtype rounding and decoding, float comparisons, shape strings, cases that fail and go on, state snapshots. */
#ifndef ALLOY_TEST_SUPPORT_H
#define ALLOY_TEST_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloy/alloy.h"

/* The IR types some helpers take (ir/ir.h; a suite that passes them includes it). */
typedef struct ir_type ir_type;
typedef struct ir_graph ir_graph;

/* Short dtype names for test tables, and a dims literal. */
#define F32 ALLOY_F32
#define F16 ALLOY_F16
#define BF16 ALLOY_BF16
#define F64 ALLOY_F64
#define I32 ALLOY_I32
#define I64 ALLOY_I64
#define BOOL ALLOY_BOOL
#define DIMS(...) ((const int64_t[]){__VA_ARGS__})

/* ---- the allocator ---- */

/* An alloy_realloc_fn that allocates through cmocka's test_realloc, so a
 * block alloy leaks fails the test that leaked it. */
void *test_cmocka_realloc(void *ptr, size_t size, void *user);
/* cmocka setup/teardown functions: route alloy's allocations through
 * cmocka (leak-checked), or back to the C library. */
int test_checked_alloc(void **state);
int test_plain_alloc(void **state);
/* An alloy_realloc_fn through cmocka that fails allocation number
 * test_fail_at (counting in test_alloc_count from 0; -1: none), for loops
 * that fail each allocation of a call in turn. */
extern long test_alloc_count, test_fail_at;
void *test_failing_realloc(void *ptr, size_t size, void *user);
/* Allocation failure at each allocation in turn: for test_fail_at = 0, 1,
 * ..., *g = make(ctx) (NULL without make) with every allocation served,
 * then attempt(g, ctx) through test_failing_realloc (attempt may build *g
 * itself), then *g freed under cmocka's leak-checked allocator; until an
 * attempt needs no more allocations. Each attempt must return ALLOY_OK or
 * ALLOY_ERR_OOM, the last ALLOY_OK, and more than 10 must have failed
 * (else the test fails); prints and returns that count. */
int test_fail_each_allocation(alloy_graph *(*make)(void *ctx), alloy_status (*attempt)(alloy_graph **g, void *ctx),
                              void *ctx);
/* An alloy_realloc_fn through the C library that fails every allocation
 * once test_alloc_budget allocations have succeeded (-1: never). */
extern long test_alloc_budget;
void *test_budget_realloc(void *ptr, size_t size, void *user);

/* ---- a seeded generator (splitmix64) ---- */

/* The generator's state: a suite sets it once (or per test) for its own sequence. */
extern uint64_t test_rng;
uint64_t test_next_u64(void);
double test_uniform(double lo, double hi); /* in [lo, hi) */
int test_irand(int lo, int hi);            /* in [lo, hi] */

/* ---- values as a dtype holds them (written here, independent of the library's conversions) ---- */

/* v rounded once to dtype dt: floats to nearest even (overflow to inf,
 * subnormals kept), integers truncated and saturated (NaN -> 0), bools v != 0. */
double test_round_to(alloy_dtype dt, double v);
/* Stores n values (each representable in dt) as dt's bytes into dst. */
void test_encode(alloy_dtype dt, const double *v, void *dst, int64_t n);
/* Element i of dt's bytes at src, exactly. */
double test_decode(alloy_dtype dt, const void *src, int64_t i);

/* ---- comparisons ---- */

/* sqrt(sum (got - ref)^2 / sum ref^2) over the elements where both are
 * finite (sqrt(sum (got - ref)^2) when every such ref is 0). */
double test_normalized_error(const double *got, const double *ref, int64_t n);
/* As in ggml's test-backend-ops: the normalized error must be <= tol, no
 * element may be off by more than 4 * tol * max(|ref|, rms(ref)), and a
 * non-finite element must match exactly (NaN with NaN). false with the
 * reason in why otherwise. */
bool test_close(const double *got, const double *ref, int64_t n, double tol, char *why, size_t len);
/* Whether n elements of dt at a and b have the same bits, any NaN equal to
 * any NaN; *at (may be NULL) gets the first that differs. */
bool test_same_bits(alloy_dtype dt, const void *a, const void *b, int64_t n, int64_t *at);

/* ---- text ---- */

/* IR text parsed ("test.ir" in messages); the test fails on an error. */
ir_graph *test_parse_ir(const char *text);

/* "[2,3]" and "f32[2,3]" in one of 8 rotating static buffers (for messages). */
const char *test_dims_str(int rank, const int64_t *dims);
const char *test_type_str(const ir_type *t);

/* ---- cases that fail and go on ---- */

/* Reports one failed case of the running test (print_error) and counts it;
 * the test goes on to its other cases, so one run shows every failing case. */
void test_case_failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Fails the running test when any of its cases failed, and resets the count. */
void test_end_cases(void);
/* Resets the count (a teardown after a test that failed half way). */
void test_forget_failed_cases(void);

/* ---- files and time ---- */

/* A new directory made from template (mkdtemp: "/tmp/alloy-api-XXXXXX") in dir; false on failure. */
bool test_make_dir(char *dir, size_t len, const char *template_path);
/* Removes every entry of dir (files, empty directories), then dir itself. */
void test_remove_dir(const char *dir);
/* "dir/name" in one of 4 rotating static buffers. */
const char *test_path_in(const char *dir, const char *name);
/* cmocka setup/teardown for suites that write files: a fresh directory
 * test_tmpdir and the leak-checked allocator; teardown removes the
 * directory and restores the C library's allocator. test_tmp_path(name)
 * is a file in it. */
extern char test_tmpdir[64];
int test_tmpdir_setup(void **state);
int test_tmpdir_teardown(void **state);
const char *test_tmp_path(const char *name);

/* The whole file (test_malloc'd, one byte more, NUL-terminated); fails the test if unreadable. */
unsigned char *test_read_file(const char *path, size_t *len);
/* A monotonic clock in milliseconds. */
double test_now_ms(void);

/* ---- state snapshots ---- */

/* A copy of every state tensor of a graph (names and bytes), for checking
 * that a step left state unchanged or that a reload restored it. */
typedef struct snapshot {
    int n;
    char *names[32];
    void *data[32];
    size_t bytes[32];
} snapshot;
snapshot take_snapshot(alloy_graph *g); /* fails the test on an error */
void free_snapshot(snapshot *s);
/* Fails the test with g's last error when st is not ALLOY_OK. */
void expect_ok(alloy_graph *g, alloy_status st, const char *what);

#endif
