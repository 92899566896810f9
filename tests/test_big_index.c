/* test_big_index.c - 64-bit indexes in the generated kernels: a static check of the emitted sources for index arithmetic narrowed to 32 bits (index_width.c), and launches at full GPT-2 sizes (over 2^31 elements) that run only chosen blocks (ALLOY_EMU_BLOCKS) over reserved, lazily filled memory, each written element against an fp64 reference. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "codegen/emit.h"
#include "cuda_emu/emu_blocks.h"
#include "cuda_emu/emu_loader.h"
#include "index_width.h"
#include "models.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* GPT-2's vocabulary over B44 T1024 rows: 45056 x 50257 = 2,264,379,392 elements, past 2^31
 * (B32's logits, 1.65e9 elements, pass 2^31 only in bytes). */
enum { VOCAB = 50257, ROWS = 45056 };
#define NUMEL ((int64_t)ROWS * VOCAB)

/* ---- the static check ---- */

static int scan_program(const cg_program *p, const char *what, char *report, size_t len)
{
    int found = 0;
    for (int k = 0; k < p->nkernels; k++)
        found += iw_scan(p->kernels[k].name, p->kernels[k].source, p->kernels[k].body, report, len);
    print_message("%s: %d kernels scanned, %d findings\n", what, p->nkernels, found);
    return found;
}

/* g's training step (AdamW; with amp, AMP in it and the dynamic scaler for f16) compiled and emitted. */
static void emit_training(alloy_graph *g, alloy_dtype amp, cg_program *prog, const char *what)
{
    assert_int_equal(alloy_graph_set_training(g, true), ALLOY_OK);
    if (amp != ALLOY_F32) assert_int_equal(alloy_graph_enable_amp(g, amp), ALLOY_OK);
    if (amp == ALLOY_F16) assert_int_equal(alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), ALLOY_OK);
    assert_int_equal(alloy_graph_add_optimizer(g, alloy_adamw(6e-4, 0.9, 0.95, 1e-8, 0.1)), ALLOY_OK);
    if (graph_compile_ir(g)) fail_msg("%s: %s", what, alloy_last_error(g));
    char err[1024];
    if (cg_emit(g->compiled, &g->comp.sched, prog, err, sizeof err)) fail_msg("%s: %s", what, err);
}

static alloy_graph *load_example(const char *file)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%s", ALLOY_EXAMPLES_IR, file);
    alloy_graph *g = alloy_graph_load_ir(path, err, sizeof err);
    if (!g) fail_msg("%s", err);
    return g;
}

static alloy_graph *parse(const char *ir)
{
    char err[1024];
    alloy_graph *g = alloy_graph_parse(ir, strlen(ir), "big_index.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    return g;
}

/* An elementwise step over the big shape: y = x * x + b, b broadcast over rows (index div/mod). */
static const char ew_ir[] = "graph big_ew {\n"
                            "  %x = input : f16[45056,50257]\n"
                            "  %b = input : f16[50257]\n"
                            "  %xx = mul(%x, %x) : f16[45056,50257]\n"
                            "  %y = add(%xx, %b) : f16[45056,50257]\n"
                            "  output \"y\" = %y\n"
                            "}\n";
/* A row step over the big shape: softmax along GPT-2's vocabulary. */
static const char row_ir[] = "graph big_softmax {\n"
                             "  %x = input : f16[45056,50257]\n"
                             "  %y = softmax(%x) {axis=-1} : f16[45056,50257]\n"
                             "  output \"y\" = %y\n"
                             "}\n";

/* GPT-2 small's loss at B32 T1024: cross-entropy over f16 logits [32768, 50257] (1.65e9 elements,
 * 3.3e9 bytes: past 2^31 in bytes), one row kernel writing each row's loss and weight. */
enum { CE_ROWS = 32768 };
static const char ce_ir[] = "graph big_ce {\n"
                            "  %logits = input : f16[32768,50257]\n"
                            "  %targets = input : i32[32768]\n"
                            "  %loss = cross_entropy(%logits, %targets) : f16[]\n"
                            "  output \"loss\" = %loss\n"
                            "}\n";

static void test_no_generated_kernel_narrows_a_64_bit_index(void **state)
{
    (void)state;
    static const char *const files[] = {"char_gpt.ir", "mlp_classifier.ir"};
    static const alloy_dtype amps[] = {ALLOY_F32, ALLOY_F16, ALLOY_BF16};
    size_t len = 1 << 16;
    char *report = test_calloc(len, 1), what[96];
    int found = 0, kernels = 0;
    for (int f = 0; f < 4; f++)
        for (int a = 0; a < 3; a++) {
            alloy_graph *g;
            if (f < 2) {
                g = load_example(files[f]);
                snprintf(what, sizeof what, "%s %s", files[f], alloy_dtype_name(amps[a]));
            } else if (f == 2) { /* the small CNN at batch 32 */
                g = alloy_graph_new("cnn");
                test_cnn c = build_cnn(g, ALLOY_F32, 32, 8, 16);
                assert_int_equal(alloy_graph_set_loss(g, c.loss), ALLOY_OK);
                snprintf(what, sizeof what, "CNN B32 %s", alloy_dtype_name(amps[a]));
            } else { /* GPT-2 small's block and head at B32 T1024: logits of 1.65e9 elements */
                g = alloy_graph_new("gpt2_b32");
                test_block b = build_transformer_block(g, ALLOY_F32, 32, 1024, VOCAB, 768, 12);
                assert_int_equal(alloy_graph_set_loss(g, b.loss), ALLOY_OK);
                snprintf(what, sizeof what, "GPT-2 block B32 T1024 %s", alloy_dtype_name(amps[a]));
            }
            cg_program prog = {0};
            emit_training(g, amps[a], &prog, what);
            found += scan_program(&prog, what, report, len);
            kernels += prog.nkernels;
            cg_program_free(&prog);
            alloy_graph_free(g);
        }
    const char *const big[] = {ew_ir, row_ir, ce_ir};
    static const char *const big_names[] = {"x * x + b over 45056 x 50257", "softmax over 45056 x 50257",
                                            "cross-entropy over 32768 x 50257"};
    for (int i = 0; i < 3; i++) {
        alloy_graph *g = parse(big[i]);
        if (graph_compile_ir(g)) fail_msg("%s", alloy_last_error(g));
        cg_program prog = {0};
        char err[1024];
        if (cg_emit(g->compiled, &g->comp.sched, &prog, err, sizeof err)) fail_msg("%s", err);
        found += scan_program(&prog, big_names[i], report, len);
        kernels += prog.nkernels;
        cg_program_free(&prog);
        alloy_graph_free(g);
    }
    print_message("%d kernels scanned\n", kernels);
    if (found) {
        print_message("%s", report);
        fail_msg("%d 32-bit index expressions in generated kernels (listed above)", found);
    }
    test_free(report);
}

/* Kernels that narrow an index, each in one of the ways the check knows, and one that does not. */
static const struct {
    const char *body;
    int findings;
} narrowing[] = {
    {"{ int i = blockIdx.x * blockDim.x + threadIdx.x; y[i] = x[i]; }", 2},     /* product, and its int */
    {"{ long long i = blockIdx.x * 256 + threadIdx.x; y[i] = x[i]; }", 1},      /* product in 32 bits */
    {"{ long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; unsigned o = e * 3; y[o] = 0; }", 1},
    {"{ long long e = (long long)blockIdx.x * blockDim.x; for (int j = 0; j < 3000000000ll; j++) y[e + j] = 0; }", 1},
    {"{ long long n = 5000000000ll; for (int j = threadIdx.x; j < n; j += 256) y[j] = 0; }", 1},
    {"{ long long e = (long long)blockIdx.x * blockDim.x; y[(int)(e + 1)] = 0; }", 1},
    {"{ const int row = threadIdx.x; p1[row * 50257 + 3] = p0[row]; }", 1},     /* 32-bit subscript */
    {"{ const int g = threadIdx.x; alloy_vcopy<16>(p1 + g * 8, p0 + (long long)g * 8); }", 1}, /* offset */
    {"{ long long e = (long long)blockIdx.x * blockDim.x; int o = 0; o += e * 2; p1[o] = 0; }", 1}, /* later */
    {"{ const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; const int c = e % 768;\n"
     "  const int lane = threadIdx.x & 31; p1[e * 2ll + lane] = p0[(long long)c * 4]; }", 0},
    {"{ long long e = (long long)blockIdx.x * blockDim.x; y[(int)e] = 0; /* int: e < 2^20 here */ }", 0},
};

static void test_the_static_check_names_each_narrowed_index(void **state)
{
    (void)state;
    char report[4096], src[1024];
    for (size_t i = 0; i < sizeof narrowing / sizeof narrowing[0]; i++) {
        report[0] = 0;
        int n = snprintf(src, sizeof src, "// preamble\nextern \"C\" __global__ void k(float *p0, float *p1, float *x, "
                                          "float *y)\n");
        snprintf(src + n, sizeof src - (size_t)n, "%s\n", narrowing[i].body);
        int found = iw_scan("k", src, 12, report, sizeof report);
        print_message("case %zu: %s", i, report[0] ? report : "no finding\n");
        assert_int_equal(found, narrowing[i].findings);
        if (found) assert_non_null(strstr(report, "kernel k line 3: `"));
    }
}

/* ---- the block selection ---- */

static void test_emu_blocks_picks_first_last_listed_and_seeded_blocks(void **state)
{
    (void)state;
    uint64_t b[EMU_BLOCKS_MAX], c[EMU_BLOCKS_MAX];
    assert_int_equal(emu_blocks_pick(NULL, 10, b), -1);
    assert_int_equal(emu_blocks_pick("", 10, b), -1);
    assert_int_equal(emu_blocks_pick("last,first,7,7,12", 10, b), 3);
    assert_true(b[0] == 0 && b[1] == 7 && b[2] == 9);
    int n = emu_blocks_pick("random:5:42", 8845232, b);
    assert_int_equal(n, 5);
    assert_int_equal(emu_blocks_pick("random:5:42", 8845232, c), 5);
    assert_memory_equal(b, c, sizeof b[0] * 5); /* the same seed, the same blocks */
    for (int i = 1; i < 5; i++) assert_true(b[i - 1] < b[i] && b[i] < 8845232);
    assert_int_equal(emu_blocks_pick("random:3:1", 2, b), 2); /* no more than the grid has */
    assert_int_equal(emu_blocks_pick("first,lst", 10, b), -2);
    assert_int_equal(emu_blocks_pick("random:5", 10, b), -2);
    assert_int_equal(emu_blocks_pick("random:65:1", 1000, b), -2);
}

/* ---- lazily filled device memory ---- */

/* A buffer reserved (PROT_NONE, MAP_NORESERVE) between guard zones of 16 GiB, 256-byte aligned and
 * ending within 256 bytes of the upper guard: a page is made readable and filled on its first touch, inputs with value(id, i),
 * outputs with 0xff bytes (a NaN that no kernel stores); a touch in a guard zone is an access out
 * of range, recorded. */
typedef struct lazy_buf {
    char *map, *base;
    size_t map_len, bytes;
    int id;
    bool output, ints; /* ints: i32 targets, target(i) */
    uint8_t *touched; /* a bit per page of [map, map + map_len) */
} lazy_buf;

enum { MAX_BUFS = 4 };
#define GUARD ((size_t)16 << 30)
static lazy_buf bufs[MAX_BUFS];
static int nbufs;
static size_t page;
static volatile sig_atomic_t stray_count;
static char *volatile stray_at;
static struct sigaction old_segv;

/* Input element i of buffer id: a multiple of 1/256 in [-2, 2), exact in f16. */
static double value(int id, int64_t i)
{
    uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull + (uint64_t)id * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 29)) * 0x94d049bb133111ebull;
    return (double)((z >> 40) & 1023) / 256.0 - 2.0;
}

/* Target i of the cross-entropy rows: a class in [0, VOCAB). */
static int32_t target(int64_t i)
{
    uint64_t z = (uint64_t)i * 0xd1b54a32d192ed03ull + 0x8cb92ba72f3d8dd7ull;
    z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
    return (int32_t)((z >> 33) % VOCAB);
}

/* f16 bits of a value exact in f16 (|v| < 2, a multiple of 1/256; normal or 0). */
static uint16_t half_bits(double v)
{
    uint16_t sign = v < 0 ? 0x8000 : 0;
    v = fabs(v);
    if (v == 0) return sign;
    int e;
    double m = frexp(v, &e); /* v = m 2^e, m in [0.5, 1) */
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((int)(m * 2048.0) & 0x3ff));
}

static double half_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return h & 0x8000 ? -v : v;
}

static void on_fault(int sig, siginfo_t *info, void *uctx)
{
    (void)sig;
    (void)uctx;
    char *at = (char *)info->si_addr;
    for (int i = 0; i < nbufs; i++) {
        lazy_buf *b = &bufs[i];
        if (at < b->map || at >= b->map + b->map_len) continue;
        char *pg = b->map + (size_t)(at - b->map) / page * page;
        if (mprotect(pg, page, PROT_READ | PROT_WRITE) != 0) break;
        size_t n = (size_t)(pg - b->map) / page;
        b->touched[n / 8] |= (uint8_t)(1u << n % 8);
        memset(pg, 0xff, page);
        if (at < b->base || at >= b->base + b->bytes) {
            if (!stray_count++) stray_at = at;
        } else if (b->ints) {
            int32_t *t = (int32_t *)pg;
            int64_t first = (pg - b->base) / 4;
            for (size_t k = 0; k < page / 4; k++)
                if (pg + 4 * k >= b->base && pg + 4 * k < b->base + b->bytes) t[k] = target(first + (int64_t)k);
        } else if (!b->output) {
            uint16_t *h = (uint16_t *)pg;
            int64_t first = (pg - b->base) / 2;
            for (size_t k = 0; k < page / 2; k++)
                if (pg + 2 * k >= b->base && pg + 2 * k < b->base + b->bytes)
                    h[k] = half_bits(value(b->id, first + (int64_t)k));
        }
        return;
    }
    sigaction(SIGSEGV, &old_segv, NULL); /* not ours: the default report */
}

static void *lazy_alloc(size_t bytes, int id, bool output, bool ints)
{
    assert_true(nbufs < MAX_BUFS);
    lazy_buf *b = &bufs[nbufs];
    size_t body = (bytes + page - 1) / page * page;
    b->map_len = GUARD + body + GUARD;
    b->map = mmap(NULL, b->map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    assert_true(b->map != MAP_FAILED);
    b->bytes = bytes;
    b->base = b->map + GUARD + body - (bytes + 255) / 256 * 256; /* its end near the guard, 256-byte aligned */
    b->id = id, b->output = output, b->ints = ints;
    b->touched = test_calloc(b->map_len / page / 8 + 1, 1);
    nbufs++;
    return b->base;
}

static void lazy_start(void)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    nbufs = 0, stray_count = 0, stray_at = NULL;
    struct sigaction sa = {0};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
}

/* Pages touched in all buffers. */
static long lazy_pages(void)
{
    long n = 0;
    for (int i = 0; i < nbufs; i++)
        for (size_t k = 0; k < bufs[i].map_len / page; k++) n += bufs[i].touched[k / 8] >> k % 8 & 1;
    return n;
}

static void lazy_end(void)
{
    sigaction(SIGSEGV, &old_segv, NULL);
    for (int i = 0; i < nbufs; i++) {
        munmap(bufs[i].map, bufs[i].map_len);
        test_free(bufs[i].touched);
    }
    nbufs = 0;
}

/* Whether the page of p (inside b's mapping) was touched. */
static bool touched_at(const lazy_buf *b, const void *p)
{
    size_t k = (size_t)((const char *)p - b->map) / page;
    return b->touched[k / 8] >> k % 8 & 1;
}

/* What the check of an output found: elements (or rows) written, wrong ones (the first with its
 * value and fp64's), the highest written index. */
typedef struct check {
    int64_t written, wrong, first_wrong, high, rows;
    double got, want;
} check;

static bool close_enough(double got, double want, double rel)
{
    return fabs(got - want) <= rel * fabs(want) + 6e-8; /* 6e-8: f16's subnormal step */
}

/* y = x * x + b checked at every element written. */
static check check_ew(const lazy_buf *y)
{
    check c = {0, 0, -1, -1, 0, 0, 0};
    const uint16_t *h = (const uint16_t *)y->base;
    for (size_t k = 0; k < y->map_len / page; k++) {
        if (!(y->touched[k / 8] >> k % 8 & 1)) continue;
        char *pg = y->map + k * page;
        for (char *q = pg; q < pg + page; q += 2) {
            if (q < y->base || q >= y->base + y->bytes) continue;
            int64_t i = (q - y->base) / 2;
            if (h[i] == 0xffff) continue;
            double x = value(0, i), want = x * x + value(1, i % VOCAB), got = half_value(h[i]);
            c.written++;
            if (i > c.high) c.high = i;
            if (!close_enough(got, want, 1.0 / 1024)) {
                if (!c.wrong++) c.first_wrong = i, c.got = got, c.want = want;
            }
        }
    }
    return c;
}

/* y = softmax(x) per row: every row with a written element is written whole and matches fp64. */
static check check_softmax(const lazy_buf *y)
{
    check c = {0, 0, -1, -1, 0, 0, 0};
    const uint16_t *h = (const uint16_t *)y->base;
    int64_t last_row = -1;
    for (size_t k = 0; k < y->map_len / page; k++) {
        if (!(y->touched[k / 8] >> k % 8 & 1)) continue;
        char *pg = y->map + k * page;
        for (char *q = pg; q < pg + page; q += 2) {
            if (q < y->base || q >= y->base + y->bytes) continue;
            int64_t i = (q - y->base) / 2, r = i / VOCAB;
            if (h[i] == 0xffff || r == last_row) continue;
            last_row = r;
            c.rows++;
            double m = -INFINITY, sum = 0;
            for (int j = 0; j < VOCAB; j++) m = fmax(m, value(0, r * VOCAB + j));
            for (int j = 0; j < VOCAB; j++) sum += exp(value(0, r * VOCAB + j) - m);
            for (int j = 0; j < VOCAB; j++) {
                int64_t e = r * VOCAB + j;
                double want = exp(value(0, e) - m) / sum;
                bool mapped = touched_at(y, &h[e]);
                double got = mapped ? half_value(h[e]) : NAN;
                c.written += mapped && h[e] != 0xffff;
                if (e > c.high && mapped && h[e] != 0xffff) c.high = e;
                if (!(close_enough(got, want, 1.0 / 512))) {
                    if (!c.wrong++) c.first_wrong = e, c.got = got, c.want = want;
                }
            }
        }
    }
    return c;
}

/* Cross-entropy's per-row results (f32 [2, CE_ROWS]: each row's loss, then its weight): every
 * written one against fp64 logsumexp(x_row) - x_row[target], weight 1. */
static check check_ce(const lazy_buf *y)
{
    check c = {0, 0, -1, -1, 0, 0, 0};
    const uint32_t *bits = (const uint32_t *)y->base;
    const float *v = (const float *)y->base;
    for (size_t k = 0; k < y->map_len / page; k++) {
        if (!(y->touched[k / 8] >> k % 8 & 1)) continue;
        char *pg = y->map + k * page;
        for (char *q = pg; q < pg + page; q += 4) {
            if (q < y->base || q >= y->base + y->bytes) continue;
            int64_t i = (q - y->base) / 4, r = i % CE_ROWS;
            if (bits[i] == 0xffffffffu) continue;
            double want = 1;
            if (i < CE_ROWS) {
                double m = -INFINITY, sum = 0;
                for (int j = 0; j < VOCAB; j++) m = fmax(m, value(0, r * VOCAB + j));
                for (int j = 0; j < VOCAB; j++) sum += exp(value(0, r * VOCAB + j) - m);
                want = m + log(sum) - value(0, r * VOCAB + target(r));
                c.rows++;
                if (r > c.high) c.high = r;
            }
            c.written++;
            if (!(fabs(v[i] - want) <= 1e-4 * fmax(1, fabs(want)))) {
                if (!c.wrong++) c.first_wrong = i, c.got = v[i], c.want = want;
            }
        }
    }
    return c;
}

/* The chosen blocks of a grid: first, last and three seeded random ones (one for the row kernels,
 * whose blocks take 1024 threads through a dozen barriers a row). */
static const char *blocks = "first,last,random:3:26";
static int chosen(unsigned grid, uint64_t *b) { return emu_blocks_pick(blocks, grid, b); }

/* Runs each chosen block of k alone (ALLOY_EMU_BLOCKS=its index); 0, or -1 with the launch's error. */
static int run_chosen(const emu_kernel *k, unsigned grid, unsigned block, void **params, char *err, size_t len)
{
    uint64_t b[EMU_BLOCKS_MAX];
    int n = chosen(grid, b);
    assert_true(n >= 2);
    for (int i = 0; i < n; i++) {
        char one[32];
        snprintf(one, sizeof one, "%llu", (unsigned long long)b[i]);
        setenv("ALLOY_EMU_BLOCKS", one, 1);
        int rc = emu_launch(k, (unsigned[3]){grid, 1, 1}, (unsigned[3]){block, 1, 1}, params, err, len);
        unsetenv("ALLOY_EMU_BLOCKS");
        if (rc) return rc;
    }
    return 0;
}

/* Text with every `from` replaced by `to` (test_free it). */
static char *replace_all(const char *text, const char *from, const char *to)
{
    size_t n = 0, lf = strlen(from), lt = strlen(to);
    for (const char *p = strstr(text, from); p; p = strstr(p + lf, from)) n++;
    char *out = test_malloc(strlen(text) + n * lt + 1), *o = out;
    const char *p = text, *q;
    while ((q = strstr(p, from))) {
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        memcpy(o, to, lt);
        o += lt;
        p = q + lf;
    }
    strcpy(o, p);
    return out;
}

/* What a full-size launch left: its output buffer, pages touched, seconds, and the kernel's
 * findings under the static check. */
typedef struct big_run {
    const lazy_buf *y;
    long pages;
    double seconds;
    int findings;
    char report[1024];
} big_run;

/* Emits ir's kernel whose name ends in suffix, with each `narrow[0]` of its source replaced by
 * `narrow[1]` (a deliberately narrowed copy) when narrow is not NULL, gives each parameter a lazy
 * buffer (f16 node "b" id 1, other f16 nodes id 0, i32 nodes targets, a ROWS parameter f32 output)
 * and runs the chosen blocks; the launch's error in err (0 when it ran). */
static int launch_big(const char *ir, const char *what, const char *suffix, const char *const *narrow, big_run *r,
                      char *err, size_t errlen)
{
    alloy_graph *g = parse(ir);
    if (graph_compile_ir(g)) fail_msg("%s: %s", what, alloy_last_error(g));
    cg_program prog = {0};
    if (cg_emit(g->compiled, &g->comp.sched, &prog, err, errlen)) fail_msg("%s: %s", what, err);
    const cg_kernel *k = NULL;
    for (int i = 0; i < prog.nkernels; i++) {
        size_t n = strlen(prog.kernels[i].name), m = strlen(suffix);
        if (n >= m && !strcmp(prog.kernels[i].name + n - m, suffix)) k = &prog.kernels[i];
    }
    if (!k) fail_msg("%s: no kernel ending in %s", what, suffix);
    char *source = narrow ? replace_all(k->source, narrow[0], narrow[1]) : NULL;
    if (narrow) assert_true(strcmp(source, k->source) != 0);
    r->report[0] = 0;
    r->findings = iw_scan(k->name, source ? source : k->source, k->body, r->report, sizeof r->report);
    emu_kernel *e = emu_compile(source ? source : k->source, k->name, err, errlen);
    if (!e) fail_msg("%s: %s", k->name, err);
    lazy_start();
    void *ptrs[8], *params[8];
    int out = -1;
    assert_true(k->nparams <= 8);
    for (int i = 0; i < k->nparams; i++) {
        const cg_param *pa = &k->params[i];
        if (pa->kind == CG_PARAM_ROWS) {
            ptrs[i] = lazy_alloc((size_t)pa->count * 4, 2, true, false);
        } else {
            assert_int_equal(pa->kind, CG_PARAM_NODE);
            const ir_node *n = g->compiled->nodes[pa->node];
            assert_true(n->type.dtype == ALLOY_F16 || (n->type.dtype == ALLOY_I32 && !pa->written));
            int id = n->name && !strcmp(n->name, "b") ? 1 : 0;
            ptrs[i] = lazy_alloc(ir_nbytes(&n->type), id, pa->written, n->type.dtype == ALLOY_I32);
        }
        if (pa->written) out = nbufs - 1;
        params[i] = &ptrs[i];
    }
    assert_true(out >= 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = run_chosen(e, k->grid, k->block, params, err, errlen);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    r->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    print_message("%s: kernel %s%s, grid %u x %u threads, %d params\n", what, k->name, narrow ? " (narrowed)" : "",
                  k->grid, k->block, k->nparams);
    r->y = &bufs[out];
    r->pages = lazy_pages();
    emu_free(e);
    if (source) test_free(source);
    cg_program_free(&prog);
    alloy_graph_free(g);
    return rc;
}

static void skip_without_compiler(void)
{
    char why[256];
    if (!emu_available(why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
}

static void test_full_size_elementwise_kernel_matches_fp64_on_chosen_blocks(void **state)
{
    (void)state;
    skip_without_compiler();
    big_run r;
    char err[2048];
    if (launch_big(ew_ir, "x * x + b over 45056 x 50257 f16", "_ew", NULL, &r, err, sizeof err)) fail_msg("%s", err);
    check c = check_ew(r.y);
    print_message("%lld elements written by the chosen blocks, the highest %lld (2^31 = %lld), %ld pages touched "
                  "(%.1f MiB), %.2f s\n", (long long)c.written, (long long)c.high, 1ll << 31, r.pages,
                  (double)r.pages * (double)page / 1048576.0, r.seconds);
    long strays = stray_count;
    lazy_end();
    assert_int_equal(strays, 0);
    if (c.wrong) fail_msg("%lld wrong elements, the first y[%lld] = %g, fp64 %g", (long long)c.wrong,
                          (long long)c.first_wrong, c.got, c.want);
    assert_true(c.written > 0);
    assert_true(c.high >= (1ll << 31)); /* the blocks reached past 2^31 */
}

static void test_full_size_softmax_row_kernel_matches_fp64_on_chosen_blocks(void **state)
{
    (void)state;
    skip_without_compiler();
    big_run r;
    char err[2048];
    blocks = "first,last,random:1:26";
    int rc = launch_big(row_ir, "softmax over 45056 x 50257 f16", "_row", NULL, &r, err, sizeof err);
    blocks = "first,last,random:3:26";
    if (rc) fail_msg("%s", err);
    check c = check_softmax(r.y);
    print_message("%lld rows (%lld elements) written by the chosen blocks, the highest element %lld, %ld pages "
                  "touched (%.1f MiB), %.2f s\n", (long long)c.rows, (long long)c.written, (long long)c.high, r.pages,
                  (double)r.pages * (double)page / 1048576.0, r.seconds);
    long strays = stray_count;
    lazy_end();
    assert_int_equal(strays, 0);
    if (c.wrong) fail_msg("%lld wrong elements, the first y[%lld] = %g, fp64 %g", (long long)c.wrong,
                          (long long)c.first_wrong, c.got, c.want);
    assert_true(c.rows >= 3);
    assert_true(c.high >= (1ll << 31));
}

static void test_full_size_cross_entropy_kernel_matches_fp64_on_chosen_blocks(void **state)
{
    (void)state;
    skip_without_compiler();
    big_run r;
    char err[2048];
    blocks = "first,last,random:1:26";
    int rc = launch_big(ce_ir, "cross-entropy over 32768 x 50257 f16", "_row", NULL, &r, err, sizeof err);
    blocks = "first,last,random:3:26";
    if (rc) fail_msg("%s", err);
    check c = check_ce(r.y);
    print_message("%lld rows' losses (%lld results) written by the chosen blocks, the last row %lld (its logits at "
                  "byte %lld), %ld pages touched (%.1f MiB), %.2f s\n", (long long)c.rows, (long long)c.written,
                  (long long)c.high, (long long)c.high * VOCAB * 2, r.pages, (double)r.pages * (double)page / 1048576.0,
                  r.seconds);
    long strays = stray_count;
    lazy_end();
    assert_int_equal(strays, 0);
    if (c.wrong) fail_msg("%lld wrong results, the first [%lld] = %.9g, fp64 %.9g", (long long)c.wrong,
                          (long long)c.first_wrong, c.got, c.want);
    assert_true(c.rows >= 3);
    assert_int_equal(c.written, 2 * c.rows); /* each row's weight beside its loss */
    assert_int_equal(c.high, CE_ROWS - 1);   /* the last block reached the last row, past 2^31 bytes */
}

/* The emitted elementwise kernel with its grid index narrowed (`int g_ = blockIdx.x * ...`, as an
 * emitter that forgot the cast would write it): the static check names it, and at full size its
 * offsets past 2^31 wrap below the buffers, so the chosen blocks write nothing past 2^31. */
static void test_a_narrowed_emitted_kernel_is_caught_at_full_size(void **state)
{
    (void)state;
    skip_without_compiler();
#if defined(__SANITIZE_ADDRESS__)
    /* the narrowed kernel's `g_ * 8` overflows an int: in the sanitizer build UBSan stops the process there
     * (halt_on_error), which is that build's own catch of it; the plain build tests the full-size check */
    skip();
#endif
    static const char *const narrow[] = {"long long g_ = (long long)blockIdx.x", "int g_ = blockIdx.x"};
    big_run r;
    char err[2048];
    if (launch_big(ew_ir, "x * x + b over 45056 x 50257 f16", "_ew", narrow, &r, err, sizeof err))
        fail_msg("%s", err);
    check c = check_ew(r.y);
    long strays = stray_count;
    print_message("narrowed: %lld elements written, the highest %lld, %lld wrong, %ld touches out of range, the "
                  "first at %p\n%s", (long long)c.written, (long long)c.high, (long long)c.wrong, strays,
                  (void *)stray_at, r.report);
    lazy_end();
    assert_true(strays > 0);
    assert_true(c.high < (1ll << 31));
    assert_int_equal(r.findings, 5); /* the product, its int, its 64-bit step, the offsets of the loads and stores */
    assert_non_null(strstr(r.report, "`for (int g_ = blockIdx.x * blockDim.x + threadIdx.x;"));
    assert_non_null(strstr(r.report, "`alloy_vcopy<16>(l0_, p0 + g_ * 8);`: an offset into a parameter"));
}

/* y = x * x + b with a 32-bit offset: right below 2^31 elements, wrong past it. */
static const char broken_src[] =
    "extern \"C\" __global__ void broken_offset(const unsigned short *x, const unsigned short *b, unsigned short *y)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < 2264379392ll) y[i] = x[i];\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void broken_offset__host(void **p)\n"
    "{\n"
    "    broken_offset(*(const unsigned short **)p[0], *(const unsigned short **)p[1], *(unsigned short **)p[2]);\n"
    "}\n"
    "#endif\n";

/* The same copy with a 64-bit offset: what the broken one must be told apart from. */
static const char fixed_src[] =
    "extern \"C\" __global__ void fixed_offset(const unsigned short *x, const unsigned short *b, unsigned short *y)\n"
    "{\n"
    "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < 2264379392ll) y[i] = x[i];\n"
    "}\n"
    "#ifdef ALLOY_HOST_EMULATION\n"
    "extern \"C\" void fixed_offset__host(void **p)\n"
    "{\n"
    "    fixed_offset(*(const unsigned short **)p[0], *(const unsigned short **)p[1], *(unsigned short **)p[2]);\n"
    "}\n"
    "#endif\n";

/* Runs a copy kernel's chosen blocks over the big shape; how many elements are wrong or missing
 * and how many touches fell outside the buffers. */
static void run_copy(const char *src, const char *name, long *wrong, long *strays, int64_t *high)
{
    char err[8192];
    emu_kernel *e = emu_compile(src, name, err, sizeof err);
    if (!e) fail_msg("%s: %s", name, err);
    lazy_start();
    void *ptrs[3] = {lazy_alloc((size_t)NUMEL * 2, 0, false, false), lazy_alloc(VOCAB * 2, 1, false, false),
                     lazy_alloc((size_t)NUMEL * 2, 2, true, false)};
    void *params[3] = {&ptrs[0], &ptrs[1], &ptrs[2]};
    unsigned grid = (unsigned)((NUMEL + 255) / 256);
    if (run_chosen(e, grid, 256, params, err, sizeof err)) fail_msg("%s: %s", name, err);
    /* every element a chosen block owns holds x's value */
    uint64_t b[EMU_BLOCKS_MAX];
    int n = chosen(grid, b);
    const uint16_t *y = ptrs[2];
    *wrong = 0, *high = -1;
    for (int i = 0; i < n; i++)
        for (int64_t t = 0; t < 256; t++) {
            int64_t at = (int64_t)b[i] * 256 + t;
            if (at >= NUMEL) continue;
            bool mapped = touched_at(&bufs[2], &y[at]);
            if (!mapped || y[at] != half_bits(value(0, at))) ++*wrong;
            else if (at > *high) *high = at;
        }
    *strays = stray_count;
    if (stray_count) print_message("%s: %ld touches outside the buffers, the first at %p\n", name, (long)stray_count,
                                   (void *)stray_at);
    lazy_end();
    emu_free(e);
}

/* ALLOY_EMU_BLOCKS on a launch: only the named blocks run (the copy kernel over 1000 blocks of 256
 * writes exactly their elements), and a malformed list fails the launch, naming it. */
static void test_alloy_emu_blocks_runs_only_the_named_blocks(void **state)
{
    (void)state;
    skip_without_compiler();
    char err[8192];
    emu_kernel *e = emu_compile(fixed_src, "fixed_offset", err, sizeof err);
    if (!e) fail_msg("%s", err);
    enum { GRID = 1000, N = GRID * 256 };
    uint16_t *x = test_calloc(N, 2), *y = test_malloc(N * 2);
    memset(y, 0xff, N * 2);
    void *ptrs[3] = {x, x, y}, *params[3] = {&ptrs[0], &ptrs[1], &ptrs[2]};
    setenv("ALLOY_EMU_BLOCKS", "last,first,500", 1);
    int rc = emu_launch(e, (unsigned[3]){GRID, 1, 1}, (unsigned[3]){256, 1, 1}, params, err, sizeof err);
    unsetenv("ALLOY_EMU_BLOCKS");
    if (rc) fail_msg("%s", err);
    for (int b = 0; b < GRID; b++) {
        int ran = 0;
        for (int t = 0; t < 256; t++) ran += y[b * 256 + t] == 0;
        assert_int_equal(ran, b == 0 || b == 500 || b == GRID - 1 ? 256 : 0);
    }
    setenv("ALLOY_EMU_BLOCKS", "first,middle", 1);
    rc = emu_launch(e, (unsigned[3]){GRID, 1, 1}, (unsigned[3]){256, 1, 1}, params, err, sizeof err);
    unsetenv("ALLOY_EMU_BLOCKS");
    print_message("%s\n", err);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, "ALLOY_EMU_BLOCKS=first,middle: not a list of"));
    test_free(x);
    test_free(y);
    emu_free(e);
}

static void test_a_32_bit_offset_kernel_is_caught_at_full_size(void **state)
{
    (void)state;
    skip_without_compiler();
    long wrong, strays;
    int64_t high;
    run_copy(fixed_src, "fixed_offset", &wrong, &strays, &high);
    print_message("64-bit offset: %ld elements wrong, %ld touches out of range, highest right element %lld\n", wrong,
                  strays, (long long)high);
    assert_int_equal(wrong, 0);
    assert_int_equal(strays, 0);
    assert_true(high >= (1ll << 31));
    run_copy(broken_src, "broken_offset", &wrong, &strays, &high);
    print_message("32-bit offset: %ld elements wrong, %ld touches out of range\n", wrong, strays);
    assert_true(wrong > 0);
    assert_true(strays > 0);
    /* and the static check names it */
    char report[1024] = "";
    assert_int_equal(iw_scan("broken_offset", broken_src, 0, report, sizeof report), 2);
    print_message("%s", report);
    assert_non_null(strstr(report, "kernel broken_offset line 3: `int i = blockIdx.x * blockDim.x + threadIdx.x;`"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_static_check_names_each_narrowed_index),
        cmocka_unit_test(test_no_generated_kernel_narrows_a_64_bit_index),
        cmocka_unit_test(test_emu_blocks_picks_first_last_listed_and_seeded_blocks),
        cmocka_unit_test(test_alloy_emu_blocks_runs_only_the_named_blocks),
        cmocka_unit_test(test_full_size_elementwise_kernel_matches_fp64_on_chosen_blocks),
        cmocka_unit_test(test_full_size_softmax_row_kernel_matches_fp64_on_chosen_blocks),
        cmocka_unit_test(test_full_size_cross_entropy_kernel_matches_fp64_on_chosen_blocks),
        cmocka_unit_test(test_a_32_bit_offset_kernel_is_caught_at_full_size),
        cmocka_unit_test(test_a_narrowed_emitted_kernel_is_caught_at_full_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
