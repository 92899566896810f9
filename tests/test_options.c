/* test_options.c - the options struct: names and values checked (errors list the valid ones), environment under API, printed and hashed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/alloy.h"
#include "ir/groups.h"
#include "step/options.h"
#include "passes/pass.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"


static void clear_env(void)
{
    for (const opt_key *k = opt_keys; k->name; k++) unsetenv(k->env);
}

static int setup(void **state)
{
    clear_env();
    return test_checked_alloc(state);
}

static int teardown(void **state)
{
    clear_env();
    return test_plain_alloc(state);
}

/* y = relu(x + 1) over x: f32[4]. */
static alloy_graph *tiny_graph(void)
{
    alloy_graph *g = alloy_graph_new("tiny");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 1, DIMS(4));
    alloy_output(g, "y", alloy_relu(g, alloy_add(g, x, alloy_scalar(g, ALLOY_F32, 1.0))));
    return g;
}

static alloy_status run_tiny(alloy_graph *g, float *y)
{
    float xs[4] = {-3, -1, 0, 2};
    alloy_host_tensor feed = {"x", ALLOY_F32, 1, {4}, xs}, fetch = {.name = "y"};
    alloy_status st = alloy_graph_run(g, &feed, 1, &fetch, 1);
    if (!st) memcpy(y, fetch.data, sizeof(float) * 4);
    return st;
}

static void test_every_option_parses_its_documented_values_and_resets_on_empty(void **state)
{
    (void)state;
    al_options o, d;
    opt_init(&o);
    opt_init(&d);
    char err[512];
    assert_int_equal(opt_set(&o, "print_after", "amp,fuse", err, sizeof err), ALLOY_OK);
    int amp = -1, fuse = -1;
    for (int i = 0; i < pass_count(); i++) {
        if (strcmp(pass_name(i), "amp") == 0) amp = i;
        if (strcmp(pass_name(i), "fuse") == 0) fuse = i;
    }
    assert_true(amp >= 0 && fuse >= 0);
    assert_int_equal(o.print_after, (1u << amp) | (1u << fuse));
    assert_int_equal(opt_set(&o, "print_before", "all", err, sizeof err), ALLOY_OK);
    assert_int_equal(o.print_before, (1u << pass_count()) - 1);
    assert_int_equal(opt_set(&o, "disable_passes", " simplify , fuse ", err, sizeof err), ALLOY_OK);
    assert_int_not_equal(o.disabled, 0);
    assert_int_equal(opt_set(&o, "no_fuse", "row,gemm", err, sizeof err), ALLOY_OK);
    assert_int_equal(o.no_fuse, (1u << IR_GROUP_ROW) | (1u << IR_GROUP_GEMM));
    assert_int_equal(opt_set(&o, "no_fuse", "1", err, sizeof err), ALLOY_OK);
    assert_int_equal(o.no_fuse, OPT_NO_FUSE_ALL);
    assert_int_equal(opt_set(&o, "amp_log", "1", err, sizeof err), ALLOY_OK);
    assert_true(o.amp_log);
    assert_int_equal(opt_set(&o, "blas", "0", err, sizeof err), ALLOY_OK);
    assert_false(o.blas);
    assert_int_equal(opt_set(&o, "num_threads", "3", err, sizeof err), ALLOY_OK);
    assert_int_equal(o.num_threads, 3);
    assert_int_equal(opt_set(&o, "device", "cpu", err, sizeof err), ALLOY_OK);
    assert_int_equal(o.device, OPT_DEVICE_CPU);
    assert_true(o.cache); /* on by default */
    assert_int_equal(opt_set(&o, "cache", "off", err, sizeof err), ALLOY_OK);
    assert_false(o.cache);
    assert_int_equal(opt_set(&o, "cache_dir", "/var/tmp/alloy kernels", err, sizeof err), ALLOY_OK);
    assert_string_equal(o.cache_dir, "/var/tmp/alloy kernels");
    assert_int_equal(opt_set(&o, "dump_dir", "dump", err, sizeof err), ALLOY_OK);
    assert_string_equal(o.dump_dir, "dump");
    assert_int_equal(opt_set(&o, "dump_dir", "a/longer/dump/dir", err, sizeof err), ALLOY_OK);
    assert_int_equal(opt_set(&o, "dump_dir", "d", err, sizeof err), ALLOY_OK); /* no tail of the longer one left */
    assert_int_equal(o.dump_dir[2], '\0');
    assert_int_equal(opt_set(&o, "nvrtc", "/opt/cuda/lib64/libnvrtc.so.13", err, sizeof err), ALLOY_OK);
    assert_string_equal(o.nvrtc, "/opt/cuda/lib64/libnvrtc.so.13");
    assert_true(o.cuda_graph); /* on by default */
    assert_int_equal(opt_set(&o, "cuda_graph", "0", err, sizeof err), ALLOY_OK);
    assert_false(o.cuda_graph);
    assert_int_equal(opt_set(&o, "cuda_graph", "sometimes", err, sizeof err), ALLOY_ERR_INVALID);
    assert_false(o.cuda_graph);
    /* cuda_gemm_f32: off by default; it changes which kernels a step has, so the hash */
    assert_false(o.cuda_gemm_f32);
    uint64_t narrow = opt_hash(&o);
    assert_int_equal(opt_set(&o, "cuda_gemm_f32", "1", err, sizeof err), ALLOY_OK);
    assert_true(o.cuda_gemm_f32);
    assert_true(opt_hash(&o) != narrow);
    assert_int_equal(opt_set(&o, "cuda_gemm_f32", "maybe", err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "cuda_gemm_f32=maybe: not a boolean"));
    assert_int_equal(opt_set(&o, "cuda_gemm_f32", "0", err, sizeof err), ALLOY_OK);
    assert_true(opt_hash(&o) == narrow);
    /* cuda_device: auto (-1: the local rank of a data-parallel rank, else 0) or an ordinal; nccl: a path;
     * where the step runs, not what it is: not in the hash */
    uint64_t before = opt_hash(&o);
    assert_int_equal(o.cuda_device, -1);
    assert_int_equal(opt_set(&o, "cuda_device", "3", err, sizeof err), ALLOY_OK);
    assert_int_equal(o.cuda_device, 3);
    assert_int_equal(opt_set(&o, "cuda_device", "-1", err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "cuda_device=-1: not auto or a GPU's ordinal from 0 to 1023"));
    assert_int_equal(opt_set(&o, "cuda_device", "gpu1", err, sizeof err), ALLOY_ERR_INVALID);
    assert_int_equal(o.cuda_device, 3);
    assert_int_equal(opt_set(&o, "nccl", "/opt/nccl/libnccl.so.2", err, sizeof err), ALLOY_OK);
    assert_string_equal(o.nccl, "/opt/nccl/libnccl.so.2");
    assert_true(opt_hash(&o) == before);
    assert_int_equal(opt_set(&o, "cuda_device", "auto", err, sizeof err), ALLOY_OK);
    assert_int_equal(o.cuda_device, -1);
    assert_int_equal(opt_set(&o, "nccl", "", err, sizeof err), ALLOY_OK);
    assert_false(o.time_passes); /* off by default; printing only: not in the hash */
    uint64_t hash = opt_hash(&o);
    assert_int_equal(opt_set(&o, "time_passes", "1", err, sizeof err), ALLOY_OK);
    assert_true(o.time_passes);
    assert_true(opt_hash(&o) == hash);
    /* profile: 0, on (every run) or every N-th run; printing only: not in the hash */
    assert_int_equal(opt_set(&o, "profile", "1", err, sizeof err), ALLOY_OK);
    assert_int_equal(o.profile, 1);
    assert_int_equal(opt_set(&o, "profile", "20", err, sizeof err), ALLOY_OK);
    assert_int_equal(o.profile, 20);
    assert_true(opt_hash(&o) == hash);
    assert_int_equal(opt_set(&o, "profile", "-2", err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "profile=-2"));
    assert_int_equal(opt_set(&o, "profile", "often", err, sizeof err), ALLOY_ERR_INVALID);
    assert_int_equal(o.profile, 20);
    /* "" restores each default */
    for (const opt_key *k = opt_keys; k->name; k++)
        assert_int_equal(opt_set(&o, k->name, "", err, sizeof err), ALLOY_OK);
    assert_memory_equal(&o, &d, sizeof o);
}

/* lowp_gemm names a CPU f16/bf16 GEMM kernel: each parses, prints in dumps
 * and changes the hash; a misspelt one is an error listing them; empty resets. */
static void test_lowp_gemm_takes_the_kernel_names(void **state)
{
    (void)state;
    static const char *const names[] = {"auto", "avx512_bf16", "avx512", "portable", "sgemm", "avx2"};
    char err[256], text[256];
    for (int i = 0; i < 5; i++) {
        al_options o, d;
        opt_init(&o);
        opt_init(&d);
        assert_int_equal(opt_set(&o, "lowp_gemm", names[i], err, sizeof err), ALLOY_OK);
        assert_int_equal(o.lowp_gemm, (opt_lowp_gemm)i);
        FILE *f = fmemopen(text, sizeof text, "w");
        assert_non_null(f);
        opt_print(&o, f);
        fputc('\0', f);
        fclose(f);
        char want[64];
        snprintf(want, sizeof want, "lowp_gemm=%s", names[i]);
        assert_true((strstr(text, want) != NULL) == (i != 0));
        assert_true((opt_hash(&o) == opt_hash(&d)) == (i == 0));
        assert_int_equal(opt_set(&o, "lowp_gemm", "", err, sizeof err), ALLOY_OK);
        assert_int_equal(o.lowp_gemm, OPT_LOWP_AUTO);
    }
    al_options o;
    opt_init(&o);
    assert_int_equal(opt_set(&o, "lowp_gemm", "amx", err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "lowp_gemm=amx"));
    assert_non_null(strstr(err, "avx512_bf16"));
    assert_int_equal(o.lowp_gemm, OPT_LOWP_AUTO);
}

static void test_an_unknown_pass_kind_option_or_value_is_an_error_that_lists_the_valid_ones(void **state)
{
    (void)state;
    al_options o, before;
    opt_init(&o);
    o.num_threads = 2;
    before = o;
    char err[768];
    assert_int_equal(opt_set(&o, "print_after", "amp,fsue", err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "unknown pass 'fsue'"));
    assert_non_null(strstr(err, "autodiff"));
    assert_non_null(strstr(err, "fuse"));
    assert_int_equal(opt_set(&o, "disable_passes", "all", err, sizeof err), ALLOY_ERR_INVALID);
    assert_int_equal(opt_set(&o, "no_fuse", "rows", err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "unknown fusion kind 'rows'"));
    assert_non_null(strstr(err, "row, gemm, multi"));
    assert_int_equal(opt_set(&o, "num_threads", "0", err, sizeof err), ALLOY_ERR_INVALID);
    assert_int_equal(opt_set(&o, "num_threads", "2x", err, sizeof err), ALLOY_ERR_INVALID);
    assert_int_equal(opt_set(&o, "amp_log", "maybe", err, sizeof err), ALLOY_ERR_INVALID);
    assert_int_equal(opt_set(&o, "device", "tpu", err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "auto, cpu or cuda"));
    assert_int_equal(opt_set(&o, "cache", "sometimes", err, sizeof err), ALLOY_ERR_INVALID);
    char *long_path = test_malloc(OPT_PATH_MAX + 1);
    memset(long_path, 'd', OPT_PATH_MAX);
    long_path[OPT_PATH_MAX] = '\0';
    assert_int_equal(opt_set(&o, "cache_dir", long_path, err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "at most 1023"));
    long_path[OPT_PATH_MAX - 1] = '\0'; /* 1023 bytes fit */
    al_options fits = o;
    assert_int_equal(opt_set(&fits, "dump_dir", long_path, err, sizeof err), ALLOY_OK);
    test_free(long_path);
    assert_int_equal(opt_set(&o, "no_such_option", "1", err, sizeof err), ALLOY_ERR_INVALID);
    assert_non_null(strstr(err, "num_threads"));
    assert_non_null(strstr(err, "cache_dir"));
    assert_non_null(strstr(err, "dump_dir"));
    assert_memory_equal(&o, &before, sizeof o); /* a failed set changes nothing */
}

static void test_a_misspelt_environment_value_fails_the_compile_naming_the_variable(void **state)
{
    (void)state;
    setenv("ALLOY_PRINT_AFTER", "fsue", 1);
    alloy_graph *g = tiny_graph();
    float y[4];
    assert_int_equal(run_tiny(g, y), ALLOY_ERR_INVALID);
    const char *msg = alloy_last_error(g);
    assert_non_null(strstr(msg, "ALLOY_PRINT_AFTER"));
    assert_non_null(strstr(msg, "unknown pass 'fsue'"));
    /* the API's setting wins over the environment: print nothing, run */
    assert_int_equal(alloy_graph_set_option(g, "print_after", "verify"), ALLOY_OK);
    FILE *sink = tmpfile();
    assert_non_null(sink);
    assert_int_equal(alloy_graph_print_after(g, "verify", sink), ALLOY_OK);
    assert_int_equal(run_tiny(g, y), ALLOY_OK);
    assert_true(y[0] == 0 && y[1] == 0 && y[2] == 1 && y[3] == 3);
    fclose(sink);
    alloy_graph_free(g);
    unsetenv("ALLOY_PRINT_AFTER");
}

static void test_a_misspelt_pass_or_kind_in_any_environment_variable_fails_the_compile(void **state)
{
    (void)state;
    static const struct {
        const char *env, *value, *message;
    } cases[] = {
        {"ALLOY_DISABLE_PASSES", "simplify,fsue",
         "ALLOY_DISABLE_PASSES: disable_passes=simplify,fsue: unknown pass 'fsue' (passes: verify, random, lower_norm, attention, amp"},
        {"ALLOY_PRINT_BEFORE", "all,", NULL}, /* "all" with an empty word is not a pass list */
        {"ALLOY_PRINT_AFTER", "amp, plna", "ALLOY_PRINT_AFTER: print_after=amp, plna: unknown pass 'plna'"},
        {"ALLOY_NO_FUSE", "gemm,rows", "ALLOY_NO_FUSE: no_fuse=gemm,rows: unknown fusion kind 'rows' (kinds: row, gemm"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        setenv(cases[i].env, cases[i].value, 1);
        alloy_graph *g = tiny_graph();
        float y[4];
        alloy_status st = run_tiny(g, y);
        if (cases[i].message && (st != ALLOY_ERR_INVALID || !strstr(alloy_last_error(g), cases[i].message)))
            test_case_failed("%s=%s: status %d, '%s'", cases[i].env, cases[i].value, st, alloy_last_error(g));
        if (!cases[i].message && st == ALLOY_OK) test_case_failed("%s=%s ran", cases[i].env, cases[i].value);
        alloy_graph_free(g);
        unsetenv(cases[i].env);
    }
    test_end_cases();
}

/* A training step: loss = mean((x @ w)^2), f16 AMP when amp, a dynamic
 * loss scaler when scaled, SGD. */
static alloy_graph *training_step(bool amp, bool scaled)
{
    alloy_graph *g = alloy_graph_new("step");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(4, 3));
    alloy_tensor *w = alloy_param(g, "w", ALLOY_F32, 2, DIMS(3, 2), alloy_init_normal(0.5));
    alloy_tensor *loss = alloy_reduce_mean(g, alloy_square(g, alloy_matmul(g, x, w, false, false)), 0, NULL, false);
    expect_ok(g, alloy_graph_set_loss(g, loss), "set_loss");
    if (amp) expect_ok(g, alloy_graph_enable_amp(g, ALLOY_F16), "enable_amp");
    if (scaled) expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0, 0, false)), "add_optimizer");
    return g;
}

static void test_disabling_a_pass_the_training_step_needs_is_an_error_naming_it(void **state)
{
    (void)state;
    static const struct {
        bool amp, scaled;
        const char *disabled, *message; /* NULL: the step runs */
    } cases[] = {
        {true, true, "grad_scaler",
         "disable_passes=grad_scaler: the graph trains with a dynamic loss scaler, and grad_scaler unscales the "
         "gradients and skips inf/NaN steps (without it they reach the parameters); remove grad_scaler from "
         "disable_passes (ALLOY_DISABLE_PASSES) or set no loss scaler"},
        {false, true, "simplify,grad_scaler", "disable_passes=grad_scaler: the graph trains with a dynamic loss scaler"},
        {true, true, "autodiff", "disable_passes=autodiff: the graph trains (it has a loss), and the gradients come from autodiff"},
        {false, false, "optimizer", "disable_passes=optimizer: the graph has an optimizer, and that pass is what updates"},
        {false, false, "grad_scaler", NULL}, /* nothing to unscale: the pass does nothing */
        {true, true, "amp", NULL},           /* an f32 step, scaled: right, only slower */
        {true, true, "verify,simplify,dce,fuse", NULL},
    };
    /* small inputs: the scaled loss (about 500) stays finite in f16, so no step is skipped */
    float xs[12] = {0.01f, 0.02f, 0.03f, 0.04f, 0.05f, 0.06f, 0.07f, 0.08f, 0.09f, 0.1f, 0.11f, 0.12f};
    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {4, 3}, xs};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        alloy_graph *g = training_step(cases[i].amp, cases[i].scaled);
        expect_ok(g, alloy_graph_set_option(g, "disable_passes", cases[i].disabled), "set_option");
        alloy_status st = alloy_graph_run(g, &feed, 1, NULL, 0);
        const char *msg = alloy_last_error(g);
        if (cases[i].message && (st != ALLOY_ERR_INVALID || !strstr(msg, cases[i].message)))
            test_case_failed("disable %s: status %d, '%s' (want '%s')", cases[i].disabled, st, msg, cases[i].message);
        alloy_step_info info;
        if (!cases[i].message && (st || alloy_graph_step_info(g, &info) || !info.updated || info.step != 1))
            test_case_failed("disable %s: status %d, '%s'", cases[i].disabled, st, msg);
        alloy_graph_free(g);
    }
    test_end_cases();
}

static void test_set_option_rejects_bad_values_and_keeps_the_graph_usable(void **state)
{
    (void)state;
    alloy_graph *g = tiny_graph();
    assert_int_equal(alloy_graph_set_option(g, "no_fuse", "everything"), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "row, gemm, multi"));
    assert_int_equal(alloy_graph_set_option(g, "bogus", "1"), ALLOY_ERR_INVALID);
    assert_int_equal(alloy_graph_set_option(NULL, "blas", "1"), ALLOY_ERR_INVALID);
    float y[4];
    alloy_status st = run_tiny(g, y);
    if (st) fail_msg("%s", alloy_last_error(g));
    assert_int_equal(alloy_graph_set_option(g, "device", "cuda"), ALLOY_OK);
    assert_int_equal(run_tiny(g, y), ALLOY_ERR_UNSUPPORTED);
    assert_non_null(strstr(alloy_last_error(g), "cuda"));
    assert_int_equal(alloy_graph_set_option(g, "device", NULL), ALLOY_OK); /* back to auto */
    assert_int_equal(run_tiny(g, y), ALLOY_OK);
    alloy_graph_free(g);
}

static void test_dumps_print_the_options_and_the_hash_follows_what_changes_code(void **state)
{
    (void)state;
    al_options a, b;
    opt_init(&a);
    opt_init(&b);
    char err[256], text[512];
    FILE *f = fmemopen(text, sizeof text, "w");
    assert_non_null(f);
    opt_print(&a, f);
    fflush(f);
    assert_string_equal(text, "# options: defaults\n");
    assert_int_equal(opt_set(&b, "print_after", "all", err, sizeof err), ALLOY_OK);
    assert_true(opt_hash(&a) == opt_hash(&b)); /* printing changes no code */
    assert_int_equal(opt_set(&b, "no_fuse", "gemm", err, sizeof err), ALLOY_OK);
    assert_int_equal(opt_set(&b, "num_threads", "2", err, sizeof err), ALLOY_OK);
    assert_true(opt_hash(&a) != opt_hash(&b));
    rewind(f);
    opt_print(&b, f);
    fputc('\0', f);
    fclose(f);
    assert_non_null(strstr(text, "no_fuse=gemm"));
    assert_non_null(strstr(text, "num_threads=2"));
    assert_non_null(strstr(text, "print_after=verify,random,lower_norm,attention,amp"));
}

static void test_the_cache_and_dump_options_print_when_set_and_change_no_hash(void **state)
{
    (void)state;
    al_options a, b;
    opt_init(&a);
    opt_init(&b);
    char err[256], text[512];
    assert_int_equal(opt_set(&b, "cache", "0", err, sizeof err), ALLOY_OK);
    assert_int_equal(opt_set(&b, "cache_dir", "/tmp/kc", err, sizeof err), ALLOY_OK);
    assert_int_equal(opt_set(&b, "dump_dir", "/tmp/dump", err, sizeof err), ALLOY_OK);
    assert_int_equal(opt_set(&b, "nvrtc", "/x/libnvrtc.so", err, sizeof err), ALLOY_OK);
    assert_true(opt_hash(&a) == opt_hash(&b)); /* where code goes, not what it is (NVRTC's build is in kernel keys) */
    FILE *f = fmemopen(text, sizeof text, "w");
    assert_non_null(f);
    opt_print(&b, f);
    fputc('\0', f);
    fclose(f);
    assert_string_equal(text, "# options: cache=0 cache_dir=/tmp/kc dump_dir=/tmp/dump nvrtc=/x/libnvrtc.so\n");
    /* reset, they print as defaults again (the strings compare whole) */
    assert_int_equal(opt_set(&b, "cache", "", err, sizeof err), ALLOY_OK);
    assert_int_equal(opt_set(&b, "cache_dir", "", err, sizeof err), ALLOY_OK);
    assert_int_equal(opt_set(&b, "dump_dir", "", err, sizeof err), ALLOY_OK);
    assert_int_equal(opt_set(&b, "nvrtc", "", err, sizeof err), ALLOY_OK);
    f = fmemopen(text, sizeof text, "w");
    assert_non_null(f);
    opt_print(&b, f);
    fputc('\0', f);
    fclose(f);
    assert_string_equal(text, "# options: defaults\n");
}

static void test_the_cache_directory_comes_from_the_option_then_xdg_then_home(void **state)
{
    (void)state;
    const char *home = getenv("HOME"), *xdg = getenv("XDG_CACHE_HOME");
    char *saved_home = home ? strdup(home) : NULL, *saved_xdg = xdg ? strdup(xdg) : NULL;
    alloy_graph *g = tiny_graph();
    al_options cfg;
    char dir[OPT_PATH_MAX + 16];
    setenv("HOME", "/home/someone", 1);
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    assert_int_equal(graph_options(g, &cfg), ALLOY_OK);
    assert_int_equal(graph_cache_dir(g, &cfg, dir, sizeof dir), ALLOY_OK);
    assert_string_equal(dir, "/xdg/alloy");
    setenv("XDG_CACHE_HOME", "relative", 1); /* the XDG rule: not absolute, ignored */
    assert_int_equal(graph_cache_dir(g, &cfg, dir, sizeof dir), ALLOY_OK);
    assert_string_equal(dir, "/home/someone/.cache/alloy");
    unsetenv("HOME");
    assert_int_equal(graph_cache_dir(g, &cfg, dir, sizeof dir), ALLOY_OK);
    assert_string_equal(dir, ""); /* a cache in memory only */
    setenv("ALLOY_CACHE_DIR", "/from/env", 1);
    assert_int_equal(graph_options(g, &cfg), ALLOY_OK);
    assert_int_equal(graph_cache_dir(g, &cfg, dir, sizeof dir), ALLOY_OK);
    assert_string_equal(dir, "/from/env");
    assert_int_equal(alloy_graph_set_option(g, "cache_dir", "/from/api"), ALLOY_OK); /* the API wins */
    setenv("ALLOY_CACHE", "0", 1);
    assert_int_equal(graph_options(g, &cfg), ALLOY_OK);
    assert_int_equal(graph_cache_dir(g, &cfg, dir, sizeof dir), ALLOY_OK);
    assert_string_equal(dir, "/from/api");
    assert_false(cfg.cache);
    setenv("ALLOY_CACHE", "sometimes", 1);
    assert_int_equal(graph_options(g, &cfg), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "ALLOY_CACHE"));
    alloy_graph_free(g);
    if (saved_home) setenv("HOME", saved_home, 1);
    if (saved_xdg) setenv("XDG_CACHE_HOME", saved_xdg, 1);
    else unsetenv("XDG_CACHE_HOME");
    free(saved_home), free(saved_xdg);
}

/* An ALLOY_ variable alloy does not read (a misspelling) is named in a
 * warning with the nearest name; every variable alloy, its tools and tests
 * read passes (it was silently ignored). */
static void test_an_unknown_alloy_variable_is_warned_about_with_the_nearest_name(void **state)
{
    (void)state;
    static const char *const known[] = {"ALLOY_NO_FUSE", "ALLOY_DEVICE", "ALLOY_NUM_THREADS", "ALLOY_PRINT_AFTER",
                                        "ALLOY_AMP_ALLOWLIST_ADD", "ALLOY_AMP_CLEARLIST_REMOVE", "ALLOY_CACHE_DIR",
                                        "ALLOY_GOLDEN_UPDATE", "ALLOY_CI_ASAN", "ALLOY_CI_FUZZ_SECONDS", "ALLOY_PROFILE"};
    char *saved[sizeof known / sizeof *known];
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        const char *v = getenv(known[i]);
        saved[i] = v ? strdup(v) : NULL;
        setenv(known[i], v ? v : "", 1);
    }
    setenv("ALLOY_NO_FUES", "1", 1);
    setenv("ALLOY_ZZZZZZZZZZZZ", "1", 1);
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(graph_env_unknown(f), 2);
    char text[1024] = "";
    rewind(f);
    size_t got = fread(text, 1, sizeof text - 1, f);
    text[got] = '\0';
    fclose(f);
    assert_non_null(strstr(text, "alloy: warning: ALLOY_NO_FUES is not a variable alloy reads (did you mean "
                                 "ALLOY_NO_FUSE?); it is ignored"));
    assert_non_null(strstr(text, "alloy: warning: ALLOY_ZZZZZZZZZZZZ is not a variable alloy reads; it is ignored"));
    unsetenv("ALLOY_NO_FUES");
    unsetenv("ALLOY_ZZZZZZZZZZZZ");
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        if (saved[i]) setenv(known[i], saved[i], 1);
        else unsetenv(known[i]);
        free(saved[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_option_parses_its_documented_values_and_resets_on_empty),
        cmocka_unit_test(test_an_unknown_alloy_variable_is_warned_about_with_the_nearest_name),
        cmocka_unit_test(test_lowp_gemm_takes_the_kernel_names),
        cmocka_unit_test(test_an_unknown_pass_kind_option_or_value_is_an_error_that_lists_the_valid_ones),
        cmocka_unit_test(test_a_misspelt_environment_value_fails_the_compile_naming_the_variable),
        cmocka_unit_test(test_a_misspelt_pass_or_kind_in_any_environment_variable_fails_the_compile),
        cmocka_unit_test(test_disabling_a_pass_the_training_step_needs_is_an_error_naming_it),
        cmocka_unit_test(test_set_option_rejects_bad_values_and_keeps_the_graph_usable),
        cmocka_unit_test(test_dumps_print_the_options_and_the_hash_follows_what_changes_code),
        cmocka_unit_test(test_the_cache_and_dump_options_print_when_set_and_change_no_hash),
        cmocka_unit_test(test_the_cache_directory_comes_from_the_option_then_xdg_then_home),
    };
    return cmocka_run_group_tests_name("options", tests, setup, teardown);
}
