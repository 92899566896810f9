/* index_width.c - the static check of generated CUDA sources for 32-bit index arithmetic (index_width.h): a small scanner over the kernel text, no C parser. */
#include "index_width.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_WIDE = 256, NAME_LEN = 48 };

typedef struct scan {
    const char *name, *src, *text; /* text: the kernel's own part of src */
    char wide[MAX_WIDE][NAME_LEN]; /* identifiers of 64-bit integers (and macros of 64-bit values) */
    char narrow[MAX_WIDE][NAME_LEN]; /* identifiers of 32-bit integers */
    int nwide, nnarrow, found;
    bool collecting; /* check_narrowing's first pass: names only */
    char *report;
    size_t len;
} scan;

static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* Whether word starts at p as a whole identifier. */
static bool word_at(const char *start, const char *p, const char *word)
{
    size_t n = strlen(word);
    return strncmp(p, word, n) == 0 && !ident_char(p[n]) && (p == start || !ident_char(p[-1]));
}

static const char *skip_space(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    return p;
}

/* The end of the expression at p: the first `,` `;` or unmatched closer at depth 0. */
static const char *expr_end(const char *p)
{
    int depth = 0;
    for (; *p; p++) {
        if (*p == '(' || *p == '[' || *p == '{') depth++;
        else if (*p == ')' || *p == ']' || *p == '}') {
            if (depth-- == 0) return p;
        } else if ((*p == ',' || *p == ';') && depth == 0) return p;
    }
    return p;
}

/* The matching closer of the opener at p (or the text's end). */
static const char *group_end(const char *p)
{
    int depth = 0;
    for (; *p; p++) {
        if (*p == '(' || *p == '[' || *p == '{') depth++;
        else if ((*p == ')' || *p == ']' || *p == '}') && --depth == 0) return p;
    }
    return p;
}

/* Whether the name at p (n bytes) is on the 32-bit list (narrow) or the 64-bit one. */
static bool listed(const scan *s, bool narrow, const char *p, size_t n)
{
    for (int i = 0; i < (narrow ? s->nnarrow : s->nwide); i++) {
        const char *name = narrow ? s->narrow[i] : s->wide[i];
        if (strlen(name) == n && strncmp(name, p, n) == 0) return true;
    }
    return false;
}

/* A 64-bit name: declared so, and not also declared 32-bit in another scope of the kernel (which
 * one a use sees is not told apart: such a name counts as 32-bit, so it is never a false finding). */
static bool is_wide_name(const scan *s, const char *p, size_t n)
{
    return listed(s, false, p, n) && !listed(s, true, p, n);
}

static void add_wide(scan *s, const char *p, size_t n)
{
    if (n == 0 || n >= NAME_LEN || s->nwide == MAX_WIDE || listed(s, false, p, n)) return;
    memcpy(s->wide[s->nwide], p, n);
    s->wide[s->nwide++][n] = 0;
}

/* Whether [p, end) holds a 64-bit operand: a 64-bit identifier, blockIdx or gridDim (which the
 * caller widens or narrows), an `ll` literal or a 64-bit cast; outside subscripts when values
 * is false (a value loaded from memory is not an index). */
static bool mentions_wide(const scan *s, const char *p, const char *end, bool literals, bool grid)
{
    while (p < end) {
        if (*p == '[') { /* a subscript indexes memory; what it loads is data */
            p = group_end(p) + 1;
            continue;
        }
        if (ident_char(*p) && (p == s->src || !ident_char(p[-1]))) {
            const char *q = p;
            while (q < end && ident_char(*q)) q++;
            if (isdigit((unsigned char)*p)) {
                if (literals && q - p > 2 && (q[-1] == 'l' || q[-1] == 'L')) return true;
            } else if (is_wide_name(s, p, (size_t)(q - p))) {
                return true;
            } else if (grid && (word_at(s->src, p, "blockIdx") || word_at(s->src, p, "gridDim"))) {
                return true;
            } else if (literals && (word_at(s->src, p, "long") || word_at(s->src, p, "size_t") ||
                                    word_at(s->src, p, "int64_t") || word_at(s->src, p, "uint64_t"))) {
                return true;
            }
            p = q;
            continue;
        }
        p++;
    }
    return false;
}

static void finding(scan *s, const char *at, const char *why)
{
    int line = 1;
    for (const char *c = s->src; c < at; c++) line += *c == '\n';
    const char *b = at, *e = at;
    while (b > s->text && b[-1] != '\n') b--;
    while (*e && *e != '\n') e++;
    b = skip_space(b);
    for (const char *c = b; c + 9 <= e; c++) /* a narrowing the emitter has bounded, marked on its line */
        if (strncmp(c, "/* int: ", 8) == 0) return;
    if (s->collecting) return;
    size_t used = strlen(s->report);
    if (used + 1 < s->len)
        snprintf(s->report + used, s->len - used, "kernel %s line %d: `%.*s`: %s\n", s->name, line,
                 (int)(e - b > 160 ? 160 : e - b), b, why);
    s->found++;
}

/* Collects the 64-bit integer variables and macros of the kernel text. */
static void collect_wide(scan *s)
{
    static const char *const types[] = {"long", "size_t", "int64_t", "uint64_t", "ptrdiff_t"};
    for (const char *p = s->text; *p; p++) {
        if (*p == '#' && strncmp(p, "#define ", 8) == 0) { /* a macro of a 64-bit value */
            const char *n = p + 8, *q = n;
            while (ident_char(*q)) q++;
            const char *eol = strchr(q, '\n');
            if (!eol) eol = q + strlen(q);
            if (*q == ' ' && mentions_wide(s, q, eol, true, false)) add_wide(s, n, (size_t)(q - n));
            continue;
        }
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            if (!word_at(s->src, p, types[t])) continue;
            const char *q = p + strlen(types[t]);
            if (t == 0) { /* long long / long */
                q = skip_space(q);
                if (word_at(s->src, q, "long")) q += 4;
                q = skip_space(q);
                if (word_at(s->src, q, "int")) q += 3;
            }
            for (;;) { /* declarators: NAME [= init] {, NAME [= init]} */
                q = skip_space(q);
                if (!ident_char(*q) || isdigit((unsigned char)*q)) break;
                const char *n = q;
                while (ident_char(*q)) q++;
                add_wide(s, n, (size_t)(q - n));
                q = expr_end(q);
                if (*q != ',') break;
                q++;
            }
        }
    }
}

/* Whether init (to end) is `... % K` with a literal K below 2^31 at depth 0, or a comparison. */
static bool narrow_by_value(const char *init, const char *end)
{
    int depth = 0;
    const char *mod = NULL;
    bool compares = false, selects = false;
    for (const char *p = init; p < end; p++) {
        if (*p == '(' || *p == '[') depth++;
        else if (*p == ')' || *p == ']') depth--;
        else if (depth == 0 && *p == '%') mod = p;
        else if (depth == 0 && *p == '?') selects = true;
        else if (depth == 0 && (*p == '<' || *p == '>' || (*p == '=' && p[1] == '=') || (*p == '!' && p[1] == '=') ||
                                (*p == '&' && p[1] == '&') || (*p == '|' && p[1] == '|')))
            compares = true;
    }
    if (compares && !selects) return true;
    if (!mod) return false;
    const char *k = skip_space(mod + 1);
    while (*k == '(') k++;
    char *after;
    unsigned long long v = strtoull(k, &after, 10);
    if (after == k) return false;
    while (*after == 'l' || *after == 'L' || *after == 'u' || *after == 'U' || *after == ')' || *after == ' ') after++;
    return after >= end && v < (1ull << 31);
}

/* Whether p starts a 32-bit integer type (int, unsigned, unsigned int, int32_t, uint32_t);
 * its end in *after. */
static bool narrow_type(const scan *s, const char *p, const char **after)
{
    const char *q;
    if (word_at(s->src, p, "unsigned")) {
        q = skip_space(p + 8);
        if (word_at(s->src, q, "long") || word_at(s->src, q, "char") || word_at(s->src, q, "short")) return false;
        if (word_at(s->src, q, "int")) q += 3;
        else q = p + 8;
    } else if (word_at(s->src, p, "int")) {
        if (p >= s->src + 5 && strncmp(p - 5, "long ", 5) == 0) return false;
        q = p + 3;
    } else if (word_at(s->src, p, "int32_t") || word_at(s->src, p, "uint32_t")) {
        q = p + (p[0] == 'u' ? 8 : 7);
    } else {
        return false;
    }
    *after = q;
    return true;
}

static void check_narrowing(scan *s)
{
    for (const char *p = s->text; *p; p++) {
        const char *q;
        if (!narrow_type(s, p, &q)) continue;
        const char *open = p;
        while (open > s->text && open[-1] == ' ') open--;
        q = skip_space(q);
        if (*q == ')' && open > s->text && open[-1] == '(') { /* a cast: (int)x, (int)(x) */
            const char *v = skip_space(q + 1), *e;
            if (*v == '(') e = group_end(v) + 1;
            else {
                e = v;
                while (ident_char(*e) || *e == '.') e++;
            }
            if (e > v && mentions_wide(s, v, e, false, true) && !narrow_by_value(v, e))
                finding(s, p, "a 64-bit index cast to 32 bits");
            continue;
        }
        bool loop = open - s->text >= 5 && strncmp(open - 5, "for (", 5) == 0;
        for (;;) { /* declarators */
            q = skip_space(q);
            if (*q == '*' || *q == '&' || !ident_char(*q)) break;
            const char *n = q;
            while (ident_char(*q)) q++;
            size_t nlen = (size_t)(q - n);
            if (s->collecting && nlen < NAME_LEN && s->nnarrow < MAX_WIDE &&
                !listed(s, true, n, nlen)) {
                memcpy(s->narrow[s->nnarrow], n, nlen);
                s->narrow[s->nnarrow++][nlen] = 0;
            }
            q = skip_space(q);
            if (*q == '[') break; /* an array: data */
            const char *e = q;
            if (*q == '=' && q[1] != '=') {
                const char *init = skip_space(q + 1);
                e = expr_end(init);
                if (mentions_wide(s, init, e, false, true) && !narrow_by_value(init, e))
                    finding(s, n, "a 32-bit variable initialised from a 64-bit index");
                if (loop && *e == ';') { /* the loop's bound */
                    const char *c = skip_space(e + 1);
                    if (strncmp(c, n, nlen) == 0 && !ident_char(c[nlen])) {
                        const char *b = skip_space(c + nlen);
                        if (*b == '<' || *b == '>') {
                            b += 1 + (b[1] == '=');
                            const char *be = expr_end(b);
                            for (const char *c2 = b; c2 < be; c2++) /* the bound ends at && || ? */
                                if ((c2[0] == '&' && c2[1] == '&') || (c2[0] == '|' && c2[1] == '|') || c2[0] == '?') {
                                    be = c2;
                                    break;
                                }
                            bool big = mentions_wide(s, b, be, false, true);
                            char *after;
                            unsigned long long v = strtoull(skip_space(b), &after, 10);
                            if (after != skip_space(b) && v >= (1ull << 31)) big = true;
                            if (big) finding(s, n, "a 32-bit loop variable bounded by a 64-bit extent");
                        }
                    }
                }
            }
            if (*e != ',') break;
            q = e + 1;
        }
    }
}

/* Assignments (=, +=, -=, *=) to a 32-bit variable of a 64-bit value, outside its declaration. */
static void check_assignments(scan *s)
{
    for (int v = 0; v < s->nnarrow; v++) {
        const char *n = s->narrow[v];
        size_t len = strlen(n);
        for (const char *p = strstr(s->text, n); p; p = strstr(p + len, n)) {
            if (!word_at(s->src, p, n)) continue;
            const char *before = p;
            while (before > s->text && before[-1] == ' ') before--;
            if (before > s->text && (ident_char(before[-1]) || before[-1] == '.' || before[-1] == '>' ||
                                     before[-1] == '*' || before[-1] == '&'))
                continue; /* a declaration, a member, a pointer's target */
            const char *op = skip_space(p + len);
            if (op[0] != '=' && !((op[0] == '+' || op[0] == '-' || op[0] == '*') && op[1] == '=')) continue;
            if (op[0] == '=' && op[1] == '=') continue;
            const char *init = skip_space(op + (op[0] == '=' ? 1 : 2)), *e = expr_end(init);
            if (mentions_wide(s, init, e, false, true) && !narrow_by_value(init, e))
                finding(s, p, "a 64-bit index assigned to a 32-bit variable");
        }
    }
}

/* Products of blockIdx / gridDim (or blockDim by either) without a 64-bit first factor. */
static void check_grid_products(scan *s)
{
    for (const char *p = s->text; *p; p++) {
        bool grid = word_at(s->src, p, "blockIdx") || word_at(s->src, p, "gridDim");
        bool dim = word_at(s->src, p, "blockDim");
        if (!grid && !dim) continue;
        const char *q = p;
        while (ident_char(*q) || *q == '.') q++;
        const char *next = skip_space(q);
        const char *before = p;
        while (before > s->text && before[-1] == ' ') before--;
        bool cast = false;
        static const char *const casts[] = {"(long long)", "(size_t)", "(int64_t)", "(uint64_t)",
                                            "(unsigned long long)"};
        for (size_t c = 0; c < sizeof casts / sizeof casts[0]; c++) {
            size_t n = strlen(casts[c]);
            if (before - s->text >= (ptrdiff_t)n && strncmp(before - n, casts[c], n) == 0) cast = true;
        }
        if (*next == '*' && next[1] != '=' && !cast) {
            const char *r = skip_space(next + 1);
            if (grid || word_at(s->src, r, "blockIdx") || word_at(s->src, r, "gridDim"))
                finding(s, p, "the grid index multiplied in 32 bits (no 64-bit cast on its first factor)");
        } else if (grid && before > s->text && before[-1] == '*' && !(before - s->text >= 2 && before[-2] == '*')) {
            const char *l = before - 1; /* the left factor */
            while (l > s->text && l[-1] == ' ') l--;
            const char *le = l;
            while (l > s->text && (ident_char(l[-1]) || l[-1] == '.')) l--;
            if (!mentions_wide(s, l, le, true, false)) finding(s, p, "the grid index multiplied in 32 bits");
        }
        p = q - 1;
    }
}

/* Subscripts of kernel parameters (pN[...]) and offsets added to them (pN + ...) with a product
 * and no 64-bit operand. */
static void check_subscripts(scan *s)
{
    for (const char *p = s->text; *p; p++) {
        if (*p != 'p' || (p > s->text && ident_char(p[-1])) || !isdigit((unsigned char)p[1])) continue;
        const char *q = p + 1;
        while (isdigit((unsigned char)*q)) q++;
        const char *plus = skip_space(q), *from, *e;
        if (*q == '[') {
            from = q + 1, e = group_end(q);
        } else if (*plus == '+' && plus[1] != '+' && plus[1] != '=') {
            from = plus + 1, e = expr_end(from);
        } else {
            continue;
        }
        bool product = false;
        for (const char *c = from; c < e; c++) product |= *c == '*';
        if (product && !mentions_wide(s, from, e, true, true))
            finding(s, p, *q == '[' ? "a parameter's subscript multiplied in 32 bits"
                                    : "an offset into a parameter multiplied in 32 bits");
        p = q - 1;
    }
}

int iw_scan(const char *name, const char *source, size_t body, char *report, size_t len)
{
    scan *s = calloc(1, sizeof *s);
    if (!s) return -1;
    s->name = name, s->src = source, s->text = source + body, s->report = report, s->len = len;
    collect_wide(s);
    check_grid_products(s);
    s->collecting = true; /* the 32-bit names first */
    check_narrowing(s);
    s->collecting = false;
    check_narrowing(s);
    check_assignments(s);
    check_subscripts(s);
    int found = s->found;
    free(s);
    return found;
}
