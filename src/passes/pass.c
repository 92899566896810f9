/* pass.c - the pass manager: runs the pipeline in order, verifies and prints after each pass, times them. */
#include <string.h>
#include <time.h>

#include "ir/groups.h"
#include "passes/pass.h"
#include "runtime/cpu/cpu.h"

static alloy_status pass_verify(ir_graph **g, const pass_options *opts)
{
    (void)opts;
    return ir_verify(*g);
}

/* The pipeline, in order (DESIGN.md section 3); later passes join here. */
static const pass pipeline[] = {
    {"verify", pass_verify},
    {"amp", pass_amp},
    {"autodiff", pass_autodiff},
    {"grad_scaler", pass_grad_scaler},
    {"optimizer", pass_optimizer},
    {"simplify", pass_simplify},
    {"dce", pass_dce},
    {"fuse", pass_fuse},
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

enum { NPASSES = sizeof pipeline / sizeof pipeline[0] };

int pass_count(void) { return NPASSES; }

const char *pass_name(int i) { return i >= 0 && i < NPASSES ? pipeline[i].name : NULL; }

const al_options *pass_cfg(const pass_options *opts)
{
    static al_options defaults;
    static bool ready;
    if (opts && opts->cfg) return opts->cfg;
    if (!ready) opt_init(&defaults), ready = true;
    return &defaults;
}

/* The "plan" summary printed after fuse: the CPU arena for the default keep
 * set (outputs, updates, loss), one comment line (the IR printer never
 * prints it, so printed IR still parses). */
static void print_plan_summary(const ir_graph *g, FILE *out)
{
    cpu_exec x = {.nthreads = 1};
    mem_plan p;
    if (cpu_plan_arena(&x, g, NULL, &p)) {
        fprintf(out, "# plan: none (%s)\n", x.error);
        return;
    }
    fprintf(out, "# plan: arena %zu bytes, peak live %zu bytes, in place %d", p.arena_bytes,
            p.peak_live_bytes, p.inplace);
    for (int d = 0; d < ALLOY_DTYPE_COUNT; d++)
        if (p.bytes_by_dtype[d]) fprintf(out, ", %s %zu B", alloy_dtype_name((alloy_dtype)d), p.bytes_by_dtype[d]);
    fputc('\n', out);
    plan_free(&p);
}

/* Prints *g with a header line, the options and, after fuse, its groups and plan. */
static void print_graph(const ir_graph *g, const pass_options *opts, FILE *out, const char *when,
                        const pass *p, double ms)
{
    if (ms >= 0) fprintf(out, "# %s %s (%.3f ms)\n", when, p->name, ms);
    else fprintf(out, "# %s %s\n", when, p->name);
    opt_print(pass_cfg(opts), out);
    ir_print(g, out);
    if (ms >= 0 && strcmp(p->name, "fuse") == 0) {
        ir_print_groups(g, out);
        print_plan_summary(g, out);
    }
}

alloy_status pass_run_pipeline(ir_graph **g, const pass_options *opts, FILE *log, pass_timing *timings,
                               int max, int *ntimings)
{
    const al_options *cfg = pass_cfg(opts);
    if (!log) log = stderr;
    if (ntimings) *ntimings = 0;
    for (int i = 0; i < NPASSES; i++) {
        const pass *p = &pipeline[i];
        if (cfg->disabled & 1u << i) continue;
        if (cfg->print_before & 1u << i) print_graph(*g, opts, log, "before", p, -1);
        double t0 = now_ms();
        alloy_status st = p->run(g, opts);
        if (!st && strcmp(p->name, "verify") != 0) st = ir_verify(*g);
        double ms = now_ms() - t0;
        if (timings && ntimings && *ntimings < max)
            timings[(*ntimings)++] = (pass_timing){p->name, ms, (*g)->nnodes};
        if (st) return st;
        if (cfg->print_after & 1u << i) print_graph(*g, opts, log, "after", p, ms);
    }
    return ALLOY_OK;
}

int pass_state_leaf(ir_graph *g, const char *name, alloy_dtype dtype, int rank, const int64_t *dims,
                    double value)
{
    int id = ir_find_name(g, name);
    if (id >= 0) return id;
    ir_type t = {.dtype = dtype, .rank = rank};
    for (int i = 0; i < rank; i++) t.dims[i] = dims[i];
    ir_attr attrs[2] = {ir_a_str("init", value == 0 ? "zeros" : "constant"), ir_a_float("value", value)};
    ir_node *n = ir_add_node(g, IR_OP_state, 0, NULL, value == 0 ? 1 : 2, attrs, &t, name);
    return n ? n->id : -1;
}
