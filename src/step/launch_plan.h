/* launch_plan.h - a CUDA executable as data: every kernel launch, library GEMM, memset and copy of one step of a compiled graph, in order, each argument a place in device memory. The CUDA backend replays it on a GPU; the tests replay it under the host emulation. */
#ifndef ALLOY_LAUNCH_H
#define ALLOY_LAUNCH_H

#include "ir/ir.h"
#include "step/kernels.h"
#include "step/plan.h"
#include "step/schedule.h"

/* The device memory a run addresses: the planned arena (values, and the
 * GEMM product scratch at its top), the buffers bound to leaves (inputs,
 * params, state), and the aux block (per-step flags and per-row partials,
 * reused by every step; the pointer-array GEMMs' arrays at its top). */
typedef enum lp_space { LP_ARENA, LP_LEAF, LP_AUX } lp_space;

/* A place: byte `offset` into the arena or aux block, or into the buffer
 * bound to leaf `node`. */
typedef struct lp_place {
    lp_space space;
    int node;
    int64_t offset;
} lp_place;

/* What a library GEMM does after the product (cuBLASLt's epilogue):
 * NONE: D = the product; BIAS: D = the f32 product + bias[i] for every
 * column (the vector of D's m rows: the row-major output's last dim, in
 * D's dtype, as CUBLASLT_EPILOGUE_BIAS defines it), rounded once into D's
 * dtype. The GELU ones apply gelu_tanh (cuBLASLt's GELU is the tanh form)
 * to the f32 sum (+ the bias), rounded once into D's dtype; with AUX the
 * GELU's input, rounded once into D's dtype, is written too, at `aux`
 * (ld_aux apart, cuBLASLt's EPILOGUE_AUX_POINTER / _AUX_LD / batch stride
 * stride_d): CUBLASLT_EPILOGUE_GELU, _GELU_BIAS, _GELU_AUX, _GELU_AUX_BIAS. */
typedef enum lp_epilogue {
    LP_EPILOGUE_NONE,
    LP_EPILOGUE_BIAS,
    LP_EPILOGUE_GELU,
    LP_EPILOGUE_GELU_BIAS,
    LP_EPILOGUE_GELU_AUX,
    LP_EPILOGUE_GELU_AUX_BIAS,
} lp_epilogue;

/* Whether epilogue e adds a bias, applies GELU, writes GELU's input. */
static inline bool lp_epilogue_bias(lp_epilogue e)
{
    return e == LP_EPILOGUE_BIAS || e == LP_EPILOGUE_GELU_BIAS || e == LP_EPILOGUE_GELU_AUX_BIAS;
}
static inline bool lp_epilogue_gelu(lp_epilogue e)
{
    return e == LP_EPILOGUE_GELU || e == LP_EPILOGUE_GELU_BIAS || e == LP_EPILOGUE_GELU_AUX ||
           e == LP_EPILOGUE_GELU_AUX_BIAS;
}
static inline bool lp_epilogue_aux(lp_epilogue e) { return e == LP_EPILOGUE_GELU_AUX || e == LP_EPILOGUE_GELU_AUX_BIAS; }

/* One library GEMM in the column-major convention cuBLAS(Lt) takes:
 * D[m x n] (leading dim ldd) = op(A) op(B), op(A) m x k, op(B) k x n,
 * ta/tb transposing the stored A (lda) and B (ldb); `batch` of them, the
 * operands advancing by stride_* elements per batch (0: broadcast). A
 * row-major matmul out = a b is D = out with A = b and B = a swapped.
 * Operands are `ab`, D is `d`; the sums are f32 (f64 for f64 operands).
 * D holds node `result`'s value: the matmul's, the plan's scratch (a gemm
 * step's f32 product), or for a step lp_library_epilogue takes, the
 * step's last member (a cast, the add of a BIAS epilogue, a GELU's).
 * With `pointers` the batch is cuBLASLt's pointer-array mode
 * (CUBLASLT_BATCH_MODE_POINTER_ARRAY; stride_* unused): matrix i of A is
 * at a plus ptr_offsets[ptrs + i] bytes, of B at b plus ptr_offsets[ptrs +
 * batch + i], of D at out plus ptr_offsets[ptrs + 2 batch + i]; the three
 * device arrays of those addresses (A's, B's, D's, batch 8-byte pointers
 * each) lie at ptr_at in the aux block, written once when the executable
 * is built (a, b and out are arena places, whose addresses an executable
 * keeps); the GEMM is called with the arrays' addresses for A, B and D. */
typedef struct lp_gemm {
    int node; /* the matmul */
    int step;
    int result;           /* the node whose value D is (the matmul, or a library step's last member) */
    lp_epilogue epilogue; /* with a bias: bias_node's m values at `bias` */
    int bias_node;        /* -1 without a bias */
    lp_place bias;
    int aux_node;         /* with AUX: the GELU input's node, its value at `aux`, ld_aux apart; else -1 */
    lp_place aux;
    int64_t ld_aux;
    alloy_dtype ab, d;
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldd;
    int64_t batch, stride_a, stride_b, stride_d;
    lp_place a, b, out;
    bool pointers; /* false: strided batch */
    int64_t ptrs;
    lp_place ptr_at;
} lp_gemm;

typedef enum lp_kind {
    LP_KERNEL, /* kernel `index` of the program, arguments args[first_arg[index]..] */
    LP_GEMM,   /* gemms[index] */
    LP_ZERO,   /* bytes at dst set to 0 (a step's flag; an empty sum's result) */
    LP_COPY,   /* bytes from src to dst (an update into its state buffer) */
    LP_COLLECTIVE, /* a collective step (node `index`: all_reduce, reduce_scatter, all_gather): all_reduce's
                    * operand at src copied to dst when they differ, then reduced over the ranks in place at dst
                    * (bytes: the result's) by the collective library */
} lp_kind;

typedef struct lp_action {
    lp_kind kind;
    int step;  /* the schedule step it belongs to; -1 for the update copies */
    int index; /* KERNEL, GEMM */
    lp_place dst, src;
    int64_t bytes;
} lp_action;

typedef struct lp_plan {
    lp_action *actions;
    int nactions;
    int first_update; /* actions [first_update, nactions) copy the updates into state */
    lp_gemm *gemms;
    int ngemms;
    int64_t *ptr_offsets; /* the pointer-array GEMMs' byte offsets (lp_gemm.ptrs) */
    int64_t nptr_offsets;
    size_t ptr_bytes;     /* their device arrays, at the top of the aux block */
    lp_place *args; /* per kernel k of the program: its nparams places from first_arg[k] */
    int *first_arg;
    int nkernels;
    size_t arena_bytes, aux_bytes;
    /* amp_check / amp_stats: the run's check words (kernels.h) at the aux
     * block's start, zeroed by the first action; 0 when the kernels have none */
    size_t checks_bytes;
    /* the kept statistics (CG_PARAM_KEPT), a slot per writing node for the
     * whole run, right above the check words; every step's own slots above them */
    size_t kept_bytes;
    /* the one-launch reductions' block counters (CG_PARAM_COUNTER), a slot
     * per node right above the kept statistics: zeroed once when the step is
     * loaded (each kernel's last block sets its counters back to 0) */
    size_t counter_bytes;
} lp_plan;

/* Every aux slot starts at a multiple of this (the library's preferred alignment). */
#define LP_AUX_ALIGN 256

/* The launch plan of schedule s of g with plan p and its emitted kernels
 * prog: per step, its flags zeroed, its GEMM (a gemm step's f32 product
 * into the plan's scratch, a lone matmul straight into its slot, a gemm
 * step the emitter left without a kernel that lp_library_epilogue takes:
 * product (+ bias) into the last member's slot in its dtype), its
 * kernels with their arguments placed, or its collective; then one copy per update into the
 * state leaf it names. A batched matmul whose operands or result have
 * two batch strides (strided views, step/attn_views.h) is one
 * pointer-array GEMM where its places are in the arena and it has no
 * bias, else (as any other product whose batch dims do not fold into one
 * stride) one strided GEMM per index of its outer batch dims. A step the emitter left without a kernel (other
 * than a GEMM) is ALLOY_ERR_UNSUPPORTED naming the step, its op and why;
 * a place that cannot be found, ALLOY_ERR_INVALID; OOM, ALLOY_ERR_OOM.
 * Fills *out (lp_free) or leaves it empty. */
AL_HIDDEN alloy_status lp_build(const ir_graph *g, const schedule *s, const mem_plan *p, const cg_program *prog,
                                lp_plan *out, char *err, size_t errlen);
AL_HIDDEN void lp_free(lp_plan *lp);
/* A gemm step one library call computes whole: D is node `result`'s
 * value in dtype d, plus the vector `bias` (-1: none) by cuBLASLt's BIAS
 * epilogue, through gelu_tanh when `gelu` (cuBLASLt's GELU epilogues),
 * its input node `aux` (-1: not stored) written too. */
typedef struct lp_library {
    int bias;
    int result;
    alloy_dtype d;
    bool gelu;
    int aux;
} lp_library;

/* In lp_library_epilogue's checks (and cg_emit_checked's): a product under
 * the range rule (an f16/bf16 matmul's, MEMBER_RANGED) may be cast to f32
 * by the library (the option cuda_gemm_f32); lp_build always passes it, for
 * a gemm step the emitter left without a kernel was decided with it. */
#define LP_WIDEN 0x100u

/* Whether gemm step k of s is computed whole by cuBLASLt in place of a
 * generated epilogue kernel: its members are a matmul (f16, bf16 or f32, a
 * non-empty sum) and then one of: the add of a bias; a cast to f32 (or to
 * the matmul's own dtype: D is A and B's dtype or f32, cuBLASLt's type
 * combinations); a cast to f32 and the add of a bias; gelu_tanh, or the
 * add of a bias and gelu_tanh, all in the matmul's dtype, f32 or bf16
 * (cuBLASLt's GELU epilogues; an f16 product keeps its kernel: the range
 * rule makes one at or below -65520 -inf, whose GELU is NaN, where
 * cuBLASLt's GELU of the f32 sum is -0). The bias is a vector of the output's last dim (every other
 * dim 1) in the add's dtype (cuBLASLt's bias is D's dtype). Each member is
 * read by the next alone, the last is stored, none is checked, and no
 * checks (amp_check / amp_stats) are asked; the one exception is GELU's
 * input, which may be stored too (the backward's gelu_tanh_grad reads
 * it): the GELU_AUX epilogues write it, where its row stride is D's and a
 * multiple of 8 elements (cuBLASLt's AUX_LD rule). The values are the
 * kernel's: the f32 sum (+ the bias in f32) rounded once into each stored
 * member's dtype, GELU taken of the unrounded f32 value. An f16/bf16
 * product cast to f32 only with LP_WIDEN in checks: the kernel applies
 * the range rule to it (beyond the f16/bf16 range it is inf before the
 * cast, so the loss scaler skips the step as unfused), cuBLASLt's f32 D
 * cannot and keeps it finite. Fills *out. The emitter emits no kernel for
 * such a step and lp_build gives its GEMM the epilogue; the one place
 * that decides. */
AL_HIDDEN bool lp_library_epilogue(const ir_graph *g, const schedule *s, int k, unsigned checks, lp_library *out);
/* Where node's value lives during a run: its leaf buffer, or its arena
 * slot; false when it has neither (a value fused away). */
AL_HIDDEN bool lp_place_of(const ir_graph *g, const mem_plan *p, int node, lp_place *out);
/* Largest power of two (at most 256) dividing every byte address the
 * operand takes: its offset and each batch's stride, given a base aligned
 * to 256 (a GEMM's declared alignment). */
AL_HIDDEN int lp_alignment(int64_t offset, int64_t stride_bytes, int64_t batch);
/* lp_alignment for operand `which` (0: A, 1: B, 2: D) of GEMM gm of lp:
 * its place's offset and, strided, each batch's stride; with pointer
 * arrays every matrix's offset. */
AL_HIDDEN int lp_gemm_alignment(const lp_plan *lp, const lp_gemm *gm, int which);
/* The device addresses of pointer-array GEMM gm's matrices (A's, B's,
 * D's: 3 * batch), given the addresses of its places a, b and out. */
AL_HIDDEN void lp_gemm_pointers(const lp_plan *lp, const lp_gemm *gm, uint64_t a, uint64_t b, uint64_t out,
                                uint64_t *ptrs);
/* Pointer-array GEMM gm (gm->pointers) as runs of strided-batch calls
 * (gemm_runs.c), for a cuBLASLt with no algorithm for pointer arrays: the
 * longest run length dividing the batch such that, in every run, the
 * matrices of A, B and D each lie a constant, non-negative number of
 * elements apart, the same in every run (a view with two batch strides,
 * [b][h], gives runs of the heads); *each the strided GEMM of one run (its
 * places gm's, offset per run by lp_gemm_run_offsets). Returns the run
 * length (1 at worst: a call per matrix). */
AL_HIDDEN int64_t lp_gemm_runs(const lp_plan *lp, const lp_gemm *gm, lp_gemm *each);
/* The byte offsets from gm's places a, b and out of run `run` of length len
 * (lp_gemm_runs): its first matrix's A, B and D. */
AL_HIDDEN void lp_gemm_run_offsets(const lp_plan *lp, const lp_gemm *gm, int64_t len, int64_t run, int64_t offsets[3]);

#endif
