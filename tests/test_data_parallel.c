/* test_data_parallel.c - data-parallel training under mpirun -np 2 or 3: W ranks on R rows each equal one process accumulating the W slices, bit for bit; an inf on one rank skips on every rank; a dead peer is an error within the timeout.
 *
 * Run by tests/run_data_parallel.sh as `mpirun -np W test_data_parallel`.
 * Each rank trains the data-parallel graph (R rows, its slice of every
 * batch of R * W) and, beside it, a single-process reference graph with
 * accumulation_steps = W fed the slices in rank order; the ranks build
 * their graphs from different seeds, so the parameters are rank 0's only
 * when alloy broadcasts them. Over 2 ranks MPI's sum is one addition; over
 * 3 the test asks for ordered_sum (rank order). After every step each rank
 * compares every state tensor of its data-parallel graph with the
 * reference's (the same name) and the reported loss with the mean of the
 * reference's micro-batch losses, bit for bit; the ranks then compare
 * their state with one another (a hash, all-reduced by MIN and MAX). Every
 * rank makes the same collectives whatever fails, and all exit with the
 * total failure count's verdict (0 when none). With the argument
 * `dead-peer` it runs dead_peer_case alone; with `killed-peer` the same
 * with rank 1 killed instead (mpirun then ends the job non-zero, sometimes
 * before rank 0's timeout).
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloy/alloy.h"
#include "alloy/mpi.h"
#include "runtime/comm/comm.h"
#include "runtime/graph/graph_impl.h"

/* R rows per rank, at most MAXW ranks: a batch of R * world rows */
enum { R = 4, MAXW = 4, IN = 12, H = 24, OUT = 4, STEPS = 12 };

static int rank, world, failures;

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})

static void fail(const char *fmt, const char *a, int step, const char *b)
{
    fprintf(stderr, "rank %d: FAIL step %d: ", rank, step);
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    failures++;
}

static bool ok(alloy_graph *g, alloy_status st, const char *what)
{
    if (!st) return true;
    fprintf(stderr, "rank %d: FAIL %s: %s\n", rank, what, alloy_last_error(g));
    failures++;
    return false;
}

/* A two-layer MLP classifier over a batch of `batch` rows. */
static alloy_graph *mlp(const char *name, int batch, bool amp, const alloy_optimizer *o, uint64_t seed)
{
    alloy_graph *g = alloy_graph_new(name);
    alloy_graph_set_seed(g, seed);
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(batch, IN));
    alloy_tensor *t = alloy_input(g, "targets", ALLOY_I32, 1, DIMS(batch));
    alloy_tensor *w1 = alloy_param(g, "w1", ALLOY_F32, 2, DIMS(IN, H), alloy_init_kaiming_uniform(sqrt(2.0)));
    alloy_tensor *b1 = alloy_param(g, "b1", ALLOY_F32, 1, DIMS(H), alloy_init_uniform(-0.1, 0.1));
    alloy_tensor *w2 = alloy_param(g, "w2", ALLOY_F32, 2, DIMS(H, OUT), alloy_init_xavier_uniform(1.0));
    alloy_tensor *b2 = alloy_param(g, "b2", ALLOY_F32, 1, DIMS(OUT), alloy_init_uniform(-0.1, 0.1));
    alloy_tensor *h = alloy_relu(g, alloy_add(g, alloy_matmul(g, x, w1, false, false), b1));
    alloy_tensor *logits = alloy_add(g, alloy_matmul(g, h, w2, false, false), b2);
    alloy_tensor *loss = alloy_set_name(g, alloy_cross_entropy(g, logits, t), "loss");
    alloy_output(g, "loss", loss);
    alloy_graph_set_loss(g, loss);
    if (amp) {
        alloy_graph_enable_amp(g, ALLOY_F16);
        alloy_grad_scaler sc = alloy_dynamic_scaler();
        sc.init_scale = 0x1p12, sc.growth_interval = 4; /* grows within the run */
        alloy_graph_set_grad_scaler(g, sc);
    }
    alloy_graph_add_optimizer(g, *o);
    return g;
}

/* Batch `step` (all R * world rows): inputs with a class signal, from a fixed LCG. */
static void batch_of(int step, float *x, int32_t *t)
{
    uint32_t s = 0x9e3779b9u * (uint32_t)(step + 1);
    for (int i = 0; i < R * world; i++) {
        t[i] = (int32_t)((uint32_t)(i * 7 + step) % OUT);
        for (int j = 0; j < IN; j++) {
            s = s * 1664525u + 1013904223u;
            x[i * IN + j] = (float)((double)(s >> 8) / 16777216.0 - 0.5) + (j % OUT == t[i] ? 1.0f : 0.0f);
        }
    }
}

static bool run_rows(alloy_graph *g, const float *x, const int32_t *t, alloy_step_info *info, const char *what)
{
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {R, IN}, (void *)x}, {"targets", ALLOY_I32, 1, {R}, (void *)t}};
    return ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), what) && ok(g, alloy_graph_step_info(g, info), what);
}

/* FNV-1a over every state tensor's bytes, in state order, but for ZeRO-1's
 * shards (the tensors whose size differs from ref's), which differ by rank. */
static uint64_t state_hash(alloy_graph *g, alloy_graph *ref)
{
    uint64_t h = 1469598103934665603ull;
    int n = alloy_graph_state_count(g);
    for (int i = 0; i < n; i++) {
        alloy_host_tensor s, r;
        if (alloy_graph_state_at(g, i, &s) || alloy_graph_get_state(ref, s.name, &r) ||
            alloy_host_tensor_numel(&s) != alloy_host_tensor_numel(&r))
            continue;
        size_t bytes = (size_t)alloy_host_tensor_numel(&s) * alloy_dtype_size(s.dtype);
        for (size_t k = 0; k < bytes; k++) h = (h ^ ((const uint8_t *)s.data)[k]) * 1099511628211ull;
    }
    return h;
}

/* 0: state must equal the reference's bit for bit; else the relative
 * difference allowed (no case needs one today) */
static double tolerance;

static bool same_f32(float a, float b)
{
    if (!memcmp(&a, &b, sizeof a)) return true;
    return tolerance > 0 && fabs((double)a - (double)b) <= tolerance * fmax(fabs((double)a), fabs((double)b));
}

/* Whether a (n elements) is this rank's ZeRO-1 shard of b (m elements):
 * elements [rank s, (rank+1) s) of b padded with zeros, s = ceil(m / world). */
static bool is_shard_of(const alloy_host_tensor *a, const alloy_host_tensor *b)
{
    int64_t n = alloy_host_tensor_numel(a), m = alloy_host_tensor_numel(b), s = (m + world - 1) / world;
    if (n != s || a->dtype != ALLOY_F32 || b->dtype != ALLOY_F32) return false;
    for (int64_t i = 0; i < s; i++) {
        int64_t j = rank * s + i;
        float want = j < m ? ((const float *)b->data)[j] : 0.0f;
        if (!same_f32(((const float *)a->data)[i], want)) return false;
    }
    return true;
}

/* Every state tensor of dp equals the reference's of the same name, bit for
 * bit (a ZeRO-1 moment: this rank's shard of the reference's). */
static void compare_state(alloy_graph *dp, alloy_graph *ref, int step, const char *what)
{
    int n = alloy_graph_state_count(dp);
    if (n < 4) fail("%s: only %d state tensors", what, step, "");
    for (int i = 0; i < n; i++) {
        alloy_host_tensor a, b;
        if (!ok(dp, alloy_graph_state_at(dp, i, &a), what)) return;
        if (alloy_graph_get_state(ref, a.name, &b)) {
            fail("%s: the reference has no state %s", what, step, a.name);
            continue;
        }
        size_t bytes = (size_t)alloy_host_tensor_numel(&a) * alloy_dtype_size(a.dtype);
        bool same = alloy_host_tensor_numel(&a) == alloy_host_tensor_numel(&b) && !memcmp(a.data, b.data, bytes);
        if (!same && tolerance > 0 && a.dtype == ALLOY_F32 && alloy_host_tensor_numel(&a) == alloy_host_tensor_numel(&b)) {
            same = true;
            for (int64_t k = 0; k < alloy_host_tensor_numel(&a); k++)
                same &= same_f32(((const float *)a.data)[k], ((const float *)b.data)[k]);
        }
        if (alloy_host_tensor_numel(&a) != alloy_host_tensor_numel(&b) ? !is_shard_of(&a, &b) : !same)
            fail("%s: state %s differs from the accumulating process", what, step, a.name);
    }
}

/* STEPS steps of optimizer o (AMP or not); inject_step >= 0: that step's
 * batch has 70000 (inf in f16) in one of rank 1's rows only. bucket_bytes
 * 0: the default (one bucket). The data-parallel graph has a seed of its
 * own on each rank (11 on rank 0, the reference's): its parameters must
 * come from rank 0. state_first: its state is made before
 * set_data_parallel (which broadcasts it then), else at the first run. */
static void train_case(const char *what, bool amp, alloy_optimizer o, size_t bucket_bytes, int inject_step,
                       bool state_first, int zero, alloy_comm *comm)
{
    alloy_graph *dp = mlp("dp", R, amp, &o, 11 + 1000 * (uint64_t)rank);
    alloy_optimizer acc = o;
    acc.accumulation_steps = world;
    alloy_graph *ref = mlp("ref", R, amp, &acc, 11);
    /* two ranks: MPI's sum is one addition; more: summed in rank order, as the accumulation adds */
    alloy_data_parallel opt = {.bucket_bytes = bucket_bytes, .zero_stage = zero, .timeout_s = 120, .ordered_sum = world > 2};
    if (state_first && alloy_graph_state_count(dp) < 4) fail("%s: %s", what, -1, "no state before set_data_parallel");
    ok(dp, alloy_graph_set_data_parallel(dp, comm, &opt), "set_data_parallel");
    float x[MAXW * R * IN];
    int32_t t[MAXW * R];
    int skipped = 0;
    for (int step = 0; step < STEPS; step++) {
        batch_of(step, x, t);
        if (step == inject_step) x[(R + 1) * IN + 3] = 70000.0f; /* rank 1's second row */
        alloy_step_info di, ri[MAXW];
        double scale_before = 0;
        if (amp) {
            alloy_host_tensor s;
            if (!alloy_graph_get_state(dp, "scaler.scale", &s)) scale_before = *(const float *)s.data;
        }
        if (!run_rows(dp, x + rank * R * IN, t + rank * R, &di, what)) break;
        bool ran = true;
        for (int r = 0; r < world && ran; r++) ran = run_rows(ref, x + r * R * IN, t + r * R, &ri[r], what);
        if (!ran) break;
        alloy_step_info last = ri[world - 1];
        for (int r = 0; r < world; r++)
            if (ri[r].updated != (r == world - 1 && !last.skipped))
                fail("%s: %s", what, step, "the reference did not update on its last micro-batch alone");
        /* the reported loss: the mean over the ranks, in f32 as the graph sums it (in rank order) */
        float mean = (float)ri[0].loss, got = (float)di.loss;
        for (int r = 1; r < world; r++) mean += (float)ri[r].loss;
        mean *= (float)(1.0 / world);
        if (memcmp(&got, &mean, sizeof got) && !(isnan(got) && isnan(mean))) { /* a NaN loss (the inf step) is any NaN */
            char v[96];
            snprintf(v, sizeof v, "%.9g, expected %.9g", di.loss, (double)mean);
            fail("%s: loss %s", what, step, v);
        }
        if (di.skipped != last.skipped || di.scale != last.scale || di.next_scale != last.next_scale)
            fail("%s: %s", what, step, "skip or scale differs from the accumulating process");
        if (step == inject_step) {
            skipped++;
            if (!di.skipped || di.next_scale != scale_before / 2 || di.scale != scale_before)
                fail("%s: %s", what, step, "the injected inf did not skip the step and halve the scale on this rank");
        } else if (di.skipped) {
            fail("%s: %s", what, step, "a finite step was skipped");
        }
        compare_state(dp, ref, step, what);
        /* and the ranks hold the same state */
        uint64_t h = state_hash(dp, ref), lo = h, hi = h;
        MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
        if (lo != hi) fail("%s: %s", what, step, "the ranks' states differ");
        if (rank == 0 && (step == 0 || step == STEPS - 1))
            printf("%s: step %d loss %.6f scale %g skipped %d\n", what, step, di.loss, di.scale, di.skipped);
    }
    if (inject_step >= 0 && skipped != 1) fail("%s: %s", what, inject_step, "the injected step was not reached");
    /* a bucket's all_reduce runs in place on its concat's buffer (the plan gives both one slot) */
    int buckets = 0;
    for (int i = 0; dp->compiled && i < dp->compiled->nnodes; i++) {
        const ir_node *n = dp->compiled->nodes[i];
        if (n->op != IR_OP_all_reduce || dp->compiled->nodes[n->in[0]]->op != IR_OP_concat) continue;
        buckets++;
        if (dp->comp.plan.offset[i] < 0 || dp->comp.plan.offset[i] != dp->comp.plan.offset[n->in[0]])
            fail("%s: %s", what, -1, "a bucket's all_reduce is not in place on its concat");
    }
    if (!zero && buckets < (bucket_bytes ? 2 : 1)) fail("%s: %s", what, -1, "fewer buckets of several gradients than expected");
    /* a bucket's concat gathers its gradients where the backward wrote them:
     * each flattened gradient (a reshape view of the gradient) lies in the
     * concat's slot at its offset, and the concat runs no kernel */
    int gathers = 0;
    for (int i = 0; dp->compiled && i < dp->compiled->nnodes; i++) {
        const ir_node *n = dp->compiled->nodes[i];
        const schedule *sc = &dp->comp.sched;
        if (n->op != IR_OP_concat || sc->member_of[i] < 0 || !(sc->members[sc->member_of[i]].flags & MEMBER_VIEW)) continue;
        gathers++;
        int64_t at = 0;
        for (int k = 0; k < n->nin; k++) {
            int in = n->in[k];
            if (dp->comp.plan.offset[in] != dp->comp.plan.offset[i] + at || dp->comp.plan.view_of[in] != i)
                fail("%s: %s", what, -1, "a gathered gradient is not at its offset in the bucket's slot");
            at += (int64_t)ir_nbytes(&dp->compiled->nodes[in]->type);
        }
    }
    if (rank == 0) printf("%s: %d bucket concats of %d gather in place\n", what, gathers, buckets);
    if (!zero && buckets && !gathers) fail("%s: %s", what, -1, "no bucket concat gathers its gradients in place");
    /* a gradient sliced out of its bucket is a view start * element bytes
     * into the all_reduce's slot (no copy) when that is 16-byte aligned */
    int slices = 0, views = 0;
    for (int i = 0; dp->compiled && i < dp->compiled->nnodes; i++) {
        const ir_node *n = dp->compiled->nodes[i];
        int r = n->op == IR_OP_slice ? n->in[0] : -1;
        if (r < 0 || dp->compiled->nodes[r]->op != IR_OP_all_reduce) continue;
        const mem_plan *pl = &dp->comp.plan;
        int64_t delta = ir_attr_i(n, "start") * (int64_t)alloy_dtype_size(n->type.dtype);
        bool view = pl->view_of && pl->view_of[i] == r;
        slices++, views += view;
        if (view != (delta % 16 == 0) || (view && pl->offset[i] != pl->offset[r] + delta))
            fail("%s: %s", what, -1, "a gradient sliced out of its bucket is not a view at its byte offset");
    }
    if (rank == 0) printf("%s: %d gradients sliced out of buckets, %d of them views\n", what, slices, views);
    if (!zero && buckets && !views) fail("%s: %s", what, -1, "no gradient is a view of its bucket");
    if (amp) { /* the compiled step agrees found_inf by MAX: the flag an all_reduce {reduce="max"} of found_inf */
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (f) alloy_graph_dump(dp, f, ALLOY_DUMP_IR), fclose(f);
        const char *fi = text ? strstr(text, " = found_inf(") : NULL;
        char want[64] = "";
        if (fi) { /* "  %N = found_inf(...)": the max must read %N */
            const char *start = fi;
            while (start > text && start[-1] != '%') start--;
            snprintf(want, sizeof want, "all_reduce(%%%.*s) {reduce=\"max\"}", (int)(fi - start), start);
        }
        if (!fi || !strstr(text, want)) fail("%s: %s", what, -1, "no all_reduce {reduce=\"max\"} of found_inf in the compiled IR");
        free(text);
        /* the DOT picture and the memory picture draw the all_reduce nodes */
        static const alloy_dump_kind pictures[] = {ALLOY_DUMP_DOT, ALLOY_DUMP_MEMORY_SVG};
        for (int k = 0; k < 2; k++) {
            text = NULL, len = 0;
            f = open_memstream(&text, &len);
            alloy_status st = f ? alloy_graph_dump(dp, f, pictures[k]) : ALLOY_ERR_OOM;
            if (f) fclose(f);
            if (st || !text || !strstr(text, "all_reduce"))
                fail("%s: %s", what, -1, k ? "the memory picture lacks the all_reduce" : "the DOT picture lacks the all_reduce");
            free(text);
        }
    }
    alloy_graph_free(dp);
    alloy_graph_free(ref);
}

/* ZeRO-1 keeps each rank's shard of the moments: AdamW's state is 412
 * parameters, 2 moments of them, and the scaler's and counters' scalars;
 * under ZeRO-1 each moment holds sum ceil(n / world) = 206 (2 ranks) or 138
 * (3 ranks) elements, so the state is 2 * 4 * (412 - that) bytes smaller. */
static void zero_memory_case(alloy_comm *comm)
{
    alloy_optimizer o = alloy_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01);
    alloy_memory_info info[2];
    for (int zero = 0; zero <= 1; zero++) {
        alloy_graph *g = mlp("dp", R, true, &o, 11);
        alloy_data_parallel opt = {.zero_stage = zero, .timeout_s = 120, .ordered_sum = world > 2};
        ok(g, alloy_graph_set_data_parallel(g, comm, &opt), "set_data_parallel");
        ok(g, alloy_graph_memory_info(g, &info[zero]), "memory_info");
        /* the cost model's collectives, hand-worked: W = 2: the bucket of 1648 bytes 2 (1/2) 1648, found_inf
         * 1, the loss 4; ZeRO-1: reduce_scatter and all_gather (1/2) of 1152, 96, 384, 16 each (824 each way),
         * found_inf 1, the norm's f64 8, the loss 4. W = 3 (int64 truncation): 2197 + 1 + 5; ZeRO-1 with b2
         * padded to 24 bytes: (2/3) of 1152, 96, 384, 24 (1104 each way) + 1 + 10 + 5 */
        alloy_cost_totals ct;
        static const int want_n[2] = {3, 11};
        static const double want_link[2][2] = {{1653, 2203}, {1661, 2224}};
        if (ok(g, alloy_graph_cost(g, NULL, &ct, NULL), "cost") && world <= 3 &&
            (ct.collectives != want_n[zero] || ct.link_bytes != want_link[zero][world - 2])) {
            fprintf(stderr, "rank %d: FAIL cost (ZeRO %d): %d collectives sending %.0f bytes, expected %d and %.0f\n", rank,
                    zero, ct.collectives, ct.link_bytes, want_n[zero], want_link[zero][world - 2]);
            failures++;
        } else if (rank == 0) {
            printf("cost model, ZeRO %d: %d collectives, %.0f bytes sent a rank, %.3f - %.3f ms on the H100\n", zero,
                   ct.collectives, ct.link_bytes, ct.ms_low, ct.ms_high);
        }
        alloy_graph_free(g);
    }
    size_t shard = world == 2 ? 206 : world == 3 ? 138 : 103, want = 2 * 4 * (412 - shard);
    if (info[0].state_bytes - info[1].state_bytes != want) {
        fprintf(stderr, "rank %d: FAIL ZeRO-1 state %zu bytes, without %zu: expected %zu fewer\n", rank,
                info[1].state_bytes, info[0].state_bytes, want);
        failures++;
    } else if (rank == 0) {
        printf("ZeRO-1 memory: state %zu bytes a rank, %zu without ZeRO (the moments %zu of 412 elements)\n",
               info[1].state_bytes, info[0].state_bytes, shard);
    }
}

/* ordered_sum adds in rank order, whatever MPI's algorithm: over 3 ranks
 * element 0 is 1, 2^-24, 2^-24 and element 1 is 2^-24, 2^-24, 1; from the
 * left the first sum is 1 (each half-ulp ties to even) and the second
 * 1 + 2^-23, and any other grouping changes one of them. */
static void ordered_sum_case(alloy_comm *comm)
{
    if (world != 3) return;
    const float tiny = 0x1p-24f;
    float want[2] = {1.0f, 1.0f + 0x1p-23f};
    for (int ordered = 0; ordered <= 1; ordered++) {
        float v[2] = {rank == 0 ? 1.0f : tiny, rank == 2 ? 1.0f : tiny};
        char err[512];
        comm_configure(comm, 120, ordered);
        if (comm_all_reduce(comm, v, 2, ALLOY_F32, COMM_SUM, "ordered sum", err, sizeof err)) {
            fprintf(stderr, "rank %d: FAIL %s\n", rank, err);
            failures++;
        } else if (ordered && memcmp(v, want, sizeof v)) {
            fprintf(stderr, "rank %d: FAIL ordered sum gave %a %a, expected %a %a\n", rank, v[0], v[1], want[0], want[1]);
            failures++;
        } else if (rank == 0) {
            printf("sum over 3 ranks, %s: %a %a\n", ordered ? "ordered" : "MPI's order", v[0], v[1]);
        }
    }
    /* the same sums as each rank's shard of a reduce_scatter (ordered: an all-to-all, then rank order), and
     * an all_gather of the ranks' shards back: every rank's shard in rank order */
    float in[3 * 2], shard[2], all[3 * 2];
    for (int r = 0; r < 3; r++) in[2 * r] = rank == 0 ? 1.0f : tiny, in[2 * r + 1] = rank == 2 ? 1.0f : tiny;
    char err[512];
    comm_configure(comm, 120, true);
    if (comm_reduce_scatter(comm, in, shard, 2, ALLOY_F32, 3, "ordered reduce_scatter", err, sizeof err) ||
        comm_all_gather(comm, shard, all, 2, ALLOY_F32, 3, "all_gather", err, sizeof err)) {
        fprintf(stderr, "rank %d: FAIL %s\n", rank, err);
        failures++;
    } else {
        for (int r = 0; r < 3; r++)
            if (memcmp(&all[2 * r], want, sizeof want)) {
                fprintf(stderr, "rank %d: FAIL ordered reduce_scatter + all_gather gave %a %a for rank %d, expected %a %a\n",
                        rank, all[2 * r], all[2 * r + 1], r, want[0], want[1]);
                failures++;
            }
        if (rank == 0) printf("reduce_scatter over 3 ranks, ordered, and all_gather: %a %a on every rank\n", all[0], all[1]);
    }
    if (!comm_all_gather(comm, shard, all, 2, ALLOY_F32, 2, "all_gather", err, sizeof err) || !strstr(err, "compiled for 2 ranks")) {
        fprintf(stderr, "rank %d: FAIL an all_gather for 2 ranks on 3: '%s'\n", rank, err);
        failures++;
    }
    /* a large buffer (MPI picks another algorithm by size): how many of its sums MPI's order changes */
    enum { N = 1 << 20 };
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    if (!a || !b) {
        free(a), free(b);
        return;
    }
    uint32_t s = 12345u + 777u * (uint32_t)rank;
    for (int i = 0; i < N; i++) s = s * 1664525u + 1013904223u, a[i] = b[i] = (float)((double)(s >> 8) / 16777216.0 - 0.5);
    comm_configure(comm, 120, false);
    alloy_status st = comm_all_reduce(comm, a, N, ALLOY_F32, COMM_SUM, "MPI's order", err, sizeof err);
    comm_configure(comm, 120, true);
    if (!st) st = comm_all_reduce(comm, b, N, ALLOY_F32, COMM_SUM, "ordered", err, sizeof err);
    long differ = 0;
    for (int i = 0; i < N && !st; i++) differ += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    if (rank == 0 && !st) printf("sum over 3 ranks of %d f32: MPI's order differs from rank order in %ld\n", N, differ);
    free(a), free(b);
}

/* The state of a and b, every tensor of a found in b with the same bytes. */
static bool same_state(alloy_graph *a, alloy_graph *b)
{
    int n = alloy_graph_state_count(a);
    for (int i = 0; i < n; i++) {
        alloy_host_tensor x, y;
        if (alloy_graph_state_at(a, i, &x) || alloy_graph_get_state(b, x.name, &y)) return false;
        size_t bytes = (size_t)alloy_host_tensor_numel(&x) * alloy_dtype_size(x.dtype);
        if (alloy_host_tensor_numel(&x) != alloy_host_tensor_numel(&y) || memcmp(x.data, y.data, bytes)) return false;
    }
    return n > 0 && n == alloy_graph_state_count(b);
}

/* Checkpoints: rank 0 saves a data-parallel graph's state after 3 steps;
 * a single-process graph (no accumulation) loads it on every rank and
 * holds the same bits; a fresh data-parallel graph (another seed) loads
 * it on every rank and its next 3 steps equal the original's, bit for bit
 * (losses and state). */
static void checkpoint_case(alloy_comm *comm)
{
    const char *what = "checkpoint";
    char path[64];
    snprintf(path, sizeof path, "dp_checkpoint_%d.safetensors", world);
    alloy_optimizer o = alloy_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01);
    alloy_graph *a = mlp("dp", R, true, &o, 11), *single = mlp("single", R, true, &o, 5);
    alloy_graph *resumed = mlp("dp", R, true, &o, 23 + (uint64_t)rank);
    alloy_data_parallel opt = {.timeout_s = 120, .ordered_sum = world > 2};
    ok(a, alloy_graph_set_data_parallel(a, comm, &opt), "set_data_parallel");
    ok(resumed, alloy_graph_set_data_parallel(resumed, comm, &opt), "set_data_parallel");
    float x[MAXW * R * IN];
    int32_t t[MAXW * R];
    alloy_step_info ia, ib;
    for (int step = 0; step < 3; step++) {
        batch_of(100 + step, x, t);
        if (!run_rows(a, x + rank * R * IN, t + rank * R, &ia, what)) break;
    }
    if (rank == 0) ok(a, alloy_graph_save_checkpoint(a, path), "save_checkpoint");
    MPI_Barrier(MPI_COMM_WORLD);
    if (ok(single, alloy_graph_load_checkpoint(single, path), "a single process loads the ranks' checkpoint") &&
        !same_state(a, single))
        fail("%s: %s", what, 3, "the single process's state differs from the ranks'");
    if (ok(resumed, alloy_graph_load_checkpoint(resumed, path), "the ranks load the checkpoint") && !same_state(a, resumed))
        fail("%s: %s", what, 3, "the resumed ranks' state differs");
    for (int step = 3; step < 6; step++) {
        batch_of(100 + step, x, t);
        if (!run_rows(a, x + rank * R * IN, t + rank * R, &ia, what) ||
            !run_rows(resumed, x + rank * R * IN, t + rank * R, &ib, what))
            break;
        if (memcmp(&ia.loss, &ib.loss, sizeof ia.loss) || !same_state(a, resumed))
            fail("%s: %s", what, step, "the resumed run differs from the uninterrupted one");
    }
    if (rank == 0) {
        printf("checkpoint: saved by rank 0 after 3 steps, loaded by one process and by %d fresh ranks; step 6 loss %.6f\n",
               world, ia.loss);
        remove(path);
    }
    alloy_graph_free(a), alloy_graph_free(single), alloy_graph_free(resumed);
}

/* One step of the ZeRO-1 ranks (dp, its slice) and of the accumulating
 * process (ref, every slice in rank order): the loss the ranks report is
 * the mean of ref's micro-batch losses and the state is ref's (shards of
 * it), bit for bit. */
static void zero_step_pair(alloy_graph *dp, alloy_graph *ref, int step, const char *what)
{
    float x[MAXW * R * IN];
    int32_t t[MAXW * R];
    alloy_step_info di, ri;
    batch_of(200 + step, x, t);
    if (!run_rows(dp, x + rank * R * IN, t + rank * R, &di, what)) return;
    float mean = 0;
    for (int r = 0; r < world; r++) {
        if (!run_rows(ref, x + r * R * IN, t + r * R, &ri, what)) return;
        mean = r ? mean + (float)ri.loss : (float)ri.loss;
    }
    mean *= (float)(1.0 / world);
    float got = (float)di.loss;
    if (memcmp(&got, &mean, sizeof got)) fail("%s: %s", what, step, "the loss differs from the accumulating process's");
    compare_state(dp, ref, step, what);
}

/* Checkpoints and ZeRO-1 across world sizes (AdamW, f16 AMP, the dynamic
 * scaler): (1) the ranks train 3 steps and save (every rank calls, the
 * shards are gathered, rank 0 writes a single process's layout); one
 * process accumulating `world` micro-batches loads it, holds the ranks'
 * parameters and their moments whole, and its next 3 steps give the ranks'
 * losses and state, bit for bit. (2) one accumulating process trains 3
 * steps and saves; fresh ZeRO-1 ranks (another seed) load it (each takes its
 * shard) and their next 3 steps give the process's losses and state. */
static void zero_checkpoint_case(alloy_comm *comm)
{
    const char *what = "ZeRO-1 checkpoint";
    char path[64];
    snprintf(path, sizeof path, "dp_zero_checkpoint_%d.safetensors", world);
    alloy_optimizer o = alloy_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01), acc = o;
    acc.accumulation_steps = world;
    alloy_data_parallel opt = {.zero_stage = 1, .timeout_s = 120, .ordered_sum = world > 2};
    for (int dir = 0; dir < 2; dir++) {
        alloy_graph *dp = mlp("dp", R, true, &o, 11 + 1000 * (uint64_t)rank), *ref = mlp("ref", R, true, &acc, 11);
        ok(dp, alloy_graph_set_data_parallel(dp, comm, &opt), "set_data_parallel");
        for (int step = 0; step < 3; step++) zero_step_pair(dp, ref, step, what); /* the same start */
        alloy_graph *saver = dir == 0 ? dp : ref, *fresh;
        if (dir == 0 || rank == 0) ok(saver, alloy_graph_save_checkpoint(saver, path), "save_checkpoint");
        MPI_Barrier(MPI_COMM_WORLD);
        if (dir == 0) { /* a fresh accumulating process takes the ranks' place */
            fresh = mlp("ref", R, true, &acc, 5);
            ok(fresh, alloy_graph_load_checkpoint(fresh, path), "one process loads the ZeRO-1 ranks' checkpoint");
            compare_state(dp, fresh, 3, "ZeRO-1 checkpoint: the loaded process");
            for (int step = 3; step < 6; step++) zero_step_pair(dp, fresh, step, what);
        } else { /* fresh ZeRO-1 ranks take the process's place */
            fresh = mlp("dp", R, true, &o, 23 + (uint64_t)rank);
            ok(fresh, alloy_graph_set_data_parallel(fresh, comm, &opt), "set_data_parallel");
            ok(fresh, alloy_graph_load_checkpoint(fresh, path), "ZeRO-1 ranks load one process's checkpoint");
            compare_state(fresh, ref, 3, "ZeRO-1 checkpoint: the loaded ranks");
            for (int step = 3; step < 6; step++) zero_step_pair(fresh, ref, step, what);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) {
            printf("%s: %s after 3 steps, resumed %s, 3 more steps equal\n", what,
                   dir == 0 ? "saved by the ranks" : "saved by one process", dir == 0 ? "by one process" : "on the ranks");
            remove(path);
        }
        alloy_graph_free(dp), alloy_graph_free(ref), alloy_graph_free(fresh);
    }
}

/* A training step with dropout on its input, the kept values fetched as "dropped". */
static alloy_graph *dropout_step(uint64_t seed)
{
    alloy_graph *g = alloy_graph_new("dropout");
    alloy_graph_set_seed(g, seed);
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(R, IN));
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 2, DIMS(IN, 1), alloy_init_uniform(-0.1, 0.1));
    alloy_tensor *d = alloy_set_name(g, alloy_dropout(g, x, 0.5), "dropped");
    alloy_tensor *loss = alloy_reduce_sum(g, alloy_matmul(g, d, w, false, false), 0, NULL, false);
    alloy_graph_set_loss(g, loss);
    alloy_graph_add_optimizer(g, alloy_sgd(0.01, 0, 0, false));
    return g;
}

/* Dropout is keyed by rank: fed the same input, the ranks drop different
 * elements, and rank 0 drops what a single process with the same seed does. */
static void dropout_case(alloy_comm *comm)
{
    alloy_graph *dp = dropout_step(7), *single = dropout_step(7);
    ok(dp, alloy_graph_set_data_parallel(dp, comm, &(alloy_data_parallel){.timeout_s = 120}), "set_data_parallel");
    float x[R * IN];
    for (int i = 0; i < R * IN; i++) x[i] = 1.0f + (float)i;
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {R, IN}, x}, a = {.name = "dropped"}, b = {.name = "dropped"};
    if (!ok(dp, alloy_graph_run(dp, &feed, 1, &a, 1), "dropout") || !ok(single, alloy_graph_run(single, &feed, 1, &b, 1), "dropout"))
        return;
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < sizeof x; k++) h = (h ^ ((const uint8_t *)a.data)[k]) * 1099511628211ull;
    uint64_t lo = h, hi = h;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (lo == hi) fail("%s: %s", "dropout", 0, "every rank dropped the same elements");
    if (rank == 0 && memcmp(a.data, b.data, sizeof x)) fail("%s: %s", "dropout", 0, "rank 0's mask is not a single process's");
    alloy_graph_free(dp), alloy_graph_free(single);
}

/* Ranks whose steps differ fail at their compile, before any collective
 * of the step, with the first differing rank and part named on every rank:
 * rank 1 builds another graph; then another learning rate; then another
 * bucket size. */
static void mismatch_case(alloy_comm *comm)
{
    static const char *const want[] = {"rank 1's built graph", "rank 1's training options",
                                       "rank 1's data-parallel options"};
    for (int k = 0; k < 3; k++) {
        alloy_optimizer o = alloy_sgd(k == 1 && rank == 1 ? 0.06 : 0.05, 0, 0, false);
        alloy_graph *g = k == 0 && rank == 1 ? dropout_step(7) : mlp("dp", R, false, &o, 11);
        alloy_data_parallel opt = {.timeout_s = 120, .bucket_bytes = k == 2 && rank == 1 ? 512 : 0};
        ok(g, alloy_graph_set_data_parallel(g, comm, &opt), "set_data_parallel");
        int n = alloy_graph_state_count(g); /* compiles */
        const char *msg = alloy_last_error(g);
        if (n != 0 || alloy_graph_status(g) != ALLOY_ERR_INVALID || !strstr(msg, want[k]) ||
            !strstr(msg, "differ from rank 0's")) {
            fprintf(stderr, "rank %d: FAIL mismatch %d: got '%s', expected an error naming %s\n", rank, k, msg, want[k]);
            failures++;
        } else if (rank == 0) {
            printf("mismatch %d: %s\n", k, msg);
        }
        alloy_graph_free(g);
    }
}

/* alloy_graph_check_replicas: ranks that took the same steps hold the same
 * state (ZeRO-1's shards left out); one element of w1 changed on rank 1 is
 * named on every rank, with the tensor and the count. */
static void replicas_case(alloy_comm *comm, int zero)
{
    alloy_optimizer o = alloy_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01);
    alloy_graph *g = mlp("dp", R, false, &o, 11 + (uint64_t)rank);
    alloy_data_parallel opt = {.timeout_s = 120, .zero_stage = zero};
    ok(g, alloy_graph_set_data_parallel(g, comm, &opt), "set_data_parallel");
    float x[MAXW * R * IN];
    int32_t t[MAXW * R];
    for (int step = 0; step < 3; step++) {
        batch_of(step * world + rank, x, t);
        alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {R, IN}, x}, {"targets", ALLOY_I32, 1, {R}, t}};
        ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), "run");
    }
    alloy_status st = alloy_graph_check_replicas(g);
    if (st) {
        fprintf(stderr, "rank %d: FAIL replicas (ZeRO %d): equal ranks reported as differing: %s\n", rank, zero,
                alloy_last_error(g));
        failures++;
    }
    alloy_host_tensor w;
    ok(g, alloy_graph_get_state(g, "w1", &w), "get_state");
    size_t bytes = (size_t)alloy_host_tensor_numel(&w) * alloy_dtype_size(w.dtype);
    float *copy = malloc(bytes);
    memcpy(copy, w.data, bytes);
    if (rank == 1) copy[5] += 1.0f;
    w.data = copy;
    ok(g, alloy_graph_set_state(g, &w), "set_state");
    free(copy);
    st = alloy_graph_check_replicas(g);
    const char *msg = alloy_last_error(g);
    if (world > 1 && (st != ALLOY_ERR_INVALID || !strstr(msg, "rank 1's state differs from rank 0's: 'w1' (1 of "))) {
        fprintf(stderr, "rank %d: FAIL replicas (ZeRO %d): got %d '%s', expected rank 1's w1 named\n", rank, zero,
                (int)st, msg);
        failures++;
    } else if (rank == 0) {
        printf("replicas (ZeRO %d): %s\n", zero, msg);
    }
    alloy_graph_free(g);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Every rank compiles the step (the compile's comparison and the state's
 * broadcast are collectives), then rank 1 never runs it: rank 0's first
 * collective does not finish, and with a timeout of 1 s its run returns
 * ALLOY_ERR_IO naming the all_reduce, the rank and the timeout, in about
 * that time (not a hang). Rank 0's request is left behind; the ranks then
 * meet on MPI_COMM_WORLD. */
static void dead_peer_case(alloy_comm *comm, bool killed)
{
    alloy_optimizer o = alloy_sgd(0.05, 0.9, 0, false);
    alloy_graph *dp = mlp("dp", R, false, &o, 11);
    alloy_data_parallel opt = {.timeout_s = 1};
    ok(dp, alloy_graph_set_data_parallel(dp, comm, &opt), "set_data_parallel");
    float x[MAXW * R * IN];
    int32_t t[MAXW * R];
    batch_of(0, x, t);
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {R, IN}, x}, {"targets", ALLOY_I32, 1, {R}, t}};
    ok(dp, alloy_graph_get_state(dp, "w1", &(alloy_host_tensor){0}), "state"); /* compiles: not timed */
    if (rank != 0) {
        if (killed) raise(SIGKILL); /* a rank that dies mid-run */
        alloy_graph_free(dp);
        return;
    }
    double start = now_s();
    alloy_status st = alloy_graph_run(dp, feeds, 2, NULL, 0);
    double took = now_s() - start;
    const char *msg = alloy_last_error(dp);
    printf("dead peer: status %d after %.2f s: %s\n", (int)st, took, msg);
    fflush(stdout); /* before mpirun ends the job for a killed peer */
    char want[96];
    snprintf(want, sizeof want, "did not finish within 1 s on rank 0 of %d", world);
    if (st != ALLOY_ERR_IO || !strstr(msg, "all_reduce") || !strstr(msg, want) ||
        took < 0.9 || took > 10) {
        fprintf(stderr, "rank 0: FAIL dead peer: expected ALLOY_ERR_IO naming the all_reduce within about 1 s\n");
        failures++;
    }
    alloy_graph_free(dp);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    alloy_comm *comm = NULL;
    char err[512] = "";
    if (world < 2 || world > MAXW) {
        if (rank == 0) fprintf(stderr, "test_data_parallel: run me under mpirun -np 2 to %d (world size %d)\n", MAXW, world);
        MPI_Finalize();
        return 1;
    }
    if (alloy_comm_from_mpi(MPI_COMM_WORLD, &comm, err, sizeof err)) {
        fprintf(stderr, "rank %d: FAIL alloy_comm_from_mpi: %s\n", rank, err);
        failures++;
    } else if (alloy_comm_rank(comm) != rank || alloy_comm_size(comm) != world || alloy_comm_local_rank(comm) != rank) {
        fprintf(stderr, "rank %d: FAIL the communicator says rank %d of %d, local rank %d\n", rank,
                alloy_comm_rank(comm), alloy_comm_size(comm), alloy_comm_local_rank(comm));
        failures++;
    }
    if (comm && argc > 1 && (strcmp(argv[1], "dead-peer") == 0 || strcmp(argv[1], "killed-peer") == 0)) {
        dead_peer_case(comm, strcmp(argv[1], "killed-peer") == 0);
    } else if (comm) {
        ordered_sum_case(comm);
        /* f32 SGD with momentum and weight decay, buckets of 256 bytes (several, each of several gradients) */
        train_case("f32 SGD momentum", false, alloy_sgd(0.05, 0.9, 1e-3, false), 256, -1, false, 0, comm);
        /* AdamW with f16 AMP, the dynamic scaler and clipping, one bucket; step 5 has an inf on rank 1 alone */
        alloy_optimizer adamw = alloy_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01);
        adamw.clip_norm = 0.5;
        train_case("f16 AMP AdamW clipped", true, adamw, 0, 5, true, 0, comm);
        /* the same with ZeRO-1: every parameter sharded (412 elements: 206 a rank over 2, 96 + 8 + 32 + 2 over 3,
         * b1's 24 and w2's 96 split evenly by 3, w1's 288 too, b2's 4 padded to 6) */
        alloy_optimizer noclip = adamw;
        noclip.clip_norm = 0;
        train_case("ZeRO-1 f16 AMP AdamW", true, noclip, 0, 5, true, 1, comm);
        /* clipping: the norm of the whole gradients, gathered from the shards */
        train_case("ZeRO-1 f16 AMP AdamW clipped", true, adamw, 0, 5, true, 1, comm);
        train_case("ZeRO-1 f32 SGD momentum", false, alloy_sgd(0.05, 0.9, 1e-3, false), 0, -1, false, 1, comm);
        zero_memory_case(comm);
        checkpoint_case(comm);
        zero_checkpoint_case(comm);
        dropout_case(comm);
        mismatch_case(comm);
        replicas_case(comm, 0);
        replicas_case(comm, 1);
    }
    int total = failures;
    MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%s: %d failure(s) over %d ranks\n", total ? "FAIL" : "ok", total, world);
    alloy_comm_free(comm);
    MPI_Finalize();
    return total ? 1 : 0;
}
