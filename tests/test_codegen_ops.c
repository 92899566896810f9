/* test_codegen_ops.c - the emitter on every case of the op case table (op_cases.c): each case's one-op graph, forward and with the backward test_op_cases checks, in every dtype it runs in, compiled; its kernels run under the host emulation against the CPU backend and NVRTC-compiled for sm_80 and sm_90; only library calls (and known gaps) are left without a kernel. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen_support.h"
#include "op_cases.h"
#include "passes/grad_rules.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* As test_op_cases.c: the gradient check runs on the cases of ops with a
 * gradient rule of at most this many operand elements, and a case runs in
 * each dtype of these lists its type rule takes (a case whose types are all
 * written runs once). */
enum { GRAD_MAX_ELEMENTS = 1024 };
static const alloy_dtype all_dtypes[] = {F32, F16, BF16, F64, I32, I64, BOOL};
static const alloy_dtype float_dtypes[] = {F64, F32, F16, BF16};
enum { NDTYPES = sizeof all_dtypes / sizeof all_dtypes[0], NFLOAT = sizeof float_dtypes / sizeof float_dtypes[0] };

/* The dtypes reported apart; integer and bool cases together. */
typedef enum dtype_group { G_F32, G_F16, G_BF16, G_F64, G_INT, NGROUPS } dtype_group;
static const char *const group_names[NGROUPS] = {"fp32", "f16", "bf16", "f64", "i32/i64/bool"};

/* Kernels per emulation library: g++ compiles the libraries of one dtype
 * on all cores at once; one library of them all would take one core
 * (about 5 ms of g++ a kernel). */
enum { KERNELS_PER_LIBRARY = 160 };

/* The table expanded once (main). */
static oc_case *row_cases[512];
static int row_count[512];

/* A case of the table in one dtype, forward or with its backward: the
 * compiled graph, its inputs' values, and once prepared its CPU values and
 * kernels, each found in a set of distinct kernels (renamed with prefix). */
typedef struct op_graph {
    const oc_case *c;
    alloy_dtype dt;
    bool grad;
    dtype_group group;
    alloy_graph *g;
    feed_set f;
    cgs_step step;
    int *kernel; /* per kernel of step.prog: its index in the kernel set */
    char prefix[16];
} op_graph;

typedef struct op_graphs {
    op_graph *at;
    int n, cap;
} op_graphs;

/* ---- known failures ----
 *
 * Cases whose kernels disagree with the CPU for a diagnosed reason not
 * fixed yet: each is reported, not failed, with its diagnosis (none today).
 * Every other case fails the test. */
typedef struct known_failure {
    const char *op;    /* the case's op */
    int group;         /* its dtype group, -1 for any */
    int grad;          /* 0 forward, 1 with the backward, -1 either */
    const char *label; /* a part of the case's label, NULL for any */
    const char *why;
} known_failure;

static const known_failure known_failures[] = {
    {NULL, 0, 0, NULL, NULL},
};

/* Steps the emitter leaves without a kernel on purpose (library calls), by
 * the op of the step's last node and what prog.why says; any other step
 * without a kernel fails the test (a step over no elements needs none). */
typedef struct known_gap {
    const char *op;
    const char *why;
} known_gap;

static const known_gap library_ops[] = {
    {"matmul", "a library GEMM (cuBLASLt)"},
    /* a library call too: NCCL on the step's stream (docs/distributed.md) */
    {"all_reduce", "a library collective (NCCL)"},
    {"reduce_scatter", "a library collective (NCCL)"},
    {"all_gather", "a library collective (NCCL)"},
    {NULL, NULL},
};

static const known_failure *known_failure_of(const op_graph *o)
{
    for (const known_failure *k = known_failures; k->op; k++)
        if (strcmp(k->op, o->c->row->op) == 0 && (k->group < 0 || k->group == (int)o->group) &&
            (k->grad < 0 || k->grad == (int)o->grad) && (!k->label || strstr(o->c->label, k->label)))
            return k;
    return NULL;
}

/* ---- the graphs of one case ---- */

static dtype_group group_of(alloy_dtype dt)
{
    switch (dt) {
    case ALLOY_F32: return G_F32;
    case ALLOY_F16: return G_F16;
    case ALLOY_BF16: return G_BF16;
    case ALLOY_F64: return G_F64;
    default: return G_INT;
    }
}

static bool is_bound(int op) { return op == IR_OP_input || op == IR_OP_param || op == IR_OP_state; }

static int64_t operand_elements(const oc_case *c)
{
    int64_t n = 0;
    for (int k = 0; k < c->nin; k++) n += ir_numel(&c->in[k]);
    return n;
}

/* Seeds the generator as test_op_cases.c does (its label, dtype and
 * check), so both draw the same values for a case. */
static void seed_case(const oc_case *c, alloy_dtype dt, int check)
{
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a */
    for (const char *p = c->label; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3u;
    test_rng = h ^ (uint64_t)dt << 56 ^ (uint64_t)check << 48;
}

static const char *what_of(const op_graph *o)
{
    static char what[4][320];
    static int next;
    char *w = what[next++ % 4];
    snprintf(w, sizeof what[0], "%s in %s%s", o->c->label, alloy_dtype_name(o->dt), o->grad ? " with its backward" : "");
    return w;
}

/* Adds the feed called name (an input of o's graph) holding v encoded. */
static void add_feed(op_graph *o, const char *name, const ir_type *t, const double *v)
{
    assert_true(o->f.n < 8);
    const ir_graph *ir = o->g->ir;
    alloy_host_tensor *h = &o->f.t[o->f.n++];
    *h = (alloy_host_tensor){.name = ir->nodes[ir_find_name(ir, name)]->name, .dtype = t->dtype, .rank = t->rank};
    memcpy(h->dims, t->dims, sizeof h->dims);
    h->data = test_malloc(ir_nbytes(t) + 1);
    test_encode(t->dtype, v, h->data, ir_numel(t));
}

/* Case c in dtype dt into o as test_op_cases.c builds it: inputs "x<k>",
 * the op as node "y", output "y"; with grad, the loss sum(y * r) and the
 * gradients of the float inputs instead. The graph compiled and its feeds
 * drawn. false when the type rule refuses dt (with grad: when y or every
 * operand is not float). */
static bool build(op_graph *o, const oc_case *c, alloy_dtype dt, bool grad)
{
    memset(o, 0, sizeof *o);
    alloy_graph *g = alloy_graph_new("op_case");
    assert_non_null(g);
    ir_graph *ir = g->ir;
    ir_node *x[OC_MAX_IN];
    int ids[OC_MAX_IN];
    bool any_float = false;
    for (int k = 0; k < c->nin; k++) {
        char name[16];
        ir_type t = oc_operand_type(c, k, dt);
        snprintf(name, sizeof name, "x%d", k);
        x[k] = ir_add_node(ir, IR_OP_input, 0, NULL, 0, NULL, &t, name);
        assert_non_null(x[k]);
        ids[k] = x[k]->id;
        any_float |= ir_is_float(t.dtype);
    }
    ir_type declared;
    bool has = oc_declared_type(c, dt, &declared);
    ir_node *y = ir_add_node(ir, c->op, c->nin, ids, c->nattrs, c->attrs, has ? &declared : NULL, "y");
    if (!y || (grad && (!ir_is_float(y->type.dtype) || !any_float))) {
        alloy_graph_free(g);
        return false;
    }
    *o = (op_graph){.c = c, .dt = dt, .grad = grad, .g = g};
    o->group = oc_takes_dtype(c) ? group_of(dt) : group_of(y->type.dtype);
    seed_case(c, dt, grad);
    if (grad) {
        ir_node *r = ir_add_node(ir, IR_OP_input, 0, NULL, 0, NULL, &y->type, "r");
        int in[2] = {y->id, r ? r->id : -1};
        ir_node *prod = r ? ir_add_node(ir, IR_OP_mul, 2, in, 0, NULL, NULL, NULL) : NULL;
        ir_node *sum = prod ? ir_add_node(ir, IR_OP_reduce_sum, 1, &prod->id, 0, NULL, NULL, "loss") : NULL;
        if (!sum) fail_msg("%s: the loss does not build: %s", what_of(o), ir->error);
        assert_int_equal(ir_add_output(ir, "loss", sum->id), ALLOY_OK);
        assert_int_equal(alloy_graph_set_loss(g, (alloy_tensor *)(void *)sum), ALLOY_OK);
        for (int k = 0; k < c->nin; k++)
            if (ir_is_float(x[k]->type.dtype))
                assert_int_equal(alloy_graph_request_grad(g, (alloy_tensor *)(void *)x[k]), ALLOY_OK);
        int64_t n = ir_numel(&y->type);
        double *v = test_malloc(sizeof(double) * (size_t)(n + 1));
        for (int64_t i = 0; i < n; i++)
            do v[i] = test_round_to(y->type.dtype, test_uniform(-1, 1));
            while (fabs(v[i]) < 0.1);
        add_feed(o, "r", &y->type, v);
        test_free(v);
    } else {
        assert_int_equal(ir_add_output(ir, "y", y->id), ALLOY_OK);
    }
    /* the operands' values (a bound leaf's own) */
    ir_type types[OC_MAX_IN];
    int nvalues = is_bound(c->op) ? 1 : c->nin;
    for (int k = 0; k < nvalues; k++) types[k] = is_bound(c->op) ? y->type : x[k]->type;
    for (int k = 0; k < nvalues; k++) {
        double *v = test_malloc(sizeof(double) * (size_t)(ir_numel(&types[k]) + 1));
        oc_draw(c, k, types, &y->type, v);
        char name[16];
        snprintf(name, sizeof name, is_bound(c->op) ? "y" : "x%d", k);
        if (c->op != IR_OP_param && c->op != IR_OP_state) add_feed(o, name, &types[k], v);
        test_free(v);
    }
    if (graph_compile(g)) fail_msg("%s: %s", what_of(o), alloy_last_error(g));
    return true;
}

static void release(op_graph *o)
{
    cgs_release(&o->step);
    test_free(o->kernel);
    for (int i = 0; i < o->f.n; i++) test_free(o->f.t[i].data);
    alloy_graph_free(o->g);
    memset(o, 0, sizeof *o);
}

static op_graph *push(op_graphs *gs)
{
    if (gs->n == gs->cap) {
        gs->cap = gs->cap ? 2 * gs->cap : 256;
        gs->at = test_realloc(gs->at, sizeof *gs->at * (size_t)gs->cap);
        assert_non_null(gs->at);
    }
    return &gs->at[gs->n];
}

/* Every graph of the table in dtype group `group` (NGROUPS: all), as
 * test_op_cases.c runs them: each case in the dtypes it takes, then with its
 * backward where it checks gradients. */
static op_graphs build_all(int group)
{
    op_graphs gs = {0};
    for (int r = 0; r < op_ncases; r++)
        for (int i = 0; i < row_count[r]; i++) {
            const oc_case *c = &row_cases[r][i];
            for (int d = 0, built = 0; d < NDTYPES && (!built || oc_takes_dtype(c)); d++) {
                op_graph *o = push(&gs);
                if (!build(o, c, all_dtypes[d], false)) continue;
                built = 1;
                if (group == NGROUPS || (int)o->group == group) gs.n++;
                else release(o);
            }
            if (!ad_rules[c->op] || (c->row->flags & OC_NO_GRAD) || operand_elements(c) > GRAD_MAX_ELEMENTS) continue;
            for (int d = 0, built = 0; d < NFLOAT && (!built || oc_takes_dtype(c)); d++) {
                op_graph *o = push(&gs);
                if (!build(o, c, float_dtypes[d], true)) continue;
                built = 1;
                if (group == NGROUPS || (int)o->group == group) gs.n++;
                else release(o);
            }
        }
    return gs;
}

static void release_all(op_graphs *gs)
{
    for (int i = 0; i < gs->n; i++) release(&gs->at[i]);
    test_free(gs->at);
    memset(gs, 0, sizeof *gs);
}

/* Emits o's kernels without running it (cgs_prepare does both). */
static void emit_only(op_graph *o)
{
    char err[1024];
    if (cg_emit(o->g->compiled, &o->g->comp.sched, &o->step.prog, err, sizeof err)) fail_msg("emit: %s", err);
}

/* ---- the distinct kernels of many graphs ---- */

/* A kernel whose text equals an earlier one's but for its name
 * ("alloy_s<step>_...") is compiled once, and run by that one's name. The
 * distinct kernels are renamed apart: "alloy_c<i>_s<step>_..." for the
 * kernel of graph i. */
typedef struct kernel_set {
    cg_program all; /* the distinct kernels (their sources renamed, body 0) */
    char **keys;    /* per distinct kernel: its text without the step in its name */
    int *slots;     /* open addressing over keys: an index into all.kernels, or -1 */
    int nslots;
} kernel_set;

/* text without the digits after each "alloy_s" (al_malloc'd). */
static char *key_of(const char *text)
{
    char *key = al_malloc(strlen(text) + 1), *k = key;
    assert_non_null(key);
    for (const char *p = text; *p;) {
        if (strncmp(p, "alloy_s", 7) == 0) {
            memcpy(k, p, 7), k += 7, p += 7;
            while (*p >= '0' && *p <= '9') p++;
        } else {
            *k++ = *p++;
        }
    }
    *k = '\0';
    return key;
}

static uint64_t hash_of(const char *s)
{
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3u;
    return h;
}

/* A set for up to n kernels. */
static void kernel_set_init(kernel_set *ks, int n)
{
    memset(ks, 0, sizeof *ks);
    ks->nslots = 2 * n + 1;
    ks->slots = test_malloc(sizeof(int) * (size_t)ks->nslots);
    for (int i = 0; i < ks->nslots; i++) ks->slots[i] = -1;
    ks->keys = test_calloc((size_t)n + 1, sizeof(char *));
    ks->all.kernels = al_calloc((size_t)n + 1, sizeof(cg_kernel));
    assert_non_null(ks->all.kernels);
    ks->all.cap = n;
}

/* The index in ks of kernel kn of graph o (added when new). */
static int kernel_set_add(kernel_set *ks, const op_graph *o, const cg_kernel *kn)
{
    if (strncmp(kn->name, "alloy_s", 7) || kn->name[7] < '0' || kn->name[7] > '9')
        fail_msg("%s: kernel %s: the renaming expects the emitter's names alloy_s<step>_...", what_of(o), kn->name);
    char *key = key_of(kn->source + kn->body);
    int slot = (int)(hash_of(key) % (uint64_t)ks->nslots);
    while (ks->slots[slot] >= 0 && strcmp(ks->keys[ks->slots[slot]], key)) slot = (slot + 1) % ks->nslots;
    if (ks->slots[slot] >= 0) {
        al_free(key);
        return ks->slots[slot];
    }
    assert_true(ks->all.nkernels < ks->all.cap);
    int i = ks->all.nkernels++;
    cg_kernel *to = &ks->all.kernels[i];
    *to = (cg_kernel){.step = kn->step, .kind = kn->kind, .source = cgs_rename(kn->source + kn->body, o->prefix)};
    char *name = cgs_rename(kn->name, o->prefix);
    assert_true(to->source && name);
    snprintf(to->name, sizeof to->name, "%s", name);
    al_free(name);
    ks->keys[i] = key;
    ks->slots[slot] = i;
    return i;
}

static void kernel_set_free(kernel_set *ks)
{
    for (int i = 0; i < ks->all.nkernels; i++) al_free(ks->keys[i]);
    cg_program_free(&ks->all);
    test_free(ks->keys), test_free(ks->slots);
    memset(ks, 0, sizeof *ks);
}

/* The distinct kernels of every graph of gs (emitted), each graph's
 * kernels' indices in the set into o->kernel. */
static void collect_kernels(op_graphs *gs, kernel_set *ks)
{
    int total = 0;
    for (int i = 0; i < gs->n; i++) total += gs->at[i].step.prog.nkernels;
    kernel_set_init(ks, total);
    for (int i = 0; i < gs->n; i++) {
        op_graph *o = &gs->at[i];
        snprintf(o->prefix, sizeof o->prefix, "c%d_", i);
        o->kernel = test_calloc((size_t)o->step.prog.nkernels + 1, sizeof(int));
        for (int k = 0; k < o->step.prog.nkernels; k++) o->kernel[k] = kernel_set_add(ks, o, &o->step.prog.kernels[k]);
    }
}

/* ---- the emulation ---- */

typedef struct library_job {
    char **sources;
    const char **first; /* a kernel of each library */
    emu_kernel **libs;
    char (*errors)[2048];
} library_job;

/* Compiles library i on a pool thread: nothing here may allocate through
 * alloy's hook (cmocka's allocator, not thread-safe); emu_compile uses the
 * C library's. */
static void compile_library(void *ctx, int i)
{
    library_job *j = ctx;
    j->libs[i] = emu_compile(j->sources[i], j->first[i], j->errors[i], sizeof j->errors[0]);
}

typedef struct group_stats {
    int cases, graphs, backward, kernels, values, bitwise, failed, known;
    double worst;
} group_stats;

static void test_every_op_case_runs_emulated_as_on_the_cpu(void **state)
{
    const dtype_group group = (dtype_group)(intptr_t)*state;
    char why[256];
    if (!emu_available(why, sizeof why)) {
        print_message("no host emulation: %s\n", why);
        skip();
    }
    double t0 = test_now_ms();
    op_graphs gs = build_all(group);
    for (int i = 0; i < gs.n; i++) cgs_prepare(&gs.at[i].step, gs.at[i].g, &gs.at[i].f);
    kernel_set ks;
    collect_kernels(&gs, &ks);
    double t1 = test_now_ms();
    int nlib = (ks.all.nkernels + KERNELS_PER_LIBRARY - 1) / KERNELS_PER_LIBRARY;
    /* library i: the set's kernels [i * per, (i + 1) * per) */
    int per = nlib ? (ks.all.nkernels + nlib - 1) / nlib : 0;
    library_job job = {test_calloc((size_t)nlib + 1, sizeof(char *)), test_calloc((size_t)nlib + 1, sizeof(char *)),
                       test_calloc((size_t)nlib + 1, sizeof(emu_kernel *)),
                       test_calloc((size_t)nlib + 1, sizeof job.errors[0])};
    for (int i = 0; i < nlib; i++) {
        job.sources[i] = cg_module_source(&ks.all, i * per, per);
        assert_non_null(job.sources[i]);
        job.first[i] = ks.all.kernels[i * per].name;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cg_parallel(nlib, cores > 1 ? (int)cores : 1, compile_library, &job);
    for (int i = 0; i < nlib; i++)
        if (!job.libs[i]) fail_msg("emulation library %d of %s: %s", i, group_names[group], job.errors[i]);
    double t2 = test_now_ms();
    group_stats gst = {0};
    const oc_case *last = NULL;
    for (int i = 0; i < gs.n; i++) {
        op_graph *o = &gs.at[i];
        cgs_kernel_at *at = test_calloc((size_t)o->step.prog.nkernels + 1, sizeof *at);
        for (int k = 0; k < o->step.prog.nkernels; k++) {
            at[k].library = job.libs[o->kernel[k] / per];
            snprintf(at[k].name, sizeof at[k].name, "%s", ks.all.kernels[o->kernel[k]].name);
        }
        emu_stats st = cgs_emulate(&o->step, at);
        test_free(at);
        gst.cases += o->c != last;
        last = o->c;
        gst.graphs++;
        gst.kernels += st.kernels, gst.values += st.values, gst.bitwise += st.bitwise;
        if (st.worst > gst.worst) gst.worst = st.worst;
        gst.backward += o->grad;
        const known_failure *k = known_failure_of(o);
        const char *failure = st.failed ? st.first_failure : st.inexact ? st.first_inexact : NULL;
        if (failure && k) {
            gst.known++;
            print_message("known failure: %s: %s (%s)\n", what_of(o), failure, k->why);
        } else if (failure) {
            gst.failed++;
            test_case_failed("%s: %s%s", what_of(o), failure, st.failed ? "" : " (not bit for bit)");
        } else if (k) {
            print_message("a known failure passes now: %s (%s)\n", what_of(o), k->why);
        }
    }
    double t3 = test_now_ms();
    print_message("%s: %d cases in %d graphs (%d with the backward), %d kernels (%d distinct, in %d libraries); %d "
                  "stored values, %d (%.1f%%) bit for bit, worst error %.2g; %d failed, %d known failures; %.0f ms "
                  "(graphs and CPU %.0f, g++ %.0f, emulation %.0f)\n",
                  group_names[group], gst.cases, gst.graphs, gst.backward, gst.kernels, ks.all.nkernels, nlib, gst.values,
                  gst.bitwise, gst.values ? 100.0 * gst.bitwise / gst.values : 100.0, gst.worst, gst.failed, gst.known,
                  t3 - t0, t1 - t0, t2 - t1, t3 - t2);
    for (int i = 0; i < nlib; i++) emu_free(job.libs[i]), al_free(job.sources[i]);
    test_free(job.sources), test_free(job.first), test_free(job.libs), test_free(job.errors);
    kernel_set_free(&ks);
    release_all(&gs);
    test_end_cases();
}

/* ---- NVRTC ---- */

static void test_every_kernel_of_the_op_cases_compiles_for_sm80_and_sm90(void **state)
{
    (void)state;
    cg_nvrtc *nv = nvrtc_or_skip();
    op_graphs gs = build_all(NGROUPS);
    int kernels = 0;
    for (int i = 0; i < gs.n; i++) emit_only(&gs.at[i]), kernels += gs.at[i].step.prog.nkernels;
    kernel_set ks;
    collect_kernels(&gs, &ks);
    char dir[] = "/tmp/alloy-kcache-XXXXXX", cmd[128];
    assert_non_null(mkdtemp(dir));
    static const int archs[] = {80, 90};
    int modules, compiles;
    double ms = compile_all(nv, dir, &ks.all, 1, archs, 2, &modules, &compiles);
    print_message("op cases (every dtype, forward and backward): %d graphs, %d kernels (%d distinct) in %d NVRTC programs "
                  "for sm_80 and sm_90: %.0f ms\n",
                  gs.n, kernels, ks.all.nkernels, modules, ms);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    kernel_set_free(&ks);
    release_all(&gs);
    cg_nvrtc_close(nv);
}

/* ---- the ops without a kernel ---- */

static void test_only_library_calls_are_left_without_a_kernel(void **state)
{
    (void)state;
    op_graphs gs = build_all(NGROUPS);
    /* the steps left without a kernel by their last node's op and the reason: how often, one case */
    struct {
        int op, count;
        const char *why;
        char example[320];
    } left[64];
    int nleft = 0, leaves = 0, graphs_without_steps = 0, empty = 0;
    for (int i = 0; i < gs.n; i++) {
        op_graph *o = &gs.at[i];
        emit_only(o);
        const schedule *s = &o->g->comp.sched;
        graphs_without_steps += s->nsteps == 0;
        leaves += is_bound(o->c->op);
        for (int k = 0; k < o->step.prog.nskipped; k++) {
            const sched_step *st = &s->steps[o->step.prog.skipped[k]];
            if (ir_numel(&st->space) == 0) { /* nothing to compute */
                empty++;
                continue;
            }
            int op = o->g->compiled->nodes[st->pos]->op, j = 0;
            const char *why = o->step.prog.why[k];
            while (j < nleft && !(left[j].op == op && strcmp(left[j].why, why) == 0)) j++;
            if (j == nleft) {
                assert_true(nleft < 64);
                left[nleft].op = op, left[nleft].count = 0, left[nleft].why = why;
                snprintf(left[nleft++].example, sizeof left[0].example, "%s", what_of(o));
            }
            left[j].count++;
        }
    }
    print_message("%d graphs (%d of bound leaves; %d without any step, their output a bound value); %d steps over no "
                  "elements without a kernel\n",
                  gs.n, leaves, graphs_without_steps, empty);
    for (int j = 0; j < nleft; j++) {
        const char *op = ir_ops[left[j].op].name;
        const known_gap *k = library_ops;
        while (k->op && (strcmp(k->op, op) || strcmp(k->why, left[j].why))) k++;
        print_message("no kernel for %s (%d steps, e.g. %s): %s\n", op, left[j].count, left[j].example, left[j].why);
        if (!k->op) test_case_failed("%s has steps without a kernel: %s (e.g. %s)", op, left[j].why, left[j].example);
    }
    release_all(&gs);
    test_end_cases();
}

/* Whether op is in the comma-separated list (NULL: every op is). */
static bool listed(const char *list, const char *op)
{
    if (!list) return true;
    size_t len = strlen(op);
    for (const char *at = list; (at = strstr(at, op)) != NULL; at += len)
        if ((at == list || at[-1] == ',') && (at[len] == ',' || at[len] == '\0')) return true;
    return false;
}

/* The short names of the dtype groups on the command line, in group order. */
static const char *const group_args[NGROUPS] = {"fp32", "f16", "bf16", "f64", "int"};

/* With "emulate" the tests but the NVRTC one, with "nvrtc" only that one
 * (meson runs them as separate tests: the NVRTC compiles take the longer),
 * with no argument all. After "emulate", a comma-separated list of dtype
 * groups (fp32,f16,bf16,f64,int) keeps the emulation to those groups, so the
 * sweep can run as several tests, each well inside its time limit.
 * OP_CASES_ONLY=op,op keeps the rows of those ops only (the counts printed
 * are then theirs). */
int main(int argc, char **argv)
{
    const char *only = getenv("OP_CASES_ONLY");
    const char *part = argc > 1 ? argv[1] : "";
    const char *groups = argc > 2 ? argv[2] : NULL;
    bool bad_group = false;
    if (groups) {
        for (const char *at = groups; *at;) {
            size_t len = strcspn(at, ",");
            int g = 0;
            while (g < NGROUPS && !(strlen(group_args[g]) == len && strncmp(group_args[g], at, len) == 0)) g++;
            bad_group |= g == NGROUPS;
            at += len + (at[len] == ',');
        }
    }
    if ((*part && strcmp(part, "emulate") && strcmp(part, "nvrtc")) || (groups && strcmp(part, "emulate")) ||
        bad_group || argc > 3) {
        fprintf(stderr, "usage: %s [emulate [fp32,f16,bf16,f64,int] | nvrtc]\n", argv[0]);
        return 2;
    }
    for (int r = 0; r < op_ncases; r++) {
        char err[256];
        if (!listed(only, op_cases[r].op)) continue;
        row_count[r] = oc_expand(&op_cases[r], &row_cases[r], err, sizeof err);
        if (row_count[r] < 0) {
            fprintf(stderr, "op case row %d (%s): %s\n", r, op_cases[r].op, err);
            return 1;
        }
    }
    static const char *const names[NGROUPS] = {
        "test_every_op_case_runs_emulated_as_on_the_cpu_in_fp32",
        "test_every_op_case_runs_emulated_as_on_the_cpu_in_f16",
        "test_every_op_case_runs_emulated_as_on_the_cpu_in_bf16",
        "test_every_op_case_runs_emulated_as_on_the_cpu_in_f64",
        "test_every_op_case_runs_emulated_as_on_the_cpu_in_integers_and_bool",
    };
    struct CMUnitTest tests[NGROUPS + 2];
    size_t n = 0;
    if (strcmp(part, "nvrtc")) {
        /* (every dtype's graphs, emitted only: once, with the fp32 group) */
        if (listed(groups, group_args[G_F32]))
            tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_only_library_calls_are_left_without_a_kernel);
        for (int g = 0; g < NGROUPS; g++)
            if (listed(groups, group_args[g]))
                tests[n++] = (struct CMUnitTest){names[g], test_every_op_case_runs_emulated_as_on_the_cpu, NULL, NULL,
                                                 (void *)(intptr_t)g};
    }
    if (strcmp(part, "emulate"))
        tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_every_kernel_of_the_op_cases_compiles_for_sm80_and_sm90);
    int failed = _cmocka_run_group_tests("codegen", tests, n, test_checked_alloc, test_plain_alloc);
    for (int r = 0; r < op_ncases; r++) free(row_cases[r]);
    return failed;
}
