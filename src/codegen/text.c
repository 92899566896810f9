/* text.c - cg_text: a growing string for generated source and reports. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codegen/text.h"

void cg_put(cg_text *t, const char *fmt, ...)
{
    if (t->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = true;
            return;
        }
        if (t->s && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap : 4096;
        while (cap <= t->len + (size_t)n) cap *= 2;
        char *s = al_realloc(t->s, cap);
        if (!s) {
            t->oom = true;
            return;
        }
        t->s = s, t->cap = cap;
    }
}

void cg_text_free(cg_text *t)
{
    al_free(t->s);
    memset(t, 0, sizeof *t);
}
