/* bundle_cuda.c - a bundle's CUDA executable at load: which image (cubin or PTX) a GPU runs, and the error naming the bundle's architectures when none fits. No NVRTC: liballoy-runtime has it. */
#include <stdio.h>
#include <string.h>

#include "runtime/bundle/bundle.h"

/* Appends the targets of kind of x (one entry per target, module 0's) to
 * out at *at as "sm_80, sm_90" with prefix; returns how many. */
static int list_kind(const bundle_cuda *x, uint32_t kind, const char *prefix, char *out, size_t len, size_t *at)
{
    int n = 0;
    for (int i = 0; i < x->nimages; i++) {
        const bundle_image *im = &x->images[i];
        if (im->module != 0 || im->kind != kind) continue;
        if (*at < len) *at += (size_t)snprintf(out + *at, len - *at, "%s%s%u", n ? ", " : "", prefix, im->arch);
        n++;
    }
    return n;
}

void bundle_cuda_targets(const bundle_cuda *x, char *out, size_t len)
{
    size_t at = 0;
    if (!len) return;
    out[0] = '\0';
    if (at < len) at += (size_t)snprintf(out + at, len - at, "cubins ");
    size_t mark = at;
    if (!list_kind(x, BUNDLE_CUBIN, "sm_", out, len, &at)) at = mark, at += (size_t)snprintf(out + at, len - at, "none");
    if (at < len) at += (size_t)snprintf(out + at, len - at, "; PTX ");
    mark = at;
    if (at < len && !list_kind(x, BUNDLE_PTX, "compute_", out, len, &at) && at < len)
        at = mark + (size_t)snprintf(out + mark, len - mark, "none");
    if (at < len && bundle_cuda_image_of_kind(x, 0, BUNDLE_HOST))
        snprintf(out + at, len - at, "; host images (the tests' emulated device)");
}

alloy_status bundle_cuda_pick(const bundle_cuda *x, uint32_t module, int sm, int driver, const bundle_image **out,
                              char *why, size_t whylen)
{
    *out = NULL;
    const bundle_image *cubin = NULL, *ptx = NULL;
    for (int i = 0; i < x->nimages; i++) {
        const bundle_image *im = &x->images[i];
        if (im->module != module || im->arch > (uint32_t)sm) continue;
        if (im->kind == BUNDLE_CUBIN && im->arch / 10 == (uint32_t)sm / 10 && (!cubin || im->arch > cubin->arch))
            cubin = im;
        if (im->kind == BUNDLE_PTX && (!ptx || im->arch > ptx->arch)) ptx = im;
    }
    if (cubin) *out = cubin;
    else if (ptx && driver >= (int)x->min_driver) *out = ptx;
    if (*out) return ALLOY_OK;
    char targets[512];
    bundle_cuda_targets(x, targets, sizeof targets);
    if (!x->nimages)
        al_fmt(why, whylen, "the bundle has no CUDA executable (saved without archs): it runs on the CPU only");
    else if (ptx)
        al_fmt(why, whylen,
               "the GPU is sm_%d and the bundle has %s: the PTX needs CUDA driver %u.%u or newer, this driver is "
               "%d.%d", sm, targets, x->min_driver / 1000, x->min_driver % 1000 / 10, driver / 1000,
               driver % 1000 / 10);
    else
        al_fmt(why, whylen, "the GPU is sm_%d and the bundle has %s: none runs on it (save the bundle with --arch "
               "sm_%d)", sm, targets, sm);
    return ALLOY_ERR_UNSUPPORTED;
}

const bundle_image *bundle_cuda_image_of_kind(const bundle_cuda *x, uint32_t module, uint32_t kind)
{
    for (int i = 0; i < x->nimages; i++)
        if (x->images[i].module == module && x->images[i].kind == kind) return &x->images[i];
    return NULL;
}

void bundle_cuda_free(bundle_cuda *x)
{
    for (int i = 0; i < x->nimages; i++) al_free(x->images[i].data);
    al_free(x->images);
    /* the kernel table's own free: cg_program_free is the emitter's, which liballoy-runtime has not */
    for (int q = 0; q < x->prog.nkernels; q++) al_free(x->prog.kernels[q].source), al_free(x->prog.kernels[q].params);
    for (int i = 0; i < x->prog.nskipped; i++) al_free((char *)x->prog.why[i]);
    al_free(x->prog.kernels), al_free(x->prog.skipped), al_free(x->prog.why), al_free(x->module_of);
    memset(x, 0, sizeof *x);
}
