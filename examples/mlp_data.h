/* mlp_data.h - the MLP examples' data (mlp_csv, aot_train): the synthetic concentric shells or a CSV file, split and standardized. */
#ifndef ALLOY_EXAMPLES_MLP_DATA_H
#define ALLOY_EXAMPLES_MLP_DATA_H

#include <stddef.h>

/* Rows of features and labels. */
typedef struct mlp_dataset {
    float *x; /* [rows, features] */
    int *y;   /* [rows], 0 .. classes-1 */
    long rows;
    int features, classes;
} mlp_dataset;

/* malloc that exits with "out of memory" (cli_fail) on failure. */
void *mlp_malloc(size_t size);
/* 3 classes of points in 8-D at radius 1, 2 or 3 (plus noise) in random
 * directions, 2000 rows, labels 0 1 2 in turn: no linear model separates
 * them, an MLP does. The same rows for the same seed. */
void mlp_synthetic(mlp_dataset *d, unsigned long long seed);
/* Reads a CSV of numeric features and an integer label last; a first line
 * that is not all numbers is a header. Exits with "file:line: reason" on a
 * ragged row, a non-number, or a label that is not an integer in range. */
void mlp_read_csv(const char *path, mlp_dataset *d);
/* Shuffles order[0..n) with rng (Fisher-Yates). */
void mlp_shuffle(long *order, long n, unsigned long long *rng);
/* Shuffles the rows into a test split (test_fraction of them, at least one
 * and at most all but one) and a training split, and standardizes every
 * feature of every row with the training rows' mean and standard deviation.
 * *order (free it): the shuffled row indices, the *ntest test rows first;
 * returns the number of training rows (the rest of *order). */
long mlp_split(mlp_dataset *d, double test_fraction, unsigned long long *rng, long **order, long *ntest);

#endif
