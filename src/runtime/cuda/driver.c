/* driver.c - loading libcuda.so.1 and its entry points at CUDA 12.0's ABI (driver.h). */
#include <dlfcn.h>
#include <string.h>

#include "runtime/cuda/driver.h"

typedef CUresult (*get_proc_fn)(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                CUdriverProcAddressQueryResult *status);

const char *cu_driver_error(const cu_driver *d, CUresult r, char *buf, size_t len)
{
    const char *name = NULL, *text = NULL;
    if (d && d->cuGetErrorName) d->cuGetErrorName(r, &name);
    if (d && d->cuGetErrorString) d->cuGetErrorString(r, &text);
    if (name) al_fmt(buf, len, "%s (%s)", name, text ? text : "no description");
    else al_fmt(buf, len, "CUDA driver error %d", (int)r);
    return buf;
}

/* The library stays loaded for the process (no dlclose): unloading libcuda.so.1 each time a
 * graph closes its device and loading it again at the next is slow and leaves the driver's
 * threads and atexit handlers pointing into unmapped code; a second dlopen only counts up. */
void cu_driver_close(cu_driver *d)
{
    if (!d) return;
    al_free(d);
}

alloy_status cu_driver_open(const char *path, cu_driver **out, char *err, size_t errlen)
{
    *out = NULL;
    const char *lib = path && *path ? path : "libcuda.so.1";
    cu_driver *d = al_calloc(1, sizeof *d);
    if (!d) {
        al_fmt(err, errlen, "out of memory loading the CUDA driver");
        return ALLOY_ERR_OOM;
    }
    d->library = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!d->library) {
        const char *why = dlerror();
        al_fmt(err, errlen, "no NVIDIA driver: %s", why ? why : lib);
        cu_driver_close(d);
        return ALLOY_ERR_UNSUPPORTED;
    }
    get_proc_fn get;
    *(void **)&get = dlsym(d->library, "cuGetProcAddress_v2");
    if (!get) {
        al_fmt(err, errlen, "%s has no cuGetProcAddress_v2: the driver is older than CUDA 12.0", lib);
        cu_driver_close(d);
        return ALLOY_ERR_UNSUPPORTED;
    }
    CUresult r;
    CUdriverProcAddressQueryResult found;
#define CU_DRIVER_LOAD(name, params)                                                                           \
    r = get(#name, (void **)&d->name, CU_DRIVER_ABI, CU_GET_PROC_ADDRESS_DEFAULT, &found);                     \
    if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || !d->name) {                               \
        if (r == CUDA_ERROR_STUB_LIBRARY)                                                                      \
            al_fmt(err, errlen, "%s is the CUDA toolkit's stub library, not an NVIDIA driver", lib);         \
        else                                                                                                   \
            al_fmt(err, errlen, "the CUDA driver %s has no %s at CUDA %d.%d's ABI (error %d, status %d): "     \
                   "update the driver", lib, #name, CU_DRIVER_ABI / 1000, CU_DRIVER_ABI % 1000 / 10, (int)r,   \
                   (int)found);                                                                                \
        cu_driver_close(d);                                                                                    \
        return ALLOY_ERR_UNSUPPORTED;                                                                          \
    }
    CU_DRIVER_ENTRIES(CU_DRIVER_LOAD)
#undef CU_DRIVER_LOAD
    if ((r = d->cuInit(0)) != CUDA_SUCCESS) {
        char why[160];
        al_fmt(err, errlen, "the CUDA driver %s did not initialize: %s", lib, cu_driver_error(d, r, why, sizeof why));
        cu_driver_close(d);
        return ALLOY_ERR_UNSUPPORTED;
    }
    d->cuDriverGetVersion(&d->version);
    *out = d;
    return ALLOY_OK;
}
