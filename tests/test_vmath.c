/* test_vmath.c - base/vmath.h's f32 exp, erf, tanh and GELU (with its derivative) against f64 libm: ulp bounds over a sweep of every f32 range, special values, and the ops that use them. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "alloy/alloy.h"
#include "base/vmath.h"
#include "support.h"

/* |y - ref| in units of the last place of ref rounded to f32 (subnormal
 * spacing at the bottom); 0 when both are the same infinity or NaN, and a
 * huge value when only one is. */
static double ulp_error(float y, double ref)
{
    if (isnan(ref)) return isnan(y) ? 0 : 1e30;
    float r = (float)ref;
    if (isinf(r)) return isinf(y) && signbit(y) == signbit(r) ? 0 : 1e30;
    if (isinf(y) || isnan(y)) return 1e30;
    int e;
    frexp(r == 0.0f ? 0x1p-149 : (double)r, &e);
    double ulp = fmax(ldexp(1.0, e - 24), 0x1p-149);
    return fabs((double)y - ref) / ulp;
}

typedef struct sweep {
    const char *name;
    float (*f)(float);
    double (*ref)(double);
    double bound; /* ulp: the maximum this sweep measured (vmath.h), plus a margin */
} sweep;

static void check_sweep(const sweep *s)
{
    double worst = 0;
    float at = 0;
    long n = 0;
    /* every 257th f32 from 0 to +inf, both signs: 33M values a function */
    for (uint32_t u = 0; u < 0x7f800000u; u += 257) {
        float x;
        memcpy(&x, &u, sizeof x);
        for (int sign = 0; sign < 2; sign++, x = -x) {
            double e = ulp_error(s->f(x), s->ref((double)x));
            n++;
            if (e > worst) worst = e, at = x;
        }
    }
    printf("%s: max %.3f ulp at %a over %ld values\n", s->name, worst, (double)at, n);
    if (worst > s->bound) fail_msg("%s: %.3f ulp at %a, more than %.2f", s->name, worst, (double)at, s->bound);
}

static void test_exp_is_within_1_1_ulp_everywhere(void **state)
{
    (void)state;
    check_sweep(&(sweep){"exp", al_vexpf, exp, 1.1});
}

static void test_tanh_is_within_1_3_ulp_everywhere(void **state)
{
    (void)state;
    check_sweep(&(sweep){"tanh", al_vtanhf, tanh, 1.3});
}

static void test_erf_is_within_1_2_ulp_everywhere(void **state)
{
    (void)state;
    check_sweep(&(sweep){"erf", al_verff, erf, 1.2});
}

/* GELU and its derivative against f64 by erfc (exact in the negative tail,
 * where 1 + erf cancels): in ulp for x >= 0 and for x in [-3, -1.5), and
 * everywhere |error| <= abs_bound 2^-24 max(1, |x|), which also covers the
 * tiny values of the far negative tail and the derivative's zero near
 * -0.75, where no ulp bound can hold. */
typedef struct gelu_sweep {
    const char *name;
    float (*f)(float);
    double (*ref)(double);
    double pos_ulp, neg_ulp, abs_bound; /* the maxima vgelu.h states, plus a margin */
} gelu_sweep;

static double gelu_ref(double x) { return 0.5 * x * erfc(-x / sqrt(2.0)); }
static double gelu_grad_ref(double x) { return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) * 0.39894228040143267794; }

static void check_gelu_sweep(const gelu_sweep *s)
{
    double pos = 0, neg = 0, abs_worst = 0;
    float pos_at = 0, neg_at = 0, abs_at = 0;
    for (uint32_t u = 0; u < 0x7f800000u; u += 257) {
        float x;
        memcpy(&x, &u, sizeof x);
        for (int sign = 0; sign < 2; sign++, x = -x) {
            double ref = s->ref((double)x);
            if (!isfinite(ref)) continue; /* +-inf in: the special values below */
            float y = s->f(x);
            double e = ulp_error(y, ref);
            if (x >= 0 && e > pos) pos = e, pos_at = x;
            if (x >= -3.0f && x < -1.5f && e > neg) neg = e, neg_at = x;
            double a = fabs((double)y - ref) / (0x1p-24 * fmax(1.0, fabs((double)x)));
            if (a > abs_worst) abs_worst = a, abs_at = x;
        }
    }
    printf("%s: max %.3f ulp for x >= 0 (at %a), %.3f on [-3, -1.5) (at %a), |error| %.3f x 2^-24 max(1, |x|) (at %a)\n",
           s->name, pos, (double)pos_at, neg, (double)neg_at, abs_worst, (double)abs_at);
    if (pos > s->pos_ulp) fail_msg("%s: %.3f ulp at %a, more than %.2f", s->name, pos, (double)pos_at, s->pos_ulp);
    if (neg > s->neg_ulp) fail_msg("%s: %.3f ulp at %a, more than %.2f", s->name, neg, (double)neg_at, s->neg_ulp);
    if (abs_worst > s->abs_bound)
        fail_msg("%s: error %.3f x 2^-24 max(1, |x|) at %a, more than %.2f", s->name, abs_worst, (double)abs_at, s->abs_bound);
}

static void test_gelu_is_within_1_6_ulp_for_positive_x_and_absolutely_close_everywhere(void **state)
{
    (void)state;
    check_gelu_sweep(&(gelu_sweep){"gelu", al_vgeluf, gelu_ref, 1.6, 55, 1.9});
}

static void test_gelu_grad_is_within_1_35_ulp_for_positive_x_and_absolutely_close_everywhere(void **state)
{
    (void)state;
    check_gelu_sweep(&(gelu_sweep){"gelu_grad", al_vgelu_gradf, gelu_grad_ref, 1.35, 16, 1.9});
}

/* NaN stays NaN, signed zeros keep their sign, GELU(+inf) = +inf and its
 * derivative 1 there and 0 at -inf; beyond the tail clamps GELU is x or
 * -0 and its derivative 1 or 0 exactly; GELU(-inf) is NaN, as the erf
 * formula gives. */
static void test_gelu_special_values(void **state)
{
    (void)state;
    assert_true(isnan(al_vgeluf(NAN)) && isnan(al_vgelu_gradf(NAN)));
    assert_true(al_vgeluf(0.0f) == 0.0f && !signbit(al_vgeluf(0.0f)));
    assert_true(al_vgeluf(-0.0f) == 0.0f && signbit(al_vgeluf(-0.0f)));
    assert_true(al_vgelu_gradf(0.0f) == 0.5f && al_vgelu_gradf(-0.0f) == 0.5f);
    assert_true(al_vgeluf(INFINITY) == INFINITY && al_vgelu_gradf(INFINITY) == 1.0f);
    assert_true(isnan(al_vgeluf(-INFINITY)) && al_vgelu_gradf(-INFINITY) == 0.0f);
    static const float big[] = {5.5f, 5.6f, 6.0f, 7.0f, 100.0f, 1e30f, 0x1.fffffep127f};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        float x = big[i];
        if (al_vgeluf(x) != x) fail_msg("gelu(%a) = %a, want x", (double)x, (double)al_vgeluf(x));
        if (!(al_vgeluf(-x) == 0.0f && signbit(al_vgeluf(-x))) && x > 5.5f)
            fail_msg("gelu(%a) = %a, want -0", (double)-x, (double)al_vgeluf(-x));
        if (x > 6.0f && (al_vgelu_gradf(x) != 1.0f || al_vgelu_gradf(-x) != 0.0f))
            fail_msg("gelu_grad(+-%a) = %a, %a, want 1, 0", (double)x, (double)al_vgelu_gradf(x), (double)al_vgelu_gradf(-x));
    }
}

static void test_special_values_are_libms(void **state)
{
    (void)state;
    /* inf, NaN and signed zeros; the edges of exp's range: the largest
     * finite result, the first overflow, the last normal, subnormals and
     * the first value that rounds to 0 */
    static const float xs[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 88.72283f, 88.7229f, -87.33654f,
                               -100.0f, -103.27893f, -103.97208f, -104.0f, -1e30f, 1e30f, 9.0f, 9.2f,
                               3.9f, 3.95f, 1e-30f, -1e-30f, 0x1p-149f};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        float x = xs[i];
        const struct {
            const char *name;
            float y;
            double ref;
            double bound;
        } r[] = {{"exp", al_vexpf(x), exp((double)x), 1.1},
                 {"tanh", al_vtanhf(x), tanh((double)x), 1.3},
                 {"erf", al_verff(x), erf((double)x), 1.2}};
        for (int k = 0; k < 3; k++) {
            double e = ulp_error(r[k].y, r[k].ref);
            if (e > r[k].bound) fail_msg("%s(%a) = %a, want %a", r[k].name, (double)x, (double)r[k].y, r[k].ref);
            /* signed zeros keep their sign, as libm's */
            if (r[k].ref == 0 && signbit(r[k].y) != signbit((float)r[k].ref))
                fail_msg("%s(%a): the sign of zero differs", r[k].name, (double)x);
        }
    }
}

/* The ops run the chunk functions the compiler vectorized (one clone per
 * ISA): each element must be what the scalar function gives, bit for bit,
 * including across the vector/remainder boundary (n = 1000 is not a
 * multiple of 16). */
static void test_the_gelu_op_gives_the_scalar_functions_bits(void **state)
{
    (void)state;
    enum { N = 1000 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = -6.0f + 12.0f * (float)i / N;
    alloy_graph *g = alloy_graph_new("g");
    alloy_tensor *in = alloy_input(g, "x", ALLOY_F32, 1, (int64_t[]){N});
    assert_int_equal(alloy_output(g, "gelu", alloy_gelu(g, in)), ALLOY_OK);
    alloy_host_tensor feed = {"x", ALLOY_F32, 1, {N}, x};
    alloy_host_tensor fetch = {.name = "gelu"};
    assert_int_equal(alloy_graph_run(g, &feed, 1, &fetch, 1), ALLOY_OK);
    const float *y = fetch.data;
    for (int i = 0; i < N; i++) {
        float want = al_vgeluf(x[i]);
        if (memcmp(&want, &y[i], sizeof want)) fail_msg("gelu(%a) = %a, want %a", (double)x[i], (double)y[i], (double)want);
    }
    alloy_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp_is_within_1_1_ulp_everywhere),
        cmocka_unit_test(test_tanh_is_within_1_3_ulp_everywhere),
        cmocka_unit_test(test_erf_is_within_1_2_ulp_everywhere),
        cmocka_unit_test(test_gelu_is_within_1_6_ulp_for_positive_x_and_absolutely_close_everywhere),
        cmocka_unit_test(test_gelu_grad_is_within_1_35_ulp_for_positive_x_and_absolutely_close_everywhere),
        cmocka_unit_test(test_gelu_special_values),
        cmocka_unit_test(test_special_values_are_libms),
        cmocka_unit_test(test_the_gelu_op_gives_the_scalar_functions_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
