/* op_cases.h - the op case table: for every op its operand shapes, attributes, input domains, tolerances per dtype and an independent f64 reference; test_op_cases.c runs every case on every backend (evaluation, gradients, fusion). */
#ifndef ALLOY_TEST_OP_CASES_H
#define ALLOY_TEST_OP_CASES_H

#include <stdbool.h>

#include "ir/ir.h"

enum { OC_MAX_IN = 5, OC_MAX_ATTRS = 4 };

/* How one operand's values are drawn: uniform in [lo, hi) (both 0: the
 * default [-3, 3)), then
 *   grid > 0:      snapped down to shift + a multiple of grid (equal values
 *                  occur, or two operands on offset grids never tie);
 *   OC_AWAY:       a random sign, the magnitude in [lo, hi);
 *   OC_DISTINCT:   values at least 0.08 apart in random order (no ties for a max);
 *   OC_NAN:        operand k holds a NaN at element 3k (float dtypes);
 *   OC_SPECIAL:    every 5th element inf, -inf or NaN (float dtypes);
 *   OC_INDEX:      integers in [0, dims[dim]) of operand `of` (-1: of the
 *                  declared result), ids and class targets.
 * Integer dtypes truncate the draw; a domain with lo > 0 never gives 0. */
typedef struct oc_domain {
    double lo, hi;
    double grid, shift;
    unsigned flags;
    int of, dim;
} oc_domain;

enum { OC_AWAY = 1, OC_DISTINCT = 2, OC_NAN = 4, OC_SPECIAL = 8, OC_INDEX = 16 };

/* Bounds per float dtype: for the evaluation on the normalized error
 * (test_close), for the gradient check on gc_check's error. Integer and
 * bool results are always exact. */
typedef struct oc_tol {
    double f32, f16, bf16, f64;
} oc_tol;

extern const oc_tol oc_tol_arith, oc_tol_trans, oc_tol_exact, oc_tol_grad;

/* A reference tensor: its type and its elements as doubles. */
typedef struct oc_tensor {
    ir_type type;
    double *v;
} oc_tensor;

/* An f64 reference: fills out (n's result type, zeroed) from the operand
 * values in[0 .. n->nin) (for the bound leaves input, param and state, in[0]
 * is the value bound to n), reading n's op and attributes. Written from the
 * math, never from the op table's expr or a kernel. */
typedef void (*oc_ref)(const ir_node *n, const oc_tensor *in, oc_tensor *out);

/* One row of the table. Texts hold alternatives separated by ';', and a
 * row stands for every combination of them (attrs: groups separated by
 * '|', one alternative of each group):
 *   operands  "[4,1,5] [3,1]; [] [17]": operand types separated by spaces;
 *             "i32[2,3]" fixes a dtype, "[2,3]" takes the case's dtype;
 *   attrs     "axes=[0,-1] keepdims=1; axes=[1] | eps=0.1": name=value
 *             (INT, BOOL 0/1, FLOAT incl. inf and hex, [lists], STR words);
 *             an empty alternative leaves the attributes out;
 *   declared  the result type of declared-type ops: "[4,6]" (the case's
 *             dtype), "f16" (operand 0's shape), "f16[4]".
 * Every case runs in every dtype the op's type rule accepts. */
typedef struct op_case {
    const char *op;
    const char *operands;
    const char *attrs;
    const char *declared;
    oc_domain dom[OC_MAX_IN]; /* per operand (for a bound leaf: dom[0] is its own) */
    const oc_tol *tol;        /* evaluation; NULL: oc_tol_arith */
    const oc_tol *gtol;       /* gradient check; NULL: oc_tol_grad */
    unsigned flags;           /* OC_NO_GRAD: no gradient check (the reason stands beside the row) */
    unsigned constant_in;     /* bit k: float operand k has no gradient (a loss's class weights) */
    oc_ref ref;               /* NULL: the elementwise reference ew_ref */
} op_case;

enum { OC_NO_GRAD = 1 };

extern const op_case op_cases[];
extern const int op_ncases;

/* One combination of a row's alternatives. */
typedef struct oc_case {
    const op_case *row;
    int op, nin;
    ir_type in[OC_MAX_IN];
    bool fixed[OC_MAX_IN]; /* the operand's dtype was written */
    int nattrs;
    ir_attr attrs[OC_MAX_ATTRS];
    int64_t ints[OC_MAX_ATTRS][2 * ALLOY_MAX_RANK];
    double floats[OC_MAX_ATTRS][16];
    char strs[OC_MAX_ATTRS][32];
    bool has_declared, declared_dtype, declared_shape;
    ir_type declared;
    char label[200]; /* "add [4,1,5] [3,1]", "reduce_sum [6,17,33] axes=[0] keepdims=1" */
} oc_case;

/* The cases of row r into *out (malloc'd, free it), their count; -1 with the
 * reason in err when the row does not parse. The attribute pointers point
 * into each case, so cases must not be copied by value. */
int oc_expand(const op_case *r, oc_case **out, char *err, size_t errlen);
/* Operand k's type when the case runs in dtype dt. */
ir_type oc_operand_type(const oc_case *c, int k, alloy_dtype dt);
/* The declared type in dt (operand 0 gives a missing shape); false when the row declares none. */
bool oc_declared_type(const oc_case *c, alloy_dtype dt, ir_type *out);
/* Whether some operand or the declared type takes the case's dtype (a case
 * whose types are all written runs once). */
bool oc_takes_dtype(const oc_case *c);
/* Draws operand k's values (domain dom[k]) into v, rounded to its dtype:
 * types[] are the operands' types, result the node's. */
void oc_draw(const oc_case *c, int k, const ir_type *types, const ir_type *result, double *v);
/* The case's reference (NULL when it has none). */
oc_ref oc_reference(const oc_case *c);
/* The reference result of node n (out: n's type, room for its elements),
 * integer and bool results rounded as their dtype stores them, float ones
 * beyond the dtype's range infinite. */
void oc_evaluate(const oc_case *c, const ir_node *n, const oc_tensor *in, oc_tensor *out);
/* The case's bound for dtype dt (0 for integers and bools). */
double oc_bound(const oc_case *c, alloy_dtype dt, bool grad);
/* The elementwise reference: n's op (with n's attributes) over scalar
 * operands a, b, c in double. */
double ew_ref(const ir_node *n, double a, double b, double c);

#endif
