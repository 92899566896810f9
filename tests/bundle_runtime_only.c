/* bundle_runtime_only.c - test program for run_aot_train.sh: includes alloy/bundle.h alone and links liballoy-runtime alone, and makes every call of that header but alloy_graph_save_bundle and alloy_graph_save_bundle_flags (the compiler's) on an alloyc-compiled bundle of mlp_classifier.ir, checking what each returns (a run's fetched gradients against fp64's). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/bundle.h"

static int failures;

/* Counts and prints a failed check. */
static void check(int ok, const char *what, const alloy_bundle *b)
{
    if (ok) return;
    failures++;
    printf("FAIL: %s (%s)\n", what, b ? alloy_bundle_last_error(b) : "");
}

/* The largest |got - want| over n values, relative to the largest |want|. */
static double worst_difference(const float *got, const double *want, int n)
{
    double scale = 0, worst = 0;
    for (int i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int i = 0; i < n; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
    return scale > 0 ? worst / scale : INFINITY;
}

/* d mean cross_entropy / d w2 and d b2 of mlp_classifier.ir (h =
 * relu(x w1 + b1), logits = h w2 + b2 over 3 classes, batch 64, 8 inputs,
 * 256 hidden) at b's state now, in fp64: (softmax - onehot) / 64 times h
 * (w2) or summed (b2). 0 when the parameters cannot be read. */
static int reference_grads(alloy_bundle *b, const float *x, const int32_t *y, double *gw2, double *gb2)
{
    alloy_host_tensor t[4];
    const char *names[4] = {"w1", "b1", "w2", "b2"};
    for (int i = 0; i < 4; i++)
        if (alloy_bundle_get_state(b, names[i], &t[i]) || t[i].dtype != ALLOY_F32) return 0;
    const float *w1 = t[0].data, *b1 = t[1].data, *w2 = t[2].data, *b2 = t[3].data;
    memset(gw2, 0, sizeof(double) * 256 * 3);
    memset(gb2, 0, sizeof(double) * 3);
    for (int r = 0; r < 64; r++) {
        double h[256], z[3], top = -INFINITY, sum = 0;
        for (int j = 0; j < 256; j++) {
            double a = b1[j];
            for (int k = 0; k < 8; k++) a += (double)x[r * 8 + k] * w1[k * 256 + j];
            h[j] = a > 0 ? a : 0;
        }
        for (int c = 0; c < 3; c++) {
            z[c] = b2[c];
            for (int j = 0; j < 256; j++) z[c] += h[j] * w2[j * 3 + c];
            top = fmax(top, z[c]);
        }
        for (int c = 0; c < 3; c++) sum += exp(z[c] - top);
        for (int c = 0; c < 3; c++) {
            double d = (exp(z[c] - top) / sum - (y[r] == c)) / 64;
            gb2[c] += d;
            for (int j = 0; j < 256; j++) gw2[j * 3 + c] += h[j] * d;
        }
    }
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: bundle_runtime_only BUNDLE STATE_OUT\n");
        return 2;
    }
    alloy_bundle *b = NULL;
    char err[1024] = "";
    if (alloy_bundle_load(argv[1], &b, err, sizeof err)) {
        printf("FAIL: load: %s\n", err);
        return 1;
    }
    check(alloy_bundle_input_count(b) == 2, "two inputs", b);
    alloy_host_tensor x, labels;
    check(!alloy_bundle_input_at(b, 0, &x) && !strcmp(x.name, "x") && x.dtype == ALLOY_F32 && x.rank == 2 &&
              x.dims[0] == 64 && x.dims[1] == 8, "input 0 is x f32[64,8]", b);
    check(!alloy_bundle_input_at(b, 1, &labels) && !strcmp(labels.name, "labels") && labels.dtype == ALLOY_I32,
          "input 1 is labels i32[64]", b);
    static float xs[64 * 8];
    static int32_t ys[64];
    for (int i = 0; i < 64 * 8; i++) xs[i] = (float)((i * 37) % 17 - 8) / 8.0f;
    for (int i = 0; i < 64; i++) ys[i] = i % 3;
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {64, 8}, xs}, {"labels", ALLOY_I32, 1, {64}, ys}};
    /* a bad feed is an error on b, and the next run goes on */
    alloy_host_tensor bad[2] = {feeds[0], {"labels", ALLOY_F32, 1, {64}, xs}};
    check(alloy_bundle_run(b, bad, 2, NULL, 0) == ALLOY_ERR_DTYPE && strstr(alloy_bundle_last_error(b), "labels"),
          "a labels feed of the wrong dtype is ALLOY_ERR_DTYPE naming it", NULL);
    /* the first step fetches the gradients of the output layer: the
     * bundle's step keeps every output, so liballoy-runtime, which compiles
     * nothing, runs it from the bundle's own executable; its values against
     * an fp64 forward and backward from the seed's parameters */
    double want_w2[256 * 3], want_b2[3];
    int params_ok = reference_grads(b, xs, ys, want_w2, want_b2);
    check(params_ok, "the parameters w1 b1 w2 b2 read back", b);
    alloy_step_info info;
    double first = 0;
    for (int k = 0; k < 3; k++) {
        alloy_host_tensor fetch[3] = {{.name = "loss"}, {.name = "grad:w2"}, {.name = "grad:b2"}};
        check(!alloy_bundle_run(b, feeds, 2, fetch, k == 0 ? 3 : 1), "run", b);
        if (k == 0 && params_ok && fetch[1].data && fetch[2].data) {
            check(fetch[1].dtype == ALLOY_F32 && fetch[1].rank == 2 && fetch[1].dims[0] == 256 &&
                      fetch[1].dims[1] == 3 && fetch[2].rank == 1 && fetch[2].dims[0] == 3,
                  "grad:w2 is f32[256,3], grad:b2 f32[3]", b);
            double dw = worst_difference(fetch[1].data, want_w2, 256 * 3);
            double db = worst_difference(fetch[2].data, want_b2, 3);
            printf("grad:w2, grad:b2 from the bundle: %.3g, %.3g of the largest from fp64's\n", dw, db);
            check(dw < 1e-2 && db < 1e-2, "the fetched gradients are fp64's within f16 AMP's rounding", b);
        }
        check(!alloy_bundle_step_info(b, &info) && info.step == k + 1 && isfinite(info.loss), "step info", b);
        check(fetch[0].data && *(const float *)fetch[0].data == (float)info.loss, "the fetched loss is the step's", b);
        if (k == 0) first = info.loss;
    }
    check(info.loss < first, "three steps on one batch lower its loss", b);
    int n = alloy_bundle_state_count(b);
    check(n == 17, "17 state tensors (4 params, 8 moments, lr, scaler and step counters)", b);
    alloy_host_tensor s, w2;
    check(!alloy_bundle_state_at(b, 0, &s) && s.name, "state_at 0", b);
    check(alloy_bundle_state_at(b, n, &s) == ALLOY_ERR_NOT_FOUND, "state_at past the end", NULL);
    check(!alloy_bundle_get_state(b, "b2", &w2) && w2.rank == 1 && w2.dims[0] == 3, "get_state b2 f32[3]", b);
    float b2[3] = {0.25f, -0.5f, 1.0f};
    alloy_host_tensor set = {"b2", ALLOY_F32, 1, {3}, b2};
    check(!alloy_bundle_set_state(b, &set), "set_state b2", b);
    check(!alloy_bundle_get_state(b, "b2", &w2) && !memcmp(w2.data, b2, sizeof b2), "b2 reads back as set", b);
    check(!alloy_bundle_save_state(b, argv[2]), "save_state", b);
    b2[0] = 7;
    check(!alloy_bundle_set_state(b, &set), "set_state b2 again", b);
    check(!alloy_bundle_load_state(b, argv[2]), "load_state", b);
    check(!alloy_bundle_get_state(b, "b2", &w2) && ((const float *)w2.data)[0] == 0.25f, "load_state restores b2", b);
    alloy_bundle_free(b);
    if (!failures) printf("bundle_runtime_only: every call of alloy/bundle.h through liballoy-runtime\n");
    return failures != 0;
}
