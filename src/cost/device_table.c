/* device_table.c - the cost model's device constants, one table per GPU, each constant with where it comes from. */
#include <strings.h>

#include "cost/cost.h"

#define TB 1e12
#define GB 1e9
#define US 1e-6

/* NVIDIA H100 SXM5 80GB. */
static const cost_device h100 = {
    .name = "h100",
    .title = "H100 SXM 80GB (HBM3)",
    /* 3.35 TB/s: NVIDIA's H100 datasheet (SXM5) */
    .hbm = 3.35 * TB,
    /* 0.90: a plain device copy measured 3.0 TB/s on an H100 80GB HBM3 (2026-11-24, issue 25);
     * 0.70: assumed for generated kernels (partial vectors, tails, several streams of operands) */
    .eff_lo = 0.70, .eff_hi = 0.90,
    /* 132 SMs (datasheet, H100 SXM5): a kernel of fewer blocks than SMs is given its share of the bandwidth */
    .sms = 132,
    /* 989 TF/s dense f16/bf16 peak (datasheet); PyTorch's cuBLAS GEMMs ran at ~780 TF/s on that H100
     * (issue 25); the model takes 550-750 for alloy's mix of GEMM shapes */
    .tensor_lo = 550 * TB, .tensor_hi = 750 * TB,
    /* an odd leading dimension (50257) rules out cuBLASLt's 16-byte aligned kernels: 300-500 TF/s, an
     * assumption of the outside review of the launch plan (issue 25), to be calibrated */
    .odd_lo = 300 * TB, .odd_hi = 500 * TB,
    /* 67 TF/s FP32 (datasheet, non-tensor); alloy's f32 GEMMs use no TF32: 40-55 assumed */
    .f32_lo = 40 * TB, .f32_hi = 55 * TB,
    /* mma.sync m16n8k16 without ldmatrix or cp.async (docs/codegen.md): 150-300 TF/s assumed, about a third
     * of what FlashAttention-2 reaches on the H100 forward */
    .attn_lo = 150 * TB, .attn_hi = 300 * TB,
    /* 2.5-4 us: the shortest kernel in a replayed graph, launch ramp and tail (issue 25's review) */
    .floor_lo = 2.5 * US, .floor_hi = 4 * US,
    /* 0.8-1.5 us per node of a replayed CUDA graph (issue 25's review) */
    .node_lo = 0.8 * US, .node_hi = 1.5 * US,
    /* NVLink 4: 900 GB/s per GPU, both directions together (datasheet, H100 SXM5): 450 GB/s each way */
    .link = 450 * GB,
    /* 0.60-0.80 of it as a ring's bus bandwidth: assumed, not measured (nccl-tests' busbw would calibrate it) */
    .link_eff_lo = 0.60, .link_eff_hi = 0.80,
    /* between machines: one 400 Gb/s NDR InfiniBand adapter per GPU (DGX H100's ConnectX-7): 50 GB/s each way */
    .ib = 50 * GB,
    /* 10-25 us for a collective of a few bytes (a flag, the loss): assumed for a ring of up to 8 GPUs */
    .coll_lo = 10 * US, .coll_hi = 25 * US,
};

/* NVIDIA H200 SXM 141GB: H100's compute, faster memory. */
static const cost_device h200 = {
    .name = "h200",
    .title = "H200 SXM 141GB (HBM3e)",
    /* 4.8 TB/s: NVIDIA's H200 datasheet; efficiency assumed as measured on the H100 */
    .hbm = 4.8 * TB,
    .eff_lo = 0.70, .eff_hi = 0.90,
    .sms = 132,
    /* the same tensor cores and clocks as the H100 SXM (datasheet: 989 TF/s dense f16/bf16) */
    .tensor_lo = 550 * TB, .tensor_hi = 750 * TB,
    .odd_lo = 300 * TB, .odd_hi = 500 * TB,
    .f32_lo = 40 * TB, .f32_hi = 55 * TB,
    .attn_lo = 150 * TB, .attn_hi = 300 * TB,
    .floor_lo = 2.5 * US, .floor_hi = 4 * US,
    .node_lo = 0.8 * US, .node_hi = 1.5 * US,
    /* NVLink 4, 900 GB/s per GPU both ways (datasheet, H200 SXM); the rest as the H100's */
    .link = 450 * GB,
    .link_eff_lo = 0.60, .link_eff_hi = 0.80,
    .ib = 50 * GB,
    .coll_lo = 10 * US, .coll_hi = 25 * US,
};

static const cost_device *const tables[] = {&h100, &h200};

const cost_device *cost_device_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof tables / sizeof *tables; i++)
        if (strcasecmp(name, tables[i]->name) == 0) return tables[i];
    return NULL;
}

const char *cost_device_names(void) { return "h100, h200"; }

void cost_device_print_links(FILE *out, const cost_device *d)
{
    fprintf(out, "#   link         %8.0f GB/s a direction (NVLink, one machine), %.2f - %.2f of it a ring's\n",
            d->link / GB, d->link_eff_lo, d->link_eff_hi);
    fprintf(out, "#   network      %8.0f GB/s a direction (InfiniBand between machines; not in the model)\n", d->ib / GB);
    fprintf(out, "#   collective   %8.2f - %.2f us latency (a collective of few bytes)\n", d->coll_lo / US, d->coll_hi / US);
}

void cost_device_print(FILE *out, const cost_device *d)
{
    fprintf(out, "# device %s: %s\n", d->name, d->title);
    fprintf(out, "#   hbm          %8.2f TB/s peak\n", d->hbm / TB);
    fprintf(out, "#   efficiency   %8.2f - %.2f of peak (kernels, memsets, copies)\n", d->eff_lo, d->eff_hi);
    fprintf(out, "#   SMs          %8d (a kernel of fewer blocks gets blocks / SMs of the bandwidth)\n", d->sms);
    fprintf(out, "#   tensor       %8.0f - %.0f TF/s (f16/bf16 GEMMs)\n", d->tensor_lo / TB, d->tensor_hi / TB);
    fprintf(out, "#   tensor odd   %8.0f - %.0f TF/s (a leading dimension not a multiple of 16 bytes)\n",
            d->odd_lo / TB, d->odd_hi / TB);
    fprintf(out, "#   f32          %8.0f - %.0f TF/s (f32 GEMMs without TF32, SIMT FLOPs)\n", d->f32_lo / TB,
            d->f32_hi / TB);
    fprintf(out, "#   attention    %8.0f - %.0f TF/s (mma.sync attention kernels)\n", d->attn_lo / TB,
            d->attn_hi / TB);
    fprintf(out, "#   floor        %8.2f - %.2f us (shortest kernel or GEMM)\n", d->floor_lo / US, d->floor_hi / US);
    fprintf(out, "#   graph node   %8.2f - %.2f us (each node of a replayed CUDA graph)\n", d->node_lo / US,
            d->node_hi / US);
}
