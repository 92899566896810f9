/* alloy/types.h - dtypes, status codes and the host tensor shared by every alloy header. */
#ifndef ALLOY_TYPES_H
#define ALLOY_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define ALLOY_API
#else
#define ALLOY_API __attribute__((visibility("default")))
#endif

#define ALLOY_VERSION_MAJOR 0
#define ALLOY_VERSION_MINOR 1
#define ALLOY_VERSION_PATCH 0

/* Largest tensor rank alloy handles. */
#define ALLOY_MAX_RANK 8

/* Element types. The order is part of the IR text and bundle formats only by
 * name (see alloy_dtype_name), never by number. */
typedef enum alloy_dtype {
    ALLOY_F32 = 0,
    ALLOY_F16,
    ALLOY_BF16,
    ALLOY_F64,
    ALLOY_I32,
    ALLOY_I64,
    ALLOY_BOOL, /* one byte, 0 or 1 */
    ALLOY_DTYPE_COUNT
} alloy_dtype;

/* Every fallible alloy function returns one of these; the message that goes
 * with it is on the object the call was made on (alloy_last_error) or in the
 * caller's error buffer. */
typedef enum alloy_status {
    ALLOY_OK = 0,
    ALLOY_ERR_INVALID,     /* bad argument: NULL, bad axis, unknown option */
    ALLOY_ERR_SHAPE,       /* operand shapes do not fit the op */
    ALLOY_ERR_DTYPE,       /* operand dtypes do not fit the op */
    ALLOY_ERR_NOT_FOUND,   /* unknown name: feed, fetch, state tensor, op */
    ALLOY_ERR_OOM,         /* host or device allocation failed */
    ALLOY_ERR_IO,          /* a file could not be opened, read or written */
    ALLOY_ERR_PARSE,       /* IR text is malformed (message has line:col) */
    ALLOY_ERR_FORMAT,      /* a safetensors file or bundle is corrupt */
    ALLOY_ERR_UNSUPPORTED, /* valid request that this build cannot do */
    ALLOY_ERR_VERIFY,      /* a graph broke an IR invariant */
    ALLOY_ERR_CUDA,        /* a CUDA driver/runtime/cuBLAS call failed */
    ALLOY_ERR_NVRTC,       /* NVRTC failed to compile a generated kernel */
    ALLOY_ERR_DIVERGED     /* training stopped by a scaler stop rule; the state is the last good step's */
} alloy_status;

/* A tensor in host memory, used for feeds, fetches, state and files.
 * Elements are dense, row-major (C order), little-endian. */
typedef struct alloy_host_tensor {
    const char *name;
    alloy_dtype dtype;
    int rank;
    int64_t dims[ALLOY_MAX_RANK];
    void *data;
} alloy_host_tensor;

/* "f32", "f16", "bf16", "f64", "i32", "i64", "bool"; "?" for a bad value. */
ALLOY_API const char *alloy_dtype_name(alloy_dtype dtype);
/* The dtype spelled `name` (as above); returns 0 and sets *out, or -1
 * (also for a NULL name or out). */
ALLOY_API int alloy_dtype_from_name(const char *name, alloy_dtype *out);
/* Bytes per element; 0 for a bad value. */
ALLOY_API size_t alloy_dtype_size(alloy_dtype dtype);
/* Short description of a status code, e.g. "shape error". */
ALLOY_API const char *alloy_status_name(alloy_status status);
/* Number of elements of a host tensor (1 for rank 0); -1 for NULL, a rank
 * outside [0, ALLOY_MAX_RANK], a negative dim or a count past int64. */
ALLOY_API int64_t alloy_host_tensor_numel(const alloy_host_tensor *t);

/* One allocator hook for all host memory alloy takes. `realloc_fn(ptr, 0)`
 * must free; NULL restores the C library's allocator. Set it before any
 * other alloy call (tests use it to inject allocation failures). */
typedef void *(*alloy_realloc_fn)(void *ptr, size_t size, void *user);
ALLOY_API void alloy_set_allocator(alloy_realloc_fn realloc_fn, void *user);

#ifdef __cplusplus
}
#endif
#endif
