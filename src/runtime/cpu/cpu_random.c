/* cpu_random.c - the random ops: dropout, uniform and normal, through kernels/ref_random.c (base/random.h's bits, the ones every backend draws). */
#include "base/convert.h"
#include "kernels/ref.h"
#include "runtime/cpu/cpu.h"

/* Elements per chunk: drawn, or loaded and scaled, then stored this many at a time. */
enum { CHUNK = 4096 };

/* dropout (x [, step]): ref_dropout in f32 for f32/f16/bf16 (rounded once
 * on store), f64 for f64. uniform, normal ([step]): ref_draw's f64 values
 * rounded once to the result's dtype. A missing step is 0. */
alloy_status cpu_random(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    int at = n->op == IR_OP_dropout ? 1 : 0;
    unsigned long long step = n->nin > at ? (unsigned long long)cpu_index_at(&in[at], 0) : 0;
    alloy_dtype dt = out->type.dtype;
    int64_t count = ir_numel(&out->type);
    size_t es = alloy_dtype_size(dt);
    bool dropout = n->op == IR_OP_dropout, wide = !dropout || dt == ALLOY_F64;
    void *buf = cpu_alloc_compute(wide, CHUNK);
    if (!buf) return cpu_out_of_memory(x, n);
    for (int64_t start = 0; start < count; start += CHUNK) {
        int64_t len = count - start < CHUNK ? count - start : CHUNK;
        if (dropout) {
            cpu_load_compute(wide, dt, (const char *)in[0].data + (size_t)start * es, buf, len);
            ref_dropout(n, step, wide, start, len, buf);
        } else {
            ref_draw(n, step, start, len, buf);
        }
        cpu_store_compute(wide, dt, buf, (char *)out->data + (size_t)start * es, len);
    }
    al_free(buf);
    return ALLOY_OK;
}
