/* emit.h - the CUDA C emitter: scheduled steps -> kernels (source, parameters, launch geometry), from the op table's expressions and row programs. */
#ifndef ALLOY_EMIT_H
#define ALLOY_EMIT_H

#include "ir/ir.h"
#include "step/plan.h"
#include "step/kernels.h"
#include "step/schedule.h"


/* Emits kernels for every step of schedule s of g that the emitter
 * generates: ew steps, row steps and row ops, gemm epilogues (after the
 * library GEMM), multi steps with their found_inf, casts. Fills *out
 * (cg_program_free) or returns ALLOY_ERR_OOM with err. */
AL_HIDDEN alloy_status cg_emit(const ir_graph *g, const schedule *s, cg_program *out, char *err, size_t errlen);
/* cg_emit with the amp_check / amp_stats statements (CG_CHECK_* in checks)
 * in the kernels: each checked value's flag, each f16/bf16 value's range,
 * in the CHECKS words (kernels.h); a check kernel after a step whose
 * stored values no epilogue holds. checks 0 is cg_emit: the same kernels,
 * byte for byte. LP_WIDEN in checks (launch_plan.h, the option
 * cuda_gemm_f32) is no check: an f16/bf16 product's cast to f32 is left to
 * the library GEMM, no kernel. */
AL_HIDDEN alloy_status cg_emit_checked(const ir_graph *g, const schedule *s, unsigned checks, cg_program *out,
                                       char *err, size_t errlen);
AL_HIDDEN void cg_program_free(cg_program *p);
/* Joins each run of one-block kernels of consecutive steps (op or ew steps
 * of one kernel each computing scalars, only node buffers as parameters, one block size, no
 * launch of anything else between them) into one kernel that calls their
 * code in order with a barrier between: the same statements, so the same
 * bits, in one launch (emit_chain.c). Programs with checks are left as
 * they are. ALLOY_ERR_OOM with err. */
AL_HIDDEN alloy_status cg_chain_kernels(cg_program *p, const ir_graph *g, const schedule *s, char *err,
                                        size_t errlen);
/* How many steps kernel kn computes: N for a chain kernel
 * (`alloy_s<k>_chain<N>`: the N steps from k that are not views), else 1. */
AL_HIDDEN int cg_chain_steps(const cg_kernel *kn);
/* One source holding kernels [first, first + n) of p after a single
 * preamble (an NVRTC program or a host-emulation library with many
 * kernels); al_free it. NULL on OOM. */
AL_HIDDEN char *cg_module_source(const cg_program *p, int first, int n);


#endif
