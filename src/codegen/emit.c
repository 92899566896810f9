/* emit.c - the emitter's driver: one or more kernels per scheduled step, and the list of steps left to libraries or to later work. */
#include <string.h>

#include "codegen/emit_impl.h"
#include "ir/groups.h"
#include "step/launch_plan.h"

static bool note_skipped(cg_program *p, int step, const char *why)
{
    int *steps = al_realloc(p->skipped, sizeof(int) * (size_t)(p->nskipped + 1));
    if (steps) p->skipped = steps;
    const char **whys = al_realloc(p->why, sizeof(char *) * (size_t)(p->nskipped + 1));
    if (whys) p->why = whys;
    if (!steps || !whys) return false;
    p->skipped[p->nskipped] = step;
    p->why[p->nskipped++] = why;
    return true;
}

alloy_status cg_emit(const ir_graph *g, const schedule *s, cg_program *out, char *err, size_t errlen)
{
    return cg_emit_checked(g, s, 0, out, err, errlen);
}

alloy_status cg_emit_checked(const ir_graph *g, const schedule *s, unsigned checks, cg_program *out, char *err,
                             size_t errlen)
{
    memset(out, 0, sizeof *out);
    const unsigned widen = checks & LP_WIDEN; /* not a check: which gemm steps the library takes */
    checks &= ~LP_WIDEN;
    if (checks && !(out->covered = al_calloc((size_t)g->nnodes + 1, 1))) {
        al_fmt(err, errlen, "out of memory for the checks of %d nodes", g->nnodes);
        return ALLOY_ERR_OOM;
    }
    out->checks = checks;
    for (int k = 0; k < s->nsteps; k++) {
        const sched_step *st = &s->steps[k];
        const ir_node *last = g->nodes[st->pos];
        const char *why;
        switch (st->kind) {
        case STEP_KIND_EW:
            /* a column reduction of one of its values next: one kernel for the two steps, none for the next */
            if (!checks && cg_ew_colsum_of(g, s, k)) {
                int joined = cg_ew_colsum_cast(g, s, k) ? 2 : 1;
                why = cg_emit_ew_colsum(out, g, s, k);
                if (!why) {
                    k += joined;
                    continue;
                }
            } else {
                why = cg_emit_ew(out, g, s, k);
            }
            break;
        case STEP_KIND_GEMM: { /* a matmul's product comes from the library; a convolution's from its kernel */
            const ir_node *head = g->nodes[s->members[st->first].node];
            lp_library lib;
            if (lp_library_epilogue(g, s, k, checks | widen, &lib)) continue; /* the library computes it whole: no kernel */
            why = !ir_gemm_head(head)           ? "a gemm step that does not start with a matmul or convolution"
                  : head->op == IR_OP_matmul ? NULL
                                             : cg_emit_conv_product(out, g, k, head);
            if (!why) why = cg_emit_ew(out, g, s, k);
            break;
        }
        case STEP_KIND_MULTI: why = cg_emit_multi(out, g, s, k); break;
        case STEP_KIND_ROW: why = cg_emit_row(out, g, s, k); break;
        case STEP_KIND_OP:
            if (s->members[st->first].flags & MEMBER_VIEW) continue; /* no kernel: the plan aliases its value */
            /* a column reduction with a cast of its result next: one kernel for the two */
            if (!checks && cg_reduce_cast_of(g, s, k) && !(why = cg_emit_reduce_cast(out, g, s, k))) {
                k++;
                continue;
            }
            why = ir_ops[last->op].row ? cg_emit_row(out, g, s, k)
                  : last->op == IR_OP_cast ? cg_emit_ew(out, g, s, k)
                                           : cg_emit_op(out, g, s, k);
            break;
        case STEP_KIND_COLLECTIVE: why = "a library collective (NCCL)"; break; /* the launch plan's collective action */
        default: why = "unknown step kind"; break;
        }
        /* amp_check / amp_stats on what no epilogue saw: after the step's
         * kernels, or after the library GEMM of a lone matmul */
        if (checks && (!why || (st->kind == STEP_KIND_OP && last->op == IR_OP_matmul))) {
            const char *cw = cg_emit_check_kernel(out, g, s, k);
            if (cw) why = cw;
        }
        if (why && strcmp(why, "out of memory") == 0) {
            cg_program_free(out);
            al_fmt(err, errlen, "out of memory emitting step %d", k);
            return ALLOY_ERR_OOM;
        }
        if (why && !note_skipped(out, k, why)) {
            cg_program_free(out);
            al_fmt(err, errlen, "out of memory emitting step %d", k);
            return ALLOY_ERR_OOM;
        }
    }
    alloy_status st = cg_chain_kernels(out, g, s, err, errlen);
    if (st) cg_program_free(out);
    return st;
}

void cg_program_free(cg_program *p)
{
    for (int i = 0; i < p->nkernels; i++) {
        al_free(p->kernels[i].source);
        al_free(p->kernels[i].params);
    }
    al_free(p->kernels), al_free(p->skipped), al_free(p->why), al_free(p->covered);
    memset(p, 0, sizeof *p);
}
