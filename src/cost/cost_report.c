/* cost_report.c - printing the cost model: totals, a summary per class, the slowest launches, every launch. */
#include <stdlib.h>
#include <string.h>

#include "cost/cost.h"

static void put_launch(FILE *out, int i, const cost_launch *l)
{
    char geom[32] = "-", regs[16] = "-", spill[24] = "-", smem[16] = "-";
    if (l->action == COST_KERNEL) al_fmt(geom, sizeof geom, "%u x %u", l->grid, l->block);
    if (l->action == COST_GEMM) /* A/B/D, "+" when the plan padded a row stride (sched_pad) */
        al_fmt(geom, sizeof geom, "ld %lld/%lld/%lld%s", (long long)l->lda, (long long)l->ldb, (long long)l->ldd,
               l->padded ? "+" : "");
    if (l->action == COST_COLLECTIVE) al_fmt(geom, sizeof geom, "%d ranks", l->world); /* read, written: sent, received */
    if (l->res.known) {
        al_fmt(regs, sizeof regs, "%d", l->res.registers);
        al_fmt(spill, sizeof spill, "%d/%d", l->res.spill_stores, l->res.spill_loads);
        al_fmt(smem, sizeof smem, "%d", l->res.shared);
    }
    fprintf(out, "%6d %5d %-17s %15s %10.3f %10.3f %9.3f %10.3f %4s %9s %6s %9.1f - %-9.1f %s\n", i, l->step,
            cost_class_name(l->cls), geom, (double)(l->read + l->link) / 1e6, (double)(l->written + l->link) / 1e6,
            (double)l->spill / 1e6,
            l->flops / 1e9, regs, spill, smem, l->t_lo * 1e6, l->t_hi * 1e6, l->name);
}

static void put_header(FILE *out)
{
    fprintf(out, "%6s %5s %-17s %15s %10s %10s %9s %10s %4s %9s %6s %21s %s\n", "launch", "step", "class",
            "grid x block", "read MB", "written MB", "spill MB", "GFLOP", "regs", "spill B", "smem", "modelled us",
            "name");
}

/* A launch's place in the ranking: by modelled high time, largest first, ties in launch order. */
typedef struct ranked {
    double t;
    int i;
} ranked;

static int by_time(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? 1 : -1;
    return x->i - y->i;
}

alloy_status cost_print(FILE *out, const char *graph, const char *arch, const cost_model *m, const cost_device *d, int top,
                bool all)
{
    int64_t read = 0, written = 0, spill = 0;
    int tiny = 0;
    for (int i = 0; i < m->n; i++) {
        read += m->launches[i].read, written += m->launches[i].written, spill += m->launches[i].spill;
        tiny += m->launches[i].action == COST_KERNEL && m->launches[i].grid <= COST_TINY_BLOCKS;
    }
    fprintf(out, "cost model of graph '%s' (modelled, not measured): %s constants, ", graph, d->title);
    if (arch) fprintf(out, "ptxas resources for %s (%d of %d kernels)\n", arch, m->resources_known, m->kernels);
    else fprintf(out, "no ptxas resources (no --arch)\n");
    cost_device_print(out, d);
    if (m->collectives) cost_device_print_links(out, d);
    fprintf(out, "launches       %d: %d kernels (%d of <= %d blocks), %d GEMMs, %d memsets, %d copies", m->n,
            m->kernels, tiny, COST_TINY_BLOCKS, m->gemms, m->memsets, m->copies);
    if (m->collectives) fprintf(out, ", %d collectives", m->collectives);
    fputc('\n', out);
    fprintf(out, "bytes          %lld (%.3f GB): read %lld, written %lld, spills %lld", (long long)m->total.bytes,
            (double)m->total.bytes / 1e9, (long long)read, (long long)written, (long long)spill);
    if (m->collectives) fprintf(out, ", sent by each rank %lld", (long long)(m->total.bytes - read - written - spill));
    fputc('\n', out);
    fprintf(out, "kernels' bytes %lld (%.3f GB; the emitter's own count, as in summary.txt and the profile: %.3f GB)\n",
            (long long)m->kernel_bytes, (double)m->kernel_bytes / 1e9, (double)m->emitted_bytes / 1e9);
    fprintf(out, "flops          %.0f (%.3f TFLOP)\n", m->total.flops, m->total.flops / 1e12);
    if (arch) fprintf(out, "spill kernels  %d\n", m->spill_kernels);
    fprintf(out, "modelled       %.3f - %.3f ms per step\n\n", m->total.t_lo * 1e3, m->total.t_hi * 1e3);

    fprintf(out, "%-18s %8s %12s %10s %21s %6s\n", "class", "launches", "bytes GB", "TFLOP", "modelled ms", "share");
    for (int c = 0; c < COST_NCLASSES; c++) {
        const cost_sum *s = &m->by_class[c];
        if (!s->launches) continue;
        fprintf(out, "%-18s %8d %12.3f %10.3f %9.3f - %-9.3f %5.1f%%\n", cost_class_name((cost_class)c), s->launches,
                (double)s->bytes / 1e9, s->flops / 1e12, s->t_lo * 1e3, s->t_hi * 1e3,
                m->total.t_hi > 0 ? 100 * s->t_hi / m->total.t_hi : 0.0);
    }
    ranked *order = al_calloc((size_t)m->n + 1, sizeof *order);
    if (!order) return ALLOY_ERR_OOM;
    for (int i = 0; i < m->n; i++) order[i] = (ranked){m->launches[i].t_hi, i};
    qsort(order, (size_t)m->n, sizeof *order, by_time);
    if (top > m->n) top = m->n;
    if (top > 0) {
        fprintf(out, "\ntop %d launches by modelled time\n", top);
        put_header(out);
        for (int i = 0; i < top; i++) put_launch(out, order[i].i, &m->launches[order[i].i]);
    }
    al_free(order);
    if (all) {
        fprintf(out, "\nevery launch\n");
        put_header(out);
        for (int i = 0; i < m->n; i++) put_launch(out, i, &m->launches[i]);
    }
    return ALLOY_OK;
}
