/* cache.c - the kernel cache: SHA-256 keys (base/sha256.h), an LRU table in memory, checked entry files in a directory kept under a size bound. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/sha256.h"
#include "codegen/cache.h"

#define MAGIC "alloyKC\n"
#define SUFFIX ".kernel"
#define OLD_TMP ".tmp-XXXXXX"        /* the temporary files of alloy before base/file.c */
#define NEW_TMP SUFFIX ".tmp.XXXXXX" /* al_file_write's, beside KEY.kernel */
#define MAX_PAYLOAD (1ull << 30) /* a size past this in a header is corruption, not a kernel */
#define STALE_TMP_SECONDS 3600   /* a temp file this old belongs to a writer that died */

/* ---- keys ---- */

static void to_hex(const uint8_t *bytes, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = "0123456789abcdef"[bytes[i] >> 4];
        out[2 * i + 1] = "0123456789abcdef"[bytes[i] & 15];
    }
    out[2 * n] = '\0';
}

/* "tag LEN\nBYTES\n": the lengths keep one field from running into the next. */
static void key_field(al_sha256_ctx *s, const char *tag, const char *value)
{
    char head[64];
    size_t n = strlen(value);
    al_fmt(head, sizeof head, "%s %zu\n", tag, n);
    al_sha256_update(s, head, strlen(head));
    al_sha256_update(s, value, n);
    al_sha256_update(s, "\n", 1);
}

void cg_cache_key(const char *name, const char *source, const char *options, int arch, cg_binary_kind kind,
                  const char *nvrtc_id, char key[CG_KEY_HEX + 1])
{
    al_sha256_ctx s;
    uint8_t digest[32];
    char text[64];
    al_sha256_init(&s);
    al_sha256_update(&s, "alloy kernel key 1\n", 19);
    key_field(&s, "name", name);
    key_field(&s, "source", source);
    key_field(&s, "options", options);
    al_fmt(text, sizeof text, "%d", arch);
    key_field(&s, "arch", text);
    key_field(&s, "kind", kind == CG_CUBIN ? "cubin" : "ptx");
    key_field(&s, "nvrtc", nvrtc_id);
    al_sha256_final(&s, digest);
    to_hex(digest, 32, key);
}

static bool good_key(const char *key)
{
    if (!key) return false;
    for (int i = 0; i < CG_KEY_HEX; i++)
        if (!key[i] || !strchr("0123456789abcdef", key[i])) return false;
    return key[CG_KEY_HEX] == '\0';
}

/* ---- the default directory ---- */

alloy_status cg_cache_default_dir(const char *alloy_cache_dir, const char *xdg, const char *home, char *out,
                                  size_t len)
{
    int n;
    if (alloy_cache_dir && alloy_cache_dir[0])
        n = snprintf(out, len, "%s", alloy_cache_dir);
    else if (xdg && xdg[0] == '/')
        n = snprintf(out, len, "%s/alloy", xdg);
    else if (home && home[0])
        n = snprintf(out, len, "%s/.cache/alloy", home);
    else {
        if (len) out[0] = '\0';
        return ALLOY_ERR_NOT_FOUND;
    }
    if (n < 0 || (size_t)n >= len) {
        if (len) out[0] = '\0';
        return ALLOY_ERR_INVALID;
    }
    return ALLOY_OK;
}

/* ---- the cache ---- */

typedef struct mem_entry {
    char key[CG_KEY_HEX + 1];
    unsigned char *data;
    size_t size;
    uint64_t used; /* c->clock when last stored or found */
} mem_entry;

struct cg_cache {
    char *dir; /* NULL: memory only */
    size_t mem_max, mem_bytes;
    uint64_t disk_max;
    mem_entry *mem;
    int nmem, capmem;
    uint64_t clock;
    cg_cache_stats stats;
    pthread_mutex_t lock; /* over mem, clock and stats; files need none (rename is atomic) */
};

bool cg_make_dirs(const char *dir)
{
    char p[PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) {
        errno = n ? ENAMETOOLONG : ENOENT;
        return false;
    }
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) return false;
        p[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0) return false;
    if (!S_ISDIR(st.st_mode)) errno = ENOTDIR;
    return S_ISDIR(st.st_mode);
}

/* Whether dir can hold the cache: made if missing, a directory this
 * process may write; false with why in why. */
static bool usable_dir(const char *dir, char *why, size_t len)
{
    if (!cg_make_dirs(dir)) {
        al_fmt(why, len, "cannot make it: %s", strerror(errno));
        return false;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        al_fmt(why, len, "cannot write in it: %s", strerror(errno));
        return false;
    }
    return true;
}

/* Set once a warning about an unusable directory went to stderr. */
static atomic_flag warned = ATOMIC_FLAG_INIT;

alloy_status cg_cache_open(const char *dir, size_t mem_max_bytes, uint64_t disk_max_bytes, cg_cache **out,
                           char *err, size_t errlen)
{
    *out = NULL;
    if (dir && strlen(dir) > PATH_MAX - CG_KEY_HEX - 32) {
        al_fmt(err, errlen, "kernel cache directory name too long: %.100s...", dir);
        return ALLOY_ERR_INVALID;
    }
    char why[256];
    if (dir && !usable_dir(dir, why, sizeof why)) {
        /* a cache is a speed-up: without its directory kernels still
         * compile, kept in memory for this process */
        if (!atomic_flag_test_and_set(&warned))
            fprintf(stderr,
                    "alloy: warning: the kernel cache directory %s is not usable (%s); kernels are compiled and kept "
                    "in memory only (set ALLOY_CACHE_DIR or the cache_dir option to a writable directory, or "
                    "ALLOY_CACHE=0 to turn the cache off)\n",
                    dir, why);
        dir = NULL;
    }
    cg_cache *c = cg_malloc(sizeof *c);
    if (c) memset(c, 0, sizeof *c);
    if (c && dir && !(c->dir = cg_strdup(dir))) {
        cg_free(c);
        c = NULL;
    }
    if (!c) {
        al_fmt(err, errlen, "out of memory opening the kernel cache");
        return ALLOY_ERR_OOM;
    }
    c->mem_max = mem_max_bytes;
    c->disk_max = disk_max_bytes;
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return ALLOY_OK;
}

void cg_cache_close(cg_cache *c)
{
    if (!c) return;
    for (int i = 0; i < c->nmem; i++) cg_free(c->mem[i].data);
    cg_free(c->mem);
    cg_free(c->dir);
    pthread_mutex_destroy(&c->lock);
    cg_free(c);
}

cg_cache_stats cg_cache_get_stats(cg_cache *c)
{
    pthread_mutex_lock(&c->lock);
    cg_cache_stats s = c->stats;
    pthread_mutex_unlock(&c->lock);
    return s;
}

void cg_cache_entry_path(const cg_cache *c, const char *key, char *path, size_t len)
{
    if (c->dir)
        al_fmt(path, len, "%s/%s" SUFFIX, c->dir, key);
    else
        al_fmt(path, len, "%s", "");
}

/* ---- in memory (callers hold c->lock) ---- */

static mem_entry *mem_find(cg_cache *c, const char *key)
{
    for (int i = 0; i < c->nmem; i++)
        if (memcmp(c->mem[i].key, key, CG_KEY_HEX) == 0) return &c->mem[i];
    return NULL;
}

static void mem_drop(cg_cache *c, mem_entry *e)
{
    c->mem_bytes -= e->size;
    cg_free(e->data);
    *e = c->mem[--c->nmem];
}

/* Keeps a copy of data under key, dropping the least recently used
 * payloads to stay under mem_max; nothing when it cannot (too big, OOM). */
static void mem_keep(cg_cache *c, const char *key, const void *data, size_t size)
{
    mem_entry *e = mem_find(c, key);
    if (e) mem_drop(c, e);
    if (size > c->mem_max) return;
    while (c->mem_bytes + size > c->mem_max && c->nmem) {
        mem_entry *oldest = &c->mem[0];
        for (int i = 1; i < c->nmem; i++)
            if (c->mem[i].used < oldest->used) oldest = &c->mem[i];
        mem_drop(c, oldest);
    }
    if (c->nmem == c->capmem) {
        int cap = c->capmem ? 2 * c->capmem : 16;
        mem_entry *grown = cg_realloc(c->mem, (size_t)cap * sizeof *grown);
        if (!grown) return;
        c->mem = grown;
        c->capmem = cap;
    }
    unsigned char *copy = cg_malloc(size ? size : 1);
    if (!copy) return;
    memcpy(copy, data, size);
    e = &c->mem[c->nmem++];
    memcpy(e->key, key, CG_KEY_HEX + 1);
    e->data = copy;
    e->size = size;
    e->used = ++c->clock;
    c->mem_bytes += size;
}

/* ---- on disk ---- */

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static bool read_all(int fd, void *buf, size_t n)
{
    for (size_t done = 0; done < n;) {
        ssize_t r = read(fd, (char *)buf + done, n - done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        done += (size_t)r;
    }
    return true;
}

static void count(cg_cache *c, uint64_t *counter)
{
    pthread_mutex_lock(&c->lock);
    (*counter)++;
    pthread_mutex_unlock(&c->lock);
}

/* Reads and checks dir/KEY.kernel: 1 with the payload in *data, 0 when
 * there is none or it was bad (then deleted), -1 out of memory. */
static int disk_get(cg_cache *c, const char *key, unsigned char **data, size_t *size)
{
    char path[PATH_MAX];
    uint8_t head[CG_CACHE_HEADER], sum[32];
    struct stat st;
    cg_cache_entry_path(c, key, path, sizeof path);
    if (lstat(path, &st) != 0) return 0; /* none: a miss */
    /* a regular file only, of a size an entry may have (base/file.h): a
     * FIFO or device there is bad, not waited on */
    int fd;
    uint64_t file_size;
    bool opened = al_file_open_read(path, CG_CACHE_HEADER + MAX_PAYLOAD, &fd, &file_size, NULL, 0) == ALLOY_OK;
    unsigned char *payload = NULL;
    uint64_t n = 0;
    bool good = opened && file_size >= CG_CACHE_HEADER && read_all(fd, head, CG_CACHE_HEADER);
    if (good) {
        n = get_le(head + 16, 8);
        good = memcmp(head, MAGIC, 8) == 0 && get_le(head + 8, 4) == CG_CACHE_FORMAT &&
               get_le(head + 12, 4) == CG_CACHE_HEADER && n <= MAX_PAYLOAD &&
               n == file_size - CG_CACHE_HEADER && memcmp(head + 56, key, CG_KEY_HEX) == 0;
    }
    if (good) {
        payload = cg_malloc(n ? (size_t)n : 1);
        if (!payload) {
            close(fd);
            return -1;
        }
        good = read_all(fd, payload, (size_t)n);
        if (good) al_sha256(payload, (size_t)n, sum);
        good = good && memcmp(sum, head + 24, 32) == 0;
    }
    if (!good) {
        if (opened) close(fd);
        cg_free(payload);
        unlink(path);
        count(c, &c->stats.corrupt);
        return 0;
    }
    futimens(fd, NULL); /* touched: least recently used is oldest mtime */
    close(fd);
    *data = payload;
    *size = (size_t)n;
    return 1;
}

typedef struct disk_entry {
    char name[CG_KEY_HEX + 16];
    off_t size;
    struct timespec mtime;
} disk_entry;

static int cmp_oldest(const void *a, const void *b)
{
    const disk_entry *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

static bool hex_prefix(const char *name)
{
    for (int i = 0; i < CG_KEY_HEX; i++)
        if (!name[i] || !strchr("0123456789abcdef", name[i])) return false;
    return true;
}

/* Deletes entry files, oldest mtime first and never keep's, until the
 * directory's entries total at most disk_max; and temp files left by dead
 * writers. Best effort: what cannot be listed or deleted stays. */
static void disk_evict(cg_cache *c, const char *keep)
{
    DIR *d = opendir(c->dir);
    if (!d) return;
    disk_entry *entries = NULL;
    int n = 0, cap = 0;
    uint64_t total = 0;
    char path[PATH_MAX];
    struct dirent *e;
    time_t now = time(NULL);
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        bool entry = len == CG_KEY_HEX + strlen(SUFFIX) && strcmp(e->d_name + CG_KEY_HEX, SUFFIX) == 0;
        bool tmp = (len == CG_KEY_HEX + strlen(OLD_TMP) && strncmp(e->d_name + CG_KEY_HEX, ".tmp-", 5) == 0) ||
                   (len == CG_KEY_HEX + strlen(NEW_TMP) &&
                    strncmp(e->d_name + CG_KEY_HEX, SUFFIX ".tmp.", strlen(SUFFIX ".tmp.")) == 0);
        struct stat st;
        al_fmt(path, sizeof path, "%s/%s", c->dir, e->d_name);
        if (!(entry || tmp) || !hex_prefix(e->d_name) || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (tmp) {
            if (now - st.st_mtim.tv_sec > STALE_TMP_SECONDS) unlink(path);
            continue;
        }
        total += (uint64_t)st.st_size;
        if (n == cap) {
            int grown_cap = cap ? 2 * cap : 64;
            disk_entry *grown = cg_realloc(entries, (size_t)grown_cap * sizeof *grown);
            if (!grown) break;
            entries = grown;
            cap = grown_cap;
        }
        memcpy(entries[n].name, e->d_name, len + 1);
        entries[n].size = st.st_size;
        entries[n].mtime = st.st_mtim;
        n++;
    }
    closedir(d);
    if (total > c->disk_max && n) {
        qsort(entries, (size_t)n, sizeof *entries, cmp_oldest);
        for (int i = 0; i < n && total > c->disk_max; i++) {
            if (strncmp(entries[i].name, keep, CG_KEY_HEX) == 0) continue;
            al_fmt(path, sizeof path, "%s/%s", c->dir, entries[i].name);
            if (unlink(path) != 0) continue;
            total -= (uint64_t)entries[i].size;
            count(c, &c->stats.evicted);
        }
    }
    cg_free(entries);
}

static alloy_status disk_put(cg_cache *c, const char *key, const void *data, size_t size, char *err, size_t errlen)
{
    char path[PATH_MAX], msg[PATH_MAX + 256];
    uint8_t head[CG_CACHE_HEADER] = {0};
    memcpy(head, MAGIC, 8);
    put_le(head + 8, CG_CACHE_FORMAT, 4);
    put_le(head + 12, CG_CACHE_HEADER, 4);
    put_le(head + 16, size, 8);
    al_sha256(data, size, head + 24);
    memcpy(head + 56, key, CG_KEY_HEX);
    cg_cache_entry_path(c, key, path, sizeof path);
    const void *parts[2] = {head, data};
    size_t lens[2] = {sizeof head, size};
    alloy_status st = al_file_write(path, parts, lens, 2, 0, msg, sizeof msg);
    if (st) {
        al_fmt(err, errlen, "the kernel cache entry %s", msg);
        return st;
    }
    if (c->disk_max) disk_evict(c, key);
    return ALLOY_OK;
}

/* ---- lookups and stores ---- */

alloy_status cg_cache_get(cg_cache *c, const char *key, unsigned char **data, size_t *size)
{
    *data = NULL;
    *size = 0;
    if (!good_key(key)) return ALLOY_ERR_INVALID;
    pthread_mutex_lock(&c->lock);
    mem_entry *e = mem_find(c, key);
    if (e) {
        *data = cg_malloc(e->size ? e->size : 1);
        if (*data) {
            memcpy(*data, e->data, e->size);
            *size = e->size;
            e->used = ++c->clock;
            c->stats.hits++;
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (e) return *data ? ALLOY_OK : ALLOY_ERR_OOM;
    int found = c->dir ? disk_get(c, key, data, size) : 0;
    if (found < 0) return ALLOY_ERR_OOM;
    pthread_mutex_lock(&c->lock);
    if (found) {
        c->stats.hits++;
        c->stats.disk_hits++;
        mem_keep(c, key, *data, *size);
    } else {
        c->stats.misses++;
    }
    pthread_mutex_unlock(&c->lock);
    return found ? ALLOY_OK : ALLOY_ERR_NOT_FOUND;
}

alloy_status cg_cache_put(cg_cache *c, const char *key, const void *data, size_t size, char *err, size_t errlen)
{
    if (!good_key(key)) {
        al_fmt(err, errlen, "bad kernel cache key '%.80s'", key ? key : "(null)");
        return ALLOY_ERR_INVALID;
    }
    pthread_mutex_lock(&c->lock);
    mem_keep(c, key, data, size);
    pthread_mutex_unlock(&c->lock);
    return c->dir ? disk_put(c, key, data, size, err, errlen) : ALLOY_OK;
}

alloy_status cg_cache_compile(cg_cache *c, const cg_nvrtc *nv, const cg_kernel_src *k, const char *dump_dir,
                              cg_binary *out, char *err, size_t errlen)
{
    alloy_status st = cg_nvrtc_prepare(nv, k, out, err, errlen);
    if (st) return st;
    char key[CG_KEY_HEX + 1];
    cg_cache_key(k->name, k->source, out->options, out->arch, out->kind, cg_nvrtc_id(nv), key);
    memcpy(out->key, key, sizeof key);
    unsigned char *data;
    size_t size;
    st = cg_cache_get(c, key, &data, &size);
    if (st == ALLOY_OK) {
        char path[PATH_MAX], msg[512];
        out->data = data;
        out->size = size;
        out->cached = true;
        if (dump_dir && (st = cg_nvrtc_dump(dump_dir, k, path, sizeof path, msg, sizeof msg)))
            return cg_binary_fail(out, st, err, errlen, "%s", msg);
        if (!(out->log = cg_strdup(""))) return cg_binary_fail(out, ALLOY_ERR_OOM, err, errlen, "out of memory");
        return ALLOY_OK;
    }
    if (st != ALLOY_ERR_NOT_FOUND)
        return cg_binary_fail(out, st, err, errlen, "out of memory reading the kernel cache");
    cg_binary_free(out);
    st = cg_nvrtc_compile(nv, k, dump_dir, out, err, errlen);
    memcpy(out->key, key, sizeof key);
    count(c, &c->stats.compiles);
    if (st) return st;
    if (cg_cache_put(c, key, out->data, out->size, NULL, 0) != ALLOY_OK) count(c, &c->stats.write_errors);
    return ALLOY_OK;
}

typedef struct cached_batch {
    cg_cache *c;
    const cg_nvrtc *nv;
    const cg_kernel_src *ks;
    const char *dump_dir;
    cg_binary *outs;
} cached_batch;

static void cached_one(void *ctx, int i)
{
    cached_batch *b = ctx;
    cg_cache_compile(b->c, b->nv, &b->ks[i], b->dump_dir, &b->outs[i], NULL, 0);
}

alloy_status cg_cache_compile_many(cg_cache *c, const cg_nvrtc *nv, const cg_kernel_src *ks, int n, int nthreads,
                                   const char *dump_dir, cg_binary *outs)
{
    cached_batch b = {c, nv, ks, dump_dir, outs};
    cg_parallel(n, nthreads, cached_one, &b);
    for (int i = 0; i < n; i++)
        if (outs[i].status) return outs[i].status;
    return ALLOY_OK;
}
