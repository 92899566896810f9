/* cpu_shared.c - what the CPU kernels share: failing with the node's name, values in the compute type, index range checks, which values amp_check looks at. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "base/convert.h"
#include "ir/groups.h"
#include "runtime/cpu/cpu.h"

alloy_status cpu_fail(cpu_exec *x, alloy_status status, const char *fmt, ...)
{
    if (x->status) return x->status;
    x->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->error, sizeof x->error, fmt, ap);
    va_end(ap);
    return status;
}

void cpu_load_compute(bool wide, alloy_dtype dt, const void *src, void *dst, int64_t n)
{
    if (wide) cvt_load_f64(dt, src, dst, (size_t)n);
    else cvt_load_f32(dt, src, dst, (size_t)n);
}

void cpu_store_compute(bool wide, alloy_dtype dt, const void *src, void *dst, int64_t n)
{
    if (wide) cvt_store_f64(dt, src, dst, (size_t)n);
    else cvt_store_f32(dt, src, dst, (size_t)n);
}

void *cpu_alloc_compute(bool wide, int64_t n)
{
    return al_malloc((wide ? sizeof(double) : sizeof(float)) * (size_t)(n > 0 ? n : 1));
}

ref_index cpu_index(const rt_tensor *t)
{
    return (ref_index){&t->type, t->type.dtype, t->data};
}

int64_t cpu_index_at(const rt_tensor *t, int64_t i)
{
    ref_index ix = cpu_index(t);
    return ref_index_at(&ix, i);
}

/* cpu_check_indices, allowing the value *skip (when skip is not NULL). */
static alloy_status check_indices(cpu_exec *x, const ir_node *n, const rt_tensor *t, int64_t limit, const char *noun,
                                  const int64_t *skip)
{
    ref_index ix = cpu_index(t);
    char why[sizeof x->error];
    alloy_status st = ref_check_indices(n, &ix, limit, noun, skip, why, sizeof why);
    return st ? cpu_fail(x, st, "%s", why) : ALLOY_OK;
}

alloy_status cpu_check_indices(cpu_exec *x, const ir_node *n, const rt_tensor *t, int64_t limit, const char *noun)
{
    return check_indices(x, n, t, limit, noun, NULL);
}

alloy_status cpu_check_targets(cpu_exec *x, const ir_node *n, const rt_tensor *t, int64_t limit)
{
    const ir_attr *ignore = ir_attr_find(n, "ignore_index");
    return check_indices(x, n, t, limit, "target", ignore && ignore->kind == IR_ATTR_INT ? &ignore->i : NULL);
}

alloy_status cpu_out_of_memory(cpu_exec *x, const ir_node *n)
{
    char label[32];
    return cpu_fail(x, ALLOY_ERR_OOM, "%s '%s': out of memory", ir_ops[n->op].name,
                    ir_node_label(n, label, sizeof label));
}

bool cpu_amp_checked(const ir_graph *g, const ir_node *n) { return ir_amp_checked(g, n); }
