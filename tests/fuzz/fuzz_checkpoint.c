/* fuzz_checkpoint.c - libFuzzer target: a file loaded as the checkpoint of a compiled training graph; a failed load changes nothing, a loaded one trains a step. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_support.h"

/* The first byte picks the model (fuzz_train_model), the rest is the file. */
static alloy_graph *models[FUZZ_TRAIN_MODELS];

/* Hash of every state tensor's name, dtype, shape and bytes. */
static uint64_t state_hash(alloy_graph *g)
{
    uint64_t h = 14695981039346656037ull;
    int n = alloy_graph_state_count(g);
    for (int i = 0; i < n; i++) {
        alloy_host_tensor t;
        if (alloy_graph_state_at(g, i, &t)) fuzz_fail("state_at(%d) of %d: %s", i, n, alloy_last_error(g));
        h = fuzz_hash(h, t.name, strlen(t.name));
        h = fuzz_hash(h, &t.dtype, sizeof t.dtype);
        h = fuzz_hash(h, t.dims, sizeof t.dims[0] * (size_t)t.rank);
        h = fuzz_hash(h, t.data, (size_t)alloy_host_tensor_numel(&t) * alloy_dtype_size(t.dtype));
    }
    return h;
}

static alloy_graph *model(int variant)
{
    if (models[variant]) return models[variant];
    alloy_graph *g = fuzz_train_model(variant);
    alloy_host_tensor feeds[2];
    fuzz_train_feeds(feeds);
    if (!g || alloy_graph_run(g, feeds, 2, NULL, 0))
        fuzz_fail("training model %d does not run: %s", variant, g ? alloy_last_error(g) : "no graph");
    return models[variant] = g;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    alloy_graph *g = model(data[0] % FUZZ_TRAIN_MODELS);
    const char *path = fuzz_tmp_path("checkpoint.safetensors");
    if (!fuzz_write_file(path, data + 1, size - 1)) fuzz_fail("cannot write %s", path);
    uint64_t before = state_hash(g);
    alloy_status st = alloy_graph_load_checkpoint(g, path);
    if (st) {
        if (!alloy_last_error(g)[0]) fuzz_fail("load failed (%s) without a message", alloy_status_name(st));
        if (state_hash(g) != before) fuzz_fail("a failed load changed the state: %s", alloy_last_error(g));
        return 0;
    }
    alloy_host_tensor feeds[2];
    fuzz_train_feeds(feeds);
    alloy_host_tensor fetch = {.name = "logits"};
    st = alloy_graph_run(g, feeds, 2, &fetch, 1);
    if (st) fuzz_fail("a step after a successful load failed: %s", alloy_last_error(g));
    alloy_step_info info;
    if (alloy_graph_step_info(g, &info)) fuzz_fail("step_info: %s", alloy_last_error(g));
    state_hash(g); /* reads every state byte after the step */
    return 0;
}
