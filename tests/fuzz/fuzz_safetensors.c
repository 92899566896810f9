/* fuzz_safetensors.c - libFuzzer target: a file through alloy_safetensors_load; what loads is read whole, found by name, saved and loaded back the same. */
#include <stdlib.h>
#include <string.h>

#include "alloy/safetensors.h"
#include "fuzz_support.h"

/* Checks t as the reader promises it: a name, a known dtype, a rank in
 * [0, ALLOY_MAX_RANK], data (never NULL), found by its name; returns its bytes. */
static size_t check_tensor(const alloy_safetensors *st, const alloy_host_tensor *t, int i)
{
    if (!t) fuzz_fail("tensor %d of %d is NULL", i, alloy_safetensors_count(st));
    if (!t->name || (unsigned)t->dtype >= ALLOY_DTYPE_COUNT || t->rank < 0 || t->rank > ALLOY_MAX_RANK || !t->data)
        fuzz_fail("tensor %d: name %p dtype %d rank %d data %p", i, (const void *)t->name, (int)t->dtype, t->rank,
                  t->data);
    int64_t n = alloy_host_tensor_numel(t);
    if (n < 0) fuzz_fail("tensor '%s': bad shape", t->name);
    if (alloy_safetensors_find(st, t->name) != t) fuzz_fail("find('%s') is not tensor %d", t->name, i);
    size_t bytes = (size_t)n * alloy_dtype_size(t->dtype);
    volatile uint64_t h = fuzz_hash(0, t->data, bytes); /* every byte readable */
    (void)h;
    return bytes;
}

/* Saves every tensor of st to a second file and loads it back: same names,
 * dtypes, shapes and bytes, in the same order. */
static void check_round_trip(const alloy_safetensors *st)
{
    int n = alloy_safetensors_count(st);
    alloy_host_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    if (!ts) return;
    for (int i = 0; i < n; i++) ts[i] = *alloy_safetensors_get(st, i);
    const char *path = fuzz_tmp_path("saved.safetensors");
    char err[512] = "";
    alloy_status s = alloy_safetensors_save(path, ts, n, NULL, NULL, 0, err, sizeof err);
    if (s) fuzz_fail("what loaded does not save: %s", err);
    alloy_safetensors *back = NULL;
    s = alloy_safetensors_load(path, &back, err, sizeof err);
    if (s) fuzz_fail("what saved does not load: %s", err);
    if (alloy_safetensors_count(back) != n) fuzz_fail("saved %d tensors, loaded %d", n, alloy_safetensors_count(back));
    for (int i = 0; i < n; i++) {
        const alloy_host_tensor *a = &ts[i], *b = alloy_safetensors_get(back, i);
        size_t bytes = (size_t)alloy_host_tensor_numel(a) * alloy_dtype_size(a->dtype);
        if (strcmp(a->name, b->name) != 0 || a->dtype != b->dtype || a->rank != b->rank ||
            memcmp(a->dims, b->dims, sizeof a->dims[0] * (size_t)a->rank) != 0 || memcmp(a->data, b->data, bytes) != 0)
            fuzz_fail("tensor %d ('%s') changed in a save and load", i, a->name);
    }
    alloy_safetensors_free(back);
    free(ts);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_tmp_path("input.safetensors");
    if (!fuzz_write_file(path, data, size)) fuzz_fail("cannot write %s", path);
    char err[512] = "";
    alloy_safetensors *st = NULL;
    alloy_status s = alloy_safetensors_load(path, &st, err, sizeof err);
    if (s) {
        if (st) fuzz_fail("a failed load returned an object");
        if (!err[0]) fuzz_fail("load failed (%s) without a message", alloy_status_name(s));
        return 0;
    }
    int n = alloy_safetensors_count(st);
    for (int i = 0; i < n; i++) check_tensor(st, alloy_safetensors_get(st, i), i);
    if (alloy_safetensors_get(st, n) || alloy_safetensors_get(st, -1)) fuzz_fail("get out of range is not NULL");
    volatile const char *m = alloy_safetensors_metadata(st, "format");
    (void)m;
    check_round_trip(st);
    alloy_safetensors_free(st);
    return 0;
}
