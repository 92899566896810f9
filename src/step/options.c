/* options.c - parsing, printing and hashing the options struct; every name and value checked against what exists. */
#include <stdlib.h>
#include <string.h>

#include "ir/groups.h"
#include "step/options.h"
#include "step/pipeline.h"

const opt_key opt_keys[] = {
    {"print_after", "ALLOY_PRINT_AFTER", "pass names separated by commas, or all"},
    {"print_before", "ALLOY_PRINT_BEFORE", "pass names separated by commas, or all"},
    {"disable_passes", "ALLOY_DISABLE_PASSES", "pass names separated by commas"},
    {"no_fuse", "ALLOY_NO_FUSE", "fusion kinds row, gemm, multi separated by commas, or 1 (or all) for no fusion"},
    {"amp_log", "ALLOY_AMP_LOG", "0 or 1"},
    {"amp_check", "ALLOY_AMP_CHECK", "0 or 1"},
    {"amp_stats", "ALLOY_AMP_STATS", "0 or 1"},
    {"amp_ranges", "ALLOY_AMP_RANGES", "a range statistics file (alloy_graph_save_amp_stats)"},
    {"amp_range_margin", "ALLOY_AMP_RANGE_MARGIN", "a factor from 1 to 65536 (default 2)"},
    {"no_arena", "ALLOY_NO_ARENA", "0 or 1"},
    {"blas", "ALLOY_BLAS", "0 or 1"},
    {"num_threads", "ALLOY_NUM_THREADS", "a thread count from 1 to 64"},
    {"lowp_gemm", "ALLOY_LOWP_GEMM", "auto, avx512_bf16, avx512, avx2, portable or sgemm"},
    {"device", "ALLOY_DEVICE", "auto, cpu or cuda"},
    {"cache", "ALLOY_CACHE", "0 or 1"},
    {"cache_dir", "ALLOY_CACHE_DIR", "a directory"},
    {"dump_dir", "ALLOY_DUMP_DIR", "a directory"},
    {"nvrtc", "ALLOY_NVRTC", "the path of an NVRTC library (libnvrtc.so.13)"},
    {"cuda_graph", "ALLOY_CUDA_GRAPH", "0 or 1"},
    {"cuda_gemm_f32", "ALLOY_CUDA_GEMM_F32", "0 or 1"},
    {"cuda_device", "ALLOY_CUDA_DEVICE", "auto, or a GPU's ordinal from 0 to 1023"},
    {"nccl", "ALLOY_NCCL", "the path of an NCCL library (libnccl.so.2)"},
    {"time_passes", "ALLOY_TIME_PASSES", "0 or 1"},
    {"attention", "ALLOY_ATTENTION", "auto or always"},
    {"remat", "ALLOY_REMAT", "auto or always"},
    {"profile", "ALLOY_PROFILE", "0, or N: after every N-th run a table of each launch's time (1: every run)"},
    {NULL, NULL, NULL},
};

static const char *const device_names[] = {"auto", "cpu", "cuda"};
static const char *const lowp_gemm_names[OPT_LOWP_COUNT] = {"auto", "avx512_bf16", "avx512", "portable", "sgemm", "avx2"};
/* the fusion kinds a user may switch off (ew groups go only with all of them) */
static const ir_group_kind fuse_kinds[] = {IR_GROUP_ROW, IR_GROUP_GEMM, IR_GROUP_MULTI};

void opt_init(al_options *o)
{
    memset(o, 0, sizeof *o);
    o->blas = true;
    o->device = OPT_DEVICE_AUTO;
    o->cache = true;
    o->cuda_graph = true;
    o->cuda_device = -1;
}

/* The valid pass names, "a, b, c", into buf. */
static void list_passes(char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < pass_count() && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? ", " : "", pass_name(i));
}

/* Splits a comma list: calls item(word, len) for each non-empty word
 * (spaces around it dropped); stops at the first failure. */
static bool each_word(const char *list, bool (*item)(const char *w, size_t n, void *arg), void *arg)
{
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        const char *w = p;
        size_t wn = n;
        while (wn && (*w == ' ' || *w == '\t')) w++, wn--;
        while (wn && (w[wn - 1] == ' ' || w[wn - 1] == '\t')) wn--;
        if (wn && !item(w, wn, arg)) return false;
        p += n + (p[n] == ',');
    }
    return true;
}

typedef struct word_set {
    uint32_t bits;
    char bad[64];
} word_set;

static bool add_pass(const char *w, size_t n, void *arg)
{
    word_set *s = arg;
    for (int i = 0; i < pass_count(); i++)
        if (strlen(pass_name(i)) == n && strncmp(pass_name(i), w, n) == 0) {
            s->bits |= 1u << i;
            return true;
        }
    al_fmt(s->bad, sizeof s->bad, "%.*s", (int)(n < 60 ? n : 60), w);
    return false;
}

static bool add_kind(const char *w, size_t n, void *arg)
{
    word_set *s = arg;
    for (size_t i = 0; i < sizeof fuse_kinds / sizeof fuse_kinds[0]; i++) {
        const char *name = ir_group_kind_name(fuse_kinds[i]);
        if (strlen(name) == n && strncmp(name, w, n) == 0) {
            s->bits |= 1u << fuse_kinds[i];
            return true;
        }
    }
    al_fmt(s->bad, sizeof s->bad, "%.*s", (int)(n < 60 ? n : 60), w);
    return false;
}

static bool parse_bool(const char *v, bool *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(v, yes[i]) == 0) return *out = true, true;
        if (strcmp(v, no[i]) == 0) return *out = false, true;
    }
    return false;
}

/* A pass list option: "all" (when allowed) or known pass names. */
static alloy_status set_passes(uint32_t *bits, const char *name, const char *value, bool all_ok, char *err,
                               size_t errlen)
{
    if (all_ok && strcmp(value, "all") == 0) {
        *bits = pass_count() >= 32 ? 0xffffffffu : (1u << pass_count()) - 1;
        return ALLOY_OK;
    }
    word_set s = {0};
    if (!each_word(value, add_pass, &s)) {
        char valid[512];
        list_passes(valid, sizeof valid);
        al_fmt(err, errlen, "%s=%s: unknown pass '%s' (passes: %s%s)", name, value, s.bad, valid,
               all_ok ? "; or all" : "");
        return ALLOY_ERR_INVALID;
    }
    *bits = s.bits;
    return ALLOY_OK;
}

alloy_status opt_set(al_options *o, const char *name, const char *value, char *err, size_t errlen)
{
    if (!name || !value) {
        al_fmt(err, errlen, "option name or value is NULL");
        return ALLOY_ERR_INVALID;
    }
    al_options d;
    opt_init(&d);
    bool reset = !*value;
    if (strcmp(name, "print_after") == 0)
        return reset ? (o->print_after = 0, ALLOY_OK) : set_passes(&o->print_after, name, value, true, err, errlen);
    if (strcmp(name, "print_before") == 0)
        return reset ? (o->print_before = 0, ALLOY_OK) : set_passes(&o->print_before, name, value, true, err, errlen);
    if (strcmp(name, "disable_passes") == 0)
        return reset ? (o->disabled = 0, ALLOY_OK) : set_passes(&o->disabled, name, value, false, err, errlen);
    if (strcmp(name, "no_fuse") == 0) {
        bool all;
        if (reset || (parse_bool(value, &all) && !all)) return o->no_fuse = 0, ALLOY_OK;
        if (strcmp(value, "1") == 0 || strcmp(value, "all") == 0) return o->no_fuse = OPT_NO_FUSE_ALL, ALLOY_OK;
        word_set s = {0};
        if (!each_word(value, add_kind, &s)) {
            al_fmt(err, errlen, "no_fuse=%s: unknown fusion kind '%s' (kinds: row, gemm, multi; or 1 or all for no fusion)",
                   value, s.bad);
            return ALLOY_ERR_INVALID;
        }
        o->no_fuse = s.bits;
        return ALLOY_OK;
    }
    bool *flag = strcmp(name, "amp_log") == 0 ? &o->amp_log
                 : strcmp(name, "amp_check") == 0 ? &o->amp_check
                 : strcmp(name, "amp_stats") == 0 ? &o->amp_stats
                 : strcmp(name, "no_arena") == 0 ? &o->no_arena
                 : strcmp(name, "blas") == 0 ? &o->blas
                 : strcmp(name, "cache") == 0 ? &o->cache
                 : strcmp(name, "cuda_graph") == 0 ? &o->cuda_graph
                 : strcmp(name, "cuda_gemm_f32") == 0 ? &o->cuda_gemm_f32
                 : strcmp(name, "time_passes") == 0 ? &o->time_passes
                                             : NULL;
    if (flag) {
        bool def = flag == &o->amp_log    ? d.amp_log
                   : flag == &o->amp_check ? d.amp_check
                   : flag == &o->amp_stats ? d.amp_stats
                   : flag == &o->no_arena ? d.no_arena
                   : flag == &o->blas     ? d.blas
                   : flag == &o->cache    ? d.cache
                   : flag == &o->time_passes ? d.time_passes
                   : flag == &o->cuda_gemm_f32 ? d.cuda_gemm_f32
                                          : d.cuda_graph;
        if (reset) return *flag = def, ALLOY_OK;
        if (parse_bool(value, flag)) return ALLOY_OK;
        al_fmt(err, errlen, "%s=%s: not a boolean (0 or 1)", name, value);
        return ALLOY_ERR_INVALID;
    }
    if (strcmp(name, "profile") == 0) {
        if (reset) return o->profile = 0, ALLOY_OK;
        bool on;
        if (parse_bool(value, &on)) return o->profile = on, ALLOY_OK;
        char *end;
        long v = strtol(value, &end, 10);
        if (*end || v < 0 || v > 1000000) {
            al_fmt(err, errlen, "profile=%s: not 0 or a run count N from 1 to 1000000 (a table after every N-th run)",
                   value);
            return ALLOY_ERR_INVALID;
        }
        o->profile = (int)v;
        return ALLOY_OK;
    }
    if (strcmp(name, "amp_range_margin") == 0) {
        if (reset) return o->amp_range_margin = 0, ALLOY_OK;
        char *end;
        double v = strtod(value, &end);
        if (*end || end == value || !(v >= 1 && v <= 65536)) {
            al_fmt(err, errlen, "amp_range_margin=%s: not a factor from 1 to 65536", value);
            return ALLOY_ERR_INVALID;
        }
        o->amp_range_margin = v;
        return ALLOY_OK;
    }
    if (strcmp(name, "cuda_device") == 0) {
        if (reset || strcmp(value, "auto") == 0) return o->cuda_device = d.cuda_device, ALLOY_OK;
        char *end;
        long v = strtol(value, &end, 10);
        if (*end || end == value || v < 0 || v > 1023) {
            al_fmt(err, errlen, "cuda_device=%s: not auto or a GPU's ordinal from 0 to 1023", value);
            return ALLOY_ERR_INVALID;
        }
        o->cuda_device = (int)v;
        return ALLOY_OK;
    }
    if (strcmp(name, "num_threads") == 0) {
        if (reset) return o->num_threads = 0, ALLOY_OK;
        char *end;
        long v = strtol(value, &end, 10);
        if (*end || v < 1 || v > 64) {
            al_fmt(err, errlen, "num_threads=%s: not a thread count from 1 to 64", value);
            return ALLOY_ERR_INVALID;
        }
        o->num_threads = (int)v;
        return ALLOY_OK;
    }
    char *path = strcmp(name, "cache_dir") == 0  ? o->cache_dir
                 : strcmp(name, "dump_dir") == 0 ? o->dump_dir
                 : strcmp(name, "nvrtc") == 0    ? o->nvrtc
                 : strcmp(name, "nccl") == 0     ? o->nccl
                 : strcmp(name, "amp_ranges") == 0 ? o->amp_ranges
                                                 : NULL;
    if (path) {
        size_t n = strlen(value);
        if (n >= OPT_PATH_MAX) {
            al_fmt(err, errlen, "%s=%.60s...: a path of %zu bytes (at most %d)", name, value, n, OPT_PATH_MAX - 1);
            return ALLOY_ERR_INVALID;
        }
        memset(path, 0, OPT_PATH_MAX); /* NUL-padded, so opt_print's memcmp sees a reset as the default */
        memcpy(path, value, n);
        return ALLOY_OK;
    }
    if (strcmp(name, "lowp_gemm") == 0) {
        if (reset) return o->lowp_gemm = d.lowp_gemm, ALLOY_OK;
        for (int i = 0; i < OPT_LOWP_COUNT; i++)
            if (strcmp(value, lowp_gemm_names[i]) == 0) return o->lowp_gemm = (opt_lowp_gemm)i, ALLOY_OK;
        al_fmt(err, errlen, "lowp_gemm=%s: unknown kernel (auto, avx512_bf16, avx512, avx2, portable or sgemm)", value);
        return ALLOY_ERR_INVALID;
    }
    if (strcmp(name, "attention") == 0) {
        if (reset || strcmp(value, "auto") == 0) return o->attention_always = false, ALLOY_OK;
        if (strcmp(value, "always") == 0) return o->attention_always = true, ALLOY_OK;
        al_fmt(err, errlen, "attention=%s: unknown value (auto or always; disable_passes=attention rewrites none)", value);
        return ALLOY_ERR_INVALID;
    }
    if (strcmp(name, "remat") == 0) {
        if (reset || strcmp(value, "auto") == 0) return o->remat_always = false, ALLOY_OK;
        if (strcmp(value, "always") == 0) return o->remat_always = true, ALLOY_OK;
        al_fmt(err, errlen, "remat=%s: unknown value (auto or always; disable_passes=remat recomputes none)", value);
        return ALLOY_ERR_INVALID;
    }
    if (strcmp(name, "device") == 0) {
        for (int i = 0; i < 3; i++)
            if (strcmp(value, device_names[i]) == 0) return o->device = (opt_device)i, ALLOY_OK;
        if (reset) return o->device = d.device, ALLOY_OK;
        al_fmt(err, errlen, "device=%s: unknown device (auto, cpu or cuda)", value);
        return ALLOY_ERR_INVALID;
    }
    char names[512];
    size_t at = 0;
    for (const opt_key *k = opt_keys; k->name && at < sizeof names; k++)
        at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", k == opt_keys ? "" : ", ", k->name);
    al_fmt(err, errlen, "unknown option '%s' (options: %s)", name, names);
    return ALLOY_ERR_INVALID;
}

static void print_passes(FILE *out, const char *name, uint32_t bits)
{
    if (!bits) return;
    fprintf(out, " %s=", name);
    for (int i = 0, first = 1; i < pass_count(); i++)
        if (bits & 1u << i) fprintf(out, "%s%s", first ? "" : ",", pass_name(i)), first = 0;
}

void opt_print(const al_options *o, FILE *out)
{
    al_options d;
    opt_init(&d);
    if (memcmp(o, &d, sizeof d) == 0) {
        fputs("# options: defaults\n", out);
        return;
    }
    fputs("# options:", out);
    print_passes(out, "print_after", o->print_after);
    print_passes(out, "print_before", o->print_before);
    print_passes(out, "disable_passes", o->disabled);
    if (o->no_fuse == OPT_NO_FUSE_ALL) fputs(" no_fuse=all", out);
    else if (o->no_fuse) {
        fputs(" no_fuse=", out);
        for (size_t i = 0, first = 1; i < sizeof fuse_kinds / sizeof fuse_kinds[0]; i++)
            if (o->no_fuse & 1u << fuse_kinds[i]) fprintf(out, "%s%s", first ? "" : ",", ir_group_kind_name(fuse_kinds[i])), first = 0;
    }
    if (o->amp_log) fputs(" amp_log=1", out);
    if (o->amp_check) fputs(" amp_check=1", out);
    if (o->amp_stats) fputs(" amp_stats=1", out);
    if (o->amp_range_margin > 0) fprintf(out, " amp_range_margin=%g", o->amp_range_margin);
    if (o->no_arena) fputs(" no_arena=1", out);
    if (!o->blas) fputs(" blas=0", out);
    if (o->num_threads) fprintf(out, " num_threads=%d", o->num_threads);
    if (o->lowp_gemm != d.lowp_gemm) fprintf(out, " lowp_gemm=%s", lowp_gemm_names[o->lowp_gemm]);
    if (o->device != d.device) fprintf(out, " device=%s", device_names[o->device]);
    if (!o->cache) fputs(" cache=0", out);
    if (!o->cuda_graph) fputs(" cuda_graph=0", out);
    if (o->cuda_gemm_f32) fputs(" cuda_gemm_f32=1", out);
    if (o->cuda_device >= 0) fprintf(out, " cuda_device=%d", o->cuda_device);
    if (o->time_passes) fputs(" time_passes=1", out);
    if (o->attention_always) fputs(" attention=always", out);
    if (o->remat_always) fputs(" remat=always", out);
    if (o->profile) fprintf(out, " profile=%d", o->profile);
    if (o->cache_dir[0]) fprintf(out, " cache_dir=%s", o->cache_dir);
    if (o->dump_dir[0]) fprintf(out, " dump_dir=%s", o->dump_dir);
    if (o->nvrtc[0]) fprintf(out, " nvrtc=%s", o->nvrtc);
    if (o->nccl[0]) fprintf(out, " nccl=%s", o->nccl);
    if (o->amp_ranges[0]) fprintf(out, " amp_ranges=%s", o->amp_ranges);
    fputc('\n', out);
}

/* FNV-1a over the bytes of v. */
static uint64_t mix(uint64_t h, const void *v, size_t n)
{
    const unsigned char *p = v;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

uint64_t opt_hash(const al_options *o)
{
    uint64_t h = 0xcbf29ce484222325ull;
    uint32_t words[3] = {o->disabled, o->no_fuse, (uint32_t)o->device};
    uint8_t flags[2] = {o->no_arena, o->blas};
    h = mix(h, words, sizeof words);
    h = mix(h, flags, sizeof flags);
    /* mixed only when set, so every hash from before the option stays the same */
    if (o->lowp_gemm != OPT_LOWP_AUTO) h = mix(h, &(uint8_t){(uint8_t)o->lowp_gemm}, 1);
    if (o->attention_always) h = mix(h, "attention", 9);
    if (o->remat_always) h = mix(h, "remat", 5);
    if (o->cuda_gemm_f32) h = mix(h, "cuda_gemm_f32", 13); /* which gemm steps have a kernel */
    if (o->amp_ranges[0]) { /* the file's path and margin; its contents are the caller's to add */
        h = mix(h, o->amp_ranges, strlen(o->amp_ranges));
        h = mix(h, &o->amp_range_margin, sizeof o->amp_range_margin);
    }
    return h;
}
