/* test_fuse_conv.c - convolutions as GEMM group heads: conv2d / conv1d with a per-channel bias (an explicit add of a [C, 1, 1] vector, or the conv's own bias operand) and relu fused into one gemm group, f32 bit for bit against the unfused run, f16 against an f64 reference and the unfused run, what is not a channel bias, and a CNN's training step fused and unfused. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloy/alloy.h"
#include "alloy/conv.h"
#include "base/convert.h"
#include "ir/groups.h"
#include "models.h"
#include "runtime/graph/graph_impl.h"
#include "fuse_support.h"
#include "support.h"

/* ---- the graphs ---- */

/* A convolution case: x [n, c, h, w] (conv1d: h = 1, x [n, c, w]), w [o, c/groups, kh, kw], geometry. */
typedef struct conv_case {
    const char *what;
    bool conv1d;
    alloy_dtype dt, out; /* the data's dtype; the output's (a cast after relu when it differs) */
    int64_t n, c, h, w, o, kh, kw, stride, pad, dil, groups;
    int bias; /* BIAS_* */
    bool relu;
    const char *ops; /* the gemm group's members, or NULL: the conv heads no group */
} conv_case;

enum { BIAS_CHANNEL, BIAS_CHANNEL_4D, BIAS_OPERAND, BIAS_LAST_DIM };

static const conv_case cases[] = {
    {"conv2d + [C,1,1] bias + relu, f32", false, F32, F32, 4, 3, 9, 7, 8, 3, 3, 1, 1, 1, 1, BIAS_CHANNEL, true,
     "conv2d add relu"},
    {"conv2d (own bias) + relu, f32, stride 2, dilation 2, 2 groups", false, F32, F32, 3, 4, 11, 10, 6, 3, 2, 2, 1, 2,
     2, BIAS_OPERAND, true, "conv2d relu"},
    {"conv2d + [1,C,1,1] bias + relu, f32", false, F32, F32, 2, 5, 6, 6, 7, 3, 3, 1, 0, 1, 1, BIAS_CHANNEL_4D, true,
     "conv2d add relu"},
    {"conv1d + [C,1] bias, f32", true, F32, F32, 4, 6, 1, 20, 5, 1, 3, 2, 1, 1, 1, BIAS_CHANNEL, false, "conv1d add"},
    {"conv2d + [C,1,1] bias + relu, f16", false, F16, F16, 4, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1, BIAS_CHANNEL, true,
     "conv2d add relu"},
    {"conv2d + [C,1,1] bias + relu + cast<f32>, f16", false, F16, F32, 4, 8, 9, 9, 16, 3, 3, 1, 1, 1, 1, BIAS_CHANNEL,
     true, "conv2d add relu cast"},
    {"conv1d + [C,1] bias, f16", true, F16, F16, 4, 8, 1, 33, 12, 1, 5, 1, 2, 1, 1, BIAS_CHANNEL, false, "conv1d add"},
    /* a [W] vector broadcasts over the last spatial dim, not the channels: no epilogue */
    {"conv2d + [W] vector (W = C), f32", false, F32, F32, 2, 3, 8, 8, 8, 3, 3, 1, 1, 1, 1, BIAS_LAST_DIM, true, NULL},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

static int64_t out_size(int64_t in, int64_t k, const conv_case *c)
{
    return (in + 2 * c->pad - c->dil * (k - 1) - 1) / c->stride + 1;
}

static int64_t oh_of(const conv_case *c) { return c->conv1d ? 1 : out_size(c->h, c->kh, c); }
static int64_t ow_of(const conv_case *c) { return out_size(c->w, c->kw, c); }
static int64_t x_count(const conv_case *c) { return c->n * c->c * c->h * c->w; }
static int64_t w_count(const conv_case *c) { return c->o * c->c / c->groups * c->kh * c->kw; }
static int64_t y_count(const conv_case *c) { return c->n * c->o * oh_of(c) * ow_of(c); }

/* cases[variant]: "y" = [cast](relu(conv(x, w[, b]) [+ bias])), the conv called "conv". */
static alloy_graph *conv_graph(int variant)
{
    const conv_case *c = &cases[variant];
    alloy_graph *g = alloy_graph_new("conv");
    alloy_tensor *x = c->conv1d ? alloy_input(g, "x", c->dt, 3, DIMS(c->n, c->c, c->w))
                                : alloy_input(g, "x", c->dt, 4, DIMS(c->n, c->c, c->h, c->w));
    int64_t cg = c->c / c->groups;
    alloy_tensor *w = c->conv1d ? alloy_input(g, "w", c->dt, 3, DIMS(c->o, cg, c->kw))
                                : alloy_input(g, "w", c->dt, 4, DIMS(c->o, cg, c->kh, c->kw));
    int64_t nb = c->bias == BIAS_LAST_DIM ? ow_of(c) : c->o;
    alloy_tensor *b = alloy_input(g, "b", c->dt, 1, DIMS(nb));
    alloy_tensor *own = c->bias == BIAS_OPERAND ? b : NULL, *y;
    if (c->conv1d)
        y = alloy_conv1d(g, x, w, own, c->stride, c->pad, c->dil, c->groups);
    else
        y = alloy_conv2d(g, x, w, own, DIMS(c->stride, c->stride), DIMS(c->pad, c->pad), DIMS(c->dil, c->dil),
                         c->groups);
    y = alloy_set_name(g, y, "conv");
    if (c->bias == BIAS_CHANNEL)
        y = alloy_add(g, y, c->conv1d ? alloy_reshape(g, b, 2, DIMS(c->o, 1)) : alloy_reshape(g, b, 3, DIMS(c->o, 1, 1)));
    else if (c->bias == BIAS_CHANNEL_4D)
        y = alloy_add(g, y, alloy_reshape(g, b, 4, DIMS(1, c->o, 1, 1)));
    else if (c->bias == BIAS_LAST_DIM)
        y = alloy_add(g, y, b);
    if (c->relu) y = alloy_relu(g, y);
    if (c->out != c->dt) y = alloy_cast(g, y, c->out);
    alloy_output(g, "y", alloy_set_name(g, y, "y"));
    return g;
}

/* The inputs of case c, as doubles (each exact in c->dt) and as the feeds' bytes. */
typedef struct conv_data {
    double *x, *w, *b;
    void *xb, *wb, *bb;
    alloy_host_tensor feeds[3];
} conv_data;

static void *encoded(alloy_dtype dt, double *v, int64_t n, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++) v[i] = test_round_to(dt, test_uniform(lo, hi));
    void *bytes = test_malloc((size_t)n * alloy_dtype_size(dt));
    test_encode(dt, v, bytes, n);
    return bytes;
}

static conv_data conv_inputs(const conv_case *c)
{
    conv_data d;
    int64_t nb = c->bias == BIAS_LAST_DIM ? ow_of(c) : c->o;
    test_rng = 77;
    d.x = test_malloc(sizeof(double) * (size_t)x_count(c));
    d.w = test_malloc(sizeof(double) * (size_t)w_count(c));
    d.b = test_malloc(sizeof(double) * (size_t)nb);
    d.xb = encoded(c->dt, d.x, x_count(c), -1, 1);
    d.wb = encoded(c->dt, d.w, w_count(c), -0.5, 0.5);
    d.bb = encoded(c->dt, d.b, nb, -1, 1);
    int64_t cg = c->c / c->groups;
    d.feeds[0] = c->conv1d ? (alloy_host_tensor){"x", c->dt, 3, {c->n, c->c, c->w}, d.xb}
                           : (alloy_host_tensor){"x", c->dt, 4, {c->n, c->c, c->h, c->w}, d.xb};
    d.feeds[1] = c->conv1d ? (alloy_host_tensor){"w", c->dt, 3, {c->o, cg, c->kw}, d.wb}
                           : (alloy_host_tensor){"w", c->dt, 4, {c->o, cg, c->kh, c->kw}, d.wb};
    d.feeds[2] = (alloy_host_tensor){"b", c->dt, 1, {nb}, d.bb};
    return d;
}

static void conv_data_free(conv_data *d)
{
    test_free(d->x), test_free(d->w), test_free(d->b), test_free(d->xb), test_free(d->wb), test_free(d->bb);
}

/* The convolution in f64 (every product of two f16/f32 values is exact in
 * f64), without bias: p[n, o, oy, ox]; the bias added after by the caller.
 * Also sum |x w| per output into mag (the scale of f32's summation error). */
static void conv_reference(const conv_case *c, const conv_data *d, double *p, double *mag)
{
    int64_t oh = oh_of(c), ow = ow_of(c), cg = c->c / c->groups, og = c->o / c->groups;
    for (int64_t b = 0; b < c->n; b++)
        for (int64_t o = 0; o < c->o; o++)
            for (int64_t oy = 0; oy < oh; oy++)
                for (int64_t ox = 0; ox < ow; ox++) {
                    double s = 0, m = 0;
                    for (int64_t ci = 0; ci < cg; ci++)
                        for (int64_t i = 0; i < c->kh; i++)
                            for (int64_t j = 0; j < c->kw; j++) {
                                int64_t iy = c->conv1d ? 0 : oy * c->stride - c->pad + i * c->dil;
                                int64_t ix = ox * c->stride - c->pad + j * c->dil;
                                if (iy < 0 || iy >= c->h || ix < 0 || ix >= c->w) continue;
                                double xv = d->x[((b * c->c + o / og * cg + ci) * c->h + iy) * c->w + ix];
                                double t = xv * d->w[((o * cg + ci) * c->kh + i) * c->kw + j];
                                s += t, m += fabs(t);
                            }
                    int64_t e = ((b * c->o + o) * oh + oy) * ow + ox;
                    p[e] = s, mag[e] = m;
                }
}

/* ---- runs ---- */

/* y of a fresh conv_graph(variant), fused or not, on nthreads threads (test_malloc'd). */
static void *run_y(int variant, bool fused, int nthreads, conv_data *d)
{
    fusion(fused);
    char th[16];
    snprintf(th, sizeof th, "%d", nthreads);
    setenv("ALLOY_NUM_THREADS", th, 1);
    alloy_graph *g = conv_graph(variant);
    alloy_host_tensor y = {.name = "y"};
    expect_ok(g, alloy_graph_run(g, d->feeds, 3, &y, 1), fused ? "fused run" : "unfused run");
    size_t bytes = (size_t)y_count(&cases[variant]) * alloy_dtype_size(y.dtype);
    void *out = test_malloc(bytes);
    memcpy(out, y.data, bytes);
    alloy_graph_free(g);
    fusion(true);
    unsetenv("ALLOY_NUM_THREADS");
    return out;
}

/* The group table of conv_graph(variant) (ALLOY_PRINT_AFTER=fuse's lines) into buf. */
static void group_table(int variant, char *buf, size_t len)
{
    alloy_graph *g = conv_graph(variant);
    FILE *f = fmemopen(buf, len, "w");
    assert_non_null(f);
    ir_print_groups(compiled(g), f);
    fclose(f);
    alloy_graph_free(g);
}

/* The compiled graph has the groups the case says: one gemm group headed by
 * the conv with exactly c->ops, or (ops NULL) the conv in no group. */
static void expect_case_groups(int variant)
{
    const conv_case *c = &cases[variant];
    alloy_graph *g = conv_graph(variant);
    const ir_graph *cg = compiled(g);
    expect_groups_legal(cg);
    int k = group_of(cg, "conv");
    if (!c->ops) {
        assert_int_equal(k, -1);
        alloy_graph_free(g);
        return;
    }
    assert_int_equal(group_count(cg), 1);
    assert_true(k >= 0);
    int *ids = test_malloc(sizeof(int) * (size_t)cg->nnodes), n = group_members(cg, k, ids);
    assert_int_equal(ir_group_kind_of(cg, ids, n), IR_GROUP_GEMM);
    assert_int_equal(ids[0], node_named(cg, "conv"));
    char ops[128] = "";
    for (int m = 0; m < n; m++)
        snprintf(ops + strlen(ops), sizeof ops - strlen(ops), "%s%s", m ? " " : "", ir_ops[cg->nodes[ids[m]]->op].name);
    if (strcmp(ops, c->ops) != 0) fail_msg("%s: gemm group '%s', want '%s'", c->what, ops, c->ops);
    test_free(ids);
    alloy_graph_free(g);
    char table[2048];
    group_table(variant, table, sizeof table);
    printf("%s", table);
    char want[64];
    snprintf(want, sizeof want, "gemm %s", alloy_dtype_name(c->out)); /* the type of its last member */
    assert_non_null(strstr(table, want));
    assert_non_null(strstr(table, c->conv1d ? "conv1d(" : "conv2d("));
}

/* ---- f32: the unfused bits ---- */

static void expect_f32_case(int variant)
{
    const conv_case *c = &cases[variant];
    expect_case_groups(variant);
    conv_data d = conv_inputs(c);
    float *want = run_y(variant, false, 1, &d);
    for (int t = 1; t <= 2; t++) {
        float *got = run_y(variant, true, t, &d);
        if (memcmp(got, want, sizeof(float) * (size_t)y_count(c)) != 0)
            fail_msg("%s on %d thread(s): fused bits differ from the unfused run", c->what, t);
        test_free(got);
    }
    /* and both are the f64 convolution to f32's summation error */
    double *p = test_malloc(sizeof(double) * (size_t)y_count(c)), *mag = test_malloc(sizeof(double) * (size_t)y_count(c));
    conv_reference(c, &d, p, mag);
    int64_t plane = oh_of(c) * ow_of(c);
    double worst = 0;
    for (int64_t e = 0; e < y_count(c); e++) {
        double b = c->bias == BIAS_LAST_DIM ? d.b[e % ow_of(c)] : d.b[e / plane % c->o];
        double ref = p[e] + b;
        if (c->relu) ref = fmax(ref, 0);
        double err = fabs(want[e] - ref) / (mag[e] + fabs(b) + 1e-30);
        worst = fmax(worst, err);
    }
    printf("%s: fused = unfused bit for bit; max |y - f64| / sum|x w| %.3g\n", c->what, worst);
    assert_true(worst <= 64 * 0x1p-24);
    test_free(p), test_free(mag), test_free(want);
    conv_data_free(&d);
}

static void test_a_conv2d_with_a_channel_bias_and_relu_is_one_gemm_group_with_the_unfused_f32_bits(void **state)
{
    (void)state;
    expect_f32_case(0);
    expect_f32_case(2);
}

static void test_a_conv2d_with_its_own_bias_heads_a_gemm_group_with_its_relu_and_the_unfused_f32_bits(void **state)
{
    (void)state;
    expect_f32_case(1);
}

static void test_a_conv1d_with_a_channel_bias_is_one_gemm_group_with_the_unfused_f32_bits(void **state)
{
    (void)state;
    expect_f32_case(3);
}

static void test_a_vector_over_the_last_spatial_dim_is_no_channel_bias_and_stays_out(void **state)
{
    (void)state;
    expect_f32_case(7);
}

/* ---- f16: the product stays in f32 ---- */

static int f16_ulps(uint16_t a, uint16_t b)
{
    int ia = a & 0x8000 ? -(a & 0x7fff) : a, ib = b & 0x8000 ? -(b & 0x7fff) : b;
    return abs(ia - ib);
}

/* Fused, y is relu(p + b) summed in f32 and rounded once: within half an
 * f16 ulp of the f64 value (2^-11 relative) plus f32's summation error
 * (<= K 2^-24 sum |x w|, K <= 45 products), so at most 1 ulp from the f64
 * value rounded to f16. Unfused, p is rounded to f16 first and the add
 * rounds again: |fused - unfused| <= 2^-11 (|p| + |unfused| + |fused|) (the
 * three roundings; relu is 1-Lipschitz) plus the summation error. With an
 * f32 output (a cast after relu), y is the f64 value to 1e-4 (|ref| + 1),
 * as the matmul's GEMM group (test_fuse_kinds.c). */
static void expect_f16_case(int variant)
{
    const conv_case *c = &cases[variant];
    expect_case_groups(variant);
    conv_data d = conv_inputs(c);
    void *fused = run_y(variant, true, 2, &d), *unfused = run_y(variant, false, 1, &d);
    double *p = test_malloc(sizeof(double) * (size_t)y_count(c)), *mag = test_malloc(sizeof(double) * (size_t)y_count(c));
    conv_reference(c, &d, p, mag);
    int64_t plane = oh_of(c) * ow_of(c), K = c->c / c->groups * c->kh * c->kw;
    int worst_ulps = 0, worst_unfused_ulps = 0;
    double worst_rel = 0, worst_gap = 0, sum_fused = 0, sum_unfused = 0;
    for (int64_t e = 0; e < y_count(c); e++) {
        double ref = fmax(p[e] + d.b[e / plane % c->o], c->relu ? 0 : -INFINITY);
        double f = test_decode(c->out, fused, e), u = test_decode(c->out, unfused, e);
        double sum_err = (double)K * 0x1p-24 * mag[e];
        sum_fused += fabs(f - ref), sum_unfused += fabs(u - ref);
        if (c->out == F32) {
            worst_rel = fmax(worst_rel, fabs(f - ref) / (fabs(ref) + 1));
            continue;
        }
        int ul = f16_ulps(((const uint16_t *)fused)[e], cvt_f64_to_f16(ref));
        if (ul > worst_ulps) worst_ulps = ul;
        ul = f16_ulps(((const uint16_t *)unfused)[e], cvt_f64_to_f16(ref));
        if (ul > worst_unfused_ulps) worst_unfused_ulps = ul;
        double gap = fabs(f - u) / (0x1p-11 * (fabs(p[e]) + fabs(u) + fabs(f)) + sum_err + 0x1p-24);
        worst_gap = fmax(worst_gap, gap);
        if (!(fabs(f - ref) <= 0x1p-11 * fabs(ref) + sum_err + 0x1p-25))
            fail_msg("%s: element %lld fused %.9g, f64 %.9g: more than half an f16 ulp plus f32's summation error",
                     c->what, (long long)e, f, ref);
    }
    if (c->out == F32) {
        printf("%s: fused max |y - f64| / (|f64| + 1) %.3g; sum |error| fused %.3g vs unfused %.3g\n", c->what,
               worst_rel, sum_fused, sum_unfused);
        assert_true(worst_rel <= 1e-4);
    } else {
        printf("%s: fused max %d f16 ulp from f64 (unfused %d); |fused - unfused| at most %.3g of its bound; sum "
               "|error| fused %.3g vs unfused %.3g\n",
               c->what, worst_ulps, worst_unfused_ulps, worst_gap, sum_fused, sum_unfused);
        assert_true(worst_ulps <= 1);
        assert_true(worst_gap <= 1);
    }
    assert_true(sum_fused < sum_unfused);
    test_free(p), test_free(mag), test_free(fused), test_free(unfused);
    conv_data_free(&d);
}

static void test_an_f16_conv2d_bias_relu_group_rounds_once_within_half_an_ulp_of_f64(void **state)
{
    (void)state;
    expect_f16_case(4);
    expect_f16_case(5);
}

static void test_an_f16_conv1d_bias_group_rounds_once_within_half_an_ulp_of_f64(void **state)
{
    (void)state;
    expect_f16_case(6);
}

/* ---- a CNN's training step ---- */

enum { CNN_BATCH = 8, CNN_C1 = 6, CNN_C2 = 8, CNN_STEPS = 3 };
static const char *const cnn_params[] = {"w1", "b1", "w2", "b2", "fc", "fcb"};

static alloy_graph *cnn_trainer(alloy_dtype amp)
{
    alloy_graph *g = alloy_graph_new("cnn");
    alloy_graph_set_seed(g, 9);
    test_cnn m = build_cnn(g, F32, CNN_BATCH, CNN_C1, CNN_C2);
    expect_ok(g, alloy_graph_set_loss(g, m.loss), "set_loss");
    if (amp != F32) expect_ok(g, alloy_graph_enable_amp(g, amp), "enable_amp");
    if (amp == F16) expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), "set_grad_scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01)), "add_optimizer");
    return g;
}

/* The losses of CNN_STEPS steps and the parameters after them. */
typedef struct cnn_run {
    double loss[CNN_STEPS];
    float *param[6];
    int64_t count[6];
    int conv_groups; /* gemm groups headed by a convolution */
} cnn_run;

static cnn_run train_cnn(alloy_dtype amp, bool fused)
{
    cnn_run r = {0};
    fusion(fused);
    alloy_graph *g = cnn_trainer(amp);
    const ir_graph *c = compiled(g);
    expect_groups_legal(c);
    int *ids = test_malloc(sizeof(int) * (size_t)c->nnodes);
    for (int k = 0; k < group_count(c); k++) {
        int n = group_members(c, k, ids);
        if (n >= 2 && ir_group_kind_of(c, ids, n) == IR_GROUP_GEMM && c->nodes[ids[0]]->op == IR_OP_conv2d)
            r.conv_groups++;
    }
    test_free(ids);
    float x[CNN_BATCH * 64];
    int32_t t[CNN_BATCH];
    for (int s = 0; s < CNN_STEPS; s++) {
        test_rng = 500 + (uint64_t)s;
        fill(x, CNN_BATCH * 64, -1, 1);
        for (int i = 0; i < CNN_BATCH; i++) t[i] = test_irand(0, 9);
        alloy_host_tensor feeds[2] = {{"x", F32, 4, {CNN_BATCH, 1, 8, 8}, x}, {"targets", I32, 1, {CNN_BATCH}, t}};
        alloy_host_tensor loss = {.name = "loss"};
        expect_ok(g, alloy_graph_run(g, feeds, 2, &loss, 1), "run");
        r.loss[s] = test_decode(loss.dtype, loss.data, 0);
    }
    for (int i = 0; i < 6; i++) {
        alloy_host_tensor p;
        expect_ok(g, alloy_graph_get_state(g, cnn_params[i], &p), "get_state");
        r.count[i] = alloy_host_tensor_numel(&p);
        r.param[i] = test_malloc(sizeof(float) * (size_t)r.count[i]);
        memcpy(r.param[i], p.data, sizeof(float) * (size_t)r.count[i]);
    }
    alloy_graph_free(g);
    fusion(true);
    return r;
}

static void cnn_run_free(cnn_run *r)
{
    for (int i = 0; i < 6; i++) test_free(r->param[i]);
}

/* In f32 the training step fused (conv1 and its bias add one gemm group) and
 * unfused gives the same losses and parameters bit for bit; under f16 AMP
 * the losses agree to 1e-3 relative (the product not rounded to f16). */
static void test_a_cnn_training_step_fuses_its_conv_and_bias_and_trains_as_unfused(void **state)
{
    (void)state;
    cnn_run a = train_cnn(F32, true), b = train_cnn(F32, false);
    assert_true(a.conv_groups >= 1);
    assert_int_equal(b.conv_groups, 0);
    for (int s = 0; s < CNN_STEPS; s++) {
        printf("cnn f32 step %d: loss fused %.9g unfused %.9g\n", s, a.loss[s], b.loss[s]);
        assert_true(a.loss[s] == b.loss[s]);
    }
    for (int i = 0; i < 6; i++)
        if (memcmp(a.param[i], b.param[i], sizeof(float) * (size_t)a.count[i]) != 0)
            fail_msg("parameter %s differs fused and unfused", cnn_params[i]);
    cnn_run_free(&a), cnn_run_free(&b);
    a = train_cnn(F16, true), b = train_cnn(F16, false);
    assert_true(a.conv_groups >= 1);
    for (int s = 0; s < CNN_STEPS; s++) {
        double rel = fabs(a.loss[s] - b.loss[s]) / fabs(b.loss[s]);
        printf("cnn f16 AMP step %d: loss fused %.9g unfused %.9g (relative %.3g)\n", s, a.loss[s], b.loss[s], rel);
        assert_true(rel <= 1e-3);
    }
    cnn_run_free(&a), cnn_run_free(&b);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {
        FUSE_TEST(test_a_conv2d_with_a_channel_bias_and_relu_is_one_gemm_group_with_the_unfused_f32_bits),
        FUSE_TEST(test_a_conv2d_with_its_own_bias_heads_a_gemm_group_with_its_relu_and_the_unfused_f32_bits),
        FUSE_TEST(test_a_conv1d_with_a_channel_bias_is_one_gemm_group_with_the_unfused_f32_bits),
        FUSE_TEST(test_a_vector_over_the_last_spatial_dim_is_no_channel_bias_and_stays_out),
        FUSE_TEST(test_an_f16_conv2d_bias_relu_group_rounds_once_within_half_an_ulp_of_f64),
        FUSE_TEST(test_an_f16_conv1d_bias_group_rounds_once_within_half_an_ulp_of_f64),
        FUSE_TEST(test_a_cnn_training_step_fuses_its_conv_and_bias_and_trains_as_unfused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
