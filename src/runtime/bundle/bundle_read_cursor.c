/* bundle_read_cursor.c - the bundle reader's cursor over one section: fixed-width integers, ranges, counts and types, each checked, the first failure kept with the byte it was found at. */
#include <inttypes.h>
#include <limits.h>

#include "runtime/bundle/bundle_read.h"

/* Records the first failure: fmt takes what and v; returns false. */
bool bundle_rd_fail(bundle_rd *r, const char *fmt, const char *what, int64_t v)
{
    if (r->bad) return false;
    r->bad = true;
    char msg[256];
    al_fmt(msg, sizeof msg, fmt, what, v);
    al_fmt(r->err, r->errlen, "%s: section %s at byte %zu: %s", r->where, r->section, r->base + r->pos, msg);
    return false;
}

/* An allocation failed while reading what (n items). */
bool bundle_rd_oom(bundle_rd *r, const char *what, int64_t n)
{
    if (!r->bad) r->oom = true;
    return bundle_rd_fail(r, "%s: out of memory (%" PRId64 " items)", what, n);
}

/* Whether n more bytes are left; a "section too short" failure if not. */
bool bundle_rd_need(bundle_rd *r, size_t n, const char *what)
{
    if (r->bad) return false;
    if (r->len - r->pos < n)
        return bundle_rd_fail(r, "%s: section too short (%" PRId64 " more bytes needed)", what,
                              (int64_t)(n - (r->len - r->pos)));
    return true;
}

/* A little-endian u64 (0 after a failure). */
uint64_t bundle_rd_u64(bundle_rd *r, const char *what)
{
    if (!bundle_rd_need(r, 8, what)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)r->p[r->pos + i] << (8 * i);
    r->pos += 8;
    return v;
}

/* A little-endian u32 (0 after a failure). */
uint32_t bundle_rd_u32(bundle_rd *r, const char *what)
{
    if (!bundle_rd_need(r, 4, what)) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)r->p[r->pos + i] << (8 * i);
    r->pos += 4;
    return v;
}

/* An int32 in [lo, hi]; out of range records an error naming what. */
int bundle_rd_int(bundle_rd *r, const char *what, int64_t lo, int64_t hi)
{
    size_t at = r->pos;
    int v = (int)(int32_t)bundle_rd_u32(r, what);
    if (!r->bad && (v < lo || v > hi)) {
        r->pos = at;
        char range[96];
        al_fmt(range, sizeof range, "%%s = %%" PRId64 " is outside [%" PRId64 ", %" PRId64 "]", lo, hi);
        bundle_rd_fail(r, range, what, v);
        return (int)lo;
    }
    return v;
}

/* A count of items of at least `each` bytes that must fit in what is left. */
int bundle_rd_count(bundle_rd *r, const char *what, size_t each)
{
    int n = bundle_rd_int(r, what, 0, INT_MAX / 2);
    if (!r->bad && (size_t)n > (r->len - r->pos) / (each ? each : 1)) {
        bundle_rd_fail(r, "%s = %" PRId64 " does not fit in the section", what, n);
        return 0;
    }
    return n;
}

/* A type: dtype, rank (i32s), then each dimension (i64, >= 0). */
ir_type bundle_rd_type(bundle_rd *r, const char *what)
{
    ir_type t = {0};
    t.dtype = (alloy_dtype)bundle_rd_int(r, what, 0, ALLOY_DTYPE_COUNT - 1);
    t.rank = bundle_rd_int(r, what, 0, ALLOY_MAX_RANK);
    for (int d = 0; d < t.rank && !r->bad; d++) {
        t.dims[d] = (int64_t)bundle_rd_u64(r, what);
        if (t.dims[d] < 0) bundle_rd_fail(r, "%s: negative dimension %" PRId64, what, t.dims[d]);
    }
    return t;
}

/* Whether the section was read whole with no failure. */
bool bundle_rd_done(bundle_rd *r)
{
    if (!r->bad && r->pos != r->len) bundle_rd_fail(r, "%s: %" PRId64 " bytes left over at its end", "section",
                                                   (int64_t)(r->len - r->pos));
    return !r->bad;
}
