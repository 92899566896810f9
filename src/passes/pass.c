/* pass.c - the pass manager: runs the pipeline in order, verifies and prints after each pass, times them, dumps each stage to a file. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "alloy/train.h"
#include "ir/groups.h"
#include "passes/inspect.h"
#include "passes/lower_norm.h"
#include "passes/pass.h"

static alloy_status pass_verify(ir_graph **g, const pass_options *opts)
{
    (void)opts;
    return ir_verify(*g);
}

/* The schedule pass: the steps of the fused graph, for its default keep set. */
static alloy_status pass_schedule(ir_graph *g, const pass_options *opts, pass_compiled *c)
{
    (void)opts;
    sched_free(&c->sched);
    plan_free(&c->plan);
    char err[256];
    alloy_status st = sched_build(g, NULL, &c->sched, err, sizeof err);
    return st ? ir_error(g, st, "schedule: %s", err) : ALLOY_OK;
}

/* The plan pass: the arena of the schedule (built here if that pass was disabled). */
static alloy_status pass_plan(ir_graph *g, const pass_options *opts, pass_compiled *c)
{
    char err[256];
    alloy_status st = c->sched.steps ? ALLOY_OK : sched_build(g, NULL, &c->sched, err, sizeof err);
    plan_free(&c->plan);
    if (!st) st = plan_for_step(g, &c->sched, pass_cfg(opts)->no_arena, &c->plan, err, sizeof err);
    return st ? ir_error(g, st, "plan: %s", err) : ALLOY_OK;
}

/* The pipeline, in order (step/pipeline.def). */
static const pass pipeline[] = {
#define PASS(name, run, build) {#name, run, build},
#include "step/pipeline.def"
#undef PASS
};

static double clock_ms(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

enum { NPASSES = sizeof pipeline / sizeof pipeline[0] };

const al_options *pass_cfg(const pass_options *opts)
{
    static al_options defaults;
    static bool ready;
    if (opts && opts->cfg) return opts->cfg;
    if (!ready) opt_init(&defaults), ready = true;
    return &defaults;
}

/* Prints *g with a header line, the options, and what the pass made: the
 * group table after fuse, the steps after schedule, and the steps and
 * slots after plan (comments: the printed IR still parses). p NULL: the
 * graph the pipeline starts from. */
static void print_graph(const ir_graph *g, const pass_options *opts, const pass_compiled *c, FILE *out,
                        const char *when, const pass *p, double ms)
{
    if (!p) fprintf(out, "# input of the pipeline\n");
    else if (ms >= 0) fprintf(out, "# %s %s (%.3f ms)\n", when, p->name, ms);
    else fprintf(out, "# %s %s\n", when, p->name);
    opt_print(pass_cfg(opts), out);
    ir_print(g, out);
    if (!p || ms < 0) return;
    if (strcmp(p->name, "fuse") == 0) ir_print_groups(g, out);
    if (p->build && c->sched.steps) sched_print(g, &c->sched, out);
    if (p->build == pass_plan && c->plan.offset) plan_print(g, &c->plan, true, out);
}

/* Writes stage `index` (0: the input, i + 1: after pass i; p as for
 * print_graph) to its numbered file in the dump directory, atomically;
 * the error is recorded on g. */
static alloy_status dump_stage(ir_graph *g, const pass_options *opts, const pass_compiled *c, int index,
                               const pass *p, double ms)
{
    const char *dir = pass_cfg(opts)->dump_dir;
    char err[DUMP_PATH_MAX + 128];
    dump_file d;
    alloy_status st = dump_open(dir, g, index, p ? p->name : "input", &d, err, sizeof err);
    if (!st) {
        print_graph(g, opts, c, d.f, "after", p, ms);
        st = dump_commit(&d, err, sizeof err);
    }
    return st ? ir_error(g, st, "%s", err) : ALLOY_OK;
}

/* Flushes log after what an option (print_after, ...) printed there; a
 * failed write (a full disk, a closed descriptor) is ALLOY_ERR_IO recorded
 * on g, naming the option and pass, rather than output lost in silence. */
static alloy_status printed(ir_graph *g, FILE *log, const char *option, const char *pass_name)
{
    errno = 0;
    if (fflush(log) == 0 && !ferror(log)) return ALLOY_OK;
    int e = errno;
    return ir_error(g, ALLOY_ERR_IO, "%s%s%s: writing the output failed: %s", option, pass_name ? " " : "",
                    pass_name ? pass_name : "", e ? strerror(e) : "the stream has an error");
}

/* The index of pipeline pass `name`. */
static int pass_index(const char *name)
{
    for (int i = 0; i < NPASSES; i++)
        if (strcmp(pipeline[i].name, name) == 0) return i;
    return -1;
}

/* Refuses to skip a pass the training step asks for: without autodiff there
 * are no gradients, without grad_scaler the gradients stay multiplied by
 * the loss scale and inf/NaN steps are applied (NaN parameters under f16),
 * without optimizer nothing is updated, all silently. */
static alloy_status check_disabled(ir_graph *g, const pass_options *opts, uint32_t disabled)
{
    static const char *const scaler_kinds[] = {"no", "a dynamic", "a static"};
    const char *why = NULL, *skipped = NULL, *fix = NULL;
    char buf[160];
    alloy_scaler_kind scaler = opts->scaler ? opts->scaler->kind : ALLOY_SCALER_NONE;
    int accumulation = opts->optimizer ? opts->optimizer->accumulation_steps : 0;
    bool scaling = scaler == ALLOY_SCALER_DYNAMIC || scaler == ALLOY_SCALER_STATIC;
    bool random = false, norms = false;
    for (int i = 0; i < g->nnodes; i++) {
        random |= g->nodes[i]->op == IR_OP_dropout || g->nodes[i]->op == IR_OP_uniform || g->nodes[i]->op == IR_OP_normal;
        norms |= lower_norm_op(g->nodes[i]->op);
    }
    if ((disabled & 1u << pass_index("random")) && random)
        return ir_error(g, ALLOY_ERR_INVALID,
                        "disable_passes=random: the graph has random ops, and that pass gives random ops their seed and "
                        "step and turns dropout off outside training; remove random from disable_passes "
                        "(ALLOY_DISABLE_PASSES)");
    if ((disabled & 1u << pass_index("lower_norm")) && norms)
        return ir_error(g, ALLOY_ERR_INVALID,
                        "disable_passes=lower_norm: the graph has batch_norm / group_norm, and that pass lowers them "
                        "(no backend runs them as they are); remove lower_norm from disable_passes "
                        "(ALLOY_DISABLE_PASSES)");
    if (!opts->train) return ALLOY_OK;
    if (disabled & 1u << pass_index("autodiff")) {
        skipped = "autodiff";
        why = "the graph trains (it has a loss), and the gradients come from autodiff";
        fix = "or turn training off";
    } else if ((disabled & 1u << pass_index("grad_scaler")) && (scaling || accumulation > 1)) {
        skipped = "grad_scaler";
        if (scaling)
            al_fmt(buf, sizeof buf,
                   "the graph trains with %s loss scaler, and grad_scaler unscales the gradients and skips "
                   "inf/NaN steps (without it they reach the parameters)", scaler_kinds[scaler]);
        else
            al_fmt(buf, sizeof buf, "the optimizer accumulates %d micro-batches, which grad_scaler counts",
                   accumulation);
        why = buf;
        fix = scaling ? "or set no loss scaler" : "or accumulate none";
    } else if ((disabled & 1u << pass_index("optimizer")) && opts->optimizer && opts->optimizer->kind) {
        skipped = "optimizer";
        why = "the graph has an optimizer, and that pass is what updates the parameters";
        fix = "or add no optimizer";
    }
    if (!skipped) return ALLOY_OK;
    return ir_error(g, ALLOY_ERR_INVALID, "disable_passes=%s: %s; remove %s from disable_passes (ALLOY_DISABLE_PASSES) %s",
                    skipped, why, skipped, fix);
}

/* What a compiling pass made, for the timing table. */
static void made(const pass *p, const pass_compiled *c, char *buf, size_t len)
{
    if (p->build == pass_schedule) al_fmt(buf, len, "%d steps", c->sched.nsteps);
    else if (p->build == pass_plan)
        al_fmt(buf, len, "arena %zu bytes, peak live %zu", c->plan.arena_bytes, c->plan.peak_live_bytes);
    else buf[0] = '\0';
}

alloy_status pass_run_pipeline(ir_graph **g, const pass_options *opts, pass_compiled *out, FILE *log,
                               pass_timing *timings, int max, int *ntimings)
{
    const al_options *cfg = pass_cfg(opts);
    pass_compiled local = {0}, *c = out ? out : &local;
    memset(c, 0, sizeof *c);
    if (opts) {
        alloy_status st = check_disabled(*g, opts, cfg->disabled);
        if (st) return st;
    }
    if (!log) log = stderr;
    if (ntimings) *ntimings = 0;
    bool dump = cfg->dump_dir[0] != '\0';
    pass_time rows[NPASSES];
    int nrows = 0, nodes_in = (*g)->nnodes;
    const char *failed = NULL;
    alloy_status st = dump ? dump_stage(*g, opts, c, 0, NULL, 0) : ALLOY_OK;
    for (int i = 0; i < NPASSES && !st; i++) {
        const pass *p = &pipeline[i];
        if (cfg->disabled & 1u << i) {
            rows[nrows++] = (pass_time){.name = p->name};
            char err[DUMP_PATH_MAX + 128];
            if (dump && (st = dump_remove(cfg->dump_dir, *g, i + 1, p->name, err, sizeof err)))
                ir_error(*g, st, "%s", err);
            continue;
        }
        if (cfg->print_before & 1u << i) {
            print_graph(*g, opts, c, log, "before", p, -1);
            if ((st = printed(*g, log, "print_before", p->name))) break;
        }
        double t0 = now_ms(), cpu0 = clock_ms(CLOCK_THREAD_CPUTIME_ID);
        st = p->run ? p->run(g, opts) : p->build(*g, opts, c);
        if (!st && p->run && p->run != pass_verify) st = ir_verify(*g);
        double ms = now_ms() - t0;
        if (timings && ntimings && *ntimings < max)
            timings[(*ntimings)++] = (pass_timing){p->name, ms, (*g)->nnodes, clock_ms(CLOCK_THREAD_CPUTIME_ID) - cpu0};
        if (st) {
            failed = p->name;
            break;
        }
        rows[nrows] = (pass_time){.name = p->name, .ran = true, .ms = ms, .nodes = (*g)->nnodes};
        made(p, c, rows[nrows].what, sizeof rows[nrows].what);
        nrows++;
        if (cfg->print_after & 1u << i) {
            print_graph(*g, opts, c, log, "after", p, ms);
            if ((st = printed(*g, log, "print_after", p->name))) break;
        }
        if (dump) st = dump_stage(*g, opts, c, i + 1, p, ms);
    }
    if (cfg->time_passes) {
        dump_print_times(log, (*g)->name, nodes_in, rows, nrows, failed);
        alloy_status pst = printed(*g, log, "time_passes", NULL);
        if (!st) st = pst;
    }
    if (st || !out) pass_compiled_free(c);
    return st;
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
