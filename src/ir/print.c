/* print.c - writes a graph in the IR text format (docs/ir.md), to a FILE or a string. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

/* Where text goes: a FILE, or a growing heap buffer (failed sticks on OOM). */
typedef struct sink {
    FILE *f;
    char *buf;
    size_t len, cap;
    bool failed;
} sink;

static void put(sink *s, const char *p, size_t n)
{
    if (s->failed || !n) return;
    if (s->f) {
        if (fwrite(p, 1, n, s->f) != n) s->failed = true;
        return;
    }
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + n + 1) cap *= 2;
        char *b = al_realloc(s->buf, cap);
        if (!b) {
            s->failed = true;
            return;
        }
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    s->buf[s->len] = '\0';
}

static void put_str(sink *s, const char *str) { put(s, str, strlen(str)); }

static void putf(sink *s, const char *fmt, ...) AL_PRINTF(2, 3);
static void putf(sink *s, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    put(s, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static bool is_bare(const char *name)
{
    if (!name || !*name) return false;
    unsigned char c = (unsigned char)name[0];
    if (!(c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))) return false;
    for (const char *p = name + 1; *p; p++) {
        c = (unsigned char)*p;
        if (!(c == '_' || c == '.' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
              (c >= '0' && c <= '9')))
            return false;
    }
    return true;
}

/* A double-quoted string with C escapes; bytes >= 0x80 pass through (UTF-8). */
static void put_quoted(sink *s, const char *str)
{
    put(s, "\"", 1);
    const char *run = str;
    for (const char *p = str ? str : ""; *p; p++) {
        unsigned char c = (unsigned char)*p;
        const char *esc = NULL;
        char hex[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\t': esc = "\\t"; break;
        case '\r': esc = "\\r"; break;
        default:
            if (c < 0x20 || c == 0x7f) {
                snprintf(hex, sizeof hex, "\\x%02x", c);
                esc = hex;
            }
        }
        if (!esc) continue;
        put(s, run, (size_t)(p - run));
        put_str(s, esc);
        run = p + 1;
    }
    if (str) put_str(s, run);
    put(s, "\"", 1);
}

static void put_name(sink *s, const char *name)
{
    if (is_bare(name)) put_str(s, name);
    else put_quoted(s, name);
}

static void put_ref(sink *s, const ir_graph *g, int id)
{
    put(s, "%", 1);
    if (id >= 0 && id < g->nnodes && g->nodes[id] && g->nodes[id]->name) put_name(s, g->nodes[id]->name);
    else putf(s, "%d", id);
}

/* Removes the '+' and leading zeros of an exponent: "1e+05" -> "1e5". */
static void tidy_exponent(char *buf)
{
    char *e = strchr(buf, 'e');
    if (!e) return;
    char *src = e + 1, *dst = e + 1;
    if (*src == '+') src++;
    else if (*src == '-') *dst++ = *src++;
    while (*src == '0' && src[1]) src++;
    memmove(dst, src, strlen(src) + 1);
}

/* The shortest decimal that reads back as exactly v, always with '.' or 'e'
 * (or inf / -inf / nan) so that it reads back as a float. */
static void fmt_float(char *buf, size_t len, double v)
{
    if (isnan(v)) {
        al_fmt(buf, len, "nan");
        return;
    }
    if (isinf(v)) {
        al_fmt(buf, len, v < 0 ? "-inf" : "inf");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        al_fmt(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    tidy_exponent(buf);
    if (!strpbrk(buf, ".e")) {
        size_t n = strlen(buf);
        if (n + 3 <= len) memcpy(buf + n, ".0", 3);
    }
}

static void put_attr(sink *s, const ir_attr *a)
{
    char num[64];
    put_str(s, a->name ? a->name : "?");
    put(s, "=", 1);
    switch (a->kind) {
    case IR_ATTR_INT: putf(s, "%lld", (long long)a->i); break;
    case IR_ATTR_BOOL: put_str(s, a->i ? "true" : "false"); break;
    case IR_ATTR_FLOAT:
        fmt_float(num, sizeof num, a->f);
        put_str(s, num);
        break;
    case IR_ATTR_STR: put_quoted(s, a->s); break;
    case IR_ATTR_INTS:
    case IR_ATTR_FLOATS:
        put(s, "[", 1);
        for (int i = 0; i < a->n; i++) {
            if (i) put(s, ", ", 2);
            if (a->kind == IR_ATTR_INTS) {
                putf(s, "%lld", a->ints ? (long long)a->ints[i] : 0LL);
            } else {
                fmt_float(num, sizeof num, a->floats ? a->floats[i] : 0.0);
                put_str(s, num);
            }
        }
        put(s, "]", 1);
        break;
    default: put_str(s, "?"); break;
    }
}

static void put_type(sink *s, const ir_type *t)
{
    put_str(s, alloy_dtype_name(t->dtype));
    put(s, "[", 1);
    int rank = t->rank < 0 ? 0 : t->rank > ALLOY_MAX_RANK ? ALLOY_MAX_RANK : t->rank;
    for (int i = 0; i < rank; i++) putf(s, i ? ",%lld" : "%lld", (long long)t->dims[i]);
    put(s, "]", 1);
}

static const char *amp_name(int amp)
{
    switch (amp) {
    case AMP_ALLOW: return "allow";
    case AMP_DENY: return "deny";
    case AMP_INFER: return "infer";
    case AMP_CLEAR: return "clear";
    default: return "?";
    }
}

static void put_node(sink *s, const ir_graph *g, int i)
{
    const ir_node *n = g->nodes[i];
    put_str(s, "  ");
    if (!n) {
        putf(s, "# node %d is missing\n", i);
        return;
    }
    put_ref(s, g, i);
    put(s, " = ", 3);
    put_str(s, n->op < IR_OP_COUNT ? ir_ops[n->op].name : "?");
    if (n->nin > 0 && n->in) {
        put(s, "(", 1);
        for (int j = 0; j < n->nin; j++) {
            if (j) put(s, ", ", 2);
            put_ref(s, g, n->in[j]);
        }
        put(s, ")", 1);
    }
    if (n->nattrs > 0 && n->attrs) {
        put(s, " {", 2);
        for (int j = 0; j < n->nattrs; j++) {
            if (j) put(s, ", ", 2);
            put_attr(s, &n->attrs[j]);
        }
        put(s, "}", 1);
    }
    put(s, " : ", 3);
    put_type(s, &n->type);
    if (n->amp != AMP_NONE) putf(s, " !amp=%s", amp_name(n->amp));
    if (n->group >= 0) putf(s, " !group=%d", n->group);
    if (n->flags & IR_NODE_INSERTED) put_str(s, " !inserted");
    if (n->origin >= 0 && n->origin < g->nnodes) { /* a backward node: the forward node it is the gradient of */
        put_str(s, " !origin=");
        put_ref(s, g, n->origin);
    }
    put(s, "\n", 1);
}

static void put_graph(sink *s, const ir_graph *g)
{
    put_str(s, "graph ");
    put_name(s, g->name ? g->name : "graph");
    put_str(s, " {\n");
    for (int i = 0; i < g->nnodes && g->nodes; i++) put_node(s, g, i);
    for (int i = 0; i < g->noutputs && g->outputs; i++) {
        put_str(s, "  output ");
        put_quoted(s, g->outputs[i].name);
        put(s, " = ", 3);
        put_ref(s, g, g->outputs[i].node);
        put(s, "\n", 1);
    }
    for (int i = 0; i < g->nupdates && g->updates; i++) {
        put_str(s, "  update ");
        put_quoted(s, g->updates[i].name);
        put(s, " = ", 3);
        put_ref(s, g, g->updates[i].node);
        put(s, "\n", 1);
    }
    if (g->loss >= 0) {
        put_str(s, "  loss ");
        put_ref(s, g, g->loss);
        put(s, "\n", 1);
    }
    put_str(s, "}\n");
}

/* Prints g in the IR text format; tolerates a corrupted graph (prints '?'
 * for what it cannot name) so that verifier failures can be inspected. */
void ir_print(const ir_graph *g, FILE *out)
{
    if (!g || !out) return;
    sink s = {.f = out};
    put_graph(&s, g);
}

/* The text ir_print would write, in one al_malloc'd string; NULL on OOM. */
char *ir_print_string(const ir_graph *g)
{
    if (!g) return NULL;
    sink s = {0};
    put_graph(&s, g);
    if (s.failed) {
        al_free(s.buf);
        return NULL;
    }
    return s.buf;
}
