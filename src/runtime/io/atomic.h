/* atomic.h - writing a file atomically: a temporary file next to it, fsync, rename. */
#ifndef ALLOY_IO_ATOMIC_H
#define ALLOY_IO_ATOMIC_H

#include "base/base.h"

/* Writes the concatenation of parts[0..nparts) (lens[i] bytes each) to path
 * through a temporary file in its folder (PATH.tmp.XXXXXX: fsync, rename,
 * then the folder fsynced), after removing stale temporaries of earlier
 * saves killed mid-way. On failure path is left as it was and err names
 * the path, the step that failed and why (ALLOY_ERR_IO; ALLOY_ERR_OOM). */
AL_HIDDEN alloy_status io_write_atomic(const char *path, const void *const *parts, const size_t *lens, int nparts,
                                       char *err, size_t errlen);

#endif
