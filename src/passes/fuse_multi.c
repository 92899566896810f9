/* fuse_multi.c - the multi-tensor groups of the fuse pass (label[]: node -> group name, -1 none): found_inf with the unscale chains and the gradient norm it reads, and the parameter updates that compute alike, each one launch. */
#include <stdlib.h>
#include <string.h>

#include "ir/groups.h"
#include "passes/pass.h"

/* The contracts of the non-static functions are in pass.h. */

/* found_inf F and those of its operands that are elementwise nodes in no
 * group, or whose elementwise group (in f32) is read by nothing outside it
 * before F: the unscale muls (with an f16 gradient's cast) of every
 * gradient and the isfinite check over them, one launch. With norm >= 0
 * (the sum_squares right before F, fuse_norm.c) that sum joins too, and its
 * reading the operands does not count as a reader from outside. mark:
 * scratch of nnodes bytes, zero on entry and on return. */
static void multi_found_inf_with(const ir_graph *g, int fi, int norm, const int *min_reader, int *label,
                                 uint8_t *mark)
{
    const ir_node *F = g->nodes[fi];
    int lo = norm >= 0 ? norm : fi; /* members' readers from here on are F and the sum */
    for (int j = 0; j < F->nin; j++) {
        const ir_node *o = g->nodes[F->in[j]];
        if (!ir_fuse_elementwise(g, o) || ir_fuse_wide(g, o) || o->type.rank == 0) continue;
        if (label[o->id] < 0 && min_reader[o->id] >= lo) mark[o->id] = 1;
        else if (label[o->id] >= 0 && !ir_gemm_head(g->nodes[label[o->id]])) mark[label[o->id]] = 2;
    }
    /* a group is taken when its members are all elementwise in f32 (no row
     * op) and none is read from outside it before F; its members all come
     * before F, since F reads one of them from outside */
    for (int i = 0; i < lo; i++) {
        const ir_node *n = g->nodes[i];
        if (label[i] >= 0 && mark[label[i]] == 2 && !(ir_fuse_elementwise(g, n) && !ir_fuse_wide(g, n)))
            mark[label[i]] = 0;
        for (int j = 0; j < n->nin; j++) {
            int lg = label[n->in[j]];
            if (lg >= 0 && mark[lg] == 2 && label[i] != lg) mark[lg] = 0;
        }
    }
    int taken = 0;
    for (int i = 0; i < lo; i++) {
        int l = label[i];
        if ((l < 0 && mark[i] == 1) || (l >= 0 && mark[l] == 2)) {
            label[i] = fi;
            taken++;
        }
    }
    for (int j = 0; j < F->nin; j++) mark[F->in[j]] = 0;
    for (int i = 0; i < fi; i++) mark[i] = 0;
    if (taken) label[fi] = fi;
    if (taken && norm >= 0) label[norm] = fi;
}

/* multi_found_inf_with, taking in the sum_squares right before F (placed
 * there by fuse_hoist_sum_squares) when each chain holds at most one of its
 * operands (fuse_norm_fits); else F's group as without it. false when out
 * of memory. */
bool fuse_multi_found_inf(const ir_graph *g, int fi, const int *min_reader, int *label, uint8_t *mark)
{
    int norm = fi > 0 && g->nodes[fi - 1]->op == IR_OP_sum_squares && label[fi - 1] < 0 ? fi - 1 : -1;
    if (norm >= 0) { /* its operands are F's (fuse_norm.c): only hoisted sums sit there */
        const ir_node *s = g->nodes[norm], *f = g->nodes[fi];
        for (int j = 0; j < s->nin && norm >= 0; j++) {
            bool in = false;
            for (int k = 0; k < f->nin && !in; k++) in = f->in[k] == s->in[j];
            if (!in) norm = -1;
        }
    }
    int *saved = norm >= 0 ? al_malloc(sizeof(int) * ((size_t)fi + 1)) : NULL;
    if (norm >= 0 && !saved) return false;
    if (saved) memcpy(saved, label, sizeof(int) * ((size_t)fi + 1));
    multi_found_inf_with(g, fi, norm, min_reader, label, mark);
    bool fits = true;
    if (saved && label[norm] == fi && !fuse_norm_fits(g, label, fi, norm, &fits)) {
        al_free(saved);
        return false;
    }
    if (saved && (!fits || label[norm] != fi)) { /* no: F's group alone, the sum a reader before it */
        memcpy(label, saved, sizeof(int) * ((size_t)fi + 1));
        multi_found_inf_with(g, fi, -1, min_reader, label, mark);
    }
    al_free(saved);
    return true;
}

/* The shape of group `name`'s computation, as ints: per member (ascending)
 * its op, dtype and operand count, and per operand either the index of the
 * member it reads or the dtype of an input from outside (scalar or not).
 * pos: scratch of nnodes ints, where each member's index goes (so that a
 * group of n members costs O(n), not O(n^2): a whole model's chain of
 * adds can be one group). */
static int signature(const ir_graph *g, const int *members, int n, const int *label, int *sig, int *pos)
{
    int len = 0;
    for (int k = 0; k < n; k++) pos[members[k]] = k;
    for (int k = 0; k < n; k++) {
        const ir_node *m = g->nodes[members[k]];
        sig[len++] = m->op, sig[len++] = m->type.dtype, sig[len++] = m->nin;
        for (int j = 0; j < m->nin; j++) {
            int o = m->in[j], idx = label[o] == label[members[k]] ? pos[o] : -1; /* an earlier member */
            const ir_node *on = g->nodes[o];
            sig[len++] = idx >= 0 ? idx : -1000 - (int)on->type.dtype * 2 - (on->type.rank == 0);
        }
    }
    return len;
}

/* Merges the elementwise groups that compute parameter updates (a member is
 * an update's value) and have the same signature into one group each: the
 * optimizer update over all parameters, one launch, a segment per
 * parameter. Only where legal: the merged group runs at its last member,
 * so every reader of a member from outside must come after that, and no
 * segment reads another. */
bool fuse_multi_updates(const ir_graph *g, int *label)
{
    int nn = g->nnodes;
    int *count = al_calloc((size_t)nn, sizeof(int)), *order = al_malloc(sizeof(int) * (size_t)nn);
    int *start = al_calloc((size_t)nn + 1, sizeof(int)), *sig_at = al_malloc(sizeof(int) * ((size_t)nn + 1));
    int *sigs = NULL, *cls = al_malloc(sizeof(int) * (size_t)nn), *clen = al_malloc(sizeof(int) * (size_t)nn);
    int *pos = al_malloc(sizeof(int) * (size_t)nn);
    uint8_t *upd = al_calloc((size_t)nn, 1), *in_cls = al_calloc((size_t)nn, 1), *done = al_calloc((size_t)nn, 1);
    bool ok = count && order && start && sig_at && cls && clen && pos && upd && in_cls && done;
    size_t sig_total = 0;
    if (ok) {
        for (int i = 0; i < nn; i++) {
            if (label[i] >= 0) count[label[i]]++;
            sig_total += 3 + (size_t)g->nodes[i]->nin;
        }
        sigs = al_malloc(sizeof(int) * (sig_total + 1));
        ok = sigs != NULL;
    }
    if (ok) {
        for (int i = 0; i < g->nupdates; i++) upd[g->updates[i].node] = 1;
        /* members of each group in id order: order[start[name] ..] */
        for (int i = 0; i < nn; i++) start[i + 1] = start[i] + count[i];
        for (int i = 0; i < nn; i++) count[i] = 0;
        for (int i = 0; i < nn; i++)
            if (label[i] >= 0) order[start[label[i]] + count[label[i]]++] = i;
        /* candidates cls[i]: EW groups with an update value, with their
         * signatures at sigs[sig_at[i] ..], clen[i] ints */
        int ncand = 0, at = 0;
        for (int name = 0; name < nn; name++) {
            int n = count[name];
            if (n < 2) continue;
            bool has_update = false, ew = true;
            for (int k = 0; k < n; k++) {
                const ir_node *m = g->nodes[order[start[name] + k]];
                has_update |= upd[m->id];
                ew &= ir_fuse_elementwise(g, m) && !ir_fuse_wide(g, m);
            }
            if (!has_update || !ew) continue;
            cls[ncand] = name;
            sig_at[ncand] = at;
            clen[ncand++] = signature(g, &order[start[name]], n, label, sigs + at, pos);
            at += clen[ncand - 1];
        }
        /* classes of equal signatures, each merged into its first group */
        for (int a = 0; a < ncand; a++) {
            int A = cls[a];
            if (done[a]) continue;
            int lenA = clen[a];
            int members_of_class = 0, last = -1;
            for (int b = a; b < ncand; b++) {
                int B = cls[b];
                if (done[b] || count[B] != count[A]) continue;
                int lenB = clen[b];
                if (lenA != lenB || memcmp(sigs + sig_at[a], sigs + sig_at[b], sizeof(int) * (size_t)lenA) != 0)
                    continue;
                in_cls[B] = 1;
                members_of_class++;
                if (order[start[B] + count[B] - 1] > last) last = order[start[B] + count[B] - 1];
            }
            bool legal = members_of_class > 1;
            for (int i = 0; i < nn && legal; i++) {
                const ir_node *n = g->nodes[i];
                for (int j = 0; j < n->nin && legal; j++) {
                    int o = n->in[j];
                    if (label[o] < 0 || !in_cls[label[o]] || label[i] == label[o]) continue;
                    if ((label[i] >= 0 && in_cls[label[i]]) || i <= last) legal = false;
                }
            }
            for (int b = a; b < ncand; b++) {
                int B = cls[b];
                if (done[b] || !in_cls[B]) continue;
                in_cls[B] = 0;
                done[b] = 1;
                if (!legal || B == A) continue;
                for (int k = 0; k < count[B]; k++) label[order[start[B] + k]] = A;
            }
        }
    }
    al_free(count), al_free(order), al_free(start), al_free(sig_at), al_free(sigs), al_free(cls);
    al_free(upd), al_free(in_cls), al_free(done), al_free(clen), al_free(pos);
    return ok;
}

