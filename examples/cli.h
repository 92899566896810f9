/* cli.h - what the example programs share: one-line fatal errors, flag values, CSV fields and a seeded generator. */
#ifndef ALLOY_EXAMPLES_CLI_H
#define ALLOY_EXAMPLES_CLI_H

#include <stddef.h>

/* The program name cli_fail prefixes its messages with. */
void cli_set_program(const char *name);
/* Prints "<program>: <message>" on stderr and exits with status (2 for bad
 * usage, 1 otherwise). */
_Noreturn void cli_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The value of a flag: all of one number in [min, max] (cli_count: and an
 * integer), else cli_fail(2, "<flag> wants ...") naming the flag. */
double cli_number(const char *flag, const char *s, double min, double max);
long cli_count(const char *flag, const char *s, long min, long max);
/* malloc that exits with "out of memory" (status 1) on failure; size 0 is 1. */
void *cli_malloc(size_t size);
/* Splits line (modified in place) at commas into at most max fields,
 * trimming blanks; returns the number of fields (max + 1 if there are more). */
int cli_split_fields(char *line, char **fields, int max);
/* Whether s is all of one finite number, which goes to *out. */
_Bool cli_is_number(const char *s, double *out);
/* splitmix64: a tiny seeded generator, so runs repeat exactly. */
unsigned long long cli_next_random(unsigned long long *state);

#endif
