/* json.h - a small strict JSON reader (RFC 8259) into an arena tree, used by the safetensors reader. */
#ifndef ALLOY_JSON_H
#define ALLOY_JSON_H

#include "base/base.h"

typedef enum al_json_kind {
    AL_JSON_NULL,
    AL_JSON_FALSE,
    AL_JSON_TRUE,
    AL_JSON_NUMBER,
    AL_JSON_STRING,
    AL_JSON_ARRAY,
    AL_JSON_OBJECT
} al_json_kind;

typedef struct al_json al_json;
struct al_json {
    al_json_kind kind;
    size_t offset;   /* byte offset in the text where the value starts */
    al_json *next;   /* next item of the enclosing array or object */
    const char *key; /* member name (members of objects only), NUL-terminated */
    size_t key_len;  /* bytes of key; a key with "\u0000" has strlen(key) < key_len */
    size_t key_offset;
    /* AL_JSON_STRING: decoded UTF-8, NUL-terminated; may contain NUL (see key_len). */
    const char *str;
    size_t len;
    /* AL_JSON_NUMBER: the literal as written (raw, raw_len, not terminated).
     * is_int: no fraction or exponent; then i holds the value unless overflow. */
    const char *raw;
    size_t raw_len;
    bool is_int, overflow;
    int64_t i;
    /* AL_JSON_ARRAY / AL_JSON_OBJECT: the items (members) in text order. */
    al_json *first;
    size_t count;
};

typedef enum al_json_status { AL_JSON_OK = 0, AL_JSON_SYNTAX, AL_JSON_OOM } al_json_status;

/* Why a parse failed: a message and the byte offset of the problem in text. */
typedef struct al_json_error {
    size_t offset;
    char msg[96];
} al_json_error;

/* Parses text[0..len) as exactly one JSON value with optional surrounding
 * whitespace. Nodes and strings live in arena (free it to drop the tree).
 * Nesting deeper than 64 is a syntax error. On AL_JSON_SYNTAX err says what
 * and where; on AL_JSON_OOM an allocation failed. */
AL_HIDDEN al_json_status al_json_parse(const char *text, size_t len, al_arena *arena,
                                       al_json **out, al_json_error *err);
/* Whether s[0..len) is well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF).
 * On false, *bad (if not NULL) is the offset of the first bad byte. */
AL_HIDDEN bool al_utf8_valid(const char *s, size_t len, size_t *bad);

#endif
