/* driver_device.c - device.h on a real GPU: the driver's memory, stream and modules, kernels compiled by NVRTC through the kernel cache, GEMMs by cuBLASLt, a step captured into one CUDA graph. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cache.h"
#include "codegen/nvrtc.h"
#include "runtime/cuda/blaslt.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/driver.h"

/* Kernels kept in memory by the process's cache (the disk holds the rest). */
#define DRV_MEM_CACHE (64u << 20)
#define DRV_DISK_CACHE (1ull << 30)

typedef struct drv_device {
    cdev base;
    cu_driver *drv;
    blt_library *blt;
    cg_nvrtc *nv;
    cg_cache *cache; /* NULL: no cache */
    CUdevice device;
    CUcontext ctx;
    CUstream stream;
    CUdeviceptr workspace;
    char dump_dir[1024];
    int nthreads;
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

static alloy_status d_load(cdev *dev, int n, const char *const *names, const char *const *sources, cdev_module **out)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    cg_kernel_src *ks = al_calloc((size_t)n + 1, sizeof *ks);
    cg_binary *bins = al_calloc((size_t)n + 1, sizeof *bins);
    if (!ks || !bins) {
        al_free(ks), al_free(bins);
        al_fmt(dev->error, sizeof dev->error, "out of memory compiling %d modules", n);
        return ALLOY_ERR_OOM;
    }
    for (int i = 0; i < n; i++) ks[i] = (cg_kernel_src){.name = names[i], .source = sources[i], .sm = dev->sm};
    const char *dump = d->dump_dir[0] ? d->dump_dir : NULL;
    st = d->cache ? cg_cache_compile_many(d->cache, d->nv, ks, n, d->nthreads, dump, bins)
                  : cg_nvrtc_compile_many(d->nv, ks, n, d->nthreads, dump, bins);
    for (int i = 0; i < n; i++) {
        if (bins[i].status) {
            if (!st) st = bins[i].status;
            al_fmt(dev->error, sizeof dev->error, "module %s for sm_%d: %s", names[i], dev->sm,
                   bins[i].message ? bins[i].message : "failed to compile");
            break;
        }
        CUmodule m;
        CUresult r = d->drv->cuModuleLoadData(&m, bins[i].data);
        if (r != CUDA_SUCCESS) {
            char what[160];
            al_fmt(what, sizeof what, "loading module %s (%s for %s_%d)", names[i],
                   bins[i].kind == CG_CUBIN ? "CUBIN" : "PTX", bins[i].kind == CG_CUBIN ? "sm" : "compute", bins[i].arch);
            st = drv_fail(d, r, what);
            break;
        }
        out[i] = (cdev_module *)m;
    }
    for (int i = 0; i < n; i++) cg_binary_free(&bins[i]);
    al_free(ks), al_free(bins);
    return st;
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

static alloy_status d_gemm(cdev *dev, cdev_gemm *h, cdev_ptr a, cdev_ptr b, cdev_ptr out)
{
    drv_device *d = drv_of(dev);
    alloy_status st = current(d);
    if (st) return st;
    return blt_gemm_run(d->blt, &h->g, (const void *)(uintptr_t)a, (const void *)(uintptr_t)b, (void *)(uintptr_t)out,
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
    if (d->cache) cg_cache_close(d->cache);
    if (d->nv) cg_nvrtc_close(d->nv);
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

alloy_status cdev_open_driver(const char *nvrtc_path, const char *cache_dir, const char *dump_dir, int nthreads,
                              cdev **out, char *err, size_t errlen)
{
    *out = NULL;
    drv_device *d = al_calloc(1, sizeof *d);
    if (!d) {
        al_fmt(err, errlen, "out of memory opening the GPU");
        return ALLOY_ERR_OOM;
    }
    d->base.ops = &driver_ops;
    d->nthreads = nthreads;
    if (dump_dir) al_fmt(d->dump_dir, sizeof d->dump_dir, "%s", dump_dir);
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
    int major = 0, minor = 0;
    char name[96] = "";
    if ((r = d->drv->cuDeviceGet(&d->device, 0)) || (r = d->drv->cuDeviceGetName(name, sizeof name, d->device)) ||
        (r = d->drv->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->device)) ||
        (r = d->drv->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->device)))
        return open_fail(d, r, "querying GPU 0", err, errlen);
    d->base.sm = major * 10 + minor;
    if ((r = d->drv->cuDevicePrimaryCtxRetain(&d->ctx, d->device))) {
        d->ctx = NULL;
        return open_fail(d, r, "creating a context on GPU 0", err, errlen);
    }
    if ((r = d->drv->cuCtxSetCurrent(d->ctx)) || (r = d->drv->cuStreamCreate(&d->stream, CU_STREAM_NON_BLOCKING)))
        return open_fail(d, r, "creating a stream on GPU 0", err, errlen);
    if ((r = d->drv->cuMemAlloc(&d->workspace, BLT_WORKSPACE)))
        return open_fail(d, r, "allocating cuBLASLt's 32 MiB workspace", err, errlen);
    d->base.reserved = BLT_WORKSPACE;
    char msg[512];
    if ((st = blt_open(&d->blt, msg, sizeof msg))) {
        al_fmt(err, errlen, "%s", msg);
        d_close(&d->base);
        return st;
    }
    if ((st = cg_nvrtc_open(nvrtc_path && *nvrtc_path ? nvrtc_path : NULL, &d->nv, msg, sizeof msg))) {
        al_fmt(err, errlen, "NVRTC, which compiles alloy's kernels, is not available: %s", msg);
        d_close(&d->base);
        return st == ALLOY_ERR_OOM ? st : ALLOY_ERR_UNSUPPORTED;
    }
    if (cache_dir && (st = cg_cache_open(*cache_dir ? cache_dir : NULL, DRV_MEM_CACHE, DRV_DISK_CACHE, &d->cache, msg,
                                         sizeof msg))) {
        al_fmt(err, errlen, "the kernel cache: %s", msg);
        d_close(&d->base);
        return st;
    }
    d->base.driver = d->drv->version;
    int nv_major, nv_minor;
    cg_nvrtc_version(d->nv, &nv_major, &nv_minor);
    al_fmt(d->base.name, sizeof d->base.name, "%s (sm_%d, driver %d.%d, NVRTC %d.%d, cuBLASLt %zu)", name, d->base.sm,
           d->drv->version / 1000, d->drv->version % 1000 / 10, nv_major, nv_minor, d->blt->version);
    *out = &d->base;
    return ALLOY_OK;
}

alloy_status cuda_backend_open(const al_options *cfg, rt_backend **out, char *err, size_t errlen)
{
    *out = NULL;
    char dir[OPT_PATH_MAX + 16] = "";
    if (cfg->cache) {
        alloy_status st = cg_cache_default_dir(cfg->cache_dir, getenv("XDG_CACHE_HOME"), getenv("HOME"), dir, sizeof dir);
        if (st == ALLOY_ERR_INVALID) {
            al_fmt(err, errlen, "cuda: the kernel cache directory is longer than %zu bytes", sizeof dir - 1);
            return st;
        }
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cfg->num_threads > 0 ? cfg->num_threads : cpus > 0 ? (int)cpus : 1;
    cdev *dev;
    alloy_status st = cdev_open_driver(cfg->nvrtc, cfg->cache ? dir : NULL, cfg->dump_dir, threads, &dev, err, errlen);
    if (st) return st;
    return cuda_backend_open_on(cfg, dev, out, err, errlen);
}
