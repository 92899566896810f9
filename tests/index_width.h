/* index_width.h - a static check of generated CUDA sources for index arithmetic narrowed to 32 bits: the emitters' convention is that flat element indexes, row indexes and offsets are `long long` from the first use of blockIdx on, and `int` holds only what stays inside a row or a block. */
#ifndef ALLOY_TEST_INDEX_WIDTH_H
#define ALLOY_TEST_INDEX_WIDTH_H

#include <stddef.h>

/* Scans the kernel text source[body..] of kernel `name` (line numbers
 * count from the start of source, as NVRTC reports them) and appends one
 * line per finding to report (NUL-terminated, truncated at len):
 * "kernel NAME line L: `EXPR`: WHY". Findings:
 *  - a product of blockIdx / gridDim (or blockDim times either) whose first
 *    factor has no 64-bit cast: the grid index computed in 32 bits;
 *  - an int / unsigned variable or cast initialised from, or later
 *    assigned (=, +=, -=, *=), a 64-bit variable, blockIdx or gridDim
 *    (subscripts aside; `x % K` with a literal K below 2^31 and comparisons
 *    are fine); a name declared both ways in one kernel counts as 32-bit;
 *  - a 32-bit loop variable bounded by a 64-bit variable or a literal of
 *    2^31 or more;
 *  - a subscript of a kernel parameter (pN[...]), or an offset added to one
 *    (pN + ...), with a product and no 64-bit operand (no 64-bit variable,
 *    `ll` literal or cast).
 * A line holding a comment `/ * int: WHY * /` (no spaces in the markers) is a narrowing the
 * emitter has bounded where it emits it (WHY says how) and is not reported.
 * Returns how many it found. */
int iw_scan(const char *name, const char *source, size_t body, char *report, size_t len);

#endif
