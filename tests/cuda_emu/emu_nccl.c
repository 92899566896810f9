/* emu_nccl.c - NCCL for the emulated CUDA device, built as a shared library the backend loads in place of libnccl.so.2 (the nccl option): the entry points alloy calls, over MPI between the mpirun ranks, each collective run in order on the emulated stream (emu_stream.h). */
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* nccl.h declares f() for f(void) */
#include <nccl.h>
#pragma GCC diagnostic pop

#include "emu_stream.h"

/* Exported with default visibility whatever the build's flags: the backend finds them with dlsym. */
#define EMU_API __attribute__((visibility("default")))

/* "alloy-emu-nccl" then the maker's pid and a count: what an id from ncclGetUniqueId holds */
static const char id_magic[] = "alloy-emu-nccl";

struct ncclComm {
    MPI_Comm comm;
    int rank, nranks;
    ncclResult_t async; /* the asynchronous error, set by a collective that failed */
    long collectives;   /* run so far */
    char last[256];
};

static char last_error[256];

/* The failure ALLOY_EMU_NCCL_FAIL asks for: "init" (ncclCommInitRank fails
 * as NCCL does without a GPU), "async" (the next collective fails on every
 * rank as when a peer dies: an asynchronous error naming the peer). */
static bool failing(const char *what)
{
    const char *v = getenv("ALLOY_EMU_NCCL_FAIL");
    return v && strcmp(v, what) == 0;
}

EMU_API ncclResult_t ncclGetVersion(int *version)
{
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

EMU_API ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static long count;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "%s %ld %ld", id_magic, (long)getpid(), ++count);
    return ncclSuccess;
}

EMU_API const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

EMU_API const char *ncclGetLastError(ncclComm_t comm) { return comm ? comm->last : last_error; }

EMU_API ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
    *out = NULL;
    int ready = 0, size = 0;
    MPI_Initialized(&ready);
    if (!ready) {
        snprintf(last_error, sizeof last_error, "emulated NCCL: MPI is not initialized");
        return ncclInvalidUsage;
    }
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (nranks != size || rank < 0 || rank >= nranks) {
        snprintf(last_error, sizeof last_error, "emulated NCCL: rank %d of %d, over MPI_COMM_WORLD's %d ranks only", rank,
                 nranks, size);
        return ncclInvalidUsage;
    }
    if (strncmp(id.internal, id_magic, strlen(id_magic)) != 0) {
        snprintf(last_error, sizeof last_error, "emulated NCCL: rank %d's unique id was not made by ncclGetUniqueId", rank);
        return ncclInvalidArgument;
    }
    if (failing("init")) {
        snprintf(last_error, sizeof last_error, "Cuda failure 'no CUDA-capable device is detected' (emulated)");
        return ncclUnhandledCudaError;
    }
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    /* the ranks ordered by their NCCL rank; every rank's id must be rank 0's (the broadcast worked) */
    if (MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &c->comm) != MPI_SUCCESS) {
        free(c);
        snprintf(last_error, sizeof last_error, "emulated NCCL: MPI_Comm_split failed");
        return ncclSystemError;
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    char *ids = malloc((size_t)nranks * sizeof id.internal);
    int rc = ids ? MPI_Allgather(id.internal, (int)sizeof id.internal, MPI_BYTE, ids, (int)sizeof id.internal, MPI_BYTE,
                                 c->comm)
                 : MPI_ERR_NO_MEM;
    int differs = -1;
    for (int r = 0; rc == MPI_SUCCESS && r < nranks && differs < 0; r++)
        if (memcmp(ids + (size_t)r * sizeof id.internal, id.internal, sizeof id.internal)) differs = r;
    free(ids);
    if (rc != MPI_SUCCESS || differs >= 0) {
        snprintf(last_error, sizeof last_error, "emulated NCCL: %s", rc != MPI_SUCCESS ? "exchanging the unique ids failed"
                                                                         : "the ranks hold different unique ids");
        MPI_Comm_free(&c->comm);
        free(c);
        return ncclInvalidArgument;
    }
    c->rank = rank, c->nranks = nranks;
    *out = c;
    return ncclSuccess;
}

EMU_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error)
{
    *error = comm->async;
    return ncclSuccess;
}

EMU_API ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm) return ncclSuccess;
    MPI_Comm_free(&comm->comm);
    free(comm);
    return ncclSuccess;
}

EMU_API ncclResult_t ncclCommDestroy(ncclComm_t comm) { return ncclCommAbort(comm); }

/* One all-reduce as queued on the stream. */
typedef struct reduce_call {
    ncclComm_t comm;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
} reduce_call;

static void run_all_reduce(void *arg)
{
    const reduce_call *a = arg;
    ncclComm_t c = a->comm;
    if (c->async != ncclSuccess) return; /* a failed communicator runs nothing more */
    c->collectives++;
    if (failing("async")) {
        c->async = ncclRemoteError;
        snprintf(c->last, sizeof c->last, "NET/Socket : peer rank %d closed the connection (emulated)",
                 (c->rank + 1) % c->nranks);
        return;
    }
    MPI_Datatype t;
    switch (a->type) {
    case ncclFloat32: t = MPI_FLOAT; break;
    case ncclFloat64: t = MPI_DOUBLE; break;
    case ncclInt32: t = MPI_INT32_T; break;
    case ncclInt64: t = MPI_INT64_T; break;
    case ncclUint8: t = MPI_UINT8_T; break;
    default:
        c->async = ncclInvalidArgument;
        snprintf(c->last, sizeof c->last, "emulated NCCL: datatype %d is not emulated (f32, f64, i32, i64, u8 are)",
                 (int)a->type);
        return;
    }
    MPI_Op op = a->op == ncclSum ? MPI_SUM : a->op == ncclMax ? MPI_MAX : MPI_OP_NULL;
    if (op == MPI_OP_NULL) {
        c->async = ncclInvalidArgument;
        snprintf(c->last, sizeof c->last, "emulated NCCL: reduction %d is not emulated (sum and max are)", (int)a->op);
        return;
    }
    int rc = MPI_Allreduce(a->send == a->recv ? MPI_IN_PLACE : a->send, a->recv, (int)a->count, t, op, c->comm);
    if (rc != MPI_SUCCESS) {
        c->async = ncclSystemError;
        snprintf(c->last, sizeof c->last, "emulated NCCL: MPI_Allreduce failed (%d)", rc);
    }
}

EMU_API ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                   ncclComm_t comm, cudaStream_t stream)
{
    emu_stream *s = (emu_stream *)stream;
    if (!comm || !s || s->magic != EMU_STREAM_MAGIC) {
        snprintf(comm ? comm->last : last_error, sizeof last_error, "emulated NCCL: not an emulated device's stream");
        return ncclInvalidArgument;
    }
    if (count > (size_t)1 << 30) {
        snprintf(comm->last, sizeof comm->last, "emulated NCCL: %zu elements in one call", count);
        return ncclInvalidArgument;
    }
    reduce_call call = {comm, send, recv, count, type, op};
    return s->enqueue(s, run_all_reduce, &call, sizeof call) ? ncclSystemError : ncclSuccess;
}
