/* char_gpt.c - example: train a small GPT on the characters of a text file with fp16 AMP, report validation loss, sample from it. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloy/alloy.h"
#include "gpt_model.h"
#include "cli.h"

static const char usage[] =
    "usage: char_gpt [options]\n"
    "Trains a character-level GPT on a text file (vocabulary: its distinct bytes) on\n"
    "random windows of the first 90%, reports the loss on the last 10% and samples\n"
    "200 characters (temperature 0.8) from the prompt \"The Program \" (or, if the\n"
    "text lacks those characters, from the validation text's first 8 bytes).\n"
    "  --text FILE        training text (default /usr/share/common-licenses/GPL-3)\n"
    "  --steps N          training steps to run (default 300)\n"
    "  --amp f16|bf16|off mixed precision (default f16, with a dynamic loss scaler)\n"
    "  --seed S           seed of the initialization, batches and sampling (default 1)\n"
    "  --device D         auto|cpu|cuda (default auto: the GPU when the NVIDIA driver,\n"
    "                     a GPU and the CUDA libraries are there, else the CPU; the\n"
    "                     device line says which and why; cuda without them: error)\n"
    "  --checkpoint FILE  resume from FILE if it exists (and run --steps more); save\n"
    "                     all state to it at the end\n"
    "  --batch N          sequences per step (default 32)\n"
    "  --context N        tokens per sequence (default 64)\n"
    "  --dim N            embedding width (default 128; MLP width 4*dim)\n"
    "  --layers N         transformer blocks (default 2)\n"
    "  --heads N          attention heads (default 4)\n"
    "  --lr X             peak AdamW learning rate (default 3e-3): linear warmup over\n"
    "                     the first 1/6 of the steps, cosine decay to lr/10 at the last\n"
    "  --log-every N      print a line every N steps (default 10)\n"
    "  --eval-every N     validation loss every N steps, 0 = only at the end (default 100)\n"
    "  --dump-ir FILE     write the model with its loss as IR text (docs/ir.md) to FILE\n"
    "                     and exit, e.g. for `alloyc print --train --amp=f16 FILE`\n"
    "  --data-parallel    train data-parallel over the processes mpirun started\n"
    "                     (`mpirun -np 2 char_gpt --data-parallel`): each takes\n"
    "                     --batch / ranks of every batch, the gradients are averaged\n"
    "                     over them (docs/distributed.md); rank 0 prints, evaluates,\n"
    "                     samples and writes the checkpoint\n"
    "  --zero             with --data-parallel: ZeRO-1, each rank keeps and updates\n"
    "                     its shard of the AdamW moments (every rank then takes part\n"
    "                     in writing the checkpoint; rank 0 writes it)\n"
    "  --help             this text\n"
    "Prints `step N loss X scale S skipped K tok/s T lr L`: N counts every step run\n"
    "(across resumes), X is that step's training loss, S the loss scale, K the steps\n"
    "skipped for inf/NaN gradients. A resumed run needs the same --text, --amp and\n"
    "model flags.\n";

enum { SAMPLE_CHARS = 200, EVAL_BATCHES = 4 };
static const double SAMPLE_TEMPERATURE = 0.8;

typedef struct options {
    const char *text_path, *checkpoint, *device, *dump_ir;
    int steps, batch, log_every, eval_every;
    bool data_parallel, zero;
    alloy_dtype amp; /* ALLOY_F32 = off */
    unsigned long long seed;
    double lr;
    gpt_config model;
} options;

/* The text as token ids and the byte each id stands for. */
typedef struct corpus {
    int *ids;
    long len, train_len; /* ids[0, train_len) train, the rest validate */
    unsigned char byte_of[256];
    int id_of[256]; /* -1 for bytes the text lacks */
} corpus;

static long parse_int(const char *flag, const char *s, long min, long max)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < min || v > max)
        cli_fail(2, "%s wants an integer in [%ld, %ld], got '%s'", flag, min, max, s ? s : "");
    return v;
}

/* Fills o from argv; exits with status 2 and a one-line reason on a bad flag. */
static void parse_args(int argc, char **argv, options *o)
{
    *o = (options){"/usr/share/common-licenses/GPL-3", NULL, "auto", NULL, 300, 32, 10, 100, false, false, ALLOY_F16,
                   1, 3e-3, {0, 64, 128, 2, 4, 512, false}};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(flag, "--help")) { fputs(usage, stdout); exit(0); }
        if (!strcmp(flag, "--data-parallel")) { o->data_parallel = true; continue; }
        if (!strcmp(flag, "--zero")) { o->zero = true; continue; }
        if (strncmp(flag, "--", 2)) cli_fail(2, "unexpected argument '%s' (see --help)", flag);
        if (!val) cli_fail(2, "%s needs a value (see --help)", flag);
        i++;
        if (!strcmp(flag, "--text")) o->text_path = val;
        else if (!strcmp(flag, "--checkpoint")) o->checkpoint = val;
        else if (!strcmp(flag, "--dump-ir")) o->dump_ir = val;
        else if (!strcmp(flag, "--device")) o->device = val;
        else if (!strcmp(flag, "--steps")) o->steps = (int)parse_int(flag, val, 0, 100000000);
        else if (!strcmp(flag, "--seed")) o->seed = (unsigned long long)parse_int(flag, val, 0, 2147483647);
        else if (!strcmp(flag, "--batch")) o->batch = (int)parse_int(flag, val, 1, 65536);
        else if (!strcmp(flag, "--context")) o->model.context = (int)parse_int(flag, val, 1, 65536);
        else if (!strcmp(flag, "--dim")) o->model.dim = (int)parse_int(flag, val, 1, 65536);
        else if (!strcmp(flag, "--layers")) o->model.layers = (int)parse_int(flag, val, 1, 1024);
        else if (!strcmp(flag, "--heads")) o->model.heads = (int)parse_int(flag, val, 1, 65536);
        else if (!strcmp(flag, "--log-every")) o->log_every = (int)parse_int(flag, val, 1, 100000000);
        else if (!strcmp(flag, "--eval-every")) o->eval_every = (int)parse_int(flag, val, 0, 100000000);
        else if (!strcmp(flag, "--lr")) {
            char *end;
            o->lr = strtod(val, &end);
            if (*end || !(o->lr > 0 && o->lr < 10)) cli_fail(2, "--lr wants a number in (0, 10), got '%s'", val);
        } else if (!strcmp(flag, "--amp")) {
            if (!strcmp(val, "f16")) o->amp = ALLOY_F16;
            else if (!strcmp(val, "bf16")) o->amp = ALLOY_BF16;
            else if (!strcmp(val, "off")) o->amp = ALLOY_F32;
            else cli_fail(2, "--amp wants f16, bf16 or off, got '%s'", val);
        } else {
            cli_fail(2, "unknown option %s (see --help)", flag);
        }
    }
    if (o->zero && !o->data_parallel) cli_fail(2, "%s", "--zero needs --data-parallel");
    o->model.mlp_width = 4 * o->model.dim;
}

/* Puts g on --device (the library checks the name). */
static void set_device(alloy_graph *g, const char *device)
{
    if (alloy_graph_set_option(g, "device", device)) cli_fail(2, "--device %s: %s", device, alloy_last_error(g));
}

/* Reads the text, builds the sorted byte vocabulary and splits 90/10. */
static void load_corpus(const char *path, int context, corpus *c, int *vocab)
{
    FILE *f = fopen(path, "rb");
    if (!f) cli_fail(1, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0, got;
    unsigned char *bytes = malloc(cap);
    while (bytes && (got = fread(bytes + len, 1, cap - len, f)) > 0)
        if ((len += got) == cap) bytes = realloc(bytes, cap *= 2);
    if (!bytes || ferror(f)) cli_fail(1, "cannot read %s: %s", path, bytes ? strerror(errno) : "out of memory");
    fclose(f);
    c->len = (long)len;
    c->train_len = c->len * 9 / 10;
    if (c->train_len < context + 2 || c->len - c->train_len < context + 1)
        cli_fail(1, "%s is too short: both splits (90%%/10%%) need more than --context bytes", path);
    bool seen[256] = {false};
    for (size_t i = 0; i < len; i++) seen[bytes[i]] = true;
    *vocab = 0;
    for (int b = 0; b < 256; b++) {
        c->id_of[b] = seen[b] ? *vocab : -1;
        if (seen[b]) c->byte_of[(*vocab)++] = (unsigned char)b;
    }
    if (!(c->ids = malloc(sizeof(int) * len))) cli_fail(1, "out of memory reading %s", path);
    for (size_t i = 0; i < len; i++) c->ids[i] = c->id_of[bytes[i]];
    free(bytes);
}

static double uniform01(unsigned long long *state) { return (double)(cli_next_random(state) >> 11) * 0x1p-53; }

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Window i of a batch starts at starts[i]: tokens are ids[s, s+T), targets ids[s+1, s+T+1). */
static void fill_batch(const corpus *c, const long *starts, int batch, int T, int *tokens, int *targets)
{
    for (int b = 0; b < batch; b++)
        for (int t = 0; t < T; t++) {
            tokens[(size_t)b * T + t] = c->ids[starts[b] + t];
            targets[(size_t)b * T + t] = c->ids[starts[b] + t + 1];
        }
}

/* Mean loss of the f32 evaluation graph over EVAL_BATCHES batches of windows
 * spread evenly over the validation split (the same windows every time). */
static double validation_loss(alloy_graph *eval, const corpus *c, int batch, int T, long *starts, int *tokens,
                              int *targets)
{
    long first = c->train_len, span = c->len - c->train_len - T - 1, n = (long)EVAL_BATCHES * batch;
    double sum = 0;
    for (int e = 0; e < EVAL_BATCHES; e++) {
        for (int b = 0; b < batch; b++) starts[b] = first + span * (e * batch + b) / (n > 1 ? n - 1 : 1);
        fill_batch(c, starts, batch, T, tokens, targets);
        alloy_host_tensor feeds[2] = {{"tokens", ALLOY_I32, 2, {batch, T}, tokens},
                                      {"targets", ALLOY_I32, 1, {(int64_t)batch * T}, targets}};
        alloy_host_tensor loss = {.name = "loss"};
        if (alloy_graph_run(eval, feeds, 2, &loss, 1)) cli_fail(1, "evaluating: %s", alloy_last_error(eval));
        sum += *(const float *)loss.data;
    }
    return sum / EVAL_BATCHES;
}

/* Prints `prompt` and SAMPLE_CHARS sampled characters, running the batch-1
 * graph over the last `context` tokens each time (shorter histories sit at
 * the start of the window: the causal mask keeps the padding unseen). */
static void sample(alloy_graph *g, const corpus *c, const gpt_config *cfg, const int *prompt,
                   int prompt_len, unsigned long long *rng)
{
    int T = cfg->context, V = cfg->vocab;
    int len = 0;
    int *history = malloc(sizeof(int) * (size_t)(prompt_len + SAMPLE_CHARS));
    int *window = calloc((size_t)T, sizeof(int));
    double *prob = malloc(sizeof(double) * (size_t)V);
    if (!history || !window || !prob) cli_fail(1, "%s", "out of memory sampling");
    printf("--- sample (temperature %.1f) ---\n", SAMPLE_TEMPERATURE);
    for (; len < prompt_len; len++) putchar(c->byte_of[history[len] = prompt[len]]);
    for (int n = 0; n < SAMPLE_CHARS; n++) {
        int used = len < T ? len : T;
        memcpy(window, history + len - used, sizeof(int) * (size_t)used);
        alloy_host_tensor feed = {"tokens", ALLOY_I32, 2, {1, T}, window};
        alloy_host_tensor logits = {.name = "logits"};
        if (alloy_graph_run(g, &feed, 1, &logits, 1)) cli_fail(1, "sampling: %s", alloy_last_error(g));
        const float *row = (const float *)logits.data + (size_t)(used - 1) * (size_t)V;
        double max = row[0], total = 0;
        for (int v = 1; v < V; v++) max = row[v] > max ? row[v] : max;
        for (int v = 0; v < V; v++) total += prob[v] = exp((row[v] - max) / SAMPLE_TEMPERATURE);
        double r = uniform01(rng) * total;
        int next = 0;
        while (next < V - 1 && (r -= prob[next]) > 0) next++;
        history[len++] = next;
        putchar(c->byte_of[next]);
    }
    printf("\n---\n");
    free(history), free(window), free(prob);
}

/* Steps already taken by the checkpoint at path (optim.step plus skipped
 * steps), read before the optimizer is built so its schedule continues. */
static long checkpoint_steps(const char *path)
{
    alloy_safetensors *st;
    char err[512];
    if (alloy_safetensors_load(path, &st, err, sizeof err)) cli_fail(1, "%s", err);
    long steps = 0;
    const char *names[2] = {"optim.step", "step.skipped_steps"};
    for (int i = 0; i < 2; i++) {
        const alloy_host_tensor *t = alloy_safetensors_find(st, names[i]);
        if (t && t->dtype == ALLOY_I32 && t->rank == 0) steps += *(const int32_t *)t->data;
    }
    alloy_safetensors_free(st);
    return steps;
}

int main(int argc, char **argv)
{
    cli_set_program("char_gpt");
    options o;
    parse_args(argc, argv, &o);
    corpus text;
    load_corpus(o.text_path, o.model.context, &text, &o.model.vocab);
    const char *problem = gpt_config_problem(&o.model);
    if (problem) cli_fail(1, "%s", problem);
    /* Data-parallel: every rank draws the same batches and trains on its
     * slice of each; the model is built for the slice (B), the batch of the
     * whole step is o.batch. */
    alloy_comm *comm = NULL;
    int rank = 0, ranks = 1;
    if (o.data_parallel) {
        char err[512];
        if (alloy_comm_world(&comm, err, sizeof err)) cli_fail(1, "--data-parallel: %s", err);
        rank = alloy_comm_rank(comm), ranks = alloy_comm_size(comm);
        if (o.batch % ranks) cli_fail(2, "--batch %d does not split over %d ranks", o.batch, ranks);
        if (rank && !freopen("/dev/null", "w", stdout)) cli_fail(1, "%s", "rank > 0: cannot silence stdout");
    }
    int B = o.batch / ranks, T = o.model.context;
    FILE *resume = o.checkpoint ? fopen(o.checkpoint, "rb") : NULL;
    long first_step = resume ? (fclose(resume), checkpoint_steps(o.checkpoint)) : 0;

    /* The training step: forward, loss, backward, loss scaling, AdamW. */
    alloy_graph *train = alloy_graph_new("char_gpt");
    if (!train) cli_fail(1, "%s", "out of memory");
    alloy_graph_set_seed(train, o.seed);
    set_device(train, o.device);
    gpt_model model = gpt_build(train, &o.model, B, true);
    alloy_graph_set_loss(train, model.loss);
    if (o.dump_ir) { /* the graph as built: forward and loss, before any pass */
        FILE *f = fopen(o.dump_ir, "w");
        if (!f) cli_fail(1, "%s: cannot open for writing", o.dump_ir);
        alloy_status st = alloy_graph_dump(train, f, ALLOY_DUMP_SOURCE);
        if (fclose(f) || st) cli_fail(1, "%s: writing the IR failed", o.dump_ir);
        alloy_graph_free(train);
        return 0;
    }
    if (o.amp != ALLOY_F32) alloy_graph_enable_amp(train, o.amp);
    /* f16 has 5 exponent bits: small gradients underflow unless the loss is
     * scaled up first. bf16 has f32's range and needs no scaler. */
    if (o.amp == ALLOY_F16) alloy_graph_set_grad_scaler(train, alloy_dynamic_scaler());
    /* beta2 0.99 rather than 0.999: with 2k tokens a step and a few hundred
     * steps, v must follow the gradients' scale within ~100 steps. Weight
     * decay 0.01 (PyTorch's default) is light because it reaches every
     * parameter, gains and biases too. A warmup keeps the first Adam steps
     * (poor v estimates) small and the cosine decay settles the loss: on
     * GPL-3 they take step 300's loss from about 2.1 (constant lr) to 1.5. */
    alloy_optimizer adamw = alloy_adamw(o.lr, 0.9, 0.99, 1e-8, 0.01);
    long total_steps = first_step + o.steps;
    if (total_steps >= 2) { /* a schedule needs room for a warmup and a decay */
        adamw.schedule = ALLOY_LR_WARMUP_COSINE;
        adamw.total_steps = total_steps > 2000000000 ? 2000000000 : (int)total_steps;
        adamw.warmup_steps = adamw.total_steps / 6 > 0 ? adamw.total_steps / 6 : 1;
        adamw.min_lr = o.lr / 10;
    }
    alloy_graph_add_optimizer(train, adamw);
    if (comm) { /* a peer that dies is an error here within the timeout, not a hang */
        alloy_data_parallel dp = {.timeout_s = 600, .zero_stage = o.zero ? 1 : 0};
        alloy_graph_set_data_parallel(train, comm, &dp);
    }
    if (alloy_graph_status(train)) cli_fail(1, "building the model: %s", alloy_last_error(train));
    if (resume) {
        if (alloy_graph_load_checkpoint(train, o.checkpoint))
            cli_fail(1, "%s (a resumed run needs the same --text, --amp and model flags)", alloy_last_error(train));
        alloy_graph_set_lr(train, o.lr); /* the checkpoint holds the lr it was trained with: --lr wins */
        printf("resumed from %s at step %ld\n", o.checkpoint, first_step);
    }

    /* Same builder and parameter names: f32 forward graphs for validation
     * (same batch) and sampling (batch 1) that share train's parameters: they
     * read what each training step writes, with no copy. */
    alloy_graph *eval = alloy_graph_new("char_gpt_eval"), *sampler = alloy_graph_new("char_gpt_sample");
    if (!eval || !sampler) cli_fail(1, "%s", "out of memory");
    gpt_build(eval, &o.model, B, true);
    gpt_build(sampler, &o.model, 1, false);
    set_device(eval, o.device);
    set_device(sampler, o.device);
    const char *device = alloy_graph_device(train); /* compiles the step (and its kernels) */
    if (!device) cli_fail(1, "%s", alloy_last_error(train));
    alloy_graph *sharers[2] = {eval, sampler};
    for (int k = 0; k < 2; k++) {
        int shared, unshared;
        if (alloy_graph_share_state(sharers[k], train, &shared, &unshared))
            cli_fail(1, "%s", alloy_last_error(sharers[k]));
        if (unshared) cli_fail(1, "%d parameters of the evaluation graphs are not the training graph's", unshared);
    }

    static const char *amp_names[] = {[ALLOY_F32] = "off", [ALLOY_F16] = "f16", [ALLOY_BF16] = "bf16"};
    printf("text %s: %ld bytes, vocab %d (ln %.3f); model: %d layers, dim %d, %d heads, "
           "context %d, batch %d; amp %s\ndevice: %s\n", o.text_path, text.len, o.model.vocab,
           log((double)o.model.vocab), o.model.layers, o.model.dim, o.model.heads, T, o.batch,
           amp_names[o.amp], device);
    if (comm) printf("data-parallel: %d ranks, %d sequences each (local rank %d on this machine)\n", ranks, B,
                     alloy_comm_local_rank(comm));

    int *tokens = malloc(sizeof(int) * (size_t)B * (size_t)T);
    int *targets = malloc(sizeof(int) * (size_t)B * (size_t)T);
    long *starts = malloc(sizeof(long) * (size_t)B);
    if (!tokens || !targets || !starts) cli_fail(1, "%s", "out of memory");
    unsigned long long rng = o.seed * 0x2545F4914F6CDD1Dull + (unsigned long long)first_step;
    alloy_host_tensor feeds[2] = {{"tokens", ALLOY_I32, 2, {B, T}, tokens},
                                  {"targets", ALLOY_I32, 1, {(int64_t)B * T}, targets}};
    int since_log = 0;
    double train_seconds = 0; /* since the last line: batches and steps, not evaluation */
    for (int i = 1; i <= o.steps; i++) {
        double started = now_seconds();
        for (int b = 0; b < o.batch; b++) { /* the step's batch, of which this rank takes [rank B, rank B + B) */
            long s = (long)(cli_next_random(&rng) % (unsigned long long)(text.train_len - T));
            if (b / B == rank) starts[b % B] = s;
        }
        fill_batch(&text, starts, B, T, tokens, targets);
        alloy_step_info info;
        if (alloy_graph_run(train, feeds, 2, NULL, 0) || alloy_graph_step_info(train, &info))
            cli_fail(1, "training: %s", alloy_last_error(train));
        train_seconds += now_seconds() - started;
        long step = first_step + i;
        if (++since_log == o.log_every || i == o.steps) {
            printf("step %ld loss %.4f scale %g skipped %lld tok/s %.0f lr %.2e\n", step, info.loss,
                   info.scale, (long long)info.skipped_steps, (double)since_log * o.batch * T / train_seconds,
                   info.lr);
            fflush(stdout);
            since_log = 0, train_seconds = 0;
        }
        if (o.eval_every && i % o.eval_every == 0 && i != o.steps) {
            printf("step %ld val_loss %.4f\n", step, validation_loss(eval, &text, B, T, starts, tokens, targets));
            fflush(stdout);
        }
    }
    printf("val_loss %.4f\n", validation_loss(eval, &text, B, T, starts, tokens, targets));

    if (o.checkpoint && (rank == 0 || o.zero)) { /* every rank holds the same state; ZeRO-1's shards are gathered */
        if (alloy_graph_save_checkpoint(train, o.checkpoint)) cli_fail(1, "%s", alloy_last_error(train));
        printf("saved checkpoint %s at step %ld\n", o.checkpoint, first_step + o.steps);
    }
    /* A fixed prompt, or the validation text's first bytes if the text lacks its characters. */
    const char *fixed = "The Program ";
    int prompt[16], prompt_len = 0;
    for (const char *p = fixed; *p && prompt_len >= 0; p++)
        prompt_len = text.id_of[(unsigned char)*p] < 0 ? -1 : prompt_len + 1;
    if (prompt_len > 0)
        for (int k = 0; k < prompt_len; k++) prompt[k] = text.id_of[(unsigned char)fixed[k]];
    else
        for (prompt_len = 0; prompt_len < 8; prompt_len++) prompt[prompt_len] = text.ids[text.train_len + prompt_len];
    if (rank == 0) sample(sampler, &text, &o.model, prompt, prompt_len, &rng);

    alloy_graph_free(train), alloy_graph_free(eval), alloy_graph_free(sampler);
    alloy_comm_free(comm); /* finalizes MPI */
    free(text.ids), free(tokens), free(targets), free(starts);
    return 0;
}
