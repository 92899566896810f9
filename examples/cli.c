/* cli.c - what the example programs share: one-line fatal errors, flag values, CSV fields and a seeded generator. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *program = "alloy";

void cli_set_program(const char *name) { program = name; }

void cli_fail(int status, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "%s: ", program);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    exit(status);
}

unsigned long long cli_next_random(unsigned long long *state)
{
    unsigned long long z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int cli_split_fields(char *line, char **fields, int max)
{
    int n = 0;
    for (char *p = line;;) {
        while (*p == ' ' || *p == '\t') p++;
        char *end = p + strcspn(p, ",");
        bool last = *end == '\0';
        char *tail = end;
        while (tail > p && (tail[-1] == ' ' || tail[-1] == '\t' || tail[-1] == '\r')) tail--;
        *tail = '\0';
        if (n < max) fields[n] = p;
        n++;
        if (last) return n <= max ? n : max + 1;
        p = end + 1;
    }
}

bool cli_is_number(const char *s, double *out)
{
    char *end;
    *out = strtod(s, &end);
    return *s && !*end && isfinite(*out);
}

double cli_number(const char *flag, const char *s, double min, double max)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !(v >= min && v <= max))
        cli_fail(2, "%s wants a number in [%g, %g], got '%s'", flag, min, max, s);
    return v;
}

long cli_count(const char *flag, const char *s, long min, long max)
{
    double v = cli_number(flag, s, (double)min, (double)max);
    if (v != floor(v)) cli_fail(2, "%s wants an integer, got '%s'", flag, s);
    return (long)v;
}

void *cli_malloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (!p) cli_fail(1, "out of memory");
    return p;
}
