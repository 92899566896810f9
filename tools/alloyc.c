/* alloyc.c - the alloy command-line driver: prints a graph's compiled IR (or its pictures), runs it once on the CPU with safetensors in and out, or compiles it to CUDA kernels in a directory. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloyc.h"
#include "base/file.h"

/* ---- names ---- */

/* A growing list of malloc'd strings. */
typedef struct names {
    char **at;
    int n, cap;
} names;

static bool names_add(names *l, char *s)
{
    if (!s) return false;
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        char **at = realloc(l->at, sizeof *at * (size_t)cap);
        if (!at) {
            free(s);
            return false;
        }
        l->at = at;
        l->cap = cap;
    }
    l->at[l->n++] = s;
    return true;
}

static bool names_has(const names *l, const char *s)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->at[i], s) == 0) return true;
    return false;
}

static void names_free(names *l)
{
    for (int i = 0; i < l->n; i++) free(l->at[i]);
    free(l->at);
    *l = (names){0};
}

/* The names of g's outputs and inputs, in the order they were declared.
 * Returns false when out of memory. */
static bool list_names(const alloy_graph *g, names *outputs, names *inputs)
{
    for (int i = 0; i < alloy_graph_output_count(g); i++)
        if (!names_add(outputs, strdup(alloy_graph_output_name(g, i)))) return false;
    for (int i = 0; i < alloy_graph_input_count(g); i++) {
        alloy_host_tensor in;
        if (alloy_graph_input_at(g, i, &in) || !names_add(inputs, strdup(in.name))) return false;
    }
    return true;
}

/* ---- commands ---- */

/* Applies the compile options to g; returns the first failing status (alloyc.h). */
alloy_status alloyc_configure(alloy_graph *g, const options *o)
{
    alloy_status st = ALLOY_OK;
    if (o->amp != ALLOY_F32) st = alloy_graph_enable_amp(g, o->amp);
    if (!st && (o->train || o->loss)) st = alloy_graph_set_training(g, o->train); /* set_loss turned it on */
    if (!st && o->scaler && strcmp(o->scaler, "none") != 0) {
        alloy_grad_scaler s;
        char why[256];
        alloyc_scaler(o->scaler, &s, why, sizeof why); /* checked with the arguments */
        st = alloy_graph_set_grad_scaler(g, s);
    }
    if (!st && o->optimizer) st = alloy_graph_add_optimizer(g, alloyc_optimizer(o));
    /* printed passes go to stdout, unless stdout carries a picture */
    FILE *log = o->emit == EMIT_IR ? stdout : stderr;
    if (!st && o->print_after) st = alloy_graph_print_after(g, o->print_after, log);
    if (!st && o->print_before) {
        st = alloy_graph_print_after(g, o->print_after ? o->print_after : "", log);
        if (!st) st = alloy_graph_set_option(g, "print_before", o->print_before);
    }
    return st ? st : alloyc_apply_sets(g, o);
}

/* The path of program `name` in a directory of $PATH into buf; false when none is executable there. */
static bool find_program(const char *name, char *buf, size_t len)
{
    const char *path = getenv("PATH");
    for (const char *p = path ? path : ""; *p;) {
        size_t n = strcspn(p, ":");
        if (n && snprintf(buf, len, "%.*s/%s", (int)n, p, name) < (int)len && access(buf, X_OK) == 0) return true;
        p += n + (p[n] == ':');
    }
    return false;
}

/* Compiles g and pipes its DOT text through Graphviz's `dot -Tsvg` (at
 * dot_path) onto stdout; an exit code. */
static int print_svg(alloy_graph *g, const options *o, const char *dot_path)
{
    int fds[2];
    if (pipe(fds) != 0) return alloyc_fail(EXIT_ERROR, "cannot make a pipe to dot: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]);
        return alloyc_fail(EXIT_ERROR, "cannot start %s: %s", dot_path, strerror(errno));
    }
    if (pid == 0) {
        dup2(fds[0], 0);
        close(fds[0]), close(fds[1]);
        execl(dot_path, "dot", "-Tsvg", (char *)NULL);
        fprintf(stderr, "alloyc: cannot run %s: %s\n", dot_path, strerror(errno));
        _exit(127);
    }
    close(fds[0]);
    void (*was)(int) = signal(SIGPIPE, SIG_IGN); /* a dot that exits early is reported below */
    FILE *to_dot = fdopen(fds[1], "w");
    alloy_status st = to_dot ? alloy_graph_dump(g, to_dot, ALLOY_DUMP_DOT) : ALLOY_ERR_IO;
    if (to_dot) fclose(to_dot);
    else close(fds[1]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    signal(SIGPIPE, was);
    if (st && st != ALLOY_ERR_IO) return alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(g, st));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return alloyc_fail(EXIT_ERROR, "%s -Tsvg failed (%s %d) on the DOT text of %s; --emit=dot writes that text", dot_path,
                    WIFEXITED(status) ? "exit status" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), o->ir_path);
    if (st) return alloyc_fail(EXIT_ERROR, "%s: writing the DOT text to %s failed", o->ir_path, dot_path);
    return 0;
}

static int cmd_print(const options *o)
{
    alloy_graph *g = alloyc_load_graph(o->ir_path);
    if (!g) return EXIT_ERROR;
    if (o->loss && alloyc_set_loss(g, o)) {
        alloy_graph_free(g);
        return EXIT_ERROR;
    }
    char dot_path[4096];
    if (o->emit == EMIT_SVG && !find_program("dot", dot_path, sizeof dot_path)) {
        alloy_graph_free(g);
        return alloyc_fail(EXIT_ERROR, "--emit=svg needs Graphviz's dot on the PATH (not found; install graphviz, or write "
                                "the DOT text with --emit=dot and render it elsewhere)");
    }
    static const alloy_dump_kind kinds[] = {ALLOY_DUMP_IR, ALLOY_DUMP_DOT, ALLOY_DUMP_DOT, ALLOY_DUMP_MEMORY_SVG};
    alloy_status st = alloyc_configure(g, o);
    alloy_memory_info compiled;
    if (!st && o->emit == EMIT_SVG && !(st = alloy_graph_memory_info(g, &compiled))) { /* compile errors before dot starts */
        int code = print_svg(g, o, dot_path);
        alloy_graph_free(g);
        return code;
    }
    if (!st) st = alloy_graph_dump(g, stdout, kinds[o->emit]);
    int rc = 0;
    if (st) rc = alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(g, st));
    else if (fflush(stdout) || ferror(stdout)) rc = alloyc_fail(EXIT_ERROR, "writing the IR to stdout failed");
    alloy_graph_free(g);
    return rc;
}

/* What a run holds, freed at once by run_free. */
typedef struct run_ctx {
    const char *ir_path;
    alloy_graph *g;
    names outputs, inputs;
    alloy_safetensors **files; /* one per --feed */
    alloy_host_tensor *feeds;
    const char **feed_file; /* the file each feed came from, for messages */
    int nfeeds, feed_cap;
    alloy_host_tensor *fetches;
} run_ctx;

static void run_free(run_ctx *r, int nfiles)
{
    for (int i = 0; i < nfiles; i++) alloy_safetensors_free(r->files[i]);
    free(r->files);
    free(r->feeds);
    free(r->feed_file);
    free(r->fetches);
    names_free(&r->outputs);
    names_free(&r->inputs);
    alloy_graph_free(r->g);
}

/* Adds tensor t (from file) to the feeds; fails if its input is fed already. */
static int add_feed(run_ctx *r, const alloy_host_tensor *t, const char *file)
{
    for (int i = 0; i < r->nfeeds; i++)
        if (strcmp(r->feeds[i].name, t->name) == 0)
            return alloyc_fail(EXIT_USAGE, "input '%s' is fed twice (from %s and from %s)", t->name,
                        r->feed_file[i], file);
    if (r->nfeeds == r->feed_cap) {
        int cap = r->feed_cap ? r->feed_cap * 2 : 8;
        alloy_host_tensor *feeds = realloc(r->feeds, sizeof *feeds * (size_t)cap);
        if (!feeds) return alloyc_fail(EXIT_ERROR, "out of memory");
        r->feeds = feeds;
        const char **from = realloc(r->feed_file, sizeof *from * (size_t)cap);
        if (!from) return alloyc_fail(EXIT_ERROR, "out of memory");
        r->feed_file = from;
        r->feed_cap = cap;
    }
    r->feeds[r->nfeeds] = *t;
    r->feed_file[r->nfeeds++] = file;
    return 0;
}

/* Loads the file of the i-th --feed and adds what it names to the feeds. */
static int load_feed(run_ctx *r, const char *spec, int i)
{
    const char *eq = strchr(spec, '=');
    char name[512] = "";
    const char *path = spec;
    if (eq) {
        if ((size_t)(eq - spec) >= sizeof name) return alloyc_fail(EXIT_USAGE, "--feed: input name is too long");
        memcpy(name, spec, (size_t)(eq - spec));
        name[eq - spec] = '\0';
        path = eq + 1;
        if (!*path) return alloyc_fail(EXIT_USAGE, "--feed %s: no file after '='", spec);
    }
    char err[1024] = "";
    alloy_status st = alloy_safetensors_load(path, &r->files[i], err, sizeof err);
    if (st) return alloyc_fail(EXIT_ERROR, "%s", err[0] ? err : alloy_status_name(st));
    const alloy_safetensors *file = r->files[i];
    if (eq) {
        const alloy_host_tensor *t = alloy_safetensors_find(file, name);
        if (!t) return alloyc_fail(EXIT_ERROR, "%s: no tensor named '%s' to feed", path, name);
        return add_feed(r, t, path);
    }
    int matched = 0;
    for (int k = 0; k < alloy_safetensors_count(file); k++) {
        const alloy_host_tensor *t = alloy_safetensors_get(file, k);
        if (!names_has(&r->inputs, t->name)) continue;
        int rc = add_feed(r, t, path);
        if (rc) return rc;
        matched++;
    }
    if (!matched) {
        char list[512] = "";
        for (int k = 0; k < r->inputs.n; k++) {
            size_t used = strlen(list);
            snprintf(list + used, sizeof list - used, "%s'%s'", k ? ", " : "", r->inputs.at[k]);
        }
        return alloyc_fail(EXIT_ERROR, "%s: no tensor in it is named like an input of %s (inputs: %s)", path,
                    r->ir_path, r->inputs.n ? list : "none");
    }
    return 0;
}

/* Turns the backward on when a --fetch names a gradient (grad:NAME; for an
 * input NAME, asks for its gradient too), from --loss or the IR's loss;
 * an exit code. */
static int setup_grads(alloy_graph *g, const options *o)
{
    const char *first = NULL;
    for (int i = 0; i < o->nfetches; i++) {
        if (strncmp(o->fetches[i], "grad:", 5) != 0) continue;
        if (!first) first = o->fetches[i];
        alloy_tensor *t = alloy_graph_find(g, o->fetches[i] + 5);
        alloy_host_tensor in;
        for (int k = 0; t && k < alloy_graph_input_count(g); k++) {
            if (alloy_graph_input_at(g, k, &in) || strcmp(in.name, o->fetches[i] + 5) != 0) continue;
            alloy_status st = alloy_graph_request_grad(g, t);
            if (st) return alloyc_fail(EXIT_ERROR, "--fetch %s: %s", o->fetches[i], alloyc_graph_error(g, st));
        }
    }
    if (o->loss && alloyc_set_loss(g, o)) return EXIT_ERROR;
    if (!first) {
        if (o->loss) alloy_graph_set_training(g, false); /* set_loss turned it on; off always succeeds */
        return 0;
    }
    if (alloy_graph_set_training(g, true))
        return alloyc_fail(EXIT_ERROR, "--fetch %s needs a loss to differentiate: %s has no 'loss' line; name the loss "
                                "node with --loss NAME", first, o->ir_path);
    return 0;
}

static int cmd_run(const options *o)
{
    run_ctx r = {.ir_path = o->ir_path};
    int rc = 0, nfiles = 0;
    char err[1024] = "";
    r.g = alloyc_load_graph(o->ir_path);
    if (!r.g) {
        rc = EXIT_ERROR;
        goto done;
    }
    if (!list_names(r.g, &r.outputs, &r.inputs)) {
        rc = alloyc_fail(EXIT_ERROR, "out of memory");
        goto done;
    }
    if (o->amp != ALLOY_F32 && alloy_graph_enable_amp(r.g, o->amp)) {
        rc = alloyc_fail(EXIT_ERROR, "%s", alloyc_graph_error(r.g, ALLOY_ERR_INVALID));
        goto done;
    }
    if ((rc = setup_grads(r.g, o))) goto done;
    /* run is the CPU reference run, whatever device the environment picks */
    alloy_status set = alloy_graph_set_option(r.g, "device", "cpu");
    if (!set) set = alloyc_apply_sets(r.g, o);
    if (set) {
        rc = alloyc_fail(EXIT_ERROR, "%s", alloyc_graph_error(r.g, set));
        goto done;
    }
    if (o->have_seed) alloy_graph_set_seed(r.g, o->seed);
    if (o->params && (rc = alloyc_load_params(r.g, o->params, o->ir_path, NULL))) goto done;
    r.files = calloc((size_t)o->nfeeds + 1, sizeof *r.files);
    if (!r.files) {
        rc = alloyc_fail(EXIT_ERROR, "out of memory");
        goto done;
    }
    for (; nfiles < o->nfeeds; nfiles++) {
        if ((rc = load_feed(&r, o->feeds[nfiles], nfiles))) {
            nfiles++;
            goto done;
        }
    }
    const char *const *fetch_names = o->fetches;
    int nfetch = o->nfetches;
    if (!nfetch) {
        fetch_names = (const char *const *)r.outputs.at;
        nfetch = r.outputs.n;
    }
    if (!nfetch) {
        rc = alloyc_fail(EXIT_ERROR, "%s declares no output; name what to write with --fetch", o->ir_path);
        goto done;
    }
    r.fetches = calloc((size_t)nfetch, sizeof *r.fetches);
    if (!r.fetches) {
        rc = alloyc_fail(EXIT_ERROR, "out of memory");
        goto done;
    }
    for (int i = 0; i < nfetch; i++) r.fetches[i].name = fetch_names[i];
    alloy_status st = alloy_graph_run(r.g, r.feeds, r.nfeeds, r.fetches, nfetch);
    if (st) {
        rc = alloyc_fail(EXIT_ERROR, "%s", alloyc_graph_error(r.g, st));
        goto done;
    }
    static const char *const keys[] = {"producer", "graph_file"};
    const char *values[] = {"alloyc", o->ir_path};
    st = alloy_safetensors_save(o->out, r.fetches, nfetch, keys, values, 2, err, sizeof err);
    if (st) {
        rc = alloyc_fail(EXIT_ERROR, "%s", err[0] ? err : alloy_status_name(st));
        goto done;
    }
    printf("wrote %s:", o->out);
    for (int i = 0; i < nfetch; i++) {
        const alloy_host_tensor *t = &r.fetches[i];
        printf("%s %s %s[", i ? "," : "", t->name, alloy_dtype_name(t->dtype));
        for (int d = 0; d < t->rank; d++) printf("%s%lld", d ? "," : "", (long long)t->dims[d]);
        printf("]");
    }
    printf("\n");
    if (fflush(stdout) || ferror(stdout)) rc = alloyc_fail(EXIT_ERROR, "writing to stdout failed");
done:
    run_free(&r, nfiles);
    return rc;
}

/* Prints dir/summary.txt and a line naming dir; an exit code. */
static int print_summary(const char *dir)
{
    size_t n = strlen(dir) + sizeof "/summary.txt";
    char *path = malloc(n);
    if (!path) return alloyc_fail(EXIT_ERROR, "out of memory");
    snprintf(path, n, "%s/summary.txt", dir);
    size_t len;
    uint8_t *text;
    char err[1024];
    alloy_status st = al_file_read(path, 0, &text, &len, err, sizeof err);
    free(path);
    if (st) return alloyc_fail(EXIT_ERROR, "%s", err);
    fwrite(text, 1, len, stdout);
    al_free(text);
    printf("wrote %s\n", dir);
    if (fflush(stdout) || ferror(stdout)) return alloyc_fail(EXIT_ERROR, "writing to stdout failed");
    return 0;
}

static int cmd_compile(const options *o)
{
    alloy_graph *g = alloyc_load_graph(o->ir_path);
    if (!g) return EXIT_ERROR;
    if (o->loss && alloyc_set_loss(g, o)) {
        alloy_graph_free(g);
        return EXIT_ERROR;
    }
    alloy_status st = alloyc_configure(g, o);
    if (o->bundle) {
        if (o->have_seed) alloy_graph_set_seed(g, o->seed);
        if (!st) st = alloy_graph_save_bundle_flags(g, o->out, o->arch, o->with_state ? ALLOY_BUNDLE_WITH_STATE : 0);
        int rc = st ? alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(g, st)) : 0;
        if (!st) printf("wrote %s\n", o->out);
        alloy_graph_free(g);
        return rc;
    }
    if (!st) st = alloy_graph_export_cuda(g, o->arch, o->out);
    int rc = st ? alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(g, st)) : print_summary(o->out);
    alloy_graph_free(g);
    return rc;
}

/* Parses the command line and runs the command; the exit status says how it went. */
int main(int argc, char **argv)
{
    options o = {0};
    bool done;
    int rc = alloyc_parse_args(argc, argv, &o, &done);
    if (!done)
        rc = strcmp(o.command, "print") == 0 ? cmd_print(&o)
             : strcmp(o.command, "run") == 0 ? cmd_run(&o)
             : strcmp(o.command, "train") == 0 ? alloyc_train(&o)
             : strcmp(o.command, "cost") == 0  ? alloyc_cost(&o)
             : strcmp(o.command, "amp-report") == 0 ? alloyc_amp_report(&o)
                                               : cmd_compile(&o);
    free(o.feeds);
    free(o.fetches);
    free(o.sets);
    return rc;
}
