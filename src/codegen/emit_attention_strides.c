/* emit_attention_strides.c - the attention kernels' operand addressing: per-operand XOFF_(bh) / XROW_ macros from the operands' strides (plain or strided views), shared by the SIMT and tensor-core emitters. */
#include <stdint.h>

#include "codegen/emit_impl.h"

/* One operand's XOFF_ and XROW_ (emit_impl.h) over `rows` rows. XROW_ is
 * an int when every row's offset fits one (then (int)r * XROW_ is a 32-bit
 * product: the tensor-core forward's 64-bit ones for q and o cost the
 * registers that made it spill on sm_80 at GPT-2's shapes). */
static void put_stride(cg_text *t, const char *x, int64_t H, int64_t rows, const attn_stride *l)
{
    if (l->batch == H * l->head) /* heads one after another: bh alone says where */
        cg_put(t, "#define %sOFF_(bh) (%lldll + (bh) * %lldll)\n", x, (long long)l->base, (long long)l->head);
    else
        cg_put(t, "#define %sOFF_(bh) (%lldll + (bh) / %lldll * %lldll + (bh) %% %lldll * %lldll)\n", x,
               (long long)l->base, (long long)H, (long long)l->batch, (long long)H, (long long)l->head);
    cg_put(t, "#define %sROW_ %lld%s\n", x, (long long)l->row, rows * l->row <= INT32_MAX ? "" : "ll");
}

void cg_attention_strides(cg_text *t, const attn_strides *st)
{
    const struct {
        const char *x;
        int64_t rows;
        const attn_stride *l;
    } ops[] = {{"Q", st->T, &st->q},     {"K", st->S, &st->k},   {"V", st->S, &st->v},   {"O", st->T, &st->o},
               {"DO", st->T, &st->dout}, {"DQ", st->T, &st->dq}, {"DK", st->S, &st->dk}, {"DV", st->S, &st->dv}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) put_stride(t, ops[i].x, st->H, ops[i].rows, ops[i].l);
    cg_put(t, "#define LSEOFF_(bh) ((bh) * T_)\n#define LSEROW_ 1ll\n");
}

void cg_attention_strides_end(cg_text *t)
{
    static const char *const xs[] = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV", "LSE"};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) cg_put(t, "#undef %sOFF_\n#undef %sROW_\n", xs[i], xs[i]);
}
