/* alloyc_params.c - alloyc's parameters files: --params (run and train, strict as PyTorch's load_state_dict(strict=True)) and train's --save-params. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "alloyc.h"

#define TRACKED ".num_batches_tracked"

/* Whether name is part of g's model: a param or state the model built
 * (batch_norm's running statistics), not state the passes add. */
static bool is_model(alloy_graph *g, const char *name)
{
    alloy_host_tensor t;
    return alloy_graph_find(g, name) && alloy_graph_get_state(g, name, &t) == ALLOY_OK;
}

/* Whether name is PyTorch's "<bn>.num_batches_tracked" of a batch_norm of g. */
static bool is_batch_count(alloy_graph *g, const char *name)
{
    size_t len = strlen(name), suffix = strlen(TRACKED);
    if (len <= suffix || len - suffix > 200 || strcmp(name + len - suffix, TRACKED) != 0) return false;
    char mean[256];
    snprintf(mean, sizeof mean, "%.*s.running_mean", (int)(len - suffix), name);
    return is_model(g, mean);
}

/* Appends 'name' to a list of at most three names in buf ("..." past them). */
static void list_name(char *buf, size_t len, int count, const char *name)
{
    size_t at = strlen(buf);
    if (count < 3) snprintf(buf + at, len - at, "%s'%s'", count ? ", " : "", name);
    else if (count == 3) snprintf(buf + at, len - at, ", ...");
}

int alloyc_load_params(alloy_graph *g, const char *path, const char *ir_path, int *loaded)
{
    char err[512];
    alloy_safetensors *file = NULL;
    alloy_status st = alloy_safetensors_load(path, &file, err, sizeof err);
    if (st) return alloyc_fail(EXIT_ERROR, "--params %s", err);
    char unknown[512] = "", missing[512] = "";
    int nunknown = 0, nmissing = 0;
    for (int i = 0; i < alloy_safetensors_count(file); i++) {
        const char *name = alloy_safetensors_get(file, i)->name;
        if (!is_model(g, name) && !is_batch_count(g, name)) list_name(unknown, sizeof unknown, nunknown++, name);
    }
    for (int i = 0; i < alloy_graph_state_count(g); i++) {
        alloy_host_tensor s;
        if (alloy_graph_state_at(g, i, &s) || !alloy_graph_find(g, s.name)) continue;
        if (!alloy_safetensors_find(file, s.name)) list_name(missing, sizeof missing, nmissing++, s.name);
    }
    alloy_safetensors_free(file);
    if (nunknown)
        return alloyc_fail(EXIT_ERROR,
                           "--params %s: %d tensor%s in it name%s no parameter or running statistic of %s: %s (a "
                           "params file holds exactly the model's tensors, as a PyTorch state_dict)",
                           path, nunknown, nunknown == 1 ? "" : "s", nunknown == 1 ? "s" : "", ir_path, unknown);
    if (nmissing)
        return alloyc_fail(EXIT_ERROR, "--params %s: it has no tensor for %d of the parameters and running statistics "
                                       "of %s: %s",
                           path, nmissing, ir_path, missing);
    int n = 0, ignored = 0;
    if ((st = alloy_graph_load_params(g, path, &n, &ignored)))
        return alloyc_fail(EXIT_ERROR, "--params %s: %s", path, alloyc_graph_error(g, st));
    if (loaded) *loaded = n;
    return 0;
}

int alloyc_save_params(alloy_graph *g, const char *path)
{
    alloy_status st = alloy_graph_save_params(g, path);
    if (st) return alloyc_fail(EXIT_ERROR, "--save-params %s: %s", path, alloyc_graph_error(g, st));
    return 0;
}
