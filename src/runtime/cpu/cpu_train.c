/* cpu_train.c - CPU kernels of the training-step ops: found_inf over all gradients, the gradient norm's sum of squares (block by block, no copy of the squares). */
#include <math.h>

#include "base/convert.h"
#include "base/vmath.h"
#include "runtime/cpu/cpu.h"
#include "runtime/cpu/cpu_rows.h"

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

/* Terms squared at a time: a subtree of reduce_sum's pairwise tree (which
 * splits a sum of more at n / 2, as ref_reduce.c's), so the squares never
 * need a buffer of the operand's size. */
enum { SQUARES_BLOCK = 4096 };

/* y[0..n) = x[0..n) squared, each rounded to f32 (square's value). */
static CPU_VECTOR_CLONES void square_f32(const float *x, float *restrict y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i];
}

/* reduce_sum's pairwise sum of the squares of p[0..n): subtrees of at most
 * SQUARES_BLOCK terms squared into sq, their leaves summed (in order from
 * 0, several side by side: cpu_leaf_sums_float) and the leaf sums added as
 * the tree adds them; the halves above that added likewise. */
static float square_sum_tree(const float *p, int64_t n, float *sq, int64_t *leaf, float *leaf_sums)
{
    if (n > SQUARES_BLOCK) {
        float a = square_sum_tree(p, n / 2, sq, leaf, leaf_sums);
        return a + square_sum_tree(p + n / 2, n - n / 2, sq, leaf, leaf_sums);
    }
    square_f32(p, sq, n);
    int nleaves = cpu_leaf_plan(n, leaf, 0), k = 0;
    cpu_leaf_sums_float(sq, leaf, nleaves, leaf_sums);
    return combine_f32(leaf_sums, n, &k);
}

float cpu_square_sum_in_f32(cpu_exec *x, const ir_node *n, const rt_tensor *t, alloy_status *st)
{
    int64_t count = ir_numel(&t->type);
    *st = ALLOY_OK;
    if (count == 0) return 0;
    /* the blocks' squares, leaves and leaf sums (a leaf of a sum of more
     * than LEAF terms has at least LEAF / 2) */
    size_t leaves = SQUARES_BLOCK / (LEAF / 2) + 1;
    char *scratch = al_malloc(sizeof(float) * SQUARES_BLOCK + leaves * (sizeof(int64_t) + sizeof(float)));
    if (!scratch) {
        *st = cpu_out_of_memory(x, n);
        return 0;
    }
    float *sq = (float *)(void *)scratch;
    int64_t *leaf = (int64_t *)(void *)(scratch + sizeof(float) * SQUARES_BLOCK);
    float *leaf_sums = (float *)(void *)(leaf + leaves);
    float sum = square_sum_tree(t->data, count, sq, leaf, leaf_sums);
    al_free(scratch);
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
        float sum = cpu_square_sum_in_f32(x, n, &in[i], &st);
        if (st) return st;
        total = i ? total + (double)sum : (double)sum;
    }
    *(double *)out->data = total;
    return ALLOY_OK;
}
