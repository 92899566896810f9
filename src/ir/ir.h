/* ir.h - the IR: types, attributes, nodes, graphs and the op table (QBE's all.h, sectioned by file). */
#ifndef ALLOY_IR_H
#define ALLOY_IR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/base.h"
#include "base/name_index.h"

/* A result type: dtype and static shape. rank 0 is a scalar. */
typedef struct ir_type {
    alloy_dtype dtype;
    int rank;
    int64_t dims[ALLOY_MAX_RANK];
} ir_type;

typedef enum ir_attr_kind {
    IR_ATTR_INT,
    IR_ATTR_BOOL,
    IR_ATTR_FLOAT,
    IR_ATTR_INTS,
    IR_ATTR_FLOATS,
    IR_ATTR_STR,
} ir_attr_kind;

/* One named attribute. `name` points at the op's schema (never freed). */
typedef struct ir_attr {
    const char *name;
    ir_attr_kind kind;
    int n; /* element count for INTS / FLOATS */
    union {
        int64_t i; /* INT, BOOL */
        double f;
        const char *s;
        int64_t *ints;
        double *floats;
    };
} ir_attr;

/* An op's attribute schema entry; schemas end with {NULL}. ir_add_node
 * gives a node every attribute of its schema, in schema order: the given
 * value, else the default when has_default (def for INT, BOOL and FLOAT;
 * every axis of the first operand for INTS, reduce's axes); an attribute
 * without a default (an init's parameters) is present only when given. */
typedef struct ir_attr_spec {
    const char *name;
    ir_attr_kind kind;
    bool required;
    bool has_default;
    double def;
} ir_attr_spec;

/* AMP classes (docs/amp.md, "The four classes"). */
typedef enum ir_amp_class {
    AMP_NONE = 0, /* not coloured (no AMP pass ran) */
    AMP_ALLOW,
    AMP_DENY,
    AMP_INFER,
    AMP_CLEAR,
} ir_amp_class;

/* Node flags. */
enum {
    IR_NODE_INSERTED = 1, /* added by a pass (e.g. an AMP cast), shown in the text */
};

typedef struct ir_node {
    int id;        /* index in graph->nodes; operands always have smaller ids */
    uint16_t op;   /* ir_op */
    uint8_t amp;   /* ir_amp_class after the amp pass */
    uint8_t flags;
    int nin;
    int *in;       /* operand ids */
    ir_type type;
    int nattrs;
    ir_attr *attrs;
    const char *name; /* unique in the graph, or NULL */
    int group;        /* fusion group id after fuse, else -1 */
    int origin;       /* a backward node: the forward node whose gradient rule emitted it; else -1 (not printed) */
} ir_node;

typedef struct ir_output {
    const char *name;
    int node;
} ir_output;

/* A graph owns everything in its arena. Errors collect here (first wins). */
typedef struct ir_graph {
    al_arena arena;
    const char *name;
    ir_node **nodes;
    int nnodes, cap;
    ir_output *outputs;
    int noutputs, outcap;
    /* state writes of a training step: after a successful run the value of
     * node `node` becomes the new value of the param/state leaf `name` */
    ir_output *updates;
    int nupdates, updcap;
    int loss; /* node id of the scalar loss, or -1 */
    /* name -> node id, open addressing, capacity a power of two (base/name_index.h) */
    al_name_slot *name_slots;
    int name_cap, name_count;
    /* output name -> output index and update name -> update index, likewise
     * (so reading a graph with many outputs stays linear) */
    al_name_slot *out_slots, *upd_slots;
    int out_cap, upd_cap;
    alloy_status status;
    char error[1024];
} ir_graph;

/* ---- the op table (ops.c, entries in ops.def) ---- */

typedef enum ir_op {
#define OP(name, ...) IR_OP_##name,
#define EW(name, ...) IR_OP_##name,
#include "ir/ops.def"
#undef OP
#undef EW
    IR_OP_COUNT
} ir_op;

/* Type rule: from the node's operands' types (and its attributes, and for ops
 * whose result type is declared - input, param, constant, cast, reshape,
 * broadcast_to - the node's current type in *out) compute the result type.
 * Returns ALLOY_OK or a status with the reason in why. */
typedef alloy_status (*ir_type_rule)(const ir_node *n, const ir_type *const *in, ir_type *out,
                                     char *why, size_t whylen);

/* A row op's program (ops.def, RW lines): stages over one row, each an
 * expression in the compute type T of the accessors ops.def lists. */
typedef enum ir_row_stage_kind { ROW_MAX, ROW_SUM, ROW_LET, ROW_MAP, ROW_OUT, ROW_RESULT, ROW_WEIGHT, ROW_KEEP } ir_row_stage_kind;
typedef struct ir_row_stage {
    ir_row_stage_kind kind;
    int slot;         /* S(slot) for MAX, SUM, LET; V(slot) for MAP */
    const char *expr; /* C and CUDA C++ */
} ir_row_stage;
typedef struct ir_row_program {
    const char *roles; /* per operand: r row, v vector, i index per row, s scalar, w one value per row ([.., 1], W(q)) */
    const ir_row_stage *stages;
    int nstages;
} ir_row_program;
/* What a program needs, read off its stages. */
typedef struct ir_row_summary {
    int nscalars, nvectors; /* S and V slots used */
    bool per_row_result;    /* a RESULT stage: the op's value is the (weighted) mean or sum over rows */
    bool per_row_value;     /* a KEEP stage: the op's value is one number per row, [.., 1] (a statistic kept for a gradient) */
    bool weighted;          /* a WEIGHT stage: each row's weight in that mean (else 1) */
    bool by_position;       /* reads POS or DIM: needs the row's place in the tensor */
} ir_row_summary;
AL_HIDDEN ir_row_summary ir_row_summarize(const ir_row_program *p);
/* Whether row op n's per-row results add up to its value (reduction="sum")
 * rather than their weighted mean. */
AL_HIDDEN bool ir_row_sums(const ir_node *n);

/* What an op means, as the IR knows it; backends and autodiff keep their own
 * per-op tables expanded from the same ops.def lines. */
typedef struct ir_op_info {
    const char *name;
    int min_in, max_in; /* max_in < 0: variadic */
    const ir_attr_spec *attrs;
    ir_type_rule type;
    ir_amp_class amp;
    bool elementwise;
    const char *expr;          /* elementwise: the C/CUDA expression of a, b, c in type T */
    const ir_row_program *row; /* row ops: their program; else NULL */
} ir_op_info;

AL_HIDDEN extern const ir_op_info ir_ops[IR_OP_COUNT];
/* The op named `name`, or -1. */
AL_HIDDEN int ir_op_lookup(const char *name);
/* Whether op is a collective over the ranks of a data-parallel step
 * (all_reduce, reduce_scatter, all_gather): a step of its own kind. */
AL_HIDDEN bool ir_op_collective(int op);

/* ---- graph.c ---- */

AL_HIDDEN ir_graph *ir_graph_new(const char *name); /* NULL on OOM */
AL_HIDDEN void ir_graph_free(ir_graph *g);
/* Records the first error on g (later ones are dropped); returns status. */
AL_HIDDEN alloy_status ir_error(ir_graph *g, alloy_status status, const char *fmt, ...)
    AL_PRINTF(3, 4);
/* Appends a node whose operands, attributes and (for declared-type ops) type
 * are given; runs the op's type rule, and on success returns the new node.
 * On failure records an error naming the op, operand types and `name`, and
 * returns NULL. attrs are copied into the graph's arena; unknown attribute
 * names or kinds, missing required ones, bad operand counts are errors. */
AL_HIDDEN ir_node *ir_add_node(ir_graph *g, int op, int nin, const int *in, int nattrs,
                               const ir_attr *attrs, const ir_type *declared, const char *name);
/* Gives node a unique name; error if taken. */
AL_HIDDEN alloy_status ir_set_name(ir_graph *g, ir_node *n, const char *name);
/* Node id named name, or -1. */
AL_HIDDEN int ir_find_name(const ir_graph *g, const char *name);
AL_HIDDEN alloy_status ir_add_output(ir_graph *g, const char *name, int node);
/* Declares that node's value replaces the state leaf `name` after a run. */
AL_HIDDEN alloy_status ir_add_update(ir_graph *g, const char *name, int node);
/* Index of the output called name, or -1. */
AL_HIDDEN int ir_find_output(const ir_graph *g, const char *name);
/* Index of the update of state `name`, or -1. */
AL_HIDDEN int ir_find_update(const ir_graph *g, const char *name);
/* A new graph of g's nodes order[0..n) in that order, each node's operands
 * placed before it (else ALLOY_ERR_VERIFY naming the node): names,
 * attributes and annotations kept, ids renumbered, the outputs, updates and
 * loss that are kept pointing at their nodes (the others dropped). NULL with
 * the error, prefixed "who: ", recorded on g on failure; g is unchanged. */
AL_HIDDEN ir_graph *ir_graph_reordered(ir_graph *g, const int *order, int n, const char *who);
/* Deep copy (nodes, attributes, names, outputs, loss, annotations). */
AL_HIDDEN ir_graph *ir_graph_clone(const ir_graph *g);
/* Carries the origins of in's nodes over to out, whose node map[i] (-1:
 * none) stands for in's node i: such a node without an origin of its own
 * takes map[in's origin] (when that node survived). */
AL_HIDDEN void ir_carry_origins(ir_graph *out, const ir_graph *in, const int *map);

/* Attribute accessors: the value of attribute `name`, or def when absent. */
AL_HIDDEN const ir_attr *ir_attr_find(const ir_node *n, const char *name);
AL_HIDDEN int64_t ir_attr_int(const ir_node *n, const char *name, int64_t def);
AL_HIDDEN double ir_attr_float(const ir_node *n, const char *name, double def);
AL_HIDDEN const char *ir_attr_str(const ir_node *n, const char *name, const char *def);
/* INTS attribute: sets *count and returns the array (NULL, *count 0 if absent). */
AL_HIDDEN const int64_t *ir_attr_ints(const ir_node *n, const char *name, int *count);
/* The attribute's value, or its schema default when the node lacks it (0
 * when the schema has none). */
AL_HIDDEN int64_t ir_attr_i(const ir_node *n, const char *name);
AL_HIDDEN double ir_attr_f(const ir_node *n, const char *name);
/* The values an elementwise expression reads as P(0), P(1), ...: n's FLOAT
 * and INT schema attributes in schema order (defaults filled in), at most
 * IR_EW_MAX_ATTRS; other kinds read as 0. Returns the count. */
enum { IR_EW_MAX_ATTRS = 4 };
AL_HIDDEN int ir_ew_params(const ir_node *n, double *p);
/* The schema entry of attribute `name` of op, or NULL. */
AL_HIDDEN const ir_attr_spec *ir_attr_schema(int op, const char *name);
/* Attribute constructors for callers building attr arrays. */
AL_HIDDEN ir_attr ir_a_int(const char *name, int64_t v);
AL_HIDDEN ir_attr ir_a_bool(const char *name, bool v);
AL_HIDDEN ir_attr ir_a_float(const char *name, double v);
AL_HIDDEN ir_attr ir_a_str(const char *name, const char *v);
AL_HIDDEN ir_attr ir_a_ints(const char *name, int n, const int64_t *v);
AL_HIDDEN ir_attr ir_a_floats(const char *name, int n, const double *v);

/* Type helpers. */
AL_HIDDEN int64_t ir_numel(const ir_type *t);
AL_HIDDEN size_t ir_nbytes(const ir_type *t);
/* The inits a param or state may name (attribute init=), in the order of
 * their names in ir_init_names; the type rule checks the name and the
 * attributes each reads, runtime/graph/state.c computes the values. */
typedef enum ir_init {
    IR_INIT_ZEROS,
    IR_INIT_ONES,
    IR_INIT_CONSTANT,
    IR_INIT_NORMAL,
    IR_INIT_UNIFORM,
    IR_INIT_KAIMING_UNIFORM,
    IR_INIT_KAIMING_NORMAL,
    IR_INIT_XAVIER_UNIFORM,
    IR_INIT_XAVIER_NORMAL,
    IR_INIT_COUNT
} ir_init;
AL_HIDDEN extern const char *const ir_init_names[IR_INIT_COUNT];
/* The init called name, or -1. */
AL_HIDDEN int ir_init_lookup(const char *name);
/* Whether v is a value of dtype: finite after rounding to a float dtype
 * (1e39 is inf in f16 and f32), in range of an integer dtype, 0 or 1 for
 * bool. */
AL_HIDDEN bool ir_value_fits(double v, alloy_dtype dtype);
/* matmul's batch broadcast: for each of the output's out_batch_rank batch
 * dims, how far operand t's data moves (elements) when that index grows by
 * one; 0 where t broadcasts (lacks the dim or has size 1). */
AL_HIDDEN void ir_matmul_batch_strides(const ir_type *t, int out_batch_rank, int64_t *stride);
AL_HIDDEN bool ir_type_eq(const ir_type *a, const ir_type *b);
AL_HIDDEN bool ir_is_float(alloy_dtype dt); /* f32 f16 bf16 f64 */
AL_HIDDEN bool ir_is_int(alloy_dtype dt);   /* i32 i64 */
/* "f32[4,8]" */
AL_HIDDEN void ir_fmt_type(char *buf, size_t len, const ir_type *t);
/* The node's name for messages: its name, else "%id". */
AL_HIDDEN const char *ir_node_label(const ir_node *n, char *buf, size_t len);

/* ---- typerules.c ---- */
/* Broadcasts a and b numpy-style into out (dims only); false if they clash. */
AL_HIDDEN bool ir_broadcast_dims(int ra, const int64_t *da, int rb, const int64_t *db, int *rout,
                                 int64_t *dout);
/* Normalizes axis for rank (negative counts from the end); false if out of range. */
AL_HIDDEN bool ir_norm_axis(int64_t axis, int rank, int *out);

/* ---- verify.c ---- */
/* Checks every IR invariant (ids dense and topological, operands earlier,
 * types match the type rules, attributes match schemas, names unique,
 * outputs and loss valid); records the first problem on g. */
AL_HIDDEN alloy_status ir_verify(ir_graph *g);

/* ---- print.c / parse.c ---- */
/* Prints g in the IR text format (docs/ir.md). */
AL_HIDDEN void ir_print(const ir_graph *g, FILE *out);
/* Prints into a newly allocated string (al_free it); NULL on OOM. */
AL_HIDDEN char *ir_print_string(const ir_graph *g);
/* Parses IR text; on error returns NULL and writes "file:line:col: message"
 * into err. `filename` is used only in messages. */
AL_HIDDEN ir_graph *ir_parse(const char *text, size_t len, const char *filename, char *err,
                             size_t errlen);

#endif
