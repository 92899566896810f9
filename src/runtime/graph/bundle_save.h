/* bundle_save.h - where the images of a bundle's CUDA executable come from when it is saved: NVRTC's cubins and PTX, or a device's own (the tests' host emulation), through one hook. */
#ifndef ALLOY_BUNDLE_SAVE_H
#define ALLOY_BUNDLE_SAVE_H

#include "step/options.h"
#include "runtime/bundle/bundle.h"

/* Fills x's images (and min_driver) for the nmodules modules of the step's
 * kernels (names[m], sources[m]: complete CUDA C) for archs as the caller
 * gave them; every module gets the same targets, in module order. An error
 * with err naming what failed; x is freed by the caller. */
typedef alloy_status (*bundle_image_builder)(const al_options *cfg, const char *archs, int nmodules,
                                             const char *const *names, const char *const *sources, bundle_cuda *x,
                                             char *err, size_t errlen);

/* The kernel table of prog (cg_emit's) into x, whose nmodules is set: its
 * kernels without their sources (the images hold the code), each kernel's
 * module (cg_module_range), the steps left without a kernel with why; x
 * owns every byte (bundle_cuda_free). ALLOY_ERR_OOM. */
AL_HIDDEN alloy_status bundle_kernel_table(const cg_program *prog, bundle_cuda *x);

/* For tests: alloy_graph_save_bundle's images come from builder (NULL:
 * NVRTC's again); returns the previous one. */
AL_HIDDEN bundle_image_builder bundle_set_image_builder(bundle_image_builder builder);

#endif
