/* ops.c - expands ops.def into the IR's op table (semantics only) and holds the attribute schemas. */
#include <math.h>
#include <string.h>

#include "ir/ir.h"
#include "ir/typerules.h"

/* Schemas: {name, kind, required, has_default, default}. */
static const ir_attr_spec A_NONE[] = {{NULL, 0, false, false, 0}};
static const ir_attr_spec A_PARAM[] = {
    {"init", IR_ATTR_STR, true, false, 0},      {"mean", IR_ATTR_FLOAT, false, false, 0},
    {"std", IR_ATTR_FLOAT, false, false, 0},    {"low", IR_ATTR_FLOAT, false, false, 0},
    {"high", IR_ATTR_FLOAT, false, false, 0},   {"value", IR_ATTR_FLOAT, false, false, 0},
    {"gain", IR_ATTR_FLOAT, false, false, 0},   {"frozen", IR_ATTR_BOOL, false, true, 0},
    /* state: ZeRO-1's shard (this rank's part) of a tensor of these dims (passes/data_parallel.c) */
    {"shard_of", IR_ATTR_INTS, false, false, 0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_CONSTANT[] = {
    {"value", IR_ATTR_FLOAT, false, false, 0}, {"values", IR_ATTR_FLOATS, false, false, 0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_MATMUL[] = {
    {"transpose_a", IR_ATTR_BOOL, false, true, 0}, {"transpose_b", IR_ATTR_BOOL, false, true, 0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_REDUCE[] = {
    {"axes", IR_ATTR_INTS, false, true, 0}, {"keepdims", IR_ATTR_BOOL, false, true, 0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_SOFTMAX[] = {{"axis", IR_ATTR_INT, false, true, -1}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_ALL_REDUCE[] = {{"reduce", IR_ATTR_STR, false, false, 0}, {NULL, 0, false, false, 0}};
/* the number of ranks a reduce_scatter / all_gather splits over */
static const ir_attr_spec A_WORLD[] = {{"world", IR_ATTR_INT, true, false, 0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_CONCAT[] = {{"axis", IR_ATTR_INT, false, true, 0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_NORM[] = {{"eps", IR_ATTR_FLOAT, false, true, 1e-5}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_TRANSPOSE[] = {{"perm", IR_ATTR_INTS, true, false, 0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_CAUSAL[] = {{"value", IR_ATTR_FLOAT, false, true, -INFINITY}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_ARG[] = {
    {"axis", IR_ATTR_INT, false, true, -1}, {"keepdims", IR_ATTR_BOOL, false, true, 0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_ONE_HOT[] = {{"depth", IR_ATTR_INT, true, false, 0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_LEAKY[] = {{"negative_slope", IR_ATTR_FLOAT, false, true, 0.01}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_ELU[] = {{"alpha", IR_ATTR_FLOAT, false, true, 1.0}, {NULL, 0, false, false, 0}};
/* an absent bound is no bound */
static const ir_attr_spec A_CLAMP[] = {
    {"min", IR_ATTR_FLOAT, false, true, -INFINITY}, {"max", IR_ATTR_FLOAT, false, true, INFINITY}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_PAD[] = {{"axis", IR_ATTR_INT, true, false, 0},
                                     {"before", IR_ATTR_INT, true, false, 0},
                                     {"after", IR_ATTR_INT, true, false, 0},
                                     {NULL, 0, false, false, 0}};
/* attention: scale multiplies the scores; causal masks column j > row i + S - T */
static const ir_attr_spec A_ATTENTION[] = {
    {"causal", IR_ATTR_BOOL, false, true, 0}, {"scale", IR_ATTR_FLOAT, true, false, 0}, {NULL, 0, false, false, 0}};
/* random ops: seed absent = the graph's (the random pass fills it in); stream names the draw */
static const ir_attr_spec A_DROPOUT[] = {{"p", IR_ATTR_FLOAT, false, true, 0.5},
                                         {"seed", IR_ATTR_INT, false, false, 0},
                                         {"stream", IR_ATTR_INT, true, false, 0},
                                         {NULL, 0, false, false, 0}};
static const ir_attr_spec A_UNIFORM[] = {{"low", IR_ATTR_FLOAT, false, true, 0},  {"high", IR_ATTR_FLOAT, false, true, 1},
                                         {"seed", IR_ATTR_INT, false, false, 0}, {"stream", IR_ATTR_INT, true, false, 0},
                                         {NULL, 0, false, false, 0}};
static const ir_attr_spec A_NORMAL[] = {{"mean", IR_ATTR_FLOAT, false, true, 0},  {"std", IR_ATTR_FLOAT, false, true, 1},
                                        {"seed", IR_ATTR_INT, false, false, 0}, {"stream", IR_ATTR_INT, true, false, 0},
                                        {NULL, 0, false, false, 0}};
/* convolution and pooling: one entry per spatial dim (absent: stride 1
 * (a pool's: its kernel), padding 0, dilation 1); typerules_conv.c */
static const ir_attr_spec A_CONV[] = {{"stride", IR_ATTR_INTS, false, false, 0},  {"padding", IR_ATTR_INTS, false, false, 0},
                                      {"dilation", IR_ATTR_INTS, false, false, 0}, {"groups", IR_ATTR_INT, false, true, 1},
                                      {NULL, 0, false, false, 0}};
static const ir_attr_spec A_POOL[] = {{"kernel", IR_ATTR_INTS, true, false, 0},
                                      {"stride", IR_ATTR_INTS, false, false, 0},
                                      {"padding", IR_ATTR_INTS, false, false, 0},
                                      {NULL, 0, false, false, 0}};
static const ir_attr_spec A_AVG_POOL[] = {{"kernel", IR_ATTR_INTS, true, false, 0},   {"stride", IR_ATTR_INTS, false, false, 0},
                                          {"padding", IR_ATTR_INTS, false, false, 0}, {"count_include_pad", IR_ATTR_BOOL, false, true, 1},
                                          {NULL, 0, false, false, 0}};
static const ir_attr_spec A_ADAPTIVE_POOL[] = {{"output_size", IR_ATTR_INTS, true, false, 0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_SLICE[] = {{"axis", IR_ATTR_INT, true, false, 0},
                                       {"start", IR_ATTR_INT, true, false, 0},
                                       {"end", IR_ATTR_INT, true, false, 0},
                                       {NULL, 0, false, false, 0}};

/* losses: ignore_index absent ignores nothing (it reads as -1, which no
 * valid target equals; targets are checked to be in range), label_smoothing
 * absent is 0, reduction absent is "mean" (a node prints what it was given) */
static const ir_attr_spec A_CROSS_ENTROPY[] = {{"ignore_index", IR_ATTR_INT, false, false, -1},
                                               {"label_smoothing", IR_ATTR_FLOAT, false, false, 0},
                                               {"reduction", IR_ATTR_STR, false, false, 0},
                                               {NULL, 0, false, false, 0}};
static const ir_attr_spec A_CROSS_ENTROPY_GRAD[] = {
    {"ignore_index", IR_ATTR_INT, false, false, -1}, {"label_smoothing", IR_ATTR_FLOAT, false, false, 0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_NLL[] = {{"ignore_index", IR_ATTR_INT, false, false, -1},
                                     {"reduction", IR_ATTR_STR, false, false, 0},
                                     {NULL, 0, false, false, 0}};
static const ir_attr_spec A_NLL_GRAD[] = {{"ignore_index", IR_ATTR_INT, false, false, -1}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_SMOOTH_L1[] = {{"beta", IR_ATTR_FLOAT, false, true, 1.0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_BCE_GRAD[] = {{"operand", IR_ATTR_INT, false, true, 0}, {NULL, 0, false, false, 0}};

/* batch_norm: training absent = the graph's mode (the lower_norm pass lowers it for that mode) */
static const ir_attr_spec A_BATCH_NORM[] = {{"eps", IR_ATTR_FLOAT, false, true, 1e-5},
                                            {"momentum", IR_ATTR_FLOAT, false, true, 0.1},
                                            {"training", IR_ATTR_BOOL, false, false, 1},
                                            {NULL, 0, false, false, 0}};
static const ir_attr_spec A_GROUP_NORM[] = {
    {"num_groups", IR_ATTR_INT, true, false, 0}, {"eps", IR_ATTR_FLOAT, false, true, 1e-5}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_AXIS[] = {{"axis", IR_ATTR_INT, false, true, 0}, {NULL, 0, false, false, 0}};
static const ir_attr_spec A_ARANGE[] = {{"start", IR_ATTR_FLOAT, false, true, 0},
                                        {"end", IR_ATTR_FLOAT, true, false, 0},
                                        {"step", IR_ATTR_FLOAT, false, true, 1},
                                        {NULL, 0, false, false, 0}};
static const ir_attr_spec A_CUMSUM[] = {
    {"axis", IR_ATTR_INT, false, true, 0}, {"reverse", IR_ATTR_BOOL, false, true, 0}, {NULL, 0, false, false, 0}};

#define STR(x) #x

/* The row programs: each RW line's stages as data. */
#define MAX(k, e) {ROW_MAX, k, #e},
#define SUM(k, e) {ROW_SUM, k, #e},
#define LET(k, e) {ROW_LET, k, #e},
#define MAP(k, e) {ROW_MAP, k, #e},
#define OUT(e) {ROW_OUT, 0, #e},
#define RESULT(e) {ROW_RESULT, 0, #e},
#define WEIGHT(e) {ROW_WEIGHT, 0, #e},
#define KEEP(e) {ROW_KEEP, 0, #e},
#define OP(...)
#define EW(...)
#define RW(nm, mn, mx, at, ty, amp, grad, roles, program) static const ir_row_stage stages_##nm[] = {program};
#include "ir/ops.def"
#undef RW
#undef MAX
#undef SUM
#undef LET
#undef MAP
#undef OUT
#undef RESULT
#undef WEIGHT
#undef KEEP
#define COUNT(a) ((int)(sizeof a / sizeof a[0]))
#define RW(nm, mn, mx, at, ty, amp, grad, roles, program) \
    static const ir_row_program row_##nm = {roles, stages_##nm, COUNT(stages_##nm)};
#include "ir/ops.def"
#undef RW
#undef OP
#undef EW

const ir_op_info ir_ops[IR_OP_COUNT] = {
#define OP(nm, mn, mx, at, ty, cpu, amp, grad) [IR_OP_##nm] = {#nm, mn, mx, at, ty, amp, false, NULL, NULL},
#define EW(nm, nin, at, ty, amp, grad, expr) [IR_OP_##nm] = {#nm, nin, nin, at, ty, amp, true, STR(expr), NULL},
#define RW(nm, mn, mx, at, ty, amp, grad, roles, program) [IR_OP_##nm] = {#nm, mn, mx, at, ty, amp, false, NULL, &row_##nm},
#include "ir/ops.def"
#undef OP
#undef EW
#undef RW
};

ir_row_summary ir_row_summarize(const ir_row_program *p)
{
    ir_row_summary r = {0};
    for (int i = 0; i < p->nstages; i++) {
        const ir_row_stage *st = &p->stages[i];
        if (st->kind == ROW_MAP && st->slot + 1 > r.nvectors) r.nvectors = st->slot + 1;
        if (st->kind <= ROW_LET && st->slot + 1 > r.nscalars) r.nscalars = st->slot + 1;
        if (st->kind == ROW_RESULT) r.per_row_result = true;
        if (st->kind == ROW_WEIGHT) r.weighted = true;
        if (st->kind == ROW_KEEP) r.per_row_value = true;
        if (strstr(st->expr, "POS(") || strstr(st->expr, "DIM(")) r.by_position = true;
    }
    return r;
}

bool ir_row_sums(const ir_node *n)
{
    return ir_attr_schema(n->op, "reduction") && strcmp(ir_attr_str(n, "reduction", "mean"), "sum") == 0;
}

bool ir_op_collective(int op)
{
    return op == IR_OP_all_reduce || op == IR_OP_reduce_scatter || op == IR_OP_all_gather;
}

int ir_op_lookup(const char *name)
{
    for (int i = 0; i < IR_OP_COUNT; i++)
        if (strcmp(ir_ops[i].name, name) == 0) return i;
    return -1;
}
