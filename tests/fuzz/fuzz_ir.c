/* fuzz_ir.c - libFuzzer target: IR text through alloy_graph_parse; what parses must print, parse again and print the same bytes, and (when small) compile and run on the CPU. */
#include <string.h>

#include "fuzz_support.h"
#include "runtime/graph/graph_impl.h"

/* print(parse(print(g))) == print(g): the text is a faithful dump (docs/ir.md). */
static void check_round_trip(const alloy_graph *g)
{
    char *text = ir_print_string(g->ir);
    if (!text) return; /* out of memory */
    char err[512] = "";
    alloy_graph *again = alloy_graph_parse(text, strlen(text), "printed.ir", err, sizeof err);
    if (!again) fuzz_fail("the printed graph does not parse: %s\n%s", err, text);
    char *text2 = ir_print_string(again->ir);
    if (text2 && strcmp(text, text2) != 0) fuzz_fail("printing the parsed print differs:\n%s\n----\n%s", text, text2);
    al_free(text2);
    al_free(text);
    alloy_graph_free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512] = "";
    alloy_graph *g = alloy_graph_parse((const char *)data, size, "fuzz.ir", err, sizeof err);
    if (!g) {
        if (!err[0]) fuzz_fail("parse failed without a message");
        return 0;
    }
    check_round_trip(g);
    if (fuzz_graph_small(g)) {
        fuzz_cpu_options(g);
        fuzz_run_once(g, fuzz_hash(14695981039346656037ull, data, size));
    }
    alloy_graph_free(g);
    return 0;
}
