/* amp.c - the enable_amp pass: colour every f32 node low precision or f32, then rewrite with shared casts.
 *
 * After this pass: every f32 compute node is annotated !amp=allow (it now
 * computes in f16/bf16) or deny/infer/clear (it stays f32); every operand
 * of a node arrives in the precision the node runs in, through at most one
 * cast per (tensor, dtype); amp_allow/amp_deny markers are gone; graph
 * outputs and the loss keep their declared dtypes; parameters stay f32
 * (their casts are the per-step low-precision weight copies).
 *
 * The colouring is TensorFlow grappler's (docs/amp.md): deny propagation
 * forward through clear/infer nodes upstream of deny/infer; clear/infer
 * nodes sandwiched between allow nodes (or between an allow node and a
 * graph output / sink, OneFlow's rule) become allow, unless they take the
 * user's f32 data (an input: autocast's promote rule, so a loss's target is
 * not rounded); allow spreads
 * through clear nodes both ways. Every traversal enters a node at most
 * once, so the pass is linear in nodes + edges.
 *
 * With the amp_ranges option (a stats file from a calibration run), a node
 * whose observed max |x| times the margin would overflow the format is
 * pinned to f32 before colouring, and so is every clear or allow op that
 * would read it in low precision (docs/amp.md, "Range-aware colouring").
 */
#include <stdlib.h>
#include <string.h>

#include "alloy/amp.h"
#include "passes/pass.h"

typedef struct amp_state {
    const ir_graph *g;
    int n;
    int *cons_start, *cons; /* consumers of node i: cons[cons_start[i] .. cons_start[i+1]) */
    uint8_t *cls;           /* class after list edits */
    uint8_t *colourable;    /* f32 compute node that could run in low precision */
    uint8_t *upstream;      /* U: deny/infer nodes and clear nodes upstream of them */
    uint8_t *deny, *down, *allow, *seen;
    uint8_t *pin;     /* the node's !amp before the pass: AMP_DENY pins it to f32, AMP_ALLOW to low precision */
    uint8_t *data;    /* an f32 input, a node pinned to f32, or a clear op over only such values */
    uint8_t *promote; /* an infer node with a data operand: runs in f32 (PyTorch's promote rule) */
    int *deny_root; /* the deny node whose propagation painted this one */
    /* range-aware colouring (amp_ranges): per node, the observed max |x|
     * that keeps it f32 (-1: none), or for a consumer kept f32 because it
     * would read such a value in low precision, that value's node (-1) */
    double *range_max;
    int *range_reads;
    double range_limit; /* the format's max / the margin */
    int range_kept;
    int *stack;
    bool *is_output;
} amp_state;

static bool is_marker(int op) { return op == IR_OP_amp_allow || op == IR_OP_amp_deny; }

static const char *class_name(int c)
{
    static const char *names[] = {"none", "allow", "deny", "infer", "clear"};
    return c >= 0 && c <= AMP_CLEAR ? names[c] : "?";
}

/* The class of op under the configured lists; error if on two lists. */
static alloy_status op_class(ir_graph *g, const amp_config *cfg, int op, uint8_t *out)
{
    if (is_marker(op)) {
        *out = (uint8_t)ir_ops[op].amp;
        return ALLOY_OK;
    }
    uint8_t bits = cfg->lists[op] & 0x1e;
    if (!bits) {
        *out = (uint8_t)cfg->unlisted;
        return ALLOY_OK;
    }
    if (bits & (bits - 1)) {
        const char *on[4];
        int k = 0;
        for (int c = AMP_ALLOW; c <= AMP_CLEAR; c++)
            if (bits & (1u << c)) on[k++] = class_name(c);
        return ir_error(g, ALLOY_ERR_INVALID, "amp: op '%s' is on both the %s and %s lists",
                        ir_ops[op].name, on[0], on[1]);
    }
    for (int c = AMP_ALLOW; c <= AMP_CLEAR; c++)
        if (bits == (1u << c)) *out = (uint8_t)c;
    return ALLOY_OK;
}

static bool colourable(const ir_node *n)
{
    if (n->nin == 0 || n->op == IR_OP_cast) return false; /* leaves and the user's own casts */
    /* uniform and normal are leaves with a step operand: their dtype is
     * declared, as torch.rand's under autocast */
    if (n->op == IR_OP_uniform || n->op == IR_OP_normal) return false;
    return n->type.dtype == ALLOY_F32;
}

static alloy_status build_state(amp_state *s, ir_graph *g, const amp_config *cfg)
{
    int n = g->nnodes;
    s->g = g;
    s->n = n;
    size_t nn = (size_t)n + 1;
    s->cons_start = al_calloc(nn + 1, sizeof(int));
    s->cls = al_calloc(nn, 1);
    s->colourable = al_calloc(nn, 1);
    s->upstream = al_calloc(nn, 1);
    s->deny = al_calloc(nn, 1);
    s->down = al_calloc(nn, 1);
    s->allow = al_calloc(nn, 1);
    s->seen = al_calloc(nn, 1);
    s->data = al_calloc(nn, 1);
    s->pin = al_calloc(nn, 1);
    s->promote = al_calloc(nn, 1);
    s->deny_root = al_calloc(nn, sizeof(int));
    s->stack = al_calloc(nn, sizeof(int));
    s->is_output = al_calloc(nn, sizeof(bool));
    int edges = 0;
    for (int i = 0; i < n; i++) edges += g->nodes[i]->nin;
    s->cons = al_calloc((size_t)edges + 1, sizeof(int));
    if (!s->cons_start || !s->cls || !s->colourable || !s->upstream || !s->deny || !s->down ||
        !s->allow || !s->seen || !s->data || !s->pin || !s->promote || !s->deny_root || !s->stack || !s->is_output || !s->cons)
        return ir_error(g, ALLOY_ERR_OOM, "amp: out of memory for a graph of %d nodes", n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++) s->cons_start[g->nodes[i]->in[j] + 1]++;
    for (int i = 0; i < n; i++) s->cons_start[i + 1] += s->cons_start[i];
    int *fill = s->stack; /* reuse as a cursor array */
    for (int i = 0; i < n; i++) fill[i] = s->cons_start[i];
    for (int i = 0; i < n; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++) s->cons[fill[g->nodes[i]->in[j]]++] = i;
    for (int i = 0; i < g->noutputs; i++) s->is_output[g->outputs[i].node] = true;
    for (int i = 0; i < n; i++) {
        const ir_node *node = g->nodes[i];
        alloy_status st = op_class(g, cfg, node->op, &s->cls[i]);
        if (st) return st;
        s->colourable[i] = colourable(node);
        s->deny_root[i] = -1;
        /* a pin from the IR (!amp=...) or a scope: f32 nodes stay as they are, low ones are allow seeds */
        s->pin[i] = s->colourable[i] && !is_marker(node->op) ? node->amp : AMP_NONE;
        if (s->pin[i] == AMP_DENY) s->colourable[i] = 0;
        if (s->pin[i] == AMP_ALLOW) s->cls[i] = AMP_ALLOW;
    }
    return ALLOY_OK;
}

static void free_state(amp_state *s)
{
    al_free(s->cons_start);
    al_free(s->cons);
    al_free(s->cls);
    al_free(s->colourable);
    al_free(s->upstream);
    al_free(s->deny);
    al_free(s->down);
    al_free(s->allow);
    al_free(s->seen);
    al_free(s->data);
    al_free(s->pin);
    al_free(s->promote);
    al_free(s->deny_root);
    al_free(s->range_max);
    al_free(s->range_reads);
    al_free(s->stack);
    al_free(s->is_output);
}

/* Range-aware colouring, before step 1: pins to f32 each colourable node
 * of the stats file whose max |x| exceeds range_limit, then walks its
 * consumers through clear ops: a clear or allow op there would read it in
 * low precision, through a cast that overflows, so it is pinned too (an
 * infer op is kept f32 by the promote rule: a pinned node is f32 data). */
static alloy_status apply_ranges(amp_state *s, const char *path, alloy_dtype low, double margin)
{
    ir_graph *g = (ir_graph *)s->g;
    amp_ranges r;
    alloy_status st = amp_ranges_load(g, path, &r);
    if (st) return st;
    size_t nn = (size_t)s->n + 1;
    s->range_max = al_malloc(nn * sizeof *s->range_max);
    s->range_reads = al_malloc(nn * sizeof *s->range_reads);
    if (!s->range_max || !s->range_reads) {
        amp_ranges_free(&r);
        return ir_error(g, ALLOY_ERR_OOM, "amp: out of memory for range-aware colouring");
    }
    s->range_limit = (low == ALLOY_F16 ? 65504.0 : 0x1.fep127) / margin;
    for (int i = 0; i < s->n; i++) s->range_max[i] = -1, s->range_reads[i] = -1;
    for (int i = 0; i < s->n; i++) {
        const amp_range *e = s->colourable[i] ? amp_ranges_find(&r, g->nodes[i]->name) : NULL;
        if (!e || !(e->max > s->range_limit)) continue;
        s->range_max[i] = e->max;
        s->pin[i] = AMP_DENY;
        s->colourable[i] = 0;
    }
    for (int i = 0; i < s->n; i++) { /* then their readers: a node with a max of its own gives that as its reason */
        if (s->range_max[i] < 0) continue;
        int top = 0;
        s->stack[top++] = i;
        while (top) {
            int v = s->stack[--top];
            for (int k = s->cons_start[v]; k < s->cons_start[v + 1]; k++) {
                int c = s->cons[k];
                if (!s->colourable[c] || (s->cls[c] != AMP_CLEAR && s->cls[c] != AMP_ALLOW)) continue;
                s->range_reads[c] = i;
                s->pin[c] = AMP_DENY;
                s->colourable[c] = 0;
                if (s->cls[c] == AMP_CLEAR) s->stack[top++] = c;
            }
        }
    }
    for (int i = 0; i < s->n; i++) s->range_kept += s->range_max[i] >= 0 || s->range_reads[i] >= 0;
    amp_ranges_free(&r);
    return ALLOY_OK;
}

/* Step 2a: U = deny/infer nodes and the clear nodes upstream of them
 * (reached through clear nodes only). */
static void mark_upstream_of_deny_or_infer(amp_state *s)
{
    for (int r = 0; r < s->n; r++) {
        if (!s->colourable[r] || (s->cls[r] != AMP_DENY && s->cls[r] != AMP_INFER)) continue;
        s->upstream[r] = 1;
        int top = 0;
        s->stack[top++] = r;
        while (top) {
            const ir_node *v = s->g->nodes[s->stack[--top]];
            for (int j = 0; j < v->nin; j++) {
                int u = v->in[j];
                if (s->upstream[u] || !s->colourable[u] || s->cls[u] != AMP_CLEAR) continue;
                s->upstream[u] = 1;
                s->stack[top++] = u;
            }
        }
    }
}

/* Step 2b: deny spreads forward from deny nodes (and the loss) into U. */
static void propagate_deny(amp_state *s)
{
    for (int r = 0; r < s->n; r++) {
        bool seed = s->colourable[r] && (s->cls[r] == AMP_DENY || r == s->g->loss);
        if (!seed || s->deny[r]) continue;
        s->deny[r] = 1;
        s->deny_root[r] = r;
        int top = 0;
        s->stack[top++] = r;
        while (top) {
            int v = s->stack[--top];
            for (int k = s->cons_start[v]; k < s->cons_start[v + 1]; k++) {
                int c = s->cons[k];
                if (s->deny[c] || !s->upstream[c] || !s->colourable[c]) continue;
                s->deny[c] = 1;
                s->deny_root[c] = r;
                s->stack[top++] = c;
            }
        }
    }
}

/* Step 1: the user's f32 data (inputs, and clear ops such as reshape over
 * them) and the infer nodes that take it: those run in f32 whatever their
 * other operands are (a residual pred - target keeps the target's f32
 * bits, as autocast's promote rule does), unless the user put their op on
 * the allow list. Operands precede their consumers, so one pass in node
 * order. */
static void mark_promoted(amp_state *s)
{
    for (int i = 0; i < s->n; i++) {
        const ir_node *v = s->g->nodes[i];
        if (v->type.dtype != ALLOY_F32) continue;
        bool data = v->op == IR_OP_input || s->pin[i] == AMP_DENY;
        if (!data && s->colourable[i] && s->cls[i] == AMP_CLEAR && v->nin > 0) {
            data = true;
            for (int j = 0; j < v->nin; j++) data &= s->data[v->in[j]];
        }
        s->data[i] = data;
        if (!s->colourable[i] || s->cls[i] != AMP_INFER) continue;
        for (int j = 0; j < v->nin; j++) s->promote[i] |= s->data[v->in[j]];
    }
}

static bool allow_seed(const amp_state *s, int i)
{
    return s->colourable[i] && s->cls[i] == AMP_ALLOW && !s->deny[i];
}

/* Step 3: clear/infer nodes downstream of an allow node and upstream of
 * another (or of a graph output / sink) become allow. */
static void allow_sandwiched(amp_state *s)
{
    for (int r = 0; r < s->n; r++) {
        if (!allow_seed(s, r)) continue;
        int top = 0;
        s->stack[top++] = r;
        while (top) {
            int v = s->stack[--top];
            for (int k = s->cons_start[v]; k < s->cons_start[v + 1]; k++) {
                int c = s->cons[k];
                if (s->down[c] || s->deny[c] || s->promote[c] || !s->colourable[c] ||
                    (s->cls[c] != AMP_CLEAR && s->cls[c] != AMP_INFER))
                    continue;
                s->down[c] = 1;
                s->stack[top++] = c;
            }
        }
    }
    for (int r = 0; r < s->n; r++) {
        bool sink = s->down[r] && (s->is_output[r] || s->cons_start[r] == s->cons_start[r + 1]);
        if (!allow_seed(s, r) && !sink) continue;
        if (s->allow[r] && !allow_seed(s, r)) continue;
        s->allow[r] = 1;
        int top = 0;
        s->stack[top++] = r;
        while (top) {
            const ir_node *v = s->g->nodes[s->stack[--top]];
            for (int j = 0; j < v->nin; j++) {
                int u = v->in[j];
                if (s->allow[u] || !s->down[u]) continue;
                s->allow[u] = 1;
                s->stack[top++] = u;
            }
        }
    }
}

/* Step 4: allow spreads through clear nodes, along inputs and consumers. */
static void allow_through_clear(amp_state *s)
{
    uint8_t *prop = s->seen;
    memset(prop, 0, (size_t)s->n);
    for (int r = 0; r < s->n; r++) {
        if (!s->allow[r] || prop[r]) continue;
        prop[r] = 1;
        int top = 0;
        s->stack[top++] = r;
        while (top) {
            int v = s->stack[--top];
            const ir_node *node = s->g->nodes[v];
            int nin = node->nin, ncons = s->cons_start[v + 1] - s->cons_start[v];
            for (int k = 0; k < nin + ncons; k++) {
                int w = k < nin ? node->in[k] : s->cons[s->cons_start[v] + k - nin];
                if (prop[w] || s->allow[w] || s->deny[w] || !s->colourable[w] || s->cls[w] != AMP_CLEAR)
                    continue;
                prop[w] = 1;
                s->stack[top++] = w;
            }
        }
    }
    for (int i = 0; i < s->n; i++)
        if (prop[i]) s->allow[i] = 1;
}

/* ---- rewrite ---- */

typedef struct rewriter {
    ir_graph *out;
    int *cast_low, *cast_f32; /* per new node: its shared cast to low / to f32, or -1 */
    int *cast_src;            /* per new node: for an inserted cast, the node it casts, else -1 */
    int cap;
    alloy_dtype low;
    int casts, weight_casts;
} rewriter;

static bool rewriter_grow(rewriter *rw)
{
    if (rw->out->nnodes < rw->cap) return true;
    int cap = rw->cap ? rw->cap * 2 : 256;
    int *a = al_realloc(rw->cast_low, sizeof(int) * (size_t)cap);
    if (a) rw->cast_low = a;
    int *b = al_realloc(rw->cast_f32, sizeof(int) * (size_t)cap);
    if (b) rw->cast_f32 = b;
    int *c = al_realloc(rw->cast_src, sizeof(int) * (size_t)cap);
    if (c) rw->cast_src = c;
    if (!a || !b || !c) return false;
    for (int i = rw->cap; i < cap; i++) rw->cast_low[i] = rw->cast_f32[i] = rw->cast_src[i] = -1;
    rw->cap = cap;
    return true;
}

/* Node id holding new node `id` in dtype want: id itself, the tensor an
 * inserted cast came from (x, not cast(cast(x))), or one shared cast. */
static int convert(rewriter *rw, int id, alloy_dtype want)
{
    const ir_node *n = rw->out->nodes[id];
    if (n->type.dtype == want) return id;
    int src = rw->cast_src[id];
    if (src >= 0 && rw->out->nodes[src]->type.dtype == want) return src;
    /* one shared cast per (tensor, dtype); indices, not pointers: the
     * tables move when rewriter_grow reallocates them */
    int memo = want == ALLOY_F32 ? rw->cast_f32[id] : want == rw->low ? rw->cast_low[id] : -1;
    if (memo >= 0) return memo;
    if (!rewriter_grow(rw)) {
        ir_error(rw->out, ALLOY_ERR_OOM, "amp: out of memory inserting a cast");
        return -1;
    }
    ir_type t = n->type;
    t.dtype = want;
    ir_node *c = ir_add_node(rw->out, IR_OP_cast, 1, &id, 0, NULL, &t, NULL);
    if (!c) return -1;
    c->flags |= IR_NODE_INSERTED;
    c->amp = want == ALLOY_F32 ? AMP_DENY : AMP_ALLOW;
    rw->casts++;
    if (n->op == IR_OP_param) rw->weight_casts++;
    if (!rewriter_grow(rw)) {
        ir_error(rw->out, ALLOY_ERR_OOM, "amp: out of memory inserting a cast");
        return -1;
    }
    rw->cast_src[c->id] = id;
    if (want == ALLOY_F32) rw->cast_f32[id] = c->id;
    else if (want == rw->low) rw->cast_low[id] = c->id;
    return c->id;
}

static uint8_t final_colour(const amp_state *s, int i)
{
    if (s->pin[i] == AMP_DENY) return AMP_DENY; /* pinned to f32 */
    if (!s->colourable[i]) return AMP_NONE;     /* leaves, user casts, non-f32: untouched */
    if (s->allow[i]) return AMP_ALLOW;
    if (s->deny[i]) return AMP_DENY;
    return s->cls[i] == AMP_ALLOW ? AMP_DENY : s->cls[i];
}

/* Builds the coloured graph into *result; map[old id] = new id (caller frees). */
static alloy_status rewrite(const amp_state *s, alloy_dtype low, ir_graph **result, rewriter *rw,
                            int **map_out)
{
    const ir_graph *g = s->g;
    memset(rw, 0, sizeof *rw);
    rw->low = low;
    rw->out = ir_graph_new(g->name);
    int *map = al_calloc((size_t)g->nnodes + 1, sizeof(int));
    int ops_small[16];
    if (!rw->out || !map) {
        al_free(map);
        ir_graph_free(rw->out);
        return ir_error((ir_graph *)g, ALLOY_ERR_OOM, "amp: out of memory starting the rewrite");
    }
    ir_graph *out = rw->out;
    for (int i = 0; i < g->nnodes && !out->status; i++) {
        const ir_node *v = g->nodes[i];
        alloy_dtype run_as = s->allow[i] ? low : v->type.dtype;
        if (is_marker(v->op)) {
            map[i] = convert(rw, map[v->in[0]], run_as);
            continue;
        }
        int *ops = v->nin <= 16 ? ops_small : al_malloc(sizeof(int) * (size_t)v->nin);
        if (!ops) {
            ir_error(out, ALLOY_ERR_OOM, "amp: out of memory");
            break;
        }
        for (int j = 0; j < v->nin && !out->status; j++) {
            alloy_dtype src = g->nodes[v->in[j]]->type.dtype;
            alloy_dtype want = s->allow[i] && src == ALLOY_F32 ? low : src;
            ops[j] = convert(rw, map[v->in[j]], want);
        }
        ir_type t = v->type;
        t.dtype = run_as;
        ir_node *nv = out->status ? NULL
                                  : ir_add_node(out, v->op, v->nin, ops, v->nattrs, v->attrs, &t, v->name);
        if (ops != ops_small) al_free(ops);
        if (!nv || !rewriter_grow(rw)) {
            ir_error(out, ALLOY_ERR_OOM, "amp: out of memory");
            break;
        }
        nv->amp = final_colour(s, i);
        nv->group = v->group;
        map[i] = nv->id;
    }
    for (int i = 0; i < g->noutputs && !out->status; i++) {
        const ir_output *o = &g->outputs[i];
        int id = convert(rw, map[o->node], g->nodes[o->node]->type.dtype);
        if (id >= 0) ir_add_output(out, o->name, id);
    }
    for (int i = 0; i < g->nupdates && !out->status; i++) {
        const ir_output *u = &g->updates[i];
        int id = convert(rw, map[u->node], g->nodes[u->node]->type.dtype);
        if (id >= 0) ir_add_update(out, u->name, id);
    }
    if (g->loss >= 0 && !out->status) out->loss = convert(rw, map[g->loss], g->nodes[g->loss]->type.dtype);
    *map_out = map;
    al_free(rw->cast_low);
    al_free(rw->cast_f32);
    al_free(rw->cast_src);
    if (out->status) {
        alloy_status st = out->status;
        ir_error((ir_graph *)g, st, "%s", out->error);
        ir_graph_free(out);
        al_free(map);
        *map_out = NULL;
        return st;
    }
    *result = out;
    return ALLOY_OK;
}

/* ---- report ---- */

/* Counts the inserted casts of out that the compiled step keeps: used ones
 * (a marker's cast can be bypassed by the fold in convert() and is then
 * dead until dce), less those of a constant, which simplify folds into a
 * constant of the cast's dtype unless it is disabled. */
static alloy_status count_live_casts(const ir_graph *out, alloy_amp_report *rep, bool folding)
{
    uint8_t *used = al_calloc((size_t)out->nnodes + 1, 1);
    if (!used) return ALLOY_ERR_OOM;
    for (int i = 0; i < out->nnodes; i++)
        for (int j = 0; j < out->nodes[i]->nin; j++) used[out->nodes[i]->in[j]] = 1;
    for (int i = 0; i < out->noutputs; i++) used[out->outputs[i].node] = 1;
    for (int i = 0; i < out->nupdates; i++) used[out->updates[i].node] = 1;
    if (out->loss >= 0) used[out->loss] = 1;
    rep->casts = rep->weight_casts = 0;
    for (int i = 0; i < out->nnodes; i++) {
        const ir_node *n = out->nodes[i];
        if (!(n->flags & IR_NODE_INSERTED) || n->op != IR_OP_cast || !used[i]) continue;
        if (folding && simplify_folds(out, n->nin, n->in, &n->type)) continue;
        rep->casts++;
        rep->weight_casts += out->nodes[n->in[0]]->op == IR_OP_param;
    }
    al_free(used);
    return ALLOY_OK;
}

static const char *deny_reason(const amp_state *s, int i, char *buf, size_t len)
{
    const ir_graph *g = s->g;
    if (s->deny[i]) {
        int r = s->deny_root[i];
        if (r == i && g->nodes[i]->op == IR_OP_amp_deny) return "pinned by amp_deny";
        if (r == i && i == g->loss && s->cls[i] != AMP_DENY) return "it is the loss";
        if (r == i) {
            al_fmt(buf, len, "'%s' is on the deny list", ir_ops[g->nodes[i]->op].name);
            return buf;
        }
        al_fmt(buf, len, "downstream of deny node %s (%s) through clear/infer ops",
               g->nodes[r]->name ? g->nodes[r]->name : ir_ops[g->nodes[r]->op].name,
               ir_ops[g->nodes[r]->op].name);
        return buf;
    }
    if (s->promote[i]) {
        const ir_node *v = g->nodes[i];
        int d = 0;
        while (d < v->nin - 1 && !s->data[v->in[d]]) d++;
        const ir_node *in = g->nodes[v->in[d]];
        al_fmt(buf, len, "it takes the f32 data %s%s%s (promote rule)", in->name ? "'" : "",
               in->name ? in->name : ir_ops[in->op].name, in->name ? "'" : "");
        return buf;
    }
    if (s->cls[i] == AMP_INFER) return "infer op not between low-precision nodes";
    if (s->cls[i] == AMP_CLEAR) return "clear op with no low-precision neighbour";
    return "not coloured";
}

/* x in few characters: "7.1e4", "3.2", "inf". */
static const char *short_num(double x, char *buf, size_t len)
{
    if (x >= 1e4 && x < 1e300) {
        char m[32];
        al_fmt(m, sizeof m, "%.1e", x); /* "7.1e+04" */
        char *e = strchr(m, 'e');
        int ex = atoi(e + 1);
        *e = '\0';
        al_fmt(buf, len, "%se%d", m, ex);
    } else {
        al_fmt(buf, len, "%.3g", x);
    }
    return buf;
}

/* Node n as the IR text names it: "%h", "%230". */
static const char *ir_label(const ir_node *n, char *buf, size_t len)
{
    if (n->name) al_fmt(buf, len, "%%%s", n->name);
    else al_fmt(buf, len, "%%%d", n->id);
    return buf;
}

/* The range-aware colouring's decisions, one line each with its reason. */
static void log_ranges(const amp_state *s, const ir_graph *out, const int *map, double margin, FILE *log)
{
    double fmax = s->range_limit * margin;
    char limit[64], a[32], b[32];
    if (fmax == 65504.0) al_fmt(limit, sizeof limit, "65504/%g", margin);
    else al_fmt(limit, sizeof limit, "%s/%g", short_num(fmax, b, sizeof b), margin);
    for (int i = 0; s->range_max && i < s->n; i++) {
        int from = s->range_reads[i];
        if (s->range_max[i] < 0 && from < 0) continue;
        char label[64], src[64];
        ir_label(out->nodes[map[i]], label, sizeof label);
        if (s->range_max[i] >= 0) {
            fprintf(log, "alloy amp:   %s %s kept f32: max |x| %s > %s\n", label, ir_ops[s->g->nodes[i]->op].name,
                    short_num(s->range_max[i], a, sizeof a), limit);
        } else {
            ir_label(out->nodes[map[from]], src, sizeof src);
            fprintf(log, "alloy amp:   %s %s kept f32: reads %s (max |x| %s > %s)\n", label,
                    ir_ops[s->g->nodes[i]->op].name, src, short_num(s->range_max[from], a, sizeof a), limit);
        }
    }
}

/* The summary line, then why each f32 node next to a low-precision node
 * stayed f32, labelled as the rewritten graph `out` prints it. */
static void log_report(const amp_state *s, const alloy_amp_report *rep, const ir_graph *out,
                       const int *map, const al_options *cfg, FILE *log)
{
    fprintf(log, "alloy amp: converted %d/%d nodes to %s with %d casts (%d weight casts)\n",
            rep->low_nodes, rep->float_nodes, alloy_dtype_name(rep->dtype), rep->casts,
            rep->weight_casts);
    if (s->range_max) {
        double margin = cfg->amp_range_margin > 0 ? cfg->amp_range_margin : 2;
        fprintf(log, "alloy amp: range statistics from %s (margin %g): %d node%s kept f32\n", cfg->amp_ranges,
                margin, s->range_kept, s->range_kept == 1 ? "" : "s");
        log_ranges(s, out, map, margin, log);
    }
    for (int i = 0; i < s->n; i++) {
        if (!s->colourable[i] || s->allow[i]) continue;
        const ir_node *v = s->g->nodes[i];
        bool next_to_allow = false;
        for (int j = 0; j < v->nin; j++) next_to_allow |= s->allow[v->in[j]];
        for (int k = s->cons_start[i]; k < s->cons_start[i + 1]; k++) next_to_allow |= s->allow[s->cons[k]];
        if (!next_to_allow) continue;
        char label[64], why[160];
        fprintf(log, "alloy amp:   %s (%s) stays f32: %s\n",
                ir_node_label(out->nodes[map[i]], label, sizeof label),
                ir_ops[v->op].name, deny_reason(s, i, why, sizeof why));
    }
}

alloy_status pass_amp(ir_graph **gp, const pass_options *opts)
{
    const amp_config *cfg = &opts->amp;
    if (opts->amp_report) *opts->amp_report = (alloy_amp_report){.dtype = cfg->dtype};
    if (cfg->dtype == ALLOY_F32) return ALLOY_OK;
    ir_graph *g = *gp;
    if (cfg->dtype != ALLOY_F16 && cfg->dtype != ALLOY_BF16)
        return ir_error(g, ALLOY_ERR_INVALID, "amp: dtype must be f16 or bf16, not %s",
                        alloy_dtype_name(cfg->dtype));
    amp_state s = {0};
    alloy_status st = build_state(&s, g, cfg);
    const al_options *o = pass_cfg(opts);
    if (!st && o->amp_ranges[0])
        st = apply_ranges(&s, o->amp_ranges, cfg->dtype, o->amp_range_margin > 0 ? o->amp_range_margin : 2);
    if (!st) {
        mark_promoted(&s);
        mark_upstream_of_deny_or_infer(&s);
        propagate_deny(&s);
        allow_sandwiched(&s);
        allow_through_clear(&s);
        ir_graph *out = NULL;
        int *map = NULL;
        rewriter rw;
        st = rewrite(&s, cfg->dtype, &out, &rw, &map);
        alloy_amp_report rep = {.dtype = cfg->dtype, .casts = rw.casts, .weight_casts = rw.weight_casts,
                                .range_kept = s.range_kept};
        bool folding = true;
        for (int i = 0; i < pass_count(); i++)
            if (strcmp(pass_name(i), "simplify") == 0) folding = !(pass_cfg(opts)->disabled & 1u << i);
        if (!st && count_live_casts(out, &rep, folding)) {
            st = ir_error(g, ALLOY_ERR_OOM, "amp: out of memory counting the casts");
            al_free(map);
            ir_graph_free(out);
        }
        if (!st) {
            for (int i = 0; i < s.n; i++) {
                bool ranged = s.range_max && (s.range_max[i] >= 0 || s.range_reads[i] >= 0);
                if ((!s.colourable[i] && !ranged) || is_marker(g->nodes[i]->op)) continue;
                rep.float_nodes++;
                rep.low_nodes += s.allow[i];
            }
            if (opts->amp_report) *opts->amp_report = rep;
            if (pass_cfg(opts)->amp_log)
                log_report(&s, &rep, out, map, pass_cfg(opts), opts->log ? opts->log : stderr);
            al_free(map);
            ir_graph_free(g);
            *gp = out;
        }
    }
    free_state(&s);
    return st;
}
