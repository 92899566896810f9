/* comm.h - the collectives a data-parallel step runs, over an alloy_comm (MPI underneath; only comm_mpi.c includes mpi.h). */
#ifndef ALLOY_COMM_H
#define ALLOY_COMM_H

#include "alloy/distributed.h"
#include "base/base.h"

/* The reduction of an all_reduce (its `reduce` attribute). */
typedef enum comm_reduce { COMM_SUM, COMM_MAX } comm_reduce;

/* Replaces buf's count elements of dtype dt, on every rank of c, with their
 * elementwise reduction over the ranks, in place (MPI_Allreduce with
 * MPI_IN_PLACE). The sum of two ranks is one addition, x0 + x1 (the same
 * bits in either order); for more ranks the order is MPI's, or with c's
 * ordered option ((x0 + x1) + x2) + ... by an all-gather. f16 and bf16
 * are summed in f32 and rounded once. With c's timeout, a collective not
 * finished in time is ALLOY_ERR_IO naming it. Errors name `what`. */
AL_HIDDEN alloy_status comm_all_reduce(alloy_comm *c, void *buf, int64_t count, alloy_dtype dt, comm_reduce op,
                                       const char *what, char *err, size_t errlen);
/* out[0..count) = rank r's shard of the elementwise sum over the ranks of
 * c of every rank's in[0..world * count), i.e. elements [r count, (r+1)
 * count) of the sum (MPI_Reduce_scatter_block); world must be c's size.
 * The order of the sum is comm_all_reduce's (two ranks: one addition; more
 * with c's ordered option: rank order, by an all-to-all of the shards).
 * f32 and f64 only (ZeRO-1 shards f32 gradients). Errors name `what`. */
AL_HIDDEN alloy_status comm_reduce_scatter(alloy_comm *c, const void *in, void *out, int64_t count, alloy_dtype dt,
                                           int world, const char *what, char *err, size_t errlen);
/* out[r count .. (r+1) count) = rank r's in[0..count) for every rank r of c
 * (MPI_Allgather of bytes, so any dtype); world must be c's size. Errors
 * name `what`. */
AL_HIDDEN alloy_status comm_all_gather(alloy_comm *c, const void *in, void *out, int64_t count, alloy_dtype dt,
                                       int world, const char *what, char *err, size_t errlen);
/* Replaces buf's bytes on every rank of c with rank 0's (MPI_Bcast), within
 * c's timeout (ALLOY_ERR_IO naming `what` when late). */
AL_HIDDEN alloy_status comm_broadcast(alloy_comm *c, void *buf, size_t bytes, const char *what, char *err, size_t errlen);
/* all[r * n + i] = rank r's v[i] for every rank r (MPI_Allgather), within c's
 * timeout; all holds n * size values. */
AL_HIDDEN alloy_status comm_all_gather_u64(alloy_comm *c, const uint64_t *v, int n, uint64_t *all, const char *what,
                                           char *err, size_t errlen);
/* Sets the timeout of c's collectives (seconds; 0: none) and whether its
 * sums over more than two ranks go in rank order (alloy_data_parallel's
 * ordered_sum). */
AL_HIDDEN void comm_configure(alloy_comm *c, double timeout_s, bool ordered);
/* c's timeout in seconds (0: none), which a backend's own collectives (NCCL's) keep too. */
AL_HIDDEN double comm_timeout_s(const alloy_comm *c);

#endif
