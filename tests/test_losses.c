/* test_losses.c - the losses of alloy/loss.h through the builder: against f64 loops written here, PyTorch's values (tests/data/losses.safetensors), finite differences, every reduction, ignore_index (all ignored too), class weights, label smoothing, and f32 under f16/bf16 AMP. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp_support.h"
#include "support.h"

#ifndef DIMS
#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#endif

enum { MAXV = 64 };

/* The losses this file builds, in one place. */
typedef enum loss_kind { MSE, L1, SMOOTH_L1, BCE, NLL, CE } loss_kind;

/* A loss's inputs: x [rows, cols] (input, logits or log-probabilities), y
 * (the float target [rows, cols], or NULL) or t (i64 targets [rows]),
 * weight [cols] (class weights or pos_weight; NULL: none). */
typedef struct loss_case {
    loss_kind kind;
    alloy_reduction reduction;
    int64_t rows, cols;
    const double *x, *y, *weight;
    const int64_t *t;
    int64_t ignore_index;
    double beta, smoothing;
} loss_case;

/* The builder call of case c over its inputs. */
static alloy_tensor *build(alloy_graph *g, const loss_case *c, alloy_tensor *x, alloy_tensor *y, alloy_tensor *t,
                           alloy_tensor *w)
{
    switch (c->kind) {
    case MSE: return alloy_mse_loss(g, x, y, c->reduction);
    case L1: return alloy_l1_loss(g, x, y, c->reduction);
    case SMOOTH_L1: return alloy_smooth_l1_loss(g, x, y, c->beta, c->reduction);
    case BCE: return alloy_binary_cross_entropy_with_logits(g, x, y, w, c->reduction);
    case NLL: return alloy_nll_loss(g, x, t, w, c->ignore_index, c->reduction);
    case CE: return alloy_cross_entropy_loss(g, x, t, w, c->ignore_index, c->smoothing, c->reduction);
    }
    return NULL;
}

/* Runs case c in dtype dt (f32 or f64): the loss's values into out (*nout
 * of them) and, when grad is not NULL, d sum(loss) / dx into grad. */
static void run_case(const loss_case *c, alloy_dtype dt, double *out, int64_t *nout, double *grad)
{
    alloy_graph *g = alloy_graph_new("loss");
    int64_t n = c->rows * c->cols;
    alloy_tensor *x = alloy_input(g, "x", dt, 2, DIMS(c->rows, c->cols));
    alloy_tensor *y = c->y ? alloy_input(g, "y", dt, 2, DIMS(c->rows, c->cols)) : NULL;
    alloy_tensor *t = c->t ? alloy_input(g, "t", ALLOY_I64, 1, DIMS(c->rows)) : NULL;
    alloy_tensor *w = c->weight ? alloy_input(g, "w", dt, 1, DIMS(c->cols)) : NULL;
    alloy_tensor *l = build(g, c, x, y, t, w);
    if (grad) { /* the sum of the values: their gradient is the loss's, for every reduction */
        alloy_tensor *s = alloy_reduce_sum(g, l, 0, NULL, false);
        expect_ok(g, alloy_graph_set_loss(g, s), "set_loss");
        expect_ok(g, alloy_graph_request_grad(g, x), "request_grad");
    }
    expect_ok(g, alloy_output(g, "loss", l), "output");
    unsigned char xb[MAXV * 8], yb[MAXV * 8], wb[MAXV * 8];
    test_encode(dt, c->x, xb, n);
    if (c->y) test_encode(dt, c->y, yb, n);
    if (c->weight) test_encode(dt, c->weight, wb, c->cols);
    alloy_host_tensor feeds[4];
    int nf = 0;
    feeds[nf++] = (alloy_host_tensor){"x", dt, 2, {c->rows, c->cols}, xb};
    if (c->y) feeds[nf++] = (alloy_host_tensor){"y", dt, 2, {c->rows, c->cols}, yb};
    if (c->t) feeds[nf++] = (alloy_host_tensor){"t", ALLOY_I64, 1, {c->rows}, (void *)c->t};
    if (c->weight) feeds[nf++] = (alloy_host_tensor){"w", dt, 1, {c->cols}, wb};
    alloy_host_tensor fetch[2] = {{.name = "loss"}, {.name = "grad:x"}};
    expect_ok(g, alloy_graph_run(g, feeds, nf, fetch, grad ? 2 : 1), "run");
    int64_t count = 1;
    for (int d = 0; d < fetch[0].rank; d++) count *= fetch[0].dims[d];
    assert_true(count <= MAXV);
    for (int64_t i = 0; i < count; i++) out[i] = test_decode(fetch[0].dtype, fetch[0].data, i);
    *nout = count;
    for (int64_t i = 0; grad && i < n; i++) grad[i] = test_decode(fetch[1].dtype, fetch[1].data, i);
    alloy_graph_free(g);
}

/* ---- the f64 references: plain loops ---- */

static double log_sigmoid(double v) { return v < 0 ? v - log1p(exp(v)) : -log1p(exp(-v)); }

/* Case c's values in f64 (PyTorch's definitions) into out; their count. */
static int64_t reference(const loss_case *c, double *out)
{
    int64_t n = c->rows * c->cols;
    if (c->kind == NLL || c->kind == CE) {
        double num = 0, den = 0;
        for (int64_t r = 0; r < c->rows; r++) {
            if (c->t[r] == c->ignore_index) continue;
            const double *row = c->x + r * c->cols;
            double logp[MAXV], m = -INFINITY, e = 0, smooth = 0;
            for (int64_t k = 0; k < c->cols; k++) m = fmax(m, row[k]);
            for (int64_t k = 0; k < c->cols; k++) e += exp(row[k] - m);
            for (int64_t k = 0; k < c->cols; k++) logp[k] = c->kind == CE ? row[k] - m - log(e) : row[k];
            for (int64_t k = 0; k < c->cols; k++) smooth -= (c->weight ? c->weight[k] : 1) * logp[k];
            double wt = c->weight ? c->weight[c->t[r]] : 1;
            num += (1 - c->smoothing) * -wt * logp[c->t[r]] + c->smoothing / (double)c->cols * smooth;
            den += wt;
        }
        out[0] = c->reduction == ALLOY_REDUCTION_SUM ? num : num / den;
        return 1;
    }
    double v[MAXV], sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = c->x[i] - c->y[i], pw = c->weight ? c->weight[i % c->cols] : 1;
        switch (c->kind) {
        case MSE: v[i] = d * d; break;
        case L1: v[i] = fabs(d); break;
        case SMOOTH_L1: v[i] = fabs(d) < c->beta ? 0.5 * d * d / c->beta : fabs(d) - 0.5 * c->beta; break;
        default: v[i] = -(pw * c->y[i] * log_sigmoid(c->x[i]) + (1 - c->y[i]) * log_sigmoid(-c->x[i])); break;
        }
        sum += v[i];
    }
    if (c->reduction == ALLOY_REDUCTION_NONE) {
        memcpy(out, v, sizeof(double) * (size_t)n);
        return n;
    }
    out[0] = c->reduction == ALLOY_REDUCTION_SUM ? sum : sum / (double)n;
    return 1;
}

/* Random inputs for a [4, 5] case: x, y (floats; y in [0, 1] for BCE),
 * weights in [0.25, 2), targets in [0, 5) with position 2 set to `ignored`. */
typedef struct inputs {
    double x[20], y[20], w[5];
    int64_t t[4];
} inputs;

static void draw(inputs *in, loss_kind kind, int64_t ignored)
{
    for (int i = 0; i < 20; i++) {
        in->x[i] = test_round_to(ALLOY_F32, test_uniform(-3, 3));
        in->y[i] = test_round_to(ALLOY_F32, kind == BCE ? test_uniform(0, 1) : test_uniform(-3, 3));
    }
    for (int i = 0; i < 5; i++) in->w[i] = test_round_to(ALLOY_F32, test_uniform(0.25, 2));
    for (int i = 0; i < 4; i++) in->t[i] = test_irand(0, 4);
    in->t[2] = ignored;
}

static void expect_close(const char *what, const double *got, const double *expected, int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - expected[i]) <= tol * fmax(1, fabs(expected[i]))))
            fail_msg("%s: value %lld is %.9g, expected %.9g", what, (long long)i, got[i], expected[i]);
}

static const char *const reduction_names[] = {"mean", "sum", "none"};

static void test_each_loss_matches_an_f64_loop_in_every_reduction(void **state)
{
    (void)state;
    static const struct {
        loss_kind kind;
        const char *name;
        bool weight, none_ok;
        int64_t ignore;
        double beta, smoothing;
    } losses[] = {
        {MSE, "mse_loss", false, true, 0, 0, 0},
        {L1, "l1_loss", false, true, 0, 0, 0},
        {SMOOTH_L1, "smooth_l1_loss beta=0.7", false, true, 0, 0.7, 0},
        {SMOOTH_L1, "smooth_l1_loss beta=0", false, true, 0, 0, 0},
        {BCE, "bce_with_logits", false, true, 0, 0, 0},
        {BCE, "bce_with_logits pos_weight", true, true, 0, 0, 0},
        {NLL, "nll_loss", false, false, ALLOY_NO_IGNORE_INDEX, 0, 0},
        {NLL, "nll_loss weight ignore_index=-100", true, false, -100, 0, 0},
        {NLL, "nll_loss ignore_index=1 (in range)", false, false, 1, 0, 0},
        {CE, "cross_entropy weight", true, false, ALLOY_NO_IGNORE_INDEX, 0, 0},
        {CE, "cross_entropy ignore_index=-100 label_smoothing=0.2", false, false, -100, 0, 0.2},
        {CE, "cross_entropy weight ignore_index=3 label_smoothing=0.15", true, false, 3, 0, 0.15},
    };
    for (size_t k = 0; k < sizeof losses / sizeof losses[0]; k++)
        for (int r = 0; r < 3; r++) {
            if (r == ALLOY_REDUCTION_NONE && !losses[k].none_ok) continue;
            inputs in;
            int64_t ignored = losses[k].ignore == ALLOY_NO_IGNORE_INDEX ? 2 : losses[k].ignore;
            draw(&in, losses[k].kind, ignored);
            bool rows = losses[k].kind == NLL || losses[k].kind == CE;
            loss_case c = {losses[k].kind, (alloy_reduction)r, 4, 5, in.x, rows ? NULL : in.y,
                           losses[k].weight ? in.w : NULL, rows ? in.t : NULL, losses[k].ignore, losses[k].beta,
                           losses[k].smoothing};
            double got[MAXV], expected[MAXV];
            int64_t ngot, nwant = reference(&c, expected);
            run_case(&c, ALLOY_F32, got, &ngot, NULL);
            char what[160];
            snprintf(what, sizeof what, "%s reduction=%s", losses[k].name, reduction_names[r]);
            if (ngot != nwant) fail_msg("%s: %lld values, expected %lld", what, (long long)ngot, (long long)nwant);
            expect_close(what, got, expected, ngot, 2e-6);
        }
}

/* Mean over positions that are all ignored: 0/0, NaN as PyTorch; the sum
 * is 0; the gradients are zeros (not NaN) either way. */
static void test_all_targets_ignored_give_a_nan_mean_a_zero_sum_and_zero_gradients(void **state)
{
    (void)state;
    inputs in;
    draw(&in, CE, -100);
    for (int i = 0; i < 4; i++) in.t[i] = -100;
    for (int kind = NLL; kind <= CE; kind++)
        for (int r = 0; r < 2; r++) {
            loss_case c = {(loss_kind)kind, (alloy_reduction)r, 4, 5, in.x, NULL, in.w, in.t, -100, 0, 0.1};
            double got[MAXV], grad[20];
            int64_t n;
            run_case(&c, ALLOY_F32, got, &n, grad);
            if (r == ALLOY_REDUCTION_MEAN) assert_true(isnan(got[0]));
            else assert_true(got[0] == 0);
            for (int i = 0; i < 20; i++) assert_true(grad[i] == 0);
        }
}

/* d sum(loss) / dx in f64 against central differences of the f64 loop. */
static void test_gradients_match_finite_differences_of_the_f64_loop(void **state)
{
    (void)state;
    for (int kind = MSE; kind <= CE; kind++)
        for (int r = 0; r < 2; r++) {
            inputs in;
            draw(&in, (loss_kind)kind, 4);
            bool rows = kind == NLL || kind == CE;
            loss_case c = {(loss_kind)kind, (alloy_reduction)r, 4, 5, in.x, rows ? NULL : in.y, in.w,
                           rows ? in.t : NULL, 4, 0.8, rows ? 0.25 : 0};
            if (kind == NLL) c.smoothing = 0;
            double got[MAXV], grad[20], x[20], lo[MAXV], hi[MAXV];
            int64_t n;
            run_case(&c, ALLOY_F64, got, &n, grad);
            memcpy(x, in.x, sizeof x);
            c.x = x;
            for (int i = 0; i < 20; i++) {
                const double h = 1e-6;
                x[i] = in.x[i] + h;
                reference(&c, hi);
                x[i] = in.x[i] - h;
                reference(&c, lo);
                x[i] = in.x[i];
                double fd = (hi[0] - lo[0]) / (2 * h);
                if (!(fabs(grad[i] - fd) <= 1e-6 * fmax(1, fabs(fd))))
                    fail_msg("loss %d reduction=%s: d/dx[%d] is %.12g, finite differences %.12g", kind,
                             reduction_names[r], i, grad[i], fd);
            }
        }
}

/* ---- PyTorch ---- */

static const alloy_host_tensor *tensor(const alloy_safetensors *st, const char *name)
{
    const alloy_host_tensor *t = alloy_safetensors_find(st, name);
    if (!t) fail_msg("losses.safetensors has no '%s'", name);
    return t;
}

/* The f32 tensor name of the reference file as doubles (at most MAXV). */
static const double *values(const alloy_safetensors *st, const char *name, double *buf)
{
    const alloy_host_tensor *t = tensor(st, name);
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= t->dims[d];
    assert_true(n <= MAXV);
    for (int64_t i = 0; i < n; i++) buf[i] = test_decode(t->dtype, t->data, i);
    return buf;
}

static void test_losses_and_gradients_match_pytorch(void **state)
{
    (void)state;
    alloy_safetensors *st;
    char err[256];
    assert_int_equal(alloy_safetensors_load(ALLOY_TEST_DATA "/losses.safetensors", &st, err, sizeof err), ALLOY_OK);
    double logits[MAXV], logp[MAXV], weight[MAXV], pred[MAXV], target[MAXV], z[MAXV], pw[MAXV];
    values(st, "logits", logits), values(st, "log_probs", logp), values(st, "weight", weight);
    values(st, "pred", pred), values(st, "target", target), values(st, "z", z), values(st, "pos_weight", pw);
    const int64_t *t = tensor(st, "targets")->data;
    const alloy_reduction M = ALLOY_REDUCTION_MEAN, S = ALLOY_REDUCTION_SUM;
    const struct {
        const char *name;
        loss_case c;
    } cases[] = {
        {"ce_w_ls_mean", {CE, M, 6, 5, logits, NULL, weight, t, -100, 0, 0.1}},
        {"ce_w_ls_sum", {CE, S, 6, 5, logits, NULL, weight, t, -100, 0, 0.1}},
        {"ce_ls_mean", {CE, M, 6, 5, logits, NULL, NULL, t, -100, 0, 0.3}},
        {"ce_mean", {CE, M, 6, 5, logits, NULL, NULL, t, -100, 0, 0}},
        {"nll_w_mean", {NLL, M, 6, 5, logp, NULL, weight, t, -100, 0, 0}},
        {"nll_sum", {NLL, S, 6, 5, logp, NULL, NULL, t, -100, 0, 0}},
        {"mse_mean", {MSE, M, 4, 3, pred, target, NULL, NULL, 0, 0, 0}},
        {"l1_sum", {L1, S, 4, 3, pred, target, NULL, NULL, 0, 0, 0}},
        {"smooth_l1_b05_mean", {SMOOTH_L1, M, 4, 3, pred, target, NULL, NULL, 0, 0.5, 0}},
        {"smooth_l1_sum", {SMOOTH_L1, S, 4, 3, pred, target, NULL, NULL, 0, 1.0, 0}},
        {"bce_pw_mean", {BCE, M, 4, 3, pred, z, pw, NULL, 0, 0, 0}},
        {"bce_sum", {BCE, S, 4, 3, pred, z, NULL, NULL, 0, 0, 0}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char name[64];
        double expected[MAXV], expected_grad[MAXV], got[MAXV], grad[MAXV];
        int64_t n;
        snprintf(name, sizeof name, "%s.loss", cases[k].name);
        values(st, name, expected);
        snprintf(name, sizeof name, "%s.grad", cases[k].name);
        values(st, name, expected_grad);
        run_case(&cases[k].c, ALLOY_F32, got, &n, grad);
        expect_close(cases[k].name, got, expected, 1, 2e-6);
        snprintf(name, sizeof name, "%s gradient", cases[k].name);
        expect_close(name, grad, expected_grad, cases[k].c.rows * cases[k].c.cols, 2e-6);
    }
    alloy_safetensors_free(st);
}

/* ---- AMP ---- */

/* pred = x @ w (allow: low precision) into each loss under f16 and bf16
 * AMP: the loss node and its reduction compute in f32 (deny), the
 * prediction reaches them through an inserted cast to f32, and the target,
 * the class weights and pos_weight (the user's f32 data) are read uncast. */
static void test_losses_stay_f32_under_amp_with_only_the_prediction_cast(void **state)
{
    (void)state;
    static const alloy_dtype low[] = {ALLOY_F16, ALLOY_BF16};
    static const char *const ops[] = {"mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits",
                                      "nll_loss", "cross_entropy"};
    for (int d = 0; d < 2; d++)
        for (int kind = MSE; kind <= CE; kind++) {
            alloy_graph *g = new_graph("amp_loss");
            alloy_tensor *x = in_f32(g, "x", 2, DIMS(8, 4));
            alloy_tensor *w = param_f32(g, "w", 2, DIMS(4, 3));
            alloy_tensor *y = in_f32(g, "y", 2, DIMS(8, 3));
            alloy_tensor *cw = in_f32(g, "cw", 1, DIMS(3));
            alloy_tensor *t = alloy_input(g, "t", ALLOY_I64, 1, DIMS(8));
            alloy_tensor *pred = named(g, alloy_matmul(g, x, w, false, false), "pred");
            if (kind == NLL) pred = named(g, alloy_log_softmax(g, pred, -1), "logp");
            loss_case c = {(loss_kind)kind, ALLOY_REDUCTION_MEAN, 8, 3, NULL, NULL, NULL, NULL, -100, 1.0, 0.1};
            alloy_tensor *l = build(g, &c, pred, y, t, kind == BCE || kind >= NLL ? cw : NULL);
            expect_ok(g, alloy_graph_set_loss(g, l), "set_loss");
            alloy_graph_enable_amp(g, low[d]);
            const ir_graph *cg = compile_amp(g, NULL);
            int found = 0;
            for (int i = 0; i < cg->nnodes; i++) {
                const ir_node *n = cg->nodes[i];
                if (strcmp(ir_ops[n->op].name, ops[kind]) != 0) continue;
                found++;
                if (n->type.dtype != ALLOY_F32 || n->amp != AMP_DENY)
                    fail_in(cg, "%s in %s AMP: %s, coloured %d", ops[kind], alloy_dtype_name(low[d]),
                            alloy_dtype_name(n->type.dtype), (int)n->amp);
                const ir_node *p = cg->nodes[n->in[0]];
                bool cast_pred = is_inserted_cast(p) && p->type.dtype == ALLOY_F32 &&
                                 cg->nodes[p->in[0]]->type.dtype == low[d];
                if (kind == NLL ? p->type.dtype != ALLOY_F32 || is_inserted_cast(p) : !cast_pred)
                    fail_in(cg, "%s in %s AMP: its input is not the f32 %s", ops[kind], alloy_dtype_name(low[d]),
                            kind == NLL ? "log_softmax" : "cast of the low-precision matmul");
                for (int j = 1; j < n->nin; j++) /* y, t, weights: the inputs themselves */
                    if (is_inserted_cast(cg->nodes[n->in[j]]) || cg->nodes[n->in[j]]->op == IR_OP_cast ||
                        (cg->nodes[n->in[j]]->op != IR_OP_input && cg->nodes[n->in[j]]->op != IR_OP_constant))
                        fail_in(cg, "%s in %s AMP: operand %d is not the user's data", ops[kind],
                                alloy_dtype_name(low[d]), j);
                for (int u = 0; u < cg->nnodes; u++) /* its reduction */
                    for (int j = 0; j < cg->nodes[u]->nin; j++)
                        if (cg->nodes[u]->in[j] == i && cg->nodes[u]->op == IR_OP_reduce_mean &&
                            cg->nodes[u]->type.dtype != ALLOY_F32)
                            fail_in(cg, "%s's reduce_mean is not f32", ops[kind]);
            }
            if (found != 1) fail_in(cg, "%d %s nodes, expected 1", found, ops[kind]);
            free_graph(g);
        }
}

/* ---- the IR ---- */

static void test_loss_attributes_print_and_parse_back(void **state)
{
    (void)state;
    static const char text[] =
        "graph losses {\n"
        "  %x = input : f32[4,5]\n"
        "  %t = input : i64[4]\n"
        "  %w = input : f32[5]\n"
        "  %3 = cross_entropy(%x, %t, %w) {ignore_index=-100, label_smoothing=0.1, reduction=\"sum\"} : f32[]\n"
        "  %4 = nll_loss(%x, %t) {ignore_index=2} : f32[]\n"
        "  %5 = smooth_l1_loss(%x, %x) {beta=0.5} : f32[4,5]\n"
        "  %6 = cross_entropy(%x, %t) : f32[]\n"
        "  output \"a\" = %3\n"
        "  output \"b\" = %4\n"
        "  output \"c\" = %5\n"
        "  output \"d\" = %6\n"
        "}\n";
    char err[256];
    alloy_graph *g = alloy_graph_parse(text, strlen(text), "losses.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(alloy_graph_dump(g, f, ALLOY_DUMP_SOURCE), ALLOY_OK);
    fclose(f);
    if (!strstr(buf, text + strlen("graph losses {\n"))) fail_msg("printed:\n%s", buf);
    free(buf);
    alloy_graph_free(g);
}

static void test_bad_loss_options_are_errors_that_name_them(void **state)
{
    (void)state;
    static const struct {
        const char *line, *message;
    } cases[] = {
        {"%3 = cross_entropy(%x, %t) {reduction=\"none\"} : f32[]", "reduction must be \"mean\" or \"sum\", not \"none\""},
        {"%3 = cross_entropy(%x, %t) {label_smoothing=1.5} : f32[]", "label_smoothing must be in [0, 1], not 1.5"},
        {"%3 = nll_loss(%x, %t, %t) : f32[]", "weight must have the logits' dtype f32, not i64"},
        {"%3 = nll_loss(%x, %t, %x) : f32[]", "weight must be [5], one per class"},
        {"%3 = smooth_l1_loss(%x, %x) {beta=-1.0} : f32[4,5]", "beta must be finite and >= 0, not -1"},
        {"%3 = nll_loss(%x, %t) {ignore_index=16777217} : f32[]", "ignore_index 16777217 is not in [-2^24, 2^24]"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char text[512], err[512];
        snprintf(text, sizeof text, "graph bad {\n  %%x = input : f32[4,5]\n  %%t = input : i64[4]\n  %s\n}\n",
                 cases[k].line);
        alloy_graph *g = alloy_graph_parse(text, strlen(text), "bad.ir", err, sizeof err);
        if (g) fail_msg("'%s' parsed", cases[k].line);
        if (!strstr(err, cases[k].message)) fail_msg("'%s': %s", cases[k].line, err);
    }
    /* the builder: reduction none where there is no per-position result, and an unknown one */
    alloy_graph *g = alloy_graph_new("bad");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(4, 5));
    alloy_tensor *t = alloy_input(g, "t", ALLOY_I64, 1, DIMS(4));
    assert_null(alloy_nll_loss(g, x, t, NULL, -100, ALLOY_REDUCTION_NONE));
    assert_non_null(strstr(alloy_last_error(g), "nll_loss: reduction 2 is not mean or sum"));
    alloy_graph_free(g);
    g = alloy_graph_new("bad");
    x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(4, 5));
    assert_null(alloy_mse_loss(g, x, x, (alloy_reduction)7));
    assert_non_null(strstr(alloy_last_error(g), "mse_loss: reduction 7 is not mean or sum or none"));
    alloy_graph_free(g);
}

/* A target out of [0, C) that is not ignore_index is an error naming it. */
static void test_a_target_out_of_range_is_an_error_unless_it_is_ignore_index(void **state)
{
    (void)state;
    inputs in;
    draw(&in, CE, -100);
    in.t[1] = -1;
    loss_case c = {CE, ALLOY_REDUCTION_MEAN, 4, 5, in.x, NULL, NULL, in.t, -100, 0, 0};
    alloy_graph *g = alloy_graph_new("range");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, DIMS(4, 5));
    alloy_tensor *t = alloy_input(g, "t", ALLOY_I64, 1, DIMS(4));
    alloy_output(g, "loss", build(g, &c, x, NULL, t, NULL));
    float xb[20];
    for (int i = 0; i < 20; i++) xb[i] = (float)in.x[i];
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {4, 5}, xb}, {"t", ALLOY_I64, 1, {4}, in.t}};
    alloy_host_tensor fetch = {.name = "loss"};
    assert_int_equal(alloy_graph_run(g, feeds, 2, &fetch, 1), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "target -1 out of range [0, 5) at position [1]"));
    in.t[1] = 4; /* now only -100, ignored */
    expect_ok(g, alloy_graph_run(g, feeds, 2, &fetch, 1), "run");
    alloy_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        AMP_TEST(test_each_loss_matches_an_f64_loop_in_every_reduction),
        AMP_TEST(test_all_targets_ignored_give_a_nan_mean_a_zero_sum_and_zero_gradients),
        AMP_TEST(test_gradients_match_finite_differences_of_the_f64_loop),
        AMP_TEST(test_losses_and_gradients_match_pytorch),
        AMP_TEST(test_losses_stay_f32_under_amp_with_only_the_prediction_cast),
        AMP_TEST(test_loss_attributes_print_and_parse_back),
        AMP_TEST(test_bad_loss_options_are_errors_that_name_them),
        AMP_TEST(test_a_target_out_of_range_is_an_error_unless_it_is_ignore_index),
    };
    return amp_run_tests(tests, sizeof tests / sizeof tests[0]);
}
