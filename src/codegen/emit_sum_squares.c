/* emit_sum_squares.c - the gradient norm's sum of squares over every gradient in two launches (a multi-tensor reduction), and the final kernel the unscale + found_inf multi launch shares. */
#include "codegen/emit_impl.h"

/* Elements one block iteration of the first kernel squares and sums. */
enum { SQ_CHUNK = 8192 };

/* Appends the branches choosing block b_'s operand among ops [lo, hi) by
 * comparisons on their first chunk (log2 of the operand count deep): the
 * operand's pointer x_, its element count n_, the chunk's first element lo_
 * and the range rule its loads apply, rg_ (range[]: 0 none, 1 f16, 2 bf16:
 * a widened product stored before its rule, sched_mark_ranged_reads). */
static void put_choice(cg_text *t, const int *param, const int64_t *first, const int64_t *count, const int *range,
                       int lo, int hi, int depth)
{
    if (hi - lo == 1) {
        cg_put(t, "%*s{ x_ = p%d; n_ = %lldll; lo_ = (b_ - %lldll) * %d; rg_ = %d; }\n", depth * 4, "", param[lo],
               (long long)count[lo], (long long)first[lo], SQ_CHUNK, range[lo]);
        return;
    }
    int mid = (lo + hi) / 2;
    cg_put(t, "%*sif (b_ < %lldll)\n", depth * 4, "", (long long)first[mid]);
    put_choice(t, param, first, count, range, lo, mid, depth + 1);
    cg_put(t, "%*selse\n", depth * 4, "");
    put_choice(t, param, first, count, range, mid, hi, depth + 1);
}

/* The first kernel's parameters, in order: the partials (chunks + one per
 * operand), the operands of any elements; fills param,
 * first and count per such operand and returns how many there are. */
static int sq_params(cg_params *ps, const ir_graph *g, const schedule *s, const ir_node *n, int64_t chunks,
                     const int64_t *start, int *param, int64_t *first, int64_t *count, int *range, int *part)
{
    int ne = 0;
    *part = cg_param_of(ps, CG_PARAM_ROWS, n->id, true, chunks + n->nin);
    for (int i = 0; i < n->nin; i++) {
        int64_t c = ir_numel(&g->nodes[n->in[i]]->type);
        if (c == 0) continue;
        param[ne] = cg_param_of(ps, CG_PARAM_NODE, n->in[i], false, 0);
        first[ne] = start[i], count[ne] = c;
        int m = s->member_of[n->in[i]];
        range[ne] = m < 0 || !(s->members[m].flags & MEMBER_RANGED_READ)       ? 0
                    : g->nodes[g->nodes[n->in[i]]->in[0]]->type.dtype == ALLOY_F16 ? 1
                                                                                 : 2;
        ne++;
    }
    return ne;
}

/* sum_squares n of step k: the first kernel gives each block chunks of
 * SQ_CHUNK elements of all operands at once (the operand found by a
 * balanced tree of comparisons), each block's f32 sum of squares to a
 * partial; the second, one block, sums each operand's partials in f32 (a
 * warp per operand, a shuffle tree) and adds those sums in f64 in operand
 * order, as the CPU does. Operands of no elements have no chunk and add 0. */
const char *cg_emit_sum_squares(cg_program *prog, const ir_graph *g, const schedule *s, int k, const ir_node *n,
                                const char *name)
{
    int nin = n->nin, ne = 0;
    int *param = al_calloc((size_t)nin + 1, sizeof *param), *range = al_calloc((size_t)nin + 1, sizeof *range);
    int64_t *first = al_calloc((size_t)nin + 2, sizeof *first), *count = al_calloc((size_t)nin + 1, sizeof *count);
    int64_t *start = al_calloc((size_t)nin + 2, sizeof *start);
    cg_params ps = {0};
    cg_text t = {0};
    bool ok = param && range && first && count && start;
    int64_t chunks = 0, bytes = 0;
    for (int i = 0; ok && i < nin; i++) { /* start[i]: operand i's first chunk */
        int64_t c = ir_numel(&g->nodes[n->in[i]]->type);
        start[i] = chunks;
        chunks += (c + SQ_CHUNK - 1) / SQ_CHUNK;
        bytes += c * 4;
    }
    if (ok) start[nin] = chunks;
    int part = -1;
    if (ok) ne = sq_params(&ps, g, s, n, chunks, start, param, first, count, range, &part);
    if (ok && ne) { /* the partials: one per chunk */
        cg_put_preamble(&t);
        cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", CG_BLOCK, name);
        cg_param_list(&t, g, &ps);
        cg_put(&t, ")\n{\n    __shared__ float red_[32];\n"
                   "    for (long long b_ = blockIdx.x; b_ < %lldll; b_ += gridDim.x) {\n"
                   "        const float *x_;\n        long long n_, lo_;\n        int rg_;\n",
               (long long)chunks);
        put_choice(&t, param, first, count, range, 0, ne, 2);
        cg_put(&t, "        const long long hi_ = lo_ + %dll < n_ ? lo_ + %dll : n_;\n"
                   "        float m_ = 0;\n"
                   "        for (long long i_ = lo_ + threadIdx.x; i_ < hi_; i_ += %d) { float v_ = x_[i_]; if (rg_) v_ = rg_ == 1 ? alloy_range_f16(v_) : alloy_range_bf16(v_); m_ += v_ * v_; }\n"
                   "        m_ = alloy_block_sum(m_, red_);\n"
                   "        if (threadIdx.x == 0) p%d[b_] = (double)m_;\n    }\n}\n",
               SQ_CHUNK, SQ_CHUNK, CG_BLOCK, part);
        ok = !t.oom && cg_add_kernel(prog, g, name, k, STEP_KIND_OP, &t, &ps,
                                     (unsigned)(chunks > CG_MAX_GRID ? CG_MAX_GRID : chunks), CG_BLOCK,
                                     bytes + 8 * chunks);
        cg_text_free(&t);
    }
    al_free(ps.at);
    ps = (cg_params){0};
    if (ok) ok = !cg_emit_norm_final(prog, g, k, n, NULL, name, chunks, start, start + 1);
    al_free(param), al_free(range), al_free(first), al_free(count), al_free(start);
    return ok ? NULL : "out of memory";
}

const char *cg_emit_norm_final(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const ir_node *fi,
                               const char *name, int64_t chunks, const int64_t *lo, const int64_t *hi)
{
    int nin = n->nin;
    cg_params ps = {0};
    cg_text t = {0};
    char kname[48];
    int part = cg_param_of(&ps, CG_PARAM_ROWS, n->id, true, chunks + nin);
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0);
    int flag = fi ? cg_param_of(&ps, CG_PARAM_FLAG, fi->id, false, 1) : -1;
    int found = fi ? cg_param_of(&ps, CG_PARAM_NODE, fi->id, true, 0) : -1;
    cg_put_preamble(&t);
    al_fmt(kname, sizeof kname, "%s_final", name);
    /* each operand's partials [lo, hi): a table in device memory, not a
     * local array (one indexed by the operand spills at GPT-2's 148) */
    cg_put(&t, "\nstatic __device__ const long long %s_lo[%d] = {", kname, nin > 0 ? nin : 1);
    for (int i = 0; i < nin; i++) cg_put(&t, "%s%lldll", i ? ", " : "", (long long)lo[i]);
    cg_put(&t, "%s};\nstatic __device__ const long long %s_hi[%d] = {", nin > 0 ? "" : "0", kname, nin > 0 ? nin : 1);
    for (int i = 0; i < nin; i++) cg_put(&t, "%s%lldll", i ? ", " : "", (long long)hi[i]);
    cg_put(&t, "%s};\n", nin > 0 ? "" : "0");
    cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", CG_BLOCK, kname);
    cg_param_list(&t, g, &ps);
    cg_put(&t, ")\n{\n");
    cg_put(&t, "    const int lane_ = threadIdx.x & 31;\n"
               "    for (int o_ = threadIdx.x >> 5; o_ < %d; o_ += %d) {\n"
               "        float m_ = 0;\n"
               "        const long long lo_ = %s_lo[o_], hi_ = %s_hi[o_];\n"
               "        for (long long c_ = lo_ + lane_; c_ < hi_; c_ += 32) m_ += (float)p%d[c_];\n"
               "        m_ = alloy_warp_sum(m_);\n"
               "        if (lane_ == 0) p%d[%lldll + o_] = (double)m_;\n    }\n"
               "    __syncthreads();\n"
               "    if (threadIdx.x == 0) {\n        double total_ = 0;\n"
               "        for (int o_ = 0; o_ < %d; o_++) total_ = o_ ? total_ + p%d[%lldll + o_] : p%d[%lldll + o_];\n"
               "        p%d[0] = total_;\n",
           nin, CG_BLOCK / 32, kname, kname, part, part, (long long)chunks, nin, part, (long long)chunks, part,
           (long long)chunks, out);
    if (fi) cg_put(&t, "        p%d[0] = (unsigned char)(p%d[0] != 0u);\n", found, flag);
    cg_put(&t, "    }\n}\n");
    bool ok = !t.oom && cg_add_kernel(prog, g, kname, k, fi ? STEP_KIND_MULTI : STEP_KIND_OP, &t, &ps, 1, CG_BLOCK,
                                      16 * (chunks + nin) + 8 + (fi ? 5 : 0));
    cg_text_free(&t);
    al_free(ps.at);
    return ok ? NULL : "out of memory";
}
