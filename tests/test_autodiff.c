/* test_autodiff.c - gradients of whole models against f64 finite differences (the MLP, the transformer block, frozen params, a tensor reaching both operands, softmax through a causal mask), the straight-through cast, AMP gradients, the IR round trip, size and speed (every op's own gradient is in the op table, test_op_cases.c). */
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
#include "gradcheck.h"
#include "ir/ir.h"
#include "models.h"
#include "passes/pass.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* AMP (f16) gradients of the transformer block against the f32 graph's:
 * norm-wise relative error per parameter, ||g_amp - g_f32|| / ||g_f32||.
 * Measured 1.2e-3 to 1.6e-3 for the worst parameter (f16 keeps 11
 * significant bits, 4.9e-4 per rounding, and the f16 forward's errors
 * compound through the backward); the bound leaves more than 10x margin. */
#define AMP_BOUND 2e-2

static al_arena arena; /* the test's scratch, freed at its end (finish) */

/* ---- helpers ---- */

static void *scratch(size_t bytes)
{
    void *p = al_arena_alloc(&arena, bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static char *fmt(const char *f, ...) AL_PRINTF(1, 2);
static char *fmt(const char *f, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return al_arena_strdup(&arena, buf);
}

static int64_t numel(int rank, const int64_t *dims)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    return n;
}

/* n values uniform in [lo, hi] with |v| >= gap. */
static double *randoms(int64_t n, double lo, double hi, double gap)
{
    double *v = scratch(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        do v[i] = test_uniform(lo, hi);
        while (fabs(v[i]) < gap);
    return v;
}

typedef struct shape {
    int rank;
    int64_t dims[ALLOY_MAX_RANK];
} shape;

static shape random_shape(int minrank, int maxrank)
{
    shape s = {.rank = test_irand(minrank, maxrank)};
    for (int d = 0; d < s.rank; d++) s.dims[d] = test_irand(1, 4);
    return s;
}

/* Every test ends here: its scratch is freed (the allocator checks leaks)
 * and it fails if any of its cases did. */
static void finish(void)
{
    al_arena_free(&arena);
    test_end_cases();
}

static int plain_alloc(void **state)
{
    memset(&arena, 0, sizeof arena); /* a test that failed half way left its blocks to cmocka, which freed them */
    test_forget_failed_cases();
    return test_plain_alloc(state);
}

/* ---- gradient cases: a graph, its checked leaves, its feeds ---- */

enum { MAX_LEAVES = 24, MAX_FEEDS = 8 };

/* A tensor whose gradient is checked: a param (values set as state) or an
 * f64 input whose gradient was requested (values are its feed). */
typedef struct leaf {
    const char *name;
    int rank;
    int64_t dims[ALLOY_MAX_RANK];
    int64_t count;
    double *v;
    bool input;
} leaf;

typedef struct gcase {
    alloy_graph *g;
    const char *what;
    leaf leaf[MAX_LEAVES];
    int nleaf;
    alloy_host_tensor feed[MAX_FEEDS];
    int nfeed;
} gcase;

/* A case over graph g (which it owns from now on). */
static gcase *new_case_on(const char *what, alloy_graph *g)
{
    gcase *c = scratch(sizeof *c);
    c->what = what;
    c->g = g;
    assert_non_null(c->g);
    return c;
}

static gcase *new_case(const char *what) { return new_case_on(what, alloy_graph_new("autodiff_case")); }

static void add_leaf(gcase *c, const char *name, int rank, const int64_t *dims, double *v, bool input)
{
    assert_true(c->nleaf < MAX_LEAVES);
    leaf *l = &c->leaf[c->nleaf++];
    l->name = al_arena_strdup(&arena, name);
    l->rank = rank;
    if (rank) memcpy(l->dims, dims, sizeof(int64_t) * (size_t)rank);
    l->count = numel(rank, dims);
    l->v = v;
    l->input = input;
}

/* An f64 param whose state will be v (its uniform init is overwritten). */
static alloy_tensor *param(gcase *c, const char *name, shape s, double *v)
{
    add_leaf(c, name, s.rank, s.dims, v, false);
    return alloy_param(c->g, name, F64, s.rank, s.dims, alloy_init_uniform(-1, 1));
}

static alloy_tensor *uparam(gcase *c, const char *name, shape s, double lo, double hi)
{
    return param(c, name, s, randoms(numel(s.rank, s.dims), lo, hi, 0));
}

static int32_t *ids32(int n, const int *v)
{
    int32_t *p = scratch(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) p[i] = v[i];
    return p;
}

/* Makes the named params of a model built in c->g leaves, at their initial values. */
static void adopt_params(gcase *c, int n, const char *const *names)
{
    for (int i = 0; i < n; i++) {
        alloy_host_tensor t;
        if (alloy_graph_get_state(c->g, names[i], &t)) fail_msg("no state '%s': %s", names[i], alloy_last_error(c->g));
        assert_int_equal(t.dtype, F64);
        int64_t count = numel(t.rank, t.dims);
        double *v = scratch(sizeof(double) * (size_t)count);
        memcpy(v, t.data, sizeof(double) * (size_t)count);
        add_leaf(c, names[i], t.rank, t.dims, v, false);
    }
}

static bool set_param(gcase *c, const leaf *l)
{
    alloy_host_tensor t = {.name = l->name, .dtype = F64, .rank = l->rank, .data = l->v};
    memcpy(t.dims, l->dims, sizeof t.dims);
    if (!alloy_graph_set_state(c->g, &t)) return true;
    test_case_failed("%s: set_state '%s': %s", c->what, l->name, alloy_last_error(c->g));
    return false;
}

static double loss_of(gcase *c)
{
    alloy_host_tensor f = {.name = "loss"};
    if (alloy_graph_run(c->g, c->feed, c->nfeed, &f, 1))
        fail_msg("%s: run failed: %s", c->what, alloy_last_error(c->g));
    return *(const double *)f.data;
}

/* Frees c's graph after a failed case; returns the error a failed case counts as. */
static double drop_case(gcase *c)
{
    alloy_graph_free(c->g);
    c->g = NULL;
    return INFINITY;
}

/* The loss of c at its leaves' current values (gradcheck's callback): a
 * param leaf that changed is set as state first, an input is read from its feed. */
static double case_loss(void *ctx, int changed)
{
    gcase *c = ctx;
    if (changed >= 0 && !c->leaf[changed].input) assert_true(set_param(c, &c->leaf[changed]));
    return loss_of(c);
}

/* Makes `loss` c's loss, runs once fetching "grad:<leaf>" for every leaf
 * (each must be f64 with the leaf's shape) and compares every element of
 * each with central finite differences (gc_check, GC_BOUND). Frees the
 * graph; returns the worst error. GRADCHECK_VERBOSE=1 prints each tensor's error. */
static double check_case(gcase *c, alloy_tensor *loss)
{
    alloy_graph *g = c->g;
    if (!loss || alloy_graph_set_loss(g, loss)) {
        test_case_failed("%s: building failed: %s", c->what, alloy_last_error(g));
        return drop_case(c);
    }
    for (int j = 0; j < c->nleaf; j++)
        if (!c->leaf[j].input && !set_param(c, &c->leaf[j])) return drop_case(c);
    alloy_host_tensor *f = scratch(sizeof *f * (size_t)(c->nleaf + 1));
    f[0].name = "loss";
    for (int j = 0; j < c->nleaf; j++) f[j + 1].name = fmt("grad:%s", c->leaf[j].name);
    if (alloy_graph_run(g, c->feed, c->nfeed, f, c->nleaf + 1)) {
        test_case_failed("%s: run failed: %s", c->what, alloy_last_error(g));
        return drop_case(c);
    }
    gc_tensor *t = scratch(sizeof *t * (size_t)c->nleaf);
    for (int j = 0; j < c->nleaf; j++) {
        const leaf *l = &c->leaf[j];
        if (f[j + 1].dtype != F64 || f[j + 1].rank != l->rank ||
            memcmp(f[j + 1].dims, l->dims, sizeof(int64_t) * (size_t)l->rank) != 0) {
            test_case_failed("%s: %s has dtype %s rank %d, expected f64 rank %d", c->what, f[j + 1].name,
                             alloy_dtype_name(f[j + 1].dtype), f[j + 1].rank, l->rank);
            return drop_case(c);
        }
        double *grad = scratch(sizeof(double) * (size_t)l->count);
        memcpy(grad, f[j + 1].data, sizeof(double) * (size_t)l->count);
        t[j] = (gc_tensor){l->name, l->v, l->count, grad};
    }
    double worst = gc_check(c->what, t, c->nleaf, case_loss, c, GC_BOUND);
    printf("  %-58s error %.1e\n", c->what, worst);
    alloy_graph_free(g);
    c->g = NULL;
    return worst;
}

/* loss = reduce_sum(out * R) with R a fixed random constant of out's shape,
 * so every element of out matters; then check_case. */
static double check_op(gcase *c, alloy_tensor *out)
{
    if (!out) {
        test_case_failed("%s: building failed: %s", c->what, alloy_last_error(c->g));
        return drop_case(c);
    }
    alloy_host_tensor t = alloy_tensor_info(out);
    double *r = randoms(numel(t.rank, t.dims), -1, 1, 0.1);
    alloy_tensor *R = alloy_constant(c->g, F64, t.rank, t.dims, r);
    alloy_tensor *loss = alloy_reduce_sum(c->g, alloy_mul(c->g, out, R), 0, NULL, false);
    alloy_output(c->g, "loss", loss);
    return check_case(c, loss);
}

/* ---- gradients through several ops ---- */

typedef alloy_tensor *(*binary_fn)(alloy_graph *, alloy_tensor *, alloy_tensor *);


/* Values of a binary op's operand j. maximum/minimum take a from the grid
 * 0.1k + 0.05 and b from 0.1k, so no pair ties (they differ by >= 0.05). */
static double *binary_values(const char *op, int j, shape s)
{
    int64_t n = numel(s.rank, s.dims);
    if (!strcmp(op, "maximum") || !strcmp(op, "minimum")) {
        double *v = scratch(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) v[i] = 0.1 * test_irand(-15, 15) + (j == 0 ? 0.05 : 0);
        return v;
    }
    if (!strcmp(op, "div") && j == 1) return randoms(n, -2, 2, 0.5); /* divisor away from 0 */
    if (!strcmp(op, "pow") && j == 0) return randoms(n, 0.5, 2, 0);  /* base > 0 */
    return randoms(n, -2, 2, 0);
}

/* One tensor reaching both operands: the two gradients add up (x and
 * tanh(x) never tie on the grid max/min use, and keep div's divisor away
 * from 0). */
static void test_a_tensor_reaching_both_operands_of_a_binary_op_gets_both_gradients_summed(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        binary_fn f;
    } ops[] = {{"add", alloy_add},         {"sub", alloy_sub},         {"mul", alloy_mul}, {"div", alloy_div},
               {"maximum", alloy_maximum}, {"minimum", alloy_minimum}, {"pow", alloy_pow}};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        shape s = random_shape(1, 3);
        gcase *c = new_case(fmt("%s(x, tanh(x)) %s", ops[k].name, test_dims_str(s.rank, s.dims)));
        alloy_tensor *x = param(c, "x", s, binary_values(ops[k].name, strcmp(ops[k].name, "div") ? 0 : 1, s));
        check_op(c, ops[k].f(c->g, x, alloy_tanh(c->g, x)));
    }
    finish();
}

/* As in attention: -inf entries only make sense through a softmax. */
static void test_softmax_of_a_causal_mask_differentiates_through_the_unmasked_entries(void **state)
{
    (void)state;
    static const shape masks[] = {{3, {2, 3, 4}}, {2, {3, 3}}, {4, {1, 2, 2, 3}}};
    for (int i = 0; i < 3; i++) {
        gcase *c = new_case(fmt("softmax(causal_mask) %s", test_dims_str(masks[i].rank, masks[i].dims)));
        check_op(c, alloy_softmax(c->g, alloy_causal_mask(c->g, uparam(c, "x", masks[i], -2, 2)), -1));
    }
    finish();
}


/* Through f32 the function is piecewise constant, so finite differences say
 * nothing; the gradient of a cast is the gradient cast back (straight
 * through): d/dx sum(cast64(cast32(x)) * R) = R rounded to f32 and back. */
static void test_cast_through_f32_passes_the_gradient_straight_through_rounded_to_f32(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("cast_through_f32");
    double *r = randoms(6, -1, 1, 0.1);
    alloy_tensor *x = alloy_param(g, "x", F64, 2, DIMS(2, 3), alloy_init_uniform(-1, 1));
    alloy_tensor *y = alloy_cast(g, alloy_cast(g, x, F32), F64);
    alloy_tensor *loss = alloy_reduce_sum(g, alloy_mul(g, y, alloy_constant(g, F64, 2, DIMS(2, 3), r)), 0, NULL, false);
    assert_int_equal(alloy_graph_set_loss(g, loss), ALLOY_OK);
    alloy_host_tensor f = {.name = "grad:x"};
    if (alloy_graph_run(g, NULL, 0, &f, 1)) fail_msg("%s", alloy_last_error(g));
    assert_int_equal(f.dtype, F64);
    for (int i = 0; i < 6; i++) assert_true(((const double *)f.data)[i] == (double)(float)r[i]);
    alloy_graph_free(g);
    finish();
}

/* ---- models ---- */

static const char *const mlp_params[] = {"w1", "b1", "w2", "b2"};
static const char *const block_params[] = {"tok_emb", "pos_emb", "ln1.g",  "ln1.b",  "attn.wq", "attn.wk",
                                           "attn.wv", "attn.wo", "ln2.g",  "ln2.b",  "mlp.w1",  "mlp.b1",
                                           "mlp.w2",  "mlp.b2",  "lnf.g",  "lnf.b",  "head.w"};
enum { NBLOCK = sizeof block_params / sizeof block_params[0] };

static void test_mlp_parameter_gradients_match_finite_differences(void **state)
{
    (void)state;
    gcase *c = new_case("mlp f64 batch 4, 3 -> 5 -> 3");
    test_mlp m = build_mlp(c->g, F64, 4, 3, 5, 3);
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "x", .dtype = F64, .rank = 2, .dims = {4, 3}, .data = randoms(12, -1, 1, 0)};
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "targets", .dtype = I32, .rank = 1, .dims = {4},
                                              .data = ids32(4, (int[]){0, 2, 1, 2})};
    adopt_params(c, 4, mlp_params);
    check_case(c, m.loss);
    finish();
}

static void block_feeds(gcase *c, int B, int T, int V)
{
    int *tok = scratch(sizeof(int) * (size_t)(2 * B * T));
    for (int i = 0; i < 2 * B * T; i++) tok[i] = test_irand(0, V - 1);
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "tokens", .dtype = I32, .rank = 2, .dims = {B, T}, .data = ids32(B * T, tok)};
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "targets", .dtype = I32, .rank = 1, .dims = {B * T},
                                              .data = ids32(B * T, tok + B * T)};
}

static void test_transformer_block_parameter_gradients_match_finite_differences(void **state)
{
    (void)state;
    gcase *c = new_case("transformer block f64 B2 T3 V7 D8 H2");
    test_block m = build_transformer_block(c->g, F64, 2, 3, 7, 8, 2);
    block_feeds(c, 2, 3, 7);
    adopt_params(c, NBLOCK, block_params);
    /* The models' init makes attention nearly uniform, so d loss / d wq, wk
     * are ~1e-4 and finite differences (noise ~ ulp(loss) / h ~ 3e-10) would
     * resolve them only to ~1e-6. Weights in +-0.6 (scores of order one),
     * gammas in [0.5, 1.5] and betas in +-0.5 put every gradient at 1e-2 or
     * more, where the FD noise is below 1e-7 relative. */
    for (int j = 0; j < c->nleaf; j++) {
        leaf *l = &c->leaf[j];
        const char *dot = strrchr(l->name, '.');
        bool gamma = dot && !strcmp(dot, ".g"), beta = dot && !strcmp(dot, ".b");
        if (strstr(l->name, "emb")) continue; /* embeddings keep their normal(0.5) */
        memcpy(l->v, randoms(l->count, gamma ? 0.5 : beta ? -0.5 : -0.6, gamma ? 1.5 : beta ? 0.5 : 0.6, 0),
               sizeof(double) * (size_t)l->count);
    }
    check_case(c, m.loss);
    finish();
}

/* Runs g fetching loss and "grad:<p>" of every block param into *grads
 * (copies, as f64); checks each gradient's dtype is want. */
static void block_grads(alloy_graph *g, const alloy_host_tensor *feeds, double **grads, int64_t *counts, alloy_dtype want)
{
    alloy_host_tensor f[NBLOCK];
    for (int j = 0; j < NBLOCK; j++) f[j] = (alloy_host_tensor){.name = fmt("grad:%s", block_params[j])};
    if (alloy_graph_run(g, feeds, 2, f, NBLOCK)) fail_msg("%s", alloy_last_error(g));
    for (int j = 0; j < NBLOCK; j++) {
        if (f[j].dtype != want)
            fail_msg("%s is %s, expected %s", f[j].name, alloy_dtype_name(f[j].dtype), alloy_dtype_name(want));
        counts[j] = numel(f[j].rank, f[j].dims);
        grads[j] = scratch(sizeof(double) * (size_t)counts[j]);
        cvt_load_f64(f[j].dtype, f[j].data, grads[j], (size_t)counts[j]);
    }
}

static int count_op(const ir_graph *c, int op)
{
    int n = 0;
    for (int i = 0; i < c->nnodes; i++) n += c->nodes[i]->op == op;
    return n;
}

/* q, k, v: three slices of one projection h (a fused qkv), out = q k v. */
static alloy_tensor *split_product(alloy_graph *g, alloy_tensor *h)
{
    alloy_tensor *q = alloy_slice(g, h, 1, 0, 2), *k = alloy_slice(g, h, 1, 2, 4), *v = alloy_slice(g, h, 1, 4, 6);
    return alloy_mul(g, alloy_mul(g, q, k), v);
}

static void test_the_gradient_of_slices_tiling_a_tensor_is_one_concat_not_pads_added(void **state)
{
    (void)state;
    shape s = {2, {3, 6}};
    /* the backward: one concat of dq, dk, dv (no pad, no add of the pieces) */
    alloy_graph *g = alloy_graph_new("split");
    alloy_tensor *h = alloy_param(g, "h", F64, s.rank, s.dims, alloy_init_uniform(-1, 1));
    alloy_tensor *loss = alloy_reduce_sum(g, split_product(g, h), 0, NULL, false);
    assert_int_equal(alloy_graph_set_loss(g, loss), ALLOY_OK);
    if (graph_compile(g)) fail_msg("%s", alloy_last_error(g));
    const ir_graph *c = g->compiled;
    assert_int_equal(count_op(c, IR_OP_pad), 0);
    assert_int_equal(count_op(c, IR_OP_concat), 1);
    int grad = -1;
    for (int i = 0; i < c->noutputs; i++)
        if (strcmp(c->outputs[i].name, "grad:h") == 0) grad = c->outputs[i].node;
    assert_true(grad >= 0);
    const ir_node *mm = c->nodes[grad]; /* grad:h is the concat itself: the sum over rows keeps h's shape */
    assert_int_equal(mm->op, IR_OP_concat);
    assert_int_equal(mm->nin, 3);
    alloy_graph_free(g);
    /* and its values are the gradient's (central differences) */
    gcase *k = new_case("q k v of slices of h [3,6]");
    alloy_tensor *hk = param(k, "h", s, randoms(18, -1, 1, 0.1));
    assert_true(check_op(k, split_product(k->g, hk)) <= GC_BOUND);
    finish();
}

static void test_amp_gradients_of_the_transformer_block_are_f32_and_close_to_the_f32_graph(void **state)
{
    (void)state;
    enum { B = 2, T = 8, V = 16, D = 16, H = 2 };
    alloy_graph *ref = alloy_graph_new("block_f32"), *amp = alloy_graph_new("block_amp");
    test_block mr = build_transformer_block(ref, F32, B, T, V, D, H);
    test_block ma = build_transformer_block(amp, F32, B, T, V, D, H);
    assert_int_equal(alloy_graph_set_loss(ref, mr.loss), ALLOY_OK);
    assert_int_equal(alloy_graph_set_loss(amp, ma.loss), ALLOY_OK);
    assert_int_equal(alloy_graph_enable_amp(amp, F16), ALLOY_OK);
    /* every written-out attention becomes the op (the CPU default keeps small ones written out) */
    assert_int_equal(alloy_graph_set_option(amp, "attention", "always"), ALLOY_OK);
    gcase *c = new_case("amp feeds"); /* only its feeds are used */
    alloy_graph_free(c->g);
    block_feeds(c, B, T, V);
    double *gr[NBLOCK], *ga[NBLOCK];
    int64_t nr[NBLOCK], na[NBLOCK];
    block_grads(ref, c->feed, gr, nr, F32); /* same seed, same names: same initial parameters */
    block_grads(amp, c->feed, ga, na, F32);
    double worst = 0;
    for (int j = 0; j < NBLOCK; j++) {
        assert_int_equal(nr[j], na[j]);
        double diff2 = 0, ref2 = 0;
        for (int64_t i = 0; i < nr[j]; i++) diff2 += (ga[j][i] - gr[j][i]) * (ga[j][i] - gr[j][i]), ref2 += gr[j][i] * gr[j][i];
        double err = sqrt(diff2 / ref2);
        assert_true(ref2 > 0);
        if (err > AMP_BOUND) fail_msg("grad:%s under AMP: relative error %.3g > %.0e", block_params[j], err, AMP_BOUND);
        worst = fmax(worst, err);
    }
    printf("  AMP f16 vs f32 parameter gradients: worst relative error %.2e (bound %.0e)\n", worst, AMP_BOUND);
    /* every matmul, forward and backward, runs in f16; every gradient output is f32 */
    const ir_graph *cg = amp->compiled;
    int matmuls = 0;
    for (int i = 0; i < cg->nnodes; i++) {
        const ir_node *n = cg->nodes[i];
        if (n->op != IR_OP_matmul) continue;
        matmuls++;
        for (int j = 0; j < 2; j++)
            if (cg->nodes[n->in[j]]->type.dtype != F16)
                fail_msg("matmul %%%d operand %d is %s, expected f16", i, j, alloy_dtype_name(cg->nodes[n->in[j]]->type.dtype));
        assert_int_equal(n->type.dtype, F16);
    }
    /* 9 forward matmuls as built (q, k, v, scores, att @ v, wo, mlp.w1,
     * mlp.w2, head); the attention pass makes scores to att @ v one
     * attention op (f16 too), so 7 remain, two backward each */
    assert_int_equal(count_op(amp->ir, IR_OP_matmul), 9);
    assert_int_equal(matmuls, 21);
    assert_int_equal(count_op(cg, IR_OP_attention), 1);
    assert_int_equal(count_op(cg, IR_OP_attention_grad), 1);
    for (int i = 0; i < cg->nnodes; i++)
        if (cg->nodes[i]->op == IR_OP_attention || cg->nodes[i]->op == IR_OP_attention_grad) assert_int_equal(cg->nodes[i]->type.dtype, F16);
    int grads = 0;
    for (int i = 0; i < cg->noutputs; i++) {
        if (strncmp(cg->outputs[i].name, "grad:", 5) != 0) continue;
        grads++;
        assert_int_equal(cg->nodes[cg->outputs[i].node]->type.dtype, F32);
    }
    assert_int_equal(grads, NBLOCK);
    alloy_graph_free(ref);
    alloy_graph_free(amp);
    finish();
}

static void test_frozen_params_get_no_gradient_and_requested_input_gradients_match_finite_differences(void **state)
{
    (void)state;
    gcase *c = new_case("mlp f64, w1 frozen, grad of input x");
    test_mlp m = build_mlp(c->g, F64, 4, 3, 5, 3);
    assert_int_equal(alloy_param_freeze(c->g, alloy_graph_find(c->g, "w1")), ALLOY_OK);
    double *x = randoms(12, -1, 1, 0);
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "targets", .dtype = I32, .rank = 1, .dims = {4},
                                              .data = ids32(4, (int[]){1, 0, 2, 2})};
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "x", .dtype = F64, .rank = 2, .dims = {4, 3}, .data = x};
    assert_int_equal(alloy_graph_request_grad(c->g, m.x), ALLOY_OK);
    add_leaf(c, "x", 2, DIMS(4, 3), x, true);
    adopt_params(c, 3, mlp_params + 1);
    assert_int_equal(alloy_graph_set_loss(c->g, m.loss), ALLOY_OK);
    alloy_host_tensor f = {.name = "grad:w1"};
    assert_int_equal(alloy_graph_run(c->g, c->feed, c->nfeed, &f, 1), ALLOY_ERR_NOT_FOUND);
    assert_non_null(strstr(alloy_last_error(c->g), "grad:w1"));
    for (int i = 0; i < c->g->compiled->noutputs; i++)
        assert_string_not_equal(c->g->compiled->outputs[i].name, "grad:w1");
    check_case(c, m.loss);
    finish();
}

/* ---- the compiled training graph ---- */

static ir_graph *compiled_block(alloy_graph *g, bool amp)
{
    test_block m = build_transformer_block(g, F32, 2, 4, 11, 8, 2);
    assert_int_equal(alloy_graph_set_loss(g, m.loss), ALLOY_OK);
    if (amp) assert_int_equal(alloy_graph_enable_amp(g, F16), ALLOY_OK);
    /* the written-out attention's backward (softmax_grad ...), not the attention op's */
    assert_int_equal(alloy_graph_set_option(g, "disable_passes", "attention"), ALLOY_OK);
    if (graph_compile(g)) fail_msg("%s", alloy_last_error(g));
    return g->compiled;
}

static void test_training_graph_ir_round_trips_through_the_printer_and_the_parser(void **state)
{
    (void)state;
    for (int amp = 0; amp < 2; amp++) {
        alloy_graph *g = alloy_graph_new("block");
        ir_graph *cg = compiled_block(g, amp);
        char *text = ir_print_string(cg), err[512];
        assert_non_null(text);
        assert_non_null(strstr(text, "layer_norm_grad_stats("));
        assert_non_null(strstr(text, "output \"grad:head.w\""));
        ir_graph *back = ir_parse(text, strlen(text), "compiled.ir", err, sizeof err);
        if (!back) fail_msg("%s: %s", amp ? "amp" : "f32", err);
        assert_int_equal(back->nnodes, cg->nnodes);
        char *again = ir_print_string(back);
        assert_non_null(again);
        assert_string_equal(again, text);
        al_free(again);
        al_free(text);
        ir_graph_free(back);
        alloy_graph_free(g);
    }
    finish();
}

static void test_transformer_block_backward_has_one_fused_grad_per_forward_op(void **state)
{
    (void)state;
    for (int amp = 0; amp < 2; amp++) {
        alloy_graph *g = alloy_graph_new("block");
        ir_graph *cg = compiled_block(g, amp);
        int fwd = g->ir->nnodes, total = cg->nnodes;
        printf("  transformer block B2 T4 V11 D8 H2 %s: %d forward nodes as built, %d compiled (%d up to the loss, "
               "%d after it)\n",
               amp ? "AMP f16" : "f32", fwd, total, cg->loss + 1, total - cg->loss - 1);
        /* each layer_norm's gradient reads the mean and rstd its forward kept */
        assert_int_equal(count_op(cg, IR_OP_layer_norm_grad_stats), 3);
        assert_int_equal(count_op(cg, IR_OP_layer_norm_mean), 3);
        assert_int_equal(count_op(cg, IR_OP_layer_norm_rstd), 3);
        assert_int_equal(count_op(cg, IR_OP_softmax_grad), 1);
        assert_int_equal(count_op(cg, IR_OP_cross_entropy_grad), 1);
        assert_int_equal(count_op(cg, IR_OP_embedding_grad), 1);
        assert_true(total > fwd && total < 4 * fwd);
        alloy_graph_free(g);
    }
    finish();
}

/* h_0 = X; h_{k+1} = 0.5 * tanh(h_k W) + X for STEPS steps (4 nodes a step,
 * ~100k forward nodes); loss = sum(h * R). Times the compile (and the
 * autodiff pass alone) and checks both gradients against a hand-written
 * reverse pass in double. */
static void test_autodiff_of_a_100k_node_chain_is_fast_and_matches_a_hand_written_backward(void **state)
{
    (void)state;
    enum { STEPS = 25000, N = 4, NN = N * N };
    alloy_graph *g = alloy_graph_new("chain");
    double *x = randoms(NN, -1, 1, 0), *w = randoms(NN, -0.5, 0.5, 0), *r = randoms(NN, -1, 1, 0);
    alloy_tensor *X = alloy_param(g, "X", F64, 2, DIMS(N, N), alloy_init_zeros());
    alloy_tensor *W = alloy_param(g, "W", F64, 2, DIMS(N, N), alloy_init_zeros());
    alloy_tensor *half = alloy_scalar(g, F64, 0.5), *h = X;
    for (int k = 0; k < STEPS; k++) h = alloy_add(g, alloy_mul(g, alloy_tanh(g, alloy_matmul(g, h, W, false, false)), half), X);
    alloy_tensor *loss = alloy_reduce_sum(g, alloy_mul(g, h, alloy_constant(g, F64, 2, DIMS(N, N), r)), 0, NULL, false);
    assert_int_equal(alloy_graph_set_loss(g, loss), ALLOY_OK);
    int fwd = g->ir->nnodes;
    assert_true(fwd > 100000);
    /* the pipeline pass by pass on a copy, then the compile the run uses */
    ir_graph *copy = ir_graph_clone(g->ir);
    pass_options opts;
    assert_int_equal(graph_pass_options(g, &opts), ALLOY_OK);
    opts.train = true;
    pass_timing tm[8];
    int nt = 0;
    if (pass_run_pipeline(&copy, &opts, NULL, stderr, tm, 8, &nt)) fail_msg("%s", copy->error);
    double autodiff_ms = -1;
    char passes[256] = "";
    for (int i = 0; i < nt; i++) {
        if (!strcmp(tm[i].name, "autodiff")) autodiff_ms = tm[i].ms;
        size_t len = strlen(passes);
        al_fmt(passes + len, sizeof passes - len, "%s%s %.0f ms -> %d nodes", i ? ", " : "", tm[i].name, tm[i].ms,
               tm[i].nodes_after);
    }
    printf("  chain pipeline: %s\n", passes);
    assert_true(autodiff_ms >= 0);
    ir_graph_free(copy);
    double t0 = test_now_ms();
    if (graph_compile(g)) fail_msg("%s", alloy_last_error(g));
    double compile_ms = test_now_ms() - t0;
    assert_int_equal(alloy_graph_set_state(g, &(alloy_host_tensor){.name = "X", .dtype = F64, .rank = 2, .dims = {N, N}, .data = x}),
                     ALLOY_OK);
    assert_int_equal(alloy_graph_set_state(g, &(alloy_host_tensor){.name = "W", .dtype = F64, .rank = 2, .dims = {N, N}, .data = w}),
                     ALLOY_OK);
    alloy_host_tensor f[2] = {{.name = "grad:W"}, {.name = "grad:X"}};
    t0 = test_now_ms();
    if (alloy_graph_run(g, NULL, 0, f, 2)) fail_msg("%s", alloy_last_error(g));
    double run_ms = test_now_ms() - t0;
    printf("  chain: %d forward nodes, %d compiled; compile %.0f ms (autodiff pass %.0f ms), run %.0f ms\n", fwd,
           g->compiled->nnodes, compile_ms, autodiff_ms, run_ms);
    /* the reference: forward keeping every t = tanh(h W), then reverse */
    double *hs = al_malloc(sizeof(double) * NN * (STEPS + 1)), *ts = al_malloc(sizeof(double) * NN * STEPS);
    assert_non_null(hs);
    assert_non_null(ts);
    memcpy(hs, x, sizeof(double) * NN);
    for (int k = 0; k < STEPS; k++)
        for (int i = 0; i < N; i++)
            for (int j = 0; j < N; j++) {
                double m = 0;
                for (int l = 0; l < N; l++) m += hs[k * NN + i * N + l] * w[l * N + j];
                ts[k * NN + i * N + j] = tanh(m);
                hs[(k + 1) * NN + i * N + j] = 0.5 * tanh(m) + x[i * N + j];
            }
    double dh[NN], dx[NN] = {0}, dw[NN] = {0}, dm[NN];
    memcpy(dh, r, sizeof dh);
    for (int k = STEPS - 1; k >= 0; k--) {
        for (int e = 0; e < NN; e++) {
            dx[e] += dh[e];
            dm[e] = 0.5 * dh[e] * (1 - ts[k * NN + e] * ts[k * NN + e]);
        }
        for (int i = 0; i < N; i++) /* dW += h^T dm, dh = dm W^T */
            for (int j = 0; j < N; j++) {
                double sw = 0, sh = 0;
                for (int l = 0; l < N; l++) {
                    sw += hs[k * NN + l * N + i] * dm[l * N + j];
                    sh += dm[i * N + l] * w[j * N + l];
                }
                dw[i * N + j] += sw;
                dh[i * N + j] = sh;
            }
    }
    for (int e = 0; e < NN; e++) dx[e] += dh[e];
    al_free(hs);
    al_free(ts);
    const double *ref[2] = {dw, dx};
    for (int t = 0; t < 2; t++) {
        double diff2 = 0, ref2 = 0;
        for (int e = 0; e < NN; e++) {
            double d = ((const double *)f[t].data)[e] - ref[t][e];
            diff2 += d * d, ref2 += ref[t][e] * ref[t][e];
        }
        if (sqrt(diff2 / ref2) > 1e-12) fail_msg("%s: relative error %.3g > 1e-12", f[t].name, sqrt(diff2 / ref2));
    }
    alloy_graph_free(g);
    finish();
}

#define TEST(f) cmocka_unit_test_setup_teardown(f, test_checked_alloc, plain_alloc)
#define TEST_PLAIN(f) cmocka_unit_test_teardown(f, plain_alloc)

int main(void)
{
    test_rng = 0x9b1d5c2a7e3f4861u;
    const struct CMUnitTest tests[] = {
        TEST(test_a_tensor_reaching_both_operands_of_a_binary_op_gets_both_gradients_summed),
        TEST(test_the_gradient_of_slices_tiling_a_tensor_is_one_concat_not_pads_added),
        TEST(test_softmax_of_a_causal_mask_differentiates_through_the_unmasked_entries),
        TEST(test_cast_through_f32_passes_the_gradient_straight_through_rounded_to_f32),
        TEST(test_mlp_parameter_gradients_match_finite_differences),
        TEST(test_transformer_block_parameter_gradients_match_finite_differences),
        TEST(test_amp_gradients_of_the_transformer_block_are_f32_and_close_to_the_f32_graph),
        TEST(test_frozen_params_get_no_gradient_and_requested_input_gradients_match_finite_differences),
        TEST(test_training_graph_ir_round_trips_through_the_printer_and_the_parser),
        TEST(test_transformer_block_backward_has_one_fused_grad_per_forward_op),
        TEST_PLAIN(test_autodiff_of_a_100k_node_chain_is_fast_and_matches_a_hand_written_backward),
    };
    return cmocka_run_group_tests_name("autodiff", tests, NULL, NULL);
}
