/* alloyc_graph.c - what alloyc's commands share (alloyc.c and alloyc_train.c): the error line, loading the IR, the options, the loss and the optimizer of the command line. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "alloyc.h"

int alloyc_vfail(int code, const char *fmt, va_list ap)
{
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    for (char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = ' ';
    fflush(stdout);
    fprintf(stderr, "alloyc: %s\n", msg);
    return code;
}

/* alloyc_vfail with the arguments given (alloyc.h). */
int alloyc_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = alloyc_vfail(code, fmt, ap);
    va_end(ap);
    return rc;
}

/* The library's messages name its API where alloyc has a flag for the
 * same thing: said in alloyc's terms instead (first match of each). */
static const struct {
    const char *api, *cli;
} api_words[] = {
    {"set_option: print_after=", "--print-after="},
    {"set_option: print_before=", "--print-before="},
    {"set_option: ", "--set "},
    {"set_grad_scaler: ", "--scaler: "},
    {"set_loss: ", ""},
    {"(alloy_graph_set_loss)", "(a 'loss' line in the IR file, or --loss NAME)"},
    {"(alloy_graph_set_grad_scaler)", "(--scaler)"},
    {"(alloy_graph_add_optimizer)", "(--optimizer)"},
    {"or set no scaler", "or give --scaler=none"},
    {"or no scaler", "or give --scaler=none"},
    {"use alloy_graph_load_params", "use --params"},
};

const char *alloyc_graph_error(const alloy_graph *g, alloy_status st)
{
    static char said[8192];
    const char *msg = alloy_last_error(g);
    if (!msg || !*msg) return alloy_status_name(st);
    snprintf(said, sizeof said, "%s", msg);
    for (size_t i = 0; i < sizeof api_words / sizeof *api_words; i++) {
        char *at = strstr(said, api_words[i].api);
        if (!at) continue;
        char rest[8192];
        snprintf(rest, sizeof rest, "%s", at + strlen(api_words[i].api));
        snprintf(at, sizeof said - (size_t)(at - said), "%s%s", api_words[i].cli, rest);
    }
    return said;
}

/* (alloy_graph_load_ir caps the size it reads.) */
alloy_graph *alloyc_load_graph(const char *path)
{
    char err[1024] = "";
    alloy_graph *g = alloy_graph_load_ir(path, err, sizeof err);
    if (!g) alloyc_fail(EXIT_ERROR, "%s", err[0] ? err : "cannot parse the IR file");
    return g;
}

alloy_status alloyc_apply_sets(alloy_graph *g, const options *o)
{
    alloy_status st = ALLOY_OK;
    if (o->time_passes) st = alloy_graph_set_option(g, "time_passes", "1");
    if (!st && o->dump_dir) st = alloy_graph_set_option(g, "dump_dir", o->dump_dir);
    if (st) return st;
    for (int i = 0; i < o->nsets; i++) {
        char name[64];
        size_t n = strcspn(o->sets[i], "=");
        snprintf(name, sizeof name, "%.*s", (int)(n < 63 ? n : 63), o->sets[i]);
        st = alloy_graph_set_option(g, name, o->sets[i] + n + 1);
        if (st) return st;
    }
    return ALLOY_OK;
}

alloy_optimizer alloyc_optimizer(const options *o)
{
    const char *kind = o->optimizer ? o->optimizer : "adamw";
    double lr = o->have_lr ? o->lr : 1e-3;
    alloy_optimizer opt = strcmp(kind, "sgd") == 0    ? alloy_sgd(lr, o->have_momentum ? o->momentum : 0.9, 0.0, false)
                          : strcmp(kind, "adam") == 0 ? alloy_adam(lr, 0.9, 0.999, 1e-8, 0.0)
                                                      : alloy_adamw(lr, 0.9, 0.999, 1e-8, 0.01);
    if (o->have_weight_decay) opt.weight_decay = o->weight_decay;
    if (o->have_clip_norm) opt.clip_norm = o->clip_norm;
    return opt;
}

int alloyc_set_loss(alloy_graph *g, const options *o)
{
    alloy_tensor *loss = alloy_graph_find(g, o->loss);
    if (!loss) return alloyc_fail(EXIT_ERROR, "--loss %s: %s has no node named '%s'", o->loss, o->ir_path, o->loss);
    alloy_status st = alloy_graph_set_loss(g, loss);
    if (st) return alloyc_fail(EXIT_ERROR, "--loss %s: %s", o->loss, alloyc_graph_error(g, st));
    return 0;
}
