/* mlp_csv.c - example: train an MLP classifier on a CSV file (numeric features, integer label last) with AMP and AdamW, report test accuracy. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/alloy.h"
#include "cli.h"
#include "mlp_data.h"

static const char usage[] =
    "usage: mlp_csv [options]\n"
    "Trains an MLP classifier on a CSV file: numeric features, then an integer label\n"
    "0..C-1 in the last column; a first line with a non-numeric field is a header.\n"
    "Without --csv, a synthetic set is used: 2000 rows, 8 features, 3 concentric shells.\n"
    "  --csv FILE           the data (default: the synthetic set)\n"
    "  --hidden LIST        hidden layer widths, comma-separated (default 256,256)\n"
    "  --epochs N           passes over the training split (default 20)\n"
    "  --batch N            rows per step (default 64); each epoch's last partial batch\n"
    "                       is dropped (the order is reshuffled every epoch)\n"
    "  --lr X               AdamW learning rate (default 1e-3)\n"
    "  --amp f16|bf16|off   mixed precision (default f16, with a dynamic loss scaler)\n"
    "  --seed S             seed of the split, the shuffles and the init (default 1)\n"
    "  --test-fraction F    share of rows held out for testing (default 0.2)\n"
    "  --device D           auto|cpu|cuda (default auto: the GPU when the NVIDIA driver,\n"
    "                       a GPU and the CUDA libraries are there, else the CPU; cuda\n"
    "                       without them: error)\n"
    "  --help               this text\n"
    "Features are standardized with the training split's mean and std. Prints\n"
    "`epoch E loss X test_accuracy A scale S skipped K` per epoch (X: mean training\n"
    "loss of the epoch), and last `test_accuracy A`.\n";

enum { MAX_HIDDEN = 16, EVAL_BATCH = 1024 };

typedef struct options {
    const char *csv, *device;
    int hidden[MAX_HIDDEN], nhidden;
    int epochs, batch;
    double lr, test_fraction;
    alloy_dtype amp; /* ALLOY_F32 = off */
    unsigned long long seed;
} options;

/* Fills o from argv; exits with status 2 and a one-line reason on a bad flag. */
static void parse_args(int argc, char **argv, options *o)
{
    *o = (options){NULL, "auto", {256, 256}, 2, 20, 64, 1e-3, 0.2, ALLOY_F16, 1};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--help")) { fputs(usage, stdout); exit(0); }
        if (strncmp(flag, "--", 2)) cli_fail(2, "unexpected argument '%s' (see --help)", flag);
        if (!val) cli_fail(2, "%s needs a value (see --help)", flag);
        i++;
        if (!strcmp(flag, "--csv")) o->csv = val;
        else if (!strcmp(flag, "--device")) o->device = val;
        else if (!strcmp(flag, "--epochs")) o->epochs = cli_count(flag, val, 0, 1000000);
        else if (!strcmp(flag, "--batch")) o->batch = cli_count(flag, val, 1, 1 << 20);
        else if (!strcmp(flag, "--seed")) o->seed = (unsigned long long)cli_count(flag, val, 0, 2147483647);
        else if (!strcmp(flag, "--lr")) o->lr = cli_number(flag, val, 1e-9, 10);
        else if (!strcmp(flag, "--test-fraction")) o->test_fraction = cli_number(flag, val, 0.001, 0.999);
        else if (!strcmp(flag, "--hidden")) {
            o->nhidden = 0;
            for (const char *p = val;; p++) {
                char *end;
                long width = strtol(p, &end, 10);
                if (end == p || (*end && *end != ',') || width < 1 || width > 65536 || o->nhidden == MAX_HIDDEN)
                    cli_fail(2, "--hidden wants up to %d comma-separated widths in [1, 65536], got '%s'",
                         MAX_HIDDEN, val);
                o->hidden[o->nhidden++] = (int)width;
                if (!*(p = end)) break;
            }
        } else if (!strcmp(flag, "--amp")) {
            if (!strcmp(val, "f16")) o->amp = ALLOY_F16;
            else if (!strcmp(val, "bf16")) o->amp = ALLOY_BF16;
            else if (!strcmp(val, "off")) o->amp = ALLOY_F32;
            else cli_fail(2, "--amp wants f16, bf16 or off, got '%s'", val);
        } else {
            cli_fail(2, "unknown option %s (see --help)", flag);
        }
    }
}

/* features -> [linear + relu] per hidden width -> linear to the classes:
 * "logits" [batch, classes]; with_loss adds input "labels" and output "loss". */
static alloy_tensor *build_mlp(alloy_graph *g, const options *o, const mlp_dataset *d, int batch, bool with_loss)
{
    alloy_tensor *h = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){batch, d->features});
    int in = d->features;
    for (int layer = 0; layer <= o->nhidden; layer++) {
        bool last = layer == o->nhidden;
        int out = last ? d->classes : o->hidden[layer];
        char wname[32], bname[32];
        snprintf(wname, sizeof wname, "fc%d.weight", layer + 1);
        snprintf(bname, sizeof bname, "fc%d.bias", layer + 1);
        alloy_tensor *w = alloy_param(g, wname, ALLOY_F32, 2, (int64_t[]){in, out},
                                      alloy_init_kaiming_uniform(last ? 1.0 : sqrt(2.0)));
        alloy_tensor *b = alloy_param(g, bname, ALLOY_F32, 1, (int64_t[]){out}, alloy_init_zeros());
        h = alloy_add(g, alloy_matmul(g, h, w, false, false), b);
        if (!last) h = alloy_relu(g, h);
        in = out;
    }
    alloy_set_name(g, h, "logits");
    if (!with_loss) {
        alloy_output(g, "logits", h);
        return h;
    }
    alloy_tensor *labels = alloy_input(g, "labels", ALLOY_I32, 1, (int64_t[]){batch});
    alloy_tensor *loss = alloy_set_name(g, alloy_cross_entropy(g, h, labels), "loss");
    alloy_output(g, "loss", loss);
    return loss;
}

/* Share of test rows whose largest logit is the label, from the f32 graph
 * eval (batch EVAL_BATCH or fewer), which shares the training graph's
 * parameters; the last chunk is padded with row 0 and the padding not
 * counted. */
static double test_accuracy(alloy_graph *eval, int eval_batch, const mlp_dataset *d, const long *rows, long nrows,
                            float *x)
{
    long correct = 0;
    for (long first = 0; first < nrows; first += eval_batch) {
        for (long i = 0; i < eval_batch; i++)
            memcpy(x + i * d->features, d->x + rows[first + i < nrows ? first + i : 0] * d->features,
                   sizeof(float) * (size_t)d->features);
        alloy_host_tensor feed = {"x", ALLOY_F32, 2, {eval_batch, d->features}, x};
        alloy_host_tensor logits = {.name = "logits"};
        if (alloy_graph_run(eval, &feed, 1, &logits, 1)) cli_fail(1, "testing: %s", alloy_last_error(eval));
        for (long i = 0; i < eval_batch && first + i < nrows; i++) {
            const float *row = (const float *)logits.data + i * d->classes;
            int best = 0;
            for (int c = 1; c < d->classes; c++) best = row[c] > row[best] ? c : best;
            correct += best == d->y[rows[first + i]];
        }
    }
    return (double)correct / (double)nrows;
}

int main(int argc, char **argv)
{
    cli_set_program("mlp_csv");
    options o;
    parse_args(argc, argv, &o);
    mlp_dataset d;
    if (o.csv) {
        mlp_read_csv(o.csv, &d);
        printf("data %s: %ld rows, %d features, %d classes\n", o.csv, d.rows, d.features, d.classes);
    } else {
        mlp_synthetic(&d, o.seed);
        printf("no --csv given: synthetic data, %ld rows, %d features, %d classes (concentric shells)\n",
               d.rows, d.features, d.classes);
    }

    /* Shuffled split; standardize every row with the training rows' statistics. */
    unsigned long long rng = o.seed;
    long *order, ntest;
    long ntrain = mlp_split(&d, o.test_fraction, &rng, &order, &ntest), *train_rows = order + ntest, *test_rows = order;
    if (o.batch > ntrain) {
        printf("--batch %d is more than the %ld training rows: using %ld\n", o.batch, ntrain, ntrain);
        o.batch = (int)ntrain;
    }
    int B = o.batch, eval_batch = ntest < EVAL_BATCH ? (int)ntest : EVAL_BATCH;
    long steps_per_epoch = ntrain / B; /* the last partial batch is dropped */

    alloy_graph *train = alloy_graph_new("mlp_csv"), *eval = alloy_graph_new("mlp_csv_eval");
    if (!train || !eval) cli_fail(1, "out of memory");
    alloy_graph_set_seed(train, o.seed);
    alloy_graph_set_loss(train, build_mlp(train, &o, &d, B, true));
    if (o.amp != ALLOY_F32) alloy_graph_enable_amp(train, o.amp);
    if (o.amp == ALLOY_F16) alloy_graph_set_grad_scaler(train, alloy_dynamic_scaler());
    /* AdamW with PyTorch's defaults: robust without tuning across datasets. */
    alloy_graph_add_optimizer(train, alloy_adamw(o.lr, 0.9, 0.999, 1e-8, 0.01));
    build_mlp(eval, &o, &d, eval_batch, false);
    if (alloy_graph_status(train)) cli_fail(1, "building the model: %s", alloy_last_error(train));
    if (alloy_graph_status(eval)) cli_fail(1, "building the model: %s", alloy_last_error(eval));
    if (alloy_graph_set_option(train, "device", o.device) || alloy_graph_set_option(eval, "device", o.device))
        cli_fail(2, "--device %s: %s", o.device, alloy_last_error(train));
    const char *device = alloy_graph_device(train);
    if (!device) cli_fail(1, "%s", alloy_last_error(train));
    printf("device: %s\n", device);
    /* the evaluation graph reads the parameters each training step writes: no copy */
    if (alloy_graph_share_state(eval, train, NULL, NULL)) cli_fail(1, "%s", alloy_last_error(eval));

    float *x = mlp_malloc(sizeof(float) * (size_t)(B > eval_batch ? B : eval_batch) * (size_t)d.features);
    int *labels = mlp_malloc(sizeof(int) * (size_t)B);
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {B, d.features}, x}, {"labels", ALLOY_I32, 1, {B}, labels}};
    double accuracy = 0;
    for (int epoch = 1; epoch <= o.epochs; epoch++) {
        mlp_shuffle(train_rows, ntrain, &rng);
        double loss_sum = 0;
        alloy_step_info info = {.scale = 1};
        for (long s = 0; s < steps_per_epoch; s++) {
            for (long i = 0; i < B; i++) {
                long r = train_rows[s * B + i];
                memcpy(x + i * d.features, d.x + r * d.features, sizeof(float) * (size_t)d.features);
                labels[i] = d.y[r];
            }
            if (alloy_graph_run(train, feeds, 2, NULL, 0) || alloy_graph_step_info(train, &info))
                cli_fail(1, "training: %s", alloy_last_error(train));
            loss_sum += info.loss;
        }
        accuracy = test_accuracy(eval, eval_batch, &d, test_rows, ntest, x);
        printf("epoch %d loss %.4f test_accuracy %.4f scale %g skipped %lld\n", epoch,
               loss_sum / (double)steps_per_epoch, accuracy, info.scale, (long long)info.skipped_steps);
        fflush(stdout);
    }
    if (o.epochs == 0) accuracy = test_accuracy(eval, eval_batch, &d, test_rows, ntest, x);
    printf("test_accuracy %.4f\n", accuracy);
    alloy_graph_free(train), alloy_graph_free(eval);
    free(d.x), free(d.y), free(order), free(x), free(labels);
    return 0;
}
