/* dp_api.c - the public data-parallel call: a graph's communicator and bucket, ZeRO and timeout options. */
#include <math.h>
#include <string.h>

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
    comm_configure(comm, o.timeout_s, o.ordered_sum);
    g->comm = comm;
    g->dp = o;
    graph_invalidate(g);
    /* state made before this call (its later tensors are broadcast as they are made): rank 0's, on every rank */
    for (int i = 0; i < g->nstate; i++) {
        rt_state *s = &g->state[i];
        size_t bytes = ir_nbytes(&s->type);
        char err[512];
        alloy_status st = state_host(g, s);
        if (st) return st;
        void *copy = al_malloc(bytes ? bytes : 1);
        if (!copy) return graph_fail(g, ALLOY_ERR_OOM, "set_data_parallel: out of memory for state '%s'", s->name);
        if (bytes) memcpy(copy, s->cell->host, bytes);
        st = comm_broadcast(comm, copy, bytes, s->name, err, sizeof err);
        if (st) graph_fail(g, st, "set_data_parallel: state from rank 0: %s", err);
        else st = state_write(g, s, copy);
        al_free(copy);
        if (st) return st;
    }
    return ALLOY_OK;
}
