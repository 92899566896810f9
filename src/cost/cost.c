/* cost.c - the launches of a compiled step read off its launch plan: bytes each moves, FLOPs, class, spill traffic; and their modelled times. */
#include <string.h>

#include "codegen/emit_impl.h"
#include "cost/cost.h"

static const char *const class_names[COST_NCLASSES] = {
    [COST_GEMM_ALIGNED] = "gemm",       [COST_GEMM_ODD] = "gemm odd ld",  [COST_ATTENTION] = "attention",
    [COST_ROW] = "row",                 [COST_LAYOUT] = "layout copy",    [COST_EPILOGUE] = "gemm epilogue",
    [COST_ELEMENTWISE] = "elementwise", [COST_MULTI] = "multi-tensor",    [COST_OTHER_OP] = "other op",
    [COST_TINY] = "tiny (<=4 blocks)",  [COST_MEMSET_CLASS] = "memset",   [COST_COPY_CLASS] = "update copy",
    [COST_COLLECTIVE_CLASS] = "collective",
};

const char *cost_class_name(cost_class c) { return c >= 0 && c < COST_NCLASSES ? class_names[c] : "?"; }

static bool is_layout(int op)
{
    return op == IR_OP_reshape || op == IR_OP_transpose || op == IR_OP_broadcast_to || op == IR_OP_slice ||
           op == IR_OP_concat || op == IR_OP_pad;
}

static bool is_low(alloy_dtype d) { return d == ALLOY_F16 || d == ALLOY_BF16; }

/* FLOPs of one member computed by a generated kernel: one per output
 * element of an elementwise op, one per operand element per column stage
 * of a row op's program (MAX, SUM, MAP, OUT), one per input element of a
 * reduction, 2 per multiply-add of a convolution; movement, casts,
 * gathers and the library's matmul: none. */
static double member_flops(const ir_graph *g, const ir_node *n)
{
    const ir_op_info *op = &ir_ops[n->op];
    if (n->op == IR_OP_matmul || n->op == IR_OP_cast || is_layout(n->op)) return 0;
    if (op->row) {
        int stages = 0;
        for (int i = 0; i < op->row->nstages; i++) {
            ir_row_stage_kind k = op->row->stages[i].kind;
            stages += k == ROW_MAX || k == ROW_SUM || k == ROW_MAP || k == ROW_OUT;
        }
        return (double)ir_numel(&g->nodes[n->in[0]]->type) * stages;
    }
    if (op->expr) return (double)ir_numel(&n->type);
    if (n->op == IR_OP_reduce_sum || n->op == IR_OP_reduce_mean || n->op == IR_OP_reduce_max)
        return (double)ir_numel(&g->nodes[n->in[0]]->type);
    if (n->op == IR_OP_conv1d || n->op == IR_OP_conv2d) {
        const ir_type *w = &g->nodes[n->in[1]]->type;
        return w->dims[0] ? 2.0 * (double)ir_numel(&n->type) * (double)ir_numel(w) / (double)w->dims[0] : 0;
    }
    return 0;
}

/* The attention op's FLOPs in kernel kn of its step: 2 B H T S D per
 * QK^T-sized product; causal halves them (the kernels skip the tiles above
 * the diagonal). The tensor-core kernels (mma): the forward 2 products (q
 * k^T, p v); attention_grad's row pass 1 (q k^T for the logsumexp) or none
 * when it reads the one its forward kept (the key kernel takes a
 * CG_PARAM_KEPT), its key kernel 5 (q k^T, do v^T, p^T do, ds^T q, ds k)
 * and its dq kernel none. The SIMT kernels: the forward 2, the backward's
 * query and key kernels 4 each. */
static double attention_flops(const ir_graph *g, const ir_node *n, const cg_program *prog, int q, bool mma)
{
    const ir_type *qt = &g->nodes[n->in[0]]->type, *k = &g->nodes[n->in[1]]->type;
    if (qt->rank != 4 || k->rank != 4) return 0;
    double product = 2.0 * (double)qt->dims[0] * (double)qt->dims[1] * (double)qt->dims[2] * (double)k->dims[2] *
                     (double)qt->dims[3];
    if (ir_attr_i(n, "causal")) product *= 0.5;
    if (n->op == IR_OP_attention) return 2 * product;
    if (!mma) return 4 * product;
    const char *name = prog->kernels[q].name;
    size_t len = strlen(name);
    if (len > 5 && strcmp(name + len - 5, "_keys") == 0) return 5 * product;
    if (len > 3 && strcmp(name + len - 3, "_dq") == 0) return 0;
    /* the row pass: its key kernel comes next */
    const cg_kernel *keys = q + 1 < prog->nkernels ? &prog->kernels[q + 1] : NULL;
    for (int i = 0; keys && i < keys->nparams; i++)
        if (keys->params[i].kind == CG_PARAM_KEPT) return 0;
    return product;
}

static double step_flops(const ir_graph *g, const schedule *s, int k)
{
    const sched_step *st = &s->steps[k];
    double f = 0;
    for (int i = 0; i < st->n; i++) f += member_flops(g, g->nodes[s->members[st->first + i].node]);
    return f;
}

static cost_class kernel_class(const ir_graph *g, const schedule *s, const cg_kernel *kn)
{
    const sched_step *st = &s->steps[kn->step];
    const ir_node *last = g->nodes[st->pos];
    if (last->op == IR_OP_attention || last->op == IR_OP_attention_grad) return COST_ATTENTION;
    if (kn->grid <= COST_TINY_BLOCKS) return COST_TINY;
    switch (st->kind) {
    case STEP_KIND_ROW: return COST_ROW;
    case STEP_KIND_GEMM: return COST_EPILOGUE;
    case STEP_KIND_EW: return COST_ELEMENTWISE;
    case STEP_KIND_MULTI: return COST_MULTI;
    case STEP_KIND_COLLECTIVE: /* a library call (MPI, NCCL); no kernel is emitted for it */
    case STEP_KIND_OP:
        if (ir_ops[last->op].row) return COST_ROW;
        if (last->op == IR_OP_cast) return COST_ELEMENTWISE;
        if (is_layout(last->op)) return COST_LAYOUT;
        return COST_OTHER_OP;
    }
    return COST_OTHER_OP;
}

/* How many rows each thread of row kernel kn walks (its grid-stride loop
 * runs once per team of threads per row): rows over the kernel's teams. */
static int64_t row_passes(const ir_graph *g, const schedule *s, const cg_kernel *kn)
{
    const sched_step *st = &s->steps[kn->step];
    /* a row step iterates over [rows, C]; a row op alone over its first operand */
    const ir_type *sp = st->kind == STEP_KIND_ROW ? &st->space : &g->nodes[g->nodes[st->pos]->in[0]]->type;
    int64_t c = sp->rank ? sp->dims[sp->rank - 1] : 1, numel = ir_numel(sp);
    int64_t rows = c > 0 ? numel / c : 0;
    int64_t per_block = kn->block == 128 && c <= 1024 ? 4 : 1; /* a warp per short row (emit_row.c) */
    int64_t teams = (int64_t)kn->grid * per_block;
    return teams > 0 && rows > teams ? (rows + teams - 1) / teams : 1;
}

static void kernel_launch(const ir_graph *g, const schedule *s, const cg_program *prog, int q, const cg_resources *res,
                          cost_launch *l)
{
    const cg_kernel *kn = &prog->kernels[q];
    *l = (cost_launch){.action = COST_KERNEL, .step = kn->step, .index = q, .grid = kn->grid, .block = kn->block,
                       .emitted = kn->bytes};
    al_fmt(l->name, sizeof l->name, "%s", kn->name);
    for (int i = 0; i < kn->nparams; i++) {
        const cg_param *pa = &kn->params[i];
        const ir_node *n = pa->node >= 0 ? g->nodes[pa->node] : NULL; /* amp_check's CG_PARAM_CHECKS has no node */
        int64_t b = pa->kind == CG_PARAM_NODE      ? (int64_t)ir_nbytes(&n->type)
                    : pa->kind == CG_PARAM_PRODUCT ? 4 * ir_numel(&n->type)
                    : pa->kind == CG_PARAM_ROWS    ? pa->count * (n->type.dtype == ALLOY_F64 ? 8 : 4)
                    : pa->kind == CG_PARAM_KEPT || pa->kind == CG_PARAM_COUNTER ? pa->count * 4
                                                   : 4;
        if (pa->written) l->written += b;
        else l->read += b;
    }
    /* causal rows read each row-shaped operand up to the row's live columns alone (cg_row_read_share) */
    const sched_step *rs = &s->steps[kn->step];
    if (rs->kind == STEP_KIND_ROW || (rs->kind == STEP_KIND_OP && ir_ops[g->nodes[rs->pos]->op].row)) {
        double share = cg_row_read_share(g, s, kn->step);
        const ir_type *sp = rs->kind == STEP_KIND_ROW ? &rs->space : &g->nodes[g->nodes[rs->pos]->in[0]]->type;
        for (int i = 0; share < 1 && i < kn->nparams; i++) {
            const cg_param *pa = &kn->params[i];
            if (pa->kind != CG_PARAM_NODE || pa->written) continue;
            const ir_type *t = &g->nodes[pa->node]->type;
            if (ir_numel(t) == ir_numel(sp)) l->read -= (int64_t)((double)ir_nbytes(t) * (1 - share));
        }
    }
    /* a one-launch reduction (a block counter among its parameters): its last blocks read the partials back */
    bool counted = false;
    for (int i = 0; i < kn->nparams; i++) counted |= kn->params[i].kind == CG_PARAM_COUNTER;
    for (int i = 0; counted && i < kn->nparams; i++)
        if (kn->params[i].kind == CG_PARAM_ROWS && kn->params[i].written)
            l->read += kn->params[i].count * (g->nodes[kn->params[i].node]->type.dtype == ALLOY_F64 ? 8 : 4);
    l->finish = counted;
    const sched_step *st = &s->steps[kn->step];
    const ir_node *last = g->nodes[st->pos];
    l->cls = kernel_class(g, s, kn);
    if (last->op == IR_OP_attention || last->op == IR_OP_attention_grad) {
        l->tensor = is_low(g->nodes[last->in[0]]->type.dtype) &&
                    cg_attention_mma_takes(g->nodes[last->in[0]]->type.dtype, g->nodes[last->in[0]]->type.dims[3]);
        l->flops = attention_flops(g, last, prog, q, l->tensor);
    } else if (q == 0 || prog->kernels[q - 1].step != kn->step) { /* the step's FLOPs on its first kernel */
        l->flops = step_flops(g, s, kn->step);
    }
    /* embedding_grad's sort (its step's first kernel, one block; emit_op.c) reads the ids twice, to count
     * and to place, and compares each id with those of the earlier threads of its tile: block / 2
     * comparisons per position, each about 4 instructions (a shared load, a compare, an add, the
     * loop), counted as 8 FLOPs (the f32 rate counts an FMA as 2) at its one block's share of the rate */
    bool first = q == 0 || prog->kernels[q - 1].step != kn->step,
         alone = first && (q + 1 == prog->nkernels || prog->kernels[q + 1].step != kn->step);
    if (last->op == IR_OP_embedding_grad && st->kind == STEP_KIND_OP && first && !alone) {
        const ir_type *ids = &g->nodes[last->in[0]]->type;
        l->read += (int64_t)ir_nbytes(ids);
        l->flops = 8.0 * (double)ir_numel(ids) * kn->block / 2;
    }
    /* a small table's embedding_grad, one kernel, walks all the ids for each table row */
    if (last->op == IR_OP_embedding_grad && st->kind == STEP_KIND_OP && alone)
        l->read += (last->type.dims[0] - 1) * (int64_t)ir_nbytes(&g->nodes[last->in[0]]->type);
    /* a slice reads only the part it copies */
    if (last->op == IR_OP_slice && st->kind == STEP_KIND_OP)
        l->read += (int64_t)ir_nbytes(&last->type) - (int64_t)ir_nbytes(&g->nodes[last->in[0]]->type);
    if (res) {
        l->res = res[q];
        if (l->res.known) {
            int64_t passes = l->cls == COST_ROW ? row_passes(g, s, kn) : 1;
            l->spill = (int64_t)(l->res.spill_stores + l->res.spill_loads) * kn->grid * kn->block * passes;
        }
    }
}

static void gemm_launch(const lp_plan *lp, int i, cost_launch *l)
{
    const lp_gemm *gm = &lp->gemms[i];
    int64_t ab = (int64_t)alloy_dtype_size(gm->ab), d = (int64_t)alloy_dtype_size(gm->d);
    *l = (cost_launch){.action = COST_GEMM, .step = gm->step, .index = i};
    l->read = gm->batch * (gm->m * gm->k + gm->k * gm->n) * ab;
    l->written = gm->batch * gm->m * gm->n * d;
    l->flops = 2.0 * (double)gm->batch * (double)gm->m * (double)gm->n * (double)gm->k;
    if (lp_epilogue_bias(gm->epilogue)) { /* the bias vector (D's m values in D's dtype), one add per element */
        l->read += gm->m * d;
        l->flops += (double)gm->batch * (double)gm->m * (double)gm->n;
    }
    if (lp_epilogue_gelu(gm->epilogue)) /* one FLOP an element, as any elementwise member (member_flops) */
        l->flops += (double)gm->batch * (double)gm->m * (double)gm->n;
    if (lp_epilogue_aux(gm->epilogue)) l->written += gm->batch * gm->m * gm->n * d; /* GELU's input beside D */
    if (gm->pointers) l->read += 3 * gm->batch * 8; /* the arrays of the matrices' addresses (written once, when built) */
    l->tensor = is_low(gm->ab);
    /* the real leading dimensions, padded where the plan padded the rows (sched_pad) */
    l->odd = gm->lda * ab % 16 || gm->ldb * ab % 16 || gm->ldd * d % 16;
    l->lda = gm->lda, l->ldb = gm->ldb, l->ldd = gm->ldd;
    l->padded = gm->lda > (gm->ta ? gm->k : gm->m) || gm->ldb > (gm->tb ? gm->n : gm->k) || gm->ldd > gm->m;
    l->cls = l->odd ? COST_GEMM_ODD : COST_GEMM_ALIGNED;
    /* named as the profile names it: the row-major product out[M, N] is cuBLAS's D[m = N, n = M] */
    char batch[32] = "";
    if (gm->batch > 1) al_fmt(batch, sizeof batch, "%lldx", (long long)gm->batch);
    al_fmt(l->name, sizeof l->name, "gemm.%s%lldx%lldx%lld.%s", batch, (long long)gm->n, (long long)gm->m,
           (long long)gm->k, alloy_dtype_name(gm->ab));
}

alloy_status cost_build(const ir_graph *g, const schedule *s, const cg_program *prog, const lp_plan *lp,
                        const cg_resources *res, cost_model *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->launches = al_calloc((size_t)lp->nactions + 1, sizeof *out->launches);
    if (!out->launches) {
        al_fmt(err, errlen, "out of memory for %d launches", lp->nactions);
        return ALLOY_ERR_OOM;
    }
    int world = cost_world(g, 2);
    for (int i = 0; i < lp->nactions; i++) {
        const lp_action *a = &lp->actions[i];
        cost_launch *l = &out->launches[out->n++];
        switch (a->kind) {
        case LP_KERNEL:
            kernel_launch(g, s, prog, a->index, res, l);
            out->kernels++;
            out->resources_known += l->res.known;
            out->spill_kernels += l->res.spill_stores + l->res.spill_loads > 0;
            out->kernel_bytes += l->read + l->written + l->spill;
            out->emitted_bytes += l->emitted;
            break;
        case LP_GEMM:
            gemm_launch(lp, a->index, l);
            out->gemms++;
            break;
        case LP_ZERO:
            *l = (cost_launch){.action = COST_MEMSET, .cls = COST_MEMSET_CLASS, .step = a->step, .index = -1,
                               .written = a->bytes};
            al_fmt(l->name, sizeof l->name, "memset");
            out->memsets++;
            break;
        case LP_COPY:
            *l = (cost_launch){.action = COST_COPY, .cls = COST_COPY_CLASS, .step = a->step, .index = -1,
                               .read = a->bytes, .written = a->bytes};
            al_fmt(l->name, sizeof l->name, "copy %s", a->dst.node >= 0 && g->nodes[a->dst.node]->name
                                                         ? g->nodes[a->dst.node]->name : "");
            out->copies++;
            break;
        case LP_COLLECTIVE: { /* a ring over the ranks in place: what each rank sends */
            const ir_node *n = g->nodes[a->index];
            /* the buffer the ring moves: the operand, or all_gather's result */
            int64_t bytes = (int64_t)ir_nbytes(n->op == IR_OP_all_gather ? &n->type : &g->nodes[n->in[0]]->type);
            int w = n->op == IR_OP_all_reduce ? world : (int)ir_attr_i(n, "world");
            char label[64];
            *l = (cost_launch){.action = COST_COLLECTIVE, .cls = COST_COLLECTIVE_CLASS, .step = a->step, .index = -1,
                               .link = cost_collective_bytes(n->op, bytes, w), .world = w, .node = n->id};
            al_fmt(l->name, sizeof l->name, "%s %s", ir_ops[n->op].name, ir_node_label(n, label, sizeof label));
            out->collectives++;
            break;
        }
        }
    }
    return ALLOY_OK;
}

int64_t cost_collective_bytes(int op, int64_t n, int world)
{
    if (world <= 1 || n <= 0) return 0;
    double part = (double)(world - 1) / world * (double)n;
    return (int64_t)(op == IR_OP_all_reduce ? 2 * part : part);
}

void cost_set_world(cost_model *m, const ir_graph *g, int world)
{
    for (int i = 0; i < m->n; i++) {
        cost_launch *l = &m->launches[i];
        const ir_node *n = l->action == COST_COLLECTIVE ? g->nodes[m->launches[i].node] : NULL;
        if (!n || n->op != IR_OP_all_reduce) continue;
        l->world = world;
        l->link = cost_collective_bytes(n->op, (int64_t)ir_nbytes(&g->nodes[n->in[0]]->type), world);
    }
}

int cost_world(const ir_graph *g, int world)
{
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->op == IR_OP_reduce_scatter || g->nodes[i]->op == IR_OP_all_gather)
            return (int)ir_attr_i(g->nodes[i], "world");
    return world;
}

void cost_time(const cost_launch *l, const cost_device *d, double *lo, double *hi)
{
    if (l->action == COST_COLLECTIVE) {
        *lo = (double)l->link / (d->link * d->link_eff_hi) + d->coll_lo + d->node_lo;
        *hi = (double)l->link / (d->link * d->link_eff_lo) + d->coll_hi + d->node_hi;
        return;
    }
    double bytes = (double)(l->read + l->written + l->spill);
    double rate_lo = d->f32_lo, rate_hi = d->f32_hi;
    if (l->tensor && l->action == COST_GEMM) {
        rate_lo = l->odd ? d->odd_lo : d->tensor_lo;
        rate_hi = l->odd ? d->odd_hi : d->tensor_hi;
    } else if (l->tensor) {
        rate_lo = d->attn_lo, rate_hi = d->attn_hi;
    }
    bool launch = l->action == COST_KERNEL || l->action == COST_GEMM;
    double share = 1;
    if (l->action == COST_KERNEL && d->sms > 0 && l->grid > 0 && l->grid < (unsigned)d->sms) share = (double)l->grid / d->sms;
    double t_lo = bytes / (d->hbm * d->eff_hi * share), t_hi = bytes / (d->hbm * d->eff_lo * share);
    rate_lo *= share, rate_hi *= share;
    if (l->flops / rate_hi > t_lo) t_lo = l->flops / rate_hi;
    if (l->flops / rate_lo > t_hi) t_hi = l->flops / rate_lo;
    if (launch && d->floor_lo > t_lo) t_lo = d->floor_lo;
    if (launch && d->floor_hi > t_hi) t_hi = d->floor_hi;
    /* the last block of a one-launch reduction starts its finish only when every other block has
     * written its partial: a dependent pass of its own, charged as one more floor */
    if (l->finish) t_lo += d->floor_lo, t_hi += d->floor_hi;
    *lo = t_lo + d->node_lo;
    *hi = t_hi + d->node_hi;
}

void cost_apply(cost_model *m, const cost_device *d)
{
    memset(&m->total, 0, sizeof m->total);
    memset(m->by_class, 0, sizeof m->by_class);
    for (int i = 0; i < m->n; i++) {
        cost_launch *l = &m->launches[i];
        cost_time(l, d, &l->t_lo, &l->t_hi);
        cost_sum *c[2] = {&m->total, &m->by_class[l->cls]};
        for (int j = 0; j < 2; j++) {
            c[j]->launches++;
            c[j]->bytes += l->read + l->written + l->spill + l->link;
            c[j]->flops += l->flops;
            c[j]->t_lo += l->t_lo;
            c[j]->t_hi += l->t_hi;
        }
    }
}

void cost_free(cost_model *m)
{
    al_free(m->launches);
    memset(m, 0, sizeof *m);
}

alloy_status cost_plan(const ir_graph *g, const schedule *s, const mem_plan *p, const cg_program *prog, lp_plan *lp,
                       char *err, size_t errlen)
{
    return lp_build(g, s, p, prog, lp, err, errlen);
}

void cost_plan_free(lp_plan *lp) { lp_free(lp); }
