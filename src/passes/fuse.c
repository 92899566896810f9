/* fuse.c - fusion groups: chains of elementwise nodes that run as one pass over memory.
 *
 * After this pass every node's `group` is -1 or a group id in [0, ngroups),
 * numbered in the order of each group's first member, and every group
 *   - has at least two members, all elementwise ops (ir_ops[].elementwise)
 *     with the same result shape (the group's iteration shape) and the same
 *     compute type (all f64 or all f32, by cpu_ew_uses_f64's rule), so
 *     fusing never changes the precision an op computes in;
 *   - can run at the position of its last member: every consumer of a member
 *     that is not itself a member comes after the group's last member. Then
 *     every value a member reads from outside the group is ready there too
 *     (see the argument at `legal_merge`), and no path leaves the group and
 *     comes back.
 * Nothing else is recorded: members, the position and which members must be
 * stored (those read outside the group, outputs, updates, the loss, fetches)
 * follow from `group` and the graph; docs/fusion.md has the numerics contract.
 * ALLOY_NO_FUSE=1 (any value but "" or "0") clears every group instead.
 */
#include <stdlib.h>
#include <string.h>

#include "passes/pass.h"

/* A node that may join a group: any elementwise op (ops.def's EW lines have
 * at most three operands; the bound is checked all the same). */
static bool fusible(const ir_node *n) { return ir_ops[n->op].elementwise && n->nin <= 3; }

/* The compute type rule of cpu_ew_uses_f64, read from the operands' IR types. */
static bool computes_wide(const ir_graph *g, const ir_node *n)
{
    for (int j = 0; j < n->nin; j++) {
        alloy_dtype dt = g->nodes[n->in[j]]->type.dtype;
        if (dt == ALLOY_F64 || dt == ALLOY_I32 || dt == ALLOY_I64) return true;
    }
    return false;
}

static bool same_shape(const ir_type *a, const ir_type *b)
{
    if (a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d]) return false;
    return true;
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
    int *grp;      /* node -> tentative group, -1 none */
    int *next;     /* next member of the same group, -1 at the tail */
    int *head;     /* group -> first member */
    int *tail;
    int *size;
    uint8_t *sealed;
    int *out_head; /* group -> first listed outgoing edge, -1 none */
    int *out_tail;
    int *out_next; /* edge pool: next edge of the same group's list */
    int *out_node; /* the placed node the edge goes to */
    int nedges;
} fuser;

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
}

/* Decides n's group: the union of its candidate operands' groups if legal,
 * else the first candidate group it may join alone, else a group of its own. */
static void join(fuser *f, int n)
{
    const ir_graph *g = f->g;
    const ir_node *node = g->nodes[n];
    bool wide = computes_wide(g, node);
    int cand[3], k = 0;
    for (int j = 0; j < node->nin; j++) {
        const ir_node *o = g->nodes[node->in[j]];
        int go = f->grp[o->id];
        if (go < 0 || !same_shape(&o->type, &node->type) || computes_wide(g, o) != wide) continue;
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
}

/* Places node n (fusible or not) and records the edges from its operands'
 * groups to it. */
static void place(fuser *f, int n)
{
    const ir_node *node = f->g->nodes[n];
    if (fusible(node)) join(f, n);
    int gn = f->grp[n];
    for (int j = 0; j < node->nin; j++) {
        int go = f->grp[node->in[j]];
        if (go < 0 || go == gn) continue;
        if (gn < 0) {
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

static bool fusion_disabled(void)
{
    const char *env = getenv("ALLOY_NO_FUSE");
    return env && *env && strcmp(env, "0") != 0;
}

alloy_status pass_fuse(ir_graph **gp, const pass_options *opts)
{
    (void)opts;
    ir_graph *g = *gp;
    for (int i = 0; i < g->nnodes; i++) g->nodes[i]->group = -1;
    if (fusion_disabled() || g->nnodes == 0) return ALLOY_OK;
    size_t nn = (size_t)g->nnodes, edges = 1;
    for (int i = 0; i < g->nnodes; i++) edges += (size_t)g->nodes[i]->nin;
    fuser f = {.g = g};
    int **per_node[] = {&f.grp, &f.next, &f.head, &f.tail, &f.size, &f.out_head, &f.out_tail};
    bool ok = true;
    for (size_t a = 0; a < sizeof per_node / sizeof per_node[0]; a++) {
        *per_node[a] = al_malloc(sizeof(int) * nn);
        ok &= *per_node[a] != NULL;
    }
    f.out_next = al_malloc(sizeof(int) * edges);
    f.out_node = al_malloc(sizeof(int) * edges);
    f.sealed = al_calloc(nn, 1);
    ok &= f.out_next && f.out_node && f.sealed;
    if (ok) {
        for (size_t i = 0; i < nn; i++) {
            f.grp[i] = f.next[i] = f.head[i] = f.tail[i] = f.out_head[i] = f.out_tail[i] = -1;
            f.size[i] = 0;
        }
        for (int i = 0; i < g->nnodes; i++) place(&f, i);
        /* number the groups of two or more in the order of their first
         * member (member lists are not sorted; `tail` now holds the number) */
        for (size_t i = 0; i < nn; i++) f.tail[i] = -1;
        int ngroups = 0;
        for (int i = 0; i < g->nnodes; i++) {
            int gi = f.grp[i];
            if (gi < 0 || f.size[gi] < 2) continue;
            if (f.tail[gi] < 0) f.tail[gi] = ngroups++;
            g->nodes[i]->group = f.tail[gi];
        }
    }
    for (size_t a = 0; a < sizeof per_node / sizeof per_node[0]; a++) al_free(*per_node[a]);
    al_free(f.out_next), al_free(f.out_node), al_free(f.sealed);
    if (!ok) return ir_error(g, ALLOY_ERR_OOM, "fuse: out of memory for %d nodes", g->nnodes);
    return ALLOY_OK;
}
