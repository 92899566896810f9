/* fuzz_support.c - scratch files, CPU options, feeds and one checked run, the training models of the checkpoint target. */
#include "fuzz_support.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/graph/graph_impl.h"

_Noreturn void fuzz_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

/* ---- scratch files ---- */

static char scratch_dir[256];
static char scratch_names[8][64];
static int scratch_count;

static void scratch_cleanup(void)
{
    char path[384];
    for (int i = 0; i < scratch_count; i++) {
        snprintf(path, sizeof path, "%s/%s", scratch_dir, scratch_names[i]);
        unlink(path);
    }
    rmdir(scratch_dir);
}

const char *fuzz_tmp_path(const char *name)
{
    static char path[384];
    if (!scratch_dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
        if (!base || !*base) base = "/tmp";
        snprintf(scratch_dir, sizeof scratch_dir, "%s/alloy-fuzz-XXXXXX", base);
        if (!mkdtemp(scratch_dir)) fuzz_fail("cannot make a scratch directory in %s", base);
        atexit(scratch_cleanup);
    }
    int i = 0;
    while (i < scratch_count && strcmp(scratch_names[i], name) != 0) i++;
    if (i == scratch_count) {
        if (scratch_count == 8 || strlen(name) >= sizeof scratch_names[0]) fuzz_fail("scratch name '%s'", name);
        strcpy(scratch_names[scratch_count++], name);
    }
    snprintf(path, sizeof path, "%s/%s", scratch_dir, name);
    return path;
}

bool fuzz_write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && ok;
}

/* ---- graphs ---- */

void fuzz_cpu_options(alloy_graph *g)
{
    static const char *const opts[][2] = {{"device", "cpu"}, {"cache", "0"}, {"num_threads", "1"}, {"blas", "0"}};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (alloy_graph_set_option(g, opts[i][0], opts[i][1]))
            fuzz_fail("option %s=%s: %s", opts[i][0], opts[i][1], alloy_last_error(g));
}

bool fuzz_graph_small(const alloy_graph *g)
{
    const ir_graph *ir = g->ir;
    if (ir->nnodes > FUZZ_MAX_NODES) return false;
    for (int i = 0; i < ir->nnodes; i++) {
        int64_t n = ir_numel(&ir->nodes[i]->type);
        if (n < 0 || n > FUZZ_MAX_NUMEL) return false;
    }
    return true;
}

bool fuzz_built_ok(const alloy_graph *g) { return !g->ir->status; }

uint64_t fuzz_hash(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Element i of a feed: see fuzz_make_feeds. */
static void fill(alloy_host_tensor *t, int64_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = splitmix(&s);
        double v = ((double)(r >> 11) / 9007199254740992.0) * 4.0 - 2.0;
        if ((seed & 1) && r % 61 == 0) v = r % 2 ? INFINITY : NAN;
        int64_t k = seed & 1 ? (int64_t)(r % 10) - 1 : (int64_t)(r % 2); /* [-1, 8] or [0, 1] */
        switch (t->dtype) {
        case ALLOY_F32: ((float *)t->data)[i] = (float)v; break;
        case ALLOY_F64: ((double *)t->data)[i] = v; break;
        case ALLOY_F16:
        case ALLOY_BF16: ((uint16_t *)t->data)[i] = (uint16_t)(r >> 48); break; /* any bits, NaNs too */
        case ALLOY_I32: ((int32_t *)t->data)[i] = (int32_t)k; break;
        case ALLOY_I64: ((int64_t *)t->data)[i] = k; break;
        case ALLOY_BOOL: ((uint8_t *)t->data)[i] = (uint8_t)(r & 1); break;
        default: break;
        }
    }
}

int fuzz_make_feeds(alloy_graph *g, uint64_t seed, alloy_host_tensor **out)
{
    int n = alloy_graph_input_count(g);
    *out = calloc((size_t)n + 1, sizeof **out);
    if (!*out) return -1;
    for (int i = 0; i < n; i++) {
        alloy_host_tensor *t = &(*out)[i];
        if (alloy_graph_input_at(g, i, t)) fuzz_fail("input %d of %d not found", i, n);
        int64_t numel = alloy_host_tensor_numel(t);
        if (numel < 0 || numel > FUZZ_MAX_NUMEL) {
            fuzz_feeds_free(*out, i);
            return -1;
        }
        t->data = calloc((size_t)numel + 1, alloy_dtype_size(t->dtype));
        if (!t->data) {
            fuzz_feeds_free(*out, i);
            return -1;
        }
        fill(t, numel, seed + (uint64_t)i);
    }
    return n;
}

void fuzz_feeds_free(alloy_host_tensor *feeds, int n)
{
    for (int i = 0; i < n; i++) free(feeds[i].data);
    free(feeds);
}

alloy_status fuzz_run_once(alloy_graph *g, uint64_t seed)
{
    alloy_host_tensor *feeds;
    int nfeeds = fuzz_make_feeds(g, seed, &feeds);
    if (nfeeds < 0) return ALLOY_ERR_OOM;
    int nfetch = alloy_graph_output_count(g);
    alloy_host_tensor *fetches = calloc((size_t)nfetch + 1, sizeof *fetches);
    if (!fetches) {
        fuzz_feeds_free(feeds, nfeeds);
        return ALLOY_ERR_OOM;
    }
    for (int i = 0; i < nfetch; i++) fetches[i].name = alloy_graph_output_name(g, i);
    alloy_status st = alloy_graph_run(g, feeds, nfeeds, fetches, nfetch);
    if (st && !alloy_last_error(g)[0]) fuzz_fail("alloy_graph_run failed (%s) without a message", alloy_status_name(st));
    volatile uint64_t h = 0;
    for (int i = 0; !st && i < nfetch; i++) {
        const alloy_host_tensor *t = &fetches[i];
        int64_t numel = alloy_host_tensor_numel(t);
        if (numel < 0 || (numel > 0 && !t->data))
            fuzz_fail("fetch '%s': %lld elements at %p", t->name, (long long)numel, t->data);
        h = fuzz_hash(h, t->data, (size_t)numel * alloy_dtype_size(t->dtype));
    }
    free(fetches);
    fuzz_feeds_free(feeds, nfeeds);
    return st;
}

/* ---- the checkpoint target's models ---- */

alloy_graph *fuzz_train_model(int variant)
{
    alloy_graph *g = alloy_graph_new("fuzz_train");
    if (!g) return NULL;
    fuzz_cpu_options(g);
    alloy_graph_set_seed(g, 7);
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 2, (const int64_t[]){4, 3});
    alloy_tensor *y = alloy_input(g, "y", ALLOY_I32, 1, (const int64_t[]){4});
    alloy_tensor *w1 = alloy_param(g, "fc1.weight", ALLOY_F32, 2, (const int64_t[]){3, 5},
                                   alloy_init_kaiming_uniform(sqrt(2.0)));
    alloy_tensor *b1 = alloy_param(g, "fc1.bias", ALLOY_F32, 1, (const int64_t[]){5}, alloy_init_zeros());
    alloy_tensor *w2 = alloy_param(g, "fc2.weight", ALLOY_F32, 2, (const int64_t[]){5, 2},
                                   alloy_init_xavier_uniform(1.0));
    alloy_tensor *b2 = alloy_param(g, "fc2.bias", ALLOY_F32, 1, (const int64_t[]){2}, alloy_init_zeros());
    alloy_tensor *h = alloy_add(g, alloy_matmul(g, x, w1, false, false), b1);
    if (variant == 2) {
        alloy_tensor *gamma = alloy_param(g, "ln.weight", ALLOY_F32, 1, (const int64_t[]){5}, alloy_init_ones());
        alloy_tensor *beta = alloy_param(g, "ln.bias", ALLOY_F32, 1, (const int64_t[]){5}, alloy_init_zeros());
        h = alloy_layer_norm(g, h, gamma, beta, 1e-5);
    }
    h = alloy_relu(g, h);
    alloy_tensor *logits = alloy_add(g, alloy_matmul(g, h, w2, false, false), b2);
    alloy_tensor *loss = alloy_cross_entropy(g, logits, y);
    alloy_output(g, "logits", logits);
    alloy_graph_set_loss(g, loss);
    alloy_optimizer opt;
    switch (variant) {
    case 0:
        alloy_graph_enable_amp(g, ALLOY_F16);
        alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler());
        opt = alloy_adamw(1e-2, 0.9, 0.99, 1e-8, 0.01);
        opt.schedule = ALLOY_LR_WARMUP_COSINE;
        opt.warmup_steps = 2;
        opt.total_steps = 20;
        opt.min_lr = 1e-4;
        opt.clip_norm = 1.0;
        break;
    case 1:
        opt = alloy_sgd(0.1, 0.9, 1e-4, true);
        opt.accumulation_steps = 2;
        break;
    default:
        alloy_graph_enable_amp(g, ALLOY_BF16);
        alloy_graph_set_grad_scaler(g, alloy_static_scaler(1024.0));
        opt = alloy_adam(1e-2, 0.9, 0.999, 1e-8, 0.0);
        break;
    }
    alloy_graph_add_optimizer(g, opt);
    if (alloy_graph_status(g)) {
        fprintf(stderr, "fuzz_train_model %d: %s\n", variant, alloy_last_error(g));
        alloy_graph_free(g);
        return NULL;
    }
    return g;
}

void fuzz_train_feeds(alloy_host_tensor feeds[2])
{
    static float x[12] = {0.5f, -1.0f, 2.0f, 1.5f, 0.25f, -0.75f, -2.0f, 1.0f, 0.0f, 0.125f, 3.0f, -0.5f};
    static int32_t y[4] = {0, 1, 1, 0};
    feeds[0] = (alloy_host_tensor){"x", ALLOY_F32, 2, {4, 3}, x};
    feeds[1] = (alloy_host_tensor){"y", ALLOY_I32, 1, {4}, y};
}
