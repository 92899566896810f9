/* dtype.c - names and sizes of dtypes and status codes. */
#include <string.h>

#include "base/base.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[ALLOY_DTYPE_COUNT] = {
    [ALLOY_F32] = {"f32", 4}, [ALLOY_F16] = {"f16", 2}, [ALLOY_BF16] = {"bf16", 2},
    [ALLOY_F64] = {"f64", 8}, [ALLOY_I32] = {"i32", 4}, [ALLOY_I64] = {"i64", 8},
    [ALLOY_BOOL] = {"bool", 1},
};

const char *alloy_dtype_name(alloy_dtype dtype)
{
    return (unsigned)dtype < ALLOY_DTYPE_COUNT ? dtypes[dtype].name : "?";
}

size_t alloy_dtype_size(alloy_dtype dtype)
{
    return (unsigned)dtype < ALLOY_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

int alloy_dtype_from_name(const char *name, alloy_dtype *out)
{
    if (!name || !out) return -1;
    for (int i = 0; i < ALLOY_DTYPE_COUNT; i++) {
        if (strcmp(name, dtypes[i].name) == 0) {
            *out = (alloy_dtype)i;
            return 0;
        }
    }
    return -1;
}

const char *alloy_status_name(alloy_status status)
{
    switch (status) {
    case ALLOY_OK: return "ok";
    case ALLOY_ERR_INVALID: return "invalid argument";
    case ALLOY_ERR_SHAPE: return "shape error";
    case ALLOY_ERR_DTYPE: return "dtype error";
    case ALLOY_ERR_NOT_FOUND: return "not found";
    case ALLOY_ERR_OOM: return "out of memory";
    case ALLOY_ERR_IO: return "i/o error";
    case ALLOY_ERR_PARSE: return "parse error";
    case ALLOY_ERR_FORMAT: return "format error";
    case ALLOY_ERR_UNSUPPORTED: return "unsupported";
    case ALLOY_ERR_VERIFY: return "verifier error";
    case ALLOY_ERR_CUDA: return "CUDA error";
    case ALLOY_ERR_NVRTC: return "NVRTC error";
    case ALLOY_ERR_DIVERGED: return "training diverged";
    }
    return "unknown status";
}

int64_t alloy_host_tensor_numel(const alloy_host_tensor *t)
{
    if (!t || t->rank < 0 || t->rank > ALLOY_MAX_RANK) return -1; /* dims has ALLOY_MAX_RANK entries */
    return al_numel(t->rank, t->dims);
}
