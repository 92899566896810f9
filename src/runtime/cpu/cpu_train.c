/* cpu_train.c - CPU kernels of the training-step ops: found_inf over all gradients, the gradient norm's sum of squares. */
#include <math.h>

#include "base/convert.h"
#include "runtime/cpu/cpu.h"

/* True when any element of any operand is inf or NaN. Reads every element
 * once in its own dtype (no conversion needed to test finiteness of f32 and
 * f64; f16/bf16 test the exponent bits). */
alloy_status cpu_found_inf(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)x;
    bool found = false;
    for (int i = 0; i < n->nin && !found; i++) {
        int64_t count = ir_numel(&in[i].type);
        switch (in[i].type.dtype) {
        case ALLOY_F32: {
            const float *p = in[i].data;
            for (int64_t k = 0; k < count; k++) found |= !isfinite(p[k]);
            break;
        }
        case ALLOY_F64: {
            const double *p = in[i].data;
            for (int64_t k = 0; k < count; k++) found |= !isfinite(p[k]);
            break;
        }
        case ALLOY_F16: {
            const uint16_t *p = in[i].data;
            for (int64_t k = 0; k < count; k++) found |= (p[k] & 0x7c00) == 0x7c00;
            break;
        }
        case ALLOY_BF16: {
            const uint16_t *p = in[i].data;
            for (int64_t k = 0; k < count; k++) found |= (p[k] & 0x7f80) == 0x7f80;
            break;
        }
        default: break;
        }
    }
    *(uint8_t *)out->data = found;
    return ALLOY_OK;
}

float cpu_square_sum_in_f32(cpu_exec *x, const ir_node *n, const rt_tensor *t, bool own, alloy_status *st)
{
    ir_node probe = {.op = IR_OP_reduce_sum, .type = {.dtype = ALLOY_F32}};
    int64_t count = ir_numel(&t->type);
    float *sq = own ? t->data : al_malloc(sizeof(float) * (size_t)(count ? count : 1)), sum = 0;
    if (!sq) {
        *st = cpu_out_of_memory(x, n);
        return 0;
    }
    const float *p = t->data;
    for (int64_t k = 0; k < count; k++) sq[k] = p[k] * p[k];
    rt_tensor squares = {t->type, sq}, result = {probe.type, &sum};
    *st = cpu_reduce(x, &probe, &result, &squares);
    if (!own) al_free(sq);
    return sum;
}

/* The sum of the operands' squares (f32 operands): each operand's squares
 * rounded to f32 and summed by reduce_sum over all its axes (the same
 * routine, so the same order and the same f32 result as square followed by
 * reduce_sum; cpu_square_sum_in_f32), the per-operand sums then added in
 * f64 in operand order. */
alloy_status cpu_sum_squares(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    double total = 0;
    for (int i = 0; i < n->nin; i++) {
        alloy_status st = ALLOY_OK;
        float sum = cpu_square_sum_in_f32(x, n, &in[i], false, &st);
        if (st) return st;
        total = i ? total + (double)sum : (double)sum;
    }
    *(double *)out->data = total;
    return ALLOY_OK;
}
