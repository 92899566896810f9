/* emu_blocks.h - which blocks of a launch the emulation runs (ALLOY_EMU_BLOCKS): all of them, or a chosen few (first, last, listed, seeded random), so a launch at full size runs in seconds; C and C++, included by emu.h and by the tests that name the blocks. */
#ifndef ALLOY_EMU_BLOCKS_H
#define ALLOY_EMU_BLOCKS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The most blocks a selection names; more are refused. */
enum { EMU_BLOCKS_MAX = 64 };

/* A splitmix64 step: the seeded random blocks. */
static inline uint64_t emu_blocks_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline int emu_blocks_add(uint64_t *out, int n, uint64_t b, uint64_t nblocks)
{
    if (b >= nblocks || n < 0) return n;
    for (int i = 0; i < n; i++)
        if (out[i] == b) return n;
    if (n == EMU_BLOCKS_MAX) return -1;
    out[n] = b;
    return n + 1;
}

/* The linear block indices (x + gridDim.x * (y + gridDim.y * z)) that spec
 * names in a grid of nblocks, ascending and distinct, into out
 * [EMU_BLOCKS_MAX]. spec is a comma-separated list of `first`, `last`, a
 * block index (one past the grid or more names none), and `random:N:SEED`
 * (N distinct blocks drawn by splitmix64 from SEED). Returns how many; -1
 * when spec is NULL or empty (run every block); -2 when spec is malformed
 * or names more than EMU_BLOCKS_MAX blocks. */
static inline int emu_blocks_pick(const char *spec, uint64_t nblocks, uint64_t *out)
{
    if (!spec || !*spec) return -1;
    int n = 0;
    const char *p = spec;
    while (*p && n >= 0) {
        size_t len = strcspn(p, ",");
        char *end = NULL;
        if (len == 5 && !strncmp(p, "first", 5)) {
            n = emu_blocks_add(out, n, 0, nblocks);
        } else if (len == 4 && !strncmp(p, "last", 4)) {
            n = emu_blocks_add(out, n, nblocks - 1, nblocks);
        } else if (len > 7 && !strncmp(p, "random:", 7)) {
            unsigned long long count = strtoull(p + 7, &end, 10);
            if (end == p + 7 || *end != ':') return -2;
            const char *s = end + 1;
            uint64_t state = strtoull(s, &end, 10);
            if (end == s || end != p + len) return -2;
            if (count > EMU_BLOCKS_MAX) return -2;
            uint64_t want = count < nblocks ? count : nblocks;
            for (uint64_t got = 0, tries = 0; got < want && tries < 64 * EMU_BLOCKS_MAX && n >= 0; tries++) {
                int before = n;
                n = emu_blocks_add(out, n, emu_blocks_next(&state) % nblocks, nblocks);
                got += n > before;
            }
        } else if (len && p[0] >= '0' && p[0] <= '9') {
            unsigned long long b = strtoull(p, &end, 10);
            if (end != p + len) return -2;
            n = emu_blocks_add(out, n, b, nblocks);
        } else {
            return -2;
        }
        p += len;
        if (*p == ',') p++;
    }
    if (n < 0) return -2;
    for (int i = 1; i < n; i++) /* ascending: blocks run in the grid's order */
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            uint64_t t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}

#endif
