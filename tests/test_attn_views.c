/* test_attn_views.c - attention reading q, k, v through strides out of a fused projection, writing o in its transpose's order and dq, dk, dv into the concat's rows: no layout copy left in the plan, the same bits as the copies on the CPU and on the emulated device, and the emulated device against the CPU. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "alloy/alloy.h"
#include "mha_support.h"
#include "runtime/backend.h"
#include "runtime/graph/graph_impl.h"
#include "step/attn_views.h"
#include "support.h"

/* Batch, context, heads, head dim: C = H * D, the projection [B*T, 3C].
 * T over 64: the tensor-core backward sums dq over two key blocks in its
 * contiguous f32 accumulator and its dq kernel writes the concat's rows. */
enum { B = 2, T = 72, H = 2, D = 16, C = H * D, N = B * T };

static const mha_shape shape = {B, T, H, D};

/* Column block `block` of qkv split into heads; `one` (bypass) multiplies
 * by 1 after it (exact), a reader that needs the copy. */
static alloy_tensor *heads(const mha_graph *m, alloy_tensor *qkv, int block, alloy_tensor *one)
{
    alloy_tensor *x = mha_heads(m, qkv, block);
    return one ? alloy_mul(m->g, x, one) : x;
}

/* The multi-head pattern: qkv = x w, q/k/v its three column blocks split
 * into heads, attention, the heads joined back to [N, C]; bypass: the same
 * values through exact multiplications by 1 that keep every copy. */
static alloy_graph *build(alloy_dtype dt, bool causal, bool bypass, const char *device)
{
    mha_graph m = mha_graph_new("attn_views", shape, dt);
    alloy_graph *g = m.g;
    alloy_tensor *one = bypass ? alloy_scalar(g, dt, 1.0) : NULL;
    alloy_tensor *qkv = alloy_matmul(g, m.x, m.w, false, false);
    alloy_tensor *q = heads(&m, qkv, 0, one), *k = heads(&m, qkv, 1, one), *v = heads(&m, qkv, 2, one);
    alloy_tensor *o = alloy_attention(g, q, k, v, causal, 1 / sqrt((double)D));
    if (bypass) o = alloy_mul(g, o, one);
    mha_graph_finish(&m, o, true); /* loss = sum(y * r * y) */
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    /* both graphs alike: simplify would take the multiplications by 1 out */
    expect_ok(g, alloy_graph_set_option(g, "disable_passes", "simplify"), "disable_passes");
    return g;
}

/* Runs one step of the pattern on `device` and returns y and the gradients;
 * *copies (layout copies) and *strided from its schedule. */
static mha_result run(const mha_data *d, bool causal, bool bypass, const char *device, int *copies, int *strided)
{
    alloy_graph *g = build(d->dt, causal, bypass, device);
    mha_result out = mha_run(g, d, 1);
    *copies = mha_layout_copies(g, strided);
    alloy_graph_free(g);
    return out;
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
        mha_data d = mha_make_data(shape, configs[c].dt, 40 + (unsigned)c);
        int copies[2], strided[2];
        mha_result views = run(&d, configs[c].causal, false, "cpu", &copies[0], &strided[0]);
        mha_result plain = run(&d, configs[c].causal, true, "cpu", &copies[1], &strided[1]);
        print_message("# cpu %s%s: layout copies %d with views, %d without; strided attention ops %d, %d\n",
                      alloy_dtype_name(configs[c].dt), configs[c].causal ? " causal" : "", copies[0], copies[1],
                      strided[0], strided[1]);
        assert_int_equal(copies[0], 0);
        assert_int_equal(strided[0], 2);
        assert_int_equal(copies[1], 15);
        assert_int_equal(strided[1], 0);
        mha_expect_same(&views, &plain, alloy_dtype_name(configs[c].dt));
        mha_free_result(&views), mha_free_result(&plain);
        mha_free_data(&d);
    }
}

/* On the emulated device: the strided kernels (tensor-core for f16/bf16,
 * SIMT for f32) give the bits of the same kernels over the copies, and
 * agree with the CPU within mha_chain_bound over the longest chain: the
 * projection, the backward's 4 products (as test_cuda's attention cases)
 * and the gradient's GEMM, sums of up to 3C terms. */
static void test_views_on_the_emulated_device_match_the_copies_and_the_cpu(void **state)
{
    (void)state;
    mha_emulated_device_or_skip();
    /* f32 causal (the SIMT kernels), f16 not causal and bf16 causal (the tensor-core ones): each compile of
     * the emulation costs seconds */
    static const size_t on_device[] = {0, 3, 5};
    for (size_t i = 0; i < sizeof on_device / sizeof on_device[0]; i++) {
        size_t c = on_device[i];
        mha_data d = mha_make_data(shape, configs[c].dt, 40 + (unsigned)c);
        int copies[3], strided[3];
        mha_result views = run(&d, configs[c].causal, false, "cuda", &copies[0], &strided[0]);
        mha_result plain = run(&d, configs[c].causal, true, "cuda", &copies[1], &strided[1]);
        mha_result cpu = run(&d, configs[c].causal, false, "cpu", &copies[2], &strided[2]);
        assert_int_equal(copies[0], 0);
        assert_int_equal(strided[0], 2);
        assert_int_equal(copies[1], 15);
        mha_expect_same(&views, &plain, alloy_dtype_name(configs[c].dt));
        double tol = mha_chain_bound(6, 3 * C, configs[c].dt);
        double dy = mha_rel_diff(views.y, cpu.y, N * C), dx = mha_rel_diff(views.gx, cpu.gx, N * C),
               dw = mha_rel_diff(views.gw, cpu.gw, C * 3 * C);
        print_message("# emulated %s%s: against the CPU y %.3g, grad:x %.3g, grad:w %.3g of their largest (bound %.3g)\n",
                      alloy_dtype_name(configs[c].dt), configs[c].causal ? " causal" : "", dy, dx, dw, tol);
        if (!(dy <= tol && dx <= tol && dw <= tol))
            fail_msg("%s: the emulated device differs from the CPU by more than %.3g", alloy_dtype_name(configs[c].dt), tol);
        mha_free_result(&views), mha_free_result(&plain), mha_free_result(&cpu);
        mha_free_data(&d);
    }
    rt_backend_set_cuda_opener(NULL);
}

/* A CPU bundle of the step keeps its strided views (the reader accepts
 * them) and runs to the graph's bits. */
static void test_a_bundle_keeps_the_views_and_the_bits(void **state)
{
    (void)state;
    mha_data d = mha_make_data(shape, ALLOY_F16, 50);
    int copies, strided;
    mha_result want = run(&d, true, false, "cpu", &copies, &strided);
    alloy_graph *g = build(ALLOY_F16, true, false, "cpu");
    mha_result got = mha_run_bundle(g, &d, test_tmp_path("attn.alloy"));
    alloy_graph_free(g);
    mha_expect_same(&got, &want, "the bundle");
    mha_free_result(&got), mha_free_result(&want);
    mha_free_data(&d);
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
