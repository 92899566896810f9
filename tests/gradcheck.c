/* gradcheck.c - gradients against central finite differences in f64 (gradcheck.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gradcheck.h"
#include "support.h"

void gc_differences(gc_tensor *t, int n, gc_loss_fn loss, void *ctx, double *const *fd)
{
    for (int j = 0; j < n; j++) {
        gc_tensor *l = &t[j];
        for (int64_t i = 0; i < l->count; i++) {
            double x0 = l->v[i], h = GC_STEP * fmax(1, fabs(x0)), xp = x0 + h, xm = x0 - h;
            l->v[i] = xp;
            double lp = loss(ctx, j);
            l->v[i] = xm;
            double lm = loss(ctx, j);
            l->v[i] = x0;
            fd[j][i] = (lp - lm) / (xp - xm);
        }
        if (l->count) (void)loss(ctx, j); /* pushes the last element's value back where the loss reads it */
    }
}

double gc_check(const char *what, gc_tensor *t, int n, gc_loss_fn loss, void *ctx, double bound)
{
    double **fd = test_calloc((size_t)n + 1, sizeof *fd), worst = 0;
    for (int j = 0; j < n; j++) fd[j] = test_malloc(sizeof(double) * (size_t)(t[j].count + 1));
    gc_differences(t, n, loss, ctx, fd);
    for (int j = 0; j < n && isfinite(worst); j++) {
        const gc_tensor *l = &t[j];
        int64_t at = -1;
        double maxdiff = 0, maxfd = 0;
        for (int64_t i = 0; i < l->count; i++) {
            double diff = fabs(l->grad[i] - fd[j][i]);
            if (!isfinite(fd[j][i]) || !isfinite(l->grad[i])) {
                test_case_failed("%s: grad:%s element %lld is %g, finite differences %g", what, l->name, (long long)i,
                                 l->grad[i], fd[j][i]);
                worst = INFINITY;
                break;
            }
            maxfd = fmax(maxfd, fabs(fd[j][i]));
            if (diff >= maxdiff) maxdiff = diff, at = i;
        }
        double err = maxdiff / fmax(maxfd, 1e-8);
        if (getenv("GRADCHECK_VERBOSE")) printf("    grad:%-10s max |fd| %.3g, error %.2g\n", l->name, maxfd, err);
        if (isfinite(worst) && err > bound)
            test_case_failed("%s: grad:%s element %lld is %.12g, finite differences give %.12g (error %.2e > %.0e)",
                             what, l->name, (long long)at, l->grad[at], fd[j][at], err, bound);
        worst = fmax(worst, err);
    }
    for (int j = 0; j < n; j++) test_free(fd[j]);
    test_free(fd);
    return worst;
}
