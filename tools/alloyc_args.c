/* alloyc_args.c - the command line of alloyc: its flags, the commands that take each, and the checks on their values. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloyc.h"

/* A usage error: the message, a pointer to --help, exit status 2. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return alloyc_fail(EXIT_USAGE, "%s (see alloyc --help)", msg);
}

/* ---- command line ---- */

static const char *const emit_names[] = {"ir", "dot", "svg", "memory-svg"};

/* Matches argv[*i] against --flag and --flag=VALUE. Returns 1 and sets
 * *value on a match, 0 when argv[*i] is another argument, -1 when the value
 * is missing. */
static int take_value(int argc, char **argv, int *i, const char *flag, const char **value)
{
    const char *arg = argv[*i];
    size_t n = strlen(flag);
    if (strncmp(arg, flag, n) != 0) return 0;
    if (arg[n] == '=') {
        *value = arg + n + 1;
        return 1;
    }
    if (arg[n] != '\0') return 0;
    if (*i + 1 >= argc) return -1;
    *value = argv[++*i];
    return 1;
}

static bool parse_seed(const char *text, uint64_t *out)
{
    if (!(*text >= '0' && *text <= '9')) return false; /* strtoull takes "-1" and " 1" */
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end) return false;
    *out = (uint64_t)v;
    return true;
}

/* A hyper-parameter: a finite number >= 0 written whole ("1e-3", "0.9"). */
static bool parse_rate(const char *text, double *out)
{
    if (!((*text >= '0' && *text <= '9') || *text == '.')) return false; /* no sign, space, nan or inf */
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno == ERANGE && v != 0) return false; /* overflow; underflow to 0 reads as 0 */
    if (*end || !isfinite(v)) return false;
    *out = v;
    return true;
}

/* A count in [min, max] written in decimal. */
static bool parse_count(const char *text, long min, long max, long *out)
{
    uint64_t v;
    if (!parse_seed(text, &v) || v < (uint64_t)min || v > (uint64_t)max) return false;
    *out = (long)v;
    return true;
}

bool alloyc_scaler(const char *text, alloy_grad_scaler *out, char *why, size_t whylen)
{
    size_t head = strcspn(text, ",");
    alloy_grad_scaler s = alloy_dynamic_scaler();
    double v;
    char num[64];
    if (head == 7 && strncmp(text, "dynamic", 7) == 0) {
    } else if (head > 7 && head - 7 < sizeof num && strncmp(text, "static:", 7) == 0) {
        memcpy(num, text + 7, head - 7), num[head - 7] = '\0';
        if (!parse_rate(num, &v) || v <= 0) {
            snprintf(why, whylen, "--scaler static:SCALE wants a finite number > 0, got '%s'", text);
            return false;
        }
        s = alloy_static_scaler(v);
    } else {
        snprintf(why, whylen, "--scaler wants dynamic, static:SCALE or none, then ,KEY=VALUE options; got '%s'", text);
        return false;
    }
    for (const char *p = text + head; *p == ',';) {
        p++;
        size_t len = strcspn(p, ",");
        char item[96];
        if (len >= sizeof item) len = sizeof item - 1;
        memcpy(item, p, len), item[len] = '\0';
        p += strcspn(p, ",");
        char *eq = strchr(item, '=');
        const char *val = eq ? eq + 1 : "";
        if (eq) *eq = '\0';
        long n;
        bool ok = true;
        if (strcmp(item, "min_scale") == 0) ok = parse_rate(val, &s.min_scale);
        else if (strcmp(item, "hysteresis") == 0) ok = parse_count(val, 0, INT32_MAX, &n) && (s.hysteresis = (int)n, 1);
        else if (strcmp(item, "max_consecutive_skips") == 0)
            ok = parse_count(val, 0, INT32_MAX, &n) && (s.max_consecutive_skips = (int)n, 1);
        else if (strcmp(item, "stop_at_min_scale") == 0) ok = !eq, s.stop_at_min_scale = true;
        else {
            snprintf(why, whylen, "--scaler: unknown option '%s' (min_scale=S, hysteresis=N, max_consecutive_skips=N, "
                     "stop_at_min_scale)", item);
            return false;
        }
        if (!ok) {
            snprintf(why, whylen, "--scaler: bad value for '%s' in '%s'", item, text);
            return false;
        }
    }
    *out = s;
    return true;
}

/* The commands, as bits of the options each takes. */
enum { CMD_PRINT = 1, CMD_RUN = 2, CMD_COMPILE = 4, CMD_TRAIN = 8, CMD_COST = 16, CMD_AMP_REPORT = 32, CMD_ALL = 63 };
enum { COMMAND_COUNT = 6 };
static const char *const command_names[COMMAND_COUNT] = {"print", "run", "compile", "train", "cost", "amp-report"};

/* The options that take a value, and the commands that take each. */
enum { F_FEED, F_FETCH, F_PARAMS, F_SEED, F_OUT, F_AMP, F_OPTIMIZER, F_SCALER, F_PRINT_AFTER, F_PRINT_BEFORE, F_SET,
       F_ARCH, F_EMIT, F_DUMP_DIR, F_LR, F_WEIGHT_DECAY, F_MOMENTUM, F_CLIP_NORM, F_LOSS, F_STEPS, F_CHECKPOINT,
       F_SAVE_EVERY, F_LOG_EVERY, F_SAVE_PARAMS, F_AMP_STATS, F_DEVICE, F_CALIBRATE, F_TOP, F_STATS, F_COUNT };
static const struct {
    const char *name, *alias;
    unsigned commands;
} value_flags[F_COUNT] = {
    [F_FEED] = {"--feed", NULL, CMD_RUN | CMD_TRAIN},
    [F_FETCH] = {"--fetch", NULL, CMD_RUN},
    [F_PARAMS] = {"--params", NULL, CMD_RUN | CMD_TRAIN},
    [F_SEED] = {"--seed", NULL, CMD_RUN | CMD_COMPILE | CMD_TRAIN},
    [F_OUT] = {"--out", "-o", CMD_RUN | CMD_COMPILE},
    [F_AMP] = {"--amp", NULL, CMD_ALL},
    [F_OPTIMIZER] = {"--optimizer", NULL, CMD_PRINT | CMD_COMPILE | CMD_TRAIN | CMD_COST | CMD_AMP_REPORT},
    [F_SCALER] = {"--scaler", NULL, CMD_PRINT | CMD_COMPILE | CMD_TRAIN | CMD_COST | CMD_AMP_REPORT},
    [F_LR] = {"--lr", NULL, CMD_PRINT | CMD_COMPILE | CMD_TRAIN | CMD_COST | CMD_AMP_REPORT},
    [F_WEIGHT_DECAY] = {"--weight-decay", NULL, CMD_PRINT | CMD_COMPILE | CMD_TRAIN | CMD_COST | CMD_AMP_REPORT},
    [F_MOMENTUM] = {"--momentum", NULL, CMD_PRINT | CMD_COMPILE | CMD_TRAIN | CMD_COST | CMD_AMP_REPORT},
    [F_CLIP_NORM] = {"--clip-norm", NULL, CMD_PRINT | CMD_COMPILE | CMD_TRAIN | CMD_COST | CMD_AMP_REPORT},
    [F_LOSS] = {"--loss", NULL, CMD_ALL},
    [F_STEPS] = {"--steps", NULL, CMD_TRAIN},
    [F_CHECKPOINT] = {"--checkpoint", NULL, CMD_TRAIN},
    [F_SAVE_EVERY] = {"--save-every", NULL, CMD_TRAIN},
    [F_SAVE_PARAMS] = {"--save-params", NULL, CMD_TRAIN},
    [F_AMP_STATS] = {"--amp-stats", NULL, CMD_TRAIN},
    [F_LOG_EVERY] = {"--log-every", NULL, CMD_TRAIN},
    [F_PRINT_AFTER] = {"--print-after", NULL, CMD_PRINT | CMD_COMPILE},
    [F_PRINT_BEFORE] = {"--print-before", NULL, CMD_PRINT | CMD_COMPILE},
    [F_SET] = {"--set", NULL, CMD_ALL},
    [F_ARCH] = {"--arch", NULL, CMD_COMPILE | CMD_COST},
    [F_DEVICE] = {"--device", NULL, CMD_COST},
    [F_CALIBRATE] = {"--calibrate", NULL, CMD_COST},
    [F_TOP] = {"--top", NULL, CMD_COST},
    [F_STATS] = {"--stats", NULL, CMD_AMP_REPORT},
    [F_EMIT] = {"--emit", NULL, CMD_PRINT | CMD_COMPILE},
    [F_DUMP_DIR] = {"--dump-dir", NULL, CMD_ALL},
};

/* Remembers the first option the command does not take (reported once the
 * command line is read, after the errors of its values). */
static void note_option(options *o, unsigned command, const char *name, unsigned commands)
{
    if (!(commands & command) && !o->misplaced) {
        o->misplaced = name;
        o->misplaced_commands = commands;
    }
}

/* Whether list is sm_XY[,sm_XY...]: compute capabilities from 10 to 9999,
 * no leading zero, none twice (the library checks again; here it is a
 * usage error). */
static bool valid_archs(const char *list)
{
    int seen[16], n = 0;
    for (const char *p = list;;) {
        size_t len = strcspn(p, ",");
        if (len < 5 || len > 7 || strncmp(p, "sm_", 3) != 0 || p[3] == '0' || n == 16) return false;
        int sm = 0;
        for (size_t i = 3; i < len; i++) {
            if (p[i] < '0' || p[i] > '9') return false;
            sm = sm * 10 + (p[i] - '0');
        }
        for (int i = 0; i < n; i++)
            if (seen[i] == sm) return false;
        seen[n++] = sm;
        if (!p[len]) return true;
        p += len + 1;
    }
}

/* Fills o from argv; returns 0, or an exit code after printing (help,
 * version or a usage error). *done is set when the program should exit. */
int alloyc_parse_args(int argc, char **argv, options *o, bool *done)
{
    *done = true;
    if (argc < 2) return usage_error("no command given");
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0) {
        alloyc_print_usage();
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("alloyc %d.%d.%d\n", ALLOY_VERSION_MAJOR, ALLOY_VERSION_MINOR, ALLOY_VERSION_PATCH);
        return 0;
    }
    unsigned command = 0;
    for (int c = 0; c < COMMAND_COUNT; c++)
        if (strcmp(cmd, command_names[c]) == 0) command = 1u << c;
    if (!command) {
        if (cmd[0] == '-') return usage_error("unknown option '%s'", cmd);
        return usage_error("unknown command '%s' (commands: print, run, compile, train, cost, amp-report)", cmd);
    }
    o->command = cmd;
    o->feeds = calloc((size_t)argc, sizeof *o->feeds);
    o->fetches = calloc((size_t)argc, sizeof *o->fetches);
    o->sets = calloc((size_t)argc, sizeof *o->sets);
    if (!o->feeds || !o->fetches || !o->sets) return alloyc_fail(EXIT_ERROR, "out of memory");
    bool emit = false;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i], *value = NULL;
        int got;
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            alloyc_print_usage();
            return 0;
        }
        if (strcmp(arg, "--version") == 0) {
            printf("alloyc %d.%d.%d\n", ALLOY_VERSION_MAJOR, ALLOY_VERSION_MINOR,
                   ALLOY_VERSION_PATCH);
            return 0;
        }
        if (strcmp(arg, "--train") == 0) {
            o->train = true;
            note_option(o, command, arg, CMD_PRINT | CMD_COMPILE | CMD_COST | CMD_AMP_REPORT);
            continue;
        }
        if (strcmp(arg, "--time-passes") == 0) {
            o->time_passes = true;
            continue;
        }
        if (strcmp(arg, "--all") == 0) {
            o->all = true;
            note_option(o, command, arg, CMD_COST);
            continue;
        }
        if (strcmp(arg, "--data-parallel") == 0) {
            o->data_parallel = true;
            note_option(o, command, arg, CMD_TRAIN);
            continue;
        }
        if (strcmp(arg, "--zero") == 0) {
            o->zero = true;
            note_option(o, command, arg, CMD_TRAIN);
            continue;
        }
        if (strcmp(arg, "--with-state") == 0) {
            o->with_state = true;
            note_option(o, command, arg, CMD_COMPILE);
            continue;
        }
        int which = -1;
        const char *given = NULL; /* the spelling used: --out or -o */
        for (int f = 0; f < F_COUNT && which < 0; f++) {
            for (int a = 0; a < 2 && which < 0; a++) {
                const char *name = a ? value_flags[f].alias : value_flags[f].name;
                if (!name) continue;
                got = take_value(argc, argv, &i, name, &value);
                if (got < 0) return usage_error("%s needs a value", name);
                if (got > 0) which = f, given = name;
            }
        }
        if (which >= 0) {
            note_option(o, command, given, value_flags[which].commands);
            if (!*value) return usage_error("%s needs a non-empty value", given);
        }
        switch (which) {
        case F_FEED:
            if (value[0] == '=') return usage_error("--feed '%s': the input name before '=' is empty", value);
            o->feeds[o->nfeeds++] = value;
            break;
        case F_FETCH:
            for (int k = 0; k < o->nfetches; k++)
                if (strcmp(o->fetches[k], value) == 0)
                    return usage_error("--fetch '%s' is given twice", value);
            o->fetches[o->nfetches++] = value;
            break;
        case F_PARAMS:
            if (o->params) return usage_error("--params is given twice");
            o->params = value;
            break;
        case F_SEED:
            if (o->have_seed) return usage_error("--seed is given twice");
            if (!parse_seed(value, &o->seed))
                return usage_error("--seed wants an integer in [0, 2^64), got '%s'", value);
            o->have_seed = true;
            break;
        case F_OUT:
            if (o->out) return usage_error("--out is given twice");
            o->out = value;
            break;
        case F_AMP:
            if (strcmp(value, "f16") == 0 || strcmp(value, "fp16") == 0) o->amp = ALLOY_F16;
            else if (strcmp(value, "bf16") == 0) o->amp = ALLOY_BF16;
            else if (strcmp(value, "off") == 0 || strcmp(value, "f32") == 0) o->amp = ALLOY_F32;
            else return usage_error("--amp wants f16, bf16 or off, got '%s'", value);
            o->amp_given = true;
            break;
        case F_OPTIMIZER:
            if (strcmp(value, "sgd") && strcmp(value, "adam") && strcmp(value, "adamw"))
                return usage_error("--optimizer wants sgd, adam or adamw, got '%s'", value);
            o->optimizer = value;
            break;
        case F_SCALER:
            if (strcmp(value, "none") != 0) {
                alloy_grad_scaler sc;
                char why[256];
                if (!alloyc_scaler(value, &sc, why, sizeof why)) return usage_error("%s", why);
            }
            o->scaler = value;
            break;
        case F_PRINT_AFTER:
            o->print_after = value;
            break;
        case F_PRINT_BEFORE:
            o->print_before = value;
            break;
        case F_SET:
            if (!strchr(value, '=') || value[0] == '=') return usage_error("--set wants NAME=VALUE, got '%s'", value);
            o->sets[o->nsets++] = value;
            break;
        case F_ARCH:
            if (o->arch) return usage_error("--arch is given twice");
            if (!valid_archs(value))
                return usage_error("--arch wants sm_XY[,sm_XY...], compute capabilities 10 to 9999 each given "
                                   "once (for example sm_80,sm_90), got '%s'", value);
            o->arch = value;
            break;
        case F_EMIT:
            if (emit) return usage_error("--emit is given twice");
            emit = true;
            o->emit_given = true;
            if (command == CMD_COMPILE) {
                if (strcmp(value, "cuda") != 0 && strcmp(value, "bundle") != 0)
                    return usage_error("--emit of compile wants cuda or bundle, got '%s'", value);
                o->bundle = strcmp(value, "bundle") == 0;
                break;
            }
            if (command != CMD_PRINT) break; /* reported as misplaced */
            int kind = -1;
            for (int k = 0; k <= EMIT_MEMORY_SVG; k++)
                if (strcmp(value, emit_names[k]) == 0) kind = k;
            if (kind < 0) return usage_error("--emit of print wants ir, dot, svg or memory-svg, got '%s'", value);
            o->emit = (emit_kind)kind;
            break;
        case F_DEVICE:
            if (o->cost_device) return usage_error("--device is given twice");
            if (strcmp(value, "h100") && strcmp(value, "h200"))
                return usage_error("--device wants h100 or h200, got '%s'", value);
            o->cost_device = value;
            break;
        case F_CALIBRATE:
            if (o->calibrate) return usage_error("--calibrate is given twice");
            o->calibrate = value;
            break;
        case F_TOP:
            if (o->top) return usage_error("--top is given twice");
            if (!parse_count(value, 1, 1000000, &o->top))
                return usage_error("--top wants a whole number from 1 to 1000000, got '%s'", value);
            break;
        case F_DUMP_DIR:
            if (o->dump_dir) return usage_error("--dump-dir is given twice");
            o->dump_dir = value;
            break;
        case F_LR:
        case F_WEIGHT_DECAY:
        case F_MOMENTUM:
        case F_CLIP_NORM: {
            double *at = which == F_LR ? &o->lr : which == F_WEIGHT_DECAY ? &o->weight_decay
                                               : which == F_MOMENTUM   ? &o->momentum
                                                                       : &o->clip_norm;
            bool *have = which == F_LR ? &o->have_lr : which == F_WEIGHT_DECAY ? &o->have_weight_decay
                                                      : which == F_MOMENTUM   ? &o->have_momentum
                                                                              : &o->have_clip_norm;
            if (*have) return usage_error("%s is given twice", given);
            if (!parse_rate(value, at)) return usage_error("%s wants a finite number >= 0, got '%s'", given, value);
            *have = true;
            break;
        }
        case F_LOSS:
            if (o->loss) return usage_error("--loss is given twice");
            o->loss = value;
            break;
        case F_STEPS:
            if (o->steps) return usage_error("--steps is given twice");
            if (!parse_count(value, 1, 1000000000, &o->steps))
                return usage_error("--steps wants a whole number from 1 to 1000000000, got '%s'", value);
            break;
        case F_CHECKPOINT:
            if (o->checkpoint) return usage_error("--checkpoint is given twice");
            o->checkpoint = value;
            break;
        case F_STATS:
            if (o->stats) return usage_error("--stats is given twice");
            o->stats = value;
            break;
        case F_AMP_STATS:
            if (o->amp_stats) return usage_error("--amp-stats is given twice");
            o->amp_stats = value;
            break;
        case F_SAVE_PARAMS:
            if (o->save_params) return usage_error("--save-params is given twice");
            o->save_params = value;
            break;
        case F_SAVE_EVERY:
        case F_LOG_EVERY: {
            long *at = which == F_SAVE_EVERY ? &o->save_every : &o->log_every;
            if (*at) return usage_error("%s is given twice", given);
            if (!parse_count(value, 1, 1000000000, at))
                return usage_error("%s wants a whole number from 1 to 1000000000, got '%s'", given, value);
            break;
        }
        default:
            if (arg[0] == '-' && arg[1] != '\0') return usage_error("unknown option '%s'", arg);
            if (o->ir_path) return usage_error("unexpected argument '%s'", arg);
            o->ir_path = arg;
        }
    }
    if (!o->ir_path) return usage_error("'%s' needs an IR file", cmd);
    if (o->misplaced) {
        char list[128] = "";
        for (int c = 0, k = 0, n = __builtin_popcount(o->misplaced_commands); c < COMMAND_COUNT; c++) {
            if (!(o->misplaced_commands & 1u << c)) continue;
            size_t used = strlen(list);
            snprintf(list + used, sizeof list - used, "%s'%s'", k == 0 ? "" : k == n - 1 ? " and " : ", ",
                     command_names[c]);
            k++;
        }
        return usage_error("%s is an option of %s, not '%s'", o->misplaced, list, cmd);
    }
    if (command == CMD_RUN && !o->out) return usage_error("run needs --out FILE");
    if (command == CMD_COMPILE && !o->out)
        return usage_error("compile needs -o DIR (the directory to write) or -o FILE.alloy (a bundle)");
    size_t outlen = o->out ? strlen(o->out) : 0;
    if (command == CMD_COMPILE && !o->emit_given && outlen > 6 && strcmp(o->out + outlen - 6, ".alloy") == 0)
        o->bundle = true;
    if (command == CMD_COMPILE && !o->bundle && o->have_seed)
        return usage_error("--seed of compile is for bundles (--emit=bundle or -o FILE.alloy)");
    if (command == CMD_COMPILE && !o->bundle && o->with_state)
        return usage_error("--with-state is for bundles (--emit=bundle or -o FILE.alloy)");
    if (command == CMD_COMPILE && !o->bundle && !o->arch)
        return usage_error("compile needs --arch sm_XY[,sm_XY...] (for example sm_80,sm_90)");
    if (command != CMD_TRAIN && (o->optimizer || o->scaler) && !o->train)
        return usage_error("--optimizer and --scaler need --train");
    const char *hyper = o->have_lr ? "--lr" : o->have_weight_decay ? "--weight-decay"
                      : o->have_momentum ? "--momentum" : o->have_clip_norm ? "--clip-norm" : NULL;
    if (hyper && command != CMD_TRAIN && !o->optimizer) return usage_error("%s needs --optimizer", hyper);
    if (o->have_momentum && o->optimizer && strcmp(o->optimizer, "sgd") != 0)
        return usage_error("--momentum is a setting of --optimizer=sgd, not %s", o->optimizer);
    if (command == CMD_TRAIN && !o->optimizer && o->have_momentum)
        return usage_error("--momentum is a setting of --optimizer=sgd (train's default optimizer is adamw)");
    if (command == CMD_TRAIN && !o->steps) return usage_error("train needs --steps N (the steps to run)");
    if (o->save_every && !o->checkpoint) return usage_error("--save-every needs --checkpoint FILE");
    *done = false;
    return 0;
}
