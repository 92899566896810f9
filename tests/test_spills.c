/* test_spills.c - no generated kernel spills: char_gpt's and an MLP's f16 training steps and a GPT-2-vocabulary cross-entropy step compiled by NVRTC for sm_90, ptxas' report read per kernel; the kernels allowed to spill are named here with the reason. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cache.h"
#include "codegen/emit.h"
#include "codegen/nvrtc.h"
#include "codegen/ptxas.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* Kernels allowed to spill: by graph and a part of the kernel's name
 * (step numbers change with the schedule), each with its reason. */
static const struct {
    const char *graph, *kernel, *why;
} allowed[] = {
    /* a reduce_sum kernel of the step: 64 B of stack */
    {"char_gpt", "_reduce_sum", "a reduce_sum kernel's 64 B stack frame"},
    /* the head's AdamW update as one elementwise kernel (a lone parameter: no multi step) with 16-byte
     * accesses: five 4-float operand arrays and the update's square of the gradient (the norm's
     * sum_squares no longer shares it) leave 16 B of stack, 12 B stored, 44 B loaded a thread */
    {"vocab_ce", "_s42_ew", "the lone parameter's AdamW ew kernel: 16 B of stack"},
};

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

static bool is_allowed(const char *graph, const char *kernel)
{
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
        if (strcmp(allowed[i].graph, graph) == 0 && strstr(kernel, allowed[i].kernel))
            return true;
    return false;
}

/* Compiles g's f16 AMP training step (AdamW, the dynamic scaler), emits its
 * kernels, has NVRTC compile them for sm_90 through the kernel cache and
 * returns how many kernels spill that `allowed` does not name, printing
 * each spilling kernel. */
static int spilling_kernels(const cg_nvrtc *nv, cg_cache *cache, alloy_graph *g, const char *what)
{
    assert_int_equal(alloy_graph_set_training(g, true), ALLOY_OK);
    assert_int_equal(alloy_graph_enable_amp(g, ALLOY_F16), ALLOY_OK);
    assert_int_equal(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), ALLOY_OK);
    assert_int_equal(alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01)), ALLOY_OK);
    if (graph_compile_ir(g)) fail_msg("%s: %s", what, alloy_last_error(g));
    cg_program prog = {0};
    char err[1024];
    if (cg_emit(g->compiled, &g->comp.sched, &prog, err, sizeof err)) fail_msg("%s: %s", what, err);
    cg_resources *res = test_calloc((size_t)prog.nkernels + 1, sizeof *res);
    if (cg_ptxas_resources(nv, cache, &prog, 90, 0, res, err, sizeof err)) fail_msg("%s: %s", what, err);
    int bad = 0, known = 0, most = 0;
    for (int k = 0; k < prog.nkernels; k++) {
        known += res[k].known;
        if (res[k].registers > most) most = res[k].registers;
        if (res[k].spill_stores + res[k].spill_loads == 0) continue;
        bool ok = is_allowed(what, prog.kernels[k].name);
        print_message("%s: %s spills %d B stores, %d B loads (%d registers, %d B stack)%s\n", what, prog.kernels[k].name,
                      res[k].spill_stores, res[k].spill_loads, res[k].registers, res[k].stack, ok ? ", allowed" : "");
        bad += !ok;
    }
    print_message("%s: %d kernels, %d reported by ptxas for sm_90, at most %d registers, %d spilling\n", what,
                  prog.nkernels, known, most, bad);
    assert_int_equal(known, prog.nkernels);
    test_free(res);
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

static void test_no_generated_kernel_spills(void **state)
{
    (void)state;
    cg_nvrtc *nv;
    char why[512];
    if (cg_nvrtc_open(NULL, &nv, why, sizeof why) != ALLOY_OK) {
        print_message("skipped, no NVRTC: %s\n", why);
        skip();
    }
    char dir[1024], err[1024];
    cg_cache *cache;
    if (cg_cache_default_dir(getenv("ALLOY_CACHE_DIR"), getenv("XDG_CACHE_HOME"), getenv("HOME"), dir, sizeof dir))
        dir[0] = 0;
    assert_int_equal(cg_cache_open(dir[0] ? dir : NULL, 1 << 20, 0, &cache, err, sizeof err), ALLOY_OK);
    int bad = spilling_kernels(nv, cache, load("char_gpt.ir"), "char_gpt");
    bad += spilling_kernels(nv, cache, load("mlp_classifier.ir"), "mlp_classifier");
    alloy_graph *g = alloy_graph_parse(vocab_ir, strlen(vocab_ir), "vocab_ce.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    bad += spilling_kernels(nv, cache, g, "vocab_ce");
    cg_cache_stats st = cg_cache_get_stats(cache);
    print_message("kernel cache %s: %llu hits\n", dir[0] ? dir : "(memory)", (unsigned long long)st.hits);
    cg_cache_close(cache);
    cg_nvrtc_close(nv);
    if (bad) fail_msg("%d generated kernels spill that the list in test_spills.c does not name", bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_generated_kernel_spills),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
