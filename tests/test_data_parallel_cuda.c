/* test_data_parallel_cuda.c - data-parallel training on the CUDA backend over NCCL, under mpirun -np 2, on the emulated device and the emulated NCCL: two ranks equal one CUDA process accumulating both halves, bit for bit; an inf on one rank skips on both; NCCL's failures are clean errors.
 *
 * Run by tests/run_data_parallel_cuda.sh as `mpirun -np 2
 * test_data_parallel_cuda` with ALLOY_NCCL naming the emulated NCCL
 * (tests/cuda_emu/emu_nccl.c, MPI underneath). Every graph runs on the
 * CUDA backend over the host emulation of the device
 * (tests/cuda_emu/emu_device.c). Each rank trains the data-parallel graph
 * on its half of every batch; rank 0 also trains a reference graph with
 * accumulation_steps = 2 fed both halves in rank order and compares its
 * state with it after every step, bit for bit (one reference keeps the
 * emulated kernels' compiles few), and the ranks compare their states
 * with each other (a hash); step 3 has an f16 inf in one of rank 1's rows
 * only. The collectives run in the step's captured CUDA
 * graph from the second run on. Then the failures: NCCL missing (the
 * nccl option naming no library), the communicator refused
 * (ALLOY_EMU_NCCL_FAIL=init), and an asynchronous error in a collective
 * (=async) each return an error naming the step. All ranks exit with the
 * total failure count's verdict.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/alloy.h"
#include "cuda_emu/emu_device.h"
#include "cuda_emu/emu_loader.h"
#include "runtime/backend.h"

enum { R = 4, W = 2, IN = 12, H = 24, OUT = 4, STEPS = 6, INJECT = 3 };

static int rank, failures;
static int first_device = -2; /* the cuda_device the first CUDA backend opened with */

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})

static void fail(const char *what, int step, const char *detail)
{
    fprintf(stderr, "rank %d: FAIL %s (step %d): %s\n", rank, what, step, detail);
    failures++;
}

static bool ok(alloy_graph *g, alloy_status st, const char *what, int step)
{
    if (!st) return true;
    fail(what, step, alloy_last_error(g));
    return false;
}

/* The emulated device, recording which GPU the backend was asked for. */
static alloy_status opener(const al_options *cfg, rt_backend **out, char *err, size_t errlen)
{
    if (first_device == -2) first_device = cfg->cuda_device;
    return emu_backend_opener(cfg, out, err, errlen);
}

/* A two-layer MLP classifier, f16 AMP with the dynamic scaler, AdamW with clipping, on the CUDA backend. */
static alloy_graph *mlp(const char *name, int accumulate, uint64_t seed)
{
    alloy_graph *g = alloy_graph_new(name);
    alloy_graph_set_seed(g, seed);
    alloy_graph_set_option(g, "device", "cuda");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(R, IN));
    alloy_tensor *t = alloy_input(g, "targets", ALLOY_I32, 1, DIMS(R));
    alloy_tensor *w1 = alloy_param(g, "w1", ALLOY_F32, 2, DIMS(IN, H), alloy_init_kaiming_uniform(sqrt(2.0)));
    alloy_tensor *b1 = alloy_param(g, "b1", ALLOY_F32, 1, DIMS(H), alloy_init_uniform(-0.1, 0.1));
    alloy_tensor *w2 = alloy_param(g, "w2", ALLOY_F32, 2, DIMS(H, OUT), alloy_init_xavier_uniform(1.0));
    alloy_tensor *b2 = alloy_param(g, "b2", ALLOY_F32, 1, DIMS(OUT), alloy_init_uniform(-0.1, 0.1));
    alloy_tensor *h = alloy_relu(g, alloy_add(g, alloy_matmul(g, x, w1, false, false), b1));
    alloy_tensor *logits = alloy_add(g, alloy_matmul(g, h, w2, false, false), b2);
    alloy_tensor *loss = alloy_set_name(g, alloy_cross_entropy(g, logits, t), "loss");
    alloy_output(g, "loss", loss);
    alloy_graph_set_loss(g, loss);
    alloy_graph_enable_amp(g, ALLOY_F16);
    alloy_grad_scaler sc = alloy_dynamic_scaler();
    sc.init_scale = 0x1p12, sc.growth_interval = 2; /* grows within the run */
    alloy_graph_set_grad_scaler(g, sc);
    alloy_optimizer o = alloy_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01);
    o.clip_norm = 1.0;
    o.accumulation_steps = accumulate;
    alloy_graph_add_optimizer(g, o);
    return g;
}

/* Batch `step` (all R * W rows): inputs with a class signal, from a fixed LCG. */
static void batch_of(int step, float *x, int32_t *t)
{
    uint32_t s = 0x9e3779b9u * (uint32_t)(step + 1);
    for (int i = 0; i < R * W; i++) {
        t[i] = (int32_t)((uint32_t)(i * 7 + step) % OUT);
        for (int j = 0; j < IN; j++) {
            s = s * 1664525u + 1013904223u;
            x[i * IN + j] = (float)((double)(s >> 8) / 16777216.0 - 0.5) + (j % OUT == t[i] ? 1.0f : 0.0f);
        }
    }
}

static alloy_status run_rows(alloy_graph *g, const float *x, const int32_t *t, alloy_step_info *info)
{
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {R, IN}, (void *)x}, {"targets", ALLOY_I32, 1, {R}, (void *)t}};
    alloy_status st = alloy_graph_run(g, feeds, 2, NULL, 0);
    return st ? st : alloy_graph_step_info(g, info);
}

/* FNV-1a over every state tensor's bytes; and every tensor equal to ref's of the same name (ref NULL: none). */
static uint64_t compare_state(alloy_graph *dp, alloy_graph *ref, int step)
{
    uint64_t h = 1469598103934665603ull;
    int n = alloy_graph_state_count(dp);
    if (n < 8) fail("state", step, "fewer than 8 state tensors (parameters, moments, scaler)");
    for (int i = 0; i < n; i++) {
        alloy_host_tensor a, b;
        if (!ok(dp, alloy_graph_state_at(dp, i, &a), "state_at", step)) continue;
        size_t bytes = (size_t)alloy_host_tensor_numel(&a) * alloy_dtype_size(a.dtype);
        for (size_t k = 0; k < bytes; k++) h = (h ^ ((const uint8_t *)a.data)[k]) * 1099511628211ull;
        if (!ref) continue;
        if (alloy_graph_get_state(ref, a.name, &b)) {
            fail("state", step, a.name);
            continue;
        }
        if (alloy_host_tensor_numel(&a) != alloy_host_tensor_numel(&b) || memcmp(a.data, b.data, bytes))
            fail("state differs from the accumulating process", step, a.name);
    }
    return h;
}

static void train_case(alloy_comm *comm)
{
    alloy_graph *dp = mlp("dp", 1, 11 + 1000 * (uint64_t)rank), *ref = rank == 0 ? mlp("ref", W, 11) : NULL;
    alloy_data_parallel opt = {.timeout_s = 60};
    ok(dp, alloy_graph_set_data_parallel(dp, comm, &opt), "set_data_parallel", -1);
    float x[W * R * IN];
    int32_t t[W * R];
    emu_device_stats before = emu_totals();
    for (int step = 0; step < STEPS; step++) {
        batch_of(step, x, t);
        if (step == INJECT) x[(R + 1) * IN + 3] = 70000.0f; /* rank 1's second row: inf in f16 */
        alloy_step_info di, ri[W];
        if (!ok(dp, run_rows(dp, x + rank * R * IN, t + rank * R, &di), "the data-parallel step", step)) break;
        bool ran = true;
        for (int r = 0; r < W && ran && ref; r++)
            ran = ok(ref, run_rows(ref, x + r * R * IN, t + r * R, &ri[r]), "the reference", step);
        if (!ran) break;
        if (!ref) { /* rank 1: the reference's losses and skip decision from rank 0 */
            double v[5];
            MPI_Bcast(v, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            ri[0].loss = v[0], ri[1].loss = v[1], ri[1].scale = v[2], ri[1].next_scale = v[3], ri[1].skipped = v[4] != 0;
        } else {
            double v[5] = {ri[0].loss, ri[1].loss, ri[1].scale, ri[1].next_scale, ri[1].skipped};
            MPI_Bcast(v, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        }
        float mean = ((float)ri[0].loss + (float)ri[1].loss) * 0.5f, got = (float)di.loss;
        if (memcmp(&got, &mean, sizeof got) && !(isnan(got) && isnan(mean))) {
            char v[96];
            snprintf(v, sizeof v, "%.9g, expected %.9g", di.loss, (double)mean);
            fail("loss", step, v);
        }
        if (di.skipped != ri[1].skipped || di.scale != ri[1].scale || di.next_scale != ri[1].next_scale)
            fail("skip or scale", step, "differs from the accumulating process");
        if ((step == INJECT) != di.skipped)
            fail("skip", step, step == INJECT ? "the inf on rank 1 did not skip the step" : "a finite step was skipped");
        if (step == INJECT && di.next_scale != di.scale / 2) fail("scale", step, "the skip did not halve the scale");
        uint64_t hash = compare_state(dp, ref, step), lo = hash, hi = hash;
        MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
        if (lo != hi) fail("state", step, "the ranks' states differ");
        if (rank == 0)
            printf("step %d: loss %.6f scale %g next %g skipped %d\n", step, di.loss, di.scale, di.next_scale, di.skipped);
    }
    emu_device_stats after = emu_totals();
    const char *dev = alloy_graph_device(dp);
    if (!dev || !strstr(dev, "cuda")) fail("device", -1, dev ? dev : "(none)");
    if (first_device != rank) {
        char v[64];
        snprintf(v, sizeof v, "the backend opened cuda_device %d, not the local rank %d", first_device, rank);
        fail("device", -1, v);
    }
    if (after.replays - before.replays < (ref ? 2 * STEPS - 1 : 0) + STEPS - 1 || after.host_calls - before.host_calls < 3 * STEPS)
        fail("collectives", -1, "fewer replays or NCCL calls than steps: the collectives did not run in the CUDA graph");
    if (rank == 0)
        printf("%d steps on %s: %ld captures, %ld replays, %ld NCCL calls on the stream (rank 0)\n", STEPS, dev,
               after.captures - before.captures, after.replays - before.replays, after.host_calls - before.host_calls);
    alloy_graph_free(dp);
    if (ref) alloy_graph_free(ref);
}

/* One data-parallel step that must fail with an error holding every one of want[] (NULL-ended). */
static void failure_case(alloy_comm *comm, const char *what, const char *nccl, const char *inject, int at,
                         const char *const *want)
{
    alloy_graph *g = mlp("dp", 1, 11);
    if (nccl) alloy_graph_set_option(g, "nccl", nccl);
    alloy_data_parallel opt = {.timeout_s = 30};
    ok(g, alloy_graph_set_data_parallel(g, comm, &opt), "set_data_parallel", -1);
    float x[W * R * IN];
    int32_t t[W * R];
    alloy_status st = ALLOY_OK;
    alloy_step_info info;
    for (int step = 0; step < 3 && !st; step++) { /* from the second run on, the step is a captured graph */
        if (inject && step == at) setenv("ALLOY_EMU_NCCL_FAIL", inject, 1);
        batch_of(step, x, t);
        st = run_rows(g, x + rank * R * IN, t + rank * R, &info);
    }
    const char *msg = alloy_last_error(g);
    if (!st) fail(what, -1, "the step ran");
    for (int i = 0; st && want[i]; i++)
        if (!strstr(msg, want[i])) {
            char v[1200];
            snprintf(v, sizeof v, "the error lacks \"%s\": %s", want[i], msg);
            fail(what, -1, v);
        }
    if (rank == 0 && st) printf("%s: status %d: %s\n", what, (int)st, msg);
    unsetenv("ALLOY_EMU_NCCL_FAIL");
    alloy_graph_free(g);
    MPI_Barrier(MPI_COMM_WORLD);
}

int main(void)
{
    alloy_comm *comm;
    char err[512];
    if (alloy_comm_world(&comm, err, sizeof err)) {
        fprintf(stderr, "FAIL: %s\n", err);
        return 1;
    }
    rank = alloy_comm_rank(comm);
    if (alloy_comm_size(comm) != W) {
        if (rank == 0) fprintf(stderr, "FAIL: run under mpirun -np %d\n", W);
        alloy_comm_free(comm);
        return 1;
    }
    char why[256];
    if (!emu_available(why, sizeof why)) { /* every rank sees the same compiler */
        if (rank == 0) printf("skipped: no host emulation: %s\n", why);
        alloy_comm_free(comm);
        return 77;
    }
    rt_backend_set_cuda_opener(opener);
    train_case(comm);
    failure_case(comm, "no NCCL", "/nonexistent/libnccl.so.2", NULL, 0, (const char *const[]){"step ", "(collective, all_reduce %", "/nonexistent/libnccl.so.2", NULL});
    failure_case(comm, "communicator refused", NULL, "init", 0,
                 (const char *const[]){"step ", "(collective, all_reduce %", "making the NCCL communicator (rank ",
                                       "no CUDA-capable device", NULL});
    failure_case(comm, "a peer's failure", NULL, "async", 2,
                 (const char *const[]){"(collective, all_reduce %", "peer rank", "aborted", NULL});
    int total = failures;
    MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%s: %d failures over %d ranks\n", total ? "FAIL" : "ok", total, W);
    rt_backend_set_cuda_opener(NULL);
    alloy_comm_free(comm);
    return total ? 1 : 0;
}
