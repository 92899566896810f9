/* alloy/mpi.h - an alloy communicator from an MPI communicator; the one alloy header that needs mpi.h. */
#ifndef ALLOY_MPI_H
#define ALLOY_MPI_H

#include <mpi.h>

#include "alloy/distributed.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator over comm's processes (alloy_comm_free frees it; comm
 * itself stays the caller's). MPI must be initialized. Passed as the
 * Fortran handle, so the library and the program agree on the type
 * whichever MPI the program includes. */
static inline alloy_status alloy_comm_from_mpi(MPI_Comm comm, alloy_comm **out, char *err, size_t errlen)
{
    return alloy_comm_from_mpi_handle((int64_t)MPI_Comm_c2f(comm), out, err, errlen);
}

#ifdef __cplusplus
}
#endif

#endif
