/* amp_config.c - the AMP configuration's defaults (a graph holds one from its creation; liballoy-runtime, which has no AMP pass, too). */
#include <string.h>

#include "step/amp_config.h"

void amp_config_init(amp_config *c)
{
    memset(c, 0, sizeof *c);
    c->dtype = ALLOY_F32;
    c->unlisted = AMP_DENY;
    for (int op = 0; op < IR_OP_COUNT; op++) c->lists[op] = (uint8_t)(1u << ir_ops[op].amp);
}
