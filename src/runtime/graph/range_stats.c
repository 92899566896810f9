/* range_stats.c - range statistics (amp_stats): the per-value entries a run adds to, their report, and the stats file range-aware colouring reads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "step/amp_stats_file.h"
#include "runtime/graph/graph_impl.h"

/* The largest finite value of dt (f16 65504, bf16 (2 - 2^-7) 2^127). */
static double format_max(alloy_dtype dt) { return dt == ALLOY_F16 ? 65504.0 : 0x1.fep127; }

/* g->ranges and g->run_ranges made for the compiled graph's node count
 * when they are not (the entries since the compile dropped); ALLOY_ERR_OOM
 * naming what. */
static alloy_status entries_for_compiled(alloy_graph *g, const char *what)
{
    int nn = g->compiled->nnodes;
    if (g->ranges && g->nranges == nn) return ALLOY_OK;
    range_stats_drop(g);
    g->ranges = al_calloc((size_t)nn + 1, sizeof *g->ranges);
    g->run_ranges = al_calloc((size_t)nn + 1, sizeof *g->run_ranges);
    if (!g->ranges || !g->run_ranges) {
        range_stats_drop(g);
        return graph_fail(g, ALLOY_ERR_OOM, "%s: out of memory for the entries of %d values", what, nn);
    }
    g->nranges = nn;
    return ALLOY_OK;
}

alloy_status range_stats_prepare(alloy_graph *g, rt_range **out)
{
    *out = NULL;
    if (!g->cfg.amp_stats) return ALLOY_OK;
    alloy_status st = entries_for_compiled(g, "amp_stats");
    if (st) return st;
    memset(g->run_ranges, 0, sizeof *g->run_ranges * (size_t)g->nranges);
    *out = g->run_ranges;
    return ALLOY_OK;
}

void range_stats_merge(alloy_graph *g)
{
    for (int i = 0; g->ranges && g->run_ranges && i < g->nranges; i++) {
        const rt_range *r = &g->run_ranges[i];
        rt_range *to = &g->ranges[i];
        if (r->max_bits > to->max_bits) to->max_bits = r->max_bits; /* non-negative floats order as their bits */
        to->nan |= r->nan;
        to->tiny += r->tiny;
        to->count += r->count;
    }
}

void range_stats_drop(alloy_graph *g)
{
    al_free(g->ranges), al_free(g->run_ranges);
    g->ranges = NULL, g->run_ranges = NULL;
    g->nranges = 0;
    g->range_runs = 0;
}

/* Whether compiled node i has an entry with elements in it. */
static bool tracked(const alloy_graph *g, int i) { return g->ranges && i < g->nranges && g->ranges[i].count > 0; }

/* Fills out from node id's entry; mark: scratch of nnodes bytes (NULL:
 * backward left false). */
static void stat_of(const alloy_graph *g, int id, uint8_t *mark, alloy_amp_stat *out)
{
    const ir_graph *c = g->compiled;
    const ir_node *n = c->nodes[id];
    const rt_range *r = &g->ranges[id];
    memset(out, 0, sizeof *out);
    if (n->name) al_fmt(out->node, sizeof out->node, "%%%s", n->name);
    else al_fmt(out->node, sizeof out->node, "%%%d", n->id);
    out->op = ir_ops[n->op].name;
    out->dtype = n->type.dtype;
    out->backward = mark && overflow_is_backward(c, id, mark);
    float max;
    memcpy(&max, &r->max_bits, sizeof max);
    out->max_abs = max;
    out->headroom = max > 0 ? log2(format_max(n->type.dtype) / max) : INFINITY;
    out->underflow = (double)r->tiny / (double)r->count;
    out->elements = (int64_t)r->count;
    out->nan = r->nan != 0;
}

int alloy_graph_amp_stats_count(const alloy_graph *g)
{
    int count = 0;
    for (int i = 0; g && g->ranges && i < g->nranges; i++) count += tracked(g, i);
    return count;
}

/* The compiled node id of the i-th tracked value, or -1. */
static int nth_tracked(const alloy_graph *g, int i)
{
    for (int k = 0; g->ranges && k < g->nranges; k++)
        if (tracked(g, k) && i-- == 0) return k;
    return -1;
}

alloy_status alloy_graph_amp_stats_at(const alloy_graph *g, int i, alloy_amp_stat *out)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!out) return graph_fail_const(g, ALLOY_ERR_INVALID, "amp_stats_at: out is NULL");
    int id = i >= 0 ? nth_tracked(g, i) : -1;
    if (id < 0)
        return graph_fail_const(g, ALLOY_ERR_INVALID, "amp_stats_at: index %d is not below the count %d", i,
                                alloy_graph_amp_stats_count(g));
    uint8_t *mark = al_malloc((size_t)g->compiled->nnodes + 1);
    stat_of(g, id, mark, out);
    al_free(mark);
    return ALLOY_OK;
}

/* Every tracked value's statistics (al_malloc'd), *n of them; NULL with *n
 * 0 when there are none or memory ran out (*oom). */
static alloy_amp_stat *all_stats(const alloy_graph *g, int *n, bool *oom)
{
    *n = alloy_graph_amp_stats_count(g);
    *oom = false;
    if (!*n) return NULL;
    alloy_amp_stat *s = al_malloc(sizeof *s * (size_t)*n);
    uint8_t *mark = al_malloc((size_t)g->compiled->nnodes + 1);
    if (!s || !mark) {
        al_free(s), al_free(mark);
        *n = 0, *oom = true;
        return NULL;
    }
    for (int k = 0, i = 0; k < g->nranges; k++)
        if (tracked(g, k)) stat_of(g, k, mark, &s[i++]);
    al_free(mark);
    return s;
}

/* Least headroom first; ties in node order. */
static int by_headroom(const void *a, const void *b)
{
    const alloy_amp_stat *x = *(const alloy_amp_stat *const *)a, *y = *(const alloy_amp_stat *const *)b;
    if (x->headroom != y->headroom) return x->headroom < y->headroom ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void print_row(FILE *out, const alloy_amp_stat *s)
{
    fprintf(out, "  %-16s %-14s %-4s %-3s %11.4g %9.2f %10.4g%s\n", s->node, s->op, alloy_dtype_name(s->dtype),
            s->backward ? "bwd" : "fwd", s->max_abs, s->headroom, s->underflow, s->nan ? "  NaN seen" : "");
}

alloy_status alloy_graph_amp_stats(const alloy_graph *g, FILE *out)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!out) return graph_fail_const(g, ALLOY_ERR_INVALID, "amp_stats: out is NULL");
    int n;
    bool oom;
    alloy_amp_stat *s = all_stats(g, &n, &oom);
    alloy_amp_stat **order = n ? al_malloc(sizeof *order * (size_t)n) : NULL;
    if (oom || (n && !order)) {
        al_free(s);
        return graph_fail_const(g, ALLOY_ERR_OOM, "amp_stats: out of memory");
    }
    fprintf(out, "amp stats of graph '%s': %d f16/bf16 values over %lld runs (max |x| before rounding; headroom: "
                 "log2(format max / max |x|); underflow: nonzero below the smallest normal)\n",
            g->compiled ? g->compiled->name : "?", n, (long long)g->range_runs);
    fprintf(out, "  %-16s %-14s %-4s %-3s %11s %9s %10s\n", "node", "op", "type", "", "max |x|", "headroom",
            "underflow");
    for (int i = 0; i < n; i++) print_row(out, &s[i]), order[i] = &s[i];
    if (n) qsort(order, (size_t)n, sizeof *order, by_headroom);
    fprintf(out, "least headroom (worst %d):\n", n < 10 ? n : 10);
    for (int i = 0; i < n && i < 10; i++) print_row(out, order[i]);
    al_free(order), al_free(s);
    return ferror(out) ? graph_fail_const(g, ALLOY_ERR_IO, "amp_stats: writing the report failed") : ALLOY_OK;
}

alloy_status alloy_graph_save_amp_stats(const alloy_graph *g, const char *path)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!path || !*path) return graph_fail_const(g, ALLOY_ERR_INVALID, "save_amp_stats: path is NULL or empty");
    int n;
    bool oom;
    alloy_amp_stat *s = all_stats(g, &n, &oom);
    /* a line is at most 63 + 2 * 32 + 150 bytes (node, op, dtype, the numbers); the header 160 */
    size_t cap = 256 + (size_t)n * 320, len = 0;
    char *text = oom ? NULL : al_malloc(cap);
    if (!text) {
        al_free(s);
        return graph_fail_const(g, ALLOY_ERR_OOM, "save_amp_stats: out of memory");
    }
    /* docs/amp.md, "The stats file": a header, then a line per value */
    len += (size_t)snprintf(text + len, cap - len, "alloy-amp-stats 1 graph=%.128s runs=%lld\n",
                            g->compiled ? g->compiled->name : "?", (long long)g->range_runs);
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(text + len, cap - len, "%s %.32s %s %s max=%.9g underflow=%.9g elements=%lld nan=%d\n",
                                s[i].node, s[i].op, alloy_dtype_name(s[i].dtype), s[i].backward ? "bwd" : "fwd",
                                s[i].max_abs, s[i].underflow, (long long)s[i].elements, s[i].nan ? 1 : 0);
    al_free(s);
    if (len >= cap) { /* cannot happen with the bounds above; never write a cut file */
        al_free(text);
        return graph_fail_const(g, ALLOY_ERR_INVALID, "save_amp_stats: a line longer than its bound");
    }
    char err[512];
    const void *parts[1] = {text};
    alloy_status st = al_file_write(path, parts, &len, 1, 0, err, sizeof err);
    al_free(text);
    return st ? graph_fail_const(g, st, "save_amp_stats: %s", err) : ALLOY_OK;
}

/* The compiled node the stats file's label (a name, or a number for an
 * unnamed node) names, or -1. */
static int node_of_label(const ir_graph *c, const char *label)
{
    int id = ir_find_name(c, label);
    if (id >= 0) return id;
    char *end;
    long k = strtol(label, &end, 10);
    if (*end || end == label || k < 0 || k >= c->nnodes || c->nodes[k]->name) return -1;
    return (int)k;
}

/* Checks one parsed line against the compiled graph and adds it to its
 * entry; NULL, or what is wrong (into why). */
static const char *load_line(alloy_graph *g, const amp_stats_line *v, char *why, size_t len)
{
    const ir_graph *c = g->compiled;
    int id = node_of_label(c, v->node);
    if (id < 0) return al_fmt(why, len, "%%%s is no value of the compiled graph '%s' (stats of a step compiled "
                             "otherwise: a training step's need training on)", v->node, c->name), why;
    const ir_node *n = c->nodes[id];
    alloy_dtype dt = n->type.dtype;
    if (strcmp(ir_ops[n->op].name, v->op) != 0 || strcmp(alloy_dtype_name(dt), v->dtype) != 0)
        return al_fmt(why, len, "%%%s is %s %s here but %s %s in the file (a stats file of another graph or options?)",
                      v->node, ir_ops[n->op].name, alloy_dtype_name(dt), v->op, v->dtype), why;
    if (dt != ALLOY_F16 && dt != ALLOY_BF16) return al_fmt(why, len, "%%%s is not f16 or bf16", v->node), why;
    rt_range *r = &g->ranges[id];
    float max = (float)v->max;
    uint32_t bits;
    memcpy(&bits, &max, sizeof bits);
    if (bits > r->max_bits) r->max_bits = bits; /* non-negative floats order as their bits */
    r->nan |= v->nan;
    r->tiny += (uint64_t)llround(v->underflow * (double)v->elements);
    r->count += (uint64_t)v->elements;
    return NULL;
}

alloy_status range_stats_load(alloy_graph *g, const char *path)
{
    alloy_status st = entries_for_compiled(g, "load_amp_stats");
    if (st) return st;
    int nn = g->nranges;
    uint8_t *bytes = NULL;
    size_t len = 0;
    char err[512];
    st = al_file_read(path, AMP_STATS_MAX_BYTES, &bytes, &len, err, sizeof err);
    if (st) return graph_fail(g, st, "load_amp_stats: %s", err);
    char *text = (char *)bytes;
    if (strlen(text) != len) {
        al_free(bytes);
        return graph_fail(g, ALLOY_ERR_FORMAT, "load_amp_stats: %s: a NUL byte in the file (not a stats file)", path);
    }
    /* check every line before adding any: a bad file changes nothing */
    rt_range *keep = al_malloc(sizeof *keep * ((size_t)nn + 1));
    if (!keep) {
        al_free(bytes);
        return graph_fail(g, ALLOY_ERR_OOM, "load_amp_stats: out of memory");
    }
    memcpy(keep, g->ranges, sizeof *keep * (size_t)nn);
    long long runs = 0;
    int lineno = 0;
    for (char *line = text, *next; line && !st; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (++lineno == 1) {
            if (!amp_stats_header(line, &runs))
                st = graph_fail(g, ALLOY_ERR_FORMAT, "load_amp_stats: %s:1: not a stats file (it starts "
                                "'alloy-amp-stats 1')", path);
            continue;
        }
        if (!line[0] || line[0] == '#') continue;
        amp_stats_line v;
        char why[400];
        const char *bad = amp_stats_parse_line(line, &v);
        if (!bad) bad = load_line(g, &v, why, sizeof why);
        if (bad) st = graph_fail(g, ALLOY_ERR_FORMAT, "load_amp_stats: %s:%d: %s", path, lineno, bad);
    }
    if (!st && lineno == 0) st = graph_fail(g, ALLOY_ERR_FORMAT, "load_amp_stats: %s: the file is empty", path);
    if (st) memcpy(g->ranges, keep, sizeof *keep * (size_t)nn);
    else g->range_runs += runs;
    al_free(keep);
    al_free(bytes);
    return st;
}
