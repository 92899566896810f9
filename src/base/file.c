/* file.c - the files alloy writes and reads (file.h): the real target behind links, refusals of what is not a regular file, atomic replacement, bounded non-blocking reads. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"

#define TEMP_SUFFIX ".tmp.XXXXXX" /* mkstemp's template: six of [A-Za-z0-9] */
#define MAX_LINKS 40              /* as the kernel's limit on links in one lookup */
/* A temporary file of a durable write is stale when no process holds its
 * lock and nothing wrote it for this long (a writer that cannot lock, e.g.
 * an older alloy or a file system without flock, writes continuously). */
#define STALE_AFTER_S 60

/* What a file that is not a regular file is, for messages. */
static const char *kind_of(mode_t m)
{
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO (named pipe)"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
           : S_ISLNK(m)  ? "a symbolic link"
                         : "not a regular file";
}

/* The folder part of path into out ("." for a bare name, "/" for "/x"). */
static void folder_of(const char *path, char out[PATH_MAX])
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        memcpy(out, ".", 2);
        return;
    }
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    memcpy(out, path, n);
    out[n] = '\0';
}

/* path's real file into real: symbolic links followed (a relative link
 * from the link's own folder) to a name that is no link or does not exist;
 * *exists says which, *sb its lstat. 0 or an errno. */
static int resolve(const char *path, char real[PATH_MAX], struct stat *sb, bool *exists)
{
    size_t n = strlen(path);
    if (n >= PATH_MAX) return ENAMETOOLONG;
    memcpy(real, path, n + 1);
    for (int hops = 0;; hops++) {
        if (lstat(real, sb) != 0) {
            if (errno != ENOENT) return errno;
            *exists = false;
            return 0;
        }
        if (!S_ISLNK(sb->st_mode)) {
            *exists = true;
            return 0;
        }
        if (hops == MAX_LINKS) return ELOOP;
        char link[PATH_MAX];
        ssize_t len = readlink(real, link, sizeof link);
        if (len < 0) return errno;
        if ((size_t)len >= sizeof link) return ENAMETOOLONG;
        link[len] = '\0';
        const char *slash = strrchr(real, '/');
        size_t keep = link[0] == '/' || !slash ? 0 : (size_t)(slash - real) + 1;
        if (keep + (size_t)len >= PATH_MAX) return ENAMETOOLONG;
        memcpy(real + keep, link, (size_t)len + 1);
    }
}

/* "PATH" or "PATH (a link to REAL)", for messages. */
static void name_of(const char *path, const char *real, char *out, size_t len)
{
    if (strcmp(path, real) == 0) al_fmt(out, len, "%s", path);
    else al_fmt(out, len, "%s (a link to %s)", path, real);
}

/* The real target of a write to path into real, with the refusals every
 * write and check makes first. */
static alloy_status write_target(const char *path, char real[PATH_MAX], char *err, size_t errlen)
{
    if (!path || !*path) {
        al_fmt(err, errlen, "%s: the path is empty: name the file to write", path ? "\"\"" : "(null)");
        return ALLOY_ERR_INVALID;
    }
    struct stat sb;
    bool exists;
    int e = resolve(path, real, &sb, &exists);
    if (e) {
        al_fmt(err, errlen, "%s: cannot write: %s", path, strerror(e));
        return ALLOY_ERR_IO;
    }
    if (exists && !S_ISREG(sb.st_mode)) {
        char name[2 * PATH_MAX + 16];
        name_of(path, real, name, sizeof name);
        al_fmt(err, errlen,
               "%s: is %s, not a regular file; alloy writes only regular files and replaces nothing else "
               "(remove it or choose another path)",
               name, kind_of(sb.st_mode));
        return ALLOY_ERR_IO;
    }
    return ALLOY_OK;
}

/* A new temporary file beside real (REAL.tmp.XXXXXX, its name into tmp),
 * locked while open; -1 with err set. */
static int make_temp(const char *path, const char *real, char tmp[PATH_MAX], char *err, size_t errlen)
{
    size_t n = strlen(real);
    if (n + sizeof TEMP_SUFFIX > PATH_MAX) {
        al_fmt(err, errlen, "%s: cannot write: the path is too long for a temporary file beside it", path);
        return -1;
    }
    memcpy(tmp, real, n);
    memcpy(tmp + n, TEMP_SUFFIX, sizeof TEMP_SUFFIX);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        char folder[PATH_MAX];
        folder_of(real, folder);
        al_fmt(err, errlen, "%s: cannot write: cannot create a temporary file in the folder %s: %s", path, folder,
               strerror(e));
        return -1;
    }
    /* held until close: a later write's clean-up leaves a locked temporary
     * file alone (best effort: some file systems have no flock) */
    flock(fd, LOCK_EX | LOCK_NB);
    return fd;
}

/* Whether name is one of the temporary files a write to the target called
 * base makes: base, ".tmp.", six letters or digits, nothing more. */
static bool is_temp_of(const char *name, const char *base)
{
    size_t n = strlen(base), k = sizeof TEMP_SUFFIX - 7;
    if (strncmp(name, base, n) != 0 || strncmp(name + n, TEMP_SUFFIX, k) != 0) return false;
    for (int i = 0; i < 6; i++)
        if (!isalnum((unsigned char)name[n + k + i])) return false;
    return name[n + k + 6] == '\0';
}

/* Removes, beside real, the temporary files of earlier writes to it whose
 * writer is gone: a save killed between creating its temporary file and
 * the rename leaves one as large as the file. A writer holds flock() on its
 * temporary file until it closes it, so a file that can be locked has no
 * live writer (in this or any process; the lock goes with the process); it
 * must also be a regular file of this user, unwritten for STALE_AFTER_S.
 * Best effort: what cannot be checked stays. */
static void remove_stale_temps(const char *real)
{
    char folder[PATH_MAX];
    folder_of(real, folder);
    const char *base = strrchr(real, '/') ? strrchr(real, '/') + 1 : real;
    if (!*base) return;
    DIR *d = opendir(folder);
    if (!d) return;
    int dfd = dirfd(d);
    time_t now = time(NULL);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_temp_of(e->d_name, base)) continue;
        int fd = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat sb, again;
        if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == geteuid() &&
            now - sb.st_mtime >= STALE_AFTER_S && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
            fstatat(dfd, e->d_name, &again, AT_SYMLINK_NOFOLLOW) == 0 && again.st_dev == sb.st_dev &&
            again.st_ino == sb.st_ino)
            unlinkat(dfd, e->d_name, 0);
        close(fd);
    }
    closedir(d);
}

/* Writes p[0..n) to fd whole; 0 or an errno value. */
static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        size_t chunk = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
        ssize_t w = write(fd, c, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

alloy_status al_file_write(const char *path, const void *const *parts, const size_t *lens, int nparts,
                           unsigned flags, char *err, size_t errlen)
{
    char real[PATH_MAX], tmp[PATH_MAX];
    alloy_status st = write_target(path, real, err, errlen);
    if (st) return st;
    if (flags & AL_FILE_DURABLE) remove_stale_temps(real);
    int fd = make_temp(path, real, tmp, err, errlen);
    if (fd < 0) return ALLOY_ERR_IO;
    struct stat sb;
    fchmod(fd, stat(real, &sb) == 0 && S_ISREG(sb.st_mode) ? sb.st_mode & 07777 : 0644);

    const char *step = "write";
    int e = 0;
    for (int i = 0; i < nparts && !e; i++)
        if (lens[i]) e = write_all(fd, parts[i], lens[i]);
    if (!e && (flags & AL_FILE_DURABLE) && fsync(fd) != 0) step = "fsync", e = errno;
    if (close(fd) != 0 && !e) step = "close", e = errno;
    /* looked at again just before the rename: what took the target's place
     * meanwhile (a FIFO, a device, a link) is not replaced either */
    if (!e && lstat(real, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        unlink(tmp);
        char name[2 * PATH_MAX + 16];
        name_of(path, real, name, sizeof name);
        al_fmt(err, errlen, "%s: became %s while it was written; left as it is", name, kind_of(sb.st_mode));
        return ALLOY_ERR_IO;
    }
    if (!e && rename(tmp, real) != 0) step = "rename", e = errno;
    if (e) {
        unlink(tmp);
        char name[2 * PATH_MAX + 16];
        name_of(path, real, name, sizeof name);
        al_fmt(err, errlen, "%s: cannot write (%s of the temporary file %s failed: %s); left unchanged", name, step,
               tmp, strerror(e));
        return ALLOY_ERR_IO;
    }
    if (flags & AL_FILE_DURABLE) { /* the rename durable too; best effort */
        folder_of(real, tmp);
        int dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    return ALLOY_OK;
}

alloy_status al_file_check_writable(const char *path, char *err, size_t errlen)
{
    char real[PATH_MAX], tmp[PATH_MAX];
    alloy_status st = write_target(path, real, err, errlen);
    if (st) return st;
    int fd = make_temp(path, real, tmp, err, errlen);
    if (fd < 0) return ALLOY_ERR_IO;
    close(fd);
    unlink(tmp);
    return ALLOY_OK;
}

alloy_status al_file_open_read(const char *path, uint64_t max_bytes, int *fd, uint64_t *size, char *err,
                               size_t errlen)
{
    *fd = -1, *size = 0;
    if (!path || !*path) {
        al_fmt(err, errlen, "%s: the path is empty: name the file to read", path ? "\"\"" : "(null)");
        return ALLOY_ERR_INVALID;
    }
    /* looked at first: a device is never opened (opening one may act), a
     * FIFO never waited on */
    struct stat before, sb;
    if (stat(path, &before) != 0) {
        al_fmt(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return ALLOY_ERR_IO;
    }
    int f = S_ISREG(before.st_mode) ? open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC) : -1;
    if (S_ISREG(before.st_mode) && f < 0) {
        al_fmt(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return ALLOY_ERR_IO;
    }
    if (f >= 0 && fstat(f, &sb) != 0) {
        al_fmt(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(f);
        return ALLOY_ERR_IO;
    }
    if (f < 0 || !S_ISREG(sb.st_mode)) { /* not one, or no longer one */
        al_fmt(err, errlen, "%s: cannot read: it is %s, not a regular file", path,
               kind_of(f < 0 ? before.st_mode : sb.st_mode));
        if (f >= 0) close(f);
        return ALLOY_ERR_IO;
    }
    if (max_bytes && (uint64_t)sb.st_size > max_bytes) {
        al_fmt(err, errlen, "%s: %lld bytes, more than the %llu this file may have", path, (long long)sb.st_size,
               (unsigned long long)max_bytes);
        close(f);
        return ALLOY_ERR_FORMAT;
    }
    int fl = fcntl(f, F_GETFL);
    if (fl >= 0) fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
    *fd = f, *size = (uint64_t)sb.st_size;
    return ALLOY_OK;
}

alloy_status al_file_read(const char *path, uint64_t max_bytes, uint8_t **bytes, size_t *len, char *err,
                          size_t errlen)
{
    *bytes = NULL, *len = 0;
    int fd;
    uint64_t size;
    alloy_status st = al_file_open_read(path, max_bytes, &fd, &size, err, errlen);
    if (st) return st;
    uint8_t *b = size < SIZE_MAX ? al_malloc((size_t)size + 1) : NULL;
    if (!b) {
        al_fmt(err, errlen, "%s: out of memory reading its %llu bytes", path, (unsigned long long)size);
        close(fd);
        return ALLOY_ERR_OOM;
    }
    size_t got = 0;
    int e = 0;
    while (got < size) {
        size_t want = size - got > ((size_t)1 << 30) ? (size_t)1 << 30 : (size_t)(size - got);
        ssize_t r = read(fd, b + got, want);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            e = r < 0 ? errno : 0;
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    if (got < size) {
        if (e) al_fmt(err, errlen, "%s: cannot read: %s", path, strerror(e));
        else al_fmt(err, errlen, "%s: the file ended after %zu of its %llu bytes (cut while read?)", path, got,
                    (unsigned long long)size);
        al_free(b);
        return ALLOY_ERR_IO;
    }
    b[got] = '\0';
    *bytes = b, *len = got;
    return ALLOY_OK;
}
