/* cpu.h - the CPU reference backend: tensors in host memory, kernels per op, the executor. */
#ifndef ALLOY_CPU_H
#define ALLOY_CPU_H

#include "ir/ir.h"
#include "kernels/ref.h"
#include "step/plan.h"
#include "step/schedule.h"
#include "runtime/backend.h" /* rt_range */

typedef struct cpu_exec cpu_exec;
typedef struct rt_tensor rt_tensor;
/* What one run lends its kernels and groups (cpu_workers.c): chunk buffers and worker
 * threads, started when a group is first big enough to split. */
typedef struct cpu_workers cpu_workers;

/* A value during execution: the node's type and its dense row-major data. */
struct rt_tensor {
    ir_type type;
    void *data;
};

/* Execution context: the first error of a run and worker settings. */
struct cpu_exec {
    alloy_status status;
    char error[512];
    int nthreads; /* worker threads kernels may use (>= 1) */
    char *scratch; /* the arena's scratch (mem_plan.scratch_*), or NULL: GEMM groups then al_malloc */
    size_t scratch_bytes;
    cpu_workers *workers;  /* the run's threads, for kernels (matmul); NULL: one thread */
    /* while cpu_run_schedule runs: its graph and schedule, whose strided
     * views (MEMBER_STRIDED, step/attn_views.h) the attention ops read and
     * write through strides; NULL: every value row-major. The graph also
     * says which softmax rows are causal (ir_row_causal: live columns only,
     * +0 past them); a kernel run without it computes whole rows (a masked
     * column's gradient may then be -0), so an executor of single nodes
     * that must give a run's bits sets it. */
    const ir_graph *graph;
    const schedule *sched;
    int lowp_gemm;         /* opt_lowp_gemm: the f16/bf16 GEMM kernel asked for */
    double *step_us;       /* the profile option: per schedule step, the microseconds it took (NULL: not timed) */
    struct alloy_comm *comm; /* the run's communicator for collectives (NULL: one process, a collective is a copy) */
    /* while a GEMM step's epilogue runs (cpu_run_gemm): the GEMM's
     * unrounded f32 product, which the epilogue reads in place; the group
     * gives it the range rule of product_dtype (when ranged) and, where
     * product_store is not NULL, stores it rounded to product_dtype there,
     * in the chunk loop that reads it (cpu_run_group_ex); NULL otherwise */
    /* while the steps that write state buffers in place run: the plan's
     * state_of (a group reads an input it is stored over through a copy
     * where a member reads it after the store, cpu_run_group_ex); NULL
     * otherwise */
    const int *state_of;
    /* the amp_check option (rt_run_args.nonfinite): per node, the
     * NONFINITE_* bits of each checked value; NULL: not checking */
    uint8_t *nonfinite;
    /* the amp_stats option (rt_run_args.ranges): per node; NULL: not tracking */
    rt_range *ranges;
    float *product;
    int64_t product_count;
    void *product_store;
    alloy_dtype product_dtype;
    bool product_ranged;
};

/* Records a run-time error on x (first wins) and returns status. Messages
 * name the op and node: "embedding 'tok_emb': id 70 out of range [0, 65)". */
AL_HIDDEN alloy_status cpu_fail(cpu_exec *x, alloy_status status, const char *fmt, ...)
    AL_PRINTF(3, 4);

/* Runs schedule s of g (step/schedule.h) step by step over
 * values[0..nnodes): the caller sets values[i].data of the input, param
 * and state leaves (not owned); every stored member's value is at arena +
 * plan->offset[i] (plan from plan_for_schedule for this s; arena at least
 * plan->arena_bytes, PLAN_ALIGN-aligned, scratch included); a member that
 * is not stored keeps data NULL. A value past its last reader that is not
 * kept is set to NULL (its slot is reused); kept ones stay valid until
 * the arena is reused. Stops at the first error. x->nthreads: 0 = every
 * online CPU. */
AL_HIDDEN alloy_status cpu_run_schedule(cpu_exec *x, const ir_graph *g, const schedule *s, const mem_plan *plan,
                                        char *arena, rt_tensor *values, cpu_workers *w);
/* Schedules, plans and runs g in an arena of its own, keeping keep[] (NULL:
 * outputs, updates and the loss): the kept values end in al_malloc blocks
 * owned by values[i] (release with cpu_release_values), the others NULL.
 * For tests and tools; the graph object runs through the backend. */
AL_HIDDEN alloy_status cpu_run_graph(cpu_exec *x, const ir_graph *g, rt_tensor *values, const bool *keep);
/* Frees every value cpu_run_graph allocated. */
AL_HIDDEN void cpu_release_values(const ir_graph *g, rt_tensor *values);

/* NULL on OOM. Threads need not start: without them all runs on the caller. */
AL_HIDDEN cpu_workers *cpu_workers_new(void);
/* Stops and joins the threads and frees w (NULL is fine). */
AL_HIDDEN void cpu_workers_free(cpu_workers *w);

/* Runs members[0..n) (an EW part of a schedule, or one elementwise node:
 * ascending ids, one result shape and one compute type) as one pass over
 * `space` (NULL: the last member's type, whole values: those x's schedule
 * stores through strides, step/attn_views.h, are then read and stored
 * through them; the row executor passes a block of rows) in chunks: each
 * input from outside the list is loaded once per
 * chunk, converted to the compute type, the members are evaluated in order
 * into chunk buffers, honouring their flags (MEMBER_EXACT values rounded to
 * their dtype, MEMBER_RANGED ones overflowing to inf as a store would), and
 * a member is stored, rounded once to its dtype, into values[id].data when
 * that is set (NULL: never materialized). When nonfinite is non-NULL it is
 * set to 1 if a MEMBER_CHECK member has an inf or NaN as it would be stored
 * (found_inf fused into the pass). The chunks are split over up to
 * x->nthreads threads when the work is big enough; every element is
 * computed alone, so the results do not depend on the thread count. A list
 * that breaks these rules is ALLOY_ERR_VERIFY. */
AL_HIDDEN alloy_status cpu_run_group_ex(cpu_exec *x, const ir_graph *g, const sched_member *members, int n,
                                        rt_tensor *values, cpu_workers *w, const ir_type *space, int *nonfinite);
/* Reserves in w what any group of up to n members needs to run on up to
 * `threads` threads (its plan block and chunk buffers), so that such
 * groups then run without allocating; ALLOY_ERR_OOM when it cannot. */
AL_HIDDEN alloy_status cpu_workers_reserve(cpu_workers *w, int n, int threads);
/* Whether amp_check looks at node n of g: a float value computed by the
 * step, not a leaf or constant, not one meant to hold infinities (a
 * causal_mask, or an op with a non-finite constant operand, as a masked
 * fill's -inf), and not data movement (reshape, slice, gather, ...: its
 * values are its operands', checked where they were computed). */
AL_HIDDEN bool cpu_amp_checked(const ir_graph *g, const ir_node *n);
/* NONFINITE_INF | NONFINITE_NAN for the infs and NaNs among n values of
 * dtype dt at p (integers and bools have none). */
AL_HIDDEN int cpu_nonfinite_bits(alloy_dtype dt, const void *p, int64_t n);
/* The same for n f32 values standing for dtype dt: those a store to dt
 * would round to inf count as infs. */
AL_HIDDEN int cpu_nonfinite_bits_f32(alloy_dtype dt, const float *y, int64_t n);
/* cpu_range_stats.c: the amp_stats option. r's entry for a value of dtype
 * dt (f16 or bf16; others add nothing) gets n elements: f32 or f64 values
 * before the store rounds them (so 7.1e4 reads as 7.1e4, not inf), or the
 * stored 16-bit patterns. Safe on any thread. */
AL_HIDDEN void cpu_range_add_f32(rt_range *r, alloy_dtype dt, const float *y, int64_t n);
AL_HIDDEN void cpu_range_add_f64(rt_range *r, alloy_dtype dt, const double *y, int64_t n);
AL_HIDDEN void cpu_range_add_stored(rt_range *r, alloy_dtype dt, const void *p, int64_t n);
/* x's entry for node n when amp_stats tracks it (an f16/bf16 value
 * cpu_amp_checked looks at), else NULL. */
AL_HIDDEN rt_range *cpu_range_of(const cpu_exec *x, const ir_graph *g, const ir_node *n);
/* Sets every element of y (n f32 values standing for dtype dt) that a store
 * to f16/bf16 would round to inf to that inf; other dtypes: nothing. */
AL_HIDDEN void cpu_range_f32(alloy_dtype dt, float *y, int64_t n);
/* Thread `thread`'s array of at least n values, kept in w across groups
 * and runs (a row group's block views: cpu_groups.c sets the entries it
 * reads before each block, so a group costs its own size, not the
 * graph's); NULL when out of memory. */
AL_HIDDEN rt_tensor *cpu_workers_views(cpu_workers *w, int thread, int n);
/* A buffer of at least `bytes` that w keeps (grown as asked, freed with
 * w), for one kernel at a time on the calling thread (the f16/bf16 GEMM's
 * packed operands); NULL when it cannot grow. */
AL_HIDDEN void *cpu_workers_buffer(cpu_workers *w, size_t bytes);
/* Starts up to want threads in all (the caller included) and returns how many there are. */
AL_HIDDEN int cpu_workers_threads(cpu_workers *w, int want);
/* Runs fn(arg, block, thread) for every block in [0, nblocks) on `threads`
 * threads (from cpu_workers_threads; the caller is thread 0), each block
 * once, and returns when all are done. */
AL_HIDDEN void cpu_workers_run(cpu_workers *w, int threads, int64_t nblocks,
                               void (*fn)(void *arg, int64_t block, int thread), void *arg);

/* matmul n of in into out (an f16/bf16 product in its own dtype, k > 0,
 * not over strided views) with epi applied to each f32 sum in the GEMM's
 * tiles before the one rounding (gemm_lowp_epi); ALLOY_ERR_INVALID, with
 * the reason, for any other matmul. */
struct gemm_lowp_epilogue;
AL_HIDDEN alloy_status cpu_matmul_epilogue(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in,
                                           const struct gemm_lowp_epilogue *epi);

/* The ROW, GEMM and MULTI steps (cpu_groups.c), their stored members given
 * memory in values by the caller, as cpu_run_group_ex does for EW. */
AL_HIDDEN alloy_status cpu_run_row(cpu_exec *x, const ir_graph *g, const schedule *s, const sched_step *step,
                                   rt_tensor *values, cpu_workers *w);
AL_HIDDEN alloy_status cpu_run_gemm(cpu_exec *x, const ir_graph *g, const schedule *s, const sched_step *step,
                                    rt_tensor *values, cpu_workers *w);
AL_HIDDEN alloy_status cpu_run_multi(cpu_exec *x, const ir_graph *g, const schedule *s, const sched_step *step,
                                     rt_tensor *values, cpu_workers *w);
/* The f32 sum of t's squares (f32 elements) in the order cpu_sum_squares
 * sums one operand of n (n names the op in an error; *st says whether it
 * ran: out of memory for its few KiB of scratch is the one failure). */
AL_HIDDEN float cpu_square_sum_in_f32(cpu_exec *x, const ir_node *n, const rt_tensor *t, alloy_status *st);
/* Runs node n by its op's kernel (cpu_ops) on its operands' values into
 * values[n->id] (cpu_ops.c): a lone op step, or a MULTI step's sum_squares;
 * errors go to x. */
AL_HIDDEN void cpu_run_op(cpu_exec *x, const ir_node *n, rt_tensor *values);

/* Runs row op n's program (cpu_rows.c; the programs of ops.def:
 * cpu_row_programs.c) over every row of its operands in[] (whole rows
 * along its axis) into out; `total_rows` is what
 * the program reads as ROWS (the row count of the whole op when in[] are
 * views of some of its rows). An op whose program gives a result per row
 * writes those, in the compute type, to results[row] instead of out, and
 * each row's weight (1 without a WEIGHT stage) to results[total_rows + row].
 * causal (ir_row_causal(graph, n)): in[]'s rows start at a multiple of
 * T of n's [.., T, S] rows, and each row is read only at its
 * ir_causal_live columns, its result 0 past them. */
AL_HIDDEN alloy_status cpu_row_run(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in,
                                   int64_t total_rows, void *results, bool causal);
/* out = the sum of rows per-row results divided by the sum of their weights
 * (results[rows ..]), or their sum when `sum` (compute type f64 when wide). */
AL_HIDDEN void cpu_row_mean(bool wide, bool sum, const void *results, int64_t rows, rt_tensor *out);

/* Kernels compute in f64 when `wide`, else f32:
 * n elements of dtype dt at src into a compute buffer, and back. */
AL_HIDDEN void cpu_load_compute(bool wide, alloy_dtype dt, const void *src, void *dst, int64_t n);
AL_HIDDEN void cpu_store_compute(bool wide, alloy_dtype dt, const void *src, void *dst, int64_t n);
/* al_malloc of n compute elements (at least one, so n == 0 is not a failure). */
AL_HIDDEN void *cpu_alloc_compute(bool wide, int64_t n);
/* Element i of an i32 or i64 tensor. */
AL_HIDDEN int64_t cpu_index_at(const rt_tensor *t, int64_t i);
/* An i32 or i64 tensor as the index operand of kernels/ref.h. */
AL_HIDDEN ref_index cpu_index(const rt_tensor *t);
/* Checks every integer of t is in [0, limit); else ref_check_indices' error
 * "op 'node': NOUN v out of range [0, limit) at position [i,j]" on x (noun:
 * "id", "index", "target"). */
AL_HIDDEN alloy_status cpu_check_indices(cpu_exec *x, const ir_node *n, const rt_tensor *t, int64_t limit,
                                         const char *noun);
/* The targets of loss n as cpu_check_indices, but for the value of n's
 * ignore_index attribute where it has one. */
AL_HIDDEN alloy_status cpu_check_targets(cpu_exec *x, const ir_node *n, const rt_tensor *t, int64_t limit);
/* Records "op 'node': out of memory" on x. */
AL_HIDDEN alloy_status cpu_out_of_memory(cpu_exec *x, const ir_node *n);

/* The compute type of an elementwise op: f64 when any operand is f64 or an
 * integer, else f32 (f16/bf16 load to f32 and round once on store). */
AL_HIDDEN bool cpu_ew_uses_f64(const ir_node *n, const rt_tensor *in);

/* A CPU kernel: computes out from in (operand values in operand order). */
typedef alloy_status (*cpu_kernel)(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in);
/* Elementwise chunk function: y[i] = f(a[i], b[i], c[i]) for i < n in the
 * compute type (f32 or f64); every operand points at n readable values (an
 * unused one at a's, whose reads are dead). p holds the op's
 * attributes as its expression reads them (P(k), ir_ew_params). */
typedef void (*cpu_ew_f32)(int64_t n, float *y, const float *a, const float *b, const float *c, const double *p);
typedef void (*cpu_ew_f64)(int64_t n, double *y, const double *a, const double *b, const double *c,
                           const double *p);

/* The CPU backend's per-op table (cpu_ops.c), expanded from ops.def: the
 * kernel of every op (ops.def's cpu_kernel column K is cpu_K; NULL for the
 * bound leaves), and for elementwise ops the shared broadcasting kernel
 * cpu_elementwise and the chunk functions generated from `expr`. */
typedef struct cpu_op {
    cpu_kernel kernel;
    cpu_ew_f32 ew_f32;
    cpu_ew_f64 ew_f64;
} cpu_op;
AL_HIDDEN extern const cpu_op cpu_ops[IR_OP_COUNT];

#define CPU_KERNEL(name)                                                                  \
    AL_HIDDEN alloy_status name(cpu_exec *x, const ir_node *n, rt_tensor *out,             \
                                const rt_tensor *in)
CPU_KERNEL(cpu_elementwise); /* cpu_elementwise.c: every EW op */
/* one prototype per ops.def OP line, and the chunk functions of every EW line */
#define OP(nm, mn, mx, at, ty, kernel, ...) CPU_KERNEL(cpu_##kernel);
#define EW(nm, ...)                                                                        \
    AL_HIDDEN void ew_##nm##_f32(int64_t n, float *y, const float *a, const float *b,      \
                                 const float *c, const double *p);                         \
    AL_HIDDEN void ew_##nm##_f64(int64_t n, double *y, const double *a, const double *b,   \
                                 const double *c, const double *p);
#include "ir/ops.def"
#undef OP
#undef EW
#undef CPU_KERNEL

#endif
