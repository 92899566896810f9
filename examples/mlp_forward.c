/* mlp_forward.c - example: build a two-layer MLP with the builder API, run its forward pass on the CPU, print the result and the IR. */
#include <math.h>
#include <stdio.h>

#include "alloy/alloy.h"

enum { BATCH = 32, IN = 16, HIDDEN = 64, OUT = 10 };

/* Builds y = relu(x @ w1 + b1) @ w2 + b2, feeds a fixed x, runs it once and
 * prints y's shape, first row and mean, then the graph as IR text. */
int main(void)
{
    alloy_graph *g = alloy_graph_new("mlp");
    if (!g) {
        fprintf(stderr, "mlp_forward: out of memory\n");
        return 1;
    }
    alloy_graph_set_seed(g, 1);

    /* Builder calls record the first error on g and return NULL from then
     * on, so the graph is built without a check per call. */
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, (int64_t[]){BATCH, IN});
    alloy_tensor *w1 = alloy_param(g, "fc1.weight", ALLOY_F32, 2, (int64_t[]){IN, HIDDEN},
                                   alloy_init_kaiming_uniform(sqrt(2.0)));
    alloy_tensor *b1 = alloy_param(g, "fc1.bias", ALLOY_F32, 1, (int64_t[]){HIDDEN},
                                   alloy_init_zeros());
    alloy_tensor *w2 = alloy_param(g, "fc2.weight", ALLOY_F32, 2, (int64_t[]){HIDDEN, OUT},
                                   alloy_init_kaiming_uniform(1.0));
    alloy_tensor *b2 = alloy_param(g, "fc2.bias", ALLOY_F32, 1, (int64_t[]){OUT},
                                   alloy_init_zeros());
    alloy_tensor *h = alloy_relu(g, alloy_add(g, alloy_matmul(g, x, w1, false, false), b1));
    alloy_tensor *y = alloy_add(g, alloy_matmul(g, h, w2, false, false), b2);
    alloy_output(g, "y", y);

    /* A fixed, smooth input in [-1, 1]. */
    static float xdata[BATCH][IN];
    for (int i = 0; i < BATCH; i++)
        for (int j = 0; j < IN; j++) xdata[i][j] = (float)sin(0.37 * i + 0.11 * j * j);

    alloy_host_tensor feed = {"x", ALLOY_F32, 2, {BATCH, IN}, xdata};
    alloy_host_tensor fetch = {.name = "y"};
    if (alloy_graph_run(g, &feed, 1, &fetch, 1)) { /* the first builder error shows up here */
        fprintf(stderr, "mlp_forward: %s\n", alloy_last_error(g));
        alloy_graph_free(g);
        return 1;
    }

    const float *out = fetch.data; /* owned by g until the next run */
    int64_t n = alloy_host_tensor_numel(&fetch);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += out[i];
    printf("y: %s[%lld,%lld]\n", alloy_dtype_name(fetch.dtype), (long long)fetch.dims[0],
           (long long)fetch.dims[1]);
    printf("y[0]:");
    for (int64_t j = 0; j < fetch.dims[1]; j++) printf(" %.5f", out[j]);
    printf("\nmean(y): %.6f\n\n", sum / (double)n);

    alloy_graph_dump(g, stdout, ALLOY_DUMP_SOURCE);
    alloy_graph_free(g);
    return 0;
}
