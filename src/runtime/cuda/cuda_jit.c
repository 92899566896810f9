/* cuda_jit.c - the CUDA backend's compiler half in liballoy (cuda_jit.h): the step's kernels emitted now and compiled on the device through its load (NVRTC and the kernel cache on a GPU). */
#include "codegen/export.h"
#include "runtime/cuda/cuda_jit.h"
#include "step/launch_plan.h"

alloy_status cuda_jit_make_kernels(rt_backend *b, const ir_graph *g, const schedule *s, cg_program *out)
{
    char err[1024];
    unsigned checks = (b->cfg.amp_check ? CG_CHECK_FINITE : 0u) | (b->cfg.amp_stats ? CG_CHECK_RANGE : 0u) |
                      (b->cfg.cuda_gemm_f32 ? LP_WIDEN : 0u);
    alloy_status st = cg_emit_checked(g, s, checks, out, err, sizeof err);
    return st ? rt_fail(b, st, "cuda: emitting the kernels of graph '%s': %s", g->name, err) : ALLOY_OK;
}

alloy_status cuda_jit_load(rt_backend *b, cdev *dev, cg_program *prog, cdev_module ***modules, int *nmodules,
                           cdev_function **fn)
{
    if (!dev->ops->load)
        return rt_fail(b, ALLOY_ERR_UNSUPPORTED, "cuda: the device %s compiles no kernels", dev->name);
    int n = cg_module_count(prog->nkernels);
    *nmodules = n;
    *modules = al_calloc((size_t)n + 1, sizeof **modules);
    char **sources = al_calloc((size_t)n + 1, sizeof *sources), (*names)[32] = al_calloc((size_t)n + 1, 32);
    const char **src = al_calloc((size_t)n + 1, sizeof *src), **nm = al_calloc((size_t)n + 1, sizeof *nm);
    alloy_status st = *modules && sources && names && src && nm ? ALLOY_OK : ALLOY_ERR_OOM;
    for (int m = 0; !st && m < n; m++) {
        int first, count;
        cg_module_range(prog->nkernels, m, &first, &count);
        cg_module_name(m, names[m], 32);
        if (!(sources[m] = cg_module_source(prog, first, count))) st = ALLOY_ERR_OOM;
        src[m] = sources[m], nm[m] = names[m];
    }
    if (st) rt_fail(b, st, "cuda: out of memory gathering the kernels");
    else if ((st = dev->ops->load(dev, n, nm, src, *modules)))
        rt_fail(b, st, "cuda: loading the step's kernels: %s", dev->error);
    for (int m = 0; !st && m < n; m++) {
        int first, count;
        cg_module_range(prog->nkernels, m, &first, &count);
        for (int q = first; !st && q < first + count; q++)
            if ((st = dev->ops->function(dev, (*modules)[m], prog->kernels[q].name, &fn[q])))
                rt_fail(b, st, "cuda: finding a kernel: %s", dev->error);
    }
    for (int m = 0; sources && m < n; m++) al_free(sources[m]);
    al_free(sources), al_free(names), al_free(src), al_free(nm);
    for (int q = 0; !st && q < prog->nkernels; q++) { /* loaded: the sources are not needed again */
        al_free(prog->kernels[q].source);
        prog->kernels[q].source = NULL;
    }
    return st;
}

void cuda_jit_free(cg_program *prog) { cg_program_free(prog); }
