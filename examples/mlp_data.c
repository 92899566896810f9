/* mlp_data.c - the MLP examples' data: the synthetic concentric shells or a CSV file, split and standardized. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "cli.h"
#include "mlp_data.h"

enum { MAX_CLASSES = 1000 };

void *mlp_malloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (!p) cli_fail(1, "out of memory");
    return p;
}

static double uniform01(unsigned long long *state) { return ((double)(cli_next_random(state) >> 11) + 0.5) * 0x1p-53; }

static double gaussian(unsigned long long *state)
{
    return sqrt(-2 * log(uniform01(state))) * cos(6.283185307179586 * uniform01(state));
}

void mlp_shuffle(long *order, long n, unsigned long long *rng)
{
    for (long i = n - 1; i > 0; i--) {
        long j = (long)(cli_next_random(rng) % (unsigned long long)(i + 1)), t = order[i];
        order[i] = order[j], order[j] = t;
    }
}

void mlp_synthetic(mlp_dataset *d, unsigned long long seed)
{
    unsigned long long rng = seed ^ 0x5EEDull;
    d->rows = 2000, d->features = 8, d->classes = 3;
    d->x = mlp_malloc(sizeof(float) * (size_t)d->rows * 8);
    d->y = mlp_malloc(sizeof(int) * (size_t)d->rows);
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


void mlp_read_csv(const char *path, mlp_dataset *d)
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
            fields = mlp_malloc(sizeof(char *) * (size_t)max_fields);
        }
        int n = cli_split_fields(line, fields, ncols ? ncols : max_fields);
        if (!ncols) {
            if (n < 2) cli_fail(1, "%s:%ld: need at least one feature and a label, found %d column", path, lineno, n);
            ncols = n, d->features = n - 1;
            double v;
            bool header = false;
            for (int i = 0; i < n; i++) header |= *fields[i] && !cli_is_number(fields[i], &v);
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
            if (!cli_is_number(fields[i], &v))
                cli_fail(1, "%s:%ld: field %d ('%s') is not a finite number", path, lineno, i + 1, fields[i]);
            d->x[d->rows * d->features + i] = (float)v;
        }
        if (!cli_is_number(fields[d->features], &v) || v != floor(v))
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

long mlp_split(mlp_dataset *d, double test_fraction, unsigned long long *rng, long **order_out, long *ntest_out)
{
    long *order = mlp_malloc(sizeof(long) * (size_t)d->rows);
    for (long i = 0; i < d->rows; i++) order[i] = i;
    mlp_shuffle(order, d->rows, rng);
    long ntest = (long)llround(test_fraction * (double)d->rows);
    ntest = ntest < 1 ? 1 : ntest > d->rows - 1 ? d->rows - 1 : ntest;
    long ntrain = d->rows - ntest, *train_rows = order + ntest;
    for (int f = 0; f < d->features; f++) {
        double sum = 0, sq = 0;
        for (long i = 0; i < ntrain; i++) sum += d->x[train_rows[i] * d->features + f];
        double mean = sum / (double)ntrain;
        for (long i = 0; i < ntrain; i++) sq += pow(d->x[train_rows[i] * d->features + f] - mean, 2);
        double sd = sqrt(sq / (double)ntrain);
        if (!(sd > 1e-12)) sd = 1; /* a constant feature stays 0 */
        for (long r = 0; r < d->rows; r++) d->x[r * d->features + f] = (float)((d->x[r * d->features + f] - mean) / sd);
    }
    *order_out = order;
    *ntest_out = ntest;
    return ntrain;
}
