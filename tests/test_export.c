/* test_export.c - the CUDA export (codegen/export.c): modules of kernels, architecture lists, the files it writes, the kernel cache, and a compile NVRTC rejects. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codegen/export.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* Loaded once for the suite; NULL (with the reason in why) when this machine has no NVRTC. */
static cg_nvrtc *nv;
static char why[512];
static char out_dir[128], cache_dir[128], dump_dir[128];

#define NEED_NVRTC()                                                                                           \
    do {                                                                                                       \
        if (!nv) {                                                                                             \
            print_message("skipped, no NVRTC: %s\n", why);                                                     \
            skip();                                                                                            \
        }                                                                                                      \
    } while (0)

static int group_setup(void **state)
{
    test_checked_alloc(state);
    if (cg_nvrtc_open(NULL, &nv, why, sizeof why) != ALLOY_OK) nv = NULL;
    return 0;
}

static int group_teardown(void **state)
{
    test_checked_alloc(state);
    cg_nvrtc_close(nv);
    return test_plain_alloc(state);
}

static int setup(void **state)
{
    if (test_tmpdir_setup(state)) return -1;
    snprintf(out_dir, sizeof out_dir, "%s/out", test_tmpdir);
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", test_tmpdir);
    snprintf(dump_dir, sizeof dump_dir, "%s/dump", test_tmpdir);
    return 0;
}

static int teardown(void **state)
{
    test_remove_dir(out_dir);
    test_remove_dir(cache_dir);
    test_remove_dir(dump_dir);
    return test_tmpdir_teardown(state);
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* How many files in dir end with suffix. */
static int count_files(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    int n = 0;
    size_t k = strlen(suffix);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        n += len >= k && strcmp(e->d_name + len - k, suffix) == 0;
    }
    if (d) closedir(d);
    return n;
}

/* tests/data/mlp2.ir (a forward step: two GEMMs, their epilogues), compiled by the pass pipeline alone. */
static alloy_graph *mlp2_step(void)
{
    char err[512];
    alloy_graph *g = alloy_graph_load_ir(ALLOY_TEST_DATA "/mlp2.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    if (graph_compile_ir(g)) fail_msg("%s", alloy_last_error(g));
    return g;
}

/* ---- modules and architectures ---- */

static void test_modules_split_the_kernels_in_order_into_parts_of_at_most_64_that_differ_by_at_most_one(void **state)
{
    (void)state;
    static const int counts[] = {0, 1, 63, 64, 65, 128, 129, 285, 1000};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        int n = counts[c], m = cg_module_count(n), next = 0, lo = n, hi = 0;
        assert_int_equal(m, (n + 63) / 64);
        for (int i = 0; i < m; i++) {
            int first, k;
            cg_module_range(n, i, &first, &k);
            assert_int_equal(first, next);
            assert_true(k >= 1 && k <= CG_MODULE_KERNELS);
            lo = k < lo ? k : lo;
            hi = k > hi ? k : hi;
            next = first + k;
        }
        assert_int_equal(next, n);
        if (m) assert_true(hi - lo <= 1);
        int first, k;
        cg_module_range(n, m, &first, &k); /* past the last: empty */
        assert_int_equal(k, 0);
    }
    char name[32];
    cg_module_name(7, name, sizeof name);
    assert_string_equal(name, "alloy_m7");
}

static void test_architecture_lists_parse_and_a_bad_item_is_named(void **state)
{
    (void)state;
    int archs[CG_MAX_ARCHS], n;
    char err[256];
    assert_int_equal(cg_parse_archs("sm_80,sm_90", archs, CG_MAX_ARCHS, &n, err, sizeof err), ALLOY_OK);
    assert_int_equal(n, 2);
    assert_int_equal(archs[0], 80);
    assert_int_equal(archs[1], 90);
    assert_int_equal(cg_parse_archs(" sm_86 , sm_120", archs, CG_MAX_ARCHS, &n, err, sizeof err), ALLOY_OK);
    assert_int_equal(n, 2);
    assert_int_equal(archs[1], 120);
    static const char *const bad[] = {"sm_1", "sm_080", "sm80", "80", "sm_8x", "sm_12345", "sm_80,,sm_90", "sm_90a"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(cg_parse_archs(bad[i], archs, CG_MAX_ARCHS, &n, err, sizeof err), ALLOY_ERR_INVALID);
        assert_non_null(strstr(err, "is not sm_XY"));
    }
    assert_int_equal(cg_parse_archs("sm_1", archs, CG_MAX_ARCHS, &n, err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "'sm_1'"));
    assert_int_equal(cg_parse_archs("", archs, CG_MAX_ARCHS, &n, err, sizeof err), ALLOY_ERR_INVALID);
    assert_int_equal(cg_parse_archs(NULL, archs, CG_MAX_ARCHS, &n, err, sizeof err), ALLOY_ERR_INVALID);
    assert_int_equal(cg_parse_archs("sm_80,sm_90,sm_80", archs, CG_MAX_ARCHS, &n, err, sizeof err),
                     ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "sm_80 is given twice"));
    assert_int_equal(cg_parse_archs("sm_80,sm_90,sm_100", archs, 2, &n, err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "more than 2"));
}

/* ---- exports ---- */

static void test_an_export_writes_sources_binaries_and_a_summary_and_the_second_comes_from_the_cache(void **state)
{
    (void)state;
    NEED_NVRTC();
    alloy_graph *g = mlp2_step();
    static const int archs[] = {80, 90};
    cg_export_options o = {.archs = archs, .narchs = 2, .dir = out_dir, .cache = true, .cache_dir = cache_dir,
                           .dump_dir = dump_dir};
    cg_export_totals t;
    char err[4096];
    alloy_status st = cg_export(g->compiled, &g->comp.sched, nv, &o, &t, err, sizeof err);
    if (st) fail_msg("%s", err);
    assert_true(t.kernels > 0);
    assert_int_equal(t.modules, 1);
    assert_int_equal(t.targets, 2);
    assert_int_equal(t.binaries, 2);
    assert_int_equal(t.from_cache, 0);
    assert_int_equal(t.library_calls, 2); /* the matmuls of the two gemm steps */
    assert_true(exists(test_path_in(out_dir, "alloy_m0.cu")));
    assert_true(exists(test_path_in(dump_dir, "alloy_m0.cu")));
    size_t len;
    unsigned char *cubin = test_read_file(test_path_in(out_dir, "alloy_m0.sm_90.cubin"), &len);
    assert_memory_equal(cubin, "\x7f" "ELF", 4);
    test_free(cubin);
    assert_true(exists(test_path_in(out_dir, "alloy_m0.sm_80.cubin")));
    char *summary = (char *)test_read_file(test_path_in(out_dir, "summary.txt"), &len);
    assert_non_null(strstr(summary, "graph 'mlp2'"));
    assert_non_null(strstr(summary, "a library GEMM (cuBLASLt)"));
    assert_non_null(strstr(summary, "from cache     0 of 2 binaries"));
    int rows = 0; /* one per kernel, between the header and the blank line */
    for (char *line = strstr(summary, "\nkernel ") + 1; (line = strchr(line, '\n')) && line[1] != '\n'; line++) rows++;
    assert_int_equal(rows, t.kernels);
    test_free(summary);

    /* the second time every binary comes from the cache; without the cache, none */
    st = cg_export(g->compiled, &g->comp.sched, nv, &o, &t, err, sizeof err);
    if (st) fail_msg("%s", err);
    assert_int_equal(t.from_cache, 2);
    o.cache = false;
    st = cg_export(g->compiled, &g->comp.sched, nv, &o, &t, err, sizeof err);
    if (st) fail_msg("%s", err);
    assert_int_equal(t.from_cache, 0);

    /* two architectures NVRTC lacks that fall back to the same PTX: one binary */
    static const int future[] = {200, 300};
    o.archs = future;
    st = cg_export(g->compiled, &g->comp.sched, nv, &o, &t, err, sizeof err);
    if (st) fail_msg("%s", err);
    assert_int_equal(t.targets, 1);
    assert_int_equal(t.binaries, 1);
    assert_int_equal(count_files(out_dir, ".ptx"), 1);
    /* one NVRTC cannot build for at all */
    static const int old[] = {35};
    o.archs = old;
    o.narchs = 1;
    assert_int_equal(cg_export(g->compiled, &g->comp.sched, nv, &o, &t, err, sizeof err), ALLOY_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "sm_35"));
    alloy_graph_free(g);
}

static const char *broken_module(void *ctx, int module, const char *emitted)
{
    (void)ctx;
    return module == 0 ? "extern \"C\" __global__ void alloy_broken(float *y) { y[0] = ; }\n" : emitted;
}

static void test_a_failing_compile_returns_the_log_and_the_source_path_and_leaves_no_binary(void **state)
{
    (void)state;
    NEED_NVRTC();
    alloy_graph *g = mlp2_step();
    static const int archs[] = {90};
    cg_export_options o = {.archs = archs, .narchs = 1, .dir = out_dir, .cache = true, .cache_dir = cache_dir};
    char err[4096];
    alloy_status st = cg_export(g->compiled, &g->comp.sched, nv, &o, NULL, err, sizeof err);
    if (st) fail_msg("%s", err);
    assert_int_equal(count_files(out_dir, ".cubin"), 1); /* what a good export leaves */

    o.source_hook = broken_module;
    assert_int_equal(cg_export(g->compiled, &g->comp.sched, nv, &o, NULL, err, sizeof err), ALLOY_ERR_NVRTC);
    char source[256], log[256];
    snprintf(source, sizeof source, "%s", test_path_in(out_dir, "alloy_m0.cu"));
    snprintf(log, sizeof log, "%s", test_path_in(out_dir, "alloy_m0.sm_90.log"));
    assert_non_null(strstr(err, source));
    assert_non_null(strstr(err, log));
    assert_non_null(strstr(err, "sm_90"));
    assert_non_null(strstr(err, "expected an expression")); /* NVRTC's log */
    /* no binary and no summary: the earlier export's are gone too */
    assert_int_equal(count_files(out_dir, ".cubin"), 0);
    assert_false(exists(test_path_in(out_dir, "summary.txt")));
    size_t len;
    char *text = (char *)test_read_file(source, &len); /* the source that failed, as compiled */
    assert_non_null(strstr(text, "y[0] = ;"));
    test_free(text);
    text = (char *)test_read_file(log, &len);
    assert_non_null(strstr(text, "error"));
    test_free(text);
    assert_int_equal(count_files(cache_dir, ".kernel"), 1); /* the failure cached nothing */

    /* fixed, the export succeeds again and the stale log goes */
    o.source_hook = NULL;
    st = cg_export(g->compiled, &g->comp.sched, nv, &o, NULL, err, sizeof err);
    if (st) fail_msg("%s", err);
    assert_false(exists(log));
    assert_int_equal(count_files(out_dir, ".cubin"), 1);
    alloy_graph_free(g);
}

static void test_the_public_call_checks_its_arguments_and_reports_on_the_graph(void **state)
{
    (void)state;
    alloy_graph *g = mlp2_step();
    assert_int_equal(alloy_graph_export_cuda(NULL, "sm_80", out_dir), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_export_cuda(g, "sm_80", NULL), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "no output directory"));
    assert_int_equal(alloy_graph_export_cuda(g, "sm_1", out_dir), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "'sm_1'"));
    assert_false(exists(out_dir)); /* nothing written */
    if (nv) {
        assert_int_equal(alloy_graph_set_option(g, "cache_dir", cache_dir), ALLOY_OK);
        alloy_status st = alloy_graph_export_cuda(g, "sm_80", out_dir);
        if (st) fail_msg("%s", alloy_last_error(g));
        assert_true(exists(test_path_in(out_dir, "alloy_m0.sm_80.cubin")));
        assert_int_equal(count_files(cache_dir, ".kernel"), 1);
        /* the graph still runs on the CPU afterwards (the backend opens then) */
        float x[8 * 16] = {0};
        alloy_host_tensor feed = {"x", ALLOY_F32, 2, {8, 16}, x}, fetch = {.name = "y"};
        st = alloy_graph_run(g, &feed, 1, &fetch, 1);
        if (st) fail_msg("%s", alloy_last_error(g));
    }
    alloy_graph_free(g);
}

/* examples/ir/char_gpt_block.ir (one transformer block, its attention written out) with the option
 * device=dev set through the API (so it wins over the suites' ALLOY_DEVICE=cpu). */
static alloy_graph *block_on(const char *dev)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/char_gpt_block.ir", ALLOY_EXAMPLES_IR);
    alloy_graph *g = alloy_graph_load_ir(path, err, sizeof err);
    if (!g) fail_msg("%s", err);
    assert_int_equal(alloy_graph_set_option(g, "device", dev), ALLOY_OK);
    assert_int_equal(alloy_graph_set_option(g, "cache_dir", cache_dir), ALLOY_OK);
    return g;
}

/* Whether the export in out_dir has the attention op's kernel (the rewrite a GPU's compile makes). */
static bool exported_attention(void)
{
    size_t len;
    char *summary = (char *)test_read_file(test_path_in(out_dir, "summary.txt"), &len);
    bool found = strstr(summary, "_attention ") != NULL;
    test_free(summary);
    test_remove_dir(out_dir);
    return found;
}

/* An export is for a GPU: under device=auto on a machine without one it compiles with the GPU's choices
 * (the attention rewrite), not the CPU's, and drops that compile after, also when a run had compiled the
 * graph for the CPU first; device=cpu keeps the CPU's plan. */
static void test_an_export_under_device_auto_has_the_gpu_plan(void **state)
{
    (void)state;
    NEED_NVRTC();
    alloy_graph *g = block_on("auto");
    alloy_status st = alloy_graph_export_cuda(g, "sm_80", out_dir);
    if (st) fail_msg("%s", alloy_last_error(g));
    assert_true(exported_attention());
    assert_null(g->compiled); /* the next run compiles for its own device */

    /* compiled for the CPU (device=auto, no GPU) first: the CPU's plan has no attention op */
    assert_int_equal(graph_compile_ir(g), ALLOY_OK);
    assert_false(g->compiled_for_gpu);
    bool cpu_attention = false;
    for (int i = 0; i < g->compiled->nnodes; i++) cpu_attention |= g->compiled->nodes[i]->op == IR_OP_attention;
    assert_false(cpu_attention);
    st = alloy_graph_export_cuda(g, "sm_80", out_dir);
    if (st) fail_msg("%s", alloy_last_error(g));
    assert_true(exported_attention());
    assert_null(g->compiled);
    alloy_graph_free(g);

    g = block_on("cpu");
    st = alloy_graph_export_cuda(g, "sm_80", out_dir);
    if (st) fail_msg("%s", alloy_last_error(g));
    assert_false(exported_attention());
    assert_non_null(g->compiled); /* its own plan, kept */
    alloy_graph_free(g);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_modules_split_the_kernels_in_order_into_parts_of_at_most_64_that_differ_by_at_most_one),
        T(test_architecture_lists_parse_and_a_bad_item_is_named),
        T(test_an_export_writes_sources_binaries_and_a_summary_and_the_second_comes_from_the_cache),
        T(test_a_failing_compile_returns_the_log_and_the_source_path_and_leaves_no_binary),
        T(test_the_public_call_checks_its_arguments_and_reports_on_the_graph),
        T(test_an_export_under_device_auto_has_the_gpu_plan),
    };
    return cmocka_run_group_tests_name("export", tests, group_setup, group_teardown);
}
