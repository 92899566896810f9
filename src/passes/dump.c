/* dump.c - the pass manager's inspection output: one numbered IR file per pipeline stage, written atomically, and the pass timing table. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    d->f = NULL;
    d->tmp[0] = '\0';
    alloy_status st = dump_path(dir, g, index, what, d->path, sizeof d->path, err, errlen);
    if (st) return st;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        al_fmt(err, errlen, "dump_dir: cannot make the directory %s: %s", dir, strerror(errno));
        return ALLOY_ERR_IO;
    }
    al_fmt(d->tmp, sizeof d->tmp, "%s.tmp-XXXXXX", d->path);
    int fd = mkstemp(d->tmp);
    if (fd < 0) {
        al_fmt(err, errlen, "dump_dir: cannot write %s: cannot create a temporary file next to it: %s", d->path,
               strerror(errno));
        d->tmp[0] = '\0';
        return ALLOY_ERR_IO;
    }
    (void)fchmod(fd, 0644); /* mkstemp's 0600 would hide the dumps from other users */
    d->f = fdopen(fd, "w");
    if (!d->f) {
        al_fmt(err, errlen, "dump_dir: cannot write %s: %s", d->path, strerror(errno));
        close(fd);
        unlink(d->tmp);
        d->tmp[0] = '\0';
        return ALLOY_ERR_IO;
    }
    return ALLOY_OK;
}

alloy_status dump_commit(dump_file *d, char *err, size_t errlen)
{
    bool bad = fflush(d->f) != 0 || ferror(d->f);
    int e = bad ? errno : 0;
    if (fclose(d->f) != 0 && !bad) bad = true, e = errno;
    d->f = NULL;
    if (!bad && rename(d->tmp, d->path) != 0) bad = true, e = errno;
    if (bad) {
        unlink(d->tmp);
        al_fmt(err, errlen, "dump_dir: cannot write %s: %s", d->path, strerror(e ? e : EIO));
        return ALLOY_ERR_IO;
    }
    return ALLOY_OK;
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
