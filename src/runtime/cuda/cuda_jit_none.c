/* cuda_jit_none.c - cuda_jit.h in liballoy-runtime: no emitter and no compiler, so the CUDA backend runs only a bundle's kernel table and images (cuda_jit.c is the full library's). */
#include "runtime/cuda/cuda_jit.h"

alloy_status cuda_jit_make_kernels(rt_backend *b, const ir_graph *g, const schedule *s, cg_program *out)
{
    (void)s, (void)out;
    return rt_fail(b, ALLOY_ERR_UNSUPPORTED,
                   "cuda: graph '%s': liballoy-runtime runs a bundle's CUDA images only and this step has none (the "
                   "bundle was saved without --arch, or a run fetches a value the bundle's schedule does not keep: "
                   "a named node that no output is, or a gradient of a bundle saved before bundles kept every "
                   "output); "
                   "save it with --arch, or link liballoy to compile kernels", g->name);
}

alloy_status cuda_jit_load(rt_backend *b, cdev *dev, cg_program *prog, cdev_module ***modules, int *nmodules,
                           cdev_function **fn)
{
    (void)dev, (void)prog, (void)modules, (void)nmodules, (void)fn;
    return rt_fail(b, ALLOY_ERR_UNSUPPORTED, "cuda: liballoy-runtime compiles no kernels");
}

void cuda_jit_free(cg_program *prog) { (void)prog; /* cuda_jit_make_kernels never fills one here */ }
