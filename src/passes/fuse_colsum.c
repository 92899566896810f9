/* fuse_colsum.c - the column-sum rule of the fuse pass: a reduce_sum over the rows of a row group's [rows, C] value joins that group, so the value need not be stored and read back.
 *
 * layer_norm's backward (after the sibling rule, fuse_siblings.c) is one
 * row group computing dx and the product dy * xhat; autodiff then sums the
 * product over the rows for dgamma, and dy for dbeta (ad_unbroadcast), as
 * reduce_sums of their own. Unfused, the group writes the [rows, C]
 * product to memory and a second kernel reads it back, and a third reads
 * dy again. Taken into the group (ir_fuse_colsum), each block of rows adds
 * its rows' columns while the rows are at hand, and a final combine writes
 * the [C] result: the product is stored only when something else reads it.
 *
 * A reduce_sum is tried against the row group its operand is a member of,
 * else the row groups of its operand's shape that read the operand (dy, read
 * row by row by layer_norm_grad). Legality is the rule of every group
 * (docs/fusion.md): the group runs at its last member, so every reader of a
 * member from outside it must come after the later of that member and the
 * reduce_sum; and no member may read the sum (ir_check_groups). The union
 * (fuse.c, take_colsum) has already taken the sums that a later member of
 * their group needs (the cast of dx after dx's sum); they, and those the
 * sibling rule took in, count towards a group's IR_MAX_COLSUMS here.
 */
#include <string.h>

#include "ir/groups.h"
#include "passes/pass.h"

typedef struct colsums {
    const ir_graph *g;
    int *label;                /* node -> group name, -1 none (fuse.c's) */
    const int *rstart, *rlist; /* readers of node i: rlist[rstart[i] .. rstart[i + 1]), ascending */
    int *first, *next, *last;  /* group name -> first member, member -> next (-1 at the end), name -> last id */
    int *count;                /* group name -> column sums taken */
    const ir_type **shape;     /* group name -> the iteration shape of its row ops; NULL: not a row group */
} colsums;

/* Whether column sum n may join group a: no member reads n, and every
 * reader from outside of a member or of n comes after both a's last member
 * and n. */
static bool legal_join(const colsums *c, int a, int n)
{
    if (c->count[a] >= IR_MAX_COLSUMS) return false;
    int last = c->last[a] > n ? c->last[a] : n;
    for (int k = c->rstart[n]; k < c->rstart[n + 1]; k++)
        if (c->label[c->rlist[k]] == a || c->rlist[k] <= last) return false;
    for (int m = c->first[a]; m >= 0; m = c->next[m])
        for (int k = c->rstart[m]; k < c->rstart[m + 1]; k++) {
            int r = c->rlist[k];
            if (r != n && c->label[r] != a && r <= last) return false;
        }
    return true;
}

/* Puts n into group a, keeping the member list in id order. */
static void take(colsums *c, int a, int n)
{
    int *at = &c->first[a];
    while (*at >= 0 && *at < n) at = &c->next[*at];
    c->next[n] = *at;
    *at = n;
    c->label[n] = a;
    if (n > c->last[a]) c->last[a] = n;
    c->count[a]++;
}

bool fuse_row_colsums(const ir_graph *g, int *label, const int *rstart, const int *rlist)
{
    int nn = g->nnodes;
    colsums c = {.g = g, .label = label, .rstart = rstart, .rlist = rlist};
    c.first = al_malloc(sizeof(int) * (size_t)nn);
    c.next = al_malloc(sizeof(int) * (size_t)nn);
    c.last = al_malloc(sizeof(int) * (size_t)nn);
    c.count = al_calloc((size_t)nn, sizeof(int));
    c.shape = al_calloc((size_t)nn, sizeof *c.shape);
    bool ok = c.first && c.next && c.last && c.count && c.shape;
    if (ok) {
        fuse_member_lists(label, nn, c.first, c.next, c.last);
        for (int i = 0; i < nn; i++) {
            if (label[i] >= 0 && ir_fuse_row_op(g, g->nodes[i])) c.shape[label[i]] = ir_fuse_shape(g, g->nodes[i]);
            if (label[i] >= 0 && ir_fuse_colsum(g, g->nodes[i])) c.count[label[i]]++; /* the union's, the siblings' */
        }
        for (int n = 0; n < nn; n++) {
            const ir_node *x = g->nodes[n];
            if (label[n] >= 0 || !ir_fuse_colsum(g, x)) continue;
            int o = x->in[0];
            const ir_type *ot = &g->nodes[o]->type;
            /* its operand's row group, then those reading the operand */
            int a = label[o];
            if (a >= 0 && c.shape[a] && ir_same_dims(c.shape[a], ot) && legal_join(&c, a, n)) {
                take(&c, a, n);
                continue;
            }
            for (int k = rstart[o]; k < rstart[o + 1]; k++) {
                const ir_node *r = g->nodes[rlist[k]];
                a = label[r->id];
                if (r->id == n || a < 0 || !c.shape[a] || !ir_same_dims(c.shape[a], ot) || !ir_reads_rows(g, r, o)) continue;
                if (legal_join(&c, a, n)) {
                    take(&c, a, n);
                    break;
                }
            }
        }
    }
    al_free(c.first), al_free(c.next), al_free(c.last), al_free(c.count), al_free(c.shape);
    return ok;
}
