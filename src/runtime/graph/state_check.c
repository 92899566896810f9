/* state_check.c - the values of the state tensors alloy owns (counters, the learning rate, scaler state), checked before a load or set_state takes them. */
#include <math.h>
#include <string.h>

#include "runtime/graph/graph_impl.h"

static bool is_counter(const char *name)
{
    return strcmp(name, STATE_COUNT) == 0 || strcmp(name, STATE_SKIPPED) == 0 || strcmp(name, STATE_TRACKER) == 0 ||
           strcmp(name, STATE_MICRO) == 0 || strcmp(name, STATE_HYSTERESIS) == 0 || strcmp(name, STATE_CONSEC_SKIPS) == 0 ||
           strcmp(name, STATE_GOOD_TRACKER) == 0 || strcmp(name, STATE_GOOD_HYSTERESIS) == 0;
}

/* What each counter alloy keeps may hold. A bad value does no harm at once
 * but ruins every later step: optim.step = -1 makes Adam's bias correction
 * divide by zero (every parameter NaN), a scale of NaN or inf skips every
 * step, a negative one flips every gradient; a scale of 0 is a state the
 * scaler itself reaches (backoff underflowing f32, as PyTorch's does), so
 * a checkpoint holding it loads; a growth tracker at or past growth_interval never grows the
 * scale again (the rule counts up to equality, as PyTorch's). */
alloy_status state_check_value(alloy_graph *g, const rt_state *s, const void *data, const char *where)
{
    if (s->type.rank != 0) return ALLOY_OK;
    const char *name = s->name;
    alloy_dtype dt = s->type.dtype;
    if (dt == ALLOY_I32 && is_counter(name)) {
        int32_t v;
        memcpy(&v, data, sizeof v);
        if (v < 0)
            return graph_fail(g, ALLOY_ERR_INVALID, "%sstate '%s' holds %d; a counter must be >= 0", where, name,
                              (int)v);
        int limit = 0; /* from the graph's configuration; 0: none */
        const char *from = "";
        bool is_tracker = strcmp(name, STATE_TRACKER) == 0 || strcmp(name, STATE_GOOD_TRACKER) == 0;
        bool is_hyst = strcmp(name, STATE_HYSTERESIS) == 0 || strcmp(name, STATE_GOOD_HYSTERESIS) == 0;
        if (is_hyst && g->scaler.kind == ALLOY_SCALER_DYNAMIC && g->scaler.hysteresis > 1)
            limit = g->scaler.hysteresis + 1, from = "the scaler's hysteresis, plus one";
        if (is_tracker && g->scaler.kind == ALLOY_SCALER_DYNAMIC)
            limit = g->scaler.growth_interval, from = "the scaler's growth_interval";
        if (strcmp(name, STATE_MICRO) == 0 && g->optimizer.kind && g->optimizer.accumulation_steps > 1)
            limit = g->optimizer.accumulation_steps, from = "the optimizer's accumulation_steps";
        if (limit > 0 && v >= limit)
            return graph_fail(g, ALLOY_ERR_INVALID, "%sstate '%s' holds %d; it must be below %d (%s)", where, name,
                              (int)v, limit, from);
    } else if (dt == ALLOY_F32 && (strcmp(name, STATE_SCALE) == 0 || strcmp(name, STATE_GOOD_SCALE) == 0)) {
        float v;
        memcpy(&v, data, sizeof v);
        if (!(isfinite(v) && v >= 0) || signbit(v))
            return graph_fail(g, ALLOY_ERR_INVALID, "%sstate '%s' holds %g; the loss scale must be finite and >= 0",
                              where, name, (double)v);
    } else if (dt == ALLOY_F64 && strcmp(name, STATE_BASE_LR) == 0) { /* as alloy_graph_set_lr takes it */
        double v;
        memcpy(&v, data, sizeof v);
        if (!(isfinite(v) && v >= 0))
            return graph_fail(g, ALLOY_ERR_INVALID, "%sstate '%s' holds %g; the learning rate must be finite and >= 0",
                              where, name, v);
    } else if (dt == ALLOY_BOOL && strcmp(name, STATE_FOUND_ACC) == 0) {
        uint8_t v;
        memcpy(&v, data, sizeof v);
        if (v > 1)
            return graph_fail(g, ALLOY_ERR_INVALID, "%sstate '%s' holds byte %d; a bool must be 0 or 1", where,
                              name, (int)v);
    }
    return ALLOY_OK;
}
