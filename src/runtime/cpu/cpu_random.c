/* cpu_random.c - the random ops: dropout, uniform and normal, drawn with base/random.h (the bits every backend draws). */
#include "base/convert.h"
#include "base/random.h"
#include "runtime/cpu/cpu.h"

/* Elements per chunk: dropout loads, scales and stores this many at a time. */
enum { CHUNK = 4096 };

/* dropout (x [, step]): x * scale where element i is kept, x * 0 where it
 * is dropped (so a NaN or inf stays non-finite, as PyTorch's x * mask); f32
 * arithmetic for f32/f16/bf16 (rounded once on store), f64 for f64.
 * uniform, normal ([step]): each element drawn in f64 and rounded once to
 * the result's dtype. A missing step is 0, a missing seed 0. */
alloy_status cpu_random(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    int at = n->op == IR_OP_dropout ? 1 : 0;
    unsigned long long step = n->nin > at ? (unsigned long long)cpu_index_at(&in[at], 0) : 0;
    unsigned long long seed = (unsigned long long)ir_attr_int(n, "seed", 0);
    unsigned long long stream = (unsigned long long)ir_attr_i(n, "stream");
    alloy_dtype dt = out->type.dtype;
    int64_t count = ir_numel(&out->type);
    size_t es = alloy_dtype_size(dt);
    if (n->op != IR_OP_dropout) {
        bool normal = n->op == IR_OP_normal;
        double a = ir_attr_f(n, normal ? "mean" : "low"), b = ir_attr_f(n, normal ? "std" : "high");
        for (int64_t i = 0; i < count; i++) {
            double v = normal ? alloy_normal_draw(seed, stream, step, (unsigned long long)i, a, b)
                              : alloy_uniform_draw(seed, stream, step, (unsigned long long)i, dt == ALLOY_F64, a, b);
            cvt_store_f64(dt, &v, (char *)out->data + (size_t)i * es, 1);
        }
        return ALLOY_OK;
    }
    double p = ir_attr_f(n, "p"), threshold = ALLOY_DROPOUT_THRESHOLD(p), scale = ALLOY_DROPOUT_SCALE(p);
    bool wide = dt == ALLOY_F64;
    void *buf = cpu_alloc_compute(wide, CHUNK);
    if (!buf) return cpu_out_of_memory(x, n);
    for (int64_t start = 0; start < count; start += CHUNK) {
        int64_t len = count - start < CHUNK ? count - start : CHUNK;
        cpu_load_compute(wide, dt, (const char *)in[0].data + (size_t)start * es, buf, len);
        for (int64_t j = 0; j < len; j++) {
            bool keep = alloy_dropout_keep(seed, stream, step, (unsigned long long)(start + j), threshold);
            if (wide) ((double *)buf)[j] *= keep ? scale : 0.0;
            else ((float *)buf)[j] *= keep ? (float)scale : 0.0f;
        }
        cpu_store_compute(wide, dt, buf, (char *)out->data + (size_t)start * es, len);
    }
    al_free(buf);
    return ALLOY_OK;
}
