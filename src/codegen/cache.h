/* cache.h - the kernel cache: compiled kernels by a SHA-256 key, in memory (bounded) and in a directory (bounded, LRU by mtime). */
#ifndef ALLOY_CG_CACHE_H
#define ALLOY_CG_CACHE_H

#include <stdint.h>

#include "codegen/nvrtc.h"

/* Keys are SHA-256 digests in lowercase hex. */
#define CG_KEY_HEX 64

/* Entry files: dir/KEY.kernel, a 120-byte header then the payload (the CUBIN
 * or PTX exactly as cg_binary holds it). Integers are little-endian.
 *   0  8  magic "alloyKC\n"
 *   8  4  format version (CG_CACHE_FORMAT)
 *  12  4  header size (120)
 *  16  8  payload size (the file is exactly header + payload)
 *  24 32  SHA-256 of the payload
 *  56 64  the key in hex (the file's name)
 * Written by al_file_write (base/file.h: dir/KEY.kernel.tmp.XXXXXX renamed
 * over KEY.kernel, a link followed to its target, anything but a regular
 * file there refused), so readers see a whole file or none; a file that
 * fails any check (a FIFO or device there too: never waited on) is deleted
 * and read as a miss. */
#define CG_CACHE_FORMAT 1
#define CG_CACHE_HEADER 120

/* The bound alloy keeps a cache directory under (1 GiB of entry files). */
#define CG_CACHE_DISK_BOUND (1ull << 30)

typedef struct cg_cache cg_cache;

/* What the cache did since it was opened. */
typedef struct cg_cache_stats {
    uint64_t hits;      /* found, in memory or on disk */
    uint64_t disk_hits; /* of those, read from the directory */
    uint64_t misses;
    uint64_t corrupt;       /* entry files that failed a check and were deleted */
    uint64_t compiles;      /* NVRTC compiles cg_cache_compile ran (on misses) */
    uint64_t evicted;       /* entry files deleted to keep the directory under its bound */
    uint64_t write_errors;  /* entries that could not be written (the compile still succeeded) */
} cg_cache_stats;

/* The key of a compile: SHA-256 over a versioned, length-framed record of
 * the kernel name, the source, the options text, the arch, the kind and the
 * compiler's id (cg_nvrtc_id), in hex into key. */
AL_HIDDEN void cg_cache_key(const char *name, const char *source, const char *options, int arch, cg_binary_kind kind,
                            const char *nvrtc_id, char key[CG_KEY_HEX + 1]);

/* The directory a caller should use: alloy_cache_dir (the ALLOY_CACHE_DIR
 * variable's value) when it is set and not empty; else xdg/alloy when xdg
 * ($XDG_CACHE_HOME) is an absolute path (the XDG rule: others are ignored);
 * else home/.cache/alloy when home is not empty. Any may be NULL. Returns
 * ALLOY_OK with the directory in out; ALLOY_ERR_NOT_FOUND when none applies
 * (cache in memory only), ALLOY_ERR_INVALID when it does not fit in len;
 * out is "" then. Reads no environment itself. */
AL_HIDDEN alloy_status cg_cache_default_dir(const char *alloy_cache_dir, const char *xdg, const char *home, char *out,
                                            size_t len);

/* mkdir -p: makes dir and its missing parents. false (errno set) when that
 * fails or dir exists and is not a directory. */
AL_HIDDEN bool cg_make_dirs(const char *dir);

/* Opens a cache keeping up to mem_max_bytes of payloads in memory (0:
 * none) and, when dir is not NULL, entry files in dir (made if missing)
 * totalling up to disk_max_bytes (0: no bound). A dir that cannot be made
 * or written in (HOME=/nonexistent) is no error: the cache is in memory
 * only, and the first time in the process a warning naming dir and why
 * goes to stderr. ALLOY_ERR_INVALID for a dir too long for an entry's
 * path; ALLOY_ERR_OOM. The cache may be used from several threads at once,
 * and several processes may share one directory. */
AL_HIDDEN alloy_status cg_cache_open(const char *dir, size_t mem_max_bytes, uint64_t disk_max_bytes, cg_cache **out,
                                     char *err, size_t errlen);
/* Frees the cache (its directory stays). NULL is fine. */
AL_HIDDEN void cg_cache_close(cg_cache *c);
/* Counters since cg_cache_open. */
AL_HIDDEN cg_cache_stats cg_cache_get_stats(cg_cache *c);
/* dir/KEY.kernel into path (what the tests damage); "" for a memory-only cache. */
AL_HIDDEN void cg_cache_entry_path(const cg_cache *c, const char *key, char *path, size_t len);

/* Looks key up: memory first, then the directory (a good file is touched,
 * its mtime set to now, and kept in memory too; a bad one is deleted and
 * counted in corrupt). ALLOY_OK with a copy in *data (cg_free it) and
 * *size; ALLOY_ERR_NOT_FOUND on a miss; ALLOY_ERR_INVALID for a key that is
 * not CG_KEY_HEX hex digits; ALLOY_ERR_OOM. Counts a hit or a miss. */
AL_HIDDEN alloy_status cg_cache_get(cg_cache *c, const char *key, unsigned char **data, size_t *size);
/* Stores size bytes under key in memory (least recently used payloads
 * leave past the bound) and in the directory. Then, when the directory has
 * a bound, lists it: deletes temp files an hour old (a crashed writer's)
 * and, while the entry files total more than the bound, the one with the
 * oldest mtime, never this one. Other files in the directory are left alone.
 * ALLOY_ERR_IO (message in err) when the file cannot be written;
 * ALLOY_ERR_INVALID for a bad key; ALLOY_ERR_OOM. */
AL_HIDDEN alloy_status cg_cache_put(cg_cache *c, const char *key, const void *data, size_t size, char *err,
                                    size_t errlen);

/* cg_nvrtc_compile through the cache: prepares k (cg_nvrtc_prepare),
 * computes its key (out->key), and returns the cached binary (out->cached)
 * or compiles and stores it. A failed compile stores nothing; a failed
 * store only counts in write_errors. With a dump_dir the source is written
 * there on hits too. */
AL_HIDDEN alloy_status cg_cache_compile(cg_cache *c, const cg_nvrtc *nv, const cg_kernel_src *k, const char *dump_dir,
                                        cg_binary *out, char *err, size_t errlen);
/* cg_cache_compile of ks[0..n) on nthreads threads, as cg_nvrtc_compile_many. */
AL_HIDDEN alloy_status cg_cache_compile_many(cg_cache *c, const cg_nvrtc *nv, const cg_kernel_src *ks, int n,
                                             int nthreads, const char *dump_dir, cg_binary *outs);

#endif
