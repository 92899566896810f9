/* bundle.h - the ahead-of-time bundle file (docs/bundle.md): a compiled training step (optimized IR, schedule, memory plan, state layout, options) in one checksummed file, and its strict reader. */
#ifndef ALLOY_BUNDLE_FORMAT_H
#define ALLOY_BUNDLE_FORMAT_H

#include "ir/ir.h"
#include "passes/pass.h"

#define BUNDLE_MAGIC "ALLOYBDL"  /* 8 bytes, no NUL */
#define BUNDLE_VERSION 1u        /* the format this build writes and the newest it reads */
#define BUNDLE_HEADER_BYTES 80u

/* Section tags, in the order the writer puts them (docs/bundle.md). */
typedef enum bundle_tag {
    BUNDLE_SEC_META = 1,      /* text: key=value lines (graph name, seed, training, scaler, optimizer) */
    BUNDLE_SEC_IR = 2,        /* text: the compiled graph as ir_print writes it */
    BUNDLE_SEC_SCHEDULE = 3,  /* binary: the schedule's arrays */
    BUNDLE_SEC_PLAN = 4,      /* binary: every node's arena offset, the arena, the scratch */
    BUNDLE_SEC_STATE = 5,     /* binary: the state layout (name, dtype, shape per tensor) */
    BUNDLE_SEC_OPTIONS = 6,   /* text: opt_print's line */
    BUNDLE_SEC_INIT_STATE = 7, /* reserved: the initial state as safetensors bytes (not written yet) */
    BUNDLE_SEC_CUDA_EXEC = 8, /* reserved: cubins per architecture and PTX (not written yet) */
    BUNDLE_SEC_LAST = 8
} bundle_tag;

/* One state tensor of the layout. */
typedef struct bundle_state {
    char *name;
    ir_type type;
} bundle_state;

/* What a bundle holds, as the reader returns it and the writer takes it. */
typedef struct bundle_contents {
    char alloy_version[16];   /* of the writer, NUL-terminated */
    ir_graph *ir;             /* the compiled graph */
    pass_compiled comp;       /* its schedule and plan */
    char *options;            /* opt_print's line, without the newline */
    char graph_name[128];
    uint64_t seed;
    bool training;
    int scaler_kind, growth_interval;       /* alloy_scaler_kind; the dynamic scaler's interval */
    int optimizer_kind, accumulation_steps; /* alloy_optimizer_kind (0: none) */
    bundle_state *state;
    int nstate;
} bundle_contents;

/* The bytes of a bundle of c (al_free *out): header, then the sections
 * META, IR, SCHEDULE, PLAN, STATE, OPTIONS; the state layout is every
 * param and state node of c->ir. ALLOY_ERR_OOM with err on failure. */
AL_HIDDEN alloy_status bundle_encode(const bundle_contents *c, uint8_t **out, size_t *len, char *err, size_t errlen);
/* Reads a bundle from bytes[0..len), checking everything: the header
 * (magic, version, sizes), the payload's SHA-256, every section's bounds
 * and contents, and that the schedule, plan and state layout fit the IR
 * (every member, part and input in range, every offset inside the arena,
 * every param/state node in the layout with its type). `where` (a path)
 * starts every message, which names the section and byte offset.
 * ALLOY_ERR_FORMAT on a corrupt or foreign file, ALLOY_ERR_UNSUPPORTED on
 * a newer format version, ALLOY_ERR_OOM. *out is filled only on success
 * (bundle_contents_free). */
AL_HIDDEN alloy_status bundle_decode(const uint8_t *bytes, size_t len, const char *where, bundle_contents *out,
                                     char *err, size_t errlen);
/* Reads the file at path whole, then bundle_decode (ALLOY_ERR_IO when it cannot be read). */
AL_HIDDEN alloy_status bundle_read_file(const char *path, bundle_contents *out, char *err, size_t errlen);
/* Writes bundle_encode's bytes to path atomically. */
AL_HIDDEN alloy_status bundle_write_file(const char *path, const bundle_contents *c, char *err, size_t errlen);
/* Recomputes the payload checksum of the bundle bytes[0..len) in place (for
 * tests that build well-signed but inconsistent bundles); false when len is
 * shorter than the header. */
AL_HIDDEN bool bundle_resign(uint8_t *bytes, size_t len);
/* The name of a section tag ("schedule"), "unknown" for others. */
AL_HIDDEN const char *bundle_tag_name(uint32_t tag);
/* Frees what the reader allocated and empties c. */
AL_HIDDEN void bundle_contents_free(bundle_contents *c);

#endif
