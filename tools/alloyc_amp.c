/* alloyc_amp.c - alloyc amp-report: what AMP made of an IR file, and the range statistics of a stats file beside it. */
#include <stdio.h>

#include "alloyc.h"

/* Loads and configures the IR file as o says, AMP's log on stdout, with
 * the stats file's ranges when ranges; compiles it and prints its AMP
 * summary. NULL after printing the error. */
static alloy_graph *report(const options *o, bool ranges)
{
    alloy_graph *g = alloyc_load_graph(o->ir_path);
    if (!g) return NULL;
    if (o->loss && alloyc_set_loss(g, o)) {
        alloy_graph_free(g);
        return NULL;
    }
    options with_amp = *o;
    if (with_amp.amp == ALLOY_F32) with_amp.amp = ALLOY_F16;
    alloy_status st = alloyc_configure(g, &with_amp);
    /* the AMP log on stdout: the conversions, why nodes stayed f32, each range decision */
    if (!st && !o->print_after) st = alloy_graph_print_after(g, "", stdout);
    if (!st) st = alloy_graph_set_option(g, "amp_log", "1");
    if (!st && ranges) st = alloy_graph_set_option(g, "amp_ranges", o->stats);
    alloy_amp_report r;
    if (!st) st = alloy_graph_amp_report(g, &r);
    if (st) {
        alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(g, st));
        alloy_graph_free(g);
        return NULL;
    }
    printf("amp-report %s: %s, %d of %d float nodes in low precision, %d casts (%d of weights)", o->ir_path,
           alloy_dtype_name(r.dtype), r.low_nodes, r.float_nodes, r.casts, r.weight_casts);
    if (ranges) printf(", %d kept f32 by the ranges in %s", r.range_kept, o->stats);
    printf("\n");
    return g;
}

int alloyc_amp_report(const options *o)
{
    if (o->amp == ALLOY_F32 && o->amp_given) return alloyc_fail(EXIT_USAGE, "amp-report: --amp=off leaves nothing to report");
    /* the step as AMP colours it; the statistics belong to that step */
    alloy_graph *g = report(o, false);
    if (!g) return EXIT_ERROR;
    alloy_status st = ALLOY_OK;
    if (o->stats) {
        printf("\n");
        st = alloy_graph_load_amp_stats(g, o->stats);
        if (!st) st = alloy_graph_amp_stats(g, stdout);
    }
    int rc = st ? alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(g, st)) : 0;
    alloy_graph_free(g);
    if (!rc && o->stats) { /* then what range-aware colouring makes of them */
        printf("\n");
        g = report(o, true);
        if (!g) return EXIT_ERROR;
        alloy_graph_free(g);
    }
    if (!rc && (fflush(stdout) || ferror(stdout))) rc = alloyc_fail(EXIT_ERROR, "writing to stdout failed");
    return rc;
}
