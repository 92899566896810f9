/* aot_train.c - example: train from a bundle (a training step compiled ahead of time by alloyc) with liballoy-runtime alone: no compiler, no pass, no NVRTC in the program. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/bundle.h"
#include "alloy/safetensors.h"
#include "cli.h"
#include "mlp_data.h"

static const char usage[] =
    "usage: aot_train BUNDLE [options]\n"
    "Trains from BUNDLE, a classifier's training step compiled ahead of time:\n"
    "  alloyc compile examples/ir/mlp_classifier.ir --train --amp=f16 --scaler=dynamic \\\n"
    "         --optimizer=adamw --seed 7 -o step.alloy\n"
    "on mlp_csv's data: the synthetic concentric shells (2000 rows, 8 features,\n"
    "3 classes) or --csv FILE, split and standardized as mlp_csv does. The\n"
    "bundle's inputs must be 'x' f32[B,F] (F the data's features) and 'labels'\n"
    "i32[B], its loss the step's; B rows per step, reshuffled every epoch.\n"
    "  --steps N            steps to run (default 100)\n"
    "  --csv FILE           the data (default: the synthetic set)\n"
    "  --seed S             seed of the data, the split and the shuffles (default 1)\n"
    "  --test-fraction F    share of rows held out (default 0.2; not trained on)\n"
    "  --log-every K        print a line after every step divisible by K and after\n"
    "                       the last (default 10)\n"
    "  --save-feeds FILE    write the N batches as safetensors: x f32[N,B,F] and\n"
    "                       labels i32[N,B] (alloyc train --feed FILE runs the same)\n"
    "  --save-state FILE    write the state after the last step (safetensors)\n"
    "  --help               this text\n"
    "Prints 'step S loss L scale X skipped K' (K: steps skipped so far for inf/NaN\n"
    "gradients), as alloyc train does.\n";

typedef struct options {
    const char *bundle, *csv, *save_feeds, *save_state;
    long steps, log_every;
    unsigned long long seed;
    double test_fraction;
} options;

/* Fills o from argv; exits with status 2 and a one-line reason on a bad flag. */
static void parse_args(int argc, char **argv, options *o)
{
    *o = (options){.steps = 100, .log_every = 10, .seed = 1, .test_fraction = 0.2};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--help")) {
            fputs(usage, stdout);
            exit(0);
        }
        if (strncmp(flag, "--", 2) != 0) {
            if (o->bundle) cli_fail(2, "unexpected argument '%s' (one BUNDLE; see --help)", flag);
            o->bundle = flag;
            continue;
        }
        if (!val) cli_fail(2, "%s needs a value (see --help)", flag);
        i++;
        if (!strcmp(flag, "--steps")) o->steps = cli_count(flag, val, 1, 100000000);
        else if (!strcmp(flag, "--csv")) o->csv = val;
        else if (!strcmp(flag, "--seed")) o->seed = (unsigned long long)cli_count(flag, val, 0, 2147483647);
        else if (!strcmp(flag, "--test-fraction")) o->test_fraction = cli_number(flag, val, 0.001, 0.999);
        else if (!strcmp(flag, "--log-every")) o->log_every = cli_count(flag, val, 1, 100000000);
        else if (!strcmp(flag, "--save-feeds")) o->save_feeds = val;
        else if (!strcmp(flag, "--save-state")) o->save_state = val;
        else cli_fail(2, "unknown option %s (see --help)", flag);
    }
    if (!o->bundle) cli_fail(2, "no BUNDLE given (see --help)");
}

/* The bundle's input called name, which must have dtype and rank. */
static alloy_host_tensor find_input(alloy_bundle *b, const char *path, const char *name, alloy_dtype dtype, int rank)
{
    alloy_host_tensor in;
    for (int i = 0; i < alloy_bundle_input_count(b); i++) {
        if (alloy_bundle_input_at(b, i, &in)) cli_fail(1, "%s: %s", path, alloy_bundle_last_error(b));
        if (strcmp(in.name, name) != 0) continue;
        if (in.dtype != dtype || in.rank != rank)
            cli_fail(1, "%s: input '%s' is %s of rank %d; this example feeds %s of rank %d", path, name,
                     alloy_dtype_name(in.dtype), in.rank, alloy_dtype_name(dtype), rank);
        return in;
    }
    cli_fail(1, "%s: the step has no input '%s' (this example feeds 'x' and 'labels')", path, name);
}

int main(int argc, char **argv)
{
    cli_set_program("aot_train");
    options o;
    parse_args(argc, argv, &o);

    alloy_bundle *b;
    char err[1024];
    if (alloy_bundle_load(o.bundle, &b, err, sizeof err)) cli_fail(1, "%s", err);
    alloy_host_tensor xin = find_input(b, o.bundle, "x", ALLOY_F32, 2);
    find_input(b, o.bundle, "labels", ALLOY_I32, 1);
    long B = (long)xin.dims[0];

    mlp_dataset d;
    if (o.csv) mlp_read_csv(o.csv, &d);
    else mlp_synthetic(&d, o.seed);
    if (xin.dims[1] != d.features)
        cli_fail(1, "%s takes %lld features, the data has %d", o.bundle, (long long)xin.dims[1], d.features);
    unsigned long long rng = o.seed;
    long *order, ntest;
    long ntrain = mlp_split(&d, o.test_fraction, &rng, &order, &ntest), *train_rows = order + ntest;
    if (ntrain < B) cli_fail(1, "%ld training rows, fewer than the step's batch of %ld", ntrain, B);
    printf("bundle %s: batch %ld, %d state tensors; data: %s, %ld training rows\n", o.bundle, B,
           alloy_bundle_state_count(b), o.csv ? o.csv : "synthetic shells", ntrain);

    /* every step's batch, in order: an epoch's shuffle, then its full batches */
    size_t F = (size_t)d.features;
    float *xs = mlp_malloc(sizeof(float) * (size_t)o.steps * (size_t)B * F);
    int *ys = mlp_malloc(sizeof(int) * (size_t)o.steps * (size_t)B);
    for (long s = 0, per_epoch = ntrain / B; s < o.steps; s++) {
        if (s % per_epoch == 0) mlp_shuffle(train_rows, ntrain, &rng);
        for (long i = 0; i < B; i++) {
            long r = train_rows[(s % per_epoch) * B + i];
            memcpy(xs + ((size_t)s * (size_t)B + (size_t)i) * F, d.x + (size_t)r * F, sizeof(float) * F);
            ys[s * B + i] = d.y[r];
        }
    }
    if (o.save_feeds) {
        alloy_host_tensor all[2] = {{"x", ALLOY_F32, 3, {o.steps, B, d.features}, xs},
                                    {"labels", ALLOY_I32, 2, {o.steps, B}, ys}};
        if (alloy_safetensors_save(o.save_feeds, all, 2, NULL, NULL, 0, err, sizeof err)) cli_fail(1, "--save-feeds: %s", err);
    }

    alloy_step_info info = {0};
    for (long s = 0; s < o.steps; s++) {
        alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {B, d.features}, xs + (size_t)s * (size_t)B * F},
                                      {"labels", ALLOY_I32, 1, {B}, ys + s * B}};
        if (alloy_bundle_run(b, feeds, 2, NULL, 0) || alloy_bundle_step_info(b, &info))
            cli_fail(1, "step %ld: %s", s + 1, alloy_bundle_last_error(b));
        if ((s + 1) % o.log_every == 0 || s + 1 == o.steps)
            printf("step %ld loss %.7g scale %g skipped %lld\n", s + 1, info.loss, info.scale,
                   (long long)info.skipped_steps);
    }
    if (o.save_state && alloy_bundle_save_state(b, o.save_state))
        cli_fail(1, "--save-state %s: %s", o.save_state, alloy_bundle_last_error(b));
    alloy_bundle_free(b);
    free(d.x), free(d.y), free(order), free(xs), free(ys);
    return 0;
}
