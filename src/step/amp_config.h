/* amp_config.h - the AMP configuration a graph holds and the amp pass reads: the low-precision dtype and each op's lists. */
#ifndef ALLOY_AMP_CONFIG_H
#define ALLOY_AMP_CONFIG_H

#include "ir/ir.h"

/* AMP configuration: the dtype and the per-op list membership. */
typedef struct amp_config {
    alloy_dtype dtype;           /* ALLOY_F32: AMP off; ALLOY_F16 or ALLOY_BF16 */
    uint8_t lists[IR_OP_COUNT];  /* bit (1 << ir_amp_class) per list the op is on */
    ir_amp_class unlisted;       /* class of an op on no list */
} amp_config;

/* Fills c with AMP off and every op on the list of its table class. */
AL_HIDDEN void amp_config_init(amp_config *c);

#endif
