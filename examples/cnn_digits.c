/* cnn_digits.c - example: a small CNN (conv2d, batch_norm, relu, max_pool2d, dropout, linear) trained with f16 AMP, the dynamic loss scaler and AdamW on the 8x8 handwritten digits, evaluated by a forward-only graph that shares its state. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloy/alloy.h"
#include "cli.h"

#ifdef ALLOY_EXAMPLES_ZLIB
#include <zlib.h>
#endif

/* Where Debian's python3-sklearn puts the UCI digits (1797 rows: 64 pixel
 * values 0..16 of an 8x8 image, then the label 0..9). */
#define DIGITS_PATH "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"

static const char usage[] =
    "usage: cnn_digits [options]\n"
    "Trains a small CNN on 8x8 images of handwritten digits:\n"
    "  conv 3x3 (16) - batch_norm - relu - max_pool 2\n"
    "  conv 3x3 (32) - batch_norm - relu - max_pool 2 - dropout - linear (10)\n"
    "The data is a CSV of 64 pixel values (row by row) and a label 0..9 per line,\n"
    "gzip-compressed (in a build with zlib) or not; by default the digits of\n"
    "Debian's python3-sklearn:\n"
    "  " DIGITS_PATH "\n"
    "and when that file is absent (or the build has no zlib), a synthetic set\n"
    "(said so in the output).\n"
    "  --data FILE          the CSV (.csv or .csv.gz; default the file above)\n"
    "  --synthetic          use the synthetic set: 1800 glyphs of the 10 digits drawn\n"
    "                       with random shifts, stroke strength and noise\n"
    "  --epochs N           passes over the training split (default 15)\n"
    "  --batch N            rows per step (default 64); each epoch's last partial batch\n"
    "                       is dropped (the order is reshuffled every epoch)\n"
    "  --lr X               AdamW learning rate (default 3e-3)\n"
    "  --dropout P          dropout before the linear layer (default 0.25)\n"
    "  --amp f16|bf16|off   mixed precision (default f16, with a dynamic loss scaler)\n"
    "  --seed S             seed of the split, the shuffles, the init and dropout (default 1)\n"
    "  --test-fraction F    share of rows held out for testing (default 0.2)\n"
    "  --device D           auto|cpu|cuda (default auto)\n"
    "  --help               this text\n"
    "The split is mlp_csv's for the same seed and fraction, so the two examples'\n"
    "accuracies compare. Pixels are standardized with the training split's mean and\n"
    "std (one pair for all pixels). Prints `epoch E loss X test_accuracy A scale S\n"
    "skipped K` per epoch (X: mean training loss of the epoch), and last\n"
    "`test_accuracy A`.\n";

enum { SIDE = 8, PIXELS = SIDE * SIDE, CLASSES = 10, C1 = 16, C2 = 32, EVAL_BATCH = 512, MAX_LINE = 4096 };

typedef struct options {
    const char *data, *device;
    bool synthetic;
    int epochs, batch;
    double lr, dropout, test_fraction;
    alloy_dtype amp; /* ALLOY_F32 = off */
    unsigned long long seed;
} options;

/* Images and labels. */
typedef struct dataset {
    float *x; /* [rows, 64] */
    int *y;   /* [rows], 0..9 */
    long rows;
} dataset;

/* Fills o from argv; exits with status 2 and a one-line reason on a bad flag. */
static void parse_args(int argc, char **argv, options *o)
{
    *o = (options){NULL, "auto", false, 15, 64, 3e-3, 0.25, 0.2, ALLOY_F16, 1};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--help")) { fputs(usage, stdout); exit(0); }
        if (!strcmp(flag, "--synthetic")) { o->synthetic = true; continue; }
        if (strncmp(flag, "--", 2)) cli_fail(2, "unexpected argument '%s' (see --help)", flag);
        if (!val) cli_fail(2, "%s needs a value (see --help)", flag);
        i++;
        if (!strcmp(flag, "--data")) o->data = val;
        else if (!strcmp(flag, "--device")) o->device = val;
        else if (!strcmp(flag, "--epochs")) o->epochs = cli_count(flag, val, 0, 1000000);
        else if (!strcmp(flag, "--batch")) o->batch = cli_count(flag, val, 2, 1 << 20);
        else if (!strcmp(flag, "--seed")) o->seed = (unsigned long long)cli_count(flag, val, 0, 2147483647);
        else if (!strcmp(flag, "--lr")) o->lr = cli_number(flag, val, 1e-9, 10);
        else if (!strcmp(flag, "--dropout")) o->dropout = cli_number(flag, val, 0, 0.99);
        else if (!strcmp(flag, "--test-fraction")) o->test_fraction = cli_number(flag, val, 0.001, 0.999);
        else if (!strcmp(flag, "--amp")) {
            if (!strcmp(val, "f16")) o->amp = ALLOY_F16;
            else if (!strcmp(val, "bf16")) o->amp = ALLOY_BF16;
            else if (!strcmp(val, "off")) o->amp = ALLOY_F32;
            else cli_fail(2, "--amp wants f16, bf16 or off, got '%s'", val);
        } else {
            cli_fail(2, "unknown option %s (see --help)", flag);
        }
    }
    if (o->synthetic && o->data) cli_fail(2, "--synthetic and --data exclude each other");
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

/* ---- the synthetic set ---- */

/* The digits as 5x7 glyphs, one row of 5 bits per byte (high bit left). */
static const unsigned char glyphs[CLASSES][7] = {
    {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}, {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E},
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}, {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E},
    {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}, {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E},
    {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}, {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08},
    {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}, {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C},
};

/* 1800 images, 180 per digit: the glyph at a random offset in the 8x8
 * frame, each stroke pixel 16 times a random strength, blurred into its
 * neighbours, plus noise (std 6), clamped to [0, 16] as the real set's values. */
static void synthetic(dataset *d, unsigned long long seed)
{
    unsigned long long rng = seed ^ 0xD161757ull;
    d->rows = 1800;
    d->x = cli_malloc(sizeof(float) * (size_t)d->rows * PIXELS);
    d->y = cli_malloc(sizeof(int) * (size_t)d->rows);
    for (long r = 0; r < d->rows; r++) {
        int digit = (int)(r % CLASSES), dx = (int)(cli_next_random(&rng) % 4), dy = (int)(cli_next_random(&rng) % 2);
        double strength = 0.6 + 0.4 * uniform01(&rng), img[SIDE][SIDE] = {{0}};
        for (int i = 0; i < 7; i++)
            for (int j = 0; j < 5; j++)
                if (glyphs[digit][i] >> (4 - j) & 1) {
                    for (int di = -1; di <= 1; di++)
                        for (int dj = -1; dj <= 1; dj++) {
                            int yy = i + dy + di, xx = j + dx + dj;
                            if (yy >= 0 && yy < SIDE && xx >= 0 && xx < SIDE)
                                img[yy][xx] += 16 * strength * (di || dj ? 0.15 : 1.0);
                        }
                }
        for (int p = 0; p < PIXELS; p++) {
            double v = img[p / SIDE][p % SIDE] + 6 * gaussian(&rng);
            d->x[r * PIXELS + p] = (float)(v < 0 ? 0 : v > 16 ? 16 : v);
        }
        d->y[r] = digit;
    }
}

/* ---- the CSV, read through zlib when the build has it (a plain file reads the same) ---- */

#ifdef ALLOY_EXAMPLES_ZLIB
typedef gzFile source;
static source source_open(const char *path) { return gzopen(path, "rb"); }
static char *source_line(source s, char *buf, int size) { return gzgets(s, buf, size); }
/* The read error of s, or NULL at a clean end of the file. */
static const char *source_error(source s)
{
    int code;
    const char *msg = gzerror(s, &code);
    if (code == Z_OK) return NULL;
    if (code == Z_ERRNO) return strerror(errno);
    const char *colon = strstr(msg, ": "); /* zlib's "<path>: <reason>": the caller names the path */
    return colon ? colon + 2 : msg;
}
static void source_close(source s) { gzclose(s); }
#else
typedef FILE *source;
static source source_open(const char *path) { return fopen(path, "rb"); }
static char *source_line(source s, char *buf, int size) { return fgets(buf, size, s); }
static const char *source_error(source s) { return ferror(s) ? strerror(errno) : NULL; }
static void source_close(source s) { fclose(s); }
#endif


/* Reads 64 pixel values and a label 0..9 per line; a first line that is
 * not all numbers is a header. Exits with "file:line: reason" on a row of
 * another length, a non-number, a label out of range, a line too long, or
 * a file that ends inside its compressed data. */
static void read_digits(const char *path, dataset *d)
{
    errno = 0;
    source f = source_open(path);
    if (!f) cli_fail(1, "cannot open %s: %s", path, errno ? strerror(errno) : "out of memory");
    char line[MAX_LINE], *fields[PIXELS + 1];
    long lineno = 0, cap = 0;
    bool first = true;
    d->rows = 0, d->x = NULL, d->y = NULL;
    while (source_line(f, line, sizeof line)) {
        lineno++;
        size_t len = strlen(line);
        if (lineno == 1 && len >= 2 && (unsigned char)line[0] == 0x1f && (unsigned char)line[1] == 0x8b)
            cli_fail(1, "%s is gzip-compressed and this build has no zlib: gunzip it and pass the .csv", path);
        if (len == sizeof line - 1 && line[len - 1] != '\n')
            cli_fail(1, "%s:%ld: line longer than %d characters", path, lineno, MAX_LINE - 2);
        const char *err = len && line[len - 1] == '\n' ? NULL : source_error(f); /* a last line cut short */
        if (err) cli_fail(1, "cannot read %s at line %ld: %s", path, lineno, err);
        if (strspn(line, " \t\r\n") == len) continue; /* blank */
        line[strcspn(line, "\n")] = '\0';
        int n = cli_split_fields(line, fields, PIXELS + 1);
        double v;
        if (first && (first = false, !cli_is_number(fields[0], &v))) continue; /* a header */
        if (n != PIXELS + 1)
            cli_fail(1, "%s:%ld: expected %d fields (64 pixels and a label), found %s%d", path, lineno, PIXELS + 1,
                     n > PIXELS + 1 ? "more than " : "", n > PIXELS + 1 ? PIXELS + 1 : n);
        if (d->rows == cap) {
            cap = cap ? 2 * cap : 2048;
            d->x = realloc(d->x, sizeof(float) * (size_t)cap * PIXELS);
            d->y = realloc(d->y, sizeof(int) * (size_t)cap);
            if (!d->x || !d->y) cli_fail(1, "out of memory reading %s", path);
        }
        for (int i = 0; i < PIXELS; i++) {
            if (!cli_is_number(fields[i], &v))
                cli_fail(1, "%s:%ld: pixel %d ('%s') is not a finite number", path, lineno, i + 1, fields[i]);
            d->x[d->rows * PIXELS + i] = (float)v;
        }
        if (!cli_is_number(fields[PIXELS], &v) || v != floor(v) || v < 0 || v >= CLASSES)
            cli_fail(1, "%s:%ld: the label ('%s') is not an integer in [0, %d]", path, lineno, fields[PIXELS],
                     CLASSES - 1);
        d->y[d->rows++] = (int)v;
    }
    const char *err = source_error(f);
    if (err) cli_fail(1, "cannot read %s after line %ld: %s", path, lineno, err);
    source_close(f);
    if (d->rows < 2) cli_fail(1, "%s: need at least 2 rows of digits, found %ld", path, d->rows);
}

/* ---- the model ---- */

/* A conv weight [out, in, 3, 3] initialized as torch.nn.Conv2d's: uniform
 * in +-1/sqrt(fan_in), fan_in = in * 9 (the same bound as
 * alloy_init_kaiming_uniform(sqrt(1/3.)), which takes a conv weight's fans
 * from its kernel; written out here as PyTorch states it). */
static alloy_tensor *conv3x3(alloy_graph *g, alloy_tensor *x, const char *name, int in, int out)
{
    double bound = 1 / sqrt(in * 9.0);
    alloy_tensor *w = alloy_param(g, name, ALLOY_F32, 4, (int64_t[]){out, in, 3, 3}, alloy_init_uniform(-bound, bound));
    return alloy_conv2d(g, x, w, NULL, NULL, (int64_t[]){1, 1}, NULL, 1); /* no bias: batch_norm follows */
}

/* x [batch, 1, 8, 8] -> two conv blocks -> dropout -> linear: "logits"
 * [batch, 10]; with_loss adds input "labels" and output "loss". The same
 * names in the training and the evaluation graph let them share state. */
static alloy_tensor *build_cnn(alloy_graph *g, const options *o, int batch, bool with_loss)
{
    const int64_t pool[2] = {2, 2};
    alloy_tensor *h = alloy_input(g, "x", ALLOY_F32, 4, (int64_t[]){batch, 1, SIDE, SIDE});
    h = alloy_batch_norm(g, conv3x3(g, h, "conv1.weight", 1, C1), "bn1", 0.1, 1e-5, true);
    h = alloy_max_pool2d(g, alloy_relu(g, h), pool, NULL, NULL);                            /* [B, 16, 4, 4] */
    h = alloy_batch_norm(g, conv3x3(g, h, "conv2.weight", C1, C2), "bn2", 0.1, 1e-5, true);
    h = alloy_max_pool2d(g, alloy_relu(g, h), pool, NULL, NULL);                            /* [B, 32, 2, 2] */
    h = alloy_reshape(g, h, 2, (int64_t[]){batch, C2 * 4});
    if (o->dropout > 0) h = alloy_dropout(g, h, o->dropout); /* the identity in the evaluation graph */
    h = alloy_set_name(g, alloy_linear(g, h, "fc", C2 * 4, CLASSES, true), "logits");
    if (!with_loss) {
        alloy_output(g, "logits", h);
        return h;
    }
    alloy_tensor *labels = alloy_input(g, "labels", ALLOY_I32, 1, (int64_t[]){batch});
    alloy_tensor *loss = alloy_set_name(g, alloy_cross_entropy(g, h, labels), "loss");
    alloy_output(g, "loss", loss);
    return loss;
}

/* Share of test rows whose largest logit is the label, from the f32
 * evaluation graph (batch eval_batch; the last chunk is padded with row 0
 * and the padding not counted). */
static double test_accuracy(alloy_graph *eval, int eval_batch, const dataset *d, const long *rows, long nrows,
                            float *x)
{
    long correct = 0;
    for (long first = 0; first < nrows; first += eval_batch) {
        for (long i = 0; i < eval_batch; i++)
            memcpy(x + i * PIXELS, d->x + rows[first + i < nrows ? first + i : 0] * PIXELS, sizeof(float) * PIXELS);
        alloy_host_tensor feed = {"x", ALLOY_F32, 4, {eval_batch, 1, SIDE, SIDE}, x};
        alloy_host_tensor logits = {.name = "logits"};
        if (alloy_graph_run(eval, &feed, 1, &logits, 1)) cli_fail(1, "testing: %s", alloy_last_error(eval));
        for (long i = 0; i < eval_batch && first + i < nrows; i++) {
            const float *row = (const float *)logits.data + i * CLASSES;
            int best = 0;
            for (int c = 1; c < CLASSES; c++) best = row[c] > row[best] ? c : best;
            correct += best == d->y[rows[first + i]];
        }
    }
    return (double)correct / (double)nrows;
}

int main(int argc, char **argv)
{
    cli_set_program("cnn_digits");
    options o;
    parse_args(argc, argv, &o);
    dataset d;
    const char *missing = NULL; /* why the default file is not read */
    if (!o.data && !o.synthetic) {
        FILE *probe = fopen(DIGITS_PATH, "rb");
        if (!probe) missing = "not found (Debian: apt-get install python3-sklearn)";
        else fclose(probe);
#ifndef ALLOY_EXAMPLES_ZLIB
        if (probe)
            missing = "is gzip-compressed and this build has no zlib (install zlib1g-dev and rebuild, or gunzip it "
                      "and pass --data FILE.csv)";
#endif
    }
    if (!o.synthetic && !missing) {
        const char *path = o.data ? o.data : DIGITS_PATH;
        read_digits(path, &d);
        printf("data %s: %ld images of 8x8 pixels, 10 classes\n", path, d.rows);
    } else {
        synthetic(&d, o.seed);
        if (o.synthetic) printf("--synthetic: ");
        else printf("%s %s; using ", DIGITS_PATH, missing);
        printf("SYNTHETIC digits, %ld images of 8x8 pixels, 10 classes\n", d.rows);
    }

    /* mlp_csv's split for the same seed; one mean and std for all pixels. */
    unsigned long long rng = o.seed;
    long *order = cli_malloc(sizeof(long) * (size_t)d.rows);
    for (long i = 0; i < d.rows; i++) order[i] = i;
    shuffle(order, d.rows, &rng);
    long ntest = (long)llround(o.test_fraction * (double)d.rows);
    ntest = ntest < 1 ? 1 : ntest > d.rows - 1 ? d.rows - 1 : ntest;
    long ntrain = d.rows - ntest, *train_rows = order + ntest, *test_rows = order;
    double sum = 0, sq = 0;
    for (long i = 0; i < ntrain; i++)
        for (int p = 0; p < PIXELS; p++) sum += d.x[train_rows[i] * PIXELS + p];
    double mean = sum / ((double)ntrain * PIXELS);
    for (long i = 0; i < ntrain; i++)
        for (int p = 0; p < PIXELS; p++) sq += pow(d.x[train_rows[i] * PIXELS + p] - mean, 2);
    double sd = sqrt(sq / ((double)ntrain * PIXELS));
    if (!(sd > 1e-12)) sd = 1;
    for (long i = 0; i < d.rows * PIXELS; i++) d.x[i] = (float)((d.x[i] - mean) / sd);
    if (o.batch > ntrain) {
        printf("--batch %d is more than the %ld training rows: using %ld\n", o.batch, ntrain, ntrain);
        o.batch = (int)ntrain;
    }
    int B = o.batch, eval_batch = ntest < EVAL_BATCH ? (int)ntest : EVAL_BATCH;
    long steps_per_epoch = ntrain / B;
    printf("split: %ld training, %ld test rows (seed %llu)\n", ntrain, ntest, o.seed);

    alloy_graph *train = alloy_graph_new("cnn_digits"), *eval = alloy_graph_new("cnn_digits_eval");
    if (!train || !eval) cli_fail(1, "out of memory");
    alloy_graph_set_seed(train, o.seed);
    alloy_graph_set_loss(train, build_cnn(train, &o, B, true));
    if (o.amp != ALLOY_F32) alloy_graph_enable_amp(train, o.amp);
    if (o.amp == ALLOY_F16) alloy_graph_set_grad_scaler(train, alloy_dynamic_scaler());
    alloy_graph_add_optimizer(train, alloy_adamw(o.lr, 0.9, 0.999, 1e-8, 0.01));
    /* no weight decay on batch_norm's scale and shift nor on the bias (PyTorch recipes' habit) */
    alloy_graph_set_param_group(train, "bn*, fc.bias", 1.0, false);
    build_cnn(eval, &o, eval_batch, false);
    if (alloy_graph_status(train)) cli_fail(1, "building the model: %s", alloy_last_error(train));
    if (alloy_graph_status(eval)) cli_fail(1, "building the model: %s", alloy_last_error(eval));
    if (alloy_graph_set_option(train, "device", o.device) || alloy_graph_set_option(eval, "device", o.device))
        cli_fail(2, "--device %s: %s", o.device, alloy_last_error(train));
    const char *device = alloy_graph_device(train);
    if (!device) cli_fail(1, "%s", alloy_last_error(train));
    printf("device: %s\n", device);
    /* The evaluation graph (no loss: dropout off, batch_norm on the running
     * statistics) reads the parameters and the running statistics each
     * training step writes: no copy. */
    int shared = 0, unshared = 0;
    if (alloy_graph_share_state(eval, train, &shared, &unshared)) cli_fail(1, "%s", alloy_last_error(eval));
    if (unshared) cli_fail(1, "the evaluation graph has %d tensors the training graph lacks", unshared);

    float *x = cli_malloc(sizeof(float) * (size_t)(B > eval_batch ? B : eval_batch) * PIXELS);
    int *labels = cli_malloc(sizeof(int) * (size_t)B);
    alloy_host_tensor feeds[2] = {{"x", ALLOY_F32, 4, {B, 1, SIDE, SIDE}, x}, {"labels", ALLOY_I32, 1, {B}, labels}};
    double accuracy = 0;
    for (int epoch = 1; epoch <= o.epochs; epoch++) {
        shuffle(train_rows, ntrain, &rng);
        double loss_sum = 0;
        alloy_step_info info = {.scale = 1};
        for (long s = 0; s < steps_per_epoch; s++) {
            for (long i = 0; i < B; i++) {
                long r = train_rows[s * B + i];
                memcpy(x + i * PIXELS, d.x + r * PIXELS, sizeof(float) * PIXELS);
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
