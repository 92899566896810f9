/* cuda_backend.c - the CUDA backend behind the backend interface: a compiled step is its kernels loaded on a device (emitted and compiled now, or a bundle's images) and its launch plan, replayed each run (captured once and replayed as one graph where the device can). Here: the interface's table and opening the backend; its memory in cuda_buffers.c, building a step in cuda_build.c, running it in cuda_run.c. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_exec.h"

static const char *device_name(const rt_backend *b) { return ((const cuda_backend *)b)->dev->name; }

static alloy_status compile(rt_backend *b, const ir_graph *g, const schedule *s, const mem_plan *p, rt_exec **out)
{
    return cu_build(b, g, s, p, NULL, out);
}

/* A bundle's step: from its kernel table and images when it has them (no
 * emitter, no compiler); else (saved without archs, or before the kernel
 * table) compiled as a graph is, which liballoy-runtime refuses. */
static alloy_status exec_load(rt_backend *b, const ir_graph *g, const schedule *s, const mem_plan *p,
                              const bundle_cuda *x, rt_exec **out)
{
    if (x && x->nimages && x->has_kernels) return cu_build(b, g, s, p, x, out);
    return compile(b, g, s, p, out);
}

static void close_backend(rt_backend *b)
{
    cdev *dev = cu_device_of(b);
    cu_coll_close(((cuda_backend *)b)->coll); /* the communicator before its device */
    if (dev) dev->ops->close(dev);
    al_free(b);
}

static bool device_caps(const rt_backend *b, int *sm, int *driver)
{
    const cdev *dev = ((const cuda_backend *)b)->dev;
    *sm = dev->sm, *driver = dev->driver;
    return dev->sm > 0 && !dev->image_kind; /* an emulated device's images are its own */
}

static const rt_backend_ops cuda_ops_table = {
    .name = "cuda",
    .buffer_new = cu_buffer_new,
    .buffer_free = cu_buffer_free,
    .upload = cu_upload,
    .download = cu_download,
    .compile = compile,
    .run = cu_run,
    .exec_free = cu_exec_free,
    .read_flags = cu_read_flags,
    .exec_load = exec_load,
    .close = close_backend,
    .device_caps = device_caps,
    .memory = cu_memory,
    .device_name = device_name,
};

alloy_status cuda_backend_open_on(const al_options *cfg, cdev *dev, rt_backend **out, char *err, size_t errlen)
{
    cuda_backend *cb = al_calloc(1, sizeof *cb);
    *out = NULL;
    if (!cb) {
        dev->ops->close(dev);
        al_fmt(err, errlen, "cuda: out of memory opening the backend");
        return ALLOY_ERR_OOM;
    }
    if (dev->driver && dev->driver < CUDA_MIN_DRIVER) {
        al_fmt(err, errlen,
               "the NVIDIA driver supports CUDA %d.%d; the CUDA backend needs %d.%d or newer (kernel parameter "
               "lists over 4 KB): update the driver",
               dev->driver / 1000, dev->driver % 1000 / 10, CUDA_MIN_DRIVER / 1000, CUDA_MIN_DRIVER % 1000 / 10);
        dev->ops->close(dev);
        al_free(cb);
        return ALLOY_ERR_UNSUPPORTED;
    }
    const char *sync = getenv("ALLOY_CUDA_SYNC");
    cb->sync_each = sync && *sync && strcmp(sync, "0") != 0;
    cb->base.ops = &cuda_ops_table;
    cb->base.cfg = *cfg;
    cb->dev = dev;
    cb->in_use = cb->peak = dev->reserved;
    *out = &cb->base;
    return ALLOY_OK;
}
