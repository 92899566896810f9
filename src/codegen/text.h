/* text.h - cg_text: a growing string for generated source and reports, its allocation failure sticky so callers check once. */
#ifndef ALLOY_CG_TEXT_H
#define ALLOY_CG_TEXT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/base.h"

/* A growing text; a failed allocation is sticky (oom) and checked once.
 * Zero-initialized it is empty. Uses the allocator hook (al_realloc): not
 * for pool threads. */
typedef struct cg_text {
    char *s;
    size_t len, cap;
    bool oom;
} cg_text;

/* Appends printf-style text. */
AL_HIDDEN void cg_put(cg_text *t, const char *fmt, ...) AL_PRINTF(2, 3);
/* Frees the text and empties it. */
AL_HIDDEN void cg_text_free(cg_text *t);

#endif
