/* test_spills.c - no generated kernel spills: char_gpt's and an MLP's f16 training steps and a GPT-2-vocabulary cross-entropy step and one-layer GPT-2 124M steps (B8 f16 default, B32 bf16 attention op) compiled by NVRTC for sm_90 (with the argument sm80, all of them for sm_80), ptxas' report read per kernel; the only kernels allowed to spill are named here, each with its byte counts and reason; a kernel made to spill is caught. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/gpt_model.h"
#include "codegen/cache.h"
#include "codegen/emit.h"
#include "codegen/nvrtc.h"
#include "codegen/ptxas.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* Kernels allowed to spill: by graph, exact kernel name and architecture,
 * with the most bytes of spill stores and loads per thread ptxas may
 * report and the reason. None today: attention at head dim 128 would go
 * here if it spilled, with its counts. Ends with a NULL graph. */
static const struct {
    const char *graph, *kernel;
    int sm, stores, loads;
    const char *why;
} allowed[] = {
    {NULL, NULL, 0, 0, 0, NULL},
};

/* Whether kernel `kernel` of graph `graph` may spill what r says at sm. */
static bool is_allowed(const char *graph, const char *kernel, int sm, const cg_resources *r)
{
    for (size_t i = 0; allowed[i].graph; i++)
        if (!strcmp(allowed[i].graph, graph) && !strcmp(allowed[i].kernel, kernel) && allowed[i].sm == sm)
            return r->spill_stores <= allowed[i].stores && r->spill_loads <= allowed[i].loads;
    return false;
}

/* A vocabulary of GPT-2's width (50257 logits a row) over 8 rows: the
 * classifier's forward, loss and dlogits in one row kernel. */
static const char vocab_ir[] = "graph vocab_ce {\n"
                               "  %h = input : f32[8,64]\n"
                               "  %head.weight = param {init=\"normal\", std=0.02} : f32[64,50257]\n"
                               "  %logits = matmul(%h, %head.weight) : f32[8,50257]\n"
                               "  %targets = input : i32[8]\n"
                               "  %loss = cross_entropy(%logits, %targets) : f32[]\n"
                               "  output \"loss\" = %loss\n"
                               "  loss %loss\n"
                               "}\n";

/* NVRTC and the kernel cache (ALLOY_CACHE_DIR, else the default directory). */
typedef struct compiler {
    cg_nvrtc *nv;
    cg_cache *cache;
    char dir[1024];
} compiler;

/* Opens *c, or skips the test without NVRTC. */
static void open_compiler(compiler *c)
{
    char why[512], err[1024];
    if (cg_nvrtc_open(NULL, &c->nv, why, sizeof why) != ALLOY_OK) {
        print_message("skipped, no NVRTC: %s\n", why);
        skip();
    }
    if (cg_cache_default_dir(getenv("ALLOY_CACHE_DIR"), getenv("XDG_CACHE_HOME"), getenv("HOME"), c->dir, sizeof c->dir))
        c->dir[0] = 0;
    assert_int_equal(cg_cache_open(c->dir[0] ? c->dir : NULL, 1 << 20, 0, &c->cache, err, sizeof err), ALLOY_OK);
}

static void close_compiler(compiler *c)
{
    cg_cache_stats st = cg_cache_get_stats(c->cache);
    print_message("kernel cache %s: %llu hits\n", c->dir[0] ? c->dir : "(memory)", (unsigned long long)st.hits);
    cg_cache_close(c->cache);
    cg_nvrtc_close(c->nv);
}

/* Has NVRTC compile prog's kernels for sm (modules in parallel, through
 * the kernel cache) and returns how many spill that `allowed` does not
 * name, printing each spilling kernel; every kernel must be reported. */
static int spilling_in(const compiler *c, const cg_program *prog, int sm, const char *what)
{
    char err[1024];
    cg_resources *res = test_calloc((size_t)prog->nkernels + 1, sizeof *res);
    if (cg_ptxas_resources(c->nv, c->cache, prog, sm, 0, res, err, sizeof err)) fail_msg("%s: %s", what, err);
    int bad = 0, known = 0, most = 0;
    for (int k = 0; k < prog->nkernels; k++) {
        known += res[k].known;
        if (res[k].registers > most) most = res[k].registers;
        if (res[k].spill_stores + res[k].spill_loads == 0) continue;
        bool ok = is_allowed(what, prog->kernels[k].name, sm, &res[k]);
        print_message("%s: %s spills %d B stores, %d B loads for sm_%d (%d registers, %d B stack)%s\n", what,
                      prog->kernels[k].name, res[k].spill_stores, res[k].spill_loads, sm, res[k].registers, res[k].stack,
                      ok ? ", allowed" : "");
        bad += !ok;
    }
    print_message("%s: %d kernels, %d reported by ptxas for sm_%d, at most %d registers, %d spilling\n", what,
                  prog->nkernels, known, sm, most, bad);
    assert_int_equal(known, prog->nkernels);
    test_free(res);
    return bad;
}

/* Compiles g's training step (AdamW; amp with the dynamic scaler for f16),
 * emits its kernels and returns how many spill (spilling_in) for each of
 * the nsm architectures sms; frees g. */
static int spilling_kernels(const compiler *c, alloy_graph *g, alloy_dtype amp, const int *sms, int nsm, const char *what)
{
    assert_int_equal(alloy_graph_set_training(g, true), ALLOY_OK);
    assert_int_equal(alloy_graph_enable_amp(g, amp), ALLOY_OK);
    if (amp == ALLOY_F16) assert_int_equal(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), ALLOY_OK);
    assert_int_equal(alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01)), ALLOY_OK);
    if (graph_compile_ir(g)) fail_msg("%s: %s", what, alloy_last_error(g));
    cg_program prog = {0};
    char err[1024];
    if (cg_emit(g->compiled, &g->comp.sched, &prog, err, sizeof err)) fail_msg("%s: %s", what, err);
    int bad = 0;
    for (int i = 0; i < nsm; i++) bad += spilling_in(c, &prog, sms[i], what);
    cg_program_free(&prog);
    alloy_graph_free(g);
    return bad;
}

static alloy_graph *load(const char *name)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%s", ALLOY_EXAMPLES_IR, name);
    alloy_graph *g = alloy_graph_load_ir(path, err, sizeof err);
    if (!g) fail_msg("%s", err);
    return g;
}

/* The example steps (char_gpt, the MLP, the vocabulary cross-entropy) for each of the nsm architectures sms. */
static int example_spills(const compiler *c, const int *sms, int nsm)
{
    int bad = spilling_kernels(c, load("char_gpt.ir"), ALLOY_F16, sms, nsm, "char_gpt");
    bad += spilling_kernels(c, load("mlp_classifier.ir"), ALLOY_F16, sms, nsm, "mlp_classifier");
    char err[1024];
    alloy_graph *g = alloy_graph_parse(vocab_ir, strlen(vocab_ir), "vocab_ce.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    return bad + spilling_kernels(c, g, ALLOY_F16, sms, nsm, "vocab_ce");
}

static void test_no_generated_kernel_spills(void **state)
{
    (void)state;
    compiler c;
    open_compiler(&c);
    int bad = example_spills(&c, (const int[]){90}, 1);
    close_compiler(&c);
    if (bad) fail_msg("%d generated kernels spill that the list in test_spills.c does not name", bad);
}

/* A kernel made to spill, the per-thread sum written as a recursion (as
 * the reduction kernels were: a call stack whose saved registers spill),
 * is found and counted: the check can fail. */
static void test_a_spilling_kernel_is_caught(void **state)
{
    (void)state;
    compiler c;
    open_compiler(&c);
    static char source[] =
        "struct R_ {\n"
        "    const float *p;\n"
        "    __device__ float sum(long long lo, long long n) const\n"
        "    {\n"
        "        if (n > 16) return sum(lo, n / 2) + sum(lo + n / 2, n - n / 2);\n"
        "        float s = 0;\n"
        "        for (long long i = 0; i < n; i++) s += p[lo + i];\n"
        "        return s;\n"
        "    }\n"
        "};\n"
        "extern \"C\" __global__ void __launch_bounds__(256) alloy_s0_recursive_sum(float *p0, const float *p1)\n"
        "{\n"
        "    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    const R_ r_ = {p1 + e * 1000};\n"
        "    p0[e] = r_.sum(0, 1000);\n"
        "}\n";
    cg_kernel k = {.name = "alloy_s0_recursive_sum", .source = source, .grid = 1, .block = 256};
    cg_program prog = {.kernels = &k, .nkernels = 1, .cap = 1};
    assert_int_equal(spilling_in(&c, &prog, 90, "made_to_spill"), 1);
    close_compiler(&c);
}

/* A GPT-2 124M step with one layer (B8 T1024 D768 H12 V50257): f16 with
 * the default passes (the attention rewrite, for a GPU), and bf16 B32 with
 * the attention op (attention=always). */
static alloy_graph *gpt2(int batch, bool flash)
{
    alloy_graph *g = alloy_graph_new(flash ? "gpt2_flash_b32_l1" : "gpt2_b8_l1");
    assert_non_null(g);
    alloy_graph_set_seed(g, 1);
    gpt_config cfg = {50257, 1024, 768, 1, 12, 3072, false};
    alloy_tensor *loss = gpt_build(g, &cfg, batch, true).loss;
    assert_int_equal(alloy_graph_set_loss(g, loss), ALLOY_OK);
    assert_int_equal(alloy_graph_set_option(g, "device", "cuda"), ALLOY_OK);
    if (flash) assert_int_equal(alloy_graph_set_option(g, "attention", "always"), ALLOY_OK);
    return g;
}

/* The one-layer GPT-2 steps for the nsm architectures sms. */
static int gpt2_spills(const compiler *c, const int *sms, int nsm)
{
    int bad = spilling_kernels(c, gpt2(8, false), ALLOY_F16, sms, nsm, "gpt2_b8_l1");
    return bad + spilling_kernels(c, gpt2(32, true), ALLOY_BF16, sms, nsm, "gpt2_flash_b32_l1");
}

static void test_no_gpt2_kernel_spills(void **state)
{
    (void)state;
    compiler c;
    open_compiler(&c);
    int bad = gpt2_spills(&c, (const int[]){90}, 1);
    close_compiler(&c);
    if (bad) fail_msg("%d generated kernels spill that the list in test_spills.c does not name", bad);
}

/* Every step above for sm_80 (the long test spills_sm80). */
static void test_no_kernel_spills_for_sm80(void **state)
{
    (void)state;
    compiler c;
    open_compiler(&c);
    const int sm80[] = {80};
    int bad = example_spills(&c, sm80, 1) + gpt2_spills(&c, sm80, 1);
    close_compiler(&c);
    if (bad) fail_msg("%d generated kernels spill for sm_80 that the list in test_spills.c does not name", bad);
}

/* With the argument sm80: every step for sm_80 (the long test
 * spills_sm80); else the quick checks for sm_90. */
int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "sm80")) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_no_kernel_spills_for_sm80),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_generated_kernel_spills),
        cmocka_unit_test(test_no_gpt2_kernel_spills),
        cmocka_unit_test(test_a_spilling_kernel_is_caught),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
