/* test_fuse_block.c - fusion on the transformer block's training step: its groups of each kind written down, three steps fused and unfused (f32 bits, AMP f16 within the stated bounds), and a char-level training run unchanged by fusion within rounding. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "base/convert.h"
#include "block_support.h"
#include "fuse_support.h"
#include "ir/groups.h"
#include "models.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* Stated bounds (docs/fusion.md, "Numerics"):
 *  - f32 groups give the unfused bits, so a whole f32 training step is
 *    bit-identical.
 *  - the AMP f16 transformer training step: GEMM groups keep the f16
 *    products unrounded in f32, f16 members of row and ew groups stay
 *    unrounded, so fusion changes those activations by an f16 rounding
 *    (<= 2^-11 relative). Losses then
 *    agree to LOSS_REL (measured 2e-6 over 3 steps; the bound keeps a
 *    factor of 50). Parameters: AdamW divides each gradient element by its
 *    own RMS, so an update is ~lr whatever the gradient's size, and a
 *    rounding-size change of a gradient element near zero can flip the sign
 *    of its update: the worst case is 2 * lr per step per element
 *    (PARAM_ABS_PER_STEP_LR, in units of lr; measured 1.99 lr after 3
 *    steps, 18 of 3888 elements above lr/100).
 *  - the char-level run (40 steps): loss curves within CHAR_LOSS_ABS
 *    (measured 6e-5). */
#define LOSS_REL 1e-4
#define PARAM_ABS_PER_STEP_LR 2.0
#define CHAR_LOSS_ABS 5e-3

/* The transformer training graph (AMP f16 + dynamic scaler + AdamW) after
 * the whole pipeline (amp, autodiff, grad_scaler, optimizer, simplify, dce,
 * fuse), read off its printed group table: 34 groups, listed by kind, dtype
 * and op sequence in block_groups below (9 row, 14 gemm, 3 multi, 8 ew). */
enum { BLOCK_GROUPS = 34, ADAMW_MEMBERS = 18, PARAMS = 17 };

/* ---- the transformer block ---- */

/* AdamW at lr; under AMP the dynamic scaler from 1024 (2^16 overflows this block's first f16 gradients: a skipped
 * step) */
static alloy_graph *trainer(alloy_dtype amp, double lr)
{
    return block_trainer(amp, 1024, alloy_adamw(lr, 0.9, 0.999, 1e-8, 0.01));
}

/* ---- the transformer block's grouping, written down ----
 *
 * Every group of the block's training graph (AMP f16 + dynamic scaler +
 * AdamW, after fuse), read off its printed group table (ir_print_groups):
 * "<kind> <dtype of the last member>: <members' ops in node order>" and how
 * many groups have exactly that. The test wants the multiset of groups to
 * be this table, no more and no less, and then checks the members of the
 * big ones node by node. */
typedef struct expected_group {
    const char *what;
    const char *signature;
    int count;
} expected_group;

static const expected_group block_groups[] = {
    /* forward */
    /* each layer_norm's group also stores the mean and rstd its gradient reads */
    {"ln1 + its kept statistics + cast to f16", "row f16: layer_norm layer_norm_mean layer_norm_rstd cast", 1},
    {"residual add + ln2 + its kept statistics + cast to f16",
     "row f16: add layer_norm layer_norm_mean layer_norm_rstd cast", 1},
    {"mlp.w2's bias add + residual add + lnf + its kept statistics + cast to f16",
     "row f16: add add layer_norm layer_norm_mean layer_norm_rstd cast", 1},
    {"scale, causal mask, softmax, cast to f16", "row f16: mul causal_mask softmax cast", 1},
    /* each f32 product is read by kernels that apply the f16 range rule as they load it: cuBLASLt
     * writes it, no epilogue kernel (step/ranged_reads.c) */
    {"f16 matmuls written in f32: the forward's attention scores, attn.wo and mlp.w2, the backward's 11",
     "gemm f32: matmul cast", 13},
    {"mlp.w1 matmul + f16 bias add (the erf GELU is no cuBLASLt epilogue)", "gemm f16: matmul add", 1},
    /* backward */
    {"the logits' cast to f32, cross_entropy, cross_entropy_grad, cast to f16: the f32 logits never stored",
     "row f16: cast cross_entropy cross_entropy_grad cast", 1},
    /* the sibling rule: a layer_norm's backward and its gamma gradient read x and dy once */
    /* and the column sums over its rows join it (fuse_colsum.c): dgamma,
     * dbeta and mlp.b2's gradient are summed in the same pass, the product
     * dy * normalized x never stored */
    /* dx's cast to f16 for the mlp.w2 GEMMs comes after those sums too; the
     * union takes mlp.b2's sum and then the cast (fuse.c): the kernel stores
     * dx and its cast */
    {"lnf backward, its gamma gradient dy * (x - mean) * rstd, the sums of that, dy and dx over the rows, dx's cast",
     "row f16: layer_norm_grad_stats sub mul mul reduce_sum reduce_sum reduce_sum cast", 1},
    /* ln2's are siblings too; its gradient's cast to f16 comes after the
     * column sum of its residual gradient sum, which the union takes with
     * the cast, so the sibling pass joins them, taking dgamma's sum in on
     * the way, and dbeta's follows (fuse_colsum.c) */
    {"ln2 backward, its gamma gradient, the residual gradient sum, ln2's dgamma and dbeta, cast",
     "row f16: layer_norm_grad_stats sub mul mul add reduce_sum reduce_sum cast", 1},
    /* the softmax recomputed from the f32 scores its GEMM stored (remat.c): the forward stores no f32 softmax */
    {"scale, causal mask, softmax recomputed, softmax backward, causal mask, scale, cast",
     "row f16: mul causal_mask softmax softmax_grad causal_mask mul cast", 1},
    {"q/k/v gradient sum, cast, ln1 backward and gamma gradient, residual gradient sum, ln1's dgamma and dbeta",
     "row f32: add add cast layer_norm_grad_stats sub mul mul add reduce_sum reduce_sum", 1},
    /* the forward's casts of the f32 weights to f16 (the gammas and betas
     * stay f32), moved to the front of the step: one launch (fuse_casts.c) */
    {"every f16 working copy of a weight", "multi f16: cast cast cast cast cast cast cast cast", 1},
    /* the step: unscale + found_inf over all 17 gradients (mlp.b1's has an
     * f16 -> f32 cast) with the global norm's sum of squares over them
     * (fuse_norm.c), bookkeeping, the bias corrections */
    {"unscale all gradients (mlp.b1's cast first: its id is lowest) + their sum of squares + found_inf",
     "multi bool: cast mul mul mul mul mul mul mul mul mul mul mul mul mul mul mul mul mul sum_squares found_inf", 1},
    {"skipped_steps + 1 and its where; optim.step + 1 and its where", "ew i32: add where", 2},
    {"growth_tracker + 1 == growth_interval", "ew bool: add equal", 1},
    {"next loss scale", "ew f32: isfinite where where where", 1}, /* (f32: the last where's) */
    {"next growth tracker", "ew i32: where where", 1},
    /* the global gradient norm's sqrt is a lone node: no group */
    {"1 - lr*wd (lr is the state optim.lr, read at run time)", "ew f64: mul sub", 1},
    {"lr / (1 - b1^t)", "ew f64: pow sub div", 1},
    {"sqrt(1 - b2^t)", "ew f64: pow sub sqrt", 1},
    /* the AdamW update of all 17 parameters, 18 members each */
    {"AdamW over all parameters", NULL, 1},
};

/* The AdamW update of one parameter p (a segment of the one multi group):
 *   mul            p * (1 - lr*wd)
 *   mul            m*b1
 *   mul            g = the scaled gradient * (1/scale): the unscale again,
 *                  as it reads (remat.c), not read back stored
 *   mul add        m' = m*b1 + g*(1-b1)
 *   where          where(apply, m', m)            -> update "<p>.m"
 *   mul square mul add  v' = v*b2 + g^2*(1-b2) (g^2 its own: the norm's
 *                  sum_squares squares inside the op)
 *   where          where(apply, v', v)            -> update "<p>.v"
 *   sqrt div add   sqrt(v') / sqrt(1-b2^t) + eps
 *   div mul sub    p*(1-lr*wd) - lr/(1-b1^t) * m' / that
 *   where          where(apply, p', p)            -> update "<p>" */
static const char *const adamw_ops[] = {"mul", "mul",   "mul",  "mul", "add", "where", "mul", "square", "mul", "add",
                                        "where", "sqrt", "div", "add", "div", "mul",   "sub", "where",  NULL};

static const char *const block_params[PARAMS] = {"tok_emb", "pos_emb", "ln1.g", "ln1.b", "attn.wq", "attn.wk",
                                                 "attn.wv", "attn.wo", "ln2.g", "ln2.b", "mlp.b1", "mlp.b2",
                                                 "mlp.w1", "mlp.w2", "lnf.g", "lnf.b", "head.w"};

static int group_last(const ir_graph *c, int k)
{
    int last = -1;
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i]->group == k) last = i;
    return last;
}

/* "<kind> <dtype of the last member>: <ops>" of group k. */
static void group_signature(const ir_graph *c, int k, char *buf, size_t len)
{
    int members[1024], n = 0;
    for (int i = 0; i < c->nnodes && n < 1024; i++)
        if (c->nodes[i]->group == k) members[n++] = i;
    size_t at = (size_t)snprintf(buf, len, "%s %s:", ir_group_kind_name(ir_group_kind_of(c, members, n)),
                                 alloy_dtype_name(c->nodes[members[n - 1]]->type.dtype));
    for (int m = 0; m < n && at < len; m++)
        at += (size_t)snprintf(buf + at, len - at, " %s", ir_ops[c->nodes[members[m]]->op].name);
}

/* The ops of the nodes ids[0..nids) (members of group k, in node order)
 * against ops. */
static void expect_segment(const ir_graph *c, int k, const int *ids, int nids, const char *const *ops, const char *p)
{
    int j = 0;
    for (int i = 0; i < nids; i++) {
        const ir_node *n = c->nodes[ids[i]];
        if (n->group != k) fail_msg("AdamW of '%s': %%%d is not in the update group %d", p, n->id, k);
        if (!ops[j] || strcmp(ir_ops[n->op].name, ops[j]) != 0)
            fail_msg("AdamW of '%s': member %d is %s, want %s", p, j, ir_ops[n->op].name, ops[j] ? ops[j] : "none");
        j++;
    }
    if (ops[j]) fail_msg("AdamW of '%s': %d members, want more", p, j);
}

/* The segment of multi group k holding node root: the members connected to
 * it by edges inside the group, in node order. */
static int segment_of(const ir_graph *c, int k, int root, int *ids)
{
    uint8_t *in = test_calloc((size_t)c->nnodes, 1);
    in[root] = 1;
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < c->nnodes; i++) {
            const ir_node *n = c->nodes[i];
            if (n->group != k) continue;
            for (int j = 0; j < n->nin; j++) {
                int o = n->in[j];
                if (c->nodes[o]->group != k || in[o] == in[i]) continue;
                in[o] = in[i] = 1;
                changed = true;
            }
        }
    }
    int n = 0;
    for (int i = 0; i < c->nnodes; i++)
        if (in[i]) ids[n++] = i;
    test_free(in);
    return n;
}

static void expect_block_grouping(const ir_graph *c)
{
    int ng = group_count(c);
    enum { NEXPECTED = sizeof block_groups / sizeof block_groups[0] };
    int total = 0, matched[NEXPECTED] = {0};
    for (int e = 0; e < NEXPECTED; e++) total += block_groups[e].count;
    char sig[2048];
    int adamw = -1;
    for (int k = 0; k < ng; k++) {
        group_signature(c, k, sig, sizeof sig);
        printf("group %d: %.160s%s\n", k, sig, strlen(sig) > 160 ? " ..." : "");
        int e = 0;
        while (e < NEXPECTED && !(block_groups[e].signature && strcmp(block_groups[e].signature, sig) == 0)) e++;
        if (e == NEXPECTED && strncmp(sig, "multi f32: mul mul mul mul add where", 36) == 0 && adamw < 0) {
            adamw = k;
            e = NEXPECTED - 1;
        }
        if (e == NEXPECTED) fail_msg("group %d (%s) is not in the table", k, sig);
        matched[e]++;
    }
    for (int e = 0; e < NEXPECTED; e++)
        if (matched[e] != block_groups[e].count)
            fail_msg("'%s': %d groups, the table says %d", block_groups[e].what, matched[e], block_groups[e].count);
    assert_int_equal(ng, total);
    /* AdamW: every parameter's p, m and v updates in the one multi group,
     * each parameter's segment exactly adamw_ops */
    assert_true(adamw >= 0);
    int *ids = test_malloc(sizeof(int) * (size_t)c->nnodes), members = 0;
    for (int i = 0; i < PARAMS; i++) {
        char m[64], v[64];
        snprintf(m, sizeof m, "%s.m", block_params[i]);
        snprintf(v, sizeof v, "%s.v", block_params[i]);
        int root = update_node(c, block_params[i]);
        assert_int_equal(c->nodes[update_node(c, m)]->group, adamw);
        assert_int_equal(c->nodes[update_node(c, v)]->group, adamw);
        int n = segment_of(c, adamw, root, ids);
        expect_segment(c, adamw, ids, n, adamw_ops, block_params[i]);
        members += n;
    }
    assert_int_equal(group_size(c, adamw), members); /* nothing else in it */
    assert_int_equal(members, PARAMS * ADAMW_MEMBERS);
    /* found_inf reads every parameter's unscaled gradient, each in its group */
    for (int i = 0; i < PARAMS; i++) {
        char gr[64];
        snprintf(gr, sizeof gr, "grad:%s", block_params[i]);
        const ir_node *unscale = c->nodes[output_node(c, gr)];
        assert_int_equal(unscale->op, IR_OP_mul);
        assert_true(unscale->group >= 0);
        assert_int_equal(c->nodes[group_last(c, unscale->group)]->op, IR_OP_found_inf);
        /* and the update reads none of it: its own mul of the same operands */
        int again = -1;
        for (int k = 0; k < c->nnodes; k++) {
            const ir_node *n = c->nodes[k];
            for (int j = 0; j < n->nin; j++)
                if (n->in[j] == unscale->id && n->op != IR_OP_found_inf && n->op != IR_OP_sum_squares)
                    fail_msg("'%s': %%%d reads the unscaled gradient %%%d", gr, k, unscale->id);
            if (n->op == IR_OP_mul && n->group == adamw && n->in[0] == unscale->in[0] && n->in[1] == unscale->in[1])
                again = k;
        }
        if (again < 0) fail_msg("'%s': the update does not unscale the gradient as it reads it", gr);
    }
    test_free(ids);
}

static void test_the_transformer_training_graph_has_the_stated_groups_of_each_kind(void **state)
{
    (void)state;
    alloy_graph *g = trainer(F16, 1e-3);
    /* the groups of the written-out attention (test_attention covers the op) */
    expect_ok(g, alloy_graph_set_option(g, "disable_passes", "attention"), "disable_passes");
    /* the softmax's backward recomputing it, as a CUDA compile does by default (remat.c) */
    expect_ok(g, alloy_graph_set_option(g, "remat", "always"), "remat");
    const ir_graph *c = compiled(g);
    printf("# the transformer block's training step (AMP f16, dynamic scaler, AdamW) after fuse\n");
    ir_print(c, stdout);
    ir_print_groups(c, stdout);
    expect_groups_legal(c);
    /* the MLP's erf GELU stays alone; its f16 input (the GEMM group's bias
     * add) is stored because gelu_grad reads it */
    int gelu = -1, gelu_grad = -1;
    for (int i = 0; i < c->nnodes; i++) {
        if (c->nodes[i]->op == IR_OP_gelu) gelu = i;
        if (c->nodes[i]->op == IR_OP_gelu_grad) gelu_grad = i;
    }
    assert_true(gelu >= 0 && gelu_grad >= 0);
    const ir_node *bias_add = c->nodes[c->nodes[gelu]->in[0]];
    assert_int_equal(c->nodes[gelu]->group, -1);
    assert_int_equal(bias_add->op, IR_OP_add);
    assert_int_equal(c->nodes[group_last(c, bias_add->group)]->id, bias_add->id);
    assert_int_equal(c->nodes[c->nodes[bias_add->in[0]]->id]->op, IR_OP_matmul);
    assert_int_equal(c->nodes[gelu_grad]->in[0], bias_add->id);
    expect_block_grouping(c);
    assert_int_equal(group_count(c), BLOCK_GROUPS);
    alloy_graph_free(g);
}

typedef struct step_record {
    double loss[64];
    int skipped;
    int nstate;
    char *names[80];
    double *state[80];
    int64_t count[80];
} step_record;

/* Trains a fresh block for `steps` steps with fusion on or off; records
 * losses and the final state (as doubles). */
static void train_block(alloy_dtype amp, double lr, int steps, bool fused, step_record *r)
{
    fusion(fused);
    alloy_graph *g = trainer(amp, lr);
    memset(r, 0, sizeof *r);
    for (int s = 0; s < steps; s++) {
        int32_t tokens[BB * BT], targets[BB * BT];
        alloy_host_tensor feeds[2];
        block_batch(1000 + (uint64_t)s, 3, 1, tokens, targets, feeds);
        expect_ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), "training step");
        alloy_step_info info;
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        r->loss[s] = info.loss;
        r->skipped += info.skipped;
    }
    assert_int_equal(group_count(g->compiled) > 0, fused);
    r->nstate = alloy_graph_state_count(g);
    assert_true(r->nstate <= 80);
    for (int i = 0; i < r->nstate; i++) {
        alloy_host_tensor t;
        expect_ok(g, alloy_graph_state_at(g, i, &t), "state_at");
        r->names[i] = test_malloc(strlen(t.name) + 1);
        strcpy(r->names[i], t.name);
        r->count[i] = alloy_host_tensor_numel(&t);
        r->state[i] = test_malloc(sizeof(double) * (size_t)(r->count[i] ? r->count[i] : 1));
        cvt_load_f64(t.dtype, t.data, r->state[i], (size_t)r->count[i]);
    }
    alloy_graph_free(g);
    fusion(true);
}

static void free_record(step_record *r)
{
    for (int i = 0; i < r->nstate; i++) test_free(r->names[i]), test_free(r->state[i]);
}

static void test_three_f32_training_steps_give_the_same_bits_fused_and_unfused(void **state)
{
    (void)state;
    step_record a, b;
    train_block(F32, 1e-2, 3, true, &a);
    train_block(F32, 1e-2, 3, false, &b);
    assert_int_equal(a.nstate, b.nstate);
    for (int s = 0; s < 3; s++) assert_memory_equal(&a.loss[s], &b.loss[s], sizeof(double));
    for (int i = 0; i < a.nstate; i++) {
        assert_string_equal(a.names[i], b.names[i]);
        assert_memory_equal(a.state[i], b.state[i], sizeof(double) * (size_t)a.count[i]);
    }
    free_record(&a);
    free_record(&b);
}

static void test_three_amp_f16_training_steps_agree_fused_and_unfused_within_the_stated_bound(void **state)
{
    (void)state;
    const double lr = 1e-3;
    step_record a, b;
    train_block(F16, lr, 3, true, &a);
    train_block(F16, lr, 3, false, &b);
    assert_int_equal(a.skipped, 0);
    assert_int_equal(b.skipped, 0);
    double worst_loss = 0, worst_param = 0;
    int64_t moved = 0, total = 0;
    for (int s = 0; s < 3; s++) {
        double d = fabs(a.loss[s] - b.loss[s]) / fabs(b.loss[s]);
        printf("step %d: loss fused %.9f unfused %.9f (rel %.2e)\n", s, a.loss[s], b.loss[s], d);
        worst_loss = fmax(worst_loss, d);
    }
    assert_int_equal(a.nstate, b.nstate);
    for (int i = 0; i < a.nstate; i++) {
        const char *name = a.names[i];
        assert_string_equal(name, b.names[i]);
        size_t len = strlen(name);
        if (!strncmp(name, "scaler.", 7) || !strncmp(name, "optim.", 6) || !strncmp(name, "step.", 5)) {
            assert_memory_equal(a.state[i], b.state[i], sizeof(double) * (size_t)a.count[i]);
            continue;
        }
        if (len > 2 && name[len - 2] == '.' && (name[len - 1] == 'm' || name[len - 1] == 'v'))
            continue; /* moments: they follow the gradients, no separate bound */
        for (int64_t e = 0; e < a.count[i]; e++) {
            double d = fabs(a.state[i][e] - b.state[i][e]);
            worst_param = fmax(worst_param, d);
            moved += d > lr / 100;
            total++;
        }
    }
    printf("AMP f16, 3 steps: worst loss rel diff %.2e (bound %.0e); worst parameter diff %.2e = %.3f lr "
           "(bound %.0f lr per step); %lld of %lld parameter elements differ by more than lr/100\n",
           worst_loss, LOSS_REL, worst_param, worst_param / lr, PARAM_ABS_PER_STEP_LR,
           (long long)moved, (long long)total);
    assert_true(worst_loss <= LOSS_REL);
    assert_true(worst_param <= PARAM_ABS_PER_STEP_LR * lr * 3);
    assert_true(worst_loss > 0 || worst_param > 0); /* f16 groups did skip roundings */
    free_record(&a);
    free_record(&b);
}

/* char_gpt's training, shrunk: next-character prediction over a text with
 * the block, AMP f16 + dynamic scaler + AdamW, 40 steps, fused against
 * unfused; both learn and their loss curves agree within CHAR_LOSS_ABS. */
static const char text[] =
    "to be, or not to be, that is the question: whether tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles "
    "and by opposing end them. to die, to sleep, no more; and by a sleep to say we end the "
    "heart-ache and the thousand natural shocks that flesh is heir to.";

enum { CT = 16, CB = 4, CV = 32, CD = 32, CH = 2, CSTEPS = 40 };

static int32_t char_id(char ch) { return ch == ' ' ? 0 : ch >= 'a' && ch <= 'z' ? ch - 'a' + 1 : 27 + (ch % 5); }

static void char_losses(bool fused, double *losses)
{
    fusion(fused);
    alloy_graph *g = alloy_graph_new("char_gpt");
    alloy_graph_set_seed(g, 7);
    test_block m = build_transformer_block(g, F32, CB, CT, CV, CD, CH);
    expect_ok(g, alloy_graph_set_loss(g, m.loss), "set_loss");
    expect_ok(g, alloy_graph_enable_amp(g, F16), "enable_amp");
    alloy_grad_scaler s = alloy_dynamic_scaler();
    s.init_scale = 1024;
    expect_ok(g, alloy_graph_set_grad_scaler(g, s), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_adamw(3e-3, 0.9, 0.99, 1e-8, 0.01)), "add_optimizer");
    int n = (int)sizeof text - 1;
    for (int step = 0; step < CSTEPS; step++) {
        int32_t tok[CB * CT], tgt[CB * CT];
        for (int b = 0; b < CB; b++) {
            int at = (step * 37 + b * 61) % (n - CT - 1);
            for (int t = 0; t < CT; t++) tok[b * CT + t] = char_id(text[at + t]), tgt[b * CT + t] = char_id(text[at + t + 1]);
        }
        alloy_host_tensor feeds[2] = {{"tokens", ALLOY_I32, 2, {CB, CT}, tok},
                                      {"targets", ALLOY_I32, 1, {CB * CT}, tgt}};
        expect_ok(g, alloy_graph_run(g, feeds, 2, NULL, 0), "char step");
        alloy_step_info info;
        expect_ok(g, alloy_graph_step_info(g, &info), "step_info");
        losses[step] = info.loss;
    }
    alloy_graph_free(g);
    fusion(true);
}

static void test_a_char_gpt_like_training_run_is_unchanged_by_fusion_within_rounding(void **state)
{
    (void)state;
    double a[CSTEPS], b[CSTEPS], worst = 0;
    char_losses(true, a);
    char_losses(false, b);
    for (int s = 0; s < CSTEPS; s++) worst = fmax(worst, fabs(a[s] - b[s]));
    printf("char-level block, %d steps: loss %.4f -> %.4f fused, %.4f -> %.4f unfused; worst |diff| %.2e "
           "(bound %.2g)\n", CSTEPS, a[0], a[CSTEPS - 1], b[0], b[CSTEPS - 1], worst, CHAR_LOSS_ABS);
    assert_true(worst <= CHAR_LOSS_ABS);
    assert_true(a[CSTEPS - 1] < a[0] - 0.5);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* the printed IR interleaves with cmocka's lines */
    const struct CMUnitTest tests[] = {
        FUSE_TEST(test_the_transformer_training_graph_has_the_stated_groups_of_each_kind),
        FUSE_TEST(test_three_f32_training_steps_give_the_same_bits_fused_and_unfused),
        FUSE_TEST(test_three_amp_f16_training_steps_agree_fused_and_unfused_within_the_stated_bound),
        FUSE_TEST(test_a_char_gpt_like_training_run_is_unchanged_by_fusion_within_rounding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
