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

/* Working state: tentative groups as member lists, consumers as CSR. */
typedef struct fuser {
    const ir_graph *g;
    int *grp;      /* node -> tentative group (the id of a member), -1 none */
    int *next;     /* next member of the same group, -1 at the tail */
    int *head;     /* group -> first member (indexed by group id) */
    int *tail;
    int *size;
    int *use_start; /* consumers of node i: use[use_start[i] .. use_start[i+1]) */
    int *use;
} fuser;

/* True when node c is node n or a member of one of the groups in cand[0..k). */
static bool in_merge(const fuser *f, int c, int n, const int *cand, int k)
{
    if (c == n) return true;
    for (int i = 0; i < k; i++)
        if (f->grp[c] == cand[i]) return true;
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
 * failing on the edge into the merge. So the test is all there is. */
static bool legal_merge(const fuser *f, int n, const int *cand, int k)
{
    for (int i = 0; i < k; i++)
        for (int m = f->head[cand[i]]; m >= 0; m = f->next[m])
            for (int u = f->use_start[m]; u < f->use_start[m + 1]; u++) {
                int c = f->use[u];
                if (c < n && !in_merge(f, c, n, cand, k)) return false;
            }
    return true;
}

/* Puts n into group `into`, appending the members of groups cand[0..k) too. */
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
    }
    f->grp[n] = into;
    f->next[f->tail[into]] = n;
    f->tail[into] = n;
    f->size[into]++;
}

/* Decides n's group: the union of its candidate operands' groups if legal,
 * else the first candidate group it may join alone, else a group of its own. */
static void place(fuser *f, int n)
{
    const ir_graph *g = f->g;
    const ir_node *node = g->nodes[n];
    bool wide = computes_wide(g, node);
    int cand[3], k = 0;
    for (int j = 0; j < node->nin; j++) {
        const ir_node *o = g->nodes[node->in[j]];
        int go = f->grp[o->id];
        if (go < 0 || !same_shape(&o->type, &node->type) || computes_wide(g, o) != wide) continue;
        bool seen = false;
        for (int i = 0; i < k; i++) seen |= cand[i] == go;
        if (!seen) cand[k++] = go;
    }
    if (k > 0 && legal_merge(f, n, cand, k)) {
        int into = cand[0];
        for (int i = 1; i < k; i++)
            if (f->size[cand[i]] > f->size[into]) into = cand[i];
        merge(f, n, into, cand, k);
        return;
    }
    for (int i = 0; k > 1 && i < k; i++) {
        if (legal_merge(f, n, &cand[i], 1)) {
            merge(f, n, cand[i], &cand[i], 1);
            return;
        }
    }
    f->grp[n] = n; /* a new group, named by its first member */
    f->head[n] = f->tail[n] = n;
    f->size[n] = 1;
}

/* Builds consumer lists (CSR) for every node. */
static bool build_uses(fuser *f)
{
    const ir_graph *g = f->g;
    size_t nn = (size_t)g->nnodes;
    f->use_start = al_calloc(nn + 2, sizeof(int));
    if (!f->use_start) return false;
    int edges = 0;
    for (int i = 0; i < g->nnodes; i++) {
        edges += g->nodes[i]->nin;
        for (int j = 0; j < g->nodes[i]->nin; j++) f->use_start[g->nodes[i]->in[j] + 2]++;
    }
    for (size_t i = 2; i < nn + 2; i++) f->use_start[i] += f->use_start[i - 1];
    f->use = al_malloc(sizeof(int) * (size_t)(edges ? edges : 1));
    if (!f->use) return false;
    /* use_start[i + 1] is the fill cursor of node i; it ends at i's end */
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i]->nin; j++) {
            int o = g->nodes[i]->in[j];
            f->use[f->use_start[o + 1]++] = i;
        }
    return true;
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
    size_t nn = (size_t)g->nnodes;
    fuser f = {.g = g};
    f.grp = al_malloc(sizeof(int) * nn);
    f.next = al_malloc(sizeof(int) * nn);
    f.head = al_malloc(sizeof(int) * nn);
    f.tail = al_malloc(sizeof(int) * nn);
    f.size = al_calloc(nn, sizeof(int));
    bool ok = f.grp && f.next && f.head && f.tail && f.size && build_uses(&f);
    if (ok) {
        for (size_t i = 0; i < nn; i++) f.grp[i] = f.next[i] = f.head[i] = f.tail[i] = -1;
        for (int i = 0; i < g->nnodes; i++)
            if (fusible(g->nodes[i])) place(&f, i);
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
    al_free(f.grp), al_free(f.next), al_free(f.head), al_free(f.tail), al_free(f.size);
    al_free(f.use_start), al_free(f.use);
    if (!ok) return ir_error(g, ALLOY_ERR_OOM, "fuse: out of memory for %d nodes", g->nnodes);
    return ALLOY_OK;
}
