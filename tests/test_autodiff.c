/* test_autodiff.c - gradients against f64 finite differences (every differentiable op, the MLP, the transformer block), the backward kernels against double references, AMP, frozen params, the IR round trip, size and speed. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "ir/ir.h"
#include "models.h"
#include "passes/pass.h"
#include "base/convert.h"
#include "runtime/cpu/cpu.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#define F32 ALLOY_F32
#define F16 ALLOY_F16
#define BF16 ALLOY_BF16
#define F64 ALLOY_F64
#define I32 ALLOY_I32
#define I64 ALLOY_I64
#define BOOL ALLOY_BOOL

/* Finite differences: each element x moves by h = FD_STEP * max(1, |x|)
 * both ways and fd = (L(x+h) - L(x-h)) / (2h), all in f64. The truncation
 * error is O(h^2 |L'''|) ~ 1e-12 and the rounding error ~ ulp(L) / h ~
 * 1e-10 |L|, so a correct gradient whose largest element is not far below
 * |L| meets FD_BOUND on
 *     max |grad - fd| / max(max |fd|, 1e-8)
 * over each tensor (every op, the MLP and the transformer block alike) by
 * two orders or more (measured at most a few 1e-9); a wrong formula misses it by
 * many orders. */
#define FD_STEP 1e-6
#define FD_BOUND 1e-6

/* Backward kernels against a double reference: the normalized error
 * sqrt(sum (got - ref)^2 / sum ref^2). They compute in f32 (f64 for f64)
 * and round once on store, so f16/bf16 results are within one rounding
 * (4.9e-4, 3.9e-3) of the reference. */
#define TOL_F32 1e-5
#define TOL_F16 1e-3
#define TOL_BF16 8e-3
#define TOL_F64 1e-12

/* AMP (f16) gradients of the transformer block against the f32 graph's:
 * norm-wise relative error per parameter, ||g_amp - g_f32|| / ||g_f32||.
 * Measured 1.2e-3 to 1.6e-3 for the worst parameter (f16 keeps 11
 * significant bits, 4.9e-4 per rounding, and the f16 forward's errors
 * compound through the backward); the bound leaves more than 10x margin. */
#define AMP_BOUND 2e-2

static al_arena arena; /* the test's scratch, freed at its end (finish) */
static uint64_t rng = 0x9b1d5c2a7e3f4861u;

/* ---- helpers ---- */

static uint64_t next_u64(void) /* splitmix64 */
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static double uniform(double lo, double hi) { return lo + (hi - lo) * (double)(next_u64() >> 11) * 0x1p-53; }
static int irand(int lo, int hi) { return lo + (int)(next_u64() % (uint64_t)(hi - lo + 1)); }

static int failures; /* cases of the running test that failed (reported as they happen) */

/* Reports one failed case and counts it; the test goes on to its other
 * cases and fails at its end (finish), so one run shows every failing op. */
static void case_failed(const char *f, ...) AL_PRINTF(1, 2);
static void case_failed(const char *f, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, f);
    vsnprintf(msg, sizeof msg, f, ap);
    va_end(ap);
    print_error("FAILED: %s\n", msg);
    failures++;
}

static void *scratch(size_t bytes)
{
    void *p = al_arena_alloc(&arena, bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static char *fmt(const char *f, ...) AL_PRINTF(1, 2);
static char *fmt(const char *f, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return al_arena_strdup(&arena, buf);
}

static int64_t numel(int rank, const int64_t *dims)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    return n;
}

/* n values uniform in [lo, hi] with |v| >= gap. */
static double *randoms(int64_t n, double lo, double hi, double gap)
{
    double *v = scratch(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        do v[i] = uniform(lo, hi);
        while (fabs(v[i]) < gap);
    return v;
}

/* n distinct values at least 0.08 apart in random order (no ties for max). */
static double *distinct(int64_t n)
{
    double *v = scratch(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = 0.1 * (double)i - 0.05 * (double)n + uniform(-0.01, 0.01);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = irand(0, (int)i);
        double t = v[i];
        v[i] = v[j], v[j] = t;
    }
    return v;
}

typedef struct shape {
    int rank;
    int64_t dims[ALLOY_MAX_RANK];
} shape;

static shape random_shape(int minrank, int maxrank)
{
    shape s = {.rank = irand(minrank, maxrank)};
    for (int d = 0; d < s.rank; d++) s.dims[d] = irand(1, 4);
    return s;
}

/* A shape that numpy-broadcasts to s: leading dims dropped, some dims 1. */
static shape partner_of(shape s)
{
    shape p = {.rank = irand(0, s.rank)};
    for (int d = 0; d < p.rank; d++) {
        p.dims[d] = s.dims[s.rank - p.rank + d];
        if (irand(0, 2) == 0) p.dims[d] = 1;
    }
    return p;
}

static const char *shape_str(shape s)
{
    char buf[96];
    al_fmt_dims(buf, sizeof buf, s.rank, s.dims);
    return al_arena_strdup(&arena, buf);
}

/* numpy's broadcast of a and b (they must be compatible). */
static shape broadcast_shape(shape a, shape b)
{
    shape out = {.rank = a.rank > b.rank ? a.rank : b.rank};
    for (int d = 0; d < out.rank; d++) {
        int da = d - (out.rank - a.rank), db = d - (out.rank - b.rank);
        int64_t x = da >= 0 ? a.dims[da] : 1, y = db >= 0 ? b.dims[db] : 1;
        assert_true(x == y || x == 1 || y == 1);
        out.dims[d] = x == 1 ? y : x;
    }
    return out;
}

/* Every test ends here: its scratch is freed (the allocator checks leaks)
 * and it fails if any of its cases did. */
static void finish(void)
{
    al_arena_free(&arena);
    int n = failures;
    failures = 0;
    if (n) fail_msg("%d case(s) failed, each reported above", n);
}

static int plain_alloc(void **state)
{
    (void)state;
    al_arena_free(&arena);
    failures = 0;
    alloy_set_allocator(NULL, NULL);
    return 0;
}

/* ---- gradient cases: a graph, its checked leaves, its feeds ---- */

enum { MAX_LEAVES = 24, MAX_FEEDS = 8 };

/* A tensor whose gradient is checked: a param (values set as state) or an
 * f64 input whose gradient was requested (values are its feed). */
typedef struct leaf {
    const char *name;
    int rank;
    int64_t dims[ALLOY_MAX_RANK];
    int64_t count;
    double *v;
    bool input;
} leaf;

typedef struct gcase {
    alloy_graph *g;
    const char *what;
    leaf leaf[MAX_LEAVES];
    int nleaf;
    alloy_host_tensor feed[MAX_FEEDS];
    int nfeed;
    bool check_shape; /* the op's result must have shape `want` */
    shape want;
} gcase;

/* A case over graph g (which it owns from now on). */
static gcase *new_case_on(const char *what, alloy_graph *g)
{
    gcase *c = scratch(sizeof *c);
    c->what = what;
    c->g = g;
    assert_non_null(c->g);
    return c;
}

static gcase *new_case(const char *what) { return new_case_on(what, alloy_graph_new("autodiff_case")); }

static void add_leaf(gcase *c, const char *name, int rank, const int64_t *dims, double *v, bool input)
{
    assert_true(c->nleaf < MAX_LEAVES);
    leaf *l = &c->leaf[c->nleaf++];
    l->name = al_arena_strdup(&arena, name);
    l->rank = rank;
    if (rank) memcpy(l->dims, dims, sizeof(int64_t) * (size_t)rank);
    l->count = numel(rank, dims);
    l->v = v;
    l->input = input;
}

/* An f64 param whose state will be v (its uniform init is overwritten). */
static alloy_tensor *param(gcase *c, const char *name, shape s, double *v)
{
    add_leaf(c, name, s.rank, s.dims, v, false);
    return alloy_param(c->g, name, F64, s.rank, s.dims, alloy_init_uniform(-1, 1));
}

static alloy_tensor *uparam(gcase *c, const char *name, shape s, double lo, double hi)
{
    return param(c, name, s, randoms(numel(s.rank, s.dims), lo, hi, 0));
}

static alloy_tensor *feed(gcase *c, const char *name, alloy_dtype dt, shape s, void *data)
{
    assert_true(c->nfeed < MAX_FEEDS);
    alloy_host_tensor *f = &c->feed[c->nfeed++];
    *f = (alloy_host_tensor){.name = al_arena_strdup(&arena, name), .dtype = dt, .rank = s.rank, .data = data};
    memcpy(f->dims, s.dims, sizeof f->dims);
    return alloy_input(c->g, name, dt, s.rank, s.dims);
}

/* An f64 input fed v whose gradient is requested and checked. */
static alloy_tensor *grad_feed(gcase *c, const char *name, shape s, double *v)
{
    alloy_tensor *t = feed(c, name, F64, s, v);
    assert_int_equal(alloy_graph_request_grad(c->g, t), ALLOY_OK);
    add_leaf(c, name, s.rank, s.dims, v, true);
    return t;
}

static int32_t *ids32(int n, const int *v)
{
    int32_t *p = scratch(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) p[i] = v[i];
    return p;
}

static int64_t *ids64(int n, const int *v)
{
    int64_t *p = scratch(sizeof(int64_t) * (size_t)n);
    for (int i = 0; i < n; i++) p[i] = v[i];
    return p;
}

/* Makes the named params of a model built in c->g leaves, at their initial values. */
static void adopt_params(gcase *c, int n, const char *const *names)
{
    for (int i = 0; i < n; i++) {
        alloy_host_tensor t;
        if (alloy_graph_get_state(c->g, names[i], &t)) fail_msg("no state '%s': %s", names[i], alloy_last_error(c->g));
        assert_int_equal(t.dtype, F64);
        int64_t count = numel(t.rank, t.dims);
        double *v = scratch(sizeof(double) * (size_t)count);
        memcpy(v, t.data, sizeof(double) * (size_t)count);
        add_leaf(c, names[i], t.rank, t.dims, v, false);
    }
}

static bool set_param(gcase *c, const leaf *l)
{
    alloy_host_tensor t = {.name = l->name, .dtype = F64, .rank = l->rank, .data = l->v};
    memcpy(t.dims, l->dims, sizeof t.dims);
    if (!alloy_graph_set_state(c->g, &t)) return true;
    case_failed("%s: set_state '%s': %s", c->what, l->name, alloy_last_error(c->g));
    return false;
}

static double loss_of(gcase *c)
{
    alloy_host_tensor f = {.name = "loss"};
    if (alloy_graph_run(c->g, c->feed, c->nfeed, &f, 1))
        fail_msg("%s: run failed: %s", c->what, alloy_last_error(c->g));
    return *(const double *)f.data;
}

/* Frees c's graph after a failed case; returns the error a failed case counts as. */
static double drop_case(gcase *c)
{
    alloy_graph_free(c->g);
    c->g = NULL;
    return INFINITY;
}

/* Makes `loss` c's loss, runs once fetching "grad:<leaf>" for every leaf
 * (each must be f64 with the leaf's shape) and compares every element of
 * each with central finite differences (FD_BOUND). Frees the graph; returns
 * the worst error. AUTODIFF_VERBOSE=1 prints each tensor's error. */
static double check_case(gcase *c, alloy_tensor *loss)
{
    alloy_graph *g = c->g;
    if (!loss || alloy_graph_set_loss(g, loss)) {
        case_failed("%s: building failed: %s", c->what, alloy_last_error(g));
        return drop_case(c);
    }
    for (int j = 0; j < c->nleaf; j++)
        if (!c->leaf[j].input && !set_param(c, &c->leaf[j])) return drop_case(c);
    alloy_host_tensor *f = scratch(sizeof *f * (size_t)(c->nleaf + 1));
    f[0].name = "loss";
    for (int j = 0; j < c->nleaf; j++) f[j + 1].name = fmt("grad:%s", c->leaf[j].name);
    if (alloy_graph_run(g, c->feed, c->nfeed, f, c->nleaf + 1)) {
        case_failed("%s: run failed: %s", c->what, alloy_last_error(g));
        return drop_case(c);
    }
    double **grad = scratch(sizeof(double *) * (size_t)c->nleaf);
    for (int j = 0; j < c->nleaf; j++) {
        const leaf *l = &c->leaf[j];
        if (f[j + 1].dtype != F64 || f[j + 1].rank != l->rank ||
            memcmp(f[j + 1].dims, l->dims, sizeof(int64_t) * (size_t)l->rank) != 0) {
            case_failed("%s: %s has dtype %s rank %d, expected f64 rank %d", c->what, f[j + 1].name,
                        alloy_dtype_name(f[j + 1].dtype), f[j + 1].rank, l->rank);
            return drop_case(c);
        }
        grad[j] = scratch(sizeof(double) * (size_t)l->count);
        memcpy(grad[j], f[j + 1].data, sizeof(double) * (size_t)l->count);
    }
    double worst = 0;
    for (int j = 0; j < c->nleaf; j++) {
        leaf *l = &c->leaf[j];
        int64_t at = -1;
        double maxdiff = 0, maxfd = 0, at_g = 0, at_fd = 0;
        for (int64_t i = 0; i < l->count; i++) {
            double x0 = l->v[i], h = FD_STEP * fmax(1, fabs(x0)), xp = x0 + h, xm = x0 - h;
            l->v[i] = xp;
            if (!l->input) assert_true(set_param(c, l));
            double lp = loss_of(c);
            l->v[i] = xm;
            if (!l->input) assert_true(set_param(c, l));
            double lm = loss_of(c);
            l->v[i] = x0;
            if (!l->input) assert_true(set_param(c, l));
            double fd = (lp - lm) / (xp - xm), diff = fabs(grad[j][i] - fd);
            if (!isfinite(fd) || !isfinite(grad[j][i])) {
                case_failed("%s: grad:%s element %lld is %g, finite differences %g", c->what, l->name,
                            (long long)i, grad[j][i], fd);
                return drop_case(c);
            }
            maxfd = fmax(maxfd, fabs(fd));
            if (diff >= maxdiff) maxdiff = diff, at = i, at_g = grad[j][i], at_fd = fd;
        }
        double err = maxdiff / fmax(maxfd, 1e-8);
        if (getenv("AUTODIFF_VERBOSE")) printf("    grad:%-10s max |fd| %.3g, error %.2g\n", l->name, maxfd, err);
        if (err > FD_BOUND)
            case_failed("%s: grad:%s element %lld is %.12g, finite differences give %.12g (error %.2e > %.0e)",
                        c->what, l->name, (long long)at, at_g, at_fd, err, FD_BOUND);
        worst = fmax(worst, err);
    }
    printf("  %-58s error %.1e\n", c->what, worst);
    alloy_graph_free(g);
    c->g = NULL;
    return worst;
}

/* loss = reduce_sum(out * R) with R a fixed random constant of out's shape,
 * so every element of out matters; then check_case. */
static double check_op(gcase *c, alloy_tensor *out)
{
    if (!out) {
        case_failed("%s: building failed: %s", c->what, alloy_last_error(c->g));
        return drop_case(c);
    }
    alloy_host_tensor t = alloy_tensor_info(out);
    if (c->check_shape && (t.rank != c->want.rank || memcmp(t.dims, c->want.dims, sizeof(int64_t) * (size_t)t.rank))) {
        shape got = {.rank = t.rank};
        memcpy(got.dims, t.dims, sizeof got.dims);
        case_failed("%s: result shape %s, expected %s", c->what, shape_str(got), shape_str(c->want));
        return drop_case(c);
    }
    double *r = randoms(numel(t.rank, t.dims), -1, 1, 0.1);
    alloy_tensor *R = alloy_constant(c->g, F64, t.rank, t.dims, r);
    alloy_tensor *loss = alloy_reduce_sum(c->g, alloy_mul(c->g, out, R), 0, NULL, false);
    alloy_output(c->g, "loss", loss);
    return check_case(c, loss);
}

/* ---- every differentiable op against finite differences ---- */

typedef alloy_tensor *(*unary_fn)(alloy_graph *, alloy_tensor *);
typedef alloy_tensor *(*binary_fn)(alloy_graph *, alloy_tensor *, alloy_tensor *);

static void test_unary_elementwise_gradients_match_finite_differences(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        unary_fn f;
        double lo, hi, gap;
    } ops[] = {
        {"neg", alloy_neg, -2, 2, 0},
        {"relu", alloy_relu, -2, 2, 0.05}, /* away from the kink at 0 */
        {"gelu", alloy_gelu, -3, 3, 0},
        {"gelu_tanh", alloy_gelu_tanh, -3, 3, 0},
        {"tanh", alloy_tanh, -2, 2, 0},
        {"sigmoid", alloy_sigmoid, -3, 3, 0},
        {"silu", alloy_silu, -3, 3, 0},
        {"exp", alloy_exp, -2, 2, 0},
        {"log", alloy_log, 0.3, 3, 0}, /* inside the domains x > 0 */
        {"sqrt", alloy_sqrt, 0.3, 3, 0},
        {"rsqrt", alloy_rsqrt, 0.3, 3, 0},
        {"square", alloy_square, -2, 2, 0},
        {"amp_allow", alloy_amp_allow, -2, 2, 0}, /* identities while AMP is off */
        {"amp_deny", alloy_amp_deny, -2, 2, 0},
    };
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
        for (int trial = 0; trial < 3; trial++) {
            shape s = random_shape(trial, 3);
            gcase *c = new_case(fmt("%s %s", ops[k].name, shape_str(s)));
            alloy_tensor *x = param(c, "x", s, randoms(numel(s.rank, s.dims), ops[k].lo, ops[k].hi, ops[k].gap));
            check_op(c, ops[k].f(c->g, x));
        }
    finish();
}

/* Values of a binary op's operand j. maximum/minimum take a from the grid
 * 0.1k + 0.05 and b from 0.1k, so no pair ties (they differ by >= 0.05). */
static double *binary_values(const char *op, int j, shape s)
{
    int64_t n = numel(s.rank, s.dims);
    if (!strcmp(op, "maximum") || !strcmp(op, "minimum")) {
        double *v = scratch(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) v[i] = 0.1 * irand(-15, 15) + (j == 0 ? 0.05 : 0);
        return v;
    }
    if (!strcmp(op, "div") && j == 1) return randoms(n, -2, 2, 0.5); /* divisor away from 0 */
    if (!strcmp(op, "pow") && j == 0) return randoms(n, 0.5, 2, 0);  /* base > 0 */
    return randoms(n, -2, 2, 0);
}

static void test_binary_elementwise_gradients_match_finite_differences_when_broadcasting(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        binary_fn f;
    } ops[] = {{"add", alloy_add},         {"sub", alloy_sub},         {"mul", alloy_mul}, {"div", alloy_div},
               {"maximum", alloy_maximum}, {"minimum", alloy_minimum}, {"pow", alloy_pow}};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        for (int trial = 0; trial < 7; trial++) {
            shape s = random_shape(trial < 3 ? 1 : 2, 3), a = s, b = s;
            if (trial == 1) b = partner_of(s); /* b broadcasts */
            if (trial == 2) a = partner_of(s); /* a broadcasts */
            if (trial == 3 || trial == 4)      /* both broadcast: [3,1] with [1,4] and the like */
                for (int d = 0; d < s.rank; d++) {
                    int which = d % 2 == trial % 2 ? 0 : 1;
                    (which ? &b : &a)->dims[d] = 1;
                }
            if (trial == 5) a = (shape){2, {3, 1}}, b = (shape){3, {2, 3, 4}}; /* a of lower rank */
            if (trial == 6) a = (shape){1, {1}}, b = (shape){2, {5, 1}};
            gcase *c = new_case(fmt("%s %s %s%s", ops[k].name, shape_str(a), shape_str(b), trial == 4 ? " (b an input)" : ""));
            c->check_shape = true, c->want = broadcast_shape(a, b);
            alloy_tensor *ta = param(c, "a", a, binary_values(ops[k].name, 0, a));
            /* trial 4 feeds b as an input whose gradient is requested */
            alloy_tensor *tb = trial == 4 ? grad_feed(c, "b", b, binary_values(ops[k].name, 1, b))
                                          : param(c, "b", b, binary_values(ops[k].name, 1, b));
            check_op(c, ops[k].f(c->g, ta, tb));
        }
        /* one tensor reaching both operands: the two gradients add up (x and
         * tanh(x) never tie on the grid max/min use, and keep div's divisor
         * away from 0) */
        shape s = random_shape(1, 3);
        gcase *c = new_case(fmt("%s(x, tanh(x)) %s", ops[k].name, shape_str(s)));
        alloy_tensor *x = param(c, "x", s, binary_values(ops[k].name, strcmp(ops[k].name, "div") ? 0 : 1, s));
        check_op(c, ops[k].f(c->g, x, alloy_tanh(c->g, x)));
    }
    finish();
}

static void test_where_sends_the_gradient_to_the_selected_operand_when_broadcasting(void **state)
{
    (void)state;
    for (int trial = 0; trial < 5; trial++) {
        shape s = random_shape(1, 3), cs = s, as = s, bs = s;
        if (trial == 1) cs = partner_of(s), bs = partner_of(s);
        if (trial == 2) as = partner_of(s);
        if (trial == 3) bs = partner_of(s), as = partner_of(s);
        if (trial == 4) cs = (shape){2, {3, 1}}, as = (shape){3, {2, 3, 4}}, bs = (shape){1, {4}}; /* cond of lower rank */
        gcase *c = new_case(fmt("where %s %s %s", shape_str(cs), shape_str(as), shape_str(bs)));
        c->check_shape = true, c->want = broadcast_shape(broadcast_shape(cs, as), bs);
        int64_t n = numel(cs.rank, cs.dims);
        double *cond = scratch(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) cond[i] = i == 0 ? 1 : i == 1 ? 0 : irand(0, 1);
        alloy_tensor *tc = alloy_constant(c->g, BOOL, cs.rank, cs.dims, cond);
        alloy_tensor *ta = uparam(c, "a", as, -2, 2), *tb = uparam(c, "b", bs, -2, 2);
        check_op(c, alloy_where(c->g, tc, ta, tb));
    }
    finish();
}

static void test_matmul_gradients_for_every_transpose_and_broadcast_batch(void **state)
{
    (void)state;
    static const struct {
        int ra, rb;
        int64_t ba[2], bb[2];
    } batches[] = {
        {0, 0, {0}, {0}},       /* 2-D */
        {2, 1, {2, 1}, {3}},    /* [2,1] with [3] -> [2,3] */
        {1, 0, {3}, {0}},       /* batched a, 2-D b */
        {0, 2, {0}, {2, 2}},    /* 2-D a, batched b */
        {1, 1, {2}, {2}},       /* equal batches */
    };
    for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++)
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            int64_t m = irand(1, 4), k = irand(2, 4), n = irand(1, 4);
            shape a = {.rank = batches[bi].ra + 2}, b = {.rank = batches[bi].rb + 2};
            memcpy(a.dims, batches[bi].ba, sizeof(int64_t) * (size_t)batches[bi].ra);
            memcpy(b.dims, batches[bi].bb, sizeof(int64_t) * (size_t)batches[bi].rb);
            a.dims[a.rank - 2] = ta ? k : m, a.dims[a.rank - 1] = ta ? m : k;
            b.dims[b.rank - 2] = tb ? n : k, b.dims[b.rank - 1] = tb ? k : n;
            gcase *c = new_case(fmt("matmul %s%s %s%s", shape_str(a), ta ? "^T" : "", shape_str(b), tb ? "^T" : ""));
            alloy_tensor *pa = uparam(c, "a", a, -1, 1), *pb = uparam(c, "b", b, -1, 1);
            check_op(c, alloy_matmul(c->g, pa, pb, ta, tb));
        }
    finish();
}

static void test_reduction_gradients_over_several_axes_with_and_without_keepdims(void **state)
{
    (void)state;
    static const struct {
        int n; /* -1: axes absent (all) */
        int64_t axes[3];
    } sets[] = {{-1, {0}}, {0, {0}}, {1, {0}}, {1, {1}}, {1, {2}}, {1, {-1}}, {2, {0, 2}}, {2, {-1, -2}}, {3, {0, 1, 2}}};
    static const struct {
        const char *name;
        alloy_tensor *(*f)(alloy_graph *, alloy_tensor *, int, const int64_t *, bool);
    } ops[] = {{"reduce_sum", alloy_reduce_sum}, {"reduce_mean", alloy_reduce_mean}, {"reduce_max", alloy_reduce_max}};
    shape s = {3, {2, 3, 4}};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
        for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
            for (int keep = 0; keep < 2; keep++) {
                char axes[64] = "all";
                if (sets[i].n >= 0) al_fmt_dims(axes, sizeof axes, sets[i].n, sets[i].axes);
                gcase *c = new_case(fmt("%s %s axes %s keepdims %d", ops[k].name, shape_str(s), axes, keep));
                /* distinct values: reduce_max has a unique maximum everywhere */
                alloy_tensor *x = param(c, "x", s, distinct(24));
                check_op(c, ops[k].f(c->g, x, sets[i].n < 0 ? 0 : sets[i].n, sets[i].n < 0 ? NULL : sets[i].axes, keep));
            }
    finish();
}

static void test_softmax_and_log_softmax_gradients_along_the_last_and_a_middle_axis(void **state)
{
    (void)state;
    static const int axes[] = {-1, 1, 0, 2};
    shape s = {3, {2, 3, 4}};
    for (int log_out = 0; log_out < 2; log_out++)
        for (size_t i = 0; i < sizeof axes / sizeof axes[0]; i++) {
            gcase *c = new_case(fmt("%s %s axis %d", log_out ? "log_softmax" : "softmax", shape_str(s), axes[i]));
            alloy_tensor *x = uparam(c, "x", s, -2, 2);
            check_op(c, log_out ? alloy_log_softmax(c->g, x, axes[i]) : alloy_softmax(c->g, x, axes[i]));
        }
    finish();
}

static void test_layer_norm_gradients_with_and_without_affine(void **state)
{
    (void)state;
    static const shape shapes[] = {{2, {3, 5}}, {3, {2, 2, 6}}, {1, {7}}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int affine = 0; affine < 2; affine++) {
            shape s = shapes[i], d = {1, {s.dims[s.rank - 1]}};
            gcase *c = new_case(fmt("layer_norm %s %s", shape_str(s), affine ? "affine" : "plain"));
            alloy_tensor *x = uparam(c, "x", s, -2, 2), *gamma = NULL, *beta = NULL;
            if (affine) gamma = uparam(c, "gamma", d, 0.5, 1.5), beta = uparam(c, "beta", d, -0.5, 0.5);
            check_op(c, alloy_layer_norm(c->g, x, gamma, beta, 1e-5));
        }
    finish();
}

static void test_rms_norm_gradients_with_and_without_gamma(void **state)
{
    (void)state;
    static const shape shapes[] = {{2, {3, 5}}, {3, {2, 2, 6}}, {1, {7}}, {2, {4, 2}}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int affine = 0; affine < 2; affine++) {
            shape s = shapes[i], d = {1, {s.dims[s.rank - 1]}};
            gcase *c = new_case(fmt("rms_norm %s %s", shape_str(s), affine ? "gamma" : "plain"));
            alloy_tensor *x = uparam(c, "x", s, -2, 2), *gamma = affine ? uparam(c, "gamma", d, 0.5, 1.5) : NULL;
            check_op(c, alloy_rms_norm(c->g, x, gamma, 1e-5));
        }
    finish();
}

static void test_cross_entropy_gradient_of_the_logits(void **state)
{
    (void)state;
    {
        gcase *c = new_case("cross_entropy [4,5] i32 targets");
        alloy_tensor *logits = uparam(c, "logits", (shape){2, {4, 5}}, -2, 2);
        alloy_tensor *t = feed(c, "targets", I32, (shape){1, {4}}, ids32(4, (int[]){0, 4, 2, 2}));
        check_op(c, alloy_cross_entropy(c->g, logits, t));
    }
    {
        gcase *c = new_case("cross_entropy [2,3,4] i64 targets");
        alloy_tensor *logits = uparam(c, "logits", (shape){3, {2, 3, 4}}, -2, 2);
        alloy_tensor *t = feed(c, "targets", I64, (shape){2, {2, 3}}, ids64(6, (int[]){3, 0, 1, 1, 2, 3}));
        check_op(c, alloy_cross_entropy(c->g, logits, t));
    }
    {
        gcase *c = new_case("cross_entropy [5] with a scalar target");
        alloy_tensor *logits = uparam(c, "logits", (shape){1, {5}}, -2, 2);
        alloy_tensor *t = feed(c, "targets", I32, (shape){0, {0}}, ids32(1, (int[]){3}));
        check_op(c, alloy_cross_entropy(c->g, logits, t));
    }
    finish();
}

static void test_embedding_gradient_sums_the_rows_of_repeated_ids(void **state)
{
    (void)state;
    {
        gcase *c = new_case("embedding ids i32 [2,3] table [5,3]");
        alloy_tensor *ids = feed(c, "ids", I32, (shape){2, {2, 3}}, ids32(6, (int[]){1, 3, 1, 0, 3, 1}));
        check_op(c, alloy_embedding(c->g, ids, uparam(c, "table", (shape){2, {5, 3}}, -1, 1)));
    }
    {
        gcase *c = new_case("embedding ids i64 [4] table [6,2]");
        alloy_tensor *ids = feed(c, "ids", I64, (shape){1, {4}}, ids64(4, (int[]){4, 4, 0, 2}));
        check_op(c, alloy_embedding(c->g, ids, uparam(c, "table", (shape){2, {6, 2}}, -1, 1)));
    }
    finish();
}

static void test_data_movement_gradients_match_finite_differences(void **state)
{
    (void)state;
    shape s = {3, {2, 3, 4}};
    static const int64_t reshapes[][3] = {{4, 6, 0}, {24, 0, 0}, {3, -1, 2}};
    static const int reshape_rank[] = {2, 1, 3};
    for (int i = 0; i < 3; i++) {
        gcase *c = new_case(fmt("reshape %s to rank %d", shape_str(s), reshape_rank[i]));
        check_op(c, alloy_reshape(c->g, uparam(c, "x", s, -1, 1), reshape_rank[i], reshapes[i]));
    }
    static const int64_t perms[][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int i = 0; i < 6; i++) {
        gcase *c = new_case(fmt("transpose %s perm [%d,%d,%d]", shape_str(s), (int)perms[i][0], (int)perms[i][1],
                                (int)perms[i][2]));
        check_op(c, alloy_transpose(c->g, uparam(c, "x", s, -1, 1), perms[i]));
    }
    static const struct {
        shape from, to;
    } bcasts[] = {{{2, {3, 1}}, {3, {2, 3, 4}}}, {{1, {4}}, {2, {3, 4}}}, {{0, {0}}, {2, {2, 2}}}, {{3, {1, 3, 1}}, {3, {2, 3, 4}}}};
    for (int i = 0; i < 4; i++) {
        gcase *c = new_case(fmt("broadcast_to %s -> %s", shape_str(bcasts[i].from), shape_str(bcasts[i].to)));
        check_op(c, alloy_broadcast_to(c->g, uparam(c, "x", bcasts[i].from, -1, 1), bcasts[i].to.rank, bcasts[i].to.dims));
    }
    static const struct {
        int axis;
        int64_t start, end;
    } slices[] = {{1, 1, 4}, {0, 2, 3}, {-1, -1, 2}, {2, 0, 2}};
    shape ss = {3, {3, 5, 2}};
    for (int i = 0; i < 4; i++) {
        gcase *c = new_case(fmt("slice %s axis %d [%lld, %lld)", shape_str(ss), slices[i].axis,
                                (long long)slices[i].start, (long long)slices[i].end));
        check_op(c, alloy_slice(c->g, uparam(c, "x", ss, -1, 1), slices[i].axis, slices[i].start, slices[i].end));
    }
    {
        gcase *c = new_case("concat [2,1,3] [2,2,3] [2,3,3] axis 1");
        alloy_tensor *xs[3] = {uparam(c, "x0", (shape){3, {2, 1, 3}}, -1, 1), uparam(c, "x1", (shape){3, {2, 2, 3}}, -1, 1),
                               uparam(c, "x2", (shape){3, {2, 3, 3}}, -1, 1)};
        check_op(c, alloy_concat(c->g, 3, xs, 1));
    }
    {
        gcase *c = new_case("concat [1,4] [2,4] axis 0");
        alloy_tensor *xs[2] = {uparam(c, "x0", (shape){2, {1, 4}}, -1, 1), uparam(c, "x1", (shape){2, {2, 4}}, -1, 1)};
        check_op(c, alloy_concat(c->g, 2, xs, 0));
    }
    {
        gcase *c = new_case("concat [2,2] [2,3] axis -1");
        alloy_tensor *xs[2] = {uparam(c, "x0", (shape){2, {2, 2}}, -1, 1), uparam(c, "x1", (shape){2, {2, 3}}, -1, 1)};
        check_op(c, alloy_concat(c->g, 2, xs, -1));
    }
    /* as in attention: -inf entries only make sense through a softmax */
    static const shape masks[] = {{3, {2, 3, 4}}, {2, {3, 3}}, {4, {1, 2, 2, 3}}};
    for (int i = 0; i < 3; i++) {
        gcase *c = new_case(fmt("softmax(causal_mask) %s", shape_str(masks[i])));
        check_op(c, alloy_softmax(c->g, alloy_causal_mask(c->g, uparam(c, "x", masks[i], -2, 2)), -1));
    }
    {
        gcase *c = new_case("cast f64 -> f64 [2,3]");
        check_op(c, alloy_cast(c->g, uparam(c, "x", (shape){2, {2, 3}}, -1, 1), F64));
    }
    finish();
}

/* Through f32 the function is piecewise constant, so finite differences say
 * nothing; the gradient of a cast is the gradient cast back (straight
 * through): d/dx sum(cast64(cast32(x)) * R) = R rounded to f32 and back. */
static void test_cast_through_f32_passes_the_gradient_straight_through_rounded_to_f32(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("cast_through_f32");
    double *r = randoms(6, -1, 1, 0.1);
    alloy_tensor *x = alloy_param(g, "x", F64, 2, DIMS(2, 3), alloy_init_uniform(-1, 1));
    alloy_tensor *y = alloy_cast(g, alloy_cast(g, x, F32), F64);
    alloy_tensor *loss = alloy_reduce_sum(g, alloy_mul(g, y, alloy_constant(g, F64, 2, DIMS(2, 3), r)), 0, NULL, false);
    assert_int_equal(alloy_graph_set_loss(g, loss), ALLOY_OK);
    alloy_host_tensor f = {.name = "grad:x"};
    if (alloy_graph_run(g, NULL, 0, &f, 1)) fail_msg("%s", alloy_last_error(g));
    assert_int_equal(f.dtype, F64);
    for (int i = 0; i < 6; i++) assert_true(((const double *)f.data)[i] == (double)(float)r[i]);
    alloy_graph_free(g);
    finish();
}

/* Parses IR text into an alloy graph (failing the test on error). */
static alloy_graph *parse_graph(const char *text)
{
    char err[512];
    alloy_graph *g = alloy_graph_parse(text, strlen(text), "test.ir", err, sizeof err);
    if (!g) fail_msg("parse: %s", err);
    return g;
}

/* causal_mask's `value` attribute (default -inf) may be finite; the masked
 * entries are constants either way, so their gradient is 0 and the rest
 * pass dy through: checked where dy reaches the masked entries directly. */
static void test_causal_mask_gradient_is_zero_exactly_where_the_mask_holds(void **state)
{
    (void)state;
    gcase *c = new_case_on("causal_mask {value=-3.0} [2,3,4] from IR text",
                           parse_graph("graph masked {\n"
                                       "  %x = param {init=\"uniform\", low=-1.0, high=1.0} : f64[2,3,4]\n"
                                       "  %m = causal_mask(%x) {value=-3.0} : f64[2,3,4]\n"
                                       "}\n"));
    add_leaf(c, "x", 3, DIMS(2, 3, 4), randoms(24, -2, 2, 0), false);
    check_op(c, alloy_graph_find(c->g, "m"));
    finish();
}

/* Parsed IR keeps axes as written (negative ones too), unlike the builder. */
static void test_slice_and_concat_with_negative_axes_from_ir_text_differentiate(void **state)
{
    (void)state;
    gcase *c = new_case_on("slice {axis=-1} [2,5] -> [2,3] from IR text",
                           parse_graph("graph negative_slice {\n"
                                       "  %x = param {init=\"uniform\", low=-1.0, high=1.0} : f64[2,5]\n"
                                       "  %s = slice(%x) {axis=-1, start=1, end=4} : f64[2,3]\n"
                                       "}\n"));
    add_leaf(c, "x", 2, DIMS(2, 5), randoms(10, -1, 1, 0), false);
    check_op(c, alloy_graph_find(c->g, "s"));
    c = new_case_on("concat {axis=-1} [2,2] [2,3] from IR text (y an input)",
                    parse_graph("graph negative_concat {\n"
                                "  %x = param {init=\"uniform\", low=-1.0, high=1.0} : f64[2,2]\n"
                                "  %y = input : f64[2,3]\n"
                                "  %c = concat(%x, %y) {axis=-1} : f64[2,5]\n"
                                "}\n"));
    add_leaf(c, "x", 2, DIMS(2, 2), randoms(4, -1, 1, 0), false);
    double *y = randoms(6, -1, 1, 0);
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "y", .dtype = F64, .rank = 2, .dims = {2, 3}, .data = y};
    assert_int_equal(alloy_graph_request_grad(c->g, alloy_graph_find(c->g, "y")), ALLOY_OK);
    add_leaf(c, "y", 2, DIMS(2, 3), y, true);
    check_op(c, alloy_graph_find(c->g, "c"));
    finish();
}

/* ---- models ---- */

static const char *const mlp_params[] = {"w1", "b1", "w2", "b2"};
static const char *const block_params[] = {"tok_emb", "pos_emb", "ln1.g",  "ln1.b",  "attn.wq", "attn.wk",
                                           "attn.wv", "attn.wo", "ln2.g",  "ln2.b",  "mlp.w1",  "mlp.b1",
                                           "mlp.w2",  "mlp.b2",  "lnf.g",  "lnf.b",  "head.w"};
enum { NBLOCK = sizeof block_params / sizeof block_params[0] };

static void test_mlp_parameter_gradients_match_finite_differences(void **state)
{
    (void)state;
    gcase *c = new_case("mlp f64 batch 4, 3 -> 5 -> 3");
    test_mlp m = build_mlp(c->g, F64, 4, 3, 5, 3);
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "x", .dtype = F64, .rank = 2, .dims = {4, 3}, .data = randoms(12, -1, 1, 0)};
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "targets", .dtype = I32, .rank = 1, .dims = {4},
                                              .data = ids32(4, (int[]){0, 2, 1, 2})};
    adopt_params(c, 4, mlp_params);
    check_case(c, m.loss);
    finish();
}

static void block_feeds(gcase *c, int B, int T, int V)
{
    int *tok = scratch(sizeof(int) * (size_t)(2 * B * T));
    for (int i = 0; i < 2 * B * T; i++) tok[i] = irand(0, V - 1);
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "tokens", .dtype = I32, .rank = 2, .dims = {B, T}, .data = ids32(B * T, tok)};
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "targets", .dtype = I32, .rank = 1, .dims = {B * T},
                                              .data = ids32(B * T, tok + B * T)};
}

static void test_transformer_block_parameter_gradients_match_finite_differences(void **state)
{
    (void)state;
    gcase *c = new_case("transformer block f64 B2 T3 V7 D8 H2");
    test_block m = build_transformer_block(c->g, F64, 2, 3, 7, 8, 2);
    block_feeds(c, 2, 3, 7);
    adopt_params(c, NBLOCK, block_params);
    /* The models' init makes attention nearly uniform, so d loss / d wq, wk
     * are ~1e-4 and finite differences (noise ~ ulp(loss) / h ~ 3e-10) would
     * resolve them only to ~1e-6. Weights in +-0.6 (scores of order one),
     * gammas in [0.5, 1.5] and betas in +-0.5 put every gradient at 1e-2 or
     * more, where the FD noise is below 1e-7 relative. */
    for (int j = 0; j < c->nleaf; j++) {
        leaf *l = &c->leaf[j];
        const char *dot = strrchr(l->name, '.');
        bool gamma = dot && !strcmp(dot, ".g"), beta = dot && !strcmp(dot, ".b");
        if (strstr(l->name, "emb")) continue; /* embeddings keep their normal(0.5) */
        memcpy(l->v, randoms(l->count, gamma ? 0.5 : beta ? -0.5 : -0.6, gamma ? 1.5 : beta ? 0.5 : 0.6, 0),
               sizeof(double) * (size_t)l->count);
    }
    check_case(c, m.loss);
    finish();
}

/* Runs g fetching loss and "grad:<p>" of every block param into *grads
 * (copies, as f64); checks each gradient's dtype is want. */
static void block_grads(alloy_graph *g, const alloy_host_tensor *feeds, double **grads, int64_t *counts, alloy_dtype want)
{
    alloy_host_tensor f[NBLOCK];
    for (int j = 0; j < NBLOCK; j++) f[j] = (alloy_host_tensor){.name = fmt("grad:%s", block_params[j])};
    if (alloy_graph_run(g, feeds, 2, f, NBLOCK)) fail_msg("%s", alloy_last_error(g));
    for (int j = 0; j < NBLOCK; j++) {
        if (f[j].dtype != want)
            fail_msg("%s is %s, expected %s", f[j].name, alloy_dtype_name(f[j].dtype), alloy_dtype_name(want));
        counts[j] = numel(f[j].rank, f[j].dims);
        grads[j] = scratch(sizeof(double) * (size_t)counts[j]);
        cvt_load_f64(f[j].dtype, f[j].data, grads[j], (size_t)counts[j]);
    }
}

static int count_op(const ir_graph *c, int op)
{
    int n = 0;
    for (int i = 0; i < c->nnodes; i++) n += c->nodes[i]->op == op;
    return n;
}

static void test_amp_gradients_of_the_transformer_block_are_f32_and_close_to_the_f32_graph(void **state)
{
    (void)state;
    enum { B = 2, T = 8, V = 16, D = 16, H = 2 };
    alloy_graph *ref = alloy_graph_new("block_f32"), *amp = alloy_graph_new("block_amp");
    test_block mr = build_transformer_block(ref, F32, B, T, V, D, H);
    test_block ma = build_transformer_block(amp, F32, B, T, V, D, H);
    assert_int_equal(alloy_graph_set_loss(ref, mr.loss), ALLOY_OK);
    assert_int_equal(alloy_graph_set_loss(amp, ma.loss), ALLOY_OK);
    assert_int_equal(alloy_graph_enable_amp(amp, F16), ALLOY_OK);
    gcase *c = new_case("amp feeds"); /* only its feeds are used */
    alloy_graph_free(c->g);
    block_feeds(c, B, T, V);
    double *gr[NBLOCK], *ga[NBLOCK];
    int64_t nr[NBLOCK], na[NBLOCK];
    block_grads(ref, c->feed, gr, nr, F32); /* same seed, same names: same initial parameters */
    block_grads(amp, c->feed, ga, na, F32);
    double worst = 0;
    for (int j = 0; j < NBLOCK; j++) {
        assert_int_equal(nr[j], na[j]);
        double diff2 = 0, ref2 = 0;
        for (int64_t i = 0; i < nr[j]; i++) diff2 += (ga[j][i] - gr[j][i]) * (ga[j][i] - gr[j][i]), ref2 += gr[j][i] * gr[j][i];
        double err = sqrt(diff2 / ref2);
        assert_true(ref2 > 0);
        if (err > AMP_BOUND) fail_msg("grad:%s under AMP: relative error %.3g > %.0e", block_params[j], err, AMP_BOUND);
        worst = fmax(worst, err);
    }
    printf("  AMP f16 vs f32 parameter gradients: worst relative error %.2e (bound %.0e)\n", worst, AMP_BOUND);
    /* every matmul, forward and backward, runs in f16; every gradient output is f32 */
    const ir_graph *cg = amp->compiled;
    int matmuls = 0;
    for (int i = 0; i < cg->nnodes; i++) {
        const ir_node *n = cg->nodes[i];
        if (n->op != IR_OP_matmul) continue;
        matmuls++;
        for (int j = 0; j < 2; j++)
            if (cg->nodes[n->in[j]]->type.dtype != F16)
                fail_msg("matmul %%%d operand %d is %s, expected f16", i, j, alloy_dtype_name(cg->nodes[n->in[j]]->type.dtype));
        assert_int_equal(n->type.dtype, F16);
    }
    /* 9 forward matmuls (q, k, v, scores, att @ v, wo, mlp.w1, mlp.w2, head), two backward each */
    assert_int_equal(count_op(amp->ir, IR_OP_matmul), 9);
    assert_int_equal(matmuls, 27);
    int grads = 0;
    for (int i = 0; i < cg->noutputs; i++) {
        if (strncmp(cg->outputs[i].name, "grad:", 5) != 0) continue;
        grads++;
        assert_int_equal(cg->nodes[cg->outputs[i].node]->type.dtype, F32);
    }
    assert_int_equal(grads, NBLOCK);
    alloy_graph_free(ref);
    alloy_graph_free(amp);
    finish();
}

static void test_frozen_params_get_no_gradient_and_requested_input_gradients_match_finite_differences(void **state)
{
    (void)state;
    gcase *c = new_case("mlp f64, w1 frozen, grad of input x");
    test_mlp m = build_mlp(c->g, F64, 4, 3, 5, 3);
    assert_int_equal(alloy_param_freeze(c->g, alloy_graph_find(c->g, "w1")), ALLOY_OK);
    double *x = randoms(12, -1, 1, 0);
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "targets", .dtype = I32, .rank = 1, .dims = {4},
                                              .data = ids32(4, (int[]){1, 0, 2, 2})};
    c->feed[c->nfeed++] = (alloy_host_tensor){.name = "x", .dtype = F64, .rank = 2, .dims = {4, 3}, .data = x};
    assert_int_equal(alloy_graph_request_grad(c->g, m.x), ALLOY_OK);
    add_leaf(c, "x", 2, DIMS(4, 3), x, true);
    adopt_params(c, 3, mlp_params + 1);
    assert_int_equal(alloy_graph_set_loss(c->g, m.loss), ALLOY_OK);
    alloy_host_tensor f = {.name = "grad:w1"};
    assert_int_equal(alloy_graph_run(c->g, c->feed, c->nfeed, &f, 1), ALLOY_ERR_NOT_FOUND);
    assert_non_null(strstr(alloy_last_error(c->g), "grad:w1"));
    for (int i = 0; i < c->g->compiled->noutputs; i++)
        assert_string_not_equal(c->g->compiled->outputs[i].name, "grad:w1");
    check_case(c, m.loss);
    finish();
}

/* ---- the compiled training graph ---- */

static ir_graph *compiled_block(alloy_graph *g, bool amp)
{
    test_block m = build_transformer_block(g, F32, 2, 4, 11, 8, 2);
    assert_int_equal(alloy_graph_set_loss(g, m.loss), ALLOY_OK);
    if (amp) assert_int_equal(alloy_graph_enable_amp(g, F16), ALLOY_OK);
    if (graph_compile(g)) fail_msg("%s", alloy_last_error(g));
    return g->compiled;
}

static void test_training_graph_ir_round_trips_through_the_printer_and_the_parser(void **state)
{
    (void)state;
    for (int amp = 0; amp < 2; amp++) {
        alloy_graph *g = alloy_graph_new("block");
        ir_graph *cg = compiled_block(g, amp);
        char *text = ir_print_string(cg), err[512];
        assert_non_null(text);
        assert_non_null(strstr(text, "layer_norm_grad("));
        assert_non_null(strstr(text, "output \"grad:head.w\""));
        ir_graph *back = ir_parse(text, strlen(text), "compiled.ir", err, sizeof err);
        if (!back) fail_msg("%s: %s", amp ? "amp" : "f32", err);
        assert_int_equal(back->nnodes, cg->nnodes);
        char *again = ir_print_string(back);
        assert_non_null(again);
        assert_string_equal(again, text);
        al_free(again);
        al_free(text);
        ir_graph_free(back);
        alloy_graph_free(g);
    }
    finish();
}

static void test_transformer_block_backward_has_one_fused_grad_per_forward_op(void **state)
{
    (void)state;
    for (int amp = 0; amp < 2; amp++) {
        alloy_graph *g = alloy_graph_new("block");
        ir_graph *cg = compiled_block(g, amp);
        int fwd = g->ir->nnodes, total = cg->nnodes;
        printf("  transformer block B2 T4 V11 D8 H2 %s: %d forward nodes as built, %d compiled (%d up to the loss, "
               "%d after it)\n",
               amp ? "AMP f16" : "f32", fwd, total, cg->loss + 1, total - cg->loss - 1);
        assert_int_equal(count_op(cg, IR_OP_layer_norm_grad), 3);
        assert_int_equal(count_op(cg, IR_OP_softmax_grad), 1);
        assert_int_equal(count_op(cg, IR_OP_cross_entropy_grad), 1);
        assert_int_equal(count_op(cg, IR_OP_embedding_grad), 1);
        assert_true(total > fwd && total < 4 * fwd);
        alloy_graph_free(g);
    }
    finish();
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* h_0 = X; h_{k+1} = 0.5 * tanh(h_k W) + X for STEPS steps (4 nodes a step,
 * ~100k forward nodes); loss = sum(h * R). Times the compile (and the
 * autodiff pass alone) and checks both gradients against a hand-written
 * reverse pass in double. */
static void test_autodiff_of_a_100k_node_chain_is_fast_and_matches_a_hand_written_backward(void **state)
{
    (void)state;
    enum { STEPS = 25000, N = 4, NN = N * N };
    alloy_graph *g = alloy_graph_new("chain");
    double *x = randoms(NN, -1, 1, 0), *w = randoms(NN, -0.5, 0.5, 0), *r = randoms(NN, -1, 1, 0);
    alloy_tensor *X = alloy_param(g, "X", F64, 2, DIMS(N, N), alloy_init_zeros());
    alloy_tensor *W = alloy_param(g, "W", F64, 2, DIMS(N, N), alloy_init_zeros());
    alloy_tensor *half = alloy_scalar(g, F64, 0.5), *h = X;
    for (int k = 0; k < STEPS; k++) h = alloy_add(g, alloy_mul(g, alloy_tanh(g, alloy_matmul(g, h, W, false, false)), half), X);
    alloy_tensor *loss = alloy_reduce_sum(g, alloy_mul(g, h, alloy_constant(g, F64, 2, DIMS(N, N), r)), 0, NULL, false);
    assert_int_equal(alloy_graph_set_loss(g, loss), ALLOY_OK);
    int fwd = g->ir->nnodes;
    assert_true(fwd > 100000);
    /* the pipeline pass by pass on a copy, then the compile the run uses */
    ir_graph *copy = ir_graph_clone(g->ir);
    pass_options opts;
    assert_int_equal(graph_pass_options(g, &opts), ALLOY_OK);
    opts.train = true;
    pass_timing tm[8];
    int nt = 0;
    if (pass_run_pipeline(&copy, &opts, NULL, stderr, tm, 8, &nt)) fail_msg("%s", copy->error);
    double autodiff_ms = -1;
    char passes[256] = "";
    for (int i = 0; i < nt; i++) {
        if (!strcmp(tm[i].name, "autodiff")) autodiff_ms = tm[i].ms;
        size_t len = strlen(passes);
        al_fmt(passes + len, sizeof passes - len, "%s%s %.0f ms -> %d nodes", i ? ", " : "", tm[i].name, tm[i].ms,
               tm[i].nodes_after);
    }
    printf("  chain pipeline: %s\n", passes);
    assert_true(autodiff_ms >= 0);
    ir_graph_free(copy);
    double t0 = now_ms();
    if (graph_compile(g)) fail_msg("%s", alloy_last_error(g));
    double compile_ms = now_ms() - t0;
    assert_int_equal(alloy_graph_set_state(g, &(alloy_host_tensor){.name = "X", .dtype = F64, .rank = 2, .dims = {N, N}, .data = x}),
                     ALLOY_OK);
    assert_int_equal(alloy_graph_set_state(g, &(alloy_host_tensor){.name = "W", .dtype = F64, .rank = 2, .dims = {N, N}, .data = w}),
                     ALLOY_OK);
    alloy_host_tensor f[2] = {{.name = "grad:W"}, {.name = "grad:X"}};
    t0 = now_ms();
    if (alloy_graph_run(g, NULL, 0, f, 2)) fail_msg("%s", alloy_last_error(g));
    double run_ms = now_ms() - t0;
    printf("  chain: %d forward nodes, %d compiled; compile %.0f ms (autodiff pass %.0f ms), run %.0f ms\n", fwd,
           g->compiled->nnodes, compile_ms, autodiff_ms, run_ms);
    /* the reference: forward keeping every t = tanh(h W), then reverse */
    double *hs = al_malloc(sizeof(double) * NN * (STEPS + 1)), *ts = al_malloc(sizeof(double) * NN * STEPS);
    assert_non_null(hs);
    assert_non_null(ts);
    memcpy(hs, x, sizeof(double) * NN);
    for (int k = 0; k < STEPS; k++)
        for (int i = 0; i < N; i++)
            for (int j = 0; j < N; j++) {
                double m = 0;
                for (int l = 0; l < N; l++) m += hs[k * NN + i * N + l] * w[l * N + j];
                ts[k * NN + i * N + j] = tanh(m);
                hs[(k + 1) * NN + i * N + j] = 0.5 * tanh(m) + x[i * N + j];
            }
    double dh[NN], dx[NN] = {0}, dw[NN] = {0}, dm[NN];
    memcpy(dh, r, sizeof dh);
    for (int k = STEPS - 1; k >= 0; k--) {
        for (int e = 0; e < NN; e++) {
            dx[e] += dh[e];
            dm[e] = 0.5 * dh[e] * (1 - ts[k * NN + e] * ts[k * NN + e]);
        }
        for (int i = 0; i < N; i++) /* dW += h^T dm, dh = dm W^T */
            for (int j = 0; j < N; j++) {
                double sw = 0, sh = 0;
                for (int l = 0; l < N; l++) {
                    sw += hs[k * NN + l * N + i] * dm[l * N + j];
                    sh += dm[i * N + l] * w[j * N + l];
                }
                dw[i * N + j] += sw;
                dh[i * N + j] = sh;
            }
    }
    for (int e = 0; e < NN; e++) dx[e] += dh[e];
    al_free(hs);
    al_free(ts);
    const double *ref[2] = {dw, dx};
    for (int t = 0; t < 2; t++) {
        double diff2 = 0, ref2 = 0;
        for (int e = 0; e < NN; e++) {
            double d = ((const double *)f[t].data)[e] - ref[t][e];
            diff2 += d * d, ref2 += ref[t][e] * ref[t][e];
        }
        if (sqrt(diff2 / ref2) > 1e-12) fail_msg("%s: relative error %.3g > 1e-12", f[t].name, sqrt(diff2 / ref2));
    }
    alloy_graph_free(g);
    finish();
}

/* ---- the backward kernels against double references ---- */

/* A kernel test tensor: its type and its elements as doubles (exactly
 * representable in the dtype). */
typedef struct ktensor {
    ir_type type;
    double *v;
} ktensor;

static ir_type kty(alloy_dtype dt, int rank, const int64_t *dims)
{
    ir_type t = {.dtype = dt, .rank = rank};
    if (rank) memcpy(t.dims, dims, sizeof(int64_t) * (size_t)rank);
    return t;
}

/* v rounded to the dtype (through the library's once-rounding stores). */
static ktensor kvalues(ir_type t, const double *v)
{
    int64_t n = ir_numel(&t);
    ktensor k = {t, scratch(sizeof(double) * (size_t)n)};
    void *tmp = scratch(ir_nbytes(&t));
    cvt_store_f64(t.dtype, v, tmp, (size_t)n);
    cvt_load_f64(t.dtype, tmp, k.v, (size_t)n);
    return k;
}

static ktensor krandom(ir_type t, double lo, double hi) { return kvalues(t, randoms(ir_numel(&t), lo, hi, 0)); }

static char kernel_error[512];

/* Runs one `op` node named "under_test" over inputs holding in[]; decodes
 * its result into *out. Returns the run's status (message in kernel_error). */
static alloy_status run_kernel(int op, int nin, const ktensor *in, int nattrs, const ir_attr *attrs,
                               const ir_type *declared, ktensor *out)
{
    ir_graph *g = ir_graph_new("kernel");
    assert_non_null(g);
    int ids[4];
    for (int i = 0; i < nin; i++) {
        ir_node *node = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, &in[i].type, NULL);
        if (!node) fail_msg("input %d: %s", i, g->error);
        ids[i] = node->id;
    }
    ir_node *node = ir_add_node(g, op, nin, ids, nattrs, attrs, declared, "under_test");
    if (!node) fail_msg("%s: %s", ir_ops[op].name, g->error);
    rt_tensor *values = al_calloc((size_t)g->nnodes, sizeof *values);
    assert_non_null(values);
    for (int i = 0; i < nin; i++) {
        values[i].data = scratch(ir_nbytes(&in[i].type));
        cvt_store_f64(in[i].type.dtype, in[i].v, values[i].data, (size_t)ir_numel(&in[i].type));
    }
    cpu_exec x = {.nthreads = 1};
    alloy_status st = cpu_run_graph(&x, g, values, NULL);
    snprintf(kernel_error, sizeof kernel_error, "%s", x.error);
    if (!st) {
        out->type = node->type;
        out->v = scratch(sizeof(double) * (size_t)ir_numel(&node->type));
        cvt_load_f64(node->type.dtype, values[node->id].data, out->v, (size_t)ir_numel(&node->type));
    }
    cpu_release_values(g, values);
    al_free(values);
    ir_graph_free(g);
    return st;
}

static ktensor expect_kernel(int op, int nin, const ktensor *in, int nattrs, const ir_attr *attrs, const ir_type *declared)
{
    ktensor out = {0};
    if (run_kernel(op, nin, in, nattrs, attrs, declared, &out)) fail_msg("%s failed: %s", ir_ops[op].name, kernel_error);
    return out;
}

static double tol_of(alloy_dtype dt) { return dt == F32 ? TOL_F32 : dt == F16 ? TOL_F16 : dt == BF16 ? TOL_BF16 : TOL_F64; }

/* Normalized error of got against ref within tol. */
static void expect_close(const ktensor *got, const double *ref, double tol, const char *what)
{
    int64_t n = ir_numel(&got->type);
    double diff2 = 0, ref2 = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got->v[i])) fail_msg("%s: element %lld is %g", what, (long long)i, got->v[i]);
        diff2 += (got->v[i] - ref[i]) * (got->v[i] - ref[i]), ref2 += ref[i] * ref[i];
    }
    double err = ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    if (err > tol) fail_msg("%s: normalized error %.3g > %.0e", what, err, tol);
}

static const alloy_dtype float_dtypes[] = {F32, F16, BF16, F64};

/* outer/len/inner of t around axis a (already normalized) */
static void split(const ir_type *t, int a, int64_t *outer, int64_t *len, int64_t *inner)
{
    *outer = *inner = 1;
    for (int d = 0; d < a; d++) *outer *= t->dims[d];
    for (int d = a + 1; d < t->rank; d++) *inner *= t->dims[d];
    *len = t->dims[a];
}

static void test_softmax_grad_kernels_match_a_double_reference_along_any_axis_in_every_float_dtype(void **state)
{
    (void)state;
    static const shape shapes[] = {{3, {3, 5, 4}}, {3, {2, 6, 20}}, {1, {9}}};
    for (size_t di = 0; di < 4; di++)
        for (size_t si = 0; si < 3; si++)
            for (int a = -1; a < shapes[si].rank; a++)
                for (int log_out = 0; log_out < 2; log_out++) {
                    alloy_dtype dt = float_dtypes[di];
                    ir_type t = kty(dt, shapes[si].rank, shapes[si].dims);
                    int ax = a < 0 ? t.rank - 1 : a;
                    int64_t outer, len, inner, n = ir_numel(&t);
                    split(&t, ax, &outer, &len, &inner);
                    /* y: softmax / log_softmax of random logits, in double, rounded to dt */
                    double *logits = randoms(n, -3, 3, 0), *yv = scratch(sizeof(double) * (size_t)n);
                    for (int64_t o = 0; o < outer; o++)
                        for (int64_t j = 0; j < inner; j++) {
                            double m = -INFINITY, s = 0;
                            for (int64_t i = 0; i < len; i++) m = fmax(m, logits[(o * len + i) * inner + j]);
                            for (int64_t i = 0; i < len; i++) s += exp(logits[(o * len + i) * inner + j] - m);
                            for (int64_t i = 0; i < len; i++) {
                                double z = logits[(o * len + i) * inner + j] - m;
                                yv[(o * len + i) * inner + j] = log_out ? z - log(s) : exp(z) / s;
                            }
                        }
                    ktensor in[2] = {kvalues(t, yv), krandom(t, -1, 1)};
                    double *ref = scratch(sizeof(double) * (size_t)n);
                    for (int64_t o = 0; o < outer; o++)
                        for (int64_t j = 0; j < inner; j++) {
                            double s = 0;
                            for (int64_t i = 0; i < len; i++) {
                                int64_t e = (o * len + i) * inner + j;
                                s += log_out ? in[1].v[e] : in[1].v[e] * in[0].v[e];
                            }
                            for (int64_t i = 0; i < len; i++) {
                                int64_t e = (o * len + i) * inner + j;
                                ref[e] = log_out ? in[1].v[e] - exp(in[0].v[e]) * s : in[0].v[e] * (in[1].v[e] - s);
                            }
                        }
                    ir_attr attr = ir_a_int("axis", a);
                    int op = log_out ? IR_OP_log_softmax_grad : IR_OP_softmax_grad;
                    ktensor got = expect_kernel(op, 2, in, 1, &attr, NULL);
                    expect_close(&got, ref, tol_of(dt),
                                 fmt("%s %s axis %d", ir_ops[op].name, shape_str(shapes[si]), a));
                }
    finish();
}

static void test_layer_norm_grad_kernel_matches_a_double_reference_with_and_without_gamma(void **state)
{
    (void)state;
    static const shape shapes[] = {{2, {4, 7}}, {3, {2, 3, 40}}, {1, {1}}};
    static const double epss[] = {1e-5, 0.1};
    for (size_t di = 0; di < 4; di++)
        for (size_t si = 0; si < 3; si++)
            for (int affine = 0; affine < 2; affine++)
                for (int ei = 0; ei < 2; ei++) {
                    alloy_dtype dt = float_dtypes[di];
                    ir_type t = kty(dt, shapes[si].rank, shapes[si].dims);
                    int64_t d = t.dims[t.rank - 1], rows = ir_numel(&t) / d;
                    ktensor in[3] = {krandom(t, -2, 2), krandom(t, -1, 1), krandom(kty(dt, 1, &d), 0.5, 1.5)};
                    double *ref = scratch(sizeof(double) * (size_t)ir_numel(&t)), eps = epss[ei];
                    for (int64_t r = 0; r < rows; r++) {
                        const double *xr = in[0].v + r * d, *dy = in[1].v + r * d;
                        double mean = 0, var = 0, mg = 0, mgx = 0;
                        for (int64_t i = 0; i < d; i++) mean += xr[i] / (double)d;
                        for (int64_t i = 0; i < d; i++) var += (xr[i] - mean) * (xr[i] - mean) / (double)d;
                        double rstd = 1 / sqrt(var + eps);
                        for (int64_t i = 0; i < d; i++) {
                            double g = dy[i] * (affine ? in[2].v[i] : 1);
                            mg += g / (double)d, mgx += g * (xr[i] - mean) * rstd / (double)d;
                        }
                        for (int64_t i = 0; i < d; i++)
                            ref[r * d + i] = rstd * (dy[i] * (affine ? in[2].v[i] : 1) - mg - (xr[i] - mean) * rstd * mgx);
                    }
                    ir_attr attr = ir_a_float("eps", eps);
                    ktensor got = expect_kernel(IR_OP_layer_norm_grad, affine ? 3 : 2, in, 1, &attr, NULL);
                    /* a single-element row has dx = 0 exactly */
                    expect_close(&got, ref, d == 1 ? 0 : tol_of(dt),
                                 fmt("layer_norm_grad %s %s eps %g %s", alloy_dtype_name(dt), shape_str(shapes[si]), eps,
                                     affine ? "gamma" : "plain"));
                }
    finish();
}

static void test_cross_entropy_grad_kernel_is_softmax_minus_onehot_times_dloss_over_positions(void **state)
{
    (void)state;
    for (size_t di = 0; di < 4; di++)
        for (int wide_ids = 0; wide_ids < 2; wide_ids++) {
            alloy_dtype dt = float_dtypes[di];
            ir_type t = kty(dt, 3, DIMS(2, 3, 5));
            ktensor in[3] = {krandom(t, -3, 3), kvalues(kty(wide_ids ? I64 : I32, 2, DIMS(2, 3)), (double[]){0, 4, 2, 2, 1, 3}),
                             kvalues(kty(dt, 0, NULL), (double[]){0.7})};
            double ref[30];
            for (int p = 0; p < 6; p++) {
                double m = -INFINITY, s = 0;
                for (int i = 0; i < 5; i++) m = fmax(m, in[0].v[p * 5 + i]);
                for (int i = 0; i < 5; i++) s += exp(in[0].v[p * 5 + i] - m);
                for (int i = 0; i < 5; i++)
                    ref[p * 5 + i] = (exp(in[0].v[p * 5 + i] - m) / s - (i == (int)in[1].v[p])) * in[2].v[0] / 6;
            }
            ktensor got = expect_kernel(IR_OP_cross_entropy_grad, 3, in, 0, NULL, NULL);
            expect_close(&got, ref, tol_of(dt), fmt("cross_entropy_grad %s", alloy_dtype_name(dt)));
        }
    finish();
}

static void test_cross_entropy_grad_rejects_a_target_out_of_range_naming_the_node(void **state)
{
    (void)state;
    static const double bad[][6] = {{0, 1, 2, 3, 4, 5}, {0, -1, 2, 3, 4, 0}};
    static const char *const msg[] = {"cross_entropy_grad 'under_test': target 5 out of range [0, 5) at position [1,2]",
                                      "cross_entropy_grad 'under_test': target -1 out of range [0, 5) at position [0,1]"};
    for (int k = 0; k < 2; k++) {
        ktensor in[3] = {krandom(kty(F32, 3, DIMS(2, 3, 5)), -1, 1), kvalues(kty(I32, 2, DIMS(2, 3)), bad[k]),
                         kvalues(kty(F32, 0, NULL), (double[]){1})};
        ktensor out;
        assert_int_equal(run_kernel(IR_OP_cross_entropy_grad, 3, in, 0, NULL, NULL, &out), ALLOY_ERR_INVALID);
        assert_string_equal(kernel_error, msg[k]);
    }
    finish();
}

static void test_embedding_grad_kernel_sums_dy_rows_into_the_rows_of_their_ids(void **state)
{
    (void)state;
    static const double ids[] = {1, 3, 1, 0, 3, 1, 4, 1};
    for (size_t di = 0; di < 4; di++)
        for (int wide_ids = 0; wide_ids < 2; wide_ids++) {
            alloy_dtype dt = float_dtypes[di];
            ktensor in[2] = {kvalues(kty(wide_ids ? I64 : I32, 2, DIMS(2, 4)), ids), krandom(kty(dt, 3, DIMS(2, 4, 3)), -1, 1)};
            ir_type table = kty(dt, 2, DIMS(6, 3));
            double ref[18] = {0};
            for (int p = 0; p < 8; p++)
                for (int j = 0; j < 3; j++) ref[(int)ids[p] * 3 + j] += in[1].v[p * 3 + j];
            ktensor got = expect_kernel(IR_OP_embedding_grad, 2, in, 0, NULL, &table);
            assert_int_equal(got.type.dtype, dt);
            expect_close(&got, ref, tol_of(dt), fmt("embedding_grad %s", alloy_dtype_name(dt)));
            for (int j = 0; j < 6; j++) /* rows no id names stay exactly zero */
                if (j == 2 || j == 5) assert_true(got.v[j * 3] == 0 && got.v[j * 3 + 1] == 0 && got.v[j * 3 + 2] == 0);
        }
    finish();
}

/* 4096 ones into f16/bf16 rows: summed in f16 row 0 would stop at 2048
 * (2048 + 1 rounds back to 2048), in bf16 at 256; in f32 it is exact. */
static void test_embedding_grad_accumulates_half_precision_in_f32(void **state)
{
    (void)state;
    enum { P = 4096 };
    double *ids = scratch(sizeof(double) * P), *ones = scratch(sizeof(double) * P);
    for (int p = 0; p < P; p++) ids[p] = p % 4 == 3 ? 2 : 0, ones[p] = 1;
    for (int k = 0; k < 2; k++) {
        alloy_dtype dt = k ? BF16 : F16;
        ktensor in[2] = {kvalues(kty(I32, 1, DIMS(P)), ids), kvalues(kty(dt, 2, DIMS(P, 1)), ones)};
        ir_type table = kty(dt, 2, DIMS(3, 1));
        ktensor got = expect_kernel(IR_OP_embedding_grad, 2, in, 0, NULL, &table);
        assert_true(got.v[0] == 3072 && got.v[1] == 0 && got.v[2] == 1024);
    }
    finish();
}

static void test_embedding_grad_rejects_an_id_out_of_range_naming_the_node(void **state)
{
    (void)state;
    static const double bad[][4] = {{0, 1, 6, 2}, {-3, 0, 0, 0}};
    static const char *const msg[] = {"embedding_grad 'under_test': id 6 out of range [0, 6) at position [1,0]",
                                      "embedding_grad 'under_test': id -3 out of range [0, 6) at position [0,0]"};
    for (int k = 0; k < 2; k++) {
        ktensor in[2] = {kvalues(kty(I64, 2, DIMS(2, 2)), bad[k]), krandom(kty(F32, 3, DIMS(2, 2, 3)), -1, 1)};
        ir_type table = kty(F32, 2, DIMS(6, 3));
        ktensor out;
        assert_int_equal(run_kernel(IR_OP_embedding_grad, 2, in, 0, NULL, &table, &out), ALLOY_ERR_INVALID);
        assert_string_equal(kernel_error, msg[k]);
    }
    finish();
}

static void test_pad_surrounds_the_operand_with_zeros_along_any_axis(void **state)
{
    (void)state;
    static const alloy_dtype dts[] = {F32, F16, F64, I32};
    static const int64_t pads[][2] = {{1, 2}, {0, 3}, {2, 0}, {0, 0}};
    for (size_t di = 0; di < 4; di++)
        for (int axis = -1; axis < 3; axis++)
            for (int pi = 0; pi < 4; pi++) {
                ir_type t = kty(dts[di], 3, DIMS(2, 3, 4));
                ktensor in = krandom(t, -100, 100);
                int ax = axis < 0 ? 2 : axis;
                int64_t before = pads[pi][0], after = pads[pi][1];
                ir_attr attrs[3] = {ir_a_int("axis", axis), ir_a_int("before", before), ir_a_int("after", after)};
                ktensor got = expect_kernel(IR_OP_pad, 1, &in, 3, attrs, NULL);
                ir_type want = t;
                want.dims[ax] += before + after;
                assert_true(ir_type_eq(&got.type, &want));
                int64_t idx[3];
                for (idx[0] = 0; idx[0] < want.dims[0]; idx[0]++)
                    for (idx[1] = 0; idx[1] < want.dims[1]; idx[1]++)
                        for (idx[2] = 0; idx[2] < want.dims[2]; idx[2]++) {
                            int64_t o = (idx[0] * want.dims[1] + idx[1]) * want.dims[2] + idx[2];
                            int64_t src = idx[ax] - before;
                            double expect = 0;
                            if (src >= 0 && src < t.dims[ax]) {
                                int64_t s[3] = {idx[0], idx[1], idx[2]};
                                s[ax] = src;
                                expect = in.v[(s[0] * t.dims[1] + s[1]) * t.dims[2] + s[2]];
                            }
                            if (got.v[o] != expect)
                                fail_msg("pad %s axis %d [%lld, %lld]: element %lld is %g, expected %g",
                                         alloy_dtype_name(dts[di]), axis, (long long)before, (long long)after,
                                         (long long)o, got.v[o], expect);
                        }
            }
    finish();
}

#define TEST(f) cmocka_unit_test_setup_teardown(f, test_checked_alloc, plain_alloc)
#define TEST_PLAIN(f) cmocka_unit_test_teardown(f, plain_alloc)

int main(void)
{
    const struct CMUnitTest tests[] = {
        TEST(test_softmax_grad_kernels_match_a_double_reference_along_any_axis_in_every_float_dtype),
        TEST(test_layer_norm_grad_kernel_matches_a_double_reference_with_and_without_gamma),
        TEST(test_cross_entropy_grad_kernel_is_softmax_minus_onehot_times_dloss_over_positions),
        TEST(test_cross_entropy_grad_rejects_a_target_out_of_range_naming_the_node),
        TEST(test_embedding_grad_kernel_sums_dy_rows_into_the_rows_of_their_ids),
        TEST(test_embedding_grad_accumulates_half_precision_in_f32),
        TEST(test_embedding_grad_rejects_an_id_out_of_range_naming_the_node),
        TEST(test_pad_surrounds_the_operand_with_zeros_along_any_axis),
        TEST(test_unary_elementwise_gradients_match_finite_differences),
        TEST(test_binary_elementwise_gradients_match_finite_differences_when_broadcasting),
        TEST(test_where_sends_the_gradient_to_the_selected_operand_when_broadcasting),
        TEST(test_matmul_gradients_for_every_transpose_and_broadcast_batch),
        TEST(test_reduction_gradients_over_several_axes_with_and_without_keepdims),
        TEST(test_softmax_and_log_softmax_gradients_along_the_last_and_a_middle_axis),
        TEST(test_layer_norm_gradients_with_and_without_affine),
        TEST(test_rms_norm_gradients_with_and_without_gamma),
        TEST(test_cross_entropy_gradient_of_the_logits),
        TEST(test_embedding_gradient_sums_the_rows_of_repeated_ids),
        TEST(test_data_movement_gradients_match_finite_differences),
        TEST(test_cast_through_f32_passes_the_gradient_straight_through_rounded_to_f32),
        TEST(test_causal_mask_gradient_is_zero_exactly_where_the_mask_holds),
        TEST(test_slice_and_concat_with_negative_axes_from_ir_text_differentiate),
        TEST(test_mlp_parameter_gradients_match_finite_differences),
        TEST(test_transformer_block_parameter_gradients_match_finite_differences),
        TEST(test_amp_gradients_of_the_transformer_block_are_f32_and_close_to_the_f32_graph),
        TEST(test_frozen_params_get_no_gradient_and_requested_input_gradients_match_finite_differences),
        TEST(test_training_graph_ir_round_trips_through_the_printer_and_the_parser),
        TEST(test_transformer_block_backward_has_one_fused_grad_per_forward_op),
        TEST_PLAIN(test_autodiff_of_a_100k_node_chain_is_fast_and_matches_a_hand_written_backward),
    };
    return cmocka_run_group_tests_name("autodiff", tests, NULL, NULL);
}
