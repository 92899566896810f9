/* name_index.c - open-addressing hash indexes of names (name_index.h). */
#include <string.h>

#include "base/name_index.h"

static _Thread_local uint64_t probes;

uint64_t al_index_probes(void) { return probes; }

uint32_t al_name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    return (uint32_t)(h ^ (h >> 33));
}

int al_index_find(const al_name_slot *slots, int cap, al_name_fn name_of, const void *owner, const char *name)
{
    if (!cap || !name) return -1;
    uint32_t h = al_name_hash(name), mask = (uint32_t)cap - 1;
    for (uint32_t i = h & mask;; i = (i + 1) & mask) {
        probes++;
        const al_name_slot *s = &slots[i];
        if (s->id < 0) return -1;
        if (s->hash != h) continue;
        const char *have = name_of(owner, s->id);
        if (have == name || strcmp(have, name) == 0) return s->id;
    }
}

/* Puts (id, h) into the first empty slot from h's home on. */
static void place(al_name_slot *slots, uint32_t mask, int id, uint32_t h)
{
    uint32_t i = h & mask;
    while (probes++, slots[i].id >= 0) i = (i + 1) & mask;
    slots[i] = (al_name_slot){id, h};
}

bool al_index_reserve(al_name_slot **slots, int *cap, int count)
{
    if (count * 2 <= *cap) return true;
    int ncap = *cap ? *cap : 64;
    while (count * 2 > ncap) {
        if (ncap >= 1 << 30) return false;
        ncap *= 2;
    }
    al_name_slot *ns = al_malloc(sizeof *ns * (size_t)ncap);
    if (!ns) return false;
    for (int i = 0; i < ncap; i++) ns[i].id = -1;
    for (int i = 0; i < *cap; i++)
        if ((*slots)[i].id >= 0) place(ns, (uint32_t)ncap - 1, (*slots)[i].id, (*slots)[i].hash);
    al_free(*slots);
    *slots = ns;
    *cap = ncap;
    return true;
}

bool al_index_add(al_name_slot **slots, int *cap, int count, al_name_fn name_of, const void *owner, int id)
{
    if (!al_index_reserve(slots, cap, count + 1)) return false;
    place(*slots, (uint32_t)*cap - 1, id, al_name_hash(name_of(owner, id)));
    return true;
}
