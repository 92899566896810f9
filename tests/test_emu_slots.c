/* test_emu_slots.c - the emulated device's global-memory checker (cuda_emu/emu_slots.c): kernels that write past their slot, read a slot no action of the step wrote, or read a dead slot fail with the slot named; correct ones pass. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_emu/emu_device.h"
#include "cuda_emu/emu_loader.h"

/* fill writes out[i] = i for i < n; twice writes out[i] = 2 in[i]; both one thread per element. */
static const char kernels_src[] =
    "extern \"C\" __global__ void fill(float *out, long long n)\n"
    "{\n"
    "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) out[i] = (float)i;\n"
    "}\n"
    "extern \"C\" __global__ void twice(float *out, const float *in, long long n)\n"
    "{\n"
    "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) out[i] = 2.0f * in[i];\n"
    "}\n"
    /* two blocks of 32 threads over a[0..64): mode 0, block 1 copies what block 0 wrote; 1, block 1
     * writes what block 0 read; 2, each block writes its index; 3, each writes 1; 4, atomic sums;
     * 5, block 0 writes, fences and counts itself done on a[0] (an atomic), block 1 counts, fences and
     * reads what block 0 wrote (a one-launch reduction's last block); 6, block 0 without its fence;
     * 7, block 1 without its fence; 8, as 5 but block 1 then writes over what block 0 wrote */
    "extern \"C\" __global__ void blocks(float *a, long long mode)\n"
    "{\n"
    "    unsigned t = threadIdx.x, b = blockIdx.x;\n"
    "    if (mode == 0) { if (b == 0) a[t] = 1.0f; else a[32 + t] = a[t]; }\n"
    "    if (mode == 1) { if (b == 0) a[32 + t] = a[t]; else a[t] = 2.0f; }\n"
    "    if (mode == 2) a[t] = (float)b;\n"
    "    if (mode == 3) a[t] = 1.0f;\n"
    "    if (mode == 4) atomicAdd(&a[0], 1.0f);\n"
    "    if (mode >= 5 && b == 0) {\n"
    "        a[32 + t] = 1.0f;\n"
    "        if (mode != 6) __threadfence();\n"
    "        __syncthreads();\n"
    "        if (t == 0) atomicAdd(&a[0], 1.0f);\n"
    "    }\n"
    "    if (mode >= 5 && b == 1) {\n"
    "        if (t == 0) atomicAdd(&a[0], 1.0f);\n"
    "        __syncthreads();\n"
    "        if (mode != 7) __threadfence();\n"
    "        if (a[32 + t] != 1.0f) a[1] = 7.0f;\n"
    "        if (mode == 8) a[32 + t] = 3.0f;\n"
    "    }\n"
    "}\n"
    "extern \"C\" void blocks__host(void **p) { blocks(*(float **)p[0], *(long long *)p[1]); }\n"
    "extern \"C\" void fill__host(void **p) { fill(*(float **)p[0], *(long long *)p[1]); }\n"
    "extern \"C\" void twice__host(void **p) { twice(*(float **)p[0], *(const float **)p[1], *(long long *)p[2]); }\n";

enum { slot_floats = 64, slot_bytes = slot_floats * 4 };

typedef struct fixture {
    cdev *dev;
    cdev_module *module;
    cdev_function *fill, *twice, *blocks;
    cdev_ptr arena, leaf; /* three slots a, b, c one after another; a leaf buffer of one slot */
} fixture;

static fixture fx;

static int setup(void **state)
{
    (void)state;
    char why[512];
    if (!(fx.dev = emu_device_open(90, why, sizeof why))) {
        fprintf(stderr, "skipped: %s\n", why);
        return -1;
    }
    const char *names[] = {"slots"}, *sources[] = {kernels_src};
    if (fx.dev->ops->load(fx.dev, 1, names, sources, &fx.module) ||
        fx.dev->ops->function(fx.dev, fx.module, "fill", &fx.fill) ||
        fx.dev->ops->function(fx.dev, fx.module, "twice", &fx.twice) ||
        fx.dev->ops->function(fx.dev, fx.module, "blocks", &fx.blocks) ||
        fx.dev->ops->alloc(fx.dev, 3 * slot_bytes, &fx.arena) || fx.dev->ops->alloc(fx.dev, slot_bytes, &fx.leaf)) {
        fprintf(stderr, "setup: %s\n", fx.dev->error);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fx.dev->ops->release(fx.dev, fx.arena);
    fx.dev->ops->release(fx.dev, fx.leaf);
    fx.dev->ops->unload(fx.dev, fx.module);
    fx.dev->ops->close(fx.dev);
    return 0;
}

/* Slot k of the arena holding node's value (tag node + 1), written or read by the launch. */
static cdev_extent slot(int k, int node, bool written)
{
    cdev_extent x = {.base = fx.arena + (cdev_ptr)(k * slot_bytes), .bytes = slot_bytes, .offset = k * slot_bytes,
                     .tag = (uint32_t)node + 1, .space = LP_ARENA, .written = written};
    snprintf(x.name, sizeof x.name, "%%%d", node);
    return x;
}

static void step_begin(void) { fx.dev->ops->step_begin(fx.dev, (cdev_ptr[]){fx.arena}, 1); }

/* fill<<<2, 64>>> of n elements into out, described as ext. */
static alloy_status fill(cdev_ptr out, long long n, cdev_extent ext)
{
    void *params[] = {&out, &n};
    fx.dev->ops->describe(fx.dev, &ext, 1);
    return fx.dev->ops->launch(fx.dev, fx.fill, 2, 64, params, 2);
}

/* twice<<<1, 64>>> of n elements from in to out, described as ext_out, ext_in. */
static alloy_status twice(cdev_ptr out, cdev_ptr in, long long n, cdev_extent ext_out, cdev_extent ext_in)
{
    void *params[] = {&out, &in, &n};
    cdev_extent ext[] = {ext_out, ext_in};
    fx.dev->ops->describe(fx.dev, ext, 2);
    return fx.dev->ops->launch(fx.dev, fx.twice, 1, 64, params, 3);
}

static void expect_error(alloy_status st, const char *const *parts)
{
    assert_int_equal(st, ALLOY_ERR_CUDA);
    for (int i = 0; parts[i]; i++)
        if (!strstr(fx.dev->error, parts[i])) fail_msg("no \"%s\" in: %s", parts[i], fx.dev->error);
}

/* A step that writes a, then b = 2 a from it, passes, and gives 2 i. */
static void correct_step_passes(void **state)
{
    (void)state;
    step_begin();
    assert_int_equal(fill(fx.arena, slot_floats, slot(0, 1, true)), ALLOY_OK);
    assert_int_equal(twice(fx.arena + slot_bytes, fx.arena, slot_floats, slot(1, 2, true), slot(0, 1, false)), ALLOY_OK);
    float got[slot_floats];
    assert_int_equal(fx.dev->ops->download(fx.dev, got, fx.arena + slot_bytes, sizeof got), ALLOY_OK);
    for (int i = 0; i < slot_floats; i++) assert_true(got[i] == 2.0f * (float)i);
    /* a leaf buffer (not fresh: an input) reads without a write this step */
    cdev_extent leaf = {.base = fx.leaf, .bytes = slot_bytes, .space = LP_LEAF, .tag = 9, .name = "x (input)"};
    assert_int_equal(twice(fx.arena + 2 * slot_bytes, fx.leaf, slot_floats, slot(2, 3, true), leaf), ALLOY_OK);
}

/* One element past slot a lands in slot b, the next arena slot, which the launch does not touch. */
static void write_past_slot_into_next_fails(void **state)
{
    (void)state;
    step_begin();
    expect_error(fill(fx.arena, slot_floats + 1, slot(0, 1, true)),
                 (const char *[]){"kernel fill: block (1,0,0) thread 0 writes 4 bytes", "offset 256 of a device allocation",
                                  "0 bytes past the end of slot %1 (arena offset 0, 256 bytes)", NULL});
}

/* The same overrun into b when b is the launch's input (here two slots long): a write into a slot
 * the launch only reads. */
static void write_past_slot_into_an_input_fails(void **state)
{
    (void)state;
    step_begin();
    cdev_extent b = slot(1, 2, true);
    b.bytes = 2 * slot_bytes;
    assert_int_equal(fill(fx.arena + slot_bytes, 2 * slot_floats, b), ALLOY_OK);
    cdev_ptr out = fx.arena, in = fx.arena + slot_bytes;
    long long n = slot_floats + 1;
    void *params[] = {&out, &in, &n};
    b.written = false;
    cdev_extent ext[] = {slot(0, 1, true), b};
    fx.dev->ops->describe(fx.dev, ext, 2);
    /* one block of 128 threads: thread 64 writes a[64], the first byte of b */
    expect_error(fx.dev->ops->launch(fx.dev, fx.twice, 1, 128, params, 3),
                 (const char *[]){"thread 64 writes 4 bytes", "byte 0 of slot %2 (arena offset 256, 512 bytes), which this launch only reads", NULL});
}

/* b = 2 a when nothing wrote a this step: the read names a and the value there (the device's
 * fresh memory, 0xff bytes: NaN). */
static void read_of_unwritten_slot_fails(void **state)
{
    (void)state;
    step_begin();
    expect_error(twice(fx.arena + 2 * slot_bytes, fx.arena + slot_bytes, slot_floats, slot(2, 3, true), slot(1, 2, false)),
                 (const char *[]){"kernel twice: block (0,0,0) thread 0 reads 4 bytes",
                                  "byte 0 of slot %2 (arena offset 256, 256 bytes), which no action of this step has written",
                                  NULL});
}

/* a written in the step before does not count in this one. */
static void last_steps_writes_do_not_count(void **state)
{
    (void)state;
    step_begin();
    assert_int_equal(fill(fx.arena, slot_floats, slot(0, 1, true)), ALLOY_OK);
    step_begin();
    expect_error(twice(fx.arena + slot_bytes, fx.arena, slot_floats, slot(1, 2, true), slot(0, 1, false)),
                 (const char *[]){"slot %1 (arena offset 0, 256 bytes), which no action of this step has written",
                                  "(value 0x00000000 = 0 as f32)", NULL});
}

/* a written, then its slot reused by value %7, then a read as a: a is dead. */
static void read_of_dead_slot_fails(void **state)
{
    (void)state;
    step_begin();
    assert_int_equal(fill(fx.arena, slot_floats, slot(0, 1, true)), ALLOY_OK);
    assert_int_equal(fill(fx.arena, 16, slot(0, 7, true)), ALLOY_OK);
    expect_error(twice(fx.arena + slot_bytes, fx.arena, slot_floats, slot(1, 2, true), slot(0, 1, false)),
                 (const char *[]){"byte 0 of slot %1 (arena offset 0, 256 bytes), which is dead",
                                  "the value of node 7 over it", "(value 0x00000000 = 0 as f32)", NULL});
    /* past what %7 wrote, a's bytes are still a's */
    assert_int_equal(twice(fx.arena + slot_bytes + 64, fx.arena + 64, slot_floats - 16, slot(1, 2, true), slot(0, 1, false)),
                     ALLOY_OK);
}

/* One launch holding two values in slot a, both written (a chain kernel of several scalar steps,
 * one value written in place over another): what it leaves there counts as any value, so a later
 * read as either passes; written as one of them alone, a read as the other is dead. */
static void a_launch_writing_two_values_into_one_slot_leaves_any_value(void **state)
{
    (void)state;
    step_begin();
    long long n = slot_floats;
    cdev_ptr out = fx.arena;
    void *params[] = {&out, &n};
    cdev_extent both[] = {slot(0, 1, true), slot(0, 4, true)};
    fx.dev->ops->describe(fx.dev, both, 2);
    assert_int_equal(fx.dev->ops->launch(fx.dev, fx.fill, 2, 64, params, 2), ALLOY_OK);
    assert_int_equal(twice(fx.arena + slot_bytes, fx.arena, slot_floats, slot(1, 2, true), slot(0, 4, false)), ALLOY_OK);
    assert_int_equal(twice(fx.arena + slot_bytes, fx.arena, slot_floats, slot(1, 2, true), slot(0, 1, false)), ALLOY_OK);
    step_begin();
    assert_int_equal(fill(fx.arena, slot_floats, slot(0, 1, true)), ALLOY_OK);
    expect_error(twice(fx.arena + slot_bytes, fx.arena, slot_floats, slot(1, 2, true), slot(0, 4, false)),
                 (const char *[]){"which is dead", "the value of node 1 over it", NULL});
}

/* A copy (an update into its state) of a value not written this step. */
static void copy_of_unwritten_slot_fails(void **state)
{
    (void)state;
    step_begin();
    cdev_extent ext[] = {{.base = fx.leaf, .bytes = slot_bytes, .space = LP_LEAF, .written = true, .name = "the destination"},
                         slot(2, 3, false)};
    fx.dev->ops->describe(fx.dev, ext, 2);
    expect_error(fx.dev->ops->copy(fx.dev, fx.leaf, fx.arena + 2 * slot_bytes, slot_bytes),
                 (const char *[]){"copy reads 256 bytes", "slot %3 (arena offset 512, 256 bytes), which no action", NULL});
}

/* blocks<<<2, 32>>> in mode over slot a (written first, as a[i] = i). */
static alloy_status blocks(long long mode)
{
    step_begin();
    assert_int_equal(fill(fx.arena, slot_floats, slot(0, 1, true)), ALLOY_OK);
    cdev_ptr a = fx.arena;
    void *params[] = {&a, &mode};
    cdev_extent ext = slot(0, 1, true);
    fx.dev->ops->describe(fx.dev, &ext, 1);
    return fx.dev->ops->launch(fx.dev, fx.blocks, 2, 32, params, 2);
}

/* Block 1 reads what block 0 wrote in the launch: correct in the emulation's block order only. */
static void read_of_another_blocks_write_fails(void **state)
{
    (void)state;
    expect_error(blocks(0), (const char *[]){"kernel blocks: block (1,0,0) thread 0 reads 4 bytes",
                                             "byte 0 of slot %1 (arena offset 0, 256 bytes), which block 0 wrote in "
                                             "the same launch (a race on global memory",
                                             NULL});
}

static void write_of_what_another_block_read_fails(void **state)
{
    (void)state;
    expect_error(blocks(1), (const char *[]){"block (1,0,0) thread 0 writes 4 bytes", "which block 0 read in the same launch",
                                             NULL});
}

static void blocks_writing_different_values_fail(void **state)
{
    (void)state;
    expect_error(blocks(2), (const char *[]){"kernel blocks: race on global memory: blocks 0 and 1 write different values",
                                             "of slot %1 (arena offset 0, 256 bytes)", NULL});
}

/* Every block writing the same value (a flag set to 1), and atomic sums, are no race. */
static void same_value_writes_and_atomics_pass(void **state)
{
    (void)state;
    assert_int_equal(blocks(3), ALLOY_OK);
    assert_int_equal(blocks(4), ALLOY_OK);
    float sum;
    assert_int_equal(fx.dev->ops->download(fx.dev, &sum, fx.arena, sizeof sum), ALLOY_OK);
    assert_true(sum == 64.0f);
}

/* A block's writes, a __threadfence, then an atomic publish them; another block's atomic, then a
 * __threadfence, lets it read them (the last block of a one-launch reduction reading the others'
 * partials). Without either fence the read is a race. */
static void reads_ordered_by_a_fence_and_an_atomic_pass_and_fail_without_a_fence(void **state)
{
    (void)state;
    assert_int_equal(blocks(5), ALLOY_OK);
    float a[2];
    assert_int_equal(fx.dev->ops->download(fx.dev, a, fx.arena, sizeof a), ALLOY_OK);
    assert_true(a[0] == 2.0f && a[1] == 1.0f); /* both counted; block 1 read 1s */
    assert_int_equal(blocks(8), ALLOY_OK); /* a write over the published block's write: ordered, no race */
    float third;
    assert_int_equal(fx.dev->ops->download(fx.dev, &third, fx.arena + 40 * sizeof(float), sizeof third), ALLOY_OK);
    assert_true(third == 3.0f);
    expect_error(blocks(6), (const char *[]){"block (1,0,0) thread", "reads 4 bytes", "which block 0 wrote in the same launch",
                                             NULL});
    expect_error(blocks(7), (const char *[]){"block (1,0,0) thread", "reads 4 bytes", "which block 0 wrote in the same launch",
                                             NULL});
}

/* In a build with AddressSanitizer the checked kernels are compiled without it, and ask the
 * process's ASan about each access: a write past a host buffer fails the launch, as ASan would
 * have stopped the process, while the shared-memory checks run too. */
static void asan_build_catches_a_kernels_heap_overrun(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__)
    char err[2048];
    emu_kernel *k = emu_compile(kernels_src, "fill", err, sizeof err);
    if (!k) fail_msg("%s", err);
    float *out = malloc(slot_bytes);
    assert_non_null(out);
    long long n = slot_floats + 1;
    void *params[] = {&out, &n};
    const unsigned grid[3] = {2, 1, 1}, block[3] = {64, 1, 1};
    assert_int_equal(emu_launch(k, grid, block, params, err, sizeof err), -1);
    if (!strstr(err, "kernel fill: block (1,0,0) thread 0 writes 4 bytes at") ||
        !strstr(err, "AddressSanitizer marks byte"))
        fail_msg("%s", err);
    n = slot_floats;
    assert_int_equal(emu_launch(k, grid, block, params, err, sizeof err), 0);
    assert_true(out[slot_floats - 1] == (float)(slot_floats - 1));
    free(out);
    emu_free(k);
#else
    skip();
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(correct_step_passes),
        cmocka_unit_test(write_past_slot_into_next_fails),
        cmocka_unit_test(write_past_slot_into_an_input_fails),
        cmocka_unit_test(read_of_unwritten_slot_fails),
        cmocka_unit_test(last_steps_writes_do_not_count),
        cmocka_unit_test(read_of_dead_slot_fails),
        cmocka_unit_test(a_launch_writing_two_values_into_one_slot_leaves_any_value),
        cmocka_unit_test(copy_of_unwritten_slot_fails),
        cmocka_unit_test(read_of_another_blocks_write_fails),
        cmocka_unit_test(write_of_what_another_block_read_fails),
        cmocka_unit_test(blocks_writing_different_values_fail),
        cmocka_unit_test(same_value_writes_and_atomics_pass),
        cmocka_unit_test(reads_ordered_by_a_fence_and_an_atomic_pass_and_fail_without_a_fence),
        cmocka_unit_test(asan_build_catches_a_kernels_heap_overrun),
    };
    char why[512];
    if (!emu_available(why, sizeof why)) {
        fprintf(stderr, "skipped: %s\n", why);
        return 77;
    }
    if (!emu_checks_shared()) {
        fprintf(stderr, "skipped: the kernels are not compiled with the checker's hooks (ALLOY_EMU_CHECK=0, or a ThreadSanitizer build)\n");
        return 77;
    }
    return cmocka_run_group_tests(tests, setup, teardown);
}
