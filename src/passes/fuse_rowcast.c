/* fuse_rowcast.c - the row-cast rule of the fuse pass: a cast to f16/bf16 of a row group's stored f32 value joins that group, which then stores the cast as one more output instead of a second kernel reading the value back.
 *
 * The union of fuse.c takes a cast that reads a row group's member as long
 * as the group is open; but a reduce_sum over the group's rows (a column
 * sum: layer_norm's dgamma and dbeta, the bias gradient of the linear layer
 * before it) is no union member, and reading a member it seals the group
 * before the cast that follows comes. fuse_colsum.c then takes the sums in,
 * and the cast of dx (for the next GEMM) was left a kernel of its own that
 * reads the f32 rows the row kernel had just written. Here such a cast
 * joins the group after the column sums are in: the row kernel stores the
 * f32 value and its cast from registers, as the forward's layer_norm kernel
 * stores y and y's cast. The value is the same: a cast of a stored f32
 * value gives the same bits wherever it is computed.
 *
 * Legality is the rule of every group (docs/fusion.md): the group runs at
 * its last member, so every reader from outside of a member or of the cast
 * must come after the later of the group's last member and the cast, and no
 * member may read the cast.
 */
#include "ir/groups.h"
#include "passes/pass.h"

/* Whether node n is a cast of an f32 value to f16 or bf16 in no group, of
 * an operand whose rows are those of row group a (shape: its row ops'
 * iteration shape). */
static bool row_cast(const ir_graph *g, const int *label, const ir_node *n, const ir_type *shape)
{
    if (n->op != IR_OP_cast || n->nin != 1 || label[n->id] >= 0 || !ir_fuse_elementwise(g, n) ||
        ir_fuse_wide(g, n))
        return false;
    const ir_node *o = g->nodes[n->in[0]];
    return (n->type.dtype == ALLOY_F16 || n->type.dtype == ALLOY_BF16) && o->type.dtype == ALLOY_F32 &&
           !ir_row_keeps(o) && ir_same_dims(shape, &n->type) && ir_same_dims(&o->type, &n->type);
}

/* Whether cast n may join group a (members first[a], next[..]; last[a] its
 * last member): no member reads n, and every reader from outside of a
 * member or of n comes after both a's last member and n. */
static bool legal_join(const int *label, const int *rstart, const int *rlist, const int *first, const int *next,
                       const int *last, int a, int n)
{
    int end = last[a] > n ? last[a] : n;
    for (int k = rstart[n]; k < rstart[n + 1]; k++)
        if (label[rlist[k]] == a || rlist[k] <= end) return false;
    for (int m = first[a]; m >= 0; m = next[m])
        for (int k = rstart[m]; k < rstart[m + 1]; k++) {
            int r = rlist[k];
            if (r != n && label[r] != a && r <= end) return false;
        }
    return true;
}

bool fuse_row_casts(const ir_graph *g, int *label, const int *rstart, const int *rlist)
{
    int nn = g->nnodes;
    int *first = al_malloc(sizeof(int) * (size_t)nn), *next = al_malloc(sizeof(int) * (size_t)nn);
    int *last = al_malloc(sizeof(int) * (size_t)nn);
    const ir_type **shape = al_calloc((size_t)nn, sizeof *shape);
    bool ok = first && next && last && shape;
    if (ok) {
        fuse_member_lists(label, nn, first, next, last);
        for (int i = 0; i < nn; i++)
            if (label[i] >= 0 && ir_fuse_row_op(g, g->nodes[i])) shape[label[i]] = ir_fuse_shape(g, g->nodes[i]);
        for (int n = 0; n < nn; n++) {
            const ir_node *x = g->nodes[n];
            if (x->nin != 1) continue;
            int a = label[x->in[0]];
            if (a < 0 || !shape[a] || !row_cast(g, label, x, shape[a]) ||
                !legal_join(label, rstart, rlist, first, next, last, a, n))
                continue;
            /* n is the group's last member now (legal_join: nothing in a reads it, so none comes after) */
            int *at = &first[a];
            while (*at >= 0 && *at < n) at = &next[*at];
            next[n] = *at, *at = n;
            label[n] = a;
            if (n > last[a]) last[a] = n;
        }
    }
    al_free(first), al_free(next), al_free(last), al_free(shape);
    return ok;
}
