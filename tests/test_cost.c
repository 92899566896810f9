/* test_cost.c - the launch-plan cost model (src/cost/): launches, bytes and FLOPs against hand-worked counts, the time formula, a char_gpt step's bytes against the schedule's own count, ptxas' log parsed, calibration from a profile table. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "alloy/cost.h"
#include "codegen/emit_impl.h"
#include "cost/cost.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* A compiled graph's cost model, and what it was built from. */
typedef struct modelled {
    alloy_graph *g;
    cg_program prog;
    lp_plan lp;
    cost_model m;
} modelled;

static void model(modelled *x, alloy_graph *g, const cg_resources *res)
{
    char err[1024];
    x->g = g;
    if (graph_compile_ir(g)) fail_msg("%s", alloy_last_error(g));
    if (cg_emit(g->compiled, &g->comp.sched, &x->prog, err, sizeof err)) fail_msg("%s", err);
    if (lp_build(g->compiled, &g->comp.sched, &g->comp.plan, &x->prog, &x->lp, err, sizeof err)) fail_msg("%s", err);
    if (cost_build(g->compiled, &g->comp.sched, &x->prog, &x->lp, res, &x->m, err, sizeof err)) fail_msg("%s", err);
}

/* model with the emitter's LP_WIDEN (the option cuda_gemm_f32). */
static void model_widened(modelled *x, alloy_graph *g)
{
    char err[1024];
    x->g = g;
    if (graph_compile_ir(g)) fail_msg("%s", alloy_last_error(g));
    if (cg_emit_checked(g->compiled, &g->comp.sched, LP_WIDEN, &x->prog, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(x->prog.checks, 0); /* LP_WIDEN is no check */
    if (lp_build(g->compiled, &g->comp.sched, &g->comp.plan, &x->prog, &x->lp, err, sizeof err)) fail_msg("%s", err);
    if (cost_build(g->compiled, &g->comp.sched, &x->prog, &x->lp, NULL, &x->m, err, sizeof err)) fail_msg("%s", err);
}

static void release(modelled *x)
{
    cost_free(&x->m);
    lp_free(&x->lp);
    cg_program_free(&x->prog);
    alloy_graph_free(x->g);
}

static alloy_graph *parse(const char *text)
{
    char err[512];
    alloy_graph *g = alloy_graph_parse(text, strlen(text), "test.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    return g;
}

/* text parsed with fusion off (no_fuse) and modelled into x; the test
 * fails unless it is `kernels` launches, each a kernel. */
static void model_unfused(modelled *x, const char *text, int kernels)
{
    alloy_graph *g = parse(text);
    assert_int_equal(alloy_graph_set_option(g, "no_fuse", "1"), ALLOY_OK);
    model(x, g, NULL);
    assert_int_equal(x->m.n, kernels);
    assert_int_equal(x->m.kernels, kernels);
}

/* The bytes x's launches read and write. */
static int64_t bytes_moved(const modelled *x)
{
    int64_t bytes = 0;
    for (int i = 0; i < x->m.n; i++) bytes += x->m.launches[i].read + x->m.launches[i].written;
    return bytes;
}

/* text modelled into x as one kernel (the test fails otherwise): that launch. */
static const cost_launch *model_one_kernel(modelled *x, const char *text)
{
    model(x, parse(text), NULL);
    assert_int_equal(x->m.n, 1);
    assert_int_equal(x->m.launches[0].action, COST_KERNEL);
    return &x->m.launches[0];
}

static int count_action(const cost_model *m, cost_action a)
{
    int n = 0;
    for (int i = 0; i < m->n; i++) n += m->launches[i].action == a;
    return n;
}

static const char mlp_ir[] =
    "graph mlp {\n"
    "  %x = input : f32[8,16]\n"
    "  %w1 = param {init=\"normal\", std=0.1} : f32[16,32]\n"
    "  %b1 = param {init=\"zeros\"} : f32[32]\n"
    "  %w2 = param {init=\"normal\", std=0.1} : f32[32,4]\n"
    "  %b2 = param {init=\"zeros\"} : f32[4]\n"
    "  %5 = matmul(%x, %w1) : f32[8,32]\n"
    "  %6 = add(%5, %b1) : f32[8,32]\n"
    "  %h = relu(%6) : f32[8,32]\n"
    "  %8 = matmul(%h, %w2) : f32[8,4]\n"
    "  %9 = add(%8, %b2) : f32[8,4]\n"
    "  output \"y\" = %9\n"
    "}\n";

/* The forward: the first GEMM with an epilogue kernel (bias, relu) reading its f32 product back; the
 * second (bias alone) one GEMM with cuBLASLt's bias epilogue, writing y directly. */
static void test_mlp_forward_launches_bytes_and_flops_are_the_hand_worked_ones(void **state)
{
    (void)state;
    modelled x;
    model(&x, parse(mlp_ir), NULL);
    const cost_model *m = &x.m;
    assert_int_equal(m->n, 3);
    assert_int_equal(m->gemms, 2);
    assert_int_equal(m->kernels, 1);
    assert_int_equal(m->memsets + m->copies, 0);
    const cost_launch *g1 = &m->launches[0], *e1 = &m->launches[1], *g2 = &m->launches[2];
    assert_int_equal(g1->action, COST_GEMM);
    assert_int_equal(e1->action, COST_KERNEL);
    /* h1 = x w1: 2 x 8 x 32 x 16 FLOPs; reads x (8x16) and w1 (16x32), writes the f32 product 8x32 */
    assert_true(g1->flops == 8192.0);
    assert_int_equal(g1->read, (8 * 16 + 16 * 32) * 4);
    assert_int_equal(g1->written, 8 * 32 * 4);
    assert_string_equal(g1->name, "gemm.8x32x16.f32");
    /* epilogue: reads the product and b1, writes relu(h1 + b1); add and relu: 2 x 256 FLOPs */
    assert_int_equal(e1->read, 8 * 32 * 4 + 32 * 4);
    assert_int_equal(e1->written, 8 * 32 * 4);
    assert_true(e1->flops == 512.0);
    assert_int_equal(e1->cls, COST_TINY); /* 256 outputs: one block */
    /* y = h w2 + b2: reads h (8x32), w2 (32x4) and b2 (4), writes y (8x4) once; the product's
     * 2 x 8 x 4 x 32 FLOPs and the bias's 32 adds */
    assert_int_equal(g2->action, COST_GEMM);
    assert_int_equal(g2->read, (8 * 32 + 32 * 4) * 4 + 4 * 4);
    assert_int_equal(g2->written, 8 * 4 * 4);
    assert_true(g2->flops == 2.0 * 8 * 4 * 32 + 32);
    assert_int_equal(x.lp.gemms[1].epilogue, LP_EPILOGUE_BIAS);
    assert_int_equal(x.lp.gemms[0].epilogue, LP_EPILOGUE_NONE);
    release(&x);
}

/* A linear layer with its bias in f16 or bf16: one GEMM, no kernel, no f32 product; it reads x, w
 * and b and writes y in the layer's dtype. */
static void test_a_linear_layer_with_bias_is_one_gemm_in_its_dtype(void **state)
{
    (void)state;
    static const char *const dtypes[] = {"f16", "bf16", "f32"};
    for (int i = 0; i < 3; i++) {
        char text[1024];
        const char *d = dtypes[i];
        snprintf(text, sizeof text,
                 "graph linear {\n"
                 "  %%x = input : %s[64,96]\n"
                 "  %%w = param {init=\"normal\", std=0.1} : %s[96,40]\n"
                 "  %%b = param {init=\"zeros\"} : %s[40]\n"
                 "  %%3 = matmul(%%x, %%w) : %s[64,40]\n"
                 "  %%y = add(%%b, %%3) : %s[64,40]\n"
                 "  output \"y\" = %%y\n"
                 "}\n",
                 d, d, d, d, d);
        modelled x;
        model(&x, parse(text), NULL);
        int64_t e = i < 2 ? 2 : 4;
        assert_int_equal(x.m.n, 1);
        assert_int_equal(x.m.kernels, 0);
        assert_int_equal(x.m.gemms, 1);
        const cost_launch *g = &x.m.launches[0];
        assert_int_equal(g->read, (64 * 96 + 96 * 40 + 40) * e);
        assert_int_equal(g->written, 64 * 40 * e);
        assert_true(g->flops == 2.0 * 64 * 40 * 96 + 64 * 40);
        assert_int_equal(g->tensor, i < 2);
        const lp_gemm *gm = &x.lp.gemms[0];
        assert_int_equal(gm->epilogue, LP_EPILOGUE_BIAS);
        assert_int_equal(gm->m, 40); /* the bias runs along D's m = 40 rows: the output's last dim */
        assert_int_equal(gm->d, i == 0 ? ALLOY_F16 : i == 1 ? ALLOY_BF16 : ALLOY_F32);
        assert_int_equal(gm->bias.space, LP_LEAF);
        release(&x);
    }
}

/* With cuda_gemm_f32 (LP_WIDEN) a mixed-precision linear layer, the
 * product in f16 or bf16 cast to f32 and an f32 bias added (y = f32(x w)
 * + b), and a product cast alone (z = f32(x w)) are one GEMM each writing
 * f32 (the bias f32 too), no epilogue kernel: its A and B in the low
 * dtype, D and the bias 4 bytes an element; without it every one keeps
 * its kernel (the range rule). A cast to f16 after the bias (the kernel rounds twice), and
 * an f32 product cast to f16 (cuBLASLt has no f32 A and B into f16 D),
 * keep their epilogue kernels: the f32 product written and read back. */
/* The gemms of test_a_product_widened_...: y's, u's (and z's when widened) write their f32 sum
 * into the cast's slot (d f32, result the cast, no bias), reading A and B and writing 4 bytes an
 * element; the others (z's by default, h's) write the product into the scratch for their kernel. */
static void check_products(const modelled *x, alloy_dtype ab, bool widened)
{
    int whole = 0;
    for (int k = 0; k < x->lp.ngemms; k++) {
        const lp_gemm *gm = &x->lp.gemms[k];
        assert_int_equal(gm->d, ALLOY_F32);
        assert_int_equal(gm->epilogue, LP_EPILOGUE_NONE);
        if (gm->result == gm->node) continue; /* the product into the scratch */
        assert_int_equal(gm->ab, ab);
        whole++;
        const cost_launch *l = NULL;
        for (int q = 0; q < x->m.n; q++)
            if (x->m.launches[q].action == COST_GEMM && x->m.launches[q].index == k) l = &x->m.launches[q];
        assert_non_null(l);
        if (gm->m == 40 && gm->n == 64) { /* y, u: x w, v w */
            assert_int_equal(l->read, (64 * 96 + 96 * 40) * 2);
            assert_int_equal(l->written, 64 * 40 * 4);
        } else { /* z: w^T w */
            assert_int_equal(l->read, (96 * 40 + 96 * 40) * 2);
            assert_int_equal(l->written, 40 * 40 * 4);
        }
    }
    assert_int_equal(whole, widened ? 3 : 2);
}

static void test_a_product_widened_for_readers_that_apply_the_range_rule_has_no_epilogue_kernel(void **state)
{
    (void)state;
    static const char *const dtypes[] = {"f16", "bf16"};
    for (int i = 0; i < 2; i++) {
        char text[1024];
        const char *d = dtypes[i];
        snprintf(text, sizeof text,
                 "graph linear {\n"
                 "  %%x = input : %s[64,96]\n"
                 "  %%w = input : %s[96,40]\n"
                 "  %%b = param {init=\"zeros\"} : f32[40]\n"
                 "  %%3 = matmul(%%x, %%w) : %s[64,40]\n"
                 "  %%4 = cast(%%3) : f32[64,40]\n"
                 "  %%y = add(%%4, %%b) : f32[64,40]\n"
                 "  %%6 = matmul(%%w, %%w) {transpose_a=true} : %s[40,40]\n"
                 "  %%z = cast(%%6) : f32[40,40]\n"
                 "  %%v = input : %s[64,96]\n"
                 "  %%8 = matmul(%%v, %%w) : %s[64,40]\n"
                 "  %%9 = cast(%%8) : f32[64,40]\n"
                 "  %%10 = add(%%9, %%b) : f32[64,40]\n"
                 "  %%u = cast(%%10) : f16[64,40]\n"
                 "  %%x32 = input : f32[64,96]\n"
                 "  %%13 = matmul(%%x32, %%x32) {transpose_b=true} : f32[64,64]\n"
                 "  %%h = cast(%%13) : f16[64,64]\n"
                 "  output \"y\" = %%y\n"
                 "  output \"z\" = %%z\n"
                 "  output \"u\" = %%u\n"
                 "  output \"h\" = %%h\n"
                 "}\n",
                 d, d, d, d, d, d);
        modelled x;
        /* the default, by hand: y's and u's products are widened where their readers (y's add kernel,
         * u's add + cast kernel) apply the range rule as they load them, so cuBLASLt writes the f32
         * sum into the cast's slot (no epilogue kernel) and the bias add is a kernel of its own (an
         * f32 bias after the widening is no cuBLASLt epilogue under the rule); z is an output, read
         * by the user as the step stores it: its range rule stays the epilogue kernel's, and so does
         * h's narrowing of an f32 product. 4 GEMMs, 4 kernels. */
        model(&x, parse(text), NULL);
        assert_int_equal(x.m.gemms, 4);
        assert_int_equal(x.m.kernels, 4);
        assert_int_equal(x.m.n, 8);
        check_products(&x, i == 0 ? ALLOY_F16 : ALLOY_BF16, false);
        release(&x);
        /* cuda_gemm_f32 drops the rule for z too: its GEMM writes z whole; h keeps its kernel */
        model_widened(&x, parse(text));
        assert_int_equal(x.m.gemms, 4);
        assert_int_equal(x.m.kernels, 3); /* y's add, u's add + cast, h's epilogue */
        assert_int_equal(x.m.n, 7);
        check_products(&x, i == 0 ? ALLOY_F16 : ALLOY_BF16, true);
        release(&x);
    }
}

/* The training step: forward 2 GEMMs, backward 3 (dw1 = x^T dh, dh = dy w2^T, dw2 = h^T dy; no dx for an input). */
static void test_mlp_training_step_gemm_flops_are_the_five_products(void **state)
{
    (void)state;
    alloy_graph *g = parse(mlp_ir);
    assert_int_equal(alloy_graph_set_loss(g, alloy_graph_find(g, "y")), ALLOY_ERR_INVALID); /* not a scalar */
    alloy_graph_free(g);
    static const char train_ir[] =
        "graph mlp_train {\n"
        "  %x = input : f32[8,16]\n"
        "  %t = input : f32[8,4]\n"
        "  %w1 = param {init=\"normal\", std=0.1} : f32[16,32]\n"
        "  %w2 = param {init=\"normal\", std=0.1} : f32[32,4]\n"
        "  %4 = matmul(%x, %w1) : f32[8,32]\n"
        "  %h = relu(%4) : f32[8,32]\n"
        "  %6 = matmul(%h, %w2) : f32[8,4]\n"
        "  %7 = mse_loss(%6, %t) : f32[8,4]\n"
        "  %loss = reduce_mean(%7) {axes=[0, 1]} : f32[]\n"
        "  loss %loss\n"
        "}\n";
    g = parse(train_ir);
    assert_int_equal(alloy_graph_set_training(g, true), ALLOY_OK);
    assert_int_equal(alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0.0, 0.0, false)), ALLOY_OK);
    modelled x;
    model(&x, g, NULL);
    double flops = 0;
    for (int i = 0; i < x.m.n; i++)
        if (x.m.launches[i].action == COST_GEMM) flops += x.m.launches[i].flops;
    assert_int_equal(x.m.gemms, 5);
    assert_true(flops == 2.0 * (8 * 32 * 16 + 8 * 4 * 32 + 16 * 32 * 8 + 8 * 32 * 4 + 32 * 4 * 8));
    assert_int_equal(count_action(&x.m, COST_KERNEL), x.prog.nkernels);
    assert_int_equal(x.m.n, x.lp.nactions);
    release(&x);
}

/* An MLP layer h = gelu_tanh(x w1 + b1), y = h w2 + b2 ([8, 16] -> width
 * -> [8, 4]) in dtype d; trained (an mse loss and SGD) when train. */
static alloy_graph *gelu_mlp(const char *d, int width, bool train)
{
    char text[1536];
    snprintf(text, sizeof text,
             "graph gelu_mlp {\n"
             "  %%x = input : %s[8,16]\n"
             "  %%t = input : %s[8,4]\n"
             "  %%w1 = param {init=\"normal\", std=0.1} : %s[16,%d]\n"
             "  %%b1 = param {init=\"normal\", std=0.1} : %s[%d]\n"
             "  %%w2 = param {init=\"normal\", std=0.1} : %s[%d,4]\n"
             "  %%b2 = param {init=\"zeros\"} : %s[4]\n"
             "  %%p = matmul(%%x, %%w1) : %s[8,%d]\n"
             "  %%pre = add(%%p, %%b1) : %s[8,%d]\n"
             "  %%h = gelu_tanh(%%pre) : %s[8,%d]\n"
             "  %%q = matmul(%%h, %%w2) : %s[8,4]\n"
             "  %%y = add(%%q, %%b2) : %s[8,4]\n"
             "  %%e = mse_loss(%%y, %%t) : %s[8,4]\n"
             "  %%loss = reduce_mean(%%e) {axes=[0, 1]} : %s[]\n"
             "  output \"y\" = %%y\n"
             "  loss %%loss\n"
             "}\n",
             d, d, d, width, d, width, d, width, d, d, width, d, width, d, width, d, d, d, d);
    alloy_graph *g = parse(text);
    if (train) {
        assert_int_equal(alloy_graph_set_training(g, true), ALLOY_OK);
        assert_int_equal(alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0.0, 0.0, false)), ALLOY_OK);
    }
    return g;
}

/* The GEMM of x w1 in gelu_mlp's plan, and its launch in the model. */
static const cost_launch *first_gemm(const modelled *x, const lp_gemm **gm)
{
    for (int k = 0; k < x->lp.ngemms; k++)
        if (!strcmp(x->g->compiled->nodes[x->lp.gemms[k].node]->name ? x->g->compiled->nodes[x->lp.gemms[k].node]->name : "", "p"))
            *gm = &x->lp.gemms[k];
    assert_non_null(*gm);
    for (int q = 0; q < x->m.n; q++)
        if (x->m.launches[q].action == COST_GEMM && &x->lp.gemms[x->m.launches[q].index] == *gm) return &x->m.launches[q];
    fail_msg("no launch of the first GEMM");
    return NULL;
}

/* gelu_tanh after a linear layer is cuBLASLt's GELU epilogue in f32 and
 * bf16, by hand: the forward's x w1 + b1 -> GELU is one GEMM (GELU_BIAS)
 * and its step no kernel; it reads x, w1 and b1 and
 * writes h, with 2 x 8 x 32 x 16 + 256 (bias) + 256 (GELU) FLOPs. In
 * training the backward's gelu_tanh_grad reads the GELU's input too, so
 * the GEMM writes it beside h (GELU_AUX_BIAS, its row stride 32: a
 * multiple of 8): 2 x 8 x 32 elements written. f16 keeps its epilogue
 * kernel (the range rule: lp_library_epilogue), and so does an f32 width
 * of 36 in training (the input's rows 36 apart: cuBLASLt's AUX_LD must be
 * a multiple of 8; bf16 rows of 36 are padded to 64, which is); a forward
 * of width 36 stores no input and takes GELU_BIAS. */
static void test_a_linear_layer_and_gelu_tanh_are_one_gemm_with_the_gelu_epilogue(void **state)
{
    (void)state;
    static const char *const dtypes[] = {"f32", "bf16", "f16"};
    for (int i = 0; i < 3; i++)
        for (int train = 0; train < 2; train++)
            for (int width = 32; width <= 36; width += 4) {
                const char *d = dtypes[i];
                int64_t e = i == 0 ? 4 : 2;
                modelled x;
                model(&x, gelu_mlp(d, width, train), NULL);
                const lp_gemm *gm = NULL;
                const cost_launch *l = first_gemm(&x, &gm);
                /* the input's row stride: bf16 rows of 36 (72 bytes, feeding a GEMM) are padded to 64 (sched_pad) */
                int64_t ld = i == 1 && width == 36 ? 64 : width;
                bool epilogue = i < 2 && (!train || ld % 8 == 0), aux = epilogue && train;
                int own = 0; /* kernels of the GEMM's step: its epilogue kernel */
                for (int q = 0; q < x.prog.nkernels; q++) own += x.prog.kernels[q].step == gm->step;
                print_message("%s width %d%s: first GEMM epilogue %d, %d kernels of its step\n", d, width,
                              train ? " training" : "", gm->epilogue, own);
                if (!epilogue) {
                    assert_int_equal(gm->epilogue, LP_EPILOGUE_NONE);
                    assert_int_equal(gm->d, ALLOY_F32); /* the f32 product into the scratch for the kernel */
                    assert_int_equal(l->written, 8 * width * 4);
                    assert_int_equal(own, 1);
                    release(&x);
                    continue;
                }
                assert_int_equal(own, 0);
                assert_int_equal(gm->epilogue, aux ? LP_EPILOGUE_GELU_AUX_BIAS : LP_EPILOGUE_GELU_BIAS);
                assert_int_equal(gm->d, i == 0 ? ALLOY_F32 : ALLOY_BF16);
                assert_int_equal(gm->m, width); /* the bias and GELU run along D's m rows: the output's last dim */
                assert_int_equal(l->read, (8 * 16 + 16 * width + width) * e);
                assert_int_equal(l->written, (aux ? 2 : 1) * 8 * width * e);
                assert_true(l->flops == 2.0 * 8 * width * 16 + 2.0 * 8 * width);
                if (aux) {
                    assert_int_equal(gm->ld_aux, ld);
                    assert_int_equal(gm->ldd, ld);
                    assert_string_equal(x.g->compiled->nodes[gm->aux_node]->name, "pre");
                    assert_true(gm->aux.space == LP_ARENA);
                }
                release(&x);
            }
}

/* f16 attention on tensor cores, [1, 2, 128, 64] over 128 keys, causal: 2 B H
 * T S D / 2 FLOPs per QK^T-sized product; the forward 2 products and the
 * backward 5 (S, dP, dV, dK, dQ in its key kernel) when its o is the
 * forward's output (the forward keeps the logsumexp), 6 when o is another
 * value (the row pass recomputes the logsumexp). */
static void test_attention_is_counted_at_seven_products_with_the_kept_logsumexp(void **state)
{
    (void)state;
    static const char ir[] =
        "graph att {\n"
        "  %q = input : f16[1,2,128,64]\n"
        "  %k = input : f16[1,2,128,64]\n"
        "  %v = input : f16[1,2,128,64]\n"
        "  %o = input : f16[1,2,128,64]\n"
        "  %dy = input : f16[1,2,128,64]\n"
        "  %y = attention(%q, %k, %v) {causal=true, scale=0.125} : f16[1,2,128,64]\n"
        "  %g = attention_grad(%q, %k, %v, %y, %dy) {causal=true, scale=0.125} : f16[1,2,384,64]\n"
        "  %h = attention_grad(%q, %k, %v, %o, %dy) {causal=true, scale=0.125} : f16[1,2,384,64]\n"
        "  output \"y\" = %y\n"
        "  output \"g\" = %g\n"
        "  output \"h\" = %h\n"
        "}\n";
    modelled x;
    model(&x, parse(ir), NULL);
    const double product = 2.0 * 1 * 2 * 128 * 128 * 64 / 2;
    double by_node[3] = {0, 0, 0};
    int kernels[3] = {0, 0, 0};
    const ir_graph *c = x.g->compiled;
    for (int i = 0; i < x.m.n; i++) {
        const cost_launch *l = &x.m.launches[i];
        if (l->action != COST_KERNEL) continue;
        const ir_node *n = c->nodes[x.g->comp.sched.steps[l->step].pos];
        const char *name = n->name ? n->name : "";
        int at = strcmp(name, "y") == 0 ? 0 : strcmp(name, "g") == 0 ? 1 : strcmp(name, "h") == 0 ? 2 : -1;
        if (at < 0) continue;
        assert_true(l->tensor);
        by_node[at] += l->flops;
        kernels[at]++;
    }
    assert_int_equal(kernels[0], 1), assert_int_equal(kernels[1], 3), assert_int_equal(kernels[2], 3);
    assert_true(by_node[0] == 2 * product);
    assert_true(by_node[1] == 5 * product);
    assert_true(by_node[2] == 6 * product);
    release(&x);
}

/* One elementwise step, y = relu(a * b + c): reads a, b, c once, writes y once; 3 FLOPs per element. */
static void test_an_elementwise_kernel_moves_its_operands_once(void **state)
{
    (void)state;
    modelled x;
    const cost_launch *l = model_one_kernel(&x, "graph ew {\n"
                                                "  %a = input : f32[256,128]\n"
                                                "  %b = input : f32[256,128]\n"
                                                "  %c = input : f32[128]\n"
                                                "  %3 = mul(%a, %b) : f32[256,128]\n"
                                                "  %4 = add(%3, %c) : f32[256,128]\n"
                                                "  %5 = relu(%4) : f32[256,128]\n"
                                                "  output \"y\" = %5\n"
                                                "}\n");
    assert_int_equal(l->cls, COST_ELEMENTWISE);
    assert_int_equal(l->read, 2 * 256 * 128 * 4 + 128 * 4);
    assert_int_equal(l->written, 256 * 128 * 4);
    assert_true(l->flops == 3.0 * 256 * 128);
    release(&x);
}

/* A bias gradient by hand: relu's gradient of [2048, 300] (an elementwise
 * step) summed over its rows (reduce_sum over axis 0) and cast to f16.
 * Before: the elementwise kernel, the column kernel re-reading its result,
 * the `_final` kernel and the cast's, 4 launches. Now one: 2048 rows in 32
 * chunks of 64 (REDUCE_THREAD_MIN) over 2 groups of 256 columns, 64 blocks;
 * it reads a and b, writes the gradient, the sum and its cast, writes the
 * 32 x 300 f32 partials and reads them back, and counts on 2 counters. */
static void test_a_bias_gradient_and_its_cast_are_one_launch_by_hand(void **state)
{
    (void)state;
    modelled x;
    const cost_launch *l = model_one_kernel(&x, "graph bias_grad {\n"
                                                "  %a = input : f32[2048,300]\n"
                                                "  %b = input : f32[2048,300]\n"
                                                "  %2 = relu_grad(%a, %b) : f32[2048,300]\n"
                                                "  %3 = reduce_sum(%2) {axes=[0]} : f32[300]\n"
                                                "  %4 = cast(%3) : f16[300]\n"
                                                "  output \"dx\" = %2\n"
                                                "  output \"db\" = %4\n"
                                                "}\n");
    assert_int_equal(l->grid, 64);
    assert_int_equal(l->block, 256);
    assert_non_null(strstr(l->name, "_chain3_ew_reduce_sum"));
    assert_int_equal(l->read, 2 * 2048 * 300 * 4 + 32 * 300 * 4);
    assert_int_equal(l->written, 2048 * 300 * 4 + 300 * 4 + 300 * 2 + 32 * 300 * 4 + 2 * 4);
    release(&x);
}

/* A row step's column sum by hand: softmax over [4096, 96] and the sum
 * over its rows of its product with dy, one launch. 4096 rows in 512 warp
 * teams of 8 (CG_ROW_COLSUM_TEAM_ROWS), 4 to a block: 128 blocks of 128
 * threads, each writing one partial row of 96 f32; past 32 blocks they go
 * in 11 groups of 12 (ceil(sqrt(128)); the last of 8), whose last blocks
 * write a group row each: 139 rows written and read back, and 12 counters
 * (one a group, one for the last of them). The product is not stored. */
static void test_a_row_steps_column_sum_is_one_launch_by_hand(void **state)
{
    (void)state;
    modelled x;
    const cost_launch *l = model_one_kernel(&x, "graph row_colsum {\n"
                                                "  %x = input : f32[4096,96]\n"
                                                "  %dy = input : f32[4096,96]\n"
                                                "  %2 = softmax(%x) {axis=-1} : f32[4096,96]\n"
                                                "  %3 = mul(%2, %dy) : f32[4096,96]\n"
                                                "  %4 = reduce_sum(%3) {axes=[0]} : f32[96]\n"
                                                "  output \"s\" = %2\n"
                                                "  output \"c\" = %4\n"
                                                "}\n");
    assert_int_equal(l->cls, COST_ROW);
    assert_int_equal(l->grid, 128);
    assert_int_equal(l->block, 128);
    assert_non_null(strstr(l->name, "_row"));
    assert_int_equal(l->read, 2 * 4096 * 96 * 4 + 139 * 96 * 4);
    assert_int_equal(l->written, 4096 * 96 * 4 + 96 * 4 + 139 * 96 * 4 + 12 * 4);
    release(&x);
}

/* max(bytes / (hbm x eff), flops / rate, floor) + node, each end of the range by hand. */
static void test_the_time_of_a_launch_is_the_larger_of_its_bytes_flops_and_floor_plus_the_node(void **state)
{
    (void)state;
    cost_device d = {.name = "t", .title = "test", .hbm = 1e12, .eff_lo = 0.5, .eff_hi = 1.0,
                     .tensor_lo = 100e12, .tensor_hi = 200e12, .odd_lo = 10e12, .odd_hi = 20e12,
                     .f32_lo = 1e12, .f32_hi = 2e12, .attn_lo = 50e12, .attn_hi = 60e12,
                     .floor_lo = 2e-6, .floor_hi = 3e-6, .node_lo = 1e-6, .node_hi = 2e-6};
    double lo, hi;
    /* a kernel of 1e9 bytes: 1 ms at eff 1.0, 2 ms at 0.5 */
    cost_launch k = {.action = COST_KERNEL, .read = 600000000, .written = 300000000, .spill = 100000000};
    cost_time(&k, &d, &lo, &hi);
    assert_true(fabs(lo - (1e-3 + 1e-6)) < 1e-12 && fabs(hi - (2e-3 + 2e-6)) < 1e-12);
    /* a kernel of 3 blocks on 100 SMs: 3% of the bandwidth */
    d.sms = 100;
    cost_launch few = {.action = COST_KERNEL, .grid = 3, .read = 3000000};
    cost_time(&few, &d, &lo, &hi);
    assert_true(fabs(lo - (1e-4 + 1e-6)) < 1e-12 && fabs(hi - (2e-4 + 2e-6)) < 1e-12);
    cost_launch many = {.action = COST_KERNEL, .grid = 1000, .read = 3000000};
    cost_time(&many, &d, &lo, &hi);
    assert_true(fabs(lo - (3e-6 + 1e-6)) < 1e-12 && fabs(hi - (6e-6 + 2e-6)) < 1e-12);
    /* a tiny kernel: the floor */
    cost_launch t = {.action = COST_KERNEL, .read = 64};
    cost_time(&t, &d, &lo, &hi);
    assert_true(fabs(lo - 3e-6) < 1e-15 && fabs(hi - 5e-6) < 1e-15);
    /* a one-launch reduction of 1e6 bytes (1 us at eff 1.0, 2 us at 0.5): its last block's finish
     * waits for the rest, one more floor: max(1, 2) + 2 + 1 and max(2, 3) + 3 + 2 us */
    cost_launch r = {.action = COST_KERNEL, .grid = 1000, .read = 1000000, .finish = true};
    cost_time(&r, &d, &lo, &hi);
    assert_true(fabs(lo - 5e-6) < 1e-15 && fabs(hi - 8e-6) < 1e-15);
    /* an aligned f16 GEMM of 2e12 FLOPs: 10 ms at 200 TF/s, 20 ms at 100; its bytes are less */
    cost_launch g = {.action = COST_GEMM, .tensor = true, .flops = 2e12, .read = 1000};
    cost_time(&g, &d, &lo, &hi);
    assert_true(fabs(lo - (10e-3 + 1e-6)) < 1e-12 && fabs(hi - (20e-3 + 2e-6)) < 1e-12);
    /* the same with an odd leading dimension: 100 ms to 200 ms */
    g.odd = true;
    cost_time(&g, &d, &lo, &hi);
    assert_true(fabs(lo - (100e-3 + 1e-6)) < 1e-12 && fabs(hi - (200e-3 + 2e-6)) < 1e-12);
    /* a memset of 4 bytes: no kernel floor, the node alone (and 4 bytes) */
    cost_launch z = {.action = COST_MEMSET, .written = 4};
    cost_time(&z, &d, &lo, &hi);
    assert_true(fabs(lo - (1e-6 + 4e-12)) < 1e-15 && fabs(hi - (2e-6 + 8e-12)) < 1e-15);
    assert_non_null(cost_device_find("H100"));
    assert_non_null(cost_device_find("h200"));
    assert_null(cost_device_find("a100"));
}

/* The bytes of the char_gpt f16 training step, against a count of its own:
 * per schedule step, its inputs from outside read once and its stored
 * members written once (a slice reads only what it copies; embedding_grad of
 * a small table reads the ids once per table row); a gemm step's f32 product written by
 * the GEMM and read by its epilogue; then the aux block's flags and per-row
 * partials each kernel names (8 bytes each for an f64 node), the flags' memsets and the updates' copies
 * (read and written). */
/* examples/ir/char_gpt.ir as an f16 AMP training step: dynamic scaler, AdamW. */
static alloy_graph *char_gpt_f16_training(void)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/char_gpt.ir", ALLOY_EXAMPLES_IR);
    alloy_graph *g = alloy_graph_load_ir(path, err, sizeof err);
    if (!g) fail_msg("%s", err);
    assert_int_equal(alloy_graph_set_training(g, true), ALLOY_OK);
    assert_int_equal(alloy_graph_enable_amp(g, ALLOY_F16), ALLOY_OK);
    assert_int_equal(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), ALLOY_OK);
    assert_int_equal(alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01)), ALLOY_OK);
    return g;
}

/* One char_gpt f16 step's model (with cuda_gemm_f32 when widen) against its schedule. */
static void char_gpt_step(bool widen)
{
    alloy_graph *g = char_gpt_f16_training();
    /* each softmax's backward recomputes it, as a CUDA compile's does (remat.c; device=auto takes the CPU's choice) */
    assert_int_equal(alloy_graph_set_option(g, "remat", "always"), ALLOY_OK);
    modelled x;
    if (widen) model_widened(&x, g);
    else model(&x, g, NULL);
    const ir_graph *c = g->compiled;
    const schedule *s = &g->comp.sched;
    int64_t values = 0, aux = 0, actions = 0;
    int views = 0;
    int *owner = test_malloc(sizeof(int) * (size_t)c->nnodes);
    int64_t *off = test_malloc(sizeof(int64_t) * (size_t)c->nnodes);
    sched_views(c, s, owner, off);
    for (int k = 0; k < s->nsteps; k++) {
        const sched_step *st = &s->steps[k];
        const ir_node *head = c->nodes[s->members[st->first].node], *last = c->nodes[st->pos];
        if (s->members[st->first].flags & MEMBER_VIEW) { /* a view the plan aliases (or a concat owning its pieces): moves nothing */
            if (owner[st->pos] >= 0)
                assert_int_equal(g->comp.plan.offset[st->pos], g->comp.plan.offset[owner[st->pos]] + off[st->pos]);
            views++;
            continue;
        }
        for (int i = 0; i < st->nin; i++) {
            const ir_node *in = c->nodes[s->inputs[st->first_in + i]];
            int64_t b = (int64_t)ir_nbytes(&in->type);
            if (st->kind == STEP_KIND_OP && last->op == IR_OP_slice) b = (int64_t)ir_nbytes(&last->type);
            if (st->kind == STEP_KIND_OP && last->op == IR_OP_embedding_grad && in->id == last->in[0])
                b *= last->type.dims[0]; /* a small table: the ids once per table row */
            /* a row step of causal rows that needs nothing past them reads row i of [.., T, T] up to
             * column i: (T + 1) / 2T of each row-shaped input */
            if (st->kind == STEP_KIND_ROW && cg_row_read_share(c, s, k) < 1 && ir_numel(&in->type) == ir_numel(&st->space)) {
                double t = (double)st->space.dims[st->space.rank - 2];
                assert_int_equal(st->space.dims[st->space.rank - 1], st->space.dims[st->space.rank - 2]);
                b -= (int64_t)((double)b * (1 - (t + 1) / (2 * t)));
            }
            values += b;
        }
        for (int i = 0; i < st->n; i++)
            if (s->members[st->first + i].flags & MEMBER_STORED)
                values += (int64_t)ir_nbytes(&c->nodes[s->members[st->first + i].node]->type);
        lp_library lib; /* the f32 product written and read back, unless cuBLASLt computes the step whole */
        if (st->kind == STEP_KIND_GEMM && head->op == IR_OP_matmul && !lp_library_epilogue(c, s, k, widen ? LP_WIDEN : 0, &lib))
            values += 2 * 4 * ir_numel(&head->type);
    }
    for (int q = 0; q < x.prog.nkernels; q++) {
        bool counted = false; /* a one-launch reduction: its partials written, then read back by its last blocks */
        for (int i = 0; i < x.prog.kernels[q].nparams; i++) counted |= x.prog.kernels[q].params[i].kind == CG_PARAM_COUNTER;
        for (int i = 0; i < x.prog.kernels[q].nparams; i++) {
            const cg_param *pa = &x.prog.kernels[q].params[i];
            aux += pa->kind == CG_PARAM_FLAG ? 4
                   : pa->kind == CG_PARAM_ROWS ? (c->nodes[pa->node]->type.dtype == ALLOY_F64 ? 8 : 4) * pa->count *
                                                     (counted && pa->written ? 2 : 1)
                   : pa->kind == CG_PARAM_KEPT || pa->kind == CG_PARAM_COUNTER ? 4 * pa->count
                                                                                  : 0;
        }
    }
    for (int i = 0; i < x.lp.ngemms; i++) /* a pointer-array GEMM reads its arrays of matrix addresses */
        if (x.lp.gemms[i].pointers) aux += 3 * 8 * x.lp.gemms[i].batch;
    for (int i = 0; i < x.lp.nactions; i++)
        if (x.lp.actions[i].kind == LP_ZERO || x.lp.actions[i].kind == LP_COPY)
            actions += x.lp.actions[i].bytes * (x.lp.actions[i].kind == LP_COPY ? 2 : 1);
    /* a chain kernel (emit_chain.c) runs several scalar steps in one launch: each value it reads
     * is one parameter, read once, and a value one of its steps computes for another is not read
     * back at all, where the schedule counts a read per step */
    int64_t chained = 0;
    for (int q = 0; q < x.prog.nkernels; q++) {
        const cg_kernel *kn = &x.prog.kernels[q];
        if (!strstr(kn->name, "_chain")) continue;
        int end = kn->step; /* past the kernel's steps: cg_chain_steps of them that are not views */
        for (int left = cg_chain_steps(kn); end < s->nsteps && left > 0; end++)
            left -= !(s->members[s->steps[end].first].flags & MEMBER_VIEW);
        for (int i = 0; i < kn->nparams; i++) {
            int node = kn->params[i].node, readers = 0;
            for (int k = kn->step; k < end; k++)
                for (int j = 0; j < s->steps[k].nin; j++) readers += s->inputs[s->steps[k].first_in + j] == node;
            chained += (readers - (kn->params[i].written ? 0 : 1)) * (int64_t)ir_nbytes(&c->nodes[node]->type);
        }
    }
    int64_t got = 0;
    int finishing = 0, counters = 0; /* every one-launch reduction, and nothing else, pays its finish */
    for (int i = 0; i < x.m.n; i++) got += x.m.launches[i].read + x.m.launches[i].written, finishing += x.m.launches[i].finish;
    for (int q = 0; q < x.prog.nkernels; q++)
        for (int i = 0; i < x.prog.kernels[q].nparams; i++) counters += x.prog.kernels[q].params[i].kind == CG_PARAM_COUNTER;
    assert_true(counters > 0);
    assert_int_equal(finishing, counters);
    print_message("char_gpt f16 step%s: %d launches, model %lld bytes; schedule: values %lld, aux %lld, memsets and "
                  "copies %lld; %d views\n", widen ? " (cuda_gemm_f32)" : "", x.m.n, (long long)got, (long long)values,
                  (long long)aux, (long long)actions, views);
    assert_int_equal(got, values + aux + actions - chained);
    /* the exact figures of this step: its 18 reshapes are views (a copy
     * kernel each, they were 227 launches and 341345899 bytes) and each
     * layer's dq, dk, dv one concat (three pads and two adds, they were 209
     * launches and 320374379 bytes), and its 4 linear layers with a bias
     * alone after the GEMM take cuBLASLt's bias epilogue (an epilogue
     * kernel each, reading back the f32 product, they were 203 launches
     * and 301500011 bytes), 12 of its 13 casts of f32 weights to f16
     * are one multi-tensor launch at the start (the head's, whose rows the
     * plan pads, stays a cast kernel that writes them), the gradient norm's squares are
     * summed by the unscale + found_inf launch, whose last kernel also
     * writes found_inf (they were 187 launches, 272139883 bytes), the 36
     * one-block kernels of its scalar tail (the scaler's and clipping's
     * bookkeeping, the bias corrections) run as chain kernels (of at most 24
     * kernels each), each row step's column sums in its row kernel (below);
     * its 20 other gemm steps, an f16 product cast to f32, are cuBLASLt
     * writing the f32 sum whose readers apply the range rule as they load
     * it (an epilogue kernel each, they were 144 launches and 264150460
     * bytes; the option cuda_gemm_f32 gives the same figures:
     * test_a_product_widened_for_readers_that_apply_the_range_rule_has_no_epilogue_kernel), and
     * each softmax's backward recomputes the softmax from the f16 scores
     * (passes/remat.c): the forward writes no f32 softmax (4 bytes) and the
     * backward reads 2 bytes for its 4, 6 bytes an element of 2 layers'
     * [32, 4, 64, 64] fewer (6291456 bytes), and its 4 split reductions
     * (bias gradients) finish in their own launch, the last block adding
     * the partials it counted done (4 launches fewer, the partials still
     * written and read once, 32 bytes of block counters more: they were
     * 144 and 124 launches, 264150460 and 233663932 bytes), and the 2 of
     * them whose operand the elementwise step before computes (the MLP's
     * first bias, [2048, 512] f16 through the GELU's gradient) are summed
     * by that step's kernel, which does not read the operand back (2
     * launches and 4194304 bytes fewer: they were 140 and 120 launches,
     * 264150492 and 233663964 bytes), and the unscale + found_inf launch
     * writes no unscaled gradient: AdamW's launch unscales as it reads the
     * scaled ones (passes/remat.c; 1690620 bytes fewer, nearly 4 bytes for
     * each of the 424448 parameters; the f16 bias sums' f32 casts are still
     * written), and the 5 row steps with column sums (14 sums of 128
     * columns over 2048 rows) add them in the row kernel's launch: each of
     * its 64 blocks (4 warp teams of 8 rows) writes one partial row per sum
     * (no longer each of 256 teams), and the last block of each of 8
     * groups of 8 adds its group's rows into a group row, the last of
     * those the 8 group rows: 72 rows of 512 bytes written and read back
     * per sum, 73728 bytes, where 256 were written and read by the
     * combine kernel, 262144, and a counter word per group and one more
     * per step, 36 bytes (5 launches and 14 * 188416 - 5 * 36 = 2637644
     * bytes fewer: they were 138 and 118 launches, 258265568 and
     * 227779040 bytes), and the 4 layer_norm backwards whose dx the next
     * GEMM reads in f16 store that cast from their row kernel
     * (the union of passes/fuse.c): 4 cast kernels fewer, each of which read the
     * [2048, 128] f32 dx back (4 bytes an element) and wrote the f16 copy
     * (2) that the row kernel now writes itself: 4 x 2048 x 128 x 4 =
     * 4194304 bytes fewer (they were 113 launches and 225141396 bytes),
     * and the batched products of its written-out attention read k and v
     * out of the qkv projection and write p v, dv and dk in their
     * transposes' order through arrays of pointers, q's scale reads q out
     * of it too and dq's scale writes dq in its transpose's order, each of
     * dq, dk, dv straight into its columns of their concat
     * (step/attn_views.c): per layer the slices and transposes of q, k and
     * v, the output's transpose, dO's, dq's, dv's and dk's are views, 11
     * copy kernels of a [32, 4, 64, 32] f16 value (524288 bytes read and
     * written each), the concat no kernel (it read 3 x 524288 bytes and
     * wrote 1572864), and 6 GEMMs read their 3 arrays of 128 addresses
     * (3072 bytes): 24 launches and 2 x (11 x 1048576 + 3145728 - 6 x
     * 3072) = 29323264 bytes fewer (they were 18 views, 109 launches and
     * 220947092 bytes); and the softmax rows are causal (docs/fusion.md,
     * "Causal rows"): each layer's forward row step reads its f16 scores
     * and the backward's its f16 scores and f32 dP only up to each row's
     * diagonal, 65 / 128 of [32, 4, 64, 64]: 2 x (1 + 1 + 2) MiB x 63 / 128
     * = 4128768 bytes fewer */
    test_free(owner), test_free(off);
    assert_int_equal(views, 42);
    assert_int_equal(x.m.n, 85); /* cuda_gemm_f32 or not: every widened product's readers apply the rule */
    assert_int_equal(got, 187495060);
    assert_true(aux < got / 50 && actions < got / 1000); /* the values are nearly all of it */
    assert_int_equal(x.m.n, x.lp.nactions);
    assert_int_equal(x.m.kernels, x.prog.nkernels);
    release(&x);
}

static void test_a_char_gpt_step_moves_what_its_schedule_says(void **state)
{
    (void)state;
    char_gpt_step(false);
    char_gpt_step(true);
}

static const char amp_mlp_ir[] =
    "graph mlp {\n"
    "  %x = input : f32[4,8]\n"
    "  %targets = input : i32[4]\n"
    "  %w1 = param {init=\"normal\", std=0.1} : f32[8,16]\n"
    "  %b1 = param {init=\"zeros\"} : f32[16]\n"
    "  %w2 = param {init=\"normal\", std=0.1} : f32[16,3]\n"
    "  %b2 = param {init=\"zeros\"} : f32[3]\n"
    "  %mm1 = matmul(%x, %w1) : f32[4,16]\n"
    "  %pre = add(%mm1, %b1) : f32[4,16]\n"
    "  %h = gelu_tanh(%pre) : f32[4,16]\n"
    "  %mm2 = matmul(%h, %w2) : f32[4,3]\n"
    "  %logits = add(%mm2, %b2) : f32[4,3]\n"
    "  %loss = cross_entropy(%logits, %targets) : f32[]\n"
    "  output \"loss\" = %loss\n"
    "  loss %loss\n"
    "}\n";

/* What a step of the compiled graph holds. */
typedef struct step_census {
    int param_casts; /* casts of a param */
    bool norm, found_inf, update; /* a sum_squares; a found_inf; a param's update */
} step_census;

static step_census census(const ir_graph *c, const schedule *s, int k)
{
    step_census z = {0};
    for (int m = s->steps[k].first; m < s->steps[k].first + s->steps[k].n; m++) {
        const ir_node *n = c->nodes[s->members[m].node];
        z.param_casts += n->op == IR_OP_cast && c->nodes[n->in[0]]->op == IR_OP_param;
        z.norm |= n->op == IR_OP_sum_squares;
        z.found_inf |= n->op == IR_OP_found_inf;
        for (int u = 0; u < c->nupdates; u++)
            z.update |= c->updates[u].node == n->id && c->nodes[ir_find_name(c, c->updates[u].name)]->op == IR_OP_param;
    }
    return z;
}

/* Per kind of step (param casts, norm, found_inf, update): how many steps and launches. */
typedef struct step_launches {
    int cast_steps, casts, cast_launches;
    int norm_steps, norm_launches, found_inf_steps, found_inf_launches, update_steps, update_launches;
    bool norm_with_found_inf;
} step_launches;

static step_launches count_step_launches(const modelled *x)
{
    const ir_graph *c = x->g->compiled;
    const schedule *s = &x->g->comp.sched;
    step_launches r = {0};
    for (int k = 0; k < s->nsteps; k++) {
        step_census z = census(c, s, k);
        int n = 0;
        for (int i = 0; i < x->m.n; i++) n += x->m.launches[i].step == k;
        if (z.param_casts) r.cast_steps++, r.casts += z.param_casts, r.cast_launches += n;
        if (z.norm) r.norm_steps++, r.norm_launches += n;
        if (z.found_inf) r.found_inf_steps++, r.found_inf_launches += n;
        if (z.update) r.update_steps++, r.update_launches += n;
        r.norm_with_found_inf |= z.norm && z.found_inf;
    }
    return r;
}

/* A small AMP f16 step (dynamic scaler, AdamW), by hand: its three f16
 * working copies (w1, b1, w2; b2 is added in f32) are one launch; the
 * unscale of the four gradients, their inf/NaN check and their sums of
 * squares one multi kernel, with the flag's memset before it and the final
 * kernel (the norm in f64, found_inf's bool) after: 3 launches, and no other
 * step reads the gradients for the norm; the AdamW update of all four one
 * launch. With the multi-tensor groups off: a launch per cast and per update,
 * the norm's own two kernels apart from found_inf's. */
static void test_an_amp_step_casts_in_one_launch_and_unscales_checks_and_norms_in_one_pass(void **state)
{
    (void)state;
    for (int fused = 1; fused >= 0; fused--) {
        alloy_graph *g = parse(amp_mlp_ir);
        assert_int_equal(alloy_graph_set_training(g, true), ALLOY_OK);
        assert_int_equal(alloy_graph_enable_amp(g, ALLOY_F16), ALLOY_OK);
        assert_int_equal(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), ALLOY_OK);
        assert_int_equal(alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01)), ALLOY_OK);
        /* the working copies kept from the forward for the backward, as a CUDA compile keeps them (remat.c) */
        assert_int_equal(alloy_graph_set_option(g, "remat", "always"), ALLOY_OK);
        if (!fused) assert_int_equal(alloy_graph_set_option(g, "no_fuse", "multi"), ALLOY_OK);
        modelled x;
        model(&x, g, NULL);
        step_launches r = count_step_launches(&x);
        print_message("%s: casts %d in %d steps, %d launches; norm %d steps, %d launches (with found_inf: %d); "
                      "found_inf %d launches; updates %d steps, %d launches\n",
                      fused ? "multi-tensor" : "no_fuse=multi", r.casts, r.cast_steps, r.cast_launches, r.norm_steps,
                      r.norm_launches, r.norm_with_found_inf, r.found_inf_launches, r.update_steps, r.update_launches);
        assert_int_equal(r.casts, 3);
        assert_int_equal(r.norm_steps, 1);
        assert_int_equal(r.found_inf_steps, 1);
        if (fused) {
            assert_int_equal(r.cast_steps, 1);
            assert_int_equal(r.cast_launches, 1);
            assert_true(r.norm_with_found_inf);
            assert_int_equal(r.found_inf_launches, 3);
            assert_int_equal(r.update_steps, 1);
            assert_int_equal(r.update_launches, 1);
        } else {
            assert_int_equal(r.cast_steps, 3);
            assert_int_equal(r.cast_launches, 3);
            assert_false(r.norm_with_found_inf);
            assert_int_equal(r.norm_launches, 2);
            assert_int_equal(r.update_steps, 4);
            assert_int_equal(r.update_launches, 4);
        }
        release(&x);
    }
}

static const char canned_log[] =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'alloy_s3_row' for 'sm_90'\n"
    "ptxas info    : Function properties for alloy_s3_row\n"
    "ptxas         .     624 bytes stack frame, 1216 bytes spill stores, 1692 bytes spill loads\n"
    "ptxas info    : Used 255 registers, used 1 barriers, 624 bytes cumulative stack size, 4096 bytes smem\n"
    "ptxas info    : Compiling entry function 'alloy_s4_ew' for 'sm_90'\n"
    "ptxas info    : Function properties for alloy_s4_ew\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 18 registers\n"
    "ptxas info    : Compile time = 29.468 ms\n";

static void test_ptxas_lines_give_each_kernels_registers_spills_and_shared_memory(void **state)
{
    (void)state;
    cg_resources r;
    assert_true(cg_ptxas_parse(canned_log, "alloy_s3_row", &r));
    assert_int_equal(r.registers, 255);
    assert_int_equal(r.stack, 624);
    assert_int_equal(r.spill_stores, 1216);
    assert_int_equal(r.spill_loads, 1692);
    assert_int_equal(r.shared, 4096);
    assert_true(cg_ptxas_parse(canned_log, "alloy_s4_ew", &r));
    assert_int_equal(r.registers, 18);
    assert_int_equal(r.spill_stores + r.spill_loads + r.stack + r.shared, 0);
    assert_false(cg_ptxas_parse(canned_log, "alloy_s4", &r)); /* a prefix is not a kernel */
    assert_false(r.known);
    assert_false(cg_ptxas_parse("ptxas info : Compiling entry function 'k' for 'sm_90'\n", "k", &r));
    assert_false(cg_ptxas_parse(NULL, "k", &r));
}

/* A real NVRTC compile of the MLP's two epilogue kernels with ptxas' report, once cold and once from the cache. */
static void test_nvrtc_reports_the_resources_of_every_kernel(void **state)
{
    (void)state;
    cg_nvrtc *nv;
    char why[512];
    if (cg_nvrtc_open(NULL, &nv, why, sizeof why) != ALLOY_OK) {
        print_message("skipped, no NVRTC: %s\n", why);
        skip();
    }
    modelled x;
    model(&x, parse(mlp_ir), NULL);
    cg_resources res[1];
    cg_cache *cache;
    char err[1024];
    assert_int_equal(cg_cache_open(NULL, 1 << 20, 0, &cache, err, sizeof err), ALLOY_OK);
    for (int round = 0; round < 2; round++) {
        if (cg_ptxas_resources(nv, cache, &x.prog, 90, 1, res, err, sizeof err)) fail_msg("%s", err);
        assert_int_equal(x.prog.nkernels, 1); /* the second layer's bias is cuBLASLt's */
        for (int q = 0; q < 1; q++) {
            assert_true(res[q].known);
            assert_true(res[q].registers > 0 && res[q].registers <= 255);
            assert_int_equal(res[q].spill_stores + res[q].spill_loads, 0);
        }
    }
    cg_cache_stats st = cg_cache_get_stats(cache);
    assert_int_equal(st.hits, 1); /* the second pass read the log from the cache */
    cg_cache_close(cache);
    cost_free(&x.m);
    char e2[1024];
    if (cost_build(x.g->compiled, &x.g->comp.sched, &x.prog, &x.lp, res, &x.m, e2, sizeof e2)) fail_msg("%s", e2);
    assert_int_equal(x.m.resources_known, 1);
    assert_int_equal(x.m.spill_kernels, 0);
    release(&x);
    cg_nvrtc_close(nv);
}

/* Spills move (stores + loads) x threads x rows per team of local memory. */
static void test_a_spilling_kernel_is_charged_its_local_traffic(void **state)
{
    (void)state;
    modelled x;
    model(&x, parse(mlp_ir), NULL);
    cg_resources res[2] = {{.known = true, .registers = 255, .spill_stores = 100, .spill_loads = 28}, {0}};
    cost_free(&x.m);
    char err[512];
    if (cost_build(x.g->compiled, &x.g->comp.sched, &x.prog, &x.lp, res, &x.m, err, sizeof err)) fail_msg("%s", err);
    const cost_launch *l = &x.m.launches[1];
    assert_int_equal(l->spill, 128 * (int64_t)l->grid * l->block);
    assert_int_equal(x.m.spill_kernels, 1);
    assert_int_equal(x.m.launches[3].spill, 0);
    release(&x);
}

static const char profile[] =
    "# profile: graph 'g', run 3 on GPU: 5 launches, 1000.00 us (events)\n"
    "#   idx  step kind   action     time_us        bytes      GB/s  TFLOP/s  name\n"
    "#     0     0 gemm   gemm         100.00    100000000   1000.00  600.000  gemm.4096x4096x4096.f16\n"
    "#     1     0 gemm   kernel        50.00    134217728   2684.35        -  alloy_s0_gemm\n"
    "#     2     1 gemm   gemm         400.00    100000000    250.00  250.000  gemm.8192x50257x768.f16\n"
    "#     3     1 ew     kernel         3.00         4096      1.37        -  alloy_s1_ew\n"
    "#     4    -1 update copy          40.00    100663296   2516.58        -  copy\n"
    "# total by action: gemm 2 x 500.00 us (50%)\n";

static void test_calibration_fits_efficiency_gemm_rates_and_floor_to_a_profile(void **state)
{
    (void)state;
    const cost_device *h100 = cost_device_find("h100");
    cost_device d;
    cost_fit fit;
    char err[256];
    assert_int_equal(cost_calibrate(profile, h100, NULL, &d, &fit, err, sizeof err), ALLOY_OK);
    assert_int_equal(fit.rows, 5);
    assert_int_equal(fit.bw_rows, 2);
    assert_int_equal(fit.gemm_rows, 1);
    assert_int_equal(fit.odd_rows, 1);
    assert_int_equal(fit.floor_rows, 1);
    /* efficiency: 100663296 B in 40 us and 134217728 B in 50 us over 3.35 TB/s */
    assert_true(fabs(d.eff_lo - 100663296 / 40e-6 / 3.35e12) < 1e-12 && fabs(d.eff_hi - 134217728 / 50e-6 / 3.35e12) < 1e-12);
    assert_true(d.tensor_lo == 600e12 && d.tensor_hi == 600e12);
    assert_true(d.odd_lo == 250e12 && d.odd_hi == 250e12);
    assert_true(fabs(d.floor_lo - 3e-6) < 1e-15 && fabs(d.floor_hi - 3e-6) < 1e-15);
    assert_true(d.node_lo == h100->node_lo && d.f32_lo == h100->f32_lo); /* not in the profile: kept */
    /* a kernel the model knows by name: its bytes are the model's (32 MiB in 20 us), not the profile's 4096 */
    cost_launch big = {.action = COST_KERNEL, .read = 16 << 20, .written = 16 << 20};
    snprintf(big.name, sizeof big.name, "alloy_s7_row");
    cost_model m = {.launches = &big, .n = 1};
    static const char row[] = "#     0     7 row    kernel        20.00         4096      0.20        -  alloy_s7_row\n";
    assert_int_equal(cost_calibrate(row, h100, &m, &d, &fit, err, sizeof err), ALLOY_OK);
    assert_int_equal(fit.matched, 1);
    assert_int_equal(fit.bw_rows, 1);
    assert_int_equal(fit.floor_rows, 0);
    assert_true(fabs(d.eff_lo - (32 << 20) / 20e-6 / 3.35e12) < 1e-12 && d.eff_hi == d.eff_lo);
    assert_int_equal(cost_calibrate("no table here\n", h100, NULL, &d, &fit, err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "no profile rows"));
}

/* The public call: totals, a report, and its errors. */
static void test_alloy_graph_cost_reports_totals_and_names_bad_options(void **state)
{
    (void)state;
    alloy_graph *g = parse(mlp_ir);
    alloy_cost_totals t;
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    assert_non_null(out);
    assert_int_equal(alloy_graph_cost(g, NULL, &t, out), ALLOY_OK);
    fclose(out);
    assert_int_equal(t.launches, 3);
    assert_int_equal(t.kernels, 1);
    assert_int_equal(t.gemms, 2);
    assert_int_equal(t.tiny_kernels, 1);
    assert_int_equal(t.spill_kernels, -1);
    assert_true(t.flops == 8192.0 + 512 + 2048 + 32);
    assert_true(t.ms_low > 0 && t.ms_low < t.ms_high);
    assert_non_null(strstr(buf, "modelled, not measured"));
    assert_non_null(strstr(buf, "gemm.8x32x16.f32"));
    free(buf);
    alloy_cost_options o = {.device = "a100"};
    assert_int_equal(alloy_graph_cost(g, &o, &t, NULL), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "no device table 'a100'"));
    o = (alloy_cost_options){.arch = "sm_80,sm_90"};
    assert_int_equal(alloy_graph_cost(g, &o, &t, NULL), ALLOY_ERR_INVALID);
    o = (alloy_cost_options){.calibrate = "/nonexistent/profile.txt"};
    assert_int_equal(alloy_graph_cost(g, &o, &t, NULL), ALLOY_ERR_IO);
    assert_non_null(strstr(alloy_last_error(g), "/nonexistent/profile.txt"));
    alloy_graph_free(g);
    assert_int_equal(alloy_graph_cost(NULL, NULL, &t, NULL), ALLOY_ERR_INVALID);
    /* with amp_check the kernels carry the checks' flags (CG_PARAM_CHECKS, a parameter of no node, which the
     * model indexed g->nodes with, -1, before it looked at the kind): both GEMMs' epilogues are
     * kernels that check what they store (the second no longer cuBLASLt's bias epilogue), and a memset clears
     * the flags first */
    g = parse(mlp_ir);
    assert_int_equal(alloy_graph_set_option(g, "amp_check", "1"), ALLOY_OK);
    assert_int_equal(alloy_graph_cost(g, NULL, &t, NULL), ALLOY_OK);
    assert_int_equal(t.gemms, 2);
    assert_int_equal(t.kernels, 2);
    assert_int_equal(t.launches, 5);
    alloy_graph_free(g);
}

/* char_gpt's f16 training step with the option device=dev (set through the API, so it wins over the
 * suites' ALLOY_DEVICE=cpu) modelled by alloy_graph_cost into *t; whether the graph is left compiled. */
static bool char_gpt_cost(const char *dev, alloy_cost_totals *t)
{
    alloy_graph *g = char_gpt_f16_training();
    assert_int_equal(alloy_graph_set_option(g, "device", dev), ALLOY_OK);
    assert_int_equal(alloy_graph_cost(g, NULL, t, NULL), ALLOY_OK);
    bool compiled = g->compiled != NULL;
    alloy_graph_free(g);
    return compiled;
}

/* alloy_graph_cost models the GPU step: with device=auto on a machine without a GPU it compiles as
 * device=cuda does (the attention rewrite, every softmax recomputed), not the CPU's plan, and drops
 * that compile after, so a run compiles for its own device. */
static void test_the_cost_of_a_step_on_device_auto_is_the_gpu_plan(void **state)
{
    (void)state;
    alloy_cost_totals as_auto, as_cuda, as_cpu;
    assert_false(char_gpt_cost("auto", &as_auto));
    char_gpt_cost("cuda", &as_cuda);
    char_gpt_cost("cpu", &as_cpu);
    print_message("char_gpt f16 step: auto %d launches, %.0f bytes; cuda %d, %.0f; cpu %d, %.0f\n", as_auto.launches,
                  as_auto.bytes, as_cuda.launches, as_cuda.bytes, as_cpu.launches, as_cpu.bytes);
    assert_int_equal(as_auto.launches, as_cuda.launches);
    assert_true(as_auto.bytes == as_cuda.bytes && as_auto.flops == as_cuda.flops);
    assert_true(as_cpu.launches != as_cuda.launches || as_cpu.bytes != as_cuda.bytes);
}

/* Each allocation of alloy_graph_cost (emit, launch plan, model, report) failed in turn: out of memory (or,
 * where the emitter falls back, the same totals), no leak; until a call makes fewer allocations than the one
 * failed. */
static void test_every_allocation_failure_of_the_cost_model_is_a_clean_error(void **state)
{
    (void)state;
    alloy_graph *g = parse(mlp_ir);
    assert_int_equal(graph_compile_ir(g), ALLOY_OK);
    FILE *sink = fopen("/dev/null", "w");
    assert_non_null(sink);
    int failures = 0, calls = 0;
    alloy_cost_totals t;
    for (test_fail_at = 0;; test_fail_at++) {
        test_alloc_count = 0;
        alloy_set_allocator(test_failing_realloc, NULL);
        alloy_status st = alloy_graph_cost(g, NULL, &t, sink);
        alloy_set_allocator(test_cmocka_realloc, NULL);
        calls++;
        if (test_alloc_count <= test_fail_at) { /* nothing failed: the whole call */
            assert_int_equal(st, ALLOY_OK);
            break;
        }
        if (st == ALLOY_OK) {
            assert_int_equal(t.launches, 3);
            continue;
        }
        assert_int_equal(st, ALLOY_ERR_OOM);
        assert_non_null(strstr(alloy_last_error(g), "out of memory"));
        failures++;
    }
    test_fail_at = -1;
    fclose(sink);
    print_message("%d allocations, %d failed calls with out of memory\n", calls - 1, failures);
    assert_true(failures >= 5);
    assert_int_equal(t.launches, 3);
    alloy_graph_free(g);
}

/* alloyc cost on tests/data/mlp2.ir: the same counts, and a usage error for an unknown table. */
static void test_alloyc_cost_prints_the_model_of_an_ir_file(void **state)
{
    (void)state;
    char cmd[1024], line[512];
    snprintf(cmd, sizeof cmd, "'%s' cost '%s/mlp2.ir' --device h200 --all 2>&1", ALLOY_ALLOYC, ALLOY_TEST_DATA);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    bool launches = false, h200 = false, every = false;
    while (fgets(line, sizeof line, p)) {
        launches |= strstr(line, "launches       3: 1 kernels (1 of <= 4 blocks), 2 GEMMs, 0 memsets, 0 copies") != NULL;
        h200 |= strstr(line, "H200 SXM") != NULL;
        every |= strstr(line, "every launch") != NULL;
    }
    assert_int_equal(pclose(p), 0);
    assert_true(launches && h200 && every);
    snprintf(cmd, sizeof cmd, "'%s' cost '%s/mlp2.ir' --device a100 2>/dev/null", ALLOY_ALLOYC, ALLOY_TEST_DATA);
    int rc = system(cmd);
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
}

/* A reshape of a computed value is a view: no launch and no bytes, its
 * value at its operand's slot, and that slot lives until the view's last
 * use. Unfused: exp, neg and sub are one kernel each, of 1024 B per value
 * read or written (exp and neg 2048 B, sub 3072 B); neg may not write over exp's slot, which the view r
 * still reads at sub (y = e - (-e) would be 0), and sub takes it instead.
 * The CPU's run gives y = 2 e^x. */
static void test_a_reshape_is_a_view_with_no_launch_and_the_same_result(void **state)
{
    (void)state;
    static const char views_ir[] =
        "graph views {\n"
        "  %x = input : f32[2,128]\n"
        "  %a = exp(%x) : f32[2,128]\n"
        "  %r = reshape(%a) : f32[256]\n"
        "  %b = neg(%a) : f32[2,128]\n"
        "  %c = reshape(%b) : f32[256]\n"
        "  %y = sub(%r, %c) : f32[256]\n"
        "  output \"y\" = %y\n"
        "}\n";
    modelled x;
    model_unfused(&x, views_ir, 3); /* exp, neg, sub */
    alloy_graph *g = x.g;
    const ir_graph *c = g->compiled;
    const mem_plan *p = &g->comp.plan;
    int a = ir_find_name(c, "a"), r = ir_find_name(c, "r"), b = ir_find_name(c, "b"), cc = ir_find_name(c, "c"),
        y = ir_find_name(c, "y");
    assert_true(a >= 0 && r >= 0 && b >= 0 && cc >= 0 && y >= 0);
    assert_int_equal(bytes_moved(&x), 2048 + 2048 + 3072);
    assert_int_equal(p->views, 2);
    assert_non_null(p->view_of);
    assert_int_equal(p->view_of[r], a);
    assert_int_equal(p->view_of[cc], b);
    assert_int_equal(p->view_of[a], -1);
    assert_int_equal(p->offset[r], p->offset[a]);
    assert_int_equal(p->offset[cc], p->offset[b]);
    assert_int_not_equal(p->offset[b], p->offset[a]);
    assert_int_equal(p->offset[y], p->offset[a]); /* in place over the view's slot, its last use */
    assert_int_equal(p->bytes_by_dtype[ALLOY_F32], 3 * 1024);
    float xs[256];
    for (int i = 0; i < 256; i++) xs[i] = (float)(i - 128) / 32.0f;
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {2, 128}, xs}, fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_OK);
    assert_int_equal(fetch.rank, 1);
    assert_int_equal(fetch.dims[0], 256);
    const float *ys = fetch.data;
    for (int i = 0; i < 256; i++) {
        double want = 2.0 * exp((double)xs[i]);
        if (fabs(ys[i] - want) > 1e-6 * want) fail_msg("y[%d] = %.9g, 2 e^x = %.9g", i, (double)ys[i], want);
    }
    release(&x);
}

/* A slice cutting one byte range out of a computed value is a view at
 * that range: a = exp(x) f32[4,64] (256 B a row); s = rows 1..3 of a is a
 * view 256 B into a's slot, and t = reshape(s) one too (a view of a view).
 * u = columns 0..32 of a (each row's half: not one range) and z = t[1..65]
 * (4 B in: not 16-byte aligned) stay copies. Unfused, the kernels are exp
 * (2048 B), u (1024 B: the slice reads what it copies), z (512 B) and sub
 * (1536 B). y[k] = a[1 + k/64, k%64] - a[k/32, k%32] and
 * z[k] = a[1 + (k+1)/64, (k+1)%64] from the CPU, against fp64. */
static void test_a_contiguous_slice_is_a_view_at_its_byte_offset(void **state)
{
    (void)state;
    static const char slices_ir[] =
        "graph slices {\n"
        "  %x = input : f32[4,64]\n"
        "  %a = exp(%x) : f32[4,64]\n"
        "  %s = slice(%a) {axis=0, start=1, end=3} : f32[2,64]\n"
        "  %t = reshape(%s) : f32[128]\n"
        "  %u = slice(%a) {axis=1, start=0, end=32} : f32[4,32]\n"
        "  %v = reshape(%u) : f32[128]\n"
        "  %z = slice(%t) {axis=0, start=1, end=65} : f32[64]\n"
        "  %y = sub(%t, %v) : f32[128]\n"
        "  output \"y\" = %y\n"
        "  output \"z\" = %z\n"
        "}\n";
    modelled x;
    model_unfused(&x, slices_ir, 4); /* exp, the copies u and z, sub */
    alloy_graph *g = x.g;
    const ir_graph *c = g->compiled;
    const mem_plan *p = &g->comp.plan;
    int a = ir_find_name(c, "a"), sv = ir_find_name(c, "s"), t = ir_find_name(c, "t"), u = ir_find_name(c, "u"),
        v = ir_find_name(c, "v"), z = ir_find_name(c, "z"), y = ir_find_name(c, "y");
    assert_true(a >= 0 && sv >= 0 && t >= 0 && u >= 0 && v >= 0 && z >= 0 && y >= 0);
    assert_int_equal(bytes_moved(&x), 2048 + 1024 + 512 + 1536);
    assert_int_equal(p->views, 3); /* s, t, v */
    assert_non_null(p->view_of);
    assert_int_equal(p->view_of[sv], a);
    assert_int_equal(p->view_of[t], a);
    assert_int_equal(p->view_of[v], u);
    assert_int_equal(p->view_of[u], -1);
    assert_int_equal(p->view_of[z], -1);
    assert_int_equal(p->offset[sv], p->offset[a] + 256);
    assert_int_equal(p->offset[t], p->offset[a] + 256);
    assert_int_equal(p->offset[v], p->offset[u]);
    char want[64], line[128];
    snprintf(want, sizeof want, "# view %%%d of %%%d @%lld +256\n", t, a, (long long)p->offset[a]);
    FILE *f = tmpfile();
    assert_non_null(f);
    plan_print(c, p, true, f);
    rewind(f);
    bool printed = false;
    while (fgets(line, sizeof line, f)) printed |= strcmp(line, want) == 0;
    fclose(f);
    assert_true(printed);
    float xs[256];
    for (int i = 0; i < 256; i++) xs[i] = (float)(i - 128) / 64.0f;
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {4, 64}, xs}, fetch[2] = {{.name = "y"}, {.name = "z"}};
    assert_int_equal(alloy_graph_run(g, &feed, 1, fetch, 2), ALLOY_OK);
    assert_int_equal(fetch[0].dims[0], 128);
    assert_int_equal(fetch[1].dims[0], 64);
    const float *ys = fetch[0].data, *zs = fetch[1].data;
    for (int k = 0; k < 128; k++) {
        double want_y = exp((double)xs[64 + k]) - exp((double)xs[(k / 32) * 64 + k % 32]);
        if (fabs(ys[k] - want_y) > 1e-5) fail_msg("y[%d] = %.9g, want %.9g", k, (double)ys[k], want_y);
    }
    for (int k = 0; k < 64; k++) {
        double want_z = exp((double)xs[64 + k + 1]);
        if (fabs(zs[k] - want_z) > 1e-6 * want_z) fail_msg("z[%d] = %.9g, want %.9g", k, (double)zs[k], want_z);
    }
    release(&x);
}

/* A concat along axis 0 whose inputs are computed values read by it alone
 * is a gather: the planner places a and b at bytes 0 and 512 of c's slot,
 * where exp and neg write them, and c runs no kernel. d = concat(e, x)
 * reads the leaf x: a copy kernel. Unfused: exp, neg, mul, d's concat and
 * add, 5 launches. y[k] = e^x + x^2, y[128 + k] = -x + x = 0 from the CPU. */
static void test_a_concat_of_values_it_alone_reads_gathers_them_in_place(void **state)
{
    (void)state;
    static const char gather_ir[] =
        "graph gather {\n"
        "  %x = input : f32[128]\n"
        "  %a = exp(%x) : f32[128]\n"
        "  %b = neg(%x) : f32[128]\n"
        "  %c = concat(%a, %b) {axis=0} : f32[256]\n"
        "  %e = mul(%x, %x) : f32[128]\n"
        "  %d = concat(%e, %x) {axis=0} : f32[256]\n"
        "  %y = add(%c, %d) : f32[256]\n"
        "  output \"y\" = %y\n"
        "}\n";
    modelled x;
    model_unfused(&x, gather_ir, 5);
    alloy_graph *g = x.g;
    const ir_graph *c = g->compiled;
    const mem_plan *p = &g->comp.plan;
    int a = ir_find_name(c, "a"), b = ir_find_name(c, "b"), cc = ir_find_name(c, "c"), e = ir_find_name(c, "e"),
        d = ir_find_name(c, "d");
    assert_true(a >= 0 && b >= 0 && cc >= 0 && e >= 0 && d >= 0);
    assert_int_equal(p->views, 2); /* a and b */
    assert_int_equal(p->view_of[a], cc);
    assert_int_equal(p->view_of[b], cc);
    assert_int_equal(p->view_of[e], -1);
    assert_int_equal(p->offset[a], p->offset[cc]);
    assert_int_equal(p->offset[b], p->offset[cc] + 512);
    assert_int_not_equal(p->offset[e], p->offset[d]);
    float xs[128];
    for (int i = 0; i < 128; i++) xs[i] = (float)(i - 64) / 32.0f;
    alloy_host_tensor feed = {"x", ALLOY_F32, 1, {128}, xs}, fetch = {.name = "y"};
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_OK);
    assert_int_equal(fetch.dims[0], 256);
    const float *ys = fetch.data;
    for (int k = 0; k < 128; k++) {
        double want = exp((double)xs[k]) + (double)xs[k] * xs[k];
        if (fabs(ys[k] - want) > 1e-5 * want) fail_msg("y[%d] = %.9g, want %.9g", k, (double)ys[k], want);
        if (ys[128 + k] != 0.0f) fail_msg("y[%d] = %.9g, want 0", 128 + k, (double)ys[128 + k]);
    }
    release(&x);
}

/* Collectives: a reduce_scatter of 1000 f32 over 4 ranks sends 3/4 of its
 * 4000 bytes (3000), the all_gather of the 250-element shard back the same
 * 3000, an all_reduce of 1000 f32 (over the graph's 4) twice that, 6000
 * (ring algorithms). On the H100: 6000 B / (450 GB/s x 0.80) + 10 us + 0.8 us
 * = 10.8167 us low, 6000 / (450 GB/s x 0.60) + 25 + 1.5 = 26.5222 us high. */
static void test_collectives_move_the_ring_bytes_at_the_link_rate(void **state)
{
    (void)state;
    alloy_graph *g = parse("graph coll {\n"
                           "  %x = input : f32[1000]\n"
                           "  %s = reduce_scatter(%x) {world=4} : f32[250]\n"
                           "  %t = mul(%s, %s) : f32[250]\n"
                           "  %a = all_gather(%t) {world=4} : f32[1000]\n"
                           "  %r = all_reduce(%a) : f32[1000]\n"
                           "  output \"r\" = %r\n"
                           "}\n");
    char err[1024];
    cg_program prog;
    lp_plan lp;
    cost_model m;
    if (graph_compile_ir(g)) fail_msg("%s", alloy_last_error(g));
    if (cg_emit(g->compiled, &g->comp.sched, &prog, err, sizeof err)) fail_msg("%s", err);
    if (cost_plan(g->compiled, &g->comp.sched, &g->comp.plan, &prog, &lp, err, sizeof err)) fail_msg("%s", err);
    if (cost_build(g->compiled, &g->comp.sched, &prog, &lp, NULL, &m, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(m.collectives, 3);
    assert_int_equal(count_action(&m, COST_COLLECTIVE), 3);
    int64_t want[] = {3000, 3000, 6000};
    int k = 0;
    for (int i = 0; i < m.n; i++) {
        if (m.launches[i].action != COST_COLLECTIVE) continue;
        assert_int_equal(m.launches[i].cls, COST_COLLECTIVE_CLASS);
        assert_int_equal(m.launches[i].world, 4);
        assert_int_equal(m.launches[i].link, want[k++]);
    }
    const cost_device *d = cost_device_find("h100");
    cost_apply(&m, d);
    const cost_launch *ar = &m.launches[m.n - 1];
    assert_true(strncmp(ar->name, "all_reduce", 10) == 0);
    assert_true(fabs(ar->t_lo - 10.816667e-6) < 1e-11);
    assert_true(fabs(ar->t_hi - 26.522222e-6) < 1e-11);
    assert_int_equal(m.by_class[COST_COLLECTIVE_CLASS].launches, 3);
    assert_int_equal(m.by_class[COST_COLLECTIVE_CLASS].bytes, 12000);
    /* the report names the class and the link constants */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(cost_print(f, "coll", NULL, &m, d, 3, false), ALLOY_OK);
    fclose(f);
    assert_non_null(strstr(text, "3 collectives"));
    assert_non_null(strstr(text, "#   link              450 GB/s"));
    assert_non_null(strstr(text, "\ncollective "));
    free(text);
    /* one rank moves nothing */
    assert_int_equal(cost_collective_bytes(IR_OP_all_reduce, 4000, 1), 0);
    assert_int_equal(cost_collective_bytes(IR_OP_all_reduce, 4000, 2), 4000);
    cost_free(&m);
    lp_free(&lp);
    cg_program_free(&prog);
    alloy_graph_free(g);
}

/* A classifier over a vocabulary of v classes, trained (SGD) with AMP in amp (F32: off): h = x w1,
 * logits = h w, cross_entropy; its vocabulary GEMMs are the forward (logits), w's gradient and h's. */
static alloy_graph *classifier(int v, alloy_dtype amp)
{
    char text[1024];
    snprintf(text, sizeof text,
             "graph classifier {\n"
             "  %%x = input : f32[64,32]\n"
             "  %%t = input : i32[64]\n"
             "  %%w1 = param {init=\"normal\", std=0.1} : f32[32,32]\n"
             "  %%w = param {init=\"normal\", std=0.1} : f32[32,%d]\n"
             "  %%h = matmul(%%x, %%w1) : f32[64,32]\n"
             "  %%logits = matmul(%%h, %%w) : f32[64,%d]\n"
             "  %%loss = cross_entropy(%%logits, %%t) : f32[]\n"
             "  output \"loss\" = %%loss\n"
             "  loss %%loss\n"
             "}\n",
             v, v);
    alloy_graph *g = parse(text);
    if (amp != ALLOY_F32) expect_ok(g, alloy_graph_enable_amp(g, amp), "enable_amp");
    expect_ok(g, alloy_graph_set_training(g, true), "set_training");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0, 0, false)), "add_optimizer");
    return g;
}

/* 101 f16/bf16 classes (202 bytes a row): the plan pads the rows of the vocabulary GEMMs' values to
 * 128 elements, so all three GEMMs see leading dimensions of whole 16 bytes and are modelled as
 * aligned; 128 classes need no padding; f32 GEMMs are not padded (404 bytes: still odd). */
static void test_an_odd_vocabulary_pads_its_gemms_to_aligned_leading_dimensions(void **state)
{
    (void)state;
    static const struct {
        int v;
        alloy_dtype amp;
        int padded, odd;
    } cases[] = {{101, ALLOY_F16, 3, 0}, {101, ALLOY_BF16, 3, 0}, {37, ALLOY_F16, 3, 0}, {128, ALLOY_F16, 0, 0},
                 {101, ALLOY_F32, 0, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        modelled x;
        model(&x, classifier(cases[c].v, cases[c].amp), NULL);
        int padded = 0, odd = 0, forward = 0;
        int logits = ir_find_name(x.g->compiled, "logits");
        assert_true(logits >= 0);
        int64_t ld = (cases[c].v + 63) / 64 * 64;
        for (int i = 0; i < x.m.n; i++) {
            const cost_launch *l = &x.m.launches[i];
            if (l->action != COST_GEMM) continue;
            const lp_gemm *gm = &x.lp.gemms[l->index];
            padded += l->padded;
            odd += l->cls == COST_GEMM_ODD;
            assert_true(l->odd == (l->cls == COST_GEMM_ODD));
            if (gm->node != logits) continue;
            forward++;
            /* logits = h w: cuBLAS's A is w (its f16 copy), B is h, D the logits */
            assert_int_equal(gm->lda, cases[c].padded ? ld : cases[c].v);
            assert_int_equal(gm->ldb, 32);
            assert_int_equal(gm->ldd, cases[c].padded ? ld : cases[c].v);
            assert_int_equal(gm->m, cases[c].v);
        }
        if (padded != cases[c].padded || odd != cases[c].odd)
            fail_msg("%d classes, %s: %d padded GEMMs (want %d), %d odd (want %d)", cases[c].v,
                     alloy_dtype_name(cases[c].amp), padded, cases[c].padded, odd, cases[c].odd);
        assert_int_equal(forward, 1);
        release(&x);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_forward_launches_bytes_and_flops_are_the_hand_worked_ones),
        cmocka_unit_test(test_a_linear_layer_with_bias_is_one_gemm_in_its_dtype),
        cmocka_unit_test(test_an_odd_vocabulary_pads_its_gemms_to_aligned_leading_dimensions),
        cmocka_unit_test(test_a_product_widened_for_readers_that_apply_the_range_rule_has_no_epilogue_kernel),
        cmocka_unit_test(test_collectives_move_the_ring_bytes_at_the_link_rate),
        cmocka_unit_test(test_mlp_training_step_gemm_flops_are_the_five_products),
        cmocka_unit_test(test_a_linear_layer_and_gelu_tanh_are_one_gemm_with_the_gelu_epilogue),
        cmocka_unit_test(test_attention_is_counted_at_seven_products_with_the_kept_logsumexp),
        cmocka_unit_test(test_an_elementwise_kernel_moves_its_operands_once),
        cmocka_unit_test(test_a_bias_gradient_and_its_cast_are_one_launch_by_hand),
        cmocka_unit_test(test_a_row_steps_column_sum_is_one_launch_by_hand),
        cmocka_unit_test(test_a_reshape_is_a_view_with_no_launch_and_the_same_result),
        cmocka_unit_test(test_a_contiguous_slice_is_a_view_at_its_byte_offset),
        cmocka_unit_test(test_a_concat_of_values_it_alone_reads_gathers_them_in_place),
        cmocka_unit_test(test_the_time_of_a_launch_is_the_larger_of_its_bytes_flops_and_floor_plus_the_node),
        cmocka_unit_test(test_a_char_gpt_step_moves_what_its_schedule_says),
        cmocka_unit_test(test_ptxas_lines_give_each_kernels_registers_spills_and_shared_memory),
        cmocka_unit_test(test_nvrtc_reports_the_resources_of_every_kernel),
        cmocka_unit_test(test_a_spilling_kernel_is_charged_its_local_traffic),
        cmocka_unit_test(test_calibration_fits_efficiency_gemm_rates_and_floor_to_a_profile),
        cmocka_unit_test(test_alloy_graph_cost_reports_totals_and_names_bad_options),
        cmocka_unit_test(test_the_cost_of_a_step_on_device_auto_is_the_gpu_plan),
        cmocka_unit_test(test_alloyc_cost_prints_the_model_of_an_ir_file),
        cmocka_unit_test(test_every_allocation_failure_of_the_cost_model_is_a_clean_error),
        cmocka_unit_test(test_an_amp_step_casts_in_one_launch_and_unscales_checks_and_norms_in_one_pass),
    };
    return cmocka_run_group_tests(tests, test_checked_alloc, test_plain_alloc);
}
