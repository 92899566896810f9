/* cli.h - what the example programs share: one-line fatal errors, CSV fields and a seeded generator. */
#ifndef ALLOY_EXAMPLES_CLI_H
#define ALLOY_EXAMPLES_CLI_H

/* The program name cli_fail prefixes its messages with. */
void cli_set_program(const char *name);
/* Prints "<program>: <message>" on stderr and exits with status (2 for bad
 * usage, 1 otherwise). */
_Noreturn void cli_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Splits line (modified in place) at commas into at most max fields,
 * trimming blanks; returns the number of fields (max + 1 if there are more). */
int cli_split_fields(char *line, char **fields, int max);
/* Whether s is all of one finite number, which goes to *out. */
_Bool cli_is_number(const char *s, double *out);
/* splitmix64: a tiny seeded generator, so runs repeat exactly. */
unsigned long long cli_next_random(unsigned long long *state);

#endif
