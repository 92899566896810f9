/* bundle_read_cuda.c - reading a bundle's CUDA sections: the executable's images and the kernel table. */
#include <inttypes.h>
#include <limits.h>
#include <string.h>

#include "runtime/bundle/bundle_read.h"

/* CUDA_EXEC: min_driver, nmodules, nimages (i32s), then per image kind,
 * arch, module, a reserved word (u32s), its length (u64) and bytes; the
 * images in module order, every module with module 0's targets, none twice;
 * a cubin an ELF file, PTX text ending in its one NUL. */
bool bundle_read_cuda(bundle_rd *r, bundle_cuda *x)
{
    x->min_driver = (uint32_t)bundle_rd_int(r, "min_driver", 1000, 1000000);
    x->nmodules = (uint32_t)bundle_rd_int(r, "nmodules", 1, 1 << 20);
    int n = bundle_rd_count(r, "nimages", 24);
    if (!r->bad && (n == 0 || (uint32_t)n % x->nmodules != 0))
        return bundle_rd_fail(r, "%s = %" PRId64 " is not a positive multiple of nmodules", "nimages", n);
    if (r->bad) return false;
    if (!(x->images = al_calloc((size_t)n, sizeof *x->images))) return bundle_rd_oom(r, "images", n);
    int per = n / (int)x->nmodules;
    for (int i = 0; i < n && !r->bad; i++) {
        bundle_image *im = &x->images[i];
        im->kind = (uint32_t)bundle_rd_int(r, "image kind", BUNDLE_CUBIN, BUNDLE_HOST);
        im->arch = im->kind == BUNDLE_HOST ? (uint32_t)bundle_rd_int(r, "host image arch", 0, 0)
                                           : (uint32_t)bundle_rd_int(r, "image arch", 10, 9999);
        im->module = (uint32_t)bundle_rd_int(r, "image module (images go in module order)", i / per, i / per);
        if (bundle_rd_u32(r, "image reserved word") != 0 && !r->bad)
            return bundle_rd_fail(r, "%s %" PRId64 ": reserved word not 0", "image", i);
        uint64_t size = bundle_rd_u64(r, "image length");
        if (!r->bad && (size == 0 || size > r->len - r->pos))
            return bundle_rd_fail(r, "%s %" PRId64 ": length 0 or past the end of the section", "image", i);
        if (r->bad) return false;
        const uint8_t *p = r->p + r->pos;
        if (im->kind != BUNDLE_PTX && (size < 4 || memcmp(p, "\177ELF", 4) != 0))
            return bundle_rd_fail(r, im->kind == BUNDLE_CUBIN ? "%s %" PRId64 ": a cubin that is not an ELF file"
                                                              : "%s %" PRId64 ": a host image that is not an ELF file",
                           "image", i);
        if (im->kind == BUNDLE_PTX && memchr(p, 0, (size_t)size) != p + size - 1)
            return bundle_rd_fail(r, "%s %" PRId64 ": PTX that is not text ending in one NUL", "image", i);
        const bundle_image *first = &x->images[i % per];
        if (i >= per && (im->kind != first->kind || im->arch != first->arch))
            return bundle_rd_fail(r, "%s %" PRId64 ": its module's targets are not module 0's", "image", i);
        for (int j = 0; j < i && i < per; j++)
            if (x->images[j].kind == im->kind && x->images[j].arch == im->arch)
                return bundle_rd_fail(r, "%s %" PRId64 ": a target repeated", "image", i);
        if (!(im->data = al_malloc((size_t)size))) return bundle_rd_oom(r, "image bytes", (int64_t)size);
        memcpy(im->data, p, (size_t)size);
        im->size = (size_t)size;
        x->nimages = i + 1;
        r->pos += (size_t)size;
    }
    return bundle_rd_done(r);
}

static bool is_ident_char(uint8_t ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

/* A length-prefixed text of 1 to max bytes with no NUL (ident: letters,
 * digits, '_' only) into out (out_len > max). */
static bool rd_text(bundle_rd *r, const char *what, size_t max, bool ident, char *out)
{
    uint32_t n = bundle_rd_u32(r, what);
    if (!r->bad && (n == 0 || n > max))
        return bundle_rd_fail(r, "%s: length %" PRId64 " is 0 or too long", what, n);
    if (!bundle_rd_need(r, n, what)) return false;
    for (uint32_t i = 0; i < n; i++)
        if (!r->p[r->pos + i] || (ident && !is_ident_char(r->p[r->pos + i])))
            return bundle_rd_fail(r, "%s: byte %" PRId64 " is not allowed there", what, i);
    memcpy(out, r->p + r->pos, n);
    out[n] = '\0';
    r->pos += n;
    return true;
}

/* CUDA_KERNELS: nkernels, nskipped (i32s); per kernel its name (u32 length,
 * bytes), module (u32), step, step kind (i32s), grid, block (u32s), nparams
 * (i32) and per parameter kind (u32), node (i32), written (u32), count
 * (i64); per skipped step its index (i32) and why (u32 length, text). The
 * kernels go in step order and module order, every module of x holding at
 * least one; each kernel's step kind is its schedule step's. lp_build checks
 * the parameters' places against the plan at load. */
bool bundle_read_kernels(bundle_rd *r, const ir_graph *g, const schedule *s, bundle_cuda *x)
{
    cg_program *prog = &x->prog;
    int n = bundle_rd_count(r, "nkernels", 36);
    if (!r->bad && n < 1) return bundle_rd_fail(r, "%s = %" PRId64 ": a kernel table with no kernel", "nkernels", n);
    int nskipped = bundle_rd_count(r, "nskipped", 8);
    if (r->bad) return false;
    prog->kernels = al_calloc((size_t)n, sizeof *prog->kernels);
    x->module_of = al_calloc((size_t)n, sizeof *x->module_of);
    prog->skipped = al_calloc((size_t)nskipped + 1, sizeof *prog->skipped);
    prog->why = al_calloc((size_t)nskipped + 1, sizeof *prog->why);
    if (!prog->kernels || !x->module_of || !prog->skipped || !prog->why) return bundle_rd_oom(r, "kernels", n);
    x->has_kernels = true;
    for (int q = 0; q < n && !r->bad; q++) {
        cg_kernel *k = &prog->kernels[q];
        prog->nkernels = q + 1;
        if (!rd_text(r, "kernel name", sizeof k->name - 1, true, k->name)) return false;
        uint32_t prev = q ? x->module_of[q - 1] : 0;
        x->module_of[q] = (uint32_t)bundle_rd_int(r, "kernel module (in order, none empty)", q ? prev : 0,
                                                  q ? (int64_t)prev + 1 : 0);
        if (!r->bad && x->module_of[q] >= x->nmodules)
            return bundle_rd_fail(r, "%s %" PRId64 ": its module is past the executable's modules", "kernel", q);
        k->step = bundle_rd_int(r, "kernel step (in order)", q ? prog->kernels[q - 1].step : 0, s->nsteps - 1);
        k->kind = (step_kind)bundle_rd_int(r, "kernel step kind", STEP_KIND_OP, STEP_KIND_MULTI);
        if (!r->bad && k->kind != s->steps[k->step].kind)
            return bundle_rd_fail(r, "%s %" PRId64 ": its step kind is not its schedule step's", "kernel", q);
        k->grid = (unsigned)bundle_rd_int(r, "kernel grid", 1, INT_MAX);
        k->block = (unsigned)bundle_rd_int(r, "kernel block", 1, 1024);
        k->nparams = bundle_rd_count(r, "kernel nparams", 20);
        if (r->bad) return false;
        if (k->nparams > 256) return bundle_rd_fail(r, "%s = %" PRId64 " is over 256", "kernel nparams", k->nparams);
        if (!(k->params = al_calloc((size_t)k->nparams + 1, sizeof *k->params))) return bundle_rd_oom(r, "params", k->nparams);
        for (int i = 0; i < k->nparams && !r->bad; i++) {
            cg_param *pa = &k->params[i];
            pa->kind = (cg_param_kind)bundle_rd_int(r, "param kind", CG_PARAM_NODE, CG_PARAM_COUNTER);
            if (!r->bad && pa->kind == CG_PARAM_CHECKS) return bundle_rd_fail(r, "%s = %" PRId64 ": the run's check words, which no bundle carries", "param kind", (int64_t)pa->kind);
            pa->node = bundle_rd_int(r, "param node", 0, g->nnodes - 1);
            pa->written = bundle_rd_int(r, "param written", 0, 1) != 0;
            uint64_t count = bundle_rd_u64(r, "param count");
            if (!r->bad && count > (1ull << 40)) return bundle_rd_fail(r, "%s: %" PRId64 " elements, over 2^40", "param count", (int64_t)count);
            pa->count = (int64_t)count;
        }
    }
    if (!r->bad && x->module_of[n - 1] != x->nmodules - 1)
        return bundle_rd_fail(r, "%s: %" PRId64 " modules hold kernels, not the executable's count", "kernels",
                              (int64_t)x->module_of[n - 1] + 1);
    for (int i = 0; i < nskipped && !r->bad; i++) {
        char why[513];
        prog->skipped[i] = bundle_rd_int(r, "skipped step", 0, s->nsteps - 1);
        if (!rd_text(r, "skipped step's why", sizeof why - 1, false, why)) return false;
        if (!(prog->why[i] = al_strdup(why))) return bundle_rd_oom(r, "why", 1);
        prog->nskipped = i + 1;
    }
    return bundle_rd_done(r);
}
