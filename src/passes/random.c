/* random.c - the random pass: gives each random op its key, turns dropout off outside training.
 *
 * After this pass (nothing changes in a graph without random ops):
 *   - every random op (dropout, uniform, normal) has a `seed`: the one it
 *     was built or written with, else the graph's (alloy_graph_set_seed);
 *     on data-parallel rank r > 0 that seed xor r * 0x9E3779B97F4A7C15, so
 *     the ranks draw different masks for their different rows (rank 0
 *     draws what a single process would);
 *   - eval mode: when the step is not a training step (no loss, or
 *     training off) every dropout is gone: its readers read its operand (a
 *     named dropout becomes a same-shape reshape that keeps the name), as
 *     torch.nn.Dropout in eval();
 *   - when training with an optimizer, every random op without a step
 *     operand reads the step of the run, an i64 scalar:
 *         step = optim.step * K + step.micro_batch
 *     (K = accumulation_steps; without accumulation, optim.step): the
 *     updates applied before this run and the micro-batch inside the
 *     update. A step skipped for inf/NaN gradients advances neither
 *     counter, so the run after it draws the skipped run's numbers again
 *     and the n-th applied update always draws with step n; the numbers
 *     are a function of the checkpointed state, so a resumed run draws
 *     what the uninterrupted one would have. Without an optimizer the step
 *     is absent: every run draws with step 0.
 * It runs before amp and autodiff, so dropout's gradient rule copies the
 * forward's key (attributes and step operand) and redraws its mask.
 */
#include <string.h>

#include "alloy/train.h"
#include "passes/grad_rules.h"
#include "passes/pass.h"

static bool is_random(int op) { return op == IR_OP_dropout || op == IR_OP_uniform || op == IR_OP_normal; }

/* The state leaf `name` in out: g's node of that name copied (when g has
 * one; marked in map so it is not copied again), else a new one. */
static int counter_leaf(ir_graph *out, const ir_graph *g, int *map, const char *name)
{
    int j = ir_find_name(g, name);
    if (j < 0 || g->nodes[j]->nin) return pass_state_leaf(out, name, ALLOY_I32, 0, NULL, 0);
    const ir_node *n = g->nodes[j];
    ir_node *m = map[j] >= 0 ? out->nodes[map[j]] : ir_add_node(out, n->op, 0, NULL, n->nattrs, n->attrs, &n->type, n->name);
    if (m) map[j] = m->id;
    return m ? m->id : -1;
}

/* The step node in out (the counters' state leaves and the arithmetic over
 * them), made on first use; -1 when random ops take no step operand. */
static int step_node(ir_graph *out, const ir_graph *g, int *map, const pass_options *opts)
{
    if (!opts->train || !opts->optimizer || !opts->optimizer->kind) return -1;
    ad_ctx c = {out};
    int k = opts->optimizer->accumulation_steps > 1 ? opts->optimizer->accumulation_steps : 1;
    ir_type i64 = {.dtype = ALLOY_I64};
    int done = counter_leaf(out, g, map, STATE_COUNT);
    int step = ad_emit(&c, IR_OP_cast, 1, &done, 0, NULL, &i64);
    if (k > 1) {
        int micro = counter_leaf(out, g, map, STATE_MICRO);
        int scaled = ad_emit(&c, IR_OP_mul, 2, (int[]){step, ad_scalar(&c, ALLOY_I64, k)}, 0, NULL, NULL);
        step = ad_emit(&c, IR_OP_add, 2, (int[]){scaled, ad_emit(&c, IR_OP_cast, 1, &micro, 0, NULL, &i64)}, 0, NULL, NULL);
    }
    return step;
}

/* Copies node n of the input into out with operands through map: a random
 * op gets its seed and step, a dropout in eval mode disappears. */
static void copy_node(ir_graph *out, const ir_graph *g, const ir_node *n, int *map, int *step, const pass_options *opts)
{
    if (map[n->id] >= 0) return; /* a counter leaf step_node copied early */
    int in[5] = {0}, nin = n->nin;
    if (n->op == IR_OP_dropout && !opts->train) {
        if (!n->name) {
            map[n->id] = map[n->in[0]];
            return;
        }
        int x = map[n->in[0]];
        ir_node *m = ir_add_node(out, IR_OP_reshape, 1, &x, 0, NULL, &n->type, n->name);
        if (m) m->flags = n->flags, m->amp = n->amp, map[n->id] = m->id;
        return;
    }
    int *ins = in;
    if (nin > 5 && !(ins = al_malloc(sizeof(int) * (size_t)nin))) {
        ir_error(out, ALLOY_ERR_OOM, "random: out of memory");
        return;
    }
    for (int j = 0; j < nin; j++) ins[j] = map[n->in[j]];
    ir_attr attrs_small[8], *attrs = n->attrs;
    int nattrs = n->nattrs;
    if (is_random(n->op)) {
        int want = n->op == IR_OP_dropout ? 2 : 1;
        if (nin < want && *step == -2) *step = step_node(out, g, map, opts);
        if (nin < want && *step >= 0) ins[nin++] = *step;
        const ir_attr *given = ir_attr_find(n, "seed");
        if ((!given || opts->dp_rank > 0) && nattrs < 8) {
            int64_t seed = given ? given->i : (int64_t)opts->seed;
            if (opts->dp_rank > 0) /* data-parallel: each rank draws its own numbers for its own rows */
                seed = (int64_t)((uint64_t)seed ^ (uint64_t)opts->dp_rank * 0x9E3779B97F4A7C15ull);
            memcpy(attrs_small, n->attrs, sizeof(ir_attr) * (size_t)nattrs);
            if (given) attrs_small[given - n->attrs].i = seed;
            else attrs_small[nattrs++] = ir_a_int("seed", seed);
            attrs = attrs_small;
        }
    }
    ir_node *m = ir_add_node(out, n->op, nin, ins, nattrs, attrs, &n->type, n->name);
    if (ins != in) al_free(ins);
    if (m) m->amp = n->amp, m->flags = n->flags, m->group = n->group, map[n->id] = m->id;
}

alloy_status pass_random(ir_graph **gp, const pass_options *opts)
{
    ir_graph *g = *gp;
    bool any = false;
    for (int i = 0; i < g->nnodes && !any; i++) any = is_random(g->nodes[i]->op);
    if (!any) return ALLOY_OK;
    int *map = al_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    ir_graph *out = map ? ir_graph_new(g->name) : NULL;
    if (!out) {
        al_free(map);
        return ir_error(g, ALLOY_ERR_OOM, "random: out of memory");
    }
    int step = -2; /* not made yet */
    for (int i = 0; i < g->nnodes; i++) map[i] = -1;
    for (int i = 0; i < g->nnodes && !out->status; i++) copy_node(out, g, g->nodes[i], map, &step, opts);
    for (int i = 0; i < g->noutputs && !out->status; i++) ir_add_output(out, g->outputs[i].name, map[g->outputs[i].node]);
    for (int i = 0; i < g->nupdates && !out->status; i++) ir_add_update(out, g->updates[i].name, map[g->updates[i].node]);
    if (g->loss >= 0) out->loss = map[g->loss];
    al_free(map);
    if (out->status) {
        alloy_status st = ir_error(g, out->status, "random: %s", out->error);
        ir_graph_free(out);
        return st;
    }
    ir_graph_free(g);
    *gp = out;
    return ALLOY_OK;
}
