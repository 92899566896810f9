/* test_inspect.c - what alloy shows of a compilation: the numbered per-pass dumps (they parse back), the pass timing table, the DOT picture (a node per IR node, a cluster per fused step, rendered by Graphviz when installed) and the memory picture (well-formed, a rectangle per arena slot, the peak where the live bytes peak). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ir/ir.h"
#include "models.h"
#include "passes/inspect.h"
#include "runtime/graph/graph_impl.h"
#include "support.h"

/* The pipeline's stages as the dump files name them (docs/inspect.md). */
static const char *const stages[] = {"input",    "verify",        "random",      "lower_norm", "attention",
                                     "amp",      "autodiff",      "data_parallel", "grad_scaler", "optimizer",
                                     "simplify", "dce",           "remat",       "fuse",       "schedule",   "plan"};
enum { NSTAGES = sizeof stages / sizeof stages[0] };

/* The fill colour docs/inspect.md gives each AMP class (none, allow, deny, infer, clear). */
static const char *const amp_fill[] = {"#ffffff", "#8ce99a", "#ffa8a8", "#ffe066", "#a5d8ff"};

/* ---- helpers ---- */

/* char_gpt's training step (examples/ir/char_gpt.ir): f16 AMP, dynamic loss scaling, AdamW. */
static alloy_graph *char_gpt_step(void)
{
    char err[512];
    alloy_graph *g = alloy_graph_load_ir(ALLOY_EXAMPLES_IR "/char_gpt.ir", err, sizeof err);
    if (!g) fail_msg("%s", err);
    expect_ok(g, alloy_graph_set_training(g, true), "training");
    expect_ok(g, alloy_graph_enable_amp(g, ALLOY_F16), "amp");
    expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_dynamic_scaler()), "scaler");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01)), "optimizer");
    expect_ok(g, alloy_graph_set_option(g, "attention", "always"), "attention"); /* so its stage changes the graph */
    return g;
}

/* The transformer block of models.c as a training step in amp (ALLOY_F32: none) with SGD. */
static alloy_graph *block_step(alloy_dtype amp)
{
    alloy_graph *g = alloy_graph_new("block");
    test_block m = build_transformer_block(g, ALLOY_F32, 2, 8, 11, 16, 2);
    expect_ok(g, alloy_graph_set_loss(g, m.loss), "loss");
    if (amp != ALLOY_F32) {
        expect_ok(g, alloy_graph_enable_amp(g, amp), "amp");
        expect_ok(g, alloy_graph_set_grad_scaler(g, alloy_static_scaler(64)), "scaler");
    }
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0.9, 0.0, false)), "optimizer");
    return g;
}

/* Compiles g (its passes run, the dumps are written). */
static void compile(alloy_graph *g)
{
    alloy_memory_info mi;
    expect_ok(g, alloy_graph_memory_info(g, &mi), "compile");
}

/* What alloy_graph_dump writes for kind (malloc'd, NUL-terminated). */
static char *dump_text(alloy_graph *g, alloy_dump_kind kind)
{
    /* static: the stream holds their addresses until fclose, which gcc 12
     * at -O3 takes for a pointer into this frame escaping (-Wdangling-pointer) */
    static char *text;
    static size_t len;
    text = NULL, len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    alloy_status st = alloy_graph_dump(g, f, kind);
    fclose(f);
    expect_ok(g, st, "dump");
    return text;
}

/* dir/GRAPH.NN-STAGE.ir */
static const char *stage_path(const char *dir, const char *graph, int k)
{
    char name[128];
    snprintf(name, sizeof name, "%s.%02d-%s.ir", graph, k, stages[k]);
    return test_path_in(dir, name);
}

/* The IR of a dump: from its "graph" line to the "}" line, as a new string. */
static char *ir_section(const char *text)
{
    const char *start = strncmp(text, "graph ", 6) == 0 ? text : strstr(text, "\ngraph ");
    assert_non_null(start);
    if (*start == '\n') start++;
    const char *end = strstr(start, "\n}\n");
    assert_non_null(end);
    return strndup(start, (size_t)(end + 3 - start));
}

/* Parses a dump file, fails the test unless it parses, verifies and prints back as its IR section. */
static ir_graph *parse_dump(const char *path)
{
    size_t len;
    char *text = (char *)test_read_file(path, &len);
    char err[512];
    ir_graph *ir = ir_parse(text, len, path, err, sizeof err);
    if (!ir) fail_msg("%s does not parse: %s", path, err);
    if (ir_verify(ir)) fail_msg("%s does not verify: %s", path, ir->error);
    char *printed = ir_print_string(ir), *section = ir_section(text);
    assert_non_null(printed);
    if (strcmp(printed, section) != 0) fail_msg("%s: its IR does not print back as it was written", path);
    al_free(printed);
    free(section);
    test_free(text);
    return ir;
}

/* Lines of text starting with prefix. */
static int count_lines(const char *text, const char *prefix)
{
    int n = 0;
    size_t len = strlen(prefix);
    for (const char *p = text; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, prefix, len) == 0) n++;
    return n;
}

/* Entries of dir besides . and .. */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* The members of every "# step" line of a schedule dump: members[k] lists
 * step k's node ids (ending with -1); returns the step count. */
enum { MAX_STEPS = 1024, MAX_MEMBERS = 4096 };
static int read_steps(const char *text, int (*members)[64], int *nmembers)
{
    int nsteps = 0;
    for (const char *p = strstr(text, "\n# step "); p; p = strstr(p + 1, "\n# step ")) {
        int k = atoi(p + 8);
        assert_int_equal(k, nsteps);
        assert_true(nsteps < MAX_STEPS);
        const char *eol = strchr(p + 1, '\n'), *semi = strchr(p, ';');
        assert_true(semi && semi < eol);
        nmembers[k] = 0;
        for (const char *q = semi; q < eol; q++)
            if (*q == '%') {
                if (nmembers[k] < 64) members[k][nmembers[k]] = atoi(q + 1);
                nmembers[k]++;
            }
        nsteps++;
    }
    return nsteps;
}

/* The integer after `key="` in the tag starting at tag (-1 when absent before the tag's end). */
static long long attr_int(const char *tag, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, " %s=\"", key);
    const char *end = strchr(tag, '>'), *at = strstr(tag, pat);
    if (!at || at > end) return -1;
    return atoll(at + strlen(pat));
}

/* The string after `key="` on the line starting at tag, into buf ("" when absent). */
static void attr_str(const char *tag, const char *key, char *buf, size_t len)
{
    char pat[64];
    snprintf(pat, sizeof pat, "%s=\"", key);
    const char *end = strchr(tag, '\n'), *at = tag;
    while ((at = strstr(at, pat)) && at > tag && at[-1] != ' ' && at[-1] != '[') at++; /* not the tail of a longer key */
    buf[0] = '\0';
    if (!at || (end && at > end)) return;
    at += strlen(pat);
    size_t n = strcspn(at, "\"");
    snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), at);
}

/* Whether text is XML whose tags balance: every <name ...> closed by
 * </name> in order, <.../> closing itself, <?...?> and <!--...--> skipped,
 * no '<' or '&' loose in text or attributes (entities named). */
static bool xml_balanced(const char *text, char *why, size_t len)
{
    char stack[64][32];
    int depth = 0, roots = 0;
    for (const char *p = text; *p;) {
        if (*p == '&') {
            size_t n = strspn(p + 1, "abcdefghijklmnopqrstuvwxyz#0123456789");
            if (!n || p[1 + n] != ';') return snprintf(why, len, "a loose '&' at byte %td", p - text), false;
            p += n + 2;
            continue;
        }
        if (*p != '<') {
            p++;
            continue;
        }
        if (strncmp(p, "<?", 2) == 0 || strncmp(p, "<!--", 4) == 0) {
            const char *end = strstr(p, p[1] == '?' ? "?>" : "-->");
            if (!end) return snprintf(why, len, "an unclosed <? or <!-- at byte %td", p - text), false;
            p = end + 2;
            continue;
        }
        const char *end = p + 1;
        for (char quote = 0; *end && (quote || *end != '>'); end++) {
            if (*end == '<' && !quote) return snprintf(why, len, "a '<' inside a tag at byte %td", end - text), false;
            if (*end == '"' || *end == '\'') quote = quote == *end ? 0 : quote ? quote : *end;
        }
        if (!*end) return snprintf(why, len, "an unclosed tag at byte %td", p - text), false;
        bool closing = p[1] == '/', self = end[-1] == '/';
        size_t n = strcspn(p + 1 + closing, " \t\n/>");
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)(n < 31 ? n : 31), p + 1 + closing);
        if (closing) {
            if (!depth || strcmp(stack[depth - 1], name) != 0)
                return snprintf(why, len, "</%s> at byte %td closes %s", name, p - text, depth ? stack[depth - 1] : "nothing"), false;
            depth--;
        } else if (!self) {
            if (depth == 64) return snprintf(why, len, "tags nest deeper than 64"), false;
            if (!depth) roots++;
            snprintf(stack[depth++], sizeof stack[0], "%s", name);
        } else if (!depth) {
            roots++;
        }
        p = end + 1;
    }
    if (depth) return snprintf(why, len, "<%s> is never closed", stack[depth - 1]), false;
    if (roots != 1) return snprintf(why, len, "%d root elements", roots), false;
    return true;
}

/* The path of Graphviz's dot on $PATH into buf; false when it is not there. */
static bool find_dot(char *buf, size_t len)
{
    const char *path = getenv("PATH");
    for (const char *p = path ? path : ""; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(buf, len, "%.*s/dot", (int)n, p);
        if (n && access(buf, X_OK) == 0) return true;
        p += n + (p[n] == ':');
    }
    return false;
}

/* ---- the dump directory ---- */

/* Every stage of char_gpt's f16 AdamW training step goes to its own file,
 * in pipeline order, and each parses, verifies and prints back as written. */
static void test_every_stage_of_the_char_gpt_step_is_a_numbered_file_that_parses_back(void **state)
{
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("dumps"));
    alloy_graph *g = char_gpt_step();
    expect_ok(g, alloy_graph_set_option(g, "dump_dir", dir), "dump_dir");
    compile(g);
    assert_int_equal(count_entries(dir), NSTAGES); /* no temporary file left */
    int nodes[NSTAGES];
    for (int k = 0; k < NSTAGES; k++) {
        ir_graph *ir = parse_dump(stage_path(dir, "char_gpt", k));
        nodes[k] = ir->nnodes;
        if (k == 0) assert_int_equal(ir->nnodes, g->ir->nnodes); /* the graph as given */
        if (k == NSTAGES - 1) {
            assert_int_equal(ir->nnodes, g->compiled->nnodes);
            for (int i = 0; i < ir->nnodes; i++) assert_int_equal(ir->nodes[i]->group, g->compiled->nodes[i]->group);
        }
        ir_graph_free(ir);
    }
    assert_int_equal(nodes[2], nodes[1]); /* random: no random op */
    assert_int_equal(nodes[3], nodes[2]); /* lower_norm: no batch_norm or group_norm */
    assert_true(nodes[4] < nodes[3]);  /* attention: the written-out attention becomes one node */
    assert_true(nodes[5] > nodes[4]);  /* amp inserts casts */
    assert_true(nodes[6] > nodes[5]);  /* autodiff adds the backward */
    assert_int_equal(nodes[7], nodes[6]); /* data_parallel: not data-parallel */
    assert_true(nodes[9] > nodes[8]);  /* the optimizer adds updates */
    /* each file's first line says which stage it is, in order */
    for (int k = 0; k < NSTAGES; k++) {
        size_t len;
        char *text = (char *)test_read_file(stage_path(dir, "char_gpt", k), &len);
        char want[64];
        snprintf(want, sizeof want, k ? "# after %s (" : "# input", stages[k]);
        if (strncmp(text, want, strlen(want)) != 0) fail_msg("stage %d starts '%.40s', not '%s'", k, text, want);
        if (k == 13) assert_true(count_lines(text, "# group ") > 0);
        if (k == 14) assert_int_equal(count_lines(text, "# step "), g->comp.sched.nsteps);
        if (k == 15) {
            int slots = 0, views = 0; /* a view shares its owner's slot: a line of its own */
            for (int i = 0; i < g->compiled->nnodes; i++) {
                bool view = g->comp.plan.view_of && g->comp.plan.view_of[i] >= 0;
                slots += g->comp.plan.offset[i] >= 0 && !view;
                views += view;
            }
            assert_int_equal(count_lines(text, "# slot "), slots);
            assert_int_equal(count_lines(text, "# view "), views);
            assert_int_equal(views, g->comp.plan.views);
            assert_true(views > 0); /* char_gpt's reshapes of computed values */
        }
        test_free(text);
    }
    alloy_graph_free(g);
}

/* The transformer block's step, without AMP and with f16 and bf16 AMP: every stage parses back. */
static void test_every_stage_of_a_transformer_block_step_parses_back(void **state)
{
    (void)state;
    const alloy_dtype amps[] = {ALLOY_F32, ALLOY_F16, ALLOY_BF16};
    for (int a = 0; a < 3; a++) {
        char sub[32];
        snprintf(sub, sizeof sub, "block%d", a);
        char dir[256];
        snprintf(dir, sizeof dir, "%s", test_tmp_path(sub));
        alloy_graph *g = block_step(amps[a]);
        expect_ok(g, alloy_graph_set_option(g, "dump_dir", dir), "dump_dir");
        compile(g);
        assert_int_equal(count_entries(dir), NSTAGES);
        for (int k = 0; k < NSTAGES; k++) ir_graph_free(parse_dump(stage_path(dir, "block", k)));
        alloy_graph_free(g);
    }
}

/* A recompile with a pass disabled removes that pass's file of the compile before. */
static void test_a_disabled_pass_leaves_no_stale_dump(void **state)
{
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("dumps"));
    alloy_graph *g = block_step(ALLOY_F16);
    expect_ok(g, alloy_graph_set_option(g, "dump_dir", dir), "dump_dir");
    compile(g);
    struct stat sb;
    assert_int_equal(stat(stage_path(dir, "block", 10), &sb), 0);
    expect_ok(g, alloy_graph_set_option(g, "disable_passes", "simplify"), "disable");
    compile(g);
    assert_int_equal(stat(stage_path(dir, "block", 10), &sb), -1); /* 10-simplify is gone */
    assert_int_equal(count_entries(dir), NSTAGES - 1);
    size_t len;
    char *text = (char *)test_read_file(stage_path(dir, "block", 11), &len); /* dce's file is this compile's */
    assert_non_null(strstr(text, "# options: disable_passes=simplify"));
    test_free(text);
    alloy_graph_free(g);
}

/* A dump directory that cannot be made fails the compile with an error naming it. */
static void test_a_dump_dir_that_cannot_be_made_fails_the_compile_naming_it(void **state)
{
    (void)state;
    FILE *f = fopen(test_tmp_path("file"), "w");
    assert_non_null(f);
    fclose(f);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/sub", test_tmp_path("file"));
    alloy_graph *g = block_step(ALLOY_F32);
    expect_ok(g, alloy_graph_set_option(g, "dump_dir", dir), "dump_dir");
    alloy_memory_info mi;
    assert_int_equal(alloy_graph_memory_info(g, &mi), ALLOY_ERR_IO);
    const char *msg = alloy_last_error(g);
    if (!strstr(msg, "dump_dir") || !strstr(msg, dir)) fail_msg("the error does not name the directory: %s", msg);
    alloy_graph_free(g);
}

/* A graph name that is no file name (a path, spaces) is made one: the dumps stay in the directory. */
static void test_a_graph_name_becomes_a_safe_file_name(void **state)
{
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("dumps"));
    alloy_graph *g = alloy_graph_new("../odd name");
    test_mlp m = build_mlp(g, ALLOY_F32, 4, 3, 5, 2);
    (void)m;
    expect_ok(g, alloy_graph_set_option(g, "dump_dir", dir), "dump_dir");
    compile(g);
    struct stat sb;
    assert_int_equal(stat(test_path_in(dir, "_._odd_name.00-input.ir"), &sb), 0);
    assert_int_equal(count_entries(dir), NSTAGES);
    assert_int_equal(count_entries(test_tmpdir), 1); /* nothing beside the directory */
    alloy_graph_free(g);
}

/* ---- pass times ---- */

/* time_passes prints a row per pass in order, with the node count its dump has (disabled passes say so). */
static void test_time_passes_prints_each_pass_with_its_node_count(void **state)
{
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("dumps"));
    alloy_graph *g = char_gpt_step();
    FILE *log = fopen(test_tmp_path("log"), "w+");
    assert_non_null(log);
    expect_ok(g, alloy_graph_print_after(g, "", log), "stream");
    expect_ok(g, alloy_graph_set_option(g, "time_passes", "1"), "time_passes");
    expect_ok(g, alloy_graph_set_option(g, "disable_passes", "dce"), "disable");
    expect_ok(g, alloy_graph_set_option(g, "dump_dir", dir), "dump_dir");
    compile(g);
    fclose(log);
    size_t len;
    char *text = (char *)test_read_file(test_tmp_path("log"), &len);
    ir_graph *input = parse_dump(stage_path(dir, "char_gpt", 0));
    char head[128];
    snprintf(head, sizeof head, "# pass times: graph char_gpt, %d -> %d nodes, ", input->nnodes, g->compiled->nnodes);
    if (strncmp(text, head, strlen(head)) != 0) fail_msg("the table starts '%.80s', not '%s'", text, head);
    ir_graph_free(input);
    const char *row = strchr(text, '\n') + 1;
    assert_int_equal(strncmp(row, "#   pass", 8), 0);
    for (int k = 1; k < NSTAGES; k++) {
        row = strchr(row, '\n') + 1;
        char name[32], ms[32];
        int nodes = -1;
        assert_true(sscanf(row, "# %31s %31s %d", name, ms, &nodes) >= 2);
        assert_string_equal(name, stages[k]);
        if (k == 11) { /* dce */
            assert_string_equal(ms, "-");
            assert_non_null(strstr(row, "disabled"));
            continue;
        }
        assert_true(atof(ms) >= 0);
        ir_graph *ir = parse_dump(stage_path(dir, "char_gpt", k));
        assert_int_equal(nodes, ir->nnodes);
        ir_graph_free(ir);
        if (k == 14) { /* schedule */
            char want[32];
            snprintf(want, sizeof want, "  %d steps\n", g->comp.sched.nsteps);
            assert_int_equal(strncmp(strchr(row, '\n') - strlen(want) + 1, want, strlen(want)), 0);
        }
    }
    assert_null(strchr(strchr(row, '\n') + 1, '\n')); /* plan's row is the last */
    test_free(text);
    alloy_graph_free(g);
}

/* ---- the DOT picture ---- */

/* DOT of char_gpt's step: every IR node exactly once, filled by its AMP
 * class, inserted casts marked; each operand an edge labelled with its
 * type; each schedule step of two or more members a cluster holding exactly
 * its members. */
static void test_dot_has_a_node_per_ir_node_and_a_cluster_per_fused_step(void **state)
{
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("dumps"));
    alloy_graph *g = char_gpt_step();
    expect_ok(g, alloy_graph_set_option(g, "dump_dir", dir), "dump_dir");
    char *dot = dump_text(g, ALLOY_DUMP_DOT);
    ir_graph *ir = parse_dump(stage_path(dir, "char_gpt", NSTAGES - 1)); /* the compiled graph, from its text */
    size_t len;
    char *plan = (char *)test_read_file(stage_path(dir, "char_gpt", NSTAGES - 1), &len);
    static int members[MAX_STEPS][64], nmembers[MAX_STEPS];
    int nsteps = read_steps(plan, members, nmembers), fused = 0;
    for (int k = 0; k < nsteps; k++) fused += nmembers[k] >= 2;
    assert_true(fused > 10);
    int *seen = calloc((size_t)ir->nnodes, sizeof(int)), *cluster_of = calloc((size_t)ir->nnodes, sizeof(int));
    int clusters = 0, edges = 0, operands = 0, cluster = -1;
    for (const char *p = dot; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *s = p + strspn(p, " "), *eol = strchr(s, '\n'), *arrow = strstr(s, " -> ");
        if (arrow && eol && arrow > eol) arrow = NULL;
        if (strncmp(s, "subgraph cluster_step", 21) == 0) {
            cluster = atoi(s + 21);
            assert_true(cluster < nsteps && nmembers[cluster] >= 2);
            clusters++;
        } else if (*s == '}' && cluster >= 0) {
            cluster = -1;
        } else if (s[0] == 'n' && arrow) {
            int from = atoi(s + 1), to = atoi(arrow + 5);
            char label[96], type[96];
            attr_str(s, "xlabel", label, sizeof label);
            ir_fmt_type(type, sizeof type, &ir->nodes[from]->type);
            assert_string_equal(label, type);
            bool operand = false;
            for (int k = 0; k < ir->nodes[to]->nin; k++) operand |= ir->nodes[to]->in[k] == from;
            assert_true(operand);
            edges++;
        } else if (s[0] == 'n' && s[1] >= '0' && s[1] <= '9') {
            int id = atoi(s + 1);
            assert_true(id >= 0 && id < ir->nnodes);
            seen[id]++;
            cluster_of[id] = cluster;
            const ir_node *n = ir->nodes[id];
            char fill[32];
            attr_str(s, "fillcolor", fill, sizeof fill);
            assert_string_equal(fill, amp_fill[n->amp]);
            const char *thick = strstr(s, "penwidth=3");
            assert_int_equal(thick && thick < eol, (n->flags & IR_NODE_INSERTED) != 0);
        }
    }
    for (int i = 0; i < ir->nnodes; i++) {
        if (seen[i] != 1) fail_msg("node %%%d has %d node statements", i, seen[i]);
        operands += ir->nodes[i]->nin;
    }
    assert_int_equal(clusters, fused);
    assert_int_equal(edges, operands);
    for (int k = 0; k < nsteps; k++) /* each fused step's members are in its cluster; the others in none */
        for (int m = 0; m < nmembers[k] && m < 64; m++) assert_int_equal(cluster_of[members[k][m]], nmembers[k] >= 2 ? k : -1);
    free(seen), free(cluster_of);
    test_free(plan);
    ir_graph_free(ir);
    free(dot);
    alloy_graph_free(g);
}

/* The parts of an MLP's SGD training step, derived by hand: the 12 nodes of
 * the forward (inputs, parameters, two matmuls, two bias adds, relu, loss),
 * the gradients backward, the momentum and parameter updates update; and the
 * shapes the DOT gives each part. Without a loss every node is forward. */
static void test_parts_of_an_mlp_step_are_forward_backward_and_update(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("mlp");
    test_mlp m = build_mlp(g, ALLOY_F32, 4, 3, 5, 2);
    expect_ok(g, alloy_graph_set_loss(g, m.loss), "loss");
    expect_ok(g, alloy_graph_add_optimizer(g, alloy_sgd(0.1, 0.9, 0.0, false)), "sgd");
    compile(g);
    const ir_graph *c = g->compiled;
    uint8_t *part = test_malloc((size_t)c->nnodes);
    assert_int_equal(insp_parts(c, part), ALLOY_OK);
    int count[3] = {0};
    for (int i = 0; i < c->nnodes; i++) count[part[i]]++;
    assert_int_equal(count[INSP_FORWARD], 12);
    assert_int_equal(part[c->loss], INSP_FORWARD);
    static const char *const fwd[] = {"x", "targets", "w1", "b1", "w2", "b2", "logits", "loss"};
    for (int k = 0; k < 8; k++) assert_int_equal(part[ir_find_name(c, fwd[k])], INSP_FORWARD);
    int grads = 0;
    for (int o = 0; o < c->noutputs; o++)
        if (strncmp(c->outputs[o].name, "grad:", 5) == 0) {
            assert_int_equal(part[c->outputs[o].node], INSP_BACKWARD);
            grads++;
        }
    assert_int_equal(grads, 4);
    assert_true(count[INSP_BACKWARD] >= 4);
    assert_true(c->nupdates >= 8); /* four parameters and their momentum buffers */
    for (int u = 0; u < c->nupdates; u++) assert_int_equal(part[c->updates[u].node], INSP_UPDATE);
    char *dot = dump_text(g, ALLOY_DUMP_DOT);
    char want[64];
    snprintf(want, sizeof want, "n%d [label=\"%%loss cross_entropy\\n", c->loss);
    const char *loss = strstr(dot, want);
    assert_non_null(loss);
    assert_non_null(strstr(loss, "shape=box, style=\"rounded,filled\""));
    snprintf(want, sizeof want, "n%d [", c->outputs[ir_find_output(c, "grad:w1")].node);
    assert_non_null(strstr(strstr(dot, want), "style=\"filled,dashed\""));
    snprintf(want, sizeof want, "n%d [", c->updates[0].node);
    assert_non_null(strstr(strstr(dot, want), "shape=octagon"));
    free(dot);
    test_free(part);
    alloy_graph_free(g);

    g = alloy_graph_new("mlp");
    build_mlp(g, ALLOY_F32, 4, 3, 5, 2);
    compile(g);
    part = test_malloc((size_t)g->compiled->nnodes);
    assert_int_equal(insp_parts(g->compiled, part), ALLOY_OK);
    for (int i = 0; i < g->compiled->nnodes; i++) assert_int_equal(part[i], INSP_FORWARD);
    test_free(part);
    alloy_graph_free(g);
}

/* Graphviz's dot renders the DOT of the block's f16 step (with names that
 * need escaping) without a warning, a drawn node per IR node and a drawn
 * cluster per fused step. Skipped without Graphviz. */
static void test_graphviz_renders_the_dot_when_installed(void **state)
{
    (void)state;
    char dot_path[1024];
    if (!find_dot(dot_path, sizeof dot_path)) {
        print_message("skipped: Graphviz's dot is not on the PATH (apt-get install graphviz)\n");
        skip();
    }
    alloy_graph *g = block_step(ALLOY_F16);
    alloy_tensor *odd = alloy_set_name(g, alloy_tanh(g, alloy_graph_find(g, "logits")), "say \"hi\" \\ <b>&");
    expect_ok(g, alloy_output(g, "odd \"out\"", odd), "output");
    char *dot = dump_text(g, ALLOY_DUMP_DOT);
    FILE *f = fopen(test_tmp_path("g.dot"), "w");
    assert_non_null(f);
    fputs(dot, f);
    fclose(f);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' -Tsvg '%s' -o '%s' 2>'%s'", dot_path, test_tmp_path("g.dot"),
             test_tmp_path("g.svg"), test_tmp_path("err"));
    assert_int_equal(system(cmd), 0);
    size_t len;
    char *err = (char *)test_read_file(test_tmp_path("err"), &len);
    if (len) fail_msg("dot warned: %s", err);
    test_free(err);
    char *svg = (char *)test_read_file(test_tmp_path("g.svg"), &len);
    char why[128];
    if (!xml_balanced(strstr(svg, "<svg"), why, sizeof why)) fail_msg("dot's SVG: %s", why);
    int nodes = 0, clusters = 0, fused = 0;
    for (const char *p = svg; (p = strstr(p, "class=\"node\"")); p++) nodes++;
    for (const char *p = svg; (p = strstr(p, "class=\"cluster\"")); p++) clusters++;
    for (int k = 0; k < g->comp.sched.nsteps; k++) fused += g->comp.sched.steps[k].n >= 2;
    assert_int_equal(nodes, g->compiled->nnodes);
    assert_int_equal(clusters, fused);
    assert_non_null(strstr(svg, "say &quot;hi&quot; \\ &lt;b&gt;&amp;"));
    test_free(svg);
    free(dot);
    alloy_graph_free(g);
}

/* ---- the memory picture ---- */

/* A slot rectangle of the memory SVG, as its data attributes give it. */
typedef struct slot {
    long long node, first, last, off, bytes;
} slot;

static int by_offset(const void *a, const void *b)
{
    const slot *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
}

/* The memory SVG of char_gpt's step: well-formed, one slot rectangle per
 * value with arena bytes at its planned offset and size, spanning the steps
 * from its producer to its last reader; no two rectangles share bytes at a
 * step unless one writes in place over the other; the live-bytes curve is
 * the union of the live rectangles' bytes at every step (computed here);
 * the peak line at the first step where that is greatest, and that maximum
 * is the plan's peak. */
static void test_memory_svg_has_a_rect_per_slot_and_marks_the_peak(void **state)
{
    (void)state;
    alloy_graph *g = char_gpt_step();
    char *svg = dump_text(g, ALLOY_DUMP_MEMORY_SVG);
    char why[128];
    if (!xml_balanced(svg, why, sizeof why)) fail_msg("memory SVG: %s", why);
    const ir_graph *c = g->compiled;
    const mem_plan *plan = &g->comp.plan;
    const schedule *s = &g->comp.sched;
    int want = 0;
    /* a view (plan.h) is drawn as its owner, which lives until the last use of either */
    int *owner = calloc((size_t)c->nnodes + 1, sizeof *owner);
    assert_non_null(owner);
    for (int i = 0; i < c->nnodes; i++) owner[i] = plan->view_of && plan->view_of[i] >= 0 ? plan->view_of[i] : i;
    for (int i = 0; i < c->nnodes; i++)
        want += plan->offset[i] >= 0 && ir_nbytes(&c->nodes[i]->type) > 0 && owner[i] == i;
    slot *slots = calloc((size_t)want + 1, sizeof *slots);
    int n = 0;
    for (const char *p = svg; (p = strstr(p, "<rect class=\"slot\"")); p++) {
        assert_true(n < want);
        slot r = {attr_int(p, "data-node"), attr_int(p, "data-first"), attr_int(p, "data-last"),
                  attr_int(p, "data-offset"), attr_int(p, "data-bytes")};
        assert_true(r.node >= 0 && r.node < c->nnodes);
        const ir_node *node = c->nodes[r.node];
        assert_int_equal(r.off, plan->offset[r.node]);
        assert_int_equal(r.bytes, (ir_nbytes(&node->type) + 63) / 64 * 64);
        assert_int_equal(r.first, s->step_of[r.node]);
        long long last = r.first;
        for (int j = 0; j < c->nnodes; j++) {
            if (owner[j] == r.node && s->kept[j]) last = s->nsteps - 1;
            for (int k = 0; k < c->nodes[j]->nin; k++)
                if (owner[c->nodes[j]->in[k]] == r.node && s->step_of[j] > last) last = s->step_of[j];
        }
        assert_int_equal(r.last, last);
        slots[n++] = r;
    }
    assert_int_equal(n, want);
    assert_true(n > 100);
    /* live bytes per step: the union of the byte ranges of the rectangles live there */
    long long best = -1, peak_step = -1;
    long long *live = calloc((size_t)s->nsteps, sizeof *live);
    slot *at_step = calloc((size_t)n + 1, sizeof *at_step);
    for (int k = 0; k < s->nsteps; k++) {
        int m = 0;
        for (int q = 0; q < n; q++)
            if (slots[q].first <= k && k <= slots[q].last) at_step[m++] = slots[q];
        qsort(at_step, (size_t)m, sizeof *at_step, by_offset);
        long long bytes = 0, end = 0;
        for (int q = 0; q < m; q++) {
            long long lo = at_step[q].off > end ? at_step[q].off : end, hi = at_step[q].off + at_step[q].bytes;
            if (hi > lo) bytes += hi - lo, end = hi;
        }
        live[k] = bytes;
        if (bytes > best) best = bytes, peak_step = k;
    }
    free(at_step);
    assert_int_equal(best, (long long)plan->peak_live_bytes);
    /* no two live rectangles overlap, except a value written in place over its operand at the handover step */
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++) {
            const slot *x = &slots[a], *y = &slots[b];
            bool steps = x->first <= y->last && y->first <= x->last;
            bool bytes = x->off < y->off + y->bytes && y->off < x->off + x->bytes;
            if (!steps || !bytes) continue;
            bool inplace = x->off == y->off && x->bytes == y->bytes && (x->last == y->first || y->last == x->first);
            if (!inplace) fail_msg("values %%%lld and %%%lld share bytes while both live", x->node, y->node);
        }
    const char *curve = strstr(svg, "<polyline class=\"live\" data-live=\"");
    assert_non_null(curve);
    curve += strlen("<polyline class=\"live\" data-live=\"");
    for (int k = 0; k < s->nsteps; k++) { /* the drawn live bytes are the union at every step */
        char *next;
        long long v = strtoll(curve, &next, 10);
        if (v != live[k]) fail_msg("step %d: the picture says %lld live bytes, the rectangles %lld", k, v, live[k]);
        curve = next;
    }
    assert_int_equal(*curve, '"');
    const char *line = strstr(svg, "<line class=\"peak\"");
    assert_non_null(line);
    long long at = attr_int(line, "data-step");
    assert_true(at >= 0 && at < s->nsteps);
    assert_int_equal(live[at], best);
    assert_int_equal(attr_int(line, "data-bytes"), best);
    assert_int_equal(at, peak_step); /* the first step at the peak */
    int scratch = 0;
    for (const char *p = svg; (p = strstr(p, "<rect class=\"scratch\"")); p++) scratch++;
    assert_int_equal(scratch, plan->scratch_bytes > 0);
    free(live), free(slots), free(svg), free(owner);
    alloy_graph_free(g);
}

/* Names with XML's special characters stay well-formed in the memory SVG. */
static void test_memory_svg_escapes_names(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("a<b>&'c'");
    alloy_tensor *x = alloy_input(g, "x", ALLOY_F32, 1, DIMS(8));
    alloy_tensor *y = alloy_set_name(g, alloy_exp(g, alloy_tanh(g, x)), "y<&>\"'");
    expect_ok(g, alloy_output(g, "y", y), "output"); /* kept: it has a slot */
    expect_ok(g, alloy_output(g, "z", alloy_mul(g, y, y)), "output");
    char *svg = dump_text(g, ALLOY_DUMP_MEMORY_SVG);
    char why[128];
    if (!xml_balanced(svg, why, sizeof why)) fail_msg("memory SVG: %s\n%s", why, svg);
    assert_non_null(strstr(svg, "%y&lt;&amp;&gt;&quot;&apos; exp"));
    free(svg);
    alloy_graph_free(g);
}

/* alloy_graph_dump with a kind it does not know is an error saying so, and writes nothing. */
static void test_dump_of_an_unknown_kind_is_an_error(void **state)
{
    (void)state;
    alloy_graph *g = alloy_graph_new("mlp");
    build_mlp(g, ALLOY_F32, 4, 3, 5, 2);
    FILE *f = fopen(test_tmp_path("out"), "w");
    assert_non_null(f);
    assert_int_equal(alloy_graph_dump(g, f, (alloy_dump_kind)99), ALLOY_ERR_INVALID);
    assert_non_null(strstr(alloy_last_error(g), "unknown kind 99"));
    assert_int_equal(ftell(f), 0);
    fclose(f);
    alloy_graph_free(g);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, test_tmpdir_setup, test_tmpdir_teardown)
    const struct CMUnitTest tests[] = {
        T(test_every_stage_of_the_char_gpt_step_is_a_numbered_file_that_parses_back),
        T(test_every_stage_of_a_transformer_block_step_parses_back),
        T(test_a_disabled_pass_leaves_no_stale_dump),
        T(test_a_dump_dir_that_cannot_be_made_fails_the_compile_naming_it),
        T(test_a_graph_name_becomes_a_safe_file_name),
        T(test_time_passes_prints_each_pass_with_its_node_count),
        T(test_dot_has_a_node_per_ir_node_and_a_cluster_per_fused_step),
        T(test_parts_of_an_mlp_step_are_forward_backward_and_update),
        T(test_graphviz_renders_the_dot_when_installed),
        T(test_memory_svg_has_a_rect_per_slot_and_marks_the_peak),
        T(test_memory_svg_escapes_names),
        T(test_dump_of_an_unknown_kind_is_an_error),
    };
    return cmocka_run_group_tests_name("inspect", tests, NULL, NULL);
}
