/* test_cuda.c - the CUDA backend against the CPU backend: whole training steps (fp32, f16 AMP, bf16 AMP; an MLP, a transformer block, a CNN whose convolutions head gemm groups), skipped steps, attention alone (the tensor-core kernel), captured graphs against direct launches, checkpoints across devices, GEMM layouts. Every test runs on the host emulation of the device (tests/cuda_emu/emu_device.c) and, where this machine has an NVIDIA GPU, on the GPU; without one the GPU tests SKIP with the reason. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/alloy.h"
#include "alloy_config.h"
#include "base/convert.h"
#include "cuda_emu/emu_device.h"
#include "cuda_emu/emu_loader.h"
#include "models.h"
#include "runtime/backend.h"
#include "runtime/graph/bundle_save.h"
#include "runtime/graph/graph_impl.h"
#if ALLOY_HAVE_CUDA
#include "runtime/cuda/driver.h"
#endif
#include "support.h"

/* Which device a test runs its CUDA side on. */
typedef enum target { ON_EMULATION, ON_GPU } target;

/* Why the GPU cannot run here ("" when it can), found once. */
static char gpu_missing[768];
static bool gpu_checked;

static bool gpu_available(void)
{
    if (!gpu_checked) {
        gpu_checked = true;
        rt_backend_set_cuda_opener(NULL);
        al_options o;
        opt_init(&o);
        o.device = OPT_DEVICE_CUDA;
        rt_backend *b;
        if (rt_backend_open(&o, &b, gpu_missing, sizeof gpu_missing) == ALLOY_OK) {
            gpu_missing[0] = '\0';
            rt_backend_close(b);
        } else if (!gpu_missing[0]) {
            snprintf(gpu_missing, sizeof gpu_missing, "the CUDA backend did not open");
        }
    }
    return !gpu_missing[0];
}

/* Puts the CUDA backend on t's device for the graphs built next; skips the
 * test when t is not available here. */
static void use_target(target t)
{
    char why[512];
    if (t == ON_GPU) {
        if (!gpu_available()) {
            print_message("SKIP: no GPU: %s\n", gpu_missing);
            skip();
        }
        rt_backend_set_cuda_opener(NULL);
        return;
    }
    if (!emu_available(why, sizeof why)) {
        print_message("SKIP: no host emulation of the device: %s\n", why);
        skip();
    }
    rt_backend_set_cuda_opener(emu_backend_opener);
}

/* ---- models and data ---- */

enum { MLP_BATCH = 16, MLP_IN = 12, MLP_HIDDEN = 32, MLP_OUT = 10 };

/* The MLP training step on device ("cpu" or "cuda") with AMP in amp (F32:
 * off), AdamW, and for f16 the dynamic loss scaler. */
static alloy_graph *mlp_step(const char *device, alloy_dtype amp, bool cuda_graph)
{
    alloy_graph *g = alloy_graph_new("mlp");
    alloy_graph_set_seed(g, 11);
    test_mlp m = build_mlp(g, F32, MLP_BATCH, MLP_IN, MLP_HIDDEN, MLP_OUT);
    expect_ok(g, alloy_graph_set_loss(g, m.loss), "set_loss");
    if (amp != F32) expect_ok(g, alloy_graph_enable_amp(g, amp), "enable_amp");
    if (amp == F16) expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01)), "add_optimizer");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    if (!cuda_graph) expect_ok(g, alloy_graph_set_option(g, "cuda_graph", "0"), "cuda_graph");
    return g;
}

/* The transformer block's training step (pre-norm attention, GELU MLP, head). */
static alloy_graph *block_step(const char *device, alloy_dtype amp)
{
    alloy_graph *g = alloy_graph_new("block");
    alloy_graph_set_seed(g, 5);
    test_block m = build_transformer_block(g, F32, 2, 8, 24, 16, 2);
    expect_ok(g, alloy_graph_set_loss(g, m.loss), "set_loss");
    if (amp != F32) expect_ok(g, alloy_graph_enable_amp(g, amp), "enable_amp");
    if (amp == F16) expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_adamw(3e-3, 0.9, 0.95, 1e-8, 0.1)), "add_optimizer");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    return g;
}

enum { CNN_BATCH = 8 };

/* The small CNN's training step (tests/models.c: two convolutions, each the
 * head of a gemm group with its bias, relu, pools, a linear head), as
 * mlp_step. */
static alloy_graph *cnn_step(const char *device, alloy_dtype amp)
{
    alloy_graph *g = alloy_graph_new("cnn");
    alloy_graph_set_seed(g, 7);
    test_cnn m = build_cnn(g, F32, CNN_BATCH, 6, 8);
    expect_ok(g, alloy_graph_set_loss(g, m.loss), "set_loss");
    if (amp != F32) expect_ok(g, alloy_graph_enable_amp(g, amp), "enable_amp");
    if (amp == F16) expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01)), "add_optimizer");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    return g;
}

/* One batch: x uniform in [-scale, scale), targets below classes. */
typedef struct batch {
    float x[MLP_BATCH * MLP_IN];
    int32_t targets[MLP_BATCH];
    int32_t tokens[16], block_targets[16];
    float images[CNN_BATCH * 64];
} batch;

static batch make_batch(uint64_t seed, double scale)
{
    batch b;
    test_rng = seed;
    for (int i = 0; i < MLP_BATCH * MLP_IN; i++) b.x[i] = (float)test_uniform(-scale, scale);
    for (int i = 0; i < MLP_BATCH; i++) b.targets[i] = test_irand(0, MLP_OUT - 1);
    for (int i = 0; i < 16; i++) b.tokens[i] = test_irand(0, 23), b.block_targets[i] = test_irand(0, 23);
    for (int i = 0; i < CNN_BATCH * 64; i++) b.images[i] = (float)test_uniform(-scale, scale);
    return b;
}

static alloy_step_info run_cnn(alloy_graph *g, batch *b)
{
    alloy_host_tensor feeds[2] = {
        {.name = "x", .dtype = F32, .rank = 4, .dims = {CNN_BATCH, 1, 8, 8}, .data = b->images},
        {.name = "targets", .dtype = I32, .rank = 1, .dims = {CNN_BATCH}, .data = b->targets},
    };
    expect_ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), "run");
    alloy_step_info info;
    expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
    return info;
}

/* One step of the mlp on batch b, fetching fetches[0..nfetches). */
static alloy_step_info run_mlp_fetching(alloy_graph *g, batch *b, alloy_host_tensor *fetches, int nfetches)
{
    alloy_host_tensor feeds[2] = {
        {.name = "x", .dtype = F32, .rank = 2, .dims = {MLP_BATCH, MLP_IN}, .data = b->x},
        {.name = "targets", .dtype = I32, .rank = 1, .dims = {MLP_BATCH}, .data = b->targets},
    };
    expect_ok(g, alloy_graph_run(g, feeds, 2, fetches, nfetches), "run");
    alloy_step_info info;
    expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
    return info;
}

static alloy_step_info run_mlp(alloy_graph *g, batch *b)
{
    alloy_host_tensor feeds[2] = {
        {.name = "x", .dtype = F32, .rank = 2, .dims = {MLP_BATCH, MLP_IN}, .data = b->x},
        {.name = "targets", .dtype = I32, .rank = 1, .dims = {MLP_BATCH}, .data = b->targets},
    };
    expect_ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), "run");
    alloy_step_info info;
    expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
    return info;
}

static alloy_step_info run_block(alloy_graph *g, batch *b)
{
    alloy_host_tensor feeds[2] = {
        {.name = "tokens", .dtype = I32, .rank = 2, .dims = {2, 8}, .data = b->tokens},
        {.name = "targets", .dtype = I32, .rank = 1, .dims = {16}, .data = b->block_targets},
    };
    expect_ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), "run");
    alloy_step_info info;
    expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
    return info;
}

/* The unit roundoff of dt (half an ulp at 1): 2^-11 for f16, 2^-8 for bf16, 2^-24 for f32. */
static double unit_roundoff(alloy_dtype dt)
{
    return dt == F16 ? 0x1p-11 : dt == BF16 ? 0x1p-8 : dt == F64 ? 0x1p-53 : 0x1p-24;
}

/* How far a value may drift from the CPU's through a chain of `depth` ops whose longest sum has
 * `terms` terms, relative to the largest magnitude involved, with values stored in amp's dtype.
 * Per op, the two sides differ by at most: each side's rounding of the stored result (2u, u the
 * stored dtype's unit roundoff: a rounding that falls the other way moves one unit); the sum in
 * another order, f32 with each add at most 2u32 off (2 n u32 of the sum of magnitudes: n u32 is
 * the bound for any order of an n-term sum, doubled for tensor cores, which truncate); CUDA's
 * math at 2 ulp (4 u32; CUDA C++ Programming Guide, Mathematical Functions) against the CPU's
 * within 1. The chain adds them: depth * (2u + 2 n u32 + 4 u32). */
static double chain_bound(int depth, int terms, alloy_dtype amp)
{
    const double u32 = 0x1p-24;
    return depth * (2 * unit_roundoff(amp == F64 ? F32 : amp) + 2.0 * terms * u32 + 4 * u32);
}

/* How far a training step's loss (relative) and state (relative to each tensor's largest
 * magnitude) may drift from the CPU's: the chain from a parameter through the forward, the loss,
 * the backward and the update is at most 10 ops deep in these models, and their longest sums are
 * MLP 32 terms (the hidden GEMM; the bias gradients sum 16 rows), the block 64 (its MLP's hidden
 * width 4 x 16) and the CNN 512 (b1's and w1's gradients: 8 images x 8 x 8 positions). AdamW's
 * moments are averages of the gradients, so they differ by at most what one step's gradients do,
 * and the parameters move by lr m / sqrt(v): over s steps at most 2 s lr of that relative
 * difference, under it for s lr <= 0.5 (20 steps at 1e-2). The bound does not grow with steps
 * (short of a gradient whose sign is within its rounding, which Adam turns into a whole step).
 * mlp fp32 4.2e-5, f16 9.8e-3, bf16 7.8e-2; block fp32 8.0e-5; cnn fp32 6.1e-4. */
enum { CHAIN_DEPTH = 10 };
static const int model_terms[] = {32, 64, 512}; /* MLP, BLOCK, CNN: the longest sum */

/* Largest difference between every state tensor of a and b relative to the
 * tensor's largest magnitude (NaN against a number: inf). */
static double state_distance(alloy_graph *a, alloy_graph *b, char *worst_name, size_t len)
{
    double worst = 0;
    int n = alloy_graph_state_count(a);
    assert_int_equal(n, alloy_graph_state_count(b));
    for (int i = 0; i < n; i++) {
        alloy_host_tensor ta, tb;
        expect_ok(a, alloy_graph_state_at(a, i, &ta), "state_at");
        expect_ok(b, alloy_graph_get_state(b, ta.name, &tb), ta.name);
        int64_t count = alloy_host_tensor_numel(&ta);
        double scale = 0, diff = 0;
        for (int64_t k = 0; k < count; k++) scale = fmax(scale, fabs(test_decode(ta.dtype, ta.data, k)));
        for (int64_t k = 0; k < count; k++) {
            double x = test_decode(ta.dtype, ta.data, k), y = test_decode(tb.dtype, tb.data, k);
            double d = isnan(x) != isnan(y) ? INFINITY : isnan(x) ? 0 : fabs(x - y) / (scale > 0 ? scale : 1);
            diff = fmax(diff, d);
        }
        if (diff > worst) {
            worst = diff;
            snprintf(worst_name, len, "%s", ta.name);
        }
    }
    return worst;
}

/* ---- training steps against the CPU ---- */

/* Which model a training test runs. */
typedef enum model { MLP, BLOCK, CNN } model;
static const char *const model_names[] = {"mlp", "transformer block", "cnn"};

static alloy_graph *model_step(model md, const char *device, alloy_dtype amp)
{
    return md == BLOCK ? block_step(device, amp) : md == CNN ? cnn_step(device, amp) : mlp_step(device, amp, true);
}

static alloy_step_info run_model(model md, alloy_graph *g, batch *b)
{
    return md == BLOCK ? run_block(g, b) : md == CNN ? run_cnn(g, b) : run_mlp(g, b);
}

static double tolerance(model md, alloy_dtype amp) { return chain_bound(CHAIN_DEPTH, model_terms[md], amp); }

/* steps steps of the model on the CPU and on CUDA from the same initial
 * state: the same skip decisions and scales every step, losses and the
 * final state within tolerance(md, amp). */
static void train_against_cpu(target t, model md, alloy_dtype amp, int steps)
{
    use_target(t);
    alloy_graph *cpu = model_step(md, "cpu", amp);
    alloy_graph *gpu = model_step(md, "cuda", amp);
    double worst_loss = 0;
    for (int s = 0; s < steps; s++) {
        batch b = make_batch(100 + (uint64_t)s, 2.0);
        alloy_step_info a = run_model(md, cpu, &b);
        alloy_step_info c = run_model(md, gpu, &b);
        assert_int_equal(a.skipped, c.skipped);
        assert_true(a.scale == c.scale);
        assert_int_equal(a.step, c.step);
        assert_int_equal(a.skipped_steps, c.skipped_steps);
        double rel = fabs(a.loss - c.loss) / fmax(fabs(a.loss), 1e-6);
        if (!(rel <= tolerance(md, amp)))
            fail_msg("step %d: loss %.9g on the CPU, %.9g on CUDA (relative %.3g > %.3g)", s, a.loss, c.loss, rel,
                     tolerance(md, amp));
        worst_loss = fmax(worst_loss, rel);
    }
    char name[128] = "";
    double d = state_distance(cpu, gpu, name, sizeof name);
    print_message("%s %s, %d steps on %s%s: worst loss difference %.3g, worst state difference %.3g (%s); tolerance %.3g; %s\n",
                  model_names[md], amp == F32 ? "fp32" : amp == F16 ? "f16 AMP" : "bf16 AMP", steps,
                  t == ON_GPU ? "the GPU" : "the emulated device", emu_gpu_numerics() ? " (GPU numerics)" : "", worst_loss,
                  d, name, tolerance(md, amp), alloy_graph_device(gpu));
    if (!(d <= tolerance(md, amp))) fail_msg("state '%s' differs by %.3g (> %.3g)", name, d, tolerance(md, amp));
    alloy_graph_free(cpu);
    alloy_graph_free(gpu);
    rt_backend_set_cuda_opener(NULL);
}

static void emu_mlp_fp32(void **state) { (void)state; train_against_cpu(ON_EMULATION, MLP, F32, 6); }
static void emu_mlp_f16(void **state) { (void)state; train_against_cpu(ON_EMULATION, MLP, F16, 6); }
static void emu_mlp_bf16(void **state) { (void)state; train_against_cpu(ON_EMULATION, MLP, BF16, 6); }
static void emu_block_f16(void **state) { (void)state; train_against_cpu(ON_EMULATION, BLOCK, F16, 3); }
static void emu_block_fp32(void **state) { (void)state; train_against_cpu(ON_EMULATION, BLOCK, F32, 2); }
static void emu_cnn_fp32(void **state) { (void)state; train_against_cpu(ON_EMULATION, CNN, F32, 4); }
static void emu_cnn_f16(void **state) { (void)state; train_against_cpu(ON_EMULATION, CNN, F16, 4); }
/* The GPU's comparisons, at its step counts, on the emulated device in the GPU-numerics mode. */
static void num_mlp_fp32(void **state) { (void)state; train_against_cpu(ON_EMULATION, MLP, F32, 20); }
static void num_mlp_f16(void **state) { (void)state; train_against_cpu(ON_EMULATION, MLP, F16, 20); }
static void num_mlp_bf16(void **state) { (void)state; train_against_cpu(ON_EMULATION, MLP, BF16, 20); }
static void num_block_f16(void **state) { (void)state; train_against_cpu(ON_EMULATION, BLOCK, F16, 20); }
static void num_block_bf16(void **state) { (void)state; train_against_cpu(ON_EMULATION, BLOCK, BF16, 20); }
static void num_cnn_fp32(void **state) { (void)state; train_against_cpu(ON_EMULATION, CNN, F32, 20); }
static void num_cnn_f16(void **state) { (void)state; train_against_cpu(ON_EMULATION, CNN, F16, 20); }
static void gpu_cnn_fp32(void **state) { (void)state; train_against_cpu(ON_GPU, CNN, F32, 20); }
static void gpu_cnn_f16(void **state) { (void)state; train_against_cpu(ON_GPU, CNN, F16, 20); }
static void gpu_mlp_fp32(void **state) { (void)state; train_against_cpu(ON_GPU, MLP, F32, 20); }
static void gpu_mlp_f16(void **state) { (void)state; train_against_cpu(ON_GPU, MLP, F16, 20); }
static void gpu_mlp_bf16(void **state) { (void)state; train_against_cpu(ON_GPU, MLP, BF16, 20); }
static void gpu_block_f16(void **state) { (void)state; train_against_cpu(ON_GPU, BLOCK, F16, 20); }
static void gpu_block_bf16(void **state) { (void)state; train_against_cpu(ON_GPU, BLOCK, BF16, 20); }

/* ---- a skipped step ---- */

/* f16 AMP with the dynamic scaler: a batch with values beyond f16's range
 * makes the gradients inf; the step is skipped on CUDA as on the CPU, every
 * parameter and moment keeps its bits, the scale halves, training goes on. */
static void injected_inf_is_skipped(target t)
{
    use_target(t);
    alloy_graph *cpu = mlp_step("cpu", F16, true), *gpu = mlp_step("cuda", F16, true);
    for (int s = 0; s < 3; s++) {
        batch b = make_batch(7 + (uint64_t)s, 1.0);
        run_mlp(cpu, &b);
        run_mlp(gpu, &b);
    }
    snapshot before = take_snapshot(gpu);
    batch huge = make_batch(99, 1e6); /* 1e6 overflows f16 (max 65504) */
    alloy_step_info a = run_mlp(cpu, &huge), c = run_mlp(gpu, &huge);
    assert_true(a.skipped);
    assert_true(c.skipped);
    assert_true(c.next_scale == c.scale / 2 && a.next_scale == c.next_scale);
    assert_int_equal(c.skipped_steps, 1);
    snapshot after = take_snapshot(gpu);
    assert_int_equal(before.n, after.n);
    int compared = 0;
    for (int i = 0; i < before.n; i++) {
        const char *nm = before.names[i]; /* the scaler's state and the counters move; nothing else may */
        if (strncmp(nm, "scaler.", 7) == 0 || strncmp(nm, "optim.", 6) == 0 || strncmp(nm, "step.", 5) == 0) continue;
        assert_string_equal(before.names[i], after.names[i]);
        if (memcmp(before.data[i], after.data[i], before.bytes[i]) != 0)
            fail_msg("'%s' changed across the skipped step", before.names[i]);
        compared++;
    }
    assert_true(compared >= 12); /* w1 b1 w2 b2, each with m and v */
    batch b = make_batch(50, 1.0);
    a = run_mlp(cpu, &b), c = run_mlp(gpu, &b);
    assert_false(c.skipped);
    assert_true(fabs(a.loss - c.loss) <= tolerance(MLP, F16) * fabs(a.loss));
    free_snapshot(&before);
    free_snapshot(&after);
    alloy_graph_free(cpu);
    alloy_graph_free(gpu);
    rt_backend_set_cuda_opener(NULL);
}

static void emu_injected_inf(void **state) { (void)state; injected_inf_is_skipped(ON_EMULATION); }
static void gpu_injected_inf(void **state) { (void)state; injected_inf_is_skipped(ON_GPU); }

/* ---- captured graphs against direct launches ---- */

static void replay_equals_direct(target t)
{
    use_target(t);
    emu_device_stats s0 = emu_totals();
    alloy_graph *graph = mlp_step("cuda", F16, true), *direct = mlp_step("cuda", F16, false);
    for (int s = 0; s < 5; s++) {
        batch b = make_batch(300 + (uint64_t)s, 1.0);
        alloy_step_info a = run_mlp(graph, &b), c = run_mlp(direct, &b);
        assert_true(a.loss == c.loss);
    }
    snapshot x = take_snapshot(graph), y = take_snapshot(direct);
    for (int i = 0; i < x.n; i++) {
        assert_string_equal(x.names[i], y.names[i]);
        if (memcmp(x.data[i], y.data[i], x.bytes[i]) != 0) fail_msg("'%s' differs between replay and launches", x.names[i]);
    }
    if (t == ON_EMULATION) { /* the first run launches, the next four replay one capture */
        emu_device_stats s1 = emu_totals();
        assert_int_equal(s1.captures - s0.captures, 1);
        assert_int_equal(s1.replays - s0.replays, 4);
    }
    free_snapshot(&x);
    free_snapshot(&y);
    alloy_graph_free(graph);
    alloy_graph_free(direct);
    rt_backend_set_cuda_opener(NULL);
}

static void emu_replay(void **state) { (void)state; replay_equals_direct(ON_EMULATION); }
static void gpu_replay(void **state) { (void)state; replay_equals_direct(ON_GPU); }

/* ---- checkpoints across devices ---- */

/* Two steps on `from`, a checkpoint, then two more steps on both `from` and a
 * fresh graph on `to` that loaded it: the same losses within tolerance. */
static void checkpoint_moves(target t, const char *from, const char *to)
{
    use_target(t);
    alloy_graph *a = mlp_step(from, F16, true);
    for (int s = 0; s < 2; s++) {
        batch b = make_batch(500 + (uint64_t)s, 1.0);
        run_mlp(a, &b);
    }
    const char *path = test_tmp_path("step.safetensors");
    expect_ok(a, alloy_graph_save_checkpoint(a, path), "save_checkpoint");
    alloy_graph *b2 = mlp_step(to, F16, true);
    expect_ok(b2, alloy_graph_load_checkpoint(b2, path), "load_checkpoint");
    for (int s = 0; s < 2; s++) {
        batch b = make_batch(600 + (uint64_t)s, 1.0);
        alloy_step_info x = run_mlp(a, &b), y = run_mlp(b2, &b);
        assert_int_equal(x.step, y.step);
        assert_true(x.scale == y.scale);
        if (!(fabs(x.loss - y.loss) <= tolerance(MLP, F16) * fabs(x.loss)))
            fail_msg("%s -> %s, step %d after the load: loss %.9g against %.9g", from, to, s, x.loss, y.loss);
    }
    alloy_graph_free(a);
    alloy_graph_free(b2);
    rt_backend_set_cuda_opener(NULL);
}

static void emu_checkpoint_to_cpu(void **state) { (void)state; checkpoint_moves(ON_EMULATION, "cuda", "cpu"); }
static void emu_checkpoint_from_cpu(void **state) { (void)state; checkpoint_moves(ON_EMULATION, "cpu", "cuda"); }
static void gpu_checkpoint_to_cpu(void **state) { (void)state; checkpoint_moves(ON_GPU, "cuda", "cpu"); }
static void gpu_checkpoint_from_cpu(void **state) { (void)state; checkpoint_moves(ON_GPU, "cpu", "cuda"); }

/* ---- GEMM layouts ---- */

/* out = matmul(a, b) with transposes and broadcast batch dims, against an
 * f64 loop over the row-major definition. */
typedef struct gemm_case {
    int ra, rb;
    int64_t da[4], db[4];
    bool ta, tb;
    alloy_dtype dt;
} gemm_case;

static double element(const double *x, int rank, const int64_t *dims, const int64_t *idx_batch, int ob, int64_t r,
                      int64_t c)
{
    int64_t off = 0, stride = 1;
    off += c * stride, stride *= dims[rank - 1];
    off += r * stride, stride *= dims[rank - 2];
    for (int d = rank - 3; d >= 0; d--) {
        int od = d - (rank - 2) + ob; /* the output's batch dim it aligns with */
        int64_t i = dims[d] == 1 ? 0 : idx_batch[od];
        off += i * stride, stride *= dims[d];
    }
    return x[off];
}

static void gemm_layouts(target t)
{
    use_target(t);
    static const gemm_case cases[] = {
        {2, 2, {5, 7}, {7, 3}, false, false, F32},
        {2, 2, {7, 5}, {7, 3}, true, false, F32},
        {2, 2, {5, 7}, {3, 7}, false, true, F32},
        {2, 2, {7, 5}, {3, 7}, true, true, F16},
        {3, 2, {4, 5, 6}, {6, 3}, false, false, F32},       /* b broadcast over the batch */
        {3, 3, {4, 5, 6}, {4, 6, 3}, false, false, BF16},   /* one strided batch */
        {4, 3, {2, 3, 5, 6}, {3, 6, 4}, false, false, F32}, /* b broadcast over the outer dim: calls per outer index */
        {4, 4, {2, 1, 5, 6}, {1, 3, 4, 6}, false, true, F64},
        {3, 3, {2, 6, 5}, {2, 4, 6}, true, true, F16},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const gemm_case *k = &cases[ci];
        alloy_graph *g = alloy_graph_new("gemm");
        alloy_tensor *a = alloy_input(g, "a", k->dt, k->ra, k->da), *b = alloy_input(g, "b", k->dt, k->rb, k->db);
        alloy_tensor *o = alloy_matmul(g, a, b, k->ta, k->tb);
        expect_ok(g, alloy_output(g, "out", o), "output");
        expect_ok(g, alloy_graph_set_option(g, "device", "cuda"), "device");
        int64_t na = 1, nb = 1;
        for (int i = 0; i < k->ra; i++) na *= k->da[i];
        for (int i = 0; i < k->rb; i++) nb *= k->db[i];
        double *va = test_malloc(sizeof(double) * (size_t)na), *vb = test_malloc(sizeof(double) * (size_t)nb);
        for (int64_t i = 0; i < na; i++) va[i] = test_uniform(-1, 1);
        for (int64_t i = 0; i < nb; i++) vb[i] = test_uniform(-1, 1);
        size_t es = alloy_dtype_size(k->dt);
        void *ba = test_malloc(es * (size_t)na), *bb = test_malloc(es * (size_t)nb);
        test_encode(k->dt, va, ba, na);
        test_encode(k->dt, vb, bb, nb);
        cvt_load_f64(k->dt, ba, va, (size_t)na); /* the values as rounded to dt */
        cvt_load_f64(k->dt, bb, vb, (size_t)nb);
        alloy_host_tensor feeds[2] = {{.name = "a", .dtype = k->dt, .rank = k->ra, .data = ba},
                                      {.name = "b", .dtype = k->dt, .rank = k->rb, .data = bb}};
        memcpy(feeds[0].dims, k->da, sizeof(int64_t) * (size_t)k->ra);
        memcpy(feeds[1].dims, k->db, sizeof(int64_t) * (size_t)k->rb);
        alloy_host_tensor out = {.name = "out"};
        expect_ok(g, alloy_graph_run(g, feeds, 2, &out, 1), "run");
        int ob = out.rank - 2;
        int64_t m = out.dims[ob], n = out.dims[ob + 1], kk = k->ta ? k->da[k->ra - 2] : k->da[k->ra - 1];
        int64_t batches = alloy_host_tensor_numel(&out) / (m * n), worst_at = -1;
        /* Each element's bound: D's rounding, u_d |want|, and the k-term sum in cuBLASLt's order
         * (any), gamma_k = k c u_acc / (1 - k c u_acc) of sum |a b|: f32 sums (f64 for f64, u_acc
         * its unit roundoff), products exact (f16 and bf16 products fit f32's 24 bits), c = 2 for
         * f16 and bf16 on tensor cores (which truncate their adds), else 1 (fused multiply-adds
         * rounding to nearest). The f64 reference's own error (k 2^-53 sum|a b|) is added. */
        const double u_acc = k->dt == F64 ? 0x1p-53 : 0x1p-24, c_acc = k->dt == F16 || k->dt == BF16 ? 2 : 1;
        const double gamma = kk * c_acc * u_acc / (1 - kk * c_acc * u_acc) + kk * 0x1p-53;
        double worst = 0, worst_ratio = 0;
        for (int64_t bi = 0; bi < batches; bi++) {
            int64_t idx[4] = {0}, rem = bi;
            for (int d = ob - 1; d >= 0; d--) idx[d] = rem % out.dims[d], rem /= out.dims[d];
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double want = 0, mag = 0;
                    for (int64_t p = 0; p < kk; p++) {
                        double ab = (k->ta ? element(va, k->ra, k->da, idx, ob, p, i) : element(va, k->ra, k->da, idx, ob, i, p)) *
                                    (k->tb ? element(vb, k->rb, k->db, idx, ob, j, p) : element(vb, k->rb, k->db, idx, ob, p, j));
                        want += ab, mag += fabs(ab);
                    }
                    double got = test_decode(k->dt, out.data, (bi * m + i) * n + j);
                    double e = fabs(got - want), bound = unit_roundoff(k->dt) * fabs(want) + gamma * mag;
                    if (!(e <= bound))
                        fail_msg("case %zu (%s): element %lld is %.17g, the f64 sum %.17g: off by %.3g (> %.3g)", ci,
                                 alloy_dtype_name(k->dt), (long long)((bi * m + i) * n + j), got, want, e, bound);
                    if (e > worst) worst = e, worst_at = (bi * m + i) * n + j;
                    if (bound > 0 && e / bound > worst_ratio) worst_ratio = e / bound;
                }
        }
        print_message("gemm case %zu (%s, k %lld) on %s: worst error %.3g at %lld, %.2f of its bound\n", ci,
                      alloy_dtype_name(k->dt), (long long)kk, t == ON_GPU ? "the GPU" : "the emulated device", worst,
                      (long long)worst_at, worst_ratio);
        test_free(va), test_free(vb), test_free(ba), test_free(bb);
        alloy_graph_free(g);
    }
    rt_backend_set_cuda_opener(NULL);
}

static void emu_gemm_layouts(void **state) { (void)state; gemm_layouts(ON_EMULATION); }
static void gpu_gemm_layouts(void **state) { (void)state; gemm_layouts(ON_GPU); }

/* ---- the GEMM's bias epilogue ---- */

enum { LIN_IN = 20, LIN_OUT = 36, LIN_STEPS = 3 };

/* Output y of a linear test graph, and when train the mse loss against the input t ([2, 12,
 * LIN_OUT] in tdt) and SGD; on device. */
static void finish_linear(alloy_graph *g, alloy_tensor *y, alloy_dtype tdt, bool train, const char *device)
{
    expect_ok(g, alloy_output(g, "y", y), "output");
    if (train) {
        alloy_tensor *t = alloy_input(g, "t", tdt, 3, (int64_t[]){2, 12, LIN_OUT});
        expect_ok(g, alloy_graph_set_loss(g, alloy_mse_loss(g, y, t, ALLOY_REDUCTION_MEAN)), "set_loss");
        expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.05, 0.0, 0.0, false)), "add_optimizer");
    }
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
}

/* A linear layer y = x w + b, x [2, 12, LIN_IN], everything in dt (no
 * AMP: under AMP the loss's cast to f32 joins the gemm step, and cuBLASLt's
 * bias must be in D's dtype), and when train the loss the mean of
 * (y - t)^2 and SGD. When checked, with amp_check on: every
 * gemm step keeps its generated epilogue kernel (which checks what it
 * computes; the bias epilogue takes a step only without checks), the
 * values the same. */
static alloy_graph *linear_graph(const char *device, alloy_dtype dt, bool train, bool checked)
{
    alloy_graph *g = alloy_graph_new("linear");
    alloy_graph_set_seed(g, 3);
    alloy_dtype pd = dt;
    alloy_tensor *x = alloy_input(g, "x", pd, 3, (int64_t[]){2, 12, LIN_IN});
    alloy_tensor *w = alloy_param(g, "w", pd, 2, (int64_t[]){LIN_IN, LIN_OUT}, alloy_init_uniform(-0.5, 0.5));
    alloy_tensor *b = alloy_param(g, "b", pd, 1, (int64_t[]){LIN_OUT}, alloy_init_uniform(-1, 1));
    alloy_tensor *p = alloy_matmul(g, x, w, false, false), *y = alloy_add(g, p, b);
    finish_linear(g, y, pd, train, device);
    if (checked) expect_ok(g, alloy_graph_set_option(g, "amp_check", "1"), "amp_check");
    return g;
}

/* One run of a linear graph on x (and t when training); y copied out (test_free), its dtype and count. */
static void *run_linear(alloy_graph *g, alloy_dtype dt, bool train, const float *xf, const float *tf, alloy_dtype *ydt,
                        int64_t *yn)
{
    alloy_dtype pd = dt;
    int64_t nx = 2 * 12 * LIN_IN, nt = 2 * 12 * LIN_OUT;
    size_t es = alloy_dtype_size(pd);
    double *v = test_malloc(sizeof(double) * (size_t)(nx + nt));
    void *bx = test_malloc(es * (size_t)nx), *bt = test_malloc(es * (size_t)nt);
    for (int64_t i = 0; i < nx; i++) v[i] = xf[i];
    for (int64_t i = 0; i < nt; i++) v[nx + i] = tf[i];
    test_encode(pd, v, bx, nx);
    test_encode(pd, v + nx, bt, nt);
    alloy_host_tensor feeds[2] = {{.name = "x", .dtype = pd, .rank = 3, .dims = {2, 12, LIN_IN}, .data = bx},
                                  {.name = "t", .dtype = pd, .rank = 3, .dims = {2, 12, LIN_OUT}, .data = bt}};
    alloy_host_tensor out = {.name = "y"};
    expect_ok(g, alloy_graph_run(g, feeds, train ? 2 : 1, &out, 1), "run");
    *ydt = out.dtype, *yn = alloy_host_tensor_numel(&out);
    size_t bytes = alloy_dtype_size(out.dtype) * (size_t)*yn;
    void *y = test_malloc(bytes + 1);
    memcpy(y, out.data, bytes);
    test_free(v), test_free(bx), test_free(bt);
    return y;
}

/* run_linear's feeds: x uniform in [-xr, xr], t in [-1, 1], from seed. */
static void linear_feeds(float *xf, float *tf, uint64_t seed, double xr)
{
    test_rng = seed;
    for (int i = 0; i < 2 * 12 * LIN_IN; i++) xf[i] = (float)test_uniform(-xr, xr);
    for (int i = 0; i < 2 * 12 * LIN_OUT; i++) tf[i] = (float)test_uniform(-1, 1);
}

/* What compare_library_steps saw: the emulated device's counts over the library graph's runs
 * (lib) and the kernel graph's (kern), and y's worst difference from the CPU's, relative to the
 * CPU's largest |y|. */
typedef struct library_steps {
    emu_device_stats lib, kern;
    double worst, state; /* y against the CPU; the state (training) as state_distance gives it */
    char name[64];       /* the state tensor furthest from the CPU's */
} library_steps;

static emu_device_stats stats_add(emu_device_stats a, emu_device_stats from, emu_device_stats to)
{
    a.launches += to.launches - from.launches, a.gemms += to.gemms - from.gemms;
    a.bias_gemms += to.bias_gemms - from.bias_gemms, a.gelu_gemms += to.gelu_gemms - from.gelu_gemms;
    return a;
}

/* `steps` runs of three graphs of one layer (run_linear's feeds, x and t): lib, whose gemm steps
 * cuBLASLt computes whole, kern, the same with amp_check on (every gemm step keeping its epilogue
 * kernel), and cpu. On the emulated device y of lib and kern must agree bit for bit at every step
 * when bitwise (the library's epilogue computing what the kernel does); `what` names the epilogue
 * in the failure. y, and when training lib's state, must be within bound of the CPU's. */
static library_steps compare_library_steps(target t, alloy_graph *lib, alloy_graph *kern, alloy_graph *cpu,
                                           alloy_dtype dt, bool train, int steps, const float *xf, const float *tf,
                                           bool bitwise, const char *what, double bound)
{
    library_steps r = {{0}, {0}, 0, 0, ""};
    for (int s = 0; s < steps; s++) {
        alloy_dtype ydt, kdt, cdt;
        int64_t n, kn, cn;
        emu_device_stats s0 = emu_totals();
        void *ye = run_linear(lib, dt, train, xf, tf, &ydt, &n);
        emu_device_stats s1 = emu_totals();
        void *yk = run_linear(kern, dt, train, xf, tf, &kdt, &kn);
        emu_device_stats s2 = emu_totals();
        void *yc = run_linear(cpu, dt, train, xf, tf, &cdt, &cn);
        assert_true(ydt == kdt && ydt == cdt && n == kn && n == cn);
        r.lib = stats_add(r.lib, s0, s1), r.kern = stats_add(r.kern, s1, s2);
        double scale = 0;
        for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(test_decode(ydt, yc, i)));
        size_t es = alloy_dtype_size(ydt);
        for (int64_t i = 0; i < n; i++) {
            double e = test_decode(ydt, ye, i), k = test_decode(ydt, yk, i), c = test_decode(ydt, yc, i);
            if (t == ON_EMULATION && bitwise && memcmp((char *)ye + i * (int64_t)es, (char *)yk + i * (int64_t)es, es) != 0)
                fail_msg("%s %s step %d: y[%lld] is %.9g with the %s, %.9g with the epilogue kernel, %.9g on the CPU",
                         alloy_dtype_name(dt), train ? "training" : "forward", s, (long long)i, e, what, k, c);
            r.worst = fmax(r.worst, fabs(e - c) / (scale > 0 ? scale : 1));
        }
        test_free(ye), test_free(yk), test_free(yc);
    }
    if (train) r.state = state_distance(cpu, lib, r.name, sizeof r.name);
    if (!(r.worst <= bound)) fail_msg("y differs from the CPU's by %.3g (> %.3g)", r.worst, bound);
    if (!(r.state <= bound)) fail_msg("state '%s' differs from the CPU's by %.3g (> %.3g)", r.name, r.state, bound);
    return r;
}

/* y = x w + b with cuBLASLt's bias epilogue (one GEMM writing y in its dtype, no epilogue kernel)
 * against the generated epilogue kernel (the same layer with amp_check on) and the CPU: in f32,
 * f16 and bf16, forward and LIN_STEPS training steps. On the emulated device y agrees bit for bit
 * with the kernel's at every step (the f32 product plus the bias rounded once into y's dtype, in
 * both; the states are not compared bit for bit: amp_check's kernels sum some gradients in another
 * order); against the CPU within one op's chain_bound of the largest |y| (the forward) or the
 * training bound (y and the state). */
static void linear_bias(target t)
{
    use_target(t);
    static const alloy_dtype dts[] = {F32, F16, BF16};
    float xf[2 * 12 * LIN_IN], tf[2 * 12 * LIN_OUT];
    linear_feeds(xf, tf, 41, 1);
    for (int train = 0; train < 2; train++)
        for (size_t di = 0; di < 3; di++) {
            alloy_dtype dt = dts[di];
            alloy_graph *epi = linear_graph("cuda", dt, train, false), *kern = linear_graph("cuda", dt, train, true),
                        *cpu = linear_graph("cpu", dt, train, false);
            double bound = train ? chain_bound(CHAIN_DEPTH, LIN_IN, dt) : chain_bound(1, LIN_IN, dt);
            library_steps r = compare_library_steps(t, epi, kern, cpu, dt, train, train ? LIN_STEPS : 1, xf, tf, true,
                                                    "bias epilogue", bound);
            long kernels = r.lib.launches, gemms = r.lib.gemms, bias_gemms = r.lib.bias_gemms,
                 kernels_kept = r.kern.launches;
            double worst = r.worst, d = r.state;
            const char *name = r.name;
            assert_int_equal(r.kern.bias_gemms, 0); /* amp_check: no bias epilogue */
            print_message("linear %s %s on %s: worst y difference from the CPU %.3g, state %.3g (%s), bound %.3g; "
                          "%ld kernels and %ld GEMMs (%ld with the bias epilogue), %ld kernels with the epilogue kernel\n",
                          alloy_dtype_name(dt), train ? "training" : "forward", t == ON_GPU ? "the GPU" : "the emulated device",
                          worst, d, name, bound, kernels, gemms, bias_gemms, kernels_kept);
            if (t == ON_EMULATION && !train) { /* the forward: one GEMM and no kernel, against GEMM + epilogue kernel */
                assert_int_equal(kernels, 0);
                assert_int_equal(gemms, 1);
                assert_int_equal(bias_gemms, 1);
                assert_true(kernels_kept >= 1);
            }
            if (t == ON_EMULATION && train) {
                assert_int_equal(bias_gemms, LIN_STEPS); /* the forward's GEMM each step */
                assert_true(kernels < kernels_kept);
            }
            alloy_graph_free(epi), alloy_graph_free(kern), alloy_graph_free(cpu);
        }
    rt_backend_set_cuda_opener(NULL);
}

static void emu_linear_bias(void **state) { (void)state; linear_bias(ON_EMULATION); }
static void gpu_linear_bias(void **state) { (void)state; linear_bias(ON_GPU); }

/* ---- the GEMM's GELU epilogue ---- */

enum { GELU_HIDDEN = 40 }; /* a multiple of 8: GELU's input rows 40 apart fit cuBLASLt's AUX_LD */

/* An MLP layer y = gelu_tanh(x w1 + b1) w2 + b2, x [2, 12, LIN_IN], the
 * hidden width GELU_HIDDEN, everything in dt, and when train linear_graph's
 * mse loss and SGD; checked: amp_check on, every gemm step keeping its
 * generated epilogue kernel. */
static alloy_graph *gelu_graph(const char *device, alloy_dtype dt, bool train, bool checked)
{
    alloy_graph *g = alloy_graph_new("gelu_mlp");
    alloy_graph_set_seed(g, 7);
    alloy_tensor *x = alloy_input(g, "x", dt, 3, (int64_t[]){2, 12, LIN_IN});
    alloy_tensor *w1 = alloy_param(g, "w1", dt, 2, (int64_t[]){LIN_IN, GELU_HIDDEN}, alloy_init_uniform(-0.5, 0.5));
    alloy_tensor *b1 = alloy_param(g, "b1", dt, 1, (int64_t[]){GELU_HIDDEN}, alloy_init_uniform(-1, 1));
    alloy_tensor *w2 = alloy_param(g, "w2", dt, 2, (int64_t[]){GELU_HIDDEN, LIN_OUT}, alloy_init_uniform(-0.3, 0.3));
    alloy_tensor *b2 = alloy_param(g, "b2", dt, 1, (int64_t[]){LIN_OUT}, alloy_init_uniform(-1, 1));
    alloy_tensor *h = alloy_gelu_tanh(g, alloy_add(g, alloy_matmul(g, x, w1, false, false), b1));
    alloy_tensor *y = alloy_add(g, alloy_matmul(g, h, w2, false, false), b2);
    finish_linear(g, y, dt, train, device);
    if (checked) expect_ok(g, alloy_graph_set_option(g, "amp_check", "1"), "amp_check");
    return g;
}

/* x w1 + b1 -> gelu_tanh with cuBLASLt's GELU epilogue (GELU_BIAS in the forward; GELU_AUX_BIAS in
 * training, where gelu_tanh_grad reads GELU's input, which the GEMM writes beside its output),
 * against the generated epilogue kernel (amp_check on) and the CPU, in f32 and bf16, forward and
 * LIN_STEPS training steps; f16 keeps its kernel (the range rule) and is checked to. On the
 * emulated device y agrees bit for bit with the kernel's at every step (both take GELU of the f32
 * sum plus the bias with the CPU's tanh, rounding once on store; in the GPU-numerics mode the
 * kernel's tanhf is moved by CUDA's 2 ulp and the library's is not, so there only the bound
 * holds); against the CPU within the chain bound of its depth (the forward 3 ops: the two layers
 * and GELU) or the training bound. */
static void gelu_epilogue(target t)
{
    use_target(t);
    static const alloy_dtype dts[] = {F32, BF16, F16};
    float xf[2 * 12 * LIN_IN], tf[2 * 12 * LIN_OUT];
    linear_feeds(xf, tf, 43, 2);
    for (int train = 0; train < 2; train++)
        for (size_t di = 0; di < 3; di++) {
            alloy_dtype dt = dts[di];
            alloy_graph *epi = gelu_graph("cuda", dt, train, false), *kern = gelu_graph("cuda", dt, train, true),
                        *cpu = gelu_graph("cpu", dt, train, false);
            /* bit for bit but in the GPU-numerics mode, where the kernel's tanhf moves and the library's does not */
            double bound = train ? chain_bound(CHAIN_DEPTH, GELU_HIDDEN, dt) : chain_bound(3, GELU_HIDDEN, dt);
            library_steps r = compare_library_steps(t, epi, kern, cpu, dt, train, train ? LIN_STEPS : 1, xf, tf,
                                                    !emu_gpu_numerics(), "GELU epilogue", bound);
            long gelu_gemms = r.lib.gelu_gemms, kernels = r.lib.launches, kernels_kept = r.kern.launches;
            assert_int_equal(r.kern.gelu_gemms, 0); /* amp_check: no GELU epilogue */
            print_message("gelu mlp %s %s on %s: worst y difference from the CPU %.3g, state %.3g (%s), bound %.3g; "
                          "%ld GEMMs with the GELU epilogue, %ld kernels (%ld with the epilogue kernels)\n",
                          alloy_dtype_name(dt), train ? "training" : "forward", t == ON_GPU ? "the GPU" : "the emulated device",
                          r.worst, r.state, r.name, bound, gelu_gemms, kernels, kernels_kept);
            if (t == ON_EMULATION) {
                assert_int_equal(gelu_gemms, dt == F16 ? 0 : train ? LIN_STEPS : 1); /* the forward's first GEMM a step */
                if (dt != F16) assert_true(kernels < kernels_kept);
                if (dt != F16 && !train) assert_int_equal(kernels, 0); /* two GEMMs, no kernel */
            }
            alloy_graph_free(epi), alloy_graph_free(kern), alloy_graph_free(cpu);
        }
    rt_backend_set_cuda_opener(NULL);
}

static void emu_gelu_epilogue(void **state) { (void)state; gelu_epilogue(ON_EMULATION); }
static void gpu_gelu_epilogue(void **state) { (void)state; gelu_epilogue(ON_GPU); }

/* The mixed-precision linear layer y = f32(x' w') + b as AMP writes it, on
 * device, with cuda_gemm_f32 when widen:
 * x [2, 12, LIN_IN] and the parameters w, b in f32, x' and w' their
 * casts to amp (x' as 24 rows: the weight gradient one GEMM), the product in amp cast to f32 for the f32 bias (matmul,
 * cast, add: one cuBLASLt call writing f32 with the f32 bias); when train,
 * linear_graph's loss and SGD, the weight gradient (in amp) cast to f32
 * for w (matmul, cast: one call writing f32). */
static alloy_graph *linear_amp_graph(const char *device, alloy_dtype amp, bool train, bool widen)
{
    alloy_graph *g = alloy_graph_new("linear_amp");
    alloy_graph_set_seed(g, 5);
    alloy_tensor *x = alloy_input(g, "x", F32, 3, (int64_t[]){2, 12, LIN_IN});
    alloy_tensor *w = alloy_param(g, "w", F32, 2, (int64_t[]){LIN_IN, LIN_OUT}, alloy_init_uniform(-0.5, 0.5));
    alloy_tensor *b = alloy_param(g, "b", F32, 1, (int64_t[]){LIN_OUT}, alloy_init_uniform(-1, 1));
    alloy_tensor *rows = alloy_reshape(g, alloy_cast(g, x, amp), 2, (int64_t[]){2 * 12, LIN_IN});
    alloy_tensor *p = alloy_matmul(g, rows, alloy_cast(g, w, amp), false, false);
    alloy_tensor *y = alloy_reshape(g, alloy_add(g, alloy_cast(g, p, F32), b), 3, (int64_t[]){2, 12, LIN_OUT});
    finish_linear(g, y, F32, train, device);
    if (widen) expect_ok(g, alloy_graph_set_option(g, "cuda_gemm_f32", "1"), "cuda_gemm_f32");
    return g;
}

/* linear_bias under AMP: with cuda_gemm_f32 the gemm steps whose epilogue
 * is a cast to f32 are one GEMM writing f32 (emu_device_stats'
 * whole_gemms: the forward's, and training's weight gradient); by default
 * the forward's too, whose one reader (the bias add's kernel) applies the
 * range rule as it loads it (step/ranged_reads.c), so the f32 bias after
 * the widening is that kernel's, no cuBLASLt bias epilogue; in training
 * the weight gradient's too (not fetched, so not stored as grad:w: its
 * readers, the update and the gradient norm's sum_squares, apply the rule).
 * Both bit for bit on the emulated device (no value here nears the
 * f16 range), and against the CPU within the bounds of linear_bias, in f16
 * and bf16 (tests/test_ranged_reads.c has values past the range). */
static void linear_amp(target t)
{
    use_target(t);
    static const alloy_dtype amps[] = {F16, BF16};
    float xf[2 * 12 * LIN_IN], tf[2 * 12 * LIN_OUT];
    test_rng = 43;
    for (size_t i = 0; i < sizeof xf / sizeof xf[0]; i++) xf[i] = (float)test_uniform(-1, 1);
    for (size_t i = 0; i < sizeof tf / sizeof tf[0]; i++) tf[i] = (float)test_uniform(-1, 1);
    for (int train = 0; train < 2; train++)
        for (size_t ai = 0; ai < 2; ai++) {
            alloy_dtype amp = amps[ai];
            alloy_graph *epi = linear_amp_graph("cuda", amp, train, true),
                        *kern = linear_amp_graph("cuda", amp, train, false),
                        *cpu = linear_amp_graph("cpu", amp, train, false);
            long gemms = 0, whole = 0, bias_gemms = 0, kernels = 0, kernels_kept = 0;
            double worst = 0;
            for (int s = 0; s < (train ? LIN_STEPS : 1); s++) {
                alloy_dtype ydt, kdt, cdt;
                int64_t n, kn, cn;
                emu_device_stats s0 = emu_totals();
                void *ye = run_linear(epi, F32, train, xf, tf, &ydt, &n);
                emu_device_stats s1 = emu_totals();
                void *yk = run_linear(kern, F32, train, xf, tf, &kdt, &kn);
                emu_device_stats s2 = emu_totals();
                void *yc = run_linear(cpu, F32, train, xf, tf, &cdt, &cn);
                assert_true(ydt == F32 && kdt == F32 && cdt == F32 && n == kn && n == cn);
                gemms += s1.gemms - s0.gemms, whole += s1.whole_gemms - s0.whole_gemms;
                bias_gemms += s1.bias_gemms - s0.bias_gemms;
                kernels += s1.launches - s0.launches, kernels_kept += s2.launches - s1.launches;
                assert_int_equal(s2.whole_gemms - s1.whole_gemms, train ? 2 : 1); /* the default: the forward's
                                                                                   and the weight gradient's */
                double scale = 0;
                for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(test_decode(F32, yc, i)));
                for (int64_t i = 0; i < n; i++) {
                    double e = test_decode(F32, ye, i), k = test_decode(F32, yk, i), c = test_decode(F32, yc, i);
                    if (t == ON_EMULATION && memcmp((char *)ye + 4 * i, (char *)yk + 4 * i, 4) != 0)
                        fail_msg("amp %s %s step %d: y[%lld] is %.9g from the library GEMM, %.9g with the epilogue "
                                 "kernel, %.9g on the CPU", alloy_dtype_name(amp), train ? "training" : "forward", s,
                                 (long long)i, e, k, c);
                    worst = fmax(worst, fabs(e - c) / (scale > 0 ? scale : 1));
                }
                test_free(ye), test_free(yk), test_free(yc);
            }
            double bound = train ? chain_bound(CHAIN_DEPTH, LIN_IN, amp) : chain_bound(1, LIN_IN, amp);
            char name[64] = "";
            double d = train ? state_distance(cpu, epi, name, sizeof name) : 0;
            print_message("linear, amp %s, %s on %s: worst y difference from the CPU %.3g, state %.3g (%s), bound "
                          "%.3g; %ld kernels, %ld GEMMs (%ld whole steps, %ld with the bias), %ld kernels with the "
                          "epilogue kernels\n",
                          alloy_dtype_name(amp), train ? "training" : "forward",
                          t == ON_GPU ? "the GPU" : "the emulated device", worst, d, name, bound, kernels, gemms, whole,
                          bias_gemms, kernels_kept);
            if (!(worst <= bound)) fail_msg("y differs from the CPU's by %.3g (> %.3g)", worst, bound);
            if (!(d <= bound)) fail_msg("state '%s' differs from the CPU's by %.3g (> %.3g)", name, d, bound);
            if (t == ON_EMULATION) { /* the forward's GEMM (cast), and training's weight gradient (cast) */
                assert_int_equal(bias_gemms, 0);
                assert_int_equal(whole, train ? 2 * LIN_STEPS : 1);
                assert_int_equal(kernels_kept, kernels); /* no epilogue kernel in either */
            }
            alloy_graph_free(epi), alloy_graph_free(kern), alloy_graph_free(cpu);
        }
    rt_backend_set_cuda_opener(NULL);
}

/* The emulated cuBLASLt prepares only the type combinations cuBLASLt has
 * for the 32F/64F compute types: D is A and B's dtype, or f32 for f16 and
 * bf16 A and B; f32 into f16 and f16 into bf16 are refused by name. */
static void emu_gemm_types_are_cublaslts(void **state)
{
    (void)state;
    char why[512];
    cdev *dev = emu_device_open(90, why, sizeof why);
    if (!dev) skip();
    static const struct {
        alloy_dtype ab, d;
        alloy_status want;
    } cases[] = {{F16, F16, ALLOY_OK},   {F16, F32, ALLOY_OK},   {BF16, F32, ALLOY_OK},
                 {F32, F32, ALLOY_OK},   {F64, F64, ALLOY_OK},   {F32, F16, ALLOY_ERR_UNSUPPORTED},
                 {F16, BF16, ALLOY_ERR_UNSUPPORTED}, {BF16, F16, ALLOY_ERR_UNSUPPORTED}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lp_gemm gm = {.node = 0, .result = 0, .bias_node = -1, .ab = cases[i].ab, .d = cases[i].d, .m = 4, .n = 4,
                      .k = 4, .lda = 4, .ldb = 4, .ldd = 4, .batch = 1};
        cdev_gemm *h = NULL;
        alloy_status st = dev->ops->gemm_prepare(dev, &gm, (const int[3]){16, 16, 16}, &h);
        assert_int_equal(st, cases[i].want);
        if (st == ALLOY_OK) dev->ops->gemm_free(dev, h);
        else assert_non_null(strstr(dev->error, alloy_dtype_name(cases[i].d)));
    }
    dev->ops->close(dev);
}

/* The range rule, which cuda_gemm_f32 gives up: an f16 product beyond
 * f16's range (20 terms of 4000 x ~0.95, about 76000 > 65504) cast to f32
 * is inf on the CPU and by default on the emulated device (the epilogue
 * kernel, so the loss scaler skips such a step as unfused), and finite
 * with cuda_gemm_f32 (cuBLASLt's f32 D). */
static void emu_widened_gemm_gives_up_the_range_rule(void **state)
{
    (void)state;
    use_target(ON_EMULATION);
    double got[3][2];
    for (int run = 0; run < 3; run++) { /* the CPU, the default, cuda_gemm_f32 */
        alloy_graph *g = alloy_graph_new("wide");
        alloy_graph_set_seed(g, 9);
        alloy_tensor *x = alloy_input(g, "x", F32, 2, (int64_t[]){4, LIN_IN});
        alloy_tensor *w = alloy_param(g, "w", F32, 2, (int64_t[]){LIN_IN, 8}, alloy_init_uniform(0.9, 1.0));
        alloy_tensor *p = alloy_matmul(g, alloy_cast(g, x, F16), alloy_cast(g, w, F16), false, false);
        expect_ok(g, alloy_output(g, "y", alloy_cast(g, p, F32)), "output");
        expect_ok(g, alloy_graph_set_option(g, "device", run ? "cuda" : "cpu"), "device");
        if (run == 2) expect_ok(g, alloy_graph_set_option(g, "cuda_gemm_f32", "1"), "cuda_gemm_f32");
        float xs[4 * LIN_IN];
        for (int i = 0; i < 4 * LIN_IN; i++) xs[i] = 4000;
        alloy_host_tensor feed = {.name = "x", .dtype = F32, .rank = 2, .dims = {4, LIN_IN}, .data = xs},
                          out = {.name = "y"};
        emu_device_stats s0 = emu_totals();
        expect_ok(g, alloy_graph_run(g, &feed, 1, &out, 1), "run");
        emu_device_stats s1 = emu_totals();
        assert_int_equal(s1.whole_gemms - s0.whole_gemms, run == 2);
        got[run][0] = test_decode(F32, out.data, 0), got[run][1] = test_decode(F32, out.data, 31);
        alloy_graph_free(g);
    }
    print_message("f16 product of about 76000 cast to f32: CPU %g, emulated default %g, cuda_gemm_f32 %g\n",
                  got[0][0], got[1][0], got[2][0]);
    for (int i = 0; i < 2; i++) {
        assert_true(isinf(got[0][i]) && got[0][i] > 0);
        assert_true(got[1][i] == got[0][i]);
        assert_true(isfinite(got[2][i]) && got[2][i] > 65504 && got[2][i] < 4000.0 * LIN_IN);
    }
    rt_backend_set_cuda_opener(NULL);
}

static void emu_linear_amp(void **state) { (void)state; linear_amp(ON_EMULATION); }
static void gpu_linear_amp(void **state) { (void)state; linear_amp(ON_GPU); }

/* ---- out of device memory ---- */

/* An arena that does not fit: the run fails naming the bytes asked and
 * free, and once memory is there the same graph trains as if nothing
 * happened. */
static void emu_out_of_memory(void **state)
{
    (void)state;
    use_target(ON_EMULATION);
    alloy_graph *g = mlp_step("cuda", F16, true), *ref = mlp_step("cpu", F16, true);
    alloy_memory_info mi;
    expect_ok(g, alloy_graph_memory_info(g, &mi), "memory_info"); /* compiles, opens the device */
    assert_int_equal(alloy_graph_state_count(g) > 0, 1);                /* the state is on the device */
    emu_device_set_budget(emu_device_in_use() + mi.arena_bytes / 2);    /* the arena does not fit */
    batch b = make_batch(1, 1.0);
    alloy_host_tensor feeds[2] = {
        {.name = "x", .dtype = F32, .rank = 2, .dims = {MLP_BATCH, MLP_IN}, .data = b.x},
        {.name = "targets", .dtype = I32, .rank = 1, .dims = {MLP_BATCH}, .data = b.targets},
    };
    alloy_status st = alloy_graph_run(g, feeds, 2, NULL, 0);
    emu_device_set_budget(SIZE_MAX);
    print_message("%s\n", alloy_last_error(g));
    assert_int_equal(st, ALLOY_ERR_OOM);
    assert_non_null(strstr(alloy_last_error(g), "out of GPU memory: asked "));
    assert_non_null(strstr(alloy_last_error(g), " free"));
    for (int s = 0; s < 3; s++) {
        batch c = make_batch(40 + (uint64_t)s, 1.0);
        alloy_step_info x = run_mlp(ref, &c), y = run_mlp(g, &c);
        assert_true(fabs(x.loss - y.loss) <= tolerance(MLP, F16) * fabs(x.loss));
        assert_int_equal(x.step, y.step);
    }
    alloy_graph_free(g);
    alloy_graph_free(ref);
    rt_backend_set_cuda_opener(NULL);
}

/* One MLP step's status, its error in err. */
static alloy_status mlp_run_status(alloy_graph *g, char *err, size_t len)
{
    batch b = make_batch(3, 1.0);
    alloy_host_tensor feeds[2] = {
        {.name = "x", .dtype = F32, .rank = 2, .dims = {MLP_BATCH, MLP_IN}, .data = b.x},
        {.name = "targets", .dtype = I32, .rank = 1, .dims = {MLP_BATCH}, .data = b.targets},
    };
    alloy_status st = alloy_graph_run(g, feeds, 2, NULL, 0);
    snprintf(err, len, "%s", st ? alloy_last_error(g) : "");
    return st;
}

/* A device fault shows, as on a GPU, at a later call that does not name the kernel; under
 * ALLOY_CUDA_SYNC=1 the step waits after each action, and the error names the step, the
 * kernel and its launch shape. */
static void emu_sync_names_the_faulting_kernel(void **state)
{
    (void)state;
    use_target(ON_EMULATION);
    char plain[1024], synced[1024];
    alloy_graph *g = mlp_step("cuda", F32, true);
    emu_device_inject_fault(NULL, 3);
    alloy_status st = mlp_run_status(g, plain, sizeof plain);
    alloy_graph_free(g);
    print_message("without ALLOY_CUDA_SYNC: %s\n", plain);
    assert_int_equal(st, ALLOY_ERR_CUDA);
    assert_non_null(strstr(plain, "illegal memory access"));
    char faulted[64];
    snprintf(faulted, sizeof faulted, "%s", emu_device_faulted_kernel());
    assert_true(faulted[0]);

    setenv("ALLOY_CUDA_SYNC", "1", 1);
    g = mlp_step("cuda", F32, true);
    emu_device_inject_fault(NULL, 3);
    st = mlp_run_status(g, synced, sizeof synced);
    alloy_graph_free(g);
    unsetenv("ALLOY_CUDA_SYNC");
    print_message("with ALLOY_CUDA_SYNC=1: %s\n", synced);
    assert_int_equal(st, ALLOY_ERR_CUDA);
    assert_string_equal(emu_device_faulted_kernel(), faulted); /* the same launch faulted */
    emu_device_inject_fault(NULL, 0);
    char expect[160];
    snprintf(expect, sizeof expect, "kernel %s <<<", faulted);
    assert_non_null(strstr(synced, expect));
    assert_non_null(strstr(synced, "cuda: step "));
    assert_non_null(strstr(synced, "failed on the device (ALLOY_CUDA_SYNC): CUDA_ERROR_ILLEGAL_ADDRESS"));
    assert_null(strstr(plain, expect)); /* the plain run's error did not name it */
    rt_backend_set_cuda_opener(NULL);
}

/* A driver older than the backend's floor (12.1) is refused when the device opens. */
static void emu_old_driver_is_refused(void **state)
{
    (void)state;
    use_target(ON_EMULATION);
    char why[1024];
    emu_device_set_driver(12000);
    alloy_graph *g = mlp_step("cuda", F32, true);
    alloy_status st = mlp_run_status(g, why, sizeof why);
    alloy_graph_free(g);
    emu_device_set_driver(12010);
    alloy_graph *ok = mlp_step("cuda", F32, true);
    alloy_status st_ok = mlp_run_status(ok, why + 512, 512);
    alloy_graph_free(ok);
    emu_device_set_driver(0);
    rt_backend_set_cuda_opener(NULL);
    print_message("driver 12.0: %s\n", why);
    assert_int_equal(st, ALLOY_ERR_UNSUPPORTED);
    assert_non_null(strstr(why, "the NVIDIA driver supports CUDA 12.0; the CUDA backend needs 12.1 or newer"));
    assert_int_equal(st_ok, ALLOY_OK);
}

/* ---- choosing the device ---- */

/* device=auto on a machine without a GPU runs on the CPU and says why; device=cuda is an error naming what is missing. */
static void device_choice(void **state)
{
    (void)state;
    rt_backend_set_cuda_opener(NULL);
    alloy_graph *g = mlp_step("auto", F32, true);
    const char *text = alloy_graph_device(g);
    assert_non_null(text);
    print_message("device=auto: %s\n", text);
    if (gpu_available()) {
        assert_true(strncmp(text, "cuda: ", 6) == 0);
    } else {
        assert_true(strncmp(text, "cpu (cuda unavailable: ", 23) == 0);
        alloy_graph *h = mlp_step("cuda", F32, true);
        assert_null(alloy_graph_device(h));
        print_message("device=cuda: %s\n", alloy_last_error(h));
        assert_int_equal(alloy_graph_status(h), ALLOY_ERR_UNSUPPORTED);
        assert_non_null(strstr(alloy_last_error(h), gpu_missing));
        alloy_graph_free(h);
    }
    alloy_graph_free(g);
    /* on the emulated device, the device line names it */
    char why[256];
    if (emu_available(why, sizeof why)) {
        rt_backend_set_cuda_opener(emu_backend_opener);
        alloy_graph *e = mlp_step("auto", F32, true);
        text = alloy_graph_device(e);
        assert_non_null(text);
        assert_string_equal(text, "cuda: host emulation of CUDA (sm_90)");
        alloy_graph_free(e);
        rt_backend_set_cuda_opener(NULL);
    }
}

/* ---- a bundle's step from its images ---- */

/* The GPU's compute capability as "sm_XY" (its device_caps). */
static void gpu_arch(char *out, size_t len)
{
    al_options o;
    opt_init(&o);
    o.device = OPT_DEVICE_CUDA;
    rt_backend *b;
    char err[512];
    int sm = 0, driver = 0;
    if (rt_backend_open(&o, &b, err, sizeof err) == ALLOY_OK) {
        if (b->ops->device_caps) b->ops->device_caps(b, &sm, &driver);
        rt_backend_close(b);
    }
    if (!sm) fail_msg("the GPU's compute capability: %s", err);
    snprintf(out, len, "sm_%d", sm);
}

/* Eight steps of the mlp's f16 AMP step (dynamic scaler, a skipped step
 * at step 3) saved as a bundle with the device's images and run from it on
 * the same device: the JIT graph's losses, step info and every state
 * tensor bit for bit. Every other step fetches the gradients grad:w1 and
 * grad:b2, which the default step does not store: the bundle's, from its
 * own executable, are the JIT's bit for bit, and the JIT graph builds two
 * executables (the default and the fetching run's), not one per step. The
 * bundle's step is built from its images and kernel table: on the
 * emulation every compile is counted, and poisoned while the bundle loads
 * and runs (a compile would fail the run). */
enum { MLP_GRADS = 2 };
static void bundle_round_trip(target t)
{
    use_target(t);
    char path[256], arch[32] = "host", err[1024];
    snprintf(path, sizeof path, "%s/step.alloy", test_tmpdir);
    alloy_graph *jit = mlp_step("cuda", F16, true);
    bundle_image_builder old = NULL;
    if (t == ON_EMULATION) old = bundle_set_image_builder(emu_bundle_images);
    else gpu_arch(arch, sizeof arch);
    alloy_status st = alloy_graph_save_bundle(jit, path, arch);
    if (t == ON_EMULATION) bundle_set_image_builder(old);
    if (st) fail_msg("save_bundle for %s: %s", arch, alloy_last_error(jit));
    /* the JIT's run first: it compiles its kernels, which the bundle's path must not */
    alloy_step_info want[8];
    batch bt[8];
    static const char *const grad_names[MLP_GRADS] = {"grad:w1", "grad:b2"};
    void *grads[8][MLP_GRADS] = {{0}};
    size_t grad_bytes[MLP_GRADS] = {0};
    long jit_compiles = 0;
    for (int s = 0; s < 8; s++) {
        bt[s] = make_batch(300 + (uint64_t)s, s == 3 ? 1e6 : 1.5);
        alloy_host_tensor fetch[MLP_GRADS] = {{.name = grad_names[0]}, {.name = grad_names[1]}};
        if (s == 2) jit_compiles = emu_compile_count();
        want[s] = run_mlp_fetching(jit, &bt[s], fetch, s % 2 ? MLP_GRADS : 0);
        assert_int_equal(want[s].skipped, s == 3);
        for (int j = 0; s % 2 && j < MLP_GRADS; j++) {
            grad_bytes[j] = (size_t)alloy_host_tensor_numel(&fetch[j]) * alloy_dtype_size(fetch[j].dtype);
            grads[s][j] = test_malloc(grad_bytes[j]);
            memcpy(grads[s][j], fetch[j].data, grad_bytes[j]);
        }
    }
    /* after its first two steps the JIT graph built no executable and no kernel again */
    assert_int_equal(jit->exec_builds, 2);
    if (t == ON_EMULATION) assert_int_equal(emu_compile_count(), jit_compiles);
    snapshot jit_state = take_snapshot(jit);
    long compiles = emu_compile_count(), modules = emu_totals().modules;
    if (t == ON_EMULATION) emu_poison_compiles(true);
    alloy_bundle *b;
    st = alloy_bundle_load(path, &b, err, sizeof err);
    if (st) {
        emu_poison_compiles(false);
        fail_msg("bundle_load: %s", err);
    }
    for (int s = 0; s < 8; s++) {
        alloy_step_info a = want[s], c;
        alloy_host_tensor feeds[2] = {
            {.name = "x", .dtype = F32, .rank = 2, .dims = {MLP_BATCH, MLP_IN}, .data = bt[s].x},
            {.name = "targets", .dtype = I32, .rank = 1, .dims = {MLP_BATCH}, .data = bt[s].targets},
        };
        alloy_host_tensor fetch[MLP_GRADS] = {{.name = grad_names[0]}, {.name = grad_names[1]}};
        if (alloy_bundle_run(b, feeds, 2, fetch, s % 2 ? MLP_GRADS : 0) || alloy_bundle_step_info(b, &c)) {
            emu_poison_compiles(false);
            fail_msg("step %d from the bundle: %s", s, alloy_bundle_last_error(b));
        }
        if (memcmp(&a.loss, &c.loss, sizeof a.loss) != 0 || a.skipped != c.skipped || a.scale != c.scale)
            fail_msg("step %d: JIT loss %.9g (skipped %d, scale %g), bundle %.9g (skipped %d, scale %g)", s, a.loss,
                     a.skipped, a.scale, c.loss, c.skipped, c.scale);
        for (int j = 0; s % 2 && j < MLP_GRADS; j++) {
            size_t bytes = (size_t)alloy_host_tensor_numel(&fetch[j]) * alloy_dtype_size(fetch[j].dtype);
            if (bytes != grad_bytes[j] || memcmp(fetch[j].data, grads[s][j], bytes) != 0)
                fail_msg("step %d: the bundle's %s differs from the JIT's", s, grad_names[j]);
            test_free(grads[s][j]);
        }
    }
    emu_poison_compiles(false);
    if (t == ON_EMULATION) {
        assert_int_equal(emu_compile_count(), compiles); /* the bundle's path compiled nothing */
        assert_true(emu_totals().modules > modules);     /* and loaded its modules from the images */
    }
    assert_int_equal(alloy_bundle_state_count(b), jit_state.n);
    int same = 0;
    for (int i = 0; i < jit_state.n; i++) {
        alloy_host_tensor y;
        if (alloy_bundle_get_state(b, jit_state.names[i], &y))
            fail_msg("bundle state %s: %s", jit_state.names[i], alloy_bundle_last_error(b));
        size_t bytes = (size_t)alloy_host_tensor_numel(&y) * alloy_dtype_size(y.dtype);
        if (bytes != jit_state.bytes[i] || memcmp(jit_state.data[i], y.data, bytes) != 0)
            fail_msg("state '%s' differs from the JIT's", jit_state.names[i]);
        same++;
    }
    free_snapshot(&jit_state);
    print_message("bundle %s for %s on %s: 8 steps, %d state tensors and 4 steps' %s, %s bit for bit with the JIT, %ld "
                  "compiles on the bundle's path\n", path, arch, alloy_graph_device(jit), same, grad_names[0],
                  grad_names[1], emu_compile_count() - compiles);
    alloy_bundle_free(b);
    alloy_graph_free(jit);
    rt_backend_set_cuda_opener(NULL);
}

static void emu_bundle_round_trip(void **state) { (void)state; bundle_round_trip(ON_EMULATION); }
static void gpu_bundle_round_trip(void **state) { (void)state; bundle_round_trip(ON_GPU); }

/* ---- attention alone ---- */

/* attention(q, k, v) on CUDA against the CPU backend, [2, 2, T, D] over S
 * keys: f16 and bf16 at head dims 64 and 128 take the tensor-core kernel
 * (emit_attention_mma.c; on a GPU this is where its fragment layouts meet
 * the hardware first), head dim 24 the SIMT one. The bound: the mma kernel
 * rounds each probability to the dtype (unit roundoff u) and divides by the
 * rounded sum, 2u / (1 - u) of the spread |v_j - o| <= 2 max|v| from exact;
 * each side's store rounds once (u |o| <= u max|v|); f32 sums add far less,
 * and so does CUDA's exp2f (2 ulp of f32 on each probability and on their
 * sum: 4 * 2^-23 of the spread, under 2^-19 max|v|):
 * |cuda - cpu| <= 7u max|v|. The gradients of loss = sum(y * r) (the
 * backward's kernels, tensor-core ones for the same shapes) relative to each
 * one's largest magnitude within chain_bound over the backward's chain: P
 * recomputed and rounded, dP = dO V^T, dS = P (dP - D), then dQ = dS K (or
 * dK, dV), 4 ops whose longest sum is the most of T, S and D terms. */
static void attention_against_cpu(target t)
{
    use_target(t);
    static const struct {
        alloy_dtype dt;
        int64_t t, s, d;
        bool causal;
    } cases[] = {{F16, 65, 65, 64, true}, {BF16, 65, 65, 64, true}, {F16, 129, 129, 128, false},
                 {BF16, 33, 97, 128, true}, {F16, 33, 33, 24, true}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t qd[4] = {2, 2, cases[c].t, cases[c].d}, kd[4] = {2, 2, cases[c].s, cases[c].d};
        int64_t nq = 4 * cases[c].t * cases[c].d, nk = 4 * cases[c].s * cases[c].d;
        alloy_dtype dt = cases[c].dt;
        size_t es = alloy_dtype_size(dt);
        void *data[3] = {test_malloc(es * (size_t)nq), test_malloc(es * (size_t)nk), test_malloc(es * (size_t)nk)};
        double *v = test_malloc(sizeof(double) * (size_t)(nq > nk ? nq : nk));
        test_rng = 300 + c;
        for (int j = 0; j < 3; j++) {
            int64_t n = j ? nk : nq;
            for (int64_t e = 0; e < n; e++) v[e] = j < 2 ? test_uniform(-2, 2) : test_uniform(-1, 1);
            test_encode(dt, v, data[j], n);
        }
        double vmax = 0;
        for (int64_t e = 0; e < nk; e++) vmax = fmax(vmax, fabs(test_decode(dt, data[2], e)));
        double *y[2], *grads[2][3];
        for (int side = 0; side < 2; side++) {
            alloy_graph *g = alloy_graph_new("attention");
            alloy_tensor *q = alloy_input(g, "q", dt, 4, qd), *k = alloy_input(g, "k", dt, 4, kd),
                         *vv = alloy_input(g, "v", dt, 4, kd);
            alloy_tensor *out = alloy_attention(g, q, k, vv, cases[c].causal, 1 / sqrt((double)cases[c].d));
            expect_ok(g, alloy_output(g, "y", out), "output");
            /* the backward too: loss = sum(y * r), r = q's values, and the inputs' gradients */
            alloy_tensor *r = alloy_input(g, "r", dt, 4, qd);
            expect_ok(g, alloy_graph_set_loss(g, alloy_reduce_sum(g, alloy_mul(g, out, r), 0, NULL, false)), "loss");
            expect_ok(g, alloy_graph_request_grad(g, q), "grad q");
            expect_ok(g, alloy_graph_request_grad(g, k), "grad k");
            expect_ok(g, alloy_graph_request_grad(g, vv), "grad v");
            expect_ok(g, alloy_graph_set_option(g, "device", side ? "cuda" : "cpu"), "device");
            alloy_host_tensor feeds[4] = {{"q", dt, 4, {0}, data[0]}, {"k", dt, 4, {0}, data[1]}, {"v", dt, 4, {0}, data[2]},
                                          {"r", dt, 4, {0}, data[0]}};
            memcpy(feeds[0].dims, qd, sizeof qd), memcpy(feeds[1].dims, kd, sizeof kd), memcpy(feeds[2].dims, kd, sizeof kd);
            memcpy(feeds[3].dims, qd, sizeof qd);
            alloy_host_tensor fetch[4] = {{.name = "y"}, {.name = "grad:q"}, {.name = "grad:k"}, {.name = "grad:v"}};
            expect_ok(g, alloy_graph_run(g, feeds, 4, fetch, 4), "run");
            y[side] = test_malloc(sizeof(double) * (size_t)nq);
            for (int64_t e = 0; e < nq; e++) y[side][e] = test_decode(fetch[0].dtype, fetch[0].data, e);
            for (int j = 0; j < 3; j++) {
                int64_t n = j ? nk : nq;
                grads[side][j] = test_malloc(sizeof(double) * (size_t)n);
                for (int64_t e = 0; e < n; e++) grads[side][j][e] = test_decode(fetch[1 + j].dtype, fetch[1 + j].data, e);
            }
            alloy_graph_free(g);
        }
        double u = dt == F16 ? 0x1p-11 : 0x1p-8, worst = 0, bound = 7 * u * vmax;
        for (int64_t e = 0; e < nq; e++) {
            double d = fabs(y[1][e] - y[0][e]);
            if (!(d <= bound))
                fail_msg("%s [2,2,%lld,%lld] over %lld keys: element %lld is %.9g on CUDA, %.9g on the CPU (bound %.3g)",
                         alloy_dtype_name(dt), (long long)cases[c].t, (long long)cases[c].d, (long long)cases[c].s,
                         (long long)e, y[1][e], y[0][e], bound);
            worst = fmax(worst, d);
        }
        /* the gradients relative to each one's largest magnitude, within the backward chain's bound */
        int64_t terms = cases[c].t > cases[c].s ? cases[c].t : cases[c].s;
        double gworst = 0, gtol = chain_bound(4, (int)(terms > cases[c].d ? terms : cases[c].d), dt);
        for (int j = 0; j < 3; j++) {
            int64_t n = j ? nk : nq;
            double scale = 0, d = 0;
            for (int64_t e = 0; e < n; e++) scale = fmax(scale, fabs(grads[0][j][e]));
            for (int64_t e = 0; e < n; e++) d = fmax(d, fabs(grads[1][j][e] - grads[0][j][e]) / (scale > 0 ? scale : 1));
            if (!(d <= gtol))
                fail_msg("%s [2,2,%lld,%lld] over %lld keys: d%c differs from the CPU's by %.3g of its largest (> %.3g)",
                         alloy_dtype_name(dt), (long long)cases[c].t, (long long)cases[c].d, (long long)cases[c].s, "qkv"[j],
                         d, gtol);
            gworst = fmax(gworst, d);
            test_free(grads[0][j]), test_free(grads[1][j]);
        }
        print_message("attention %s [2,2,%lld,%lld] over %lld keys%s on %s: worst difference from the CPU %.3g (bound %.3g); "
                      "gradients %.3g of their largest (bound %.3g)\n",
                      alloy_dtype_name(dt), (long long)cases[c].t, (long long)cases[c].d, (long long)cases[c].s,
                      cases[c].causal ? " causal" : "", t == ON_GPU ? "the GPU" : "the emulated device", worst, bound, gworst,
                      gtol);
        for (int j = 0; j < 3; j++) test_free(data[j]);
        test_free(v), test_free(y[0]), test_free(y[1]);
    }
    rt_backend_set_cuda_opener(NULL);
}

static void emu_attention(void **state) { (void)state; attention_against_cpu(ON_EMULATION); }
static void gpu_attention(void **state) { (void)state; attention_against_cpu(ON_GPU); }

/* "cuda": the emulated device (and the device choice); "cuda gpu": the
 * GPU, exiting 77 (a skip to meson) with the reason when there is none;
 * "cuda gpu-numerics": the GPU's comparisons on the emulated device with
 * ALLOY_EMU_NUMERICS=gpu. */
/* The driver loader on the CUDA toolkit's stub libcuda.so (what machines
 * without a GPU have): a clear refusal, not a crash or a half-open driver. */
static void stub_driver_is_refused(void **state)
{
    (void)state;
#if ALLOY_HAVE_CUDA
    const char *cuda = getenv("CUDA_PATH");
    char stub[1024];
    snprintf(stub, sizeof stub, "%s/lib64/stubs/libcuda.so", cuda && *cuda ? cuda : "/usr/local/cuda");
    FILE *f = fopen(stub, "rb");
    if (!f) {
        print_message("SKIP: no stub driver at %s\n", stub);
        skip();
    }
    fclose(f);
    cu_driver *d = NULL;
    char err[512];
    assert_int_equal(cu_driver_open(stub, &d, err, sizeof err), ALLOY_ERR_UNSUPPORTED);
    assert_null(d);
    print_message("%s\n", err);
    assert_non_null(strstr(err, "stub library, not an NVIDIA driver"));
    assert_int_equal(cu_driver_open("/nonexistent/libcuda.so.1", &d, err, sizeof err), ALLOY_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "no NVIDIA driver: /nonexistent/libcuda.so.1"));
#else
    print_message("SKIP: this build has no CUDA\n");
    skip();
#endif
}


/* ---- the profile option ---- */

/* One row of the profile table as printed. */
typedef struct profile_row {
    int idx, step;
    char kind[16], action[16], name[64];
    double us, gbs;
    long long bytes;
} profile_row;

/* The rows of every profile table in text (at most max), and how many launches the headers announced. */
static int parse_profile(const char *text, profile_row *rows, int max, int *tables, int *announced)
{
    int n = 0;
    *tables = *announced = 0;
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        int count;
        char tflops[32];
        if (strncmp(line, "# profile: graph 'mlp'", 22) == 0) {
            const char *end = strstr(line, " launches, "), *at;
            if (!end) end = strstr(line, " steps, "); /* the CPU's table */
            assert_non_null(end);
            for (at = end; at > line && at[-1] != ' ';) at--;
            assert_int_equal(sscanf(at, "%d", &count), 1);
            (*tables)++, *announced += count;
            continue;
        }
        profile_row r;
        if (n < max && sscanf(line, "# %d %d %15s %15s %lf %lld %lf %31s %63s", &r.idx, &r.step, r.kind, r.action, &r.us,
                              &r.bytes, &r.gbs, tflops, r.name) == 9)
            rows[n++] = r;
    }
    return n;
}

/* The bytes of node id's value in the compiled graph g. */
static long long value_bytes(const ir_graph *g, int id) { return (long long)ir_nbytes(&g->nodes[id]->type); }

/* profile=1 on the emulated device: after each run, a table of every launch
 * of the MLP's fp32 step (device events around each), which lists every
 * schedule step under its kind; the five GEMMs with their shapes and bytes
 * worked out from the model's dimensions; each elementwise step's kernel
 * with the bytes of its inputs and stored values, counted from the
 * schedule; the step launched directly (no capture), computing the same
 * losses as a run without the profile. */
static void emu_profile_lists_every_launch(void **state)
{
    (void)state;
    use_target(ON_EMULATION);
    alloy_graph *g = mlp_step("cuda", F32, true), *plain = mlp_step("cuda", F32, true);
    expect_ok(g, alloy_graph_set_option(g, "profile", "1"), "profile");
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    expect_ok(g, alloy_graph_print_after(g, NULL, out), "print_after");
    emu_device_stats before = emu_totals();
    for (int s = 0; s < 2; s++) {
        batch b = make_batch(300 + (uint64_t)s, 1.0);
        alloy_step_info a = run_mlp(g, &b), c = run_mlp(plain, &b);
        assert_true(a.loss == c.loss); /* the same launches, only timed */
    }
    fclose(out);
    assert_int_equal(emu_totals().captures - before.captures, 1); /* only the unprofiled graph captured */

    enum { MAX_ROWS = 512 };
    profile_row *rows = calloc(MAX_ROWS, sizeof *rows);
    int tables, announced, n = parse_profile(text, rows, MAX_ROWS, &tables, &announced);
    assert_int_equal(tables, 2);
    assert_int_equal(n, announced);
    assert_true(n % 2 == 0);
    n /= 2; /* the first run's table; the second lists the same launches */
    for (int i = 0; i < n; i++) {
        assert_int_equal(rows[i].idx, i);
        assert_string_equal(rows[i].name, rows[n + i].name);
        assert_true(rows[i].us >= 0);
    }

    const ir_graph *c = g->compiled;
    const schedule *sc = &g->comp.sched;
    bool *listed = calloc((size_t)sc->nsteps + 1, sizeof *listed);
    /* the MLP's GEMMs as row-major M x N x K: x w1, h w2, then h^T dlogits, dlogits w2^T, x^T dh */
    static const int gemm_shapes[5][3] = {{16, 32, 12}, {16, 10, 32}, {32, 10, 16}, {16, 32, 10}, {12, 32, 16}};
    bool gemm_seen[5] = {false};
    int ngemms = 0, ew_checked = 0;
    for (int i = 0; i < n; i++) {
        const profile_row *r = &rows[i];
        if (r->step < 0) {
            assert_string_equal(r->kind, "update");
            assert_string_equal(r->action, "copy");
            continue;
        }
        assert_true(r->step < sc->nsteps);
        const sched_step *st = &sc->steps[r->step];
        listed[r->step] = true;
        assert_string_equal(r->kind, sched_kind_name(st->kind));
        if (strcmp(r->action, "gemm") == 0) {
            int M, N, K;
            assert_int_equal(sscanf(r->name, "gemm.%dx%dx%d.f32", &M, &N, &K), 3);
            bool found = false;
            for (int q = 0; q < 5 && !found; q++)
                if (!gemm_seen[q] && M == gemm_shapes[q][0] && N == gemm_shapes[q][1] && K == gemm_shapes[q][2])
                    found = gemm_seen[q] = true;
            if (!found) fail_msg("a GEMM %dx%dx%d the MLP does not have (or listed twice)", M, N, K);
            assert_int_equal(r->bytes, 4LL * (M * K + K * N + M * N));
            ngemms++;
        } else if (strcmp(r->action, "kernel") == 0 && (st->kind == STEP_KIND_EW || strstr(r->name, "_chain"))) {
            /* a chain kernel (alloy_s<k>_chain<N>) runs the N scalar steps from k that are not views,
             * and counts each step's bytes as its own kernel did */
            const char *chain = strstr(r->name, "_chain");
            long long bytes = 0;
            for (int j = r->step, left = chain ? atoi(chain + 6) : 1; j < sc->nsteps && left > 0; j++) {
                const sched_step *sj = &sc->steps[j];
                if (sc->members[sj->first].flags & MEMBER_VIEW) continue;
                listed[j] = true, left--;
                for (int k = 0; k < sj->nin; k++) bytes += value_bytes(c, sc->inputs[sj->first_in + k]);
                for (int m = sj->first; m < sj->first + sj->n; m++)
                    if (sc->members[m].flags & MEMBER_STORED) bytes += value_bytes(c, sc->members[m].node);
            }
            if (r->bytes != bytes)
                fail_msg("step %d (%s): %lld bytes in the profile, %lld counted from the schedule", r->step, r->name,
                         r->bytes, bytes);
            ew_checked++;
        } else if (strcmp(r->action, "kernel") == 0) {
            assert_true(r->bytes > 0);
        } else {
            assert_true(strcmp(r->action, "memset") == 0 || strcmp(r->action, "copy") == 0);
        }
    }
    assert_int_equal(ngemms, 5);
    assert_true(ew_checked > 0);
    for (int k = 0; k < sc->nsteps; k++)
        if (!listed[k]) fail_msg("schedule step %d (%s) is not in the profile", k, sched_kind_name(sc->steps[k].kind));
    print_message("profile of the mlp step on the emulated device: %d launches over %d steps, %d elementwise kernels "
                  "checked\n", n, sc->nsteps, ew_checked);
    free(listed), free(rows), free(text);
    alloy_graph_free(g);
    alloy_graph_free(plain);
    rt_backend_set_cuda_opener(NULL);
}

/* profile=1 on the CPU backend: one row per schedule step, in order, with
 * its kind, the wall-clock time, and the bytes of its inputs and stored values. */
static void cpu_profile_lists_every_step(void **state)
{
    (void)state;
    alloy_graph *g = mlp_step("cpu", F32, true);
    expect_ok(g, alloy_graph_set_option(g, "profile", "1"), "profile");
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    expect_ok(g, alloy_graph_print_after(g, NULL, out), "print_after");
    batch b = make_batch(5, 1.0);
    run_mlp(g, &b);
    fclose(out);
    profile_row rows[256];
    int tables, announced, n = parse_profile(text, rows, 256, &tables, &announced);
    const ir_graph *c = g->compiled;
    const schedule *sc = &g->comp.sched;
    assert_int_equal(tables, 1);
    assert_int_equal(n, sc->nsteps);
    assert_int_equal(announced, n);
    int gemms = 0;
    for (int k = 0; k < n; k++) {
        const sched_step *st = &sc->steps[k];
        assert_int_equal(rows[k].step, k);
        assert_string_equal(rows[k].kind, sched_kind_name(st->kind));
        assert_string_equal(rows[k].action, "step");
        long long bytes = 0;
        for (int i = 0; i < st->nin; i++) bytes += value_bytes(c, sc->inputs[st->first_in + i]);
        for (int m = st->first; m < st->first + st->n; m++)
            if (sc->members[m].flags & MEMBER_STORED) bytes += value_bytes(c, sc->members[m].node);
        assert_int_equal(rows[k].bytes, bytes);
        gemms += strncmp(rows[k].name, "gemm.", 5) == 0;
    }
    assert_int_equal(gemms, 5);
    free(text);
    alloy_graph_free(g);
}

/* profile=N prints after runs N, 2N, ...: none after the first of profile=2, one after the second. */
static void emu_profile_every_nth_run(void **state)
{
    (void)state;
    use_target(ON_EMULATION);
    alloy_graph *g = mlp_step("cuda", F32, true);
    expect_ok(g, alloy_graph_set_option(g, "profile", "2"), "profile");
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    expect_ok(g, alloy_graph_print_after(g, NULL, out), "print_after");
    batch b = make_batch(7, 1.0);
    run_mlp(g, &b);
    fflush(out);
    assert_int_equal(len, 0);
    run_mlp(g, &b);
    fclose(out);
    assert_non_null(strstr(text, "# profile: graph 'mlp', run 2 on cuda: host emulation"));
    assert_null(strstr(text, "run 1 on"));
    free(text);
    alloy_graph_free(g);
    rt_backend_set_cuda_opener(NULL);
}

/* An empty input (0 elements) needs no buffer: the CUDA backend launches the
 * op's kernel over nothing instead of refusing the unbound leaf; and a row
 * op over no rows (softmax of [0, 3]) is a step with nothing to compute,
 * not "no CUDA kernel" (the op-case table's empty cases found both). */
static void emu_empty_input_runs(void **state)
{
    (void)state;
    use_target(ON_EMULATION);
    alloy_graph *g = alloy_graph_new("empty");
    int64_t dims[2] = {0, 3};
    alloy_tensor *x = alloy_input(g, "x", F32, 2, dims);
    expect_ok(g, alloy_output(g, "y", alloy_exp(g, alloy_add(g, x, x))), "output");
    expect_ok(g, alloy_output(g, "p", alloy_softmax(g, x, -1)), "output");
    expect_ok(g, alloy_graph_set_option(g, "device", "cuda"), "device");
    float none[1] = {0};
    alloy_host_tensor feed = {.name = "x", .dtype = F32, .rank = 2, .dims = {0, 3}, .data = none};
    alloy_host_tensor out[2] = {{.name = "y"}, {.name = "p"}};
    expect_ok(g, alloy_graph_run(g, &feed, 1, out, 2), "run");
    for (int i = 0; i < 2; i++) {
        assert_int_equal(out[i].rank, 2);
        assert_int_equal(alloy_host_tensor_numel(&out[i]), 0);
    }
    alloy_graph_free(g);
    rt_backend_set_cuda_opener(NULL);
}

/* alloy_graph_device_memory counts the backend's allocations: after a run
 * at least the planned arena and the state, and the peak never below what is held. */
static void emu_device_memory_counts_allocations(void **state)
{
    (void)state;
    use_target(ON_EMULATION);
    alloy_graph *g = mlp_step("cuda", F32, true);
    batch b = make_batch(9, 1.0);
    run_mlp(g, &b);
    alloy_memory_info mi;
    alloy_device_memory dm;
    expect_ok(g, alloy_graph_memory_info(g, &mi), "memory_info");
    expect_ok(g, alloy_graph_device_memory(g, &dm), "device_memory");
    size_t inputs = sizeof b.x + sizeof b.targets;
    assert_true(dm.in_use_bytes >= mi.arena_bytes + mi.state_bytes + inputs);
    assert_true(dm.peak_bytes >= dm.in_use_bytes);
    assert_true(dm.in_use_bytes <= emu_device_in_use());
    alloy_graph_free(g);
    rt_backend_set_cuda_opener(NULL);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest emulated[] = {
        cmocka_unit_test(device_choice),
        cmocka_unit_test(stub_driver_is_refused),
        cmocka_unit_test(emu_gemm_layouts),
        cmocka_unit_test(emu_linear_bias),
        cmocka_unit_test(emu_gelu_epilogue),
        cmocka_unit_test(emu_linear_amp),
        cmocka_unit_test(emu_gemm_types_are_cublaslts),
        cmocka_unit_test(emu_widened_gemm_gives_up_the_range_rule),
        cmocka_unit_test(emu_mlp_fp32),
        cmocka_unit_test(emu_mlp_f16),
        cmocka_unit_test(emu_mlp_bf16),
        cmocka_unit_test(emu_block_fp32),
        cmocka_unit_test(emu_block_f16),
        cmocka_unit_test(emu_cnn_fp32),
        cmocka_unit_test(emu_cnn_f16),
        cmocka_unit_test(emu_attention),
        cmocka_unit_test(emu_injected_inf),
        cmocka_unit_test(emu_replay),
        cmocka_unit_test(emu_out_of_memory),
        cmocka_unit_test(emu_sync_names_the_faulting_kernel),
        cmocka_unit_test(emu_old_driver_is_refused),
        cmocka_unit_test(emu_profile_lists_every_launch),
        cmocka_unit_test(emu_profile_every_nth_run),
        cmocka_unit_test(cpu_profile_lists_every_step),
        cmocka_unit_test(emu_device_memory_counts_allocations),
        cmocka_unit_test(emu_empty_input_runs),
        cmocka_unit_test_setup_teardown(emu_checkpoint_to_cpu, test_tmpdir_setup, test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(emu_checkpoint_from_cpu, test_tmpdir_setup, test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(emu_bundle_round_trip, test_tmpdir_setup, test_tmpdir_teardown),
    };
    const struct CMUnitTest gpu[] = {
        cmocka_unit_test(device_choice),
        cmocka_unit_test(gpu_gemm_layouts),
        cmocka_unit_test(gpu_linear_bias),
        cmocka_unit_test(gpu_gelu_epilogue),
        cmocka_unit_test(gpu_linear_amp),
        cmocka_unit_test(gpu_mlp_fp32),
        cmocka_unit_test(gpu_mlp_f16),
        cmocka_unit_test(gpu_mlp_bf16),
        cmocka_unit_test(gpu_block_f16),
        cmocka_unit_test(gpu_block_bf16),
        cmocka_unit_test(gpu_cnn_fp32),
        cmocka_unit_test(gpu_cnn_f16),
        cmocka_unit_test(gpu_attention),
        cmocka_unit_test(gpu_injected_inf),
        cmocka_unit_test(gpu_replay),
        cmocka_unit_test_setup_teardown(gpu_checkpoint_to_cpu, test_tmpdir_setup, test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(gpu_checkpoint_from_cpu, test_tmpdir_setup, test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(gpu_bundle_round_trip, test_tmpdir_setup, test_tmpdir_teardown),
    };
    /* every comparison of the GPU group, on the emulated device with GPU numerics: the same
     * tolerances met by a legal GPU result at the worst end, without a GPU */
    const struct CMUnitTest numerics[] = {
        cmocka_unit_test(emu_gemm_layouts),
        cmocka_unit_test(num_mlp_fp32),
        cmocka_unit_test(num_mlp_f16),
        cmocka_unit_test(num_mlp_bf16),
        cmocka_unit_test(num_block_f16),
        cmocka_unit_test(num_block_bf16),
        cmocka_unit_test(num_cnn_fp32),
        cmocka_unit_test(num_cnn_f16),
        cmocka_unit_test(emu_attention),
        cmocka_unit_test(emu_injected_inf),
        cmocka_unit_test(emu_replay),
        cmocka_unit_test_setup_teardown(emu_checkpoint_to_cpu, test_tmpdir_setup, test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(emu_checkpoint_from_cpu, test_tmpdir_setup, test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(emu_bundle_round_trip, test_tmpdir_setup, test_tmpdir_teardown),
    };
    if (argc > 1 && strcmp(argv[1], "gpu-numerics") == 0) {
        setenv("ALLOY_EMU_NUMERICS", "gpu", 1);
        return cmocka_run_group_tests_name("cuda_gpu's comparisons on the emulated device, GPU numerics", numerics, NULL,
                                           NULL);
    }
    if (argc > 1 && strcmp(argv[1], "gpu") == 0) {
        if (!gpu_available()) {
            printf("SKIP: no GPU to run the CUDA backend on: %s\n", gpu_missing);
            return 77;
        }
        return cmocka_run_group_tests_name("cuda on the GPU", gpu, NULL, NULL);
    }
    return cmocka_run_group_tests_name("cuda on the emulated device", emulated, NULL, NULL);
}
