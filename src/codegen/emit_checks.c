/* emit_checks.c - amp_check and amp_stats in the generated kernels: the statements an epilogue adds for a value it holds, and a step's check kernel for the values no epilogue holds (row op, op kernel and lone library GEMM results). */
#include "codegen/emit_impl.h"
#include "ir/groups.h"

/* The smallest |x| that rounds to inf when an f32 is stored as dt, spelled
 * as the CPU's check (cpu_nonfinite_bits_f32) has it. */
static const char *inf_limit(alloy_dtype dt)
{
    return dt == ALLOY_F16 ? "65520.0f" : dt == ALLOY_BF16 ? "0x1.ff8p127f" : "__uint_as_float(0x7f800000u)";
}

/* The word of node id in the checks parameter. */
static void put_word(cg_text *t, cg_params *ps, int id)
{
    int k = cg_param_of(ps, CG_PARAM_CHECKS, -1, true, 0);
    cg_put(t, "p%d + %lldll", k, (long long)id * CG_CHECK_WORDS);
}

bool cg_put_range(cg_text *t, cg_params *ps, const ir_graph *g, const ir_node *x, unsigned checks, bool wide,
                  const char *v)
{
    alloy_dtype dt = x->type.dtype;
    if (!(checks & CG_CHECK_RANGE) || (dt != ALLOY_F16 && dt != ALLOY_BF16) || !ir_amp_checked(g, x)) return false;
    /* the smallest normal's f32 bits: 2^-14, 2^-126 */
    unsigned normal = dt == ALLOY_F16 ? 0x38800000u : 0x00800000u;
    cg_put(t, "        { unsigned int *w_ = ");
    put_word(t, ps, x->id);
    if (!wide) {
        /* |x| as its bits (ordered as the magnitude is); the max by an atomic
         * only where this value is above the one already there */
        cg_put(t, "; const unsigned int a_ = __float_as_uint((float)(%s)) & 0x7fffffffu;\n"
                  "          if (a_ > 0x7f800000u) atomicOr(w_, %uu);\n"
                  "          else { if (a_ > *(volatile unsigned int *)(w_ + 1)) atomicMax(w_ + 1, a_);\n"
                  "                 if (a_ - 1u < 0x%08xu - 1u) atomicAdd((unsigned long long *)(w_ + 2), 1ull); } }\n",
               v, (unsigned)CG_RANGE_NAN, normal);
    } else {
        /* the f32 that holds |x|, rounded up (cpu_range_add_f64) */
        cg_put(t, "; const double a_ = fabs((double)(%s));\n"
                  "          if (a_ != a_) atomicOr(w_, %uu);\n"
                  "          else { const float m_ = (float)a_; const unsigned int b_ = __float_as_uint(m_) + ((double)m_ < a_ ? 1u : 0u);\n"
                  "                 if (b_ > *(volatile unsigned int *)(w_ + 1)) atomicMax(w_ + 1, b_);\n"
                  "                 if (a_ > 0.0 && a_ < (double)__uint_as_float(0x%08xu)) atomicAdd((unsigned long long *)(w_ + 2), 1ull); } }\n",
               v, (unsigned)CG_RANGE_NAN, normal);
    }
    return true;
}

bool cg_put_flag(cg_text *t, cg_params *ps, const ir_graph *g, const ir_node *x, unsigned checks, bool wide,
                 const char *v)
{
    alloy_dtype dt = x->type.dtype;
    if (!(checks & CG_CHECK_FINITE) || !ir_amp_checked(g, x)) return false;
    cg_put(t, "        { unsigned int *w_ = ");
    put_word(t, ps, x->id);
    if (!wide) { /* against the magnitude that rounds to inf in dt */
        cg_put(t, "; const float a_ = fabsf((float)(%s));\n"
                  "          if (a_ != a_) atomicOr(w_, %uu); else if (a_ >= %s) atomicOr(w_, %uu); }\n",
               v, (unsigned)NONFINITE_NAN, inf_limit(dt), (unsigned)NONFINITE_INF);
        return true;
    }
    /* a double: as dt stores it (an f64 as it is) */
    if (dt == ALLOY_F64) {
        cg_put(t, "; const double a_ = fabs((double)(%s));\n", v);
    } else {
        cg_put(t, "; %s r_ = ", cg_storage(dt));
        cg_store(t, dt, true, v);
        cg_put(t, "; const double a_ = fabs((double)");
        cg_load(t, dt, "(&r_)", "0");
        cg_put(t, ");\n");
    }
    cg_put(t, "          if (a_ != a_) atomicOr(w_, %uu); else if (isinf(a_)) atomicOr(w_, %uu); }\n",
           (unsigned)NONFINITE_NAN, (unsigned)NONFINITE_INF);
    return true;
}

/* Whether member m of step k is one the step's check kernel reads (for
 * checks): a stored checked value that no chunk loop holds (the CPU's check after a step,
 * cpu.c): an op step's values, a row or gemm step's row op results. A gemm
 * step's product is checked by its epilogue. */
static bool checked_after(const ir_graph *g, const schedule *s, unsigned checks, int k, int m)
{
    const sched_step *st = &s->steps[k];
    const ir_node *n = g->nodes[s->members[m].node];
    alloy_dtype dt = n->type.dtype;
    bool wanted = (checks & CG_CHECK_FINITE) || ((checks & CG_CHECK_RANGE) && (dt == ALLOY_F16 || dt == ALLOY_BF16));
    if (!wanted || !(s->members[m].flags & MEMBER_STORED) || !ir_amp_checked(g, n) || !ir_nbytes(&n->type)) return false;
    if (st->kind != STEP_KIND_OP && ir_fuse_elementwise(g, n)) return false;
    return !(st->kind == STEP_KIND_GEMM && m == st->first);
}

const char *cg_emit_check_kernel(cg_program *prog, const ir_graph *g, const schedule *s, int k)
{
    const sched_step *st = &s->steps[k];
    cg_params ps = {0};
    cg_text body = {0};
    int64_t total = 0;
    bool any_wide = false; /* an f64 value: loaded as T = double */
    for (int m = st->first; m < st->first + st->n; m++)
        any_wide |= checked_after(g, s, prog->checks, k, m) && g->nodes[s->members[m].node]->type.dtype == ALLOY_F64;
    for (int m = st->first; m < st->first + st->n; m++) {
        if (!checked_after(g, s, prog->checks, k, m)) continue;
        const ir_node *n = g->nodes[s->members[m].node];
        int64_t count = ir_numel(&n->type);
        bool wide = n->type.dtype == ALLOY_F64;
        int p = cg_param_of(&ps, CG_PARAM_NODE, n->id, false, 0);
        cg_put(&body, "        if (e < %lldll) {\n        const %s v_ = (%s)", (long long)count, wide ? "double" : "float",
               wide ? "double" : "float");
        char pk[16];
        al_fmt(pk, sizeof pk, "p%d", p);
        char idx[160];
        cg_value_index(g, s, n->id, "e", idx, sizeof idx);
        cg_load(&body, n->type.dtype, pk, idx);
        cg_put(&body, ";\n");
        uint8_t done = 0;
        if (cg_put_range(&body, &ps, g, n, prog->checks, wide, "v_")) done |= CG_CHECK_RANGE;
        if (cg_put_flag(&body, &ps, g, n, prog->checks, wide, "v_")) done |= CG_CHECK_FINITE;
        cg_put(&body, "        }\n");
        prog->covered[n->id] |= done;
        if (count > total) total = count;
    }
    const char *why = NULL;
    if (total > 0) {
        char name[48];
        al_fmt(name, sizeof name, "alloy_s%d_check", k);
        if (!cg_op_kernel(prog, g, k, name, any_wide ? "double" : "float", &body, &ps, total, NULL, NULL)) why = "out of memory";
        else prog->kernels[prog->nkernels - 1].check = true;
    } else if (body.oom || ps.oom) {
        why = "out of memory";
    }
    cg_text_free(&body);
    al_free(ps.at);
    return why;
}
