/* cpu_fused.c - runs a fusion group (or one elementwise node) as one chunked pass over its shape, split across threads. */
/* No trapping math here (vmath.h, CPU_VECTOR_CLONES): the chunk functions'
 * selects then vectorize on every ISA level, not only with AVX-512's masks. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "runtime/cpu/cpu_fused.h"
#include "runtime/cpu/cpu_workers.h"

/* Bytes of the plan block of a group of n members (members, inputs, input
 * types, last uses + input ids, free slots, the index of the inputs of
 * ext_cap entries, then each input's last reader and whether a reader
 * passes it on: fz_mark_aliased's). */
static size_t group_block_bytes(int n, uint32_t *ext_cap)
{
    uint32_t cap = 16;
    while (cap < 6 * (uint32_t)n) cap *= 2;
    if (ext_cap) *ext_cap = cap;
    return sizeof(fz_member) * (size_t)n + sizeof(fz_input) * 3 * (size_t)n + sizeof(ir_type *) * 3 * (size_t)n +
           sizeof(int) * 5 * (size_t)n + sizeof(int) * cap + (sizeof(int) + 1) * 3 * (size_t)n;
}

/* The most chunk-buffer bytes one thread needs for a group of n members:
 * at most 3n inputs and n slots of CHUNK f64, the roundtrip buffer, the
 * pointers (cpu_run_group_ex's share). */
static size_t share_bound(int n)
{
    size_t at = (size_t)4 * (size_t)n * CHUNK * sizeof(double) + (size_t)CHUNK * 8;
    return (at + sizeof(void *) * 4 * (size_t)n + 63) & ~(size_t)63;
}

alloy_status cpu_workers_reserve(cpu_workers *w, int n, int threads)
{
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    size_t block = group_block_bytes(n, NULL), scratch = share_bound(n) * (size_t)threads;
    if (w->group_block_bytes < block) {
        al_free(w->group_block);
        w->group_block = al_malloc(block);
        w->group_block_bytes = w->group_block ? block : 0;
        if (!w->group_block) return ALLOY_ERR_OOM;
    }
    if (w->scratch_bytes < scratch) {
        void *bigger = al_realloc(w->scratch, scratch);
        if (!bigger) return ALLOY_ERR_OOM;
        w->scratch = bigger;
        w->scratch_bytes = scratch;
    }
    return ALLOY_OK;
}

alloy_status cpu_run_group_ex(cpu_exec *x, const ir_graph *g, const sched_member *members, int n,
                              rt_tensor *values, cpu_workers *w, const ir_type *space, int *nonfinite)
{
    const ir_node *last = g->nodes[members[n - 1].node];
    char label[64];
    uint32_t ext_cap;
    size_t bytes = group_block_bytes(n, &ext_cap);
    /* the block reserved in w (cpu_workers_reserve), else one of its own */
    bool own = w->group_block_bytes < bytes;
    char *block = own ? al_malloc(bytes) : w->group_block;
    if (!block)
        return cpu_fail(x, ALLOY_ERR_OOM, "out of memory running the group ending at %s '%s'",
                        ir_ops[last->op].name, ir_node_label(last, label, sizeof label));
    fz_plan p = {.nmembers = n};
    p.members = (fz_member *)(void *)block;
    p.inputs = (fz_input *)(void *)(block + sizeof(fz_member) * (size_t)n);
    const ir_type **in_types = (const ir_type **)(void *)((char *)p.inputs + sizeof(fz_input) * 3 * (size_t)n);
    int *last_use = (int *)(void *)(in_types + 3 * (size_t)n);
    int *free_slots = last_use + 4 * (size_t)n, *ext_slots = free_slots + n;
    for (uint32_t i = 0; i < ext_cap; i++) ext_slots[i] = -1;
    p.nonfinite = nonfinite;
    const char *why = fz_make_plan(&p, x, g, members, n, values, space ? NULL : &last->type, in_types, last_use,
                                free_slots, ext_slots, ext_cap - 1);
    if (why) {
        if (own) al_free(block);
        return cpu_fail(x, ALLOY_ERR_VERIFY, "fusion group ending at %s '%s' cannot run: %s",
                        ir_ops[last->op].name, ir_node_label(last, label, sizeof label), why);
    }
    for (int k = 0; x->nonfinite && k < n; k++) /* amp_check, fused into the chunk loop */
        if (cpu_amp_checked(g, g->nodes[members[k].node])) p.members[k].flag = &x->nonfinite[members[k].node];
    for (int k = 0; x->ranges && k < n; k++) /* amp_stats, the same way */
        p.members[k].range = cpu_range_of(x, g, g->nodes[members[k].node]);
    if (!space) space = &last->type;
    p.total = ir_numel(space);
    if (p.total == 0) {
        if (own) al_free(block);
        return ALLOY_OK;
    }
    fz_build_space(&p, space, in_types);
    if (x->product) fz_fold_product(x, &p);
    if (x->state_of)
        fz_mark_aliased(&p, members, n, x->state_of, ext_slots, last_use + n, ext_cap - 1, ext_slots + ext_cap,
                     (uint8_t *)(ext_slots + ext_cap + 3 * (size_t)n));
    fz_load_into_dst(&p);
    size_t cs = p.wide ? sizeof(double) : sizeof(float);
    p.chunk = (size_t)(p.ninputs + p.nslots) * CHUNK * cs <= SMALL_BUFFERS ? CHUNK : CHUNK / 2;
    int64_t nchunks = (p.total + p.chunk - 1) / p.chunk;
    int64_t work = p.total * (p.ninputs + p.nmembers);
    int64_t want = x->nthreads < 1 ? 1 : x->nthreads > MAX_THREADS ? MAX_THREADS : x->nthreads;
    if (want > work / MIN_WORK) want = work / MIN_WORK;
    if (want > nchunks) want = nchunks;
    int threads = cpu_workers_threads(w, (int)want);
    w->ptr_at = (size_t)(p.ninputs + p.nslots) * (size_t)p.chunk * cs + (size_t)p.chunk * 8;
    w->share = (w->ptr_at + sizeof(void *) * (size_t)(p.ninputs + p.nmembers) + 63) & ~(size_t)63;
    if (w->scratch_bytes < w->share * (size_t)threads) {
        void *bigger = al_realloc(w->scratch, w->share * (size_t)threads);
        if (!bigger) {
            if (own) al_free(block);
            return cpu_fail(x, ALLOY_ERR_OOM, "out of memory for the chunk buffers of %s '%s'",
                            ir_ops[last->op].name, ir_node_label(last, label, sizeof label));
        }
        w->scratch = bigger;
        w->scratch_bytes = w->share * (size_t)threads;
    }
    fz_run_parallel(w, &p, threads, nchunks);
    if (own) al_free(block);
    return ALLOY_OK;
}
