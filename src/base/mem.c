/* mem.c - the allocator hook, arenas and small formatting helpers every module uses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

static alloy_realloc_fn user_realloc;
static void *user_data;

void alloy_set_allocator(alloy_realloc_fn realloc_fn, void *user)
{
    user_realloc = realloc_fn;
    user_data = user;
}

void *al_realloc(void *ptr, size_t size)
{
    if (user_realloc) return user_realloc(ptr, size, user_data);
    if (size == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, size);
}

void *al_malloc(size_t size) { return size ? al_realloc(NULL, size) : NULL; }

void *al_calloc(size_t n, size_t size)
{
    if (n == 0 || size == 0 || n > SIZE_MAX / size) return NULL;
    void *p = al_malloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

void al_free(void *ptr)
{
    if (ptr) al_realloc(ptr, 0);
}

char *al_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = al_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

void al_assert_fail(const char *what, const char *file, int line)
{
    fprintf(stderr, "alloy: internal error: %s (%s:%d)\n", what, file, line);
    abort();
}

void al_fmt(char *buf, size_t len, const char *fmt, ...)
{
    if (!buf || !len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

void al_fmt_dims(char *buf, size_t len, int rank, const int64_t *dims)
{
    size_t used = 0;
    al_fmt(buf, len, "[");
    used = strlen(buf);
    for (int i = 0; i < rank && used < len; i++) {
        al_fmt(buf + used, len - used, "%s%lld", i ? "," : "", (long long)dims[i]);
        used += strlen(buf + used);
    }
    if (used < len) al_fmt(buf + used, len - used, "]");
}

int64_t al_numel(int rank, const int64_t *dims)
{
    /* The product of the nonzero dims is bounded, not only the product: an
     * empty tensor [0, 4e17, 120] has 0 elements, but its strides and any
     * partial product a kernel or pass forms (batch strides, row counts, a
     * reduction's outer size) would pass int64. Bounding it once here, where
     * every shape is checked, makes all of those safe. */
    int64_t n = 1;
    bool empty = false;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0) return -1;
        if (dims[i] == 0) {
            empty = true;
            continue;
        }
        if (n > AL_MAX_NUMEL / dims[i]) return -1;
        n *= dims[i];
    }
    return empty ? 0 : n;
}

/* Arenas: a chain of blocks, each at least 64 KiB, bump-allocated. */
struct al_arena_block {
    al_arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *al_arena_alloc(al_arena *a, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    if (size == 0) size = 16;
    al_arena_block *b = a->head;
    if (!b || b->cap - b->used < size) {
        size_t cap = size > 65536 ? size : 65536;
        b = al_malloc(sizeof *b + cap);
        if (!b) {
            a->failed = true;
            return NULL;
        }
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += size;
    memset(p, 0, size);
    return p;
}

void *al_arena_memdup(al_arena *a, const void *p, size_t size)
{
    void *q = al_arena_alloc(a, size);
    if (q && size) memcpy(q, p, size);
    return q;
}

char *al_arena_strdup(al_arena *a, const char *s)
{
    return s ? al_arena_memdup(a, s, strlen(s) + 1) : NULL;
}

void al_arena_free(al_arena *a)
{
    al_arena_block *b = a->head;
    while (b) {
        al_arena_block *next = b->next;
        al_free(b);
        b = next;
    }
    a->head = NULL;
    a->failed = false;
}
