/* param_group.h - a parameter group as the graph records it and the optimizer pass reads it. */
#ifndef ALLOY_PARAM_GROUP_H
#define ALLOY_PARAM_GROUP_H

#include <stdbool.h>

/* A parameter group (alloy_graph_set_param_group): the params whose names
 * match one of patterns' comma-separated globs train with lr * lr_scale,
 * and with weight decay only when decay. */
typedef struct param_group {
    char *patterns;
    double lr_scale;
    bool decay;
} param_group;

#endif
