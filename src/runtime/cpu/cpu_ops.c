/* cpu_ops.c - the CPU backend's per-op table, expanded from ops.def's cpu_kernel column and EW expressions, and the refusal of the ops a pass lowers; cpu_run_op runs one node by its kernel. */
#include "runtime/cpu/cpu.h"

#define cpu_none NULL /* bound leaves: input, param, state */
const cpu_op cpu_ops[IR_OP_COUNT] = {
#define OP(nm, mn, mx, at, ty, kernel, ...) [IR_OP_##nm] = {cpu_##kernel, NULL, NULL},
#define EW(nm, ...) [IR_OP_##nm] = {cpu_elementwise, ew_##nm##_f32, ew_##nm##_f64},
#include "ir/ops.def"
#undef OP
#undef EW
};

/* batch_norm, group_norm: the lower_norm pass lowers them; one that gets here was not. */
alloy_status cpu_lowered(cpu_exec *x, const ir_node *n, rt_tensor *out, const rt_tensor *in)
{
    (void)out, (void)in;
    char label[32];
    return cpu_fail(x, ALLOY_ERR_UNSUPPORTED, "%s '%s': not lowered (the lower_norm pass rewrites it into other ops before it runs)",
                    ir_ops[n->op].name, ir_node_label(n, label, sizeof label));
}

void cpu_run_op(cpu_exec *x, const ir_node *n, rt_tensor *values)
{
    rt_tensor in_small[8];
    rt_tensor *in = n->nin <= 8 ? in_small : al_malloc(sizeof(rt_tensor) * (size_t)n->nin);
    if (!in) {
        cpu_out_of_memory(x, n);
        return;
    }
    for (int j = 0; j < n->nin; j++) in[j] = values[n->in[j]];
    cpu_ops[n->op].kernel(x, n, &values[n->id], in);
    if (in != in_small) al_free(in);
}
