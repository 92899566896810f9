/* alloy/amp.h - automatic mixed precision: enable_amp, the editable op lists, markers, the report. */
#ifndef ALLOY_AMP_H
#define ALLOY_AMP_H

#include "alloy/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The four AMP lists (docs/amp.md): ALLOW ops run in low precision; DENY
 * ops in f32; INFER ops in the widest precision of their inputs unless
 * colouring makes them allow; CLEAR ops (data movement) follow their
 * neighbours. An op on no list is treated as the "unlisted" class (DENY
 * unless changed); an op on two lists is an error at compile time. */
typedef enum alloy_amp_list {
    ALLOY_AMP_ALLOWLIST = 1,
    ALLOY_AMP_DENYLIST,
    ALLOY_AMP_INFERLIST,
    ALLOY_AMP_CLEARLIST,
} alloy_amp_list;

/* Switches AMP on with dtype ALLOY_F16 or ALLOY_BF16 (ALLOY_F32 switches it
 * off, the default). Takes effect at the next compile. */
ALLOY_API alloy_status alloy_graph_enable_amp(alloy_graph *g, alloy_dtype dtype);
/* Edits g's lists by op name ("matmul", "gelu", ...): ALLOY_ERR_NOT_FOUND
 * for an unknown op. The environment variables
 * ALLOY_AMP_{ALLOWLIST,DENYLIST,INFERLIST,CLEARLIST}_{ADD,REMOVE}=op,op
 * apply on top at compile time. */
ALLOY_API alloy_status alloy_amp_lists_add(alloy_graph *g, alloy_amp_list list, const char *op);
ALLOY_API alloy_status alloy_amp_lists_remove(alloy_graph *g, alloy_amp_list list, const char *op);
/* The class an op on no list gets (default ALLOY_AMP_DENYLIST). */
ALLOY_API alloy_status alloy_amp_set_unlisted(alloy_graph *g, alloy_amp_list list);

/* Markers that pin one tensor, as OneFlow's amp_white/black_identity:
 * amp_allow(x) makes x low precision where AMP is on, amp_deny(x) keeps it
 * f32. They are identities and disappear after colouring. */
ALLOY_API alloy_tensor *alloy_amp_allow(alloy_graph *g, alloy_tensor *x);
ALLOY_API alloy_tensor *alloy_amp_deny(alloy_graph *g, alloy_tensor *x);

/* Scopes, as torch.autocast(enabled=False) blocks: every op built between
 * alloy_amp_scope_push(g, ALLOY_F32) and the matching alloy_amp_scope_pop(g)
 * computes in f32 whatever the lists say, its results count as f32 data for
 * the ops after the scope (an infer op taking one runs in f32, docs/amp.md);
 * ALLOY_F16 or ALLOY_BF16 pins the ops to low precision instead (when AMP is
 * on). Scopes nest up to ALLOY_AMP_SCOPE_MAX deep; the pin shows in the IR
 * as !amp=deny / !amp=allow on each node. A bad dtype, too deep a push or a
 * pop without a push is ALLOY_ERR_INVALID. */
#define ALLOY_AMP_SCOPE_MAX 16
ALLOY_API alloy_status alloy_amp_scope_push(alloy_graph *g, alloy_dtype dtype);
ALLOY_API alloy_status alloy_amp_scope_pop(alloy_graph *g);

/* What the AMP pass did in the last compile. */
typedef struct alloy_amp_report {
    alloy_dtype dtype;   /* ALLOY_F32 when AMP was off */
    int float_nodes;     /* f32 compute nodes AMP could colour */
    int low_nodes;       /* of those, how many run in low precision */
    int casts;           /* inserted casts the compiled step keeps (weight casts included; a folded cast of a constant is not one) */
    int weight_casts;    /* casts of parameters: the per-step low-precision weight copies */
    int range_kept;      /* nodes kept f32 by range-aware colouring (the amp_ranges option) */
} alloy_amp_report;

/* Compiles g if needed and fills out with the AMP pass's counts. The same
 * summary, plus why each f32 node next to a low-precision one was kept in
 * f32 (and each decision of range-aware colouring), is printed when
 * ALLOY_AMP_LOG=1 (the amp_log option): to stderr, or to the stream
 * alloy_graph_print_after names. */
ALLOY_API alloy_status alloy_graph_amp_report(alloy_graph *g, alloy_amp_report *out);

/* Range statistics (the amp_stats option, docs/amp.md "Range statistics"):
 * with amp_stats=1 every run on the CPU adds, for each f16/bf16 value the
 * step computes, its largest |x| (before the store rounds it: a product
 * of 7.1e4 reads 7.1e4, not inf) and how many of its elements are nonzero
 * but below the dtype's smallest normal (f16 6.1e-5, bf16 1.2e-38: flushed
 * to a subnormal or to zero). A recompile starts them again. */
typedef struct alloy_amp_stat {
    char node[64];    /* the value as the compiled IR prints it: "%h", "%812" */
    const char *op;   /* "matmul" */
    alloy_dtype dtype; /* ALLOY_F16 or ALLOY_BF16 */
    bool backward;    /* computed by the backward or the update, not the forward */
    double max_abs;   /* the largest |x| seen (inf: a stored inf) */
    double headroom;  /* log2(format max / max_abs): powers of two to spare (65504 for f16,
                         3.39e38 for bf16); negative: it overflowed; inf when max_abs is 0 */
    double underflow; /* the fraction of the elements seen that were nonzero and below the smallest normal */
    int64_t elements; /* the elements seen, over every tracked run */
    bool nan;         /* a NaN was seen */
} alloy_amp_stat;

/* The values tracked so far (0 before a run with amp_stats=1), in the
 * compiled step's node order, and the i-th of them. */
ALLOY_API int alloy_graph_amp_stats_count(const alloy_graph *g);
ALLOY_API alloy_status alloy_graph_amp_stats_at(const alloy_graph *g, int i, alloy_amp_stat *out);
/* Prints the statistics to out: a line per value (node, op, dtype, max |x|,
 * headroom, underflow fraction), then the ten with the least headroom. */
ALLOY_API alloy_status alloy_graph_amp_stats(const alloy_graph *g, FILE *out);
/* Writes them to path, atomically, as the text file the amp_ranges option
 * reads (docs/amp.md, "The stats file"). */
ALLOY_API alloy_status alloy_graph_save_amp_stats(const alloy_graph *g, const char *path);
/* Compiles g if needed and adds the stats file at path (one this graph, or
 * another compiled the same way, saved) to its statistics, each value
 * matched by name and checked against its op and dtype, so that
 * alloy_graph_amp_stats prints them (alloyc amp-report --stats). A file
 * that is not a stats file, or a line naming no value of g, is
 * ALLOY_ERR_FORMAT naming the file and line, and changes nothing. */
ALLOY_API alloy_status alloy_graph_load_amp_stats(alloy_graph *g, const char *path);

#ifdef __cplusplus
}
#endif
#endif
