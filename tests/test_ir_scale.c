/* test_ir_scale.c - reading big IR texts: memory and time grow linearly with the text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ir/ir.h"
#include "support.h"

/* ---- an allocator that counts live bytes and refuses past a limit ---- */

static size_t live, peak, limit;

/* Every block carries its size in a 16-byte header, so a realloc or free
 * knows how many bytes it gives back. */
static void *counting_realloc(void *ptr, size_t size, void *user)
{
    (void)user;
    size_t old = 0;
    unsigned char *base = ptr ? (unsigned char *)ptr - 16 : NULL;
    if (base) memcpy(&old, base, sizeof old);
    if (size == 0) {
        free(base);
        live -= old;
        return NULL;
    }
    if (size > limit || live - old + size > limit) return NULL;
    unsigned char *b = realloc(base, size + 16);
    if (!b) return NULL;
    memcpy(b, &size, sizeof size);
    live = live - old + size;
    if (live > peak) peak = live;
    return b + 16;
}

/* ---- generated texts ---- */

typedef struct text {
    char *s;
    size_t len, cap;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        assert_true(n >= 0);
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        t->cap = t->cap * 2 + (size_t)n + 1;
        t->s = realloc(t->s, t->cap);
        assert_non_null(t->s);
    }
}

/* A valid graph of n parameters, n states and n additions (quoted names,
 * string attributes), an output and an update for each, and one fusion
 * group of every addition and a found_inf of them all (a multi group):
 * what a big training step prints. */
static text training_like(int n)
{
    text t = {0};
    put(&t, "graph \"big step\" {\n  %%x = input : f32[4]\n");
    for (int i = 0; i < n; i++)
        put(&t,
            "  %%\"layer.%d.weight\" = param {init=\"normal\", std=0.02} : f32[4]\n"
            "  %%\"layer.%d.weight.m\" = state {init=\"zeros\"} : f32[4]\n"
            "  %%\"sum:%d\" = add(%%x, %%\"layer.%d.weight\") : f32[4] !group=0\n",
            i, i, i, i);
    put(&t, "  %%found = found_inf(");
    for (int i = 0; i < n; i++) put(&t, "%s%%\"sum:%d\"", i ? ", " : "", i);
    put(&t, ") : bool[] !group=0\n  output \"found\" = %%found\n");
    for (int i = 0; i < n; i++)
        put(&t, "  output \"grad:layer.%d.weight\" = %%\"sum:%d\"\n  update \"layer.%d.weight.m\" = %%\"sum:%d\"\n", i,
            i, i, i);
    put(&t, "}\n");
    return t;
}

/* Parses t under the counting allocator (refusing past `cap` live bytes);
 * whether it parsed (the graph checked and freed here). */
static bool parse_counted(const text *t, size_t cap, char *err, size_t errlen)
{
    live = peak = 0;
    limit = cap;
    alloy_set_allocator(counting_realloc, NULL);
    ir_graph *g = ir_parse(t->s, t->len, "big.ir", err, errlen);
    bool ok = g != NULL;
    if (g) {
        assert_int_equal(ir_verify(g), ALLOY_OK);
        assert_string_equal(g->name, "big step");
        assert_int_equal(g->noutputs, g->nupdates + 1);
    }
    ir_graph_free(g);
    alloy_set_allocator(NULL, NULL);
    assert_int_equal(live, 0); /* everything given back */
    return ok;
}

static void a_multi_megabyte_text_parses_in_memory_linear_in_its_size(void **state)
{
    (void)state;
    text t = training_like(16000); /* about 3.5 MB */
    assert_true(t.len > (size_t)3 << 20);
    char err[512] = "";
    /* the graph holds each line's node, type and names in about 6 bytes per
     * byte of text; a reader that reserved the rest of the file for each
     * string needed 2.17 GB for a 1.6 MB training step */
    size_t cap = 24 * t.len;
    if (!parse_counted(&t, cap, err, sizeof err))
        fail_msg("%zu bytes of IR did not parse in %zu bytes: %s", t.len, cap, err);
    print_message("# %zu bytes of IR text: peak %zu bytes (%.1f per byte of text)\n", t.len, peak,
                  (double)peak / (double)t.len);
    free(t.s);
}

/* The parts of a text that once cost time quadratic in their number: n
 * outputs (each name compared with every earlier one), n updates (likewise),
 * or one fusion group of n members (each operand looked for among the
 * earlier members), and little else. */
static text many_of(int what, int n)
{
    text t = {0};
    put(&t, "graph g {\n  %%x = input : f32[2]\n");
    for (int i = 0; what == 1 && i < n; i++) put(&t, "  %%s%d = state {init=\"zeros\"} : f32[2]\n", i);
    for (int i = 0; what == 2 && i < n; i++) put(&t, "  %%%d = add(%%x, %%x) : f32[2] !group=0\n", i + 1);
    if (what == 2) {
        put(&t, "  %%0 = found_inf(");
        for (int i = 0; i < n; i++) put(&t, "%s%%%d", i ? ", " : "", i + 1);
        put(&t, ") : bool[] !group=0\n");
    }
    for (int i = 0; what == 0 && i < n; i++) put(&t, "  output \"out.%d\" = %%x\n", i);
    for (int i = 0; what == 1 && i < n; i++) put(&t, "  update \"s%d\" = %%x\n", i);
    put(&t, "}\n");
    return t;
}

/* Parses t (the C library's allocator) and returns the milliseconds it took. */
static double parse_ms(const text *t)
{
    char err[512] = "";
    double t0 = test_now_ms();
    ir_graph *g = ir_parse(t->s, t->len, "many.ir", err, sizeof err);
    double ms = test_now_ms() - t0;
    if (!g) fail_msg("%s", err);
    ir_graph_free(g);
    return ms;
}

static void parsing_time_grows_linearly_with_outputs_updates_and_group_members(void **state)
{
    (void)state;
    static const char *const what[] = {"outputs", "updates", "members of one fusion group"};
    /* each at n and 8n: a linear reader takes about 8x as long (up to 12x
     * where the bigger graph falls out of the caches), a quadratic one 64x;
     * the 100 ms allow for a machine that is busy with other work */
    for (int w = 0; w < 3; w++) {
        int n = w == 2 ? 6000 : 4000;
        text small = many_of(w, n), big = many_of(w, 8 * n);
        double ts = 1e30, tb = 1e30;
        for (int rep = 0; rep < 3; rep++) { /* the best of three */
            double a = parse_ms(&small), b = parse_ms(&big);
            ts = a < ts ? a : ts;
            tb = b < tb ? b : tb;
        }
        print_message("# %d %s: %.1f ms; %d: %.1f ms\n", n, what[w], ts, 8 * n, tb);
        if (tb > 24 * ts + 100)
            test_case_failed("%d %s took %.1f ms against %.1f ms for %d: worse than linear", 8 * n, what[w], tb, ts,
                             n);
        free(small.s);
        free(big.s);
    }
    test_end_cases();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_multi_megabyte_text_parses_in_memory_linear_in_its_size),
        cmocka_unit_test(parsing_time_grows_linearly_with_outputs_updates_and_group_members),
    };
    return cmocka_run_group_tests_name("ir_scale", tests, NULL, NULL);
}
