/* gemm_runs.c - a pointer-array GEMM of the launch plan as runs of strided-batch calls, for a cuBLASLt whose heuristic has no algorithm for pointer arrays. */
#include "step/launch_plan.h"

/* Whether the offsets po[first .. first + len) (one operand's matrices, in bytes) step by exactly `stride`. */
static bool evenly_spaced(const int64_t *po, int64_t first, int64_t len, int64_t stride)
{
    for (int64_t i = 1; i < len; i++)
        if (po[first + i] - po[first + i - 1] != stride) return false;
    return true;
}

/* Whether every run of len matrices of gm is evenly spaced in A, B and D with the first run's strides;
 * those strides in elements into *each. */
static bool runs_of(const lp_plan *lp, const lp_gemm *gm, int64_t len, lp_gemm *each)
{
    const int64_t *po = &lp->ptr_offsets[gm->ptrs];
    int64_t strides[3];
    for (int w = 0; w < 3; w++) {
        const int64_t *ofs = po + w * gm->batch;
        int64_t size = (int64_t)alloy_dtype_size(w == 2 ? gm->d : gm->ab);
        strides[w] = len > 1 ? ofs[1] - ofs[0] : 0;
        if (strides[w] < 0 || strides[w] % size) return false;
        for (int64_t r = 0; r < gm->batch; r += len)
            if (!evenly_spaced(ofs, r, len, strides[w])) return false;
        strides[w] /= size;
    }
    *each = *gm;
    each->pointers = false;
    each->ptrs = 0;
    each->ptr_at = (lp_place){0};
    each->batch = len;
    each->stride_a = strides[0], each->stride_b = strides[1], each->stride_d = strides[2];
    return true;
}

int64_t lp_gemm_runs(const lp_plan *lp, const lp_gemm *gm, lp_gemm *each)
{
    for (int64_t len = gm->batch; len > 1; len--)
        if (gm->batch % len == 0 && runs_of(lp, gm, len, each)) return len;
    runs_of(lp, gm, 1, each); /* one matrix a call: always evenly spaced */
    return 1;
}

void lp_gemm_run_offsets(const lp_plan *lp, const lp_gemm *gm, int64_t len, int64_t run, int64_t offsets[3])
{
    const int64_t *po = &lp->ptr_offsets[gm->ptrs];
    for (int w = 0; w < 3; w++) offsets[w] = po[w * gm->batch + run * len];
}
