/* blaslt.c - cuBLASLt through dlopen, and the launch plan's GEMMs as cuBLASLt descriptors chosen once (blaslt.h). */
#include <dlfcn.h>
#include <string.h>

#include "runtime/cuda/blaslt.h"

void blt_close(blt_library *lib)
{
    if (!lib) return;
    if (lib->handle && lib->cublasLtDestroy) lib->cublasLtDestroy(lib->handle);
    al_free(lib); /* the library stays loaded for the process, as the driver does (driver.c) */
}

alloy_status blt_open(blt_library **out, char *err, size_t errlen)
{
    static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so.12"};
    *out = NULL;
    blt_library *lib = al_calloc(1, sizeof *lib);
    if (!lib) {
        al_fmt(err, errlen, "out of memory loading cuBLASLt");
        return ALLOY_ERR_OOM;
    }
    const char *why = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib->library; i++)
        if (!(lib->library = dlopen(names[i], RTLD_NOW | RTLD_LOCAL))) why = dlerror();
    if (!lib->library) {
        al_fmt(err, errlen, "cuBLASLt (libcublasLt.so.13 or .12) cannot be loaded (%s): install the CUDA toolkit's "
                            "libraries or add them to LD_LIBRARY_PATH", why ? why : "not found");
        blt_close(lib);
        return ALLOY_ERR_UNSUPPORTED;
    }
#define BLT_LOAD(name, ret, params)                                                            \
    if (!(*(void **)&lib->name = dlsym(lib->library, #name))) {                                \
        al_fmt(err, errlen, "cuBLASLt has no %s: a library older than CUDA 12", #name);       \
        blt_close(lib);                                                                        \
        return ALLOY_ERR_UNSUPPORTED;                                                          \
    }
    BLT_ENTRIES(BLT_LOAD)
#undef BLT_LOAD
    lib->version = lib->cublasLtGetVersion();
    cublasStatus_t s = lib->cublasLtCreate(&lib->handle);
    if (s != CUBLAS_STATUS_SUCCESS) {
        al_fmt(err, errlen, "cublasLtCreate failed: %s", lib->cublasLtGetStatusName(s));
        lib->handle = NULL;
        blt_close(lib);
        return ALLOY_ERR_UNSUPPORTED;
    }
    *out = lib;
    return ALLOY_OK;
}

static cudaDataType_t data_type(alloy_dtype dt)
{
    switch (dt) {
    case ALLOY_F16: return CUDA_R_16F;
    case ALLOY_BF16: return CUDA_R_16BF;
    case ALLOY_F64: return CUDA_R_64F;
    default: return CUDA_R_32F;
    }
}

void blt_gemm_release(const blt_library *lib, blt_gemm *g)
{
    if (g->desc) lib->cublasLtMatmulDescDestroy(g->desc);
    if (g->a) lib->cublasLtMatrixLayoutDestroy(g->a);
    if (g->b) lib->cublasLtMatrixLayoutDestroy(g->b);
    if (g->d) lib->cublasLtMatrixLayoutDestroy(g->d);
    memset(g, 0, sizeof *g);
}

/* A layout of rows x cols (leading dim ld) of type t, batched when batch > 1: by a stride, or
 * (pointers) through arrays of per-matrix pointers the call is given in place of the matrix. */
static cublasStatus_t layout(const blt_library *lib, cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows,
                             int64_t cols, int64_t ld, int64_t batch, int64_t stride, bool pointers)
{
    cublasStatus_t s = lib->cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
    if (s == CUBLAS_STATUS_SUCCESS && (batch > 1 || pointers)) {
        int32_t count = (int32_t)batch;
        s = lib->cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
        if (s == CUBLAS_STATUS_SUCCESS && pointers) {
            uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
            s = lib->cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode);
        } else if (s == CUBLAS_STATUS_SUCCESS) {
            s = lib->cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                      sizeof stride);
        }
    }
    return s;
}

/* The heuristic's first algorithm for the operands aligned to align[0..2]; 0 found when none. */
static cublasStatus_t choose(const blt_library *lib, blt_gemm *g, const int align[3], int *found)
{
    cublasLtMatmulPreference_t pref;
    cublasStatus_t s = lib->cublasLtMatmulPreferenceCreate(&pref);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    uint64_t ws = BLT_WORKSPACE;
    uint32_t al[4] = {(uint32_t)align[0], (uint32_t)align[1], (uint32_t)align[2], (uint32_t)align[2]};
    s = lib->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
        s = lib->cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]);
    cublasLtMatmulHeuristicResult_t result;
    *found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lib->cublasLtMatmulAlgoGetHeuristic(lib->handle, g->desc, g->a, g->b, g->d, g->d, pref, 1, &result, found);
    if (s == CUBLAS_STATUS_SUCCESS && *found > 0) g->algo = result.algo;
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) s = CUBLAS_STATUS_SUCCESS, *found = 0;
    lib->cublasLtMatmulPreferenceDestroy(pref);
    return s;
}

/* gm's epilogue on out's descriptor: D = product + bias per row of D (the
 * row-major output's last dim), the bias in D's dtype; GELU (the tanh
 * form) after it; GELU's input written beside D in D's dtype, AUX_LD
 * elements apart (and a batch stride as D's). The bias and aux pointers
 * are set per run (blt_gemm_run). */
static cublasStatus_t set_epilogue(const blt_library *lib, const lp_gemm *gm, cudaDataType_t d, blt_gemm *out)
{
    static const int32_t kinds[] = {
        [LP_EPILOGUE_NONE] = CUBLASLT_EPILOGUE_DEFAULT,         [LP_EPILOGUE_BIAS] = CUBLASLT_EPILOGUE_BIAS,
        [LP_EPILOGUE_GELU] = CUBLASLT_EPILOGUE_GELU,            [LP_EPILOGUE_GELU_BIAS] = CUBLASLT_EPILOGUE_GELU_BIAS,
        [LP_EPILOGUE_GELU_AUX] = CUBLASLT_EPILOGUE_GELU_AUX,    [LP_EPILOGUE_GELU_AUX_BIAS] = CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
    };
    int32_t epi = kinds[gm->epilogue], type = (int32_t)d;
    out->bias = lp_epilogue_bias(gm->epilogue), out->aux = lp_epilogue_aux(gm->epilogue);
    cublasStatus_t s = lib->cublasLtMatmulDescSetAttribute(out->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (s == CUBLAS_STATUS_SUCCESS && out->bias)
        s = lib->cublasLtMatmulDescSetAttribute(out->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type);
    if (s == CUBLAS_STATUS_SUCCESS && out->aux) {
        int64_t ld = gm->ld_aux, stride = gm->stride_d;
        s = lib->cublasLtMatmulDescSetAttribute(out->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
        if (s == CUBLAS_STATUS_SUCCESS && gm->batch > 1)
            s = lib->cublasLtMatmulDescSetAttribute(out->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &stride,
                                                    sizeof stride);
    }
    return s;
}

alloy_status blt_gemm_prepare(const blt_library *lib, const lp_gemm *gm, const int align[3], blt_gemm *out, char *err,
                              size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->wide = gm->ab == ALLOY_F64;
    out->alpha = 1, out->alpha32 = 1;
    cudaDataType_t ab = data_type(gm->ab), d = data_type(gm->d);
    cublasComputeType_t compute = out->wide ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F; /* never TF32 unasked */
    cublasStatus_t s = lib->cublasLtMatmulDescCreate(&out->desc, compute, out->wide ? CUDA_R_64F : CUDA_R_32F);
    int32_t ta = gm->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = gm->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lib->cublasLtMatmulDescSetAttribute(out->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lib->cublasLtMatmulDescSetAttribute(out->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (s == CUBLAS_STATUS_SUCCESS && gm->epilogue != LP_EPILOGUE_NONE) s = set_epilogue(lib, gm, d, out);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = layout(lib, &out->a, ab, gm->ta ? gm->k : gm->m, gm->ta ? gm->m : gm->k, gm->lda, gm->batch, gm->stride_a,
                   gm->pointers);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = layout(lib, &out->b, ab, gm->tb ? gm->n : gm->k, gm->tb ? gm->k : gm->n, gm->ldb, gm->batch, gm->stride_b,
                   gm->pointers);
    if (s == CUBLAS_STATUS_SUCCESS) s = layout(lib, &out->d, d, gm->m, gm->n, gm->ldd, gm->batch, gm->stride_d, gm->pointers);
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS) s = choose(lib, out, align, &found);
    if (s == CUBLAS_STATUS_SUCCESS && !found) { /* the fallback: declare only element alignment */
        int elem[3] = {(int)alloy_dtype_size(gm->ab), (int)alloy_dtype_size(gm->ab), (int)alloy_dtype_size(gm->d)};
        s = choose(lib, out, elem, &found);
    }
    if (s != CUBLAS_STATUS_SUCCESS || !found) {
        al_fmt(err, errlen, "cuBLASLt %s for %s x %s -> %s, m %lld n %lld k %lld (lda %lld ldb %lld ldd %lld, batch %lld%s)",
               s != CUBLAS_STATUS_SUCCESS ? lib->cublasLtGetStatusName(s) : "found no algorithm",
               alloy_dtype_name(gm->ab), alloy_dtype_name(gm->ab), alloy_dtype_name(gm->d), (long long)gm->m,
               (long long)gm->n, (long long)gm->k, (long long)gm->lda, (long long)gm->ldb, (long long)gm->ldd,
               (long long)gm->batch, gm->pointers ? " as arrays of pointers, CUBLASLT_BATCH_MODE_POINTER_ARRAY" : "");
        blt_gemm_release(lib, out);
        return ALLOY_ERR_UNSUPPORTED;
    }
    return ALLOY_OK;
}

alloy_status blt_gemm_run(const blt_library *lib, const blt_gemm *g, const void *a, const void *b, void *d,
                          const void *bias, void *aux, void *workspace, cudaStream_t stream, char *err, size_t errlen)
{
    /* the descriptor is host memory: setting its pointers per call is allowed while capturing */
    cublasStatus_t ps = CUBLAS_STATUS_SUCCESS;
    const char *which = "BIAS_POINTER";
    if (g->bias) ps = lib->cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (ps == CUBLAS_STATUS_SUCCESS && g->aux) {
        which = "EPILOGUE_AUX_POINTER";
        ps = lib->cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    }
    if (ps != CUBLAS_STATUS_SUCCESS) {
        al_fmt(err, errlen, "cublasLtMatmulDescSetAttribute(%s): %s", which, lib->cublasLtGetStatusName(ps));
        return ALLOY_ERR_CUDA;
    }
    const void *alpha = g->wide ? (const void *)&g->alpha : (const void *)&g->alpha32;
    const void *beta = g->wide ? (const void *)&g->beta : (const void *)&g->beta32;
    cublasStatus_t s = lib->cublasLtMatmul(lib->handle, g->desc, alpha, a, g->a, b, g->b, beta, d, g->d, d, g->d,
                                           &g->algo, workspace, BLT_WORKSPACE, stream);
    if (s == CUBLAS_STATUS_SUCCESS) return ALLOY_OK;
    al_fmt(err, errlen, "cublasLtMatmul: %s", lib->cublasLtGetStatusName(s));
    return ALLOY_ERR_CUDA;
}
