/* name_index.h - open-addressing hash indexes of names: the graph's node, output and update names, the state tensors. */
#ifndef ALLOY_NAME_INDEX_H
#define ALLOY_NAME_INDEX_H

#include "base/base.h"

/* The name of entry id of the collection `owner` (never NULL for an entry
 * in an index). */
typedef const char *(*al_name_fn)(const void *owner, int id);

/* One slot of an index: an entry id (-1: empty) and the low 32 bits of its
 * name's hash, so that probing and growing compare and place entries
 * without reading their names (a name is a pointer chase away, a cache
 * miss in a big graph). */
typedef struct al_name_slot {
    int id;
    uint32_t hash;
} al_name_slot;

/* An index is an array of cap slots (a power of two, at most 2^30, or 0
 * with slots NULL), kept at most half full so that a look-up probes a few
 * slots whatever the number of names. */

/* The name's hash: FNV-1a with its bits mixed (MurmurHash3's finalizer),
 * so that names that differ in one digit ("layer.7.weight") do not crowd
 * into neighbouring slots. */
AL_HIDDEN uint32_t al_name_hash(const char *s);
/* The entry called name, or -1 (also for a NULL name). */
AL_HIDDEN int al_index_find(const al_name_slot *slots, int cap, al_name_fn name_of, const void *owner,
                            const char *name);
/* Adds entry id, the count-th, doubling the index past half full; false
 * when out of memory (the index is unchanged). The caller has made sure
 * no entry of the same name is in it. */
AL_HIDDEN bool al_index_add(al_name_slot **slots, int *cap, int count, al_name_fn name_of, const void *owner, int id);
/* Grows the index so that count entries fit (at most half full), so the
 * adds that follow cannot fail; false when out of memory (unchanged). */
AL_HIDDEN bool al_index_reserve(al_name_slot **slots, int *cap, int count);
/* Slots probed by al_index_find and al_index_add on this thread so far:
 * what tests count to prove look-ups stay O(1) as indexes grow. */
AL_HIDDEN uint64_t al_index_probes(void);

#endif
