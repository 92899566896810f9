/* emit_conv.c - direct CUDA kernels for the convolutions (alone, or as a GEMM step's f32 product), pools and their backward ops: a thread per result element, every sum gathered (no atomics); pools in double in the CPU's order, so they give its bits. */
#include "codegen/emit_impl.h"
#include "ir/conv.h"

/* Appends the load of parameter p at C index idx (dtype dt) as T. */
static void load(cg_text *b, alloy_dtype dt, int p, const char *idx)
{
    char pn[16];
    al_fmt(pn, sizeof pn, "p%d", p);
    cg_load(b, dt, pn, idx);
}

/* Adds the kernel `name` of step k: `body` (statements at flat index e of
 * the node's `total` elements, in compute type `ct`) in a grid-stride loop. */
static const char *kernel_of(cg_program *prog, const ir_graph *g, int k, step_kind kind, const char *name,
                             const char *ct, cg_text *body, cg_params *ps, int64_t total)
{
    cg_text t = {0};
    cg_put_preamble(&t);
    cg_put(&t, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s(", CG_BLOCK, name);
    cg_param_list(&t, g, ps);
    cg_put(&t, ")\n{\n    typedef %s T;\n    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < %lldll;"
               " e += (long long)gridDim.x * blockDim.x) {\n%s    }\n}\n",
           ct, (long long)total, body->s ? body->s : "");
    int64_t bytes = 0, blocks = (total + CG_BLOCK - 1) / CG_BLOCK;
    for (int i = 0; i < ps->n; i++)
        if (ps->at[i].kind == CG_PARAM_NODE) bytes += (int64_t)ir_nbytes(&g->nodes[ps->at[i].node]->type);
    unsigned grid = (unsigned)(blocks < 1 ? 1 : blocks > CG_MAX_GRID ? CG_MAX_GRID : blocks);
    bool ok = !body->oom && !ps->oom && cg_add_kernel(prog, g, name, k, kind, &t, ps, grid, CG_BLOCK, bytes);
    cg_text_free(&t);
    cg_text_free(body);
    al_free(ps->at);
    return ok ? NULL : "out of memory";
}

static const char *kernel(cg_program *prog, const ir_graph *g, int k, const char *name, const char *ct, cg_text *body,
                          cg_params *ps, int64_t total)
{
    return kernel_of(prog, g, k, STEP_KIND_OP, name, ct, body, ps, total);
}

/* Declares the geometry's sizes as constants of the kernel body. */
static void put_geometry(cg_text *b, const ir_conv_geom *c)
{
    cg_put(b, "        const long long N_ = %lldll, C_ = %lldll, H_ = %lldll, W_ = %lldll, O_ = %lldll, OH_ = %lldll, OW_ = %lldll;\n",
           (long long)c->n, (long long)c->c, (long long)c->h, (long long)c->w, (long long)c->o, (long long)c->oh, (long long)c->ow);
    cg_put(b, "        const long long KH_ = %lldll, KW_ = %lldll, SH_ = %lldll, SW_ = %lldll, PH_ = %lldll, PW_ = %lldll, DH_ = %lldll, DW_ = %lldll;\n",
           (long long)c->kh, (long long)c->kw, (long long)c->sh, (long long)c->sw, (long long)c->ph, (long long)c->pw, (long long)c->dh,
           (long long)c->dw);
    cg_put(b, "        const long long CG_ = %lldll, OG_ = %lldll;\n        (void)N_;\n", (long long)(c->c / c->groups),
           (long long)(c->o / c->groups));
}

/* conv1d / conv2d: y[b, o, oy, ox] = bias[o] + the sum over its group's
 * channels and the kernel of x w, in f32 (f64 for f64) with one rounding;
 * as the head of a GEMM step (`product`), the f32 sum unrounded into the
 * step's product (the plan's scratch), which the epilogue kernel reads. */
static const char *conv(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const ir_conv_geom *c, const char *name,
                        bool product)
{
    cg_params ps = {0};
    cg_text b = {0};
    const ir_type *xt = &g->nodes[n->in[0]]->type;
    int out = cg_param_of(&ps, product ? CG_PARAM_PRODUCT : CG_PARAM_NODE, n->id, true, 0);
    int x = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    int w = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0);
    bool wide = n->type.dtype == ALLOY_F64;
    put_geometry(&b, c);
    cg_put(&b, "        const long long ox = e %% OW_, oy = e / OW_ %% OH_, o = e / (OW_ * OH_) %% O_, bn = e / (OW_ * OH_ * O_);\n"
               "        T acc_ = 0;\n"
               "        for (long long ci = 0; ci < CG_; ci++)\n"
               "            for (long long ky = 0; ky < KH_; ky++) {\n"
               "                const long long iy = oy * SH_ - PH_ + ky * DH_;\n"
               "                if (iy < 0 || iy >= H_) continue;\n"
               "                for (long long kx = 0; kx < KW_; kx++) {\n"
               "                    const long long ix = ox * SW_ - PW_ + kx * DW_;\n"
               "                    if (ix < 0 || ix >= W_) continue;\n"
               "                    acc_ += ");
    load(&b, xt->dtype, x, "((bn * C_ + o / OG_ * CG_ + ci) * H_ + iy) * W_ + ix");
    cg_put(&b, " * ");
    load(&b, xt->dtype, w, "((o * CG_ + ci) * KH_ + ky) * KW_ + kx");
    cg_put(&b, ";\n                }\n            }\n");
    if (n->nin > 2) {
        cg_put(&b, "        acc_ += ");
        load(&b, xt->dtype, cg_param_of(&ps, CG_PARAM_NODE, n->in[2], false, 0), "o");
        cg_put(&b, ";\n");
    }
    cg_put(&b, "        p%d[e] = ", out);
    if (product) cg_put(&b, "acc_");
    else cg_store(&b, n->type.dtype, wide, "acc_");
    cg_put(&b, ";\n");
    return kernel_of(prog, g, k, product ? STEP_KIND_GEMM : STEP_KIND_OP, name, wide ? "double" : "float", &b, &ps,
                     ir_numel(&n->type));
}

/* conv_grad_input: dx[b, c, iy, ix] = the sum of dy w over the outputs and
 * kernel taps that read x there; conv_grad_weight: dw[o, ci, ky, kx] = the
 * sum over the batch and outputs of dy x. */
static const char *conv_grad(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const ir_conv_geom *c, const char *name)
{
    cg_params ps = {0};
    cg_text b = {0};
    bool input = n->op == IR_OP_conv_grad_input, wide = n->type.dtype == ALLOY_F64;
    alloy_dtype dt = g->nodes[n->in[0]]->type.dtype;
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0), a = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    int d = cg_param_of(&ps, CG_PARAM_NODE, n->in[1], false, 0); /* (dy, w) or (x, dy) */
    put_geometry(&b, c);
    if (input) {
        cg_put(&b, "        const long long ix = e %% W_, iy = e / W_ %% H_, ch = e / (W_ * H_) %% C_, bn = e / (W_ * H_ * C_);\n"
                   "        const long long gi = ch / CG_, ci = ch %% CG_;\n        T acc_ = 0;\n"
                   "        for (long long og = 0; og < OG_; og++)\n"
                   "            for (long long ky = 0; ky < KH_; ky++) {\n"
                   "                const long long ty = iy + PH_ - ky * DH_;\n"
                   "                if (ty < 0 || ty %% SH_ != 0 || ty / SH_ >= OH_) continue;\n"
                   "                for (long long kx = 0; kx < KW_; kx++) {\n"
                   "                    const long long tx = ix + PW_ - kx * DW_;\n"
                   "                    if (tx < 0 || tx %% SW_ != 0 || tx / SW_ >= OW_) continue;\n"
                   "                    const long long o = gi * OG_ + og;\n"
                   "                    acc_ += ");
        load(&b, dt, a, "((bn * O_ + o) * OH_ + ty / SH_) * OW_ + tx / SW_");
        cg_put(&b, " * ");
        load(&b, dt, d, "((o * CG_ + ci) * KH_ + ky) * KW_ + kx");
    } else {
        cg_put(&b, "        const long long kx = e %% KW_, ky = e / KW_ %% KH_, ci = e / (KW_ * KH_) %% CG_, o = e / (KW_ * KH_ * CG_);\n"
                   "        T acc_ = 0;\n"
                   "        for (long long bn = 0; bn < N_; bn++)\n"
                   "            for (long long oy = 0; oy < OH_; oy++) {\n"
                   "                const long long iy = oy * SH_ - PH_ + ky * DH_;\n"
                   "                if (iy < 0 || iy >= H_) continue;\n"
                   "                for (long long ox = 0; ox < OW_; ox++) {\n"
                   "                    const long long ix = ox * SW_ - PW_ + kx * DW_;\n"
                   "                    if (ix < 0 || ix >= W_) continue;\n"
                   "                    acc_ += ");
        load(&b, dt, d, "((bn * O_ + o) * OH_ + oy) * OW_ + ox");
        cg_put(&b, " * ");
        load(&b, dt, a, "((bn * C_ + o / OG_ * CG_ + ci) * H_ + iy) * W_ + ix");
    }
    cg_put(&b, ";\n                }\n            }\n        p%d[e] = ", out);
    cg_store(&b, n->type.dtype, wide, "acc_");
    cg_put(&b, ";\n");
    return kernel(prog, g, k, name, wide ? "double" : "float", &b, &ps, ir_numel(&n->type));
}

/* Declares the window of output (oy, ox) clipped to the input: rows
 * [y0, y1), columns [x0, x1), and cnt_, the divisor of an average (as
 * cpu_pool.c's window()). */
static void put_window(cg_text *b, const ir_node *n, const char *oy, const char *ox)
{
    if (n->op == IR_OP_adaptive_avg_pool2d || n->op == IR_OP_adaptive_avg_pool2d_grad) {
        cg_put(b, "            const long long y0 = %s * H_ / OH_, y1 = ((%s + 1) * H_ + OH_ - 1) / OH_;\n"
                  "            const long long x0 = %s * W_ / OW_, x1 = ((%s + 1) * W_ + OW_ - 1) / OW_;\n"
                  "            const double cnt_ = (double)((y1 - y0) * (x1 - x0));\n",
               oy, oy, ox, ox);
        return;
    }
    bool include = ir_attr_schema(n->op, "count_include_pad") && ir_attr_i(n, "count_include_pad");
    cg_put(b, "            const long long ys_ = %s * SH_ - PH_, xs_ = %s * SW_ - PW_;\n"
              "            const long long y0 = ys_ < 0 ? 0 : ys_, y1 = ys_ + KH_ > H_ ? H_ : ys_ + KH_;\n"
              "            const long long x0 = xs_ < 0 ? 0 : xs_, x1 = xs_ + KW_ > W_ ? W_ : xs_ + KW_;\n"
              "            const double cnt_ = %s;\n            (void)cnt_;\n",
           oy, ox, include ? "(double)(KH_ * KW_)" : "(double)((y1 - y0) * (x1 - x0))");
}

/* Declares best_, the plane offset of the first maximum of the window (a NaN wins). */
static void put_argmax(cg_text *b, alloy_dtype dt, int x)
{
    cg_put(b, "            long long best_ = -1;\n            double m_ = 0;\n"
              "            for (long long yy = y0; yy < y1; yy++)\n"
              "                for (long long xx = x0; xx < x1; xx++) {\n"
              "                    const double v_ = ");
    load(b, dt, x, "pl_ + yy * W_ + xx");
    cg_put(b, ";\n                    if (best_ < 0 || (m_ == m_ && (v_ > m_ || v_ != v_))) { m_ = v_; best_ = yy * W_ + xx; }\n"
              "                }\n");
}

/* The pools: a thread per output, in double over the clipped window in the CPU's order. */
static const char *pool(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const ir_conv_geom *c, const char *name)
{
    cg_params ps = {0};
    cg_text b = {0};
    alloy_dtype dt = g->nodes[n->in[0]]->type.dtype;
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0), x = cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0);
    put_geometry(&b, c);
    cg_put(&b, "        const long long ox = e %% OW_, oy = e / OW_ %% OH_, pl_ = e / (OW_ * OH_) * H_ * W_;\n        double r_;\n        {\n");
    put_window(&b, n, "oy", "ox");
    if (n->op == IR_OP_max_pool2d) {
        put_argmax(&b, dt, x);
        cg_put(&b, "            r_ = m_;\n");
    } else {
        cg_put(&b, "            double s_ = 0;\n            for (long long yy = y0; yy < y1; yy++)\n"
                   "                for (long long xx = x0; xx < x1; xx++) s_ += ");
        load(&b, dt, x, "pl_ + yy * W_ + xx");
        cg_put(&b, ";\n            r_ = s_ / cnt_;\n");
    }
    cg_put(&b, "        }\n        p%d[e] = ", out);
    cg_store(&b, n->type.dtype, true, "r_");
    cg_put(&b, ";\n");
    return kernel(prog, g, k, name, "double", &b, &ps, ir_numel(&n->type));
}

/* The pools' gradients: a thread per dx element gathers, in ascending
 * output order as the CPU scatters, dy (max: where the window's first
 * maximum is this element) or dy / the divisor, in double. */
static const char *pool_grad(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const ir_conv_geom *c, const char *name)
{
    cg_params ps = {0};
    cg_text b = {0};
    bool max = n->op == IR_OP_max_pool2d_grad, adaptive = n->op == IR_OP_adaptive_avg_pool2d_grad;
    int out = cg_param_of(&ps, CG_PARAM_NODE, n->id, true, 0), x = max ? cg_param_of(&ps, CG_PARAM_NODE, n->in[0], false, 0) : -1;
    int dy = cg_param_of(&ps, CG_PARAM_NODE, n->in[max ? 1 : 0], false, 0);
    alloy_dtype dt = g->nodes[n->in[0]]->type.dtype;
    put_geometry(&b, c);
    cg_put(&b, "        const long long ix = e %% W_, iy = e / W_ %% H_, pn_ = e / (W_ * H_), pl_ = pn_ * H_ * W_;\n        double acc_ = 0;\n");
    if (adaptive)
        cg_put(&b, "        const long long oy0 = 0, oy1 = OH_ - 1, ox0 = 0, ox1 = OW_ - 1;\n");
    else /* the outputs whose windows hold (iy, ix) */
        cg_put(&b, "        const long long ay_ = iy + PH_ - KH_ + 1, ax_ = ix + PW_ - KW_ + 1;\n"
                   "        const long long oy0 = ay_ <= 0 ? 0 : (ay_ + SH_ - 1) / SH_, ox0 = ax_ <= 0 ? 0 : (ax_ + SW_ - 1) / SW_;\n"
                   "        const long long oy1 = (iy + PH_) / SH_ < OH_ - 1 ? (iy + PH_) / SH_ : OH_ - 1;\n"
                   "        const long long ox1 = (ix + PW_) / SW_ < OW_ - 1 ? (ix + PW_) / SW_ : OW_ - 1;\n");
    cg_put(&b, "        for (long long oy = oy0; oy <= oy1; oy++)\n          for (long long ox = ox0; ox <= ox1; ox++) {\n");
    put_window(&b, n, "oy", "ox");
    cg_put(&b, "            if (iy < y0 || iy >= y1 || ix < x0 || ix >= x1) continue;\n");
    if (max) put_argmax(&b, dt, x);
    cg_put(&b, "            %sacc_ += ", max ? "if (best_ == iy * W_ + ix) " : "");
    load(&b, g->nodes[n->in[max ? 1 : 0]]->type.dtype, dy, "(pn_ * OH_ + oy) * OW_ + ox");
    cg_put(&b, "%s;\n          }\n        p%d[e] = ", max ? "" : " / cnt_", out);
    cg_store(&b, n->type.dtype, true, "acc_");
    cg_put(&b, ";\n");
    return kernel(prog, g, k, name, "double", &b, &ps, ir_numel(&n->type));
}

/* The geometry of conv/pool node n, false when it does not check (conv.h's
 * contract: the type rule checked it, so this is for hand-made IR). */
static bool geometry_of(const ir_graph *g, const ir_node *n, ir_conv_geom *c)
{
    char why[256];
    const ir_type *x = n->op == IR_OP_conv_grad_input || n->op == IR_OP_avg_pool2d_grad || n->op == IR_OP_adaptive_avg_pool2d_grad
                           ? &n->type
                           : &g->nodes[n->in[0]]->type;
    const ir_type *w = n->op == IR_OP_conv1d || n->op == IR_OP_conv2d || n->op == IR_OP_conv_grad_input ? &g->nodes[n->in[1]]->type
                       : n->op == IR_OP_conv_grad_weight                                              ? &n->type
                                                                                                      : NULL;
    return ir_conv_geom_of(n, x, w, c, why, sizeof why) == ALLOY_OK;
}

const char *cg_emit_conv_product(cg_program *prog, const ir_graph *g, int k, const ir_node *n)
{
    ir_conv_geom c;
    char name[48];
    if (!geometry_of(g, n, &c)) return "a convolution whose geometry does not check";
    if (n->type.dtype == ALLOY_F64) return "an f64 convolution as a gemm head"; /* the fuse pass never makes one */
    al_fmt(name, sizeof name, "alloy_s%d_%s", k, ir_ops[n->op].name);
    return conv(prog, g, k, n, &c, name, true);
}

/* The kernel of conv/pool step n, or why none. */
const char *cg_emit_conv(cg_program *prog, const ir_graph *g, int k, const ir_node *n, const char *name)
{
    ir_conv_geom c;
    if (!geometry_of(g, n, &c)) return "a convolution or pool whose geometry does not check";
    switch (n->op) {
    case IR_OP_conv1d:
    case IR_OP_conv2d: return conv(prog, g, k, n, &c, name, false);
    case IR_OP_conv_grad_input:
    case IR_OP_conv_grad_weight: return conv_grad(prog, g, k, n, &c, name);
    case IR_OP_max_pool2d:
    case IR_OP_avg_pool2d:
    case IR_OP_adaptive_avg_pool2d: return pool(prog, g, k, n, &c, name);
    default: return pool_grad(prog, g, k, n, &c, name);
    }
}
