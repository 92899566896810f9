/* test_ptrbatch.c - the batched products of a written-out attention over strided views: k and v read out of a fused projection, p v, dv and dk written in their transposes' order, the GEMMs with two batch strides one pointer-array call each; the copies' bits on the CPU, the pointer arrays by hand, and the emulated device against the CPU. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "alloy/alloy.h"
#include "codegen/emit.h"
#include "cost/cost.h"
#include "cuda_emu/emu_device.h"
#include "cuda_emu/emu_loader.h"
#include "runtime/backend.h"
#include "runtime/graph/graph_impl.h"
#include "mha_support.h"
#include "step/launch_plan.h"
#include "support.h"

/* Batch, context, heads, head dim: C = H * D, the projection [B*T, 3C]. */
enum { B = 2, T = 24, H = 2, D = 16, C = H * D, N = B * T };

static const mha_shape shape = {B, T, H, D};

/* Column block `block` of qkv split into heads; `one` (bypass) multiplies
 * by 1 after it (exact) and sums it into an output of its own (`probe`),
 * a reader that needs the copy. */
static alloy_tensor *heads(const mha_graph *m, alloy_tensor *qkv, int block, alloy_tensor *one, const char *probe)
{
    alloy_graph *g = m->g;
    alloy_tensor *x = mha_heads(m, qkv, block);
    if (!one) return x;
    expect_ok(g, alloy_output(g, probe, alloy_reduce_sum(g, x, 0, NULL, false)), "probe");
    return alloy_mul(g, x, one);
}

/* GPT-2's attention as a user writes it (examples/gpt_model.c): qkv = x w,
 * q/k/v its column blocks split into heads, q scaled, softmax(causal(q
 * k^T)) v, the heads joined back to [N, C]; bypass: the same values
 * through exact multiplications by 1 (and sums of q, k, v as outputs)
 * that keep the copies, 9 of the 12 (BYPASS_COPIES). The attention
 * rewrite is off (the products stay written out), simplify too (it would
 * take the multiplications by 1 out). */
static alloy_graph *build(alloy_dtype dt, bool bypass, const char *device)
{
    mha_graph m = mha_graph_new("ptrbatch", shape, dt);
    alloy_graph *g = m.g;
    alloy_tensor *one = bypass ? alloy_scalar(g, dt, 1.0) : NULL;
    alloy_tensor *qkv = alloy_matmul(g, m.x, m.w, false, false);
    alloy_tensor *q = heads(&m, qkv, 0, one, "probe_q"), *k = heads(&m, qkv, 1, one, "probe_k"),
                 *v = heads(&m, qkv, 2, one, "probe_v");
    alloy_tensor *o = mha_written_out(&m, q, k, v); /* q scaled by 1 / sqrt(D) = 0.25, exact */
    if (bypass) o = alloy_mul(g, o, one);
    mha_graph_finish(&m, o, true);
    expect_ok(g, alloy_graph_set_option(g, "device", device), "device");
    expect_ok(g, alloy_graph_set_option(g, "disable_passes", "attention,simplify"), "disable_passes");
    return g;
}

/* What the compiled schedule of g holds: steps running a copy kernel for
 * a transpose, slice or concat; matmuls and elementwise ops storing their
 * result strided, and reading a strided operand. */
typedef struct census {
    int copies, strided_results, strided_reads;
} census;

static census count(const alloy_graph *g)
{
    const ir_graph *c = g->compiled;
    const schedule *s = &g->comp.sched;
    census z = {mha_layout_copies(g, NULL), 0, 0};
    for (int i = 0; i < c->nnodes; i++) {
        const ir_node *n = c->nodes[i];
        if ((n->op != IR_OP_matmul && !ir_ops[n->op].elementwise) || s->member_of[i] < 0) continue;
        z.strided_results += (s->members[s->member_of[i]].flags & (MEMBER_STRIDED | MEMBER_VIEW)) == MEMBER_STRIDED;
        for (int j = 0; j < n->nin; j++)
            z.strided_reads += s->member_of[n->in[j]] >= 0 && (s->members[s->member_of[n->in[j]]].flags & MEMBER_STRIDED);
    }
    return z;
}

/* Runs `runs` steps of the pattern on `device` (the same feeds) and
 * returns the last one's y and gradients; *z from its schedule. */
static mha_result run(const mha_data *d, bool bypass, const char *device, int runs, census *z)
{
    alloy_graph *g = build(d->dt, bypass, device);
    mha_result out = mha_run(g, d, runs);
    *z = count(g);
    alloy_graph_free(g);
    return out;
}

static const alloy_dtype dtypes[] = {ALLOY_F32, ALLOY_F16, ALLOY_BF16};

/* The copies a written-out attention keeps: none (12 without views: the
 * concat of dq, dk, dv is an interleave, each written into its columns),
 * and the 9 of the bypass (its backward's multiplications by 1 are
 * elementwise ops of the products, which write dk and dv strided as the
 * scale of dq does); the results
 * written strided (p v, dv, dk; dq, the scale's gradient, an elementwise
 * kernel) and the operand slots read through strides (k in q k^T and dS
 * k, v in p v and dO v^T, dO in dO v^T and p^T dO; q by its scale's
 * elementwise kernel). */
enum { KEPT_COPIES = 0, BYPASS_COPIES = 9, STRIDED_RESULTS = 4, STRIDED_READS = 7 };

/* On the CPU: the views leave none of the 12 layout copies, the products
 * read and write through strides, and the values are the copies' bits. */
static void test_strided_products_give_the_copies_bits_on_the_cpu(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof dtypes / sizeof dtypes[0]; c++) {
        mha_data d = mha_make_data(shape, dtypes[c], 60 + (unsigned)c);
        census z[2];
        mha_result views = run(&d, false, "cpu", 1, &z[0]);
        mha_result plain = run(&d, true, "cpu", 1, &z[1]);
        print_message("# cpu %s: layout copies %d with views, %d without; strided results %d, strided reads %d\n",
                      alloy_dtype_name(dtypes[c]), z[0].copies, z[1].copies, z[0].strided_results, z[0].strided_reads);
        assert_int_equal(z[0].copies, KEPT_COPIES);
        assert_int_equal(z[1].copies, BYPASS_COPIES);
        assert_int_equal(z[0].strided_results, STRIDED_RESULTS);
        assert_int_equal(z[0].strided_reads, STRIDED_READS);
        assert_int_equal(z[1].strided_reads, 0);
        mha_expect_same(&views, &plain, alloy_dtype_name(dtypes[c]));
        mha_free_result(&views), mha_free_result(&plain);
        mha_free_data(&d);
    }
}

/* The launch plan of the f16 step for CUDA, by hand: every product with
 * a strided operand or result is one pointer-array GEMM of B*H matrices;
 * q k^T's A (k, the matmul's second operand) is matrix (b, h) at b * T *
 * 3C + h * D elements from k's place (C elements into the projection),
 * its D (the scores, dense) at (b * H + h) * T * T; p v's D (stored [B,
 * T, H, D]) at b * T * C + h * D with ldd C; p^T dO's D (dv) in the
 * concat of dq, dk, dv, 2C into its rows, at b * T * 3C + h * D with ldd
 * 3C; the arrays lie in the aux
 * block above every other slot; the cost model charges each GEMM its 3
 * arrays and has no layout copy (against 12 without the views). */
static void test_the_pointer_arrays_address_each_heads_matrix(void **state)
{
    (void)state;
    int64_t layout[2];
    for (int bypass = 0; bypass < 2; bypass++) {
        alloy_graph *g = build(ALLOY_F16, bypass, "cpu");
        expect_ok(g, alloy_graph_set_option(g, "remat", "always"), "remat"); /* as a CUDA compile chooses */
        char err[1024];
        cg_program prog;
        lp_plan lp;
        cost_model m;
        if (graph_compile_ir(g)) fail_msg("%s", alloy_last_error(g));
        const ir_graph *c = g->compiled;
        if (cg_emit(c, &g->comp.sched, &prog, err, sizeof err)) fail_msg("%s", err);
        if (lp_build(c, &g->comp.sched, &g->comp.plan, &prog, &lp, err, sizeof err)) fail_msg("%s", err);
        if (cost_build(c, &g->comp.sched, &prog, &lp, NULL, &m, err, sizeof err)) fail_msg("%s", err);
        layout[bypass] = 0;
        for (int i = 0; i < m.n; i++) { /* the layout copies around the products (not the loss's broadcast_to) */
            int op = m.launches[i].step >= 0 ? c->nodes[g->comp.sched.steps[m.launches[i].step].pos]->op : -1;
            layout[bypass] += m.launches[i].cls == COST_LAYOUT && op != IR_OP_broadcast_to;
        }
        int pointers = 0, checked = 0;
        for (int i = 0; i < lp.ngemms; i++) {
            const lp_gemm *gm = &lp.gemms[i];
            if (!gm->pointers) continue;
            pointers++;
            assert_int_equal(gm->batch, B * H);
            assert_int_equal(gm->ptr_at.space, LP_AUX);
            assert_true(gm->ptr_at.offset + 24 * gm->batch <= (int64_t)lp.aux_bytes);
            assert_true(gm->ptr_at.offset >= (int64_t)(lp.aux_bytes - lp.ptr_bytes));
            const ir_node *mm = c->nodes[gm->node];
            const int64_t *po = &lp.ptr_offsets[gm->ptrs];
            bool qk = ir_attr_i(mm, "transpose_b") && c->nodes[mm->in[0]]->op == IR_OP_mul; /* the forward's q k^T */
            bool pv = gm->ldd == C && !ir_attr_i(mm, "transpose_a");                        /* the forward's p v */
            bool dv = ir_attr_i(mm, "transpose_a") && c->nodes[mm->in[1]]->op == IR_OP_transpose; /* p^T dO */
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < H; h++) {
                    int64_t j = b * H + h;
                    if (qk) {
                        assert_int_equal(gm->lda, 3 * C);
                        assert_int_equal(po[j], (b * T * 3 * C + h * D) * 2);
                        assert_int_equal(po[2 * gm->batch + j], (b * H + h) * T * T * 2);
                        checked |= 1;
                    }
                    if (dv) { /* into the concat of dq, dk, dv: its rows 3C apart, 2C in */
                        assert_int_equal(gm->ldd, 3 * C);
                        assert_int_equal(po[2 * gm->batch + j], (b * T * 3 * C + h * D) * 2);
                        int cat = c->nodes[mm->id]->id, at = g->comp.plan.view_of[cat];
                        assert_true(at >= 0 && c->nodes[at]->op == IR_OP_concat);
                        assert_int_equal(gm->out.offset, g->comp.plan.offset[at] + 2 * C * 2);
                        checked |= 4;
                    }
                    if (pv) {
                        assert_int_equal(po[2 * gm->batch + j], (b * T * C + h * D) * 2);
                        assert_int_equal(po[gm->batch + j], (b * H + h) * T * T * 2);
                        checked |= 2;
                    }
                }
            /* without an algorithm for pointer arrays, strided runs: each [b][h] view's heads are one run
             * (the matrices of a b D elements apart, b's further), and every matrix's offsets follow */
            lp_gemm each;
            assert_int_equal(lp_gemm_runs(&lp, gm, &each), H);
            assert_false(each.pointers);
            assert_int_equal(each.batch, H);
            if (qk) {
                assert_int_equal(each.stride_a, D);
                assert_int_equal(each.stride_d, T * T);
            }
            for (int64_t j = 0; j < gm->batch; j++) {
                int64_t at[3];
                lp_gemm_run_offsets(&lp, gm, H, j / H, at);
                if (qk && j % H == 0) assert_int_equal(at[0], j / H * T * 3 * C * 2);
                assert_int_equal(po[j], at[0] + j % H * each.stride_a * 2);
                assert_int_equal(po[gm->batch + j], at[1] + j % H * each.stride_b * 2);
                assert_int_equal(po[2 * gm->batch + j], at[2] + j % H * each.stride_d * (int64_t)alloy_dtype_size(gm->d));
            }
            int li = 0;
            while (li < lp.nactions && !(lp.actions[li].kind == LP_GEMM && lp.actions[li].index == i)) li++;
            const cost_launch *l = &m.launches[li];
            int64_t bytes = gm->batch * ((gm->m * gm->k + gm->k * gm->n) * 2 + gm->m * gm->n * (int64_t)alloy_dtype_size(gm->d));
            assert_int_equal(l->read + l->written, bytes + 3 * 8 * gm->batch);
        }
        print_message("# %s: %d pointer-array GEMMs, %d layout-copy launches\n", bypass ? "copies" : "views", pointers,
                      (int)layout[bypass]);
        if (!bypass) {
            assert_int_equal(pointers, 6); /* q k^T, p v; dO v^T, p^T dO, dS k, dS^T q */
            assert_int_equal(checked, 7);
        } else {
            assert_int_equal(pointers, 0);
            assert_int_equal(lp.ptr_bytes, 0);
        }
        cost_free(&m);
        lp_free(&lp);
        cg_program_free(&prog);
        alloy_graph_free(g);
    }
    assert_int_equal(layout[0], KEPT_COPIES);
    assert_int_equal(layout[1], BYPASS_COPIES);
}

/* A CPU bundle of the step keeps its strided products and views (the
 * reader accepts MEMBER_STRIDED on such a matmul) and runs to the
 * graph's bits. */
static void test_a_bundle_keeps_the_strided_products_and_the_bits(void **state)
{
    (void)state;
    mha_data d = mha_make_data(shape, ALLOY_F16, 80);
    census z;
    mha_result want = run(&d, false, "cpu", 1, &z);
    alloy_graph *g = build(ALLOY_F16, false, "cpu");
    mha_result got = mha_run_bundle(g, &d, test_tmp_path("ptrbatch.alloy"));
    alloy_graph_free(g);
    assert_int_equal(z.strided_results, STRIDED_RESULTS);
    mha_expect_same(&got, &want, "the bundle");
    mha_free_result(&got), mha_free_result(&want);
    mha_free_data(&d);
}

/* On the emulated device (its cuBLASLt reads each matrix's address from
 * the arrays in device memory): the pointer-array GEMMs give the bits of
 * the strided ones over the copies, a second run (the captured graph
 * replayed) the first's, and both agree with the CPU within mha_chain_bound
 * over the longest chain (the projection, the scores, softmax, p v, the
 * backward's products and the gradient's GEMM, sums of up to 3C terms). */
static void test_pointer_array_gemms_on_the_emulated_device_match_the_copies_and_the_cpu(void **state)
{
    (void)state;
    mha_emulated_device_or_skip();
    for (size_t c = 0; c < sizeof dtypes / sizeof dtypes[0]; c++) {
        mha_data d = mha_make_data(shape, dtypes[c], 70 + (unsigned)c);
        census z[3];
        emu_device_stats before = emu_totals();
        mha_result views = run(&d, false, "cuda", 2, &z[0]);
        emu_device_stats after = emu_totals();
        mha_result plain = run(&d, true, "cuda", 1, &z[1]);
        mha_result cpu = run(&d, false, "cpu", 1, &z[2]);
        long pointer_gemms = after.pointer_gemms - before.pointer_gemms, replays = after.replays - before.replays;
        print_message("# emulated %s: %ld pointer-array GEMMs over 2 runs, %ld replays; layout copies %d\n",
                      alloy_dtype_name(dtypes[c]), pointer_gemms, replays, z[0].copies);
        assert_int_equal(z[0].copies, KEPT_COPIES);
        assert_int_equal(z[1].copies, BYPASS_COPIES);
        assert_int_equal(pointer_gemms, 12); /* 6 a run */
        assert_true(replays >= 1);          /* the second run replayed the captured graph, arrays and all */
        mha_expect_same(&views, &plain, alloy_dtype_name(dtypes[c]));
        double tol = mha_chain_bound(8, 3 * C, dtypes[c]);
        double dy = mha_rel_diff(views.y, cpu.y, N * C), dx = mha_rel_diff(views.gx, cpu.gx, N * C),
               dw = mha_rel_diff(views.gw, cpu.gw, C * 3 * C);
        print_message("# emulated %s: against the CPU y %.3g, grad:x %.3g, grad:w %.3g of their largest (bound %.3g)\n",
                      alloy_dtype_name(dtypes[c]), dy, dx, dw, tol);
        if (!(dy <= tol && dx <= tol && dw <= tol))
            fail_msg("%s: the emulated device differs from the CPU by more than %.3g", alloy_dtype_name(dtypes[c]), tol);
        mha_free_result(&views), mha_free_result(&plain), mha_free_result(&cpu);
        mha_free_data(&d);
    }
    rt_backend_set_cuda_opener(NULL);
}

/* A cuBLASLt whose heuristic has no algorithm for pointer arrays: each
 * such GEMM runs as strided batches instead, one call per b over its
 * heads (B calls where there was one), to the pointer-array run's bits
 * (the same products per matrix); a cuBLASLt with no algorithm for those
 * either fails the CUDA compile naming the matmul, its step and both forms
 * (ALLOY_ERR_UNSUPPORTED), and device=auto runs the step on the CPU, to
 * the CPU's bits. */
static void test_no_algorithm_for_pointer_arrays_runs_strided_batches_else_names_the_step(void **state)
{
    (void)state;
    mha_emulated_device_or_skip();
    mha_data d = mha_make_data(shape, ALLOY_F16, 90);
    census z;
    mha_result arrays = run(&d, false, "cuda", 1, &z);
    emu_device_set_pointer_arrays(false);
    emu_device_stats before = emu_totals();
    mha_result runs = run(&d, false, "cuda", 2, &z);
    emu_device_stats after = emu_totals();
    long gemms = after.gemms - before.gemms, pointer_gemms = after.pointer_gemms - before.pointer_gemms;
    print_message("# no pointer arrays: %ld GEMM calls over 2 runs, %ld of them pointer arrays\n", gemms, pointer_gemms);
    assert_int_equal(pointer_gemms, 0);
    assert_int_equal(gemms, 2 * (6 * B + 2 + 1)); /* the 6 products B calls each; the projection's 3 GEMMs */
    mha_expect_same(&runs, &arrays, "strided runs against pointer arrays");
    mha_free_result(&runs), mha_free_result(&arrays);

    emu_device_set_strided_batches(false);
    alloy_host_tensor feeds[3], fetch[3];
    mha_io(&d, feeds, fetch);
    alloy_graph *g = build(ALLOY_F16, false, "cuda");
    assert_int_equal(alloy_graph_run(g, feeds, 3, fetch, 3), ALLOY_ERR_UNSUPPORTED);
    const char *msg = alloy_last_error(g);
    print_message("# %s\n", msg);
    assert_non_null(strstr(msg, "the GEMM of matmul"));
    assert_non_null(strstr(msg, "(step "));
    assert_non_null(strstr(msg, "CUBLASLT_BATCH_MODE_POINTER_ARRAY"));
    assert_non_null(strstr(msg, "strided calls of 2"));
    alloy_graph_free(g);
    g = build(ALLOY_F16, false, "auto");
    expect_ok(g, alloy_graph_run(g, feeds, 3, fetch, 3), "run under auto");
    mha_result got = mha_fetched(shape, fetch);
    const char *device = alloy_graph_device(g);
    print_message("# device=auto ran on %s\n", device ? device : "?");
    assert_non_null(device);
    assert_null(strstr(device, "emulat"));
    alloy_graph_free(g);
    mha_result cpu = run(&d, false, "cpu", 1, &z);
    mha_expect_same(&got, &cpu, "device=auto");
    mha_free_result(&got), mha_free_result(&cpu);
    mha_free_data(&d);
    emu_device_set_pointer_arrays(true);
    emu_device_set_strided_batches(true);
    rt_backend_set_cuda_opener(NULL);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest cpu[] = {
        cmocka_unit_test(test_strided_products_give_the_copies_bits_on_the_cpu),
        cmocka_unit_test(test_the_pointer_arrays_address_each_heads_matrix),
        cmocka_unit_test_setup_teardown(test_a_bundle_keeps_the_strided_products_and_the_bits, test_tmpdir_setup,
                                        test_tmpdir_teardown),
    };
    const struct CMUnitTest device[] = {
        cmocka_unit_test(test_pointer_array_gemms_on_the_emulated_device_match_the_copies_and_the_cpu),
        cmocka_unit_test(test_no_algorithm_for_pointer_arrays_runs_strided_batches_else_names_the_step),
    };
    if (argc > 1 && !strcmp(argv[1], "device")) return cmocka_run_group_tests_name("ptrbatch2", device, NULL, NULL);
    return cmocka_run_group_tests_name("ptrbatch1", cpu, NULL, NULL);
}
