/* fuse.c - fusion groups: which nodes run as one kernel (elementwise chains, row ops with their producers and consumers, GEMM epilogues, multi-tensor launches).
 *
 * After this pass every node's `group` is -1 or a group id in [0, ngroups),
 * numbered in the order of each group's first member, and every group has
 * at least two members and is one of the kinds of ir/groups.h:
 *   - ew and row groups come from one union over the nodes in order: their
 *     members share one iteration shape and one compute type (all f64 or
 *     all f32), so fusing never changes the precision an op computes in;
 *     a column sum of a row group's member joins it there (take_colsum)
 *     and leaves it open, so the cast of dx to f16/bf16 for the next
 *     GEMM, after dx's sum for the bias gradient, still joins: the row
 *     kernel stores dx's cast;
 *   - gemm groups are a matmul or a forward convolution and the
 *     single-reader chain after it that a cuBLASLt epilogue computes
 *     (formed first, off limits to the union);
 *   - row groups of one shape that read a tensor row by row are then
 *     joined (fuse_siblings.c): layer_norm's backward reads x and dy once;
 *     and a reduce_sum over the rows of a value of a row group joins it as
 *     a column sum (fuse_colsum.c): dgamma and dbeta in the same pass;
 *     then siblings once more (those kept apart by such sums);
 *   - multi groups join found_inf with the unscale chains it reads (and
 *     the gradient norm's sum_squares over them, moved next to it first:
 *     fuse_norm.c), and merge the update groups of all parameters that compute alike; the
 *     forward's parameter casts, moved to the front of the graph first,
 *     are one more (fuse_casts.c);
 * and every group can run at the position of its last member: every
 * consumer of a member that is not itself a member comes after the group's
 * last member. Then every value a member reads from outside the group is
 * ready there too (see the argument at `legal_merge`), and no path leaves
 * the group and comes back.
 * Nothing else is recorded: members, kind, position and which members must
 * be stored (those read outside the group, outputs, updates, the loss,
 * fetches) follow from `group` and the graph; docs/fusion.md has the rules
 * and the numerics contract. The no_fuse option (ALLOY_NO_FUSE) =all forms no group; =row,gemm,multi
 * (any of them) forms no groups of those kinds.
 */
#include <stdlib.h>
#include <string.h>

#include "ir/groups.h"
#include "passes/pass.h"

/* ---- GEMM epilogues ---- */

/* readers[i]: how many nodes read node i, plus one if it is an output, an
 * update or the loss (such a value is stored, which an epilogue
 * intermediate cannot be); sole[i]: its reader when that is the only one,
 * else -1. */
static void count_readers(const ir_graph *g, int *readers, int *sole)
{
    for (int i = 0; i < g->nnodes; i++) readers[i] = 0, sole[i] = -1;
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++) {
            int o = g->nodes[i]->in[j];
            if (sole[o] != i) readers[o]++; /* add(x, x) reads x once */
            sole[o] = i;
        }
    for (int i = 0; i < g->noutputs; i++) readers[g->outputs[i].node]++;
    for (int i = 0; i < g->nupdates; i++) readers[g->updates[i].node]++;
    if (g->loss >= 0) readers[g->loss]++;
    for (int i = 0; i < g->nnodes; i++)
        if (readers[i] != 1) sole[i] = -1;
}

/* row_readers[i]: how many operands of later nodes read node i when every
 * one of them is a row operand of a row op (cross_entropy's logits and its
 * gradient's), else -1; one sweep over the edges, so that gemm_epilogue
 * asks it of any number of matmuls in constant time. */
static void count_row_readers(const ir_graph *g, int *row_readers)
{
    for (int i = 0; i < g->nnodes; i++) row_readers[i] = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const ir_node *n = g->nodes[i];
        for (int j = 0; j < n->nin; j++) {
            int *r = &row_readers[n->in[j]];
            if (*r >= 0) *r = ir_fuse_row_op(g, n) && ir_row_operand(n, j) ? *r + 1 : -1;
        }
    }
}

/* A bias for the epilogue of a matmul's [.., N] result: a vector of N (or
 * [1, .., 1, N]). */
static bool is_bias(const ir_type *b, const ir_type *out)
{
    if (b->rank < 1 || b->rank > out->rank || b->dims[b->rank - 1] != out->dims[out->rank - 1]) return false;
    for (int d = 0; d + 1 < b->rank; d++)
        if (b->dims[d] != 1) return false;
    return ir_is_float(b->dtype) && b->dtype != ALLOY_F64;
}

/* A bias for the epilogue of a convolution's [N, C, spatial..] result: one
 * value per output channel broadcast over the batch and the spatial dims,
 * that is C at the channel dim and 1 everywhere else once broadcast:
 * [C, 1, 1] or [1, C, 1, 1] for conv2d, [C, 1] or [1, C, 1] for conv1d
 * (the shapes a reshaped vector of C takes; a bare [C] would broadcast over
 * the last spatial dim instead). */
static bool is_channel_bias(const ir_type *b, const ir_type *out)
{
    if (b->rank < out->rank - 1 || b->rank > out->rank) return false;
    for (int d = 0; d < b->rank; d++) {
        int od = d + out->rank - b->rank; /* the result's dim b's dim d broadcasts against */
        if (b->dims[d] != (od == 1 ? out->dims[1] : 1)) return false;
    }
    return ir_is_float(b->dtype) && b->dtype != ALLOY_F64;
}

/* Marks GEMM head mm (a matmul, conv1d or conv2d) and the epilogue after
 * it as one GEMM group in gemm[]: in this order, each optional and each the
 * sole reader of the one before, [cast] [add of a bias vector] [relu |
 * gelu_tanh] [cast], the set a cuBLASLt epilogue computes (its GELU is the
 * tanh form; erf GELU is not an epilogue). A matmul's bias is a vector
 * over its last dim, a convolution's one over its channels (its own bias
 * operand, if any, is part of its product). Casts are between f16, bf16
 * and f32. A final cast that only row ops read is left to their row group. */
/* The activation (relu or gelu_tanh) reading node cur when cur has more
 * readers than that (in a training step, the activation's gradient reads
 * its input too), or -1: cuBLASLt's RELU_AUX / GELU_AUX epilogues store
 * the activation's input as an auxiliary output for the backward, so the
 * epilogue goes on through the activation and cur is stored. readers of
 * node i: rlist[rstart[i] .. rstart[i + 1]). */
static int aux_activation(const ir_graph *g, const int *rstart, const int *rlist, int cur)
{
    int act = -1;
    for (int k = rstart[cur]; k < rstart[cur + 1]; k++) {
        const ir_node *r = g->nodes[rlist[k]];
        if ((r->op == IR_OP_relu || r->op == IR_OP_gelu_tanh) && r->in[0] == cur) {
            if (act >= 0 && act != r->id) return -1; /* two activations: no epilogue takes both */
            act = r->id;
        }
    }
    return act;
}

static void gemm_epilogue(const ir_graph *g, const int *sole, const int *row_readers, const int *rstart,
                          const int *rlist, int mm, int *gemm)
{
    const ir_node *m = g->nodes[mm];
    bool conv = m->op != IR_OP_matmul;
    if (!ir_is_float(m->type.dtype) || m->type.dtype == ALLOY_F64 || m->type.rank < 2) return;
    int cur = mm, stage = 0, chain[5], len = 0, aux = -1; /* aux: the chain member stored for the backward */
    for (;;) {
        int r = sole[cur];
        if (r < 0 && aux < 0 && stage < 3 && cur != mm && (r = aux_activation(g, rstart, rlist, cur)) >= 0)
            aux = cur;
        if (r < 0) break;
        const ir_node *n = g->nodes[r];
        int next = -1;
        if (n->op == IR_OP_cast && ir_fuse_elementwise(g, n) && (stage == 0 || stage >= 2) && stage < 4)
            next = stage == 0 ? 1 : 4;
        else if (n->op == IR_OP_add && stage < 2) {
            int other = n->in[0] == cur ? n->in[1] : n->in[0];
            const ir_type *bt = &g->nodes[other]->type;
            if (other != cur && (conv ? is_channel_bias(bt, &n->type) : is_bias(bt, &n->type)) &&
                g->nodes[other]->type.dtype == n->type.dtype && ir_type_eq(&n->type, &g->nodes[cur]->type))
                next = 2;
        } else if ((n->op == IR_OP_relu || n->op == IR_OP_gelu_tanh) && stage < 3) {
            next = 3;
        }
        if (next < 0) break;
        chain[len++] = r;
        cur = r;
        stage = next;
        if (stage == 4) break;
        /* an f16/bf16 product widened to f32 keeps its dtype's range (the range rule), which no library
         * epilogue applies: what follows the widening joins its readers' groups, which apply the rule
         * as they load it (sched_mark_ranged_reads), and the library writes the f32 sum */
        if (stage == 1 && !conv && (m->type.dtype == ALLOY_F16 || m->type.dtype == ALLOY_BF16) &&
            n->type.dtype == ALLOY_F32)
            break;
    }
    /* a final cast read by row ops only (the logits' cast read by
     * cross_entropy and its gradient) is left to their row group, which
     * then takes both of them: the f32 copy is never stored */
    if (len > 0 && g->nodes[chain[len - 1]]->op == IR_OP_cast && sole[chain[len - 1]] < 0 &&
        row_readers[chain[len - 1]] > 1)
        len--;
    /* an aux member's other readers must run after the group (its last member) */
    if (aux >= 0) {
        int at = 0;
        while (chain[at] != aux) at++;
        for (int k = rstart[aux]; k < rstart[aux + 1] && len > at + 1; k++) {
            int r = rlist[k];
            bool member = false;
            for (int i = 0; i < len; i++) member |= chain[i] == r;
            if (!member && r <= chain[len - 1]) len = at + 1; /* the epilogue ends at aux */
        }
    }
    if (len == 0) return;
    gemm[mm] = mm;
    for (int i = 0; i < len; i++) gemm[chain[i]] = mm;
}

/* Working state. Tentative groups are named by a member's id and kept as
 * member lists. For legality each group also keeps the edges that leave it
 * towards nodes already placed: an edge to a node in no group seals it
 * (sealed: it can never take another node), an edge to a grouped node is
 * listed (out_head/out_next/out_node) and checked, or dropped once both
 * ends share a group. So a placement costs about the edges it looks at,
 * not the size of the groups. */
typedef struct fuser {
    const ir_graph *g;
    const int *gemm; /* node -> GEMM epilogue group (named by its matmul), -1 none */
    bool no_row;     /* no_fuse=row: row ops join no group */
    int *grp;      /* node -> tentative group, -1 none */
    int *next;     /* next member of the same group, -1 at the tail */
    int *head;     /* group -> first member */
    int *tail;
    int *size;     /* members but column sums */
    int *colsums;  /* group -> column sums it holds (take_colsum) */
    uint8_t *row;  /* group -> it has a row op */
    uint8_t *sealed;
    int *out_head; /* group -> first listed outgoing edge, -1 none */
    int *out_tail;
    int *out_next; /* edge pool: next edge of the same group's list */
    int *out_node; /* the placed node the edge goes to */
    int nedges;
} fuser;

/* Which nodes the elementwise/row grouping (the union) may take: an
 * elementwise member (EW ops, casts between f16/bf16/f32) or a row op
 * (unless ALLOY_NO_FUSE=row), not already in a GEMM epilogue group. */
static bool fusible(const fuser *f, const ir_node *n)
{
    if (f->gemm[n->id] >= 0) return false;
    return ir_fuse_elementwise(f->g, n) || (!f->no_row && ir_fuse_row_op(f->g, n));
}

static bool in_set(int x, const int *set, int k)
{
    for (int i = 0; i < k; i++)
        if (set[i] == x) return true;
    return false;
}

/* Whether n and the groups cand[0..k) may become one group running at n
 * (the last member, as every member so far has a smaller id). The group
 * runs at n, so each of its values must be read, outside it, only after n:
 * a consumer c < n outside the merge would run (alone, or with its own
 * group, whose last member is < n too) before the value exists. Consumers
 * after n run after the group whatever group they later join, as groups
 * only grow by later nodes and so only move later. Operands from outside
 * are computed before n: they precede their consumer in the topological
 * order, and a group of theirs has its last member < n, and stays before n
 * because that group can never take a node beyond n without this same test
 * failing on the edge into the merge. So the test is all there is: no
 * candidate is sealed, and every listed edge of a candidate ends in the
 * merge. Edges that have become internal are unlinked on the way; a failing
 * edge moves to the front, where the next test meets it first. */
static bool legal_merge(fuser *f, const int *cand, int k)
{
    int colsums = 0;
    for (int i = 0; i < k; i++) colsums += f->colsums[cand[i]];
    if (colsums > IR_MAX_COLSUMS) return false;
    for (int i = 0; i < k; i++) {
        int gi = cand[i];
        if (f->sealed[gi]) return false;
        int prev = -1;
        for (int e = f->out_head[gi]; e >= 0;) {
            int to = f->grp[f->out_node[e]], nx = f->out_next[e];
            if (to == gi || !in_set(to, cand, k)) { /* unlink e */
                if (prev < 0) f->out_head[gi] = nx;
                else f->out_next[prev] = nx;
                if (f->out_tail[gi] == e) f->out_tail[gi] = prev;
                if (to == gi) {
                    e = nx;
                    continue;
                }
                f->out_next[e] = f->out_head[gi]; /* to the front */
                f->out_head[gi] = e;
                if (f->out_tail[gi] < 0) f->out_tail[gi] = e;
                return false;
            }
            prev = e;
            e = nx;
        }
    }
    return true;
}

/* Puts n into group `into`, taking in the members and edge lists of the
 * groups cand[0..k) (`into` is the largest, so a node is relabelled
 * O(log n) times in all). */
static void merge(fuser *f, int n, int into, const int *cand, int k)
{
    for (int i = 0; i < k; i++) {
        int gi = cand[i];
        if (gi == into) continue;
        for (int m = f->head[gi]; m >= 0; m = f->next[m]) f->grp[m] = into;
        f->next[f->tail[into]] = f->head[gi];
        f->tail[into] = f->tail[gi];
        f->size[into] += f->size[gi];
        f->colsums[into] += f->colsums[gi];
        f->row[into] |= f->row[gi];
        f->head[gi] = -1;
        f->size[gi] = 0;
        if (f->out_head[gi] >= 0) {
            if (f->out_head[into] < 0) f->out_head[into] = f->out_head[gi];
            else f->out_next[f->out_tail[into]] = f->out_head[gi];
            f->out_tail[into] = f->out_tail[gi];
            f->out_head[gi] = f->out_tail[gi] = -1;
        }
    }
    f->grp[n] = into;
    f->next[f->tail[into]] = n;
    f->tail[into] = n;
    f->size[into]++;
    f->row[into] |= ir_fuse_row_op(f->g, f->g->nodes[n]);
}

/* Whether node n is a member that later steps only read: a per-row
 * statistic (ir_row_keeps) or a column sum (take_colsum). */
static bool read_later(const fuser *f, int n)
{
    const ir_node *node = f->g->nodes[n];
    return f->grp[n] >= 0 && (ir_row_keeps(node) || ir_fuse_colsum(f->g, node));
}

/* Whether node reads a member of group go that later steps only read
 * (read_later), which it then may not join. */
static bool reads_kept_of(const fuser *f, const ir_node *node, int go)
{
    for (int j = 0; j < node->nin; j++)
        if (f->grp[node->in[j]] == go && read_later(f, node->in[j])) return true;
    return false;
}

/* Decides n's group: the union of its candidate operands' groups if legal,
 * else the first candidate group it may join alone, else a group of its own. */
static void join(fuser *f, int n)
{
    const ir_graph *g = f->g;
    const ir_node *node = g->nodes[n];
    bool wide = ir_fuse_wide(g, node);
    int cand[8], k = 0;
    for (int j = 0; j < node->nin && k < 8; j++) {
        const ir_node *o = g->nodes[node->in[j]];
        int go = f->grp[o->id];
        if (ir_fuse_row_op(g, node) && !ir_row_operand(node, j)) continue; /* gamma, dloss: read whole */
        if (go < 0 || reads_kept_of(f, node, go) || !ir_same_dims(ir_fuse_shape(g, o), ir_fuse_shape(g, node)) ||
            ir_fuse_wide(g, o) != wide)
            continue;
        if (!in_set(go, cand, k)) cand[k++] = go;
    }
    if (k > 0 && legal_merge(f, cand, k)) {
        int into = cand[0];
        for (int i = 1; i < k; i++)
            if (f->size[cand[i]] > f->size[into]) into = cand[i];
        merge(f, n, into, cand, k);
        return;
    }
    for (int i = 0; k > 1 && i < k; i++) {
        if (legal_merge(f, &cand[i], 1)) {
            merge(f, n, cand[i], &cand[i], 1);
            return;
        }
    }
    f->grp[n] = n; /* a new group, named by its first member */
    f->head[n] = f->tail[n] = n;
    f->size[n] = 1;
    f->row[n] = ir_fuse_row_op(g, node);
}

/* Column sum n (ir_fuse_colsum) joins the row group of its operand when
 * that group iterates over the operand's shape, holds fewer than
 * IR_MAX_COLSUMS sums, and nothing outside it has read a member yet
 * (legal_merge: the sum is computed at the group's last member, so a
 * reader before n would run before the sums' rows are in). It is then no
 * reason to close the group: a later node reading a member may still join
 * (the layer norm backward's dx, cast to f16 for the next GEMM after the
 * sums of its rows: the row kernel stores the cast). Its own readers seal
 * the group (place), so no member reads it and every reader comes after
 * the group's last member. Only a sum that a later member needs keeps its
 * place after the union; the others go back to no group, where
 * fuse_colsum.c takes them as it takes sums of groups formed later. */
static bool take_colsum(fuser *f, int n)
{
    const ir_graph *g = f->g;
    int o = g->nodes[n]->in[0], go = f->grp[o];
    if (go < 0 || !f->row[go] || f->colsums[go] >= IR_MAX_COLSUMS || read_later(f, o) ||
        !ir_same_dims(ir_fuse_shape(g, g->nodes[o]), &g->nodes[o]->type) || !legal_merge(f, &go, 1))
        return false;
    f->grp[n] = go;
    f->next[f->tail[go]] = n;
    f->tail[go] = n;
    f->colsums[go]++;
    return true;
}

/* Places node n (fusible or not) and records the edges from its operands'
 * groups to it. */
static void place(fuser *f, int n)
{
    const ir_node *node = f->g->nodes[n];
    if (fusible(f, node)) join(f, n);
    else if (!f->no_row && ir_fuse_colsum(f->g, node)) take_colsum(f, n);
    int gn = f->grp[n];
    for (int j = 0; j < node->nin; j++) {
        int go = f->grp[node->in[j]];
        if (go < 0 || go == gn) continue;
        if (gn < 0 || ir_fuse_colsum(f->g, f->g->nodes[node->in[j]])) { /* a column sum's reader: no more members */
            f->sealed[go] = 1;
            continue;
        }
        bool listed = false; /* two operands from one group: one edge is enough */
        for (int i = 0; i < j; i++) listed |= f->grp[node->in[i]] == go;
        if (listed) continue;
        int e = f->nedges++;
        f->out_node[e] = n;
        f->out_next[e] = -1;
        if (f->out_head[go] < 0) f->out_head[go] = e;
        else f->out_next[f->out_tail[go]] = e;
        f->out_tail[go] = e;
    }
}

alloy_status pass_fuse(ir_graph **gp, const pass_options *opts)
{
    (void)opts;
    ir_graph *g = *gp;
    for (int i = 0; i < g->nnodes; i++) g->nodes[i]->group = -1;
    unsigned off = pass_cfg(opts)->no_fuse; /* OPT_NO_FUSE_ALL, or 1 << kind per kind off */
    if ((off & 1) || g->nnodes == 0) return ALLOY_OK;
    if (!(off & 1u << IR_GROUP_MULTI)) { /* the parameter casts first, as one launch (fuse_casts.c); the
                                             * gradient norm next to found_inf (fuse_norm.c) */
        alloy_status st = fuse_hoist_param_casts(gp);
        if (!st) st = fuse_hoist_sum_squares(gp);
        if (st) return st;
        g = *gp;
    }
    size_t nn = (size_t)g->nnodes, edges = 1;
    for (int i = 0; i < g->nnodes; i++) edges += (size_t)g->nodes[i]->nin;
    int *gemm = al_malloc(sizeof(int) * nn), *row_readers = al_malloc(sizeof(int) * nn);
    int *rstart = al_malloc(sizeof(int) * (nn + 1)), *rlist = al_malloc(sizeof(int) * edges);
    fuser f = {.g = g, .gemm = gemm, .no_row = off & 1u << IR_GROUP_ROW};
    int **per_node[] = {&f.grp, &f.next, &f.head, &f.tail, &f.size, &f.colsums, &f.out_head, &f.out_tail};
    bool ok = true;
    for (size_t a = 0; a < sizeof per_node / sizeof per_node[0]; a++) {
        *per_node[a] = al_malloc(sizeof(int) * nn);
        ok &= *per_node[a] != NULL;
    }
    f.out_next = al_malloc(sizeof(int) * edges);
    f.out_node = al_malloc(sizeof(int) * edges);
    f.sealed = al_calloc(nn, 1);
    f.row = al_calloc(nn, 1);
    ok &= f.out_next && f.out_node && f.sealed && f.row && gemm && row_readers && rstart && rlist;
    if (ok) {
        for (size_t i = 0; i < nn; i++) {
            f.grp[i] = f.next[i] = f.head[i] = f.tail[i] = f.out_head[i] = f.out_tail[i] = -1;
            f.size[i] = f.colsums[i] = 0;
        }
        /* GEMM epilogues first; the union below treats their members as
         * nodes it may not take (they run at their group's last member,
         * which reads nothing the union could delay) */
        int *readers = f.out_head, *sole = f.out_tail; /* borrowed, reset below */
        count_readers(g, readers, sole);
        count_row_readers(g, row_readers);
        /* readers by node, ascending (the aux epilogues, the sibling rule), by counting */
        for (int i = 0; i <= g->nnodes; i++) rstart[i] = 0;
        for (int i = 0; i < g->nnodes; i++)
            for (int j = 0; j < g->nodes[i]->nin; j++) rstart[g->nodes[i]->in[j] + 1]++;
        for (int i = 0; i < g->nnodes; i++) rstart[i + 1] += rstart[i];
        for (int i = 0; i < g->nnodes; i++) f.size[i] = rstart[i]; /* borrowed as fill pointers */
        for (int i = 0; i < g->nnodes; i++)
            for (int j = 0; j < g->nodes[i]->nin; j++) rlist[f.size[g->nodes[i]->in[j]]++] = i;
        for (int i = 0; i < g->nnodes; i++) f.size[i] = 0;
        for (int i = 0; i < g->nnodes; i++) gemm[i] = -1;
        for (int i = 0; i < g->nnodes; i++)
            if (ir_gemm_head(g->nodes[i]) && !(off & 1u << IR_GROUP_GEMM))
                gemm_epilogue(g, sole, row_readers, rstart, rlist, i, gemm);
        for (size_t i = 0; i < nn; i++) f.out_head[i] = f.out_tail[i] = -1;
        for (int i = 0; i < g->nnodes; i++) place(&f, i);
        /* names: the union's groups of two or more, the GEMM groups (named
         * by their head, never a union member), then the multi-tensor
         * groups; min_reader (in f.head, no longer needed) for found_inf.
         * A column sum the union took stays only where a later member
         * needs it there (take_colsum); last (in f.out_tail): each group's
         * last member that is no column sum */
        int *label = f.next, *min_reader = f.head, *last = f.out_tail;
        memset(f.sealed, 0, nn);
        for (int i = 0; i < g->nnodes; i++)
            if (f.grp[i] >= 0 && !ir_fuse_colsum(g, g->nodes[i])) last[f.grp[i]] = i;
        for (int i = 0; i < g->nnodes; i++) {
            int gi = f.grp[i];
            label[i] = gemm[i] >= 0 ? gemm[i] : gi >= 0 && f.size[gi] >= 2 ? gi : -1;
            if (label[i] >= 0 && ir_fuse_colsum(g, g->nodes[i]) && last[gi] < i) label[i] = -1;
            min_reader[i] = g->nnodes;
        }
        /* row groups that read the same tensor row by row: one group */
        if (!(off & 1u << IR_GROUP_ROW)) ok = fuse_row_siblings(g, label, rstart, rlist);
        /* and the sums over their rows (a layer_norm's dgamma, dbeta); then
         * siblings once more: the sums a sibling union would have run after
         * are members now (the test block's ln2: dx with dbeta, and the
         * dgamma product with its sum, become one) */
        if (!(off & 1u << IR_GROUP_ROW))
            ok = ok && fuse_row_colsums(g, label, rstart, rlist) && fuse_row_siblings(g, label, rstart, rlist);
        for (int i = g->nnodes - 1; i >= 0; i--)
            for (int j = 0; j < g->nodes[i]->nin; j++) min_reader[g->nodes[i]->in[j]] = i;
        for (int i = 0; i < g->nnodes; i++)
            if (ok && g->nodes[i]->op == IR_OP_found_inf && !(off & 1u << IR_GROUP_MULTI))
                ok = fuse_multi_found_inf(g, i, min_reader, label, f.sealed);
        ok = ok && ((off & 1u << IR_GROUP_MULTI) || fuse_multi_updates(g, label));
        if (ok && !(off & 1u << IR_GROUP_MULTI)) fuse_group_param_casts(g, label);
        /* number the groups in the order of their first member */
        for (size_t i = 0; i < nn; i++) f.tail[i] = -1;
        int ngroups = 0;
        for (int i = 0; i < g->nnodes && ok; i++) {
            int gi = label[i];
            if (gi < 0) continue;
            if (f.tail[gi] < 0) f.tail[gi] = ngroups++;
            g->nodes[i]->group = f.tail[gi];
        }
    }
    for (size_t a = 0; a < sizeof per_node / sizeof per_node[0]; a++) al_free(*per_node[a]);
    al_free(f.out_next), al_free(f.out_node), al_free(f.sealed), al_free(f.row), al_free(gemm), al_free(row_readers);
    al_free(rstart), al_free(rlist);
    if (!ok) return ir_error(g, ALLOY_ERR_OOM, "fuse: out of memory for %d nodes", g->nnodes);
    return ALLOY_OK;
}
