/* fuzz_seeds.c - writes the generated seed corpora: checkpoints and bundles of the training models, small safetensors files of every dtype, builder programs, printed IR. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "alloy/safetensors.h"
#include "codegen/export.h"
#include "runtime/bundle/bundle.h"
#include "runtime/graph/bundle_save.h"
#include "fuzz_support.h"

static const char *outdir;

/* Writes OUTDIR/target/name. */
static void put_file(const char *target, const char *name, const void *data, size_t size)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", outdir, target);
    if (mkdir(path, 0777) != 0 && errno != EEXIST) fuzz_fail("cannot make %s: %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/%s/%s", outdir, target, name);
    if (!fuzz_write_file(path, data, size)) fuzz_fail("cannot write %s", path);
}

/* The bytes of a file (malloc'd) and its size. */
static unsigned char *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) fuzz_fail("cannot open %s", path);
    unsigned char *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n == cap && !(buf = realloc(buf, cap = cap * 2 + 4096))) fuzz_fail("out of memory");
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    fclose(f);
    *size = n;
    return buf;
}

/* The bundle at path with a small CUDA executable section added (per
 * module of the step's kernels a cubin for sm_80 and sm_90 and PTX for
 * compute_80; fake code of the right form: the reader checks the form, not
 * the code) and its real kernel table (section 9, from cg_emit). */
static void put_cuda_bundle(const char *path)
{
    bundle_contents c;
    char err[1024];
    if (bundle_read_file(path, &c, err, sizeof err)) fuzz_fail("%s", err);
    cg_program prog;
    if (cg_emit(c.ir, &c.comp.sched, &prog, err, sizeof err)) fuzz_fail("%s", err);
    uint32_t nm = (uint32_t)cg_module_count(prog.nkernels);
    c.cuda = (bundle_cuda){.min_driver = 12080, .nmodules = nm, .images = al_calloc(3 * nm, sizeof(bundle_image))};
    if (!c.cuda.images) fuzz_fail("out of memory");
    for (uint32_t i = 0; i < 3 * nm; i++) {
        uint32_t kind = i % 3 == 2 ? BUNDLE_PTX : BUNDLE_CUBIN, arch = i % 3 == 1 ? 90 : 80;
        char text[48];
        snprintf(text, sizeof text, "%s%u module %u", kind == BUNDLE_CUBIN ? "\177ELF sm_" : "// compute_", arch,
                 i / 3);
        size_t n = strlen(text) + 1;
        uint8_t *data = al_malloc(n);
        if (!data) fuzz_fail("out of memory");
        memcpy(data, text, n);
        c.cuda.images[c.cuda.nimages++] = (bundle_image){kind, arch, i / 3, data, n};
    }
    if (bundle_kernel_table(&prog, &c.cuda)) fuzz_fail("out of memory");
    cg_program_free(&prog);
    uint8_t *bytes;
    size_t len;
    if (bundle_encode(&c, &bytes, &len, err, sizeof err)) fuzz_fail("%s", err);
    put_file("bundle", "model0_cuda.alloy", bytes, len);
    al_free(bytes);
    bundle_contents_free(&c);
}

/* ---- checkpoint, safetensors and IR seeds from the training models ---- */

static void model_seeds(void)
{
    for (int v = 0; v < FUZZ_TRAIN_MODELS; v++) {
        alloy_graph *g = fuzz_train_model(v);
        if (!g) fuzz_fail("model %d", v);
        alloy_host_tensor feeds[2];
        fuzz_train_feeds(feeds);
        int runs = 0;
        for (int steps = 1; steps <= 3; steps += 2) {
            for (; runs < steps; runs++)
                if (alloy_graph_run(g, feeds, 2, NULL, 0)) fuzz_fail("model %d: %s", v, alloy_last_error(g));
            const char *path = fuzz_tmp_path("seed.safetensors");
            if (alloy_graph_save_checkpoint(g, path)) fuzz_fail("model %d: %s", v, alloy_last_error(g));
            size_t n;
            unsigned char *bytes = slurp(path, &n);
            unsigned char *prefixed = malloc(n + 1);
            if (!prefixed) fuzz_fail("out of memory");
            prefixed[0] = (unsigned char)v;
            memcpy(prefixed + 1, bytes, n);
            char name[64];
            snprintf(name, sizeof name, "model%d_step%d", v, steps);
            put_file("checkpoint", name, prefixed, n + 1);
            put_file("safetensors", name, bytes, n);
            free(prefixed);
            free(bytes);
        }
        const char *bpath = fuzz_tmp_path("seed.alloy"); /* the model's training step as a bundle */
        if (alloy_graph_save_bundle(g, bpath, NULL)) fuzz_fail("model %d: %s", v, alloy_last_error(g));
        size_t bn;
        unsigned char *bundle = slurp(bpath, &bn);
        char bname[64];
        snprintf(bname, sizeof bname, "model%d.alloy", v);
        put_file("bundle", bname, bundle, bn);
        free(bundle);
        if (v == 0) put_cuda_bundle(bpath);
        if (v == 0) { /* and with its state (section 7: the trained state as safetensors bytes) */
            if (alloy_graph_save_bundle_flags(g, bpath, NULL, ALLOY_BUNDLE_WITH_STATE))
                fuzz_fail("model %d: %s", v, alloy_last_error(g));
            size_t sn;
            unsigned char *with_state = slurp(bpath, &sn);
            put_file("bundle", "model0_state.alloy", with_state, sn);
            free(with_state);
        }
        for (int kind = ALLOY_DUMP_SOURCE; kind <= ALLOY_DUMP_IR; kind++) {
            char *text = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&text, &len);
            if (!f || alloy_graph_dump(g, f, (alloy_dump_kind)kind)) fuzz_fail("dump of model %d", v);
            fclose(f);
            char name[64];
            snprintf(name, sizeof name, "model%d_%s.ir", v, kind == ALLOY_DUMP_SOURCE ? "source" : "compiled");
            put_file("ir", name, text, len);
            free(text);
        }
        alloy_graph_free(g);
    }
}

/* One tensor of every dtype and a few shapes (rank 0, an empty dim, rank 8), with metadata. */
static void safetensors_seeds(void)
{
    static unsigned char bytes[256];
    for (int i = 0; i < 256; i++) bytes[i] = (unsigned char)(i * 37 + 11);
    alloy_host_tensor ts[ALLOY_DTYPE_COUNT + 3];
    const char *names[] = {"f32", "f16", "bf16", "f64", "i32", "i64", "bool", "scalar", "empty", "rank8"};
    int n = 0;
    for (int d = 0; d < ALLOY_DTYPE_COUNT; d++)
        ts[n] = (alloy_host_tensor){names[n], (alloy_dtype)d, 2, {2, 3}, bytes}, n++;
    ts[n] = (alloy_host_tensor){names[n], ALLOY_F32, 0, {0}, bytes}, n++;
    ts[n] = (alloy_host_tensor){names[n], ALLOY_I64, 2, {3, 0}, bytes}, n++;
    ts[n] = (alloy_host_tensor){names[n], ALLOY_BOOL, 8, {1, 2, 1, 2, 1, 2, 1, 2}, bytes}, n++;
    const char *keys[] = {"format", "alloy.note"}, *values[] = {"pt", "seed \"quoted\" \\ \xc3\xa9"};
    const char *path = fuzz_tmp_path("seed.safetensors");
    char err[512];
    for (int k = 0; k < 3; k++) {
        int count = k == 0 ? n : k == 1 ? 1 : 0;
        if (alloy_safetensors_save(path, ts, count, keys, values, k == 2 ? 0 : 2, err, sizeof err))
            fuzz_fail("%s", err);
        size_t size;
        unsigned char *file = slurp(path, &size);
        char name[32];
        snprintf(name, sizeof name, "dtypes%d", k);
        put_file("safetensors", name, file, size);
        free(file);
    }
}

/* ---- builder programs ---- */

typedef struct prog {
    unsigned char b[4096];
    size_t n;
    int made; /* tensors the program has made: t(id) refers to the id-th */
} prog;

static void by(prog *p, int v)
{
    if (p->n == sizeof p->b) fuzz_fail("builder seed too long");
    p->b[p->n++] = (unsigned char)v;
}
static void bys(prog *p, int count, ...)
{
    va_list ap;
    va_start(ap, count);
    for (int i = 0; i < count; i++) by(p, va_arg(ap, int));
    va_end(ap);
}
static void t(prog *p, int id) { by(p, p->made - 1 - id); }
static void name(prog *p, const char *s)
{
    by(p, (int)strlen(s));
    while (*s) by(p, *s++);
}
/* rank and dims (each -128..127) */
static void shape(prog *p, int rank, const int *dims)
{
    by(p, rank);
    for (int i = 0; i < rank; i++) by(p, dims[i] & 0xff);
}
/* Indices into fuzz_real's table. */
enum { R0, R1, RM1, RHALF, R2, R1EM3, R1EM8, R09, R0999, R65536, R1E30, RM1E30, RINF, RMINF, RNAN, R3 };
/* Each call that makes a tensor returns its id. */
static int input(prog *p, const char *nm, alloy_dtype dt, int rank, const int *dims)
{
    by(p, FB_INPUT), name(p, nm), by(p, dt), shape(p, rank, dims);
    return p->made++;
}
static int param(prog *p, const char *nm, alloy_dtype dt, int rank, const int *dims, alloy_init_kind k, int a, int b)
{
    by(p, FB_PARAM), name(p, nm), by(p, dt), shape(p, rank, dims), bys(p, 3, k, a, b);
    return p->made++;
}
static int op1(prog *p, int fb, int which, int x)
{
    by(p, fb), by(p, which), t(p, x);
    return p->made++;
}
static int op2(prog *p, int fb, int which, int a, int b)
{
    by(p, fb);
    if (which >= 0) by(p, which);
    t(p, a), t(p, b);
    return p->made++;
}

static void mlp_training(prog *p)
{
    by(p, 1); /* seed */
    int x = input(p, "x", ALLOY_F32, 2, (int[]){4, 3});
    int y = input(p, "y", ALLOY_I32, 1, (int[]){4});
    int w1 = param(p, "w1", ALLOY_F32, 2, (int[]){3, 5}, ALLOY_INIT_KAIMING_UNIFORM, R2, R0);
    int b1 = param(p, "b1", ALLOY_F32, 1, (int[]){5}, ALLOY_INIT_ZEROS, R0, R0);
    int h = op2(p, FB_MATMUL, -1, x, w1);
    by(p, 0); /* no transposes */
    h = op2(p, FB_BINARY, 0, h, b1);
    h = op1(p, FB_UNARY, 1, h); /* relu */
    int w2 = param(p, "w2", ALLOY_F32, 2, (int[]){5, 2}, ALLOY_INIT_XAVIER_UNIFORM, R1, R0);
    int logits = op2(p, FB_MATMUL, -1, h, w2);
    by(p, 0);
    int loss = op2(p, FB_CROSS_ENTROPY, -1, logits, y);
    by(p, FB_OUTPUT), name(p, "logits"), t(p, logits);
    by(p, FB_SET_LOSS), t(p, loss);
}

static void builder_seeds(void)
{
    prog p = {0};
    /* 1: an MLP trained with f16 AMP, a dynamic scaler and AdamW; state read and written, saved and loaded */
    mlp_training(&p);
    bys(&p, 2, FB_AMP, ALLOY_F16);
    bys(&p, 7, FB_SCALER, ALLOY_SCALER_DYNAMIC, R65536, R2, RHALF, 3, R0);
    bys(&p, 15, FB_OPTIMIZER, ALLOY_OPTIM_ADAMW, R1EM3, R0, 0, R09, R0999, R1EM8, R1EM3, ALLOY_LR_WARMUP_COSINE, 2, 10,
        R0, R1, 1);
    bys(&p, 8, FB_RUN, 2, FB_RUN, 4, FB_STATE, 0, FB_SAVE_LOAD, FB_RUN);
    by(&p, 4);
    put_file("builder", "mlp_adamw_f16", p.b, p.n);

    /* 2: the same with bf16, a static scaler, SGD over two micro-batches, a frozen weight, a fetched input gradient */
    p = (prog){0};
    mlp_training(&p);
    bys(&p, 2, FB_AMP, ALLOY_BF16);
    bys(&p, 7, FB_SCALER, ALLOY_SCALER_STATIC, R65536, R2, RHALF, 3, R0);
    bys(&p, 15, FB_OPTIMIZER, ALLOY_OPTIM_SGD, RHALF, R09, 1, R0, R0, R0, R1EM3, ALLOY_LR_WARMUP_LINEAR, 3, 0, R0,
        R0, 2);
    by(&p, FB_FREEZE), t(&p, 2);        /* w1 */
    by(&p, FB_REQUEST_GRAD), t(&p, 0);  /* x */
    bys(&p, 3, FB_OPTION, 0, 3);        /* no_fuse=all */
    bys(&p, 6, FB_RUN, 6, FB_RUN, 8, FB_TRAINING, 0);
    bys(&p, 2, FB_RUN, 10);
    put_file("builder", "mlp_sgd_bf16", p.b, p.n);

    /* 3: the other ops, forward only, in f32 and f64 */
    p = (prog){0};
    by(&p, 2);
    int a = input(&p, "a", ALLOY_F32, 3, (int[]){2, 3, 4});
    int s = op1(&p, FB_SOFTMAX, 0, a);
    by(&p, 0xff); /* axis -1 */
    int ls = op1(&p, FB_SOFTMAX, 1, a);
    by(&p, 1);
    int sum = op1(&p, FB_REDUCE, 0, s);
    bys(&p, 3, 1, 1, 1); /* one axis, 1, keepdims */
    int mean = op1(&p, FB_REDUCE, 1, ls);
    bys(&p, 2, 255, 0); /* all axes */
    int mx = op1(&p, FB_REDUCE, 2, a);
    bys(&p, 4, 2, 0, 0xff, 0);
    int gamma = param(&p, "gamma", ALLOY_F32, 1, (int[]){4}, ALLOY_INIT_ONES, R0, R0);
    int beta = param(&p, "beta", ALLOY_F32, 1, (int[]){4}, ALLOY_INIT_NORMAL, R0, R1EM3);
    by(&p, FB_LAYER_NORM), t(&p, a), t(&p, gamma), t(&p, beta), by(&p, R1EM3);
    int ln = p.made++;
    by(&p, FB_RMS_NORM), t(&p, ln), t(&p, gamma), by(&p, R1EM8);
    int rn = p.made++;
    by(&p, FB_RESHAPE), t(&p, rn), shape(&p, 2, (int[]){-1, 4});
    int r2 = p.made++;
    by(&p, FB_TRANSPOSE), t(&p, r2), bys(&p, 9, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    int tr = p.made++;
    by(&p, FB_SLICE), t(&p, tr), bys(&p, 3, 1, 1, 0xfe); /* axis 1, [1:-2] */
    int sl = p.made++;
    by(&p, FB_CONCAT), by(&p, 2), t(&p, sl), t(&p, sl), by(&p, 1);
    int cc = p.made++;
    by(&p, FB_BROADCAST_TO), t(&p, mx), shape(&p, 3, (int[]){3, 2, 3});
    int bc = p.made++;
    by(&p, FB_CAST), t(&p, cc), by(&p, ALLOY_F16);
    int half = p.made++;
    int gt = op2(&p, FB_BINARY, 11, a, s); /* greater */
    int wh = 0;
    by(&p, FB_WHERE), t(&p, gt), t(&p, a), t(&p, ls), wh = p.made++;
    int ids = input(&p, "ids", ALLOY_I64, 1, (int[]){3});
    int table = param(&p, "table", ALLOY_F64, 2, (int[]){9, 4}, ALLOY_INIT_UNIFORM, RM1, R1);
    int emb = op2(&p, FB_EMBEDDING, -1, ids, table);
    int sq = param(&p, "sq", ALLOY_F32, 2, (int[]){4, 4}, ALLOY_INIT_CONSTANT, R3, R0);
    int cm = op1(&p, FB_UNARY, 12, sq); /* causal_mask */
    int e = op1(&p, FB_UNARY, 7, cm);   /* exp */
    int c = 0;
    by(&p, FB_CONSTANT), by(&p, ALLOY_F32), shape(&p, 1, (int[]){3}), bys(&p, 3, R1, RHALF, RNAN), c = p.made++;
    by(&p, FB_SCALAR), bys(&p, 2, ALLOY_F64, R3);
    p.made++;
    const int outs[] = {sum, mean, half, bc, wh, emb, e, c};
    for (int i = 0; i < 8; i++) {
        char nm[8];
        snprintf(nm, sizeof nm, "o%d", i);
        by(&p, FB_OUTPUT), name(&p, nm), t(&p, outs[i]);
    }
    by(&p, FB_RUN), by(&p, 12);
    put_file("builder", "ops_forward", p.b, p.n);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUTDIR\n  writes OUTDIR/{checkpoint,safetensors,builder,ir,bundle}/ seeds\n", argv[0]);
        return 2;
    }
    outdir = argv[1];
    if (mkdir(outdir, 0777) != 0 && errno != EEXIST) fuzz_fail("cannot make %s: %s", outdir, strerror(errno));
    model_seeds();
    safetensors_seeds();
    builder_seeds();
    return 0;
}
