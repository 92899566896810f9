/* test_attn_views.c - attention reading q, k, v through strides out of a fused projection, writing o in its transpose's order and dq, dk, dv into the concat's rows: no layout copy left in the plan, the same bits as the copies on the CPU and on the emulated device, and the emulated device against the CPU. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "alloy/alloy.h"
#include "cuda_emu/emu_device.h"
#include "cuda_emu/emu_loader.h"
#include "runtime/backend.h"
#include "runtime/graph/graph_impl.h"
#include "step/attn_views.h"
#include "support.h"

/* Batch, context, heads, head dim: C = H * D, the projection [B*T, 3C].
 * T over 64: the tensor-core backward sums dq over two key blocks in its
 * contiguous f32 accumulator and its dq kernel writes the concat's rows. */
enum { B = 2, T = 72, H = 2, D = 16, C = H * D, N = B * T };

/* One configuration's data: x [N, C], w [C, 3C], r [N, C] (loss = sum(y * y * r)). */
typedef struct data {
    alloy_dtype dt;
    void *x, *w, *r;
} data;

/* What a run gives back: y [N, C], grad:x [N, C], grad:w [C, 3C], as doubles. */
typedef struct result {
    double *y, *gx, *gw;
} result;

/* [N, C] -> [B, H, T, D] (perm [0, 2, 1, 3]); `bypass` multiplies by 1
 * after it (exact), a reader that needs the copy. */
static alloy_tensor *heads(alloy_graph *g, alloy_tensor *x, alloy_tensor *one)
{
    x = alloy_transpose(g, alloy_reshape(g, x, 4, (int64_t[]){B, T, H, D}), (int64_t[]){0, 2, 1, 3});
    return one ? alloy_mul(g, x, one) : x;
}

/* The multi-head pattern: qkv = x w, q/k/v its three column blocks split
 * into heads, attention, the heads joined back to [N, C]; bypass: the same
 * values through exact multiplications by 1 that keep every copy. */
static alloy_graph *build(alloy_dtype dt, bool causal, bool bypass, const char *device)
{
    alloy_graph *g = alloy_graph_new("attn_views");
    alloy_tensor *x = alloy_input(g, "x", dt, 2, (int64_t[]){N, C}), *w = alloy_input(g, "w", dt, 2, (int64_t[]){C, 3 * C});
    alloy_tensor *r = alloy_input(g, "r", dt, 2, (int64_t[]){N, C});
    alloy_tensor *one = bypass ? alloy_scalar(g, dt, 1.0) : NULL;
    alloy_tensor *qkv = alloy_matmul(g, x, w, false, false);
    alloy_tensor *q = heads(g, alloy_slice(g, qkv, 1, 0, C), one), *k = heads(g, alloy_slice(g, qkv, 1, C, 2 * C), one),
                 *v = heads(g, alloy_slice(g, qkv, 1, 2 * C, 3 * C), one);
    alloy_tensor *o = alloy_attention(g, q, k, v, causal, 1 / sqrt((double)D));
    if (bypass) o = alloy_mul(g, o, one);
    alloy_tensor *y = alloy_reshape(g, alloy_transpose(g, o, (int64_t[]){0, 2, 1, 3}), 2, (int64_t[]){N, C});
    expect_ok(g, alloy_output(g, "y", y), "output");
    /* loss = sum(y * y * r): its gradient dy is computed, so the backward's dO is a view too */
    expect_ok(g, alloy_graph_set_loss(g, alloy_reduce_sum(g, alloy_mul(g, alloy_mul(g, y, r), y), 0, NULL, false)), "loss");
    expect_ok(g, alloy_graph_request_grad(g, x), "grad x");
    expect_ok(g, alloy_graph_request_grad(g, w), "grad w");
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    /* both graphs alike: simplify would take the multiplications by 1 out */
    expect_ok(g, alloy_graph_set_option(g, "disable_passes", "simplify"), "disable_passes");
    return g;
}

static void *random_values(alloy_dtype dt, int64_t n, double lo, double hi)
{
    double *v = test_malloc(sizeof(double) * (size_t)n);
    void *out = test_malloc(alloy_dtype_size(dt) * (size_t)n);
    for (int64_t e = 0; e < n; e++) v[e] = test_uniform(lo, hi);
    test_encode(dt, v, out, n);
    test_free(v);
    return out;
}

static double *decoded(const alloy_host_tensor *t, int64_t n)
{
    double *v = test_malloc(sizeof(double) * (size_t)n);
    for (int64_t e = 0; e < n; e++) v[e] = test_decode(t->dtype, t->data, e);
    return v;
}

/* Steps of g's compiled schedule that run a kernel for a transpose, slice
 * or concat (layout copies), and whether its attention ops are strided. */
static int layout_copies(const alloy_graph *g, int *strided)
{
    const ir_graph *c = g->compiled;
    const schedule *s = &g->comp.sched;
    int copies = 0;
    *strided = 0;
    for (int k = 0; k < s->nsteps; k++) {
        const ir_node *n = c->nodes[s->steps[k].pos];
        uint8_t f = s->members[s->steps[k].first].flags;
        if (s->steps[k].kind == STEP_KIND_OP && !(f & MEMBER_VIEW) &&
            (n->op == IR_OP_transpose || n->op == IR_OP_slice || n->op == IR_OP_concat))
            copies++;
        if ((n->op == IR_OP_attention || n->op == IR_OP_attention_grad) && (f & MEMBER_STRIDED)) (*strided)++;
    }
    return copies;
}

/* Runs one step of the pattern on `device` and returns y and the gradients;
 * *copies and *strided from its schedule. */
static result run(const data *d, bool causal, bool bypass, const char *device, int *copies, int *strided)
{
    alloy_graph *g = build(d->dt, causal, bypass, device);
    alloy_host_tensor feeds[3] = {{"x", d->dt, 2, {N, C}, d->x}, {"w", d->dt, 2, {C, 3 * C}, d->w}, {"r", d->dt, 2, {N, C}, d->r}};
    alloy_host_tensor fetch[3] = {{.name = "y"}, {.name = "grad:x"}, {.name = "grad:w"}};
    expect_ok(g, alloy_graph_run(g, feeds, 3, fetch, 3), "run");
    *copies = layout_copies(g, strided);
    result out = {decoded(&fetch[0], N * C), decoded(&fetch[1], N * C), decoded(&fetch[2], C * 3 * C)};
    alloy_graph_free(g);
    return out;
}

/* How far a value may drift from the CPU's through `depth` ops whose
 * longest sum has `terms` terms, relative to the largest magnitude (as
 * test_cuda.c's chain_bound: per op each side's rounding of the stored
 * result, 2u; the sums in another f32 order, doubled for tensor cores,
 * 2 n u32; CUDA's math at 2 ulp, 4 u32). */
static double chain_bound(int depth, int terms, alloy_dtype dt)
{
    const double u32 = 0x1p-24;
    double u = dt == ALLOY_F16 ? 0x1p-11 : dt == ALLOY_BF16 ? 0x1p-8 : u32;
    return depth * (2 * u + 2.0 * terms * u32 + 4 * u32);
}

static void free_result(result *r) { test_free(r->y), test_free(r->gx), test_free(r->gw); }

static data make_data(alloy_dtype dt, unsigned seed)
{
    test_rng = seed;
    data d = {dt, random_values(dt, N * C, -1, 1), random_values(dt, C * 3 * C, -0.5, 0.5), random_values(dt, N * C, -1, 1)};
    return d;
}

static void free_data(data *d) { test_free(d->x), test_free(d->w), test_free(d->r); }

/* Whether a (views) and b (copies) hold the same values (bit for bit: both decode the same dtype exactly). */
static void expect_same(const result *a, const result *b, const char *what)
{
    const struct {
        const char *name;
        const double *x, *y;
        int64_t n;
    } parts[] = {{"y", a->y, b->y, N * C}, {"grad:x", a->gx, b->gx, N * C}, {"grad:w", a->gw, b->gw, C * 3 * C}};
    for (size_t p = 0; p < 3; p++)
        for (int64_t e = 0; e < parts[p].n; e++)
            if (memcmp(&parts[p].x[e], &parts[p].y[e], sizeof(double)) != 0)
                fail_msg("%s: %s[%lld] is %.9g with views, %.9g with the copies", what, parts[p].name, (long long)e,
                         parts[p].x[e], parts[p].y[e]);
}

static const struct {
    alloy_dtype dt;
    bool causal;
} configs[] = {{ALLOY_F32, true}, {ALLOY_F32, false}, {ALLOY_F16, true}, {ALLOY_F16, false}, {ALLOY_BF16, false},
               {ALLOY_BF16, true}};

/* On the CPU: the views leave no layout copy (7 forward, 8 backward with
 * the copies), both attention ops strided, and the same bits as the copies. */
static void test_views_give_the_copies_bits_on_the_cpu(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        data d = make_data(configs[c].dt, 40 + (unsigned)c);
        int copies[2], strided[2];
        result views = run(&d, configs[c].causal, false, "cpu", &copies[0], &strided[0]);
        result plain = run(&d, configs[c].causal, true, "cpu", &copies[1], &strided[1]);
        print_message("# cpu %s%s: layout copies %d with views, %d without; strided attention ops %d, %d\n",
                      alloy_dtype_name(configs[c].dt), configs[c].causal ? " causal" : "", copies[0], copies[1],
                      strided[0], strided[1]);
        assert_int_equal(copies[0], 0);
        assert_int_equal(strided[0], 2);
        assert_int_equal(copies[1], 15);
        assert_int_equal(strided[1], 0);
        expect_same(&views, &plain, alloy_dtype_name(configs[c].dt));
        free_result(&views), free_result(&plain);
        free_data(&d);
    }
}

/* The largest |a - b| relative to the largest |b| over n values. */
static double rel_diff(const double *a, const double *b, int64_t n)
{
    double scale = 0, worst = 0;
    for (int64_t e = 0; e < n; e++) scale = fmax(scale, fabs(b[e]));
    for (int64_t e = 0; e < n; e++) worst = fmax(worst, fabs(a[e] - b[e]));
    return worst / (scale > 0 ? scale : 1);
}

/* On the emulated device: the strided kernels (tensor-core for f16/bf16,
 * SIMT for f32) give the bits of the same kernels over the copies, and
 * agree with the CPU within chain_bound over the longest chain: the
 * projection, the backward's 4 products (as test_cuda's attention cases)
 * and the gradient's GEMM, sums of up to 3C terms. */
static void test_views_on_the_emulated_device_match_the_copies_and_the_cpu(void **state)
{
    (void)state;
    char why[512];
    if (!emu_available(why, sizeof why)) {
        print_message("SKIP: no host emulation of the device: %s\n", why);
        skip();
    }
    rt_backend_set_cuda_opener(emu_backend_opener);
    /* f32 causal (the SIMT kernels), f16 not causal and bf16 causal (the tensor-core ones): each compile of
     * the emulation costs seconds */
    static const size_t on_device[] = {0, 3, 5};
    for (size_t i = 0; i < sizeof on_device / sizeof on_device[0]; i++) {
        size_t c = on_device[i];
        data d = make_data(configs[c].dt, 40 + (unsigned)c);
        int copies[3], strided[3];
        result views = run(&d, configs[c].causal, false, "cuda", &copies[0], &strided[0]);
        result plain = run(&d, configs[c].causal, true, "cuda", &copies[1], &strided[1]);
        result cpu = run(&d, configs[c].causal, false, "cpu", &copies[2], &strided[2]);
        assert_int_equal(copies[0], 0);
        assert_int_equal(strided[0], 2);
        assert_int_equal(copies[1], 15);
        expect_same(&views, &plain, alloy_dtype_name(configs[c].dt));
        double tol = chain_bound(6, 3 * C, configs[c].dt);
        double dy = rel_diff(views.y, cpu.y, N * C), dx = rel_diff(views.gx, cpu.gx, N * C),
               dw = rel_diff(views.gw, cpu.gw, C * 3 * C);
        print_message("# emulated %s%s: against the CPU y %.3g, grad:x %.3g, grad:w %.3g of their largest (bound %.3g)\n",
                      alloy_dtype_name(configs[c].dt), configs[c].causal ? " causal" : "", dy, dx, dw, tol);
        if (!(dy <= tol && dx <= tol && dw <= tol))
            fail_msg("%s: the emulated device differs from the CPU by more than %.3g", alloy_dtype_name(configs[c].dt), tol);
        free_result(&views), free_result(&plain), free_result(&cpu);
        free_data(&d);
    }
    rt_backend_set_cuda_opener(NULL);
}

/* A CPU bundle of the step keeps its strided views (the reader accepts
 * them) and runs to the graph's bits. */
static void test_a_bundle_keeps_the_views_and_the_bits(void **state)
{
    (void)state;
    data d = make_data(ALLOY_F16, 50);
    int copies, strided;
    result want = run(&d, true, false, "cpu", &copies, &strided);
    alloy_graph *g = build(ALLOY_F16, true, false, "cpu");
    const char *path = test_tmp_path("attn.alloy");
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    alloy_graph_free(g);
    alloy_bundle *b = NULL;
    char err[1024] = "";
    if (alloy_bundle_load(path, &b, err, sizeof err)) fail_msg("alloy_bundle_load: %s", err);
    alloy_host_tensor feeds[3] = {{"x", d.dt, 2, {N, C}, d.x}, {"w", d.dt, 2, {C, 3 * C}, d.w}, {"r", d.dt, 2, {N, C}, d.r}};
    alloy_host_tensor fetch[3] = {{.name = "y"}, {.name = "grad:x"}, {.name = "grad:w"}};
    if (alloy_bundle_run(b, feeds, 3, fetch, 3)) fail_msg("alloy_bundle_run: %s", alloy_bundle_last_error(b));
    result got = {decoded(&fetch[0], N * C), decoded(&fetch[1], N * C), decoded(&fetch[2], C * 3 * C)};
    alloy_bundle_free(b);
    expect_same(&got, &want, "the bundle");
    free_result(&got), free_result(&want);
    free_data(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_views_give_the_copies_bits_on_the_cpu),
        cmocka_unit_test(test_views_on_the_emulated_device_match_the_copies_and_the_cpu),
        cmocka_unit_test_setup_teardown(test_a_bundle_keeps_the_views_and_the_bits, test_tmpdir_setup,
                                        test_tmpdir_teardown),
    };
    return cmocka_run_group_tests_name("attn_views", tests, NULL, NULL);
}
