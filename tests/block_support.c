/* block_support.c - what the suites that train the transformer block share (block_support.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "block_support.h"
#include "models.h"
#include "support.h"

alloy_graph *block_trainer(alloy_dtype amp, double init_scale, alloy_optimizer o)
{
    alloy_graph *g = alloy_graph_new("block");
    alloy_graph_set_seed(g, 42);
    test_block m = build_transformer_block(g, ALLOY_F32, BB, BT, BV, BD, BH);
    expect_ok(g, alloy_graph_set_loss(g, m.loss), "set_loss");
    if (amp != ALLOY_F32) {
        expect_ok(g, alloy_graph_enable_amp(g, amp), "enable_amp");
        alloy_grad_scaler s = alloy_dynamic_scaler();
        s.init_scale = init_scale;
        expect_ok(g, alloy_graph_set_grad_scaler(g, s), "set_grad_scaler");
    }
    expect_ok(g, alloy_graph_add_optimizer(g, o), "add_optimizer");
    return g;
}

void block_batch(uint64_t seed, int mul, int add, int32_t *tokens, int32_t *targets, alloy_host_tensor feeds[2])
{
    test_rng = seed;
    for (int i = 0; i < BB * BT; i++) tokens[i] = (int32_t)(test_uniform(0, 1) * BV);
    for (int i = 0; i < BB * BT; i++) targets[i] = (tokens[i] * mul + add) % BV;
    feeds[0] = (alloy_host_tensor){"tokens", ALLOY_I32, 2, {BB, BT}, tokens};
    feeds[1] = (alloy_host_tensor){"targets", ALLOY_I32, 1, {BB * BT}, targets};
}
