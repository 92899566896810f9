/* file.h - the files alloy writes and reads: atomic writes to the real file behind a path (symlinks followed, anything but a regular file refused) and reads of regular files only, never blocking. */
#ifndef ALLOY_BASE_FILE_H
#define ALLOY_BASE_FILE_H

#include "base/base.h"

/* al_file_write's flags. */
enum {
    /* fsync the file and then its folder, and first remove the temporary
     * files earlier writes to the same target left when they were killed
     * mid-way: for state (checkpoints, parameters, bundles), not for the
     * kernel cache, dumps or exported kernels */
    AL_FILE_DURABLE = 1u,
};

/* Writes the concatenation of parts[0..nparts) (lens[i] bytes each) to
 * path, atomically: a reader sees the old file or the whole new one.
 * path's real file (symbolic links followed, up to 40; a dangling link's
 * target is created) is replaced by a temporary file written beside it
 * (REAL.tmp.XXXXXX) and renamed over it, with REAL's permissions (0644 for
 * a new file); the link stays a link. Refused before anything is made: a
 * NULL or empty path (ALLOY_ERR_INVALID) and a target that exists and is
 * not a regular file, a directory, FIFO, device or socket (ALLOY_ERR_IO:
 * such a target is never replaced, /dev/null stays /dev/null). On failure
 * the target is as it was, no temporary file is left, and err names path
 * (and its real file when a link led there), the step that failed and why
 * (ALLOY_ERR_IO). Allocates nothing: safe on any thread. */
AL_HIDDEN alloy_status al_file_write(const char *path, const void *const *parts, const size_t *lens, int nparts,
                                     unsigned flags, char *err, size_t errlen);

/* Whether al_file_write could write path now, checked without touching
 * the target: the refusals above, and a temporary file made and removed
 * beside the real target (its folder exists and is writable). ALLOY_OK, or
 * the status and message al_file_write would give. */
AL_HIDDEN alloy_status al_file_check_writable(const char *path, char *err, size_t errlen);

/* Opens path to read when it is a regular file: looked at before it is
 * opened and opened non-blocking, so a FIFO is refused rather than waited
 * on and a device is never opened; a directory, FIFO, device or socket is
 * ALLOY_ERR_IO naming path and what it is, a missing or unreadable file
 * ALLOY_ERR_IO ("cannot open: ..."), a NULL or empty path
 * ALLOY_ERR_INVALID, and a file over max_bytes (0: no bound)
 * ALLOY_ERR_FORMAT. *fd (blocking, close-on-exec) and *size, the file's
 * size then; -1 and 0 on failure. Allocates nothing. */
AL_HIDDEN alloy_status al_file_open_read(const char *path, uint64_t max_bytes, int *fd, uint64_t *size, char *err,
                                         size_t errlen);

/* The whole regular file at path (al_file_open_read's checks and bound)
 * into *bytes (al_malloc'd, with a NUL after the last byte) and *len:
 * exactly the size it had when opened (a file cut meanwhile is
 * ALLOY_ERR_IO). ALLOY_ERR_OOM; *bytes NULL on failure. */
AL_HIDDEN alloy_status al_file_read(const char *path, uint64_t max_bytes, uint8_t **bytes, size_t *len, char *err,
                                    size_t errlen);

#endif
