/* fuzz_support.h - what the fuzz targets and their seed generator share: scratch files, CPU options, the training models, feeds, the builder program's opcodes. */
#ifndef ALLOY_FUZZ_SUPPORT_H
#define ALLOY_FUZZ_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloy/alloy.h"

/* The largest tensor (elements) a target compiles and runs: bigger graphs
 * are only built and checked, so no input needs more than a few MB. */
#define FUZZ_MAX_NUMEL 4096
#define FUZZ_MAX_NODES 512

/* Reports a broken property (not a returned error: alloy refusing bad input
 * is the expected outcome) and aborts, which libFuzzer records as a crash. */
_Noreturn void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A path for `name` in this process's scratch directory (/dev/shm when
 * writable, else $TMPDIR or /tmp), made on first use and removed at exit. */
const char *fuzz_tmp_path(const char *name);
/* Writes size bytes to path (truncating); false on failure. */
bool fuzz_write_file(const char *path, const void *data, size_t size);

/* Options that keep a target on the instrumented CPU code, deterministic and
 * quick: device=cpu, no kernel cache, one thread, alloy's own GEMM. */
void fuzz_cpu_options(alloy_graph *g);

/* True when every node of g's built graph has at most FUZZ_MAX_NUMEL
 * elements (and a valid shape) and g has at most FUZZ_MAX_NODES nodes. */
bool fuzz_graph_small(const alloy_graph *g);

/* True when no builder call on g has failed (alloy_graph_status also
 * reports the last failed run). */
bool fuzz_built_ok(const alloy_graph *g);

/* FNV-1a over n bytes, continuing from h (start with 14695981039346656037). */
uint64_t fuzz_hash(uint64_t h, const void *p, size_t n);

/* Feeds for every input of g (as alloy_graph_input_at gives them), data from
 * a generator seeded with `seed`: floats in [-2, 2] (with an inf or NaN now
 * and then when seed is odd), integers 0 or 1 (in [-1, 8] when seed is odd:
 * out-of-range ids and classes), bools 0/1. *out and each
 * data are malloc'd; fuzz_feeds_free releases them. Returns the count, -1
 * when an input is too big or out of memory. */
int fuzz_make_feeds(alloy_graph *g, uint64_t seed, alloy_host_tensor **out);
void fuzz_feeds_free(alloy_host_tensor *feeds, int n);

/* Runs g once with fuzz_make_feeds(seed), fetching every output, and reads
 * every fetched byte (ASan checks the sizes run reported). A failing run
 * must leave a message. Returns the run's status. */
alloy_status fuzz_run_once(alloy_graph *g, uint64_t seed);

/* ---- the checkpoint target's training graphs ---- */

enum { FUZZ_TRAIN_MODELS = 3 };
/* A small classifier MLP with a loss, compiled for training on the CPU:
 * 0: f16 AMP, dynamic scaler, AdamW with warmup-cosine and clipping;
 * 1: f32, SGD with Nesterov momentum, two micro-batches per update;
 * 2: bf16 AMP, static scaler, Adam, a layer norm. NULL on failure. */
alloy_graph *fuzz_train_model(int variant);
/* The two feeds ("x" f32[4,3], "y" i32[4]) a step of those models takes. */
void fuzz_train_feeds(alloy_host_tensor feeds[2]);

/* ---- the builder target's program (fuzz_builder.c reads it, fuzz_seeds.c writes seeds) ----
 * A program is a sequence of one-byte opcodes (taken modulo FB_COUNT), each
 * followed by its arguments: tensors as one byte (0 = the newest made, 1 the
 * one before, ...; 255 = NULL), dtypes as one byte (values past the last are
 * passed on as invalid), ranks as a byte (0..15; 8 is the most alloy takes),
 * dims and integers as fuzz_int bytes, doubles as fuzz_real bytes, names as a
 * length byte (255 = NULL) and that many characters. A missing byte reads 0. */
enum fuzz_builder_op {
    FB_INPUT,         /* name dtype rank dims... */
    FB_PARAM,         /* name dtype rank dims... init-kind a b */
    FB_CONSTANT,      /* dtype rank dims... values... (numel of them, when small) */
    FB_FULL,          /* dtype rank dims... value */
    FB_SCALAR,        /* dtype value */
    FB_UNARY,         /* which x */
    FB_BINARY,        /* which a b */
    FB_WHERE,         /* cond a b */
    FB_MATMUL,        /* a b flags */
    FB_REDUCE,        /* which x naxes(255: axes NULL) axes... keepdims */
    FB_SOFTMAX,       /* which(0 softmax, 1 log_softmax) x axis */
    FB_LAYER_NORM,    /* x gamma beta eps */
    FB_RMS_NORM,      /* x gamma eps */
    FB_CROSS_ENTROPY, /* logits targets */
    FB_EMBEDDING,     /* ids table */
    FB_RESHAPE,       /* x rank dims... */
    FB_TRANSPOSE,     /* x perm (16 ints) */
    FB_BROADCAST_TO,  /* x rank dims... */
    FB_SLICE,         /* x axis start end */
    FB_CONCAT,        /* n(0..4) xs... axis */
    FB_CAST,          /* x dtype */
    FB_SET_NAME,      /* x name */
    FB_OUTPUT,        /* name x */
    FB_SET_LOSS,      /* x */
    FB_SCALER,        /* kind init growth backoff interval min */
    FB_OPTIMIZER,     /* kind lr momentum nesterov beta1 beta2 eps wd schedule warmup total min_lr clip accum */
    FB_AMP,           /* dtype */
    FB_REQUEST_GRAD,  /* x */
    FB_FREEZE,        /* x */
    FB_OPTION,        /* name-index value-index */
    FB_RUN,           /* feed-seed */
    FB_TRAINING,      /* on */
    FB_STATE,         /* index: state_at, then set_state with its own bytes */
    FB_SAVE_LOAD,     /* save the state, load it back: must succeed, change nothing */
    FB_AMP_MARK,      /* which(0 allow, 1 deny) x */
    FB_COUNT
};
/* The unary ops FB_UNARY picks from, the binary ones of FB_BINARY. */
enum { FB_NUNARY = 14, FB_NBINARY = 13 };
/* fuzz_int's byte 0x80 takes the next 8 bytes as a raw int64 (little endian);
 * any other byte b is the int8 value of b. fuzz_real: bytes 0..239 pick
 * from 16 values (0, 1, -1, 0.5, 2, 1e-3, 1e-8, 0.9, 0.999, 65536, 1e30,
 * -1e30, inf, -inf, NaN, 3); 240..255 take the next 8 bytes as a raw double. */
#define FB_RAW_INT 0x80
#define FB_RAW_REAL 0xf0

#endif
