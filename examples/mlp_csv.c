/* mlp_csv.c - example: train an MLP classifier on a CSV file (numeric features, integer label last) with AMP and AdamW, report test accuracy. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/alloy.h"
#include "cli.h"

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

enum { MAX_HIDDEN = 16, MAX_CLASSES = 1000, EVAL_BATCH = 1024 };

typedef struct options {
    const char *csv, *device;
    int hidden[MAX_HIDDEN], nhidden;
    int epochs, batch;
    double lr, test_fraction;
    alloy_dtype amp; /* ALLOY_F32 = off */
    unsigned long long seed;
} options;

/* Rows of features and labels. */
typedef struct dataset {
    float *x; /* [rows, features] */
    int *y;   /* [rows], 0 .. classes-1 */
    long rows;
    int features, classes;
} dataset;

static void *checked_malloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (!p) cli_fail(1, "out of memory");
    return p;
}

static double parse_number(const char *flag, const char *s, double min, double max)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !(v >= min && v <= max))
        cli_fail(2, "%s wants a number in [%g, %g], got '%s'", flag, min, max, s);
    return v;
}

static int parse_count(const char *flag, const char *s, int min, int max)
{
    double v = parse_number(flag, s, min, max);
    if (v != floor(v)) cli_fail(2, "%s wants an integer, got '%s'", flag, s);
    return (int)v;
}

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
        else if (!strcmp(flag, "--epochs")) o->epochs = parse_count(flag, val, 0, 1000000);
        else if (!strcmp(flag, "--batch")) o->batch = parse_count(flag, val, 1, 1 << 20);
        else if (!strcmp(flag, "--seed")) o->seed = (unsigned long long)parse_count(flag, val, 0, 2147483647);
        else if (!strcmp(flag, "--lr")) o->lr = parse_number(flag, val, 1e-9, 10);
        else if (!strcmp(flag, "--test-fraction")) o->test_fraction = parse_number(flag, val, 0.001, 0.999);
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

static double uniform01(unsigned long long *state) { return ((double)(cli_next_random(state) >> 11) + 0.5) * 0x1p-53; }

static double gaussian(unsigned long long *state)
{
    return sqrt(-2 * log(uniform01(state))) * cos(6.283185307179586 * uniform01(state));
}

static void shuffle(long *order, long n, unsigned long long *rng)
{
    for (long i = n - 1; i > 0; i--) {
        long j = (long)(cli_next_random(rng) % (unsigned long long)(i + 1)), t = order[i];
        order[i] = order[j], order[j] = t;
    }
}

/* 3 classes of points in 8-D at radius 1, 2 or 3 (plus noise) in random
 * directions: no linear model separates them, an MLP does. */
static void synthetic(dataset *d, unsigned long long seed)
{
    unsigned long long rng = seed ^ 0x5EEDull;
    d->rows = 2000, d->features = 8, d->classes = 3;
    d->x = checked_malloc(sizeof(float) * (size_t)d->rows * 8);
    d->y = checked_malloc(sizeof(int) * (size_t)d->rows);
    for (long r = 0; r < d->rows; r++) {
        double v[8], norm = 0;
        for (int f = 0; f < 8; f++) {
            v[f] = gaussian(&rng);
            norm += v[f] * v[f];
        }
        d->y[r] = (int)(r % 3);
        double radius = 1.0 + d->y[r] + 0.25 * gaussian(&rng);
        for (int f = 0; f < 8; f++) d->x[r * 8 + f] = (float)(v[f] / sqrt(norm) * radius);
    }
}

/* Splits line (modified in place) at commas into at most max fields,
 * trimming blanks; returns the number of fields (max + 1 if there are more). */
static int split_fields(char *line, char **fields, int max)
{
    int n = 0;
    for (char *p = line;;) {
        while (*p == ' ' || *p == '\t') p++;
        char *end = p + strcspn(p, ",");
        bool last = *end == '\0';
        char *tail = end;
        while (tail > p && (tail[-1] == ' ' || tail[-1] == '\t' || tail[-1] == '\r')) tail--;
        *tail = '\0';
        if (n < max) fields[n] = p;
        n++;
        if (last) return n <= max ? n : max + 1;
        p = end + 1;
    }
}

static bool is_number(const char *s, double *out)
{
    char *end;
    *out = strtod(s, &end);
    return *s && !*end && isfinite(*out);
}

/* Reads a CSV of numeric features and an integer label last; a first line
 * that is not all numbers is a header. Exits with "file:line: reason" on a
 * ragged row, a non-number, or a label that is not an integer in range. */
static void read_csv(const char *path, dataset *d)
{
    FILE *f = fopen(path, "rb");
    if (!f) cli_fail(1, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 0, rows_cap = 0;
    char *line = NULL;
    char **fields = NULL;
    int ncols = 0, max_fields = 0, max_label = -1;
    long lineno = 0;
    bool had_header = false;
    ssize_t got;
    d->rows = 0, d->x = NULL, d->y = NULL;
    while ((got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)got) continue; /* blank */
        line[strcspn(line, "\n")] = '\0';
        if (!ncols) { /* the first line fixes the column count */
            max_fields = 1 + (int)strlen(line);
            fields = checked_malloc(sizeof(char *) * (size_t)max_fields);
        }
        int n = split_fields(line, fields, ncols ? ncols : max_fields);
        if (!ncols) {
            if (n < 2) cli_fail(1, "%s:%ld: need at least one feature and a label, found %d column", path, lineno, n);
            ncols = n, d->features = n - 1;
            double v;
            bool header = false;
            for (int i = 0; i < n; i++) header |= *fields[i] && !is_number(fields[i], &v);
            if ((had_header = header)) continue;
        } else if (n != ncols) {
            cli_fail(1, "%s:%ld: expected %d fields, found %s%d", path, lineno, ncols, n > ncols ? "more than " : "",
                 n > ncols ? ncols : n);
        }
        if ((size_t)d->rows == rows_cap) {
            rows_cap = rows_cap ? 2 * rows_cap : 1024;
            d->x = realloc(d->x, sizeof(float) * rows_cap * (size_t)d->features);
            d->y = realloc(d->y, sizeof(int) * rows_cap);
            if (!d->x || !d->y) cli_fail(1, "out of memory reading %s", path);
        }
        double v;
        for (int i = 0; i < d->features; i++) {
            if (!is_number(fields[i], &v))
                cli_fail(1, "%s:%ld: field %d ('%s') is not a finite number", path, lineno, i + 1, fields[i]);
            d->x[d->rows * d->features + i] = (float)v;
        }
        if (!is_number(fields[d->features], &v) || v != floor(v))
            cli_fail(1, "%s:%ld: the label ('%s') is not an integer", path, lineno, fields[d->features]);
        if (v < 0 || v >= MAX_CLASSES)
            cli_fail(1, "%s:%ld: the label %.0f is out of range [0, %d]", path, lineno, v, MAX_CLASSES - 1);
        d->y[d->rows++] = (int)v;
        max_label = (int)v > max_label ? (int)v : max_label;
    }
    if (ferror(f)) cli_fail(1, "cannot read %s: %s", path, strerror(errno));
    fclose(f);
    free(line), free(fields);
    if (d->rows < 2)
        cli_fail(1, "%s: need at least 2 data rows, found %ld%s", path, d->rows, had_header ? " below the header" : "");
    d->classes = max_label + 1;
}

/* features -> [linear + relu] per hidden width -> linear to the classes:
 * "logits" [batch, classes]; with_loss adds input "labels" and output "loss". */
static alloy_tensor *build_mlp(alloy_graph *g, const options *o, const dataset *d, int batch, bool with_loss)
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
static double test_accuracy(alloy_graph *eval, int eval_batch, const dataset *d, const long *rows, long nrows,
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
    dataset d;
    if (o.csv) {
        read_csv(o.csv, &d);
        printf("data %s: %ld rows, %d features, %d classes\n", o.csv, d.rows, d.features, d.classes);
    } else {
        synthetic(&d, o.seed);
        printf("no --csv given: synthetic data, %ld rows, %d features, %d classes (concentric shells)\n",
               d.rows, d.features, d.classes);
    }

    /* Shuffled split; standardize every row with the training rows' statistics. */
    unsigned long long rng = o.seed;
    long *order = checked_malloc(sizeof(long) * (size_t)d.rows);
    for (long i = 0; i < d.rows; i++) order[i] = i;
    shuffle(order, d.rows, &rng);
    long ntest = (long)llround(o.test_fraction * (double)d.rows);
    ntest = ntest < 1 ? 1 : ntest > d.rows - 1 ? d.rows - 1 : ntest;
    long ntrain = d.rows - ntest, *train_rows = order + ntest, *test_rows = order;
    for (int f = 0; f < d.features; f++) {
        double sum = 0, sq = 0;
        for (long i = 0; i < ntrain; i++) sum += d.x[train_rows[i] * d.features + f];
        double mean = sum / (double)ntrain;
        for (long i = 0; i < ntrain; i++) sq += pow(d.x[train_rows[i] * d.features + f] - mean, 2);
        double sd = sqrt(sq / (double)ntrain);
        if (!(sd > 1e-12)) sd = 1; /* a constant feature stays 0 */
        for (long r = 0; r < d.rows; r++) d.x[r * d.features + f] = (float)((d.x[r * d.features + f] - mean) / sd);
    }
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

    float *x = checked_malloc(sizeof(float) * (size_t)(B > eval_batch ? B : eval_batch) * (size_t)d.features);
    int *labels = checked_malloc(sizeof(int) * (size_t)B);
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 2, {B, d.features}, x}, {"labels", ALLOY_I32, 1, {B}, labels}};
    double accuracy = 0;
    for (int epoch = 1; epoch <= o.epochs; epoch++) {
        shuffle(train_rows, ntrain, &rng);
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
