/* alloy/bundle.h - ahead-of-time bundles: a compiled training step saved to one file, loaded and run with no pass pipeline (docs/bundle.md), also by a program that links liballoy-runtime (pkg-config alloy-runtime) alone.
 *
 *     alloy_graph_save_bundle(g, "step.alloy", NULL);      // CPU: no GPU needed
 *     ...
 *     alloy_bundle *b;
 *     char err[512];
 *     if (alloy_bundle_load("step.alloy", &b, err, sizeof err)) fprintf(stderr, "%s\n", err);
 *     alloy_bundle_run(b, feeds, nfeeds, &loss, 1);     // as alloy_graph_run
 *     alloy_bundle_free(b);
 */
#ifndef ALLOY_BUNDLE_H
#define ALLOY_BUNDLE_H

#include "alloy/graph.h"
#include "alloy/train.h"

typedef struct alloy_bundle alloy_bundle;

/* liballoy only (it compiles; liballoy-runtime has every other call here).
 * Compiles g (the pass pipeline alone, no device opened) and writes its
 * compiled step as a bundle at path, atomically (a temporary file next to
 * it, then a rename; path is unchanged on failure). archs: CUDA
 * architectures ("sm_80,sm_90") whose executables to include, compiled by
 * NVRTC now (no GPU needed): per module of kernels a cubin for each and PTX
 * for the lowest; NULL or "" for none (the CPU needs none). A bad list is
 * ALLOY_ERR_INVALID, archs without NVRTC ALLOY_ERR_UNSUPPORTED. Errors are
 * recorded on g. */
ALLOY_API alloy_status alloy_graph_save_bundle(alloy_graph *g, const char *path, const char *archs);
/* liballoy only, as alloy_graph_save_bundle, with flags: ALLOY_BUNDLE_WITH_STATE also
 * stores the graph's state as it is now (every param, moment and counter,
 * as alloy_graph_save_state writes it) in the bundle, and alloy_bundle_load
 * starts from it instead of the seed's initialization. Unknown flags:
 * ALLOY_ERR_INVALID. */
#define ALLOY_BUNDLE_WITH_STATE 1u
ALLOY_API alloy_status alloy_graph_save_bundle_flags(alloy_graph *g, const char *path, const char *archs,
                                                     unsigned flags);

/* Reads the bundle at path, checking every byte (magic, version, checksum,
 * every section, the schedule and plan against the IR), and prepares it to
 * run: the backend the bundle's options and ALLOY_DEVICE ask for, the state
 * initialized as alloy_graph's would be under the bundle's seed. On a GPU
 * that none of the bundle's CUDA images runs on (a cubin of its major
 * version, else PTX the driver takes): ALLOY_ERR_UNSUPPORTED naming the GPU
 * and the bundle's architectures. On error
 * *out is NULL and err names the file, the section and byte offset and
 * what is wrong (ALLOY_ERR_FORMAT: corrupt; ALLOY_ERR_UNSUPPORTED: a newer
 * format; ALLOY_ERR_IO: unreadable). */
ALLOY_API alloy_status alloy_bundle_load(const char *path, alloy_bundle **out, char *err, size_t errlen);
/* The inputs a run feeds, in the order of the bundle's IR: how many, and the
 * i-th's name, dtype and shape in out (data NULL; name owned by b);
 * ALLOY_ERR_NOT_FOUND when i is out of range. */
ALLOY_API int alloy_bundle_input_count(const alloy_bundle *b);
ALLOY_API alloy_status alloy_bundle_input_at(const alloy_bundle *b, int i, alloy_host_tensor *out);
/* One run of the bundle's step, exactly as alloy_graph_run. */
ALLOY_API alloy_status alloy_bundle_run(alloy_bundle *b, const alloy_host_tensor *feeds, int nfeeds,
                                        alloy_host_tensor *fetches, int nfetches);
/* What the last run did, as alloy_graph_step_info. */
ALLOY_API alloy_status alloy_bundle_step_info(const alloy_bundle *b, alloy_step_info *out);
/* The overflow locator's report of the last run, as alloy_graph_overflow_info
 * (amp_check from the environment, ALLOY_AMP_CHECK=1, or the bundle's options). */
ALLOY_API alloy_status alloy_bundle_overflow_info(const alloy_bundle *b, alloy_overflow_info *out);
/* The state, as alloy_graph's calls of the same names. */
ALLOY_API int alloy_bundle_state_count(alloy_bundle *b);
ALLOY_API alloy_status alloy_bundle_state_at(alloy_bundle *b, int i, alloy_host_tensor *out);
ALLOY_API alloy_status alloy_bundle_get_state(alloy_bundle *b, const char *name, alloy_host_tensor *out);
ALLOY_API alloy_status alloy_bundle_set_state(alloy_bundle *b, const alloy_host_tensor *src);
ALLOY_API alloy_status alloy_bundle_save_state(alloy_bundle *b, const char *path);
ALLOY_API alloy_status alloy_bundle_load_state(alloy_bundle *b, const char *path);
/* The message of the last failing call on b ("" when none). */
ALLOY_API const char *alloy_bundle_last_error(const alloy_bundle *b);
ALLOY_API void alloy_bundle_free(alloy_bundle *b);

#endif
