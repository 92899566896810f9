/* json.c - a small strict JSON reader (RFC 8259) into an arena tree, used by the safetensors reader. */
#include <string.h>

#include "runtime/io/json.h"

#define MAX_DEPTH 64

typedef struct parser {
    const unsigned char *s;
    size_t len, pos;
    al_arena *arena;
    al_json_error *err;
    al_json_status status;
} parser;

static bool fail(parser *p, size_t at, const char *msg)
{
    if (p->status == AL_JSON_OK) {
        p->status = AL_JSON_SYNTAX;
        p->err->offset = at;
        al_fmt(p->err->msg, sizeof p->err->msg, "%s", msg);
    }
    return false;
}

static bool oom(parser *p)
{
    if (p->status == AL_JSON_OK) {
        p->status = AL_JSON_OOM;
        p->err->offset = p->pos;
        al_fmt(p->err->msg, sizeof p->err->msg, "out of memory");
    }
    return false;
}

/* Length of the well-formed UTF-8 sequence at s (avail bytes left), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t avail)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;      /* overlong */
        else if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;      /* overlong */
        else if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
    } else
        return 0;
    if (avail < n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

/* See json.h: strict UTF-8 check. */
bool al_utf8_valid(const char *s, size_t len, size_t *bad)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t n = utf8_seq(u + i, len - i);
        if (!n) {
            if (bad) *bad = i;
            return false;
        }
        i += n;
    }
    return true;
}

static void skip_ws(parser *p)
{
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static al_json *new_node(parser *p, al_json_kind kind, size_t offset)
{
    al_json *v = al_arena_alloc(p->arena, sizeof *v);
    if (!v) {
        oom(p);
        return NULL;
    }
    v->kind = kind;
    v->offset = offset;
    return v;
}

static int hex4(const unsigned char *s)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

static size_t put_utf8(char *o, unsigned long cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* At a '"': decodes the string into the arena; sets *out and *outlen. */
static bool parse_string(parser *p, const char **out, size_t *outlen)
{
    size_t start = p->pos++;
    /* First pass: find the closing quote; escapes never grow when decoded. */
    size_t end = p->pos;
    while (end < p->len && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->len) return fail(p, start, "unterminated string");
    char *o = al_arena_alloc(p->arena, end - p->pos + 1);
    if (!o) return oom(p);
    size_t n = 0;
    while (p->pos < end) {
        unsigned char c = p->s[p->pos];
        if (c < 0x20) return fail(p, p->pos, "control character in string (must be escaped)");
        if (c >= 0x80) {
            size_t k = utf8_seq(p->s + p->pos, end - p->pos);
            if (!k) return fail(p, p->pos, "invalid UTF-8 in string");
            memcpy(o + n, p->s + p->pos, k);
            n += k;
            p->pos += k;
            continue;
        }
        if (c != '\\') {
            o[n++] = (char)c;
            p->pos++;
            continue;
        }
        size_t esc = p->pos;
        unsigned char e = p->s[p->pos + 1];
        p->pos += 2;
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            int hi = end - p->pos >= 4 ? hex4(p->s + p->pos) : -1;
            if (hi < 0) return fail(p, esc, "invalid \\u escape (need 4 hex digits)");
            p->pos += 4;
            unsigned long cp = (unsigned long)hi;
            if (hi >= 0xDC00 && hi <= 0xDFFF) return fail(p, esc, "unpaired low surrogate in \\u escape");
            if (hi >= 0xD800 && hi <= 0xDBFF) {
                int lo = end - p->pos >= 6 && p->s[p->pos] == '\\' && p->s[p->pos + 1] == 'u'
                             ? hex4(p->s + p->pos + 2)
                             : -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return fail(p, esc, "unpaired high surrogate in \\u escape");
                p->pos += 6;
                cp = 0x10000 + (((unsigned long)hi - 0xD800) << 10) + ((unsigned long)lo - 0xDC00);
            }
            n += put_utf8(o + n, cp);
            break;
        }
        default: return fail(p, esc, "invalid escape sequence in string");
        }
    }
    o[n] = '\0';
    p->pos = end + 1;
    *out = o;
    *outlen = n;
    return true;
}

static bool parse_number(parser *p, al_json *v)
{
    size_t start = p->pos;
    bool neg = false;
    if (p->s[p->pos] == '-') {
        neg = true;
        p->pos++;
    }
    if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
        return fail(p, p->pos, "expected a digit");
    uint64_t mag = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    bool overflow = false;
    if (p->s[p->pos] == '0') p->pos++;
    else
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
            unsigned d = p->s[p->pos++] - '0';
            if (mag > (limit - d) / 10) overflow = true;
            else mag = mag * 10 + d;
        }
    bool is_int = true;
    if (p->pos < p->len && p->s[p->pos] == '.') {
        is_int = false;
        p->pos++;
        if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
            return fail(p, p->pos, "expected a digit after '.'");
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        is_int = false;
        p->pos++;
        if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
            return fail(p, p->pos, "expected a digit in the exponent");
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    }
    v->raw = (const char *)p->s + start;
    v->raw_len = p->pos - start;
    v->is_int = is_int;
    v->overflow = is_int && overflow;
    if (is_int && !overflow) v->i = neg ? (mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    return true;
}

static bool parse_literal(parser *p, const char *word)
{
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return fail(p, p->pos, "invalid literal (expected true, false or null)");
    p->pos += n;
    return true;
}

static al_json *parse_value(parser *p, int depth);

/* Parses the items of an array (object when is_obj) after the opening bracket. */
static bool parse_items(parser *p, al_json *v, bool is_obj, int depth)
{
    char close = is_obj ? '}' : ']';
    al_json **tail = &v->first;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return true;
    }
    for (;;) {
        const char *key = NULL;
        size_t key_len = 0, key_offset = 0;
        if (is_obj) {
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != '"')
                return fail(p, p->pos, "expected a string key");
            key_offset = p->pos;
            if (!parse_string(p, &key, &key_len)) return false;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':')
                return fail(p, p->pos, "expected ':' after object key");
            p->pos++;
        }
        al_json *item = parse_value(p, depth + 1);
        if (!item) return false;
        item->key = key;
        item->key_len = key_len;
        item->key_offset = key_offset;
        *tail = item;
        tail = &item->next;
        v->count++;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == close) {
            p->pos++;
            return true;
        }
        return fail(p, p->pos, is_obj ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
    }
}

static al_json *parse_value(parser *p, int depth)
{
    skip_ws(p);
    if (p->pos >= p->len) {
        fail(p, p->pos, "unexpected end of JSON (expected a value)");
        return NULL;
    }
    if (depth > MAX_DEPTH) {
        fail(p, p->pos, "nesting deeper than 64 levels");
        return NULL;
    }
    size_t at = p->pos;
    unsigned char c = p->s[at];
    al_json_kind kind;
    switch (c) {
    case '{': kind = AL_JSON_OBJECT; break;
    case '[': kind = AL_JSON_ARRAY; break;
    case '"': kind = AL_JSON_STRING; break;
    case 't': kind = AL_JSON_TRUE; break;
    case 'f': kind = AL_JSON_FALSE; break;
    case 'n': kind = AL_JSON_NULL; break;
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            kind = AL_JSON_NUMBER;
            break;
        }
        fail(p, at, "unexpected character (expected a value)");
        return NULL;
    }
    al_json *v = new_node(p, kind, at);
    if (!v) return NULL;
    bool ok;
    switch (kind) {
    case AL_JSON_OBJECT:
    case AL_JSON_ARRAY: p->pos++; ok = parse_items(p, v, kind == AL_JSON_OBJECT, depth); break;
    case AL_JSON_STRING: ok = parse_string(p, &v->str, &v->len); break;
    case AL_JSON_NUMBER: ok = parse_number(p, v); break;
    case AL_JSON_TRUE: ok = parse_literal(p, "true"); break;
    case AL_JSON_FALSE: ok = parse_literal(p, "false"); break;
    default: ok = parse_literal(p, "null"); break;
    }
    return ok ? v : NULL;
}

/* See json.h: one value, whitespace around it, nothing else. */
al_json_status al_json_parse(const char *text, size_t len, al_arena *arena, al_json **out,
                             al_json_error *err)
{
    parser p = {(const unsigned char *)text, len, 0, arena, err, AL_JSON_OK};
    err->offset = 0;
    err->msg[0] = '\0';
    *out = NULL;
    al_json *v = parse_value(&p, 1);
    if (v) {
        skip_ws(&p);
        if (p.pos < p.len) fail(&p, p.pos, "trailing characters after the JSON value");
    }
    if (p.status == AL_JSON_OK) *out = v;
    return p.status;
}
