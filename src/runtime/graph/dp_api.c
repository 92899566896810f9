/* dp_api.c - the public data-parallel call: a graph's communicator and bucket, ZeRO and timeout options. */
#include <math.h>

#include "runtime/comm/comm.h"
#include "runtime/graph/graph_impl.h"

/* DDP's default bucket: 25 MiB. */
#define DEFAULT_BUCKET_BYTES ((size_t)25 << 20)

alloy_status alloy_graph_set_data_parallel(alloy_graph *g, alloy_comm *comm, const alloy_data_parallel *opts)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!alloy_have_mpi())
        return graph_fail(g, ALLOY_ERR_UNSUPPORTED,
                          "set_data_parallel: alloy was built without MPI (install libopenmpi-dev and configure with "
                          "-Dmpi=enabled)");
    if (!comm) return graph_fail(g, ALLOY_ERR_INVALID, "set_data_parallel: comm is NULL (alloy_comm_world)");
    alloy_data_parallel o = opts ? *opts : (alloy_data_parallel){0};
    if (o.zero_stage != 0)
        return graph_fail(g, ALLOY_ERR_INVALID, "set_data_parallel: zero_stage %d is not built (0 is)", o.zero_stage);
    if (!(o.timeout_s >= 0) || isinf(o.timeout_s))
        return graph_fail(g, ALLOY_ERR_INVALID, "set_data_parallel: timeout_s %g must be finite and >= 0 (0: none)",
                          o.timeout_s);
    if (!o.bucket_bytes) o.bucket_bytes = DEFAULT_BUCKET_BYTES;
    comm_set_timeout(comm, o.timeout_s);
    g->comm = comm;
    g->dp = o;
    graph_invalidate(g);
    return ALLOY_OK;
}
