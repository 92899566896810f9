/* ref_random.c - the random ops' kernels: uniform and normal drawn in f64, dropout's mask and scale, with base/random.h's bits (the ones every backend draws). */
#include "base/random.h"
#include "kernels/ref.h"

/* n's seed (0 when absent) and stream. */
static void key(const ir_node *n, unsigned long long *seed, unsigned long long *stream)
{
    *seed = (unsigned long long)ir_attr_int(n, "seed", 0);
    *stream = (unsigned long long)ir_attr_i(n, "stream");
}

/* The contracts of the non-static functions are in ref.h. */
void ref_draw(const ir_node *n, unsigned long long step, int64_t first, int64_t len, double *out)
{
    unsigned long long seed, stream;
    key(n, &seed, &stream);
    bool normal = n->op == IR_OP_normal, wide = n->type.dtype == ALLOY_F64;
    double a = ir_attr_f(n, normal ? "mean" : "low"), b = ir_attr_f(n, normal ? "std" : "high");
    for (int64_t j = 0; j < len; j++) {
        unsigned long long i = (unsigned long long)(first + j);
        out[j] = normal ? alloy_normal_draw(seed, stream, step, i, a, b)
                        : alloy_uniform_draw(seed, stream, step, i, wide, a, b);
    }
}

void ref_dropout(const ir_node *n, unsigned long long step, bool wide, int64_t first, int64_t len, void *v)
{
    unsigned long long seed, stream;
    key(n, &seed, &stream);
    double p = ir_attr_f(n, "p"), threshold = ALLOY_DROPOUT_THRESHOLD(p), scale = ALLOY_DROPOUT_SCALE(p);
    for (int64_t j = 0; j < len; j++) {
        bool keep = alloy_dropout_keep(seed, stream, step, (unsigned long long)(first + j), threshold);
        if (wide) ((double *)v)[j] *= keep ? scale : 0.0;
        else ((float *)v)[j] *= keep ? (float)scale : 0.0f;
    }
}
