/* cpu_fused_plan.c - the plan of a fused group's chunk loop: members, inputs, chunk buffers, GEMM product, in-place updates. */
/* No trapping math here (vmath.h, CPU_VECTOR_CLONES): the chunk functions'
 * selects then vectorize on every ISA level, not only with AVX-512's masks. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <string.h>

#include "ir/groups.h"
#include "base/convert.h"
#include "step/attn_views.h"
#include "runtime/cpu/cpu_fused.h"

/* Index of member id in members[0..n), or -1. members are ascending. */
static int member_index(const sched_member *members, int n, int id)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (members[mid].node == id) return mid;
        if (members[mid].node < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* Whether node n computes in f64 (cpu_ew_uses_f64 over its operands' values). */
static bool member_wide(const ir_node *n, const rt_tensor *values)
{
    rt_tensor in[3];
    for (int j = 0; j < n->nin && j < 3; j++) in[j] = values[n->in[j]];
    return cpu_ew_uses_f64(n, in);
}

/* Whether value id is stored through strides under x's schedule
 * (MEMBER_STRIDED, rank 4: step/attn_views.h); then the elements per step
 * of each dim of out (0 along a dim it broadcasts) into stride, and the
 * offset of its first element from its value's address into *base. */
static bool laid_out_strides(const cpu_exec *x, const ir_graph *g, int id, const ir_type *out, int64_t *stride,
                             int64_t *base)
{
    const schedule *s = x->sched;
    const ir_type *t = &g->nodes[id]->type;
    if (!s || x->graph != g || s->member_of[id] < 0 || !(s->members[s->member_of[id]].flags & MEMBER_STRIDED) ||
        t->rank != 4 || out->rank < 4)
        return false;
    attn_stride l = attn_layout_of(g, s, id);
    const int64_t per_dim[4] = {l.batch, l.head, l.row, 1};
    for (int d = 0; d < out->rank; d++) {
        int td = d - (out->rank - 4);
        stride[d] = td < 0 || t->dims[td] == 1 ? 0 : per_dim[td];
    }
    *base = l.base;
    return true;
}

/* Fills p's members and external inputs (arrays already sized for n members
 * and 3n inputs) and gives each member a chunk buffer: one per value live at
 * a time, none for a stored member of the compute type (computed in place
 * in its destination). ext_slots (ext_mask + 1 of them, all -1, at least
 * twice 3n) index the inputs by node id, so that a group of many inputs
 * (the global gradient norm's sum over every parameter) is planned in time
 * linear in its size. whole: the group's space when it runs over whole
 * values (x's strided ones then read and stored through their strides,
 * laid_out_strides), NULL for a block of rows. Returns NULL, or why the
 * group cannot run. */
const char *fz_make_plan(fz_plan *p, const cpu_exec *x, const ir_graph *g, const sched_member *members, int n,
                             const rt_tensor *values, const ir_type *whole, const ir_type **in_types, int *last_use,
                             int *free_slots, int *ext_slots, uint32_t ext_mask)
{
    const ir_node *first = g->nodes[members[0].node];
    p->wide = member_wide(first, values);
    alloy_dtype ct = p->wide ? ALLOY_F64 : ALLOY_F32;
    int *ext_id = last_use + n; /* node id of each input (3n ints after last_use) */
    p->ninputs = 0;
    for (int k = 0; k < n; k++) {
        const ir_node *m = g->nodes[members[k].node];
        const cpu_op *info = &cpu_ops[m->op];
        if (!ir_fuse_elementwise(g, m)) return "a member is not an elementwise op or a cast between f16, bf16 and f32";
        bool cast = m->op == IR_OP_cast;
        if (k > 0 && members[k].node <= members[k - 1].node) return "members are not in topological order";
        if (m->type.rank != first->type.rank ||
            memcmp(m->type.dims, first->type.dims, sizeof(int64_t) * (size_t)m->type.rank) != 0)
            return "members have different shapes";
        if (member_wide(m, values) != p->wide) return "members compute in different precisions";
        fz_member *mb = &p->members[k];
        /* a node alone runs the op table's own chunk function: bit for bit
         * cpu_elementwise, NaN payloads included */
        *mb = (fz_member){.f32 = cast ? fz_copy_f32 : n > 1 ? fz_kernels[m->op].f32 : info->ew_f32,
                          .f64 = cast ? fz_copy_f64 : n > 1 ? fz_kernels[m->op].f64 : info->ew_f64,
                          .nin = m->nin, .slot = -1, .dst = values[m->id].data, .dtype = m->type.dtype,
                          .check = (members[k].flags & MEMBER_CHECK) != 0,
                          .ranged = (members[k].flags & MEMBER_RANGED) != 0,
                          .exact = (members[k].flags & MEMBER_EXACT) != 0,
                          .es = alloy_dtype_size(m->type.dtype),
                          .src = {NO_OPERAND, NO_OPERAND, NO_OPERAND}};
        ir_ew_params(m, mb->p);
        int64_t base;
        if (whole && mb->dst && laid_out_strides(x, g, m->id, whole, mb->stride, &base)) {
            mb->scatter = true;
            mb->dst += (size_t)base * mb->es;
        }
        last_use[k] = -1;
        for (int j = 0; j < m->nin; j++) {
            int id = m->in[j], mi = member_index(members, n, id);
            if (mi >= k) return "a member reads a later member";
            if (mi >= 0) {
                mb->src[j] = -mi - 1;
                last_use[mi] = k;
                continue;
            }
            uint32_t h = ((uint32_t)id * 0x9e3779b1u) >> 7 & ext_mask;
            while (ext_slots[h] >= 0 && ext_id[ext_slots[h]] != id) h = (h + 1) & ext_mask;
            int e = ext_slots[h];
            if (e < 0) {
                const rt_tensor *v = &values[id];
                if (!v->data && ir_nbytes(&v->type)) return "an input of the group has no value";
                e = ext_slots[h] = p->ninputs;
                ext_id[e] = id;
                in_types[e] = &v->type;
                fz_input *in = &p->inputs[e];
                *in = (fz_input){.dtype = v->type.dtype, .es = alloy_dtype_size(v->type.dtype), .data = v->data,
                                 .into = -1};
                int64_t at;
                if (whole && laid_out_strides(x, g, id, whole, in->stride, &at)) {
                    in->laid_out = true;
                    in->data += (size_t)at * in->es;
                }
                p->ninputs++;
            }
            mb->src[j] = e;
        }
    }
    /* buffer slots by liveness, in member order */
    int nfree = 0;
    p->nslots = 0;
    for (int k = 0; k < n; k++) {
        fz_member *mb = &p->members[k];
        /* a cast of an external input that neither rounds nor limits
         * the range nor is computed into its destination: the input's
         * chunk buffer (or its data) holds the value for the whole chunk,
         * and no member writes into it */
        mb->passed = mb->f32 == fz_copy_f32 && mb->src[0] >= 0 && !mb->exact && !mb->ranged &&
                     !(mb->dst && mb->dtype == ct) && !mb->scatter;
        if ((mb->scatter || !(mb->dst && mb->dtype == ct)) && !mb->passed)
            mb->slot = nfree ? free_slots[--nfree] : p->nslots++;
        for (int j = 0; j < mb->nin; j++) {
            int mi = mb->src[j] < 0 && mb->src[j] != NO_OPERAND ? -mb->src[j] - 1 : -1;
            if (mi < 0 || last_use[mi] != k || p->members[mi].slot < 0) continue;
            bool dup = false; /* mul(a, a): free a's slot once */
            for (int i = 0; i < j; i++) dup |= mb->src[i] == mb->src[j];
            if (!dup) free_slots[nfree++] = p->members[mi].slot;
        }
        if (last_use[k] < 0 && mb->slot >= 0) free_slots[nfree++] = mb->slot;
    }
    return NULL;
}

/* Hands the GEMM product's range rule and rounded store (x->product) to
 * the chunk loop that loads it, where the product is an input walked
 * densely in f32; else (a broadcast product, an f64 group, a product no
 * member reads) does both over the whole product first, as one pass each. */
void fz_fold_product(cpu_exec *x, fz_plan *p)
{
    for (int k = 0; k < p->ninputs && !p->wide; k++) {
        fz_input *in = &p->inputs[k];
        if (in->data != (const char *)x->product || in->walk != WALK_DENSE) continue;
        in->ranged = x->product_ranged;
        in->range_dtype = x->product_dtype;
        in->store = x->product_store;
        in->store_dtype = x->product_dtype;
        return;
    }
    if (x->product_store) cvt_store_f32(x->product_dtype, x->product, x->product_store, (size_t)x->product_count);
    if (x->product_ranged) cpu_range_f32(x->product_dtype, x->product, x->product_count);
}

/* A cast member that stores its input as loaded (a widening to the
 * compute type: an f16 or bf16 value cast to f32, alone or in a group)
 * takes its input's chunks converted straight into its destination, and
 * passes them on, instead of converting into a chunk buffer and copying
 * that out. Only for a dense input that is converted (not read in place)
 * and does not overlap the destination. */
void fz_load_into_dst(fz_plan *p)
{
    alloy_dtype ct = p->wide ? ALLOY_F64 : ALLOY_F32;
    size_t cs = p->wide ? sizeof(double) : sizeof(float);
    for (int k = 0; k < p->nmembers; k++) {
        fz_member *mb = &p->members[k];
        if (mb->f32 != fz_copy_f32 || mb->src[0] < 0 || mb->exact || mb->ranged || !mb->dst || mb->dtype != ct ||
            mb->scatter)
            continue;
        fz_input *in = &p->inputs[mb->src[0]];
        if (in->walk != WALK_DENSE || in->into >= 0 || (in->dtype == ct && !in->aliased && !in->ranged)) continue;
        const char *lo = in->data, *hi = lo + (size_t)p->total * in->es;
        if (mb->dst < hi && lo < mb->dst + (size_t)p->total * cs) continue;
        in->into = k;
        mb->passed = true;
    }
}

/* For each input of p: the last member reading it (-1: none) in last[],
 * and in passed[] whether a member reading it passes it on; one pass over
 * the members (a group of every parameter's update has thousands). */
static void input_readers(const fz_plan *p, int *last, uint8_t *passed)
{
    for (int e = 0; e < p->ninputs; e++) last[e] = -1, passed[e] = 0;
    for (int j = 0; j < p->nmembers; j++) {
        const fz_member *mb = &p->members[j];
        for (int q = 0; q < mb->nin; q++) {
            int e = mb->src[q];
            if (e < 0 || e >= p->ninputs) continue;
            last[e] = j;
            passed[e] |= mb->passed;
        }
    }
}

/* Whether input e may be read in place although member k is stored over
 * it: every member reading it comes before k, or is k computed in a chunk
 * buffer of its own (the chunk functions' operands alias no output), and
 * none passes it on (a passed value is the input's chunk itself, which
 * k's store changes). Each chunk is then read before it is overwritten,
 * element for element at the same index. last, passed: input_readers'. */
static bool read_before_store(const fz_plan *p, const int *last, const uint8_t *passed, int e, int k)
{
    if (passed[e] || last[e] > k) return false;
    const fz_member *mb = &p->members[k];
    for (int q = 0; mb->slot < 0 && q < mb->nin; q++)
        if (mb->src[q] == e) return false;
    return true;
}

/* Marks the inputs a member is stored over (an update written into its
 * state's buffer, state_of from the plan, which it reads) and read after
 * that store (read_before_store): those are read through their chunk
 * buffer. ext_slots / ext_id / ext_mask: fz_make_plan's index of the inputs
 * by node id. last, passed: room for input_readers' (the plan block's:
 * a run allocates nothing here, so a step fails before any update). */
void fz_mark_aliased(fz_plan *p, const sched_member *members, int n, const int *state_of, const int *ext_slots,
                         const int *ext_id, uint32_t ext_mask, int *last, uint8_t *passed)
{
    bool known = false;
    for (int k = 0; k < n; k++) {
        int t = state_of[members[k].node];
        if (t < 0) continue;
        uint32_t h = ((uint32_t)t * 0x9e3779b1u) >> 7 & ext_mask;
        while (ext_slots[h] >= 0 && ext_id[ext_slots[h]] != t) h = (h + 1) & ext_mask;
        int e = ext_slots[h];
        if (e < 0) continue;
        if (!known) input_readers(p, last, passed), known = true;
        if (p->inputs[e].walk != WALK_DENSE || !read_before_store(p, last, passed, e, k)) p->inputs[e].aliased = true;
    }
}
