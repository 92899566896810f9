/* test_ir.c - the IR text format (print, parse) and the verifier: round trips, errors, fuzzing. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ir/ir.h"
#include "support.h"

static const char example[] =
    "# comments start with '#' and run to the end of the line\n"
    "graph mlp {\n"
    "  %x = input : f32[4,8]\n"
    "  %w1 = param {init=\"normal\", std=0.02} : f32[8,16]\n"
    "  %2 = matmul(%x, %w1) : f32[4,16]\n"
    "  %h = relu(%2) : f32[4,16]\n"
    "  %4 = reduce_sum(%h) {axes=[1], keepdims=true} : f32[4,1]\n"
    "  %c = constant {value=0.5} : f32[]\n"
    "  %6 = cast(%4) : f16[4,1] !amp=allow !inserted\n"
    "  %\"grad:w1\" = neg(%x) : f32[4,8]\n"
    "  output \"y\" = %6\n"
    "  loss %c\n"
    "}\n";

/* Canonical text (exactly what ir_print writes) that uses every op, one
 * literal a line (so no literal nears the 4095 characters C11 promises,
 * however many ops there are), joined into every_op by main. */
static const char *const every_op_lines[] = {
    "graph every_op {\n",
    "  %x = input : f32[2,4]\n",
    "  %w = param {init=\"normal\", mean=0.0, std=0.02, frozen=true} : f32[4,4]\n",
    "  %g = param {init=\"uniform\", low=-0.1, high=0.1, frozen=false} : f32[4]\n",
    "  %c = constant {value=0.5} : f32[]\n",
    "  %cv = constant {values=[0.1, 3.0, -inf, nan]} : f32[4]\n",
    "  %ids = input : i32[2]\n",
    "  %6 = neg(%x) : f32[2,4]\n",
    "  %7 = add(%x, %g) : f32[2,4]\n",
    "  %8 = sub(%x, %c) : f32[2,4]\n",
    "  %9 = mul(%x, %cv) : f32[2,4]\n",
    "  %10 = div(%x, %x) : f32[2,4]\n",
    "  %11 = maximum(%x, %x) : f32[2,4]\n",
    "  %12 = minimum(%x, %x) : f32[2,4]\n",
    "  %13 = pow(%x, %c) : f32[2,4]\n",
    "  %14 = relu(%x) : f32[2,4]\n",
    "  %15 = gelu(%x) : f32[2,4]\n",
    "  %16 = gelu_tanh(%x) : f32[2,4]\n",
    "  %17 = tanh(%x) : f32[2,4]\n",
    "  %18 = sigmoid(%x) : f32[2,4]\n",
    "  %19 = exp(%x) : f32[2,4]\n",
    "  %20 = log(%x) : f32[2,4]\n",
    "  %21 = sqrt(%x) : f32[2,4]\n",
    "  %22 = rsqrt(%x) : f32[2,4]\n",
    "  %23 = square(%x) : f32[2,4]\n",
    "  %eq = equal(%x, %g) : bool[2,4]\n",
    "  %25 = not_equal(%x, %x) : bool[2,4]\n",
    "  %26 = less(%x, %x) : bool[2,4]\n",
    "  %27 = less_equal(%x, %x) : bool[2,4]\n",
    "  %28 = greater(%x, %x) : bool[2,4]\n",
    "  %29 = greater_equal(%ids, %ids) : bool[2]\n",
    "  %sel = where(%eq, %x, %c) : f32[2,4]\n",
    "  %31 = amp_allow(%sel) : f32[2,4]\n",
    "  %32 = amp_deny(%sel) : f32[2,4]\n",
    "  %mm = matmul(%x, %w) {transpose_a=false, transpose_b=false} : f32[2,4]\n",
    "  %34 = matmul(%x, %w) {transpose_a=false, transpose_b=true} : f32[2,4]\n",
    "  %35 = reduce_sum(%mm) {axes=[1], keepdims=true} : f32[2,1]\n",
    "  %36 = reduce_mean(%mm) {axes=[-1, 0], keepdims=false} : f32[]\n",
    "  %37 = reduce_max(%mm) {axes=[0, 1], keepdims=false} : f32[]\n",
    "  %38 = reduce_sum(%mm) {axes=[], keepdims=false} : f32[2,4]\n",
    "  %39 = softmax(%mm) {axis=-1} : f32[2,4]\n",
    "  %40 = log_softmax(%mm) {axis=-1} : f32[2,4]\n",
    "  %ln = layer_norm(%mm, %g, %g) {eps=1e-5} : f32[2,4]\n",
    "  %42 = layer_norm(%ln) {eps=1e-5} : f32[2,4]\n",
    "  %xent = cross_entropy(%ln, %ids) : f32[]\n",
    "  %44 = embedding(%ids, %w) : f32[2,4]\n",
    "  %45 = reshape(%ln) : f32[8]\n",
    "  %46 = transpose(%ln) {perm=[1, 0]} : f32[4,2]\n",
    "  %bc = broadcast_to(%g) : f32[3,4]\n",
    "  %sl = slice(%bc) {axis=0, start=1, end=3} : f32[2,4]\n",
    "  %49 = concat(%sl, %ln, %x) {axis=0} : f32[6,4]\n",
    "  %50 = concat(%sl) {axis=0} : f32[2,4]\n",
    "  %51 = causal_mask(%sl) {value=-inf} : f32[2,4]\n",
    "  %h16 = cast(%sl) : f16[2,4] !amp=allow !group=3 !inserted\n",
    "  %53 = cast(%ids) : i64[2] !group=0\n",
    "  %54 = relu_grad(%x, %x) : f32[2,4]\n",
    "  %55 = gelu_grad(%x, %x) : f32[2,4]\n",
    "  %56 = gelu_tanh_grad(%x, %x) : f32[2,4]\n",
    "  %57 = tanh_grad(%x, %x) : f32[2,4]\n",
    "  %58 = sigmoid_grad(%x, %x) : f32[2,4]\n",
    "  %59 = sqrt_grad(%x, %x) : f32[2,4]\n",
    "  %60 = rsqrt_grad(%x, %x) : f32[2,4]\n",
    "  %61 = square_grad(%x, %x) : f32[2,4]\n",
    "  %62 = div_grad_b(%x, %x, %x) : f32[2,4]\n",
    "  %63 = pow_grad_base(%x, %x, %x) : f32[2,4]\n",
    "  %64 = pow_grad_exp(%x, %x, %x) : f32[2,4]\n",
    "  %65 = maximum_grad(%x, %x, %x) : f32[2,4]\n",
    "  %66 = minimum_grad(%x, %x, %x) : f32[2,4]\n",
    "  %67 = reduce_max_grad(%x, %g, %x) : f32[2,4]\n",
    "  %68 = softmax_grad(%mm, %mm) {axis=1} : f32[2,4]\n",
    "  %69 = log_softmax_grad(%mm, %mm) {axis=-1} : f32[2,4]\n",
    "  %70 = layer_norm_grad(%mm, %mm, %g) {eps=0.001} : f32[2,4]\n",
    "  %71 = layer_norm_grad(%mm, %mm) {eps=1e-5} : f32[2,4]\n",
    "  %72 = cross_entropy_grad(%ln, %ids, %xent) : f32[2,4]\n",
    "  %73 = embedding_grad(%ids, %mm) : f32[10,4]\n",
    "  %74 = pad(%x) {axis=1, before=1, after=2} : f32[2,7]\n",
    "  %75 = causal_mask(%sl) {value=-1e9} : f32[2,4]\n",
    "  %st = state {init=\"constant\", value=1e-5, frozen=false} : i32[]\n",
    "  %st1 = add(%st, %st) : i32[]\n",
    "  %cs = cos(%x) : f32[2,4]\n",
    "  %fin = isfinite(%x) : bool[2,4]\n",
    "  %sw = silu(%x) : f32[2,4]\n",
    "  %swg = silu_grad(%x, %x) : f32[2,4]\n",
    "  %rms = rms_norm(%x, %g) {eps=1e-6} : f32[2,4]\n",
    "  %rmg = rms_norm_grad(%x, %x) {eps=1e-5} : f32[2,4]\n",
    "  %lnm = layer_norm_mean(%mm) : f32[2,1]\n",
    "  %lnr = layer_norm_rstd(%mm) {eps=1e-5} : f32[2,1]\n",
    "  %lng = layer_norm_grad_stats(%mm, %mm, %lnm, %lnr, %g) : f32[2,4]\n",
    "  %rmr = rms_norm_rstd(%x) {eps=1e-6} : f32[2,1]\n",
    "  %rmgs = rms_norm_grad_stats(%x, %x, %rmr) : f32[2,4]\n",
    "  %sn = sin(%x) : f32[2,4]\n",
    "  %ab = abs(%st1) : i32[]\n",
    "  %sg = sign(%x) : f32[2,4]\n",
    "  %er = erf(%x) : f32[2,4]\n",
    "  %l1p = log1p(%x) : f32[2,4]\n",
    "  %em1 = expm1(%x) : f32[2,4]\n",
    "  %sp = softplus(%x) : f32[2,4]\n",
    "  %lr = leaky_relu(%x) {negative_slope=0.2} : f32[2,4]\n",
    "  %el = elu(%x) {alpha=1.0} : f32[2,4]\n",
    "  %cl = clamp(%x) {min=-inf, max=0.5} : f32[2,4]\n",
    "  %cli = clamp(%st1) {min=-3.0, max=inf} : i32[]\n",
    "  %erg = erf_grad(%x, %x) : f32[2,4]\n",
    "  %l1g = log1p_grad(%x, %x) : f32[2,4]\n",
    "  %emg = expm1_grad(%x, %x) : f32[2,4]\n",
    "  %spg = softplus_grad(%x, %x) : f32[2,4]\n",
    "  %lrg = leaky_relu_grad(%x, %x) {negative_slope=0.01} : f32[2,4]\n",
    "  %elg = elu_grad(%x, %x) {alpha=0.5} : f32[2,4]\n",
    "  %clg = clamp_grad(%x, %x) {min=-1.0, max=1.0} : f32[2,4]\n",
    "  %am = argmax(%x) {axis=-1, keepdims=false} : i64[2]\n",
    "  %an = argmin(%ids) {axis=0, keepdims=true} : i64[1]\n",
    "  %oh = one_hot(%ids) {depth=5} : bf16[2,5]\n",
    "  %dr = dropout(%x) {p=0.25, stream=3} : f32[2,4]\n",
    "  %drs = dropout(%x, %st1) {p=0.5, seed=-7, stream=4} : f32[2,4]\n",
    "  %un = uniform {low=-1.0, high=2.0, stream=5} : f16[3]\n",
    "  %nr = normal(%st1) {mean=0.0, std=1.0, seed=1, stream=6} : f64[2]\n",
    "  %x4 = reshape(%x) : f32[1,1,2,4]\n",
    "  %att = attention(%x4, %x4, %x4) {causal=true, scale=0.5} : f32[1,1,2,4]\n",
    "  %atg = attention_grad(%x4, %x4, %x4, %att, %x4) {causal=false, scale=-0.25} : f32[1,1,6,4]\n",
    "  %fi = found_inf(%x, %w) : bool[]\n",
    "  %ssq = sum_squares(%x, %x) : f64[]\n",
    "  %mse = mse_loss(%x, %x) : f32[2,4]\n",
    "  %l1l = l1_loss(%x, %x) : f32[2,4]\n",
    "  %sl1 = smooth_l1_loss(%x, %x) {beta=0.5} : f32[2,4]\n",
    "  %bce = binary_cross_entropy_with_logits(%x, %x, %g) : f32[2,4]\n",
    "  %nll = nll_loss(%ln, %ids, %g) {ignore_index=-100, reduction=\"sum\"} : f32[]\n",
    "  %cew = cross_entropy(%ln, %ids, %g) {ignore_index=1, label_smoothing=0.1} : f32[]\n",
    "  %mseg = mse_loss_grad(%x, %x, %x) : f32[2,4]\n",
    "  %l1lg = l1_loss_grad(%x, %x, %x) : f32[2,4]\n",
    "  %sl1g = smooth_l1_loss_grad(%x, %x, %x) {beta=1.0} : f32[2,4]\n",
    "  %bceg = binary_cross_entropy_with_logits_grad(%x, %x, %g) {operand=2} : f32[2,4]\n",
    "  %nllg = nll_loss_grad(%ln, %ids, %xent, %xent, %g) {ignore_index=0} : f32[2,4]\n",
    "  %ceg = cross_entropy_grad(%ln, %ids, %xent, %xent) {ignore_index=-100, label_smoothing=0.2} : f32[2,4]\n",
    "  %im = input : f32[2,4,7,9]\n",
    "  %kw = input : f32[6,2,3,2]\n",
    "  %cb = input : f32[6]\n",
    "  %c2 = conv2d(%im, %kw, %cb) {stride=[2, 1], padding=[1, 0], dilation=[1, 2], groups=2} : f32[2,6,4,7]\n",
    "  %sq = input : f32[2,4,9]\n",
    "  %k1 = input : f32[3,4,3]\n",
    "  %c1 = conv1d(%sq, %k1) {stride=[2], padding=[1], dilation=[2], groups=1} : f32[2,3,4]\n",
    "  %cgi = conv_grad_input(%c2, %kw) {stride=[2, 1], padding=[1, 0], dilation=[1, 2], groups=2} : f32[2,4,7,9]\n",
    "  %cgw = conv_grad_weight(%im, %c2) {stride=[2, 1], padding=[1, 0], dilation=[1, 2], groups=2} : f32[6,2,3,2]\n",
    "  %mp = max_pool2d(%im) {kernel=[3, 2], stride=[2, 1], padding=[1, 1]} : f32[2,4,4,10]\n",
    "  %mpg = max_pool2d_grad(%im, %mp) {kernel=[3, 2], stride=[2, 1], padding=[1, 1]} : f32[2,4,7,9]\n",
    "  %ap = avg_pool2d(%im) {kernel=[2, 2], count_include_pad=false} : f32[2,4,3,4]\n",
    "  %apg = avg_pool2d_grad(%ap) {kernel=[2, 2], count_include_pad=false} : f32[2,4,7,9]\n",
    "  %aa = adaptive_avg_pool2d(%im) {output_size=[3, 4]} : f32[2,4,3,4]\n",
    "  %aag = adaptive_avg_pool2d_grad(%aa) {output_size=[3, 4]} : f32[2,4,7,9]\n",
    "  %bn = batch_norm(%x, %g, %g) {eps=1e-5, momentum=0.1} : f32[2,4]\n",
    "  %bnt = batch_norm(%x, %g, %g, %g, %g) {eps=0.001, momentum=0.5, training=true} : f32[2,4]\n",
    "  %gn = group_norm(%x, %g, %g) {num_groups=2, eps=1e-5} : f32[2,4]\n",
    "  %gi = input : i64[2,3]\n",
    "  %ga = gather(%x, %gi) {axis=1} : f32[2,3]\n",
    "  %is = index_select(%x, %ids) {axis=0} : f32[2,4]\n",
    "  %ar = arange {start=1.0, end=4.0, step=0.5} : i32[6]\n",
    "  %cu = cumsum(%x) {axis=-1, reverse=true} : f32[2,4]\n",
    "  %gag = gather_grad(%gi, %ga) {axis=1} : f32[2,4]\n",
    "  %isg = index_select_grad(%ids, %is) {axis=0} : f32[2,4]\n",
    "  %\"grad:w\" = neg(%w) : f32[4,4] !amp=deny\n",
    "  %\"a b\\\"c\\\\\\n\" = relu(%\"grad:w\") : f32[4,4] !amp=infer\n",
    "  %h.1_B = square(%\"a b\\\"c\\\\\\n\") : f32[4,4] !amp=clear !inserted\n",
    "  %\"12\" = neg(%h16) : f16[2,4]\n",
    "  output \"logits\" = %h16\n",
    "  output \"weird \\\"out\\\"\\t\" = %\"12\"\n",
    "  output \"loss\" = %xent\n",
    "  update \"st\" = %st1\n",
    "  loss %xent\n",
    "}\n",
};
static char *every_op;

/* Parses len bytes from an exact-size heap copy, so ASan sees any over-read. */
static ir_graph *parse_n(const char *text, size_t len, char *err, size_t errlen)
{
    char *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, text, len);
    ir_graph *g = ir_parse(copy, len, "t.ir", err, errlen);
    free(copy);
    return g;
}

static ir_graph *parse_ok(const char *text)
{
    char err[512];
    ir_graph *g = parse_n(text, strlen(text), err, sizeof err);
    if (!g) fail_msg("parse failed: %s", err);
    return g;
}

static char *print_ok(const ir_graph *g)
{
    char *s = ir_print_string(g);
    assert_non_null(s);
    return s;
}

/* parse(text) prints back exactly as `want`, and that text reparses to itself. */
static void assert_prints_as(const char *text, const char *want)
{
    ir_graph *g = parse_ok(text);
    char *s = print_ok(g);
    assert_string_equal(s, want);
    ir_graph *g2 = parse_ok(s);
    char *s2 = print_ok(g2);
    assert_string_equal(s2, s);
    al_free(s);
    al_free(s2);
    ir_graph_free(g);
    ir_graph_free(g2);
}

/* What the example prints as: no comment, every attribute's default filled in. */
static const char example_printed[] =
    "graph mlp {\n"
    "  %x = input : f32[4,8]\n"
    "  %w1 = param {init=\"normal\", std=0.02, frozen=false} : f32[8,16]\n"
    "  %2 = matmul(%x, %w1) {transpose_a=false, transpose_b=false} : f32[4,16]\n"
    "  %h = relu(%2) : f32[4,16]\n"
    "  %4 = reduce_sum(%h) {axes=[1], keepdims=true} : f32[4,1]\n"
    "  %c = constant {value=0.5} : f32[]\n"
    "  %6 = cast(%4) : f16[4,1] !amp=allow !inserted\n"
    "  %\"grad:w1\" = neg(%x) : f32[4,8]\n"
    "  output \"y\" = %6\n"
    "  loss %c\n"
    "}\n";

static void the_documented_example_parses_and_prints_without_its_comment_and_with_every_default(void **state)
{
    (void)state;
    ir_graph *g = parse_ok(example);
    assert_string_equal(g->name, "mlp");
    assert_int_equal(g->nnodes, 8);
    assert_int_equal(g->nodes[2]->op, IR_OP_matmul);
    assert_int_equal(g->nodes[6]->amp, AMP_ALLOW);
    assert_true(g->nodes[6]->flags & IR_NODE_INSERTED);
    assert_int_equal(g->nodes[6]->group, -1);
    assert_int_equal(ir_find_name(g, "grad:w1"), 7);
    assert_int_equal(g->noutputs, 1);
    assert_string_equal(g->outputs[0].name, "y");
    assert_int_equal(g->outputs[0].node, 6);
    assert_int_equal(g->loss, 5);
    assert_int_equal(ir_verify(g), ALLOY_OK);
    char *s = print_ok(g);
    assert_string_equal(s, example_printed);
    al_free(s);
    ir_graph_free(g);
}

/* The data-parallel collectives (docs/distributed.md), apart from every_op. */
static const char collective_ops[] =
    "graph collectives {\n"
    "  %x = input : f32[2,4]\n"
    "  %s = all_reduce(%x) : f32[2,4]\n"
    "  %t = all_reduce(%s) {reduce=\"sum\"} : f32[2,4]\n"
    "  %fi = found_inf(%t) : bool[]\n"
    "  %m = all_reduce(%fi) {reduce=\"max\"} : bool[]\n"
    "  %flat = reshape(%t) : f32[8]\n"
    "  %shard = reduce_scatter(%flat) {world=4} : f32[2]\n"
    "  %whole = all_gather(%shard) {world=4} : f32[8]\n"
    "}\n";

static void every_op_round_trips_byte_for_byte(void **state)
{
    (void)state;
    assert_prints_as(every_op, every_op);
    assert_prints_as(collective_ops, collective_ops);
    bool seen[IR_OP_COUNT] = {false};
    const char *const texts[] = {every_op, collective_ops};
    for (int k = 0; k < 2; k++) {
        ir_graph *g = parse_ok(texts[k]);
        for (int i = 0; i < g->nnodes; i++) seen[g->nodes[i]->op] = true;
        ir_graph_free(g);
    }
    for (int op = 0; op < IR_OP_COUNT; op++)
        if (!seen[op]) fail_msg("op %s is missing from the every_op and collective_ops texts", ir_ops[op].name);
}

static void floats_print_as_the_shortest_text_that_reads_back_exactly(void **state)
{
    (void)state;
    static const double v[] = {0.1, 1e-5, 3.0, -INFINITY, INFINITY, NAN, 1e300, -0.0, 0.0, 5e-324, DBL_MAX,
                               DBL_MIN, 1.0 / 3.0, -2.5, 123456789.0, 1e16, 0.30000000000000004, 2e-7};
    static const char want[] =
        "graph floats {\n  %c = constant {values=[0.1, 1e-5, 3.0, -inf, inf, nan, 1e300, -0.0, 0.0, 5e-324, "
        "1.7976931348623157e308, 2.2250738585072014e-308, 0.3333333333333333, -2.5, 123456789.0, 1e16, "
        "0.30000000000000004, 2e-7]} : f32[18]\n}\n";
    int n = (int)(sizeof v / sizeof *v);
    ir_graph *g = ir_graph_new("floats");
    ir_type t = {ALLOY_F32, 1, {n}};
    ir_attr a = ir_a_floats("values", n, v);
    assert_non_null(ir_add_node(g, IR_OP_constant, 0, NULL, 1, &a, &t, "c"));
    char *s = print_ok(g);
    assert_string_equal(s, want);
    ir_graph *g2 = parse_ok(s);
    for (int i = 0; i < n; i++) {
        double back = g2->nodes[0]->attrs[0].floats[i];
        if (isnan(v[i])) assert_true(isnan(back));
        else assert_memory_equal(&back, &v[i], sizeof back);
    }
    al_free(s);
    ir_graph_free(g);
    ir_graph_free(g2);
}

static void attributes_of_every_kind_built_through_the_api_round_trip(void **state)
{
    (void)state;
    ir_graph *g = ir_graph_new("kinds");
    ir_type t = {ALLOY_F32, 1, {4}};
    /* the one string attribute names an init: the escapes go through a node name */
    const char *weird = "we\"ird\\\n\t\x01 \xc3\xa9";
    ir_attr pa[] = {ir_a_str("init", "normal"), ir_a_float("std", 2.0), ir_a_bool("frozen", false)};
    assert_non_null(ir_add_node(g, IR_OP_param, 0, NULL, 3, pa, &t, weird));
    double vals[] = {0.1, -1e-5, 3.0, 1e300};
    ir_attr ca = ir_a_floats("values", 4, vals);
    assert_non_null(ir_add_node(g, IR_OP_constant, 0, NULL, 1, &ca, &t, NULL));
    int64_t axes[] = {0};
    ir_attr ra[] = {ir_a_ints("axes", 1, axes), ir_a_bool("keepdims", true)};
    int in0 = 0;
    assert_non_null(ir_add_node(g, IR_OP_reduce_sum, 1, &in0, 2, ra, NULL, NULL));
    ir_attr ea = ir_a_floats("values", 0, NULL);
    ir_type empty = {ALLOY_F32, 1, {0}};
    assert_non_null(ir_add_node(g, IR_OP_constant, 0, NULL, 1, &ea, &empty, "e"));
    char *s = print_ok(g);
    assert_string_equal(s, "graph kinds {\n"
                           "  %\"we\\\"ird\\\\\\n\\t\\x01 \xc3\xa9\" = param {init=\"normal\", std=2.0, frozen=false} : f32[4]\n"
                           "  %1 = constant {values=[0.1, -1e-5, 3.0, 1e300]} : f32[4]\n"
                           "  %2 = reduce_sum(%\"we\\\"ird\\\\\\n\\t\\x01 \xc3\xa9\") {axes=[0], keepdims=true} : f32[1]\n"
                           "  %e = constant {values=[]} : f32[0]\n"
                           "}\n");
    ir_graph *g2 = parse_ok(s);
    assert_string_equal(g2->nodes[0]->name, weird);
    assert_int_equal(g2->nodes[3]->attrs[0].kind, IR_ATTR_FLOATS);
    char *s2 = print_ok(g2);
    assert_string_equal(s2, s);
    al_free(s);
    al_free(s2);
    ir_graph_free(g);
    ir_graph_free(g2);
}

static void integers_where_floats_are_wanted_print_as_floats(void **state)
{
    (void)state;
    /* an integer where a float is wanted becomes a float; ints in a float list too */
    assert_prints_as("graph g {\n  %p = param {init=\"normal\", std=1, mean=-3} : f32[2]\n"
                     "  %c = constant {values=[1, 2.5]} : f32[2]\n}\n",
                     "graph g {\n  %p = param {init=\"normal\", mean=-3.0, std=1.0, frozen=false} : f32[2]\n"
                     "  %c = constant {values=[1.0, 2.5]} : f32[2]\n}\n");
}

static void labels_are_renumbered_and_names_that_are_not_identifiers_are_quoted(void **state)
{
    (void)state;
    assert_prints_as("graph \"my graph\" {\n"
                     "  %100 = input : f32[3]\n"
                     "  %7 = relu(%100) : f32[3]\n"
                     "  %\"plain\" = add(%7, %100) : f32[3]\n"
                     "  %\"7\" = neg(%plain) : f32[3]\n"
                     "  %\"tab\\there\\x7f\\r\" = neg(%\"7\") : f32[3]\n"
                     "  %\"\\x41\\'\" = neg(%7) : f32[3]\n"
                     "  %_a.b9 = neg(%100) : f32[3]\n"
                     "  output \"o\" = %\"7\"\n"
                     "}\n",
                     "graph \"my graph\" {\n"
                     "  %0 = input : f32[3]\n"
                     "  %1 = relu(%0) : f32[3]\n"
                     "  %plain = add(%1, %0) : f32[3]\n"
                     "  %\"7\" = neg(%plain) : f32[3]\n"
                     "  %\"tab\\there\\x7f\\r\" = neg(%\"7\") : f32[3]\n"
                     "  %\"A'\" = neg(%1) : f32[3]\n"
                     "  %_a.b9 = neg(%0) : f32[3]\n"
                     "  output \"o\" = %\"7\"\n"
                     "}\n");
}

static void whitespace_comments_crlf_and_a_missing_final_newline_are_accepted(void **state)
{
    (void)state;
    assert_prints_as("\n# lead\n\n  graph   g{# brace\r\n"
                     "\t%x=input:f32[ 2 , 3 ]   # trailing\r\n"
                     "\n"
                     "   # only a comment\n"
                     "%y = reduce_sum ( %x ) { axes = [ 1 , -2 ] , keepdims = false } : f32 [ ] ! amp = deny !group=12\n"
                     "  output\"out\"=%y\n"
                     "loss %y\n"
                     "} # done",
                     "graph g {\n"
                     "  %x = input : f32[2,3]\n"
                     "  %y = reduce_sum(%x) {axes=[1, -2], keepdims=false} : f32[] !amp=deny !group=12\n"
                     "  output \"out\" = %y\n"
                     "  loss %y\n"
                     "}\n");
    assert_prints_as("graph empty {\n}", "graph empty {\n}\n");
}

static void printing_to_a_file_writes_the_same_text_as_print_string(void **state)
{
    (void)state;
    ir_graph *g = parse_ok(every_op);
    FILE *f = tmpfile();
    assert_non_null(f);
    ir_print(g, f);
    long n = ftell(f);
    assert_int_equal(n, (long)strlen(every_op));
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    assert_string_equal(buf, every_op);
    free(buf);
    fclose(f);
    ir_graph_free(g);
}

/* A backward node's origin (the forward node whose gradient rule made it)
 * is text too: a bundle's IR keeps what the overflow locator reports. */
static void a_nodes_origin_survives_print_and_parse(void **state)
{
    (void)state;
    static const char text[] = "graph g {\n"
                               "  %x = input : f32[2]\n"
                               "  %y = neg(%x) : f32[2]\n"
                               "  %2 = neg(%y) : f32[2] !origin=%y\n"
                               "  output \"z\" = %2\n"
                               "}\n";
    ir_graph *g = parse_ok(text);
    assert_int_equal(g->nodes[2]->origin, 1);
    assert_int_equal(g->nodes[1]->origin, -1);
    char *back = ir_print_string(g);
    assert_non_null(back);
    assert_string_equal(back, text);
    al_free(back);
    ir_graph_free(g);
}

#define G "graph g {\n"
#define HDR G "  %x = input : f32[2]\n"
#define END "}\n"

static void malformed_text_reports_file_line_column_and_what_was_expected(void **state)
{
    (void)state;
    static const struct {
        const char *text, *err;
    } cases[] = {
        {"", "t.ir:1:1: expected 'graph' at the start of the file, found end of file"},
        {"  # only a comment\n\n", "t.ir:3:1: expected 'graph' at the start of the file, found end of file"},
        {HDR, "t.ir:3:1: expected '}' before end of file"},
        {G "  %x = input : f32[2]", "t.ir:2:22: expected '}' before end of file"},
        {"graph {\n" END, "t.ir:1:7: expected a graph name after 'graph', found '{'"},
        {"graph g\n" END, "t.ir:1:8: expected '{' after the graph name, found end of line"},
        {G "}\n" END, "t.ir:3:1: expected end of file after '}', found '}'"},
        {G "  x = input : f32[2]\n" END,
          "t.ir:2:3: expected a statement (%name = op..., output, update, loss) or '}', found 'x'"},
        {G "  %x input : f32[2]\n" END, "t.ir:2:6: expected '=' after the node name, found 'input'"},
        {G "  %x = : f32[2]\n" END, "t.ir:2:8: expected an op name after '=', found ':'"},
        {HDR "  %y = matmull(%x, %x) : f32[2]\n" END, "t.ir:3:8: unknown op 'matmull'"},
        /* operands */
        {HDR "  %y = add(%x) : f32[2]\n" END, "t.ir:3:8: add(f32[2]) 'y': takes 2 operands, got 1"},
        {HDR "  %y = add(%x, ) : f32[2]\n" END, "t.ir:3:16: expected an operand (%name or %12), found ')'"},
        {HDR "  %y = add(%x %x) : f32[2]\n" END, "t.ir:3:15: expected ')' after operand list, found '%x'"},
        {HDR "  %y = add(%x,, %x) : f32[2]\n" END, "t.ir:3:15: expected an operand (%name or %12), found ','"},
        {HDR "  %y = relu(%x\n" END, "t.ir:3:15: expected ')' after operand list, found end of line"},
        {HDR "  %y = relu(%7) : f32[2]\n" END, "t.ir:3:13: %7 is not defined"},
        {HDR "  %y = relu(%\"no pe\") : f32[2]\n" END, "t.ir:3:13: %\"no pe\" is not defined"},
        {HDR "  %y = relu(%) : f32[2]\n" END,
          "t.ir:3:13: expected a node name after '%' (%name, %\"name\" or %12), found ')'"},
        {HDR "  %y = relu(%12ab) : f32[2]\n" END, "t.ir:3:13: malformed node label '%12ab'"},
        {HDR "  %y = relu(%99999999999999999999) : f32[2]\n" END,
          "t.ir:3:13: label %99999999999999999999 is too large"},
        {HDR "  %x = relu(%x) : f32[2]\n" END, "t.ir:3:3: %x is defined twice (first on line 2)"},
        {G "  %1 = input : f32[2]\n  %a = relu(%1) : f32[2]\n  %1 = relu(%1) : f32[2]\n" END,
          "t.ir:4:3: %1 is defined twice (first on line 2)"},
        {G "  %\"\" = input : f32[2]\n" END, "t.ir:2:3: node name must not be empty"},
        {G "  %3 = param {init=\"zeros\"} : f32[2]\n" END,
          "t.ir:3:1: graph fails verification: %0 (param): has no name: a param or state is saved, restored and "
          "looked up by its name (write it as %name = ..., not %number)"},
        /* types */
        {G "  %x = input\n" END, "t.ir:2:13: expected ':' before the node's type, found end of line"},
        {G "  %x = input :\n" END, "t.ir:2:15: expected a type such as f32[4,8] after ':', found end of line"},
        {G "  %x = input : f8[2]\n" END,
          "t.ir:2:16: unknown dtype 'f8' (expected f32, f16, bf16, f64, i32, i64 or bool)"},
        {G "  %x = input : f32\n" END, "t.ir:2:19: expected '[' after dtype 'f32', found end of line"},
        {G "  %x = input : f32[2\n" END, "t.ir:2:21: expected ',' or ']' between dims, found end of line"},
        {G "  %x = input : f32[2,]\n" END, "t.ir:2:22: expected a dim (a non-negative integer), found ']'"},
        {G "  %x = input : f32[2.5]\n" END, "t.ir:2:20: expected a dim (a non-negative integer), found '2.5'"},
        {G "  %x = input : f32[-1]\n" END, "t.ir:2:20: dim -1 is negative"},
        {G "  %x = input : f32[99999999999999999999]\n" END, "t.ir:2:20: dim 99999999999999999999 is too large"},
        {G "  %x = input : f32[4294967296,4294967296]\n" END,
          "t.ir:2:16: shape [4294967296,4294967296] has more than 2^59 elements (its nonzero dims multiplied)"},
        {G "  %x = input : f32[1,1,1,1,1,1,1,1,1]\n" END, "t.ir:2:36: rank exceeds the maximum of 8"},
        {G "  %x = input : f32[4,8]\n  %w = input : f32[8,16]\n  %y = matmul(%x, %w) : f32[4,17]\n" END,
          "t.ir:4:25: declared f32[4,17] but matmul gives f32[4,16]"},
        {G "  %x = input : f32[4,8]\n  %y = cast(%x) : f16[4]\n" END,
          "t.ir:3:19: declared f16[4] but cast gives f16[4,8]"},
        {G "  %x = input : f32[4,8]\n  %y = reshape(%x) : f32[5]\n" END,
          "t.ir:3:8: reshape(f32[4,8]) 'y': element counts differ: 32 vs 5"},
        {G "  %a = input : f32[288230376151711744]\n  %b = concat(%a, %a) : f32[1]\n" END,
          "t.ir:3:8: concat(f32[288230376151711744], f32[288230376151711744]) 'b': the result has more elements than fit in memory"},
        {HDR "  %y = pad(%x) {axis=0, before=4611686018427387904, after=4611686018427387904} : f32[2]\n" END,
         "t.ir:3:8: pad: the result's dims would exceed 2^63-1"},
        {G "  %a = input : f32[1099511627776,1]\n  %b = input : f32[1,1099511627776]\n  %c = matmul(%a, %b) : f32[1]\n" END,
          "t.ir:4:8: matmul(f32[1099511627776,1], f32[1,1099511627776]) 'c': the result has more elements than fit in memory"},
        {G "  %x = input : f32[2] extra\n" END, "t.ir:2:23: expected end of line after node, found 'extra'"},
        /* attributes */
        {HDR "  %y = relu(%x) {foo=1} : f32[2]\n" END,
          "t.ir:3:18: unknown attribute 'foo' for relu (it takes none)"},
        /* an init must be one alloy computes, with only the values it reads */
        {G "  %w = param {init=\"nromal\", std=0.02} : f32[2]\n" END,
          "t.ir:2:8: param() 'w': unknown init \"nromal\" (zeros, ones, constant, normal, uniform, kaiming_uniform, "
          "kaiming_normal, xavier_uniform or xavier_normal)"},
        {G "  %m = state {init=\"\"} : f32[2]\n" END, "t.ir:2:8: state() 'm': unknown init \"\" (zeros, ones, constant, normal, uniform, "
          "kaiming_uniform, kaiming_normal, xavier_uniform or xavier_normal)"},
        {G "  %w = param {init=\"kaiming_uniform\", std=0.1} : f32[2]\n" END,
          "t.ir:2:8: param() 'w': init \"kaiming_uniform\" does not read 'std' (it reads gain)"},
        {G "  %w = param {init=\"zeros\", value=1.0} : f32[2]\n" END,
          "t.ir:2:8: param() 'w': init \"zeros\" does not read 'value' (it reads no attribute)"},
        {G "  %w = param {init=\"uniform\", low=0, high=1, std=1} : f32[2]\n" END,
          "t.ir:2:8: param() 'w': init \"uniform\" does not read 'std' (it reads low and high)"},
        {G "  %w = param {init=\"normal\", std=0.1} : i32[2]\n" END,
          "t.ir:2:8: param() 'w': random init \"normal\" needs a floating-point dtype, not i32"},
        /* elementwise attributes may not be NaN; argmax needs an index to give; one_hot a depth */
        {HDR "  %y = clamp(%x) {max=nan} : f32[2]\n" END, "t.ir:3:8: clamp(f32[2]) 'y': max must be a number, not NaN"},
        {G "  %e = input : f32[2,0]\n  %y = argmax(%e) {axis=1} : i64[2]\n" END,
          "t.ir:3:8: argmax(f32[2,0]) 'y': axis 1 is empty: there is no index to give"},
        {G "  %i = input : i64[3]\n  %y = one_hot(%i) {depth=0} : f32[3,0]\n" END,
          "t.ir:3:8: one_hot(i64[3]) 'y': depth must be >= 1, not 0"},
        {G "  %i = input : i64[3]\n  %y = one_hot(%i) : f32[3,4]\n" END,
          "t.ir:3:8: one_hot needs attribute 'depth'"},
        {HDR "  %y = softmax(%x) {axes=1} : f32[2]\n" END,
          "t.ir:3:21: unknown attribute 'axes' for softmax (it takes axis)"},
        {HDR "  %y = reduce_sum(%x) {axes=1} : f32[]\n" END,
          "t.ir:3:24: attribute 'axes' of reduce_sum must be a list of integers, found an integer"},
        {HDR "  %y = softmax(%x) {axis=0, axis=0} : f32[2]\n" END, "t.ir:3:29: attribute 'axis' is given twice"},
        
         {HDR "  %y = softmax(%x) {axis=-9223372036854775808} : f32[2]\n" END, /* int64 limits are exact */ "t.ir:3:8: softmax(f32[2]) 'y': axis -9223372036854775808 out of range for rank 1"},
        {HDR "  %y = softmax(%x) {axis=+9223372036854775807} : f32[2]\n" END,
          "t.ir:3:8: softmax(f32[2]) 'y': axis 9223372036854775807 out of range for rank 1"},
        {HDR "  %y = softmax(%x) {axis=9223372036854775808} : f32[2]\n" END,
          "t.ir:3:26: integer 9223372036854775808 is too large"},
        {G "  %x = input : f32[2,3]\n  %y = transpose(%x) : f32[3,2]\n" END,
          "t.ir:3:8: transpose needs attribute 'perm'"},
        {G "  %x = param {init=\"a} : f32[2]\n" END,
          "t.ir:2:20: unterminated string (expected '\"' before end of line)"},
        {G "  %x = param {init=\"a\\q\"} : f32[2]\n" END,
          "t.ir:2:22: unknown escape '\\q' in string (expected \\\" \\\\ \\' \\n \\t \\r or \\xHH)"},
        {G "  %x = param {init=\"\\x00\"} : f32[2]\n" END,
          "t.ir:2:21: expected two hex digits (not 00) after '\\x' in string"},
        {G "  %x = param {init=\"a\", std=} : f32[2]\n" END,
          "t.ir:2:29: expected an attribute value (number, true, false, string or list), found '}'"},
        {G "  %x = param {init=\"a\" std=1} : f32[2]\n" END,
          "t.ir:2:24: expected ',' or '}' after attribute, found 'std'"},
        {G "  %x = constant {values=[1, \"a\"]} : f32[2]\n" END,
          "t.ir:2:29: expected a number in list, found string \"a\""},
        {G "  %x = constant {values=[1 2]} : f32[2]\n" END, "t.ir:2:28: expected ',' or ']' in list, found '2'"},
        {G "  %x = constant {value=12abc} : f32[]\n" END, "t.ir:2:24: malformed number '12abc'"},
        {G "  %x = constant {value=1e999} : f32[]\n" END,
          "t.ir:2:24: float 1e999 is out of range (write inf or -inf)"},
        {G "  %x = constant {value=0.5} : f32[2]\n  %y = constant {values=[1.0]} : f32[2]\n" END,
          "t.ir:3:8: constant() 'y': 1 values for 2 elements"},
        /* annotations, outputs, loss */
        {G "  %x = input : f32[2] !amp=fast\n" END,
          "t.ir:2:28: expected an amp class (allow, deny, infer or clear), found 'fast'"},
        {G "  %x = input : f32[2] !amp=deny !amp=deny\n" END, "t.ir:2:34: annotation !amp is given twice"},
        {G "  %x = input : f32[2] !group=-1\n" END,
          "t.ir:2:30: expected a group number in [0, 2147483647], found '-1'"},
        {G "  %x = input : f32[2] !fused\n" END,
          "t.ir:2:24: expected an annotation (amp, group, inserted or origin) after '!', found 'fused'"},
        {HDR "  %y = neg(%x) : f32[2] !origin=%z\n" END, "t.ir:3:33: %z is not defined"},
        {HDR "  %y = neg(%x) : f32[2] !origin=%x !origin=%x\n" END, "t.ir:3:37: annotation !origin is given twice"},
        {HDR "  output y = %x\n" END,
          "t.ir:3:10: expected the output's name as a string after 'output', found 'y'"},
        {HDR "  output \"y\" = %x\n  output \"y\" = %x\n" END, "t.ir:4:10: output \"y\" is declared twice"},
        {HDR "  output \"y\" = %z\n" END, "t.ir:3:16: %z is not defined"},
        {HDR "  loss %x\n" END, "t.ir:3:8: loss %x must be a floating-point scalar, found f32[2]"},
        {G "  %x = input : i32[]\n  loss %x\n" END,
          "t.ir:3:8: loss %x must be a floating-point scalar, found i32[]"},
        {G "  %x = input : f32[]\n  loss %x\n  loss %x\n" END, "t.ir:4:3: loss is declared twice"},
        {G "  %x = input : f32[]\n  loss %x %x\n" END, "t.ir:3:11: expected end of line after loss, found '%x'"},
        /* the shard collectives' type rules */
        {HDR "  %y = reduce_scatter(%x) {world=3} : f32[1]\n" END,
         "t.ir:3:8: reduce_scatter(f32[2]) 'y': 2 elements do not split into 3 equal shards (pad the bucket to a multiple)"},
        {HDR "  %y = all_gather(%x) {world=0} : f32[2]\n" END, "t.ir:3:8: all_gather(f32[2]) 'y': world must be 1 to 1048576 ranks, not 0"},
        {HDR "  %y = all_gather(%x) : f32[2]\n" END, "t.ir:3:8: all_gather needs attribute 'world'"},
        {G "  %x = input : f32[2,2]\n  %y = reduce_scatter(%x) {world=2} : f32[2]\n" END,
         "t.ir:3:8: reduce_scatter(f32[2,2]) 'y': operand must be 1-D (a flat bucket), not rank 2"},
        {G "  %s = state {init=\"zeros\", shard_of=[3]} : f32[2,2]\n" END,
         "t.ir:2:8: state() 's': shard_of marks a 1-D state no longer than the tensor it is a shard of"},
        /* bytes that are not part of the language */
        {G "  %x = input : f32[2] $\n" END, "t.ir:2:23: unexpected character '$'"},
        {G "  %x = input : f32[2] \x01\n" END, "t.ir:2:23: unexpected byte 0x01"},
        {G "  %x = input : f32[2] \xff\n" END, "t.ir:2:23: unexpected byte 0xff"},
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[512];
        ir_graph *g = parse_n(cases[i].text, strlen(cases[i].text), err, sizeof err);
        if (g) al_fmt(err, sizeof err, "(parsed without error)");
        ir_graph_free(g);
        if (strcmp(err, cases[i].err) == 0) continue;
        print_message("case %zu\n  got:  %s\n  want: %s\n", i, err, cases[i].err);
        wrong++;
    }
    assert_int_equal(wrong, 0);
}

static void a_nul_byte_inside_the_text_is_an_error_not_the_end(void **state)
{
    (void)state;
    static const char text[] = "graph g {\n  %x = input : f32[2]\0\n}\n";
    char err[256];
    assert_null(parse_n(text, sizeof text - 1, err, sizeof err));
    assert_string_equal(err, "t.ir:2:22: unexpected byte 0x00");
    static const char in_string[] = "graph g {\n  output \"a\0b\" = %x\n}\n";
    assert_null(parse_n(in_string, sizeof in_string - 1, err, sizeof err));
    assert_string_equal(err, "t.ir:2:12: NUL byte in string");
}

static void errors_fit_any_error_buffer_and_a_null_buffer_is_allowed(void **state)
{
    (void)state;
    char small[8];
    memset(small, 'z', sizeof small);
    assert_null(parse_n("graph", 5, small, sizeof small));
    assert_string_equal(small, "t.ir:1:");
    assert_null(parse_n("graph", 5, NULL, 0));
    assert_null(ir_parse(NULL, 0, NULL, small, sizeof small));
    assert_string_equal(small, "<input>");
    ir_graph *g = ir_parse("graph g {\n}\n", 12, NULL, NULL, 0);
    assert_non_null(g);
    ir_graph_free(g);
}

/* ---- verifier ---- */

/* Parses the example, applies `corrupt` to g, and expects the verifier to say `want`. */
#define ASSERT_CORRUPTION_CAUGHT(corrupt, want)                                                    \
    do {                                                                                           \
        ir_graph *g = parse_ok(example);                                                           \
        corrupt;                                                                                   \
        assert_int_equal(ir_verify(g), ALLOY_ERR_VERIFY);                                          \
        if (!strstr(g->error, want)) fail_msg("verifier said '%s', expected '%s'", g->error, want); \
        ir_graph_free(g);                                                                          \
    } while (0)

static void the_verifier_accepts_well_formed_graphs(void **state)
{
    (void)state;
    const char *texts[] = {example, every_op, "graph g {\n}\n"};
    for (int i = 0; i < 3; i++) {
        ir_graph *g = parse_ok(texts[i]);
        assert_int_equal(ir_verify(g), ALLOY_OK);
        ir_graph *c = ir_graph_clone(g);
        assert_non_null(c);
        assert_int_equal(ir_verify(c), ALLOY_OK);
        ir_graph_free(c);
        ir_graph_free(g);
    }
}

static void the_verifier_rejects_an_operand_that_refers_to_a_later_node(void **state)
{
    (void)state;
    ASSERT_CORRUPTION_CAUGHT(g->nodes[3]->in[0] = 5,
                             "'h' (relu): operand 0 refers to node 5, which does not come before it");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[2]->in[1] = 2, "%2 (matmul): operand 1 refers to node 2");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[2]->in[1] = -1, "operand 1 refers to node -1");
}

static void the_verifier_rejects_a_corrupted_type(void **state)
{
    (void)state;
    ASSERT_CORRUPTION_CAUGHT(g->nodes[2]->type.dims[1] = 17,
                             "%2 (matmul): stored type f32[4,17] but the type rule gives f32[4,16]");
    ASSERT_CORRUPTION_CAUGHT((g->nodes[6]->type.dtype = ALLOY_BF16, g->nodes[6]->type.rank = 1),
                             "%6 (cast): stored type bf16[4] but the type rule gives bf16[4,1]");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[0]->type.dtype = (alloy_dtype)99, "'x' (input): stored type is invalid");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[0]->type.rank = ALLOY_MAX_RANK + 1, "'x' (input): stored type is invalid");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[0]->type.dims[0] = -4, "'x' (input): stored type is invalid");
}

static void the_verifier_rejects_a_duplicated_name(void **state)
{
    (void)state;
    ASSERT_CORRUPTION_CAUGHT(g->nodes[3]->name = g->nodes[0]->name, "name 'x' is also used by node");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[2]->name = "ghost", "'ghost' (matmul): name is missing from the name index");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[3]->name = NULL, "name index slot");
}

static void the_verifier_rejects_broken_ids_arity_attributes_outputs_and_loss(void **state)
{
    (void)state;
    ASSERT_CORRUPTION_CAUGHT(g->nodes[4]->id = 3, "node at index 4 has id 3");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[2]->nin = 1, "%2 (matmul): has 1 operands; matmul takes 2");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[2]->op = IR_OP_COUNT, "node %2 has unknown op");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[1]->attrs[1].name = "bogus", "'w1' (param): unknown attribute 'bogus'");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[1]->attrs[1].kind = IR_ATTR_INT,
                             "'w1' (param): attribute 'std' has kind int, the schema wants float");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[1]->nattrs = 0, "'w1' (param): required attribute 'init' is missing");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[4]->attrs[0].ints[0] = 7,
                             "%4 (reduce_sum): type rule fails: axis 7 out of range for rank 2");
    ASSERT_CORRUPTION_CAUGHT(g->outputs[0].node = 99, "output 'y' refers to node 99, which does not exist");
    ASSERT_CORRUPTION_CAUGHT(g->loss = 0, "'x' (input): is the loss but is not a floating-point scalar: f32[4,8]");
    ASSERT_CORRUPTION_CAUGHT(g->loss = 8, "loss refers to node 8, which does not exist");
    ASSERT_CORRUPTION_CAUGHT(g->nodes[5]->amp = 9, "'c' (constant): unknown amp class");
}

/* ---- robustness ---- */

/* A successful parse must print, reparse and print the same text again. */
static void check_parse_result(const char *text, size_t len)
{
    char err[512] = "";
    ir_graph *g = parse_n(text, len, err, sizeof err);
    if (!g) {
        if (strncmp(err, "t.ir:", 5) != 0) fail_msg("error without a location: '%s'", err);
        return;
    }
    assert_int_equal(ir_verify(g), ALLOY_OK);
    char *s = print_ok(g);
    ir_graph *g2 = parse_n(s, strlen(s), err, sizeof err);
    if (!g2) fail_msg("printed text does not reparse: %s\n%s", err, s);
    char *s2 = print_ok(g2);
    assert_string_equal(s2, s);
    al_free(s);
    al_free(s2);
    ir_graph_free(g);
    ir_graph_free(g2);
}

static void every_truncation_of_a_valid_text_fails_cleanly(void **state)
{
    (void)state;
    const char *texts[] = {example, every_op};
    for (int t = 0; t < 2; t++) {
        size_t len = strlen(texts[t]), close = (size_t)(strrchr(texts[t], '}') - texts[t]);
        for (size_t n = 0; n < len; n++) {
            char err[512] = "";
            ir_graph *g = parse_n(texts[t], n, err, sizeof err);
            if (n > close) {
                if (!g) fail_msg("prefix of %zu bytes failed: %s", n, err);
                ir_graph_free(g);
                continue;
            }
            if (g) fail_msg("prefix of %zu bytes parsed", n);
            if (strncmp(err, "t.ir:", 5) != 0) fail_msg("error without a location: '%s'", err);
        }
    }
}

/* One random edit of buf[0..*len): overwrite a byte, or delete, insert or duplicate a short run. */
static void mutate(char *buf, size_t *len, size_t cap)
{
    static const char alphabet[] = "%\"\\=(),{}[]:!#-+.e0129\n \tfaxni_";
    size_t at = (size_t)(test_next_u64() % *len), n = 1 + (size_t)(test_next_u64() % 8);
    if (at + n > *len) n = *len - at;
    switch (test_next_u64() % 3) {
    case 0: buf[at] = test_next_u64() % 2 ? (char)(test_next_u64() & 0xff) : alphabet[test_next_u64() % (sizeof alphabet - 1)]; break;
    case 1: memmove(buf + at, buf + at + n, *len - at - n), *len -= n; break;
    default: /* duplicate a run, or insert one byte */
        if (test_next_u64() % 2) n = 1;
        if (*len + n > cap) break;
        memmove(buf + at + n, buf + at, *len - at);
        if (n == 1) buf[at] = alphabet[test_next_u64() % (sizeof alphabet - 1)];
        *len += n;
    }
}

static void random_mutations_of_valid_text_never_crash(void **state)
{
    (void)state;
    size_t cap = 2 * (strlen(every_op) + sizeof example); /* room for either seed to grow */
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (int iter = 0; iter < 4000; iter++) {
        const char *seed = iter % 2 ? example : every_op;
        size_t len = strlen(seed);
        memcpy(buf, seed, len);
        for (int e = 1 + (int)(test_next_u64() % 4); e > 0 && len > 0; e--) mutate(buf, &len, cap);
        check_parse_result(buf, len);
    }
    free(buf);
}

static void random_byte_strings_never_crash(void **state)
{
    (void)state;
    char buf[256];
    for (int iter = 0; iter < 2000; iter++) {
        size_t len = (size_t)(test_next_u64() % sizeof buf);
        size_t pre = iter % 2 ? 10 : 0; /* half start as a graph, to get past the header */
        memcpy(buf, "graph g {\n", pre);
        for (size_t i = pre; i < len; i++) buf[i] = (char)(test_next_u64() & 0xff);
        check_parse_result(buf, len < pre ? pre : len);
    }
}

static void parsing_and_printing_survive_every_allocation_failure(void **state)
{
    (void)state;
    bool done = false;
    for (long budget = 0; !done && budget < 10000; budget++) {
        alloy_set_allocator(test_budget_realloc, NULL);
        test_alloc_budget = budget;
        char err[512] = "";
        ir_graph *g = ir_parse(every_op, strlen(every_op), "t.ir", err, sizeof err);
        char *s = g ? ir_print_string(g) : NULL;
        test_alloc_budget = -1;
        alloy_set_allocator(NULL, NULL);
        if (!g) {
            if (strncmp(err, "t.ir:", 5) != 0) fail_msg("budget %ld: error without a location: '%s'", budget, err);
            continue;
        }
        if (s) {
            assert_string_equal(s, every_op);
            done = true;
        }
        al_free(s);
        ir_graph_free(g);
    }
    assert_true(done);
}

int main(void)
{
    test_rng = 0x9E3779B97F4A7C15ull;
    size_t len = 1;
    for (size_t i = 0; i < sizeof every_op_lines / sizeof every_op_lines[0]; i++) len += strlen(every_op_lines[i]);
    every_op = malloc(len);
    if (!every_op) return 1;
    every_op[0] = '\0';
    for (size_t i = 0; i < sizeof every_op_lines / sizeof every_op_lines[0]; i++) strcat(every_op, every_op_lines[i]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_documented_example_parses_and_prints_without_its_comment_and_with_every_default),
        cmocka_unit_test(every_op_round_trips_byte_for_byte),
        cmocka_unit_test(floats_print_as_the_shortest_text_that_reads_back_exactly),
        cmocka_unit_test(attributes_of_every_kind_built_through_the_api_round_trip),
        cmocka_unit_test(integers_where_floats_are_wanted_print_as_floats),
        cmocka_unit_test(labels_are_renumbered_and_names_that_are_not_identifiers_are_quoted),
        cmocka_unit_test(whitespace_comments_crlf_and_a_missing_final_newline_are_accepted),
        cmocka_unit_test(printing_to_a_file_writes_the_same_text_as_print_string),
        cmocka_unit_test(a_nodes_origin_survives_print_and_parse),
        cmocka_unit_test(malformed_text_reports_file_line_column_and_what_was_expected),
        cmocka_unit_test(a_nul_byte_inside_the_text_is_an_error_not_the_end),
        cmocka_unit_test(errors_fit_any_error_buffer_and_a_null_buffer_is_allowed),
        cmocka_unit_test(the_verifier_accepts_well_formed_graphs),
        cmocka_unit_test(the_verifier_rejects_an_operand_that_refers_to_a_later_node),
        cmocka_unit_test(the_verifier_rejects_a_corrupted_type),
        cmocka_unit_test(the_verifier_rejects_a_duplicated_name),
        cmocka_unit_test(the_verifier_rejects_broken_ids_arity_attributes_outputs_and_loss),
        cmocka_unit_test(every_truncation_of_a_valid_text_fails_cleanly),
        cmocka_unit_test(random_mutations_of_valid_text_never_crash),
        cmocka_unit_test(random_byte_strings_never_crash),
        cmocka_unit_test(parsing_and_printing_survive_every_allocation_failure),
    };
    int failed = cmocka_run_group_tests_name("ir", tests, NULL, NULL);
    free(every_op);
    return failed;
}
