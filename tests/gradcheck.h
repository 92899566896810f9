/* gradcheck.h - gradients against central finite differences in f64: the step, the error measure and the bound every gradient test shares (test_autodiff.c's models, test_op_cases.c's ops). */
#ifndef ALLOY_TEST_GRADCHECK_H
#define ALLOY_TEST_GRADCHECK_H

#include <stdint.h>

/* Finite differences: each element x moves by h = GC_STEP * max(1, |x|)
 * both ways and fd = (L(x+h) - L(x-h)) / (2h), all in f64. The truncation
 * error is O(h^2 |L'''|) ~ 1e-12 and the rounding error ~ ulp(L) / h ~
 * 1e-10 |L|, so a correct f64 gradient whose largest element is not far
 * below |L| meets GC_BOUND on
 *     max |grad - fd| / max(max |fd|, 1e-8)
 * over each tensor by two orders or more (measured at most a few 1e-9);
 * a wrong formula misses it by many orders. */
#define GC_STEP 1e-6
#define GC_BOUND 1e-6

/* A tensor whose gradient is checked: its values (moved by the check, put
 * back after) and the gradient to check, both `count` doubles. */
typedef struct gc_tensor {
    const char *name;
    double *v;
    int64_t count;
    const double *grad;
} gc_tensor;

/* The loss at the tensors' current values; `changed` is the index of the
 * tensor whose values moved since the last call (for callers that must
 * push them where the loss reads them). */
typedef double (*gc_loss_fn)(void *ctx, int changed);

/* fd[j][i] = central difference of loss at element i of tensor j, for
 * every element (fd[j] has room for t[j].count). */
void gc_differences(gc_tensor *t, int n, gc_loss_fn loss, void *ctx, double *const *fd);
/* Compares every element of every tensor's grad with finite differences of
 * loss. A tensor whose error exceeds bound, or a non-finite fd or grad, is
 * reported with test_case_failed naming `what` and the element. Returns the
 * worst error (INFINITY after a non-finite value). GRADCHECK_VERBOSE=1
 * prints each tensor's error. */
double gc_check(const char *what, gc_tensor *t, int n, gc_loss_fn loss, void *ctx, double bound);

#endif
