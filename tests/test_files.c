/* test_files.c - the files alloy writes and reads (base/file.h): saves through symbolic links, targets that are not regular files refused, FIFOs and devices never read or waited on, empty paths, failed dumps, an unusable kernel cache directory. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "alloy/alloy.h"
#include "base/file.h"
#include "codegen/cache.h"
#include "support.h"

#ifndef ALLOY_TEST_DATA
#error "build with -DALLOY_TEST_DATA=\"<source dir>/tests/data\""
#endif
#define MLP2 ALLOY_TEST_DATA "/mlp2.ir"

/* ---- helpers ---- */

/* Every test runs under an alarm: a reader that waits on a FIFO kills the
 * suite (a failure) instead of hanging it. */
static int setup(void **state)
{
    alarm(60);
    return test_tmpdir_setup(state);
}

static int teardown(void **state)
{
    alarm(0);
    return test_tmpdir_teardown(state);
}

static alloy_graph *mlp2(uint64_t seed)
{
    char err[512];
    alloy_graph *g = alloy_graph_load_ir(MLP2, err, sizeof err);
    if (!g) fail_msg("%s", err);
    alloy_graph_set_seed(g, seed);
    return g;
}

static void expect_message(const char *got, const char *want)
{
    if (!strstr(got, want)) fail_msg("the message lacks \"%s\": %s", want, got);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* Whether two files have the same bytes. */
static bool same_file(const char *a, const char *b)
{
    size_t na, nb;
    unsigned char *x = test_read_file(a, &na), *y = test_read_file(b, &nb);
    bool same = na == nb && memcmp(x, y, na) == 0;
    test_free(x), test_free(y);
    return same;
}

/* Entries of the test directory whose name contains part. */
static int entries_with(const char *part)
{
    int n = 0;
    DIR *d = opendir(test_tmpdir);
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, part) != NULL;
    if (d) closedir(d);
    return n;
}

/* stderr into a file from here until stderr_back. */
static int stderr_to(const char *path)
{
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    return saved;
}

static void stderr_back(int saved)
{
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
}

/* How often needle occurs in the file at path. */
static int count_in(const char *path, const char *needle)
{
    size_t n;
    char *text = (char *)test_read_file(path, &n);
    int k = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++) k++;
    test_free(text);
    return k;
}

/* ---- saving through links ---- */

/* The case: a checkpoint path that is a symbolic link. The save
 * writes the link's target (it held the old state) and the link stays a
 * link with the same text; a chain of links and a dangling link (whose
 * target the save creates) too. Before, the link became a regular file and
 * its target kept the old state. */
static void test_a_save_through_a_symlink_writes_its_target_and_leaves_the_link(void **state)
{
    (void)state;
    alloy_graph *g = mlp2(7);
    char real[256], link[256], chain[256], direct[256], dangling[256], made[256];
    snprintf(real, sizeof real, "%s", test_tmp_path("real.safetensors"));
    snprintf(link, sizeof link, "%s", test_tmp_path("link.safetensors"));
    snprintf(chain, sizeof chain, "%s", test_tmp_path("chain.safetensors"));
    snprintf(direct, sizeof direct, "%s", test_tmp_path("direct.safetensors"));
    snprintf(dangling, sizeof dangling, "%s", test_tmp_path("dangling.safetensors"));
    snprintf(made, sizeof made, "%s", test_tmp_path("made.safetensors"));
    write_text(real, "the old state");
    assert_int_equal(symlink("real.safetensors", link), 0); /* relative: from the link's folder */
    assert_int_equal(symlink(link, chain), 0);              /* absolute, to a link */
    assert_int_equal(symlink("made.safetensors", dangling), 0);

    if (alloy_graph_save_checkpoint(g, direct)) fail_msg("%s", alloy_last_error(g));
    if (alloy_graph_save_checkpoint(g, link)) fail_msg("%s", alloy_last_error(g));
    struct stat sb;
    char text[256];
    assert_int_equal(lstat(link, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    ssize_t n = readlink(link, text, sizeof text - 1);
    assert_true(n > 0);
    text[n] = '\0';
    assert_string_equal(text, "real.safetensors");
    assert_true(same_file(real, direct));

    write_text(real, "the old state");
    if (alloy_graph_save_checkpoint(g, chain)) fail_msg("%s", alloy_last_error(g));
    assert_int_equal(lstat(chain, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_true(same_file(real, direct));

    if (alloy_graph_save_checkpoint(g, dangling)) fail_msg("%s", alloy_last_error(g));
    assert_int_equal(lstat(dangling, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_true(same_file(made, direct));
    /* and it loads back through the link */
    alloy_graph *h = mlp2(8);
    if (alloy_graph_load_checkpoint(h, link)) fail_msg("%s", alloy_last_error(h));
    assert_int_equal(entries_with(".tmp."), 0);
    alloy_graph_free(h);
    alloy_graph_free(g);
}

/* ---- targets that are not regular files ---- */

/* A FIFO, a directory, a device node and a link to a FIFO as the target of
 * a checkpoint, a safetensors save and a bundle: each refused with a
 * message naming the path and what is there, the thing left as it was, no
 * temporary file left. Before, a FIFO or device was replaced by a regular
 * file (a directory failed at the rename with a message about the
 * temporary file). */
static void test_fifo_directory_and_device_targets_are_refused_and_left_as_they_are(void **state)
{
    (void)state;
    alloy_graph *g = mlp2(7);
    char fifo[256], dir[256], dev[256], link[256];
    snprintf(fifo, sizeof fifo, "%s", test_tmp_path("fifo"));
    snprintf(dir, sizeof dir, "%s", test_tmp_path("dir"));
    snprintf(dev, sizeof dev, "%s", test_tmp_path("null"));
    snprintf(link, sizeof link, "%s", test_tmp_path("to_fifo"));
    assert_int_equal(mkfifo(fifo, 0644), 0);
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_int_equal(symlink(fifo, link), 0);
    /* a device node of our own (/dev/null's numbers): replacing it would harm nothing */
    bool have_dev = mknod(dev, S_IFCHR | 0666, makedev(1, 3)) == 0;
    if (!have_dev) print_message("mknod: %s; the device case runs on /dev/null alone\n", strerror(errno));

    const struct {
        const char *path, *what;
        mode_t type;
    } cases[] = {{fifo, "is a FIFO (named pipe), not a regular file", S_IFIFO},
                 {dir, "is a directory, not a regular file", S_IFDIR},
                 {link, "(a link to ", S_IFIFO},
                 {dev, "is a character device, not a regular file", S_IFCHR}};
    for (int c = 0; c < 4; c++) {
        if (cases[c].path == dev && !have_dev) continue;
        const char *p = cases[c].path;
        alloy_status st = alloy_graph_save_checkpoint(g, p);
        if (st != ALLOY_ERR_IO) fail_msg("save_checkpoint %s: %s, %s", p, alloy_status_name(st), alloy_last_error(g));
        expect_message(alloy_last_error(g), p);
        expect_message(alloy_last_error(g), cases[c].what);
        char err[1024];
        alloy_host_tensor t = {.name = "t", .dtype = ALLOY_F32, .rank = 0, .data = &(float){1}};
        assert_int_equal(alloy_safetensors_save(p, &t, 1, NULL, NULL, 0, err, sizeof err), ALLOY_ERR_IO);
        expect_message(err, cases[c].what);
        st = alloy_graph_save_bundle(g, p, NULL);
        if (st != ALLOY_ERR_IO) fail_msg("save_bundle %s: %s, %s", p, alloy_status_name(st), alloy_last_error(g));
        expect_message(alloy_last_error(g), cases[c].what);
        struct stat sb;
        assert_int_equal(stat(p, &sb), 0);
        assert_int_equal(sb.st_mode & S_IFMT, cases[c].type);
    }
    assert_int_equal(entries_with(".tmp."), 0);
    assert_int_equal(entries_with(".state-"), 0);

    /* /dev/null itself (we may run as root, so a replace would succeed):
     * only after the same path refused our own node and the check refuses
     * it, so no failure here can get to a rename over it */
    char err[1024];
    struct stat before, after;
    assert_int_equal(stat("/dev/null", &before), 0);
    assert_true(S_ISCHR(before.st_mode));
    assert_int_equal(al_file_check_writable("/dev/null", err, sizeof err), ALLOY_ERR_IO);
    expect_message(err, "/dev/null: is a character device, not a regular file");
    assert_int_equal(alloy_graph_save_checkpoint(g, "/dev/null"), ALLOY_ERR_IO);
    expect_message(alloy_last_error(g), "/dev/null: is a character device");
    assert_int_equal(stat("/dev/null", &after), 0);
    assert_true(S_ISCHR(after.st_mode) && after.st_rdev == before.st_rdev && after.st_ino == before.st_ino);
    alloy_graph_free(g);
}

/* A missing folder is named as such, before any step or compile. */
static void test_a_missing_folder_is_named_and_checked_without_writing(void **state)
{
    (void)state;
    char err[1024], p[256];
    snprintf(p, sizeof p, "%s", test_tmp_path("no/such/ckpt.safetensors"));
    assert_int_equal(al_file_check_writable(p, err, sizeof err), ALLOY_ERR_IO);
    expect_message(err, "cannot create a temporary file in the folder");
    expect_message(err, "no/such: No such file or directory");
    snprintf(p, sizeof p, "%s", test_tmp_path("fresh.safetensors"));
    assert_int_equal(al_file_check_writable(p, err, sizeof err), ALLOY_OK);
    assert_int_equal(access(p, F_OK), -1); /* checked, nothing made */
    assert_int_equal(entries_with(".tmp."), 0);
}

/* ---- reading what is not a regular file ---- */

/* A FIFO given to every reader (checkpoint, parameters, safetensors,
 * bundle, a kernel cache entry) is an error at once, with no writer ever
 * opening it. Before, each blocked forever in open(). */
static void test_a_fifo_is_refused_by_every_reader_instead_of_blocking(void **state)
{
    (void)state;
    char fifo[256], err[1024];
    snprintf(fifo, sizeof fifo, "%s", test_tmp_path("fifo"));
    assert_int_equal(mkfifo(fifo, 0644), 0);
    double t0 = test_now_ms();
    alloy_graph *g = mlp2(7);
    assert_int_equal(alloy_graph_load_checkpoint(g, fifo), ALLOY_ERR_IO);
    expect_message(alloy_last_error(g), "fifo: cannot read: it is a FIFO (named pipe), not a regular file");
    int loaded = -1, ignored = -1;
    assert_int_equal(alloy_graph_load_params(g, fifo, &loaded, &ignored), ALLOY_ERR_IO);
    expect_message(alloy_last_error(g), "is a FIFO");
    alloy_safetensors *st = NULL;
    assert_int_equal(alloy_safetensors_load(fifo, &st, err, sizeof err), ALLOY_ERR_IO);
    assert_null(st);
    expect_message(err, "is a FIFO");
    alloy_bundle *b = NULL;
    assert_int_equal(alloy_bundle_load(fifo, &b, err, sizeof err), ALLOY_ERR_IO);
    assert_null(b);
    expect_message(err, "fifo: cannot read: it is a FIFO");

    /* a FIFO where a cache entry should be: a bad entry, removed, a miss */
    char dir[256], key[CG_KEY_HEX + 1], entry[512];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("cache"));
    cg_cache *c;
    assert_int_equal(cg_cache_open(dir, 1 << 20, 0, &c, err, sizeof err), ALLOY_OK);
    cg_cache_key("k", "src", "", 80, CG_CUBIN, "nvrtc", key);
    cg_cache_entry_path(c, key, entry, sizeof entry);
    assert_int_equal(mkfifo(entry, 0644), 0);
    unsigned char *data;
    size_t size;
    assert_int_equal(cg_cache_get(c, key, &data, &size), ALLOY_ERR_NOT_FOUND);
    assert_int_equal(cg_cache_get_stats(c).corrupt, 1);
    assert_int_equal(access(entry, F_OK), -1);
    cg_cache_close(c);
    test_remove_dir(dir);
    double ms = test_now_ms() - t0;
    print_message("six readers refused the FIFO in %.1f ms\n", ms);
    assert_true(ms < 20000);
    alloy_graph_free(g);
}

/* /dev/zero as a bundle or a checkpoint is refused before a byte is read,
 * a directory as a bundle is named as one, and a bundle file is checked
 * against its header's size before it is read. Before, a bundle read
 * /dev/zero until memory ran out (9 GB) and a directory gave "read error". */
static void test_dev_zero_and_directories_are_refused_at_once(void **state)
{
    (void)state;
    char err[1024];
    double t0 = test_now_ms();
    alloy_bundle *b = NULL;
    assert_int_equal(alloy_bundle_load("/dev/zero", &b, err, sizeof err), ALLOY_ERR_IO);
    assert_string_equal(err, "/dev/zero: cannot read: it is a character device, not a regular file");
    alloy_graph *g = mlp2(7);
    assert_int_equal(alloy_graph_load_checkpoint(g, "/dev/zero"), ALLOY_ERR_IO);
    expect_message(alloy_last_error(g), "/dev/zero: cannot read: it is a character device");
    alloy_safetensors *st;
    assert_int_equal(alloy_safetensors_load("/dev/zero", &st, err, sizeof err), ALLOY_ERR_IO);
    double ms = test_now_ms() - t0;
    print_message("/dev/zero refused by three readers in %.2f ms\n", ms);
    assert_true(ms < 5000);

    assert_int_equal(alloy_bundle_load(test_tmpdir, &b, err, sizeof err), ALLOY_ERR_IO);
    expect_message(err, "cannot read: it is a directory, not a regular file");
    assert_int_equal(strncmp(err, test_tmpdir, strlen(test_tmpdir)), 0);

    /* a bundle whose header gives another size than the file has */
    const char *path = test_tmp_path("step.alloy");
    if (alloy_graph_save_bundle(g, path, NULL)) fail_msg("%s", alloy_last_error(g));
    FILE *f = fopen(path, "ab");
    assert_non_null(f);
    fputs("more", f);
    fclose(f);
    assert_int_equal(alloy_bundle_load(path, &b, err, sizeof err), ALLOY_ERR_FORMAT);
    expect_message(err, "step.alloy: trailing bytes: the header gives");
    alloy_graph_free(g);
}

/* ---- empty paths ---- */

static void test_empty_paths_are_clear_errors(void **state)
{
    (void)state;
    alloy_graph *g = mlp2(7);
    assert_int_equal(alloy_graph_save_checkpoint(g, ""), ALLOY_ERR_INVALID);
    assert_string_equal(alloy_last_error(g), "save_state: the path is empty: name the file to write");
    assert_int_equal(alloy_graph_load_checkpoint(g, ""), ALLOY_ERR_INVALID);
    assert_string_equal(alloy_last_error(g), "load_state: the path is empty: name the file to read");
    assert_int_equal(alloy_graph_save_bundle(g, "", NULL), ALLOY_ERR_INVALID);
    expect_message(alloy_last_error(g), "the path is empty");
    char err[512];
    alloy_host_tensor t = {.name = "t", .dtype = ALLOY_F32, .rank = 0, .data = &(float){1}};
    assert_int_equal(alloy_safetensors_save("", &t, 1, NULL, NULL, 0, err, sizeof err), ALLOY_ERR_INVALID);
    expect_message(err, "the path is empty");
    alloy_safetensors *st;
    assert_int_equal(alloy_safetensors_load("", &st, err, sizeof err), ALLOY_ERR_INVALID);
    expect_message(err, "the path is empty");
    alloy_bundle *b;
    assert_int_equal(alloy_bundle_load("", &b, err, sizeof err), ALLOY_ERR_INVALID);
    expect_message(err, "the path is empty");
    alloy_graph_free(g);
}

/* ---- dumps whose writes fail ---- */

/* alloy_graph_dump to /dev/full (every write ENOSPC) and to a stream whose
 * descriptor is closed (EBADF) fails with ALLOY_ERR_IO naming why; the IR
 * printed after a pass to /dev/full fails the compile. Before, all
 * returned ALLOY_OK with the output lost. */
static void test_dumps_and_prints_whose_writes_fail_return_an_error(void **state)
{
    (void)state;
    alloy_graph *g = mlp2(7);
    static const alloy_dump_kind kinds[] = {ALLOY_DUMP_SOURCE, ALLOY_DUMP_IR, ALLOY_DUMP_DOT, ALLOY_DUMP_MEMORY_SVG};
    for (int k = 0; k < 4; k++) {
        FILE *full = fopen("/dev/full", "w");
        assert_non_null(full);
        alloy_status st = alloy_graph_dump(g, full, kinds[k]);
        if (st != ALLOY_ERR_IO) fail_msg("dump kind %d to /dev/full: %s", (int)kinds[k], alloy_status_name(st));
        /* the IR's write fails at the flush; the pictures' writers may see the error first */
        expect_message(alloy_last_error(g), "dump: writing ");
        expect_message(alloy_last_error(g), kinds[k] < ALLOY_DUMP_DOT ? "graph 'mlp2' failed: No space left on device"
                                                                      : "graph 'mlp2' failed");
        fclose(full);
    }
    FILE *closed = fopen(test_tmp_path("closed.ir"), "w");
    assert_non_null(closed);
    close(fileno(closed));
    assert_int_equal(alloy_graph_dump(g, closed, ALLOY_DUMP_SOURCE), ALLOY_ERR_IO);
    expect_message(alloy_last_error(g), "Bad file descriptor");
    fclose(closed);
    /* and a dump that can be written still is */
    FILE *ok = fopen(test_tmp_path("ok.ir"), "w");
    assert_int_equal(alloy_graph_dump(g, ok, ALLOY_DUMP_SOURCE), ALLOY_OK);
    fclose(ok);

    FILE *full = fopen("/dev/full", "w");
    assert_int_equal(alloy_graph_print_after(g, "dce", full), ALLOY_OK);
    alloy_memory_info info;
    alloy_status st = alloy_graph_memory_info(g, &info);
    if (st != ALLOY_ERR_IO) fail_msg("compile printing to /dev/full: %s", alloy_status_name(st));
    expect_message(alloy_last_error(g), "print_after dce: writing the output failed: No space left on device");
    fclose(full);
    assert_int_equal(alloy_graph_print_after(g, NULL, NULL), ALLOY_OK);
    assert_int_equal(alloy_graph_memory_info(g, &info), ALLOY_OK);
    alloy_graph_free(g);
}

/* ---- the kernel cache's directory ---- */

/* A cache directory that cannot be made (under a regular file: ENOTDIR
 * even for root) is no error: the cache works in memory, and one warning
 * names the directory however often it is opened. Then, as a service user
 * with HOME naming no usable directory and no ALLOY_CACHE_DIR, a CUDA
 * export compiles (where NVRTC is). Before, the open failed and with it
 * every compile. */
static void test_an_unusable_cache_directory_warns_once_and_compiles_in_memory(void **state)
{
    (void)state;
    char home[256], dir[300], log[256], err[512];
    snprintf(home, sizeof home, "%s", test_tmp_path("home"));
    snprintf(dir, sizeof dir, "%s/.cache/alloy", home);
    snprintf(log, sizeof log, "%s", test_tmp_path("stderr.txt"));
    write_text(home, "a file, not a folder");
    int saved = stderr_to(log);
    cg_cache *c1 = NULL, *c2 = NULL;
    alloy_status s1 = cg_cache_open(dir, 1 << 20, 0, &c1, err, sizeof err);
    alloy_status s2 = cg_cache_open(dir, 1 << 20, 0, &c2, err, sizeof err);
    stderr_back(saved);
    assert_int_equal(s1, ALLOY_OK);
    assert_int_equal(s2, ALLOY_OK);
    char key[CG_KEY_HEX + 1], entry[512];
    cg_cache_key("k", "src", "", 80, CG_CUBIN, "nvrtc", key);
    cg_cache_entry_path(c1, key, entry, sizeof entry);
    assert_string_equal(entry, ""); /* in memory only */
    assert_int_equal(cg_cache_put(c1, key, "bytes", 5, err, sizeof err), ALLOY_OK);
    unsigned char *data;
    size_t size;
    assert_int_equal(cg_cache_get(c1, key, &data, &size), ALLOY_OK);
    assert_true(size == 5 && memcmp(data, "bytes", 5) == 0);
    cg_free(data);
    cg_cache_close(c1);
    cg_cache_close(c2);
    assert_int_equal(count_in(log, "alloy: warning: the kernel cache directory"), 1);
    assert_int_equal(count_in(log, dir), 1);
    assert_int_equal(count_in(log, "Not a directory"), 1);

    /* the service user's export */
    char xdg_save[512] = "", *xdg = getenv("XDG_CACHE_HOME"), *home_was = getenv("HOME");
    char home_save[512];
    snprintf(home_save, sizeof home_save, "%s", home_was ? home_was : "");
    if (xdg) snprintf(xdg_save, sizeof xdg_save, "%s", xdg);
    setenv("HOME", home, 1);
    unsetenv("XDG_CACHE_HOME");
    unsetenv("ALLOY_CACHE_DIR");
    unsetenv("ALLOY_CACHE");
    alloy_graph *g = mlp2(7);
    char out[256];
    snprintf(out, sizeof out, "%s", test_tmp_path("export"));
    alloy_status st = alloy_graph_export_cuda(g, "sm_80", out);
    bool no_nvrtc = st == ALLOY_ERR_UNSUPPORTED && strstr(alloy_last_error(g), "NVRTC is not available");
    if (!no_nvrtc && st) fail_msg("export with HOME=%s: %s", home, alloy_last_error(g));
    alloy_graph_free(g);
    setenv("HOME", home_save, 1);
    if (xdg) setenv("XDG_CACHE_HOME", xdg_save, 1);
    if (no_nvrtc) skip();
    char cubin[320];
    snprintf(cubin, sizeof cubin, "%s/alloy_m0.sm_80.cubin", out);
    assert_int_equal(access(cubin, F_OK), 0);
    test_remove_dir(out);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_a_save_through_a_symlink_writes_its_target_and_leaves_the_link),
        T(test_fifo_directory_and_device_targets_are_refused_and_left_as_they_are),
        T(test_a_missing_folder_is_named_and_checked_without_writing),
        T(test_a_fifo_is_refused_by_every_reader_instead_of_blocking),
        T(test_dev_zero_and_directories_are_refused_at_once),
        T(test_empty_paths_are_clear_errors),
        T(test_dumps_and_prints_whose_writes_fail_return_an_error),
        T(test_an_unusable_cache_directory_warns_once_and_compiles_in_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
