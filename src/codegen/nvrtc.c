/* nvrtc.c - NVRTC through dlopen: loading, choosing CUBIN or PTX, compiling one kernel or many on a thread pool. */
#define _GNU_SOURCE /* dlinfo */
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "codegen/nvrtc.h"

/* The part of nvrtc.h alloy uses, declared here so that alloy builds without the toolkit. */
typedef int nvrtc_result; /* nvrtcResult, an enum */
typedef struct nvrtc_program_impl *nvrtc_program;
#define NVRTC_SUCCESS 0
#define NVRTC_ERROR_OUT_OF_MEMORY 1

/* Every entry point, as X(field, symbol suffix). */
#define NVRTC_ENTRY_POINTS(X)                                                                                  \
    X(get_error_string, GetErrorString)                                                                        \
    X(version, Version)                                                                                        \
    X(num_supported_archs, GetNumSupportedArchs)                                                               \
    X(supported_archs, GetSupportedArchs)                                                                      \
    X(create_program, CreateProgram)                                                                           \
    X(destroy_program, DestroyProgram)                                                                         \
    X(compile_program, CompileProgram)                                                                         \
    X(ptx_size, GetPTXSize)                                                                                    \
    X(ptx, GetPTX)                                                                                             \
    X(cubin_size, GetCUBINSize)                                                                                \
    X(cubin, GetCUBIN)                                                                                         \
    X(log_size, GetProgramLogSize)                                                                             \
    X(log, GetProgramLog)

typedef struct nvrtc_api {
    const char *(*get_error_string)(nvrtc_result);
    nvrtc_result (*version)(int *major, int *minor);
    nvrtc_result (*num_supported_archs)(int *n);
    nvrtc_result (*supported_archs)(int *archs);
    nvrtc_result (*create_program)(nvrtc_program *prog, const char *src, const char *name, int nheaders,
                                   const char *const *headers, const char *const *include_names);
    nvrtc_result (*destroy_program)(nvrtc_program *prog);
    nvrtc_result (*compile_program)(nvrtc_program prog, int nopts, const char *const *opts);
    nvrtc_result (*ptx_size)(nvrtc_program prog, size_t *size);
    nvrtc_result (*ptx)(nvrtc_program prog, char *ptx);
    nvrtc_result (*cubin_size)(nvrtc_program prog, size_t *size);
    nvrtc_result (*cubin)(nvrtc_program prog, char *cubin);
    nvrtc_result (*log_size)(nvrtc_program prog, size_t *size);
    nvrtc_result (*log)(nvrtc_program prog, char *log);
} nvrtc_api;

static const struct {
    const char *symbol;
    size_t offset;
} entry_points[] = {
#define ENTRY(field, suffix) {"nvrtc" #suffix, offsetof(nvrtc_api, field)},
    NVRTC_ENTRY_POINTS(ENTRY)
#undef ENTRY
};

/* The sonames tried without a path, newest first (PyTorch's LazyNVRTC order). */
static const char *const sonames[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"};

struct cg_nvrtc {
    void *lib;
    nvrtc_api api;
    int major, minor;
    int narchs;
    int *archs;
    bool minimal; /* pass --minimal (NVRTC 12.4+): less to parse, same code */
    char library[512];
    char id[64];
};

/* ---- the allocator under a lock ---- */

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;

void *cg_realloc(void *ptr, size_t size)
{
    pthread_mutex_lock(&alloc_lock);
    void *p = al_realloc(ptr, size);
    pthread_mutex_unlock(&alloc_lock);
    return p;
}

void *cg_malloc(size_t size) { return size ? cg_realloc(NULL, size) : NULL; }

void cg_free(void *ptr)
{
    if (ptr) cg_realloc(ptr, 0);
}

char *cg_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = cg_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* ---- results ---- */

alloy_status cg_binary_fail(cg_binary *b, alloy_status status, char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    cg_free(b->message);
    b->message = n >= 0 ? cg_malloc((size_t)n + 1) : NULL;
    if (b->message) {
        va_start(ap, fmt);
        vsnprintf(b->message, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->status = status;
    cg_free(b->data);
    b->data = NULL;
    b->size = 0;
    al_fmt(err, errlen, "%s", b->message ? b->message : "out of memory formatting an NVRTC error");
    return status;
}

void cg_binary_free(cg_binary *b)
{
    if (!b) return;
    cg_free(b->data);
    cg_free(b->options);
    cg_free(b->log);
    cg_free(b->message);
    memset(b, 0, sizeof *b);
}

/* ---- loading ---- */

/* dlopen, first looking for a copy already loaded. RTLD_NODELETE: NVRTC
 * stays mapped after the last dlclose, since its C++ runtime's buffers (a
 * 72 KB exception pool) would outlive their code (LeakSanitizer reports
 * them), and loading it again costs ~6 ms. */
static void *load(const char *name)
{
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE | RTLD_NOLOAD);
    return lib ? lib : dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

alloy_status cg_nvrtc_open(const char *path, cg_nvrtc **out, char *err, size_t errlen)
{
    *out = NULL;
    void *lib = NULL;
    const char *name = path;
    if (path) {
        lib = load(path);
        if (!lib) {
            al_fmt(err, errlen, "cannot load NVRTC from %s: %s", path, dlerror());
            return ALLOY_ERR_UNSUPPORTED;
        }
    } else {
        char first[256] = "";
        for (size_t i = 0; i < sizeof sonames / sizeof *sonames && !lib; i++) {
            name = sonames[i];
            lib = load(name);
            if (!lib && !first[0]) al_fmt(first, sizeof first, "%s", dlerror());
        }
        if (!lib) {
            al_fmt(err, errlen,
                    "NVRTC not found: tried libnvrtc.so.13, libnvrtc.so.12 and libnvrtc.so.11.2 on the dynamic "
                    "loader's search path (RUNPATH, LD_LIBRARY_PATH, /etc/ld.so.cache, /lib, /usr/lib): %s",
                    first);
            return ALLOY_ERR_UNSUPPORTED;
        }
    }
    cg_nvrtc *nv = cg_malloc(sizeof *nv);
    if (!nv) {
        dlclose(lib);
        al_fmt(err, errlen, "out of memory loading NVRTC");
        return ALLOY_ERR_OOM;
    }
    memset(nv, 0, sizeof *nv);
    nv->lib = lib;
    struct link_map *map = NULL;
    if (dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && map->l_name[0]) name = map->l_name;
    al_fmt(nv->library, sizeof nv->library, "%s", name);
    for (size_t i = 0; i < sizeof entry_points / sizeof *entry_points; i++) {
        void *sym = dlsym(lib, entry_points[i].symbol);
        if (!sym) {
            al_fmt(err, errlen, "%s is not a usable NVRTC (11.2 or newer): it has no symbol %s", nv->library,
                    entry_points[i].symbol);
            cg_nvrtc_close(nv);
            return ALLOY_ERR_UNSUPPORTED;
        }
        /* memcpy: ISO C has no conversion from an object pointer to a function pointer */
        memcpy((char *)&nv->api + entry_points[i].offset, &sym, sizeof sym);
    }
    struct stat st;
    long long size = stat(nv->library, &st) == 0 ? (long long)st.st_size : 0;

    int n = 0;
    if (nv->api.version(&nv->major, &nv->minor) != NVRTC_SUCCESS || nv->api.num_supported_archs(&n) != NVRTC_SUCCESS ||
        n <= 0 || n > 1000) {
        al_fmt(err, errlen, "%s: nvrtcVersion or nvrtcGetNumSupportedArchs failed", nv->library);
        cg_nvrtc_close(nv);
        return ALLOY_ERR_UNSUPPORTED;
    }
    nv->archs = cg_malloc((size_t)n * sizeof *nv->archs);
    if (!nv->archs) {
        al_fmt(err, errlen, "out of memory loading NVRTC");
        cg_nvrtc_close(nv);
        return ALLOY_ERR_OOM;
    }
    if (nv->api.supported_archs(nv->archs) != NVRTC_SUCCESS) {
        al_fmt(err, errlen, "%s: nvrtcGetSupportedArchs failed", nv->library);
        cg_nvrtc_close(nv);
        return ALLOY_ERR_UNSUPPORTED;
    }
    nv->narchs = n;
    qsort(nv->archs, (size_t)n, sizeof *nv->archs, cmp_int);
    /* --minimal leaves out textures, surfaces and device-side launches,
     * which generated kernels do not use. Checked with NVRTC 13.0: the same
     * sm_90 CUBIN, byte for byte, for an elementwise kernel, 18 ms instead of 21. */
    nv->minimal = nv->major > 12 || (nv->major == 12 && nv->minor >= 4);
    al_fmt(nv->id, sizeof nv->id, "nvrtc %d.%d size %lld", nv->major, nv->minor, size);
    *out = nv;
    return ALLOY_OK;
}

void cg_nvrtc_close(cg_nvrtc *nv)
{
    if (!nv) return;
    if (nv->lib) dlclose(nv->lib);
    cg_free(nv->archs);
    cg_free(nv);
}

void cg_nvrtc_version(const cg_nvrtc *nv, int *major, int *minor)
{
    *major = nv->major;
    *minor = nv->minor;
}

int cg_nvrtc_archs(const cg_nvrtc *nv, const int **archs)
{
    *archs = nv->archs;
    return nv->narchs;
}

const char *cg_nvrtc_library(const cg_nvrtc *nv) { return nv->library; }

const char *cg_nvrtc_id(const cg_nvrtc *nv) { return nv->id; }

/* ---- what to build ---- */

alloy_status cg_nvrtc_target(const cg_nvrtc *nv, int sm, cg_binary_kind *kind, int *arch, char *err, size_t errlen)
{
    if (sm < 10 || sm > 9999) {
        al_fmt(err, errlen, "sm_%d is not a compute capability (major*10+minor, e.g. 80 or 90)", sm);
        return ALLOY_ERR_INVALID;
    }
    int best = -1;
    for (int i = 0; i < nv->narchs; i++) {
        if (nv->archs[i] == sm) {
            *kind = CG_CUBIN;
            *arch = sm;
            return ALLOY_OK;
        }
        if (nv->archs[i] < sm) best = nv->archs[i];
    }
    if (best < 0) {
        al_fmt(err, errlen, "NVRTC %d.%d cannot build for sm_%d: its oldest architecture is sm_%d", nv->major,
                nv->minor, sm, nv->archs[0]);
        return ALLOY_ERR_UNSUPPORTED;
    }
    *kind = CG_PTX;
    *arch = best;
    return ALLOY_OK;
}

static bool good_name(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 100 || s[0] == '.') return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("_.-", s[i])) return false;
    return true;
}

/* The default options for kind/arch into opts (arch_opt holds the first);
 * returns how many. */
static int default_options(const cg_nvrtc *nv, cg_binary_kind kind, int arch, char arch_opt[48], const char *opts[4])
{
    al_fmt(arch_opt, 48, "--gpu-architecture=%s_%d", kind == CG_CUBIN ? "sm" : "compute", arch);
    int n = 0;
    opts[n++] = arch_opt;
    opts[n++] = "--std=c++17";
    opts[n++] = "-default-device";
    if (nv->minimal) opts[n++] = "--minimal";
    return n;
}

alloy_status cg_nvrtc_prepare(const cg_nvrtc *nv, const cg_kernel_src *k, cg_binary *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!good_name(k->name))
        return cg_binary_fail(out, ALLOY_ERR_INVALID, err, errlen,
                              "kernel name '%.100s' is not 1-100 characters of [A-Za-z0-9_.-] not starting with '.'",
                              k->name ? k->name : "(null)");
    if (!k->source)
        return cg_binary_fail(out, ALLOY_ERR_INVALID, err, errlen, "kernel %s has no source", k->name);
    if (k->noptions < 0 || (k->noptions > 0 && !k->options))
        return cg_binary_fail(out, ALLOY_ERR_INVALID, err, errlen, "kernel %s: bad option list", k->name);
    char msg[256];
    alloy_status st = cg_nvrtc_target(nv, k->sm, &out->kind, &out->arch, msg, sizeof msg);
    if (st) return cg_binary_fail(out, st, err, errlen, "kernel %s: %s", k->name, msg);
    if (k->ptx) out->kind = CG_PTX;

    char arch_opt[48];
    const char *defaults[4];
    int ndefaults = default_options(nv, out->kind, out->arch, arch_opt, defaults);
    size_t len = 1;
    for (int i = 0; i < ndefaults; i++) len += strlen(defaults[i]) + 1;
    for (int i = 0; i < k->noptions; i++) {
        const char *o = k->options[i];
        bool blank = !o || !o[0];
        for (const char *c = o; !blank && *c; c++) blank = isspace((unsigned char)*c);
        if (blank)
            return cg_binary_fail(out, ALLOY_ERR_INVALID, err, errlen,
                                  "kernel %s: option %d is empty or holds whitespace", k->name, i);
        len += strlen(o) + 1;
    }
    out->options = cg_malloc(len);
    if (!out->options) return cg_binary_fail(out, ALLOY_ERR_OOM, err, errlen, "out of memory");
    char *p = out->options;
    for (int i = 0; i < ndefaults + k->noptions; i++) {
        const char *o = i < ndefaults ? defaults[i] : k->options[i - ndefaults];
        size_t n = strlen(o);
        if (i) *p++ = ' ';
        memcpy(p, o, n);
        p += n;
    }
    *p = '\0';
    return ALLOY_OK;
}

alloy_status cg_nvrtc_dump(const char *dump_dir, const cg_kernel_src *k, char *path, size_t pathlen, char *err,
                           size_t errlen)
{
    if (!good_name(k->name)) {
        al_fmt(err, errlen, "kernel name '%.100s' is not a file name", k->name ? k->name : "(null)");
        return ALLOY_ERR_INVALID;
    }
    al_fmt(path, pathlen, "%s/%s.cu", dump_dir, k->name);
    if (mkdir(dump_dir, 0777) != 0 && errno != EEXIST) {
        al_fmt(err, errlen, "cannot make the kernel dump directory %s: %s", dump_dir, strerror(errno));
        return ALLOY_ERR_IO;
    }
    const void *part = k->source;
    size_t n = strlen(k->source);
    char msg[PATH_MAX + 256];
    alloy_status st = al_file_write(path, &part, &n, 1, 0, msg, sizeof msg);
    if (st) al_fmt(err, errlen, "the kernel source %s", msg);
    return st;
}

/* ---- compiling ---- */

/* The NVRTC calls of one compile go through this: a failure records which
 * call failed with NVRTC's message (and the log, once there is one). */
#define NVRTC_CHECK(symbol, call)                                                                              \
    do {                                                                                                       \
        nvrtc_result r_ = (call);                                                                              \
        if (r_ != NVRTC_SUCCESS) {                                                                             \
            st = nvrtc_failed(nv, out, r_, symbol, k, dumped, err, errlen);                                    \
            goto done;                                                                                         \
        }                                                                                                      \
    } while (0)

static alloy_status nvrtc_failed(const cg_nvrtc *nv, cg_binary *out, nvrtc_result r, const char *call,
                                 const cg_kernel_src *k, const char *dumped, char *err, size_t errlen)
{
    const char *what = nv->api.get_error_string(r);
    alloy_status st = r == NVRTC_ERROR_OUT_OF_MEMORY ? ALLOY_ERR_OOM : ALLOY_ERR_NVRTC;
    const char *log = out->log && out->log[0] ? out->log : "(NVRTC wrote no log)";
    return cg_binary_fail(out, st, err, errlen, "NVRTC could not compile kernel %s (%s; options: %s): %s in %s%s%s\n%s",
                          k->name, out->kind == CG_CUBIN ? "cubin" : "ptx", out->options, what ? what : "?", call,
                          dumped[0] ? "; source: " : "", dumped, log);
}

alloy_status cg_nvrtc_compile(const cg_nvrtc *nv, const cg_kernel_src *k, const char *dump_dir, cg_binary *out,
                              char *err, size_t errlen)
{
    alloy_status st = cg_nvrtc_prepare(nv, k, out, err, errlen);
    if (st) return st;
    char dumped[512] = "", msg[768];
    if (dump_dir && (st = cg_nvrtc_dump(dump_dir, k, dumped, sizeof dumped, msg, sizeof msg)))
        return cg_binary_fail(out, st, err, errlen, "%s", msg);

    char arch_opt[48], progname[128];
    const char *defaults[4];
    int ndefaults = default_options(nv, out->kind, out->arch, arch_opt, defaults);
    const char **opts = cg_malloc((size_t)(ndefaults + k->noptions) * sizeof *opts);
    if (!opts) return cg_binary_fail(out, ALLOY_ERR_OOM, err, errlen, "out of memory");
    for (int i = 0; i < ndefaults + k->noptions; i++) opts[i] = i < ndefaults ? defaults[i] : k->options[i - ndefaults];
    al_fmt(progname, sizeof progname, "%s.cu", k->name);

    nvrtc_program prog = NULL;
    size_t size = 0;
    NVRTC_CHECK("nvrtcCreateProgram", nv->api.create_program(&prog, k->source, progname, 0, NULL, NULL));
    nvrtc_result compiled = nv->api.compile_program(prog, ndefaults + k->noptions, opts);
    NVRTC_CHECK("nvrtcGetProgramLogSize", nv->api.log_size(prog, &size));
    out->log = cg_malloc(size + 1);
    if (!out->log) {
        st = cg_binary_fail(out, ALLOY_ERR_OOM, err, errlen, "out of memory");
        goto done;
    }
    out->log[0] = '\0';
    if (size) NVRTC_CHECK("nvrtcGetProgramLog", nv->api.log(prog, out->log));
    out->log[size] = '\0';
    NVRTC_CHECK("nvrtcCompileProgram", compiled);
    if (out->kind == CG_CUBIN)
        NVRTC_CHECK("nvrtcGetCUBINSize", nv->api.cubin_size(prog, &size));
    else
        NVRTC_CHECK("nvrtcGetPTXSize", nv->api.ptx_size(prog, &size));
    out->data = cg_malloc(size ? size : 1);
    if (!out->data) {
        st = cg_binary_fail(out, ALLOY_ERR_OOM, err, errlen, "out of memory");
        goto done;
    }
    if (out->kind == CG_CUBIN)
        NVRTC_CHECK("nvrtcGetCUBIN", nv->api.cubin(prog, (char *)out->data));
    else
        NVRTC_CHECK("nvrtcGetPTX", nv->api.ptx(prog, (char *)out->data));
    out->size = size;
    if (size == 0) {
        st = cg_binary_fail(out, ALLOY_ERR_NVRTC, err, errlen, "NVRTC returned an empty binary for kernel %s",
                            k->name);
        goto done;
    }
    out->status = ALLOY_OK;
done:
    if (prog) nv->api.destroy_program(&prog);
    cg_free(opts);
    return st;
}

/* ---- the thread pool ---- */

typedef struct pool {
    int n, next;
    pthread_mutex_t lock;
    void (*body)(void *ctx, int i);
    void *ctx;
} pool;

static void *pool_worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        int i = p->next++;
        pthread_mutex_unlock(&p->lock);
        if (i >= p->n) return NULL;
        p->body(p->ctx, i);
    }
}

void cg_parallel(int n, int nthreads, void (*body)(void *ctx, int i), void *ctx)
{
    pool p = {.n = n, .body = body, .ctx = ctx};
    pthread_t threads[CG_MAX_THREADS];
    bool started[CG_MAX_THREADS] = {false};
    if (nthreads > n) nthreads = n;
    if (nthreads > CG_MAX_THREADS) nthreads = CG_MAX_THREADS;
    pthread_mutex_init(&p.lock, NULL);
    for (int t = 1; t < nthreads; t++) started[t] = pthread_create(&threads[t], NULL, pool_worker, &p) == 0;
    pool_worker(&p);
    for (int t = 1; t < nthreads; t++)
        if (started[t]) pthread_join(threads[t], NULL);
    pthread_mutex_destroy(&p.lock);
}

typedef struct compile_batch {
    const cg_nvrtc *nv;
    const cg_kernel_src *ks;
    const char *dump_dir;
    cg_binary *outs;
} compile_batch;

static void compile_one(void *ctx, int i)
{
    compile_batch *b = ctx;
    cg_nvrtc_compile(b->nv, &b->ks[i], b->dump_dir, &b->outs[i], NULL, 0);
}

alloy_status cg_nvrtc_compile_many(const cg_nvrtc *nv, const cg_kernel_src *ks, int n, int nthreads,
                                   const char *dump_dir, cg_binary *outs)
{
    compile_batch b = {nv, ks, dump_dir, outs};
    cg_parallel(n, nthreads, compile_one, &b);
    for (int i = 0; i < n; i++)
        if (outs[i].status) return outs[i].status;
    return ALLOY_OK;
}
