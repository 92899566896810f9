/* graph_impl.h - what an alloy_graph holds: the built IR, its state, the compiled step. */
#ifndef ALLOY_GRAPH_IMPL_H
#define ALLOY_GRAPH_IMPL_H

#include "alloy/graph.h"
#include "alloy/train.h"
#include "ir/ir.h"
#include "passes/pass.h"
#include "runtime/cpu/cpu.h"

/* One state tensor (a parameter; later optimizer moments and scaler state). */
typedef struct rt_state {
    char *name;
    ir_type type;
    void *data;
} rt_state;

/* One option set through the API (alloy_graph_set_option). */
typedef struct graph_option {
    char *name, *value;
} graph_option;

struct alloy_graph {
    ir_graph *ir;       /* as built; builder errors live in ir->status/error */
    ir_graph *compiled; /* after the pass pipeline; NULL until compiled */
    rt_tensor *values;  /* the last run's values over compiled->nodes */
    bool values_in_arena; /* the last run's values live in arena (own nothing) */
    /* The CPU arena of compiled: allocated once and reused on every run;
     * plan is for the keep set plan_keep (outputs, updates, loss and the
     * fetches of the run that planned it), rebuilt only when that changes. */
    mem_plan plan;
    bool *plan_keep;   /* compiled->nnodes flags; NULL: no plan */
    void *arena_block; /* al_malloc'd; arena is it rounded up to PLAN_ALIGN */
    char *arena;
    size_t arena_cap;  /* usable bytes at arena */
    void **snapshots;   /* copies of fetched state taken before the run's updates */
    int nsnapshots;
    rt_state *state;
    int nstate, state_cap;
    bool state_ready; /* every param/state leaf of compiled has its state tensor */
    int *state_of_node;   /* per compiled node: index in state[] of its param/state, else -1 */
    int *state_of_update; /* per compiled update: index in state[] of its target */
    uint64_t seed;
    amp_config amp;             /* lists and dtype as the user set them */
    alloy_amp_report amp_report; /* from the last compile */
    bool training;               /* build the backward (set with the loss) */
    alloy_grad_scaler scaler;    /* kind NONE unless set */
    alloy_optimizer optimizer;   /* kind 0 unless an optimizer was added */
    alloy_step_info step;        /* what the last run did */
    graph_option *options;       /* alloy_graph_set_option's settings, over the environment's */
    int noptions;
    al_options cfg;              /* the configuration of the last compile (graph_options) */
    FILE *print_to;              /* where printed passes go (NULL: stderr) */
    char **grad_inputs;          /* inputs whose gradients were asked for */
    int ngrad_inputs;
    alloy_status status; /* last failing call's status, message below */
    char error[1024];
};

/* config.c */
/* The configuration: defaults, then the environment (ALLOY_*), then the
 * options set on g. An invalid environment value is an error naming the
 * variable and listing the valid values. */
AL_HIDDEN alloy_status graph_options(alloy_graph *g, al_options *cfg);
AL_HIDDEN void graph_options_free(alloy_graph *g);

/* amp_api.c */
/* The options for compiling g: its AMP config with the environment's list
 * edits (ALLOY_AMP_*LIST_{ADD,REMOVE}) applied on top. */
AL_HIDDEN alloy_status graph_pass_options(alloy_graph *g, pass_options *opts);

/* run.c */
/* Compiles g's built graph into g->compiled unless it is already. */
AL_HIDDEN alloy_status graph_compile(alloy_graph *g);
/* Drops the compiled step (after the graph or its configuration changed). */
AL_HIDDEN void graph_invalidate(alloy_graph *g);

/* train_api.c */
/* Fills g->step from the values of the run that just finished. */
AL_HIDDEN void step_info_capture(alloy_graph *g);

/* state.c */
/* Creates and initializes a state tensor for every param node still lacking one. */
AL_HIDDEN alloy_status state_ensure(alloy_graph *g);
/* The state tensor called name, or NULL. */
AL_HIDDEN rt_state *state_find(alloy_graph *g, const char *name);
AL_HIDDEN void state_free_all(alloy_graph *g);

/* Records an error on g's run status (the builder's first error stays in ir). */
AL_HIDDEN alloy_status graph_fail(alloy_graph *g, alloy_status status, const char *fmt, ...)
    AL_PRINTF(3, 4);

#endif
