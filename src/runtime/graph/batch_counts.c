/* batch_counts.c - the num_batches_tracked of a graph's batch_norms: PyTorch's counter, kept so params files round-trip with a state_dict. */
#include <string.h>

#include "runtime/graph/graph_impl.h"

#define TRACKED_SUFFIX ".num_batches_tracked"
#define MEAN_SUFFIX ".running_mean"

/* The module name of batch_norm node n ("bn" of "bn.running_mean"): its
 * running mean's name without the suffix; 0 (no name) when the running
 * mean is not a state leaf named "<module>.running_mean". */
static size_t module_of(const ir_graph *ir, const ir_node *n, const char **name)
{
    if (n->op != IR_OP_batch_norm || n->nin < 2) return 0;
    const ir_node *mean = ir->nodes[n->in[1]];
    size_t len = mean->name ? strlen(mean->name) : 0, suffix = strlen(MEAN_SUFFIX);
    if (mean->op != IR_OP_state || len <= suffix || strcmp(mean->name + len - suffix, MEAN_SUFFIX) != 0) return 0;
    *name = mean->name;
    return len - suffix;
}

int graph_batch_counts(const alloy_graph *g, char (*names)[BATCH_COUNT_NAME], int max)
{
    int count = 0;
    for (int i = 0; i < g->ir->nnodes; i++) {
        const char *module;
        size_t len = module_of(g->ir, g->ir->nodes[i], &module);
        if (!len || len + sizeof TRACKED_SUFFIX > BATCH_COUNT_NAME) continue;
        if (count < max) al_fmt(names[count], BATCH_COUNT_NAME, "%.*s%s", (int)len, module, TRACKED_SUFFIX);
        count++;
    }
    return count;
}

bool graph_is_batch_count(const alloy_graph *g, const char *name)
{
    size_t len = strlen(name), suffix = strlen(TRACKED_SUFFIX);
    if (len <= suffix || strcmp(name + len - suffix, TRACKED_SUFFIX) != 0) return false;
    for (int i = 0; i < g->ir->nnodes; i++) {
        const char *module;
        size_t mlen = module_of(g->ir, g->ir->nodes[i], &module);
        if (mlen == len - suffix && strncmp(module, name, mlen) == 0) return true;
    }
    return false;
}

int64_t *graph_batch_count(alloy_graph *g, const char *name, bool make)
{
    for (int i = 0; i < g->nbatch_counts; i++)
        if (strcmp(g->batch_counts[i].name, name) == 0) return &g->batch_counts[i].value;
    if (!make) return NULL;
    batch_count *grown = al_realloc(g->batch_counts, sizeof *grown * (size_t)(g->nbatch_counts + 1));
    if (!grown) return NULL;
    g->batch_counts = grown;
    batch_count *c = &grown[g->nbatch_counts];
    if (!(c->name = al_strdup(name))) return NULL;
    c->value = 0;
    g->nbatch_counts++;
    return &c->value;
}

void graph_batch_counts_free(alloy_graph *g)
{
    for (int i = 0; i < g->nbatch_counts; i++) al_free(g->batch_counts[i].name);
    al_free(g->batch_counts);
    g->batch_counts = NULL;
    g->nbatch_counts = 0;
}
