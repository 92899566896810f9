/* bundle.h - the ahead-of-time bundle file (docs/bundle.md): a compiled training step (optimized IR, schedule, memory plan, state layout, options) in one checksummed file, and its strict reader. */
#ifndef ALLOY_BUNDLE_FORMAT_H
#define ALLOY_BUNDLE_FORMAT_H

#include "ir/ir.h"
#include "step/compiled.h"
#include "step/kernels.h" /* cg_program, the kernel table (data only: no emitter is linked) */

#define BUNDLE_MAGIC "ALLOYBDL"  /* 8 bytes, no NUL */
#define BUNDLE_VERSION 2u        /* the format this build writes and the only one it reads: 2 added the
                                  * plan's in-place updates (offset -2 - t, the in-place count) */
#define BUNDLE_HEADER_BYTES 80u

/* Section tags, in the order the writer puts them (docs/bundle.md). */
typedef enum bundle_tag {
    BUNDLE_SEC_META = 1,      /* text: key=value lines (graph name, seed, training, scaler, optimizer) */
    BUNDLE_SEC_IR = 2,        /* text: the compiled graph as ir_print writes it */
    BUNDLE_SEC_SCHEDULE = 3,  /* binary: the schedule's arrays */
    BUNDLE_SEC_PLAN = 4,      /* binary: every node's arena offset, the arena, the scratch */
    BUNDLE_SEC_STATE = 5,     /* binary: the state layout (name, dtype, shape per tensor) */
    BUNDLE_SEC_OPTIONS = 6,   /* text: opt_print's line */
    BUNDLE_SEC_INIT_STATE = 7, /* optional: the initial state as safetensors bytes */
    BUNDLE_SEC_CUDA_EXEC = 8, /* binary: per module a cubin per architecture and PTX, the minimum driver version */
    BUNDLE_SEC_CUDA_KERNELS = 9, /* binary: the kernel table (names, modules, geometry, parameters) */
    BUNDLE_SEC_LAST = 9
} bundle_tag;

/* One state tensor of the layout. */
typedef struct bundle_state {
    char *name;
    ir_type type;
} bundle_state;

/* One image of the CUDA executable: a cubin (an ELF file for sm_<arch>) or
 * PTX (text for compute_<arch>, its NUL counted) of one module of the
 * step's kernels (codegen/export.h's modules). */
/* BUNDLE_HOST: an image of the tests' host emulation of CUDA (a shared
 * object of the module compiled as host C++); only tests write it, no GPU
 * picks it. */
typedef enum bundle_image_kind { BUNDLE_CUBIN = 1, BUNDLE_PTX = 2, BUNDLE_HOST = 3 } bundle_image_kind;
typedef struct bundle_image {
    uint32_t kind, arch, module;
    uint8_t *data; /* owned */
    size_t size;
} bundle_image;

/* The CUDA executable section: every module for every target, the same
 * targets for each; nimages 0 when the bundle has none. */
typedef struct bundle_cuda {
    uint32_t min_driver; /* the CUDA driver version its PTX needs: 1000 * major + 10 * minor (12080: 12.8) */
    uint32_t nmodules;
    bundle_image *images;
    int nimages;
    /* The kernel table (section 9): what the emitter made of the schedule,
     * without the sources: per kernel its name, step, geometry and
     * parameters (kernels[q].source NULL), and the steps it left without a
     * kernel with why; module_of[q] the module holding kernel q. With it
     * the launch plan is rebuilt (lp_build) with no emitter. has_kernels
     * false: a bundle written before the table (its GPU compiles again). */
    bool has_kernels;
    cg_program prog;
    uint32_t *module_of;
} bundle_cuda;

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
    int hysteresis, max_consecutive_skips;  /* the scaler's (0: not set); its other rules live in the IR */
    bundle_state *state;
    int nstate;
    uint8_t *init_state;    /* the initial state as an alloy-state safetensors file (al_malloc'd); NULL: none */
    size_t init_state_len;
    bundle_cuda cuda; /* the CUDA executable (no images: none) */
} bundle_contents;

/* The bytes of a bundle of c (al_free *out): header, then the sections
 * META, IR, SCHEDULE, PLAN, STATE, OPTIONS, INIT_STATE when c has one, and CUDA_EXEC when c->cuda has
 * images (which must hold every module for the same targets, as the reader
 * checks) with CUDA_KERNELS when it has its kernel table; the state layout is every
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
/* Which image of module `module` of x a GPU of compute capability sm
 * (major * 10 + minor) with CUDA driver version `driver` loads into *out:
 * the cubin of the same major version with the highest minor at or below
 * sm's (a cubin runs on its own major version's later minors), else the
 * PTX of the highest compute_XY at or below sm when the driver is at least
 * x->min_driver (the driver compiles it). ALLOY_ERR_UNSUPPORTED when none
 * fits, with why naming the GPU, the bundle's cubins and PTX and, for PTX
 * that only the driver's version keeps out, both versions. */
AL_HIDDEN alloy_status bundle_cuda_pick(const bundle_cuda *x, uint32_t module, int sm, int driver,
                                        const bundle_image **out, char *why, size_t whylen);
/* The targets of x as text: "cubins sm_80, sm_90; PTX compute_80" ("none"
 * without images). */
AL_HIDDEN void bundle_cuda_targets(const bundle_cuda *x, char *out, size_t len);
/* The image of module `module` of x of kind (BUNDLE_HOST: an emulated
 * device's), NULL when x has none. */
AL_HIDDEN const bundle_image *bundle_cuda_image_of_kind(const bundle_cuda *x, uint32_t module, uint32_t kind);
/* Frees x's images and kernel table and empties it. */
AL_HIDDEN void bundle_cuda_free(bundle_cuda *x);
/* Frees what the reader allocated and empties c. */
AL_HIDDEN void bundle_contents_free(bundle_contents *c);

#endif
