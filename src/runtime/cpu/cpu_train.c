/* cpu_train.c - CPU kernels of the training-step ops: found_inf over all gradients. */
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
