/* dump.c - the pass manager's inspection output: one numbered IR file per pipeline stage, written atomically (base/file.h), and the pass timing table. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "passes/inspect.h"

/* dir/GRAPH.NN-WHAT.ir into path (the graph's name made a safe file name). */
static alloy_status dump_path(const char *dir, const ir_graph *g, int index, const char *what, char *path,
                              size_t len, char *err, size_t errlen)
{
    char name[101];
    size_t n = 0;
    for (const char *p = g->name ? g->name : ""; *p && n < sizeof name - 1; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                  c == '-' || (c == '.' && n > 0);
        name[n++] = ok ? c : '_';
    }
    name[n] = '\0';
    int w = snprintf(path, len, "%s/%s.%02d-%s.ir", dir, n ? name : "graph", index, what);
    if (w < 0 || (size_t)w >= len) {
        al_fmt(err, errlen, "dump_dir %.200s...: the dump file's path is too long", dir);
        return ALLOY_ERR_IO;
    }
    return ALLOY_OK;
}

alloy_status dump_open(const char *dir, const ir_graph *g, int index, const char *what, dump_file *d, char *err,
                       size_t errlen)
{
    d->f = NULL, d->buf = NULL, d->len = 0;
    alloy_status st = dump_path(dir, g, index, what, d->path, sizeof d->path, err, errlen);
    if (st) return st;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        al_fmt(err, errlen, "dump_dir: cannot make the directory %s: %s", dir, strerror(errno));
        return ALLOY_ERR_IO;
    }
    if (!(d->f = open_memstream(&d->buf, &d->len))) {
        al_fmt(err, errlen, "dump_dir: out of memory writing %s", d->path);
        return ALLOY_ERR_OOM;
    }
    return ALLOY_OK;
}

alloy_status dump_commit(dump_file *d, char *err, size_t errlen)
{
    bool bad = fclose(d->f) != 0;
    d->f = NULL;
    alloy_status st = ALLOY_OK;
    char msg[DUMP_PATH_MAX + 256];
    if (bad) {
        al_fmt(err, errlen, "dump_dir: out of memory writing %s", d->path);
        st = ALLOY_ERR_OOM;
    } else {
        const void *part = d->buf;
        if ((st = al_file_write(d->path, &part, &d->len, 1, 0, msg, sizeof msg)))
            al_fmt(err, errlen, "dump_dir: %s", msg);
    }
    free(d->buf);
    d->buf = NULL;
    return st;
}

alloy_status dump_remove(const char *dir, const ir_graph *g, int index, const char *what, char *err, size_t errlen)
{
    char path[DUMP_PATH_MAX];
    alloy_status st = dump_path(dir, g, index, what, path, sizeof path, err, errlen);
    if (st || unlink(path) == 0 || errno == ENOENT) return st;
    al_fmt(err, errlen, "dump_dir: cannot remove the stale %s: %s", path, strerror(errno));
    return ALLOY_ERR_IO;
}

void dump_print_times(FILE *out, const char *name, int nodes_in, const pass_time *rows, int n, const char *failed)
{
    double total = 0;
    int nodes = nodes_in;
    for (int i = 0; i < n; i++)
        if (rows[i].ran) total += rows[i].ms, nodes = rows[i].nodes;
    fprintf(out, "# pass times: graph %s, %d -> %d nodes, %.3f ms\n", name ? name : "?", nodes_in, nodes, total);
    fprintf(out, "#   %-12s %9s %7s\n", "pass", "ms", "nodes");
    nodes = nodes_in;
    for (int i = 0; i < n; i++) {
        const pass_time *r = &rows[i];
        if (!r->ran) {
            fprintf(out, "#   %-12s %9s %7s  disabled\n", r->name, "-", "-");
            continue;
        }
        fprintf(out, "#   %-12s %9.3f %7d", r->name, r->ms, r->nodes);
        if (r->nodes != nodes) fprintf(out, "  %+d", r->nodes - nodes);
        if (r->what[0]) fprintf(out, "  %s", r->what);
        fputc('\n', out);
        nodes = r->nodes;
    }
    if (failed) fprintf(out, "#   %-12s failed\n", failed);
}
