/* inspect.h - what alloy shows of a compilation: numbered per-pass dump files, the pass timing table, the graph as DOT, the memory plan as SVG (docs/inspect.md). */
#ifndef ALLOY_INSPECT_H
#define ALLOY_INSPECT_H

#include <stdio.h>

#include "ir/ir.h"
#include "step/options.h"
#include "step/plan.h"
#include "step/schedule.h"

/* ---- dump.c: dump files and pass times ---- */

/* A dump file's path: the directory, the graph's name (at most 100 bytes
 * of it), "NN-", the stage's name and ".ir". */
#define DUMP_PATH_MAX (OPT_PATH_MAX + 160)

/* One dump file being written: FILE f on memory (buf, len), written to
 * path by dump_commit through al_file_write (base/file.h: atomically, so a
 * reader sees the old file or the whole new one; a link followed, anything
 * but a regular file refused). */
typedef struct dump_file {
    FILE *f;
    char *buf; /* open_memstream's (malloc'd) */
    size_t len;
    char path[DUMP_PATH_MAX];
} dump_file;

/* Opens the dump of pipeline stage `index` of graph g in dir (made when
 * missing): "GRAPH.NN-WHAT.ir", NN two digits (00 for the graph the
 * pipeline starts from, i + 1 for pass i), GRAPH the graph's name with
 * characters other than letters, digits, '_', '-' and '.' as '_' (a
 * leading '.' too; "graph" when empty). ALLOY_ERR_IO with err naming the
 * directory or file on failure (ALLOY_ERR_OOM). */
AL_HIDDEN alloy_status dump_open(const char *dir, const ir_graph *g, int index, const char *what, dump_file *d,
                                 char *err, size_t errlen);
/* Closes d's stream and writes what it holds to d's path; ALLOY_ERR_IO
 * naming the file when that fails (the file is then as it was). */
AL_HIDDEN alloy_status dump_commit(dump_file *d, char *err, size_t errlen);
/* Removes the dump dump_open would write (a pass that did not run leaves
 * no stale file of an earlier compile); missing is fine. */
AL_HIDDEN alloy_status dump_remove(const char *dir, const ir_graph *g, int index, const char *what, char *err,
                                   size_t errlen);

/* One row of the pass timing table. */
typedef struct pass_time {
    const char *name;
    bool ran;      /* false: disabled */
    double ms;     /* the pass and the verifier after it */
    int nodes;     /* nodes after it */
    char what[96]; /* what a compiling pass made ("298 steps"), or "" */
} pass_time;

/* Prints the timing table of one pipeline run of graph `name` (nodes_in
 * nodes at the start) as comment lines, one row per pass:
 *   # pass times: graph char_gpt, 101 -> 705 nodes, 12.345 ms
 *   #   pass              ms   nodes
 *   #   amp            0.456     130  +29
 *   #   schedule       0.100     705  298 steps
 * failed (or NULL) names the pass that failed, after the rows that ran. */
AL_HIDDEN void dump_print_times(FILE *out, const char *name, int nodes_in, const pass_time *rows, int n,
                                const char *failed);

/* ---- parts.c: which part of a training step a node belongs to ---- */

typedef enum insp_part {
    INSP_FORWARD,  /* computes the loss (every node, without a loss) */
    INSP_BACKWARD, /* computes a gradient output ("grad:NAME") and is not forward */
    INSP_UPDATE,   /* the rest: loss scaler, gradient checks, optimizer updates */
} insp_part;

AL_HIDDEN const char *insp_part_name(insp_part p);
/* part[0..nnodes) of g's nodes, derived from the graph (nodes do not
 * record which pass made them): forward are the loss and the nodes it
 * depends on (all nodes when g has no loss); backward the nodes a
 * "grad:NAME" output depends on that are not forward; update every other
 * node. ALLOY_ERR_OOM leaves part unset. */
AL_HIDDEN alloy_status insp_parts(const ir_graph *g, uint8_t *part);

/* ---- dot.c ---- */

/* Writes g as a Graphviz DOT digraph: one node statement per IR node
 * ("n<id>"), filled by AMP class (allow, deny, infer, clear; white when no
 * AMP ran), inserted casts with a thick orange border; shape by part:
 * forward rounded boxes, backward dashed boxes, updates octagons, leaves
 * (inputs, parameters, state) as their own shapes; one edge per operand
 * labelled with the operand's dtype and shape; one cluster "cluster_step<k>"
 * per step of s with two or more members (s may be NULL: no clusters); a
 * legend in the graph's label. ALLOY_ERR_OOM or ALLOY_ERR_IO (a write
 * failed) with err. */
AL_HIDDEN alloy_status insp_dot(const ir_graph *g, const schedule *s, FILE *out, char *err, size_t errlen);

/* ---- memory_svg.c ---- */

/* Writes plan p of g under schedule s as an SVG picture: x the schedule's
 * steps, y the arena's bytes; one <rect class="slot"> per value with arena
 * bytes, from the step that produces it to the last step that reads it (the
 * run's end when kept), filled by part; the scratch at the top as one
 * rect class="scratch"; the live bytes per step as a polyline (class "live",
 * the values in data-live: values written in place over an operand count
 * once); a dashed line at the first step where they peak (class "peak",
 * with data-step and data-bytes) and one at the peak's level. Every slot rect carries data-node,
 * data-first, data-last (step indices), data-offset and data-bytes (its
 * 64-aligned size). ALLOY_ERR_OOM or ALLOY_ERR_IO with err. */
AL_HIDDEN alloy_status insp_memory_svg(const ir_graph *g, const schedule *s, const mem_plan *p, FILE *out,
                                       char *err, size_t errlen);

/* s as markup text (SVG, and Graphviz's HTML-like labels): &, <, >, " as
 * entities, ' too when apos (XML; Graphviz's HTML labels lack &apos;),
 * control characters as '?'. */
AL_HIDDEN void ins_put_markup(FILE *out, const char *s, bool apos);

#endif
