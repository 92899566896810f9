/* plan.h - the memory planner: one arena offset per materialized value from liveness over the schedule. */
#ifndef ALLOY_PLAN_H
#define ALLOY_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"
#include "step/schedule.h"

/* Every arena offset is a multiple of this (and every slot a multiple in size). */
#define PLAN_ALIGN 64

/* Where every value of one compiled graph lives during a run. */
typedef struct mem_plan {
    int nnodes;
    /* byte offset of node i's value in the arena, or -1 when it has no arena
     * slot (leaves bound from outside: input, param, state; nodes not
     * materialized). A materialized value of 0 bytes gets offset 0 and
     * occupies nothing. */
    int64_t *offset;
    size_t arena_bytes; /* size of the arena = its high-water mark */
    /* total bytes (ir_nbytes, unaligned) of materialized values per dtype; a sum, not a peak */
    size_t bytes_by_dtype[ALLOY_DTYPE_COUNT];
    /* max over positions of the bytes of the slots live there (64-aligned
     * sizes; a value written in place over its operand shares that
     * operand's slot and counts once): a lower bound, arena_bytes >= it */
    size_t peak_live_bytes;
    int inplace; /* how many values reuse their operand's slot in place */
    int views;   /* how many values are views (view_of) */
    /* scratch at the top of the arena (plan_for_schedule: the f32 product
     * of the largest GEMM step), included in arena_bytes */
    size_t scratch_offset, scratch_bytes;
    /* updates written in place (plan_for_step): per node, the param/state
     * leaf whose buffer holds its value, or -1; NULL when there are none */
    int *state_of;
    int first_write; /* the first step that writes a state buffer (with state_of) */
    /* views (MEMBER_VIEW: a reshape or contiguous slice of a stored value,
     * no kernel; and the pieces of a gathered concat, whose owner is the
     * concat: schedule.h, sched_views): per node, the value that owns the slot node i's value
     * shares, or -1; NULL when there are none. A view's offset is its
     * owner's plus the view's byte offset inside it (0 for a reshape,
     * sched_view_offset; offset[i] - offset[view_of[i]]); it has no bytes of
     * its own (not in bytes_by_dtype), and its owner's slot stays live
     * until the last use of the owner or of any view of it, so nothing is
     * written over the slot while any of them is live. An owner is never a
     * view, a leaf or an update written in place. */
    int *view_of;
} mem_plan;

/* The schedule the plan is for. Every array has g->nnodes entries; NULL
 * means the default given with it. */
typedef struct plan_schedule {
    /* position where node i's value is produced (node i itself when NULL);
     * nodes of one fusion group share their group's position. Positions are
     * in [0, INT_MAX) and no node precedes an operand (pos[in] <= pos[node]). */
    const int *exec_pos;
    /* node i needs memory (every node but input, param, state when NULL);
     * leaves are never given a slot whatever this says. A non-leaf that is
     * not materialized must be used only at its own position (inside its group). */
    const uint8_t *materialized;
    /* node i must survive the whole run (outputs, updates' values, loss,
     * fetches; may be NULL) */
    const uint8_t *keep;
    /* node i may write over one of its operands (elementwise ops, and a
     * data-parallel all_reduce, which reduces in place; NULL =
     * ir_ops[op].elementwise) */
    const uint8_t *inplace_ok;
    /* node i's value is bound from outside like a leaf's (an update written
     * into its state's buffer): no slot, readable at any later position
     * (may be NULL) */
    const uint8_t *bound;
    /* node i may also take the slot of node alias_of[i] (-1: none; may be
     * NULL), a value it does not read, on the same conditions as an
     * operand: a row step's stored member over a row input that every
     * member reading it reads before i is computed (the classifier's
     * gradient over its logits) */
    const int *alias_of;
    /* node i's value is the bytes of node view_of[i] (-1: none; may be
     * NULL): it takes that value's offset (plus view_off[i]) and no slot of
     * its own, and its uses (and being kept) count as uses of that value.
     * view_of[i] is a materialized, non-bound value that is no view itself,
     * produced before i, or after i when it is a concat gathering i (a
     * piece: the concat's slot is allocated when its first piece is
     * placed, and the concat takes none at its own position). */
    const int *view_of;
    /* the byte offset of view i's value inside its owner's slot (a slice
     * view's start; may be NULL: all 0) */
    const int64_t *view_off;
    /* node i's rows lie row_stride[i] elements apart (a padded value,
     * schedule.h; 0 or NULL: dense): its slot holds rows * row_stride[i]
     * elements, and it takes no slot in place of a value whose row stride
     * differs (an elementwise kernel writing over its operand reads and
     * writes each element at one index) */
    const int64_t *row_stride;
} plan_schedule;

/* Plans the arena for g under schedule s (NULL: node order, the defaults
 * above). A value is live from its position to the last position of any
 * consumer (materialized or not), or to the end when kept; values live at
 * one position never share bytes, except that a value may take exactly the
 * slot of one operand when inplace_ok, the operand is materialized, not
 * kept, produced at an earlier position, last used at this node's position
 * by this node alone, and has the result's shape and element size (or the
 * slot of alias_of[i], last used at i's position, on the same terms). Other
 * slots are placed best-fit (smallest free block that fits, lowest offset
 * on ties; adjacent free blocks merge; the block at the top of the arena
 * grows when nothing fits). O(n log n) in the nodes plus the operand count.
 * Fills *out (release with plan_free) and returns ALLOY_OK; on a bad
 * schedule returns ALLOY_ERR_INVALID, on OOM ALLOY_ERR_OOM, with the reason
 * in err, and leaves *out empty. */
AL_HIDDEN alloy_status plan_build(const ir_graph *g, const plan_schedule *s, mem_plan *out,
                                  char *err, size_t errlen);
/* Plans the arena of schedule s of g (the plan pass): each non-leaf value
 * lives from its step's position to its last reader's; stored members are
 * materialized, the schedule's kept values survive the run, a lone
 * elementwise step may write over an operand; then scratch for the f32
 * product of the largest GEMM step at the top. no_reuse: no two values
 * share bytes (every materialized value is kept, nothing in place), for
 * debugging. As plan_build otherwise. */
AL_HIDDEN alloy_status plan_for_schedule(const ir_graph *g, const schedule *s, bool no_reuse, mem_plan *out,
                                         char *err, size_t errlen);
/* plan_for_schedule for a step that runs with its updates: an update
 * p <- p' whose value p' can be written straight into p's buffer gets no
 * arena slot (state_of[p'] = p), so the step holds its state once. p' is
 * written in place when it has p's type, is stored by an EW step or an EW
 * part of a MULTI step, every other reader of p runs in an earlier step,
 * and the readers of p in its step are members of its part (elementwise
 * over p's shape, so each chunk reads p before it is written); and only in
 * the tail of the schedule made of steps that cannot fail once their
 * buffers are reserved (EW steps, MULTI steps of EW parts, lone
 * elementwise ops): a run that fails leaves the state as it was. Other
 * updates keep their slot and are copied after the step. no_reuse: none
 * in place. */
AL_HIDDEN alloy_status plan_for_step(const ir_graph *g, const schedule *s, bool no_reuse, mem_plan *out,
                                     char *err, size_t errlen);
/* Fills p->view_of (plan.h) from the views of schedule s (MEMBER_VIEW)
 * for a plan read back from a file, and checks that each view's offset is
 * its owner's plus sched_view_offset and that the owner has an arena slot: ALLOY_ERR_INVALID with
 * the node in err otherwise, ALLOY_ERR_OOM. */
AL_HIDDEN alloy_status plan_attach_views(const ir_graph *g, const schedule *s, mem_plan *p, char *err, size_t errlen);
/* Prints the plan as comment lines: a summary ("# plan: arena N bytes, peak
 * live N bytes, in place N, views N, scratch N at N, updates in place N,
 * f32 N B, ...") and, when per_value, one "# slot %id @offset +bytes" line
 * per materialized value, "# view %id of %owner @offset +delta" per view
 * (the owner's offset and the view's byte offset inside it) and
 * "# update %id in state %leaf" per update written in place. */
AL_HIDDEN void plan_print(const ir_graph *g, const mem_plan *p, bool per_value, FILE *out);
/* Frees what plan_build allocated and empties p (safe on an empty plan). */
AL_HIDDEN void plan_free(mem_plan *p);

#endif
