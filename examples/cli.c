/* cli.c - what the example programs share: one-line fatal errors and a seeded generator. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

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
