/* extents.c - the device memory each action of a launch plan touches, as extents for a checking device (extents.h). */
#include "runtime/cuda/extents.h"

/* The extent of place pl (bytes long) holding node's value (tag node + 1; -1: any value). */
static cdev_extent extent_at(const ir_graph *g, const lp_place *pl, cu_bases at, int64_t bytes, int node, bool written)
{
    cdev_extent x = {.bytes = bytes > 0 ? (uint64_t)bytes : 0, .offset = pl->offset, .space = (uint8_t)pl->space,
                     .written = written, .tag = node >= 0 ? (uint32_t)node + 1 : 0};
    switch (pl->space) {
    case LP_ARENA: x.base = at.arena + (cdev_ptr)pl->offset; break;
    case LP_AUX: x.base = at.aux + (cdev_ptr)pl->offset; break;
    case LP_LEAF: x.base = at.leaf[pl->node] ? at.leaf[pl->node] + (cdev_ptr)pl->offset : 0; break;
    }
    if (node >= 0) {
        char label[40];
        al_fmt(x.name, sizeof x.name, "%s (%s)", ir_node_label(g->nodes[node], label, sizeof label),
               ir_ops[g->nodes[node]->op].name);
    } else {
        al_fmt(x.name, sizeof x.name, "%s", written ? "the destination" : "the source");
    }
    return x;
}

/* Whether node shares its bytes with other values (a view, a gathered
 * piece, or the owner of such): its extent then holds whichever of them
 * last wrote there (tag 0), not node's own tag. */
static bool shares_bytes(const mem_plan *p, int node)
{
    if (node < 0 || !p->view_of) return false;
    if (p->view_of[node] >= 0) return true;
    for (int i = 0; i < p->nnodes; i++)
        if (p->view_of[i] == node) return true;
    return false;
}

/* extent_at with the tag cleared where node shares its bytes. */
static cdev_extent extent_of(const ir_graph *g, const mem_plan *p, const lp_place *pl, cu_bases at, int64_t bytes,
                             int node, bool written)
{
    cdev_extent x = extent_at(g, pl, at, bytes, node, written);
    if (shares_bytes(p, node)) x.tag = 0;
    return x;
}

/* The bytes of node's value where it lives: a leaf's whole buffer; a
 * transpose view (an attention operand read through strides, or a plain
 * view of an attention result stored in its order: step/attn_views.h) the
 * rest of its owner's slot from where it starts; else its type's size (its
 * rows at their padded row stride when sched_pad padded it). */
static int64_t value_bytes(const ir_graph *g, const schedule *s, const mem_plan *p, const lp_place *pl, int node)
{
    if (pl->space == LP_LEAF) return (int64_t)ir_nbytes(&g->nodes[pl->node]->type);
    int owner = p->view_of && pl->space == LP_ARENA ? p->view_of[node] : -1;
    bool strided = s->member_of[node] >= 0 && (s->members[s->member_of[node]].flags & MEMBER_STRIDED);
    if (owner >= 0 && (g->nodes[node]->op == IR_OP_transpose || strided)) /* a strided piece too: written in its owner's rows */
        return (int64_t)ir_nbytes(&g->nodes[owner]->type) - (p->offset[node] - p->offset[owner]);
    return sched_padded_numel(g, s, node) * (int64_t)alloy_dtype_size(g->nodes[node]->type.dtype);
}

int cu_action_extents(const ir_graph *g, const schedule *s, const mem_plan *p, const lp_plan *lp,
                      const cg_program *prog, const lp_action *a, cu_bases at, cdev_extent *out, int max)
{
    int n = 0;
    switch (a->kind) {
    case LP_KERNEL: {
        const cg_kernel *kn = &prog->kernels[a->index];
        const lp_place *args = &lp->args[lp->first_arg[a->index]];
        for (int i = 0; i < kn->nparams && n < max; i++) {
            const cg_param *pa = &kn->params[i];
            int64_t bytes;
            switch (pa->kind) {
            case CG_PARAM_NODE: bytes = value_bytes(g, s, p, &args[i], pa->node); break;
            case CG_PARAM_PRODUCT: bytes = (int64_t)p->scratch_bytes; break;
            case CG_PARAM_FLAG: bytes = 4; break;
            case CG_PARAM_COUNTER: /* zeroed when loaded, set back to 0 by each run: read before written */
                out[n] = extent_at(g, &args[i], at, 4 * pa->count, pa->node, true);
                out[n++].kept = true;
                continue;
            case CG_PARAM_CHECKS: /* the run's check words, atomics of every checked node (no value's) */
                out[n++] = extent_at(g, &args[i], at, (int64_t)lp->checks_bytes, -1, true);
                continue;
            default: bytes = pa->count * (g->nodes[pa->node]->type.dtype == ALLOY_F64 ? 8 : 4); break;
            }
            out[n++] = extent_of(g, p, &args[i], at, bytes, pa->node, pa->written);
        }
        break;
    }
    case LP_GEMM: {
        /* row-major out = a b is column-major D = B A: the GEMM's A is the matmul's second operand;
         * each operand's extent is its whole slot (a GEMM of an outer batch index starts inside it) */
        const lp_gemm *gm = &lp->gemms[a->index];
        const ir_node *mm = g->nodes[gm->node];
        lp_place pa, pb, pd = gm->out;
        bool scratch = gm->out.space == LP_ARENA && p->scratch_bytes && gm->out.offset >= (int64_t)p->scratch_offset &&
                       gm->out.offset < (int64_t)(p->scratch_offset + p->scratch_bytes);
        bool aux = lp_epilogue_aux(gm->epilogue);
        if (max < 3 + (gm->bias_node >= 0) + aux + gm->pointers || !lp_place_of(g, p, mm->in[1], &pa) || !lp_place_of(g, p, mm->in[0], &pb))
            break;
        if (scratch) pd.offset = (int64_t)p->scratch_offset;
        else if (!lp_place_of(g, p, gm->result, &pd)) break; /* the matmul's, or a library step's last member's */
        out[n++] = extent_of(g, p, &pa, at, value_bytes(g, s, p, &pa, mm->in[1]), mm->in[1], false);
        out[n++] = extent_of(g, p, &pb, at, value_bytes(g, s, p, &pb, mm->in[0]), mm->in[0], false);
        out[n++] = extent_of(g, p, &pd, at, scratch ? (int64_t)p->scratch_bytes : value_bytes(g, s, p, &pd, gm->result),
                             gm->result, true);
        if (gm->bias_node >= 0) /* the BIAS epilogue's vector, read whole */
            out[n++] = extent_of(g, p, &gm->bias, at, value_bytes(g, s, p, &gm->bias, gm->bias_node), gm->bias_node, false);
        lp_place px; /* a GELU_AUX epilogue's second output: GELU's input, its whole slot as D's */
        if (aux && lp_place_of(g, p, gm->aux_node, &px))
            out[n++] = extent_of(g, p, &px, at, value_bytes(g, s, p, &px, gm->aux_node), gm->aux_node, true);
        if (gm->pointers && n < max) { /* the arrays of the batch's matrix addresses (A's, B's, D's), written when built */
            out[n] = extent_at(g, &gm->ptr_at, at, 3 * 8 * gm->batch, -1, false);
            al_fmt(out[n].name, sizeof out[n].name, "the GEMM's pointer arrays");
            out[n++].kept = true;
        }
        break;
    }
    case LP_ZERO:
        if (max >= 1) out[n++] = extent_at(g, &a->dst, at, a->bytes, -1, true);
        break;
    case LP_COPY:
        if (max >= 2) {
            out[n++] = extent_at(g, &a->dst, at, a->bytes, -1, true);
            out[n++] = extent_at(g, &a->src, at, a->bytes, -1, false);
        }
        break;
    case LP_COLLECTIVE: /* the operand copied into the result unless in place; the library reduces it there */
        if (max >= 2) {
            int in = g->nodes[a->index]->in[0];
            out[n++] = extent_of(g, p, &a->dst, at, a->bytes, a->index, true);
            out[n++] = extent_of(g, p, &a->src, at, (int64_t)ir_nbytes(&g->nodes[in]->type), in, false);
        }
        break;
    }
    return n;
}
