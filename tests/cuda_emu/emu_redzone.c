/* emu_redzone.c - the loader's rewrite of a kernel's __shared__ declarations into arrays between redzones, for the shared-memory checker. */
#include "emu_loader.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* A growing string; on out of memory it stays NULL. */
typedef struct {
    char *s;
    size_t len, cap;
} text;

static void put(text *t, const char *s, size_t n)
{
    if (!t->s && t->cap) return; /* failed before */
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *s2 = realloc(t->s, cap);
        if (!s2) {
            free(t->s);
            t->s = NULL, t->cap = 1;
            return;
        }
        t->s = s2, t->cap = cap;
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = 0;
}

static void puts_(text *t, const char *s) { put(t, s, strlen(s)); }

static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* The end of the comment, string or character literal at p (p itself when none starts there). */
static const char *skip_literal(const char *p)
{
    if (p[0] == '/' && p[1] == '/') {
        while (*p && *p != '\n') p++;
        return p;
    }
    if (p[0] == '/' && p[1] == '*') {
        const char *e = strstr(p + 2, "*/");
        return e ? e + 2 : p + strlen(p);
    }
    if (*p == '"' || *p == '\'') {
        char q = *p++;
        while (*p && *p != q) p += p[0] == '\\' && p[1] ? 2 : 1;
        return *p ? p + 1 : p;
    }
    return p;
}

/* The end (the ';') of the declaration starting at p, outside brackets; NULL when none. */
static const char *declaration_end(const char *p)
{
    int depth = 0;
    for (; *p; p++) {
        const char *e = skip_literal(p);
        if (e != p) {
            p = e - 1;
            continue;
        }
        if (*p == '(' || *p == '[' || *p == '{') depth++;
        if (*p == ')' || *p == ']' || *p == '}') depth--;
        if (*p == ';' && depth == 0) return p;
        if (depth < 0) return NULL;
    }
    return NULL;
}

/* One declarator, [b, e) of the declaration: its name and its array bounds ("[N][M]", or none). */
typedef struct {
    const char *name, *dims;
    size_t name_len, dims_len;
} declarator;

/* Splits [b, e), trimmed, into what comes before the declarator (the type, in the first) and the
 * declarator; false when it is no plain "name" or "name[...]...". */
static bool split_declarator(const char *b, const char *e, const char **type_end, declarator *d)
{
    while (e > b && isspace((unsigned char)e[-1])) e--;
    const char *dims_end = e;
    while (e > b && e[-1] == ']') { /* back over each [...] */
        int depth = 0;
        do {
            e--;
            if (*e == ']') depth++;
            if (*e == '[') depth--;
        } while (e > b && depth > 0);
        if (depth) return false;
        while (e > b && isspace((unsigned char)e[-1])) e--;
    }
    const char *dims = e;
    while (dims < dims_end && isspace((unsigned char)*dims)) dims++;
    const char *name_end = e;
    while (e > b && ident_char(e[-1])) e--;
    if (e == name_end || isdigit((unsigned char)*e)) return false;
    d->name = e, d->name_len = (size_t)(name_end - e);
    d->dims = dims, d->dims_len = (size_t)(dims_end - dims);
    *type_end = e;
    return true;
}

/* Whether [b, e) holds an initialiser, a literal, or a pointer or reference (a '*' or '&' outside
 * array bounds). */
static bool unknown_form(const char *b, const char *e)
{
    int depth = 0;
    for (; b < e; b++) {
        if (strchr("={}\"'", *b)) return true;
        if (*b == '[') depth++;
        if (*b == ']') depth--;
        if ((*b == '*' || *b == '&') && depth == 0) return true;
    }
    return false;
}

/* Writes the redzoned form of the declaration [p, end) (p after "__shared__") to t; false (nothing
 * written) when it is not one the rewrite knows: "__shared__ TYPE d1, d2, ...;" where each
 * declarator is a name with array bounds or none, and TYPE is no pointer or reference. */
static bool rewrite_declaration(text *t, const char *p, const char *end)
{
    declarator ds[16];
    int n = 0;
    const char *type_b = p, *type_e = NULL, *b = p;
    if (unknown_form(p, end)) return false;
    for (;;) { /* top-level commas split the declarators */
        int depth = 0;
        const char *c = b;
        for (; c < end; c++) {
            if (*c == '(' || *c == '[') depth++;
            if (*c == ')' || *c == ']') depth--;
            if (*c == ',' && depth == 0) break;
        }
        const char *te;
        if (n == (int)(sizeof ds / sizeof ds[0]) || !split_declarator(b, c, &te, &ds[n])) return false;
        if (n == 0) {
            type_e = te;
        } else {
            const char *s = b;
            while (s < te && isspace((unsigned char)*s)) s++;
            if (s != te) return false; /* "a, *b" and the like */
        }
        n++;
        if (c == end) break;
        b = c + 1;
    }
    while (type_b < type_e && isspace((unsigned char)*type_b)) type_b++;
    while (type_e > type_b && isspace((unsigned char)type_e[-1])) type_e--;
    if (type_b == type_e) return false; /* no type */
    for (int i = 0; i < n; i++) {
        const declarator *d = &ds[i];
        /* static struct { lead; TYPE v DIMS; trail; } NAME__rz_; auto &NAME = NAME__rz_.v;
         * static ::alloy_emu::shared_zone NAME__rze_ = {...}; (in the section the checker reads) */
        puts_(t, i ? " static struct { unsigned char lead[64]; " : "static struct { unsigned char lead[64]; ");
        put(t, type_b, (size_t)(type_e - type_b));
        puts_(t, " v");
        put(t, d->dims, d->dims_len);
        puts_(t, "; unsigned char trail[64]; } ");
        put(t, d->name, d->name_len);
        puts_(t, "__rz_; auto &");
        put(t, d->name, d->name_len);
        puts_(t, " = ");
        put(t, d->name, d->name_len);
        puts_(t, "__rz_.v; static ::alloy_emu::shared_zone ");
        put(t, d->name, d->name_len);
        puts_(t, "__rze_ __attribute__((section(\"alloy_emu_rz\"), used)) = {&");
        put(t, d->name, d->name_len);
        puts_(t, "__rz_, sizeof ");
        put(t, d->name, d->name_len);
        puts_(t, "__rz_.v, sizeof ");
        put(t, d->name, d->name_len);
        puts_(t, "__rz_, \"");
        put(t, d->name, d->name_len);
        puts_(t, "\"};");
    }
    return true;
}

char *emu_redzone_rewrite(const char *source)
{
    static const char key[] = "__shared__";
    const size_t klen = sizeof key - 1;
    text t = {0};
    const char *p = source, *copied = source;
    puts_(&t, "");
    while (*p) {
        const char *e = skip_literal(p);
        if (e != p) {
            p = e;
            continue;
        }
        bool word = strncmp(p, key, klen) == 0 && !ident_char(p[klen]) && (p == source || !ident_char(p[-1]));
        if (!word) {
            p++;
            continue;
        }
        /* "extern __shared__" (dynamic shared memory) and a line of the preprocessor are left */
        const char *line = p;
        while (line > source && line[-1] != '\n') line--;
        while (*line == ' ' || *line == '\t') line++;
        const char *end = declaration_end(p + klen);
        bool ext = strncmp(line, "extern", 6) == 0 && line < p;
        put(&t, copied, (size_t)(p - copied));
        if (*line != '#' && !ext && end && rewrite_declaration(&t, p + klen, end)) {
            p = copied = end + 1;
            continue;
        }
        puts_(&t, "/* alloy-emu: this __shared__ declaration has no redzone (a form the rewrite does not know) */ ");
        copied = p;
        p += klen;
    }
    put(&t, copied, (size_t)(p - copied));
    return t.s;
}
