/* cpu_collective.c - the CPU kernels of the data-parallel collectives: all_reduce, reduce_scatter and all_gather through the run's communicator (MPI). */
#include <string.h>

#include "runtime/comm/comm.h"
#include "runtime/cpu/cpu.h"

/* "OP %ID NAME" for messages */
static const char *what_node(char *what, size_t len, const char *op, const ir_node *n)
{
    al_fmt(what, len, "%s %%%d%s%s", op, n->id, n->name ? " " : "", n->name ? n->name : "");
    return what;
}

/* out = x reduced over the ranks of x->comm: x copied into out, then
 * MPI_Allreduce in place on out (runtime/comm/comm.h gives the order).
 * A run with no communicator is one process: out = x. */
alloy_status cpu_all_reduce(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    size_t bytes = ir_nbytes(&out->type);
    if (out->data != in[0].data && bytes) memmove(out->data, in[0].data, bytes);
    if (!x->comm) return ALLOY_OK;
    comm_reduce op = strcmp(ir_attr_str(n, "reduce", "sum"), "max") == 0 ? COMM_MAX : COMM_SUM;
    char what[160], err[400];
    alloy_status st = comm_all_reduce(x->comm, out->data, ir_numel(&out->type), out->type.dtype, op,
                                      what_node(what, sizeof what, "all_reduce", n), err, sizeof err);
    if (st) return cpu_fail(x, st, "%s", err);
    return ALLOY_OK;
}

/* out = this rank's shard of x summed over the ranks (MPI_Reduce_scatter_block;
 * comm.h gives the order). With no communicator the run is rank 0 of one
 * process: out = x's first shard. */
alloy_status cpu_reduce_scatter(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    if (!x->comm) {
        size_t bytes = ir_nbytes(&out->type);
        if (out->data != in[0].data && bytes) memmove(out->data, in[0].data, bytes);
        return ALLOY_OK;
    }
    char what[160], err[400];
    alloy_status st = comm_reduce_scatter(x->comm, in[0].data, out->data, ir_numel(&out->type), out->type.dtype,
                                          (int)ir_attr_i(n, "world"), what_node(what, sizeof what, "reduce_scatter", n),
                                          err, sizeof err);
    if (st) return cpu_fail(x, st, "%s", err);
    return ALLOY_OK;
}

/* out = every rank's x in rank order (MPI_Allgather). With no communicator
 * the run is one process: x repeated `world` times. */
alloy_status cpu_all_gather(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    int world = (int)ir_attr_i(n, "world");
    size_t part = ir_nbytes(&in[0].type);
    if (!x->comm) {
        for (int r = 0; r < world && part; r++) memmove((char *)out->data + (size_t)r * part, in[0].data, part);
        return ALLOY_OK;
    }
    char what[160], err[400];
    alloy_status st = comm_all_gather(x->comm, in[0].data, out->data, ir_numel(&in[0].type), in[0].type.dtype, world,
                                      what_node(what, sizeof what, "all_gather", n), err, sizeof err);
    if (st) return cpu_fail(x, st, "%s", err);
    return ALLOY_OK;
}
