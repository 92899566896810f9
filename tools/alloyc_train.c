/* alloyc_train.c - alloyc train: training steps of an IR file's graph on batches from safetensors files, with progress lines and a checkpoint it resumes from and saves. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "alloyc.h"
#include "base/file.h"

/* How one input is fed: a tensor of a --feed file, whole every step or one
 * slice of its leading dimension per step. */
typedef struct input_feed {
    alloy_host_tensor input;        /* the graph's input: name, dtype, dims */
    const alloy_host_tensor *src;   /* the file's tensor; NULL until fed */
    const char *file;
    int64_t batches;                /* 0: src has the input's type, fed whole */
    size_t batch_bytes;
} input_feed;

/* What a training run holds, freed at once by trainer_free. */
typedef struct trainer {
    const options *o;
    alloy_graph *g;
    input_feed *inputs;
    int ninputs;
    alloy_safetensors **files; /* one per --feed */
    int nfiles;
    alloy_host_tensor *feeds;  /* what each step feeds, in input order */
    int64_t batches;           /* the batched feeds' count; 0 when none is batched */
    const char *batch_file;    /* the file of the first batched feed */
} trainer;

static void trainer_free(trainer *t)
{
    for (int i = 0; i < t->nfiles; i++) alloy_safetensors_free(t->files[i]);
    free(t->files);
    free(t->inputs);
    free(t->feeds);
    alloy_graph_free(t->g);
}

/* "f32[8,4]" into buf. */
static const char *type_text(alloy_dtype dtype, int rank, const int64_t *dims, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "%s[", alloy_dtype_name(dtype));
    for (int d = 0; d < rank && n < len; d++) n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? "," : "", (long long)dims[d]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}

/* The graph's inputs as a list for messages: 'x', 'labels'. */
static const char *input_list(const trainer *t, char *buf, size_t len)
{
    buf[0] = '\0';
    for (int i = 0; i < t->ninputs; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "%s'%s'", i ? ", " : "", t->inputs[i].input.name);
    }
    return t->ninputs ? buf : "none";
}

/* Feeds input f with tensor src of file: src must have the input's type
 * (fed whole every step) or one more leading dimension B >= 1 (B batches,
 * one per step in turn); an exit code. */
static int assign(trainer *t, input_feed *f, const alloy_host_tensor *src, const char *file)
{
    const alloy_host_tensor *in = &f->input;
    if (f->src)
        return alloyc_fail(EXIT_USAGE, "input '%s' is fed twice (from %s and from %s)", in->name, f->file, file);
    char want[160], got[160];
    type_text(in->dtype, in->rank, in->dims, want, sizeof want);
    type_text(src->dtype, src->rank, src->dims, got, sizeof got);
    bool same = src->dtype == in->dtype && src->rank == in->rank;
    bool batched = src->dtype == in->dtype && src->rank == in->rank + 1;
    for (int d = 0; d < in->rank; d++) {
        same = same && src->dims[d] == in->dims[d];
        batched = batched && src->dims[d + 1] == in->dims[d];
    }
    if (!same && !batched) {
        char batch[160];
        int64_t dims[ALLOY_MAX_RANK + 1] = {0};
        memcpy(dims + 1, in->dims, sizeof in->dims);
        type_text(in->dtype, in->rank + 1, dims, batch, sizeof batch);
        char *zero = strstr(batch, "[0");
        if (zero) zero[1] = 'B'; /* f32[B,8,4] */
        return alloyc_fail(EXIT_ERROR, "%s: tensor '%s' is %s; input '%s' of %s takes %s (the same batch every step) or %s "
                                "(B batches, one per step in turn)", file, src->name, got, in->name, t->o->ir_path,
                    want, batch);
    }
    f->src = src;
    f->file = file;
    if (same) return 0;
    if (src->dims[0] == 0) return alloyc_fail(EXIT_ERROR, "%s: tensor '%s' is %s: it holds no batch", file, src->name, got);
    if (t->batches && t->batches != src->dims[0])
        return alloyc_fail(EXIT_ERROR, "%s: tensor '%s' holds %lld batches, the first batched feed (from %s) %lld; batched "
                                "feeds must hold the same number", file, src->name, (long long)src->dims[0],
                    t->batch_file, (long long)t->batches);
    f->batches = src->dims[0];
    f->batch_bytes = (size_t)(alloy_host_tensor_numel(src) / src->dims[0]) * alloy_dtype_size(src->dtype);
    if (!t->batches) t->batches = f->batches, t->batch_file = file;
    return 0;
}

/* The input called name, or NULL. */
static input_feed *find_input(trainer *t, const char *name)
{
    for (int i = 0; i < t->ninputs; i++)
        if (strcmp(t->inputs[i].input.name, name) == 0) return &t->inputs[i];
    return NULL;
}

/* Loads the file of the i-th --feed (NAME=FILE or FILE) and feeds what it
 * names; an exit code. */
static int load_feed(trainer *t, const char *spec, int i)
{
    const char *eq = strchr(spec, '=');
    const char *path = eq ? eq + 1 : spec;
    char name[512] = "", list[512];
    if (eq) {
        if ((size_t)(eq - spec) >= sizeof name) return alloyc_fail(EXIT_USAGE, "--feed: input name is too long");
        memcpy(name, spec, (size_t)(eq - spec));
        name[eq - spec] = '\0';
        if (!*path) return alloyc_fail(EXIT_USAGE, "--feed %s: no file after '='", spec);
    }
    char err[1024] = "";
    alloy_status st = alloy_safetensors_load(path, &t->files[i], err, sizeof err);
    if (st) return alloyc_fail(EXIT_ERROR, "%s", err[0] ? err : alloy_status_name(st));
    t->nfiles = i + 1;
    const alloy_safetensors *file = t->files[i];
    if (eq) {
        input_feed *f = find_input(t, name);
        if (!f) return alloyc_fail(EXIT_ERROR, "--feed %s: '%s' is not an input of %s (inputs: %s)", spec, name, t->o->ir_path,
                            input_list(t, list, sizeof list));
        const alloy_host_tensor *src = alloy_safetensors_find(file, name);
        if (!src) return alloyc_fail(EXIT_ERROR, "%s: no tensor named '%s' to feed", path, name);
        return assign(t, f, src, path);
    }
    int matched = 0;
    for (int k = 0; k < alloy_safetensors_count(file); k++) {
        const alloy_host_tensor *src = alloy_safetensors_get(file, k);
        input_feed *f = find_input(t, src->name);
        if (!f) continue;
        int rc = assign(t, f, src, path);
        if (rc) return rc;
        matched++;
    }
    if (!matched)
        return alloyc_fail(EXIT_ERROR, "%s: no tensor in it is named like an input of %s (inputs: %s)", path, t->o->ir_path,
                    input_list(t, list, sizeof list));
    return 0;
}

/* Reads the graph's inputs and every --feed; an exit code. */
static int load_feeds(trainer *t)
{
    const options *o = t->o;
    t->ninputs = alloy_graph_input_count(t->g);
    t->inputs = calloc((size_t)t->ninputs + 1, sizeof *t->inputs);
    t->feeds = calloc((size_t)t->ninputs + 1, sizeof *t->feeds);
    t->files = calloc((size_t)o->nfeeds + 1, sizeof *t->files);
    if (!t->inputs || !t->feeds || !t->files) return alloyc_fail(EXIT_ERROR, "out of memory");
    for (int i = 0; i < t->ninputs; i++)
        if (alloy_graph_input_at(t->g, i, &t->inputs[i].input))
            return alloyc_fail(EXIT_ERROR, "%s", alloyc_graph_error(t->g, ALLOY_ERR_INVALID));
    for (int i = 0; i < o->nfeeds; i++) {
        int rc = load_feed(t, o->feeds[i], i);
        if (rc) return rc;
    }
    for (int i = 0; i < t->ninputs; i++) {
        const input_feed *f = &t->inputs[i];
        if (!f->src)
            return alloyc_fail(EXIT_ERROR, "input '%s' of %s is not fed (give --feed %s=FILE, or a --feed FILE holding a "
                                    "tensor named '%s')", f->input.name, o->ir_path, f->input.name, f->input.name);
        t->feeds[i] = *f->src;
        t->feeds[i].name = f->input.name;
        if (f->batches) { /* one batch: the input's own type */
            t->feeds[i].rank = f->input.rank;
            memcpy(t->feeds[i].dims, f->input.dims, sizeof f->input.dims);
        }
    }
    return 0;
}

/* Points every batched feed at its batch b. */
static void select_batch(trainer *t, int64_t b)
{
    for (int i = 0; i < t->ninputs; i++) {
        const input_feed *f = &t->inputs[i];
        if (f->batches) t->feeds[i].data = (char *)f->src->data + (size_t)b * f->batch_bytes;
    }
}

/* What a step processes, for the rate on the progress lines: the elements
 * of the first integer input of rank >= 2 (token ids, "tok/s"), else the
 * leading dimension of the first input of rank >= 1 ("samples/s"), else
 * one ("steps/s"). */
static double step_units(const trainer *t, const char **unit)
{
    for (int i = 0; i < t->ninputs; i++) {
        const alloy_host_tensor *in = &t->inputs[i].input;
        if ((in->dtype == ALLOY_I32 || in->dtype == ALLOY_I64) && in->rank >= 2) {
            *unit = "tok/s";
            return (double)alloy_host_tensor_numel(in);
        }
    }
    for (int i = 0; i < t->ninputs; i++) {
        if (t->inputs[i].input.rank >= 1) {
            *unit = "samples/s";
            return (double)t->inputs[i].input.dims[0];
        }
    }
    *unit = "steps/s";
    return 1;
}

/* The i32 scalar state tensor name, or 0 when the graph has none. */
static long state_count(alloy_graph *g, const char *name)
{
    alloy_host_tensor s;
    if (alloy_graph_get_state(g, name, &s) || s.rank != 0 || s.dtype != ALLOY_I32) return 0;
    return *(const int32_t *)s.data;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sets up g for training as the options say: the loss, AMP, the loss
 * scaler (dynamic by default with f16), the optimizer, the seed and every
 * --set; an exit code. */
static int configure_training(trainer *t)
{
    const options *o = t->o;
    alloy_graph *g = t->g;
    if (o->loss) {
        if (alloyc_set_loss(g, o)) return EXIT_ERROR;
    } else if (alloy_graph_set_training(g, true)) {
        return alloyc_fail(EXIT_ERROR, "%s has no 'loss' line to train on; name the loss node with --loss NAME", o->ir_path);
    }
    alloy_status st = o->amp != ALLOY_F32 ? alloy_graph_enable_amp(g, o->amp) : ALLOY_OK;
    const char *scaler = o->scaler ? o->scaler : o->amp == ALLOY_F16 ? "dynamic" : "none";
    if (!st && strcmp(scaler, "none") != 0) {
        alloy_grad_scaler sc;
        char why[256];
        alloyc_scaler(scaler, &sc, why, sizeof why); /* checked with the arguments */
        st = alloy_graph_set_grad_scaler(g, sc);
    }
    if (!st) st = alloy_graph_add_optimizer(g, alloyc_optimizer(o));
    if (!st && o->amp_stats) st = alloy_graph_set_option(g, "amp_stats", "1");
    if (!st) st = alloyc_apply_sets(g, o);
    if (st) return alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(g, st));
    if (o->have_seed) alloy_graph_set_seed(g, o->seed);
    return 0;
}

/* Loads the checkpoint when it exists (printing where it resumes), else
 * --params; sets *first_step to the steps the state has taken; an exit code. */
static int load_start(trainer *t, long *first_step)
{
    const options *o = t->o;
    struct stat sb;
    bool resume = false;
    if (o->checkpoint) {
        if (stat(o->checkpoint, &sb) == 0) resume = true;
        else if (errno != ENOENT) return alloyc_fail(EXIT_ERROR, "--checkpoint %s: %s", o->checkpoint, strerror(errno));
    }
    if (resume) {
        alloy_status st = alloy_graph_load_checkpoint(t->g, o->checkpoint);
        if (st)
            return alloyc_fail(EXIT_ERROR, "--checkpoint %s: %s (a resumed run needs the same IR file, --optimizer and "
                                    "--scaler as the run that saved it)", o->checkpoint, alloyc_graph_error(t->g, st));
    } else if (o->params) {
        int loaded = 0, rc = alloyc_load_params(t->g, o->params, o->ir_path, &loaded);
        if (rc) return rc;
        printf("parameters from %s: %d loaded\n", o->params, loaded);
    }
    /* a skipped step is a step too: it consumed its batch */
    *first_step = state_count(t->g, "optim.step") + state_count(t->g, "step.skipped_steps");
    if (resume)
        printf("resumed from %s at step %ld%s\n", o->checkpoint, *first_step,
               o->params ? " (--params not read: the checkpoint holds the parameters)" : "");
    return 0;
}

/* Saves the checkpoint and says so; an exit code. */
static int save(trainer *t, long step)
{
    alloy_status st = alloy_graph_save_checkpoint(t->g, t->o->checkpoint);
    if (st) return alloyc_fail(EXIT_ERROR, "--checkpoint %s: %s", t->o->checkpoint, alloyc_graph_error(t->g, st));
    printf("saved %s at step %ld\n", t->o->checkpoint, step);
    fflush(stdout);
    return 0;
}

/* Prints what the run is: graph, data, optimizer, precision, device. */
static void print_header(const trainer *t, const char *device)
{
    const options *o = t->o;
    alloy_optimizer opt = alloyc_optimizer(o);
    static const char *const amp_names[] = {[ALLOY_F32] = "off", [ALLOY_F16] = "f16", [ALLOY_BF16] = "bf16"};
    const char *scaler = o->scaler ? o->scaler : o->amp == ALLOY_F16 ? "dynamic" : "none";
    printf("train %s: ", o->ir_path);
    if (t->batches) printf("%lld batches from %s", (long long)t->batches, t->batch_file);
    else printf("the same batch every step");
    printf("; %s lr %g weight_decay %g", o->optimizer ? o->optimizer : "adamw", opt.lr, opt.weight_decay);
    if (opt.kind == ALLOY_OPTIM_SGD) printf(" momentum %g", opt.momentum);
    if (opt.clip_norm > 0) printf(" clip_norm %g", opt.clip_norm);
    printf("; amp %s, scaler %s; device %s\n", amp_names[o->amp], scaler, device);
}

int alloyc_train(const options *o)
{
    trainer t = {.o = o};
    int rc = 0, rank = 0, ranks = 1;
    alloy_comm *comm = NULL;
    /* the checkpoint's destination before any step: a run that cannot
     * save is refused now, not after all its steps (base/file.h) */
    char err[1024];
    if (o->zero && !o->data_parallel) return alloyc_fail(EXIT_USAGE, "%s", "--zero needs --data-parallel");
    if (o->checkpoint && al_file_check_writable(o->checkpoint, err, sizeof err))
        return alloyc_fail(EXIT_ERROR, "--checkpoint: %s", err);
    if (o->amp_stats && al_file_check_writable(o->amp_stats, err, sizeof err))
        return alloyc_fail(EXIT_ERROR, "--amp-stats: %s", err);
    t.g = alloyc_load_graph(o->ir_path);
    if (!t.g) return EXIT_ERROR;
    long first = 0;
    if ((rc = configure_training(&t)) || (rc = load_feeds(&t))) goto done;
    if (o->data_parallel) { /* every rank the same graph and batches; a peer that dies is an error in 600 s */
        if (alloy_comm_world(&comm, err, sizeof err)) {
            rc = alloyc_fail(EXIT_ERROR, "--data-parallel: %s", err);
            goto done;
        }
        rank = alloy_comm_rank(comm), ranks = alloy_comm_size(comm);
        alloy_status st = alloy_graph_set_data_parallel(t.g, comm,
                                                        &(alloy_data_parallel){.timeout_s = 600, .zero_stage = o->zero});
        if (st) {
            rc = alloyc_fail(EXIT_ERROR, "--data-parallel: %s", alloyc_graph_error(t.g, st));
            goto done;
        }
        if (rank && !freopen("/dev/null", "w", stdout)) {
            rc = alloyc_fail(EXIT_ERROR, "--data-parallel: rank %d cannot silence its output", rank);
            goto done;
        }
    }
    const char *device = alloy_graph_device(t.g); /* compiles the step: its time is not a step's */
    if (!device) {
        rc = alloyc_fail(EXIT_ERROR, "%s: %s", o->ir_path, alloyc_graph_error(t.g, ALLOY_ERR_INVALID));
        goto done;
    }
    print_header(&t, device);
    if (comm) printf("data-parallel over %d rank%s\n", ranks, ranks == 1 ? "" : "s");
    if ((rc = load_start(&t, &first))) goto done;
    fflush(stdout);
    const char *unit;
    double units = step_units(&t, &unit);
    long log_every = o->log_every ? o->log_every : 10, since_log = 0;
    double seconds = 0;
    for (long i = 1; i <= o->steps; i++) {
        long step = first + i;
        select_batch(&t, t.batches ? ((step - 1) * ranks + rank) % t.batches : 0);
        double started = now_seconds();
        alloy_step_info s;
        alloy_status st = alloy_graph_run(t.g, t.feeds, t.ninputs, NULL, 0);
        alloy_overflow_info where;
        if (!st && alloy_graph_step_info(t.g, &s) == ALLOY_OK && s.skipped &&
            alloy_graph_overflow_info(t.g, &where) == ALLOY_OK && where.found) { /* amp_check's line (a diverged step: in the error) */
            printf("step %ld skipped: %s\n", step, where.summary);
            fflush(stdout);
        }
        if (!st) st = alloy_graph_step_info(t.g, &s);
        if (st) {
            rc = alloyc_fail(EXIT_ERROR, "step %ld: %s", step, alloyc_graph_error(t.g, st));
            goto done;
        }
        bool log = step % log_every == 0 || i == o->steps;
        if (i > 1 || log) { /* the first run sets up the arena and state: not counted unless it is alone */
            seconds += now_seconds() - started;
            since_log++;
        }
        if (log) {
            printf("step %ld loss %.7g scale %g skipped %lld %s %.0f lr %.3g\n", step, s.loss, s.scale,
                   (long long)s.skipped_steps, unit, seconds > 0 ? (double)since_log * units * ranks / seconds : 0.0, s.lr);
            fflush(stdout);
            since_log = 0, seconds = 0;
        }
        /* every rank holds the same state (ZeRO-1: its shard, which every rank's call gathers) */
        bool saver = rank == 0 || o->zero;
        if (o->save_every && step % o->save_every == 0 && i != o->steps && saver && (rc = save(&t, step))) goto done;
    }
    if (o->checkpoint && (rank == 0 || o->zero) && (rc = save(&t, first + o->steps))) goto done;
    if (o->amp_stats && rank == 0) {
        alloy_status st = alloy_graph_amp_stats(t.g, stdout);
        if (!st) st = alloy_graph_save_amp_stats(t.g, o->amp_stats);
        if (st) {
            rc = alloyc_fail(EXIT_ERROR, "--amp-stats %s: %s", o->amp_stats, alloyc_graph_error(t.g, st));
            goto done;
        }
        printf("saved the range statistics to %s\n", o->amp_stats);
    }
    if (o->save_params && rank == 0) {
        if ((rc = alloyc_save_params(t.g, o->save_params))) goto done;
        printf("saved the parameters to %s\n", o->save_params);
    }
    if (fflush(stdout) || ferror(stdout)) rc = alloyc_fail(EXIT_ERROR, "writing to stdout failed");
done:
    trainer_free(&t);
    alloy_comm_free(comm); /* finalizes MPI */
    return rc;
}
