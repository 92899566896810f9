/* emit_impl.h - what the emitter's files share: a text buffer, dtype spellings, and the per-kernel parameter list. */
#ifndef ALLOY_EMIT_IMPL_H
#define ALLOY_EMIT_IMPL_H

#include "codegen/emit.h"
#include "codegen/text.h"
#include "step/attn_views.h"

/* Appends the source every kernel starts with: alloy's f16/bf16 conversions
 * (inline PTX on the device, the CPU's bit-exact integer rules elsewhere),
 * the range rule, warp reductions. */
AL_HIDDEN void cg_put_preamble(cg_text *t);
/* The C++ type a dtype is stored as ("float", "unsigned short", ...). */
AL_HIDDEN const char *cg_storage(alloy_dtype dt);
/* Appends the expression loading p[idx] (dtype dt) into compute type T
 * (wide: double, else float). idx is C text. */
AL_HIDDEN void cg_load(cg_text *t, alloy_dtype dt, const char *p, const char *idx);
/* Appends the expression storing compute value v as dtype dt (wide: v is double). */
AL_HIDDEN void cg_store(cg_text *t, alloy_dtype dt, bool wide, const char *v);
/* Appends statements applying a member's flags to variable v (docs/fusion.md):
 * the range rule for MEMBER_RANGED, the round trip through dt for
 * MEMBER_EXACT. */
AL_HIDDEN void cg_apply_flags(cg_text *t, alloy_dtype dt, bool wide, uint8_t flags, const char *v);
/* A double as exact C text (hex float; inf and nan spelled by the preamble). */
AL_HIDDEN void cg_double(cg_text *t, double v);
/* Appends elementwise node x's expression (ops.def) with each attribute
 * P(k) written as its literal in T, as the CPU converts it (ir_ew_params). */
AL_HIDDEN void cg_put_expr(cg_text *t, const ir_node *x);

/* The parameters of the kernel being built: a node's buffer is added once. */
typedef struct cg_params {
    cg_param *at;
    int n, cap;
    bool oom;
} cg_params;

/* Index of the parameter (kind, node), added when new; `written` is or-ed in. */
AL_HIDDEN int cg_param_of(cg_params *ps, cg_param_kind kind, int node, bool written, int64_t count);
/* Appends "T *__restrict__ p0, const U *__restrict__ p1, ..." for ps. */
AL_HIDDEN void cg_param_list(cg_text *t, const ir_graph *g, const cg_params *ps);

/* An elementwise part being emitted: members [first, first + n) of step
 * `step`, read and written at flat index `e` (C text) of `space`. Values of
 * this part are variables v<m> (m: the member's index in s->members); with
 * `slot` set (row kernels), a member of an earlier part of the step is read
 * from this lane's register array r<m>[slot], and a member a later part
 * reads (MEMBER_SPILLED) is written there, rounded. */
typedef struct cg_ew_part {
    const ir_graph *g;
    const schedule *s;
    const sched_step *step;
    int first, n;
    const ir_type *space;
    bool wide;
    int product; /* member index of the GEMM's matmul whose f32 product feeds the part, or -1 */
    cg_params *ps;
    const char *e;
    const char *slot;
    /* vectorized kernels: with vec set, operands of the space's own shape
     * are read from this thread's array l<k>_[i_] and stores go to
     * s<k>_[i_] (k: the parameter); bit k - vbase of *vload / *vstore says
     * which (parameters outside [vbase, vbase + 64) set *vfail: the kernel,
     * or the multi step's chain, stays scalar) */
    bool vec;
    int vbase;
    uint64_t *vload, *vstore;
    bool *vfail;
    /* streaming row kernels: an earlier part's value is computed again by
     * the lambda r<m>(slot) instead of read from r<m>[slot], and nothing is
     * written to r<m>; with `quiet` (a lambda's body) no store and no
     * found_inf check either */
    bool stream, quiet;
    /* amp_check / amp_stats (CG_CHECK_*; 0: none): each member's value
     * checked where it is computed, the nodes so checked marked in covered */
    unsigned checks;
    uint8_t *covered;
} cg_ew_part;

/* Appends the statements computing the part's members at index p->e: loads
 * of operands from outside (broadcast against the space), each member's
 * expression from the op table, its flags, its store when stored, its
 * found_inf check (setting the kernel's `bad_`). */
AL_HIDDEN void cg_emit_members(cg_text *t, const cg_ew_part *p);
/* The memory index of element e (C text: a flat index over the value's
 * own dims) of node's value, into buf: e itself, for a value with a
 * padded row stride (sched_pad) its row times that stride plus its
 * column, for a strided [B, H, R, D] value (MEMBER_STRIDED:
 * step/attn_views.h) its place through the value's strides. */
AL_HIDDEN void cg_value_index(const ir_graph *g, const schedule *s, int node, const char *e, char *buf, size_t len);

/* Appends the host emulation's entry `NAME__host(void **params)` (under
 * ALLOY_HOST_EMULATION) and adds the kernel (taking text and params) to p;
 * false on OOM. */
AL_HIDDEN bool cg_add_kernel(cg_program *p, const ir_graph *g, const char *name, int step, step_kind kind,
                             cg_text *text, cg_params *params, unsigned grid, unsigned block, int64_t bytes);

/* The step emitters (emit_ew.c, emit_row.c): add the kernels of step k of
 * s to p, or return the reason none can be emitted (a static string). */
AL_HIDDEN const char *cg_emit_ew(cg_program *p, const ir_graph *g, const schedule *s, int k);
AL_HIDDEN const char *cg_emit_multi(cg_program *p, const ir_graph *g, const schedule *s, int k);
AL_HIDDEN const char *cg_emit_row(cg_program *p, const ir_graph *g, const schedule *s, int k);
/* The share of the elements of each row-shaped operand row step k's kernel
 * reads: 1, or for a step of causal rows that needs no column past a row's
 * live ones (cg_row_limited, emit_row_causal.c) their share of the row, (T + 1) / 2T
 * for [.., T, T] rows (the cost model's and the kernel's byte counts). */
AL_HIDDEN double cg_row_read_share(const ir_graph *g, const schedule *s, int k);
AL_HIDDEN const char *cg_emit_op(cg_program *p, const ir_graph *g, const schedule *s, int k); /* emit_op.c */
/* The direct kernel of a convolution, pool or backward op node n (step k, kernel `name`), or why none. (emit_conv.c) */
AL_HIDDEN const char *cg_emit_conv(cg_program *p, const ir_graph *g, int k, const ir_node *n, const char *name);
/* The kernel of conv1d/conv2d n heading GEMM step k: its f32 sums, bias
 * operand included, unrounded into the step's product (CG_PARAM_PRODUCT),
 * before the epilogue kernel; or why none. (emit_conv.c) */
AL_HIDDEN const char *cg_emit_conv_product(cg_program *p, const ir_graph *g, int k, const ir_node *n);
/* A single-op kernel of step k over `total` threads: body (statements at
 * flat index e, compute type T = compute_type) in a grid-stride loop,
 * file_scope before the kernel and `before` at its top (both may be
 * NULL); false on OOM. (emit_text.c) */
AL_HIDDEN bool cg_op_kernel(cg_program *prog, const ir_graph *g, int k, const char *name, const char *compute_type,
                            cg_text *body, cg_params *ps, int64_t total, const char *file_scope, const char *before);
/* Appends the counting of a one-launch reduction's block done (after the
 * stores before it): thread 0 adds 1 to counter p<cnt>[idx] (idx C text)
 * and the block was the last when the old value equals `last` (C text, an
 * unsigned: the blocks counting there, less 1); last_ (a __shared__
 * unsigned) says so, and the last sets the counter back to 0 for the next
 * run; fenced both sides, every thread past it (emit_reduce.c). */
AL_HIDDEN void cg_put_count_done(cg_text *b, int cnt, const char *idx, const char *last, const char *indent);
/* The kernel of reduce_sum / reduce_mean / reduce_max n of step k, named
 * name, or why none (emit_reduce.c). */
AL_HIDDEN const char *cg_emit_reduce(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name);
/* The lone cast (between float dtypes, not f64) that step k + 1 is of the
 * result of step k, a reduction split over chunks of rows (the column
 * kernel); else NULL. cg_emit_reduce_cast: the column kernel of step k
 * whose threads storing an output store its cast too, with the cast
 * kernel's statements ("alloy_s<k>_chain2_<op>", steps k and k + 1); NULL
 * or why not (emit_reduce.c). */
AL_HIDDEN const ir_node *cg_reduce_cast_of(const ir_graph *g, const schedule *s, int k);
AL_HIDDEN const char *cg_emit_reduce_cast(cg_program *prog, const ir_graph *g, const schedule *s, int k);
/* The reduction of step k + 1 that the kernel of elementwise step k can
 * compute too: a lone reduce_sum / mean / max (floating point, split over
 * chunks of rows: the column kernel) whose operand is a value step k
 * stores, of step k's space; else NULL (emit_reduce.c). */
AL_HIDDEN const ir_node *cg_ew_colsum_of(const ir_graph *g, const schedule *s, int k);
/* With that reduction, the lone cast of its result (between float dtypes,
 * not f64) that step k + 2 is, or NULL (emit_reduce.c). */
AL_HIDDEN const ir_node *cg_ew_colsum_cast(const ir_graph *g, const schedule *s, int k);
/* That one kernel ("alloy_s<k>_chain2_ew_<op>", steps k and k + 1; with
 * the cast, "chain3", step k + 2 too): a thread per (chunk of rows,
 * column) computes step k's members row by row, stores them, and adds the
 * operand as stored; the chunks' partials are added by the last block of
 * each CG_BLOCK columns, as the column kernel does, so the reduction's bits
 * are the same and its operand is not read again; the thread storing an
 * output casts it as the cast's kernel would. NULL, or why not
 * (emit_reduce.c). */
AL_HIDDEN const char *cg_emit_ew_colsum(cg_program *prog, const ir_graph *g, const schedule *s, int k);
/* The kernels of the indexing ops (gather, index_select, their gradients,
 * arange, cumsum) for node n of step k, or why none (emit_index.c). */
AL_HIDDEN const char *cg_emit_index(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name);
/* The two kernels of sum_squares n of step k (a multi-tensor reduction), or why none (emit_sum_squares.c). */
AL_HIDDEN const char *cg_emit_sum_squares(cg_program *prog, const ir_graph *g, const schedule *s, int k, const ir_node *n,
                                           const char *name);
/* The last kernel of a gradient norm n (sum_squares) whose first kernel
 * wrote per-chunk f32 sums to n's partials (CG_PARAM_ROWS, chunks + n->nin
 * of them): per operand i the f32 sum of partials [lo[i], hi[i]) (a warp
 * each), those added in f64 in operand order into n; with fi (a found_inf
 * in the same multi step) also fi's bool from its flag. "<name>_final". */
AL_HIDDEN const char *cg_emit_norm_final(cg_program *prog, const ir_graph *g, int k, const ir_node *n,
                                         const ir_node *fi, const char *name, int64_t chunks, const int64_t *lo,
                                         const int64_t *hi);
AL_HIDDEN const char *cg_emit_attention(cg_program *p, const ir_graph *g, const schedule *s, int k); /* emit_attention.c */

/* amp_check and amp_stats (emit_checks.c). Append the statements adding
 * value v (compute type T: double when wide) of node x to its range
 * statistics (before the range rule), or setting its NONFINITE_* flag (on
 * the value as its dtype stores it), when checks asks for them and x is a
 * value they look at (ir_amp_checked); whether they did. */
AL_HIDDEN bool cg_put_range(cg_text *t, cg_params *ps, const ir_graph *g, const ir_node *x, unsigned checks, bool wide,
                            const char *v);
AL_HIDDEN bool cg_put_flag(cg_text *t, cg_params *ps, const ir_graph *g, const ir_node *x, unsigned checks, bool wide,
                           const char *v);
/* The check kernel of step k (p->checks set): reads each stored checked
 * value of the step that no epilogue holds; none when there is none. NULL,
 * or "out of memory". */
AL_HIDDEN const char *cg_emit_check_kernel(cg_program *p, const ir_graph *g, const schedule *s, int k);

/* Threads per block of the elementwise kernels; their grid is capped so the
 * grid-stride loop does the rest. */
enum { CG_BLOCK = 256, CG_MAX_GRID = 4096 };

/* Whether the tensor-core attention kernels (emit_attention_mma.c, forward;
 * emit_attention_mma_grad.c, backward) take operands of dtype dt and this
 * head_dim: f16 or bf16, a multiple of 16 up to 128. */
AL_HIDDEN bool cg_attention_mma_takes(alloy_dtype dt, int64_t head_dim);
/* Emits that kernel for attention node n, step k, named name, its operands
 * in layouts st; NULL or why not. */
AL_HIDDEN const char *cg_emit_attention_mma(cg_program *prog, const ir_graph *g, const ir_node *n, int k, const char *name,
                                            const attn_strides *st);
/* The same for attention_grad node n: a row pass (delta, and the logsumexp
 * unless n's o is the output of an attention forward of the same operands
 * that kept it), one kernel over key blocks (name_keys: dV, dK and dQ) and,
 * over 64 keys, dq rounded from its f32 accumulator (name_dq). The
 * accumulator and the logsumexp stay contiguous scratch whatever st says. */
AL_HIDDEN const char *cg_emit_attention_grad_mma(cg_program *prog, const ir_graph *g, const ir_node *n, int k,
                                                 const attn_strides *st);
/* Every attention kernel's operand addressing, defined once in its
 * prologue (emit_attention.c): for X in Q K V O DO DQ DK DV LSE, XOFF_(bh)
 * the element offset of (batch, head) bh = b * H + h from the operand's
 * pointer, XROW_ the elements from one row to the next (an int when every
 * row's offset fits one; LSE: the rows buffer's logsumexp part, BH_ * T_
 * on from it the deltas); then the
 * matching #undefs. Needs T_ (cg_attention_strides_end: none). */
AL_HIDDEN void cg_attention_strides(cg_text *t, const attn_strides *st);
AL_HIDDEN void cg_attention_strides_end(cg_text *t);
/* What every tensor-core attention kernel opens with (preamble, the mma,
 * ldmatrix and cp.async definitions, the signature over ps, the shapes BH_
 * T_ S_ D_, the tiles ROWS_ TILE_ PS_ KS_ DN_ NT_, SCALE_ and SL2_ (scale *
 * log2 e), the macros MMA_, TO_, FROM_ and LIM_, and the operands' address
 * macros from st, cg_attention_strides), and its close (those macros
 * undefined, the kernel added with a 128-thread block per 64 of `rows` per
 * (batch, head)). */
AL_HIDDEN void cg_attention_mma_open(cg_text *t, const ir_graph *g, const ir_node *n, const cg_params *ps, const char *name,
                                     const attn_strides *st);
AL_HIDDEN bool cg_attention_mma_close(cg_program *prog, const ir_graph *g, const ir_node *n, int k, const char *name,
                                      cg_text *t, cg_params *ps, int64_t rows, int64_t bytes);

/* ---- row kernels (emit_row.c; the emit_row_*.c files each hold one part) ---- */

/* Rows up to CG_ROW_WARP_MAX_COLS columns get a warp each, CG_ROW_WARPS
 * rows to a block; longer rows a block of up to CG_ROW_MAX_TEAM threads
 * each, sized so a thread holds at most CG_ROW_TEAM_COLS columns. Rows
 * longer than that (CG_ROW_MAX_TEAM * CG_ROW_TEAM_COLS) stream: no column
 * is held, so no width spills (a step the streaming form cannot take, one
 * with column sums, holds up to CG_ROW_MAX_COLS_PER_THREAD columns a thread
 * instead). */
enum {
    CG_ROW_WARPS = 4,
    CG_ROW_WARP_MAX_COLS = 1024,
    CG_ROW_TEAM_COLS = 8,
    CG_ROW_MAX_TEAM = 1024,
    CG_ROW_MAX_COLS_PER_THREAD = 64
};

/* A row step's kernel being emitted: its rows, team, chunks and form, the
 * parameters so far (emit_row.c fills it, the emit_row_*.c files read it). */
typedef struct cg_row_kernel {
    const ir_graph *g;
    const schedule *s;
    const sched_step *st;
    int64_t C, rows;
    int64_t inner; /* elements after the row's axis: 1 when rows run along the last axis */
    int team; /* threads per row: 32 (a warp) or a whole block */
    int cpl;  /* columns per thread: j_ < cpl, at cg_row_column_of(j_) */
    /* columns in chunks of vw (1: one at a time): 16 bytes of the widest
     * row-shaped operand or stored member (row_width) */
    int vw;
    bool wide;
    const ir_type *space;
    cg_params ps;
    /* amp_check / amp_stats on the elementwise parts (cg_ew_part.checks, .covered) */
    unsigned checks;
    uint8_t *covered;
    /* vw > 1: the parameters (bit k) whose row this thread holds in
     * l<k>_[cpl], loaded by 16-byte accesses where first read (declared in
     * *decl); vfail: an elementwise part read or wrote a parameter past 63
     * (the kernel is emitted again a column at a time) */
    uint64_t loaded;
    cg_text *decl;
    bool vfail;
    /* the streaming form (rows over CG_ROW_MAX_TEAM * CG_ROW_TEAM_COLS
     * columns; vw is 1): no per-thread arrays. A MAX, MAP exp(x - max), SUM of the MAP is one
     * pass (a running max and a sum rescaled when it grows, the team's
     * combined at the end); V(k) is its MAP's expression, evaluated where
     * read; a member a later part reads is the lambda r<m>(slot) computing
     * it again at that column */
    bool stream;
    /* causal rows (ir_row_causal): some member is causal, and lim_ (the
     * row's live columns, ir_causal_live) is declared at the row's scope;
     * `limited` (cg_row_limited): the row's operands are loaded only up to lim_ */
    bool causal, limited;
} cg_row_kernel;

/* A row kernel's columns and operands (emit_row_operands.c).
 * cg_row_team_reduce: the call reducing this thread's a_ over the row's
 * team (max or sum). cg_row_column_of: the column of this thread's slot j
 * (C text) into buf. cg_row_put_columns: opens the loop over this
 * thread's columns (j_, col). */
AL_HIDDEN const char *cg_row_team_reduce(const cg_row_kernel *rk, bool max);
AL_HIDDEN void cg_row_column_of(const cg_row_kernel *rk, const char *j, char *buf, size_t len);
AL_HIDDEN void cg_row_put_columns(cg_text *t, const cg_row_kernel *rk);
/* Loads parameter k's row into this thread's l<k>_ by 16-byte chunks
 * (vw > 1) unless done already (emit_row_operands.c). */
AL_HIDDEN void cg_row_load(cg_text *t, cg_row_kernel *rk, int k);
/* The index of column `col` (C text) of this thread's row in node's value,
 * into buf (emit_row_operands.c). */
AL_HIDDEN void cg_row_element_index(const cg_row_kernel *rk, int node, const char *col, char *buf, size_t len);
/* Appends operand q of row op x at column `col`, slot `slot` (from l<reg>_
 * when reg >= 0); false when no row kernel reads its shape
 * (emit_row_operands.c). */
AL_HIDDEN bool cg_row_operand_at(cg_text *t, cg_row_kernel *rk, const ir_node *x, int q, const char *col,
                                 const char *slot, int reg);

/* Causal rows (emit_row_causal.c). cg_row_limited: whether row step st
 * reads no column past a row's live ones (its operands loaded up to lim_).
 * cg_row_column_bound, cg_row_ew_bound: the bound (C text, lim_ or C, into
 * buf) of row op x's stages and of an elementwise part's columns. */
AL_HIDDEN bool cg_row_limited(const ir_graph *g, const schedule *s, const sched_step *st);
AL_HIDDEN const char *cg_row_column_bound(const cg_row_kernel *rk, const ir_node *x, char *buf, size_t len);
AL_HIDDEN const char *cg_row_ew_bound(const cg_row_kernel *rk, const sched_part *part, char *buf, size_t len);

/* Row programs (emit_row_program.c). cg_row_declare_slots: declares row op
 * member m's S and V slots before every program of the row.
 * cg_row_program: appends member m's program, its stages in order (those
 * shared with an earlier program skipped); false when an operand is
 * broadcast in a way no kernel reads. */
AL_HIDDEN void cg_row_declare_slots(cg_text *t, const cg_row_kernel *rk, int m);
AL_HIDDEN bool cg_row_program(cg_text *t, cg_row_kernel *rk, int m);

/* The streaming form (emit_row_stream.c). cg_row_streamable: whether the
 * step's kernel can stream. cg_row_online_softmax: whether stages i..i + 2
 * of p are a softmax's max, exp and sum; cg_row_put_online_softmax appends
 * them as one pass. cg_row_stream_out: a streaming program's OUT stage.
 * cg_row_stream_part: an elementwise part of a streaming kernel. */
AL_HIDDEN bool cg_row_streamable(const cg_row_kernel *rk);
AL_HIDDEN bool cg_row_online_softmax(const ir_row_program *p, int i);
AL_HIDDEN void cg_row_put_online_softmax(cg_text *t, const cg_row_kernel *rk, int m, const ir_row_program *p, int i);
AL_HIDDEN void cg_row_stream_out(cg_text *t, cg_row_kernel *rk, int m, const ir_row_stage *sg);
AL_HIDDEN void cg_row_stream_part(cg_text *t, cg_row_kernel *rk, const sched_part *part, const ir_type *space);

/* Row teams of a step with column sums: CG_ROW_COLSUM_MAX_TEAMS of them at
 * most, each with CG_ROW_COLSUM_TEAM_ROWS rows or more where there are rows
 * enough. A block adds its teams' sums (a tree over its warps) into one
 * partial row of C sums in the scratch, so the partials are per block
 * (gpt2 at B8, 8192 rows: 1024 teams, 256 blocks). */
enum { CG_ROW_COLSUM_MAX_TEAMS = 1024, CG_ROW_COLSUM_TEAM_ROWS = 8 };
/* How the blocks' partial rows of a step's column sums are added in the
 * same launch (emit_row_colsum.c): by the last of `blocks` blocks, or with
 * groups > 1 by the last of each group of `group` blocks and then the
 * last of the groups. */
typedef struct cg_row_colsum_plan {
    int64_t blocks, group, groups; /* groups == 1: one level */
} cg_row_colsum_plan;
/* Column sums (emit_row_colsum.c). cg_row_colsum_plan_of: the plan for
 * `blocks` blocks; cg_row_colsum_rows: the partial rows in a sum's scratch.
 * cg_row_colsum_add: appends the adding of this row's columns of column
 * sum member m's operand to the thread's cs<m>[]; false when no row kernel
 * reads its shape. cg_row_colsum_frame: the text after the row loop for
 * the n stored column sums ms[]: the block's partial row, then the partial
 * rows added per column by the last blocks. */
AL_HIDDEN cg_row_colsum_plan cg_row_colsum_plan_of(int64_t blocks);
AL_HIDDEN int64_t cg_row_colsum_rows(const cg_row_colsum_plan *c);
AL_HIDDEN bool cg_row_colsum_add(cg_text *t, cg_row_kernel *rk, int m);
AL_HIDDEN void cg_row_colsum_frame(cg_text *post, cg_row_kernel *rk, const int *ms, int n, const cg_row_colsum_plan *c);

#endif
