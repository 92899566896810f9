/* emu_device.c - the CUDA backend's device on the host (emu_device.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/convert.h"
#include "emu_device.h"
#include "emu_loader.h"
#include "emu_stream.h"
#include "emu_slots.h"
#include "runtime/cpu/cpu.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/graph/bundle_save.h"

/* One queued call while capturing. */
typedef struct emu_call {
    enum { CALL_COPY, CALL_ZERO, CALL_LAUNCH, CALL_GEMM, CALL_HOST } kind;
    cdev_ptr dst, src, a, b;
    cdev_gemm_extra ex; /* CALL_GEMM: its epilogue's bias and GELU input */
    size_t bytes;
    cdev_function *fn;
    cdev_gemm *gemm;
    unsigned grid, block;
    uint64_t *args; /* the launch's argument values (every kernel argument is a pointer) */
    int nargs;
    void (*host)(void *arg); /* CALL_HOST: a library's work on the stream (the emulated NCCL's), on its copy of arg */
    void *host_arg;
    emu_action check; /* the extents it touches (emu_slots.h) */
} emu_call;

typedef struct emu_graph {
    emu_call *calls;
    int n, cap;
} emu_graph;

typedef struct emu_dev {
    cdev base;
    emu_stream stream;    /* first after base: the stream's enqueue finds the device from it */
    emu_device_stats stats;
    emu_graph *capturing; /* calls are recorded here, not run */
    char fault[160];      /* a fault injected into a launch: sticky, as a GPU's context is after one */
    emu_action pending;   /* the extents the next call touches (describe) */
} emu_dev;

struct cdev_module {
    emu_kernel *library;
    cdev_function **fns; /* found in it, freed with it */
    int nfns;
};

struct cdev_function {
    emu_kernel *library;
    char name[64];
    int nparams;
};

struct cdev_gemm {
    lp_gemm gm;
};

static emu_dev *emu_of(cdev *dev) { return (emu_dev *)dev; }

/* A device with a fault: every later call fails with it, as on a GPU. */
static alloy_status sticky(cdev *dev)
{
    snprintf(dev->error, sizeof dev->error, "%s", emu_of(dev)->fault);
    return ALLOY_ERR_CUDA;
}


/* What every emulated device opened by emu_backend_opener did, together. */
static emu_device_stats totals;

static alloy_status fail(cdev *dev, alloy_status st, const char *fmt, const char *what)
{
    snprintf(dev->error, sizeof dev->error, fmt, what);
    return st;
}

/* Device memory every emulated device may hold at once (emu_device_set_budget). */
static size_t budget = SIZE_MAX, in_use;

void emu_device_set_budget(size_t bytes) { budget = bytes; }

size_t emu_device_in_use(void) { return in_use; }

/* Each block starts with a 256-byte header holding its size; the address
 * handed out follows it (256-aligned, as cuMemAlloc's are). */
static alloy_status e_alloc(cdev *dev, size_t bytes, cdev_ptr *out)
{
    size_t size = (bytes + 255) / 256 * 256;
    if (size > budget - in_use) {
        snprintf(dev->error, sizeof dev->error, "out of GPU memory: asked %zu bytes, %zu of %zu free", bytes,
                 budget - in_use, budget);
        return ALLOY_ERR_OOM;
    }
    char *p = aligned_alloc(256, size + 512); /* and 256 bytes after it, where an overrun lands */
    if (!p) {
        snprintf(dev->error, sizeof dev->error, "out of emulated GPU memory: asked %zu bytes", bytes);
        return ALLOY_ERR_OOM;
    }
    memcpy(p, &size, sizeof size);
    memset(p + 256, 0xff, size);
    in_use += size;
    emu_slots_alloc(p + 256, size);
    *out = (cdev_ptr)(uintptr_t)(p + 256);
    return ALLOY_OK;
}

static void e_release(cdev *dev, cdev_ptr ptr)
{
    (void)dev;
    if (!ptr) return;
    char *p = (char *)(uintptr_t)ptr - 256;
    size_t size;
    memcpy(&size, p, sizeof size);
    in_use -= size;
    emu_slots_release(p + 256);
    free(p);
}

static alloy_status e_upload(cdev *dev, cdev_ptr dst, const void *src, size_t bytes)
{
    if (emu_of(dev)->capturing) return fail(dev, ALLOY_ERR_CUDA, "%s", "a synchronous copy while capturing");
    memcpy((void *)(uintptr_t)dst, src, bytes);
    emu_slots_write(NULL, (const void *)(uintptr_t)dst, bytes);
    return ALLOY_OK;
}

static alloy_status e_download(cdev *dev, void *dst, cdev_ptr src, size_t bytes)
{
    if (emu_of(dev)->fault[0]) return sticky(dev);
    if (emu_of(dev)->capturing) return fail(dev, ALLOY_ERR_CUDA, "%s", "a synchronous copy while capturing");
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return ALLOY_OK;
}

static bool record(emu_dev *d, emu_call c)
{
    emu_graph *g = d->capturing;
    if (g->n == g->cap) {
        int cap = g->cap ? g->cap * 2 : 64;
        emu_call *calls = realloc(g->calls, sizeof *calls * (size_t)cap);
        if (!calls) return false;
        g->calls = calls, g->cap = cap;
    }
    g->calls[g->n++] = c;
    return true;
}

/* The extents described for the call being made, taken from the device. */
static emu_action take_pending(emu_dev *d)
{
    emu_action a = d->pending;
    d->pending = (emu_action){NULL, 0};
    return a;
}

/* Records call c with the extents described for it; false when out of memory. */
static bool record_checked(emu_dev *d, emu_call c)
{
    c.check = take_pending(d);
    if (record(d, c)) return true;
    emu_action_free(&c.check);
    return false;
}

static alloy_status run_copy(cdev *dev, cdev_ptr dst, cdev_ptr src, size_t bytes, const emu_action *check)
{
    emu_dev *d = emu_of(dev);
    if (emu_slots_read(check, (const void *)(uintptr_t)src, bytes, "copy", dev->error, sizeof dev->error))
        return ALLOY_ERR_CUDA;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    emu_slots_write(check, (const void *)(uintptr_t)dst, bytes);
    d->stats.copies++, totals.copies++;
    return ALLOY_OK;
}

static alloy_status e_copy(cdev *dev, cdev_ptr dst, cdev_ptr src, size_t bytes)
{
    emu_dev *d = emu_of(dev);
    if (d->capturing)
        return record_checked(d, (emu_call){.kind = CALL_COPY, .dst = dst, .src = src, .bytes = bytes}) ? ALLOY_OK
                                                                                                          : ALLOY_ERR_OOM;
    emu_action check = take_pending(d);
    alloy_status st = run_copy(dev, dst, src, bytes, &check);
    emu_action_free(&check);
    return st;
}

static alloy_status run_zero(cdev *dev, cdev_ptr dst, size_t bytes, const emu_action *check)
{
    emu_dev *d = emu_of(dev);
    memset((void *)(uintptr_t)dst, 0, bytes);
    emu_slots_write(check, (const void *)(uintptr_t)dst, bytes);
    d->stats.zeros++, totals.zeros++;
    return ALLOY_OK;
}

static alloy_status e_zero(cdev *dev, cdev_ptr dst, size_t bytes)
{
    emu_dev *d = emu_of(dev);
    if (d->capturing)
        return record_checked(d, (emu_call){.kind = CALL_ZERO, .dst = dst, .bytes = bytes}) ? ALLOY_OK : ALLOY_ERR_OOM;
    emu_action check = take_pending(d);
    alloy_status st = run_zero(dev, dst, bytes, &check);
    emu_action_free(&check);
    return st;
}

/* The name of the first kernel in a module's source, into out. */
static bool first_kernel(const char *source, char *out, size_t len)
{
    const char *p = strstr(source, "__global__ void ");
    if (!p) return false;
    p += strlen("__global__ void ");
    if (strncmp(p, "__launch_bounds__(", 18) == 0) {
        p = strchr(p, ')');
        if (!p) return false;
        p += 2;
    }
    size_t n = strcspn(p, "(");
    if (!n || n >= len) return false;
    memcpy(out, p, n);
    out[n] = '\0';
    return true;
}

static alloy_status e_load(cdev *dev, int n, const char *const *names, const char *const *sources, cdev_module **out)
{
    emu_dev *d = emu_of(dev);
    for (int i = 0; i < n; i++) {
        char kernel[64], err[4096];
        if (!first_kernel(sources[i], kernel, sizeof kernel))
            return fail(dev, ALLOY_ERR_INVALID, "module %s holds no kernel", names[i]);
        cdev_module *m = calloc(1, sizeof *m);
        if (!m) return fail(dev, ALLOY_ERR_OOM, "%s", "out of memory");
        if (!(m->library = emu_compile(sources[i], kernel, err, sizeof err))) {
            free(m);
            snprintf(dev->error, sizeof dev->error, "module %s: %.900s", names[i], err);
            return ALLOY_ERR_NVRTC;
        }
        out[i] = m;
        d->stats.modules++, totals.modules++;
    }
    return ALLOY_OK;
}

static alloy_status e_load_image(cdev *dev, const char *name, uint32_t kind, const void *image, size_t size,
                                 cdev_module **out)
{
    emu_dev *d = emu_of(dev);
    char err[1024];
    if (kind != BUNDLE_HOST)
        return fail(dev, ALLOY_ERR_UNSUPPORTED, "module %s: the emulation loads host images only", name);
    cdev_module *m = calloc(1, sizeof *m);
    if (!m) return fail(dev, ALLOY_ERR_OOM, "%s", "out of memory");
    if (!(m->library = emu_load_image(image, size, err, sizeof err))) {
        free(m);
        snprintf(dev->error, sizeof dev->error, "module %s: %.900s", name, err);
        return ALLOY_ERR_INVALID;
    }
    *out = m;
    d->stats.modules++, totals.modules++;
    return ALLOY_OK;
}

static alloy_status e_function(cdev *dev, cdev_module *m, const char *kernel, cdev_function **out)
{
    char err[1024];
    if (emu_select(m->library, kernel, err, sizeof err)) return fail(dev, ALLOY_ERR_NOT_FOUND, "%s", err);
    cdev_function *f = calloc(1, sizeof *f);
    if (!f) return fail(dev, ALLOY_ERR_OOM, "%s", "out of memory");
    f->library = m->library;
    snprintf(f->name, sizeof f->name, "%s", kernel);
    cdev_function **fns = realloc(m->fns, sizeof *fns * (size_t)(m->nfns + 1));
    if (!fns) {
        free(f);
        return fail(dev, ALLOY_ERR_OOM, "%s", "out of memory");
    }
    m->fns = fns;
    m->fns[m->nfns++] = f;
    *out = f;
    return ALLOY_OK;
}

static void e_unload(cdev *dev, cdev_module *m)
{
    (void)dev;
    if (!m) return;
    emu_free(m->library);
    for (int i = 0; i < m->nfns; i++) free(m->fns[i]);
    free(m->fns);
    free(m);
}

/* The driver version devices opened next report (0: none), and a fault injected into the
 * fault_at-th launch (counting from 1) of a kernel whose name contains fault_kernel. */
static int driver_version;
static char fault_kernel[64], faulted_kernel[64];
static long fault_at;

void emu_device_set_driver(int version) { driver_version = version; }

void emu_device_inject_fault(const char *kernel, long nth)
{
    snprintf(fault_kernel, sizeof fault_kernel, "%s", kernel ? kernel : "");
    fault_at = nth;
    faulted_kernel[0] = 0;
}

const char *emu_device_faulted_kernel(void) { return faulted_kernel; }

static alloy_status run_launch(cdev *dev, cdev_function *f, unsigned grid, unsigned block, void **params,
                               const emu_action *check)
{
    char err[1024];
    emu_dev *d = emu_of(dev);
    if (d->fault[0]) return sticky(dev);
    if (fault_at > 0 && strstr(f->name, fault_kernel) && --fault_at == 0) {
        /* the launch is queued and returns; the fault shows at the next call or synchronization */
        snprintf(d->fault, sizeof d->fault,
                 "CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered; injected by the test)");
        snprintf(faulted_kernel, sizeof faulted_kernel, "%s", f->name);
        return ALLOY_OK;
    }
    unsigned g3[3] = {grid, 1, 1}, b3[3] = {block, 1, 1};
    if (emu_select(f->library, f->name, err, sizeof err) ||
        emu_slots_launch(f->library, f->name, check, g3, b3, params, err, sizeof err)) {
        snprintf(dev->error, sizeof dev->error, "%.1000s", err); /* "kernel NAME: ..." */
        return ALLOY_ERR_CUDA;
    }
    emu_of(dev)->stats.launches++, totals.launches++;
    return ALLOY_OK;
}

static alloy_status e_launch(cdev *dev, cdev_function *f, unsigned grid, unsigned block, void **params, int n)
{
    emu_dev *d = emu_of(dev);
    if (!d->capturing) {
        emu_action check = take_pending(d);
        alloy_status st = run_launch(dev, f, grid, block, params, &check);
        emu_action_free(&check);
        return st;
    }
    emu_call c = {.kind = CALL_LAUNCH, .fn = f, .grid = grid, .block = block, .nargs = n};
    c.args = malloc(sizeof(uint64_t) * (size_t)(n + 1));
    if (!c.args) return ALLOY_ERR_OOM;
    for (int i = 0; i < n; i++) c.args[i] = *(const uint64_t *)params[i];
    if (!record_checked(d, c)) {
        free(c.args);
        return ALLOY_ERR_OOM;
    }
    return ALLOY_OK;
}

/* Whether the emulated cuBLASLt's heuristic finds algorithms for pointer-array layouts (emu_device_set_pointer_arrays). */
static bool pointer_arrays = true;

void emu_device_set_pointer_arrays(bool found) { pointer_arrays = found; }

/* Whether it finds algorithms for strided batches of more than one matrix (emu_device_set_strided_batches). */
static bool strided_batches = true;

void emu_device_set_strided_batches(bool found) { strided_batches = found; }

static alloy_status e_gemm_prepare(cdev *dev, const lp_gemm *gm, const int align[3], cdev_gemm **out)
{
    if (gm->pointers && !pointer_arrays) { /* as blt_gemm_prepare words it when the heuristic returns none */
        snprintf(dev->error, sizeof dev->error,
                 "cuBLASLt found no algorithm for %s x %s -> %s, m %lld n %lld k %lld (lda %lld ldb %lld ldd %lld, batch "
                 "%lld as arrays of pointers, CUBLASLT_BATCH_MODE_POINTER_ARRAY)",
                 alloy_dtype_name(gm->ab), alloy_dtype_name(gm->ab), alloy_dtype_name(gm->d), (long long)gm->m,
                 (long long)gm->n, (long long)gm->k, (long long)gm->lda, (long long)gm->ldb, (long long)gm->ldd,
                 (long long)gm->batch);
        return ALLOY_ERR_UNSUPPORTED;
    }
    if (!gm->pointers && gm->batch > 1 && !strided_batches) {
        snprintf(dev->error, sizeof dev->error, "cuBLASLt found no algorithm for a strided batch of %lld",
                 (long long)gm->batch);
        return ALLOY_ERR_UNSUPPORTED;
    }
    for (int i = 0; i < 3; i++)
        if (align[i] < 1 || align[i] > 256 || (align[i] & (align[i] - 1)))
            return fail(dev, ALLOY_ERR_INVALID, "%s", "a GEMM operand alignment that is not a power of two up to 256");
    /* cuBLASLt's type combinations for the 32F (64F) compute types: D is A and B's dtype, or f32 for f16/bf16 */
    bool low = gm->ab == ALLOY_F16 || gm->ab == ALLOY_BF16;
    if (gm->d != gm->ab && !(low && gm->d == ALLOY_F32)) {
        snprintf(dev->error, sizeof dev->error, "cuBLASLt has no GEMM of %s A and B into %s D",
                 alloy_dtype_name(gm->ab), alloy_dtype_name(gm->d));
        return ALLOY_ERR_UNSUPPORTED;
    }
    /* the GELU epilogues as cuBLASLt documents them: not for f64; GELU's input in D's type, AUX_LD (and
     * its batch stride) a multiple of 8 elements and at least D's m rows; no pointer-array batches here */
    if (lp_epilogue_gelu(gm->epilogue) && (gm->ab == ALLOY_F64 || gm->pointers))
        return fail(dev, ALLOY_ERR_INVALID, "a GELU epilogue %s", gm->pointers ? "on a pointer-array GEMM" : "on an f64 GEMM");
    if (lp_epilogue_aux(gm->epilogue) &&
        (gm->ld_aux % 8 || gm->ld_aux < gm->m || (gm->batch > 1 && gm->stride_d % 8)))
    {
        snprintf(dev->error, sizeof dev->error,
                 "a GELU_AUX epilogue with AUX_LD %lld (m %lld, batch stride %lld): cuBLASLt wants multiples of 8, "
                 "AUX_LD at least m", (long long)gm->ld_aux, (long long)gm->m, (long long)gm->stride_d);
        return ALLOY_ERR_INVALID;
    }
    cdev_gemm *h = calloc(1, sizeof *h);
    if (!h) return fail(dev, ALLOY_ERR_OOM, "%s", "out of memory");
    h->gm = *gm;
    *out = h;
    return ALLOY_OK;
}

/* Column j of D in the GPU-numerics mode: each element an f32 (f64 for wide GEMMs) running sum
 * of fused multiply-adds, the k terms in reverse order; any order is what cuBLASLt may use. */
static void gpu_numerics_column(const lp_gemm *gm, const double *A, const double *B, int64_t j, double *col)
{
    const bool wide = gm->ab == ALLOY_F64;
    for (int64_t i = 0; i < gm->m; i++) {
        float s = 0;
        double w = 0;
        for (int64_t p = gm->k - 1; p >= 0; p--) {
            if (wide) w = fma(A[i + p * gm->m], B[p + j * gm->k], w);
            else s = fmaf((float)A[i + p * gm->m], (float)B[p + j * gm->k], s);
        }
        col[i] = wide ? w : (double)s;
    }
}

/* D = op(A) op(B), column-major as cuBLASLt defines it (a batch by
 * strides, or by arrays of pointers read from device memory), summed in double
 * and rounded once into D's dtype (in the GPU-numerics mode as cuBLASLt
 * sums, gpu_numerics_column); with a bias epilogue, the f32 sum plus
 * bias[i] (D's m values, in D's dtype) in f32 for every column j, then
 * rounded once into D's dtype, as CUBLASLT_EPILOGUE_BIAS defines it; with
 * a GELU one, that f32 value rounded once into D's dtype at ex.aux (the
 * AUX epilogues: GELU's input, ld_aux apart, a batch stride_d apart) and
 * its gelu_tanh (the op table's expression, the CPU's tanh: cuBLASLt's own
 * tanh is not known here) rounded once into D. */
static alloy_status run_gemm(cdev *dev, const lp_gemm *gm, cdev_ptr a, cdev_ptr b, cdev_ptr d, cdev_gemm_extra ex,
                             const emu_action *check)
{
    const cdev_ptr bias = ex.bias;
    size_t ea = alloy_dtype_size(gm->ab), ed = alloy_dtype_size(gm->d);
    int64_t arows = gm->ta ? gm->k : gm->m, acols = gm->ta ? gm->m : gm->k;
    int64_t brows = gm->tb ? gm->n : gm->k, bcols = gm->tb ? gm->k : gm->n;
    int64_t asize = gm->lda * (acols - 1) + arows, bsize = gm->ldb * (bcols - 1) + brows;
    double *A = malloc(sizeof(double) * (size_t)(gm->m * gm->k + 1)), *B = malloc(sizeof(double) * (size_t)(gm->k * gm->n + 1));
    double *raw_a = malloc(sizeof(double) * (size_t)(asize + 1)), *raw_b = malloc(sizeof(double) * (size_t)(bsize + 1));
    double *D = malloc(sizeof(double) * (size_t)(gm->m * gm->n + 1));
    float *f32 = malloc(sizeof(float) * (size_t)(gm->m + 1)); /* one column rounded to f32 */
    const bool with_bias = lp_epilogue_bias(gm->epilogue), gelu = lp_epilogue_gelu(gm->epilogue),
               aux = lp_epilogue_aux(gm->epilogue);
    float *vb = malloc(sizeof(float) * (size_t)(gm->m + 1)); /* the bias in f32 */
    if (!A || !B || !raw_a || !raw_b || !D || !f32 || !vb) {
        free(A), free(B), free(raw_a), free(raw_b), free(D), free(f32), free(vb);
        return fail(dev, ALLOY_ERR_OOM, "%s", "out of memory");
    }
    if (with_bias) {
        bool bad = gm->ab == ALLOY_F64 || gm->d == ALLOY_F64 || !bias;
        if (bad) snprintf(dev->error, sizeof dev->error, "a bias epilogue %s", bias ? "on an f64 GEMM" : "without a bias");
        if (bad || emu_slots_read(check, (const void *)(uintptr_t)bias, (size_t)gm->m * ed, "GEMM bias", dev->error,
                                  sizeof dev->error)) {
            free(A), free(B), free(raw_a), free(raw_b), free(D), free(f32), free(vb);
            return ALLOY_ERR_CUDA;
        }
        cvt_load_f32(gm->d, (const void *)(uintptr_t)bias, vb, (size_t)gm->m);
    }
    if (aux && !ex.aux) {
        snprintf(dev->error, sizeof dev->error, "a GELU_AUX epilogue without its EPILOGUE_AUX_POINTER");
        free(A), free(B), free(raw_a), free(raw_b), free(D), free(f32), free(vb);
        return ALLOY_ERR_CUDA;
    }
    const bool gpu = emu_gpu_numerics();
    if (gm->pointers) { /* CUBLASLT_BATCH_MODE_POINTER_ARRAY: a, b, d are device arrays of batch pointers each */
        bool bad = false;
        const cdev_ptr arrays[3] = {a, b, d};
        static const char *const names[3] = {"GEMM pointer array A", "GEMM pointer array B", "GEMM pointer array D"};
        for (int q = 0; !bad && q < 3; q++)
            bad = !arrays[q] || emu_slots_read(check, (const void *)(uintptr_t)arrays[q], (size_t)gm->batch * sizeof(uint64_t),
                                               names[q], dev->error, sizeof dev->error);
        if (bad) {
            if (!dev->error[0]) snprintf(dev->error, sizeof dev->error, "a pointer-array GEMM without its arrays");
            free(A), free(B), free(raw_a), free(raw_b), free(D), free(f32), free(vb);
            return ALLOY_ERR_CUDA;
        }
    }
    for (int64_t bi = 0; bi < gm->batch; bi++) {
        const char *pa = (const char *)(uintptr_t)a + bi * gm->stride_a * (int64_t)ea;
        const char *pb = (const char *)(uintptr_t)b + bi * gm->stride_b * (int64_t)ea;
        char *pd = (char *)(uintptr_t)d + bi * gm->stride_d * (int64_t)ed;
        if (gm->pointers) { /* matrix bi's addresses, read from the device arrays as cuBLASLt reads them */
            uint64_t at[3];
            memcpy(&at[0], (const char *)(uintptr_t)a + bi * 8, 8);
            memcpy(&at[1], (const char *)(uintptr_t)b + bi * 8, 8);
            memcpy(&at[2], (const char *)(uintptr_t)d + bi * 8, 8);
            pa = (const char *)(uintptr_t)at[0], pb = (const char *)(uintptr_t)at[1], pd = (char *)(uintptr_t)at[2];
        }
        /* each stored column's rows alone: the elements between a column's end and the next (a
         * padded row stride, ld above the rows) are neither read nor written, as in cuBLASLt */
        bool bad = false;
        for (int64_t c = 0; !bad && c < acols; c++)
            bad = emu_slots_read(check, pa + c * gm->lda * (int64_t)ea, (size_t)arows * ea, "GEMM operand A", dev->error,
                                 sizeof dev->error);
        for (int64_t c = 0; !bad && c < bcols; c++)
            bad = emu_slots_read(check, pb + c * gm->ldb * (int64_t)ea, (size_t)brows * ea, "GEMM operand B", dev->error,
                                 sizeof dev->error);
        if (bad) {
            free(A), free(B), free(raw_a), free(raw_b), free(D), free(f32), free(vb);
            return ALLOY_ERR_CUDA;
        }
        for (int64_t j = 0; j < gm->n; j++) emu_slots_write(check, pd + j * gm->ldd * (int64_t)ed, (size_t)gm->m * ed);
        char *px = aux ? (char *)(uintptr_t)ex.aux + bi * gm->stride_d * (int64_t)ed : NULL;
        for (int64_t j = 0; aux && j < gm->n; j++) emu_slots_write(check, px + j * gm->ld_aux * (int64_t)ed, (size_t)gm->m * ed);
        for (int64_t c = 0; c < acols; c++)
            cvt_load_f64(gm->ab, pa + c * gm->lda * (int64_t)ea, raw_a + c * gm->lda, (size_t)arows);
        for (int64_t c = 0; c < bcols; c++)
            cvt_load_f64(gm->ab, pb + c * gm->ldb * (int64_t)ea, raw_b + c * gm->ldb, (size_t)brows);
        /* op(A) as m x k and op(B) as k x n, column-major and dense */
        for (int64_t i = 0; i < gm->m; i++)
            for (int64_t p = 0; p < gm->k; p++)
                A[i + p * gm->m] = gm->ta ? raw_a[p + i * gm->lda] : raw_a[i + p * gm->lda];
        for (int64_t p = 0; p < gm->k; p++)
            for (int64_t j = 0; j < gm->n; j++)
                B[p + j * gm->k] = gm->tb ? raw_b[j + p * gm->ldb] : raw_b[p + j * gm->ldb];
        for (int64_t j = 0; j < gm->n; j++) {
            double *col = &D[j * gm->m];
            for (int64_t i = 0; i < gm->m; i++) col[i] = 0;
            if (gpu) /* ALLOY_EMU_NUMERICS=gpu: cuBLASLt's 32F (64F) compute type, fused, k in reverse */
                gpu_numerics_column(gm, A, B, j, col);
            for (int64_t p = 0; !gpu && p < gm->k; p++) {
                double x = B[p + j * gm->k];
                const double *ap = &A[p * gm->m];
                for (int64_t i = 0; i < gm->m; i++) col[i] += ap[i] * x;
            }
            /* a column of D (ldd apart from the next) */
            if (gm->d == ALLOY_F32 || gm->ab != ALLOY_F64) {
                for (int64_t i = 0; i < gm->m; i++) f32[i] = (float)col[i]; /* the f32 sum, then D's dtype */
                for (int64_t i = 0; with_bias && i < gm->m; i++) f32[i] += vb[i];
                if (aux) cvt_store_f32(gm->d, f32, px + j * gm->ld_aux * (int64_t)ed, (size_t)gm->m);
                if (gelu) ew_gelu_tanh_f32(gm->m, f32, f32, f32, f32, NULL); /* the op table's gelu_tanh */
                cvt_store_f32(gm->d, f32, pd + j * gm->ldd * (int64_t)ed, (size_t)gm->m);
            } else {
                cvt_store_f64(gm->d, col, pd + j * gm->ldd * (int64_t)ed, (size_t)gm->m);
            }
        }
    }
    free(A), free(B), free(raw_a), free(raw_b), free(D), free(f32), free(vb);
    emu_of(dev)->stats.gemms++, totals.gemms++;
    if (with_bias) emu_of(dev)->stats.bias_gemms++, totals.bias_gemms++;
    if (gelu) emu_of(dev)->stats.gelu_gemms++, totals.gelu_gemms++;
    if (gm->result != gm->node) emu_of(dev)->stats.whole_gemms++, totals.whole_gemms++;
    if (gm->pointers) emu_of(dev)->stats.pointer_gemms++, totals.pointer_gemms++;
    return ALLOY_OK;
}

static alloy_status e_gemm(cdev *dev, cdev_gemm *h, cdev_ptr a, cdev_ptr b, cdev_ptr d, cdev_gemm_extra ex)
{
    emu_dev *e = emu_of(dev);
    if (e->capturing)
        return record_checked(e, (emu_call){.kind = CALL_GEMM, .gemm = h, .a = a, .b = b, .dst = d, .ex = ex})
                   ? ALLOY_OK
                                                                                                     : ALLOY_ERR_OOM;
    emu_action check = take_pending(e);
    alloy_status st = run_gemm(dev, &h->gm, a, b, d, ex, &check);
    emu_action_free(&check);
    return st;
}

static void e_gemm_free(cdev *dev, cdev_gemm *h)
{
    (void)dev;
    free(h);
}

static void free_graph(emu_graph *g)
{
    if (!g) return;
    for (int i = 0; i < g->n; i++) {
        free(g->calls[i].args), free(g->calls[i].host_arg);
        emu_action_free(&g->calls[i].check);
    }
    free(g->calls);
    free(g);
}

/* emu_stream's enqueue: the library's work now, or recorded into the capture. */
/* A library's work on the stream (a collective) writes what its action's extents say it writes:
 * marked written this step for the checker, which sees no access of it. */
static void host_wrote(const emu_action *a)
{
    for (int i = 0; i < a->n; i++)
        if (a->ext[i].written && a->ext[i].base)
            emu_slots_write(a, (const void *)(uintptr_t)a->ext[i].base, (size_t)a->ext[i].bytes);
}

static int stream_enqueue(emu_stream *s, void (*fn)(void *arg), const void *arg, size_t bytes)
{
    emu_dev *d = (emu_dev *)((char *)s - offsetof(emu_dev, stream));
    if (!d->capturing) {
        d->stats.host_calls++, totals.host_calls++;
        emu_action check = take_pending(d);
        fn((void *)arg);
        host_wrote(&check);
        emu_action_free(&check);
        return 0;
    }
    void *copy = malloc(bytes ? bytes : 1);
    if (!copy) return -1;
    memcpy(copy, arg, bytes);
    if (!record_checked(d, (emu_call){.kind = CALL_HOST, .host = fn, .host_arg = copy})) {
        free(copy);
        return -1;
    }
    return 0;
}

static void *e_stream(cdev *dev) { return &emu_of(dev)->stream; }

static alloy_status e_capture_begin(cdev *dev)
{
    emu_dev *d = emu_of(dev);
    if (d->capturing) return fail(dev, ALLOY_ERR_CUDA, "%s", "capture begun twice");
    if (!(d->capturing = calloc(1, sizeof *d->capturing))) return ALLOY_ERR_OOM;
    return ALLOY_OK;
}

static alloy_status e_capture_end(cdev *dev, void **graph)
{
    emu_dev *d = emu_of(dev);
    *graph = d->capturing;
    d->capturing = NULL;
    d->stats.captures++, totals.captures++;
    return *graph ? ALLOY_OK : fail(dev, ALLOY_ERR_CUDA, "%s", "capture ended without a begin");
}

static alloy_status e_replay(cdev *dev, void *graph)
{
    emu_graph *g = graph;
    alloy_status st = ALLOY_OK;
    for (int i = 0; !st && i < g->n; i++) {
        emu_call *c = &g->calls[i];
        switch (c->kind) {
        case CALL_COPY: st = run_copy(dev, c->dst, c->src, c->bytes, &c->check); break;
        case CALL_ZERO: st = run_zero(dev, c->dst, c->bytes, &c->check); break;
        case CALL_GEMM: st = run_gemm(dev, &c->gemm->gm, c->a, c->b, c->dst, c->ex, &c->check); break;
        case CALL_HOST:
            c->host(c->host_arg);
            host_wrote(&c->check);
            emu_of(dev)->stats.host_calls++, totals.host_calls++;
            break;
        case CALL_LAUNCH: {
            void **params = malloc(sizeof(void *) * (size_t)(c->nargs + 1));
            if (!params) return ALLOY_ERR_OOM;
            for (int k = 0; k < c->nargs; k++) params[k] = &c->args[k];
            st = run_launch(dev, c->fn, c->grid, c->block, params, &c->check);
            free(params);
            break;
        }
        }
    }
    emu_of(dev)->stats.replays++, totals.replays++;
    return st;
}

static void e_graph_free(cdev *dev, void *graph)
{
    (void)dev;
    free_graph(graph);
}

static alloy_status e_sync(cdev *dev) { return emu_of(dev)->fault[0] ? sticky(dev) : ALLOY_OK; }

/* An event: the host clock when the emulated stream reached it (every call
 * runs at once, so that is when everything queued before it finished). */
struct cdev_event {
    double seconds;
    bool recorded;
};

static alloy_status e_event_new(cdev *dev, cdev_event **out)
{
    if (!(*out = calloc(1, sizeof **out))) return fail(dev, ALLOY_ERR_OOM, "%s", "out of memory");
    return ALLOY_OK;
}

static alloy_status e_event_record(cdev *dev, cdev_event *ev)
{
    if (emu_of(dev)->capturing) return fail(dev, ALLOY_ERR_CUDA, "%s", "an event recorded while capturing");
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    ev->seconds = (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
    ev->recorded = true;
    emu_of(dev)->stats.events++, totals.events++;
    return ALLOY_OK;
}

static alloy_status e_event_elapsed(cdev *dev, cdev_event *start, cdev_event *end, float *ms)
{
    if (!start->recorded || !end->recorded) return fail(dev, ALLOY_ERR_CUDA, "%s", "elapsed time of an event never recorded");
    *ms = (float)(1e3 * (end->seconds - start->seconds));
    return ALLOY_OK;
}

static void e_event_free(cdev *dev, cdev_event *ev)
{
    (void)dev;
    free(ev);
}

static void e_describe(cdev *dev, const cdev_extent *ext, int n)
{
    emu_dev *d = emu_of(dev);
    emu_action_free(&d->pending);
    d->pending = emu_action_copy(ext, n);
}

static void e_step_begin(cdev *dev, const cdev_ptr *fresh, int n)
{
    emu_action_free(&emu_of(dev)->pending); /* none left over: a step's first calls (staging copies) have none */
    emu_slots_step_begin(fresh, n);
}

static void e_close(cdev *dev)
{
    emu_action_free(&emu_of(dev)->pending);
    free_graph(emu_of(dev)->capturing);
    free(dev);
}

static const cdev_ops emu_ops = {
    .alloc = e_alloc,
    .release = e_release,
    .upload = e_upload,
    .download = e_download,
    .copy = e_copy,
    .zero = e_zero,
    .load = e_load,
    .load_image = e_load_image,
    .function = e_function,
    .unload = e_unload,
    .launch = e_launch,
    .gemm_prepare = e_gemm_prepare,
    .gemm = e_gemm,
    .gemm_free = e_gemm_free,
    .capture_begin = e_capture_begin,
    .capture_end = e_capture_end,
    .replay = e_replay,
    .graph_free = e_graph_free,
    .sync = e_sync,
    .stream = e_stream,
    .close = e_close,
    .event_new = e_event_new,
    .event_record = e_event_record,
    .event_elapsed = e_event_elapsed,
    .event_free = e_event_free,
    .describe = e_describe,
    .step_begin = e_step_begin,
};

cdev *emu_device_open(int sm, char *err, size_t errlen)
{
    if (!emu_available(err, errlen)) return NULL;
    emu_dev *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    d->base.ops = &emu_ops;
    d->stream = (emu_stream){EMU_STREAM_MAGIC, stream_enqueue};
    d->base.sm = sm;
    d->base.image_kind = BUNDLE_HOST;
    d->base.driver = driver_version;
    snprintf(d->base.name, sizeof d->base.name, "host emulation of CUDA (sm_%d)", sm);
    return &d->base;
}

emu_device_stats emu_device_get_stats(const cdev *dev) { return ((const emu_dev *)dev)->stats; }

alloy_status emu_backend_opener(const al_options *cfg, rt_backend **out, char *err, size_t errlen)
{
    cdev *dev = emu_device_open(90, err, errlen);
    if (!dev) return ALLOY_ERR_UNSUPPORTED;
    dev->ordinal = cfg->cuda_device > 0 ? cfg->cuda_device : 0; /* as the driver's device takes it */
    return cuda_backend_open_on(cfg, dev, out, err, errlen);
}

emu_device_stats emu_totals(void) { return totals; }

alloy_status emu_bundle_images(const al_options *cfg, const char *archs, int nmodules, const char *const *names,
                               const char *const *sources, bundle_cuda *x, char *err, size_t errlen)
{
    (void)cfg;
    if (strcmp(archs, "host") != 0) {
        snprintf(err, errlen, "the emulation's image builder takes archs \"host\", not \"%s\"", archs);
        return ALLOY_ERR_INVALID;
    }
    if (!(x->images = al_calloc((size_t)nmodules, sizeof *x->images))) return ALLOY_ERR_OOM;
    for (int m = 0; m < nmodules; m++) {
        unsigned char *bytes;
        size_t len;
        char why[2048];
        if (emu_build_image(sources[m], &bytes, &len, why, sizeof why)) {
            snprintf(err, errlen, "module %s: %.1500s", names[m], why);
            return ALLOY_ERR_NVRTC;
        }
        uint8_t *data = al_malloc(len); /* bundle_cuda_free frees with al_free */
        if (data) memcpy(data, bytes, len);
        free(bytes);
        if (!data) return ALLOY_ERR_OOM;
        x->images[x->nimages++] = (bundle_image){BUNDLE_HOST, 0, (uint32_t)m, data, len};
    }
    x->min_driver = 1000; /* the reader's floor; an emulated device has no driver */
    return ALLOY_OK;
}
