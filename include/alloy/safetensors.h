/* alloy/safetensors.h - read and write tensors in the safetensors format (weights, feeds, checkpoints). */
#ifndef ALLOY_SAFETENSORS_H
#define ALLOY_SAFETENSORS_H

#include "alloy/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A loaded safetensors file: every tensor's bytes in host memory. */
typedef struct alloy_safetensors alloy_safetensors;

/* Reads `path` whole and checks it: header length, JSON syntax, dtypes
 * (F32 F16 BF16 F64 I32 I64 BOOL), shapes, offsets in bounds, contiguous and
 * non-overlapping, sizes matching shape x dtype. Only a regular file is
 * read (a symbolic link to one is fine): a directory, FIFO, device or socket
 * is ALLOY_ERR_IO at once, never waited on. On failure returns a status
 * and writes a message naming the file and the problem into err. */
ALLOY_API alloy_status alloy_safetensors_load(const char *path, alloy_safetensors **out,
                                              char *err, size_t errlen);
ALLOY_API int alloy_safetensors_count(const alloy_safetensors *st);
/* The i-th tensor (file order); name and data are owned by st. */
ALLOY_API const alloy_host_tensor *alloy_safetensors_get(const alloy_safetensors *st, int i);
/* The tensor called name, or NULL. */
ALLOY_API const alloy_host_tensor *alloy_safetensors_find(const alloy_safetensors *st,
                                                          const char *name);
/* The "__metadata__" string value for key, or NULL. */
ALLOY_API const char *alloy_safetensors_metadata(const alloy_safetensors *st, const char *key);
ALLOY_API void alloy_safetensors_free(alloy_safetensors *st);

/* Writes n tensors (and optional metadata key/value pairs, nmeta of them) to
 * path atomically: a temporary file in the same folder, fsync, rename. A
 * symbolic link at path is followed: its target gets the new file and the
 * link stays. A path that is empty (ALLOY_ERR_INVALID) or names something
 * other than a regular file (a directory, FIFO, device or socket:
 * ALLOY_ERR_IO) is refused and left as it is. An existing file at path is
 * untouched on any failure. Names must be unique. */
ALLOY_API alloy_status alloy_safetensors_save(const char *path, const alloy_host_tensor *tensors,
                                              int n, const char *const *meta_keys,
                                              const char *const *meta_values, int nmeta, char *err,
                                              size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
