/* nccl.h - NCCL loaded at run time (dlopen libnccl.so.2, as cuBLASLt): version, unique ids, communicators, the in-place sum a data-parallel GPU step will call. */
#ifndef ALLOY_CUDA_NCCL_H
#define ALLOY_CUDA_NCCL_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* nccl.h declares f() for f(void) */
#include <nccl.h>
#pragma GCC diagnostic pop

#include "base/base.h"

/* X(name, return type, parameters): the entry points alloy calls. */
#define NCCL_ENTRIES(X)                                                                                      \
    X(ncclGetVersion, ncclResult_t, (int *version))                                                          \
    X(ncclGetUniqueId, ncclResult_t, (ncclUniqueId * id))                                                    \
    X(ncclCommInitRank, ncclResult_t, (ncclComm_t * comm, int nranks, ncclUniqueId id, int rank))           \
    X(ncclCommDestroy, ncclResult_t, (ncclComm_t comm))                                                      \
    X(ncclCommAbort, ncclResult_t, (ncclComm_t comm))                                                        \
    X(ncclCommGetAsyncError, ncclResult_t, (ncclComm_t comm, ncclResult_t * error))                          \
    X(ncclGetErrorString, const char *, (ncclResult_t result))                                               \
    X(ncclGetLastError, const char *, (ncclComm_t comm))                                                     \
    X(ncclAllReduce, ncclResult_t,                                                                           \
      (const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,     \
       cudaStream_t stream))

typedef struct nccl_library {
    void *library;
    int version; /* ncclGetVersion: 22809 for NCCL 2.28.9 */
#define NCCL_FIELD(name, ret, params) ret(*name) params;
    NCCL_ENTRIES(NCCL_FIELD)
#undef NCCL_FIELD
} nccl_library;

/* Loads path (NULL or "": libnccl.so.2; the options' nccl) and its entry
 * points, and reads its version. ALLOY_ERR_UNSUPPORTED with err naming the
 * library (not found, an entry missing, older than 2.14) when it cannot be
 * used; *out NULL then. */
AL_HIDDEN alloy_status nccl_open(const char *path, nccl_library **out, char *err, size_t errlen);
/* Frees lib; the library itself stays loaded (NCCL's threads outlive its calls). */
AL_HIDDEN void nccl_close(nccl_library *lib);
/* A new unique id (what rank 0 makes and broadcasts; needs no GPU). */
AL_HIDDEN alloy_status nccl_unique_id(nccl_library *lib, ncclUniqueId *id, char *err, size_t errlen);
/* This process's communicator as rank `rank` of `nranks` over id, on the
 * current CUDA device. ALLOY_ERR_CUDA with NCCL's message (and its last
 * error's text) when NCCL refuses: no GPU, no driver, a bad rank. */
AL_HIDDEN alloy_status nccl_comm_init(nccl_library *lib, int nranks, const ncclUniqueId *id, int rank,
                                      ncclComm_t *out, char *err, size_t errlen);

#endif
