/* cuda_collective.h - a CUDA step's data-parallel collectives over NCCL: the library, the communicator made from rank 0's unique id broadcast over MPI, one table entry per collective op, NCCL's asynchronous errors and the communicator's abort. */
#ifndef ALLOY_CUDA_COLLECTIVE_H
#define ALLOY_CUDA_COLLECTIVE_H

#include "alloy/distributed.h"
#include "ir/ir.h"
#include "runtime/cuda/device.h"

typedef struct cu_coll cu_coll;

/* Loads the NCCL library at path (NULL or "": libnccl.so.2), with no
 * communicator yet. ALLOY_ERR_UNSUPPORTED with err saying why: the
 * library cannot be loaded or is too old, or alloy was built without CUDA. */
AL_HIDDEN alloy_status cu_coll_open(const char *path, cu_coll **out, char *err, size_t errlen);
/* Destroys the communicator (ncclCommDestroy; none after an abort) and frees c; NULL is fine. */
AL_HIDDEN void cu_coll_close(cu_coll *c);
/* Whether op is a collective the table runs (all_reduce today). */
AL_HIDDEN bool cu_coll_has(int op);
/* Makes c's communicator over comm's ranks unless it has one for comm
 * already (a communicator for another comm is destroyed first): rank 0's
 * ncclGetUniqueId broadcast to every rank over comm (MPI, within comm's
 * timeout), then ncclCommInitRank(size, id, rank) on the CUDA device
 * current on this thread, `device` (for messages). Collective over comm.
 * ALLOY_ERR_CUDA with NCCL's message naming the rank and device when NCCL
 * refuses; ALLOY_ERR_IO when the broadcast fails or is late. */
AL_HIDDEN alloy_status cu_coll_connect(cu_coll *c, alloy_comm *comm, int device, char *err, size_t errlen);
/* Queues node n's collective (its op's table entry; all_reduce: in-place
 * ncclAllReduce, ncclSum or ncclMax by its reduce attribute) on buf,
 * n's value on the device, on stream (the device's, cudaStream_t): runs in
 * stream order, and is recorded when the stream is being captured.
 * Errors name n and the rank. */
AL_HIDDEN alloy_status cu_coll_enqueue(cu_coll *c, const ir_node *n, cdev_ptr buf, void *stream, char *err,
                                       size_t errlen);
/* NCCL's asynchronous error on c's communicator (ncclCommGetAsyncError):
 * ALLOY_OK while none; else the communicator is aborted (ncclCommAbort)
 * and ALLOY_ERR_IO with err naming `what` (the step's collectives), the
 * rank and NCCL's message (which names the peer where NCCL knows it). A
 * communicator aborted earlier is ALLOY_ERR_IO saying so. */
AL_HIDDEN alloy_status cu_coll_check(cu_coll *c, const char *what, char *err, size_t errlen);
/* Aborts c's communicator (ncclCommAbort): what a collective that missed
 * its deadline leaves; every later call on c fails, saying so. */
AL_HIDDEN void cu_coll_abort(cu_coll *c);

#endif
