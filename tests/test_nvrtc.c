/* test_nvrtc.c - NVRTC loaded at run time (CUBIN, PTX, errors, the thread pool) and the kernel cache (keys, hits, damaged entries, bounds). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/sha256.h"
#include "codegen/cache.h"
#include "codegen/nvrtc.h"
#include "support.h"

/* Loaded once for the suite; NULL (with the reason in why) when this machine has no NVRTC. */
static cg_nvrtc *nv;
static char why[512];
static char cache_dir[128], dump_dir[128];

#define NEED_NVRTC()                                                                                           \
    do {                                                                                                       \
        if (!nv) {                                                                                             \
            print_message("skipped, no NVRTC: %s\n", why);                                                     \
            skip();                                                                                            \
        }                                                                                                      \
    } while (0)

static int group_setup(void **state)
{
    test_checked_alloc(state);
    if (cg_nvrtc_open(NULL, &nv, why, sizeof why) != ALLOY_OK) nv = NULL;
    return 0;
}

static int group_teardown(void **state)
{
    test_checked_alloc(state); /* each test's teardown went back to the C library's */
    cg_nvrtc_close(nv);
    return test_plain_alloc(state);
}

static int setup(void **state)
{
    if (test_tmpdir_setup(state)) return -1;
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", test_tmpdir);
    snprintf(dump_dir, sizeof dump_dir, "%s/dump", test_tmpdir);
    return 0;
}

static int teardown(void **state)
{
    test_remove_dir(cache_dir);
    test_remove_dir(dump_dir);
    return test_tmpdir_teardown(state);
}

/* An elementwise f32 kernel named scale_<id>: y = a * x + id (+ BIAS when defined). */
static const char *kernel_source(int id)
{
    static char text[8][512];
    char *s = text[id % 8];
    snprintf(s, sizeof text[0],
             "#ifndef BIAS\n#define BIAS 0\n#endif\n"
             "extern \"C\" __global__ void scale_%d(const float *x, float *y, float a, long long n)\n"
             "{\n"
             "    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
             "    if (i < n) y[i] = a * x[i] + %d.0f + BIAS;\n"
             "}\n",
             id, id);
    return s;
}

static const char *broken_source = "extern \"C\" __global__ void broken(float *y) { y[0] = ; }\n";

static bool holds(const void *data, size_t size, const char *what)
{
    size_t n = strlen(what);
    for (size_t i = 0; i + n <= size; i++)
        if (memcmp((const char *)data + i, what, n) == 0) return true;
    return false;
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".kernel") != NULL;
    if (d) closedir(d);
    return n;
}

static off_t file_size(const char *path) /* -1: no such file */
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : -1;
}

/* Fails unless the cache's counters are these (and it had no write errors). */
static void expect_stats(cg_cache *c, uint64_t hits, uint64_t disk_hits, uint64_t misses, uint64_t corrupt,
                         uint64_t compiles)
{
    cg_cache_stats s = cg_cache_get_stats(c);
    assert_int_equal(s.hits, hits);
    assert_int_equal(s.disk_hits, disk_hits);
    assert_int_equal(s.misses, misses);
    assert_int_equal(s.corrupt, corrupt);
    assert_int_equal(s.compiles, compiles);
    assert_int_equal(s.write_errors, 0);
}

static void set_mtime(const char *path, time_t when)
{
    struct timespec t[2] = {{when, 0}, {when, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
}

/* ---- loading ---- */

static void test_a_bad_path_is_unsupported_and_named(void **state)
{
    (void)state;
    char err[512];
    cg_nvrtc *bad = (cg_nvrtc *)&err;
    assert_int_equal(cg_nvrtc_open("/nonexistent/libnvrtc.so.13", &bad, err, sizeof err), ALLOY_ERR_UNSUPPORTED);
    assert_null(bad);
    assert_non_null(strstr(err, "/nonexistent/libnvrtc.so.13"));
    /* a library that loads but is not NVRTC: the missing symbol is named */
    assert_int_equal(cg_nvrtc_open("libm.so.6", &bad, err, sizeof err), ALLOY_ERR_UNSUPPORTED);
    assert_null(bad);
    assert_non_null(strstr(err, "libm.so.6"));
    assert_non_null(strstr(err, "nvrtcGetErrorString"));
}

static void test_the_version_and_architectures_are_read(void **state)
{
    (void)state;
    NEED_NVRTC();
    int major, minor;
    const int *archs;
    cg_nvrtc_version(nv, &major, &minor);
    int n = cg_nvrtc_archs(nv, &archs);
    char id[64];
    snprintf(id, sizeof id, "nvrtc %d.%d size ", major, minor);
    print_message("%s (%s), %d architectures sm_%d..sm_%d\n", cg_nvrtc_id(nv), cg_nvrtc_library(nv), n, archs[0],
                  archs[n - 1]);
    assert_true(major >= 11 && minor >= 0);
    assert_true(n > 0);
    for (int i = 1; i < n; i++) assert_true(archs[i - 1] < archs[i]);
    assert_true(strncmp(cg_nvrtc_id(nv), id, strlen(id)) == 0);
    assert_true(atoll(cg_nvrtc_id(nv) + strlen(id)) > 1000000); /* the library file's size */
    assert_true(strstr(cg_nvrtc_library(nv), "nvrtc") != NULL);
}

/* ---- compiling ---- */

static void test_a_kernel_compiles_to_a_cubin_for_sm80_and_sm90(void **state)
{
    (void)state;
    NEED_NVRTC();
    int major, minor;
    cg_nvrtc_version(nv, &major, &minor);
    const char *bias[] = {"-DBIAS=2"};
    const int sms[] = {80, 90};
    for (int j = 0; j < 2; j++) {
        cg_binary b;
        cg_kernel_src k = {.name = "scale_0", .source = kernel_source(0), .sm = sms[j], .options = bias, .noptions = 1};
        char err[4096], want[128];
        assert_int_equal(cg_nvrtc_compile(nv, &k, NULL, &b, err, sizeof err), ALLOY_OK);
        assert_int_equal(b.status, ALLOY_OK);
        assert_int_equal(b.kind, CG_CUBIN);
        assert_int_equal(b.arch, sms[j]);
        assert_true(b.size > 64);
        assert_memory_equal(b.data, "\x7f" "ELF", 4);
        assert_int_equal(b.data[18] | b.data[19] << 8, 190); /* e_machine: EM_CUDA */
        assert_true(holds(b.data, b.size, "scale_0"));
        snprintf(want, sizeof want, "--gpu-architecture=sm_%d --std=c++17 -default-device%s -DBIAS=2", sms[j],
                 major > 12 || (major == 12 && minor >= 4) ? " --minimal" : "");
        assert_string_equal(b.options, want);
        assert_non_null(b.log);
        assert_null(b.message);
        cg_binary_free(&b);
    }
}

static void test_an_unlisted_arch_gives_ptx_for_the_newest_lower_one(void **state)
{
    (void)state;
    NEED_NVRTC();
    const int *archs;
    int n = cg_nvrtc_archs(nv, &archs);
    cg_binary b;
    char err[4096], want[64];
    cg_kernel_src k = {.name = "scale_1", .source = kernel_source(1), .sm = 999};
    assert_int_equal(cg_nvrtc_compile(nv, &k, NULL, &b, err, sizeof err), ALLOY_OK);
    assert_int_equal(b.kind, CG_PTX);
    assert_int_equal(b.arch, archs[n - 1]);
    assert_int_equal(b.data[b.size - 1], '\0');
    assert_int_equal(strlen((char *)b.data), b.size - 1);
    snprintf(want, sizeof want, ".target sm_%d", archs[n - 1]);
    assert_non_null(strstr((char *)b.data, want));
    assert_non_null(strstr((char *)b.data, ".entry scale_1"));
    snprintf(want, sizeof want, "--gpu-architecture=compute_%d ", archs[n - 1]);
    assert_true(strncmp(b.options, want, strlen(want)) == 0);
    cg_binary_free(&b);

    /* between two listed architectures: the lower one, as PTX */
    cg_binary_kind kind;
    int arch;
    for (int i = 0; i + 1 < n; i++) {
        if (archs[i + 1] == archs[i] + 1) continue;
        assert_int_equal(cg_nvrtc_target(nv, archs[i] + 1, &kind, &arch, err, sizeof err), ALLOY_OK);
        assert_int_equal(kind, CG_PTX);
        assert_int_equal(arch, archs[i]);
    }
    /* below the oldest: an error naming it */
    k.sm = archs[0] - 1;
    assert_int_equal(cg_nvrtc_compile(nv, &k, NULL, &b, err, sizeof err), ALLOY_ERR_UNSUPPORTED);
    snprintf(want, sizeof want, "sm_%d", archs[0] - 1);
    assert_non_null(strstr(err, want));
    assert_non_null(strstr(b.message, want));
    assert_null(b.data);
    cg_binary_free(&b);
}

static void test_bad_names_options_and_archs_are_rejected(void **state)
{
    (void)state;
    NEED_NVRTC();
    const char *spaced[] = {"-DA=1 -DB=2"}, *empty[] = {""};
    const cg_kernel_src bad[] = {
        {.name = "../escape", .source = "", .sm = 80},
        {.name = ".hidden", .source = "", .sm = 80},
        {.name = "ok", .source = NULL, .sm = 80},
        {.name = "ok", .source = "", .sm = 80, .options = spaced, .noptions = 1},
        {.name = "ok", .source = "", .sm = 80, .options = empty, .noptions = 1},
        {.name = "ok", .source = "", .sm = 5},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cg_binary b;
        char err[256] = "";
        assert_int_equal(cg_nvrtc_compile(nv, &bad[i], dump_dir, &b, err, sizeof err), ALLOY_ERR_INVALID);
        assert_true(err[0] != '\0');
        assert_int_equal(b.status, ALLOY_ERR_INVALID);
        cg_binary_free(&b);
    }
    assert_int_equal(file_size(dump_dir), -1); /* rejected before anything is written */
}

static void test_a_syntax_error_returns_the_log_and_the_dumped_source_and_caches_nothing(void **state)
{
    (void)state;
    NEED_NVRTC();
    cg_cache *c;
    char err[8192];
    assert_int_equal(cg_cache_open(cache_dir, 1 << 20, 0, &c, err, sizeof err), ALLOY_OK);
    cg_kernel_src k = {.name = "broken", .source = broken_source, .sm = 80};
    for (int round = 1; round <= 2; round++) {
        cg_binary b;
        assert_int_equal(cg_cache_compile(c, nv, &k, dump_dir, &b, err, sizeof err), ALLOY_ERR_NVRTC);
        assert_int_equal(b.status, ALLOY_ERR_NVRTC);
        assert_null(b.data);
        assert_non_null(strstr(b.log, "error"));
        assert_non_null(strstr(b.message, b.log)); /* the whole log */
        assert_non_null(strstr(err, "error"));
        assert_non_null(strstr(err, test_path_in(dump_dir, "broken.cu")));
        assert_false(b.cached);
        cg_binary_free(&b);
        expect_stats(c, 0, 0, round, 0, round);
    }
    assert_int_equal(count_entries(cache_dir), 0);
    size_t len;
    unsigned char *dumped = test_read_file(test_path_in(dump_dir, "broken.cu"), &len);
    assert_string_equal((char *)dumped, broken_source);
    test_free(dumped);
    cg_cache_close(c);
}

static void test_eight_kernels_compile_in_parallel_in_input_order(void **state)
{
    (void)state;
    NEED_NVRTC();
    enum { N = 8 };
    cg_kernel_src ks[N];
    char names[N][16];
    cg_binary serial[N], parallel[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "scale_%d", i);
        ks[i] = (cg_kernel_src){.name = names[i], .source = kernel_source(i), .sm = 90};
    }
    double t0 = test_now_ms();
    assert_int_equal(cg_nvrtc_compile_many(nv, ks, N, 1, NULL, serial), ALLOY_OK);
    double t1 = test_now_ms();
    assert_int_equal(cg_nvrtc_compile_many(nv, ks, N, 4, NULL, parallel), ALLOY_OK);
    double t2 = test_now_ms();
    print_message("8 kernels: serial %.0f ms, 4 threads %.0f ms (%ld cores)\n", t1 - t0, t2 - t1,
                  sysconf(_SC_NPROCESSORS_ONLN));
    for (int i = 0; i < N; i++) {
        assert_int_equal(parallel[i].status, ALLOY_OK);
        for (int j = 0; j < N; j++) assert_true(holds(parallel[i].data, parallel[i].size, names[j]) == (i == j));
        assert_int_equal(parallel[i].size, serial[i].size);
        assert_memory_equal(parallel[i].data, serial[i].data, serial[i].size);
        cg_binary_free(&serial[i]);
        cg_binary_free(&parallel[i]);
    }
    /* through a cache: one bad kernel fails alone, and only it is not stored */
    cg_cache *c;
    assert_int_equal(cg_cache_open(cache_dir, 1 << 20, 0, &c, NULL, 0), ALLOY_OK);
    ks[3].source = broken_source;
    assert_int_equal(cg_cache_compile_many(c, nv, ks, N, 4, NULL, parallel), ALLOY_ERR_NVRTC);
    for (int i = 0; i < N; i++) {
        assert_int_equal(parallel[i].status, i == 3 ? ALLOY_ERR_NVRTC : ALLOY_OK);
        assert_true(i == 3 ? strstr(parallel[i].message, "scale_3") && strstr(parallel[i].log, "error")
                           : parallel[i].message == NULL && holds(parallel[i].data, parallel[i].size, names[i]));
        cg_binary_free(&parallel[i]);
    }
    expect_stats(c, 0, 0, N, 0, N);
    assert_int_equal(count_entries(cache_dir), N - 1);
    cg_cache_close(c);
}

/* ---- the cache ---- */

static void test_the_key_covers_name_source_options_arch_kind_and_compiler(void **state)
{
    (void)state;
    const struct {
        const char *text, *digest;
    } vectors[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < sizeof vectors / sizeof *vectors; i++) {
        uint8_t d[32];
        char hex[65];
        al_sha256(vectors[i].text, strlen(vectors[i].text), d);
        for (int j = 0; j < 32; j++) snprintf(hex + 2 * j, 3, "%02x", d[j]);
        assert_string_equal(hex, vectors[i].digest);
    }
    /* each row differs from the first in one thing (the last two: where field bytes end) */
    const char *src = kernel_source(0), *src1 = kernel_source(1), *opts = "--gpu-architecture=sm_80 --std=c++17";
    const struct {
        const char *name, *source, *options;
        int arch;
        cg_binary_kind kind;
        const char *id;
    } in[] = {
        {"scale_0", src, opts, 80, CG_CUBIN, "nvrtc 13.0 size 1"},
        {"scale_1", src, opts, 80, CG_CUBIN, "nvrtc 13.0 size 1"},
        {"scale_0", src1, opts, 80, CG_CUBIN, "nvrtc 13.0 size 1"},
        {"scale_0", src, "--gpu-architecture=sm_80 --std=c++17 -DBIAS=1", 80, CG_CUBIN, "nvrtc 13.0 size 1"},
        {"scale_0", src, opts, 90, CG_CUBIN, "nvrtc 13.0 size 1"},
        {"scale_0", src, opts, 80, CG_PTX, "nvrtc 13.0 size 1"},
        {"scale_0", src, opts, 80, CG_CUBIN, "nvrtc 13.1 size 1"},
        {"scale_0", "ab", "c", 80, CG_CUBIN, "x"},
        {"scale_0", "a", "bc", 80, CG_CUBIN, "x"},
    };
    enum { NKEYS = sizeof in / sizeof *in };
    char keys[NKEYS][65], again[65];
    for (int i = 0; i < NKEYS; i++) {
        cg_cache_key(in[i].name, in[i].source, in[i].options, in[i].arch, in[i].kind, in[i].id, keys[i]);
        cg_cache_key(in[i].name, in[i].source, in[i].options, in[i].arch, in[i].kind, in[i].id, again);
        assert_string_equal(keys[i], again);
        assert_int_equal(strlen(keys[i]), CG_KEY_HEX);
        assert_int_equal(strspn(keys[i], "0123456789abcdef"), CG_KEY_HEX);
        for (int j = 0; j < i; j++) assert_string_not_equal(keys[i], keys[j]);
    }
}

static void test_a_second_compile_hits_the_cache(void **state)
{
    (void)state;
    NEED_NVRTC();
    const char *dirs[] = {cache_dir, NULL};
    for (int d = 0; d < 2; d++) {
        cg_cache *c;
        cg_binary cold, hit;
        char err[4096], key[65];
        assert_int_equal(cg_cache_open(dirs[d], 1 << 20, 0, &c, err, sizeof err), ALLOY_OK);
        cg_kernel_src k = {.name = "scale_2", .source = kernel_source(2), .sm = 80};
        double t0 = test_now_ms();
        assert_int_equal(cg_cache_compile(c, nv, &k, NULL, &cold, err, sizeof err), ALLOY_OK);
        double t1 = test_now_ms();
        assert_int_equal(cg_cache_compile(c, nv, &k, NULL, &hit, err, sizeof err), ALLOY_OK);
        double t2 = test_now_ms();
        print_message("%s: cold compile %.1f ms, hit %.3f ms\n", dirs[d] ? "disk cache" : "memory-only cache", t1 - t0,
                      t2 - t1);
        assert_false(cold.cached);
        assert_true(hit.cached);
        assert_int_equal(hit.size, cold.size);
        assert_memory_equal(hit.data, cold.data, cold.size);
        assert_string_equal(hit.options, cold.options);
        assert_string_equal(hit.key, cold.key);
        /* keyed by what the compile used (the key test shows each part counts) */
        cg_cache_key("scale_2", kernel_source(2), cold.options, 80, CG_CUBIN, cg_nvrtc_id(nv), key);
        assert_string_equal(cold.key, key);
        expect_stats(c, 1, 0, 1, 0, 1);
        cg_binary_free(&hit);
        cg_cache_close(c);
        if (dirs[d]) {
            /* the file holds the header and the payload; a new cache (a new process) reads it */
            char path[256];
            size_t len;
            assert_int_equal(cg_cache_open(dirs[d], 1 << 20, 0, &c, err, sizeof err), ALLOY_OK);
            cg_cache_entry_path(c, cold.key, path, sizeof path);
            unsigned char *file = test_read_file(path, &len);
            assert_int_equal(len, CG_CACHE_HEADER + cold.size);
            assert_memory_equal(file, "alloyKC\n", 8);
            assert_memory_equal(file + 56, cold.key, CG_KEY_HEX);
            assert_memory_equal(file + CG_CACHE_HEADER, cold.data, cold.size);
            test_free(file);
            double t3 = test_now_ms();
            assert_int_equal(cg_cache_compile(c, nv, &k, NULL, &hit, err, sizeof err), ALLOY_OK);
            print_message("disk hit in a new cache: %.3f ms\n", test_now_ms() - t3);
            assert_true(hit.cached);
            expect_stats(c, 1, 1, 0, 0, 0);
            assert_memory_equal(hit.data, cold.data, cold.size);
            cg_binary_free(&hit);
            cg_cache_close(c);
        }
        cg_binary_free(&cold);
    }
}

/* A fake payload of n bytes, different per seed. */
static unsigned char *payload(size_t n, int seed)
{
    unsigned char *p = test_malloc(n);
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31 + (size_t)seed * 7);
    return p;
}

static void key_of(int i, char key[65])
{
    char name[16];
    snprintf(name, sizeof name, "k%d", i);
    cg_cache_key(name, "src", "opts", 80, CG_CUBIN, "test", key);
}

/* What the tests do to an entry file. */
typedef enum damage {
    TRUNCATE_EMPTY, TRUNCATE_HEADER, TRUNCATE_HALF, FLIP_PAYLOAD, FLIP_SIZE, FLIP_MAGIC, FLIP_KEY, GROW
} damage;
static void spoil(const char *path, damage how)
{
    off_t size = file_size(path);
    assert_true(size > CG_CACHE_HEADER);
    if (how <= TRUNCATE_HALF) {
        off_t to[] = {0, CG_CACHE_HEADER, size / 2};
        assert_int_equal(truncate(path, to[how]), 0);
        return;
    }
    off_t at[] = {0, 0, 0, size - 1, 16, 0, 60, size};
    int fd = open(path, O_RDWR);
    unsigned char byte = 0;
    assert_true(fd >= 0);
    if (how != GROW) assert_int_equal(pread(fd, &byte, 1, at[how]), 1);
    byte ^= 0x20;
    assert_int_equal(pwrite(fd, &byte, 1, at[how]), 1);
    close(fd);
}

static void test_damaged_entry_files_are_deleted_and_read_as_misses(void **state)
{
    (void)state;
    char key[65], path[256], err[256];
    unsigned char *p = payload(1000, 1);
    key_of(1, key);
    for (damage how = TRUNCATE_EMPTY; how <= GROW; how++) {
        cg_cache *c;
        unsigned char *got;
        size_t size;
        assert_int_equal(cg_cache_open(cache_dir, 0, 0, &c, err, sizeof err), ALLOY_OK); /* nothing in memory */
        assert_int_equal(cg_cache_put(c, key, p, 1000, err, sizeof err), ALLOY_OK);
        cg_cache_entry_path(c, key, path, sizeof path);
        assert_int_equal(file_size(path), CG_CACHE_HEADER + 1000);
        assert_int_equal(cg_cache_get(c, key, &got, &size), ALLOY_OK); /* whole: a hit */
        assert_int_equal(size, 1000);
        assert_memory_equal(got, p, 1000);
        cg_free(got);
        spoil(path, how);
        if (cg_cache_get(c, key, &got, &size) != ALLOY_ERR_NOT_FOUND) fail_msg("damaged entry %d was read", (int)how);
        assert_null(got);
        assert_int_equal(file_size(path), -1);
        expect_stats(c, 1, 1, 1, 1, 0);
        cg_cache_close(c);
    }
    test_free(p);
}

static void test_a_damaged_entry_is_recompiled(void **state)
{
    (void)state;
    NEED_NVRTC();
    cg_kernel_src k = {.name = "scale_3", .source = kernel_source(3), .sm = 80};
    const damage hows[] = {TRUNCATE_HALF, FLIP_PAYLOAD};
    cg_binary first;
    cg_cache *c;
    char err[4096], path[256];
    assert_int_equal(cg_cache_open(cache_dir, 0, 0, &c, err, sizeof err), ALLOY_OK);
    assert_int_equal(cg_cache_compile(c, nv, &k, NULL, &first, err, sizeof err), ALLOY_OK);
    cg_cache_entry_path(c, first.key, path, sizeof path);
    for (int i = 0; i < 2; i++) {
        cg_binary again;
        spoil(path, hows[i]);
        assert_int_equal(cg_cache_compile(c, nv, &k, NULL, &again, err, sizeof err), ALLOY_OK);
        assert_false(again.cached);
        assert_memory_equal(again.data, first.data, first.size);
        expect_stats(c, 0, 0, i + 2, i + 1, i + 2);
        assert_int_equal(file_size(path), CG_CACHE_HEADER + first.size); /* written again, whole */
        cg_binary_free(&again);
    }
    cg_binary hit;
    assert_int_equal(cg_cache_compile(c, nv, &k, NULL, &hit, err, sizeof err), ALLOY_OK);
    assert_true(hit.cached);
    cg_binary_free(&hit);
    cg_binary_free(&first);
    cg_cache_close(c);
}

static void test_a_memory_only_cache_keeps_the_recently_used_within_its_bound(void **state)
{
    (void)state;
    cg_cache *c;
    char err[256], keys[3][65], path[256];
    unsigned char *p[3], *got;
    size_t size;
    assert_int_equal(cg_cache_open(NULL, 2500, 0, &c, err, sizeof err), ALLOY_OK);
    cg_cache_entry_path(c, "x", path, sizeof path);
    assert_string_equal(path, "");
    for (int i = 0; i < 3; i++) {
        key_of(i, keys[i]);
        p[i] = payload(1000, i);
    }
    assert_int_equal(cg_cache_get(c, keys[0], &got, &size), ALLOY_ERR_NOT_FOUND);
    assert_int_equal(cg_cache_put(c, keys[0], p[0], 1000, err, sizeof err), ALLOY_OK);
    assert_int_equal(cg_cache_put(c, keys[1], p[1], 1000, err, sizeof err), ALLOY_OK);
    assert_int_equal(cg_cache_get(c, keys[0], &got, &size), ALLOY_OK); /* 0 is now the more recent */
    assert_memory_equal(got, p[0], 1000);
    cg_free(got);
    assert_int_equal(cg_cache_put(c, keys[2], p[2], 1000, err, sizeof err), ALLOY_OK); /* 3000 > 2500: 1 leaves */
    assert_int_equal(cg_cache_get(c, keys[1], &got, &size), ALLOY_ERR_NOT_FOUND);
    for (int i = 0; i < 3; i += 2) {
        assert_int_equal(cg_cache_get(c, keys[i], &got, &size), ALLOY_OK);
        assert_memory_equal(got, p[i], 1000);
        cg_free(got);
    }
    expect_stats(c, 3, 0, 2, 0, 0);
    /* keys are hex digests, never paths */
    assert_int_equal(cg_cache_get(c, "../../etc/passwd", &got, &size), ALLOY_ERR_INVALID);
    assert_int_equal(cg_cache_put(c, "ABC", p[0], 1000, err, sizeof err), ALLOY_ERR_INVALID);
    for (int i = 0; i < 3; i++) test_free(p[i]);
    cg_cache_close(c);
}

static void test_the_disk_bound_deletes_the_least_recently_used_entries(void **state)
{
    (void)state;
    cg_cache *c;
    char err[256], keys[4][65], path[4][256], stale[256], stale_new[256], other[256];
    unsigned char *p = payload(1000, 9), *got;
    size_t size;
    assert_int_equal(cg_cache_open(cache_dir, 0, 3 * (CG_CACHE_HEADER + 1000), &c, err, sizeof err), ALLOY_OK);
    for (int i = 0; i < 4; i++) {
        key_of(i, keys[i]);
        cg_cache_entry_path(c, keys[i], path[i], sizeof path[i]);
    }
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cg_cache_put(c, keys[i], p, 1000, err, sizeof err), ALLOY_OK);
        set_mtime(path[i], 1000000000 + 1000 * i); /* 2001, oldest first */
    }
    /* temp files dead writers left an hour ago (an older alloy's name and
     * al_file_write's), and a file that is not the cache's */
    snprintf(stale, sizeof stale, "%s/%s.tmp-Ab12Cd", cache_dir, keys[3]);
    snprintf(stale_new, sizeof stale_new, "%s/%s.kernel.tmp.Ab12Cd", cache_dir, keys[2]);
    fclose(fopen(stale_new, "w"));
    set_mtime(stale_new, 1000000000);
    snprintf(other, sizeof other, "%s/notes.txt", cache_dir);
    fclose(fopen(stale, "w"));
    fclose(fopen(other, "w"));
    set_mtime(stale, 1000000000);
    set_mtime(other, 1000000000);
    assert_int_equal(cg_cache_get(c, keys[0], &got, &size), ALLOY_OK); /* touched: now the newest */
    cg_free(got);
    assert_int_equal(cg_cache_put(c, keys[3], p, 1000, err, sizeof err), ALLOY_OK); /* 4 > 3 entries */
    for (int i = 0; i < 4; i++) assert_int_equal(file_size(path[i]) >= 0, i != 1);
    assert_int_equal(file_size(stale), -1);
    assert_int_equal(file_size(stale_new), -1);
    assert_true(file_size(other) >= 0);
    assert_int_equal(cg_cache_get_stats(c).evicted, 1);
    /* the entry just written stays even when it alone is over the bound */
    cg_cache_close(c);
    assert_int_equal(cg_cache_open(cache_dir, 0, 10, &c, err, sizeof err), ALLOY_OK);
    assert_int_equal(cg_cache_put(c, keys[1], p, 1000, err, sizeof err), ALLOY_OK);
    assert_int_equal(count_entries(cache_dir), 1);
    assert_true(file_size(path[1]) >= 0);
    assert_int_equal(cg_cache_get_stats(c).evicted, 3);
    unlink(other);
    test_free(p);
    cg_cache_close(c);
}

/* Each allocation of open, put, get and a compile through the cache fails in
 * turn: every failure is ALLOY_ERR_OOM or absorbed (a copy the memory cache
 * could not keep), never a crash or a leak. */
static void test_each_failed_allocation_is_reported(void **state)
{
    (void)state;
    char key[65], err[4096];
    unsigned char *p = payload(100, 5), *got;
    size_t size;
    cg_kernel_src k = {.name = "scale_4", .source = kernel_source(4), .sm = 80};
    key_of(5, key);
    alloy_set_allocator(test_failing_realloc, NULL);
    for (test_fail_at = 0;; test_fail_at++) {
        cg_cache *c;
        cg_binary b = {0};
        test_remove_dir(cache_dir); /* the same path through the code every time */
        test_alloc_count = 0;
        alloy_status st = cg_cache_open(cache_dir, 1 << 20, 1 << 20, &c, err, sizeof err);
        if (st == ALLOY_OK) {
            st = cg_cache_put(c, key, p, 100, err, sizeof err);
            if (st == ALLOY_OK && (st = cg_cache_get(c, key, &got, &size)) == ALLOY_OK) cg_free(got);
            if (st == ALLOY_OK && nv) st = cg_cache_compile(c, nv, &k, NULL, &b, err, sizeof err);
            cg_binary_free(&b);
            cg_cache_close(c);
        }
        if (test_alloc_count <= test_fail_at) { /* nothing failed: done */
            assert_int_equal(st, ALLOY_OK);
            break;
        }
        if (st != ALLOY_OK && st != ALLOY_ERR_OOM) fail_msg("allocation %ld: status %d, %s", test_fail_at, st, err);
    }
    print_message("%ld allocations, each failed once\n", test_fail_at);
    assert_true(test_fail_at >= (nv ? 8 : 4));
    test_fail_at = -1;
    alloy_set_allocator(test_cmocka_realloc, NULL);
    test_free(p);
}

static void test_the_default_directory_follows_alloy_cache_dir_then_xdg_then_home(void **state)
{
    (void)state;
    char out[64];
    assert_int_equal(cg_cache_default_dir("/a/cache", "/xdg", "/home/u", out, sizeof out), ALLOY_OK);
    assert_string_equal(out, "/a/cache");
    assert_int_equal(cg_cache_default_dir("", "/xdg", "/home/u", out, sizeof out), ALLOY_OK);
    assert_string_equal(out, "/xdg/alloy");
    assert_int_equal(cg_cache_default_dir(NULL, "relative", "/home/u", out, sizeof out), ALLOY_OK);
    assert_string_equal(out, "/home/u/.cache/alloy");
    assert_int_equal(cg_cache_default_dir(NULL, NULL, "", out, sizeof out), ALLOY_ERR_NOT_FOUND);
    assert_string_equal(out, "");
    assert_int_equal(cg_cache_default_dir(NULL, NULL, "/home/someone-with-a-long-name/and/more", out, 16),
                     ALLOY_ERR_INVALID);
    assert_string_equal(out, "");
    /* a directory that cannot be made: a cache in memory only (and a
     * warning on stderr, which test_files checks) */
    cg_cache *c;
    char err[256], path[256];
    assert_int_equal(cg_cache_open("/proc/alloy-cache", 0, 0, &c, err, sizeof err), ALLOY_OK);
    cg_cache_entry_path(c, "0123", path, sizeof path);
    assert_string_equal(path, "");
    cg_cache_close(c);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_a_bad_path_is_unsupported_and_named),
        T(test_the_version_and_architectures_are_read),
        T(test_a_kernel_compiles_to_a_cubin_for_sm80_and_sm90),
        T(test_an_unlisted_arch_gives_ptx_for_the_newest_lower_one),
        T(test_bad_names_options_and_archs_are_rejected),
        T(test_a_syntax_error_returns_the_log_and_the_dumped_source_and_caches_nothing),
        T(test_eight_kernels_compile_in_parallel_in_input_order),
        T(test_the_key_covers_name_source_options_arch_kind_and_compiler),
        T(test_a_second_compile_hits_the_cache),
        T(test_damaged_entry_files_are_deleted_and_read_as_misses),
        T(test_a_damaged_entry_is_recompiled),
        T(test_a_memory_only_cache_keeps_the_recently_used_within_its_bound),
        T(test_the_disk_bound_deletes_the_least_recently_used_entries),
        T(test_each_failed_allocation_is_reported),
        T(test_the_default_directory_follows_alloy_cache_dir_then_xdg_then_home),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
