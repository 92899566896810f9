/* fuzz_builder.c - libFuzzer target: bytes read as a program of builder API calls with arbitrary arguments (fuzz_support.h), then compiled and run on the CPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_support.h"

typedef struct reader {
    const uint8_t *p;
    size_t n, i;
} reader;

static uint8_t u8(reader *r) { return r->i < r->n ? r->p[r->i++] : 0; }

static uint64_t raw64(reader *r)
{
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) v |= (uint64_t)u8(r) << (8 * k);
    return v;
}

static int64_t int_arg(reader *r)
{
    uint8_t b = u8(r);
    return b == FB_RAW_INT ? (int64_t)raw64(r) : (int64_t)(int8_t)b;
}

static double real_arg(reader *r)
{
    static const double table[16] = {0, 1, -1, 0.5, 2, 1e-3, 1e-8, 0.9, 0.999, 65536, 1e30, -1e30,
                                     INFINITY, -INFINITY, NAN, 3};
    uint8_t b = u8(r);
    if (b < FB_RAW_REAL) return table[b % 16];
    uint64_t bits = raw64(r);
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* A dtype byte: the seven dtypes, and beyond them invalid values passed on. */
static alloy_dtype dtype_arg(reader *r)
{
    uint8_t b = u8(r);
    if (b < 16) return (alloy_dtype)(b % ALLOY_DTYPE_COUNT);
    return b == 255 ? (alloy_dtype)-1 : (alloy_dtype)(ALLOY_DTYPE_COUNT + b - 16);
}

static bool bool_arg(reader *r) { return u8(r) & 1; }

/* The program's state: the graph, the tensors made so far, scratch for
 * names and dims that outlives each call. */
typedef struct program {
    alloy_graph *g;
    alloy_tensor *made[64]; /* a ring: the newest at made[(total - 1) % 64] */
    int total;
    char names[8][16];
    int next_name;
    int64_t dims[16];
    bool ran;
} program;

static alloy_tensor *tensor_arg(program *pg, reader *r)
{
    uint8_t b = u8(r);
    if (b == 255 || pg->total == 0) return NULL;
    int live = pg->total < 64 ? pg->total : 64;
    return pg->made[(pg->total - 1 - b % live) % 64];
}

static const char *name_arg(program *pg, reader *r)
{
    uint8_t len = u8(r);
    if (len == 255) return NULL;
    char *s = pg->names[pg->next_name++ % 8];
    len %= sizeof pg->names[0];
    for (int i = 0; i < len; i++) s[i] = (char)u8(r);
    s[len] = '\0';
    return s;
}

/* A rank (0..15; the API takes at most 8) and that many dims into pg->dims. */
static int shape_arg(program *pg, reader *r)
{
    int rank = u8(r) % 16;
    for (int i = 0; i < rank; i++) pg->dims[i] = int_arg(r);
    return rank;
}

static void keep(program *pg, alloy_tensor *t)
{
    if (t) pg->made[pg->total++ % 64] = t;
}

static alloy_tensor *unary(alloy_graph *g, int which, alloy_tensor *x)
{
    alloy_tensor *(*const fns[FB_NUNARY])(alloy_graph *, alloy_tensor *) = {
        alloy_neg, alloy_relu, alloy_gelu, alloy_gelu_tanh, alloy_tanh, alloy_sigmoid, alloy_silu,
        alloy_exp, alloy_log, alloy_sqrt, alloy_rsqrt, alloy_square, alloy_causal_mask, alloy_amp_allow};
    return fns[which % FB_NUNARY](g, x);
}

static alloy_tensor *binary(alloy_graph *g, int which, alloy_tensor *a, alloy_tensor *b)
{
    alloy_tensor *(*const fns[FB_NBINARY])(alloy_graph *, alloy_tensor *, alloy_tensor *) = {
        alloy_add, alloy_sub, alloy_mul, alloy_div, alloy_maximum, alloy_minimum, alloy_pow,
        alloy_equal, alloy_not_equal, alloy_less, alloy_less_equal, alloy_greater, alloy_greater_equal};
    return fns[which % FB_NBINARY](g, a, b);
}

/* FUZZ_VERBOSE=1 in the environment: say what each run did (to check seeds and reproducers). */
static bool verbose;

/* Runs the graph when it is small enough (with a builder error: the run
 * returns it); a second run of a training graph trains again. */
static void run(program *pg, uint64_t seed)
{
    pg->ran = true;
    if (!fuzz_graph_small(pg->g)) {
        if (verbose) fprintf(stderr, "fuzz_builder: not run: %s\n", alloy_last_error(pg->g));
        return;
    }
    alloy_status st = fuzz_run_once(pg->g, seed);
    alloy_step_info info = {0};
    alloy_graph_step_info(pg->g, &info);
    if (verbose)
        fprintf(stderr, "fuzz_builder: run: %s %s; step %lld loss %g scale %g skipped %d\n", alloy_status_name(st),
                alloy_last_error(pg->g), (long long)info.step, info.loss, info.scale, (int)info.skipped);
}

static const char *const option_names[] = {"no_fuse", "no_arena", "disable_passes", "print_after", "amp_log",
                                           "num_threads", "blas", "print_before", "no_such_option"};
static const char *const option_values[] = {"", "0", "1", "all", "row", "gemm", "multi", "row,gemm", "simplify",
                                            "dce", "fuse", "amp", "grad_scaler", "autodiff", "2", "fsue"};

static void option(program *pg, reader *r)
{
    const char *name = option_names[u8(r) % (sizeof option_names / sizeof option_names[0])];
    const char *value = option_values[u8(r) % (sizeof option_values / sizeof option_values[0])];
    static FILE *devnull;
    if (!devnull) devnull = fopen("/dev/null", "w");
    if (strcmp(name, "print_after") == 0) alloy_graph_print_after(pg->g, value, devnull);
    else alloy_graph_set_option(pg->g, name, value);
}

/* Reads a state tensor and writes its own bytes back: must succeed and change nothing. */
static void state_op(program *pg, reader *r)
{
    int n = alloy_graph_state_count(pg->g);
    uint8_t i = u8(r);
    if (n <= 0) return;
    alloy_host_tensor t;
    if (alloy_graph_state_at(pg->g, i % n, &t)) fuzz_fail("state_at(%d) of %d: %s", i % n, n, alloy_last_error(pg->g));
    size_t bytes = (size_t)alloy_host_tensor_numel(&t) * alloy_dtype_size(t.dtype);
    void *copy = malloc(bytes + 1);
    if (!copy) return;
    memcpy(copy, t.data, bytes);
    alloy_host_tensor src = t;
    src.data = copy;
    if (alloy_graph_set_state(pg->g, &src)) fuzz_fail("set_state('%s') of its own value: %s", t.name, alloy_last_error(pg->g));
    alloy_host_tensor again;
    if (alloy_graph_get_state(pg->g, t.name, &again) || memcmp(again.data, copy, bytes) != 0)
        fuzz_fail("state '%s' changed when set to itself", t.name);
    free(copy);
}

/* Saves the state and loads it back: both succeed when the graph is sound. */
static void save_load(program *pg)
{
    if (!fuzz_built_ok(pg->g) || !fuzz_graph_small(pg->g)) return;
    const char *path = fuzz_tmp_path("state.safetensors");
    if (alloy_graph_save_state(pg->g, path)) return; /* e.g. a graph that does not compile */
    if (alloy_graph_load_state(pg->g, path)) fuzz_fail("the state just saved does not load: %s", alloy_last_error(pg->g));
}

static void step(program *pg, reader *r)
{
    alloy_graph *g = pg->g;
    int op = u8(r) % FB_COUNT;
    switch (op) {
    case FB_INPUT: {
        const char *name = name_arg(pg, r);
        alloy_dtype dt = dtype_arg(r);
        int rank = shape_arg(pg, r);
        keep(pg, alloy_input(g, name, dt, rank, pg->dims));
        break;
    }
    case FB_PARAM: {
        const char *name = name_arg(pg, r);
        alloy_dtype dt = dtype_arg(r);
        int rank = shape_arg(pg, r);
        alloy_init init = {(alloy_init_kind)(u8(r) % 10), 0, 0};
        init.a = real_arg(r);
        init.b = real_arg(r);
        keep(pg, alloy_param(g, name, dt, rank, pg->dims, init));
        break;
    }
    case FB_CONSTANT: {
        alloy_dtype dt = dtype_arg(r);
        int rank = shape_arg(pg, r);
        int64_t n = 1;
        bool small = rank <= ALLOY_MAX_RANK;
        for (int i = 0; small && i < rank; i++) {
            small = pg->dims[i] >= 0 && pg->dims[i] <= 64;
            n *= small ? pg->dims[i] : 1;
        }
        if (!small || n > 64) { /* large or invalid: the call must refuse before reading values */
            keep(pg, alloy_constant(g, dt, rank, pg->dims, NULL));
            break;
        }
        double values[64];
        for (int64_t i = 0; i < n; i++) values[i] = real_arg(r);
        keep(pg, alloy_constant(g, dt, rank, pg->dims, values));
        break;
    }
    case FB_FULL: {
        alloy_dtype dt = dtype_arg(r);
        int rank = shape_arg(pg, r);
        keep(pg, alloy_full(g, dt, rank, pg->dims, real_arg(r)));
        break;
    }
    case FB_SCALAR: {
        alloy_dtype dt = dtype_arg(r);
        keep(pg, alloy_scalar(g, dt, real_arg(r)));
        break;
    }
    case FB_UNARY: {
        int which = u8(r);
        keep(pg, unary(g, which, tensor_arg(pg, r)));
        break;
    }
    case FB_BINARY: {
        int which = u8(r);
        alloy_tensor *a = tensor_arg(pg, r);
        keep(pg, binary(g, which, a, tensor_arg(pg, r)));
        break;
    }
    case FB_WHERE: {
        alloy_tensor *c = tensor_arg(pg, r), *a = tensor_arg(pg, r);
        keep(pg, alloy_where(g, c, a, tensor_arg(pg, r)));
        break;
    }
    case FB_MATMUL: {
        alloy_tensor *a = tensor_arg(pg, r), *b = tensor_arg(pg, r);
        uint8_t f = u8(r);
        keep(pg, alloy_matmul(g, a, b, f & 1, f & 2));
        break;
    }
    case FB_REDUCE: {
        int which = u8(r) % 3;
        alloy_tensor *x = tensor_arg(pg, r);
        uint8_t na = u8(r);
        int naxes = na == 255 ? 0 : na == 254 ? -1 : na % 9;
        int64_t axes[8];
        for (int i = 0; i < naxes; i++) axes[i] = int_arg(r);
        bool kd = bool_arg(r);
        const int64_t *ax = na == 255 ? NULL : axes;
        keep(pg, which == 0   ? alloy_reduce_sum(g, x, naxes, ax, kd)
                 : which == 1 ? alloy_reduce_mean(g, x, naxes, ax, kd)
                              : alloy_reduce_max(g, x, naxes, ax, kd));
        break;
    }
    case FB_SOFTMAX: {
        int which = u8(r) & 1;
        alloy_tensor *x = tensor_arg(pg, r);
        int axis = (int)int_arg(r);
        keep(pg, which ? alloy_log_softmax(g, x, axis) : alloy_softmax(g, x, axis));
        break;
    }
    case FB_LAYER_NORM: {
        alloy_tensor *x = tensor_arg(pg, r), *gamma = tensor_arg(pg, r), *beta = tensor_arg(pg, r);
        keep(pg, alloy_layer_norm(g, x, gamma, beta, real_arg(r)));
        break;
    }
    case FB_RMS_NORM: {
        alloy_tensor *x = tensor_arg(pg, r), *gamma = tensor_arg(pg, r);
        keep(pg, alloy_rms_norm(g, x, gamma, real_arg(r)));
        break;
    }
    case FB_CROSS_ENTROPY: {
        alloy_tensor *logits = tensor_arg(pg, r);
        keep(pg, alloy_cross_entropy(g, logits, tensor_arg(pg, r)));
        break;
    }
    case FB_EMBEDDING: {
        alloy_tensor *ids = tensor_arg(pg, r);
        keep(pg, alloy_embedding(g, ids, tensor_arg(pg, r)));
        break;
    }
    case FB_RESHAPE: {
        alloy_tensor *x = tensor_arg(pg, r);
        int rank = shape_arg(pg, r);
        keep(pg, alloy_reshape(g, x, rank, pg->dims));
        break;
    }
    case FB_TRANSPOSE: {
        alloy_tensor *x = tensor_arg(pg, r);
        int64_t perm[16];
        for (int i = 0; i < 16; i++) perm[i] = i < 8 ? int_arg(r) : 0;
        keep(pg, alloy_transpose(g, x, u8(r) == 255 ? NULL : perm));
        break;
    }
    case FB_BROADCAST_TO: {
        alloy_tensor *x = tensor_arg(pg, r);
        int rank = shape_arg(pg, r);
        keep(pg, alloy_broadcast_to(g, x, rank, pg->dims));
        break;
    }
    case FB_SLICE: {
        alloy_tensor *x = tensor_arg(pg, r);
        int axis = (int)int_arg(r);
        int64_t start = int_arg(r);
        keep(pg, alloy_slice(g, x, axis, start, int_arg(r)));
        break;
    }
    case FB_CONCAT: {
        int n = u8(r) % 5;
        alloy_tensor *xs[4];
        for (int i = 0; i < n; i++) xs[i] = tensor_arg(pg, r);
        keep(pg, alloy_concat(g, n, xs, (int)int_arg(r)));
        break;
    }
    case FB_CAST: {
        alloy_tensor *x = tensor_arg(pg, r);
        keep(pg, alloy_cast(g, x, dtype_arg(r)));
        break;
    }
    case FB_SET_NAME: {
        alloy_tensor *x = tensor_arg(pg, r);
        alloy_set_name(g, x, name_arg(pg, r));
        break;
    }
    case FB_OUTPUT: {
        const char *name = name_arg(pg, r);
        alloy_output(g, name, tensor_arg(pg, r));
        break;
    }
    case FB_SET_LOSS: alloy_graph_set_loss(g, tensor_arg(pg, r)); break;
    case FB_SCALER: {
        alloy_grad_scaler s = {.kind = (alloy_scaler_kind)(u8(r) % 4)};
        s.init_scale = real_arg(r);
        s.growth_factor = real_arg(r);
        s.backoff_factor = real_arg(r);
        s.growth_interval = (int)int_arg(r);
        s.min_scale = real_arg(r);
        s.hysteresis = (int)int_arg(r);
        s.max_consecutive_skips = (int)int_arg(r);
        s.stop_at_min_scale = u8(r) & 1;
        alloy_graph_set_grad_scaler(g, s);
        break;
    }
    case FB_OPTIMIZER: {
        alloy_optimizer o = {.kind = (alloy_optimizer_kind)(u8(r) % 5)};
        o.lr = real_arg(r);
        o.momentum = real_arg(r);
        o.nesterov = bool_arg(r);
        o.beta1 = real_arg(r);
        o.beta2 = real_arg(r);
        o.eps = real_arg(r);
        o.weight_decay = real_arg(r);
        o.schedule = (alloy_lr_schedule)(u8(r) % 4);
        o.warmup_steps = (int)int_arg(r);
        o.total_steps = (int)int_arg(r);
        o.min_lr = real_arg(r);
        o.clip_norm = real_arg(r);
        o.accumulation_steps = (int)int_arg(r);
        alloy_graph_add_optimizer(g, o);
        break;
    }
    case FB_AMP: alloy_graph_enable_amp(g, dtype_arg(r)); break;
    case FB_REQUEST_GRAD: alloy_graph_request_grad(g, tensor_arg(pg, r)); break;
    case FB_FREEZE: alloy_param_freeze(g, tensor_arg(pg, r)); break;
    case FB_OPTION: option(pg, r); break;
    case FB_RUN: run(pg, u8(r)); break;
    case FB_TRAINING: alloy_graph_set_training(g, bool_arg(r)); break;
    case FB_STATE:
        if (fuzz_built_ok(g) && fuzz_graph_small(g)) state_op(pg, r);
        break;
    case FB_SAVE_LOAD: save_load(pg); break;
    case FB_AMP_MARK: {
        int which = u8(r) & 1;
        alloy_tensor *x = tensor_arg(pg, r);
        keep(pg, which ? alloy_amp_deny(g, x) : alloy_amp_allow(g, x));
        break;
    }
    default: break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool started;
    if (!started) verbose = getenv("FUZZ_VERBOSE") != NULL, started = true;
    program pg = {0};
    pg.g = alloy_graph_new("fuzz");
    if (!pg.g) return 0;
    fuzz_cpu_options(pg.g);
    reader r = {data, size, 0};
    alloy_graph_set_seed(pg.g, u8(&r));
    while (r.i < r.n) step(&pg, &r);
    if (!pg.ran) run(&pg, size);
    alloy_graph_free(pg.g);
    return 0;
}
