/* support.c - what several test suites share (support.h). */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ir/ir.h"
#include "support.h"

/* ---- which tests of a suite run ---- */

/* meson runs one cmocka executable as several tests (tests/meson.build: the
 * quick part in the default run, the long part in suite `long`) by setting
 * ALLOY_TEST_ONLY or ALLOY_TEST_SKIP to a cmocka name pattern (* and ?);
 * every suite links this file, so each honours them before main runs. */
__attribute__((constructor)) static void test_filters_from_environment(void)
{
    const char *only = getenv("ALLOY_TEST_ONLY"), *skip = getenv("ALLOY_TEST_SKIP");
    if (only && *only) cmocka_set_test_filter(only);
    if (skip && *skip) cmocka_set_skip_filter(skip);
}

/* ---- the allocator ---- */

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

long test_alloc_count, test_fail_at = -1;

void *test_failing_realloc(void *ptr, size_t size, void *user)
{
    (void)user;
    if (size && test_alloc_count++ == test_fail_at) return NULL;
    return test_realloc(ptr, size);
}

int test_fail_each_allocation(alloy_graph *(*make)(void *ctx), alloy_status (*attempt)(alloy_graph **g, void *ctx),
                              void *ctx)
{
    int failures = 0;
    for (test_fail_at = 0;; test_fail_at++) {
        alloy_graph *g = make ? make(ctx) : NULL;
        alloy_set_allocator(test_failing_realloc, NULL);
        test_alloc_count = 0;
        alloy_status st = attempt(&g, ctx);
        bool failed = test_alloc_count > test_fail_at;
        alloy_set_allocator(test_cmocka_realloc, NULL);
        alloy_graph_free(g);
        if (!failed) {
            assert_int_equal(st, ALLOY_OK);
            break;
        }
        failures++;
        if (st != ALLOY_OK && st != ALLOY_ERR_OOM)
            fail_msg("allocation %ld failed: %s instead of OK or OOM", test_fail_at, alloy_status_name(st));
    }
    test_fail_at = -1;
    printf("failed each of %d allocations in turn\n", failures);
    assert_true(failures > 10);
    return failures;
}

long test_alloc_budget = -1;

void *test_budget_realloc(void *ptr, size_t size, void *user)
{
    (void)user;
    if (size == 0) {
        free(ptr);
        return NULL;
    }
    if (test_alloc_budget == 0) return NULL;
    if (test_alloc_budget > 0) test_alloc_budget--;
    return realloc(ptr, size);
}

/* ---- the generator ---- */

uint64_t test_rng = 0x853c49e6748fea9bu;

uint64_t test_next_u64(void)
{
    uint64_t z = (test_rng += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

double test_uniform(double lo, double hi) { return lo + (hi - lo) * (double)(test_next_u64() >> 11) * 0x1p-53; }

int test_irand(int lo, int hi) { return lo + (int)(test_next_u64() % (uint64_t)(hi - lo + 1)); }

/* ---- values as a dtype holds them ---- */

/* v rounded to nearest even with `precision` significant bits, exponents
 * down to min_exp (subnormals below), past max to infinity. */
static double round_binary(double v, int precision, int min_exp, double max)
{
    if (!isfinite(v) || v == 0) return v;
    int e;
    frexp(v, &e);
    double quantum = ldexp(1, (e - 1 < min_exp ? min_exp : e - 1) - (precision - 1));
    double r = nearbyint(v / quantum) * quantum;
    return fabs(r) > max ? copysign(INFINITY, v) : r;
}

double test_round_to(alloy_dtype dt, double v)
{
    switch (dt) {
    case F32: return (float)v;
    case F16: return round_binary(v, 11, -14, 65504);
    case BF16: return round_binary(v, 8, -126, 0x1.FEp127);
    case I32: return isnan(v) ? 0 : trunc(fmax(fmin(v, 2147483647.0), -2147483648.0));
    case I64: return isnan(v) ? 0 : trunc(fmax(fmin(v, 0x1p63), -0x1p63));
    case BOOL: return v != 0;
    default: return v;
    }
}

static uint16_t f16_bits(double v) /* v exactly representable */
{
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    int e;
    double m = frexp(fabs(v), &e);
    if (isnan(v)) return 0x7e00;
    if (isinf(v)) return sign | 0x7c00;
    if (fabs(v) < 0x1p-14) return sign | (uint16_t)(fabs(v) * 0x1p24);
    return sign | (uint16_t)((e + 14) << 10) | (uint16_t)((m * 2 - 1) * 1024);
}

void test_encode(alloy_dtype dt, const double *v, void *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float f = (float)v[i];
        uint32_t u;
        memcpy(&u, &f, 4);
        switch (dt) {
        case F32: ((float *)dst)[i] = f; break;
        case F64: ((double *)dst)[i] = v[i]; break;
        case F16: ((uint16_t *)dst)[i] = f16_bits(v[i]); break;
        case BF16: ((uint16_t *)dst)[i] = (uint16_t)(u >> 16); break;
        case I32: ((int32_t *)dst)[i] = (int32_t)v[i]; break;
        case I64: ((int64_t *)dst)[i] = v[i] >= 0x1p63 ? INT64_MAX : (int64_t)v[i]; break;
        default: ((uint8_t *)dst)[i] = v[i] != 0; break;
        }
    }
}

double test_decode(alloy_dtype dt, const void *src, int64_t i)
{
    uint32_t h = dt == F16 || dt == BF16 ? ((const uint16_t *)src)[i] : 0, e = (h >> 10) & 31, m = h & 1023;
    float f;
    switch (dt) {
    case F32: return ((const float *)src)[i];
    case F64: return ((const double *)src)[i];
    case F16:
        return (h & 0x8000 ? -1 : 1) *
               (e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, (int)e - 25));
    case BF16:
        h <<= 16;
        memcpy(&f, &h, 4);
        return f;
    case I32: return ((const int32_t *)src)[i];
    case I64: return (double)((const int64_t *)src)[i];
    default: return ((const uint8_t *)src)[i];
    }
}

/* ---- comparisons ---- */

double test_normalized_error(const double *got, const double *ref, int64_t n)
{
    double diff2 = 0, ref2 = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && isfinite(got[i])) diff2 += (got[i] - ref[i]) * (got[i] - ref[i]), ref2 += ref[i] * ref[i];
    return ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
}

bool test_close(const double *got, const double *ref, int64_t n, double tol, char *why, size_t len)
{
    double ref2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (isfinite(r) && isfinite(g)) ref2 += r * r;
        else if (!(isnan(r) && isnan(g)) && g != r) {
            snprintf(why, len, "element %lld is %.9g, expected %.9g", (long long)i, g, r);
            return false;
        }
    }
    double err = test_normalized_error(got, ref, n), rms = sqrt(ref2 / (double)(n ? n : 1));
    if (err > tol) {
        snprintf(why, len, "normalized error %.3g > %.3g", err, tol);
        return false;
    }
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs(got[i] - ref[i]) > 4 * tol * fmax(fabs(ref[i]), rms)) {
            snprintf(why, len, "element %lld is %.9g, expected %.9g", (long long)i, got[i], ref[i]);
            return false;
        }
    return true;
}

bool test_same_bits(alloy_dtype dt, const void *a, const void *b, int64_t n, int64_t *at)
{
    size_t size = alloy_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        const unsigned char *pa = (const unsigned char *)a + (size_t)i * size, *pb = (const unsigned char *)b + (size_t)i * size;
        if (memcmp(pa, pb, size) == 0) continue;
        if (ir_is_float(dt) && isnan(test_decode(dt, a, i)) && isnan(test_decode(dt, b, i))) continue;
        if (at) *at = i;
        return false;
    }
    return true;
}

/* ---- text ---- */

ir_graph *test_parse_ir(const char *text)
{
    char err[512] = "";
    ir_graph *g = ir_parse(text, strlen(text), "test.ir", err, sizeof err);
    if (!g) fail_msg("parse: %s", err);
    return g;
}

static char *next_buffer(void)
{
    static char bufs[8][128];
    static int next;
    return bufs[next++ % 8];
}

const char *test_dims_str(int rank, const int64_t *dims)
{
    char *b = next_buffer();
    al_fmt_dims(b, 128, rank, dims);
    return b;
}

const char *test_type_str(const ir_type *t)
{
    char *b = next_buffer();
    ir_fmt_type(b, 128, t);
    return b;
}

/* ---- cases that fail and go on ---- */

static int failures;

void test_case_failed(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    print_error("FAILED: %s\n", msg);
    failures++;
}

void test_forget_failed_cases(void) { failures = 0; }

void test_end_cases(void)
{
    int n = failures;
    failures = 0;
    if (n) fail_msg("%d case(s) failed, each reported above", n);
}

/* ---- files and time ---- */

bool test_make_dir(char *dir, size_t len, const char *template_path)
{
    snprintf(dir, len, "%s", template_path);
    return mkdtemp(dir) != NULL;
}

void test_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (remove(p) != 0) rmdir(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

const char *test_path_in(const char *dir, const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

unsigned char *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = test_malloc((size_t)size + 1);
    assert_int_equal(fread(p, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    p[size] = 0;
    *len = (size_t)size;
    return p;
}

char test_tmpdir[64];

int test_tmpdir_setup(void **state)
{
    (void)state;
    if (!test_make_dir(test_tmpdir, sizeof test_tmpdir, "/tmp/alloy-test-XXXXXX")) return -1;
    alloy_set_allocator(test_cmocka_realloc, NULL);
    return 0;
}

int test_tmpdir_teardown(void **state)
{
    (void)state;
    alloy_set_allocator(NULL, NULL);
    test_remove_dir(test_tmpdir);
    return 0;
}

const char *test_tmp_path(const char *name) { return test_path_in(test_tmpdir, name); }

double test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- state snapshots ---- */

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

void expect_ok(alloy_graph *g, alloy_status st, const char *what)
{
    if (st != ALLOY_OK) fail_msg("%s failed: %s: %s", what, alloy_status_name(st), alloy_last_error(g));
}
