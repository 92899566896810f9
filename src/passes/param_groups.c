/* param_groups.c - which parameter group a parameter is in: comma-separated glob patterns matched against its name. */
#include <string.h>

#include "passes/pass.h"

bool pg_glob(const char *pat, size_t len, const char *name)
{
    /* iterative glob with one backtrack point (the last '*'): linear in
     * practice, never exponential */
    size_t p = 0, star = (size_t)-1;
    const char *n = name, *resume = NULL;
    while (*n) {
        if (p < len && pat[p] == '*') {
            star = p++;
            resume = n;
        } else if (p < len && (pat[p] == '?' || pat[p] == *n)) {
            p++, n++;
        } else if (star != (size_t)-1) {
            p = star + 1;
            n = ++resume;
        } else {
            return false;
        }
    }
    while (p < len && pat[p] == '*') p++;
    return p == len;
}

bool pg_next(const char **p, const char **item, size_t *len)
{
    const char *s = *p;
    if (!*s) return false;
    const char *end = strchr(s, ',');
    if (!end) end = s + strlen(s);
    *p = *end ? end + 1 : end;
    while (s < end && *s == ' ') s++;
    while (end > s && end[-1] == ' ') end--;
    *item = s;
    *len = (size_t)(end - s);
    return true;
}

bool pg_match(const char *patterns, const char *name)
{
    const char *p = patterns, *item;
    size_t len;
    while (pg_next(&p, &item, &len))
        if (len && pg_glob(item, len, name)) return true;
    return false;
}

void pg_lookup(const param_group *groups, int n, const char *name, double *lr_scale, bool *decay)
{
    *lr_scale = 1.0;
    *decay = true;
    for (int i = n - 1; i >= 0; i--)
        if (pg_match(groups[i].patterns, name)) {
            *lr_scale = groups[i].lr_scale;
            *decay = groups[i].decay;
            return;
        }
}
