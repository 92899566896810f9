/* test_codegen.c - the CUDA emitter: every emitted kernel of whole training steps compiled as host C++ and run under the CUDA emulation (tests/cuda_emu), its stored values against the CPU backend's. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloy/alloy.h"
#include "base/convert.h"
#include "codegen/cache.h"
#include "codegen/emit.h"
#include "codegen/export.h"
#include "codegen/nvrtc.h"
#include "cuda_emu/emu_loader.h"
#include "models.h"
#include "runtime/cpu/cpu.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})

static uint64_t rng = 7;

static double uniform(double lo, double hi)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (double)(rng >> 11) * 0x1p-53;
}

/* A compiled graph's feeds: random floats in [-1, 1), integers in [0, limit). */
typedef struct feed_set {
    alloy_host_tensor t[8];
    int n;
} feed_set;

static feed_set random_feeds(alloy_graph *g, int limit)
{
    feed_set f = {0};
    int n = alloy_graph_input_count(g);
    for (int i = 0; i < n && i < 8; i++) {
        alloy_host_tensor *t = &f.t[f.n++];
        assert_int_equal(alloy_graph_input_at(g, i, t), ALLOY_OK);
        int64_t count = alloy_host_tensor_numel(t);
        t->data = test_malloc(alloy_dtype_size(t->dtype) * (size_t)(count + 1));
        double *v = test_malloc(sizeof(double) * (size_t)(count + 1));
        for (int64_t k = 0; k < count; k++)
            v[k] = t->dtype == ALLOY_I32 || t->dtype == ALLOY_I64 ? (double)(int64_t)uniform(0, limit) : uniform(-1, 1);
        cvt_store_f64(t->dtype, v, t->data, (size_t)count);
        test_free(v);
    }
    return f;
}

static void free_feeds(feed_set *f)
{
    for (int i = 0; i < f->n; i++) test_free(f->t[i].data);
}

/* Largest |a - b| / max(|b|) over n elements of dtype dt (0 when equal; inf on a NaN mismatch). */
static double error_of(alloy_dtype dt, const void *a, const void *b, int64_t n)
{
    double *x = test_malloc(sizeof(double) * (size_t)(n + 1)), *y = test_malloc(sizeof(double) * (size_t)(n + 1));
    cvt_load_f64(dt, a, x, (size_t)n);
    cvt_load_f64(dt, b, y, (size_t)n);
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, isfinite(y[i]) ? fabs(y[i]) : 0);
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i]) || isnan(y[i]) || isinf(x[i]) || isinf(y[i])) {
            if (!(isnan(x[i]) && isnan(y[i])) && x[i] != y[i]) worst = INFINITY;
            continue;
        }
        worst = fmax(worst, fabs(x[i] - y[i]) / (scale > 0 ? scale : 1));
    }
    test_free(x), test_free(y);
    return worst;
}

/* Tolerance of an emulated value against the CPU's: kernels reduce rows in
 * another order (warp trees, not the CPU's pairwise sums); elementwise
 * members compute the same expressions and round the same way. */
static double tolerance(alloy_dtype dt)
{
    switch (dt) {
    case ALLOY_F32: return 2e-5;
    case ALLOY_F64: return 1e-12;
    case ALLOY_F16: return 4e-3;
    case ALLOY_BF16: return 3e-2;
    default: return 0;
    }
}

typedef struct emu_stats {
    int kernels, steps_emulated, steps_on_cpu, values, bitwise;
    double worst;
} emu_stats;

/* Runs compiled graph g's step once on the CPU (every value kept), then
 * every emitted kernel emulated, step by step on the CPU's values of the
 * step's inputs (a GEMM step's product from the CPU's matmul, as the library
 * would give it), comparing each value a kernel stores with the CPU's. */
static emu_stats emulate_step(alloy_graph *g, const feed_set *f)
{
    emu_stats st = {0};
    assert_int_equal(state_ensure(g), ALLOY_OK);
    const ir_graph *c = g->compiled;
    const schedule *s = &g->comp.sched;
    int nn = c->nnodes;
    rt_tensor *ref = test_calloc((size_t)nn + 1, sizeof(rt_tensor));
    bool *all = test_calloc((size_t)nn + 1, sizeof(bool));
    void **buf = test_calloc((size_t)nn + 1, sizeof(void *));
    for (int i = 0; i < nn; i++) {
        const ir_node *n = c->nodes[i];
        all[i] = true;
        buf[i] = test_calloc(ir_nbytes(&n->type) + 8, 1);
        if (n->op == IR_OP_input) {
            for (int k = 0; k < f->n; k++)
                if (strcmp(f->t[k].name, n->name) == 0) memcpy(buf[i], f->t[k].data, ir_nbytes(&n->type));
            ref[i].data = buf[i];
        } else if (n->op == IR_OP_param || n->op == IR_OP_state) {
            rt_state *sv = state_find(g, n->name);
            assert_non_null(sv);
            assert_int_equal(state_host(g, sv), ALLOY_OK);
            memcpy(buf[i], sv->host, ir_nbytes(&n->type));
            ref[i].data = buf[i];
        }
    }
    cpu_exec x = {.nthreads = 1};
    if (cpu_run_graph(&x, c, ref, all)) fail_msg("cpu: %s", x.error);
    cg_program prog;
    char err[4096];
    if (cg_emit(c, s, &prog, err, sizeof err)) fail_msg("emit: %s", err);
    st.kernels = prog.nkernels;
    /* every kernel in one library: one compile */
    char *module = cg_module_source(&prog, 0, prog.nkernels);
    assert_non_null(module);
    emu_kernel *ek = prog.nkernels ? emu_compile(module, prog.kernels[0].name, err, sizeof err) : NULL;
    al_free(module);
    if (prog.nkernels && !ek) fail_msg("%s", err);
    int next = 0; /* the next kernel, by step */
    for (int k = 0; k < s->nsteps; k++) {
        const sched_step *step = &s->steps[k];
        if (next >= prog.nkernels || prog.kernels[next].step != k) { /* a library call: the CPU's values */
            for (int m = step->first; m < step->first + step->n; m++) {
                int id = s->members[m].node;
                if (ref[id].data) memcpy(buf[id], ref[id].data, ir_nbytes(&c->nodes[id]->type));
            }
            st.steps_on_cpu++;
            continue;
        }
        st.steps_emulated++;
        /* each step on the CPU's values of its inputs: the kernels are compared on the same inputs */
        for (int i = 0; i < step->nin; i++) {
            int id = s->inputs[step->first_in + i];
            if (ref[id].data && ref[id].data != buf[id]) memcpy(buf[id], ref[id].data, ir_nbytes(&c->nodes[id]->type));
        }
        /* scratch of the step (a GEMM's product, per-row results, a flag), shared by its kernels */
        struct {
            cg_param_kind kind;
            int node;
            void *data;
        } scratch[8];
        int nscratch = 0;
        for (; next < prog.nkernels && prog.kernels[next].step == k; next++) {
            const cg_kernel *kn = &prog.kernels[next];
            void **ptrs = test_calloc((size_t)kn->nparams + 1, sizeof(void *));
            void **params = test_calloc((size_t)kn->nparams + 1, sizeof(void *));
            for (int p = 0; p < kn->nparams; p++) {
                const cg_param *pa = &kn->params[p];
                params[p] = &ptrs[p];
                if (pa->kind == CG_PARAM_NODE) {
                    ptrs[p] = buf[pa->node];
                    continue;
                }
                int q = 0;
                while (q < nscratch && !(scratch[q].kind == pa->kind && scratch[q].node == pa->node)) q++;
                if (q == nscratch) {
                    assert_true(nscratch < 8);
                    scratch[nscratch].kind = pa->kind, scratch[nscratch].node = pa->node;
                    if (pa->kind == CG_PARAM_PRODUCT) { /* the library GEMM's f32 product */
                        const ir_node *mm = c->nodes[pa->node];
                        rt_tensor out = {mm->type, test_calloc((size_t)ir_numel(&mm->type) + 1, sizeof(float))};
                        out.type.dtype = ALLOY_F32;
                        rt_tensor in[2] = {{c->nodes[mm->in[0]]->type, buf[mm->in[0]]},
                                           {c->nodes[mm->in[1]]->type, buf[mm->in[1]]}};
                        cpu_exec mx = {.nthreads = 1};
                        assert_int_equal(cpu_matmul(&mx, mm, &out, in), ALLOY_OK);
                        scratch[nscratch].data = out.data;
                    } else { /* per-row results, or a zeroed flag */
                        scratch[nscratch].data = test_calloc((size_t)(pa->count > 0 ? pa->count : 1) + 1, sizeof(double));
                    }
                    nscratch++;
                }
                ptrs[p] = scratch[q].data;
            }
            if (emu_select(ek, kn->name, err, sizeof err)) fail_msg("%s", err);
            unsigned grid[3] = {kn->grid, 1, 1}, block[3] = {kn->block, 1, 1};
            if (emu_launch(ek, grid, block, params, err, sizeof err)) fail_msg("%s: %s", kn->name, err);
            test_free(ptrs), test_free(params);
        }
        for (int q = 0; q < nscratch; q++) test_free(scratch[q].data);
        for (int m = step->first; m < step->first + step->n; m++) {
            int id = s->members[m].node;
            if (!(s->members[m].flags & MEMBER_STORED)) continue;
            const ir_node *n = c->nodes[id];
            int64_t count = ir_numel(&n->type);
            double e = error_of(n->type.dtype, buf[id], ref[id].data, count), tol = tolerance(n->type.dtype);
            st.values++;
            st.bitwise += memcmp(buf[id], ref[id].data, ir_nbytes(&n->type)) == 0;
            if (e > st.worst) st.worst = e;
            if (!(e <= tol))
                fail_msg("step %d (%s) %s %%%d (%s): error %.3g against the CPU", k, sched_kind_name(step->kind),
                         ir_ops[n->op].name, id, alloy_dtype_name(n->type.dtype), e);
        }
    }
    emu_free(ek);
    cg_program_free(&prog);
    cpu_release_values(c, ref);
    for (int i = 0; i < nn; i++) test_free(buf[i]);
    test_free(buf), test_free(ref), test_free(all);
    return st;
}

static void skip_without_emulation(void)
{
    char why[256];
    if (!emu_available(why, sizeof why)) {
        print_message("no host emulation: %s\n", why);
        skip();
    }
}

static void report(const char *what, const emu_stats *st)
{
    print_message("%s: %d kernels over %d steps emulated (%d steps by the CPU as library calls); %d stored values, "
                  "%d bit for bit, worst error %.2g\n",
                  what, st->kernels, st->steps_emulated, st->steps_on_cpu, st->values, st->bitwise, st->worst);
}

static void test_the_transformer_training_step_runs_emulated_as_on_the_cpu(void **state)
{
    (void)state;
    skip_without_emulation();
    static const alloy_dtype modes[] = {ALLOY_F32, ALLOY_F16, ALLOY_BF16};
    for (int m = 0; m < 3; m++) {
        alloy_graph *g = alloy_graph_new("block");
        alloy_graph_set_seed(g, 11);
        test_block b = build_transformer_block(g, ALLOY_F32, 2, 8, 13, 16, 2);
        assert_int_equal(alloy_graph_set_loss(g, b.loss), ALLOY_OK);
        if (modes[m] != ALLOY_F32) assert_int_equal(alloy_graph_enable_amp(g, modes[m]), ALLOY_OK);
        if (modes[m] == ALLOY_F16) assert_int_equal(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), ALLOY_OK);
        assert_int_equal(alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01)), ALLOY_OK);
        assert_int_equal(graph_compile(g), ALLOY_OK);
        feed_set f = random_feeds(g, 13);
        emu_stats st = emulate_step(g, &f);
        char what[64];
        snprintf(what, sizeof what, "transformer block, %s", modes[m] == ALLOY_F32 ? "fp32" : alloy_dtype_name(modes[m]));
        report(what, &st);
        assert_true(st.kernels > 10 && st.values > 10);
        free_feeds(&f);
        alloy_graph_free(g);
    }
}

/* Rows longer than a warp takes (a vocabulary of 3000 logits, a width of
 * 1100): row kernels with a block per row and block reductions. */
static void test_long_rows_run_emulated_as_on_the_cpu(void **state)
{
    (void)state;
    skip_without_emulation();
    static const struct {
        int vocab, dim, heads;
        alloy_dtype amp;
    } shapes[] = {{3000, 16, 2, ALLOY_F16}, {40, 1100, 2, ALLOY_F32}};
    for (int i = 0; i < 2; i++) {
        alloy_graph *g = alloy_graph_new("long");
        alloy_graph_set_seed(g, 5);
        test_block b = build_transformer_block(g, ALLOY_F32, 1, 3, shapes[i].vocab, shapes[i].dim, shapes[i].heads);
        assert_int_equal(alloy_graph_set_loss(g, b.loss), ALLOY_OK);
        if (shapes[i].amp != ALLOY_F32) {
            assert_int_equal(alloy_graph_enable_amp(g, shapes[i].amp), ALLOY_OK);
            assert_int_equal(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), ALLOY_OK);
        }
        assert_int_equal(alloy_graph_add_optimizer(g, alloy_sgd(1e-2, 0.9, 0.0, false)), ALLOY_OK);
        assert_int_equal(graph_compile(g), ALLOY_OK);
        feed_set f = random_feeds(g, shapes[i].vocab);
        emu_stats st = emulate_step(g, &f);
        char what[96];
        snprintf(what, sizeof what, "block, vocab %d, width %d, %s", shapes[i].vocab, shapes[i].dim,
                 shapes[i].amp == ALLOY_F32 ? "fp32" : alloy_dtype_name(shapes[i].amp));
        report(what, &st);
        assert_true(st.kernels > 10 && st.values > 10);
        free_feeds(&f);
        alloy_graph_free(g);
    }
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The training step of an example IR file in one precision, compiled. */
static alloy_graph *example_step(const char *file, alloy_dtype amp)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%s", ALLOY_EXAMPLES_IR, file);
    alloy_graph *g = alloy_graph_load_ir(path, err, sizeof err);
    if (!g) fail_msg("%s", err);
    assert_int_equal(alloy_graph_set_training(g, true), ALLOY_OK);
    if (amp != ALLOY_F32) assert_int_equal(alloy_graph_enable_amp(g, amp), ALLOY_OK);
    if (amp == ALLOY_F16) assert_int_equal(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), ALLOY_OK);
    assert_int_equal(alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01)), ALLOY_OK);
    if (graph_compile(g)) fail_msg("%s: %s", file, alloy_last_error(g));
    return g;
}

/* The training step of one GPT-2 small block (width 768, 12 heads, 1024
 * positions, a vocabulary of 50257; batch 4) with its head, compiled. */
static alloy_graph *gpt2_small_block_step(alloy_dtype amp)
{
    alloy_graph *g = alloy_graph_new("gpt2_small_block");
    test_block b = build_transformer_block(g, ALLOY_F32, 4, 1024, 50257, 768, 12);
    assert_int_equal(alloy_graph_set_loss(g, b.loss), ALLOY_OK);
    if (amp != ALLOY_F32) assert_int_equal(alloy_graph_enable_amp(g, amp), ALLOY_OK);
    if (amp == ALLOY_F16) assert_int_equal(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), ALLOY_OK);
    assert_int_equal(alloy_graph_add_optimizer(g, alloy_adamw(6e-4, 0.9, 0.95, 1e-8, 0.1)), ALLOY_OK);
    if (graph_compile(g)) fail_msg("gpt2 block: %s", alloy_last_error(g));
    return g;
}

/* Every kernel of programs[0..n), grouped into modules as the export and
 * the runtime group them (cg_module_range), for each of archs[0..narchs)
 * through a cache in dir; returns the milliseconds it took and fails on
 * any compile error. */
static double compile_all(const cg_nvrtc *nv, const char *dir, cg_program *programs, int n, const int *archs,
                          int narchs, int *modules, int *compiles)
{
    cg_cache *cache;
    char err[1024];
    if (cg_cache_open(dir, 64 << 20, 0, &cache, err, sizeof err)) fail_msg("cache: %s", err);
    int total = 0;
    for (int i = 0; i < n; i++) total += cg_module_count(programs[i].nkernels) * narchs;
    cg_kernel_src *ks = test_calloc((size_t)total + 1, sizeof *ks);
    cg_binary *out = test_calloc((size_t)total + 1, sizeof *out);
    char **sources = test_calloc((size_t)total + 1, sizeof *sources), (*names)[32] = test_calloc((size_t)total + 1, 32);
    int at = 0;
    for (int i = 0; i < n; i++)
        for (int m = 0; m < cg_module_count(programs[i].nkernels); m++)
            for (int a = 0; a < narchs; a++) {
                int first, count;
                cg_module_range(programs[i].nkernels, m, &first, &count);
                sources[at] = cg_module_source(&programs[i], first, count);
                assert_non_null(sources[at]);
                snprintf(names[at], 32, "alloy_p%d_m%d", i, m);
                ks[at] = (cg_kernel_src){.name = names[at], .source = sources[at], .sm = archs[a]};
                at++;
            }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double t0 = now_ms();
    cg_cache_compile_many(cache, nv, ks, total, cores > 1 ? (int)cores : 1, NULL, out);
    double ms = now_ms() - t0;
    for (int i = 0; i < total; i++) {
        if (out[i].status) fail_msg("%s for sm_%d: %s", ks[i].name, ks[i].sm, out[i].message ? out[i].message : "failed");
        assert_true(out[i].size > 0 && out[i].kind == CG_CUBIN);
        assert_memory_equal(out[i].data, "\x7f" "ELF", 4);
        cg_binary_free(&out[i]);
        al_free(sources[i]);
    }
    *modules = total;
    *compiles = (int)cg_cache_get_stats(cache).compiles;
    cg_cache_close(cache);
    test_free(ks), test_free(out), test_free(sources), test_free(names);
    return ms;
}

static void test_every_kernel_of_the_example_training_steps_compiles_for_sm80_and_sm90(void **state)
{
    (void)state;
    cg_nvrtc *nv;
    char err[1024];
    if (cg_nvrtc_open(NULL, &nv, err, sizeof err)) {
        print_message("no NVRTC: %s\n", err);
        skip();
    }
    static const char *const files[] = {"char_gpt.ir", "mlp_classifier.ir"};
    static const alloy_dtype modes[] = {ALLOY_F32, ALLOY_F16, ALLOY_BF16};
    cg_program programs[9];
    int n = 0, kernels = 0, skipped = 0;
    for (int f = 0; f < 3; f++)
        for (int m = 0; m < 3; m++) {
            alloy_graph *g = f < 2 ? example_step(files[f], modes[m]) : gpt2_small_block_step(modes[m]);
            if (cg_emit(g->compiled, &g->comp.sched, &programs[n], err, sizeof err)) fail_msg("%s", err);
            for (int i = 0; i < programs[n].nskipped; i++) { /* only GEMMs are left to a library */
                const ir_node *last = g->compiled->nodes[g->comp.sched.steps[programs[n].skipped[i]].pos];
                if (last->op != IR_OP_matmul) fail_msg("%s: no kernel for %s: %s", f < 2 ? files[f] : "gpt2 block",
                                                      ir_ops[last->op].name, programs[n].why[i]);
            }
            kernels += programs[n].nkernels, skipped += programs[n].nskipped;
            n++;
            alloy_graph_free(g);
        }
    char dir[] = "/tmp/alloy-kcache-XXXXXX", cmd_rm[128];
    assert_non_null(mkdtemp(dir));
    static const int archs[] = {80, 90};
    int modules, compiles;
    double cold = compile_all(nv, dir, programs, n, archs, 2, &modules, &compiles);
    assert_int_equal(compiles, modules);
    double warm = compile_all(nv, dir, programs, n, archs, 2, &modules, &compiles);
    assert_int_equal(compiles, 0); /* every module from the disk cache the second time */
    print_message("char_gpt, mlp_classifier and GPT-2 small block training steps (fp32, f16, bf16): %d kernels (%d steps left to "
                  "libraries) in %d NVRTC programs for sm_80 and sm_90: cold %.0f ms, warm from the disk cache %.1f ms\n",
                  kernels, skipped, modules, cold, warm);
    /* the char_gpt f16 AMP step alone, for one architecture, as a run compiles it */
    char dir2[] = "/tmp/alloy-kcache-XXXXXX";
    assert_non_null(mkdtemp(dir2));
    cold = compile_all(nv, dir2, &programs[1], 1, &archs[1], 1, &modules, &compiles);
    warm = compile_all(nv, dir2, &programs[1], 1, &archs[1], 1, &modules, &compiles);
    print_message("char_gpt f16 AMP training step: %d kernels in %d programs for sm_90: cold %.0f ms, warm %.1f ms\n",
                  programs[1].nkernels, modules, cold, warm);
    snprintf(cmd_rm, sizeof cmd_rm, "rm -rf '%s'", dir2);
    assert_int_equal(system(cmd_rm), 0);
    for (int i = 0; i < n; i++) cg_program_free(&programs[i]);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    cg_nvrtc_close(nv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kernel_of_the_example_training_steps_compiles_for_sm80_and_sm90),
        cmocka_unit_test(test_the_transformer_training_step_runs_emulated_as_on_the_cpu),
        cmocka_unit_test(test_long_rows_run_emulated_as_on_the_cpu),
    };
    return cmocka_run_group_tests_name("codegen", tests, test_checked_alloc, test_plain_alloc);
}
