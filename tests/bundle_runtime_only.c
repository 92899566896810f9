/* bundle_runtime_only.c - test program for run_aot_train.sh: includes alloy/bundle.h alone and links liballoy-runtime alone, and makes every call of that header but alloy_graph_save_bundle and alloy_graph_save_bundle_flags (the compiler's) on an alloyc-compiled bundle of mlp_classifier.ir, checking what each returns. */
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
    alloy_step_info info;
    double first = 0;
    for (int k = 0; k < 3; k++) {
        alloy_host_tensor loss = {.name = "loss"};
        check(!alloy_bundle_run(b, feeds, 2, &loss, 1), "run", b);
        check(!alloy_bundle_step_info(b, &info) && info.step == k + 1 && isfinite(info.loss), "step info", b);
        check(loss.data && *(const float *)loss.data == (float)info.loss, "the fetched loss is the step's", b);
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
