/* cpu_collective.c - the CPU kernel of the data-parallel collectives: all_reduce through the run's communicator (MPI). */
#include <string.h>

#include "runtime/comm/comm.h"
#include "runtime/cpu/cpu.h"

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
    al_fmt(what, sizeof what, "all_reduce %%%d%s%s", n->id, n->name ? " " : "", n->name ? n->name : "");
    alloy_status st = comm_all_reduce(x->comm, out->data, ir_numel(&out->type), out->type.dtype, op, what, err, sizeof err);
    if (st) return cpu_fail(x, st, "%s", err);
    return ALLOY_OK;
}
