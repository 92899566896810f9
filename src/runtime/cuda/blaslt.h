/* blaslt.h - cuBLASLt loaded at run time, and one GEMM of the launch plan as its descriptors, layouts and algorithm, chosen once. */
#ifndef ALLOY_CUDA_BLASLT_H
#define ALLOY_CUDA_BLASLT_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

#include "step/launch_plan.h"

/* Bytes of workspace every GEMM may use (what PyTorch and llm.c give Hopper). */
#define BLT_WORKSPACE (32u << 20)

/* X(name, return type, parameters): the entry points alloy calls. */
#define BLT_ENTRIES(X)                                                                                           \
    X(cublasLtCreate, cublasStatus_t, (cublasLtHandle_t * handle))                                              \
    X(cublasLtDestroy, cublasStatus_t, (cublasLtHandle_t handle))                                               \
    X(cublasLtGetVersion, size_t, (void))                                                                       \
    X(cublasLtGetStatusName, const char *, (cublasStatus_t status))                                             \
    X(cublasLtMatmulDescCreate, cublasStatus_t, (cublasLtMatmulDesc_t * d, cublasComputeType_t c, cudaDataType_t s)) \
    X(cublasLtMatmulDescDestroy, cublasStatus_t, (cublasLtMatmulDesc_t d))                                      \
    X(cublasLtMatmulDescSetAttribute, cublasStatus_t,                                                           \
      (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf, size_t n))                    \
    X(cublasLtMatrixLayoutCreate, cublasStatus_t,                                                               \
      (cublasLtMatrixLayout_t * l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld))                   \
    X(cublasLtMatrixLayoutDestroy, cublasStatus_t, (cublasLtMatrixLayout_t l))                                  \
    X(cublasLtMatrixLayoutSetAttribute, cublasStatus_t,                                                         \
      (cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void *buf, size_t n))                 \
    X(cublasLtMatmulPreferenceCreate, cublasStatus_t, (cublasLtMatmulPreference_t * p))                         \
    X(cublasLtMatmulPreferenceDestroy, cublasStatus_t, (cublasLtMatmulPreference_t p))                          \
    X(cublasLtMatmulPreferenceSetAttribute, cublasStatus_t,                                                     \
      (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *buf, size_t n))        \
    X(cublasLtMatmulAlgoGetHeuristic, cublasStatus_t,                                                           \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,          \
       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t p, int requested,        \
       cublasLtMatmulHeuristicResult_t *results, int *returned))                                                \
    X(cublasLtMatmul, cublasStatus_t,                                                                           \
      (cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *a, cublasLtMatrixLayout_t ad, \
       const void *b, cublasLtMatrixLayout_t bd, const void *beta, const void *c, cublasLtMatrixLayout_t cd,    \
       void *dd, cublasLtMatrixLayout_t ddd, const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsn,            \
       cudaStream_t stream))

typedef struct blt_library {
    void *library;
    cublasLtHandle_t handle;
    size_t version;
#define BLT_FIELD(name, ret, params) ret(*name) params;
    BLT_ENTRIES(BLT_FIELD)
#undef BLT_FIELD
} blt_library;

/* One GEMM, ready to run: descriptors, layouts (C is D's), the algorithm. */
typedef struct blt_gemm {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    double alpha, beta; /* f64 GEMMs read them as doubles */
    float alpha32, beta32;
    bool wide;
    bool bias; /* an epilogue with a bias: each run sets the bias pointer */
    bool aux;  /* a GELU_AUX epilogue: each run sets the pointer to GELU's input */
} blt_gemm;

/* Loads libcublasLt.so.13 (then .12) and creates a handle (which needs a
 * current context). ALLOY_ERR_UNSUPPORTED with err when it cannot. */
AL_HIDDEN alloy_status blt_open(blt_library **out, char *err, size_t errlen);
AL_HIDDEN void blt_close(blt_library *lib);
/* gm's descriptors, its operands declared aligned to align[0..2] bytes (A,
 * B, D), and the heuristic's first algorithm for BLT_WORKSPACE bytes of
 * workspace; when it finds none, asked again with element alignment. f32
 * operands sum in f32 without TF32; f16/bf16 on tensor cores with f32
 * sums; f64 in f64. ALLOY_ERR_UNSUPPORTED naming the shape when no
 * algorithm exists. */
AL_HIDDEN alloy_status blt_gemm_prepare(const blt_library *lib, const lp_gemm *gm, const int align[3], blt_gemm *out,
                                        char *err, size_t errlen);
AL_HIDDEN void blt_gemm_release(const blt_library *lib, blt_gemm *g);
/* Queues D = op(A) op(B) (+ bias, D's m values, then GELU, GELU's input
 * written at aux: the epilogue lp_gemm names) on stream with the
 * workspace; for a pointer-array GEMM (lp_gemm's pointers) a, b and d are
 * device arrays of the batch's matrix addresses. */
AL_HIDDEN alloy_status blt_gemm_run(const blt_library *lib, const blt_gemm *g, const void *a, const void *b, void *d,
                                    const void *bias, void *aux, void *workspace, cudaStream_t stream, char *err,
                                    size_t errlen);

#endif
