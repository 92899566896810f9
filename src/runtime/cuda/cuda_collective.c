/* cuda_collective.c - the CUDA backend's collectives over NCCL (cuda_collective.h); a build without CUDA refuses them. */
#include <string.h>

#include "alloy_config.h"
#include "runtime/comm/comm.h"
#include "runtime/cuda/cuda_collective.h"

#if ALLOY_HAVE_CUDA
#include "runtime/cuda/nccl.h"

struct cu_coll {
    nccl_library *lib;
    ncclComm_t comm;    /* NULL until connected */
    alloy_comm *over;   /* the alloy communicator it was made over */
    int rank, size, device;
    bool aborted;
};

/* One collective op: how it is queued on the stream. Another collective
 * (reduce_scatter, all_gather) is one more entry. */
typedef struct coll_entry {
    int op;
    ncclResult_t (*queue)(cu_coll *c, const ir_node *n, void *buf, size_t count, ncclDataType_t t, cudaStream_t s);
} coll_entry;

/* all_reduce in place, sum or max (never ncclAvg: out of place it leaves
 * the tail unwritten in NCCL 2.28.9, NVIDIA/nccl#1950; 1/world is the
 * unscale kernel's, as on the CPU) */
static ncclResult_t all_reduce(cu_coll *c, const ir_node *n, void *buf, size_t count, ncclDataType_t t, cudaStream_t s)
{
    ncclRedOp_t op = strcmp(ir_attr_str(n, "reduce", "sum"), "max") == 0 ? ncclMax : ncclSum;
    return c->lib->ncclAllReduce(buf, buf, count, t, op, c->comm, s);
}

static const coll_entry coll_table[] = {
    {IR_OP_all_reduce, all_reduce},
};

static const coll_entry *entry_of(int op)
{
    for (size_t i = 0; i < sizeof coll_table / sizeof *coll_table; i++)
        if (coll_table[i].op == op) return &coll_table[i];
    return NULL;
}

bool cu_coll_has(int op) { return entry_of(op) != NULL; }

alloy_status cu_coll_open(const char *path, cu_coll **out, char *err, size_t errlen)
{
    *out = NULL;
    cu_coll *c = al_calloc(1, sizeof *c);
    if (!c) {
        al_fmt(err, errlen, "out of memory loading NCCL");
        return ALLOY_ERR_OOM;
    }
    alloy_status st = nccl_open(path, &c->lib, err, errlen);
    if (st) {
        al_free(c);
        return st;
    }
    *out = c;
    return ALLOY_OK;
}

static void disconnect(cu_coll *c)
{
    if (c->comm && !c->aborted) c->lib->ncclCommDestroy(c->comm);
    c->comm = NULL, c->over = NULL, c->aborted = false;
}

void cu_coll_close(cu_coll *c)
{
    if (!c) return;
    disconnect(c);
    nccl_close(c->lib);
    al_free(c);
}

void cu_coll_abort(cu_coll *c)
{
    if (!c || !c->comm || c->aborted) return;
    c->lib->ncclCommAbort(c->comm);
    c->aborted = true;
}

/* NCCL's text for r and its last error, "unhandled system error: ..." */
static void nccl_why(cu_coll *c, ncclResult_t r, char *out, size_t len)
{
    const char *last = c->lib->ncclGetLastError(c->aborted ? NULL : c->comm);
    al_fmt(out, len, "%s%s%s", c->lib->ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

alloy_status cu_coll_connect(cu_coll *c, alloy_comm *comm, int device, char *err, size_t errlen)
{
    if (c->comm && c->over == comm) {
        if (!c->aborted) return ALLOY_OK;
        al_fmt(err, errlen, "the NCCL communicator of rank %d of %d was aborted after an earlier failure; make a new "
                            "graph (and communicator) to go on", c->rank, c->size);
        return ALLOY_ERR_IO;
    }
    disconnect(c);
    c->rank = alloy_comm_rank(comm), c->size = alloy_comm_size(comm), c->device = device;
    struct {
        int32_t made; /* rank 0 made the id */
        ncclUniqueId id;
    } msg;
    memset(&msg, 0, sizeof msg);
    alloy_status st = c->rank == 0 ? nccl_unique_id(c->lib, &msg.id, err, errlen) : ALLOY_OK;
    msg.made = c->rank == 0 && !st;
    /* every rank takes part in the broadcast, so a rank 0 that failed lets the others return too */
    char why[512];
    alloy_status bs = comm_broadcast(comm, &msg, sizeof msg, "the NCCL unique id", why, sizeof why);
    if (st) return st;
    if (bs) {
        al_fmt(err, errlen, "%s", why);
        return bs;
    }
    if (!msg.made) {
        al_fmt(err, errlen, "rank 0 could not make NCCL's unique id (its own error says why)");
        return ALLOY_ERR_CUDA;
    }
    ncclComm_t nc = NULL;
    if ((st = nccl_comm_init(c->lib, c->size, &msg.id, c->rank, &nc, why, sizeof why))) {
        al_fmt(err, errlen, "on GPU %d: %s", device, why);
        return st;
    }
    c->comm = nc, c->over = comm;
    return ALLOY_OK;
}

/* NCCL's type for dt; false for a dtype NCCL does not reduce. */
static bool nccl_type(alloy_dtype dt, ncclDataType_t *t)
{
    switch (dt) {
    case ALLOY_F32: *t = ncclFloat32; return true;
    case ALLOY_F64: *t = ncclFloat64; return true;
    case ALLOY_F16: *t = ncclFloat16; return true;
    case ALLOY_BF16: *t = ncclBfloat16; return true;
    case ALLOY_I32: *t = ncclInt32; return true;
    case ALLOY_I64: *t = ncclInt64; return true;
    case ALLOY_BOOL: *t = ncclUint8; return true;
    default: return false;
    }
}

alloy_status cu_coll_enqueue(cu_coll *c, const ir_node *n, cdev_ptr buf, void *stream, char *err, size_t errlen)
{
    char label[64];
    ir_node_label(n, label, sizeof label);
    const char *name = ir_ops[n->op].name;
    const coll_entry *e = entry_of(n->op);
    ncclDataType_t t;
    if (!e || !nccl_type(n->type.dtype, &t)) {
        al_fmt(err, errlen, "%s %s: no NCCL call for this op or dtype %s", name, label, alloy_dtype_name(n->type.dtype));
        return ALLOY_ERR_UNSUPPORTED;
    }
    if (!c->comm || c->aborted) {
        al_fmt(err, errlen, "%s %s: %s", name, label, c->aborted ? "the NCCL communicator was aborted" : "no NCCL communicator");
        return ALLOY_ERR_IO;
    }
    ncclResult_t r = e->queue(c, n, (void *)(uintptr_t)buf, (size_t)ir_numel(&n->type), t, (cudaStream_t)stream);
    if (r == ncclSuccess) return ALLOY_OK;
    char why[400];
    nccl_why(c, r, why, sizeof why);
    al_fmt(err, errlen, "%s %s: NCCL on rank %d of %d (GPU %d): %s", name, label, c->rank, c->size, c->device, why);
    return ALLOY_ERR_IO;
}

alloy_status cu_coll_check(cu_coll *c, const char *what, char *err, size_t errlen)
{
    if (!c || !c->comm) return ALLOY_OK;
    if (c->aborted) {
        al_fmt(err, errlen, "%s: the NCCL communicator of rank %d of %d was aborted", what, c->rank, c->size);
        return ALLOY_ERR_IO;
    }
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = c->lib->ncclCommGetAsyncError(c->comm, &async);
    if (r == ncclSuccess && (async == ncclSuccess || async == ncclInProgress)) return ALLOY_OK;
    char why[400];
    nccl_why(c, r != ncclSuccess ? r : async, why, sizeof why);
    cu_coll_abort(c);
    al_fmt(err, errlen, "%s failed on rank %d of %d (GPU %d): %s; the NCCL communicator was aborted (a peer died, "
                        "or its network failed)", what, c->rank, c->size, c->device, why);
    return ALLOY_ERR_IO;
}

#else /* built without CUDA */

struct cu_coll {
    int unused;
};

alloy_status cu_coll_open(const char *path, cu_coll **out, char *err, size_t errlen)
{
    (void)path;
    *out = NULL;
    al_fmt(err, errlen, "alloy was built without CUDA, so without NCCL");
    return ALLOY_ERR_UNSUPPORTED;
}

void cu_coll_close(cu_coll *c) { (void)c; }
bool cu_coll_has(int op) { return op == IR_OP_all_reduce; }
void cu_coll_abort(cu_coll *c) { (void)c; }

alloy_status cu_coll_connect(cu_coll *c, alloy_comm *comm, int device, char *err, size_t errlen)
{
    (void)c, (void)comm, (void)device;
    al_fmt(err, errlen, "alloy was built without CUDA, so without NCCL");
    return ALLOY_ERR_UNSUPPORTED;
}

alloy_status cu_coll_enqueue(cu_coll *c, const ir_node *n, cdev_ptr buf, void *stream, char *err, size_t errlen)
{
    (void)c, (void)n, (void)buf, (void)stream;
    al_fmt(err, errlen, "alloy was built without CUDA, so without NCCL");
    return ALLOY_ERR_UNSUPPORTED;
}

alloy_status cu_coll_check(cu_coll *c, const char *what, char *err, size_t errlen)
{
    (void)c, (void)what, (void)err, (void)errlen;
    return ALLOY_OK;
}

#endif
