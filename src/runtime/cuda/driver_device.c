/* driver_device.c - device.h on a real GPU: the driver's memory, stream and modules (a bundle's cubins and PTX, or kernels compiled by driver_jit.h's NVRTC where the library has it), GEMMs by cuBLASLt, a step captured into one CUDA graph. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/bundle/bundle.h"
#include "runtime/cuda/blaslt.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/driver.h"
#include "runtime/cuda/driver_jit.h"

typedef struct drv_device {
    cdev base;
    cu_driver *drv;
    blt_library *blt;
    drv_jit *jit; /* NULL: this library compiles nothing (liballoy-runtime) */
    CUdevice device;
    CUcontext ctx;
    CUstream stream;
    CUdeviceptr workspace;
} drv_device;

struct cdev_gemm {
    blt_gemm g;
};

static drv_device *drv_of(cdev *dev) { return (drv_device *)dev; }

/* Records r's failure in what; the status for it (OOM for out-of-memory). */
static alloy_status drv_fail(drv_device *d, CUresult r, const char *what)
{
    char why[200];
    al_fmt(d->base.error, sizeof d->base.error, "%s: %s", what, cu_driver_error(d->drv, r, why, sizeof why));
    return r == CUDA_ERROR_OUT_OF_MEMORY ? ALLOY_ERR_OOM : ALLOY_ERR_CUDA;
}

#define DRV_CHECK(d, call, what)                              \
    do {                                                      \
        CUresult r_ = (call);                                 \
        if (r_ != CUDA_SUCCESS) return drv_fail(d, r_, what); \
    } while (0)

/* The device's context current on the calling thread (a user may run the graph from any thread). */
static alloy_status current(drv_device *d)
{
    DRV_CHECK(d, d->drv->cuCtxSetCurrent(d->ctx), "making the CUDA context current");
    return ALLOY_OK;
}

static alloy_status d_alloc(cdev *dev, size_t bytes, cdev_ptr *out)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    CUdeviceptr p = 0;
    CUresult r = d->drv->cuMemAlloc(&p, bytes);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        size_t free_b = 0, total = 0;
        d->drv->cuMemGetInfo(&free_b, &total);
        al_fmt(dev->error, sizeof dev->error, "out of GPU memory: asked %zu bytes, %zu of %zu free", bytes, free_b,
               total);
        return ALLOY_ERR_OOM;
    }
    if (r != CUDA_SUCCESS) return drv_fail(d, r, "cuMemAlloc");
    *out = (cdev_ptr)p;
    return ALLOY_OK;
}

static void d_release(cdev *dev, cdev_ptr ptr)
{
    drv_device *d = drv_of(dev);
    if (ptr && !current(d)) d->drv->cuMemFree((CUdeviceptr)ptr);
}

static alloy_status d_upload(cdev *dev, cdev_ptr dst, const void *src, size_t bytes)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    DRV_CHECK(d, d->drv->cuMemcpyHtoDAsync((CUdeviceptr)dst, src, bytes, d->stream), "copying to the GPU");
    DRV_CHECK(d, d->drv->cuStreamSynchronize(d->stream), "copying to the GPU");
    return ALLOY_OK;
}

static alloy_status d_download(cdev *dev, void *dst, cdev_ptr src, size_t bytes)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    DRV_CHECK(d, d->drv->cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, bytes, d->stream), "copying from the GPU");
    DRV_CHECK(d, d->drv->cuStreamSynchronize(d->stream), "copying from the GPU (or a kernel before it)");
    return ALLOY_OK;
}

static alloy_status d_copy(cdev *dev, cdev_ptr dst, cdev_ptr src, size_t bytes)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    DRV_CHECK(d, d->drv->cuMemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, bytes, d->stream), "cuMemcpyDtoDAsync");
    return ALLOY_OK;
}

static alloy_status d_zero(cdev *dev, cdev_ptr dst, size_t bytes)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    DRV_CHECK(d, d->drv->cuMemsetD8Async((CUdeviceptr)dst, 0, bytes, d->stream), "cuMemsetD8Async");
    return ALLOY_OK;
}

/* Loads module name from image (a cubin, or PTX the driver compiles). */
static alloy_status load_one(drv_device *d, const char *name, bool ptx, int arch, const void *image, cdev_module **out)
{
    CUmodule m;
    CUresult r = d->drv->cuModuleLoadData(&m, image);
    if (r != CUDA_SUCCESS) {
        char what[160];
        al_fmt(what, sizeof what, "loading module %s (%s for %s_%d)", name, ptx ? "PTX" : "CUBIN", ptx ? "compute" : "sm",
               arch);
        return drv_fail(d, r, what);
    }
    *out = (cdev_module *)m;
    return ALLOY_OK;
}

static alloy_status d_load(cdev *dev, int n, const char *const *names, const char *const *sources, cdev_module **out)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    drv_jit_image *images = al_calloc((size_t)n + 1, sizeof *images);
    if (!images) {
        al_fmt(dev->error, sizeof dev->error, "out of memory compiling %d modules", n);
        return ALLOY_ERR_OOM;
    }
    if (!d->jit) {
        al_fmt(dev->error, sizeof dev->error, "this library compiles no kernels (it has no NVRTC)");
        st = ALLOY_ERR_UNSUPPORTED;
    } else {
        st = drv_jit_compile(d->jit, dev->sm, n, names, sources, images, dev->error, sizeof dev->error);
    }
    for (int i = 0; !st && i < n; i++) st = load_one(d, names[i], images[i].ptx, images[i].arch, images[i].data, &out[i]);
    if (d->jit) drv_jit_images_free(images, n);
    al_free(images);
    return st;
}

static alloy_status d_load_image(cdev *dev, const char *name, uint32_t kind, const void *image, size_t size,
                                 cdev_module **out)
{
    drv_device *d = drv_of(dev);
    (void)size; /* a cubin is an ELF file and PTX NUL-terminated: the driver finds the end */
    if (kind != BUNDLE_CUBIN && kind != BUNDLE_PTX) {
        al_fmt(dev->error, sizeof dev->error, "module %s: image kind %u is not a cubin or PTX", name, kind);
        return ALLOY_ERR_INVALID;
    }
    alloy_status st = current(d);
    return st ? st : load_one(d, name, kind == BUNDLE_PTX, 0, image, out);
}

static alloy_status d_function(cdev *dev, cdev_module *m, const char *kernel, cdev_function **out)
{
    drv_device *d = drv_of(dev);
    CUfunction f;
    CUresult r = d->drv->cuModuleGetFunction(&f, (CUmodule)m, kernel);
    if (r != CUDA_SUCCESS) {
        char what[128];
        al_fmt(what, sizeof what, "kernel %s", kernel);
        return drv_fail(d, r, what);
    }
    *out = (cdev_function *)f;
    return ALLOY_OK;
}

static void d_unload(cdev *dev, cdev_module *m)
{
    drv_device *d = drv_of(dev);
    if (m && !current(d)) d->drv->cuModuleUnload((CUmodule)m);
}

static alloy_status d_launch(cdev *dev, cdev_function *f, unsigned grid, unsigned block, void **params, int nparams)
{
    drv_device *d = drv_of(dev);
    (void)nparams;
    alloy_status st = current(d); /* the calling thread may not be the one that opened the device */
    if (st) return st;
    DRV_CHECK(d, d->drv->cuLaunchKernel((CUfunction)f, grid, 1, 1, block, 1, 1, 0, d->stream, params, NULL),
              "cuLaunchKernel");
    return ALLOY_OK;
}

static alloy_status d_gemm_prepare(cdev *dev, const lp_gemm *gm, const int align[3], cdev_gemm **out)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    cdev_gemm *h = al_calloc(1, sizeof *h);
    if (!h) {
        al_fmt(dev->error, sizeof dev->error, "out of memory");
        return ALLOY_ERR_OOM;
    }
    if ((st = blt_gemm_prepare(d->blt, gm, align, &h->g, dev->error, sizeof dev->error))) {
        al_free(h);
        return st;
    }
    *out = h;
    return ALLOY_OK;
}

static alloy_status d_gemm(cdev *dev, cdev_gemm *h, cdev_ptr a, cdev_ptr b, cdev_ptr out, cdev_gemm_extra ex)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    return blt_gemm_run(d->blt, &h->g, (const void *)(uintptr_t)a, (const void *)(uintptr_t)b, (void *)(uintptr_t)out,
                        (const void *)(uintptr_t)ex.bias, (void *)(uintptr_t)ex.aux,
                        (void *)(uintptr_t)d->workspace, (cudaStream_t)d->stream, dev->error, sizeof dev->error);
}

static void d_gemm_free(cdev *dev, cdev_gemm *h)
{
    blt_gemm_release(drv_of(dev)->blt, &h->g);
    al_free(h);
}

static alloy_status d_capture_begin(cdev *dev)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    DRV_CHECK(d, d->drv->cuStreamBeginCapture(d->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
    return ALLOY_OK;
}

/* The captured graph instantiated; *out is the executable graph. */
static alloy_status d_capture_end(cdev *dev, void **out)
{
    drv_device *d = drv_of(dev);
    CUgraph graph = NULL;
    *out = NULL;
    DRV_CHECK(d, d->drv->cuStreamEndCapture(d->stream, &graph), "cuStreamEndCapture");
    CUgraphExec exec = NULL;
    CUresult r = d->drv->cuGraphInstantiateWithFlags(&exec, graph, 0);
    d->drv->cuGraphDestroy(graph);
    if (r != CUDA_SUCCESS) return drv_fail(d, r, "cuGraphInstantiate");
    *out = exec;
    return ALLOY_OK;
}

static alloy_status d_replay(cdev *dev, void *graph)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    DRV_CHECK(d, d->drv->cuGraphLaunch((CUgraphExec)graph, d->stream), "cuGraphLaunch");
    return ALLOY_OK;
}

static void d_graph_free(cdev *dev, void *graph)
{
    drv_device *d = drv_of(dev);
    if (graph) d->drv->cuGraphExecDestroy((CUgraphExec)graph);
}

static alloy_status d_sync(cdev *dev)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    DRV_CHECK(d, d->drv->cuStreamSynchronize(d->stream), "the step's kernels");
    return ALLOY_OK;
}

static alloy_status d_query(cdev *dev, bool *done)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    CUresult r = d->drv->cuStreamQuery(d->stream);
    *done = r != CUDA_ERROR_NOT_READY;
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) return drv_fail(d, r, "the step's kernels");
    return ALLOY_OK;
}

static void *d_stream(cdev *dev)
{
    drv_device *d = drv_of(dev);
    return current(d) ? NULL : (void *)d->stream;
}

static alloy_status d_event_new(cdev *dev, cdev_event **out)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    CUevent ev = NULL;
    DRV_CHECK(d, d->drv->cuEventCreate(&ev, CU_EVENT_DEFAULT), "cuEventCreate");
    *out = (cdev_event *)ev;
    return ALLOY_OK;
}

static alloy_status d_event_record(cdev *dev, cdev_event *ev)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    DRV_CHECK(d, d->drv->cuEventRecord((CUevent)ev, d->stream), "cuEventRecord");
    return ALLOY_OK;
}

static alloy_status d_event_elapsed(cdev *dev, cdev_event *start, cdev_event *end, float *ms)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    DRV_CHECK(d, d->drv->cuEventElapsedTime(ms, (CUevent)start, (CUevent)end), "cuEventElapsedTime");
    return ALLOY_OK;
}

static void d_event_free(cdev *dev, cdev_event *ev)
{
    drv_device *d = drv_of(dev);
    if (ev && !current(d)) d->drv->cuEventDestroy((CUevent)ev);
}

static void d_close(cdev *dev)
{
    drv_device *d = drv_of(dev);
    if (d->drv && d->ctx && !current(d)) {
        if (d->workspace) d->drv->cuMemFree(d->workspace);
        if (d->stream) d->drv->cuStreamDestroy(d->stream);
    }
    blt_close(d->blt);
    if (d->drv && d->ctx) d->drv->cuDevicePrimaryCtxRelease(d->device);
    drv_jit_close(d->jit);
    cu_driver_close(d->drv);
    al_free(d);
}

static const cdev_ops driver_ops = {
    .alloc = d_alloc,
    .release = d_release,
    .upload = d_upload,
    .download = d_download,
    .copy = d_copy,
    .zero = d_zero,
    .load = d_load,
    .load_image = d_load_image,
    .function = d_function,
    .unload = d_unload,
    .launch = d_launch,
    .gemm_prepare = d_gemm_prepare,
    .gemm = d_gemm,
    .gemm_free = d_gemm_free,
    .capture_begin = d_capture_begin,
    .capture_end = d_capture_end,
    .replay = d_replay,
    .graph_free = d_graph_free,
    .sync = d_sync,
    .query = d_query,
    .stream = d_stream,
    .close = d_close,
    .event_new = d_event_new,
    .event_record = d_event_record,
    .event_elapsed = d_event_elapsed,
    .event_free = d_event_free,
};

/* Fails the open: err from what and r, the device closed. */
static alloy_status open_fail(drv_device *d, CUresult r, const char *what, char *err, size_t errlen)
{
    char why[200];
    al_fmt(err, errlen, "%s: %s", what, cu_driver_error(d->drv, r, why, sizeof why));
    d_close(&d->base);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? ALLOY_ERR_OOM : ALLOY_ERR_UNSUPPORTED;
}

alloy_status cdev_open_driver(const al_options *cfg, int nthreads, cdev **out, char *err, size_t errlen)
{
    *out = NULL;
    drv_device *d = al_calloc(1, sizeof *d);
    if (!d) {
        al_fmt(err, errlen, "out of memory opening the GPU");
        return ALLOY_ERR_OOM;
    }
    d->base.ops = &driver_ops;
    alloy_status st = cu_driver_open(NULL, &d->drv, err, errlen);
    if (st) {
        al_free(d);
        return st;
    }
    int count = 0;
    CUresult r = d->drv->cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS) return open_fail(d, r, "counting GPUs", err, errlen);
    if (count < 1) {
        al_fmt(err, errlen, "the NVIDIA driver is installed but sees no GPU");
        d_close(&d->base);
        return ALLOY_ERR_UNSUPPORTED;
    }
    int ordinal = cfg->cuda_device > 0 ? cfg->cuda_device : 0;
    if (ordinal >= count) {
        al_fmt(err, errlen, "cuda_device %d: this machine has %d GPU%s (0 to %d)", ordinal, count, count == 1 ? "" : "s",
               count - 1);
        d_close(&d->base);
        return ALLOY_ERR_UNSUPPORTED;
    }
    d->base.ordinal = ordinal;
    int major = 0, minor = 0;
    char name[96] = "", what[64];
    al_fmt(what, sizeof what, "GPU %d", ordinal);
    if ((r = d->drv->cuDeviceGet(&d->device, ordinal)) || (r = d->drv->cuDeviceGetName(name, sizeof name, d->device)) ||
        (r = d->drv->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->device)) ||
        (r = d->drv->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->device)))
        return open_fail(d, r, what, err, errlen);
    d->base.sm = major * 10 + minor;
    if ((r = d->drv->cuDevicePrimaryCtxRetain(&d->ctx, d->device))) {
        d->ctx = NULL;
        return open_fail(d, r, "creating a context on the GPU", err, errlen);
    }
    if ((r = d->drv->cuCtxSetCurrent(d->ctx)) || (r = d->drv->cuStreamCreate(&d->stream, CU_STREAM_NON_BLOCKING)))
        return open_fail(d, r, "creating a stream on the GPU", err, errlen);
    if ((r = d->drv->cuMemAlloc(&d->workspace, BLT_WORKSPACE)))
        return open_fail(d, r, "allocating cuBLASLt's 32 MiB workspace", err, errlen);
    d->base.reserved = BLT_WORKSPACE;
    char msg[512];
    if ((st = blt_open(&d->blt, msg, sizeof msg))) {
        al_fmt(err, errlen, "%s", msg);
        d_close(&d->base);
        return st;
    }
    if ((st = drv_jit_open(cfg, nthreads, &d->jit, err, errlen))) {
        d_close(&d->base);
        return st;
    }
    d->base.driver = d->drv->version;
    char jit[64];
    drv_jit_describe(d->jit, jit, sizeof jit);
    char at[16] = ""; /* the ordinal where it is not the first GPU */
    if (ordinal) al_fmt(at, sizeof at, "GPU %d: ", ordinal);
    al_fmt(d->base.name, sizeof d->base.name, "%s%s (sm_%d, driver %d.%d%s, cuBLASLt %zu)", at, name, d->base.sm,
           d->drv->version / 1000, d->drv->version % 1000 / 10, jit, d->blt->version);
    *out = &d->base;
    return ALLOY_OK;
}

alloy_status cuda_backend_open(const al_options *cfg, rt_backend **out, char *err, size_t errlen)
{
    *out = NULL;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cfg->num_threads > 0 ? cfg->num_threads : cpus > 0 ? (int)cpus : 1;
    cdev *dev;
    alloy_status st = cdev_open_driver(cfg, threads, &dev, err, errlen);
    if (st) return st;
    return cuda_backend_open_on(cfg, dev, out, err, errlen);
}
