/* graph_impl.h - what an alloy_graph holds: the built IR, its state, the compiled step. */
#ifndef ALLOY_GRAPH_IMPL_H
#define ALLOY_GRAPH_IMPL_H

/* every public declaration (ALLOY_API: default visibility), so each alloy_ function defined in the graph
 * files is exported whichever header declares it */
#include "alloy/alloy.h"
#include "ir/ir.h"
#include "step/amp_config.h"
#include "step/compiled.h"
#include "step/param_group.h"
#include "step/state_names.h"
#include "runtime/backend.h"

struct pass_options; /* passes/pass.h: what the compiler-side files fill (graph_pass_options) */

/* The storage of one state tensor: a backend buffer, and host, a copy for
 * the API refreshed when stale. Graphs that share state
 * (alloy_graph_share_state) point at the same cell; the last to let go
 * frees it. */
typedef struct state_cell {
    int refs;        /* rt_states (of one graph or several) that are this tensor */
    rt_buffer *buf;
    void *host;
    bool host_stale; /* a run changed buf since host was copied */
} state_cell;

/* One state tensor of a graph (a parameter, optimizer moments, scaler
 * state): its name and type in this graph, its storage in cell. */
typedef struct rt_state {
    char *name;
    ir_type type;
    state_cell *cell;
} rt_state;

/* The backend a graph runs on, where its state lives: one graph's, or
 * shared by the graphs that share state; the last to let go closes it. */
typedef struct graph_device {
    int refs;
    rt_backend *backend;
} graph_device;

/* The scalars step info reads (train_api.c), downloaded by every run. */
enum { SCALAR_LOSS, SCALAR_SCALE, SCALAR_NEXT_SCALE, SCALAR_FOUND, SCALAR_APPLY, SCALAR_LR, SCALAR_NORM, SCALAR_COUNT,
       SCALAR_SKIPPED, SCALAR_DIVERGED, SCALAR_CONSEC, NSCALARS };

/* A batch_norm's num_batches_tracked as a params file gave it (batch_counts.c). */
typedef struct batch_count {
    char *name; /* "<module>.num_batches_tracked" */
    int64_t value;
} batch_count;

/* One option set through the API (alloy_graph_set_option). */
typedef struct graph_option {
    char *name, *value;
} graph_option;

struct alloy_graph {
    ir_graph *ir;       /* as built; builder errors live in ir->status/error */
    ir_graph *compiled; /* after the pass pipeline; NULL until compiled */
    pass_compiled comp; /* its schedule and plan for the default keep set */
    pass_timing timings[16]; /* each pass's time in the last compile (bench/compile_time.c reads them) */
    int ntimings;
    graph_device *dev;   /* opened at the first compile, kept with the state it holds; NULL before */
    bool shares_state;   /* alloy_graph_share_state made g use another graph's state */
    /* The executables of the last runs, two at most: exec_default for the
     * default schedule (comp), exec_kept for exec_sched / exec_plan, those
     * of a run that kept more (fetches of values the default does not keep;
     * exec_keep is what it keeps). exec is the one the last run used. Both
     * stay, so runs that alternate between fetching such a value and not
     * build nothing again (graph_exec_ready); each holds its own arena.
     * exec_builds counts the executables built (tests read it). */
    rt_exec *exec, *exec_default, *exec_kept;
    long exec_builds;
    uint8_t *exec_keep;
    schedule exec_sched;
    mem_plan exec_plan;
    rt_buffer **leaf;   /* per compiled node: the buffer bound to an input, param or state leaf */
    rt_buffer **input_buf; /* per compiled node: the buffer an input is uploaded into (owned) */
    void **fetched;     /* per compiled node: host copy of its value for fetches (owned) */
    int step_node[NSCALARS];     /* the nodes behind the step scalars, -1 when absent */
    uint64_t step_raw[NSCALARS]; /* their values as the last run downloaded them */
    rt_state *state;
    int nstate, state_cap;
    al_name_slot *state_slots; /* the index of state names (base/name_index.h) */
    int state_slot_cap;
    bool state_ready; /* every param/state leaf of compiled has its state tensor */
    uint64_t seed;
    amp_config amp;             /* lists and dtype as the user set them */
    uint8_t amp_scope[ALLOY_AMP_SCOPE_MAX]; /* alloy_amp_scope_push's pins (AMP_DENY: f32, AMP_ALLOW: low), innermost last */
    int amp_scopes;
    alloy_amp_report amp_report; /* from the last compile */
    bool training;               /* build the backward (set with the loss) */
    alloy_grad_scaler scaler;    /* kind NONE unless set */
    alloy_optimizer optimizer;   /* kind 0 unless an optimizer was added */
    alloy_step_info step;        /* what the last run did */
    bool step_ran;               /* a run has filled step */
    alloy_overflow_info overflow; /* the locator's report of the last run (amp_check) */
    int overflow_node;            /* the compiled node it names (-1: none) */
    rt_range *ranges;            /* amp_stats: per compiled node, over the runs since the compile (NULL: none yet) */
    int nranges;                 /* the compiled node count they were made for */
    int64_t range_runs;          /* the runs that added to them */
    rt_range *run_ranges;        /* amp_stats: the last run's own, merged into ranges after it (same count) */
    graph_option *options;       /* alloy_graph_set_option's settings, over the environment's */
    int noptions;
    al_options cfg;              /* the configuration of the last compile (graph_options) */
    FILE *print_to;              /* where printed passes go (NULL: stderr) */
    char **grad_inputs;          /* inputs whose gradients were asked for */
    int ngrad_inputs;
    batch_count *batch_counts;   /* num_batches_tracked values loaded from params files */
    int nbatch_counts;
    param_group *groups;         /* alloy_graph_set_param_group's calls, in order */
    alloy_comm *comm;            /* alloy_graph_set_data_parallel's communicator (not owned); NULL: one process */
    alloy_data_parallel dp;      /* its options */
    int ngroups;
    bool from_bundle;  /* compiled, comp came from a bundle: no pass pipeline, never recompiled */
    bool compiled_for_gpu; /* compiled with the GPU's choices: device=cuda, or device=auto on CUDA or for a GPU's output */
    bundle_cuda *bundle_exec; /* the bundle's CUDA executable (images, kernel table) for exec_load; NULL: none */
    /* The one error record of the API (docs/errors.md, "One rule"): the
     * status and message of the most recent call on g that failed. A
     * builder error lives first in ir->status/error (first wins: the
     * poison) and is copied here by graph_error_sync when it is newer. */
    alloy_status status;
    char error[4096]; /* room for an NVRTC log (alloy_graph_export_cuda) */
    bool builder_error_seen; /* ir's builder error was copied into status/error */
    char device_text[1024]; /* alloy_graph_device's answer */
};

/* The backend g runs on, NULL before its first compile. */
static inline rt_backend *graph_backend(const alloy_graph *g) { return g->dev ? g->dev->backend : NULL; }

/* config.c */
/* The configuration: defaults, then the environment (ALLOY_*), then the
 * options set on g. An invalid environment value is an error naming the
 * variable and listing the valid values. */
AL_HIDDEN alloy_status graph_options(alloy_graph *g, al_options *cfg);
AL_HIDDEN void graph_options_free(alloy_graph *g);

/* distributed_api.c */
/* Data-parallel g: compares g's built graph, training options and
 * data-parallel options with every other rank's (hashes, all-gathered; a
 * collective every rank makes at its compile); ALLOY_ERR_INVALID naming the
 * first rank and the first part that differs from rank 0's. OK when g is
 * not data-parallel. */
AL_HIDDEN alloy_status graph_dp_check_ranks(alloy_graph *g);

/* cuda_api.c */
/* The kernel cache's directory under cfg into out: cache_dir when set,
 * else $XDG_CACHE_HOME/alloy (an absolute XDG_CACHE_HOME), else
 * $HOME/.cache/alloy; "" when none applies (a cache in memory only).
 * ALLOY_ERR_INVALID (on g) when it does not fit in len. */
AL_HIDDEN alloy_status graph_cache_dir(alloy_graph *g, const al_options *cfg, char *out, size_t len);

/* amp_api.c */
/* The options for compiling g: its AMP config with the environment's list
 * edits (ALLOY_AMP_*LIST_{ADD,REMOVE}) applied on top. */
AL_HIDDEN alloy_status graph_pass_options(alloy_graph *g, struct pass_options *opts);

/* env_check.c */
/* The AMP list edits' variables (ALLOY_AMP_<LIST>_ADD / _REMOVE, k even:
 * ADD, odd: REMOVE): how many, the k-th into buf, the class its list
 * edits; and the class of a public list (-1: not a list). */
AL_HIDDEN int graph_amp_env_count(void);
AL_HIDDEN const char *graph_amp_env_name(int k, char *buf, size_t len);
AL_HIDDEN ir_amp_class graph_amp_env_class(int k);
AL_HIDDEN int graph_amp_list_class(alloy_amp_list list);
/* Writes a warning to `to` for each ALLOY_* variable of the environment
 * that alloy does not read, suggesting the nearest name; returns how many. */
AL_HIDDEN int graph_env_unknown(FILE *to);
/* graph_env_unknown(stderr), the first time it is called in a process. */
AL_HIDDEN void graph_env_warn_once(void);

/* compile.c (graph_compile_ir: compile_ir.c, in liballoy-runtime compile_bundle.c) */
/* Compiles g's built graph into g->compiled (and its schedule and plan)
 * unless it is already, opening the backend when none is open for it;
 * with device=auto the backend opens before the passes run, and they
 * compile for the device it chose. */
AL_HIDDEN alloy_status graph_compile(alloy_graph *g);

/* builder.c */
/* The builder's node constructor: op over handles xs with
 * attrs, the error on g (and NULL) when it fails, poison passed on. */
AL_HIDDEN alloy_tensor *graph_add_op(alloy_graph *g, int op, int n, alloy_tensor *const *xs, int nattrs,
                                     const ir_attr *attrs);
/* graph_add_op for an op whose result type the caller declares (a leaf,
 * a random draw). */
AL_HIDDEN alloy_tensor *graph_add_declared(alloy_graph *g, int op, int n, alloy_tensor *const *xs, int nattrs,
                                           const ir_attr *attrs, const ir_type *declared);
/* *t = dtype [dims[0..rank)] for op's builder; false with the error on g
 * for an unknown dtype or a bad rank. */
AL_HIDDEN bool graph_declared_type(alloy_graph *g, const char *op, alloy_dtype dtype, int rank, const int64_t *dims,
                                   ir_type *t);
/* The pass pipeline alone: g->compiled, its schedule and plan, from the
 * configuration (g->cfg) read now, with no backend opened (ahead-of-time
 * code generation needs no device); device=auto compiles for the backend
 * already open, else as for the CPU. A later graph_compile opens the
 * backend for what this compiled. */
AL_HIDDEN alloy_status graph_compile_ir(alloy_graph *g);
/* compile_ir.c (liballoy only): compiles g with the GPU's choices for what is
 * written or modelled for a GPU (a CUDA export, a bundle's CUDA images, the
 * cost model). A graph compiled with them already, one from a bundle, and one
 * whose device option is cpu are taken as they are; one not compiled, or
 * compiled under device=auto with the CPU's choices, is compiled (again) with
 * the GPU's, and *temporary says so: the caller drops that compile
 * (graph_invalidate, which keeps the state) when done, so that a run compiles
 * for its own device. */
AL_HIDDEN alloy_status graph_compile_for_gpu(alloy_graph *g, bool *temporary);
/* Drops the compiled step and its executable (after the graph or its
 * configuration changed); state stays. */
AL_HIDDEN void graph_invalidate(alloy_graph *g);
/* Makes g->exec an executable that keeps keep[0..nnodes) (NULL: only the
 * default keep set): the one kept for the default, or the one kept for the
 * last other keep set when it is the same, else built (and kept in place of
 * that other one). */
AL_HIDDEN alloy_status graph_exec_ready(alloy_graph *g, const uint8_t *keep);
/* Drops the executable and the input buffers (the backend's objects a run
 * makes again); the compiled step and the state stay. */
AL_HIDDEN void graph_drop_exec(alloy_graph *g);
/* Lets go of g's backend (after state_free_all): the last graph that
 * used it closes it. */
AL_HIDDEN void graph_release_device(alloy_graph *g);

/* train_api.c */
/* The nodes of compiled behind the step scalars into g->step_node. */
AL_HIDDEN void step_info_nodes(alloy_graph *g);
/* Fills g->step from the step scalars the run that just finished downloaded. */
AL_HIDDEN void step_info_capture(alloy_graph *g);
/* overflow.c */
/* Fills g->overflow after a run: the first node, in the order the run's
 * schedule ran, whose NONFINITE_* flags (per compiled node) are set;
 * checked says the backend did check. */
AL_HIDDEN void overflow_capture(alloy_graph *g, const uint8_t *flags, bool checked);
/* With run (the run's own amp_stats entries, or NULL), the report gains
 * the largest |x| among the flagged node's operands that have one. */
AL_HIDDEN void overflow_add_input_range(alloy_graph *g, const rt_range *run);
/* Whether compiled node id was computed by the backward or the update (an
 * origin, or the loss does not depend on it); mark: scratch of nnodes bytes. */
AL_HIDDEN bool overflow_is_backward(const ir_graph *c, int id, uint8_t *mark);

/* range_stats.c */
/* The amp_stats option's entries for a run of the compiled graph, zeroed
 * (the run's own: range_stats_merge adds them to those since the compile),
 * or NULL when it is off; ALLOY_ERR_OOM. */
AL_HIDDEN alloy_status range_stats_prepare(alloy_graph *g, rt_range **out);
/* Adds the run's entries to those since the compile. */
AL_HIDDEN void range_stats_merge(alloy_graph *g);
/* Drops them (a recompile). */
AL_HIDDEN void range_stats_drop(alloy_graph *g);
/* Adds the stats file at path (docs/amp.md, "The stats file") to the
 * entries of the compiled graph, each line matched to its value by name
 * and checked against its op and dtype; a bad file (named with its line)
 * changes nothing. */
AL_HIDDEN alloy_status range_stats_load(alloy_graph *g, const char *path);

/* ALLOY_ERR_DIVERGED with the message saying which stop rule ended the
 * run, at which step and scale, when the last run's step reached one;
 * ALLOY_OK otherwise. */
AL_HIDDEN alloy_status step_diverged(alloy_graph *g);

/* compile.c: compiles g when it is not, then creates and initializes a
 * state tensor for every param node still lacking one (state_init). */
AL_HIDDEN alloy_status state_ensure(alloy_graph *g);

/* state_api.c: alloy_graph_load_state from a safetensors file's bytes (a
 * bundle's initial state); where starts the messages. All or nothing. */
AL_HIDDEN alloy_status graph_load_state_memory(alloy_graph *g, const void *bytes, size_t len, const char *where);

/* state.c */
/* Creates and initializes the state tensors of g's compiled graph (the
 * part of state_ensure after the compile). */
AL_HIDDEN alloy_status state_init(alloy_graph *g);
/* s as a host tensor, its host copy brought up to date. */
AL_HIDDEN alloy_status state_describe(alloy_graph *g, rt_state *s, alloy_host_tensor *out);
/* The state tensor called name, or NULL. */
AL_HIDDEN rt_state *state_find(alloy_graph *g, const char *name);
/* The name of state tensor i (the state index's al_name_fn). */
AL_HIDDEN const char *state_index_name(const void *g, int i);
/* s->host, downloaded from its buffer first when stale. */
AL_HIDDEN alloy_status state_host(alloy_graph *g, rt_state *s);
/* Lets go of cell c of g: the last holder (of every graph sharing it)
 * frees its buffer and host copy. */
AL_HIDDEN void state_cell_release(alloy_graph *g, state_cell *c);
/* Lets go of every state tensor of g (freeing the cells no other graph
 * shares) and empties g's list. */
AL_HIDDEN void state_free_all(alloy_graph *g);
/* Moves every state tensor of g into buffers of backend `to`; on failure
 * nothing moved and `to` holds nothing. g's old backend stays open (the
 * caller closes it); only for a backend no other graph uses. */
AL_HIDDEN alloy_status state_move(alloy_graph *g, rt_backend *to);
/* Uploads data (s's dtype and shape) into s's buffer (made when s has
 * none), leaving its host copy as it is. */
AL_HIDDEN alloy_status state_upload_bytes(alloy_graph *g, rt_state *s, const void *data);
/* Writes data (s's dtype and shape) into s, buffer first, then its host
 * copy; on failure s keeps its value. */
AL_HIDDEN alloy_status state_write(alloy_graph *g, rt_state *s, const void *data);
/* Whether s is a param of g as built (not optimizer or scaler state). */
AL_HIDDEN bool state_is_param(const alloy_graph *g, const rt_state *s);

/* batch_counts.c: PyTorch's "<module>.num_batches_tracked" (i64 []) of
 * each batch_norm whose running mean is the state "<module>.running_mean".
 * alloy does not count batches (its batch_norm always has a momentum, so
 * nothing reads the count); params files carry the value a loaded file
 * gave (else 0) so a state_dict round-trips exactly. */
enum { BATCH_COUNT_NAME = 288 };
/* The counters' names of g's batch_norms into names[0..max), in node
 * order; returns how many there are (more than max: the rest not written). */
AL_HIDDEN int graph_batch_counts(const alloy_graph *g, char (*names)[BATCH_COUNT_NAME], int max);
/* Whether name is the counter of one of g's batch_norms. */
AL_HIDDEN bool graph_is_batch_count(const alloy_graph *g, const char *name);
/* The value kept for counter name; made (0) when make, else NULL when none
 * was kept; NULL when out of memory. */
AL_HIDDEN int64_t *graph_batch_count(alloy_graph *g, const char *name, bool make);
AL_HIDDEN void graph_batch_counts_free(alloy_graph *g);

/* state_check.c */
/* Checks the value data (s's dtype, one element) for a state tensor alloy
 * owns: the counters optim.step, step.skipped_steps, scaler.growth_tracker
 * and step.micro_batch >= 0 (the last two below growth_interval and
 * accumulation_steps when g has them), scaler.scale finite and >= 0,
 * optim.lr finite and >= 0,
 * scaler.found_inf_acc 0 or 1; other tensors pass. The error names the
 * tensor and the value, prefixed by where. */
AL_HIDDEN alloy_status state_check_value(alloy_graph *g, const rt_state *s, const void *data, const char *where);

/* graph_error.c */
/* Records the failure of the current call on g (status and message, the
 * most recent failure wins) and returns status. Every public call that
 * fails for a reason other than a builder call's records it here; builder
 * calls record on g->ir with ir_error (the first wins and poisons g). */
AL_HIDDEN alloy_status graph_fail(alloy_graph *g, alloy_status status, const char *fmt, ...)
    AL_PRINTF(3, 4);
/* ALLOY_OK when no builder call on g failed; else that first builder
 * error, recorded as the current call's failure (graph_fail). Calls that
 * need the built graph (run, compile, dump, save...) start with it, after
 * checking their own arguments. */
AL_HIDDEN alloy_status graph_built(alloy_graph *g);
/* The same for calls that take a const graph (inspection calls): the error
 * record is not part of the graph's value, so they may still set it. */
#define graph_fail_const(g, ...) graph_fail((alloy_graph *)(uintptr_t)(g), __VA_ARGS__)

#endif
