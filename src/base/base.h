/* base.h - internal foundations: the allocator hook, arenas, messages, visibility. */
#ifndef ALLOY_BASE_H
#define ALLOY_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloy/types.h"

/* Internal functions stay inside the library; a sanitizer build
 * (meson.build: ALLOY_EXPORT_INTERNALS) exports them so that its tests link
 * one shared library instead of a 60 MB instrumented copy each. */
#ifdef ALLOY_EXPORT_INTERNALS
#define AL_HIDDEN
#else
#define AL_HIDDEN __attribute__((visibility("hidden")))
#endif
#define AL_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* For states that cannot happen whatever the user does. Never for user input. */
#define ALLOY_ASSERT(x)                                                                  \
    do {                                                                                 \
        if (!(x)) al_assert_fail(#x, __FILE__, __LINE__);                                \
    } while (0)

/* mem.c */
AL_HIDDEN void *al_malloc(size_t size);           /* NULL on failure or size 0 */
AL_HIDDEN void *al_calloc(size_t n, size_t size); /* zeroed; NULL on failure/overflow */
AL_HIDDEN void *al_realloc(void *ptr, size_t size);
AL_HIDDEN void al_free(void *ptr);
AL_HIDDEN char *al_strdup(const char *s);
AL_HIDDEN _Noreturn void al_assert_fail(const char *what, const char *file, int line);
/* snprintf into buf that never overflows and always terminates; a NULL buf or 0 len writes nothing. */
AL_HIDDEN void al_fmt(char *buf, size_t len, const char *fmt, ...) AL_PRINTF(3, 4);
/* "[2,3,4]" (or "[]" for a scalar) into buf. */
AL_HIDDEN void al_fmt_dims(char *buf, size_t len, int rank, const int64_t *dims);
/* The most elements a shape may describe: the product of its nonzero dims is
 * at most this (2^59), so element counts, strides and partial products stay
 * in int64 even after scaling by an element size of up to 16 bytes. */
#define AL_MAX_NUMEL (INT64_MAX / 16)
/* Product of dims; -1 for a negative dim or when the product of the nonzero
 * dims passes AL_MAX_NUMEL (an empty shape whose other dims are that large is
 * refused too). */
AL_HIDDEN int64_t al_numel(int rank, const int64_t *dims);

/* An arena: many small allocations freed at once. Allocation failure returns
 * NULL and sets `failed` (sticky), so callers may check once at the end. */
typedef struct al_arena_block al_arena_block;
typedef struct al_arena {
    al_arena_block *head;
    bool failed;
} al_arena;

AL_HIDDEN void *al_arena_alloc(al_arena *a, size_t size); /* zeroed, 16-byte aligned */
AL_HIDDEN char *al_arena_strdup(al_arena *a, const char *s);
AL_HIDDEN void *al_arena_memdup(al_arena *a, const void *p, size_t size);
AL_HIDDEN void al_arena_free(al_arena *a);

#endif
