/* emu_slots.c - the emulated device's global-memory checker (emu_slots.h). */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_slots.h"

/* An overrun this far past an allocation's end (or before its start) is still the allocation's. */
enum { redzone = 256 };

/* A device allocation; a fresh one (the arena, the aux block) has a shadow word per byte: the step
 * generation that wrote it in the top 8 bits, the value it holds (tag) in the low 24 (0: any). */
typedef struct region {
    const char *base;
    size_t bytes;
    uint32_t *shadow;
    uint32_t gen; /* 1..255: the step's */
    /* per byte, the last launch and block that wrote it (plainly) and that read it:
     * launch serial << 20 | block (the block's low 20 bits) */
    uint32_t *race;
} region;

/* The checked launches' serial, 1..4095 (race cells of an older serial are stale). */
static uint32_t serial;

/* Every allocation of every emulated device, by base address. */
static region **regions;
static int nregions, cap_regions;

/* The index of the first region whose base is above p. */
static int upper(const char *p)
{
    int lo = 0, hi = nregions;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (regions[mid]->base <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The allocation p lies in, or in the zone around; NULL when none. */
static region *region_of(const char *p)
{
    if (!nregions || p < regions[0]->base - redzone ||
        p >= regions[nregions - 1]->base + regions[nregions - 1]->bytes + redzone)
        return NULL;
    int i = upper(p);
    if (i > 0 && p < regions[i - 1]->base + regions[i - 1]->bytes + redzone) return regions[i - 1];
    if (i < nregions && p >= regions[i]->base - redzone) return regions[i];
    return NULL;
}

void emu_slots_alloc(const void *base, size_t bytes)
{
    region *r = calloc(1, sizeof *r);
    if (!r) return; /* an allocation the checker does not know: unchecked */
    if (nregions == cap_regions) {
        int cap = cap_regions ? 2 * cap_regions : 64;
        region **grown = realloc(regions, sizeof *grown * (size_t)cap);
        if (!grown) {
            free(r);
            return;
        }
        regions = grown, cap_regions = cap;
    }
    r->base = base, r->bytes = bytes;
    int i = upper(base);
    memmove(regions + i + 1, regions + i, sizeof *regions * (size_t)(nregions - i));
    regions[i] = r;
    nregions++;
}

void emu_slots_release(const void *base)
{
    int i = upper(base) - 1;
    if (i < 0 || regions[i]->base != base) return;
    free(regions[i]->shadow);
    free(regions[i]->race);
    free(regions[i]);
    memmove(regions + i, regions + i + 1, sizeof *regions * (size_t)(nregions - i - 1));
    nregions--;
}

void emu_slots_step_begin(const cdev_ptr *fresh, int n)
{
    if (!emu_checking()) return;
    for (int k = 0; k < n; k++) {
        const char *p = (const char *)(uintptr_t)fresh[k];
        int i = p ? upper(p) - 1 : -1;
        if (i < 0 || regions[i]->base != p) continue;
        region *r = regions[i];
        if (!r->shadow && !(r->shadow = calloc(r->bytes + 1, sizeof *r->shadow))) continue; /* unchecked */
        if (!r->race) r->race = calloc(2 * r->bytes + 1, sizeof *r->race); /* NULL: no race checks */
        if (++r->gen == 256) { /* generations wrap: clear once every 255 steps */
            memset(r->shadow, 0, sizeof *r->shadow * r->bytes);
            r->gen = 1;
        }
    }
}

emu_action emu_action_copy(const cdev_extent *ext, int n)
{
    emu_action a = {NULL, 0};
    if (n <= 0 || !(a.ext = malloc(sizeof *ext * (size_t)n))) return a;
    memcpy(a.ext, ext, sizeof *ext * (size_t)n);
    a.n = n;
    return a;
}

void emu_action_free(emu_action *a)
{
    free(a->ext);
    a->ext = NULL, a->n = 0;
}

enum { acc_read, acc_write, acc_atomic, acc_fence }; /* emu_shadow.h's access_kind */

static bool inside(const cdev_extent *x, const char *at, size_t n)
{
    const char *base = (const char *)(uintptr_t)x->base;
    return x->base && at >= base && at + n <= base + x->bytes;
}

/* "slot %3 (add) (arena offset 256, 64 bytes)" */
static void describe_extent(char *out, size_t len, const cdev_extent *x)
{
    static const char *const space[] = {"arena", "leaf buffer", "aux block"};
    snprintf(out, len, "slot %s (%s offset %" PRId64 ", %" PRIu64 " bytes)", x->name, space[x->space < 3 ? x->space : 0],
             x->offset, x->bytes);
}

/* The bytes at p as the value read: hex, and as a float or double at 4 or 8 bytes. */
static void describe_value(char *out, size_t len, const char *p, size_t n)
{
    size_t used = (size_t)snprintf(out, len, "0x");
    for (size_t i = n < 8 ? n : 8; i-- > 0 && used < len;) used += (size_t)snprintf(out + used, len - used, "%02x", (unsigned char)p[i]);
    if (n == 4) {
        float f;
        memcpy(&f, p, 4);
        snprintf(out + used, len - used, " = %g as f32", (double)f);
    } else if (n == 8) {
        double d;
        memcpy(&d, p, 8);
        snprintf(out + used, len - used, " = %g as f64", d);
    }
}

/* An access outside every extent of a, in allocation r: which extents it misses, and by how much. */
static void describe_outside(char *out, size_t len, const emu_action *a, const region *r, const char *at, size_t n,
                             const char *verb)
{
    const cdev_extent *below = NULL, *above = NULL;
    for (int i = 0; i < a->n; i++) {
        const cdev_extent *x = &a->ext[i];
        const char *base = (const char *)(uintptr_t)x->base;
        if (!x->base || region_of(base) != r) continue;
        if (base <= at && (!below || base > (const char *)(uintptr_t)below->base)) below = x;
        if (base > at && (!above || base < (const char *)(uintptr_t)above->base)) above = x;
    }
    size_t used = (size_t)snprintf(out, len,
                                   "%s %zu bytes at %p (offset %td of a device allocation of %zu bytes), outside every "
                                   "slot the launch's arguments point into",
                                   verb, n, (const void *)at, at - r->base, r->bytes);
    char slot[200];
    if (below && used < len) {
        describe_extent(slot, sizeof slot, below);
        const char *end = (const char *)(uintptr_t)below->base + below->bytes;
        used += (size_t)snprintf(out + used, len - used, ": %td bytes past the end of %s", at - end, slot);
    }
    if (above && used < len) {
        describe_extent(slot, sizeof slot, above);
        snprintf(out + used, len - used, "%s %td bytes before %s", below ? "," : ":",
                 (const char *)(uintptr_t)above->base - (at + n), slot);
    }
}

/* Whether a read of byte s's value is one of the extents of a that hold [at, at + n) (the value
 * written in place over an operand shares its operand's slot). */
static bool holds(const emu_action *a, const char *at, size_t n, uint32_t tag)
{
    for (int i = 0; i < a->n; i++)
        if (inside(&a->ext[i], at, n) && (!a->ext[i].tag || (a->ext[i].tag & 0xffffffu) == tag)) return true;
    return false;
}

/* The poison check of a read of [at, at + n) through extent x of a, in fresh region r. */
static bool read_written(const emu_action *a, const cdev_extent *x, const region *r, const char *at, size_t n,
                         const char *verb, char *msg, size_t len)
{
    const uint32_t *s = r->shadow + (at - r->base);
    for (size_t i = 0; i < n; i++) {
        uint32_t gen = s[i] >> 24, tag = s[i] & 0xffffffu;
        if (gen == r->gen && (!tag || holds(a, at, n, tag))) continue;
        char slot[200], value[64];
        describe_extent(slot, sizeof slot, x);
        describe_value(value, sizeof value, at, n);
        const char *base = (const char *)(uintptr_t)x->base;
        if (gen != r->gen)
            snprintf(msg, len, "%s %zu bytes at %p, byte %td of %s, which no action of this step has written (value %s)",
                     verb, n, (const void *)at, at - base, slot, value);
        else
            snprintf(msg, len,
                     "%s %zu bytes at %p, byte %td of %s, which is dead: this step has written the value of node %u "
                     "over it since (value %s)",
                     verb, n, (const void *)at, at - base, slot, tag - 1, value);
        return false;
    }
    return true;
}

static void mark(const cdev_extent *x, const region *r, const char *at, size_t n)
{
    uint32_t w = r->gen << 24 | (x ? x->tag & 0xffffffu : 0);
    uint32_t *s = r->shadow + (at - r->base);
    for (size_t i = 0; i < n; i++) s[i] = w;
}

/* One launch's checking: its extents, each one's allocation, the extent hit last; bytes two blocks
 * wrote, judged at the launch's end by the value left (a race unless both wrote the same). */
typedef struct launch_check {
    const emu_action *a;
    region **at;
    int last;
    struct {
        const char *at;
        unsigned char before; /* the first writer's value */
        unsigned first, second;
        const cdev_extent *x;
    } waw[64];
    int nwaw;
    bool overlap; /* two written extents of different values share bytes (one launch running several steps) */
    /* blocks ordered by a fence and an atomic, as a one-launch reduction's last block reads the others'
     * partials: a block that ran __threadfence after its last plain global write and then an atomic
     * has published its accesses (published[block]); a block that ran an atomic and then
     * __threadfence (acquired) may read what published blocks wrote and write over what they read or
     * wrote. Blocks run one after another here, so the running block's state is enough, and a
     * published block has finished before the other starts. */
    uint8_t *published;
    unsigned npublished;
    unsigned block;            /* the block the state below is of */
    bool fenced, atomic, acquired;
} launch_check;


/* The ordering state of block, reset when a new block starts. */
static void order_track(launch_check *c, unsigned block)
{
    if (block == c->block) return;
    c->block = block, c->fenced = c->atomic = c->acquired = false;
}

/* Whether the block with race cell `writer` published its writes. */
static bool published(const launch_check *c, uint32_t writer)
{
    unsigned b = writer & 0xfffffu;
    return b < c->npublished && c->published[b];
}

static void set_published(launch_check *c, unsigned block, bool on)
{
    block &= 0xfffffu;
    if (block >= c->npublished) {
        if (!on) return;
        unsigned n = c->npublished ? c->npublished : 1024;
        while (n <= block) n *= 2;
        uint8_t *grown = realloc(c->published, n);
        if (!grown) return; /* unknown: the read is then a race, as before */
        memset(grown + c->npublished, 0, n - c->npublished);
        c->published = grown, c->npublished = n;
    }
    c->published[block] = on;
}

/* Accesses by different blocks of one launch to the bytes [at, at + n) of fresh region r, through
 * extent x: a read of what another block wrote, or a write of what another block read, is a race;
 * two blocks' writes are kept for the launch's end. Atomics race with nothing. */
static bool race_free(launch_check *c, const cdev_extent *x, region *r, const char *at, unsigned n, int kind,
                      unsigned block, const char *verb, char *msg, size_t len)
{
    const uint32_t me = serial << 20 | (block & 0xfffffu);
    uint32_t *cell = r->race + 2 * (size_t)(at - r->base);
    for (unsigned i = 0; i < n; i++, cell += 2) {
        uint32_t writer = cell[0], reader = cell[1];
        const char *other = NULL;
        uint32_t who = 0;
        /* another block's access ordered before this one by a fence and an atomic (launch_check) */
        bool ordered_w = c->acquired && published(c, writer), ordered_r = c->acquired && published(c, reader);
        if (writer >> 20 == serial && writer != me && !ordered_w) {
            if (kind == acc_read) {
                other = "wrote", who = writer;
            } else {
                int k = 0;
                while (k < c->nwaw && c->waw[k].at != at + i) k++;
                if (k == c->nwaw && k < (int)(sizeof c->waw / sizeof c->waw[0])) {
                    c->waw[k].at = at + i, c->waw[k].before = (unsigned char)at[i];
                    c->waw[k].first = writer & 0xfffffu, c->waw[k].second = block, c->waw[k].x = x;
                    c->nwaw++;
                }
            }
        }
        if (!other && kind == acc_write && reader >> 20 == serial && reader != me && !ordered_r) other = "read", who = reader;
        if (other) {
            char slot[200];
            describe_extent(slot, sizeof slot, x);
            snprintf(msg, len,
                     "%s %u bytes at %p, byte %td of %s, which block %u %s in the same launch (a race on global "
                     "memory: blocks are not ordered)",
                     verb, n, (const void *)at, at + i - (const char *)(uintptr_t)x->base, slot, who & 0xfffffu, other);
            return false;
        }
        if (kind == acc_read) cell[1] = me;
        else cell[0] = me;
    }
    return true;
}

/* emu_global_check: a kernel's access of n bytes at p; 1 with the finding in msg. */
static int kernel_access(void *ctx, const void *p, unsigned n, int kind, unsigned block, char *msg, size_t len)
{
    launch_check *c = ctx;
    const emu_action *a = c->a;
    const char *at = p;
    order_track(c, block);
    if (kind == acc_fence) {
        c->fenced = true;
        c->acquired |= c->atomic;
        return 0;
    }
    if (kind == acc_write) c->fenced = false, set_published(c, block, false);
    if (kind == acc_atomic) {
        if (c->fenced) set_published(c, block, true);
        c->atomic = true;
    }
    int hit = inside(&a->ext[c->last], at, n) ? c->last : -1;
    for (int i = 0; hit < 0 && i < a->n; i++)
        if (inside(&a->ext[i], at, n)) hit = i;
    const char *verb = kind == acc_read ? "reads" : kind == acc_write ? "writes" : "atomically updates";
    if (hit < 0) {
        region *r = region_of(at);
        if (!r) return 0; /* not device memory */
        describe_outside(msg, len, a, r, at, n, verb);
        return 1;
    }
    c->last = hit;
    if (kind != acc_read && !a->ext[hit].written) {
        int w = hit;
        while (w < a->n && !(a->ext[w].written && inside(&a->ext[w], at, n))) w++;
        if (w == a->n) {
            char slot[200];
            describe_extent(slot, sizeof slot, &a->ext[hit]);
            snprintf(msg, len, "%s %u bytes at %p, byte %td of %s, which this launch only reads", verb, n, p,
                     at - (const char *)(uintptr_t)a->ext[hit].base, slot);
            return 1;
        }
        hit = w;
    }
    region *r = c->at[hit];
    if (!r || !r->shadow) return 0;
    if (kind != acc_write && !a->ext[hit].kept && !read_written(a, &a->ext[hit], r, at, n, verb, msg, len)) return 1;
    if (r->race && kind != acc_atomic && !race_free(c, &a->ext[hit], r, at, n, kind, block, verb, msg, len)) return 1;
    if (kind != acc_read) {
        /* bytes that several written extents hold (a value written in place over another, both in
         * one launch that runs several steps): which value is there now the checker cannot tell */
        const cdev_extent *x = &a->ext[hit];
        for (int i = 0; c->overlap && x && i < a->n; i++)
            if (i != hit && a->ext[i].written && a->ext[i].tag != x->tag && inside(&a->ext[i], at, n)) x = NULL;
        mark(x, r, at, n);
    }
    return 0;
}

/* The next launch's serial; at a wrap every region's race cells are cleared. */
static void next_serial(void)
{
    if (++serial < 4096) return;
    serial = 1;
    for (int i = 0; i < nregions; i++)
        if (regions[i]->race) memset(regions[i]->race, 0, 2 * sizeof *regions[i]->race * regions[i]->bytes);
}

int emu_slots_launch(const emu_kernel *k, const char *name, const emu_action *a, const unsigned grid[3],
                     const unsigned block[3], void **params, char *err, size_t errlen)
{
    launch_check *c = calloc(1, sizeof *c);
    if (c) c->block = UINT_MAX;
    bool checked = c && a->n > 0 && emu_checking() && (c->at = calloc((size_t)a->n, sizeof *c->at));
    if (checked) {
        c->a = a;
        for (int i = 0; i < a->n; i++) c->at[i] = region_of((const char *)(uintptr_t)a->ext[i].base);
        for (int i = 0; i < a->n && !c->overlap; i++)
            for (int j = i + 1; j < a->n && !c->overlap; j++) {
                const cdev_extent *x = &a->ext[i], *y = &a->ext[j];
                c->overlap = x->written && y->written && x->tag != y->tag && x->base && y->base &&
                             x->base < y->base + y->bytes && y->base < x->base + x->bytes;
            }
        next_serial();
        checked = emu_check_global(k, kernel_access, c);
    }
    int rc = emu_launch(k, grid, block, params, err, errlen);
    if (checked) emu_check_global(k, NULL, NULL);
    for (int i = 0; checked && !rc && i < c->nwaw; i++) {
        if ((unsigned char)*c->waw[i].at == c->waw[i].before) continue;
        char slot[200];
        describe_extent(slot, sizeof slot, c->waw[i].x);
        snprintf(err, errlen,
                 "kernel %s: race on global memory: blocks %u and %u write different values to byte %p, byte %td of "
                 "%s, in the same launch (blocks are not ordered)",
                 name, c->waw[i].first, c->waw[i].second, (const void *)c->waw[i].at,
                 c->waw[i].at - (const char *)(uintptr_t)c->waw[i].x->base, slot);
        rc = -1;
        break;
    }
    if (c) free(c->at), free(c->published);
    free(c);
    return rc;
}

int emu_slots_read(const emu_action *a, const void *p, size_t bytes, const char *what, char *err, size_t errlen)
{
    const char *at = p;
    if (!a->n || !bytes || !emu_checking()) return 0;
    region *r = region_of(at);
    if (!r) return 0;
    for (int i = 0; i < a->n; i++) {
        if (!inside(&a->ext[i], at, bytes)) continue;
        char msg[600];
        if (!r->shadow || a->ext[i].kept || read_written(a, &a->ext[i], r, at, bytes, "reads", msg, sizeof msg)) return 0;
        snprintf(err, errlen, "%s %s", what, msg);
        return -1;
    }
    char msg[600];
    describe_outside(msg, sizeof msg, a, r, at, bytes, "reads");
    snprintf(err, errlen, "%s %s", what, msg);
    return -1;
}

void emu_slots_write(const emu_action *a, const void *p, size_t bytes)
{
    const char *at = p;
    if (!bytes || !emu_checking()) return;
    region *r = region_of(at);
    if (!r || !r->shadow || at < r->base || at + bytes > r->base + r->bytes) return;
    const cdev_extent *x = NULL;
    for (int i = 0; a && i < a->n && !x; i++)
        if (a->ext[i].written && inside(&a->ext[i], at, bytes)) x = &a->ext[i];
    mark(x, r, at, bytes);
}
