/* test_safetensors.c - safetensors reader and writer: round trips, the Python reference file, corrupt input, failed saves. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloy/safetensors.h"
#include "runtime/io/checksum.h"
#include "support.h"

#ifndef ALLOY_TEST_DATA
#error "build with -DALLOY_TEST_DATA=\"<source dir>/tests/data\""
#endif
#define REFERENCE ALLOY_TEST_DATA "/reference.safetensors"

/* ---- helpers ---- */

static char dir[64];
static char path[128];

static int setup(void **state)
{
    (void)state;
    /* memory-backed: these tests write thousands of files */
    if (!test_make_dir(dir, sizeof dir, "/dev/shm/alloy-st-XXXXXX") && !test_make_dir(dir, sizeof dir, "/tmp/alloy-st-XXXXXX"))
        return -1;
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    test_remove_dir(dir);
    return 0;
}

static void write_bytes(const char *p, const void *b, size_t n)
{
    unlink(p); /* rewriting in place makes ext4 flush on close (auto_da_alloc): slow */
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A file with the given header JSON (not padded) and data bytes. */
static void write_st(const char *p, const char *json, const void *data, size_t n)
{
    size_t hl = strlen(json);
    unsigned char *b = malloc(8 + hl + n + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    if (n) memcpy(b + 8 + hl, data, n);
    write_bytes(p, b, 8 + hl + n);
    free(b);
}

/* Files in dir whose name contains ".tmp." (left-over temporaries). */
static int temp_files(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

/* The file at path still holds exactly want[0..n), and no temporary is left. */
static void expect_unchanged(const unsigned char *want, size_t n)
{
    size_t len;
    unsigned char *b = test_read_file(path, &len);
    assert_int_equal(len, n);
    assert_memory_equal(b, want, n);
    test_free(b);
    assert_int_equal(temp_files(), 0);
}

/* Loading path fails with status (any failure if status is ALLOY_OK), and the
 * message names the file and contains each of the NULL-terminated strings. */
static void expect_load_fails(const char *p, alloy_status status, ...)
{
    alloy_safetensors *st = (alloy_safetensors *)1;
    char err[512];
    alloy_status s = alloy_safetensors_load(p, &st, err, sizeof err);
    if (s == ALLOY_OK) fail_msg("%s loaded but should not have", p);
    if (status != ALLOY_OK && s != status)
        fail_msg("%s: got status %s, wanted %s: %s", p, alloy_status_name(s), alloy_status_name(status), err);
    assert_null(st);
    if (strncmp(err, p, strlen(p)) != 0) fail_msg("message does not start with the path: %s", err);
    va_list ap;
    va_start(ap, status);
    for (const char *want; (want = va_arg(ap, const char *));)
        if (!strstr(err, want)) fail_msg("message lacks \"%s\": %s", want, err);
    va_end(ap);
}

static alloy_safetensors *load_ok(const char *p)
{
    alloy_safetensors *st = NULL;
    char err[512];
    alloy_status s = alloy_safetensors_load(p, &st, err, sizeof err);
    if (s != ALLOY_OK) fail_msg("load %s: %s", p, err);
    assert_non_null(st);
    return st;
}

static void save_ok(const char *p, const alloy_host_tensor *t, int n, const char *const *k,
                    const char *const *v, int nmeta)
{
    char err[512];
    alloy_status s = alloy_safetensors_save(p, t, n, k, v, nmeta, err, sizeof err);
    if (s != ALLOY_OK) fail_msg("save %s: %s", p, err);
}

static size_t tensor_bytes(const alloy_host_tensor *t)
{
    return (size_t)alloy_host_tensor_numel(t) * alloy_dtype_size(t->dtype);
}

static void expect_same_tensor(const alloy_host_tensor *got, const alloy_host_tensor *want)
{
    assert_non_null(got);
    assert_string_equal(got->name, want->name);
    assert_int_equal(got->dtype, want->dtype);
    assert_int_equal(got->rank, want->rank);
    for (int d = 0; d < want->rank; d++) assert_int_equal(got->dims[d], want->dims[d]);
    assert_non_null(got->data);
    assert_int_equal((uintptr_t)got->data % alloy_dtype_size(got->dtype), 0);
    if (tensor_bytes(want)) assert_memory_equal(got->data, want->data, tensor_bytes(want));
}

/* A fixed set of tensors: every dtype, rank 0, rank 8 and empty ones. */
#define NSAMPLE 11
static unsigned char sample_data[NSAMPLE][256];
static alloy_host_tensor sample[NSAMPLE];
static const char *const meta_keys[] = {"format", "note \"quoted\"", "empty", "unicode"};
static const char *const meta_values[] = {"pt", "line1\nline2\t\\", "", "\xc3\xa9t\xc3\xa9 \xe6\x97\xa5"};

static const alloy_host_tensor sample_spec[NSAMPLE] = {
    {"w.f32", ALLOY_F32, 2, {3, 4}, sample_data[0]},
    {"h.f16", ALLOY_F16, 1, {5}, sample_data[1]},
    {"b.bf16", ALLOY_BF16, 3, {2, 1, 3}, sample_data[2]},
    {"d.f64", ALLOY_F64, 1, {7}, sample_data[3]},
    {"i.i32", ALLOY_I32, 2, {2, 2}, sample_data[4]},
    {"l.i64", ALLOY_I64, 1, {3}, sample_data[5]},
    {"m.bool", ALLOY_BOOL, 1, {9}, sample_data[6]},
    {"scalar", ALLOY_F64, 0, {0}, sample_data[7]},
    {"rank8", ALLOY_BF16, 8, {1, 2, 1, 2, 1, 2, 1, 3}, sample_data[8]},
    {"empty", ALLOY_F32, 1, {0}, NULL}, /* allowed: no elements */
    {"empty3", ALLOY_I64, 3, {3, 0, 2}, sample_data[10]},
};

static void make_sample(void)
{
    memcpy(sample, sample_spec, sizeof sample);
    for (int i = 0; i < NSAMPLE; i++)
        for (size_t b = 0; b < sizeof sample_data[i]; b++)
            sample_data[i][b] = i == 6 ? (unsigned char)(b % 3 == 0) : (unsigned char)(b * 37 + (size_t)i * 11 + 1);
}

/* ---- round trips ---- */

static void test_every_dtype_round_trips_with_rank0_rank8_empty_tensors_and_metadata(void **state)
{
    (void)state;
    make_sample();
    save_ok(path, sample, NSAMPLE, meta_keys, meta_values, 4);
    alloy_safetensors *st = load_ok(path);
    assert_int_equal(alloy_safetensors_count(st), NSAMPLE);
    for (int i = 0; i < NSAMPLE; i++) {
        expect_same_tensor(alloy_safetensors_get(st, i), &sample[i]); /* file order */
        assert_ptr_equal(alloy_safetensors_find(st, sample[i].name), alloy_safetensors_get(st, i));
    }
    assert_null(alloy_safetensors_get(st, NSAMPLE));
    assert_null(alloy_safetensors_get(st, -1));
    assert_null(alloy_safetensors_find(st, "missing"));
    for (int i = 0; i < 4; i++) assert_string_equal(alloy_safetensors_metadata(st, meta_keys[i]), meta_values[i]);
    assert_null(alloy_safetensors_metadata(st, "missing"));
    alloy_safetensors_free(st);
    assert_int_equal(temp_files(), 0);
}

static void test_saved_file_has_padded_header_and_contiguous_offsets(void **state)
{
    (void)state;
    make_sample();
    save_ok(path, sample, 3, NULL, NULL, 0);
    size_t len;
    unsigned char *b = test_read_file(path, &len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    assert_int_equal(n % 8, 0);
    assert_int_equal(len, 8 + n + 48 + 10 + 12);
    const char *want = "{\"w.f32\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]},"
                       "\"h.f16\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[48,58]},"
                       "\"b.bf16\":{\"dtype\":\"BF16\",\"shape\":[2,1,3],\"data_offsets\":[58,70]}}";
    assert_memory_equal(b + 8, want, strlen(want));
    for (size_t i = strlen(want); i < n; i++) assert_int_equal(b[8 + i], ' ');
    assert_memory_equal(b + 8 + n, sample_data[0], 48);
    test_free(b);
}

static void test_names_that_need_json_escapes_round_trip(void **state)
{
    (void)state;
    static float v[6] = {1, 2, 3, 4, 5, 6};
    const char *names[6] = {"q\"uote", "back\\slash", "new\nline", "ctl\x01\x1f", "\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80", ""};
    alloy_host_tensor t[6];
    for (int i = 0; i < 6; i++) t[i] = (alloy_host_tensor){names[i], ALLOY_F32, 1, {1}, &v[i]};
    save_ok(path, t, 6, NULL, NULL, 0);
    alloy_safetensors *st = load_ok(path);
    for (int i = 0; i < 6; i++) expect_same_tensor(alloy_safetensors_find(st, names[i]), &t[i]);
    alloy_safetensors_free(st);
}

static void test_zero_tensors_with_and_without_metadata_round_trip(void **state)
{
    (void)state;
    save_ok(path, NULL, 0, NULL, NULL, 0);
    alloy_safetensors *st = load_ok(path);
    assert_int_equal(alloy_safetensors_count(st), 0);
    assert_null(alloy_safetensors_find(st, "x"));
    alloy_safetensors_free(st);
    save_ok(path, NULL, 0, meta_keys, meta_values, 1);
    st = load_ok(path);
    assert_string_equal(alloy_safetensors_metadata(st, "format"), "pt");
    alloy_safetensors_free(st);
}

static void test_tensors_stored_out_of_header_order_load_and_stay_aligned(void **state)
{
    (void)state;
    unsigned char data[1 + 8 + 2 + 1];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)i;
    /* "d" is at an odd offset; the reader must hand out aligned memory. */
    write_st(path,
             "  {\"c\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[9,11]},"
             "\"d\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[1,9]},\"__metadata__\":null,"
             "\"z\":{\"shape\":[0,5],\"data_offsets\":[11,11],\"dtype\":\"I32\",\"extra\":[1]},"
             "\"a\":{\"dtype\":\"BOOL\",\"shape\":[1,1],\"data_offsets\":[0,1]},"
             "\"e\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[11,12]}} \t\r\n",
             data, sizeof data);
    alloy_safetensors *st = load_ok(path);
    assert_int_equal(alloy_safetensors_count(st), 5);
    assert_string_equal(alloy_safetensors_get(st, 0)->name, "c");
    assert_string_equal(alloy_safetensors_get(st, 3)->name, "a");
    const alloy_host_tensor *d = alloy_safetensors_find(st, "d");
    assert_int_equal((uintptr_t)d->data % 8, 0);
    assert_memory_equal(d->data, data + 1, 8);
    assert_memory_equal(alloy_safetensors_find(st, "c")->data, data + 9, 2);
    assert_memory_equal(alloy_safetensors_find(st, "e")->data, data + 11, 1);
    assert_int_equal(alloy_safetensors_find(st, "z")->rank, 2);
    alloy_safetensors_free(st);
}

/* ---- the file written by Python's safetensors ---- */

/* What make_reference_safetensors.py writes. */
static const float ref_f32[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, ref_scalar = 3.5f;
static const uint16_t ref_f16[7] = {0x0000, 0x3C00, 0xC000, 0x3800, 0x7BFF, 0xFC00, 0x0001};
static const uint16_t ref_bf16[4] = {0x3F80, 0xC000, 0x4049, 0x7F80};
static const double ref_f64[4] = {1.5, -2.25, 1e300, -0.0};
static const int32_t ref_i32[4] = {INT32_MIN, -1, 0, INT32_MAX};
static const int64_t ref_i64[4] = {INT64_MIN, -1, (int64_t)1 << 40, INT64_MAX};
static const unsigned char ref_bool[5] = {1, 0, 1, 1, 0};
static const alloy_host_tensor reference[9] = {
    {"arange_f32", ALLOY_F32, 2, {3, 4}, (void *)ref_f32},
    {"half_f16", ALLOY_F16, 1, {7}, (void *)ref_f16},
    {"bits_bf16", ALLOY_BF16, 1, {4}, (void *)ref_bf16},
    {"wide_f64", ALLOY_F64, 2, {2, 2}, (void *)ref_f64},
    {"ints_i32", ALLOY_I32, 1, {4}, (void *)ref_i32},
    {"ints_i64", ALLOY_I64, 3, {2, 1, 2}, (void *)ref_i64},
    {"mask_bool", ALLOY_BOOL, 1, {5}, (void *)ref_bool},
    {"scalar_f32", ALLOY_F32, 0, {0}, (void *)&ref_scalar},
    {"empty_i64", ALLOY_I64, 2, {0, 3}, NULL},
};

static void check_reference(const alloy_safetensors *st)
{
    assert_int_equal(alloy_safetensors_count(st), 9);
    for (int i = 0; i < 9; i++) expect_same_tensor(alloy_safetensors_find(st, reference[i].name), &reference[i]);
    assert_string_equal(alloy_safetensors_metadata(st, "format"), "np");
    assert_string_equal(alloy_safetensors_metadata(st, "source"), "alloy reference fixture");
}

static void test_file_written_by_python_safetensors_loads_with_every_value(void **state)
{
    (void)state;
    alloy_safetensors *st = load_ok(REFERENCE);
    check_reference(st);
    /* and what we write from it reads back the same */
    int n = alloy_safetensors_count(st);
    alloy_host_tensor t[16];
    for (int i = 0; i < n; i++) t[i] = *alloy_safetensors_get(st, i);
    const char *k[2] = {"format", "source"};
    const char *v[2] = {alloy_safetensors_metadata(st, "format"), alloy_safetensors_metadata(st, "source")};
    save_ok(path, t, n, k, v, 2);
    alloy_safetensors *again = load_ok(path);
    check_reference(again);
    alloy_safetensors_free(again);
    alloy_safetensors_free(st);
}

/* ---- rejection ---- */

static void test_file_truncated_at_every_length_fails_cleanly(void **state)
{
    (void)state;
    make_sample();
    save_ok(path, sample, NSAMPLE, meta_keys, meta_values, 4);
    char cut[160];
    snprintf(cut, sizeof cut, "%s/cut.safetensors", dir);
    const char *sources[2] = {path, REFERENCE};
    for (int s = 0; s < 2; s++) {
        size_t len;
        unsigned char *b = test_read_file(sources[s], &len);
        for (size_t n = 0; n < len; n++) {
            write_bytes(cut, b, n);
            expect_load_fails(cut, ALLOY_OK, NULL);
        }
        b[len] = 0; /* one byte too many is as bad */
        write_bytes(cut, b, len + 1);
        expect_load_fails(cut, ALLOY_ERR_FORMAT, "cover only", NULL);
        test_free(b);
    }
    write_bytes(cut, "abc", 3);
    expect_load_fails(cut, ALLOY_ERR_FORMAT, "too short", NULL);
}

static void test_corrupt_header_lengths_are_rejected(void **state)
{
    (void)state;
    unsigned char b[64] = {0};
    memcpy(b + 8, "{}      ", 8);
    b[0] = 0x00, b[1] = 0xe2, b[2] = 0xf5, b[3] = 0x05; /* 100000256 */
    write_bytes(path, b, 16);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "header length 100000256 exceeds the limit", NULL);
    memset(b, 0xff, 8);
    write_bytes(path, b, 16);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "exceeds the limit", NULL);
    memset(b, 0, 8);
    b[0] = 9;
    write_bytes(path, b, 16);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "header length 9 runs past the end of the 16-byte file", NULL);
    b[0] = 0;
    write_bytes(path, b, 16);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "header JSON", "at byte 0", NULL);
}

static void test_malformed_json_is_rejected_with_its_byte_offset(void **state)
{
    (void)state;
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\" \"shape\":[1]}}", "at byte 20 of the header (file offset 28)"},
        {"{\"a\":", "unexpected end"},
        {"{\"a\" 1}", "expected ':'"},
        {"{a:1}", "expected a string key"},
        {"{\"a\":tru}", "invalid literal"},
        {"{\"a\":01}", "expected ',' or '}'"},
        {"{\"a\":1.}", "digit after '.'"},
        {"{\"a\":\"x\\q\"}", "invalid escape"},
        {"{\"a\":\"\\ud800\"}", "surrogate"},
        {"{\"a\":\"\x01\"}", "control character"},
        {"{\"a\":\"\xc3\x28\"}", "invalid UTF-8"},
        {"{\"a\":\"unterminated}", "unterminated string"},
        {"{}\0\0", "trailing characters"},
        {"{}x", "trailing characters after the JSON value at byte 2"},
        {"[]", "not an object"},
        {"", "unexpected end"},
        {"{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
         "nesting"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t hl = strlen(cases[i].json) + (strcmp(cases[i].json, "{}") == 0 ? 2 : 0); /* the NULs */
        unsigned char b[256] = {0};
        b[0] = (unsigned char)hl;
        memcpy(b + 8, cases[i].json, hl);
        write_bytes(path, b, 8 + hl);
        expect_load_fails(path, ALLOY_ERR_FORMAT, "header JSON", cases[i].want, NULL);
    }
}

static void test_unsupported_and_unknown_dtypes_are_rejected_by_name(void **state)
{
    (void)state;
    static const char *dtypes[] = {"I8", "U8", "F8_E4M3", "U64"};
    char json[200], want[64];
    for (size_t i = 0; i < 4; i++) {
        snprintf(json, sizeof json, "{\"w1\":{\"dtype\":\"%s\",\"shape\":[1],\"data_offsets\":[0,1]}}", dtypes[i]);
        write_st(path, json, "x", 1);
        snprintf(want, sizeof want, "dtype %s is not supported", dtypes[i]);
        expect_load_fails(path, ALLOY_ERR_UNSUPPORTED, "tensor 'w1'", want, NULL);
    }
    write_st(path, "{\"w1\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", "xxxx", 4);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "tensor 'w1'", "unknown dtype \"f32\"", NULL);
    write_st(path, "{\"w1\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", "xxxx", 4);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "\"dtype\" is not a string", NULL);
}

static void test_bad_offsets_and_sizes_are_rejected(void **state)
{
    (void)state;
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"w1\":{\"dtype\":\"F32\",\"shape\":[4,8],\"data_offsets\":[0,100]}}",
         "tensor 'w1': data_offsets [0, 100) do not match shape [4,8] x f32 = 128 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
         "tensor 'b': data_offsets [8, 24) overlap tensor 'a' [0, 16)"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[16,48]}}", "lie outside the 32-byte data buffer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}", "bytes [0, 16) of the data buffer belong to no tensor"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", "has 32 bytes but the tensors cover only 16"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[16,8]}}", "end before they begin"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", "not an array [begin, end]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", "not an array [begin, end]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", "data_offsets begin is negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", "data_offsets end is not a number"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551620]}}", "data_offsets end is too large"},
    };
    unsigned char data[100] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_st(path, cases[i].json, data, i == 0 ? 100 : 32); /* w1 gets its 100 bytes */
        expect_load_fails(path, ALLOY_ERR_FORMAT, cases[i].want, NULL);
    }
}

static void test_bad_shapes_are_rejected(void **state)
{
    (void)state;
    static const struct {
        const char *shape, *want;
        alloy_status status;
    } cases[] = {
        {"[-1]", "shape[0] is negative (-1)", ALLOY_ERR_FORMAT},
        {"[2,1.5]", "shape[1] is not an integer (1.5)", ALLOY_ERR_FORMAT},
        {"[1e2]", "shape[0] is not an integer", ALLOY_ERR_FORMAT},
        {"[99999999999999999999]", "shape[0] is too large", ALLOY_ERR_FORMAT},
        {"[4294967296,4294967296]", "shape [4294967296,4294967296] x f32 overflows", ALLOY_ERR_FORMAT},
        {"[2305843009213693952]", "x f32 overflows", ALLOY_ERR_FORMAT},
        {"[1,1,1,1,1,1,1,1,1]", "rank 9 exceeds the maximum of 8", ALLOY_ERR_UNSUPPORTED},
        {"7", "\"shape\" is not an array", ALLOY_ERR_FORMAT},
        {"[null]", "shape[0] is not a number", ALLOY_ERR_FORMAT},
    };
    char json[200];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(json, sizeof json, "{\"t\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[0,4]}}", cases[i].shape);
        write_st(path, json, "abcd", 4);
        expect_load_fails(path, cases[i].status, "tensor 't'", cases[i].want, NULL);
    }
}

static void test_duplicate_names_keys_and_fields_are_rejected(void **state)
{
    (void)state;
    write_st(path, "{\"a\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]},"
                   "\"a\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[1,2]}}", "xy", 2);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "tensor 'a' appears twice", NULL);
    write_st(path, "{\"__metadata__\":{},\"__metadata__\":{}}", "", 0);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "\"__metadata__\" appears twice", NULL);
    write_st(path, "{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"3\"}}", "", 0);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "metadata key 'k' appears twice", NULL);
    write_st(path, "{\"a\":{\"dtype\":\"BOOL\",\"shape\":[1],\"shape\":[1],\"data_offsets\":[0,1]}}", "x", 1);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "tensor 'a': field \"shape\" appears twice", NULL);
}

static void test_missing_fields_and_bad_entries_are_rejected(void **state)
{
    (void)state;
    write_st(path, "{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", "x", 1);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "tensor 'a': missing field \"dtype\"", NULL);
    write_st(path, "{\"a\":{\"dtype\":\"BOOL\",\"data_offsets\":[0,1]}}", "x", 1);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "missing field \"shape\"", NULL);
    write_st(path, "{\"a\":{\"dtype\":\"BOOL\",\"shape\":[1]}}", "x", 1);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "missing field \"data_offsets\"", NULL);
    write_st(path, "{\"a\":[1]}", "", 0);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "tensor 'a': entry is not a JSON object", NULL);
    write_st(path, "{\"__metadata__\":{\"k\":1}}", "", 0);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "metadata 'k': value is not a string", NULL);
    write_st(path, "{\"__metadata__\":[]}", "", 0);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "\"__metadata__\" is not an object", NULL);
    write_st(path, "{\"a\\u0000b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x", 1);
    expect_load_fails(path, ALLOY_ERR_FORMAT, "NUL character", NULL);
}

static void test_missing_files_directories_and_null_arguments_are_rejected(void **state)
{
    (void)state;
    char p[160];
    snprintf(p, sizeof p, "%s/nope.safetensors", dir);
    expect_load_fails(p, ALLOY_ERR_IO, "cannot open", NULL);
    expect_load_fails(dir, ALLOY_ERR_IO, "cannot read: it is a directory, not a regular file", NULL);
    alloy_safetensors *st;
    char err[128];
    assert_int_equal(alloy_safetensors_load(NULL, &st, err, sizeof err), ALLOY_ERR_INVALID);
    assert_true(err[0] != '\0');
    assert_int_equal(alloy_safetensors_load(REFERENCE, NULL, err, sizeof err), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_safetensors_load(p, &st, NULL, 0), ALLOY_ERR_IO); /* no message wanted */
    assert_int_equal(alloy_safetensors_count(NULL), 0);
    assert_null(alloy_safetensors_find(NULL, "a"));
    alloy_safetensors_free(NULL);
}

/* Flipping bits anywhere in a valid file never crashes the reader. */
static void test_corrupted_bytes_anywhere_never_crash_the_reader(void **state)
{
    (void)state;
    size_t len;
    unsigned char *b = test_read_file(REFERENCE, &len);
    static const unsigned char flips[] = {0x01, 0x80, 0xff};
    for (size_t i = 0; i < len; i++) {
        for (size_t f = 0; f < sizeof flips; f++) {
            b[i] ^= flips[f];
            write_bytes(path, b, len);
            alloy_safetensors *st = NULL;
            char err[512] = "";
            if (alloy_safetensors_load(path, &st, err, sizeof err) == ALLOY_OK) {
                for (int t = 0; t < alloy_safetensors_count(st); t++) assert_non_null(alloy_safetensors_get(st, t)->data);
                alloy_safetensors_free(st);
            } else {
                assert_null(st);
                assert_true(err[0] != '\0');
            }
            b[i] ^= flips[f];
        }
    }
    test_free(b);
}

/* ---- saving ---- */

static void expect_save_fails(alloy_status status, const alloy_host_tensor *t, int n, const char *want)
{
    char err[512];
    alloy_status s = alloy_safetensors_save(path, t, n, NULL, NULL, 0, err, sizeof err);
    if (s != status) fail_msg("got %s, wanted %s: %s", alloy_status_name(s), alloy_status_name(status), err);
    if (!strstr(err, want)) fail_msg("message lacks \"%s\": %s", want, err);
}

static void test_save_rejects_bad_tensors_and_leaves_the_old_file(void **state)
{
    (void)state;
    make_sample();
    save_ok(path, sample, 2, NULL, NULL, 0);
    size_t len0;
    unsigned char *before = test_read_file(path, &len0);
    static const char *const wants[] = {
        "tensor name 'w.f32' appears twice", "tensor 'h.f16' (f16 [5], dtype value 1): data is NULL",
        "(? [5], dtype value 7): dtype is not an alloy_dtype value", "rank outside", "negative dim", "tensor #1 has a NULL name", "reserved",
        "not valid UTF-8"};
    for (int c = 0; c < 8; c++) {
        alloy_host_tensor t[2] = {sample[0], sample[1]};
        switch (c) {
        case 0: t[1].name = t[0].name; break;
        case 1: t[1].data = NULL; break;
        case 2: t[1].dtype = ALLOY_DTYPE_COUNT; break;
        case 3: t[1].rank = 9; break;
        case 4: t[1].dims[0] = -5; break;
        case 5: t[1].name = NULL; break;
        case 6: t[1].name = "__metadata__"; break;
        default: t[1].name = "bad\xff"; break;
        }
        expect_save_fails(ALLOY_ERR_INVALID, t, 2, wants[c]);
    }
    char err[256];
    const char *k[2] = {"x", "x"}, *v[2] = {"1", "2"};
    assert_int_equal(alloy_safetensors_save(path, sample, 1, k, v, 2, err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "metadata key 'x' appears twice"));
    assert_int_equal(alloy_safetensors_save(NULL, sample, 1, NULL, NULL, 0, err, sizeof err), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_safetensors_save(path, NULL, 1, NULL, NULL, 0, err, sizeof err), ALLOY_ERR_INVALID);
    expect_unchanged(before, len0);
    test_free(before);
}

static void test_failed_saves_leave_the_previous_file_byte_identical(void **state)
{
    (void)state;
    make_sample();
    save_ok(path, sample, 3, NULL, NULL, 0);
    size_t len0;
    unsigned char *before = test_read_file(path, &len0);
    char err[512], p[200];

    snprintf(p, sizeof p, "%s/no/such/dir/t.safetensors", dir);
    assert_int_equal(alloy_safetensors_save(p, sample, NSAMPLE, NULL, NULL, 0, err, sizeof err), ALLOY_ERR_IO);
    assert_non_null(strstr(err, p));

    snprintf(p, sizeof p, "%s/subdir", dir); /* a directory is refused before anything is written */
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(alloy_safetensors_save(p, sample, NSAMPLE, NULL, NULL, 0, err, sizeof err), ALLOY_ERR_IO);
    assert_non_null(strstr(err, "subdir: is a directory, not a regular file"));
    assert_int_equal(temp_files(), 0);

    /* A write that fails half way (file size limit). */
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 200;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    alloy_status s = alloy_safetensors_save(path, sample, NSAMPLE, NULL, NULL, 0, err, sizeof err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    assert_int_equal(s, ALLOY_ERR_IO);
    assert_non_null(strstr(err, "write"));
    expect_unchanged(before, len0);
    test_free(before);
}

/* ---- allocation failures ---- */

static struct {
    long attempts, fail_at, allocs, frees;
} hook;

static void *failing_realloc(void *p, size_t size, void *user)
{
    (void)user;
    if (size == 0) {
        if (p) hook.frees++;
        free(p);
        return NULL;
    }
    if (hook.attempts++ == hook.fail_at) return NULL;
    void *q = realloc(p, size);
    if (q && !p) hook.allocs++;
    return q;
}

static void arm(long k)
{
    hook.attempts = hook.allocs = hook.frees = 0;
    hook.fail_at = k;
    alloy_set_allocator(failing_realloc, NULL);
}

static void test_allocation_failure_anywhere_in_load_is_clean_and_leak_free(void **state)
{
    (void)state;
    const char *files[2] = {REFERENCE, path};
    make_sample();
    save_ok(path, sample, NSAMPLE, meta_keys, meta_values, 4);
    for (int f = 0; f < 2; f++) {
        long k;
        for (k = 0; k < 1000; k++) {
            alloy_safetensors *st = NULL;
            char err[512] = "";
            arm(k);
            alloy_status s = alloy_safetensors_load(files[f], &st, err, sizeof err);
            if (s == ALLOY_OK) alloy_safetensors_free(st);
            alloy_set_allocator(NULL, NULL);
            assert_int_equal(hook.allocs, hook.frees);
            if (s == ALLOY_OK) break;
            if (s != ALLOY_ERR_OOM) fail_msg("failing allocation %ld: got %s: %s", k, alloy_status_name(s), err);
            assert_null(st);
            assert_non_null(strstr(err, "out of memory"));
        }
        assert_true(k >= 4 && k < 1000);
    }
}

static void test_allocation_failure_anywhere_in_save_is_clean_and_leak_free(void **state)
{
    (void)state;
    make_sample();
    save_ok(path, sample, 2, NULL, NULL, 0);
    size_t len0;
    unsigned char *before = test_read_file(path, &len0);
    long k;
    for (k = 0; k < 1000; k++) {
        char err[512] = "";
        arm(k);
        alloy_status s = alloy_safetensors_save(path, sample, NSAMPLE, meta_keys, meta_values, 4, err, sizeof err);
        alloy_set_allocator(NULL, NULL);
        assert_int_equal(hook.allocs, hook.frees);
        if (s == ALLOY_OK) break;
        if (s != ALLOY_ERR_OOM) fail_msg("failing allocation %ld: got %s: %s", k, alloy_status_name(s), err);
        assert_non_null(strstr(err, "out of memory"));
        expect_unchanged(before, len0);
    }
    assert_true(k >= 3 && k < 1000);
    alloy_safetensors *st = load_ok(path);
    assert_int_equal(alloy_safetensors_count(st), NSAMPLE);
    alloy_safetensors_free(st);
    test_free(before);
}

/* CRC-32 bit by bit (reflected, polynomial 0xedb88320, zlib's): the
 * reference for the eight-bytes-at-a-time one. */
static uint32_t crc32_bitwise(uint32_t crc, const void *p, size_t n)
{
    const unsigned char *b = p;
    crc = ~crc;
    while (n--) {
        crc ^= *b++;
        for (int k = 0; k < 8; k++) crc = crc & 1 ? (crc >> 1) ^ 0xedb88320u : crc >> 1;
    }
    return ~crc;
}

/* The checkpoint checksum (docs/training.md) is zlib's CRC-32 of, per
 * tensor in name order, "name\0DTYPE\0d0,d1\0" and the data: checked
 * against the standard check value, against the bitwise CRC at every
 * length and alignment the sliced loop has tails for, and against the
 * canonical bytes written out here; the file order of the tensors does not
 * change it, one flipped bit does. */
static void test_the_checkpoint_checksum_is_zlib_crc32_of_the_tensors_in_name_order(void **state)
{
    (void)state;
    io_crc c;
    io_crc_init(&c);
    io_crc_add(&c, "123456789", 9);
    assert_int_equal(io_crc_value(&c), 0xcbf43926u); /* CRC-32's check value */
    unsigned char bytes[64];
    for (int i = 0; i < 64; i++) bytes[i] = (unsigned char)(i * 37 + 11);
    for (int from = 0; from < 8; from++)
        for (int len = 0; from + len <= 64; len++) {
            io_crc_init(&c);
            io_crc_add(&c, bytes + from, (size_t)len);
            if (io_crc_value(&c) != crc32_bitwise(0, bytes + from, (size_t)len))
                fail_msg("CRC of %d bytes from %d: %08x, bitwise %08x", len, from, io_crc_value(&c),
                         crc32_bitwise(0, bytes + from, (size_t)len));
        }
    float w[6] = {1, -2, 0.5f, 3, 4, -8};
    int32_t step = 7;
    alloy_host_tensor ts[2] = {{"w", ALLOY_F32, 2, {2, 3}, w}, {"optim.step", ALLOY_I32, 0, {0}, &step}};
    const alloy_host_tensor *order[2] = {&ts[0], &ts[1]}, *swapped[2] = {&ts[1], &ts[0]};
    char sum[IO_CHECKSUM_LEN], sum2[IO_CHECKSUM_LEN], want[IO_CHECKSUM_LEN];
    assert_int_equal(io_tensors_checksum(order, 2, sum), ALLOY_OK);
    assert_int_equal(io_tensors_checksum(swapped, 2, sum2), ALLOY_OK);
    uint32_t crc = crc32_bitwise(0, "optim.step\0I32\0\0", 16); /* "optim.step" < "w" */
    crc = crc32_bitwise(crc, &step, 4);
    crc = crc32_bitwise(crc, "w\0F32\0" "2,3\0", 10);
    crc = crc32_bitwise(crc, w, sizeof w);
    snprintf(want, sizeof want, "crc32:%08x", crc);
    assert_string_equal(sum, want);
    assert_string_equal(sum2, want);
    w[4] = 4.0000005f; /* one bit of one value */
    assert_int_equal(io_tensors_checksum(order, 2, sum2), ALLOY_OK);
    assert_string_not_equal(sum2, want);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_every_dtype_round_trips_with_rank0_rank8_empty_tensors_and_metadata),
        T(test_saved_file_has_padded_header_and_contiguous_offsets),
        T(test_names_that_need_json_escapes_round_trip),
        T(test_zero_tensors_with_and_without_metadata_round_trip),
        T(test_tensors_stored_out_of_header_order_load_and_stay_aligned),
        T(test_file_written_by_python_safetensors_loads_with_every_value),
        T(test_file_truncated_at_every_length_fails_cleanly),
        T(test_corrupt_header_lengths_are_rejected),
        T(test_malformed_json_is_rejected_with_its_byte_offset),
        T(test_unsupported_and_unknown_dtypes_are_rejected_by_name),
        T(test_bad_offsets_and_sizes_are_rejected),
        T(test_bad_shapes_are_rejected),
        T(test_duplicate_names_keys_and_fields_are_rejected),
        T(test_missing_fields_and_bad_entries_are_rejected),
        T(test_missing_files_directories_and_null_arguments_are_rejected),
        T(test_corrupted_bytes_anywhere_never_crash_the_reader),
        T(test_save_rejects_bad_tensors_and_leaves_the_old_file),
        T(test_failed_saves_leave_the_previous_file_byte_identical),
        T(test_allocation_failure_anywhere_in_load_is_clean_and_leak_free),
        T(test_allocation_failure_anywhere_in_save_is_clean_and_leak_free),
        T(test_the_checkpoint_checksum_is_zlib_crc32_of_the_tensors_in_name_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
