/* env_check.c - the ALLOY_* variables alloy and its tools read, in one list, and a warning (once, on stderr) for any other ALLOY_ name. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "runtime/graph/graph_impl.h"

extern char **environ;

/* Read outside the option table: the CUDA backend's debug switch
 * (ALLOY_CUDA_SYNC, cuda_backend.c); and by the project's scripts and
 * tests, not the library: the CI script (.ci/run), the golden-test runner
 * (tests/run_golden.sh), the test suites' name filters (tests/support.c),
 * the emulation's library cache, checkers, block selection, numerics mode
 * and NCCL's injected failures (tests/cuda_emu/). */
static const char *const tool_names[] = {"ALLOY_CUDA_SYNC",      "ALLOY_CI_ASAN",       "ALLOY_CI_FUZZ_SECONDS",
                                         "ALLOY_CI_KEEP_BUILDS", "ALLOY_GOLDEN_UPDATE", "ALLOY_TEST_ONLY",
                                         "ALLOY_TEST_SKIP",
                                         "ALLOY_EMU_BLOCKS", "ALLOY_EMU_CACHE_DIR", "ALLOY_EMU_CHECK",
                                         "ALLOY_EMU_NCCL_FAIL", "ALLOY_EMU_NUMERICS", "ALLOY_EMU_NUMERICS_SEED"};

/* The AMP lists and their variables' names (ALLOY_AMP_<LIST>_ADD, _REMOVE), which amp_api.c reads. */
static const struct {
    alloy_amp_list list;
    ir_amp_class cls;
    const char *env;
} amp_lists[] = {
    {ALLOY_AMP_ALLOWLIST, AMP_ALLOW, "ALLOWLIST"},
    {ALLOY_AMP_DENYLIST, AMP_DENY, "DENYLIST"},
    {ALLOY_AMP_INFERLIST, AMP_INFER, "INFERLIST"},
    {ALLOY_AMP_CLEARLIST, AMP_CLEAR, "CLEARLIST"},
};

int graph_amp_env_count(void) { return (int)(sizeof amp_lists / sizeof amp_lists[0]) * 2; }

const char *graph_amp_env_name(int k, char *buf, size_t len)
{
    al_fmt(buf, len, "ALLOY_AMP_%s_%s", amp_lists[k / 2].env, k % 2 ? "REMOVE" : "ADD");
    return buf;
}

ir_amp_class graph_amp_env_class(int k) { return amp_lists[k / 2].cls; }

int graph_amp_list_class(alloy_amp_list list)
{
    for (size_t i = 0; i < sizeof amp_lists / sizeof amp_lists[0]; i++)
        if (amp_lists[i].list == list) return amp_lists[i].cls;
    return -1;
}

/* The k-th name alloy reads (k from 0), or NULL past the last: the
 * options' variables (options.c), the AMP list edits (amp_api.c), the
 * tools' own. */
static const char *known_name(int k, char *buf, size_t len)
{
    for (const opt_key *o = opt_keys; o->name; o++)
        if (k-- == 0) return o->env;
    if (k < graph_amp_env_count()) return graph_amp_env_name(k, buf, len);
    k -= graph_amp_env_count();
    return k < (int)(sizeof tool_names / sizeof *tool_names) ? tool_names[k] : NULL;
}

/* Levenshtein distance of a[0..la) and b, at most 8 characters apart in
 * length (else 99): enough to suggest the name meant. */
static int distance(const char *a, size_t la, const char *b)
{
    size_t lb = strlen(b);
    if (la > 63 || lb > 63 || (la > lb ? la - lb : lb - la) > 8) return 99;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

int graph_env_unknown(FILE *to)
{
    int unknown = 0;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "ALLOY_", 6) != 0) continue;
        const char *eq = strchr(*e, '=');
        size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        char buf[64];
        const char *name, *near = NULL;
        int best = 3; /* suggest a name at most 2 edits away */
        bool known = false;
        for (int k = 0; !known && (name = known_name(k, buf, sizeof buf)); k++) {
            known = strlen(name) == len && strncmp(name, *e, len) == 0;
            int d = distance(*e, len, name);
            if (d < best) best = d, near = name;
        }
        if (known) continue;
        unknown++;
        char nearby[96] = "";
        if (near) al_fmt(nearby, sizeof nearby, " (did you mean %s?)", near);
        fprintf(to, "alloy: warning: %.*s is not a variable alloy reads%s; it is ignored (docs/options.md lists them)\n",
                (int)len, *e, nearby);
    }
    return unknown;
}

void graph_env_warn_once(void)
{
    static atomic_flag warned = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&warned)) graph_env_unknown(stderr);
}
