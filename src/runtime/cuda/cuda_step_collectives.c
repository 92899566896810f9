/* cuda_step_collectives.c - a CUDA step's data-parallel collectives: NCCL loaded at build, the communicator made at the first run, the ranks agreeing on CUDA graphs, and the wait for the collectives under the communicator's timeout. */
#include <string.h>
#include <time.h>

#include "runtime/comm/comm.h"
#include "runtime/cuda/cuda_exec.h"

/* "step 17 (collective, all_reduce %32)": the step of collective action i. */
void cu_collective_label(const rt_exec *e, int i, char *out, size_t len)
{
    const lp_action *a = &e->lp.actions[i];
    char label[64];
    const ir_node *n = e->g->nodes[a->index];
    al_fmt(out, len, "step %d (collective, %s %s)", a->step, ir_ops[n->op].name, ir_node_label(n, label, sizeof label));
}

/* The step's collectives counted, and NCCL loaded for them (cfg's nccl)
 * unless the backend has it: a machine or build without NCCL is
 * ALLOY_ERR_UNSUPPORTED naming the first collective's step (device=auto
 * then runs the graph on the CPU, over MPI). */
alloy_status cu_collectives_ready(rt_backend *b, rt_exec *e)
{
    cuda_backend *cb = (cuda_backend *)b;
    e->first_coll = -1;
    char err[512], where[128];
    for (int i = 0; i < e->lp.nactions; i++) {
        if (e->lp.actions[i].kind != LP_COLLECTIVE) continue;
        if (e->ncoll++ == 0) e->first_coll = i;
        if (!cu_coll_has(e->g->nodes[e->lp.actions[i].index]->op)) { /* ZeRO-1's reduce_scatter, all_gather */
            cu_collective_label(e, i, where, sizeof where);
            return rt_fail(b, ALLOY_ERR_UNSUPPORTED, "cuda: %s: not built on the CUDA backend, whose collectives are "
                           "all_reduce only (ZeRO-1 runs on the CPU backend)", where);
        }
    }
    if (!e->ncoll || cb->coll) return ALLOY_OK;
    cu_collective_label(e, e->first_coll, where, sizeof where);
    alloy_status st = cu_coll_open(b->cfg.nccl, &cb->coll, err, sizeof err);
    return st ? rt_fail(b, st, "cuda: %s: %s", where, err) : ALLOY_OK;
}

/* The communicator of the step's collectives over e->comm, made at the
 * first run (collective: every rank's first run makes it), on this
 * device: NCCL's errors name the first collective's step. */
alloy_status cu_connect_collectives(rt_backend *b, rt_exec *e)
{
    cdev *dev = cu_device_of(b);
    char err[768], where[128];
    if (dev->ops->stream) dev->ops->stream(dev); /* the device's context current: NCCL makes the communicator there */
    alloy_status st = cu_coll_connect(((cuda_backend *)b)->coll, e->comm, dev->ordinal, err, sizeof err);
    if (!st) return ALLOY_OK;
    cu_collective_label(e, e->first_coll, where, sizeof where);
    return rt_fail(b, st, "cuda: %s: making the NCCL communicator (rank %d of %d): %s", where,
                   alloy_comm_rank(e->comm), alloy_comm_size(e->comm), err);
}

/* A step with collectives captured into a CUDA graph: NCCL requires every
 * rank to capture (and re-capture) together, and to replay or launch
 * directly alike. Each rank's wish, {launch directly, capture now}, is
 * reduced by MAX over the ranks (one small MPI all-reduce per run), so
 * one rank's reason (a leaf moved, profiling, ALLOY_CUDA_SYNC) decides
 * for all. A rank made to launch directly drops its captured graph, so
 * the next replay is a fresh capture everywhere. */
alloy_status cu_agree_on_graphs(rt_backend *b, rt_exec *e, bool *graphs, bool *capture)
{
    int32_t wish[2] = {!*graphs, *graphs && *capture};
    char err[512];
    alloy_status st = comm_all_reduce(e->comm, wish, 2, ALLOY_I32, COMM_MAX, "the CUDA graph decision", err, sizeof err);
    if (st) return rt_fail(b, st, "cuda: agreeing on the step's CUDA graph: %s", err);
    *graphs = !wish[0];
    *capture = wish[1] != 0;
    if (!*graphs && e->graph) {
        cu_device_of(b)->ops->graph_free(cu_device_of(b), e->graph);
        e->graph = NULL;
    }
    return ALLOY_OK;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The step's collectives queued (all but the update copies after them):
 * waits for the stream while polling NCCL's asynchronous error, until the
 * communicator's timeout, before anything else waits for the stream with
 * no deadline (a download). A peer's failure, or the deadline passed,
 * aborts the communicator (ncclCommAbort) and names the step's
 * collectives. With no timeout, or a device whose stream is done at once
 * (the emulation), it only reads the asynchronous error. */
alloy_status cu_wait_for_collectives(rt_backend *b, rt_exec *e)
{
    cdev *dev = cu_device_of(b);
    double timeout = comm_timeout_s(e->comm);
    if (!dev->ops->query || timeout <= 0) return cu_check_collectives(b, e);
    char what[192], err[768];
    cu_collective_label(e, e->first_coll, what, sizeof what);
    if (e->ncoll > 1) al_fmt(what + strlen(what), sizeof what - strlen(what), " and %d more collectives", e->ncoll - 1);
    double deadline = now_s() + timeout;
    for (long spins = 0;; spins++) {
        bool done = false;
        alloy_status st = dev->ops->query(dev, &done);
        if (st) return cu_dev_fail(b, st, "the step");
        if (done) return ALLOY_OK;
        if ((st = cu_coll_check(((cuda_backend *)b)->coll, what, err, sizeof err))) return rt_fail(b, st, "cuda: %s", err);
        if (now_s() > deadline) {
            cu_coll_abort(((cuda_backend *)b)->coll);
            return rt_fail(b, ALLOY_ERR_IO, "cuda: %s: did not finish within %g s on rank %d of %d (a peer died or "
                           "skipped it); the NCCL communicator was aborted", what, timeout, alloy_comm_rank(e->comm),
                           alloy_comm_size(e->comm));
        }
        if (spins > 100) nanosleep(&(struct timespec){0, 50000}, NULL);
    }
}

/* NCCL's asynchronous error after the step, naming its collectives. */
alloy_status cu_check_collectives(rt_backend *b, rt_exec *e)
{
    char what[192], err[768];
    cu_collective_label(e, e->first_coll, what, sizeof what);
    alloy_status st = cu_coll_check(((cuda_backend *)b)->coll, what, err, sizeof err);
    return st ? rt_fail(b, st, "cuda: %s", err) : ALLOY_OK;
}
