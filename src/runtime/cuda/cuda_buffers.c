/* cuda_buffers.c - the CUDA backend's device memory: allocations counted for the memory query, the device's errors as the backend's, and the buffers of the backend interface with their copies to and from the host. */
#include "runtime/cuda/cuda_exec.h"

/* Device memory through the backend, counted for cu_memory. */
alloy_status cu_dev_alloc(rt_backend *b, size_t bytes, cdev_ptr *out)
{
    cuda_backend *cb = (cuda_backend *)b;
    alloy_status st = cb->dev->ops->alloc(cb->dev, bytes, out);
    if (!st) {
        cb->in_use += bytes;
        if (cb->in_use > cb->peak) cb->peak = cb->in_use;
    }
    return st;
}

/* Frees device memory cu_dev_alloc gave (ptr 0: none), taking its bytes off the count. */
void cu_dev_release(rt_backend *b, cdev_ptr ptr, size_t bytes)
{
    cuda_backend *cb = (cuda_backend *)b;
    if (!ptr) return;
    cb->dev->ops->release(cb->dev, ptr);
    cb->in_use -= bytes;
}

/* The device bytes allocated through the backend now, and at most (with the device's own). */
void cu_memory(const rt_backend *b, size_t *in_use, size_t *peak)
{
    const cuda_backend *cb = (const cuda_backend *)b;
    *in_use = cb->in_use, *peak = cb->peak;
}

/* The device's last error as the backend's, with status. */
alloy_status cu_dev_fail(rt_backend *b, alloy_status st, const char *what)
{
    return rt_fail(b, st, "cuda: %s: %s", what, cu_device_of(b)->error);
}

/* A buffer of bytes on the device (0: no allocation). */
alloy_status cu_buffer_new(rt_backend *b, size_t bytes, rt_buffer **out)
{
    *out = al_calloc(1, sizeof **out);
    if (!*out) return rt_fail(b, ALLOY_ERR_OOM, "cuda: out of host memory for a buffer");
    (*out)->bytes = bytes;
    alloy_status st = bytes ? cu_dev_alloc(b, bytes, &(*out)->ptr) : ALLOY_OK;
    if (st) {
        al_free(*out);
        *out = NULL;
        return cu_dev_fail(b, st, "a buffer");
    }
    return ALLOY_OK;
}

/* Frees buf (NULL: nothing). */
void cu_buffer_free(rt_backend *b, rt_buffer *buf)
{
    if (!buf) return;
    cu_dev_release(b, buf->ptr, buf->bytes);
    al_free(buf);
}

/* Copies bytes from the host into dst; more than dst holds is an error. */
alloy_status cu_upload(rt_backend *b, rt_buffer *dst, const void *src, size_t bytes)
{
    if (bytes > dst->bytes)
        return rt_fail(b, ALLOY_ERR_INVALID, "cuda: upload of %zu bytes into a buffer of %zu", bytes, dst->bytes);
    cdev *dev = cu_device_of(b);
    alloy_status st = bytes ? dev->ops->upload(dev, dst->ptr, src, bytes) : ALLOY_OK;
    return st ? cu_dev_fail(b, st, "upload") : ALLOY_OK;
}

/* Copies bytes of src to the host; more than src holds is an error. */
alloy_status cu_download(rt_backend *b, const rt_buffer *src, void *dst, size_t bytes)
{
    if (bytes > src->bytes)
        return rt_fail(b, ALLOY_ERR_INVALID, "cuda: download of %zu bytes from a buffer of %zu", bytes, src->bytes);
    cdev *dev = cu_device_of(b);
    alloy_status st = bytes ? dev->ops->download(dev, dst, src->ptr, bytes) : ALLOY_OK;
    return st ? cu_dev_fail(b, st, "download") : ALLOY_OK;
}
