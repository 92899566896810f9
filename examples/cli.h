/* cli.h - what the example programs share: one-line fatal errors and a seeded generator. */
#ifndef ALLOY_EXAMPLES_CLI_H
#define ALLOY_EXAMPLES_CLI_H

/* The program name cli_fail prefixes its messages with. */
void cli_set_program(const char *name);
/* Prints "<program>: <message>" on stderr and exits with status (2 for bad
 * usage, 1 otherwise). */
_Noreturn void cli_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* splitmix64: a tiny seeded generator, so runs repeat exactly. */
unsigned long long cli_next_random(unsigned long long *state);

#endif
