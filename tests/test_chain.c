/* test_chain.c - chains of scalar steps in one launch (src/codegen/emit_chain.c): the launches counted by hand on small graphs, the chained kernel's values the CPU's bit for bit on the emulated device (host and GPU numerics), and a training step's scalar tail in a few launches. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/alloy.h"
#include "codegen_support.h"
#include "cost/cost.h"
#include "runtime/graph/graph_impl.h"
#include "step/launch_plan.h"
#include "support.h"

/* Eleven one-element steps, each a kernel of one block before chains: three
 * constants (their own steps), three casts between f32, f64 and i32 (op
 * steps: f64 values are kept apart from f32 groups), and five elementwise
 * steps of three compute types that the fuser cannot join for the same
 * reason. */
static const char tail_ir[] = "graph tail {\n"
                              "  %x = input : f32[]\n"
                              "  %k = input : i32[]\n"
                              "  %c2 = constant {value=2} : f32[]\n"
                              "  %a = mul(%x, %c2) : f32[]\n"
                              "  %d = cast(%a) : f64[]\n"
                              "  %h = constant {value=0.5} : f64[]\n"
                              "  %e = mul(%d, %h) : f64[]\n"
                              "  %f = cast(%e) : f32[]\n"
                              "  %g = sqrt(%f) : f32[]\n"
                              "  %one = constant {value=1} : i32[]\n"
                              "  %k2 = add(%k, %one) : i32[]\n"
                              "  %kf = cast(%k2) : f64[]\n"
                              "  %r = div(%e, %kf) : f64[]\n"
                              "  output \"g\" = %g\n"
                              "  output \"k2\" = %k2\n"
                              "  output \"r\" = %r\n"
                              "}\n";

/* The same with a step of 600 elements in the middle (three blocks): the
 * chain stops before it and starts again after it. */
static const char broken_ir[] = "graph broken {\n"
                                "  %x = input : f32[]\n"
                                "  %v = input : f32[600]\n"
                                "  %c2 = constant {value=2} : f32[]\n"
                                "  %a = mul(%x, %c2) : f32[]\n"
                                "  %d = cast(%a) : f64[]\n"
                                "  %w = mul(%v, %a) : f32[600]\n"
                                "  %h = constant {value=0.5} : f64[]\n"
                                "  %e = mul(%d, %h) : f64[]\n"
                                "  %f = cast(%e) : f32[]\n"
                                "  output \"w\" = %w\n"
                                "  output \"f\" = %f\n"
                                "}\n";

static alloy_graph *parse(const char *text)
{
    char err[512];
    alloy_graph *g = alloy_graph_parse(text, strlen(text), "test.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    return g;
}

/* The cost model's launches of g's compiled step, with its kernels' names (at most max). */
static int launches(alloy_graph *g, char names[][64], int max, int *steps)
{
    char err[1024];
    cg_program prog;
    lp_plan lp;
    cost_model m;
    if (graph_compile_ir(g)) fail_msg("%s", alloy_last_error(g));
    if (cg_emit(g->compiled, &g->comp.sched, &prog, err, sizeof err)) fail_msg("%s", err);
    if (lp_build(g->compiled, &g->comp.sched, &g->comp.plan, &prog, &lp, err, sizeof err)) fail_msg("%s", err);
    if (cost_build(g->compiled, &g->comp.sched, &prog, &lp, NULL, &m, err, sizeof err)) fail_msg("%s", err);
    int n = m.n;
    for (int i = 0; i < n && i < max; i++) snprintf(names[i], 64, "%s", m.launches[i].name);
    *steps = g->comp.sched.nsteps;
    cost_free(&m);
    lp_free(&lp);
    cg_program_free(&prog);
    return n;
}

static void test_eleven_scalar_steps_are_one_launch(void **state)
{
    (void)state;
    char names[8][64];
    int steps;
    alloy_graph *g = parse(tail_ir);
    assert_int_equal(launches(g, names, 8, &steps), 1);
    assert_int_equal(steps, 11);
    assert_string_equal(names[0], "alloy_s0_chain11");
    alloy_graph_free(g);
}

static void test_a_step_of_several_blocks_ends_a_chain(void **state)
{
    (void)state;
    char names[8][64];
    int steps;
    alloy_graph *g = parse(broken_ir);
    /* c2, a, d | w | h, e, f: two chains and the 600-element mul between them */
    assert_int_equal(launches(g, names, 8, &steps), 3);
    assert_int_equal(steps, 7);
    assert_string_equal(names[0], "alloy_s0_chain3");
    assert_string_equal(names[1], "alloy_s3_ew");
    assert_string_equal(names[2], "alloy_s4_chain3");
    alloy_graph_free(g);
}

static void skip_without_emulation(void)
{
    char why[256];
    if (!emu_available(why, sizeof why)) {
        print_message("SKIP: no host emulation: %s\n", why);
        skip();
    }
}

/* The tail graph's chain on the emulated device against the CPU, every value bit for bit, in the
 * emulation's numerics (numerics: NULL for the host's, "gpu" for CUDA's; every op here is one CUDA
 * rounds correctly: mul, div, sqrt, casts). */
static void tail_against_the_cpu(const char *numerics)
{
    skip_without_emulation();
    if (numerics) setenv("ALLOY_EMU_NUMERICS", numerics, 1);
    alloy_graph *g = parse(tail_ir);
    assert_int_equal(graph_compile_ir(g), ALLOY_OK);
    float x = 0.3f; /* 2x / 2 / 7 and sqrt(x) round */
    int32_t k = 6;
    feed_set f = {.n = 2};
    f.t[0] = (alloy_host_tensor){.name = "x", .dtype = ALLOY_F32, .rank = 0, .data = &x};
    f.t[1] = (alloy_host_tensor){.name = "k", .dtype = ALLOY_I32, .rank = 0, .data = &k};
    emu_stats st = emulate_step(g, &f);
    if (numerics) unsetenv("ALLOY_EMU_NUMERICS");
    print_message("%s numerics: %d kernel, %d steps emulated, %d values, %d bit for bit\n", numerics ? numerics : "host",
                  st.kernels, st.steps_emulated, st.values, st.bitwise);
    if (st.failed) fail_msg("%s", st.first_failure);
    if (st.inexact) fail_msg("%s", st.first_inexact);
    assert_int_equal(st.kernels, 1);
    assert_int_equal(st.values, 11); /* every step's value compared, though one kernel computed them */
    assert_int_equal(st.bitwise, 11);
    alloy_graph_free(g);
}

static void test_the_chain_gives_the_cpus_bits_emulated(void **state)
{
    (void)state;
    tail_against_the_cpu(NULL);
}

static void test_the_chain_gives_the_cpus_bits_in_gpu_numerics(void **state)
{
    (void)state;
    tail_against_the_cpu("gpu");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eleven_scalar_steps_are_one_launch),
        cmocka_unit_test(test_a_step_of_several_blocks_ends_a_chain),
        cmocka_unit_test(test_the_chain_gives_the_cpus_bits_emulated),
        cmocka_unit_test(test_the_chain_gives_the_cpus_bits_in_gpu_numerics),
    };
    return cmocka_run_group_tests(tests, test_checked_alloc, test_plain_alloc);
}
