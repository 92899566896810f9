/* alloy/graph.h - build a static graph, run it, read and write its state. */
#ifndef ALLOY_GRAPH_H
#define ALLOY_GRAPH_H

#include <stdbool.h>
#include <stdio.h>

#include "alloy/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A graph: nodes built through the calls below, the state its parameters
 * own, and (after the first run) the compiled step. */
typedef struct alloy_graph alloy_graph;
/* A handle to one node of a graph. NULL is the poisoned handle: a builder
 * call that fails records an error on the graph and returns NULL; calls that
 * get NULL after an error pass it on quietly; the next alloy_graph_run
 * returns the first error. */
typedef struct alloy_tensor alloy_tensor;

/* ---- lifecycle and errors ---- */

/* A new empty graph; NULL only when out of memory. */
ALLOY_API alloy_graph *alloy_graph_new(const char *name);
ALLOY_API void alloy_graph_free(alloy_graph *g);
/* The status of the most recent call on g that failed, or ALLOY_OK when
 * none has. A call that succeeds leaves it (and the message) as it was.
 * A builder call that fails poisons g: later builder calls return NULL
 * quietly, and calls that need the built graph (run, compile, dump,
 * save...) fail with that first builder error. A call that fails for its
 * own reason (a bad argument) records its own status and message, also on
 * a poisoned graph (docs/errors.md, "One rule"). */
ALLOY_API alloy_status alloy_graph_status(const alloy_graph *g);
/* The message of the most recent call on g that failed ("" when none). */
ALLOY_API const char *alloy_last_error(const alloy_graph *g);
/* Seed for parameter initialization (default 0). Each parameter draws from
 * a stream derived from (seed, parameter name), so adding a parameter does
 * not change the others' initial values. */
ALLOY_API void alloy_graph_set_seed(alloy_graph *g, uint64_t seed);

/* Parses IR text (docs/ir.md) into a new graph. On error returns NULL and
 * writes "file:line:col: message" into err. */
ALLOY_API alloy_graph *alloy_graph_parse(const char *text, size_t len, const char *filename,
                                         char *err, size_t errlen);
/* The most bytes an IR file may have (256 MiB; a 64-layer GPT training
 * step prints 1.6 MB). */
#define ALLOY_IR_MAX_BYTES ((size_t)256 << 20)
/* Reads and parses an IR file: a regular file of at most ALLOY_IR_MAX_BYTES,
 * or a pipe or device read up to that limit (a longer one is an error
 * before memory runs out). Errors as alloy_graph_parse's. */
ALLOY_API alloy_graph *alloy_graph_load_ir(const char *path, char *err, size_t errlen);

/* ---- leaves ---- */

typedef enum alloy_init_kind {
    ALLOY_INIT_ZEROS,
    ALLOY_INIT_ONES,
    ALLOY_INIT_CONSTANT,        /* a = value */
    ALLOY_INIT_NORMAL,          /* a = mean, b = std */
    ALLOY_INIT_UNIFORM,         /* a = low, b = high */
    ALLOY_INIT_KAIMING_UNIFORM, /* a = gain: U(-gain*sqrt(3/fan_in), +...) */
    ALLOY_INIT_KAIMING_NORMAL,  /* a = gain: N(0, gain/sqrt(fan_in)) */
    ALLOY_INIT_XAVIER_UNIFORM,  /* a = gain: U(+-gain*sqrt(6/(fan_in+fan_out))) */
    ALLOY_INIT_XAVIER_NORMAL,   /* a = gain: N(0, gain*sqrt(2/(fan_in+fan_out))) */
} alloy_init_kind;

/* How a parameter starts. Fans follow alloy's weight layout [in, out]
 * (x @ W): fan_in = dims[rank-2], fan_out = dims[rank-1]; a rank-1 tensor
 * has fan_in = fan_out = dims[0]. A convolution's weight [out, in/groups,
 * k...] (a param the graph reads as one) has PyTorch's fans: fan_in =
 * in/groups * prod(k), fan_out = out * prod(k). */
typedef struct alloy_init {
    alloy_init_kind kind;
    double a, b;
} alloy_init;

ALLOY_API alloy_init alloy_init_zeros(void);
ALLOY_API alloy_init alloy_init_ones(void);
ALLOY_API alloy_init alloy_init_constant(double value);
ALLOY_API alloy_init alloy_init_normal(double std); /* mean 0 */
ALLOY_API alloy_init alloy_init_uniform(double low, double high);
ALLOY_API alloy_init alloy_init_kaiming_uniform(double gain); /* gain sqrt(2) for relu */
ALLOY_API alloy_init alloy_init_kaiming_normal(double gain);
ALLOY_API alloy_init alloy_init_xavier_uniform(double gain);
ALLOY_API alloy_init alloy_init_xavier_normal(double gain);

/* A value fed on every run, by name. */
ALLOY_API alloy_tensor *alloy_input(alloy_graph *g, const char *name, alloy_dtype dtype, int rank,
                                    const int64_t *dims);
/* A parameter: state owned by the graph, initialized once, kept across runs. */
ALLOY_API alloy_tensor *alloy_param(alloy_graph *g, const char *name, alloy_dtype dtype, int rank,
                                    const int64_t *dims, alloy_init init);
/* A constant tensor from numel(dims) values given as doubles. */
ALLOY_API alloy_tensor *alloy_constant(alloy_graph *g, alloy_dtype dtype, int rank,
                                       const int64_t *dims, const double *values);
/* A constant tensor filled with one value. */
ALLOY_API alloy_tensor *alloy_full(alloy_graph *g, alloy_dtype dtype, int rank, const int64_t *dims,
                                   double value);
/* A rank-0 constant. */
ALLOY_API alloy_tensor *alloy_scalar(alloy_graph *g, alloy_dtype dtype, double value);

/* ---- ops (docs/ir.md lists their semantics) ---- */

/* Elementwise, numpy broadcasting; operand dtypes must agree (cast first). */
ALLOY_API alloy_tensor *alloy_add(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_sub(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_mul(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_div(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_maximum(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_minimum(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_pow(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_neg(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_relu(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_gelu(alloy_graph *g, alloy_tensor *x);      /* erf form */
ALLOY_API alloy_tensor *alloy_gelu_tanh(alloy_graph *g, alloy_tensor *x); /* tanh approximation */
ALLOY_API alloy_tensor *alloy_tanh(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_sigmoid(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_silu(alloy_graph *g, alloy_tensor *x); /* x * sigmoid(x), a.k.a. swish */
ALLOY_API alloy_tensor *alloy_exp(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_log(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_sqrt(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_rsqrt(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_square(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_sin(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_cos(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_abs(alloy_graph *g, alloy_tensor *x);  /* any numeric dtype */
ALLOY_API alloy_tensor *alloy_sign(alloy_graph *g, alloy_tensor *x); /* -1, 0 or 1 (NaN stays NaN); zero gradient */
ALLOY_API alloy_tensor *alloy_erf(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_log1p(alloy_graph *g, alloy_tensor *x); /* log(1 + x), accurate near 0 */
ALLOY_API alloy_tensor *alloy_expm1(alloy_graph *g, alloy_tensor *x); /* exp(x) - 1, accurate near 0 */
ALLOY_API alloy_tensor *alloy_softplus(alloy_graph *g, alloy_tensor *x); /* log(1 + exp(x)), no overflow */
/* x where x > 0, else negative_slope * x (PyTorch's default slope: 0.01). */
ALLOY_API alloy_tensor *alloy_leaky_relu(alloy_graph *g, alloy_tensor *x, double negative_slope);
/* x where x > 0, else alpha * (exp(x) - 1) (PyTorch's default alpha: 1.0). */
ALLOY_API alloy_tensor *alloy_elu(alloy_graph *g, alloy_tensor *x, double alpha);
/* min(max(x, min), max) as torch.clamp: pass -INFINITY or INFINITY for a
 * bound that is absent; NaN stays NaN, min > max gives max; any numeric
 * dtype (integers compare in f64). A NaN bound is an error. The gradient
 * passes where min <= x <= max. */
ALLOY_API alloy_tensor *alloy_clamp(alloy_graph *g, alloy_tensor *x, double min, double max);
/* Comparisons give bool; where(cond, a, b) picks a where cond. */
ALLOY_API alloy_tensor *alloy_equal(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_not_equal(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_less(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_less_equal(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_greater(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_greater_equal(alloy_graph *g, alloy_tensor *a, alloy_tensor *b);
ALLOY_API alloy_tensor *alloy_where(alloy_graph *g, alloy_tensor *cond, alloy_tensor *a,
                                    alloy_tensor *b);

/* The index (i64) of the first maximum / minimum of x along axis (negative
 * counts from the end), as torch.argmax(x, dim, keepdim): the axis removed,
 * or kept as 1; a NaN counts as the extreme. No gradient. */
ALLOY_API alloy_tensor *alloy_argmax(alloy_graph *g, alloy_tensor *x, int axis, bool keepdims);
ALLOY_API alloy_tensor *alloy_argmin(alloy_graph *g, alloy_tensor *x, int axis, bool keepdims);
/* ids (i32/i64 [...]) -> [..., depth] of dtype: 1 at column ids[p], 0
 * elsewhere; an id outside [0, depth) fails the run naming it. No gradient. */
ALLOY_API alloy_tensor *alloy_one_hot(alloy_graph *g, alloy_tensor *ids, int64_t depth, alloy_dtype dtype);

/* A PyTorch-layout linear layer: y = x W^T + b for x [..., in], with params
 * "<name>.weight" [out, in] and (when bias) "<name>.bias" [out], both
 * initialized uniform in +-1/sqrt(in) as torch.nn.Linear does, so a
 * PyTorch state_dict's "<name>.weight"/"<name>.bias" load unchanged
 * (alloy_graph_load_params). NULL with the builder's error on bad sizes. */
ALLOY_API alloy_tensor *alloy_linear(alloy_graph *g, alloy_tensor *x, const char *name, int64_t in, int64_t out,
                                     bool bias);

/* a [..., M, K] @ b [..., K, N] (transposes swap the last two dims first);
 * batch dims broadcast. f16/bf16 accumulate in f32 and round once. */
ALLOY_API alloy_tensor *alloy_matmul(alloy_graph *g, alloy_tensor *a, alloy_tensor *b,
                                     bool transpose_a, bool transpose_b);

/* Reductions over `axes` (naxes of them; axes NULL = all axes). */
ALLOY_API alloy_tensor *alloy_reduce_sum(alloy_graph *g, alloy_tensor *x, int naxes,
                                         const int64_t *axes, bool keepdims);
ALLOY_API alloy_tensor *alloy_reduce_mean(alloy_graph *g, alloy_tensor *x, int naxes,
                                          const int64_t *axes, bool keepdims);
ALLOY_API alloy_tensor *alloy_reduce_max(alloy_graph *g, alloy_tensor *x, int naxes,
                                         const int64_t *axes, bool keepdims);
ALLOY_API alloy_tensor *alloy_softmax(alloy_graph *g, alloy_tensor *x, int axis);
ALLOY_API alloy_tensor *alloy_log_softmax(alloy_graph *g, alloy_tensor *x, int axis);
/* Normalizes over the last axis; gamma and beta ([D]) both or neither (NULL). */
ALLOY_API alloy_tensor *alloy_layer_norm(alloy_graph *g, alloy_tensor *x, alloy_tensor *gamma,
                                         alloy_tensor *beta, double eps);
/* x / sqrt(mean(x^2) + eps) over the last axis, times gamma ([D]) when
 * given (NULL: none), as T5 and LLaMA normalize. */
ALLOY_API alloy_tensor *alloy_rms_norm(alloy_graph *g, alloy_tensor *x, alloy_tensor *gamma, double eps);
/* Mean over positions of -log_softmax(logits)[target]; logits [..., C],
 * targets i32/i64 [...]. A scalar of the logits' dtype. */
ALLOY_API alloy_tensor *alloy_cross_entropy(alloy_graph *g, alloy_tensor *logits,
                                            alloy_tensor *targets);

/* Data movement. */
/* Rows of table [V, D] picked by integer ids [...] -> [..., D]. */
ALLOY_API alloy_tensor *alloy_embedding(alloy_graph *g, alloy_tensor *ids, alloy_tensor *table);
/* Same elements, new shape; one dim may be -1 (inferred). */
ALLOY_API alloy_tensor *alloy_reshape(alloy_graph *g, alloy_tensor *x, int rank,
                                      const int64_t *dims);
/* Result dim i is x's dim perm[i]; perm has rank(x) entries. */
ALLOY_API alloy_tensor *alloy_transpose(alloy_graph *g, alloy_tensor *x, const int64_t *perm);
ALLOY_API alloy_tensor *alloy_broadcast_to(alloy_graph *g, alloy_tensor *x, int rank,
                                           const int64_t *dims);
/* x[start:end] along axis (negative values count from the end, as in Python). */
ALLOY_API alloy_tensor *alloy_slice(alloy_graph *g, alloy_tensor *x, int axis, int64_t start,
                                    int64_t end);
ALLOY_API alloy_tensor *alloy_concat(alloy_graph *g, int n, alloy_tensor *const *xs, int axis);
/* x [..., Tq, Tk] with -inf where key j > query i + (Tk - Tq). */
ALLOY_API alloy_tensor *alloy_causal_mask(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_cast(alloy_graph *g, alloy_tensor *x, alloy_dtype dtype);
/* softmax(q k^T * scale) v per batch and head without the [T, S] score
 * matrix: q [B, H, T, D], k and v [B, H, S, D] of one float dtype (f32
 * statistics and accumulation for f16/bf16); causal masks key j > query
 * i + (S - T) as alloy_causal_mask. The backward recomputes the scores. */
ALLOY_API alloy_tensor *alloy_attention(alloy_graph *g, alloy_tensor *q, alloy_tensor *k, alloy_tensor *v,
                                        bool causal, double scale);

/* ---- naming, outputs, lookup ---- */

/* Names t (unique in g) and returns it; NULL and an error if taken. */
ALLOY_API alloy_tensor *alloy_set_name(alloy_graph *g, alloy_tensor *t, const char *name);
/* Declares t a graph output fetchable by name. */
ALLOY_API alloy_status alloy_output(alloy_graph *g, const char *name, alloy_tensor *t);
/* The node named name (input, param or any named node), or NULL. */
ALLOY_API alloy_tensor *alloy_graph_find(alloy_graph *g, const char *name);
/* The graph's declared outputs (as built, before training adds "grad:..."). */
ALLOY_API int alloy_graph_output_count(const alloy_graph *g);
ALLOY_API const char *alloy_graph_output_name(const alloy_graph *g, int i);
/* The graph's inputs: the i-th input's name, dtype and shape (data NULL). */
ALLOY_API int alloy_graph_input_count(const alloy_graph *g);
ALLOY_API alloy_status alloy_graph_input_at(const alloy_graph *g, int i, alloy_host_tensor *out);
/* The type of t: dtype, rank and dims (name and data are NULL). For a
 * NULL t (a builder call that failed) rank -1 and dtype ALLOY_DTYPE_COUNT,
 * which no tensor has (it looked like an f32 scalar). */
ALLOY_API alloy_host_tensor alloy_tensor_info(const alloy_tensor *t);

/* ---- running ---- */

/* Compiles g on the first call (and after it changes), then runs it:
 * feeds give every input by name (dtype and shape must match exactly);
 * fetches name outputs, parameters or any named node; run fills their
 * dtype, rank, dims and a data pointer owned by g, valid until the next run,
 * state change or alloy_graph_free. */
ALLOY_API alloy_status alloy_graph_run(alloy_graph *g, const alloy_host_tensor *feeds, int nfeeds,
                                       alloy_host_tensor *fetches, int nfetches);

/* ---- state (parameters and, with training, optimizer and scaler state) ---- */

/* Number of state tensors (initializing them if needed) and the i-th one:
 * name, dtype, shape and a read-only pointer owned by g. */
ALLOY_API int alloy_graph_state_count(alloy_graph *g);
ALLOY_API alloy_status alloy_graph_state_at(alloy_graph *g, int i, alloy_host_tensor *out);
/* The state tensor called name (as above); ALLOY_ERR_NOT_FOUND if none. */
ALLOY_API alloy_status alloy_graph_get_state(alloy_graph *g, const char *name,
                                             alloy_host_tensor *out);
/* Copies src into the state tensor src->name; dtype and shape must match,
 * and alloy's counters and scaler state take only values alloy could have
 * written (counters >= 0, scaler.scale finite and > 0; docs/training.md). */
ALLOY_API alloy_status alloy_graph_set_state(alloy_graph *g, const alloy_host_tensor *src);
/* Writes all state to a safetensors file, atomically, with a CRC-32 of the
 * tensors in its metadata ("alloy.checksum"). Temporary files that earlier
 * saves to the same path left behind (a killed process) are removed. */
ALLOY_API alloy_status alloy_graph_save_state(alloy_graph *g, const char *path);
/* Loads state from a safetensors file. Every state tensor of g must be in
 * the file with the same dtype and shape, alloy's counters and scaler state
 * in range as for set_state, and the checksum (when the file has one; a
 * file from PyTorch has none) must match, else nothing changes and the
 * error names the file and the tensor; tensors in the file that g lacks
 * are errors too. */
ALLOY_API alloy_status alloy_graph_load_state(alloy_graph *g, const char *path);
/* The model's tensors only, as a PyTorch state_dict holds them: params and
 * batch_norm's running statistics (no moments, counters or scaler state).
 * save_params writes them (atomically, with alloy's checksum) and, for each
 * batch_norm "<bn>", PyTorch's "<bn>.num_batches_tracked" (i64 []: the value
 * the last loaded file gave, else 0; alloy does not count batches), so the
 * file loads with load_state_dict(strict=True). load_params sets each of
 * them the file has a tensor of the same name for (dtype and shape must
 * match, else nothing changes and the error names the tensor), leaves the
 * others and all optimizer and scaler state as they are, and ignores
 * tensors that name none; *loaded and *ignored (either may be NULL) count
 * the two. A batch_norm's num_batches_tracked is kept, counted in neither
 * (load_state accepts it too). */
ALLOY_API alloy_status alloy_graph_save_params(alloy_graph *g, const char *path);
ALLOY_API alloy_status alloy_graph_load_params(alloy_graph *g, const char *path, int *loaded, int *ignored);

/* Makes g's params use owner's storage: every param of g that owner has a
 * param of the same name, dtype and shape for becomes that tensor (no
 * copy): what owner's training steps write, g's runs read, and set_state,
 * load_state or load_params through either graph changes both. State the
 * model built (batch_norm's running statistics, an IR `state`) is shared
 * the same way; g's other params and state (an optimizer's, a scaler's)
 * stay its own. A same-named tensor of another dtype or
 * shape is an error naming it and both graphs, and g stays as it was.
 * Both graphs are compiled for this (as a first run would), and run on
 * owner's backend from then on: a g whose options ask for another device
 * is refused. A graph shares once (g must not already share state; owner
 * may: several sharers, or a chain, use one storage). The storage is
 * reference-counted: the graphs may be freed in any order, and a sharer
 * keeps the params when owner is freed first. *shared and *unshared
 * (either may be NULL) count g's params and model-built state bound to
 * owner's and those owner has none for. Typical: an evaluation or sampling graph built with the
 * same param names as the training graph (docs/training.md). */
ALLOY_API alloy_status alloy_graph_share_state(alloy_graph *g, alloy_graph *owner, int *shared, int *unshared);

/* ---- inspection ---- */

typedef enum alloy_dump_kind {
    ALLOY_DUMP_SOURCE = 1, /* the graph as built */
    ALLOY_DUMP_IR = 2,     /* the compiled graph after every pass */
    /* the compiled graph as Graphviz DOT: nodes coloured by AMP class and
     * shaped by part (forward, backward, update), dtypes and shapes on the
     * edges, each fused step a cluster (docs/inspect.md) */
    ALLOY_DUMP_DOT = 3,
    /* the memory plan as SVG: every value's lifetime (schedule steps)
     * against its arena offset, the peak of live bytes marked */
    ALLOY_DUMP_MEMORY_SVG = 4,
} alloy_dump_kind;

/* Prints the IR after each named pass of the next compiles ("amp,dce" or
 * "all") to out (stderr when NULL); NULL or "" stops. The environment
 * variable ALLOY_PRINT_AFTER does the same for programs. out is flushed
 * after each print: when that write fails (a full disk, a closed
 * descriptor) the compile fails with ALLOY_ERR_IO naming print_after. */
ALLOY_API alloy_status alloy_graph_print_after(alloy_graph *g, const char *passes, FILE *out);

/* What the compiled step needs in memory: the plan pass's numbers for a run
 * keeping the outputs, updates and loss (fetching other values may need a
 * larger arena), and the state. */
typedef struct alloy_memory_info {
    size_t arena_bytes;     /* the one allocation a run computes in: values and scratch */
    size_t peak_live_bytes; /* the most value bytes live at one step: a lower bound of the arena */
    size_t scratch_bytes;   /* of the arena: scratch (the f32 product of the largest GEMM epilogue) */
    size_t state_bytes;     /* parameters, optimizer moments and scaler state, kept across runs */
    int inplace;            /* values written over an operand's slot */
    int steps;              /* scheduled steps: one kernel (or library call) each */
} alloy_memory_info;

/* Compiles g if needed and fills *out. */
ALLOY_API alloy_status alloy_graph_memory_info(alloy_graph *g, alloy_memory_info *out);

/* What g's backend holds allocated on its device, counted from its own
 * allocations: every buffer (state, inputs, staging of read-back counters),
 * each executable's arena and aux block, and what the device keeps for
 * itself (a GPU: cuBLASLt's 32 MiB workspace; the CPU: nothing); not the
 * CUDA context, loaded modules or NVRTC. A backend several graphs share
 * (alloy_graph_share_state) counts for all of them. */
typedef struct alloy_device_memory {
    size_t in_use_bytes; /* now */
    size_t peak_bytes;   /* the most at once since the backend opened */
} alloy_device_memory;

/* Compiles g if needed (opening its backend) and fills *out;
 * ALLOY_ERR_UNSUPPORTED for a backend that does not count. */
ALLOY_API alloy_status alloy_graph_device_memory(alloy_graph *g, alloy_device_memory *out);

/* Sets one option of the next compiles, over its environment variable
 * (docs/options.md): print_after, print_before (pass names or "all"),
 * disable_passes, no_fuse ("row,gemm,multi" or "all"), amp_log, no_arena,
 * blas (0/1), num_threads, device (auto|cpu|cuda), cuda_graph (0/1), cache
 * (0/1), cache_dir, dump_dir (directories: dump_dir also gets every pass's
 * IR, docs/inspect.md), nvrtc (a library path), time_passes (0/1: a table
 * of pass times and node counts where printed passes go), profile (N: after
 * every N-th run a table of each launch's time, bytes and GB/s, likewise). "" or NULL restores the default. An unknown option or value is ALLOY_ERR_INVALID with a message
 * listing the valid ones, and changes nothing. */
ALLOY_API alloy_status alloy_graph_set_option(alloy_graph *g, const char *name, const char *value);

/* The device that runs g's steps, as one line: "cuda: NVIDIA H100 80GB
 * HBM3 (sm_90, driver 13.0, NVRTC 13.0, cuBLASLt 130100)", "cpu", or with
 * device=auto the CPU and why CUDA was passed over: "cpu (cuda unavailable:
 * the NVIDIA driver library libcuda.so.1 cannot be loaded ...)". Compiles
 * g (and its kernels) first if needed. NULL on an error (alloy_last_error:
 * with device=cuda, what the machine lacks). The text lives until the next
 * call on g. */
ALLOY_API const char *alloy_graph_device(alloy_graph *g);

/* Prints g as IR text (docs/ir.md), or a picture of the compiled step
 * (DUMP_DOT, DUMP_MEMORY_SVG); every kind but DUMP_SOURCE compiles first if
 * needed. An unknown kind is ALLOY_ERR_INVALID, a failed write ALLOY_ERR_IO. */
ALLOY_API alloy_status alloy_graph_dump(alloy_graph *g, FILE *out, alloy_dump_kind kind);

#ifdef __cplusplus
}
#endif
#endif
