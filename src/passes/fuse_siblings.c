/* fuse_siblings.c - the sibling rule of the fuse pass: row groups (or lone row ops) of one iteration shape that read the same tensor row by row become one group, so that tensor is read once; an elementwise group of that shape reading the tensor whole joins them too.
 *
 * The union in fuse.c joins nodes only along edges, so two row ops that read
 * the same stored tensors and nothing else in common stay apart. The case
 * that matters is layer_norm's backward: `layer_norm_grad_stats(x, dy, mean,
 * rstd, gamma)` (dx) and `mul(dy, mul(sub(x, mean), rstd))` (the product
 * summed into dgamma, an elementwise group) both read x and dy, twice over
 * the largest activations of a transformer's backward. As one group they
 * are one pass: each block of rows loads x and dy once and writes both
 * results. In the forward, layer_norm and the statistics its gradient keeps
 * (layer_norm_mean, layer_norm_rstd) become one group the same way.
 *
 * Legality is the rule of every group (docs/fusion.md): the merged group
 * runs at its last member, so every node outside it that reads a member
 * must come after that, and no member may read a per-row statistic
 * (ir_row_keeps) of the other side. Checked on the union before it is made,
 * by walking the readers of both sides' members. pass_fuse calls it a second
 * time after the column sums joined (fuse_colsum.c): a sum that kept two
 * siblings apart may now be a member of one, and the union then also keeps
 * the column sums' own rule (at most IR_MAX_COLSUMS, none read inside).
 */

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
    const ir_type **shape;         /* group name -> its iteration shape; NULL: neither a row nor an ew group */
    uint8_t *row;                  /* group name -> it has a row op (else it is elementwise only) */
    int absorb[IR_MAX_COLSUMS];    /* legal_union: column sums in no group the union takes in */
    int nabsorb;
} siblings;

/* Whether reader r of a member, outside the union and before its last
 * member `last`, can join it as a column sum (the second call, after
 * fuse_colsum.c): a lone reduce_sum over the rows (ir_fuse_colsum) of the
 * union's shape, read only after `last`. ln2's dgamma in the test block:
 * the sum of the product's elementwise group sits before the gradient's
 * cast, which kept the two groups apart. */
static bool absorbable(const siblings *s, int r, int last, const ir_type *shape)
{
    const ir_node *n = s->g->nodes[r];
    if (s->label[r] >= 0 || !ir_fuse_colsum(s->g, n) || !ir_same_dims(ir_fuse_shape(s->g, n), shape)) return false;
    for (int k = s->rstart[r]; k < s->rstart[r + 1]; k++)
        if (s->rlist[k] <= last) return false;
    return true;
}

/* Whether groups a and b may become one: every reader of a member from
 * outside both comes after the later of their last members, or is a column
 * sum the union takes in (absorbable: s->absorb); and, for the column sums
 * they hold (the second call, fuse_colsum.c), no member of either reads one
 * and there are at most IR_MAX_COLSUMS. */
static bool legal_union(siblings *s, int a, int b)
{
    int last = s->last[a] > s->last[b] ? s->last[a] : s->last[b], colsums = 0;
    s->nabsorb = 0;
    for (int side = 0; side < 2; side++)
        for (int m = s->first[side ? b : a]; m >= 0; m = s->next[m]) {
            bool colsum = ir_fuse_colsum(s->g, s->g->nodes[m]);
            if (colsum && ++colsums > IR_MAX_COLSUMS) return false;
            for (int k = s->rstart[m]; k < s->rstart[m + 1]; k++) {
                int r = s->rlist[k], lr = s->label[r];
                if ((lr == a || lr == b) && lr >= 0) {
                    if (colsum || ir_row_keeps(s->g->nodes[m])) return false; /* read by later steps only */
                    continue;
                }
                if (r > last) continue;
                bool seen = false;
                for (int i = 0; i < s->nabsorb; i++) seen |= s->absorb[i] == r;
                if (seen) continue;
                if (!absorbable(s, r, last, s->shape[a]) || ++colsums > IR_MAX_COLSUMS) return false;
                s->absorb[s->nabsorb++] = r;
            }
        }
    return true;
}

/* Makes b's members, and the column sums legal_union found, a's. */
static void take(siblings *s, int a, int b)
{
    int tail = s->first[a];
    while (s->next[tail] >= 0) tail = s->next[tail];
    s->next[tail] = s->first[b];
    for (int m = s->first[b]; m >= 0; m = s->next[m]) s->label[m] = a, tail = m;
    for (int i = 0; i < s->nabsorb; i++) { /* each before the union's last member: last stays */
        int r = s->absorb[i];
        s->label[r] = a, s->next[r] = -1;
        s->next[tail] = r, tail = r;
    }
    if (s->last[b] > s->last[a]) s->last[a] = s->last[b];
    s->row[a] |= s->row[b];
    s->first[b] = -1, s->shape[b] = NULL;
}

void fuse_member_lists(const int *label, int nn, int *first, int *next, int *last)
{
    for (int i = 0; i < nn; i++) first[i] = last[i] = -1;
    for (int i = nn - 1; i >= 0; i--) {
        int name = label[i];
        if (name < 0) continue;
        next[i] = first[name], first[name] = i;
        if (last[name] < 0) last[name] = i;
    }
}

bool fuse_row_siblings(const ir_graph *g, int *label, const int *rstart, const int *rlist)
{
    int nn = g->nnodes;
    siblings s = {.g = g, .label = label, .rstart = rstart, .rlist = rlist};
    s.first = al_malloc(sizeof(int) * (size_t)nn);
    s.next = al_malloc(sizeof(int) * (size_t)nn);
    s.last = al_malloc(sizeof(int) * (size_t)nn);
    s.shape = al_calloc((size_t)nn, sizeof *s.shape);
    s.row = al_calloc((size_t)nn, 1);
    uint8_t *other = al_calloc((size_t)nn, 1); /* group name -> a member is neither a row op nor f32 elementwise */
    int cand[MAX_SIBLINGS];
    bool ok = s.first && s.next && s.last && s.shape && s.row && other;
    if (ok) {
        /* the groups (a lone row op is one of its own, named by itself) and
         * their member lists in id order */
        uint8_t *named = other; /* borrowed: which names fuse.c's groups use */
        for (int i = 0; i < nn; i++)
            if (label[i] >= 0) named[label[i]] = 1;
        for (int i = 0; i < nn; i++)
            if (label[i] < 0 && !named[i] && ir_fuse_row_op(g, g->nodes[i])) label[i] = i;
        for (int i = 0; i < nn; i++) other[i] = 0;
        fuse_member_lists(label, nn, s.first, s.next, s.last);
        for (int i = nn - 1; i >= 0; i--) {
            int name = label[i];
            if (name < 0) continue;
            const ir_node *m = g->nodes[i];
            if (ir_fuse_row_op(g, m)) s.row[name] = 1, s.shape[name] = ir_fuse_shape(g, m);
            else if (ir_fuse_colsum(g, m)) continue; /* a row group's column sum (fuse.c's union, fuse_colsum.c) */
            else if (!ir_fuse_elementwise(g, m) || ir_fuse_wide(g, m) || ir_gemm_head(m)) other[name] = 1;
            else if (!s.row[name]) s.shape[name] = &m->type;
        }
        for (int i = 0; i < nn; i++)
            if (other[i]) s.shape[i] = NULL; /* a gemm or multi group, or one in f64: not a sibling */
        /* per tensor p, the row groups reading it row by row, in order,
         * each joined to the first one it legally can */
        for (int p = 0; p < nn; p++) {
            int k = 0;
            for (int e = s.rstart[p]; e < s.rstart[p + 1] && k < MAX_SIBLINGS; e++) {
                const ir_node *r = g->nodes[s.rlist[e]];
                int name = label[r->id];
                if (name < 0 || !s.shape[name] || label[p] == name) continue;
                bool row_read = ir_reads_rows(g, r, p);
                bool seen = false;
                for (int c = 0; c < k; c++) seen |= cand[c] == name;
                if (row_read && !seen) cand[k++] = name;
            }
            for (int b = 1; b < k; b++)
                for (int a = 0; a < b; a++) {
                    if (s.first[cand[a]] < 0 || s.first[cand[b]] < 0) continue; /* already taken */
                    if (!s.row[cand[a]] && !s.row[cand[b]]) continue; /* two ew groups: fuse.c's union decides */
                    if (!ir_same_dims(s.shape[cand[a]], s.shape[cand[b]]) || !legal_union(&s, cand[a], cand[b]))
                        continue;
                    take(&s, cand[a], cand[b]);
                    break;
                }
        }
        /* lone row ops that found no sibling go back to no group */
        for (int i = 0; i < nn; i++)
            if (label[i] == i && s.first[i] == i && s.next[i] < 0) label[i] = -1;
    }
    al_free(s.first), al_free(s.next), al_free(s.last), al_free(s.shape), al_free(s.row), al_free(other);
    return ok;
}
