/* emit_chain.c - one launch for a run of one-block kernels of consecutive steps (the scalar tail: the loss scaler's and clipping's bookkeeping, constants, casts): each kernel's text kept as a device function, called in order by one kernel. */
#include <stdlib.h>
#include <string.h>

#include "codegen/emit_impl.h"

/* The most kernels one chain takes, and the most parameters (a bundle's
 * kernel has at most 256). */
enum { CHAIN_MAX_KERNELS = 24, CHAIN_MAX_PARAMS = 256 };

static const char global_head[] = "extern \"C\" __global__ void __launch_bounds__(";

/* Where kernel kn's own text starts: after the preamble and the blank line
 * the emitter puts before each kernel. */
static const char *kernel_text(const cg_kernel *kn)
{
    const char *text = kn->source + kn->body;
    while (*text == '\n') text++;
    return text;
}

/* Whether kernel q of p may join a chain: one block, only node buffers as
 * parameters (a step's aux slots, flags and partials, are reused by the
 * next step), the whole source of one plain kernel (the preamble, then the
 * kernel with nothing at file scope before it), the only kernel of its
 * step, and a step of one op or an elementwise step whose values are
 * scalars (one element each); and no `return` in its text. */
static bool chainable(const cg_program *p, const ir_graph *g, const schedule *s, int q)
{
    const cg_kernel *kn = &p->kernels[q];
    if (kn->grid != 1 || kn->check || kn->body == 0) return false;
    if ((q > 0 && p->kernels[q - 1].step == kn->step) || (q + 1 < p->nkernels && p->kernels[q + 1].step == kn->step))
        return false;
    const sched_step *st = &s->steps[kn->step];
    if (st->kind != STEP_KIND_OP && st->kind != STEP_KIND_EW) return false;
    for (int m = st->first; m < st->first + st->n; m++)
        if (ir_numel(&g->nodes[s->members[m].node]->type) > 1) return false; /* scalar work only */
    for (int i = 0; i < kn->nparams; i++)
        if (kn->params[i].kind != CG_PARAM_NODE) return false;
    const char *text = kernel_text(kn), *end = strstr(text, "#ifdef ALLOY_HOST_EMULATION");
    if (strncmp(text, global_head, sizeof global_head - 1) != 0 || !end) return false;
    /* a thread leaving one function early would wait at the barrier after it
     * while the others wait at one inside: kernels with a return stay alone */
    const char *ret = strstr(text, "return");
    return !ret || ret > end;
}

/* Whether the steps strictly between steps a and b launch nothing: each is
 * a view (a reshape or slice the plan aliases), so the two kernels are
 * neighbours in the launch plan too. */
static bool adjacent_steps(const schedule *s, int a, int b)
{
    for (int k = a + 1; k < b; k++) {
        const sched_step *st = &s->steps[k];
        if (st->kind != STEP_KIND_OP || !(s->members[st->first].flags & MEMBER_VIEW)) return false;
    }
    return true;
}

/* Appends kernel kn's text as a device function of its own name: the
 * `extern "C" __global__ ... __launch_bounds__(B)` head becomes `static
 * __device__`, the host emulation's entry is left out. */
static void put_device_function(cg_text *t, const cg_kernel *kn)
{
    const char *text = kernel_text(kn) + sizeof global_head - 1;
    const char *after = strchr(text, ')'); /* the launch bound's closing parenthesis */
    if (after)
        for (after++; *after == ' ';) after++;
    char host[80];
    al_fmt(host, sizeof host, "#ifdef ALLOY_HOST_EMULATION\nextern \"C\" void %s__host(", kn->name);
    const char *end = strstr(text, host);
    if (!after || !end) { /* chainable() saw the head; the emitter always ends a kernel so */
        t->oom = true;
        return;
    }
    cg_put(t, "static __device__ __forceinline__ void %.*s\n", (int)(end - after), after);
}

/* The merged kernel of p's kernels [first, first + n), appended to out. */
static bool merge(cg_program *out, const cg_program *p, const ir_graph *g, int first, int n)
{
    cg_params ps = {0};
    cg_text t = {0};
    cg_put_preamble(&t);
    int64_t bytes = 0;
    for (int q = first; q < first + n; q++) {
        const cg_kernel *kn = &p->kernels[q];
        put_device_function(&t, kn);
        bytes += kn->bytes;
        for (int i = 0; i < kn->nparams; i++) cg_param_of(&ps, CG_PARAM_NODE, kn->params[i].node, kn->params[i].written, 0);
    }
    const cg_kernel *head = &p->kernels[first];
    char name[48];
    al_fmt(name, sizeof name, "alloy_s%d_chain%d", head->step, n);
    /* no __restrict__ here: two values may share an arena slot at different
     * times, and each function's own parameters keep theirs */
    cg_put(&t, "extern \"C\" __global__ void __launch_bounds__(%u) %s(", head->block, name);
    for (int i = 0; i < ps.n; i++)
        cg_put(&t, "%s%s%s *p%d", i ? ", " : "", ps.at[i].written ? "" : "const ",
               cg_storage(g->nodes[ps.at[i].node]->type.dtype), i);
    cg_put(&t, ")\n{\n");
    for (int q = first; q < first + n; q++) {
        const cg_kernel *kn = &p->kernels[q];
        /* a barrier between two functions: what one thread stored, another may load next */
        cg_put(&t, "%s    %s(", q > first ? "    __syncthreads();\n" : "", kn->name);
        for (int i = 0; i < kn->nparams; i++)
            cg_put(&t, "%sp%d", i ? ", " : "", cg_param_of(&ps, CG_PARAM_NODE, kn->params[i].node, false, 0));
        cg_put(&t, ");\n");
    }
    cg_put(&t, "}\n");
    /* cg_add_kernel's host entry casts with the parameters' own types */
    if (!cg_add_kernel(out, g, name, head->step, head->kind, &t, &ps, 1, head->block, bytes)) {
        cg_text_free(&t);
        al_free(ps.at);
        return false;
    }
    return true;
}

static bool keep(cg_program *out, cg_kernel *kn)
{
    if (out->nkernels == out->cap) {
        int cap = out->cap ? out->cap * 2 : 32;
        cg_kernel *k = al_realloc(out->kernels, sizeof *k * (size_t)cap);
        if (!k) return false;
        out->kernels = k, out->cap = cap;
    }
    out->kernels[out->nkernels++] = *kn;
    memset(kn, 0, sizeof *kn);
    return true;
}

/* How many parameters kernels [first, first + n) of p have together, each node once. */
static int distinct_params(const cg_program *p, int first, int n)
{
    int count = 0;
    for (int q = first; q < first + n; q++)
        for (int i = 0; i < p->kernels[q].nparams; i++) {
            bool seen = false;
            for (int r = first; r <= q && !seen; r++)
                for (int j = 0; j < (r == q ? i : p->kernels[r].nparams) && !seen; j++)
                    seen = p->kernels[r].params[j].node == p->kernels[q].params[i].node;
            count += !seen;
        }
    return count;
}

alloy_status cg_chain_kernels(cg_program *p, const ir_graph *g, const schedule *s, char *err, size_t errlen)
{
    if (p->checks) return ALLOY_OK; /* check kernels follow their steps' kernels: left as they are */
    cg_program out = {0};
    bool ok = true;
    for (int q = 0; q < p->nkernels && ok;) {
        int n = 1;
        if (chainable(p, g, s, q))
            while (q + n < p->nkernels && n < CHAIN_MAX_KERNELS && chainable(p, g, s, q + n) &&
                   p->kernels[q + n].block == p->kernels[q].block &&
                   adjacent_steps(s, p->kernels[q + n - 1].step, p->kernels[q + n].step) &&
                   distinct_params(p, q, n + 1) <= CHAIN_MAX_PARAMS)
                n++;
        if (n == 1) {
            ok = keep(&out, &p->kernels[q]);
        } else {
            ok = merge(&out, p, g, q, n);
            for (int r = q; r < q + n; r++) al_free(p->kernels[r].source), al_free(p->kernels[r].params);
            memset(&p->kernels[q], 0, sizeof *p->kernels * (size_t)n);
        }
        q += n;
    }
    if (!ok) {
        for (int i = 0; i < out.nkernels; i++) al_free(out.kernels[i].source), al_free(out.kernels[i].params);
        al_free(out.kernels);
        al_fmt(err, errlen, "out of memory joining one-block kernels");
        return ALLOY_ERR_OOM;
    }
    al_free(p->kernels);
    p->kernels = out.kernels, p->nkernels = out.nkernels, p->cap = out.cap;
    return ALLOY_OK;
}

int cg_chain_steps(const cg_kernel *kn)
{
    const char *at = strstr(kn->name, "_chain");
    int n = at ? atoi(at + 6) : 0;
    return n > 0 ? n : 1;
}
