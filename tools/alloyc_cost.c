/* alloyc_cost.c - alloyc cost: the modelled cost of an IR file's compiled GPU step, launch by launch, with no GPU. */
#include <stdio.h>

#include "alloyc.h"

int alloyc_cost(const options *o)
{
    alloy_graph *g = alloyc_load_graph(o->ir_path);
    if (!g) return EXIT_ERROR;
    if (o->loss && alloyc_set_loss(g, o)) {
        alloy_graph_free(g);
        return EXIT_ERROR;
    }
    alloy_status st = alloyc_configure(g, o);
    alloy_cost_options co = {.device = o->cost_device, .arch = o->arch, .calibrate = o->calibrate,
                             .top = (int)o->top, .all = o->all};
    if (!st) st = alloy_graph_cost(g, &co, NULL, stdout);
    int rc = st ? alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(g, st)) : 0;
    alloy_graph_free(g);
    if (!rc && (fflush(stdout) || ferror(stdout))) rc = alloyc_fail(EXIT_ERROR, "writing to stdout failed");
    return rc;
}
