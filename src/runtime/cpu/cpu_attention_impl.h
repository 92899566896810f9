/* cpu_attention_impl.h - the blockwise attention forward and backward of one (batch, head) in compute type C (float, or double for f64); cpu_attention.c includes it once per type with C and SFX defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define EXP(v) (sizeof(C) == sizeof(float) ? (C)expf((float)(v)) : (C)exp((double)(v)))
#define LOG(v) (sizeof(C) == sizeof(float) ? (C)logf((float)(v)) : (C)log((double)(v)))

/* s[r * BC + c] = scale * q[i0 + r] . k[j0 + c] for the rows [i0, i1) and
 * columns [j0, j1) of the block, from kt = k transposed ([D, S]): each dot
 * product sums over d in order (the plain loop's sum), the loop over the
 * block's columns innermost so it runs in vector lanes. */
static void CAT(scores, SFX)(const C *q, const C *kt, int64_t S, int64_t D, C scale, int64_t i0, int64_t i1, int64_t j0,
                             int64_t j1, C *s)
{
    int64_t n = j1 - j0;
    for (int64_t i = i0; i < i1; i++) {
        C *row = s + (i - i0) * BC;
        for (int64_t j = 0; j < n; j++) row[j] = 0;
        for (int64_t d = 0; d < D; d++) {
            C a = q[i * D + d];
            const C *b = kt + d * S + j0;
            for (int64_t j = 0; j < n; j++) row[j] += a * b[j];
        }
        for (int64_t j = 0; j < n; j++) row[j] *= scale;
    }
}

/* t = x ([S, D]) transposed: [D, S]. */
static void CAT(transpose, SFX)(const C *x, int64_t S, int64_t D, C *t)
{
    for (int64_t j = 0; j < S; j++)
        for (int64_t d = 0; d < D; d++) t[d * S + j] = x[j * D + d];
}

/* The columns row i sees: [0, limit) with limit = min(S, i + S - T + 1)
 * when causal (none when that is <= 0), all S otherwise. */
static int64_t CAT(limit, SFX)(const attn_shape *a, int64_t i)
{
    if (!a->causal) return a->S;
    int64_t l = i + a->S - a->T + 1;
    return l < 0 ? 0 : l > a->S ? a->S : l;
}

/* Online softmax over blocks of BC columns for the rows [0, T): o (when
 * non-NULL) gets softmax(scores) v, lse[i] the row's logsumexp (-inf for a
 * row that sees no column; its o row is 0). kt is k transposed ([D, S]),
 * s a BR x BC scratch. */
static void CAT(forward, SFX)(const attn_shape *a, const C *q, const C *kt, const C *v, C *o, C *lse, C *s)
{
    int64_t T = a->T, S = a->S, D = a->D;
    C scale = (C)a->scale;
    for (int64_t i0 = 0; i0 < T; i0 += BR) {
        int64_t i1 = i0 + BR < T ? i0 + BR : T;
        int64_t last = CAT(limit, SFX)(a, i1 - 1); /* the block's widest row */
        for (int64_t i = i0; i < i1; i++) {
            lse[i] = -INFINITY; /* the running max m_i until the end */
            if (o) memset(o + i * D, 0, sizeof(C) * (size_t)D);
        }
        C l[BR] = {0};
        for (int64_t j0 = 0; j0 < last; j0 += BC) {
            int64_t j1 = j0 + BC < last ? j0 + BC : last;
            CAT(scores, SFX)(q, kt, S, D, scale, i0, i1, j0, j1, s);
            for (int64_t i = i0; i < i1; i++) {
                int64_t end = CAT(limit, SFX)(a, i);
                if (end > j1) end = j1;
                if (end <= j0) continue;
                C *row = s + (i - i0) * BC, m = lse[i];
                for (int64_t j = j0; j < end; j++)
                    if (row[j - j0] > m) m = row[j - j0];
                C corr = lse[i] == -INFINITY ? (C)0 : EXP(lse[i] - m), sum = 0;
                for (int64_t j = j0; j < end; j++) sum += row[j - j0] = EXP(row[j - j0] - m);
                l[i - i0] = l[i - i0] * corr + sum;
                lse[i] = m;
                if (!o) continue;
                C *restrict acc = o + i * D;
                for (int64_t d = 0; d < D; d++) acc[d] *= corr;
                for (int64_t j = j0; j < end; j++) {
                    C p = row[j - j0];
                    const C *restrict vj = v + j * D;
                    for (int64_t d = 0; d < D; d++) acc[d] += p * vj[d];
                }
            }
        }
        for (int64_t i = i0; i < i1; i++) {
            C li = l[i - i0];
            if (li > 0) {
                if (o)
                    for (int64_t d = 0; d < D; d++) o[i * D + d] /= li;
                lse[i] += LOG(li);
            } else {
                lse[i] = -INFINITY;
            }
        }
    }
}

/* FlashAttention-2's backward of one (batch, head): with P = exp(scale q
 * k^T - lse) recomputed block by block, dv = P^T do, dP = do v^T, dS = P *
 * (dP - rowsum(do * o)), dq = scale dS k, dk = scale dS^T q. dq, dk, dv are
 * accumulated (zeroed here); kt and vt are k and v transposed ([D, S]),
 * lse and delta T scratch values, s and dp BR x BC scratch. */
static void CAT(backward, SFX)(const attn_shape *a, const C *q, const C *k, const C *kt, const C *vt, const C *o,
                               const C *dout, C *dq, C *dk, C *dv, C *lse, C *delta, C *s, C *dp)
{
    int64_t T = a->T, S = a->S, D = a->D;
    C scale = (C)a->scale;
    CAT(forward, SFX)(a, q, kt, NULL, NULL, lse, s);
    memset(dq, 0, sizeof(C) * (size_t)(T * D));
    memset(dk, 0, sizeof(C) * (size_t)(S * D));
    memset(dv, 0, sizeof(C) * (size_t)(S * D));
    for (int64_t i = 0; i < T; i++) {
        C acc = 0;
        for (int64_t d = 0; d < D; d++) acc += dout[i * D + d] * o[i * D + d];
        delta[i] = acc;
    }
    for (int64_t i0 = 0; i0 < T; i0 += BR) {
        int64_t i1 = i0 + BR < T ? i0 + BR : T;
        int64_t last = CAT(limit, SFX)(a, i1 - 1);
        for (int64_t j0 = 0; j0 < last; j0 += BC) {
            int64_t j1 = j0 + BC < last ? j0 + BC : last;
            CAT(scores, SFX)(q, kt, S, D, scale, i0, i1, j0, j1, s);
            CAT(scores, SFX)(dout, vt, S, D, (C)1, i0, i1, j0, j1, dp);
            for (int64_t i = i0; i < i1; i++) {
                int64_t end = CAT(limit, SFX)(a, i);
                if (end > j1) end = j1;
                if (end <= j0 || lse[i] == -INFINITY) continue;
                C *prow = s + (i - i0) * BC, *dprow = dp + (i - i0) * BC;
                const C *qi = q + i * D, *doi = dout + i * D;
                C *dqi = dq + i * D;
                for (int64_t j = j0; j < end; j++) {
                    C p = EXP(prow[j - j0] - lse[i]);
                    C ds = p * (dprow[j - j0] - delta[i]) * scale;
                    /* three disjoint rows: one vector loop each */
                    C *restrict dvj = dv + j * D, *restrict dkj = dk + j * D, *restrict dqr = dqi;
                    const C *restrict kj = k + j * D;
                    for (int64_t d = 0; d < D; d++) dvj[d] += p * doi[d];
                    for (int64_t d = 0; d < D; d++) dqr[d] += ds * kj[d];
                    for (int64_t d = 0; d < D; d++) dkj[d] += ds * qi[d];
                }
            }
        }
    }
}

#undef EXP
#undef LOG
#undef CAT
#undef CAT_
