/* state_names.h - the names of the training state and outputs that the passes create and the graph object reads. */
#ifndef ALLOY_STATE_NAMES_H
#define ALLOY_STATE_NAMES_H

/* Names the training passes agree on (docs/training.md). The builder
 * refuses them for the user's names (pass_reserved_name, passes/reserved.c),
 * so each name the passes make is spelt from these. */
#define GRAD_PREFIX "grad:"  /* output "grad:<name>": d loss / d <name> (autodiff) */
#define SCALER_NS "scaler."  /* the loss scaler's state and outputs */
#define STEP_NS "step."      /* the training step's state and outputs */
#define OPTIM_NS "optim."    /* the optimizer's state */
#define SUFFIX_MOMENT1 ".m"         /* state "<param>.m": Adam(W)'s first moment */
#define SUFFIX_MOMENT2 ".v"         /* state "<param>.v": Adam(W)'s second moment */
#define SUFFIX_MOMENTUM ".momentum" /* state "<param>.momentum": SGD's momentum buffer */
#define SUFFIX_GRAD_ACC ".grad_acc" /* state "<name>.grad_acc": a gradient summed over micro-batches */
#define STATE_SCALE SCALER_NS "scale"                /* state f32[]: the loss scale */
#define STATE_TRACKER SCALER_NS "growth_tracker"     /* state i32[] */
#define STATE_HYSTERESIS SCALER_NS "hysteresis_tracker" /* state i32[]: overflows left before a backoff (hysteresis > 1) */
#define STATE_CONSEC_SKIPS SCALER_NS "consecutive_skips" /* state i32[]: skipped steps in a row (a stop rule set) */
#define STATE_GOOD_SCALE SCALER_NS "good.scale"      /* state f32[]: the scale after the last good step (a stop rule set) */
#define STATE_GOOD_TRACKER SCALER_NS "good.growth_tracker"       /* state i32[]: likewise */
#define STATE_GOOD_HYSTERESIS SCALER_NS "good.hysteresis_tracker" /* state i32[]: likewise */
#define STATE_FOUND_ACC SCALER_NS "found_inf_acc"    /* state bool[]: inf seen in this step's micro-batches */
#define STATE_MICRO STEP_NS "micro_batch"            /* state i32[]: micro-batches into this step */
#define STATE_SKIPPED STEP_NS "skipped_steps"        /* state i32[]: steps skipped for inf/NaN */
#define STATE_COUNT OPTIM_NS "step"                  /* state i32[]: optimizer updates applied */
#define STATE_BASE_LR OPTIM_NS "lr" /* state f64[]: the learning rate the schedule scales (alloy_graph_set_lr) */
#define OUT_FOUND_INF STEP_NS "found_inf"            /* output bool[]: this step's gradients were not finite */
#define OUT_APPLY STEP_NS "apply"                    /* output bool[]: the optimizer updates this run */
#define OUT_NEXT_SCALE SCALER_NS "next_scale"        /* output f32[] */
#define OUT_LR STEP_NS "lr"                          /* output f64[] */
#define OUT_DIVERGED SCALER_NS "diverged" /* output i32[]: why the run stops here (DIVERGED_*), 0 = it goes on */
#define OUT_CONSEC STEP_NS "consecutive_skips" /* output i32[]: skipped steps in a row, this one included */
#define OUT_GRAD_NORM STEP_NS "grad_norm"            /* output f64[]: global norm of unscaled gradients */

/* OUT_DIVERGED's values. */
enum { DIVERGED_NO = 0, DIVERGED_SKIPS = 1, DIVERGED_MIN_SCALE = 2 };

#endif
