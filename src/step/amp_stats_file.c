/* amp_stats_file.c - reading the range statistics' text file, line by line (docs/amp.md, "The stats file"). */
#include <stdio.h>
#include <string.h>

#include "step/amp_stats_file.h"

bool amp_stats_header(const char *line, long long *runs)
{
    if (runs) *runs = 0;
    if (strncmp(line, "alloy-amp-stats 1", 17) != 0 || (line[17] != ' ' && line[17] != '\0')) return false;
    const char *r = strstr(line, " runs=");
    if (runs && r) sscanf(r + 6, "%lld", runs);
    return true;
}

const char *amp_stats_parse_line(const char *line, amp_stats_line *out)
{
    char label[256], part[8];
    int nan, used = 0;
    memset(out, 0, sizeof *out);
    if (sscanf(line, "%255s %63s %15s %7s max=%lf underflow=%lf elements=%lld nan=%d %n", label, out->op, out->dtype,
               part, &out->max, &out->underflow, &out->elements, &nan, &used) != 8 || line[used] != '\0')
        return "not 'NODE OP DTYPE fwd|bwd max=X underflow=F elements=N nan=0|1'";
    if (label[0] != '%' || !label[1]) return "the node is not %NAME";
    if (strcmp(part, "fwd") != 0 && strcmp(part, "bwd") != 0) return "the part is not fwd or bwd";
    if (!(out->max >= 0)) return "max is not a number >= 0";
    if (!(out->underflow >= 0 && out->underflow <= 1)) return "underflow is not a fraction from 0 to 1";
    if (out->elements < 0 || (nan != 0 && nan != 1)) return "elements or nan is out of range";
    out->forward = part[0] == 'f';
    out->nan = nan == 1;
    memcpy(out->node, label + 1, strlen(label)); /* without the '%', with the NUL */
    return NULL;
}
