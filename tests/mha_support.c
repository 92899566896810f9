/* mha_support.c - the multi-head attention suites' shared graph pieces, data, results, comparisons and emulated device (mha_support.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "mha_support.h"

#include "cuda_emu/emu_device.h"
#include "cuda_emu/emu_loader.h"
#include "runtime/backend.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

static int64_t rows(mha_shape sh) { return sh.b * sh.t; }
static int64_t features(mha_shape sh) { return sh.h * sh.d; }

mha_graph mha_graph_new(const char *name, mha_shape sh, alloy_dtype dt)
{
    int64_t n = rows(sh), c = features(sh);
    mha_graph m = {alloy_graph_new(name), sh, dt, NULL, NULL, NULL};
    m.x = alloy_input(m.g, "x", dt, 2, (int64_t[]){n, c});
    m.w = alloy_input(m.g, "w", dt, 2, (int64_t[]){c, 3 * c});
    m.r = alloy_input(m.g, "r", dt, 2, (int64_t[]){n, c});
    return m;
}

alloy_tensor *mha_heads(const mha_graph *m, alloy_tensor *qkv, int block)
{
    int64_t c = features(m->sh);
    alloy_tensor *x = alloy_slice(m->g, qkv, 1, block * c, (block + 1) * c);
    return alloy_transpose(m->g, alloy_reshape(m->g, x, 4, (int64_t[]){m->sh.b, m->sh.t, m->sh.h, m->sh.d}),
                           (int64_t[]){0, 2, 1, 3});
}

alloy_tensor *mha_written_out(const mha_graph *m, alloy_tensor *q, alloy_tensor *k, alloy_tensor *v)
{
    alloy_graph *g = m->g;
    q = alloy_mul(g, q, alloy_scalar(g, m->dt, 1 / sqrt((double)m->sh.d)));
    alloy_tensor *p = alloy_softmax(g, alloy_causal_mask(g, alloy_matmul(g, q, k, false, true)), -1);
    return alloy_matmul(g, p, v, false, false);
}

alloy_graph *mha_graph_finish(const mha_graph *m, alloy_tensor *o, bool squared)
{
    alloy_graph *g = m->g;
    alloy_tensor *y = alloy_reshape(g, alloy_transpose(g, o, (int64_t[]){0, 2, 1, 3}), 2,
                                    (int64_t[]){rows(m->sh), features(m->sh)});
    expect_ok(g, alloy_output(g, "y", y), "output");
    alloy_tensor *yr = alloy_mul(g, y, m->r);
    /* squared: the loss's gradient dy is computed, so the backward's dO is a view too */
    expect_ok(g, alloy_graph_set_loss(g, alloy_reduce_sum(g, squared ? alloy_mul(g, yr, y) : yr, 0, NULL, false)), "loss");
    expect_ok(g, alloy_graph_request_grad(g, m->x), "grad x");
    expect_ok(g, alloy_graph_request_grad(g, m->w), "grad w");
    return g;
}

static void *random_values(alloy_dtype dt, int64_t n, double lo, double hi)
{
    double *v = test_malloc(sizeof(double) * (size_t)n);
    void *out = test_malloc(alloy_dtype_size(dt) * (size_t)n);
    for (int64_t e = 0; e < n; e++) v[e] = test_uniform(lo, hi);
    test_encode(dt, v, out, n);
    test_free(v);
    return out;
}

mha_data mha_make_data(mha_shape sh, alloy_dtype dt, unsigned seed)
{
    int64_t n = rows(sh), c = features(sh);
    test_rng = seed;
    mha_data d = {sh, dt, NULL, NULL, NULL};
    d.x = random_values(dt, n * c, -1, 1); /* in this order: one stream of test_rng */
    d.w = random_values(dt, c * 3 * c, -0.5, 0.5);
    d.r = random_values(dt, n * c, -1, 1);
    return d;
}

void mha_free_data(mha_data *d) { test_free(d->x), test_free(d->w), test_free(d->r); }

void mha_io(const mha_data *d, alloy_host_tensor feeds[3], alloy_host_tensor fetch[3])
{
    int64_t n = rows(d->sh), c = features(d->sh);
    feeds[0] = (alloy_host_tensor){"x", d->dt, 2, {n, c}, d->x};
    feeds[1] = (alloy_host_tensor){"w", d->dt, 2, {c, 3 * c}, d->w};
    feeds[2] = (alloy_host_tensor){"r", d->dt, 2, {n, c}, d->r};
    fetch[0] = (alloy_host_tensor){.name = "y"};
    fetch[1] = (alloy_host_tensor){.name = "grad:x"};
    fetch[2] = (alloy_host_tensor){.name = "grad:w"};
}

static double *decoded(const alloy_host_tensor *t, int64_t n)
{
    double *v = test_malloc(sizeof(double) * (size_t)n);
    for (int64_t e = 0; e < n; e++) v[e] = test_decode(t->dtype, t->data, e);
    return v;
}

mha_result mha_fetched(mha_shape sh, const alloy_host_tensor fetch[3])
{
    int64_t n = rows(sh), c = features(sh);
    mha_result out = {sh, decoded(&fetch[0], n * c), decoded(&fetch[1], n * c), decoded(&fetch[2], c * 3 * c)};
    return out;
}

mha_result mha_run(alloy_graph *g, const mha_data *d, int runs)
{
    alloy_host_tensor feeds[3], fetch[3];
    mha_io(d, feeds, fetch);
    for (int i = 0; i < runs; i++) expect_ok(g, alloy_graph_run(g, feeds, 3, fetch, 3), "run");
    return mha_fetched(d->sh, fetch);
}

mha_result mha_run_bundle(alloy_graph *g, const mha_data *d, const char *path)
{
    expect_ok(g, alloy_graph_save_bundle(g, path, NULL), "save_bundle");
    alloy_bundle *b = NULL;
    char err[1024] = "";
    if (alloy_bundle_load(path, &b, err, sizeof err)) fail_msg("alloy_bundle_load: %s", err);
    alloy_host_tensor feeds[3], fetch[3];
    mha_io(d, feeds, fetch);
    if (alloy_bundle_run(b, feeds, 3, fetch, 3)) fail_msg("alloy_bundle_run: %s", alloy_bundle_last_error(b));
    mha_result got = mha_fetched(d->sh, fetch);
    alloy_bundle_free(b);
    return got;
}

void mha_free_result(mha_result *r) { test_free(r->y), test_free(r->gx), test_free(r->gw); }

void mha_expect_same(const mha_result *a, const mha_result *b, const char *what)
{
    int64_t n = rows(a->sh), c = features(a->sh);
    const struct {
        const char *name;
        const double *x, *y;
        int64_t n;
    } parts[] = {{"y", a->y, b->y, n * c}, {"grad:x", a->gx, b->gx, n * c}, {"grad:w", a->gw, b->gw, c * 3 * c}};
    for (size_t p = 0; p < 3; p++)
        for (int64_t e = 0; e < parts[p].n; e++)
            if (memcmp(&parts[p].x[e], &parts[p].y[e], sizeof(double)) != 0)
                fail_msg("%s: %s[%lld] is %.9g, against %.9g", what, parts[p].name, (long long)e, parts[p].x[e],
                         parts[p].y[e]);
}

double mha_rel_diff(const double *a, const double *b, int64_t n)
{
    double scale = 0, worst = 0;
    for (int64_t e = 0; e < n; e++) scale = fmax(scale, fabs(b[e]));
    for (int64_t e = 0; e < n; e++) worst = fmax(worst, fabs(a[e] - b[e]));
    return worst / (scale > 0 ? scale : 1);
}

double mha_chain_bound(int depth, int terms, alloy_dtype dt)
{
    const double u32 = 0x1p-24;
    double u = dt == ALLOY_F16 ? 0x1p-11 : dt == ALLOY_BF16 ? 0x1p-8 : u32;
    return depth * (2 * u + 2.0 * terms * u32 + 4 * u32);
}

int mha_layout_copies(const alloy_graph *g, int *strided)
{
    const ir_graph *c = g->compiled;
    const schedule *s = &g->comp.sched;
    int copies = 0, attention = 0;
    for (int k = 0; k < s->nsteps; k++) {
        const ir_node *n = c->nodes[s->steps[k].pos];
        uint8_t f = s->members[s->steps[k].first].flags;
        copies += s->steps[k].kind == STEP_KIND_OP && !(f & MEMBER_VIEW) &&
                  (n->op == IR_OP_transpose || n->op == IR_OP_slice || n->op == IR_OP_concat);
        attention += (n->op == IR_OP_attention || n->op == IR_OP_attention_grad) && (f & MEMBER_STRIDED);
    }
    if (strided) *strided = attention;
    return copies;
}

void mha_emulated_device_or_skip(void)
{
    char why[512];
    if (!emu_available(why, sizeof why)) {
        print_message("SKIP: no host emulation of the device: %s\n", why);
        skip();
    }
    rt_backend_set_cuda_opener(emu_backend_opener);
}
