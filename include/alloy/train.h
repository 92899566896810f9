/* alloy/train.h - training graphs: the loss, which tensors get gradients, and fetching them. */
#ifndef ALLOY_TRAIN_H
#define ALLOY_TRAIN_H

#include "alloy/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes the floating-point scalar `loss` the graph's loss and turns
 * training on: the compiled step then also computes d loss / d p for every
 * trainable parameter p the loss depends on, fetchable as "grad:<p's name>"
 * (same dtype and shape as p; under AMP parameter gradients are f32).
 * Like every configuration call, a refused one (a non-scalar loss, a
 * tensor of another graph) returns the error and leaves g as it was. */
ALLOY_API alloy_status alloy_graph_set_loss(alloy_graph *g, alloy_tensor *loss);
/* Turns the backward off (an evaluation graph with a loss) or back on. */
ALLOY_API alloy_status alloy_graph_set_training(alloy_graph *g, bool training);
/* Asks for the gradient of an input as well: "grad:<input name>". */
ALLOY_API alloy_status alloy_graph_request_grad(alloy_graph *g, alloy_tensor *input);
/* Marks a parameter frozen: it gets no gradient (and no update). */
ALLOY_API alloy_status alloy_param_freeze(alloy_graph *g, alloy_tensor *param);

/* ---- loss scaling (docs/training.md; PyTorch GradScaler semantics) ---- */

typedef enum alloy_scaler_kind {
    ALLOY_SCALER_NONE = 0, /* no scaling (the default; bf16 needs none) */
    ALLOY_SCALER_DYNAMIC,
    ALLOY_SCALER_STATIC,
} alloy_scaler_kind;

typedef struct alloy_grad_scaler {
    alloy_scaler_kind kind;
    double init_scale;     /* 65536 */
    double growth_factor;  /* 2.0 */
    double backoff_factor; /* 0.5 */
    int growth_interval;   /* 2000 finite steps between growths */
    double min_scale;      /* lower bound after backoff; 0 = none (PyTorch) */
    /* Megatron's hysteresis: overflows counted down before the scale backs
     * off, refilled when the scale grows; 0 or 1 = back off on each (PyTorch). */
    int hysteresis;
    /* Stop rules (0/false = off, PyTorch): a run whose step reaches one
     * returns ALLOY_ERR_DIVERGED with the state of its last good step. */
    int max_consecutive_skips; /* this many skipped steps in a row; any kind */
    bool stop_at_min_scale;    /* DeepSpeed's min_scale: a backoff due with the scale already at
                                  min_scale (dynamic, needs min_scale > 0) */
} alloy_grad_scaler;

/* PyTorch GradScaler's defaults: 2^16, x2 every 2000 finite steps, x0.5 on
 * inf/NaN. */
ALLOY_API alloy_grad_scaler alloy_dynamic_scaler(void);
/* A constant scale; steps with inf/NaN gradients are still skipped. */
ALLOY_API alloy_grad_scaler alloy_static_scaler(double scale);
/* Scales the loss before the backward, unscales gradients in f32, skips the
 * whole update (parameters, moments, step counter) when any gradient is
 * inf/NaN, and updates the scale. Needs a loss. With bf16 AMP a scaler is
 * accepted and works, though bf16 does not need one (docs/training.md).
 * Every field the kind uses is checked: a NaN, an infinity or a value out of
 * its range is ALLOY_ERR_INVALID naming the field, and the scaler set
 * before stays (docs/errors.md). */
ALLOY_API alloy_status alloy_graph_set_grad_scaler(alloy_graph *g, alloy_grad_scaler scaler);

/* ---- optimizers (docs/training.md) ---- */

typedef enum alloy_optimizer_kind {
    ALLOY_OPTIM_SGD = 1,
    ALLOY_OPTIM_ADAM,  /* weight decay as L2 added to the gradient */
    ALLOY_OPTIM_ADAMW, /* decoupled weight decay */
} alloy_optimizer_kind;

/* Learning-rate schedules, computed in the step from t, the updates applied
 * so far (a skipped step does not move t), and lr, the base rate
 * (alloy_graph_set_lr changes it between steps); docs/training.md. */
typedef enum alloy_lr_schedule {
    ALLOY_LR_CONSTANT = 0,
    ALLOY_LR_WARMUP_LINEAR,       /* lr * min(1, (t+1)/warmup): linear warmup, then constant */
    ALLOY_LR_WARMUP_COSINE,       /* linear warmup, then cosine from lr to min_lr at total_steps */
    ALLOY_LR_WARMUP_LINEAR_DECAY, /* linear warmup, then linear from lr to min_lr at total_steps */
    ALLOY_LR_STEP,                /* lr * gamma^floor(t / step_size) (PyTorch's StepLR) */
    ALLOY_LR_MULTI_STEP,          /* lr * gamma^(milestones <= t) (PyTorch's MultiStepLR) */
    ALLOY_LR_ONE_CYCLE,           /* PyTorch's OneCycleLR, cosine annealing, two phases; lr is max_lr */
} alloy_lr_schedule;

#define ALLOY_MAX_MILESTONES 16

typedef struct alloy_optimizer {
    alloy_optimizer_kind kind;
    double lr;
    double momentum;     /* SGD */
    bool nesterov;       /* SGD */
    double beta1, beta2; /* Adam(W) */
    double eps;          /* Adam(W) */
    double weight_decay;
    alloy_lr_schedule schedule;
    int warmup_steps, total_steps;
    double min_lr;
    double clip_norm;       /* clip the global norm of the unscaled gradients; 0 = off */
    int accumulation_steps; /* micro-batches per update; 1 = update on every run */
    double gamma;           /* STEP, MULTI_STEP: the factor of each decay; 0 = 0.1 (PyTorch's) */
    int step_size;          /* STEP: updates between decays */
    int milestones[ALLOY_MAX_MILESTONES]; /* MULTI_STEP: increasing update counts where lr *= gamma */
    int nmilestones;
    double pct_start;        /* ONE_CYCLE: the rising share of total_steps; 0 = 0.3 (PyTorch's) */
    double div_factor;       /* ONE_CYCLE: start at lr / div_factor; 0 = 25 */
    double final_div_factor; /* ONE_CYCLE: end at lr / div_factor / final_div_factor; 0 = 1e4 */
} alloy_optimizer;

ALLOY_API alloy_optimizer alloy_sgd(double lr, double momentum, double weight_decay, bool nesterov);
ALLOY_API alloy_optimizer alloy_adam(double lr, double beta1, double beta2, double eps,
                                     double weight_decay);
ALLOY_API alloy_optimizer alloy_adamw(double lr, double beta1, double beta2, double eps,
                                      double weight_decay);
/* Adds the update of every trainable parameter to the step: state tensors
 * for moments ("<p>.m", "<p>.v" or "<p>.momentum"), the step counter
 * ("optim.step", i32) and the base learning rate ("optim.lr", f64) are
 * created, saved and loaded with the rest. Every field the kind and the
 * schedule use is checked as set_grad_scaler's are: rates, decay,
 * momentum, min_lr and clip_norm finite and >= 0, betas in [0, 1), eps
 * finite and > 0, step counts >= 0 (accumulation_steps 0 counts as 1),
 * the schedule's own fields (docs/training.md); a refused call leaves g
 * as it was. A second call replaces the optimizer at the next compile:
 * moments and the step counter of the same names are kept, so changing
 * the schedule continues the run, and optim.lr takes the new lr. */
ALLOY_API alloy_status alloy_graph_add_optimizer(alloy_graph *g, alloy_optimizer opt);
/* Sets the base learning rate (the schedule's lr) for the next steps: the
 * state "optim.lr" is written, the compiled step stays (no recompile).
 * lr must be finite and >= 0, g must have an optimizer; a refused call
 * changes nothing. A loaded checkpoint brings its own optim.lr. */
ALLOY_API alloy_status alloy_graph_set_lr(alloy_graph *g, double lr);
/* A parameter group: the params whose names match `patterns`, a
 * comma-separated list of globs ('*' any run of characters, dots too; '?'
 * any one; "*.bias,*norm*", or exact names "fc1.bias, fc2.bias"), train
 * with lr * lr_scale (the schedule's rate, scaled) and with weight decay
 * only when weight_decay (the usual: none on biases and norms). A param in
 * several groups takes the last call's. Every pattern must match a param
 * of g as built (a typo is ALLOY_ERR_NOT_FOUND naming the pattern);
 * lr_scale must be finite and >= 0; a refused call changes nothing. The
 * groups apply at the next compile (any optimizer, added before or after). */
ALLOY_API alloy_status alloy_graph_set_param_group(alloy_graph *g, const char *patterns, double lr_scale,
                                                   bool weight_decay);

/* What the last run of a training step did. */
typedef struct alloy_step_info {
    double loss;            /* the (unscaled) loss */
    bool skipped;           /* inf/NaN gradients: nothing was updated */
    double scale;           /* the loss scale used by this step (1 without a scaler) */
    double next_scale;      /* the scale the next step will use */
    int64_t step;           /* optimizer steps taken so far (not counting skipped ones) */
    int64_t skipped_steps;  /* skipped steps since the graph was created or loaded */
    double lr;              /* learning rate of this step */
    double grad_norm;       /* global norm of the unscaled gradients (inf or NaN when a gradient is) */
    bool updated;           /* an update happened (false inside gradient accumulation) */
    int consecutive_skips;  /* skipped steps in a row, this one included (kept with a stop rule only) */
    bool diverged;          /* a stop rule ended the run here: the run returned ALLOY_ERR_DIVERGED */
} alloy_step_info;

/* What the last alloy_graph_run of g did; ALLOY_ERR_INVALID ("has run no
 * step yet") before the first run, when there is nothing to report. */
ALLOY_API alloy_status alloy_graph_step_info(const alloy_graph *g, alloy_step_info *out);

/* The overflow locator (the amp_check option, docs/amp.md "When a step
 * overflows"): with amp_check=1 a run flags every float value it computes
 * that holds an inf or NaN, and this says which came first in the order
 * the step ran. */
typedef struct alloy_overflow_info {
    bool checked;        /* the last run checked (amp_check on a backend that does: the CPU) */
    bool found;          /* some checked value held an inf or NaN; the fields below are its */
    bool has_inf, has_nan;
    char node[64];       /* the node as the compiled IR prints it: "%812", "%logits" */
    const char *op;      /* "mul" */
    alloy_dtype dtype;
    int rank;
    int64_t dims[ALLOY_MAX_RANK];
    bool backward;       /* computed by the backward (or the update), not the forward */
    char forward_node[64]; /* backward: the forward node whose gradient rule made it ("" unknown) */
    const char *forward_op; /* and its op (NULL unknown) */
    char param[128];     /* backward: the first parameter (or input) whose gradient it feeds ("" none) */
    double scale, next_scale; /* the loss scale of the step, and the next one */
    char summary[512];   /* one line: "first inf at %812 mul f16[64,256] (backward of gelu %230, gradient of
                            'w1'), scale 65536 -> 32768"; with input_max_known, ", inputs max |x| 7.1e+04"
                            before the scale */
    /* amp_stats on: the largest |x| (a NaN aside) among the node's operands
     * that the statistics track (computed f16/bf16 values), in this run;
     * input_max_known false when none of them is (or amp_stats is off) */
    bool input_max_known;
    double input_max_abs;
} alloy_overflow_info;

/* What the locator found in the last run (found false when nothing or
 * when the run did not check). */
ALLOY_API alloy_status alloy_graph_overflow_info(const alloy_graph *g, alloy_overflow_info *out);

/* Saves all state (parameters, moments, step, scale, growth tracker) to one
 * safetensors file, atomically (temp file + rename), with a checksum in its
 * metadata; load checks the checksum, names, dtypes and shapes of every
 * tensor and the values of the counters and the scale before changing
 * anything. Same as alloy_graph_save_state / alloy_graph_load_state.
 * Under ZeRO-1 (alloy/distributed.h) saving is a collective: every rank
 * calls it, the moments' shards are gathered and rank 0 writes the layout
 * one process writes; loading gives each rank its shard. Gradient
 * accumulation's state may be absent from the file, or present and absent
 * from the graph when it is zero (a step's boundary). */
ALLOY_API alloy_status alloy_graph_save_checkpoint(alloy_graph *g, const char *path);
ALLOY_API alloy_status alloy_graph_load_checkpoint(alloy_graph *g, const char *path);

#ifdef __cplusplus
}
#endif
#endif
