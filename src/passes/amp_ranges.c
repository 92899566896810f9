/* amp_ranges.c - the stats file range-aware colouring reads (the amp_ranges option): each forward value's observed max |x|, by node name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "passes/pass.h"
#include "step/amp_stats_file.h"

static int by_name(const void *a, const void *b)
{
    return strcmp(((const amp_range *)a)->name, ((const amp_range *)b)->name);
}

alloy_status amp_ranges_load(ir_graph *g, const char *path, amp_ranges *out)
{
    memset(out, 0, sizeof *out);
    uint8_t *bytes = NULL;
    size_t len = 0;
    char err[512];
    alloy_status st = al_file_read(path, AMP_STATS_MAX_BYTES, &bytes, &len, err, sizeof err);
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
            if (!amp_stats_header(line, NULL))
                st = ir_error(g, ALLOY_ERR_FORMAT,
                              "amp: amp_ranges %s:1: not a stats file (it starts 'alloy-amp-stats 1'; "
                              "alloy_graph_save_amp_stats or alloyc train --amp-stats write one)", path);
            continue;
        }
        if (!line[0] || line[0] == '#') continue;
        amp_stats_line v;
        const char *why = amp_stats_parse_line(line, &v);
        if (why) {
            st = ir_error(g, ALLOY_ERR_FORMAT, "amp: amp_ranges %s:%d: %s", path, lineno, why);
        } else if (v.forward) {
            size_t n = strlen(v.node) + 1;
            amp_range e = {.name = al_malloc(n), .max = v.max};
            if (!e.name) st = ir_error(g, ALLOY_ERR_OOM, "amp: amp_ranges %s: out of memory", path);
            else memcpy(e.name, v.node, n), out->entries[out->n++] = e;
        }
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
