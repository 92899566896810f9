/* nccl.c - NCCL through dlopen: loading, version, unique ids and communicators, each failure a message (nccl.h). */
#include <dlfcn.h>
#include <string.h>

#include "runtime/cuda/nccl.h"

/* ncclCommInitRankConfig and non-blocking communicators (what a timeout needs) came in 2.14. */
#define NCCL_MIN_VERSION 21400

void nccl_close(nccl_library *lib)
{
    /* no dlclose: ncclGetUniqueId starts a bootstrap thread that outlives the
     * call (it waits for the ranks), and unloading its code under it kills
     * the process; the library stays loaded, as NCCL expects */
    al_free(lib);
}

alloy_status nccl_open(const char *path, nccl_library **out, char *err, size_t errlen)
{
    const char *file = path && *path ? path : "libnccl.so.2";
    *out = NULL;
    nccl_library *lib = al_calloc(1, sizeof *lib);
    if (!lib) {
        al_fmt(err, errlen, "out of memory loading NCCL");
        return ALLOY_ERR_OOM;
    }
    if (!(lib->library = dlopen(file, RTLD_NOW | RTLD_LOCAL))) {
        const char *why = dlerror();
        al_fmt(err, errlen, "NCCL (%s) cannot be loaded (%s): install NCCL or add the CUDA toolkit's lib64 to "
                            "LD_LIBRARY_PATH", file, why ? why : "not found");
        nccl_close(lib);
        return ALLOY_ERR_UNSUPPORTED;
    }
#define NCCL_LOAD(name, ret, params)                                                  \
    if (!(*(void **)&lib->name = dlsym(lib->library, #name))) {                       \
        al_fmt(err, errlen, "NCCL (%s) has no %s: older than 2.14", file, #name);      \
        nccl_close(lib);                                                              \
        return ALLOY_ERR_UNSUPPORTED;                                                 \
    }
    NCCL_ENTRIES(NCCL_LOAD)
#undef NCCL_LOAD
    ncclResult_t r = lib->ncclGetVersion(&lib->version);
    if (r != ncclSuccess || lib->version < NCCL_MIN_VERSION) {
        al_fmt(err, errlen, "NCCL (%s) version %d: alloy needs 2.14 (%d) or newer%s%s", file, lib->version,
               NCCL_MIN_VERSION, r != ncclSuccess ? ": " : "", r != ncclSuccess ? lib->ncclGetErrorString(r) : "");
        nccl_close(lib);
        return ALLOY_ERR_UNSUPPORTED;
    }
    *out = lib;
    return ALLOY_OK;
}

alloy_status nccl_unique_id(nccl_library *lib, ncclUniqueId *id, char *err, size_t errlen)
{
    ncclResult_t r = lib->ncclGetUniqueId(id);
    if (r == ncclSuccess) return ALLOY_OK;
    al_fmt(err, errlen, "ncclGetUniqueId failed: %s (%s)", lib->ncclGetErrorString(r), lib->ncclGetLastError(NULL));
    return ALLOY_ERR_CUDA;
}

alloy_status nccl_comm_init(nccl_library *lib, int nranks, const ncclUniqueId *id, int rank, ncclComm_t *out,
                            char *err, size_t errlen)
{
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        al_fmt(err, errlen, "ncclCommInitRank: rank %d of %d is out of range", rank, nranks);
        return ALLOY_ERR_INVALID;
    }
    ncclComm_t comm = NULL;
    ncclResult_t r = lib->ncclCommInitRank(&comm, nranks, *id, rank);
    if (r == ncclSuccess) {
        *out = comm;
        return ALLOY_OK;
    }
    const char *last = lib->ncclGetLastError(NULL);
    al_fmt(err, errlen, "ncclCommInitRank (rank %d of %d) failed: %s%s%s", rank, nranks, lib->ncclGetErrorString(r),
           last && *last ? ": " : "", last ? last : "");
    return ALLOY_ERR_CUDA;
}
