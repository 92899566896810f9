/* bundle_read.h - what the bundle reader's files share: the cursor over one section and the readers of the schedule, plan and CUDA sections. */
#ifndef ALLOY_BUNDLE_READ_H
#define ALLOY_BUNDLE_READ_H

#include "runtime/bundle/bundle.h"

/* A cursor over one section; the first failure is recorded and sticks. */
typedef struct bundle_rd {
    const uint8_t *p;
    size_t len, pos;
    size_t base; /* the section's offset in the file, for messages */
    const char *where, *section;
    char *err;
    size_t errlen;
    bool bad, oom; /* oom: the failure was an allocation */
} bundle_rd;

/* bundle_read_cursor.c: each reads at r's position and moves past what it
 * read; on a failure (or after one) it returns false, 0 or the range's low
 * end and keeps the first message, "WHERE: section S at byte N: ...". */
/* Records a failure: fmt takes what (%s) and v (an int64_t), once. Returns false. */
AL_HIDDEN bool bundle_rd_fail(bundle_rd *r, const char *fmt, const char *what, int64_t v);
/* An allocation failed while reading what (n items). Returns false. */
AL_HIDDEN bool bundle_rd_oom(bundle_rd *r, const char *what, int64_t n);
/* Whether n more bytes are left in the section. */
AL_HIDDEN bool bundle_rd_need(bundle_rd *r, size_t n, const char *what);
/* A little-endian u64 / u32. */
AL_HIDDEN uint64_t bundle_rd_u64(bundle_rd *r, const char *what);
AL_HIDDEN uint32_t bundle_rd_u32(bundle_rd *r, const char *what);
/* An int32 in [lo, hi]; out of range records an error naming what. */
AL_HIDDEN int bundle_rd_int(bundle_rd *r, const char *what, int64_t lo, int64_t hi);
/* A count of items of at least `each` bytes that must fit in what is left. */
AL_HIDDEN int bundle_rd_count(bundle_rd *r, const char *what, size_t each);
/* A type: dtype, rank (i32s), then each dimension (i64, >= 0). */
AL_HIDDEN ir_type bundle_rd_type(bundle_rd *r, const char *what);
/* Whether the section was read whole with no failure. */
AL_HIDDEN bool bundle_rd_done(bundle_rd *r);

/* bundle_read_schedule.c: the SCHEDULE section into s, every index and
 * flag checked against g (sched_free frees it). */
AL_HIDDEN bool bundle_read_schedule(bundle_rd *r, const ir_graph *g, schedule *s);
/* The PLAN section into p: each stored value's offset within the arena,
 * views and in-place updates placed where the schedule allows (plan_free
 * frees it). */
AL_HIDDEN bool bundle_read_plan(bundle_rd *r, const ir_graph *g, const schedule *s, mem_plan *p);

/* bundle_read_cuda.c: the CUDA_EXEC section (the executable's images) into x. */
AL_HIDDEN bool bundle_read_cuda(bundle_rd *r, bundle_cuda *x);
/* The CUDA_KERNELS section (the kernel table) into x, each kernel's step
 * and module checked against s and x. */
AL_HIDDEN bool bundle_read_kernels(bundle_rd *r, const ir_graph *g, const schedule *s, bundle_cuda *x);

#endif
