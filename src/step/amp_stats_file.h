/* amp_stats_file.h - the text file of range statistics (docs/amp.md, "The stats file"): its header and value lines, read by range-aware colouring and by alloy_graph_load_amp_stats. */
#ifndef ALLOY_AMP_STATS_FILE_H
#define ALLOY_AMP_STATS_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* A stats file is a few lines per value; far past any graph's. */
#define AMP_STATS_MAX_BYTES (256u << 20)

/* One value line: "%NODE OP DTYPE fwd|bwd max=X underflow=F elements=N nan=0|1". */
typedef struct amp_stats_line {
    char node[256];  /* the node as the compiled IR prints it, without the '%' */
    char op[64];
    char dtype[16];
    bool forward;
    double max;       /* >= 0, inf allowed */
    double underflow; /* a fraction from 0 to 1 */
    long long elements;
    bool nan;
} amp_stats_line;

/* Whether line is the file's first line ("alloy-amp-stats 1 ..."); *runs
 * (may be NULL) gets its runs=N, 0 when absent. */
AL_HIDDEN bool amp_stats_header(const char *line, long long *runs);
/* Parses one value line into *out; NULL, or what is wrong with it. */
AL_HIDDEN const char *amp_stats_parse_line(const char *line, amp_stats_line *out);

#endif
