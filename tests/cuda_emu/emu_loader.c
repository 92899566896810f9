/* emu_loader.c - compiles a kernel source with the host C++ compiler against emu.h and loads it with dlopen (emu_loader.h). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/sha256.h"
#include "emu_loader.h"

#ifndef ALLOY_EMU_H
#error "the build passes -DALLOY_EMU_H=\"path/of/emu.h\""
#endif
/* Extra compiler flags: the sanitizers of a sanitized test build, so that the
 * kernels are checked too (they then need the same compiler's runtime). */
#ifndef ALLOY_EMU_CXXFLAGS
#define ALLOY_EMU_CXXFLAGS ""
#endif

extern char **environ;

typedef int (*launch_fn)(void (*)(void **), const unsigned[3], const unsigned[3], void **, char *, size_t);

struct emu_kernel {
    char dir[400]; /* kernel.cu and kernel.so stay until emu_free, for a sanitizer's stack traces */
    void *library;
    void (*entry)(void **);
    char name[128]; /* the selected kernel's, for errors */
    launch_fn launch;
    int (*check_global)(emu_global_check fn, void *ctx); /* emu_shadow.h's alloy_emu_check_global */
};

enum { max_words = 64 };

/* Splits text (modified) at blanks into words from index n; the new count. */
static int split_words(char *text, char **words, int n)
{
    char *save = NULL;
    for (char *w = strtok_r(text, " \t", &save); w && n < max_words - 8; w = strtok_r(NULL, " \t", &save))
        words[n++] = w;
    return n;
}

static const char *compiler(void)
{
    const char *cxx = getenv("CXX");
    return cxx && *cxx ? cxx : "c++";
}

/* Whether program (a path, or a name looked up in PATH) is executable. */
static bool on_path(const char *program)
{
    if (strchr(program, '/')) return access(program, X_OK) == 0;
    const char *path = getenv("PATH");
    char file[1024];
    for (const char *dir = path ? path : "/usr/bin:/bin"; *dir;) {
        size_t n = strcspn(dir, ":");
        snprintf(file, sizeof file, "%.*s/%s", (int)n, n ? dir : ".", program);
        if (access(file, X_OK) == 0) return true;
        dir += n + (dir[n] == ':');
    }
    return false;
}

bool emu_available(char *why, size_t len)
{
    char words[256];
    snprintf(words, sizeof words, "%s", compiler());
    char *save = NULL, *program = strtok_r(words, " \t", &save);
    if (program && on_path(program)) return true;
    snprintf(why, len, "no C++ compiler: %s not found (install g++ or set CXX)", program ? program : "$CXX");
    return false;
}

static bool write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) return false;
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* Appends the file's text to err after its first used bytes. */
static void append_file(char *err, size_t errlen, const char *path)
{
    size_t used = strlen(err);
    FILE *f = fopen(path, "r");
    if (!f || used + 1 >= errlen) {
        if (f) fclose(f);
        return;
    }
    size_t n = fread(err + used, 1, errlen - used - 1, f);
    err[used + n] = 0;
    fclose(f);
}

bool emu_checking(void)
{
    const char *check = getenv("ALLOY_EMU_CHECK");
    return !(check && !strcmp(check, "0"));
}

/* Whether kernels get the shared-memory checker's instrumentation: checking, and no
 * ThreadSanitizer in the flags (its runtime would take the hooks). Under AddressSanitizer the
 * checked kernel is compiled without it (the two instrumentations do not mix) and asks the
 * process's ASan runtime about its accesses instead (emu_shadow.h). */
static bool shadow_checked(const char *extra)
{
    return emu_checking() && !strstr(extra, "sanitize=thread");
}

/* The words of extra with "address" taken out of each -fsanitize= list (a list of only it is
 * dropped), into out. */
static void drop_asan(const char *extra, char *out, size_t len)
{
    size_t used = 0;
    out[0] = 0;
    char copy[256], *words[max_words];
    snprintf(copy, sizeof copy, "%s", extra);
    int n = split_words(copy, words, 0);
    for (int i = 0; i < n && used < len; i++) {
        char kept[256] = "";
        if (strncmp(words[i], "-fsanitize=", 11) == 0) {
            char *save = NULL;
            for (char *s = strtok_r(words[i] + 11, ",", &save); s; s = strtok_r(NULL, ",", &save))
                if (strcmp(s, "address") != 0)
                    snprintf(kept + strlen(kept), sizeof kept - strlen(kept), "%s%s", kept[0] ? "," : "-fsanitize=", s);
        } else {
            snprintf(kept, sizeof kept, "%s", words[i]);
        }
        if (kept[0]) used += (size_t)snprintf(out + used, len - used, "%s%s", used ? " " : "", kept);
    }
}

bool emu_checks_shared(void) { return shadow_checked(ALLOY_EMU_CXXFLAGS); }

/* Runs argv (a compiler) with its output into log; false with that output in err. */
static bool run_compiler(char **argv, const char *log, char *err, size_t errlen)
{
    posix_spawn_file_actions_t io;
    posix_spawn_file_actions_init(&io);
    posix_spawn_file_actions_addopen(&io, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&io, 1, 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &io, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&io);
    if (rc != 0) {
        snprintf(err, errlen, "no C++ compiler: %s: %s", argv[0], strerror(rc));
        return false;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
    snprintf(err, errlen, "%s failed (%s %d) on the kernel source:\n", argv[0],
             WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    append_file(err, errlen, log);
    return false;
}

/* ---- the GPU-numerics mode (ALLOY_EMU_NUMERICS=gpu) ----
 *
 * NVRTC compiles alloy's kernels with its default --fmad=true: a*b+c may become one fused
 * multiply-add. The mode compiles the kernels the same way (-ffp-contract=fast, which GCC applies
 * from -fexpensive-optimizations on, and an FMA-capable target where the host has one) and with
 * emu_gpumath.h's math (CUDA's documented ulp bounds, stepped by ALLOY_EMU_NUMERICS_SEED). */

/* The mode's flags ("" outside it) into buf; false with the reason in err on a bad setting. */
static bool numerics_flags(char *buf, size_t len, char *err, size_t errlen)
{
    const char *mode = getenv("ALLOY_EMU_NUMERICS"), *seed = getenv("ALLOY_EMU_NUMERICS_SEED");
    buf[0] = 0;
    if (!mode || !*mode || !strcmp(mode, "host")) return true;
    if (strcmp(mode, "gpu") != 0) {
        snprintf(err, errlen, "ALLOY_EMU_NUMERICS=%s: expected host (the default) or gpu", mode);
        return false;
    }
    char *end = NULL;
    unsigned long long s = seed && *seed ? strtoull(seed, &end, 10) : 1;
    if (seed && *seed && (*end || seed[0] == '-')) {
        snprintf(err, errlen, "ALLOY_EMU_NUMERICS_SEED=%s: expected a non-negative integer", seed);
        return false;
    }
    bool fma = false;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    fma = __builtin_cpu_supports("fma"); /* -mfma on a host without it would fault at the first fma */
#endif
    snprintf(buf, len, "-DALLOY_EMU_GPU_NUMERICS -DALLOY_EMU_GPU_SEED=%lluull -ffp-contract=fast -fexpensive-optimizations%s",
             s, fma ? " -mfma" : "");
    return true;
}

bool emu_gpu_numerics(void)
{
    const char *mode = getenv("ALLOY_EMU_NUMERICS");
    return mode && !strcmp(mode, "gpu");
}

/* The compiler's flags besides $CXX's words, ALLOY_EMU_CXXFLAGS and the checker's. */
static const char *const compile_flags[] = {"-std=c++17", "-O1", "-fPIC", "-fstack-clash-protection",
                                            "-DALLOY_HOST_EMULATION", "-include", ALLOY_EMU_H};

/* Runs the compiler on dir/kernel.cu into dir/kernel.so; false with its output in err. Checked,
 * the source is compiled with -fsanitize=thread (its memory accesses call emu.h's hooks) into
 * kernel.o, and linked apart without the flag, so that no sanitizer runtime is linked in. */
static bool compile(const char *dir, char *err, size_t errlen)
{
    char cxx[256], extra[256], numerics[256], src[512], obj[512], lib[512], log[512];
    if (!numerics_flags(numerics, sizeof numerics, err, errlen)) return false;
    snprintf(cxx, sizeof cxx, "%s", compiler());
    snprintf(extra, sizeof extra, "%s", ALLOY_EMU_CXXFLAGS);
    bool shadow = shadow_checked(extra);
    if (shadow) drop_asan(ALLOY_EMU_CXXFLAGS, extra, sizeof extra);
    snprintf(src, sizeof src, "%s/kernel.cu", dir);
    snprintf(obj, sizeof obj, "%s/kernel.o", dir);
    snprintf(lib, sizeof lib, "%s/kernel.so", dir);
    snprintf(log, sizeof log, "%s/compile.log", dir);

    char *argv[max_words];
    int n = split_words(cxx, argv, 0);
    for (size_t i = 0; i < sizeof compile_flags / sizeof compile_flags[0]; i++) argv[n++] = (char *)compile_flags[i];
    n = split_words(extra, argv, n);
    n = split_words(numerics, argv, n);
    if (shadow) {
        argv[n++] = "-fsanitize=thread";
        argv[n++] = "--param=tsan-instrument-func-entry-exit=0";
        argv[n++] = "-c";
    } else {
        argv[n++] = "-shared";
    }
    argv[n++] = "-x";
    argv[n++] = "c++";
    argv[n++] = src;
    argv[n++] = "-o";
    argv[n++] = shadow ? obj : lib;
    argv[n] = NULL;
    if (!run_compiler(argv, log, err, errlen)) return false;
    if (!shadow) return true;

    snprintf(cxx, sizeof cxx, "%s", compiler());
    snprintf(extra, sizeof extra, "%s", ALLOY_EMU_CXXFLAGS);
    n = split_words(cxx, argv, 0);
    n = split_words(extra, argv, n);
    argv[n++] = "-shared";
    argv[n++] = "-fPIC";
    argv[n++] = obj;
    argv[n++] = "-o";
    argv[n++] = lib;
    argv[n] = NULL;
    return run_compiler(argv, log, err, errlen);
}

/* The address of symbol in library, stored into *fn (a function pointer); false if absent. */
static bool find_symbol(void *library, const char *symbol, void *fn, size_t fn_size)
{
    void *p = dlsym(library, symbol);
    if (!p) return false;
    memcpy(fn, &p, fn_size);
    return true;
}

/* Removes dir and the files emu_compile writes there. */
static void remove_dir(const char *dir)
{
    static const char *const files[] = {"kernel.cu", "kernel.o", "kernel.so", "compile.log"};
    char path[512];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* ---- the compiled-library cache ----
 *
 * With ALLOY_EMU_CACHE_DIR set (tests/meson.build sets it to a folder of the
 * build), a compiled library is kept there under the SHA-256 of everything
 * that makes it: the compiler's words, its flags (the checker's
 * instrumentation and the numerics mode among them), emu.h, emu_shadow.h,
 * emu_blocks.h, emu_gpumath.h and the header emu.h
 * includes from src/base, and the source as compiled (checked: after the
 * redzone rewrite, emu_redzone.c, so a changed rewrite makes new keys). A run of the suites after the first
 * (or a second suite compiling a source the first did) copies the library
 * instead of running the compiler. Entries are written to a temporary file
 * and renamed, so suites running at once share the folder safely; an entry
 * that does not load is compiled again. */

static pthread_once_t headers_once = PTHREAD_ONCE_INIT;
static uint8_t headers_digest[32]; /* emu.h, vmath.h and vgelu.h, read once */

/* Adds path's bytes (or its absence) to s. */
static void hash_file(al_sha256_ctx *s, const char *path)
{
    char buf[8192];
    size_t n;
    FILE *f = fopen(path, "rb");
    al_sha256_update(s, path, strlen(path) + 1);
    if (!f) {
        al_sha256_update(s, "absent", 6);
        return;
    }
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) al_sha256_update(s, buf, n);
    fclose(f);
}

static void hash_headers(void)
{
    al_sha256_ctx s;
    char vmath[600];
    const char *slash = strrchr(ALLOY_EMU_H, '/');
    snprintf(vmath, sizeof vmath, "%.*s/../../src/base/vmath.h", slash ? (int)(slash - ALLOY_EMU_H) : 1,
             slash ? ALLOY_EMU_H : ".");
    al_sha256_init(&s);
    char shadow[600];
    snprintf(shadow, sizeof shadow, "%.*s/emu_shadow.h", slash ? (int)(slash - ALLOY_EMU_H) : 1, slash ? ALLOY_EMU_H : ".");
    hash_file(&s, ALLOY_EMU_H);
    hash_file(&s, shadow);
    char blocks[600];
    snprintf(blocks, sizeof blocks, "%.*s/emu_blocks.h", slash ? (int)(slash - ALLOY_EMU_H) : 1, slash ? ALLOY_EMU_H : ".");
    hash_file(&s, blocks);
    snprintf(shadow, sizeof shadow, "%.*s/emu_gpumath.h", slash ? (int)(slash - ALLOY_EMU_H) : 1, slash ? ALLOY_EMU_H : ".");
    hash_file(&s, shadow);
    hash_file(&s, vmath);
    /* vmath.h's include: the GELU functions whose text the kernel preamble also carries */
    snprintf(vmath, sizeof vmath, "%.*s/../../src/base/vgelu.h", slash ? (int)(slash - ALLOY_EMU_H) : 1,
             slash ? ALLOY_EMU_H : ".");
    hash_file(&s, vmath);
    al_sha256_final(&s, headers_digest);
}

/* The cache file of source in path; false when no cache is set (or the
 * folder cannot be made). */
static bool cache_path(const char *source, char *path, size_t len)
{
    const char *dir = getenv("ALLOY_EMU_CACHE_DIR");
    if (!dir || !*dir) return false;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return false;
    pthread_once(&headers_once, hash_headers);
    al_sha256_ctx s;
    uint8_t digest[32];
    al_sha256_init(&s);
    al_sha256_update(&s, headers_digest, sizeof headers_digest);
    const char *cxx = compiler();
    al_sha256_update(&s, cxx, strlen(cxx) + 1);
    al_sha256_update(&s, ALLOY_EMU_CXXFLAGS, strlen(ALLOY_EMU_CXXFLAGS) + 1);
    for (size_t i = 0; i < sizeof compile_flags / sizeof compile_flags[0]; i++)
        al_sha256_update(&s, compile_flags[i], strlen(compile_flags[i]) + 1);
    char numerics[256], why[160];
    if (!numerics_flags(numerics, sizeof numerics, why, sizeof why)) return false; /* compile() reports it */
    al_sha256_update(&s, numerics, strlen(numerics) + 1);
    const char checked = shadow_checked(ALLOY_EMU_CXXFLAGS) ? 'S' : 'P'; /* the checker's instrumentation */
    al_sha256_update(&s, &checked, 1);
    al_sha256_update(&s, source, strlen(source));
    al_sha256_final(&s, digest);
    int n = snprintf(path, len, "%s/", dir);
    for (int i = 0; i < 32 && n > 0 && (size_t)n + 3 < len; i++) n += snprintf(path + n, len - (size_t)n, "%02x", digest[i]);
    return n > 0 && (size_t)n + 4 < len && snprintf(path + n, len - (size_t)n, ".so") == 3;
}

/* Copies the file from into to (through a temporary file renamed over to
 * when publish); false on any failure, leaving no partial file at to. */
static bool copy_file(const char *from, const char *to, bool publish)
{
    char tmp[600], buf[1 << 16];
    snprintf(tmp, sizeof tmp, "%s.%ld.%lx.tmp", to, (long)getpid(), (unsigned long)pthread_self());
    const char *target = publish ? tmp : to;
    FILE *in = fopen(from, "rb"), *out = in ? fopen(target, "wb") : NULL;
    bool ok = in && out;
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (in && ferror(in)) ok = false;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = false;
    if (ok && publish) ok = rename(tmp, to) == 0;
    if (!ok && out) unlink(target);
    return ok;
}

static long compiles;
static bool poisoned;

long emu_compile_count(void) { return __atomic_load_n(&compiles, __ATOMIC_RELAXED); }
void emu_poison_compiles(bool on) { poisoned = on; }

/* A fresh kernel with its temporary directory; NULL with err. */
static emu_kernel *kernel_new(char *err, size_t errlen)
{
    emu_kernel *k = calloc(1, sizeof *k);
    if (!k) {
        snprintf(err, errlen, "emu: out of memory");
        return NULL;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(k->dir, sizeof k->dir, "%s/alloy-emu-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(k->dir)) {
        snprintf(err, errlen, "emu: cannot make a directory %s", k->dir);
        free(k);
        return NULL;
    }
    return k;
}

/* Compiles source (as it is) into k->dir/kernel.so (counted; refused while poisoned). */
static bool compile_text(emu_kernel *k, const char *source, char *err, size_t errlen)
{
    char path[512];
    snprintf(path, sizeof path, "%s/kernel.cu", k->dir);
    if (poisoned) {
        snprintf(err, errlen, "emu: compiling is poisoned by the test (a path that must compile nothing did)");
        return false;
    }
    __atomic_add_fetch(&compiles, 1, __ATOMIC_RELAXED); /* test_codegen_ops compiles on threads */
    if (!write_file(path, source)) {
        snprintf(err, errlen, "emu_compile: cannot write %s", path);
        return false;
    }
    char cached[600], lib[512];
    bool cache = cache_path(source, cached, sizeof cached);
    snprintf(lib, sizeof lib, "%s/kernel.so", k->dir);
    if (cache && access(cached, R_OK) == 0 && copy_file(cached, lib, false)) {
        /* a library that no longer loads (a truncated entry) is compiled again */
        void *probe = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (probe) {
            dlclose(probe);
            return true;
        }
        unlink(cached);
    }
    if (!compile(k->dir, err, errlen)) return false;
    if (cache) copy_file(lib, cached, true); /* a failed store only costs the next run a compile */
    return true;
}

/* Compiles source into k->dir/kernel.so: checked, with its __shared__ arrays between redzones. */
static bool compile_source(emu_kernel *k, const char *source, char *err, size_t errlen)
{
    if (!emu_checks_shared()) return compile_text(k, source, err, errlen);
    char *zoned = emu_redzone_rewrite(source); /* the cache key hashes the rewritten text */
    if (!zoned) {
        snprintf(err, errlen, "emu: out of memory");
        return false;
    }
    bool ok = compile_text(k, zoned, err, errlen);
    free(zoned);
    return ok;
}

/* dlopens k->dir/kernel.so and finds the launcher (and kernel_name's entry unless NULL). */
static bool open_library(emu_kernel *k, const char *kernel_name, char *err, size_t errlen)
{
    char path[512], symbol[256];
    snprintf(path, sizeof path, "%s/kernel.so", k->dir);
    if (!(k->library = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
        snprintf(err, errlen, "emu: %s", dlerror());
        return false;
    }
    snprintf(symbol, sizeof symbol, "%s__host", kernel_name ? kernel_name : "");
    if (kernel_name) snprintf(k->name, sizeof k->name, "%s", kernel_name);
    if (kernel_name && !find_symbol(k->library, symbol, &k->entry, sizeof k->entry)) {
        snprintf(err, errlen, "emu_compile: the source defines no %s (the ALLOY_HOST_EMULATION trampoline)", symbol);
        return false;
    }
    if (!find_symbol(k->library, "alloy_emu_launch", &k->launch, sizeof k->launch)) {
        snprintf(err, errlen, "emu: no alloy_emu_launch (was emu.h force-included?)");
        k->launch = NULL;
        return false;
    }
    if (!find_symbol(k->library, "alloy_emu_check_global", &k->check_global, sizeof k->check_global))
        k->check_global = NULL;
    return true;
}

emu_kernel *emu_compile(const char *source, const char *kernel_name, char *err, size_t errlen)
{
    emu_kernel *k = kernel_new(err, errlen);
    if (k && compile_source(k, source, err, errlen) && open_library(k, kernel_name, err, errlen)) return k;
    emu_free(k);
    return NULL;
}

int emu_build_image(const char *source, unsigned char **bytes, size_t *len, char *err, size_t errlen)
{
    *bytes = NULL, *len = 0;
    emu_kernel *k = kernel_new(err, errlen);
    if (!k) return -1;
    int rc = -1;
    char path[512];
    snprintf(path, sizeof path, "%s/kernel.so", k->dir);
    if (compile_source(k, source, err, errlen)) {
        FILE *f = fopen(path, "rb");
        long n = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
        if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (*bytes = malloc((size_t)n)) && fread(*bytes, 1, (size_t)n, f) == (size_t)n) {
            *len = (size_t)n;
            rc = 0;
        } else {
            free(*bytes);
            *bytes = NULL;
            snprintf(err, errlen, "emu: cannot read %s", path);
        }
        if (f) fclose(f);
    }
    emu_free(k);
    return rc;
}

emu_kernel *emu_load_image(const void *bytes, size_t len, char *err, size_t errlen)
{
    emu_kernel *k = kernel_new(err, errlen);
    if (!k) return NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/kernel.so", k->dir);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(bytes, 1, len, f) == len;
    if (f && fclose(f) != 0) ok = false;
    if (!ok) snprintf(err, errlen, "emu: cannot write %s", path);
    if (ok && open_library(k, NULL, err, errlen)) return k;
    emu_free(k);
    return NULL;
}

int emu_select(emu_kernel *k, const char *kernel_name, char *err, size_t errlen)
{
    char symbol[256];
    snprintf(symbol, sizeof symbol, "%s__host", kernel_name);
    if (find_symbol(k->library, symbol, &k->entry, sizeof k->entry)) {
        snprintf(k->name, sizeof k->name, "%s", kernel_name);
        return 0;
    }
    snprintf(err, errlen, "emu_select: the library defines no %s", symbol);
    return -1;
}

int emu_launch(const emu_kernel *k, const unsigned grid[3], const unsigned block[3], void **params, char *err,
               size_t errlen)
{
    if (k->launch(k->entry, grid, block, params, err, errlen) == 0) return 0;
    if (err && errlen) { /* "kernel NAME: " before the emulation's message */
        size_t used = strlen(err), pre = strlen(k->name) + 9;
        if (used + pre < errlen) {
            memmove(err + pre, err, used + 1);
            memcpy(err, "kernel ", 7);
            memcpy(err + 7, k->name, pre - 9);
            memcpy(err + pre - 2, ": ", 2);
        }
    }
    return -1;
}

bool emu_check_global(const emu_kernel *k, emu_global_check fn, void *ctx)
{
    return k->check_global && k->check_global(fn, ctx);
}

void emu_free(emu_kernel *k)
{
    if (!k) return;
    if (k->library) dlclose(k->library);
    remove_dir(k->dir);
    free(k);
}
