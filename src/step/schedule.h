/* schedule.h - the schedule: the compiled graph as an ordered list of steps (kernels) that every backend executes. */
#ifndef ALLOY_SCHEDULE_H
#define ALLOY_SCHEDULE_H

#include <stdio.h>

#include "ir/groups.h"
#include "ir/ir.h"

/* What one step is (docs/architecture.md, "the schedule"):
 *   OP:    one node with its own kernel (matmul, reduction, movement, a
 *          row op outside any group, a constant);
 *   EW:    elementwise members over one shape, one pass over memory;
 *   ROW:   row ops with elementwise producers and consumers over [rows, C],
 *          and column sums over its rows;
 *   GEMM:  a matmul and its epilogue;
 *   MULTI: independent elementwise chains (and a found_inf over them) in
 *          one launch;
 *   COLLECTIVE: one collective (all_reduce, reduce_scatter, all_gather)
 *          over the ranks of a data-parallel step, a library call every
 *          rank makes in the same order. */
typedef enum step_kind {
#define STEP(kind, name, rule_loads) STEP_KIND_##kind,
#include "step/step_kinds.def"
#undef STEP
} step_kind;

/* The readers a step kind's emitter loads through the range rule (step_kinds.def). */
enum { RULE_LOADS_EW = 1, RULE_LOADS_ROW = 2, RULE_LOADS_SUM_SQUARES = 4, RULE_LOADS_COLSUM = 8 };

/* What the amp_check option records per node in a run: its value held an
 * inf, a NaN. */
enum { NONFINITE_INF = 1, NONFINITE_NAN = 2 };

/* Per-member numerics (docs/fusion.md); a backend must honour each. */
enum {
    MEMBER_STORED = 1,  /* written to its arena slot: read by a later step, an output, update, the loss or kept */
    MEMBER_EXACT = 2,   /* readers see it rounded to its dtype (bool/int results, casts to f16/bf16, row-op results) */
    MEMBER_RANGED = 4,  /* an unrounded f16/bf16 value: f32 precision, but it overflows to inf where a store would */
    MEMBER_CHECK = 8,   /* the step's found_inf reads it: a non-finite value (as stored) sets the flag */
    MEMBER_SPILLED = 16, /* a later part of its step reads it: handed over rounded to its dtype */
    MEMBER_VIEW = 32,   /* a reshape or contiguous slice of a stored value: no kernel; its value is bytes of its operand's
                         * (plan.h, view_of); on a concat: a gather, its inputs placed in its slot, no kernel;
                         * around the attention ops and batched products also a transpose, and a concat aliasing
                         * its inputs' strided root (attn_views.h) */
    MEMBER_STRIDED = 64, /* its bytes are not its type's row-major order: an attention or batched matmul's operand
                          * or result read and written through strides, or a view of one (attn_views.h); only the
                          * attention ops, those matmuls and views read it */
    MEMBER_RANGED_READ = 128, /* a gemm step's cast to f32 of its f16/bf16 product, whose readers apply the product's
                               * range rule as they load it (sched_mark_ranged_reads): a backend may store it before
                               * the rule (cuBLASLt's f32 D, no epilogue kernel) */
};

/* A part: members run as one unit inside a step. EW parts are one chunked
 * elementwise pass (computing in f64 when `wide`); an OP part is one
 * structured member (a row op, the GEMM's matmul, found_inf); a COLSUM part
 * is one column sum of a ROW step (ir_fuse_colsum): every block of rows
 * adds its rows of the operand (a member handed over as MEMBER_SPILLED, or
 * an input) per column, and the step combines the blocks' sums at its end
 * (in the unfused reduce_sum's order on the CPU). */
typedef enum part_kind { PART_EW, PART_OP, PART_COLSUM } part_kind;

typedef struct sched_part {
    part_kind kind;
    bool wide;
    int first, n; /* members [first, first + n) of the schedule */
} sched_part;

typedef struct sched_member {
    int node;
    uint8_t flags; /* MEMBER_* */
} sched_member;

typedef struct sched_step {
    step_kind kind;
    int pos;             /* where it runs: the id of its last member (steps ascend by pos) */
    int first, n;        /* its members, in execution order */
    int first_part, nparts;
    int first_in, nin;   /* nodes it reads from outside, in order of first use */
    ir_type space;       /* EW, ROW, GEMM: the iteration shape ([rows, C] for ROW); OP, MULTI: the last member's type */
} sched_step;

typedef struct schedule {
    int nnodes, nsteps, nmembers, nparts, ninputs;
    sched_step *steps;
    sched_member *members;
    sched_part *parts;
    int *inputs;
    int *step_of;     /* per node: its step, -1 for the bound leaves (input, param, state) */
    int *member_of;   /* per node: its index in members, -1 for leaves */
    uint8_t *kept;    /* per node: must survive the whole run (outputs, updates, loss, the keep set) */
    /* per node: the elements from one row of its value to the next when
     * sched_pad padded it (a multiple of SCHED_PAD_ELEMS above its last
     * dim), 0 when dense; NULL when no value is padded */
    int64_t *row_stride;
} schedule;

/* Builds the schedule of g (verified, with its fusion groups) for the keep
 * set keep[0..nnodes) (NULL: nothing beyond the outputs, updates and loss):
 * one step per group of two or more and per other non-leaf node, in the
 * order of their positions; each step's parts, members, flags and
 * external inputs. Fills *out (sched_free) or returns ALLOY_ERR_OOM /
 * ALLOY_ERR_VERIFY with err. */
AL_HIDDEN alloy_status sched_build(const ir_graph *g, const bool *keep, schedule *out, char *err, size_t errlen);
/* sched_build's first half (schedule.c): the steps, their members and
 * views (attention's strided ones included), without padded rows; the same
 * contract. sched_build (schedule_build.c) then chooses the padded rows
 * (sched_pad). */
AL_HIDDEN alloy_status sched_build_steps(const ir_graph *g, const bool *keep, schedule *out, char *err, size_t errlen);
AL_HIDDEN void sched_free(schedule *s);
/* Flags MEMBER_RANGED_READ (ranged_reads.c) on the cast of every gemm step
 * that is [matmul (f16/bf16), cast to f32] and whose value is stored, not
 * kept, and read only where a generated kernel loads it through one of two
 * paths: elementwise members of ew, row and multi steps (cg_emit_members),
 * row ops and column sums (emit_row_operands.c). Those readers apply the range rule
 * of the product's dtype as they load it, so the step may store the f32 sum
 * before the rule (cuBLASLt's f32 D) and its readers see the values the
 * CPU stores (the rule applied in the step). sched_build_steps calls it. */
AL_HIDDEN void sched_mark_ranged_reads(const ir_graph *g, schedule *s);
/* Clears MEMBER_RANGED_READ (ranged_reads.c) where the value's f32 rows are
 * not a whole number of 16 bytes, at least SCHED_PAD_MIN_COLS long, and
 * sched_pad gave it no padded stride:
 * cuBLASLt writing it would be an odd leading dimension (no aligned
 * tensor-core kernel), where the epilogue kernel's path writes the product
 * into the scratch at a padded stride (a vocabulary-wide weight gradient).
 * sched_build calls it after sched_pad. */
AL_HIDDEN void sched_align_ranged_reads(const ir_graph *g, schedule *s);
/* Padded rows are a multiple of this many elements (llm.c's 50257 -> 50304). */
#define SCHED_PAD_ELEMS 64
/* Rows narrower than this many elements are never padded: such GEMMs are
 * latency-bound, and 64 elements would be up to 21 times their width. */
#define SCHED_PAD_MIN_COLS 32
/* Sets s->row_stride (pad.c): a padded row stride for every stored rank-2
 * value whose rows are not a multiple of 16 bytes and at least
 * SCHED_PAD_MIN_COLS elements long (for a gemm step's
 * unstored matmul: its f32 product in the scratch) when an f16/bf16
 * library GEMM reads or writes it, its producer is that GEMM or an
 * elementwise, cast or row kernel over the value's own shape, and every
 * step that reads it is a matmul taking it as an operand or such a kernel
 * (no column sums, no view of it, not an update's value). The padding
 * columns are never written nor read. sched_build calls it;
 * ALLOY_ERR_OOM with err. */
AL_HIDDEN alloy_status sched_pad(const ir_graph *g, schedule *s, char *err, size_t errlen);
/* The row stride of node's value in elements: the padded one, else its last dim (1 for a scalar). */
AL_HIDDEN int64_t sched_ld(const ir_graph *g, const schedule *s, int node);
/* Whether node's value has a padded row stride. */
static inline bool sched_padded(const schedule *s, int node) { return s && s->row_stride && s->row_stride[node] > 0; }
/* The elements node's value spans with its row stride: rows * sched_ld. */
AL_HIDDEN int64_t sched_padded_numel(const ir_graph *g, const schedule *s, int node);
AL_HIDDEN const char *sched_kind_name(step_kind k);
/* The RULE_LOADS_* of step kind k's emitter (step_kinds.def); 0 for an unknown kind. */
AL_HIDDEN unsigned sched_kind_rule_loads(step_kind k);
/* Whether node i's value is materialized (a stored member; leaves are bound, not stored). */
static inline bool sched_stored(const schedule *s, int i)
{
    return s->member_of[i] >= 0 && (s->members[s->member_of[i]].flags & MEMBER_STORED);
}
/* The value whose arena slot node i's value shares as a view (following
 * views of views to the value that owns the slot; MEMBER_VIEW), or -1 when
 * i is not a view. sched_build makes a lone reshape a view when its operand
 * is a stored value (not a leaf: a leaf's buffer is bound at run time), and
 * a lone slice too when sched_view_delta allows it. */
AL_HIDDEN int sched_view_root(const ir_graph *g, const schedule *s, int i);
/* A slice view starts a multiple of this many bytes into its owner's slot
 * (the generated kernels load 16 bytes at a time: launch_plan.c). */
#define SCHED_VIEW_ALIGN 16
/* The byte offset of node n's value inside its operand's when n may be a
 * view of it: 0 for a reshape; for a slice whose result is one byte range
 * of its operand (every axis before the sliced one of extent 1, the later
 * ones whole by construction), start times the bytes of one index of the
 * sliced axis, when a multiple of SCHED_VIEW_ALIGN; -1 otherwise (a copy). */
AL_HIDDEN int64_t sched_view_delta(const ir_graph *g, const ir_node *n);
/* The byte offset of input k of concat c inside c's value when c may be a
 * gather (its inputs placed in its slot): every axis before the concat's of
 * extent 1 and the offset a multiple of SCHED_VIEW_ALIGN; -1 otherwise. */
AL_HIDDEN int64_t sched_gather_delta(const ir_graph *g, const ir_node *c, int k);
/* Per node (g->nnodes entries each), the value whose arena slot node i's
 * value lies in, or -1, and its byte offset there: a view's (reshape,
 * slice) is its root's (sched_view_root), a gathered concat's input's (or
 * the operand of such an input that is a reshape view: a piece) the
 * concat's, and a view of a piece the piece's concat's. */
AL_HIDDEN void sched_views(const ir_graph *g, const schedule *s, int *owner, int64_t *off);
/* The byte offset of view i's value inside the slot of sched_view_root's
 * value (the sum of sched_view_delta along the chain of views), 0 when i
 * is not a view. */
AL_HIDDEN int64_t sched_view_offset(const ir_graph *g, const schedule *s, int i);
/* Prints the schedule as comment lines, one per step:
 *   # step 12 row @%31 f32[2048,64]: in %27 %12; ew %28 %29 | row %30=xs | ew %31=s
 * (parts separated by "|", a column sum's as "colsum %33=s"; each member's flags after "=": s stored, x
 * exact, r ranged, c checked, p spilled, v a view, w strided, l ranged as loaded; ",ld50304": a padded
 * row stride, sched_pad). */
AL_HIDDEN void sched_print(const ir_graph *g, const schedule *s, FILE *out);

#endif
