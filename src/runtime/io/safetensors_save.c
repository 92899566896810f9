/* safetensors_save.c - write tensors as a safetensors file, atomically (base/file.h: temporary file, fsync, rename over the real file). */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/safetensors.h"
#include "base/file.h"
#include "runtime/io/json.h"

#define NAME_FMT "%.80s" /* names in messages are cut to keep the message readable */

/* The format spells alloy's dtypes in capitals: f32 is "F32", bool is "BOOL". */
static void spelling(alloy_dtype dtype, char out[8])
{
    const char *s = alloy_dtype_name(dtype);
    size_t i = 0;
    for (; s[i] && i < 7; i++) out[i] = (char)toupper((unsigned char)s[i]);
    out[i] = '\0';
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

typedef struct buf {
    char *p;
    size_t len, cap;
    bool oom;
} buf;

static void put(buf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        char *p = al_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void put_str(buf *b, const char *s) { put(b, s, strlen(s)); }

static void put_i64(buf *b, int64_t v)
{
    char tmp[32];
    al_fmt(tmp, sizeof tmp, "%" PRId64, v);
    put_str(b, tmp);
}

/* s as a JSON string literal: quotes, backslashes and control bytes escaped. */
static void put_json_string(buf *b, const char *s)
{
    put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        if (*c == '"' || *c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*c;
            put(b, esc, 2);
        } else if (*c < 0x20) {
            const char *named = *c == '\n' ? "\\n" : *c == '\t' ? "\\t" : *c == '\r' ? "\\r" : NULL;
            if (named) put_str(b, named);
            else {
                al_fmt(esc, sizeof esc, "\\u%04x", *c);
                put_str(b, esc);
            }
        } else {
            put(b, (const char *)c, 1);
        }
    }
    put(b, "\"", 1);
}

/* Checks every tensor and metadata pair; names and keys unique and UTF-8. */
static alloy_status check_save_args(const char *path, const alloy_host_tensor *tensors, int n,
                                    const char *const *keys, const char *const *values, int nmeta,
                                    char *err, size_t errlen)
{
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        const alloy_host_tensor *t = &tensors[i];
        if (!t->name) {
            al_fmt(err, errlen, "%s: tensor #%d has a NULL name", path, i);
            return ALLOY_ERR_INVALID;
        }
        const char *why = NULL;
        char dims[200];
        int64_t numel = -1, esize = (int64_t)alloy_dtype_size(t->dtype);
        if (!al_utf8_valid(t->name, strlen(t->name), NULL)) why = "name is not valid UTF-8";
        else if (strcmp(t->name, "__metadata__") == 0) why = "the name is reserved for metadata";
        else if ((unsigned)t->dtype >= ALLOY_DTYPE_COUNT) why = "dtype is not an alloy_dtype value";
        else if (t->rank < 0 || t->rank > ALLOY_MAX_RANK) why = "rank outside [0, 8]";
        else if ((numel = al_numel(t->rank, t->dims)) < 0) why = "negative dim or too many elements";
        else if (numel > INT64_MAX / esize) why = "byte size overflows";
        else if (numel > 0 && !t->data) why = "data is NULL";
        else if (numel * esize > INT64_MAX - total) why = "the file would exceed 2^63 bytes";
        if (why) {
            if (t->rank >= 0 && t->rank <= ALLOY_MAX_RANK) al_fmt_dims(dims, sizeof dims, t->rank, t->dims);
            else al_fmt(dims, sizeof dims, "(rank %d)", t->rank);
            al_fmt(err, errlen, "%s: tensor '" NAME_FMT "' (%s %s, dtype value %d): %s", path,
                    t->name, alloy_dtype_name(t->dtype), dims, (int)t->dtype, why);
            return ALLOY_ERR_INVALID;
        }
        total += numel * esize;
    }
    for (int i = 0; i < nmeta; i++) {
        if (!keys[i] || !values[i]) {
            al_fmt(err, errlen, "%s: metadata pair #%d has a NULL %s", path, i,
                    keys[i] ? "value" : "key");
            return ALLOY_ERR_INVALID;
        }
        if (!al_utf8_valid(keys[i], strlen(keys[i]), NULL) ||
            !al_utf8_valid(values[i], strlen(values[i]), NULL)) {
            al_fmt(err, errlen, "%s: metadata '" NAME_FMT "': not valid UTF-8", path, keys[i]);
            return ALLOY_ERR_INVALID;
        }
    }
    size_t most = (size_t)(n > nmeta ? n : nmeta);
    if (!most) return ALLOY_OK;
    const char **sorted = al_malloc(most * sizeof *sorted);
    if (!sorted) {
        al_fmt(err, errlen, "%s: out of memory while saving", path);
        return ALLOY_ERR_OOM;
    }
    alloy_status s = ALLOY_OK;
    for (int pass = 0; pass < 2 && !s; pass++) {
        int m = pass ? nmeta : n;
        for (int i = 0; i < m; i++) sorted[i] = pass ? keys[i] : tensors[i].name;
        qsort(sorted, (size_t)m, sizeof *sorted, cmp_str_ptr);
        for (int i = 1; i < m; i++) {
            if (strcmp(sorted[i - 1], sorted[i]) == 0) {
                al_fmt(err, errlen, "%s: %s '" NAME_FMT "' appears twice", path,
                        pass ? "metadata key" : "tensor name", sorted[i]);
                s = ALLOY_ERR_INVALID;
                break;
            }
        }
    }
    al_free(sorted);
    return s;
}

/* The JSON header, padded with spaces to a multiple of 8 bytes. */
static void build_header(buf *b, const alloy_host_tensor *tensors, int n, const char *const *keys,
                         const char *const *values, int nmeta)
{
    put_str(b, "{");
    if (nmeta) {
        put_str(b, "\"__metadata__\":{");
        for (int i = 0; i < nmeta; i++) {
            if (i) put_str(b, ",");
            put_json_string(b, keys[i]);
            put_str(b, ":");
            put_json_string(b, values[i]);
        }
        put_str(b, "}");
    }
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        const alloy_host_tensor *t = &tensors[i];
        int64_t bytes = alloy_host_tensor_numel(t) * (int64_t)alloy_dtype_size(t->dtype);
        if (i || nmeta) put_str(b, ",");
        put_json_string(b, t->name);
        put_str(b, ":{\"dtype\":\"");
        char dt[8];
        spelling(t->dtype, dt);
        put_str(b, dt);
        put_str(b, "\",\"shape\":[");
        for (int d = 0; d < t->rank; d++) {
            if (d) put_str(b, ",");
            put_i64(b, t->dims[d]);
        }
        put_str(b, "],\"data_offsets\":[");
        put_i64(b, at);
        put_str(b, ",");
        put_i64(b, at + bytes);
        put_str(b, "]}");
        at += bytes;
    }
    put_str(b, "}");
    put(b, "       ", (8 - b->len % 8) % 8);
}

/* Checks everything first (nothing touched on a bad argument), then writes atomically. */
alloy_status alloy_safetensors_save(const char *path, const alloy_host_tensor *tensors, int n,
                                    const char *const *meta_keys, const char *const *meta_values,
                                    int nmeta, char *err, size_t errlen)
{
    al_fmt(err, errlen, "%s", "");
    const char *why = !path                                       ? "path is NULL"
                      : n < 0 || nmeta < 0                        ? "negative count"
                      : n > 0 && !tensors                         ? "tensors is NULL"
                      : nmeta > 0 && (!meta_keys || !meta_values) ? "metadata arrays are NULL"
                                                                  : NULL;
    if (why) {
        al_fmt(err, errlen, "%s: alloy_safetensors_save: %s", path ? path : "(null)", why);
        return ALLOY_ERR_INVALID;
    }
    alloy_status s = check_save_args(path, tensors, n, meta_keys, meta_values, nmeta, err, errlen);
    if (s) return s;
    buf header = {0};
    build_header(&header, tensors, n, meta_keys, meta_values, nmeta);
    if (header.oom) {
        al_free(header.p);
        al_fmt(err, errlen, "%s: out of memory while saving", path);
        return ALLOY_ERR_OOM;
    }
    /* the parts of the file: the header's length, the header, each tensor's bytes */
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)header.len >> (8 * i));
    const void **parts = al_calloc((size_t)n + 2, sizeof *parts);
    size_t *lens = al_calloc((size_t)n + 2, sizeof *lens);
    if (!parts || !lens) {
        al_fmt(err, errlen, "%s: out of memory while saving", path);
        s = ALLOY_ERR_OOM;
    } else {
        parts[0] = len8, lens[0] = 8;
        parts[1] = header.p, lens[1] = header.len;
        for (int i = 0; i < n; i++)
            parts[i + 2] = tensors[i].data,
            lens[i + 2] = (size_t)alloy_host_tensor_numel(&tensors[i]) * alloy_dtype_size(tensors[i].dtype);
        s = al_file_write(path, parts, lens, n + 2, AL_FILE_DURABLE, err, errlen);
    }
    al_free(parts), al_free(lens);
    al_free(header.p);
    return s;
}
