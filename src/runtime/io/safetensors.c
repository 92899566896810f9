/* safetensors.c - read a safetensors file whole, checking everything, and look tensors up in it. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloy/safetensors.h"
#include "base/file.h"
#include "runtime/io/json.h"
#include "runtime/io/safetensors_memory.h"

#define MAX_HEADER 100000000ull /* the reference implementation's limit */
#define NAME_FMT "%.80s"        /* names in messages are cut to keep the message readable */

struct alloy_safetensors {
    int count;
    alloy_host_tensor *tensors;           /* header order */
    const alloy_host_tensor **by_name;    /* sorted by name, for find */
    int nmeta;
    const char **meta_keys, **meta_values; /* header order */
    unsigned char *data;                  /* the file's byte buffer */
    al_arena arena;                       /* everything else */
};

/* The format spells alloy's dtypes in capitals: f32 is "F32", bool is "BOOL". */
static void spelling(alloy_dtype dtype, char out[8])
{
    const char *s = alloy_dtype_name(dtype);
    size_t i = 0;
    for (; s[i] && i < 7; i++) out[i] = (char)toupper((unsigned char)s[i]);
    out[i] = '\0';
}

/* Dtypes the format defines that alloy does not handle. */
static const char *const foreign_dtypes[] = {
    "U8", "I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
    "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"};

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const alloy_host_tensor *const *)a)->name,
                  (*(const alloy_host_tensor *const *)b)->name);
}

typedef struct span {
    uint64_t begin, end;
    int index;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->index - y->index;
}

typedef struct loader {
    const char *path;
    char *err;
    size_t errlen;
    uint64_t datalen;
    alloy_safetensors *st;
    span *spans;
} loader;

static alloy_status oom_err(loader *l)
{
    al_fmt(l->err, l->errlen, "%s: out of memory while loading", l->path);
    return ALLOY_ERR_OOM;
}

static bool has_nul(const char *s, size_t len) { return strlen(s) != len; }

/* A non-negative integer JSON value; what names it in messages. */
static alloy_status get_uint(loader *l, const char *name, const al_json *v, const char *what,
                             int64_t *out)
{
    if (v->kind != AL_JSON_NUMBER || !v->is_int || v->overflow || v->i < 0) {
        const char *why = v->kind != AL_JSON_NUMBER ? "is not a number"
                          : !v->is_int              ? "is not an integer"
                          : v->overflow             ? "is too large"
                                                    : "is negative";
        if (v->kind == AL_JSON_NUMBER)
            al_fmt(l->err, l->errlen, "%s: tensor '" NAME_FMT "': %s %s (%.*s)", l->path, name, what,
                    why, (int)(v->raw_len > 40 ? 40 : v->raw_len), v->raw);
        else
            al_fmt(l->err, l->errlen, "%s: tensor '" NAME_FMT "': %s %s", l->path, name, what, why);
        return ALLOY_ERR_FORMAT;
    }
    *out = v->i;
    return ALLOY_OK;
}

static alloy_status parse_dtype(loader *l, const char *name, const al_json *v, alloy_dtype *out)
{
    if (v->kind != AL_JSON_STRING) {
        al_fmt(l->err, l->errlen, "%s: tensor '" NAME_FMT "': \"dtype\" is not a string", l->path,
                name);
        return ALLOY_ERR_FORMAT;
    }
    for (int i = 0; i < ALLOY_DTYPE_COUNT; i++) {
        char name_i[8];
        spelling((alloy_dtype)i, name_i);
        if (strcmp(v->str, name_i) == 0 && !has_nul(v->str, v->len)) {
            *out = (alloy_dtype)i;
            return ALLOY_OK;
        }
    }
    for (size_t i = 0; i < sizeof foreign_dtypes / sizeof *foreign_dtypes; i++) {
        if (strcmp(v->str, foreign_dtypes[i]) == 0) {
            al_fmt(l->err, l->errlen,
                    "%s: tensor '" NAME_FMT "': dtype %s is not supported (alloy reads F32, F16, "
                    "BF16, F64, I32, I64 and BOOL)",
                    l->path, name, v->str);
            return ALLOY_ERR_UNSUPPORTED;
        }
    }
    al_fmt(l->err, l->errlen, "%s: tensor '" NAME_FMT "': unknown dtype \"%.40s\"", l->path, name,
            v->str);
    return ALLOY_ERR_FORMAT;
}

/* Fills tensor idx from its header entry v (named name). */
static alloy_status parse_tensor(loader *l, int idx, const char *name, const al_json *v)
{
    alloy_host_tensor *t = &l->st->tensors[idx];
    t->name = name;
    if (v->kind != AL_JSON_OBJECT) {
        al_fmt(l->err, l->errlen, "%s: tensor '" NAME_FMT "': entry is not a JSON object", l->path,
                name);
        return ALLOY_ERR_FORMAT;
    }
    static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
    const al_json *f[3] = {NULL, NULL, NULL};
    for (const al_json *m = v->first; m; m = m->next) {
        for (int i = 0; i < 3; i++) {
            if (strcmp(m->key, fields[i]) != 0 || has_nul(m->key, m->key_len)) continue;
            if (f[i]) {
                al_fmt(l->err, l->errlen, "%s: tensor '" NAME_FMT "': field \"%s\" appears twice",
                        l->path, name, fields[i]);
                return ALLOY_ERR_FORMAT;
            }
            f[i] = m;
        }
    }
    if (!f[0] || !f[1] || !f[2]) {
        al_fmt(l->err, l->errlen, "%s: tensor '" NAME_FMT "': missing field \"%s\"", l->path, name,
                fields[!f[0] ? 0 : !f[1] ? 1 : 2]);
        return ALLOY_ERR_FORMAT;
    }
    alloy_status s = parse_dtype(l, name, f[0], &t->dtype);
    if (s) return s;

    const al_json *shape = f[1];
    if (shape->kind != AL_JSON_ARRAY) {
        al_fmt(l->err, l->errlen, "%s: tensor '" NAME_FMT "': \"shape\" is not an array", l->path,
                name);
        return ALLOY_ERR_FORMAT;
    }
    if (shape->count > ALLOY_MAX_RANK) {
        al_fmt(l->err, l->errlen, "%s: tensor '" NAME_FMT "': rank %zu exceeds the maximum of %d",
                l->path, name, shape->count, ALLOY_MAX_RANK);
        return ALLOY_ERR_UNSUPPORTED;
    }
    t->rank = (int)shape->count;
    int r = 0;
    for (const al_json *d = shape->first; d; d = d->next, r++) {
        char what[32];
        al_fmt(what, sizeof what, "shape[%d]", r);
        if ((s = get_uint(l, name, d, what, &t->dims[r]))) return s;
    }
    char dims[200];
    al_fmt_dims(dims, sizeof dims, t->rank, t->dims);
    int64_t numel = al_numel(t->rank, t->dims);
    int64_t esize = (int64_t)alloy_dtype_size(t->dtype);
    if (numel < 0 || numel > INT64_MAX / esize) {
        al_fmt(l->err, l->errlen, "%s: tensor '" NAME_FMT "': shape %s x %s overflows", l->path,
                name, dims, alloy_dtype_name(t->dtype));
        return ALLOY_ERR_FORMAT;
    }

    const al_json *offs = f[2];
    if (offs->kind != AL_JSON_ARRAY || offs->count != 2) {
        al_fmt(l->err, l->errlen,
                "%s: tensor '" NAME_FMT "': \"data_offsets\" is not an array [begin, end]", l->path,
                name);
        return ALLOY_ERR_FORMAT;
    }
    int64_t b, e;
    if ((s = get_uint(l, name, offs->first, "data_offsets begin", &b))) return s;
    if ((s = get_uint(l, name, offs->first->next, "data_offsets end", &e))) return s;
    if (e < b) {
        al_fmt(l->err, l->errlen,
                "%s: tensor '" NAME_FMT "': data_offsets [%" PRId64 ", %" PRId64 ") end before they begin",
                l->path, name, b, e);
        return ALLOY_ERR_FORMAT;
    }
    if ((uint64_t)e > l->datalen) {
        al_fmt(l->err, l->errlen,
                "%s: tensor '" NAME_FMT "': data_offsets [%" PRId64 ", %" PRId64
                ") lie outside the %" PRIu64 "-byte data buffer",
                l->path, name, b, e, l->datalen);
        return ALLOY_ERR_FORMAT;
    }
    if (e - b != numel * esize) {
        al_fmt(l->err, l->errlen,
                "%s: tensor '" NAME_FMT "': data_offsets [%" PRId64 ", %" PRId64
                ") do not match shape %s x %s = %" PRId64 " bytes",
                l->path, name, b, e, dims, alloy_dtype_name(t->dtype), numel * esize);
        return ALLOY_ERR_FORMAT;
    }
    l->spans[idx] = (span){(uint64_t)b, (uint64_t)e, idx};
    return ALLOY_OK;
}

static alloy_status parse_metadata(loader *l, const al_json *v)
{
    alloy_safetensors *st = l->st;
    if (v->kind == AL_JSON_NULL) return ALLOY_OK;
    if (v->kind != AL_JSON_OBJECT) {
        al_fmt(l->err, l->errlen, "%s: \"__metadata__\" is not an object of strings", l->path);
        return ALLOY_ERR_FORMAT;
    }
    if (v->count > (size_t)INT32_MAX) return oom_err(l);
    st->nmeta = (int)v->count;
    st->meta_keys = al_arena_alloc(&st->arena, v->count * sizeof *st->meta_keys);
    st->meta_values = al_arena_alloc(&st->arena, v->count * sizeof *st->meta_values);
    const char **sorted = al_arena_alloc(&st->arena, v->count * sizeof *sorted);
    if (!st->meta_keys || !st->meta_values || !sorted) return oom_err(l);
    int i = 0;
    for (const al_json *m = v->first; m; m = m->next, i++) {
        if (m->kind != AL_JSON_STRING) {
            al_fmt(l->err, l->errlen, "%s: metadata '" NAME_FMT "': value is not a string", l->path,
                    m->key);
            return ALLOY_ERR_FORMAT;
        }
        if (has_nul(m->key, m->key_len) || has_nul(m->str, m->len)) {
            al_fmt(l->err, l->errlen, "%s: metadata '" NAME_FMT "': contains a NUL character",
                    l->path, m->key);
            return ALLOY_ERR_FORMAT;
        }
        st->meta_keys[i] = sorted[i] = al_arena_memdup(&st->arena, m->key, m->key_len + 1);
        st->meta_values[i] = al_arena_memdup(&st->arena, m->str, m->len + 1);
        if (!st->meta_keys[i] || !st->meta_values[i]) return oom_err(l);
    }
    if (v->count) qsort(sorted, v->count, sizeof *sorted, cmp_str_ptr);
    for (size_t k = 1; k < v->count; k++) {
        if (strcmp(sorted[k - 1], sorted[k]) == 0) {
            al_fmt(l->err, l->errlen, "%s: metadata key '" NAME_FMT "' appears twice", l->path,
                    sorted[k]);
            return ALLOY_ERR_FORMAT;
        }
    }
    return ALLOY_OK;
}

/* The header's root object: every tensor entry and the metadata. */
static alloy_status parse_root(loader *l, const al_json *root)
{
    alloy_safetensors *st = l->st;
    if (root->kind != AL_JSON_OBJECT) {
        al_fmt(l->err, l->errlen, "%s: header JSON is not an object", l->path);
        return ALLOY_ERR_FORMAT;
    }
    const al_json *meta = NULL;
    size_t count = 0;
    for (const al_json *m = root->first; m; m = m->next) {
        if (m->key_len != 12 || strcmp(m->key, "__metadata__") != 0) {
            count++;
        } else if (meta) {
            al_fmt(l->err, l->errlen, "%s: \"__metadata__\" appears twice", l->path);
            return ALLOY_ERR_FORMAT;
        } else {
            meta = m;
        }
    }
    if (count > (size_t)INT32_MAX) return oom_err(l);
    st->count = (int)count;
    if (count) {
        st->tensors = al_arena_alloc(&st->arena, count * sizeof *st->tensors);
        st->by_name = al_arena_alloc(&st->arena, count * sizeof *st->by_name);
        l->spans = al_malloc(count * sizeof *l->spans);
        if (!st->tensors || !st->by_name || !l->spans) return oom_err(l);
    }
    alloy_status s;
    if (meta && (s = parse_metadata(l, meta))) return s;
    int i = 0;
    for (const al_json *m = root->first; m; m = m->next) {
        if (m == meta) continue;
        if (has_nul(m->key, m->key_len)) {
            al_fmt(l->err, l->errlen, "%s: tensor name '" NAME_FMT "' contains a NUL character",
                    l->path, m->key);
            return ALLOY_ERR_FORMAT;
        }
        char *name = al_arena_memdup(&st->arena, m->key, m->key_len + 1);
        if (!name) return oom_err(l);
        if ((s = parse_tensor(l, i, name, m))) return s;
        st->by_name[i] = &st->tensors[i];
        i++;
    }
    if (count) qsort(st->by_name, count, sizeof *st->by_name, cmp_tensor_name);
    for (size_t k = 1; k < count; k++) {
        if (strcmp(st->by_name[k - 1]->name, st->by_name[k]->name) == 0) {
            al_fmt(l->err, l->errlen, "%s: tensor '" NAME_FMT "' appears twice in the header",
                    l->path, st->by_name[k]->name);
            return ALLOY_ERR_FORMAT;
        }
    }
    /* The tensors must tile the data buffer exactly, in whatever order. */
    if (count) qsort(l->spans, count, sizeof *l->spans, cmp_span);
    uint64_t at = 0;
    for (size_t k = 0; k < count; k++) {
        const span *sp = &l->spans[k];
        if (sp->begin > at) {
            al_fmt(l->err, l->errlen,
                    "%s: bytes [%" PRIu64 ", %" PRIu64 ") of the data buffer belong to no tensor "
                    "(next is '" NAME_FMT "')",
                    l->path, at, sp->begin, st->tensors[sp->index].name);
            return ALLOY_ERR_FORMAT;
        }
        if (sp->begin < at) {
            const span *prev = &l->spans[k - 1];
            al_fmt(l->err, l->errlen,
                    "%s: tensor '" NAME_FMT "': data_offsets [%" PRIu64 ", %" PRIu64
                    ") overlap tensor '" NAME_FMT "' [%" PRIu64 ", %" PRIu64 ")",
                    l->path, st->tensors[sp->index].name, sp->begin, sp->end,
                    st->tensors[prev->index].name, prev->begin, prev->end);
            return ALLOY_ERR_FORMAT;
        }
        at = sp->end;
    }
    if (at != l->datalen) {
        al_fmt(l->err, l->errlen,
                "%s: the data buffer has %" PRIu64 " bytes but the tensors cover only %" PRIu64,
                l->path, l->datalen, at);
        return ALLOY_ERR_FORMAT;
    }
    return ALLOY_OK;
}

static alloy_status read_exact(loader *l, FILE *f, void *buf, size_t n, const char *what)
{
    if (n && fread(buf, 1, n, f) != n) {
        if (ferror(f))
            al_fmt(l->err, l->errlen, "%s: cannot read %s: %s", l->path, what, strerror(errno));
        else
            al_fmt(l->err, l->errlen, "%s: file ended while reading %s", l->path, what);
        return ALLOY_ERR_IO;
    }
    return ALLOY_OK;
}

/* Everything after opening f, of size bytes: header, checks, data. Frees nothing of st. */
static alloy_status load_file(loader *l, FILE *f, uint64_t size, char **header, al_arena *tree)
{
    if (size < 8) {
        al_fmt(l->err, l->errlen,
                "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length", l->path,
                size);
        return ALLOY_ERR_FORMAT;
    }
    unsigned char len8[8];
    alloy_status s = read_exact(l, f, len8, 8, "the header length");
    if (s) return s;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    if (n > MAX_HEADER) {
        al_fmt(l->err, l->errlen,
                "%s: header length %" PRIu64 " exceeds the limit of %llu bytes (corrupt file?)",
                l->path, n, MAX_HEADER);
        return ALLOY_ERR_FORMAT;
    }
    if (n > size - 8) {
        al_fmt(l->err, l->errlen,
                "%s: header length %" PRIu64 " runs past the end of the %" PRIu64 "-byte file",
                l->path, n, size);
        return ALLOY_ERR_FORMAT;
    }
    l->datalen = size - 8 - n;
    if (l->datalen > SIZE_MAX - 1) return oom_err(l);
    if (!(*header = al_malloc((size_t)n + 1))) return oom_err(l);
    if ((s = read_exact(l, f, *header, (size_t)n, "the header"))) return s;
    (*header)[n] = '\0';

    al_json *root;
    al_json_error je;
    al_json_status js = al_json_parse(*header, (size_t)n, tree, &root, &je);
    if (js == AL_JSON_OOM) return oom_err(l);
    if (js != AL_JSON_OK) {
        al_fmt(l->err, l->errlen,
                "%s: header JSON: %s at byte %zu of the header (file offset %zu)", l->path, je.msg,
                je.offset, je.offset + 8);
        return ALLOY_ERR_FORMAT;
    }
    if ((s = parse_root(l, root))) return s;

    alloy_safetensors *st = l->st;
    size_t dl = (size_t)l->datalen;
    if (!(st->data = al_malloc(dl ? dl : 1))) return oom_err(l);
    if ((s = read_exact(l, f, st->data, dl, "tensor data"))) return s;
    for (int k = 0; k < st->count; k++) {
        const span *sp = &l->spans[k];
        alloy_host_tensor *t = &st->tensors[sp->index];
        size_t esize = alloy_dtype_size(t->dtype);
        t->data = st->data + sp->begin;
        if (sp->begin % esize) { /* keep every tensor aligned to its element size */
            t->data = al_arena_memdup(&st->arena, t->data, (size_t)(sp->end - sp->begin));
            if (!t->data) return oom_err(l);
        }
    }
    return ALLOY_OK;
}

/* load_file on f with the scratch it needs freed after. */
static alloy_status load(loader *l, FILE *f, uint64_t size)
{
    char *header = NULL;
    al_arena tree = {0};
    alloy_status s = load_file(l, f, size, &header, &tree);
    al_free(header);
    al_arena_free(&tree);
    return s;
}

/* Closes f and hands the tensors to *out, or frees them on failure s. */
static alloy_status finish(loader *l, FILE *f, alloy_status s, alloy_safetensors **out)
{
    fclose(f);
    al_free(l->spans);
    if (s) {
        alloy_safetensors_free(l->st);
        return s;
    }
    *out = l->st;
    return ALLOY_OK;
}

/* Loads path whole into a new object (see safetensors.h); *out is NULL on failure. */
alloy_status alloy_safetensors_load(const char *path, alloy_safetensors **out, char *err,
                                    size_t errlen)
{
    al_fmt(err, errlen, "%s", "");
    if (!out || !path) {
        al_fmt(err, errlen, "alloy_safetensors_load: %s is NULL", path ? "out" : "path");
        return ALLOY_ERR_INVALID;
    }
    *out = NULL;
    alloy_safetensors *st = al_calloc(1, sizeof *st);
    loader l = {path, err, errlen, 0, st, NULL};
    if (!st) return oom_err(&l);
    /* a regular file only (base/file.h): a FIFO is refused, not waited on */
    int fd;
    uint64_t size;
    alloy_status s = al_file_open_read(path, 0, &fd, &size, err, errlen);
    FILE *f = s ? NULL : fdopen(fd, "rb");
    if (!s && !f) {
        al_fmt(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        s = ALLOY_ERR_IO;
    }
    if (s) {
        al_free(st);
        return s;
    }
    return finish(&l, f, load(&l, f, size), out);
}

alloy_status io_safetensors_load_memory(const void *bytes, size_t len, const char *where, alloy_safetensors **out,
                                        char *err, size_t errlen)
{
    *out = NULL;
    alloy_safetensors *st = al_calloc(1, sizeof *st);
    loader l = {where, err, errlen, 0, st, NULL};
    if (!st) return oom_err(&l);
    if (len < 8) { /* fmemopen takes no empty buffer */
        al_fmt(err, errlen, "%s: %zu bytes, too short for the 8-byte header length", where, len);
        al_free(st);
        return ALLOY_ERR_FORMAT;
    }
    FILE *f = fmemopen((void *)(uintptr_t)bytes, len, "rb");
    if (!f) {
        al_free(st);
        return oom_err(&l);
    }
    return finish(&l, f, load(&l, f, len), out);
}

/* Number of tensors; 0 for NULL. */
int alloy_safetensors_count(const alloy_safetensors *st) { return st ? st->count : 0; }

/* The i-th tensor in header order, or NULL when i is out of range. Never NULL data. */
const alloy_host_tensor *alloy_safetensors_get(const alloy_safetensors *st, int i)
{
    return st && i >= 0 && i < st->count ? &st->tensors[i] : NULL;
}

/* Binary search of the name index; NULL if absent. */
const alloy_host_tensor *alloy_safetensors_find(const alloy_safetensors *st, const char *name)
{
    if (!st || !name) return NULL;
    size_t lo = 0, hi = (size_t)st->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, st->by_name[mid]->name);
        if (c == 0) return st->by_name[mid];
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

/* Linear search of "__metadata__"; NULL if absent. */
const char *alloy_safetensors_metadata(const alloy_safetensors *st, const char *key)
{
    if (!st || !key) return NULL;
    for (int i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
    return NULL;
}

/* Frees st and everything it handed out; NULL is fine. */
void alloy_safetensors_free(alloy_safetensors *st)
{
    if (!st) return;
    al_free(st->data);
    al_arena_free(&st->arena);
    al_free(st);
}
