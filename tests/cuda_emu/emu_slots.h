/* emu_slots.h - the emulated device's global-memory checker: every access a launch (or a GEMM, memset, copy) makes checked against the plan slots its arguments point into, and against what the step has written so far. */
#ifndef ALLOY_EMU_SLOTS_H
#define ALLOY_EMU_SLOTS_H

#include "emu_loader.h"
#include "runtime/cuda/device.h"

/* The extents one action touches (the backend's describe), owned; n 0: the action is not checked. */
typedef struct emu_action {
    cdev_extent *ext;
    int n;
} emu_action;

/* A copy of the n extents at ext; the empty action when out of memory (unchecked). */
emu_action emu_action_copy(const cdev_extent *ext, int n);
void emu_action_free(emu_action *a);

/* The device allocations, each with a 256-byte zone after its bytes where an access is an overrun:
 * an access outside them (a thread's stack, the kernel library's data) is none of the checker's. */
void emu_slots_alloc(const void *base, size_t bytes);
void emu_slots_release(const void *base);

/* A step begins: every byte of the allocations at fresh[0..n) (the arena, the aux block) counts as
 * not written until an action of this step writes it (shadow made at the first call). */
void emu_slots_step_begin(const cdev_ptr *fresh, int n);

/* emu_launch of kernel name with each global access checked against a's extents: it must fall in
 * one (a write in one the launch writes); a read of a step's fresh bytes must find them written
 * this step by the value the extent holds; and in fresh bytes, no block may read what another
 * block of the launch wrote, or write what another read, or leave a value other than another
 * block's write of the same byte (atomics excepted). A finding fails the launch with err naming the
 * block, thread, address, slot (offset, size) and the value read. Unchecked when a is empty,
 * checking is off (emu_checking) or the kernel was compiled without the hooks. */
int emu_slots_launch(const emu_kernel *k, const char *name, const emu_action *a, const unsigned grid[3],
                     const unsigned block[3], void **params, char *err, size_t errlen);

/* A host-side read of bytes at p by a GEMM, memset or copy (what names it): as a kernel's read.
 * 0, or -1 with the finding in err. */
int emu_slots_read(const emu_action *a, const void *p, size_t bytes, const char *what, char *err, size_t errlen);
/* A host-side write of bytes at p: marks them written this step by the value of the extent of a
 * that holds them (any value when none does). */
void emu_slots_write(const emu_action *a, const void *p, size_t bytes);

#endif
