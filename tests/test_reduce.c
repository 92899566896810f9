/* test_reduce.c - the f16/bf16 reductions read in converted runs (kernels/ref_reduce.c): the bits of the f32 reduction of a widened copy, within a pairwise-sum bound of a double reference, out-of-memory a clean false. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "alloy/alloy.h"
#include "ir/ir.h"
#include "kernels/ref.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* One reduction: its op, input shape (rank 2 or 3) and reduced axes. Each
 * has outputs of more than 4096 terms (the runs ref_reduce_half converts at
 * a time), along the innermost dim (rows) or across it (columns). */
typedef struct reduce_case {
    const char *what;
    int rank;
    int64_t dims[3];
    int naxes; /* 0: all */
    int64_t axes[2];
} reduce_case;

static const reduce_case cases[] = {
    {"rows of 9000", 2, {3, 9000}, 1, {1}},
    {"columns of 9000", 2, {9000, 3}, 1, {0}},
    {"two reduced dims gathered", 3, {3, 4, 2000}, 2, {0, 2}},
    {"columns under an outer dim", 3, {4, 3000, 5}, 1, {1}},
    {"everything: one sum of 21000", 2, {70, 300}, 0, {0}},
};
enum { NCASES = sizeof cases / sizeof cases[0] };
static const alloy_dtype halves[] = {ALLOY_F16, ALLOY_BF16};
static const char *const ops[] = {"sum", "mean", "max"};

/* The graph with input x (dt, c's shape) and its reduction by op k; *node is the reduction. */
static alloy_graph *build(const reduce_case *c, alloy_dtype dt, int k, const ir_node **node)
{
    alloy_graph *g = alloy_graph_new("reduce");
    alloy_tensor *x = alloy_input(g, "x", dt, c->rank, c->dims);
    const int64_t *axes = c->naxes ? c->axes : NULL;
    alloy_tensor *r = k == 0   ? alloy_reduce_sum(g, x, c->naxes, axes, false)
                      : k == 1 ? alloy_reduce_mean(g, x, c->naxes, axes, false)
                               : alloy_reduce_max(g, x, c->naxes, axes, false);
    assert_non_null(r);
    assert_int_equal(alloy_graph_status(g), ALLOY_OK);
    *node = g->ir->nodes[g->ir->nnodes - 1];
    return g;
}

/* Output index of input element e: its kept dims' index, row-major. */
static int64_t out_index(const reduce_case *c, int64_t e)
{
    int64_t idx[3], o = 0;
    for (int d = c->rank - 1; d >= 0; d--) idx[d] = e % c->dims[d], e /= c->dims[d];
    for (int d = 0; d < c->rank; d++) {
        bool reduced = c->naxes == 0;
        for (int a = 0; a < c->naxes; a++) reduced |= c->axes[a] == d;
        if (!reduced) o = o * c->dims[d] + idx[d];
    }
    return o;
}

/* The f32 pairwise sum the op table documents (ref.h): more than 16 terms
 * split in halves, 16 or fewer added in order from 0. */
static float pairwise(const float *v, int64_t n)
{
    if (n > 16) return pairwise(v, n / 2) + pairwise(v + n / 2, n - n / 2);
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return s;
}

/* Every case, in f16 and bf16, summed, averaged and maximized: the half
 * reduction gives the bits of ref_reduce_f32 over the widened copy, and of
 * the pairwise f32 sum of each output's terms in order (the mean: that over
 * the count), and the maximum is the double maximum (one case's maxima have
 * a NaN past the first 4096 terms of an output); the sums lie within
 * (log2(n) + 16) * 2^-24 * sum |x| of the double sums. */
static void test_half_reductions_give_the_bits_of_the_widened_copy(void **state)
{
    (void)state;
    test_rng = 31;
    for (int ci = 0; ci < NCASES; ci++) {
        const reduce_case *c = &cases[ci];
        int64_t numel = 1;
        for (int d = 0; d < c->rank; d++) numel *= c->dims[d];
        for (size_t h = 0; h < 2; h++) {
            double *v = test_malloc(sizeof(double) * (size_t)numel);
            uint16_t *x = test_malloc(sizeof(uint16_t) * (size_t)numel);
            float *wide = test_malloc(sizeof(float) * (size_t)numel), *terms = test_malloc(sizeof(float) * (size_t)numel);
            /* magnitudes from 2^-12 to 2^8: the f32 additions round, so their order shows in the bits */
            for (int64_t e = 0; e < numel; e++)
                v[e] = test_round_to(halves[h], ldexp(test_uniform(-1, 1), test_irand(-12, 8)));
            if (ci == 0) v[9000 + 5000] = NAN; /* output 1, term 5000 */
            test_encode(halves[h], v, x, numel);
            for (int64_t e = 0; e < numel; e++) wide[e] = (float)test_decode(halves[h], x, e);
            for (int k = 0; k < 3; k++) {
                const ir_node *n;
                alloy_graph *g = build(c, halves[h], k, &n);
                int64_t nout = ir_numel(&n->type), count = numel / nout;
                float *got = test_malloc(sizeof(float) * (size_t)nout), *want = test_malloc(sizeof(float) * (size_t)nout);
                double *sum = test_calloc((size_t)nout, sizeof(double)), *abs_sum = test_calloc((size_t)nout, sizeof(double));
                double *max = test_malloc(sizeof(double) * (size_t)nout);
                int64_t *filled = test_calloc((size_t)nout, sizeof(int64_t));
                for (int64_t o = 0; o < nout; o++) max[o] = -INFINITY;
                for (int64_t e = 0; e < numel; e++) { /* output o's terms in row-major order of the reduced dims */
                    int64_t o = out_index(c, e);
                    terms[o * count + filled[o]++] = wide[e];
                    sum[o] += v[e], abs_sum[o] += fabs(v[e]);
                    if (isnan(v[e]) || v[e] > max[o]) max[o] = isnan(max[o]) ? max[o] : v[e];
                }
                assert_true(ref_reduce_half(n, &g->ir->nodes[0]->type, x, got));
                assert_true(ref_reduce_f32(n, &g->ir->nodes[0]->type, wide, want));
                double bound = (log2((double)count) + 16) * 0x1p-24;
                for (int64_t o = 0; o < nout; o++) {
                    if (memcmp(&got[o], &want[o], sizeof(float)) != 0)
                        fail_msg("%s %s %s[%lld]: %.9g read in runs, %.9g widened", c->what, alloy_dtype_name(halves[h]),
                                 ops[k], (long long)o, got[o], want[o]);
                    float pw = pairwise(terms + o * count, count);
                    float hand = k == 2 ? (float)max[o] : k == 1 ? pw / (float)count : pw;
                    if (memcmp(&got[o], &hand, sizeof(float)) != 0 && !(isnan(got[o]) && isnan(hand)))
                        fail_msg("%s %s %s[%lld]: %.9g, the pairwise f32 sum in order %.9g", c->what,
                                 alloy_dtype_name(halves[h]), ops[k], (long long)o, got[o], hand);
                    double ref = k == 2 ? max[o] : k == 1 ? sum[o] / (double)count : sum[o];
                    double tol = k == 2 ? 0 : bound * (k == 1 ? abs_sum[o] / (double)count : abs_sum[o]);
                    if (!(isnan(ref) && isnan(got[o])) && !(fabs((double)got[o] - ref) <= tol))
                        fail_msg("%s %s %s[%lld]: %.9g, the double reference %.9g (bound %.3g)", c->what,
                                 alloy_dtype_name(halves[h]), ops[k], (long long)o, got[o], ref, tol);
                }
                if (ci == 0) assert_true(isnan(got[1]) && !isnan(got[0])); /* the NaN reaches sum, mean and max */
                test_free(got), test_free(want), test_free(sum), test_free(abs_sum), test_free(max), test_free(filled);
                alloy_graph_free(g);
            }
            test_free(v), test_free(x), test_free(wide), test_free(terms);
        }
    }
}

/* Each allocation of a half reduction failing in turn (its run buffer, a
 * gathered output, the column sums' stack): false, nothing leaked. */
static void test_a_failed_allocation_is_a_clean_false(void **state)
{
    (void)state;
    for (int ci = 0; ci < NCASES; ci++) {
        const reduce_case *c = &cases[ci];
        int64_t numel = 1;
        for (int d = 0; d < c->rank; d++) numel *= c->dims[d];
        uint16_t *x = test_calloc((size_t)numel, sizeof(uint16_t));
        const ir_node *n;
        alloy_graph *g = build(c, ALLOY_BF16, 0, &n);
        float *out = test_malloc(sizeof(float) * (size_t)ir_numel(&n->type));
        int failures = 0;
        for (test_fail_at = 0;; test_fail_at++) {
            alloy_set_allocator(test_failing_realloc, NULL);
            test_alloc_count = 0;
            bool ok = ref_reduce_half(n, &g->ir->nodes[0]->type, x, out);
            bool failed = test_alloc_count > test_fail_at;
            alloy_set_allocator(test_cmocka_realloc, NULL);
            if (!failed) {
                assert_true(ok);
                break;
            }
            assert_false(ok);
            failures++;
        }
        test_fail_at = -1;
        assert_true(failures >= 1);
        test_free(out), test_free(x);
        alloy_graph_free(g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_half_reductions_give_the_bits_of_the_widened_copy, test_checked_alloc,
                                        test_plain_alloc),
        cmocka_unit_test_setup_teardown(test_a_failed_allocation_is_a_clean_false, test_checked_alloc,
                                        test_plain_alloc),
    };
    return cmocka_run_group_tests_name("reduce", tests, NULL, NULL);
}
