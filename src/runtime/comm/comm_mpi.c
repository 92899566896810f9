/* comm_mpi.c - alloy_comm over MPI: making communicators, in-place all-reduce, reduce-scatter and all-gather with an optional deadline; "built without MPI" errors when the build has none. */
#include <string.h>
#include <time.h>

#include "alloy_config.h"
#include "base/convert.h"
#include "runtime/comm/comm.h"

#if ALLOY_HAVE_MPI
#include <mpi.h>

struct alloy_comm {
    MPI_Comm comm; /* a duplicate of the caller's, errors returned */
    int rank, size, local_rank;
    double timeout_s;
    bool ordered; /* sums in rank order (an all-gather, then x0 + x1 + ... from the left) */
};

static int initialized_by_alloy; /* communicators alive that alloy_comm_world made after it initialized MPI */
static bool alloy_initialized;

/* MPI's message for code rc after "what: " into err; returns status. */
static alloy_status mpi_fail(int rc, const char *what, char *err, size_t errlen)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    if (err && errlen) al_fmt(err, errlen, "%s: %s", what, text);
    return ALLOY_ERR_IO;
}

static alloy_status wrap(MPI_Comm from, alloy_comm **out, char *err, size_t errlen)
{
    alloy_comm *c = al_calloc(1, sizeof *c);
    if (!c) {
        if (err && errlen) al_fmt(err, errlen, "out of memory making a communicator");
        return ALLOY_ERR_OOM;
    }
    int rc = MPI_Comm_dup(from, &c->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(c->comm, &c->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(c->comm, &c->size);
    MPI_Comm node = MPI_COMM_NULL;
    if (rc == MPI_SUCCESS) rc = MPI_Comm_split_type(c->comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(node, &c->local_rank);
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS) {
        alloy_status st = mpi_fail(rc, "making a communicator", err, errlen);
        al_free(c);
        return st;
    }
    *out = c;
    return ALLOY_OK;
}

bool alloy_have_mpi(void) { return true; }

alloy_status alloy_comm_world(alloy_comm **out, char *err, size_t errlen)
{
    if (!out) {
        if (err && errlen) al_fmt(err, errlen, "alloy_comm_world: out is NULL");
        return ALLOY_ERR_INVALID;
    }
    *out = NULL;
    int ready = 0;
    MPI_Initialized(&ready);
    if (!ready) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread", err, errlen);
        alloy_initialized = true;
    }
    alloy_status st = wrap(MPI_COMM_WORLD, out, err, errlen);
    if (!st && alloy_initialized) initialized_by_alloy++;
    return st;
}

alloy_status alloy_comm_from_mpi_handle(int64_t handle, alloy_comm **out, char *err, size_t errlen)
{
    if (!out) {
        if (err && errlen) al_fmt(err, errlen, "alloy_comm_from_mpi: out is NULL");
        return ALLOY_ERR_INVALID;
    }
    *out = NULL;
    int ready = 0;
    MPI_Initialized(&ready);
    if (!ready) {
        if (err && errlen) al_fmt(err, errlen, "alloy_comm_from_mpi: MPI is not initialized (MPI_Init first)");
        return ALLOY_ERR_INVALID;
    }
    return wrap(MPI_Comm_f2c((MPI_Fint)handle), out, err, errlen);
}

int alloy_comm_rank(const alloy_comm *c) { return c ? c->rank : -1; }
int alloy_comm_size(const alloy_comm *c) { return c ? c->size : -1; }
int alloy_comm_local_rank(const alloy_comm *c) { return c ? c->local_rank : -1; }

void alloy_comm_free(alloy_comm *c)
{
    if (!c) return;
    MPI_Comm_free(&c->comm);
    al_free(c);
    if (alloy_initialized && initialized_by_alloy > 0 && --initialized_by_alloy == 0) {
        int done = 0;
        MPI_Finalized(&done);
        if (!done) MPI_Finalize();
        alloy_initialized = false;
    }
}

void comm_configure(alloy_comm *c, double timeout_s, bool ordered)
{
    if (c) c->timeout_s = timeout_s, c->ordered = ordered;
}

double comm_timeout_s(const alloy_comm *c) { return c ? c->timeout_s : 0; }

/* Elements per MPI call (its counts are int). */
#define CHUNK ((int64_t)1 << 30)

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Waits for req until c's timeout (*late then). */
static int wait_until_timeout(alloy_comm *c, MPI_Request req, bool *late)
{
    int rc;
    double deadline = now_s() + c->timeout_s;
    for (long spins = 0;; spins++) {
        int done = 0;
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || done) return rc;
        if (now_s() > deadline) { /* the request cannot be taken back: the caller must stop using c */
            *late = true;
            return MPI_SUCCESS;
        }
        if (spins > 1000) nanosleep(&(struct timespec){0, 20000}, NULL); /* a peer is slow: yield the core */
    }
}

/* Elements per call of the ordered sum, whose all-gather holds size times as many. */
#define ORDERED_CHUNK ((int64_t)1 << 22)

/* buf[0..n) = the sum over the ranks in rank order, ((x0 + x1) + x2) + ...,
 * in t's own arithmetic: every rank's values gathered, then added from the
 * left, so the bits do not depend on MPI's algorithm or the world size. */
static int ordered_sum(alloy_comm *c, void *buf, int n, MPI_Datatype t, size_t es, bool *late)
{
    char *all = al_malloc((size_t)n * es * (size_t)c->size + 1);
    if (!all) return MPI_ERR_NO_MEM;
    int rc;
    if (c->timeout_s <= 0) {
        rc = MPI_Allgather(buf, n, t, all, n, t, c->comm);
    } else {
        MPI_Request req;
        rc = MPI_Iallgather(buf, n, t, all, n, t, c->comm, &req);
        if (rc == MPI_SUCCESS) rc = wait_until_timeout(c, req, late);
    }
    if (rc == MPI_SUCCESS && !*late) {
#define ORDERED(T)                                                                             for (int i = 0; i < n; i++) {                                                                  T s = ((const T *)all)[i];                                                                 for (int r = 1; r < c->size; r++) s = (T)(s + ((const T *)all)[(size_t)r * (size_t)n + (size_t)i]);         ((T *)buf)[i] = s;                                                                     }
        if (t == MPI_FLOAT) ORDERED(float)
        else if (t == MPI_DOUBLE) ORDERED(double)
        else if (t == MPI_INT32_T) ORDERED(int32_t)
        else if (t == MPI_INT64_T) ORDERED(int64_t)
        else ORDERED(uint8_t)
#undef ORDERED
    }
    al_free(all);
    return rc;
}

/* MPI's all-reduce of n elements of type t (es bytes each) in place, within
 * c's timeout; sums in rank order where c asks for it. */
static int reduce_in_place(alloy_comm *c, void *buf, int n, MPI_Datatype t, size_t es, MPI_Op op, bool *late)
{
    *late = false;
    if (c->ordered && op == MPI_SUM && c->size > 2) { /* two ranks: one addition, already in any order */
        int rc = MPI_SUCCESS;
        for (int at = 0; at < n && rc == MPI_SUCCESS && !*late; at += (int)ORDERED_CHUNK) {
            int k = n - at < (int)ORDERED_CHUNK ? n - at : (int)ORDERED_CHUNK;
            rc = ordered_sum(c, (char *)buf + (size_t)at * es, k, t, es, late);
        }
        return rc;
    }
    if (c->timeout_s <= 0) return MPI_Allreduce(MPI_IN_PLACE, buf, n, t, op, c->comm);
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, op, c->comm, &req);
    return rc != MPI_SUCCESS ? rc : wait_until_timeout(c, req, late);
}

alloy_status comm_all_gather_u64(alloy_comm *c, const uint64_t *v, int n, uint64_t *all, const char *what,
                                 char *err, size_t errlen)
{
    bool late = false;
    int rc;
    if (c->timeout_s <= 0) {
        rc = MPI_Allgather(v, n, MPI_UINT64_T, all, n, MPI_UINT64_T, c->comm);
    } else {
        MPI_Request req;
        rc = MPI_Iallgather(v, n, MPI_UINT64_T, all, n, MPI_UINT64_T, c->comm, &req);
        if (rc == MPI_SUCCESS) rc = wait_until_timeout(c, req, &late);
    }
    if (late) {
        if (err && errlen)
            al_fmt(err, errlen, "%s: the all-gather did not finish within %g s on rank %d of %d", what, c->timeout_s,
                   c->rank, c->size);
        return ALLOY_ERR_IO;
    }
    if (rc != MPI_SUCCESS) {
        char where[256];
        al_fmt(where, sizeof where, "%s: all-gather on rank %d of %d", what, c->rank, c->size);
        return mpi_fail(rc, where, err, errlen);
    }
    return ALLOY_OK;
}

alloy_status comm_broadcast(alloy_comm *c, void *buf, size_t bytes, const char *what, char *err, size_t errlen)
{
    int rc = MPI_SUCCESS;
    bool late = false;
    for (size_t at = 0; at < bytes && rc == MPI_SUCCESS && !late; at += (size_t)CHUNK) {
        int n = (int)(bytes - at < (size_t)CHUNK ? bytes - at : (size_t)CHUNK);
        if (c->timeout_s <= 0) {
            rc = MPI_Bcast((char *)buf + at, n, MPI_BYTE, 0, c->comm);
        } else {
            MPI_Request req;
            rc = MPI_Ibcast((char *)buf + at, n, MPI_BYTE, 0, c->comm, &req);
            if (rc == MPI_SUCCESS) rc = wait_until_timeout(c, req, &late);
        }
    }
    if (late) {
        if (err && errlen)
            al_fmt(err, errlen, "%s: the broadcast of %zu bytes from rank 0 did not finish within %g s on rank %d of %d",
                   what, bytes, c->timeout_s, c->rank, c->size);
        return ALLOY_ERR_IO;
    }
    if (rc != MPI_SUCCESS) {
        char where[256];
        al_fmt(where, sizeof where, "%s: broadcast on rank %d of %d", what, c->rank, c->size);
        return mpi_fail(rc, where, err, errlen);
    }
    return ALLOY_OK;
}


alloy_status comm_all_reduce(alloy_comm *c, void *buf, int64_t count, alloy_dtype dt, comm_reduce op,
                             const char *what, char *err, size_t errlen)
{
    if (!c) {
        if (err && errlen) al_fmt(err, errlen, "%s: no communicator (alloy_graph_set_data_parallel)", what);
        return ALLOY_ERR_INVALID;
    }
    MPI_Op mop = op == COMM_MAX ? MPI_MAX : MPI_SUM;
    MPI_Datatype t;
    size_t es = alloy_dtype_size(dt);
    void *data = buf;
    float *wide = NULL; /* f16/bf16: reduced as f32, rounded once */
    switch (dt) {
    case ALLOY_F32: t = MPI_FLOAT; break;
    case ALLOY_F64: t = MPI_DOUBLE; break;
    case ALLOY_I32: t = MPI_INT32_T; break;
    case ALLOY_I64: t = MPI_INT64_T; break;
    case ALLOY_BOOL: t = MPI_UINT8_T; break;
    case ALLOY_F16:
    case ALLOY_BF16:
        wide = al_malloc((size_t)(count ? count : 1) * sizeof(float));
        if (!wide) {
            if (err && errlen) al_fmt(err, errlen, "%s: out of memory widening %lld elements", what, (long long)count);
            return ALLOY_ERR_OOM;
        }
        for (int64_t i = 0; i < count; i++)
            wide[i] = dt == ALLOY_F16 ? cvt_f16_to_f32(((uint16_t *)buf)[i]) : cvt_bf16_to_f32(((uint16_t *)buf)[i]);
        t = MPI_FLOAT, data = wide, es = sizeof(float);
        break;
    default:
        if (err && errlen) al_fmt(err, errlen, "%s: dtype %s cannot be reduced", what, alloy_dtype_name(dt));
        return ALLOY_ERR_DTYPE;
    }
    int rc = MPI_SUCCESS;
    bool late = false;
    for (int64_t at = 0; at < count && rc == MPI_SUCCESS && !late; at += CHUNK) {
        int64_t n = count - at < CHUNK ? count - at : CHUNK;
        rc = reduce_in_place(c, (char *)data + (size_t)at * es, (int)n, t, es, mop, &late);
    }
    if (wide) {
        for (int64_t i = 0; i < count && rc == MPI_SUCCESS && !late; i++)
            ((uint16_t *)buf)[i] = dt == ALLOY_F16 ? cvt_f32_to_f16(wide[i]) : cvt_f32_to_bf16(wide[i]);
        al_free(wide);
    }
    if (late) {
        if (err && errlen)
            al_fmt(err, errlen, "%s: the all_reduce of %lld %s did not finish within %g s on rank %d of %d (a peer died or skipped it)",
                   what, (long long)count, alloy_dtype_name(dt), c->timeout_s, c->rank, c->size);
        return ALLOY_ERR_IO;
    }
    if (rc != MPI_SUCCESS) {
        char where[256];
        al_fmt(where, sizeof where, "%s: all_reduce on rank %d of %d", what, c->rank, c->size);
        return mpi_fail(rc, where, err, errlen);
    }
    return ALLOY_OK;
}

/* The message for a collective that failed (rc) or ran late; ALLOY_OK when neither. */
static alloy_status collective_result(alloy_comm *c, int rc, bool late, const char *kind, int64_t count, alloy_dtype dt,
                                      const char *what, char *err, size_t errlen)
{
    if (late) {
        if (err && errlen)
            al_fmt(err, errlen, "%s: the %s of %lld %s did not finish within %g s on rank %d of %d (a peer died or skipped it)",
                   what, kind, (long long)count, alloy_dtype_name(dt), c->timeout_s, c->rank, c->size);
        return ALLOY_ERR_IO;
    }
    if (rc != MPI_SUCCESS) {
        char where[256];
        al_fmt(where, sizeof where, "%s: %s on rank %d of %d", what, kind, c->rank, c->size);
        return mpi_fail(rc, where, err, errlen);
    }
    return ALLOY_OK;
}

/* The checks every shard collective makes: a communicator of `world` ranks,
 * a shard MPI can count. */
static alloy_status shard_check(alloy_comm *c, int64_t count, int world, const char *what, char *err, size_t errlen)
{
    if (!c) {
        if (err && errlen) al_fmt(err, errlen, "%s: no communicator (alloy_graph_set_data_parallel)", what);
        return ALLOY_ERR_INVALID;
    }
    if (world != c->size) {
        if (err && errlen)
            al_fmt(err, errlen, "%s: compiled for %d ranks, run on a communicator of %d", what, world, c->size);
        return ALLOY_ERR_INVALID;
    }
    if (count < 0 || count > INT32_MAX / 8) {
        if (err && errlen) al_fmt(err, errlen, "%s: a shard of %lld elements is more than one MPI call moves", what, (long long)count);
        return ALLOY_ERR_UNSUPPORTED;
    }
    return ALLOY_OK;
}

alloy_status comm_reduce_scatter(alloy_comm *c, const void *in, void *out, int64_t count, alloy_dtype dt, int world,
                                 const char *what, char *err, size_t errlen)
{
    alloy_status st = shard_check(c, count, world, what, err, errlen);
    if (st) return st;
    if (dt != ALLOY_F32 && dt != ALLOY_F64) {
        if (err && errlen) al_fmt(err, errlen, "%s: a reduce_scatter of %s (f32 and f64 only)", what, alloy_dtype_name(dt));
        return ALLOY_ERR_DTYPE;
    }
    MPI_Datatype t = dt == ALLOY_F32 ? MPI_FLOAT : MPI_DOUBLE;
    size_t es = alloy_dtype_size(dt);
    int n = (int)count, rc;
    bool late = false;
    if (c->ordered && c->size > 2) { /* every rank's copy of my shard, summed from rank 0 */
        char *all = al_malloc((size_t)n * es * (size_t)c->size + 1);
        if (!all) {
            if (err && errlen) al_fmt(err, errlen, "%s: out of memory for the ordered sum", what);
            return ALLOY_ERR_OOM;
        }
        if (c->timeout_s <= 0) {
            rc = MPI_Alltoall(in, n, t, all, n, t, c->comm);
        } else {
            MPI_Request req;
            rc = MPI_Ialltoall(in, n, t, all, n, t, c->comm, &req);
            if (rc == MPI_SUCCESS) rc = wait_until_timeout(c, req, &late);
        }
        if (rc == MPI_SUCCESS && !late) {
#define ORDERED(T)                                                                            \
    for (int i = 0; i < n; i++) {                                                             \
        T s = ((const T *)all)[i];                                                            \
        for (int r = 1; r < c->size; r++) s = (T)(s + ((const T *)all)[(size_t)r * (size_t)n + (size_t)i]); \
        ((T *)out)[i] = s;                                                                    \
    }
            if (t == MPI_FLOAT) ORDERED(float)
            else ORDERED(double)
#undef ORDERED
        }
        al_free(all);
    } else if (c->timeout_s <= 0) {
        rc = MPI_Reduce_scatter_block(in, out, n, t, MPI_SUM, c->comm);
    } else {
        MPI_Request req;
        rc = MPI_Ireduce_scatter_block(in, out, n, t, MPI_SUM, c->comm, &req);
        if (rc == MPI_SUCCESS) rc = wait_until_timeout(c, req, &late);
    }
    return collective_result(c, rc, late, "reduce_scatter", count, dt, what, err, errlen);
}

alloy_status comm_all_gather(alloy_comm *c, const void *in, void *out, int64_t count, alloy_dtype dt, int world,
                             const char *what, char *err, size_t errlen)
{
    alloy_status st = shard_check(c, count, world, what, err, errlen);
    if (st) return st;
    int bytes = (int)(count * (int64_t)alloy_dtype_size(dt)), rc;
    bool late = false;
    if (c->timeout_s <= 0) {
        rc = MPI_Allgather(in, bytes, MPI_BYTE, out, bytes, MPI_BYTE, c->comm);
    } else {
        MPI_Request req;
        rc = MPI_Iallgather(in, bytes, MPI_BYTE, out, bytes, MPI_BYTE, c->comm, &req);
        if (rc == MPI_SUCCESS) rc = wait_until_timeout(c, req, &late);
    }
    return collective_result(c, rc, late, "all_gather", count, dt, what, err, errlen);
}

#else /* built without MPI */

static alloy_status no_mpi(const char *what, char *err, size_t errlen)
{
    if (err && errlen)
        al_fmt(err, errlen, "%s: alloy was built without MPI (install libopenmpi-dev and configure with -Dmpi=enabled)", what);
    return ALLOY_ERR_UNSUPPORTED;
}

bool alloy_have_mpi(void) { return false; }

alloy_status alloy_comm_world(alloy_comm **out, char *err, size_t errlen)
{
    if (out) *out = NULL;
    return no_mpi("alloy_comm_world", err, errlen);
}

alloy_status alloy_comm_from_mpi_handle(int64_t handle, alloy_comm **out, char *err, size_t errlen)
{
    (void)handle;
    if (out) *out = NULL;
    return no_mpi("alloy_comm_from_mpi", err, errlen);
}

int alloy_comm_rank(const alloy_comm *c) { return c ? 0 : -1; }
int alloy_comm_size(const alloy_comm *c) { return c ? 1 : -1; }
int alloy_comm_local_rank(const alloy_comm *c) { return c ? 0 : -1; }
void alloy_comm_free(alloy_comm *c) { (void)c; }
void comm_configure(alloy_comm *c, double timeout_s, bool ordered) { (void)c, (void)timeout_s, (void)ordered; }
double comm_timeout_s(const alloy_comm *c) { (void)c; return 0; }

alloy_status comm_all_reduce(alloy_comm *c, void *buf, int64_t count, alloy_dtype dt, comm_reduce op,
                             const char *what, char *err, size_t errlen)
{
    (void)c, (void)buf, (void)count, (void)dt, (void)op;
    return no_mpi(what, err, errlen);
}

alloy_status comm_broadcast(alloy_comm *c, void *buf, size_t bytes, const char *what, char *err, size_t errlen)
{
    (void)c, (void)buf, (void)bytes;
    return no_mpi(what, err, errlen);
}

alloy_status comm_all_gather_u64(alloy_comm *c, const uint64_t *v, int n, uint64_t *all, const char *what,
                                 char *err, size_t errlen)
{
    (void)c, (void)v, (void)n, (void)all;
    return no_mpi(what, err, errlen);
}

alloy_status comm_reduce_scatter(alloy_comm *c, const void *in, void *out, int64_t count, alloy_dtype dt, int world,
                                 const char *what, char *err, size_t errlen)
{
    (void)c, (void)in, (void)out, (void)count, (void)dt, (void)world;
    return no_mpi(what, err, errlen);
}

alloy_status comm_all_gather(alloy_comm *c, const void *in, void *out, int64_t count, alloy_dtype dt, int world,
                             const char *what, char *err, size_t errlen)
{
    (void)c, (void)in, (void)out, (void)count, (void)dt, (void)world;
    return no_mpi(what, err, errlen);
}

#endif
