/* emu.h - the CUDA execution model on the host, force-included (-include emu.h -DALLOY_HOST_EMULATION) into a generated kernel source compiled as C++17: each block's threads run as fibers on one OS thread, blocks one after another. */
#ifndef ALLOY_EMU_H
#define ALLOY_EMU_H

/* What a kernel gets: the keywords (__global__ ... __launch_bounds__), threadIdx, blockIdx,
 * blockDim, gridDim, warpSize; __syncthreads, __syncwarp; __shfl_sync, __shfl_up_sync,
 * __shfl_down_sync, __shfl_xor_sync (full mask only; int, unsigned, long, long long and their
 * unsigned, float, double); the warp's tensor-core product mma.sync.m16n8k16 (f16 and bf16 in, f32
 * accumulators) as the generated source names it, alloy_mma_m16n8k16_f16/_bf16; the fragment loads
 * ldmatrix.x4 (and .trans) as alloy_ldmatrix_x4/_trans, the 16-byte cp.async copies with their commit and
 * wait (alloy_cp_async_16, _commit, _wait_all, _wait_1); atomicAdd/Sub/Max/Min/Or/And/Exch/CAS; __threadfence; __ldg; the math
 * of <cmath> with float overloads (exp(float) is float) and rsqrtf/rsqrt, __expf, __logf,
 * __fdividef, min/max, __float_as_int and its kin. Not here: extern __shared__ (dynamic shared
 * memory), __ballot_sync, __any_sync, __activemask, cooperative groups, half types, textures.
 *
 * What differs from a GPU: threads switch only at barriers, shuffles, mma products and ldmatrix, and blocks
 * run one after another, so a thread that spins waiting for another thread or block never returns; __shared__
 * arrays start with the previous block's values; floating point is the host's (no FMA contraction),
 * unless ALLOY_EMU_NUMERICS=gpu (emu_gpumath.h: contraction and CUDA's math at its documented bounds).
 * The checkers (below, "the checkers"; ALLOY_EMU_CHECK=0 turns them off) make the rest an error
 * instead of luck: a barrier reached a different number of times per thread, a full-mask shuffle
 * reading an exited lane, one warp's shuffles at different call sites, two threads' accesses to a
 * byte of shared memory in one barrier interval (one of them a write), and a read of shared
 * memory no thread of the block wrote; with the emulated device's map of plan slots (the tests'
 * emu_slots.h), global accesses outside their slots, reads of slots not written this step or
 * dead, and races between blocks; in a process with AddressSanitizer, an access to what it marks
 * unaddressable. Without them a shuffle reading an exited lane gets the reader's own value.
 * ALLOY_EMU_BLOCKS (emu_blocks.h) runs only the blocks it names (first, last, indices, seeded
 * random ones), for launches at full size. Each thread has
 * ALLOY_EMU_STACK bytes of stack (64 KiB, 256 KiB under ASan) above a guard page; compile with
 * -fstack-clash-protection so that a large frame cannot jump over it. */

#ifndef __cplusplus
#error "emu.h emulates CUDA C++: compile the kernel source as C++17"
#endif

#include <math.h>
#include <cmath>
#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "emu_blocks.h"

/* Kernels compiled with AddressSanitizer tell it about every stack switch. */
#if defined(__SANITIZE_ADDRESS__)
#define ALLOY_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ALLOY_EMU_ASAN 1
#endif
#endif
#ifdef ALLOY_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#else
/* A kernel compiled for the checkers without ASan may still run in a process that has it (the
 * tests' sanitizer build): its runtime is then there to ask (emu_shadow.h), else these are null. */
extern "C" void *__asan_region_is_poisoned(void *beg, size_t size) __attribute__((weak));
extern "C" void __asan_unpoison_memory_region(void const volatile *addr, size_t size) __attribute__((weak));
#endif

/* Each emulated thread's stack, with a guard page below it. Instrumented
 * frames (and a sanitizer's report, printed on the faulting stack) need more. */
#ifndef ALLOY_EMU_STACK
#ifdef ALLOY_EMU_ASAN
#define ALLOY_EMU_STACK (256u << 10)
#else
#define ALLOY_EMU_STACK (64u << 10)
#endif
#endif

/* ---- CUDA's declaration keywords ---- */

/* __restrict__ is already a keyword of g++ and clang++. __shared__ is static:
 * blocks run one after another, so a function-static array is the running
 * block's shared memory (uninitialized on a GPU: kernels write it first). */
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static
#define __launch_bounds__(...)

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
};
static constexpr int warpSize = 32;

/* ---- the runtime ---- */

namespace alloy_emu {

enum { lanes = 32, max_threads = 1024 };
enum fiber_state { runnable, at_sync, at_warp, done, stopped };

struct fiber {
    ucontext_t ctx;
    uint3 idx;                 /* threadIdx */
    unsigned id, warp, lane;   /* linear id in the block, its warp and lane */
    unsigned shuffles;         /* shuffles done: the tag of this one's deposits */
    unsigned syncs, wsyncs;    /* __syncthreads reached; warp barriers (__syncwarp, shuffles, mma) reached */
    fiber_state state;
    int line;                  /* source line of the barrier it waits at */
    const char *what;          /* the intrinsic it waits in */
    void *fake_stack;          /* ASan's, while switched out */
};

/* A warp's shuffle slots, double-buffered by the parity of the shuffle: a
 * lane deposits into buffer k & 1 at its k-th shuffle and can only reach
 * shuffle k + 2 after every live lane has passed shuffle k + 1, that is after
 * they all read shuffle k's buffer; so one barrier per shuffle is enough. */
struct warp_state {
    unsigned live, waiting;
    uint32_t wgen; /* the checker's epoch of the warp's last barrier (block or warp) */
    unsigned long long slot[2][lanes];
    unsigned tag[2][lanes]; /* the shuffle (count) each deposit belongs to */
    /* an mma's operand registers, double-buffered and tagged as the shuffles' (one count for both) */
    unsigned mma_a[2][lanes][4], mma_b[2][lanes][2];
    unsigned mma_tag[2][lanes];
    /* an ldmatrix's rows, each lane's 8 b16 elements, double-buffered and tagged the same way */
    unsigned ldm_row[2][lanes][4];
    unsigned ldm_tag[2][lanes];
};

struct launch_state {
    void (*entry)(void **);
    void **params;
    dim3 grid, block;
    uint3 block_idx;
    unsigned nthreads, live, waiting; /* this block's threads, those not done, those in __syncthreads */
    fiber *threads;
    warp_state *warps;
    char *stacks;                     /* nthreads x (guard page, stack) */
    size_t page, stride, map_len;
    ucontext_t scheduler;
    void *scheduler_fake;
    const void *scheduler_bottom;
    size_t scheduler_size;
    bool failed;
    char *err;
    size_t errlen;
    sigjmp_buf overflow;
    struct sigaction old_segv;
    stack_t old_altstack;
    void *altstack;
};

/* The runtime's own mutable state sits in its own section, so that the
 * shared-memory checker (below) can tell it from the kernel's __shared__
 * arrays, which are the rest of the library's writable data. */
#define ALLOY_EMU_RT __attribute__((section("alloy_emu_rt")))
/* Compiled with -fsanitize=thread, the kernel's accesses call the checker's hooks; the runtime's
 * own code that reads the kernel's data is kept out of them. */
#ifdef __SANITIZE_THREAD__
#define ALLOY_EMU_SHADOW 1
#define ALLOY_EMU_UNTRACKED __attribute__((no_sanitize_thread))
#else
#define ALLOY_EMU_UNTRACKED
#endif

/* One launch at a time per kernel library (alloy_emu_launch refuses a second). */
static launch_state launch ALLOY_EMU_RT;
static fiber *self ALLOY_EMU_RT; /* the running thread */
static char no_err[256] ALLOY_EMU_RT;

/* ---- the checkers (ALLOY_EMU_CHECK=0 turns them off) ----
 *
 * Always, unless off: every __syncthreads release finds its threads at the same count of
 * barriers passed, every warp release its lanes at the same count of warp barriers (and a
 * shuffle's or mma's lanes at one call site), and a full-mask shuffle reads only lanes that take
 * part. When the loader compiled the kernel with -fsanitize=thread (checks on; under ASan the
 * kernel is compiled without it), every memory access of the kernel calls the hooks below, and each byte of __shared__ memory has a
 * shadow cell: who wrote it last and who read it last, in which barrier interval. A read or write
 * by another thread in the same interval (the same warp's lanes: no __syncwarp or __syncthreads
 * between; other warps: no __syncthreads between) is a race, and a read of a byte no thread of
 * the block has written is uninitialised shared memory. Epochs only grow (across blocks and
 * launches), so nothing is cleared between blocks. */
struct shadow_cell {
    uint32_t wb, ww, rb, rw;  /* the writer's and the reader's block and warp epochs */
    uint16_t writer, reader;  /* thread id + 1; 0: none */
    uint8_t atomic;           /* the last write was an atomic */
    uint16_t zone;            /* a redzone byte: its array's shared_zone index + 1; 0: none */
};

/* A __shared__ array the loader's rewrite (emu_redzone.c) put between redzones: at base, 64
 * bytes of redzone, the array's size bytes, then redzone up to base + whole. The rewrite puts one
 * per array into the section alloy_emu_rz; any access of the kernel to a redzone byte fails the
 * launch naming the array. */
struct shared_zone {
    const void *base;
    unsigned long size, whole;
    const char *name;
};
static const unsigned zone_lead = 64;

struct check_state {
    bool on;                  /* this launch checks */
    bool active;              /* a block's fibers are running */
    char *lo, *hi;            /* the library's writable data */
    shadow_cell *cells;       /* one per byte of [lo, hi) */
    uint32_t gen;             /* the last epoch handed out */
    uint32_t block_gen, bgen; /* the running block's first epoch; its current barrier interval */
    /* the block's first read of a byte not written yet: reported at the next __syncthreads or the
     * block's end, unless another thread's write in the interval shows it a race first */
    bool unwritten;
    char unwritten_msg[256];
    /* bytes two threads wrote in one interval: a race unless both wrote the same value (the GPU
     * idiom "flag = 1" from many threads), which shows only after the second store, so they are
     * judged at the next barrier release or the block's end */
    struct {
        char *at;
        unsigned char before; /* the first writer's value */
        unsigned first, second;
        char where[200];
    } waw[64];
    int nwaw;
};
static check_state chk ALLOY_EMU_RT;

#ifdef ALLOY_EMU_ASAN
static void switch_start(void **fake, const void *bottom, size_t size) { __sanitizer_start_switch_fiber(fake, bottom, size); }
static void switch_finish(void *fake, const void **bottom, size_t *size) { __sanitizer_finish_switch_fiber(fake, bottom, size); }
#else
static void switch_start(void **, const void *, size_t) {}
static void switch_finish(void *, const void **, size_t *) {}
#endif

/* Records the launch's first error; later ones are consequences. */
__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
    if (launch.failed) return;
    launch.failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(launch.err, launch.errlen, fmt, ap);
    va_end(ap);
}

static char *stack_of(const fiber *f) { return launch.stacks + f->id * launch.stride + launch.page; }

static void resume(fiber *f)
{
    self = f;
    switch_start(&launch.scheduler_fake, stack_of(f), ALLOY_EMU_STACK);
    swapcontext(&launch.scheduler, &f->ctx);
    switch_finish(launch.scheduler_fake, nullptr, nullptr);
}

/* Back to the scheduler until released (never, when exiting or stopped). */
static void suspend(bool exiting)
{
    fiber *f = self;
    switch_start(exiting ? nullptr : &f->fake_stack, launch.scheduler_bottom, launch.scheduler_size);
    swapcontext(&f->ctx, &launch.scheduler);
    switch_finish(f->fake_stack, nullptr, nullptr);
}

/* The running thread stops for good after an error. */
[[noreturn]] static void stop(void)
{
    self->state = stopped;
    suspend(true);
    abort(); /* never resumed */
}

/* "threads 0-31 in __syncthreads (line 12), threads 32-63 in ..." for the threads not done. */
static void describe_waits(char *out, size_t len)
{
    size_t used = 0;
    out[0] = 0;
    for (unsigned i = 0, j; i < launch.nthreads && used < len; i = j) {
        const fiber *f = &launch.threads[i];
        for (j = i + 1; j < launch.nthreads; j++) {
            const fiber *g = &launch.threads[j];
            if (g->state != f->state || g->what != f->what || g->line != f->line) break;
        }
        if (f->state == done) continue;
        char who[32];
        if (j - i > 1)
            snprintf(who, sizeof who, "threads %u-%u", i, j - 1);
        else
            snprintf(who, sizeof who, "thread %u", i);
        used += (size_t)snprintf(out + used, len - used, "%s%s in %s (line %d)", used ? ", " : "", who, f->what, f->line);
    }
}

static void fail_divergent(const char *why)
{
    char waits[320];
    describe_waits(waits, sizeof waits);
    fail("block (%u,%u,%u): %s: %s", launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, why, waits);
}

/* "threads 32-63 after 1, thread 70 after 2" for the threads [from, to) that exited after passing
 * at least one and fewer than count barriers (__syncthreads, or with warp every warp barrier). */
static bool describe_early_exits(char *out, size_t len, unsigned from, unsigned to, unsigned count, bool warp)
{
    size_t used = 0;
    out[0] = 0;
    for (unsigned i = from, j; i < to && used < len; i = j) {
        const fiber *f = &launch.threads[i];
        unsigned n = warp ? f->wsyncs : f->syncs;
        bool early = f->state == done && n > 0 && n < count;
        for (j = i + 1; j < to; j++) {
            const fiber *g = &launch.threads[j];
            unsigned m = warp ? g->wsyncs : g->syncs;
            if ((g->state == done && m > 0 && m < count) != early || (early && m != n)) break;
        }
        if (!early) continue;
        if (j - i > 1)
            used += (size_t)snprintf(out + used, len - used, "%sthreads %u-%u after %u", used ? ", " : "", i, j - 1, n);
        else
            used += (size_t)snprintf(out + used, len - used, "%sthread %u after %u", used ? ", " : "", i, n);
    }
    return used > 0;
}

/* A read of shared memory that no thread of the block wrote before the barrier that ends it;
 * two threads' writes of one byte in an interval that left different values. */
ALLOY_EMU_UNTRACKED static void report_pending(void)
{
    for (int i = 0; i < chk.nwaw; i++)
        if ((unsigned char)*chk.waw[i].at != chk.waw[i].before)
            fail("block (%u,%u,%u): race on shared memory: threads %u and %u write different values to %s in the "
                 "same barrier interval",
                 launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, chk.waw[i].first, chk.waw[i].second,
                 chk.waw[i].where);
    chk.nwaw = 0;
    if (!chk.unwritten) return;
    chk.unwritten = false;
    fail("block (%u,%u,%u): %s, which no thread of this block has written (uninitialised shared memory)",
         launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, chk.unwritten_msg);
}

/* A new barrier interval for the checker: the block's (and so every warp's), or one warp's. */
static void next_epoch(int warp)
{
    uint32_t g = ++chk.gen;
    if (warp >= 0) {
        launch.warps[warp].wgen = g;
        report_pending();
        return;
    }
    chk.bgen = g;
    for (unsigned w = 0; w < (launch.nthreads + lanes - 1) / lanes; w++) launch.warps[w].wgen = g;
    report_pending();
}

/* Every thread not done waits in __syncthreads: all at one call site, or the barrier is divergent.
 * The live threads have all passed the same barriers, so a barrier reached a different number of
 * times per thread shows as threads that exited after some barriers but before this one (checking;
 * exiting before the first barrier, as a bounds check does, is fine). */
static void release_block(void)
{
    int line = -1;
    unsigned count = 0;
    for (unsigned i = 0; i < launch.nthreads; i++) {
        const fiber *f = &launch.threads[i];
        if (f->state != at_sync) continue;
        if (line < 0) line = f->line, count = f->syncs;
        if (f->line != line) return fail_divergent("divergent __syncthreads (threads wait at different barriers)");
    }
    char exits[320];
    if (chk.on && describe_early_exits(exits, sizeof exits, 0, launch.nthreads, count, false))
        return fail("block (%u,%u,%u): __syncthreads reached a different number of times per thread: threads wait at "
                    "their barrier %u (line %d) while some exited after fewer (%s)",
                    launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, count, line, exits);
    for (unsigned i = 0; i < launch.nthreads; i++)
        if (launch.threads[i].state == at_sync) launch.threads[i].state = runnable;
    launch.waiting = 0;
    next_epoch(-1);
}

/* The lanes of warp w not done wait at a warp barrier: (checking) a shuffle's or mma's lanes all
 * at one call site, and no lane exited after fewer warp barriers. */
static void release_warp(unsigned w)
{
    unsigned end = w * lanes + lanes < launch.nthreads ? w * lanes + lanes : launch.nthreads;
    const fiber *first = nullptr;
    if (chk.on) {
        for (unsigned i = w * lanes; i < end; i++) {
            const fiber *f = &launch.threads[i];
            if (f->state != at_warp) continue;
            if (!first) {
                first = f;
                continue;
            }
            bool sync_only = !strcmp(f->what, "__syncwarp") && !strcmp(first->what, "__syncwarp");
            if (!sync_only && (strcmp(f->what, first->what) || f->line != first->line)) {
                char waits[320];
                describe_waits(waits, sizeof waits);
                return fail("block (%u,%u,%u) warp %u: lanes at different warp call sites (lane %u in %s (line %d), "
                            "lane %u in %s (line %d)): %s",
                            launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, w, first->lane, first->what,
                            first->line, f->lane, f->what, f->line, waits);
            }
        }
        char exits[320];
        if (first && describe_early_exits(exits, sizeof exits, w * lanes, end, first->wsyncs, true))
            return fail("block (%u,%u,%u) warp %u: warp barriers reached a different number of times per lane: lanes "
                        "wait at their warp barrier %u (%s, line %d; counting every __syncwarp, shuffle and mma) "
                        "while some exited after fewer (%s)",
                        launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, w, first->wsyncs, first->what,
                        first->line, exits);
    }
    for (unsigned i = w * lanes; i < end; i++)
        if (launch.threads[i].state == at_warp) launch.threads[i].state = runnable;
    launch.warps[w].waiting = 0;
    /* only __syncwarp orders the lanes' memory accesses; a shuffle exchanges registers */
    if (first && !strcmp(first->what, "__syncwarp")) next_epoch((int)w);
}

/* A barrier over the block's threads that have not exited: as on a GPU, a
 * thread that exits releases a barrier that waited only for it. */
static inline void syncthreads(int line)
{
    __asm__ __volatile__("" ::: "memory");
    fiber *f = self;
    f->state = at_sync;
    f->line = line;
    f->what = "__syncthreads";
    f->syncs++;
    if (++launch.waiting == launch.live) release_block();
    if (f->state != runnable) suspend(false); /* after an error, never resumed */
    __asm__ __volatile__("" ::: "memory");
}

/* The same over the lanes of the running thread's warp. */
static inline void warp_barrier(int line, const char *what)
{
    __asm__ __volatile__("" ::: "memory");
    fiber *f = self;
    warp_state *w = &launch.warps[f->warp];
    f->state = at_warp;
    f->line = line;
    f->what = what;
    f->wsyncs++;
    if (++w->waiting == w->live) release_warp(f->warp);
    if (f->state != runnable) suspend(false); /* after an error, never resumed */
    __asm__ __volatile__("" ::: "memory");
}

enum shuffle_kind { shfl_idx, shfl_up, shfl_down, shfl_xor };

/* A shuffle: deposit v, warp barrier, read the source lane's deposit. A source
 * outside the lane's width segment gives v back (CUDA's rule); so does a lane
 * that did not take part (exited, or not launched in a partial warp), which
 * is undefined on a GPU. */
template <class T> static T shuffle(unsigned mask, T v, int arg, int width, int line, shuffle_kind kind, const char *what)
{
    static_assert(sizeof(T) <= sizeof(unsigned long long), "shuffled values are at most 8 bytes");
    fiber *f = self;
    if (mask != 0xffffffffu) {
        fail("block (%u,%u,%u) thread %u: %s (line %d) with mask 0x%x: the emulation takes only the full mask 0xffffffff",
             launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, f->id, what, line, mask);
        stop();
    }
    if (width < 1 || width > lanes || (width & (width - 1))) {
        fail("%s (line %d): width %d is not a power of two in 1..32", what, line, width);
        stop();
    }
    warp_state *w = &launch.warps[f->warp];
    unsigned parity = f->shuffles & 1, tag = ++f->shuffles;
    w->slot[parity][f->lane] = 0;
    memcpy(&w->slot[parity][f->lane], &v, sizeof v);
    w->tag[parity][f->lane] = tag;
    warp_barrier(line, what);

    int lane = (int)f->lane, base = lane & ~(width - 1), src;
    switch (kind) {
    case shfl_idx: src = base + (arg & (width - 1)); break;
    case shfl_up: src = lane - arg < base ? lane : lane - arg; break;
    case shfl_down: src = lane + arg >= base + width ? lane : lane + arg; break;
    default: src = (lane ^ arg) >= base + width ? lane : lane ^ arg; break;
    }
    if (src < 0 || src >= lanes || w->tag[parity][src] != tag) {
        if (chk.on && src >= 0 && src < lanes && src != lane) {
            unsigned id = f->warp * lanes + (unsigned)src;
            fail("block (%u,%u,%u) thread %u: %s (line %d) with the full mask reads lane %d, which %s",
                 launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, f->id, what, line, src,
                 id >= launch.nthreads ? "was not launched (a partial warp)"
                 : launch.threads[id].state == done ? "has exited" : "did not take part in this shuffle");
            stop();
        }
        return v;
    }
    T r;
    memcpy(&r, &w->slot[parity][src], sizeof r);
    return r;
}

/* ---- the shared-memory checker's hooks (kernels compiled with -fsanitize=thread call them) ---- */

#include "emu_shadow.h"

/* Where every thread starts, on its own stack; it never returns. */
static void thread_main(void)
{
    switch_finish(nullptr, &launch.scheduler_bottom, &launch.scheduler_size);
    launch.entry(launch.params);
    fiber *f = self;
    warp_state *w = &launch.warps[f->warp];
    f->state = done;
    f->what = "exit";
    launch.live--;
    w->live--;
    if (launch.live && launch.waiting == launch.live) release_block();
    if (w->live && w->waiting == w->live) release_warp(f->warp);
    suspend(true);
    abort(); /* never resumed */
}

/* Runs launch.block_idx's block: every thread until it exits, round robin,
 * each until it waits at a barrier; false after an error. */
static bool run_block(void)
{
    const dim3 b = launch.block;
    for (unsigned i = 0; i < launch.nthreads; i++) {
        fiber *f = &launch.threads[i];
        f->idx = uint3{i % b.x, i / b.x % b.y, i / (b.x * b.y)};
        f->id = i;
        f->warp = i / lanes;
        f->lane = i % lanes;
        f->shuffles = 0;
        f->syncs = f->wsyncs = 0;
        f->state = runnable;
        f->line = 0;
        f->what = "start";
        f->ctx.uc_stack.ss_sp = stack_of(f);
        f->ctx.uc_stack.ss_size = ALLOY_EMU_STACK;
        f->ctx.uc_link = nullptr;
        makecontext(&f->ctx, thread_main, 0);
    }
    unsigned nwarps = (launch.nthreads + lanes - 1) / lanes;
    memset(launch.warps, 0, nwarps * sizeof *launch.warps);
    for (unsigned w = 0; w < nwarps; w++)
        launch.warps[w].live = w + 1 < nwarps ? (unsigned)lanes : launch.nthreads - w * lanes;
    launch.live = launch.nthreads;
    launch.waiting = 0;
    chk.unwritten = false;
    chk.nwaw = 0;
    next_epoch(-1);
    chk.block_gen = chk.bgen;
    chk.active = chk.on; /* a library compiled checked may be launched with ALLOY_EMU_CHECK=0 */

    while (launch.live && !launch.failed) {
        unsigned ran = 0;
        for (unsigned i = 0; i < launch.nthreads && !launch.failed; i++) {
            if (launch.threads[i].state != runnable) continue;
            resume(&launch.threads[i]);
            ran++;
        }
        if (!ran && !launch.failed) fail_divergent("divergent barrier (no thread can go on)");
    }
    chk.active = false;
    report_pending();
    return !launch.failed;
}

/* Runs every block, or only those ALLOY_EMU_BLOCKS names (emu_blocks.h). */
static void run_grid(void)
{
    const dim3 g = launch.grid;
    uint64_t chosen[EMU_BLOCKS_MAX];
    const uint64_t nblocks = (uint64_t)g.x * g.y * g.z;
    const int n = emu_blocks_pick(getenv("ALLOY_EMU_BLOCKS"), nblocks, chosen);
    if (n == -2) return fail("ALLOY_EMU_BLOCKS=%s: not a list of first, last, block indices and random:N:SEED "
                             "(at most %d blocks)", getenv("ALLOY_EMU_BLOCKS"), (int)EMU_BLOCKS_MAX);
    for (int i = 0; i < n; i++) {
        launch.block_idx = uint3{(unsigned)(chosen[i] % g.x), (unsigned)(chosen[i] / g.x % g.y),
                                 (unsigned)(chosen[i] / g.x / g.y)};
        if (!run_block()) return;
    }
    if (n >= 0) return;
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x++) {
                launch.block_idx = uint3{x, y, z};
                if (!run_block()) return;
            }
}

/* A fault in a guard page is the running thread's stack overflow: the launch
 * fails. Any other fault goes to the handler there was before. */
static void on_segv(int sig, siginfo_t *info, void *uctx)
{
    (void)sig;
    (void)uctx;
    char *at = (char *)info->si_addr;
    if (at >= launch.stacks && at < launch.stacks + launch.map_len &&
        (size_t)(at - launch.stacks) % launch.stride < launch.page) {
        fail("block (%u,%u,%u) thread %u overflowed its %u KiB stack (deep recursion or large local arrays; "
             "-DALLOY_EMU_STACK=bytes sets the size)",
             launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, self->id, (unsigned)(ALLOY_EMU_STACK >> 10));
        switch_start(nullptr, launch.scheduler_bottom, launch.scheduler_size);
        siglongjmp(launch.overflow, 1);
    }
    sigaction(SIGSEGV, &launch.old_segv, nullptr);
}

static bool check_dims(const char *what, const unsigned d[3], const unsigned limit[3])
{
    for (int i = 0; i < 3; i++) {
        if (d[i] == 0)
            fail("%s (%u,%u,%u): dimension %c is 0", what, d[0], d[1], d[2], "xyz"[i]);
        else if (d[i] > limit[i])
            fail("%s (%u,%u,%u): dimension %c is %u, more than %u", what, d[0], d[1], d[2], "xyz"[i], d[i], limit[i]);
    }
    return !launch.failed;
}

/* Maps nthreads stacks, each above a PROT_NONE guard page; false when out of memory. */
static bool map_stacks(void)
{
    launch.page = (size_t)sysconf(_SC_PAGESIZE);
    launch.stride = launch.page + ((ALLOY_EMU_STACK + launch.page - 1) / launch.page) * launch.page;
    launch.map_len = launch.nthreads * launch.stride;
    void *p = mmap(nullptr, launch.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
                   -1, 0);
    if (p == MAP_FAILED) return false;
    launch.stacks = (char *)p;
    for (unsigned i = 0; i < launch.nthreads; i++)
        if (mprotect(launch.stacks + i * launch.stride, launch.page, PROT_NONE) != 0) return false;
    return true;
}

/* getcontext, which makecontext needs first, out of line: it returns twice. */
__attribute__((noinline)) static bool init_context(ucontext_t *ctx) { return getcontext(ctx) == 0; }

static void unmap_stacks(void)
{
    if (!launch.stacks) return;
#ifndef ALLOY_EMU_ASAN
    if (__asan_unpoison_memory_region) /* the process's ASan ran instrumented code on these stacks */
#endif
        __asan_unpoison_memory_region(launch.stacks, launch.map_len);
    munmap(launch.stacks, launch.map_len);
    launch.stacks = nullptr;
}

__attribute__((noinline)) static void run_guarded(void)
{
    size_t alt_size = 64u << 10;
    launch.altstack = malloc(alt_size);
    stack_t alt = {};
    alt.ss_sp = launch.altstack;
    alt.ss_size = alt_size;
    struct sigaction sa = {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (!launch.altstack || sigaltstack(&alt, &launch.old_altstack) != 0) {
        free(launch.altstack);
        return fail("alloy_emu_launch: no signal stack for the stack overflow guard");
    }
    sigaction(SIGSEGV, &sa, &launch.old_segv);
    if (sigsetjmp(launch.overflow, 1) == 0)
        run_grid();
    else
        switch_finish(launch.scheduler_fake, nullptr, nullptr);
    sigaction(SIGSEGV, &launch.old_segv, nullptr);
    sigaltstack(&launch.old_altstack, nullptr);
    free(launch.altstack);
}

} /* namespace alloy_emu */

/* Runs entry (a kernel's NAME__host trampoline) on grid x block threads:
 * blocks one after another, each block's threads as fibers. Returns 0, or -1
 * with a message in err: a zero or too large dimension (block over 1024
 * threads), a divergent barrier, a shuffle mask other than full, a thread's
 * stack overflow, out of memory, or a launch already running in this library.
 * The kernel library's only entry besides the trampolines. */
extern "C" ALLOY_EMU_UNTRACKED __attribute__((visibility("default"))) int alloy_emu_launch(void (*entry)(void **), const unsigned grid[3],
                                                                       const unsigned block[3], void **params, char *err,
                                                                       size_t errlen)
{
    using namespace alloy_emu;
    static const unsigned grid_limit[3] = {0x7fffffffu, 65535, 65535}, block_limit[3] = {1024, 1024, 64};
    static bool busy;
    if (__atomic_exchange_n(&busy, true, __ATOMIC_ACQUIRE)) {
        if (err && errlen) snprintf(err, errlen, "alloy_emu_launch: another launch of this kernel library is running");
        return -1;
    }
    launch = launch_state{};
    launch.err = err && errlen ? err : no_err;
    launch.errlen = err && errlen ? errlen : sizeof no_err;
    launch.err[0] = 0;
    launch.entry = entry;
    launch.params = params;
    const char *check = getenv("ALLOY_EMU_CHECK");
    chk.on = !(check && !strcmp(check, "0"));
    chk.active = false;
    if (chk.on && !shadow_ready()) fail("alloy_emu_launch: out of memory for the shared-memory checker's shadow");
    if (check_dims("grid", grid, grid_limit) && check_dims("block", block, block_limit)) {
        launch.grid = dim3{grid[0], grid[1], grid[2]};
        launch.block = dim3{block[0], block[1], block[2]};
        launch.nthreads = block[0] * block[1] * block[2];
        if (launch.nthreads > max_threads)
            fail("block (%u,%u,%u) has %u threads, more than 1024", block[0], block[1], block[2], launch.nthreads);
    }
    if (!launch.failed) {
        launch.threads = (fiber *)calloc(launch.nthreads, sizeof(fiber));
        launch.warps = (warp_state *)calloc((launch.nthreads + lanes - 1) / lanes, sizeof(warp_state));
        if (!launch.threads || !launch.warps || !map_stacks()) fail("alloy_emu_launch: out of memory");
        for (unsigned i = 0; !launch.failed && i < launch.nthreads; i++)
            if (!init_context(&launch.threads[i].ctx)) fail("alloy_emu_launch: getcontext failed");
    }
    if (!launch.failed) run_guarded();
    unmap_stacks();
    free(launch.threads);
    free(launch.warps);
    bool failed = launch.failed;
    launch = launch_state{};
    __atomic_store_n(&busy, false, __ATOMIC_RELEASE);
    return failed ? -1 : 0;
}

/* ---- intrinsics ---- */

/* Source lines name the barrier in divergence messages. */
#define __syncthreads() ::alloy_emu::syncthreads(__LINE__)
#define __syncwarp(...) ::alloy_emu::warp_barrier(__LINE__, "__syncwarp")
#define __shfl_sync(mask, v, ...) ::alloy_emu::shfl((mask), (v), __LINE__, ::alloy_emu::shfl_idx, "__shfl_sync", __VA_ARGS__)
#define __shfl_up_sync(mask, v, ...) ::alloy_emu::shfl((mask), (v), __LINE__, ::alloy_emu::shfl_up, "__shfl_up_sync", __VA_ARGS__)
#define __shfl_down_sync(mask, v, ...) \
    ::alloy_emu::shfl((mask), (v), __LINE__, ::alloy_emu::shfl_down, "__shfl_down_sync", __VA_ARGS__)
#define __shfl_xor_sync(mask, v, ...) ::alloy_emu::shfl((mask), (v), __LINE__, ::alloy_emu::shfl_xor, "__shfl_xor_sync", __VA_ARGS__)

namespace alloy_emu {
/* One overload per type CUDA shuffles, so that other arguments convert as there. */
#define ALLOY_EMU_SHFL(T)                                                                                            \
    inline T shfl(unsigned mask, T v, int line, shuffle_kind kind, const char *what, int arg, int width = lanes)     \
    {                                                                                                                \
        return shuffle<T>(mask, v, arg, width, line, kind, what);                                                    \
    }
ALLOY_EMU_SHFL(int)
ALLOY_EMU_SHFL(unsigned)
ALLOY_EMU_SHFL(long)
ALLOY_EMU_SHFL(unsigned long)
ALLOY_EMU_SHFL(long long)
ALLOY_EMU_SHFL(unsigned long long)
ALLOY_EMU_SHFL(float)
ALLOY_EMU_SHFL(double)
#undef ALLOY_EMU_SHFL
} /* namespace alloy_emu */

/* ---- tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 ----
 *
 * The generated source calls alloy_mma_m16n8k16_f16(d, a, b) (and _bf16): d[0..3] += A B over
 * the warp, A 16x16 row-major, B 16x8 column-major, each lane holding the fragments the PTX ISA
 * lays out (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", 9.7.14.5.8
 * in recent releases); on a GPU the source defines them as the inline PTX. Here every lane deposits its
 * a[4] and b[2] registers, the warp meets at a barrier, and each lane rebuilds the whole A and B
 * from all 32 lanes' registers with the ISA's formulas, then computes its own four elements of D.
 * So a kernel that puts an element in the wrong register or lane gets a wrong product, as on the
 * hardware. Products are exact (f16 x f16 fits f32); the hardware's f32 accumulation order is
 * unspecified: here the 16 products and c are summed in double and rounded once. Every lane of
 * the warp must take part (.aligned): a lane that exited or does not come is an error. */
namespace alloy_emu {

/* An f16 or bf16 element of a register: the low half holds the lower-indexed element. */
static inline float mma_elem(unsigned reg, int half, bool bf16)
{
    unsigned h = half ? reg >> 16 : reg & 0xffffu;
    if (bf16) {
        unsigned u = h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    unsigned e = (h >> 10) & 31u, m = h & 1023u;
    float mag = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 1024u), (int)e - 25);
    return (h & 0x8000u) ? -mag : mag;
}

static inline void mma_m16n8k16(float *d, const unsigned *a, const unsigned *b, bool bf16, int line, const char *what)
{
    fiber *f = self;
    warp_state *w = &launch.warps[f->warp];
    unsigned parity = f->shuffles & 1, tag = ++f->shuffles;
    memcpy(w->mma_a[parity][f->lane], a, sizeof w->mma_a[parity][f->lane]);
    memcpy(w->mma_b[parity][f->lane], b, sizeof w->mma_b[parity][f->lane]);
    w->mma_tag[parity][f->lane] = tag;
    warp_barrier(line, what);
    for (unsigned l = 0; l < lanes; l++)
        if (w->mma_tag[parity][l] != tag) {
            fail("block (%u,%u,%u) warp %u: %s (line %d) without lane %u: mma.sync.aligned needs all 32 lanes",
                 launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, f->warp, what, line, l);
            stop();
        }
    float A[16][16], B[16][8];
    for (unsigned l = 0; l < lanes; l++) {
        const unsigned groupID = l >> 2, threadID_in_group = l % 4;
        for (unsigned i = 0; i < 8; i++) { /* a0..a7: four .f16x2 registers */
            unsigned row = (i < 2 || (4 <= i && i < 6)) ? groupID : groupID + 8;
            unsigned col = i < 4 ? threadID_in_group * 2 + (i & 1) : threadID_in_group * 2 + (i & 1) + 8;
            A[row][col] = mma_elem(w->mma_a[parity][l][i / 2], (int)(i & 1), bf16);
        }
        for (unsigned i = 0; i < 4; i++) { /* b0..b3: two .f16x2 registers */
            unsigned row = i < 2 ? threadID_in_group * 2 + (i & 1) : threadID_in_group * 2 + (i & 1) + 8;
            B[row][groupID] = mma_elem(w->mma_b[parity][l][i / 2], (int)(i & 1), bf16);
        }
    }
    const unsigned groupID = f->lane >> 2, threadID_in_group = f->lane % 4;
    for (unsigned i = 0; i < 4; i++) { /* c0..c3 / d0..d3 */
        unsigned row = i < 2 ? groupID : groupID + 8, col = threadID_in_group * 2 + (i & 1);
        double acc = d[i];
        for (unsigned k = 0; k < 16; k++) acc += (double)A[row][k] * (double)B[k][col];
        d[i] = (float)acc;
    }
}

} /* namespace alloy_emu */

/* (-DALLOY_EMU_MMA_SHUFFLES: the source's own pre-sm_80 form, warp shuffles, runs instead) */
#ifndef ALLOY_EMU_MMA_SHUFFLES
#define alloy_mma_m16n8k16_f16(d, a, b) \
    ::alloy_emu::mma_m16n8k16((d), (a), (b), false, __LINE__, "mma.sync.m16n8k16.f16")
#define alloy_mma_m16n8k16_bf16(d, a, b) \
    ::alloy_emu::mma_m16n8k16((d), (a), (b), true, __LINE__, "mma.sync.m16n8k16.bf16")
#endif

/* ---- ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 ----
 *
 * The generated source calls alloy_ldmatrix_x4(r, row) and alloy_ldmatrix_x4_trans(r, row): four
 * 8x8 matrices of 16-bit elements from shared memory, lanes 8i..8i+7 giving the addresses of matrix
 * i's rows 0..7 (16 bytes each, 16-byte aligned); on a GPU the inline PTX. As the PTX ISA lays out
 * the result ("Warp-level matrix load instruction: ldmatrix"), lane l's register r[i] holds row
 * l / 4 of matrix i, columns 2 (l % 4) and 2 (l % 4) + 1 (the lower column in the low half); with
 * .trans, the matrix is transposed on the way: rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4.
 * Here every lane reads its own row (tracked by the shared-memory checker as that lane's reads),
 * deposits it, the warp meets at a barrier, and each lane assembles its registers from the 32 rows.
 * Every lane must take part (.aligned). */
namespace alloy_emu {

static inline void ldmatrix_x4(unsigned *r, const void *row, bool trans, int line, const char *what)
{
    fiber *f = self;
    warp_state *w = &launch.warps[f->warp];
    if (((uintptr_t)row & 15u) != 0) {
        fail("block (%u,%u,%u) thread %u: %s (line %d): row address %p is not 16-byte aligned", launch.block_idx.x,
             launch.block_idx.y, launch.block_idx.z, f->id, what, line, row);
        stop();
    }
    unsigned parity = f->shuffles & 1, tag = ++f->shuffles;
    const unsigned *src = (const unsigned *)row;
    for (int i = 0; i < 4; i++) w->ldm_row[parity][f->lane][i] = src[i];
    w->ldm_tag[parity][f->lane] = tag;
    warp_barrier(line, what);
    for (unsigned l = 0; l < lanes; l++)
        if (w->ldm_tag[parity][l] != tag) {
            fail("block (%u,%u,%u) warp %u: %s (line %d) without lane %u: ldmatrix.sync.aligned needs all 32 lanes",
                 launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, f->warp, what, line, l);
            stop();
        }
    const unsigned l = f->lane;
    for (unsigned m = 0; m < 4; m++) {
        unsigned lo, hi;
        if (!trans) { /* row l / 4, columns 2 (l % 4) + {0, 1}: one 32-bit word of that row */
            unsigned word = w->ldm_row[parity][8 * m + l / 4][l % 4];
            lo = word & 0xffffu, hi = word >> 16;
        } else { /* column l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1 */
            const unsigned *r0 = w->ldm_row[parity][8 * m + 2 * (l % 4)], *r1 = w->ldm_row[parity][8 * m + 2 * (l % 4) + 1];
            unsigned c = l / 4;
            lo = (r0[c / 2] >> (16 * (c % 2))) & 0xffffu;
            hi = (r1[c / 2] >> (16 * (c % 2))) & 0xffffu;
        }
        r[m] = lo | hi << 16;
    }
}

} /* namespace alloy_emu */

#define alloy_ldmatrix_x4(r, row) ::alloy_emu::ldmatrix_x4((r), (row), false, __LINE__, "ldmatrix.x4")
#define alloy_ldmatrix_x4_trans(r, row) ::alloy_emu::ldmatrix_x4((r), (row), true, __LINE__, "ldmatrix.x4.trans")

/* ---- cp.async.cg.shared.global (16 bytes), cp.async.commit_group, cp.async.wait_group ----
 *
 * On a GPU the copy lands in shared memory some time before the issuing thread's
 * cp.async.wait_group lets fewer groups than N stay pending, and the other threads see it after
 * the barrier that follows. Here the copy is done at once by the issuing thread (a plain 16-byte
 * load and store, seen by the shared-memory checker as that thread's write): a kernel that reads
 * a tile before its barrier still races with the copy in the checker's eyes. Commit and wait
 * have nothing left to do. */
#define alloy_cp_async_16(dst, src) alloy_vcopy<16>((dst), (src))
#define alloy_cp_async_commit() ((void)0)
#define alloy_cp_async_wait_all() ((void)0)
#define alloy_cp_async_wait_1() ((void)0)

/* Fibers switch only at barriers, so a plain read-modify-write is atomic. */
#define ALLOY_EMU_ATOMIC(name, T, expr)                                                                              \
    ALLOY_EMU_UNTRACKED inline T name(T *a, T v)                                                                     \
    {                                                                                                                \
        ALLOY_EMU_NOTE_ATOMIC(a);                                                                                    \
        T old = *a;                                                                                                  \
        *a = (expr);                                                                                                 \
        return old;                                                                                                  \
    }
ALLOY_EMU_ATOMIC(atomicAdd, float, old + v)
ALLOY_EMU_ATOMIC(atomicAdd, double, old + v)
ALLOY_EMU_ATOMIC(atomicAdd, int, old + v)
ALLOY_EMU_ATOMIC(atomicAdd, unsigned, old + v)
ALLOY_EMU_ATOMIC(atomicAdd, unsigned long long, old + v)
ALLOY_EMU_ATOMIC(atomicSub, int, old - v)
ALLOY_EMU_ATOMIC(atomicSub, unsigned, old - v)
ALLOY_EMU_ATOMIC(atomicMax, int, old > v ? old : v)
ALLOY_EMU_ATOMIC(atomicMax, unsigned, old > v ? old : v)
ALLOY_EMU_ATOMIC(atomicMax, unsigned long long, old > v ? old : v)
ALLOY_EMU_ATOMIC(atomicMin, int, old < v ? old : v)
ALLOY_EMU_ATOMIC(atomicMin, unsigned, old < v ? old : v)
ALLOY_EMU_ATOMIC(atomicMin, unsigned long long, old < v ? old : v)
ALLOY_EMU_ATOMIC(atomicOr, int, old | v)
ALLOY_EMU_ATOMIC(atomicOr, unsigned, old | v)
ALLOY_EMU_ATOMIC(atomicOr, unsigned long long, old | v)
ALLOY_EMU_ATOMIC(atomicAnd, int, old & v)
ALLOY_EMU_ATOMIC(atomicAnd, unsigned, old & v)
ALLOY_EMU_ATOMIC(atomicExch, int, v)
ALLOY_EMU_ATOMIC(atomicExch, unsigned, v)
ALLOY_EMU_ATOMIC(atomicExch, unsigned long long, v)
ALLOY_EMU_ATOMIC(atomicExch, float, v)
#undef ALLOY_EMU_ATOMIC
#define ALLOY_EMU_CAS(T)                                                                                             \
    ALLOY_EMU_UNTRACKED inline T atomicCAS(T *a, T compare, T v)                                                     \
    {                                                                                                                \
        ALLOY_EMU_NOTE_ATOMIC(a);                                                                                    \
        T old = *a;                                                                                                  \
        if (old == compare) *a = v;                                                                                  \
        return old;                                                                                                  \
    }
ALLOY_EMU_CAS(int)
ALLOY_EMU_CAS(unsigned)
ALLOY_EMU_CAS(unsigned long long)
#undef ALLOY_EMU_CAS

/* Read-only cached loads are plain loads. */
template <class T> inline T __ldg(const T *p) { return *p; }

/* One OS thread: fences only keep the compiler from moving memory accesses; __threadfence is told
 * to the device's checker, which orders blocks by it and the atomics (emu_slots.c). */
inline void __threadfence(void)
{
    ALLOY_EMU_NOTE_FENCE();
    __asm__ __volatile__("" ::: "memory");
}
inline void __threadfence_block(void) { __asm__ __volatile__("" ::: "memory"); }

/* ---- math: the C names for float (expf), and the C++ overloads (exp(float) is float) ---- */

using std::copysign;
using std::cos;
using std::erf;
using std::exp;
using std::exp2;
using std::expm1;
using std::fabs;
using std::floor;
using std::ceil;
using std::fma;
using std::fmax;
using std::fmin;
using std::isfinite;
using std::isinf;
using std::isnan;
using std::log;
using std::log1p;
using std::log2;
using std::pow;
using std::sin;
using std::sqrt;
using std::tanh;

/* float exp, erf and tanh as the CPU backend computes them (src/base/vmath.h), so an emulated
 * kernel matches the CPU bit for bit; a GPU's own expf/erff/tanhf differ by up to 2 ulp. */
#include "../../src/base/vmath.h"
inline float alloy_emu_exp(float x) { return al_vexpf(x); }
inline double alloy_emu_exp(double x) { return std::exp(x); }
inline float alloy_emu_erf(float x) { return al_verff(x); }
inline double alloy_emu_erf(double x) { return std::erf(x); }
inline float alloy_emu_tanh(float x) { return al_vtanhf(x); }
inline double alloy_emu_tanh(double x) { return std::tanh(x); }

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float rsqrt(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
/* CUDA's fast intrinsics, here exact. */
inline float __expf(float x) { return al_vexpf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float x, float y) { return x / y; }

#define ALLOY_EMU_MINMAX(T)                                                                                          \
    inline T min(T a, T b) { return b < a ? b : a; }                                                                 \
    inline T max(T a, T b) { return a < b ? b : a; }
ALLOY_EMU_MINMAX(int)
ALLOY_EMU_MINMAX(unsigned)
ALLOY_EMU_MINMAX(long long)
ALLOY_EMU_MINMAX(unsigned long long)
#undef ALLOY_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

/* Bit casts. */
inline int __float_as_int(float x) { int r; memcpy(&r, &x, 4); return r; }
inline unsigned __float_as_uint(float x) { unsigned r; memcpy(&r, &x, 4); return r; }
inline float __int_as_float(int x) { float r; memcpy(&r, &x, 4); return r; }
inline float __uint_as_float(unsigned x) { float r; memcpy(&r, &x, 4); return r; }
inline long long __double_as_longlong(double x) { long long r; memcpy(&r, &x, 8); return r; }
inline double __longlong_as_double(long long x) { double r; memcpy(&r, &x, 8); return r; }

/* ---- the built-in variables (read-only, as on a GPU) ---- */

#define threadIdx (static_cast<const uint3 &>(::alloy_emu::self->idx))
#define blockIdx (static_cast<const uint3 &>(::alloy_emu::launch.block_idx))
#define blockDim (static_cast<const dim3 &>(::alloy_emu::launch.block))
#define gridDim (static_cast<const dim3 &>(::alloy_emu::launch.grid))

/* Last, so that nothing above is rewritten: the kernel's float exp/erf/tanh are vmath.h's, or
 * in the GPU-numerics mode (ALLOY_EMU_NUMERICS=gpu) every math function at CUDA's worst legal ulp. */
#ifdef ALLOY_EMU_GPU_NUMERICS
#include "emu_gpumath.h"
#else
#define exp(x) alloy_emu_exp(x)
#define erf(x) alloy_emu_erf(x)
#define tanh(x) alloy_emu_tanh(x)
#define expf(x) al_vexpf(x)
#define erff(x) al_verff(x)
#define tanhf(x) al_vtanhf(x)
#endif

#endif
