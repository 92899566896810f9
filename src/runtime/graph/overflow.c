/* overflow.c - the overflow locator's report: the first value a run flagged as inf/NaN (amp_check), in the order the step ran, with where it came from. */
#include <inttypes.h>
#include <string.h>

#include "runtime/graph/graph_impl.h"

/* The schedule the last run executed. */
static const schedule *run_schedule(const alloy_graph *g)
{
    return g->exec && g->exec == g->exec_kept ? &g->exec_sched : &g->comp.sched;
}

/* Whether node id feeds the loss (a forward node): a walk back from it. */
static bool feeds_loss(const ir_graph *c, int id, uint8_t *mark)
{
    if (c->loss < 0) return true;
    memset(mark, 0, (size_t)c->nnodes);
    mark[c->loss] = 1;
    for (int i = c->loss; i > id; i--)
        if (mark[i])
            for (int j = 0; j < c->nodes[i]->nin; j++) mark[c->nodes[i]->in[j]] = 1;
    return mark[id] != 0;
}

bool overflow_is_backward(const ir_graph *c, int id, uint8_t *mark)
{
    return c->nodes[id]->origin >= 0 || !feeds_loss(c, id, mark);
}

/* The first "grad:<name>" output node id reaches (ids are topological),
 * into param; how many gradient outputs it reaches. */
static int gradient_fed(const ir_graph *c, int id, uint8_t *mark, char *param, size_t len)
{
    memset(mark, 0, (size_t)c->nnodes);
    mark[id] = 1;
    for (int i = id + 1; i < c->nnodes; i++)
        for (int j = 0; j < c->nodes[i]->nin && !mark[i]; j++) mark[i] = mark[c->nodes[i]->in[j]];
    int count = 0;
    param[0] = '\0';
    for (int k = 0; k < c->noutputs; k++) {
        if (strncmp(c->outputs[k].name, "grad:", 5) != 0 || !mark[c->outputs[k].node]) continue;
        if (!count++) al_fmt(param, len, "%s", c->outputs[k].name + 5);
    }
    return count;
}

/* Node n as the IR text names it: "%logits", "%812". */
static void label_of(const ir_node *n, char *buf, size_t len)
{
    if (n->name) al_fmt(buf, len, "%%%s", n->name);
    else al_fmt(buf, len, "%%%d", n->id);
}

void overflow_capture(alloy_graph *g, const uint8_t *flags, bool checked)
{
    alloy_overflow_info *o = &g->overflow;
    memset(o, 0, sizeof *o);
    o->checked = checked;
    g->overflow_node = -1;
    if (!checked || !flags) return;
    const ir_graph *c = g->compiled;
    const schedule *s = run_schedule(g);
    int first = -1;
    for (int k = 0; k < s->nsteps && first < 0; k++) /* steps, and members within one, in the order they ran */
        for (int m = s->steps[k].first; m < s->steps[k].first + s->steps[k].n && first < 0; m++)
            if (flags[s->members[m].node]) first = s->members[m].node;
    if (first < 0) return;
    g->overflow_node = first;
    const ir_node *n = c->nodes[first];
    o->found = true;
    o->has_inf = flags[first] & NONFINITE_INF;
    o->has_nan = flags[first] & NONFINITE_NAN;
    label_of(n, o->node, sizeof o->node);
    o->op = ir_ops[n->op].name;
    o->dtype = n->type.dtype;
    o->rank = n->type.rank;
    memcpy(o->dims, n->type.dims, sizeof o->dims);
    o->scale = g->step.scale;
    o->next_scale = g->step.next_scale;
    uint8_t *mark = al_malloc((size_t)c->nnodes + 1);
    int fed = 0;
    if (mark) {
        o->backward = overflow_is_backward(c, first, mark);
        if (o->backward) fed = gradient_fed(c, first, mark, o->param, sizeof o->param);
        al_free(mark);
    }
    if (n->origin >= 0) {
        label_of(c->nodes[n->origin], o->forward_node, sizeof o->forward_node);
        o->forward_op = ir_ops[c->nodes[n->origin]->op].name;
    }
    char type[96], from[256] = "";
    ir_fmt_type(type, sizeof type, &n->type);
    if (o->backward) {
        char of[128] = "", grad[192] = "";
        if (o->forward_op) al_fmt(of, sizeof of, " of %s %s", o->forward_op, o->forward_node);
        if (fed == 1) al_fmt(grad, sizeof grad, ", gradient of '%s'", o->param);
        else if (fed > 1) al_fmt(grad, sizeof grad, ", gradient of '%s' and %d more", o->param, fed - 1);
        al_fmt(from, sizeof from, " (backward%s%s)", of, grad);
    } else {
        al_fmt(from, sizeof from, " (forward)");
    }
    al_fmt(o->summary, sizeof o->summary, "first %s at %s %s %s%s, scale %g -> %g",
           o->has_inf && o->has_nan ? "inf/NaN" : o->has_inf ? "inf" : "NaN", o->node, o->op, type, from, o->scale,
           o->next_scale);
}

void overflow_add_input_range(alloy_graph *g, const rt_range *run)
{
    alloy_overflow_info *o = &g->overflow;
    if (!o->found || !run || o->input_max_known) return;
    const ir_graph *c = g->compiled;
    int id = g->overflow_node;
    if (id < 0 || id >= c->nnodes) return;
    uint32_t most = 0;
    for (int j = 0; j < c->nodes[id]->nin; j++) {
        const rt_range *r = &run[c->nodes[id]->in[j]];
        if (!r->count) continue;
        o->input_max_known = true;
        if (r->max_bits > most) most = r->max_bits;
    }
    if (!o->input_max_known) return;
    float f;
    memcpy(&f, &most, sizeof f);
    o->input_max_abs = f;
    /* the summary says it before the scale */
    char *at = strstr(o->summary, "), scale "); /* after the "(forward)" or "(backward ...)" part */
    if (at) at++;
    if (!at) return;
    char tail[128];
    al_fmt(tail, sizeof tail, "%s", at);
    al_fmt(at, sizeof o->summary - (size_t)(at - o->summary), ", inputs max |x| %.3g%s", o->input_max_abs, tail);
}

alloy_status alloy_graph_overflow_info(const alloy_graph *g, alloy_overflow_info *out)
{
    if (!g) return ALLOY_ERR_INVALID;
    if (!out) return graph_fail_const(g, ALLOY_ERR_INVALID, "overflow_info: out is NULL");
    *out = g->overflow;
    return ALLOY_OK;
}
