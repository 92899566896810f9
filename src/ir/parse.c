/* parse.c - reads the IR text format (docs/ir.md) into a verified graph, with file:line:col errors. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

typedef enum tok_kind { T_EOF, T_NL, T_IDENT, T_INT, T_FLOAT, T_STR, T_REF, T_PUNCT, T_BAD } tok_kind;

typedef struct token {
    tok_kind kind;
    size_t pos, end; /* source bytes [pos, end) */
    int line, col;
    char punct;
    bool overflow; /* T_INT, or a T_REF label, beyond int64 */
    bool is_label; /* T_REF: %12 rather than %name */
    int64_t i;     /* T_INT value, T_REF label */
    double f;      /* T_FLOAT */
    char *s;       /* T_IDENT text, T_STR contents, T_REF name (scratch arena) */
} token;

typedef struct label {
    int64_t key;
    int id; /* -1: empty slot */
} label;

typedef struct parser {
    const char *text, *file;
    size_t len, pos, line_start;
    int line;
    char *err;
    size_t errlen;
    bool failed;
    token tok;
    al_arena scratch; /* token strings and attribute values; freed at the end */
    ir_graph *g;
    int *node_line, node_cap; /* the source line of each node */
    label *labels;            /* %12 -> node id, open addressing */
    int label_cap, label_count;
} parser;

/* A parsed attribute and where it was written. */
typedef struct pattr {
    ir_attr a;
    int line, col;
} pattr;

/* Records "file:line:col: message" (the first error wins); returns false. */
static bool fail_at(parser *p, int line, int col, const char *fmt, ...) AL_PRINTF(4, 5);
static bool fail_at(parser *p, int line, int col, const char *fmt, ...)
{
    if (p->failed) return false;
    p->failed = true;
    if (!p->err || !p->errlen) return false;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    al_fmt(p->err, p->errlen, "%s:%d:%d: %s", p->file, line, col, msg);
    return false;
}

/* Records an error at token t (first wins); evaluates to false. */
#define FAIL(t, ...) fail_at(p, (t)->line, (t)->col, __VA_ARGS__)
#define SRC(t, buf) src_text(p, (t)->pos, (t)->end, buf, sizeof buf)

/* Source bytes [pos, end) for a message: at most 48, unprintables as '?'. */
static const char *src_text(const parser *p, size_t pos, size_t end, char *buf, size_t len)
{
    size_t n = end - pos, k = 0;
    bool cut = n > 48;
    for (size_t i = 0; i < (cut ? 45 : n) && k + 1 < len; i++) {
        unsigned char c = (unsigned char)p->text[pos + i];
        buf[k++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    for (int i = 0; cut && i < 3 && k + 1 < len; i++) buf[k++] = '.';
    buf[k] = '\0';
    return buf;
}

/* What a message says was found: "end of line", "'matmul'", "string \"a\"". */
static const char *found(const parser *p, const token *t, char *buf, size_t len)
{
    char s[64];
    if (t->kind == T_EOF) return "end of file";
    if (t->kind == T_NL) return "end of line";
    al_fmt(buf, len, t->kind == T_STR ? "string %s" : "'%s'", src_text(p, t->pos, t->end, s, sizeof s));
    return buf;
}

static bool is_ident_start(int c) { return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_ident_char(int c) { return is_ident_start(c) || is_digit(c) || c == '.'; }
static int at(const parser *p, size_t i) { return i < p->len ? (unsigned char)p->text[i] : -1; }

static int hexval(int c)
{
    if (is_digit(c)) return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Bytes of the string whose opening quote is at q, up to its closing quote
 * or the end of its line: a bound on its decoded length, found by a scan
 * as long as the string itself (so reading every string stays linear). */
static size_t string_extent(const parser *p, size_t q)
{
    size_t i = q + 1;
    for (int c = at(p, i); c >= 0 && c != '"' && c != '\n'; c = at(p, i))
        i += c == '\\' && at(p, i + 1) >= 0 && at(p, i + 1) != '\n' ? 2 : 1;
    return i - q;
}

/* Reads the "..." string at p->pos into t->s. */
static bool lex_string(parser *p, token *t)
{
    size_t k = 0;
    char *out = al_arena_alloc(&p->scratch, string_extent(p, p->pos++) + 1);
    if (!out) return FAIL(t, "out of memory");
    for (;;) {
        int c = at(p, p->pos), col = (int)(p->pos - p->line_start) + 1;
        int stop = c == '\\' ? at(p, p->pos + 1) : c;
        if (stop < 0 || stop == '\n')
            return FAIL(t, "unterminated string (expected '\"' before end of %s)", stop < 0 ? "file" : "line");
        p->pos++;
        if (c == '"') break;
        if (c == 0) return fail_at(p, p->line, col, "NUL byte in string");
        if (c != '\\') {
            out[k++] = (char)c;
            continue;
        }
        int e = at(p, p->pos++), h = hexval(at(p, p->pos)), l = hexval(at(p, p->pos + 1));
        if (e == '"' || e == '\\' || e == '\'') out[k++] = (char)e;
        else if (e == 'n') out[k++] = '\n';
        else if (e == 't') out[k++] = '\t';
        else if (e == 'r') out[k++] = '\r';
        else if (e == 'x' && h >= 0 && l >= 0 && h + l > 0) out[k++] = (char)(h * 16 + l), p->pos += 2;
        else if (e == 'x')
            return fail_at(p, p->line, col, "expected two hex digits (not 00) after '\\x' in string");
        else
            return fail_at(p, p->line, col,
                           "unknown escape '\\%c' in string (expected \\\" \\\\ \\' \\n \\t \\r or \\xHH)",
                           e >= 0x20 && e < 0x7f ? e : '?');
    }
    out[k] = '\0';
    t->s = out;
    return true;
}

/* Reads [+-]digits[.digits][e[+-]digits] into an INT or FLOAT token. */
static bool lex_number(parser *p, token *t)
{
    size_t q = p->pos;
    bool neg = false, is_float = false;
    char s[64], buf[512];
    if (at(p, q) == '+' || at(p, q) == '-') neg = at(p, q++) == '-';
    uint64_t mag = 0;
    for (; is_digit(at(p, q)); q++) {
        unsigned d = (unsigned)(at(p, q) - '0');
        if (mag > (UINT64_MAX - d) / 10) t->overflow = true;
        else mag = mag * 10 + d;
    }
    if (at(p, q) == '.' && is_digit(at(p, q + 1)))
        for (is_float = true, q++; is_digit(at(p, q)); q++) {}
    if (at(p, q) == 'e' || at(p, q) == 'E') {
        size_t e = q + 1 + (at(p, q + 1) == '+' || at(p, q + 1) == '-');
        if (is_digit(at(p, e)))
            for (is_float = true, q = e; is_digit(at(p, q)); q++) {}
    }
    p->pos = t->end = q;
    if (is_ident_char(at(p, q))) {
        while (is_ident_char(at(p, q))) q++;
        return FAIL(t, "malformed number '%s'", src_text(p, t->pos, q, s, sizeof s));
    }
    if (!is_float) {
        t->kind = T_INT;
        t->overflow |= mag > (uint64_t)INT64_MAX + neg;
        t->i = t->overflow ? 0 : neg ? (int64_t)(0 - mag) : (int64_t)mag;
        return true;
    }
    if (q - t->pos >= sizeof buf) return FAIL(t, "number '%s' is too long", SRC(t, s));
    memcpy(buf, p->text + t->pos, q - t->pos);
    buf[q - t->pos] = '\0';
    t->kind = T_FLOAT;
    t->f = strtod(buf, NULL);
    if (isinf(t->f)) return FAIL(t, "float %s is out of range (write inf or -inf)", SRC(t, s));
    return true;
}

/* %12, %name or %"any name" */
static bool lex_ref(parser *p, token *t)
{
    size_t start = ++p->pos;
    int c = at(p, start);
    char s[64];
    t->kind = T_REF;
    if (c == '"') {
        bool ok = lex_string(p, t);
        t->end = p->pos;
        return ok;
    }
    t->is_label = is_digit(c);
    for (; t->is_label && is_digit(at(p, p->pos)); p->pos++) {
        int64_t d = at(p, p->pos) - '0';
        if (t->i > (INT64_MAX - d) / 10) t->overflow = true;
        else t->i = t->i * 10 + d;
    }
    bool ok = t->is_label ? !is_ident_char(at(p, p->pos)) : is_ident_start(c);
    while (is_ident_char(at(p, p->pos))) p->pos++;
    t->end = p->pos;
    if (ok && !t->is_label) { /* arena memory is zeroed: the copy ends in NUL */
        t->s = al_arena_alloc(&p->scratch, p->pos - start + 1);
        if (!t->s) return FAIL(t, "out of memory");
        memcpy(t->s, p->text + start, p->pos - start);
    }
    if (ok) return true;
    if (p->pos > start) return FAIL(t, "malformed node label '%s'", SRC(t, s));
    if (c < 0 || c == '\n') al_fmt(s, sizeof s, "end of %s", c < 0 ? "file" : "line");
    else al_fmt(s, sizeof s, "'%c'", c >= 0x20 && c < 0x7f ? c : '?');
    return FAIL(t, "expected a node name after '%%' (%%name, %%\"name\" or %%12), found %s", s);
}

/* Advances p->tok to the next token; after an error every token is T_BAD. */
static void next(parser *p)
{
    token *t = &p->tok;
    if (t->kind == T_NL) p->line++, p->line_start = t->end;
    for (int c = at(p, p->pos); c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v' || c == '#';
         c = at(p, p->pos)) {
        if (c != '#') p->pos++;
        else while (at(p, p->pos) >= 0 && at(p, p->pos) != '\n') p->pos++;
    }
    *t = (token){.pos = p->pos, .end = p->pos, .line = p->line, .col = (int)(p->pos - p->line_start) + 1};
    int c = at(p, p->pos), c1 = at(p, p->pos + 1);
    bool ok = true;
    if (p->failed) {
        t->kind = T_BAD;
        return;
    }
    if (c < 0) {
        t->kind = T_EOF;
    } else if (c == '\n' || (c && strchr("=(),{}[]:!", c))) {
        t->kind = c == '\n' ? T_NL : T_PUNCT;
        t->punct = (char)c;
        t->end = ++p->pos;
    } else if (is_ident_start(c)) {
        while (is_ident_char(at(p, p->pos))) p->pos++;
        t->kind = T_IDENT;
        t->end = p->pos;
        t->s = al_arena_alloc(&p->scratch, t->end - t->pos + 1);
        ok = t->s ? (memcpy(t->s, p->text + t->pos, t->end - t->pos), true) : FAIL(t, "out of memory");
        /* arena memory is zeroed: the copy ends in NUL */
    } else if ((c == '-' || c == '+') && p->len - p->pos >= 4 && memcmp(p->text + p->pos + 1, "inf", 3) == 0 &&
               !is_ident_char(at(p, p->pos + 4))) {
        t->kind = T_FLOAT;
        t->f = c == '-' ? -INFINITY : INFINITY;
        t->end = p->pos += 4;
    } else if (is_digit(c) || ((c == '-' || c == '+') && is_digit(c1))) {
        ok = lex_number(p, t);
    } else if (c == '"') {
        t->kind = T_STR;
        ok = lex_string(p, t);
        t->end = p->pos;
    } else if (c == '%') {
        ok = lex_ref(p, t);
    } else {
        ok = c >= 0x20 && c < 0x7f ? FAIL(t, "unexpected character '%c'", c)
                                   : FAIL(t, "unexpected byte 0x%02x", (unsigned)c);
    }
    if (!ok) t->kind = T_BAD;
}

static bool is_punct(const parser *p, char c) { return p->tok.kind == T_PUNCT && p->tok.punct == c; }
static bool is_word(const parser *p, const char *w)
{
    return p->tok.kind == T_IDENT && strcmp(p->tok.s, w) == 0;
}

/* "expected <what>, found <the current token>" */
static bool fail_expected(parser *p, const char *what)
{
    char f[96];
    return FAIL(&p->tok, "expected %s, found %s", what, found(p, &p->tok, f, sizeof f));
}

/* Consumes punctuation c or fails with "expected 'c' <where>, found X". */
static bool expect(parser *p, char c, const char *where)
{
    char what[96];
    if (p->failed) return false;
    if (!is_punct(p, c)) return al_fmt(what, sizeof what, "'%c' %s", c, where), fail_expected(p, what);
    next(p);
    return !p->failed;
}

static size_t label_slot(const label *l, int cap, int64_t key)
{
    size_t mask = (size_t)cap - 1, i = ((uint64_t)key * 0x9E3779B97F4A7C15ull >> 17) & mask;
    while (l[i].id >= 0 && l[i].key != key) i = (i + 1) & mask;
    return i;
}

/* The node id labelled %key, or -1. */
static int label_find(const parser *p, int64_t key)
{
    return p->label_cap ? p->labels[label_slot(p->labels, p->label_cap, key)].id : -1;
}

static bool label_put(parser *p, int64_t key, int id)
{
    if ((p->label_count + 1) * 2 > p->label_cap) {
        int cap = p->label_cap ? p->label_cap * 2 : 64;
        label *l = al_malloc(sizeof *l * (size_t)cap);
        if (!l) return false;
        for (int i = 0; i < cap; i++) l[i].id = -1;
        for (int i = 0; i < p->label_cap; i++)
            if (p->labels[i].id >= 0) l[label_slot(l, cap, p->labels[i].key)] = p->labels[i];
        al_free(p->labels);
        p->labels = l;
        p->label_cap = cap;
    }
    p->labels[label_slot(p->labels, p->label_cap, key)] = (label){key, id};
    p->label_count++;
    return true;
}

/* arr with room for `need` elements (moved, maybe); NULL (arr freed) on OOM. */
static void *grow(parser *p, void *arr, int *cap, int need, size_t elem)
{
    if (need <= *cap) return arr;
    int nc = *cap ? *cap : 8;
    while (nc < need) nc *= 2;
    void *a = nc <= INT_MAX / 2 ? al_realloc(arr, (size_t)nc * elem) : NULL;
    if (!a) al_free(arr), FAIL(&p->tok, "out of memory");
    *cap = a ? nc : 0;
    return a;
}

/* Reads a %ref to an already defined node; returns its id or -1. */
static int parse_use(parser *p)
{
    token *t = &p->tok;
    char s[64];
    if (t->kind != T_REF) return fail_expected(p, "an operand (%name or %12)"), -1;
    if (t->is_label && t->overflow) return FAIL(t, "label %s is too large", SRC(t, s)), -1;
    int id = t->is_label ? label_find(p, t->i) : ir_find_name(p->g, t->s);
    if (id < 0) return FAIL(t, "%s is not defined", SRC(t, s)), -1;
    next(p);
    return p->failed ? -1 : id;
}

/* dtype[d0,d1,...] */
static bool parse_type(parser *p, ir_type *ty)
{
    token dt = p->tok;
    char s[64], dims[200];
    *ty = (ir_type){0};
    if (dt.kind != T_IDENT) return fail_expected(p, "a type such as f32[4,8] after ':'");
    if (alloy_dtype_from_name(dt.s, &ty->dtype) != 0)
        return FAIL(&dt, "unknown dtype '%s' (expected f32, f16, bf16, f64, i32, i64 or bool)", SRC(&dt, s));
    next(p);
    al_fmt(s, sizeof s, "after dtype '%s'", dt.s);
    if (!expect(p, '[', s)) return false;
    while (!is_punct(p, ']')) {
        if (ty->rank > 0 && !expect(p, ',', "or ']' between dims")) return false;
        token *d = &p->tok;
        if (d->kind != T_INT) return fail_expected(p, "a dim (a non-negative integer)");
        if (d->overflow) return FAIL(d, "dim %s is too large", SRC(d, s));
        if (d->i < 0) return FAIL(d, "dim %lld is negative", (long long)d->i);
        if (ty->rank == ALLOY_MAX_RANK) return FAIL(d, "rank exceeds the maximum of %d", ALLOY_MAX_RANK);
        ty->dims[ty->rank++] = d->i;
        next(p);
    }
    al_fmt_dims(dims, sizeof dims, ty->rank, ty->dims);
    if (al_numel(ty->rank, ty->dims) < 0) return FAIL(&dt, "shape %s has more than 2^59 elements (its nonzero dims multiplied)", dims);
    next(p);
    return !p->failed;
}

/* A scalar or list attribute value into *a (a list is INTS unless a float appears). */
static bool parse_value(parser *p, ir_attr *a, bool in_list)
{
    token t = p->tok;
    char s[64];
    if (in_list && (t.kind == T_STR || is_punct(p, '[') || is_word(p, "true") || is_word(p, "false")))
        return fail_expected(p, "a number in list");
    if (t.kind == T_INT && t.overflow) return FAIL(&t, "integer %s is too large", SRC(&t, s));
    if (t.kind == T_INT) *a = ir_a_int(a->name, t.i);
    else if (t.kind == T_FLOAT) *a = ir_a_float(a->name, t.f);
    else if (t.kind == T_STR) *a = ir_a_str(a->name, t.s);
    else if (is_word(p, "true") || is_word(p, "false")) *a = ir_a_bool(a->name, t.s[0] == 't');
    else if (is_word(p, "inf") || is_word(p, "nan")) *a = ir_a_float(a->name, t.s[0] == 'i' ? INFINITY : NAN);
    else if (!is_punct(p, '['))
        return fail_expected(p, "an attribute value (number, true, false, string or list)");
    bool list = is_punct(p, '[');
    next(p);
    if (!list) return !p->failed;
    int n = 0, cap = 0;
    int64_t *ints = NULL;
    double *floats = NULL;
    bool any_float = false;
    while (!p->failed && !is_punct(p, ']')) {
        ir_attr e = {.name = a->name};
        if ((n > 0 && !expect(p, ',', "or ']' in list")) || !parse_value(p, &e, true)) return false;
        if (n == cap) {
            if (cap > INT_MAX / 2) return FAIL(&t, "list has too many elements");
            cap = cap ? cap * 2 : 8;
            int64_t *ni = al_arena_alloc(&p->scratch, sizeof *ni * (size_t)cap);
            double *nf = al_arena_alloc(&p->scratch, sizeof *nf * (size_t)cap);
            if (!ni || !nf) return FAIL(&t, "out of memory");
            if (n) memcpy(ni, ints, sizeof *ni * (size_t)n), memcpy(nf, floats, sizeof *nf * (size_t)n);
            ints = ni;
            floats = nf;
        }
        any_float |= e.kind == IR_ATTR_FLOAT;
        ints[n] = e.kind == IR_ATTR_INT ? e.i : 0;
        floats[n++] = e.kind == IR_ATTR_INT ? (double)e.i : e.f;
    }
    next(p);
    *a = any_float ? ir_a_floats(a->name, n, floats) : ir_a_ints(a->name, n, ints);
    return !p->failed;
}

static const char *kind_name(ir_attr_kind k)
{
    static const char *names[] = {"an integer", "true or false", "a number", "a list of integers",
                                  "a list of numbers", "a string"};
    return (unsigned)k < sizeof names / sizeof *names ? names[k] : "?";
}

/* Checks parsed attributes against op's schema, pointing at the culprit. */
static bool check_attrs(parser *p, int op, const token *opt, const pattr *as, int n)
{
    const ir_op_info *info = &ir_ops[op];
    for (int i = 0; i < n; i++) {
        const ir_attr_spec *spec = info->attrs;
        const token where = {.line = as[i].line, .col = as[i].col};
        while (spec->name && strcmp(spec->name, as[i].a.name) != 0) spec++;
        if (!spec->name) {
            char list[256] = "";
            for (const ir_attr_spec *q = info->attrs; q->name; q++) {
                size_t used = strlen(list);
                al_fmt(list + used, sizeof list - used, "%s%s", q == info->attrs ? "it takes " : ", ", q->name);
            }
            return FAIL(&where, "unknown attribute '%s' for %s (%s)", as[i].a.name, info->name,
                        list[0] ? list : "it takes none");
        }
        ir_attr_kind k = as[i].a.kind;
        if (spec->kind != k && !(spec->kind == IR_ATTR_FLOAT && k == IR_ATTR_INT) &&
            !(spec->kind == IR_ATTR_FLOATS && k == IR_ATTR_INTS))
            return FAIL(&where, "attribute '%s' of %s must be %s, found %s", spec->name, info->name,
                        kind_name(spec->kind), kind_name(k));
        for (int j = 0; j < i; j++)
            if (strcmp(as[j].a.name, as[i].a.name) == 0)
                return FAIL(&where, "attribute '%s' is given twice", spec->name);
    }
    for (const ir_attr_spec *spec = info->attrs; spec->name; spec++) {
        int j = 0;
        while (j < n && strcmp(as[j].a.name, spec->name) != 0) j++;
        if (spec->required && j == n) return FAIL(opt, "%s needs attribute '%s'", info->name, spec->name);
    }
    return true;
}

/* typerules.c's concat and pad rules add dims without overflow checks
 * (signed overflow): refuse operands and paddings that could pass INT64_MAX. */
static bool dims_could_overflow(const ir_graph *g, int op, const int *in, int nin, const ir_attr *as, int na)
{
    int64_t extra = 0;
    for (int i = 0; op == IR_OP_pad && i < na; i++) {
        if (as[i].kind == IR_ATTR_INT && (strcmp(as[i].name, "before") == 0 || strcmp(as[i].name, "after") == 0)) {
            if (as[i].i < 0) return false; /* the rule rejects it */
            if (as[i].i > INT64_MAX / 2) return true;
            extra += as[i].i;
        }
    }
    for (int d = 0; (op == IR_OP_concat || op == IR_OP_pad) && d < ALLOY_MAX_RANK; d++) {
        int64_t sum = extra;
        for (int i = 0; i < nin; i++) {
            const ir_type *t = &g->nodes[in[i]]->type;
            if (d < t->rank && t->dims[d] > INT64_MAX - sum) return true;
            if (d < t->rank) sum += t->dims[d];
        }
    }
    return false;
}

/* !amp=<class>, !group=<n>, !inserted */
static bool parse_annotation(parser *p, ir_node *n, unsigned *seen)
{
    static const char *amps[] = {"allow", "deny", "infer", "clear"};
    static const char *words[] = {"amp", "group", "inserted", "origin"};
    next(p);
    token w = p->tok;
    int which = 0, k = 0;
    while (which < 4 && !is_word(p, words[which])) which++;
    if (which == 4) return fail_expected(p, "an annotation (amp, group, inserted or origin) after '!'");
    if (*seen & (1u << which)) return FAIL(&w, "annotation !%s is given twice", words[which]);
    *seen |= 1u << which;
    next(p);
    if (which == 2) return n->flags |= IR_NODE_INSERTED, !p->failed;
    if (!expect(p, '=', which == 3 ? "after !origin" : which ? "after !group" : "after !amp")) return false;
    if (which == 3) { /* the forward node whose gradient rule made n: defined before it */
        token ref = p->tok;
        int id = parse_use(p);
        if (id < 0) return false;
        if (id == n->id) return FAIL(&ref, "a node cannot be its own !origin");
        n->origin = id;
        return !p->failed;
    }
    token *v = &p->tok;
    if (which == 0) {
        while (k < 4 && !is_word(p, amps[k])) k++;
        if (k == 4) return fail_expected(p, "an amp class (allow, deny, infer or clear)");
        n->amp = (uint8_t)(AMP_ALLOW + k);
    } else {
        if (v->kind != T_INT || v->overflow || v->i < 0 || v->i > INT_MAX)
            return fail_expected(p, "a group number in [0, 2147483647]");
        n->group = (int)v->i;
    }
    next(p);
    return !p->failed;
}

/* Work arrays reused from statement to statement. */
typedef struct bufs {
    int *ins, incap, acap;
    pattr *attrs;
} bufs;

/* %ref = op[(operands)] [{attrs}] : type [annotations] */
static bool parse_node(parser *p, bufs *b)
{
    token def = p->tok;
    char s[64], f[96];
    if (def.is_label && def.overflow) return FAIL(&def, "label %s is too large", SRC(&def, s));
    if (!def.is_label && !def.s[0]) return FAIL(&def, "node name must not be empty");
    int prev = def.is_label ? label_find(p, def.i) : ir_find_name(p->g, def.s);
    if (prev >= 0)
        return FAIL(&def, "%s is defined twice (first on line %d)", SRC(&def, s), p->node_line[prev]);
    next(p);
    if (!expect(p, '=', "after the node name")) return false;
    token opt = p->tok;
    if (opt.kind != T_IDENT) return fail_expected(p, "an op name after '='");
    int op = ir_op_lookup(opt.s), nin = 0, nattrs = 0;
    if (op < 0) return FAIL(&opt, "unknown op '%s'", SRC(&opt, s));
    next(p);
    if (is_punct(p, '(')) {
        for (next(p); !p->failed && !is_punct(p, ')');) {
            if (nin > 0 && !is_punct(p, ','))
                return FAIL(&p->tok, "expected ')' after operand list, found %s",
                            found(p, &p->tok, f, sizeof f));
            if (nin > 0) next(p);
            int id = parse_use(p);
            if (id < 0 || !(b->ins = grow(p, b->ins, &b->incap, nin + 1, sizeof *b->ins))) return false;
            b->ins[nin++] = id;
        }
        next(p);
    }
    if (is_punct(p, '{')) {
        for (next(p); !p->failed && !is_punct(p, '}');) {
            if (nattrs > 0 && !expect(p, ',', "or '}' after attribute")) return false;
            token name = p->tok;
            if (name.kind != T_IDENT) return fail_expected(p, "an attribute name");
            next(p);
            al_fmt(s, sizeof s, "after attribute name '%s'", name.s);
            if (!expect(p, '=', s) || !(b->attrs = grow(p, b->attrs, &b->acap, nattrs + 1, sizeof *b->attrs)))
                return false;
            pattr *pa = &b->attrs[nattrs++];
            *pa = (pattr){.a = {.name = name.s}, .line = name.line, .col = name.col};
            if (!parse_value(p, &pa->a, false)) return false;
        }
        next(p);
    }
    if (p->failed || !check_attrs(p, op, &opt, b->attrs, nattrs)) return false;
    if (!expect(p, ':', "before the node's type")) return false;
    token tyt = p->tok;
    ir_type ty;
    if (!parse_type(p, &ty)) return false;
    ir_attr *plain = nattrs ? al_arena_alloc(&p->scratch, sizeof *plain * (size_t)nattrs) : NULL;
    if (nattrs && !plain) return FAIL(&opt, "out of memory");
    for (int i = 0; i < nattrs; i++) plain[i] = b->attrs[i].a;
    ir_graph *g = p->g;
    if (dims_could_overflow(g, op, b->ins, nin, plain, nattrs))
        return FAIL(&opt, "%s: the result's dims would exceed 2^63-1", ir_ops[op].name);
    /* every op gets the written type: declared-type ops read it, the others overwrite it */
    ir_node *n = ir_add_node(g, op, nin, b->ins, nattrs, plain, &ty, def.is_label ? NULL : def.s);
    if (!n) return FAIL(&opt, "%s", g->error);
    if (!(p->node_line = grow(p, p->node_line, &p->node_cap, g->nnodes, sizeof(int)))) return false;
    p->node_line[n->id] = def.line;
    if (def.is_label && !label_put(p, def.i, n->id)) return FAIL(&def, "out of memory");
    if (!ir_type_eq(&n->type, &ty)) {
        char want[128], got[128];
        ir_fmt_type(want, sizeof want, &ty);
        ir_fmt_type(got, sizeof got, &n->type);
        return FAIL(&tyt, "declared %s but %s gives %s", want, ir_ops[op].name, got);
    }
    unsigned seen = 0;
    while (!p->failed && is_punct(p, '!'))
        if (!parse_annotation(p, n, &seen)) return false;
    return !p->failed;
}

/* output "name" = %ref   |   update "state" = %ref   |   loss %ref */
static bool parse_output_or_loss(parser *p)
{
    bool is_loss = is_word(p, "loss"), is_update = is_word(p, "update");
    token kw = p->tok, name = {0};
    char s[64], t[128];
    next(p);
    if (!is_loss) {
        name = p->tok;
        if (name.kind != T_STR)
            return fail_expected(p, is_update ? "the state's name as a string after 'update'"
                                              : "the output's name as a string after 'output'");
        if (!name.s[0]) return FAIL(&name, "%s name must not be empty", is_update ? "update" : "output");
        if (!is_update && ir_find_output(p->g, name.s) >= 0)
            return FAIL(&name, "output %s is declared twice", SRC(&name, s));
        if (is_update && ir_find_update(p->g, name.s) >= 0)
            return FAIL(&name, "state %s is updated twice", SRC(&name, s));
        next(p);
        if (!expect(p, '=', "after the output's name")) return false;
    }
    token ref = p->tok;
    int id = parse_use(p);
    if (id < 0) return false;
    if (is_update) return ir_add_update(p->g, name.s, id) ? FAIL(&kw, "%s", p->g->error) : true;
    if (!is_loss) return ir_add_output(p->g, name.s, id) ? FAIL(&kw, "%s", p->g->error) : true;
    if (p->g->loss >= 0) return FAIL(&kw, "loss is declared twice");
    const ir_type *ty = &p->g->nodes[id]->type;
    ir_fmt_type(t, sizeof t, ty);
    if (ty->rank != 0 || !ir_is_float(ty->dtype))
        return FAIL(&ref, "loss %s must be a floating-point scalar, found %s", SRC(&ref, s), t);
    p->g->loss = id;
    return true;
}

static void skip_newlines(parser *p)
{
    while (p->tok.kind == T_NL) next(p);
}

/* graph <name> { <statements> } */
static bool parse_graph(parser *p, bufs *b)
{
    char f[96];
    next(p);
    skip_newlines(p);
    if (!is_word(p, "graph")) return fail_expected(p, "'graph' at the start of the file");
    next(p);
    if (p->tok.kind != T_IDENT && p->tok.kind != T_STR) return fail_expected(p, "a graph name after 'graph'");
    if (!(p->g = ir_graph_new(p->tok.s))) return FAIL(&p->tok, "out of memory");
    next(p);
    if (!expect(p, '{', "after the graph name")) return false;
    if (p->tok.kind != T_NL && p->tok.kind != T_EOF) return fail_expected(p, "end of line after '{'");
    for (skip_newlines(p); !p->failed && !is_punct(p, '}'); skip_newlines(p)) {
        const char *what = p->tok.kind == T_REF ? "node" : is_word(p, "output") ? "output"
                           : is_word(p, "update") ? "update" : "loss";
        if (p->tok.kind == T_EOF) return FAIL(&p->tok, "expected '}' before end of file");
        if (p->tok.kind == T_REF) parse_node(p, b);
        else if (is_word(p, "output") || is_word(p, "update") || is_word(p, "loss")) parse_output_or_loss(p);
        else return fail_expected(p, "a statement (%name = op..., output, update, loss) or '}'");
        if (p->tok.kind != T_NL && p->tok.kind != T_EOF)
            return FAIL(&p->tok, "expected end of line after %s, found %s", what,
                        found(p, &p->tok, f, sizeof f));
    }
    if (p->failed) return false;
    token close = p->tok;
    next(p);
    skip_newlines(p);
    if (p->tok.kind != T_EOF) return fail_expected(p, "end of file after '}'");
    if (ir_verify(p->g)) return FAIL(&close, "graph fails verification: %s", p->g->error);
    return !p->failed;
}

/* Parses IR text (text[0..len), need not be NUL-terminated) into a new
 * verified graph; on error returns NULL and writes "file:line:col: message". */
ir_graph *ir_parse(const char *text, size_t len, const char *filename, char *err, size_t errlen)
{
    parser p = {.text = text ? text : "", .len = text ? len : 0, .file = filename ? filename : "<input>",
                .line = 1, .err = err, .errlen = errlen, .tok = {.kind = T_BAD}};
    bufs b = {0};
    if (err && errlen) err[0] = '\0';
    bool ok = parse_graph(&p, &b);
    al_free(b.ins);
    al_free(b.attrs);
    al_free(p.node_line);
    al_free(p.labels);
    al_arena_free(&p.scratch);
    if (ok) return p.g;
    ir_graph_free(p.g);
    return NULL;
}
