/* emu_shadow.h - the emulation's shared-memory checker: the hooks a kernel compiled with -fsanitize=thread calls on every memory access, and the shadow cells of its __shared__ bytes (included by emu.h inside namespace alloy_emu, after the scheduler). */
#ifndef ALLOY_EMU_SHADOW_H
#define ALLOY_EMU_SHADOW_H


enum access_kind { acc_read, acc_write, acc_atomic, acc_fence }; /* acc_fence: a __threadfence, no bytes */

/* The device's checker of global memory (the tests' emu_slots.h), given for a launch: the access
 * of n bytes at p of kind by a thread of block (linear in the grid); nonzero with its finding in msg. */
typedef int (*global_check_fn)(void *ctx, const void *p, unsigned n, int kind, unsigned block, char *msg, size_t len);

#ifdef ALLOY_EMU_SHADOW
extern "C" char __start_alloy_emu_rt[], __stop_alloy_emu_rt[];
/* the redzoned __shared__ arrays (none when the kernel has no __shared__ array) */
extern "C" __attribute__((weak, visibility("hidden"))) shared_zone __start_alloy_emu_rz[], __stop_alloy_emu_rz[];

/* Whether thread other's access, made at block epoch b and warp epoch w, falls in the running
 * thread's current barrier interval. */
ALLOY_EMU_UNTRACKED static inline bool same_interval(unsigned other, uint32_t b, uint32_t w)
{
    return other / lanes == self->warp ? w == launch.warps[self->warp].wgen : b == chk.bgen;
}

/* Where the kernel's code made the access: an offset in its library, for addr2line. */
ALLOY_EMU_UNTRACKED static void describe_access(char *out, size_t len, const char *at, const void *pc)
{
    Dl_info info;
    size_t code = dladdr(pc, &info) && info.dli_fbase ? (size_t)((const char *)pc - (const char *)info.dli_fbase) : 0;
    snprintf(out, len, "__shared__ byte %p (offset %zu in the library's data; code at kernel.so+0x%zx)", (const void *)at,
             (size_t)(at - chk.lo), code);
}

/* An access of n bytes at at of kind, whose byte bad is in the redzone of array z: fails the launch. */
ALLOY_EMU_UNTRACKED __attribute__((noinline)) static void zone_access(const char *at, unsigned n, const char *bad,
                                                                     const shared_zone *z, access_kind kind, const void *pc)
{
    Dl_info info;
    size_t code = dladdr(pc, &info) && info.dli_fbase ? (size_t)((const char *)pc - (const char *)info.dli_fbase) : 0;
    const char *begin = (const char *)z->base + zone_lead, *end = begin + z->size;
    char where[120];
    if (bad >= end)
        snprintf(where, sizeof where, "byte %zu past the end", (size_t)(bad - end));
    else
        snprintf(where, sizeof where, "%zu bytes before the start", (size_t)(begin - bad));
    fail("block (%u,%u,%u) thread %u: __shared__ overrun: %s %u bytes at %p, %s of __shared__ %s (%lu bytes) "
         "(code at kernel.so+0x%zx)",
         launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, self->id,
         kind == acc_read ? "reads" : kind == acc_write ? "writes" : "atomically updates", n, (const void *)at, where,
         z->name, z->size, code);
}

ALLOY_EMU_UNTRACKED __attribute__((noinline)) static void shadow_access(char *at, unsigned n, access_kind kind,
                                                                       const void *pc)
{
    fiber *f = self;
    const uint16_t me = (uint16_t)(f->id + 1);
    const uint32_t b = chk.bgen, w = launch.warps[f->warp].wgen;
    for (unsigned i = 0; i < n && at + i < chk.hi; i++) {
        shadow_cell *c = &chk.cells[at + i - chk.lo];
        if (c->zone) {
            zone_access(at, n, at + i, &__start_alloy_emu_rz[c->zone - 1], kind, pc);
            stop();
        }
        bool written = c->writer && c->wb >= chk.block_gen;
        const char *problem = nullptr;
        unsigned other = 0;
        if (kind == acc_read && !written) {
            if (!chk.unwritten) {
                char where[200];
                describe_access(where, sizeof where, at + i, pc);
                chk.unwritten = true;
                snprintf(chk.unwritten_msg, sizeof chk.unwritten_msg, "thread %u reads %s", f->id, where);
            }
        } else if (written && c->writer != me && same_interval(c->writer - 1u, c->wb, c->ww) &&
                   !(kind == acc_atomic && c->atomic)) {
            problem = "wrote";
            other = c->writer - 1u;
            if (kind == acc_write && !c->atomic) { /* judged by the values, later; unless too many */
                int k = 0;
                while (k < chk.nwaw && chk.waw[k].at != at + i) k++;
                if (k < chk.nwaw) {
                    problem = nullptr;
                } else if (chk.nwaw < (int)(sizeof chk.waw / sizeof chk.waw[0])) {
                    chk.waw[k].at = at + i;
                    chk.waw[k].before = (unsigned char)at[i];
                    chk.waw[k].first = other, chk.waw[k].second = f->id;
                    describe_access(chk.waw[k].where, sizeof chk.waw[k].where, at + i, pc);
                    chk.nwaw++;
                    problem = nullptr;
                }
            }
        } else if (kind != acc_read && c->reader && c->reader != me && c->rb >= chk.block_gen &&
                   same_interval(c->reader - 1u, c->rb, c->rw)) {
            problem = "read";
            other = c->reader - 1u;
        }
        if (problem) {
            char where[200];
            describe_access(where, sizeof where, at + i, pc);
            const char *verb = kind == acc_read ? "reads" : kind == acc_write ? "writes" : "atomically updates";
            fail("block (%u,%u,%u): race on shared memory: thread %u %s %s, which thread %u %s in the same barrier "
                     "interval (%s)",
                     launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, f->id, verb, where, other, problem,
                     other / lanes == f->warp ? "the same warp, and no __syncwarp or __syncthreads between them"
                                              : "no __syncthreads between them");
            stop();
        }
        if (kind == acc_read) {
            c->reader = me, c->rb = b, c->rw = w;
        } else {
            c->writer = me, c->wb = b, c->ww = w;
            c->atomic = kind == acc_atomic;
        }
    }
}

static global_check_fn global_check ALLOY_EMU_RT;
static void *global_ctx ALLOY_EMU_RT;

/* An access outside the library's data, to the device checker: a finding fails the launch. */
ALLOY_EMU_UNTRACKED __attribute__((noinline)) static void global_access(char *at, unsigned n, access_kind kind,
                                                                        const void *pc)
{
    char msg[700];
    const uint3 b = launch.block_idx;
    if (!global_check(global_ctx, at, n, (int)kind, b.x + launch.grid.x * (b.y + launch.grid.y * b.z), msg, sizeof msg))
        return;
    Dl_info info;
    size_t code = dladdr(pc, &info) && info.dli_fbase ? (size_t)((const char *)pc - (const char *)info.dli_fbase) : 0;
    fail("block (%u,%u,%u) thread %u %s (code at kernel.so+0x%zx)", launch.block_idx.x, launch.block_idx.y,
         launch.block_idx.z, self->id, msg, code);
    stop();
}

/* In a process with AddressSanitizer (the kernel itself is compiled without it, for these hooks):
 * an access to bytes ASan marks unaddressable, a heap overrun or freed memory, fails the launch as
 * ASan would have stopped the process. */
ALLOY_EMU_UNTRACKED __attribute__((noinline)) static void asan_access(char *at, unsigned n, access_kind kind,
                                                                      const void *pc)
{
    const char *bad = (const char *)__asan_region_is_poisoned(at, n);
    if (!bad) return;
    Dl_info info;
    size_t code = dladdr(pc, &info) && info.dli_fbase ? (size_t)((const char *)pc - (const char *)info.dli_fbase) : 0;
    fail("block (%u,%u,%u) thread %u %s %u bytes at %p: AddressSanitizer marks byte %p unaddressable (past the end "
         "of a heap buffer, or freed) (code at kernel.so+0x%zx)",
         launch.block_idx.x, launch.block_idx.y, launch.block_idx.z, self->id,
         kind == acc_read ? "reads" : kind == acc_write ? "writes" : "atomically updates", n, (void *)at,
         (const void *)bad, code);
    stop();
}

/* An access of n bytes at p: only the library's own writable data (the __shared__ arrays, not
 * the runtime's section) is shadowed, and only while a block runs; the rest goes to the process's
 * AddressSanitizer and the device's checker of global memory where there are. */
ALLOY_EMU_UNTRACKED static inline void note(void *p, unsigned n, access_kind kind, const void *pc)
{
    char *at = (char *)p;
    if (at + n <= chk.lo || at >= chk.hi) {
        /* the threads' stacks, and the runtime's fibers and warps (threadIdx, the shuffles and
         * barriers inlined into the kernel), are not the kernel's memory */
        if (!chk.active || (at >= launch.stacks && at < launch.stacks + launch.map_len) ||
            (at >= (char *)launch.threads && at < (char *)(launch.threads + launch.nthreads)) ||
            (at >= (char *)launch.warps && at < (char *)(launch.warps + (launch.nthreads + lanes - 1) / lanes)))
            return;
        if (__asan_region_is_poisoned) asan_access(at, n, kind, pc);
        if (global_check) global_access(at, n, kind, pc);
        return;
    }
    if (!chk.active) return;
    if (at >= __start_alloy_emu_rt && at < __stop_alloy_emu_rt) return;
    shadow_access(at < chk.lo ? chk.lo : at, n, kind, pc);
}

/* The library's writable PT_LOAD segment: the one holding chk itself. */
ALLOY_EMU_UNTRACKED static int find_data(struct dl_phdr_info *info, size_t, void *)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        char *lo = (char *)(info->dlpi_addr + ph->p_vaddr);
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_W)) continue;
        if ((char *)&chk < lo || (char *)&chk >= lo + ph->p_memsz) continue;
        chk.lo = lo;
        chk.hi = lo + ph->p_memsz;
        return 1;
    }
    return 0;
}

/* The shadow, made at the library's first checked launch; false when out of memory. */
ALLOY_EMU_UNTRACKED static bool shadow_ready(void)
{
    if (chk.cells) return true;
    if (!dl_iterate_phdr(find_data, nullptr)) return false;
    chk.cells = (shadow_cell *)calloc((size_t)(chk.hi - chk.lo), sizeof(shadow_cell));
    if (!chk.cells) return false;
    /* the redzones before and after each rewritten __shared__ array */
    for (shared_zone *z = __start_alloy_emu_rz; z && z < __stop_alloy_emu_rz; z++) {
        char *b = (char *)z->base;
        for (unsigned long i = 0; i < z->whole; i++)
            if ((i < zone_lead || i >= zone_lead + z->size) && b + i >= chk.lo && b + i < chk.hi)
                chk.cells[b + i - chk.lo].zone = (uint16_t)(z - __start_alloy_emu_rz + 1);
    }
    return true;
}

/* The shadow goes with the library (dlclose). */
ALLOY_EMU_UNTRACKED __attribute__((destructor)) static void shadow_free(void)
{
    free(chk.cells);
    chk.cells = nullptr;
}

#define ALLOY_EMU_HOOKS(n)                                                                                           \
    extern "C" ALLOY_EMU_UNTRACKED void __tsan_read##n(void *p) { note(p, n, acc_read, __builtin_return_address(0)); } \
    extern "C" ALLOY_EMU_UNTRACKED void __tsan_write##n(void *p) { note(p, n, acc_write, __builtin_return_address(0)); } \
    extern "C" ALLOY_EMU_UNTRACKED void __tsan_unaligned_read##n(void *p)                                            \
    {                                                                                                                \
        note(p, n, acc_read, __builtin_return_address(0));                                                           \
    }                                                                                                                \
    extern "C" ALLOY_EMU_UNTRACKED void __tsan_unaligned_write##n(void *p)                                           \
    {                                                                                                                \
        note(p, n, acc_write, __builtin_return_address(0));                                                          \
    }                                                                                                                \
    extern "C" ALLOY_EMU_UNTRACKED void __tsan_volatile_read##n(void *p)                                             \
    {                                                                                                                \
        note(p, n, acc_read, __builtin_return_address(0));                                                           \
    }                                                                                                                \
    extern "C" ALLOY_EMU_UNTRACKED void __tsan_volatile_write##n(void *p)                                            \
    {                                                                                                                \
        note(p, n, acc_write, __builtin_return_address(0));                                                          \
    }
ALLOY_EMU_HOOKS(1)
ALLOY_EMU_HOOKS(2)
ALLOY_EMU_HOOKS(4)
ALLOY_EMU_HOOKS(8)
ALLOY_EMU_HOOKS(16)
#undef ALLOY_EMU_HOOKS
extern "C" ALLOY_EMU_UNTRACKED void __tsan_read_range(void *p, unsigned long n)
{
    note(p, (unsigned)n, acc_read, __builtin_return_address(0));
}
extern "C" ALLOY_EMU_UNTRACKED void __tsan_write_range(void *p, unsigned long n)
{
    note(p, (unsigned)n, acc_write, __builtin_return_address(0));
}
extern "C" ALLOY_EMU_UNTRACKED void __tsan_init(void) {}
extern "C" ALLOY_EMU_UNTRACKED void __tsan_func_entry(void *) {}
extern "C" ALLOY_EMU_UNTRACKED void __tsan_func_exit(void) {}
extern "C" ALLOY_EMU_UNTRACKED void __tsan_vptr_update(void **, void *) {}
extern "C" ALLOY_EMU_UNTRACKED void __tsan_vptr_read(void **) {}
/* Sets the checker of global memory for the launches from now (NULL: none); 1, checked. */
extern "C" ALLOY_EMU_UNTRACKED __attribute__((visibility("default"))) int alloy_emu_check_global(global_check_fn fn, void *ctx)
{
    global_check = fn;
    global_ctx = ctx;
    return 1;
}
/* An atomic's access: atomics of other threads in one interval do not race with each other. */
#define ALLOY_EMU_NOTE_ATOMIC(p) ::alloy_emu::note((p), sizeof *(p), ::alloy_emu::acc_atomic, __builtin_return_address(0))
/* A __threadfence, to the device's checker: with atomics it orders one block's global writes before
 * another block's reads (emu_slots.c). */
ALLOY_EMU_UNTRACKED static inline void note_fence(void)
{
    if (chk.active && global_check) global_access(NULL, 0, acc_fence, __builtin_return_address(0));
}
#define ALLOY_EMU_NOTE_FENCE() ::alloy_emu::note_fence()
#else
#define ALLOY_EMU_NOTE_ATOMIC(p) ((void)0)
#define ALLOY_EMU_NOTE_FENCE() ((void)0)
static bool shadow_ready(void) { return true; }
/* Without the hooks nothing is checked: 0. */
extern "C" __attribute__((visibility("default"))) int alloy_emu_check_global(global_check_fn, void *) { return 0; }
#endif

#endif
