/* block_support.h - what the suites that train tests/models.c's transformer block share (test_fuse_block.c, test_unscale.c): the block's trainer and its token batches. */
#ifndef ALLOY_TEST_BLOCK_SUPPORT_H
#define ALLOY_TEST_BLOCK_SUPPORT_H

#include <stdint.h>

#include "alloy/alloy.h"

/* The block's shape: batch, sequence, vocabulary, width, heads. */
enum { BB = 2, BT = 8, BV = 16, BD = 16, BH = 2 };

/* build_transformer_block at that shape in f32, seed 42, its loss set;
 * with amp other than ALLOY_F32, AMP in amp and the dynamic scaler from
 * init_scale; then optimizer o (the test fails on any error). */
alloy_graph *block_trainer(alloy_dtype amp, double init_scale, alloy_optimizer o);

/* A batch of the block's task: BB x BT tokens uniform over the vocabulary
 * (test_rng set to seed), each target (token * mul + add) % BV; feeds[0]
 * "tokens" [BB, BT] and feeds[1] "targets" [BB * BT], i32, over the arrays. */
void block_batch(uint64_t seed, int mul, int add, int32_t *tokens, int32_t *targets, alloy_host_tensor feeds[2]);

#endif
