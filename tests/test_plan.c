/* test_plan.c - the memory planner: no two live values share bytes on real graphs, exact arenas for hand-built chains, the AMP memory win, runs from the arena that match the keep-everything run bit for bit, and plan_build's time on 100k nodes. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "models.h"
#include "runtime/cpu/cpu.h"
#include "runtime/graph/graph_impl.h"
#include "step/plan.h"
#include "support.h"


/* ---- helpers ---- */

static bool is_bound_leaf(const ir_node *n)
{
    return n->op == IR_OP_input || n->op == IR_OP_param || n->op == IR_OP_state;
}

static int64_t slot_of(const ir_node *n)
{
    return (int64_t)((ir_nbytes(&n->type) + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN);
}

/* What must survive a run of c: outputs, updates' values, the loss (al_free it). */
static uint8_t *keep_of(const ir_graph *c)
{
    uint8_t *keep = al_calloc((size_t)c->nnodes + 1, 1);
    assert_non_null(keep);
    for (int i = 0; i < c->noutputs; i++) keep[c->outputs[i].node] = 1;
    for (int i = 0; i < c->nupdates; i++) keep[c->updates[i].node] = 1;
    if (c->loss >= 0) keep[c->loss] = 1;
    return keep;
}

static void build(alloy_status st, const alloy_graph *g, const char *what)
{
    if (st) fail_msg("%s: %s: %s", what, alloy_status_name(st), alloy_last_error(g));
}

/* ---- the independent checker (O(n^2) over intervals) ---- */

static bool shapes_equal(const ir_type *a, const ir_type *b)
{
    return a->rank == b->rank && memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank) == 0;
}

/* Checks p against the rules, recomputing liveness from g and s: leaves and
 * unmaterialized nodes have no slot; slots are aligned and inside the arena;
 * two values live at one position share no byte unless the later writes in
 * place over the earlier (its operand, dying there, alone, same shape and
 * element size, not kept); nothing produced after a kept value touches its
 * bytes; inplace, bytes_by_dtype and peak_live_bytes are what they claim. */
static void check_plan(const ir_graph *g, const plan_schedule *s, const mem_plan *p, const char *what)
{
    int n = g->nnodes;
    assert_int_equal(p->nnodes, n);
    int *pos = al_calloc((size_t)n + 1, sizeof(int)), *last = al_calloc((size_t)n + 1, sizeof(int));
    uint8_t *mat = al_calloc((size_t)n + 1, 1), *keep = al_calloc((size_t)n + 1, 1);
    assert_true(pos && last && mat && keep);
    size_t by_dtype[ALLOY_DTYPE_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        const ir_node *node = g->nodes[i];
        pos[i] = s && s->exec_pos ? s->exec_pos[i] : i;
        mat[i] = !is_bound_leaf(node) && (!s || !s->materialized || s->materialized[i]);
        keep[i] = s && s->keep && s->keep[i];
        last[i] = keep[i] ? INT_MAX : pos[i];
        if (mat[i]) by_dtype[node->type.dtype] += ir_nbytes(&node->type);
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i]->nin; k++) {
            int j = g->nodes[i]->in[k];
            if (last[j] < pos[i]) last[j] = pos[i];
        }
    for (int i = 0; i < n; i++) {
        const ir_node *node = g->nodes[i];
        if (!mat[i]) {
            if (p->offset[i] != -1)
                fail_msg("%s: %s %%%d has no slot, yet offset %lld", what, ir_ops[node->op].name, i,
                         (long long)p->offset[i]);
            continue;
        }
        if (p->offset[i] < 0 || p->offset[i] % PLAN_ALIGN ||
            (size_t)(p->offset[i] + slot_of(node)) > p->arena_bytes)
            fail_msg("%s: %s %%%d at offset %lld (%lld bytes) in an arena of %zu", what,
                     ir_ops[node->op].name, i, (long long)p->offset[i], (long long)slot_of(node),
                     p->arena_bytes);
    }
    /* which values took an operand's slot */
    int *inplace_of = al_calloc((size_t)n + 1, sizeof(int));
    assert_non_null(inplace_of);
    int inplace = 0;
    for (int i = 0; i < n; i++) {
        inplace_of[i] = -1;
        if (!mat[i] || !slot_of(g->nodes[i])) continue;
        for (int k = 0; k < g->nodes[i]->nin; k++) {
            int j = g->nodes[i]->in[k];
            if (mat[j] && slot_of(g->nodes[j]) && p->offset[j] == p->offset[i]) inplace_of[i] = j;
        }
        inplace += inplace_of[i] >= 0;
    }
    for (int i = 0; i < n; i++) {
        if (!mat[i] || !slot_of(g->nodes[i])) continue;
        int64_t ai = p->offset[i], bi = ai + slot_of(g->nodes[i]);
        for (int j = i + 1; j < n; j++) {
            if (!mat[j] || !slot_of(g->nodes[j])) continue;
            int64_t aj = p->offset[j], bj = aj + slot_of(g->nodes[j]);
            if (!(ai < bj && aj < bi)) continue; /* no shared byte */
            int early = pos[i] <= pos[j] ? i : j, late = early == i ? j : i;
            if (keep[early] && pos[late] >= pos[early])
                fail_msg("%s: kept %s %%%d [%lld, %lld) is overwritten by %s %%%d [%lld, %lld) at position %d",
                         what, ir_ops[g->nodes[early]->op].name, early, (long long)p->offset[early],
                         (long long)(p->offset[early] + slot_of(g->nodes[early])),
                         ir_ops[g->nodes[late]->op].name, late, (long long)p->offset[late],
                         (long long)(p->offset[late] + slot_of(g->nodes[late])), pos[late]);
            if (!(pos[i] <= last[j] && pos[j] <= last[i])) continue; /* never live together */
            const ir_node *a = g->nodes[early], *b = g->nodes[late];
            bool in_place = inplace_of[late] == early && ai == aj && bi == bj && last[early] == pos[late] &&
                            pos[early] < pos[late] && shapes_equal(&a->type, &b->type) &&
                            alloy_dtype_size(a->type.dtype) == alloy_dtype_size(b->type.dtype);
            if (!in_place)
                fail_msg("%s: %s %%%d (positions %d..%d, bytes [%lld, %lld)) and %s %%%d (positions "
                         "%d..%d, bytes [%lld, %lld)) are live together and overlap",
                         what, ir_ops[g->nodes[i]->op].name, i, pos[i], last[i], (long long)ai,
                         (long long)bi, ir_ops[g->nodes[j]->op].name, j, pos[j], last[j],
                         (long long)aj, (long long)bj);
        }
    }
    assert_int_equal(p->inplace, inplace);
    /* peak: the slots live at each position, an in-place value counted with its operand */
    int64_t peak = 0;
    for (int q = 0; q < n; q++) {
        if (!mat[q]) continue;
        bool first = true; /* each distinct position once */
        for (int i = 0; i < q && first; i++) first = !(mat[i] && pos[i] == pos[q]);
        if (!first) continue;
        int64_t live = 0;
        for (int i = 0; i < n; i++) {
            if (!mat[i] || pos[i] > pos[q] || last[i] < pos[q]) continue;
            if (!(inplace_of[i] >= 0 && pos[i] == pos[q])) live += slot_of(g->nodes[i]);
        }
        if (live > peak) peak = live;
    }
    assert_int_equal(p->peak_live_bytes, (size_t)peak);
    assert_true(p->arena_bytes >= p->peak_live_bytes);
    for (int d = 0; d < ALLOY_DTYPE_COUNT; d++) assert_int_equal(p->bytes_by_dtype[d], by_dtype[d]);
    al_free(inplace_of);
    al_free(pos);
    al_free(last);
    al_free(mat);
    al_free(keep);
}

/* ---- the executor from the plan (test-only) ---- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Runs g in schedule order (position, then id) with every materialized value
 * at arena + offset and every unmaterialized one in a scratch buffer of its
 * own (a fused kernel's registers), leaves bound to leaf[i]. Each value must
 * equal ref[i] (a keep-everything run of the keep-everything run) bit for bit as
 * soon as its node ran, and every kept value again at the end, when later
 * nodes have reused the arena. */
static void run_from_plan(const ir_graph *g, const plan_schedule *s, const mem_plan *p,
                          void *const *leaf, const rt_tensor *ref, const char *what)
{
    int n = g->nnodes;
    char *arena = al_malloc(p->arena_bytes ? p->arena_bytes : 1);
    rt_tensor *values = al_calloc((size_t)n + 1, sizeof(rt_tensor));
    void **scratch = al_calloc((size_t)n + 1, sizeof(void *));
    uint64_t *order = al_malloc(sizeof(uint64_t) * ((size_t)n + 1));
    assert_true(arena && values && scratch && order);
    memset(arena, 0xa5, p->arena_bytes ? p->arena_bytes : 1); /* no value may rely on zeroed memory */
    for (int i = 0; i < n; i++) {
        order[i] = (uint64_t)(s && s->exec_pos ? s->exec_pos[i] : i) << 32 | (uint32_t)i;
        values[i].type = g->nodes[i]->type;
        if (is_bound_leaf(g->nodes[i])) values[i].data = leaf[i];
        else if (p->offset[i] >= 0) values[i].data = arena + p->offset[i];
        else values[i].data = scratch[i] = al_malloc(ir_nbytes(&g->nodes[i]->type) + 1);
    }
    qsort(order, (size_t)n, sizeof *order, cmp_u64);
    int max_in = 1;
    for (int i = 0; i < n; i++)
        if (g->nodes[i]->nin > max_in) max_in = g->nodes[i]->nin;
    rt_tensor *in = al_malloc(sizeof(rt_tensor) * (size_t)max_in);
    assert_non_null(in);
    cpu_exec x = {.nthreads = 1, .graph = g}; /* the graph: a causal softmax's rows are computed as in a run */
    for (int k = 0; k < n; k++) {
        int i = (int)(order[k] & 0xffffffffu);
        const ir_node *node = g->nodes[i];
        if (is_bound_leaf(node)) continue;
        for (int j = 0; j < node->nin; j++) in[j] = values[node->in[j]];
        if (cpu_ops[node->op].kernel(&x, node, &values[i], in))
            fail_msg("%s: %s %%%d failed: %s", what, ir_ops[node->op].name, i, x.error);
        if (memcmp(values[i].data, ref[i].data, ir_nbytes(&node->type)) != 0)
            fail_msg("%s: %s %%%d (offset %lld) differs from the keep-everything run's", what,
                     ir_ops[node->op].name, i, (long long)p->offset[i]);
    }
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (!s || !s->keep || !s->keep[i] || is_bound_leaf(g->nodes[i])) continue;
        kept++;
        if (memcmp(values[i].data, ref[i].data, ir_nbytes(&g->nodes[i]->type)) != 0)
            fail_msg("%s: kept %s %%%d differs at the end of the run", what, ir_ops[g->nodes[i]->op].name, i);
    }
    assert_true(kept > 0);
    for (int i = 0; i < n; i++) al_free(scratch[i]);
    al_free(in);
    al_free(scratch);
    al_free(order);
    al_free(values);
    al_free(arena);
}

/* Leaf data for a run of c: inputs filled here (f32 in [-1, 1), i32 in [0,
 * vocab)), param and state from g's state when g is given. */
static void **bind_leaves(alloy_graph *g, const ir_graph *c, int vocab)
{
    void **leaf = al_calloc((size_t)c->nnodes + 1, sizeof(void *));
    assert_non_null(leaf);
    if (g) build(state_ensure(g), g, "state");
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        if (n->op == IR_OP_param || n->op == IR_OP_state) {
            assert_non_null(g);
            rt_state *st = state_find(g, n->name);
            assert_non_null(st);
            build(state_host(g, st), g, "state");
            leaf[i] = st->cell->host;
        }
        if (n->op != IR_OP_input) continue;
        int64_t count = ir_numel(&n->type);
        leaf[i] = al_malloc(ir_nbytes(&n->type) + 1);
        assert_non_null(leaf[i]);
        for (int64_t k = 0; k < count; k++) {
            if (n->type.dtype == ALLOY_F32)
                ((float *)leaf[i])[k] = (float)((double)(test_next_u64() >> 11) * 0x1p-52 - 1.0);
            else if (n->type.dtype == ALLOY_I32)
                ((int32_t *)leaf[i])[k] = (int32_t)(test_next_u64() % (uint64_t)vocab);
            else
                fail_msg("input %s: no filler for %s", n->name, alloy_dtype_name(n->type.dtype));
        }
    }
    return leaf;
}

static void free_leaves(const ir_graph *c, void **leaf)
{
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i]->op == IR_OP_input) al_free(leaf[i]);
    al_free(leaf);
}

/* Plans c under s, checks the plan, runs from it and compares with the
 * keep-everything run; returns nothing, fails on the first difference. */
static void plan_check_and_run(alloy_graph *g, const ir_graph *c, const plan_schedule *s, int vocab,
                               const char *what)
{
    mem_plan p;
    char err[256];
    if (plan_build(c, s, &p, err, sizeof err)) fail_msg("%s: %s", what, err);
    check_plan(c, s, &p, what);
    void **leaf = bind_leaves(g, c, vocab);
    rt_tensor *ref = al_calloc((size_t)c->nnodes + 1, sizeof(rt_tensor));
    bool *all = al_calloc((size_t)c->nnodes + 1, sizeof(bool));
    assert_true(ref && all);
    for (int i = 0; i < c->nnodes; i++) {
        all[i] = true;
        ref[i].data = is_bound_leaf(c->nodes[i]) ? leaf[i] : NULL;
    }
    cpu_exec x = {.nthreads = 1};
    if (cpu_run_graph(&x, c, ref, all)) fail_msg("%s: keep-everything run: %s", what, x.error);
    run_from_plan(c, s, &p, leaf, ref, what);
    cpu_release_values(c, ref);
    al_free(ref);
    al_free(all);
    free_leaves(c, leaf);
    plan_free(&p);
}

/* ---- schedules ---- */

/* A schedule as the fusion pass could give it: runs of consecutive
 * elementwise nodes share one position (their group's first id); a value
 * used only inside its group and not kept is not materialized. */
typedef struct fused_schedule {
    int *pos;
    uint8_t *mat, *inplace_ok;
    plan_schedule s;
} fused_schedule;

static fused_schedule fuse_elementwise_runs(const ir_graph *c, const uint8_t *keep)
{
    int n = c->nnodes;
    fused_schedule f = {al_calloc((size_t)n + 1, sizeof(int)), al_calloc((size_t)n + 1, 1),
                        al_calloc((size_t)n + 1, 1), {0}};
    int *last = al_calloc((size_t)n + 1, sizeof(int));
    assert_true(f.pos && f.mat && f.inplace_ok && last);
    for (int i = 0; i < n; i++) {
        bool ew = ir_ops[c->nodes[i]->op].elementwise;
        f.pos[i] = i > 0 && ew && ir_ops[c->nodes[i - 1]->op].elementwise ? f.pos[i - 1] : i;
        f.inplace_ok[i] = ew;
        last[i] = -1;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < c->nodes[i]->nin; k++)
            if (last[c->nodes[i]->in[k]] < f.pos[i]) last[c->nodes[i]->in[k]] = f.pos[i];
    int internal = 0;
    for (int i = 0; i < n; i++) {
        f.mat[i] = !is_bound_leaf(c->nodes[i]) && !(last[i] == f.pos[i] && !keep[i]);
        internal += !is_bound_leaf(c->nodes[i]) && !f.mat[i];
    }
    assert_true(internal > 0); /* the schedule exercises unmaterialized values */
    al_free(last);
    f.s = (plan_schedule){.exec_pos = f.pos, .materialized = f.mat, .keep = keep, .inplace_ok = f.inplace_ok};
    return f;
}

static void fused_schedule_free(fused_schedule *f)
{
    al_free(f->pos);
    al_free(f->mat);
    al_free(f->inplace_ok);
}

/* ---- the models ---- */

typedef enum model_kind { MLP_FORWARD, MLP_TRAIN, BLOCK_FORWARD, BLOCK_TRAIN_F32, BLOCK_TRAIN_AMP } model_kind;

typedef struct model_size {
    int batch, seq, vocab, dim, heads;
} model_size;

static const char *const model_names[] = {
    "MLP forward", "MLP training (adamw)", "transformer block forward",
    "transformer block training (f32, adamw)",
    "transformer block training (f16 AMP, dynamic scaler, adamw)"};

/* Builds and compiles one of the test graphs; *vocab gets the id range of its i32 inputs. */
static alloy_graph *build_model(model_kind kind, model_size z, int *vocab)
{
    alloy_graph *g = alloy_graph_new(model_names[kind]);
    assert_non_null(g);
    alloy_tensor *loss;
    if (kind <= MLP_TRAIN) {
        loss = build_mlp(g, F32, z.batch, z.dim, 4 * z.dim, z.vocab).loss;
    } else {
        loss = build_transformer_block(g, F32, z.batch, z.seq, z.vocab, z.dim, z.heads).loss;
    }
    *vocab = z.vocab;
    if (kind == MLP_TRAIN || kind >= BLOCK_TRAIN_F32) {
        build(alloy_graph_set_loss(g, loss), g, "set_loss");
        build(alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01)), g, "adamw");
    }
    if (kind == BLOCK_TRAIN_AMP) {
        build(alloy_graph_enable_amp(g, ALLOY_F16), g, "amp");
        build(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), g, "scaler");
    }
    FILE *devnull = fopen("/dev/null", "w");
    assert_non_null(devnull);
    build(alloy_graph_dump(g, devnull, ALLOY_DUMP_IR), g, "compile");
    fclose(devnull);
    assert_non_null(g->compiled);
    return g;
}

static const model_size small_mlp = {8, 1, 5, 16, 1}, small_block = {2, 8, 16, 16, 2};

/* ---- (1) real graphs: no overlap, kept values intact, leaves outside ---- */

static void test_live_values_never_share_bytes_in_the_mlp_and_transformer_graphs(void **state)
{
    (void)state;
    for (int kind = MLP_FORWARD; kind <= BLOCK_TRAIN_AMP; kind++) {
        int vocab;
        alloy_graph *g = build_model(kind, kind <= MLP_TRAIN ? small_mlp : small_block, &vocab);
        const ir_graph *c = g->compiled;
        uint8_t *keep = keep_of(c);
        plan_schedule s = {.keep = keep};
        mem_plan p;
        char err[256];
        if (plan_build(c, &s, &p, err, sizeof err)) fail_msg("%s: %s", model_names[kind], err);
        check_plan(c, &s, &p, model_names[kind]);
        size_t total = 0;
        int leaves = 0;
        for (int i = 0; i < c->nnodes; i++) {
            if (is_bound_leaf(c->nodes[i])) {
                leaves++;
                assert_int_equal(p.offset[i], -1);
            } else {
                total += (size_t)slot_of(c->nodes[i]);
            }
        }
        assert_true(leaves > 0);
        assert_true(p.arena_bytes < total); /* slots are reused */
        printf("  %-60s %5d nodes: arena %8zu bytes, peak live %8zu, %3d in place (no reuse: %zu)\n",
               model_names[kind], c->nnodes, p.arena_bytes, p.peak_live_bytes, p.inplace, total);
        assert_true(p.inplace > 0);
        plan_free(&p);
        /* no in-place at all: still valid, never smaller */
        uint8_t *none = al_calloc((size_t)c->nnodes + 1, 1);
        assert_non_null(none);
        plan_schedule s2 = {.keep = keep, .inplace_ok = none};
        mem_plan q;
        assert_int_equal(plan_build(c, &s2, &q, err, sizeof err), ALLOY_OK);
        check_plan(c, &s2, &q, model_names[kind]);
        assert_int_equal(q.inplace, 0);
        al_free(none);
        plan_free(&q);
        al_free(keep);
        alloy_graph_free(g);
    }
}

static void test_fused_schedules_keep_group_values_apart_and_leave_internal_values_out(void **state)
{
    (void)state;
    for (int kind = MLP_TRAIN; kind <= BLOCK_TRAIN_AMP; kind += BLOCK_TRAIN_AMP - MLP_TRAIN) {
        int vocab;
        alloy_graph *g = build_model(kind, kind <= MLP_TRAIN ? small_mlp : small_block, &vocab);
        const ir_graph *c = g->compiled;
        uint8_t *keep = keep_of(c);
        fused_schedule f = fuse_elementwise_runs(c, keep);
        mem_plan p;
        char err[256];
        if (plan_build(c, &f.s, &p, err, sizeof err)) fail_msg("%s: %s", model_names[kind], err);
        check_plan(c, &f.s, &p, model_names[kind]);
        for (int i = 0; i < c->nnodes; i++)
            if (!f.mat[i]) assert_int_equal(p.offset[i], -1);
        printf("  %-60s fused: arena %8zu bytes, peak live %8zu, %3d in place\n", model_names[kind],
               p.arena_bytes, p.peak_live_bytes, p.inplace);
        plan_free(&p);
        fused_schedule_free(&f);
        al_free(keep);
        alloy_graph_free(g);
    }
}

/* The classifier's row step (the logits' cast to f32, cross_entropy, its
 * gradient, the cast back to f16) writes the f16 gradient where the f16
 * logits were: the logits' last reader is that step and the step reads
 * them before it stores the gradient. A logits fetch (kept) stops it.
 * tests/test_arena.c runs the same step arena against no_arena bit for bit. */
static void test_the_classifier_gradient_takes_the_logits_slot_unless_they_are_kept(void **state)
{
    (void)state;
    model_size z = small_block;
    alloy_graph *g = alloy_graph_new("block");
    assert_non_null(g);
    alloy_tensor *loss = build_transformer_block(g, F32, z.batch, z.seq, z.vocab, z.dim, z.heads).loss;
    build(alloy_graph_set_option(g, "disable_passes", ""), g, "fuse on (main() turns it off)");
    build(alloy_graph_set_loss(g, loss), g, "set_loss");
    build(alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01)), g, "adamw");
    build(alloy_graph_enable_amp(g, ALLOY_F16), g, "amp");
    build(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), g, "scaler");
    build(graph_compile(g), g, "compile");
    const ir_graph *c = g->compiled;
    int ce = -1;
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i]->op == IR_OP_cross_entropy_grad) ce = i;
    assert_true(ce >= 0);
    int logits = c->nodes[c->nodes[ce]->in[0]]->op == IR_OP_cast ? c->nodes[c->nodes[ce]->in[0]]->in[0] : -1;
    assert_true(logits >= 0 && c->nodes[logits]->type.dtype == ALLOY_F16);
    for (int kept = 0; kept < 2; kept++) {
        bool *keep = test_calloc((size_t)c->nnodes, sizeof(bool));
        keep[logits] = kept;
        schedule s;
        mem_plan p;
        char err[256];
        if (sched_build(c, keep, &s, err, sizeof err) || plan_for_step(c, &s, false, &p, err, sizeof err))
            fail_msg("%s", err);
        const sched_step *st = &s.steps[s.step_of[ce]];
        if (st->kind != STEP_KIND_ROW) fail_msg("cross_entropy_grad %%%d (group %d) runs in a %s step", ce, c->nodes[ce]->group, sched_kind_name(st->kind));
        int grad = -1; /* the step's stored f16 member of the logits' shape: the gradient's cast */
        for (int m = 0; m < st->n; m++) {
            int i = s.members[st->first + m].node;
            if (i != logits && sched_stored(&s, i) && c->nodes[i]->type.dtype == ALLOY_F16) grad = i;
        }
        assert_true(grad >= 0 && c->nodes[grad]->op == IR_OP_cast);
        printf("  logits %%%d @%lld, their gradient %%%d @%lld%s\n", logits, (long long)p.offset[logits], grad,
               (long long)p.offset[grad], kept ? " (logits kept)" : "");
        if (kept) assert_int_not_equal(p.offset[grad], p.offset[logits]);
        else assert_int_equal(p.offset[grad], p.offset[logits]);
        plan_free(&p);
        sched_free(&s);
        test_free(keep);
    }
    alloy_graph_free(g);
}

/* ---- (2) hand-built graphs with arenas derivable by hand ---- */

static int add_input(ir_graph *g, alloy_dtype dt, int rank, const int64_t *dims)
{
    char name[16];
    snprintf(name, sizeof name, "x%d", g->nnodes);
    ir_type t = {.dtype = dt, .rank = rank};
    memcpy(t.dims, dims, sizeof(int64_t) * (size_t)rank);
    ir_node *n = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &t, name);
    if (!n) fail_msg("input: %s", g->error);
    return n->id;
}

static int add_op(ir_graph *g, int op, int nin, const int *in)
{
    ir_node *n = ir_add_node(g, op, nin, in, 0, NULL, NULL, NULL);
    if (!n) fail_msg("%s: %s", ir_ops[op].name, g->error);
    return n->id;
}

#define OP1(g, op, a) add_op(g, IR_OP_##op, 1, (const int[]){a})
#define OP2(g, op, a, b) add_op(g, IR_OP_##op, 2, (const int[]){a, b})

/* Plans g with the given arrays (NULL = default) and checks the plan. */
static mem_plan plan_of(const ir_graph *g, const int *pos, const uint8_t *mat, const uint8_t *keep,
                        const uint8_t *inplace_ok)
{
    plan_schedule s = {.exec_pos = pos, .materialized = mat, .keep = keep, .inplace_ok = inplace_ok};
    mem_plan p;
    char err[256];
    if (plan_build(g, &s, &p, err, sizeof err)) fail_msg("%s", err);
    check_plan(g, &s, &p, g->name);
    return p;
}

static void assert_offsets(const mem_plan *p, int n, const int64_t *want)
{
    for (int i = 0; i < n; i++)
        if (p->offset[i] != want[i])
            fail_msg("offset of %%%d is %lld, expected %lld", i, (long long)p->offset[i], (long long)want[i]);
}

static void test_four_elementwise_ops_on_f32_256_fit_one_kilobyte_in_place_and_two_without(void **state)
{
    (void)state;
    ir_graph *g = ir_graph_new("chain");
    int x = add_input(g, F32, 1, DIMS(256));
    int a = OP1(g, neg, x), b = OP1(g, relu, a), c = OP1(g, tanh, b), d = OP1(g, square, c);
    uint8_t keep[5] = {0}, none[5] = {0};
    keep[d] = 1;
    mem_plan p = plan_of(g, NULL, NULL, keep, NULL);
    assert_int_equal(p.arena_bytes, 1024);
    assert_int_equal(p.peak_live_bytes, 1024);
    assert_int_equal(p.inplace, 3);
    assert_offsets(&p, 5, DIMS(-1, 0, 0, 0, 0));
    assert_int_equal(p.bytes_by_dtype[F32], 4 * 1024);
    plan_free(&p);
    p = plan_of(g, NULL, NULL, keep, none); /* ping-pong between two slots */
    assert_int_equal(p.arena_bytes, 2048);
    assert_int_equal(p.peak_live_bytes, 2048);
    assert_int_equal(p.inplace, 0);
    assert_offsets(&p, 5, DIMS(-1, 0, 1024, 0, 1024));
    plan_free(&p);
    ir_graph_free(g);
}

static void test_a_value_still_used_later_or_kept_is_not_overwritten_in_place(void **state)
{
    (void)state;
    /* a feeds b and c: b may not take a (a lives on), c may (its last use) */
    ir_graph *g = ir_graph_new("fanout");
    int x = add_input(g, F32, 1, DIMS(256));
    int a = OP1(g, neg, x), b = OP1(g, relu, a), c = OP2(g, add, a, b);
    uint8_t keep[4] = {0};
    keep[c] = 1;
    mem_plan p = plan_of(g, NULL, NULL, keep, NULL);
    assert_int_equal(p.inplace, 1);
    assert_offsets(&p, 4, DIMS(-1, 0, 1024, 0));
    assert_int_equal(p.arena_bytes, 2048);
    plan_free(&p);
    keep[a] = 1; /* a kept: nobody takes it; c takes b instead */
    p = plan_of(g, NULL, NULL, keep, NULL);
    assert_int_equal(p.inplace, 1);
    assert_offsets(&p, 4, DIMS(-1, 0, 1024, 1024));
    assert_int_equal(p.arena_bytes, 2048);
    plan_free(&p);
    ir_graph_free(g);
}

static void test_in_place_needs_the_same_shape_and_element_size(void **state)
{
    (void)state;
    ir_graph *g = ir_graph_new("shapes");
    int x = add_input(g, F32, 1, DIMS(256)), y = add_input(g, F32, 2, DIMS(1, 256));
    int h = add_input(g, ALLOY_F16, 1, DIMS(256)), m = add_input(g, F32, 2, DIMS(4, 256));
    int a = OP1(g, neg, x);
    int r = OP2(g, add, y, a);     /* [1,256]: same bytes as a, other shape: no */
    int l = OP2(g, less, r, y);    /* bool[1,256]: 1-byte elements: no */
    int e = OP1(g, neg, h);        /* f16[256] */
    int f = OP1(g, relu, e);       /* f16 over f16: yes */
    int v = OP1(g, neg, x);
    int w = OP2(g, add, m, v);     /* [4,256] from a broadcast [256]: no */
    uint8_t keep[16] = {0};
    keep[l] = keep[f] = keep[w] = 1;
    mem_plan p = plan_of(g, NULL, NULL, keep, NULL);
    assert_int_equal(p.inplace, 1);
    assert_int_equal(p.offset[f], p.offset[e]);
    assert_true(p.offset[r] != p.offset[a]);
    assert_true(p.offset[v] != p.offset[w]);
    /* a 1024 @0, r 1024 @1024 (a dies there, so after it), l 256 in a's hole @0 */
    assert_offsets(&p, 7, DIMS(-1, -1, -1, -1, 0, 1024, 0));
    /* after l: r freed -> [256, 2048) free; e 512 best fits at 256, f in place,
     * v 1024 at 768, w 4096: no hole fits, the top block [1792, 2048) grows */
    assert_int_equal(p.offset[e], 256);
    assert_int_equal(p.offset[v], 768);
    assert_int_equal(p.offset[w], 1792);
    assert_int_equal(p.arena_bytes, 1792 + 4096);
    assert_int_equal(p.bytes_by_dtype[ALLOY_BOOL], 256);
    assert_int_equal(p.bytes_by_dtype[ALLOY_F16], 1024);
    plan_free(&p);
    ir_graph_free(g);
}

static void test_a_view_shares_its_owners_slot_which_lives_until_the_views_last_use(void **state)
{
    (void)state;
    /* a -> r (view of a) and b = relu(a); q view of b; c = add(r, q). b may
     * not take a's slot (r reads it at c); c takes it, the last use of a
     * and its view. Views add no bytes. */
    ir_graph *g = ir_graph_new("views");
    int x = add_input(g, F32, 2, DIMS(2, 128));
    int a = OP1(g, neg, x);
    ir_type flat = {.dtype = F32, .rank = 1, .dims = {256}};
    int r = ir_add_node(g, IR_OP_reshape, 1, &a, 0, NULL, &flat, NULL)->id;
    int b = OP1(g, relu, a);
    int q = ir_add_node(g, IR_OP_reshape, 1, &b, 0, NULL, &flat, NULL)->id;
    int c = OP2(g, add, r, q);
    uint8_t keep[6] = {0};
    keep[c] = 1;
    int view_of[6] = {-1, -1, a, -1, b, -1};
    plan_schedule s = {.keep = keep, .view_of = view_of};
    mem_plan p;
    char err[256];
    if (plan_build(g, &s, &p, err, sizeof err)) fail_msg("%s", err);
    assert_offsets(&p, 6, DIMS(-1, 0, 0, 1024, 1024, 0));
    assert_int_equal(p.views, 2);
    assert_int_equal(p.inplace, 1);
    assert_int_equal(p.arena_bytes, 2048);
    assert_int_equal(p.bytes_by_dtype[F32], 3 * 1024);
    assert_int_equal(p.view_of[r], a);
    assert_int_equal(p.view_of[q], b);
    plan_free(&p);
    keep[r] = 1; /* a kept view keeps its owner: c goes elsewhere */
    if (plan_build(g, &s, &p, err, sizeof err)) fail_msg("%s", err);
    assert_offsets(&p, 6, DIMS(-1, 0, 0, 1024, 1024, 1024));
    plan_free(&p);
    view_of[r] = x; /* a leaf has no slot to share */
    assert_int_equal(plan_build(g, &s, &p, err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "is a view of a value that cannot hold it"));
    ir_graph_free(g);
}

static void test_best_fit_takes_the_smallest_hole_and_freed_neighbours_merge(void **state)
{
    (void)state;
    /* unmaterialized sinks end a value's life without a slot of their own */
    ir_graph *g = ir_graph_new("holes");
    int x1 = add_input(g, F32, 1, DIMS(256)), x2 = add_input(g, F32, 1, DIMS(512)),
        x3 = add_input(g, F32, 1, DIMS(768));
    int A = OP1(g, neg, x2), S1 = OP1(g, neg, x1), B = OP1(g, neg, x1), S2 = OP1(g, neg, x1);
    int sink[4];
    sink[0] = OP1(g, neg, A);
    sink[1] = OP1(g, neg, B);       /* holes: [0, 2048) and [3072, 4096) */
    int C = OP1(g, neg, x1);        /* best fit: 3072, not first fit 0 */
    sink[2] = OP1(g, neg, S1);      /* [2048, 3072) merges with [0, 2048) */
    int D = OP1(g, neg, x3);        /* 3072 bytes fit at 0 only merged */
    sink[3] = OP1(g, neg, S2);      /* [4096, 5120) is free at the top */
    int E = OP1(g, neg, x2);        /* 2048: no hole fits; the top block grows */
    uint8_t mat[16], keep[16] = {0};
    memset(mat, 1, sizeof mat);
    for (int k = 0; k < 4; k++) mat[sink[k]] = 0;
    keep[C] = keep[D] = keep[E] = 1;
    mem_plan p = plan_of(g, NULL, mat, keep, NULL);
    int64_t want[16];
    for (int i = 0; i < g->nnodes; i++) want[i] = -1;
    want[A] = 0, want[S1] = 2048, want[B] = 3072, want[S2] = 4096;
    want[C] = 3072, want[D] = 0, want[E] = 4096;
    assert_offsets(&p, g->nnodes, want);
    assert_int_equal(p.arena_bytes, 6144);
    assert_int_equal(p.peak_live_bytes, 6144);
    plan_free(&p);
    ir_graph_free(g);
}

static void test_values_of_one_group_are_live_together_and_shared_operands_stay(void **state)
{
    (void)state;
    ir_graph *g = ir_graph_new("group");
    int x = add_input(g, F32, 1, DIMS(256));
    int a = OP1(g, neg, x), b = OP1(g, relu, a), c = OP1(g, tanh, a), d = OP2(g, add, b, c);
    uint8_t keep[5] = {0};
    keep[d] = 1;
    /* in node order: b cannot take a (c reads it later), c and d can */
    mem_plan p = plan_of(g, NULL, NULL, keep, NULL);
    assert_int_equal(p.inplace, 2);
    assert_offsets(&p, 5, DIMS(-1, 0, 1024, 0, 1024));
    assert_int_equal(p.arena_bytes, 2048);
    plan_free(&p);
    /* b and c in one group: a has two readers there, so neither takes it */
    int pos[5] = {0, 1, 2, 2, 3};
    p = plan_of(g, pos, NULL, keep, NULL);
    assert_int_equal(p.inplace, 1);
    assert_offsets(&p, 5, DIMS(-1, 0, 1024, 2048, 1024));
    assert_int_equal(p.arena_bytes, 3072);
    assert_int_equal(p.peak_live_bytes, 3072);
    plan_free(&p);
    /* a and b in one group: b may not write over a value of its own group */
    int pos2[5] = {0, 1, 1, 2, 3};
    keep[b] = 1;
    p = plan_of(g, pos2, NULL, keep, NULL);
    assert_true(p.offset[b] != p.offset[a]);
    assert_int_equal(p.offset[c], p.offset[a]); /* c, later, may */
    plan_free(&p);
    ir_graph_free(g);
}

static void test_a_bad_schedule_is_refused_with_the_node_named(void **state)
{
    (void)state;
    ir_graph *g = ir_graph_new("bad");
    int x = add_input(g, F32, 1, DIMS(256));
    int a = OP1(g, neg, x), b = OP1(g, relu, a);
    (void)b;
    mem_plan p;
    char err[256];
    int later[3] = {0, 5, 2};
    plan_schedule s = {.exec_pos = later};
    assert_int_equal(plan_build(g, &s, &p, err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "produced later"));
    assert_null(p.offset);
    int neg[3] = {0, -1, 2};
    s.exec_pos = neg;
    assert_int_equal(plan_build(g, &s, &p, err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "position -1"));
    uint8_t mat[3] = {0, 0, 1}, keep[3] = {0, 1, 0};
    s = (plan_schedule){.materialized = mat};
    assert_int_equal(plan_build(g, &s, &p, err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "not materialized"));
    mat[1] = 1, mat[2] = 0, keep[1] = 0, keep[2] = 1;
    s.keep = keep;
    assert_int_equal(plan_build(g, &s, &p, err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "must be kept"));
    assert_int_equal(plan_build(NULL, NULL, &p, err, sizeof err), ALLOY_ERR_INVALID);
    ir_graph_free(g);
}

static void test_every_failed_allocation_returns_oom_and_leaks_nothing(void **state)
{
    (void)state;
    int vocab;
    alloy_graph *g = build_model(BLOCK_TRAIN_AMP, small_block, &vocab);
    const ir_graph *c = g->compiled;
    uint8_t *keep = keep_of(c);
    fused_schedule f = fuse_elementwise_runs(c, keep);
    int failures = 0;
    for (test_fail_at = 0;; test_fail_at++) {
        test_alloc_count = 0;
        alloy_set_allocator(test_failing_realloc, NULL);
        mem_plan p;
        char err[256] = "";
        alloy_status st = plan_build(c, &f.s, &p, err, sizeof err);
        alloy_set_allocator(test_cmocka_realloc, NULL);
        if (st == ALLOY_OK) {
            check_plan(c, &f.s, &p, "after failures");
            plan_free(&p);
            break;
        }
        assert_int_equal(st, ALLOY_ERR_OOM);
        assert_non_null(strstr(err, "out of memory"));
        assert_null(p.offset);
        failures++;
    }
    test_fail_at = -1;
    assert_true(failures >= 8);
    fused_schedule_free(&f);
    al_free(keep);
    alloy_graph_free(g);
}

/* ---- (3) the AMP memory win ---- */

static void test_amp_training_step_of_the_transformer_block_needs_a_smaller_arena_than_fp32(void **state)
{
    (void)state;
    const model_size z = {8, 64, 96, 64, 4};
    mem_plan p[2];
    for (int amp = 0; amp < 2; amp++) {
        int vocab;
        alloy_graph *g = build_model(amp ? BLOCK_TRAIN_AMP : BLOCK_TRAIN_F32, z, &vocab);
        const ir_graph *c = g->compiled;
        uint8_t *keep = keep_of(c);
        plan_schedule s = {.keep = keep};
        char err[256];
        if (plan_build(c, &s, &p[amp], err, sizeof err)) fail_msg("%s", err);
        check_plan(c, &s, &p[amp], model_names[amp ? BLOCK_TRAIN_AMP : BLOCK_TRAIN_F32]);
        printf("  %-60s arena %9zu bytes, peak live %9zu (f32 %zu, f16 %zu, other %zu bytes of values)\n",
               model_names[amp ? BLOCK_TRAIN_AMP : BLOCK_TRAIN_F32], p[amp].arena_bytes,
               p[amp].peak_live_bytes, p[amp].bytes_by_dtype[F32], p[amp].bytes_by_dtype[ALLOY_F16],
               p[amp].bytes_by_dtype[ALLOY_I32] + p[amp].bytes_by_dtype[ALLOY_BOOL]);
        al_free(keep);
        alloy_graph_free(g);
    }
    double ratio = (double)p[1].arena_bytes / (double)p[0].arena_bytes;
    double peak_ratio = (double)p[1].peak_live_bytes / (double)p[0].peak_live_bytes;
    printf("  AMP / fp32 (batch %d, seq %d, dim %d, vocab %d): arena %.3f, peak live %.3f\n", z.batch,
           z.seq, z.dim, z.vocab, ratio, peak_ratio);
    assert_true(ratio < 1);
    assert_true(peak_ratio < 1);
    plan_free(&p[0]);
    plan_free(&p[1]);
}

/* ---- (4) runs from the plan ---- */

static void test_runs_from_the_arena_match_the_malloc_executor_bit_for_bit(void **state)
{
    (void)state;
    for (int kind = MLP_FORWARD; kind <= BLOCK_TRAIN_AMP; kind++) {
        int vocab;
        alloy_graph *g = build_model(kind, kind <= MLP_TRAIN ? small_mlp : small_block, &vocab);
        const ir_graph *c = g->compiled;
        uint8_t *keep = keep_of(c);
        plan_schedule s = {.keep = keep};
        plan_check_and_run(g, c, &s, vocab, model_names[kind]);
        if (kind == MLP_TRAIN || kind == BLOCK_TRAIN_AMP) {
            fused_schedule f = fuse_elementwise_runs(c, keep);
            plan_check_and_run(g, c, &f.s, vocab, model_names[kind]);
            fused_schedule_free(&f);
        }
        al_free(keep);
        alloy_graph_free(g);
    }
}

/* ---- large graphs: a schedule other than node order, and the time ---- */

/* nnodes nodes: four f32 inputs ([64], [128], [256], [512]) and random
 * unary/binary elementwise ops over the recent values of one shape, every
 * 997th and the last kept (*keep, al_free it). */
static ir_graph *random_graph(int nnodes, uint8_t **keep)
{
    enum { WINDOW = 16 };
    test_rng = 42;
    ir_graph *g = ir_graph_new("random");
    assert_non_null(g);
    int recent[4][WINDOW];
    for (int k = 0; k < 4; k++) {
        int in = add_input(g, F32, 1, DIMS(64 << k));
        for (int w = 0; w < WINDOW; w++) recent[k][w] = in;
    }
    static const int ops[] = {IR_OP_neg, IR_OP_relu, IR_OP_add, IR_OP_mul, IR_OP_sub};
    while (g->nnodes < nnodes) {
        int k = (int)(test_next_u64() % 4), op = ops[test_next_u64() % 5];
        int in[2] = {recent[k][test_next_u64() % WINDOW], recent[k][test_next_u64() % WINDOW]};
        int id = add_op(g, op, ir_ops[op].min_in, in);
        recent[k][test_next_u64() % WINDOW] = id;
    }
    *keep = al_calloc((size_t)nnodes + 1, 1);
    assert_non_null(*keep);
    for (int i = 996; i < nnodes; i += 997) (*keep)[i] = 1;
    (*keep)[nnodes - 1] = 1;
    return g;
}

/* A topological order other than the ids: by depth, then id (al_free it). */
static int *positions_by_depth(const ir_graph *g)
{
    int n = g->nnodes;
    int *depth = al_calloc((size_t)n + 1, sizeof(int)), *pos = al_calloc((size_t)n + 1, sizeof(int));
    uint64_t *key = al_malloc(sizeof(uint64_t) * ((size_t)n + 1));
    assert_true(depth && pos && key);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < g->nodes[i]->nin; k++)
            if (depth[g->nodes[i]->in[k]] + 1 > depth[i]) depth[i] = depth[g->nodes[i]->in[k]] + 1;
        key[i] = (uint64_t)depth[i] << 32 | (uint32_t)i;
    }
    qsort(key, (size_t)n, sizeof *key, cmp_u64);
    for (int r = 0; r < n; r++) pos[key[r] & 0xffffffffu] = r;
    al_free(key);
    al_free(depth);
    return pos;
}

static void test_plans_for_a_reordered_schedule_are_valid_and_run(void **state)
{
    (void)state;
    uint8_t *keep;
    ir_graph *g = random_graph(3000, &keep);
    int *pos = positions_by_depth(g);
    bool reordered = false;
    for (int i = 0; i < g->nnodes; i++) reordered |= pos[i] != i;
    assert_true(reordered);
    plan_schedule s = {.exec_pos = pos, .keep = keep};
    plan_check_and_run(NULL, g, &s, 1, "random graph by depth");
    s.exec_pos = NULL;
    plan_check_and_run(NULL, g, &s, 1, "random graph in node order");
    al_free(pos);
    al_free(keep);
    ir_graph_free(g);
}

static void test_plan_build_takes_milliseconds_on_100k_nodes(void **state)
{
    (void)state;
    enum { N = 100000 };
    uint8_t *keep;
    ir_graph *g = random_graph(N, &keep);
    int *pos = positions_by_depth(g);
    plan_schedule in_order = {.keep = keep}, by_depth = {.exec_pos = pos, .keep = keep};
    const plan_schedule *sched[2] = {&in_order, &by_depth};
    const char *label[2] = {"node order", "depth order (sorted)"};
    for (int k = 0; k < 2; k++) {
        mem_plan p;
        char err[256];
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = test_now_ms();
            if (plan_build(g, sched[k], &p, err, sizeof err)) fail_msg("%s", err);
            double ms = test_now_ms() - t0;
            if (ms < best) best = ms;
            if (rep < 2) plan_free(&p);
        }
        printf("  plan_build, %d nodes, %s: %.1f ms; arena %zu bytes, peak live %zu, %d in place\n", N,
               label[k], best, p.arena_bytes, p.peak_live_bytes, p.inplace);
        assert_true(p.arena_bytes >= p.peak_live_bytes);
        assert_true(best < 2000);
        plan_free(&p);
    }
    al_free(pos);
    al_free(keep);
    ir_graph_free(g);
}

int main(void)
{
    test_rng = 0;
    /* plans of the unfused graph are compared with a per-node executor; fused schedules are tested separately */
    setenv("ALLOY_DISABLE_PASSES", "fuse", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_live_values_never_share_bytes_in_the_mlp_and_transformer_graphs),
        cmocka_unit_test(test_fused_schedules_keep_group_values_apart_and_leave_internal_values_out),
        cmocka_unit_test(test_the_classifier_gradient_takes_the_logits_slot_unless_they_are_kept),
        cmocka_unit_test(test_four_elementwise_ops_on_f32_256_fit_one_kilobyte_in_place_and_two_without),
        cmocka_unit_test(test_a_value_still_used_later_or_kept_is_not_overwritten_in_place),
        cmocka_unit_test(test_in_place_needs_the_same_shape_and_element_size),
        cmocka_unit_test(test_a_view_shares_its_owners_slot_which_lives_until_the_views_last_use),
        cmocka_unit_test(test_best_fit_takes_the_smallest_hole_and_freed_neighbours_merge),
        cmocka_unit_test(test_values_of_one_group_are_live_together_and_shared_operands_stay),
        cmocka_unit_test(test_a_bad_schedule_is_refused_with_the_node_named),
        cmocka_unit_test(test_every_failed_allocation_returns_oom_and_leaks_nothing),
        cmocka_unit_test(test_amp_training_step_of_the_transformer_block_needs_a_smaller_arena_than_fp32),
        cmocka_unit_test(test_runs_from_the_arena_match_the_malloc_executor_bit_for_bit),
        cmocka_unit_test(test_plans_for_a_reordered_schedule_are_valid_and_run),
        /* timing without cmocka's bookkeeping allocator */
        cmocka_unit_test_setup_teardown(test_plan_build_takes_milliseconds_on_100k_nodes, test_plain_alloc,
                                        test_checked_alloc),
    };
    return cmocka_run_group_tests_name("plan", tests, test_checked_alloc, test_plain_alloc);
}
