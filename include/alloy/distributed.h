/* alloy/distributed.h - data-parallel training across processes: the communicator and the graph's data-parallel setting (no mpi.h needed). */
#ifndef ALLOY_DISTRIBUTED_H
#define ALLOY_DISTRIBUTED_H

#include <stdbool.h>

#include "alloy/graph.h"
#include "alloy/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A group of processes that train one model together (docs/distributed.md).
 * Made from MPI's world (alloy_comm_world) or from an MPI communicator
 * (alloy_comm_from_mpi in alloy/mpi.h); alloy duplicates it, so its own
 * collectives never mix with the caller's messages, and sets MPI errors to
 * return (a failed collective is an error, not an abort). Every process of
 * the group runs the same calls in the same order. */
typedef struct alloy_comm alloy_comm;

/* Whether this build has MPI (-Dmpi); without it every call below that makes
 * a communicator returns ALLOY_ERR_UNSUPPORTED, "built without MPI". */
ALLOY_API bool alloy_have_mpi(void);

/* A communicator over every process MPI started (MPI_COMM_WORLD),
 * initializing MPI when the program has not (alloy_comm_free then
 * finalizes it). On failure *out is NULL and err (may be NULL) says why. */
ALLOY_API alloy_status alloy_comm_world(alloy_comm **out, char *err, size_t errlen);
/* A communicator over the processes of the MPI communicator whose Fortran
 * handle (MPI_Comm_c2f) is `handle`; alloy/mpi.h's alloy_comm_from_mpi is
 * the call to use. MPI must be initialized. */
ALLOY_API alloy_status alloy_comm_from_mpi_handle(int64_t handle, alloy_comm **out, char *err, size_t errlen);
/* This process's rank in the group, the group's size, and its rank among
 * the group's processes on this machine (what picks its GPU); -1 for NULL. */
ALLOY_API int alloy_comm_rank(const alloy_comm *comm);
ALLOY_API int alloy_comm_size(const alloy_comm *comm);
ALLOY_API int alloy_comm_local_rank(const alloy_comm *comm);
/* Frees the communicator (graphs using it must be freed first); finalizes
 * MPI when alloy_comm_world initialized it and this was its last one. */
ALLOY_API void alloy_comm_free(alloy_comm *comm);

/* How a graph trains data-parallel (alloy_graph_set_data_parallel).
 * timeout_s and ordered_sum are kept on the communicator: the last call
 * sets them for every graph that uses it. */
typedef struct alloy_data_parallel {
    size_t bucket_bytes; /* gradients are all-reduced in buckets of about this many bytes; 0: 25 MiB */
    int zero_stage;      /* 0: every rank keeps every optimizer state; 1 (ZeRO-1): each rank keeps and updates its
                            shard of every parameter's moments, gradients reduce-scattered and the updated shards
                            all-gathered; checkpoints are then saved by every rank (docs/distributed.md) */
    double timeout_s;    /* a collective not finished in this time is an error; 0: wait forever */
    bool ordered_sum;    /* sum over more than 2 ranks in rank order, ((x0 + x1) + x2) + ..., by an all-gather
                            (size times the bucket's memory): the same bits whatever MPI's algorithm, equal to
                            accumulating the ranks' micro-batches in order; false: MPI_Allreduce's order */
} alloy_data_parallel;

/* Makes g's training step data-parallel over comm (which must outlive g):
 * each rank runs the step on its own part of the batch; the gradients are
 * summed over the ranks and divided by their number before the loss scaler
 * and the optimizer see them, so every rank takes the same step; the loss
 * scaler's found_inf is agreed (the largest over the ranks), so every rank
 * skips the same steps; the reported loss is the mean over the ranks.
 * opts NULL: the defaults. A comm of one process is allowed (the step is
 * the single-process one, through the same collectives). Every rank must
 * make this call (a collective): g's state (parameters, moments, ...) that
 * exists now becomes rank 0's on every rank, and state made later (at the
 * first run) is rank 0's as it is made, so the ranks start identical
 * whatever their seeds. The next compile compares every rank's built
 * graph and options with rank 0's (hashes) and fails, naming the first
 * rank and part that differ, on every rank. Errors:
 * ALLOY_ERR_INVALID (NULL g or comm, zero_stage not 0 or 1, a negative
 * timeout), ALLOY_ERR_UNSUPPORTED (built without MPI), ALLOY_ERR_IO (the
 * broadcast failed or timed out). Takes effect at the next compile. */
ALLOY_API alloy_status alloy_graph_set_data_parallel(alloy_graph *g, alloy_comm *comm, const alloy_data_parallel *opts);

/* Checks that every rank holds the same state (a collective: every rank
 * calls it): each state tensor's bytes hashed (ZeRO-1's shards, each
 * rank's own, left out), the hashes all-gathered and compared with rank
 * 0's. ALLOY_ERR_INVALID on every rank naming the first rank that
 * differs, its first differing tensor and how many differ; ALLOY_OK for a
 * graph that is not data-parallel. A run whose ranks took different steps
 * (another batch count, a rank that skipped a step) shows here. */
ALLOY_API alloy_status alloy_graph_check_replicas(alloy_graph *g);

#ifdef __cplusplus
}
#endif

#endif
