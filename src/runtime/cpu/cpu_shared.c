/* cpu_shared.c - what the CPU kernels share: failing with the node's name, values in the compute type, index range checks. */
#include <stdarg.h>
#include <stdio.h>

#include "base/convert.h"
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

int64_t cpu_index_at(const rt_tensor *t, int64_t i)
{
    if (t->type.dtype == ALLOY_I32) return ((const int32_t *)t->data)[i];
    return ((const int64_t *)t->data)[i];
}

/* cpu_check_indices, allowing the value *skip (when skip is not NULL). */
static alloy_status check_indices(cpu_exec *x, const ir_node *n, const rt_tensor *t, int64_t limit, const char *noun,
                                  const int64_t *skip)
{
    int64_t count = ir_numel(&t->type);
    for (int64_t p = 0; p < count; p++) {
        int64_t v = cpu_index_at(t, p);
        if ((v >= 0 && v < limit) || (skip && v == *skip)) continue;
        int64_t idx[ALLOY_MAX_RANK], rest = p;
        for (int d = t->type.rank - 1; d >= 0; d--) {
            idx[d] = rest % t->type.dims[d];
            rest /= t->type.dims[d];
        }
        char label[32], where[128];
        al_fmt_dims(where, sizeof where, t->type.rank, idx);
        return cpu_fail(x, ALLOY_ERR_INVALID, "%s '%s': %s %lld out of range [0, %lld) at position %s",
                        ir_ops[n->op].name, ir_node_label(n, label, sizeof label), noun, (long long)v,
                        (long long)limit, where);
    }
    return ALLOY_OK;
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
