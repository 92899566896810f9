/* state_names.h - the names of the training state and outputs that the passes create and the graph object reads. */
#ifndef ALLOY_STATE_NAMES_H
#define ALLOY_STATE_NAMES_H

/* Names the training passes agree on (docs/training.md). */
#define STATE_SCALE "scaler.scale"           /* state f32[]: the loss scale */
#define STATE_TRACKER "scaler.growth_tracker" /* state i32[] */
#define STATE_FOUND_ACC "scaler.found_inf_acc" /* state bool[]: inf seen in this step's micro-batches */
#define STATE_MICRO "step.micro_batch"        /* state i32[]: micro-batches into this step */
#define STATE_SKIPPED "step.skipped_steps"    /* state i32[]: steps skipped for inf/NaN */
#define STATE_COUNT "optim.step"              /* state i32[]: optimizer updates applied */
#define STATE_BASE_LR "optim.lr"              /* state f64[]: the learning rate the schedule scales (alloy_graph_set_lr) */
#define OUT_FOUND_INF "step.found_inf"       /* output bool[]: this step's gradients were not finite */
#define OUT_APPLY "step.apply"               /* output bool[]: the optimizer updates this run */
#define OUT_NEXT_SCALE "scaler.next_scale"   /* output f32[] */
#define OUT_LR "step.lr"                     /* output f64[] */
#define OUT_GRAD_NORM "step.grad_norm"       /* output f64[]: global norm of unscaled gradients */

#endif
