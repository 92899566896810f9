/* test_op_cases.c - every case of the op table (op_cases.c) on every backend: evaluation against the f64 reference in every dtype the op accepts, gradients against finite differences, fused against unfused; and the guards that every op has its cases and its row in docs/ir.md. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend_exec.h"
#include "gradcheck.h"
#include "ir/groups.h"
#include "op_cases.h"
#include "passes/grad_rules.h"
#include "support.h"
#ifdef ALLOY_OP_CASES_EMULATED /* test_op_cases_emu: the CUDA backend on the emulated device */
#include "cuda_emu/emu_device.h"
#endif

/* The gradient check runs on the cases of at most this many operand
 * elements (finite differences evaluate the reference twice per element). */
enum { GRAD_MAX_ELEMENTS = 1024 };

static const alloy_dtype all_dtypes[] = {F32, F16, BF16, F64, I32, I64, BOOL};
static const alloy_dtype float_dtypes[] = {F64, F32, F16, BF16};
enum { NDTYPES = sizeof all_dtypes / sizeof all_dtypes[0], NFLOAT = sizeof float_dtypes / sizeof float_dtypes[0] };

/* The table expanded once (main): the cases of row r and why a row did not expand. */
static oc_case *row_cases[512];
static int row_count[512];
static char row_error[512][256];

static al_arena arena; /* the running test's tensors, freed at its end */

/* ---- graphs of one case ---- */

static bool is_bound(int op) { return op == IR_OP_input || op == IR_OP_param || op == IR_OP_state; }

static int add_input(ir_graph *g, const char *name, const ir_type *t)
{
    ir_node *n = ir_add_node(g, IR_OP_input, 0, NULL, 0, NULL, t, name);
    return n ? n->id : -1;
}

static int add_op(ir_graph *g, int op, int a, int b)
{
    int in[2] = {a, b};
    ir_node *n = a < 0 || b < 0 ? NULL : ir_add_node(g, op, 2, in, 0, NULL, NULL, NULL);
    return n ? n->id : -1;
}

/* x * s_<dtype>, s a scalar input of x's dtype (made on first use): an
 * elementwise neighbour for the fusion chain. */
static int scaled(ir_graph *g, int x)
{
    char name[32];
    const ir_type t = {.dtype = g->nodes[x]->type.dtype};
    snprintf(name, sizeof name, "s_%s", alloy_dtype_name(t.dtype));
    int s = ir_find_name(g, name);
    return add_op(g, IR_OP_mul, x, s >= 0 ? s : add_input(g, name, &t));
}

/* Case c in dtype dt into g: an input "x<k>" per operand (scaled by an
 * elementwise neighbour when chain and it is float), the op as node "y".
 * Its id, or -1 with the type rule's reason in g->error. */
static int add_case(ir_graph *g, const oc_case *c, alloy_dtype dt, bool chain)
{
    int ids[OC_MAX_IN];
    for (int k = 0; k < c->nin; k++) {
        char name[16];
        ir_type t = oc_operand_type(c, k, dt);
        snprintf(name, sizeof name, "x%d", k);
        ids[k] = add_input(g, name, &t);
        if (chain && ids[k] >= 0 && ir_is_float(t.dtype)) ids[k] = scaled(g, ids[k]);
        if (ids[k] < 0) return -1;
    }
    ir_type declared;
    bool has = oc_declared_type(c, dt, &declared);
    ir_node *n = ir_add_node(g, c->op, c->nin, ids, c->nattrs, c->attrs, has ? &declared : NULL, "y");
    return n ? n->id : -1;
}

static int64_t operand_elements(const oc_case *c)
{
    int64_t n = 0;
    for (int k = 0; k < c->nin; k++) n += ir_numel(&c->in[k]);
    return n;
}

static oc_tensor new_tensor(ir_type t)
{
    oc_tensor x = {t, al_arena_alloc(&arena, sizeof(double) * (size_t)(ir_numel(&t) + 1))};
    assert_non_null(x.v);
    return x;
}

/* The values of y's operands (for a bound leaf: of y itself) as built in g,
 * drawn from the case's domains unless in[] holds them, uploaded under
 * their names "x<k>" (or "y"). */
static bool upload_values(bx_exec *x, const ir_graph *g, const oc_case *c, const ir_node *y, oc_tensor *in)
{
    ir_type types[OC_MAX_IN];
    char names[OC_MAX_IN][16];
    int nvalues = is_bound(c->op) ? 1 : c->nin;
    for (int k = 0; k < nvalues; k++) {
        snprintf(names[k], sizeof names[k], is_bound(c->op) ? "y" : "x%d", k);
        types[k] = g->nodes[ir_find_name(g, names[k])]->type;
    }
    for (int k = 0; k < nvalues; k++) {
        if (!in[k].v) {
            in[k] = new_tensor(types[k]);
            oc_draw(c, k, types, &y->type, in[k].v);
        }
        void *bytes = al_arena_alloc(&arena, ir_nbytes(&types[k]) + 1);
        test_encode(types[k].dtype, in[k].v, bytes, ir_numel(&types[k]));
        if (bx_upload(x, names[k], bytes)) return false;
    }
    return true;
}

static void decode_all(const ir_type *t, const void *bytes, double *v)
{
    for (int64_t i = 0; i < ir_numel(t); i++) v[i] = test_decode(t->dtype, bytes, i);
}

/* Every case draws from its own seed (its label, dtype and check), so a
 * row added to the table changes no other case's values.
 * OP_CASES_SEED=n mixes n in, to try other values. */
static void seed_case(const oc_case *c, alloy_dtype dt, int check)
{
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a */
    for (const char *p = c->label; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3u;
    const char *extra = getenv("OP_CASES_SEED");
    test_rng = h ^ (uint64_t)dt << 56 ^ (uint64_t)check << 48 ^ (extra ? strtoull(extra, NULL, 0) : 0);
}

/* ---- (a) evaluation against the f64 reference ---- */

/* Runs case c in dtype dt on b and compares with the reference; false
 * when the op's type rule refuses dt. */
static bool evaluate_case(rt_backend *b, const oc_case *c, alloy_dtype dt, const char *backend)
{
    ir_graph *g = ir_graph_new("op_case");
    assert_non_null(g);
    int y = add_case(g, c, dt, false);
    if (y < 0) {
        ir_graph_free(g);
        return false;
    }
    assert_int_equal(ir_add_output(g, "y", y), ALLOY_OK);
    const ir_node *n = g->nodes[y];
    seed_case(c, dt, 0);
    oc_tensor in[OC_MAX_IN] = {{{0}, NULL}};
    bx_exec x;
    const ir_type *t;
    const void *got;
    if (bx_compile(b, g, &(bx_options){0}, &x) || !upload_values(&x, g, c, n, in) || bx_run(&x) ||
        !(got = bx_output(&x, "y", &t))) {
        test_case_failed("%s: %s in %s: %s", backend, c->label, alloy_dtype_name(dt), x.error);
    } else {
        oc_tensor ref = new_tensor(n->type), out = new_tensor(*t);
        char why[256];
        decode_all(t, got, out.v);
        oc_evaluate(c, n, in, &ref);
        if (!ir_type_eq(t, &n->type))
            test_case_failed("%s: %s in %s: the result is %s, the graph says %s", backend, c->label, alloy_dtype_name(dt),
                             test_type_str(t), test_type_str(&n->type));
        else if (!test_close(out.v, ref.v, ir_numel(t), oc_bound(c, t->dtype, false), why, sizeof why))
            test_case_failed("%s: %s in %s: %s", backend, c->label, alloy_dtype_name(dt), why);
        if (getenv("OP_CASES_VERBOSE"))
            printf("  %s: %s in %s: normalized error %.2e\n", backend, c->label, alloy_dtype_name(dt),
                   test_normalized_error(out.v, ref.v, ir_numel(t)));
    }
    bx_free(&x);
    ir_graph_free(g);
    return true;
}

/* ---- (b) gradients against finite differences of the reference ---- */

/* The loss the gradient check differentiates: sum(ref(in) * r) in f64. */
typedef struct fd_loss {
    const oc_case *c;
    const ir_node *y;
    const oc_tensor *in;
    oc_tensor out;
    const double *r;
} fd_loss;

static double reference_loss(void *ctx, int changed)
{
    (void)changed;
    fd_loss *l = ctx;
    oc_evaluate(l->c, l->y, l->in, &l->out);
    double s = 0;
    for (int64_t i = 0; i < ir_numel(&l->out.type); i++) s += l->out.v[i] * l->r[i];
    return s;
}

/* The gradients of a rounding dtype against finite differences: the
 * normalized error over every gradient element of the case together. Not
 * gc_check's per-tensor max error: a gradient that sums many terms (a
 * broadcast operand's) may cancel far below its terms and keep no relative
 * precision after their rounding, while the case as a whole keeps it. */
static double rounded_gradient_error(const char *what, gc_tensor *t, int n, fd_loss *l, double bound)
{
    int64_t total = 0;
    for (int j = 0; j < n; j++) total += t[j].count;
    double *grad = al_arena_alloc(&arena, sizeof(double) * (size_t)(total + 1));
    double *fd = al_arena_alloc(&arena, sizeof(double) * (size_t)(total + 1)), *fds[OC_MAX_IN];
    for (int j = 0, at = 0; j < n; at += (int)t[j].count, j++) {
        fds[j] = fd + at;
        memcpy(grad + at, t[j].grad, sizeof(double) * (size_t)t[j].count);
    }
    gc_differences(t, n, reference_loss, l, fds);
    for (int64_t i = 0; i < total; i++)
        if (!isfinite(grad[i]) || !isfinite(fd[i])) {
            test_case_failed("%s: gradient element %lld is %g, finite differences %g", what, (long long)i, grad[i], fd[i]);
            return INFINITY;
        }
    double err = test_normalized_error(grad, fd, total);
    if (err > bound) test_case_failed("%s: the gradients' normalized error is %.2e > %.0e", what, err, bound);
    return err;
}

/* Checks the gradients autodiff builds for case c in dtype dt (run on b)
 * against finite differences of loss = sum(y * r) with r fixed random
 * weights, at the same inputs; false when the case has no float result or
 * operand in dt. */
static bool gradient_case(rt_backend *b, const oc_case *c, alloy_dtype dt, const char *backend)
{
    ir_graph *g = ir_graph_new("op_case_grad");
    assert_non_null(g);
    int y = add_case(g, c, dt, false);
    const ir_node *n = y >= 0 ? g->nodes[y] : NULL;
    const char *names[OC_MAX_IN];
    static const char *const xs[OC_MAX_IN] = {"x0", "x1", "x2", "x3", "x4"};
    int ng = 0, which[OC_MAX_IN];
    for (int k = 0; n && k < c->nin; k++)
        if (ir_is_float(g->nodes[n->in[k]]->type.dtype) && !(c->row->constant_in >> k & 1)) which[ng] = k, names[ng++] = xs[k];
    if (!n || !ir_is_float(n->type.dtype) || !ng) {
        ir_graph_free(g);
        return false;
    }
    seed_case(c, dt, 1);
    int loss = add_op(g, IR_OP_mul, y, add_input(g, "r", &n->type));
    ir_node *sum = loss < 0 ? NULL : ir_add_node(g, IR_OP_reduce_sum, 1, &loss, 0, NULL, NULL, "loss");
    if (!sum) fail_msg("%s: the loss does not build: %s", c->label, g->error);
    g->loss = sum->id;
    assert_int_equal(ir_add_output(g, "loss", sum->id), ALLOY_OK);
    oc_tensor in[OC_MAX_IN] = {{{0}, NULL}}, r = new_tensor(n->type);
    for (int64_t i = 0; i < ir_numel(&r.type); i++)
        do r.v[i] = test_round_to(r.type.dtype, test_uniform(-1, 1));
        while (fabs(r.v[i]) < 0.1);
    void *r_bytes = al_arena_alloc(&arena, ir_nbytes(&r.type) + 1);
    test_encode(r.type.dtype, r.v, r_bytes, ir_numel(&r.type));
    bx_exec x;
    bx_options o = {.train = true, .grad_inputs = names, .ngrad_inputs = ng};
    char what[320];
    snprintf(what, sizeof what, "%s: %s in %s", backend, c->label, alloy_dtype_name(dt));
    if (bx_compile(b, g, &o, &x) || !upload_values(&x, g, c, n, in) || bx_upload(&x, "r", r_bytes) || bx_run(&x)) {
        test_case_failed("%s: %s", what, x.error);
    } else {
        gc_tensor t[OC_MAX_IN];
        bool ok = true;
        for (int j = 0; j < ng && ok; j++) {
            char name[16];
            const ir_type *gt, *want = &in[which[j]].type;
            snprintf(name, sizeof name, "grad:%s", names[j]);
            const void *bytes = bx_output(&x, name, &gt);
            if (!bytes || !ir_type_eq(gt, want)) {
                test_case_failed("%s: %s is %s, expected %s", what, name, bytes ? test_type_str(gt) : "missing",
                                 test_type_str(want));
                ok = false;
                break;
            }
            double *grad = al_arena_alloc(&arena, sizeof(double) * (size_t)(ir_numel(gt) + 1));
            decode_all(gt, bytes, grad);
            t[j] = (gc_tensor){names[j], in[which[j]].v, ir_numel(gt), grad};
        }
        fd_loss l = {c, n, in, new_tensor(n->type), r.v};
        double err = !ok ? 0 : dt == F64 ? gc_check(what, t, ng, reference_loss, &l, oc_bound(c, dt, true))
                                         : rounded_gradient_error(what, t, ng, &l, oc_bound(c, dt, true));
        if (getenv("OP_CASES_VERBOSE")) printf("  %s: gradient error %.2e\n", what, err);
    }
    bx_free(&x);
    ir_graph_free(g);
    return true;
}

/* ---- (c) fused against unfused ---- */

/* The op inside a chain: each float operand scaled by an elementwise mul,
 * the float result scaled again, output "out". NULL when the case does not
 * build in dt or the fusion rules let its node join no group. */
static ir_graph *chain_graph(const oc_case *c, alloy_dtype dt)
{
    ir_graph *g = ir_graph_new("op_case_chain");
    assert_non_null(g);
    int y = add_case(g, c, dt, true);
    const ir_node *n = y >= 0 ? g->nodes[y] : NULL;
    if (!n || !(ir_fuse_elementwise(g, n) || ir_fuse_row_op(g, n))) {
        ir_graph_free(g);
        return NULL;
    }
    int out = ir_is_float(n->type.dtype) ? scaled(g, y) : y;
    if (out < 0 || ir_add_output(g, "out", out)) fail_msg("%s: the chain does not build: %s", c->label, g->error);
    return g;
}

/* -1 when compiled graph c lost the op's node y (a pass removed it), else
 * whether y sits in a group with another member. */
static int joined_group(const ir_graph *c, int op)
{
    int y = ir_find_name(c, "y");
    if (y < 0 || c->nodes[y]->op != op) return -1;
    int members = 0;
    for (int i = 0; c->nodes[y]->group >= 0 && i < c->nnodes; i++) members += c->nodes[i]->group == c->nodes[y]->group;
    return members >= 2;
}

/* Runs the chain of case c in dt fused and with no_fuse=all on b; the
 * outputs must have the same bits: f32 and f64 groups compute in their own
 * precision, and an unrounded f32 (f64) intermediate is the stored value,
 * so fusion changes no rounding (docs/fusion.md). Returns -1 when not
 * applicable, else whether the op joined a group. */
static int fusion_case(rt_backend *b, const oc_case *c, alloy_dtype dt, const char *backend)
{
    ir_graph *g = chain_graph(c, dt);
    if (!g) return -1;
    bx_exec fused, unfused;
    char what[320];
    snprintf(what, sizeof what, "%s: %s in %s", backend, c->label, alloy_dtype_name(dt));
    int joined = -1;
    alloy_status st = bx_compile(b, g, &(bx_options){0}, &fused);
    if (st) test_case_failed("%s fused: %s", what, fused.error);
    else if (bx_compile(b, g, &(bx_options){.no_fuse = true}, &unfused)) test_case_failed("%s unfused: %s", what, unfused.error);
    else {
        joined = joined_group(fused.graph, c->op);
        for (int i = 0; i < unfused.graph->nnodes; i++)
            if (unfused.graph->nodes[i]->group >= 0) {
                test_case_failed("%s: node %d is in group %d with no_fuse=all", what, i, unfused.graph->nodes[i]->group);
                break;
            }
        oc_tensor in[OC_MAX_IN] = {{{0}, NULL}};
        const ir_node *n = g->nodes[ir_find_name(g, "y")];
        seed_case(c, dt, 2);
        bool ok = upload_values(&fused, g, c, n, in) && upload_values(&unfused, g, c, n, in);
        for (int k = 0; k < fused.graph->nnodes && ok; k++) { /* the scales s_<dtype> are 0.75 */
            const ir_node *s = fused.graph->nodes[k];
            if (s->op != IR_OP_input || strncmp(s->name, "s_", 2)) continue;
            double v = 0.75;
            unsigned char bytes[8];
            test_encode(s->type.dtype, &v, bytes, 1);
            ok = !bx_upload(&fused, s->name, bytes) && !bx_upload(&unfused, s->name, bytes);
        }
        const ir_type *t;
        const void *a, *bits;
        int64_t at = 0;
        if (!ok || bx_run(&fused) || bx_run(&unfused)) test_case_failed("%s: %s%s", what, fused.error, unfused.error);
        else if (!(a = bx_output(&fused, "out", &t)) || !(bits = bx_output(&unfused, "out", NULL)))
            test_case_failed("%s: no output", what);
        else if (!test_same_bits(t->dtype, a, bits, ir_numel(t), &at))
            test_case_failed("%s: element %lld is %.9g fused, %.9g unfused", what, (long long)at, test_decode(t->dtype, a, at),
                             test_decode(t->dtype, bits, at));
        if (getenv("OP_CASES_VERBOSE")) printf("  %s: fused and unfused compared, %s a group\n", what, joined > 0 ? "in" : "not in");
        bx_free(&unfused);
    }
    bx_free(&fused);
    ir_graph_free(g);
    return joined;
}

/* ---- the tests of one op on one backend ---- */

typedef enum mode { EVALUATE, GRADIENT, FUSION } mode;

typedef struct op_test {
    int backend, op;
    mode mode;
} op_test;

static void test_op_on_backend(void **state)
{
    const op_test *t = *state;
    const char *backend = rt_backend_name(t->backend), *op = ir_ops[t->op].name;
    rt_backend *b;
    char err[512];
    alloy_status st = bx_open(t->backend, &b, err, sizeof err);
    if (st == ALLOY_ERR_UNSUPPORTED) {
        print_message("backend %s cannot run here: %s\n", backend, err);
        skip();
    }
    if (st) fail_msg("opening backend %s: %s", backend, err);
    int ran = 0, joined = 0;
    for (int r = 0; r < op_ncases; r++)
        for (int i = 0; i < row_count[r]; i++) {
            const oc_case *c = &row_cases[r][i];
            if (c->op != t->op) continue;
            if (t->mode == EVALUATE)
                for (int d = 0, built = 0; d < NDTYPES && (!built || oc_takes_dtype(c)); d++)
                    built += evaluate_case(b, c, all_dtypes[d], backend), ran += built;
            if (t->mode == GRADIENT && !(c->row->flags & OC_NO_GRAD) && operand_elements(c) <= GRAD_MAX_ELEMENTS)
                for (int d = 0, built = 0; d < NFLOAT && (!built || oc_takes_dtype(c)); d++)
                    built += gradient_case(b, c, float_dtypes[d], backend), ran += built;
            if (t->mode == FUSION)
                for (int d = 0; d < 2; d++) {
                    int j = fusion_case(b, c, d ? F64 : F32, backend);
                    ran += j >= 0, joined += j > 0;
                }
        }
    rt_backend_close(b);
    al_arena_free(&arena); /* before cmocka checks for leaks */
    if (!ran) test_case_failed("%s: no case of %s ran", backend, op);
    if (t->mode == FUSION && ran && !joined) test_case_failed("%s: no case of %s joined a fusion group", backend, op);
    test_end_cases();
}

/* ---- the guards ---- */

static void test_every_row_of_the_table_expands_and_each_case_builds_in_some_dtype(void **state)
{
    (void)state;
    for (int r = 0; r < op_ncases; r++) {
        if (row_error[r][0]) test_case_failed("row %d (%s): %s", r, op_cases[r].op, row_error[r]);
        for (int i = 0; i < row_count[r]; i++) {
            const oc_case *c = &row_cases[r][i];
            char why[1024] = "";
            bool built = false;
            for (int d = 0; d < NDTYPES && !built; d++) {
                ir_graph *g = ir_graph_new("op_case");
                assert_non_null(g);
                built = add_case(g, c, all_dtypes[d], false) >= 0;
                if (!built) snprintf(why, sizeof why, "%s", g->error);
                ir_graph_free(g);
            }
            if (!built) test_case_failed("%s builds in no dtype: %s", c->label, why);
            if (!oc_reference(c)) test_case_failed("%s has no reference (op_case.ref)", c->label);
        }
    }
    test_end_cases();
}

/* The op has some case (and, for a gradient case, one the check runs on). */
static bool has_case(int op, bool gradient)
{
    for (int r = 0; r < op_ncases; r++)
        for (int i = 0; i < row_count[r]; i++) {
            const oc_case *c = &row_cases[r][i];
            if (c->op == op && (!gradient || (!(c->row->flags & OC_NO_GRAD) && operand_elements(c) <= GRAD_MAX_ELEMENTS)))
                return true;
        }
    return false;
}

/* Leaves count like any op: input, param and state have cases whose value
 * is bound and read back, constant has cases of its attributes. */
static void test_every_op_of_ops_def_has_an_evaluation_case(void **state)
{
    (void)state;
    for (int op = 0; op < IR_OP_COUNT; op++)
        if (!has_case(op, false)) test_case_failed("op %s has no case in tests/op_cases.c", ir_ops[op].name);
    test_end_cases();
}

static void test_every_differentiable_op_has_a_gradient_case(void **state)
{
    (void)state;
    for (int op = 0; op < IR_OP_COUNT; op++)
        if (ad_rules[op] && !has_case(op, true))
            test_case_failed("op %s has a gradient rule but no gradient case in tests/op_cases.c (a row without "
                             "OC_NO_GRAD of at most %d operand elements)",
                             ir_ops[op].name, GRAD_MAX_ELEMENTS);
    test_end_cases();
}

static const char *const amp_names[] = {[AMP_ALLOW] = "allow", [AMP_DENY] = "deny", [AMP_INFER] = "infer", [AMP_CLEAR] = "clear"};

/* The class named by the last cell of the table row at line (-1 when it names none). */
static int amp_cell(const char *line)
{
    const char *end = strchr(line, '\n') ? strchr(line, '\n') : line + strlen(line);
    while (end > line && (end[-1] == ' ' || end[-1] == '|')) end--;
    const char *start = end;
    while (start > line && start[-1] != '|') start--;
    while (start < end && *start == ' ') start++;
    for (int k = 0; k < (int)(sizeof amp_names / sizeof amp_names[0]); k++)
        if (amp_names[k] && strlen(amp_names[k]) == (size_t)(end - start) && !strncmp(start, amp_names[k], (size_t)(end - start)))
            return k;
    return -1;
}

/* The `names` in the first column of the tables under "## Ops" in docs/ir.md:
 * documented[op] for the ops, the others reported when unknown is set; with
 * check_amp, each named op's class in ops.def against the row's AMP column. */
static void documented_ops(bool *documented, bool report_unknown, bool check_amp)
{
    size_t len;
    char *text = (char *)test_read_file(ALLOY_IR_MD, &len);
    char *at = strstr(text, "\n## Ops\n");
    if (!at) fail_msg("%s has no section \"## Ops\"", ALLOY_IR_MD);
    char *end = strstr(at + 1, "\n## ");
    if (end) *end = '\0';
    int rows = 0;
    for (char *line = at + 1; line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (line[0] != '|') continue;
        char *cell_end = strchr(line + 1, '|'), *tick = line;
        while ((tick = strchr(tick, '`')) && tick < cell_end) {
            char *close = strchr(tick + 1, '`'), name[64];
            if (!close || close > cell_end) break;
            snprintf(name, sizeof name, "%.*s", (int)(close - tick - 1), tick + 1);
            int op = ir_op_lookup(name), amp = amp_cell(line);
            if (op >= 0) documented[op] = true;
            else if (report_unknown) test_case_failed("docs/ir.md documents an op `%s` that ops.def does not have", name);
            if (op >= 0 && check_amp && amp != (int)ir_ops[op].amp)
                test_case_failed("docs/ir.md gives `%s` the AMP class %s, ops.def %s", name, amp < 0 ? "(none)" : amp_names[amp],
                                 amp_names[ir_ops[op].amp]);
            tick = close + 1;
            rows++;
        }
    }
    test_free(text);
    if (!rows) fail_msg("no op names in the tables of \"## Ops\" in %s", ALLOY_IR_MD);
}

static void test_every_op_of_ops_def_has_a_row_in_the_op_table_of_docs_ir_md(void **state)
{
    (void)state;
    bool documented[IR_OP_COUNT] = {0};
    documented_ops(documented, false, false);
    for (int op = 0; op < IR_OP_COUNT; op++)
        if (!documented[op]) test_case_failed("op %s has no row in the op table of docs/ir.md (## Ops)", ir_ops[op].name);
    test_end_cases();
}

static void test_the_op_table_of_docs_ir_md_names_only_ops_of_ops_def(void **state)
{
    (void)state;
    bool documented[IR_OP_COUNT] = {0};
    documented_ops(documented, true, false);
    test_end_cases();
}

static void test_the_amp_column_of_docs_ir_md_is_each_ops_class_in_ops_def(void **state)
{
    (void)state;
    bool documented[IR_OP_COUNT] = {0};
    documented_ops(documented, false, true);
    test_end_cases();
}

/* ---- running ---- */

/* Whether the fusion rules (ir_fuse_elementwise, ir_fuse_row_op) let some
 * case of op, as a chain in f32 or f64, join a group. */
static bool fusible(int op)
{
    for (int r = 0; r < op_ncases; r++)
        for (int i = 0; i < row_count[r]; i++)
            for (int d = 0; row_cases[r][i].op == op && d < 2; d++) {
                ir_graph *g = chain_graph(&row_cases[r][i], d ? F64 : F32);
                bool yes = g != NULL;
                ir_graph_free(g);
                if (yes) return true;
            }
    return false;
}

/* A test that failed half way left its blocks to cmocka, which freed them. */
static int teardown(void **state)
{
    (void)state;
    memset(&arena, 0, sizeof arena);
    alloy_set_allocator(NULL, NULL);
    return 0;
}

#define GUARD(f) cmocka_unit_test_setup_teardown(f, test_checked_alloc, teardown)

int main(void)
{
#ifdef ALLOY_OP_CASES_EMULATED
    rt_backend_set_cuda_opener(emu_backend_opener);
    const char *only_backend = "cuda"; /* the CPU's cases are op_cases' */
#else
    const char *only_backend = NULL;
#endif
    for (int r = 0; r < op_ncases; r++) {
        row_count[r] = oc_expand(&op_cases[r], &row_cases[r], row_error[r], sizeof row_error[r]);
        if (row_count[r] < 0) row_count[r] = 0;
        else row_error[r][0] = '\0';
    }
    if (getenv("OP_CASES_VERBOSE")) {
        int ncases = 0;
        bool has[IR_OP_COUNT] = {0};
        for (int r = 0; r < op_ncases; r++) ncases += row_count[r], has[ir_op_lookup(op_cases[r].op) >= 0 ? ir_op_lookup(op_cases[r].op) : 0] = true;
        int nops = 0;
        for (int op = 0; op < IR_OP_COUNT; op++) nops += has[op];
        printf("op case table: %d rows, %d cases, %d of %d ops\n", op_ncases, ncases, nops, IR_OP_COUNT);
    }
    static const struct CMUnitTest guards[] = {
        GUARD(test_every_row_of_the_table_expands_and_each_case_builds_in_some_dtype),
        GUARD(test_every_op_of_ops_def_has_an_evaluation_case),
        GUARD(test_every_differentiable_op_has_a_gradient_case),
        GUARD(test_every_op_of_ops_def_has_a_row_in_the_op_table_of_docs_ir_md),
        GUARD(test_the_op_table_of_docs_ir_md_names_only_ops_of_ops_def),
        GUARD(test_the_amp_column_of_docs_ir_md_is_each_ops_class_in_ops_def),
    };
    enum { NGUARDS = sizeof guards / sizeof guards[0] };
    size_t max = NGUARDS + (size_t)rt_backend_count() * IR_OP_COUNT * 3, n = 0;
    struct CMUnitTest *tests = calloc(max, sizeof *tests);
    op_test *states = calloc(max, sizeof *states);
    char (*names)[160] = calloc(max, sizeof *names);
    if (!tests || !states || !names) return 1;
    for (; n < NGUARDS; n++) tests[n] = guards[n];
    bool fuses[IR_OP_COUNT];
    for (int op = 0; op < IR_OP_COUNT; op++) fuses[op] = fusible(op);
    static const char *const says[] = {"matches its f64 reference in every dtype it takes",
                                       "gradients match finite differences", "fused gives the unfused bits"};
    for (int b = 0; b < rt_backend_count(); b++)
        for (int m = EVALUATE; m <= FUSION && (!only_backend || !strcmp(rt_backend_name(b), only_backend)); m++)
            for (int op = 0; op < IR_OP_COUNT; op++) {
                if ((m == EVALUATE && !has_case(op, false)) || (m == GRADIENT && !ad_rules[op]) || (m == FUSION && !fuses[op]))
                    continue;
                states[n] = (op_test){b, op, (mode)m};
                snprintf(names[n], sizeof names[n], "%s: %s %s", rt_backend_name(b), ir_ops[op].name, says[m]);
                tests[n] = (struct CMUnitTest){names[n], test_op_on_backend, test_checked_alloc, teardown, &states[n]};
                n++;
            }
    int failed = _cmocka_run_group_tests("ops", tests, n, NULL, NULL);
    for (int r = 0; r < op_ncases; r++) free(row_cases[r]);
    free(tests), free(states), free(names);
    return failed;
}
