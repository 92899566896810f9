/* amp_ranges.c - the stats file range-aware colouring reads (the amp_ranges option): each forward value's observed max |x|, by node name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "passes/pass.h"

/* A stats file is a few lines per value; far past any graph's. */
#define STATS_MAX_BYTES (256u << 20)

static int by_name(const void *a, const void *b)
{
    return strcmp(((const amp_range *)a)->name, ((const amp_range *)b)->name);
}

/* Parses one value line into e; NULL, or what is wrong with it. */
static const char *parse_line(char *line, amp_range *e, bool *forward)
{
    char label[256], op[64], dtype[16], part[8];
    double max, underflow;
    long long elements;
    int nan, used = 0;
    if (sscanf(line, "%255s %63s %15s %7s max=%lf underflow=%lf elements=%lld nan=%d %n", label, op, dtype, part,
               &max, &underflow, &elements, &nan, &used) != 8 || line[used] != '\0')
        return "not 'NODE OP DTYPE fwd|bwd max=X underflow=F elements=N nan=0|1'";
    if (label[0] != '%' || !label[1]) return "the node is not %NAME";
    if (strcmp(part, "fwd") != 0 && strcmp(part, "bwd") != 0) return "the part is not fwd or bwd";
    if (!(max >= 0)) return "max is not a number >= 0";
    if (!(underflow >= 0 && underflow <= 1)) return "underflow is not a fraction from 0 to 1";
    if (elements < 0 || (nan != 0 && nan != 1)) return "elements or nan is out of range";
    *forward = part[0] == 'f';
    e->max = max;
    size_t n = strlen(label);
    e->name = al_malloc(n);
    if (!e->name) return "out of memory";
    memcpy(e->name, label + 1, n); /* without the '%', with the NUL */
    return NULL;
}

alloy_status amp_ranges_load(ir_graph *g, const char *path, amp_ranges *out)
{
    memset(out, 0, sizeof *out);
    uint8_t *bytes = NULL;
    size_t len = 0;
    char err[512];
    alloy_status st = al_file_read(path, STATS_MAX_BYTES, &bytes, &len, err, sizeof err);
    if (st) return ir_error(g, st, "amp: amp_ranges: %s", err);
    char *text = (char *)bytes;
    if (strlen(text) != len) {
        al_free(bytes);
        return ir_error(g, ALLOY_ERR_FORMAT, "amp: amp_ranges %s: a NUL byte in the file (not a stats file)", path);
    }
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    out->entries = al_calloc((size_t)lines + 2, sizeof *out->entries);
    if (!out->entries) {
        al_free(bytes);
        return ir_error(g, ALLOY_ERR_OOM, "amp: amp_ranges %s: out of memory", path);
    }
    int lineno = 0;
    for (char *line = text, *next; line && !st; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        lineno++;
        if (lineno == 1) {
            if (strncmp(line, "alloy-amp-stats 1", 17) != 0 || (line[17] != ' ' && line[17] != '\0'))
                st = ir_error(g, ALLOY_ERR_FORMAT,
                              "amp: amp_ranges %s:1: not a stats file (it starts 'alloy-amp-stats 1'; "
                              "alloy_graph_save_amp_stats or alloyc train --amp-stats write one)", path);
            continue;
        }
        if (!line[0] || line[0] == '#') continue;
        bool forward = false;
        amp_range e = {0};
        const char *why = parse_line(line, &e, &forward);
        if (why) st = ir_error(g, ALLOY_ERR_FORMAT, "amp: amp_ranges %s:%d: %s", path, lineno, why);
        else if (forward) out->entries[out->n++] = e;
        else al_free(e.name);
    }
    al_free(bytes);
    if (lineno == 0 && !st)
        st = ir_error(g, ALLOY_ERR_FORMAT, "amp: amp_ranges %s: the file is empty (not a stats file)", path);
    if (st) {
        amp_ranges_free(out);
        return st;
    }
    qsort(out->entries, (size_t)out->n, sizeof *out->entries, by_name);
    /* a name twice (a file edited by hand): the largest max stands for it */
    int w = 0;
    for (int i = 0; i < out->n; i++) {
        if (w && strcmp(out->entries[w - 1].name, out->entries[i].name) == 0) {
            if (out->entries[i].max > out->entries[w - 1].max) out->entries[w - 1].max = out->entries[i].max;
            al_free(out->entries[i].name);
            continue;
        }
        out->entries[w++] = out->entries[i];
    }
    out->n = w;
    return ALLOY_OK;
}

const amp_range *amp_ranges_find(const amp_ranges *r, const char *name)
{
    if (!name || !r->n) return NULL;
    amp_range key = {.name = (char *)name};
    return bsearch(&key, r->entries, (size_t)r->n, sizeof key, by_name);
}

void amp_ranges_free(amp_ranges *r)
{
    for (int i = 0; i < r->n; i++) al_free(r->entries[i].name);
    al_free(r->entries);
    memset(r, 0, sizeof *r);
}
