/* alloyc.h - what the alloyc driver's files share: the parsed command line and the error and graph helpers of alloyc_graph.c. */
#ifndef ALLOYC_H
#define ALLOYC_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "alloy/alloy.h"

enum { EXIT_ERROR = 1, EXIT_USAGE = 2 };

/* What print writes (--emit). */
typedef enum emit_kind { EMIT_IR, EMIT_DOT, EMIT_SVG, EMIT_MEMORY_SVG } emit_kind;

/* The command line, as alloyc_parse_args (alloyc_args.c) reads and checks it. */
typedef struct options {
    const char *command; /* "print", "run", "compile", "train", "cost" or "amp-report" */
    const char *ir_path;
    const char **feeds; /* NAME=FILE or FILE, as given */
    int nfeeds;
    const char **fetches;
    int nfetches;
    const char *params, *out;
    bool have_seed;
    uint64_t seed;
    const char *misplaced; /* the first option seen that the command does not take */
    unsigned misplaced_commands; /* the commands that take it */
    const char *arch; /* compile: the --arch list, as given */
    alloy_dtype amp;      /* ALLOY_F32: off */
    bool amp_given;       /* --amp was on the command line */
    bool train;
    const char *optimizer, *scaler, *print_after, *print_before;
    emit_kind emit;       /* print's --emit */
    bool bundle;          /* compile: --emit=bundle, or -o FILE.alloy without --emit */
    bool with_state;      /* compile: --with-state, the bundle carries its initial state */
    bool emit_given;
    bool time_passes;     /* --time-passes */
    const char *dump_dir; /* --dump-dir */
    const char **sets; /* NAME=VALUE of --set, in order */
    int nsets;
    /* the optimizer's hyper-parameters (print, compile, train); have_* when given */
    double lr, weight_decay, momentum, clip_norm;
    bool have_lr, have_weight_decay, have_momentum, have_clip_norm;
    const char *loss;       /* --loss NAME: the node to train on instead of the IR's loss line */
    /* train */
    long steps;             /* --steps N: steps to run in this invocation */
    long save_every;        /* --save-every K: also save the checkpoint every K steps; 0: at the end only */
    long log_every;         /* --log-every K: a progress line every K steps (and the last); 0: not given */
    const char *checkpoint; /* --checkpoint FILE: resume from it if it exists, save it at the end */
    const char *save_params; /* --save-params FILE: write the parameters alone at the end */
    const char *amp_stats;  /* --amp-stats FILE: range statistics over the steps, printed and written at the end */
    /* cost */
    const char *cost_device; /* --device h100|h200: the constants (NULL: h100) */
    const char *calibrate;   /* --calibrate FILE: an ALLOY_PROFILE table to fit the constants to */
    long top;                /* --top N: the slowest launches listed (0: 15) */
    bool all;                /* --all: list every launch */
    /* amp-report */
    const char *stats;       /* --stats FILE: a stats file to colour by and print */
    bool data_parallel;     /* --data-parallel: one rank of the processes mpirun started (docs/distributed.md) */
    bool zero;              /* --zero: with --data-parallel, ZeRO-1 (each rank its shard of the moments) */
} options;

/* Prints "alloyc: <message>" as one line on stderr (control characters in
 * the message become spaces) and returns code. */
int alloyc_vfail(int code, const char *fmt, va_list ap);
/* alloyc_vfail with the arguments given. */
int alloyc_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The scaler of --scaler's text (dynamic or static:S, then ,KEY=VALUE
 * options; not "none"): true and *out, or false with why filled. */
bool alloyc_scaler(const char *text, alloy_grad_scaler *out, char *why, size_t whylen);
/* The message that goes with a failed call on g, with the API's names for
 * what alloyc has a flag for said as the flag (valid until the next call). */
const char *alloyc_graph_error(const alloy_graph *g, alloy_status st);
/* Reads and parses the IR file; NULL after printing the reader's or
 * parser's message. */
alloy_graph *alloyc_load_graph(const char *path);
/* Applies --time-passes, --dump-dir, then every --set NAME=VALUE to g (a
 * --set wins); returns the first failing status. */
alloy_status alloyc_apply_sets(alloy_graph *g, const options *o);
/* The optimizer --optimizer (adamw when not given), --lr, --weight-decay,
 * --momentum and --clip-norm describe. */
alloy_optimizer alloyc_optimizer(const options *o);
/* Makes --loss NAME g's loss (alloy_graph_set_loss: training on); an exit
 * code after printing. */
int alloyc_set_loss(alloy_graph *g, const options *o);

/* alloyc_params.c: --params FILE into g, strict as PyTorch's
 * load_state_dict(strict=True): every tensor of FILE a parameter or
 * running statistic of g (or a batch_norm's num_batches_tracked), every one
 * of those in FILE; each refusal names the tensors. *loaded (may be NULL):
 * the tensors loaded. An exit code after printing. */
int alloyc_load_params(alloy_graph *g, const char *path, const char *ir_path, int *loaded);
/* --save-params FILE: g's parameters and running statistics alone
 * (alloy_graph_save_params); an exit code after printing. */
int alloyc_save_params(alloy_graph *g, const char *path);

/* alloyc_args.c: fills o from argv; returns 0, or an exit code after
 * printing (help, version or a usage error). *done is set when the program
 * should exit. */
int alloyc_parse_args(int argc, char **argv, options *o, bool *done);

/* alloyc_usage.c: prints the help text (alloyc --help) on stdout. */
void alloyc_print_usage(void);

/* alloyc.c: applies the compile options (--amp, --train, --optimizer,
 * --scaler, --print-after, --print-before, then --set) to g; returns the
 * first failing status. */
alloy_status alloyc_configure(alloy_graph *g, const options *o);

/* alloyc_cost.c: the cost command; an exit code. */
int alloyc_cost(const options *o);

/* alloyc_amp.c: the amp-report command; an exit code. */
int alloyc_amp_report(const options *o);

/* alloyc_train.c: the train command; an exit code. */
int alloyc_train(const options *o);

#endif
