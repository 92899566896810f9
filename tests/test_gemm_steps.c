/* test_gemm_steps.c - the CPU's GEMM steps at the f16/bf16 range's edge: a product read by its epilogue, and a widened product written into its cast's slot, against hand-worked values. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "support.h"

/* Enough rows that the products span many chunks of the epilogue's loop, some with a value past
 * the range and some without, and more than one block of the widened product's range rule (64Ki
 * elements, on the run's threads); every row one of the four patterns of fill_rows. */
enum { ROWS = 1800, K = 20, OUT = 40, PATTERNS = 4 };

/* Row r of x, pattern r % 4, each row's sum against a column of ones hand-worked: in f16 (a store
 * rounds |s| >= 65520 to inf) 20 x 4000 = 80000 -> inf; 32768 + 32736 + 6 = 65510, kept unrounded by
 * the range rule; 32768 + 32752 = 65520 -> inf, negated -inf. In bf16 (a store rounds |s| >=
 * 0x1.ffp127 to inf) 2^127 + ... + 2^119 = 0x1.ffp127 -> inf though finite in f32; 2^127 + ... +
 * 2^120 = 0x1.fep127 stays; 1 + 2 + 3 = 6; -(2^127 + 2^127) is -inf in f32 already. Every term is
 * exact in its dtype, every sum exact in f32. sums[p] is pattern p's sum after the range rule. */
static void fill_rows(alloy_dtype amp, float *x, double sums[PATTERNS])
{
    memset(x, 0, sizeof(float) * ROWS * K);
    for (int r = 0; r < ROWS; r++) {
        float *row = x + (size_t)r * K;
        int p = r % PATTERNS;
        if (amp == ALLOY_F16) {
            if (p == 0)
                for (int k = 0; k < K; k++) row[k] = 4000;
            if (p == 1) row[0] = 32768, row[1] = 32736, row[2] = 6;
            if (p == 2) row[0] = 32768, row[1] = 32752;
            if (p == 3) row[0] = -32768, row[1] = -32752;
        } else {
            if (p == 0)
                for (int k = 0; k < 9; k++) row[k] = ldexpf(1, 127 - k);
            if (p == 1)
                for (int k = 0; k < 8; k++) row[k] = ldexpf(1, 127 - k);
            if (p == 2) row[0] = 1, row[1] = 2, row[2] = 3;
            if (p == 3) row[0] = -ldexpf(1, 127), row[1] = -ldexpf(1, 127);
        }
    }
    if (amp == ALLOY_F16) sums[0] = INFINITY, sums[1] = 65510, sums[2] = INFINITY, sums[3] = -INFINITY;
    else sums[0] = INFINITY, sums[1] = 0x1.fep127, sums[2] = 6, sums[3] = -INFINITY;
}

/* with_bias: y = f32(f(x) f(w) + f(b)), the add the GEMM step's epilogue (the product read in its
 * chunk loop, ranged); else y = f32(f(x) f(w)) + b, the cast alone the step's epilogue (the product
 * written into the cast's slot). f is the cast to amp; w all ones, b all 0.5. */
static void run(alloy_dtype amp, bool with_bias, const float *x, float *y)
{
    alloy_graph *g = alloy_graph_new("gemm_steps");
    alloy_tensor *xt = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){ROWS, K});
    alloy_tensor *wt = alloy_input(g, "w", ALLOY_F32, 2, (int64_t[]){K, OUT});
    alloy_tensor *bt = alloy_input(g, "b", ALLOY_F32, 1, (int64_t[]){OUT});
    alloy_tensor *p = alloy_matmul(g, alloy_cast(g, xt, amp), alloy_cast(g, wt, amp), false, false);
    alloy_tensor *out = with_bias ? alloy_cast(g, alloy_add(g, p, alloy_cast(g, bt, amp)), ALLOY_F32)
                                  : alloy_add(g, alloy_cast(g, p, ALLOY_F32), bt);
    expect_ok(g, alloy_output(g, "y", out), "output");
    expect_ok(g, alloy_graph_set_option(g, "device", "cpu"), "device");
    static float w[K * OUT], b[OUT];
    for (int i = 0; i < K * OUT; i++) w[i] = 1;
    for (int i = 0; i < OUT; i++) b[i] = 0.5f;
    alloy_host_tensor feeds[3] = {{"x", ALLOY_F32, 2, {ROWS, K}, (void *)x},
                                  {"w", ALLOY_F32, 2, {K, OUT}, w},
                                  {"b", ALLOY_F32, 1, {OUT}, b}},
                      got = {.name = "y"};
    expect_ok(g, alloy_graph_run(g, feeds, 3, &got, 1), "run");
    memcpy(y, got.data, sizeof(float) * ROWS * OUT);
    alloy_graph_free(g);
}

/* The sum s + 0.5 as y holds it, either way: the add of 0.5 to the ranged sum in f32, unrounded
 * (in the epilogue the add is an f16/bf16 value its cast reads before any store, so it keeps f32
 * precision, not more range). Hand-worked: inf and -inf stay; 65510.5 and 6.5 are exact in f32;
 * 0x1.fep127 + 0.5 is 0x1.fep127 in f32; none reaches the range's edge. */
static double plus_half(double s)
{
    if (isinf(s) || s == 0x1.fep127) return s;
    return s + 0.5;
}

static void check(alloy_dtype amp, bool with_bias)
{
    static float x[ROWS * K], y[ROWS * OUT];
    double sums[PATTERNS];
    fill_rows(amp, x, sums);
    run(amp, with_bias, x, y);
    for (int r = 0; r < ROWS; r++) {
        double s = sums[r % PATTERNS];
        double want = plus_half(s);
        for (int o = 0; o < OUT; o++)
            if ((double)y[r * OUT + o] != want)
                fail_msg("%s %s: y[%d, %d] = %.9g, by hand %.9g", alloy_dtype_name(amp),
                         with_bias ? "epilogue add" : "widened product", r, o, y[r * OUT + o], want);
    }
}

/* The product's range rule in its epilogue's chunk loop: inf where a store would give inf (the
 * chunks holding one copy the product through the rule, the others read it in place), the
 * unrounded sum elsewhere. */
static void test_a_product_past_the_range_is_inf_in_its_epilogue(void **state)
{
    (void)state;
    check(ALLOY_F16, true);
    check(ALLOY_BF16, true);
}

/* A widened product written straight into its cast's f32 slot: the range rule applied there in
 * place, the same values as through the chunk loop. */
static void test_a_widened_product_past_the_range_is_inf_in_its_slot(void **state)
{
    (void)state;
    check(ALLOY_F16, false);
    check(ALLOY_BF16, false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_product_past_the_range_is_inf_in_its_epilogue),
        cmocka_unit_test(test_a_widened_product_past_the_range_is_inf_in_its_slot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
