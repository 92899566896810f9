/* fuse_siblings.c - the sibling rule of the fuse pass: row groups (or lone row ops) of one iteration shape that read the same tensor row by row become one group, so that tensor is read once.
 *
 * The union in fuse.c joins nodes only along edges, so two row ops that read
 * the same stored tensors and nothing else in common stay apart. The case
 * that matters is layer_norm's backward: `layer_norm_grad(x, dy, gamma)`
 * (dx) and `mul(dy, layer_norm(x))` (the product summed into dgamma) both
 * read x and dy, twice over the largest activations of a transformer's
 * backward. As one group they are one pass: each block of rows loads x and
 * dy once and writes both results.
 *
 * Legality is the rule of every group (docs/fusion.md): the merged group
 * runs at its last member, so every node outside it that reads a member
 * must come after that. Checked on the union before it is made, by walking
 * the readers of both sides' members. pass_fuse calls it a second time
 * after the column sums joined (fuse_colsum.c): a sum that kept two
 * siblings apart may now be a member of one, and the union then also keeps
 * the column sums' own rule (at most IR_MAX_COLSUMS, none read inside).
 */
#include <string.h>

#include "ir/groups.h"
#include "passes/pass.h"

/* At most this many groups read one tensor and are tried against each other
 * (bounds the pass on a tensor that thousands of row ops read). */
enum { MAX_SIBLINGS = 32 };

typedef struct siblings {
    const ir_graph *g;
    int *label;                    /* node -> group name, -1 none (fuse.c's) */
    const int *rstart, *rlist;     /* readers of node i: rlist[rstart[i] .. rstart[i + 1]), ascending */
    int *first, *next, *last;      /* group name -> first member, member -> next (-1 at the end), name -> last id */
    const ir_type **shape;         /* group name -> the iteration shape of its row ops; NULL: not a row group */
} siblings;

static bool same_dims(const ir_type *a, const ir_type *b)
{
    if (a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d]) return false;
    return true;
}

/* Whether groups a and b may become one: every reader of a member from
 * outside both comes after the later of their last members; and, for the
 * column sums they hold (the second call, fuse_colsum.c), no member of
 * either reads one and there are at most IR_MAX_COLSUMS. */
static bool legal_union(const siblings *s, int a, int b)
{
    int last = s->last[a] > s->last[b] ? s->last[a] : s->last[b], colsums = 0;
    for (int side = 0; side < 2; side++)
        for (int m = s->first[side ? b : a]; m >= 0; m = s->next[m]) {
            bool colsum = ir_fuse_colsum(s->g, s->g->nodes[m]);
            if (colsum && ++colsums > IR_MAX_COLSUMS) return false;
            for (int k = s->rstart[m]; k < s->rstart[m + 1]; k++) {
                int r = s->rlist[k], lr = s->label[r];
                if ((lr == a || lr == b) && lr >= 0) {
                    if (colsum) return false;
                    continue;
                }
                if (r <= last) return false;
            }
        }
    return true;
}

/* Makes b's members a's. */
static void take(siblings *s, int a, int b)
{
    int tail = s->first[a];
    while (s->next[tail] >= 0) tail = s->next[tail];
    s->next[tail] = s->first[b];
    for (int m = s->first[b]; m >= 0; m = s->next[m]) s->label[m] = a;
    if (s->last[b] > s->last[a]) s->last[a] = s->last[b];
    s->first[b] = -1, s->shape[b] = NULL;
}

bool fuse_row_siblings(const ir_graph *g, int *label, const int *rstart, const int *rlist)
{
    int nn = g->nnodes;
    siblings s = {.g = g, .label = label, .rstart = rstart, .rlist = rlist};
    s.first = al_malloc(sizeof(int) * (size_t)nn);
    s.next = al_malloc(sizeof(int) * (size_t)nn);
    s.last = al_malloc(sizeof(int) * (size_t)nn);
    s.shape = al_calloc((size_t)nn, sizeof *s.shape);
    int cand[MAX_SIBLINGS];
    bool ok = s.first && s.next && s.last && s.shape;
    if (ok) {
        /* the groups (a lone row op is one of its own, named by itself) and
         * their member lists in id order */
        for (int i = 0; i < nn; i++) s.first[i] = -1, s.last[i] = -1;
        uint8_t *named = (uint8_t *)s.shape; /* borrowed: which names fuse.c's groups use */
        for (int i = 0; i < nn; i++)
            if (label[i] >= 0) named[label[i]] = 1;
        for (int i = 0; i < nn; i++)
            if (label[i] < 0 && !named[i] && ir_fuse_row_op(g, g->nodes[i])) label[i] = i;
        memset(s.shape, 0, sizeof *s.shape * (size_t)nn);
        for (int i = nn - 1; i >= 0; i--) {
            int name = label[i];
            if (name < 0) continue;
            s.next[i] = s.first[name], s.first[name] = i;
            if (s.last[name] < 0) s.last[name] = i;
            if (ir_fuse_row_op(g, g->nodes[i])) s.shape[name] = ir_fuse_shape(g, g->nodes[i]);
        }
        /* per tensor p, the row groups reading it row by row, in order,
         * each joined to the first one it legally can */
        for (int p = 0; p < nn; p++) {
            int k = 0;
            for (int e = s.rstart[p]; e < s.rstart[p + 1] && k < MAX_SIBLINGS; e++) {
                const ir_node *r = g->nodes[s.rlist[e]];
                int name = label[r->id];
                if (name < 0 || !s.shape[name] || label[p] == name || !ir_fuse_row_op(g, r)) continue;
                bool row_read = false;
                for (int j = 0; j < r->nin; j++) row_read |= r->in[j] == p && ir_row_operand(r, j);
                bool seen = false;
                for (int c = 0; c < k; c++) seen |= cand[c] == name;
                if (row_read && !seen) cand[k++] = name;
            }
            for (int b = 1; b < k; b++)
                for (int a = 0; a < b; a++) {
                    if (s.first[cand[a]] < 0 || s.first[cand[b]] < 0) continue; /* already taken */
                    if (!same_dims(s.shape[cand[a]], s.shape[cand[b]]) || !legal_union(&s, cand[a], cand[b]))
                        continue;
                    take(&s, cand[a], cand[b]);
                    break;
                }
        }
        /* lone row ops that found no sibling go back to no group */
        for (int i = 0; i < nn; i++)
            if (label[i] == i && s.first[i] == i && s.next[i] < 0) label[i] = -1;
    }
    al_free(s.first), al_free(s.next), al_free(s.last), al_free(s.shape);
    return ok;
}
