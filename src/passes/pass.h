/* pass.h - the pass manager: a pipeline of named graph-to-graph passes, with printing, verifying and timing. */
#ifndef ALLOY_PASS_H
#define ALLOY_PASS_H

#include "ir/ir.h"
#include "step/amp_config.h"
#include "step/compiled.h"
#include "step/options.h"
#include "step/param_group.h"
#include "step/pipeline.h"
#include "step/state_names.h"

/* The training setup a pass reads (include/alloy/amp.h, train.h): only the
 * passes that read inside one include those headers. */
struct alloy_amp_report;
struct alloy_grad_scaler;
struct alloy_optimizer;
struct ad_ctx; /* passes/grad_rules.h */


/* param_groups.c */
/* Whether name matches the glob pat[0..len): '*' any run of characters
 * (dots too), '?' any one, every other character itself. */
AL_HIDDEN bool pg_glob(const char *pat, size_t len, const char *name);
/* The next item of a comma-separated pattern list at *p (spaces around it
 * trimmed): its start and length, *p moved past it; false at the end. */
AL_HIDDEN bool pg_next(const char **p, const char **item, size_t *len);
/* Whether name matches one of patterns' items. */
AL_HIDDEN bool pg_match(const char *patterns, const char *name);
/* The lr_scale and decay of param name: from the last of groups[0..n)
 * that matches it, else 1 and true. */
AL_HIDDEN void pg_lookup(const param_group *groups, int n, const char *name, double *lr_scale, bool *decay);

/* data_parallel.c: ZeRO-1's shards. A tensor of n elements is flattened
 * and padded with zeros to world * s elements, s = ceil(n / world); rank r
 * holds elements [r s, (r+1) s) of that. */
/* s, the shard length of n elements over world ranks. */
AL_HIDDEN int64_t dp_shard_len(int64_t n, int world);
/* x (any shape) flattened and padded with zeros to world * s elements. */
AL_HIDDEN int dp_flat_padded(struct ad_ctx *c, int x, int world);
/* This rank's shard of x: elements [rank s, (rank+1) s) of dp_flat_padded(x). */
AL_HIDDEN int dp_shard_of(struct ad_ctx *c, int x, int world, int rank);
/* The whole tensor of type t from every rank's shard (all_gather, then the
 * padding cut off and t's shape restored). */
AL_HIDDEN int dp_unshard(struct ad_ctx *c, int shard, const ir_type *t, int world);

/* The state `name` (zeros) holding this rank's shard of a tensor of type
 * whole: [dp_shard_len] elements, marked shard_of=whole's dims so that
 * checkpoints gather and scatter it; its id (or the existing node's). */
AL_HIDDEN int dp_state_shard(ir_graph *g, const char *name, const ir_type *whole, int world);

/* Options every pass may read; filled from the alloy_graph's configuration. */
typedef struct pass_options {
    amp_config amp;
    struct alloy_amp_report *amp_report; /* filled by the amp pass when non-NULL */
    FILE *log;                    /* where ALLOY_AMP_LOG and print-after go (stderr if NULL) */
    bool train;                   /* build the backward from the loss */
    const char *const *grad_inputs; /* inputs whose gradients are wanted too */
    int ngrad_inputs;
    int loss_seed;                /* node id seeding the backward, or -1 for 1.0 */
    const struct alloy_grad_scaler *scaler; /* NULL or kind NONE: no loss scaling */
    const struct alloy_optimizer *optimizer; /* NULL or kind 0: no optimizer */
    const param_group *groups;    /* per-parameter lr scale and decay, the last match wins */
    int ngroups;
    uint64_t seed;                /* the graph's seed: random ops built without one draw from it */
    int dp_world;                 /* data-parallel ranks (0: not data-parallel; 1 runs the collectives alone) */
    int dp_rank;                  /* this process's rank among them (random ops are keyed by it) */
    size_t dp_bucket_bytes;       /* gradients all-reduced per bucket of about this many bytes */
    int dp_zero;                  /* ZeRO stage: 1 shards gradients, moments and the update (data_parallel.c) */
    const al_options *cfg;        /* the configuration (NULL: defaults); read it through pass_cfg */
} pass_options;

/* opts->cfg, or the defaults when it is NULL. */
AL_HIDDEN const al_options *pass_cfg(const pass_options *opts);


/* A pass. A graph pass (run) takes *g and leaves the result in *g (it may
 * replace the graph, freeing the old one); a compiling pass (build) reads
 * the graph and fills part of *c. Both return ALLOY_OK or an error recorded
 * on the graph. */
typedef struct pass {
    const char *name;
    alloy_status (*run)(ir_graph **g, const pass_options *opts);
    alloy_status (*build)(ir_graph *g, const pass_options *opts, pass_compiled *c);
} pass;


/* Runs the standard pipeline on *g, skipping the passes opts->cfg disables,
 * except that a training step refuses (ALLOY_ERR_INVALID, naming the pass)
 * to skip autodiff, grad_scaler while it has a loss scaler or accumulates,
 * or optimizer while it has one. After each pass the
 * graph is verified; the passes in cfg->print_before / print_after are
 * printed to `log` (stderr if NULL) with a "# before <pass>" / "# after
 * <pass>" header and the options line. With cfg->dump_dir each stage
 * also goes to its own file there, written atomically: the graph the
 * pipeline starts from as "GRAPH.00-input.ir", the graph after pass i
 * (printed as print_after prints it) as "GRAPH.NN-<pass>.ir" with NN = i + 1;
 * a disabled pass's file is removed (docs/inspect.md). With
 * cfg->time_passes a table of each pass's time and node count goes to
 * `log` at the end (also after a failure). log is flushed after each
 * print: a write that fails (a full disk, a closed descriptor) fails the
 * run with ALLOY_ERR_IO naming the option. timings (may be NULL) gets up to max
 * entries, *ntimings the count. *out (may be NULL) gets the schedule and
 * plan (pass_compiled_free). On error *g holds the graph with the error
 * recorded and *out is empty. */
AL_HIDDEN alloy_status pass_run_pipeline(ir_graph **g, const pass_options *opts, pass_compiled *out,
                                         FILE *log, pass_timing *timings, int max, int *ntimings);

/* amp_ranges.c: a stats file (docs/amp.md, "The stats file") as the amp
 * pass reads it for range-aware colouring: the forward values', by name. */
typedef struct amp_range {
    char *name; /* the node's name, without the '%' */
    double max; /* its observed max |x| */
} amp_range;
typedef struct amp_ranges {
    amp_range *entries; /* sorted by name, each name once */
    int n;
} amp_ranges;
/* Reads path into *out; a missing or unreadable file, or a line that is not
 * a value's, is an error on g naming path and the line. */
AL_HIDDEN alloy_status amp_ranges_load(ir_graph *g, const char *path, amp_ranges *out);
/* The entry of the node named name, or NULL. */
AL_HIDDEN const amp_range *amp_ranges_find(const amp_ranges *r, const char *name);
AL_HIDDEN void amp_ranges_free(amp_ranges *r);

/* The passes (one file each). */
AL_HIDDEN alloy_status pass_amp(ir_graph **g, const pass_options *opts);      /* amp.c */
AL_HIDDEN alloy_status pass_autodiff(ir_graph **g, const pass_options *opts); /* autodiff.c */
AL_HIDDEN alloy_status pass_data_parallel(ir_graph **g, const pass_options *opts); /* data_parallel.c */
AL_HIDDEN alloy_status pass_dce(ir_graph **g, const pass_options *opts);      /* dce.c */
/* Clones a softmax (and the casts and causal masks before it) in front of a softmax_grad reading it when the clone reads a narrower stored value, an unscale in front of the update, and (CPU) a half-precision cast in front of the backward (remat.c). */
AL_HIDDEN alloy_status pass_remat(ir_graph **g, const pass_options *opts);    /* remat.c */
/* The remat pass's cast rule (remat_casts.c): clones, in front of the first
 * backward reader of each half-precision cast the forward makes, the cast
 * (and the layer_norm/rms_norm it casts) when the clone's operands are live
 * there anyway, and makes the backward read the clone; records the clones
 * in before[]/count[] as pass_remat orders them (a node that already has
 * clones before it gets none). Returns how many casts it cloned; on OOM
 * sets g's error and returns 0. */
AL_HIDDEN int remat_casts(ir_graph *g, int n0, int *before, int *count); /* remat_casts.c */
AL_HIDDEN alloy_status pass_grad_scaler(ir_graph **g, const pass_options *opts); /* grad_scaler.c */
AL_HIDDEN alloy_status pass_optimizer(ir_graph **g, const pass_options *opts);   /* optimizer.c */
AL_HIDDEN alloy_status pass_random(ir_graph **g, const pass_options *opts);      /* random.c */
AL_HIDDEN alloy_status pass_lower_norm(ir_graph **g, const pass_options *opts);  /* lower_norm.c */
AL_HIDDEN alloy_status pass_simplify(ir_graph **g, const pass_options *opts);    /* simplify.c */
/* Whether simplify's constant folding replaces a node of g with these
 * operands and type by a constant: every operand a constant, all within
 * the folding limits (the amp report leaves such casts out). */
AL_HIDDEN bool simplify_folds(const ir_graph *g, int nin, const int *in, const ir_type *type);
AL_HIDDEN alloy_status pass_fuse(ir_graph **g, const pass_options *opts);        /* fuse.c */
AL_HIDDEN alloy_status pass_fuse_attention(ir_graph **g, const pass_options *opts); /* fuse_attention.c */
/* Autodiff's last step (place_statistics.c): the per-row statistics its
 * rules kept (ir_row_keeps) of a forward tensor x, appended after node
 * nfwd, move right after the last forward row op reading x row by row (or
 * after x), so that op's row group computes and stores them. */
AL_HIDDEN alloy_status ad_place_statistics(ir_graph **gp, int nfwd);
/* fuse_siblings.c, for fuse.c: joins row groups (label[]: node -> group name,
 * -1 none; a lone row op counts as a group) of one iteration shape that read
 * a tensor row by row, where legal, given the readers of node i as
 * rlist[rstart[i] .. rstart[i + 1]) in ascending order; false when out of
 * memory. */
AL_HIDDEN bool fuse_row_siblings(const ir_graph *g, int *label, const int *rstart, const int *rlist);
/* The members of each group of label[0..nn) in id order: first[name] the
 * first (-1 none), next[member] the next (-1 at the end), last[name] the
 * last (fuse_siblings.c; the sibling and column-sum rules walk them). */
AL_HIDDEN void fuse_member_lists(const int *label, int nn, int *first, int *next, int *last);
/* fuse_casts.c, for fuse.c: moves the casts of f32 params to f16/bf16
 * (when there are two or more) to the front of *gp, after every param
 * and every state leaf before the last param (the leaves in their own
 * order), and replaces *gp; the error recorded on the graph when out of
 * memory. */
AL_HIDDEN alloy_status fuse_hoist_param_casts(ir_graph **gp);
/* fuse_casts.c: makes the param casts in no group (label -1) one group, as
 * fuse_hoist_param_casts placed them (so it is legal: every reader comes
 * after the last of them). */
AL_HIDDEN void fuse_group_param_casts(const ir_graph *g, int *label);
/* fuse_norm.c, for fuse.c: moves each sum_squares whose operands are all
 * f32 operands of an earlier found_inf right before that found_inf, and
 * replaces *gp; the error recorded on the graph when out of memory. */
AL_HIDDEN alloy_status fuse_hoist_sum_squares(ir_graph **gp);
/* fuse_norm.c: *fits says whether the operands of sum_squares s that are
 * in found_inf fi's group (label[x] == label[fi]) lie each in a chain of
 * their own (members joined by reading one another), so that the multi
 * kernel sums each alone; false when out of memory. */
AL_HIDDEN bool fuse_norm_fits(const ir_graph *g, const int *label, int fi, int s, bool *fits);
/* fuse_colsum.c: reduce_sums over the rows of a row group's [rows, C]
 * value (ir_fuse_colsum) join that group where legal; same arguments;
 * false when out of memory. */
AL_HIDDEN bool fuse_row_colsums(const ir_graph *g, int *label, const int *rstart, const int *rlist);
/* fuse_multi.c, for fuse.c: joins found_inf fi with the unscale chains of
 * the gradients it reads (and the sum_squares of the gradient norm right
 * before it, fuse_norm.c) into one multi group, given min_reader[i] the
 * first reader of node i; mark: scratch of nnodes bytes, zero on entry and
 * on return; false when out of memory. */
AL_HIDDEN bool fuse_multi_found_inf(const ir_graph *g, int fi, const int *min_reader, int *label, uint8_t *mark);
/* fuse_multi.c: merges the elementwise groups that compute parameter
 * updates alike (the same shape of computation, signature by signature)
 * into multi groups; false when out of memory. */
AL_HIDDEN bool fuse_multi_updates(const ir_graph *g, int *label);

/* reserved.c: whether the user may not give the name `name` (used as
 * `use`) in ir, because the training passes make it (step/state_names.h):
 * any name starting with GRAD_PREFIX or a namespace there; for a node, "<p>"
 * SUFFIX_* while p is an input or param of ir; for a new input or param p,
 * p while a node "<p>" SUFFIX_* exists. True with the reason in why. */
typedef enum pass_name_use { PASS_NAME_OUTPUT, PASS_NAME_NODE, PASS_NAME_LEAF } pass_name_use;
AL_HIDDEN bool pass_reserved_name(const ir_graph *ir, const char *name, pass_name_use use, char *why, size_t whylen);

/* A state leaf (created once per graph, initialized to value) named name. */
AL_HIDDEN int pass_state_leaf(ir_graph *g, const char *name, alloy_dtype dtype, int rank,
                              const int64_t *dims, double value);

#endif
